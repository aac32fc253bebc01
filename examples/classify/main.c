/* Classify one camera frame with the model library (tfmcu_model.h): the first program to run on a board.
 *
 * example_frame.c (written by fit / deploy beside the library: one of the test images, in the float values the model
 * takes) stands in for the camera. The program quantizes it into the model's input -- or, for a model whose first
 * stage streams its input, hands the stage a row reader that quantizes each row as it is asked for -- runs the model
 * once, and prints the top classes, the time the invoke took and a hash of the output bytes (to compare with TF
 * Lite's: expect.json). Console, timer and startup come from the board support (harness.h). */
#include <stdint.h>

#include "tflm_patch_kernels/firmware/harness.h"
#include "tfmcu_model.h"

#define FRAME_ELEMENTS (TFMCU_MODEL_INPUT_HEIGHT * TFMCU_MODEL_INPUT_WIDTH * TFMCU_MODEL_INPUT_CHANNELS)
extern const float g_example_frame[FRAME_ELEMENTS];

/* One value into the input's type: round half away from zero, then saturate (TF Lite's QUANTIZE). A model whose
 * input scale is not recorded (0) takes the values as they are. */
static int32_t quantize(float x) {
  const float v = TFMCU_MODEL_INPUT_SCALE == 0.0f ? x : x / TFMCU_MODEL_INPUT_SCALE;
  const int32_t q = (int32_t)(v < 0.0f ? v - 0.5f : v + 0.5f) + TFMCU_MODEL_INPUT_ZERO_POINT;
  const int32_t lo = TFMCU_MODEL_INPUT_TYPE == 3 ? 0 : -128, hi = TFMCU_MODEL_INPUT_TYPE == 3 ? 255 : 127;
  return q < lo ? lo : (q > hi ? hi : q);
}

static void to_input(const float* values, uint32_t n, void* destination) {
  for (uint32_t i = 0; i < n; ++i) {
    if (TFMCU_MODEL_INPUT_TYPE == 1) {
      ((float*)destination)[i] = values[i];
    } else {
      ((int8_t*)destination)[i] = (int8_t)quantize(values[i]);
    }
  }
}

/* A streamed input: rows [row, row + count) of the frame, as a camera driver would deliver them. */
static int read_rows(void* context, int32_t row, int32_t count, void* destination) {
  const uint32_t row_elements = TFMCU_MODEL_INPUT_WIDTH * TFMCU_MODEL_INPUT_CHANNELS;
  to_input((const float*)context + (uint32_t)row * row_elements, (uint32_t)count * row_elements, destination);
  return 0;
}

/* Score i of an int8, uint8 or float32 output. */
static float score(const void* scores, int32_t type, int32_t i) {
  return type == 1 ? ((const float*)scores)[i] : type == 3 ? ((const uint8_t*)scores)[i] : ((const int8_t*)scores)[i];
}

static void print_value(const char* label, int64_t value, const char* unit) {
  tfmcu_puts(label);
  tfmcu_put_i64(value);
  tfmcu_puts(unit);
}

int main(void) {
  tfmcu_model_status status = tfmcu_model_init();
  int8_t* input = tfmcu_model_input(0);
  if (status == TFMCU_MODEL_OK && input != 0) {
    to_input(g_example_frame, FRAME_ELEMENTS, input);
  } else if (status == TFMCU_MODEL_OK) {
    status = tfmcu_model_set_row_reader(read_rows, (void*)g_example_frame);
  }
  const uint32_t start = tfmcu_ticks();
  if (status == TFMCU_MODEL_OK) status = tfmcu_model_invoke();
  const uint32_t ticks = tfmcu_ticks() - start;
  if (status != TFMCU_MODEL_OK) {
    tfmcu_puts("classify: ");
    tfmcu_puts(tfmcu_model_status_string(status));
    tfmcu_puts("\n");
    return 1;
  }

  tfmcu_model_tensor out;
  const void* scores = tfmcu_model_output(0, &out);
  const int32_t classes = (int32_t)(out.type == 1 ? out.bytes / 4 : out.bytes);
  int32_t top[3] = {-1, -1, -1};  /* the three largest scores, best first */
  for (int32_t i = 0; i < classes; ++i) {
    for (int k = 0; k < 3; ++k) {
      if (top[k] < 0 || score(scores, out.type, i) > score(scores, out.type, top[k])) {
        for (int j = 2; j > k; --j) top[j] = top[j - 1];
        top[k] = i;
        break;
      }
    }
  }
  for (int k = 0; k < 3 && top[k] >= 0; ++k) {
    print_value(k == 0 ? "top-1: class " : "top-", k == 0 ? top[k] : k + 1, "");
    if (k > 0) print_value(": class ", top[k], "");
    /* the score in thousandths: dequantized (real = scale x (q - zero_point)), or the float output */
    const float real = out.type == 1 ? score(scores, 1, top[k])
                                     : out.scale * (score(scores, out.type, top[k]) - (float)out.zero_point);
    print_value(", score ", (int64_t)(real * 1000.0f), "/1000\n");
  }
  print_value("invoke: ", ticks, " ticks of the board's timer");
  if (tfmcu_ticks_hz() != 0) {
    print_value(" = ", (int64_t)((uint64_t)ticks * 1000000u / tfmcu_ticks_hz()), " us");
    print_value(" at ", tfmcu_ticks_hz(), " Hz");
  } else {
    tfmcu_puts(" (the core's cycles)");
  }
  print_value("\narena used: ", (int64_t)tfmcu_model_arena_used_bytes(), " B\n");
  tfmcu_puts("output fnv1a32: ");
  tfmcu_put_hex32(tfmcu_fnv1a32(scores, out.bytes));
  tfmcu_puts("\n");
  return 0;
}
