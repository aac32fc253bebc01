"""fit's report for a person (report.md beside fit.json): what was chosen, memory per region and over the ops
(memory.png), Flash, time per op at the board's clock, what was verified, and the files a board takes, in the words
of a vendor's analyze / validate report. Every figure is fit.json's (``FitReport.to_json()``): measured ones say by what, estimated ones by which
model.
"""

from __future__ import annotations

from typing import Any

KIB = 1024


def _b(n: int | None) -> str:
    return "-" if n is None else f"{n:,} B"


def _memory(fit: dict[str, Any], dep: dict[str, Any], run: dict[str, Any] | None) -> list[str]:
    arena, ch, base = dep["arena"], fit["chosen"], fit["per_layer"]
    md = ["## Memory", "",
          "| | predicted (tfmcu.plan.arena) | measured on the target |", "|---|---:|---:|",
          f"| TFLM arena in {arena.get('region') or 'RAM'} | {_b(arena['predicted_bytes'])} | "
          f"{_b(run.get('arena_used_bytes') if run else None)} |"]
    if run and run.get("persistent_bytes"):
        md.append(f"| TFLM's persistent data, apart in {arena.get('persistent_region')} | "
                  f"{_b(arena.get('persistent_bytes'))} | {_b(run['persistent_bytes'])} |")
    md.append(f"| stack | {_b(dep['stack_bytes'])} (size) | "
              f"{_b(run.get('stack_hwm_bytes') if run else None)} (high-water mark) |")
    if run and run.get("sizes"):
        md.append(f"| RAM: .data + .bss + stack | {_b(dep['estimate'].get('ram_bytes'))} (estimated) | "
                  f"{_b(run['sizes']['ram'])} (the link) |")
    total = ch["predicted_arena_bytes"] + (ch.get("predicted_persistent_bytes") or 0)
    md += ["", f"Per layer (no patching) the arena is {_b(base['predicted_arena_bytes'])} (predicted): "
               f"{base['predicted_arena_bytes'] / max(total, 1):.2f}x the chosen model's. fit.png: every candidate's "
               f"predicted arena against its predicted instructions.", ""]
    return md


def _timeline(fit: dict[str, Any], dep: dict[str, Any]) -> list[str]:
    points = dep["arena"].get("timeline") or []
    base = fit.get("per_layer_timeline") or []
    if not points:
        return []
    region = dep["arena"].get("region") or "RAM"
    peak = max(points, key=lambda p: p["arena_bytes"])
    md = ["## Memory over the ops", "",
          f"The arena in {region} during each operator of one Invoke (predicted, tfmcu.plan.arena: the planned tensors "
          f"and scratch alive in its scope" + ("" if dep["arena"].get("persistent_bytes") else
                                              ", and TFLM's persistent data") + "); memory.png draws it beside the "
          f"per-layer model's. The peak: {_b(peak['arena_bytes'])} at op {peak['op']} "
          f"({peak['type'].replace('custom:', '')})"
          + (f"; per layer {_b(max(p['arena_bytes'] for p in base))} at op "
             f"{max(base, key=lambda p: p['arena_bytes'])['op']}" if base else "") + ".", "",
          f"| op | type | arena in {region} |", "|---:|---|---:|"]
    for p in points:
        stage = p["type"] == "custom:TFMCU_PATCH_STAGE"
        md.append(f"| {p['op']} | {'**patch stage**' if stage else p['type'].replace('custom:', '')} | "
                  f"{_b(p['arena_bytes'])} |")
    return md + [""]


def _flash(dep: dict[str, Any], run: dict[str, Any] | None) -> list[str]:
    fl = dep["flash"]
    md = ["## Flash", "", f"- the model: {_b(fl['model_bytes'])} ({fl.get('model_in', 'flash')})"]
    if run and run.get("sizes"):
        s = run["sizes"]
        md.append(f"- the firmware (the link): {_b(s['flash'])} of the board's {_b(fl['flash_bytes'])} (.text "
                  f"{s['text']:,} B, .rodata {s['rodata']:,} B with the model and the test inputs, .data {s['data']:,} B)"
                  + (f"; {s['psram']:,} B in external memory" if s.get("psram") else ""))
    else:
        md.append(f"- the firmware: {_b(fl['estimated_bytes'])} of {_b(fl['flash_bytes'])} ({fl['how']})")
    return md + [""]


