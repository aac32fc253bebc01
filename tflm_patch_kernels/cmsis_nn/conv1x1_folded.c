/* A folded 1x1 convolution's product (DSP extension, no Helium): see tfmcu_conv1x1_folded_s8 below. Its own
 * translation unit, so that it stays one function the latency calibration can count (benchmarks/latency.py runs the
 * instruction counter over its address range). */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnsupportfunctions.h"
#include "tfmcu_dsp.h"

#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
/* The output quantization of one layer, read once (the output stores could alias the params otherwise). */
typedef struct {
  int32_t offset, act_min, act_max;
} TfmcuOutQuant;

static inline int8_t tfmcu_requantize_s8(int32_t acc, int32_t multiplier, int32_t shift, TfmcuOutQuant q) {
  int32_t v = arm_nn_requantize(acc, multiplier, shift) + q.offset;
  v = v < q.act_min ? q.act_min : v;
  return (int8_t)(v > q.act_max ? q.act_max : v);
}

/* Pixels of a channel pair whose accumulators wait for their requantization (on the stack: 2 x 4 bytes each). The
 * products of a block keep every register busy; the requantization runs afterwards, one channel at a time, with its
 * constants in registers. */
#define TFMCU_FOLDED_CHUNK 32

/* n accumulators of one channel (multiplier, shift), requantized to o, o + out_c, ... */
__STATIC_FORCEINLINE void tfmcu_folded_store(const int32_t* acc, int32_t n, int32_t multiplier, int32_t shift,
                                             TfmcuOutQuant q, int8_t* o, int32_t out_c) {
  if (tfmcu_short_quant_ok(multiplier, shift)) {
    const TfmcuShortQuant f = tfmcu_short_quant(multiplier, shift, q.offset);
    tfmcu_requantize_short_pixels(acc, f.multiplier, f.round, f.right, n, q.act_min, q.act_max, o, out_c);
  } else {
    for (int32_t i = 0; i < n; ++i, o += out_c) {
      *o = tfmcu_requantize_s8(acc[i], multiplier, shift, q);
    }
  }
}

/* Four input channels of two pixels (x, and `next` bytes past it) by two filter rows (w, and `next` bytes past it)
 * into the four accumulators; x and w step past them. */
__STATIC_FORCEINLINE void tfmcu_mac_2x2x4(const int8_t** x, const int8_t** w, int32_t next, int32_t* a00,
                                          int32_t* a01, int32_t* a10, int32_t* a11) {
  const int32_t wv = arm_nn_read_s8x4_ia(w);
  const int32_t xv = arm_nn_read_s8x4_ia(x);
  const int32_t we = SXTB16(wv), wo = SXTB16_RORn(wv, 8);
  const int32_t xe = SXTB16(xv), xo = SXTB16_RORn(xv, 8);
  *a00 = SMLAD(xo, wo, SMLAD(xe, we, *a00));
  const int32_t yv = arm_nn_read_s8x4(*x + next);
  const int32_t ye = SXTB16(yv), yo = SXTB16_RORn(yv, 8);
  *a10 = SMLAD(yo, wo, SMLAD(ye, we, *a10));
  const int32_t vv = arm_nn_read_s8x4(*w + next);
  const int32_t ve = SXTB16(vv), vo = SXTB16_RORn(vv, 8);
  *a01 = SMLAD(xo, vo, SMLAD(xe, ve, *a01));
  *a11 = SMLAD(yo, vo, SMLAD(ye, ve, *a11));
}

