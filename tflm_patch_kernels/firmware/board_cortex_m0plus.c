/* A Cortex-M0+ board built and linked, not run (no QEMU board has the core with enough memory): SysTick as the cycle
 * timer (24 bits, counting down at the core clock: the ticks wrap every 2^24 cycles), the target's name, and no
 * console UART (the report goes through semihosting, i.e. a debugger). */
#include <stdint.h>

#include "harness.h"

#ifndef TFMCU_TARGET_NAME
#error "build with -DTFMCU_TARGET_NAME=\"cortex-m0plus\" (tflm_patch_kernels/firmware/BUILD does)"
#endif

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

void tfmcu_timer_start(void) {
    SYST_RVR = 0x00FFFFFFu;
    SYST_CVR = 0u;
    SYST_CSR = 5u; /* enable, processor clock, no interrupt */
}

uint32_t tfmcu_ticks(void) { return 0x00FFFFFFu - (SYST_CVR & 0x00FFFFFFu); }

/* 0: the ticks are the core's cycles (SysTick on the processor clock). */
uint32_t tfmcu_ticks_hz(void) { return 0u; }

const char *tfmcu_target_name(void) { return TFMCU_TARGET_NAME; }
