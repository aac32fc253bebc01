// Runs a whole .tflite model (builtin ops only, or custom mode with TFMCU_PATCH_STAGE) in TFLM on the host: TFLM
// built from source with its reference kernels, plus our kernel, plus TFLM's own custom op
// TFLite_Detection_PostProcess (a detector's tail, tfmcu/tflite/detection_postprocess.py).
//
//   tfmcu_tflm_run MODEL.tflite OUT_DIR INPUT0.npy [INPUT1.npy ...] [--arena_bytes=N] [--stream_input=IMAGES.npy]
//
// --stream_input: for a model whose TFMCU_PATCH_STAGE streams its input (its model input is a one-element
// placeholder), IMAGES.npy ([samples, H, W, C]) is read through a TfmcuInputProvider registered as the
// interpreter's external context, row by row as the kernel asks; report.json counts the rows it read
// (streamed_rows_read, per sample) and the provider checks the contract (increasing rows, each at most once).
//
// Input k is a .npy array of shape [samples, <model input k shape without its batch of 1>] (or exactly the input's
// shape for one sample) with the input's dtype. For every sample the model runs once; output j of all samples is
// written to OUT_DIR/output_<j>.npy ([samples, ...]); OUT_DIR/report.json holds arena_used_bytes, the arena's
// head (non-persistent) and tail (persistent) bytes and the RecordingMicroAllocator breakdown. Errors: one line on
// stderr (TFLM's own messages before it), exit status 2 for bad input, 1 for a failed run.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/micro/recording_micro_allocator.h"
#include "tensorflow/lite/micro/recording_micro_interpreter.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "tflm_patch_kernels/patch_stage.h"
#include "tflm_patch_kernels/tflm/patch_stage_op.h"

namespace {

constexpr size_t kDefaultArenaBytes = 64u << 20;
constexpr int kMaxOps = 64;  // RESOLVER_METHODS (tfmcu/firmware/sources.py) + TFMCU_PATCH_STAGE + detection

using Resolver = tflite::MicroMutableOpResolver<kMaxOps>;

[[noreturn]] void Fail(int code, const std::string& message) {
  fprintf(stderr, "tfmcu_tflm_run: %s\n", message.c_str());
  exit(code);
}

bool ReadFile(const std::string& path, std::vector<uint8_t>* out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  uint8_t chunk[1 << 16];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) out->insert(out->end(), chunk, chunk + n);
  const bool ok = ferror(f) == 0;
  fclose(f);
  return ok;
}

const char* NpyDescr(TfLiteType type) {
  switch (type) {
    case kTfLiteInt8: return "|i1";
    case kTfLiteUInt8: return "|u1";
    case kTfLiteInt16: return "<i2";
    case kTfLiteInt32: return "<i4";
    case kTfLiteFloat32: return "<f4";
    default: return nullptr;
  }
}

