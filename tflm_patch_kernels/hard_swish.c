/* HARD_SWISH int8: see hard_swish.h. The int16 helpers are gemmlowp's (and TFLite's reference_ops) scalar int16
 * functions; every value is kept in int32 and wrapped or saturated to int16 exactly where the C++ stores an int16. */
#include "hard_swish.h"

#include "tfmcu_lut.h"

/* An int32 as the C++ stores it into an int16_t (modulo 2^16, as GCC and Clang convert). */
static int32_t tfmcu_wrap_int16(int32_t x) {
  return (int32_t)(((uint32_t)x + 32768u) & 0xFFFFu) - 32768;
}

/* reference_ops::SaturatingLeftShift: value * 2^amount saturated to int16 (0 <= amount <= 30). */
static int32_t tfmcu_saturating_left_shift_int16(int32_t value, int32_t amount) {
  const int64_t result = (int64_t)value * ((int64_t)1 << amount);
  return result > INT16_MAX ? INT16_MAX : (result < INT16_MIN ? INT16_MIN : (int32_t)result);
}

/* gemmlowp SaturatingRoundingDoublingHighMul<int16_t>: (a * b + nudge) / 2^15, the nudge 2^14 or 1 - 2^14 by the
 * product's sign, truncated; -32768 * -32768 saturates to 32767. */
static int32_t tfmcu_srdhm_int16(int32_t a, int32_t b) {
  if (a == INT16_MIN && b == INT16_MIN) {
    return INT16_MAX;
  }
  const int32_t ab = a * b;
  const int32_t nudge = ab >= 0 ? (1 << 14) : (1 - (1 << 14));
  return tfmcu_wrap_int16((ab + nudge) / (1 << 15));
}

/* reference_ops::SaturatingDoublingHighMul (int16): a * b / 2^15 truncated (rounding towards zero). */
static int32_t tfmcu_sdhm_int16(int32_t a, int32_t b) {
  if (a == INT16_MIN && b == INT16_MIN) {
    return INT16_MAX;
  }
  return tfmcu_wrap_int16((a * b) / (1 << 15));
}

/* gemmlowp RoundingDivideByPOT<int16_t>(x, exponent), 0 <= exponent <= 31, with its int16 mask: (1 << exponent) - 1
 * stored in an int16, so from exponent 16 on the mask is -1, the remainder x itself and the threshold -1 (+1 for a
 * negative x): the result is then 1 for x >= 0 and -1 for x < 0, as the C++ computes it. */
static int32_t tfmcu_rounding_divide_by_pot_int16(int32_t x, int32_t exponent) {
  const int32_t mask = exponent >= 16 ? -1 : (int32_t)(((int32_t)1 << exponent) - 1);
  const int32_t remainder = x & mask;
  const int32_t threshold = tfmcu_shift_right_floor(mask, 1) + (x < 0 ? 1 : 0);
  return tfmcu_wrap_int16(tfmcu_shift_right_floor(x, exponent) + (remainder > threshold ? 1 : 0));
}

static int8_t tfmcu_hard_swish_element(const TfmcuHardSwishParams* p, int8_t x) {
  const int32_t input_value = tfmcu_wrap_int16((int32_t)x - p->input_zero_point);
  const int32_t input_value_on_hires_input_scale = tfmcu_wrap_int16(input_value * (1 << 7));
  const int32_t input_value_on_preshift_output_scale =
      tfmcu_srdhm_int16(input_value_on_hires_input_scale, p->output_multiplier_fixedpoint_int16);
  int32_t reluish_value = input_value_on_hires_input_scale;
  if (p->reluish_multiplier_exponent > 0) {
    reluish_value = tfmcu_saturating_left_shift_int16(reluish_value, p->reluish_multiplier_exponent - 1);
  }
  reluish_value = tfmcu_srdhm_int16(reluish_value, p->reluish_multiplier_fixedpoint_int16);
  if (p->reluish_multiplier_exponent > 0) {
    reluish_value = tfmcu_saturating_left_shift_int16(reluish_value, 1);
  }
  if (p->reluish_multiplier_exponent < 0) {
    reluish_value = tfmcu_rounding_divide_by_pot_int16(reluish_value, -p->reluish_multiplier_exponent);
  }
  reluish_value = (reluish_value + (1 << 15)) >> 1;  /* [-1, 1] -> [0, 1]: 0 .. 32767 */
  const int32_t preshift_output_value = tfmcu_sdhm_int16(reluish_value, input_value_on_preshift_output_scale);
  int32_t output_value =
      tfmcu_rounding_divide_by_pot_int16(preshift_output_value, -p->output_multiplier_exponent);
  output_value = tfmcu_wrap_int16(output_value + p->output_zero_point);
  return (int8_t)tfmcu_clamp(output_value, INT8_MIN, INT8_MAX);
}

TfmcuStatus tfmcu_hard_swish_s8(const TfmcuHardSwishParams* params, const TfmcuConstView* input,
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
      table[v + 128] = tfmcu_hard_swish_element(params, (int8_t)v);
    }
    tfmcu_lut_map(table, input, output);
    return kTfmcuOk;
  }
  const int32_t row_elements = output->width * output->channels;
  for (int32_t y = 0; y < output->height; ++y) {
    const int8_t* in = input->data + (ptrdiff_t)y * input->row_stride;
    int8_t* out = output->data + (ptrdiff_t)y * output->row_stride;
    for (int32_t i = 0; i < row_elements; ++i) {
      out[i] = tfmcu_hard_swish_element(params, in[i]);
    }
  }
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_hard_swish_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  const TfmcuHardSwishParams* p = (const TfmcuHardSwishParams*)params;
  if (p == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (in_channels[0] != out_channels || !tfmcu_offset_valid(p->input_zero_point) ||
      !tfmcu_offset_valid(p->output_zero_point) || p->reluish_multiplier_fixedpoint_int16 < 0 ||
      p->reluish_multiplier_fixedpoint_int16 > INT16_MAX || p->output_multiplier_fixedpoint_int16 < 0 ||
      p->output_multiplier_fixedpoint_int16 > INT16_MAX || p->reluish_multiplier_exponent < -31 ||
      p->reluish_multiplier_exponent > 31 || p->output_multiplier_exponent < -31 ||
      p->output_multiplier_exponent > 0) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_hard_swish_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  return tfmcu_hard_swish_s8((const TfmcuHardSwishParams*)params, inputs, output);
}
