/* The few packed 16-bit operations of the Arm DSP extension our own kernels use, as the instructions where the core
 * has them (ACLE intrinsics: Cortex-M4, M7, M33, M55 built with __ARM_FEATURE_DSP) and as plain C99 with the same
 * results elsewhere (the host, where the tests run the same kernel source, and cores without the extension). A word
 * holds two int16 halves: bottom (bits 0-15) and top (bits 16-31). */
#ifndef TFMCU_PATCH_KERNELS_TFMCU_DSP_H_
#define TFMCU_PATCH_KERNELS_TFMCU_DSP_H_

#include <stdint.h>
#include <string.h>

#include "tfmcu_common.h"

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#define TFMCU_DSP 1
#else
#define TFMCU_DSP 0
#endif
/* The Thumb-2 loops below (GCC and Clang's extended asm; an optimized build: unoptimized code keeps a frame pointer,
 * and the loops need every other register). Elsewhere the same arithmetic in C. */
#if TFMCU_DSP && defined(__GNUC__) && defined(__thumb2__) && defined(__OPTIMIZE__)
#define TFMCU_DSP_ASM 1
#else
#define TFMCU_DSP_ASM 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Four int8 at p (any alignment: one LDR on Cortex-M3 and later). */
static inline uint32_t tfmcu_read_s8x4(const int8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* x rotated right by 8 bits (folded by the compiler into the instruction that reads it). */
static inline uint32_t tfmcu_ror8(uint32_t x) { return (x >> 8) | (x << 24); }

#if TFMCU_DSP
/* bytes 0 and 2 of b, sign-extended, added to the halves of a (SXTAB16) */
static inline uint32_t tfmcu_sxtab16(uint32_t a, uint32_t b) {
  return (uint32_t)__sxtab16((int16x2_t)a, (int8x4_t)b);
}
/* bytes 0 and 2 of b, sign-extended (SXTB16) */
static inline uint32_t tfmcu_sxtb16(uint32_t b) { return (uint32_t)__sxtb16((int8x4_t)b); }
/* the same of b rotated right by 8 bits (bytes 1 and 3): one instruction (ACLE has no rotated form, and GCC does not
 * fold the rotation into the intrinsic) */
static inline uint32_t tfmcu_sxtab16_ror8(uint32_t a, uint32_t b) {
  uint32_t r;
  __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
static inline uint32_t tfmcu_sxtb16_ror8(uint32_t b) {
  uint32_t r;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(b));
  return r;
}
/* acc + bottom(a) * bottom(b) (SMLABB) and acc + top(a) * top(b) (SMLATT) */
static inline int32_t tfmcu_smlabb(uint32_t a, uint32_t b, int32_t acc) { return __smlabb((int32_t)a, (int32_t)b, acc); }
static inline int32_t tfmcu_smlatt(uint32_t a, uint32_t b, int32_t acc) { return __smlatt((int32_t)a, (int32_t)b, acc); }
/* acc + bottom(a) * bottom(b) + top(a) * top(b) (SMLAD) */
static inline int32_t tfmcu_smlad(uint32_t a, uint32_t b, int32_t acc) {
  return __smlad((int16x2_t)a, (int16x2_t)b, acc);
}
#else
static inline int32_t tfmcu_half_lo(uint32_t x) { return (int32_t)(int16_t)(uint16_t)(x & 0xFFFFu); }
static inline int32_t tfmcu_half_hi(uint32_t x) { return (int32_t)(int16_t)(uint16_t)(x >> 16); }
static inline int32_t tfmcu_byte_s8(uint32_t x, int32_t byte) { return (int32_t)(int8_t)(uint8_t)(x >> (8 * byte)); }
static inline uint32_t tfmcu_pack16(int32_t lo, int32_t hi) {
  return ((uint32_t)lo & 0xFFFFu) | (((uint32_t)hi & 0xFFFFu) << 16);
}
static inline uint32_t tfmcu_sxtab16(uint32_t a, uint32_t b) {
  return tfmcu_pack16(tfmcu_half_lo(a) + tfmcu_byte_s8(b, 0), tfmcu_half_hi(a) + tfmcu_byte_s8(b, 2));
}
static inline uint32_t tfmcu_sxtb16(uint32_t b) { return tfmcu_pack16(tfmcu_byte_s8(b, 0), tfmcu_byte_s8(b, 2)); }
static inline uint32_t tfmcu_sxtab16_ror8(uint32_t a, uint32_t b) { return tfmcu_sxtab16(a, tfmcu_ror8(b)); }
static inline uint32_t tfmcu_sxtb16_ror8(uint32_t b) { return tfmcu_sxtb16(tfmcu_ror8(b)); }
/* (the accumulations wrap modulo 2^32 like the instructions) */
static inline int32_t tfmcu_smlabb(uint32_t a, uint32_t b, int32_t acc) {
  return (int32_t)((uint32_t)acc + (uint32_t)(tfmcu_half_lo(a) * tfmcu_half_lo(b)));
}
static inline int32_t tfmcu_smlatt(uint32_t a, uint32_t b, int32_t acc) {
  return (int32_t)((uint32_t)acc + (uint32_t)(tfmcu_half_hi(a) * tfmcu_half_hi(b)));
}
static inline int32_t tfmcu_smlad(uint32_t a, uint32_t b, int32_t acc) {
  return tfmcu_smlatt(a, b, tfmcu_smlabb(a, b, acc));
}
#endif

/* The clamp of the Thumb-2 loops below: to [act_min, act_max] by two compares, or, for the whole int8 range (every
 * layer without an activation, and ReLU6 quantized over [0, 6]), one SSAT. */
#define TFMCU_ASM_CLAMP                     \
  "cmp %[hi], %[amin]\n\t"               \
  "it lt\n\t"                             \
  "movlt %[hi], %[amin]\n\t"             \
  "cmp %[hi], %[amax]\n\t"               \
  "it gt\n\t"                             \
  "movgt %[hi], %[amax]\n\t"
#define TFMCU_ASM_SSAT8 "ssat %[hi], #8, %[hi]\n\t"

/* out[k] = clamp(tfmcu_requantize_short(acc[k], {multiplier[k], round[k], right[k]}), act_min, act_max) for k < n
 * (n >= 1; every channel one tfmcu_short_quant accepted, its offset in round). Per output 19 instructions on
 * Cortex-M (Thumb-2 below: the compiler spills the channel's constants; 14 over the whole int8 range), the same
 * arithmetic in C elsewhere. */
#define TFMCU_ASM_REQUANTIZE_CHANNELS(clamp)                                                                     \
  __asm__ volatile("1:\n\t"                                                                                     \
                   "ldr %[a], [%[acc]], #4\n\t"                                                                 \
                   "ldr %[m], [%[mul]], #4\n\t"                                                                 \
                   "and %[lo], %[a], #0x80000000\n\t"                                                           \
                   "orr %[lo], %[lo], #0x40000000\n\t"                                                          \
                   "asr %[hi], %[a], #31\n\t"                                                                   \
                   "smlal %[lo], %[hi], %[a], %[m]\n\t"                                                         \
                   "ldr %[m], [%[rnd]], #4\n\t"                                                                 \
                   "ldr %[a], [%[rgt]], #4\n\t"                                                                 \
                   "add %[hi], %[hi], %[m]\n\t"                                                                 \
                   "asr %[hi], %[hi], %[a]\n\t" clamp                                                           \
                   "strb %[hi], [%[out]], #1\n\t"                                                               \
                   "subs %[n], %[n], #1\n\t"                                                                    \
                   "bne 1b\n\t"                                                                                 \
                   : [a] "=&r"(a), [m] "=&r"(m), [lo] "=&r"(lo), [hi] "=&r"(hi), [acc] "+r"(acc),              \
                     [mul] "+r"(multiplier), [rnd] "+r"(round), [rgt] "+r"(right), [out] "+r"(out), [n] "+r"(n) \
                   : [amin] "r"(act_min), [amax] "r"(act_max)                                                   \
                   : "cc", "memory")

static inline void tfmcu_requantize_short_channels(const int32_t* acc, const int32_t* multiplier, const int32_t* round,
                                                   const int32_t* right, int32_t n, int32_t act_min, int32_t act_max,
                                                   int8_t* out) {
#if TFMCU_DSP_ASM
  uint32_t a, m, lo, hi;
  if (act_min == -128 && act_max == 127) {
    TFMCU_ASM_REQUANTIZE_CHANNELS(TFMCU_ASM_SSAT8);
  } else {
    TFMCU_ASM_REQUANTIZE_CHANNELS(TFMCU_ASM_CLAMP);
  }
#else
  for (int32_t k = 0; k < n; ++k) {
    const TfmcuShortQuant f = {multiplier[k], round[k], right[k]};
    out[k] = (int8_t)tfmcu_clamp(tfmcu_requantize_short(acc[k], f), act_min, act_max);
  }
#endif
}

/* out[k * step] = clamp(tfmcu_requantize_short(acc[k], {multiplier, round, right}), act_min, act_max) for k < n
 * (n >= 1): one channel's outputs of n pixels. Per output 16 instructions on Cortex-M (Thumb-2 below; 11 over the
 * whole int8 range). */
#define TFMCU_ASM_REQUANTIZE_PIXELS(clamp)                                                                  \
  __asm__ volatile("1:\n\t"                                                                                \
                   "ldr %[a], [%[acc]], #4\n\t"                                                            \
                   "and %[lo], %[a], #0x80000000\n\t"                                                      \
                   "orr %[lo], %[lo], #0x40000000\n\t"                                                     \
                   "asr %[hi], %[a], #31\n\t"                                                              \
                   "smlal %[lo], %[hi], %[a], %[mul]\n\t"                                                  \
                   "add %[hi], %[hi], %[rnd]\n\t"                                                          \
                   "asr %[hi], %[hi], %[rgt]\n\t" clamp                                                    \
                   "strb %[hi], [%[out]]\n\t"                                                              \
                   "add %[out], %[out], %[step]\n\t"                                                       \
                   "subs %[n], %[n], #1\n\t"                                                               \
                   "bne 1b\n\t"                                                                            \
                   : [a] "=&r"(a), [lo] "=&r"(lo), [hi] "=&r"(hi), [acc] "+r"(acc), [out] "+r"(out), [n] "+r"(n) \
                   : [mul] "r"(multiplier), [rnd] "r"(round), [rgt] "r"(right), [amin] "r"(act_min),       \
                     [amax] "r"(act_max), [step] "r"(step)                                                  \
                   : "cc", "memory")

static inline void tfmcu_requantize_short_pixels(const int32_t* acc, int32_t multiplier, int32_t round, int32_t right,
                                                 int32_t n, int32_t act_min, int32_t act_max, int8_t* out,
                                                 int32_t step) {
#if TFMCU_DSP_ASM
  uint32_t a, lo, hi;
  if (act_min == -128 && act_max == 127) {
    TFMCU_ASM_REQUANTIZE_PIXELS(TFMCU_ASM_SSAT8);
  } else {
    TFMCU_ASM_REQUANTIZE_PIXELS(TFMCU_ASM_CLAMP);
  }
#else
  const TfmcuShortQuant f = {multiplier, round, right};
  for (int32_t k = 0; k < n; ++k, out += step) {
    *out = (int8_t)tfmcu_clamp(tfmcu_requantize_short(acc[k], f), act_min, act_max);
  }
#endif
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_DSP_H_ */
