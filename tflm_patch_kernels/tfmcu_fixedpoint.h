/* gemmlowp's fixed-point logistic and tanh (fixedpoint/fixedpoint.h), which TFLite Micro's int8 LOGISTIC and TANH
 * evaluate (reference_integer_ops::Logistic / Tanh), reproduced bit for bit on int32 raw values. A value with
 * `integer_bits` integer bits is raw / 2^(31 - integer_bits) (gemmlowp's FixedPoint<int32_t, integer_bits>); results
 * have 0 integer bits (raw / 2^31). Only the scalar int32 paths TFLM's int8 kernels use are here: exp on negative
 * values with 4 or 5 integer bits, 1 / (1 + x) and (1 - x) / (1 + x) on (0, 1) by three Newton-Raphson steps, and
 * logistic / tanh of a 4-integer-bit input. No intermediate overflows for |input| < 15 (what the kernels pass: their
 * input radius keeps it so). */
#ifndef TFMCU_PATCH_KERNELS_TFMCU_FIXEDPOINT_H_
#define TFMCU_PATCH_KERNELS_TFMCU_FIXEDPOINT_H_

#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x * 2^exponent saturated to int32 (gemmlowp's SaturatingRoundingMultiplyByPOT with a positive exponent). */
static inline int32_t tfmcu_fp_saturating_shift_left(int32_t x, int32_t exponent) {
  const int64_t wide = (int64_t)x * ((int64_t)1 << exponent);
  return wide > INT32_MAX ? INT32_MAX : (wide < INT32_MIN ? INT32_MIN : (int32_t)wide);
}

/* gemmlowp RoundingHalfSum: (a + b) / 2 rounded to nearest, ties away from zero. */
static inline int32_t tfmcu_fp_rounding_half_sum(int32_t a, int32_t b) {
  const int64_t sum = (int64_t)a + (int64_t)b;
  return (int32_t)((sum + (sum >= 0 ? 1 : -1)) / 2);
}

/* exp(a) for a in [-1/4, 0), 0 integer bits: a Taylor expansion around -1/8. */
static inline int32_t tfmcu_fp_exp_on_interval_between_negative_one_quarter_and_0_excl(int32_t a) {
  const int32_t constant_term = 1895147668;  /* exp(-1/8) */
  const int32_t constant_1_over_3 = 715827883;
  const int32_t x = a + ((int32_t)1 << 28);  /* a + 1/8 */
  const int32_t x2 = tfmcu_saturating_rounding_doubling_high_mul(x, x);
  const int32_t x3 = tfmcu_saturating_rounding_doubling_high_mul(x2, x);
  const int32_t x4 = tfmcu_saturating_rounding_doubling_high_mul(x2, x2);
  const int32_t x4_over_4 = tfmcu_rounding_divide_by_pot(x4, 2);
  const int32_t x4_over_24_plus_x3_over_6_plus_x2_over_2 = tfmcu_rounding_divide_by_pot(
      tfmcu_saturating_rounding_doubling_high_mul(x4_over_4 + x3, constant_1_over_3) + x2, 1);
  return constant_term +
         tfmcu_saturating_rounding_doubling_high_mul(constant_term, x + x4_over_24_plus_x3_over_6_plus_x2_over_2);
}

/* exp(a) for a <= 0 with `integer_bits` (4 or 5) integer bits; the result has 0 integer bits (1 is INT32_MAX). */
static inline int32_t tfmcu_fp_exp_on_negative_values(int32_t a, int32_t integer_bits) {
  /* exp(-2^k) for k = -2 .. 4 (gemmlowp's barrel shifter constants) */
  static const int32_t kMultipliers[7] = {1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242};
  const int32_t fractional_bits = 31 - integer_bits;
  const int32_t one_quarter = (int32_t)1 << (fractional_bits - 2);
  const int32_t a_mod_quarter_minus_one_quarter = (a & (one_quarter - 1)) - one_quarter;
  int32_t result = tfmcu_fp_exp_on_interval_between_negative_one_quarter_and_0_excl(
      tfmcu_fp_saturating_shift_left(a_mod_quarter_minus_one_quarter, integer_bits));
  const int32_t remainder = a_mod_quarter_minus_one_quarter - a;
  for (int32_t k = -2; k <= 4 && k < integer_bits; ++k) {
    if (remainder & ((int32_t)1 << (fractional_bits + k))) {
      result = tfmcu_saturating_rounding_doubling_high_mul(result, kMultipliers[k + 2]);
    }
  }
  return a == 0 ? INT32_MAX : result;
}

