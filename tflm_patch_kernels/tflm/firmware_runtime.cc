// What a freestanding C++ link of TFLM needs on the MCU (no libstdc++ library, newlib-nano): TFLM's DebugLog through
// the harness's semihosting output, and the few C++ runtime symbols its classes reference. Nothing allocates: a
// call to operator new / delete or a pure virtual function is a bug and stops the firmware.
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensorflow/lite/micro/debug_log.h"
#include "tflm_patch_kernels/firmware/harness.h"

extern "C" void DebugLog(const char* format, va_list args) {
  char line[256];
  vsnprintf(line, sizeof(line), format, args);
  tfmcu_puts(line);
}

extern "C" int DebugVsnprintf(char* buffer, size_t buf_size, const char* format, va_list vlist) {
  return vsnprintf(buffer, buf_size, format, vlist);
}

extern "C" void __cxa_pure_virtual(void) {
  tfmcu_puts("pure virtual call\n");
  abort();
}

void operator delete(void* p) noexcept {
  (void)p;
  tfmcu_puts("operator delete called\n");
  abort();
}

void operator delete(void* p, size_t n) noexcept {
  (void)p;
  (void)n;
  tfmcu_puts("operator delete called\n");
  abort();
}

// How many leading ops firmware_main.cc measures as the cost region "stage": 0 unless the generated model source
// defines it (tools/gen/gen_model_whole.py; a strong definition wins over this weak one).
extern "C" __attribute__((weak)) const unsigned int g_tfmcu_stage_ops = 0;

// Rows of each input image when the model's TFMCU_PATCH_STAGE streams its input (firmware_main.cc then feeds the
// images' rows from Flash through a TfmcuInputProvider); 0 for a model that reads its input tensor.
extern "C" __attribute__((weak)) const unsigned int g_tfmcu_stream_rows = 0;
