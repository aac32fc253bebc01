"""``rewrite``: any int8 .tflite with its patch stage rewritten, bit-exact (``pipelines.rewrite``).

Modes: ``builtin`` unrolls the stage into per-patch TFLite builtin ops (``tfmcu.stage.builtin``) that stock TFLM and
TF Lite run; ``custom`` replaces it by one ``TFMCU_PATCH_STAGE`` op run by tfmcu's C kernels
(``tfmcu.stage.custom``). The schedule is given (``--patches=P|PxQ`` with ``--patch_blocks`` / ``--patch_ops``) or
searched (``--patches=auto``: ``tfmcu.plan.search`` with the mode's cost function: the predicted TFLM arena of the
rewrite — custom mode with our TFMCU_PATCH_STAGE kernel's op data and scratch; least MACs under ``--sram_kb``, or
the smallest).

Everything the options say is checked before any work (``validate``), for both modes. With ``measure`` the arenas
are then measured in TFLM (builtin mode: the tflite-micro wheel; custom mode: the whole model in TFLM built from
source with our kernel, ``tfmcu.runtime.tflm_host``): in auto mode a rewrite whose measured arena is not smaller
than the original's falls back to the unpatched model, and an output whose measured arena exceeds ``--sram_kb`` is
an error. The wheel's interpreter runs in a child process (``isolate=True``; the host build is one already), the
original first: a model that makes TFLM abort is a one-line ``TFLMError`` before any search, never a crash. The
model and the JSON report (``RewriteReport``, which ``run`` returns) are written all-or-nothing. ``RewriteOptions`` holds the options (custom mode's in
``tfmcu.stage.cost.CustomOptions``, the halo caches' in ``tfmcu.plan.halo.HaloOptions``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tfmcu.errors import TfmcuError, UsageError
from tfmcu.files import check_output_paths, read_bytes, write_outputs
from tfmcu.flows.common import ArenaFigures, ScheduleRequest
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.plan.regions import ScheduleError
from tfmcu.plan.search import WIDE_GRIDS, Evaluation, Progress, candidate_for, candidates, search
from tfmcu.records import Pair, Record, optional
from tfmcu.runtime.model_io import random_inputs
from tfmcu.runtime.tflm import measure_arena
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.builtin import BORDERS, BuiltinArenaCost
from tfmcu.stage.cost import CustomArenaCost, CustomOptions
from tfmcu.stage.custom import PATCH_STAGE_OP, memory_report
from tfmcu.tflite.editor import fold_static_reshapes
from tfmcu.tflite.schema import has_identifier

MODES = ("builtin", "custom")
BORDER_CHOICES = ("auto",) + BORDERS
# What custom mode's auto search covers unless the caller says otherwise (``pipelines.rewrite``: unless --grids /
# --max_stages are given): fit's default search, wide grids and any number of stages, a worker per core.
CUSTOM_AUTO_SEARCH = {"patch_options": WIDE_GRIDS, "max_stages": None, "workers": 0}


@dataclass(frozen=True, kw_only=True)
class RewriteOptions:
    """What ``rewrite`` is asked (``pipelines.rewrite``'s flags take their defaults from here); built by keyword."""

    tflite: str
    out: str
    mode: str = "builtin"
    schedule: ScheduleRequest = field(default_factory=ScheduleRequest)
    border: str = "auto"  # builtin mode: "auto" (auto mode tries both; a given grid uses strips), "strips", "pad"
    measure: bool = True
    json_out: str | None = None
    custom: CustomOptions = field(default_factory=CustomOptions)  # custom mode: in place, halo, streamed input, ...


def validate(o: RewriteOptions) -> bytes:
    """Every check the options allow before any work, the same for every mode; returns the input model's bytes."""
    if o.mode not in MODES:
        raise UsageError(f"--mode={o.mode}: expected one of {', '.join(MODES)}")
    if o.border not in BORDER_CHOICES:
        raise UsageError(f"--border={o.border}: expected one of {', '.join(BORDER_CHOICES)}")
    data = read_bytes(o.tflite, "--tflite")
    if not has_identifier(data):
        raise UsageError(f"--tflite={o.tflite}: not a TFLite flatbuffer (no 'TFL3' file identifier)")
    c = o.custom
    try:
        c.validate()
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    if c.inplace and o.mode != "custom":
        raise UsageError("--inplace is supported with --mode=custom only")
    if o.border != "auto" and o.mode != "builtin":
        raise UsageError("--border applies to --mode=builtin only")
    if c.halo.caches and o.mode != "custom":
        raise UsageError("--halo applies to --mode=custom only (the TFMCU_PATCH_STAGE kernel keeps the caches)")
    if c.rest_convs != CustomOptions().rest_convs and o.mode != "custom":
        raise UsageError("--rest_convs applies to --mode=custom only")
    if c.stream_input and o.mode != "custom":
        raise UsageError("--stream_input applies to --mode=custom only (the TFMCU_PATCH_STAGE kernel reads the rows)")
    stages = o.schedule.search.max_stages
    if (stages is None or stages > 1) and (o.mode != "custom" or not o.schedule.auto):
        raise UsageError(f"--max_stages={stages}: several patch stages are searched with "
                         f"--patches=auto --mode=custom only")
    if c.kernels != CustomOptions().kernels and o.mode != "custom":
        raise UsageError("--kernels applies to --mode=custom (the kernels its memory plan is made for)")
    if c.core != CustomOptions().core and o.mode != "custom":
        raise UsageError("--core applies to --mode=custom (the core whose read orders its memory plan is made for)")
    if o.schedule.patches is None:
        raise UsageError("--patches is required: P, PxQ (with --patch_blocks or --patch_ops) or auto")
    o.schedule.validate()
    for flag, path in (("--out", o.out), ("--json_out", o.json_out)):
        if path and os.path.abspath(path) == os.path.abspath(o.tflite):
            raise UsageError(f"{flag} must differ from --tflite")
    check_output_paths({"--out": o.out, "--json_out": o.json_out})
    return data


@dataclass(frozen=True, kw_only=True)
class FlashBytes(Record):
    original: int
    output: int  # the written model (the input model when not patched)


@dataclass(frozen=True, kw_only=True)
class RewriteReport(Record):
    """What ``rewrite`` did (its ``--json_out``). ``schedule``, ``halo``, ``rest_convs``, ``custom_mode`` and
    ``search`` are the records of the layers that made them (``tfmcu.stage.common.schedule_record``, the chosen
    evaluation's details, ``tfmcu.stage.custom.memory_report``, ``SearchResult.to_dict()``)."""

    input: str
    output: str
    mode: str
    search: dict[str, Any] | None = optional()  # auto mode
    predicted: Pair[ArenaFigures]
    schedule: dict[str, Any] | None = optional()
    halo: dict[str, Any] | None = optional()
    rest_convs: dict[str, Any] | None = optional()
    ops: Pair[int] | None = optional()
    tflm: Pair[ArenaFigures] | None = optional()  # measured (``measure``)
    custom_mode: dict[str, Any] | None = optional()
    message: str
    patched: bool
    flash_bytes: FlashBytes


def _predicted(ev: Evaluation) -> ArenaFigures:
    d = ev.details
    if "predicted_arena_bytes" in d and "predicted_arena_head_bytes" in d:
        return ArenaFigures(arena_total_bytes=d["predicted_arena_bytes"],
                            arena_head_bytes=d["predicted_arena_head_bytes"],
                            arena_tail_bytes=d["predicted_arena_tail_bytes"])
    return ArenaFigures(arena_total_bytes=ev.cost)


def run(o: RewriteOptions, log: Callable[[str], None] = print, progress: Progress | None = None) -> RewriteReport:
    """Rewrite ``o.tflite`` into ``o.out`` (see the module docstring); returns the report."""
    data = validate(o)
    path = o.tflite
    data, folded = fold_static_reshapes(data, path)
    if folded:
        log(f"rewrite: {folded} reshapes whose shape the model computes at run time given their static shape (the "
            f"same outputs)")
    graph = from_tflite(data, name=os.path.splitext(os.path.basename(path))[0])
    req = o.schedule
    opts = req.search
    budget = req.budget_bytes
    if o.mode == "builtin":
        borders = BORDERS if o.border == "auto" else (o.border,)
        cost: Any = BuiltinArenaCost(data, graph, path, borders if req.auto else borders[:1], opts.count_input)
    else:
        cost = CustomArenaCost(data, graph, path, options=o.custom, count_input=opts.count_input, budget=budget)
    # The original first: a model that makes TFLM abort is a one-line error (isolated) before any search.
    m_orig = measure_arena(data, where=path, isolate=True) if o.measure else None
    found: dict[str, Any] | None = None
    if req.auto:
        log(f"auto: {'least-MACs' if opts.objective == 'macs' else 'smallest'} schedule for {path} ({o.mode} mode, "
            f"{cost.what}" + (f", budget {req.sram_kb:g} kB" if budget is not None else "") + ") ...")
        res = search(graph, cost, budget, opts, progress)
        found = res.to_dict()
        if not res.feasible:
            raise UsageError(f"{path}: {res.message}")
        chosen, baseline, message = res.chosen, res.baseline, res.message
    else:
        assert req.grid is not None
        baseline = cost.evaluate(candidates(graph, opts)[0], None)
        chosen = cost.evaluate(candidate_for(graph, req.grid, req.patch_blocks, req.patch_ops, opts.mac_metric),
                               cost.variants[0])
        message = "rewritten as requested"
    assert chosen is not None
    patched = chosen.candidate.patched
    out_bytes = chosen.result.model if patched else data
    report = RewriteReport(input=path, output=o.out, mode=o.mode, search=found,
                           predicted=Pair(original=_predicted(baseline),
                                          rewritten=_predicted(chosen) if patched else None),
                           message=message, patched=patched, flash_bytes=FlashBytes(original=len(data), output=0))
    if patched:
        report = dataclasses.replace(report, schedule=chosen.result.schedule, halo=chosen.details.get("halo"),
                                     rest_convs=chosen.details.get("rest_convs"),
                                     ops=Pair(original=chosen.result.ops_before, rewritten=chosen.result.ops_after))
    if m_orig is not None:
        m_rw = None
        if patched:
            if o.mode == "builtin":
                m_rw = ArenaFigures.of(measure_arena(out_bytes, where=o.out, isolate=True))
            else:  # the whole model in TFLM built from source with our kernel, on one random input
                sample = random_inputs(data, 1, seed=0)
                run = run_whole(out_bytes, sample, where=o.out)
                whole = run.arena
                # the original model on the same input in the same TFLM: the outputs must be equal
                ref = run_whole(data, sample, where=path).outputs
                if not all(np.array_equal(a, b) for a, b in zip(run.outputs[0], ref[0])):
                    raise TfmcuError(f"{o.out}: the rewritten model's outputs in TFLM differ from the original's on a "
                                     f"random input (a tfmcu bug: please report it); nothing written")
                m_rw = ArenaFigures(arena_total_bytes=whole.arena_used_bytes, arena_head_bytes=whole.head_bytes,
                                    arena_tail_bytes=whole.tail_bytes, measured_by=MEASURED_BY,
                                    patch_stage_persistent_bytes=whole.patch_stage_persistent_bytes,
                                    outputs_equal_original_on="1 random input, TFLM built from source")
            if req.auto and m_rw.arena_total_bytes >= m_orig.total:
                message = (f"the rewritten model's measured TFLM arena ({m_rw.arena_total_bytes} B) is not "
                           f"smaller than the "
                           f"original's ({m_orig.total} B): falling back to no patching (output = input model)")
                out_bytes, patched = data, False
        report = dataclasses.replace(report, tflm=Pair(original=ArenaFigures.of(m_orig), rewritten=m_rw))
    if patched and o.mode == "custom":
        report = dataclasses.replace(report, custom_mode=memory_report(out_bytes, o.out))
    report = dataclasses.replace(report, message=message, patched=patched,
                                 flash_bytes=FlashBytes(original=len(data), output=len(out_bytes)))
    # the budget against the output's measured TFLM arena, which holds the image (TFLM always plans its input): only
    # when the budget counts the image
    if budget is not None and o.measure and opts.count_input:
        figure = getattr(report.tflm, "rewritten" if patched else "original").arena_total_bytes
        if figure is not None and figure > budget:
            raise UsageError(f"{path}: the output's measured TFLM arena is {figure:,} B, more than "
                             f"--sram_kb={req.sram_kb:g} ({budget:,} B); nothing written")
    write_outputs({o.out: out_bytes, o.json_out: report.to_json()})
    log(format_summary(report, o.custom.inplace).rstrip())
    return report


def format_summary(r: RewriteReport, inplace: bool = False) -> str:
    lines = [r.message]
    s = r.schedule
    if s and r.ops is not None and s.get("stage_plan"):  # several stages: each one's operators and grid
        plan = "; ".join(f"{e['grid'][0]}x{e['grid'][1]} over operators {e['ops_tflite'][0]}-{e['ops_tflite'][-1]}"
                         for e in s["stage_plan"])
        lines.append(f"schedule: {len(s['stage_plan'])} stages: {plan}; ops {r.ops.original} -> {r.ops.rewritten}")
    elif s and r.ops is not None:
        g = s["grid"]
        stage = f"{s['patch_blocks']} blocks" if s["patch_blocks"] is not None else f"{s['patch_ops']} ops"
        lines.append(f"schedule: {g[0]}x{g[1]} patches over the first {stage}; ops {r.ops.original} -> "
                     f"{r.ops.rewritten}; MACs +{s['mac_overhead_exact'] * 100:.1f}% (exact), "
                     f"+{s['mac_overhead_padded'] * 100:.1f}% (padded)")
    h = r.halo
    if h:
        lines.append(f"halo caches: {len(h['row_caches'])} row + {len(h['col_caches'])} column caches, "
                     f"{h['cache_bytes']:,} B; MACs +{h['mac_overhead_exact'] * 100:.1f}% (exact; the stage's "
                     f"+{h['stage_mac_overhead'] * 100:.1f}%)")
    rc = r.rest_convs
    if rc:
        lines.append(f"rest: {rc['replaced']} convolutions / fully connected layers run by TFMCU_PATCH_STAGE ops "
                     f"(multipliers in Flash), "
                     f"{rc['kept']} left to TFLM; {rc['tflm_persistent_bytes_moved']:,} B less persistent tail "
                     f"(Cortex-M, predicted)")
    if r.mode == "custom" and r.custom_mode:
        mem = r.custom_mode
        measured = r.tflm.rewritten if r.tflm is not None else None
        kernel = measured.patch_stage_persistent_bytes if measured is not None else None
        kernel = kernel if kernel is not None else mem["patch_stage_persistent_bytes"]["host_64bit"]
        n = len(mem.get("stages") or [0])
        ops = f"one {PATCH_STAGE_OP} op; scratch {mem['scratch_bytes']:,} B" if n == 1 else (
            f"{n} {PATCH_STAGE_OP} ops; scratch up to {max(st['scratch_bytes'] for st in mem['stages']):,} B")
        lines.append(f"{ops}; kernel op data {kernel:,} B; rest of the graph planned "
                     f"{'in place' if inplace else 'without overlaps'}")
    for label, pair in (("predicted", r.predicted), ("TFLM measured", r.tflm)):
        if pair is None:
            continue
        o = pair.original.arena_total_bytes if pair.original is not None else None
        w = pair.rewritten.arena_total_bytes if pair.rewritten is not None else None
        line = f"{label:>14}: original {o:,} B" if o is not None else f"{label:>14}:"
        if w is not None:
            line += f", rewritten {w:,} B ({o / w:.2f}x smaller)"
            if pair is r.tflm and r.mode == "custom":
                line += " (rewritten: whole model in TFLM built from source with the kernel)"
        lines.append(line)
    lines.append(f"{'Flash':>14}: {r.flash_bytes.original:,} -> {r.flash_bytes.output:,} B; wrote {r.output}")
    return "\n".join(lines) + "\n"
