"""The one schedule search: the candidate schedules of a graph, and a budgeted search over a cost function.

* ``candidates(graph, options)``: the unpatched model first, then every patch stage (the first n blocks, or the
  first k ops with ``unit="ops"``) x grid (``ph x pw`` with ph, pw from ``patch_options``, not both 1; square
  grids only unless ``rectangular``) that the scheduler can build, with its MACs (exact or padded) and its analytic
  peak. Candidates above ``max_mac_overhead`` are left out here, once, for every cost function.
* A cost function (``CostModel``) prices a candidate in bytes: ``evaluate`` builds what it needs and returns an
  ``Evaluation``; ``lower_bound`` is a cheap floor under that cost, used to skip candidates that cannot win.
  ``AnalyticCost`` (here) is the analytic peak (``tfmcu.plan.regions``); ``tfmcu.stage.builtin.BuiltinArenaCost``
  the predicted TFLM arena of the builtin rewrite (one variant per border treatment);
  ``tfmcu.stage.custom.CustomArenaCost`` the predicted TFLM arena of custom mode (with the TFMCU_PATCH_STAGE
  kernel's op data and scratch). Every cost function counts the input image or not (``count_input``).
* ``search(graph, cost, budget, options)`` -> ``SearchResult``, for three objectives:
  - ``"macs"``: the least-MACs candidate whose cost fits ``budget`` (candidates are evaluated in order of MACs, so
    the first that fits wins; the unpatched model wins if it fits). A patched candidate must also cost less than
    the unpatched model.
  - ``"memory"``: the smallest cost (branch and bound: candidates in order of their lower bound, until the bound
    reaches the best cost found); checked against ``budget`` when one is given.
  - ``"latency"``: the fewest predicted instructions whose cost fits ``budget`` (the unpatched model when it fits:
    it is the per-layer reference). Candidates are evaluated in order of their MACs (``cost.variant_macs`` where
    the variant changes them, e.g. halo caches); the search stops past ``LATENCY_MAC_WINDOW`` (2%) more MACs than the
    first candidate that fits, and keeps the one with the fewest predicted instructions.
  Objectives ``"memory"`` and ``"latency"`` take ``max_latency``: only candidates whose predicted instructions are
  at most that factor of the unpatched model's are eligible. Both need a cost function that predicts instructions
  (``Evaluation.instructions``; e.g. ``CustomArenaCost`` given a latency predictor).
  When nothing fits, the search goes on until the smallest achievable cost is known (every candidate evaluated or
  ruled out by its lower bound), so the message states a true minimum (within ``max_latency`` when given).
* Variants: a cost function evaluates every patched candidate in each of its ``variants`` (builtin mode: border
  treatments; custom mode: configurations such as halo caches or the rest's convolutions in Flash). A variant's
  label is what reports print.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from tfmcu.errors import TfmcuError
from tfmcu.graph import ir
from tfmcu.plan.halo import HaloPlan, intermediates, plan_halo
from tfmcu.plan.latency import stage_overheads
from tfmcu.plan.profiler import ACCOUNTINGS, profile, step_memory
from tfmcu.plan.regions import (PatchSchedule, ScheduleError, check_stage, is_global_pool, largest_prefix,
                                max_stage_blocks, plan)

OBJECTIVES = ("macs", "memory", "latency")
LATENCY_MAC_WINDOW = 0.02  # objective "latency": candidates up to +2% MACs over the first that fits are evaluated
UNITS = ("blocks", "ops")
MAC_METRICS = ("exact", "padded")
KB = 1024
Progress = Callable[[int, int, str], None]


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
    max_stages: int = 1  # > 1: stage plans (several patch stages anywhere: ``stage_plans``) are candidates too

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
        if not isinstance(self.max_stages, int) or self.max_stages < 1:
            raise ScheduleError(f"--max_stages={self.max_stages}: expected an integer >= 1 (1: one patch stage)")
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


# ============================================================================= candidates
@dataclass
class Candidate:
    grid: tuple[int, int]
    n_blocks: int | None
    n_ops: int | None
    peak_sram_bytes: int  # analytic, input image counted
    peak_sram_bytes_excluding_input: int
    macs: int  # by the search's MAC metric
    mac_overhead: float
    schedule: PatchSchedule | None = None  # None: the unpatched model (or a stage plan)
    plan: StagePlan | None = None  # several patch stages (``stage_plans``; ``schedule`` None)

    @property
    def patched(self) -> bool:
        return self.schedule is not None or self.plan is not None

    @property
    def cells(self) -> int:
        return self.grid[0] * self.grid[1]

    def peak(self, count_input: bool = True) -> int:
        return self.peak_sram_bytes if count_input else self.peak_sram_bytes_excluding_input

    def describe(self) -> str:
        if self.plan is not None:
            return self.plan.describe()
        if self.schedule is None:
            return "no patching (per-layer)"
        stage = f"{self.n_blocks} blocks" if self.n_blocks is not None else f"{self.n_ops} ops"
        return f"{self.grid[0]}x{self.grid[1]} patches over the first {stage}"

    def to_dict(self) -> dict[str, Any]:
        d = {"patches": list(self.grid), "patch_blocks": self.n_blocks, "patch_ops": self.n_ops,
             "peak_sram_bytes": self.peak_sram_bytes,
             "peak_sram_bytes_excluding_input": self.peak_sram_bytes_excluding_input,
             "macs": self.macs, "mac_overhead": round(self.mac_overhead, 6)}
        if self.plan is not None:
            d["stage_plan"] = self.plan.to_dict()
        return d


def candidates(graph: ir.Graph, options: SearchOptions = SearchOptions()) -> list[Candidate]:
    """The unpatched model, then every schedule the options allow (see the module docstring)."""
    options.validate()
    prof = profile(graph, options.accounting)
    out = [Candidate((1, 1), None, None, prof.peak_sram_per_layer_bytes,
                     prof.peak_sram_per_layer_bytes_excluding_input, prof.macs, 0.0)]
    if options.unit == "blocks":
        stages = [(n, None) for n in range(1, max_stage_blocks(graph) + 1)]
    else:
        stages = [(None, k) for k in range(1, largest_prefix(graph) + 1) if k < len(graph.ops)]
    opts = sorted(set(options.patch_options))
    grids = ([(a, b) for a in opts for b in opts if max(a, b) > 1] if options.rectangular
             else [(p, p) for p in opts if p > 1])
    for (n, k), grid in itertools.product(stages, grids):
        try:
            s = plan(graph, grid, n_blocks=n, n_ops=k, accounting=options.accounting)
        except ScheduleError:
            continue
        macs = s.macs_patched_exact if options.mac_metric == "exact" else s.macs_patched_padded
        overhead = macs / s.macs - 1.0 if s.macs else 0.0
        if options.max_mac_overhead is not None and overhead > options.max_mac_overhead + 1e-12:
            continue
        out.append(Candidate(grid, n, k, s.peak_sram_bytes, s.peak_sram_bytes_excluding_input, macs, overhead, s))
    if options.max_stages > 1:
        out += plan_candidates(graph, options)
    return out


MAX_PLANS_PER_FRONT = 12  # stage plans a search evaluates per Pareto front (its smallest half, the rest spread)
# With a latency cap, plans whose estimated instructions (``segment_instructions``) exceed the cap by more than this
# factor are not priced (the estimate came 0.3-2% above the latency predictor along MobileNetV2-0.35-144's front)
PLAN_ESTIMATE_SLACK = 1.03


def plan_candidates(graph: ir.Graph, options: SearchOptions) -> list[Candidate]:
    """Stage plans as candidates: the analytic Pareto fronts (``stage_plans``, at most ``options.max_stages``
    stages; the image counted or excluded as ``count_input`` says, and streamed) without what the single-stage
    candidates already are (one stage at the first op), at most ``MAX_PLANS_PER_FRONT`` of each spread over it,
    within ``max_mac_overhead``. A stage may end into the global average pool (summed patch by patch). The fronts
    weigh the peak against the segments' instruction estimate; with ``max_latency``, only plans whose estimate is
    within it (``PLAN_ESTIMATE_SLACK``) are candidates, the smallest first."""
    images = ["counted" if options.count_input else "excluded"] + (["streamed"] if options.accounting == "separate"
                                                                   else [])
    seen: set[tuple[Any, ...]] = set()
    out = []
    for image in images:
        segs = stage_segments(graph, options, image)
        front = [p for p in pareto_plans(graph, segs, options, options.max_stages, image, by="instructions")
                 if p.stages and not (len(p.stages) == 1 and p.stages[0].start == 0)]
        if options.max_latency is not None:  # the plans whose estimate is near the cap (the predictor decides)
            per_layer = pareto_plans(graph, segs, options, 0, image, by="instructions")[0].instructions
            front = [p for p in front if p.instructions <= options.max_latency * PLAN_ESTIMATE_SLACK * per_layer]
        if len(front) > MAX_PLANS_PER_FRONT:  # the smallest half, and the other half spread over the rest
            low, rest = front[:MAX_PLANS_PER_FRONT // 2], front[MAX_PLANS_PER_FRONT // 2:]
            n = MAX_PLANS_PER_FRONT - len(low)
            step = (len(rest) - 1) / (n - 1)
            front = low + [rest[round(i * step)] for i in range(n)]
        for p in front:
            key = tuple((s.start, s.stop, s.grid, s.variant) for s in p.stages)
            if key in seen:
                continue
            seen.add(key)
            out.append(Candidate(p.stages[0].grid or (1, 1), None, None, p.peak, p.peak, p.macs, p.mac_overhead,
                                 plan=p))
    return out


def candidate_for(graph: ir.Graph, grid: tuple[int, int], n_blocks: int | None = None, n_ops: int | None = None,
                  mac_metric: str = "exact", accounting: str = "separate") -> Candidate:
    """The candidate of one given schedule (``grid == (1, 1)``: the unpatched model)."""
    if tuple(grid) == (1, 1):
        return candidates(graph, SearchOptions(patch_options=(1,), accounting=accounting))[0]
    s = plan(graph, tuple(grid), n_blocks=n_blocks, n_ops=n_ops, accounting=accounting)
    macs = s.macs_patched_exact if mac_metric == "exact" else s.macs_patched_padded
    return Candidate(tuple(grid), n_blocks, n_ops, s.peak_sram_bytes, s.peak_sram_bytes_excluding_input, macs,
                     macs / s.macs - 1.0 if s.macs else 0.0, s)


# ============================================================================= cost functions
@dataclass
class Evaluation:
    """A candidate (in one variant of the cost function) and its cost in bytes."""

    candidate: Candidate
    variant: str | None
    cost: int
    result: Any = None  # what the cost function built (e.g. the rewritten model)
    details: dict[str, Any] = field(default_factory=dict)  # the cost function's figures (JSON-able)
    instructions: int | None = None  # predicted instructions per Invoke, when the cost function predicts them

    def describe(self) -> str:
        variant = self.variant
        if self.candidate.plan is not None and variant:  # a plan's halo caches are its stages' own
            variant = ", ".join(p for p in variant.split(", ") if not p.startswith("halo ")) or None
        return self.candidate.describe() + _variant_phrase(variant)

    def to_dict(self) -> dict[str, Any]:
        d = {**self.candidate.to_dict(), "variant": self.variant, "cost_bytes": self.cost, **self.details}
        if self.instructions is not None:
            d["predicted_instructions"] = self.instructions
        return d


def _variant_phrase(variant: str | None) -> str:
    """How a variant reads after a candidate: builtin mode's border treatments are single words."""
    if not variant:
        return ""
    return f" ({variant})" if " " in variant else f" ({variant} borders)"


