/* The TFMCU_PATCH_STAGE custom options (a flexbuffer map written by tfmcu/tflite/patch_stage_format.py; its keys
 * and format versions are stated in tfmcu/abi.py) parsed by a pure function: bytes in, the few settings the kernel
 * keeps or a one-line error out, no TfLiteContext. The kernel's Init calls it (patch_stage_op.cc), and the fuzzer
 * calls it directly (fuzz_options.cc). The options come from an untrusted file: every field is checked, and nothing
 * is read outside `buffer`.
 *
 * Format 4: the stage itself is not in the options but in the op's constant input kPatchStageBlobInput, a stage
 * blob (patch_stage_types.h) that Prepare and Eval read in place; the options hold the format version and how the
 * stage gets its input (streamed_input, input_window_bytes). Other keys (the stage's name, its layers' names and
 * padding: what tfmcu's tools read back) are not the kernel's. Formats 2 and 3 (the stage in the options, its
 * params structs copied into the arena) are not read any more: rewrite such a model.
 *
 *   PatchStageOptions options;
 *   PatchStageOptionsError error;
 *   if (!ParsePatchStageOptions(buffer, length, &options, &error)) ...   // error.message says why
 */
#ifndef TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_
#define TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_

#include <stddef.h>
#include <stdint.h>

#include "tflm_patch_kernels/patch_stage.h"

namespace tfmcu {

// The custom options format this kernel reads (tfmcu.abi.FORMAT_VERSION / OLDEST_FORMAT_VERSION).
inline constexpr int kPatchStageFormatVersion = 5;  // the stage as a stage blob of ABI 8 (the op's constant input)
inline constexpr int kPatchStageOldestFormatVersion = 5;

// The op's input holding the stage blob (tfmcu.abi.BLOB_INPUT); input 0 is the stage input.
inline constexpr int kPatchStageBlobInput = 1;

// The parsed options.
struct PatchStageOptions {
  int32_t version;
  int32_t streamed_input;      // 1: the stage input comes from a TfmcuInputProvider (patch_stage_op.h)
  int32_t input_window_bytes;  // the streamed window the options state (0 when absent), checked against the stage's
};

// What is wrong with the options: one line, without the op's name.
struct PatchStageOptionsError {
  char message[128];
};

// Parses and checks the options. False (and `error`) when the buffer is not a flexbuffer map of a supported format
// version or its streamed input settings are not ints of the right range.
bool ParsePatchStageOptions(const uint8_t* buffer, size_t length, PatchStageOptions* options,
                            PatchStageOptionsError* error);

}  // namespace tfmcu

#endif  // TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_
