/* The few packed 16-bit operations of the Arm DSP extension our own kernels use, as the instructions where the core
 * has them (ACLE intrinsics: Cortex-M4, M7, M33, M55 built with __ARM_FEATURE_DSP) and as plain C99 with the same
 * results elsewhere (the host, where the tests run the same kernel source, and cores without the extension). A word
 * holds two int16 halves: bottom (bits 0-15) and top (bits 16-31). */
#ifndef TFMCU_PATCH_KERNELS_TFMCU_DSP_H_
#define TFMCU_PATCH_KERNELS_TFMCU_DSP_H_

#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#define TFMCU_DSP 1
#else
#define TFMCU_DSP 0
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
static inline uint32_t tfmcu_sxtab16(uint32_t a, uint32_t b) { return __sxtab16(a, b); }
/* bytes 0 and 2 of b, sign-extended (SXTB16) */
static inline uint32_t tfmcu_sxtb16(uint32_t b) { return __sxtb16(b); }
/* acc + bottom(a) * bottom(b) (SMLABB) and acc + top(a) * top(b) (SMLATT) */
static inline int32_t tfmcu_smlabb(uint32_t a, uint32_t b, int32_t acc) { return __smlabb((int32_t)a, (int32_t)b, acc); }
static inline int32_t tfmcu_smlatt(uint32_t a, uint32_t b, int32_t acc) { return __smlatt((int32_t)a, (int32_t)b, acc); }
/* acc + bottom(a) * bottom(b) + top(a) * top(b) (SMLAD) */
static inline int32_t tfmcu_smlad(uint32_t a, uint32_t b, int32_t acc) { return __smlad(a, b, acc); }
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

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TFMCU_DSP_H_ */
