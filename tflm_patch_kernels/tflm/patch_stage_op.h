/* TFMCU_PATCH_STAGE: the patch stage of a custom-mode model (tfmcu rewrite --mode=custom) as a TFLM kernel.
 *
 *   #include "tflm_patch_kernels/tflm/patch_stage_op.h"
 *   resolver.AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE());
 *
 * Init allocates the op data and parses the op's flexbuffer options into it (patch_stage_options.h: format versions
 * kPatchStageOldestFormatVersion..kPatchStageFormatVersion, stated in tfmcu/abi.py, written by tfmcu/stage/custom.py);
 * Prepare binds the stage to the op's tensors (weights, biases, multipliers and the span / buffer-offset / halo tables
 * are read in place from the model), validates it once (tfmcu_stage_prepare) and requests the exact scratch memory in the arena;
 * Eval runs the stage. The options come from an untrusted file: every field is checked, and a bad one gives
 * kTfLiteError with a MicroPrintf naming it, never an out-of-bounds access.
 */
#ifndef TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OP_H_
#define TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OP_H_

#include <stddef.h>
#include <stdint.h>

#include "tensorflow/lite/micro/micro_common.h"
#include "tflm_patch_kernels/tflm/patch_stage_options.h"  // kPatchStageFormatVersion, the options parser

namespace tfmcu {

inline constexpr char kPatchStageOpName[] = "TFMCU_PATCH_STAGE";

// Streamed input (options streamed_input = 1, tfmcu.stage.custom.rewrite_custom(..., streamed_input=True)): the op's
// input 0 is a one-element int8 placeholder (the model's input), the arena holds no image, and Eval reads the stage
// input row band by row band from the TfmcuInputProvider (patch_stage.h) the application registers before Invoke:
//     static TfmcuInputProvider camera = {ReadCameraRows, &camera_state};
//     interpreter.SetMicroExternalContext(&camera);   // once; the interpreter's one external context
// Eval fails with a one-line message when none is registered.

// Like TFLM's own custom ops (Register_DETECTION_POSTPROCESS): a pointer to one registration, which AddCustom copies.
TFLMRegistration* Register_TFMCU_PATCH_STAGE();

// The persistent arena bytes the kernel allocates for a stage of `num_tensors` tensors and `num_layers` layers
// whose params structs take `params_bytes` (the op data; the stage's constants stay in the model).
size_t PatchStagePersistentBytes(int num_tensors, int num_layers, size_t params_bytes);

// The persistent bytes Init allocates for these custom options (0 when their format version, tensor / layer lists or
// layer types are invalid: ReadPatchStageSizes): what a deployment reports as the kernel's own share of the arena's
// persistent tail.
size_t PatchStagePersistentBytesFor(const uint8_t* options, size_t length);

}  // namespace tfmcu

#endif  // TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OP_H_
