"""The stage-plan search: plans of several patch stages anywhere in a network (``tfmcu.plan.plans.Plan``).

* ``stage_segments(graph, options, image)``: every segment a plan can use: each op per layer, and every run of whole
  blocks x grid x halo treatment (``RECOMPUTE``, ``HALO_ALL``) that can run as one patch stage, with its analytic
  peak in one image mode, its exact MACs and an instruction estimate (``segment_instructions``);
* ``pareto_plans(graph, segments, options, max_stages, image)``: the Pareto front of plans, least peak first, by a
  dynamic programme over cut points (msf-CNN's search), against the MACs or the instruction estimate; with the
  segments' estimated TFLM tails (``Segment.tail``, a cost function's), the front of the whole arena (peak + tail);
  ``stage_plans`` computes the segments and the front in one call;
* ``plan_candidates(graph, options)``: what the one search (``tfmcu.plan.search.candidates``) adds with
  ``max_stages > 1``: some of each front, within the MAC and latency caps.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import replace
from typing import Any, Callable

from tfmcu.abi import LUT_MAX_CHANNELS, LUT_MIN_ELEMENTS, LUT_OPS, conv_shallow_ours
from tfmcu.graph import ir
from tfmcu.plan import regions
from tfmcu.plan.halo import HaloOptions, halo_caches, intermediates
from tfmcu.plan.latency import stage_overheads
from tfmcu.plan.plans import HALO_ALL, RECOMPUTE, Plan, Progress, SearchOptions, Segment, chain
from tfmcu.plan.profiler import step_memory
from tfmcu.plan.regions import ScheduleError, check_stage, is_global_pool

STAGE_HALOS = (RECOMPUTE, HALO_ALL)  # how a patch stage of a stage plan treats its halos (analytic)
# the image: held whole (counted), not counted but a patch's window (excluded, msf-CNN's accounting), or fed row by
# row to the first stage (streamed: its row window; an op that reads it per layer holds it whole)
IMAGE_MODES = ("counted", "excluded", "streamed")
MAX_PLANS_PER_FRONT = 12  # stage plans a search evaluates per Pareto front (its smallest half, the rest spread)
# With a latency cap, the plans of a front within it (the estimate's slack): up to this many (its smallest half, the
# rest spread). The estimate's overhead runs about half the predictor's, so the plans just within the cap lie deep
# in the front (MobileNetV2-1.0-224 on the Cortex-M7 at 1.05: the 10th-20th smallest of 107); the search prices them
# in order of their lower bound, so plans above the smallest that fits cost nothing
MAX_PLANS_UNDER_CAP = 48
# With a latency cap, plans whose estimated instructions (``segment_instructions``) exceed the cap by more than this
# factor are not priced (the estimate came 0.3-2% above the latency predictor along MobileNetV2-0.35-144's front)
PLAN_ESTIMATE_SLACK = 1.03
# With a latency cap, the smallest plan of each front within each of these caps up to it is a candidate too: what a
# tighter cap would price, a looser one prices as well (so a looser cap never ends with a larger arena for want of it)
# The most (start, end) pairs the stage-plan search schedules: beyond it, stages reach fewer cut points ahead (the
# MobileNetV2s have about 170 pairs, all scheduled; EfficientNet-B0 with its squeeze-excites about 850)
MAX_STAGE_PAIRS = 300
LATENCY_LADDER = (1.0, 1.01, 1.02, 1.03, 1.05, 1.075, 1.1, 1.15, 1.2, 1.25, 1.35, 1.5, 1.75, 2.0, 3.0, 5.0)


def plan_candidates(graph: ir.Graph, options: SearchOptions, progress: Progress | None = None,
                    tail: Callable[[Segment], int] | None = None) -> list[Plan]:
    """Stage plans as candidates: the analytic Pareto fronts (``stage_plans``, at most ``options.max_stages``
    stages; the image counted or excluded as ``count_input`` says, and streamed) without what the single-stage
    candidates already are (one stage at the first op), at most ``MAX_PLANS_PER_FRONT`` of each spread over it,
    within ``max_mac_overhead``. A stage may end into the global average pool (summed patch by patch). The fronts
    weigh the peak against the segments' instruction estimate; with ``max_latency``, only plans whose estimate is
    within it (``PLAN_ESTIMATE_SLACK``) are candidates, up to ``MAX_PLANS_UNDER_CAP`` of them, the smallest first, and
    the smallest within each tighter cap of ``LATENCY_LADDER`` besides. ``tail``: the cost function's estimate of
    the TFLM tail a segment adds (``Segment.tail``), so the fronts are of the whole arena (peak + tail; None: the
    peak alone)."""
    images = ["counted" if options.count_input else "excluded"] + (["streamed"] if options.accounting == "separate"
                                                                   else [])
    seen: set[tuple[Any, ...]] = set()
    out = []
    by_image = segments_by_image(graph, options, tuple(images), progress)
    if tail is not None:
        by_image = {im: [replace(s, tail=tail(s)) for s in segs] for im, segs in by_image.items()}
    for image in images:
        segs = by_image[image]
        limit = None  # with a latency cap, the plans whose estimate is near it (the predictor decides)
        if options.max_latency is not None:  # a factor of TFLM + CMSIS-NN per layer (not of our kernels' rate)
            per_layer = segment_instructions(graph, list(range(len(graph.ops))), None, stage_overheads(ours=False))
            limit = options.max_latency * PLAN_ESTIMATE_SLACK * per_layer
        front = [p for p in pareto_plans(graph, segs, options, options.max_stages, image, by="instructions",
                                         max_cost=limit)
                 if p.stages and not (len(p.stages) == 1 and p.stages[0].start == 0)]
        ladder: list[Plan] = []
        if options.max_latency is not None:
            for cap in (c for c in LATENCY_LADDER if c <= options.max_latency):  # (the front: least arena first)
                ladder += [next((p for p in front if p.instructions <= cap * PLAN_ESTIMATE_SLACK * per_layer), None)]
        most = MAX_PLANS_PER_FRONT if options.max_latency is None else MAX_PLANS_UNDER_CAP
        if len(front) > most:  # the smallest half, and the other half spread over the rest
            low, rest = front[:most // 2], front[most // 2:]
            n = most - len(low)
            step = (len(rest) - 1) / (n - 1)
            front = low + [rest[round(i * step)] for i in range(n)]
        front += [p for p in ladder if p is not None]
        for p in front:
            key = tuple((s.start, s.stop, s.grid, s.halo) for s in p.stages)
            if key in seen:
                continue
            seen.add(key)
            out.append(p)
    return out


def _global_pool_after(graph: ir.Graph, outputs: list[str]) -> int | None:
    """The op index of a global average pool that is the only consumer of the stage's single output, if any."""
    if len(outputs) != 1:
        return None
    cons = graph.consumers().get(outputs[0], [])
    if len(cons) != 1 or outputs[0] in graph.outputs:
        return None
    return cons[0] if is_global_pool(graph, graph.ops[cons[0]]) else None


