/* The stage geometry that the executor (patch_stage.c) and the validation (patch_stage_validate.c) both read from a
 * TfmcuStage's tables, and the failure macro of the checks both make; internal to the patch-stage library (not part
 * of its API). See patch_stage_types.h for the data model (spans, held boxes, halo caches, patch buffers).
 *
 * The helpers are plain `static` functions, as they were when executor and validation were one file, and not
 * `inline` (GCC inlines `inline` ones more eagerly). Both files call every one of them (-Wunused-function). */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_GEOMETRY_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_GEOMETRY_H_

#include <stddef.h>

#include "patch_stage_types.h"
#include "tfmcu_common.h"

/* A stage description that fails validation: stores `layer_index` (the offending layer, -1 when the problem is
 * not one layer's) in the caller's `failed_layer` (when not NULL) and returns kTfmcuErrorInvalidStage. */
#define TFMCU_STAGE_FAIL(layer_index)  \
  do {                                 \
    if (failed_layer != NULL) {        \
      *failed_layer = (layer_index);   \
    }                                  \
    return kTfmcuErrorInvalidStage;    \
  } while (0)

static int32_t tfmcu_dim(const TfmcuTensor* t, int32_t axis) {
  return axis == 0 ? t->height : t->width;
}

static const TfmcuSpan* tfmcu_span(const TfmcuStage* s, int32_t axis, int32_t band, int32_t layer) {
  const TfmcuSpan* spans = axis == 0 ? s->row_spans : s->col_spans;
  return &spans[(ptrdiff_t)band * s->num_layers + layer];
}

/* Layer l's params struct, bound from its params record into `storage` (patch_stage_types.h). */
static const void* tfmcu_layer_params(const TfmcuStage* s, int32_t l, TfmcuParams* storage) {
  const TfmcuLayer* layer = &s->layers[l];
  return tfmcu_op_params(tfmcu_op_info(layer->type), s->params + layer->params, s->constants, storage);
}

/* The stage input, the stage output and the constants: read (written) at their full-tensor coordinates, in place. */
static int tfmcu_in_memory_tensor(const TfmcuStage* s, int32_t t) {
  return t == s->input_tensor || t == s->output_tensor || s->tensors[t].constant >= 0;
}

/* The held range of layer l's output along one axis in one band: the held table's pair, else the computed span. */
static void tfmcu_layer_held(const TfmcuStage* s, int32_t axis, int32_t band, int32_t l,
                                    int32_t* start, int32_t* stop) {
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
static void tfmcu_held(const TfmcuStage* s, int32_t axis, int32_t band, int32_t t, int32_t* start,
                              int32_t* stop) {
  if (tfmcu_in_memory_tensor(s, t)) {
    *start = 0;
    *stop = tfmcu_dim(&s->tensors[t], axis);
    return;
  }
  tfmcu_layer_held(s, axis, band, s->tensors[t].producer, start, stop);
}

/* The cache of tensor t along `axis` (0: rows, 1: columns, 2: a reduction's accumulator), or NULL. */
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

#endif  /* TFMCU_PATCH_KERNELS_PATCH_STAGE_GEOMETRY_H_ */
