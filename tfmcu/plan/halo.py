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

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from tfmcu.graph import ir
from tfmcu.plan.regions import PatchSchedule, Range, Read, ScheduleError, held_bytes, read_range

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
    if _len(b) == 0:
        return a if a is not None else _EMPTY
    if a is None or _len(a) == 0:
        return b
    return min(a[0], b[0]), max(a[1], b[1])


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
                bands: Sequence[Range], cached: Iterable[str]) -> list[BandNeeds]:
    """The bands in order along ``axis``; tensors in ``cached`` keep what the next band needs."""
    keep = set(cached) - set(outputs) - set(inputs)
    cover: dict[str, int] = {}  # end of what earlier bands made available (needs grow monotonically)
    walks = []
    for band in bands:
        need: dict[str, Range] = {t: band for t in outputs}
        comp: dict[str, Range] = {t: band for t in outputs}
        from_cache: dict[str, int] = {}
        reads: dict[tuple[int, int], Read] = {}
        for i in reversed(idx):
            op = graph.ops[i]
            for t in op.outputs:
                if t in comp:
                    continue
                n = need.get(t, _EMPTY)
                if t in keep and t in cover and _len(n):
                    start = min(max(n[0], cover[t]), n[1])
                    comp[t], from_cache[t] = (start, n[1]), start - n[0]
                else:
                    comp[t] = n
            o: Range | None = None
            for t in op.outputs:
                o = _union(o, comp[t])
            if o is None or _len(o) == 0:
                continue
            for pos, t in enumerate(op.inputs):
                a, b = read_range(graph, op, t, axis, o)
                ca, cb = max(a, 0), min(b, graph.tensors[t].shape[1 + axis])
                reads[(i, pos)] = Read(ca, cb, ca - a, b - cb)
                need[t] = _union(need.get(t), (ca, cb))
        for t, n in need.items():
            if _len(n):
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
    outs = set(schedule.stage_outputs) | set(schedule.tiles)
    return [t for i in schedule.tiled for t in g.ops[i].outputs if t not in outs]


def halo_caches(schedule: PatchSchedule, rows: Iterable[str] = (), cols: Iterable[str] = ()) -> HaloCaches:
    """The schedule with row caches for ``rows`` and column caches for ``cols`` (tensor names; see the module
    docstring)."""
    g, idx = schedule.graph, schedule.stage
    if schedule.accounting != "separate":
        raise ScheduleError(f"halo caches are planned with separate accounting (the executor's), not "
                            f"{schedule.accounting!r}")
    ok = set(intermediates(schedule))
    for t in list(rows) + list(cols):
        if t not in ok:
            raise ScheduleError(f"tensor '{t}' cannot be cached: not an intermediate tensor of the patch stage")
    rows, cols = frozenset(rows), frozenset(cols)
    ins, outs = schedule.stage_inputs, schedule.stage_outputs
    rw = walk_cached(g, schedule.tiled, schedule.tiles, ins, 0, [w.band for w in schedule.rows], rows)
    cw = walk_cached(g, schedule.tiled, schedule.tiles, ins, 1, [w.band for w in schedule.cols], cols)

    macs = 0
    for i in schedule.tiled:
        op = g.ops[i]
        mpp = ir.macs_per_output_pixel(op)
        if mpp:
            t = op.outputs[0]
            macs += mpp * sum(_len(w.comp[t]) for w in rw) * sum(_len(w.comp[t]) for w in cw)

    def width(t: str) -> int:  # the columns of t any patch of a row band needs
        lo = min((w.need[t][0] for w in cw if _len(w.need.get(t, _EMPTY))), default=0)
        hi = max((w.need[t][1] for w in cw if _len(w.need.get(t, _EMPTY))), default=0)
        return max(hi - lo, 0)

    def per_pixel(t: str) -> int:
        tensor = g.tensors[t]
        return tensor.shape[3] * tensor.itemsize

    row_bytes = {t: max((w.cached.get(t, 0) for w in rw), default=0) * width(t) * per_pixel(t) for t in sorted(rows)}
    col_bytes = {t: max((c.cached.get(t, 0) * _len(r.need.get(t, _EMPTY)) for r in rw for c in cw), default=0)
                 * per_pixel(t) for t in sorted(cols)}
    caches = sum(row_bytes.values()) + sum(col_bytes.values())

    life = g.lifetimes()
    produced = {t for i in idx for t in g.ops[i].outputs}
    out_bytes = sum(g.tensors[t].nbytes for t in outs) + schedule.accumulator_bytes
    in_bytes = sum(g.tensors[t].nbytes for t in ins if t in g.inputs)
    held = held_bytes(g, idx, ins, produced, life)
    out_bytes += held.nbytes  # (held whole for the whole stage, like its outputs)
    peak_in = peak_x = own_most = 0
    for i in idx:
        alive = [t for t, (a, b) in life.items()
                 if a <= i <= b and (t in produced or t in ins) and t not in outs and t not in held.whole]
        for r, c in itertools.product(rw, cw):
            own = sum(_len(r.need.get(t, _EMPTY)) * _len(c.need.get(t, _EMPTY)) * per_pixel(t)
                      for t in alive if t not in ins)
            window = sum(_len(r.need.get(t, _EMPTY)) * _len(c.need.get(t, _EMPTY)) * per_pixel(t)
                         for t in alive if t in ins)
            peak_in = max(peak_in, out_bytes + in_bytes + caches + own)
            peak_x = max(peak_x, out_bytes + caches + own + window)
            own_most = max(own_most, own)
    # Streamed (tfmcu_stage_run_streamed): the row window (the most input rows a band reads, whole rows) beside the
    # largest patch working set.
    row_window = sum(max((_len(w.need.get(t, _EMPTY)) for w in rw), default=0) * g.tensors[t].shape[2] * per_pixel(t)
                     for t in ins if t not in held.whole)
    peak_s = out_bytes + caches + own_most + row_window
    return HaloCaches(schedule, rows, cols, rw, cw, macs, row_bytes, col_bytes, peak_in, peak_x, peak_s)


