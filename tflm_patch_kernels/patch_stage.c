/* Patch-stage executor: see patch_stage.h. The validation that tfmcu_stage_prepare runs once is in
 * patch_stage_validate.c; the stage description both read is in patch_stage_types.h, the geometry they both compute
 * from its tables in patch_stage_geometry.h. */
#include "patch_stage.h"

#include <string.h>

#include "patch_stage_geometry.h"

/* ------------------------------------------------------------------------------------------ prepare */

/* Bytes of one whole row of the stage input (width x channels elements). */
static size_t tfmcu_input_row_bytes(const TfmcuStage* s) {
  const TfmcuTensor* in = &s->tensors[s->input_tensor];
  return (size_t)in->width * (size_t)in->channels * (in->dtype == kTfmcuFloat32 ? sizeof(float) : 1);
}

/* The stage input rows row band i reads (over all its patches and layers); [after, after) when it reads none. */
static void tfmcu_input_rows(const TfmcuStage* s, int32_t i, int32_t after, int32_t* start, int32_t* stop) {
  *start = INT32_MAX;
  *stop = INT32_MIN;
  for (int32_t l = 0; l < s->num_layers; ++l) {
    const TfmcuSpan* span = tfmcu_span(s, 0, i, l);
    for (int32_t k = 0; k < s->layers[l].num_inputs; ++k) {
      if (s->layers[l].inputs[k] == s->input_tensor && span->in_stop[k] > span->in_start[k]) {
        *start = span->in_start[k] < *start ? span->in_start[k] : *start;
        *stop = span->in_stop[k] > *stop ? span->in_stop[k] : *stop;
      }
    }
  }
  if (*stop < *start) {
    *start = after;
    *stop = after;
  }
}

/* The input row window of a streamed run: the most rows a band reads x row bytes; 0 when the bands' rows do not
 * move forward (a band reading rows above those of the band before) or the stage sweeps its grid more than once,
 * which streaming does not support. */
static int64_t tfmcu_input_window_bytes(const TfmcuStage* s) {
  if (s->num_passes != 1) {
    return 0;  /* every pass reads the input again */
  }
  int32_t most = 0, prev_start = 0, prev_stop = 0;
  for (int32_t i = 0; i < s->grid_rows; ++i) {
    int32_t start, stop;
    tfmcu_input_rows(s, i, prev_stop, &start, &stop);
    if (start < prev_start || stop < prev_stop) {
      return 0;
    }
    most = stop - start > most ? stop - start : most;
    prev_start = start;
    prev_stop = stop;
  }
  return (int64_t)most * (int64_t)tfmcu_input_row_bytes(s);
}

static int64_t tfmcu_kernel_scratch_bytes(const TfmcuStage* s);

TfmcuStatus tfmcu_stage_prepare(const TfmcuStage* stage, TfmcuPreparedStage* prepared, int32_t* failed_layer) {
  if (prepared == NULL) {
    if (failed_layer != NULL) {
      *failed_layer = -1;
    }
    return kTfmcuErrorNullPointer;
  }
  prepared->stage = NULL;
  prepared->scratch_bytes = 0;
  prepared->kernel_scratch_offset = 0;
  prepared->kernel_scratch_bytes = 0;
  prepared->output_bytes = 0;
  prepared->ready = 0;
  prepared->input_window_offset = 0;
  prepared->input_window_bytes = 0;
  prepared->streamed_scratch_bytes = 0;
  const TfmcuStatus status = tfmcu_stage_check(stage, failed_layer);
  if (status != kTfmcuOk) {
    return status;
  }
  const TfmcuTensor* out = &stage->tensors[stage->output_tensor];
  const int64_t kernel_bytes = tfmcu_kernel_scratch_bytes(stage);
  const int64_t kernel_offset = kernel_bytes > 0 ? ((int64_t)stage->scratch_bytes + 3) / 4 * 4 : 0;
  if (kernel_bytes < 0 || kernel_offset + kernel_bytes > (int64_t)UINT32_MAX) {
    TFMCU_STAGE_FAIL(-1);
  }
  prepared->stage = stage;
  prepared->kernel_scratch_offset = (uint32_t)kernel_offset;
  prepared->kernel_scratch_bytes = (uint32_t)kernel_bytes;
  prepared->scratch_bytes = kernel_bytes > 0 ? (uint32_t)(kernel_offset + kernel_bytes) : stage->scratch_bytes;
  const int64_t window_bytes = tfmcu_input_window_bytes(stage);
  const int64_t window_offset = ((int64_t)prepared->scratch_bytes + 3) / 4 * 4;
  if (window_bytes > 0 && window_offset + window_bytes <= (int64_t)UINT32_MAX) {
    prepared->input_window_offset = (uint32_t)window_offset;
    prepared->input_window_bytes = (uint32_t)window_bytes;
    prepared->streamed_scratch_bytes = (uint32_t)(window_offset + window_bytes);
  }
  prepared->output_bytes = (uint32_t)out->height * (uint32_t)out->width * (uint32_t)out->channels;
  prepared->ready = 1;
  return kTfmcuOk;
}

