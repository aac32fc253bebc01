"""Builtin-op rewriter: bit-exact in TFLite and TFLM on a zoo of int8 models, metadata kept, Flash bounded, errors.

Every zoo model is converted here from tf_keras (random weights, calibrated batch norm so int8 outputs vary) and
covers the features listed in ``tfmcu.nets.zoo.ZOO[name].features``: kernels 1/3/5/7, strides 1/2, SAME/VALID and
symmetric (PAD) padding, ReLU/ReLU6/none, residual ADDs, projection shortcuts, MAX_POOL, per-channel and per-tensor
quantization, float input (QUANTIZE inside the stage), tf_keras.applications models.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.graph import from_tflite as lower_tflite  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan.arena import predict_arena  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.runtime.tflm import measure_arena, run_tflm  # noqa: E402
from tfmcu.stage import builtin as rewrite  # noqa: E402
from tfmcu.stage.common import SCHEDULE_METADATA, read_schedule  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = [name for name, m in zoo.ZOO.items() if not m.tags]
GRIDS = {"mbv2_035_96": 3, "kernels_symmetric": (2, 3), "keras_mobilenet_v2": 4, "keras_mobilenet_v1": (3, 2),
         "resnet_like": 3, "tiny_per_tensor": 2, "tiny_float_input": 3}
SAMPLES = 6


@pytest.fixture(scope="session")
def models(zoo_models):
    return zoo_models


def _schedule(name: str, data: bytes) -> tuple:
    g = lower_tflite.from_tflite(data, name=name)
    entry = zoo.ZOO[name]
    return g, scheduler.schedule(g, GRIDS[name], n_blocks=entry.patch_blocks, n_ops=entry.patch_ops)


def test_suite_covers_the_features():
    features = {f for name in SUITE for f in zoo.ZOO[name].features}
    for needed in ("residual ADD", "projection shortcut", "per-tensor quantization", "per-channel", "k5/k7",
                   "MAX_POOL SAME", "tf_keras.applications", "VALID conv", "no activation", "ReLU", "ReLU6",
                   "float input -> QUANTIZE in the stage", "symmetric padding (PAD + VALID)"):
        assert needed in features, needed
    assert len(SUITE) >= 6


@pytest.mark.parametrize("name", SUITE)
def test_rewritten_model_is_bit_exact(models, name):
    data = models(name)
    g, s = _schedule(name, data)
    res = rewrite.rewrite_builtin(data, g, s, where=name)
    assert res.ops_after > res.ops_before
    inputs = random_inputs(data, SAMPLES, seed=1)
    ref = run_tflite(data, inputs)
    got = run_tflite(res.model, inputs)
    micro_ref = run_tflm(data, inputs)
    micro = run_tflm(res.model, inputs)
    # The predictor is exact on the rewriter's own output (what auto mode relies on), and the auto mode's pruning
    # bound never exceeds what TFLM really needs.
    m0, m1 = measure_arena(data), measure_arena(res.model)
    assert predict_arena(g, model=data).total == m0.total
    assert predict_arena(lower_tflite.from_tflite(res.model), model=res.model).total == m1.total
    assert rewrite.lower_bound(s, m0.tail) <= m1.total
    outs = np.stack([r[0] for r in ref]).astype(np.float64)
    assert outs.std(axis=0).max() > 0, "outputs do not vary with the input: the check would prove nothing"
    for k in range(SAMPLES):
        for a, b, c, d in zip(ref[k], got[k], micro_ref[k], micro[k]):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"TFLite sample {k}"
            assert np.array_equal(c, d), f"TFLM sample {k}"
            assert np.array_equal(a, c), f"TFLite vs TFLM sample {k}"


def test_stage_structure_and_flash(models):
    data = models("mbv2_035_96")
    g, s = _schedule("mbv2_035_96", data)
    res = rewrite.rewrite_builtin(data, g, s)
    m0, m1 = ts.load_model(data), ts.load_model(res.model)
    names = [ts.op_name(m1, op) for op in m1.subgraphs[0].operators]
    stage_ops = len(s.stage)
    assert names.count("CONV_2D") + names.count("DEPTHWISE_CONV_2D") >= 9 * (stage_ops - 1)
    assert "SLICE" in names and "PAD" in names and "CONCATENATION" in names
    # Weights are shared, not duplicated: the big constant buffers are the same set.
    def big(m):
        meta = {mm.buffer for mm in m.metadata or []}
        return sorted(len(b.data) for i, b in enumerate(m.buffers)
                      if i not in meta and b.data is not None and len(b.data) > 256)
    assert big(m1) == big(m0)
    # Flash grows only by the new small tensors' and operators' metadata (and the schedule record).
    meta = len(json.dumps(res.schedule))
    growth = len(res.model) - len(data) - meta
    assert growth <= 160 * (res.new_tensors + res.ops_after - res.ops_before), growth
    # Convs in the stage now run VALID on patch tensors.
    conv_pads = {op.builtinOptions.padding for op, n in zip(m1.subgraphs[0].operators, names)
                 if n in ("CONV_2D", "DEPTHWISE_CONV_2D")}
    assert ts.Padding.VALID in conv_pads


def test_schedule_metadata_and_associated_files_are_kept(models, tmp_path):
    data = models("tiny_per_tensor")
    m = ts.load_model(data)
    buf = ts.BufferT()
    buf.data = np.frombuffer(b"labels-v1", dtype=np.uint8).copy()
    m.buffers.append(buf)
    meta = ts.schema.MetadataT()
    meta.name = b"TFLITE_METADATA"
    meta.buffer = len(m.buffers) - 1
    m.metadata = list(m.metadata or []) + [meta]
    flat = ts.write_model(m)
    zbuf = io.BytesIO(flat)
    zbuf.seek(0, io.SEEK_END)
    with zipfile.ZipFile(zbuf, "a") as zf:
        zf.writestr("labels.txt", "shirt\nshoe\nbag\n")
    with_files = zbuf.getvalue()
    g, s = _schedule("tiny_per_tensor", with_files)
    res = rewrite.rewrite_builtin(with_files, g, s)
    out = ts.load_model(res.model)
    names = {(mm.name.decode() if isinstance(mm.name, bytes) else mm.name) for mm in out.metadata}
    assert {"TFLITE_METADATA", SCHEDULE_METADATA} <= names
    assert zipfile.ZipFile(io.BytesIO(res.model)).read("labels.txt") == b"shirt\nshoe\nbag\n"
    rec = read_schedule(res.model)
    assert rec["grid"] == [2, 2] and rec["patch_blocks"] == 3 and rec["tool"] == "tfmcu"
    assert rec["peak_sram_bytes"] == s.peak_sram_bytes and len(rec["regions"]) == len(s.stage)
    inputs = random_inputs(with_files, 2)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(run_tflm(with_files, inputs), run_tflm(res.model, inputs)))


def test_unsupported_stage_errors(models):
    data = models("mbv2_035_96")
    g = lower_tflite.from_tflite(data)
    mean = next(i for i, op in enumerate(g.ops) if op.type == "mean")
    assert scheduler.schedule(g, 2, n_ops=mean + 1).pool == mean  # (the global pool may end a stage)
    with pytest.raises(scheduler.ScheduleError) as e:
        scheduler.schedule(g, 2, ops=list(range(mean + 2)))  # but not sit inside one
    msg = str(e.value)
    assert f"op {mean}" in msg or f"tflite op {g.ops[mean].src_index}" in msg
    assert "MEAN" in msg and "largest stage that works" in msg and "global average pool" in msg


# ----------------------------------------------------------------------------- pipeline
def run_rewrite(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "pipelines.rewrite", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)


def test_pipeline_model_that_aborts_tflm_is_one_line(aborting_tflite, tmp_path):
    """Hole (issue 22): an int8 SOFTMAX whose input scale makes TF Lite and TFLM abort() killed rewrite (SIGABRT,
    nothing printed). The interpreters run isolated: one line on stderr, exit 2, nothing written, in both modes."""
    src = tmp_path / "aborts.tflite"
    src.write_bytes(aborting_tflite)
    for mode in ("builtin", "custom"):
        out, rep = tmp_path / f"{mode}.tflite", tmp_path / f"{mode}.json"
        r = run_rewrite(f"--tflite={src}", f"--out={out}", f"--mode={mode}", "--patches=2", "--patch_ops=2",
                        f"--json_out={rep}")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (mode, r.returncode, r.stderr[-2000:])
        assert "TFLM crashed (SIGABRT)" in lines[0] and str(src) in lines[0], lines
        assert not out.exists() and not rep.exists()


def test_pipeline_auto_mode(models, tmp_path):
    src = tmp_path / "m.tflite"
    src.write_bytes(models("mbv2_035_96"))
    out, rep = tmp_path / "p.tflite", tmp_path / "r.json"
    original = measure_arena(src.read_bytes()).total
    budget_kb = int(original * 0.75 / 1024)
    r = run_rewrite(f"--tflite={src}", f"--out={out}", "--patches=auto", f"--sram_kb={budget_kb}",
                    f"--json_out={rep}")
    assert r.returncode == 0, r.stderr
    d = json.loads(rep.read_text())
    assert d["patched"] and d["tflm"]["rewritten"]["arena_total_bytes"] < d["tflm"]["original"]["arena_total_bytes"]
    assert d["predicted"]["rewritten"]["arena_total_bytes"] <= budget_kb * 1024
    assert read_schedule(out.read_bytes())["mode"] == "builtin"
    from tfmcu.flows.rewrite import RewriteReport

    report = RewriteReport.from_json(d)  # the JSON reads back into the report, and writes the same JSON
    assert report.to_json() == d and report.patched and report.tflm.rewritten.arena_total_bytes < original


@pytest.mark.parametrize("args, message", [
    (["--tflite={tmp}/missing.tflite"], "no such file"),
    (["--tflite={tmp}/fake.tflite"], "not a TFLite"),
    (["--tflite={tmp}/m.tflite", "--patches=auto"], "--sram_kb"),
    (["--tflite={tmp}/m.tflite", "--patches=auto", "--sram_kb=4"], "smallest achievable"),
    (["--tflite={tmp}/m.tflite", "--patches=2", "--patch_ops=16"], "builtin ops cannot sum a global pool"),
    (["--tflite={tmp}/m.tflite", "--patches=2"], "--patch_blocks"),
])
def test_pipeline_bad_input(models, tmp_path, args, message):
    (tmp_path / "m.tflite").write_bytes(models("tiny_per_tensor"))
    (tmp_path / "fake.tflite").write_bytes(b"\x00" * 64)
    out = tmp_path / "out.tflite"
    r = run_rewrite(*[a.format(tmp=tmp_path) for a in args], f"--out={out}", "--measure=false")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("auto:", "\r", "  ["))]
    lines = [ln for ln in lines if "error:" in ln]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- holes found as a new user (issue 8)
@pytest.fixture(scope="session")
def resnet8(int8_tflite) -> bytes:
    """An MLPerf-Tiny-style ResNet-8 (32x32x3): its first two convs both feed ops outside a two-op stage (the
    second conv and the residual ADD), so such a stage has no tensor of its own."""
    import tf_keras

    L = tf_keras.layers
    tf_keras.utils.set_random_seed(8)
    i = tf_keras.Input((32, 32, 3))
    x = L.Conv2D(16, 3, padding="same", activation="relu")(i)
    for filters, stride in ((16, 1), (32, 2), (64, 2)):
        y = L.Conv2D(filters, 3, stride, padding="same", activation="relu")(x)
        y = L.Conv2D(filters, 3, padding="same")(y)
        if stride != 1:
            x = L.Conv2D(filters, 1, stride)(x)
        x = L.ReLU()(L.Add()([x, y]))
    x = L.Dense(10)(L.GlobalAveragePooling2D()(x))
    return int8_tflite(tf_keras.Model(i, x, name="resnet8"))


def test_stage_without_its_own_tensors(resnet8, tmp_path):
    """Hole 1: --patches=2 --patch_ops=2 on ResNet-8 died with 'max() arg is an empty sequence'."""
    src, out, rep = tmp_path / "r8.tflite", tmp_path / "p.tflite", tmp_path / "r.json"
    src.write_bytes(resnet8)
    g = lower_tflite.from_tflite(resnet8)
    s = scheduler.schedule(g, 2, n_ops=2)
    assert len(s.stage_outputs) == 2 and all(t in s.stage_outputs for k in s.stage for t in g.ops[k].outputs)
    r = run_rewrite(f"--tflite={src}", f"--out={out}", "--patches=2", "--patch_ops=2", f"--json_out={rep}")
    assert r.returncode == 0, r.stderr
    d = json.loads(rep.read_text())
    assert d["predicted"]["rewritten"] == d["tflm"]["rewritten"]
    inputs = random_inputs(resnet8, 3, seed=4)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(run_tflm(resnet8, inputs), run_tflm(out.read_bytes(),
                                                                                               inputs)))
    # Custom mode cannot run a stage with two outputs: one line, no output.
    r = run_rewrite(f"--tflite={src}", f"--out={out}.c", "--mode=custom", "--patches=2", "--patch_ops=2")
    assert r.returncode == 2 and "one input and one output" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(f"{out}.c")


@pytest.mark.parametrize("mode", ["builtin", "custom"])
def test_checks_are_the_same_in_every_mode(models, tmp_path, mode):
    """Hole 2: custom mode accepted --out equal to --tflite and gave a traceback for --grids=a."""
    src = tmp_path / "m.tflite"
    data = models("tiny_per_tensor")
    src.write_bytes(data)
    for args, message in ((["--patches=2", "--patch_blocks=3", f"--out={src}"], "--out must differ"),
                          (["--patches=auto", "--sram_kb=100", "--grids=a", f"--out={tmp_path}/o.tflite"],
                           "--grids=a"),
                          (["--patches=2x", "--patch_blocks=3", f"--out={tmp_path}/o.tflite"], "--patches=2x")):
        r = run_rewrite(f"--tflite={src}", f"--mode={mode}", *args)
        errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
        assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr
        assert "Traceback" not in r.stderr
    assert src.read_bytes() == data and not (tmp_path / "o.tflite").exists()


@pytest.mark.parametrize("mode", ["builtin", "custom"])
def test_outputs_are_all_or_nothing(models, tmp_path, mode):
    """Hole 3: a bad --json_out (a folder, a path under a file) left --out behind or gave a traceback."""
    src, out = tmp_path / "m.tflite", tmp_path / "o.tflite"
    src.write_bytes(models("tiny_per_tensor"))
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    for bad in (tmp_path / "a_folder", tmp_path / "a_file" / "r.json"):
        r = run_rewrite(f"--tflite={src}", f"--out={out}", f"--mode={mode}", "--patches=2", "--patch_blocks=3",
                        f"--json_out={bad}", "--measure=false")
        errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
        assert r.returncode == 2 and len(errors) == 1 and "--json_out" in errors[0], r.stderr
        assert "Traceback" not in r.stderr and not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["a_file", "a_folder", "m.tflite"]  # no temporary files either


def test_no_fit_message_states_the_true_minimum(models):
    """Hole 7: with nothing fitting, the message named the unpatched model's arena as "the smallest achievable"
    although pruning had skipped every patched schedule; now the search finds the true minimum."""
    from tfmcu.plan.search import SearchOptions, candidates, search
    from tfmcu.stage.builtin import BuiltinArenaCost

    data = models("mbv2_035_96")
    g = lower_tflite.from_tflite(data)
    cost = BuiltinArenaCost(data, g, "mbv2_035_96")
    opts = SearchOptions(patch_options=(2, 4), rectangular=False)
    res = search(g, cost, 4096, opts)
    assert not res.feasible
    every = [cost.evaluate(c, v).cost for c in candidates(g, opts)[1:] for v in cost.variants]
    assert res.smallest.cost == min(every) < res.baseline.cost
    assert f"smallest achievable predicted TFLM arena is {res.smallest.cost / 1024:.1f} kB" in res.message
    assert res.smallest.describe() in res.message


def test_measured_arena_must_fit_the_budget(models, tmp_path, monkeypatch):
    """Hole 8: auto mode checked only the prediction against --sram_kb; the measurement decides."""
    from tfmcu.errors import UsageError
    from tfmcu.flows import rewrite as flow
    from tfmcu.flows.common import ScheduleRequest

    src, out = tmp_path / "m.tflite", tmp_path / "o.tflite"
    data = models("mbv2_035_96")
    src.write_bytes(data)
    budget_kb = int(measure_arena(data).total * 0.75 / 1024)
    opts = flow.RewriteOptions(tflite=str(src), out=str(out),
                               schedule=ScheduleRequest(patches="auto", sram_kb=budget_kb))
    real = flow.measure_arena

    def pessimistic(model, where="model", **kw):  # the rewritten model measures above the budget
        stats = real(model, where=where, **kw)
        if bytes(model) != data:
            stats.total = budget_kb * 1024 + 16
        return stats

    monkeypatch.setattr(flow, "measure_arena", pessimistic)
    with pytest.raises(UsageError, match="measured TFLM arena is .* more than --sram_kb"):
        flow.run(opts, log=lambda m: None)
    assert not out.exists()
    monkeypatch.setattr(flow, "measure_arena", real)
    rep = flow.run(opts, log=lambda m: None)
    assert rep.patched and rep.tflm.rewritten.arena_total_bytes <= budget_kb * 1024 and out.exists()
    assert flow.RewriteReport.from_json(rep.to_json()) == rep  # round trip of the returned report
