/* The op table: see op_table.h. One row per TfmcuOpType, indexed by its value (row 0 and gaps: unknown). */
#include "op_table.h"

static const TfmcuOpInfo kTfmcuOps[] = {
    [kTfmcuOpConv2D] = {1, kTfmcuInt8, tfmcu_conv2d_op_window, tfmcu_conv2d_op_check, tfmcu_conv2d_op_run},
    [kTfmcuOpDepthwiseConv2D] = {1, kTfmcuInt8, tfmcu_depthwise_conv2d_op_window, tfmcu_depthwise_conv2d_op_check,
                                 tfmcu_depthwise_conv2d_op_run},
    [kTfmcuOpAdd] = {2, kTfmcuInt8, NULL, tfmcu_add_op_check, tfmcu_add_op_run},
    [kTfmcuOpPad] = {1, kTfmcuInt8, tfmcu_pad_op_window, tfmcu_pad_op_check, tfmcu_pad_op_run},
    [kTfmcuOpAveragePool2D] = {1, kTfmcuInt8, tfmcu_avg_pool2d_op_window, tfmcu_avg_pool2d_op_check,
                               tfmcu_avg_pool2d_op_run},
    [kTfmcuOpMaxPool2D] = {1, kTfmcuInt8, tfmcu_max_pool2d_op_window, tfmcu_max_pool2d_op_check,
                           tfmcu_max_pool2d_op_run},
    [kTfmcuOpQuantize] = {1, kTfmcuFloat32, NULL, tfmcu_quantize_op_check, tfmcu_quantize_op_run},
};

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
