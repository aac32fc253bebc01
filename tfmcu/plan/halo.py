"""Halo caching between neighbouring patches (analytic model).

Overlapping patches recompute their halos: the rows (columns) of an intermediate tensor that patch k needs and that
patch k-1 already computed. In raster order (row bands top to bottom, column bands left to right inside a band), a
tensor of the stage may keep

* a **row cache**: the bottom rows of the current row band that the next row band needs, over the tensor's whole
  needed width (filled by every patch of the band);
* a **column cache**: the right columns of the current patch that its right neighbour needs, over the patch's rows.

With a cache along an axis a patch computes only the part of its need that the previous band along that axis did
not cover; what it does not compute, its consumers read from the cache, and what it no longer computes it no longer
needs from its own inputs: the need is walked backwards from the computed ranges (``walk_cached``), with the same
receptive-field rule (``regions.read_range``) and the same separable per-axis walk as ``tfmcu.plan.regions``. The
computed box of a tensor for patch (r, c) is then ``comp_rows[r] x comp_cols[c]`` (the row cache holds the previous
row band over every column a patch of this band needs, the column cache the left neighbour over every row), so MACs
factorise per axis as in ``regions.schedule``.

``halo_caches(schedule, rows=..., cols=...)``: exact stage MACs, per-tensor cache bytes, the stage's peak (stage
outputs + the image when counted + caches, which live for the whole stage, + one patch's working set by the
profiler's alive-tensor rule, its boxes being the needs of the cached walk). No cache at all gives
``regions.schedule``'s exact MACs and peak; caching every intermediate tensor along both axes computes every needed
element once.

Which caches: ``choose_caches`` (under an SRAM budget: fewest MACs that fit), ``smallest_caches`` (the smallest stage
within a whole-model MAC cap), ``select`` (what ``rewrite --halo=none|all|auto|smallest`` uses). ``HaloOptions`` is
that request (mode and MAC cap, with their defaults), checked and interpreted here only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tfmcu.graph import ir
from tfmcu.plan.regions import Passes, PatchSchedule, Range, Read, ScheduleError, held_bytes, read_range

_EMPTY: Range = (0, 0)
HALO_MODES = ("none", "all", "auto", "smallest")
DEFAULT_MAX_MAC_OVERHEAD = 0.05  # halo "smallest": at most +5% MACs over the unpatched model


@dataclass(frozen=True, kw_only=True)
class HaloOptions:
    """The halo caches a rewrite asks for (``rewrite --halo``, ``--halo_max_mac_overhead``; ``select``).

    ``mode``: one of ``HALO_MODES``; ``max_mac_overhead``: mode ``smallest``'s cap on the whole model's MAC overhead
    (a fraction; None: not given, ``DEFAULT_MAX_MAC_OVERHEAD``), refused with any other mode."""

    mode: str = "none"
    max_mac_overhead: float | None = None

    @property
    def mac_cap(self) -> float:
        """The MAC overhead cap ``smallest`` keeps to."""
        return DEFAULT_MAX_MAC_OVERHEAD if self.max_mac_overhead is None else self.max_mac_overhead

    @property
    def caches(self) -> bool:
        """Whether halo caches are asked for at all (any mode but ``none``)."""
        return self.mode != "none"

    def validate(self) -> "HaloOptions":
        """``ScheduleError`` (one line, naming the flag) for a mode or a cap that cannot be used."""
        if self.mode not in HALO_MODES:
            raise ScheduleError(f"--halo={self.mode}: expected one of {', '.join(HALO_MODES)}")
        if self.max_mac_overhead is not None:
            if not 0 <= self.max_mac_overhead < 100:
                raise ScheduleError(f"--halo_max_mac_overhead={self.max_mac_overhead:g}: expected a fraction >= 0 "
                                    f"({DEFAULT_MAX_MAC_OVERHEAD:g}: +{100 * DEFAULT_MAX_MAC_OVERHEAD:g}%)")
            if self.mode != "smallest":
                raise ScheduleError("--halo_max_mac_overhead applies to --halo=smallest only")
        return self


def _len(r: Range) -> int:
    return max(r[1] - r[0], 0)


def _union(a: Range | None, b: Range) -> Range:
    if b[1] <= b[0]:
        return a if a is not None else _EMPTY
    if a is None or a[1] <= a[0]:
        return b
    return (a[0] if a[0] < b[0] else b[0]), (a[1] if a[1] > b[1] else b[1])


@dataclass
class BandNeeds:
    """One band along one axis: per stage tensor, the range needed (computed here or read from a cache), the
    range computed here, and the part of the need taken from the cache."""

    band: Range
    need: dict[str, Range]
    comp: dict[str, Range]
    cached: dict[str, int]  # elements along the axis read from the cache
    reads: dict[tuple[int, int], Read] = field(default_factory=dict)  # (op, input position) -> what it reads


def walk_cached(graph: ir.Graph, idx: Sequence[int], outputs: Sequence[str], inputs: Sequence[str], axis: int,
                bands: Sequence[Range], cached: Iterable[str], passes: Passes = Passes(),
                owns: dict[int, list[Range]] | None = None) -> list[BandNeeds]:
    """The bands in order along ``axis``; tensors in ``cached`` keep what the next band needs. With reductions inside
    the stage (``passes``): an inner reduction reads its own tile of each band (``owns``: the schedule's,
    ``regions.walk_bands``), a whole tensor is read whole (its one pixel)."""
    keep = set(cached) - set(outputs) - set(inputs)
    cover: dict[str, int] = {}  # end of what earlier bands made available (needs grow monotonically)
    ops = [(i, graph.ops[i]) for i in reversed(idx)]
    size = {t: graph.tensors[t].shape[1 + axis] for _, op in ops for t in op.inputs}
    walks = []
    for band in bands:
        need: dict[str, Range] = {t: band for t in outputs}
        comp: dict[str, Range] = {t: band for t in outputs}
        from_cache: dict[str, int] = {}
        reads: dict[tuple[int, int], Read] = {}
        for i, op in ops:
            if i in passes.inner:
                x, own = op.inputs[0], (owns or {})[i][len(walks)]
                reads[(i, 0)] = Read(own[0], own[1], 0, 0)
                need[x] = _union(need.get(x), own)
                continue
            o: Range | None = None
            for t in op.outputs:
                if t not in comp:
                    n = need.get(t, _EMPTY)
                    if t in keep and t in cover and n[1] > n[0]:
                        if n[1] < cover[t]:  # (an inner reduction's own tile behind what earlier bands made: the
                            n = need[t] = (n[0], cover[t])  # cache keeps those rows, its held range never shrinks)
                        start = min(max(n[0], cover[t]), n[1])
                        comp[t], from_cache[t] = (start, n[1]), start - n[0]
                    else:
                        comp[t] = n
                o = _union(o, comp[t])
            if o is None or o[1] <= o[0]:
                continue
            for pos, t in enumerate(op.inputs):
                if t in passes.whole:
                    reads[(i, pos)] = Read(0, 1, 0, 0)
                    continue
                a, b = read_range(graph, op, t, axis, o)
                ca, cb = max(a, 0), min(b, size[t])
                reads[(i, pos)] = Read(ca, cb, ca - a, b - cb)
                need[t] = _union(need.get(t), (ca, cb))
        for t, n in need.items():
            if n[1] > n[0]:
                cover[t] = max(cover.get(t, n[1]), n[1])
        walks.append(BandNeeds(band, need, comp, from_cache, reads))
    return walks


@dataclass
class HaloCaches:
    """A schedule's halo caches (``halo_caches``): the tensors that keep rows / columns for the next band, the
    cached walks, and the stage's exact MACs, cache bytes and peaks with them."""

    schedule: PatchSchedule
    cache_rows: frozenset[str]
    cache_cols: frozenset[str]
    rows: list[BandNeeds]
    cols: list[BandNeeds]
    stage_macs_exact: int  # the stage's MACs with these caches
    row_cache_bytes: dict[str, int] = field(default_factory=dict)
    col_cache_bytes: dict[str, int] = field(default_factory=dict)
    stage_peak_bytes: int = 0  # image counted
    stage_peak_bytes_excluding_input: int = 0
    stage_peak_bytes_streamed: int = 0  # the input streamed: a window of whole input rows per row band

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of the caches and their analytic figures (a rewritten model stores it)."""
        return {"row_caches": sorted(self.cache_rows), "col_caches": sorted(self.cache_cols),
                "row_cache_bytes": self.row_cache_bytes, "col_cache_bytes": self.col_cache_bytes,
                "cache_bytes": self.cache_bytes, "stage_macs_exact": int(self.stage_macs_exact),
                "stage_mac_overhead": round(self.stage_mac_overhead, 6),
                "mac_overhead_exact": round(self.mac_overhead, 6),
                "stage_peak_bytes": int(self.stage_peak_bytes),
                "stage_peak_bytes_excluding_input": int(self.stage_peak_bytes_excluding_input),
                "stage_peak_bytes_streamed": int(self.stage_peak_bytes_streamed)}

    @property
    def cache_bytes(self) -> int:
        return sum(self.row_cache_bytes.values()) + sum(self.col_cache_bytes.values())

    @property
    def stage_mac_overhead(self) -> float:
        s = self.schedule.stage_macs
        return self.stage_macs_exact / s - 1.0 if s else 0.0

    @property
    def mac_overhead(self) -> float:
        """The whole model's MAC overhead with these caches (exact)."""
        s = self.schedule
        return (self.stage_macs_exact - s.stage_macs) / s.macs if s.macs else 0.0

    @property
    def peak_sram_bytes(self) -> int:
        return max(self.stage_peak_bytes, self.schedule.rest_peak_bytes)

    @property
    def peak_sram_bytes_excluding_input(self) -> int:
        return max(self.stage_peak_bytes_excluding_input, self.schedule.rest_peak_bytes_excluding_input)

    @property
    def peak_sram_bytes_streamed(self) -> int:
        return max(self.stage_peak_bytes_streamed, self.schedule.rest_peak_bytes_excluding_input)

    def stage_peak(self, image: str = "counted") -> int:
        """The stage's own peak (no rest of the graph) with the image ``counted``, ``excluded`` or ``streamed``."""
        return {"counted": self.stage_peak_bytes, "excluded": self.stage_peak_bytes_excluding_input,
                "streamed": self.stage_peak_bytes_streamed}[image]

    def peak(self, image: str = "counted") -> int:
        """The peak with the image ``counted`` (in memory, whole), ``excluded`` (one patch's window) or
        ``streamed`` (the executor's streamed run: a window of whole rows per row band)."""
        return {"counted": self.peak_sram_bytes, "excluded": self.peak_sram_bytes_excluding_input,
                "streamed": self.peak_sram_bytes_streamed}[image]


