/* The optimised backend on the target: the golden vectors of the host unit tests (tflm_patch_kernels/tests/
 * golden_*.h, TFLite reference-kernel outputs from tools/gen/gen_golden.py), run on Cortex-M through the library
 * built with -DTFMCU_CMSIS_NN (//tflm_patch_kernels:patch_kernels_cmsis_nn).
 *
 * 1. Every kernel case whose op has a backend (tfmcu_op_info(type)->backend_run): on packed buffers (one CMSIS-NN
 *    call) and with input and output boxes inside larger poisoned buffers (row stride > width x channels: one call
 *    per output row, input rows staged), with exactly the kernel buffer the op's backend_scratch asks for (poisoned:
 *    nothing past it may be written) and refused with one byte less. Output bytes must be TFLite's and nothing
 *    outside the output box written. Every other int8 case runs its portable kernel (op->run) the same two ways: the
 *    portable arithmetic compiled for the core (the element-wise ops' fixed point included).
 * 2. Both golden stages (every op type, padding at patch borders, pooling windows cut by the input border, the
 *    grouped / dilated / depth-multiplier-2 convolutions the backend routes to the portable kernels): prepared
 *    scratch == the figure tfmcu.plan.cmsis_nn predicts (in the header; on a core with Helium its MVE figure),
 *    output == TFLite's, nothing written past the scratch, one byte less refused.
 * 3. MUL through CMSIS-NN (arm_elementwise_mul_s8) against the portable kernel on every pair of int8 values, for
 *    params at the edges where two implementations of the arithmetic could round apart: offsets at the ends of
 *    CMSIS-NN's range, left and right shifts, exact halves before and after the shift (the Helium code's fix-up of
 *    negative halves), with n = 256 and 253 elements per call (the unrolled loops and their leftovers).
 * The result line gives the backend's name and the numbers of backend and portable cases and MUL pair calls run;
 * tools/qemu/run_firmware.py compares them with backend_golden_expect.json. */
#include <stdint.h>
#include <string.h>

#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/tests/golden_kernels.h"
#include "tflm_patch_kernels/tests/golden_stage.h"

#define MAX_ELEMENTS 4096
#define MARGIN 3        /* pixels around a box in the strided run */
#define GUARD 64        /* poisoned bytes checked past every buffer */
#define MAX_SCRATCH 16384 /* (Helium's depthwise buffer: four blocks of 124 channels x the kernel's taps) */

#if defined(__ARM_FEATURE_MVE) /* CMSIS-NN's Helium code and its buffers */
#define INT8_STAGE_SCRATCH GOLDEN_STAGE_INT8_CMSIS_NN_SCRATCH_BYTES_MVE
#define FLOAT_STAGE_SCRATCH GOLDEN_STAGE_FLOAT_CMSIS_NN_SCRATCH_BYTES_MVE
#else
#define INT8_STAGE_SCRATCH GOLDEN_STAGE_INT8_CMSIS_NN_SCRATCH_BYTES
#define FLOAT_STAGE_SCRATCH GOLDEN_STAGE_FLOAT_CMSIS_NN_SCRATCH_BYTES
#endif

static int8_t g_input[MAX_ELEMENTS];
static int8_t g_input2[MAX_ELEMENTS];
static int8_t g_output[MAX_ELEMENTS];
static int8_t g_kernel_scratch[MAX_SCRATCH + GUARD] __attribute__((aligned(4)));
static unsigned char g_scratch[MAX_SCRATCH + GUARD] __attribute__((aligned(4)));

static int fail(const char* name, const char* what) {
  tfmcu_puts(name);
  tfmcu_puts(": ");
  tfmcu_puts(what);
  tfmcu_puts("\n");
  tfmcu_fail(what);
  return 1;
}

/* One backend run of case `c` (its portable run when the op has no backend) with input / output row strides (in
 * elements); the boxes start at the given origins of g_input / g_input2 / g_output (input 2: in2_h x in2_w x in_c,
 * its own stride). Checks the output box against the golden bytes, the rest of g_output against its poison, the
 * kernel buffer past `need` against its poison, and that need - 1 bytes are refused. */
