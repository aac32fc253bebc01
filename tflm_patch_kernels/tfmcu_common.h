/* Shared types and integer math of the tfmcu patch kernels (portable C99, no allocation, no globals).
 *
 * Tensors are int8 NHWC feature maps with batch 1. A kernel never sees a whole tensor: it sees a *view*, a box of
 * rows x columns x all channels inside some larger buffer (a patch buffer in scratch memory, or the full stage
 * input / output). Channels are contiguous, one pixel follows the other (pixel stride = channels), and
 * `row_stride` elements separate two rows (>= width * channels when the box is narrower than its buffer).
 *
 * Border padding: window kernels take the rows/columns of padding that lie above/left of their input box
 * (pad_top, pad_left). Input positions outside the box are *not read*: a convolution skips them (the same as
 * reading the input zero point, as TFLite's reference kernels do at the image border), pooling leaves them out of
 * the window (TFLite averages over valid pixels only), PAD writes its fill value there. The caller (the patch
 * executor) guarantees that every position outside the box is outside the feature map, so no padding is ever
 * materialised for a conv, depthwise conv or pooling layer.
 *
 * The fixed-point helpers reproduce TFLite's reference integer math bit for bit (gemmlowp's
 * SaturatingRoundingDoublingHighMul and RoundingDivideByPOT, TFLite's double-rounding
 * MultiplyByQuantizedMultiplier). Quantized multipliers and shifts are computed offline (tfmcu/kernels/quant.py,
 * TFLite's QuantizeMultiplier); shift > 0 is a left shift, shift < 0 a right shift, as in TFLite.
 */
#ifndef TFMCU_PATCH_KERNELS_TFMCU_COMMON_H_
#define TFMCU_PATCH_KERNELS_TFMCU_COMMON_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes returned by the kernels and the stage executor (0 = success). */
typedef enum {
  kTfmcuOk = 0,
  kTfmcuErrorNullPointer = 1,      /* a required pointer is NULL */
  kTfmcuErrorScratchTooSmall = 2,  /* scratch_size < the stage's scratch_bytes */
  kTfmcuErrorInvalidStage = 3,     /* the stage description is inconsistent (see tfmcu_stage_check) */
  kTfmcuErrorUnsupportedOp = 4,    /* unknown layer type or data type */
  kTfmcuErrorShapeMismatch = 5,    /* channels / box sizes of a kernel call do not fit together */
  kTfmcuErrorEmptyWindow = 6       /* an average-pool window with no valid input pixel (TFLite fails too) */
} TfmcuStatus;

/* A read-only int8 box: `data` points at (row 0, column 0, channel 0) of the box. */
typedef struct {
  const int8_t* data;
  int32_t height;
  int32_t width;
  int32_t channels;
  int32_t row_stride; /* elements from one row of the box to the next */
} TfmcuConstView;

/* A writable int8 box (same layout). */
typedef struct {
  int8_t* data;
  int32_t height;
  int32_t width;
  int32_t channels;
  int32_t row_stride;
} TfmcuView;

/* A read-only float32 box (the float input of a QUANTIZE layer). */
typedef struct {
  const float* data;
  int32_t height;
  int32_t width;
  int32_t channels;
  int32_t row_stride;
} TfmcuConstViewF32;

/* Window geometry shared by AVERAGE_POOL_2D and MAX_POOL_2D. act_min/act_max: the fused activation as an int8
 * clamp range (TFLite's CalculateActivationRangeQuantized, computed offline). */
typedef struct {
  int32_t filter_h;
  int32_t filter_w;
  int32_t stride_h;
  int32_t stride_w;
  int32_t act_min;
  int32_t act_max;
} TfmcuPoolParams;

/* ------------------------------------------------------------------------------ the uniform op interface
 * Besides its kernel (the plain math, e.g. tfmcu_conv2d_s8), every op's .c file defines three adapters with the
 * signatures below; op_table.c lists them, one row per op type, and the stage executor and tfmcu_op_run use
 * nothing else (no per-op switch anywhere). `params` points at the op's params struct. */

/* Window geometry along the rows (index 0) and the columns (index 1): output position o reads input positions
 * o * stride - pad + i * dilation, i < kernel. */
typedef struct {
  int32_t kernel[2];
  int32_t stride[2];
  int32_t dilation[2];
} TfmcuWindow;

/* Fills *window from params that passed the op's check (window ops only; PAD is a 1 x 1 window that may run past
 * the border). */
