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
