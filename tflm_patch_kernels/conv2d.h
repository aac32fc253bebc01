/* CONV_2D, int8 (TFLite's reference ConvPerChannel semantics), on one box of the input.
 *
 * Any kernel size, stride, dilation and group count; per-channel (or per-tensor, replicated) requantization with
 * offline multipliers/shifts; the fused activation as the clamp range [act_min, act_max].
 */
#ifndef TFMCU_PATCH_KERNELS_CONV2D_H_
#define TFMCU_PATCH_KERNELS_CONV2D_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const int8_t* filter;              /* [out_channels][kernel_h][kernel_w][in_channels / groups], read in place */
  const int32_t* bias;               /* [out_channels], or NULL */
  const int32_t* output_multiplier;  /* [out_channels], Q31 (TFLite QuantizeMultiplier) */
  const int32_t* output_shift;       /* [out_channels], > 0 left, < 0 right */
  int32_t kernel_h;
  int32_t kernel_w;
  int32_t stride_h;
  int32_t stride_w;
  int32_t dilation_h;
  int32_t dilation_w;
  int32_t groups;         /* in_channels / filter depth (1 for an ordinary convolution) */
  int32_t input_offset;   /* -(input zero point) */
  int32_t output_offset;  /* output zero point */
  int32_t act_min;
  int32_t act_max;
} TfmcuConvParams;

/* Computes output->height x output->width pixels. Output pixel (y, x) reads input rows
 * y * stride_h - pad_top + i * dilation_h (i < kernel_h), likewise columns; rows/columns outside the input box are
 * border padding and contribute nothing (= the input zero point). */
TfmcuStatus tfmcu_conv2d_s8(const TfmcuConvParams* params, const TfmcuConstView* input, int32_t pad_top,
                            int32_t pad_left, const TfmcuView* output);

/* The same layer, the same bytes, for a shallow window (conv2d_shallow.c): kernel_h x kernel_w x in_channels at most
 * TFMCU_CONV2D_SHALLOW_MAX_DEPTH values (3x3 over RGB: 27), at most TFMCU_CONV2D_SHALLOW_MAX_OUT output channels,
 * no groups or dilation, an input offset in [-127, 128]. Per pair of output pixels (in row-major order, a pair may
 * span two rows) both windows read
 * into int16 pairs with the offset added (taps outside the box 0), then per pair of output channels the filter's
 * words split by SXTB16 and multiplied two at a time (the DSP extension where the core has it, the same arithmetic
 * in C elsewhere), and the requantization of tfmcu_requantize_short. A pair's windows are read before its outputs
 * are written, as CMSIS-NN's arm_convolve_s8 reads its two im2col columns, so an in-place distance that holds for
 * one holds for the other. Any strides, paddings and row strides; no kernel buffer. kTfmcuErrorShapeMismatch when
 * the layer is not one tfmcu_conv2d_shallow_covers. */
#define TFMCU_CONV2D_SHALLOW_MAX_DEPTH 32
#define TFMCU_CONV2D_SHALLOW_MAX_OUT 32
int tfmcu_conv2d_shallow_covers(const TfmcuConvParams* params, int32_t in_channels, int32_t out_channels);
TfmcuStatus tfmcu_conv2d_shallow_s8(const TfmcuConvParams* params, const TfmcuConstView* input, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

/* The uniform op interface (tfmcu_common.h, listed in op_table.c): window geometry, params check, run on
 * inputs[1]. */
void tfmcu_conv2d_op_window(const void* params, TfmcuWindow* window);
TfmcuStatus tfmcu_conv2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels);
void tfmcu_conv2d_op_array_sizes(const void* params, const int32_t* in_channels, int32_t out_channels,
                                 int32_t* elements);
TfmcuStatus tfmcu_conv2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_CONV2D_H_ */