struct Npy {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// A .npy file (format 1.0 / 2.0, C order, little-endian); false with a reason for anything else.
bool ReadNpy(const std::string& path, Npy* out, std::string* why) {
  std::vector<uint8_t> bytes;
  if (!ReadFile(path, &bytes)) return *why = "cannot read the file", false;
  if (bytes.size() < 10 || memcmp(bytes.data(), "\x93NUMPY", 6) != 0) return *why = "not a .npy file", false;
  const int major = bytes[6];
  size_t header_len, start;
  if (major == 1) {
    header_len = bytes[8] | (bytes[9] << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return *why = "truncated header", false;
    header_len = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (static_cast<size_t>(bytes[11]) << 24);
    start = 12;
  } else {
    return *why = "unsupported .npy version", false;
  }
  if (start + header_len > bytes.size()) return *why = "truncated header", false;
  const std::string header(reinterpret_cast<const char*>(bytes.data() + start), header_len);
  auto field = [&](const char* key) -> std::string {
    const size_t k = header.find(key);
    if (k == std::string::npos) return "";
    size_t v = header.find(':', k);
    return v == std::string::npos ? "" : header.substr(v + 1);
  };
  std::string descr = field("'descr'");
  const size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) return *why = "no dtype in the header", false;
  out->descr = descr.substr(q1 + 1, q2 - q1 - 1);
  if (out->descr == "<i1" || out->descr == "i1") out->descr = "|i1";
  if (out->descr == "<u1" || out->descr == "u1") out->descr = "|u1";
  if (field("'fortran_order'").find("True") < 6) return *why = "Fortran order is not supported", false;
  std::string shape = field("'shape'");
  const size_t p1 = shape.find('('), p2 = shape.find(')');
  if (p1 == std::string::npos || p2 == std::string::npos) return *why = "no shape in the header", false;
  shape = shape.substr(p1 + 1, p2 - p1 - 1);
  out->shape.clear();
  size_t at = 0;
  while (at < shape.size()) {
    while (at < shape.size() && (shape[at] == ' ' || shape[at] == ',')) ++at;
    if (at >= shape.size()) break;
    char* end = nullptr;
    const long long v = strtoll(shape.c_str() + at, &end, 10);
    if (end == shape.c_str() + at || v < 0) return *why = "bad shape in the header", false;
    out->shape.push_back(v);
    at = static_cast<size_t>(end - shape.c_str());
  }
  out->data.assign(bytes.begin() + static_cast<long>(start + header_len), bytes.end());
  return true;
}

bool WriteNpy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
              const std::vector<uint8_t>& data) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  FILE* f = fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const uint8_t preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(header.size() & 0xff),
                                static_cast<uint8_t>(header.size() >> 8)};
  bool ok = fwrite(preamble, 1, 10, f) == 10 && fwrite(header.data(), 1, header.size(), f) == header.size() &&
            fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = (fclose(f) == 0) && ok;
  return ok;
}

// Exactly the builtin ops deploy's firmware can register (RESOLVER_METHODS in tfmcu/firmware/sources.py; a test keeps
// the two equal) + the patch stage + TFLM's detection post-processing (registered as AddDetectionPostprocess() does;
// its kernel: @tflite_micro//:kernel_detection_postprocess, in :micro; CUSTOM_RESOLVER in sources.py).
void AddOps(Resolver* r) {
  r->AddAbs(); r->AddAdd(); r->AddArgMax(); r->AddArgMin(); r->AddAveragePool2D(); r->AddBatchMatMul();
  r->AddBatchToSpaceNd(); r->AddCast(); r->AddConcatenation(); r->AddConv2D(); r->AddDepthToSpace();
  r->AddDepthwiseConv2D(); r->AddDequantize(); r->AddDiv(); r->AddElu(); r->AddExp(); r->AddExpandDims();
  r->AddFullyConnected(); r->AddGather(); r->AddHardSwish(); r->AddL2Normalization(); r->AddL2Pool2D();
  r->AddLeakyRelu(); r->AddLogSoftmax(); r->AddLogistic(); r->AddMaxPool2D(); r->AddMaximum(); r->AddMean();
  r->AddMinimum(); r->AddMirrorPad(); r->AddMul(); r->AddPack(); r->AddPad(); r->AddPadV2(); r->AddPrelu();
  r->AddQuantize(); r->AddReduceMax(); r->AddRelu(); r->AddRelu6(); r->AddReshape(); r->AddResizeBilinear();
  r->AddResizeNearestNeighbor(); r->AddShape(); r->AddSlice(); r->AddSoftmax(); r->AddSpaceToBatchNd();
  r->AddSpaceToDepth(); r->AddSplit(); r->AddSplitV(); r->AddSqueeze(); r->AddStridedSlice(); r->AddSub();
  r->AddSum(); r->AddTanh(); r->AddTranspose(); r->AddTransposeConv(); r->AddUnpack();
  r->AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE());
  r->AddCustom("TFLite_Detection_PostProcess", tflite::Register_DETECTION_POSTPROCESS());
}

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t k = 0; k < v.size(); ++k) out += (k ? ", " : "") + std::to_string(v[k]);
  return out;
}

// The --stream_input provider: rows of the current sample, checked against the TfmcuInputProvider contract.
struct StreamSource {
  const uint8_t* sample = nullptr;
  int32_t rows = 0;
  size_t row_bytes = 0;
  int32_t next = 0;  // the lowest row a call may ask for
  int64_t rows_read = 0;
  bool broken = false;
};

