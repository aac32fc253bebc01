/* Patch-stage executor: see patch_stage.h. */
#include "patch_stage.h"

#include <string.h>

/* ------------------------------------------------------------------------------------------ layer geometry */

static int32_t tfmcu_dim(const TfmcuTensor* t, int32_t axis) {
  return axis == 0 ? t->height : t->width;
}

static const TfmcuSpan* tfmcu_span(const TfmcuStage* s, int32_t axis, int32_t band, int32_t layer) {
  const TfmcuSpan* spans = axis == 0 ? s->row_spans : s->col_spans;
  return &spans[(ptrdiff_t)band * s->num_layers + layer];
}

static int tfmcu_in_memory_tensor(const TfmcuStage* s, int32_t t) {
  return t == s->input_tensor || t == s->output_tensor;
}

/* The held range of layer l's output along one axis in one band: the held table's pair, else the computed span. */
static void tfmcu_layer_held(const TfmcuStage* s, int32_t axis, int32_t band, int32_t l, int32_t* start,
                             int32_t* stop) {
  const int32_t* held = axis == 0 ? s->row_held : s->col_held;
  if (held != NULL) {
    const int32_t* pair = held + ((ptrdiff_t)band * s->num_layers + l) * 2;
    *start = pair[0];
    *stop = pair[1];
    return;
  }
  const TfmcuSpan* span = tfmcu_span(s, axis, band, l);
  *start = span->out_start;
  *stop = span->out_stop;
}

/* The rows (axis 0) or columns (axis 1) of tensor t held while band `band` runs: the whole tensor for the stage
 * input and output, else its producer's held range (the box it computes, plus what a halo cache fills in). */
static void tfmcu_held(const TfmcuStage* s, int32_t axis, int32_t band, int32_t t, int32_t* start, int32_t* stop) {
  if (tfmcu_in_memory_tensor(s, t)) {
    *start = 0;
    *stop = tfmcu_dim(&s->tensors[t], axis);
    return;
  }
  tfmcu_layer_held(s, axis, band, s->tensors[t].producer, start, stop);
}

/* The halo cache of tensor t along axis, or NULL. */
static const TfmcuCache* tfmcu_find_cache(const TfmcuStage* s, int32_t t, int32_t axis) {
  for (int32_t k = 0; k < s->num_caches; ++k) {
    if (s->caches[k].tensor == t && s->caches[k].axis == axis) {
      return &s->caches[k];
    }
  }
  return NULL;
}

/* Elements along the cache's axis that band b hands to band b + 1 (0 if their held ranges do not overlap). */
static int32_t tfmcu_handed_over(const TfmcuStage* s, const TfmcuCache* c, int32_t b) {
  const int32_t producer = s->tensors[c->tensor].producer;
  int32_t start, stop, next_start, next_stop;
  tfmcu_layer_held(s, c->axis, b, producer, &start, &stop);
  tfmcu_layer_held(s, c->axis, b + 1, producer, &next_start, &next_stop);
  return stop > next_start ? stop - next_start : 0;
}

/* Bytes of a halo cache (see patch_stage.h). */
static int64_t tfmcu_cache_bytes(const TfmcuStage* s, const TfmcuCache* c) {
  const int32_t producer = s->tensors[c->tensor].producer;
  const int32_t bands = c->axis == 0 ? s->grid_rows : s->grid_cols;
  int32_t along = 0;
  for (int32_t b = 0; b + 1 < bands; ++b) {
    const int32_t n = tfmcu_handed_over(s, c, b);
    along = n > along ? n : along;
  }
  int32_t across = 0;
  if (c->axis == 0) {
    int32_t first_start, first_stop, last_start, last_stop;
    tfmcu_layer_held(s, 1, 0, producer, &first_start, &first_stop);
    tfmcu_layer_held(s, 1, s->grid_cols - 1, producer, &last_start, &last_stop);
    across = last_stop - first_start;
  } else {
    for (int32_t b = 0; b < s->grid_rows; ++b) {
      int32_t start, stop;
      tfmcu_layer_held(s, 0, b, producer, &start, &stop);
      across = stop - start > across ? stop - start : across;
    }
  }
  return (int64_t)along * (int64_t)across * (int64_t)s->tensors[c->tensor].channels;
}

/* Last layer reading tensor t (its producer if none does). */
static int32_t tfmcu_last_use(const TfmcuStage* s, int32_t t) {
  int32_t last = s->tensors[t].producer;
  for (int32_t l = 0; l < s->num_layers; ++l) {
    for (int32_t k = 0; k < s->layers[l].num_inputs; ++k) {
      if (s->layers[l].inputs[k] == t && l > last) {
        last = l;
      }
    }
  }
  return last;
}

