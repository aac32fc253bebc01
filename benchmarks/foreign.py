"""The bench section *foreign*: models users bring (``benchmarks.foreign_models``: tf_keras.applications models with
their preprocessing layers left in, converted in the bench) through the one command, ``fit --run``, on the
Cortex-M4, M7 and M55, against TFLM + CMSIS-NN per layer (``deploy --run``), all measured under QEMU.

Each converted model goes through ``benchmarks.fit.fit_section`` (its per-layer and fit rows, kept in
``<out_dir>/foreign/rows.json`` as they are measured, so a stopped run resumes; fit with its defaults and no time
budget, ``objective=memory``, the image streamed) on ``TARGETS`` at ``CAPS``, and a model with squeeze-excites also at
``SE_CAP`` with ``se_passes=False`` (squeeze-excites kept out of patch stages): the table says where the search ran a
squeeze-excite inside a stage in passes and what that saved. A model that does not convert is a row saying why; a
fit that finds nothing under the target's SRAM is a row with fit's one-line reason.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from benchmarks import fit as bench_fit
from benchmarks.foreign_models import BY_NAME, CLASSES, INPUT_RANGE, MODELS, ForeignModel, convert
from tfmcu.errors import UsageError
from tfmcu.files import figure_png, write_outputs
from tfmcu.firmware.targets import get_target
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.plan.profiler import profile

TARGETS = ("cortex-m4", "cortex-m7", "cortex-m55")
CAPS = (1.00, 1.10, None)  # None: the smallest arena, whatever its instructions
SE_CAP = 1.10  # squeeze-excite models: also fit here with se_passes=False
NO_SE_PASSES = f"fit, max_latency {SE_CAP:.2f}, squeeze-excites out of stages"


def selection(models: tuple[str, ...] = (), targets: tuple[str, ...] = ()) -> tuple[list[ForeignModel], list[str]]:
    """The models and targets ``pipelines.bench --foreign_models --foreign_targets`` name (empty: all)."""
    bad = [m for m in models if m not in BY_NAME]
    if bad:
        raise UsageError(f"--foreign_models: unknown {', '.join(bad)}; known: {', '.join(BY_NAME)}")
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise UsageError(f"--foreign_targets: unknown {', '.join(bad)}; known: {', '.join(TARGETS)}")
    return [m for m in MODELS if not models or m.name in models], [t for t in TARGETS if not targets or t in targets]


def _extra(name: str) -> tuple[bench_fit.FitRow, ...]:
    return (bench_fit.FitRow(NO_SE_PASSES, SE_CAP, (("se_passes", False),)),) if BY_NAME[name].se else ()


def foreign_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every model of ``MODELS`` converted (or the reason it does not convert), then per target its per-layer row and
    its fit rows (``benchmarks.fit.fit_section``: kept in ``<out_dir>/foreign/rows.json`` as they are measured), and
    the plot."""
    t0 = time.time()
    chosen, targets = selection(getattr(o, "foreign_models", ()), getattr(o, "foreign_targets", ()))
    converted: dict[str, bytes] = {}
    models, failed = [], []
    for m in chosen:
        entry = {"model": m.name, "title": m.title, "squeeze_excite": m.se,
                 "input_range": list(INPUT_RANGE), "classes": CLASSES}
        log(f"[foreign] {m.name}: {m.title}: converting (cached in {o.zoo_cache}) ...")
        try:
            data = convert(m, o.zoo_cache)
            profile_ = profile(from_tflite(data, name=m.name))
        except Exception as e:  # noqa: BLE001 -- the row says why, the bench goes on
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failed.append({"model": m.name, "target": "-", "what": "conversion",
                           "error": f"does not convert to full int8: {reason}"})
            models.append({**entry, "error": failed[-1]["error"]})
            continue
        converted[m.name] = data
        models.append({**entry, "tflite_bytes": len(data), "macs": profile_.macs,
                       "analytic_peak_per_layer_bytes": profile_.peak_sram_per_layer_bytes})
    cases = tuple((m.name, t, True) for m in chosen if m.name in converted for t in targets)
    every = tuple((m.name, t, True) for m in MODELS for t in TARGETS)
    res = bench_fit.fit_section(o, log, cases, CAPS, work_name="foreign", model=lambda name, cache: converted[name],
                                extra=_extra, record_cases=every)
    rows = res["rows"] + failed
    order = {m.name: i for i, m in enumerate(MODELS)}
    rows.sort(key=lambda r: order[r["model"]])  # (stable: a model's targets and rows in the order measured)
    plot = os.path.join(o.out_dir, "foreign.png")
    write_outputs({plot: _plot(rows, models)})
    return {"rows": rows, "models": models, "targets": list(targets), "caps": list(CAPS), "se_cap": SE_CAP,
            "search": res["search"], "plot": "foreign.png", "wall_seconds": round(time.time() - t0)}


# ------------------------------------------------------------------------------------------------ the table
def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def _fit_what(cap: float | None) -> str:
    return "fit, smallest" if cap is None else f"fit, max_latency {cap:.2f}"


