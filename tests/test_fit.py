"""``fit`` and the joint schedule search: every candidate in every custom-mode configuration, priced by the
predicted TFLM arena and (with a latency predictor) predicted instructions; objectives latency and memory within
max_latency; a model and a target -> a verified model and its firmware folder, or one line saying why not."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.errors import UsageError  # noqa: E402
from tfmcu.firmware.targets import get_target  # noqa: E402
from tfmcu.flows import fit  # noqa: E402
from tfmcu.flows.deploy import DeployOptions  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec  # noqa: E402
from tfmcu.plan.halo import HaloOptions  # noqa: E402
from tfmcu.plan.regions import ScheduleError  # noqa: E402
from tfmcu.plan.search import WIDE_GRIDS, SearchOptions, candidates, search  # noqa: E402
from tfmcu.stage.cost import CustomArenaCost, CustomOptions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [CustomOptions(inplace=True, kernels="reference", halo=HaloOptions(mode=h), rest_convs=r)
           for h in ("none", "all") for r in ("tflm", "tfmcu")]
OPTS = dict(patch_options=(1, 2, 3), rectangular=False)


def _size(model: bytes) -> int:
    """A stand-in latency predictor for the search's logic: deterministic, differs between configurations."""
    return len(model)


@pytest.fixture(scope="module")
def tiny(zoo_models):
    data = zoo_models("tiny_per_tensor")
    return data, from_tflite(data, name="tiny_per_tensor")


def test_joint_search_prices_every_configuration_and_finds_the_smallest(tiny):
    data, g = tiny
    joint = search(g, CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m"), None,
                   SearchOptions(objective="memory", **OPTS))
    labels = {e.variant_label for e in joint.evaluated if e.candidate.patched}
    assert labels <= {c.label for c in CONFIGS} and len(labels) >= 2
    for c in CONFIGS:  # the joint minimum is at most each configuration's own minimum
        alone = search(g, CustomArenaCost(data, g, options=c, build="cortex-m"), None,
                       SearchOptions(objective="memory", **OPTS))
        assert joint.chosen.cost <= alone.chosen.cost
    assert any(e.cost == joint.chosen.cost for e in joint.evaluated)
    # every lower bound is a floor under the cost it bounds
    cost = CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m")
    for e in joint.evaluated:
        assert cost.lower_bound(e.candidate, e.variant) <= e.cost, e.describe()


def test_latency_objective_and_max_latency(tiny):
    data, g = tiny
    cost = CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m", instructions=_size)
    smallest = search(g, cost, None, SearchOptions(objective="memory", **OPTS)).chosen
    budget = (smallest.cost + search(g, cost, None, SearchOptions(objective="memory", **OPTS)).baseline.cost) // 2
    res = search(g, CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m", instructions=_size), budget,
                 SearchOptions(objective="latency", **OPTS))
    assert res.chosen is not None and res.chosen.cost <= budget and res.chosen.candidate.patched
    fitting = [e for e in res.evaluated if e.candidate.patched and e.cost <= budget]
    assert res.chosen.instructions == min(e.instructions for e in fitting)
    assert "fastest that fits" in res.message and "instructions" in res.message
    # max_latency 1.0: every rewrite here has more bytes (the stand-in's instructions) than the original: no patching
    capped = search(g, CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m", instructions=_size), None,
                    SearchOptions(objective="memory", max_latency=1.0, **OPTS))
    assert not capped.chosen.candidate.patched
    loose = search(g, CustomArenaCost(data, g, configs=CONFIGS, build="cortex-m", instructions=_size), None,
                   SearchOptions(objective="memory", max_latency=3.0, **OPTS))
    assert loose.chosen.cost == smallest.cost
    with pytest.raises(ScheduleError, match="predicts instructions"):
        search(g, CustomArenaCost(data, g, configs=CONFIGS), budget, SearchOptions(objective="latency", **OPTS))
    with pytest.raises(ScheduleError, match="max_latency"):
        SearchOptions(objective="macs", max_latency=1.1).validate()


