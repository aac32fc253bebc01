/* What CONV_2D and DEPTHWISE_CONV_2D share, as TFLM keeps it in kernels/conv_common.cc and
 * depthwise_conv_common.cc: the per-channel requantization of an accumulator into the int8 output (TFLite's
 * reference: bias, the channel's multiplier and shift, the output offset, the activation range), and the checks
 * their op-table entries make of a layer's parameters. */
#ifndef TFMCU_PATCH_KERNELS_CONV_COMMON_H_
#define TFMCU_PATCH_KERNELS_CONV_COMMON_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output channel c of an accumulator: + bias[c] (bias may be NULL), x output_multiplier[c] >> output_shift[c]
 * (tfmcu_multiply_by_quantized_multiplier), + output_offset, clamped to [act_min, act_max]. */
static inline int8_t tfmcu_conv_requantize(int32_t acc, const int32_t* bias, int32_t c,
                                           const int32_t* output_multiplier, const int32_t* output_shift,
                                           int32_t output_offset, int32_t act_min, int32_t act_max) {
  if (bias != NULL) {
    acc = tfmcu_wrap_add(acc, bias[c]);
  }
  acc = tfmcu_multiply_by_quantized_multiplier(acc, output_multiplier[c], output_shift[c]);
  acc = tfmcu_wrap_add(acc, output_offset);
  return (int8_t)tfmcu_clamp(acc, act_min, act_max);
}

/* An op-table check of a convolution's parameters: kTfmcuErrorNullPointer without its filter, multipliers or
 * shifts; kTfmcuErrorInvalidStage when its channels do not fit it (channels_ok: the op's own rule), its window is
 * not valid, its activation range is empty or an offset is out of int8's range; else kTfmcuOk. */
static inline TfmcuStatus tfmcu_conv_check(const int8_t* filter, const int32_t* output_multiplier,
                                           const int32_t* output_shift, int channels_ok, const TfmcuWindow* window,
                                           int32_t act_min, int32_t act_max, int32_t input_offset,
                                           int32_t output_offset) {
  if (filter == NULL || output_multiplier == NULL || output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!channels_ok || !tfmcu_window_valid(window) || act_min > act_max || !tfmcu_offset_valid(input_offset) ||
      !tfmcu_offset_valid(output_offset)) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

#ifdef __cplusplus
}
#endif

#endif /* TFMCU_PATCH_KERNELS_CONV_COMMON_H_ */