/* ------------------------------------------------------------------------------------------ execution */

/* Where a tensor lives during one patch: its buffer (NULL bases: only the geometry), the full-tensor coordinates
 * of the buffer's first pixel, its row stride in elements and the bytes of one element. */
typedef struct {
  const void* read;  /* int8_t or float (stage input) */
  int8_t* write;     /* NULL for the stage input */
  int32_t row0;
  int32_t col0;
  int32_t row_stride;
  int32_t channels;
  int32_t element_bytes;
} TfmcuBuffer;

/* `input` holds the stage input from row `input_row0` on (0: the whole tensor; a streamed run: its row window). */
static TfmcuBuffer tfmcu_buffer(const TfmcuStage* s, int32_t i, int32_t j, int32_t t, const void* input,
                                int32_t input_row0, int8_t* output, int8_t* scratch) {
  TfmcuBuffer buf;
  const TfmcuTensor* tensor = &s->tensors[t];
  buf.channels = tensor->channels;
  buf.element_bytes = tensor->dtype == kTfmcuFloat32 ? (int32_t)sizeof(float) : 1;
  if (t == s->input_tensor) {
    buf.read = input;
    buf.write = NULL;
    buf.row0 = input_row0;
    buf.col0 = 0;
    buf.row_stride = tensor->width * tensor->channels;
  } else if (t == s->output_tensor) {
    buf.read = output;
    buf.write = output;
    buf.row0 = 0;
    buf.col0 = 0;
    buf.row_stride = tensor->width * tensor->channels;
  } else if (tensor->constant >= 0) {
    buf.read = s->constants + tensor->constant;
    buf.write = NULL;
    buf.row0 = 0;
    buf.col0 = 0;
    buf.row_stride = tensor->width * tensor->channels;
  } else {
    int32_t r1, c1;
    const int32_t offset = s->buffer_offsets[((ptrdiff_t)i * s->grid_cols + j) * s->num_tensors + t];
    tfmcu_held(s, 0, i, t, &buf.row0, &r1);
    tfmcu_held(s, 1, j, t, &buf.col0, &c1);
    buf.write = scratch != NULL ? scratch + offset : NULL;
    buf.read = buf.write;
    buf.row_stride = (c1 - buf.col0) * tensor->channels;
  }
  return buf;
}

static ptrdiff_t tfmcu_element(const TfmcuBuffer* buf, int32_t row, int32_t col) {
  return (ptrdiff_t)(row - buf->row0) * buf->row_stride + (ptrdiff_t)(col - buf->col0) * buf->channels;
}

