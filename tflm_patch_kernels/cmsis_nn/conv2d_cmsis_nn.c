/* CONV_2D through CMSIS-NN's arm_convolve_wrapper_s8: see cmsis_nn_backend.h. */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "arm_nnsupportfunctions.h"
#include "conv2d.h"

/* What CMSIS-NN runs like the portable kernel: see cmsis_nn_backend.h. */
static int tfmcu_conv2d_cmsis_nn_covers(const TfmcuConvParams* p) {
  return p->groups == 1 && p->dilation_h == 1 && p->dilation_w == 1 && p->input_offset >= -127 &&
         p->input_offset <= 128 && p->output_offset >= -128 && p->output_offset <= 127;
}

static cmsis_nn_conv_params tfmcu_conv2d_cmsis_nn_params(const TfmcuConvParams* p, int32_t pad_top,
                                                         int32_t pad_left) {
  cmsis_nn_conv_params c;
  c.input_offset = p->input_offset;
  c.output_offset = p->output_offset;
  c.stride.w = p->stride_w;
  c.stride.h = p->stride_h;
  c.padding.w = pad_left;
  c.padding.h = pad_top;
  c.dilation.w = 1;
  c.dilation.h = 1;
  c.activation.min = p->act_min;
  c.activation.max = p->act_max;
  return c;
}

/* CMSIS-NN's buffer for calls on this input box (its size does not depend on the rows of a call). */
static int32_t tfmcu_conv2d_cmsis_nn_buffer(const TfmcuConvParams* p, const TfmcuConstView* in,
                                            const TfmcuView* out) {
  const cmsis_nn_conv_params c = tfmcu_conv2d_cmsis_nn_params(p, 0, 0);
  const cmsis_nn_dims in_dims = {1, in->height, in->width, in->channels};
  const cmsis_nn_dims filter_dims = {out->channels, p->kernel_h, p->kernel_w, in->channels};
  const cmsis_nn_dims out_dims = {1, out->height, out->width, out->channels};
  return arm_convolve_wrapper_s8_get_buffer_size(&c, &in_dims, &filter_dims, &out_dims);
}

typedef struct {
  const TfmcuConvParams* p;
  int32_t pad_left;
} TfmcuConvCall;

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

/* A 1x1 convolution with unit stride whose input offset the packer folded into its bias (bias + input offset x the
 * filter row's sum, input_offset 0: tfmcu/kernels/ops.py): the matrix product of `rows` input pixels (each `cols`
 * int8) by `out_c` filter rows, requantized per output channel. CMSIS-NN's arm_nn_mat_mult_nt_t_s8 sums every
 * filter row for the input offset on each call (about 3.5 instructions per weight), which a patch stage repeats for
 * every patch and, on a box narrower than its tensor, every row; here the sums are in the bias, made once offline.
 * Its inner loop takes about 6% more instructions per MAC than CMSIS-NN's (QEMU counts, arm-none-eabi-gcc -O2), so
 * it runs the calls of fewer than TFMCU_CONV1X1_FOLDED_MAX_PIXELS pixels, where the sums cost more than that; larger
 * calls go to CMSIS-NN (whose sums then add 0). The same integer arithmetic and requantization (bit-exact), and the
 * same order of reads and writes as CMSIS-NN's DSP product (per pair of output channels every input pixel, in pairs
 * of pixels; then an odd last channel), so the in-place distances of CMSIS-NN's 1x1 path hold. */
static void tfmcu_conv1x1_folded(const TfmcuConvParams* p, const int8_t* in, int32_t rows, int32_t cols,
                                 int32_t out_c, int8_t* out) {
  const TfmcuOutQuant q = {p->output_offset, p->act_min, p->act_max};
  const int8_t* filter = p->filter;
  const int32_t* bias = p->bias;
  int32_t k = 0;
  for (; k + 2 <= out_c; k += 2) {
    const int8_t* w0 = filter + k * cols;
    const int32_t b0 = bias != NULL ? bias[k] : 0;
    const int32_t b1 = bias != NULL ? bias[k + 1] : 0;
    const int32_t m0 = p->output_multiplier[k], s0 = p->output_shift[k];
    const int32_t m1 = p->output_multiplier[k + 1], s1 = p->output_shift[k + 1];
    int32_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      /* two pixels x two channels, four values at a time: x and w step along the first pixel and channel, the
       * second of each is `next` bytes past them */
      const int8_t* x = in + r * cols;
      const int8_t* w = w0;
      const int32_t next = cols - 4;
      int32_t a00 = b0, a01 = b1, a10 = b0, a11 = b1;
      int32_t c = 0;
#pragma GCC unroll 4
      for (; c + 4 <= cols; c += 4) {
        const int32_t wv = arm_nn_read_s8x4_ia(&w);
        const int32_t xv = arm_nn_read_s8x4_ia(&x);
        const int32_t we = SXTB16(wv), wo = SXTB16_RORn(wv, 8);
        const int32_t xe = SXTB16(xv), xo = SXTB16_RORn(xv, 8);
        a00 = SMLAD(xo, wo, SMLAD(xe, we, a00));
        const int32_t yv = arm_nn_read_s8x4(x + next);
        const int32_t ye = SXTB16(yv), yo = SXTB16_RORn(yv, 8);
        a10 = SMLAD(yo, wo, SMLAD(ye, we, a10));
        const int32_t vv = arm_nn_read_s8x4(w + next);
        const int32_t ve = SXTB16(vv), vo = SXTB16_RORn(vv, 8);
        a01 = SMLAD(xo, vo, SMLAD(xe, ve, a01));
        a11 = SMLAD(yo, vo, SMLAD(ye, ve, a11));
      }
      for (; c < cols; ++c, ++x, ++w) {
        a00 += x[0] * w[0];
        a01 += x[0] * w[cols];
        a10 += x[cols] * w[0];
        a11 += x[cols] * w[cols];
      }
      int8_t* o = out + r * out_c + k;
      o[0] = tfmcu_requantize_s8(a00, m0, s0, q);
      o[1] = tfmcu_requantize_s8(a01, m1, s1, q);
      o[out_c] = tfmcu_requantize_s8(a10, m0, s0, q);
      o[out_c + 1] = tfmcu_requantize_s8(a11, m1, s1, q);
    }
    if (r < rows) { /* the odd last pixel, both channels */
      const int8_t* x = in + r * cols;
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
      out[r * out_c + k] = tfmcu_requantize_s8(a0, m0, s0, q);
      out[r * out_c + k + 1] = tfmcu_requantize_s8(a1, m1, s1, q);
    }
  }
  if (k < out_c) {
    tfmcu_conv1x1_folded_channel(p, q, in, rows, cols, out_c, k, out);
  }
}
#endif

