/* LOGISTIC int8: see logistic.h. */
#include "logistic.h"

#include "tfmcu_lut.h"

#include "tfmcu_fixedpoint.h"

static int8_t tfmcu_logistic_element(const TfmcuLogisticParams* params, int8_t x) {
  const int32_t input = (int32_t)x - params->input_zero_point;
  if (input <= -params->input_range_radius) {
    return INT8_MIN;
  }
  if (input >= params->input_range_radius) {
    return INT8_MAX;
  }
  const int32_t input_in_q4 =
      tfmcu_multiply_by_quantized_multiplier(input, params->input_multiplier, params->input_left_shift);
  const int32_t output_in_q23 = tfmcu_rounding_divide_by_pot(tfmcu_fp_logistic_q4(input_in_q4), 31 - 8);
  return (int8_t)tfmcu_clamp(output_in_q23 - 128, INT8_MIN, INT8_MAX);
}

TfmcuStatus tfmcu_logistic_s8(const TfmcuLogisticParams* params, const TfmcuConstView* input,
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
      table[v + 128] = tfmcu_logistic_element(params, (int8_t)v);
    }
    tfmcu_lut_map(table, input, output);
    return kTfmcuOk;
  }
  const int32_t row_elements = output->width * output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t i = 0; i < row_elements; ++i) {
      out[i] = tfmcu_logistic_element(params, in[i]);
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_logistic_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuLogisticParams* p = (const TfmcuLogisticParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (in_channels[0] != out_channels || !tfmcu_offset_valid(p->input_zero_point) ||
      p->input_multiplier < ((int32_t)1 << 30) || p->input_left_shift < 0 ||
      p->input_left_shift > TFMCU_LOGISTIC_MAX_LEFT_SHIFT ||
      p->input_range_radius != tfmcu_fp_input_radius_q4(p->input_left_shift)) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_logistic_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                  int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  return tfmcu_logistic_s8((const TfmcuLogisticParams*)params, inputs, output);
}
