/* Firmware harness: output and exit (semihosting, or the board's UART), the TFMCU_RESULT line, cost regions, memory figures, and
 * the few newlib system calls a C library may reach (see harness.h). No heap: _sbrk always fails. */
#include "harness.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

/* ---- The console: semihosting (the default: QEMU's stdout, or a debugger's), or with -DTFMCU_CONSOLE_UART the
 * board's UART (tfmcu_board_console_write, board_*.c), for a board without a debugger attached. ---- */
#if !defined(TFMCU_CONSOLE_UART)
/* Arm semihosting v2: BKPT 0xAB on M-profile */
#define SYS_WRITE0 0x04
#define SYS_EXIT_EXTENDED 0x20
#define ADP_STOPPED_APPLICATION_EXIT 0x20026

static int semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}
#endif

/* Output is buffered and written one buffer at a time (one semihosting trap per buffer, not per character). */
static char g_out[128];
static size_t g_out_len;

void tfmcu_flush(void) {
    if (g_out_len == 0) return;
#if defined(TFMCU_CONSOLE_UART)
    tfmcu_board_console_write(g_out, g_out_len);
#else
    g_out[g_out_len] = '\0';
    semihost(SYS_WRITE0, g_out);
#endif
    g_out_len = 0;
}

static void put_char(char c) {
    if (g_out_len == sizeof g_out - 1) tfmcu_flush();
    g_out[g_out_len++] = c;
    if (c == '\n') tfmcu_flush();
}

void tfmcu_puts(const char *s) {
    while (*s) put_char(*s++);
}

void tfmcu_put_u64(uint64_t v) {
    char digits[21];
    int n = 0;
    do {
        digits[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v != 0);
    while (n > 0) put_char(digits[--n]);
}

void tfmcu_put_i64(int64_t v) {
    if (v < 0) {
        put_char('-');
        tfmcu_put_u64((uint64_t)0 - (uint64_t)v);
    } else {
        tfmcu_put_u64((uint64_t)v);
    }
}

void tfmcu_put_hex32(uint32_t v) {
    static const char hex[] = "0123456789abcdef";
    tfmcu_puts("0x");
    for (int shift = 28; shift >= 0; shift -= 4) put_char(hex[(v >> shift) & 0xFu]);
}

void tfmcu_exit(int status) {
    tfmcu_flush();
#if defined(TFMCU_CONSOLE_UART)
    /* No host to return to: the last line says how the run ended (the runner stops the board on it). */
    tfmcu_puts("TFMCU_EXIT ");
    tfmcu_put_i64(status);
    tfmcu_puts("\n");
    for (;;) {
        __asm__ volatile("wfi");
    }
#else
    uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)status};
    semihost(SYS_EXIT_EXTENDED, block);
    for (;;) {
        /* QEMU without semihosting: nowhere to go. */
    }
#endif
}

/* ---- Cost regions (the timer is the board's: board_mps2.c, board_stm32f405.c) ---- */
/* The plugin recognizes these two by address; they must stay real, separate functions. */
__attribute__((noinline, used)) void tfmcu_cost_begin(void) { __asm__ volatile("" ::: "memory"); }
__attribute__((noinline, used)) void tfmcu_cost_end(void) { __asm__ volatile("nop" ::: "memory"); }

static struct {
    const char *name;
    uint32_t ticks;
} g_regions[TFMCU_MAX_REGIONS];
static uint32_t g_n_regions;
static uint32_t g_region_stack[8];
static uint32_t g_region_depth;
static uint32_t g_region_errors;

void tfmcu_region_begin(const char *name) {
    if (g_n_regions == TFMCU_MAX_REGIONS || g_region_depth == 8) {
        g_region_errors++;
        return;
    }
    uint32_t i = g_n_regions++;
    g_regions[i].name = name;
    g_region_stack[g_region_depth++] = i;
    g_regions[i].ticks = tfmcu_ticks();
    tfmcu_cost_begin();
}

