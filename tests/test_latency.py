"""The latency predictor (tfmcu.plan.latency) against the QEMU instruction counts it was calibrated on
(tfmcu/plan/latency_calibration.json, written by `python -m benchmarks.latency`)."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tfmcu.errors import UsageError
from tfmcu.plan import latency

TOLERANCE = 0.05  # the predictor's promise: every calibrated model within +-5% of its measured Invoke


@pytest.fixture(scope="module")
def data():
    return latency.load_calibration()


def test_every_stored_model_within_5_percent(data):
    rows = latency.accuracy(data)
    assert len(rows) == len(data["runs"]) >= 10
    bad = [r for r in rows if abs(r["error"]) > TOLERANCE]
    assert not bad, "\n".join(f"{r['variant']} {r['core']} {r['kernels']}: measured {r['measured']:,}, predicted "
                              f"{r['predicted']:,} ({100 * r['error']:+.1f}%)" for r in bad)


def test_1x1_convolutions_within_1_percent_each(data):
    """CMSIS-NN's 1x1 product runs a reduction in 16-wide steps, then 4-wide ones, pixels in pairs, each pair of
    filter rows set up per call: every per-layer 1x1 convolution measured (input channels 8 to 960, 9 to 12,544
    pixels) is priced within 1% by its row, not only the whole models within 5%."""
    bad, seen = [], 0
    for r in data["runs"]:
        if r["kernels"] != "cmsis_nn":
            continue
        coef = data["coefficients"][f"{r['core']}/cmsis_nn"]
        for f in r["ops"]:
            if f["type"] == "CONV_2D" and latency.path_of(f, "cmsis_nn") == "CONV_2D:conv_1x1":
                seen += 1
                err = latency.op_cost(f, coef, "cmsis_nn") / f["insns"] - 1
                if abs(err) > 0.01:
                    bad.append(f"{r['variant']} {r['core']} op {f['op']} (cin {f['geometry']['cin']}, "
                               f"{f['pix']:.0f} pixels): {100 * err:+.2f}%")
    assert seen > 100
    assert not bad, "\n".join(bad)


def test_1x1_convolutions_of_one_pixel_within_5_percent_each(data):
    """A squeeze-excite's 1x1 convolutions (one pixel, 2 to 1,024 input channels) run only the product's odd-pixel
    loop: a row of their own, CONV_2D:conv_1x1_pixel. The smallest are a thousand instructions, where the
    requantization's branches on the data weigh a few percent."""
    bad, seen = [], 0
    for r in data["runs"]:
        if r["kernels"] != "cmsis_nn":
            continue
        coef = data["coefficients"][f"{r['core']}/cmsis_nn"]
        for f in r["ops"]:
            if f["type"] == "CONV_2D" and latency.path_of(f, "cmsis_nn", bool(coef.get("mve"))) == \
                    "CONV_2D:conv_1x1_pixel":
                seen += 1
                err = latency.op_cost(f, coef, "cmsis_nn") / f["insns"] - 1
                if abs(err) > TOLERANCE:
                    bad.append(f"{r['variant']} {r['core']} op {f['op']} (cin {f['geometry']['cin']}): "
                               f"{100 * err:+.2f}%")
    assert seen > 50
    assert not bad, "\n".join(bad)


def test_element_wise_rows_on_every_core(data):
    """The element-wise ops of MobileNetV3 and EfficientNet have rows of their own on every core with both kernel
    sets, TFLM's broadcast loops apart ("<TYPE>:broadcast", "<TYPE>:scalar"), and the portable kernels of the patch
    executor rows fitted on their own counts, which every run that counted them agrees with within 2%."""
    rows = ("HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU", "SUB", "MUL", "MUL:broadcast", "MUL:scalar",
            "ADD:scalar", "ADD:broadcast", "SUB:broadcast", "CONV_2D:conv_1x1_pixel")
    for core in latency.CORES:
        for kernels in latency.KERNELS:
            coef = data["coefficients"][f"{core}/{kernels}"]
            missing = [r for r in rows if r not in coef["ops"] and not (kernels == "reference" and "conv_1x1" in r)]
            assert not missing, (core, kernels, missing)
            assert set(coef["portable"]) == set(latency.PORTABLE), (core, kernels)
    scalar = [f for r in data["runs"] for f in r["ops"] if f.get("broadcast") == "scalar"]
    assert scalar and all(f["loops"] == 1 for f in scalar)  # a scalar operand: one loop over every element
    bad, seen = [], 0
    for r in data["runs"]:
        coef = data["coefficients"][f"{r['core']}/{r['kernels']}"]
        feats = latency.portable_features(r)
        for k, n in r.get("portable_insns", {}).items():
            if k in feats and n:
                seen += 1
                pred = sum(coef["portable"][k].get(f, 0.0) * v for f, v in feats[k].items())
                if abs(pred / n - 1) > 0.02:
                    bad.append(f"{r['variant']} {r['core']} {r['kernels']} {k}: {100 * (pred / n - 1):+.2f}%")
    assert seen > 100
    assert not bad, "\n".join(bad)