def intermediates(schedule: PatchSchedule) -> list[str]:
    """The stage's tensors that can be cached: produced in the stage, not a stage output."""
    g = schedule.graph
    outs = set(schedule.stage_outputs) | set(schedule.tiles) | schedule.passes.whole
    return [t for i in schedule.tiled for t in g.ops[i].outputs if t not in outs]


def halo_caches(schedule: PatchSchedule, rows: Iterable[str] = (), cols: Iterable[str] = ()) -> HaloCaches:
    """The schedule with row caches for ``rows`` and column caches for ``cols`` (tensor names; see the module
    docstring)."""
    return _Stage(schedule).caches(rows, cols)


@dataclass(frozen=True)
class _AxisNeeds:
    """The cached walk along one axis for one set of cached tensors, and what the figures take from it: per stage
    tensor (``_Stage.names`` order) and band the length needed, and per tensor the elements computed over all bands
    (``comp``), the most read from its cache in a band (``cached``), the longest need (``longest``) and the extent
    of its needs over all bands (``extent``)."""

    walks: list[BandNeeds]
    lengths: Any  # numpy int64 (tensors, bands)
    comp: dict[str, int]
    cached: dict[str, int]
    longest: dict[str, int]
    extent: dict[str, int]


class _Stage:
    """A schedule's halo-cache figures for any choice of caches (``caches``): what does not depend on the choice
    (lifetimes, held tensors, which tensor is alive at which step) is found once, the walk along each axis is kept
    per set of cached tensors along that axis (a row-cache choice does not change the column walk), and the patch
    working sets over every (op, patch) are one matrix product."""

    def __init__(self, schedule: PatchSchedule, walks_kept: int = 256):
        g, idx = schedule.graph, schedule.stage
        if schedule.accounting != "separate":
            raise ScheduleError(f"halo caches are planned with separate accounting (the executor's), not "
                                f"{schedule.accounting!r}")
        self.schedule = schedule
        self.cacheable = set(intermediates(schedule))
        ins, outs = schedule.stage_inputs, schedule.stage_outputs
        self.bands = ([w.band for w in schedule.rows], [w.band for w in schedule.cols])
        # (an op on tiles as often as the passes it runs in; the ops on whole tensors once: ``whole_macs``)
        self.mac_terms = [(g.ops[i].outputs[0], mpp * schedule.passes.runs(i)) for i in schedule.tiled
                          if (mpp := ir.macs_per_output_pixel(g.ops[i]))]
        self.whole_macs = sum(ir.op_macs(g, g.ops[i]) for i in schedule.passes.after)
        life = g.lifetimes()
        produced = {t for i in idx for t in g.ops[i].outputs}
        held = held_bytes(g, idx, ins, produced, life)
        self.out_bytes = (sum(g.tensors[t].nbytes for t in outs) + schedule.accumulator_bytes + schedule.whole_bytes
                          + held.nbytes)
        self.in_bytes = sum(g.tensors[t].nbytes for t in ins if t in g.inputs)
        self.streamed_ins = [t for t in ins if t not in held.whole]
        # per step, the patch's own tensors and its input window (the profiler's alive-tensor rule)
        alive = [[t for t, (a, b) in life.items()
                  if a <= i <= b and (t in produced or t in ins) and t not in outs and t not in held.whole
                  and t not in schedule.passes.whole] for i in idx]
        self.names = sorted({t for ts in alive for t in ts})
        self.per_pixel = {t: g.tensors[t].shape[3] * g.tensors[t].itemsize
                          for t in set(self.names) | set(self.streamed_ins) | self.cacheable}
        col = {t: k for k, t in enumerate(self.names)}
        self.own = np.zeros((len(idx), len(self.names)), np.int64)
        self.window = np.zeros((len(idx), len(self.names)), np.int64)
        for k, ts in enumerate(alive):
            for t in ts:
                (self.window if t in ins else self.own)[k, col[t]] = self.per_pixel[t]
        self.axis = functools.lru_cache(maxsize=walks_kept)(self._axis)

    def _axis(self, axis: int, cached: frozenset[str]) -> _AxisNeeds:
        s = self.schedule
        walks = walk_cached(s.graph, s.tiled, s.tiles, s.stage_inputs, axis, self.bands[axis], cached, s.passes,
                            s.row_owns if axis == 0 else s.col_owns)
        need = np.array([w.need.get(t, _EMPTY) for t in self.names for w in walks], np.int64)
        need = need.reshape(len(self.names), len(walks), 2)
        lengths = np.maximum(need[:, :, 1] - need[:, :, 0], 0)
        some = lengths > 0
        lo = np.where(some, need[:, :, 0], np.iinfo(np.int64).max).min(axis=1)
        hi = np.where(some, need[:, :, 1], np.iinfo(np.int64).min).max(axis=1)
        extent = np.where(some.any(axis=1), np.maximum(hi - lo, 0), 0)
        made = np.array([w.comp[t] for t, _ in self.mac_terms for w in walks], np.int64).reshape(-1, len(walks), 2)
        comp = dict(zip([t for t, _ in self.mac_terms],
                        np.maximum(made[:, :, 1] - made[:, :, 0], 0).sum(axis=1).tolist()))
        most = {t: max([w.cached.get(t, 0) for w in walks], default=0) for t in cached}
        return _AxisNeeds(walks, lengths, comp, most, dict(zip(self.names, lengths.max(axis=1, initial=0).tolist())),
                          dict(zip(self.names, extent.tolist())))

    def caches(self, rows: Iterable[str] = (), cols: Iterable[str] = ()) -> HaloCaches:
        """The caches of ``rows`` and ``cols`` with their walks and figures (``halo_caches``)."""
        rows, cols = list(rows), list(cols)
        for t in rows + cols:
            if t not in self.cacheable:
                raise ScheduleError(f"tensor '{t}' cannot be cached: not an intermediate tensor of the patch stage")
        rows, cols = frozenset(rows), frozenset(cols)
        g, pp = self.schedule.graph, self.per_pixel
        r, c = self.axis(0, rows), self.axis(1, cols)
        macs = sum(mpp * r.comp[t] * c.comp[t] for t, mpp in self.mac_terms) + self.whole_macs
        # a row cache: the rows the next band needs over the columns any patch of the band needs; a column cache:
        # the columns the right neighbour needs over the patch's rows
        row_bytes = {t: r.cached[t] * c.extent.get(t, 0) * pp[t] for t in sorted(rows)}
        col_bytes = {t: c.cached[t] * r.longest.get(t, 0) * pp[t] for t in sorted(cols)}
        caches = sum(row_bytes.values()) + sum(col_bytes.values())
        # one patch's box of every tensor: rows x cols, tensors x (row band, column band)
        boxes = (r.lengths[:, :, None] * c.lengths[:, None, :]).reshape(len(self.names), len(r.walks) * len(c.walks))
        own = self.own @ boxes  # (step, patch): the patch's own tensors
        own_most = int(own.max(initial=0))
        with_window = int((own + self.window @ boxes).max(initial=0))
        peak_in = self.out_bytes + self.in_bytes + caches + own_most
        peak_x = self.out_bytes + caches + with_window
        # Streamed (tfmcu_stage_run_streamed): the row window (the most input rows a band reads, whole rows) beside
        # the largest patch working set.
        row_window = sum(r.longest.get(t, 0) * g.tensors[t].shape[2] * pp[t] for t in self.streamed_ins)
        peak_s = self.out_bytes + caches + own_most + row_window
        if self.schedule.passes.count > 1:  # each pass reads the input again: a stage of passes holds it whole
            peak_s = peak_in
        return HaloCaches(self.schedule, rows, cols, r.walks, c.walks, macs, row_bytes, col_bytes, peak_in, peak_x,
                          peak_s)