void tfmcu_region_end(void) {
    tfmcu_cost_end();
    uint32_t now = tfmcu_ticks();
    if (g_region_depth == 0) {
        g_region_errors++;
        return;
    }
    uint32_t i = g_region_stack[--g_region_depth];
    g_regions[i].ticks = now - g_regions[i].ticks;
}

/* ---- Memory ---- */
extern uint32_t __data_start__[], __data_end__[], __bss_start__[], __bss_end__[];
extern uint32_t __stack_limit[], __stack_top[];
extern char __sram_budget[]; /* an absolute symbol: its address is the value */
#define TFMCU_STACK_PAINT 0xC5AC5AC5u

uint32_t tfmcu_sram_budget(void) { return (uint32_t)(uintptr_t)__sram_budget; }
uint32_t tfmcu_ram_static(void) {
    return (uint32_t)((uintptr_t)__data_end__ - (uintptr_t)__data_start__) +
           (uint32_t)((uintptr_t)__bss_end__ - (uintptr_t)__bss_start__);
}
uint32_t tfmcu_stack_size(void) { return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)__stack_limit); }

uint32_t tfmcu_stack_hwm(void) {
    const uint32_t *p = __stack_limit;
    while (p < __stack_top && *p == TFMCU_STACK_PAINT) p++;
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
}

/* Paints from the stack limit up to a little below the current frame (startup.c calls it before main). */
__attribute__((noinline)) void tfmcu_stack_repaint(void) {
    uint32_t sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (uint32_t *p = __stack_limit; (uintptr_t)p < sp - 64u; p++) *p = TFMCU_STACK_PAINT;
}