def test_a_wrong_model_misses(data):
    """The comparison is real: a model twice as large (every op's features doubled) is predicted far off."""
    r = next(r for r in data["runs"] if r["variant"] == "mbv2_035_96")
    coef = data["coefficients"][f"{r['core']}/{r['kernels']}"]
    doubled = [{**f, **{k: 2 * f[k] for k in latency.FEATURES if k in f}} for f in r["ops"]]
    pred, _ = latency.predict_from_features(doubled, coef, r["kernels"])
    assert pred / r["invoke"] - 1 > 0.5


def test_stored_runs_cover_what_the_predictor_promises(data):
    """Both cores with CMSIS-NN; builtin models, custom mode with halo caches, streamed input, and several
    TFMCU_PATCH_STAGE ops (rest_convs) where measured."""
    have = {(r["core"], r["kernels"]) for r in data["runs"]}
    assert {("cortex-m4", "cmsis_nn"), ("cortex-m7", "cmsis_nn")} <= have
    stage = f"custom:{latency.abi.PATCH_STAGE_OP}"
    kinds = set()
    for r in data["runs"]:
        stages = [f for f in r["ops"] if f["type"] == stage]
        kinds.add("builtin" if not stages else "custom")
        kinds |= {"halo" for f in stages if f["cache_bytes"]} | {"stream" for f in stages if f["stream_bytes"]}
        kinds |= {"several_stages" for _ in [0] if len(stages) > 1}
    assert {"builtin", "custom", "halo", "stream", "several_stages"} <= kinds
    # squeeze-excites inside stages (a stage sweeping its grid in passes: more patches than its grid has), with and
    # without halo caches, and the element-wise ops, per layer and in stages: on every core with both kernel sets
    for core in latency.CORES:
        for kernels in latency.KERNELS:
            runs = [r for r in data["runs"] if (r["core"], r["kernels"]) == (core, kernels)]
            passes = [f for r in runs for f in r["ops"] if f["type"] == stage and f["patches"] > np.prod(f["grid"])]
            assert any(f["cache_bytes"] for f in passes) and any(not f["cache_bytes"] for f in passes), (core, kernels)
            have = {latency.path_of(lf, kernels) for r in runs for f in r["ops"] if f["type"] == stage
                    for lf in f["layers"]}
            assert {"HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU", "SUB", "MUL", "MUL:broadcast"} <= have
    # the folded 1x1 product's own counts, and its row, on both cores
    for core in ("cortex-m4", "cortex-m7"):
        assert any(f.get("folded_insns") for r in data["runs"] if (r["core"], r["kernels"]) == (core, "cmsis_nn")
                   for f in r["ops"]), core
        assert data["coefficients"][f"{core}/cmsis_nn"].get("folded"), core


def test_stored_stage_features_are_the_current_codes(data):
    """Every stored patch stage's convolutions carry the geometry op_features makes now (a calibration that stored
    another code version's features would price the layers our own kernels run as CMSIS-NN's)."""
    convs = [(r["variant"], lf["geometry"]) for r in data["runs"] for f in r["ops"] for lf in f.get("layers", [])
             if lf["type"] == "CONV_2D" and lf.get("geometry") is not None]
    assert convs
    old = sorted({v for v, g in convs if not {"cout", "groups", "input_offset"} <= set(g)})
    assert not old, old


