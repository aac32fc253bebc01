// The test firmware of a whole model: the model library (tfmcu_model.h: TFLM's MicroInterpreter over the static
// arena, the model in Flash, the arena in RAM counted in the target's SRAM by the link) run on the test inputs of
// firmware_model.h. For each input it runs tfmcu_model_invoke (a cost region "invoke") and prints one TFMCU_RESULT
// line (tools/qemu/run_firmware.py): the FNV-1a hash of all output bytes, the top-1 class of each input (output 0's
// largest value), arena_used_bytes, and the harness's .data/.bss, stack high-water mark and instruction counts. If
// AllocateTensors fails, the line says "allocated": 0 and the failure names the arena size (TFLM's own message before
// it gives the missing bytes).
// A model whose patch stage streams its input (g_tfmcu_stream_rows > 0) gets the image rows straight from the
// inputs in Flash through the library's row reader: no image in the arena; the line adds the rows each Invoke read
// ("streamed_rows_read") and fails if the kernel broke the reader's contract.
// Per-op mode (built with -DTFMCU_PROFILE_OPS, benchmarks/latency.py): the first Invoke's ops are each measured by
// the instruction-count plugin (tools/qemu/insn_count.c) through the markers tfmcu_cost_begin / tfmcu_cost_end
// called directly, not as harness regions (a model has more ops than TFMCU_MAX_REGIONS); the line adds
// "op_tags" (the ops in order) and the plugin's regions are then: invoke, its ops, the later invokes. Without the
// define this file compiles to exactly the code it had before (the "invoke" counts do not change).
// A detector (built with -DTFMCU_DETECTOR_SLOTS=N by deploy, tfmcu/firmware/sources.py: its four outputs are
// TFLite_Detection_PostProcess's boxes [1, M, 4], classes [1, M], scores [1, M], num_detections [1], all float32):
// after each Invoke the entries past num_detections are zeroed (the op leaves them as the arena held them, so does TF
// Lite's, and the host zeroes them the same way: canonical_outputs), the hash covers all four outputs, "top_class" is
// the top detection's class (-1: none), and the line adds "detections": per input, [class, score, ymin, xmin, ymax,
// xmax] per detection, score and box in millionths (N detections kept in all). Without the define none of this is
// compiled.
#include <string.h>

#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_profiler_interface.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/tflm/firmware_model.h"
#include "tfmcu_model.h"

// TFLM's messages on the harness's console (before the result line, never inside it).
extern "C" void tfmcu_model_log(const char* line) { tfmcu_puts(line); }

