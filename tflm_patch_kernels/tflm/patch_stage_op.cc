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

using OpData = TfmcuPatchStageOpData;

// A kernel error: one line naming the op, then kTfLiteError.
#define TFMCU_OP_FAIL(...)                            \
  do {                                                \
    MicroPrintf("TFMCU_PATCH_STAGE: " __VA_ARGS__);   \
    return kTfLiteError;                              \
  } while (0)

void* Init(TfLiteContext* context, const char* buffer, size_t length) {
  PatchStageOptions options;
  PatchStageOptionsError error;
  if (!ParsePatchStageOptions(reinterpret_cast<const uint8_t*>(buffer), length, &options, &error)) {
    MicroPrintf("TFMCU_PATCH_STAGE: %s", error.message);
    return nullptr;
  }
  void* mem = context->AllocatePersistentBuffer(context, sizeof(OpData));
  if (mem == nullptr) {
    MicroPrintf("TFMCU_PATCH_STAGE: cannot allocate %d persistent bytes", static_cast<int>(sizeof(OpData)));
    return nullptr;
  }
  OpData* data = static_cast<OpData*>(mem);
  memset(data, 0, sizeof(OpData));
  data->scratch_index = -1;
  data->streamed_input = options.streamed_input;
  data->input_window_bytes = options.input_window_bytes;
  return data;
}

// The stage blob (input kPatchStageBlobInput) in Prepare: a constant UINT8 tensor, 4-byte aligned in the model,
// viewed as a stage (tfmcu_stage_view: its tables inside it).
TfLiteStatus ViewBlob(TfLiteContext* context, TfLiteNode* node, TfmcuStage* stage) {
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* t = micro_context->AllocateTempInputTensor(node, kPatchStageBlobInput);
  if (t == nullptr) TFMCU_OP_FAIL("the stage blob (input %d) is missing", kPatchStageBlobInput);
  const bool constant = t->allocation_type == kTfLiteMmapRo && t->data.data != nullptr;
  const TfLiteType type = t->type;
  const size_t bytes = t->bytes;
  const void* blob = t->data.data;
  micro_context->DeallocateTempTfLiteTensor(t);
  if (!constant || type != kTfLiteUInt8) {
    TFMCU_OP_FAIL("the stage blob (input %d) must be a constant UINT8 tensor", kPatchStageBlobInput);
  }
  if (reinterpret_cast<uintptr_t>(blob) % 4 != 0) {
    TFMCU_OP_FAIL("the stage blob (input %d) is not 4-byte aligned in the model", kPatchStageBlobInput);
  }
  if (tfmcu_stage_view(blob, bytes, stage) != kTfmcuOk) {
    TFMCU_OP_FAIL("the stage blob (input %d, %d bytes) is malformed: a table outside it", kPatchStageBlobInput,
                  static_cast<int>(bytes));
  }
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

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  OpData* data = static_cast<OpData*>(node->user_data);
  if (data == nullptr) TFMCU_OP_FAIL("Init failed (see the message above)");
  if (node->inputs->size != 2 || node->outputs->size != 1) {
    TFMCU_OP_FAIL("the op needs 2 inputs (the stage input and the stage blob) and 1 output, not %d and %d",
                  node->inputs->size, node->outputs->size);
  }
  TfmcuStage view;  // (not `s`: TF_LITE_ENSURE_OK declares one)
  TF_LITE_ENSURE_OK(context, ViewBlob(context, node, &view));
  int32_t failed_layer = -1;
  const TfmcuStatus status = tfmcu_stage_prepare(&view, &data->prepared, &failed_layer);
  data->prepared.stage = nullptr;  // `view` ends here: Eval views the blob again
  if (status != kTfmcuOk) {
    TFMCU_OP_FAIL("invalid stage description (status %d, layer %d)", static_cast<int>(status),
                  static_cast<int>(failed_layer));
  }
  const int32_t window = data->input_window_bytes;
  if (data->streamed_input && static_cast<uint32_t>(window) != data->prepared.input_window_bytes) {
    TFMCU_OP_FAIL("streamed input: input_window_bytes %d, the stage's window is %d bytes (0: it cannot stream)",
                  static_cast<int>(window), static_cast<int>(data->prepared.input_window_bytes));
  }

  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, 0);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, 0);
  TfLiteStatus io = kTfLiteOk;
  if (!data->streamed_input) {
    io = CheckIo(input, view.tensors[view.input_tensor], "input");
  } else if (input == nullptr || input->type != kTfLiteInt8 || input->bytes != 1) {
    MicroPrintf("TFMCU_PATCH_STAGE: streamed input: input 0 must be the one-element int8 placeholder");
    io = kTfLiteError;
  }
  if (io == kTfLiteOk) io = CheckIo(output, view.tensors[view.output_tensor], "output");
  if (input != nullptr) micro_context->DeallocateTempTfLiteTensor(input);
  if (output != nullptr) micro_context->DeallocateTempTfLiteTensor(output);
  TF_LITE_ENSURE_OK(context, io);
  const size_t bytes = data->streamed_input ? data->prepared.streamed_scratch_bytes : data->prepared.scratch_bytes;
  data->scratch_index = -1;
  if (bytes == 0) return kTfLiteOk;  // no intermediate tensor (one layer): no scratch buffer at all
  int index = -1;  // (int32_t is long on arm-none-eabi; the API takes an int)
  TF_LITE_ENSURE_OK(context, micro_context->RequestScratchBufferInArena(bytes, &index));
  data->scratch_index = static_cast<int32_t>(index);
  return kTfLiteOk;
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  OpData* data = static_cast<OpData*>(node->user_data);
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* blob = tflite::micro::GetEvalInput(context, node, kPatchStageBlobInput);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  // The stage Prepare validated, viewed again from the constant blob (a few words on the stack, not in the arena).
  TfmcuStage stage;
  if (tfmcu_stage_view(blob->data.data, static_cast<size_t>(tflite::micro::GetTensorShape(blob).FlatSize()),
                       &stage) != kTfmcuOk) {
    TFMCU_OP_FAIL("the stage blob changed after Prepare");
  }
  data->prepared.stage = &stage;
  void* scratch = data->scratch_index >= 0 ? context->GetScratchBuffer(context, data->scratch_index) : nullptr;
  TfmcuStatus status;
  if (data->streamed_input) {
    const auto* provider =
        static_cast<const TfmcuInputProvider*>(tflite::GetMicroContext(context)->external_context());
    if (provider == nullptr) {
      data->prepared.stage = nullptr;
      TFMCU_OP_FAIL("streamed input: no TfmcuInputProvider registered (MicroInterpreter::SetMicroExternalContext)");
    }
    status = tfmcu_stage_run_streamed(&data->prepared, provider, output->data.int8, static_cast<uint8_t*>(scratch),
                                      data->prepared.streamed_scratch_bytes);
  } else {
    status = tfmcu_stage_run(&data->prepared, input->data.data, output->data.int8, static_cast<uint8_t*>(scratch),
                             data->prepared.scratch_bytes);
  }
  data->prepared.stage = nullptr;
  if (status != kTfmcuOk) TFMCU_OP_FAIL("stage run failed (status %d)", static_cast<int>(status));
  return kTfLiteOk;
}

}  // namespace

size_t PatchStagePersistentBytesFor(const uint8_t* options, size_t length) {
  PatchStageOptions parsed;
  PatchStageOptionsError error;
  return ParsePatchStageOptions(options, length, &parsed, &error) ? sizeof(OpData) : 0;
}

TFLMRegistration* Register_TFMCU_PATCH_STAGE() {
  static TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tfmcu
