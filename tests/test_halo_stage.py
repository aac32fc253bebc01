"""Halo caches run (issue 12): the C executor with row / column caches (tflm_patch_kernels/patch_stage.c), packed by
``tfmcu.kernels.pack.pack_stage(..., halo=...)``, bit-exact with TF Lite; scratch = caches + the halo caches' patch
working set, exactly; the description checks; the TFMCU_PATCH_STAGE kernel in TFLM built from source (the caches
are tables of its stage blob); ``pipelines.rewrite --halo``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.kernels import binding, pack  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan import halo, regions  # noqa: E402
from tfmcu.plan.arena import predict_arena  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite, tflite_all_tensors  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole, runner_path  # noqa: E402
from tfmcu.stage import custom  # noqa: E402
from tfmcu.stage.common import read_schedule  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402
from tfmcu.tflite.patch_stage_format import FORMAT_VERSION, kernel_memory, stage_of  # noqa: E402

CASES = [("mbv2_035_96", (3, 3)), ("resnet_like", (4, 2)), ("kernels_symmetric", (2, 3)),
         ("tiny_float_input", (1, 2)), ("keras_mobilenet_v1", (3, 2))]
CHOICES = ("rows", "cols", "all", "mixed")


def _schedule(zoo_models, name: str, grid) -> tuple[bytes, ir.Graph, regions.PatchSchedule]:
    data = zoo_models(name)
    g = from_tflite(data, name=name)
    e = zoo.ZOO[name]
    return data, g, regions.schedule(g, grid, n_blocks=e.patch_blocks, n_ops=e.patch_ops)


def _caches(s: regions.PatchSchedule, choice: str, seed: int = 0) -> halo.HaloCaches:
    inter = halo.intermediates(s)
    rng = random.Random(seed)
    rows = {"rows": inter, "cols": [], "all": inter, "mixed": [t for t in inter if rng.random() < 0.5]}[choice]
    cols = {"rows": [], "cols": inter, "all": inter, "mixed": [t for t in inter if rng.random() < 0.5]}[choice]
    return halo.halo_caches(s, rows, cols)


def _held_bytes(g: ir.Graph, s: regions.PatchSchedule) -> int:
    """What the analytic stage peak holds besides scratch: the stage outputs and the input image."""
    return sum(g.tensors[t].nbytes for t in s.stage_outputs) + \
        sum(g.tensors[t].nbytes for t in s.stage_inputs if t in g.inputs)


def _executed_macs(g: ir.Graph, s: regions.PatchSchedule, p: pack.PackedStage) -> int:
    """MACs the executor runs: every layer's computed box (the spans' out ranges) over all patches."""
    macs = 0
    for pos, k in enumerate(s.stage):
        mpp = ir.macs_per_output_pixel(g.ops[k])
        rows = sum(int(p.row_spans[b, pos, 1] - p.row_spans[b, pos, 0]) for b in range(p.grid[0]))
        cols = sum(int(p.col_spans[b, pos, 1] - p.col_spans[b, pos, 0]) for b in range(p.grid[1]))
        macs += mpp * rows * cols
    return macs


@pytest.mark.parametrize("name,grid", CASES, ids=[c[0] for c in CASES])
def test_halo_stage_bit_exact_and_scratch_exact(name, grid, zoo_models):
    data, g, s = _schedule(zoo_models, name, grid)
    samples = random_inputs(data, 2, seed=4)
    refs = None
    for choice in CHOICES:
        h = _caches(s, choice, seed=len(name))
        p = pack.pack_stage(data, g, s, halo=h)
        assert binding.check_stage(p) == (0, -1), choice
        if refs is None:
            refs = [tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor]) for x in samples]
        for x, ref in zip(samples, refs):
            got = binding.run_stage(p, x[0])
            assert np.array_equal(got, ref), (choice, int((got != ref).sum()))
        # Caches: the C library's bytes == the packer's == the analytic plan's, per cache.
        names = p.tensor_names
        want = {(t, 0): b for t, b in h.row_cache_bytes.items()} | {(t, 1): b for t, b in h.col_cache_bytes.items()}
        assert {(names[t], a): b for (t, a, _), b in zip(p.caches, p.cache_bytes)} == want
        # Scratch: touched == planned == C's figure == caches + the halo caches' analytic patch working set.
        touched, out = binding.touched_scratch(p, samples[0][0])
        assert np.array_equal(out, refs[0])
        assert touched == p.scratch_bytes == binding.c_scratch_bytes(p)
        assert p.lower_bound_bytes == h.stage_peak_bytes - _held_bytes(g, s)
        assert p.scratch_bytes <= p.lower_bound_bytes + 4 * (len(p.caches) + 1)  # alignment of the cache offsets
        # MACs: what the executor computes == the plan's exact MACs; all caches compute every element once.
        assert _executed_macs(g, s, p) == h.stage_macs_exact
        if choice == "all":
            assert h.stage_macs_exact == s.stage_macs
        print(f"{name} {grid} {choice}: {len(p.caches)} caches {sum(p.cache_bytes)} B, scratch {p.scratch_bytes} B "
              f"(recompute {pack.pack_stage(data, g, s).scratch_bytes} B), stage MACs "
              f"{h.stage_mac_overhead * 100:+.1f}% (recompute {(s.stage_macs_patched_exact / s.stage_macs - 1) * 100:+.1f}%)")


def test_no_cache_plan_packs_like_the_recompute_schedule(zoo_models):
    data, g, s = _schedule(zoo_models, "resnet_like", (3, 2))
    a, b = pack.pack_stage(data, g, s), pack.pack_stage(data, g, s, halo=halo.halo_caches(s))
    assert np.array_equal(a.row_spans, b.row_spans) and np.array_equal(a.col_spans, b.col_spans)
    assert np.array_equal(a.buffer_offsets, b.buffer_offsets) and a.scratch_bytes == b.scratch_bytes
    assert b.caches == [] and a.row_held is None


def test_mbv2_224_caches_bit_exact(zoo_models):
    """MobileNetV2-1.0-224, 4x4 patches over 5 blocks (the issue's setting): every cache, and the caches
    choose_caches keeps at the recompute schedule's own analytic peak."""
    data, g, s = _schedule(zoo_models, "mbv2_100_224", 4)
    s = regions.schedule(g, (4, 4), n_blocks=5)
    x = random_inputs(data, 1, seed=2)[0]
    ref = None
    for h in (_caches(s, "all"), halo.choose_caches(s, s.peak_sram_bytes)):
        p = pack.pack_stage(data, g, s, halo=h)
        if ref is None:
            ref = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor])
        assert np.array_equal(binding.run_stage(p, x[0]), ref)
        assert p.scratch_bytes == h.stage_peak_bytes - _held_bytes(g, s)
        print(f"mbv2_100_224 4x4 n=5: {len(p.caches)} caches, scratch {p.scratch_bytes} B, stage MACs "
              f"{h.stage_mac_overhead * 100:+.1f}% (analytic, = what the executor computes)")


