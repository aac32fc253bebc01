"""``make bench``: long measurements that do not belong in ``make test`` (``pipelines.bench``). Each section writes
out/bench/<section>.json (its data and the record of the run) and out/bench/<section>.md (its table, rendered from
that JSON by the section's function in ``SECTION_TABLES``, which the docs use too: ``benchmarks.docs``); pick with
``sections``.

- rewrite: model x schedule -> TFLM arena of the original and the builtin-rewritten model (measured by TFLM itself,
  input image counted), ratio, predicted vs measured, MAC overhead (padded / exact), op count, bit-exactness.
- custom: custom mode (one TFMCU_PATCH_STAGE op): the whole model run in TFLM built from source with our kernel, its
  MEASURED arena against the original's, the prediction, rest of the graph planned disjoint and in place,
  bit-exactness; the in-place plans' pairs and lower bounds.
- firmware: the patch stage on Cortex-M4/M7 under QEMU, p x p vs p = 1 instruction counts against MAC overhead.
- train: the full training recipe on Fashion-MNIST at 96x96 (about 1.5 h on 2 cores; resumes from checkpoints).
- resolution: one fixed network trained on the scenes task (``tfmcu.data.scenes``: small objects on cluttered 128 px
  canvases) at several input resolutions; test accuracy against resolution (float and int8), with MACs and the
  measured TFLM arena of each (about 15 min on 2 cores; resumes from checkpoints).
- search: the joint architecture + schedule search against the per-layer-only search at 128 and 256 kB, winners
  fine-tuned, deployed (patched ones in custom mode) and measured in TFLM (``benchmarks.search``; about 1 h).
- halo: measured TFLM arena against MAC overhead for MobileNetV2-0.35-144 and -1.0-224: recompute, halo caches,
  streamed input, the rest's multipliers in Flash (``benchmarks.halo``; about 5 min).
- halo_firmware: the same models on Cortex-M4 / M7 under QEMU with CMSIS-NN: per layer, patched recomputing, every
  halo cached, caches + streamed input: instructions and arena (``benchmarks.halo``).
- latency: the latency predictor's calibration measured again (per-op instruction counts of the zoo models on
  Cortex-M4 / M7, both kernel sets) and the committed predictor against it (``benchmarks.latency``; about 20 min).
- fit: models on their targets through the user's path: ``deploy --run`` per layer against ``fit --run`` at
  max_latency 1.00 / 1.05 / 1.25 and the smallest, CMSIS-NN, measured under QEMU (``benchmarks.fit``).
- cores: the zoo's MobileNetV2-0.35-96 and -0.35-144 on every core QEMU runs (Cortex-M3, M4, M7, M33, M55), each
  on its generic board: ``deploy --run`` per layer against ``fit --run`` at max_latency 1.05 (``benchmarks.fit``).
- named_boards: the zoo's MobileNetV2-0.35-96 on every named board through ``fit --target=BOARD --run`` with fit's
  defaults, measured under QEMU where a QEMU board has the core (``benchmarks.fit``).
- detection: detectors and classifiers trained at several resolutions, per layer vs patched at 128 / 256 kB
  (``benchmarks.detection``; hours on 2 cores, resumable).
- detection_recipe: the detector's recipe on flat shapes on noise (96 px, 1,000 training images), its defaults
  against the options it trained with before: int8 TFLM mAP@0.5 and training time; ``--init_backbone`` from a
  Fashion-MNIST classifier against training from scratch on the scenes; and the 128 px scenes within an hour of
  training (``benchmarks.detection``; about two hours).
- multistage: several patch stages per network, the analytic Pareto fronts of the stage-plan search against one
  stage and msf-CNN's quoted figures, and the chosen plans measured on the Cortex-M4 (``benchmarks.multistage``;
  about 25 min).
- foreign: models users bring (tf_keras.applications MobileNetV3, EfficientNet-B0, MobileNet, a small ResNet, a DAG),
  converted here, through ``fit --run`` on the Cortex-M4, M7 and M55 at max_latency 1.00 / 1.10 and the smallest
  against ``deploy --run`` per layer, squeeze-excite models also with squeeze-excites out of stages
  (``benchmarks.foreign``; hours on 2 cores, resumable).
- kernels: our kernels against CMSIS-NN's on the MobileNetV2 family's shapes, on every core QEMU runs: instructions
  (QEMU) and estimated cycles per function call, equal outputs, the differential fuzz (``benchmarks.kernels``; a
  few minutes).
- speed: whole models per core QEMU runs (the zoo's MobileNetV2-0.35 at 96 and 144 and 1.0 at 224, MLPerf Tiny VWW and
  ResNet-8): TFLM + CMSIS-NN per layer against TFLM + tfmcu kernels per layer and fit at max_latency 1.00 / 1.05 /
  1.10; instructions, estimated cycles, ms, arena (``benchmarks.speed``; hours on 2 cores, resumable).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from benchmarks import (detection as bench_detection, fit as bench_fit, foreign as bench_foreign, halo as bench_halo,
                        kernels as bench_kernels, latency as bench_latency, multistage as bench_multistage,
                        search as bench_search, speed as bench_speed)
from benchmarks.firmware_runs import PKG, firmware_reports, generator_record, label
from benchmarks.results import run_record
from tfmcu.errors import UsageError
from tfmcu.files import figure_png, write_outputs
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan import memory_plan
from tfmcu.plan.arena import predict_arena
from tfmcu.plan.regions import schedule
from tfmcu.plan.search import SearchOptions, candidate_for, search
from tfmcu.runtime.model_io import random_inputs
from tfmcu.runtime.tflm import measure_arena, run_tflm
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.builtin import Border, BuiltinArenaCost
from tfmcu.stage.custom import load_custom, memory_report, rewrite_custom
from tfmcu.train.config import Recipe, TrainConfig
from tfmcu.train.trainer import train

SECTIONS = ("rewrite", "custom", "firmware", "tflm_firmware", "cmsis_nn", "train", "resolution", "search", "halo",
            "halo_firmware", "latency", "fit", "cores", "named_boards", "detection", "detection_recipe",
            "multistage", "foreign", "kernels", "speed")


@dataclass
class BenchOptions:
    out_dir: str = "out/bench"
    sections: tuple[str, ...] = SECTIONS
    zoo_cache: str = "out/zoo"  # converted zoo models
    samples: int = 8  # random inputs for the bit-exactness checks
    fit_models: tuple[str, ...] = ()  # section fit: only these models (default: all of benchmarks.fit.CASES)
    fit_caps: tuple[str, ...] = ()  # section fit: only these --max_latency caps ("none": no cap; default: CAPS)
    foreign_models: tuple[str, ...] = ()  # section foreign: only these models (default: all of its MODELS)
    foreign_targets: tuple[str, ...] = ()  # section foreign: only these targets (default: all of its TARGETS)
    speed_models: tuple[str, ...] = ()  # section speed: only these models (default: all of its MODELS)
    speed_cores: tuple[str, ...] = ()  # section speed: only these cores (default: all of its CORES)


# model -> (auto-mode budget as a fraction of the original's measured arena, fixed schedules)
REWRITE_BENCH = {
    "mbv2_100_224": (0.4, [((4, 4), 5, "pad"), ((4, 4), 5, "strips"), ((3, 4), 5, "strips"), ((3, 3), 5, "strips")]),
    "mbv2_035_144": (0.65, [((4, 4), 5, "pad"), ((3, 3), 5, "strips"), ((2, 2), 5, "strips")]),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rewrite_section(o: BenchOptions) -> dict[str, Any]:
    rows = []
    for name, (fraction, fixed) in REWRITE_BENCH.items():
        t0 = time.time()
        log(f"[rewrite] {name}: converting (cached in {o.zoo_cache}) ...")
        data = zoo.build(name, o.zoo_cache)
        graph = from_tflite(data, name=name)
        m0 = measure_arena(data)
        p0 = predict_arena(graph)
        inputs = random_inputs(data, o.samples, seed=0)
        ref = run_tflm(data, inputs)
        runs: list[tuple[str, Any]] = []
        budget = int(m0.total * fraction)
        log(f"[rewrite] {name}: auto mode under {budget / 1024:.0f} kB ({fraction:.0%} of the original arena) ...")
        cost = BuiltinArenaCost(data, graph, name)
        auto = search(graph, cost, budget, SearchOptions(), progress=lambda n, t, w: log(f"    [{n}/{t}] {w}"))
        if auto.patched:
            runs.append((f"auto least MACs <= {budget / 1024:.0f} kB", auto.chosen))
        else:
            log(f"    {auto.message}")
        log(f"[rewrite] {name}: auto mode, smallest arena ...")
        smallest = search(graph, cost, None, SearchOptions(objective="memory"),
                          progress=lambda n, t, w: log(f"    [{n}/{t}] {w}"))
        if smallest.patched:
            runs.append(("auto smallest arena", smallest.chosen))
        for grid, n, border in fixed:
            runs.append((f"{grid[0]}x{grid[1]}, n={n}, {border}",
                         cost.evaluate(candidate_for(graph, grid, n), Border(border))))
        for label, ev in runs:
            m1 = measure_arena(ev.result.model)
            got = run_tflm(ev.result.model, inputs)
            exact = all(np.array_equal(a[0], b[0]) for a, b in zip(ref, got))
            s = ev.candidate.schedules()[0]
            row = {
                "model": name, "schedule": label, "grid": list(ev.candidate.grid), "patch_blocks": s.n_blocks,
                "border": ev.variant_label, "bit_exact": exact,
                "tflm_original_bytes": m0.total, "tflm_rewritten_bytes": m1.total,
                "tflm_original_head": m0.head, "tflm_rewritten_head": m1.head,
                "tflm_original_tail": m0.tail, "tflm_rewritten_tail": m1.tail,
                "ratio": round(m0.total / m1.total, 3),
                "predicted_original_bytes": p0.total, "predicted_rewritten_bytes": ev.cost,
                "prediction_error_original": round(p0.total / m0.total - 1, 4),
                "prediction_error_rewritten": round(ev.cost / m1.total - 1, 4),
                "analytic_peak_bytes": s.peak_sram_bytes,
                "mac_overhead_padded": round(s.macs_patched_padded / s.macs - 1, 4),
                "mac_overhead_exact": round(s.macs_patched_exact / s.macs - 1, 4),
                "ops_original": ev.result.ops_before, "ops_rewritten": ev.result.ops_after,
                "flash_original": len(data), "flash_rewritten": len(ev.result.model),
            }
            rows.append(row)
            log(f"    {label}: {m0.total:,} -> {m1.total:,} B ({row['ratio']:.2f}x), predicted "
                f"{ev.cost:,} ({row['prediction_error_rewritten']:+.1%}), exact={exact}")
        log(f"[rewrite] {name}: done in {time.time() - t0:.0f} s")
    return {"rows": rows}


def rewrite_table(result: dict[str, Any]) -> str:
    """Section *rewrite*'s table, from its JSON."""
    md = ["| model | schedule | TFLM arena original (B) | rewritten (B) | ratio | predicted orig / rewr (err) | "
          "MAC overhead padded / exact | ops | Flash (B) | bit-exact |",
          "|---|---|---:|---:|---:|---|---|---|---|---|"]
    for r in result["rows"]:
        md.append(f"| {r['model']} | {r['schedule']} | {r['tflm_original_bytes']:,} | {r['tflm_rewritten_bytes']:,} | "
                  f"{r['ratio']:.2f}x | {r['predicted_original_bytes']:,} ({r['prediction_error_original']:+.1%}) / "
                  f"{r['predicted_rewritten_bytes']:,} ({r['prediction_error_rewritten']:+.1%}) | "
                  f"+{r['mac_overhead_padded']:.1%} / +{r['mac_overhead_exact']:.1%} | "
                  f"{r['ops_original']} -> {r['ops_rewritten']} | {r['flash_original']:,} -> "
                  f"{r['flash_rewritten']:,} | {'yes' if r['bit_exact'] else 'NO'} |")
    return "\n".join(md) + "\n"


