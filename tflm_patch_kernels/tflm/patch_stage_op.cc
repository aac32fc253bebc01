// TFMCU_PATCH_STAGE as a TFLM kernel: see patch_stage_op.h. The options parser is patch_stage_options.cc.
#include "tflm_patch_kernels/tflm/patch_stage_op.h"

#include <stdint.h>
#include <string.h>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tflm_patch_kernels/patch_stage.h"
#include "tflm_patch_kernels/tflm/patch_stage_options.h"

namespace tfmcu {
namespace {

// Init parses the options into the op data and the arrays after it (tensors, layers, params structs); Prepare binds
// the constant inputs. Its size is part of the arena figures (tfmcu.abi: the kernel's persistent bytes).
struct OpData {
  TfmcuStage stage;
  TfmcuPreparedStage prepared;
  TfmcuTensor* tensors;   // [num_tensors]
  TfmcuLayer* layers;     // [num_layers]
  uint8_t* params;        // the layers' params structs, each at a pointer-aligned offset
  const uint8_t* options;  // the flexbuffer (in the model), parsed in Init: Prepare looks up input positions there
  size_t options_size;
  int scratch_index;
  int32_t streamed;  // 1: the stage input comes from the TfmcuInputProvider in the interpreter's external context
};

// A kernel error: one line naming the op, then kTfLiteError.
#define TFMCU_OP_FAIL(...)                            \
  do {                                                \
    MicroPrintf("TFMCU_PATCH_STAGE: " __VA_ARGS__);   \
    return kTfLiteError;                              \
  } while (0)

void* Init(TfLiteContext* context, const char* buffer, size_t length) {
  const uint8_t* options = reinterpret_cast<const uint8_t*>(buffer);
  PatchStageSizes sizes;
  PatchStageOptionsError error;
  if (!ReadPatchStageSizes(options, length, &sizes, &error)) {
    MicroPrintf("TFMCU_PATCH_STAGE: %s", error.message);
    return nullptr;
  }
  const size_t bytes = PatchStagePersistentBytes(sizes.num_tensors, sizes.num_layers, sizes.params_bytes);
  uint8_t* mem = static_cast<uint8_t*>(context->AllocatePersistentBuffer(context, bytes));
  if (mem == nullptr) {
    MicroPrintf("TFMCU_PATCH_STAGE: cannot allocate %d persistent bytes", static_cast<int>(bytes));
    return nullptr;
  }
  memset(mem, 0, bytes);
  OpData* data = reinterpret_cast<OpData*>(mem);
  size_t at = AlignToPointer(sizeof(OpData));
  data->tensors = reinterpret_cast<TfmcuTensor*>(mem + at);
  at += AlignToPointer(sizeof(TfmcuTensor) * static_cast<size_t>(sizes.num_tensors));
  data->layers = reinterpret_cast<TfmcuLayer*>(mem + at);
  at += AlignToPointer(sizeof(TfmcuLayer) * static_cast<size_t>(sizes.num_layers));
  data->params = mem + at;
  PatchStageOptions parsed;
  if (!ParsePatchStageOptions(options, length, PatchStageStorage{data->tensors, data->layers, data->params}, &parsed,
                              &error)) {
    MicroPrintf("TFMCU_PATCH_STAGE: %s", error.message);
    return nullptr;
  }
  data->stage = parsed.stage;
  data->streamed = parsed.streamed_input;
  data->options = options;
  data->options_size = length;
  data->scratch_index = -1;
  return data;
}

// A constant INT32 / INT8 input of the node, read in place: its data, checked for type, size and alignment.
TfLiteStatus ConstInput(TfLiteContext* context, TfLiteNode* node, int32_t position, TfLiteType type,
                        int32_t elements, const char* what, int layer, const void** out) {
  if (position < 1 || position >= node->inputs->size) {
    TFMCU_OP_FAIL("layer %d: %s input position %d out of range (1..%d)", layer, what, static_cast<int>(position),
                  node->inputs->size - 1);
  }
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* t = micro_context->AllocateTempInputTensor(node, position);
  if (t == nullptr) TFMCU_OP_FAIL("layer %d: %s input %d is missing", layer, what, static_cast<int>(position));
  const bool constant = t->allocation_type == kTfLiteMmapRo && t->data.data != nullptr;
  const TfLiteType got_type = t->type;
  const size_t got_bytes = t->bytes;
  const void* ptr = t->data.data;
  micro_context->DeallocateTempTfLiteTensor(t);
  const size_t size = type == kTfLiteInt8 ? 1 : 4;
  if (!constant) TFMCU_OP_FAIL("layer %d: %s (input %d) is not a constant tensor", layer, what,
                               static_cast<int>(position));
  if (got_type != type) TFMCU_OP_FAIL("layer %d: %s (input %d) has type %s, not %s", layer, what,
                                      static_cast<int>(position), TfLiteTypeGetName(got_type), TfLiteTypeGetName(type));
  if (got_bytes != static_cast<size_t>(elements) * size) {
    TFMCU_OP_FAIL("layer %d: %s (input %d) holds %d bytes, the stage needs %d", layer, what,
                  static_cast<int>(position), static_cast<int>(got_bytes), static_cast<int>(elements * size));
  }
  if (reinterpret_cast<uintptr_t>(ptr) % size != 0) {
    TFMCU_OP_FAIL("layer %d: %s (input %d) is not %d-byte aligned in the model", layer, what,
                  static_cast<int>(position), static_cast<int>(size));
  }
  *out = ptr;
  return kTfLiteOk;
}

// The node's input 0 / output 0 must be the stage input / output tensor: [1, H, W, C] of the right type, or
// [1, C] for a 1 x 1 one (a fully connected layer run as the 1x1 convolution it computes).
TfLiteStatus CheckIo(const TfLiteTensor* t, const TfmcuTensor& want, const char* what) {
  const TfLiteType type = want.dtype == kTfmcuFloat32 ? kTfLiteFloat32 : kTfLiteInt8;
  if (t == nullptr) TFMCU_OP_FAIL("the op has no %s tensor", what);
  if (t->type != type) TFMCU_OP_FAIL("%s tensor has type %s, the stage expects %s", what, TfLiteTypeGetName(t->type),
                                     TfLiteTypeGetName(type));
  const TfLiteIntArray* d = t->dims;
  const bool flat = d != nullptr && d->size == 2 && d->data[0] == 1 && want.height == 1 && want.width == 1 &&
                    d->data[1] == want.channels;
  if (!flat && (d == nullptr || d->size != 4 || d->data[0] != 1 || d->data[1] != want.height ||
                d->data[2] != want.width || d->data[3] != want.channels)) {
    TFMCU_OP_FAIL("%s tensor shape is not [1, %d, %d, %d]", what, static_cast<int>(want.height),
                  static_cast<int>(want.width), static_cast<int>(want.channels));
  }
  return kTfLiteOk;
}

// Layer i's params arrays: the constant inputs the options name, bound into its params (the scalar words Init bound
// stay: they follow the arrays in the struct, op_table.h).
TfLiteStatus BindArrays(TfLiteContext* context, TfLiteNode* node, OpData* data, int i) {
  const TfmcuLayer& l = data->layers[i];
  const TfmcuOpInfo* op = tfmcu_op_info(l.type);
  if (op->num_arrays == 0) return kTfLiteOk;
  PatchStageInput inputs[TFMCU_MAX_PARAM_ARRAYS];
  ReadPatchStageArrays(data->options, data->options_size, i, inputs);
  int32_t in_channels[TFMCU_MAX_LAYER_INPUTS] = {0, 0};
  for (int32_t k = 0; k < l.num_inputs; ++k) in_channels[k] = data->tensors[l.inputs[k]].channels;
  int32_t elements[TFMCU_MAX_PARAM_ARRAYS] = {0, 0, 0, 0};
  op->array_sizes(l.params, in_channels, data->tensors[l.output].channels, elements);
  const void* arrays[TFMCU_MAX_PARAM_ARRAYS] = {nullptr, nullptr, nullptr, nullptr};
  for (int32_t k = 0; k < op->num_arrays; ++k) {
    if (inputs[k].position < 0) continue;
    TF_LITE_ENSURE_OK(context, ConstInput(context, node, inputs[k].position, k == 0 ? kTfLiteInt8 : kTfLiteInt32,
                                          elements[k], inputs[k].name, i, &arrays[k]));
  }
  if (arrays[3] != nullptr && !tfmcu_shifts_valid(static_cast<const int32_t*>(arrays[3]), elements[3])) {
    TFMCU_OP_FAIL("layer %d: output_shift values must be in -31..31", i);
  }
  int32_t words[32];
  const uint8_t* params = static_cast<const uint8_t*>(l.params);
  memcpy(words, params + static_cast<size_t>(op->num_arrays) * sizeof(void*), static_cast<size_t>(op->num_words) * 4);
  if (tfmcu_op_bind(l.type, const_cast<void*>(l.params), op->params_size, words, op->num_words, arrays,
                    op->num_arrays) != kTfmcuOk) {
    TFMCU_OP_FAIL("layer %d: cannot bind the arrays", i);
  }
  return kTfLiteOk;
}

// The stage's tables: INT32 constant inputs, read in place.
TfLiteStatus BindTables(TfLiteContext* context, TfLiteNode* node, OpData* data, int32_t* input_window_bytes) {
  TfmcuStage& s = data->stage;
  PatchStageInput tables[kNumPatchStageTables];
  ReadPatchStageTables(data->options, data->options_size, s, tables, input_window_bytes);
  const void* bound[kNumPatchStageTables] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  for (int k = 0; k < kNumPatchStageTables; ++k) {
    if (tables[k].position < 0) continue;  // a halo table of a stage without caches
    TF_LITE_ENSURE_OK(context, ConstInput(context, node, tables[k].position, kTfLiteInt32, tables[k].elements,
                                          tables[k].name, -1, &bound[k]));
  }
  s.row_spans = static_cast<const TfmcuSpan*>(bound[kRowSpansTable]);
  s.col_spans = static_cast<const TfmcuSpan*>(bound[kColSpansTable]);
  s.buffer_offsets = static_cast<const int32_t*>(bound[kBufferOffsetsTable]);
  s.row_held = static_cast<const int32_t*>(bound[kRowHeldTable]);
  s.col_held = static_cast<const int32_t*>(bound[kColHeldTable]);
  s.caches = static_cast<const TfmcuCache*>(bound[kCachesTable]);
  return kTfLiteOk;
}

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  OpData* data = static_cast<OpData*>(node->user_data);
  if (data == nullptr) TFMCU_OP_FAIL("Init failed (see the message above)");
  TfmcuStage& s = data->stage;
  for (int32_t i = 0; i < s.num_layers; ++i) TF_LITE_ENSURE_OK(context, BindArrays(context, node, data, i));
  int32_t window = 0;
  TF_LITE_ENSURE_OK(context, BindTables(context, node, data, &window));

