/* Each C kernel alone against TFLite reference-kernel outputs (golden_kernels.h, from tools/gen/gen_golden.py).
 *
 * Every case runs twice: on packed buffers, and with input and output boxes placed inside larger poisoned buffers
 * (row stride > width * channels, an offset origin) to check the strides and that nothing outside the output box
 * is written. Each run goes through the op table (tfmcu_op_run) and, as a reference, through the kernel called
 * by name (tfmcu_conv2d_s8, ...): both must give the golden bytes, and the same status and bytes everywhere in
 * the output buffer. tfmcu_op_run's own errors (unknown type, wrong input count, NULL inputs) are checked too.
 * Exit status 0 = all cases bit-exact. */
#include <stdio.h>
#include <string.h>

#include "tflm_patch_kernels/tests/golden_kernels.h"

#define MAX_ELEMENTS 4096
#define MARGIN 3 /* extra pixels around a box in the strided run */

static float g_float_input[MAX_ELEMENTS];
static int8_t g_input[MAX_ELEMENTS];
static int8_t g_input2[MAX_ELEMENTS];
static int8_t g_output[MAX_ELEMENTS];
static int8_t g_reference[MAX_ELEMENTS];

/* Through the op table: the single entry point the stage executor and the Python binding use. in2_stride: input 2's
 * row stride (its box is in2_h x in2_w x in_c: the output's size, or 1 x 1 x C broadcast). */
static TfmcuStatus run(const TfmcuGoldenKernelCase* c, const void* input, const int8_t* input2, int32_t in_stride,
                       int32_t in2_stride, int8_t* output, int32_t out_stride) {
  /* QUANTIZE: the view's data points at the floats, row_stride counts floats. */
  const TfmcuConstView in[2] = {{(const int8_t*)input, c->in_h, c->in_w, c->in_c, in_stride},
                                {input2, c->in2_h, c->in2_w, c->in_c, in2_stride}};
  TfmcuView out = {output, c->out_h, c->out_w, c->out_c, out_stride};
  return tfmcu_op_run(c->type, c->params, in, input2 != NULL ? 2 : 1, c->pad_top, c->pad_left, &out);
}

/* The reference: each kernel called by name, with its own argument list. */
static TfmcuStatus run_kernel(const TfmcuGoldenKernelCase* c, const void* input, const int8_t* input2,
                              int32_t in_stride, int32_t in2_stride, int8_t* output, int32_t out_stride) {
  TfmcuConstView in = {(const int8_t*)input, c->in_h, c->in_w, c->in_c, in_stride};
  TfmcuConstView in2 = {input2, c->in2_h, c->in2_w, c->in_c, in2_stride};
  TfmcuView out = {output, c->out_h, c->out_w, c->out_c, out_stride};
  switch (c->type) {
    case kTfmcuOpConv2D:
      return tfmcu_conv2d_s8((const TfmcuConvParams*)c->params, &in, c->pad_top, c->pad_left, &out);
    case kTfmcuOpDepthwiseConv2D:
      return tfmcu_depthwise_conv2d_s8((const TfmcuDepthwiseConvParams*)c->params, &in, c->pad_top, c->pad_left,
                                       &out);
    case kTfmcuOpAdd:
      return tfmcu_add_s8((const TfmcuAddParams*)c->params, &in, &in2, &out);
    case kTfmcuOpPad:
      return tfmcu_pad_s8((const TfmcuPadParams*)c->params, &in, c->pad_top, c->pad_left, &out);
    case kTfmcuOpAveragePool2D:
      return tfmcu_avg_pool2d_s8((const TfmcuPoolParams*)c->params, &in, c->pad_top, c->pad_left, &out);
    case kTfmcuOpMaxPool2D:
      return tfmcu_max_pool2d_s8((const TfmcuPoolParams*)c->params, &in, c->pad_top, c->pad_left, &out);
    case kTfmcuOpQuantize: {
      TfmcuConstViewF32 fin = {(const float*)input, c->in_h, c->in_w, c->in_c, in_stride};
      return tfmcu_quantize_f32_s8((const TfmcuQuantizeParams*)c->params, &fin, &out);
    }
    case kTfmcuOpMul:
      return tfmcu_mul_s8((const TfmcuMulParams*)c->params, &in, &in2, &out);
    case kTfmcuOpSub:
      return tfmcu_sub_s8((const TfmcuAddParams*)c->params, &in, &in2, &out);
    case kTfmcuOpHardSwish:
      return tfmcu_hard_swish_s8((const TfmcuHardSwishParams*)c->params, &in, &out);
    case kTfmcuOpLogistic:
      return tfmcu_logistic_s8((const TfmcuLogisticParams*)c->params, &in, &out);
    case kTfmcuOpTanh:
      return tfmcu_tanh_s8((const TfmcuTanhParams*)c->params, &in, &out);
    case kTfmcuOpLeakyRelu:
      return tfmcu_leaky_relu_s8((const TfmcuLeakyReluParams*)c->params, &in, &out);
    default:
      return kTfmcuErrorUnsupportedOp;
  }
}