def _image(count_input: bool | str) -> str:
    """``count_input`` as a ``HaloCaches.peak`` image mode: a mode name as is, True "counted", False "excluded"."""
    return count_input if isinstance(count_input, str) else ("counted" if count_input else "excluded")


def _caches_of(schedule: PatchSchedule, opts: Iterable[tuple[str, str]]) -> HaloCaches:
    """The caches of the (tensor, "rows" | "cols") options ``opts``."""
    opts = list(opts)
    return halo_caches(schedule, [t for t, a in opts if a == "rows"], [t for t, a in opts if a == "cols"])


def choose_caches(schedule: PatchSchedule, budget: int | None, count_input: bool | str = True) -> HaloCaches:
    """The caches to keep under an SRAM budget (analytic peak, image counted unless ``count_input`` is off;
    ``"streamed"``: the executor's streamed input):
    every intermediate tensor cached along both axes when that fits; else caches are dropped one at a time, the one
    that frees the most peak bytes per MAC it adds first, until the caches fit; then dropped ones that still fit are
    taken back, the largest MAC saving first. ``ScheduleError`` when even the recompute schedule does not fit."""
    inter = intermediates(schedule)
    kept = {(t, axis) for t in inter for axis in ("rows", "cols")}

    def build(opts: set[tuple[str, str]]) -> HaloCaches:
        return _caches_of(schedule, opts)

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
    built: dict[frozenset[tuple[str, str]], HaloCaches] = {}  # the local search meets the greedy path's choices again

    def build(opts: set[tuple[str, str]]) -> HaloCaches:
        key = frozenset(opts)
        if key not in built:
            built[key] = _caches_of(schedule, opts)
        return built[key]

    def key(h: HaloCaches) -> tuple[int, int]:
        return h.stage_peak(image), h.stage_macs_exact

    kept = set(everything)
    h = build(kept)
    if h.mac_overhead > max_mac_overhead + 1e-12:
        raise ScheduleError(f"every halo cached still adds {100 * h.mac_overhead:.1f}% MACs > the cap "
                            f"{100 * max_mac_overhead:.1f}%")
    best, best_kept = h, set(kept)
    while kept:
        trials = []
        for opt in sorted(kept):
            h2 = build(kept - {opt})
            freed, added = h.stage_peak(image) - h2.stage_peak(image), h2.stage_macs_exact - h.stage_macs_exact
            trials.append((-freed / max(added, 1), added, opt, h2))
        _, _, opt, h = min(trials, key=lambda x: x[:3])
        kept.discard(opt)
        if h.mac_overhead <= max_mac_overhead + 1e-12 and key(h) < key(best):
            best, best_kept = h, set(kept)
    improved = True
    while improved:  # local search: one cache dropped or taken back at a time while that helps within the cap
        improved = False
        for opt in sorted(everything):
            opts = best_kept ^ {opt}
            h2 = build(opts)
            if h2.mac_overhead <= max_mac_overhead + 1e-12 and key(h2) < key(best):
                best, best_kept, improved = h2, opts, True
    return best


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
