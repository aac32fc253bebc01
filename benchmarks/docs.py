"""Docs from data: every figure table of README.md and docs/*.md, and every figure prose quotes from a measured run,
is rendered from the JSON the run that measured it wrote (one source), so two pages cannot disagree about one run.

    python -m benchmarks.docs --check                 # every marker renders to what its page holds (exit 1 if not)
    python -m benchmarks.docs --write                 # render every marker whose result is published
    python -m benchmarks.docs --publish out/bench     # a bench run's section JSON into docs/results/
    python -m benchmarks.docs --publish out/demo/summary.json --name demo   # one run's JSON under a name

A page marks what is rendered:

* a table (or any block), between ``<!-- table: NAME -->`` and ``<!-- /table -->`` on lines of their own, rendered
  by ``TABLES[NAME]`` from its results (``NAME`` is a bench section, whose table is the section's own function in
  ``benchmarks.sections.SECTION_TABLES``, or ``result:variant``);
* a value in prose, ``<!-- value: RESULT:PATH|FORMAT -->473,424<!-- /value -->``: ``PATH`` walks the result's JSON
  (``rows[model=mbv2_100_224,grid=4x4].measured_bytes``: keys, ``[3]`` indexes, ``[key=value,...]`` the first
  element whose fields equal those, a list field written ``4x4``), or names a value ``DERIVED`` computes;
  ``FORMAT`` is a Python format spec (default: an integer with thousands separators, a boolean as yes / no).

Results are ``docs/results/<name>.json`` (``benchmarks.results``): copies of a run's JSON with the record of the run
(date, host, command), published by ``--publish``; the latency predictor's calibration is its own committed file.
A marker whose result is not published is reported as awaiting it (``--check`` lists it; ``tests/test_docs.py``
allows it only for the pages it names).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import re
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

from benchmarks import results
from benchmarks.fit import PER_LAYER
from benchmarks.sections import SECTION_TABLES, SECTIONS, equal_up_to_ties, inplace_line
from tfmcu.errors import UsageError
from tfmcu.firmware.outputs import board_file_names
from tfmcu.firmware.targets import TARGETS, board_entries
from tfmcu.flows.demo import summary_table
from tfmcu.flows.profile import format_table
from tfmcu.plan import latency

ROOT = results.ROOT
TABLE_RE = re.compile(r"^<!-- table: (\S+) -->\n(.*?)^<!-- /table -->$", re.M | re.S)
VALUE_RE = re.compile(r"<!-- value: (\S[^>]*?) -->(.*?)<!-- /value -->", re.S)
# The command that wrote a run's JSON when the JSON does not record it (``--publish`` of a file).
COMMANDS = {"demo": "make demo"}


class RenderError(Exception):
    """A marker that cannot be rendered: an unknown table, a path that names nothing, a bad format."""


class Awaiting(Exception):
    """A marker whose result is not published yet (``args[0]``: the result names)."""


@dataclass(frozen=True)
class Table:
    """A rendered block: ``render(*results)``, one argument per name in ``sources``."""
    sources: tuple[str, ...]
    render: Callable[..., str]


@dataclass(frozen=True)
class Problem:
    page: str
    marker: str
    line: int  # of the page, 1-based
    kind: str  # "differs", "awaiting", "error"
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.marker}: {self.kind}: {self.message}"


# ------------------------------------------------------------------------------------------------ renderers
def _pct(v: float, digits: int = 2) -> str:
    return f"{100 * v:.{digits}f}%"


def calibration_summary(data: dict[str, Any]) -> str:
    """The latency predictor against its calibration, per core and kernel set: each stored run predicted by the
    committed coefficients, and each zoo model predicted by coefficients fitted without it."""
    acc, held = latency.accuracy(data), latency.cross_validate(data)
    md = ["| core | kernels | runs | worst error | mean error | left-one-model-out: worst | median | within 5% |",
          "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key in sorted({(r["core"], r["kernels"]) for r in acc}):
        mine = [abs(r["error"]) for r in acc if (r["core"], r["kernels"]) == key]
        out = [abs(r["error"]) for r in held if (r["core"], r["kernels"]) == key]
        md.append(f"| {key[0]} | {key[1]} | {len(mine)} | {_pct(max(mine))} | {_pct(statistics.mean(mine))} | "
                  f"{_pct(max(out))} | {_pct(statistics.median(out))} | {sum(e <= 0.05 for e in out)} of "
                  f"{len(out)} |")
    return "\n".join(md) + "\n"


def calibration_runs(data: dict[str, Any]) -> str:
    """Every calibration run: the QEMU count of one Invoke and the committed predictor's error, per variant."""
    acc = {(r["variant"], r["core"], r["kernels"]): r for r in latency.accuracy(data)}
    columns = [("cortex-m4", "cmsis_nn", "M4 CMSIS-NN"), ("cortex-m7", "cmsis_nn", "M7 CMSIS-NN"),
               ("cortex-m4", "reference", "M4 reference"), ("cortex-m7", "reference", "M7 reference")]
    md = ["| model (variant) | " + " | ".join(f"{c[2]}: measured (error)" for c in columns) + " |",
          "|---|" + "---:|" * len(columns)]
    for variant in sorted({v for v, _, _ in acc}):
        cells = []
        for core, kernels, _ in columns:
            r = acc.get((variant, core, kernels))
            cells.append("-" if r is None else f"{r['measured']:,} ({100 * r['error']:+.2f}%)")
        md.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def targets_list() -> str:
    """The firmware targets, from ``tfmcu.firmware.targets`` (the code is their one source)."""
    return "".join(f"- `--target={t.name}`: {t.what}\n" for t in TARGETS.values())