@pytest.mark.parametrize("objective", ["memory", "latency"])
def test_workers_price_ahead_and_the_search_decides_as_one_process(zoo_models, objective):
    """With worker processes pricing the candidates ahead, the search takes their figures in its own order: the same
    evaluations, choice and message as in one process; the chosen and the smallest carry their built model."""
    data = zoo_models("mbv2_035_96")
    g = from_tflite(data, name="mbv2_035_96")
    o = fit.FitOptions(model="mbv2_035_96", firmware=DeployOptions(tflite="", target="stm32f405"), objective=objective,
                       max_latency=1.10, patch_options=(1, 2, 3, 4), max_stages=2, halo_modes=("none", "all"))
    t = get_target(o.target)
    budget = fit.arena_budget(o, t)
    runs = {}
    for workers in (1, 2):
        opts = SearchOptions(patch_options=o.patch_options, rectangular=False, max_stages=o.max_stages,
                             objective=objective, max_latency=o.max_latency if objective == "memory" else None,
                             workers=workers)
        runs[workers] = search(g, fit.cost_function(o, t, data, g, budget), budget, opts)
    one, two = (dict(runs[w].to_dict(), search_seconds=None) for w in (1, 2))
    assert one == two and runs[1].chosen.candidate.patched and len(runs[1].evaluated) > 10
    for res in runs.values():
        assert res.chosen.result.model[4:8] == b"TFL3" and res.smallest.result is not None
    assert runs[2].chosen.result.model == runs[1].chosen.result.model
    # the workers priced some: their evaluations are kept without the built model (one process keeps every one)
    patched = {w: [e for e in runs[w].evaluated if e.candidate.patched] for w in (1, 2)}
    assert any(e.result is None for e in patched[2]) and all(e.result is not None for e in patched[1])


def test_fit_writes_a_verified_model_and_its_firmware(zoo_models, tmp_path):
    """MobileNetV2-0.35-96 does not fit the STM32F405 per layer (predicted ~200 kB); fit finds a configuration that
    does, verifies it bit-exact and writes the folder (deploy without --run: TFLM on this host must agree)."""
    model = tmp_path / "mbv2.tflite"
    model.write_bytes(zoo_models("mbv2_035_96"))
    out = tmp_path / "fit"
    o = fit.FitOptions(model=str(model), firmware=DeployOptions(tflite="", target="stm32f405", kernels="reference"),
                       out_dir=str(out), patch_options=(1, 3), halo_modes=("none",), rest_convs=("tfmcu",),
                       verify_samples=2)
    rep = fit.run(o, log=lambda m: None)
    budget = fit.arena_budget(o, get_target("stm32f405"))
    assert rep.per_layer.predicted_arena_bytes > budget
    ch = rep.chosen
    assert ch.patched and ch.predicted_arena_bytes <= budget and ch.predicted_instructions > 0
    assert rep.verify.bit_exact
    assert sorted(os.listdir(out)) == ["firmware", "fit.json", "fit.png", "memory.png", "model.tflite", "report.md"]
    written = json.loads((out / "fit.json").read_text())
    assert written["chosen"] == ch.to_json()  # fit.json keeps its field names
    assert fit.FitReport.from_json(written) == rep and fit.FitReport.from_json(rep.to_json()).to_json() == written
    dep = json.loads((out / "firmware" / "deploy.json").read_text())
    assert dep["arena"]["predicted_bytes"] == ch.predicted_total_bytes  # the search's prediction is deploy's
    assert dep == rep.deploy.to_json() and dep["arena"]["host_measured_bytes"] is not None
    assert (out / "fit.png").read_bytes()[:4] == b"\x89PNG" and (out / "memory.png").read_bytes()[:4] == b"\x89PNG"
    # the memory timeline: its peak is the planned arena (the head where TFLM's persistent data is apart, in the CCM
    # here), one point per operator, the patch stage marked; the per-layer model's peaks at its one-arena prediction
    arena = rep.deploy.arena
    peak = max(p.arena_bytes for p in arena.timeline)
    assert peak == (arena.predicted_head_bytes if arena.persistent_bytes else arena.predicted_bytes)
    assert [p.op for p in arena.timeline] == list(range(len(arena.timeline)))
    assert any(p.type == "custom:TFMCU_PATCH_STAGE" for p in arena.timeline)
    assert max(p.arena_bytes for p in rep.per_layer_timeline) == rep.per_layer.predicted_total_bytes
    report = (out / "report.md").read_text()
    assert "## Memory over the ops" in report and f"The peak: {peak:,} B at op" in report
    assert "**patch stage**" in report


