/* The patch-stage executor on stages emitted by tfmcu.kernels.codegen.stage_to_c (golden_stage.h, from
 * tools/gen/gen_golden.py) against TFLite's stage-output tensor: bit-exact output, the highest scratch byte touched
 * equals the planned scratch size (poisoned scratch, two poison values), too small / missing buffers are refused by
 * tfmcu_stage_run, broken descriptions by tfmcu_stage_check and tfmcu_stage_prepare, a NULL or not-ready prepared
 * stage by tfmcu_stage_run. Exit status 0 = pass. */
#include <stdio.h>
#include <string.h>

#include "tflm_patch_kernels/tests/golden_stage.h"

#define GUARD 64
#define MAX_SCRATCH 8192
#define MAX_OUTPUT 4096
#define MAX_LAYERS 64

static unsigned char g_scratch[MAX_SCRATCH + GUARD];
static int8_t g_output[MAX_OUTPUT];

static int check(int ok, const char* name, const char* what) {
  if (!ok) {
    printf("%s: %s\n", name, what);
  }
  return ok ? 0 : 1;
}

/* tfmcu_stage_prepare refuses `broken` with `status` and the failed layer tfmcu_stage_check reports; the prepared
 * stage is left not ready and tfmcu_stage_run refuses it without writing the output. */
static int prepare_refuses(const TfmcuStage* broken, TfmcuStatus status, const void* input, size_t scratch_bytes) {
  int32_t check_layer = -7;
  int32_t prepare_layer = -9;
  TfmcuPreparedStage prepared;
  memset(&prepared, 0xEE, sizeof(prepared));
  prepared.ready = 1;
  if (tfmcu_stage_check(broken, &check_layer) != status ||
      tfmcu_stage_prepare(broken, &prepared, &prepare_layer) != status || prepare_layer != check_layer ||
      prepared.ready != 0 || prepared.stage != NULL || prepared.scratch_bytes != 0 || prepared.output_bytes != 0) {
    return 0;
  }
  memset(g_output, 0x33, sizeof(g_output));
  if (tfmcu_stage_run(&prepared, input, g_output, g_scratch, scratch_bytes) != kTfmcuErrorInvalidStage) {
    return 0;
  }
  for (size_t i = 0; i < sizeof(g_output); ++i) {
    if (g_output[i] != 0x33) {
      return 0;
    }
  }
  return 1;
}