def targets_table() -> str:
    """The firmware targets as a table: ``--target``, QEMU board, memory, linker script."""
    md = ["| `--target` | core | QEMU board | SRAM / Flash for the firmware | linker script |", "|---|---|---|---|---|"]
    for t in TARGETS.values():
        ld = f"`board.ld` (from `{t.ld}`)" if t.own_ld else f"`{t.ld}`"
        md.append(f"| `{t.name}` | {t.core} | `{t.machine}`{' (stand-in link)' if t.qemu == 'stand-in' else ''} | "
                  f"{t.sram_bytes // 1024} KiB / {t.flash_bytes // 1024:,} KiB | {ld} |")
    return "\n".join(md) + "\n"


def boards_table() -> str:
    """Every board of ``tfmcu/firmware/boards.json`` with its core, Flash, SRAM regions, QEMU board and console."""
    md = ["| `--target` | core | Flash | SRAM regions (in bold the firmware's: the stack, .data, .bss and TFLM's arena; "
          "_persistent_: TFLM's persistent data when it fits there; _fast_: the firmware's RAM when it fits there, "
          "the persistent data then in the bold one) | QEMU board that runs it | console UART "
          "(`--console=uart`) |", "|---|---|---|---|---|---|"]
    for name, b in board_entries().items():
        t = TARGETS.get(name)
        regions = "; ".join((f"**{r['name']} {r['size_kib']} KiB at {r['base']}**" if r["name"] == b["firmware_ram"]
                             else f"{r['name']} {r['size_kib']} KiB at {r['base']}"
                             + (": _fast_" if r["name"] == b.get("fast_ram") else "")
                             + (", _persistent_" if r["name"] == b.get("persistent_ram") == b.get("fast_ram") else
                                ": _persistent_" if r["name"] == b.get("persistent_ram") else ""))
                            for r in b["sram"])
        qemu = ("-" if t is None else "none: built and linked, not run (no QEMU board has its core)" if not t.machine
                else f"`{t.machine}`" + (" (stand-in link)" if t.qemu == "stand-in" else ""))
        console = "-" if t is None else (t.console or "none yet")
        core = b["core"] + ("" if t is not None else " (not built for yet)")
        md.append(f"| `{name}` | {core} | {b['flash']['size_kib']:,} KiB at {b['flash']['base']} | {regions} | "
                  f"{qemu} | {console} |")
    return "\n".join(md) + "\n"


def flash_table() -> str:
    """Every board's flash commands (boards.json ``flash_with``), as ``deploy`` prints them with its files."""
    md = ["| `--target` | commands (run in the deploy folder) |", "|---|---|"]
    for name, b in board_entries().items():
        cmds = [c.format(**board_file_names()) for c in b.get("flash_with") or []]
        md.append(f"| `{name}` | " + "<br>".join(f"`{c}`" for c in cmds) + " |")
    return "\n".join(md) + "\n"


ACCOUNTINGS = ("separate", "paper", "tflm_inplace")


def accounting_table(*reports: dict[str, Any]) -> str:
    """``profile``'s analytic peaks of one model and schedule under each memory accounting (one report each)."""
    md = ["| accounting | per layer | patched, with the input image | patched, without | reduction without |",
          "|---|---:|---:|---:|---:|"]
    for r in reports:
        p = r["patch"]
        md.append(f"| {r['accounting']} | {r['peak_sram_per_layer_bytes'] / 1024:.1f} kB | "
                  f"{p['peak_sram_bytes'] / 1024:.1f} kB | {p['peak_sram_bytes_excluding_input'] / 1024:.1f} kB | "
                  f"{r['peak_sram_per_layer_bytes_excluding_input'] / p['peak_sram_bytes_excluding_input']:.2f}x |")
    return "\n".join(md) + "\n"


