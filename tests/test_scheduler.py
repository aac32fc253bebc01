"""Profiler and patch scheduler on the IR (pure Python; no TensorFlow).

The region math is checked two ways here: against hand-derived MobileNetV2 figures (the paper's 75x75 input patch,
+42% patch-stage MACs) and against a brute-force dependency propagation (boolean masks pushed backwards pixel by
pixel) on random graphs. The float numerical proof with Keras lives in test_patch_numerics.py.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from tfmcu.graph import ir
from tfmcu.graph.from_spec import from_spec
from tfmcu.plan import profiler
from tfmcu.plan import regions as scheduler
from tfmcu.plan.search import WIDE_GRIDS, AnalyticCost, SearchOptions, search
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec

MBV2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mbv2_spec(resolution: int = 224, width: float = 1.0) -> NetSpec:
    stages = [StageSpec([BlockSpec(c, kernel=3, expand=t, stride=s if i == 0 else 1) for i in range(n)])
              for t, c, n, s in MBV2]
    return NetSpec(name="mbv2", resolution=resolution, width_multiplier=width, stages=stages,
                   head=HeadSpec(1280, scale_last_channels=True))


def random_spec(rng: random.Random, padding: str) -> NetSpec:
    stages = []
    for _ in range(rng.randint(2, 3)):
        c = rng.choice([8, 16])
        blocks = [BlockSpec(c, kernel=rng.choice([1, 3, 5, 7]), expand=rng.choice([1, 3]),
                            stride=rng.choice([1, 2]) if i == 0 else 1) for i in range(rng.randint(1, 3))]
        stages.append(StageSpec(blocks))
    return NetSpec(name="rand", resolution=rng.choice([29, 32, 40, 47]), padding=padding,
                   stem=StemSpec(8, kernel=rng.choice([1, 3, 5, 7]), stride=rng.choice([1, 2])), stages=stages,
                   head=HeadSpec(16, num_classes=4))


# ----------------------------------------------------------------------------- profiler
def test_mbv2_profile_matches_hand_computation():
    g = from_spec(mbv2_spec())
    p = profiler.profile(g)
    # Published: 300M MACs (Sandler et al. 2018, Table 3).
    assert abs(p.macs - 300e6) / 300e6 < 0.01
    # Peak: block 2's stride-2 depthwise reads 112x112x96 and writes 56x56x96 (TFLM measures the same head).
    assert p.peak_sram_per_layer_bytes == 112 * 112 * 96 + 56 * 56 * 96 == 1_505_280
    assert p.peak_layer == "block2_depthwise"
    # The stem holds the input image and its output.
    stem = p.layers[0]
    assert stem.memory_bytes == 224 * 224 * 3 + 112 * 112 * 32
    assert stem.memory_bytes_excluding_input == 112 * 112 * 32
    # Residual branch: block 3's depthwise keeps the block input alive (56x56x24) besides its own in/out.
    dw3 = next(layer for layer in p.layers if layer.name == "block3_depthwise")
    assert dw3.memory_bytes == 56 * 56 * 24 + 2 * 56 * 56 * 144
    assert p.flash_bytes == sum(op.weights + 4 * op.biases for op in g.ops)
    assert [b.index for b in p.blocks] == list(range(19))  # stem, 17 blocks, head


# ----------------------------------------------------------------------------- accounting modes
def test_paper_accounting_reproduces_the_papers_mbv2_figures():
    """--accounting=paper: depthwise in place, a residual branch written over its shortcut. MobileNetV2-224 then
    gives the paper's 1372 kB per layer and about 172 kB with 4x4 patches over 5 blocks (8x), the input image not
    counted (it is streamed patch by patch in the paper's figure)."""
    g = from_spec(mbv2_spec())
    p = profiler.profile(g, "paper")
    assert p.accounting == "paper"
    # Peak: block 2's expansion 112x112x16 -> 112x112x96 (its stride-2 depthwise now needs only its input).
    assert p.peak_sram_per_layer_bytes == 112 * 112 * 16 + 112 * 112 * 96 == 1372 * 1024
    assert p.peak_layer == "block2_expand"
    by_name = {layer.name: layer for layer in p.layers}
    assert by_name["block2_depthwise"].memory_bytes == 112 * 112 * 96  # max(in, out): in place
    # A residual block: the depthwise in place next to the shortcut; the projection writes over the shortcut.
    assert by_name["block3_depthwise"].memory_bytes == 56 * 56 * 24 + 56 * 56 * 144
    assert by_name["block3_project"].memory_bytes == 56 * 56 * 144 + 56 * 56 * 24
    s = scheduler.schedule(g, 4, n_blocks=5, accounting="paper")
    assert s.accounting == "paper" and s.input_patch_size == (75, 75)
    assert s.stage_macs_patched_padded / s.stage_macs - 1 == pytest.approx(0.42, abs=0.01)
    # The rest peaks in the 28x28 residual blocks: 28x28x32 + 28x28x192 = 171.5 kB (paper: about 172 kB).
    assert s.peak_sram_bytes_excluding_input == 28 * 28 * 32 + 28 * 28 * 192 == 175_616
    assert round(p.peak_sram_per_layer_bytes / s.peak_sram_bytes_excluding_input, 2) == 8.0  # paper: 8x
    # Patch by patch the same pairs share: the stage needs less than with separate buffers.
    sep = scheduler.schedule(g, 4, n_blocks=5)
    assert s.stage_peak_bytes_excluding_input < sep.stage_peak_bytes_excluding_input
    assert s.stage_peak_bytes_excluding_input >= 28 * 28 * 32 + 75 * 75 * 3


def test_tflm_inplace_accounting_is_the_memory_plans_bound():
    """--accounting=tflm_inplace shares what the in-place memory plans may overlap (TFLM's reference kernels, the
    16-byte aligned distances): its per-layer peak is the plans' own lower bound; the patch stage keeps disjoint
    patch buffers, so only the rest changes."""
    from tfmcu.plan import memory_plan

    g = from_spec(mbv2_spec(resolution=96, width=0.35))
    p = profiler.profile(g, "tflm_inplace")
    assert p.peak_sram_per_layer_bytes == memory_plan.inplace_lower_bound(g)
    assert p.peak_sram_per_layer_bytes < profiler.profile(g).peak_sram_per_layer_bytes
    mem = profiler.step_memory(g, accounting="tflm_inplace")
    plain = profiler.step_memory(g)
    pairs = memory_plan.inplace_overlaps(g)
    producer = g.producer()
    for i in range(len(g.ops)):
        shares = [min(g.tensors[x].nbytes, g.tensors[y].nbytes - d) for (y, x), d in pairs.items()
                  if producer[y] == i]
        assert plain[i] - mem[i] == max([0] + shares), g.ops[i].name
    s, sep = scheduler.schedule(g, 4, n_blocks=5, accounting="tflm_inplace"), scheduler.schedule(g, 4, n_blocks=5)
    assert s.stage_peak_bytes == sep.stage_peak_bytes and s.rest_peak_bytes <= sep.rest_peak_bytes
    with pytest.raises(ValueError, match="accounting"):
        profiler.profile(g, "tinyengine")


def test_search_uses_the_accounting():
    g = from_spec(mbv2_spec(resolution=144, width=0.35))
    paper = search(g, AnalyticCost(False), 64 * 1024, SearchOptions(accounting="paper", count_input=False))
    separate = search(g, AnalyticCost(False), 64 * 1024, SearchOptions(count_input=False))
    assert paper.baseline.cost < separate.baseline.cost
    assert paper.smallest.cost < separate.smallest.cost
    assert any(c.patched for c in paper.candidates)
    assert all(s.accounting == "paper" for c in paper.candidates for s in c.schedules())


# ----------------------------------------------------------------------------- scheduler vs the paper
def test_mbv2_patch_stage_matches_paper():
    g = from_spec(mbv2_spec())
    s = scheduler.schedule(g, 4, n_blocks=5)
    assert s.stage_outputs == ["block4_project/out"]
    assert g.tensors["block4_project/out"].hw == (28, 28)
    assert s.input_patch_size == (75, 75)  # paper: 75x75
    assert s.stage_macs_patched_padded / s.stage_macs - 1 == pytest.approx(0.42, abs=0.01)  # paper: +42%
    assert s.stage_macs < s.stage_macs_patched_exact < s.stage_macs_patched_padded
    # Stage memory: 28x28x32 output buffer + the biggest patch working set.
    assert s.stage_peak_bytes_excluding_input > 28 * 28 * 32
    assert s.stage_peak_bytes > 224 * 224 * 3 + 28 * 28 * 32
    assert s.stage_peak_bytes_excluding_input >= 28 * 28 * 32 + 75 * 75 * 3
    assert s.peak_sram_bytes < profiler.profile(g).peak_sram_per_layer_bytes / 4


def test_corner_patch_padding_and_regions():
    g = from_spec(mbv2_spec())
    s = scheduler.schedule(g, 4, n_blocks=5)
    stem = 0
    # Top-left patch: the stem (TF SAME, stride 2 on even input: pad 0 top/left, 1 bottom/right) needs no pad
    # at the top-left, and the 3x3 depthwise of block 1 (pad 1) does.
    r = s.region(stem, (0, 0))
    assert r.reads[0][2] == (0, 0, 0, 0)
    dw1 = next(i for i, op in enumerate(g.ops) if op.name == "block1_depthwise")
    r = s.region(dw1, (0, 0))
    assert r.reads[0][2][0] == 1 and r.reads[0][2][2] == 1
    # Bottom-right patch: the stem pads one row/column at the bottom/right.
    r = s.region(stem, (3, 3))
    assert r.reads[0][2] == (0, 1, 0, 1)
    assert r.out[0][1] == 112 and r.out[1][1] == 112


def test_uneven_and_rectangular_grids():
    g = from_spec(mbv2_spec(160))
    s = scheduler.schedule(g, (2, 3), n_blocks=5)
    assert s.grid == (2, 3) and s.patches == 6
    assert [w.band for w in s.cols] == [(0, 7), (7, 14), (14, 20)]
    t = s.stage_outputs[0]
    covered = np.zeros(g.tensors[t].hw, dtype=int)
    for i, j in s.patch_iter():
        (r0, r1), (c0, c1) = s.region(s.stage[-1], (i, j)).out
        covered[r0:r1, c0:c1] += 1
    assert (covered == 1).all()  # output patches tile the stage output exactly once


def test_stage_by_ops_and_errors():
    g = from_spec(mbv2_spec(96))
    s = scheduler.schedule(g, 2, n_ops=4)
    assert s.stage == [0, 1, 2, 3]
    # every op up to the global average pool: a stage that sums the pool's input patch by patch
    pooled = scheduler.schedule(g, 2, n_ops=len(g.ops) - 1)
    assert pooled.pool == len(g.ops) - 2 and pooled.stage_outputs == g.ops[-2].outputs
    assert pooled.tiles == g.ops[-2].inputs and pooled.tiled == pooled.stage[:-1]
    assert pooled.region(pooled.pool, (1, 0)).out == ((0, 1), (0, 1))
    with pytest.raises(scheduler.ScheduleError, match="blocks"):
        scheduler.schedule(g, 2, n_blocks=99)
    with pytest.raises(scheduler.ScheduleError, match="do not fit"):
        scheduler.schedule(g, 13, n_blocks=5)


def test_se_block_runs_in_two_passes():
    """A squeeze-excite inside a stage: its MEAN sums each patch's own tile in a first pass, its 1x1 layers run once
    on the 1 x 1 result, and a second pass recomputes the layers before it and scales the map: the MACs count every
    op as often as the passes it runs in, the ops on whole tensors once."""
    spec = NetSpec(name="se", resolution=64, stages=[StageSpec([BlockSpec(16, se=0.25)]),
                                                     StageSpec([BlockSpec(24, stride=2)])])
    g = from_spec(spec)
    names = [op.name for op in g.ops]
    squeeze, reduce_, expand, excite = (names.index(f"block1_se_{n}") for n in ("squeeze", "reduce", "expand", "excite"))
    s = scheduler.schedule(g, 2, n_blocks=2)
    p = s.passes
    assert p.count == 2 and p.inner == (squeeze,) and p.after == {reduce_: 0, expand: 0}
    assert p.masks[squeeze] == 1 and p.masks[excite] == 2 and p.masks[names.index("block1_project")] == 2
    assert all(p.masks[i] == 3 for i in range(squeeze))  # the stem, expand and depthwise: in both passes
    # each band's tile of the squeezed map: a partition of its rows (and columns)
    assert [r for r in s.row_owns[squeeze]] == [(0, 16), (16, 32)] == s.col_owns[squeeze]
    # exact MACs: per op on tiles, its computed boxes times its passes; the whole ops once
    exact = 0
    for i in s.stage:
        op = g.ops[i]
        if i in p.after:
            exact += ir.op_macs(g, op)
        elif ir.macs_per_output_pixel(op):
            t = op.outputs[0]
            box = sum(w.need[t][1] - w.need[t][0] for w in s.rows) * sum(w.need[t][1] - w.need[t][0] for w in s.cols)
            exact += p.runs(i) * ir.macs_per_output_pixel(op) * box
    assert s.stage_macs_patched_exact == exact > 2 * sum(ir.op_macs(g, g.ops[i]) for i in range(squeeze))
    assert scheduler.max_stage_blocks(g) == g.num_blocks - 1
    # the statistic may not leave the stage: a stage ending inside the squeeze-excite is refused in one line
    with pytest.raises(scheduler.ScheduleError, match="must end after the squeeze-excite"):
        scheduler.schedule(g, 2, n_ops=reduce_ + 1)


# ----------------------------------------------------------------------------- auto mode
def auto(g, budget, max_mac_overhead=None, count_input=True):
    """The analytic schedule search (tfmcu.plan.search) with the least-MACs objective."""
    return search(g, AnalyticCost(count_input), budget,
                  SearchOptions(max_mac_overhead=max_mac_overhead, count_input=count_input))


def test_auto_picks_least_macs_that_fits():
    g = from_spec(mbv2_spec(224, 0.35))
    prof = profiler.profile(g)
    budget = prof.peak_sram_per_layer_bytes // 2
    res = auto(g, budget)
    assert res.feasible and res.chosen.candidate.patched
    fitting = [c for c in res.candidates if c.peak_sram_bytes <= budget]
    assert res.chosen.candidate.macs == min(c.macs for c in fitting)
    assert res.chosen.candidate.peak_sram_bytes <= budget
    # A budget the per-layer net fits picks no patching (least MACs).
    big = auto(g, prof.peak_sram_per_layer_bytes)
    assert not big.chosen.candidate.patched
    # ... and builds no other candidate, not even with every grid and plans of any number of stages
    wide = search(g, AnalyticCost(True), prof.peak_sram_per_layer_bytes,
                  SearchOptions(objective="macs", patch_options=WIDE_GRIDS, max_stages=None))
    assert not wide.chosen.candidate.patched and len(wide.candidates) == 1 and len(wide.evaluated) == 1
    assert "already fits" in wide.message
    # A MAC-overhead cap is honoured.
    capped = auto(g, budget, max_mac_overhead=0.05)
    if capped.feasible:
        assert capped.chosen.candidate.mac_overhead <= 0.05
    # Impossible budget: says the smallest achievable peak.
    none = auto(g, 1024)
    assert not none.feasible and "smallest achievable peak" in none.message
    assert none.smallest.candidate.peak_sram_bytes == min(c.peak_sram_bytes for c in none.candidates)


def test_auto_without_input_counts_less():
    g = from_spec(mbv2_spec(224, 0.35))
    res = auto(g, 10**9, count_input=False)
    for c in res.candidates:
        assert c.peak_sram_bytes_excluding_input <= c.peak_sram_bytes


class _SlowAnalytic(AnalyticCost):
    """The analytic cost, each evaluation taking ``delay`` seconds (a stand-in for a slow pricing)."""

    def __init__(self, delay: float):
        super().__init__(True)
        self.delay = delay

    def evaluate(self, candidate, variant):
        time.sleep(self.delay)
        return super().evaluate(candidate, variant)


@pytest.mark.parametrize("objective", ["macs", "memory"])
def test_a_time_budget_cuts_the_search_short_and_says_so(objective):
    g = from_spec(mbv2_spec(224, 0.35))
    budget = profiler.profile(g).peak_sram_per_layer_bytes // 4
    full = search(g, AnalyticCost(True), budget, SearchOptions(objective=objective))
    assert full.cut_short == 0 and "cut the search short" not in full.message
    cut = search(g, _SlowAnalytic(0.05), budget, SearchOptions(objective=objective, search_seconds=0.2))
    assert cut.cut_short > 0 and "cut the search short" in cut.message
    assert len(cut.evaluated) < len(full.evaluated)
    assert cut.seconds > 0.2
    assert cut.to_dict()["cut_short"] == cut.cut_short
    if cut.chosen is not None:  # the best found so far is never better than the full search's
        assert cut.chosen.cost >= full.chosen.cost or objective == "macs"
    with pytest.raises(scheduler.ScheduleError, match="search_seconds"):
        SearchOptions(search_seconds=0).validate()
    # a budget that does not run out: the likeliest-first order finds the same minimum as branch and bound
    ample = search(g, AnalyticCost(True), budget, SearchOptions(objective=objective, search_seconds=3600))
    assert ample.cut_short == 0 and ample.smallest.cost == full.smallest.cost
    assert (ample.chosen is None) == (full.chosen is None)
    if full.chosen is not None:
        assert ample.chosen.cost == full.chosen.cost


# ----------------------------------------------------------------------------- brute force
def _brute_force_need(g: ir.Graph, idx: list[int], outs: list[str], rows: tuple[int, int],
                      cols: tuple[int, int]) -> dict[str, np.ndarray]:
    """Boolean mask of every tensor pixel the output patch depends on, propagated op by op."""
    need = {}
    for t in outs:
        m = np.zeros(g.tensors[t].hw, bool)
        m[rows[0]:rows[1], cols[0]:cols[1]] = True
        need[t] = m
    for i in reversed(idx):
        op = g.ops[i]
        out = None
        for t in op.outputs:
            if t in need:
                out = need[t] if out is None else out | need[t]
        for t in op.inputs:
            h, w = g.tensors[t].hw
            m = need.setdefault(t, np.zeros((h, w), bool))
            if not op.is_window:
                m |= out
                continue
            for y, x in zip(*np.nonzero(out)):
                y0 = y * op.stride[0] - op.padding[0]
                x0 = x * op.stride[1] - op.padding[2]
                for ky in range(op.kernel[0]):
                    for kx in range(op.kernel[1]):
                        yy, xx = y0 + ky * op.dilation[0], x0 + kx * op.dilation[1]
                        if 0 <= yy < h and 0 <= xx < w:
                            m[yy, xx] = True
    return need


@pytest.mark.parametrize("seed", range(8))
def test_regions_match_brute_force(seed):
    rng = random.Random(seed)
    spec = random_spec(rng, "same" if seed % 2 else "symmetric")
    g = from_spec(spec)
    n = rng.randint(1, scheduler.max_stage_blocks(g))
    p = rng.randint(2, 3)
    try:
        s = scheduler.schedule(g, p, n_blocks=n)
    except scheduler.ScheduleError:
        pytest.skip("grid larger than the stage output for this random net")
    for (i, j) in s.patch_iter():
        rows, cols = s.rows[i].band, s.cols[j].band
        need = _brute_force_need(g, s.stage, s.stage_outputs, rows, cols)
        for t, mask in need.items():
            ys, xs = np.nonzero(mask)
            box = ((ys.min(), ys.max() + 1), (xs.min(), xs.max() + 1))
            assert box == (s.rows[i].need[t], s.cols[j].need[t]), (t, (i, j))
