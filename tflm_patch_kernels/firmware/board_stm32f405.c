/* STM32F4 parts (QEMU netduinoplus2, Cortex-M4F): the console on USART1 or USART2 (115200 8N1 at the reset clock,
 * HSI 16 MHz; below) and TIM2, a 32-bit up-counter, free-running from reset. QEMU clocks the
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

/* TIM2 on APB1 at the reset clock (HSI, 16 MHz; no prescaler). QEMU clocks it at 1 GHz instead. */
uint32_t tfmcu_ticks_hz(void) { return 16000000u; }

const char *tfmcu_target_name(void) { return "stm32f405"; }

/* The console UART: USART1 (TX on PA9, the default; QEMU's first serial port) or, built with
 * -DTFMCU_CONSOLE_USART=2, USART2 (TX on PA2: a Nucleo's ST-LINK virtual COM port; QEMU's second serial port). Both
 * are clocked at the reset clock (HSI, 16 MHz) on their bus, both use AF7. */
#ifndef TFMCU_CONSOLE_USART
#define TFMCU_CONSOLE_USART 1
#endif
#if TFMCU_CONSOLE_USART == 1
#define CONSOLE_BASE 0x40011000u
#define CONSOLE_RCC_ENR (*(volatile uint32_t *)0x40023844u) /* RCC_APB2ENR */
#define CONSOLE_RCC_BIT (1u << 4)                           /* USART1EN */
#define CONSOLE_TX_PIN 9u                                   /* PA9 */
#elif TFMCU_CONSOLE_USART == 2
#define CONSOLE_BASE 0x40004400u
#define CONSOLE_RCC_ENR (*(volatile uint32_t *)0x40023840u) /* RCC_APB1ENR */
#define CONSOLE_RCC_BIT (1u << 17)                          /* USART2EN */
#define CONSOLE_TX_PIN 2u                                   /* PA2 */
#else
#error "TFMCU_CONSOLE_USART must be 1 or 2"
#endif
#define RCC_AHB1ENR (*(volatile uint32_t *)0x40023830u)
#define RCC_AHB1ENR_GPIOAEN 1u
#define GPIOA_MODER (*(volatile uint32_t *)0x40020000u)
#define GPIOA_AFR ((volatile uint32_t *)0x40020020u) /* AFRL, AFRH */
#define USART_SR (*(volatile uint32_t *)(CONSOLE_BASE + 0x00u))
#define USART_DR (*(volatile uint32_t *)(CONSOLE_BASE + 0x04u))
#define USART_BRR (*(volatile uint32_t *)(CONSOLE_BASE + 0x08u))
#define USART_CR1 (*(volatile uint32_t *)(CONSOLE_BASE + 0x0Cu))
#define USART_SR_TXE (1u << 7)
#define USART_SR_TC (1u << 6)
#define USART_CR1_UE (1u << 13)
#define USART_CR1_TE (1u << 3)

void tfmcu_board_console_write(const char *data, size_t n) {
    if ((USART_CR1 & USART_CR1_UE) == 0u) {
        RCC_AHB1ENR |= RCC_AHB1ENR_GPIOAEN;
        CONSOLE_RCC_ENR |= CONSOLE_RCC_BIT;
        GPIOA_MODER = (GPIOA_MODER & ~(3u << (2u * CONSOLE_TX_PIN))) | (2u << (2u * CONSOLE_TX_PIN)); /* AF */
        volatile uint32_t *afr = &GPIOA_AFR[CONSOLE_TX_PIN / 8u];
        *afr = (*afr & ~(0xFu << (4u * (CONSOLE_TX_PIN % 8u)))) | (7u << (4u * (CONSOLE_TX_PIN % 8u))); /* AF7 */
        USART_BRR = 0x8Bu; /* 16 MHz / (16 x 8.6875) = 115,108 baud */
        USART_CR1 = USART_CR1_UE | USART_CR1_TE;
    }
    for (size_t i = 0; i < n; ++i) {
        while ((USART_SR & USART_SR_TXE) == 0u) {
        }
        USART_DR = (uint8_t)data[i];
    }
    while ((USART_SR & USART_SR_TC) == 0u) {
    }
}