def profile_excerpt(report: dict[str, Any]) -> str:
    """The totals and the patch summary ``profile`` prints for a report (the end of its table), as a code block."""
    text = format_table(report)
    return "```\n" + text[text.index("\nMACs ") + 1:].rstrip("\n") + "\n```\n"


def inplace_lines(custom: dict[str, Any]) -> str:
    """The in-place plans' lines of section *custom* (pairs, planned head, lower bound), as a code block."""
    return "```\n" + "\n".join(inplace_line(r["inplace"]) for r in custom["rows"] if "inplace" in r) + "\n```\n"


def _worst_error(data: dict[str, Any]) -> float:
    return max(abs(r["error"]) for r in latency.accuracy(data))


def runs_table(*found: dict[str, Any] | None) -> str:
    """The bench sections and the run each published result comes from (date, host, command)."""
    md = ["| section | run (date, host) | command |", "|---|---|---|"]
    for name, res in zip(SECTIONS, found):
        if res is None:
            md.append(f"| [{name}](#{name}) | not published | `python -m pipelines.bench --sections={name}` |")
            continue
        run = res.get("run") or {}
        md.append(f"| [{name}](#{name}) | {run.get('date', '?')}, {run.get('host', '?')} | "
                  f"`{run.get('command', '?')}` |")
    return "\n".join(md) + "\n"


def _one(rows: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r.get(k) == v for k, v in fields.items())]
    if not found:
        raise RenderError(f"no row with {fields}")
    return found[0]


def _core(target: str) -> str:
    return target.replace("_", "-")


STORY_MODEL = "mbv2_035_144"


def story_table(fit: dict[str, Any], halo_firmware: dict[str, Any], multistage: dict[str, Any]) -> str:
    """README's MobileNetV2-0.35-144 story on one baseline: the Cortex-M4 with CMSIS-NN, against TFLM + CMSIS-NN per
    layer (``fit``'s row), each row adding one thing: a patch stage (``halo_firmware``), halo caches, a streamed input
    and the rest in place (``multistage``: fit's plan of one stage within 1.1x the instructions), several stages
    (``multistage``: fit's plan of any number of stages within 1.1x), then what ``fit`` chooses by default at 1.05x
    (``fit``). Every arena is TFLM's
    ``arena_used_bytes`` under QEMU."""
    base = _one(fit["rows"], model=STORY_MODEL, what="TFLM + CMSIS-NN per layer")
    base_arena = base.get("arena_used_bytes") or base["predicted_arena_bytes"]
    base_insns = base["instructions"]
    stage = next((r for r in halo_firmware["rows"] if r["model"] == STORY_MODEL and r["variant"] == "cmsis_p"
                  and _core(r["target"]) == "cortex-m4"), None)
    if stage is None:
        raise RenderError("halo_firmware: no patched recompute row of mbv2_035_144 on the Cortex-M4")
    measured = (multistage.get("measured") or {}).get(STORY_MODEL, {}).get("measured", [])
    one = next((m for m in measured if m["what"].startswith("1 stage within")), None)
    multi = next((m for m in measured if m["what"].startswith("smallest within")), None)
    if one is None or multi is None:
        raise RenderError("multistage: no measured '1 stage within' and 'smallest within' plans of mbv2_035_144")
    chosen = _one(fit["rows"], model=STORY_MODEL, what="fit, max_latency 1.05")

    def row(step: str, r: dict[str, Any], arena: int | None, macs: float, insns: int | None,
            equal: bool | None) -> str:
        shown = arena if arena else r["predicted_arena_bytes"]
        note = "" if arena else " (predicted: it does not link on the target)"
        return (f"| {step} | {shown:,}{note} | {base_arena / shown:.2f}x | {100 * macs:+.1f}% | "
                + ("-" if not insns else f"{insns / base_insns:.3f}x") + " | "
                + ("-" if equal is None else "yes" if equal else "NO") + " |")

    ran = bool(base.get("arena_used_bytes"))
    md = ["| step | TFLM arena (B) | smaller than per layer | MACs | instructions vs per layer | outputs = TF Lite |",
          "|---|---:|---:|---:|---:|---|",
          row("TFLM + CMSIS-NN per layer: the baseline", base, base.get("arena_used_bytes"), 0.0, base_insns,
              base["outputs_equal_tflite"] if ran else None),
          row(f"+ one patch stage, halos recomputed (MCUNetV2), image in the arena: {stage['what']}",
              {"predicted_arena_bytes": stage["arena_predicted"]}, stage["arena_used_bytes"],
              (stage["macs_executed"] / stage["macs"] - 1) if stage.get("macs") and stage.get("macs_executed")
              else 0.0, stage["invoke_insns"], stage["equal_tflite"]),
          row("+ halo caches, the image streamed, the rest in place with its multipliers in Flash: fit's plan of "
              "one stage within 1.1x the instructions", one, one["arena_used_bytes"], one["plan"]["mac_overhead"],
              one["instructions"], one["outputs_equal_tflite"]),
          row(f"+ several patch stages: fit's plan of any number within 1.1x the instructions, "
              f"{multi['plan']['stages']} stages", multi, multi["arena_used_bytes"], multi["plan"]["mac_overhead"],
              multi["instructions"], multi["outputs_equal_tflite"]),
          row(f"what `fit --objective=memory --max_latency=1.05 --stream_input` chooses by default: "
              f"{chosen['schedule']}", chosen, chosen["arena_used_bytes"], chosen["macs"] / base["macs"] - 1,
              chosen["instructions"], chosen["outputs_equal_tflite"])]
    return "\n".join(md) + "\n"


