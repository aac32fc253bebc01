/* The console on an STM32 USART of the F7 / H7 / U5 kind (ISR at 0x1C, TDR at 0x28, UE in CR1 bit 0): 115200 8N1 at
 * the clock the chip resets to, TX on one GPIO pin in its alternate function. Everything the chip needs is a build
 * define (tflm_patch_kernels/firmware/BUILD: CONSOLES):
 *   TFMCU_USART_BASE        the USART's base address
 *   TFMCU_USART_BRR         USARTDIV for 115200 baud at its kernel clock after reset
 *   TFMCU_USART_RCC_ENR     the RCC register that enables its clock, TFMCU_USART_RCC_BIT its bit
 *   TFMCU_GPIO_BASE         the TX pin's GPIO port, TFMCU_GPIO_RCC_ENR / TFMCU_GPIO_RCC_BIT its clock enable
 *   TFMCU_TX_PIN, TFMCU_TX_AF  the TX pin in that port and its alternate function */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

#if !defined(TFMCU_USART_BASE) || !defined(TFMCU_USART_BRR) || !defined(TFMCU_USART_RCC_ENR) ||                 \
    !defined(TFMCU_USART_RCC_BIT) || !defined(TFMCU_GPIO_BASE) || !defined(TFMCU_GPIO_RCC_ENR) ||              \
    !defined(TFMCU_GPIO_RCC_BIT) || !defined(TFMCU_TX_PIN) || !defined(TFMCU_TX_AF)
#error "console_stm32_usart.c: build with the USART's defines (tflm_patch_kernels/firmware/BUILD: CONSOLES)"
#endif

#define REG(addr) (*(volatile uint32_t *)(addr))
#define USART_CR1 REG(TFMCU_USART_BASE + 0x00u)
#define USART_BRR REG(TFMCU_USART_BASE + 0x0Cu)
#define USART_ISR REG(TFMCU_USART_BASE + 0x1Cu)
#define USART_TDR REG(TFMCU_USART_BASE + 0x28u)
#define USART_CR1_UE (1u << 0)
#define USART_CR1_TE (1u << 3)
#define USART_ISR_TC (1u << 6)
#define USART_ISR_TXE (1u << 7) /* TXFNF with the FIFO on: the same bit */
#define GPIO_MODER REG(TFMCU_GPIO_BASE + 0x00u)
#define GPIO_AFR(i) REG(TFMCU_GPIO_BASE + 0x20u + 4u * (i)) /* AFRL, AFRH */

static void console_init(void) {
    REG(TFMCU_GPIO_RCC_ENR) |= TFMCU_GPIO_RCC_BIT;
    REG(TFMCU_USART_RCC_ENR) |= TFMCU_USART_RCC_BIT;
    (void)REG(TFMCU_USART_RCC_ENR); /* read back: the clock is on before the first access */
    GPIO_MODER = (GPIO_MODER & ~(3u << (2u * TFMCU_TX_PIN))) | (2u << (2u * TFMCU_TX_PIN)); /* alternate function */
    const uint32_t shift = 4u * (TFMCU_TX_PIN % 8u);
    GPIO_AFR(TFMCU_TX_PIN / 8u) = (GPIO_AFR(TFMCU_TX_PIN / 8u) & ~(0xFu << shift)) | ((uint32_t)TFMCU_TX_AF << shift);
    USART_BRR = TFMCU_USART_BRR;
    USART_CR1 = USART_CR1_TE | USART_CR1_UE;
}

void tfmcu_board_console_write(const char *data, size_t n) {
    if ((USART_CR1 & USART_CR1_UE) == 0u) {
        console_init();
    }
    for (size_t i = 0; i < n; ++i) {
        while ((USART_ISR & USART_ISR_TXE) == 0u) {
        }
        USART_TDR = (uint8_t)data[i];
    }
    while ((USART_ISR & USART_ISR_TC) == 0u) {
    }
}