class CostModel(Protocol):
    what: str  # names the cost in messages: "peak", "predicted TFLM arena", ...
    variants: tuple[str | None, ...]  # evaluated per patched candidate (e.g. border treatments)

    def evaluate(self, candidate: Candidate, variant: str | None) -> Evaluation:
        """The candidate's cost; raises a ``TfmcuError`` when it cannot be built (the search skips it)."""

    def lower_bound(self, candidate: Candidate, variant: str | None) -> int:
        """A floor under ``evaluate(candidate, variant).cost``, cheap to compute."""

    # Optional: ``variant_macs(candidate, variant) -> int``, the MACs of the candidate in that variant when the
    # variant changes them (halo caches); the search orders by it (default: ``candidate.macs``).


class AnalyticCost:
    """The analytic peak SRAM of the patched model (``tfmcu.plan.regions``)."""

    what = "peak"
    variants: tuple[str | None, ...] = (None,)

    def __init__(self, count_input: bool = True):
        self.count_input = count_input

    def evaluate(self, candidate: Candidate, variant: str | None) -> Evaluation:
        return Evaluation(candidate, None, candidate.peak(self.count_input))

    def lower_bound(self, candidate: Candidate, variant: str | None) -> int:
        return candidate.peak(self.count_input)


# ============================================================================= the search
@dataclass
class SearchResult:
    chosen: Evaluation | None  # None: nothing fits the budget
    baseline: Evaluation  # the unpatched model
    smallest: Evaluation  # the smallest cost known (the true minimum when nothing fits, or objective "memory")
    evaluated: list[Evaluation]  # in evaluation order, the baseline first
    candidates: list[Candidate]
    budget: int | None
    options: SearchOptions
    what: str
    bounded_out: int = 0  # candidates skipped because their lower bound could not win
    failed: list[str] = field(default_factory=list)  # why candidates could not be built (one line each)
    message: str = ""

    @property
    def feasible(self) -> bool:
        return self.chosen is not None

    @property
    def patched(self) -> bool:
        return self.chosen is not None and self.chosen.candidate.patched

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.options.objective, "cost": self.what, "budget_bytes": self.budget,
                "count_input": self.options.count_input, "feasible": self.feasible, "message": self.message,
                "chosen": self.chosen.to_dict() if self.chosen else None, "smallest": self.smallest.to_dict(),
                "evaluated": [e.to_dict() for e in self.evaluated], "bounded_out": self.bounded_out,
                "failed": len(self.failed), "first_failure": self.failed[0] if self.failed else None}


