"""Squeeze-excite inside a patch stage: the stage sweeps its grid in passes (tflm_patch_kernels/patch_stage_types.h).

A small int8 model holds what MobileNetV3 and EfficientNet hold at their input and in their blocks: the Keras
preprocessing (Rescaling: MUL and ADD by constants), hard-swish, swish (LOGISTIC x MUL), two squeeze-excites (a MEAN
kept 4-D, and one flattened and reshaped; a sigmoid and a hard-sigmoid, whose MUL by 1/6 is a constant operand) and a
residual ADD. Stages over one squeeze-excite (two passes), both (three) and both plus the global pool:

* the planner's passes: which op runs in which pass, the ops on whole 1 x 1 tensors after which pass, each band's own
  tile of a squeezed map (a partition), the exact MACs as every op's boxes times the passes it runs in;
* the C executor bit-exact against the stage-output tensor in TF Lite on several grids, with and without halo caches,
  the scratch it touches equal to the packed plan's and the C library's figure;
* the C validation refusing a pass that reads a whole tensor before it is computed, and streaming a stage of passes;
* the rewritten model (one TFMCU_PATCH_STAGE op) bit-exact in TF Lite and in TFLM built from source, its arena
  measured there equal to the prediction for that build;
* an AddressSanitizer + UBSan build running the emitted C of a stage of passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.kernels import binding, codegen, pack  # noqa: E402
from tfmcu.plan import halo, regions  # noqa: E402
from tfmcu.plan.arena import predict_model_arena  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import tflite_all_tensors  # noqa: E402
from tfmcu.stage.custom import rewrite_stages  # noqa: E402
from tfmcu.tflite.editor import fold_static_reshapes  # noqa: E402
from tfmcu.tflite.model import as_model  # noqa: E402


def _se_model() -> bytes:
    import tf_keras
    from tf_keras import layers as L

    from tfmcu.nets.convert import random_representative, to_int8_tflite
    from tfmcu.nets.zoo import random_batchnorm

    def hard_swish(x):
        return L.Activation(lambda v: v * tf_keras.activations.relu(v + 3.0, max_value=6.0) / 6.0)(x)

    tf_keras.backend.clear_session()  # the layers' default names (the fixture finds ops by them) from _1 on
    tf_keras.utils.set_random_seed(1)
    i = tf_keras.Input((24, 24, 3))
    x = L.Rescaling(1 / 127.5, -1)(i)
    x = hard_swish(L.BatchNormalization()(L.Conv2D(8, 3, 2, padding="same")(x)))
    x = L.Activation("swish")(L.BatchNormalization()(L.DepthwiseConv2D(3, padding="same")(x)))
    s = L.GlobalAveragePooling2D(keepdims=True, name="se1_squeeze")(x)
    s = L.Conv2D(8, 1, activation="sigmoid")(L.Conv2D(4, 1, activation="relu")(s))
    x = L.Multiply(name="se1_excite")([x, s])
    x = L.BatchNormalization()(L.Conv2D(8, 1)(x))
    y = hard_swish(L.BatchNormalization()(L.DepthwiseConv2D(3, padding="same")(x)))
    s = L.Reshape((1, 1, 8))(L.GlobalAveragePooling2D(name="se2_squeeze")(y))
    s = L.Conv2D(8, 1)(L.Conv2D(4, 1, activation="relu")(s))
    s = L.Lambda(lambda v: v * (1.0 / 6.0))(L.ReLU(6.0)(L.Lambda(lambda v: v + 3.0)(s)))
    y = L.Conv2D(8, 1)(L.Multiply(name="se2_excite")([y, s]))
    x = L.Add()([x, y])
    x = L.Conv2D(16, 3, 2, padding="same", activation="relu")(x)
    m = random_batchnorm(tf_keras.Model(i, L.Dense(5)(L.GlobalAveragePooling2D()(x))), samples=4)
    data = to_int8_tflite(m, random_representative((24, 24, 3), samples=8, low=0, high=255))
    return fold_static_reshapes(data)[0]  # (the flattened squeeze's reshape: its shape made static)


@pytest.fixture(scope="module")
def se():
    data = _se_model()
    g = from_tflite(data)
    names = [op.name for op in g.ops]
    ends = {"one": names.index("conv2d_3"), "two": names.index("add") + 1}
    ends["pool"] = ends["two"] + 2  # the stride-2 conv and the global pool after it
    return data, g, ends


def test_the_planner_runs_each_op_in_the_passes_that_need_it(se):
    data, g, ends = se
    names = [op.name for op in g.ops]
    s = regions.schedule(g, (2, 2), ops=list(range(ends["two"])))
    p = s.passes
    sq1, sq2 = names.index("se1_squeeze"), names.index("se2_squeeze")
    ex1, ex2 = names.index("se1_excite"), names.index("se2_excite")
    assert p.count == 3 and p.inner == (sq1, sq2)
    assert all(p.masks[i] == 0b111 for i in range(sq1))  # the preprocessing and the first layers: in every pass
    assert p.masks[sq1] == 0b001 and p.masks[ex1] == 0b110 and p.masks[sq2] == 0b010 and p.masks[ex2] == 0b100
    assert all(after == (0 if i < ex1 else 1) for i, after in p.after.items())  # the 1 x 1 layers after pass 0 / 1
    assert g.ops[names.index("se2_squeeze") + 1].type == ir.RESHAPE and names.index("se2_squeeze") + 1 in p.after
    for owns in (s.row_owns, s.col_owns):  # each band's own tile: a partition of the squeezed map
        for r, tiles in owns.items():
            size = g.tensors[g.ops[r].inputs[0]].shape[1]
            assert tiles[0][0] == 0 and tiles[-1][1] == size and all(a[1] == b[0] for a, b in zip(tiles, tiles[1:]))
    exact = 0
    for i in s.stage:
        op = g.ops[i]
        if i in p.after:
            exact += ir.op_macs(g, op)
        elif ir.macs_per_output_pixel(op):
            t = op.outputs[0]
            box = sum(w.need[t][1] - w.need[t][0] for w in s.rows) * sum(w.need[t][1] - w.need[t][0] for w in s.cols)
            exact += p.runs(i) * ir.macs_per_output_pixel(op) * box
    assert s.stage_macs_patched_exact == exact


@pytest.mark.parametrize("end", ["one", "two", "pool"])
@pytest.mark.parametrize("grid", [(2, 2), (3, 2), (4, 4), (1, 3), (6, 1), (6, 6)])
@pytest.mark.parametrize("caches", [False, True])
def test_stages_of_passes_are_bit_exact(se, end, grid, caches):
    """(6, 1) and (6, 6) with caches: the last bands compute nothing new of a cached map whose squeeze still reads
    its own tile there (the cache keeps what earlier bands computed, its held range never shrinks)."""
    data, g, ends = se
    s = regions.schedule(g, grid, ops=list(range(ends[end])))
    h = None
    if caches:
        inter = halo.intermediates(s)
        h = halo.halo_caches(s, inter, inter)
    p = pack.pack_stage(data, g, s, halo=h)
    assert p.num_passes == s.passes.count == {"one": 2, "two": 3, "pool": 3}[end]
    xs = random_inputs(data, 3, seed=2)
    for x in xs:
        want = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor])
        got = binding.run_stage(p, x[0])
        assert np.array_equal(got, want.reshape(got.shape))
    touched, _ = binding.touched_scratch(p, xs[0][0])
    assert touched == p.scratch_bytes == binding.c_scratch_bytes(p)
    assert pack.input_window_bytes(p) == 0  # a stage of passes reads its input in each: it never streams


def test_the_c_validation_refuses_a_whole_tensor_read_too_early(se):
    data, g, ends = se
    s = regions.schedule(g, (2, 2), ops=list(range(ends["one"])))
    p = pack.pack_stage(data, g, s)
    assert binding.check_stage(p) == (0, -1)
    excite = next(k for k, spec in enumerate(p.layers) if spec.name == "se1_excite")
    bad = list(p.layer_passes)
    bad[excite] = (0b11, -1)  # the scaling in pass 0, before the scale exists
    p.layer_passes = bad
    assert binding.check_stage(p) == (3, excite)  # kTfmcuErrorInvalidStage, the offending layer


def test_the_rewritten_model_is_bit_exact_in_tflm_with_the_predicted_arena(se):
    from tfmcu.runtime.host import evaluate

    data, g, ends = se
    s = regions.schedule(g, (3, 3), ops=list(range(ends["two"])))
    result = rewrite_stages(data, g, [(s, None)])
    model = result.model
    xs = random_inputs(data, 4, seed=5)
    original = evaluate(data, xs, tflm=False)
    patched = evaluate(model, xs)  # TF Lite (the stage through ctypes) and TFLM built from source with the kernel
    for a, b, c in zip(original.tflite, patched.tflite, patched.tflm):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[0], c[0])
    assert patched.arena.total == predict_model_arena(as_model(model), build="host").total


def test_asan_ubsan_build_runs_an_emitted_stage_of_passes(se, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("SKIP: no C compiler")
        pytest.skip("no C compiler")
    data, g, ends = se
    s = regions.schedule(g, (3, 2), ops=list(range(ends["pool"])))
    inter = halo.intermediates(s)
    p = pack.pack_stage(data, g, s, halo=halo.halo_caches(s, inter, inter))
    x = random_inputs(data, 1, seed=7)[0]
    want = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor]).reshape(-1)
    body = "\n".join([
        '#include <stdio.h>', '#include <stdlib.h>', '#include <string.h>', '#include "patch_stage.h"',
        codegen.stage_to_c(p, "se_stage", static=True),
        "static const int8_t input[] = {" + ",".join(str(int(v)) for v in np.ravel(x[0])) + "};",
        "static const int8_t expected[] = {" + ",".join(str(int(v)) for v in want) + "};",
        "int main(void) {",
        "  TfmcuPreparedStage prepared;",
        "  if (tfmcu_stage_prepare(&se_stage, &prepared, NULL) != kTfmcuOk) { puts(\"prepare\"); return 1; }",
        "  int8_t* in = malloc(sizeof(input)); int8_t* out = malloc(sizeof(expected));",
        "  void* scratch = malloc(SE_STAGE_SCRATCH_BYTES);",
        "  memcpy(in, input, sizeof(input));",
        "  TfmcuStatus st = tfmcu_stage_run(&prepared, in, out, scratch, SE_STAGE_SCRATCH_BYTES);",
        "  int bad = st != kTfmcuOk || memcmp(out, expected, sizeof(expected)) != 0;",
        "  free(in); free(out); free(scratch);",
        "  puts(bad ? \"FAIL\" : \"ok\");",
        "  return bad;", "}"])
    main_c = tmp_path / "main.c"
    main_c.write_text(body)
    src = binding.source_dir()
    exe = tmp_path / "se_stage"
    flags = ["-std=c99", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror"]
    r = subprocess.run([cc, *flags, "-I", str(src), str(main_c),
                        *[str(f) for f in binding.sources(src) if f.suffix == ".c"], "-o", str(exe)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1"))
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stdout + r.stderr)[-3000:]


@pytest.mark.parametrize("border", ["pad", "strips"])
def test_builtin_mode_unrolls_the_preprocessing_and_activations(se, border):
    """Builtin mode copies the element-wise ops per patch (the Rescaling's MUL / ADD by constants, hard-swish, swish),
    bit-exact in TF Lite and in the tflite-micro wheel; a stage holding a squeeze-excite is refused in one line."""
    from tfmcu.runtime.host import evaluate
    from tfmcu.stage.builtin import rewrite_builtin
    from tfmcu.stage.common import RewriteError

    data, g, ends = se
    names = [op.name for op in g.ops]
    before_se = names.index("se1_squeeze")
    s = regions.schedule(g, (2, 2), ops=list(range(before_se)))
    assert {g.ops[i].attrs.get("tflite_op") for i in s.stage} >= {"MUL", "ADD", "HARD_SWISH", "LOGISTIC"}
    model = rewrite_builtin(data, g, s, border=border).model
    xs = random_inputs(data, 3, seed=3)
    original = evaluate(data, xs, tflm=False)
    patched = evaluate(model, xs)
    for a, b, c in zip(original.tflite, patched.tflite, patched.tflm):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[0], c[0])
    with pytest.raises(RewriteError, match="squeeze-excite.*--mode=custom") as e:
        rewrite_builtin(data, g, regions.schedule(g, (2, 2), ops=list(range(ends["one"]))), border=border)
    assert "\n" not in str(e.value)


def test_the_search_estimate_prices_the_element_wise_ops(se):
    """The stage-plan search's estimate (``stage_plans.segment_instructions``) prices HARD_SWISH, LOGISTIC and MUL
    per layer by TFLM's rows, and in a stage by the portable kernels' rows: a call of ``abi.LUT_MIN_ELEMENTS``
    elements or more through a table (per call and per element), a smaller one element by element."""
    from tfmcu import abi
    from tfmcu.plan import stage_plans
    from tfmcu.plan.latency import stage_overheads

    _, g, _ = se
    costs = stage_overheads("cortex-m7", "cmsis_nn")
    logistic = next(op for op in g.ops if op.attrs.get("tflite_op") == "LOGISTIC" and op.patchable)
    i = g.ops.index(logistic)
    elements = g.tensors[logistic.outputs[0]].nbytes
    per_layer = stage_plans.segment_instructions(g, [i], None, costs)
    assert per_layer == pytest.approx(elements * costs["layer_element"]["LOGISTIC"]) and per_layer > 100 * elements
    c = costs["stage_element"]["LOGISTIC"]
    small, large = abi.LUT_MIN_ELEMENTS - 1, abi.LUT_MIN_ELEMENTS
    assert stage_plans._elementwise(g, logistic, [small], small, costs) == pytest.approx(small * c["out"])
    assert stage_plans._elementwise(g, logistic, [large], large, costs) == pytest.approx(
        c["lut_calls"] + large * c["lut_out"])
    assert c["lut_out"] < c["out"] / 10  # a few instructions per element against the fixed-point function's
    for name in ("HARD_SWISH", "MUL"):
        op = next(op for op in g.ops if op.attrs.get("tflite_op") == name and op.patchable)
        n = g.tensors[op.outputs[0]].nbytes
        got = stage_plans.segment_instructions(g, [g.ops.index(op)], None, costs)
        assert got == pytest.approx(n * costs["layer_element"][name]) and got > 0


def _se_then_wide_model() -> bytes:
    """A squeeze-excite followed by two 5 x 5 depthwise convolutions: row bands of one row with halo caches run ahead
    of the squeeze's own tiles, so the last bands compute nothing new of the squeezed map and read only cached rows."""
    import tf_keras
    from tf_keras import layers as L

    from tfmcu.nets.convert import random_representative, to_int8_tflite
    from tfmcu.nets.zoo import random_batchnorm

    tf_keras.utils.set_random_seed(3)
    i = tf_keras.Input((12, 12, 3))
    x = L.Activation("swish")(L.BatchNormalization()(L.Conv2D(8, 3, padding="same")(i)))
    s = L.GlobalAveragePooling2D(keepdims=True)(x)
    s = L.Conv2D(8, 1, activation="sigmoid")(L.Conv2D(4, 1, activation="relu")(s))
    x = L.Multiply()([x, s])
    x = L.DepthwiseConv2D(5, padding="same", activation="relu")(x)
    x = L.DepthwiseConv2D(5, padding="same", activation="relu")(x)
    x = L.Conv2D(8, 1)(x)
    m = random_batchnorm(tf_keras.Model(i, L.Dense(3)(L.Flatten()(x))), samples=4)
    return to_int8_tflite(m, random_representative((12, 12, 3), samples=8, low=-1, high=1))


@pytest.mark.parametrize("grid", [(12, 1), (6, 1), (12, 12)])
def test_a_cached_map_whose_squeeze_lags_behind_keeps_its_rows(grid):
    data = _se_then_wide_model()
    g = from_tflite(data)
    end = next(i for i, op in enumerate(g.ops) if op.type == ir.RESHAPE or op.type == ir.FULLY_CONNECTED)
    s = regions.schedule(g, grid, ops=list(range(end)))
    inter = halo.intermediates(s)
    h = halo.halo_caches(s, inter, inter)
    p = pack.pack_stage(data, g, s, halo=h)
    assert p.num_passes == 2
    assert binding.check_stage(p) == (0, -1)
    for x in random_inputs(data, 2, seed=4):
        want = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor])
        got = binding.run_stage(p, x[0])
        assert np.array_equal(got, want.reshape(got.shape))