typedef void (*TfmcuOpWindowFn)(const void* params, TfmcuWindow* window);

/* Checks the params against the channels of the op's inputs (in_channels[num_inputs]) and output: returns
 * kTfmcuOk, kTfmcuErrorNullPointer (NULL params or a NULL array the params must point to) or
 * kTfmcuErrorInvalidStage. */
typedef TfmcuStatus (*TfmcuOpCheckFn)(const void* params, const int32_t* in_channels, int32_t out_channels);

/* The constant arrays an op's params point to, in the order of the struct's leading pointer fields: filter (int8),
 * bias, output_multiplier, output_shift (int32). Fills elements[k] with the number of elements array k must hold,
 * for params that passed the op's check (only ops with arrays have this adapter). */
#define TFMCU_MAX_PARAM_ARRAYS 4
typedef void (*TfmcuOpArraySizesFn)(const void* params, const int32_t* in_channels, int32_t out_channels,
                                    int32_t* elements);

/* Runs the kernel on inputs[num_inputs] (one view per input; for a float32 input, `data` points at floats and
 * row_stride counts floats) with the border padding above / left of input 0 (ignored by pointwise ops). Returns
 * the kernel's status. */
typedef TfmcuStatus (*TfmcuOpRunFn)(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output);

/* Reductions (MEAN): the op's output is 1 x 1 x C and a patch stage computes it patch by patch. accumulate adds the
 * per-channel int32 sums of one box of inputs[0] to `sums` (C int32 in native byte order, any alignment); finish
 * writes the output from the sums of `count` pixels. NULL for every other op. */
typedef void (*TfmcuOpAccumulateFn)(const void* params, const TfmcuConstView* inputs, int8_t* sums);
typedef TfmcuStatus (*TfmcuOpFinishFn)(const void* params, const int8_t* sums, int32_t count,
                                       const TfmcuView* output);

/* ------------------------------------------------------------------------------ the optimised-backend seam
 * A build may give an op a second, optimised implementation (the CMSIS-NN backend: -DTFMCU_CMSIS_NN,
 * the files in cmsis_nn/), listed in the same table row (op_table.c). It runs on the same views with the same results (bit for
 * bit), may call the portable kernel for configurations it does not cover, and may use a kernel buffer: a part of
 * the stage's scratch memory after the patch buffers, sized once in tfmcu_stage_prepare from the backend's scratch
 * adapter (the largest need over every layer and patch), so the whole scratch is known before the first run. */
typedef struct {
  int8_t* data;   /* 4-byte aligned when bytes > 0 */
  int32_t bytes;
} TfmcuKernelScratch;

/* Bytes of kernel buffer the backend needs to run the op on boxes of these sizes and row strides with this border
 * padding (views with data == NULL: only the sizes and strides are read). */
typedef int32_t (*TfmcuOpBackendScratchFn)(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                           int32_t pad_left, const TfmcuView* output);

/* The backend's run: as TfmcuOpRunFn, with the kernel buffer (kTfmcuErrorScratchTooSmall when it is smaller than
 * the scratch adapter said). */
typedef TfmcuStatus (*TfmcuOpBackendRunFn)(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                           int32_t pad_left, const TfmcuView* output,
                                           const TfmcuKernelScratch* kernel_scratch);

/* gemmlowp SaturatingRoundingDoublingHighMul: high 32 bits of 2*a*b, rounded half away from zero, saturating the
 * single overflow case a == b == INT32_MIN. */
static inline int32_t tfmcu_saturating_rounding_doubling_high_mul(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) {
    return INT32_MAX;
  }
  const int64_t ab = (int64_t)a * (int64_t)b;
  const int64_t nudge = ab >= 0 ? ((int64_t)1 << 30) : (1 - ((int64_t)1 << 30));
  /* C99 division truncates toward zero, like the C++ original. */
  return (int32_t)((ab + nudge) / ((int64_t)1 << 31));
}

/* Arithmetic shift right (floor division by 2^exponent) without relying on implementation-defined >> of negative
 * values. */
static inline int32_t tfmcu_shift_right_floor(int32_t x, int32_t exponent) {
  return x >= 0 ? (x >> exponent) : ~((~x) >> exponent);
}

