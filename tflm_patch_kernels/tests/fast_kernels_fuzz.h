/* The fast paths' differential fuzz (fast_kernels_fuzz.c), shared by the host test and the firmware. */
#ifndef TFMCU_PATCH_KERNELS_TESTS_FAST_KERNELS_FUZZ_H_
#define TFMCU_PATCH_KERNELS_TESTS_FAST_KERNELS_FUZZ_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*TfmcuFuzzLog)(const char* what);

/* Runs `requantize_cases` random requantizations, then `layer_cases` random 3x3 depthwise layers and as many
 * shallow convolutions from `seed`; returns the number that differ (each kind logged once). */
int32_t tfmcu_fuzz_fast_kernels(uint32_t seed, int32_t layer_cases, int32_t requantize_cases, TfmcuFuzzLog log);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_TESTS_FAST_KERNELS_FUZZ_H_ */
