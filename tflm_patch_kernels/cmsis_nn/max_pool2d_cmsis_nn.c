/* MAX_POOL_2D through CMSIS-NN's arm_max_pool_s8: see cmsis_nn_backend.h. The maximum over the window's pixels
 * inside the input, then clamped, as TFLite's reference kernel. No CMSIS-NN buffer (staging rows only, for an input
 * box that is not dense). */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "max_pool2d.h"

typedef struct {
  const TfmcuPoolParams* p;
  int32_t pad_left;
} TfmcuMaxPoolCall;

static arm_cmsis_nn_status tfmcu_max_pool2d_cmsis_nn_call(const void* args, const cmsis_nn_context* ctx,
                                                          const cmsis_nn_dims* in_dims, const int8_t* in,
                                                          int32_t pad_top, const cmsis_nn_dims* out_dims,
                                                          int8_t* out) {
  const TfmcuMaxPoolCall* a = (const TfmcuMaxPoolCall*)args;
  cmsis_nn_pool_params c;
  c.stride.w = a->p->stride_w;
  c.stride.h = a->p->stride_h;
  c.padding.w = a->pad_left;
  c.padding.h = pad_top;
  c.activation.min = a->p->act_min;
  c.activation.max = a->p->act_max;
  const cmsis_nn_dims filter_dims = {1, a->p->filter_h, a->p->filter_w, 1};
  return arm_max_pool_s8(ctx, &c, in_dims, in, &filter_dims, out_dims, out);
}

int32_t tfmcu_max_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (!tfmcu_cmsis_pool_covers(p->filter_h, p->filter_w, p->stride_h, p->stride_w, &inputs[0], pad_top, pad_left,
                               output)) {
    return 0;
  }
  return tfmcu_cmsis_staging_bytes(&inputs[0], p->filter_h);
}

TfmcuStatus tfmcu_max_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_cmsis_pool_covers(p->filter_h, p->filter_w, p->stride_h, p->stride_w, &inputs[0], pad_top, pad_left,
                               output)) {
    return tfmcu_max_pool2d_s8(p, &inputs[0], pad_top, pad_left, output);  /* its checks and errors */
  }
  const TfmcuMaxPoolCall call = {p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_max_pool2d_cmsis_nn_call, &call, &inputs[0], pad_top, p->filter_h,
                                 p->stride_h, output, kernel_scratch, 0);
}
