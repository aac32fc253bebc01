/* CONV_2D int8: see conv2d.h. Plain loops over output pixels, output channels, the window and input channels,
 * accumulating in 32 bits exactly like TFLite's reference kernel. */
#include "conv2d.h"
#include "conv_common.h"

TfmcuStatus tfmcu_conv2d_s8(const TfmcuConvParams* params, const TfmcuConstView* input, int32_t pad_top,
                            int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL || params->filter == NULL ||
      params->output_multiplier == NULL || params->output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const int32_t in_channels = input->channels;
  const int32_t out_channels = output->channels;
  const int32_t groups = params->groups;
  if (groups <= 0 || in_channels % groups != 0 || out_channels % groups != 0) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t filter_depth = in_channels / groups;
  const int32_t filters_per_group = out_channels / groups;
  const int32_t filter_size = params->kernel_h * params->kernel_w * filter_depth;

  for (int32_t out_y = 0; out_y < output->height; ++out_y) {
    const int32_t in_y_origin = out_y * params->stride_h - pad_top;
    int8_t* out_row = output->data + (ptrdiff_t)out_y * output->row_stride;
    for (int32_t out_x = 0; out_x < output->width; ++out_x) {
      const int32_t in_x_origin = out_x * params->stride_w - pad_left;
      int8_t* out_pixel = out_row + (ptrdiff_t)out_x * out_channels;
      for (int32_t out_c = 0; out_c < out_channels; ++out_c) {
        const int32_t group = out_c / filters_per_group;
        const int8_t* in_group = input->data + (ptrdiff_t)group * filter_depth;
        const int8_t* filter = params->filter + (ptrdiff_t)out_c * filter_size;
        int32_t acc = 0;
        for (int32_t fy = 0; fy < params->kernel_h; ++fy) {
          const int32_t in_y = in_y_origin + fy * params->dilation_h;
          if (in_y < 0 || in_y >= input->height) {
            continue;  /* border padding */
          }
          for (int32_t fx = 0; fx < params->kernel_w; ++fx) {
            const int32_t in_x = in_x_origin + fx * params->dilation_w;
            if (in_x < 0 || in_x >= input->width) {
              continue;
            }
            const int8_t* in_pixel = in_group + (ptrdiff_t)in_y * input->row_stride + (ptrdiff_t)in_x * in_channels;
            const int8_t* f = filter + (ptrdiff_t)(fy * params->kernel_w + fx) * filter_depth;
            for (int32_t c = 0; c < filter_depth; ++c) {
              acc = tfmcu_wrap_add(acc, (int32_t)f[c] * ((int32_t)in_pixel[c] + params->input_offset));
            }
          }
        }
        out_pixel[out_c] = tfmcu_conv_requantize(acc, params->bias, out_c, params->output_multiplier,
                                                 params->output_shift, params->output_offset, params->act_min,
                                                 params->act_max);
      }
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

void tfmcu_conv2d_op_window(const void* params, TfmcuWindow* window) {
  const TfmcuConvParams* p = (const TfmcuConvParams*)params;
  tfmcu_set_window(window, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->dilation_h, p->dilation_w);
}

TfmcuStatus tfmcu_conv2d_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuConvParams* p = (const TfmcuConvParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  TfmcuWindow window;
  tfmcu_conv2d_op_window(params, &window);
  return tfmcu_conv_check(p->filter, p->output_multiplier, p->output_shift,
                          p->groups > 0 && in_channels[0] % p->groups == 0 && out_channels % p->groups == 0, &window,
                          p->act_min, p->act_max, p->input_offset, p->output_offset);
}

TfmcuStatus tfmcu_conv2d_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                int32_t pad_left, const TfmcuView* output) {
  return tfmcu_conv2d_s8((const TfmcuConvParams*)params, inputs, pad_top, pad_left, output);
}

void tfmcu_conv2d_op_array_sizes(const void* params, const int32_t* in_channels, int32_t out_channels,
                                 int32_t* elements) {
  const TfmcuConvParams* p = (const TfmcuConvParams*)params;
  const int32_t filter[4] = {out_channels, p->kernel_h, p->kernel_w, in_channels[0] / p->groups};
  elements[0] = tfmcu_elements_product(filter, 4);  /* filter */
  elements[1] = out_channels;  /* bias */
  elements[2] = out_channels;  /* output_multiplier */
  elements[3] = out_channels;  /* output_shift */
}
