/* TFMCU_PATCH_STAGE: the patch stage of a custom-mode model (tfmcu rewrite --mode=custom) as a TFLM kernel.
 *
 *   #include "tflm_patch_kernels/tflm/patch_stage_op.h"
 *   resolver.AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE());
 *
 * The op's inputs are the stage input and the stage blob (kPatchStageBlobInput: the whole stage description, tables,
 * params and weights, as one constant byte array; patch_stage_types.h), its output the stage output. Init parses the
 * op's flexbuffer options (patch_stage_options.h: format versions kPatchStageOldestFormatVersion..
 * kPatchStageFormatVersion, stated in tfmcu/abi.py) and allocates the op data (TfmcuPatchStageOpData: all the kernel
 * keeps in the arena's persistent tail); Prepare views the blob in place (tfmcu_stage_view), validates the stage once
 * (tfmcu_stage_prepare) and requests the exact scratch memory in the arena; Eval views the blob again and runs the
 * stage. The model comes from an untrusted file: every field is checked, and a bad one gives kTfLiteError with a
 * MicroPrintf naming it, never an out-of-bounds access.
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

// The op data Init allocates: TfmcuPatchStageOpData (patch_stage.h; its size is the kernel's whole share of the
// arena's persistent tail, stated in tfmcu/abi.py).

// Like TFLM's own custom ops (Register_DETECTION_POSTPROCESS): a pointer to one registration, which AddCustom copies.
TFLMRegistration* Register_TFMCU_PATCH_STAGE();

// The persistent arena bytes Init allocates for these custom options: sizeof(TfmcuPatchStageOpData), 0 when the
// options are invalid (ParsePatchStageOptions). What a deployment reports as the kernel's own share of the arena's
// persistent tail.
size_t PatchStagePersistentBytesFor(const uint8_t* options, size_t length);

}  // namespace tfmcu

#endif  // TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OP_H_
