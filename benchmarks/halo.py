"""Bench section ``halo`` (``python -m pipelines.bench --sections=halo``): peak SRAM against compute for the patch
stage with its halos recomputed (MCUNetV2), cached between neighbouring patches (``tfmcu.plan.halo``), with the
input streamed row band by row band, and with the rest's per-channel data in Flash (``convs_to_flash``).

For MobileNetV2-0.35-144 and MobileNetV2-1.0-224 (``MODELS``: the zoo's stage of 5 blocks, several grids), each
configuration is rewritten to custom mode and run WHOLE in TFLM built from source with our kernel
(``tfmcu.runtime.tflm_host``, this host, reference kernels): its arena is MEASURED (``arena_used_bytes``; the image
in the arena unless streamed), its outputs compared with the original model's in the same TFLM (must be equal). MAC
overheads are exact: what the executor computes (``tests/test_halo_stage.py`` checks the executed spans against the
analytic count). The rest of the graph is planned in place (``inplace``; valid for the reference kernels this
TFLM runs, and checked by the output comparison). Cache choices: none (recompute), ``choose_caches`` at the recompute schedule's analytic peak and
10% above it, and every tensor cached. Series: recompute; caches; caches + streamed input; caches + streamed input +
the rest's convolutions by our kernels (``rest_convs``, decided for this host's structs). The figure adds msf-CNN's
published points (quoted, analytic, their accounting: input / output excluded, no residual ADDs, kB = 1000).

Outputs: ``out/bench/halo.{json,md}`` and ``halo.png``. About 8 min on 2 CPU cores.

Section ``halo_firmware`` (``halo_firmware_section``): the same two models on Cortex-M4 / M7 under QEMU with CMSIS-NN
(firmware ``bench_halo_*`` in benchmarks/firmware/BUILD): per layer, patched recomputing, every halo cached, caches
+ input streamed from Flash; instructions of one Invoke and of its stage, the arena, outputs = TF Lite's.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from benchmarks.firmware_runs import PKG, firmware_reports, generator_record, label
from tfmcu.files import figure_png, write_outputs
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan import halo
from tfmcu.plan.arena import predict_arena
from tfmcu.plan.regions import ScheduleError, schedule
from tfmcu.runtime.model_io import random_inputs
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.custom import convs_to_flash, rewrite_custom

# model -> [(patch-stage blocks, grids), ...]
MODELS = {"mbv2_035_144": [(4, (9, 12)), (5, (2, 3, 4, 6, 8, 9, 12)), (6, (4, 6, 8))],
          "mbv2_100_224": [(5, (3, 4, 6))]}
MAX_MAC_OVERHEAD = 0.05  # halo "smallest": the MAC cap for MobileNetV2-0.35-144
TITLES = {"mbv2_035_144": "MobileNetV2-0.35-144", "mbv2_100_224": "MobileNetV2-1.0-224"}
CACHE_BUDGETS = (1.0, 1.1)  # choose_caches at these multiples of the recompute schedule's analytic peak
SERIES = (("recompute", "recompute (MCUNetV2)"), ("cache", "halo caches"),
          ("cache_flash", "caches + rest's multipliers in Flash"), ("stream", "caches + streamed input"),
          ("flash", "caches + streamed input + rest's multipliers in Flash"))
# msf-CNN (NeurIPS'25) on the standard Keras MobileNetV2-0.35-144 layer list, their optimizer: (MAC factor, kB),
# quoted from ../shared/notes/peers.md; analytic, input / output excluded, no residual ADDs, kB = 1000.
# MCUNetV2 (NeurIPS'21; ../shared/notes/paper.md): 4x4 patches at 224 cut the analytic peak of MobileNetV2, MbV2-RD,
# OFA-CPU, MnasNet and FBNet-A 3.7-8.0x at 8-17% more MACs (quoted: a range over five networks, not per network).
MCUNETV2_224 = {"peak_reduction": (3.7, 8.0), "mac_overhead_pct": (8, 17)}
MSF_CNN_144 = ((1.036, 124.6), (1.226, 37.3), (1.294, 21.3), (1.567, 15.8))


def _cache_choices(s: Any, image: str) -> dict[str, Any]:
    """The cache choices of one schedule (deduplicated: the same caches under two budgets are measured once)."""
    inter = halo.intermediates(s)
    base = halo.halo_caches(s)
    out: dict[str, Any] = {"none": None}
    seen = {(frozenset(), frozenset())}
    for f in CACHE_BUDGETS:
        h = halo.choose_caches(s, int(base.peak(image) * f), image)
        key = (h.cache_rows, h.cache_cols)
        if key not in seen:
            seen.add(key)
            out[f"auto@{f:g}"] = h
    h = halo.halo_caches(s, inter, inter)
    if (h.cache_rows, h.cache_cols) not in seen:
        seen.add((h.cache_rows, h.cache_cols))
        out["all"] = h
    try:
        h = halo.smallest_caches(s, MAX_MAC_OVERHEAD, image)
    except ScheduleError:  # even every cache exceeds the MAC cap
        return out
    if (h.cache_rows, h.cache_cols) not in seen:
        out[f"smallest@{100 * MAX_MAC_OVERHEAD:g}%"] = h
    return out


def halo_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for name, stages in MODELS.items():
        data = zoo.build(name, o.zoo_cache)
        g = from_tflite(data, name=name)
        sample = random_inputs(data, 1, seed=0)
        orig = run_whole(data, sample, name)
        ref = orig.outputs
        base = {"model": name, "macs": None, "measured_by": MEASURED_BY}
        rows.append({**base, "series": "original", "grid": [1, 1], "blocks": 0, "caches": "-", "streamed": False,
                     "rest_convs": "tflm", "mac_overhead_exact": 0.0, "stage_mac_overhead_exact": 0.0,
                     "arena_bytes": orig.arena.arena_used_bytes, "head_bytes": orig.arena.head_bytes,
                     "tail_bytes": orig.arena.tail_bytes, "equal_original": True})
        flash = convs_to_flash(data, name, build="host").model
        run = run_whole(flash, sample, name)
        rows.append({**base, "series": "original+flash", "grid": [1, 1], "blocks": 0, "caches": "-",
                     "streamed": False,
                     "rest_convs": "tfmcu", "mac_overhead_exact": 0.0, "stage_mac_overhead_exact": 0.0,
                     "arena_bytes": run.arena.arena_used_bytes, "head_bytes": run.arena.head_bytes,
                     "tail_bytes": run.arena.tail_bytes, "equal_original": _equal(run.outputs, ref)})
        for blocks, p in [(b, p) for b, grids in stages for p in grids]:
            s = schedule(g, p, n_blocks=blocks)
            for stream in (False, True):
                for label, h in _cache_choices(s, "streamed" if stream else "counted").items():
                    model = rewrite_custom(data, g, s, name, halo=h, streamed_input=stream, inplace=True).model
                    variants = [("tflm", model)]
                    if h is not None:
                        variants.append(("tfmcu", convs_to_flash(model, name, inplace=True, build="host").model))
                    for rest, m in variants:
                        run = run_whole(m, sample, name)
                        pred = predict_arena(from_tflite(m), model=m, build="host")
                        series = {(False, "tflm"): "cache", (False, "tfmcu"): "cache_flash", (True, "tflm"): "stream",
                                  (True, "tfmcu"): "flash"}[(stream, rest)]
                        if h is None and not stream:
                            series = "recompute"
                        mo = h.mac_overhead if h is not None else s.macs_patched_exact / s.macs - 1
                        so = h.stage_mac_overhead if h is not None else s.stage_macs_patched_exact / s.stage_macs - 1
                        rows.append({**base, "macs": s.macs, "series": series, "grid": [p, p], "blocks": blocks,
                                     "caches": label,
                                     "n_caches": 0 if h is None else len(h.cache_rows) + len(h.cache_cols),
                                     "cache_bytes": 0 if h is None else h.cache_bytes, "streamed": stream,
                                     "rest_convs": rest, "mac_overhead_exact": round(mo, 6),
                                     "stage_mac_overhead_exact": round(so, 6),
                                     "arena_bytes": run.arena.arena_used_bytes, "head_bytes": run.arena.head_bytes,
                                     "tail_bytes": run.arena.tail_bytes, "predicted_arena_bytes": pred.total,
                                     "equal_original": _equal(run.outputs, ref)})
                        r = rows[-1]
                        log(f"[halo] {name} {p}x{p} n={blocks} {label}{' streamed' if stream else ''}"
                            f"{' rest in Flash' if rest == 'tfmcu' else ''}: arena {r['arena_bytes']:,} B, MACs "
                            f"{100 * mo:+.1f}%, equal {r['equal_original']} ({time.time() - t0:.0f} s)")
    plot = os.path.join(o.out_dir, "halo.png")
    _plot(rows, plot)
    return {"rows": rows, "plot": "halo.png"}


def _equal(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    return all(np.array_equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes, by increasing x."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not out or y < out[-1][1]:
            out.append((x, y))
    return out


def _best(rows: list[dict[str, Any]], max_overhead: float, series: tuple[str, ...]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["series"] in series and r["mac_overhead_exact"] <= max_overhead + 1e-9]
    return min(ok, key=lambda r: (r["arena_bytes"], r["mac_overhead_exact"])) if ok else None


def table(result: dict[str, Any]) -> str:
    """Section *halo*'s table and its targets, from its JSON."""
    rows = result["rows"]
    md = [f"Measured: {MEASURED_BY}; arena = TFLM's arena_used_bytes (image in the arena unless streamed). MAC "
          "overheads exact (what the executor computes), whole model; stage overheads in the table.", "",
          "| model | series | grid | caches | MACs (whole / stage) | arena (B) | head / tail (B) | vs original | "
          "outputs = original |", "|---|---|---|---|---:|---:|---:|---:|---|"]
    for name in MODELS:
        mine = [r for r in rows if r["model"] == name]
        orig = next(r for r in mine if r["series"] == "original")
        for r in mine:
            where = f"{r['grid'][0]}x{r['grid'][1]}" + (f", n={r['blocks']}" if r["blocks"] else "")
            md.append(f"| {TITLES[name]} | {r['series']} | {where} | {r['caches']} | "
                      f"{100 * r['mac_overhead_exact']:+.1f}% / {100 * r['stage_mac_overhead_exact']:+.1f}% | "
                      f"{r['arena_bytes']:,} | {r['head_bytes']:,} / {r['tail_bytes']:,} | "
                      f"{orig['arena_bytes'] / r['arena_bytes']:.2f}x | {'yes' if r['equal_original'] else 'NO'} |")
    md += ["", "Targets, from the rows above:"]
    rows224 = [r for r in rows if r["model"] == "mbv2_100_224"]
    rec = next((r for r in rows224 if r["series"] == "recompute" and r["grid"] == [4, 4] and r["blocks"] == 5), None)
    if rec is not None:
        cached = [r for r in rows224 if r["series"] == "cache" and r["grid"] == [4, 4] and r["blocks"] == 5]
        low = [r for r in cached if r["stage_mac_overhead_exact"] <= 0.03 and
               r["arena_bytes"] <= 1.25 * rec["arena_bytes"]]
        md.append(f"- MobileNetV2-1.0-224 4x4 n=5: recompute {100 * rec['stage_mac_overhead_exact']:+.1f}% stage "
                  f"MACs at {rec['arena_bytes']:,} B; with caches, stage MACs <= +3% at <= 1.25x that arena: "
                  + (", ".join(f"{r['caches']} {100 * r['stage_mac_overhead_exact']:+.1f}% at {r['arena_bytes']:,} B "
                               f"({r['arena_bytes'] / rec['arena_bytes']:.3f}x)" for r in low) or "none")
                  + "; at an equal arena (+-2%) at most half the MAC overhead: "
                  + (", ".join(f"{r['caches']} {100 * r['stage_mac_overhead_exact']:+.1f}% at "
                               f"{r['arena_bytes'] / rec['arena_bytes']:.3f}x" for r in cached
                               if abs(r["arena_bytes"] / rec["arena_bytes"] - 1) <= 0.02 and
                               r["stage_mac_overhead_exact"] <= rec["stage_mac_overhead_exact"] / 2) or "none"))
    rows144 = [r for r in rows if r["model"] == "mbv2_035_144"]
    if rows144:
        orig = next(r for r in rows144 if r["series"] == "original")
        for label, series, want in (("image in the arena", ("recompute", "cache"), 3.5),
                                    ("image in the arena, rest's multipliers in Flash", ("cache_flash",), 3.5),
                                    ("streamed input", ("stream",), 6.0),
                                    ("streamed input, rest's multipliers in Flash", ("flash",), 6.0)):
            b = _best(rows144, 0.05, series)
            if b is not None:
                ratio = orig["arena_bytes"] / b["arena_bytes"]
                md.append(f"- MobileNetV2-0.35-144, {label}, MACs <= +5%: best {b['arena_bytes']:,} B "
                          f"({b['series']}, {b['grid'][0]}x{b['grid'][1]} n={b['blocks']}, caches {b['caches']}, "
                          f"{100 * b['mac_overhead_exact']:+.1f}% MACs): {ratio:.2f}x below the original's "
                          f"{orig['arena_bytes']:,} B (target >= {want:g}x: {'met' if ratio >= want else 'NOT met'})")
    return "\n".join(md) + "\n"


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    """Measured TFLM arena against whole-model MAC overhead, per model: each series' points and Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MODELS), figsize=(6.2 * len(MODELS), 4.6))
    markers = {"recompute": "o", "cache": "s", "cache_flash": "v", "stream": "^", "flash": "D"}
    for ax, name in zip(np.atleast_1d(axes), MODELS):
        mine = [r for r in rows if r["model"] == name]
        orig = next(r for r in mine if r["series"] == "original")
        ax.axhline(orig["arena_bytes"] / 1024, color="grey", linestyle=":", linewidth=1,
                   label=f"original, per layer ({orig['arena_bytes'] / 1024:.0f} kB)")
        for key, label in SERIES:
            pts = [(100 * r["mac_overhead_exact"], r["arena_bytes"] / 1024) for r in mine if r["series"] == key]
            if not pts:
                continue
            ax.scatter(*zip(*pts), marker=markers[key], s=18, alpha=0.45)
            front = _pareto(pts)
            ax.plot(*zip(*front), marker=markers[key], label=label + " (Pareto front)")
        if name == "mbv2_100_224":  # MCUNetV2's published range, relative to the per-layer figure
            lo, hi = MCUNETV2_224["peak_reduction"]
            x0, x1 = MCUNETV2_224["mac_overhead_pct"]
            ax.add_patch(plt.Rectangle((x0, orig["arena_bytes"] / 1024 / hi), x1 - x0,
                                       orig["arena_bytes"] / 1024 * (1 / lo - 1 / hi), color="tab:grey", alpha=0.2,
                                       label="MCUNetV2 (quoted, analytic: 4x4 at 224, 5 networks, "
                                             f"{lo}-{hi}x below per layer at +{x0}-{x1}% MACs)"))
        if name == "mbv2_035_144":
            ax.scatter([100 * (f - 1) for f, _ in MSF_CNN_144], [kb * 1000 / 1024 for _, kb in MSF_CNN_144],
                       marker="x", color="black", label="msf-CNN (quoted, analytic; I/O excluded, no ADDs)")
        ax.set_xlabel("MAC overhead, whole model (%; exact)")
        ax.set_ylabel("peak SRAM: TFLM arena (kB; measured)")
        ax.set_title(f"{TITLES[name]}: measured TFLM arena vs compute", fontsize=10)
        ax.legend(fontsize=7)
    write_outputs({path: figure_png(fig)})


# ============================================================================= section halo_firmware
FIRMWARE_MODELS = ("mbv2_035_144", "mbv2_100_224")
FIRMWARE_VARIANTS = {"cmsis": "TFLM + CMSIS-NN per layer (baseline)", "cmsis_p": "patched, recompute",
                     "cmsis_p_all": "patched, every halo cached",
                     "cmsis_p_auto_stream": "patched, caches (auto) + input streamed from Flash"}
LATENCY_TARGET = 1.05  # target: whole model patched <= 1.05 x TFLM + CMSIS-NN unpatched (QEMU instructions)
# MobileNetV2-0.35-144 with TFLM's reference kernels: per layer, and 9x9 n=5 with the smallest stage within +5% MACs
# (the rest in place, its multipliers in Flash), image in the arena or streamed: variant -> (label, target ratio)
MEMORY_VARIANTS = {"ref": ("TFLM reference kernels per layer (baseline)", None),
                   "ref_p9_smallest": ("9x9 n=5, smallest stage <= +5% MACs, image in the arena, rest in place, "
                                       "its multipliers in Flash", 3.5),
                   "ref_p9_smallest_stream": ("the same, input streamed from Flash", 6.0)}


def halo_firmware_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole model on Cortex-M4 / M7 under QEMU (benchmarks/firmware/BUILD, bench_halo_*; CMSIS-NN
    everywhere): instructions of one Invoke and of its patch stage, the measured arena, outputs = TF Lite's."""
    tests = [f"bench_halo_{m}_{v}_{t}_test" for m in FIRMWARE_MODELS for v in FIRMWARE_VARIANTS
             for t in ("cortex_m4", "cortex_m7")]
    memory_tests = [f"bench_halo_mbv2_035_144_{v}_{t}_test" for v in MEMORY_VARIANTS for t in ("cortex_m4", "cortex_m7")]
    labels = [label(PKG, t) for t in tests + memory_tests]
    reports = dict(zip(tests + memory_tests, firmware_reports("halo_firmware", labels, log)))
    rows = []
    for test in tests + memory_tests:
        rep = reports[test]
        res = rep["result"]
        host = generator_record(label(PKG, test))
        regions = res["regions"]
        model, variant = host["model"], test[len("bench_halo_"):].rsplit("_cortex", 1)[0][len(host["model"]) + 1:]
        rows.append({"test": test, "model": model, "variant": variant, "target": res["target"],
                     "invoke_insns": min(g["insns"] for g in regions if g["name"] == "invoke"),
                     "stage_insns": min((g["insns"] for g in regions if g["name"] == "stage"), default=None),
                     "arena_used_bytes": res["arena_used_bytes"],
                     "arena_predicted": host["predicted_arena_bytes_cortex_m"],
                     "macs": host.get("macs"), "macs_executed": host.get("macs_executed"), "what": host["what"],
                     "equal_tflite": not rep["problems"]})
    for r in rows:
        if r["variant"] in FIRMWARE_VARIANTS:
            base = next(b for b in rows if b["model"] == r["model"] and b["variant"] == "cmsis" and
                        b["target"] == r["target"])
            r["vs_baseline"] = round(r["invoke_insns"] / base["invoke_insns"], 4)
        else:
            base = next(b for b in rows if b["variant"] == "ref" and b["target"] == r["target"])
            r["vs_per_layer"] = round(base["arena_used_bytes"] / r["arena_used_bytes"], 4)
    plot = os.path.join(o.out_dir, "halo_firmware.png")
    _plot_firmware([r for r in rows if r["variant"] in FIRMWARE_VARIANTS], plot)
    return {"rows": rows, "plot": "halo_firmware.png"}