/* The odd last output channel `k` of every pixel. */
static void tfmcu_conv1x1_folded_channel(const TfmcuConvParams* p, TfmcuOutQuant q, const int8_t* in, int32_t rows,
                                         int32_t cols, int32_t out_c, int32_t k, int8_t* out) {
  const int8_t* w = p->filter + k * cols;
  const int32_t bias = p->bias != NULL ? p->bias[k] : 0;
  const int32_t multiplier = p->output_multiplier[k], shift = p->output_shift[k];
  for (int32_t r = 0; r < rows; ++r) {
    const int8_t* x = in + r * cols;
    int32_t acc = bias;
    int32_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      const int32_t wv = arm_nn_read_s8x4(w + c), xv = arm_nn_read_s8x4(x + c);
      acc = SMLAD(SXTB16_RORn(xv, 8), SXTB16_RORn(wv, 8), SMLAD(SXTB16(xv), SXTB16(wv), acc));
    }
    for (; c < cols; ++c) {
      acc += x[c] * w[c];
    }
    out[r * out_c + k] = tfmcu_requantize_s8(acc, multiplier, shift, q);
  }
}

/* Eight input channels (the expansion after a MobileNetV2 block of 8 channels): per chunk of up to
 * TFMCU_FOLDED_CHUNK pixels, the chunk's inputs unpacked once into int16 pairs (SXTB16 of each word, and of the word
 * rotated by 8: the filter rows are unpacked the same way, so the pairs match), then per output channel its eight
 * weights in four registers and per pixel four SMLADs (tfmcu_k8_dots), the channel's outputs of the chunk
 * requantized in one pass (tfmcu_folded_store). About 20 instructions per output where the 2x2 blocks take 36. Every
 * input pixel of a chunk is read before any output of it is written, and no input is read again: writes that
 * CMSIS-NN's order (every pass over the whole input) allows are allowed here (chunks start at even pixels, as its
 * pairs do). */
#define TFMCU_K8_ASM_DOT(acc)                              \
  "ldrd %[x0], %[x1], [%[xs]], #8\n\t"                   \
  "ldrd %[x2], %[x3], [%[xs]], #8\n\t"                   \
  "smlad %[a], %[x0], %[w0], %[b]\n\t"                   \
  "smlad %[a], %[x1], %[w1], %[a]\n\t"                   \
  "smlad %[a], %[x2], %[w2], %[a]\n\t"                   \
  "smlad %[a], %[x3], %[w3], %[a]\n\t"                   \
  "str %[a], [%[" acc "]], #4\n\t"

/* acc[i] = bias + the products of the unpacked pixel xs[4 i .. 4 i + 3] with w0..w3, for i < n (n >= 1). */
static inline void tfmcu_k8_dots(const uint32_t* xs, int32_t n, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3,
                                 int32_t bias, int32_t* acc) {
  uint32_t x0, x1, x2, x3;
  int32_t a;
  if (n & 1) {
    __asm__ volatile(TFMCU_K8_ASM_DOT("acc")
                     : [x0] "=&r"(x0), [x1] "=&r"(x1), [x2] "=&r"(x2), [x3] "=&r"(x3), [a] "=&r"(a), [xs] "+r"(xs),
                       [acc] "+r"(acc)
                     : [w0] "r"(w0), [w1] "r"(w1), [w2] "r"(w2), [w3] "r"(w3), [b] "r"(bias)
                     : "memory");
  }
  const int32_t* end = acc + (n & ~1);
  if (acc != end) {
    __asm__ volatile("1:\n\t" TFMCU_K8_ASM_DOT("acc") TFMCU_K8_ASM_DOT("acc")
                     "cmp %[acc], %[end]\n\t"
                     "bne 1b\n\t"
                     : [x0] "=&r"(x0), [x1] "=&r"(x1), [x2] "=&r"(x2), [x3] "=&r"(x3), [a] "=&r"(a), [xs] "+r"(xs),
                       [acc] "+r"(acc)
                     : [w0] "r"(w0), [w1] "r"(w1), [w2] "r"(w2), [w3] "r"(w3), [b] "r"(bias), [end] "r"(end)
                     : "cc", "memory");
  }
}