def _elementwise(graph: ir.Graph, op: ir.Op, calls: list[int] | None, elements: int, costs: dict[str, Any]) -> float:
    """An element-wise op's instructions (``stage_overheads``' element costs): per layer, ``elements`` in TFLM's
    kernel; in a stage (``calls``: the elements of each of its calls), its portable kernel's, a call through tables
    where it has ``abi.LUT_MIN_ELEMENTS`` elements or more per table (``abi.lut_lanes``)."""
    name = op.attrs.get("tflite_op")
    if name not in costs["stage_element"]:
        return 0.0
    if calls is None:
        layer = costs["layer_element"]
        row = f"{name}:broadcast" if op.attrs.get("broadcast") and f"{name}:broadcast" in layer else name
        return elements * layer.get(row, 0.0)
    c = costs["stage_element"][name]
    lanes = 1 if name in LUT_OPS else 0
    if op.attrs.get("constant_operands"):  # a one-pixel constant operand: its values are not in the graph (a scalar
        channels = op.out_channels            # taken beyond LUT_MAX_CHANNELS channels: Keras' Rescaling)
        lanes = channels if channels <= LUT_MAX_CHANNELS else 1
    if not lanes:
        return elements * c["out"]
    per = c["lut_out"] if lanes == 1 else c["lut_lanes_out"]
    return float(sum(lanes * c["lut_calls"] + n * per if n >= lanes * LUT_MIN_ELEMENTS else n * c["out"]
                     for n in calls))


