/* Self-test firmware: the harness and toolchain on their own, before any patch kernel.
 *
 * Runs an int8 3x3 convolution (TFLite CONV_2D semantics: NHWC input, OHWI weights, SAME padding, stride 1,
 * int32 bias, per-channel requantization with TFLite's MultiplyByQuantizedMultiplier, output zero point,
 * clamp to int8) over a test pattern that tools/gen/gen_selftest.py generated together with the expected result,
 * computed independently on the host in Python. It reports the FNV-1a hash and sum of the output, the MAC
 * count, and, through the harness, the instruction count of the convolution, stack high-water mark and RAM.
 * The Bazel test compares checksum and sum with the host's (tools/qemu/run_firmware.py --expect).
 */
#include <stdint.h>

#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/firmware/selftest_data.h"

#define OUT_SIZE (SELFTEST_H * SELFTEST_W * SELFTEST_COUT)

static int8_t g_output[OUT_SIZE];

/* TFLite's gemmlowp-style fixed-point helpers (reference semantics, bit-exact). */
static int32_t saturating_rounding_doubling_high_mul(int32_t a, int32_t b) {
    if (a == b && a == INT32_MIN) return INT32_MAX;
    int64_t ab = (int64_t)a * (int64_t)b;
    int64_t nudge = ab >= 0 ? (1LL << 30) : (1 - (1LL << 30));
    return (int32_t)((ab + nudge) / (1LL << 31));
}

static int32_t rounding_divide_by_pot(int32_t x, int exponent) {
    int32_t mask = (int32_t)((1LL << exponent) - 1);
    int32_t remainder = x & mask;
    int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

static int32_t multiply_by_quantized_multiplier(int32_t x, int32_t multiplier, int shift) {
    int left = shift > 0 ? shift : 0;
    int right = shift > 0 ? 0 : -shift;
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x * (1 << left), multiplier), right);
}

static void conv3x3_s1_same(const int8_t *input, const int8_t *weights, const int32_t *bias, const int32_t *mult,
                            const int32_t *shift, int32_t input_offset, int32_t output_offset, int8_t *output) {
    for (int y = 0; y < SELFTEST_H; y++) {
        for (int x = 0; x < SELFTEST_W; x++) {
            for (int oc = 0; oc < SELFTEST_COUT; oc++) {
                int32_t acc = bias[oc];
                for (int ky = 0; ky < 3; ky++) {
                    int iy = y + ky - 1;
                    if (iy < 0 || iy >= SELFTEST_H) continue;
                    for (int kx = 0; kx < 3; kx++) {
                        int ix = x + kx - 1;
                        if (ix < 0 || ix >= SELFTEST_W) continue;
                        const int8_t *in = input + (iy * SELFTEST_W + ix) * SELFTEST_CIN;
                        const int8_t *w = weights + ((oc * 3 + ky) * 3 + kx) * SELFTEST_CIN;
                        for (int ic = 0; ic < SELFTEST_CIN; ic++) acc += (in[ic] + input_offset) * w[ic];
                    }
                }
                int32_t v = multiply_by_quantized_multiplier(acc, mult[oc], shift[oc]) + output_offset;
                if (v < -128) v = -128;
                if (v > 127) v = 127;
                output[(y * SELFTEST_W + x) * SELFTEST_COUT + oc] = (int8_t)v;
            }
        }
    }
}

int main(void) {
    /* An empty region: what the markers themselves cost (subtract it when exactness matters). */
    tfmcu_region_begin("empty");
    tfmcu_region_end();

    tfmcu_region_begin("conv3x3");
    conv3x3_s1_same(selftest_input, selftest_weights, selftest_bias, selftest_mult, selftest_shift,
                    SELFTEST_INPUT_OFFSET, SELFTEST_OUTPUT_OFFSET, g_output);
    tfmcu_region_end();

    int64_t sum = 0;
    for (int i = 0; i < OUT_SIZE; i++) sum += g_output[i];

    tfmcu_result_begin("conv3x3_selftest");
    tfmcu_result_hex32("checksum", tfmcu_fnv1a32(g_output, sizeof g_output));
    tfmcu_result_int("output_sum", sum);
    tfmcu_result_int("macs", (int64_t)SELFTEST_H * SELFTEST_W * SELFTEST_COUT * 9 * SELFTEST_CIN);
    return tfmcu_result_end();
}
