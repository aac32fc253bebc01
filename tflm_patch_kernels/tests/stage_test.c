/* The patch-stage executor on stages emitted by tfmcu.patch_kernels.stage_to_c (golden_stage.h, from
 * gen_golden.py) against TFLite's stage-output tensor: bit-exact output, the highest scratch byte touched equals
 * the planned scratch size (poisoned scratch, two poison values), too small / missing buffers and broken
 * descriptions are refused. Exit status 0 = pass. */
#include <stdio.h>
#include <string.h>

#include "tflm_patch_kernels/tests/golden_stage.h"

#define GUARD 64
#define MAX_SCRATCH 8192
#define MAX_OUTPUT 4096

static unsigned char g_scratch[MAX_SCRATCH + GUARD];
static int8_t g_output[MAX_OUTPUT];

static int check(int ok, const char* name, const char* what) {
  if (!ok) {
    printf("%s: %s\n", name, what);
  }
  return ok ? 0 : 1;
}

static int check_stage(const char* name, const TfmcuStage* stage, const void* input, const int8_t* expected,
                       size_t scratch_bytes, size_t output_bytes) {
  int failures = 0;
  int32_t failed_layer = 0;
  failures += check(tfmcu_stage_check(stage, &failed_layer) == kTfmcuOk && failed_layer == -1, name, "check");
  failures += check(tfmcu_stage_scratch_bytes(stage) == scratch_bytes, name, "scratch bytes");
  failures += check(tfmcu_stage_output_bytes(stage) == output_bytes, name, "output bytes");
  if (scratch_bytes > MAX_SCRATCH || output_bytes > MAX_OUTPUT) {
    printf("%s: too large for the test buffers\n", name);
    return failures + 1;
  }
  size_t highest = 0;
  const unsigned char poisons[2] = {0xA5, 0x5A};
  for (int p = 0; p < 2; ++p) {
    memset(g_scratch, poisons[p], sizeof(g_scratch));
    memset(g_output, 0, sizeof(g_output));
    const TfmcuStatus s = tfmcu_stage_run(stage, input, g_output, g_scratch, scratch_bytes);
    failures += check(s == kTfmcuOk, name, tfmcu_status_string(s));
    failures += check(memcmp(g_output, expected, output_bytes) == 0, name, "output differs from TFLite");
    for (size_t i = 0; i < sizeof(g_scratch); ++i) {
      if (g_scratch[i] != poisons[p] && i + 1 > highest) {
        highest = i + 1;
      }
    }
  }
  failures += check(highest == scratch_bytes, name, "highest scratch byte touched != scratch_bytes");
  failures += check(tfmcu_stage_run(stage, input, g_output, g_scratch, scratch_bytes - 1) ==
                        kTfmcuErrorScratchTooSmall, name, "too small scratch accepted");
  failures += check(tfmcu_stage_run(stage, NULL, g_output, g_scratch, scratch_bytes) == kTfmcuErrorNullPointer,
                    name, "NULL input accepted");
  failures += check(tfmcu_stage_run(stage, input, g_output, NULL, scratch_bytes) == kTfmcuErrorNullPointer, name,
                    "NULL scratch accepted");

  /* Broken copies of the description are refused before anything runs. */
  TfmcuStage broken = *stage;
  broken.scratch_bytes += 1;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorInvalidStage, name, "wrong scratch_bytes");
  broken = *stage;
  broken.grid_rows = 0;
  failures += check(tfmcu_stage_run(&broken, input, g_output, g_scratch, scratch_bytes) == kTfmcuErrorInvalidStage,
                    name, "empty grid accepted");
  broken = *stage;
  broken.layers = NULL;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorNullPointer, name, "NULL layers accepted");
  broken = *stage;
  broken.output_tensor = broken.input_tensor;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorInvalidStage, name, "output == input");
  broken = *stage;
  broken.buffer_offsets = NULL;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorNullPointer, name, "NULL offsets accepted");

  printf("%-24s %s (scratch %u bytes)\n", name, failures ? "FAIL" : "ok", (unsigned)scratch_bytes);
  return failures;
}

int main(void) {
  int failures = 0;
  failures += check_stage("golden_stage_int8", &golden_stage_int8, golden_stage_int8_input,
                          golden_stage_int8_expected, GOLDEN_STAGE_INT8_SCRATCH_BYTES,
                          GOLDEN_STAGE_INT8_OUTPUT_BYTES);
  failures += check_stage("golden_stage_float", &golden_stage_float, golden_stage_float_input,
                          golden_stage_float_expected, GOLDEN_STAGE_FLOAT_SCRATCH_BYTES,
                          GOLDEN_STAGE_FLOAT_OUTPUT_BYTES);
  return failures != 0;
}