def test_persistent_tail_apart_counts_only_the_head(zoo_models, tmp_path):
    """On the STM32F405 TFLM's persistent tail goes to the CCM where it fits (deploy), so the search counts each
    candidate's head against the SRAM budget (its tail within the CCM's room), and the candidate reports both; with
    persistent_apart off it counts the one arena. Every candidate's lower bound stays under its cost."""
    model = tmp_path / "mbv2.tflite"
    model.write_bytes(zoo_models("mbv2_035_96"))
    o = fit.FitOptions(model=str(model), firmware=DeployOptions(tflite="", target="stm32f405", kernels="reference"),
                       patch_options=(3,), halo_modes=("none",), rest_convs=("tfmcu",))
    t = get_target("stm32f405")
    assert fit.persistent_room(o, t) == int(64 * 1024 / 1.02) // 16 * 16 - 16
    one_arena = dataclasses.replace(o, firmware=dataclasses.replace(o.firmware, persistent_apart=False))
    assert fit.persistent_room(one_arena, t) is None
    assert fit.persistent_room(o, get_target("cortex-m4")) is None
    data, _ = fit.model_bytes(o, lambda m: None)
    apart = fit.price(o, data, "mbv2")
    one = fit.price(one_arena, data, "mbv2")
    a, b = apart.chosen, one.chosen
    assert a is not None and b is not None and a.describe == b.describe
    assert 0 < a.predicted_persistent_bytes <= fit.persistent_room(o, t) and b.predicted_persistent_bytes is None
    assert a.predicted_arena_bytes < b.predicted_arena_bytes < a.predicted_total_bytes
    graph = from_tflite(data, name="mbv2")
    cost = fit.cost_function(o, t, data, graph, apart.budget_bytes)
    plans = candidates(graph, SearchOptions(patch_options=(3,), rectangular=False, max_mac_overhead=0.3,
                                            max_stages=1, objective="memory"))
    for plan in plans[1:6]:
        ev = cost.evaluate(plan, None)
        assert cost.lower_bound(plan, None) <= ev.cost
        d = ev.details  # apart where the tail fits the room, else the one arena
        assert d["persistent_apart"] == (d["predicted_arena_tail_bytes"] <= fit.persistent_room(o, t))
        assert ev.cost == d["predicted_arena_head_bytes" if d["persistent_apart"] else "predicted_arena_bytes"]


def test_a_model_that_cannot_fit_is_one_line(zoo_models, tmp_path):
    model = tmp_path / "mbv2.tflite"
    model.write_bytes(zoo_models("mbv2_035_96"))
    o = fit.FitOptions(model=str(model), firmware=DeployOptions(tflite="", target="stm32f405", kernels="reference"),
                       out_dir=str(tmp_path / "no"), patch_options=(1,))
    with pytest.raises(UsageError, match=r"does not fit the stm32f405 at any configuration tried: the smallest "
                                         r"predicted TFLM arena is [\d,]+ B \(activations and scratch") as e:
        fit.run(o, log=lambda m: None)
    assert "--stream_input" not in str(e.value)  # per layer only: streaming the image changes nothing
    assert not os.path.exists(tmp_path / "no")
    with pytest.raises(UsageError, match="--max_latency=0.9"):
        fit.validate(fit.FitOptions(model=str(model), max_latency=0.9))
    with pytest.raises(UsageError, match="--max_stages=0"):
        fit.validate(fit.FitOptions(model=str(model), max_stages=0))
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "pipelines.fit", f"--tflite={model}", "--model=mbv2"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == "fit: error: give --tflite or --model, not both"


