/* Patch-stage executor: runs the first layers of a CNN (the "patch stage", MCUNetV2) patch by patch.
 *
 * The stage output (an int8 NHWC feature map) is cut into a grid_rows x grid_cols grid of non-overlapping output
 * patches. For each patch, every layer of the stage computes only the part of its output that later layers of
 * the same patch need (a box that grows backwards through the stage: the receptive field), reading small patch
 * buffers placed in ONE caller-provided scratch buffer. The full stage input is read in place; the full stage
 * output is written in place into the caller's output buffer. Results are bit-exact with running the same layers
 * whole in TFLite's reference kernels.
 *
 * Everything about the stage is decided offline (tfmcu/patch_kernels.py: pack_stage) and described by plain C
 * data: a `TfmcuStage` and the arrays it points to, all of which can be `const` in Flash. At run time:
 *
 *     size_t need = tfmcu_stage_scratch_bytes(&stage);          // == stage.scratch_bytes
 *     TfmcuStatus s = tfmcu_stage_run(&stage, input, output, scratch, need);
 *
 * `input`  : the whole stage input tensor, NHWC, int8 (or float32 when the first layer is a QUANTIZE);
 * `output` : the whole stage output tensor, NHWC int8, height x width x channels bytes, written completely;
 * `scratch`: any memory of at least scratch_bytes bytes (no alignment needed: everything is int8); it holds the
 *            patch buffers and is not used otherwise. No other memory (no stack arrays beyond a few scalars, no
 *            heap, no globals) is used. input, output and scratch must not overlap.
 *
 * Data model
 * ----------
 * Tensors (`TfmcuTensor`): every activation of the stage, by id = index in `tensors`. One is the stage input
 * (`input_tensor`, producer -1), one is the stage output (`output_tensor`), the others are intermediate tensors
 * that only ever exist as patch buffers in scratch memory.
 *
 * Layers (`TfmcuLayer`), in execution order: an op type, a pointer to that op's params struct (conv2d.h,
 * depthwise_conv2d.h, add.h, pad.h, avg_pool2d.h / max_pool2d.h (TfmcuPoolParams), quantize.h), input tensor ids
 * and the output tensor id. Weights and biases are referenced by the params structs and read in place.
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
 * rows [row_spans[i, producer].out_start, .out_stop) x the corresponding columns x all channels, packed (row
 * stride = box width * channels) at byte offset `buffer_offsets[(i * grid_cols + j) * num_tensors + t]` of
 * scratch. Offsets are planned offline: two tensors alive at the same time (from the layer producing one to the
 * last layer reading it, both included) never overlap; a tensor read by several layers (a residual shortcut) lives
 * until its last reader. The input and output tensors are not in scratch (offset -1): every layer reads / writes
 * them at their full-tensor coordinates. `scratch_bytes` is the highest byte any patch buffer reaches
 * (max over patches and tensors of offset + size): exactly what the run touches.
 *
 * pack_stage aligns buffer offsets to 4 bytes by default (useful for later SIMD kernels; not required).
 *
 * Validation: tfmcu_stage_run first calls tfmcu_stage_check (cost: loops over bands x layers and
 * patches x tensors^2 x layers, negligible next to one convolution) and runs nothing if the description is
 * inconsistent. After the check every activation read and write stays inside the input, the output and the
 * first scratch_bytes of scratch (weight/bias/multiplier arrays are trusted to match their params).
 *
 * Producing a stage: tfmcu/patch_kernels.py
 *     packed = pack_stage(tflite_bytes, from_tflite(tflite_bytes), scheduler.plan(graph, (4, 4), n_blocks=5))
 *     c_source = stage_to_c(packed, "my_stage")   # const TfmcuStage my_stage + MY_STAGE_SCRATCH_BYTES ...
 *
 * Inside a TFLM custom op (the glue, not part of this library): Prepare requests
 * RequestScratchBufferInArena(stage.scratch_bytes); Eval calls
 * tfmcu_stage_run(&stage, input->data.data, output->data.int8, GetScratchBuffer(index), stage.scratch_bytes)
 * and maps a non-zero status to kTfLiteError. Everything the stage needs is constant: no persistent arena.
 *
 * Differences from TFLite: none in results for valid models (bit-exact with the reference integer kernels,
 * double-rounding MultiplyByQuantizedMultiplier, the default TFLite build). QUANTIZE saturates floats with
 * |x / scale| >= 2^31 and maps NaN to the zero point, where TFLite's float->int32 cast is undefined behaviour
 * (an x86 build turns it into INT32_MIN: -128 even for x = +1e9; Cortex-M's VCVT saturates like this library).
 */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_H_

#include "add.h"
#include "avg_pool2d.h"
#include "conv2d.h"
#include "depthwise_conv2d.h"
#include "max_pool2d.h"
#include "pad.h"
#include "quantize.h"
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TFMCU_PATCH_STAGE_ABI_VERSION 1
#define TFMCU_MAX_LAYER_INPUTS 2

/* Layer types (values are part of the ABI). `params` must point to the struct named here. */
typedef enum {
  kTfmcuOpConv2D = 1,           /* TfmcuConvParams */
  kTfmcuOpDepthwiseConv2D = 2,  /* TfmcuDepthwiseConvParams */
  kTfmcuOpAdd = 3,              /* TfmcuAddParams (2 inputs) */
  kTfmcuOpPad = 4,              /* TfmcuPadParams */
  kTfmcuOpAveragePool2D = 5,    /* TfmcuPoolParams */
  kTfmcuOpMaxPool2D = 6,        /* TfmcuPoolParams */
  kTfmcuOpQuantize = 7          /* TfmcuQuantizeParams (float32 input, the stage input) */
} TfmcuOpType;

typedef enum {
  kTfmcuInt8 = 0,
  kTfmcuFloat32 = 1  /* only the stage input, read by a QUANTIZE layer */
} TfmcuDataType;

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
} TfmcuStage;

/* Runs the whole stage. Returns kTfmcuOk, or an error code with nothing computed for an invalid stage, a NULL
 * pointer or scratch_size < scratch_bytes. */
TfmcuStatus tfmcu_stage_run(const TfmcuStage* stage, const void* input, int8_t* output, void* scratch,
                            size_t scratch_size);

/* The scratch bytes the stage touches, computed from the tables (0 for an invalid stage). */
size_t tfmcu_stage_scratch_bytes(const TfmcuStage* stage);

/* Checks the whole description (ids, types, channels, span arithmetic and border rules, reads inside the held
 * boxes, full coverage of the output, non-overlap of live patch buffers, scratch_bytes). On failure returns
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
