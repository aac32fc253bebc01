/* The ops of the patch stage: their type codes and ONE table describing each (number and data type of its
 * inputs, window geometry, params check, run adapter). The stage executor (patch_stage.c) and tfmcu_op_run use
 * only this table: no other code switches on an op type.
 *
 * Adding an op: its kernel file(s) (foo.c/.h: the kernel plus the three adapters of the op interface in
 * tfmcu_common.h), a TfmcuOpType value and the #include of foo.h below, one row of the table in op_table.c.
 */
#ifndef TFMCU_PATCH_KERNELS_OP_TABLE_H_
#define TFMCU_PATCH_KERNELS_OP_TABLE_H_

#include "add.h"
#include "avg_pool2d.h"
#include "conv2d.h"
#include "depthwise_conv2d.h"
#include "hard_swish.h"
#include "leaky_relu.h"
#include "logistic.h"
#include "max_pool2d.h"
#include "mean.h"
#include "mul.h"
#include "pad.h"
#include "quantize.h"
#include "sub.h"
#include "tanh.h"
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TFMCU_MAX_LAYER_INPUTS 2

/* Layer types (values are part of the ABI). `params` must point to the struct named here. */
typedef enum {
  kTfmcuOpConv2D = 1,           /* TfmcuConvParams */
  kTfmcuOpDepthwiseConv2D = 2,  /* TfmcuDepthwiseConvParams */
  kTfmcuOpAdd = 3,              /* TfmcuAddParams (2 inputs; input 2 may be 1 x 1 x C, broadcast) */
  kTfmcuOpPad = 4,              /* TfmcuPadParams */
  kTfmcuOpAveragePool2D = 5,    /* TfmcuPoolParams */
  kTfmcuOpMaxPool2D = 6,        /* TfmcuPoolParams */
  kTfmcuOpQuantize = 7,         /* TfmcuQuantizeParams (float32 input, the stage input) */
  kTfmcuOpMean = 8,             /* TfmcuMeanParams (a reduction: the last layer of a stage, patch_stage.h) */
  kTfmcuOpMul = 9,              /* TfmcuMulParams (2 inputs; input 2 may be 1 x 1 x C, broadcast) */
  kTfmcuOpHardSwish = 10,       /* TfmcuHardSwishParams */
  kTfmcuOpLogistic = 11,        /* TfmcuLogisticParams */
  kTfmcuOpTanh = 12,            /* TfmcuTanhParams */
  kTfmcuOpLeakyRelu = 13,       /* TfmcuLeakyReluParams */
  kTfmcuOpSub = 14              /* TfmcuAddParams (2 inputs; input 2 may be 1 x 1 x C, broadcast) */
} TfmcuOpType;

typedef enum {
  kTfmcuInt8 = 0,
  kTfmcuFloat32 = 1  /* only the stage input, read by a QUANTIZE layer */
} TfmcuDataType;

/* One row of the op table. */
typedef struct {
  int32_t num_inputs;     /* 1..TFMCU_MAX_LAYER_INPUTS */
  int32_t input_dtype;    /* TfmcuDataType of every input */
  /* The params struct's layout, for tfmcu_op_params: `num_arrays` leading pointer fields (the arrays of
   * TfmcuOpArraySizesFn, in that order), then `num_words` 4-byte scalar fields (int32_t, or float as its bits). */
  uint32_t params_size;   /* sizeof the params struct */
  int32_t num_arrays;     /* 0..TFMCU_MAX_PARAM_ARRAYS */
  int32_t num_words;
  TfmcuOpArraySizesFn array_sizes;  /* ops with arrays; NULL otherwise */
  TfmcuOpWindowFn window; /* window ops (conv, depthwise, pooling, PAD); NULL for pointwise ops, whose read box
                             equals their output box */
  TfmcuOpCheckFn check;
  TfmcuOpRunFn run;       /* the portable kernel */
  /* The optimised backend of this build (tfmcu_common.h), or NULL: the stage executor then runs `run`. */
  TfmcuOpBackendRunFn backend_run;
  TfmcuOpBackendScratchFn backend_scratch;  /* NULL: the backend needs no kernel buffer */
  /* A reduction (MEAN; tfmcu_common.h): a patch stage sums its input patch by patch, then finishes. NULL, NULL for
   * every other op. */
  TfmcuOpAccumulateFn accumulate;
  TfmcuOpFinishFn finish;
} TfmcuOpInfo;

/* The name of the backend compiled in: "portable" or "cmsis_nn" (-DTFMCU_CMSIS_NN). */
const char* tfmcu_backend_name(void);

/* The table row of op type `type`, or NULL for an unknown type. */
const TfmcuOpInfo* tfmcu_op_info(int32_t type);

/* Storage for any op's params struct (tfmcu_op_params). */
typedef union {
  TfmcuConvParams conv;
  TfmcuDepthwiseConvParams depthwise;
  TfmcuAddParams add;
  TfmcuPadParams pad;
  TfmcuPoolParams pool;
  TfmcuQuantizeParams quantize;
  TfmcuMeanParams mean;
  TfmcuMulParams mul;
  TfmcuHardSwishParams hard_swish;
  TfmcuLogisticParams logistic;
  TfmcuTanhParams tanh;
  TfmcuLeakyReluParams leaky_relu;
} TfmcuParams;

/* Op `op`'s params struct from a params record (patch_stage_types.h: op->num_arrays byte offsets into `constants`,
 * -1 for a NULL array, then op->num_words scalar words), written into `storage`, which is returned. This is how a
 * stage stored as data (a stage blob) becomes params structs: the executor binds a layer's record each time it runs
 * the layer. Nothing is checked (the stage's validation checks every record once). */
const void* tfmcu_op_params(const TfmcuOpInfo* op, const int32_t* record, const uint8_t* constants,
                            TfmcuParams* storage);

/* Runs one op by type through the table's portable kernel: the same call (and the same bytes and status) as the op's kernel, e.g.
 * tfmcu_conv2d_s8(params, &inputs[0], pad_top, pad_left, output), tfmcu_add_s8(params, &inputs[0], &inputs[1],
 * output). inputs[num_inputs]: one view per input (QUANTIZE: `data` points at floats, row_stride in floats);
 * pad_top / pad_left: the border padding of window ops (ignored by pointwise ops). Returns
 * kTfmcuErrorUnsupportedOp for an unknown type, kTfmcuErrorNullPointer for NULL inputs, kTfmcuErrorShapeMismatch
 * when num_inputs is not the op's; else the kernel's status. Params are not validated beyond what the kernel
 * itself checks (the stage executor validates them once, in tfmcu_stage_prepare). */
TfmcuStatus tfmcu_op_run(int32_t type, const void* params, const TfmcuConstView* inputs, int32_t num_inputs,
                         int32_t pad_top, int32_t pad_left, const TfmcuView* output);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_OP_TABLE_H_ */