def _outputs(r: dict[str, Any]) -> str:
    """Outputs = TF Lite's (TFLM's on this host where deploy proved a rounding tie: deploy.reference)."""
    if r.get("arena_used_bytes") is None:
        return "-"
    if not r["outputs_equal_tflite"]:
        return "NO"
    ties = r.get("tflm_reference_inputs") or 0
    return "yes" + (f" ({ties} of {r['inputs']} inputs: TFLM's, a proven tie)" if ties else "")


def _per_layer_arena(base: dict[str, Any]) -> str:
    if base.get("arena_used_bytes"):
        return _n(base["arena_used_bytes"])
    return f"{_n(base['predicted_arena_bytes'])} (predicted: does not fit)"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if "error" in r:  # (the rows below say why)
        return ("does not fit" if "does not fit" in r["error"] else
                "model exceeds the Flash" if "exceeds" in r["error"] else "failed")
    if r.get("arena_used_bytes") is None:
        return f"{_n(r['predicted_arena_bytes'])} predicted, not run"
    ratio = "" if r.get("arena_ratio") is None else f" ({r['arena_ratio']:.2f}x)"
    insns = "" if r.get("instructions_ratio") is None else f", {r['instructions_ratio']:.3f}x instr."
    return f"{_n(r['arena_used_bytes'])}{ratio}{insns}"


def _passes(r: dict[str, Any]) -> str:
    if "error" in r or r["what"] == bench_fit.PER_LAYER:
        return ""
    stages = r.get("stage_passes") or []
    used = (f"{len(stages)} stage{'s' if len(stages) > 1 else ''} in passes ({'/'.join(map(str, stages))})"
            if stages else "none")
    return f"{used}; {r.get('candidates_with_passes', 0)} of {r.get('candidates', 0)} priced"


def table(result: dict[str, Any]) -> str:
    """Section *foreign*'s tables, from its JSON: the models, a summary per model and target, the squeeze-excites'
    passes against stages that end at them, and every row."""
    rows, models = result["rows"], result.get("models", [])
    caps = [None if c is None else float(c) for c in result.get("caps", CAPS)]
    se_cap = result.get("se_cap", SE_CAP)
    no_se = f"fit, max_latency {se_cap:.2f}, squeeze-excites out of stages"
    low, high = (models[0]["input_range"] if models else INPUT_RANGE)
    md = [f"Random weights, batch norms calibrated on random images in [{low:g}, {high:g}], full int8 (int8 input "
          "and output), the preprocessing layers in the model:", "",
          "| model | what | MACs | int8 .tflite (B) | squeeze-excites | analytic peak per layer (B) |",
          "|---|---|---:|---:|---|---:|"]
    for m in models:
        if "error" in m:
            md.append(f"| {m['model']} | {m['title']} | {m['error']} | | | |")
            continue
        md.append(f"| {m['model']} | {m['title']} | {m['macs'] / 1e6:.1f}M | {_n(m['tflite_bytes'])} | "
                  f"{'yes' if m['squeeze_excite'] else 'no'} | {_n(m['analytic_peak_per_layer_bytes'])} |")
    by = {(r["model"], r["target"], r["what"]): r for r in rows}
    cases = list(dict.fromkeys((r["model"], r["target"]) for r in rows if r["target"] != "-"))
    se_models = {m["model"] for m in models if m.get("squeeze_excite")}
    md += ["", "Arena measured under QEMU (TFLM arena_used_bytes, B) and, in brackets, how many times smaller than "
           "per layer; instructions per Invoke against per layer:", "",
           "| model | target | per layer (B) | " + " | ".join(_fit_what(c) for c in caps) + f" | {no_se} |",
           "|---|---|---:|" + "---:|" * (len(caps) + 1)]
    for model, target in cases:
        base = by.get((model, target, bench_fit.PER_LAYER))
        first = _per_layer_arena(base) if base and "error" not in base else "failed" if base else "-"
        md.append(f"| {model} | {target} | {first} | " + " | ".join(_cell(by.get((model, target, _fit_what(c))))
                                                                 for c in caps)
                  + f" | {_cell(by.get((model, target, no_se))) if model in se_models else 'no squeeze-excite'} |")
    if se_models:
        md += ["", f"Squeeze-excites inside patch stages, in passes, at max_latency {se_cap:.2f}: the plan fit chose "
               "(stages run in passes, and how many of the candidates priced had such a stage) against fit with "
               "squeeze-excites kept out of stages (`--nose_passes`):", "",
               "| model | target | with passes: arena (B) | stages in passes | without: arena (B) | passes saved | "
               "instructions with / without |", "|---|---|---:|---|---:|---:|---|"]
        for model, target in cases:
            if model not in se_models:
                continue
            a, b = by.get((model, target, _fit_what(se_cap))), by.get((model, target, no_se))
            if a is None or b is None:
                continue
            ok_a, ok_b = "error" not in a and a.get("arena_used_bytes"), "error" not in b and b.get("arena_used_bytes")
            with_, without = (a["arena_used_bytes"], b["arena_used_bytes"]) if ok_a and ok_b else (None, None)
            saved = f"{without - with_:,} B ({without / with_:.2f}x)" if with_ else "-"
            insns = (f"{_n(a['instructions'])} / {_n(b['instructions'])}" if ok_a and ok_b else "-")
            md.append(f"| {model} | {target} | {_cell(a) if not ok_a else _n(a['arena_used_bytes'])} | "
                      f"{_passes(a) if ok_a else '-'} | {_cell(b) if not ok_b else _n(b['arena_used_bytes'])} | "
                      f"{saved} | {insns} |")
    md += ["", "Every row: measured on the target under QEMU (TFLM + CMSIS-NN, the patch executor's CMSIS-NN backend; "
           "fit's rows with the image streamed), predicted by tfmcu.plan.arena and tfmcu.plan.latency."
           + bench_fit.searched(result), "",
           "| model | target | configuration | schedule | arena (B) | vs per layer | predicted arena (error) | "
           "instructions | vs per layer | predicted instructions (error) | outputs = TF Lite | squeeze-excites in "
           "passes | search |", "|---|---|---|---|---:|---:|---|---:|---:|---|---|---|---:|"]
    for r in rows:
        if "error" in r:  # (fit's line without the bench's file name)
            md.append(f"| {r['model']} | {r['target']} | {r['what']} | {r['error'].split('.tflite: ', 1)[-1]} "
                      "| | | | | | | | | |")
            continue
        measured = r.get("arena_used_bytes")
        pred = r["predicted_arena_bytes"]
        arena_err = f"{_n(pred)} ({100 * (pred / measured - 1):+.1f}%)" if measured else f"{_n(pred)} (not run)"
        insn_err = ("-" if r.get("predicted_instructions") is None else
                    f"{_n(r['predicted_instructions'])}"
                    + ("" if r.get("instructions_error") is None else f" ({100 * r['instructions_error']:+.1f}%)"))
        what = r["what"] + (" (does not fit; instructions: the same core, more SRAM)" if r.get("instructions_from")
                            else "")
        ratio = "-" if r.get("arena_ratio") is None else f"{r['arena_ratio']:.2f}x smaller"
        slower = "-" if r.get("instructions_ratio") is None else f"{r['instructions_ratio']:.3f}x"
        md.append(f"| {r['model']} | {r['target']} | {what} | {r['schedule'] or 'per layer'} | {_n(measured)} | "
                  f"{ratio} | {arena_err} | {_n(r.get('instructions'))} | {slower} | {insn_err} | {_outputs(r)} | "
                  f"{_passes(r)} | "
                  + ("-" if r.get("search_seconds") is None else f"{r['search_seconds']:.0f} s") + " |")
    return "\n".join(md) + "\n"


