/* LEAKY_RELU int8: see leaky_relu.h. */
#include "leaky_relu.h"

#include "tfmcu_lut.h"

static int8_t tfmcu_leaky_relu_element(const TfmcuLeakyReluParams* p, int8_t x) {
  const int32_t input_value = (int32_t)x - p->input_zero_point;
  int32_t scaled;
  if (input_value >= 0) {
    scaled = tfmcu_multiply_by_quantized_multiplier(input_value, p->output_multiplier_identity,
                                                    p->output_shift_identity);
  } else if (p->output_multiplier_alpha < 0) {
    scaled = (int32_t)(0u - (uint32_t)tfmcu_multiply_by_quantized_multiplier(
                                 input_value, -p->output_multiplier_alpha, p->output_shift_alpha));
  } else {
    scaled = tfmcu_multiply_by_quantized_multiplier(input_value, p->output_multiplier_alpha, p->output_shift_alpha);
  }
  return (int8_t)tfmcu_clamp(tfmcu_wrap_add(p->output_zero_point, scaled), INT8_MIN, INT8_MAX);
}

TfmcuStatus tfmcu_leaky_relu_s8(const TfmcuLeakyReluParams* params, const TfmcuConstView* input,
                                const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (input->height != output->height || input->width != output->width || input->channels != output->channels) {
    return kTfmcuErrorShapeMismatch;
  }
  if (tfmcu_lut_call(output)) {
    int8_t table[256];
    for (int32_t v = INT8_MIN; v <= INT8_MAX; ++v) {
      table[v + 128] = tfmcu_leaky_relu_element(params, (int8_t)v);
    }
    tfmcu_lut_map(table, input, output);
    return kTfmcuOk;
  }
  const int32_t row_elements = output->width * output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t i = 0; i < row_elements; ++i) {
      out[i] = tfmcu_leaky_relu_element(params, in[i]);
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_leaky_relu_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuLeakyReluParams* p = (const TfmcuLeakyReluParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const int32_t shifts[2] = {p->output_shift_alpha, p->output_shift_identity};
  if (in_channels[0] != out_channels || !tfmcu_offset_valid(p->input_zero_point) ||
      !tfmcu_offset_valid(p->output_zero_point) || p->output_multiplier_alpha == INT32_MIN ||
      p->output_multiplier_identity < 0 || !tfmcu_shifts_valid(shifts, 2)) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_leaky_relu_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  return tfmcu_leaky_relu_s8((const TfmcuLeakyReluParams*)params, inputs, output);
}
