/* DEPTHWISE_CONV_2D with a 3x3 kernel, depth multiplier 1 and no dilation (every depthwise layer of the MobileNet
 * family): see tfmcu_depthwise_conv3x3_s8 in depthwise_conv2d.h. */
#include "depthwise_conv2d.h"
#include "tfmcu_dsp.h"

/* The output quantization of a layer, read once (the output stores could alias the params otherwise). */
typedef struct {
  int32_t offset, act_min, act_max;
} TfmcuDw3x3Out;

/* One tap of four channels: x (four input bytes) plus the input offset (both halves of off2) times w (four filter
 * bytes), into the channels' accumulators (a0..a3: channels 0..3). */
#define TFMCU_DW3X3_TAP(x, w)                                                    \
  do {                                                                           \
    const uint32_t xv_ = tfmcu_read_s8x4(x), wv_ = tfmcu_read_s8x4(w);           \
    const uint32_t xo_ = tfmcu_sxtab16_ror8(off2, xv_);                         \
    const uint32_t wo_ = tfmcu_sxtb16_ror8(wv_);                                \
    a1 = tfmcu_smlabb(xo_, wo_, a1);                                            \
    a3 = tfmcu_smlatt(xo_, wo_, a3);                                            \
    const uint32_t xe_ = tfmcu_sxtab16(off2, xv_), we_ = tfmcu_sxtb16(wv_);     \
    a0 = tfmcu_smlabb(xe_, we_, a0);                                            \
    a2 = tfmcu_smlatt(xe_, we_, a2);                                            \
  } while (0)

/* The same without the input offset (an inner pixel's: the offset's products are in its bias table), stepping x and w
 * to the next tap. */
#define TFMCU_DW3X3_TAP0(x, w, step)                                             \
  do {                                                                           \
    const uint32_t xv_ = tfmcu_read_s8x4(x), wv_ = tfmcu_read_s8x4(w);           \
    const uint32_t xo_ = tfmcu_sxtb16_ror8(xv_), wo_ = tfmcu_sxtb16_ror8(wv_);   \
    a1 = tfmcu_smlabb(xo_, wo_, a1);                                            \
    a3 = tfmcu_smlatt(xo_, wo_, a3);                                            \
    const uint32_t xe_ = tfmcu_sxtb16(xv_), we_ = tfmcu_sxtb16(wv_);            \
    a0 = tfmcu_smlabb(xe_, we_, a0);                                            \
    a2 = tfmcu_smlatt(xe_, we_, a2);                                            \
    (x) += (step);                                                               \
    (w) += C;                                                                    \
  } while (0)

#if TFMCU_DSP_ASM
/* TFMCU_DW3X3_TAP0's nine taps of an inner pixel in Thumb-2 (the compiler spills the window's addresses): x, w the
 * group's first tap, C bytes from one tap to the next, row_stride from one input row to the next, the filter's rows
 * 3 C apart. 10 instructions per tap and 3 per row. */
#define TFMCU_DW3X3_ASM_TAP(xoff, woff)                  \
  "ldr %[xv], [%[x], " xoff "]\n\t"                     \
  "ldr %[wv], [%[w], " woff "]\n\t"                     \
  "sxtb16 %[t0], %[xv], ror #8\n\t"                     \
  "sxtb16 %[t1], %[wv], ror #8\n\t"                     \
  "smlabb %[a1], %[t0], %[t1], %[a1]\n\t"               \
  "smlatt %[a3], %[t0], %[t1], %[a3]\n\t"               \
  "sxtb16 %[t0], %[xv]\n\t"                             \
  "sxtb16 %[t1], %[wv]\n\t"                             \
  "smlabb %[a0], %[t0], %[t1], %[a0]\n\t"               \
  "smlatt %[a2], %[t0], %[t1], %[a2]\n\t"