def segment_instructions(graph: ir.Graph, ops: list[int], walks: tuple[list[Any], list[Any]] | None,
                         costs: dict[str, Any], passes: regions.Passes | None = None) -> float:
    """A coarse estimate of a segment's instructions for the stage-plan search (``tfmcu.plan.latency.stage_overheads``'
    calibrated costs): its convolutions' MACs, and for a patch stage (``walks``: its row and column band walks,
    ``need`` or, with halo caches, ``comp``) per patch, per kernel call (a layer on a patch that computes something)
    and per filter element each call of a 1x1 convolution re-reads. Not the latency predictor (which needs the
    rewritten model): only how the search orders plans of equal peak. ``passes``: a stage's passes (an op on tiles
    costs as often as it runs)."""
    total = 0.0
    for i in ops:
        op = graph.ops[i]
        before = total
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
            sizes = [r * c * (out.shape[-1] if out.shape else 1) for r in got[0] if r for c in got[1] if c]
            total += _elementwise(graph, op, sizes, sum(sizes), costs)
        else:
            total += _elementwise(graph, op, None, out.nbytes, costs)
        # (a first layer over a shallow window: our kernel's rate, costs["shallow_scale"])
        shallow = costs.get("shallow_scale", 1.0) if op.type == ir.CONV and conv_shallow_ours(
            op.kernel, op.groups, op.dilation, op.in_channels, op.out_channels, 0) else 1.0
        total += macs * (costs["dw_mac"] if op.type == ir.DEPTHWISE else costs["conv_mac"] * shallow)
        channels = out.shape[-1] if out.shape else 1  # (a scalar: a reshape's shape arithmetic)
        if op.type == ir.CONV:
            total += pixels * costs["conv_element"] * channels * op.kernel[0] * op.kernel[1] * shallow
        elif op.type == ir.DEPTHWISE:
            total += pixels * costs["dw_pixel"]
        elif op.type == ir.ADD:
            total += pixels * costs["add_element"] * channels
        if passes is not None and passes.count > 1 and i in passes.masks:
            total = before + (total - before) * passes.runs(i)
    if walks is not None:
        total += len(walks[0]) * len(walks[1]) * costs["patch"]
    return total


def _band_len(w: Any, t: str) -> int:
    r = (getattr(w, "comp", None) or w.need).get(t, (0, 0))
    return max(r[1] - r[0], 0)


def stage_segments(graph: ir.Graph, options: SearchOptions = SearchOptions(), image: str = "counted",
                   progress: Progress | None = None, pooled: bool = True) -> list[Segment]:
    """Every segment a stage plan can use: each op per layer, and every run of whole blocks that can form a patch
    stage x square grid (``options.patch_options``, up to the stage output's side) x ``STAGE_HALOS`` (halo caches
    need separate accounting), with the stage's analytic peak (``regions.schedule`` / ``halo.halo_caches``; the image
    as ``image`` says) and its exact MACs; a stage whose output only a global average pool reads also as ``pooled``
    (the pool's op in the stage: its input summed patch by patch, never held whole; ``pooled=False``: not)."""
    return segments_by_image(graph, options, (image,), progress, pooled)[image]


