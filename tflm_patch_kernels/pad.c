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

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

/* A 1 x 1 window, stride 1: output pixel (y, x) reads input pixel (y - pad_top, x - pad_left). */
void tfmcu_pad_op_window(const void* params, TfmcuWindow* window) {
  (void)params;
  for (int32_t axis = 0; axis < 2; ++axis) {
    window->kernel[axis] = 1;
    window->stride[axis] = 1;
    window->dilation[axis] = 1;
  }
}

TfmcuStatus tfmcu_pad_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuPadParams* p = (const TfmcuPadParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (in_channels[0] != out_channels || p->value < -128 || p->value > 127) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_pad_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output) {
  return tfmcu_pad_s8((const TfmcuPadParams*)params, inputs, pad_top, pad_left, output);
}
