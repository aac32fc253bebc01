/* The TFMCU_PATCH_STAGE custom options (a flexbuffer map written by tfmcu/stage/custom.py; its keys, tables and
 * format versions are stated in tfmcu/abi.py) parsed by pure functions: bytes in, a stage description or a
 * one-line error out, no TfLiteContext. The kernel's Init calls them (patch_stage_op.cc), and the fuzzer calls them
 * directly (fuzz_options.cc). The options come from an untrusted file: every field is checked, and nothing is read
 * outside `buffer`.
 *
 *   PatchStageSizes sizes;
 *   PatchStageOptionsError error;
 *   if (!ReadPatchStageSizes(buffer, length, &sizes, &error)) ...            // counts, for the allocation
 *   PatchStageStorage storage = {tensors, layers, params};                    // sized from `sizes`
 *   PatchStageOptions options;
 *   if (!ParsePatchStageOptions(buffer, length, storage, &options, &error)) ...
 *   // options.stage: tensors, layers and their params' scalar words; the constant tables are the op's inputs
 *   // (options.inputs), bound by Prepare.
 */
#ifndef TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_
#define TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_

#include <stddef.h>
#include <stdint.h>

#include "tflm_patch_kernels/patch_stage.h"

namespace tfmcu {

// The custom options format this kernel reads (tfmcu.abi.FORMAT_VERSION / OLDEST_FORMAT_VERSION).
inline constexpr int kPatchStageFormatVersion = 3;  // 3: halo caches (num_caches, row_held, col_held, caches),
                                                    //    streamed input (streamed_input, input_window_bytes)
inline constexpr int kPatchStageOldestFormatVersion = 2;  // 2: no halo caches

// The stage's INT32 tables, constant inputs of the op read in place (TfmcuStage's fields of the same names).
enum PatchStageTable {
  kRowSpansTable,
  kColSpansTable,
  kBufferOffsetsTable,
  kRowHeldTable,  // the halo tables: only when the stage has caches
  kColHeldTable,
  kCachesTable,
  kNumPatchStageTables,
};

// Where an array the stage reads in place is: the op's input position (-1: none) and the elements it must hold.
struct PatchStageInput {
  const char* name;
  int32_t position;
  int32_t elements;
};

// The counts Init allocates for (checked: the format version, the tensor and layer lists and the layers' types).
struct PatchStageSizes {
  int32_t num_tensors;
  int32_t num_layers;
  size_t params_bytes;  // the layers' params structs, each at a pointer-aligned offset (AlignToPointer)
};

// Where ParsePatchStageOptions writes the stage: tensors[num_tensors], layers[num_layers] and params_bytes bytes of
// pointer-aligned memory for the params structs (the sizes ReadPatchStageSizes gives).
struct PatchStageStorage {
  TfmcuTensor* tensors;
  TfmcuLayer* layers;
  uint8_t* params;
};

// The parsed options.
struct PatchStageOptions {
  int32_t version;
  // Tensors, layers (their params hold the scalar words, their arrays are NULL until bound), input / output tensor,
  // grid, scratch_bytes and num_caches; the table pointers are NULL (the op's inputs below).
  TfmcuStage stage;
  int32_t streamed_input;      // 1: the stage input comes from a TfmcuInputProvider (patch_stage_op.h)
  int32_t input_window_bytes;  // the streamed window the options state (0 when absent), checked against the stage's
  PatchStageInput tables[kNumPatchStageTables];  // position -1 for the halo tables of a stage without caches
};

// What is wrong with the options: one line, without the op's name.
struct PatchStageOptionsError {
  char message[128];
};

// The sizes of the stage the options describe. False (and `error`) when the buffer is not a flexbuffer map of a
// supported format version, or its tensor / layer lists or layer types are not.
bool ReadPatchStageSizes(const uint8_t* buffer, size_t length, PatchStageSizes* sizes, PatchStageOptionsError* error);

// Parses and checks the whole options into `storage` and `options`: every field, every layer's inputs, outputs,
// scalar words and array positions, and its params against its tensors' channels (tfmcu_op_info(type)->check).
// What needs the op's tensors (the arrays and tables, their types and sizes) and the stage as a whole
// (tfmcu_stage_prepare) is left to the kernel's Prepare. False (and `error`) when the options are invalid.
bool ParsePatchStageOptions(const uint8_t* buffer, size_t length, const PatchStageStorage& storage,
                            PatchStageOptions* options, PatchStageOptionsError* error);

// Layer `layer`'s params arrays (op table order: filter, bias, output_multiplier, output_shift), from options that
// ParsePatchStageOptions accepted: input positions (-1: none) with their names; elements 0 (they follow from the
// bound params: TfmcuOpInfo.array_sizes).
void ReadPatchStageArrays(const uint8_t* buffer, size_t length, int32_t layer,
                          PatchStageInput arrays[TFMCU_MAX_PARAM_ARRAYS]);

// The tables' input positions and sizes and the streamed window, as ParsePatchStageOptions gives them (from options
// it accepted): what Prepare binds, without keeping a PatchStageOptions in the op data.
void ReadPatchStageTables(const uint8_t* buffer, size_t length, const TfmcuStage& stage,
                          PatchStageInput tables[kNumPatchStageTables], int32_t* input_window_bytes);

// `n` rounded up to pointer alignment: where the op data places each params struct (and each of its parts).
size_t AlignToPointer(size_t n);

}  // namespace tfmcu

#endif  // TFMCU_PATCH_KERNELS_TFLM_PATCH_STAGE_OPTIONS_H_