static int64_t tfmcu_buffer_bytes(const TfmcuStage* s, int32_t row_band, int32_t col_band, int32_t t) {
  int32_t r0, r1, c0, c1;
  tfmcu_held(s, 0, row_band, t, &r0, &r1);
  tfmcu_held(s, 1, col_band, t, &c0, &c1);
  return (int64_t)(r1 - r0) * (int64_t)(c1 - c0) * (int64_t)s->tensors[t].channels;
}

/* ------------------------------------------------------------------------------------------ validation */

#define TFMCU_FAIL(layer_index)        \
  do {                                 \
    if (failed_layer != NULL) {        \
      *failed_layer = (layer_index);   \
    }                                  \
    return kTfmcuErrorInvalidStage;    \
  } while (0)

/* The op's own params check (op table), against the channels of the layer's tensors. The layer's type, inputs and
 * output were checked before. */
static TfmcuStatus tfmcu_check_layer_params(const TfmcuStage* s, int32_t l) {
  const TfmcuLayer* layer = &s->layers[l];
  int32_t in_channels[TFMCU_MAX_LAYER_INPUTS];
  for (int32_t k = 0; k < layer->num_inputs; ++k) {
    in_channels[k] = s->tensors[layer->inputs[k]].channels;
  }
  return tfmcu_op_info(layer->type)->check(layer->params, in_channels, s->tensors[layer->output].channels);
}

/* Halo caches against the held tables (the spans were checked): every held range that begins before the computed
 * one belongs to a cached tensor and axis, and the band before holds what the cache must fill in; the held ranges
 * of a cached tensor grow band after band on both axes (what the save rule relies on). */
static TfmcuStatus tfmcu_check_caches(const TfmcuStage* s, int32_t* failed_layer) {
  if (s->num_caches < 0 || (s->num_caches > 0 && s->caches == NULL)) {
    TFMCU_FAIL(-1);
  }
  for (int32_t k = 0; k < s->num_caches; ++k) {
    const TfmcuCache* c = &s->caches[k];
    if (c->tensor < 0 || c->tensor >= s->num_tensors || tfmcu_in_memory_tensor(s, c->tensor) ||
        (c->axis != 0 && c->axis != 1) || c->offset < 0 || tfmcu_find_cache(s, c->tensor, c->axis) != c) {
      TFMCU_FAIL(-1);
    }
  }
  for (int32_t l = 0; l < s->num_layers; ++l) {
    const int32_t t = s->layers[l].output;
    const int any_cache = tfmcu_find_cache(s, t, 0) != NULL || tfmcu_find_cache(s, t, 1) != NULL;
    for (int32_t axis = 0; axis < 2; ++axis) {
      const int cached = tfmcu_find_cache(s, t, axis) != NULL;
      const int32_t bands = axis == 0 ? s->grid_rows : s->grid_cols;
      int32_t prev_start = 0, prev_stop = 0;
      for (int32_t b = 0; b < bands; ++b) {
        int32_t start, stop;
        tfmcu_layer_held(s, axis, b, l, &start, &stop);
        const int32_t computed_start = tfmcu_span(s, axis, b, l)->out_start;
        if (start < computed_start && (!cached || b == 0 || computed_start > prev_stop)) {
          TFMCU_FAIL(l);  /* held rows (columns) that neither this patch nor the cache provides */
        }
        if (any_cache && b > 0 && (start < prev_start || stop < prev_stop)) {
          TFMCU_FAIL(l);
        }
        prev_start = start;
        prev_stop = stop;
      }
    }
  }
  return kTfmcuOk;
}

