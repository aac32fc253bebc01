/* AVERAGE_POOL_2D through CMSIS-NN's arm_avgpool_s8: see cmsis_nn_backend.h. CMSIS-NN averages like TFLite's
 * reference kernel (only the window's pixels inside the input are counted; the sum is rounded half away from zero,
 * then clamped), so the row driver's clipped input rows give the same counts as the whole box. Its buffer: one int32
 * per channel on cores with the DSP extension (arm_avgpool_s8_get_buffer_size). */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "avg_pool2d.h"

int32_t tfmcu_avg_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output) {
  return tfmcu_cmsis_pool_scratch(arm_avgpool_s8_get_buffer_size(output->width, output->channels), params, inputs,
                                  pad_top, pad_left, output);
}

TfmcuStatus tfmcu_avg_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch) {
  if (output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  return tfmcu_cmsis_pool_run(arm_avgpool_s8, tfmcu_avg_pool2d_op_run,
                              arm_avgpool_s8_get_buffer_size(output->width, output->channels), params, inputs,
                              pad_top, pad_left, output, kernel_scratch);
}
