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
 * data: a `TfmcuStage` and the arrays it points to, all of which can be `const` in Flash. Like a TFLM kernel's
 * Prepare / Eval, the description is validated once, then run as often as needed:
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
 * Data model
 * ----------
 * Tensors (`TfmcuTensor`): every activation of the stage, by id = index in `tensors`. One is the stage input
 * (`input_tensor`, producer -1), one is the stage output (`output_tensor`), the others are intermediate tensors
 * that only ever exist as patch buffers in scratch memory.
 *
 * Layers (`TfmcuLayer`), in execution order: an op type, a pointer to that op's params struct (conv2d.h,
 * depthwise_conv2d.h, add.h, pad.h, avg_pool2d.h / max_pool2d.h (TfmcuPoolParams), quantize.h, mean.h), input tensor ids
 * and the output tensor id. Weights and biases are referenced by the params structs and read in place. What the
 * executor knows of an op (inputs, window geometry, params check, how to run it) comes from the op table
 * (op_table.h); tfmcu_op_run runs one op alone through the same table.
 *
 * Boxes: the regions are separable, so they are stored per grid row band and per grid column band instead of per
 * patch: patch (i, j) uses `row_spans[i * num_layers + l]` for the rows and `col_spans[j * num_layers + l]` for the
 * columns of layer l. A `TfmcuSpan` gives, along one axis and in the coordinates of the full tensors:
 *   - out_start/out_stop: the output rows (columns) the layer computes for that band;
 *   - in_start[k]/in_stop[k]: the rows read from input k, clipped to the feature map;
 *   - pad_before[k]/pad_after[k]: how far the layer's window runs past the feature-map border there (border
 *     padding; never materialised: kernels skip those positions, PAD fills them with its value).
 * For window layers (conv, depthwise, pooling, PAD) the span satisfies
 *   pad_before + (in_stop - in_start) + pad_after == (out_len - 1) * stride + (kernel - 1) * dilation + 1,
 * for pointwise layers (ADD, QUANTIZE) the read equals the output span and the pads are 0.
 *
 * Patch buffers: in patch (i, j) an intermediate tensor t holds exactly the box its producer computes,
 * rows [row_spans[i, producer].out_start, .out_stop) x the corresponding columns x all channels (with halo caches:
 * its held box, see below), packed (row
 * stride = box width * channels) at byte offset `buffer_offsets[(i * grid_cols + j) * num_tensors + t]` of
 * scratch. Offsets are planned offline: two tensors alive at the same time (from the layer producing one to the
 * last layer reading it, both included) never overlap; a tensor read by several layers (a residual shortcut) lives
 * until its last reader. The input and output tensors are not in scratch (offset -1): every layer reads / writes
 * them at their full-tensor coordinates. `scratch_bytes` is the highest byte any patch buffer (or halo cache)
 * reaches (max over patches and tensors of offset + size): exactly what the run touches.
 *
 * pack_stage aligns buffer offsets to 4 bytes by default (useful for later SIMD kernels; not required).
 *
 * Halo caches (optional; ABI 4): overlapping patches recompute their halos. Patches run in raster order (row
 * bands top to bottom, column bands left to right), so an intermediate tensor t may keep
 *   - a row cache (`TfmcuCache.axis` 0): the rows of t the row band below needs that this band computed, over
 *     every column any patch needs (one buffer, refilled by every patch of a band);
 *   - a column cache (axis 1): the columns of t the patch to the right needs, over this band's rows.
 * The patch buffer of t then holds a `held` box (`row_held` / `col_held`: [band][layer] pairs start, stop of the
 * layer's output) of which the layer computes only the end (the span's out_start..out_stop, with
 * out_stop == held stop); the beginning, held start..out_start, is copied from the cache just before the layer
 * runs (column cache first, then row cache). After the last layer reading t in a patch, the part the next patch
 * (next band) needs is copied into the cache: a column cache takes held columns from the right neighbour's held
 * start on, over all held rows; a row cache takes held rows from the next band's held start on, over the patch's
 * own columns up to the right neighbour's held start (the last patch: all of its columns), so that one buffer
 * suffices: what a patch saves is never what a later patch of the band still has to restore. Caches live at
 * their fixed `offset` for the whole run, disjoint from every patch buffer and from each other; their bytes
 * follow from the tables:
 *   row cache: max over bands b of (held_b stop - held_{b+1} start) rows x (last column band's held stop - the
 *              first's held start) columns x channels;
 *   column cache: max over column bands c of (held_c stop - held_{c+1} start) columns x the most held rows of a
 *              row band x channels.
 * With NULL `row_held` / `col_held` the held box is the computed one (no cache on that axis); a stage without
 * caches (num_caches 0, NULL tables) runs exactly as with ABI 3. Caches change which pixels are computed, never
 * their values: results stay bit-exact, scratch_bytes (caches included) is known offline.
 *
 * Reductions (ABI 6): the last layer may be a MEAN over height and width (global average pooling; an op whose
 * op-table row has `accumulate`): it writes the stage output, 1 x 1 x C, and no patch ever holds its whole input. In
 * every band its span has out_start 0, out_stop 1 (held the same) and reads the band's tile of its input, pads 0:
 * the tiles of the bands, in order, partition the input along that axis, so every pixel is summed once. Its int32
 * sums live in the stage's accumulator, a `TfmcuCache` of the output tensor with axis 2: 4 x C bytes at `offset`,
 * disjoint from every other cache and patch buffer, zeroed by the first patch; each patch adds its tile, the last
 * one writes the output (mean.h). Integer sums do not depend on the order: bit-exact with the whole op.
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
 * and never re-validates the description. After a successful prepare every activation read and write of a run
 * stays inside the input, the output and the first scratch_bytes of scratch (weight/bias/multiplier arrays are
 * trusted to match their params). The stage and the arrays it points to must not change between prepare and run
 * (they are normally const data in Flash); prepare again after changing them.
 *
 * Producing a stage: tfmcu/kernels/pack.py and tfmcu/kernels/codegen.py
 *     packed = pack_stage(tflite_bytes, from_tflite(tflite_bytes), regions.plan(graph, (4, 4), n_blocks=5))
 *     c_source = stage_to_c(packed, "my_stage")   # const TfmcuStage my_stage + MY_STAGE_SCRATCH_BYTES ...
 *
 * Inside a TFLM custom op (the glue, not part of this library): Init allocates the OpData (a TfmcuPreparedStage
 * and the scratch buffer index) with AllocatePersistentBuffer; Prepare calls
 * tfmcu_stage_prepare(&stage, &op_data->prepared, NULL) once (a non-zero status -> kTfLiteError) and requests
 * RequestScratchBufferInArena(op_data->prepared.scratch_bytes); Eval calls
 * tfmcu_stage_run(&op_data->prepared, input->data.data, output->data.int8, GetScratchBuffer(index),
 * op_data->prepared.scratch_bytes) and maps a non-zero status to kTfLiteError. Everything the stage itself needs
 * is constant: the only persistent memory is the few words of the OpData.
 *
 * Differences from TFLite: none in results for valid models (bit-exact with the reference integer kernels,
 * double-rounding MultiplyByQuantizedMultiplier, the default TFLite build). QUANTIZE saturates floats with
 * |x / scale| >= 2^31 and maps NaN to the zero point, where TFLite's float->int32 cast is undefined behaviour
 * (an x86 build turns it into INT32_MIN: -128 even for x = +1e9; Cortex-M's VCVT saturates like this library).
 */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_H_

#include "op_table.h"  /* TfmcuOpType, TfmcuDataType, TFMCU_MAX_LAYER_INPUTS and every op's params struct */
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: tfmcu_stage_prepare + tfmcu_stage_run(const TfmcuPreparedStage*, ...), tfmcu_op_run.
 * 3: TfmcuPreparedStage.kernel_scratch_offset / kernel_scratch_bytes (the optimised backend's kernel buffer).
 * 4: halo caches: TfmcuStage.row_held / col_held / num_caches / caches (NULL / 0: a stage as in ABI 3).
 * 5: streamed input: tfmcu_stage_run_streamed, TfmcuInputProvider, TfmcuPreparedStage.input_window_* and
 *    streamed_scratch_bytes.
 * 6: MEAN (kTfmcuOpMean, TfmcuMeanParams) as a stage's last layer, its accumulator a TfmcuCache with axis 2. */
#define TFMCU_PATCH_STAGE_ABI_VERSION 6

/* TfmcuOpType (layer types) and TfmcuDataType (tensor data types): see op_table.h. */

typedef struct {
  int32_t height;   /* full feature-map size (batch 1) */
  int32_t width;
  int32_t channels;
  int32_t dtype;    /* TfmcuDataType */
  int32_t producer; /* index of the layer that writes it; -1 for the stage input */
} TfmcuTensor;

typedef struct {
  int32_t type;          /* TfmcuOpType */
  const void* params;    /* the op's params struct */
  int32_t num_inputs;    /* 2 for ADD, else 1 */
  int32_t inputs[TFMCU_MAX_LAYER_INPUTS];  /* tensor ids (unused entries: -1) */
  int32_t output;        /* tensor id */
} TfmcuLayer;

/* One layer's work along one axis for one band of the grid (see the file comment). */
typedef struct {
  int32_t out_start;
  int32_t out_stop;
  int32_t in_start[TFMCU_MAX_LAYER_INPUTS];
  int32_t in_stop[TFMCU_MAX_LAYER_INPUTS];
  int32_t pad_before[TFMCU_MAX_LAYER_INPUTS];
  int32_t pad_after[TFMCU_MAX_LAYER_INPUTS];
} TfmcuSpan;

/* A halo cache of one intermediate tensor along one axis (see the file comment). */
typedef struct {
  int32_t tensor;  /* tensor id: an intermediate tensor (neither the stage input nor its output) */
  int32_t axis;    /* 0: row cache (for the row band below), 1: column cache (for the patch to the right),
                      2: the accumulator of the stage's reduction (its output tensor; 4 x C bytes) */
  int32_t offset;  /* bytes into scratch */
} TfmcuCache;

typedef struct {
  int32_t num_tensors;
  const TfmcuTensor* tensors;       /* [num_tensors] */
  int32_t num_layers;
  const TfmcuLayer* layers;         /* [num_layers], execution order */
  int32_t input_tensor;             /* id of the stage input */
  int32_t output_tensor;            /* id of the stage output */
  int32_t grid_rows;                /* patches along the height */
  int32_t grid_cols;                /* patches along the width */
  const TfmcuSpan* row_spans;       /* [grid_rows][num_layers] */
  const TfmcuSpan* col_spans;       /* [grid_cols][num_layers] */
  const int32_t* buffer_offsets;    /* [grid_rows * grid_cols][num_tensors], bytes; -1 for input/output */
  uint32_t scratch_bytes;           /* scratch memory the stage needs (checked against the tables) */
  /* Halo caches (ABI 4): NULL / 0 for none. */
  const int32_t* row_held;          /* [grid_rows][num_layers][2]: held rows of each layer's output, or NULL */
  const int32_t* col_held;          /* [grid_cols][num_layers][2]: held columns, or NULL */
  int32_t num_caches;
  const TfmcuCache* caches;         /* [num_caches], at most one per tensor and axis */
} TfmcuStage;

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

/* The scratch bytes the stage touches, computed from the tables (0 for an invalid stage). */
size_t tfmcu_stage_scratch_bytes(const TfmcuStage* stage);

/* Checks the whole description (ids, types, channels, span arithmetic and border rules, reads inside the held
 * boxes, full coverage of the output, non-overlap of live patch buffers, scratch_bytes; halo caches: held boxes
 * that end where the computed ones do and begin where the cache can fill them, growing band after band, caches
 * disjoint from each other and from every patch buffer). On failure returns
 * kTfmcuErrorInvalidStage (or kTfmcuErrorNullPointer / kTfmcuErrorUnsupportedOp) and, if failed_layer is not NULL,
 * stores the offending layer index there (-1 when the problem is not one layer's). */
TfmcuStatus tfmcu_stage_check(const TfmcuStage* stage, int32_t* failed_layer);

/* Bytes of the output buffer: height * width * channels of the output tensor (0 for an invalid stage). */
size_t tfmcu_stage_output_bytes(const TfmcuStage* stage);

/* A short English description of a status code (static string). */
const char* tfmcu_status_string(TfmcuStatus status);

/* TFMCU_PATCH_STAGE_ABI_VERSION of the compiled library (to detect a stale binary). */
int32_t tfmcu_patch_stage_abi_version(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_PATCH_STAGE_H_ */