static int run_case(const TfmcuOpInfo* op, const TfmcuGoldenKernelCase* c, int32_t in_origin, int32_t in_stride,
                    int32_t in2_origin, int32_t in2_stride, int32_t out_origin, int32_t out_stride,
                    const char* how) {
  const TfmcuConstView in[2] = {{&g_input[in_origin], c->in_h, c->in_w, c->in_c, in_stride},
                                {&g_input2[in2_origin], c->in2_h, c->in2_w, c->in_c, in2_stride}};
  const TfmcuView out = {&g_output[out_origin], c->out_h, c->out_w, c->out_c, out_stride};
  const int32_t need = op->backend_run != NULL && op->backend_scratch != NULL
                           ? op->backend_scratch(c->params, in, c->pad_top, c->pad_left, &out)
                           : 0;
  if (need < 0 || need > MAX_SCRATCH) {
    return fail(c->name, "kernel buffer need out of range");
  }
  int failures = 0;
  memset(g_output, 0x5A, sizeof(g_output));
  memset(g_kernel_scratch, 0xA5, sizeof(g_kernel_scratch));
  const TfmcuKernelScratch scratch = {g_kernel_scratch, need};
  const TfmcuStatus s = op->backend_run != NULL
                            ? op->backend_run(c->params, in, c->pad_top, c->pad_left, &out, &scratch)
                            : op->run(c->params, in, c->pad_top, c->pad_left, &out);
  if (s != kTfmcuOk) {
    failures += fail(c->name, tfmcu_status_string(s));
  }
  const int32_t out_row = c->out_w * c->out_c;
  for (int32_t i = 0; i < MAX_ELEMENTS && failures == 0; ++i) {
    const int32_t rel = i - out_origin;
    const int32_t y = rel >= 0 ? rel / out_stride : -1;
    const int32_t x = rel >= 0 ? rel % out_stride : -1;
    const int inside = rel >= 0 && y < c->out_h && x < out_row;
    if (inside ? g_output[i] != c->expected[y * out_row + x] : g_output[i] != 0x5A) {
      failures += fail(c->name, inside ? "output differs from TFLite" : "written outside the output box");
    }
  }
  for (int32_t i = need; i < MAX_SCRATCH + GUARD && failures == 0; ++i) {
    if (g_kernel_scratch[i] != (int8_t)0xA5) {
      failures += fail(c->name, "written past the kernel buffer it asked for");
    }
  }
  if (need > 0) {
    const TfmcuKernelScratch short_scratch = {g_kernel_scratch, need - 1};
    if (op->backend_run(c->params, in, c->pad_top, c->pad_left, &out, &short_scratch) !=
        kTfmcuErrorScratchTooSmall) {
      failures += fail(c->name, "a kernel buffer one byte short accepted");
    }
  }
  tfmcu_puts(c->name);
  tfmcu_puts(failures ? " FAIL (" : " ok (");
  tfmcu_puts(op->backend_run != NULL ? "backend, " : "portable, ");
  tfmcu_puts(how);
  tfmcu_puts(", kernel buffer ");
  tfmcu_put_u64((uint64_t)need);
  tfmcu_puts(" bytes)\n");
  return failures;
}

