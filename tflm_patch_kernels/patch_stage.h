/* Patch-stage executor: runs the first layers of a CNN (the "patch stage", MCUNetV2) patch by patch.
 *
 * The stage output (an int8 NHWC feature map) is cut into a grid_rows x grid_cols grid of non-overlapping output
 * patches. For each patch, every layer of the stage computes only the part of its output that later layers of
 * the same patch need (a box that grows backwards through the stage: the receptive field), reading small patch
 * buffers placed in ONE caller-provided scratch buffer. The full stage input is read in place; the full stage
 * output is written in place into the caller's output buffer. Results are bit-exact with running the same layers
 * whole in TFLite's reference kernels.
 *
 * Everything about the stage is decided offline (tfmcu/kernels/pack.py: pack_stage) and described by plain C
 * data: a `TfmcuStage` and the arrays it points to (patch_stage_types.h), all of which can be `const` in Flash.
 * Like a TFLM kernel's Prepare / Eval, the description is validated once, then run as often as needed:
 *
 *     TfmcuPreparedStage prepared;                              // a few words, e.g. in RAM or a TFLM OpData
 *     TfmcuStatus s = tfmcu_stage_prepare(&stage, &prepared, NULL);   // full validation, once
 *     // prepared.scratch_bytes: stage.scratch_bytes (+ the kernel buffer of an optimised backend, see below)
 *     // prepared.output_bytes == the output tensor's bytes
 *     s = tfmcu_stage_run(&prepared, input, output, scratch, prepared.scratch_bytes);   // every inference
 *
 * `input`  : the whole stage input tensor, NHWC, int8 (or float32 when the first layer is a QUANTIZE);
 * `output` : the whole stage output tensor, NHWC int8, height x width x channels bytes, written completely;
 * `scratch`: any memory of at least scratch_bytes bytes (no alignment needed: everything is int8); it holds the
 *            patch buffers and is not used otherwise. No other memory (no stack arrays beyond a few scalars and
 *            the views of one layer, no heap, no globals) is used. input, output and scratch must not overlap.
 *
 * Data model: patch_stage_types.h (tensors, layers, the spans of the grid's bands, patch buffers, halo caches,
 * reductions).
 *
 * Backends: the kernels run are the op table's (op_table.c). The portable build runs the portable C kernels; a
 * build with -DTFMCU_CMSIS_NN (Bazel: :patch_kernels_cmsis_nn, Cortex-M only) runs CONV_2D, DEPTHWISE_CONV_2D and
 * ADD through CMSIS-NN's s8 kernels on the same patch buffers, bit-exact, with a kernel buffer (the im2col /
 * staging memory their *_get_buffer_size functions ask for, largest over layers and patches) after the patch
 * buffers: prepared.scratch_bytes = round_up(stage.scratch_bytes, 4) + prepared.kernel_scratch_bytes. Everything
 * else about the stage (tables, patch buffers, results) is the same in both builds.
 *
 * Validation: tfmcu_stage_prepare runs tfmcu_stage_check once (loops over bands x layers and
 * patches x tensors^2 x layers) and marks the TfmcuPreparedStage ready only if the description is consistent;
 * tfmcu_stage_run then checks only the prepared struct (non-NULL, ready), its pointer arguments and scratch_size,
 * and never re-validates the description. After a successful prepare every read and write of a run stays inside
 * the input, the output, the first scratch_bytes of scratch and the stage's tables and constants. The stage and the
 * arrays it points to must not change between prepare and run (they are normally const data in Flash); prepare
 * again after changing them. prepared->stage may be pointed at another TfmcuStage with the same contents (a view of
 * the same stage blob, tfmcu_stage_view) before a run.
 *
 * Producing a stage: tfmcu/kernels/pack.py and tfmcu/kernels/codegen.py
 *     packed = pack_stage(tflite_bytes, from_tflite(tflite_bytes), regions.plan(graph, (4, 4), n_blocks=5))
 *     c_source = stage_to_c(packed, "my_stage")   # const TfmcuStage my_stage + MY_STAGE_SCRATCH_BYTES ...
 *
 * Inside a TFLM custom op (the glue, not part of this library; tflm/patch_stage_op.cc): the stage is a stage blob,
 * a constant input of the op read in place (patch_stage_types.h). Init allocates the OpData (a TfmcuPreparedStage
 * and the scratch buffer index) with AllocatePersistentBuffer; Prepare views the blob (tfmcu_stage_view), calls
 * tfmcu_stage_prepare(&stage, &op_data->prepared, NULL) once (a non-zero status -> kTfLiteError) and requests
 * RequestScratchBufferInArena(op_data->prepared.scratch_bytes); Eval views the blob again into a TfmcuStage on its
 * stack, points op_data->prepared.stage at it (the same description Prepare validated: the blob is constant) and
 * calls tfmcu_stage_run(&op_data->prepared, input->data.data, output->data.int8, GetScratchBuffer(index),
 * op_data->prepared.scratch_bytes), mapping a non-zero status to kTfLiteError. Everything the stage itself needs
 * is constant: the only persistent memory is the few words of the OpData.
 *
 * Differences from TFLite: none in results for valid models (bit-exact with the reference integer kernels,
 * double-rounding MultiplyByQuantizedMultiplier, the default TFLite build). QUANTIZE saturates floats with
 * |x / scale| >= 2^31 and maps NaN to the zero point, where TFLite's float->int32 cast is undefined behaviour
 * (an x86 build turns it into INT32_MIN: -128 even for x = +1e9; Cortex-M's VCVT saturates like this library).
 */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_H_

