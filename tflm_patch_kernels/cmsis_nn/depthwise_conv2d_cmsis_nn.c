/* DEPTHWISE_CONV_2D through CMSIS-NN's arm_depthwise_conv_wrapper_s8, or on DSP cores without Helium our 3x3 kernel
 * (depthwise_conv3x3.c) where it is faster: see cmsis_nn_backend.h. */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "depthwise_conv2d.h"

/* What CMSIS-NN runs like the portable kernel: see cmsis_nn_backend.h. */
static int tfmcu_depthwise_conv2d_cmsis_nn_covers(const TfmcuDepthwiseConvParams* p) {
  return p->depth_multiplier == 1 && p->dilation_h == 1 && p->dilation_w == 1 && p->input_offset >= -127 &&
         p->input_offset <= 128 && p->output_offset >= -128 && p->output_offset <= 127;
}

static cmsis_nn_dw_conv_params tfmcu_depthwise_conv2d_cmsis_nn_params(const TfmcuDepthwiseConvParams* p,
                                                                      int32_t pad_top, int32_t pad_left) {
  cmsis_nn_dw_conv_params c;
  c.input_offset = p->input_offset;
  c.output_offset = p->output_offset;
  c.ch_mult = 1;
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

/* CMSIS-NN's buffer for calls on this input box with the layer's padding (the wrapper picks the 3x3 kernel, which
 * needs none, when the padding is at most 1; a row call's top padding is at most the layer's, so this need covers
 * every row call too). */
static int32_t tfmcu_depthwise_conv2d_cmsis_nn_buffer(const TfmcuDepthwiseConvParams* p, const TfmcuConstView* in,
                                                      int32_t pad_top, int32_t pad_left, const TfmcuView* out) {
  const cmsis_nn_dw_conv_params c = tfmcu_depthwise_conv2d_cmsis_nn_params(p, pad_top, pad_left);
  const cmsis_nn_dims in_dims = {1, in->height, in->width, in->channels};
  const cmsis_nn_dims filter_dims = {1, p->kernel_h, p->kernel_w, out->channels};
  const cmsis_nn_dims out_dims = {1, out->height, out->width, out->channels};
  return arm_depthwise_conv_wrapper_s8_get_buffer_size(&c, &in_dims, &filter_dims, &out_dims);
}

typedef struct {
  const TfmcuDepthwiseConvParams* p;
  int32_t pad_left;
} TfmcuDepthwiseCall;

static arm_cmsis_nn_status tfmcu_depthwise_conv2d_cmsis_nn_call(const void* args, const cmsis_nn_context* ctx,
                                                                const cmsis_nn_dims* in_dims, const int8_t* in,
                                                                int32_t pad_top, const cmsis_nn_dims* out_dims,
                                                                int8_t* out) {
  const TfmcuDepthwiseCall* a = (const TfmcuDepthwiseCall*)args;
  const cmsis_nn_dw_conv_params c = tfmcu_depthwise_conv2d_cmsis_nn_params(a->p, pad_top, a->pad_left);
  cmsis_nn_per_channel_quant_params quant;
  quant.multiplier = (int32_t*)a->p->output_multiplier;  /* CMSIS-NN only reads them */
  quant.shift = (int32_t*)a->p->output_shift;
  const cmsis_nn_dims filter_dims = {1, a->p->kernel_h, a->p->kernel_w, out_dims->c};
  const cmsis_nn_dims bias_dims = {1, 1, 1, out_dims->c};
  return arm_depthwise_conv_wrapper_s8(ctx, &c, &quant, in_dims, in, &filter_dims, a->p->filter, &bias_dims,
                                       a->p->bias, out_dims, out);
}

int32_t tfmcu_depthwise_conv2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs,
                                                int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)params;
  if (!tfmcu_depthwise_conv2d_cmsis_nn_covers(p)) {
    return 0;
  }
  const int32_t cmsis = tfmcu_depthwise_conv2d_cmsis_nn_buffer(p, &inputs[0], pad_top, pad_left, output);
  return (cmsis + 3) / 4 * 4 + tfmcu_cmsis_staging_bytes(&inputs[0], p->kernel_h);
}

TfmcuStatus tfmcu_depthwise_conv2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                                int32_t pad_left, const TfmcuView* output,
                                                const TfmcuKernelScratch* kernel_scratch) {
  const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_depthwise_conv2d_cmsis_nn_covers(p)) {
    return tfmcu_depthwise_conv2d_s8(p, &inputs[0], pad_top, pad_left, output);
  }
#if defined(ARM_MATH_DSP) && !defined(ARM_MATH_MVEI)
  if (TFMCU_DEPTHWISE_CONV3X3_OURS(p, output->channels)) { /* ours: faster than CMSIS-NN's here, on the views */
    return tfmcu_depthwise_conv3x3_s8(p, &inputs[0], pad_top, pad_left, output);
  }
#endif
  const TfmcuDepthwiseCall call = {p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_depthwise_conv2d_cmsis_nn_call, &call, &inputs[0], pad_top, p->kernel_h,
                                 p->stride_h, output, kernel_scratch,
                                 tfmcu_depthwise_conv2d_cmsis_nn_buffer(p, &inputs[0], pad_top, pad_left, output));
}