def _image(count_input: bool | str) -> str:
    """``count_input`` as a ``HaloCaches.peak`` image mode: a mode name as is, True "counted", False "excluded"."""
    return count_input if isinstance(count_input, str) else ("counted" if count_input else "excluded")


def _caches_of(stage: _Stage, opts: Iterable[tuple[str, str]]) -> HaloCaches:
    """The caches of the (tensor, "rows" | "cols") options ``opts``."""
    opts = list(opts)
    return stage.caches([t for t, a in opts if a == "rows"], [t for t, a in opts if a == "cols"])


def choose_caches(schedule: PatchSchedule, budget: int | None, count_input: bool | str = True) -> HaloCaches:
    """The caches to keep under an SRAM budget (analytic peak, image counted unless ``count_input`` is off;
    ``"streamed"``: the executor's streamed input):
    every intermediate tensor cached along both axes when that fits; else caches are dropped one at a time, the one
    that frees the most peak bytes per MAC it adds first, until the caches fit; then dropped ones that still fit are
    taken back, the largest MAC saving first. ``ScheduleError`` when even the recompute schedule does not fit."""
    inter = intermediates(schedule)
    kept = {(t, axis) for t in inter for axis in ("rows", "cols")}
    stage = _Stage(schedule)

    def build(opts: set[tuple[str, str]]) -> HaloCaches:
        return _caches_of(stage, opts)

    image = _image(count_input)

    def peak(h: HaloCaches) -> int:
        return h.peak(image)

    if budget is not None and peak(build(set())) > budget:
        raise ScheduleError(f"the recompute schedule needs {peak(build(set())):,} B > budget {budget:,} B: no halo "
                            f"cache can fit")
    h = build(kept)
    while budget is not None and peak(h) > budget:
        trials = []
        for opt in sorted(kept):
            h2 = build(kept - {opt})
            freed, added = peak(h) - peak(h2), h2.stage_macs_exact - h.stage_macs_exact
            trials.append((-freed / max(added, 1), added, opt, h2))
        _, _, opt, h = min(trials, key=lambda x: x[:3])
        kept.discard(opt)
    if budget is not None:
        dropped = {(t, a) for t in inter for a in ("rows", "cols")} - kept
        for opt in sorted(dropped, key=lambda o: (build(kept | {o}).stage_macs_exact, o)):
            h2 = build(kept | {opt})
            if peak(h2) <= budget and h2.stage_macs_exact < h.stage_macs_exact:
                kept.add(opt)
                h = h2
    return h


