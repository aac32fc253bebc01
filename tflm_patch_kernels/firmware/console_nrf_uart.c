/* The console on the nRF52840's UART0 (the UART without EasyDMA, at 0x40002000): 115200 8N1, TX on one GPIO pin.
 *   TFMCU_TX_PORT, TFMCU_TX_PIN   the TX pin (the nRF52840 DK's virtual COM port: P0.06; the Arduino Nano 33 BLE's
 *                                 TX pin: P1.03) */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

#if !defined(TFMCU_TX_PORT) || !defined(TFMCU_TX_PIN)
#error "console_nrf_uart.c: build with TFMCU_TX_PORT and TFMCU_TX_PIN (tflm_patch_kernels/firmware/BUILD: CONSOLES)"
#endif

#define REG(addr) (*(volatile uint32_t *)(addr))
#define UART0_BASE 0x40002000u
#define UART_TASKS_STARTTX REG(UART0_BASE + 0x008u)
#define UART_EVENTS_TXDRDY REG(UART0_BASE + 0x11Cu)
#define UART_ENABLE REG(UART0_BASE + 0x500u)
#define UART_PSEL_TXD REG(UART0_BASE + 0x50Cu)
#define UART_TXD REG(UART0_BASE + 0x51Cu)
#define UART_BAUDRATE REG(UART0_BASE + 0x524u)
#define UART_ENABLE_ON 4u
#define UART_BAUD_115200 0x01D7E000u
#define GPIO_BASE (0x50000000u + 0x300u * (uint32_t)(TFMCU_TX_PORT)) /* P0, P1 */
#define GPIO_OUTSET REG(GPIO_BASE + 0x508u)
#define GPIO_DIRSET REG(GPIO_BASE + 0x518u)

void tfmcu_board_console_write(const char *data, size_t n) {
    if (UART_ENABLE != UART_ENABLE_ON) {
        GPIO_OUTSET = 1u << TFMCU_TX_PIN; /* idle high, an output while the UART is off too */
        GPIO_DIRSET = 1u << TFMCU_TX_PIN;
        UART_PSEL_TXD = ((uint32_t)TFMCU_TX_PORT << 5) | TFMCU_TX_PIN; /* CONNECT (bit 31) 0: connected */
        UART_BAUDRATE = UART_BAUD_115200;
        UART_ENABLE = UART_ENABLE_ON;
        UART_TASKS_STARTTX = 1u;
    }
    for (size_t i = 0; i < n; ++i) {
        UART_EVENTS_TXDRDY = 0u;
        UART_TXD = (uint8_t)data[i];
        while (UART_EVENTS_TXDRDY == 0u) {
        }
    }
}