static inline __attribute__((always_inline)) void tfmcu_dw3x3_inner_taps(const int8_t* x, const int8_t* w, int32_t C,
                                                                        int32_t row_stride, int32_t* a0, int32_t* a1,
                                                                        int32_t* a2, int32_t* a3) {
  int32_t r0 = *a0, r1 = *a1, r2 = *a2, r3 = *a3;
  uint32_t xv, wv, t0, t1;
  const int32_t C2 = 2 * C;
  __asm__(
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]") TFMCU_DW3X3_ASM_TAP("%[c2]", "%[c2]")
      "add %[x], %[x], %[rs]\n\t"
      "add %[w], %[w], %[c2]\n\t"
      "add %[w], %[w], %[c1]\n\t"
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]") TFMCU_DW3X3_ASM_TAP("%[c2]", "%[c2]")
      "add %[x], %[x], %[rs]\n\t"
      "add %[w], %[w], %[c2]\n\t"
      "add %[w], %[w], %[c1]\n\t"
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]") TFMCU_DW3X3_ASM_TAP("%[c2]", "%[c2]")
      : [a0] "+r"(r0), [a1] "+r"(r1), [a2] "+r"(r2), [a3] "+r"(r3), [x] "+r"(x), [w] "+r"(w), [xv] "=&r"(xv),
        [wv] "=&r"(wv), [t0] "=&r"(t0), [t1] "=&r"(t1)
      : [c1] "r"(C), [c2] "r"(C2), [rs] "r"(row_stride)
      : "memory");
  *a0 = r0;
  *a1 = r1;
  *a2 = r2;
  *a3 = r3;
}
#endif

/* Channels of a pixel whose accumulators wait for their requantization (on the stack): the products keep every
 * register busy; the requantization runs afterwards with its own. */
#define TFMCU_DW3X3_PASS 16

/* The requantization of the channels: each one's short constants (tfmcu_short_quant) made once per call for up to
 * TFMCU_DW3X3_TABLE channels (on the stack), right = -1 where the short path does not apply (and beyond the table). */
#define TFMCU_DW3X3_TABLE 128 /* = TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS (cmsis_nn_backend.h) */

/* Its arrays follow each other at fixed distances (TFMCU_DW3X3_ROUND / _MULT / _RIGHT bytes past inner_bias[c]:
 * the Thumb-2 requantization of an inner pixel reads a channel's four values through one pointer). */
typedef struct {
  int32_t inner_bias[TFMCU_DW3X3_TABLE]; /* bias + input offset x the channel's nine filter values */
  int32_t round[TFMCU_DW3X3_TABLE];
  int32_t mult[TFMCU_DW3X3_TABLE];
  int32_t right[TFMCU_DW3X3_TABLE];
  int all_short; /* every channel in the table, and the table holds them all */
} TfmcuDw3x3Quant;
#define TFMCU_DW3X3_ROUND "512"  /* 4 x TFMCU_DW3X3_TABLE */
#define TFMCU_DW3X3_MULT "1024"
#define TFMCU_DW3X3_RIGHT "1536"

static void tfmcu_dw3x3_quant(const TfmcuDepthwiseConvParams* p, int32_t C, int32_t output_offset,
                              TfmcuDw3x3Quant* t) {
  t->all_short = C <= TFMCU_DW3X3_TABLE;
  for (int32_t c = 0; c < C && c < TFMCU_DW3X3_TABLE; ++c) {
    int32_t b = p->bias != NULL ? p->bias[c] : 0;
    for (int32_t k = 0; k < 9; ++k) {
      b = tfmcu_wrap_add(b, p->input_offset * p->filter[k * C + c]);
    }
    t->inner_bias[c] = b;
    const int32_t m = p->output_multiplier[c], s = p->output_shift[c];
    t->mult[c] = m;
    if (tfmcu_short_quant_ok(m, s)) {
      const TfmcuShortQuant f = tfmcu_short_quant(m, s, output_offset);
      t->round[c] = f.round;
      t->right[c] = f.right;
    } else {
      t->round[c] = 0;
      t->right[c] = -1;
      t->all_short = 0;
    }
  }
}

