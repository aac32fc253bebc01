/* MEAN over height and width (global average pooling), int8: TFLite Micro's reference integer MEAN
 * (reduce_common.cc: QuantizedMeanOrSum with int32 sums). Per channel, the sum of the H x W input values; then
 * (sum - zero_point * count) * multiplier' * 2^shift' + output zero point, clamped to int8, where multiplier' and
 * shift' fold 1 / count into the op's multiplier exactly as TFLite does (shift s = floor(log2 count), at most 32
 * and at most 31 + output_shift; multiplier' = (multiplier << s) / count, shift' = output_shift - s).
 *
 * Integer sums do not depend on the order of the additions, so a patch stage computes the mean patch by patch:
 * tfmcu_mean_accumulate_s8 adds each patch's box into int32 sums (the stage's accumulator, patch_stage.h) and
 * tfmcu_mean_finish_s8 turns the sums into the output after the last patch: the same bytes as the whole op. */
#ifndef TFMCU_PATCH_KERNELS_MEAN_H_
#define TFMCU_PATCH_KERNELS_MEAN_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t input_offset;       /* -(input zero point) */
  int32_t output_offset;      /* output zero point */
  int32_t output_multiplier;  /* QuantizeMultiplier(input scale / output scale), as TFLM's Prepare computes it */
  int32_t output_shift;
} TfmcuMeanParams;

/* The whole op: output (1 x 1 x C) = the mean over every pixel of input (H x W x C). */
TfmcuStatus tfmcu_mean_s8(const TfmcuMeanParams* params, const TfmcuConstView* input, const TfmcuView* output);

/* Adds the per-channel sums of the box `input` to the `input->channels` int32 sums at `sums` (native byte order,
 * any alignment: the stage's scratch memory is int8). */
void tfmcu_mean_accumulate_s8(const TfmcuConstView* input, int8_t* sums);

/* output (1 x 1 x C) from the sums of `count` pixels per channel (C = output->channels int32 sums, any alignment). */
TfmcuStatus tfmcu_mean_finish_s8(const TfmcuMeanParams* params, const int8_t* sums, int32_t count,
                                 const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[1] (the whole op),
 * and the reduction of a patch stage: accumulate one box, finish. */
TfmcuStatus tfmcu_mean_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_mean_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                              const TfmcuView* output);
void tfmcu_mean_op_accumulate(const void* params, const TfmcuConstView* inputs, int8_t* sums);
TfmcuStatus tfmcu_mean_op_finish(const void* params, const int8_t* sums, int32_t count, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_MEAN_H_ */
