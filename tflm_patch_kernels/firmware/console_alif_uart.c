/* The console on a UART of an Alif Ensemble chip (a Synopsys DesignWare APB UART, 16550-compatible, with a divisor
 * fraction register): 115200 8N1 on the UART's SYST_PCLK clock (100 MHz in the clock setup the Secure Enclave boots
 * the DevKit with), TX on one pin in its alternate function. Everything the instance needs is a build define
 * (tflm_patch_kernels/firmware/BUILD: CONSOLES):
 *   TFMCU_UART_BASE        the UART's base address
 *   TFMCU_UART_INSTANCE    its number n (0..7): bit n of CLKCTL_PER_SLV's UART_CTRL enables its clock, bit 8 + n
 *                          selects SYST_PCLK
 *   TFMCU_UART_DIVISOR     the integer divisor, SYST_PCLK / (16 x 115200), and TFMCU_UART_DIVISOR_FRACTION its
 *                          fraction in 16ths
 *   TFMCU_TX_PINMUX        the TX pin's pin-mux register (PINMUX base + 32 x port + 4 x pin), TFMCU_TX_AF its
 *                          alternate function */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

#if !defined(TFMCU_UART_BASE) || !defined(TFMCU_UART_INSTANCE) || !defined(TFMCU_UART_DIVISOR) ||                \
    !defined(TFMCU_UART_DIVISOR_FRACTION) || !defined(TFMCU_TX_PINMUX) || !defined(TFMCU_TX_AF)
#error "console_alif_uart.c: build with the UART's defines (tflm_patch_kernels/firmware/BUILD: CONSOLES)"
#endif

#define REG(addr) (*(volatile uint32_t *)(addr))
#define CLKCTL_PER_SLV_UART_CTRL REG(0x4902F008u)
#define UART_THR REG(TFMCU_UART_BASE + 0x00u) /* DLL while LCR.DLAB is set */
#define UART_DLL REG(TFMCU_UART_BASE + 0x00u)
#define UART_DLH REG(TFMCU_UART_BASE + 0x04u)
#define UART_FCR REG(TFMCU_UART_BASE + 0x08u)
#define UART_LCR REG(TFMCU_UART_BASE + 0x0Cu)
#define UART_LSR REG(TFMCU_UART_BASE + 0x14u)
#define UART_SRR REG(TFMCU_UART_BASE + 0x88u)
#define UART_DLF REG(TFMCU_UART_BASE + 0xC0u)
#define UART_LCR_8N1 0x03u
#define UART_LCR_DLAB 0x80u
#define UART_FCR_FIFO_ENABLE 0x01u
#define UART_SRR_RESET_ALL 0x07u /* the UART and both FIFOs */
#define UART_LSR_THRE 0x20u
#define UART_LSR_TEMT 0x40u

static void console_init(void) {
    REG(TFMCU_TX_PINMUX) = TFMCU_TX_AF; /* the pin's alternate function; pad control 0: an output */
    CLKCTL_PER_SLV_UART_CTRL |= (1u << (8u + TFMCU_UART_INSTANCE)) | (1u << TFMCU_UART_INSTANCE);
    (void)CLKCTL_PER_SLV_UART_CTRL; /* read back: the clock is on before the first access */
    UART_SRR = UART_SRR_RESET_ALL;
    UART_FCR = UART_FCR_FIFO_ENABLE;
    UART_LCR = UART_LCR_DLAB;
    UART_DLL = TFMCU_UART_DIVISOR & 0xFFu;
    UART_DLH = (TFMCU_UART_DIVISOR >> 8) & 0xFFu;
    UART_DLF = TFMCU_UART_DIVISOR_FRACTION;
    UART_LCR = UART_LCR_8N1; /* DLAB off: LCR is also what tells the console it was set up */
    /* The UART takes up to 32 x divisor clock cycles to take a new divisor (Alif's driver waits as long). */
    for (volatile uint32_t i = 0; i < 32u * TFMCU_UART_DIVISOR; ++i) {
    }
}

void tfmcu_board_console_write(const char *data, size_t n) {
    /* (LCR is read only once the UART's clock is on) */
    if ((CLKCTL_PER_SLV_UART_CTRL & (1u << TFMCU_UART_INSTANCE)) == 0u || UART_LCR != UART_LCR_8N1) {
        console_init();
    }
    for (size_t i = 0; i < n; ++i) {
        while ((UART_LSR & UART_LSR_THRE) == 0u) {
        }
        UART_THR = (uint8_t)data[i];
    }
    while ((UART_LSR & UART_LSR_TEMT) == 0u) {
    }
}
