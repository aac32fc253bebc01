"""The bench section *multistage*: several patch stages in one network, chosen by the dynamic programme
over cut points (``tfmcu.plan.stage_plans.stage_plans``), against one stage and against msf-CNN's quoted figures.

This first part is ANALYTIC (``tfmcu.plan.regions`` / ``tfmcu.plan.halo``: int8 bytes, every buffer of a patch kept
apart as the executor does, residual ADDs kept, the network output counted): the Pareto front of peak SRAM against
exact MACs for MobileNetV2-0.35-144 (tf_keras.applications, converted int8: ``zoo`` ``mbv2_035_144``) and
MobileNetV2-0.35-96 (tf_keras.applications: ``keras_mobilenet_v2``), with at most 1, 2, 3 or any number of stages,
in three image modes: ``excluded`` (msf-CNN's accounting: the image is not counted, only the window a patch reads;
kB = 1000 in the comparison), ``streamed`` (the first stage reads the image row by row, as ``fit --stream_input``
does) and ``counted`` (held whole). A stage may end into the global average pool (its output summed into
int32 patch by patch: ``pooled``; the executor runs it since ABI 6).

The MEASURED half (``measure_m4``) goes through ``fit`` as a user runs it: ``fit --target=cortex-m4
--objective=memory --max_latency=1.10 --stream_input --run`` with CMSIS-NN and fit's defaults (its grids and row
bands, its configurations, no time budget so that a row does not depend on the machine), at most one stage, at most
two, and any number (``FIT_ROWS``). Each row: the chosen plan's TFLM ``arena_used_bytes`` and the instructions of
one Invoke under QEMU (mps2-an386), against the per-layer model's QEMU count from the latency calibration runs
(``tfmcu/plan/latency_calibration.json``), the search's time and the candidates it priced.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable

from benchmarks.fit import measured_row, search_record as fit_search_record
from tfmcu.files import figure_png, write_outputs
from tfmcu.flows.deploy import DeployOptions
from tfmcu.flows.fit import FitOptions, run as fit_run
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan.latency import CALIBRATION_FILE, predict_instructions
from tfmcu.plan.plans import Plan, SearchOptions
from tfmcu.plan.stage_plans import pareto_plans, stage_segments

MODELS = (("mbv2_035_144", "MobileNetV2-0.35-144 (tf_keras)"), ("keras_mobilenet_v2", "MobileNetV2-0.35-96 (tf_keras)"))
MAX_STAGES = (1, 2, 3, None)
IMAGES = ("excluded", "streamed", "counted")
# grids 2x2 .. 12x12 and 16, 18, 24, 36 patches per side (and as many row bands); halo: recompute or every cache
OPTIONS = SearchOptions(patch_options=tuple(range(2, 13)) + (16, 18, 24, 36))
MAC_CAPS = (0.10, 0.20, 0.30)
# msf-CNN (NeurIPS'25), its optimizer on the standard Keras MobileNetV2-0.35-144 layer list (quoted in
# ../shared/notes/peers.md: analytic, input and output excluded, no residual ADDs, kB = 1000): (kB, MAC factor)
MSF_CNN_144 = ((124.6, 1.036), (37.3, 1.226), (21.3, 1.294), (15.8, 1.567))


# The measured half: fit on the Cortex-M4 with CMSIS-NN, the image streamed, within MAX_LATENCY x the per-layer
# model's predicted instructions; (label, at most this many stages: None any)
CORE, TARGET, KERNELS = "cortex-m4", "cortex-m4", "cmsis_nn"
MAX_LATENCY = 1.10
FIT_ROWS = ((f"1 stage within {MAX_LATENCY:g}x", 1), (f"2 stages within {MAX_LATENCY:g}x", 2),
            (f"smallest within {MAX_LATENCY:g}x", None))


def per_layer_measured(name: str) -> int | None:
    """The per-layer model's instructions per Invoke measured under QEMU (``benchmarks.latency``'s calibration run of
    the same zoo model on the Cortex-M4 with CMSIS-NN), or None."""
    with open(CALIBRATION_FILE) as f:
        runs = json.load(f).get("runs", [])
    return next((int(r["invoke"]) for r in runs if r.get("variant") == name and r.get("core") == CORE
                 and r.get("kernels") == KERNELS), None)


def measured_points(o: Any, name: str, data: bytes, log: Callable[[str], None]) -> dict[str, Any]:
    """``fit --run`` at each of ``FIT_ROWS`` for one model (see the module docstring; each row kept in
    ``<out_dir>/multistage/<model>/`` as it is measured: a run that stops resumes after it)."""
    work = os.path.join(o.out_dir, "multistage", name)
    path = os.path.join(work, "model.tflite")
    write_outputs({path: data})
    priced: list[dict[str, Any]] = []
    measured = []
    for label, stages in FIT_ROWS:
        key = f"{label}|{hashlib.sha1(data).hexdigest()[:12]}|{json.dumps(fit_search_record(), sort_keys=True)}"
        done = os.path.join(work, f"{hashlib.sha1(key.encode()).hexdigest()[:12]}.json")
        if os.path.isfile(done):
            with open(done) as f:
                m = json.load(f)
            log(f"[multistage] {name}, {label}: measured by an earlier run ({done})")
        else:
            log(f"[multistage] {name}, {label}: fit --max_latency={MAX_LATENCY:g} --max_stages={stages or 'any'} ...")
            rep = fit_run(FitOptions(model=path,
                                     firmware=DeployOptions(tflite="", target=TARGET, kernels=KERNELS, run=True,
                                                            num_inputs=1),
                                     objective="memory", max_latency=MAX_LATENCY, stream_input=True, max_stages=stages,
                                     verify_samples=4, search_seconds=None,
                                     out_dir=os.path.join(work, label.split()[0] + "_stages")), log=log)
            ch = rep.chosen
            m = measured_row(name, TARGET, label, ch.describe, ch.predicted_total_bytes, ch.predicted_instructions,
                             rep.deploy, ch.macs, rep.deploy.model_bytes)
            m.update(plan={"stages": ch.stages, "describe": ch.describe, "mac_overhead": ch.mac_overhead,
                           "macs": ch.macs},
                     max_stages=stages, search_seconds=rep.search_seconds, candidates=len(rep.candidates),
                     priced=[{"predicted_arena_bytes": c.predicted_total_bytes,
                              "predicted_instructions": c.predicted_instructions} for c in rep.candidates])
            write_outputs({done: json.dumps(m).encode()})
        priced += [{**c, "kind": label} for c in m.pop("priced", [])]
        log(f"[multistage] {name}, {label}: measured arena {m['arena_used_bytes']} B "
            f"(predicted {m['predicted_arena_bytes']:,}), {m['instructions']} instructions, search "
            f"{m['search_seconds']:g} s")
        measured.append(m)
    return {"per_layer_instructions_measured": per_layer_measured(name),
            "per_layer_instructions_predicted": predict_instructions(data, CORE, KERNELS).instructions,
            "priced": priced, "measured": measured}


def _best(front: list[Plan], cap: float) -> Plan | None:
    within = [p for p in front if p.mac_overhead <= cap + 1e-12]
    return min(within, key=lambda p: (p.peak(), p.macs)) if within else None


def multistage_section(o: Any, log: Callable[[str], None] = print, measure_m4: bool = True) -> dict[str, Any]:
    """The section (see the module docstring); ``measure_m4=False``: the analytic fronts only."""
    rows: list[dict[str, Any]] = []
    fronts: dict[tuple[str, str, int | None], list[Plan]] = {}
    measured: dict[str, Any] = {}
    for name, label in MODELS:
        data = zoo.build(name, o.zoo_cache)
        graph = from_tflite(data, name=name)
        for image in IMAGES:
            t0 = time.time()
            segs = stage_segments(graph, OPTIONS, image)
            log(f"[multistage] {name}, image {image}: {len(segs)} segments [{time.time() - t0:.0f} s]")
            if image == "streamed" and measure_m4:
                measured[name] = {"label": label, **measured_points(o, name, data, log)}
            runnable = [sg for sg in segs if not sg.pooled]  # without a stage into the pool (what the pool buys)
            for ms in MAX_STAGES:
                front = pareto_plans(graph, segs, OPTIONS, ms, image)
                today = pareto_plans(graph, runnable, OPTIONS, ms, image)
                fronts[(name, image, ms)] = front
                fronts[(name, image + " runnable", ms)] = today
                row = {"model": name, "label": label, "image": image, "max_stages": ms, "analytic": True,
                       "per_layer_bytes": pareto_plans(graph, segs, OPTIONS, 0, image)[0].peak(),
                       "front": [p.stage_plan_dict() for p in front],
                       "front_runnable": [p.stage_plan_dict() for p in today]}
                for cap in MAC_CAPS:
                    b, r = _best(front, cap), _best(today, cap)
                    row[f"best_within_{int(round(100 * cap))}pct"] = b.stage_plan_dict() if b else None
                    row[f"runnable_within_{int(round(100 * cap))}pct"] = r.stage_plan_dict() if r else None
                rows.append(row)
    write_outputs({os.path.join(o.out_dir, "multistage.png"): _plot(fronts, measured)})
    return {"rows": rows, "measured": measured, "plot": "multistage.png"}


def table(result: dict[str, Any]) -> str:
    """Section *multistage*'s tables, from its JSON: the analytic fronts, and the plans measured on the Cortex-M4."""
    return markdown(result["rows"]) + measured_markdown(result.get("measured") or {})


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def measured_markdown(measured: dict[str, Any]) -> str:
    if not measured:
        return ""
    md = ["", "Measured on the Cortex-M4 (QEMU mps2-an386; TFLM built from source with its CMSIS-NN kernels and the "
              "patch executor's CMSIS-NN backend): what `fit --target=cortex-m4 --objective=memory "
              f"--max_latency={MAX_LATENCY:g} --stream_input --run` chooses with its defaults, at most one stage, at "
              "most two and any number (`--max_stages`); TFLM's arena_used_bytes and the instructions of one Invoke, "
              "against the per-layer model's QEMU count (latency calibration run); the search's time on this "
              "machine (2 cores, every candidate priced: no time budget) and the candidates it priced.", "",
          "| model | plan | stages | schedule | MACs | arena (B) | = predicted | instructions | vs per layer | "
          "predicted error | search |", "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    for name, r in measured.items():
        base = r["per_layer_instructions_measured"]
        md.append(f"| {r['label']} | per layer (TFLM + CMSIS-NN) | 0 | - | +0.0% | - | - | {_n(base)} | 1.000x | - "
                  "| - |")
        for m in r["measured"]:
            p = m["plan"]
            ratio = f"{m['instructions'] / base:.3f}x" if base and m["instructions"] else "-"
            err = "-" if m["instructions_error"] is None else f"{100 * m['instructions_error']:+.1f}%"
            equal = "yes" if m["arena_equal"] else f"no ({_n(m['predicted_arena_bytes'])})"
            search = (f"{m['search_seconds']:.0f} s, {m['candidates']} candidates"
                      if m.get("search_seconds") is not None else "-")
            md.append(f"| {r['label']} | {m['what']} | {p['stages']} | {p['describe']} | "
                      f"+{100 * p['mac_overhead']:.1f}% | {_n(m['arena_used_bytes'])} | {equal} | "
                      f"{_n(m['instructions'])} | {ratio} | {err} | {search} |")
    return "\n".join(md) + "\n"


def _kb(n: int) -> str:
    return f"{n / 1000:.1f} kB"


def markdown(rows: list[dict[str, Any]]) -> str:
    md = ["Analytic (tfmcu.plan.regions / halo: int8 bytes, patch buffers apart, residual ADDs kept, kB = 1000); "
          "the TFLM side is measured below. Smallest peak SRAM within a MAC overhead, by the most stages allowed; "
          "each cell: without / with a last stage that ends into the global pool (its input summed patch by patch):",
          "", "| model | image | stages | per layer | <= +10% MACs | <= +20% | <= +30% |", "|---|---|---:|---:|---|---|---|"]

    def cell(b: dict[str, Any] | None) -> str:
        return "none" if b is None else (f"{_kb(b['peak_bytes'])} (+{100 * b['mac_overhead']:.1f}%, {b['stages']} "
                                         f"stage{'s' if b['stages'] != 1 else ''})")
    for r in rows:
        cells = []
        for cap in MAC_CAPS:
            pct = int(round(100 * cap))
            a, b = r[f"runnable_within_{pct}pct"], r[f"best_within_{pct}pct"]
            cells.append(cell(a) + ("" if a == b else f" / {cell(b)}"))
        md.append(f"| {r['label']} | {r['image']} | {'any' if r['max_stages'] is None else r['max_stages']} | "
                  f"{_kb(r['per_layer_bytes'])} | " + " | ".join(cells) + " |")
    md += ["", "msf-CNN's quoted points on the standard Keras MobileNetV2-0.35-144 (its optimizer; input and output "
               "excluded, no residual ADDs): " + ", ".join(f"{kb} kB at {m}x" for kb, m in MSF_CNN_144) + "."]
    best = next((r for r in rows if r["model"] == "mbv2_035_144" and r["image"] == "excluded"
                 and r["max_stages"] is None), None)
    if best:
        for key, what in (("runnable_within_20pct", "no stage into the pool"),
                          ("best_within_20pct", "a stage into the pool")):
            b = best[key]
            if b:
                md += ["", f"MobileNetV2-0.35-144, best within +20% MACs, image excluded, any number of stages "
                           f"({what}): {_kb(b['peak_bytes'])} at +{100 * b['mac_overhead']:.1f}%: {b['describe']}."]
    return "\n".join(md) + "\n"


def _plot(fronts: dict[tuple[str, str, int | None], list[Plan]], measured: dict[str, Any]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if measured else 1
    fig, axes2 = plt.subplots(rows, len(MODELS), figsize=(12, 4.4 * rows), squeeze=False)
    axes = axes2[0]
    for ax, (name, label) in zip(axes2[1] if measured else [], MODELS):
        r = measured.get(name)
        if not r:
            continue
        base = r["per_layer_instructions_predicted"]
        pts = [(e["predicted_instructions"] / base, e["predicted_arena_bytes"] / 1000) for e in r["priced"]
               if e.get("predicted_instructions")]
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o", color="0.6", markersize=4,
                label="priced plans (predicted arena and instructions)")
        mb = r["per_layer_instructions_measured"]
        for m in r["measured"]:
            if m["arena_used_bytes"] and m["instructions"] and mb:
                ax.plot(m["instructions"] / mb, m["arena_used_bytes"] / 1000, "r*", markersize=10)
                ax.annotate(m["what"], (m["instructions"] / mb, m["arena_used_bytes"] / 1000), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
        ax.axvline(MAX_LATENCY, color="k", linestyle=":", linewidth=1)
        ax.set_xlabel("instructions vs TFLM + CMSIS-NN per layer (measured: red stars)")
        ax.set_ylabel("TFLM arena (kB = 1000 B, image streamed)")
        ax.set_title(f"{label}: Cortex-M4 (QEMU), fit's candidates within {MAX_LATENCY:g}x", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax, (name, label) in zip(axes, MODELS):
        for ms in MAX_STAGES:
            front = fronts.get((name, "excluded", ms), [])
            pts = sorted((100 * p.mac_overhead, p.peak() / 1000) for p in front)
            if pts:
                ax.step([x for x, _ in pts], [y for _, y in pts], where="post", marker="o", markersize=3,
                        label=f"tfmcu, {'any number of' if ms is None else f'<= {ms}'} stage{'s' if ms != 1 else ''}")
        today = sorted((100 * p.mac_overhead, p.peak() / 1000)
                       for p in fronts.get((name, "excluded runnable", None), []))
        if today:
            ax.step([x for x, _ in today], [y for _, y in today], where="post", linestyle="--", color="k", marker="x",
                    linewidth=1, label="tfmcu, any number, no stage into the pool")
        if name == "mbv2_035_144":
            ax.plot([100 * (m - 1) for _, m in MSF_CNN_144], [kb for kb, _ in MSF_CNN_144], "k*", markersize=9,
                    label="msf-CNN (quoted; no residuals)")
        ax.set_xlim(-2, 70)
        ax.set_yscale("log")
        ax.set_xlabel("MAC overhead (%, exact)")
        ax.set_ylabel("peak SRAM (kB = 1000 B, image excluded)")
        ax.set_title(f"{label}: analytic Pareto fronts", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)
