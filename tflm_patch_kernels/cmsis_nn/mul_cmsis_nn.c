/* MUL through CMSIS-NN's arm_elementwise_mul_s8 (what TFLM's cmsis_nn/mul.cc calls for int8 operands of the same
 * shape): see cmsis_nn_backend.h. One call over the whole box when the three boxes are dense, else one call per row
 * (a row of a box is always contiguous). No kernel buffer. Bit-exact with the portable kernel (mul.h): CMSIS-NN
 * multiplies the offset operands as TFLite does and requantizes with arm_nn_requantize, whose doubling high multiply
 * rounds as gemmlowp's SaturatingRoundingDoublingHighMul (the saturating case cannot occur with a multiplier below
 * 2^31) and whose division by a power of two rounds halves away from zero (the Helium code's too, with its fix-up of
 * negative values). A broadcast input 2 (1 x 1 x C) runs the portable kernel, as TFLM's broadcast runs the reference
 * one. */
#include "cmsis_nn/cmsis_nn_backend.h"

#include "arm_nnfunctions.h"
#include "mul.h"

static int tfmcu_mul_cmsis_nn_covers(const TfmcuMulParams* p) {
  return p->input1_offset >= -127 && p->input1_offset <= 128 && p->input2_offset >= -127 &&
         p->input2_offset <= 128 && p->output_offset >= -128 && p->output_offset <= 127;
}

TfmcuStatus tfmcu_mul_cmsis_nn_run(const void* params, const TfmcuConstView* inputs, int32_t pad_top,
                                   int32_t pad_left, const TfmcuView* output,
                                   const TfmcuKernelScratch* kernel_scratch) {
  (void)kernel_scratch;
  const TfmcuMulParams* p = (const TfmcuMulParams*)params;
  if (p == NULL || inputs == NULL || output == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const TfmcuConstView* a = &inputs[0];
  const TfmcuConstView* b = &inputs[1];
  if (!tfmcu_mul_cmsis_nn_covers(p) || a->height != output->height || a->width != output->width ||
      b->height != output->height || b->width != output->width || a->channels != output->channels ||
      b->channels != output->channels) {
    return tfmcu_mul_op_run(params, inputs, pad_top, pad_left, output);  /* broadcast; its checks and errors */
  }
  const int32_t h = output->height, w = output->width, c = output->channels;
  const int dense = tfmcu_cmsis_dense(h, w, c, a->row_stride) && tfmcu_cmsis_dense(h, w, c, b->row_stride) &&
                    tfmcu_cmsis_dense(h, w, c, output->row_stride);
  const int32_t rows = dense ? 1 : h;
  const int32_t block = dense ? h * w * c : w * c;
  for (int32_t y = 0; y < rows; ++y) {
    if (arm_elementwise_mul_s8(a->data + (ptrdiff_t)y * a->row_stride, b->data + (ptrdiff_t)y * b->row_stride,
                               p->input1_offset, p->input2_offset, output->data + (ptrdiff_t)y * output->row_stride,
                               p->output_offset, p->output_multiplier, p->output_shift, p->act_min, p->act_max,
                               block) != ARM_CMSIS_NN_SUCCESS) {
      return kTfmcuErrorShapeMismatch;
    }
  }
  return kTfmcuOk;
}