/* gemmlowp RoundingDivideByPOT: x / 2^exponent rounded to nearest, ties away from zero. 0 <= exponent <= 31. */
static inline int32_t tfmcu_rounding_divide_by_pot(int32_t x, int32_t exponent) {
  const int32_t mask = (int32_t)(((int64_t)1 << exponent) - 1);
  const int32_t remainder = x & mask;
  const int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
  return tfmcu_shift_right_floor(x, exponent) + (remainder > threshold ? 1 : 0);
}

/* TFLite's MultiplyByQuantizedMultiplier (double rounding, the default build): x * multiplier * 2^shift with
 * multiplier a Q31 value in [2^30, 2^31). A left shift wraps like the 32-bit hardware multiply TFLite performs. */
static inline int32_t tfmcu_multiply_by_quantized_multiplier(int32_t x, int32_t multiplier, int32_t shift) {
  const int32_t left_shift = shift > 0 ? shift : 0;
  const int32_t right_shift = shift > 0 ? 0 : -shift;
  const int32_t shifted = (int32_t)((uint32_t)x << left_shift);
  return tfmcu_rounding_divide_by_pot(tfmcu_saturating_rounding_doubling_high_mul(shifted, multiplier),
                                      right_shift);
}

/* Whether tfmcu_requantize_short gives tfmcu_multiply_by_quantized_multiplier's value for a channel (with
 * TFMCU_SHORT_QUANT_MAX_RIGHT): a right shift of 2 or more and a multiplier above 2^30 (almost every channel
 * TFLite's QuantizeMultiplier gives a conv). Why it is exact: with M > 2^30, SaturatingRoundingDoublingHighMul(x, M)
 * = floor((x M + 2^30) / 2^31) (no saturation: M is positive), it is negative exactly when x is, and
 * RoundingDivideByPOT(h, e) = floor((h + 2^(e-1) - [h < 0]) / 2^e); both floors merge into
 * floor((x M + 2^30 - [x < 0] 2^31 + 2^(30+e)) / 2^(31+e)), and for e >= 2 the last term only adds 2^(e-2) to the
 * high word. tests: fast_kernels_fuzz.c compares both over the multiplier / shift grid. */
static inline int tfmcu_requantize_fast_ok(int32_t multiplier, int32_t shift) {
  return multiplier > ((int32_t)1 << 30) && shift <= -2 && shift >= -31;
}

/* The high word of a 64-bit value (floor(v / 2^32)), without implementation-defined shifts of negative values
 * (GCC and Clang compile it to the register that holds it). */
static inline int32_t tfmcu_high_word(int64_t v) {
  return v >= 0 ? (int32_t)(v >> 32) : ~(int32_t)((~v) >> 32);
}

/* That arithmetic with a channel's constants made once, and the output offset added before the
 * shift (a multiple of 2^right commutes with the floor shift; right <= TFMCU_SHORT_QUANT_MAX_RIGHT keeps the sum
 * inside int32): per output a 32 x 32 -> 64-bit multiply-accumulate with a nudge made of the accumulator's sign, an
 * add and a shift. The result is tfmcu_multiply_by_quantized_multiplier's plus the output offset. */
typedef struct {
  int32_t multiplier, round, right;
} TfmcuShortQuant;

#define TFMCU_SHORT_QUANT_MAX_RIGHT 22

static inline int tfmcu_short_quant_ok(int32_t multiplier, int32_t shift) {
  return tfmcu_requantize_fast_ok(multiplier, shift) && -shift - 1 <= TFMCU_SHORT_QUANT_MAX_RIGHT;
}

/* For a channel tfmcu_short_quant_ok accepts. */
static inline TfmcuShortQuant tfmcu_short_quant(int32_t multiplier, int32_t shift, int32_t output_offset) {
  const int32_t right = -shift - 1;
  const TfmcuShortQuant f = {multiplier,
                             ((int32_t)1 << (right - 1)) + (int32_t)((uint32_t)output_offset << right), right};
  return f;
}

static inline int32_t tfmcu_requantize_short(int32_t acc, TfmcuShortQuant f) {
  /* the nudge +-2^30 as its two words: high = the sign (0 or -1), low = 2^30 with acc's sign bit (the words convert
   * as they are on the two's complement machines this runs on) */
  const uint32_t high = (uint32_t)tfmcu_shift_right_floor(acc, 31);
  const uint32_t low = ((uint32_t)acc & 0x80000000u) | 0x40000000u;
  const int64_t nudge = (int64_t)(((uint64_t)high << 32) | low);
  return tfmcu_shift_right_floor(tfmcu_high_word((int64_t)acc * f.multiplier + nudge) + f.round, f.right);
}

