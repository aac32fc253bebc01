// What a freestanding C++ link of TFLM needs on the MCU (no libstdc++ library, newlib-nano), for the model library
// (tfmcu_model.h): TFLM's DebugLog through tfmcu_model_log (weak here: dropped unless the application defines it),
// and the few C++ runtime symbols its classes reference. Nothing allocates: a call to operator new / delete or a pure
// virtual function is a bug and stops the core (a trap), whatever the application's C library.
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "tensorflow/lite/micro/debug_log.h"

extern "C" void tfmcu_model_log(const char* line);  // tfmcu_model.h
extern "C" __attribute__((weak)) void tfmcu_model_log(const char* line) { (void)line; }

extern "C" void DebugLog(const char* format, va_list args) {
  char line[256];
  vsnprintf(line, sizeof(line), format, args);
  tfmcu_model_log(line);
}

extern "C" int DebugVsnprintf(char* buffer, size_t buf_size, const char* format, va_list vlist) {
  return vsnprintf(buffer, buf_size, format, vlist);
}

extern "C" void __cxa_pure_virtual(void) {
  tfmcu_model_log("pure virtual call\n");
  __builtin_trap();
}

void operator delete(void* p) noexcept {
  (void)p;
  tfmcu_model_log("operator delete called\n");
  __builtin_trap();
}

void operator delete(void* p, size_t n) noexcept {
  (void)p;
  (void)n;
  tfmcu_model_log("operator delete called\n");
  __builtin_trap();
}

// How many leading ops the test firmware (firmware_main.cc) measures as the cost region "stage": 0 unless the
// generated model source defines it (tools/gen/gen_model_whole.py; a strong definition wins over this weak one).
extern "C" __attribute__((weak)) const unsigned int g_tfmcu_stage_ops = 0;

// Rows of each input image when the model's TFMCU_PATCH_STAGE streams its input (tfmcu_model.cc then gives the
// stage the application's row reader); 0 for a model that reads its input tensor. In a translation unit of its own,
// so that the compiler does not fold the weak default into its readers.
extern "C" __attribute__((weak)) const unsigned int g_tfmcu_stream_rows = 0;
