/* Patch-stage executor: see patch_stage.h. */
#include "patch_stage.h"

/* ------------------------------------------------------------------------------------------ layer geometry */

static int32_t tfmcu_expected_inputs(int32_t type) {
  return type == kTfmcuOpAdd ? 2 : 1;
}

static int tfmcu_is_window_op(int32_t type) {
  return type == kTfmcuOpConv2D || type == kTfmcuOpDepthwiseConv2D || type == kTfmcuOpPad ||
         type == kTfmcuOpAveragePool2D || type == kTfmcuOpMaxPool2D;
}

/* Kernel, stride and dilation of a window layer along axis 0 (rows) or 1 (columns). */
static void tfmcu_window(const TfmcuLayer* layer, int32_t axis, int32_t* kernel, int32_t* stride,
                         int32_t* dilation) {
  *kernel = 1;
  *stride = 1;
  *dilation = 1;
  if (layer->type == kTfmcuOpConv2D) {
    const TfmcuConvParams* p = (const TfmcuConvParams*)layer->params;
    *kernel = axis == 0 ? p->kernel_h : p->kernel_w;
    *stride = axis == 0 ? p->stride_h : p->stride_w;
    *dilation = axis == 0 ? p->dilation_h : p->dilation_w;
  } else if (layer->type == kTfmcuOpDepthwiseConv2D) {
    const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)layer->params;
    *kernel = axis == 0 ? p->kernel_h : p->kernel_w;
    *stride = axis == 0 ? p->stride_h : p->stride_w;
    *dilation = axis == 0 ? p->dilation_h : p->dilation_w;
  } else if (layer->type == kTfmcuOpAveragePool2D || layer->type == kTfmcuOpMaxPool2D) {
    const TfmcuPoolParams* p = (const TfmcuPoolParams*)layer->params;
    *kernel = axis == 0 ? p->filter_h : p->filter_w;
    *stride = axis == 0 ? p->stride_h : p->stride_w;
  }
}

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

/* The rows (axis 0) or columns (axis 1) of tensor t held while band `band` runs: the whole tensor for the stage
 * input and output, else the box its producer computes. */
