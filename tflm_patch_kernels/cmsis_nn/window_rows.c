/* The row driver of the CMSIS-NN window ops, and the pooling ops' shared path: see cmsis_nn_backend.h. */
#include "cmsis_nn/cmsis_nn_backend.h"

#include <string.h>

static int32_t tfmcu_cmsis_align4(int32_t n) { return (n + 3) / 4 * 4; }

int32_t tfmcu_cmsis_staging_bytes(const TfmcuConstView* input, int32_t kernel_h) {
  if (tfmcu_cmsis_dense(input->height, input->width, input->channels, input->row_stride)) {
    return 0;
  }
  return tfmcu_cmsis_align4(kernel_h * input->width * input->channels);
}

TfmcuStatus tfmcu_cmsis_window_rows(TfmcuCmsisWindowCall call, const void* args, const TfmcuConstView* input,
                                    int32_t pad_top, int32_t kernel_h, int32_t stride_h, const TfmcuView* output,
                                    const TfmcuKernelScratch* kernel_scratch, int32_t cmsis_bytes) {
  const int32_t staging = tfmcu_cmsis_staging_bytes(input, kernel_h);
  const int32_t cmsis_aligned = tfmcu_cmsis_align4(cmsis_bytes);
  if (kernel_scratch == NULL || (cmsis_bytes + staging > 0 && (kernel_scratch->data == NULL ||
                                                                kernel_scratch->bytes < cmsis_aligned + staging))) {
    return kTfmcuErrorScratchTooSmall;
  }
  cmsis_nn_context ctx;
  ctx.buf = cmsis_bytes > 0 ? kernel_scratch->data : NULL;
  ctx.size = cmsis_bytes;
  const int in_dense = staging == 0;
  const int out_dense = tfmcu_cmsis_dense(output->height, output->width, output->channels, output->row_stride);
  cmsis_nn_dims in_dims = {1, input->height, input->width, input->channels};
  cmsis_nn_dims out_dims = {1, output->height, output->width, output->channels};
  if (in_dense && out_dense) {
    return call(args, &ctx, &in_dims, input->data, pad_top, &out_dims, output->data) == ARM_CMSIS_NN_SUCCESS
               ? kTfmcuOk
               : kTfmcuErrorShapeMismatch;
  }
  /* Every output row's window must reach at least one input row (true of every valid stage layer). */
  for (int32_t y = 0; y < output->height; ++y) {
    const int32_t first = y * stride_h - pad_top;
    if (first + kernel_h <= 0 || first >= input->height) {
      return kTfmcuErrorShapeMismatch;
    }
  }
  int8_t* stage_rows = staging > 0 ? kernel_scratch->data + cmsis_aligned : NULL;
  const size_t row_bytes = (size_t)input->width * (size_t)input->channels;
  out_dims.h = 1;
  for (int32_t y = 0; y < output->height; ++y) {
    const int32_t first = y * stride_h - pad_top;
    const int32_t lo = first > 0 ? first : 0;
    const int32_t hi = first + kernel_h < input->height ? first + kernel_h : input->height;
    const int8_t* rows = input->data + (ptrdiff_t)lo * input->row_stride;
    if (!in_dense) {
      for (int32_t r = lo; r < hi; ++r) {
        memcpy(stage_rows + (size_t)(r - lo) * row_bytes, input->data + (ptrdiff_t)r * input->row_stride,
               row_bytes);
      }
      rows = stage_rows;
    }
    in_dims.h = hi - lo;
    if (call(args, &ctx, &in_dims, rows, lo - first, &out_dims, output->data + (ptrdiff_t)y * output->row_stride) !=
        ARM_CMSIS_NN_SUCCESS) {
      return kTfmcuErrorShapeMismatch;
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------------------------ pooling */

static int tfmcu_cmsis_pool_covers(const TfmcuPoolParams* p, const TfmcuConstView* in, int32_t pad_top,
                                   int32_t pad_left, const TfmcuView* out) {
  return in->channels == out->channels && out->height > 0 && out->width > 0 && pad_top >= 0 && pad_left >= 0 &&
         p->filter_h > pad_top && p->filter_w > pad_left &&
         (out->height - 1) * p->stride_h - pad_top < in->height &&
         (out->width - 1) * p->stride_w - pad_left < in->width;
}

typedef struct {
  TfmcuCmsisPoolFn pool;
  const TfmcuPoolParams* p;
  int32_t pad_left;
} TfmcuCmsisPoolCall;

static arm_cmsis_nn_status tfmcu_cmsis_pool_call(const void* args, const cmsis_nn_context* ctx,
                                                 const cmsis_nn_dims* in_dims, const int8_t* in, int32_t pad_top,
                                                 const cmsis_nn_dims* out_dims, int8_t* out) {
  const TfmcuCmsisPoolCall* a = (const TfmcuCmsisPoolCall*)args;
  cmsis_nn_pool_params c;
  c.stride.w = a->p->stride_w;
  c.stride.h = a->p->stride_h;
  c.padding.w = a->pad_left;
  c.padding.h = pad_top;
  c.activation.min = a->p->act_min;
  c.activation.max = a->p->act_max;
  const cmsis_nn_dims filter_dims = {1, a->p->filter_h, a->p->filter_w, 1};
  return a->pool(ctx, &c, in_dims, in, &filter_dims, out_dims, out);
}

TfmcuStatus tfmcu_cmsis_pool_run(TfmcuCmsisPoolFn pool, TfmcuOpRunFn portable, int32_t cmsis_bytes,
                                 const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                                 const TfmcuView* output, const TfmcuKernelScratch* kernel_scratch) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_cmsis_pool_covers(p, &inputs[0], pad_top, pad_left, output)) {
    return portable(params, inputs, pad_top, pad_left, output);  /* its checks and errors */
  }
  const TfmcuCmsisPoolCall call = {pool, p, pad_left};
  return tfmcu_cmsis_window_rows(tfmcu_cmsis_pool_call, &call, &inputs[0], pad_top, p->filter_h, p->stride_h, output,
                                 kernel_scratch, cmsis_bytes);
}

int32_t tfmcu_cmsis_pool_scratch(int32_t cmsis_bytes, const void* params, const TfmcuConstView* inputs,
                                 int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  const TfmcuPoolParams* p = (const TfmcuPoolParams*)params;
  if (!tfmcu_cmsis_pool_covers(p, &inputs[0], pad_top, pad_left, output)) {
    return 0;
  }
  return tfmcu_cmsis_align4(cmsis_bytes) + tfmcu_cmsis_staging_bytes(&inputs[0], p->filter_h);
}
