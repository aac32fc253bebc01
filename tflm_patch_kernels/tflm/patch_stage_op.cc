// TFMCU_PATCH_STAGE as a TFLM kernel: see patch_stage_op.h.
#include "tflm_patch_kernels/tflm/patch_stage_op.h"

#include <stdint.h>
#include <string.h>

#include "flatbuffers/flexbuffers.h"
#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tflm_patch_kernels/patch_stage.h"

namespace tfmcu {
namespace {

constexpr int kSpanWords = 10;  // int32 fields of a TfmcuSpan
constexpr int kTensorWords = 5;  // height, width, channels, dtype, producer
constexpr int kCacheWords = 3;  // int32 fields of a TfmcuCache: tensor, axis, offset
static_assert(sizeof(TfmcuSpan) == kSpanWords * sizeof(int32_t), "TfmcuSpan is read in place from int32 tables");
static_assert(sizeof(TfmcuCache) == kCacheWords * sizeof(int32_t), "TfmcuCache is read in place from int32 tables");
// Far above any real stage; they keep every size computation below inside int32.
constexpr int32_t kMaxTensors = 4096;
constexpr int32_t kMaxLayers = 4096;
constexpr int32_t kMaxGrid = 1024;
constexpr const char* kArrayNames[TFMCU_MAX_PARAM_ARRAYS] = {"filter", "bias", "output_multiplier",
                                                             "output_shift"};

struct OpData {
  TfmcuStage stage;
  TfmcuPreparedStage prepared;
  TfmcuTensor* tensors;   // [num_tensors]
  TfmcuLayer* layers;     // [num_layers]
  uint8_t* params;        // the layers' params structs, each at a pointer-aligned offset
  const uint8_t* options;  // the flexbuffer (in the model), verified in Init
  size_t options_size;
  int scratch_index;
  int32_t streamed;  // 1: the stage input comes from the TfmcuInputProvider in the interpreter's external context
};

size_t AlignUp(size_t n) { return (n + alignof(void*) - 1) / alignof(void*) * alignof(void*); }

#define TFMCU_FAIL(...)                   \
  do {                                    \
    MicroPrintf("TFMCU_PATCH_STAGE: " __VA_ARGS__); \
    return kTfLiteError;                  \
  } while (0)

// An int that fits int32_t (a flexbuffer int or uint).
bool ToInt32(const flexbuffers::Reference& r, int32_t* out) {
  if (!r.IsIntOrUint()) return false;
  if (r.IsUInt()) {
    const uint64_t v = r.AsUInt64();
    if (v > static_cast<uint64_t>(INT32_MAX)) return false;
    *out = static_cast<int32_t>(v);
    return true;
  }
  const int64_t v = r.AsInt64();
  if (v < INT32_MIN || v > INT32_MAX) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

// A list of ints, whichever vector type the writer chose (untyped, typed or fixed-size typed).
class IntList {
 public:
  explicit IntList(const flexbuffers::Reference& r) : ref_(r) {
    if (r.IsUntypedVector()) {
      size_ = r.AsVector().size();
    } else if (r.IsTypedVector()) {
      size_ = r.AsTypedVector().size();
    } else if (r.IsFixedTypedVector()) {
      size_ = r.AsFixedTypedVector().size();
    }
    valid_ = r.IsUntypedVector() || r.IsTypedVector() || r.IsFixedTypedVector();
  }
  bool valid() const { return valid_; }
  size_t size() const { return size_; }
  bool Get(size_t i, int32_t* out) const {
    if (!valid_ || i >= size_) return false;
    if (ref_.IsUntypedVector()) return ToInt32(ref_.AsVector()[i], out);
    if (ref_.IsTypedVector()) return ToInt32(ref_.AsTypedVector()[i], out);
    return ToInt32(ref_.AsFixedTypedVector()[i], out);
  }

 private:
  flexbuffers::Reference ref_;
  size_t size_ = 0;
  bool valid_ = false;
};

bool MapInt(const flexbuffers::Map& m, const char* key, int32_t* out) { return ToInt32(m[key], out); }

// The counts and per-layer params sizes Init needs; checks the structure it relies on.
TfLiteStatus ReadShape(const flexbuffers::Map& root, int32_t* num_tensors, int32_t* num_layers,
                       size_t* params_bytes) {
  int32_t version = 0;
  if (!MapInt(root, "version", &version) || version < kPatchStageOldestFormatVersion ||
      version > kPatchStageFormatVersion) {
    TFMCU_FAIL("options format version %d; this kernel reads versions %d..%d", static_cast<int>(version),
               kPatchStageOldestFormatVersion, kPatchStageFormatVersion);
  }
  if (!root["tensors"].IsUntypedVector()) TFMCU_FAIL("options field 'tensors' is not a list");
  if (!root["layers"].IsUntypedVector()) TFMCU_FAIL("options field 'layers' is not a list");
  const size_t nt = root["tensors"].AsVector().size();
  const size_t nl = root["layers"].AsVector().size();
  if (nt < 2 || nt > static_cast<size_t>(kMaxTensors)) TFMCU_FAIL("%d tensors (2..%d)", static_cast<int>(nt), 
                                                                  static_cast<int>(kMaxTensors));
  if (nl < 1 || nl > static_cast<size_t>(kMaxLayers)) TFMCU_FAIL("%d layers (1..%d)", static_cast<int>(nl),
                                                                 static_cast<int>(kMaxLayers));
  flexbuffers::Vector layers = root["layers"].AsVector();
  size_t bytes = 0;
  for (size_t i = 0; i < nl; ++i) {
    if (!layers[i].IsMap()) TFMCU_FAIL("layer %d is not a map", static_cast<int>(i));
    int32_t type = 0;
    const TfmcuOpInfo* op = MapInt(layers[i].AsMap(), "type", &type) ? tfmcu_op_info(type) : nullptr;
    if (op == nullptr) TFMCU_FAIL("layer %d: unsupported op type %d", static_cast<int>(i), static_cast<int>(type));
    bytes += AlignUp(op->params_size);
  }
  *num_tensors = static_cast<int32_t>(nt);
  *num_layers = static_cast<int32_t>(nl);
  *params_bytes = bytes;
  return kTfLiteOk;
}

void* Init(TfLiteContext* context, const char* buffer, size_t length) {
  const uint8_t* options = reinterpret_cast<const uint8_t*>(buffer);
  if (options == nullptr || length == 0) {
    MicroPrintf("TFMCU_PATCH_STAGE: the op has no custom options");
    return nullptr;
  }
  if (!flexbuffers::VerifyBuffer(options, length)) {
    MicroPrintf("TFMCU_PATCH_STAGE: custom options are not a valid flexbuffer (%d bytes)", static_cast<int>(length));
    return nullptr;
  }
  flexbuffers::Reference root = flexbuffers::GetRoot(options, length);
  if (!root.IsMap()) {
    MicroPrintf("TFMCU_PATCH_STAGE: custom options are not a flexbuffer map");
    return nullptr;
  }
  int32_t num_tensors = 0, num_layers = 0;
  size_t params_bytes = 0;
  if (ReadShape(root.AsMap(), &num_tensors, &num_layers, &params_bytes) != kTfLiteOk) return nullptr;
  const size_t bytes = PatchStagePersistentBytes(num_tensors, num_layers, params_bytes);  // == ...For(options)
  uint8_t* mem = static_cast<uint8_t*>(context->AllocatePersistentBuffer(context, bytes));
  if (mem == nullptr) {
    MicroPrintf("TFMCU_PATCH_STAGE: cannot allocate %d persistent bytes", static_cast<int>(bytes));
    return nullptr;
  }
  memset(mem, 0, bytes);
  OpData* data = reinterpret_cast<OpData*>(mem);
  size_t at = AlignUp(sizeof(OpData));
  data->tensors = reinterpret_cast<TfmcuTensor*>(mem + at);
  at += AlignUp(sizeof(TfmcuTensor) * static_cast<size_t>(num_tensors));
  data->layers = reinterpret_cast<TfmcuLayer*>(mem + at);
  at += AlignUp(sizeof(TfmcuLayer) * static_cast<size_t>(num_layers));
  data->params = mem + at;
  data->stage.num_tensors = num_tensors;
  data->stage.num_layers = num_layers;
  data->options = options;
  data->options_size = length;
  data->scratch_index = -1;
  return data;
}

// A constant INT32 / INT8 input of the node, read in place: its data, checked for type, size and alignment.
TfLiteStatus ConstInput(TfLiteContext* context, TfLiteNode* node, int32_t position, TfLiteType type,
                        int32_t elements, const char* what, int layer, const void** out) {
  if (position < 1 || position >= node->inputs->size) {
    TFMCU_FAIL("layer %d: %s input position %d out of range (1..%d)", layer, what, static_cast<int>(position),
               node->inputs->size - 1);
  }
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* t = micro_context->AllocateTempInputTensor(node, position);
  if (t == nullptr) TFMCU_FAIL("layer %d: %s input %d is missing", layer, what, static_cast<int>(position));
  const bool constant = t->allocation_type == kTfLiteMmapRo && t->data.data != nullptr;
  const TfLiteType got_type = t->type;
  const size_t got_bytes = t->bytes;
  const void* ptr = t->data.data;
  micro_context->DeallocateTempTfLiteTensor(t);
  const size_t size = type == kTfLiteInt8 ? 1 : 4;
  if (!constant) TFMCU_FAIL("layer %d: %s (input %d) is not a constant tensor", layer, what,
                            static_cast<int>(position));
  if (got_type != type) TFMCU_FAIL("layer %d: %s (input %d) has type %s, not %s", layer, what,
                                   static_cast<int>(position), TfLiteTypeGetName(got_type), TfLiteTypeGetName(type));
  if (got_bytes != static_cast<size_t>(elements) * size) {
    TFMCU_FAIL("layer %d: %s (input %d) holds %d bytes, the stage needs %d", layer, what,
               static_cast<int>(position), static_cast<int>(got_bytes), static_cast<int>(elements * size));
  }
  if (reinterpret_cast<uintptr_t>(ptr) % size != 0) {
    TFMCU_FAIL("layer %d: %s (input %d) is not %d-byte aligned in the model", layer, what,
               static_cast<int>(position), static_cast<int>(size));
  }
  *out = ptr;
  return kTfLiteOk;
}

// The node's input 0 / output 0 must be the stage input / output tensor: [1, H, W, C] of the right type, or
// [1, C] for a 1 x 1 one (a fully connected layer run as the 1x1 convolution it computes).
TfLiteStatus CheckIo(const TfLiteTensor* t, const TfmcuTensor& want, const char* what) {
  const TfLiteType type = want.dtype == kTfmcuFloat32 ? kTfLiteFloat32 : kTfLiteInt8;
  if (t == nullptr) TFMCU_FAIL("the op has no %s tensor", what);
  if (t->type != type) TFMCU_FAIL("%s tensor has type %s, the stage expects %s", what, TfLiteTypeGetName(t->type),
                                  TfLiteTypeGetName(type));
  const TfLiteIntArray* d = t->dims;
  const bool flat = d != nullptr && d->size == 2 && d->data[0] == 1 && want.height == 1 && want.width == 1 &&
                    d->data[1] == want.channels;
  if (!flat && (d == nullptr || d->size != 4 || d->data[0] != 1 || d->data[1] != want.height ||
                d->data[2] != want.width || d->data[3] != want.channels)) {
    TFMCU_FAIL("%s tensor shape is not [1, %d, %d, %d]", what, static_cast<int>(want.height),
               static_cast<int>(want.width), static_cast<int>(want.channels));
  }
  return kTfLiteOk;
}

TfLiteStatus ReadTensors(const flexbuffers::Map& root, OpData* data) {
  flexbuffers::Vector tensors = root["tensors"].AsVector();
  for (int32_t t = 0; t < data->stage.num_tensors; ++t) {
    IntList row(tensors[t]);
    int32_t v[kTensorWords];
    if (!row.valid() || row.size() != kTensorWords) TFMCU_FAIL("tensor %d is not a list of %d ints", t, kTensorWords);
    for (int k = 0; k < kTensorWords; ++k) {
      if (!row.Get(k, &v[k])) TFMCU_FAIL("tensor %d field %d is not an int32", t, k);
    }
    data->tensors[t] = TfmcuTensor{v[0], v[1], v[2], v[3], v[4]};
  }
  return kTfLiteOk;
}

TfLiteStatus BindLayer(TfLiteContext* context, TfLiteNode* node, const flexbuffers::Map& layer,
                       const IntList& layer_inputs, int32_t layer_output, int i, uint8_t* params, OpData* data) {
  int32_t type = 0;
  MapInt(layer, "type", &type);  // checked in Init
  const TfmcuOpInfo* op = tfmcu_op_info(type);
  if (op == nullptr) TFMCU_FAIL("layer %d: unsupported op type %d", i, static_cast<int>(type));
  TfmcuLayer& l = data->layers[i];
  l.type = type;
  l.params = params;
  l.output = layer_output;
  l.num_inputs = static_cast<int32_t>(layer_inputs.size());
  if (l.num_inputs != op->num_inputs) TFMCU_FAIL("layer %d has %d inputs, its op takes %d", i,
                                                 static_cast<int>(l.num_inputs), static_cast<int>(op->num_inputs));
  int32_t in_channels[TFMCU_MAX_LAYER_INPUTS] = {0, 0};
  for (int k = 0; k < TFMCU_MAX_LAYER_INPUTS; ++k) {
    l.inputs[k] = -1;
    if (k < l.num_inputs) {
      if (!layer_inputs.Get(k, &l.inputs[k]) || l.inputs[k] < 0 || l.inputs[k] >= data->stage.num_tensors) {
        TFMCU_FAIL("layer %d input %d is not a tensor id", i, k);
      }
      in_channels[k] = data->tensors[l.inputs[k]].channels;
    }
  }
  if (l.output < 0 || l.output >= data->stage.num_tensors) TFMCU_FAIL("layer %d output is not a tensor id", i);
  const int32_t out_channels = data->tensors[l.output].channels;

  // Scalar params.
  IntList words(layer["words"]);
  int32_t w[32];
  if (!words.valid() || words.size() != static_cast<size_t>(op->num_words) || op->num_words > 32) {
    TFMCU_FAIL("layer %d: 'words' must hold %d ints", i, static_cast<int>(op->num_words));
  }
  for (int32_t k = 0; k < op->num_words; ++k) {
    if (!words.Get(k, &w[k])) TFMCU_FAIL("layer %d: word %d is not an int32", i, static_cast<int>(k));
  }
  // Arrays: input positions by name; sizes checked after the params are known.
  const void* arrays[TFMCU_MAX_PARAM_ARRAYS] = {nullptr, nullptr, nullptr, nullptr};
  int32_t positions[TFMCU_MAX_PARAM_ARRAYS] = {-1, -1, -1, -1};
  flexbuffers::Reference arrays_ref = layer["arrays"];
  if (!arrays_ref.IsMap()) TFMCU_FAIL("layer %d: 'arrays' is not a map", i);
  flexbuffers::Map array_map = arrays_ref.AsMap();
  if (array_map.size() > static_cast<size_t>(op->num_arrays)) TFMCU_FAIL("layer %d: too many arrays", i);
  for (int32_t k = 0; k < op->num_arrays; ++k) {
    flexbuffers::Reference r = array_map[kArrayNames[k]];
    if (!r.IsNull() && !ToInt32(r, &positions[k])) TFMCU_FAIL("layer %d: array '%s' position", i, kArrayNames[k]);
  }
  // Bind with placeholder pointers to check the params (the check needs the mandatory arrays non-NULL).
  static const int32_t kPlaceholder = 0;
  for (int32_t k = 0; k < op->num_arrays; ++k) arrays[k] = positions[k] >= 0 ? &kPlaceholder : nullptr;
  if (tfmcu_op_bind(type, params, op->params_size, w, op->num_words, arrays, op->num_arrays) != kTfmcuOk ||
      op->check(params, in_channels, out_channels) != kTfmcuOk) {
    TFMCU_FAIL("layer %d: invalid params for op type %d", i, static_cast<int>(type));
  }
  if (op->num_arrays > 0) {
    int32_t elements[TFMCU_MAX_PARAM_ARRAYS] = {0, 0, 0, 0};
    op->array_sizes(params, in_channels, out_channels, elements);
    for (int32_t k = 0; k < op->num_arrays; ++k) {
      if (positions[k] < 0) continue;
      TF_LITE_ENSURE_OK(context, ConstInput(context, node, positions[k], k == 0 ? kTfLiteInt8 : kTfLiteInt32,
                                            elements[k], kArrayNames[k], i, &arrays[k]));
    }
    if (arrays[3] != nullptr && !tfmcu_shifts_valid(static_cast<const int32_t*>(arrays[3]), elements[3])) {
      TFMCU_FAIL("layer %d: output_shift values must be in -31..31", i);
    }
    if (tfmcu_op_bind(type, params, op->params_size, w, op->num_words, arrays, op->num_arrays) != kTfmcuOk) {
      TFMCU_FAIL("layer %d: cannot bind the arrays", i);
    }
  }
  return kTfLiteOk;
}

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  OpData* data = static_cast<OpData*>(node->user_data);
  if (data == nullptr) TFMCU_FAIL("Init failed (see the message above)");
  flexbuffers::Map root = flexbuffers::GetRoot(data->options, data->options_size).AsMap();
  TfmcuStage& s = data->stage;
  TF_LITE_ENSURE_OK(context, ReadTensors(root, data));
  int32_t scratch = 0;
  IntList grid(root["grid"]);
  if (!MapInt(root, "input_tensor", &s.input_tensor) || !MapInt(root, "output_tensor", &s.output_tensor) ||
      !MapInt(root, "scratch_bytes", &scratch) || scratch < 0 || !grid.valid() || grid.size() != 2 ||
      !grid.Get(0, &s.grid_rows) || !grid.Get(1, &s.grid_cols)) {
    TFMCU_FAIL("options need ints input_tensor, output_tensor, scratch_bytes >= 0 and grid [rows, cols]");
  }
  if (s.grid_rows < 1 || s.grid_cols < 1 || s.grid_rows > kMaxGrid || s.grid_cols > kMaxGrid) {
    TFMCU_FAIL("grid %dx%d (1..%d each)", static_cast<int>(s.grid_rows), static_cast<int>(s.grid_cols), kMaxGrid);
  }
  if (s.input_tensor < 0 || s.input_tensor >= s.num_tensors || s.output_tensor < 0 ||
      s.output_tensor >= s.num_tensors) {
    TFMCU_FAIL("input_tensor / output_tensor out of range (0..%d)", static_cast<int>(s.num_tensors - 1));
  }
  s.scratch_bytes = static_cast<uint32_t>(scratch);
  s.tensors = data->tensors;
  s.layers = data->layers;

  IntList outputs(root["layer_outputs"]);
  flexbuffers::Reference inputs_ref = root["layer_inputs"];
  if (!outputs.valid() || outputs.size() != static_cast<size_t>(s.num_layers) || !inputs_ref.IsUntypedVector() ||
      inputs_ref.AsVector().size() != static_cast<size_t>(s.num_layers)) {
    TFMCU_FAIL("layer_inputs / layer_outputs must hold one entry per layer (%d)", static_cast<int>(s.num_layers));
  }
  flexbuffers::Vector layers = root["layers"].AsVector();
  flexbuffers::Vector layer_inputs = inputs_ref.AsVector();
  uint8_t* params = data->params;
  for (int32_t i = 0; i < s.num_layers; ++i) {
    int32_t out = -1;
    IntList ins(layer_inputs[i]);
    if (!outputs.Get(i, &out) || !ins.valid()) TFMCU_FAIL("layer %d: layer_inputs / layer_outputs", i);
    if (!layers[i].IsMap()) TFMCU_FAIL("layer %d is not a map", i);
    TF_LITE_ENSURE_OK(context, BindLayer(context, node, layers[i].AsMap(), ins, out, i, params, data));
    params += AlignUp(tfmcu_op_info(data->layers[i].type)->params_size);
  }

  // The span and buffer-offset tables: INT32 constant inputs, read in place.
  const int32_t n_layers = s.num_layers;
  struct {
    const char* name;
    int32_t elements;
    const void** out;
  } tables[3];
  const void* row_spans = nullptr;
  const void* col_spans = nullptr;
  const void* offsets = nullptr;
  tables[0] = {"row_spans", s.grid_rows * n_layers * kSpanWords, &row_spans};
  tables[1] = {"col_spans", s.grid_cols * n_layers * kSpanWords, &col_spans};
  tables[2] = {"buffer_offsets", s.grid_rows * s.grid_cols * s.num_tensors, &offsets};
  for (auto& t : tables) {
    int32_t position = -1;
    if (!MapInt(root, t.name, &position)) TFMCU_FAIL("options field '%s' is not an input position", t.name);
    TF_LITE_ENSURE_OK(context, ConstInput(context, node, position, kTfLiteInt32, t.elements, t.name, -1, t.out));
  }
  s.row_spans = static_cast<const TfmcuSpan*>(row_spans);
  s.col_spans = static_cast<const TfmcuSpan*>(col_spans);
  s.buffer_offsets = static_cast<const int32_t*>(offsets);

  // Halo caches (format 3): the held tables and the caches (3 int32 each), INT32 constant inputs read in place.
  int32_t version = 0;
  MapInt(root, "version", &version);  // checked in Init
  s.row_held = nullptr;
  s.col_held = nullptr;
  s.num_caches = 0;
  s.caches = nullptr;
  if (version >= 3 && !root["num_caches"].IsNull()) {
    if (!MapInt(root, "num_caches", &s.num_caches) || s.num_caches < 0 || s.num_caches > 2 * s.num_tensors) {
      TFMCU_FAIL("num_caches must be in 0..%d", static_cast<int>(2 * s.num_tensors));
    }
  }
  if (s.num_caches > 0) {
    const void* row_held = nullptr;
    const void* col_held = nullptr;
    const void* caches = nullptr;
    tables[0] = {"row_held", s.grid_rows * n_layers * 2, &row_held};
    tables[1] = {"col_held", s.grid_cols * n_layers * 2, &col_held};
    tables[2] = {"caches", s.num_caches * kCacheWords, &caches};
    for (auto& t : tables) {
      int32_t position = -1;
      if (!MapInt(root, t.name, &position)) TFMCU_FAIL("options field '%s' is not an input position", t.name);
      TF_LITE_ENSURE_OK(context, ConstInput(context, node, position, kTfLiteInt32, t.elements, t.name, -1, t.out));
    }
    s.row_held = static_cast<const int32_t*>(row_held);
    s.col_held = static_cast<const int32_t*>(col_held);
    s.caches = static_cast<const TfmcuCache*>(caches);
  }

  int32_t failed_layer = -1;
  const TfmcuStatus status = tfmcu_stage_prepare(&s, &data->prepared, &failed_layer);
  if (status != kTfmcuOk) {
    TFMCU_FAIL("invalid stage description (status %d, layer %d)", static_cast<int>(status),
               static_cast<int>(failed_layer));
  }

  // Streamed input (format 3): input 0 is a one-element int8 placeholder; the rows come from the provider.
  data->streamed = 0;
  int32_t window = 0;
  if (version >= 3 && !root["streamed_input"].IsNull()) {
    if (!MapInt(root, "streamed_input", &data->streamed) || (data->streamed != 0 && data->streamed != 1)) {
      TFMCU_FAIL("streamed_input must be 0 or 1");
    }
  }
  if (data->streamed) {
    if (!MapInt(root, "input_window_bytes", &window) || window < 0 ||
        static_cast<uint32_t>(window) != data->prepared.input_window_bytes || window == 0) {
      TFMCU_FAIL("streamed input: input_window_bytes %d, the stage's window is %d bytes (0: it cannot stream)",
                 static_cast<int>(window), static_cast<int>(data->prepared.input_window_bytes));
    }
  }

  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  if (node->inputs->size < 1 || node->outputs->size != 1) TFMCU_FAIL("the op needs inputs and one output");
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, 0);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, 0);
  TfLiteStatus io = kTfLiteOk;
  if (!data->streamed) {
    io = CheckIo(input, s.tensors[s.input_tensor], "input");
  } else if (input == nullptr || input->type != kTfLiteInt8 || input->bytes != 1) {
    MicroPrintf("TFMCU_PATCH_STAGE: streamed input: input 0 must be the one-element int8 placeholder");
    io = kTfLiteError;
  }
  if (io == kTfLiteOk) io = CheckIo(output, s.tensors[s.output_tensor], "output");
  if (input != nullptr) micro_context->DeallocateTempTfLiteTensor(input);
  if (output != nullptr) micro_context->DeallocateTempTfLiteTensor(output);
  TF_LITE_ENSURE_OK(context, io);
  const size_t bytes = data->streamed ? data->prepared.streamed_scratch_bytes : data->prepared.scratch_bytes;
  data->scratch_index = -1;
  if (bytes == 0) return kTfLiteOk;  // no intermediate tensor (one layer): no scratch buffer at all
  return micro_context->RequestScratchBufferInArena(bytes, &data->scratch_index);
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  OpData* data = static_cast<OpData*>(node->user_data);
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  void* scratch = data->scratch_index >= 0 ? context->GetScratchBuffer(context, data->scratch_index) : nullptr;
  TfmcuStatus status;
  if (data->streamed) {
    const auto* provider =
        static_cast<const TfmcuInputProvider*>(tflite::GetMicroContext(context)->external_context());
    if (provider == nullptr) {
      TFMCU_FAIL("streamed input: no TfmcuInputProvider registered (MicroInterpreter::SetMicroExternalContext)");
    }
    status = tfmcu_stage_run_streamed(&data->prepared, provider, output->data.int8, static_cast<uint8_t*>(scratch),
                                      data->prepared.streamed_scratch_bytes);
  } else {
    status = tfmcu_stage_run(&data->prepared, input->data.data, output->data.int8, static_cast<uint8_t*>(scratch),
                             data->prepared.scratch_bytes);
  }
  if (status != kTfmcuOk) TFMCU_FAIL("stage run failed (status %d)", static_cast<int>(status));
  return kTfLiteOk;
}

}  // namespace

size_t PatchStagePersistentBytes(int num_tensors, int num_layers, size_t params_bytes) {
  return AlignUp(sizeof(OpData)) + AlignUp(sizeof(TfmcuTensor) * static_cast<size_t>(num_tensors)) +
         AlignUp(sizeof(TfmcuLayer) * static_cast<size_t>(num_layers)) + params_bytes;
}

size_t PatchStagePersistentBytesFor(const uint8_t* options, size_t length) {
  if (options == nullptr || length == 0 || !flexbuffers::VerifyBuffer(options, length)) return 0;
  flexbuffers::Reference root = flexbuffers::GetRoot(options, length);
  int32_t num_tensors = 0, num_layers = 0;
  size_t params_bytes = 0;
  if (!root.IsMap() || ReadShape(root.AsMap(), &num_tensors, &num_layers, &params_bytes) != kTfLiteOk) return 0;
  return PatchStagePersistentBytes(num_tensors, num_layers, params_bytes);
}

TFLMRegistration* Register_TFMCU_PATCH_STAGE() {
  static TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tfmcu