class _Run:
    """Evaluations of one search, each candidate x variant at most once."""

    def __init__(self, cost: CostModel, progress: Progress | None):
        self.cost = cost
        self.progress = progress
        self.done: dict[tuple[int, str | None], Evaluation | None] = {}
        self.evaluated: list[Evaluation] = []
        self.failed: list[str] = []

    def evaluate(self, cand: Candidate, variant: str | None, n: int = 0, total: int = 0) -> Evaluation | None:
        key = (id(cand), variant)
        if key not in self.done:
            if self.progress and total:
                self.progress(n, total, cand.describe() + _variant_phrase(variant))
            try:
                ev: Evaluation | None = self.cost.evaluate(cand, variant)
            except TfmcuError as e:  # this candidate cannot be built (an unsupported op, ...)
                self.failed.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
                ev = None
            if ev is not None:
                self.evaluated.append(ev)
            self.done[key] = ev
        return self.done[key]


def _kb(n: int) -> str:
    return f"{n / KB:.1f} kB"


def search(graph: ir.Graph, cost: CostModel, budget: int | None, options: SearchOptions = SearchOptions(),
           progress: Progress | None = None) -> SearchResult:
    """Search the candidates of ``graph`` for ``options.objective`` under ``budget`` bytes (see the module
    docstring)."""
    options.validate()
    if options.objective in ("macs", "latency") and budget is None:
        raise ScheduleError(f"the {'least-MACs' if options.objective == 'macs' else 'fastest'} objective needs an "
                            f"SRAM budget")
    cands = candidates(graph, options)
    run = _Run(cost, progress)
    baseline = run.evaluate(cands[0], None)
    if baseline is None:
        raise ScheduleError(f"the unpatched model cannot be evaluated: {run.failed[0]}")
    timed = options.objective == "latency" or options.max_latency is not None
    if timed and baseline.instructions is None:
        raise ScheduleError(f"objective {options.objective!r}"
                            + (" with max_latency" if options.max_latency is not None else "")
                            + f" needs a cost function that predicts instructions ({cost.what} does not)")
    limit = None if options.max_latency is None else options.max_latency * (baseline.instructions or 0)

    def eligible(ev: Evaluation) -> bool:
        return limit is None or (ev.instructions is not None and ev.instructions <= limit)

    variants = list(cost.variants)
    macs_of = getattr(cost, "variant_macs", None) or (lambda c, v: c.macs)
    todo = [(c, v, cost.lower_bound(c, v)) for c in cands[1:] for v in variants]

    def improves(ev: Evaluation) -> bool:
        return ev.cost < baseline.cost

    def minimum() -> tuple[Evaluation | None, int]:
        """Branch and bound: the smallest eligible cost over all candidates (None: none is eligible), and how many
        were bounded out."""
        def rank(e: Evaluation) -> tuple[int, int]:  # equal costs: the fewer predicted instructions
            return e.cost, e.instructions if e.instructions is not None else 0

        best = min((e for e in run.evaluated if eligible(e)), key=rank, default=None)
        order = sorted(todo, key=lambda t: (t[2], t[0].macs))  # stable: ties keep the candidates' order
        for n, (c, v, bound) in enumerate(order):
            if best is not None and bound >= best.cost:
                return best, sum(1 for t in order[n:] if (id(t[0]), t[1]) not in run.done)
            ev = run.evaluate(c, v, n + 1, len(order))
            if ev is not None and eligible(ev) and (best is None or rank(ev) < rank(best)):
                best = ev
        return best, 0

    chosen: Evaluation | None = None
    bounded = 0
    smallest: Evaluation | None = baseline
    if options.objective in ("macs", "latency"):
        assert budget is not None
        if baseline.cost <= budget:
            chosen = baseline
        else:
            if options.objective == "macs":
                order = sorted(todo, key=lambda t: (macs_of(t[0], t[1]), t[0].cells, variants.index(t[1])))
            else:  # equal MACs (to 0.1%): the smaller lower bound first, the likelier to fit
                base_macs = max(cands[0].macs, 1)
                order = sorted(todo, key=lambda t: (round(macs_of(t[0], t[1]) / base_macs, 3), t[2], t[0].cells,
                                                    variants.index(t[1])))
            hopeful = [t for t in order if t[2] <= budget]
            bounded = len(order) - len(hopeful)
            first_macs = None
            for n, (c, v, _) in enumerate(hopeful):
                if first_macs is not None and macs_of(c, v) > first_macs * (1 + LATENCY_MAC_WINDOW):
                    bounded += len(hopeful) - n
                    break
                ev = run.evaluate(c, v, n + 1, len(hopeful))
                if ev is None or ev.cost > budget or not improves(ev) or not eligible(ev):
                    continue
                if options.objective == "macs":
                    chosen = ev
                    break
                first_macs = macs_of(c, v) if first_macs is None else first_macs
                if chosen is None or (ev.instructions or 0) < (chosen.instructions or 0):
                    chosen = ev
        smallest = min((e for e in run.evaluated if eligible(e)), key=lambda e: e.cost, default=None)
    if options.objective == "memory" or chosen is None:
        smallest, bounded = minimum()
        if options.objective == "memory":
            chosen = smallest if smallest is not None and (budget is None or smallest.cost <= budget) else None
    if smallest is None:  # nothing within max_latency: the smallest of all, for the message
        smallest = min(run.evaluated, key=lambda e: e.cost)
    result = SearchResult(chosen, baseline, smallest, run.evaluated, cands, budget, options, cost.what, bounded,
                          run.failed)
    result.message = _message(result)
    return result


