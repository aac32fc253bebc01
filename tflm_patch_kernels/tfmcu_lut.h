/* A unary int8 op through a table: an int8 -> int8 function has 256 values, so a call over many elements builds the
 * table of its element function for that call (every int8 input through the same function, so the output is the
 * function's to the bit) and then looks each element up. HARD_SWISH, LOGISTIC, TANH and LEAKY_RELU run their
 * calls of at least TFMCU_LUT_MIN_ELEMENTS elements so (tfmcu/abi.py LUT_MIN_ELEMENTS; the latency predictor
 * prices such calls apart); ADD, SUB and MUL with a one-pixel operand 2 too (tfmcu_lut_lanes). The table lives on the stack for the call: no state between calls, nothing in the
 * arena. Each element is read before the element at the same position is written, so a call may run in place.
 */
#ifndef TFMCU_PATCH_KERNELS_TFMCU_LUT_H_
#define TFMCU_PATCH_KERNELS_TFMCU_LUT_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fewest elements a call maps through a table (twice the table's entries: the table's 256 evaluations are then
 * at most half of what the call would evaluate element by element). */
#define TFMCU_LUT_MIN_ELEMENTS 512

/* Whether a call of output view `output` maps through a table. */
static inline int tfmcu_lut_call(const TfmcuView* output) {
  return (int64_t)output->height * output->width * output->channels >= TFMCU_LUT_MIN_ELEMENTS;
}

/* output[e] = table[input[e] + 128] over the view (the same height, width and channels; row strides of their own). */
static inline void tfmcu_lut_map(const int8_t table[256], const TfmcuConstView* input, const TfmcuView* output) {
  const int32_t row_elements = output->width * output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    int32_t i = 0;
    for (; i + 4 <= row_elements; i += 4) {
      const int8_t a = table[in[i] + 128];
      const int8_t b = table[in[i + 1] + 128];
      const int8_t c = table[in[i + 2] + 128];
      const int8_t d = table[in[i + 3] + 128];
      out[i] = a;
      out[i + 1] = b;
      out[i + 2] = c;
      out[i + 3] = d;
    }
    for (; i < row_elements; ++i) {
      out[i] = table[in[i] + 128];
    }
  }
}

/* A binary op (ADD, SUB, MUL) whose operand 2 is one pixel (a 1 x 1 x C box: a constant, as Keras' Rescaling and
 * Normalization give, or a squeeze-excite's scale) is, per channel, a function of operand 1 alone: its calls map
 * through one table when every channel of operand 2 holds the same value (a scalar constant) and through one table
 * per channel when there are at most TFMCU_LUT_MAX_CHANNELS channels, each table built for the call by the op's
 * element function, when the call has at least that many tables times TFMCU_LUT_MIN_ELEMENTS elements. */
#define TFMCU_LUT_MAX_CHANNELS 4

/* The tables a call of output view `output` with the one-pixel operand 2 `operand` (its channels' values) maps
 * through: 1, its channels, or 0 (element by element). */
static inline int32_t tfmcu_lut_lanes(const int8_t* operand, const TfmcuView* output) {
  const int32_t channels = output->channels;
  int32_t lanes = 1;
  for (int32_t c = 1; c < channels; ++c) {
    if (operand[c] != operand[0]) {
      lanes = channels;
      break;
    }
  }
  if (lanes > TFMCU_LUT_MAX_CHANNELS) {
    return 0;
  }
  return (int64_t)output->height * output->width * channels >= (int64_t)lanes * TFMCU_LUT_MIN_ELEMENTS ? lanes : 0;
}

/* output[e] = tables[e's channel][input[e] + 128] over the view, `lanes` tables: 1 (every channel the same table)
 * or the view's channels. */
static inline void tfmcu_lut_map_lanes(const int8_t tables[][256], int32_t lanes, const TfmcuConstView* input,
                                       const TfmcuView* output) {
  if (lanes == 1) {
    tfmcu_lut_map(tables[0], input, output);
    return;
  }
  const int32_t channels = output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t x = 0; x < output->width; ++x) {
      for (int32_t c = 0; c < channels; ++c) {
        out[x * channels + c] = tables[c][in[x * channels + c] + 128];
      }
    }
  }
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_LUT_H_ */
