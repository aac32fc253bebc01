"""Halo caching between neighbouring patches (tfmcu.plan.halo), analytic: checked against a brute-force raster
execution that pushes pixel sets backwards patch by patch and takes from a cache exactly what an earlier row band
(row cache) or an earlier patch of the same row band (column cache) computed; and on MobileNetV2-224."""

from __future__ import annotations

import itertools
import random

import pytest

from tfmcu.graph import ir
from tfmcu.graph.from_spec import from_spec
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec
from tfmcu.plan import halo, regions
from tfmcu.plan.regions import ScheduleError

MBV2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mbv2(resolution: int = 224) -> NetSpec:
    stages = [StageSpec([BlockSpec(c, kernel=3, expand=t, stride=s if i == 0 else 1) for i in range(n)])
              for t, c, n, s in MBV2]
    return NetSpec(name="mbv2", resolution=resolution, stages=stages, head=HeadSpec(1280))


def random_spec(rng: random.Random) -> NetSpec:
    stages = []
    for _ in range(rng.randint(2, 3)):
        c = rng.choice([4, 8])
        blocks = [BlockSpec(c, kernel=rng.choice([1, 3, 5]), expand=rng.choice([1, 3]),
                            stride=rng.choice([1, 2]) if i == 0 else 1) for i in range(rng.randint(1, 2))]
        stages.append(StageSpec(blocks))
    return NetSpec(name="rand", resolution=rng.choice([24, 29, 32]), stem=StemSpec(4, kernel=rng.choice([3, 5]),
                   stride=rng.choice([1, 2])), stages=stages, head=HeadSpec(8, num_classes=4))


def box(px: set) -> set:
    """The bounding box of a pixel set (a patch buffer is a box, as in the executor)."""
    if not px:
        return set()
    ys, xs = [p[0] for p in px], [p[1] for p in px]
    return set(itertools.product(range(min(ys), max(ys) + 1), range(min(xs), max(xs) + 1)))


def brute_force_macs(s: regions.PatchSchedule, rows: set[str], cols: set[str]) -> int:
    """Raster order; each patch needs, per tensor, the box around what its consumers read; a tensor's pixels
    computed by an earlier row band (row cache) or by an earlier patch of the same row band (column cache) are not
    computed again; returns the stage's MACs."""
    g = s.graph
    outs, ins = set(s.stage_outputs), set(s.stage_inputs)
    done_rows: dict[str, set] = {}  # pixels computed in earlier row bands
    done_band: dict[str, set] = {}  # pixels computed earlier in this row band
    macs = 0
    for r in range(s.grid[0]):
        done_band = {}
        for c in range(s.grid[1]):
            rb, cb = s.rows[r].band, s.cols[c].band
            need: dict[str, set] = {t: set(itertools.product(range(*rb), range(*cb))) for t in outs}
            comp: dict[str, set] = {t: set(need[t]) for t in outs}
            for i in reversed(s.stage):
                op = g.ops[i]
                for t in op.outputs:
                    if t not in comp:
                        avail = set()
                        if t in rows:
                            avail |= done_rows.get(t, set())
                        if t in cols:
                            avail |= done_band.get(t, set())
                        comp[t] = need.get(t, set()) - avail
                o = set().union(*(comp[t] for t in op.outputs))
                macs += ir.macs_per_output_pixel(op) * len(comp[op.outputs[0]])
                for t in op.inputs:
                    h, w = g.tensors[t].hw
                    px = set()
                    for y, x in o:
                        if op.is_window:
                            (y0, y1), (x0, x1) = ir.input_range(op, 0, y, y + 1), ir.input_range(op, 1, x, x + 1)
                            px.update((a, b) for a in range(max(y0, 0), min(y1, h))
                                      for b in range(max(x0, 0), min(x1, w)))
                        elif (h, w) == (1, 1) and g.tensors[op.outputs[0]].hw != (1, 1):
                            px.add((0, 0))
                        else:
                            px.add((y, x))
                    need[t] = box(need.get(t, set()) | px)
            for t, p in comp.items():
                if t not in outs and t not in ins:
                    done_band.setdefault(t, set()).update(p)
        for t, p in done_band.items():
            done_rows.setdefault(t, set()).update(p)
    return macs


def test_no_cache_is_the_recompute_schedule():
    g = from_spec(mbv2())
    s = regions.schedule(g, 4, n_blocks=5)
    h = halo.halo_caches(s)
    assert h.stage_macs_exact == s.stage_macs_patched_exact and h.cache_bytes == 0
    assert (h.stage_peak_bytes, h.stage_peak_bytes_excluding_input) == (s.stage_peak_bytes,
                                                                       s.stage_peak_bytes_excluding_input)