def _message(r: SearchResult) -> str:
    o = r.options
    what, ins = r.what, o.input_phrase
    cap = "" if o.max_mac_overhead is None else f" with MAC overhead <= {o.max_mac_overhead * 100:.0f}%"
    if o.max_latency is not None:
        cap += f" within {o.max_latency:g}x the unpatched model's predicted instructions"
    tried = (f"{len(r.evaluated) - 1} schedules evaluated, {r.bounded_out} ruled out by a lower bound"
             + (f", {len(r.failed)} could not be built (first: {r.failed[0]})" if r.failed else ""))
    if r.chosen is None:
        where = f"fits {_kb(r.budget)}" if r.budget is not None else "is eligible"
        return (f"no schedule {where} ({ins}){cap}; smallest achievable {what} is "
                f"{_kb(r.smallest.cost)} with {r.smallest.describe()} ({tried})")
    c = r.chosen
    speed = ""
    if c.instructions is not None and r.baseline.instructions:
        speed = (f", predicted {c.instructions / 1e6:.1f}M instructions ({c.instructions / r.baseline.instructions:.3f}x "
                 f"the unpatched model's)")
    if not c.candidate.patched:
        if o.objective in ("macs", "latency"):
            return (f"the unpatched model already fits {_kb(r.budget or 0)} ({what} {_kb(c.cost)}, {ins}): "
                    f"no patching needed")
        return f"no schedule has a smaller {what} than the unpatched model ({_kb(c.cost)}, {ins}{cap}): no patching"
    figures = (f"{what} {_kb(c.cost)} (unpatched {_kb(r.baseline.cost)}), MACs "
               f"+{c.details.get('mac_overhead_exact', c.candidate.mac_overhead) * 100:.1f}%{speed}")
    if o.objective == "macs":
        return f"fits {_kb(r.budget or 0)} ({ins}): {c.describe()}, {figures}"
    if o.objective == "latency":
        return f"fastest that fits {_kb(r.budget or 0)} ({ins}): {c.describe()}, {figures} ({tried})"
    return f"smallest {what} ({ins}{cap}): {c.describe()}, {figures} ({tried})"