static void tfmcu_conv1x1_folded_k8(const TfmcuConvParams* p, TfmcuOutQuant q, const int8_t* in, int32_t rows,
                                    int32_t out_c, int8_t* out) {
  uint32_t xs[4 * TFMCU_FOLDED_CHUNK];
  int32_t acc[TFMCU_FOLDED_CHUNK];
  for (int32_t r0 = 0; r0 < rows; r0 += TFMCU_FOLDED_CHUNK) {
    const int32_t n = rows - r0 < TFMCU_FOLDED_CHUNK ? rows - r0 : TFMCU_FOLDED_CHUNK;
    const int8_t* x = in + r0 * 8;
    for (int32_t i = 0; i < n; ++i, x += 8) {
      const int32_t v0 = arm_nn_read_s8x4(x), v1 = arm_nn_read_s8x4(x + 4);
      xs[4 * i] = (uint32_t)SXTB16(v0);
      xs[4 * i + 1] = (uint32_t)SXTB16_RORn(v0, 8);
      xs[4 * i + 2] = (uint32_t)SXTB16(v1);
      xs[4 * i + 3] = (uint32_t)SXTB16_RORn(v1, 8);
    }
    const int8_t* w = p->filter;
    int8_t* o = out + r0 * out_c;
    for (int32_t k = 0; k < out_c; ++k, w += 8) {
      const int32_t v0 = arm_nn_read_s8x4(w), v1 = arm_nn_read_s8x4(w + 4);
      tfmcu_k8_dots(xs, n, (uint32_t)SXTB16(v0), (uint32_t)SXTB16_RORn(v0, 8), (uint32_t)SXTB16(v1),
                    (uint32_t)SXTB16_RORn(v1, 8), p->bias != NULL ? p->bias[k] : 0, acc);
      tfmcu_folded_store(acc, n, p->output_multiplier[k], p->output_shift[k], q, o + k, out_c);
    }
  }
}

/* A 1x1 convolution with unit stride whose input offset the packer folded into its bias (bias + input offset x the
 * filter row's sum, input_offset 0: tfmcu/kernels/ops.py): the matrix product of `rows` input pixels (each `cols`
 * int8) by `out_c` filter rows, requantized per output channel. CMSIS-NN's arm_nn_mat_mult_nt_t_s8 sums every
 * filter row for the input offset on each call (about 3 instructions per weight and 50 per output channel), which
 * a patch stage repeats for every patch and, on a box narrower than its tensor, every row; here the sums are in the
 * bias, made once offline. Its loops are CMSIS-NN's in shape (16 input channels per step, then at most three steps
 * of 4, then one at a time), with the four accumulators of a block of two pixels by two channels; per block it runs
 * a few instructions more than CMSIS-NN's product (QEMU counts, arm-none-eabi-gcc -O2, on the Cortex-M7), so it
 * runs the calls TFMCU_CONV1X1_FOLDED chooses, where the sums cost more than that; the others go to CMSIS-NN (whose
 * sums then add 0). The same integer arithmetic and requantization (bit-exact), and the same order of reads and
 * writes as CMSIS-NN's DSP product (per pair of output channels every input pixel, in pairs of pixels; then an odd
 * last channel), so the in-place distances of CMSIS-NN's 1x1 path hold; over 8 input channels
 * (tfmcu_conv1x1_folded_k8) each chunk of pixels is read once before its outputs are written: those distances hold
 * there too. */