@pytest.mark.parametrize("name", ["tiny_per_tensor", "eltwise_mix"])
def test_features_of_a_stored_model_are_the_stored_ones(data, zoo_models, name):
    """op_features of the zoo model as built now equals what the calibration stored for it (else the stored
    measurements no longer describe the models the predictor sees); eltwise_mix: the element-wise ops, TFLM's
    broadcast loops among them."""
    runs = [r for r in data["runs"] if r["variant"] == name]
    if not runs:
        pytest.skip(f"{name} not in the calibration")
    got = latency.op_features(zoo_models(name))
    want = [{k: v for k, v in f.items() if k not in ("insns", "folded_insns")} for f in runs[0]["ops"]]
    assert got == want
    if name == "eltwise_mix":  # SUB of a per-channel constant: TFLM's innermost loop per pixel, a row of its own
        sub = next(f for f in got if f["type"] == "SUB" and f.get("broadcast"))
        assert latency.path_of(sub, "cmsis_nn") == "SUB:broadcast" and sub["loops"] == sub["pix"] > 1


def test_folded_1x1_calls_are_priced_by_their_own_product(zoo_models, monkeypatch):
    """A 1x1 convolution's input offset folded into its bias (tfmcu.kernels.ops.fold_input_offset): its stage calls
    that abi.conv1x1_folded chooses run the CMSIS-NN backend's own product (cmsis_nn/conv1x1_folded.c).
    The layer's features are those of the unfolded layer; its "folded" part holds those calls' features and the
    product's, whose iterations and tail hold every MAC of them; with CMSIS-NN they are priced by the product's row
    instead of the 1x1 row."""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.kernels import ops
    from tfmcu.plan.regions import schedule
    from tfmcu.stage.custom import rewrite_custom

    data = zoo_models("mbv2_035_96")
    graph = from_tflite(data)

    def stage_features(fold: bool) -> dict:
        if not fold:
            monkeypatch.setattr(ops, "fold_input_offset", lambda *a: None)
        model = rewrite_custom(data, graph, schedule(graph, (6, 6), n_blocks=5)).model
        monkeypatch.undo()
        return next(f for f in latency.op_features(model) if f["type"] == f"custom:{latency.abi.PATCH_STAGE_OP}")

    folded, plain = stage_features(True), stage_features(False)
    with_fold = [lf for lf in folded["layers"] if lf.get("folded")]
    assert with_fold and not any(lf.get("folded") for lf in plain["layers"])
    def unfolded(lf: dict) -> dict:  # (the folded layer's input offset is 0)
        g = None if lf.get("geometry") is None else {k: v for k, v in lf["geometry"].items() if k != "input_offset"}
        return {**{k: v for k, v in lf.items() if k != "folded"}, "geometry": g}

    for a, b in zip(folded["layers"], plain["layers"]):
        assert unfolded(a) == unfolded(b)
    for lf in with_fold:
        part, prod = lf["folded"]["layer"], lf["folded"]["product"]
        assert 0 < part["calls"] <= lf["calls"] and 0 < part["macs"] <= lf["macs"]
        assert part["macs"] == (16 * prod["pair_iters"] + 8 * prod["odd_iters"] + 4 * prod["chan_iters"]
                                + prod["tail"])
    coef = latency.load_calibration()["coefficients"]["cortex-m4/cmsis_nn"]
    terms = latency.stage_terms(folded, coef, "cmsis_nn")
    assert terms["cost_folded"] == pytest.approx(sum(latency.folded_cost(lf["folded"]["product"], coef)
                                                     for lf in with_fold)) and terms["cost_folded"] > 0
    plain_terms = latency.stage_terms(plain, coef, "cmsis_nn")
    assert plain_terms["cost_folded"] == 0 and plain_terms["cost_conv"] > terms["cost_conv"]
    # the portable kernels have no such product: the same terms folded or not
    assert latency.stage_row_terms(folded, "reference") == latency.stage_row_terms(plain, "reference")
    # a Helium build has no folded product (cmsis_nn/conv1x1_folded.c is DSP code): its calls run CMSIS-NN's 1x1
    # product like the rest, so folded or not the stage's terms are the same there
    mve = {**coef, "mve": True}
    assert latency.stage_terms(folded, mve, "cmsis_nn") == latency.stage_terms(plain, mve, "cmsis_nn")
    assert latency.stage_terms(folded, mve, "cmsis_nn")["cost_folded"] == 0


