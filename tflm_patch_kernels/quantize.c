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

#if defined(__ARM_FP) && (__ARM_FP & 4) && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && \
    defined(__GNUC__) && defined(__thumb2__) && defined(__OPTIMIZE__)
/* On cores with a single-precision FPU and the DSP extension, a row in Thumb-2 (15 instructions per value where TFLM's
 * reference kernel runs about 36): v = x / scale (VDIV, as the portable code), t = trunc(v) and back (VCVT: exact,
 * saturating at the int32 range, NaN to 0), f = v - t exact, and trunc(2 f) is the rounding step: +1 for f >= 0.5,
 * -1 for f <= -0.5, else 0 (round half away from zero); the saturating adds keep the int32 range (a value past
 * +-2^31 saturates, as the portable code's clamp at +-1024 does, and a NaN gives the zero point). n >= 1. */
#define TFMCU_QUANTIZE_ROW_ASM 1
static void tfmcu_quantize_row(const float* in, int8_t* out, int32_t n, float scale, int32_t zero_point) {
  float x, fl;
  int32_t r, r2;
  __asm__ volatile(
      "1:\n\t"
      "vldmia %[in]!, {%[x]}\n\t"
      "vdiv.f32 %[x], %[x], %[s]\n\t"
      "vcvt.s32.f32 %[fl], %[x]\n\t"
      "vmov %[r], %[fl]\n\t"
      "vcvt.f32.s32 %[fl], %[fl]\n\t"
      "vsub.f32 %[x], %[x], %[fl]\n\t"
      "vadd.f32 %[x], %[x], %[x]\n\t"
      "vcvt.s32.f32 %[x], %[x]\n\t"
      "vmov %[r2], %[x]\n\t"
      "qadd %[r], %[r], %[r2]\n\t"
      "qadd %[r], %[r], %[zp]\n\t"
      "ssat %[r], #8, %[r]\n\t"
      "strb %[r], [%[out]], #1\n\t"
      "subs %[n], %[n], #1\n\t"
      "bne 1b\n\t"
      : [x] "=&t"(x), [fl] "=&t"(fl), [r] "=&r"(r), [r2] "=&r"(r2), [in] "+r"(in), [out] "+r"(out), [n] "+r"(n)
      : [s] "t"(scale), [zp] "r"(zero_point)
      : "cc", "memory");
}
#else
#define TFMCU_QUANTIZE_ROW_ASM 0
#endif

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
#if TFMCU_QUANTIZE_ROW_ASM
    if (row_elements > 0) {
      tfmcu_quantize_row(in, out, row_elements, params->scale, params->zero_point);
    }
    continue;
#endif
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

/* ------------------------------------------------------------------------------ op interface (op_table.c) */

TfmcuStatus tfmcu_quantize_op_check(const void* params, const int32_t* in_channels, int32_t out_channels) {
  if (params == NULL || in_channels == NULL) {
    return kTfmcuErrorNullPointer;
  }
  return in_channels[0] == out_channels ? kTfmcuOk : kTfmcuErrorInvalidStage;
}

TfmcuStatus tfmcu_quantize_op_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                  int32_t pad_left, const TfmcuView* output) {
  (void)pad_top;
  (void)pad_left;
  if (inputs == NULL) {
    return kTfmcuErrorNullPointer;
  }
  TfmcuConstViewF32 input;
  input.data = (const float*)(const void*)inputs[0].data;
  input.height = inputs[0].height;
  input.width = inputs[0].width;
  input.channels = inputs[0].channels;
  input.row_stride = inputs[0].row_stride;
  return tfmcu_quantize_f32_s8((const TfmcuQuantizeParams*)params, &input, output);
}
