"""Stage plans: several patch stages in one network, chosen by a dynamic programme over the chain of cut points
(``tfmcu.plan.stage_plans``), on the analytic model (pure Python; no TensorFlow).

The programme is checked against brute force (every partition of a small network into per-layer ops and stages,
every grid and halo treatment), and the analytic figures of a stage that does not start at the image against a hand
count.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from tfmcu.graph import ir
from tfmcu.graph.from_spec import from_spec
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec
from tfmcu.plan import regions
from tfmcu.plan.halo import halo_caches, intermediates
from tfmcu.plan.profiler import profile, step_memory
from tfmcu.plan.plans import HALO_ALL, SearchOptions
from tfmcu.plan.search import AnalyticCost, candidates, search
from tfmcu.plan.stage_plans import IMAGE_MODES, pareto_plans, plan_candidates, segments_by_image, stage_plans, \
    stage_segments


def small_graph() -> ir.Graph:
    spec = NetSpec(name="small", resolution=32, stem=StemSpec(8, kernel=3, stride=2),
                   stages=[StageSpec([BlockSpec(8, kernel=3, expand=3, stride=1),
                                      BlockSpec(16, kernel=3, expand=3, stride=2)]),
                           StageSpec([BlockSpec(16, kernel=3, expand=4, stride=1),
                                      BlockSpec(24, kernel=5, expand=3, stride=2)])],
                   head=HeadSpec(64, num_classes=10))
    return from_spec(spec)


OPTS = SearchOptions(patch_options=(2, 3, 4))


def _brute_front(graph: ir.Graph, segs, max_stages=None, cost=lambda s: s.macs) -> list[tuple[int, int]]:
    """Every chain of segments from op 0 to the end, by exhaustive recursion: the (peak, cost) Pareto front."""
    by_start: dict[int, list] = {}
    for s in segs:
        by_start.setdefault(s.start, []).append(s)
    n = len(graph.ops)
    points = []

    def walk(at: int, peak: int, macs: int, stages: int) -> None:
        if at == n:
            points.append((peak, macs))
            return
        for s in by_start.get(at, []):
            k = stages + s.patched
            if max_stages is None or k <= max_stages:
                walk(s.stop, max(peak, s.peak), macs + cost(s), k)

    walk(0, 0, 0, 0)
    front = []
    for p in sorted(set(points)):
        if not front or p[1] < front[-1][1]:
            front.append(p)
    return front


@pytest.mark.parametrize("max_stages", [0, 1, 2, None])
@pytest.mark.parametrize("image", ["counted", "excluded", "streamed"])
def test_dynamic_programme_equals_brute_force(max_stages, image):
    g = small_graph()
    # (square grids only: with row bands too, the exhaustive side takes minutes for any number of stages)
    segs = [s for s in stage_segments(g, OPTS, image) if s.grid is None or s.grid[0] == s.grid[1]]
    front = pareto_plans(g, segs, OPTS, max_stages, image)
    assert [(p.peak(), p.macs) for p in front] == _brute_front(g, segs, max_stages)
    for p in front:  # each plan tiles the graph, its figures are its segments'
        assert [s.start for s in p.segments] == [0] + [s.stop for s in p.segments[:-1]]
        assert p.segments[-1].stop == len(g.ops)
        assert max_stages is None or len(p.stages) <= max_stages


@pytest.mark.parametrize("max_stages", [1, 2])
def test_the_instruction_weighed_programme_equals_brute_force(max_stages):
    """``by="instructions"``: the same programme with the segments' instruction estimate as the cost (row bands
    included), against exhaustive enumeration; a row band's estimate is below its square grid's of equal patches
    per side (fewer kernel calls)."""
    g = small_graph()
    segs = stage_segments(g, OPTS, "streamed")
    assert any(s.grid and s.grid[1] == 1 for s in segs)
    front = pareto_plans(g, segs, OPTS, max_stages, "streamed", by="instructions")
    got = [(p.peak(), round(p.instructions, 3)) for p in front]
    assert got == [(a, round(b, 3)) for a, b in _brute_front(g, segs, max_stages, cost=lambda s: s.instructions)]
    for s in segs:
        if s.grid and s.grid[1] == 1 and s.grid[0] > 1:
            square = next((t for t in segs if (t.start, t.stop, t.halo, t.pooled) == (s.start, s.stop, s.halo,
                                                                                      s.pooled)
                           and t.grid == (s.grid[0], s.grid[0])), None)
            if square is not None:
                assert s.instructions < square.instructions
    with pytest.raises(regions.ScheduleError, match="by"):
        pareto_plans(g, segs, OPTS, 1, "streamed", by="seconds")


def test_the_instruction_weighed_programme_with_any_number_of_stages():
    """Any number of stages and no MAC cap (fit's default): labels are kept by peak and cost alone; the front is
    still exhaustive enumeration's (square grids: with row bands the enumeration takes minutes)."""
    g = small_graph()
    segs = [s for s in stage_segments(g, OPTS, "streamed") if s.grid is None or s.grid[0] == s.grid[1]]
    front = pareto_plans(g, segs, OPTS, None, "streamed", by="instructions")
    got = [(p.peak(), round(p.instructions, 3)) for p in front]
    assert got == [(a, round(b, 3)) for a, b in _brute_front(g, segs, None, cost=lambda s: s.instructions)]
    assert max(len(p.stages) for p in front) > 2


def _arena_front(graph: ir.Graph, segs, max_stages=None, max_cost=None, max_macs=None) -> list[tuple[int, float]]:
    """Every chain by exhaustive recursion: the (largest peak + the sum of tails, instruction estimate) front of
    those within the caps."""
    by_start: dict[int, list] = {}
    for s in segs:
        by_start.setdefault(s.start, []).append(s)
    n = len(graph.ops)
    points = []

    def walk(at: int, peak: int, tail: int, cost: float, macs: int, stages: int) -> None:
        if at == n:
            if (max_cost is None or cost <= max_cost) and (max_macs is None or macs <= max_macs):
                points.append((peak + tail, round(cost, 3)))
            return
        for s in by_start.get(at, []):
            k = stages + s.patched
            if max_stages is None or k <= max_stages:
                walk(s.stop, max(peak, s.peak), tail + s.tail, cost + s.instructions, macs + s.macs, k)

    walk(0, 0, 0, 0.0, 0, 0)
    front: list[tuple[int, float]] = []
    for p in sorted(set(points)):
        if not front or p[1] < front[-1][1]:
            front.append(p)
    return front


@pytest.mark.parametrize("max_stages", [2, None])
@pytest.mark.parametrize("capped", [False, True])
def test_the_whole_arena_programme_equals_brute_force(max_stages, capped):
    """With a tail per segment (a cost function's ``segment_tail``: here made up, larger for per-layer ops and
    varying by position, so that a smaller peak and a larger tail trade), the front is of peak + tail: exhaustive
    enumeration's, with and without a cap on the instruction estimate and the MACs (labels that cannot end within
    the caps dropped as they are made)."""
    g = small_graph()
    segs = [replace(s, tail=(40 + 12 * s.start + 8 * (s.stop - s.start)) if s.grid else 96 + 24 * (s.start % 3))
            for s in stage_segments(g, OPTS, "streamed") if s.grid is None or s.grid[0] == s.grid[1]]
    base = sum(ir.op_macs(g, op) for op in g.ops)
    per_layer = pareto_plans(g, segs, OPTS, 0, "streamed", by="instructions")[0].instructions
    opts = SearchOptions(patch_options=OPTS.patch_options, max_mac_overhead=0.3 if capped else None)
    max_cost = 1.5 * per_layer if capped else None
    front = pareto_plans(g, segs, opts, max_stages, "streamed", by="instructions", max_cost=max_cost)
    got = [(p.peak() + p.tail, round(p.instructions, 3)) for p in front]
    want = _arena_front(g, segs, max_stages, max_cost, 1.3 * base if capped else None)
    assert got == want
    assert len(want) > 3 and any(a.peak() > b.peak() for a, b in zip(front, front[1:]))  # the tail traded
    if capped:
        assert got != _arena_front(g, segs, max_stages)


def test_the_search_weighs_its_cost_functions_tail():
    """The one search hands its cost function's ``segment_tail`` to the stage plans' fronts: their plans carry it,
    and a tail that makes operators dear (per layer more than a stage) moves the front to plans of fewer operators."""
    g = small_graph()

    class Tailed(AnalyticCost):
        def segment_tail(self, s) -> int:
            return 50 if s.patched else 4000

    opts = SearchOptions(patch_options=(2, 3, 4), max_stages=None, objective="memory")
    res = search(g, Tailed(), None, opts)
    plain = search(g, AnalyticCost(), None, opts)
    staged = [p for p in res.candidates if len(p.stages) > 1]
    assert staged and all(p.tail == sum(50 if s.patched else 4000 for s in p.segments) for p in staged)
    assert all(p.tail == 0 for p in plain.candidates)

    def ops(plans) -> float:
        return min(len(p.segments) for p in plans if len(p.stages) > 1)

    assert ops(res.candidates) < ops(plain.candidates)


def test_segments_of_several_image_modes_at_once_are_each_modes():
    """The stage-plan candidates build each stage's schedule and caches once for every image mode: the same
    segments as one mode at a time."""
    g = small_graph()
    together = segments_by_image(g, OPTS, IMAGE_MODES)
    assert together == {image: stage_segments(g, OPTS, image) for image in IMAGE_MODES}
    assert together["streamed"] != together["counted"]


def test_a_block_after_the_global_pool_is_no_stage():
    """A network whose every op is its own block (as a Keras model lowered from TF Lite may be): runs of ops after
    the global pool have no feature map to cut into patches and are no stage (they used to stop the search)."""
    g = small_graph()
    for i, op in enumerate(g.ops):
        op.block = i
    pool = next(i for i, op in enumerate(g.ops) if op.type == ir.MEAN)
    segs = stage_segments(g, OPTS, "counted")
    assert not any(s.patched and s.start > pool for s in segs)
    assert any(s.patched and s.pooled for s in segs) and stage_plans(g, OPTS, image="counted")


def test_a_looser_latency_cap_keeps_the_smallest_plans_of_the_tighter_caps():
    """With ``max_latency``, the candidates hold, per image mode, the smallest plan within each tighter cap of the
    ladder: what fit prices at 1.05 it also prices at 1.25 (so a looser cap never ends with a larger arena for want
    of a candidate)."""
    g = small_graph()

    def candidates_at(cap: float) -> list:
        return plan_candidates(g, SearchOptions(patch_options=(2, 3, 4), max_stages=None, max_latency=cap,
                                                objective="memory"))

    def key(p) -> tuple:
        return p.image, tuple((s.start, s.stop, s.grid, s.halo, s.pooled) for s in p.stages)

    loose = {key(p) for p in candidates_at(1.25)}
    for cap in (1.0, 1.05, 1.1):
        tight = candidates_at(cap)
        for image in {p.image for p in tight}:
            smallest = min((p for p in tight if p.image == image), key=lambda p: p.peak())
            assert key(smallest) in loose, (cap, image)


def test_with_a_latency_cap_every_front_plan_within_it_is_a_candidate(monkeypatch):
    """With ``max_latency``, a front's plans within the cap are all candidates (up to ``MAX_PLANS_UNDER_CAP``), not
    a sample of twelve: the estimate's overhead runs below the predictor's, so the plans that fit the cap lie deep in
    the front. The cap is a factor of TFLM + CMSIS-NN per layer (its estimate at CMSIS-NN's rate), the plans priced
    at our kernels' rate. Without a cap, at most ``MAX_PLANS_PER_FRONT`` per front."""
    from tfmcu.plan import stage_plans as sp
    from tfmcu.plan.latency import stage_overheads
    g = small_graph()
    opts = SearchOptions(patch_options=(2, 3, 4), max_stages=None, max_latency=1.5, objective="memory")
    segs = segments_by_image(g, opts, ("counted",))["counted"]
    # the cap is a factor of TFLM + CMSIS-NN per layer: the estimate at its rate, above the segments' (our kernels')
    per_layer = sp.segment_instructions(g, list(range(len(g.ops))), None, stage_overheads(ours=False))
    assert per_layer > pareto_plans(g, segs, opts, 0, "counted", by="instructions")[0].instructions
    within = [p for p in pareto_plans(g, segs, opts, None, "counted", by="instructions")
              if p.stages and not (len(p.stages) == 1 and p.stages[0].start == 0)
              and p.instructions <= 1.5 * sp.PLAN_ESTIMATE_SLACK * per_layer]

    def key(p) -> tuple:
        return tuple((s.start, s.stop, s.grid, s.halo, s.pooled) for s in p.stages)

    monkeypatch.setattr(sp, "MAX_PLANS_PER_FRONT", 4)
    assert len(within) > sp.MAX_PLANS_PER_FRONT
    got = {key(p) for p in plan_candidates(g, opts) if p.image == "counted"}
    assert {key(p) for p in within} <= got
    monkeypatch.setattr(sp, "MAX_PLANS_UNDER_CAP", 4)
    assert len([p for p in plan_candidates(g, opts) if p.image == "counted"]) < len(within)


def test_no_stage_is_the_per_layer_model():
    g = small_graph()
    for image, exclude in (("counted", False), ("excluded", True)):
        (p,) = stage_plans(g, OPTS, max_stages=0, image=image)
        prof = profile(g)
        assert p.peak() == max(step_memory(g, exclude_inputs=exclude))
        assert p.peak() == (prof.peak_sram_per_layer_bytes_excluding_input if exclude
                          else prof.peak_sram_per_layer_bytes)
        assert p.macs == prof.macs and p.mac_overhead == 0.0 and p.describe() == "no patching (per-layer)"


def test_one_stage_is_at_least_as_good_as_the_prefix_search():
    """One stage anywhere includes the single-stage search's prefix stages (recompute): never worse."""
    g = small_graph()
    best_prefix = min(c.peak_sram_bytes_excluding_input for c in candidates(g, SearchOptions(patch_options=(2, 3, 4),
                                                                                             rectangular=False)))
    front = stage_plans(g, OPTS, max_stages=1, image="excluded")
    assert front[0].peak() <= best_prefix
    more = stage_plans(g, OPTS, max_stages=None, image="excluded")
    assert more[0].peak() <= front[0].peak()


def test_a_later_stage_holds_its_input_whole():
    """A stage after the first reads a tensor another op wrote whole: it is held for the whole stage (counted with
    or without the image), and halo caches count it the same way."""
    g = small_graph()
    b = [op.block for op in g.ops]
    a, z = b.index(2), b.index(3)  # block 2 alone
    idx = list(range(a, z))
    ins, outs = regions.check_stage(g, idx)
    (x,) = ins
    assert x not in g.inputs
    s = regions.schedule(g, (2, 2), ops=idx)
    s1 = regions.schedule(g, (1, 1), ops=idx)
    # one patch covering everything: the stage holds its input whole, its output, and one full working set
    assert s1.stage_peak_bytes == s1.stage_peak_bytes_excluding_input
    assert s1.stage_peak_bytes >= g.tensors[x].nbytes + sum(g.tensors[t].nbytes for t in outs)
    assert s.stage_peak_bytes_excluding_input >= g.tensors[x].nbytes + sum(g.tensors[t].nbytes for t in outs)
    h = halo_caches(s)  # no cache: regions' figures
    assert h.stage_peak_bytes_excluding_input == s.stage_peak_bytes_excluding_input
    hall = halo_caches(s, intermediates(s), intermediates(s))
    assert hall.stage_peak_bytes_streamed >= g.tensors[x].nbytes  # nothing to stream: the input is whole


def test_pooled_stage_ends_into_the_global_pool():
    g = small_graph()
    pool = next(i for i, op in enumerate(g.ops) if op.type == ir.MEAN)
    segs = stage_segments(g, OPTS, "excluded")
    pooled = [s for s in segs if s.pooled]
    assert pooled and all(s.stop == pool + 1 for s in pooled)
    out = g.tensors[g.ops[pool].inputs[0]]
    for s in pooled:  # the same stage, its output summed into int32 instead of held: a tile of it per patch
        twin = next(t for t in segs if (t.start, t.stop, t.grid, t.halo, t.pooled) == (s.start, pool, s.grid,
                                                                                      s.halo, False))
        sch = regions.schedule(g, s.grid, ops=list(range(s.start, s.stop)))
        assert sch.pool == pool and sch.tiles == [out.name] and sch.accumulator_bytes == 4 * out.shape[3]
        inter = intermediates(sch) if s.halo == HALO_ALL else []
        assert s.peak == halo_caches(sch, inter, inter).stage_peak("excluded")
        tile = max((r.band[1] - r.band[0]) * (c.band[1] - c.band[0]) for r in sch.rows for c in sch.cols)
        assert s.peak >= 4 * out.shape[3] + g.tensors[g.ops[pool].outputs[0]].nbytes + tile * out.shape[3]
        assert twin.peak - s.peak <= out.nbytes - 4 * out.shape[3] - g.tensors[g.ops[pool].outputs[0]].nbytes
        assert s.peak < twin.peak


def test_max_mac_overhead_and_bad_options():
    g = small_graph()
    capped = stage_plans(g, SearchOptions(patch_options=(2, 3, 4), max_mac_overhead=0.05), image="excluded")
    assert capped and all(p.mac_overhead <= 0.05 + 1e-12 for p in capped)
    with pytest.raises(regions.ScheduleError, match="max_stages"):
        stage_plans(g, OPTS, max_stages=-1)
    with pytest.raises(regions.ScheduleError, match="image"):
        stage_plans(g, OPTS, image="whole")
    with pytest.raises(regions.ScheduleError, match="streamed"):
        stage_plans(g, SearchOptions(patch_options=(2,), accounting="paper"), image="streamed")


def test_streamed_image_beats_counted_and_per_layer_holds_it():
    g = small_graph()
    segs = {im: stage_segments(g, OPTS, im) for im in ("counted", "excluded", "streamed")}
    first = [(s.start, s.stop, s.grid, s.halo, s.pooled) for s in segs["counted"] if s.patched and s.start == 0]
    assert first
    by = {im: {(s.start, s.stop, s.grid, s.halo, s.pooled): s.peak for s in v} for im, v in segs.items()}
    image = g.tensors[g.inputs[0]].nbytes
    # the first stage: a row window, never more than the whole image (as much when a band reads every row)
    assert all(by["streamed"][k] <= by["counted"][k] for k in first)
    assert min(by["streamed"][k] for k in first) < min(by["counted"][k] for k in first)
    # a per-layer first op holds the image whole when streamed, as when counted
    assert by["streamed"][(0, 1, None, None, False)] == by["counted"][(0, 1, None, None, False)]
    assert by["counted"][(0, 1, None, None, False)] - by["excluded"][(0, 1, None, None, False)] == image


def test_front_is_sorted_and_strict():
    g = small_graph()
    front = stage_plans(g, OPTS, image="excluded")
    assert all(a.peak() < b.peak() and a.macs > b.macs for a, b in itertools.pairwise(front))
    d = front[0].stage_plan_dict()
    assert d["peak_bytes"] == front[0].peak() and d["stages"] == len(front[0].stages)


def test_stage_plans_are_candidates_of_the_one_search():
    """``max_stages > 1`` adds stage plans to the single-stage candidates; the analytic search over them can only do
    better, and a stage plan reads and reports as one."""
    from tfmcu.plan.search import AnalyticCost, search

    g = small_graph()
    one = SearchOptions(patch_options=(2, 3, 4), rectangular=False, objective="memory", count_input=False)
    several = SearchOptions(patch_options=(2, 3, 4), rectangular=False, objective="memory", count_input=False,
                            max_stages=3)
    single = [c for c in candidates(g, one) if c.patched]
    assert single and all(len(c.stages) == 1 and c.stages[0].prefix and c.stages[0].halo is None for c in single)
    plans = [c for c in candidates(g, several) if c.patched and not c.stages[0].prefix]
    assert plans and len(candidates(g, several)) == len(candidates(g, one)) + len(plans)
    assert not any(len(c.stages) == 1 and c.stages[0].start == 0 for c in plans)
    assert all(len(c.stages) <= 3 and c.peak_sram_bytes == max(s.peak for s in c.segments) for c in plans)
    assert all("stage_plan" in c.to_dict() and "stage_plan" not in s.to_dict() for c in plans for s in single)
    a = search(g, AnalyticCost(count_input=False), None, one)
    b = search(g, AnalyticCost(count_input=False), None, several)
    assert b.chosen.cost <= a.chosen.cost
    assert "stage" in b.chosen.describe() or b.chosen.cost == a.chosen.cost
    with pytest.raises(regions.ScheduleError, match="max_stages"):
        SearchOptions(max_stages=0).validate()


def test_a_scalar_tensor_is_priced_per_layer():
    """A tensor with an empty shape (a converter's shape arithmetic, as a Keras MobileNetV1 has) is a segment
    like any other: priced per layer, no channel count read from its shape."""
    g = ir.Graph("scalar", {"x": ir.Tensor("x", (1, 8, 8, 3)), "y": ir.Tensor("y", (1, 8, 8, 4)),
                            "n": ir.Tensor("n", ())},
                 [ir.Op("conv", ir.CONV, ["x"], ["y"], in_channels=3, out_channels=4),
                  ir.Op("size", ir.RESHAPE, ["y"], ["n"], block=1)], ["x"], ["n"])
    segs = stage_segments(g, SearchOptions(patch_options=(2,)), "counted")
    last = next(s for s in segs if s.start == 1)
    assert last.grid is None and last.macs == 0 and last.instructions == 0.0
    assert stage_plans(g, SearchOptions(patch_options=(2,)), image="counted")[0].segments[-1] == last