# model -> custom-mode schedules (grid, n blocks)
CUSTOM_BENCH = {
    "mbv2_100_224": [((4, 4), 5), ((3, 4), 5), ((2, 2), 5)],
    "mbv2_035_144": [((4, 4), 5), ((3, 3), 5)],
}


def custom_section(o: BenchOptions) -> dict[str, Any]:
    """Custom mode (one TFMCU_PATCH_STAGE op): the whole model run in TFLM built from source with our kernel
    (``tfmcu.runtime.tflm_host``), its MEASURED arena vs the original's (TFLM wheel, and the same source build),
    the predictor's figure, the kernel's op data, bit-exactness vs the original in the wheel; and the in-place
    plans' figures (pairs, lower bound) docs/memory.md quotes."""
    rows = []
    extras = []
    for name, schedules in CUSTOM_BENCH.items():
        data = zoo.build(name, o.zoo_cache)
        graph = from_tflite(data, name=name)
        m0 = measure_arena(data)
        inputs = random_inputs(data, o.samples, seed=0)
        ref = run_tflm(data, inputs)
        m0_src = run_whole(data, inputs[:1], name).arena
        # For context: the unpatched model with an in-place plan (what in-place alone gives, TFLM-measured).
        m0_in = measure_arena(memory_plan.with_offline_plan(data, graph, inplace=True)[0])
        for (grid, n), plan in [(sch, p) for sch in schedules for p in ("disjoint", "inplace")]:
            s = schedule(graph, grid, n_blocks=n)
            res = rewrite_custom(data, graph, s, name, inplace=plan == "inplace")
            whole = run_whole(res.model, inputs, name)
            exact = all(np.array_equal(a[0], b[0]) for a, b in zip(ref, whole.outputs))
            mem = memory_report(res.model, name)
            if plan == "inplace":
                rest_graph = from_tflite(load_custom(res.model, name).rest)
                extras.append(inplace_figures(f"{name} {grid[0]}x{grid[1]} n={n}, rest of the graph", rest_graph))
            a = whole.arena
            row = {
                "model": name, "grid": list(grid), "patch_blocks": n, "rest_memory_plan": plan, "bit_exact": exact,
                "tflm_original_bytes": m0.total, "tflm_original_head": m0.head,
                "tflm_source_original_bytes": m0_src.arena_used_bytes,
                "tflm_original_inplace_bytes": m0_in.total, "tflm_original_inplace_head": m0_in.head,
                "scratch_bytes": mem["scratch_bytes"], "analytic_patch_peak_bytes": s.patch_peak_bytes,
                "measured_bytes": a.arena_used_bytes, "measured_head": a.head_bytes, "measured_tail": a.tail_bytes,
                "predicted_bytes": mem["predicted"]["arena_total_bytes"],
                "kernel_persistent_bytes": a.patch_stage_persistent_bytes,
                "ratio": round(m0.total / a.arena_used_bytes, 3),
                "ratio_same_build": round(m0_src.arena_used_bytes / a.arena_used_bytes, 3),
                "mac_overhead_padded": round(s.macs_patched_padded / s.macs - 1, 4),
                "mac_overhead_exact": round(s.macs_patched_exact / s.macs - 1, 4),
                "flash_original": len(data), "flash_custom": len(res.model),
                "measured_by": MEASURED_BY,
            }
            rows.append(row)
            log(f"[custom] {name} {grid[0]}x{grid[1]} n={n}, rest {plan}: TFLM arena {a.arena_used_bytes:,} B measured "
                f"({row['ratio']:.2f}x below the original), predicted {row['predicted_bytes']:,} B, exact={exact}")
    extras.append(inplace_figures("mbv2_035_96, whole model (the in-place pairs the tests check in TFLM)",
                                  from_tflite(zoo.build("mbv2_035_96", o.zoo_cache))))
    return {"rows": rows + [{"inplace": e} for e in extras]}


