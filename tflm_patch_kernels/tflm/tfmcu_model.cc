// The model library's implementation (tfmcu_model.h): TFLM's MicroInterpreter over a static arena, the model and
// op resolver of model_data.cc (firmware_model.h), a streamed input's rows through the patch stage's
// TfmcuInputProvider (the interpreter's external context). No heap: the interpreter lives in static storage.
// The sizes come from tfmcu_model_config.h (written with the model), or, for a build that defines
// TFMCU_MODEL_CONFIG_FROM_FLAGS, from -DTFMCU_MODEL_ARENA_BYTES / -DTFMCU_MODEL_PERSISTENT_BYTES.
#include "tfmcu_model.h"

#include <new>

#include "tensorflow/lite/micro/micro_allocator.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tflm_patch_kernels/patch_stage.h"
#include "tflm_patch_kernels/tflm/firmware_model.h"

#ifndef TFMCU_MODEL_ARENA_BYTES
#error "TFMCU_MODEL_ARENA_BYTES: the tensor arena's size (tfmcu_model_config.h)"
#endif
#ifndef TFMCU_MODEL_PERSISTENT_BYTES
#define TFMCU_MODEL_PERSISTENT_BYTES 0
#endif

// Rows of the streamed input image (model_data.cc; model_runtime.cc's weak default 0: not streamed).
extern "C" const unsigned int g_tfmcu_stream_rows;

namespace {

alignas(16) uint8_t g_arena[TFMCU_MODEL_ARENA_BYTES];
#if TFMCU_MODEL_PERSISTENT_BYTES > 0
// TFLM's persistent data (tensor and operator records, op data) in a buffer of its own, in the section the board's
// linker script places in a second RAM region (the STM32F405's CCM): MicroAllocator's two-buffer Create. g_arena
// then holds only the non-persistent data (the planned tensors and scratch).
alignas(16) uint8_t g_persistent[TFMCU_MODEL_PERSISTENT_BYTES] __attribute__((section(".tfmcu_persistent")));
#endif

alignas(tflite::MicroInterpreter) uint8_t g_interpreter_storage[sizeof(tflite::MicroInterpreter)];
tflite::MicroInterpreter* g_interpreter = nullptr;

// The streamed input: the user's reader behind the stage's provider; the order is checked here (the contract).
struct Rows {
  tfmcu_model_read_rows read = nullptr;
  void* context = nullptr;
  int32_t next = 0;
  int broken = 0;
};
Rows g_rows;

TfmcuStatus ReadRows(void* context, int32_t row_start, int32_t row_count, void* destination) {
  Rows* rows = static_cast<Rows*>(context);
  if (rows->read == nullptr ||
      !tfmcu_rows_in_contract(rows->next, row_start, row_count, static_cast<int32_t>(g_tfmcu_stream_rows)) ||
      rows->read(rows->context, row_start, row_count, destination) != 0) {
    rows->broken = 1;
    return kTfmcuErrorInvalidStage;
  }
  rows->next = row_start + row_count;
  return kTfmcuOk;
}
TfmcuInputProvider g_provider = {ReadRows, &g_rows};

void Describe(const TfLiteTensor* t, tfmcu_model_tensor* info) {
  if (info == nullptr) return;
  info->type = t->type == kTfLiteInt8 ? 9 : t->type == kTfLiteUInt8 ? 3 : t->type == kTfLiteFloat32 ? 1 : -1;
  info->bytes = static_cast<uint32_t>(t->bytes);
  info->num_dims = t->dims == nullptr ? 0 : (t->dims->size < 6 ? t->dims->size : 6);
  for (int32_t i = 0; i < 6; ++i) info->dims[i] = i < info->num_dims ? t->dims->data[i] : 0;
  info->scale = t->params.scale;
  info->zero_point = t->params.zero_point;
}

}  // namespace

