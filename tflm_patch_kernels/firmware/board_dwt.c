/* A real board of a Cortex-M3 / M4 / M7 / M33 / M55 whose chip no QEMU board emulates (the nRF52840, STM32F7/H7/U5,
 * nRF5340, Alif Ensemble): the ELF flashed to it touches no peripheral of another chip. The timer is the core's own
 * DWT cycle counter (CYCCNT: the core clock's cycles, 32 bits), the target's name is the core's, and there is no
 * console UART: the report goes through semihosting, i.e. a debugger (deploy refuses --console=uart on such a
 * board). QEMU does not model the DWT: what --run runs is the same firmware with the QEMU board's library
 * (board_mps2.c; tfmcu.firmware.sources.build_file's firmware_qemu). */
#include <stdint.h>

#include "harness.h"

#ifndef TFMCU_TARGET_NAME
#error "build with -DTFMCU_TARGET_NAME=\"cortex-m7\" (tflm_patch_kernels/firmware/BUILD does)"
#endif

#define DEMCR (*(volatile uint32_t *)0xE000EDFCu)      /* Debug Exception and Monitor Control */
#define DWT_CTRL (*(volatile uint32_t *)0xE0001000u)
#define DWT_CYCCNT (*(volatile uint32_t *)0xE0001004u)
#define DWT_LAR (*(volatile uint32_t *)0xE0001FB0u)    /* the Cortex-M7's DWT lock (writes ignored elsewhere) */
#define DEMCR_TRCENA (1u << 24)
#define DWT_CTRL_CYCCNTENA 1u

void tfmcu_timer_start(void) {
    DEMCR |= DEMCR_TRCENA;
    DWT_LAR = 0xC5ACCE55u;
    DWT_CYCCNT = 0u;
    DWT_CTRL |= DWT_CTRL_CYCCNTENA;
}

uint32_t tfmcu_ticks(void) { return DWT_CYCCNT; }

/* 0: the ticks are the core's cycles, at whatever clock the application set up. */
uint32_t tfmcu_ticks_hz(void) { return 0u; }

const char *tfmcu_target_name(void) { return TFMCU_TARGET_NAME; }
