/* What tools/gen/gen_model_stage.py generates for model_main.c: a model's patch stage packed twice, a test input, the
 * expected output hash (TF Lite's, computed on the host), and the RAM buffers. */
#ifndef TFMCU_FIRMWARE_MODEL_DATA_H_
#define TFMCU_FIRMWARE_MODEL_DATA_H_

#include <stdint.h>

#include "tflm_patch_kernels/patch_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const TfmcuStage tfmcu_model_stage_patched; /* p x p patches */
extern const TfmcuStage tfmcu_model_stage_layer;   /* 1 x 1: each layer computed whole */
extern const char tfmcu_model_name[];
extern const char tfmcu_model_grid[]; /* of the patched stage, e.g. "2x2" */
extern const uint32_t tfmcu_model_input_bytes;
extern const uint32_t tfmcu_model_output_bytes;
extern const uint32_t tfmcu_model_scratch_bytes; /* size of tfmcu_model_scratch: max of both stages' */
extern const uint32_t tfmcu_model_expected_hash; /* FNV-1a of TF Lite's stage output */
extern const int64_t tfmcu_model_macs_patched;   /* MACs the patched run computes (recomputation included) */
extern const int64_t tfmcu_model_macs_layer;
extern const uint8_t tfmcu_model_input_flash[];  /* the test input, in Flash */

/* RAM */
extern uint8_t tfmcu_model_input[];
extern int8_t tfmcu_model_output[];
extern uint8_t tfmcu_model_scratch[];

#ifdef __cplusplus
}
#endif

#endif /* TFMCU_FIRMWARE_MODEL_DATA_H_ */