  int32_t failed_layer = -1;
  const TfmcuStatus status = tfmcu_stage_prepare(&s, &data->prepared, &failed_layer);
  if (status != kTfmcuOk) {
    TFMCU_OP_FAIL("invalid stage description (status %d, layer %d)", static_cast<int>(status),
                  static_cast<int>(failed_layer));
  }
  if (data->streamed && (window <= 0 || static_cast<uint32_t>(window) != data->prepared.input_window_bytes)) {
    TFMCU_OP_FAIL("streamed input: input_window_bytes %d, the stage's window is %d bytes (0: it cannot stream)",
                  static_cast<int>(window), static_cast<int>(data->prepared.input_window_bytes));
  }

  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  if (node->inputs->size < 1 || node->outputs->size != 1) TFMCU_OP_FAIL("the op needs inputs and one output");
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
      TFMCU_OP_FAIL("streamed input: no TfmcuInputProvider registered (MicroInterpreter::SetMicroExternalContext)");
    }
    status = tfmcu_stage_run_streamed(&data->prepared, provider, output->data.int8, static_cast<uint8_t*>(scratch),
                                      data->prepared.streamed_scratch_bytes);
  } else {
    status = tfmcu_stage_run(&data->prepared, input->data.data, output->data.int8, static_cast<uint8_t*>(scratch),
                             data->prepared.scratch_bytes);
  }
  if (status != kTfmcuOk) TFMCU_OP_FAIL("stage run failed (status %d)", static_cast<int>(status));
  return kTfLiteOk;
}

}  // namespace

size_t PatchStagePersistentBytes(int num_tensors, int num_layers, size_t params_bytes) {
  return AlignToPointer(sizeof(OpData)) + AlignToPointer(sizeof(TfmcuTensor) * static_cast<size_t>(num_tensors)) +
         AlignToPointer(sizeof(TfmcuLayer) * static_cast<size_t>(num_layers)) + params_bytes;
}

size_t PatchStagePersistentBytesFor(const uint8_t* options, size_t length) {
  PatchStageSizes sizes;
  PatchStageOptionsError error;
  if (!ReadPatchStageSizes(options, length, &sizes, &error)) return 0;
  return PatchStagePersistentBytes(sizes.num_tensors, sizes.num_layers, sizes.params_bytes);
}

TFLMRegistration* Register_TFMCU_PATCH_STAGE() {
  static TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tfmcu
