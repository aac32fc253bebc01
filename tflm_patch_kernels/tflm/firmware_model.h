/* What a model's generated source (tfmcu/firmware/sources.py: tools/gen/gen_model_whole.py for the tests, `deploy`
 * for users) provides to firmware_main.cc: the model (Flash), its op resolver with exactly the model's ops (plus
 * TFMCU_PATCH_STAGE when the model uses it), the test inputs and the output size. */
#ifndef TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_
#define TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_

#include "tensorflow/lite/micro/micro_op_resolver.h"

/* Where the model array lives: the Flash (.rodata) by default; -DTFMCU_MODEL_IN_PSRAM puts it in section
 * .tfmcu_psram, which mps2.ld places in the MPS2 boards' 16 MiB PSRAM (for models beyond their 4 MiB code memory). */
#if defined(TFMCU_MODEL_IN_PSRAM)
#define TFMCU_MODEL_STORAGE __attribute__((section(".tfmcu_psram")))
#else
#define TFMCU_MODEL_STORAGE
#endif

extern const unsigned char g_tfmcu_model[];
extern const unsigned int g_tfmcu_model_len;
/* g_tfmcu_num_inputs inputs of g_tfmcu_input_len bytes each, one after the other (the model's input 0). */
extern const unsigned char g_tfmcu_inputs[];
extern const unsigned int g_tfmcu_input_len;
extern const unsigned int g_tfmcu_num_inputs;
/* Bytes of the model's output 0. */
extern const unsigned int g_tfmcu_output_len;

/* The resolver, its ops registered on the first call; nullptr if a registration failed. */
const tflite::MicroOpResolver* tfmcu_model_op_resolver();

#endif  /* TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_ */