def headline_table(custom: dict[str, Any] | None, fit: dict[str, Any] | None, detection: dict[str, Any] | None,
                   search: dict[str, Any] | None, train: dict[str, Any] | None, demo: dict[str, Any] | None,
                   recipe: dict[str, Any] | None, foreign: dict[str, Any] | None = None) -> str:
    """README's other headline results, one row per result file; a result not published yet is a row saying which
    run it awaits (never an old figure)."""

    def awaiting(what: str, section: str, link: str) -> str:
        label = link.split("#")[1] if "benchmarks.md#" in link else link.split("#")[0].rsplit("/", 1)[-1][:-3]
        return f"| {what} | awaiting its run (`{section}`) | [{label}]({link}) |"

    md = ["| what | result | full table |", "|---|---|---|"]
    what = "MobileNetV2-1.0-224, custom mode, 4x4 patches over 5 blocks, rest in place; TFLM built from source on the host"
    if custom is None:
        md.append(awaiting(what, "make bench: custom", "docs/benchmarks.md#custom"))
    else:
        c = _one(custom["rows"], model="mbv2_100_224", grid=[4, 4], patch_blocks=5, rest_memory_plan="inplace")
        md.append(f"| MobileNetV2-1.0-224, custom mode, {c['grid'][0]}x{c['grid'][1]} patches over "
                  f"{c['patch_blocks']} blocks, rest in place; TFLM built from source on the host | "
                  f"{c['tflm_original_bytes']:,} -> {c['measured_bytes']:,} B ({c['ratio']:.2f}x), bit-exact: "
                  f"{'yes' if c['bit_exact'] else 'NO'} | [custom](docs/benchmarks.md#custom) |")
    what = "MobileNetV2-1.0-224 on the Cortex-M7, `fit --objective=memory --max_latency=1.05 --stream_input --run`"
    if fit is None:
        md.append(awaiting(what, "make bench: fit", "docs/benchmarks.md#fit"))
    else:
        f_base = _one(fit["rows"], model="mbv2_100_224", what="TFLM + CMSIS-NN per layer")
        f = _one(fit["rows"], model="mbv2_100_224", what="fit, max_latency 1.05")
        md.append(f"| {what} | {f['schedule']}: {f['arena_used_bytes']:,} B ({f['arena_ratio']:.2f}x below "
                  f"{f_base['predicted_arena_bytes']:,} B per layer) at {f['instructions_ratio']:.3f}x the "
                  f"instructions of TFLM + CMSIS-NN per layer | [fit](docs/benchmarks.md#fit) |")
    what = "detection on synthetic scenes, Cortex-M4: best per-layer input against `fit`, int8 mAP@0.5 in TFLM"
    link = "docs/detection.md#experiments-does-patching-buy-the-resolution-detection-needs"
    if detection is None:
        md.append(awaiting(what, "make bench: detection", link))
    else:
        det = []
        for cl in detection["rows"]["claims"]:
            flat, patched = cl.get("per_layer"), cl.get("patched")
            if flat and patched:
                det.append(f"{cl['sram_bytes'] // 1024} kB: {flat['resolution']} px {100 * flat['map50']:.1f}% vs "
                           f"{patched['resolution']} px {100 * patched['map50']:.1f}% "
                           f"({cl['gain_points']:+.1f} points)")
        md.append(f"| {what} | {'; '.join(det)} | [detection]({link}) |")
    what = "detector recipe, `train --task=detection` on 2 cores, int8 mAP@0.5 in TFLM"
    link = "docs/detection.md#how-fast-the-recipe-learns"
    if recipe is None:
        md.append(awaiting(what, "make bench: detection_recipe", link))
    else:
        rows = recipe["rows"]
        d = _one(rows["runs"], run="defaults")
        parts = [f"{rows['setup']['dataset']} @ {rows['setup']['resolution']} px, defaults: "
                 f"{100 * d['map50_int8_tflm']:.1f}% after {d['training_seconds'] / 60:.1f} min of training"]
        h = rows.get("hour")
        if h:
            best = max(h["runs"], key=lambda r: r["map50_int8_tflm"])
            how = "" if best["run"] == "defaults" else f", {best['run']}"
            parts.append(f"scenes-det @ {h['resolution']} px: {100 * best['map50_int8_tflm']:.1f}% after "
                         f"{best['with_classifier_seconds'] / 60:.1f} min (a classifier's backbone, then the "
                         f"detector{how})")
        md.append(f"| {what} | {'; '.join(parts)} | [detection]({link}) |")
    what = "joint architecture + schedule search at 128 kB, test accuracy in TFLM"
    if search is None:
        md.append(awaiting(what, "make bench: search", "docs/benchmarks.md#search"))
    else:
        s = {r["search"]: r for r in search["rows"] if r["budget_kb"] == 128}
        md.append(f"| {what} | {100 * s['joint']['test_accuracy']:.1f}% ({s['joint']['resolution']} px, patched) "
                  f"against {100 * s['per_layer']['test_accuracy']:.1f}% ({s['per_layer']['resolution']} px, "
                  f"per-layer-only search) | [search](docs/benchmarks.md#search) |")
    if train is None:
        md.append(awaiting("training recipe", "make bench: train", "docs/benchmarks.md#train"))
    else:
        t = train["rows"][0]
        md.append(f"| training recipe, {t['model']} @ {t['resolution']} on {t['dataset']} | int8 "
                  f"{100 * t['int8_tflm']:.2f}% against float {100 * t['float']:.2f}%; TF Lite = TFLM: "
                  f"{equal_up_to_ties(t)} | [train](docs/benchmarks.md#train) |")
    what = ("models users bring (tf_keras.applications with their preprocessing) on the Cortex-M7, `fit "
            "--objective=memory --max_latency=1.10 --stream_input --run`")
    if foreign is None:
        md.append(awaiting(what, "make bench: foreign", "docs/foreign.md#results"))
    else:
        cells = []
        for m in ("mbv3_small_100_224", "efficientnet_b0_160"):
            base = next((r for r in foreign["rows"] if r["model"] == m and r["target"] == "cortex-m7"
                         and r["what"] == PER_LAYER and "error" not in r), None)
            f = next((r for r in foreign["rows"] if r["model"] == m and r["target"] == "cortex-m7"
                      and r["what"] == "fit, max_latency 1.10"), None)
            title = next((x["title"] for x in foreign.get("models", []) if x["model"] == m), m)
            if base is None or f is None:
                continue
            if "error" in f or not f.get("arena_used_bytes"):
                cells.append(f"{title}: does not fit")
                continue
            per_layer = base.get("arena_used_bytes") or base["predicted_arena_bytes"]
            cells.append(f"{title}: {f['arena_used_bytes']:,} B ({f['arena_ratio']:.2f}x below {per_layer:,} B per "
                         f"layer) at {f['instructions_ratio']:.3f}x the instructions, outputs = TF Lite: "
                         f"{'yes' if f['outputs_equal_tflite'] else 'NO'}")
        md.append(f"| {what} | {'; '.join(cells) or '-'} | [foreign](docs/foreign.md#results) |")
    if demo is None:
        md.append(awaiting("`make demo`", "make demo", "docs/getting-started.md#what-make-demo-does"))
    else:
        mcu = demo.get("mcu") or {}
        patched = mcu.get("patched") or {}
        run = patched.get("run") or {}
        md.append(f"| `make demo`: {demo['model']} @ {demo['resolution']} on the {mcu.get('target', '-')} | "
                  + (f"{mcu.get('schedule')}: {run.get('arena_used_bytes') or 0:,} B measured, top-1 = TF Lite on "
                     f"{mcu.get('images')} images: {'yes' if run.get('outputs_equal_tflite') else 'NO'}" if mcu
                     else "-")
                  + " | [demo](docs/getting-started.md#what-make-demo-does) |")
    return "\n".join(md) + "\n"


