/* STM32F405 (QEMU netduinoplus2, Cortex-M4F): the console on USART1 (TX on PA9, 115200 8N1 at the reset clock, HSI
 * 16 MHz; QEMU's first serial port) and TIM2, a 32-bit up-counter, free-running from reset. QEMU clocks the
 * STM32 timers at 1 GHz, so under -icount shift=0 one tick is one instruction; on the chip TIM2 runs at the APB1 timer
 * clock (84 MHz at the usual 168 MHz system clock), and RCC must enable it first, as below. */
#include <stdint.h>

#include "harness.h"

#define RCC_APB1ENR (*(volatile uint32_t *)0x40023840u)
#define RCC_APB1ENR_TIM2EN 1u
#define TIM2_CR1 (*(volatile uint32_t *)0x40000000u)
#define TIM2_CNT (*(volatile uint32_t *)0x40000024u)
#define TIM2_PSC (*(volatile uint32_t *)0x40000028u)
#define TIM2_ARR (*(volatile uint32_t *)0x4000002Cu)
#define TIM2_EGR (*(volatile uint32_t *)0x40000014u)

void tfmcu_timer_start(void) {
    RCC_APB1ENR |= RCC_APB1ENR_TIM2EN;
    TIM2_PSC = 0u;
    TIM2_ARR = 0xFFFFFFFFu;
    TIM2_EGR = 1u; /* UG: load the prescaler, restart the count */
    TIM2_CNT = 0u;
    TIM2_CR1 = 1u; /* CEN */
}

uint32_t tfmcu_ticks(void) { return TIM2_CNT; }

const char *tfmcu_target_name(void) { return "stm32f405"; }

#define RCC_AHB1ENR (*(volatile uint32_t *)0x40023830u)
#define RCC_AHB1ENR_GPIOAEN 1u
#define RCC_APB2ENR (*(volatile uint32_t *)0x40023844u)
#define RCC_APB2ENR_USART1EN (1u << 4)
#define GPIOA_MODER (*(volatile uint32_t *)0x40020000u)
#define GPIOA_AFRH (*(volatile uint32_t *)0x40020024u)
#define USART1_SR (*(volatile uint32_t *)0x40011000u)
#define USART1_DR (*(volatile uint32_t *)0x40011004u)
#define USART1_BRR (*(volatile uint32_t *)0x40011008u)
#define USART1_CR1 (*(volatile uint32_t *)0x4001100Cu)
#define USART_SR_TXE (1u << 7)
#define USART_SR_TC (1u << 6)
#define USART_CR1_UE (1u << 13)
#define USART_CR1_TE (1u << 3)

void tfmcu_board_console_write(const char *data, size_t n) {
    if ((USART1_CR1 & USART_CR1_UE) == 0u) {
        RCC_AHB1ENR |= RCC_AHB1ENR_GPIOAEN;
        RCC_APB2ENR |= RCC_APB2ENR_USART1EN;
        GPIOA_MODER = (GPIOA_MODER & ~(3u << 18)) | (2u << 18); /* PA9: alternate function */
        GPIOA_AFRH = (GPIOA_AFRH & ~(0xFu << 4)) | (7u << 4);   /* AF7: USART1_TX */
        USART1_BRR = 0x8Bu;                                     /* 16 MHz / (16 x 8.6875) = 115,108 baud */
        USART1_CR1 = USART_CR1_UE | USART_CR1_TE;
    }
    for (size_t i = 0; i < n; ++i) {
        while ((USART1_SR & USART_SR_TXE) == 0u) {
        }
        USART1_DR = (uint8_t)data[i];
    }
    while ((USART1_SR & USART_SR_TC) == 0u) {
    }
}
