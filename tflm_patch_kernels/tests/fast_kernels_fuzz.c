/* Differential fuzz of the fast paths against the plain kernels they replace, on one deterministic stream of random
 * parameters (the same cases on the host, tests/fast_kernels_test.c, and on every Cortex-M core, firmware/
 * fast_kernels_fuzz.c, where the DSP instructions run):
 * - tfmcu_requantize_short with an output offset (every channel tfmcu_short_quant_ok accepts) against
 *   tfmcu_multiply_by_quantized_multiplier (TFLite's double rounding): accumulators of every magnitude and sign,
 *   multipliers at and around 2^30 and 2^31 - 1, shifts from -31 to +8;
 * - tfmcu_depthwise_conv3x3_s8 against tfmcu_depthwise_conv2d_s8 (bit-exact with TFLite's reference kernel, tests/
 *   test_patch_kernels.py): 1-21 channels (the groups of four and the tails), 1-10 rows and columns, strides 1-3,
 *   border padding 0-2 on each side (windows cut by the box, and windows with no input), input and output offsets at
 *   the ends of their ranges, activation ranges, per-channel multipliers and shifts mixing channels the fast
 *   requantization takes with those it does not, no bias, and boxes inside larger poisoned buffers (nothing outside
 *   the output box written);
 * - tfmcu_conv2d_shallow_s8 against tfmcu_conv2d_s8 likewise: kernels 1x1 to 5x5 of 1-4 input channels (windows of
 *   at most TFMCU_CONV2D_SHALLOW_MAX_DEPTH values), 1-17 output channels and up to TFMCU_CONV2D_SHALLOW_MAX_OUT,
 *   paddings up to the kernel's size - 1, input offsets across [-127, 128];
 * - tfmcu_quantize_f32_s8 (float32 to int8; on cores with an FPU and the DSP extension its Thumb-2 rows) against
 *   TFLite's formula clamp(round(x / scale) + zero_point) computed here in double: ties, values next to them, any
 *   float bit pattern (NaN, infinities, subnormals, values past the int32 range), scales and zero points. */
#include "tflm_patch_kernels/tests/fast_kernels_fuzz.h"

#include <string.h>

#include "conv2d.h"
#include "depthwise_conv2d.h"
#include "quantize.h"

#define FUZZ_MAX_C 21
#define FUZZ_MAX_HW 10
#define FUZZ_BUFFER ((FUZZ_MAX_HW + 2) * ((FUZZ_MAX_HW + 2) * FUZZ_MAX_C + 8) + 64) /* output: up to 2 more rows and columns */
/* a shallow convolution's output: kernels up to 5 with paddings up to 4 give at most 4 more rows and columns */
#define FUZZ_CONV_OUT ((FUZZ_MAX_HW + 4) * ((FUZZ_MAX_HW + 4) * TFMCU_CONV2D_SHALLOW_MAX_OUT + 8) + 64)
#define FUZZ_OUT (FUZZ_CONV_OUT > FUZZ_BUFFER ? FUZZ_CONV_OUT : FUZZ_BUFFER)
#define POISON 0x5A

/* the cases' buffers (one set: the firmware's SRAM is small) */
static int8_t g_input[FUZZ_BUFFER], g_want[FUZZ_OUT], g_got[FUZZ_OUT];

typedef struct {
  uint32_t s;
} Rng;

static uint32_t next_u32(Rng* r) { /* xorshift32 */
  uint32_t x = r->s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  r->s = x;
  return x;
}

static int32_t uniform(Rng* r, int32_t lo, int32_t hi) { /* [lo, hi] */
  return lo + (int32_t)(next_u32(r) % (uint32_t)(hi - lo + 1));
}

static int32_t pick(Rng* r, const int32_t* values, int32_t n) { return values[next_u32(r) % (uint32_t)n]; }

static int32_t random_multiplier(Rng* r) {
  static const int32_t kEdges[6] = {1 << 30, (1 << 30) + 1, INT32_MAX, INT32_MAX - 1, 0, 1518500250};
  return next_u32(r) % 4 == 0 ? pick(r, kEdges, 6) : (int32_t)((1u << 30) + next_u32(r) % (1u << 30));
}

static int32_t random_shift(Rng* r) {
  const uint32_t k = next_u32(r) % 8;
  return k == 0 ? uniform(r, -31, 8) : (k == 1 ? uniform(r, -1, 0) : uniform(r, -14, -2));
}