/* a + b wrapping modulo 2^32 like the hardware adder (no undefined behaviour when params from a model file would
 * overflow; the same value as a plain int32 sum whenever that sum fits, i.e. for every valid model). */
static inline int32_t tfmcu_wrap_add(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a + (uint32_t)b);
}

/* A zero-point offset as int8 quantization gives it (|zero point| <= 255 covers int8 and uint8 ranges). */
static inline int tfmcu_offset_valid(int32_t offset) {
  return offset >= -255 && offset <= 255;
}

/* Whether shifts[0..n) are all in the range tfmcu_multiply_by_quantized_multiplier accepts (-31..31; TFLite's
 * QuantizeMultiplier gives -31..30). Per-channel shifts come from a model file: check them before running. */
static inline int tfmcu_shifts_valid(const int32_t* shifts, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (shifts[i] < -31 || shifts[i] > 31) {
      return 0;
    }
  }
  return 1;
}

static inline int32_t tfmcu_clamp(int32_t x, int32_t lo, int32_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

/* The operands of a binary element-wise op (ADD, SUB, MUL): input 1 is a box of the output's size; input 2 is
 * either a box of the output's size too, or a 1 x 1 x C box broadcast over space (per channel: one value per output
 * channel for every pixel, e.g. a squeeze-excite scale or a constant operand). Returns the elements input 2 advances
 * from one output pixel to the next (channels for a box of the output's size, 0 for a broadcast one), or -1 when
 * the boxes do not fit together. A 1 x 1 output takes a 1 x 1 input 2 as a box of its size (the same thing). */
static inline int32_t tfmcu_operand2_pixel_step(const TfmcuConstView* input1, const TfmcuConstView* input2,
                                                const TfmcuView* output) {
  if (input1->height != output->height || input1->width != output->width ||
      input1->channels != output->channels || input2->channels != output->channels) {
    return -1;
  }
  if (input2->height == output->height && input2->width == output->width) {
    return output->channels;
  }
  return input2->height == 1 && input2->width == 1 ? 0 : -1;
}

/* The product of factors[0..n), saturated to INT32_MAX (a constant array's element count from params that may be
 * anything in a model file: INT32_MAX is too large for any model); a negative factor counts as 0. */
static inline int32_t tfmcu_elements_product(const int32_t* factors, int32_t n) {
  int64_t product = 1;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t f = factors[i] > 0 ? factors[i] : 0;
    product = f != 0 && product > INT32_MAX / f ? INT32_MAX : product * f;
  }
  return (int32_t)product;
}

static inline int32_t tfmcu_max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t tfmcu_min_i32(int32_t a, int32_t b) { return a < b ? a : b; }

/* The op-interface helpers AVERAGE_POOL_2D and MAX_POOL_2D share (their params are the same struct). */
/* A window's geometry (rows, then columns), and whether it is usable (every size positive). */
static inline void tfmcu_set_window(TfmcuWindow* window, int32_t kernel_h, int32_t kernel_w, int32_t stride_h,
                                    int32_t stride_w, int32_t dilation_h, int32_t dilation_w) {
  window->kernel[0] = kernel_h;
  window->kernel[1] = kernel_w;
  window->stride[0] = stride_h;
  window->stride[1] = stride_w;
  window->dilation[0] = dilation_h;
  window->dilation[1] = dilation_w;
}

static inline int tfmcu_window_valid(const TfmcuWindow* w) {
  return w->kernel[0] > 0 && w->kernel[1] > 0 && w->stride[0] > 0 && w->stride[1] > 0 && w->dilation[0] > 0 &&
         w->dilation[1] > 0;
}

static inline void tfmcu_pool_window(const TfmcuPoolParams* p, TfmcuWindow* window) {
  tfmcu_set_window(window, p->filter_h, p->filter_w, p->stride_h, p->stride_w, 1, 1);
}

static inline TfmcuStatus tfmcu_pool_check(const TfmcuPoolParams* p, const int32_t* in_channels,
                                           int32_t out_channels) {
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (in_channels[0] != out_channels || p->filter_h <= 0 || p->filter_w <= 0 || p->stride_h <= 0 ||
      p->stride_w <= 0 || p->act_min > p->act_max) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_COMMON_H_ */
