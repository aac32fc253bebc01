/* The MPS2 boards (QEMU mps2-an385 = Cortex-M3, mps2-an386 = Cortex-M4, mps2-an500 = Cortex-M7, mps2-an505 =
 * Cortex-M33) and the MPS3 mps3-an547 (Cortex-M55): APB timer 0 (on the MPS3, which has none, the FPGA IO block's
 * free-running counter), the console UART (CMSDK APB UART 0, QEMU's first serial port) and the target's name, which
 * the build passes as TFMCU_TARGET_NAME (tflm_patch_kernels/firmware/BUILD). */
#include <stdint.h>

#include "harness.h"

#ifndef TFMCU_TARGET_NAME
#error "build with -DTFMCU_TARGET_NAME=\"cortex-m4\" (tflm_patch_kernels/firmware/BUILD does)"
#endif

/* The peripherals' addresses: the non-secure ones of the Armv7-M boards, unless the build gives others (mps2-an505
 * and mps3-an547 boot secure: firmware.bzl's TARGETS passes their secure aliases, and the MPS3's counter as
 * TFMCU_MPS2_COUNTER). */
#ifndef TFMCU_MPS2_TIMER0
#define TFMCU_MPS2_TIMER0 0x40000000u
#endif
#ifndef TFMCU_MPS2_UART0
#define TFMCU_MPS2_UART0 0x40004000u
#endif

/* The timer's rate: the board's system clock (MPS2 FPGA images: 25 MHz; mps2-an505 20 MHz and mps3-an547 32 MHz,
 * which firmware.bzl's TARGETS pass). Under QEMU with -icount shift=0 time is the instruction count (1 ns each). */
#ifndef TFMCU_MPS2_TICKS_HZ
#define TFMCU_MPS2_TICKS_HZ 25000000u
#endif

uint32_t tfmcu_ticks_hz(void) { return TFMCU_MPS2_TICKS_HZ; }

#ifdef TFMCU_MPS2_COUNTER
/* FPGA IO COUNTER: counts up from reset at the board's clock */
void tfmcu_timer_start(void) {}

uint32_t tfmcu_ticks(void) { return *(volatile uint32_t *)TFMCU_MPS2_COUNTER; }
#else
#define CMSDK_TIMER0 ((volatile uint32_t *)TFMCU_MPS2_TIMER0) /* CTRL, VALUE, RELOAD, INTSTATUS */

void tfmcu_timer_start(void) {
    CMSDK_TIMER0[1] = 0xFFFFFFFFu; /* VALUE */
    CMSDK_TIMER0[2] = 0xFFFFFFFFu; /* RELOAD */
    CMSDK_TIMER0[0] = 1u;          /* CTRL: enable, system clock, no interrupt */
}

uint32_t tfmcu_ticks(void) { return 0xFFFFFFFFu - CMSDK_TIMER0[1]; }
#endif

const char *tfmcu_target_name(void) { return TFMCU_TARGET_NAME; }

#define CMSDK_UART0 ((volatile uint32_t *)TFMCU_MPS2_UART0) /* DATA, STATE, CTRL, INTSTATUS, BAUDDIV */
#define CMSDK_UART_STATE_TX_FULL 1u
#define CMSDK_UART_CTRL_TX_EN 1u

void tfmcu_board_console_write(const char *data, size_t n) {
    if ((CMSDK_UART0[2] & CMSDK_UART_CTRL_TX_EN) == 0u) {
        CMSDK_UART0[4] = 217u; /* BAUDDIV: 25 MHz / 115200 baud */
        CMSDK_UART0[2] = CMSDK_UART_CTRL_TX_EN;
    }
    for (size_t i = 0; i < n; ++i) {
        while (CMSDK_UART0[1] & CMSDK_UART_STATE_TX_FULL) {
        }
        CMSDK_UART0[0] = (uint8_t)data[i];
    }
}