namespace {

// Index of the largest value of an int8 / uint8 / float32 output (the class of a classifier), -1 otherwise.
int32_t TopClass(const TfLiteTensor* t) {
  const int32_t n = static_cast<int32_t>(t->bytes);
  int32_t best = -1;
  if (t->type == kTfLiteInt8) {
    for (int32_t i = 0; i < n; ++i) {
      if (best < 0 || t->data.int8[i] > t->data.int8[best]) best = i;
    }
  } else if (t->type == kTfLiteUInt8) {
    for (int32_t i = 0; i < n; ++i) {
      if (best < 0 || t->data.uint8[i] > t->data.uint8[best]) best = i;
    }
  } else if (t->type == kTfLiteFloat32) {
    for (int32_t i = 0; i < n / 4; ++i) {
      if (best < 0 || t->data.f[i] > t->data.f[best]) best = i;
    }
  }
  return best;
}

#ifdef TFMCU_PROFILE_OPS
void ReportOpTags();  // below, with the per-op profiler
#endif

#ifdef TFMCU_DETECTOR_SLOTS
// The detections kept to print: [class, score, ymin, xmin, ymax, xmax], score and box in millionths.
int32_t g_detections[TFMCU_DETECTOR_SLOTS][6];
uint32_t g_detections_used = 0;
int32_t g_detections_per_input[16];

// round(v x 1e6), halves away from zero; the product is stored first (volatile) so that no fused multiply-add
// changes it.
int32_t Millionths(float v) {
  volatile float scaled = v * 1000000.0f;
  const float x = scaled;
  return static_cast<int32_t>(x < 0.0f ? x - 0.5f : x + 0.5f);
}

// The detector's outputs after Invoke: the unwritten entries zeroed, the first 16 inputs' detections kept (their
// count in g_detections_per_input[k]); returns the top detection's class (-1: none), or -2 when the outputs are not
// the op's four float32 tensors.
int32_t TakeDetections(tflite::MicroInterpreter* interpreter, uint32_t k) {
  if (interpreter->outputs_size() != 4) return -2;
  TfLiteTensor* boxes = interpreter->output(0);
  TfLiteTensor* classes = interpreter->output(1);
  TfLiteTensor* scores = interpreter->output(2);
  const TfLiteTensor* num = interpreter->output(3);
  for (size_t j = 0; j < 4; ++j) {
    if (interpreter->output(j)->type != kTfLiteFloat32) return -2;
  }
  const uint32_t slots = static_cast<uint32_t>(scores->bytes / sizeof(float));
  if (boxes->bytes != 16u * slots || classes->bytes != 4u * slots || num->bytes != 4u) return -2;
  const float count_f = num->data.f[0];
  const uint32_t count = count_f <= 0.0f ? 0u : (count_f >= static_cast<float>(slots) ? slots
                                                                                      : static_cast<uint32_t>(count_f));
  memset(boxes->data.f + 4 * count, 0, 16u * (slots - count));
  memset(classes->data.f + count, 0, 4u * (slots - count));
  memset(scores->data.f + count, 0, 4u * (slots - count));
  if (k < 16) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < count && g_detections_used < TFMCU_DETECTOR_SLOTS; ++i, ++kept) {
      int32_t* d = g_detections[g_detections_used++];
      d[0] = static_cast<int32_t>(classes->data.f[i]);
      d[1] = Millionths(scores->data.f[i]);
      for (int c = 0; c < 4; ++c) d[2 + c] = Millionths(boxes->data.f[4 * i + c]);
    }
    g_detections_per_input[k] = static_cast<int32_t>(kept);
  }
  return count > 0 ? static_cast<int32_t>(classes->data.f[0]) : -1;
}

// "detections": [[[class, score, ymin, xmin, ymax, xmax], ...], ...] per input, written straight to the line.
void ReportDetections(uint32_t n_inputs) {
  tfmcu_result_raw("detections", "[");
  uint32_t at = 0;
  for (uint32_t k = 0; k < n_inputs; ++k) {
    tfmcu_puts(k ? ", [" : "[");
    for (int32_t i = 0; i < g_detections_per_input[k]; ++i, ++at) {
      tfmcu_puts(i ? ", [" : "[");
      for (int c = 0; c < 6; ++c) {
        if (c) tfmcu_puts(", ");
        tfmcu_put_i64(g_detections[at][c]);
      }
      tfmcu_puts("]");
    }
    tfmcu_puts("]");
  }
  tfmcu_puts("]");
}
#endif  // TFMCU_DETECTOR_SLOTS

// Prints the result line's own keys; TFLM's messages (MicroPrintf) come before the line, never inside it.
int Report(const char* failure, int allocated, uint32_t hash, const int32_t* classes, uint32_t n_classes,
           size_t arena_used, const int32_t* streamed_rows = nullptr) {
  tfmcu_result_begin("tflm_whole_model");
  tfmcu_result_int("arena_bytes", static_cast<int64_t>(TFMCU_MODEL_ARENA_BYTES));
#if TFMCU_MODEL_PERSISTENT_BYTES > 0
  tfmcu_result_int("persistent_bytes", static_cast<int64_t>(TFMCU_MODEL_PERSISTENT_BYTES));
  tfmcu_result_hex32("persistent_at",
                     static_cast<uint32_t>(reinterpret_cast<uintptr_t>(tfmcu_model_persistent_buffer())));
#endif
  tfmcu_result_int("model_bytes", static_cast<int64_t>(g_tfmcu_model_len));
  tfmcu_result_int("allocated", allocated);
  if (failure != nullptr) {
    tfmcu_fail(failure);
    return tfmcu_result_end();
  }
  tfmcu_result_hex32("output_fnv1a32", hash);
  tfmcu_result_int_array("top_class", classes, n_classes);
  tfmcu_result_int("arena_used_bytes", static_cast<int64_t>(arena_used));
  if (streamed_rows != nullptr) tfmcu_result_int_array("streamed_rows_read", streamed_rows, n_classes);
#ifdef TFMCU_DETECTOR_SLOTS
  ReportDetections(n_classes);
#endif
#ifdef TFMCU_PROFILE_OPS
  ReportOpTags();
#endif
  return tfmcu_result_end();
}

}  // namespace