def segments_by_image(graph: ir.Graph, options: SearchOptions, images: tuple[str, ...],
                      progress: Progress | None = None, pooled: bool = True) -> dict[str, list[Segment]]:
    """``stage_segments`` in several image modes at once: each stage's schedule and halo caches are built once, its
    peak read in every mode."""
    for image in images:
        if image not in IMAGE_MODES:
            raise ScheduleError(f"image {image!r}: expected one of {', '.join(IMAGE_MODES)}")
        if image == "streamed" and options.accounting != "separate":
            raise ScheduleError(f"a streamed image is planned with separate accounting, not {options.accounting!r}")
    blocks = [op.block for op in graph.ops]
    if blocks != sorted(blocks):
        raise ScheduleError("the graph's blocks are not in op order: stage plans need a chain of blocks")
    facts = regions.GraphFacts(graph)
    life = facts.life
    costs = stage_overheads()
    segs: dict[str, list[Segment]] = {}
    for image in images:
        mem = step_memory(graph, life, exclude_inputs=image == "excluded", accounting=options.accounting)
        segs[image] = [Segment(start=i, stop=i + 1, peak=mem[i], macs=ir.op_macs(graph, op),
                               instructions=segment_instructions(graph, [i], None, costs))
                       for i, op in enumerate(graph.ops)]
    # a stage starts where a block starts, or after a squeeze-excite's scaling (a broadcast MUL: the stage before may
    # end at its input, the MEAN and its layers run per layer)
    starts = sorted({i for i, op in enumerate(graph.ops) if i == 0 or op.block != graph.ops[i - 1].block}
                    | {i + 1 for i, op in enumerate(graph.ops[:-1]) if op.type == ir.MUL and op.attrs.get("broadcast")
                       and len(op.inputs) == 2})
    halos = STAGE_HALOS if options.accounting == "separate" else (RECOMPUTE,)
    # a stage ends where a block starts, at the end, or before a global average pool (it may end into the pool)
    pools = [i for i, op in enumerate(graph.ops) if op.type == ir.MEAN and i not in starts]
    ends = sorted(set(starts[1:] + pools + [len(graph.ops)]))
    # every (start, end) pair, the shortest first when there are too many (a network of many blocks and
    # squeeze-excites): each stage then reaches at most the k-th cut point after its start, k as large as the cap on
    # pairs allows (a longer stage's peak and MACs are met by a chain of shorter ones where it matters)
    spans = [(k, a, b) for a in starts for k, b in enumerate([e for e in ends if e > a])]
    reach = max((k for k, _, _ in spans), default=0) + 1
    while reach > 1 and sum(1 for k, _, _ in spans if k < reach) > MAX_STAGE_PAIRS:
        reach -= 1
    pairs = sorted((a, b) for k, a, b in spans if k < reach)

    def stage(s: regions.PatchSchedule, start: int, stop: int, grid: tuple[int, int], halo: HaloOptions,
              into_pool: bool) -> None:
        walks: Any = (s.rows, s.cols)
        if options.accounting != "separate":
            peaks = {im: s.stage_peak_bytes if im == "counted" else s.stage_peak_bytes_excluding_input
                     for im in images}
            macs = s.stage_macs_patched_exact
        else:  # (no cache: regions' figures, and the streamed one)
            inter = intermediates(s) if halo.caches else []
            h = halo_caches(s, inter, inter)
            peaks, macs, walks = {im: h.stage_peak(im) for im in images}, h.stage_macs_exact, (h.rows, h.cols)
        estimate = segment_instructions(graph, s.stage, walks, costs, s.passes)
        for im in images:
            segs[im].append(Segment(start=start, stop=stop, grid=grid, halo=halo, peak=peaks[im], macs=macs,
                                    pooled=into_pool, instructions=estimate, passes=s.passes.count))

    for n, (a, b) in enumerate(pairs):
        if progress:
            progress(n + 1, len(pairs), f"stage plans: the stages over ops {a}-{b - 1}")
        idx = list(range(a, b))
        try:
            ins, outs = check_stage(graph, idx, facts)
        except ScheduleError:
            continue
        if not graph.tensors[outs[0]].is_feature_map:  # (after the global pool: nothing to cut into patches)
            continue
        if len(ins) != 1 or len(outs) != 1:  # (a stage op takes one input and makes one output)
            continue
        height, width = graph.tensors[outs[0]].hw
        pool = _global_pool_after(graph, outs)
        # square grids, and row bands (p x 1: one call per band and layer, the fewest per-call costs)
        grids = sorted({(p, p) for p in options.patch_options if 1 < p <= min(height, width)}
                       | {(p, 1) for p in options.patch_options if 1 < p <= height})
        for p in grids:
            try:
                s = regions.schedule(graph, p, ops=idx, accounting=options.accounting, facts=facts)
            except ScheduleError:
                continue
            if s.passes.count > 1 and not options.se_in_stages:
                continue
            for v in halos:
                stage(s, a, b, p, v, False)
            if pool is not None and pooled:  # the same ops and the pool: the output summed into C int32
                try:
                    sp = regions.schedule(graph, p, ops=idx + [pool], accounting=options.accounting, facts=facts)
                except ScheduleError:
                    continue
                for v in halos:
                    stage(sp, a, pool + 1, p, v, True)
    return segs