# ============================================================================= several stages
STAGE_VARIANTS = ("recompute", "halo all")  # how a patch stage of a stage plan treats its halos (analytic)
# the image: held whole (counted), not counted but a patch's window (excluded, msf-CNN's accounting), or fed row by
# row to the first stage (streamed: its row window; an op that reads it per layer holds it whole)
IMAGE_MODES = ("counted", "excluded", "streamed")


@dataclass(frozen=True)
class Segment:
    """Ops ``[start, stop)`` of a stage plan: run per layer (``grid`` None: one op) or as one patch stage on a
    ``grid``; ``pooled``: the stage ends in the global average pool after it (its output is summed patch by patch
    into an int32 accumulator, never held whole)."""

    start: int
    stop: int
    grid: tuple[int, int] | None
    variant: str | None
    peak: int  # analytic bytes while the segment runs (the stage plan's image mode)
    macs: int
    pooled: bool = False
    instructions: float = 0.0  # estimated (``segment_instructions``): what the search weighs against the peak

    @property
    def patched(self) -> bool:
        return self.grid is not None


@dataclass
class StagePlan:
    """Several patch stages and the ops between them per layer: its analytic peak (max over segments) and MACs."""

    graph: ir.Graph
    segments: tuple[Segment, ...]
    image: str

    @property
    def peak(self) -> int:
        return max(s.peak for s in self.segments)

    @property
    def macs(self) -> int:
        return sum(s.macs for s in self.segments)

    @property
    def stages(self) -> list[Segment]:
        return [s for s in self.segments if s.patched]

    @property
    def mac_overhead(self) -> float:
        base = sum(ir.op_macs(self.graph, op) for op in self.graph.ops)
        return self.macs / base - 1.0 if base else 0.0

    @property
    def instructions(self) -> float:
        """The segments' estimated instructions (``segment_instructions``; not TFLM's, not measured)."""
        return sum(s.instructions for s in self.segments)

    def describe(self) -> str:
        if not self.stages:
            return "no patching (per-layer)"
        g = self.graph

        def where(s: Segment) -> str:
            first, last = g.ops[s.start], g.ops[s.stop - 1]
            span = (f"block {first.block}" if first.block == last.block else f"blocks {first.block}-{last.block}")
            return (f"{s.grid[0]}x{s.grid[1]} over {span}" + (f" ({s.variant})" if s.variant else "")
                    + (" into the pool" if s.pooled else ""))
        return f"{len(self.stages)} stage{'s' if len(self.stages) > 1 else ''}: " + "; ".join(
            where(s) for s in self.stages)

    def schedules(self) -> list[tuple[PatchSchedule, HaloPlan | None]]:
        """Each patch stage as the rewriter takes it (``tfmcu.stage.custom.rewrite_stages``): its schedule and its
        halo caches (None: recompute)."""
        out = []
        for s in self.stages:
            sch = plan(self.graph, s.grid, ops=list(range(s.start, s.stop)))  # (a pooled stage ends with the pool)
            inter = intermediates(sch) if s.variant == "halo all" else None
            out.append((sch, None if inter is None else plan_halo(sch, inter, inter)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"describe": self.describe(), "image": self.image, "peak_bytes": self.peak, "macs": self.macs,
                "mac_overhead": round(self.mac_overhead, 6), "stages": len(self.stages),
                "instructions_estimate": int(round(self.instructions)),
                "segments": [{"ops": [s.start, s.stop], "grid": list(s.grid) if s.grid else None,
                              "variant": s.variant, "pooled": s.pooled, "peak_bytes": s.peak, "macs": s.macs}
                             for s in self.segments if s.patched]}


def _global_pool_after(graph: ir.Graph, outputs: list[str]) -> int | None:
    """The op index of a global average pool that is the only consumer of the stage's single output, if any."""
    if len(outputs) != 1:
        return None
    cons = graph.consumers().get(outputs[0], [])
    if len(cons) != 1 or outputs[0] in graph.outputs:
        return None
    return cons[0] if is_global_pool(graph, graph.ops[cons[0]]) else None


def segment_instructions(graph: ir.Graph, ops: list[int], walks: tuple[list[Any], list[Any]] | None,
                         costs: dict[str, float]) -> float:
    """A coarse estimate of a segment's instructions for the stage-plan search (``tfmcu.plan.latency.stage_overheads``'
    calibrated costs): its convolutions' MACs, and for a patch stage (``walks``: its row and column band walks,
    ``need`` or, with halo caches, ``comp``) per patch, per kernel call (a layer on a patch that computes something)
    and per filter element each call of a 1x1 convolution re-reads. Not the latency predictor (which needs the
    rewritten model): only how the search orders plans of equal peak."""
    total = 0.0
    for i in ops:
        op = graph.ops[i]
        macs = ir.op_macs(graph, op)
        out = graph.tensors[op.outputs[0]]
        pixels = out.shape[1] * out.shape[2] if out.is_feature_map else 1
        if walks is not None and op.outputs[0] in walks[0][0].need:
            t = op.outputs[0]
            got = [[_band_len(w, t) for w in axis] for axis in walks]
            calls = sum(1 for r in got[0] if r) * sum(1 for c in got[1] if c)
            macs = ir.macs_per_output_pixel(op) * sum(got[0]) * sum(got[1])
            pixels = sum(got[0]) * sum(got[1])
            weights = op.out_channels * op.in_channels // max(op.groups, 1) if (
                op.type == ir.CONV and tuple(op.kernel) == (1, 1)) else 0
            total += calls * (costs["call"] + weights * costs["weight_call"])
        total += macs * (costs["dw_mac"] if op.type == ir.DEPTHWISE else costs["conv_mac"])
        per_pixel = {ir.CONV: costs["conv_element"] * out.shape[-1] * op.kernel[0] * op.kernel[1],
                     ir.DEPTHWISE: costs["dw_pixel"], ir.ADD: costs["add_element"] * out.shape[-1]}
        total += pixels * per_pixel.get(op.type, 0.0)
    if walks is not None:
        total += len(walks[0]) * len(walks[1]) * costs["patch"]
    return total