static arm_cmsis_nn_status tfmcu_conv2d_cmsis_nn_call(const void* args, const cmsis_nn_context* ctx,
                                                      const cmsis_nn_dims* in_dims, const int8_t* in,
                                                      int32_t pad_top, const cmsis_nn_dims* out_dims,
                                                      int8_t* out) {
  const TfmcuConvCall* a = (const TfmcuConvCall*)args;
  if (a->p->kernel_h == 1 && a->p->kernel_w == 1 && pad_top == 0 && a->pad_left == 0 && out_dims->h == 1 &&
      out_dims->w == 1) {
    /* One output pixel of a 1x1 convolution (a classifier run as one): the vector-matrix product TFLM's
     * FULLY_CONNECTED calls. arm_convolve_1x1_s8_fast's arm_nn_mat_mult_nt_t_s8 would first sum every filter row
     * for the input offset, once per call; this adds the offset to the one input pixel instead. Same integer
     * arithmetic, same requantization, and the same order of reads and writes (per pair of output channels the
     * whole input pixel, then those two outputs), so the in-place distances of the 1x1 path hold. */
    return arm_nn_vec_mat_mult_t_per_ch_s8(in, a->p->filter, NULL, a->p->bias, out, a->p->input_offset,
                                           a->p->output_offset, a->p->output_multiplier, a->p->output_shift,
                                           in_dims->c, out_dims->c, a->p->act_min, a->p->act_max, 1, 0);
  }
#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
  if (a->p->kernel_h == 1 && a->p->kernel_w == 1 && a->p->stride_h == 1 && a->p->stride_w == 1 &&
      a->p->input_offset == 0 && pad_top == 0 && a->pad_left == 0 &&
      in_dims->h * in_dims->w < TFMCU_CONV1X1_FOLDED_MAX_PIXELS) {
    tfmcu_conv1x1_folded(a->p, in, in_dims->h * in_dims->w, in_dims->c, out_dims->c, out);
    return ARM_CMSIS_NN_SUCCESS;
  }
#endif
  const cmsis_nn_conv_params c = tfmcu_conv2d_cmsis_nn_params(a->p, pad_top, a->pad_left);
  cmsis_nn_per_channel_quant_params quant;
  quant.multiplier = (int32_t*)a->p->output_multiplier;  /* CMSIS-NN only reads them */
  quant.shift = (int32_t*)a->p->output_shift;
  const cmsis_nn_dims filter_dims = {out_dims->c, a->p->kernel_h, a->p->kernel_w, in_dims->c};
  const cmsis_nn_dims bias_dims = {1, 1, 1, out_dims->c};
  return arm_convolve_wrapper_s8(ctx, &c, &quant, in_dims, in, &filter_dims, a->p->filter, &bias_dims, a->p->bias,
                                 out_dims, out);
}

int32_t tfmcu_conv2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                      int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  const TfmcuConvParams* p = (const TfmcuConvParams*)params;
  if (!tfmcu_conv2d_cmsis_nn_covers(p)) {
    return 0;
  }
  const int32_t cmsis = tfmcu_conv2d_cmsis_nn_buffer(p, &inputs[0], output);
  return (cmsis + 3) / 4 * 4 + tfmcu_cmsis_staging_bytes(&inputs[0], p->kernel_h);
}

TfmcuStatus tfmcu_conv2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                      int32_t pad_left, const TfmcuView* output,
                                      const TfmcuKernelScratch* kernel_scratch) {
  const TfmcuConvParams* p = (const TfmcuConvParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_conv2d_cmsis_nn_covers(p)) {
    return tfmcu_conv2d_s8(p, &inputs[0], pad_top, pad_left, output);
  }
  const TfmcuConvCall call = {p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_conv2d_cmsis_nn_call, &call, &inputs[0], pad_top, p->kernel_h, p->stride_h,
                                 output, kernel_scratch, tfmcu_conv2d_cmsis_nn_buffer(p, &inputs[0], output));
}