/* run() and run_kernel() on the same inputs, each into a copy of the output buffer `output` (of `total` elements,
 * the box at `origin`): same status and the same bytes everywhere in the buffer. Leaves run()'s result in
 * `output`. */
static TfmcuStatus run_both(const TfmcuGoldenKernelCase* c, const void* input, const int8_t* input2,
                            int32_t in_stride, int32_t in2_stride, int8_t* output, int32_t origin,
                            int32_t out_stride, int32_t total, int* differs) {
  memcpy(g_reference, output, (size_t)total);
  const TfmcuStatus reference =
      run_kernel(c, input, input2, in_stride, in2_stride, g_reference + origin, out_stride);
  const TfmcuStatus s = run(c, input, input2, in_stride, in2_stride, output + origin, out_stride);
  *differs = s != reference || memcmp(output, g_reference, (size_t)total) != 0;
  return s;
}

static int check_case(const TfmcuGoldenKernelCase* c) {
  const int32_t in_row = c->in_w * c->in_c;
  const int32_t in2_row = c->in2_w * c->in_c;
  const int32_t out_row = c->out_w * c->out_c;
  const int32_t out_size = c->out_h * out_row;
  int failures = 0;

  /* 1. Packed buffers. */
  memset(g_output, 0x5A, sizeof(g_output));
  int differs = 0;
  TfmcuStatus s = run_both(c, c->input, c->input2, in_row, in2_row, g_output, 0, out_row, out_size, &differs);
  if (s != kTfmcuOk || memcmp(g_output, c->expected, (size_t)out_size) != 0) {
    printf("%s: packed run %s\n", c->name, s != kTfmcuOk ? tfmcu_status_string(s) : "differs from TFLite");
    failures++;
  }
  if (differs) {
    printf("%s: packed run: tfmcu_op_run differs from the kernel called by name\n", c->name);
    failures++;
  }

  /* 2. Boxes inside larger buffers: MARGIN pixels on every side. */
  const int32_t in_stride = (c->in_w + 2 * MARGIN) * c->in_c;
  const int32_t in2_stride = (c->in2_w + 2 * MARGIN) * c->in_c;
  const int32_t out_stride = (c->out_w + 2 * MARGIN) * c->out_c;
  const int32_t in_origin = MARGIN * in_stride + MARGIN * c->in_c;
  const int32_t in2_origin = MARGIN * in2_stride + MARGIN * c->in_c;
  const int32_t out_origin = MARGIN * out_stride + MARGIN * c->out_c;
  const int32_t out_total = (c->out_h + 2 * MARGIN) * out_stride;
  if ((c->in_h + 2 * MARGIN) * in_stride > MAX_ELEMENTS || (c->in2_h + 2 * MARGIN) * in2_stride > MAX_ELEMENTS ||
      out_total > MAX_ELEMENTS) {
    printf("%s: case too large for the test buffers\n", c->name);
    return failures + 1;
  }
  memset(g_input, 0x7F, sizeof(g_input)); /* poison: any read outside the box would change results */
  memset(g_input2, 0x7F, sizeof(g_input2));
  for (int32_t i = 0; i < MAX_ELEMENTS; ++i) {
    g_float_input[i] = 1e6f;
  }
  for (int32_t y = 0; y < c->in_h; ++y) {
    if (c->type == kTfmcuOpQuantize) {
      memcpy(&g_float_input[in_origin + y * in_stride], (const float*)c->input + y * in_row,
             (size_t)in_row * sizeof(float));
    } else {
      memcpy(&g_input[in_origin + y * in_stride], (const int8_t*)c->input + y * in_row, (size_t)in_row);
    }
  }
  for (int32_t y = 0; y < c->in2_h && c->input2 != NULL; ++y) {
    memcpy(&g_input2[in2_origin + y * in2_stride], c->input2 + y * in2_row, (size_t)in2_row);
  }
  memset(g_output, 0x5A, sizeof(g_output));
  const void* input = c->type == kTfmcuOpQuantize ? (const void*)&g_float_input[in_origin]
                                                  : (const void*)&g_input[in_origin];
  s = run_both(c, input, c->input2 != NULL ? &g_input2[in2_origin] : NULL, in_stride, in2_stride, g_output,
               out_origin, out_stride, out_total, &differs);
  int bad = s != kTfmcuOk;
  for (int32_t y = 0; y < c->out_h + 2 * MARGIN && !bad; ++y) {
    for (int32_t x = 0; x < out_stride && !bad; ++x) {
      const int32_t px = x / c->out_c - MARGIN;
      const int32_t row = y - MARGIN;
      const int8_t got = g_output[y * out_stride + x];
      if (row >= 0 && row < c->out_h && px >= 0 && px < c->out_w) {
        bad = got != c->expected[row * out_row + px * c->out_c + x % c->out_c];
      } else {
        bad = got != 0x5A; /* written outside the output box */
      }
    }
  }
  if (bad) {
    printf("%s: strided run %s\n", c->name, s != kTfmcuOk ? tfmcu_status_string(s) : "differs");
    failures++;
  }
  if (differs) {
    printf("%s: strided run: tfmcu_op_run differs from the kernel called by name\n", c->name);
    failures++;
  }

  /* 3. tfmcu_op_run's own refusals: a wrong number of inputs, NULL inputs; nothing written. */
  memset(g_output, 0x5A, sizeof(g_output));
  const TfmcuConstView in[2] = {{(const int8_t*)c->input, c->in_h, c->in_w, c->in_c, in_row},
                                {c->input2, c->in2_h, c->in2_w, c->in_c, in2_row}};
  const TfmcuView out = {g_output, c->out_h, c->out_w, c->out_c, out_row};
  const int32_t num_inputs = c->input2 != NULL ? 2 : 1;
  const int32_t wrong_inputs[3] = {0, 3 - num_inputs, 3};
  for (int k = 0; k < 3; ++k) {
    if (tfmcu_op_run(c->type, c->params, in, wrong_inputs[k], c->pad_top, c->pad_left, &out) !=
        kTfmcuErrorShapeMismatch) {
      printf("%s: tfmcu_op_run accepted %d inputs\n", c->name, (int)wrong_inputs[k]);
      failures++;
    }
  }
  if (tfmcu_op_run(c->type, c->params, NULL, num_inputs, c->pad_top, c->pad_left, &out) != kTfmcuErrorNullPointer) {
    printf("%s: tfmcu_op_run accepted NULL inputs\n", c->name);
    failures++;
  }
  if (c->input2 != NULL && c->out_h > 1 && c->out_w > 1) {  /* input 2 neither the output's size nor 1 x 1 x C */
    const TfmcuConstView bad[2] = {in[0], {c->input2, c->out_h, 1, c->in_c, c->in_c}};
    if (tfmcu_op_run(c->type, c->params, bad, 2, c->pad_top, c->pad_left, &out) != kTfmcuErrorShapeMismatch) {
      printf("%s: tfmcu_op_run accepted an input 2 of %d x 1 for an output of %d x %d\n", c->name, (int)c->out_h,
             (int)c->out_h, (int)c->out_w);
      failures++;
    }
  }
  for (int32_t i = 0; i < MAX_ELEMENTS; ++i) {
    if (g_output[i] != 0x5A) {
      printf("%s: a refused tfmcu_op_run wrote the output\n", c->name);
      failures++;
      break;
    }
  }  printf("%-32s %s\n", c->name, failures ? "FAIL" : "ok");
  return failures;
}

