// Seeded fuzzing of the TFMCU_PATCH_STAGE kernel inside TFLM, built with AddressSanitizer + UBSan (our code).
//
//   tfmcu_fuzz_options MODEL.tflite ITERATIONS SEED
//
// MODEL is a custom-mode model whose whole graph is one TFMCU_PATCH_STAGE op (so a mutation can only reach our
// kernel, never another kernel's checks). Each iteration copies the model, mutates it in place — bytes of the
// flexbuffer options, the options' length (truncation), the op's input / output tensor shapes, and int32 words of
// its stage blob (header, tables, params records, weights and multipliers; the params records, a small part of a
// blob holding weights, are also a region of their own, so every op's params check and kernel see as many
// mutations as the rest of the blob) — then runs the options parser alone on the
// mutated options (patch_stage_options.h: it must accept them or reject them with a message), builds a
// MicroInterpreter, allocates tensors and, when that succeeds, invokes. The kernel must answer kTfLiteError or run;
// a sanitizer report or a crash fails the run. Prints counts of rejected / accepted mutations. Exit 0 on success,
// 1 for a rejection without a message, 2 for bad arguments.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "tensorflow/lite/micro/debug_log.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "tflm_patch_kernels/patch_stage_types.h"
#include "tflm_patch_kernels/tflm/patch_stage_op.h"
#include "tflm_patch_kernels/tflm/patch_stage_options.h"

namespace {

// A small deterministic generator (xorshift64*): the same seed gives the same mutations on every machine.
struct Rng {
  uint64_t s;
  uint32_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return static_cast<uint32_t>((s * 2685821657736338717ull) >> 32);
  }
  uint32_t Below(uint32_t n) { return n ? Next() % n : 0; }
};

struct Region {
  size_t offset;  // in the model buffer
  size_t size;
  int kind;  // 0 options bytes, 1 shape int32s, 2 int32 constant data
};

// The options parser alone, as the kernel's Init calls it: true when it accepts `bytes`; a rejection must say why.
bool ParseAlone(const uint8_t* bytes, size_t length, bool* unexplained) {
  tfmcu::PatchStageOptions options;
  tfmcu::PatchStageOptionsError error;
  error.message[0] = '\0';
  const bool ok = tfmcu::ParsePatchStageOptions(bytes, length, &options, &error);
  *unexplained = !ok && error.message[0] == '\0';
  if (*unexplained) fprintf(stderr, "tfmcu_fuzz_options: the parser rejected options without a message\n");
  return ok;
}

}  // namespace