/* n accumulators of channels c0.. requantized into o[c0..]. */
static void tfmcu_dw3x3_store(const TfmcuDepthwiseConvParams* p, TfmcuDw3x3Out q, const TfmcuDw3x3Quant* t,
                              const int32_t* acc, int32_t c0, int32_t n, int8_t* o) {
  const int32_t* m = p->output_multiplier;
  if (t->all_short) {
    tfmcu_requantize_short_channels(acc, t->mult + c0, t->round + c0, t->right + c0, n, q.act_min, q.act_max, o + c0);
    return;
  }
  for (int32_t c = c0; c < c0 + n; ++c) {
    int32_t v;
    if (c < TFMCU_DW3X3_TABLE && t->right[c] >= 0) {
      const TfmcuShortQuant f = {m[c], t->round[c], t->right[c]};
      v = tfmcu_requantize_short(acc[c - c0], f);
    } else {
      v = tfmcu_wrap_add(tfmcu_multiply_by_quantized_multiplier(acc[c - c0], m[c], p->output_shift[c]), q.offset);
    }
    o[c] = (int8_t)tfmcu_clamp(v, q.act_min, q.act_max);
  }
}

#if TFMCU_DSP_ASM
/* The fixed distances of the table's arrays (a C99 compile-time check: a negative array size fails). */
typedef char tfmcu_dw3x3_table_layout[(offsetof(TfmcuDw3x3Quant, round) == 4 * TFMCU_DW3X3_TABLE &&
                                       offsetof(TfmcuDw3x3Quant, mult) == 8 * TFMCU_DW3X3_TABLE &&
                                       offsetof(TfmcuDw3x3Quant, right) == 12 * TFMCU_DW3X3_TABLE)
                                          ? 1
                                          : -1];

/* One channel k (0..3) of a group: tfmcu_requantize_short of the accumulator a with the constants TFMCU_DW3X3_ROUND
 * / _MULT / _RIGHT bytes past %[t] (the channel's inner_bias), clamped (clamp(hi)), stored at %[o] + k; m, lo, hi
 * name temporaries. 11 instructions with SSAT. */
#define TFMCU_DW3X3_ASM_OUT(k, a, m, lo, hi, clamp)                  \
  "ldr %[" m "], [%[t], #" TFMCU_DW3X3_MULT "+4*" #k "]\n\t"        \
  "and %[" lo "], %[" a "], #0x80000000\n\t"                        \
  "orr %[" lo "], %[" lo "], #0x40000000\n\t"                       \
  "asr %[" hi "], %[" a "], #31\n\t"                                \
  "smlal %[" lo "], %[" hi "], %[" a "], %[" m "]\n\t"              \
  "ldr %[" m "], [%[t], #" TFMCU_DW3X3_ROUND "+4*" #k "]\n\t"       \
  "ldr %[" lo "], [%[t], #" TFMCU_DW3X3_RIGHT "+4*" #k "]\n\t"      \
  "add %[" hi "], %[" hi "], %[" m "]\n\t"                          \
  "asr %[" hi "], %[" hi "], %[" lo "]\n\t" clamp(hi)               \
  "strb %[" hi "], [%[o], #" #k "]\n\t"
#define TFMCU_DW3X3_SSAT(hi) "ssat %[" hi "], #8, %[" hi "]\n\t"
#define TFMCU_DW3X3_CLAMP(hi)                \
  "cmp %[" hi "], %[amin]\n\t"              \
  "it lt\n\t"                               \
  "movlt %[" hi "], %[amin]\n\t"            \
  "cmp %[" hi "], %[amax]\n\t"              \
  "it gt\n\t"                               \
  "movgt %[" hi "], %[amax]\n\t"
#define TFMCU_DW3X3_ASM_OUT4(m, lo, hi, clamp)                                                       \
  TFMCU_DW3X3_ASM_OUT(0, "a0", m, lo, hi, clamp) TFMCU_DW3X3_ASM_OUT(1, "a1", m, lo, hi, clamp)   \
  TFMCU_DW3X3_ASM_OUT(2, "a2", m, lo, hi, clamp) TFMCU_DW3X3_ASM_OUT(3, "a3", m, lo, hi, clamp)

/* One inner output pixel over the whole int8 range, all in Thumb-2: per group of four channels (`groups` of them)
 * the bias from the table (t: inner_bias[0] of the pixel's first channel), the nine taps (TFMCU_DW3X3_ASM_TAP: x, w
 * the first tap of the group, C bytes to the next tap, the taps 2 C apart read through a shifted C, row_stride to
 * the next input row), the window's pointers back to the next group, then the four outputs requantized and stored
 * at o (TFMCU_DW3X3_ASM_OUT with SSAT). 149 instructions per group; every register but sp busy, the group count on
 * the stack. */