/* Both runs of a case; returns the failures. */
static int check_case(const TfmcuOpInfo* op, const TfmcuGoldenKernelCase* c) {
  const int32_t in_row = c->in_w * c->in_c;
  const int32_t in2_row = c->in2_w * c->in_c;
  if (c->in_h * in_row > MAX_ELEMENTS || c->in2_h * in2_row > MAX_ELEMENTS) {
    return fail(c->name, "case too large for the test buffers");
  }
  /* 1. Packed. */
  memcpy(g_input, c->input, (size_t)(c->in_h * in_row));
  if (c->input2 != NULL) {
    memcpy(g_input2, c->input2, (size_t)(c->in2_h * in2_row));
  }
  int failures = run_case(op, c, 0, in_row, 0, in2_row, 0, c->out_w * c->out_c, "packed");

  /* 2. Boxes inside poisoned buffers, MARGIN pixels on every side. */
  const int32_t in_stride = (c->in_w + 2 * MARGIN) * c->in_c;
  const int32_t in2_stride = (c->in2_w + 2 * MARGIN) * c->in_c;
  const int32_t out_stride = (c->out_w + 2 * MARGIN) * c->out_c;
  const int32_t in_origin = MARGIN * in_stride + MARGIN * c->in_c;
  const int32_t in2_origin = MARGIN * in2_stride + MARGIN * c->in_c;
  const int32_t out_origin = MARGIN * out_stride + MARGIN * c->out_c;
  if ((c->in_h + 2 * MARGIN) * in_stride > MAX_ELEMENTS || (c->in2_h + 2 * MARGIN) * in2_stride > MAX_ELEMENTS ||
      (c->out_h + 2 * MARGIN) * out_stride > MAX_ELEMENTS) {
    return failures + fail(c->name, "case too large for the test buffers");
  }
  memset(g_input, 0x7F, sizeof(g_input)); /* any read outside the box would change the result */
  memset(g_input2, 0x7F, sizeof(g_input2));
  for (int32_t y = 0; y < c->in_h; ++y) {
    memcpy(&g_input[in_origin + y * in_stride], (const int8_t*)c->input + y * in_row, (size_t)in_row);
  }
  for (int32_t y = 0; y < c->in2_h && c->input2 != NULL; ++y) {
    memcpy(&g_input2[in2_origin + y * in2_stride], c->input2 + y * in2_row, (size_t)in2_row);
  }
  return failures + run_case(op, c, in_origin, in_stride, in2_origin, in2_stride, out_origin, out_stride, "strided");
}

/* Section 3 (see the file comment): returns the failures, counts the calls in *calls. */
static int check_mul_pairs(int32_t* calls) {
  /* {input1_offset, input2_offset, output_offset, output_multiplier, output_shift, act_min, act_max} */
  static const TfmcuMulParams kParams[] = {
      {128, -127, 5, 1490230557, -5, -128, 127},   /* products one half off an output step after the shift */
      {-127, 128, -128, 1073741824, 0, -128, 127}, /* multiplier 1/2: odd products are exact halves */
      {0, 0, 0, 1073741824, -3, -128, 127},        /* ... and halves again after the right shift, of both signs */
      {0, 0, 0, 1518500250, 2, -100, 100},         /* a left shift, a narrower clamp */
      {7, -3, 127, 2147483647, -15, -128, 127},
  };
  static int8_t a[256], b[256], backend[256], portable[256];
  const TfmcuOpInfo* op = tfmcu_op_info(kTfmcuOpMul);
  const int32_t sizes[2] = {256, 253};
  int failures = 0;
  for (int32_t i = 0; i < 256; ++i) {
    b[i] = (int8_t)(i - 128);
  }
  for (size_t k = 0; k < sizeof(kParams) / sizeof(kParams[0]); ++k) {
    for (int32_t v = -128; v < 128; ++v) {
      memset(a, (int)v, sizeof(a));
      for (int32_t j = 0; j < 2; ++j) {
        const TfmcuConstView in[2] = {{a, 1, sizes[j], 1, sizes[j]}, {b, 1, sizes[j], 1, sizes[j]}};
        const TfmcuView out_backend = {backend, 1, sizes[j], 1, sizes[j]};
        const TfmcuView out_portable = {portable, 1, sizes[j], 1, sizes[j]};
        const TfmcuKernelScratch none = {NULL, 0};
        if (op->backend_run(&kParams[k], in, 0, 0, &out_backend, &none) != kTfmcuOk ||
            tfmcu_mul_s8(&kParams[k], &in[0], &in[1], &out_portable) != kTfmcuOk ||
            memcmp(backend, portable, (size_t)sizes[j]) != 0) {
          failures += fail("mul_pairs", "arm_elementwise_mul_s8 differs from the portable kernel");
        }
        ++*calls;
      }
    }
  }
  tfmcu_puts(failures ? "mul_pairs FAIL\n" : "mul_pairs ok (every pair of int8 values, 5 params)\n");
  return failures;
}

