/* ADD int8: see add.h. */
#include "add.h"

#include "tfmcu_lut.h"

static int8_t tfmcu_add_element(const TfmcuAddParams* params, int8_t a, int8_t b) {
  const int32_t shifted1 = ((int32_t)a + params->input1_offset) * ((int32_t)1 << params->left_shift);
  const int32_t shifted2 = ((int32_t)b + params->input2_offset) * ((int32_t)1 << params->left_shift);
  const int32_t scaled1 =
      tfmcu_multiply_by_quantized_multiplier(shifted1, params->input1_multiplier, params->input1_shift);
  const int32_t scaled2 =
      tfmcu_multiply_by_quantized_multiplier(shifted2, params->input2_multiplier, params->input2_shift);
  const int32_t raw = tfmcu_wrap_add(tfmcu_multiply_by_quantized_multiplier(tfmcu_wrap_add(scaled1, scaled2),
                                                                            params->output_multiplier,
                                                                            params->output_shift),
                                     params->output_offset);
  return (int8_t)tfmcu_clamp(raw, params->act_min, params->act_max);
}

TfmcuStatus tfmcu_add_s8(const TfmcuAddParams* params, const TfmcuConstView* input1, const TfmcuConstView* input2,
                         const TfmcuView* output) {
  if (params == NULL || input1 == NULL || input2 == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const int32_t step = tfmcu_operand2_pixel_step(input1, input2, output);
  if (step < 0 || params->left_shift < 0 || params->left_shift > TFMCU_ADD_MAX_LEFT_SHIFT) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t channels = output->channels;
  const int32_t lanes = step == 0 ? tfmcu_lut_lanes(input2->data, output) : 0;
  if (lanes > 0) {
    int8_t tables[TFMCU_LUT_MAX_CHANNELS][256];
    for (int32_t l = 0; l < lanes; ++l) {
      for (int32_t v = INT8_MIN; v <= INT8_MAX; ++v) {
        tables[l][v + 128] = tfmcu_add_element(params, (int8_t)v, input2->data[l]);
      }
    }
    tfmcu_lut_map_lanes((const int8_t(*)[256])tables, lanes, input1, output);
    return kTfmcuOk;
  }
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* a = input1->data + (ptrdiff_t)y * input1->row_stride;
    const int8_t* b = input2->data + (step != 0 ? (ptrdiff_t)y * input2->row_stride : 0);
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t x = 0; x < output->width; ++x) {
      for (int32_t c = 0; c < channels; ++c) {
        out[x * channels + c] = tfmcu_add_element(params, a[x * channels + c], b[x * step + c]);
      }
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_add_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuAddParams* p = (const TfmcuAddParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const int32_t shifts[3] = {p->input1_shift, p->input2_shift, p->output_shift};
  if (in_channels[0] != out_channels || in_channels[1] != out_channels || p->left_shift < 0 ||
      p->left_shift > TFMCU_ADD_MAX_LEFT_SHIFT || p->act_min > p->act_max || !tfmcu_offset_valid(p->input1_offset) ||
      !tfmcu_offset_valid(p->input2_offset) || !tfmcu_offset_valid(p->output_offset) ||
      !tfmcu_shifts_valid(shifts, 3)) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_add_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top, int32_t pad_left,
                             const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  if (inputs == NULL) {
    return kTfmcuErrorNullPointer;
  }
  return tfmcu_add_s8((const TfmcuAddParams*)params, &inputs[0], &inputs[1], output);
}