def stage_plans(graph: ir.Graph, options: SearchOptions = SearchOptions(), max_stages: int | None = None,
                image: str = "counted", progress: Progress | None = None, pooled: bool = True) -> list[Plan]:
    """The Pareto front of stage plans, least peak first (each the fewest MACs at its peak): a dynamic programme over
    the graph's chain of ops (msf-CNN's search over cut points), labels (peak, MACs, stages) kept per cut point and
    extended by every segment that starts there (``stage_segments``); at most ``max_stages`` patch stages (None: any
    number). Candidates above ``options.max_mac_overhead`` are dropped from the front."""
    options.validate()
    if max_stages is not None and max_stages < 0:
        raise ScheduleError(f"--max_stages={max_stages}: expected >= 0")
    return pareto_plans(graph, stage_segments(graph, options, image, progress, pooled), options, max_stages, image)


def pareto_plans(graph: ir.Graph, segs: list[Segment], options: SearchOptions = SearchOptions(),
                 max_stages: int | None = None, image: str = "counted", by: str = "macs",
                 max_cost: float | None = None) -> list[Plan]:
    """``stage_plans``' dynamic programme over given segments (``stage_segments``: computed once for several
    ``max_stages``); ``by``: the cost weighed against the peak, ``macs`` (exact) or ``instructions`` (the
    segments' estimate: per-call and per-patch costs too). ``max_cost``: only plans of at most that cost (a label
    that cannot end within it, or within ``options.max_mac_overhead``, is dropped as soon as it is made)."""
    if by not in ("macs", "instructions"):
        raise ScheduleError(f"stage plans by {by!r}: expected macs or instructions")
    cost_of = (lambda seg: seg.macs) if by == "macs" else (lambda seg: seg.instructions)
    by_start: dict[int, list[Segment]] = {}
    for s in _undominated(segs, cost_of):
        by_start.setdefault(s.start, []).append(s)
    n = len(graph.ops)
    # from each cut point to the end: the least cost and MACs a label must still add, and the least peak it must
    # still pass (a label's peak below it is as good as it: every plan through the cut point reaches it)
    inf = float("inf")
    rest_cost, rest_macs, rest_peak = [inf] * n + [0.0], [inf] * n + [0.0], [inf] * n + [0.0]
    for at in range(n - 1, -1, -1):
        for s in by_start.get(at, []):
            rest_cost[at] = min(rest_cost[at], cost_of(s) + rest_cost[s.stop])
            rest_macs[at] = min(rest_macs[at], s.macs + rest_macs[s.stop])
            rest_peak[at] = min(rest_peak[at], max(s.peak, rest_peak[s.stop]))
    base = sum(ir.op_macs(graph, op) for op in graph.ops)
    max_macs = None if options.max_mac_overhead is None else (1 + options.max_mac_overhead) * base + 1e-6 * base
    # a label: (peak, tail, cost, MACs, stages, path). A plan's arena is its largest peak plus the sum of its tails,
    # so a label beats another whatever follows when its tail is no larger, its peak + tail no larger (a later
    # segment can raise both peaks to the same: the tails decide; or none does: peak + tail decides) and its cost no
    # larger; and its MACs where a MAC cap filters the front and the cost is the instruction estimate (with cost =
    # MACs the two are one criterion), and its stages where their number is capped. With no tail (every segment's
    # 0) that is the (peak, cost) front. ``path``: (the last segment, the path before it), shared between labels.
    Label = tuple[int, int, float, int, int, Any]
    pending: list[list[Label]] = [[] for _ in range(n + 1)]  # the labels made at each cut point, not yet reduced
    pending[0] = [(0, 0, 0.0, 0, 0, None)]
    by_macs = by == "instructions" and options.max_mac_overhead is not None
    front_of = _front if not by_macs and max_stages is None else _front_pairwise(by_macs, max_stages is not None)
    most_stages = n if max_stages is None else max_stages
    cost_cap, macs_cap = (inf if max_cost is None else max_cost), (inf if max_macs is None else max_macs)
    for at in range(n):
        labels = front_of(pending[at])
        pending[at] = []
        # each segment as (stop, peak (at least the least after it), tail, cost, MACs, patched, segment, the least
        # cost and MACs after it)
        outs = [(s.stop, max(s.peak, int(rest_peak[s.stop])), s.tail, cost_of(s), s.macs, int(s.patched), s,
                 rest_cost[s.stop], rest_macs[s.stop]) for s in by_start.get(at, []) if rest_peak[s.stop] < inf]
        for peak, tail, cost, macs, stages, path in labels:
            for stop, s_peak, s_tail, s_cost, s_macs, patched, s, after, after_macs in outs:
                k = stages + patched
                c, m = cost + s_cost, macs + s_macs
                if k > most_stages or c + after > cost_cap or m + after_macs > macs_cap:
                    continue
                pending[stop].append((peak if peak > s_peak else s_peak, tail + s_tail, c, m, k, (s, path)))
    final = sorted(front_of(pending[n]), key=lambda lab: (lab[0] + lab[1], lab[2]))
    front: list[Plan] = []
    least = None  # the cost of the last plan kept
    for _, _, cost, _, _, path in final:
        if least is not None and cost >= least:
            continue
        chained: list[Segment] = []
        while path is not None:
            chained.append(path[0])
            path = path[1]
        p = chain(graph, tuple(reversed(chained)), image)
        if options.max_mac_overhead is not None and p.mac_overhead > options.max_mac_overhead + 1e-12:
            continue
        front.append(p)
        least = cost
    return front


