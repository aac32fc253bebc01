/* Firmware harness for QEMU's MPS2 Cortex-M boards: output, result line, cost regions, memory figures.
 *
 * startup.c brings the board up (vector table, .data/.bss, FPU, stack paint, timer) and calls main();
 * main's return value becomes QEMU's exit status (semihosting SYS_EXIT_EXTENDED). A firmware reports
 * through exactly one machine-readable line that tools/qemu/run_firmware.py parses:
 *
 *   TFMCU_RESULT {"test": "...", <its own keys>, "target": "cortex-m4", "sram_budget": ..., "ram_static": ...,
 *                 "stack_size": ..., "stack_hwm": ..., "regions": [{"name": "...", "ticks": ...}, ...],
 *                 "failures": [...], "status": 0}
 *
 *   tfmcu_result_begin("conv3x3_selftest");
 *   tfmcu_result_hex32("checksum", crc);
 *   return tfmcu_result_end();   // 0 unless a check failed (tfmcu_fail, stack overflow, SRAM budget)
 *
 * Cost regions: code between tfmcu_region_begin("name") and tfmcu_region_end() is measured twice —
 * exactly, by the QEMU plugin tools/qemu/insn_count.c, which counts the instructions executed between the
 * marker functions tfmcu_cost_begin / tfmcu_cost_end (regions are numbered in the order they begin), and
 * roughly, by the MPS2 timer, which under `-icount shift=0` ticks once per 40 instructions.
 */
#ifndef TFMCU_FIRMWARE_HARNESS_H_
#define TFMCU_FIRMWARE_HARNESS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Output: semihosting (QEMU's stdout), or with -DTFMCU_CONSOLE_UART the board's UART; there tfmcu_exit prints
 * "TFMCU_EXIT <status>" as the last line and waits (no host to return to) ---- */
void tfmcu_puts(const char *s);
void tfmcu_put_u64(uint64_t v);
void tfmcu_put_i64(int64_t v);
void tfmcu_put_hex32(uint32_t v);
void tfmcu_flush(void);
__attribute__((noreturn)) void tfmcu_exit(int status);

/* ---- The result line ---- */
void tfmcu_result_begin(const char *test);
void tfmcu_result_str(const char *key, const char *value);
void tfmcu_result_int(const char *key, int64_t value);
void tfmcu_result_hex32(const char *key, uint32_t value); /* as the string "0x%08x" */
void tfmcu_result_int_array(const char *key, const int32_t *values, uint32_t n); /* [v0, v1, ...] */
void tfmcu_result_raw(const char *key, const char *json);  /* value written as given */
/* Records a failed check (listed under "failures"; the status becomes 1). */
void tfmcu_fail(const char *what);
/* Adds the harness's keys, closes the line; returns the exit status for main. */
int tfmcu_result_end(void);

/* ---- Cost ---- */
void tfmcu_region_begin(const char *name); /* regions nest; at most TFMCU_MAX_REGIONS per run */
void tfmcu_region_end(void);
/* The marker functions the instruction-count plugin watches (called by the two above). */
void tfmcu_cost_begin(void);
void tfmcu_cost_end(void);
/* ---- The board (board_mps2.c, board_stm32f405.c: one per firmware) ---- */
/* Starts the board's free-running timer (startup.c, at reset); tfmcu_ticks() returns ticks since then: MPS2's APB
 * timer 0 (25 MHz: one tick per 40 instructions under -icount shift=0), STM32F405's TIM2 (QEMU clocks it at 1 GHz:
 * one tick per instruction). */
void tfmcu_timer_start(void);
uint32_t tfmcu_ticks(void);
/* The rate of tfmcu_ticks() in Hz: the timer's clock at reset (MPS2 / MPS3: the board's system clock; the STM32F405:
 * TIM2 on the 16 MHz HSI); 0 where the ticks are the core's cycles (the DWT / SysTick boards), at whatever clock the
 * application set up. Under QEMU the ticks follow its virtual clock (-icount shift=0: 1 ns per instruction). */
uint32_t tfmcu_ticks_hz(void);
/* The target's name in the result line ("cortex-m4", "cortex-m7", "stm32f405"). */
const char *tfmcu_target_name(void);
/* With -DTFMCU_CONSOLE_UART: writes n bytes to the board's console UART (set up on first use; blocking). */
void tfmcu_board_console_write(const char *data, size_t n);
#define TFMCU_MAX_REGIONS 64

/* ---- Memory ---- */
uint32_t tfmcu_sram_budget(void); /* the target's SRAM budget (bytes), from the link */
uint32_t tfmcu_ram_static(void);  /* .data + .bss */
uint32_t tfmcu_stack_size(void);  /* reserved stack */
uint32_t tfmcu_stack_hwm(void);   /* deepest stack use since reset or the last repaint (painted-stack scan) */
/* Paints the unused stack again (everything below the caller's frame), so that the next tfmcu_stack_hwm()
 * measures what runs after this call. */
void tfmcu_stack_repaint(void);

/* FNV-1a, 32 bit, over n bytes; _update continues a hash over more bytes (tfmcu_fnv1a32(a) then _update(b) is
 * the hash of a followed by b). */
uint32_t tfmcu_fnv1a32(const void *data, size_t n);
uint32_t tfmcu_fnv1a32_update(uint32_t hash, const void *data, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TFMCU_FIRMWARE_HARNESS_H_ */