def custom_table(result: dict[str, Any]) -> str:
    """Section *custom*'s table and its in-place lines, from its JSON."""
    rows = [r for r in result["rows"] if "inplace" not in r]
    md = ["Measured: the whole custom-mode model in TFLM built from source (the pinned archive, reference kernels + "
          "the TFMCU_PATCH_STAGE kernel) on the host, input image in the arena; the original in the tflite-micro "
          "wheel and in the same source build.",
          "",
          "| model | schedule | rest plan | TFLM original: wheel / source build (B) | custom mode, measured (B) | "
          "head / tail (B) | ratio vs wheel / same build | predicted (B) | scratch (B) | kernel op data (B) | "
          "MACs exact / padded | bit-exact |",
          "|---|---|---|---|---:|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['grid'][0]}x{r['grid'][1]}, n={r['patch_blocks']} | {r['rest_memory_plan']} | "
                  f"{r['tflm_original_bytes']:,} / {r['tflm_source_original_bytes']:,} | {r['measured_bytes']:,} | "
                  f"{r['measured_head']:,} / {r['measured_tail']:,} | {r['ratio']:.2f}x / {r['ratio_same_build']:.2f}x "
                  f"| {r['predicted_bytes']:,} | {r['scratch_bytes']:,} | {r['kernel_persistent_bytes']:,} | "
                  f"+{r['mac_overhead_exact'] * 100:.1f}% / +{r['mac_overhead_padded'] * 100:.1f}% | "
                  f"{'yes' if r['bit_exact'] else 'NO'} |")
    md.append("")
    for name in dict.fromkeys(r["model"] for r in rows):
        r = next(r for r in rows if r["model"] == name)
        md.append(f"{name} unpatched, whole model planned in place: TFLM arena {r['tflm_original_inplace_bytes']:,} B "
                  f"(head {r['tflm_original_inplace_head']:,} B).")
    md.append("")
    md += [inplace_line(r["inplace"]) for r in result["rows"] if "inplace" in r]
    return "\n".join(md) + "\n"