def test_helium_paths():
    """On a Helium core the backend has no one-pixel vector-matrix shortcut (its 1x1 calls run CMSIS-NN's 1x1
    product) and CMSIS-NN's depthwise wrapper runs the 3x3 kernel as arm_depthwise_conv_s8_opt."""
    one_pixel = {"type": "CONV_2D", "geometry": {"kernel": [1, 1], "stride": [1, 1], "pad": [0, 0],
                                                 "dilation": [1, 1], "depthwise": False, "mult": 1, "vector": True}}
    assert latency.path_of(one_pixel, "cmsis_nn") == "FULLY_CONNECTED"
    assert latency.path_of(one_pixel, "cmsis_nn", mve=True) == "CONV_2D:conv_1x1"
    dw = {"type": "DEPTHWISE_CONV_2D", "geometry": {"kernel": [3, 3], "stride": [1, 1], "pad": [1, 1],
                                                    "dilation": [1, 1], "depthwise": True, "mult": 1}}
    assert latency.path_of(dw, "cmsis_nn") == "DEPTHWISE_CONV_2D:dw_3x3"
    assert latency.path_of(dw, "cmsis_nn", mve=True) == "DEPTHWISE_CONV_2D:dw_opt"
    assert latency.path_of(dw, "reference", mve=True) == "DEPTHWISE_CONV_2D:dw"


def test_fold_input_offset_keeps_every_sum():
    """bias + offset x sum(w) with input offset 0 gives the integer sums TFLite's (x + offset) x w + bias gives."""
    from tfmcu.kernels.ops import fold_input_offset

    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (8, 1, 1, 24), dtype=np.int64).astype(np.int8)
    b = rng.integers(-5000, 5000, 8).astype(np.int32)
    x = rng.integers(-128, 128, (5, 24))
    for bias, offset in ((b, 128), (None, -3), (b, 1)):
        folded = fold_input_offset(w, bias, offset)
        ref = (x + offset) @ w.reshape(8, 24).T.astype(np.int64) + (0 if bias is None else bias)
        assert np.array_equal(x @ w.reshape(8, 24).T.astype(np.int64) + folded, ref)
    assert fold_input_offset(w, b, 0) is None
    ones = np.ones((8, 1, 1, 24), np.int8)
    assert fold_input_offset(ones, np.full(8, 2 ** 31 - 10, np.int32), 128) is None  # would not fit int32


def test_prediction_api_is_fast_and_labelled(zoo_tiny_per_tensor):
    from tfmcu.tflite.model import TfliteModel

    model = TfliteModel(zoo_tiny_per_tensor)
    t0 = time.process_time()  # (this process's CPU time: a busy machine does not make the prediction look slow)
    p = latency.predict_instructions(model, "cortex-m4", "cmsis_nn")
    assert time.process_time() - t0 < 0.5
    assert p.instructions == pytest.approx(sum(o["instructions"] for o in p.per_op), rel=0.2)
    assert [o["op"] for o in p.per_op] == list(range(len(model.op_names)))
    assert p.what.startswith("estimated: per-op cost model calibrated on QEMU counts (latency_calibration.json")
    assert (p.core, p.kernels) == ("cortex-m4", "cmsis_nn")


def test_core_of_and_bad_arguments():
    from tfmcu.firmware.targets import TARGETS

    assert latency.core_of(TARGETS["cortex-m4"]) == "cortex-m4"
    assert latency.core_of(TARGETS["stm32f405"]) == "cortex-m4"
    assert latency.core_of(TARGETS["cortex-m7"]) == "cortex-m7"
    assert latency.core_of("//tools/bazel/arm:cortex_m7") == "cortex-m7"
    with pytest.raises(UsageError):
        latency.core_of("riscv")
    assert latency.core_of(TARGETS["cortex-m55"]) == latency.core_of(TARGETS["alif-ensemble-e7"]) == "cortex-m55"
    assert latency.core_of(TARGETS["cortex-m33"]) == "cortex-m33"
    with pytest.raises(UsageError, match="cortex-m85"):
        latency.predict_instructions(b"", "cortex-m85", "cmsis_nn")
    with pytest.raises(UsageError, match="kernels"):
        latency.predict_instructions(b"", "cortex-m4", "neon")


