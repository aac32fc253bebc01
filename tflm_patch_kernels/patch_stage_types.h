/* The description of a patch stage: plain C data, a `TfmcuStage` and the arrays it points to, all of which can be
 * `const` in Flash. It is decided offline (tfmcu/kernels/pack.py: pack_stage), checked once by the validation
 * (patch_stage_validate.h) and run patch by patch by the executor (patch_stage.h); this header holds what the two
 * share, and nothing of either.
 *
 * Data model
 * ----------
 * Tensors (`TfmcuTensor`): every activation of the stage, by id = index in `tensors`. One is the stage input
 * (`input_tensor`, producer -1), one is the stage output (`output_tensor`), the others are intermediate tensors
 * that only ever exist as patch buffers in scratch memory.
 *
 * Layers (`TfmcuLayer`), in execution order: an op type, where its params record starts in `params`, input tensor
 * ids and the output tensor id. What the executor knows of an op (inputs, window geometry, params check, how to run
 * it) comes from the op table (op_table.h); tfmcu_op_run runs one op alone through the same table.
 *
 * Params records (ABI 7): layer l's params are `op->num_arrays + op->num_words` int32 words of `params` from word
 * `layers[l].params` on: first one word per constant array of the op (op table order: filter, bias,
 * output_multiplier, output_shift), its byte offset in `constants` (-1: none, e.g. a conv without bias), then the
 * op's scalar words (the params struct's fields after its pointers, in order; a float as its IEEE-754 bits). The
 * executor binds a record into the op's params struct (conv2d.h, depthwise_conv2d.h, add.h, pad.h, avg_pool2d.h /
 * max_pool2d.h (TfmcuPoolParams), quantize.h, mean.h) on the stack each time it runs the layer (tfmcu_op_params), so
 * the description holds no pointer but the table pointers of the TfmcuStage itself: every table, weights included,
 * can stay in Flash as one constant byte array (a stage blob, below) that 32- and 64-bit targets read alike. The
 * validation checks every record once: its words inside `params`, every array inside `constants` (int32 arrays
 * 4-byte aligned) with the elements the op's params ask for (TfmcuOpArraySizesFn), output shifts in -31..31.
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
 * Passes, whole tensors and constants (ABI 8): a reduction may also sit inside the stage (squeeze-excite: a MEAN
 * whose 1 x 1 x C result, after a few layers on whole 1 x 1 tensors, scales the feature map it was taken from). Its
 * result depends on every patch, so the stage sweeps the grid several times: `num_passes` passes, each running
 * every patch in raster order. A layer on tiles runs in the passes its `passes` bits name (the planner sets the bits
 * of the layers each pass needs: the layers before a reduction run again in the passes after it, the recompute a
 * two-pass squeeze-excite costs); an inner reduction runs in exactly one pass, reading the band's tile of its input
 * as the last-layer reduction does (the tiles of the bands partition its input), and finishes into a whole tensor
 * after the last patch of that pass. A layer on whole tensors (`passes` 0) runs once, after the last patch of
 * `after_pass`, on 1 x 1 views (span 0..1 in every band): the squeeze-excite's convolutions and activations. Such a
 * whole tensor lives in scratch at one offset for every patch (`buffer_offsets` equal in every row), disjoint from
 * every other buffer, from its producer to the end of the run. A layer reads a whole tensor only in passes after the
 * one that finished it; a tiled input only in passes its producer runs in. A constant tensor (`constant` >= 0: a
 * per-channel operand of an ADD or MUL, e.g. the Keras preprocessing at a model's input) is read in place from
 * `constants`, h x w x channels int8. A pointwise layer's input of size 1 along an axis where its output is larger
 * is broadcast: its span reads 0..1 there. A stage of one pass whose layers all have `passes` 1 and `after_pass` -1
 * runs exactly as in ABI 7. Several passes read the stage input several times, so such a stage does not stream.
 *
 * Stage blob (ABI 7): the whole description as one constant byte array, little-endian, 4-byte aligned, with no
 * pointer in it (the TFMCU_PATCH_STAGE op's constant input; tfmcu/tflite/patch_stage_format.py writes it): a
 * `TfmcuStageBlob` header at byte 0 (the TfmcuStage's counts and scalars, and the byte offset in the blob of each
 * table, 0 for an absent one), then the tables at those offsets, each 4-byte aligned: tensors (TfmcuTensor),
 * layers (TfmcuLayer), params (int32 words), row_spans / col_spans (TfmcuSpan), buffer_offsets (int32), row_held /
 * col_held (int32 pairs; absent without caches), caches (TfmcuCache) and constants (bytes: weights int8, biases,
 * multipliers and shifts int32, each array 4-byte aligned). tfmcu_stage_view (patch_stage_validate.h) checks the
 * header against the blob's size (every table inside it) and fills a TfmcuStage whose pointers point into the blob:
 * a few words any caller can rebuild whenever it runs the stage instead of keeping them.
 */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_TYPES_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_TYPES_H_

