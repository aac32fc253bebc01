/* MAX_POOL_2D through CMSIS-NN's arm_max_pool_s8: see cmsis_nn_backend.h. The maximum over the window's pixels
 * inside the input, then clamped, as TFLite's reference kernel. No CMSIS-NN buffer (staging rows only, for an input
 * box that is not dense). */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "max_pool2d.h"

int32_t tfmcu_max_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output) {
  return tfmcu_cmsis_pool_scratch(0, params, inputs, pad_top, pad_left, output);
}

TfmcuStatus tfmcu_max_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch) {
  return tfmcu_cmsis_pool_run(arm_max_pool_s8, tfmcu_max_pool2d_op_run, 0, params, inputs, pad_top, pad_left, output,
                              kernel_scratch);
}
