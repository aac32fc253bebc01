/* MAX_POOL_2D, int8 (TFLite's reference integer MaxPool): the maximum over the window's pixels that lie inside the
 * input (border padding never wins), clamped to [act_min, act_max]. */
#ifndef TFMCU_PATCH_KERNELS_MAX_POOL2D_H_
#define TFMCU_PATCH_KERNELS_MAX_POOL2D_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions outside the input box are border padding. A window without any input pixel gives -128 clamped to
 * [act_min, act_max], as in TFLite. */
TfmcuStatus tfmcu_max_pool2d_s8(const TfmcuPoolParams* params, const TfmcuConstView* input, int32_t pad_top,
                                int32_t pad_left, const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): window geometry, params check, run on
 * inputs[1]. */
void tfmcu_max_pool2d_op_window(const void* params, TfmcuWindow* window);
TfmcuStatus tfmcu_max_pool2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_max_pool2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_MAX_POOL2D_H_ */