/* The box layer input k reads (a float32 input: `data` points at floats, row_stride counts floats). */
static TfmcuConstView tfmcu_read_view(const TfmcuBuffer* buf, const TfmcuSpan* rows, const TfmcuSpan* cols,
                                      int32_t k) {
  TfmcuConstView v;
  const ptrdiff_t element = tfmcu_element(buf, rows->in_start[k], cols->in_start[k]);
  v.data = buf->read != NULL
               ? (const int8_t*)(const void*)((const unsigned char*)buf->read + element * buf->element_bytes)
               : NULL;
  v.height = rows->in_stop[k] - rows->in_start[k];
  v.width = cols->in_stop[k] - cols->in_start[k];
  v.channels = buf->channels;
  v.row_stride = buf->row_stride;
  return v;
}

/* The views of layer l in patch (i, j): what it reads (in[num_inputs]) and the box it writes. With NULL input,
 * output and scratch the views carry only sizes and strides (data NULL). */
static void tfmcu_layer_views(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, const void* input,
                              int32_t input_row0, int8_t* output, int8_t* scratch, TfmcuConstView* in,
                              TfmcuView* out) {
  const TfmcuLayer* layer = &s->layers[l];
  const TfmcuSpan* rows = tfmcu_span(s, 0, i, l);
  const TfmcuSpan* cols = tfmcu_span(s, 1, j, l);
  const TfmcuBuffer out_buf = tfmcu_buffer(s, i, j, layer->output, input, input_row0, output, scratch);
  out->data = out_buf.write != NULL ? out_buf.write + tfmcu_element(&out_buf, rows->out_start, cols->out_start)
                                    : NULL;
  out->height = rows->out_stop - rows->out_start;
  out->width = cols->out_stop - cols->out_start;
  out->channels = out_buf.channels;
  out->row_stride = out_buf.row_stride;
  for (int32_t k = 0; k < layer->num_inputs; ++k) {
    const TfmcuBuffer in_buf = tfmcu_buffer(s, i, j, layer->inputs[k], input, input_row0, output, scratch);
    in[k] = tfmcu_read_view(&in_buf, rows, cols, k);
  }
}

/* The backend's kernel buffer: the largest need over every layer and patch (0 for the portable build). */
static int64_t tfmcu_kernel_scratch_bytes(const TfmcuStage* s) {
  int64_t most = 0;
  for (int32_t l = 0; l < s->num_layers; ++l) {
    const TfmcuOpInfo* op = tfmcu_op_info(s->layers[l].type);
    if (op->backend_run == NULL || op->backend_scratch == NULL) {
      continue;
    }
    TfmcuParams storage;
    const void* params = tfmcu_layer_params(s, l, &storage);
    for (int32_t i = 0; i < s->grid_rows; ++i) {
      for (int32_t j = 0; j < s->grid_cols; ++j) {
        TfmcuConstView in[TFMCU_MAX_LAYER_INPUTS];
        TfmcuView out;
        tfmcu_layer_views(s, i, j, l, NULL, 0, NULL, NULL, in, &out);
        if (out.height == 0 || out.width == 0) {
          continue;
        }
        const int32_t need = op->backend_scratch(params, in, tfmcu_span(s, 0, i, l)->pad_before[0],
                                                 tfmcu_span(s, 1, j, l)->pad_before[0], &out);
        if (need < 0) {
          return -1;
        }
        most = need > most ? need : most;
      }
    }
  }
  return most;
}