# ------------------------------------------------------------------------------------------------ the plot
def _plot(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> bytes:
    """Per model, per core: the per-layer arena (hatched where predicted: it does not fit) against fit's at each cap
    (and with squeeze-excites out of stages), measured under QEMU; the core's SRAM marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m["model"] for m in models if "error" not in m]
    series = [bench_fit.PER_LAYER] + [_fit_what(c) for c in CAPS] + [NO_SE_PASSES]
    labels = ["per layer", "fit 1.00", "fit 1.10", "fit, smallest", "fit 1.10, SE out of stages"]
    colors = ["#888888", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
    by = {(r["model"], r["target"], r["what"]): r for r in rows}
    cols = 3
    fig, axes = plt.subplots(max(1, -(-len(names) // cols)), cols, figsize=(15, 3.6 * max(1, -(-len(names) // cols))),
                             squeeze=False)
    width = 0.16
    for ax, name in zip(axes.flat, names):
        targets = list(dict.fromkeys(r["target"] for r in rows if r["model"] == name and r["target"] != "-"))
        for k, (what, label, color) in enumerate(zip(series, labels, colors)):
            xs, ys, hatch = [], [], []
            for i, t in enumerate(targets):
                r = by.get((name, t, what))
                if r is None or "error" in r:
                    continue
                v = r.get("arena_used_bytes") or r.get("predicted_arena_bytes")
                xs.append(i + (k - 2) * width)
                ys.append(v / 1024)
                hatch.append(not r.get("arena_used_bytes"))
            bars = ax.bar(xs, ys, width, color=color, label=label)
            for b, h in zip(bars, hatch):
                if h:
                    b.set_hatch("//")
                    b.set_alpha(0.5)
        for i, t in enumerate(targets):
            sram = get_target(t).sram_bytes / 1024
            ax.plot([i - 2.5 * width, i + 2.5 * width], [sram, sram], "k--", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylim(bottom=8)
        ax.set_xticks(range(len(targets)))
        ax.set_xticklabels(targets, fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("TFLM arena (KiB)", fontsize=8)
    spare = list(axes.flat)[len(names):]
    for ax in spare:
        ax.axis("off")
    handles, texts = axes.flat[0].get_legend_handles_labels()
    if spare:  # the legend in the first empty panel, else over the first model's
        spare[0].legend(handles, texts, fontsize=9, loc="center")
    else:
        axes.flat[0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Models users bring: TFLM arena per layer (hatched: predicted, it does not fit) against fit "
                 "--run (measured under QEMU); dashed: the target's SRAM", fontsize=10)
    return figure_png(fig)