def _broken(p: pack.PackedStage, **changes) -> pack.PackedStage:
    q = pack.PackedStage(**{**{k: v for k, v in p.__dict__.items() if not k.startswith("_")}, **changes})
    return q


def test_validation_rejects_broken_halo_descriptions(zoo_models):
    data, g, s = _schedule(zoo_models, "mbv2_035_96", (3, 3))
    p = pack.pack_stage(data, g, s, halo=_caches(s, "all"))
    assert binding.check_stage(p) == (0, -1)
    cached = [(t, a) for (t, a, _), n in zip(p.caches, p.cache_bytes) if n > 0]
    t, axis = cached[0]
    layer = p.tensor_producers[t]
    # without the cache, the held rows before the computed ones come from nowhere
    rest = [c for c in p.caches if c[:2] != (t, axis)]
    assert binding.check_stage(_broken(p, caches=rest))[0] != 0
    # a cache overlapping a patch buffer
    moved = [(c[0], c[1], p.scratch_bytes - 8 if c[:2] == (t, axis) else c[2]) for c in p.caches]
    assert binding.check_stage(_broken(p, caches=moved))[0] != 0
    # the same tensor and axis twice; a cache of the stage output; an axis that does not exist
    assert binding.check_stage(_broken(p, caches=p.caches + [p.caches[0]]))[0] != 0
    assert binding.check_stage(_broken(p, caches=p.caches + [(p.output_tensor, 0, 0)]))[0] != 0
    assert binding.check_stage(_broken(p, caches=p.caches + [(t, 2, 0)]))[0] != 0
    # a held range that does not end where the computed one does
    held = (p.row_held if axis == 0 else p.col_held).copy()
    held[1, layer, 1] += 1
    assert binding.check_stage(_broken(p, **{("row_held", "col_held")[axis]: held}))[0] != 0


