/* PAD int8: see pad.h. */
#include "pad.h"

TfmcuStatus tfmcu_pad_s8(const TfmcuPadParams* params, const TfmcuConstView* input, int32_t pad_top,
                         int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (input->channels != output->channels || params->value < -128 || params->value > 127) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t channels = output->channels;
  const int8_t fill = (int8_t)params->value;
  for (int32_t out_y = 0; out_y < output->height; ++out_y) {
    const int32_t in_y = out_y - pad_top;
    const int row_inside = in_y >= 0 && in_y < input->height;
    int8_t* out = output->data + (ptrdiff_t)out_y * output->row_stride;
    for (int32_t out_x = 0; out_x < output->width; ++out_x) {
      const int32_t in_x = out_x - pad_left;
      int8_t* out_pixel = out + (ptrdiff_t)out_x * channels;
      if (row_inside && in_x >= 0 && in_x < input->width) {
        const int8_t* in_pixel = input->data + (ptrdiff_t)in_y * input->row_stride + (ptrdiff_t)in_x * channels;
        for (int32_t c = 0; c < channels; ++c) {
          out_pixel[c] = in_pixel[c];
        }
      } else {
        for (int32_t c = 0; c < channels; ++c) {
          out_pixel[c] = fill;
        }
      }
    }
  }
  return kTfmcuOk;
}