def _band_len(w: Any, t: str) -> int:
    r = (getattr(w, "comp", None) or w.need).get(t, (0, 0))
    return max(r[1] - r[0], 0)


def stage_segments(graph: ir.Graph, options: SearchOptions = SearchOptions(), image: str = "counted",
                   progress: Progress | None = None, pooled: bool = True) -> list[Segment]:
    """Every segment a stage plan can use: each op per layer, and every run of whole blocks that can form a patch
    stage x square grid (``options.patch_options``, up to the stage output's side) x ``STAGE_VARIANTS`` (halo caches
    need separate accounting), with the stage's analytic peak (``regions.plan`` / ``halo.plan_halo``; the image as
    ``image`` says) and its exact MACs; a stage whose output only a global average pool reads also as ``pooled``
    (the pool's op in the stage: its input summed patch by patch, never held whole; ``pooled=False``: not)."""
    if image not in IMAGE_MODES:
        raise ScheduleError(f"image {image!r}: expected one of {', '.join(IMAGE_MODES)}")
    blocks = [op.block for op in graph.ops]
    if blocks != sorted(blocks):
        raise ScheduleError("the graph's blocks are not in op order: stage plans need a chain of blocks")
    life = graph.lifetimes()
    if image == "streamed" and options.accounting != "separate":
        raise ScheduleError(f"a streamed image is planned with separate accounting, not {options.accounting!r}")
    mem = step_memory(graph, life, exclude_inputs=image == "excluded", accounting=options.accounting)
    costs = stage_overheads()
    segs = [Segment(i, i + 1, None, None, mem[i], ir.op_macs(graph, op), False,
                    segment_instructions(graph, [i], None, costs)) for i, op in enumerate(graph.ops)]
    starts = [i for i, op in enumerate(graph.ops) if i == 0 or op.block != graph.ops[i - 1].block]
    variants = STAGE_VARIANTS if options.accounting == "separate" else ("recompute",)
    # a stage ends where a block starts, at the end, or before a global average pool (it may end into the pool)
    pools = [i for i, op in enumerate(graph.ops) if op.type == ir.MEAN and i not in starts]
    pairs = [(a, b) for n, a in enumerate(starts) for b in sorted(set(starts[n + 1:] + pools + [len(graph.ops)]))
             if b > a]
    for n, (a, b) in enumerate(pairs):
        if progress:
            progress(n + 1, len(pairs), f"ops {a}-{b - 1}")
        idx = list(range(a, b))
        try:
            _, outs = check_stage(graph, idx)
        except ScheduleError:
            continue
        height, width = graph.tensors[outs[0]].hw
        pool = _global_pool_after(graph, outs)
        # square grids, and row bands (p x 1: one call per band and layer, the fewest per-call costs)
        grids = sorted({(p, p) for p in options.patch_options if 1 < p <= min(height, width)}
                       | {(p, 1) for p in options.patch_options if 1 < p <= height})
        for p in grids:
            try:
                s = plan(graph, p, ops=idx, accounting=options.accounting)
            except ScheduleError:
                continue
            for v in variants:
                walks: Any = (s.rows, s.cols)
                if options.accounting != "separate":
                    peak = s.stage_peak_bytes if image == "counted" else s.stage_peak_bytes_excluding_input
                    macs = s.stage_macs_patched_exact
                else:  # (no cache: regions' figures, and the streamed one)
                    inter = intermediates(s) if v == "halo all" else []
                    h = plan_halo(s, inter, inter)
                    peak, macs, walks = h.stage_peak(image), h.stage_macs_exact, (h.rows, h.cols)
                segs.append(Segment(a, b, p, v, peak, macs, False, segment_instructions(graph, idx, walks, costs)))
            if pool is not None and pooled:  # the same ops and the pool: the output summed into C int32
                try:
                    sp = plan(graph, p, ops=idx + [pool], accounting=options.accounting)
                except ScheduleError:
                    continue
                for v in variants:
                    walks = (sp.rows, sp.cols)
                    if options.accounting != "separate":
                        peak = sp.stage_peak_bytes if image == "counted" else sp.stage_peak_bytes_excluding_input
                        macs = sp.stage_macs_patched_exact
                    else:
                        inter = intermediates(sp) if v == "halo all" else []
                        h = plan_halo(sp, inter, inter)
                        peak, macs, walks = h.stage_peak(image), h.stage_macs_exact, (h.rows, h.cols)
                    segs.append(Segment(a, pool + 1, p, v, peak, macs, True,
                                        segment_instructions(graph, idx + [pool], walks, costs)))
    return segs