TfmcuStatus ReadStreamRows(void* context, int32_t row_start, int32_t row_count, void* destination) {
  StreamSource* src = static_cast<StreamSource*>(context);
  if (!tfmcu_rows_in_contract(src->next, row_start, row_count, src->rows)) {
    src->broken = true;
    return kTfmcuErrorInvalidStage;
  }
  memcpy(destination, src->sample + static_cast<size_t>(row_start) * src->row_bytes,
         static_cast<size_t>(row_count) * src->row_bytes);
  src->next = row_start + row_count;
  src->rows_read += row_count;
  return kTfmcuOk;
}

const char* kAllocationNames[] = {"tflite_eval_tensor_data", "persistent_tflite_tensor_data",
                                  "persistent_tflite_tensor_quantization_data", "persistent_buffer_data",
                                  "tflite_tensor_variable_buffer_data", "node_and_registration_array", "op_data"};

struct Args {
  std::string model_path;
  std::string out_dir;
  std::vector<std::string> inputs;  // INPUT0.npy ...
  size_t arena_bytes = kDefaultArenaBytes;
  std::string stream_path;  // --stream_input
};

// The flags (--name=VALUE, anywhere on the line) and what each sets; every other argument is positional.
struct Flag {
  const char* prefix;
  void (*set)(const std::string& value, Args* args);
};

const Flag kFlags[] = {
    {"--arena_bytes=",
     [](const std::string& value, Args* args) {
       char* end = nullptr;
       const unsigned long long v = strtoull(value.c_str(), &end, 10);
       if (*end != '\0' || v == 0) Fail(2, "--arena_bytes must be a positive integer, not " + value);
       args->arena_bytes = static_cast<size_t>(v);
     }},
    {"--stream_input=", [](const std::string& value, Args* args) { args->stream_path = value; }},
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const Flag* flag = std::find_if(std::begin(kFlags), std::end(kFlags),
                                    [&a](const Flag& f) { return a.rfind(f.prefix, 0) == 0; });
    if (flag != std::end(kFlags)) {
      flag->set(a.substr(strlen(flag->prefix)), &args);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() < 2) Fail(2, "usage: tfmcu_tflm_run MODEL.tflite OUT_DIR INPUT0.npy [...] [--arena_bytes=N]");
  args.model_path = positional[0];
  args.out_dir = positional[1];
  args.inputs.assign(positional.begin() + 2, positional.end());
  return args;
}

// The model, verified, in 16-byte aligned memory (TFLM reads tensors in place, like a model array in Flash).
const tflite::Model* LoadModel(const std::string& path, std::vector<uint64_t>* storage) {
  std::vector<uint8_t> bytes;
  if (!ReadFile(path, &bytes) || bytes.empty()) Fail(2, path + ": cannot read the model");
  storage->assign((bytes.size() + 7) / 8 + 2, 0);
  uint8_t* data = reinterpret_cast<uint8_t*>(storage->data());
  memcpy(data, bytes.data(), bytes.size());
  flatbuffers::Verifier verifier(data, bytes.size());
  if (!tflite::VerifyModelBuffer(verifier)) Fail(2, path + ": not a valid .tflite flatbuffer");
  return tflite::GetModel(data);
}

// One .npy per model input, each holding the same number of samples (returned) of that input.
int64_t ReadInputs(const Args& args, tflite::RecordingMicroInterpreter* interpreter, std::vector<Npy>* inputs) {
  const size_t n_inputs = interpreter->inputs_size();
  if (args.inputs.size() != n_inputs) {
    Fail(2, "the model has " + std::to_string(n_inputs) + " input(s), " + std::to_string(args.inputs.size()) +
                " .npy file(s) given");
  }
  inputs->resize(n_inputs);
  int64_t samples = -1;
  for (size_t k = 0; k < n_inputs; ++k) {
    const std::string& path = args.inputs[k];
    Npy& npy = (*inputs)[k];
    std::string why;
    if (!ReadNpy(path, &npy, &why)) Fail(2, path + ": " + why);
    const TfLiteTensor* t = interpreter->input(k);
    const char* descr = NpyDescr(t->type);
    if (descr == nullptr || npy.descr != descr) {
      Fail(2, path + ": dtype " + npy.descr + ", model input " + std::to_string(k) + " is " +
                  TfLiteTypeGetName(t->type));
    }
    const int64_t n = npy.data.size() / (t->bytes ? t->bytes : 1);
    if (t->bytes == 0 || npy.data.size() != static_cast<size_t>(n) * t->bytes) {
      Fail(2, path + ": its data is not a whole number of model inputs (" + std::to_string(t->bytes) +
                  " bytes each)");
    }
    if (samples >= 0 && n != samples) Fail(2, "the .npy files hold different numbers of samples");
    samples = n;
  }
  if (samples <= 0) Fail(2, "no samples to run");
  return samples;
}

