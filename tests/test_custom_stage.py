"""Custom mode: the patch stage as one TFMCU_PATCH_STAGE op run by the C kernels, the rest by TFLM / TFLite.

Bit-exact against the original model on every zoo model of the verify suite; the op's stage blob holds the stage's
weights once (no Flash duplication); memory reported as run here and as the single-arena peak; pipelines accept it.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu import abi  # noqa: E402
from tfmcu.graph import from_tflite as lower_tflite  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.runtime.host import HostRunner  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.runtime.tflm import measure_arena, run_tflm  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole  # noqa: E402
from tfmcu.stage import custom as custom_stage  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = [name for name, m in zoo.ZOO.items() if not m.tags]
GRIDS = {"mbv2_035_96": 4, "kernels_symmetric": (3, 2), "keras_mobilenet_v2": 3, "keras_mobilenet_v1": (2, 3),
         "resnet_like": 3, "tiny_per_tensor": 2, "tiny_float_input": 3}


@pytest.fixture(scope="session")
def models(zoo_models):
    return zoo_models


def _custom(models, name: str):
    data = models(name)
    g = lower_tflite.from_tflite(data, name=name)
    e = zoo.ZOO[name]
    s = scheduler.schedule(g, GRIDS[name], n_blocks=e.patch_blocks, n_ops=e.patch_ops)
    return data, s, custom_stage.rewrite_custom(data, g, s, name)


@pytest.mark.parametrize("name", SUITE)
def test_custom_mode_is_bit_exact(models, name):
    data, s, res = _custom(models, name)
    assert res.ops_after == res.ops_before - len(s.stage) + 1
    runner = HostRunner(res.model, name)
    inputs = random_inputs(data, 5, seed=3)
    ref_tflm, ref_tflite = run_tflm(data, inputs), run_tflite(data, inputs)
    got_tflm, got_tflite = runner.run(inputs, rest="tflm"), runner.run(inputs, rest="tflite")
    assert np.stack([r[0] for r in ref_tflm]).astype(float).std(axis=0).max() > 0
    for a, b, c, d in zip(ref_tflm, got_tflm, ref_tflite, got_tflite):
        assert np.array_equal(a[0], b[0]) and np.array_equal(c[0], d[0])


def test_custom_op_holds_each_weight_once_and_costs_little_flash(models):
    data, s, res = _custom(models, "mbv2_035_96")
    m0, m1 = ts.load_model(data), ts.load_model(res.model)
    op = m1.subgraphs[0].operators[0]
    assert ts.op_name(m1, op) == f"custom:{custom_stage.PATCH_STAGE_OP}"
    # The op reads [stage input, stage blob]; the blob holds every filter of the stage, whose own tensors are gone:
    # only int32 multiplier/shift arrays (8 B per channel), the tables and the options are new.
    assert len(op.inputs) == 2
    blob = ts.buffer_data(m1, m1.subgraphs[0].tensors[int(op.inputs[1])])
    sg0 = m0.subgraphs[0]
    filters = [int(sg0.operators[s.graph.ops[k].src_index].inputs[1]) for k in s.stage
               if s.graph.ops[k].type in ("conv2d", "depthwise_conv2d")]
    assert filters
    kept = {ts.buffer_data(m1, t) for t in m1.subgraphs[0].tensors if int(t.buffer or 0) > 0} - {blob}
    for t in filters:
        w = ts.buffer_data(m0, sg0.tensors[t])
        assert w in blob and w not in kept
    # Flash: the buffers grow by the blob's tables (its bytes before the constants), the multipliers and shifts
    # (8 B per output channel), the arrays' alignment and the schedule record; an orphaned weight buffer would fail
    channels = sum(zoo_out for zoo_out in (op_.out_channels for op_ in (s.graph.ops[k] for k in s.stage))
                   if zoo_out)
    total = lambda m: sum(len(b.data) for b in m.buffers if b.data is not None)  # noqa
    header = np.frombuffer(blob[:abi.sizeof("TfmcuStageBlob")], "<i4")
    tables = int(header[abi.word_offsets("TfmcuStageBlob")["constants"]])
    assert total(m1) - total(m0) <= tables + 8 * channels + 12 * len(s.stage) + len(json.dumps(res.schedule)) + 64
    rec = json.loads(bytes(m1.buffers[[mm.buffer for mm in m1.metadata
                                       if mm.name == b"tfmcu_schedule"][0]].data).decode())
    assert rec["mode"] == "custom" and rec["scratch_bytes"] > 0


def test_memory_report(models):
    """The report's prediction is what TFLM (built from source, with the kernel) measures for the whole model."""
    data, s, res = _custom(models, "mbv2_035_96")
    mem = custom_stage.memory_report(res.model)
    measured = run_whole(res.model, random_inputs(data, 1, seed=2), "m").arena
    assert mem["predicted"]["arena_head_bytes"] == measured.head_bytes
    assert abs(mem["predicted"]["arena_total_bytes"] - measured.arena_used_bytes) <= 0.01 * measured.arena_used_bytes
    assert mem["patch_stage_persistent_bytes"]["host_64bit"] == measured.patch_stage_persistent_bytes
    assert mem["patch_stage_persistent_bytes"]["cortex_m_32bit"] < measured.patch_stage_persistent_bytes
    # The packed stage holds exactly the scheduler's analytic stage peak: input + stage output + scratch.
    assert mem["input_bytes"] + mem["stage_output_bytes"] + mem["scratch_bytes"] == s.stage_peak_bytes
    assert mem["scratch_bytes"] >= 1 and mem["input_bytes"] == 96 * 96 * 3
    assert measured.arena_used_bytes < measure_arena(data).total


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_pipelines_in_custom_mode(models, tmp_path):
    src = tmp_path / "m.tflite"
    src.write_bytes(models("tiny_float_input"))
    out, rep, ver = tmp_path / "c.tflite", tmp_path / "r.json", tmp_path / "v.json"
    r = _run("pipelines.rewrite", f"--tflite={src}", f"--out={out}", "--mode=custom", "--patches=2",
             "--patch_blocks=3", f"--json_out={rep}")
    assert r.returncode == 0, r.stderr
    d = json.loads(rep.read_text())
    assert d["custom_mode"]["scratch_bytes"] > 0
    # Custom mode's memory is measured: the whole model in TFLM built from source with the kernel (issue 9).
    m = d["tflm"]["rewritten"]
    assert m["measured_by"].startswith("measured by TFLM built from source") and m["patch_stage_persistent_bytes"] > 0
    assert abs(d["predicted"]["rewritten"]["arena_total_bytes"] - m["arena_total_bytes"]) <= 0.01 * m[
        "arena_total_bytes"]
    assert "whole model in TFLM built from source" in r.stdout and "ESTIMATED" not in r.stdout
    r = _run("pipelines.verify", f"--original={src}", f"--rewritten={out}", "--samples=8", f"--json_out={ver}")
    assert r.returncode == 0, r.stderr + r.stdout
    d = json.loads(ver.read_text())
    assert d["bit_exact"] and "rewritten" in d["custom_mode"]
    assert d["arena_kind"]["rewritten"].startswith("measured by TFLM built from source")
    assert d["arena_kind"]["original"].startswith("measured by TFLM")
    assert "TFMCU_PATCH_STAGE kernel" in r.stdout and "ESTIMATED" not in r.stdout
    r = _run("pipelines.rewrite", f"--tflite={src}", f"--out={tmp_path / 'a.tflite'}", "--mode=custom",
             "--patches=auto", "--sram_kb=1", "--measure=false")
    assert r.returncode == 2 and "no schedule fits" in r.stderr and not (tmp_path / "a.tflite").exists()
    # custom mode's auto search is fit's (wide grids, several stages) unless --grids / --max_stages say otherwise
    assert re.search(r" \d+ stages: \d+x\d+ over block", r.stderr.strip().splitlines()[-1]), r.stderr
    r = _run("pipelines.rewrite", f"--tflite={src}", f"--out={tmp_path / 'a.tflite'}", "--mode=custom",
             "--patches=auto", "--sram_kb=1", "--measure=false", "--grids=1,2,3,4", "--max_stages=1")
    assert r.returncode == 2 and "4x4 patches over the first" in r.stderr.strip().splitlines()[-1]
    # In-place rest of the graph: recorded, smaller, still bit-exact in verify; builtin mode refuses the flag.
    ip, ip_rep = tmp_path / "ip.tflite", tmp_path / "ip.json"
    r = _run("pipelines.rewrite", f"--tflite={src}", f"--out={ip}", "--mode=custom", "--patches=2",
             "--patch_blocks=3", "--inplace", f"--json_out={ip_rep}")
    assert r.returncode == 0 and "planned in place" in r.stdout, r.stderr
    d0, d1 = json.loads(rep.read_text()), json.loads(ip_rep.read_text())
    assert d1["schedule"]["memory_plan"] == "inplace" and d0["schedule"]["memory_plan"] == "disjoint"
    assert d1["tflm"]["rewritten"]["arena_head_bytes"] <= d0["tflm"]["rewritten"]["arena_head_bytes"]
    r = _run("pipelines.verify", f"--original={src}", f"--rewritten={ip}", "--samples=8")
    assert r.returncode == 0, r.stderr + r.stdout
    r = _run("pipelines.rewrite", f"--tflite={src}", f"--out={tmp_path / 'b.tflite'}", "--patches=2",
             "--patch_blocks=3", "--inplace")
    assert r.returncode == 2 and "--inplace" in r.stderr and not (tmp_path / "b.tflite").exists()


def test_offline_memory_plan_is_honoured_by_tflm(models):
    """The rest of the graph gets an OfflineMemoryAllocation plan when it beats TFLM's greedy planner; TFLM's
    measured head equals the planned one, the predictor reads the plan, and outputs do not change."""
    from tfmcu.plan import arena as tflm_memory
    from tfmcu.plan import memory_plan

    data, s, res = _custom(models, "mbv2_035_96")
    cm = custom_stage.load_custom(res.model)
    g = lower_tflite.from_tflite(cm.rest)
    head, offsets, greedy = memory_plan.plan(g)
    assert offsets
    planned = memory_plan.read_offline_plan(cm.rest, g)
    measured = measure_arena(cm.rest)
    assert measured.head == tflm_memory.predict_arena(g, model=cm.rest).head
    assert planned is not None  # this rest of the graph has a plan that beats TFLM's greedy planner
    assert measured.head == head < greedy
    # Writing a plan into a builtin model keeps its outputs.
    out, h2, g2 = memory_plan.with_offline_plan(data)
    assert measure_arena(out).head == h2
    inputs = random_inputs(data, 3, seed=5)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(run_tflm(data, inputs), run_tflm(out, inputs)))