def inplace_line(e: dict[str, Any]) -> str:
    return (f"In-place plan of {e['what']}: {e['pairs']} in-place pairs; planned head {e['head']:,} B, lower bound "
            f"{e['lower_bound']:,} B (the most bytes alive at one step, less what in-place pairs share), TFLM's "
            f"greedy head {e['greedy']:,} B.")


def inplace_figures(what: str, graph: Any) -> dict[str, Any]:
    """The in-place plan of ``graph``: its pairs, planned head, lower bound and TFLM's greedy head."""
    head, _, greedy = memory_plan.plan(graph, inplace=True)
    return {"what": what, "pairs": len(memory_plan.inplace_pairs(graph)), "head": head, "greedy": greedy,
            "lower_bound": memory_plan.inplace_lower_bound(graph)}


# Section "firmware": the patch stage on Cortex-M4/M7 under QEMU (bazel sh_tests of tflm_patch_kernels/firmware),
# patched (p x p) and per-layer (p = 1) in one firmware; instructions counted by tools/qemu's plugin.
FIRMWARE_TESTS = ["model_mbv2_035_96_cortex_m4_test", "model_mbv2_035_96_cortex_m7_test",
                  "model_mbv2_100_224_cortex_m4_test"]


def _firmware_reports(section: str, pkg: str, tests: list[str]) -> list[dict[str, Any]]:
    return firmware_reports(section, [label(pkg, t) for t in tests], log)


def firmware_section(o: BenchOptions) -> dict[str, Any]:
    rows = []
    for t, rep in zip(FIRMWARE_TESTS, _firmware_reports("firmware", "tflm_patch_kernels/firmware", FIRMWARE_TESTS)):
        res = rep["result"]
        insns = {reg["name"]: reg["insns"] for reg in res["regions"]}
        ip, il = insns["stage_patched"], insns["stage_layer"]
        mp, ml = res["macs_patched"], res["macs_layer"]
        rows.append({
            "test": t, "model": res["model"], "target": res["target"], "machine": rep["machine"],
            "grid": res["grid"], "bit_exact": res["output_hash_patched"] == res["output_hash_layer"] == res[
                "expected_hash"],
            "insns_patched": ip, "insns_layer": il, "macs_patched": mp, "macs_layer": ml,
            "latency_overhead": round(ip / il - 1, 4), "mac_overhead_exact": round(mp / ml - 1, 4),
            "overhead_ratio": round((ip / il - 1) / (mp / ml - 1), 3) if mp > ml else None,
            "insns_per_mac_layer": round(il / ml, 2), "insns_per_mac_patched": round(ip / mp, 2),
            "scratch_patched": res["scratch_touched_patched"], "scratch_layer": res["scratch_touched_layer"],
            "stack_hwm": res["stack_hwm"], "flash": rep["sizes"]["flash"], "ram_static": res["ram_static"],
        })
    return {"rows": rows}


def firmware_table(result: dict[str, Any]) -> str:
    """Section *firmware*'s table, from its JSON."""
    md = ["| firmware | core | grid | instructions patched / per-layer | latency overhead | exact MAC overhead | "
          "ratio | instructions / MAC | scratch patched / per-layer (B) | stack (B) | output = TF Lite |",
          "|---|---|---|---|---:|---:|---:|---:|---|---:|---|"]
    for r in result["rows"]:
        md.append(f"| {r['model']} | {r['target']} ({r['machine']}) | {r['grid']} vs 1x1 | {r['insns_patched']:,} / "
                  f"{r['insns_layer']:,} | +{r['latency_overhead']:.1%} | +{r['mac_overhead_exact']:.1%} | "
                  f"{r['overhead_ratio']:.2f} | {r['insns_per_mac_layer']:.1f} | {r['scratch_patched']:,} / "
                  f"{r['scratch_layer']:,} | {r['stack_hwm']} | {'yes' if r['bit_exact'] else 'NO'} |")
    return "\n".join(md) + "\n"