def test_a_model_that_fits_only_streamed_names_the_option(tmp_path):
    """A 192x192x3 image alone (110,592 B) is almost the STM32F405's budget: nothing fits with it in the arena, a
    patch stage reading it row band by row band does. The one line names --stream_input and that arena, which is
    what fit with --stream_input chooses."""
    spec = NetSpec(name="wide_image", resolution=192, stem=StemSpec(8, kernel=3, stride=2),
                   stages=[StageSpec([BlockSpec(8, kernel=3, expand=1, stride=2)]),
                           StageSpec([BlockSpec(16, kernel=3, expand=2, stride=2)])],
                   head=HeadSpec(16, num_classes=4))
    spec.save(str(tmp_path / "wide.json"))
    o = fit.FitOptions(model=str(tmp_path / "wide.json"),
                       firmware=DeployOptions(tflite="", target="stm32f405", kernels="reference"),
                       out_dir=str(tmp_path / "no"), patch_options=(1, 4), halo_modes=("none",), rest_convs=("tfmcu",))
    with pytest.raises(UsageError, match=r"does not fit the stm32f405 at any configuration tried: .*; with "
                                         r"--stream_input \(your firmware provides the image rows\) it fits: "
                                         r"([\d,]+) B with ") as e:
        fit.run(o, log=lambda m: None)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "no")
    figure = int(re.search(r"it fits: ([\d,]+) B", str(e.value)).group(1).replace(",", ""))
    data, _ = fit.model_bytes(o, lambda m: None)
    streamed = fit.price(dataclasses.replace(o, stream_input=True), data, "wide_image")
    assert streamed.feasible and streamed.chosen.predicted_arena_bytes == figure <= streamed.budget_bytes


def test_fit_command_line(zoo_models, tmp_path):
    """fit without a model is one line (no default model); --help shows fit's own defaults (objective latency, its
    grids); --grids is the grids searched: with per-layer only, MobileNetV2-0.35-96 fits no configuration."""
    env = dict(os.environ, PYTHONPATH=ROOT)

    def fit_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipelines.fit", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    r = fit_cli("--target=stm32f405", f"--out_dir={tmp_path / 'o'}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("fit: error: give the model: --tflite="), \
        r.stderr
    text = fit_cli("--help").stdout
    objective = text[text.index("--objective:"):]
    assert "<latency|memory>" in objective and objective.index("(default: 'latency')") < objective.index("\n  --")
    grids = text[text.index("--grids:"):]
    assert f"(default: '{','.join(map(str, WIDE_GRIDS))}')" in grids[:grids.index("\n  --")]
    stages = text[text.index("--max_stages:"):]
    assert "by default any number" in " ".join(stages[:stages.index("\n  --")].split())
    model = tmp_path / "mbv2.tflite"
    model.write_bytes(zoo_models("mbv2_035_96"))
    for grids, message in (("1", "does not fit the stm32f405 at any configuration tried"),
                           ("0", "--grids=0: expected integers >= 1")):
        r = fit_cli(f"--tflite={model}", "--target=stm32f405", "--kernels=reference", f"--grids={grids}",
                    f"--out_dir={tmp_path / 'o'}")
        lines = [ln for ln in r.stderr.strip().splitlines() if "error:" in ln]
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr[-2000:]
    assert not os.path.exists(tmp_path / "o")


def test_rewrite_auto_takes_halo_and_the_other_configurations(zoo_models, tmp_path):
    """rewrite --patches=auto with --halo (and in place, rest convs, streamed input): one joint-search variant."""
    from tfmcu.flows.common import ScheduleRequest
    from tfmcu.flows.rewrite import RewriteOptions, run

    src = tmp_path / "tiny.tflite"
    src.write_bytes(zoo_models("tiny_per_tensor"))
    for halo in ("all", "smallest"):
        o = RewriteOptions(tflite=str(src), out=str(tmp_path / f"{halo}.tflite"), mode="custom", measure=False,
                           schedule=ScheduleRequest(patches="auto", search=SearchOptions(objective="memory")),
                           custom=CustomOptions(halo=HaloOptions(mode=halo), inplace=True, kernels="reference",
                                                rest_convs="tfmcu"))
        rep = run(o, log=lambda m: None)
        assert rep.patched and rep.halo["cache_bytes"] > 0 and rep.rest_convs["replaced"] >= 1
        assert rep.search["chosen"]["variant"] is None  # one configuration: the search's single variant
