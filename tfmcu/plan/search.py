"""The one schedule search: the candidate plans of a graph, and a budgeted search over a cost function.

* ``candidates(graph, options)``: plans (``tfmcu.plan.plans.Plan``), the per-layer plan first, then every single
  patch stage (the first n blocks, or the first k ops with ``unit="ops"``) x grid (``ph x pw`` with ph, pw from
  ``patch_options``, not both 1; square grids only unless ``rectangular``) that the scheduler can build, with its
  MACs (exact or padded) and its analytic peak; with ``max_stages`` > 1 or None (any number), then the plans of
  several stages anywhere (``tfmcu.plan.stage_plans.plan_candidates``: fronts of the peak plus the cost function's
  estimate of TFLM's tail, ``segment_tail``, where it has one). Candidates above ``max_mac_overhead`` are left out
  here, once, for every cost function.
* A cost function (``CostModel``) prices a plan in bytes: ``evaluate`` builds what it needs and returns an
  ``Evaluation``; ``lower_bound`` is a cheap floor under that cost, used to skip candidates that cannot win.
  ``AnalyticCost`` (here) is the analytic peak (``tfmcu.plan.regions``); ``tfmcu.stage.builtin.BuiltinArenaCost``
  the predicted TFLM arena of the builtin rewrite (one variant per border treatment);
  ``tfmcu.stage.cost.CustomArenaCost`` the predicted TFLM arena of custom mode (with the TFMCU_PATCH_STAGE
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
* A time budget (``SearchOptions.search_seconds``): once it has run out, no further candidate is evaluated; the search
  ends with the best found so far, ``SearchResult.cut_short`` counts the candidates it did not evaluate, and the
  message says so (a minimum stated then is the smallest found, not a proven one). With a budget, ``"memory"`` (and
  the minimum when nothing fits) evaluates the likeliest candidates first: by the larger of the lower bound and the
  plan's analytic peak (a weak bound, e.g. a deep stage whose caches the configuration chooses, would put it first);
  every candidate is still evaluated or ruled out by its bound, so a search that ends in time finds the same minimum.
* Workers (``SearchOptions.workers``; 0: one per core): forked processes price the candidates the search will look
  at next; the search takes their figures in its own order, so it decides as one process would (same evaluations,
  choice and message; a candidate it rules out by then was priced for nothing). A worker keeps only the figures: the
  chosen and the smallest evaluation are built again here for their ``result``.
* Variants: a cost function evaluates every patched plan in each of its ``variants``, small typed values
  (``Variant``: builtin mode's border treatments, ``tfmcu.stage.builtin.Border``; custom mode's configurations,
  ``tfmcu.stage.cost.CustomOptions``: halo caches, the rest's convolutions in Flash, ...). A variant's ``label``
  names it in JSON reports, its ``phrase`` follows a plan's description.

``Plan``, ``SearchOptions`` and ``Progress`` (defined in ``tfmcu.plan.plans``) are the search's vocabulary, imported
from here too.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from tfmcu.errors import TfmcuError
from tfmcu.graph import ir
from tfmcu.plan.plans import (SEARCH_SECONDS, WIDE_GRIDS, Plan, Progress, SearchOptions, Segment, per_layer,
                              single_stage)
from tfmcu.plan.regions import ScheduleError, largest_prefix, max_stage_blocks
from tfmcu.plan.stage_plans import plan_candidates

__all__ = ["AnalyticCost", "CostModel", "Evaluation", "LATENCY_MAC_WINDOW", "Plan", "Progress", "SEARCH_SECONDS",
           "SearchOptions",
           "SearchResult", "Segment", "Variant", "WIDE_GRIDS", "candidate_for", "candidates", "core_count", "search"]

LATENCY_MAC_WINDOW = 0.02  # objective "latency": candidates up to +2% MACs over the first that fits are evaluated
KB = 1024


# ============================================================================= candidates
def candidates(graph: ir.Graph, options: SearchOptions = SearchOptions(), progress: Progress | None = None,
               tail: Callable[[Segment], int] | None = None) -> list[Plan]:
    """The per-layer plan, then every plan the options allow (see the module docstring); ``progress``: how far the
    stage plans' segments are built (the longest part); ``tail``: a cost function's ``segment_tail``, which the
    stage plans' fronts weigh."""
    options.validate()
    out = [per_layer(graph, options.accounting)]
    if options.unit == "blocks":
        stages = [(n, None) for n in range(1, max_stage_blocks(graph) + 1)]
    else:
        stages = [(None, k) for k in range(1, largest_prefix(graph) + 1) if k < len(graph.ops)]
    opts = sorted(set(options.patch_options))
    grids = ([(a, b) for a in opts for b in opts if max(a, b) > 1] if options.rectangular
             else [(p, p) for p in opts if p > 1])
    for (n, k), grid in itertools.product(stages, grids):
        try:
            p = single_stage(graph, grid, n, k, options.mac_metric, options.accounting)
        except ScheduleError:
            continue
        if p.stages[0].passes > 1 and not options.se_in_stages:
            continue
        if options.max_mac_overhead is not None and p.mac_overhead > options.max_mac_overhead + 1e-12:
            continue
        out.append(p)
    if options.max_stages is None or options.max_stages > 1:
        out += plan_candidates(graph, options, progress, tail)
    return out