/* Tensors, layers and spans (everything but the scratch plan). */
static TfmcuStatus tfmcu_check_structure(const TfmcuStage* s, int32_t* failed_layer) {
  if (failed_layer != NULL) {
    *failed_layer = -1;
  }
  if (s == NULL || s->tensors == NULL || s->layers == NULL || s->row_spans == NULL || s->col_spans == NULL ||
      s->buffer_offsets == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (s->num_tensors < 2 || s->num_layers < 1 || s->grid_rows < 1 || s->grid_cols < 1 || s->input_tensor < 0 ||
      s->input_tensor >= s->num_tensors || s->output_tensor < 0 || s->output_tensor >= s->num_tensors ||
      s->input_tensor == s->output_tensor) {
    TFMCU_FAIL(-1);
  }
  for (int32_t t = 0; t < s->num_tensors; ++t) {
    const TfmcuTensor* tensor = &s->tensors[t];
    if (tensor->height <= 0 || tensor->width <= 0 || tensor->channels <= 0) {
      TFMCU_FAIL(-1);
    }
    if (tensor->dtype != kTfmcuInt8 && !(tensor->dtype == kTfmcuFloat32 && t == s->input_tensor)) {
      return kTfmcuErrorUnsupportedOp;
    }
    if (t == s->input_tensor ? tensor->producer != -1
                             : (tensor->producer < 0 || tensor->producer >= s->num_layers ||
                                s->layers[tensor->producer].output != t)) {
      TFMCU_FAIL(-1);
    }
  }
  for (int32_t l = 0; l < s->num_layers; ++l) {
    const TfmcuLayer* layer = &s->layers[l];
    if (layer->params == NULL) {
      if (failed_layer != NULL) {
        *failed_layer = l;
      }
      return kTfmcuErrorNullPointer;
    }
    const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
    if (op == NULL) {
      if (failed_layer != NULL) {
        *failed_layer = l;
      }
      return kTfmcuErrorUnsupportedOp;
    }
    if (layer->num_inputs != op->num_inputs || layer->output < 0 ||
        layer->output >= s->num_tensors || s->tensors[layer->output].producer != l) {
      TFMCU_FAIL(l);
    }
    for (int32_t k = 0; k < layer->num_inputs; ++k) {
      const int32_t t = layer->inputs[k];
      if (t < 0 || t >= s->num_tensors || (t != s->input_tensor && s->tensors[t].producer >= l)) {
        TFMCU_FAIL(l);
      }
      if (s->tensors[t].dtype != op->input_dtype) {
        TFMCU_FAIL(l);
      }
    }
    const TfmcuStatus params_ok = tfmcu_check_layer_params(s, l);
    if (params_ok != kTfmcuOk) {
      if (failed_layer != NULL) {
        *failed_layer = l;
      }
      return params_ok;
    }
  }
  /* Spans, per axis, band and layer. */
  for (int32_t axis = 0; axis < 2; ++axis) {
    const int32_t bands = axis == 0 ? s->grid_rows : s->grid_cols;
    for (int32_t b = 0; b < bands; ++b) {
      for (int32_t l = 0; l < s->num_layers; ++l) {
        const TfmcuLayer* layer = &s->layers[l];
        const TfmcuSpan* span = tfmcu_span(s, axis, b, l);
        const int32_t out_dim = tfmcu_dim(&s->tensors[layer->output], axis);
        const int empty = span->out_stop == span->out_start;  /* all of it from a halo cache in this band */
        if (span->out_start < 0 || span->out_stop < span->out_start || span->out_stop > out_dim ||
            (empty && layer->output == s->output_tensor)) {
          TFMCU_FAIL(l);
        }
        int32_t held_start, held_stop;
        tfmcu_layer_held(s, axis, b, l, &held_start, &held_stop);
        if (held_start < 0 || held_start > span->out_start || held_stop != span->out_stop ||
            (layer->output == s->output_tensor && held_start != span->out_start)) {
          TFMCU_FAIL(l);  /* a held range ends where the computed one does; the output is computed whole */
        }
        const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
        TfmcuWindow window = {{1, 1}, {1, 1}, {1, 1}};
        if (op->window != NULL) {
          op->window(layer->params, &window);
        }
        for (int32_t k = 0; k < layer->num_inputs; ++k) {
          const int32_t t = layer->inputs[k];
          const int32_t in_dim = tfmcu_dim(&s->tensors[t], axis);
          const int32_t start = span->in_start[k];
          const int32_t stop = span->in_stop[k];
          const int32_t before = span->pad_before[k];
          const int32_t after = span->pad_after[k];
          if (empty) {
            if (start < 0 || start > in_dim || stop != start || before != 0 || after != 0) {
              TFMCU_FAIL(l);  /* a layer that computes nothing reads nothing */
            }
            continue;
          }
          if (start < 0 || stop < start || stop > in_dim || before < 0 || after < 0 ||
              (before > 0 && start != 0) || (after > 0 && stop != in_dim)) {
            TFMCU_FAIL(l);  /* padding only at the feature-map border */
          }
          if (op->window != NULL) {
            const int64_t reach = (int64_t)(span->out_stop - span->out_start - 1) * window.stride[axis] +
                                  (int64_t)(window.kernel[axis] - 1) * window.dilation[axis] + 1;
            if ((int64_t)before + (stop - start) + after != reach) {
              TFMCU_FAIL(l);
            }
          } else if (start != span->out_start || stop != span->out_stop || before != 0 || after != 0) {
            TFMCU_FAIL(l);
          }
          if (stop > start) {
            int32_t in_held_start, in_held_stop;
            tfmcu_held(s, axis, b, t, &in_held_start, &in_held_stop);
            if (start < in_held_start || stop > in_held_stop) {
              TFMCU_FAIL(l);  /* reads outside what the patch holds */
            }
          }
        }
      }
    }
    /* The output tensor is covered completely, band after band. */
    const int32_t producer = s->tensors[s->output_tensor].producer;
    int32_t covered = 0;
    for (int32_t b = 0; b < bands; ++b) {
      const TfmcuSpan* span = tfmcu_span(s, axis, b, producer);
      if (span->out_start > covered) {
        TFMCU_FAIL(producer);
      }
      covered = span->out_stop > covered ? span->out_stop : covered;
    }
    if (covered != tfmcu_dim(&s->tensors[s->output_tensor], axis)) {
      TFMCU_FAIL(producer);
    }
  }
  return tfmcu_check_caches(s, failed_layer);
}

/* The scratch plan: offsets >= 0, live buffers disjoint, caches disjoint from each other and from every patch
 * buffer; *end = highest byte reached. */
static TfmcuStatus tfmcu_check_buffers(const TfmcuStage* s, int64_t* end) {
  *end = 0;
  for (int32_t k = 0; k < s->num_caches; ++k) {
    const int64_t start = s->caches[k].offset;
    const int64_t stop = start + tfmcu_cache_bytes(s, &s->caches[k]);
    if (stop == start) {
      continue;
    }
    *end = stop > *end ? stop : *end;
    for (int32_t m = 0; m < k; ++m) {
      const int64_t m_start = s->caches[m].offset;
      const int64_t m_stop = m_start + tfmcu_cache_bytes(s, &s->caches[m]);
      if (m_stop > m_start && start < m_stop && m_start < stop) {
        return kTfmcuErrorInvalidStage;
      }
    }
    for (int32_t p = 0; p < s->grid_rows * s->grid_cols; ++p) {
      const int32_t* offsets = s->buffer_offsets + (ptrdiff_t)p * s->num_tensors;
      for (int32_t t = 0; t < s->num_tensors; ++t) {
        if (tfmcu_in_memory_tensor(s, t)) {
          continue;
        }
        const int64_t size = tfmcu_buffer_bytes(s, p / s->grid_cols, p % s->grid_cols, t);
        if (size > 0 && offsets[t] >= 0 && start < (int64_t)offsets[t] + size && offsets[t] < stop) {
          return kTfmcuErrorInvalidStage;
        }
      }
    }
  }
  for (int32_t i = 0; i < s->grid_rows; ++i) {
    for (int32_t j = 0; j < s->grid_cols; ++j) {
      const int32_t* offsets = s->buffer_offsets + ((ptrdiff_t)i * s->grid_cols + j) * s->num_tensors;
      for (int32_t t = 0; t < s->num_tensors; ++t) {
        if (tfmcu_in_memory_tensor(s, t)) {
          if (offsets[t] != -1) {
            return kTfmcuErrorInvalidStage;
          }
          continue;
        }
        if (offsets[t] < 0) {
          return kTfmcuErrorInvalidStage;
        }
        const int64_t size = tfmcu_buffer_bytes(s, i, j, t);
        const int64_t stop = (int64_t)offsets[t] + size;
        if (size > 0 && stop > *end) {
          *end = stop;
        }
        const int32_t first = s->tensors[t].producer;
        const int32_t last = tfmcu_last_use(s, t);
        for (int32_t u = 0; u < t; ++u) {
          if (tfmcu_in_memory_tensor(s, u)) {
            continue;
          }
          const int32_t u_first = s->tensors[u].producer;
          const int32_t u_last = tfmcu_last_use(s, u);
          const int64_t u_size = tfmcu_buffer_bytes(s, i, j, u);
          const int alive_together = first <= u_last && u_first <= last;
          const int overlap = size > 0 && u_size > 0 && offsets[t] < (int64_t)offsets[u] + u_size &&
                              offsets[u] < stop;
          if (alive_together && overlap) {
            return kTfmcuErrorInvalidStage;
          }
        }
      }
    }
  }
  return kTfmcuOk;
}

TfmcuStatus tfmcu_stage_check(const TfmcuStage* stage, int32_t* failed_layer) {
  const TfmcuStatus status = tfmcu_check_structure(stage, failed_layer);
  if (status != kTfmcuOk) {
    return status;
  }
  int64_t end = 0;
  if (tfmcu_check_buffers(stage, &end) != kTfmcuOk || end != (int64_t)stage->scratch_bytes) {
    TFMCU_FAIL(-1);
  }
  return kTfmcuOk;
}

size_t tfmcu_stage_scratch_bytes(const TfmcuStage* stage) {
  int64_t end = 0;
  if (tfmcu_check_structure(stage, NULL) != kTfmcuOk || tfmcu_check_buffers(stage, &end) != kTfmcuOk) {
    return 0;
  }
  return (size_t)end;
}

size_t tfmcu_stage_output_bytes(const TfmcuStage* stage) {
  if (tfmcu_check_structure(stage, NULL) != kTfmcuOk) {
    return 0;
  }
  const TfmcuTensor* out = &stage->tensors[stage->output_tensor];
  return (size_t)out->height * (size_t)out->width * (size_t)out->channels;
}

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
 * move forward (a band reading rows above those of the band before), which streaming does not support. */
static int64_t tfmcu_input_window_bytes(const TfmcuStage* s) {
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
    TFMCU_FAIL(-1);
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
    for (int32_t i = 0; i < s->grid_rows; ++i) {
      for (int32_t j = 0; j < s->grid_cols; ++j) {
        TfmcuConstView in[TFMCU_MAX_LAYER_INPUTS];
        TfmcuView out;
        tfmcu_layer_views(s, i, j, l, NULL, 0, NULL, NULL, in, &out);
        if (out.height == 0 || out.width == 0) {
          continue;
        }
        const int32_t need = op->backend_scratch(s->layers[l].params, in, tfmcu_span(s, 0, i, l)->pad_before[0],
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
  if (op->backend_run != NULL) {
    TfmcuKernelScratch kernel_scratch;
    kernel_scratch.data = prepared->kernel_scratch_bytes > 0 ? scratch + prepared->kernel_scratch_offset : NULL;
    kernel_scratch.bytes = (int32_t)prepared->kernel_scratch_bytes;
    return op->backend_run(layer->params, in, pad_top, pad_left, &out, &kernel_scratch);
  }
  return op->run(layer->params, in, pad_top, pad_left, &out);
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

/* Before layer l of patch (i, j): fills the beginning of its output's held box from the caches (columns first). */
static void tfmcu_restore_caches(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, int8_t* scratch) {
  const int32_t t = s->layers[l].output;
  const TfmcuBuffer buf = tfmcu_buffer(s, i, j, t, NULL, 0, NULL, scratch);
  const int32_t channels = s->tensors[t].channels;
  int32_t r0, r1, c0, c1;
  tfmcu_held(s, 0, i, t, &r0, &r1);
  tfmcu_held(s, 1, j, t, &c0, &c1);
  const TfmcuCache* cols = tfmcu_find_cache(s, t, 1);
  if (cols != NULL && j > 0) {
    const int32_t n = tfmcu_span(s, 1, j, l)->out_start - c0;
    const int32_t stride = tfmcu_handed_over(s, cols, j - 1) * channels;
    tfmcu_copy_box(buf.write, buf.row_stride, scratch + cols->offset, stride, r1 - r0, n * channels);
  }
  const TfmcuCache* rows = tfmcu_find_cache(s, t, 0);
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

/* After layer l of patch (i, j): hands over to the next patch / band what it needs of every cached tensor whose
 * last reader is l. */
static void tfmcu_save_caches(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, int8_t* scratch) {
  for (int32_t k = 0; k < s->num_caches; ++k) {
    const TfmcuCache* c = &s->caches[k];
    const int32_t t = c->tensor;
    if (tfmcu_last_use(s, t) != l) {
      continue;
    }
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
}

/* Every patch of row band i (input: the stage input from row input_row0 on). */
static TfmcuStatus tfmcu_run_row_band(const TfmcuPreparedStage* prepared, int32_t i, const void* input,
                                      int32_t input_row0, int8_t* output, int8_t* scratch) {
  const TfmcuStage* stage = prepared->stage;
  for (int32_t j = 0; j < stage->grid_cols; ++j) {
    for (int32_t l = 0; l < stage->num_layers; ++l) {
      if (stage->num_caches > 0) {
        tfmcu_restore_caches(stage, i, j, l, scratch);
      }
      const TfmcuStatus status = tfmcu_run_layer(prepared, i, j, l, input, input_row0, output, scratch);
      if (status != kTfmcuOk) {
        return status;
      }
      if (stage->num_caches > 0) {
        tfmcu_save_caches(stage, i, j, l, scratch);
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
  for (int32_t i = 0; i < stage->grid_rows; ++i) {
    const TfmcuStatus status = tfmcu_run_row_band(prepared, i, input, 0, output, (int8_t*)scratch);
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
    const TfmcuStatus status = tfmcu_run_row_band(prepared, i, window, start, output, (int8_t*)scratch);
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
