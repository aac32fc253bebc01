"""A ``Plan``: how a network runs, and the options that say which plans the schedule search considers.

A plan is a chain of segments over the graph's ops (``Segment``): an op run per layer, or a run of ops as one patch
stage on a grid (pooled into the global average pool after it or not; its halo caches fixed by the plan, or left to
the configuration that builds it). It carries its analytic figures: the peak SRAM with and without the input image,
its MACs (by the search's MAC metric) and their overhead over the per-layer model.

* ``per_layer(graph)``: the plan with no stage (every op per layer, as TFLM runs the model);
* ``single_stage(graph, grid, n_blocks | n_ops)``: one patch stage over the first n blocks or k ops
  (``--patch_blocks`` / ``--patch_ops``), from its ``tfmcu.plan.regions.PatchSchedule``;
* ``chain(graph, segments, image)``: the plans of the stage-plan search (``tfmcu.plan.stage_plans``): any number of
  stages anywhere, each with the halo caches it was priced with, the figures those of one image mode.

The cost functions of the one search (``tfmcu.plan.search``) take any plan; a rewriter takes its stages' schedules
(``Plan.schedules``). ``SearchOptions`` says what the search tries (shared by every pipeline and cost function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.graph import ir
from tfmcu.plan import regions
from tfmcu.plan.halo import HaloOptions
from tfmcu.plan.profiler import ACCOUNTINGS, profile
from tfmcu.plan.regions import PatchSchedule, ScheduleError

OBJECTIVES = ("macs", "memory", "latency")
UNITS = ("blocks", "ops")
MAC_METRICS = ("exact", "padded")
Progress = Callable[[int, int, str], None]
PER_LAYER = "no patching (per-layer)"  # how the plan with no stage reads
# how the stage-plan search treats a stage's halos (analytic): recompute them, or cache every intermediate tensor
RECOMPUTE, HALO_ALL = HaloOptions(mode="none"), HaloOptions(mode="all")
SEARCH_SECONDS = 180.0  # the pipelines' time budget for a search (fit, rewrite/profile --patches=auto): --search_seconds
# fit's grids by default (--grids): patches per side, every count to 12 and the larger ones that divide common sides;
# each stage tries those up to its output's side (square grids, and row bands in plans of several stages)
WIDE_GRIDS = tuple(range(1, 13)) + (16, 18, 24, 36)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What is searched and how (shared by every pipeline and cost function)."""

    patch_options: tuple[int, ...] = (1, 2, 3, 4)  # patches per side to try
    unit: str = "blocks"  # stages by blocks or by ops
    rectangular: bool = True  # ph x pw grids, not only p x p
    max_mac_overhead: float | None = None  # e.g. 0.2 = at most +20% MACs
    mac_metric: str = "exact"  # which MAC count candidates are ordered by
    count_input: bool = True  # the input image counts against the budget
    objective: str = "macs"  # "macs", "memory" or "latency"
    accounting: str = "separate"  # analytic memory: tfmcu.plan.profiler.ACCOUNTINGS
    max_latency: float | None = None  # "memory"/"latency": predicted instructions <= this x the unpatched model's
    # > 1 or None (any number): plans of several patch stages anywhere (``tfmcu.plan.stage_plans``) are candidates too
    max_stages: int | None = 1
    search_seconds: float | None = None  # stop evaluating after this long: the best found so far, cut_short said
    workers: int = 1  # processes pricing candidates ahead of the search (0: one per core; 1: this process only)
    # a squeeze-excite inside a patch stage, run in passes (its recompute priced); False: stages end at them
    se_in_stages: bool = True

    def validate(self) -> "SearchOptions":
        if not self.patch_options or any(not isinstance(p, int) or p < 1 for p in self.patch_options):
            raise ScheduleError(f"patch options {list(self.patch_options)}: expected integers >= 1")
        if self.unit not in UNITS:
            raise ScheduleError(f"stage unit {self.unit!r}: expected one of {', '.join(UNITS)}")
        if self.mac_metric not in MAC_METRICS:
            raise ScheduleError(f"MAC metric {self.mac_metric!r}: expected one of {', '.join(MAC_METRICS)}")
        if self.objective not in OBJECTIVES:
            raise ScheduleError(f"objective {self.objective!r}: expected one of {', '.join(OBJECTIVES)}")
        if self.accounting not in ACCOUNTINGS:
            raise ScheduleError(f"accounting {self.accounting!r}: expected one of {', '.join(ACCOUNTINGS)}")
        if self.max_stages is not None and (not isinstance(self.max_stages, int) or self.max_stages < 1):
            raise ScheduleError(f"--max_stages={self.max_stages}: expected an integer >= 1 (1: one patch stage; "
                                f"none: any number)")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ScheduleError(f"--search_workers={self.workers}: expected an integer >= 0 (0: one per core)")
        if self.search_seconds is not None and not self.search_seconds > 0:
            raise ScheduleError(f"--search_seconds={self.search_seconds:g}: expected a positive time in seconds")
        if self.max_mac_overhead is not None and self.max_mac_overhead < 0:
            raise ScheduleError(f"max MAC overhead {self.max_mac_overhead}: expected >= 0")
        if self.max_latency is not None:
            if not 0.1 <= self.max_latency <= 100:
                raise ScheduleError(f"--max_latency={self.max_latency:g}: expected a factor in [0.1, 100] over the "
                                    f"per-layer model's predicted instructions")
            if self.objective == "macs":
                raise ScheduleError("--max_latency applies to --objective=memory or latency")
        return self

    @property
    def input_phrase(self) -> str:
        return "with the input image" if self.count_input else "without the input image"