#include "patch_stage_types.h"     /* TfmcuStage and the tables it points to */
#include "patch_stage_validate.h"  /* tfmcu_stage_check, tfmcu_stage_scratch_bytes, tfmcu_stage_output_bytes */
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: tfmcu_stage_prepare + tfmcu_stage_run(const TfmcuPreparedStage*, ...), tfmcu_op_run.
 * 3: TfmcuPreparedStage.kernel_scratch_offset / kernel_scratch_bytes (the optimised backend's kernel buffer).
 * 4: halo caches: TfmcuStage.row_held / col_held / num_caches / caches (NULL / 0: a stage as in ABI 3).
 * 5: streamed input: tfmcu_stage_run_streamed, TfmcuInputProvider, TfmcuPreparedStage.input_window_* and
 *    streamed_scratch_bytes.
 * 6: MEAN (kTfmcuOpMean, TfmcuMeanParams) as a stage's last layer, its accumulator a TfmcuCache with axis 2.
 * 7: no pointer in the tables: TfmcuLayer.params is a params record in TfmcuStage.params whose arrays are offsets
 *    into TfmcuStage.constants (bound by tfmcu_op_params when the layer runs); the stage blob (TfmcuStageBlob,
 *    tfmcu_stage_view).
 * 8: passes (TfmcuStage.num_passes, TfmcuLayer.passes / after_pass: reductions inside a stage, layers on whole
 *    tensors), constant tensors (TfmcuTensor.constant), broadcast operands. */
#define TFMCU_PATCH_STAGE_ABI_VERSION 8

/* A stage validated by tfmcu_stage_prepare (fill it only with tfmcu_stage_prepare). */
typedef struct {
  const TfmcuStage* stage;  /* the validated description */
  uint32_t scratch_bytes;   /* the scratch a run needs: stage->scratch_bytes, plus the kernel buffer if any */
  uint32_t output_bytes;    /* height * width * channels of the output tensor */
  int32_t ready;            /* 1 after a successful tfmcu_stage_prepare, else 0 */
  /* The optimised backend's kernel buffer (tfmcu_common.h; 0 bytes with the portable build): at this offset of the
   * scratch memory (stage->scratch_bytes rounded up to 4), the largest need over every layer and patch. */
  uint32_t kernel_scratch_offset;
  uint32_t kernel_scratch_bytes;
  /* Streamed input (tfmcu_stage_run_streamed): the input row window at this offset of the scratch memory
   * (scratch_bytes rounded up to 4): the most input rows a row band reads x whole rows; streamed_scratch_bytes =
   * input_window_offset + input_window_bytes. All 0 when the stage cannot stream (its bands' input rows do not
   * move forward). */
  uint32_t input_window_offset;
  uint32_t input_window_bytes;
  uint32_t streamed_scratch_bytes;
} TfmcuPreparedStage;

/* What a framework's op keeps per stage between Prepare and Eval when the stage is a stage blob in the model (the
 * TFLM kernel's op data, tflm/patch_stage_op.cc): its whole share of the arena's persistent tail, the same for every
 * stage. The stage's description is not copied: it stays in the model, in the blob. */
typedef struct {
  TfmcuPreparedStage prepared;  /* prepared.stage points at a view of the blob during Prepare and Eval */
  int32_t scratch_index;        /* the scratch buffer request (-1: none, a stage without intermediate tensors) */
  int32_t streamed_input;       /* the options' streamed_input */
  int32_t input_window_bytes;   /* the options' input_window_bytes (checked against the stage's in Prepare) */
} TfmcuPatchStageOpData;

/* Where a streamed run gets the stage input: read_rows copies the input rows [row_start, row_start + row_count)
 * -- whole rows, width x channels elements each (int8, or float32 when the first layer is a QUANTIZE), NHWC, packed
 * -- to `destination` and returns kTfmcuOk (anything else stops the run and is returned). During one run rows are
 * asked for in increasing order, each row at most once: row_start is never below the end of the call before. Rows
 * no patch reads (the gaps of a strided first layer, the bottom rows a VALID window never reaches) are skipped: a
 * camera driver discards them. `context` is passed through. */
typedef TfmcuStatus (*TfmcuReadRows)(void* context, int32_t row_start, int32_t row_count, void* destination);

typedef struct {
  TfmcuReadRows read_rows;
  void* context;
} TfmcuInputProvider;

/* Whether a read_rows call keeps the contract above, for a provider that checks it (the model library's, the host
 * runner's): at least one row, none before `next` (the end of the call before; 0 at the run's start) and none past
 * the image's `rows`. */
static inline int tfmcu_rows_in_contract(int32_t next, int32_t row_start, int32_t row_count, int32_t rows) {
  return row_count > 0 && row_start >= next && row_start <= rows - row_count;
}

/* Validates `stage` once (everything tfmcu_stage_check checks) and fills `prepared`. On failure sets
 * prepared->ready = 0 (and the other fields to NULL / 0) and returns the same status, and stores the same
 * failed_layer (if not NULL), as tfmcu_stage_check; a NULL `prepared` gives kTfmcuErrorNullPointer (failed_layer
 * -1). */
TfmcuStatus tfmcu_stage_prepare(const TfmcuStage* stage, TfmcuPreparedStage* prepared, int32_t* failed_layer);

/* Runs a prepared stage: the whole output is written. Checks only `prepared` (NULL: kTfmcuErrorNullPointer; not
 * ready: kTfmcuErrorInvalidStage), the NULL pointers (kTfmcuErrorNullPointer; scratch may be NULL when
 * scratch_bytes is 0) and scratch_size < scratch_bytes (kTfmcuErrorScratchTooSmall), computing nothing then;
 * never re-validates the description. Else returns kTfmcuOk or a kernel's status. */
TfmcuStatus tfmcu_stage_run(const TfmcuPreparedStage* prepared, const void* input, int8_t* output, void* scratch,
                            size_t scratch_size);

/* Runs a prepared stage reading its input through `provider`, row band after row band, into a window of
 * prepared->input_window_bytes in scratch (after the patch buffers and the kernel buffer), so that the whole input
 * never has to be in memory: scratch_size must be at least prepared->streamed_scratch_bytes. A row the band before
 * read and this band reads again stays in the window (moved to its start); only new rows are asked for. Results
 * are the same as tfmcu_stage_run's on the same input. A stage that cannot stream (input_window_bytes 0) gives
 * kTfmcuErrorInvalidStage; else the statuses of tfmcu_stage_run, or the provider's. */
TfmcuStatus tfmcu_stage_run_streamed(const TfmcuPreparedStage* prepared, const TfmcuInputProvider* provider,
                                     int8_t* output, void* scratch, size_t scratch_size);

/* A short English description of a status code (static string). */
const char* tfmcu_status_string(TfmcuStatus status);

/* TFMCU_PATCH_STAGE_ABI_VERSION of the compiled library (to detect a stale binary). */
int32_t tfmcu_patch_stage_abi_version(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_PATCH_STAGE_H_ */