TABLES: dict[str, Table] = {
    **{name: Table((name,), render) for name, render in SECTION_TABLES.items()},
    "demo": Table(("demo",), summary_table),
    "custom:inplace": Table(("custom",), inplace_lines),
    "latency_calibration:accuracy": Table(("latency_calibration",), calibration_summary),
    "latency_calibration:runs": Table(("latency_calibration",), calibration_runs),
    "accounting": Table(tuple(f"profile_mbv2_224_{a}" for a in ACCOUNTINGS), accounting_table),
    "profile_mbv2_224_separate:excerpt": Table(("profile_mbv2_224_separate",), profile_excerpt),
    "story": Table(("fit", "halo_firmware", "multistage"), story_table),
}
# Tables that render whatever is published (a missing result is a row saying so, not an awaited result), and
# tables whose one source is the code itself (no result).
OPTIONAL = {"runs": Table(tuple(SECTIONS), runs_table), "targets": Table((), targets_list),
            "headline": Table(("custom", "fit", "detection", "search", "train", "demo", "detection_recipe", "foreign"),
                              headline_table),
            "targets:table": Table((), targets_table), "boards": Table((), boards_table),
            "flash": Table((), flash_table)}
# Values a page quotes that no single JSON entry holds.
DERIVED: dict[str, dict[str, Callable[[dict[str, Any]], Any]]] = {
    "latency_calibration": {"worst_error": _worst_error},
    "train": {"wall_hours": lambda d: d["rows"][0]["wall_s"] / 3600},
    "make_test": {"wall_minutes": lambda d: d["wall_s"] / 60},
    "multistage": {"search_minutes": lambda d: sum(m["search_seconds"] for r in d["measured"].values()
                                                   for m in r["measured"]) / 60},
}


