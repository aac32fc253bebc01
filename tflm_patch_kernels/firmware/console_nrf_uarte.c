/* The console on the nRF5340 application core's UARTE0 (EasyDMA only; its secure alias 0x50008000: the core boots
 * secure): 115200 8N1, TX on one GPIO pin of port 0 (the nRF5340 DK's virtual COM port: P0.20). EasyDMA reads
 * RAM only, so each chunk is copied to a buffer on the stack first.
 *   TFMCU_TX_PIN   the TX pin of port 0 */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

#ifndef TFMCU_TX_PIN
#error "console_nrf_uarte.c: build with TFMCU_TX_PIN (tflm_patch_kernels/firmware/BUILD: CONSOLES)"
#endif

#define REG(addr) (*(volatile uint32_t *)(addr))
#define UARTE0_BASE 0x50008000u
#define UARTE_TASKS_STARTTX REG(UARTE0_BASE + 0x008u)
#define UARTE_EVENTS_ENDTX REG(UARTE0_BASE + 0x120u)
#define UARTE_ENABLE REG(UARTE0_BASE + 0x500u)
#define UARTE_PSEL_TXD REG(UARTE0_BASE + 0x50Cu)
#define UARTE_BAUDRATE REG(UARTE0_BASE + 0x524u)
#define UARTE_TXD_PTR REG(UARTE0_BASE + 0x544u)
#define UARTE_TXD_MAXCNT REG(UARTE0_BASE + 0x548u)
#define UARTE_CONFIG REG(UARTE0_BASE + 0x56Cu)
#define UARTE_ENABLE_ON 8u
#define UARTE_BAUD_115200 0x01D60000u
#define P0_BASE 0x50842500u /* GPIO port 0, secure alias */
#define P0_OUTSET REG(P0_BASE + 0x008u)
#define P0_DIRSET REG(P0_BASE + 0x018u)
#define CHUNK 64u

void tfmcu_board_console_write(const char *data, size_t n) {
    if (UARTE_ENABLE != UARTE_ENABLE_ON) {
        P0_OUTSET = 1u << TFMCU_TX_PIN;
        P0_DIRSET = 1u << TFMCU_TX_PIN;
        UARTE_PSEL_TXD = TFMCU_TX_PIN; /* port 0, CONNECT (bit 31) 0: connected */
        UARTE_BAUDRATE = UARTE_BAUD_115200;
        UARTE_CONFIG = 0u; /* 8N1, no flow control */
        UARTE_ENABLE = UARTE_ENABLE_ON;
    }
    uint8_t buffer[CHUNK];
    while (n > 0u) {
        const size_t k = n < CHUNK ? n : CHUNK;
        for (size_t i = 0; i < k; ++i) {
            buffer[i] = (uint8_t)data[i];
        }
        UARTE_EVENTS_ENDTX = 0u;
        UARTE_TXD_PTR = (uint32_t)(uintptr_t)buffer;
        UARTE_TXD_MAXCNT = (uint32_t)k;
        UARTE_TASKS_STARTTX = 1u;
        while (UARTE_EVENTS_ENDTX == 0u) {
        }
        data += k;
        n -= k;
    }
}