static int check_stage(const char* name, const TfmcuStage* stage, const void* input, const int8_t* expected,
                       size_t scratch_bytes, size_t output_bytes) {
  int failures = 0;
  int32_t failed_layer = 0;
  failures += check(tfmcu_stage_check(stage, &failed_layer) == kTfmcuOk && failed_layer == -1, name, "check");
  failures += check(tfmcu_stage_scratch_bytes(stage) == scratch_bytes, name, "scratch bytes");
  failures += check(tfmcu_stage_output_bytes(stage) == output_bytes, name, "output bytes");
  TfmcuPreparedStage prepared;
  memset(&prepared, 0xEE, sizeof(prepared));
  failed_layer = 0;
  failures += check(tfmcu_stage_prepare(stage, &prepared, &failed_layer) == kTfmcuOk && failed_layer == -1, name,
                    "prepare");
  failures += check(prepared.ready == 1 && prepared.stage == stage, name, "prepared: ready, stage");
  failures += check(prepared.scratch_bytes == scratch_bytes && prepared.scratch_bytes == stage->scratch_bytes,
                    name, "prepared: scratch bytes");
  failures += check(prepared.output_bytes == output_bytes, name, "prepared: output bytes");
  if (scratch_bytes > MAX_SCRATCH || output_bytes > MAX_OUTPUT) {
    printf("%s: too large for the test buffers\n", name);
    return failures + 1;
  }
  size_t highest = 0;
  const unsigned char poisons[2] = {0xA5, 0x5A};
  for (int p = 0; p < 2; ++p) {
    memset(g_scratch, poisons[p], sizeof(g_scratch));
    memset(g_output, 0, sizeof(g_output));
    const TfmcuStatus s = tfmcu_stage_run(&prepared, input, g_output, g_scratch, scratch_bytes);
    failures += check(s == kTfmcuOk, name, tfmcu_status_string(s));
    failures += check(memcmp(g_output, expected, output_bytes) == 0, name, "output differs from TFLite");
    for (size_t i = 0; i < sizeof(g_scratch); ++i) {
      if (g_scratch[i] != poisons[p] && i + 1 > highest) {
        highest = i + 1;
      }
    }
  }
  failures += check(highest == scratch_bytes, name, "highest scratch byte touched != scratch_bytes");
  failures += check(tfmcu_stage_run(&prepared, input, g_output, g_scratch, scratch_bytes - 1) ==
                        kTfmcuErrorScratchTooSmall, name, "too small scratch accepted");
  failures += check(tfmcu_stage_run(&prepared, NULL, g_output, g_scratch, scratch_bytes) ==
                        kTfmcuErrorNullPointer, name, "NULL input accepted");
  failures += check(tfmcu_stage_run(&prepared, input, NULL, g_scratch, scratch_bytes) == kTfmcuErrorNullPointer,
                    name, "NULL output accepted");
  failures += check(tfmcu_stage_run(&prepared, input, g_output, NULL, scratch_bytes) == kTfmcuErrorNullPointer,
                    name, "NULL scratch accepted");

  /* A NULL or not-ready prepared stage is refused by run, with nothing written. */
  memset(g_output, 0x33, sizeof(g_output));
  failures += check(tfmcu_stage_run(NULL, input, g_output, g_scratch, scratch_bytes) == kTfmcuErrorNullPointer,
                    name, "NULL prepared accepted");
  TfmcuPreparedStage not_ready = prepared;
  not_ready.ready = 0;
  failures += check(tfmcu_stage_run(&not_ready, input, g_output, g_scratch, scratch_bytes) ==
                        kTfmcuErrorInvalidStage, name, "not-ready prepared accepted");
  not_ready = prepared;
  not_ready.stage = NULL;
  failures += check(tfmcu_stage_run(&not_ready, input, g_output, g_scratch, scratch_bytes) ==
                        kTfmcuErrorInvalidStage, name, "prepared without a stage accepted");
  int untouched = 1;
  for (size_t i = 0; i < output_bytes; ++i) {
    untouched &= g_output[i] == 0x33;
  }
  failures += check(untouched, name, "a refused run wrote the output");
  failed_layer = 0;
  failures += check(tfmcu_stage_prepare(stage, NULL, &failed_layer) == kTfmcuErrorNullPointer && failed_layer == -1,
                    name, "prepare into NULL accepted");

  /* Broken copies of the description are refused before anything runs: by check and by prepare (same status and
   * failed layer), which leaves the prepared stage not ready; run then refuses it. */
  TfmcuStage broken = *stage;
  broken.scratch_bytes += 1;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorInvalidStage, name, "wrong scratch_bytes");
  failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                    "wrong scratch_bytes prepared");
  broken = *stage;
  broken.grid_rows = 0;
  failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                    "empty grid accepted");
  broken = *stage;
  broken.layers = NULL;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorNullPointer, name, "NULL layers accepted");
  failures += check(prepare_refuses(&broken, kTfmcuErrorNullPointer, input, scratch_bytes), name,
                    "NULL layers prepared");
  broken = *stage;
  broken.output_tensor = broken.input_tensor;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorInvalidStage, name, "output == input");
  failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                    "output == input prepared");
  broken = *stage;
  broken.buffer_offsets = NULL;
  failures += check(tfmcu_stage_check(&broken, NULL) == kTfmcuErrorNullPointer, name, "NULL offsets accepted");
  failures += check(prepare_refuses(&broken, kTfmcuErrorNullPointer, input, scratch_bytes), name,
                    "NULL offsets prepared");
  failures += check(prepare_refuses(NULL, kTfmcuErrorNullPointer, input, scratch_bytes), name,
                    "NULL stage prepared");
  broken = *stage;
  broken.params = NULL;
  failures += check(prepare_refuses(&broken, kTfmcuErrorNullPointer, input, scratch_bytes), name,
                    "NULL params prepared");
  /* Arrays past the end of the constants (the stages here all have a layer with weights). */
  broken = *stage;
  broken.constants_bytes = 0;
  failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                    "arrays outside the constants prepared");

  /* A layer with an unknown op type, or a broken params struct: prepare reports that layer. */
  if (stage->num_layers <= MAX_LAYERS) {
    TfmcuLayer layers[MAX_LAYERS];
    const int32_t last = stage->num_layers - 1;
    memcpy(layers, stage->layers, (size_t)stage->num_layers * sizeof(TfmcuLayer));
    broken = *stage;
    broken.layers = layers;
    layers[last].type = 99;
    failures += check(prepare_refuses(&broken, kTfmcuErrorUnsupportedOp, input, scratch_bytes), name,
                      "unknown op type prepared");
    layers[last].type = 0;
    failures += check(prepare_refuses(&broken, kTfmcuErrorUnsupportedOp, input, scratch_bytes), name,
                      "op type 0 prepared");
    layers[last] = stage->layers[last];
    layers[last].params = stage->params_words;
    failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                      "params record past the params prepared");
    layers[last] = stage->layers[last];
    layers[last].num_inputs = layers[last].num_inputs == 1 ? 2 : 1;
    failures += check(prepare_refuses(&broken, kTfmcuErrorInvalidStage, input, scratch_bytes), name,
                      "wrong number of inputs prepared");
  } else {
    printf("%s: more layers than the test's copy holds\n", name);
    failures++;
  }

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
