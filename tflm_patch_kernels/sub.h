/* SUB, int8: TFLite's reference integer Sub with general rescaling (reference_ops::SubElementwise), input 2 of the
 * output's size or a 1 x 1 x C box broadcast over space (tfmcu_operand2_pixel_step).
 *
 * The arithmetic is ADD's (add.h: both inputs on a common scale with left_shift = 20, each scaled by its own
 * multiplier) with scaled1 - scaled2 in place of the sum, and the params are ADD's struct. It is an op of its own
 * rather than ADD with input 2's multiplier negated: gemmlowp's SaturatingRoundingDoublingHighMul rounds an exact
 * half up (towards +infinity), so for a product ending in exactly half an output step SRDHM(x, -m) != -SRDHM(x, m)
 * and the negated ADD differs from TFLite's SUB by one step for some inputs (tests/test_eltwise_kernels.py shows
 * such a model). The multipliers are those of TFLM's SUB Prepare at the pinned commit (what the firmware and the host
 * runner build), computed from float32 quotients (tfmcu/kernels/quant.py: sub_params); the tflite-micro wheel and TF
 * Lite compute them in double, as ADD does, and so differ from it by one step on rare inputs.
 */
#ifndef TFMCU_PATCH_KERNELS_SUB_H_
#define TFMCU_PATCH_KERNELS_SUB_H_

#include "add.h"
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* output = input1 - input2 element by element: input 1 and the output have the same height, width and channels;
 * input 2 the same, or 1 x 1 x C (broadcast to every pixel). */
TfmcuStatus tfmcu_sub_s8(const TfmcuAddParams* params, const TfmcuConstView* input1, const TfmcuConstView* input2,
                         const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check (ADD's), run on inputs[2] (a
 * pointwise op: no window, the padding arguments are ignored). */
TfmcuStatus tfmcu_sub_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_sub_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_SUB_H_ */