/* Unknown op types are refused by the table, whatever the other arguments. */
static int check_unknown_types(void) {
  const TfmcuGoldenKernelCase* c = &kGoldenKernelCases[0];
  const TfmcuConstView in = {(const int8_t*)c->input, c->in_h, c->in_w, c->in_c, c->in_w * c->in_c};
  const TfmcuView out = {g_output, c->out_h, c->out_w, c->out_c, c->out_w * c->out_c};
  const int32_t types[5] = {0, -1, kTfmcuOpSub + 1, 1000, INT32_MIN};
  int failures = 0;
  for (int k = 0; k < 5; ++k) {
    if (tfmcu_op_run(types[k], c->params, &in, 1, 0, 0, &out) != kTfmcuErrorUnsupportedOp ||
        tfmcu_op_info(types[k]) != NULL) {
      printf("op type %ld accepted\n", (long)types[k]);
      failures++;
    }
  }
  for (int32_t t = kTfmcuOpConv2D; t <= kTfmcuOpSub; ++t) {
    const TfmcuOpInfo* op = tfmcu_op_info(t);
    if (op == NULL || op->run == NULL || op->check == NULL) {
      printf("op type %ld missing from the op table\n", (long)t);
      failures++;
    }
  }
  printf("%-32s %s\n", "op table: unknown types", failures ? "FAIL" : "ok");
  return failures;
}

int main(void) {
  int failed_cases = 0;
  const int n = (int)(sizeof(kGoldenKernelCases) / sizeof(kGoldenKernelCases[0]));
  for (int i = 0; i < n; ++i) {
    failed_cases += check_case(&kGoldenKernelCases[i]) != 0;
  }
  printf("%d of %d kernel cases bit-exact\n", n - failed_cases, n);
  const int table_failures = check_unknown_types();
  return failed_cases != 0 || table_failures != 0;
}