# ------------------------------------------------------------------------------------------------ values
_SEGMENT = re.compile(r"([\w-]+)?((?:\[[^\]]*\])*)")


def _matches(value: Any, want: str) -> bool:
    if isinstance(value, list):
        return "x".join(str(v) for v in value) == want
    if isinstance(value, bool):
        return want == ("true" if value else "false")
    return str(value) == want


def _segments(path: str) -> list[str]:
    """``path`` split at the dots outside brackets (a selector may hold dots: ``[what=smallest within 1.1x]``)."""
    return [s for s in re.findall(r"(?:[^.\[]|\[[^\]]*\])+", path)]


def resolve(data: Any, path: str) -> Any:
    """The entry ``path`` names in ``data`` (see the module docstring)."""
    node = data
    for segment in _segments(path):
        m = _SEGMENT.fullmatch(segment)
        if not m:
            raise RenderError(f"bad path segment {segment!r}")
        key, selectors = m.group(1), re.findall(r"\[([^\]]*)\]", m.group(2))
        if key is not None:
            if not isinstance(node, dict) or key not in node:
                raise RenderError(f"{path}: no key {key!r}")
            node = node[key]
        for sel in selectors:
            if not isinstance(node, list):
                raise RenderError(f"{path}: [{sel}] on a {type(node).__name__}")
            if re.fullmatch(r"-?\d+", sel):
                if not -len(node) <= int(sel) < len(node):
                    raise RenderError(f"{path}: index {sel} of {len(node)}")
                node = node[int(sel)]
                continue
            # key=value pairs; a value may hold commas and spaces ("what=fit, max_latency 1.05")
            want = dict(part.strip().split("=", 1) for part in re.split(r",(?=\s*[\w-]+=)", sel) if "=" in part)
            found = [e for e in node if isinstance(e, dict) and all(k in e and _matches(e[k], v)
                                                                     for k, v in want.items())]
            if not found:
                raise RenderError(f"{path}: no element with {sel}")
            node = found[0]
    return node


def render_value(spec: str, root: str = ROOT) -> str:
    """A value marker's text: ``RESULT:PATH|FORMAT``."""
    where, _, fmt = spec.partition("|")
    name, sep, path = where.partition(":")
    if not sep or not path:
        raise RenderError(f"{spec!r}: expected RESULT:PATH")
    data = results.load(name, root)
    if data is None:
        raise Awaiting((name,))
    derived = DERIVED.get(name, {})
    value = derived[path](data) if path in derived else resolve(data, path)
    if fmt:
        try:
            return format(value, fmt)
        except (TypeError, ValueError) as e:
            raise RenderError(f"{spec!r}: {value!r} with format {fmt!r}: {e}") from None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, str):
        return value
    raise RenderError(f"{spec!r}: {value!r} needs a format (|.2f, |.1%, ...)")


