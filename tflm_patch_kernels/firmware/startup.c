/* Reset and fault handling for the Cortex-M boards (QEMU mps2-an386, mps2-an500, netduinoplus2); see mps2.ld and
 * stm32f405.ld.
 *
 * Reset_Handler: enable the FPU (CPACR), copy .data from Flash, zero .bss, paint the stack (for the
 * high-water mark), start the cycle timer, run constructors, call main(), exit with main's status through
 * semihosting. A fault prints one TFMCU_FAULT line with the fault status registers and exits with 99.
 */
#include <stdint.h>

#include "harness.h"

int main(void);

extern uint32_t __data_start__[], __data_end__[], __data_load__[], __bss_start__[], __bss_end__[];
extern uint32_t __stack_top[];
extern void (*__init_array_start[])(void);
extern void (*__init_array_end[])(void);

#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define SCB_CFSR (*(volatile uint32_t *)0xE000ED28u)
#define SCB_HFSR (*(volatile uint32_t *)0xE000ED2Cu)
#define SCB_MMFAR (*(volatile uint32_t *)0xE000ED34u)
#define SCB_BFAR (*(volatile uint32_t *)0xE000ED38u)

__attribute__((noreturn)) void Reset_Handler(void);
void Reset_Handler(void) {
#if defined(__ARM_FP)
    SCB_CPACR |= 0xFu << 20; /* CP10, CP11: full access */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    for (uint32_t *src = __data_load__, *dst = __data_start__; dst < __data_end__;) *dst++ = *src++;
    for (uint32_t *dst = __bss_start__; dst < __bss_end__;) *dst++ = 0;
    tfmcu_stack_repaint();
    tfmcu_timer_start();
    for (void (**f)(void) = __init_array_start; f < __init_array_end; f++) (*f)();
    tfmcu_exit(main());
}

/* Called by the fault handlers with the exception stack frame (r0-r3, r12, lr, pc, xpsr). */
__attribute__((noreturn, used)) void tfmcu_fault_report(const uint32_t *frame);
void tfmcu_fault_report(const uint32_t *frame) {
    uint32_t ipsr;
    __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
    tfmcu_puts("\nTFMCU_FAULT exception=");
    tfmcu_put_u64(ipsr & 0x1FFu);
    tfmcu_puts(" pc=");
    tfmcu_put_hex32(frame[6]);
    tfmcu_puts(" lr=");
    tfmcu_put_hex32(frame[5]);
    tfmcu_puts(" cfsr=");
    tfmcu_put_hex32(SCB_CFSR);
    tfmcu_puts(" hfsr=");
    tfmcu_put_hex32(SCB_HFSR);
    tfmcu_puts(" mmfar=");
    tfmcu_put_hex32(SCB_MMFAR);
    tfmcu_puts(" bfar=");
    tfmcu_put_hex32(SCB_BFAR);
    tfmcu_puts("\n");
    tfmcu_exit(99);
}

/* Picks the stack the exception frame was pushed to, and reports it. */
__attribute__((naked)) void Fault_Handler(void);
void Fault_Handler(void) {
#if defined(__ARM_ARCH_6M__)  /* Armv6-M (Cortex-M0+): no IT blocks, no tst with an immediate */
    __asm__ volatile(
        "movs r1, #4\n\t"
        "mov r2, lr\n\t"
        "tst r2, r1\n\t"
        "bne 1f\n\t"
        "mrs r0, msp\n\t"
        "b tfmcu_fault_report\n"
        "1:\n\t"
        "mrs r0, psp\n\t"
        "b tfmcu_fault_report\n\t");
#else
    __asm__ volatile(
        "tst lr, #4\n\t"
        "ite eq\n\t"
        "mrseq r0, msp\n\t"
        "mrsne r0, psp\n\t"
        "b tfmcu_fault_report\n\t");
#endif
}

static void Unexpected_Handler(void) {
    tfmcu_puts("\nTFMCU_FAULT unexpected interrupt\n");
    tfmcu_exit(98);
}

typedef void (*Vector)(void);

/* Cortex-M core exceptions, then the first 32 interrupts (none used: all report an unexpected interrupt; none is
 * enabled, so the boards' other interrupt lines never fire). */
__attribute__((section(".vectors"), used)) const Vector tfmcu_vector_table[16 + 32] = {
    [0] = (Vector)(uintptr_t)__stack_top,
    [1] = Reset_Handler,
    [2] = Unexpected_Handler, /* NMI */
    [3] = Fault_Handler,      /* HardFault */
    [4] = Fault_Handler,      /* MemManage */
    [5] = Fault_Handler,      /* BusFault */
    [6] = Fault_Handler,      /* UsageFault */
    [11] = Unexpected_Handler, /* SVCall */
    [12] = Unexpected_Handler, /* DebugMonitor */
    [14] = Unexpected_Handler, /* PendSV */
    [15] = Unexpected_Handler, /* SysTick */
    [16 ... 47] = Unexpected_Handler,
};