def candidate_for(graph: ir.Graph, grid: tuple[int, int], n_blocks: int | None = None, n_ops: int | None = None,
                  mac_metric: str = "exact", accounting: str = "separate") -> Plan:
    """The plan of one given schedule (``grid == (1, 1)``: the per-layer plan)."""
    if tuple(grid) == (1, 1):
        return per_layer(graph, accounting)
    return single_stage(graph, tuple(grid), n_blocks, n_ops, mac_metric, accounting)


# ============================================================================= cost functions
class Variant(Protocol):
    """A configuration a cost function prices every patched plan in (``CostModel.variants``); hashable."""

    @property
    def label(self) -> str:
        """How JSON reports name it."""

    def phrase(self, plan: Plan) -> str:
        """How it reads after ``plan``'s description (" (strips borders)"; "" when nothing of it applies)."""


@dataclass
class Evaluation:
    """A plan (in one variant of the cost function) and its cost in bytes."""

    candidate: Plan
    variant: Variant | None
    cost: int
    result: Any = None  # what the cost function built (e.g. the rewritten model)
    details: dict[str, Any] = field(default_factory=dict)  # the cost function's figures (JSON-able)
    instructions: int | None = None  # predicted instructions per Invoke, when the cost function predicts them

    @property
    def variant_label(self) -> str | None:
        """How reports name its variant (None: no variant)."""
        return None if self.variant is None else self.variant.label

    def describe(self) -> str:
        return self.candidate.describe() + _phrase(self.variant, self.candidate)

    def to_dict(self) -> dict[str, Any]:
        d = {**self.candidate.to_dict(), "variant": self.variant_label, "cost_bytes": self.cost, **self.details}
        if self.instructions is not None:
            d["predicted_instructions"] = self.instructions
        return d


def _phrase(variant: Variant | None, plan: Plan) -> str:
    return "" if variant is None else variant.phrase(plan)


class CostModel(Protocol):
    what: str  # names the cost in messages: "peak", "predicted TFLM arena", ...
    variants: tuple[Variant | None, ...]  # evaluated per patched plan (e.g. border treatments; None: no variant)

    def evaluate(self, candidate: Plan, variant: Variant | None) -> Evaluation:
        """The plan's cost; raises a ``TfmcuError`` when it cannot be built (the search skips it)."""

    def lower_bound(self, candidate: Plan, variant: Variant | None) -> int:
        """A floor under ``evaluate(candidate, variant).cost``, cheap to compute."""

    # Optional: ``variant_macs(candidate, variant) -> int``, the MACs of the plan in that variant when the
    # variant changes them (halo caches); the search orders by it (default: ``candidate.macs``).
    # Optional: ``segment_tail(segment) -> int``, an estimate of the bytes a stage plan's segment adds to the cost
    # beyond its peak (TFLM's persistent tail): the stage plans' fronts are then of peak + tail.


class AnalyticCost:
    """The analytic peak SRAM of the patched model (``tfmcu.plan.regions``)."""

    what = "peak"
    variants: tuple[Variant | None, ...] = (None,)

    def __init__(self, count_input: bool = True):
        self.count_input = count_input

    def evaluate(self, candidate: Plan, variant: Variant | None) -> Evaluation:
        return Evaluation(candidate, None, candidate.peak(self.count_input))

    def lower_bound(self, candidate: Plan, variant: Variant | None) -> int:
        return candidate.peak(self.count_input)