@pytest.fixture(scope="module")
def zoo_tiny_per_tensor(zoo_models):
    return zoo_models("tiny_per_tensor")


# ---- live: make test's own whole-model firmware (tflm_patch_kernels/tflm/BUILD) run under QEMU here, one per kernel
# set; tests/BUILD gives this test their ELFs and generated model sources (plain pytest: from bazel-bin, if built).
LIVE = [
    # (firmware, its generated model source, QEMU board, core, kernels)
    ("tflm_mbv2_035_96_cmsis_nn_cortex_m4.elf", "tflm_mbv2_035_96_cmsis_nn_model.cc", "mps2-an386", "cortex-m4",
     "cmsis_nn"),
    ("tflm_mbv2_035_96_cortex_m7.elf", "tflm_mbv2_035_96_model.cc", "mps2-an500", "cortex-m7", "reference"),
]
_ROOT = Path(__file__).resolve().parent.parent


def _find(rel: str) -> Path | None:
    for base in (Path.cwd(), _ROOT, _ROOT / "bazel-bin"):
        if (base / rel).exists():
            return base / rel
    return None


def _model_bytes(source: Path) -> bytes:
    """The model array of a generated model source (tfmcu.firmware.sources.model_source)."""
    text = source.read_text()
    m = re.search(r"g_tfmcu_model\[(\d+)\] = \{\n(.*?)\n\};", text, re.S)
    data = np.array(m.group(2).replace("\n", "").split(","), dtype=np.uint8).tobytes()
    assert len(data) == int(m.group(1))
    return data


@pytest.mark.parametrize("elf,source,machine,core,kernels", LIVE, ids=[x[4] for x in LIVE])
def test_live_qemu_count_within_5_percent(elf, source, machine, core, kernels, tmp_path):
    pkg = "tflm_patch_kernels/tflm/"
    elf_path, src_path = _find(pkg + elf), _find(pkg + source)
    runner, plugin = _find("tools/qemu/run_firmware.py"), _find("tools/qemu/libinsn_count.so")
    if not (elf_path and src_path and runner and plugin):
        pytest.skip("the firmware is not built (bazel test //tests:test_latency builds it)")
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(runner), "--elf", str(elf_path), "--machine", machine, "--plugin",
                        str(plugin), "--report", str(report), "--quiet", "--timeout", "60"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]
    regions = json.loads(report.read_text())["result"]["regions"]
    measured = [g["insns"] for g in regions if g["name"] == "invoke"][0]
    p = latency.predict_instructions(_model_bytes(src_path), core, kernels)
    assert abs(p.instructions / measured - 1) <= TOLERANCE, (measured, p.instructions)


def test_function_profile_of_a_live_run(tmp_path):
    """run_firmware.py --profile: the plugin's per-address counts summed per function (where a kernel's instructions
    go); the CMSIS-NN build's 1x1 convolutions run arm_nn_mat_mult_nt_t_s8, the largest share of MobileNetV2's."""
    elf, _, machine, _, _ = LIVE[0]
    elf_path = _find("tflm_patch_kernels/tflm/" + elf)
    runner, plugin = _find("tools/qemu/run_firmware.py"), _find("tools/qemu/libinsn_count.so")
    if not (elf_path and runner and plugin):
        pytest.skip("the firmware is not built (bazel test //tests:test_latency builds it)")
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(runner), "--elf", str(elf_path), "--machine", machine, "--plugin",
                        str(plugin), "--report", str(report), "--quiet", "--timeout", "60", "--profile", "5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]
    rep = json.loads(report.read_text())
    prof = rep["profile"]
    assert len(prof) == 5 and prof[0]["function"] == "arm_nn_mat_mult_nt_t_s8", prof
    assert [p["insns"] for p in prof] == sorted((p["insns"] for p in prof), reverse=True)
    assert sum(p["insns"] for p in prof) <= rep["result"]["insns_total"]
