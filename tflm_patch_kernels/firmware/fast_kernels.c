/* The fast paths on the target (//tflm_patch_kernels/firmware:fast_kernels_<core>):
 * 1. the differential fuzz of the host test (tests/fast_kernels_fuzz.c, the same seed), here with the core's DSP
 *    instructions: any difference fails;
 * 2. per depthwise 3x3 shape of the MobileNetV2 family, CMSIS-NN's arm_depthwise_conv_wrapper_s8 and
 *    tfmcu_depthwise_conv3x3_s8 on the same random layer, each in its own cost region (the QEMU plugin counts their
 *    instructions: the run's "regions"); their outputs must be equal (FNV-1a of each);
 * 3. on DSP cores without Helium, CMSIS-NN's 1x1 product (arm_nn_mat_mult_nt_t_s8) against the backend's folded
 *    product (tfmcu_conv1x1_folded_s8) on the 1x1 shapes of MobileNetV2-0.35, and CMSIS-NN's arm_convolve_wrapper_s8
 *    against tfmcu_conv2d_shallow_s8 on first layers (3x3 over RGB, stride 2), likewise. */
#include <string.h>

#include "arm_nnfunctions.h"
#include "arm_nnsupportfunctions.h"
#include "cmsis_nn/cmsis_nn_backend.h"
#include "conv2d.h"
#include "depthwise_conv2d.h"
#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/tests/fast_kernels_fuzz.h"

#define MAX_IN (48 * 48 * 16)
#define MAX_OUT (48 * 48 * 16)
#define MAX_C 96

static int8_t g_in[MAX_IN];
static int8_t g_out[MAX_OUT];
static int8_t g_cmsis_buffer[16384] __attribute__((aligned(4)));
static int8_t g_filter[9 * MAX_C];
static int32_t g_bias[MAX_C], g_mult[MAX_C], g_shift[MAX_C];

typedef struct {
  const char* cmsis;  /* region names */
  const char* tfmcu;
  int32_t h, w, c, stride;
} Shape;

static uint32_t g_rng = 12345u;
static uint32_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 17;
  g_rng ^= g_rng << 5;
  return g_rng;
}

static void log_line(const char* what) { tfmcu_fail(what); }

/* n random int8 values into v. */
static void random_bytes(int8_t* v, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    v[i] = (int8_t)rnd();
  }
}

/* A random layer's channels: bias, multiplier (> 2^30) and shift (-7 to -10). */
static void random_channels(int32_t n) {
  for (int32_t k = 0; k < n; ++k) {
    g_bias[k] = (int32_t)(rnd() % 2000) - 1000;
    g_mult[k] = (int32_t)((1u << 30) + rnd() % (1u << 30));
    g_shift[k] = -(int32_t)(rnd() % 4) - 7;
  }
}

/* 1 (the failure `what` reported) unless both functions succeeded and ours wrote CMSIS-NN's output (FNV-1a
 * `want`) into g_out. */
static int32_t differ(int cmsis_ok, TfmcuStatus ours, size_t out_bytes, uint32_t want, const char* what) {
  if (!cmsis_ok || ours != kTfmcuOk || tfmcu_fnv1a32(g_out, out_bytes) != want) {
    tfmcu_fail(what);
    return 1;
  }
  return 0;
}

static int32_t compare(const Shape* s) {
  const int32_t out_h = (s->h - 1) / s->stride + 1, out_w = (s->w - 1) / s->stride + 1;
  random_bytes(g_in, s->h * s->w * s->c);
  random_bytes(g_filter, 9 * s->c);
  random_channels(s->c);
  const int32_t pad = 1 - (s->stride == 2 && s->h % 2 == 0);  /* SAME: stride 2 on an even size pads 0 above */
  TfmcuDepthwiseConvParams p;
  memset(&p, 0, sizeof(p));
  p.filter = g_filter;
  p.bias = g_bias;
  p.output_multiplier = g_mult;
  p.output_shift = g_shift;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = s->stride;
  p.dilation_h = p.dilation_w = 1;
  p.depth_multiplier = 1;
  p.input_offset = 128;
  p.output_offset = -5;
  p.act_min = -128;
  p.act_max = 127;
  cmsis_nn_dw_conv_params c;
  c.input_offset = p.input_offset;
  c.output_offset = p.output_offset;
  c.ch_mult = 1;
  c.stride.w = c.stride.h = s->stride;
  c.padding.w = c.padding.h = pad;
  c.dilation.w = c.dilation.h = 1;
  c.activation.min = -128;
  c.activation.max = 127;
  cmsis_nn_per_channel_quant_params q = {g_mult, g_shift};
  const cmsis_nn_dims in_dims = {1, s->h, s->w, s->c}, filter_dims = {1, 3, 3, s->c}, bias_dims = {1, 1, 1, s->c};
  const cmsis_nn_dims out_dims = {1, out_h, out_w, s->c};
  const int32_t need = arm_depthwise_conv_wrapper_s8_get_buffer_size(&c, &in_dims, &filter_dims, &out_dims);
  cmsis_nn_context ctx = {g_cmsis_buffer, need};
  if (need > (int32_t)sizeof(g_cmsis_buffer)) {
    tfmcu_fail("CMSIS-NN buffer");
    return 1;
  }
  tfmcu_region_begin(s->cmsis);
  const arm_cmsis_nn_status st = arm_depthwise_conv_wrapper_s8(&ctx, &c, &q, &in_dims, g_in, &filter_dims, g_filter,
                                                               &bias_dims, g_bias, &out_dims, g_out);
  tfmcu_region_end();
  const size_t out_bytes = (size_t)(out_h * out_w * s->c);
  const uint32_t want = tfmcu_fnv1a32(g_out, out_bytes);
  memset(g_out, 0, out_bytes);
  const TfmcuConstView in = {g_in, s->h, s->w, s->c, s->w * s->c};
  const TfmcuView out = {g_out, out_h, out_w, s->c, out_w * s->c};
  tfmcu_region_begin(s->tfmcu);
  const TfmcuStatus ts = tfmcu_depthwise_conv3x3_s8(&p, &in, pad, pad, &out);
  tfmcu_region_end();
  return differ(st == ARM_CMSIS_NN_SUCCESS, ts, out_bytes, want, s->tfmcu);
}

