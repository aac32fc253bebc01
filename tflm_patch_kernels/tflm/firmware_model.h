/* What tools/gen/gen_model_whole.py generates for firmware_main.cc: the model (Flash), a test input and the output
 * size. */
#ifndef TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_
#define TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_

extern const unsigned char g_tfmcu_model[];
extern const unsigned int g_tfmcu_model_len;
extern const unsigned char g_tfmcu_input[];
extern const unsigned int g_tfmcu_input_len;
extern const unsigned int g_tfmcu_output_len;

#endif  /* TFMCU_PATCH_KERNELS_TFLM_FIRMWARE_MODEL_H_ */