// TFLM's log hooks: quiet (most iterations are rejected with a message; sanitizer reports still reach stderr).
extern "C" void DebugLog(const char* format, va_list args) {
  (void)format;
  (void)args;
}
extern "C" int DebugVsnprintf(char* buffer, size_t buf_size, const char* format, va_list vlist) {
  return vsnprintf(buffer, buf_size, format, vlist);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: tfmcu_fuzz_options MODEL.tflite ITERATIONS SEED\n");
    return 2;
  }
  FILE* f = fopen(argv[1], "rb");
  if (f == nullptr) {
    fprintf(stderr, "tfmcu_fuzz_options: cannot read %s\n", argv[1]);
    return 2;
  }
  std::vector<uint8_t> pristine;
  uint8_t chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) pristine.insert(pristine.end(), chunk, chunk + n);
  fclose(f);
  const long iterations = strtol(argv[2], nullptr, 10);
  Rng rng{static_cast<uint64_t>(strtoull(argv[3], nullptr, 10)) * 0x9E3779B97F4A7C15ull + 1};

  const tflite::Model* model = tflite::GetModel(pristine.data());
  const auto* subgraph = model->subgraphs()->Get(0);
  if (subgraph->operators()->size() != 1) {
    fprintf(stderr, "tfmcu_fuzz_options: the model must be one TFMCU_PATCH_STAGE op\n");
    return 2;
  }
  const tflite::Operator* op = subgraph->operators()->Get(0);
  const uint8_t* base = pristine.data();
  std::vector<Region> regions;
  const auto* options = op->custom_options();
  if (options == nullptr || options->size() == 0) {
    fprintf(stderr, "tfmcu_fuzz_options: the op has no custom options\n");
    return 2;
  }
  const size_t options_at = static_cast<size_t>(options->data() - base);
  regions.push_back({options_at, options->size(), 0});
  auto add_shape = [&](int32_t t) {
    const auto* shape = subgraph->tensors()->Get(t)->shape();
    if (shape != nullptr && shape->size() > 0) {
      regions.push_back({static_cast<size_t>(reinterpret_cast<const uint8_t*>(shape->data()) - base),
                         shape->size() * 4u, 1});
    }
  };
  add_shape(op->inputs()->Get(0));
  add_shape(op->outputs()->Get(0));
  for (uint32_t i = 1; i < op->inputs()->size(); ++i) {
    const tflite::Tensor* t = subgraph->tensors()->Get(op->inputs()->Get(i));
    const auto* buffer = model->buffers()->Get(t->buffer());
    const bool table = t->type() == tflite::TensorType_INT32 || t->type() == tflite::TensorType_UINT8;
    if (table && buffer->data() != nullptr && buffer->data()->size() >= 4) {  // the stage blob: int32 words
      const size_t blob_at = static_cast<size_t>(buffer->data()->data() - base);
      regions.push_back({blob_at, buffer->data()->size(), 2});
      TfmcuStageBlob header;
      if (buffer->data()->size() >= sizeof(header)) {  // its params records (the layers' params words)
        memcpy(&header, buffer->data()->data(), sizeof(header));
        const size_t at = static_cast<size_t>(header.params), words = static_cast<size_t>(header.params_words);
        if (header.params > 0 && header.params_words > 0 && at + 4 * words <= buffer->data()->size()) {
          regions.push_back({blob_at + at, 4 * words, 2});
        }
      }
    }
  }

  tflite::MicroMutableOpResolver<1> resolver;
  resolver.AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE());
  constexpr size_t kArenaBytes = 1 << 20;
  std::vector<uint64_t> arena_storage(kArenaBytes / 8);
  std::vector<uint64_t> work_storage(pristine.size() / 8 + 2);
  uint8_t* work = reinterpret_cast<uint8_t*>(work_storage.data());
  long rejected = 0, accepted = 0, parsed = 0;
  for (long it = 0; it < iterations; ++it) {
    memcpy(work, pristine.data(), pristine.size());
    const int mutations = 1 + static_cast<int>(rng.Below(6));
    for (int m = 0; m < mutations; ++m) {
      const Region& r = regions[rng.Below(static_cast<uint32_t>(regions.size()))];
      const uint32_t choice = rng.Below(8);
      if (r.kind == 0 && choice == 0) {  // truncate the options (the length field precedes the data)
        const uint32_t len = rng.Below(static_cast<uint32_t>(r.size));
        memcpy(work + r.offset - 4, &len, 4);
      } else if (r.kind == 0) {
        work[r.offset + rng.Below(static_cast<uint32_t>(r.size))] = static_cast<uint8_t>(rng.Next());
      } else {  // an int32: a small value, an edge value, or random bits
        const size_t at = r.offset + 4 * rng.Below(static_cast<uint32_t>(r.size / 4));
        const int32_t edges[] = {0, -1, 1, INT32_MIN, INT32_MAX, 65536};
        int32_t v = choice < 4 ? static_cast<int32_t>(rng.Below(300)) - 20
                               : (choice < 6 ? edges[rng.Below(6)] : static_cast<int32_t>(rng.Next()));
        memcpy(work + at, &v, 4);
      }
    }
    uint32_t options_length = 0;
    memcpy(&options_length, work + options_at - 4, 4);
    bool unexplained = false;
    parsed += ParseAlone(work + options_at, options_length < options->size() ? options_length : options->size(),
                         &unexplained);
    if (unexplained) return 1;
    const tflite::Model* mutated = tflite::GetModel(work);
    tflite::MicroInterpreter interpreter(mutated, resolver, reinterpret_cast<uint8_t*>(arena_storage.data()),
                                         kArenaBytes);
    if (interpreter.AllocateTensors() != kTfLiteOk) {
      ++rejected;
      continue;
    }
    TfLiteTensor* input = interpreter.input(0);
    if (input != nullptr && input->data.raw != nullptr) {
      memset(input->data.raw, static_cast<int>(it & 0x7f), input->bytes);
    }
    interpreter.Invoke();  // a valid stage runs; an error status is fine, a crash is not
    ++accepted;
  }
  printf("tfmcu_fuzz_options: %ld iterations, %ld rejected at AllocateTensors, %ld ran\n", iterations, rejected,
         accepted);
  printf("tfmcu_fuzz_options: %zu regions mutated\n", regions.size());
  printf("tfmcu_fuzz_options: the options parser alone accepted %ld of them\n", parsed);
  return 0;
}