#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI) /* (our conv and folded product: DSP builds without Helium) */
/* The first layer of an image network (3x3 over `c` channels, stride 2, SAME): CMSIS-NN's arm_convolve_wrapper_s8
 * against tfmcu_conv2d_shallow_s8. */
typedef struct {
  const char* cmsis;
  const char* tfmcu;
  int32_t h, w, c, k;
} ConvShape;

static int32_t compare_conv(const ConvShape* s) {
  const int32_t out_h = (s->h + 1) / 2, out_w = (s->w + 1) / 2;
  random_bytes(g_in, s->h * s->w * s->c);
  static int8_t filter[64 * 27];
  random_bytes(filter, s->k * 9 * s->c);
  random_channels(s->k);
  TfmcuConvParams p;
  memset(&p, 0, sizeof(p));
  p.filter = filter;
  p.bias = g_bias;
  p.output_multiplier = g_mult;
  p.output_shift = g_shift;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.dilation_h = p.dilation_w = 1;
  p.groups = 1;
  p.input_offset = 1;
  p.output_offset = -128;
  p.act_min = -128;
  p.act_max = 127;
  const int32_t pad = s->h % 2; /* SAME, stride 2: an even size pads below only */
  cmsis_nn_conv_params c;
  c.input_offset = p.input_offset;
  c.output_offset = p.output_offset;
  c.stride.w = c.stride.h = 2;
  c.padding.w = c.padding.h = pad;
  c.dilation.w = c.dilation.h = 1;
  c.activation.min = -128;
  c.activation.max = 127;
  cmsis_nn_per_channel_quant_params q = {g_mult, g_shift};
  const cmsis_nn_dims in_dims = {1, s->h, s->w, s->c}, filter_dims = {s->k, 3, 3, s->c};
  const cmsis_nn_dims bias_dims = {1, 1, 1, s->k}, out_dims = {1, out_h, out_w, s->k};
  const int32_t need = arm_convolve_wrapper_s8_get_buffer_size(&c, &in_dims, &filter_dims, &out_dims);
  cmsis_nn_context ctx = {g_cmsis_buffer, need};
  if (need > (int32_t)sizeof(g_cmsis_buffer)) {
    tfmcu_fail("CMSIS-NN buffer");
    return 1;
  }
  tfmcu_region_begin(s->cmsis);
  const arm_cmsis_nn_status st = arm_convolve_wrapper_s8(&ctx, &c, &q, &in_dims, g_in, &filter_dims, filter,
                                                         &bias_dims, g_bias, &out_dims, g_out);
  tfmcu_region_end();
  const size_t out_bytes = (size_t)(out_h * out_w * s->k);
  const uint32_t want = tfmcu_fnv1a32(g_out, out_bytes);
  memset(g_out, 0, out_bytes);
  const TfmcuConstView in = {g_in, s->h, s->w, s->c, s->w * s->c};
  const TfmcuView out = {g_out, out_h, out_w, s->k, out_w * s->k};
  tfmcu_region_begin(s->tfmcu);
  const TfmcuStatus ts = tfmcu_conv2d_shallow_s8(&p, &in, pad, pad, &out);
  tfmcu_region_end();
  return differ(st == ARM_CMSIS_NN_SUCCESS, ts, out_bytes, want, s->tfmcu);
}

/* A 1x1 convolution of `pixels` pixels, k input and n output channels, input offset 0 (folded): CMSIS-NN's product
 * (arm_nn_mat_mult_nt_t_s8, what arm_convolve_1x1_s8_fast runs) against ours (tfmcu_conv1x1_folded_s8). */
typedef struct {
  const char* cmsis;
  const char* tfmcu;
  int32_t pixels, k, n;
} MatShape;