static int32_t random_accumulator(Rng* r) {
  static const int32_t kEdges[8] = {0, 1, -1, INT32_MIN, INT32_MAX, INT32_MIN + 1, 1 << 20, -(1 << 20)};
  switch (next_u32(r) % 4) {
    case 0:
      return pick(r, kEdges, 8);
    case 1:
      return (int32_t)next_u32(r);
    case 2:
      return uniform(r, -(1 << 22), 1 << 22);
    default:
      return uniform(r, -4096, 4096);
  }
}

static int32_t fuzz_requantize(Rng* r, int32_t n, TfmcuFuzzLog log) {
  int32_t failures = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t x = random_accumulator(r), m = random_multiplier(r), s = random_shift(r);
    const int32_t want = tfmcu_multiply_by_quantized_multiplier(x, m, s);
    const int32_t offset = uniform(r, -128, 127);
    if (tfmcu_short_quant_ok(m, s) &&
        tfmcu_requantize_short(x, tfmcu_short_quant(m, s, offset)) != tfmcu_wrap_add(want, offset)) {
      if (failures++ == 0) {
        log("tfmcu_requantize_short differs from tfmcu_multiply_by_quantized_multiplier + offset");
      }
    }
  }
  return failures;
}

/* Per channel a random bias (now and then any int32), multiplier and shift; `model_like`: every channel's as TFLite's
 * converter gives a trained layer (a multiplier above 2^30, a right shift of 2 to 14: the kernels' short paths). */
static void random_channels(Rng* r, int32_t n, int32_t* bias, int32_t* multiplier, int32_t* shift, int model_like) {
  for (int32_t k = 0; k < n; ++k) {
    bias[k] = next_u32(r) % 16 == 0 ? (int32_t)next_u32(r) : uniform(r, -(1 << 18), 1 << 18);
    multiplier[k] = model_like ? (int32_t)((1u << 30) + 1u + next_u32(r) % ((1u << 30) - 1u)) : random_multiplier(r);
    shift[k] = model_like ? uniform(r, -14, -2) : random_shift(r);
  }
}

/* A random output offset and activation range (the whole int8 range half of the time at each end). */
static void random_output(Rng* r, int32_t* offset, int32_t* act_min, int32_t* act_max) {
  *offset = uniform(r, -128, 127);
  *act_min = next_u32(r) % 2 ? -128 : uniform(r, -128, 0);
  *act_max = next_u32(r) % 2 ? 127 : uniform(r, *act_min, 127);
}

/* 1 (logged as `what`) unless both kernels succeeded with the same bytes in their poisoned output buffers. */
static int32_t differ(TfmcuStatus s_want, TfmcuStatus s_got, int32_t out_bytes, const char* what, TfmcuFuzzLog log) {
  if (s_want != kTfmcuOk || s_got != kTfmcuOk || memcmp(g_want, g_got, (size_t)out_bytes) != 0) {
    log(what);
    return 1;
  }
  return 0;
}

/* The output buffers poisoned over out_bytes (nothing outside the output box may be written). */
static void poison(int32_t out_bytes) {
  memset(g_want, POISON, (size_t)out_bytes);
  memset(g_got, POISON, (size_t)out_bytes);
}

