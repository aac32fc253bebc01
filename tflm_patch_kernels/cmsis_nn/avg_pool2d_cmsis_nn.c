/* AVERAGE_POOL_2D through CMSIS-NN's arm_avgpool_s8: see cmsis_nn_backend.h. CMSIS-NN averages like TFLite's
 * reference kernel (only the window's pixels inside the input are counted; the sum is rounded half away from zero,
 * then clamped), so the row driver's clipped input rows give the same counts as the whole box. */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "avg_pool2d.h"

static cmsis_nn_pool_params tfmcu_avg_pool2d_cmsis_nn_params(const TfmcuPoolParams* p, int32_t pad_top,
                                                             int32_t pad_left) {
  cmsis_nn_pool_params c;
  c.stride.w = p->stride_w;
  c.stride.h = p->stride_h;
  c.padding.w = pad_left;
  c.padding.h = pad_top;
  c.activation.min = p->act_min;
  c.activation.max = p->act_max;
  return c;
}

/* CMSIS-NN's buffer: one int32 per channel on cores with the DSP extension (none otherwise). */
static int32_t tfmcu_avg_pool2d_cmsis_nn_buffer(const TfmcuView* out) {
  return arm_avgpool_s8_get_buffer_size(out->width, out->channels);
}

typedef struct {
  const TfmcuPoolParams* p;
  int32_t pad_left;
} TfmcuAvgPoolCall;

static arm_cmsis_nn_status tfmcu_avg_pool2d_cmsis_nn_call(const void* args, const cmsis_nn_context* ctx,
                                                          const cmsis_nn_dims* in_dims, const int8_t* in,
                                                          int32_t pad_top, const cmsis_nn_dims* out_dims,
                                                          int8_t* out) {
  const TfmcuAvgPoolCall* a = (const TfmcuAvgPoolCall*)args;
  const cmsis_nn_pool_params c = tfmcu_avg_pool2d_cmsis_nn_params(a->p, pad_top, a->pad_left);
  const cmsis_nn_dims filter_dims = {1, a->p->filter_h, a->p->filter_w, 1};
  return arm_avgpool_s8(ctx, &c, in_dims, in, &filter_dims, out_dims, out);
}

int32_t tfmcu_avg_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (!tfmcu_cmsis_pool_covers(p->filter_h, p->filter_w, p->stride_h, p->stride_w, &inputs[0], pad_top, pad_left,
                               output)) {
    return 0;
  }
  return (tfmcu_avg_pool2d_cmsis_nn_buffer(output) + 3) / 4 * 4 + tfmcu_cmsis_staging_bytes(&inputs[0], p->filter_h);
}

TfmcuStatus tfmcu_avg_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_cmsis_pool_covers(p->filter_h, p->filter_w, p->stride_h, p->stride_w, &inputs[0], pad_top, pad_left,
                               output)) {
    return tfmcu_avg_pool2d_s8(p, &inputs[0], pad_top, pad_left, output);  /* its checks and errors */
  }
  const TfmcuAvgPoolCall call = {p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_avg_pool2d_cmsis_nn_call, &call, &inputs[0], pad_top, p->filter_h,
                                 p->stride_h, output, kernel_scratch, tfmcu_avg_pool2d_cmsis_nn_buffer(output));
}
