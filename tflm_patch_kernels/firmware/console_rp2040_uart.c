/* The console on the RP2040's UART0 (an Arm PL011), TX on GP0 (the Raspberry Pi Pico's pin 1; the Raspberry Pi
 * Debug Probe's UART input): 115200 8N1. The boot ROM leaves the chip on its ring oscillator (a few MHz, not
 * precise enough for a UART), so on first use the board's 12 MHz crystal (XOSC) becomes clk_ref and clk_sys (the
 * core then runs at 12 MHz), clk_peri follows clk_sys, and UART0 and the GPIO bank leave reset. */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

#define REG(addr) (*(volatile uint32_t *)(addr))
#define CLR_ALIAS 0x3000u /* the atomic bit-clear alias of a peripheral register */
#define RESETS_BASE 0x4000C000u
#define RESETS_RESET REG(RESETS_BASE + 0x0u)
#define RESETS_RESET_CLR REG(RESETS_BASE + CLR_ALIAS + 0x0u)
#define RESETS_RESET_DONE REG(RESETS_BASE + 0x8u)
#define RESET_IO_BANK0 (1u << 5)
#define RESET_PADS_BANK0 (1u << 8)
#define RESET_UART0 (1u << 22)
#define XOSC_BASE 0x40024000u
#define XOSC_CTRL REG(XOSC_BASE + 0x00u)
#define XOSC_STATUS REG(XOSC_BASE + 0x04u)
#define XOSC_STARTUP REG(XOSC_BASE + 0x0Cu)
#define XOSC_CTRL_1_15MHZ 0xAA0u
#define XOSC_CTRL_ENABLE (0xFABu << 12)
#define XOSC_STATUS_STABLE (1u << 31)
#define XOSC_STARTUP_DELAY 47u /* (12 MHz / 1000 + 128) / 256: about 1 ms */
#define CLOCKS_BASE 0x40008000u
#define CLK_REF_CTRL REG(CLOCKS_BASE + 0x30u)
#define CLK_REF_SELECTED REG(CLOCKS_BASE + 0x38u)
#define CLK_SYS_CTRL REG(CLOCKS_BASE + 0x3Cu)
#define CLK_SYS_SELECTED REG(CLOCKS_BASE + 0x44u)
#define CLK_PERI_CTRL REG(CLOCKS_BASE + 0x48u)
#define CLK_REF_SRC_XOSC 2u
#define CLK_PERI_ENABLE (1u << 11) /* AUXSRC (bits 7:5) 0: clk_sys */
#define IO_BANK0_GPIO0_CTRL REG(0x40014000u + 0x004u)
#define GPIO_FUNC_UART 2u
#define UART0_BASE 0x40034000u
#define UART_DR REG(UART0_BASE + 0x000u)
#define UART_FR REG(UART0_BASE + 0x018u)
#define UART_IBRD REG(UART0_BASE + 0x024u)
#define UART_FBRD REG(UART0_BASE + 0x028u)
#define UART_LCR_H REG(UART0_BASE + 0x02Cu)
#define UART_CR REG(UART0_BASE + 0x030u)
#define UART_FR_TXFF (1u << 5)
#define UART_FR_BUSY (1u << 3)
#define UART_LCR_H_8N1_FIFO ((3u << 5) | (1u << 4))
#define UART_CR_ENABLE_TX ((1u << 0) | (1u << 8))
/* 12 MHz / (16 x 115200) = 6.51: IBRD 6, FBRD 33 (64ths; the Pico SDK's rounding): 115,107 baud */
#define UART_IBRD_115200 6u
#define UART_FBRD_115200 33u

static void console_init(void) {
    XOSC_STARTUP = XOSC_STARTUP_DELAY;
    XOSC_CTRL = XOSC_CTRL_1_15MHZ | XOSC_CTRL_ENABLE;
    while ((XOSC_STATUS & XOSC_STATUS_STABLE) == 0u) {
    }
    CLK_REF_CTRL = CLK_REF_SRC_XOSC;
    while ((CLK_REF_SELECTED & (1u << CLK_REF_SRC_XOSC)) == 0u) {
    }
    CLK_SYS_CTRL = 0u; /* clk_ref */
    while ((CLK_SYS_SELECTED & 1u) == 0u) {
    }
    CLK_PERI_CTRL = CLK_PERI_ENABLE;
    const uint32_t blocks = RESET_IO_BANK0 | RESET_PADS_BANK0 | RESET_UART0;
    RESETS_RESET_CLR = blocks;
    while ((RESETS_RESET_DONE & blocks) != blocks) {
    }
    UART_IBRD = UART_IBRD_115200;
    UART_FBRD = UART_FBRD_115200;
    UART_LCR_H = UART_LCR_H_8N1_FIFO; /* (the write also latches IBRD and FBRD) */
    UART_CR = UART_CR_ENABLE_TX;
    IO_BANK0_GPIO0_CTRL = GPIO_FUNC_UART;
}

void tfmcu_board_console_write(const char *data, size_t n) {
    /* (UART0's registers are read only once it is out of reset) */
    if ((RESETS_RESET & RESET_UART0) != 0u || (UART_CR & UART_CR_ENABLE_TX) != UART_CR_ENABLE_TX) {
        console_init();
    }
    for (size_t i = 0; i < n; ++i) {
        while ((UART_FR & UART_FR_TXFF) != 0u) {
        }
        UART_DR = (uint8_t)data[i];
    }
    while ((UART_FR & UART_FR_BUSY) != 0u) {
    }
}