def stage_plans(graph: ir.Graph, options: SearchOptions = SearchOptions(), max_stages: int | None = None,
                image: str = "counted", progress: Progress | None = None, pooled: bool = True) -> list[StagePlan]:
    """The Pareto front of stage plans, least peak first (each the fewest MACs at its peak): a dynamic programme over
    the graph's chain of ops (msf-CNN's search over cut points), labels (peak, MACs, stages) kept per cut point and
    extended by every segment that starts there (``stage_segments``); at most ``max_stages`` patch stages (None: any
    number). Candidates above ``options.max_mac_overhead`` are dropped from the front."""
    options.validate()
    if max_stages is not None and max_stages < 0:
        raise ScheduleError(f"--max_stages={max_stages}: expected >= 0")
    return pareto_plans(graph, stage_segments(graph, options, image, progress, pooled), options, max_stages, image)


def pareto_plans(graph: ir.Graph, segs: list[Segment], options: SearchOptions = SearchOptions(),
                 max_stages: int | None = None, image: str = "counted", by: str = "macs") -> list[StagePlan]:
    """``stage_plans``' dynamic programme over given segments (``stage_segments``: computed once for several
    ``max_stages``); ``by``: the cost weighed against the peak, ``macs`` (exact) or ``instructions`` (the
    segments' estimate: per-call and per-patch costs too)."""
    if by not in ("macs", "instructions"):
        raise ScheduleError(f"stage plans by {by!r}: expected macs or instructions")
    by_start: dict[int, list[Segment]] = {}
    for s in segs:
        by_start.setdefault(s.start, []).append(s)
    n = len(graph.ops)
    # a label: (peak, cost, MACs, stages, segments); per cut point only labels no other beats on all four (the MACs
    # for the MAC cap when the cost is the instruction estimate; with cost = MACs the two are one criterion)
    Label = tuple[int, float, int, int, tuple[Segment, ...]]
    labels: list[list[Label]] = [[] for _ in range(n + 1)]
    labels[0] = [(0, 0.0, 0, 0, ())]

    def beats(a: Label, b: Label) -> bool:
        return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2] and a[3] <= b[3]

    def add(at: int, lab: Label) -> None:
        kept = labels[at]
        if any(beats(k, lab) for k in kept):
            return
        labels[at] = [k for k in kept if not beats(lab, k)] + [lab]

    for at in range(n):
        for peak, cost, macs, stages, path in labels[at]:
            for s in by_start.get(at, []):
                k = stages + s.patched
                if max_stages is not None and k > max_stages:
                    continue
                add(s.stop, (max(peak, s.peak), cost + (s.macs if by == "macs" else s.instructions), macs + s.macs,
                             k, path + (s,)))
    final = sorted(labels[n], key=lambda lab: (lab[0], lab[1]))
    front: list[StagePlan] = []
    least = None  # the cost of the last plan kept
    for peak, cost, _, _, path in final:
        if least is not None and cost >= least:
            continue
        p = StagePlan(graph, path, image)
        if options.max_mac_overhead is not None and p.mac_overhead > options.max_mac_overhead + 1e-12:
            continue
        front.append(p)
        least = cost
    return front