/* One random depthwise layer through both kernels. */
static int32_t fuzz_depthwise3x3_case(Rng* r, TfmcuFuzzLog log) {
  static int8_t filter[9 * FUZZ_MAX_C];
  int8_t* input = g_input;
  static int32_t bias[FUZZ_MAX_C], multiplier[FUZZ_MAX_C], shift[FUZZ_MAX_C];
  static const int32_t kInputOffsets[6] = {-255, 255, 128, -127, 0, 1};
  const int model_like = (int)(next_u32(r) % 2); /* channels in fours, every one short: the inner pixels' path */
  const int32_t c = model_like ? 4 * uniform(r, 1, FUZZ_MAX_C / 4) : uniform(r, 1, FUZZ_MAX_C);
  const int32_t in_h = uniform(r, 1, FUZZ_MAX_HW), in_w = uniform(r, 1, FUZZ_MAX_HW);
  const int32_t stride_h = uniform(r, 1, 3), stride_w = uniform(r, 1, 3);
  const int32_t pad_top = uniform(r, 0, 2), pad_left = uniform(r, 0, 2);
  const int32_t pad_bottom = uniform(r, 0, 2), pad_right = uniform(r, 0, 2);
  const int32_t out_h = (in_h + pad_top + pad_bottom - 3) / stride_h + 1;
  const int32_t out_w = (in_w + pad_left + pad_right - 3) / stride_w + 1;
  if (in_h + pad_top + pad_bottom < 3 || in_w + pad_left + pad_right < 3) {
    return 0;
  }
  const int32_t in_stride = in_w * c + uniform(r, 0, 1) * uniform(r, 1, 7);
  const int32_t out_stride = out_w * c + uniform(r, 0, 1) * uniform(r, 1, 7);
  for (int32_t i = 0; i < in_h * in_stride; ++i) {
    input[i] = (int8_t)next_u32(r);
  }
  for (int32_t i = 0; i < 9 * c; ++i) {
    filter[i] = (int8_t)next_u32(r);
  }
  random_channels(r, c, bias, multiplier, shift, model_like);
  TfmcuDepthwiseConvParams p;
  memset(&p, 0, sizeof(p));
  p.filter = filter;
  p.bias = next_u32(r) % 8 == 0 ? NULL : bias;
  p.output_multiplier = multiplier;
  p.output_shift = shift;
  p.kernel_h = 3;
  p.kernel_w = 3;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.dilation_h = 1;
  p.dilation_w = 1;
  p.depth_multiplier = 1;
  p.input_offset = next_u32(r) % 2 ? pick(r, kInputOffsets, 6) : uniform(r, -127, 128);
  random_output(r, &p.output_offset, &p.act_min, &p.act_max);
  const int32_t out_bytes = out_h * out_stride + 16;
  poison(out_bytes);
  const TfmcuConstView in = {input, in_h, in_w, c, in_stride};
  const TfmcuView out_want = {g_want, out_h, out_w, c, out_stride};
  const TfmcuView out_got = {g_got, out_h, out_w, c, out_stride};
  return differ(tfmcu_depthwise_conv2d_s8(&p, &in, pad_top, pad_left, &out_want),
                tfmcu_depthwise_conv3x3_s8(&p, &in, pad_top, pad_left, &out_got), out_bytes,
                "tfmcu_depthwise_conv3x3_s8 differs from tfmcu_depthwise_conv2d_s8", log);
}

/* One random shallow convolution through both kernels. */
static int32_t fuzz_conv_shallow_case(Rng* r, TfmcuFuzzLog log) {
  static int8_t filter[TFMCU_CONV2D_SHALLOW_MAX_OUT * TFMCU_CONV2D_SHALLOW_MAX_DEPTH];
  int8_t* input = g_input;
  static int32_t bias[TFMCU_CONV2D_SHALLOW_MAX_OUT], multiplier[TFMCU_CONV2D_SHALLOW_MAX_OUT];
  static int32_t shift[TFMCU_CONV2D_SHALLOW_MAX_OUT];
  static const int32_t kInputOffsets[4] = {-127, 128, 0, 1};
  const int32_t kh = uniform(r, 1, 5), kw = uniform(r, 1, 5);
  const int32_t c = uniform(r, 1, 4);
  if (kh * kw * c > TFMCU_CONV2D_SHALLOW_MAX_DEPTH) {
    return 0;
  }
  const int32_t k_out = next_u32(r) % 4 == 0 ? uniform(r, 1, TFMCU_CONV2D_SHALLOW_MAX_OUT) : uniform(r, 1, 17);
  const int32_t in_h = uniform(r, 1, FUZZ_MAX_HW), in_w = uniform(r, 1, FUZZ_MAX_HW);
  const int32_t stride_h = uniform(r, 1, 3), stride_w = uniform(r, 1, 3);
  const int32_t pad_top = uniform(r, 0, kh - 1), pad_left = uniform(r, 0, kw - 1);
  const int32_t pad_bottom = uniform(r, 0, kh - 1), pad_right = uniform(r, 0, kw - 1);
  if (in_h + pad_top + pad_bottom < kh || in_w + pad_left + pad_right < kw) {
    return 0;
  }
  const int32_t out_h = (in_h + pad_top + pad_bottom - kh) / stride_h + 1;
  const int32_t out_w = (in_w + pad_left + pad_right - kw) / stride_w + 1;
  const int32_t in_stride = in_w * c + uniform(r, 0, 1) * uniform(r, 1, 7);
  const int32_t out_stride = out_w * k_out + uniform(r, 0, 1) * uniform(r, 1, 7);
  for (int32_t i = 0; i < in_h * in_stride; ++i) {
    input[i] = (int8_t)next_u32(r);
  }
  for (int32_t i = 0; i < k_out * kh * kw * c; ++i) {
    filter[i] = (int8_t)next_u32(r);
  }
  random_channels(r, k_out, bias, multiplier, shift, (int)(next_u32(r) % 2));
  TfmcuConvParams p;
  memset(&p, 0, sizeof(p));
  p.filter = filter;
  p.bias = next_u32(r) % 8 == 0 ? NULL : bias;
  p.output_multiplier = multiplier;
  p.output_shift = shift;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.dilation_h = 1;
  p.dilation_w = 1;
  p.groups = 1;
  p.input_offset = next_u32(r) % 2 ? pick(r, kInputOffsets, 4) : uniform(r, -127, 128);
  random_output(r, &p.output_offset, &p.act_min, &p.act_max);
  const int32_t out_bytes = out_h * out_stride + 16;
  poison(out_bytes);
  const TfmcuConstView in = {input, in_h, in_w, c, in_stride};
  const TfmcuView out_want = {g_want, out_h, out_w, k_out, out_stride};
  const TfmcuView out_got = {g_got, out_h, out_w, k_out, out_stride};
  return differ(tfmcu_conv2d_s8(&p, &in, pad_top, pad_left, &out_want),
                tfmcu_conv2d_shallow_s8(&p, &in, pad_top, pad_left, &out_got), out_bytes,
                "tfmcu_conv2d_shallow_s8 differs from tfmcu_conv2d_s8", log);
}