/* x = 1 / (2 * half_denominator) with 2 integer bits, half_denominator = (1 + a) / 2: three Newton-Raphson steps. */
static inline int32_t tfmcu_fp_newton_reciprocal(int32_t half_denominator) {
  const int32_t constant_48_over_17 = 1515870810;
  const int32_t constant_neg_32_over_17 = -1010580540;
  const int32_t one = (int32_t)1 << 29;  /* 1 with 2 integer bits */
  int32_t x = tfmcu_wrap_add(constant_48_over_17,
                             tfmcu_saturating_rounding_doubling_high_mul(half_denominator, constant_neg_32_over_17));
  for (int i = 0; i < 3; ++i) {
    const int32_t half_denominator_times_x = tfmcu_saturating_rounding_doubling_high_mul(half_denominator, x);
    const int32_t one_minus_half_denominator_times_x = tfmcu_wrap_add(one, -half_denominator_times_x);
    x = tfmcu_wrap_add(x, tfmcu_fp_saturating_shift_left(
                              tfmcu_saturating_rounding_doubling_high_mul(x, one_minus_half_denominator_times_x), 2));
  }
  return x;
}

/* 1 / (1 + a) for a in (0, 1], 0 integer bits. */
static inline int32_t tfmcu_fp_one_over_one_plus_x_for_x_in_0_1(int32_t a) {
  const int32_t x = tfmcu_fp_newton_reciprocal(tfmcu_fp_rounding_half_sum(a, INT32_MAX));
  return tfmcu_fp_saturating_shift_left(x, 1);  /* x / 2 with 1 integer bit, rescaled to 0 */
}

/* (1 - a) / (1 + a) for a in (0, 1], 0 integer bits. */
static inline int32_t tfmcu_fp_one_minus_x_over_one_plus_x_for_x_in_0_1(int32_t a) {
  const int32_t x = tfmcu_fp_newton_reciprocal(tfmcu_fp_rounding_half_sum(a, INT32_MAX));
  return tfmcu_fp_saturating_shift_left(tfmcu_wrap_add(x, -((int32_t)1 << 29)), 2);  /* x - 1, rescaled to 0 */
}

/* logistic(a) = 1 / (1 + exp(-a)), `a` with 4 integer bits, the result with 0. */
static inline int32_t tfmcu_fp_logistic_q4(int32_t a) {
  if (a == 0) {
    return (int32_t)1 << 30;  /* one half */
  }
  const int32_t abs_a = a > 0 ? a : -a;
  const int32_t positive = tfmcu_fp_one_over_one_plus_x_for_x_in_0_1(tfmcu_fp_exp_on_negative_values(-abs_a, 4));
  return a > 0 ? positive : INT32_MAX - positive;
}

/* tanh(a), `a` with 4 integer bits, the result with 0: -tanh(n) for n = -|a| is (1 - exp(2n)) / (1 + exp(2n)), 2n
 * being n read with 5 integer bits. */
static inline int32_t tfmcu_fp_tanh_q4(int32_t a) {
  if (a == 0) {
    return 0;
  }
  const int32_t n = a < 0 ? a : -a;
  const int32_t t = tfmcu_fp_one_minus_x_over_one_plus_x_for_x_in_0_1(tfmcu_fp_exp_on_negative_values(n, 5));
  return a < 0 ? -t : t;
}

/* The input radius of TFLite's int8 LOGISTIC / TANH Prepare (CalculateInputRadius(4, left_shift, 31)): the largest
 * |input - zero point| whose rescaled value stays below 15 with 4 integer bits, floor(15 * 2^27 / 2^left_shift);
 * 0 from left_shift 31 on (every input then saturates). left_shift >= 0. */
static inline int32_t tfmcu_fp_input_radius_q4(int32_t left_shift) {
  return left_shift >= 31 ? 0 : (int32_t)((15 * ((int64_t)1 << 27)) >> left_shift);
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_FIXEDPOINT_H_ */
