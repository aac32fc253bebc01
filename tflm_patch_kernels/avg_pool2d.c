/* AVERAGE_POOL_2D int8: see avg_pool2d.h. */
#include "avg_pool2d.h"

TfmcuStatus tfmcu_avg_pool2d_s8(const TfmcuPoolParams* params, const TfmcuConstView* input, int32_t pad_top,
                                int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (input->channels != output->channels) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t channels = output->channels;
  for (int32_t out_y = 0; out_y < output->height; ++out_y) {
    const int32_t in_y_origin = out_y * params->stride_h - pad_top;
    const int32_t fy_start = tfmcu_max_i32(0, -in_y_origin);
    const int32_t fy_end = tfmcu_min_i32(params->filter_h, input->height - in_y_origin);
    for (int32_t out_x = 0; out_x < output->width; ++out_x) {
      const int32_t in_x_origin = out_x * params->stride_w - pad_left;
      const int32_t fx_start = tfmcu_max_i32(0, -in_x_origin);
      const int32_t fx_end = tfmcu_min_i32(params->filter_w, input->width - in_x_origin);
      if (fy_end <= fy_start || fx_end <= fx_start) {
        return kTfmcuErrorEmptyWindow;
      }
      const int32_t count = (fy_end - fy_start) * (fx_end - fx_start);
      int8_t* out_pixel = output->data + (ptrdiff_t)out_y * output->row_stride + (ptrdiff_t)out_x * channels;
      for (int32_t c = 0; c < channels; ++c) {
        int32_t acc = 0;
        for (int32_t fy = fy_start; fy < fy_end; ++fy) {
          const int8_t* in_row = input->data + (ptrdiff_t)(in_y_origin + fy) * input->row_stride + c;
          for (int32_t fx = fx_start; fx < fx_end; ++fx) {
            acc += in_row[(ptrdiff_t)(in_x_origin + fx) * channels];
          }
        }
        /* Round half away from zero (C99 division truncates toward zero). */
        acc = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
        out_pixel[c] = (int8_t)tfmcu_clamp(acc, params->act_min, params->act_max);
      }
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

void tfmcu_avg_pool2d_op_window(const void* params, TfmcuWindow* window) {
  tfmcu_pool_window((const TfmcuPoolParams*)params, window);
}

TfmcuStatus tfmcu_avg_pool2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  return tfmcu_pool_check((const TfmcuPoolParams*)params, in_channels, out_channels);
}

TfmcuStatus tfmcu_avg_pool2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output) {
  return tfmcu_avg_pool2d_s8((const TfmcuPoolParams*)params, inputs, pad_top, pad_left, output);
}