_BY_COST = operator.itemgetter(2, 1, 0)


def _undominated(segs: list[Segment], cost_of: Callable[[Segment], float]) -> list[Segment]:
    """The segments no other over the same ops beats on peak, tail, cost, MACs and being a stage (any label extended
    by the other would beat the label extended by it; of equal ones the one of the least instruction estimate, then
    the first), in their order."""
    groups: dict[tuple[int, int], list[tuple[tuple[Any, ...], float, int, Segment]]] = {}
    for i, s in enumerate(segs):
        key = (s.peak, s.tail, cost_of(s), s.macs, int(s.patched))
        groups.setdefault((s.start, s.stop), []).append((key, s.instructions, i, s))
    kept: list[tuple[int, Segment]] = []
    for group in groups.values():
        out: list[tuple[Any, ...]] = []
        for key, _, i, s in sorted(group, key=operator.itemgetter(0, 1, 2)):  # (one is beaten only by one before)
            if not any(all(a <= b for a, b in zip(k, key)) for k in out):
                out.append(key)
                kept.append((i, s))
    return [s for _, s in sorted(kept, key=operator.itemgetter(0))]


def _front(labels: list[Any]) -> list[Any]:
    """The labels no other beats on (tail, peak + tail, cost) (``pareto_plans``), in one sweep: by cost, each kept
    unless one kept before has no larger tail and no larger peak + tail (a staircase: tails up, sums down)."""
    out: list[Any] = []
    tails: list[int] = []
    sums: list[int] = []
    for lab in sorted(labels, key=_BY_COST):  # (equal cost and tail: the least peak first)
        t, total = lab[1], lab[0] + lab[1]
        i = bisect.bisect_right(tails, t)  # the kept labels of tail <= t: the last has the least sum
        if i and sums[i - 1] <= total:
            continue
        out.append(lab)
        j = i
        while j < len(tails) and sums[j] >= total:  # what it beats on the staircase
            j += 1
        tails[i:j], sums[i:j] = [t], [total]
    return out


def _front_pairwise(by_macs: bool, by_stages: bool) -> Callable[[list[Any]], list[Any]]:
    """``_front`` with the MACs and / or the stages as criteria too: label by label."""

    def beats(a: Any, b: Any) -> bool:
        return (a[1] <= b[1] and a[0] + a[1] <= b[0] + b[1] and a[2] <= b[2] and (not by_macs or a[3] <= b[3])
                and (not by_stages or a[4] <= b[4]))

    def front(labels: list[Any]) -> list[Any]:
        kept: list[Any] = []
        for lab in labels:
            if any(beats(k, lab) for k in kept):
                continue
            kept = [k for k in kept if not beats(lab, k)] + [lab]
        return kept

    return front