# Section "tflm_firmware": whole models in TFLM on the MCU (tflm_patch_kernels/tflm: MicroInterpreter, reference
# kernels + TFMCU_PATCH_STAGE), under QEMU; the MobileNetV2-1.0-224 ones (tags manual, benchmarks/firmware) run only
# here.
TFLM_FIRMWARE_TESTS = [("tflm_patch_kernels/tflm", t) for t in (
    "tflm_mbv2_035_96_cortex_m7_test", "tflm_mbv2_035_96_cmsis_nn_cortex_m4_test",
    "tflm_mbv2_035_96_cmsis_nn_cortex_m7_test", "tflm_mbv2_035_96_custom_cortex_m4_test",
    "tflm_mbv2_035_96_custom_cortex_m7_test", "tflm_mbv2_035_96_custom_stm32f405_test")] + [
    (PKG, t) for t in ("tflm_mbv2_100_224_custom_cortex_m4_test", "tflm_mbv2_100_224_custom_cortex_m7_test")]


def tflm_firmware_section(o: BenchOptions) -> dict[str, Any]:
    rows = []
    reports = firmware_reports("tflm_firmware", [label(pkg, t) for pkg, t in TFLM_FIRMWARE_TESTS], log)
    for (_, t), rep in zip(TFLM_FIRMWARE_TESTS, reports):
        res = rep["result"]
        insns = [g["insns"] for g in res["regions"]]
        rows.append({"test": t, "target": res["target"], "machine": rep["machine"],
                     "arena_used_bytes": res["arena_used_bytes"], "arena_bytes": res["arena_bytes"],
                     "model_bytes": res["model_bytes"], "flash": rep["sizes"]["flash"],
                     "psram": rep["sizes"].get("psram", 0), "ram_static": res["ram_static"],
                     "stack_hwm": res["stack_hwm"], "sram_budget": res["sram_budget"],
                     "invoke_insns": min(insns), "inputs": len(insns), "equal_tflite": not rep["problems"]})
    return {"rows": rows}


