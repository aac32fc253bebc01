/* DEPTHWISE_CONV_2D int8: see depthwise_conv2d.h. */
#include "conv_common.h"
#include "depthwise_conv2d.h"

TfmcuStatus tfmcu_depthwise_conv2d_s8(const TfmcuDepthwiseConvParams* params, const TfmcuConstView* input,
                                      int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL || params->filter == NULL ||
      params->output_multiplier == NULL || params->output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const int32_t in_channels = input->channels;
  const int32_t out_channels = output->channels;
  const int32_t multiplier = params->depth_multiplier;
  if (multiplier <= 0 || in_channels * multiplier != out_channels) {
    return kTfmcuErrorShapeMismatch;
  }

  for (int32_t out_y = 0; out_y < output->height; ++out_y) {
    const int32_t in_y_origin = out_y * params->stride_h - pad_top;
    int8_t* out_row = output->data + (ptrdiff_t)out_y * output->row_stride;
    for (int32_t out_x = 0; out_x < output->width; ++out_x) {
      const int32_t in_x_origin = out_x * params->stride_w - pad_left;
      int8_t* out_pixel = out_row + (ptrdiff_t)out_x * out_channels;
      for (int32_t in_c = 0; in_c < in_channels; ++in_c) {
        for (int32_t m = 0; m < multiplier; ++m) {
          const int32_t out_c = m + in_c * multiplier;
          int32_t acc = 0;
          for (int32_t fy = 0; fy < params->kernel_h; ++fy) {
            const int32_t in_y = in_y_origin + fy * params->dilation_h;
            if (in_y < 0 || in_y >= input->height) {
              continue;  /* border padding */
            }
            const int8_t* in_row = input->data + (ptrdiff_t)in_y * input->row_stride + in_c;
            const int8_t* filter_row = params->filter + (ptrdiff_t)fy * params->kernel_w * out_channels + out_c;
            for (int32_t fx = 0; fx < params->kernel_w; ++fx) {
              const int32_t in_x = in_x_origin + fx * params->dilation_w;
              if (in_x < 0 || in_x >= input->width) {
                continue;
              }
              const int32_t in_val = in_row[(ptrdiff_t)in_x * in_channels];
              const int32_t filter_val = filter_row[(ptrdiff_t)fx * out_channels];
              acc = tfmcu_wrap_add(acc, filter_val * (in_val + params->input_offset));
            }
          }
          out_pixel[out_c] = tfmcu_conv_requantize(acc, params->bias, out_c, params->output_multiplier,
                                                   params->output_shift, params->output_offset, params->act_min,
                                                   params->act_max);
        }
      }
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

void tfmcu_depthwise_conv2d_op_window(const void* params, TfmcuWindow* window) {
  const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)params;
  tfmcu_set_window(window, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->dilation_h, p->dilation_w);
}

TfmcuStatus tfmcu_depthwise_conv2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  TfmcuWindow window;
  tfmcu_depthwise_conv2d_op_window(params, &window);
  return tfmcu_conv_check(p->filter, p->output_multiplier, p->output_shift,
                          p->depth_multiplier > 0 && (int64_t)in_channels[0] * p->depth_multiplier == out_channels,
                          &window, p->act_min, p->act_max, p->input_offset, p->output_offset);
}

TfmcuStatus tfmcu_depthwise_conv2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                          int32_t pad_left, const TfmcuView* output) {
  return tfmcu_depthwise_conv2d_s8((const TfmcuDepthwiseConvParams*)params, inputs, pad_top, pad_left, output);
}

void tfmcu_depthwise_conv2d_op_array_sizes(const void* params, const int32_t* in_channels, int32_t out_channels,
                                           int32_t* elements) {
  (void)in_channels;  /* the filter holds out_channels = in_channels * depth_multiplier columns */
  const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)params;
  const int32_t filter[3] = {p->kernel_h, p->kernel_w, out_channels};
  elements[0] = tfmcu_elements_product(filter, 3);  /* filter */
  elements[1] = out_channels;  /* bias */
  elements[2] = out_channels;  /* output_multiplier */
  elements[3] = out_channels;  /* output_shift */
}
