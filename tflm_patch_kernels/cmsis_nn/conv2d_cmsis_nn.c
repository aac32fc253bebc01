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

/* CMSIS-NN's buffer for calls on this input box (on DSP cores its size does not depend on the rows of a call; with
 * Helium a call of one input row with a one-row kernel takes the 1 x N path, whose buffer differs: the larger). */
static int32_t tfmcu_conv2d_cmsis_nn_buffer(const TfmcuConvParams* p, const TfmcuConstView* in,
                                            const TfmcuView* out) {
  const cmsis_nn_conv_params c = tfmcu_conv2d_cmsis_nn_params(p, 0, 0);
  const cmsis_nn_dims in_dims = {1, in->height, in->width, in->channels};
  const cmsis_nn_dims filter_dims = {out->channels, p->kernel_h, p->kernel_w, in->channels};
  const cmsis_nn_dims out_dims = {1, out->height, out->width, out->channels};
  int32_t need = arm_convolve_wrapper_s8_get_buffer_size(&c, &in_dims, &filter_dims, &out_dims);
#if defined(ARM_MATH_MVEI)
  if (p->kernel_h == 1 && in->height > 1) {
    const cmsis_nn_dims row_in = {1, 1, in->width, in->channels};
    const cmsis_nn_dims row_out = {1, 1, out->width, out->channels};
    const int32_t row = arm_convolve_wrapper_s8_get_buffer_size(&c, &row_in, &filter_dims, &row_out);
    need = row > need ? row : need;
  }
#endif
  return need;
}

typedef struct {
  const TfmcuConvParams* p;
  int32_t pad_left;
} TfmcuConvCall;


static arm_cmsis_nn_status tfmcu_conv2d_cmsis_nn_call(const void* args, const cmsis_nn_context* ctx,
                                                      const cmsis_nn_dims* in_dims, const int8_t* in,
                                                      int32_t pad_top, const cmsis_nn_dims* out_dims,
                                                      int8_t* out) {
  const TfmcuConvCall* a = (const TfmcuConvCall*)args;
#if !defined(ARM_MATH_MVEI) /* (Helium's vector-matrix product takes the filter rows' sums precomputed: not here) */
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
#endif
#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
  if (a->p->kernel_h == 1 && a->p->kernel_w == 1 && a->p->stride_h == 1 && a->p->stride_w == 1 &&
      a->p->input_offset == 0 && pad_top == 0 && a->pad_left == 0 &&
      TFMCU_CONV1X1_FOLDED(in_dims->h * in_dims->w, in_dims->c)) {
    tfmcu_conv1x1_folded_s8(a->p, in, in_dims->h * in_dims->w, in_dims->c, out_dims->c, out);
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
#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
  if (TFMCU_CONV2D_SHALLOW_OURS(p, inputs[0].channels, output->channels)) { /* ours: faster here, on the views */
    return tfmcu_conv2d_shallow_s8(p, &inputs[0], pad_top, pad_left, output);
  }
#endif
  const TfmcuConvCall call = {p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_conv2d_cmsis_nn_call, &call, &inputs[0], pad_top, p->kernel_h, p->stride_h,
                                 output, kernel_scratch, tfmcu_conv2d_cmsis_nn_buffer(p, &inputs[0], output));
}