def render_table(name: str, root: str = ROOT) -> str:
    if name in OPTIONAL:
        t = OPTIONAL[name]
        return t.render(*[results.load(s, root) for s in t.sources])
    if name not in TABLES:
        raise RenderError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES) + sorted(OPTIONAL))}")
    t = TABLES[name]
    found = [results.load(s, root) for s in t.sources]
    missing = tuple(s for s, d in zip(t.sources, found) if d is None)
    if missing:
        raise Awaiting(missing)
    try:
        return t.render(*found)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise RenderError(f"{name}: the result does not have what the table needs ({type(e).__name__}: {e})") \
            from None


# ------------------------------------------------------------------------------------------------ pages
def pages(root: str = ROOT) -> list[str]:
    """README.md and docs/*.md, relative to ``root``."""
    return ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _first_difference(want: str, have: str) -> tuple[int, str]:
    """(0-based line, message) of the first line where ``have`` differs from ``want``."""
    w, h = want.split("\n"), have.split("\n")
    for i in range(max(len(w), len(h))):
        a = w[i] if i < len(w) else "<end>"
        b = h[i] if i < len(h) else "<end>"
        if a != b:
            return i, f"page has {b[:160]!r}, the result renders {a[:160]!r}"
    return 0, "differs"


def markers(text: str) -> list[tuple[str, str, int, int, int]]:
    """(kind, spec, start, end, line) of every marker's content span in ``text``."""
    found = [("table", m.group(1), m.start(2), m.end(2), _line(text, m.start())) for m in TABLE_RE.finditer(text)]
    found += [("value", m.group(1), m.start(2), m.end(2), _line(text, m.start())) for m in VALUE_RE.finditer(text)]
    return sorted(found, key=lambda f: f[2])


def _render(kind: str, spec: str, root: str) -> str:
    if kind == "table":
        return render_table(spec, root).strip("\n") + "\n"
    return render_value(spec, root)


def check_page(page: str, text: str, root: str = ROOT) -> list[Problem]:
    """Every marker of ``text`` (page ``page``) against its rendering."""
    problems = []
    for kind, spec, start, end, line in markers(text):
        label = f"{kind}: {spec}"
        try:
            want = _render(kind, spec, root)
        except Awaiting as e:
            problems.append(Problem(page, label, line, "awaiting", "result not published: " + ", ".join(
                os.path.relpath(results.path_of(n, root), root) for n in e.args[0])))
            continue
        except RenderError as e:
            problems.append(Problem(page, label, line, "error", str(e)))
            continue
        have = text[start:end]
        if kind == "table":
            have = have.strip("\n") + "\n"
        if have != want:
            offset, message = _first_difference(want, have)
            problems.append(Problem(page, label, line + (offset + 1 if kind == "table" else 0), "differs", message))
    return problems


def check(root: str = ROOT, page_files: list[str] | None = None) -> list[Problem]:
    """Every marker of every page (``page_files``: paths relative to ``root``, default README and docs/)."""
    out = []
    for page in page_files or pages(root):
        with open(os.path.join(root, page)) as f:
            out += check_page(page, f.read(), root)
    return out


def render_page(text: str, root: str = ROOT) -> str:
    """``text`` with every marker whose result is published rendered again."""
    parts, pos = [], 0
    for kind, spec, start, end, _ in markers(text):
        try:
            new = _render(kind, spec, root)
        except Awaiting:
            continue
        parts += [text[pos:start], new]
        pos = end
    return "".join(parts) + text[pos:]


def write(root: str = ROOT) -> list[str]:
    """Render every page's markers from the published results; the pages that changed."""
    changed = []
    for page in pages(root):
        path = os.path.join(root, page)
        with open(path) as f:
            text = f.read()
        new = render_page(text, root)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            changed.append(page)
    return changed


def used_results(root: str = ROOT) -> dict[str, list[str]]:
    """result name -> the pages whose markers use it."""
    used: dict[str, list[str]] = {}
    for page in pages(root):
        with open(os.path.join(root, page)) as f:
            for kind, spec, *_ in markers(f.read()):
                names = ((TABLES[spec].sources if spec in TABLES else OPTIONAL[spec].sources if spec in OPTIONAL
                          else ()) if kind == "table" else (spec.partition(":")[0],))
                for n in names:
                    used.setdefault(n, [])
                    if page not in used[n]:
                        used[n].append(page)
    return used