static TfmcuStatus tfmcu_run_layer(const TfmcuPreparedStage* prepared, int32_t i, int32_t j, int32_t l,
                                   const void* input, int32_t input_row0, int8_t* output, int8_t* scratch) {
  const TfmcuStage* s = prepared->stage;
  const TfmcuLayer* layer = &s->layers[l];
  TfmcuConstView in[TFMCU_MAX_LAYER_INPUTS];
  TfmcuView out;
  tfmcu_layer_views(s, i, j, l, input, input_row0, output, scratch, in, &out);
  if (out.height == 0 || out.width == 0) {
    return kTfmcuOk;  /* a halo cache holds all this patch needs of the layer's output */
  }
  const int32_t pad_top = tfmcu_span(s, 0, i, l)->pad_before[0];
  const int32_t pad_left = tfmcu_span(s, 1, j, l)->pad_before[0];
  const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
  TfmcuParams storage;
  const void* params = tfmcu_layer_params(s, l, &storage);
  if (op->accumulate != NULL) {  /* a reduction: this patch's tile into the sums, the output after the last one */
    const TfmcuTensor* t = &s->tensors[layer->inputs[0]];
    int8_t* sums = scratch + tfmcu_find_cache(s, layer->output, 2)->offset;
    if (i == 0 && j == 0) {
      memset(sums, 0, (size_t)t->channels * 4u);
    }
    op->accumulate(params, in, sums);
    if (i < s->grid_rows - 1 || j < s->grid_cols - 1) {
      return kTfmcuOk;
    }
    return op->finish(params, sums, t->height * t->width, &out);
  }
  if (op->backend_run == NULL) {
    return op->run(params, in, pad_top, pad_left, &out);
  }
  TfmcuKernelScratch kernel_scratch;
  kernel_scratch.data = prepared->kernel_scratch_bytes > 0 ? scratch + prepared->kernel_scratch_offset : NULL;
  kernel_scratch.bytes = (int32_t)prepared->kernel_scratch_bytes;
  /* A box narrower than its patch buffer (the columns before it come from a halo cache) would cost the backend one
   * call per row, and CMSIS-NN repeats per call work that grows with the weights (arm_nn_mat_mult_nt_t_s8 sums the
   * filter rows). The box is computed dense into the buffer instead, then its rows moved into place; the cached
   * parts of the buffer are restored after the layer runs (tfmcu_run_row_band), so all of it is free now. When the
   * box ends where the buffer ends (a halo cache fills the beginning), the dense box ends there too and each row
   * moves back (first row first); else it starts where the box starts and each row moves forward (last row
   * first, a slower copy). The stage output is written row by row: other patches' rows are there. */
  const size_t row_bytes = (size_t)out.width * (size_t)out.channels;
  if (layer->output == s->output_tensor || out.height == 1 || (size_t)out.row_stride == row_bytes) {
    return op->backend_run(params, in, pad_top, pad_left, &out, &kernel_scratch);
  }
  const TfmcuBuffer held = tfmcu_buffer(s, i, j, layer->output, NULL, 0, NULL, scratch);
  int32_t r0, r1;
  tfmcu_held(s, 0, i, layer->output, &r0, &r1);
  int8_t* const box_end = out.data + (ptrdiff_t)(out.height - 1) * out.row_stride + (ptrdiff_t)row_bytes;
  const int at_end = box_end == held.write + (ptrdiff_t)(r1 - r0) * held.row_stride;
  TfmcuView dense = out;
  dense.row_stride = (int32_t)row_bytes;
  if (at_end) {
    dense.data = box_end - (ptrdiff_t)out.height * (ptrdiff_t)row_bytes;
  }
  const TfmcuStatus status = op->backend_run(params, in, pad_top, pad_left, &dense, &kernel_scratch);
  if (status != kTfmcuOk) {
    return status;
  }
  for (int32_t k = 1; k < out.height; ++k) {
    const int32_t r = at_end ? k - 1 : out.height - k;  /* rows 0 .. h - 2 moved back, or h - 1 .. 1 forward */
    memmove(out.data + (ptrdiff_t)r * out.row_stride, dense.data + (ptrdiff_t)r * (ptrdiff_t)row_bytes, row_bytes);
  }
  return kTfmcuOk;
}

/* Copies `rows` rows of `bytes` bytes between two strided boxes. */
static void tfmcu_copy_box(int8_t* dst, int32_t dst_stride, const int8_t* src, int32_t src_stride, int32_t rows,
                           int32_t bytes) {
  if (bytes <= 0) {
    return;
  }
  for (int32_t r = 0; r < rows; ++r) {
    memcpy(dst + (ptrdiff_t)r * dst_stride, src + (ptrdiff_t)r * src_stride, (size_t)bytes);
  }
}