def _custom_model(zoo_models, name: str, grid, choice: str | None):
    data, g, s = _schedule(zoo_models, name, grid)
    h = None if choice is None else (halo.choose_caches(s, s.peak_sram_bytes) if choice == "auto"
                                     else _caches(s, choice))
    return data, custom.rewrite_custom(data, g, s, name, halo=h).model, h


def _options(model: bytes) -> dict:
    """The stage of operator 0 as the format describes it (options and blob)."""
    m = ts.load_model(model)
    return stage_of(m, m.subgraphs[0].operators[0])


@pytest.mark.parametrize("name,grid", [("mbv2_035_96", 4), ("resnet_like", (4, 2))], ids=["mbv2_035_96",
                                                                                         "resnet_like"])
def test_custom_model_with_caches_runs_in_tflm_bit_exact(zoo_models, name, grid):
    data, plain, _ = _custom_model(zoo_models, name, grid, None)
    assert _options(plain)["version"] == FORMAT_VERSION and _options(plain)["num_caches"] == 0
    inputs = random_inputs(data, 3, seed=5)
    ref = run_tflite(data, inputs)
    base = run_whole(plain, inputs, name).arena.arena_used_bytes
    for choice in ("all", "auto", "mixed"):
        _, model, h = _custom_model(zoo_models, name, grid, choice)
        opts = _options(model)
        assert opts["num_caches"] == len(h.cache_rows) + len(h.cache_cols)
        got = run_whole(model, inputs, name)
        for a, b in zip(got.outputs, ref):
            assert np.array_equal(a[0], b[0]), choice
        assert got.arena.patch_stage_persistent_bytes == kernel_memory(opts, 8)[0]
        pred = predict_arena(from_tflite(model), model=model)
        assert pred.head == got.arena.head_bytes
        assert abs(pred.total - got.arena.arena_used_bytes) <= 0.01 * got.arena.arena_used_bytes
        back = custom.load_custom(model).packed  # the description read back from the model
        assert back.scratch_bytes == opts["scratch_bytes"] and binding.check_stage(back) == (0, -1)
        assert read_schedule(model)["halo"]["stage_macs_exact"] == h.stage_macs_exact
        print(f"{name} {grid} {choice}: measured arena {got.arena.arena_used_bytes} B (recompute {base} B), "
              f"stage MACs {h.stage_mac_overhead * 100:+.1f}% (analytic)")


def _rewrite(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.rewrite", *args], capture_output=True, text=True,
                          timeout=600)