# ------------------------------------------------------------------------------------------------ publish
def _relative_paths(data: Any, where: str) -> Any:
    """``data`` with every absolute path string below the checkout (or below ``where``, the run's output folder)
    made relative to it: a published result names no machine's folders."""
    if isinstance(data, dict):
        return {k: _relative_paths(v, where) for k, v in data.items()}
    if isinstance(data, list):
        return [_relative_paths(v, where) for v in data]
    if isinstance(data, str) and os.path.isabs(data):
        for base in (ROOT, where):
            if data == base or data.startswith(base + os.sep):
                return os.path.relpath(data, base)
    return data


def _machine_path(data: Any) -> str | None:
    """The first string of ``data`` that still names a folder of this machine outside the checkout (the folder the
    checkout stands in, or /tmp), else None."""
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, list):
        return next((m for m in (_machine_path(v) for v in data) if m is not None), None)
    if isinstance(data, str):
        outside = (os.path.dirname(ROOT) + os.sep, "/tmp/")
        return data if any(o in data for o in outside) else None
    return None


def publish(path: str, name: str | None = None, command: str | None = None, root: str = ROOT) -> list[str]:
    """Copies a run's JSON into ``docs/results/`` (and the plot it names, ``"plot"``, into ``docs/``): a folder's
    bench sections (``<section>.json``), or one file as ``name`` (default: its stem). A JSON without the record of its run gets one: the file's date, this host, and
    ``command`` (default ``COMMANDS[name]``). Returns the result names written."""
    if os.path.isdir(path):
        if name is not None:
            raise UsageError("--name names one file's result, not a folder's")
        files = [(s, os.path.join(path, f"{s}.json")) for s in SECTIONS if os.path.isfile(os.path.join(path, f"{s}.json"))]
        if not files:
            raise UsageError(f"{path}: no bench section's JSON ({', '.join(SECTIONS)})")
    elif os.path.isfile(path):
        files = [(name or os.path.splitext(os.path.basename(path))[0], path)]
    else:
        raise UsageError(f"{path}: no such file or folder")
    ready = []  # every result checked before any is written: a refused one leaves nothing half published
    for result, src in files:
        with open(src) as f:
            data = json.load(f)
        if not (isinstance(data, dict) and "run" in data):
            cmd = command or COMMANDS.get(result)
            if cmd is None:
                raise UsageError(f"{src}: the JSON does not record its run; say what wrote it with --command")
            date = datetime.date.fromtimestamp(os.path.getmtime(src))
            data = results.with_run(data, {**results.run_record([], date), "command": cmd})
        data = _relative_paths(data, os.path.dirname(os.path.abspath(src)))
        if isinstance(data["run"].get("command"), str):  # a machine's folders are not part of what ran
            data["run"]["command"] = re.sub(r" --(zoo_cache|out_dir)=\S+", "", data["run"]["command"])
        machine = _machine_path(data)
        if machine is not None:
            raise UsageError(f"{src}: names a folder of this machine ({machine[:120]}): a published result names "
                             f"files inside the run's folder or the checkout only")
        ready.append((result, src, data))
    written = []
    for result, src, data in ready:
        out = results.path_of(result, root)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        plot = data.get("plot") if isinstance(data.get("plot"), str) else None
        if plot and os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(src)), plot)):
            shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(src)), plot), os.path.join(root, "docs", plot))
        written.append(result)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.docs", description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="every marker against its rendering (exit 1 if one "
                                                           "differs or cannot be rendered)")
    mode.add_argument("--write", action="store_true", help="render every marker whose result is published")
    mode.add_argument("--publish", metavar="PATH", help="a bench output folder, or one run's JSON file")
    ap.add_argument("--name", help="--publish of a file: the result's name (default: the file's stem)")
    ap.add_argument("--command", help="--publish: the command that wrote a JSON that does not record it")
    a = ap.parse_args(argv)
    if a.publish:
        try:
            names = publish(a.publish, a.name, a.command)
        except UsageError as e:
            print(f"{ap.prog}: error: {e}", file=sys.stderr)
            return 2
        for n in names:
            print(f"published {os.path.relpath(results.path_of(n))}")
        return 0
    if a.write:
        for page in write():
            print(f"rendered {page}")
    problems = check()
    for p in problems:
        print(p, file=sys.stderr if p.kind != "awaiting" else sys.stdout)
    bad = [p for p in problems if p.kind != "awaiting"]
    if bad:
        print(f"docs: {len(bad)} marker(s) differ from their results or cannot be rendered; "
              "`python -m benchmarks.docs --write` renders them", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