/* The row (axis 0) and column (axis 1) halo caches of tensor t, NULL where it has none: one pass over the caches. */
static void tfmcu_caches_of(const TfmcuStage* s, int32_t t, const TfmcuCache** rows, const TfmcuCache** cols) {
  *rows = NULL;
  *cols = NULL;
  for (int32_t k = 0; k < s->num_caches; ++k) {
    if (s->caches[k].tensor == t && s->caches[k].axis < 2) {
      *(s->caches[k].axis == 0 ? rows : cols) = &s->caches[k];
    }
  }
}

/* After layer l of patch (i, j) ran: fills the rest of its output's held box from the caches (columns first). */
static void tfmcu_restore_caches(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, int8_t* scratch) {
  const int32_t t = s->layers[l].output;
  const TfmcuCache *rows, *cols;
  tfmcu_caches_of(s, t, &rows, &cols);
  if ((cols == NULL || j == 0) && (rows == NULL || i == 0)) {
    return;
  }
  const TfmcuBuffer buf = tfmcu_buffer(s, i, j, t, NULL, 0, NULL, scratch);
  const int32_t channels = s->tensors[t].channels;
  int32_t r0, r1, c0, c1;
  tfmcu_held(s, 0, i, t, &r0, &r1);
  tfmcu_held(s, 1, j, t, &c0, &c1);
  if (cols != NULL && j > 0) {
    const int32_t n = tfmcu_span(s, 1, j, l)->out_start - c0;
    const int32_t stride = tfmcu_handed_over(s, cols, j - 1) * channels;
    tfmcu_copy_box(buf.write, buf.row_stride, scratch + cols->offset, stride, r1 - r0, n * channels);
  }
  if (rows != NULL && i > 0) {
    int32_t first, unused;
    tfmcu_layer_held(s, 1, 0, l, &first, &unused);
    int32_t last_start, last_stop;
    tfmcu_layer_held(s, 1, s->grid_cols - 1, l, &last_start, &last_stop);
    const int32_t n = tfmcu_span(s, 0, i, l)->out_start - r0;
    tfmcu_copy_box(buf.write, buf.row_stride, scratch + rows->offset + (ptrdiff_t)(c0 - first) * channels,
                   (last_stop - first) * channels, n, (c1 - c0) * channels);
  }
}

/* Whether layer l runs on the patches of pass p. */
static int tfmcu_runs_in(const TfmcuLayer* layer, int32_t pass) {
  return (layer->passes >> pass) & 1;
}

/* Whether no layer after l that runs in pass p reads tensor t. */
static int tfmcu_unread_after(const TfmcuStage* s, int32_t t, int32_t l, int32_t pass) {
  for (int32_t later = l + 1; later < s->num_layers; ++later) {
    if (!tfmcu_runs_in(&s->layers[later], pass)) {
      continue;
    }
    for (int32_t k = 0; k < s->layers[later].num_inputs; ++k) {
      if (s->layers[later].inputs[k] == t) {
        return 0;
      }
    }
  }
  return 1;
}

