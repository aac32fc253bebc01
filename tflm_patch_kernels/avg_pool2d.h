/* AVERAGE_POOL_2D, int8 (TFLite's reference integer AveragePool): the average over the window's pixels that lie
 * inside the input (border padding is not counted), rounded half away from zero, clamped to [act_min, act_max].
 * Input and output share scale and zero point (TFLite requires it). */
#ifndef TFMCU_PATCH_KERNELS_AVG_POOL2D_H_
#define TFMCU_PATCH_KERNELS_AVG_POOL2D_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions outside the input box are border padding. Returns kTfmcuErrorEmptyWindow if a window holds no input
 * pixel at all (TFLite's kernel fails there too). */
TfmcuStatus tfmcu_avg_pool2d_s8(const TfmcuPoolParams* params, const TfmcuConstView* input, int32_t pad_top,
                                int32_t pad_left, const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): window geometry, params check, run on
 * inputs[1]. */
void tfmcu_avg_pool2d_op_window(const void* params, TfmcuWindow* window);
TfmcuStatus tfmcu_avg_pool2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_avg_pool2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_AVG_POOL2D_H_ */