def test_rewrite_pipeline_halo_flag(zoo_models, tmp_path):
    src = tmp_path / "m.tflite"
    src.write_bytes(zoo_models("mbv2_035_96"))
    base = [f"--tflite={src}", "--mode=custom", "--patches=4", "--patch_blocks=4"]
    reports = {}
    for mode in ("none", "auto", "smallest"):
        js = tmp_path / f"{mode}.json"
        r = _rewrite(base + [f"--out={tmp_path / mode}.tflite", f"--halo={mode}", f"--json_out={js}"])
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("halo caches:" in r.stdout) == (mode != "none"), r.stdout
        reports[mode] = json.loads(js.read_text())
    h = reports["auto"]["halo"]
    assert "halo" not in reports["none"]
    assert h["stage_mac_overhead"] < reports["none"]["schedule"]["stage_mac_overhead_exact"]
    # auto without --sram_kb: fewer MACs for no more (measured) memory than recomputing
    measured = {m: r["tflm"]["rewritten"]["arena_total_bytes"] for m, r in reports.items()}
    assert measured["auto"] <= measured["none"], measured
    # smallest: the smallest stage within +5% whole-model MACs (analytic stage peak, image counted)
    small = reports["smallest"]["halo"]
    assert small["mac_overhead_exact"] <= 0.05
    if h["mac_overhead_exact"] <= 0.05:
        assert small["stage_peak_bytes"] <= h["stage_peak_bytes"], (small, h)
    # --stream_input: the image leaves the arena (measured in TFLM); verify compares it row by row
    js = tmp_path / "stream.json"
    r = _rewrite(base + [f"--out={tmp_path / 'stream.tflite'}", "--halo=auto", "--stream_input", f"--json_out={js}"])
    assert r.returncode == 0, r.stderr[-2000:]
    streamed = json.loads(js.read_text())["tflm"]["rewritten"]["arena_total_bytes"]
    assert streamed < measured["auto"] - 10_000, (streamed, measured)
    r = subprocess.run([sys.executable, "-m", "pipelines.verify", f"--original={src}", "--samples=2",
                        f"--rewritten={tmp_path / 'stream.tflite'}"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "rows read per sample: tflite 96, tflm 96 of 96" in r.stdout, r.stderr[-500:]
    out = tmp_path / "bad.tflite"
    for extra, message in ((["--mode=builtin"], "--halo applies to --mode=custom only"),
                           (["--mode=builtin", "--kernels=reference", "--halo=none"], "--kernels applies to --mode=custom"),
                           (["--mode=builtin", "--core=cortex-m55", "--halo=none"], "--core applies to --mode=custom"),
                           (["--halo_max_mac_overhead=0.1"], "applies to --halo=smallest only"),
                           (["--halo=smallest", "--halo_max_mac_overhead=-1"], "expected a fraction >= 0")):
        args = [a for a in base if not any(a.split("=")[0] == e.split("=")[0] for e in extra)]
        r = _rewrite(args + [f"--out={out}", "--halo=all"] + extra)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and message in last, r.stderr[-500:]
        assert "Traceback" not in r.stderr and not out.exists()
    r = _rewrite(base + [f"--out={out}", "--halo=some"])
    assert r.returncode != 0 and "halo" in r.stderr and not out.exists()


# ============================================================================= streamed input
@pytest.mark.parametrize("name,grid", CASES, ids=[c[0] for c in CASES])
def test_streamed_input_bit_exact(name, grid, zoo_models):
    """tfmcu_stage_run_streamed: the input comes row band by row band from a provider into a window in scratch;
    rows are asked for in increasing order, each at most once; results are tfmcu_stage_run's."""
    data, g, s = _schedule(zoo_models, name, grid)
    x = random_inputs(data, 1, seed=8)[0]
    for h in (None, _caches(s, "all")):
        p = pack.pack_stage(data, g, s, halo=h)
        ref = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor])
        prepared = binding.prepare(p)
        assert prepared.input_window_bytes == pack.input_window_bytes(p) > 0
        assert prepared.streamed_scratch_bytes == -(-prepared.scratch_bytes // 4) * 4 + prepared.input_window_bytes
        # the analytic streamed peak (tfmcu.plan.halo): stage output + caches + working set + row window
        analytic = (h or halo.halo_caches(s)).stage_peak_bytes_streamed - sum(g.tensors[t].nbytes
                                                                             for t in s.stage_outputs)
        assert analytic <= prepared.streamed_scratch_bytes <= analytic + 4 * (len(p.caches) + 2)
        out, calls = binding.run_stage_streamed(p, x[0])
        assert np.array_equal(out, ref)
        ends = [0] + [a + n for a, n in calls]
        assert all(a >= e and n > 0 for (a, n), e in zip(calls, ends)), calls  # increasing, each row once
        image_rows = p.tensor_shapes[p.input_tensor][0]
        assert ends[-1] <= image_rows and sum(n for _, n in calls) <= image_rows
        row_bytes = x[0].nbytes // image_rows
        print(f"{name} {grid} {'caches' if h else 'recompute'}: input window {prepared.input_window_bytes} B "
              f"({prepared.input_window_bytes // row_bytes} of {image_rows} rows), provider calls {calls}")
        # too little scratch: refused before the provider is asked for anything
        with pytest.raises(binding.PatchKernelError, match="scratch buffer too small"):
            binding.run_stage_streamed(p, x[0], scratch=np.zeros(prepared.streamed_scratch_bytes - 1, np.uint8))
        # a provider failure stops the run with its status
        with pytest.raises(binding.PatchKernelError, match=r"\(99\)"):
            binding.run_stage_streamed(p, x[0], fail_at=len(calls) - 1)


def test_streamed_input_in_tflm_keeps_the_image_out_of_the_arena(zoo_models, tmp_path):
    """Custom mode with streamed input: the model's input is a one-element placeholder, the kernel reads the image
    through the provider registered as the interpreter's external context (the host runner's reads rows of a .npy):
    bit-exact, every image row read once, the arena smaller by about the image, the predictor's head exact."""
    name, grid = "mbv2_035_96", 4
    data, g, s = _schedule(zoo_models, name, grid)
    inputs = random_inputs(data, 3, seed=6)
    ref = run_tflite(data, inputs)
    plain = custom.rewrite_custom(data, g, s, name).model
    base = run_whole(plain, inputs, name).arena
    for h in (None, halo.choose_caches(s, s.peak_sram_bytes)):
        model = custom.rewrite_custom(data, g, s, name, halo=h, streamed_input=True).model
        opts = _options(model)
        assert opts["streamed_input"] == 1
        back = custom.load_custom(model).packed  # read back (with or without caches)
        assert back.scratch_bytes == opts["scratch_bytes"] and binding.check_stage(back) == (0, -1)
        m = ts.load_model(model)
        token = m.subgraphs[0].tensors[int(m.subgraphs[0].inputs[0])]
        assert list(token.shape) == [1] and token.type == ts.TensorType.INT8
        got = run_whole(model, inputs, name)
        for a, b in zip(got.outputs, ref):
            assert np.array_equal(a[0], b[0])
        assert got.streamed_rows_read == [s.graph.tensors[s.stage_inputs[0]].shape[1]] * len(inputs)
        image = inputs[0][0].nbytes
        saved = base.arena_used_bytes - got.arena.arena_used_bytes
        pred = predict_arena(from_tflite(model), model=model)
        assert pred.head == got.arena.head_bytes
        assert got.arena.patch_stage_persistent_bytes == kernel_memory(opts, 8)[0]
        if h is None:  # the image leaves the arena, a window of rows takes its place
            assert image - opts["input_window_bytes"] - 64 <= saved <= image
        print(f"{name} {grid}{' + caches' if h else ''} streamed: measured arena {got.arena.arena_used_bytes} B "
              f"(not streamed, recompute: {base.arena_used_bytes} B; image {image} B, window "
              f"{opts['input_window_bytes']} B)")
    # without a registered provider the kernel fails with one line
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    np.save(tmp_path / "x.npy", np.zeros((1, 1), np.int8))
    r = subprocess.run([str(runner_path()), str(path), str(tmp_path), str(tmp_path / "x.npy")], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "no TfmcuInputProvider registered" in r.stderr, r.stderr[-500:]


# ============================================================================= the rest's convolutions in Flash
@pytest.mark.parametrize("name,grid", [("mbv2_035_96", 4), ("resnet_like", 3)], ids=["mbv2_035_96", "resnet_like"])
def test_rest_convs_in_flash_shrink_the_tail(zoo_models, name, grid):
    """convs_to_flash: the convolutions after the stage become one-layer TFMCU_PATCH_STAGE ops with their
    multipliers in Flash (the last convolution, read only by the global pool: with the pool): bit-exact in TFLM,
    the measured tail smaller by what the predictor says, the head unchanged; on the unpatched model too."""
    data, g, s = _schedule(zoo_models, name, grid)
    inputs = random_inputs(data, 2, seed=3)
    ref = run_tflite(data, inputs)
    patched = custom.rewrite_custom(data, g, s, name).model
    for label, model in (("unpatched", data), ("patched", patched)):
        before = run_whole(model, inputs, name).arena
        flash = custom.convs_to_flash(model, name, build="host")  # decided for the machine that measures
        assert flash.replaced, flash.kept
        # our op data and one tensor record for the blob are less than TFLM's op data, multipliers and the two
        # records of the filter and bias: every convolution and classifier moves, even a 10-class one
        assert not [e for e in flash.kept if "tfmcu_persistent_bytes" in e], flash.kept
        got = run_whole(flash.model, inputs, name)
        for a, b in zip(got.outputs, ref):
            assert np.array_equal(a[0], b[0])
        assert got.arena.head_bytes == before.head_bytes
        pred_before = predict_arena(from_tflite(model), model=model)
        pred = predict_arena(from_tflite(flash.model), model=flash.model)
        assert pred.head == got.arena.head_bytes
        # the tail shrinks by what the predictor says it does (the predictor is within 1% on this host)
        assert got.arena.tail_bytes < before.tail_bytes
        assert abs((before.tail_bytes - got.arena.tail_bytes) - (pred_before.tail - pred.tail)) <= 0.01 * \
            before.tail_bytes
        m = ts.load_model(flash.model)
        n_ops = sum(ts.op_name(m, op) == "custom:TFMCU_PATCH_STAGE" for op in m.subgraphs[0].operators)
        assert n_ops == len(flash.replaced) + (label == "patched")
        # both end with a convolution that only the global pool reads: its stage ends with the pool's sums
        pooled = [e for e in flash.replaced if "pool" in e]
        names = [ts.op_name(m, op) for op in m.subgraphs[0].operators]
        assert len(pooled) == 1 and "MEAN" not in names, names
        print(f"{name} {label}: {len(flash.replaced)} convolutions moved, {len(flash.kept)} kept; measured tail "
              f"{before.tail_bytes} -> {got.arena.tail_bytes} B, arena {before.arena_used_bytes} -> "
              f"{got.arena.arena_used_bytes} B")
    # tools that read one stage say so in one line
    with pytest.raises(custom.RewriteError, match="rest_convs"):
        custom.load_custom(flash.model)
    # an in-place plan keeps its overlaps: our one-layer conv ops read and write in the reference kernels' order
    # (tfmcu.tflite.patch_stage_format.single_layer), so the head stays the in-place one, bit-exact
    inplace = custom.rewrite_custom(data, g, s, name, inplace=True).model
    before = run_whole(inplace, inputs, name).arena
    moved = custom.convs_to_flash(inplace, name, inplace=True, build="host")
    got = run_whole(moved.model, inputs, name)
    for a, b in zip(got.outputs, ref):
        assert np.array_equal(a[0], b[0])
    assert got.arena.head_bytes == before.head_bytes and got.arena.tail_bytes < before.tail_bytes


def test_float_input_quantize_in_flash(zoo_models):
    """convs_to_flash moves a float model's input QUANTIZE into a one-layer stage (our kernel) with its
    convolutions: bit-exact in TFLM, no QUANTIZE left, the arena's head unchanged."""
    name = "tiny_float_input"
    data = zoo_models(name)
    inputs = random_inputs(data, 2, seed=5)
    ref = run_tflite(data, inputs)
    before = run_whole(data, inputs, name).arena
    flash = custom.convs_to_flash(data, name, build="host")
    assert [e for e in flash.replaced if e["builtin"] == "QUANTIZE"], flash.replaced
    m = ts.load_model(flash.model)
    assert "QUANTIZE" not in [ts.op_name(m, op) for op in m.subgraphs[0].operators]
    got = run_whole(flash.model, inputs, name)
    for a, b in zip(got.outputs, ref):
        assert np.array_equal(a[0], b[0])
    assert got.arena.head_bytes == before.head_bytes


def test_fully_connected_in_flash_bit_exact(zoo_models):
    """MobileNetV2-0.35-144's 1000-class classifier (per-channel weights: TFLM's Prepare keeps 8,000 B of multipliers
    in the tail) runs as a one-layer TFMCU_PATCH_STAGE op, the 1x1 convolution it computes, its multipliers in
    Flash: outputs equal TF Lite's in TFLM, the measured tail smaller by at least those 8,000 B less our op data."""
    data = zoo_models("mbv2_035_144")
    inputs = random_inputs(data, 2, seed=5)
    ref = run_tflite(data, inputs)
    flash = custom.convs_to_flash(data, "mbv2_035_144", build="host")
    fc = [e for e in flash.replaced if e["builtin"] == "FULLY_CONNECTED"]
    assert len(fc) == 1 and fc[0]["out_channels"] == 1000 and fc[0]["tflm_persistent_bytes"] >= 8000, flash.kept
    before = run_whole(data, inputs, "mbv2_035_144").arena
    got = run_whole(flash.model, inputs, "mbv2_035_144")
    for a, b in zip(got.outputs, ref):
        assert np.array_equal(a[0], b[0])
    saved = sum(e["tflm_persistent_bytes"] - e["tfmcu_persistent_bytes"] for e in flash.replaced)
    assert before.tail_bytes - got.arena.tail_bytes >= 0.9 * saved
    assert predict_arena(from_tflite(flash.model), model=flash.model, build="host").total == \
        got.arena.arena_used_bytes
