"""``profile``: the analytic memory / MACs profile of a model, per layer and patch by patch (``pipelines.profile``).

``run(options)`` resolves the model (preset, spec JSON, .tflite or Keras file: ``tfmcu.graph.load``), plans the
requested schedule (a given grid, or ``auto``: ``tfmcu.plan.search`` over the analytic peak), prints a table and
writes the JSON report (``profile_report``) and the PNG plot (``plot_memory``), all-or-nothing.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.errors import UsageError
from tfmcu.files import check_output_paths, figure_png, write_outputs
from tfmcu.flows.common import ScheduleRequest
from tfmcu.graph import ir
from tfmcu.graph.load import load_model
from tfmcu.plan import regions
from tfmcu.plan.profiler import Profile, profile
from tfmcu.plan.regions import PatchSchedule
from tfmcu.plan.search import AnalyticCost, SearchResult, search

KB = 1024
ACCOUNTING_PHRASES = {  # tfmcu.plan.profiler's modes, for people
    "separate": "every tensor its own buffer",
    "paper": "depthwise in place, as MCUNetV2 / TinyEngine count",
    "tflm_inplace": "the in-place overlaps TFLM's reference kernels allow, outside the patch stage",
}


def profile_report(graph: ir.Graph, schedule: PatchSchedule | None = None, auto: SearchResult | None = None,
                   sram_bytes: int | None = None, prof: Profile | None = None) -> dict[str, Any]:
    prof = prof or profile(graph)
    d = prof.to_dict()
    d["source"] = graph.source
    if sram_bytes is not None:
        d["sram_budget_bytes"] = sram_bytes
    if schedule is not None:
        d["patch"] = schedule.to_dict()
        patched = schedule.block_peaks()
        patched_x = schedule.block_peaks(exclude_input=True)
        for b in d["blocks"]:
            b["peak_memory_bytes_patched"] = patched[b["index"]]
            b["peak_memory_bytes_patched_excluding_input"] = patched_x[b["index"]]
    if auto is not None:
        count_input = auto.options.count_input
        d["auto"] = {**auto.to_dict(),
                     "smallest_peak": min(auto.candidates, key=lambda c: (c.peak(count_input), c.macs)).to_dict(),
                     "candidates": [c.to_dict() for c in auto.candidates]}
    return d


def format_table(report: dict[str, Any]) -> str:
    """A readable per-layer and per-block table, then the totals and the patch summary."""
    out = io.StringIO()
    w = out.write
    w(f"model {report['model']} ({report['source']}), input {report['resolution']}x{report['resolution']}, "
      f"memory accounting: {report['accounting']} ({ACCOUNTING_PHRASES[report['accounting']]})\n")
    w(f"{'#':>3} {'layer':<24} {'op':<18} {'blk':>3} {'in shape':<16} {'out shape':<16} "
      f"{'mem kB':>8} {'MACs':>12}\n")
    for layer in report["layers"]:
        w(f"{layer['index']:>3} {layer['name'][:24]:<24} {layer['op'][:18]:<18} {layer['block']:>3} "
          f"{_shape(layer['in_shape']):<16} {_shape(layer['out_shape']):<16} "
          f"{layer['memory_bytes'] / KB:>8.1f} {layer['macs']:>12,}\n")
    patched = "patch" in report
    w(f"\n{'block':<10} {'peak kB':>9}" + (f" {'patched kB':>11}" if patched else "") + f" {'MACs':>13}\n")
    for b in report["blocks"]:
        w(f"{b['name'][:10]:<10} {b['peak_memory_bytes'] / KB:>9.1f}")
        if patched:
            w(f" {b['peak_memory_bytes_patched'] / KB:>11.1f}")
        w(f" {b['macs']:>13,}\n")
    w(f"\nMACs {report['macs'] / 1e6:.1f}M  params {report['params'] / 1e6:.3f}M  "
      f"Flash {report['flash_bytes'] / KB:.1f} kB\n")
    w(f"peak SRAM per layer: {report['peak_sram_per_layer_bytes'] / KB:.1f} kB with the input image, "
      f"{report['peak_sram_per_layer_bytes_excluding_input'] / KB:.1f} kB without "
      f"(at {report['peak_layer']}, block {report['peak_block']})\n")
    if patched:
        p = report["patch"]
        g = p["grid"]
        stage = f"{p['patch_blocks']} blocks" if p["patch_blocks"] is not None else f"{p['patch_ops']} ops"
        w(f"patched: {g[0]}x{g[1]} patches over the first {stage}, input patch "
          f"{p['input_patch_size'][0]}x{p['input_patch_size'][1]}\n")
        w(f"peak SRAM patched:   {p['peak_sram_bytes'] / KB:.1f} kB with the input image, "
          f"{p['peak_sram_bytes_excluding_input'] / KB:.1f} kB without "
          f"(stage {p['stage_peak_bytes'] / KB:.1f} / {p['stage_peak_bytes_excluding_input'] / KB:.1f} kB, "
          f"rest {p['rest_peak_bytes'] / KB:.1f} kB)\n")
        w(f"reduction: {report['peak_sram_per_layer_bytes'] / p['peak_sram_bytes']:.2f}x with input, "
          f"{report['peak_sram_per_layer_bytes_excluding_input'] / p['peak_sram_bytes_excluding_input']:.2f}x "
          f"without\n")
        w(f"MACs patched: {p['macs_patched_padded'] / 1e6:.1f}M padded (+{p['mac_overhead_padded'] * 100:.1f}%, "
          f"stage +{p['stage_mac_overhead_padded'] * 100:.1f}%), {p['macs_patched_exact'] / 1e6:.1f}M exact "
          f"(+{p['mac_overhead_exact'] * 100:.1f}%, stage +{p['stage_mac_overhead_exact'] * 100:.1f}%)\n")
    if "auto" in report:
        w(f"auto: {report['auto']['message']}\n")
    return out.getvalue()


def _shape(shape: list[int]) -> str:
    return "x".join(str(s) for s in shape[1:]) if len(shape) > 1 else "x".join(map(str, shape))


def plot_memory(report: dict[str, Any], sram_bytes: int | None = None) -> bytes:
    """PNG bytes: per-block peak memory, per layer vs per patch, with the SRAM budget line (the paper's Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = report["blocks"]
    x = list(range(len(blocks)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(blocks) + 2), 4.2))
    per_layer = [b["peak_memory_bytes"] / KB for b in blocks]
    has_patch = "patch" in report
    width = 0.4 if has_patch else 0.7
    ax.bar([i - (width / 2 if has_patch else 0) for i in x], per_layer, width, label="per-layer", color="#c44e52")
    if has_patch:
        p = report["patch"]
        patched = [b["peak_memory_bytes_patched"] / KB for b in blocks]
        g = p["grid"]
        ax.bar([i + width / 2 for i in x], patched, width, color="#4c72b0",
               label=f"per-patch ({g[0]}x{g[1]}, first {p['patch_blocks'] or p['patch_ops']} "
                     f"{'blocks' if p['patch_blocks'] else 'ops'})")
    budget = sram_bytes if sram_bytes is not None else report.get("sram_budget_bytes")
    if budget:
        ax.axhline(budget / KB, color="black", linestyle="--", linewidth=1.2, label=f"SRAM {budget / KB:.0f} kB")
    ax.set_xticks(x)
    ax.set_xticklabels([b["name"] for b in blocks], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("peak activation memory (kB, int8)")
    peak_kb = report['peak_sram_per_layer_bytes'] / KB
    title = f"{report['model']} @ {report['resolution']} ({report['accounting']}): per-layer peak {peak_kb:.0f} kB"
    if has_patch:
        title += f", patched {report['patch']['peak_sram_bytes'] / KB:.0f} kB"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return figure_png(fig)


# ============================================================================= the flow
@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    model: str | None  # preset name, spec JSON, .tflite or Keras file (None: a one-line error)
    resolution: int | None = None  # presets and spec JSON only
    width: float | None = None
    num_classes: int | None = None
    schedule: ScheduleRequest = field(default_factory=ScheduleRequest)
    json_out: str | None = None
    plot_out: str | None = None
    quiet: bool = False


def validate(o: ProfileOptions) -> None:
    if not o.model:
        raise UsageError("give the model: --model=a preset name, spec JSON, .tflite or Keras file")
    o.schedule.validate()
    check_output_paths({"--json_out": o.json_out, "--plot_out": o.plot_out})


def run(o: ProfileOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Profile ``o.model`` (see the module docstring); returns the JSON report."""
    validate(o)
    graph = load_model(o.model, o.resolution, o.width, o.num_classes).graph
    req = o.schedule
    sram = req.budget_bytes
    accounting = req.search.accounting
    schedule = auto = None
    if req.auto:
        auto = search(graph, AnalyticCost(req.search.count_input), sram, req.search)
        if not auto.feasible:
            raise UsageError(f"{o.model}: {auto.message}")
        schedule = next(iter(auto.chosen.candidate.schedules()), None)
    elif req.grid is not None and req.grid != (1, 1):
        schedule = regions.schedule(graph, req.grid, n_blocks=req.patch_blocks, n_ops=req.patch_ops,
                                    accounting=accounting)
    data = profile_report(graph, schedule, auto, sram, profile(graph, accounting))
    png = plot_memory(data, sram) if o.plot_out else None
    write_outputs({o.json_out: data, o.plot_out: png})
    if not o.quiet:
        log(format_table(data).rstrip())
    return data