static int32_t compare_1x1(const MatShape* s) {
  random_bytes(g_in, s->pixels * s->k);
  static int8_t filter[320 * 64];
  random_bytes(filter, s->k * s->n);
  for (int32_t j = 0; j < s->n; ++j) { /* (one channel in eight with a multiplier or shift the short path refuses) */
    const int odd = rnd() % 8 == 0;
    g_bias[j] = (int32_t)(rnd() % 2000) - 1000;
    g_mult[j] = odd && rnd() % 2 ? (1 << 30) : (int32_t)((1u << 30) + rnd() % (1u << 30));
    g_shift[j] = odd ? 1 - (int32_t)(rnd() % 3) : -(int32_t)(rnd() % 4) - 7;
  }
  TfmcuConvParams p;
  memset(&p, 0, sizeof(p));
  p.filter = filter;
  p.bias = g_bias;
  p.output_multiplier = g_mult;
  p.output_shift = g_shift;
  p.output_offset = 3;
  p.act_min = -128;
  p.act_max = 127;
  const size_t out_bytes = (size_t)(s->pixels * s->n);
  tfmcu_region_begin(s->cmsis);
  const arm_cmsis_nn_status st = arm_nn_mat_mult_nt_t_s8(g_in, filter, g_bias, g_out, g_mult, g_shift, s->pixels,
                                                         s->n, s->k, 0, 3, -128, 127, s->n, s->k);
  tfmcu_region_end();
  const uint32_t want = tfmcu_fnv1a32(g_out, out_bytes);
  memset(g_out, 0, out_bytes);
  tfmcu_region_begin(s->tfmcu);
  tfmcu_conv1x1_folded_s8(&p, g_in, s->pixels, s->k, s->n, g_out);
  tfmcu_region_end();
  return differ(st == ARM_CMSIS_NN_SUCCESS, kTfmcuOk, out_bytes, want, s->tfmcu);
}
#endif

int main(void) {
  tfmcu_result_begin("fast_kernels");
  const int32_t fuzz = tfmcu_fuzz_fast_kernels(20261129u, 1500, 200000, log_line);
  static const Shape kShapes[] = {
      {"cmsis_48x48x16_s1", "tfmcu_48x48x16_s1", 48, 48, 16, 1},
      {"cmsis_48x48x16_s2", "tfmcu_48x48x16_s2", 48, 48, 16, 2},
      {"cmsis_24x24x48_s1", "tfmcu_24x24x48_s1", 24, 24, 48, 1},
      {"cmsis_24x24x48_s2", "tfmcu_24x24x48_s2", 24, 24, 48, 2},
      {"cmsis_12x12x96_s1", "tfmcu_12x12x96_s1", 12, 12, 96, 1},
      {"cmsis_6x6x8_s1", "tfmcu_6x6x8_s1", 6, 6, 8, 1},
  };
  int32_t mismatches = 0;
  for (uint32_t i = 0; i < sizeof(kShapes) / sizeof(kShapes[0]); ++i) {
    mismatches += compare(&kShapes[i]);
  }
#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
  static const MatShape kMats[] = {
      {"cmsis_1x1_768x8x48", "tfmcu_1x1_768x8x48", 768, 8, 48}, /* (g_out holds 768 x 48) */
      {"cmsis_1x1_576x8x48", "tfmcu_1x1_576x8x48", 576, 8, 48},
      {"cmsis_1x1_384x16x96", "tfmcu_1x1_384x16x96", 384, 16, 96},
      {"cmsis_1x1_576x48x8", "tfmcu_1x1_576x48x8", 576, 48, 8},
      {"cmsis_1x1_144x96x16", "tfmcu_1x1_144x96x16", 144, 96, 16},
      {"cmsis_1x1_64x320x64", "tfmcu_1x1_64x320x64", 64, 320, 64},
      {"cmsis_1x1_100x160x96", "tfmcu_1x1_100x160x96", 100, 160, 96},
      {"cmsis_1x1_9x96x24", "tfmcu_1x1_9x96x24", 9, 96, 24},
  };
  for (uint32_t i = 0; i < sizeof(kMats) / sizeof(kMats[0]); ++i) {
    mismatches += compare_1x1(&kMats[i]);
  }
  static const ConvShape kConvs[] = {
      {"cmsis_conv_96x96x3x16", "tfmcu_conv_96x96x3x16", 96, 96, 3, 16},
      {"cmsis_conv_48x48x3x32", "tfmcu_conv_48x48x3x32", 48, 48, 3, 32},
      {"cmsis_conv_49x49x3x8", "tfmcu_conv_49x49x3x8", 49, 49, 3, 8},
  };
  for (uint32_t i = 0; i < sizeof(kConvs) / sizeof(kConvs[0]); ++i) {
    mismatches += compare_conv(&kConvs[i]);
  }
#endif
  tfmcu_result_int("fuzz_differences", fuzz);
  tfmcu_result_int("shape_mismatches", mismatches);
  return tfmcu_result_end();
}
