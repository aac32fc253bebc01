/* insn_count: a QEMU TCG plugin that counts executed guest instructions, exactly and repeatably.
 *
 *   qemu-system-arm ... -plugin libinsn_count.so,begin=0xADDR,end=0xADDR[,range=0xLO:0xHI][,out=PATH]
 *
 * Every executed instruction adds 1 to a counter (an inline add that TCG emits before the instruction, so
 * the count does not depend on how QEMU chains or re-translates blocks). Regions: each time the
 * instruction at `begin` executes (the firmware's cost-marker function tfmcu_cost_begin) a region opens,
 * each time the one at `end` executes the innermost open region closes; a region's count is the number
 * of instructions executed in between (the marker calls' own few instructions included). Regions are
 * numbered in the order they open, so the firmware can name them in the same order. With `range`, the
 * instructions whose address lies in [LO, HI) are counted separately too (e.g. one kernel's code).
 *
 * At exit the plugin writes one line
 *   INSN_COUNT {"total": N, "range_total": N, "regions": [{"insns": N, "range_insns": N}, ...], "open": K}
 * to PATH (or QEMU's log, which needs `-d plugin`). Thumb symbol addresses may be passed as they are: bit 0
 * is ignored. Single vCPU only (the Cortex-M boards have one).
 *
 * With `profile=PATH` the plugin also counts every instruction address's executions and writes one line
 * "0xADDR COUNT" per executed address to PATH at exit (tools/qemu/profile.py sums them per function).
 *
 * With `segments=PATH` (and `profile=`) it also splits those counts at every marker: each time a marker executes
 * it writes "S <marker number> <B|E> <depth>" (the marker's kind, and the depth of open regions before it) and then
 * "0xADDR COUNT" for every address executed since the marker before (the instructions before marker 0 in the first
 * block); at exit a last block "S <n> X <depth>" holds the rest. A region without regions inside it is the block its
 * end marker closes: exactly its instructions, per address (tfmcu/firmware/profile.py reads them per op).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu_plugin_api.h"

TFMCU_QEMU_PLUGIN_EXPORT int qemu_plugin_version = TFMCU_QEMU_PLUGIN_API_VERSION;

#define MAX_REGIONS 4096
#define MAX_DEPTH 32

typedef struct {
    uint64_t insns;
    uint64_t range_insns;
    int closed;
} Region;

static uint64_t g_total;       /* every executed instruction */
static uint64_t g_range_total; /* those in [g_lo, g_hi) */
static uint64_t g_begin = UINT64_MAX, g_end = UINT64_MAX, g_lo = 1, g_hi = 0;
static const char *g_out_path;

/* profile=PATH: an open-addressing table of per-address counters (entries never move: the inline adds keep
 * pointers into it). */
#define PROFILE_SLOTS (1u << 18)
typedef struct {
    uint64_t pc; /* 0: free */
    uint64_t count;
} ProfileSlot;
static ProfileSlot *g_profile;
static const char *g_profile_path;
static size_t g_profile_full; /* addresses that found no free slot (not profiled) */

/* segments=PATH: the counts at the last marker, per slot (the next block writes what was added since). */
static const char *g_segments_path;
static FILE *g_segments;
static uint64_t *g_segment_last;
static size_t g_markers;

static uint64_t *profile_counter(uint64_t pc) {
    uint64_t key = pc | 1; /* never 0 */
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (PROFILE_SLOTS - 1);
    for (size_t n = 0; n < PROFILE_SLOTS; n++, h = (h + 1) & (PROFILE_SLOTS - 1)) {
        if (g_profile[h].pc == key) return &g_profile[h].count;
        if (g_profile[h].pc == 0) {
            g_profile[h].pc = key;
            return &g_profile[h].count;
        }
    }
    g_profile_full++;
    return NULL;
}

static Region g_regions[MAX_REGIONS];
static size_t g_n_regions;
static size_t g_overflow; /* regions past MAX_REGIONS, not recorded */
static struct {
    size_t index; /* into g_regions, or SIZE_MAX when not recorded */
    uint64_t total0, range0;
} g_stack[MAX_DEPTH];
static size_t g_bad_nesting; /* end without begin, or nesting deeper than MAX_DEPTH */

static size_t g_depth;

/* One block of the segments file: what every address ran since the marker before, closed by a marker of `kind`. */
static void write_segment(char kind) {
    if (g_segments == NULL) return;
    fprintf(g_segments, "S %zu %c %zu\n", g_markers++, kind, g_depth);
    for (size_t i = 0; i < PROFILE_SLOTS; i++) {
        if (g_profile[i].pc != 0 && g_profile[i].count != g_segment_last[i]) {
            fprintf(g_segments, "0x%" PRIx64 " %" PRIu64 "\n", g_profile[i].pc & ~(uint64_t)1,
                    g_profile[i].count - g_segment_last[i]);
            g_segment_last[i] = g_profile[i].count;
        }
    }
}

static void on_begin(unsigned int vcpu, void *udata) {
    (void)vcpu;
    (void)udata;
    write_segment('B');
    if (g_depth == MAX_DEPTH) {
        g_bad_nesting++;
        return;
    }
    size_t index = SIZE_MAX;
    if (g_n_regions < MAX_REGIONS) {
        index = g_n_regions++;
    } else {
        g_overflow++;
    }
    g_stack[g_depth].index = index;
    g_stack[g_depth].total0 = g_total;
    g_stack[g_depth].range0 = g_range_total;
    g_depth++;
}