uint32_t tfmcu_fnv1a32_update(uint32_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

uint32_t tfmcu_fnv1a32(const void *data, size_t n) { return tfmcu_fnv1a32_update(2166136261u, data, n); }

/* ---- The result line ---- */
#define MAX_FAILURES 8
static const char *g_failures[MAX_FAILURES];
static uint32_t g_n_failures;
static int g_result_open;

static void put_json_string(const char *s) {
    put_char('"');
    for (; *s; s++) {
        char c = *s;
        if (c == '"' || c == '\\') {
            put_char('\\');
            put_char(c);
        } else if ((unsigned char)c < 0x20) {
            put_char(' ');
        } else {
            put_char(c);
        }
    }
    put_char('"');
}

static void put_key(const char *key) {
    tfmcu_puts(", ");
    put_json_string(key);
    tfmcu_puts(": ");
}

void tfmcu_result_begin(const char *test) {
    tfmcu_flush();
    tfmcu_puts("TFMCU_RESULT {\"test\": ");
    put_json_string(test);
    g_result_open = 1;
}

void tfmcu_result_str(const char *key, const char *value) {
    put_key(key);
    put_json_string(value);
}

void tfmcu_result_int(const char *key, int64_t value) {
    put_key(key);
    tfmcu_put_i64(value);
}

void tfmcu_result_int_array(const char *key, const int32_t *values, uint32_t n) {
    put_key(key);
    put_char('[');
    for (uint32_t i = 0; i < n; i++) {
        if (i) tfmcu_puts(", ");
        tfmcu_put_i64(values[i]);
    }
    put_char(']');
}

void tfmcu_result_hex32(const char *key, uint32_t value) {
    put_key(key);
    put_char('"');
    tfmcu_put_hex32(value);
    put_char('"');
}

void tfmcu_result_raw(const char *key, const char *json) {
    put_key(key);
    tfmcu_puts(json);
}

void tfmcu_fail(const char *what) {
    if (g_n_failures < MAX_FAILURES) g_failures[g_n_failures] = what;
    g_n_failures++;
}

int tfmcu_result_end(void) {
    if (!g_result_open) tfmcu_result_begin("unnamed");
    uint32_t stack_hwm = tfmcu_stack_hwm();
    uint32_t stack_size = tfmcu_stack_size();
    uint32_t ram_static = tfmcu_ram_static();
    /* The link already refuses images over budget; this repeats the check on what actually ran. */
    if (stack_hwm >= stack_size) tfmcu_fail("stack overflow: the paint at the stack limit is gone");
    if (ram_static + stack_size > tfmcu_sram_budget()) tfmcu_fail(".data + .bss + stack exceed the SRAM budget");
    if (g_region_depth != 0 || g_region_errors != 0) tfmcu_fail("cost regions unbalanced or too many");

    tfmcu_result_str("target", tfmcu_target_name());
    tfmcu_result_int("sram_budget", tfmcu_sram_budget());
    tfmcu_result_int("ram_static", ram_static);
    tfmcu_result_int("stack_size", stack_size);
    tfmcu_result_int("stack_hwm", stack_hwm);
    put_key("regions");
    put_char('[');
    for (uint32_t i = 0; i < g_n_regions; i++) {
        tfmcu_puts(i ? ", {\"name\": " : "{\"name\": ");
        put_json_string(g_regions[i].name);
        tfmcu_puts(", \"ticks\": ");
        tfmcu_put_u64(g_regions[i].ticks);
        put_char('}');
    }
    put_char(']');
    put_key("failures");
    put_char('[');
    for (uint32_t i = 0; i < g_n_failures && i < MAX_FAILURES; i++) {
        if (i) tfmcu_puts(", ");
        put_json_string(g_failures[i]);
    }
    put_char(']');
    int status = g_n_failures ? 1 : 0;
    tfmcu_result_int("status", status);
    tfmcu_puts("}\n");
    g_result_open = 0;
    return status;
}

/* ---- C library hooks ---- */
/* assert() failures: print and exit with status 3. */
void __assert_func(const char *file, int line, const char *func, const char *expr) {
    tfmcu_flush();
    tfmcu_puts("\nTFMCU_ASSERT ");
    tfmcu_puts(file);
    put_char(':');
    tfmcu_put_i64(line);
    tfmcu_puts(func ? " in " : "");
    tfmcu_puts(func ? func : "");
    tfmcu_puts(": ");
    tfmcu_puts(expr);
    put_char('\n');
    tfmcu_exit(3);
}

/* newlib system calls: stdout/stderr go to the console; no files, no heap. */
int _write(int fd, const char *buf, int len);
int _write(int fd, const char *buf, int len) {
    if (fd != 1 && fd != 2) {
        errno = EBADF;
        return -1;
    }
    for (int i = 0; i < len; i++) put_char(buf[i]);
    return len;
}
int _read(int fd, char *buf, int len);
int _read(int fd, char *buf, int len) {
    (void)fd;
    (void)buf;
    (void)len;
    return 0;
}
int _close(int fd);
int _close(int fd) {
    (void)fd;
    return -1;
}
int _lseek(int fd, int off, int whence);
int _lseek(int fd, int off, int whence) {
    (void)fd;
    (void)off;
    (void)whence;
    return 0;
}
int _fstat(int fd, struct stat *st);
int _fstat(int fd, struct stat *st) {
    (void)fd;
    st->st_mode = S_IFCHR;
    return 0;
}
int _isatty(int fd);
int _isatty(int fd) { return fd <= 2; }
void *_sbrk(ptrdiff_t incr);
void *_sbrk(ptrdiff_t incr) {
    (void)incr;
    errno = ENOMEM; /* no heap: everything the firmware uses is static and counted by the link */
    return (void *)-1;
}
int _getpid(void);
int _getpid(void) { return 1; }
int _kill(int pid, int sig);
int _kill(int pid, int sig) {
    (void)pid;
    tfmcu_exit(128 + sig);
}
__attribute__((noreturn)) void _exit(int status);
void _exit(int status) { tfmcu_exit(status); }