def _halo_label(halo: HaloOptions) -> str:
    """How reports name a stage's halo treatment: ``recompute``, ``halo all``, ..."""
    return "recompute" if not halo.caches else f"halo {halo.mode}"


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Ops ``[start, stop)`` of a plan: one op run per layer (``grid`` None), or a patch stage on ``grid``.

    ``halo``: the stage's halo caches as the plan fixed them (``RECOMPUTE``, ``HALO_ALL``: the stage-plan search
    prices each), None: the configuration's to choose (``tfmcu.stage.cost.CustomOptions.halo``); ``pooled``: the
    stage ends in the global average pool after it (its output summed patch by patch into an int32 accumulator, never
    held whole); ``n_blocks`` / ``n_ops``: a stage named as the first n blocks or k ops. ``peak``: analytic bytes
    while the segment runs (the image as its plan counts it); ``instructions``: the stage-plan search's estimate
    (``tfmcu.plan.stage_plans.segment_instructions``; 0 where not estimated); ``tail``: an estimate of the bytes its
    operator(s) add to TFLM's persistent tail (a cost function's ``segment_tail``; 0 where not weighed)."""

    start: int
    stop: int
    grid: tuple[int, int] | None = None
    halo: HaloOptions | None = None
    peak: int
    macs: int
    pooled: bool = False
    instructions: float = 0.0
    tail: int = 0
    n_blocks: int | None = None
    n_ops: int | None = None
    passes: int = 1  # a stage holding squeeze-excites sweeps its grid once per squeeze-excite, then once more

    @property
    def patched(self) -> bool:
        return self.grid is not None

    @property
    def prefix(self) -> bool:
        """A stage named as the first n blocks or k ops (not by its op range)."""
        return self.n_blocks is not None or self.n_ops is not None

    def halo_with(self, configured: HaloOptions) -> HaloOptions:
        """The halo caches this stage is built with under a configuration asking for ``configured``: the plan's own
        where it fixed them."""
        return configured if self.halo is None else self.halo

    def describe(self, graph: ir.Graph) -> str:
        assert self.grid is not None
        grid = f"{self.grid[0]}x{self.grid[1]}"
        passes = f", {self.passes} passes" if self.passes > 1 else ""
        if self.prefix:
            return f"{grid} patches over the first " + (f"{self.n_blocks} blocks" if self.n_blocks is not None
                                                         else f"{self.n_ops} ops") + passes
        first, last = graph.ops[self.start], graph.ops[self.stop - 1]
        span = f"block {first.block}" if first.block == last.block else f"blocks {first.block}-{last.block}"
        notes = ([] if self.halo is None else [_halo_label(self.halo)]) + ([passes[2:]] if passes else [])
        return (f"{grid} over {span}" + (f" ({', '.join(notes)})" if notes else "")
                + (" into the pool" if self.pooled else ""))


@dataclass(eq=False)
class Plan:
    """How ``graph`` runs: its ``segments`` in op order and its analytic figures (see the module docstring).

    ``image``: the image mode the figures of a chained plan are for (``tfmcu.plan.stage_plans.IMAGE_MODES``: both
    peaks are its peak in that mode); None: the peaks with and without the image are each its own."""

    graph: ir.Graph = field(repr=False)
    segments: tuple[Segment, ...]
    peak_sram_bytes: int  # analytic, the input image counted
    peak_sram_bytes_excluding_input: int
    macs: int  # by the search's MAC metric
    mac_overhead: float
    image: str | None = None
    _schedules: dict[int, PatchSchedule] = field(default_factory=dict, init=False, repr=False)

    @property
    def stages(self) -> list[Segment]:
        return [s for s in self.segments if s.patched]

    @property
    def patched(self) -> bool:
        return any(s.patched for s in self.segments)

    @property
    def by_prefix(self) -> bool:
        """Whether its stages are named by their prefix (one stage over the first n blocks or k ops, or none), not by
        their op ranges."""
        return all(s.prefix for s in self.stages)

    @property
    def open_stages(self) -> list[int]:
        """The stages (by index) whose halo caches the plan leaves to the configuration that builds it."""
        return [k for k, s in enumerate(self.stages) if s.halo is None]

    @property
    def grid(self) -> tuple[int, int]:
        """The first stage's grid ((1, 1): per layer)."""
        return next((s.grid for s in self.segments if s.grid is not None), (1, 1))

    @property
    def cells(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_blocks(self) -> int | None:
        """The first n blocks a stage named by its prefix covers (None: no such stage)."""
        return next((s.n_blocks for s in self.stages), None)

    @property
    def n_ops(self) -> int | None:
        return next((s.n_ops for s in self.stages), None)

    @property
    def instructions(self) -> float:
        """The segments' estimated instructions (``tfmcu.plan.stage_plans.segment_instructions``; not TFLM's, not
        measured)."""
        return sum(s.instructions for s in self.segments)

    @property
    def tail(self) -> int:
        """The segments' estimated TFLM tail (``Segment.tail``; 0 where not weighed)."""
        return sum(s.tail for s in self.segments)

    def peak(self, count_input: bool = True) -> int:
        return self.peak_sram_bytes if count_input else self.peak_sram_bytes_excluding_input

    def schedules(self) -> list[PatchSchedule]:
        """Each patch stage's schedule (``tfmcu.plan.regions``), as a rewriter takes it (built once; a pooled stage
        ends with the pool)."""
        for k, s in enumerate(self.stages):
            if k not in self._schedules:
                assert s.grid is not None
                self._schedules[k] = regions.schedule(self.graph, s.grid, ops=list(range(s.start, s.stop)))
        return [self._schedules[k] for k in range(len(self.stages))]

    def describe(self) -> str:
        stages = self.stages
        if not stages:
            return PER_LAYER
        parts = "; ".join(s.describe(self.graph) for s in stages)
        if self.by_prefix:
            return parts
        return f"{len(stages)} stage{'s' if len(stages) > 1 else ''}: {parts}"

    def stage_plan_dict(self) -> dict[str, Any]:
        """Its stages as the stage-plan search reports them (analytic figures, every patch stage's ops, grid, halo
        treatment and peak)."""
        return {"describe": self.describe(), "image": self.image, "peak_bytes": self.peak_sram_bytes,
                "macs": self.macs, "mac_overhead": round(self.mac_overhead, 6), "stages": len(self.stages),
                "instructions_estimate": int(round(self.instructions)),
                "segments": [{"ops": [s.start, s.stop], "grid": list(s.grid) if s.grid else None,
                              "variant": None if s.halo is None else _halo_label(s.halo), "pooled": s.pooled,
                              "peak_bytes": s.peak, "macs": s.macs, "passes": s.passes} for s in self.stages]}

    def stage_plan_field(self) -> dict[str, Any]:
        """What a report adds for the plan's stages: ``{"stage_plan": ...}`` when they are named by their op ranges;
        nothing for a plan named by its prefix (``patch_blocks`` / ``patch_ops`` say it) or per layer."""
        return {} if self.by_prefix else {"stage_plan": self.stage_plan_dict()}

    def to_dict(self) -> dict[str, Any]:
        return {"patches": list(self.grid), "patch_blocks": self.n_blocks, "patch_ops": self.n_ops,
                "peak_sram_bytes": self.peak_sram_bytes,
                "peak_sram_bytes_excluding_input": self.peak_sram_bytes_excluding_input,
                "macs": self.macs, "mac_overhead": round(self.mac_overhead, 6), **self.stage_plan_field()}


def per_layer(graph: ir.Graph, accounting: str = "separate") -> Plan:
    """The plan with no stage: every op per layer (the profiler's figures, ``accounting``)."""
    prof = profile(graph, accounting)
    segments = tuple(Segment(start=i, stop=i + 1, peak=layer.memory_bytes, macs=layer.macs)
                     for i, layer in enumerate(prof.layers))
    return Plan(graph, segments, prof.peak_sram_per_layer_bytes, prof.peak_sram_per_layer_bytes_excluding_input,
                prof.macs, 0.0)


def single_stage(graph: ir.Graph, grid: tuple[int, int], n_blocks: int | None = None, n_ops: int | None = None,
                 mac_metric: str = "exact", accounting: str = "separate") -> Plan:
    """One patch stage over the first ``n_blocks`` blocks or ``n_ops`` ops on ``grid`` (``regions.schedule``;
    ``ScheduleError`` when it cannot be built), the other ops per layer; its MACs by ``mac_metric``."""
    s = regions.schedule(graph, tuple(grid), n_blocks=n_blocks, n_ops=n_ops, accounting=accounting)
    exact = mac_metric == "exact"
    macs = s.macs_patched_exact if exact else s.macs_patched_padded
    stage = Segment(start=s.stage[0], stop=s.stage[-1] + 1, grid=s.grid, peak=s.stage_peak_bytes,
                    macs=s.stage_macs_patched_exact if exact else s.stage_macs_patched_padded,
                    pooled=s.pool is not None, n_blocks=n_blocks, n_ops=n_ops, passes=s.passes.count)
    in_stage = set(s.stage)
    rest = [Segment(start=i, stop=i + 1, peak=s.step_memory[i], macs=ir.op_macs(graph, op))
            for i, op in enumerate(graph.ops) if i not in in_stage]
    p = Plan(graph, tuple(sorted(rest + [stage], key=lambda seg: seg.start)), s.peak_sram_bytes,
             s.peak_sram_bytes_excluding_input, macs, macs / s.macs - 1.0 if s.macs else 0.0)
    p._schedules[0] = s
    return p


def chain(graph: ir.Graph, segments: tuple[Segment, ...], image: str) -> Plan:
    """The plan of ``segments`` (a chain over the graph's ops, their peaks in image mode ``image``): its peak the
    largest segment's, its MACs their sum (exact)."""
    peak = max(s.peak for s in segments)
    macs = sum(s.macs for s in segments)
    base = sum(ir.op_macs(graph, op) for op in graph.ops)
    return Plan(graph, tuple(segments), peak, peak, macs, macs / base - 1.0 if base else 0.0, image)
