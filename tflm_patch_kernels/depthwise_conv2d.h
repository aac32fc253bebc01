/* DEPTHWISE_CONV_2D, int8 (TFLite's reference DepthwiseConvPerChannel semantics), on one box of the input.
 *
 * Output channel m + c * depth_multiplier is computed from input channel c (depth_multiplier 1 in MobileNets).
 */
#ifndef TFMCU_PATCH_KERNELS_DEPTHWISE_CONV2D_H_
#define TFMCU_PATCH_KERNELS_DEPTHWISE_CONV2D_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const int8_t* filter;              /* [1][kernel_h][kernel_w][out_channels], read in place */
  const int32_t* bias;               /* [out_channels], or NULL */
  const int32_t* output_multiplier;  /* [out_channels], Q31 */
  const int32_t* output_shift;       /* [out_channels] */
  int32_t kernel_h;
  int32_t kernel_w;
  int32_t stride_h;
  int32_t stride_w;
  int32_t dilation_h;
  int32_t dilation_w;
  int32_t depth_multiplier;  /* out_channels / in_channels */
  int32_t input_offset;      /* -(input zero point) */
  int32_t output_offset;     /* output zero point */
  int32_t act_min;
  int32_t act_max;
} TfmcuDepthwiseConvParams;

/* Same geometry as tfmcu_conv2d_s8: positions outside the input box are border padding and skipped. */
TfmcuStatus tfmcu_depthwise_conv2d_s8(const TfmcuDepthwiseConvParams* params, const TfmcuConstView* input,
                                      int32_t pad_top, int32_t pad_left, const TfmcuView* output);

/* The same layer, the same bytes, for a 3x3 kernel with depth multiplier 1 and no dilation (depthwise_conv3x3.c):
 * per output pixel (in row order) its channels four at a time (the DSP extension's packed 16-bit multiplies where
 * the core has them, the same arithmetic in C elsewhere), the nine taps of an inner pixel without bounds checks, and
 * the requantization of tfmcu_requantize_short. Reads and writes in the order of CMSIS-NN's arm_depthwise_conv_3x3_s8
 * (each output pixel's channel group after its window's), so an in-place distance that holds for one holds for the
 * other. Any strides, paddings, offsets and row strides; no kernel buffer. kTfmcuErrorShapeMismatch when the layer
 * is not one tfmcu_depthwise_conv3x3_covers. */
int tfmcu_depthwise_conv3x3_covers(const TfmcuDepthwiseConvParams* params);
TfmcuStatus tfmcu_depthwise_conv3x3_s8(const TfmcuDepthwiseConvParams* params, const TfmcuConstView* input,
                                       int32_t pad_top, int32_t pad_left, const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): window geometry, params check, run on
 * inputs[1]. */
void tfmcu_depthwise_conv2d_op_window(const void* params, TfmcuWindow* window);
TfmcuStatus tfmcu_depthwise_conv2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
void tfmcu_depthwise_conv2d_op_array_sizes(const void* params, const int32_t* in_channels, int32_t out_channels,
                                           int32_t* elements);
TfmcuStatus tfmcu_depthwise_conv2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_DEPTHWISE_CONV2D_H_ */