static void tfmcu_held(const TfmcuStage* s, int32_t axis, int32_t band, int32_t t, int32_t* start, int32_t* stop) {
  if (tfmcu_in_memory_tensor(s, t)) {
    *start = 0;
    *stop = tfmcu_dim(&s->tensors[t], axis);
    return;
  }
  const TfmcuSpan* span = tfmcu_span(s, axis, band, s->tensors[t].producer);
  *start = span->out_start;
  *stop = span->out_stop;
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

static TfmcuStatus tfmcu_check_layer_params(const TfmcuStage* s, int32_t l) {
  const TfmcuLayer* layer = &s->layers[l];
  const TfmcuTensor* in = &s->tensors[layer->inputs[0]];
  const TfmcuTensor* out = &s->tensors[layer->output];
  switch (layer->type) {
    case kTfmcuOpConv2D: {
      const TfmcuConvParams* p = (const TfmcuConvParams*)layer->params;
      if (p->filter == NULL || p->output_multiplier == NULL || p->output_shift == NULL) {
        return kTfmcuErrorNullPointer;
      }
      if (p->groups <= 0 || in->channels % p->groups != 0 || out->channels % p->groups != 0 ||
          p->kernel_h <= 0 || p->kernel_w <= 0 || p->stride_h <= 0 || p->stride_w <= 0 || p->dilation_h <= 0 ||
          p->dilation_w <= 0 || p->act_min > p->act_max) {
        return kTfmcuErrorInvalidStage;
      }
      return kTfmcuOk;
    }
    case kTfmcuOpDepthwiseConv2D: {
      const TfmcuDepthwiseConvParams* p = (const TfmcuDepthwiseConvParams*)layer->params;
      if (p->filter == NULL || p->output_multiplier == NULL || p->output_shift == NULL) {
        return kTfmcuErrorNullPointer;
      }
      if (p->depth_multiplier <= 0 || in->channels * p->depth_multiplier != out->channels || p->kernel_h <= 0 ||
          p->kernel_w <= 0 || p->stride_h <= 0 || p->stride_w <= 0 || p->dilation_h <= 0 || p->dilation_w <= 0 ||
          p->act_min > p->act_max) {
        return kTfmcuErrorInvalidStage;
      }
      return kTfmcuOk;
    }
    case kTfmcuOpAdd: {
      const TfmcuAddParams* p = (const TfmcuAddParams*)layer->params;
      const TfmcuTensor* in2 = &s->tensors[layer->inputs[1]];
      if (in->channels != out->channels || in2->channels != out->channels || p->left_shift < 0 ||
          p->left_shift > 30 || p->act_min > p->act_max) {
        return kTfmcuErrorInvalidStage;
      }
      return kTfmcuOk;
    }
    case kTfmcuOpPad: {
      const TfmcuPadParams* p = (const TfmcuPadParams*)layer->params;
      if (in->channels != out->channels || p->value < -128 || p->value > 127) {
        return kTfmcuErrorInvalidStage;
      }
      return kTfmcuOk;
    }
    case kTfmcuOpAveragePool2D:
    case kTfmcuOpMaxPool2D: {
      const TfmcuPoolParams* p = (const TfmcuPoolParams*)layer->params;
      if (in->channels != out->channels || p->filter_h <= 0 || p->filter_w <= 0 || p->stride_h <= 0 ||
          p->stride_w <= 0 || p->act_min > p->act_max) {
        return kTfmcuErrorInvalidStage;
      }
      return kTfmcuOk;
    }
    case kTfmcuOpQuantize:
      return in->channels == out->channels ? kTfmcuOk : kTfmcuErrorInvalidStage;
    default:
      return kTfmcuErrorUnsupportedOp;
  }
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
    if (layer->type < kTfmcuOpConv2D || layer->type > kTfmcuOpQuantize) {
      if (failed_layer != NULL) {
        *failed_layer = l;
      }
      return kTfmcuErrorUnsupportedOp;
    }
    if (layer->num_inputs != tfmcu_expected_inputs(layer->type) || layer->output < 0 ||
        layer->output >= s->num_tensors || s->tensors[layer->output].producer != l) {
      TFMCU_FAIL(l);
    }
    for (int32_t k = 0; k < layer->num_inputs; ++k) {
      const int32_t t = layer->inputs[k];
      if (t < 0 || t >= s->num_tensors || (t != s->input_tensor && s->tensors[t].producer >= l)) {
        TFMCU_FAIL(l);
      }
      const int32_t want = layer->type == kTfmcuOpQuantize ? kTfmcuFloat32 : kTfmcuInt8;
      if (s->tensors[t].dtype != want) {
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
        if (span->out_start < 0 || span->out_stop <= span->out_start || span->out_stop > out_dim) {
          TFMCU_FAIL(l);
        }
        int32_t kernel, stride, dilation;
        tfmcu_window(layer, axis, &kernel, &stride, &dilation);
        for (int32_t k = 0; k < layer->num_inputs; ++k) {
          const int32_t t = layer->inputs[k];
          const int32_t in_dim = tfmcu_dim(&s->tensors[t], axis);
          const int32_t start = span->in_start[k];
          const int32_t stop = span->in_stop[k];
          const int32_t before = span->pad_before[k];
          const int32_t after = span->pad_after[k];
          if (start < 0 || stop < start || stop > in_dim || before < 0 || after < 0 ||
              (before > 0 && start != 0) || (after > 0 && stop != in_dim)) {
            TFMCU_FAIL(l);  /* padding only at the feature-map border */
          }
          if (tfmcu_is_window_op(layer->type)) {
            const int64_t window = (int64_t)(span->out_stop - span->out_start - 1) * stride +
                                   (int64_t)(kernel - 1) * dilation + 1;
            if ((int64_t)before + (stop - start) + after != window) {
              TFMCU_FAIL(l);
            }
          } else if (start != span->out_start || stop != span->out_stop || before != 0 || after != 0) {
            TFMCU_FAIL(l);
          }
          if (stop > start) {
            int32_t held_start, held_stop;
            tfmcu_held(s, axis, b, t, &held_start, &held_stop);
            if (start < held_start || stop > held_stop) {
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
  return kTfmcuOk;
}

/* The scratch plan: offsets >= 0, live buffers disjoint; *end = highest byte reached. */
static TfmcuStatus tfmcu_check_buffers(const TfmcuStage* s, int64_t* end) {
  *end = 0;
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

/* ------------------------------------------------------------------------------------------ execution */

/* Where a tensor lives during one patch: its buffer, the full-tensor coordinates of the buffer's first pixel and
 * its row stride in elements. */
typedef struct {
  const void* read;  /* int8_t or float (stage input) */
  int8_t* write;     /* NULL for the stage input */
  int32_t row0;
  int32_t col0;
  int32_t row_stride;
  int32_t channels;
} TfmcuBuffer;

static TfmcuBuffer tfmcu_buffer(const TfmcuStage* s, int32_t i, int32_t j, int32_t t, const void* input,
                                int8_t* output, int8_t* scratch) {
  TfmcuBuffer buf;
  const TfmcuTensor* tensor = &s->tensors[t];
  buf.channels = tensor->channels;
  if (t == s->input_tensor) {
    buf.read = input;
    buf.write = NULL;
    buf.row0 = 0;
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
    buf.write = scratch + offset;
    buf.read = buf.write;
    buf.row_stride = (c1 - buf.col0) * tensor->channels;
  }
  return buf;
}

static ptrdiff_t tfmcu_element(const TfmcuBuffer* buf, int32_t row, int32_t col) {
  return (ptrdiff_t)(row - buf->row0) * buf->row_stride + (ptrdiff_t)(col - buf->col0) * buf->channels;
}

static TfmcuConstView tfmcu_read_view(const TfmcuBuffer* buf, const TfmcuSpan* rows, const TfmcuSpan* cols,
                                      int32_t k) {
  TfmcuConstView v;
  v.data = (const int8_t*)buf->read + tfmcu_element(buf, rows->in_start[k], cols->in_start[k]);
  v.height = rows->in_stop[k] - rows->in_start[k];
  v.width = cols->in_stop[k] - cols->in_start[k];
  v.channels = buf->channels;
  v.row_stride = buf->row_stride;
  return v;
}

static TfmcuStatus tfmcu_run_layer(const TfmcuStage* s, int32_t i, int32_t j, int32_t l, const void* input,
                                   int8_t* output, int8_t* scratch) {
  const TfmcuLayer* layer = &s->layers[l];
  const TfmcuSpan* rows = tfmcu_span(s, 0, i, l);
  const TfmcuSpan* cols = tfmcu_span(s, 1, j, l);
  const TfmcuBuffer out_buf = tfmcu_buffer(s, i, j, layer->output, input, output, scratch);
  const TfmcuBuffer in_buf = tfmcu_buffer(s, i, j, layer->inputs[0], input, output, scratch);
  TfmcuView out;
  out.data = out_buf.write + tfmcu_element(&out_buf, rows->out_start, cols->out_start);
  out.height = rows->out_stop - rows->out_start;
  out.width = cols->out_stop - cols->out_start;
  out.channels = out_buf.channels;
  out.row_stride = out_buf.row_stride;
  if (layer->type == kTfmcuOpQuantize) {
    TfmcuConstViewF32 fin;
    fin.data = (const float*)in_buf.read + tfmcu_element(&in_buf, rows->in_start[0], cols->in_start[0]);
    fin.height = rows->in_stop[0] - rows->in_start[0];
    fin.width = cols->in_stop[0] - cols->in_start[0];
    fin.channels = in_buf.channels;
    fin.row_stride = in_buf.row_stride;
    return tfmcu_quantize_f32_s8((const TfmcuQuantizeParams*)layer->params, &fin, &out);
  }
  const TfmcuConstView in = tfmcu_read_view(&in_buf, rows, cols, 0);
  const int32_t pad_top = rows->pad_before[0];
  const int32_t pad_left = cols->pad_before[0];

  switch (layer->type) {
    case kTfmcuOpConv2D:
      return tfmcu_conv2d_s8((const TfmcuConvParams*)layer->params, &in, pad_top, pad_left, &out);
    case kTfmcuOpDepthwiseConv2D:
      return tfmcu_depthwise_conv2d_s8((const TfmcuDepthwiseConvParams*)layer->params, &in, pad_top, pad_left,
                                       &out);
    case kTfmcuOpAdd: {
      const TfmcuBuffer in2_buf = tfmcu_buffer(s, i, j, layer->inputs[1], input, output, scratch);
      const TfmcuConstView in2 = tfmcu_read_view(&in2_buf, rows, cols, 1);
      return tfmcu_add_s8((const TfmcuAddParams*)layer->params, &in, &in2, &out);
    }
    case kTfmcuOpPad:
      return tfmcu_pad_s8((const TfmcuPadParams*)layer->params, &in, pad_top, pad_left, &out);
    case kTfmcuOpAveragePool2D:
      return tfmcu_avg_pool2d_s8((const TfmcuPoolParams*)layer->params, &in, pad_top, pad_left, &out);
    case kTfmcuOpMaxPool2D:
      return tfmcu_max_pool2d_s8((const TfmcuPoolParams*)layer->params, &in, pad_top, pad_left, &out);
    default:
      return kTfmcuErrorUnsupportedOp;
  }
}

TfmcuStatus tfmcu_stage_run(const TfmcuStage* stage, const void* input, int8_t* output, void* scratch,
                            size_t scratch_size) {
  const TfmcuStatus valid = tfmcu_stage_check(stage, NULL);
  if (valid != kTfmcuOk) {
    return valid;
  }
  if (input == NULL || output == NULL || (stage->scratch_bytes > 0 && scratch == NULL)) {
    return kTfmcuErrorNullPointer;
  }
  if (scratch_size < (size_t)stage->scratch_bytes) {
    return kTfmcuErrorScratchTooSmall;
  }
  for (int32_t i = 0; i < stage->grid_rows; ++i) {
    for (int32_t j = 0; j < stage->grid_cols; ++j) {
      for (int32_t l = 0; l < stage->num_layers; ++l) {
        const TfmcuStatus status = tfmcu_run_layer(stage, i, j, l, input, output, (int8_t*)scratch);
        if (status != kTfmcuOk) {
          return status;
        }
      }
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