#include "op_table.h"  /* TfmcuOpType, TfmcuDataType, TFMCU_MAX_LAYER_INPUTS and every op's params struct */
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TfmcuOpType (layer types) and TfmcuDataType (tensor data types): see op_table.h. */

/* The most passes a stage may sweep (TfmcuStage.num_passes; TfmcuLayer.passes is a bit mask of them). */
#define TFMCU_MAX_PASSES 16

typedef struct {
  int32_t height;   /* full feature-map size (batch 1) */
  int32_t width;
  int32_t channels;
  int32_t dtype;    /* TfmcuDataType */
  int32_t producer; /* index of the layer that writes it; -1 for the stage input and for a constant */
  int32_t constant; /* a constant tensor (ABI 8): the byte offset of its int8 data in `constants`; else -1 */
} TfmcuTensor;

typedef struct {
  int32_t type;          /* TfmcuOpType */
  int32_t params;        /* the first word of its params record in TfmcuStage.params */
  int32_t num_inputs;    /* 2 for ADD and MUL, else 1 */
  int32_t inputs[TFMCU_MAX_LAYER_INPUTS];  /* tensor ids (unused entries: -1) */
  int32_t output;        /* tensor id */
  int32_t passes;        /* ABI 8: bit p set: the layer runs on every patch of pass p (0: a layer on whole tensors) */
  int32_t after_pass;    /* ABI 8: a layer on whole tensors runs once after the last patch of this pass; else -1 */
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
  int32_t num_passes;               /* ABI 8: sweeps over the grid (1 + the reductions before the last pass) */
  const TfmcuSpan* row_spans;       /* [grid_rows][num_layers] */
  const TfmcuSpan* col_spans;       /* [grid_cols][num_layers] */
  const int32_t* buffer_offsets;    /* [grid_rows * grid_cols][num_tensors], bytes; -1 for input/output */
  uint32_t scratch_bytes;           /* scratch memory the stage needs (checked against the tables) */
  /* Halo caches (ABI 4): NULL / 0 for none. */
  const int32_t* row_held;          /* [grid_rows][num_layers][2]: held rows of each layer's output, or NULL */
  const int32_t* col_held;          /* [grid_cols][num_layers][2]: held columns, or NULL */
  int32_t num_caches;
  const TfmcuCache* caches;         /* [num_caches], at most one per tensor and axis */
  /* The layers' params (ABI 7; see the file comment). */
  const int32_t* params;            /* [params_words]: the layers' params records */
  int32_t params_words;
  const uint8_t* constants;         /* [constants_bytes]: the arrays the params records point into */
  uint32_t constants_bytes;
} TfmcuStage;

/* The header of a stage blob (see the file comment): int32 words at byte 0 of the blob. */
typedef struct {
  int32_t bytes;            /* the blob's size */
  int32_t num_tensors;      /* the TfmcuStage fields of the same names */
  int32_t num_layers;
  int32_t input_tensor;
  int32_t output_tensor;
  int32_t grid_rows;
  int32_t grid_cols;
  int32_t num_passes;
  int32_t scratch_bytes;
  int32_t num_caches;
  int32_t params_words;
  int32_t constants_bytes;
  int32_t tensors;          /* byte offsets of the tables in the blob (0: absent) */
  int32_t layers;
  int32_t params;
  int32_t row_spans;
  int32_t col_spans;
  int32_t buffer_offsets;
  int32_t row_held;
  int32_t col_held;
  int32_t caches;
  int32_t constants;
} TfmcuStageBlob;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_PATCH_STAGE_TYPES_H_ */