# ============================================================================= the search
@dataclass
class SearchResult:
    chosen: Evaluation | None  # None: nothing fits the budget
    baseline: Evaluation  # the unpatched model
    smallest: Evaluation  # the smallest cost known (the true minimum when nothing fits, or objective "memory")
    evaluated: list[Evaluation]  # in evaluation order, the baseline first
    candidates: list[Plan]
    budget: int | None
    options: SearchOptions
    what: str
    bounded_out: int = 0  # candidates skipped because their lower bound could not win
    failed: list[str] = field(default_factory=list)  # why candidates could not be built (one line each)
    message: str = ""
    cut_short: int = 0  # candidates not evaluated because the time budget (options.search_seconds) ran out
    seconds: float = 0.0  # how long the search took

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
                "failed": len(self.failed), "first_failure": self.failed[0] if self.failed else None,
                "cut_short": self.cut_short, "search_seconds": round(self.seconds, 3)}


# What the forked workers price (set before the pool forks): the cost function, the candidates, the variants
_SHARED: tuple[Any, list[Plan], list[Any]] | None = None


def _failure(e: TfmcuError) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _price(ci: int, vi: int) -> tuple[Evaluation | None, str | None]:
    """A worker's evaluation of candidate ``ci`` in variant ``vi``, without its plan (the parent has it) and what the
    cost function built (the parent builds it again for the evaluations it reports with it)."""
    assert _SHARED is not None
    cost, cands, variants = _SHARED
    try:
        ev = cost.evaluate(cands[ci], variants[vi])
    except TfmcuError as e:
        return None, _failure(e)
    ev.candidate, ev.result = None, None  # type: ignore[assignment]
    return ev, None


def core_count() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Run:
    """Evaluations of one search, each candidate x variant at most once, in the search's order. With ``workers`` > 1,
    forked processes price the candidates the search will look at next (``ahead``); the search takes their figures
    in its own order, so its decisions are those of one process."""

    def __init__(self, cost: CostModel, progress: Progress | None, seconds: float | None = None, workers: int = 1):
        self.cost = cost
        self.progress = progress
        self.start = time.monotonic()
        self.deadline = None if seconds is None else self.start + seconds
        self.done: dict[tuple[int, Variant | None], Evaluation | None] = {}
        self.evaluated: list[Evaluation] = []
        self.failed: list[str] = []
        self.skipped: set[tuple[int, Variant | None]] = set()  # not evaluated: the time budget had run out
        self.workers = workers
        self.cands: list[Plan] = []
        self.index: dict[int, int] = {}
        self.variants = list(cost.variants)
        self.pool: Any = None
        self.pending: dict[tuple[int, Variant | None], Any] = {}  # priced ahead by a worker (AsyncResult)
        self.remote: set[int] = set()  # ids of evaluations a worker priced (without ``result``)

    def candidates(self, cands: list[Plan]) -> list[Plan]:
        """The search's candidates (the workers price them by index)."""
        self.cands, self.index = cands, {id(c): i for i, c in enumerate(cands)}
        return cands

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def ahead(self, items: Iterable[tuple[Plan, Variant | None]]) -> None:
        """Start pricing ``items`` (those the search is likely to evaluate next) in the workers, one in flight per
        worker; ``evaluate`` takes the figures when the search reaches them."""
        if self.workers <= 1 or self._out_of_time():
            return
        for c, v in items:
            if sum(not r.ready() for r in self.pending.values()) >= self.workers:
                return
            key = (id(c), v)
            if key in self.done or key in self.pending or id(c) not in self.index:
                continue
            if self.pool is None:
                global _SHARED
                _SHARED = (self.cost, self.cands, self.variants)
                self.pool = multiprocessing.get_context("fork").Pool(self.workers)
            self.pending[key] = self.pool.apply_async(_price, (self.index[id(c)], self.variants.index(v)))

    def evaluate(self, cand: Plan, variant: Variant | None, n: int = 0, total: int = 0) -> Evaluation | None:
        key = (id(cand), variant)
        if key not in self.done and self.evaluated and self._out_of_time():
            priced = self.pending.get(key)
            if priced is None or not priced.ready():  # (a candidate already priced ahead is still taken)
                self.skipped.add(key)  # (the first evaluation, the baseline, always runs)
                return None
        if key not in self.done:
            if self.progress and total:
                self.progress(n, total, cand.describe() + _phrase(variant, cand))
            priced = self.pending.pop(key, None)
            ev: Evaluation | None = None
            if priced is not None:
                ev, failure = priced.get()
                if ev is None:
                    self.failed.append(failure or "")
                else:
                    ev.candidate = cand
                    self.remote.add(id(ev))
            else:
                try:
                    ev = self.cost.evaluate(cand, variant)
                except TfmcuError as e:  # this candidate cannot be built (an unsupported op, ...)
                    self.failed.append(_failure(e))
            if ev is not None:
                self.evaluated.append(ev)
            self.done[key] = ev
        return self.done[key]

    def built(self, ev: Evaluation | None) -> None:
        """What the cost function built for ``ev`` (a worker priced it without keeping it): built again here."""
        if ev is not None and id(ev) in self.remote:
            ev.result = self.cost.evaluate(ev.candidate, ev.variant).result
            self.remote.discard(id(ev))

    def close(self) -> None:
        global _SHARED
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
        self.pending.clear()
        _SHARED = None


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
    run = _Run(cost, progress, options.search_seconds, options.workers or core_count())  # (the budget counts from here)
    try:
        unpatched = per_layer(graph, options.accounting)
        if options.objective in ("macs", "latency"):  # the model fits as it is: no candidate needs to be built
            baseline = run.evaluate(unpatched, None)
            if baseline is not None and budget is not None and baseline.cost <= budget:
                return _search(options, cost, budget, run.candidates([unpatched]), run)
        tail = getattr(cost, "segment_tail", None)
        cands = run.candidates([unpatched] + candidates(graph, options, progress, tail)[1:])
        return _search(options, cost, budget, cands, run)
    finally:
        run.close()


