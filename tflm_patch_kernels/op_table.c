/* The op table: see op_table.h. One row per TfmcuOpType, indexed by its value (row 0 and gaps: unknown). */
#include "op_table.h"

#include <string.h>

/* The params layout a row states: `arrays` pointer fields, then `words` 4-byte scalars from `first` to `last`
 * (checked at compile time: a negative array size fails the build). */
#define TFMCU_LAYOUT(type, arrays, first, last, words)                                                        \
  typedef char tfmcu_layout_##type[(offsetof(type, first) == (arrays) * sizeof(void*) &&                      \
                                    offsetof(type, last) == offsetof(type, first) + ((words) - 1) * 4 &&       \
                                    sizeof(((type*)0)->last) == 4) ? 1 : -1]
TFMCU_LAYOUT(TfmcuConvParams, 4, kernel_h, act_max, 11);
TFMCU_LAYOUT(TfmcuDepthwiseConvParams, 4, kernel_h, act_max, 11);
TFMCU_LAYOUT(TfmcuAddParams, 0, input1_offset, act_max, 12);
TFMCU_LAYOUT(TfmcuPadParams, 0, value, value, 1);
TFMCU_LAYOUT(TfmcuPoolParams, 0, filter_h, act_max, 6);
TFMCU_LAYOUT(TfmcuQuantizeParams, 0, scale, zero_point, 2);
TFMCU_LAYOUT(TfmcuMeanParams, 0, input_offset, output_shift, 4);
TFMCU_LAYOUT(TfmcuMulParams, 0, input1_offset, act_max, 7);
TFMCU_LAYOUT(TfmcuHardSwishParams, 0, input_zero_point, output_multiplier_exponent, 6);
TFMCU_LAYOUT(TfmcuLogisticParams, 0, input_zero_point, input_left_shift, 4);
TFMCU_LAYOUT(TfmcuTanhParams, 0, input_zero_point, input_left_shift, 4);
TFMCU_LAYOUT(TfmcuLeakyReluParams, 0, input_zero_point, output_shift_identity, 6);

/* The optimised backend compiled in (tfmcu_common.h): CONV_2D, DEPTHWISE_CONV_2D, ADD, MUL and the two poolings
 * through CMSIS-NN with -DTFMCU_CMSIS_NN (cmsis_nn/), none otherwise. */
#ifdef TFMCU_CMSIS_NN
#include "cmsis_nn/cmsis_nn_backend.h"
#define TFMCU_BACKEND_NAME "cmsis_nn"
#define TFMCU_CONV2D_BACKEND tfmcu_conv2d_cmsis_nn_run, tfmcu_conv2d_cmsis_nn_scratch
#define TFMCU_DEPTHWISE_CONV2D_BACKEND tfmcu_depthwise_conv2d_cmsis_nn_run, tfmcu_depthwise_conv2d_cmsis_nn_scratch
#define TFMCU_ADD_BACKEND tfmcu_add_cmsis_nn_run, NULL
#define TFMCU_MUL_BACKEND tfmcu_mul_cmsis_nn_run, NULL
#define TFMCU_AVG_POOL2D_BACKEND tfmcu_avg_pool2d_cmsis_nn_run, tfmcu_avg_pool2d_cmsis_nn_scratch
#define TFMCU_MAX_POOL2D_BACKEND tfmcu_max_pool2d_cmsis_nn_run, tfmcu_max_pool2d_cmsis_nn_scratch
#else
#define TFMCU_BACKEND_NAME "portable"
#define TFMCU_CONV2D_BACKEND NULL, NULL
#define TFMCU_DEPTHWISE_CONV2D_BACKEND NULL, NULL
#define TFMCU_ADD_BACKEND NULL, NULL
#define TFMCU_MUL_BACKEND NULL, NULL
#define TFMCU_AVG_POOL2D_BACKEND NULL, NULL
#define TFMCU_MAX_POOL2D_BACKEND NULL, NULL
#endif

/* {num_inputs, input dtype, sizeof params, num_arrays, num_words, array_sizes, window, check, run, backend_run,
 *  backend_scratch, accumulate, finish} */
