/* HARD_SWISH, int8: TFLite's reference quantized HardSwish (reference_ops::HardSwish with HardSwishParams), x *
 * relu6(x + 3) / 6 in 16-bit fixed point: the input (minus its zero point) on a "high-res" scale (x 2^7), on the
 * output scale before the output shift (output multiplier), and as a "relu-ish" factor in [0, 1] (the input rescaled
 * so that 3.0 is 32768, saturating, then mapped from [-1, 1] to [0, 1]); their product (rounding towards zero), the
 * output shift (rounding to nearest) and the output zero point, clamped to int8. Every step is gemmlowp's int16
 * arithmetic, reproduced with its int16 wrap-arounds and saturations (hard_swish.c).
 *
 * The params are TFLM's Prepare's (tfmcu/kernels/quant.py: hard_swish_params): with the float32 scales s_in, s_out,
 * hires = s_in / 128, the output multiplier QuantizeMultiplier(hires / s_out) and the "relu-ish" multiplier
 * QuantizeMultiplier(hires / (3 / 32768)) (float32 quotients), each Q31 multiplier rounded to Q15
 * (DownScaleInt32ToInt16Multiplier). TFLM requires output_multiplier_exponent <= 0.
 */
#ifndef TFMCU_PATCH_KERNELS_HARD_SWISH_H_
#define TFMCU_PATCH_KERNELS_HARD_SWISH_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t input_zero_point;
  int32_t output_zero_point;
  int32_t reluish_multiplier_fixedpoint_int16;  /* Q15, 0 .. 32767 */
  int32_t reluish_multiplier_exponent;          /* -31 .. 31 */
  int32_t output_multiplier_fixedpoint_int16;   /* Q15, 0 .. 32767 */
  int32_t output_multiplier_exponent;           /* -31 .. 0 */
} TfmcuHardSwishParams;

/* output = hard_swish(input) element by element (the same height, width and channels). */
TfmcuStatus tfmcu_hard_swish_s8(const TfmcuHardSwishParams* params, const TfmcuConstView* input,
                                const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[1] (a pointwise
 * op). */
TfmcuStatus tfmcu_hard_swish_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_hard_swish_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_HARD_SWISH_H_ */