// Writes OUT_DIR/output_<j>.npy: output j of every sample, the batch of 1 becoming the sample axis.
void WriteOutputs(const Args& args, tflite::RecordingMicroInterpreter* interpreter, int64_t samples,
                  const std::vector<std::vector<uint8_t>>& outputs) {
  for (size_t j = 0; j < outputs.size(); ++j) {
    const TfLiteTensor* t = interpreter->output(j);
    std::vector<int64_t> shape = {samples};
    const int first = (t->dims->size > 0 && t->dims->data[0] == 1) ? 1 : 0;
    for (int d = first; d < t->dims->size; ++d) shape.push_back(t->dims->data[d]);
    const char* descr = NpyDescr(t->type);
    if (descr == nullptr) Fail(1, std::string("output type ") + TfLiteTypeGetName(t->type) + " is not supported");
    const std::string path = args.out_dir + "/output_" + std::to_string(j) + ".npy";
    if (!WriteNpy(path, descr, shape, outputs[j])) Fail(2, path + ": cannot write");
  }
}

// The kernel's own persistent bytes (its op data), summed over the model's TFMCU_PATCH_STAGE ops, and their number.
size_t StagePersistentBytes(const tflite::Model* model, int* stage_ops) {
  size_t bytes = 0;
  *stage_ops = 0;
  const auto* subgraph = model->subgraphs()->Get(0);
  for (uint32_t i = 0; subgraph->operators() != nullptr && i < subgraph->operators()->size(); ++i) {
    const tflite::Operator* op = subgraph->operators()->Get(i);
    const auto* codes = model->operator_codes();
    if (codes == nullptr || op->opcode_index() >= codes->size()) continue;
    const tflite::OperatorCode* code = codes->Get(op->opcode_index());
    if (code->custom_code() == nullptr || strcmp(code->custom_code()->c_str(), tfmcu::kPatchStageOpName) != 0) continue;
    ++*stage_ops;
    if (op->custom_options() != nullptr) {
      bytes += tfmcu::PatchStagePersistentBytesFor(op->custom_options()->data(), op->custom_options()->size());
    }
  }
  return bytes;
}

