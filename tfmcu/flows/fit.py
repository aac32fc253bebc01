"""``fit``: a model and a target -> firmware that fits the chip, as fast as it can run (``pipelines.fit``).

The SRAM budget is the target's: its RAM less the stack and the other static data (``tfmcu.flows.deploy``'s
estimate), less deploy's arena margin; the kernels are the target build's (``--kernels``, CMSIS-NN by default).
One joint schedule search (``tfmcu.plan.search``) prices every candidate -- patch grid x stage x configuration
(halo caches none / all / smallest / auto, the rest's convolutions by TFLM or by our kernels with their multipliers
in Flash), the rest planned in place for those kernels, the input streamed when the user says the firmware provides
rows -- by its predicted TFLM arena on the target's build (``tfmcu.stage.cost.CustomArenaCost``,
``tfmcu.plan.arena``) and its predicted instructions per Invoke on the target's core (``tfmcu.plan.latency``), both
read from the candidate's model as the rewriter decides it, before any byte of it is written (``cost_function``):
only the chosen model is written.

Objectives: ``latency`` (default): the fewest predicted instructions whose arena fits (the unmodified model, run
per layer by TFLM with the same kernels, when it fits); ``memory``: the smallest arena whose predicted instructions
are at most ``max_latency`` x the per-layer model's (default 1.05).

Then the chosen model is verified (bit-exact against the original in TF Lite and TFLM, ``tfmcu.flows.verify``) and
written as a firmware folder (``tfmcu.flows.deploy``); with ``run`` it is built and run under QEMU and the measured
arena and instructions are compared with the predictions. The firmware's outputs must equal TF Lite's, but on an
input where TFLM on this host gives another output by a rounding tie in the FULLY_CONNECTED head, proven on the model:
TFLM's there (deploy's ``DeployReference``: fit.json's ``deploy.reference``). ``run`` returns a ``FitReport``.
``out_dir`` gets ``model.tflite`` (the chosen model), ``fit.json`` (the report: every candidate evaluated, the chosen
one, the per-layer model, verify and deploy reports), ``fit.png`` (predicted arena against predicted instructions for
every candidate), ``memory.png`` (the arena over the ops, per layer and chosen: ``plot_timeline``), ``report.md``
(for a person: ``tfmcu.flows.fit_report``) and ``firmware/`` (deploy's folder: the model library in ``model/``); it
is assembled beside ``out_dir`` and renamed into place, so a failure leaves nothing behind.

A model that cannot fit at any configuration is a one-line ``UsageError`` naming the smallest achievable arena and
what it holds (or that the model's weights alone exceed the target's Flash); when it would fit with the input
streamed, the line says so (``--stream_input``) with that arena.

``price`` is the search alone (``FitSearch``: every candidate priced, nothing verified or written), under the
target's budget or another one (``arena_budget`` of a chip with other RAM).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.errors import TfmcuError, UsageError
from tfmcu.firmware.targets import Target
from tfmcu.firmware.tree import check_dest, export_tree
from tfmcu.files import assembled_folder, figure_png, read_bytes
from tfmcu.flows.deploy import (STATIC_ESTIMATE, ArenaAtOp, DeployOptions, DeployReport, deploy, flash_estimate,
                                 largest_prediction, timeline_of, validate as validate_deploy)
from tfmcu.flows.fit_report import markdown as report_markdown
from tfmcu.flows.verify import VerifyOptions, verify
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.graph import ir
from tfmcu.graph.load import KERAS_SUFFIXES, ModelError, load_spec
from tfmcu.plan.arena import KERNEL_SETS, mcu_build, predict_model_arena
from tfmcu.plan.halo import HaloOptions
from tfmcu.plan.latency import predict_instructions
from tfmcu.plan.regions import ScheduleError
from tfmcu.plan.search import SEARCH_SECONDS, WIDE_GRIDS, Evaluation, Progress, SearchOptions, SearchResult, search
from tfmcu.records import Record, optional
from tfmcu.stage.cost import CustomArenaCost, CustomOptions
from tfmcu.stage.custom import convs_to_flash
from tfmcu.tflite.editor import fold_static_reshapes
from tfmcu.tflite.model import TfliteModel
from tfmcu.tflite.schema import has_identifier

KB = 1024
FIT_OBJECTIVES = ("latency", "memory")


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """What ``fit`` is asked (``pipelines.fit``'s flags take their defaults from here); built by keyword.
    ``firmware``: deploy's options for the chosen model's firmware (the target, the kernels, ``run``, the inputs,
    margin, stack, console, ...; fit sets its ``tflite``, ``out_dir`` and ``seed``)."""

    model: str  # .tflite (int8), Keras file, preset name or spec JSON
    firmware: DeployOptions = field(default_factory=lambda: DeployOptions(tflite=""))
    calibration_data: str | None = None  # a Keras model's int8 calibration: class folders or a .npy (None: random)
    out_dir: str = "out/fit"
    objective: str = "latency"
    max_latency: float = 1.05  # objective "memory": instructions <= this x the per-layer model's (same kernels)
    stream_input: bool = False  # the firmware provides the image rows (camera, decoder): no image in the arena
    seed: int = 0
    patch_options: tuple[int, ...] = WIDE_GRIDS  # patches per side (square grids; row bands in stage plans)
    max_mac_overhead: float | None = None
    max_stages: int | None = None  # patch stages anywhere (stage plans), at most this many (None: any number)
    se_passes: bool = True  # squeeze-excites inside patch stages, in passes (False: stages end at them)
    search_seconds: float | None = SEARCH_SECONDS  # the search's time budget (None: none)
    search_workers: int = 0  # processes pricing candidates (0: one per core)
    verify_samples: int = 20
    halo_modes: tuple[str, ...] = ()  # () : by objective (``configurations``); else these modes
    rest_convs: tuple[str, ...] = ("tflm", "tfmcu")

    @property
    def target(self) -> str:
        return self.firmware.target

    @property
    def kernels(self) -> str:
        return self.firmware.kernels

    def deploy_options(self, tflite: str, out_dir: str) -> DeployOptions:
        """deploy's options for the firmware of ``tflite`` in ``out_dir``."""
        return dataclasses.replace(self.firmware, tflite=tflite, out_dir=out_dir, seed=self.seed)


@dataclass(frozen=True, kw_only=True)
class FitCandidate(Record):
    """One priced candidate: its schedule and configuration, predicted arena and instructions, MACs."""

    describe: str
    patches: list[int] | None  # the grid; None: per layer
    patch_blocks: int | None
    stages: int
    config: str | None  # the configuration (halo caches, the rest's convolutions)
    predicted_arena_bytes: int  # in the budget's region: with the tail apart, the head alone
    predicted_instructions: int | None
    mac_overhead: float
    macs: int
    predicted_persistent_bytes: int | None = optional()  # TFLM's persistent tail apart (Target.persistent_ram)

    @property
    def predicted_total_bytes(self) -> int:
        """What the firmware's arena_used_bytes counts: the arena and, apart, the persistent tail."""
        return self.predicted_arena_bytes + (self.predicted_persistent_bytes or 0)

    @classmethod
    def of(cls, ev: Evaluation) -> "FitCandidate":
        """The search's evaluation of a candidate as fit reports it."""
        c = ev.candidate
        return cls(describe=ev.describe(), patches=list(c.grid) if c.patched else None, patch_blocks=c.n_blocks,
                   stages=len(c.stages),
                   config=ev.variant_label, predicted_arena_bytes=ev.cost, predicted_instructions=ev.instructions,
                   mac_overhead=ev.details.get("mac_overhead_exact", c.mac_overhead),
                   macs=int(round(c.macs / (1 + c.mac_overhead) * (1 + ev.details.get("mac_overhead_exact",
                                                                                      c.mac_overhead)))),
                   predicted_persistent_bytes=(ev.details.get("predicted_arena_tail_bytes")
                                               if ev.details.get("persistent_apart") else None))


@dataclass(frozen=True, kw_only=True)
class ChosenCandidate(FitCandidate):
    patched: bool  # False: the model as it is (it fits per layer)


@dataclass(frozen=True, kw_only=True)
class FitSearch(Record):
    """fit's joint schedule search, priced (``price``): the per-layer model, the smallest candidate, the chosen one
    (None: nothing fits the budget) and every candidate evaluated."""

    budget_bytes: int
    feasible: bool
    message: str
    per_layer: FitCandidate
    smallest: FitCandidate
    chosen: FitCandidate | None
    candidates: list[FitCandidate]


@dataclass(frozen=True, kw_only=True)
class FitVerify(Record):
    bit_exact: bool
    samples: int


@dataclass(frozen=True, kw_only=True)
class PredictedBy(Record):
    arena: str
    instructions: str


@dataclass(frozen=True, kw_only=True)
class FitMeasured(Record):
    """The chosen model's predictions against the firmware's measured figures (``run``)."""

    arena_used_bytes: int | None
    predicted_arena_bytes: int
    arena_equal: bool | None
    invoke_instructions: int | None  # the fewest over the test inputs
    predicted_instructions: int | None
    instructions_error: float | None  # predicted / measured - 1
    outputs_equal_tflite: bool  # the expected outputs: TF Lite's, TFLM's on this host at a tie (deploy.reference)
    fits: bool
    measured_by: str | None
    verdict: str | None


@dataclass(frozen=True, kw_only=True)
class FitReport(Record):
    """What ``fit`` chose, verified and deployed (fit.json)."""

    model: str
    model_origin: str
    out_dir: str
    target: str
    core: str
    kernels: str
    objective: str
    max_latency: float | None  # objective memory's cap
    stream_input: bool
    arena_budget_bytes: int
    message: str
    per_layer: FitCandidate
    chosen: ChosenCandidate
    candidates: list[FitCandidate]
    bounded_out: int
    failed: list[str]  # the first 20
    search_seconds: float | None = optional()  # how long the search took
    cut_short: int | None = optional()  # candidates the time budget (--search_seconds) left unevaluated
    predicted_by: PredictedBy
    verify: FitVerify | None  # None: the chosen model is the original
    deploy: DeployReport
    measured: FitMeasured | None = optional()  # with ``run``
    tree: dict[str, Any] | None = optional()  # with ``tree``: tree.json (``tfmcu.firmware.tree.export_tree``)
    # predicted instructions of the model per layer with our kernels (every convolution a one-layer stage:
    # convs_to_flash, what --rest_convs=tfmcu does): the second ratio a report gives (None: not predicted)
    per_layer_tfmcu_instructions: int | None = optional()
    # the per-layer model's memory timeline, predicted, one arena (the chosen model's: deploy.arena.timeline)
    per_layer_timeline: list[ArenaAtOp] | None = optional()


def validate(o: FitOptions) -> Target:
    """Checks ``o`` (a one-line ``UsageError``) and returns its target, resolved here once."""
    f = o.firmware
    t = validate_deploy(o.deploy_options(o.model, os.path.join(o.out_dir, "firmware")))
    if o.kernels not in KERNEL_SETS:
        raise UsageError(f"--kernels={o.kernels}: expected one of {', '.join(KERNEL_SETS)}")
    if o.objective not in FIT_OBJECTIVES:
        raise UsageError(f"--objective={o.objective}: expected one of {', '.join(FIT_OBJECTIVES)}")
    if not 1.0 <= o.max_latency <= 100:
        raise UsageError(f"--max_latency={o.max_latency:g}: expected a factor >= 1 over TFLM + the same kernels "
                         f"per layer (1.05: at most 5% slower)")
    if o.verify_samples < 1:
        raise UsageError(f"--verify_samples={o.verify_samples}: must be >= 1")
    if o.calibration_data and not o.model.endswith(KERAS_SUFFIXES):
        raise UsageError(f"--calibration_data applies to a Keras model (--model={'|'.join(KERAS_SUFFIXES)}), not "
                         f"{o.model}: a .tflite is already calibrated, a spec or preset has no trained weights")
    if f.tree:
        if os.path.abspath(f.tree).startswith(os.path.abspath(o.out_dir) + os.sep):
            raise UsageError(f"--tree={f.tree}: must lie outside --out_dir={o.out_dir} (which fit replaces)")
        check_dest(os.path.join(o.out_dir, "firmware"), f.tree, "--tree")
    try:
        SearchOptions(patch_options=o.patch_options, max_mac_overhead=o.max_mac_overhead,
                      max_stages=o.max_stages, search_seconds=o.search_seconds,
                      workers=o.search_workers).validate()
        for mode in o.halo_modes:
            HaloOptions(mode=mode).validate()
        for c in configurations(o, t.core):
            c.validate()
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    return t


def arena_budget(o: FitOptions, t: Target) -> int:
    """The predicted arena a candidate may have: the target's RAM less the stack and the other static data, less
    deploy's margin (deploy allocates the prediction x (1 + margin), rounded up to 16 bytes). For a chip like ``t``
    with other RAM: ``dataclasses.replace(t, sram_bytes=...)``."""
    return largest_prediction(t.sram_bytes - o.firmware.stack_kib * KB - STATIC_ESTIMATE, o.firmware.margin)


def persistent_room(o: FitOptions, t: Target) -> int | None:
    """The predicted persistent tail a candidate may keep in the board's region for it (``Target.persistent_ram``:
    deploy puts it there when the tail x (1 + margin), rounded up to 16 bytes, fits); None: no such region."""
    region = t.persistent
    return (None if region is None or not o.firmware.persistent_apart else
            largest_prediction(region.bytes, o.firmware.margin))


def model_bytes(o: FitOptions, log: Callable[[str], None]) -> tuple[bytes, str]:
    """The int8 .tflite of ``o.model`` and a note on where it came from: a .tflite as it is; a Keras file converted
    to full int8, calibrated on ``o.calibration_data`` or else on seeded random inputs (the arena and instructions
    are the architecture's, the accuracy is not), its batch norms' statistics estimated on the same inputs when
    they were never trained (``tfmcu.train.export.int8_from_keras``); a spec built with untrained weights."""
    m = o.model
    if m.endswith(".tflite"):
        data = read_bytes(m, "--model")
        if not has_identifier(data):
            raise UsageError(f"--model={m}: not a TFLite flatbuffer (no 'TFL3' file identifier)")
        return data, "the given .tflite"
    from tfmcu.train.export import untrained_int8, int8_from_keras  # lazy: imports TensorFlow

    if m.endswith(KERAS_SUFFIXES):
        if not os.path.isfile(m):
            raise UsageError(f"--model={m}: no such file")
        on = o.calibration_data or "random inputs: --calibration_data for your data's int8 ranges"
        log(f"fit: converting {m} to full int8 (calibrated on {on}) ...")
        try:
            k = int8_from_keras(m, o.seed, o.calibration_data)
        except TfmcuError:
            raise
        except (OSError, ValueError, TypeError) as e:
            raise UsageError(f"--model={m}: cannot be loaded or converted as a Keras model "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        origin = f"converted from the Keras file, calibrated on {k.calibrated_on}"
        if k.batchnorm_on:
            origin += (f"; its batch norms had their initial statistics (untrained weights): estimated on "
                       f"{k.batchnorm_on}")
        log(f"fit: {origin}")
        return k.data, origin
    try:
        spec = load_spec(m)
    except ModelError as e:
        raise UsageError(str(e)) from None
    log(f"fit: building {m} with untrained weights, converted to full int8 ...")
    return untrained_int8(spec, o.seed, as_conv=False), ("built from the spec with untrained weights (arena and "
                                                         "speed only)")


def configurations(o: FitOptions, core: str) -> list[CustomOptions]:
    """The custom-mode configurations every patched candidate is priced in. The rest is always planned in place
    for the target's kernels and core (it changes no instruction and never adds memory; CMSIS-NN's Helium code on a
    core with MVE reads in its own orders, ``tfmcu.plan.cmsis_nn.processing_order``); streaming only when allowed.
    Objective latency: halo ``auto``, the most caches that fit the budget (none when none fit: the recompute
    schedule), i.e. the fewest MACs the budget allows; objective memory: recompute, every halo cached (the fewest
    MACs), and ``smallest``, the smallest stage whose whole model computes at most ``max_latency - 1`` more MACs
    (MACs standing for instructions)."""
    if o.halo_modes:
        modes = [HaloOptions(mode=h) for h in o.halo_modes]
    elif o.objective == "latency":
        modes = [HaloOptions(mode="auto")]
    else:
        modes = [HaloOptions(mode="none"), HaloOptions(mode="all"),
                 HaloOptions(mode="smallest", max_mac_overhead=round(min(o.max_latency - 1.0, 1.0), 4))]
    return [CustomOptions(inplace=True, kernels=o.kernels, core=core, halo=h, stream_input=o.stream_input,
                          rest_convs=r) for h in modes for r in o.rest_convs]


def _holds(ev: Evaluation) -> str:
    d = ev.details
    head, tail = d.get("predicted_arena_head_bytes"), d.get("predicted_arena_tail_bytes")
    if head is None or tail is None:
        return ""
    apart = " apart" if d.get("persistent_apart") else ""
    return f" (activations and scratch {head:,} B, TFLM's persistent tail{apart} {tail:,} B)"


def run(o: FitOptions, log: Callable[[str], None] = print, progress: Progress | None = None) -> FitReport:
    """Fit ``o.model`` to ``o.target`` (see the module docstring); returns fit.json's content."""
    t = validate(o)
    source, origin = model_bytes(o, log)
    data, folded = fold_static_reshapes(source, o.model)
    if folded:
        log(f"fit: {folded} reshapes whose shape the model computes at run time (SHAPE -> STRIDED_SLICE -> PACK) "
            f"given their static shape; the operators that computed it removed (the same outputs)")
    where = o.model
    name = os.path.splitext(os.path.basename(where))[0]
    if len(data) > t.flash_bytes and flash_estimate(t, len(data), 0).model_in != "external":
        raise UsageError(f"{where}: the model ({len(data):,} B: its weights and constants) alone exceeds the "
                         f"{t.name}'s Flash ({t.flash_bytes:,} B) and the board has no external memory for it; no "
                         f"configuration can fit it")
    budget = arena_budget(o, t)
    log(f"fit: {where} on the {t.name} ({t.core}, {o.kernels} kernels): predicted arena budget {budget:,} B "
        f"(RAM {t.sram_bytes:,} B - stack {o.firmware.stack_kib} KiB - {STATIC_ESTIMATE} B static, "
        f"/ (1 + {o.firmware.margin:g}))"
        + (f", TFLM's persistent data apart in {t.persistent_ram} when it fits {persistent_room(o, t):,} B (its "
           f"head alone then counts)" if persistent_room(o, t) is not None else "") + f"; objective {o.objective}"
        + (f" within {o.max_latency:g}x the per-layer instructions" if o.objective == "memory" else "") + " ...")
    res = _search(o, t, data, name, budget, progress)
    if not res.feasible:
        s = res.smallest
        within = (f" within {o.max_latency:g}x the per-layer model's predicted instructions"
                  if o.objective == "memory" else "")
        raise UsageError(f"{where}: does not fit the {t.name} at any configuration tried{within}: the smallest "
                         f"predicted TFLM arena is {s.cost:,} B{_holds(s)} with {s.describe()}, over the {budget:,} B "
                         f"the target leaves for it"
                         + (f"; the {o.search_seconds:g} s time budget left {res.cut_short} candidates unevaluated "
                            f"(raise --search_seconds)" if res.cut_short else "")
                         + _if_streamed(o, t, data, name, budget, log, progress))
    chosen = res.chosen
    assert chosen is not None
    log("fit: " + res.message)
    with assembled_folder(o.out_dir, "--out_dir") as stage:
        report = _finish(o, t, data, origin, res, chosen, stage, log, source)
    if o.firmware.tree:
        report = dataclasses.replace(report, tree=export_tree(os.path.join(o.out_dir, "firmware"), o.firmware.tree,
                                                              log=log))
    log(format_summary(report))
    return report


def _if_streamed(o: FitOptions, t: Target, data: bytes, name: str, budget: int, log: Callable[[str], None],
                 progress: Progress | None) -> str:
    """For a model that fits nothing with its image in the arena: the same search with the input streamed; if that
    fits, the clause naming ``--stream_input`` and its figure (else "")."""
    if o.stream_input:
        return ""
    log("fit: nothing fits with the image in the arena; searching again with the input streamed ...")
    res = _search(dataclasses.replace(o, stream_input=True), t, data, name, budget, progress)
    if not res.feasible:
        return ""
    c = res.chosen
    return (f"; with --stream_input (your firmware provides the image rows) it fits: {c.cost:,} B with "
            f"{c.describe()}")


def price(o: FitOptions, data: bytes, name: str, budget: int | None = None,
          progress: Progress | None = None) -> FitSearch:
    """fit's joint schedule search alone, for the int8 model ``data`` (called ``name``) on ``o.target``: every
    candidate priced by its predicted TFLM arena on the target's build and its predicted instructions on its core,
    under a predicted-arena ``budget`` (None: the target's, ``arena_budget``). Nothing is verified or written."""
    t = validate(o)
    budget = arena_budget(o, t) if budget is None else budget
    res = _search(o, t, data, name, budget, progress)
    return FitSearch(budget_bytes=budget, feasible=res.feasible, message=res.message,
                     per_layer=FitCandidate.of(res.baseline), smallest=FitCandidate.of(res.smallest),
                     chosen=None if res.chosen is None else FitCandidate.of(res.chosen),
                     candidates=[FitCandidate.of(e) for e in res.evaluated])


def _search(o: FitOptions, t: Target, data: bytes, name: str, budget: int,
            progress: Progress | None = None) -> SearchResult:
    """fit's joint schedule search for the int8 model ``data`` on target ``t`` under a predicted-arena ``budget``:
    the candidates priced by their predicted TFLM arena on the target's build and their predicted instructions on
    its core."""
    graph = from_tflite(data, name=name)
    cost = cost_function(o, t, data, graph, budget)
    opts = SearchOptions(patch_options=o.patch_options, rectangular=False, max_mac_overhead=o.max_mac_overhead,
                         max_stages=o.max_stages, search_seconds=o.search_seconds, workers=o.search_workers,
                         count_input=True, objective=o.objective, se_in_stages=o.se_passes,
                         max_latency=o.max_latency if o.objective == "memory" else None)
    try:
        return search(graph, cost, budget, opts, progress)
    except ScheduleError as e:
        raise UsageError(f"{o.model}: {e}") from None


def cost_function(o: FitOptions, t: Target, data: bytes, graph: ir.Graph, budget: int | None) -> CustomArenaCost:
    """fit's cost function for the int8 model ``data`` (``graph`` lowered from it) on target ``t``: custom mode in
    every configuration of ``configurations(o, t.core)``, the predicted TFLM arena on the target's build and the
    predicted instructions on its core, both read from each candidate's model as the rewriter decides it (nothing
    written)."""

    def instructions(model: bytes | TfliteModel) -> int:
        return predict_instructions(model, t.core, o.kernels).instructions

    return CustomArenaCost(data, graph, o.model, configs=configurations(o, t.core), count_input=True, budget=budget,
                           build=mcu_build(o.kernels, t.core), instructions=instructions,
                           persistent_room=persistent_room(o, t))


def _finish(o: FitOptions, t: Target, data: bytes, origin: str, res: SearchResult, chosen: Evaluation, stage: str,
            log: Callable[[str], None], source: bytes | None = None) -> FitReport:
    """Verify and deploy the chosen model into the staging folder; fit.json and fit.png there. ``source``: the
    user's model when ``data`` is its folded form (``fold_static_reshapes``): the chosen model is verified against
    it."""
    original = os.path.join(stage, "original.tflite")
    chosen_path = os.path.join(stage, "model.tflite")
    patched = chosen.candidate.patched
    with open(original, "wb") as f:
        f.write(source if source is not None else data)
    with open(chosen_path, "wb") as f:
        f.write(chosen.result.model if patched else data)
    ver = None
    if patched or (source is not None and source != data):
        log(f"fit: verify: the chosen model against the original on {o.verify_samples} random inputs ...")
        ver = verify(VerifyOptions(original=original, rewritten=chosen_path, samples=o.verify_samples, seed=o.seed,
                                   quiet=True))
        if not ver.bit_exact:
            raise TfmcuError(f"{o.model}: the chosen model is not bit-exact against the original (a tfmcu bug: please "
                             f"report it); nothing written")
    try:
        dep = deploy(o.deploy_options(chosen_path, os.path.join(stage, "firmware")), log=log)
    except TfmcuError as e:  # named after the user's model, not its copy in the staging folder (removed)
        raise type(e)(str(e).replace(chosen_path, f"{o.model} as fit rewrote it" if patched else o.model)) from None
    ch = ChosenCandidate(**dataclasses.asdict(FitCandidate.of(chosen)), patched=patched)
    report = FitReport(
        model=o.model, model_origin=origin, out_dir=o.out_dir, target=t.name, core=t.core, kernels=o.kernels,
        objective=o.objective, max_latency=o.max_latency if o.objective == "memory" else None,
        stream_input=o.stream_input, arena_budget_bytes=res.budget, message=res.message,
        per_layer=FitCandidate.of(res.baseline), chosen=ch, candidates=[FitCandidate.of(e) for e in res.evaluated],
        bounded_out=res.bounded_out, failed=res.failed[:20], search_seconds=round(res.seconds, 1),
        cut_short=res.cut_short,
        predicted_by=PredictedBy(arena=f"tfmcu.plan.arena, TFLM build {mcu_build(o.kernels, t.core)!r}",
                                 instructions=predict_instructions(chosen.result.model if patched else data, t.core,
                                                                   o.kernels).what),
        verify=None if ver is None else FitVerify(bit_exact=ver.bit_exact, samples=ver.samples),
        deploy=dep, measured=compare(ch, dep) if o.firmware.run else None,
        per_layer_tfmcu_instructions=_per_layer_tfmcu(data, t, o.kernels),
        per_layer_timeline=timeline_of(predict_model_arena(data, build=mcu_build(o.kernels, t.core)), 0))
    with open(os.path.join(stage, "fit.json"), "w") as f:
        f.write(json.dumps(report.to_json(), indent=1) + "\n")
    with open(os.path.join(stage, "fit.png"), "wb") as f:
        f.write(plot_candidates(report))
    with open(os.path.join(stage, "memory.png"), "wb") as f:
        f.write(plot_timeline(report))
    with open(os.path.join(stage, "report.md"), "w") as f:
        f.write(report_markdown(report.to_json()))
    os.remove(original)
    return report


def _per_layer_tfmcu(data: bytes, t: Target, kernels: str) -> int | None:
    """The predicted instructions of ``data`` per layer with our kernels (``convs_to_flash``), or None where they do
    not apply (the reference kernels) or it cannot be rewritten so."""
    if kernels != "cmsis_nn":
        return None
    try:
        flash = convs_to_flash(data, "model", kernels=kernels, build="cortex-m", core=t.core)
    except TfmcuError:
        return None
    return predict_instructions(flash.model, t.core, kernels).instructions


def compare(chosen: FitCandidate, dep: DeployReport) -> FitMeasured:
    """The chosen model's predictions against the firmware's measured figures (deploy's report with ``run``)."""
    run = dep.run
    arena = None if run is None else run.arena_used_bytes
    insn = None if run is None else run.instructions
    pa, pi = chosen.predicted_total_bytes, chosen.predicted_instructions
    return FitMeasured(arena_used_bytes=arena, predicted_arena_bytes=pa,
                       arena_equal=arena == pa if arena is not None else None,
                       invoke_instructions=insn, predicted_instructions=pi,
                       instructions_error=None if insn in (None, 0) or pi is None else round(pi / insn - 1, 4),
                       outputs_equal_tflite=run is not None and run.outputs_equal_tflite, fits=bool(dep.fits),
                       measured_by=None if run is None else run.measured_by, verdict=dep.verdict)


def plot_timeline(report: FitReport) -> bytes:
    """memory.png: the arena's bytes in use over the ops (predicted), the per-layer model above, the chosen one below
    with its patch stages shaded."""
    import matplotlib  # lazy: plotting only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plotting only

    arena = report.deploy.arena
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.2), sharey=True)
    rows = [(axes[0], report.per_layer_timeline or [], "per layer: one arena (TFLM's persistent data included)"),
            (axes[1], arena.timeline or [], f"chosen: {report.chosen.describe}"[:110]
             + (f"\n(+ {arena.persistent_bytes:,} B of TFLM's persistent data apart in {arena.persistent_region})"
                if arena.persistent_bytes else ""))]
    for ax, points, title in rows:
        xs = [p.op for p in points]
        ax.step(xs, [p.arena_bytes / 1024 for p in points], where="mid", color="C0")
        for p in points:
            if p.type.startswith("custom:"):
                ax.axvspan(p.op - 0.5, p.op + 0.5, color="C1", alpha=0.3, lw=0)
        if points:
            peak = max(points, key=lambda p: p.arena_bytes)
            ax.annotate(f"{peak.arena_bytes:,} B at op {peak.op} ({peak.type.replace('custom:', '')})",
                        (peak.op, peak.arena_bytes / 1024), textcoords="offset points", xytext=(6, -12), fontsize=8)
        ax.axhline(report.arena_budget_bytes / 1024, color="C3", ls="--", lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(f"arena in use (KiB)\n{arena.region or 'RAM'}", fontsize=8)
    axes[1].set_xlabel("operator index (shaded: a TFMCU_PATCH_STAGE op); dashed: the arena budget",
                       fontsize=8)
    fig.suptitle(f"{report.model} on {report.target}: the arena over one Invoke (predicted, tfmcu.plan.arena)",
                 fontsize=10)
    return figure_png(fig)


def plot_candidates(report: FitReport) -> bytes:
    """fit.png: every candidate's predicted arena against its predicted instructions; the per-layer model, the
    chosen one, the budget and (objective memory) the latency cap marked."""
    import matplotlib  # lazy: plotting only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: plotting only

    fig, ax = plt.subplots(figsize=(7.5, 5))
    pts = [(c.predicted_arena_bytes / KB, c.predicted_instructions / 1e6, c.config or "")
           for c in report.candidates if c.predicted_instructions is not None and c.patches]
    groups: dict[str, list[tuple[float, float]]] = {}
    for x, y, cfg in pts:
        groups.setdefault(cfg, []).append((x, y))
    for cfg, xy in sorted(groups.items()):
        ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=14, alpha=0.6, label=cfg)
    base, ch = report.per_layer, report.chosen
    ax.scatter([base.predicted_arena_bytes / KB], [(base.predicted_instructions or 0) / 1e6], marker="s", s=70,
               color="black", label="per layer (TFLM, same kernels)")
    ax.scatter([ch.predicted_arena_bytes / KB], [(ch.predicted_instructions or 0) / 1e6], marker="*", s=220,
               color="red", label="chosen")
    ax.axvline(report.arena_budget_bytes / KB, color="gray", ls="--", lw=1, label="arena budget")
    if report.max_latency:
        ax.axhline((base.predicted_instructions or 0) * report.max_latency / 1e6, color="gray", ls=":", lw=1,
                   label=f"{report.max_latency:g}x per-layer instructions")
    ax.set_yscale("log")
    ax.set_xlabel("predicted TFLM arena (kB; tfmcu.plan.arena)")
    ax.set_ylabel(f"predicted instructions per Invoke (M, log; {report.core}, {report.kernels})")
    ax.set_title(f"fit: {os.path.basename(report.model)} on {report.target} (estimated, every candidate)",
                 fontsize=10)
    ax.legend(fontsize=6, loc="best")
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def format_summary(r: FitReport) -> str:
    b, c = r.per_layer, r.chosen
    lines = [f"fit: {r.message}",
             f"{'':>10} {'arena (predicted)':>18} {'instructions (predicted)':>26}",
             f"{'per layer':>10} {b.predicted_arena_bytes:>16,} B {b.predicted_instructions or 0:>24,}",
             f"{'chosen':>10} {c.predicted_arena_bytes:>16,} B {c.predicted_instructions or 0:>24,}"
             f"   ({b.predicted_arena_bytes / c.predicted_arena_bytes:.2f}x smaller, "
             f"{(c.predicted_instructions or 0) / max(b.predicted_instructions or 1, 1):.3f}x the instructions)"]
    if r.per_layer_tfmcu_instructions:
        lines.append(f"{'per layer, our kernels':>10} {'':>18} {r.per_layer_tfmcu_instructions:>24,}   (the chosen: "
                     f"{(c.predicted_instructions or 0) / r.per_layer_tfmcu_instructions:.3f}x)")
    m = r.measured
    if m and m.arena_used_bytes is None:  # it did not build or run (deploy's verdict says why)
        lines.append(f"not measured on {r.target}: {m.verdict}")
    elif m:
        lines.append(f"measured on {r.target} ({m.measured_by}): arena {m.arena_used_bytes:,} B "
                     f"(predicted {'exactly' if m.arena_equal else m.predicted_arena_bytes}), instructions "
                     f"{m.invoke_instructions or 0:,} (predicted {100 * (m.instructions_error or 0):+.1f}%); "
                     f"{m.verdict}")
    run = r.deploy.run
    if run is not None and run.example is not None:
        lines.append(f"the example application (firmware/example.elf, examples/classify/main.c over the model library "
                     f"firmware/model/) printed top-1 class {run.example.top_class[0]}, output bytes = TF Lite's")
    lines.append(f"wrote {r.out_dir}/: model.tflite, fit.json, fit.png, memory.png, report.md, firmware/ (the model "
                 f"library in firmware/model/: tfmcu_model.h, docs/library.md)")
    if r.deploy.flash_with:
        lines.append(f"onto the {r.target}, in {os.path.join(r.out_dir, 'firmware')}/:\n  "
                     + "\n  ".join(r.deploy.flash_with))
    return "\n".join(lines)
