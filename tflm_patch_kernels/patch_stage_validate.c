/* Patch-stage validation (see patch_stage_validate.h: tfmcu_stage_check, tfmcu_stage_scratch_bytes,
 * tfmcu_stage_output_bytes): everything tfmcu_stage_prepare checks once, apart from the executor's hot loop
 * (patch_stage.c). */
#include "patch_stage_validate.h"

#include <string.h>

#include "patch_stage_geometry.h"

/* ------------------------------------------------------------------------------------------ scratch geometry */

/* A whole tensor (patch_stage_types.h: passes): the output of a layer on whole tensors or of an inner reduction. */
static int tfmcu_whole_tensor(const TfmcuStage* s, int32_t t) {
  if (tfmcu_in_memory_tensor(s, t) || s->tensors[t].producer < 0) {
    return 0;
  }
  const TfmcuLayer* producer = &s->layers[s->tensors[t].producer];
  return producer->passes == 0 || tfmcu_op_info(producer->type)->accumulate != NULL;
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

/* Bytes of a halo cache or an accumulator (see patch_stage_types.h). */
static int64_t tfmcu_cache_bytes(const TfmcuStage* s, const TfmcuCache* c) {
  if (c->axis == 2) {
    return 4 * (int64_t)s->tensors[c->tensor].channels;
  }
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

static int64_t tfmcu_buffer_bytes(const TfmcuStage* s, int32_t row_band, int32_t col_band, int32_t t) {
  int32_t r0, r1, c0, c1;
  tfmcu_held(s, 0, row_band, t, &r0, &r1);
  tfmcu_held(s, 1, col_band, t, &c0, &c1);
  return (int64_t)(r1 - r0) * (int64_t)(c1 - c0) * (int64_t)s->tensors[t].channels;
}

/* ------------------------------------------------------------------------------------------ validation */

/* Layer l's params record (patch_stage_types.h): inside `params`, its arrays inside `constants` (int32 arrays 4-byte
 * aligned) and as large as its params ask, its output shifts in -31..31, and the op's own params check (op table)
 * against the channels of its tensors. The layer's type, inputs and output were checked before. */
static TfmcuStatus tfmcu_check_layer_params(const TfmcuStage* s, int32_t l) {
  const TfmcuLayer* layer = &s->layers[l];
  const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
  if (s->params == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (layer->params < 0 || (int64_t)layer->params + op->num_arrays + op->num_words > (int64_t)s->params_words) {
    return kTfmcuErrorInvalidStage;
  }
  const int32_t* record = s->params + layer->params;
  for (int32_t k = 0; k < op->num_arrays; ++k) {
    if (record[k] < -1 || (record[k] >= 0 && (s->constants == NULL || (uint32_t)record[k] > s->constants_bytes))) {
      return kTfmcuErrorInvalidStage;
    }
  }
  int32_t in_channels[TFMCU_MAX_LAYER_INPUTS];
  for (int32_t k = 0; k < layer->num_inputs; ++k) {
    in_channels[k] = s->tensors[layer->inputs[k]].channels;
  }
  const int32_t out_channels = s->tensors[layer->output].channels;
  TfmcuParams storage;
  const void* params = tfmcu_layer_params(s, l, &storage);
  const TfmcuStatus status = op->check(params, in_channels, out_channels);
  if (status != kTfmcuOk || op->array_sizes == NULL) {
    return status;
  }
  int32_t elements[TFMCU_MAX_PARAM_ARRAYS] = {0, 0, 0, 0};
  op->array_sizes(params, in_channels, out_channels, elements);
  for (int32_t k = 0; k < op->num_arrays; ++k) {
    const int64_t element_bytes = k == 0 ? 1 : 4;  /* filter int8, the others int32 (TfmcuOpArraySizesFn) */
    if (record[k] >= 0 && ((int64_t)record[k] + element_bytes * elements[k] > (int64_t)s->constants_bytes ||
                           (uintptr_t)(s->constants + record[k]) % (uintptr_t)element_bytes != 0)) {
      return kTfmcuErrorInvalidStage;
    }
  }
  if (op->num_arrays > 3 && record[3] >= 0 &&
      !tfmcu_shifts_valid((const int32_t*)(const void*)(s->constants + record[3]), elements[3])) {
    return kTfmcuErrorInvalidStage;  /* output_shift */
  }
  return kTfmcuOk;
}

/* Halo caches against the held tables (the spans were checked): every held range that begins before the computed
 * one belongs to a cached tensor and axis, and the band before holds what the cache must fill in; the held ranges
 * of a cached tensor grow band after band on both axes (what the save rule relies on). */
static TfmcuStatus tfmcu_check_caches(const TfmcuStage* s, int32_t* failed_layer) {
  if (s->num_caches < 0 || (s->num_caches > 0 && s->caches == NULL)) {
    TFMCU_STAGE_FAIL(-1);
  }
  for (int32_t k = 0; k < s->num_caches; ++k) {
    const TfmcuCache* c = &s->caches[k];
    if (c->tensor < 0 || c->tensor >= s->num_tensors || c->axis < 0 || c->axis > 2 || c->offset < 0 ||
        tfmcu_find_cache(s, c->tensor, c->axis) != c) {
      TFMCU_STAGE_FAIL(-1);
    }
    /* a halo cache belongs to an intermediate tensor on tiles, an accumulator to the output of a reduction */
    const int32_t producer = s->tensors[c->tensor].producer;
    const int reduced = producer >= 0 && tfmcu_op_info(s->layers[producer].type)->accumulate != NULL;
    if (c->axis == 2 ? !reduced : (tfmcu_in_memory_tensor(s, c->tensor) || tfmcu_whole_tensor(s, c->tensor))) {
      TFMCU_STAGE_FAIL(-1);
    }
  }
  for (int32_t l = 0; l < s->num_layers; ++l) {
    if (tfmcu_op_info(s->layers[l].type)->accumulate != NULL && tfmcu_find_cache(s, s->layers[l].output, 2) == NULL) {
      TFMCU_STAGE_FAIL(l);  /* a reduction without its accumulator */
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
          TFMCU_STAGE_FAIL(l);  /* held rows (columns) that neither this patch nor the cache provides */
        }
        if (any_cache && b > 0 && (start < prev_start || stop < prev_stop)) {
          TFMCU_STAGE_FAIL(l);
        }
        prev_start = start;
        prev_stop = stop;
      }
    }
  }
  return kTfmcuOk;
}

/* The pass that finishes a whole tensor's producer: its after_pass, or an inner reduction's one pass. */
static int32_t tfmcu_finished_in(const TfmcuLayer* producer) {
  if (producer->passes == 0) {
    return producer->after_pass;
  }
  int32_t p = 0;
  while (((producer->passes >> p) & 1) == 0) {
    ++p;
  }
  return p;
}

/* Layer l's passes (patch_stage_types.h): a layer on whole tensors runs after a pass before the last and writes a
 * 1 x 1 tensor that is not the stage output; a layer on tiles runs in passes of the stage; a reduction in exactly
 * one, the last if it writes the stage output (then it is the last layer), an earlier one otherwise; the stage
 * output is written in the last pass. */
static TfmcuStatus tfmcu_check_passes(const TfmcuStage* s, int32_t l) {
  const TfmcuLayer* layer = &s->layers[l];
  const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
  const TfmcuTensor* out = &s->tensors[layer->output];
  const int32_t last = s->num_passes - 1;
  const int32_t all = (int32_t)((1u << s->num_passes) - 1u);
  if (layer->passes == 0) {
    if (op->accumulate != NULL || layer->after_pass < 0 || layer->after_pass >= last || out->height != 1 ||
        out->width != 1 || layer->output == s->output_tensor) {
      return kTfmcuErrorInvalidStage;
    }
    return kTfmcuOk;
  }
  if (layer->after_pass != -1 || (layer->passes & ~all) != 0) {
    return kTfmcuErrorInvalidStage;
  }
  if (op->accumulate != NULL) {
    const int one_pass = (layer->passes & (layer->passes - 1)) == 0;
    const int in_last = layer->passes == (int32_t)(1u << last);
    const int ends_stage = layer->output == s->output_tensor;
    if (out->height != 1 || out->width != 1 || !one_pass || in_last != ends_stage ||
        (ends_stage && l != s->num_layers - 1)) {
      return kTfmcuErrorInvalidStage;
    }
  }
  if (layer->output == s->output_tensor && ((layer->passes >> last) & 1) == 0) {
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}

/* Layer l's inputs against the passes: a layer on whole tensors reads whole tensors finished by its pass (or
 * constants); a layer on tiles reads a whole tensor only in passes after the one that finished it, a tiled tensor
 * only in passes its producer runs in; a reduction reads a tiled tensor. The inputs' ids were checked. */
static TfmcuStatus tfmcu_check_pass_inputs(const TfmcuStage* s, int32_t l) {
  const TfmcuLayer* layer = &s->layers[l];
  const int reduction = tfmcu_op_info(layer->type)->accumulate != NULL;
  for (int32_t k = 0; k < layer->num_inputs; ++k) {
    const int32_t t = layer->inputs[k];
    if (s->tensors[t].constant >= 0 && !reduction) {
      continue;
    }
    if (t == s->input_tensor) {
      if (layer->passes == 0) {
        return kTfmcuErrorInvalidStage;
      }
      continue;
    }
    const TfmcuLayer* producer = &s->layers[s->tensors[t].producer];
    const int whole = tfmcu_whole_tensor(s, t);
    if (layer->passes == 0) {
      if (!whole || tfmcu_finished_in(producer) > layer->after_pass) {
        return kTfmcuErrorInvalidStage;
      }
    } else if (whole) {
      if (reduction || (layer->passes & (int32_t)((2u << tfmcu_finished_in(producer)) - 1u)) != 0) {
        return kTfmcuErrorInvalidStage;
      }
    } else if ((layer->passes & ~producer->passes) != 0) {
      return kTfmcuErrorInvalidStage;
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
      s->input_tensor == s->output_tensor || s->num_passes < 1 || s->num_passes > TFMCU_MAX_PASSES) {
    TFMCU_STAGE_FAIL(-1);
  }
  for (int32_t t = 0; t < s->num_tensors; ++t) {
    const TfmcuTensor* tensor = &s->tensors[t];
    if (tensor->height <= 0 || tensor->width <= 0 || tensor->channels <= 0) {
      TFMCU_STAGE_FAIL(-1);
    }
    if (tensor->dtype != kTfmcuInt8 && !(tensor->dtype == kTfmcuFloat32 && t == s->input_tensor)) {
      return kTfmcuErrorUnsupportedOp;
    }
    const int constant = tensor->constant >= 0;
    if (tensor->constant < -1 ||
        (constant && (t == s->input_tensor || t == s->output_tensor || s->constants == NULL ||
                      (int64_t)tensor->constant + (int64_t)tensor->height * tensor->width * tensor->channels >
                          (int64_t)s->constants_bytes))) {
      TFMCU_STAGE_FAIL(-1);  /* a constant's data inside the constants; the input and output are not constants */
    }
    if (t == s->input_tensor || constant ? tensor->producer != -1
                                         : (tensor->producer < 0 || tensor->producer >= s->num_layers ||
                                            s->layers[tensor->producer].output != t)) {
      TFMCU_STAGE_FAIL(-1);
    }
  }
  for (int32_t l = 0; l < s->num_layers; ++l) {
    const TfmcuLayer* layer = &s->layers[l];
    const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
    if (op == NULL) {
      if (failed_layer != NULL) {
        *failed_layer = l;
      }
      return kTfmcuErrorUnsupportedOp;
    }
    if (layer->num_inputs != op->num_inputs || layer->output < 0 ||
        layer->output >= s->num_tensors || s->tensors[layer->output].producer != l) {
      TFMCU_STAGE_FAIL(l);
    }
    if (tfmcu_check_passes(s, l) != kTfmcuOk) {
      TFMCU_STAGE_FAIL(l);
    }
    for (int32_t k = 0; k < layer->num_inputs; ++k) {
      const int32_t t = layer->inputs[k];
      if (t < 0 || t >= s->num_tensors || (t != s->input_tensor && s->tensors[t].producer >= l)) {
        TFMCU_STAGE_FAIL(l);
      }
      if (s->tensors[t].dtype != op->input_dtype) {
        TFMCU_STAGE_FAIL(l);
      }
    }
    if (tfmcu_check_pass_inputs(s, l) != kTfmcuOk) {
      TFMCU_STAGE_FAIL(l);
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
            (empty && layer->output == s->output_tensor) ||
            (layer->passes == 0 && (span->out_start != 0 || span->out_stop != 1))) {
          TFMCU_STAGE_FAIL(l);  /* (a layer on whole tensors computes its whole 1 x 1 output in every band) */
        }
        int32_t held_start, held_stop;
        tfmcu_layer_held(s, axis, b, l, &held_start, &held_stop);
        if (held_start < 0 || held_start > span->out_start || held_stop != span->out_stop ||
            (layer->output == s->output_tensor && held_start != span->out_start)) {
          TFMCU_STAGE_FAIL(l);  /* a held range ends where the computed one does; the output is computed whole */
        }
        const TfmcuOpInfo* op = tfmcu_op_info(layer->type);
        TfmcuWindow window = {{1, 1}, {1, 1}, {1, 1}};
        if (op->window != NULL) {
          TfmcuParams storage;
          op->window(tfmcu_layer_params(s, l, &storage), &window);
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
              TFMCU_STAGE_FAIL(l);  /* a layer that computes nothing reads nothing */
            }
            continue;
          }
          if (start < 0 || stop < start || stop > in_dim || before < 0 || after < 0 ||
              (before > 0 && start != 0) || (after > 0 && stop != in_dim)) {
            TFMCU_STAGE_FAIL(l);  /* padding only at the feature-map border */
          }
          if (op->accumulate != NULL) {
            /* a reduction reads the band's tile: the tiles of the bands, in order, partition its input */
            const int32_t tile_start = b > 0 ? tfmcu_span(s, axis, b - 1, l)->in_stop[k] : 0;
            if (start != tile_start || stop <= start || before != 0 || after != 0 ||
                (b == bands - 1 && stop != in_dim)) {
              TFMCU_STAGE_FAIL(l);
            }
          } else if (op->window != NULL) {
            const int64_t reach = (int64_t)(span->out_stop - span->out_start - 1) * window.stride[axis] +
                                  (int64_t)(window.kernel[axis] - 1) * window.dilation[axis] + 1;
            if ((int64_t)before + (stop - start) + after != reach) {
              TFMCU_STAGE_FAIL(l);
            }
          } else if (in_dim == 1 && out_dim > 1) {
            if (start != 0 || stop != 1 || before != 0 || after != 0) {
              TFMCU_STAGE_FAIL(l);  /* an operand broadcast along this axis */
            }
          } else if (start != span->out_start || stop != span->out_stop || before != 0 || after != 0) {
            TFMCU_STAGE_FAIL(l);
          }
          if (stop > start) {
            int32_t in_held_start, in_held_stop;
            tfmcu_held(s, axis, b, t, &in_held_start, &in_held_stop);
            if (start < in_held_start || stop > in_held_stop) {
              TFMCU_STAGE_FAIL(l);  /* reads outside what the patch holds */
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
        TFMCU_STAGE_FAIL(producer);
      }
      covered = span->out_stop > covered ? span->out_stop : covered;
    }
    if (covered != tfmcu_dim(&s->tensors[s->output_tensor], axis)) {
      TFMCU_STAGE_FAIL(producer);
    }
  }
  return tfmcu_check_caches(s, failed_layer);
}

/* Whether [start, stop) overlaps a patch buffer of any patch (whole tensors and in-memory ones apart). */
static int tfmcu_overlaps_patch_buffer(const TfmcuStage* s, int64_t start, int64_t stop) {
  for (int32_t p = 0; p < s->grid_rows * s->grid_cols; ++p) {
    const int32_t* offsets = s->buffer_offsets + (ptrdiff_t)p * s->num_tensors;
    for (int32_t t = 0; t < s->num_tensors; ++t) {
      if (tfmcu_in_memory_tensor(s, t) || tfmcu_whole_tensor(s, t)) {
        continue;
      }
      const int64_t size = tfmcu_buffer_bytes(s, p / s->grid_cols, p % s->grid_cols, t);
      if (size > 0 && offsets[t] >= 0 && start < (int64_t)offsets[t] + size && offsets[t] < stop) {
        return 1;
      }
    }
  }
  return 0;
}

/* The whole tensors (patch_stage_types.h: passes): one offset >= 0 in every patch, disjoint from each other, from
 * every cache and from every patch buffer; *end raised to the highest byte they reach. */
static TfmcuStatus tfmcu_check_whole_buffers(const TfmcuStage* s, int64_t* end) {
  for (int32_t t = 0; t < s->num_tensors; ++t) {
    if (!tfmcu_whole_tensor(s, t)) {
      continue;
    }
    const int64_t start = s->buffer_offsets[t];
    const int64_t stop = start + s->tensors[t].channels;
    for (int32_t p = 1; p < s->grid_rows * s->grid_cols; ++p) {
      if (s->buffer_offsets[(ptrdiff_t)p * s->num_tensors + t] != start) {
        return kTfmcuErrorInvalidStage;
      }
    }
    if (start < 0 || tfmcu_overlaps_patch_buffer(s, start, stop)) {
      return kTfmcuErrorInvalidStage;
    }
    for (int32_t k = 0; k < s->num_caches; ++k) {
      const int64_t c_start = s->caches[k].offset;
      const int64_t c_stop = c_start + tfmcu_cache_bytes(s, &s->caches[k]);
      if (c_stop > c_start && start < c_stop && c_start < stop) {
        return kTfmcuErrorInvalidStage;
      }
    }
    for (int32_t u = 0; u < t; ++u) {
      if (tfmcu_whole_tensor(s, u) && start < (int64_t)s->buffer_offsets[u] + s->tensors[u].channels &&
          s->buffer_offsets[u] < stop) {
        return kTfmcuErrorInvalidStage;
      }
    }
    *end = stop > *end ? stop : *end;
  }
  return kTfmcuOk;
}

/* The scratch plan: offsets >= 0, live buffers disjoint, caches disjoint from each other and from every patch
 * buffer, whole tensors apart from everything; *end = highest byte reached. */
static TfmcuStatus tfmcu_check_buffers(const TfmcuStage* s, int64_t* end) {
  *end = 0;
  if (tfmcu_check_whole_buffers(s, end) != kTfmcuOk) {
    return kTfmcuErrorInvalidStage;
  }
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
    if (tfmcu_overlaps_patch_buffer(s, start, stop)) {
      return kTfmcuErrorInvalidStage;
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
        if (tfmcu_whole_tensor(s, t)) {
          continue;  /* (tfmcu_check_whole_buffers) */
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
          if (tfmcu_in_memory_tensor(s, u) || tfmcu_whole_tensor(s, u)) {
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
    TFMCU_STAGE_FAIL(-1);
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

/* ------------------------------------------------------------------------------------------ stage blobs */

/* Bytes of a table of a * b * c rows of `row` bytes, or -1 when that exceeds `limit` (each step stays far inside
 * int64: every factor and every partial product is at most limit <= INT32_MAX). */
static int64_t tfmcu_table_bytes(int64_t a, int64_t b, int64_t c, int64_t row, int64_t limit) {
  const int64_t factors[4] = {a, b, c, row};
  int64_t n = 1;
  for (int k = 0; k < 4; ++k) {
    if (factors[k] < 0 || factors[k] > limit) {
      return -1;
    }
    n *= factors[k];
    if (n > limit) {
      return -1;
    }
  }
  return n;
}

/* The table at byte `offset` of `bytes` table bytes: a pointer into the blob, NULL for offset 0 (an absent table);
 * *ok = 0 when it is misaligned or does not lie inside the blob. */
static const void* tfmcu_blob_table(const void* blob, int64_t size, int32_t offset, int64_t bytes, int* ok) {
  if (offset == 0) {
    return NULL;
  }
  if (bytes < 0 || offset < (int32_t)sizeof(TfmcuStageBlob) || offset % 4 != 0 || offset + bytes > size) {
    *ok = 0;
    return NULL;
  }
  return (const unsigned char*)blob + offset;
}

TfmcuStatus tfmcu_stage_view(const void* blob, size_t bytes, TfmcuStage* stage) {
  if (blob == NULL || stage == NULL) {
    return kTfmcuErrorNullPointer;
  }
  memset(stage, 0, sizeof(*stage));
  const TfmcuStageBlob* h = (const TfmcuStageBlob*)blob;
  if ((uintptr_t)blob % 4 != 0 || bytes < sizeof(TfmcuStageBlob) || bytes > (size_t)INT32_MAX ||
      h->bytes != (int32_t)bytes || h->scratch_bytes < 0 || h->constants_bytes < 0) {
    return kTfmcuErrorInvalidStage;
  }
  const int64_t size = (int64_t)bytes;
  int ok = 1;
  stage->num_tensors = h->num_tensors;
  stage->num_layers = h->num_layers;
  stage->input_tensor = h->input_tensor;
  stage->output_tensor = h->output_tensor;
  stage->grid_rows = h->grid_rows;
  stage->grid_cols = h->grid_cols;
  stage->num_passes = h->num_passes;
  stage->scratch_bytes = (uint32_t)h->scratch_bytes;
  stage->num_caches = h->num_caches;
  stage->params_words = h->params_words;
  stage->constants_bytes = (uint32_t)h->constants_bytes;
  const int64_t nt = h->num_tensors, nl = h->num_layers, rows = h->grid_rows, cols = h->grid_cols;
  stage->tensors = (const TfmcuTensor*)tfmcu_blob_table(
      blob, size, h->tensors, tfmcu_table_bytes(nt, 1, 1, sizeof(TfmcuTensor), size), &ok);
  stage->layers = (const TfmcuLayer*)tfmcu_blob_table(
      blob, size, h->layers, tfmcu_table_bytes(nl, 1, 1, sizeof(TfmcuLayer), size), &ok);
  stage->params = (const int32_t*)tfmcu_blob_table(
      blob, size, h->params, tfmcu_table_bytes(h->params_words, 1, 1, 4, size), &ok);
  stage->row_spans = (const TfmcuSpan*)tfmcu_blob_table(
      blob, size, h->row_spans, tfmcu_table_bytes(rows, nl, 1, sizeof(TfmcuSpan), size), &ok);
  stage->col_spans = (const TfmcuSpan*)tfmcu_blob_table(
      blob, size, h->col_spans, tfmcu_table_bytes(cols, nl, 1, sizeof(TfmcuSpan), size), &ok);
  stage->buffer_offsets = (const int32_t*)tfmcu_blob_table(
      blob, size, h->buffer_offsets, tfmcu_table_bytes(rows, cols, nt, 4, size), &ok);
  stage->row_held = (const int32_t*)tfmcu_blob_table(
      blob, size, h->row_held, tfmcu_table_bytes(rows, nl, 2, 4, size), &ok);
  stage->col_held = (const int32_t*)tfmcu_blob_table(
      blob, size, h->col_held, tfmcu_table_bytes(cols, nl, 2, 4, size), &ok);
  stage->caches = (const TfmcuCache*)tfmcu_blob_table(
      blob, size, h->caches, tfmcu_table_bytes(h->num_caches, 1, 1, sizeof(TfmcuCache), size), &ok);
  stage->constants = (const uint8_t*)tfmcu_blob_table(blob, size, h->constants, h->constants_bytes, &ok);
  if (!ok) {
    memset(stage, 0, sizeof(*stage));
    return kTfmcuErrorInvalidStage;
  }
  return kTfmcuOk;
}
