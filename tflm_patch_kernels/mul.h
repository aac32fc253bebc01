/* MUL, int8: TFLite Micro's reference integer Mul (reference_integer_ops::MulElementwise, and BroadcastMul6DSlow for
 * the broadcast below): (input1 + input1_offset) * (input2 + input2_offset) as int32, times the output multiplier
 * (TFLite's MultiplyByQuantizedMultiplier), plus the output offset, clamped to the fused activation's range.
 * output_multiplier / output_shift: QuantizeMultiplier(input1 scale * input2 scale / output scale), as TFLM's Prepare
 * computes them (tfmcu/kernels/quant.py: mul_params); the shift may be positive (a left shift). TF Lite's
 * interpreter takes the multiplier of a float32 product and quotient instead, and so differs from TFLM by one step
 * on rare inputs.
 *
 * Input 2 is a box of the output's size, or a 1 x 1 x C box broadcast over space (tfmcu_operand2_pixel_step): a
 * squeeze-excite's channel scaling, or a constant per-channel (or scalar, repeated C times) operand.
 */
#ifndef TFMCU_PATCH_KERNELS_MUL_H_
#define TFMCU_PATCH_KERNELS_MUL_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t input1_offset;  /* -(input 1 zero point) */
  int32_t input2_offset;  /* -(input 2 zero point) */
  int32_t output_offset;  /* output zero point */
  int32_t output_multiplier;
  int32_t output_shift;   /* > 0: left shift */
  int32_t act_min;
  int32_t act_max;
} TfmcuMulParams;

/* output = input1 * input2 element by element: input 1 and the output have the same height, width and channels;
 * input 2 the same, or 1 x 1 x C (broadcast to every pixel). */
TfmcuStatus tfmcu_mul_s8(const TfmcuMulParams* params, const TfmcuConstView* input1, const TfmcuConstView* input2,
                         const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[2] (a pointwise op:
 * no window, the padding arguments are ignored). */
TfmcuStatus tfmcu_mul_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_mul_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_MUL_H_ */
