/* STM32F405 (QEMU netduinoplus2, Cortex-M4F): TIM2, a 32-bit up-counter, free-running from reset. QEMU clocks the
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

const char *tfmcu_target_name(void) { return "stm32f405"; }
