// The TFMCU_PATCH_STAGE custom options parser: see patch_stage_options.h.
#include "tflm_patch_kernels/tflm/patch_stage_options.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "flatbuffers/flexbuffers.h"
#include "tensorflow/lite/micro/micro_log.h"

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
constexpr int32_t kMaxWords = 32;
constexpr const char* kArrayNames[TFMCU_MAX_PARAM_ARRAYS] = {"filter", "bias", "output_multiplier",
                                                             "output_shift"};

// Stores the message in `error` and returns false.
bool Fail(PatchStageOptionsError* error, const char* format, ...) {
  error->message[0] = '\0';
  va_list args;
  va_start(args, format);
  MicroVsnprintf(error->message, sizeof(error->message), format, args);
  va_end(args);
  return false;
}

#define TFMCU_OPTIONS_FAIL(...) return Fail(error, __VA_ARGS__)

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

// The root map of a verified flexbuffer.
bool Root(const uint8_t* buffer, size_t length, flexbuffers::Map* root, PatchStageOptionsError* error) {
  if (buffer == nullptr || length == 0) TFMCU_OPTIONS_FAIL("the op has no custom options");
  if (!flexbuffers::VerifyBuffer(buffer, length)) {
    TFMCU_OPTIONS_FAIL("custom options are not a valid flexbuffer (%d bytes)", static_cast<int>(length));
  }
  flexbuffers::Reference r = flexbuffers::GetRoot(buffer, length);
  if (!r.IsMap()) TFMCU_OPTIONS_FAIL("custom options are not a flexbuffer map");
  *root = r.AsMap();
  return true;
}

bool ReadSizes(const flexbuffers::Map& root, PatchStageSizes* sizes, int32_t* version, PatchStageOptionsError* error) {
  if (!MapInt(root, "version", version) || *version < kPatchStageOldestFormatVersion ||
      *version > kPatchStageFormatVersion) {
    TFMCU_OPTIONS_FAIL("options format version %d; this kernel reads versions %d..%d", static_cast<int>(*version),
                       kPatchStageOldestFormatVersion, kPatchStageFormatVersion);
  }
  if (!root["tensors"].IsUntypedVector()) TFMCU_OPTIONS_FAIL("options field 'tensors' is not a list");
  if (!root["layers"].IsUntypedVector()) TFMCU_OPTIONS_FAIL("options field 'layers' is not a list");
  const size_t nt = root["tensors"].AsVector().size();
  const size_t nl = root["layers"].AsVector().size();
  if (nt < 2 || nt > static_cast<size_t>(kMaxTensors)) {
    TFMCU_OPTIONS_FAIL("%d tensors (2..%d)", static_cast<int>(nt), static_cast<int>(kMaxTensors));
  }
  if (nl < 1 || nl > static_cast<size_t>(kMaxLayers)) {
    TFMCU_OPTIONS_FAIL("%d layers (1..%d)", static_cast<int>(nl), static_cast<int>(kMaxLayers));
  }
  flexbuffers::Vector layers = root["layers"].AsVector();
  size_t bytes = 0;
  for (size_t i = 0; i < nl; ++i) {
    if (!layers[i].IsMap()) TFMCU_OPTIONS_FAIL("layer %d is not a map", static_cast<int>(i));
    int32_t type = 0;
    const TfmcuOpInfo* op = MapInt(layers[i].AsMap(), "type", &type) ? tfmcu_op_info(type) : nullptr;
    if (op == nullptr) {
      TFMCU_OPTIONS_FAIL("layer %d: unsupported op type %d", static_cast<int>(i), static_cast<int>(type));
    }
    bytes += AlignToPointer(op->params_size);
  }
  sizes->num_tensors = static_cast<int32_t>(nt);
  sizes->num_layers = static_cast<int32_t>(nl);
  sizes->params_bytes = bytes;
  return true;
}

bool ReadTensors(const flexbuffers::Map& root, const TfmcuStage& s, TfmcuTensor* tensors,
                 PatchStageOptionsError* error) {
  flexbuffers::Vector list = root["tensors"].AsVector();
  for (int32_t t = 0; t < s.num_tensors; ++t) {
    IntList row(list[t]);
    int32_t v[kTensorWords];
    if (!row.valid() || row.size() != kTensorWords) {
      TFMCU_OPTIONS_FAIL("tensor %d is not a list of %d ints", static_cast<int>(t), kTensorWords);
    }
    for (int k = 0; k < kTensorWords; ++k) {
      if (!row.Get(k, &v[k])) TFMCU_OPTIONS_FAIL("tensor %d field %d is not an int32", static_cast<int>(t), k);
    }
    tensors[t] = TfmcuTensor{v[0], v[1], v[2], v[3], v[4]};
  }
  return true;
}