static const TfmcuOpInfo kTfmcuOps[] = {
    [kTfmcuOpConv2D] = {1, kTfmcuInt8, sizeof(TfmcuConvParams), 4, 11, tfmcu_conv2d_op_array_sizes,
                        tfmcu_conv2d_op_window, tfmcu_conv2d_op_check, tfmcu_conv2d_op_run, TFMCU_CONV2D_BACKEND},
    [kTfmcuOpDepthwiseConv2D] = {1, kTfmcuInt8, sizeof(TfmcuDepthwiseConvParams), 4, 11,
                                 tfmcu_depthwise_conv2d_op_array_sizes, tfmcu_depthwise_conv2d_op_window,
                                 tfmcu_depthwise_conv2d_op_check, tfmcu_depthwise_conv2d_op_run,
                                 TFMCU_DEPTHWISE_CONV2D_BACKEND},
    [kTfmcuOpAdd] = {2, kTfmcuInt8, sizeof(TfmcuAddParams), 0, 12, NULL, NULL, tfmcu_add_op_check,
                     tfmcu_add_op_run, TFMCU_ADD_BACKEND},
    [kTfmcuOpPad] = {1, kTfmcuInt8, sizeof(TfmcuPadParams), 0, 1, NULL, tfmcu_pad_op_window, tfmcu_pad_op_check,
                     tfmcu_pad_op_run, NULL, NULL},
    [kTfmcuOpAveragePool2D] = {1, kTfmcuInt8, sizeof(TfmcuPoolParams), 0, 6, NULL, tfmcu_avg_pool2d_op_window,
                               tfmcu_avg_pool2d_op_check, tfmcu_avg_pool2d_op_run, TFMCU_AVG_POOL2D_BACKEND},
    [kTfmcuOpMaxPool2D] = {1, kTfmcuInt8, sizeof(TfmcuPoolParams), 0, 6, NULL, tfmcu_max_pool2d_op_window,
                           tfmcu_max_pool2d_op_check, tfmcu_max_pool2d_op_run, TFMCU_MAX_POOL2D_BACKEND},
    [kTfmcuOpQuantize] = {1, kTfmcuFloat32, sizeof(TfmcuQuantizeParams), 0, 2, NULL, NULL, tfmcu_quantize_op_check,
                          tfmcu_quantize_op_run, NULL, NULL},
    [kTfmcuOpMean] = {1, kTfmcuInt8, sizeof(TfmcuMeanParams), 0, 4, NULL, NULL, tfmcu_mean_op_check, tfmcu_mean_op_run,
                      NULL, NULL, tfmcu_mean_op_accumulate, tfmcu_mean_op_finish},
    [kTfmcuOpMul] = {2, kTfmcuInt8, sizeof(TfmcuMulParams), 0, 7, NULL, NULL, tfmcu_mul_op_check, tfmcu_mul_op_run,
                     TFMCU_MUL_BACKEND},
    [kTfmcuOpHardSwish] = {1, kTfmcuInt8, sizeof(TfmcuHardSwishParams), 0, 6, NULL, NULL, tfmcu_hard_swish_op_check,
                           tfmcu_hard_swish_op_run, NULL, NULL},
    [kTfmcuOpLogistic] = {1, kTfmcuInt8, sizeof(TfmcuLogisticParams), 0, 4, NULL, NULL, tfmcu_logistic_op_check,
                          tfmcu_logistic_op_run, NULL, NULL},
    [kTfmcuOpTanh] = {1, kTfmcuInt8, sizeof(TfmcuTanhParams), 0, 4, NULL, NULL, tfmcu_tanh_op_check, tfmcu_tanh_op_run,
                      NULL, NULL},
    [kTfmcuOpLeakyRelu] = {1, kTfmcuInt8, sizeof(TfmcuLeakyReluParams), 0, 6, NULL, NULL, tfmcu_leaky_relu_op_check,
                           tfmcu_leaky_relu_op_run, NULL, NULL},
    [kTfmcuOpSub] = {2, kTfmcuInt8, sizeof(TfmcuAddParams), 0, 12, NULL, NULL, tfmcu_sub_op_check, tfmcu_sub_op_run,
                     NULL, NULL},
};

const char* tfmcu_backend_name(void) { return TFMCU_BACKEND_NAME; }

const TfmcuOpInfo* tfmcu_op_info(int32_t type) {
  if (type < 0 || (size_t)type >= sizeof(kTfmcuOps) / sizeof(kTfmcuOps[0])) {
    return NULL;
  }
  const TfmcuOpInfo* op = &kTfmcuOps[type];
  if (op->run == NULL || op->check == NULL || op->num_inputs < 1 || op->num_inputs > TFMCU_MAX_LAYER_INPUTS) {
    return NULL;  /* a gap in the table (or a malformed row) */
  }
  return op;
}

TfmcuStatus tfmcu_op_run(int32_t type, const void* params, const TfmcuConstView* inputs, int32_t num_inputs,
                         int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  const TfmcuOpInfo* op = tfmcu_op_info(type);
  if (op == NULL) {
    return kTfmcuErrorUnsupportedOp;
  }
  if (inputs == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (num_inputs != op->num_inputs) {
    return kTfmcuErrorShapeMismatch;
  }
  return op->run(params, inputs, pad_top, pad_left, output);
}

const void* tfmcu_op_params(const TfmcuOpInfo* op, const int32_t* record, const uint8_t* constants,
                            TfmcuParams* storage) {
  unsigned char* bytes = (unsigned char*)storage;
  /* Object pointers share one representation on every target this library supports; memcpy keeps the stores
   * free of type punning. Every field is written (only a 64-bit struct's tail padding is not). */
  for (int32_t k = 0; k < op->num_arrays; ++k) {
    const void* array = record[k] < 0 ? NULL : (const void*)(constants + record[k]);
    memcpy(bytes + (size_t)k * sizeof(void*), &array, sizeof(void*));
  }
  memcpy(bytes + (size_t)op->num_arrays * sizeof(void*), record + op->num_arrays, (size_t)op->num_words * 4u);
  return storage;
}
