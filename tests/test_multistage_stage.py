"""Several patch stages in one model (``tfmcu.stage.custom.rewrite_stages``): each its own TFMCU_PATCH_STAGE op with its
own grid and halo caches, a later one reading a tensor the model wrote whole; bit-exact against TF Lite (stages in
the C kernels, builtins in TF Lite and in TFLM) and whole in TFLM built from source, whose arena_used_bytes equals
the prediction."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tests.support import tie_in_the_head  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.plan import regions  # noqa: E402
from tfmcu.plan.arena import predict_model_arena  # noqa: E402
from tfmcu.plan.halo import halo_caches, intermediates  # noqa: E402
from tfmcu.runtime.host import HostRunner  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.runtime.tflm import run_tflm  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole  # noqa: E402
from tfmcu.stage.common import RewriteError, read_schedule  # noqa: E402
from tfmcu.stage.custom import load_custom, rewrite_stages  # noqa: E402

NAME = "mbv2_035_96"


def _stages(graph, first: bool = True):
    """A 3x3 stage over blocks 0-2 (optional) and a 2x2 one over blocks 4-5 with every halo cached."""
    blocks = [op.block for op in graph.ops]
    later = regions.schedule(graph, (2, 2), ops=list(range(blocks.index(4), blocks.index(6))))
    inter = intermediates(later)
    out = [(later, halo_caches(later, inter, inter))]
    if first:
        out.insert(0, (regions.schedule(graph, (3, 3), n_blocks=3), None))
    return out


@pytest.mark.parametrize("streamed,first", [(False, True), (True, True), (False, False)])
def test_several_stages_are_bit_exact_and_predicted(zoo_models, streamed, first):
    data = zoo_models(NAME)
    g = from_tflite(data, name=NAME)
    stages = _stages(g, first)
    res = rewrite_stages(data, g, stages, NAME, streamed_input=streamed)
    n_stage_ops = sum(len(s.stage) for s, _ in stages)
    assert res.ops_after == res.ops_before - n_stage_ops + len(stages)
    cm = load_custom(res.model, NAME, all_stages=True)
    assert len(cm.stages) == len(stages)
    record = read_schedule(res.model)["stage_plan"]
    assert [e["ops_tflite"] for e in record] == [[g.ops[k].src_index for k in s.stage] for s, _ in stages]
    assert sorted(cm.stages) == [e["operator"] for e in record]
    assert record[-1]["halo"]["cache_bytes"] > 0 and cm.stages[record[-1]["operator"]].caches  # the later caches
    inputs = random_inputs(data, 3, seed=3)
    ref = run_tflite(data, inputs)
    assert np.stack([r[0] for r in ref]).astype(float).std(axis=0).max() > 0
    runner = HostRunner(res.model, NAME)
    for rest, want in (("tflite", ref), ("tflm", run_tflm(data, inputs))):
        got = runner.run(inputs, rest=rest)
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(want, got))
    whole = run_whole(res.model, inputs, NAME)  # every op in TFLM, the stages by the TFMCU_PATCH_STAGE kernel
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(ref, whole.outputs))
    assert whole.arena.arena_used_bytes == predict_model_arena(res.model, build="host").total


def test_overlapping_or_streamed_later_stages_are_refused(zoo_models):
    data = zoo_models(NAME)
    g = from_tflite(data, name=NAME)
    (later, halo), = _stages(g, first=False)
    with pytest.raises(RewriteError, match="streamed input needs a patch stage that starts at the first operator"):
        rewrite_stages(data, g, [(later, halo)], NAME, streamed_input=True)
    with pytest.raises(RewriteError, match="consecutive operators"):
        rewrite_stages(data, g, [(later, None), (later, None)], NAME)
    with pytest.raises(RewriteError, match="no patch stage"):
        rewrite_stages(data, g, [], NAME)


def test_the_search_prices_stage_plans_in_tflm(zoo_models):
    """A stage plan as a candidate of the one search: ``CustomArenaCost`` builds it (several stage ops, the rest in
    place, its convolutions in Flash), predicts its arena on the host build, and that model runs bit-exact in TFLM
    with arena_used_bytes = the prediction; the lower bound is below the cost."""
    from tfmcu.plan.search import SearchOptions, candidates
    from tfmcu.stage.cost import CustomArenaCost, CustomOptions

    data = zoo_models(NAME)
    g = from_tflite(data, name=NAME)
    plans = [c for c in candidates(g, SearchOptions(patch_options=(2, 3), rectangular=False, max_stages=3))
             if len(c.stages) > 1]
    assert plans
    cand = min(plans, key=lambda c: c.peak_sram_bytes)
    cfg = CustomOptions(inplace=True, rest_convs="tfmcu")
    cost = CustomArenaCost(data, g, NAME, configs=[cfg], build="host")
    (variant,) = cost.variants
    ev = cost.evaluate(cand, variant)
    assert ev.cost >= cost.lower_bound(cand, variant) > 0
    assert ev.details["stage_plan"]["stages"] == len(cand.stages) and "halo none" not in ev.describe()
    assert cost.evaluate(cand, variant).result is ev.result  # built once
    model = ev.result.model
    assert len(load_custom(model, NAME, all_stages=True).stages) >= len(cand.stages)
    inputs = random_inputs(data, 2, seed=1)
    whole = run_whole(model, inputs, NAME)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(run_tflite(data, inputs), whole.outputs))
    assert whole.arena.arena_used_bytes == ev.cost


def test_rewrite_pipeline_max_stages(zoo_models, tmp_path):
    """``rewrite --max_stages`` needs auto and custom mode (one line, exit 2); with them the search runs over stage
    plans and the output (a stage plan or not, whichever is smallest) runs in TFLM, equal to the original."""
    import json
    import subprocess
    import sys

    src = tmp_path / "m.tflite"
    src.write_bytes(zoo_models(NAME))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = [sys.executable, "-m", "pipelines.rewrite", f"--tflite={src}", f"--out={tmp_path / 'o.tflite'}"]
    bad = subprocess.run(base + ["--patches=auto", "--objective=memory", "--max_stages=3"], cwd=root,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--max_stages=3" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "o.tflite").exists()
    report = tmp_path / "r.json"
    ok = subprocess.run(base + ["--patches=auto", "--objective=memory", "--max_stages=3", "--mode=custom",
                                "--grids=2,3", "--inplace", f"--json_out={report}"],
                        cwd=root, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    r = json.loads(report.read_text())
    assert any(e.get("stage_plan") for e in r["search"]["evaluated"])  # plans were priced
    plan = (r.get("schedule") or {}).get("stage_plan")
    if plan:  # the summary names every stage and counts the ops
        assert f"schedule: {len(plan)} stages: " in ok.stdout and f"{len(plan)} TFMCU_PATCH_STAGE ops;" in ok.stdout
    if r["patched"]:  # (the flow checks the output against the original in TFLM built from source)
        assert r["tflm"]["rewritten"]["outputs_equal_original_on"]
        assert r["tflm"]["rewritten"]["arena_total_bytes"] < r["tflm"]["original"]["arena_total_bytes"]


def _pooled(graph, grid=(2, 2), blocks_before=2):
    """A stage over the last blocks that ends into the global average pool (MEAN): its input summed patch by patch."""
    pool = next(i for i, op in enumerate(graph.ops) if op.type == "mean")
    blocks = [op.block for op in graph.ops]
    start = blocks.index(blocks[pool - 1] - blocks_before)
    return regions.schedule(graph, grid, ops=list(range(start, pool + 1))), pool


@pytest.mark.parametrize("halo,streamed", [(False, True), (True, False)])
def test_a_stage_into_the_global_pool_is_bit_exact_and_predicted(zoo_models, halo, streamed):
    """The head's 1x1 convolution and the MEAN after it as one stage: the MEAN's input never exists whole (a tile
    per patch, summed into int32), bit-exact with TF Lite and TFLM's MEAN; TFLM's arena = the prediction."""
    data = zoo_models(NAME)
    g = from_tflite(data, name=NAME)
    sch, pool = _pooled(g)
    assert sch.pool == pool and sch.stage_outputs == g.ops[pool].outputs
    fm = g.tensors[sch.tiles[0]]
    assert sch.accumulator_bytes == 4 * fm.shape[3]
    whole = regions.schedule(g, sch.grid, ops=sch.tiled)  # the same ops writing the 3x3x1280 map whole
    tile = max((r.band[1] - r.band[0]) * (c.band[1] - c.band[0]) for r in sch.rows for c in sch.cols)
    assert sch.step_memory[pool] == sum(g.tensors[t].nbytes for t in sch.stage_inputs) + sch.accumulator_bytes + \
        g.tensors[sch.stage_outputs[0]].nbytes + tile * fm.shape[3]  # its input held, the sums, the output, a tile
    assert whole.stage_outputs == sch.tiles
    inter = intermediates(sch)
    assert sch.tiles[0] not in inter
    h = halo_caches(sch, inter, inter) if halo else None
    res = rewrite_stages(data, g, [(regions.schedule(g, (3, 3), n_blocks=3), None), (sch, h)], NAME,
                         streamed_input=streamed)
    cm = load_custom(res.model, NAME, all_stages=True)
    packed = cm.stages[max(cm.stages)]
    assert packed.output_shape == (1, 1, 1, fm.shape[3]) and (packed.output_tensor, 2) in [c[:2] for c in packed.caches]
    inputs = random_inputs(data, 3, seed=5)
    ref = run_tflm(data, inputs)  # (the stage's MEAN computes TFLM's bytes, which TF Lite's MEAN may round apart)
    assert np.stack([r[0] for r in ref]).astype(float).std(axis=0).max() > 0
    got = HostRunner(res.model, NAME).run(inputs, rest="tflite")
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(ref, got))
    whole = run_whole(res.model, inputs, NAME)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(ref, whole.outputs))
    assert whole.arena.arena_used_bytes == predict_model_arena(res.model, build="host").total


def test_the_pooled_stage_alone_in_the_c_kernels(zoo_models):
    """The packed pooled stage run by the C library = TF Lite's MEAN output; it touches exactly its scratch; the
    validation refuses a reduction whose tiles do not partition its input, or without its accumulator."""
    from tfmcu.kernels import binding, pack
    from tfmcu.runtime.tflite import tflite_all_tensors

    data = zoo_models(NAME)
    g = from_tflite(data, name=NAME)
    sch, _ = _pooled(g, grid=(3, 1), blocks_before=1)
    p = pack.pack_stage(data, g, sch)
    assert binding.check_stage(p) == (0, -1)
    tensors = tflite_all_tensors(data, random_inputs(data, 1, seed=2)[0])
    x = tensors(p.tensor_tflite_index[p.input_tensor])
    want = tensors(p.tensor_tflite_index[p.output_tensor])
    assert np.array_equal(binding.run_stage(p, x).reshape(-1), want.reshape(-1))
    touched, _ = binding.touched_scratch(p, x)
    assert touched == p.scratch_bytes == binding.c_scratch_bytes(p)
    last = len(p.layers) - 1

    def tile_gap(q):  # band 1 starts a row after band 0 stops: a row never summed
        q.row_spans[1, last, pack.SPAN["in_start"]] += 1

    def no_accumulator(q):
        q.caches = [c for c in q.caches if c[1] != 2]
        q.cache_bytes = q.cache_bytes[:len(q.caches)]

    for mutate in (tile_gap, no_accumulator):
        q = pack.pack_stage(data, g, sch)
        mutate(q)
        assert binding.check_stage(q)[0] == 3, mutate.__name__  # kTfmcuErrorInvalidStage


def test_verify_takes_tflm_bytes_where_tf_lite_rounds_apart(zoo_models, tmp_path):
    """MobileNetV2-0.35-144 with a logit of its classifier head on a rounding tie for one input
    (``tie_in_the_head``): TF Lite and TFLM disagree about the original there, by 1. A rewritten model whose stage
    ends into the pool and whose classifier runs in our kernels (``convs_to_flash``) gives TFLM's bytes on both
    sides: ``verify`` lists that sample (and any random one that ties too) under ``tflm_semantics`` and calls the
    model bit-exact."""
    from tfmcu.flows.verify import VerifyOptions, verify
    from tfmcu.stage.custom import convs_to_flash

    tie = random_inputs(zoo_models("mbv2_035_144"), 1, seed=7)[0]
    data = tie_in_the_head(zoo_models("mbv2_035_144"), tie)
    g = from_tflite(data, name="mbv2_035_144")
    sch, _ = _pooled(g, grid=(3, 1), blocks_before=0)
    res = rewrite_stages(data, g, [(sch, None)], "mbv2_035_144")
    model = convs_to_flash(res.model, "mbv2_035_144", stages=res.stages).model
    paths = {n: str(tmp_path / f"{n}.tflite") for n in ("original", "rewritten")}
    for n, b in (("original", data), ("rewritten", model)):
        with open(paths[n], "wb") as f:
            f.write(b)
    np.save(tmp_path / "tie.npy", tie[0])
    v = verify(VerifyOptions(original=paths["original"], rewritten=paths["rewritten"], samples=3, seed=0,
                             inputs=str(tmp_path / "tie.npy"), max_details=100, quiet=True))
    apart = v.tflite_vs_tflm.original
    # the tie (after the 3 random samples): 0 vs 1, proven on the original's head (tfmcu.runtime.agreement); no other
    # difference between the interpreters
    assert 3 in [t.sample for t in apart.ties] and apart.agree and apart.mismatching_samples == 0, apart
    assert v.bit_exact and v.tflm_semantics.samples == apart.tie_samples
    assert v.tflite_vs_tflm.rewritten.identical  # its TF Lite side computes TFLM's bytes
