/* QUANTIZE float32 -> int8 (TFLite's reference AffineQuantize):
 *   q = clamp(round(x / scale) + zero_point, -128, 127)
 * with the division in float32 and round() = round half away from zero (std::round). A NaN input gives the zero
 * point (TFLite's cast of NaN to int32 is undefined behaviour). */
#ifndef TFMCU_PATCH_KERNELS_QUANTIZE_H_
#define TFMCU_PATCH_KERNELS_QUANTIZE_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  float scale;         /* the output tensor's scale, as stored in the model (float32) */
  int32_t zero_point;  /* the output tensor's zero point */
} TfmcuQuantizeParams;

/* Input and output boxes have the same height, width and channels. */
TfmcuStatus tfmcu_quantize_f32_s8(const TfmcuQuantizeParams* params, const TfmcuConstViewF32* input,
                                  const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): params check, run on inputs[1] (a pointwise
 * op; the padding arguments are ignored). inputs[0].data points at the floats (cast through const void*), its
 * row_stride counts floats; the adapter turns it into the TfmcuConstViewF32 of tfmcu_quantize_f32_s8. */
TfmcuStatus tfmcu_quantize_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_quantize_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                  int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_QUANTIZE_H_ */