// Defined by a generated model source that marks a stage (tools/gen/gen_model_whole.py); model_runtime.cc has
// the weak default 0 (in another translation unit, so that it is not folded here).
extern "C" const unsigned int g_tfmcu_stage_ops;
extern "C" const unsigned int g_tfmcu_stream_rows;

namespace {

#ifdef TFMCU_PROFILE_OPS
// Per-op mode: the first Invoke's ops, each between the plugin's markers (its own cost region, in op order); the
// "stage" region is not measured. Later Invokes only pay the test of profiling_ (a load and a branch per op).
class StageRegion : public tflite::MicroProfilerInterface {
 public:
  static constexpr uint32_t kMaxOps = 512;
  uint32_t BeginEvent(const char* tag) override {
    if (profiling_) {
      if (op_ < kMaxOps) tags_[op_] = tag;
      tfmcu_cost_begin();
    }
    return op_++;
  }
  void EndEvent(uint32_t op) override {
    (void)op;
    if (profiling_) tfmcu_cost_end();
  }
  void NextInvoke() {
    if (invokes_++ == 1) {  // the first Invoke was profiled
      profiling_ = false;
      profiled_ops_ = op_;
    }
    op_ = 0;
  }
  // "op_tags": the profiled Invoke's ops in order, as JSON ("[\"CONV_2D\", ...]"; TFLM's tags are plain names).
  void ReportTags() const {
    static char json[kMaxOps * 32 + 4];
    size_t n = 0;
    json[n++] = '[';
    const uint32_t ops = profiled_ops_ < kMaxOps ? profiled_ops_ : kMaxOps;
    for (uint32_t i = 0; i < ops && n + 40 < sizeof(json); ++i) {
      if (i) json[n++] = ',';
      json[n++] = '"';
      for (const char* c = tags_[i]; c != nullptr && *c != '\0' && *c != '"' && n + 8 < sizeof(json); ++c) {
        json[n++] = *c;
      }
      json[n++] = '"';
    }
    json[n++] = ']';
    json[n] = '\0';
    tfmcu_result_raw("op_tags", json);
    tfmcu_result_int("profiled_ops", static_cast<int64_t>(profiled_ops_));
  }

 private:
  uint32_t op_ = 0;
  uint32_t invokes_ = 0;
  uint32_t profiled_ops_ = 0;
  bool profiling_ = true;
  static const char* tags_[kMaxOps];  // static storage: the firmware's stack is small
};
const char* StageRegion::tags_[StageRegion::kMaxOps];
const StageRegion* g_profile = nullptr;  // the result line's "op_tags" (Report)
void ReportOpTags() {
  if (g_profile != nullptr) g_profile->ReportTags();
}
#else
// The first g_tfmcu_stage_ops ops of each Invoke (the patch stage: the TFMCU_PATCH_STAGE op, or the ops it
// replaces in the unpatched model) as the cost region "stage", through TFLM's profiler hooks (one virtual call per
// op). 0 measures nothing.
class StageRegion : public tflite::MicroProfilerInterface {
 public:
  uint32_t BeginEvent(const char* tag) override {
    (void)tag;
    if (op_ == 0 && g_tfmcu_stage_ops > 0) tfmcu_region_begin("stage");
    return op_++;
  }
  void EndEvent(uint32_t op) override {
    if (g_tfmcu_stage_ops > 0 && op + 1 == g_tfmcu_stage_ops) tfmcu_region_end();
  }
  void NextInvoke() { op_ = 0; }

 private:
  uint32_t op_ = 0;
};
#endif  // TFMCU_PROFILE_OPS

// The streamed input: rows of one image in Flash, handed to the library's row reader (which checks the order).
struct FlashRows {
  const unsigned char* image = nullptr;
  size_t row_bytes = 0;
  int32_t rows_read = 0;
};

int ReadFlashRows(void* context, int32_t row_start, int32_t row_count, void* destination) {
  FlashRows* src = static_cast<FlashRows*>(context);
  memcpy(destination, src->image + static_cast<size_t>(row_start) * src->row_bytes,
         static_cast<size_t>(row_count) * src->row_bytes);
  src->rows_read += row_count;
  return 0;
}

}  // namespace

