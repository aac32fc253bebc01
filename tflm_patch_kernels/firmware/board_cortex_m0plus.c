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

/* The RP2040's second-stage bootloader (section .boot2: the first 256 bytes of its Flash, which every link's script
 * places first; the other cores' links have none). The boot ROM copies these 256 bytes to SRAM and runs them when
 * their last word is the CRC-32 (polynomial 0x04C11DB7, initial value 0xFFFFFFFF, not reflected) of the first 252,
 * which tfmcu.firmware.outputs writes into the linked ELF. From the RP2040 datasheet (SSI, XIP): the Flash's SSI
 * (0x18000000) is set up for execute-in-place with the standard serial read (03h: 8-bit command, 24-bit address,
 * 32-bit frames, SCK = clk_sys / 4), which every QSPI Flash part answers; then VTOR, the stack pointer and the reset
 * handler are taken from the vector table that follows (tfmcu_vector_table, at 0x10000100). Position independent: it
 * runs where the ROM copied it. */
__asm__(
    "    .section .boot2, \"ax\", %progbits\n"
    "    .syntax unified\n"
    "    .thumb\n"
    "    .global tfmcu_rp2040_boot2\n"
    "    .type tfmcu_rp2040_boot2, %function\n"
    "tfmcu_rp2040_boot2:\n"
    "    ldr r3, =0x18000000\n"  /* XIP_SSI */
    "    movs r1, #0\n"
    "    str r1, [r3, #0x08]\n"  /* SSIENR: off while it is set up */
    "    movs r1, #4\n"
    "    str r1, [r3, #0x14]\n"  /* BAUDR: SCK = clk_sys / 4 */
    "    ldr r1, =0x001F0300\n"
    "    str r1, [r3, #0x00]\n"  /* CTRLR0: standard SPI, DFS_32 = 31 (32-bit frames), TMOD = EEPROM read */
    "    movs r1, #0\n"
    "    str r1, [r3, #0x04]\n"  /* CTRLR1: NDF = 0, one frame per XIP access */
    "    ldr r0, =0x180000F4\n"
    "    ldr r1, =0x03000218\n"
    "    str r1, [r0]\n"          /* SPI_CTRLR0: XIP_CMD 03h, INST_L 8 bit, ADDR_L 24 bit, command and address serial */
    "    movs r1, #1\n"
    "    str r1, [r3, #0x08]\n"  /* SSIENR: on; the Flash is now mapped at 0x10000000 */
    "    ldr r0, =tfmcu_vector_table\n"
    "    ldr r1, =0xE000ED08\n"
    "    str r0, [r1]\n"          /* VTOR */
    "    ldm r0, {r0, r1}\n"     /* the initial stack pointer and the reset handler */
    "    msr msp, r0\n"
    "    bx r1\n"
    "    .ltorg\n"
    "    .org 252\n"
    "    .word 0\n"               /* the CRC-32 of the 252 bytes above (tfmcu.firmware.outputs.seal_boot2) */
    "    .size tfmcu_rp2040_boot2, . - tfmcu_rp2040_boot2\n"
    "    .previous\n");
