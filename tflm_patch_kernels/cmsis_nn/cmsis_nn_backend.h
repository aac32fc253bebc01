/* The CMSIS-NN backend of the patch kernels (built with -DTFMCU_CMSIS_NN for Cortex-M; see tfmcu_common.h for the
 * backend seam and op_table.c for where it plugs in).
 *
 * CONV_2D, DEPTHWISE_CONV_2D, ADD, MUL, AVERAGE_POOL_2D and MAX_POOL_2D run through CMSIS-NN's s8 kernels
 * (arm_convolve_wrapper_s8, arm_depthwise_conv_wrapper_s8, arm_elementwise_add_s8, arm_elementwise_mul_s8,
 * arm_avgpool_s8, arm_max_pool_s8) on the patch buffers, with each tile's own top / left
 * padding (bottom / right padding is where the box ends, as in CMSIS-NN). CMSIS-NN reads and writes dense boxes
 * (row stride = width x channels); a patch buffer is dense, but the stage input (read in place) and the stage output
 * (written in place) are boxes inside whole tensors. Such a layer runs one output row per call: the output row is
 * always contiguous, and the input rows its window reads are copied into a staging area of the kernel buffer when the
 * input box is not dense. Results are bit-exact with the portable kernels (TFLite's reference kernels): CMSIS-NN
 * built without CMSIS_NN_USE_SINGLE_ROUNDING requantizes with TFLite's double rounding.
 *
 * Configurations CMSIS-NN does not cover the same way run the portable kernel: grouped or dilated convolutions,
 * depth multipliers other than 1, offsets outside CMSIS-NN's documented ranges (input offset [-127, 128], output
 * offset [-128, 127]), pooling tiles with a window that holds no input pixel (the portable kernel reports it), an
 * ADD or MUL whose input 2 is broadcast (1 x 1 x C). PAD, QUANTIZE, SUB, MEAN and the activations (HARD_SWISH,
 * LOGISTIC, TANH, LEAKY_RELU) are portable in every build (TFLM's CMSIS-NN build runs them with its reference
 * kernels too).
 *
 * Kernel buffer of a layer (the *_scratch functions; the stage's is their maximum, placed after the patch buffers at
 * prepare): CMSIS-NN's own *_get_buffer_size for the call's dimensions, rounded up to 4, plus kernel_h x input width
 * x channels of staging when the input box is not dense. tfmcu/plan/cmsis_nn.py computes the same offline.
 */
#ifndef TFMCU_PATCH_KERNELS_CMSIS_NN_CMSIS_NN_BACKEND_H_
#define TFMCU_PATCH_KERNELS_CMSIS_NN_CMSIS_NN_BACKEND_H_

#include "arm_nn_types.h"
#include "conv2d.h"
#include "depthwise_conv2d.h"
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 1x1 convolution of unit stride whose input offset the packer folded into its bias runs its calls of 2 or more
 * pixels through our product (conv1x1_folded.c), not CMSIS-NN's: it sums no filter rows per call and requantizes in
 * passes of one channel (tfmcu_requantize_short_pixels); over 8 input channels it unpacks each chunk of pixels once
 * and runs four SMLADs per output. Fewer instructions than CMSIS-NN's arm_nn_mat_mult_nt_t_s8 on every 1x1 shape of
 * the MobileNetV2 family //tflm_patch_kernels/firmware:fast_kernels measures (the bench section kernels:
 * docs/results/kernels.json). TFMCU_CONV1X1_FOLDED
 * (pixels, in_channels); tfmcu/abi.py states the same for the latency predictor (abi.conv1x1_folded). */
#define TFMCU_CONV1X1_FOLDED(pixels, in_channels) ((pixels) > 1)

/* A depthwise layer CMSIS-NN covers runs our 3x3 kernel (tfmcu_depthwise_conv3x3_s8) instead on cores with the DSP
 * extension and without Helium when it has a 3x3 kernel, depth multiplier 1, no dilation and at most
 * TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS channels (its per-call channel table: bias with the input offset,
 * multiplier, rounding and shift per channel, 2 KiB of stack): fewer instructions than CMSIS-NN's
 * arm_depthwise_conv_3x3_s8 on every MobileNet shape measured (docs/results/kernels.json). Its kernel buffer stays
 * CMSIS-NN's figure (tfmcu/plan/cmsis_nn.py), unused. */
#define TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS 128
#define TFMCU_DEPTHWISE_CONV3X3_OURS(p, channels) \
  (tfmcu_depthwise_conv3x3_covers(p) && (channels) <= TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS)

/* A convolution CMSIS-NN covers runs our kernel for shallow windows (tfmcu_conv2d_shallow_s8) instead of CMSIS-NN's
 * im2col product on cores with the DSP extension and without Helium when its kernel is larger than 1x1 (a 1x1 layer
 * takes the folded product) and tfmcu_conv2d_shallow_covers it: the first layer of an image network (3x3 over RGB),
 * fast_kernels' shapes in docs/results/kernels.json. Its kernel buffer stays CMSIS-NN's figure, unused. */
#define TFMCU_CONV2D_SHALLOW_OURS(p, in_channels, out_channels) \
  ((p)->kernel_h * (p)->kernel_w > 1 && tfmcu_conv2d_shallow_covers(p, in_channels, out_channels))