static inline __attribute__((always_inline)) void tfmcu_dw3x3_inner_pixel_ssat(const int8_t* x, const int8_t* w,
                                                                             const int32_t* t, int8_t* o, int32_t C,
                                                                             int32_t row_stride, int32_t groups) {
  uint32_t a0, a1, a2, a3, xv, wv, t0, t1;
  __asm__ volatile(
      "1:\n\t"
      "ldrd %[a0], %[a1], [%[t]]\n\t"
      "ldrd %[a2], %[a3], [%[t], #8]\n\t"
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]")
      TFMCU_DW3X3_ASM_TAP("%[c1], lsl #1", "%[c1], lsl #1")
      "add %[x], %[x], %[rs]\n\t"
      "add %[w], %[w], %[c1], lsl #1\n\t"
      "add %[w], %[w], %[c1]\n\t"
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]")
      TFMCU_DW3X3_ASM_TAP("%[c1], lsl #1", "%[c1], lsl #1")
      "add %[x], %[x], %[rs]\n\t"
      "add %[w], %[w], %[c1], lsl #1\n\t"
      "add %[w], %[w], %[c1]\n\t"
      TFMCU_DW3X3_ASM_TAP("#0", "#0") TFMCU_DW3X3_ASM_TAP("%[c1]", "%[c1]")
      TFMCU_DW3X3_ASM_TAP("%[c1], lsl #1", "%[c1], lsl #1")
      "sub %[x], %[x], %[rs], lsl #1\n\t"
      "add %[x], %[x], #4\n\t"
      "sub %[w], %[w], %[c1], lsl #2\n\t"
      "sub %[w], %[w], %[c1], lsl #1\n\t"
      "add %[w], %[w], #4\n\t"
      TFMCU_DW3X3_ASM_OUT4("xv", "wv", "t0", TFMCU_DW3X3_SSAT)
      "add %[t], %[t], #16\n\t"
      "add %[o], %[o], #4\n\t"
      "ldr %[t1], %[left]\n\t"
      "subs %[t1], %[t1], #1\n\t"
      "str %[t1], %[left]\n\t"
      "bne 1b\n\t"
      : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [xv] "=&r"(xv), [wv] "=&r"(wv),
        [t0] "=&r"(t0), [t1] "=&r"(t1), [x] "+r"(x), [w] "+r"(w), [t] "+r"(t), [o] "+r"(o), [left] "+m"(groups)
      : [c1] "r"(C), [rs] "r"(row_stride)
      : "cc", "memory");
}

/* A run of n inner output pixels of one row (every tap inside the input box; the table holds every channel, all
 * short, C a multiple of 4): x the window of the first, `step` bytes to the next one's (stride x C), o the first
 * output pixel. Per pixel, per group of four channels: the nine taps (tfmcu_dw3x3_inner_taps), then the four outputs
 * requantized and stored, in CMSIS-NN's order (arm_depthwise_conv_3x3_s8: the group's taps read, then its outputs
 * written), with no accumulator on the stack. `ssat`: the activation range is the whole int8 range. */
