/* tfmcu model library: one model, ready to run on the MCU, behind a small C API (callable from C and C++).
 *
 * `fit` and `deploy` write it beside the firmware (<out_dir>/firmware/model/): this header, tfmcu_model.cc (the
 * implementation over TFLM's MicroInterpreter and tfmcu's kernels), model_data.cc (the model in Flash and its op
 * resolver) and tfmcu_model_config.h (the model's sizes and input quantization as macros). It builds as a static
 * library with Bazel (the folder's :model, :libtfmcu_model) and with CMake (deploy --tree: the target tfmcu_model).
 *
 *   #include "tfmcu_model.h"
 *   if (tfmcu_model_init() != TFMCU_MODEL_OK) ...;
 *   int8_t* in = tfmcu_model_input(NULL);            // fill it: TFMCU_MODEL_INPUT_BYTES quantized bytes
 *   if (tfmcu_model_invoke() != TFMCU_MODEL_OK) ...;
 *   tfmcu_model_tensor out;
 *   const int8_t* scores = (const int8_t*)tfmcu_model_output(0, &out);
 *
 * A model whose first patch stage streams its input (TFMCU_MODEL_STREAM_ROWS > 0) has no input buffer: before each
 * invoke give a row reader (tfmcu_model_set_row_reader), which the stage calls for the image rows in increasing
 * order, each row at most once (a camera's line buffer). The arena (TFMCU_MODEL_ARENA_BYTES, in .bss) and, where the
 * board has a second RAM region, TFLM's persistent data (TFMCU_MODEL_PERSISTENT_BYTES, section .tfmcu_persistent,
 * placed by the board's linker script) are static: the library never allocates. Not reentrant: one model instance.
 */
#ifndef TFMCU_MODEL_H_
#define TFMCU_MODEL_H_

#include <stddef.h>
#include <stdint.h>

#ifndef TFMCU_MODEL_CONFIG_FROM_FLAGS /* (a test build gives the sizes as -D flags instead) */
#include "tfmcu_model_config.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TFMCU_MODEL_OK = 0,
  TFMCU_MODEL_ERROR_RESOLVER = 1,  /* an op's registration failed */
  TFMCU_MODEL_ERROR_ALLOCATE = 2,  /* AllocateTensors failed: the arena is too small (TFLM's message says by how much) */
  TFMCU_MODEL_ERROR_STATE = 3,     /* called before tfmcu_model_init succeeded */
  TFMCU_MODEL_ERROR_INPUT = 4,     /* the input is not the model's (size), or a streamed model has no row reader */
  TFMCU_MODEL_ERROR_INVOKE = 5,    /* an op failed during Invoke (TFLM's message names it) */
  TFMCU_MODEL_ERROR_ROWS = 6       /* the row reader failed, or was asked for rows out of order */
} tfmcu_model_status;

/* An input or output tensor: its element type (TFLite's TensorType numbering: 1 float32, 3 uint8, 9 int8), bytes,
 * shape, and affine quantization (real = scale x (q - zero_point); scale 0: not quantized). */
typedef struct {
  int32_t type;
  uint32_t bytes;
  int32_t num_dims;
  int32_t dims[6];
  float scale;
  int32_t zero_point;
} tfmcu_model_tensor;

/* Streamed input: copy rows [row_start, row_start + row_count) of the image -- TFMCU_MODEL_INPUT_ROW_BYTES bytes
 * each, quantized as the input (TFMCU_MODEL_INPUT_SCALE / _ZERO_POINT), NHWC -- to `destination`; return 0 (any
 * other value stops the invoke with TFMCU_MODEL_ERROR_ROWS). */
typedef int (*tfmcu_model_read_rows)(void* context, int32_t row_start, int32_t row_count, void* destination);

/* Creates the interpreter over the static arena and allocates the tensors. Call once (again: TFMCU_MODEL_OK). */
tfmcu_model_status tfmcu_model_init(void);

/* The input buffer (TFMCU_MODEL_INPUT_BYTES) and, if `info` is not NULL, its description; NULL before init and
 * for a streamed input (its rows come from the row reader). */
int8_t* tfmcu_model_input(tfmcu_model_tensor* info);

/* A streamed input's row reader (ignored by a model that is not streamed). */
tfmcu_model_status tfmcu_model_set_row_reader(tfmcu_model_read_rows read_rows, void* context);

/* Runs the model once on the input. */
tfmcu_model_status tfmcu_model_invoke(void);

/* Output `index` (0 .. TFMCU_MODEL_NUM_OUTPUTS - 1) and, if `info` is not NULL, its description; NULL if there is
 * no such output or before init. */
const void* tfmcu_model_output(uint32_t index, tfmcu_model_tensor* info);

/* The arena bytes TFLM uses (MicroInterpreter::arena_used_bytes; 0 before init). */
size_t tfmcu_model_arena_used_bytes(void);

/* A short English description of a status. */
const char* tfmcu_model_status_string(tfmcu_model_status status);

/* Where TFLM's messages go (its formatted text, piece by piece as TFLM writes it, line ends included): define this
 * function to print them on your console; the library's default (weak) drops them. */
void tfmcu_model_log(const char* line);

#ifdef __cplusplus
}  /* extern "C" */

namespace tflite {
class MicroProfilerInterface;
class MicroInterpreter;
}  /* namespace tflite */

/* C++ only: tfmcu_model_init with TFLM's profiler hooks (each op's BeginEvent / EndEvent), the interpreter itself
 * (nullptr before init) and the persistent-data buffer (nullptr without one), for tools that need more than the C
 * API (the test firmware's report). */
tfmcu_model_status tfmcu_model_init_profiled(tflite::MicroProfilerInterface* profiler);
tflite::MicroInterpreter* tfmcu_model_interpreter();
const void* tfmcu_model_persistent_buffer();
#endif

#endif /* TFMCU_MODEL_H_ */
