/* Model firmware: runs a model's patch stage with the C executor (tflm_patch_kernels/patch_stage.h), once as a
 * p x p grid of patches and once layer by layer (1 x 1), and reports for each: the output hash (must equal TF
 * Lite's, computed on the host by tools/gen/gen_model_stage.py), the scratch bytes planned and actually touched, the
 * stack high-water mark, and (through the harness's cost regions) the instructions executed.
 *
 * Each schedule is validated once by tfmcu_stage_prepare (outside the cost regions, like a TFLM Prepare), then
 * run by tfmcu_stage_run on the prepared stage (like Eval) twice, on scratch poisoned with 0xA5 and then 0x5A: the
 * highest byte either run changed is the scratch it touched (it must not exceed the plan,
 * tfmcu_stage_scratch_bytes); the two outputs must agree. Only the first run is inside the cost region. The
 * scratch buffer is sized for the larger (per-layer) plan, so .bss shows the per-layer footprint; the patched
 * run's RAM is input + output + its planned scratch + stack.
 */
#include <stdint.h>
#include <string.h>

#include "tflm_patch_kernels/firmware/harness.h"
#include "tflm_patch_kernels/firmware/model_data.h"

typedef struct {
    uint32_t hash;
    uint32_t scratch_touched;
    uint32_t stack_hwm;
    int status;
} RunResult;

static uint32_t touched(uint8_t poison) {
    uint32_t n = tfmcu_model_scratch_bytes;
    while (n > 0 && tfmcu_model_scratch[n - 1] == poison) n--;
    return n;
}

/* Prepares `stage` (outside any cost region); on failure records the status and runs nothing. */
static RunResult prepare(const TfmcuStage *stage, TfmcuPreparedStage *prepared) {
    RunResult r = {0, 0, 0, 0};
    int32_t failed_layer = -1;
    TfmcuStatus s = tfmcu_stage_prepare(stage, prepared, &failed_layer);
    if (s != kTfmcuOk) {
        r.status = (int)s;
        tfmcu_puts("tfmcu_stage_prepare: ");
        tfmcu_puts(tfmcu_status_string(s));
        tfmcu_puts(", layer ");
        tfmcu_put_i64(failed_layer);
        tfmcu_puts("\n");
    }
    return r;
}

static RunResult run(const char *region, const TfmcuPreparedStage *prepared, RunResult r) {
    static const uint8_t poisons[2] = {0xA5, 0x5A};
    if (r.status != 0) return r; /* not prepared */
    for (int k = 0; k < 2; k++) {
        memset(tfmcu_model_scratch, poisons[k], tfmcu_model_scratch_bytes);
        memset(tfmcu_model_output, 0, tfmcu_model_output_bytes);
        if (k == 0) {
            tfmcu_stack_repaint();
            tfmcu_region_begin(region);
        }
        TfmcuStatus s = tfmcu_stage_run(prepared, tfmcu_model_input, tfmcu_model_output, tfmcu_model_scratch,
                                        tfmcu_model_scratch_bytes);
        if (k == 0) {
            tfmcu_region_end();
            r.stack_hwm = tfmcu_stack_hwm();
        }
        uint32_t hash = tfmcu_fnv1a32(tfmcu_model_output, tfmcu_model_output_bytes);
        uint32_t t = touched(poisons[k]);
        if (t > r.scratch_touched) r.scratch_touched = t;
        if (s != kTfmcuOk) {
            r.status = (int)s;
            tfmcu_puts("tfmcu_stage_run: ");
            tfmcu_puts(tfmcu_status_string(s));
            tfmcu_puts("\n");
        }
        if (k == 0) {
            r.hash = hash;
        } else if (hash != r.hash) {
            tfmcu_fail("two runs of the same stage gave different outputs");
        }
    }
    return r;
}

int main(void) {
    memcpy(tfmcu_model_input, tfmcu_model_input_flash, tfmcu_model_input_bytes);

    TfmcuPreparedStage prepared_patched, prepared_layer;
    RunResult patched = prepare(&tfmcu_model_stage_patched, &prepared_patched);
    RunResult layer = prepare(&tfmcu_model_stage_layer, &prepared_layer);
    patched = run("stage_patched", &prepared_patched, patched);
    layer = run("stage_layer", &prepared_layer, layer);

    uint32_t planned_patched = (uint32_t)tfmcu_stage_scratch_bytes(&tfmcu_model_stage_patched);
    uint32_t planned_layer = (uint32_t)tfmcu_stage_scratch_bytes(&tfmcu_model_stage_layer);
    if (patched.status != 0 || layer.status != 0) {
        tfmcu_fail("tfmcu_stage_prepare or tfmcu_stage_run returned an error");
    }
    if (patched.scratch_touched > planned_patched) tfmcu_fail("patched run wrote scratch beyond its plan");
    if (layer.scratch_touched > planned_layer) tfmcu_fail("per-layer run wrote scratch beyond its plan");
    if (patched.hash != tfmcu_model_expected_hash) tfmcu_fail("patched output differs from TF Lite's");
    if (layer.hash != tfmcu_model_expected_hash) tfmcu_fail("per-layer output differs from TF Lite's");

    tfmcu_result_begin("model_stage");
    tfmcu_result_str("model", tfmcu_model_name);
    tfmcu_result_str("grid", tfmcu_model_grid);
    tfmcu_result_hex32("expected_hash", tfmcu_model_expected_hash);
    tfmcu_result_hex32("output_hash_patched", patched.hash);
    tfmcu_result_hex32("output_hash_layer", layer.hash);
    tfmcu_result_int("status_patched", patched.status);
    tfmcu_result_int("status_layer", layer.status);
    tfmcu_result_int("scratch_planned_patched", planned_patched);
    tfmcu_result_int("scratch_planned_layer", planned_layer);
    tfmcu_result_int("scratch_touched_patched", patched.scratch_touched);
    tfmcu_result_int("scratch_touched_layer", layer.scratch_touched);
    tfmcu_result_int("stack_hwm_patched", patched.stack_hwm);
    tfmcu_result_int("stack_hwm_layer", layer.stack_hwm);
    tfmcu_result_int("input_bytes", tfmcu_model_input_bytes);
    tfmcu_result_int("output_bytes", tfmcu_model_output_bytes);
    tfmcu_result_int("scratch_buffer_bytes", tfmcu_model_scratch_bytes);
    tfmcu_result_int("macs_patched", tfmcu_model_macs_patched);
    tfmcu_result_int("macs_layer", tfmcu_model_macs_layer);
    return tfmcu_result_end();
}
