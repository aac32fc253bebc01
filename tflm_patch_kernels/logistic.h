/* LOGISTIC, int8: TFLite Micro's reference integer Logistic (reference_integer_ops::Logistic): input - zero point
 * saturates to -128 at or below -input_range_radius and to 127 at or above +input_range_radius; in between it is
 * rescaled to a 4-integer-bit fixed-point value (MultiplyByQuantizedMultiplier with input_multiplier and the left
 * shift input_left_shift), gemmlowp's fixed-point logistic is applied (tfmcu_fixedpoint.h) and the result is
 * rounded to the output scale 1/256 with zero point -128. The params are TFLM's Prepare's (tfmcu/kernels/quant.py:
 * logistic_params): input_multiplier and input_left_shift from frexp(input scale * 2^27), the radius
 * CalculateInputRadius(4, input_left_shift, 31).
 *
 * TF Lite's interpreter (its reference kernels included) evaluates int8 LOGISTIC with a table of float sigmoids,
 * not this fixed-point path. Measured on every int8 input (tests/test_eltwise_kernels.py), the two agree for input
 * scales in (1/128, 2), and below 1/128 except at exact powers of two, where a few inputs differ by one step (ties
 * of the table's rounding); they differ on a few inputs (up to five steps) for input scales from 2 to about 6.2, and
 * from an input scale of 8 on, where input_left_shift reaches 31 and the radius 0: TFLM saturates every input, the
 * zero point's too (127 for TF Lite's 0). The kernel reproduces TFLM, which is what runs on the device
 * (docs/limitations.md).
 */
#ifndef TFMCU_PATCH_KERNELS_LOGISTIC_H_
#define TFMCU_PATCH_KERNELS_LOGISTIC_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest input_left_shift accepted (CalculateInputRadius's range): from 31 on (input scales of 8 and more) the
 * radius is 0, every input saturates and the shift is never applied. */
#define TFMCU_LOGISTIC_MAX_LEFT_SHIFT 62

typedef struct {
  int32_t input_zero_point;
  int32_t input_range_radius;  /* CalculateInputRadius(4, input_left_shift, 31) */
  int32_t input_multiplier;    /* [2^30, 2^31) */
  int32_t input_left_shift;    /* 0 .. TFMCU_LOGISTIC_MAX_LEFT_SHIFT */
} TfmcuLogisticParams;

/* output = logistic(input) element by element (the same height, width and channels). */
TfmcuStatus tfmcu_logistic_s8(const TfmcuLogisticParams* params, const TfmcuConstView* input,
                              const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check (the radius must be the one the
 * shift gives, which keeps every fixed-point value in range), run on inputs[1] (a pointwise op). */
TfmcuStatus tfmcu_logistic_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_logistic_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                  int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_LOGISTIC_H_ */