// The array positions of one layer (the "arrays" map: name -> input position) in op table order.
bool ReadArrayPositions(const flexbuffers::Map& layer, const TfmcuOpInfo& op, int i, PatchStageInput* arrays,
                        PatchStageOptionsError* error) {
  for (int32_t k = 0; k < TFMCU_MAX_PARAM_ARRAYS; ++k) arrays[k] = PatchStageInput{kArrayNames[k], -1, 0};
  flexbuffers::Reference arrays_ref = layer["arrays"];
  if (!arrays_ref.IsMap()) TFMCU_OPTIONS_FAIL("layer %d: 'arrays' is not a map", i);
  flexbuffers::Map array_map = arrays_ref.AsMap();
  if (array_map.size() > static_cast<size_t>(op.num_arrays)) TFMCU_OPTIONS_FAIL("layer %d: too many arrays", i);
  for (int32_t k = 0; k < op.num_arrays; ++k) {
    flexbuffers::Reference r = array_map[kArrayNames[k]];
    if (!r.IsNull() && !ToInt32(r, &arrays[k].position)) {
      TFMCU_OPTIONS_FAIL("layer %d: array '%s' position", i, kArrayNames[k]);
    }
  }
  return true;
}

// Layer i: its tensors, scalar words and array positions, and its params checked with placeholder arrays (the
// check needs the mandatory ones non-NULL); the params keep the words, their arrays NULL.
bool ReadLayer(const flexbuffers::Map& layer, const IntList& layer_inputs, int32_t layer_output, int i,
               const TfmcuStage& s, TfmcuLayer& l, uint8_t* params, PatchStageOptionsError* error) {
  int32_t type = 0;
  MapInt(layer, "type", &type);  // checked by ReadSizes
  const TfmcuOpInfo* op = tfmcu_op_info(type);
  l.type = type;
  l.params = params;
  l.output = layer_output;
  l.num_inputs = static_cast<int32_t>(layer_inputs.size());
  if (l.num_inputs != op->num_inputs) {
    TFMCU_OPTIONS_FAIL("layer %d has %d inputs, its op takes %d", i, static_cast<int>(l.num_inputs),
                       static_cast<int>(op->num_inputs));
  }
  int32_t in_channels[TFMCU_MAX_LAYER_INPUTS] = {0, 0};
  for (int k = 0; k < TFMCU_MAX_LAYER_INPUTS; ++k) {
    l.inputs[k] = -1;
    if (k < l.num_inputs) {
      if (!layer_inputs.Get(k, &l.inputs[k]) || l.inputs[k] < 0 || l.inputs[k] >= s.num_tensors) {
        TFMCU_OPTIONS_FAIL("layer %d input %d is not a tensor id", i, k);
      }
      in_channels[k] = s.tensors[l.inputs[k]].channels;
    }
  }
  if (l.output < 0 || l.output >= s.num_tensors) TFMCU_OPTIONS_FAIL("layer %d output is not a tensor id", i);
  const int32_t out_channels = s.tensors[l.output].channels;

  IntList words(layer["words"]);
  int32_t w[kMaxWords];
  if (!words.valid() || words.size() != static_cast<size_t>(op->num_words) || op->num_words > kMaxWords) {
    TFMCU_OPTIONS_FAIL("layer %d: 'words' must hold %d ints", i, static_cast<int>(op->num_words));
  }
  for (int32_t k = 0; k < op->num_words; ++k) {
    if (!words.Get(k, &w[k])) TFMCU_OPTIONS_FAIL("layer %d: word %d is not an int32", i, static_cast<int>(k));
  }
  PatchStageInput positions[TFMCU_MAX_PARAM_ARRAYS];
  if (!ReadArrayPositions(layer, *op, i, positions, error)) return false;
  static const int32_t kPlaceholder = 0;
  const void* arrays[TFMCU_MAX_PARAM_ARRAYS] = {nullptr, nullptr, nullptr, nullptr};
  for (int32_t k = 0; k < op->num_arrays; ++k) arrays[k] = positions[k].position >= 0 ? &kPlaceholder : nullptr;
  if (tfmcu_op_bind(type, params, op->params_size, w, op->num_words, arrays, op->num_arrays) != kTfmcuOk ||
      op->check(params, in_channels, out_channels) != kTfmcuOk) {
    TFMCU_OPTIONS_FAIL("layer %d: invalid params for op type %d", i, static_cast<int>(type));
  }
  const void* unbound[TFMCU_MAX_PARAM_ARRAYS] = {nullptr, nullptr, nullptr, nullptr};
  tfmcu_op_bind(type, params, op->params_size, w, op->num_words, unbound, op->num_arrays);
  return true;
}

