/* QUANTIZE float32 -> int8: see quantize.h. */
#include "quantize.h"

/* round(v) half away from zero, for |v| <= 1024 (no libm needed). v - trunc(v) is exact in float arithmetic. */
static int32_t tfmcu_round_half_away(float v) {
  const int32_t t = (int32_t)v;
  const float frac = v - (float)t;
  if (frac >= 0.5f) {
    return t + 1;
  }
  if (frac <= -0.5f) {
    return t - 1;
  }
  return t;
}

TfmcuStatus tfmcu_quantize_f32_s8(const TfmcuQuantizeParams* params, const TfmcuConstViewF32* input,
                                  const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (input->height != output->height || input->width != output->width || input->channels != output->channels) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t row_elements = output->width * output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const float* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t i = 0; i < row_elements; ++i) {
      float v = in[i] / params->scale;
      /* Beyond +-1024 the result saturates anyway (|zero_point| <= 128): clamping first keeps the int cast
       * defined. NaN compares false everywhere and becomes 0. */
      if (!(v >= -1024.0f)) {
        v = (v < 0.0f) ? -1024.0f : 0.0f;
      } else if (v > 1024.0f) {
        v = 1024.0f;
      }
      const int32_t q = tfmcu_round_half_away(v) + params->zero_point;
      out[i] = (int8_t)tfmcu_clamp(q, -128, 127);
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_quantize_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  if (params == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  return in_channels[0] == out_channels ? kTfmcuOk : kTfmcuErrorInvalidStage;
}

TfmcuStatus tfmcu_quantize_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                  int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  if (inputs == NULL) {
    return kTfmcuErrorNullPointer;
  }
  TfmcuConstViewF32 input;
  input.data = (const float*)(const void*)inputs[0].data;
  input.height = inputs[0].height;
  input.width = inputs[0].width;
  input.channels = inputs[0].channels;
  input.row_stride = inputs[0].row_stride;
  return tfmcu_quantize_f32_s8((const TfmcuQuantizeParams*)params, &input, output);
}