/* A golden stage through tfmcu_stage_prepare / tfmcu_stage_run with the backend compiled in. */
static int check_stage(const char* name, const TfmcuStage* stage, const void* input, const int8_t* expected,
                       uint32_t predicted_scratch, uint32_t output_bytes) {
  int failures = 0;
  TfmcuPreparedStage prepared;
  int32_t failed_layer = 0;
  if (tfmcu_stage_prepare(stage, &prepared, &failed_layer) != kTfmcuOk) {
    return fail(name, "prepare failed");
  }
  if (prepared.scratch_bytes != predicted_scratch) {
    failures += fail(name, "prepared scratch != tfmcu.plan.cmsis_nn's prediction");
  }
  if (prepared.scratch_bytes > MAX_SCRATCH || output_bytes > MAX_ELEMENTS) {
    return failures + fail(name, "too large for the test buffers");
  }
  memset(g_scratch, 0xA5, sizeof(g_scratch));
  memset(g_output, 0x5A, sizeof(g_output));
  tfmcu_region_begin(name);
  const TfmcuStatus s = tfmcu_stage_run(&prepared, input, g_output, g_scratch, prepared.scratch_bytes);
  tfmcu_region_end();
  if (s != kTfmcuOk) {
    failures += fail(name, tfmcu_status_string(s));
  } else if (memcmp(g_output, expected, output_bytes) != 0) {
    failures += fail(name, "stage output differs from TFLite");
  }
  for (uint32_t i = prepared.scratch_bytes; i < sizeof(g_scratch); ++i) {
    if (g_scratch[i] != 0xA5) {
      failures += fail(name, "written past the prepared scratch");
      break;
    }
  }
  if (tfmcu_stage_run(&prepared, input, g_output, g_scratch, prepared.scratch_bytes - 1) !=
      kTfmcuErrorScratchTooSmall) {
    failures += fail(name, "a scratch one byte short accepted");
  }
  tfmcu_puts(name);
  tfmcu_puts(failures ? " FAIL (scratch " : " ok (scratch ");
  tfmcu_put_u64(prepared.scratch_bytes);
  tfmcu_puts(" bytes, kernel buffer ");
  tfmcu_put_u64(prepared.kernel_scratch_bytes);
  tfmcu_puts(")\n");
  return failures;
}

int main(void) {
  int failures = 0;
  int32_t backend_cases = 0;
  int32_t portable_cases = 0;
  const int32_t n = (int32_t)(sizeof(kGoldenKernelCases) / sizeof(kGoldenKernelCases[0]));
  for (int32_t i = 0; i < n; ++i) {
    const TfmcuGoldenKernelCase* c = &kGoldenKernelCases[i];
    const TfmcuOpInfo* op = tfmcu_op_info(c->type);
    if (op == NULL) {
      failures += fail(c->name, "op type missing from the op table");
    } else if (op->backend_run != NULL) {
      failures += check_case(op, c);
      backend_cases++;
    } else if (op->input_dtype == kTfmcuInt8) {
      failures += check_case(op, c);
      portable_cases++;
    }
  }
  int32_t mul_pairs = 0;
  failures += check_mul_pairs(&mul_pairs);
  failures += check_stage("golden_stage_int8", &golden_stage_int8, golden_stage_int8_input,
                          golden_stage_int8_expected, INT8_STAGE_SCRATCH,
                          GOLDEN_STAGE_INT8_OUTPUT_BYTES);
  failures += check_stage("golden_stage_float", &golden_stage_float, golden_stage_float_input,
                          golden_stage_float_expected, FLOAT_STAGE_SCRATCH,
                          GOLDEN_STAGE_FLOAT_OUTPUT_BYTES);
  tfmcu_result_begin("backend_golden");  /* after the per-case lines: the result is one line */
  tfmcu_result_str("backend", tfmcu_backend_name());
  tfmcu_result_int("backend_cases", backend_cases);
  tfmcu_result_int("portable_cases", portable_cases);
  tfmcu_result_int("mul_pair_calls", mul_pairs);
  tfmcu_result_int("failed_checks", failures);
  return tfmcu_result_end();
}