def _time(fit: dict[str, Any], dep: dict[str, Any], run: dict[str, Any] | None) -> list[str]:
    ch, base = fit["chosen"], fit["per_layer"]
    md = ["## Time", ""]
    pred = ch.get("predicted_instructions")
    insns = min(run["invoke_insns"]) if run and run.get("invoke_insns") else None
    md.append(f"- instructions per Invoke: {insns:,} measured ({run['measured_by']})" if insns else
              "- instructions per Invoke: not measured (no --run, or no QEMU board runs the core)")
    if pred:
        md.append(f"- predicted (tfmcu.plan.latency): {pred:,}, {pred / base['predicted_instructions']:.3f}x TFLM + "
                  f"CMSIS-NN per layer's {base['predicted_instructions']:,} (what --max_latency is a factor of)")
        ours = fit.get("per_layer_tfmcu_instructions")
        if ours:
            md.append(f"- and {pred / ours:.3f}x TFLM + tfmcu kernels per layer's {ours:,} (predicted: every "
                      f"convolution a one-layer stage, as --rest_convs=tfmcu runs them)")
    prof = dep.get("profile")
    if not prof:
        md += ["", "Per op: `fit --run --profile`.", ""]
        return md
    clock = prof.get("clock_hz")
    ops = prof["ops"]
    cyc = sum(o.get("cycles") or 0 for o in ops)
    if prof.get("cycles_by"):
        md.append(f"- estimated cycles: {cyc:,}" + (f", {cyc / clock * 1e3:.1f} ms at {clock / 1e6:g} MHz" if clock
                                                    else "") + f" ({prof['cycles_by']})")
    md += ["", "Per op of one Invoke (profile.png):", "",
           "| op | type | MACs | instructions (measured) | est. cycles | ms | share |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    for o in ops:
        md.append(f"| {o['op']} | {o['type']} | {o['macs']:,} | {o['instructions']:,} | "
                  f"{'-' if o.get('cycles') is None else format(o['cycles'], ',')} | "
                  f"{'-' if o.get('ms') is None else format(o['ms'], '.2f')} | {100 * o['share']:.1f}% |")
    return md + [""]


def _verified(fit: dict[str, Any], dep: dict[str, Any], run: dict[str, Any] | None) -> list[str]:
    md = ["## Verified", ""]
    v = fit.get("verify")
    if v:
        md.append(f"- the chosen model against the original: {'bit-exact' if v['bit_exact'] else 'DIFFERENT'} on "
                  f"{v['samples']} random inputs, in TF Lite and in TFLM on this host (pipelines.verify)")
    m = fit.get("measured")
    if run and m:
        md.append(f"- on the target: {dep.get('verdict')}")
        md.append(f"- the arena TFLM counted {'equals' if m['arena_equal'] else 'differs from'} the prediction; "
                  f"instructions within {100 * abs(m['instructions_error'] or 0):.1f}% of the prediction")
    elif not run:
        md.append("- not run on the target (`--run` builds and runs it under QEMU)")
    return md + [""]


def _files(dep: dict[str, Any]) -> list[str]:
    if not dep.get("flash_with"):
        return []
    return (["## Files a board takes", "", "In `firmware/`: " + ", ".join(f"`{f}`" for f in dep["files"].values())
             + ". Onto the board, in that folder:", "", "```"] + dep["flash_with"] + ["```", ""])


def markdown(fit: dict[str, Any]) -> str:
    """report.md from fit.json's dict (``FitReport.to_json()``)."""
    dep = fit["deploy"]
    run = dep.get("run") if dep.get("run", {}).get("linked") else None
    ch = fit["chosen"]
    head = [f"# {fit['model']} on {fit['target']} ({fit['core']}, {fit['kernels']} kernels)", "",
            f"fit chose: **{ch['describe']}**" + ("" if ch["patched"] else " (the model as it is)") + ".",
            "", fit["message"], ""]
    return "\n".join(head + _memory(fit, dep, run) + _timeline(fit, dep) + _flash(dep, run) + _time(fit, dep, run)
                     + _verified(fit, dep, run) + _files(dep))
