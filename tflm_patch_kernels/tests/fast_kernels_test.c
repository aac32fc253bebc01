/* The fast paths against the plain kernels on the host (fast_kernels_fuzz.c; the same cases run on Cortex-M in
 * //tflm_patch_kernels/firmware:fast_kernels_fuzz). Exit status 0 = no difference. */
#include <stdio.h>

#include "tflm_patch_kernels/tests/fast_kernels_fuzz.h"

static void log_line(const char* what) { printf("%s\n", what); }

int main(void) {
  const int32_t failures = tfmcu_fuzz_fast_kernels(20261129u, 20000, 2000000, log_line);
  printf("fast kernels: %ld differences\n", (long)failures);
  return failures != 0;
}
