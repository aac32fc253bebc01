/* PAD / PADV2, int8, spatial padding only: copies the input box and fills the border around it with a value
 * (TFLite: the output zero point for PAD, the constant for PADV2). Only the output box asked for is written, so a
 * patch pays only for the padding that lies inside its own box. */
#ifndef TFMCU_PATCH_KERNELS_PAD_H_
#define TFMCU_PATCH_KERNELS_PAD_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t value;  /* fill value, an int8 in [-128, 127] */
} TfmcuPadParams;

/* Output pixel (y, x) = input pixel (y - pad_top, x - pad_left) where that lies inside the input box, else
 * `value` in every channel. Input and output have the same channels. */
TfmcuStatus tfmcu_pad_s8(const TfmcuPadParams* params, const TfmcuConstView* input, int32_t pad_top,
                         int32_t pad_left, const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): window geometry, params check, run on
 * inputs[1]. */
void tfmcu_pad_op_window(const void* params, TfmcuWindow* window);
TfmcuStatus tfmcu_pad_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
TfmcuStatus tfmcu_pad_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_PAD_H_ */