/* Hands over to the next patch / band what it needs of cache c (patch (i, j), after the last use of its tensor). */
static void tfmcu_save_cache(const TfmcuStage* s, const TfmcuCache* c, int32_t i, int32_t j, int8_t* scratch) {
  const int32_t t = c->tensor;
  const int32_t producer = s->tensors[t].producer;
  const int32_t channels = s->tensors[t].channels;
  const TfmcuBuffer buf = tfmcu_buffer(s, i, j, t, NULL, 0, NULL, scratch);
  int32_t r0, r1, c0, c1;
  tfmcu_held(s, 0, i, t, &r0, &r1);
  tfmcu_held(s, 1, j, t, &c0, &c1);
  if (c->axis == 1 && j + 1 < s->grid_cols) {
    const int32_t n = tfmcu_handed_over(s, c, j);
    int32_t next_start, next_stop;
    tfmcu_layer_held(s, 1, j + 1, producer, &next_start, &next_stop);
    tfmcu_copy_box(scratch + c->offset, n * channels, buf.write + (ptrdiff_t)(next_start - c0) * channels,
                   buf.row_stride, r1 - r0, n * channels);
  } else if (c->axis == 0 && i + 1 < s->grid_rows) {
    const int32_t n = tfmcu_handed_over(s, c, i);
    int32_t next_start, next_stop, first, unused, last_start, last_stop;
    tfmcu_layer_held(s, 0, i + 1, producer, &next_start, &next_stop);
    tfmcu_layer_held(s, 1, 0, producer, &first, &unused);
    tfmcu_layer_held(s, 1, s->grid_cols - 1, producer, &last_start, &last_stop);
    int32_t stop = c1;
    if (j + 1 < s->grid_cols) {
      int32_t right_start, right_stop;
      tfmcu_layer_held(s, 1, j + 1, producer, &right_start, &right_stop);
      stop = right_start < c1 ? right_start : c1;  /* the right neighbour saves its own columns */
    }
    tfmcu_copy_box(scratch + c->offset + (ptrdiff_t)(c0 - first) * channels, (last_stop - first) * channels,
                   buf.write + (ptrdiff_t)(next_start - r0) * buf.row_stride, buf.row_stride, n,
                   (stop - c0) * channels);
  }
}

/* After layer l of patch (i, j) in pass p: saves the caches of every tensor whose last use in the pass is l (l
 * produces or reads it and no later layer of the pass reads it): only the tensors l touches are looked up, not every
 * cache for every layer. */
static void tfmcu_save_caches(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, int32_t pass, int8_t* scratch) {
  const TfmcuLayer* layer = &s->layers[l];
  for (int32_t k = -1; k < layer->num_inputs; ++k) {
    const int32_t t = k < 0 ? layer->output : layer->inputs[k];
    int seen = k >= 0 && t == layer->output;
    for (int32_t before = 0; before < k; ++before) {
      seen |= layer->inputs[before] == t;
    }
    if (seen || !tfmcu_unread_after(s, t, l, pass)) {
      continue;
    }
    const TfmcuCache *rows, *cols;
    tfmcu_caches_of(s, t, &rows, &cols);
    if (rows != NULL) {
      tfmcu_save_cache(s, rows, i, j, scratch);
    }
    if (cols != NULL) {
      tfmcu_save_cache(s, cols, i, j, scratch);
    }
  }
}

/* Every patch of row band i in pass p (input: the stage input from row input_row0 on). */
static TfmcuStatus tfmcu_run_row_band(const TfmcuPreparedStage* prepared, int32_t pass, int32_t i,
                                      const void* input, int32_t input_row0, int8_t* output, int8_t* scratch) {
  const TfmcuStage* stage = prepared->stage;
  for (int32_t j = 0; j < stage->grid_cols; ++j) {
    for (int32_t l = 0; l < stage->num_layers; ++l) {
      if (!tfmcu_runs_in(&stage->layers[l], pass)) {
        continue;
      }
      const TfmcuStatus status = tfmcu_run_layer(prepared, i, j, l, input, input_row0, output, scratch);
      if (status != kTfmcuOk) {
        return status;
      }
      if (stage->num_caches > 0) {
        tfmcu_restore_caches(stage, i, j, l, scratch);
        tfmcu_save_caches(stage, i, j, l, pass, scratch);
      }
    }
  }
  return kTfmcuOk;
}