/* TFLite's AffineQuantize of one value: round half away from zero of the float quotient (in double here: a + 0.5 is
 * exact for a float a), a NaN to the zero point and values past +-1024 saturated (as the kernel documents). */
static int8_t quantize_reference(float x, float scale, int32_t zero_point) {
  const float v = x / scale;
  if (v != v) {
    return (int8_t)zero_point;
  }
  const double d = v > 1024.0f ? 1024.0 : (v < -1024.0f ? -1024.0 : (double)v);
  const double a = d < 0.0 ? -d : d;
  const int32_t t = (int32_t)(a + 0.5);
  const int32_t q = (d < 0.0 ? -t : t) + zero_point;
  return (int8_t)(q < -128 ? -128 : (q > 127 ? 127 : q));
}

static float float_of_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* One random QUANTIZE box (1-2 rows of 1-37 values, rows apart in the input) through the kernel. */
static int32_t fuzz_quantize_case(Rng* r, TfmcuFuzzLog log) {
  static float x[2 * 40];
  static const float kScales[4] = {1.0f / 255.0f, 1.0f / 128.0f, 0.0078125f, 2.0f};
  const float scale = next_u32(r) % 2 ? kScales[next_u32(r) % 4]
                                      : float_of_bits(0x38D1B717u + next_u32(r) % 0x07000000u); /* 1e-4 .. 10 */
  const int32_t zero_point = uniform(r, -128, 127);
  const int32_t h = uniform(r, 1, 2), w = uniform(r, 1, 37), stride = 40;
  for (int32_t i = 0; i < 2 * stride; ++i) {
    const int32_t k = uniform(r, -300, 300);
    switch (next_u32(r) % 5) {
      case 0: /* a tie of the quotient, or as close as the float division gets */
        x[i] = ((float)k + 0.5f) * scale;
        break;
      case 1: { /* a float up to two steps from it */
        uint32_t b;
        const float t = ((float)k + 0.5f) * scale;
        memcpy(&b, &t, 4);
        x[i] = float_of_bits(b + (uint32_t)uniform(r, -2, 2));
        break;
      }
      case 2: /* any bit pattern: NaN, infinities, subnormals, huge values */
        x[i] = float_of_bits(next_u32(r));
        break;
      default:
        x[i] = (float)uniform(r, -40000, 40000) / 100.0f * scale;
    }
  }
  const int32_t out_stride = w + uniform(r, 0, 5);
  const int32_t out_bytes = h * out_stride + 16;
  poison(out_bytes);
  for (int32_t y = 0; y < h; ++y) {
    for (int32_t i = 0; i < w; ++i) {
      g_want[y * out_stride + i] = quantize_reference(x[y * stride + i], scale, zero_point);
    }
  }
  const TfmcuQuantizeParams p = {scale, zero_point};
  const TfmcuConstViewF32 in = {x, h, w, 1, stride};
  const TfmcuView out = {g_got, h, w, 1, out_stride};
  return differ(kTfmcuOk, tfmcu_quantize_f32_s8(&p, &in, &out), out_bytes,
                "tfmcu_quantize_f32_s8 differs from TFLite's formula", log);
}

int32_t tfmcu_fuzz_fast_kernels(uint32_t seed, int32_t layer_cases, int32_t requantize_cases, TfmcuFuzzLog log) {
  Rng r = {seed != 0 ? seed : 1u};
  int32_t failures = fuzz_requantize(&r, requantize_cases, log);
  for (int32_t i = 0; i < layer_cases; ++i) {
    failures += fuzz_depthwise3x3_case(&r, log);
    failures += fuzz_conv_shallow_case(&r, log);
    failures += fuzz_quantize_case(&r, log);
  }
  return failures;
}
