/* LEAKY_RELU, int8: TFLite Micro's reference quantized LeakyRelu (reference_ops::QuantizeLeakyRelu): input - zero
 * point, requantized with the identity multiplier where it is >= 0 and with the alpha multiplier where it is < 0
 * (MultiplyByQuantizedMultiplier), plus the output zero point, clamped to int8. A negative alpha (a negative alpha
 * multiplier) is applied as -(|multiplier| x), as TFLM does. The params are TFLM's Prepare's (tfmcu/kernels/
 * quant.py: leaky_relu_params): QuantizeMultiplier(s_in * alpha / s_out) and QuantizeMultiplier(s_in / s_out), the
 * quotients in float32.
 */
#ifndef TFMCU_PATCH_KERNELS_LEAKY_RELU_H_
#define TFMCU_PATCH_KERNELS_LEAKY_RELU_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t input_zero_point;
  int32_t output_zero_point;
  int32_t output_multiplier_alpha;  /* negative for a negative alpha; never INT32_MIN */
  int32_t output_shift_alpha;
  int32_t output_multiplier_identity;
  int32_t output_shift_identity;
} TfmcuLeakyReluParams;

/* output = leaky_relu(input) element by element (the same height, width and channels). */
TfmcuStatus tfmcu_leaky_relu_s8(const TfmcuLeakyReluParams* params, const TfmcuConstView* input,
                                const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[1] (a pointwise
 * op). */
TfmcuStatus tfmcu_leaky_relu_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_leaky_relu_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_LEAKY_RELU_H_ */