def firmware_table(result: dict[str, Any]) -> str:
    """Section *halo_firmware*'s latency and memory tables, from its JSON."""
    rows = result["rows"]
    md = ["Measured: QEMU instruction counts (plugin) of one Invoke and of its patch stage, TFLM's arena_used_bytes "
          "on the target; CMSIS-NN kernels everywhere (TFLM's for the rest, the patch executor's CMSIS-NN backend "
          "for the stage).", "",
          "| model | variant | target | instructions / inference | vs baseline | stage instructions | vs baseline "
          "stage | arena (B) | = predicted | outputs = TF Lite |",
          "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    memory = [r for r in rows if r["variant"] in MEMORY_VARIANTS]
    rows_latency = [r for r in rows if r["variant"] in FIRMWARE_VARIANTS]
    for r in rows_latency:
        base = next(b for b in rows if b["model"] == r["model"] and b["variant"] == "cmsis" and
                    b["target"] == r["target"])
        ratio = r["invoke_insns"] / base["invoke_insns"]
        stage = (f"{r['stage_insns']:,}" if r["stage_insns"] else "-")
        stage_ratio = (f"{r['stage_insns'] / base['stage_insns']:.3f}x" if r["stage_insns"] and base["stage_insns"]
                       else "-")
        md.append(f"| {TITLES[r['model']]} | {FIRMWARE_VARIANTS[r['variant']]} | {r['target']} | "
                  f"{r['invoke_insns']:,} | {ratio:.3f}x | {stage} | {stage_ratio} | {r['arena_used_bytes']:,} | "
                  f"{'yes' if r['arena_used_bytes'] == r['arena_predicted'] else 'no'} | "
                  f"{'yes' if r['equal_tflite'] else 'NO'} |")
    md += ["", f"Target: whole model patched <= {LATENCY_TARGET} x TFLM + CMSIS-NN unpatched:"]
    for r in rows_latency:
        if r["variant"] != "cmsis":
            md.append(f"- {TITLES[r['model']]}, {FIRMWARE_VARIANTS[r['variant']]}, {r['target']}: "
                      f"{r['vs_baseline']:.3f}x ({'met' if r['vs_baseline'] <= LATENCY_TARGET else 'NOT met'})")
    md += ["", "Memory on the MCU (MobileNetV2-0.35-144, TFLM's reference kernels; measured arena_used_bytes, "
           "MACs exact):", "", "| variant | target | MACs | instructions / inference | arena (B) | = predicted | "
           "vs per layer | target | outputs = TF Lite |", "|---|---|---:|---:|---:|---|---:|---|---|"]
    for r in memory:
        base = next(b for b in memory if b["variant"] == "ref" and b["target"] == r["target"])
        label, want = MEMORY_VARIANTS[r["variant"]]
        ratio = base["arena_used_bytes"] / r["arena_used_bytes"]
        macs = ("-" if not r["macs_executed"] or not r["macs"] else
                f"{100 * (r['macs_executed'] / r['macs'] - 1):+.1f}%")
        md.append(f"| {label} | {r['target']} | {macs} | {r['invoke_insns']:,} | {r['arena_used_bytes']:,} | "
                  f"{'yes' if r['arena_used_bytes'] == r['arena_predicted'] else 'no'} | {ratio:.2f}x | "
                  + ("-" if want is None else f">= {want:g}x: {'met' if ratio >= want else 'NOT met'}")
                  + f" | {'yes' if r['equal_tflite'] else 'NO'} |")
    return "\n".join(md) + "\n"


def _plot_firmware(rows: list[dict[str, Any]], path: str) -> None:
    """Measured arena against measured instructions per inference (vs the CMSIS-NN per-layer baseline), per model
    and core: the latency rows of ``halo_firmware_section``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIRMWARE_MODELS), figsize=(6.2 * len(FIRMWARE_MODELS), 4.6))
    markers = {"cmsis": "o", "cmsis_p": "s", "cmsis_p_all": "D", "cmsis_p_auto_stream": "^"}
    for ax, name in zip(np.atleast_1d(axes), FIRMWARE_MODELS):
        for target, color in zip(sorted({r["target"] for r in rows}), ("tab:blue", "tab:orange", "tab:green")):
            mine = [r for r in rows if r["model"] == name and r["target"] == target]
            if not mine:
                continue
            for r in mine:
                ax.scatter(100 * (r["vs_baseline"] - 1), r["arena_used_bytes"] / 1024, color=color,
                           marker=markers[r["variant"]], label=f"{FIRMWARE_VARIANTS[r['variant']]}, {target}")
        ax.axvline(100 * (LATENCY_TARGET - 1), color="grey", linestyle=":", linewidth=1,
                   label=f"target: <= {LATENCY_TARGET}x instructions")
        ax.set_xlabel("instructions per inference vs TFLM + CMSIS-NN per layer (%; QEMU, measured)")
        ax.set_ylabel("TFLM arena on the MCU (kB; measured)")
        ax.set_title(f"{TITLES[name]}: arena vs instructions (Cortex-M, CMSIS-NN)", fontsize=10)
        ax.legend(fontsize=6)
    write_outputs({path: figure_png(fig)})