def simulate(h: halo.HaloCaches) -> int:
    """Run the halo caches' rule pixel by pixel in raster order: each patch computes the box comp_rows x comp_cols of
    every tensor; every pixel an op reads must be computed in this patch or held by a cache (row cache: what the
    previous row band had of the rows the next band needs; column cache: what the left neighbour had of the columns
    this patch needs); cache contents never exceed the plan's cache sizes. Returns the MACs."""
    s, g = h.schedule, h.schedule.graph
    ins = set(s.stage_inputs)

    def rect(r: tuple, c: tuple) -> set:
        return set(itertools.product(range(*r), range(*c)))

    macs, row_cache = 0, {}
    for r, rw in enumerate(h.rows):
        next_rows, col_cache = {}, {}
        for c, cw in enumerate(h.cols):
            have = {}
            for i in s.stage:
                for t in g.ops[i].outputs:
                    computed = rect(rw.comp[t], cw.comp[t])
                    macs += ir.macs_per_output_pixel(g.ops[i]) * len(computed) if t == g.ops[i].outputs[0] else 0
                    cached = (row_cache.get(t, set()) if t in h.cache_rows else set()) | \
                        (col_cache.get(t, set()) if t in h.cache_cols else set())
                    have[t] = computed | (cached & rect(rw.need.get(t, (0, 0)), cw.need.get(t, (0, 0))))
            for i in s.stage:
                op = g.ops[i]
                out = rect(rw.comp[op.outputs[0]], cw.comp[op.outputs[0]])
                for t in op.inputs:
                    if t in ins:
                        continue
                    hh, ww = g.tensors[t].hw
                    for y, x in out:
                        if op.is_window:
                            (y0, y1), (x0, x1) = ir.input_range(op, 0, y, y + 1), ir.input_range(op, 1, x, x + 1)
                            read = rect((max(y0, 0), min(y1, hh)), (max(x0, 0), min(x1, ww)))
                        elif (hh, ww) == (1, 1) and g.tensors[op.outputs[0]].hw != (1, 1):
                            read = {(0, 0)}
                        else:
                            read = {(y, x)}
                        assert read <= have[t], (r, c, op.describe(i), t)
            for t in h.cache_rows:
                if r + 1 < len(h.rows) and t in h.rows[r + 1].need:
                    start, stop = h.rows[r + 1].need[t]
                    next_rows.setdefault(t, set()).update(p for p in have[t] if start <= p[0] < stop)
            col_cache = {}
            for t in h.cache_cols:
                if c + 1 < len(h.cols) and t in h.cols[c + 1].need:
                    start, stop = h.cols[c + 1].need[t]
                    col_cache[t] = {p for p in have[t] if start <= p[1] < stop and p[0] in range(*rw.need[t])}
                    per_pixel = g.tensors[t].shape[3] * g.tensors[t].itemsize
                    assert len(col_cache[t]) * per_pixel <= h.col_cache_bytes[t]
        row_cache = next_rows
        for t, px in row_cache.items():
            per_pixel = g.tensors[t].shape[3] * g.tensors[t].itemsize
            assert len(px) * per_pixel <= h.row_cache_bytes[t]
    return macs