static void on_end(unsigned int vcpu, void *udata) {
    (void)vcpu;
    (void)udata;
    write_segment('E');
    if (g_depth == 0) {
        g_bad_nesting++;
        return;
    }
    g_depth--;
    size_t index = g_stack[g_depth].index;
    if (index != SIZE_MAX) {
        g_regions[index].insns = g_total - g_stack[g_depth].total0;
        g_regions[index].range_insns = g_range_total - g_stack[g_depth].range0;
        g_regions[index].closed = 1;
    }
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t pc = qemu_plugin_insn_vaddr(insn);
        /* Markers first: a region then starts before, and ends before, the marker instruction's own count. */
        if (pc == g_begin) {
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_begin, QEMU_PLUGIN_CB_NO_REGS, NULL);
        } else if (pc == g_end) {
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_end, QEMU_PLUGIN_CB_NO_REGS, NULL);
        }
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &g_total, 1);
        if (pc >= g_lo && pc < g_hi) {
            qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &g_range_total, 1);
        }
        if (g_profile != NULL) {
            uint64_t *counter = profile_counter(pc);
            if (counter != NULL) {
                qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, counter, 1);
            }
        }
    }
}

static void on_exit(qemu_plugin_id_t id, void *udata) {
    (void)id;
    (void)udata;
    /* One JSON line; built in a heap buffer because QEMU's log takes a whole string. */
    size_t cap = 256 + (size_t)g_n_regions * 64;
    char *buf = malloc(cap);
    if (buf == NULL) return;
    size_t len = (size_t)snprintf(buf, cap, "INSN_COUNT {\"total\": %" PRIu64 ", \"range_total\": %" PRIu64
                                  ", \"open\": %zu, \"dropped\": %zu, \"bad_nesting\": %zu, \"regions\": [",
                                  g_total, g_range_total, g_depth, g_overflow, g_bad_nesting);
    for (size_t i = 0; i < g_n_regions && len < cap; i++) {
        if (!g_regions[i].closed) continue; /* still open at exit: counted in "open" */
        len += (size_t)snprintf(buf + len, cap - len, "%s{\"insns\": %" PRIu64 ", \"range_insns\": %" PRIu64 "}",
                                i ? ", " : "", g_regions[i].insns, g_regions[i].range_insns);
    }
    if (len < cap) snprintf(buf + len, cap - len, "]}\n");
    if (g_out_path != NULL) {
        FILE *f = fopen(g_out_path, "w");
        if (f != NULL) {
            fputs(buf, f);
            fclose(f);
        } else {
            fprintf(stderr, "insn_count: cannot write %s\n", g_out_path);
        }
    } else {
        qemu_plugin_outs(buf);
    }
    free(buf);
    if (g_segments != NULL) {
        write_segment('X');
        fclose(g_segments);
        g_segments = NULL;
    }
    if (g_profile != NULL) {
        FILE *f = fopen(g_profile_path, "w");
        if (f == NULL) {
            fprintf(stderr, "insn_count: cannot write %s\n", g_profile_path);
            return;
        }
        for (size_t i = 0; i < PROFILE_SLOTS; i++) {
            if (g_profile[i].pc != 0 && g_profile[i].count != 0) {
                fprintf(f, "0x%" PRIx64 " %" PRIu64 "\n", g_profile[i].pc & ~(uint64_t)1, g_profile[i].count);
            }
        }
        if (g_profile_full) fprintf(stderr, "insn_count: %zu addresses not profiled (table full)\n", g_profile_full);
        fclose(f);
    }
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || (*end != '\0' && *end != ':')) return -1;
    *out = (uint64_t)v;
    return 0;
}

TFMCU_QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                                 char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "begin=", 6) == 0) {
            if (parse_u64(a + 6, &g_begin)) goto bad;
            g_begin &= ~(uint64_t)1;
        } else if (strncmp(a, "end=", 4) == 0) {
            if (parse_u64(a + 4, &g_end)) goto bad;
            g_end &= ~(uint64_t)1;
        } else if (strncmp(a, "range=", 6) == 0) {
            const char *colon = strchr(a + 6, ':');
            if (colon == NULL || parse_u64(a + 6, &g_lo) || parse_u64(colon + 1, &g_hi)) goto bad;
            g_lo &= ~(uint64_t)1;
            g_hi &= ~(uint64_t)1;
        } else if (strncmp(a, "out=", 4) == 0) {
            g_out_path = a + 4;
        } else if (strncmp(a, "profile=", 8) == 0) {
            g_profile_path = a + 8;
        } else if (strncmp(a, "segments=", 9) == 0) {
            g_segments_path = a + 9;
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "insn_count: bad argument '%s' (want begin=ADDR end=ADDR range=LO:HI out=PATH profile=PATH segments=PATH)\n", a);
        return -1;
    }
    if (g_begin == g_end && g_begin != UINT64_MAX) {
        fprintf(stderr, "insn_count: begin and end are the same address\n");
        return -1;
    }
    if (g_profile_path != NULL) {
        g_profile = calloc(PROFILE_SLOTS, sizeof(ProfileSlot));
        if (g_profile == NULL) {
            fprintf(stderr, "insn_count: no memory for the profile table\n");
            return -1;
        }
    }
    if (g_segments_path != NULL) {
        if (g_profile == NULL) {
            fprintf(stderr, "insn_count: segments= needs profile=\n");
            return -1;
        }
        g_segment_last = calloc(PROFILE_SLOTS, sizeof(uint64_t));
        g_segments = fopen(g_segments_path, "w");
        if (g_segment_last == NULL || g_segments == NULL) {
            fprintf(stderr, "insn_count: cannot write %s\n", g_segments_path);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_exit, NULL);
    return 0;
}