static inline void tfmcu_dw3x3_inner_run(const int8_t* filter, const TfmcuDw3x3Quant* t, const int8_t* x,
                                         int32_t row_stride, int32_t C, int32_t step, int32_t n, int32_t act_min,
                                         int32_t act_max, int ssat, int8_t* o) {
  if (ssat) {
    for (; n > 0; --n, x += step, o += C) {
      tfmcu_dw3x3_inner_pixel_ssat(x, filter, t->inner_bias, o, C, row_stride, C >> 2);
    }
    return;
  }
  for (; n > 0; --n, x += step, o += C) {
    for (int32_t c = 0; c < C; c += 4) {
      const int32_t* tc = t->inner_bias + c;
      int32_t a0 = tc[0], a1 = tc[1], a2 = tc[2], a3 = tc[3];
      tfmcu_dw3x3_inner_taps(x + c, filter + c, C, row_stride, &a0, &a1, &a2, &a3);
      int8_t* oc = o + c;
      uint32_t m, lo, hi;
      __asm__ volatile(TFMCU_DW3X3_ASM_OUT4("m", "lo", "hi", TFMCU_DW3X3_CLAMP)
                       : [m] "=&r"(m), [lo] "=&r"(lo), [hi] "=&r"(hi)
                       : [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [a3] "r"(a3), [t] "r"(tc), [o] "r"(oc),
                         [amin] "r"(act_min), [amax] "r"(act_max)
                       : "cc", "memory");
    }
  }
}
#endif

/* One output pixel `o` from the window rows ky0..ky1 and columns kx0..kx1 of the filter that lie inside the input box
 * (none when ky0 >= ky1 or kx0 >= kx1: the bias alone, as the reference); x: the input pixel under tap (ky0, kx0),
 * or any pixel when there is none. An inner pixel (the whole window) runs its nine taps without bounds. Channels
 * four at a time, TFMCU_DW3X3_PASS per requantization pass, then a tail one at a time. */
static inline void tfmcu_dw3x3_pixel(const TfmcuDepthwiseConvParams* p, TfmcuDw3x3Out q, const TfmcuDw3x3Quant* t,
                                     uint32_t off2,
                                     const int8_t* x, int32_t row_stride, int32_t C, int32_t ky0, int32_t ky1,
                                     int32_t kx0, int32_t kx1, int8_t* o) {
  const int full = ky0 == 0 && ky1 == 3 && kx0 == 0 && kx1 == 3;
  const int8_t* w0 = p->filter + (ptrdiff_t)(ky0 * 3 + kx0) * C;
  const int32_t* bias = p->bias;
  int32_t acc[TFMCU_DW3X3_PASS];
  int32_t c = 0;
  if (full && C <= TFMCU_DW3X3_TABLE) { /* an inner pixel: nine taps straight, the offset in the bias table */
#if !(TFMCU_DSP_ASM)
    const int32_t next_row = row_stride - 3 * C;
#endif
    while (c + 4 <= C) {
      const int32_t c0 = c;
      for (; c + 4 <= C && c - c0 < TFMCU_DW3X3_PASS; c += 4) {
        int32_t a0 = t->inner_bias[c], a1 = t->inner_bias[c + 1], a2 = t->inner_bias[c + 2];
        int32_t a3 = t->inner_bias[c + 3];
        const int8_t* xr = x + c;
        const int8_t* wr = p->filter + c;
#if TFMCU_DSP_ASM
        tfmcu_dw3x3_inner_taps(xr, wr, C, row_stride, &a0, &a1, &a2, &a3);
#else
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
        xr += next_row;
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
        xr += next_row;
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
        TFMCU_DW3X3_TAP0(xr, wr, C);
#endif
        int32_t* a = acc + (c - c0);
        a[0] = a0;
        a[1] = a1;
        a[2] = a2;
        a[3] = a3;
      }
      tfmcu_dw3x3_store(p, q, t, acc, c0, c - c0, o);
    }
  }
  while (c + 4 <= C) {
    const int32_t c0 = c;
    for (; c + 4 <= C && c - c0 < TFMCU_DW3X3_PASS; c += 4) {
      int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      if (bias != NULL) {
        a0 = bias[c];
        a1 = bias[c + 1];
        a2 = bias[c + 2];
        a3 = bias[c + 3];
      }
      const int8_t* xr = x + c;
      const int8_t* wr = w0 + c;
      if (full) {
        TFMCU_DW3X3_TAP(xr, wr);
        TFMCU_DW3X3_TAP(xr + C, wr + C);
        TFMCU_DW3X3_TAP(xr + 2 * C, wr + 2 * C);
        xr += row_stride;
        wr += 3 * C;
        TFMCU_DW3X3_TAP(xr, wr);
        TFMCU_DW3X3_TAP(xr + C, wr + C);
        TFMCU_DW3X3_TAP(xr + 2 * C, wr + 2 * C);
        xr += row_stride;
        wr += 3 * C;
        TFMCU_DW3X3_TAP(xr, wr);
        TFMCU_DW3X3_TAP(xr + C, wr + C);
        TFMCU_DW3X3_TAP(xr + 2 * C, wr + 2 * C);
      } else {
        for (int32_t ky = ky0; ky < ky1; ++ky, xr += row_stride, wr += 3 * C) {
          for (int32_t kx = 0; kx < kx1 - kx0; ++kx) {
            TFMCU_DW3X3_TAP(xr + kx * C, wr + kx * C);
          }
        }
      }
      int32_t* a = acc + (c - c0);
      a[0] = a0;
      a[1] = a1;
      a[2] = a2;
      a[3] = a3;
    }
    tfmcu_dw3x3_store(p, q, t, acc, c0, c - c0, o);
  }
  for (; c < C; ++c) {
    int32_t sum = bias != NULL ? bias[c] : 0;
    const int8_t* xr = x + c;
    const int8_t* wr = w0 + c;
    for (int32_t ky = ky0; ky < ky1; ++ky, xr += row_stride, wr += 3 * C) {
      for (int32_t kx = 0; kx < kx1 - kx0; ++kx) {
        sum = tfmcu_wrap_add(sum, wr[kx * C] * (xr[kx * C] + p->input_offset));
      }
    }
    tfmcu_dw3x3_store(p, q, t, &sum, c, 1, o);
  }
}

int tfmcu_depthwise_conv3x3_covers(const TfmcuDepthwiseConvParams* p) {
  return p->kernel_h == 3 && p->kernel_w == 3 && p->depth_multiplier == 1 && p->dilation_h == 1 &&
         p->dilation_w == 1;
}

TfmcuStatus tfmcu_depthwise_conv3x3_s8(const TfmcuDepthwiseConvParams* params, const TfmcuConstView* input,
                                       int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL || params->filter == NULL ||
      params->output_multiplier == NULL || params->output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_depthwise_conv3x3_covers(params) || input->channels != output->channels) {
    return kTfmcuErrorShapeMismatch;
  }
  const TfmcuDw3x3Out q = {params->output_offset, params->act_min, params->act_max};
  const uint32_t off2 = ((uint32_t)params->input_offset & 0xFFFFu) * 0x10001u;
  const int32_t C = output->channels;
  TfmcuDw3x3Quant table;
  tfmcu_dw3x3_quant(params, C, params->output_offset, &table);
#if TFMCU_DSP_ASM
  /* the inner pixels run without bounds when every channel takes the short requantization, four at a time: the
   * columns ox < inner_end whose window ends inside the input (those from the first with kx0 = 0 on) */
  const int run_ok = table.all_short && (C & 3) == 0;
  const int ssat = q.act_min == -128 && q.act_max == 127;
  const int32_t inner_end = tfmcu_min_i32(output->width, (input->width - 3 + pad_left) / params->stride_w + 1);
#endif
  for (int32_t oy = 0; oy < output->height; ++oy) {
    const int32_t iy = oy * params->stride_h - pad_top;
    const int32_t ky0 = iy < 0 ? -iy : 0;
    const int32_t ky1 = tfmcu_min_i32(3, input->height - iy);
    int8_t* o = output->data + (ptrdiff_t)oy * output->row_stride;
    for (int32_t ox = 0; ox < output->width; ++ox, o += C) {
      const int32_t ix = ox * params->stride_w - pad_left;
      const int32_t kx0 = ix < 0 ? -ix : 0;
      const int32_t kx1 = tfmcu_min_i32(3, input->width - ix);
#if TFMCU_DSP_ASM
      if (run_ok && ky0 == 0 && ky1 == 3 && kx0 == 0 && kx1 == 3 && ox < inner_end) { /* the row's inner pixels, in one run */
        const int32_t n = inner_end - ox;
        tfmcu_dw3x3_inner_run(params->filter, &table, input->data + (ptrdiff_t)iy * input->row_stride +
                                                          (ptrdiff_t)ix * C,
                              input->row_stride, C, params->stride_w * C, n, q.act_min, q.act_max, ssat, o);
        ox += n - 1;
        o += (ptrdiff_t)(n - 1) * C;
        continue;
      }
#endif
      if (ky0 >= ky1 || kx0 >= kx1) {
        tfmcu_dw3x3_pixel(params, q, &table, off2, input->data, input->row_stride, C, 0, 0, 0, 0, o);
        continue;
      }
      const int8_t* x = input->data + (ptrdiff_t)(iy + ky0) * input->row_stride + (ptrdiff_t)(ix + kx0) * C;
      tfmcu_dw3x3_pixel(params, q, &table, off2, x, input->row_stride, C, ky0, ky1, kx0, kx1, o);
    }
  }
  return kTfmcuOk;
}