bool ReadLayers(const flexbuffers::Map& root, const TfmcuStage& s, const PatchStageStorage& storage,
                PatchStageOptionsError* error) {
  IntList outputs(root["layer_outputs"]);
  flexbuffers::Reference inputs_ref = root["layer_inputs"];
  if (!outputs.valid() || outputs.size() != static_cast<size_t>(s.num_layers) || !inputs_ref.IsUntypedVector() ||
      inputs_ref.AsVector().size() != static_cast<size_t>(s.num_layers)) {
    TFMCU_OPTIONS_FAIL("layer_inputs / layer_outputs must hold one entry per layer (%d)",
                       static_cast<int>(s.num_layers));
  }
  flexbuffers::Vector layers = root["layers"].AsVector();
  flexbuffers::Vector layer_inputs = inputs_ref.AsVector();
  uint8_t* params = storage.params;
  for (int32_t i = 0; i < s.num_layers; ++i) {
    int32_t out = -1;
    IntList ins(layer_inputs[i]);
    if (!outputs.Get(i, &out) || !ins.valid()) TFMCU_OPTIONS_FAIL("layer %d: layer_inputs / layer_outputs", i);
    if (!ReadLayer(layers[i].AsMap(), ins, out, i, s, storage.layers[i], params, error)) return false;
    params += AlignToPointer(tfmcu_op_info(storage.layers[i].type)->params_size);
  }
  return true;
}

// The tables (input positions and elements; the halo tables only for a stage with caches) and the streamed window.
bool ReadTables(const flexbuffers::Map& root, int32_t version, const TfmcuStage& s, PatchStageInput* tables,
                int32_t* streamed_input, int32_t* input_window_bytes, PatchStageOptionsError* error) {
  const int32_t n_layers = s.num_layers;
  struct {
    const char* name;
    int32_t elements;
    PatchStageInput* out;
  } const rows[kNumPatchStageTables] = {
      {"row_spans", s.grid_rows * n_layers * kSpanWords, &tables[kRowSpansTable]},
      {"col_spans", s.grid_cols * n_layers * kSpanWords, &tables[kColSpansTable]},
      {"buffer_offsets", s.grid_rows * s.grid_cols * s.num_tensors, &tables[kBufferOffsetsTable]},
      {"row_held", s.grid_rows * n_layers * 2, &tables[kRowHeldTable]},
      {"col_held", s.grid_cols * n_layers * 2, &tables[kColHeldTable]},
      {"caches", s.num_caches * kCacheWords, &tables[kCachesTable]},
  };
  for (int k = 0; k < kNumPatchStageTables; ++k) {
    *rows[k].out = PatchStageInput{rows[k].name, -1, rows[k].elements};
    if (k >= kRowHeldTable && s.num_caches == 0) continue;
    if (!MapInt(root, rows[k].name, &rows[k].out->position)) {
      TFMCU_OPTIONS_FAIL("options field '%s' is not an input position", rows[k].name);
    }
  }
  // Streamed input (format 3): input 0 is a one-element placeholder; the rows come from the provider.
  *streamed_input = 0;
  *input_window_bytes = 0;
  if (version >= 3 && !root["streamed_input"].IsNull()) {
    if (!MapInt(root, "streamed_input", streamed_input) || (*streamed_input != 0 && *streamed_input != 1)) {
      TFMCU_OPTIONS_FAIL("streamed_input must be 0 or 1");
    }
  }
  if (*streamed_input) MapInt(root, "input_window_bytes", input_window_bytes);  // checked against the stage's
  return true;
}

}  // namespace

