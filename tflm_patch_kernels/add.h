/* ADD, int8 (TFLite's reference integer Add with general rescaling), input 2 of the output's size or a 1 x 1 x C box
 * broadcast over space (tfmcu_operand2_pixel_step: TFLite's broadcast of a [1, 1, 1, C] or per-channel operand).
 *
 * Both inputs are brought to a common scale with 20 bits of headroom (left_shift = 20), scaled by their own
 * multipliers, summed, and requantized to the output scale; the multipliers/shifts are TFLite's
 * (QuantizeMultiplierSmallerThanOneExp of s1 / (2 max(s1, s2)), s2 / (2 max(s1, s2)),
 * 2 max(s1, s2) / (2^20 s_out)), computed offline.
 */
#ifndef TFMCU_PATCH_KERNELS_ADD_H_
#define TFMCU_PATCH_KERNELS_ADD_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest left_shift accepted: (255 + 127) * 2^22 still fits int32 (TFLite uses 20 for int8). */
#define TFMCU_ADD_MAX_LEFT_SHIFT 22

typedef struct {
  int32_t input1_offset;  /* -(input 1 zero point) */
  int32_t input2_offset;  /* -(input 2 zero point) */
  int32_t output_offset;  /* output zero point */
  int32_t left_shift;     /* 20 for int8 */
  int32_t input1_multiplier;
  int32_t input1_shift;   /* <= 0 */
  int32_t input2_multiplier;
  int32_t input2_shift;
  int32_t output_multiplier;
  int32_t output_shift;
  int32_t act_min;
  int32_t act_max;
} TfmcuAddParams;

/* output = input1 + input2 element by element: input 1 and the output have the same height, width and channels;
 * input 2 the same, or 1 x 1 x C (broadcast to every pixel). */
TfmcuStatus tfmcu_add_s8(const TfmcuAddParams* params, const TfmcuConstView* input1, const TfmcuConstView* input2,
                         const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[2] (a pointwise
 * op: no window, the padding arguments are ignored). */
TfmcuStatus tfmcu_add_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_add_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_ADD_H_ */
