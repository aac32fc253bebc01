/* MEAN over height and width, int8: see mean.h. */
#include "mean.h"

#include <string.h>

/* The sum of channel c over the box (int32 wrapping like TFLite's AddTensorValuesWithExpectedOverflow). */
static int32_t tfmcu_channel_sum(const TfmcuConstView* input, int32_t c) {
  int32_t sum = 0;
  for (int32_t y = 0; y < input->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride + c;
    for (int32_t x = 0; x < input->width; ++x) {
      sum = tfmcu_wrap_add(sum, in[(ptrdiff_t)x * input->channels]);
    }
  }
  return sum;
}

/* TFLite's rescaling of the mean: 1 / count folded into the multiplier; the int8 result. */
static int8_t tfmcu_mean_value(const TfmcuMeanParams* params, int32_t sum, int32_t count) {
  int32_t shift = 0;
  while (shift < 31 && ((int64_t)1 << (shift + 1)) <= (int64_t)count) {
    ++shift;  /* floor(log2(count)): 63 - CountLeadingZeros(count) */
  }
  shift = tfmcu_min_i32(shift, 31 + params->output_shift);
  const int32_t multiplier = (int32_t)(((int64_t)params->output_multiplier << shift) / count);
  const int32_t shifted_sum = tfmcu_wrap_add(sum, (int32_t)((uint32_t)params->input_offset * (uint32_t)count));
  const int32_t out = tfmcu_multiply_by_quantized_multiplier(shifted_sum, multiplier, params->output_shift - shift) +
                      params->output_offset;
  return (int8_t)tfmcu_clamp(out, -128, 127);
}

TfmcuStatus tfmcu_mean_s8(const TfmcuMeanParams* params, const TfmcuConstView* input, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (input->channels != output->channels || output->height != 1 || output->width != 1) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t count = input->height * input->width;
  if (count <= 0) {
    return kTfmcuErrorEmptyWindow;
  }
  for (int32_t c = 0; c < input->channels; ++c) {
    output->data[c] = tfmcu_mean_value(params, tfmcu_channel_sum(input, c), count);
  }
  return kTfmcuOk;
}

void tfmcu_mean_accumulate_s8(const TfmcuConstView* input, int8_t* sums) {
  for (int32_t c = 0; c < input->channels; ++c) {
    int32_t sum;
    memcpy(&sum, sums + (ptrdiff_t)c * 4, sizeof(sum));
    sum = tfmcu_wrap_add(sum, tfmcu_channel_sum(input, c));
    memcpy(sums + (ptrdiff_t)c * 4, &sum, sizeof(sum));
  }
}

TfmcuStatus tfmcu_mean_finish_s8(const TfmcuMeanParams* params, const int8_t* sums, int32_t count,
                                 const TfmcuView* output) {
  if (params == NULL || sums == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (count <= 0) {
    return kTfmcuErrorEmptyWindow;
  }
  for (int32_t c = 0; c < output->channels; ++c) {
    int32_t sum;
    memcpy(&sum, sums + (ptrdiff_t)c * 4, sizeof(sum));
    output->data[c] = tfmcu_mean_value(params, sum, count);
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_mean_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  if (params == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const TfmcuMeanParams* p = (const TfmcuMeanParams*)params;
  if (in_channels[0] != out_channels || !tfmcu_offset_valid(p->input_offset) ||
      !tfmcu_offset_valid(p->output_offset) || p->output_multiplier < 0 || p->output_shift < -31 ||
      p->output_shift > 31) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_mean_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                              const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  return tfmcu_mean_s8((const TfmcuMeanParams*)params, inputs, output);
}

void tfmcu_mean_op_accumulate(const void* params, const TfmcuConstView* inputs, int8_t* sums) {
  (void)params;
  tfmcu_mean_accumulate_s8(inputs, sums);
}

TfmcuStatus tfmcu_mean_op_finish(const void* params, const int8_t* sums, int32_t count, const TfmcuView* output) {
  return tfmcu_mean_finish_s8((const TfmcuMeanParams*)params, sums, count, output);
}