def smallest_caches(schedule: PatchSchedule, max_mac_overhead: float = DEFAULT_MAX_MAC_OVERHEAD,
                    count_input: bool | str = True) -> HaloCaches:
    """The caches that make the STAGE's analytic peak smallest while the whole model's exact MAC overhead stays
    within ``max_mac_overhead`` (e.g. 0.05: at most +5% MACs over the unpatched model). Starting from every cache, drops
    one cache at a time, the one that frees the most stage-peak bytes per MAC it adds first, down to no cache; the
    choice taken is the smallest stage peak on that path within the MAC cap (fewest MACs among equals); then single
    caches are dropped or taken back while that lowers the peak (or, at the same peak, the MACs) within the cap.

    The stage's peak and not the whole graph's: the rest of the graph is the same for every cache choice, and TFLM
    plans it (in place: below its analytic peak), so the measured head is the larger of the two. ``ScheduleError``
    when not even every cache keeps the MACs within the cap."""
    image = _image(count_input)
    inter = intermediates(schedule)
    everything = {(t, axis) for t in inter for axis in ("rows", "cols")}
    stage = _Stage(schedule)
    # (stage peak, MACs) and the MAC overhead of each choice tried: the local search meets the greedy path's choices
    # again; the caches themselves are built again for the one returned only
    tried: dict[frozenset[tuple[str, str]], tuple[tuple[int, int], float]] = {}

    def measure(opts: set[tuple[str, str]]) -> tuple[tuple[int, int], float]:
        key = frozenset(opts)
        if key not in tried:
            h = _caches_of(stage, opts)
            tried[key] = (h.stage_peak(image), h.stage_macs_exact), h.mac_overhead
        return tried[key]

    kept = set(everything)
    h, overhead = measure(kept)
    if overhead > max_mac_overhead + 1e-12:
        raise ScheduleError(f"every halo cached still adds {100 * overhead:.1f}% MACs > the cap "
                            f"{100 * max_mac_overhead:.1f}%")
    best, best_kept = h, set(kept)
    while kept:
        trials = []
        for opt in sorted(kept):
            h2, overhead2 = measure(kept - {opt})
            freed, added = h[0] - h2[0], h2[1] - h[1]
            trials.append((-freed / max(added, 1), added, opt, h2, overhead2))
        _, _, opt, h, overhead = min(trials, key=lambda x: x[:3])
        kept.discard(opt)
        if overhead <= max_mac_overhead + 1e-12 and h < best:
            best, best_kept = h, set(kept)
    improved = True
    while improved:  # local search: one cache dropped or taken back at a time while that helps within the cap
        improved = False
        for opt in sorted(everything):
            opts = best_kept ^ {opt}
            h2, overhead2 = measure(opts)
            if overhead2 <= max_mac_overhead + 1e-12 and h2 < best:
                best, best_kept, improved = h2, opts, True
    return _caches_of(stage, best_kept)


def select(schedule: PatchSchedule, options: HaloOptions, budget: int | None = None,
           count_input: bool | str = True) -> HaloCaches | None:
    """The halo caches a rewrite uses (``options.mode``): ``none`` (recompute every halo: None), ``all`` (every
    intermediate tensor along both axes), ``auto`` (``choose_caches`` under ``budget``, analytic bytes; without a
    budget, at the recompute schedule's own analytic peak: fewer MACs for no more memory) or ``smallest``
    (``smallest_caches``: the smallest stage within ``options.mac_cap`` of the unpatched model's MACs)."""
    mode = options.validate().mode
    if mode == "none":
        return None
    if mode == "all":
        inter = intermediates(schedule)
        return halo_caches(schedule, inter, inter)
    if mode == "smallest":
        return smallest_caches(schedule, options.mac_cap, count_input)
    if budget is None:
        image = _image(count_input)
        budget = halo_caches(schedule).peak(image)
    return choose_caches(schedule, budget, count_input)