void tfmcu_conv1x1_folded_s8(const TfmcuConvParams* p, const int8_t* in, int32_t rows, int32_t cols, int32_t out_c,
                             int8_t* out) {
  const TfmcuOutQuant q = {p->output_offset, p->act_min, p->act_max};
  if (cols == 8) {
    tfmcu_conv1x1_folded_k8(p, q, in, rows, out_c, out);
    return;
  }
  const int8_t* filter = p->filter;
  const int32_t* bias = p->bias;
  const int32_t n4 = (cols & 15) >> 2; /* steps of 4 input channels after those of 16 */
  const int short_cols = cols >= 4 && cols <= 32 && (cols & 3) == 0;
  int32_t k = 0;
  for (; k + 2 <= out_c; k += 2) {
    const int8_t* w0 = filter + k * cols;
    const int32_t b0 = bias != NULL ? bias[k] : 0;
    const int32_t b1 = bias != NULL ? bias[k + 1] : 0;
    const int32_t m0 = p->output_multiplier[k], s0 = p->output_shift[k];
    const int32_t m1 = p->output_multiplier[k + 1], s1 = p->output_shift[k + 1];
    const int8_t* x = in;
    int8_t* o = out + k;
    int32_t r = 0;
    while (r + 2 <= rows) {
      int32_t acc0[TFMCU_FOLDED_CHUNK], acc1[TFMCU_FOLDED_CHUNK];
      int32_t n = 0;
      for (; r + 2 <= rows && n < TFMCU_FOLDED_CHUNK; r += 2, n += 2) {
        /* two pixels x two channels: x and w step along the first pixel and channel, the second of each is `next`
         * bytes past them; 16 input channels per step, then 4, then one */
        const int8_t* w = w0;
        const int32_t next = cols - 4;
        int32_t a00 = b0, a01 = b1, a10 = b0, a11 = b1;
        if (short_cols) { /* 4 to 32 input channels, a multiple of 4: the steps straight, no loop */
          switch (cols >> 2) {
            case 8:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 7:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 6:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 5:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 4:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 3:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            case 2:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
              /* fall through */
            default:
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
          }
          acc0[n] = a00;
          acc0[n + 1] = a10;
          acc1[n] = a01;
          acc1[n + 1] = a11;
          x += cols; /* past the second pixel */
          continue;
        }
        int32_t c = 0;
        for (; c <= cols - 16; c += 16) {
          tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
          tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
          tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
          tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
        }
        /* then 4 at a time (at most three steps: no loop to set up) */
        if (n4 > 0) {
          tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
          if (n4 > 1) {
            tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
            if (n4 > 2) {
              tfmcu_mac_2x2x4(&x, &w, next, &a00, &a01, &a10, &a11);
            }
          }
        }
        for (c += 4 * n4; c < cols; ++c, ++x, ++w) {
          a00 += x[0] * w[0];
          a01 += x[0] * w[cols];
          a10 += x[cols] * w[0];
          a11 += x[cols] * w[cols];
        }
        acc0[n] = a00;
        acc0[n + 1] = a10;
        acc1[n] = a01;
        acc1[n + 1] = a11;
        x += cols; /* past the second pixel */
      }
      tfmcu_folded_store(acc0, n, m0, s0, q, o, out_c);
      tfmcu_folded_store(acc1, n, m1, s1, q, o + 1, out_c);
      o += n * out_c;
    }
    if (r < rows) { /* the odd last pixel (x, o point at it), both channels */
      const int8_t* w = w0;
      int32_t a0 = b0, a1 = b1;
      int32_t c = 0;
      for (; c + 4 <= cols; c += 4) {
        const int32_t xv = arm_nn_read_s8x4_ia(&x);
        const int32_t wv = arm_nn_read_s8x4(w + cols);
        const int32_t vv = arm_nn_read_s8x4_ia(&w);
        const int32_t xe = SXTB16(xv), xo = SXTB16_RORn(xv, 8);
        a0 = SMLAD(xo, SXTB16_RORn(vv, 8), SMLAD(xe, SXTB16(vv), a0));
        a1 = SMLAD(xo, SXTB16_RORn(wv, 8), SMLAD(xe, SXTB16(wv), a1));
      }
      for (; c < cols; ++c, ++x, ++w) {
        a0 += x[0] * w[0];
        a1 += x[0] * w[cols];
      }
      o[0] = tfmcu_requantize_s8(a0, m0, s0, q);
      o[1] = tfmcu_requantize_s8(a1, m1, s1, q);
    }
  }
  if (k < out_c) {
    tfmcu_conv1x1_folded_channel(p, q, in, rows, cols, out_c, k, out);
  }
}
#endif