tfmcu_model_status tfmcu_model_init_profiled(tflite::MicroProfilerInterface* profiler) {
  if (g_interpreter != nullptr) return TFMCU_MODEL_OK;
  const tflite::Model* model = tflite::GetModel(g_tfmcu_model);
  const tflite::MicroOpResolver* resolver = tfmcu_model_op_resolver();
  if (resolver == nullptr) return TFMCU_MODEL_ERROR_RESOLVER;
#if TFMCU_MODEL_PERSISTENT_BYTES > 0
  tflite::MicroAllocator* allocator =
      tflite::MicroAllocator::Create(g_persistent, sizeof(g_persistent), g_arena, sizeof(g_arena));
  if (allocator == nullptr) return TFMCU_MODEL_ERROR_ALLOCATE;
  tflite::MicroInterpreter* interpreter =
      new (g_interpreter_storage) tflite::MicroInterpreter(model, *resolver, allocator, nullptr, profiler);
#else
  tflite::MicroInterpreter* interpreter = new (g_interpreter_storage)
      tflite::MicroInterpreter(model, *resolver, g_arena, sizeof(g_arena), nullptr, profiler);
#endif
  if (interpreter->AllocateTensors() != kTfLiteOk) return TFMCU_MODEL_ERROR_ALLOCATE;
  TfLiteTensor* input = interpreter->input(0);
  if (input == nullptr) return TFMCU_MODEL_ERROR_INPUT;
  if (g_tfmcu_stream_rows > 0 &&
      (input->bytes != 1 || interpreter->SetMicroExternalContext(&g_provider) != kTfLiteOk)) {
    return TFMCU_MODEL_ERROR_INPUT;  // a streamed stage's input is a one-byte placeholder
  }
  g_interpreter = interpreter;
  return TFMCU_MODEL_OK;
}

tflite::MicroInterpreter* tfmcu_model_interpreter() { return g_interpreter; }

const void* tfmcu_model_persistent_buffer() {
#if TFMCU_MODEL_PERSISTENT_BYTES > 0
  return g_persistent;
#else
  return nullptr;
#endif
}

extern "C" {

tfmcu_model_status tfmcu_model_init(void) { return tfmcu_model_init_profiled(nullptr); }

int8_t* tfmcu_model_input(tfmcu_model_tensor* info) {
  if (g_interpreter == nullptr) return nullptr;
  TfLiteTensor* input = g_interpreter->input(0);
  Describe(input, info);
  return g_tfmcu_stream_rows > 0 ? nullptr : input->data.int8;
}

tfmcu_model_status tfmcu_model_set_row_reader(tfmcu_model_read_rows read_rows, void* context) {
  g_rows.read = read_rows;
  g_rows.context = context;
  return TFMCU_MODEL_OK;
}

tfmcu_model_status tfmcu_model_invoke(void) {
  if (g_interpreter == nullptr) return TFMCU_MODEL_ERROR_STATE;
  if (g_tfmcu_stream_rows > 0) {
    if (g_rows.read == nullptr) return TFMCU_MODEL_ERROR_INPUT;
    g_rows.next = 0;
    g_rows.broken = 0;
    g_interpreter->input(0)->data.int8[0] = 0;
  }
  const TfLiteStatus status = g_interpreter->Invoke();
  if (g_rows.broken) return TFMCU_MODEL_ERROR_ROWS;
  return status == kTfLiteOk ? TFMCU_MODEL_OK : TFMCU_MODEL_ERROR_INVOKE;
}

const void* tfmcu_model_output(uint32_t index, tfmcu_model_tensor* info) {
  if (g_interpreter == nullptr || index >= g_interpreter->outputs_size()) return nullptr;
  TfLiteTensor* output = g_interpreter->output(index);
  Describe(output, info);
  return output->data.raw;
}

size_t tfmcu_model_arena_used_bytes(void) {
  return g_interpreter == nullptr ? 0 : g_interpreter->arena_used_bytes();
}

const char* tfmcu_model_status_string(tfmcu_model_status status) {
  switch (status) {
    case TFMCU_MODEL_OK:
      return "ok";
    case TFMCU_MODEL_ERROR_RESOLVER:
      return "an op's registration failed";
    case TFMCU_MODEL_ERROR_ALLOCATE:
      return "AllocateTensors failed: the arena is too small";
    case TFMCU_MODEL_ERROR_STATE:
      return "the model is not initialised";
    case TFMCU_MODEL_ERROR_INPUT:
      return "the input is not the model's, or a streamed input has no row reader";
    case TFMCU_MODEL_ERROR_INVOKE:
      return "Invoke failed";
    case TFMCU_MODEL_ERROR_ROWS:
      return "the row reader failed or was asked out of order";
  }
  return "unknown status";
}

}  // extern "C"