/* That product (conv1x1_folded.c; built with the DSP extension and without Helium): `rows` input pixels of `cols`
 * int8 by the `out_c` filter rows of `p` (input offset 0), requantized per output channel into `out` (rows x out_c). */
void tfmcu_conv1x1_folded_s8(const TfmcuConvParams* p, const int8_t* in, int32_t rows, int32_t cols, int32_t out_c,
                             int8_t* out);

/* The op-table entries (TfmcuOpBackendRunFn / TfmcuOpBackendScratchFn). */
TfmcuStatus tfmcu_conv2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                      int32_t pad_left, const TfmcuView* output,
                                      const TfmcuKernelScratch* kernel_scratch);
int32_t tfmcu_conv2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                      int32_t pad_left, const TfmcuView* output);
TfmcuStatus tfmcu_depthwise_conv2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                                int32_t pad_left, const TfmcuView* output,
                                                const TfmcuKernelScratch* kernel_scratch);
int32_t tfmcu_depthwise_conv2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs,
                                                int32_t pad_top, int32_t pad_left, const TfmcuView* output);
TfmcuStatus tfmcu_add_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                   int32_t pad_left, const TfmcuView* output,
                                   const TfmcuKernelScratch* kernel_scratch);
TfmcuStatus tfmcu_mul_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                   int32_t pad_left, const TfmcuView* output,
                                   const TfmcuKernelScratch* kernel_scratch);
TfmcuStatus tfmcu_avg_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch);
int32_t tfmcu_avg_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output);
TfmcuStatus tfmcu_max_pool2d_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output,
                                          const TfmcuKernelScratch* kernel_scratch);
int32_t tfmcu_max_pool2d_cmsis_nn_scratch(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output);

/* ------------------------------------------------------------------ shared by the window ops (window_rows.c) */

/* One CMSIS-NN call of a window op on a dense input box (in_dims, in) with `pad_top` rows of padding above it,
 * writing the dense output box (out_dims, out); ctx: the CMSIS-NN buffer. */
typedef arm_cmsis_nn_status (*TfmcuCmsisWindowCall)(const void* args, const cmsis_nn_context* ctx,
                                                     const cmsis_nn_dims* in_dims, const int8_t* in,
                                                     int32_t pad_top, const cmsis_nn_dims* out_dims, int8_t* out);

/* Whether a box is dense (CMSIS-NN's layout: row stride = width x channels). */
static inline int tfmcu_cmsis_dense(int32_t height, int32_t width, int32_t channels, int32_t row_stride) {
  return height <= 1 || row_stride == width * channels;
}

/* Staging bytes a window op with `kernel_h` rows needs for this input box (0 when it is dense). */
int32_t tfmcu_cmsis_staging_bytes(const TfmcuConstView* input, int32_t kernel_h);

/* Runs `call` on the views: one call when both boxes are dense, else one call per output row (copying the rows a
 * non-dense input's window reads to the staging area after the first `cmsis_bytes` of the kernel buffer). Stride
 * `stride_h`, `kernel_h` rows, dilation 1. Returns kTfmcuErrorScratchTooSmall when the kernel buffer is smaller than
 * cmsis_bytes + the staging the input needs, kTfmcuErrorShapeMismatch when CMSIS-NN rejects the call. */
TfmcuStatus tfmcu_cmsis_window_rows(TfmcuCmsisWindowCall call, const void* args, const TfmcuConstView* input,
                                    int32_t pad_top, int32_t kernel_h, int32_t stride_h, const TfmcuView* output,
                                    const TfmcuKernelScratch* kernel_scratch, int32_t cmsis_bytes);

/* ------------------------------------------------------------------ shared by the pooling ops (window_rows.c) */

/* arm_avgpool_s8 and arm_max_pool_s8. */
typedef arm_cmsis_nn_status (*TfmcuCmsisPoolFn)(const cmsis_nn_context* ctx, const cmsis_nn_pool_params* pool_params,
                                                const cmsis_nn_dims* input_dims, const int8_t* src,
                                                const cmsis_nn_dims* filter_dims, const cmsis_nn_dims* output_dims,
                                                int8_t* dst);

/* A pooling tile (params: TfmcuPoolParams) through `pool` with `cmsis_bytes` of CMSIS-NN buffer, one call or one per
 * output row (tfmcu_cmsis_window_rows); `portable` (the op's portable run) when CMSIS-NN does not cover the tile:
 * channels differ, or a window holds no input pixel (CMSIS-NN's max pool does not check it; windows move
 * monotonically, so the first and the last output of each axis decide). */
TfmcuStatus tfmcu_cmsis_pool_run(TfmcuCmsisPoolFn pool, TfmcuOpRunFn portable, int32_t cmsis_bytes,
                                 const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                                 const TfmcuView* output, const TfmcuKernelScratch* kernel_scratch);
/* Its kernel buffer: align4(cmsis_bytes) + the staging rows of a non-dense input (0 when not covered). */
int32_t tfmcu_cmsis_pool_scratch(int32_t cmsis_bytes, const void* params, const TfmcuConstView* inputs,
                                 int32_t pad_top, int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_CMSIS_NN_CMSIS_NN_BACKEND_H_ */
