// Whole-model firmware: a .tflite (builtin ops only, or custom mode with TFMCU_PATCH_STAGE) in TFLM's
// MicroInterpreter on the MCU, the model in Flash, the arena in RAM (TFMCU_ARENA_BYTES, counted in the target's SRAM
// budget by the link). Prints one TFMCU_RESULT line (tools/qemu/run_firmware.py): the FNV-1a hash of the output
// bytes, arena_used_bytes, and the harness's .data/.bss, stack high-water mark and the instruction count of Invoke
// (the "invoke" region).
#include <string.h>

#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/tflm/firmware_model.h"
#include "tflm_patch_kernels/tflm/patch_stage_op.h"

#ifndef TFMCU_ARENA_BYTES
#error "TFMCU_ARENA_BYTES: the tensor arena's size (bytes)"
#endif

namespace {

alignas(16) uint8_t g_arena[TFMCU_ARENA_BYTES];

// The ops of the zoo models, and the patch stage.
using Resolver = tflite::MicroMutableOpResolver<16>;

void AddOps(Resolver* r) {
  r->AddAdd();
  r->AddAveragePool2D();
  r->AddConcatenation();
  r->AddConv2D();
  r->AddDepthwiseConv2D();
  r->AddDequantize();
  r->AddFullyConnected();
  r->AddMaxPool2D();
  r->AddMean();
  r->AddPad();
  r->AddQuantize();
  r->AddReshape();
  r->AddSoftmax();
  r->AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE());
}

}  // namespace

int main(void) {
  tfmcu_result_begin("tflm_whole_model");
  const tflite::Model* model = tflite::GetModel(g_tfmcu_model);
  Resolver resolver;
  AddOps(&resolver);
  tflite::MicroInterpreter interpreter(model, resolver, g_arena, sizeof(g_arena));
  if (interpreter.AllocateTensors() != kTfLiteOk) {
    tfmcu_result_int("arena_bytes", static_cast<int64_t>(sizeof(g_arena)));
    tfmcu_fail("AllocateTensors failed (arena too small for this model?)");
    return tfmcu_result_end();
  }
  TfLiteTensor* input = interpreter.input(0);
  if (input == nullptr || input->bytes != g_tfmcu_input_len) {
    tfmcu_fail("input size differs from the generated input");
    return tfmcu_result_end();
  }
  memcpy(input->data.raw, g_tfmcu_input, g_tfmcu_input_len);
  tfmcu_region_begin("invoke");
  const TfLiteStatus status = interpreter.Invoke();
  tfmcu_region_end();
  if (status != kTfLiteOk) {
    tfmcu_fail("Invoke failed");
    return tfmcu_result_end();
  }
  const TfLiteTensor* output = interpreter.output(0);
  if (output == nullptr || output->bytes != g_tfmcu_output_len) {
    tfmcu_fail("output size differs from TF Lite's");
    return tfmcu_result_end();
  }
  tfmcu_result_hex32("output_fnv1a32", tfmcu_fnv1a32(output->data.raw, output->bytes));
  tfmcu_result_int("arena_used_bytes", static_cast<int64_t>(interpreter.arena_used_bytes()));
  tfmcu_result_int("arena_bytes", static_cast<int64_t>(sizeof(g_arena)));
  tfmcu_result_int("model_bytes", static_cast<int64_t>(g_tfmcu_model_len));
  return tfmcu_result_end();
}