size_t AlignToPointer(size_t n) { return (n + alignof(void*) - 1) / alignof(void*) * alignof(void*); }

bool ReadPatchStageSizes(const uint8_t* buffer, size_t length, PatchStageSizes* sizes, PatchStageOptionsError* error) {
  flexbuffers::Map root = flexbuffers::Map::EmptyMap();
  int32_t version = 0;
  return Root(buffer, length, &root, error) && ReadSizes(root, sizes, &version, error);
}

bool ParsePatchStageOptions(const uint8_t* buffer, size_t length, const PatchStageStorage& storage,
                            PatchStageOptions* options, PatchStageOptionsError* error) {
  flexbuffers::Map root = flexbuffers::Map::EmptyMap();
  PatchStageSizes sizes;
  if (!Root(buffer, length, &root, error) || !ReadSizes(root, &sizes, &options->version, error)) return false;
  TfmcuStage& s = options->stage;
  s = TfmcuStage{};
  s.num_tensors = sizes.num_tensors;
  s.num_layers = sizes.num_layers;
  s.tensors = storage.tensors;
  s.layers = storage.layers;
  if (!ReadTensors(root, s, storage.tensors, error)) return false;
  int32_t scratch = 0;
  IntList grid(root["grid"]);
  if (!MapInt(root, "input_tensor", &s.input_tensor) || !MapInt(root, "output_tensor", &s.output_tensor) ||
      !MapInt(root, "scratch_bytes", &scratch) || scratch < 0 || !grid.valid() || grid.size() != 2 ||
      !grid.Get(0, &s.grid_rows) || !grid.Get(1, &s.grid_cols)) {
    TFMCU_OPTIONS_FAIL("options need ints input_tensor, output_tensor, scratch_bytes >= 0 and grid [rows, cols]");
  }
  if (s.grid_rows < 1 || s.grid_cols < 1 || s.grid_rows > kMaxGrid || s.grid_cols > kMaxGrid) {
    TFMCU_OPTIONS_FAIL("grid %dx%d (1..%d each)", static_cast<int>(s.grid_rows), static_cast<int>(s.grid_cols),
                       static_cast<int>(kMaxGrid));
  }
  if (s.input_tensor < 0 || s.input_tensor >= s.num_tensors || s.output_tensor < 0 ||
      s.output_tensor >= s.num_tensors) {
    TFMCU_OPTIONS_FAIL("input_tensor / output_tensor out of range (0..%d)", static_cast<int>(s.num_tensors - 1));
  }
  s.scratch_bytes = static_cast<uint32_t>(scratch);
  if (!ReadLayers(root, s, storage, error)) return false;
  // Halo caches (format 3): their count here, the held tables and the caches are tables (inputs).
  if (options->version >= 3 && !root["num_caches"].IsNull()) {
    if (!MapInt(root, "num_caches", &s.num_caches) || s.num_caches < 0 || s.num_caches > 2 * s.num_tensors) {
      TFMCU_OPTIONS_FAIL("num_caches must be in 0..%d", static_cast<int>(2 * s.num_tensors));
    }
  }
  return ReadTables(root, options->version, s, options->tables, &options->streamed_input,
                    &options->input_window_bytes, error);
}

void ReadPatchStageArrays(const uint8_t* buffer, size_t length, int32_t layer,
                          PatchStageInput arrays[TFMCU_MAX_PARAM_ARRAYS]) {
  flexbuffers::Map l = flexbuffers::GetRoot(buffer, length).AsMap()["layers"].AsVector()[layer].AsMap();
  int32_t type = 0;
  MapInt(l, "type", &type);
  PatchStageOptionsError error;
  ReadArrayPositions(l, *tfmcu_op_info(type), layer, arrays, &error);  // accepted by ParsePatchStageOptions
}

void ReadPatchStageTables(const uint8_t* buffer, size_t length, const TfmcuStage& stage,
                          PatchStageInput tables[kNumPatchStageTables], int32_t* input_window_bytes) {
  flexbuffers::Map root = flexbuffers::GetRoot(buffer, length).AsMap();
  int32_t version = 0, streamed = 0;
  MapInt(root, "version", &version);
  PatchStageOptionsError error;
  ReadTables(root, version, stage, tables, &streamed, input_window_bytes, &error);  // accepted before
}

}  // namespace tfmcu