def _search(options: SearchOptions, cost: CostModel, budget: int | None, cands: list[Plan], run: _Run) -> SearchResult:
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
        if options.search_seconds is None:  # in order of the bound (stable: ties keep the candidates' order)
            order = sorted(todo, key=lambda t: (t[2], t[0].macs))
        else:  # a time budget: the likeliest first, the larger of the bound and the plan's analytic peak (a weak
            # bound, e.g. a deep stage whose caches the configuration chooses, does not reflect the plan's size)
            order = sorted(todo, key=lambda t: (max(t[2], t[0].peak(options.count_input)), t[2], t[0].macs))
        bounded = 0
        for n, (c, v, bound) in enumerate(order):
            if best is not None and bound >= best.cost:
                if options.search_seconds is None:  # ordered by the bound: nothing after this one can win
                    return best, sum(1 for t in order[n:] if (id(t[0]), t[1]) not in run.done)
                bounded += (id(c), v) not in run.done
                continue
            run.ahead((t[0], t[1]) for t in order[n + 1:n + 1 + 8 * run.workers] if best is None or t[2] < best.cost)
            ev = run.evaluate(c, v, n + 1, len(order))
            if ev is not None and eligible(ev) and (best is None or rank(ev) < rank(best)):
                best = ev
        return best, bounded

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
                run.ahead((t[0], t[1]) for t in hopeful[n + 1:n + 1 + 8 * run.workers])
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
    run.built(chosen)
    run.built(smallest)
    result = SearchResult(chosen, baseline, smallest, run.evaluated, cands, budget, options, cost.what, bounded,
                          run.failed, cut_short=len(run.skipped), seconds=time.monotonic() - run.start)
    result.message = _message(result)
    return result


def _message(r: SearchResult) -> str:
    o = r.options
    what, ins = r.what, o.input_phrase
    cap = "" if o.max_mac_overhead is None else f" with MAC overhead <= {o.max_mac_overhead * 100:.0f}%"
    if o.max_latency is not None:
        cap += f" within {o.max_latency:g}x the unpatched model's predicted instructions"
    tried = (f"{len(r.evaluated) - 1} schedules evaluated, {r.bounded_out} ruled out by a lower bound"
             + (f", {len(r.failed)} could not be built (first: {r.failed[0]})" if r.failed else "")
             + (f"; the time budget of {o.search_seconds:g} s cut the search short: {r.cut_short} not evaluated "
                f"(raise --search_seconds to search them)" if r.cut_short else ""))
    if r.chosen is None:
        where = f"fits {_kb(r.budget)}" if r.budget is not None else "is eligible"
        return (f"no schedule {where} ({ins}){cap}; smallest {'found' if r.cut_short else 'achievable'} {what} is "
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
        return f"fits {_kb(r.budget or 0)} ({ins}): {c.describe()}, {figures}" + (f" ({tried})" if r.cut_short else "")
    if o.objective == "latency":
        return f"fastest that fits {_kb(r.budget or 0)} ({ins}): {c.describe()}, {figures} ({tried})"
    return f"smallest {what} ({ins}{cap}): {c.describe()}, {figures} ({tried})"