int main(void) {
  StageRegion stage_region;
#ifdef TFMCU_PROFILE_OPS
  g_profile = &stage_region;
#endif
  const tfmcu_model_status init = tfmcu_model_init_profiled(&stage_region);
  if (init == TFMCU_MODEL_ERROR_RESOLVER) return Report("op registration failed", 0, 0, nullptr, 0, 0);
  if (init == TFMCU_MODEL_ERROR_ALLOCATE) {
    return Report("AllocateTensors failed: the model does not fit the TFMCU_ARENA_BYTES arena (see TFLM's message)",
                  0, 0, nullptr, 0, 0);
  }
  const bool streamed = g_tfmcu_stream_rows > 0;
  if (init != TFMCU_MODEL_OK) {
    return Report(streamed ? "streamed input: no one-byte placeholder input, or no external context"
                           : "the model's input is missing", 1, 0, nullptr, 0, 0);
  }
  tflite::MicroInterpreter* interpreter = tfmcu_model_interpreter();
  tfmcu_model_tensor input_info;
  int8_t* input = tfmcu_model_input(&input_info);
  FlashRows rows;
  int32_t streamed_rows[16];
  if (streamed) {
    rows.row_bytes = g_tfmcu_input_len / g_tfmcu_stream_rows;
    tfmcu_model_set_row_reader(ReadFlashRows, &rows);
  } else if (input_info.bytes != g_tfmcu_input_len) {
    return Report("input size differs from the generated input", 1, 0, nullptr, 0, 0);
  }
  uint32_t hash = tfmcu_fnv1a32(nullptr, 0);
  int32_t classes[16];
  const uint32_t n = g_tfmcu_num_inputs < 16u ? g_tfmcu_num_inputs : 16u;
  for (uint32_t k = 0; k < g_tfmcu_num_inputs; ++k) {
    if (streamed) {  // the kernel reads the image's rows from Flash
      rows.image = g_tfmcu_inputs + k * g_tfmcu_input_len;
      rows.rows_read = 0;
    } else {
      memcpy(input, g_tfmcu_inputs + k * g_tfmcu_input_len, g_tfmcu_input_len);
    }
    stage_region.NextInvoke();
    tfmcu_region_begin("invoke");
    const tfmcu_model_status status = tfmcu_model_invoke();
    tfmcu_region_end();
    if (status == TFMCU_MODEL_ERROR_ROWS) {
      return Report("the kernel broke the input provider's contract", 1, 0, nullptr, 0, 0);
    }
    if (status != TFMCU_MODEL_OK) return Report("Invoke failed", 1, 0, nullptr, 0, 0);
    if (streamed && k < n) streamed_rows[k] = rows.rows_read;
    const TfLiteTensor* output = interpreter->output(0);
    if (output == nullptr || output->bytes != g_tfmcu_output_len) {
      return Report("output size differs from TF Lite's", 1, 0, nullptr, 0, 0);
    }
#ifdef TFMCU_DETECTOR_SLOTS
    const int32_t top = TakeDetections(interpreter, k);
    if (top < -1) return Report("detector: outputs not TFLite_Detection_PostProcess's four", 1, 0, nullptr, 0, 0);
    for (size_t j = 0; j < 4; ++j) {
      hash = tfmcu_fnv1a32_update(hash, interpreter->output(j)->data.raw, interpreter->output(j)->bytes);
    }
    if (k < n) classes[k] = top;
#else
    hash = tfmcu_fnv1a32_update(hash, output->data.raw, output->bytes);
    if (k < n) classes[k] = TopClass(output);
#endif
  }
#ifdef TFMCU_PROFILE_OPS
  stage_region.NextInvoke();  // ends the profile when the model ran one input only
#endif
  return Report(nullptr, 1, hash, classes, n, tfmcu_model_arena_used_bytes(), streamed ? streamed_rows : nullptr);
}
