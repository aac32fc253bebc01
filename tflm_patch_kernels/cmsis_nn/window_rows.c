/* The row driver of the CMSIS-NN window ops: see cmsis_nn_backend.h. */
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
