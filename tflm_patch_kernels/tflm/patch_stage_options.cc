// The TFMCU_PATCH_STAGE custom options parser: see patch_stage_options.h.
#include "tflm_patch_kernels/tflm/patch_stage_options.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "flatbuffers/flexbuffers.h"
#include "tensorflow/lite/micro/micro_log.h"

namespace tfmcu {
namespace {

// Stores the message in `error` and returns false.
bool Fail(PatchStageOptionsError* error, const char* format, ...) {
  error->message[0] = '\0';
  va_list args;
  va_start(args, format);
  MicroVsnprintf(error->message, sizeof(error->message), format, args);
  va_end(args);
  return false;
}

#define TFMCU_OPTIONS_FAIL(...) return Fail(error, __VA_ARGS__)

// An int that fits int32_t (a flexbuffer int or uint).
bool ToInt32(const flexbuffers::Reference& r, int32_t* out) {
  if (!r.IsIntOrUint()) return false;
  if (r.IsUInt()) {
    const uint64_t v = r.AsUInt64();
    if (v > static_cast<uint64_t>(INT32_MAX)) return false;
    *out = static_cast<int32_t>(v);
    return true;
  }
  const int64_t v = r.AsInt64();
  if (v < INT32_MIN || v > INT32_MAX) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

bool MapInt(const flexbuffers::Map& m, const char* key, int32_t* out) { return ToInt32(m[key], out); }

}  // namespace

bool ParsePatchStageOptions(const uint8_t* buffer, size_t length, PatchStageOptions* options,
                            PatchStageOptionsError* error) {
  *options = PatchStageOptions{0, 0, 0};
  if (buffer == nullptr || length == 0) TFMCU_OPTIONS_FAIL("the op has no custom options");
  if (!flexbuffers::VerifyBuffer(buffer, length)) {
    TFMCU_OPTIONS_FAIL("custom options are not a valid flexbuffer (%d bytes)", static_cast<int>(length));
  }
  flexbuffers::Reference r = flexbuffers::GetRoot(buffer, length);
  if (!r.IsMap()) TFMCU_OPTIONS_FAIL("custom options are not a flexbuffer map");
  const flexbuffers::Map root = r.AsMap();
  if (!MapInt(root, "version", &options->version) || options->version < kPatchStageOldestFormatVersion ||
      options->version > kPatchStageFormatVersion) {
    TFMCU_OPTIONS_FAIL("options format version %d; this kernel reads versions %d..%d (rewrite the model)",
                       static_cast<int>(options->version), kPatchStageOldestFormatVersion, kPatchStageFormatVersion);
  }
  // Streamed input: input 0 is a one-element placeholder; the rows come from the provider.
  if (!root["streamed_input"].IsNull() && (!MapInt(root, "streamed_input", &options->streamed_input) ||
                                           (options->streamed_input != 0 && options->streamed_input != 1))) {
    TFMCU_OPTIONS_FAIL("streamed_input must be 0 or 1");
  }
  if (options->streamed_input &&
      (!MapInt(root, "input_window_bytes", &options->input_window_bytes) || options->input_window_bytes <= 0)) {
    TFMCU_OPTIONS_FAIL("a streamed input needs input_window_bytes > 0");  // checked against the stage's in Prepare
  }
  return true;
}

}  // namespace tfmcu