@pytest.mark.parametrize("seed", range(6))
def test_plans_are_valid_and_exact(seed):
    """Every cache choice: the plan's rule reads nothing that is neither computed nor cached, its MACs are the
    plan's; no cache and every cache agree with the ideal (each pixel a patch needs computed unless any earlier
    patch computed it) -- a mixed choice may compute a little more than the ideal (boxes are separable)."""
    rng = random.Random(seed)
    g = from_spec(random_spec(rng))
    n = rng.randint(1, max(1, g.num_blocks - 2))
    grid = (rng.choice([2, 3]), rng.choice([2, 3]))
    try:
        s = regions.schedule(g, grid, n_blocks=n)
    except ScheduleError:
        pytest.skip("no such stage in this random graph")
    inter = halo.intermediates(s)
    for rows, cols in ((set(), set()), (set(inter), set()), (set(), set(inter)), (set(inter), set(inter)),
                       (set(rng.sample(inter, len(inter) // 2)), set(rng.sample(inter, len(inter) // 2)))):
        h = halo.halo_caches(s, rows, cols)
        assert simulate(h) == h.stage_macs_exact, (rows, cols)
        ideal = brute_force_macs(s, rows, cols)
        assert h.stage_macs_exact >= ideal
        if rows == cols:
            assert h.stage_macs_exact == ideal


def test_mbv2_all_cached_computes_each_element_once():
    """MobileNetV2-224, 4x4 patches over 5 blocks: +30.6% exact MACs recomputing; caching every intermediate
    tensor along both axes leaves no recompute (the stage's MACs over the elements it needs)."""
    g = from_spec(mbv2())
    s = regions.schedule(g, 4, n_blocks=5)
    assert round(s.stage_macs_patched_exact / s.stage_macs - 1, 3) == 0.306
    inter = halo.intermediates(s)
    h = halo.halo_caches(s, inter, inter)
    assert h.stage_macs_exact <= s.stage_macs and h.stage_mac_overhead <= 0.0
    assert 0 < h.cache_bytes < h.stage_peak_bytes
    # Rows only: the recompute along columns stays.
    r = halo.halo_caches(s, inter, ())
    assert h.stage_macs_exact < r.stage_macs_exact < s.stage_macs_patched_exact
    assert r.col_cache_bytes == {} and sum(r.row_cache_bytes.values()) > 0


def test_bad_cache_names():
    s = regions.schedule(from_spec(mbv2(96)), 2, n_blocks=2)
    with pytest.raises(ScheduleError, match="cannot be cached"):
        halo.halo_caches(s, rows=[s.stage_outputs[0]])


def test_choose_caches_under_a_budget():
    """MobileNetV2-224 4x4 n=5 (analytic, image counted): no budget -> every cache, no recompute; at the recompute
    schedule's own peak -> at most half its MAC overhead; below it -> one line."""
    g = from_spec(mbv2())
    s = regions.schedule(g, 4, n_blocks=5)
    free = halo.choose_caches(s, None)
    assert free.stage_macs_exact <= s.stage_macs and len(free.cache_rows) == len(halo.intermediates(s))
    same = halo.choose_caches(s, s.peak_sram_bytes)
    assert same.peak_sram_bytes <= s.peak_sram_bytes
    assert same.stage_mac_overhead <= (s.stage_macs_patched_exact / s.stage_macs - 1) / 2
    loose = halo.choose_caches(s, int(s.peak_sram_bytes * 1.25))
    assert loose.stage_mac_overhead <= 0.03 and loose.peak_sram_bytes <= s.peak_sram_bytes * 1.25
    with pytest.raises(ScheduleError, match="recompute schedule needs"):
        halo.choose_caches(s, s.peak_sram_bytes - 1)


@pytest.mark.parametrize("image", ["counted", "streamed"])
def test_smallest_caches_within_a_mac_cap(image):
    """MobileNetV2-144 9x9 n=5 (analytic): the smallest stage within +5% whole-model MACs (recomputing all, +45%, is
    out) is smaller than with every cache (some row caches of wide tensors dropped, their rows recomputed), a tighter
    cap gives no smaller stage; a cap below what every cache reaches is one line."""
    g = from_spec(mbv2(144))
    s = regions.schedule(g, 9, n_blocks=5)
    inter = halo.intermediates(s)
    every, none = halo.halo_caches(s, inter, inter), halo.halo_caches(s)
    small = halo.smallest_caches(s, 0.05, image)
    assert small.mac_overhead <= 0.05 < none.mac_overhead
    assert small.stage_peak(image) < every.stage_peak(image)
    assert len(small.cache_rows) < len(inter)
    tight = halo.smallest_caches(s, 0.01, image)
    assert tight.mac_overhead <= 0.01 and tight.stage_peak(image) >= small.stage_peak(image)
    assert halo.select(s, halo.HaloOptions(mode="smallest"), None, image).to_dict() == small.to_dict()
    assert halo.select(s, halo.HaloOptions(mode="smallest", max_mac_overhead=0.01), None, image).to_dict() == \
        tight.to_dict()
    with pytest.raises(ScheduleError, match="every halo cached still adds"):
        halo.smallest_caches(s, every.mac_overhead - 1e-6 if every.mac_overhead > 0 else -1.0, image)


def reference_smallest_caches(s: regions.PatchSchedule, cap: float, image: str) -> halo.HaloCaches:
    """``smallest_caches`` as first written: every candidate built from scratch by ``halo_caches`` (the greedy
    descent, then the local search)."""
    everything = {(t, a) for t in halo.intermediates(s) for a in ("rows", "cols")}

    def build(opts):
        return halo.halo_caches(s, [t for t, a in opts if a == "rows"], [t for t, a in opts if a == "cols"])

    def key(h):
        return h.stage_peak(image), h.stage_macs_exact

    kept = set(everything)
    h = build(kept)
    if h.mac_overhead > cap + 1e-12:
        raise ScheduleError("every halo cached still adds too many MACs")
    best, best_kept = h, set(kept)
    while kept:
        trials = []
        for opt in sorted(kept):
            h2 = build(kept - {opt})
            added = h2.stage_macs_exact - h.stage_macs_exact
            trials.append(((h2.stage_peak(image) - h.stage_peak(image)) / max(added, 1), added, opt, h2))
        _, _, opt, h = min(trials, key=lambda x: x[:3])
        kept.discard(opt)
        if h.mac_overhead <= cap + 1e-12 and key(h) < key(best):
            best, best_kept = h, set(kept)
    improved = True
    while improved:
        improved = False
        for opt in sorted(everything):
            h2 = build(best_kept ^ {opt})
            if h2.mac_overhead <= cap + 1e-12 and key(h2) < key(best):
                best, best_kept, improved = h2, best_kept ^ {opt}, True
    return best


def assert_same_caches(s: regions.PatchSchedule, cap: float, image: str):
    got, want = halo.smallest_caches(s, cap, image), reference_smallest_caches(s, cap, image)
    assert (got.cache_rows, got.cache_cols) == (want.cache_rows, want.cache_cols)
    assert got.to_dict() == want.to_dict()  # every stage peak, the MACs, the cache bytes
    assert [(w.need, w.comp, w.cached, w.reads) for w in got.rows + got.cols] == \
        [(w.need, w.comp, w.cached, w.reads) for w in want.rows + want.cols]


@pytest.mark.parametrize("seed", range(8))
def test_smallest_caches_is_the_reference_search(seed):
    """The search (walks kept per axis and cache set, figures from one matrix product) picks the caches, stage peaks
    and MACs that building every candidate from scratch picks, for every image mode and caps between every cache's
    and no cache's MAC overhead."""
    rng = random.Random(100 + seed)
    g = from_spec(random_spec(rng))
    grid, n = (rng.choice([2, 3]), rng.choice([2, 3])), rng.randint(2, max(2, g.num_blocks - 2))
    try:
        s = regions.schedule(g, grid, n_blocks=n)
    except ScheduleError:
        pytest.skip("no such stage in this random graph")
    inter = halo.intermediates(s)
    every, none = halo.halo_caches(s, inter, inter).mac_overhead, halo.halo_caches(s).mac_overhead
    for image in ("counted", "excluded", "streamed"):
        for cap in (every, (every + none) / 2, none + 1.0):
            assert_same_caches(s, cap, image)


def test_smallest_caches_is_the_reference_search_on_mbv2_035_144(zoo_models):
    """The same on the zoo's MobileNetV2-0.35-144 (int8), 4x4 patches over 6 blocks, the image streamed and counted."""
    from tfmcu.graph.from_tflite import from_tflite

    s = regions.schedule(from_tflite(zoo_models("mbv2_035_144")), (4, 4), n_blocks=6)
    for image in ("streamed", "counted"):
        assert_same_caches(s, halo.DEFAULT_MAX_MAC_OVERHEAD, image)


@pytest.mark.parametrize("seed", range(3))
def test_later_stages_and_pooled_stages(seed):
    """Stages of the ops ``a..b-1`` anywhere in the graph (inputs held whole, maybe nothing but the stage output of
    the patch's own), and ending with the global pool: no cache gives regions' peaks, and the search is the reference
    search."""
    g = from_spec(random_spec(random.Random(200 + seed)))
    pools = [k for k, op in enumerate(g.ops) if regions.is_global_pool(g, op)]
    tried = 0
    for a in range(len(g.ops)):
        for b in sorted({min(a + 1, len(g.ops)), min(a + 3, len(g.ops))}):
            for ops in (list(range(a, b)), list(range(a, b)) + pools[:1]):
                try:
                    s = regions.schedule(g, (2, 2), ops=ops)
                except ScheduleError:
                    continue
                h = halo.halo_caches(s)
                assert (h.stage_peak_bytes, h.stage_peak_bytes_excluding_input) == \
                    (s.stage_peak_bytes, s.stage_peak_bytes_excluding_input)
                assert_same_caches(s, 10.0, "streamed")
                tried += 1
    assert tried > 3