// OUT_DIR/report.json: the arena figures, the kernel's share and the RecordingMicroAllocator breakdown.
void WriteReport(const Args& args, const tflite::Model* model, tflite::RecordingMicroInterpreter* interpreter,
                 int64_t samples, const std::vector<int64_t>& streamed_rows) {
  int stage_ops = 0;
  const size_t stage_persistent = StagePersistentBytes(model, &stage_ops);
  const tflite::RecordingMicroAllocator& allocator = interpreter->GetMicroAllocator();
  const auto* arena_allocator = allocator.GetSimpleMemoryAllocator();
  std::string json = "{\n  \"arena_used_bytes\": " + std::to_string(interpreter->arena_used_bytes()) +
                     ",\n  \"head_bytes\": " + std::to_string(arena_allocator->GetNonPersistentUsedBytes()) +
                     ",\n  \"tail_bytes\": " + std::to_string(arena_allocator->GetPersistentUsedBytes()) +
                     ",\n  \"pointer_bytes\": " + std::to_string(sizeof(void*)) +
                     ",\n  \"samples\": " + std::to_string(samples) +
                     ",\n  \"patch_stage_ops\": " + std::to_string(stage_ops) +
                     ",\n  \"patch_stage_persistent_bytes\": " + std::to_string(stage_persistent) +
                     ",\n  \"streamed_rows_read\": [" + JoinInts(streamed_rows) + "]" +
                     ",\n  \"allocations\": {";
  for (int k = 0; k < static_cast<int>(tflite::RecordedAllocationType::kNumAllocationTypes); ++k) {
    const tflite::RecordedAllocation a =
        allocator.GetRecordedAllocation(static_cast<tflite::RecordedAllocationType>(k));
    json += std::string(k ? "," : "") + "\n    \"" + kAllocationNames[k] + "\": {\"requested_bytes\": " +
            std::to_string(a.requested_bytes) + ", \"used_bytes\": " + std::to_string(a.used_bytes) +
            ", \"count\": " + std::to_string(a.count) + "}";
  }
  json += "\n  }\n}\n";
  const std::string report = args.out_dir + "/report.json";
  FILE* f = fopen(report.c_str(), "w");
  if (f == nullptr || fwrite(json.data(), 1, json.size(), f) != json.size() || fclose(f) != 0) {
    Fail(2, report + ": cannot write");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  std::vector<uint64_t> model_storage;
  const tflite::Model* model = LoadModel(args.model_path, &model_storage);
  Resolver resolver;
  AddOps(&resolver);
  std::vector<uint64_t> arena_storage(args.arena_bytes / 8 + 2);
  uint8_t* arena = reinterpret_cast<uint8_t*>(arena_storage.data());
  tflite::RecordingMicroInterpreter interpreter(model, resolver, arena, args.arena_bytes);
  if (interpreter.AllocateTensors() != kTfLiteOk) {
    Fail(1, args.model_path + ": AllocateTensors failed in an arena of " + std::to_string(args.arena_bytes) +
                " bytes");
  }
  std::vector<Npy> inputs;
  const int64_t samples = ReadInputs(args, &interpreter, &inputs);

  const bool streamed = !args.stream_path.empty();
  Npy stream;
  StreamSource source;
  TfmcuInputProvider provider = {ReadStreamRows, &source};
  std::vector<int64_t> streamed_rows;
  if (streamed) {
    std::string why;
    if (!ReadNpy(args.stream_path, &stream, &why)) Fail(2, args.stream_path + ": " + why);
    if (stream.shape.size() != 4 || stream.shape[0] != samples || stream.shape[1] <= 0) {
      Fail(2, args.stream_path + ": expected [samples, H, W, C] with " + std::to_string(samples) + " samples");
    }
    source.rows = static_cast<int32_t>(stream.shape[1]);
    source.row_bytes = stream.data.size() / static_cast<size_t>(samples) / static_cast<size_t>(source.rows);
    if (interpreter.SetMicroExternalContext(&provider) != kTfLiteOk) Fail(1, "SetMicroExternalContext failed");
  }

  std::vector<std::vector<uint8_t>> outputs(interpreter.outputs_size());
  for (int64_t s = 0; s < samples; ++s) {
    for (size_t k = 0; k < inputs.size(); ++k) {
      TfLiteTensor* t = interpreter.input(k);
      memcpy(t->data.raw, inputs[k].data.data() + s * t->bytes, t->bytes);
    }
    if (streamed) {
      source.sample = stream.data.data() + static_cast<size_t>(s) * source.row_bytes * source.rows;
      source.next = 0;
      source.rows_read = 0;
    }
    if (interpreter.Invoke() != kTfLiteOk) {
      Fail(1, args.model_path + ": Invoke failed on sample " + std::to_string(s));
    }
    if (source.broken) Fail(1, "the kernel broke the input provider's contract (rows out of order or twice)");
    if (streamed) streamed_rows.push_back(source.rows_read);
    for (size_t j = 0; j < outputs.size(); ++j) {
      const TfLiteTensor* t = interpreter.output(j);
      outputs[j].insert(outputs[j].end(), t->data.raw, t->data.raw + t->bytes);
    }
  }
  WriteOutputs(args, &interpreter, samples, outputs);
  WriteReport(args, model, &interpreter, samples, streamed_rows);
  return 0;
}
