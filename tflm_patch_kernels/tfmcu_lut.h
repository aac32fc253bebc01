/* A unary int8 op through a table: an int8 -> int8 function has 256 values, so a call over many elements builds the
 * table of its element function for that call (every int8 input through the same function, so the output is the
 * function's to the bit) and then looks each element up. HARD_SWISH, LOGISTIC, TANH and LEAKY_RELU run their
 * calls of at least TFMCU_LUT_MIN_ELEMENTS elements so (tfmcu/abi.py LUT_MIN_ELEMENTS; the latency predictor
 * prices such calls apart). The table lives on the stack for the call: no state between calls, nothing in the
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

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_LUT_H_ */
