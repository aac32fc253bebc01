"""Profile reports: the JSON contract of ``pipelines.profile``, a readable table and the memory plot."""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

from tfmcu import ir
from tfmcu.profiler import Profile, profile
from tfmcu.scheduler import AutoResult, PatchSchedule

KB = 1024


def profile_report(graph: ir.Graph, schedule: PatchSchedule | None = None, auto: AutoResult | None = None,
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
        d["auto"] = {"feasible": auto.feasible, "message": auto.message,
                     "chosen": auto.best.to_dict() if auto.best else None,
                     "smallest_peak": auto.smallest.to_dict(),
                     "candidates": [c.to_dict() for c in auto.candidates]}
    return d


def format_table(report: dict[str, Any]) -> str:
    """A readable per-layer and per-block table, then the totals and the patch summary."""
    out = io.StringIO()
    w = out.write
    w(f"model {report['model']} ({report['source']}), input {report['resolution']}x{report['resolution']}\n")
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
    title = f"{report['model']} @ {report['resolution']}: per-layer peak {report['peak_sram_per_layer_bytes'] / KB:.0f} kB"
    if has_patch:
        title += f", patched {report['patch']['peak_sram_bytes'] / KB:.0f} kB"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def atomic_write(path: str, write: Any, binary: bool = False) -> None:
    """Write through a temporary file in the same folder and rename: no partial output on failure."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_outputs(outputs: dict[str, Any]) -> None:
    """Write every finished output ({path: bytes | str | JSON-able}) only once all of them exist in memory."""
    blobs = {}
    for path, data in outputs.items():
        if not path:
            continue
        if isinstance(data, bytes):
            blobs[path] = data
        elif isinstance(data, str):
            blobs[path] = data.encode()
        else:
            blobs[path] = (json.dumps(data, indent=2) + "\n").encode()
    for path, blob in blobs.items():
        atomic_write(path, lambda f, b=blob: f.write(b), binary=True)