def tflm_firmware_table(result: dict[str, Any]) -> str:
    """Section *tflm_firmware*'s table, from its JSON."""
    md = ["| firmware | target | TFLM arena measured (B) | instructions / inference | Flash (B) | .data+.bss (B) | "
          "stack (B) | output = TF Lite |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        psram = f" + {r['psram']:,} PSRAM (the model)" if r["psram"] else ""
        md.append(f"| {r['test'][:-5]} | {r['target']} ({r['machine']}) | {r['arena_used_bytes']:,} | "
                  f"{r['invoke_insns']:,} | {r['flash']:,}{psram} | "
                  f"{r['ram_static']:,} | {r['stack_hwm']} | "
                  f"{'yes' if r['equal_tflite'] else 'NO'} |")
    return "\n".join(md) + "\n"


# Section "cmsis_nn": the same model four ways on Cortex-M4 / M7 (benchmarks/firmware/BUILD, bench_*): TFLM
# reference kernels per layer (ref), TFLM + CMSIS-NN per layer (cmsis: the baseline), patched with the portable
# kernels (ref_p, rest in place), patched with the CMSIS-NN backend (cmsis_p). Instructions are QEMU plugin counts
# of one Invoke and of its "stage" region (the TFMCU_PATCH_STAGE op, or the ops it replaces); MACs from the schedule
# (tfmcu.plan.regions); arenas are TFLM's arena_used_bytes on the target (each also equal to the prediction).
CMSIS_BENCH_MODELS = {"mbv2_035_96": "MobileNetV2-0.35-96 (4x4, 5 blocks)",
                      "mbv2_100_224": "MobileNetV2-1.0-224 (4x4, 5 blocks)",
                      "mbv2_rd_224": "MbV2-RD-224 (4x4, 3 blocks)",
                      "keras_mobilenet_v2": "tf_keras MobileNetV2-0.35-96 (third-party; 4x4, 4 blocks)"}
CMSIS_BENCH_VARIANTS = ("ref", "cmsis", "ref_p", "cmsis_p")
# Targets: patched stage <= 1.15 x (1 + exact stage MAC overhead) x baseline stage; whole model <= 1.15 x
# (MobileNetV2-1.0-224), <= 1.08 x (MbV2-RD-224) the baseline; CMSIS-NN arena within 10% of the reference one.
CMSIS_WHOLE_TARGET = {"mbv2_100_224": 1.15, "mbv2_rd_224": 1.08}


# The other zoo models, patched with the CMSIS-NN backend only (bit-exactness and arena over the zoo's features).
CMSIS_ZOO_MODELS = ("kernels_symmetric", "keras_mobilenet_v1", "resnet_like", "tiny_per_tensor", "tiny_float_input",
                    "mbv2_035_144")


def cmsis_nn_section(o: BenchOptions) -> dict[str, Any]:
    tests = [f"bench_{m}_{v}_{t}_test" for m in CMSIS_BENCH_MODELS for v in CMSIS_BENCH_VARIANTS
             for t in ("cortex_m4", "cortex_m7")]
    zoo_tests = [f"bench_zoo_{m}_cmsis_p_{t}_test" for m in CMSIS_ZOO_MODELS for t in ("cortex_m4", "cortex_m7")]
    reports = dict(zip(tests + zoo_tests, _firmware_reports("cmsis_nn", PKG, tests + zoo_tests)))
    zoo_rows = []
    for test in zoo_tests:
        rep = reports[test]
        res = rep["result"]
        host = generator_record(label(PKG, test))
        zoo_rows.append({"test": test, "model": host["model"], "what": host["what"], "target": res["target"],
                         "invoke_insns": min(g["insns"] for g in res["regions"] if g["name"] == "invoke"),
                         "arena_used_bytes": res["arena_used_bytes"],
                         "arena_predicted": host["predicted_arena_bytes_cortex_m"],
                         "equal_tflite": not rep["problems"]})
    rows = []
    for m, title in CMSIS_BENCH_MODELS.items():
        for t in ("cortex_m4", "cortex_m7"):
            cell: dict[str, Any] = {"model": m, "title": title, "target": t}
            for v in CMSIS_BENCH_VARIANTS:
                test = f"bench_{m}_{v}_{t}_test"
                rep = reports[test]
                host = generator_record(label(PKG, test))  # schedule MACs, predicted arena, reference
                res = rep["result"]
                invoke = min(g["insns"] for g in res["regions"] if g["name"] == "invoke")
                stage = min(g["insns"] for g in res["regions"] if g["name"] == "stage")
                patched = v.endswith("_p")
                stage_macs = host["stage_macs_patched_exact"] if patched else host["stage_macs"]
                macs = host["macs_patched_exact"] if patched else host["macs"]
                cell[v] = {"invoke_insns": invoke, "stage_insns": stage, "macs": macs, "stage_macs": stage_macs,
                           "insns_per_mac": round(invoke / macs, 2), "stage_insns_per_mac": round(stage / stage_macs, 2),
                           "arena_used_bytes": res["arena_used_bytes"],
                           "arena_predicted": host["predicted_arena_bytes_cortex_m"],
                           "equal_reference": not rep["problems"], "reference": host["reference"]["by"],
                           "machine": rep["machine"]}
            b, d = cell["cmsis"], cell["cmsis_p"]
            overhead = d["stage_macs"] / b["stage_macs"] - 1
            cell["stage_mac_overhead_exact"] = round(overhead, 4)
            cell["stage_ratio"] = round(d["stage_insns"] / b["stage_insns"], 3)
            cell["stage_ratio_per_mac"] = round(cell["stage_ratio"] / (1 + overhead), 3)
            cell["stage_target_met"] = cell["stage_ratio"] <= 1.15 * (1 + overhead)
            cell["whole_ratio"] = round(d["invoke_insns"] / b["invoke_insns"], 3)
            cell["whole_target"] = CMSIS_WHOLE_TARGET.get(m)
            cell["whole_target_met"] = (None if m not in CMSIS_WHOLE_TARGET
                                        else cell["whole_ratio"] <= CMSIS_WHOLE_TARGET[m])
            cell["arena_cmsis_vs_ref_patched"] = round(d["arena_used_bytes"] / cell["ref_p"]["arena_used_bytes"], 3)
            rows.append(cell)
    _cmsis_plot(rows, os.path.join(o.out_dir, "cmsis_nn.png"))
    return {"rows": rows, "zoo_rows": zoo_rows, "plot": "cmsis_nn.png"}


def cmsis_nn_table(result: dict[str, Any]) -> str:
    """Section *cmsis_nn*'s two tables, from its JSON."""
    md = ["| model | core | (a) TFLM ref per layer | (b) TFLM + CMSIS-NN per layer | (c) patched, portable | "
          "(d) patched, CMSIS-NN | (d)/(b) stage | stage MAC overhead | (d)/(b) whole | arena (a) / (b) / (c) / (d) "
          "(B) | outputs = TF Lite |", "|---|---|---|---|---|---|---:|---:|---:|---|---|"]
    for r in result["rows"]:
        cells = []
        for v in CMSIS_BENCH_VARIANTS:
            c = r[v]
            cells.append(f"{c['invoke_insns'] / 1e6:,.1f}M ({c['insns_per_mac']:.2f}/MAC); stage "
                         f"{c['stage_insns'] / 1e6:,.1f}M ({c['stage_insns_per_mac']:.2f}/MAC)")
        target = f" (target {r['whole_target']})" if r["whole_target"] else ""
        md.append(f"| {r['title']} | {r['target']} | " + " | ".join(cells) +
                  f" | {r['stage_ratio']:.2f}x (target {1.15 * (1 + r['stage_mac_overhead_exact']):.2f}) | "
                  f"+{r['stage_mac_overhead_exact']:.1%} | {r['whole_ratio']:.2f}x{target} | " +
                  " / ".join(f"{r[v]['arena_used_bytes']:,}" for v in CMSIS_BENCH_VARIANTS) + " | " +
                  ("yes" if all(r[v]["equal_reference"] for v in CMSIS_BENCH_VARIANTS) else "NO") +
                  ("" if r["ref"]["reference"].startswith("TF Lite") else " (= TFLM's; see note)") + " |")
    md += ["", "| zoo model, CMSIS-NN backend | core | instructions / Invoke | TFLM arena measured = predicted (B) | "
           "outputs = TF Lite |", "|---|---|---:|---:|---|"]
    for z in result["zoo_rows"]:
        md.append(f"| {z['model']} ({z['what']}) | {z['target']} | {z['invoke_insns']:,} | {z['arena_used_bytes']:,}"
                  f"{'' if z['arena_used_bytes'] == z['arena_predicted'] else ' (predicted %d)' % z['arena_predicted']}"
                  f" | {'yes' if z['equal_tflite'] else 'NO'} |")
    return "\n".join(md) + "\n"


def _cmsis_plot(rows: list[dict[str, Any]], path: str) -> None:
    """Whole-model and stage instructions per variant, one group per model and core (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    labels = [f"{r['model']}\n{r['target'].replace('cortex_', '')}" for r in rows]
    width = 0.2
    for ax, key, what in ((axes[0], "invoke_insns", "whole model"), (axes[1], "stage_insns", "patch stage")):
        for k, v in enumerate(CMSIS_BENCH_VARIANTS):
            ax.bar([i + (k - 1.5) * width for i in range(len(rows))], [r[v][key] for r in rows], width, label=v)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=7, rotation=35, ha="right")
        ax.set_ylabel("instructions per inference (QEMU plugin, measured)")
        ax.set_title(f"{what}: TFLM ref / TFLM+CMSIS-NN / patched portable / patched CMSIS-NN")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Section "train": the full training recipe (pipelines.train defaults) on Fashion-MNIST at 96x96; the target is int8
# accuracy within 1 point of float. Long: about 1.5 h on 2 CPU cores. Resumes from its checkpoints if interrupted.
TRAIN_BENCH = [("mcunet-demo", "fashion_mnist", 96)]


def train_section(o: BenchOptions) -> dict[str, Any]:
    rows = []
    for model, dataset, resolution in TRAIN_BENCH:
        t0 = time.time()
        folder = os.path.join(o.out_dir, "train", f"{model}_{dataset}_{resolution}")
        cfg = TrainConfig(model=model, dataset=dataset, resolution=resolution, recipe=Recipe(), resume=True)
        log(f"[train] {model} on {dataset} @ {resolution}: full recipe ({cfg.recipe.epochs} + "
            f"{cfg.recipe.qat_epochs} QAT epochs), outputs in {folder}")
        r = train(cfg, folder, log=log).classification
        a = r.accuracy
        rows.append({"model": model, "dataset": dataset, "resolution": resolution, "epochs": cfg.recipe.epochs,
                     "qat_epochs": cfg.recipe.qat_epochs, "float": a.float, "qat": a.qat,
                     "int8_tflite": a.int8_tflite, "int8_tflm": a.int8_tflm,
                     "int8_minus_float_points": round(a.int8_minus_float_points, 2),
                     "test_samples": a.int8_test_samples, "tflite_equals_tflm": r.tflite_vs_tflm.agree,
                     "tflite_tflm_rounding_ties": r.tflite_vs_tflm.tie_samples,
                     "tflm_arena_bytes": r.memory.tflm_arena_bytes,
                     "analytic_peak_bytes": r.memory.analytic_peak_bytes, "flash_bytes": r.flash_bytes,
                     "macs": r.macs, "wall_s": round(time.time() - t0)})
    return {"rows": rows}


def equal_up_to_ties(r: dict[str, Any]) -> str:
    """TF Lite = TFLM in a row: yes, yes with the samples 1 apart by a rounding tie (docs/pipelines.md#rounding-ties),
    or NO."""
    ties = r.get("tflite_tflm_rounding_ties", 0)  # (runs before ties were told apart counted them as disagreeing)
    return ("yes" + (f" ({ties} rounding ties)" if ties else "")) if r["tflite_equals_tflm"] else "NO"


def train_table(result: dict[str, Any]) -> str:
    """Section *train*'s table, from its JSON."""
    md = ["| model | data | res | epochs (+QAT) | float | QAT | int8 TF Lite | int8 TFLM | int8 - float | "
          "TF Lite = TFLM | TFLM arena | Flash | MACs |",
          "|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in result["rows"]:
        md.append(f"| {r['model']} | {r['dataset']} | {r['resolution']} | {r['epochs']} (+{r['qat_epochs']}) | "
                  f"{r['float']:.2%} | {r['qat']:.2%} | {r['int8_tflite']:.2%} | {r['int8_tflm']:.2%} | "
                  f"{r['int8_minus_float_points']:+.2f} pt | {equal_up_to_ties(r)} | "
                  f"{r['tflm_arena_bytes'] / 1024:.1f} kB | {r['flash_bytes'] / 1024:.1f} kB | "
                  f"{r['macs'] / 1e6:.1f}M |")
    return "\n".join(md) + "\n"


# The scenes task and the fixed network the resolution section trains (one seed, the same recipe at every resolution).
RESOLUTION_DATASET = "scenes:canvas=128,object_px=10-24,distractors=2-5,train=2000,val=500,test=1000,seed=0"
RESOLUTION_MODEL = "mcunet-demo"
RESOLUTIONS = (32, 64, 128)
RESOLUTION_RECIPE = Recipe(epochs=8, qat_epochs=0, batch_size=64, lr=0.05, warmup_epochs=1.0)


def resolution_section(o: BenchOptions) -> dict[str, Any]:
    rows = []
    for resolution in RESOLUTIONS:
        t0 = time.time()
        folder = os.path.join(o.out_dir, "resolution", f"{RESOLUTION_MODEL}_{resolution}")
        cfg = TrainConfig(model=RESOLUTION_MODEL, dataset=RESOLUTION_DATASET, resolution=resolution,
                          recipe=RESOLUTION_RECIPE, resume=True)
        log(f"[resolution] {RESOLUTION_MODEL} @ {resolution} on {RESOLUTION_DATASET}: {cfg.recipe.epochs} epochs, "
            f"outputs in {folder}")
        r = train(cfg, folder, log=log)
        c, a = r.classification, r.classification.accuracy
        rows.append({"model": RESOLUTION_MODEL, "dataset": RESOLUTION_DATASET, "resolution": resolution,
                     "epochs": cfg.recipe.epochs, "float": a.float, "int8_tflm": a.int8_tflm,
                     "int8_tflite": a.int8_tflite, "test_samples": a.int8_test_samples,
                     "best_val": max(r.history.values("val_accuracy"), default=None),
                     "macs": c.macs, "tflm_arena_bytes": c.memory.tflm_arena_bytes,
                     "analytic_peak_bytes": c.memory.analytic_peak_bytes, "wall_s": round(time.time() - t0)})
    _resolution_plot(rows, os.path.join(o.out_dir, "resolution.png"))
    return {"rows": rows, "plot": "resolution.png"}


def resolution_table(result: dict[str, Any]) -> str:
    """Section *resolution*'s table, from its JSON."""
    rows = result["rows"]
    model, dataset = (rows[0]["model"], rows[0]["dataset"]) if rows else (RESOLUTION_MODEL, RESOLUTION_DATASET)
    md = [f"{model} trained from scratch at each resolution on `{dataset}` (float, then int8 "
          f"post-training quantization; test split, measured by this code in TF / TFLM):", "",
          "| input | float test acc. | int8 TFLM test acc. | MACs | TFLM arena (measured) | analytic peak |",
          "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['resolution']}x{r['resolution']} | {r['float']:.2%} | {r['int8_tflm']:.2%} | "
                  f"{r['macs'] / 1e6:.1f}M | {r['tflm_arena_bytes'] / 1024:.1f} kB | "
                  f"{r['analytic_peak_bytes'] / 1024:.1f} kB |")
    return "\n".join(md) + "\n"


def _resolution_plot(rows: list[dict[str, Any]], path: str) -> None:
    """Test accuracy against input resolution (float and int8), with each point's measured TFLM arena."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    res = [r["resolution"] for r in rows]
    ax.plot(res, [100 * r["float"] for r in rows], "o-", label="float")
    ax.plot(res, [100 * r["int8_tflm"] for r in rows], "s--", label="int8 (TFLM)")
    for r in rows:
        ax.annotate(f"{r['tflm_arena_bytes'] / 1024:.0f} kB", (r["resolution"], 100 * r["int8_tflm"]),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="chance (10 classes)")
    ax.set_xticks(res)
    ax.set_xlabel("input resolution (px; the scenes are 128 px canvases)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{RESOLUTION_MODEL} on scenes: accuracy vs resolution (labels: TFLM arena)", fontsize=10)
    ax.legend(fontsize=8)
    write_outputs({path: figure_png(fig)})


# Each section's table, rendered from the section's JSON (the bench's out/bench/<section>.md, and the docs' tables
# through benchmarks.docs: one function per section, so a page and the bench cannot render one run differently).
SECTION_TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "rewrite": rewrite_table, "custom": custom_table, "firmware": firmware_table,
    "tflm_firmware": tflm_firmware_table, "cmsis_nn": cmsis_nn_table, "train": train_table,
    "resolution": resolution_table, "search": bench_search.table, "halo": bench_halo.table,
    "halo_firmware": bench_halo.firmware_table, "latency": bench_latency.section_table, "fit": bench_fit.table,
    "cores": bench_fit.table, "named_boards": bench_fit.boards_table, "detection": bench_detection.table,
    "detection_recipe": bench_detection.recipe_table, "multistage": bench_multistage.table,
    "foreign": bench_foreign.table, "kernels": bench_kernels.table, "speed": bench_speed.table}


def run(o: BenchOptions, emit: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the chosen sections; each writes its JSON (its data and the record of the run: ``benchmarks.results``)
    and its table, rendered from that JSON, under ``o.out_dir`` as soon as it is done."""
    sections: dict[str, Callable[[BenchOptions], dict[str, Any]]] = {
        "rewrite": rewrite_section, "custom": custom_section, "firmware": firmware_section,
        "tflm_firmware": tflm_firmware_section, "cmsis_nn": cmsis_nn_section, "train": train_section,
        "resolution": resolution_section, "search": lambda o: bench_search.search_section(o, log),
        "halo": lambda o: bench_halo.halo_section(o, log),
        "halo_firmware": lambda o: bench_halo.halo_firmware_section(o, log),
        "latency": lambda o: bench_latency.latency_section(o, log),
        "fit": lambda o: bench_fit.fit_section(o, log, **bench_fit.selection(o.fit_models, o.fit_caps)),
        "cores": lambda o: bench_fit.cores_section(o, log),
        "named_boards": lambda o: bench_fit.boards_section(o, log),
        "detection": lambda o: bench_detection.detection_section(o, log),
        "detection_recipe": lambda o: bench_detection.recipe_section(o, log),
        "multistage": lambda o: bench_multistage.multistage_section(o, log),
        "foreign": lambda o: bench_foreign.foreign_section(o, log),
        "kernels": lambda o: bench_kernels.kernels_section(o, log),
        "speed": lambda o: bench_speed.speed_section(o, log)}
    unknown = [s for s in o.sections if s not in sections]
    if unknown:
        raise UsageError(f"unknown bench section(s) {', '.join(unknown)}; known: {', '.join(sections)}")
    done = {}
    for name in o.sections:
        started = run_record()
        res = sections[name](o)
        # the table is rendered from the JSON as written (tuples as lists, keys as strings), as the docs render it
        data = json.loads(json.dumps({"section": name, "run": started, **res}))
        markdown = SECTION_TABLES[name](data)
        write_outputs({os.path.join(o.out_dir, f"{name}.json"): data,
                       os.path.join(o.out_dir, f"{name}.md"): markdown})
        emit(f"## {name}\n\n{markdown}")
        emit(json.dumps({"section": name, "rows": len(res["rows"])}))
        done[name] = data
    return done
