"""The bench section *multistage* (issue 25): several patch stages in one network, chosen by the dynamic programme
over cut points (``tfmcu.plan.search.stage_plans``), against one stage and against msf-CNN's quoted figures.

This first part is ANALYTIC (``tfmcu.plan.regions`` / ``tfmcu.plan.halo``: int8 bytes, every buffer of a patch kept
apart as the executor does, residual ADDs kept, the network output counted): the Pareto front of peak SRAM against
exact MACs for MobileNetV2-0.35-144 (tf_keras.applications, converted int8: ``zoo`` ``mbv2_035_144``) and
MobileNetV2-0.35-96 (tf_keras.applications: ``keras_mobilenet_v2``), with at most 1, 2, 3 or any number of stages,
in three image modes: ``excluded`` (msf-CNN's accounting: the image is not counted, only the window a patch reads;
kB = 1000 in the comparison), ``streamed`` (the first stage reads the image row by row, as ``fit --stream_input``
does) and ``counted`` (held whole). A stage may end into the global average pool (its output summed into
int32 patch by patch: ``pooled``). The TFLM side -- several TFMCU_PATCH_STAGE ops per model, their predicted and
measured arenas and Cortex-M4 instructions -- is not built yet: nothing here is measured in TFLM.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from tfmcu.files import figure_png, write_outputs
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan.search import SearchOptions, StagePlan, pareto_plans, stage_segments

MODELS = (("mbv2_035_144", "MobileNetV2-0.35-144 (tf_keras)"), ("keras_mobilenet_v2", "MobileNetV2-0.35-96 (tf_keras)"))
MAX_STAGES = (1, 2, 3, None)
IMAGES = ("excluded", "streamed", "counted")
OPTIONS = SearchOptions(patch_options=tuple(range(2, 13)))  # grids 2x2 .. 12x12, halo: recompute or every cache
MAC_CAPS = (0.10, 0.20, 0.30)
# msf-CNN (NeurIPS'25), its optimizer on the standard Keras MobileNetV2-0.35-144 layer list (quoted in
# ../shared/notes/peers.md: analytic, input and output excluded, no residual ADDs, kB = 1000): (kB, MAC factor)
MSF_CNN_144 = ((124.6, 1.036), (37.3, 1.226), (21.3, 1.294), (15.8, 1.567))


def _best(front: list[StagePlan], cap: float) -> StagePlan | None:
    within = [p for p in front if p.mac_overhead <= cap + 1e-12]
    return min(within, key=lambda p: (p.peak, p.macs)) if within else None


def multistage_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    fronts: dict[tuple[str, str, int | None], list[StagePlan]] = {}
    for name, label in MODELS:
        graph = from_tflite(zoo.build(name, o.zoo_cache), name=name)
        for image in IMAGES:
            t0 = time.time()
            segs = stage_segments(graph, OPTIONS, image)
            log(f"[multistage] {name}, image {image}: {len(segs)} segments [{time.time() - t0:.0f} s]")
            runnable = [sg for sg in segs if not sg.pooled]  # what the executor runs today
            for ms in MAX_STAGES:
                front = pareto_plans(graph, segs, OPTIONS, ms, image)
                today = pareto_plans(graph, runnable, OPTIONS, ms, image)
                fronts[(name, image, ms)] = front
                fronts[(name, image + " runnable", ms)] = today
                row = {"model": name, "label": label, "image": image, "max_stages": ms, "analytic": True,
                       "per_layer_bytes": pareto_plans(graph, segs, OPTIONS, 0, image)[0].peak,
                       "front": [p.to_dict() for p in front], "front_runnable": [p.to_dict() for p in today]}
                for cap in MAC_CAPS:
                    b, r = _best(front, cap), _best(today, cap)
                    row[f"best_within_{int(round(100 * cap))}pct"] = b.to_dict() if b else None
                    row[f"runnable_within_{int(round(100 * cap))}pct"] = r.to_dict() if r else None
                rows.append(row)
    write_outputs({os.path.join(o.out_dir, "multistage.png"): _plot(fronts)})
    return {"rows": rows, "markdown": markdown(rows), "plot": "multistage.png"}


def _kb(n: int) -> str:
    return f"{n / 1000:.1f} kB"


def markdown(rows: list[dict[str, Any]]) -> str:
    md = ["Analytic (tfmcu.plan.regions / halo: int8 bytes, patch buffers apart, residual ADDs kept, kB = 1000); "
          "not measured in TFLM. Smallest peak SRAM within a MAC overhead, by the most stages allowed; each cell: "
          "the plans the executor runs today / with a last stage that ends into the global pool (analytic only):",
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
        for key, what in (("runnable_within_20pct", "runs today"), ("best_within_20pct", "analytic only")):
            b = best[key]
            if b:
                md += ["", f"MobileNetV2-0.35-144, best within +20% MACs, image excluded, any number of stages "
                           f"({what}): {_kb(b['peak_bytes'])} at +{100 * b['mac_overhead']:.1f}%: {b['describe']}."]
    return "\n".join(md) + "\n"


def _plot(fronts: dict[tuple[str, str, int | None], list[StagePlan]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MODELS), figsize=(12, 4.4))
    for ax, (name, label) in zip(axes, MODELS):
        for ms in MAX_STAGES:
            front = fronts.get((name, "excluded", ms), [])
            pts = sorted((100 * p.mac_overhead, p.peak / 1000) for p in front)
            if pts:
                ax.step([x for x, _ in pts], [y for _, y in pts], where="post", marker="o", markersize=3,
                        label=f"tfmcu, {'any number of' if ms is None else f'<= {ms}'} stage{'s' if ms != 1 else ''}")
        today = sorted((100 * p.mac_overhead, p.peak / 1000) for p in fronts.get((name, "excluded runnable", None), []))
        if today:
            ax.step([x for x, _ in today], [y for _, y in today], where="post", linestyle="--", color="k", marker="x",
                    linewidth=1, label="tfmcu, any number, no pooled tail (runs today)")
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