/* The layers on whole tensors that run after pass p, in order (their views: span 0..1 in every band). */
static TfmcuStatus tfmcu_run_whole_layers(const TfmcuPreparedStage* prepared, int32_t pass, int8_t* output,
                                          int8_t* scratch) {
  const TfmcuStage* stage = prepared->stage;
  for (int32_t l = 0; l < stage->num_layers; ++l) {
    if (stage->layers[l].passes == 0 && stage->layers[l].after_pass == pass) {
      const TfmcuStatus status = tfmcu_run_layer(prepared, 0, 0, l, NULL, 0, output, scratch);
      if (status != kTfmcuOk) {
        return status;
      }
    }
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_stage_run(const TfmcuPreparedStage* prepared, const void* input, int8_t* output, void* scratch,
                            size_t scratch_size) {
  if (prepared == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (prepared->ready != 1 || prepared->stage == NULL) {
    return kTfmcuErrorInvalidStage;
  }
  const TfmcuStage* stage = prepared->stage;
  if (input == NULL || output == NULL || (prepared->scratch_bytes > 0 && scratch == NULL)) {
    return kTfmcuErrorNullPointer;
  }
  if (scratch_size < (size_t)prepared->scratch_bytes) {
    return kTfmcuErrorScratchTooSmall;
  }
  for (int32_t pass = 0; pass < stage->num_passes; ++pass) {
    for (int32_t i = 0; i < stage->grid_rows; ++i) {
      const TfmcuStatus status = tfmcu_run_row_band(prepared, pass, i, input, 0, output, (int8_t*)scratch);
      if (status != kTfmcuOk) {
        return status;
      }
    }
    const TfmcuStatus status = tfmcu_run_whole_layers(prepared, pass, output, (int8_t*)scratch);
    if (status != kTfmcuOk) {
      return status;
    }
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_stage_run_streamed(const TfmcuPreparedStage* prepared, const TfmcuInputProvider* provider,
                                     int8_t* output, void* scratch, size_t scratch_size) {
  if (prepared == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (prepared->ready != 1 || prepared->stage == NULL || prepared->input_window_bytes == 0) {
    return kTfmcuErrorInvalidStage;
  }
  const TfmcuStage* stage = prepared->stage;
  if (provider == NULL || provider->read_rows == NULL || output == NULL || scratch == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (scratch_size < (size_t)prepared->streamed_scratch_bytes) {
    return kTfmcuErrorScratchTooSmall;
  }
  unsigned char* window = (unsigned char*)scratch + prepared->input_window_offset;
  const size_t row_bytes = tfmcu_input_row_bytes(stage);
  int32_t held_start = 0, held_stop = 0;  /* the input rows in the window, from its first byte on */
  for (int32_t i = 0; i < stage->grid_rows; ++i) {
    int32_t start, stop;
    tfmcu_input_rows(stage, i, held_stop, &start, &stop);
    const int32_t keep = held_stop > start ? held_stop - start : 0;  /* rows the band before fetched */
    if (keep > 0 && start > held_start) {
      memmove(window, window + (size_t)(start - held_start) * row_bytes, (size_t)keep * row_bytes);
    }
    const int32_t first = start > held_stop ? start : held_stop;
    if (stop > first) {
      const TfmcuStatus fetched = provider->read_rows(provider->context, first, stop - first,
                                                      window + (size_t)(first - start) * row_bytes);
      if (fetched != kTfmcuOk) {
        return fetched;
      }
    }
    held_start = start;
    held_stop = stop;
    const TfmcuStatus status = tfmcu_run_row_band(prepared, 0, i, window, start, output, (int8_t*)scratch);
    if (status != kTfmcuOk) {
      return status;
    }
  }
  return kTfmcuOk;
}

const char* tfmcu_status_string(TfmcuStatus status) {
  switch (status) {
    case kTfmcuOk:
      return "ok";
    case kTfmcuErrorNullPointer:
      return "null pointer";
    case kTfmcuErrorScratchTooSmall:
      return "scratch buffer too small";
    case kTfmcuErrorInvalidStage:
      return "invalid stage description";
    case kTfmcuErrorUnsupportedOp:
      return "unsupported op or data type";
    case kTfmcuErrorShapeMismatch:
      return "shape mismatch";
    case kTfmcuErrorEmptyWindow:
      return "pooling window without input pixels";
    default:
      return "unknown status";
  }
}

int32_t tfmcu_patch_stage_abi_version(void) { return TFMCU_PATCH_STAGE_ABI_VERSION; }
