"""Patch regions: receptive fields, per-patch regions and border padding, patched MACs and memory.

The patch stage is a prefix of the graph (the first ``n`` blocks, or the first ``k`` ops). Its output is cut into a
``ph x pw`` grid of non-overlapping output patches. For each patch the needed region of every tensor is found by
walking the stage backwards (``ir.input_range`` is the one receptive-field formula). Regions are separable: the rows a
patch needs depend only on its row band and the columns only on its column band, so each axis is walked once per
band and a patch's region is the product of its row and column ranges.

Accounting (all int8 bytes, as deployed):
* exact MACs: each op computes only the part of its output that lies inside the feature map and that later ops need;
* padded MACs (the paper's): each op computes its whole unclipped patch region, i.e. every patch at full size as if
  the border padding were computed data;
* memory: the full stage-output buffer(s) + one patch's working set by the same alive-tensor rule the profiler
  uses; with the input image counted the whole image is held during the stage (each patch reads its window in
  place), without it only one patch's input window is held (streamed input). Peak = max(stage, rest of the net).
  ``accounting`` (``tfmcu.plan.profiler.ACCOUNTINGS``) says what an output shares with a dying input: the rest of
  the net per layer as the profiler counts it; in the stage, ``paper`` shares the same pairs patch by patch (a
  depthwise output box inside its input box, a residual branch over its shortcut), the other modes keep the patch
  buffers disjoint (as the executor does).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tfmcu.abi import MAX_PASSES
from tfmcu.errors import TfmcuError
from tfmcu.graph import ir
from tfmcu.plan.placer import shared_bytes
from tfmcu.plan.profiler import shared_pairs, step_memory

Range = tuple[int, int]


class ScheduleError(TfmcuError):
    """The requested patch stage cannot be built; the message names the op and says what is supported."""


# ----------------------------------------------------------------------------- stage selection
DETECTION_HEAD = "head_scale"  # the yolo head's ops (tfmcu.nets.spec.DetectionScale.name): never in a patch stage


def is_detection_head(op: ir.Op) -> bool:
    """An op of a yolo head (``head_scale{i}_conv`` / ``_pred`` / ``_flat``): the patch stage ends before it, so
    the head and the detection post-processing after it always run whole."""
    return op.name.startswith(DETECTION_HEAD)


def stage_ops(graph: ir.Graph, n_blocks: int | None = None, n_ops: int | None = None) -> list[int]:
    """Op indices of the patch stage: ops of blocks < n_blocks, or the first n_ops ops."""
    if (n_blocks is None) == (n_ops is None):
        raise ScheduleError("give exactly one of n_blocks or n_ops for the patch stage")
    if n_blocks is not None:
        if not 1 <= n_blocks < graph.num_blocks:
            raise ScheduleError(f"patch stage of {n_blocks} blocks: must be 1..{graph.num_blocks - 1} "
                                f"(the model has {graph.num_blocks} blocks)")
        idx = [i for i, op in enumerate(graph.ops) if op.block < n_blocks]
    else:
        if not 1 <= n_ops < len(graph.ops):
            raise ScheduleError(f"patch stage of {n_ops} ops: must be 1..{len(graph.ops) - 1}")
        idx = list(range(n_ops))
    return idx


def is_global_pool(graph: ir.Graph, op: ir.Op) -> bool:
    """A MEAN over height and width of a feature map (global average pooling): a patch stage may end with it, summing
    its input patch by patch (the C executor's reduction, tflm_patch_kernels/mean.h)."""
    return (op.type == ir.MEAN and len(op.inputs) == 1 and len(op.outputs) == 1
            and graph.tensors[op.inputs[0]].is_feature_map and sorted(op.attrs.get("axes") or [1, 2]) == [1, 2])


def stage_pool(graph: ir.Graph, idx: Sequence[int]) -> int | None:
    """The op index of the global average pool that ends the stage ``idx`` (its last op, reading a tensor the stage
    produces), else None."""
    if len(idx) < 2:
        return None
    op = graph.ops[idx[-1]]
    produced = {t for i in idx[:-1] for t in graph.ops[i].outputs}
    return idx[-1] if is_global_pool(graph, op) and op.inputs[0] in produced else None


# Ops that may run on whole 1 x 1 tensors inside a stage, once per run (a squeeze-excite's layers after its MEAN).
WHOLE_OPS = (ir.CONV, ir.ACTIVATION, ir.ADD, ir.SUB, ir.MUL, ir.RESHAPE)


def _vector(graph: ir.Graph, t: str) -> bool:
    """A tensor of one value per channel: [1, 1, 1, C] or [1, C]."""
    shape = graph.tensors[t].shape
    return (len(shape) == 4 and shape[:3] == (1, 1, 1)) or (len(shape) == 2 and shape[0] == 1)


@dataclass(frozen=True)
class Passes:
    """How a stage with reductions inside it sweeps its grid (the C executor's passes, patch_stage_types.h): one pass
    per inner reduction (a MEAN whose result the stage reads again: a squeeze-excite), then the last pass. ``masks``:
    per op on tiles (op index), the passes it runs in (bit p: pass p), the ops each pass needs; ``after``: per op on
    whole tensors, the pass after whose last patch it runs once; ``whole``: the tensors computed once per run (the
    inner reductions' results and what whole ops make of them); ``inner``: the inner reductions in pass order."""

    count: int = 1
    masks: dict[int, int] = field(default_factory=dict)
    after: dict[int, int] = field(default_factory=dict)
    whole: frozenset[str] = frozenset()
    inner: tuple[int, ...] = ()

    def runs(self, i: int) -> int:
        """How many passes op ``i`` runs in on the patches (1 for a stage of one pass; 0 for a whole op)."""
        if self.count == 1:
            return 0 if i in self.after else 1
        return bin(self.masks.get(i, 0)).count("1")


def _classify(graph: ir.Graph, idx: Sequence[int], pool: int | None) -> tuple[set[str], list[int], set[int]]:
    """(whole tensors, inner reductions, whole ops) of the stage ``idx`` (``Passes``); ScheduleError naming the op
    for an op on whole tensors a stage cannot run."""
    tiled: set[str] = set()
    whole: dict[str, int] = {}  # whole tensor -> the inner reduction it comes from
    inner: list[int] = []
    whole_ops: set[int] = set()
    for i in idx:
        op = graph.ops[i]
        if i == pool:
            continue
        if op.inputs and all(t in whole for t in op.inputs):
            if op.type not in WHOLE_OPS or len(op.outputs) != 1 or not all(
                    _vector(graph, t) for t in op.inputs + op.outputs) or op.kernel != (1, 1):
                r = whole[op.inputs[0]]
                raise ScheduleError(f"{op.describe(i)} reads the statistic of {graph.ops[r].describe(r)} inside the "
                                    f"patch stage, where only 1x1 convolutions, element-wise ops and reshapes of one "
                                    f"value per channel run on it (a squeeze-excite's); a global average pool may "
                                    f"end a stage as its last op; largest stage that works: {largest_prefix(graph)} "
                                    f"ops")
            whole_ops.add(i)
            whole.update(dict.fromkeys(op.outputs, whole[op.inputs[0]]))
        elif is_global_pool(graph, op) and op.inputs[0] in tiled and _vector(graph, op.outputs[0]):
            inner.append(i)
            whole.update(dict.fromkeys(op.outputs, i))
        else:
            tiled.update(op.outputs)
    return set(whole), inner, whole_ops


def stage_passes(graph: ir.Graph, idx: Sequence[int], outputs: Sequence[str] | None = None) -> Passes:
    """The passes of stage ``idx`` (``Passes``; one pass when no reduction sits inside it). ScheduleError when an op
    is needed by no pass or reads a whole tensor in a pass before the one that finishes it, or for too many passes."""
    pool = stage_pool(graph, idx)
    whole, inner, whole_ops = _classify(graph, idx, pool)
    if not inner:
        return Passes()
    if len(inner) + 1 > MAX_PASSES:
        raise ScheduleError(f"the patch stage holds {len(inner)} squeeze-excites: at most {MAX_PASSES - 1} fit one "
                            f"stage (its passes)")
    outputs = list(outputs) if outputs is not None else check_stage(graph, idx)[1]
    prod = {t: i for i in idx for t in graph.ops[i].outputs}
    finished = {graph.ops[r].outputs[0]: p for p, r in enumerate(inner)}
    after: dict[int, int] = {}
    for i in idx:
        if i in whole_ops:
            op = graph.ops[i]
            after[i] = max(finished[t] for t in op.inputs)
            finished[op.outputs[0]] = after[i]
    masks: dict[int, int] = {}

    def close(targets: Sequence[int], p: int) -> None:
        stack = list(targets)
        while stack:
            i = stack.pop()
            if (masks.get(i, 0) >> p) & 1:
                continue
            masks[i] = masks.get(i, 0) | (1 << p)
            stack += [prod[t] for t in graph.ops[i].inputs if t not in whole and t in prod]

    for p, r in enumerate(inner):
        close([r], p)
    close([prod[t] for t in outputs] + ([pool] if pool is not None else []), len(inner))
    for i in idx:
        if i in whole_ops:
            continue
        op = graph.ops[i]
        if not masks.get(i):
            raise ScheduleError(f"{op.describe(i)}: its output is not needed by the patch stage's output")
        for t in op.inputs:
            if t in whole and masks[i] & ((2 << finished[t]) - 1):
                raise ScheduleError(f"{op.describe(i)} reads '{t}' in a pass before the one that computes it")
    return Passes(len(inner) + 1, masks, after, frozenset(whole), tuple(inner))


@dataclass
class GraphFacts:
    """What every schedule of one graph reads and no stage changes (its tensors' lifetimes, their consumers and the
    per-layer step memory by accounting): made once by a caller that schedules many stages of it
    (``tfmcu.plan.stage_plans``), else by each schedule."""

    graph: ir.Graph
    life: dict[str, tuple[int, int]] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)
    _steps: dict[tuple[str, bool], list[int]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.life = self.graph.lifetimes()
        self.consumers = self.graph.consumers()

    def steps(self, accounting: str, exclude_inputs: bool = False) -> list[int]:
        """The profiler's per-layer step memory (``step_memory``)."""
        key = (accounting, exclude_inputs)
        if key not in self._steps:
            self._steps[key] = step_memory(self.graph, self.life, exclude_inputs=exclude_inputs,
                                           accounting=accounting)
        return self._steps[key]


def check_stage(graph: ir.Graph, idx: Sequence[int], facts: GraphFacts | None = None) -> tuple[list[str], list[str]]:
    """Stage inputs and outputs; raises ScheduleError naming the first op that cannot run patch by patch. A stage
    may end with a global average pool (``stage_pool``): its output is then the pool's. It may hold reductions
    (``stage_passes``: a squeeze-excite's MEAN, the layers on its 1 x 1 result and the MUL that scales the map with
    it, run in passes)."""
    in_stage = set(idx)
    produced = {t for i in idx for t in graph.ops[i].outputs}
    pool = stage_pool(graph, idx)
    whole, inner, whole_ops = _classify(graph, idx, pool)
    for i in idx:
        if i == pool or i in whole_ops or i in inner:
            continue
        op = graph.ops[i]
        if is_detection_head(op):
            raise ScheduleError(f"{op.describe(i)} is in the detection head, which runs whole: the patch stage must "
                                f"end before it (largest stage that works: {largest_prefix(graph)} ops)")
        scaled = (op.type in (ir.ADD, ir.MUL) and len(op.inputs) == 2 and op.attrs.get("patchable") is not False
                  and sum(t in whole for t in op.inputs) == 1)
        if not op.patchable and not scaled:
            raise ScheduleError(f"{op.describe(i)} cannot run patch by patch (supported: conv, depthwise conv, "
                                f"pooling, pad, add, concatenation, quantize, elementwise, a squeeze-excite, and a "
                                f"global average pool as the last op); largest stage that works: "
                                f"{largest_prefix(graph)} ops")
        for t in op.inputs + op.outputs:
            if not graph.tensors[t].is_feature_map:
                raise ScheduleError(f"{op.describe(i)} has non-feature-map tensor '{t}' "
                                    f"{list(graph.tensors[t].shape)}")
    inputs = sorted({t for i in idx for t in graph.ops[i].inputs if t not in produced})
    cons = facts.consumers if facts is not None else graph.consumers()
    outputs = [t for i in idx for t in graph.ops[i].outputs
               if t in graph.outputs or any(c not in in_stage for c in cons.get(t, []))]
    if not outputs:
        raise ScheduleError("the patch stage has no output used by the rest of the graph")
    leaving = [t for t in outputs if t in whole]
    if leaving:
        raise ScheduleError(f"the patch stage must end after the squeeze-excite whose statistic '{leaving[0]}' the "
                            f"rest of the graph reads")
    if pool is not None:
        if outputs != graph.ops[pool].outputs:
            raise ScheduleError(f"{graph.ops[pool].describe(pool)} ends the patch stage: no other tensor of the "
                                f"stage may leave it (here {outputs})")
        return inputs, outputs
    hw = {graph.tensors[t].hw for t in outputs}
    if len(hw) != 1:
        raise ScheduleError(f"the patch stage has outputs of different sizes {sorted(hw)}: "
                            f"choose a stage that ends at one resolution")
    return inputs, outputs


def largest_prefix(graph: ir.Graph) -> int:
    """Number of leading ops that are all patchable feature-map ops, before any op of a detection head."""
    n = 0
    for op in graph.ops:
        if (not op.patchable or is_detection_head(op)
                or not all(graph.tensors[t].is_feature_map for t in op.inputs + op.outputs)):
            break
        n += 1
    return n


def max_stage_blocks(graph: ir.Graph) -> int:
    """Largest n such that blocks 0..n-1 can form a patch stage (0 if even block 0 cannot)."""
    n = 0
    for b in range(1, graph.num_blocks):
        try:
            check_stage(graph, stage_ops(graph, n_blocks=b))
        except ScheduleError:
            continue
        n = b
    return n


# ----------------------------------------------------------------------------- one-axis walk
def split(size: int, parts: int) -> list[Range]:
    """Split [0, size) into ``parts`` contiguous bands as evenly as possible (larger bands first)."""
    if not 1 <= parts <= size:
        raise ScheduleError(f"cannot split {size} rows/columns into {parts} patches")
    base, extra = divmod(size, parts)
    bands, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        bands.append((start, stop))
        start = stop
    return bands


def _union(a: Range | None, b: Range) -> Range:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


@dataclass
class Read:
    """What op ``op`` reads from its input ``pos`` along one axis: the clipped input range and the zero padding
    that must be added before/after it (where the window runs past the feature-map border)."""

    start: int
    stop: int
    pad_before: int
    pad_after: int


@dataclass
class AxisWalk:
    band: Range
    need: dict[str, Range]  # clipped range of every stage tensor this band needs
    need_unclipped: dict[str, Range]  # same, without clipping at the border (padded accounting)
    reads: dict[tuple[int, int], Read]  # (op index, input position) -> read


def read_range(graph: ir.Graph, op: ir.Op, t: str, axis: int, out: Range) -> Range:
    """The range (unclipped) of input ``t`` that ``op`` reads along ``axis`` to produce ``out`` of its output: the
    window's receptive field, the whole size-1 axis of a broadcast operand, else the same range."""
    if op.is_window:
        return ir.input_range(op, axis, *out)
    if graph.tensors[t].shape[1 + axis] == 1 and graph.tensors[op.outputs[0]].shape[1 + axis] != 1:
        return 0, 1  # broadcast operand
    return out


def walk_axis(graph: ir.Graph, idx: Sequence[int], outputs: Sequence[str], axis: int, band: Range) -> AxisWalk:
    need: dict[str, Range] = {t: band for t in outputs}
    need_u: dict[str, Range] = {t: band for t in outputs}
    reads: dict[tuple[int, int], Read] = {}
    for i in reversed(idx):
        op = graph.ops[i]
        out = [need[t] for t in op.outputs if t in need]
        if not out:
            continue
        o = out[0]
        for r in out[1:]:
            o = _union(o, r)
        ou = need_u[op.outputs[0]]
        for t in op.outputs[1:]:
            ou = _union(ou, need_u[t])
        for pos, t in enumerate(op.inputs):
            size = graph.tensors[t].shape[1 + axis]
            a, b = read_range(graph, op, t, axis, o)
            au, bu = read_range(graph, op, t, axis, ou)
            ca, cb = max(a, 0), min(b, size)
            reads[(i, pos)] = Read(ca, cb, ca - a, b - cb)
            need[t] = _union(need.get(t), (ca, cb))
            need_u[t] = _union(need_u.get(t), (au, bu))
    return AxisWalk(band, need, need_u, reads)


def walk_bands(graph: ir.Graph, idx: Sequence[int], outputs: Sequence[str], axis: int, bands: Sequence[Range],
               passes: Passes = Passes(), owns: dict[int, list[Range]] | None = None
               ) -> tuple[list[AxisWalk], dict[int, list[Range]]]:
    """``walk_axis`` for every band of ``bands`` at once, with a stage's passes: ops on whole tensors are not walked;
    an inner reduction reads, in each band, its own tile of its input (``owns``: given, or made here and returned):
    the tiles of the bands partition the input, each band's starting where the band's need of it starts (from the
    layers after the reduction), so that a tile lies inside what the band holds anyway, and the reduction sums every
    pixel once."""
    owns = dict(owns or {})
    walks = [AxisWalk(band, {t: band for t in outputs}, {t: band for t in outputs}, {}) for band in bands]
    skip = set(passes.after)
    for i in reversed(idx):
        op = graph.ops[i]
        if i in skip:
            continue
        if i in passes.inner:
            x = op.inputs[0]
            size = graph.tensors[x].shape[1 + axis]
            if i not in owns:
                starts = [w.need[x][0] if x in w.need and w.need[x][1] > w.need[x][0] else None for w in walks]
                cuts = [0] + [st for st in starts[1:]] + [size]
                if any(c is None for c in cuts) or any(b <= a for a, b in zip(cuts, cuts[1:])):
                    cuts = [a for a, _ in split(size, len(bands))] + [size]
                owns[i] = [(cuts[b], cuts[b + 1]) for b in range(len(bands))]
            for w, own in zip(walks, owns[i]):
                w.reads[(i, 0)] = Read(own[0], own[1], 0, 0)
                w.need[x] = _union(w.need.get(x), own)
                w.need_unclipped[x] = _union(w.need_unclipped.get(x), own)
            continue
        for w in walks:
            out = [w.need[t] for t in op.outputs if t in w.need]
            if not out:
                continue
            o = out[0]
            for r in out[1:]:
                o = _union(o, r)
            ou = w.need_unclipped[op.outputs[0]]
            for t in op.outputs[1:]:
                ou = _union(ou, w.need_unclipped[t])
            for pos, t in enumerate(op.inputs):
                if t in passes.whole:  # a broadcast whole tensor: all of its one pixel
                    w.reads[(i, pos)] = Read(0, 1, 0, 0)
                    continue
                size = graph.tensors[t].shape[1 + axis]
                a, b = read_range(graph, op, t, axis, o)
                au, bu = read_range(graph, op, t, axis, ou)
                ca, cb = max(a, 0), min(b, size)
                w.reads[(i, pos)] = Read(ca, cb, ca - a, b - cb)
                w.need[t] = _union(w.need.get(t), (ca, cb))
                w.need_unclipped[t] = _union(w.need_unclipped.get(t), (au, bu))
    return walks, owns


# ----------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Held:
    """What a stage holds whole for its whole run besides its outputs and the image: its inputs that another op
    produced whole before it (a stage after the first: every patch reads its window of them), and the tensors alive
    across it that it neither reads nor writes (a skip connection around it)."""

    whole: frozenset[str]
    nbytes: int


def held_bytes(graph: ir.Graph, idx: Sequence[int], inputs: Sequence[str], produced: set[str],
               life: dict[str, tuple[int, int]]) -> Held:
    first, last = idx[0], idx[-1]
    names = {t for t in inputs if t not in graph.inputs}
    names |= {t for t, (a, b) in life.items() if a < first and b > last and t not in produced and t not in inputs
              and t not in graph.inputs}
    return Held(frozenset(names), sum(graph.tensors[t].nbytes for t in names))


@dataclass
class PatchRegion:
    """One op's work for one patch: output box and, per input, the clipped box read plus border padding."""

    op: int
    out: tuple[Range, Range]  # (rows, cols)
    reads: list[tuple[Range, Range, tuple[int, int, int, int]]]  # per input: rows, cols, (top, bottom, left, right)


@dataclass
class PatchSchedule:
    graph: ir.Graph
    stage: list[int]
    n_blocks: int | None
    grid: tuple[int, int]
    stage_inputs: list[str]
    stage_outputs: list[str]
    rows: list[AxisWalk]
    cols: list[AxisWalk]
    input_patch_size: tuple[int, int]
    stage_peak_bytes: int
    stage_peak_bytes_excluding_input: int
    rest_peak_bytes: int
    rest_peak_bytes_excluding_input: int
    stage_macs: int
    stage_macs_patched_padded: int
    stage_macs_patched_exact: int
    macs: int
    accounting: str = "separate"
    patch_peak_bytes: int = 0  # largest working set of one patch (its own tensors incl. its input window)
    input_bytes: int = 0  # bytes of the stage inputs that are graph inputs (the image, when counted)
    step_memory: list[int] = field(default_factory=list)  # per op: peak over patches (stage) / per layer (rest)
    step_memory_excluding_input: list[int] = field(default_factory=list)
    pool: int | None = None  # the global average pool that ends the stage (its output is summed patch by patch)
    passes: Passes = field(default_factory=Passes)  # reductions inside the stage: its passes over the grid
    row_owns: dict[int, list[Range]] = field(default_factory=dict)  # an inner reduction's tile of each row band
    col_owns: dict[int, list[Range]] = field(default_factory=dict)

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def tiled(self) -> list[int]:
        """The stage's ops that run patch by patch (all but a final global pool and the ops on whole tensors; an
        inner reduction sums its tiles)."""
        return [i for i in self.stage if i != self.pool and i not in self.passes.after]

    @property
    def tiles(self) -> list[str]:
        """The tensors the grid cuts into tiles: the stage outputs, or the input of the global pool that ends it."""
        return list(self.graph.ops[self.pool].inputs) if self.pool is not None else list(self.stage_outputs)

    @property
    def accumulator_bytes(self) -> int:
        """The int32 sums of the stage's reductions, a final global pool's and the inner ones' (4 B per channel; 0
        without one)."""
        g = self.graph
        pool = 4 * g.tensors[self.tiles[0]].shape[3] if self.pool is not None else 0
        return pool + sum(4 * g.tensors[g.ops[r].inputs[0]].shape[3] for r in self.passes.inner)

    @property
    def whole_bytes(self) -> int:
        """The tensors a stage computes once per run and keeps across its passes (a squeeze-excite's 1 x 1 ones)."""
        return sum(self.graph.tensors[t].nbytes for t in self.passes.whole)

    @property
    def peak_sram_bytes(self) -> int:
        return max(self.stage_peak_bytes, self.rest_peak_bytes)

    @property
    def peak_sram_bytes_excluding_input(self) -> int:
        return max(self.stage_peak_bytes_excluding_input, self.rest_peak_bytes_excluding_input)

    @property
    def macs_patched_padded(self) -> int:
        return self.macs - self.stage_macs + self.stage_macs_patched_padded

    @property
    def macs_patched_exact(self) -> int:
        return self.macs - self.stage_macs + self.stage_macs_patched_exact

    def region(self, op_index: int, patch: tuple[int, int]) -> PatchRegion:
        r, c = self.rows[patch[0]], self.cols[patch[1]]
        if op_index == self.pool:  # the patch's tile into the 1 x 1 sums
            return PatchRegion(op_index, ((0, 1), (0, 1)), [(r.band, c.band, (0, 0, 0, 0))])
        op = self.graph.ops[op_index]
        if op_index in self.passes.after:  # once per run, on whole 1 x 1 tensors
            return PatchRegion(op_index, ((0, 1), (0, 1)), [((0, 1), (0, 1), (0, 0, 0, 0))] * len(op.inputs))
        out = (((0, 1), (0, 1)) if op_index in self.passes.inner
               else (r.need[op.outputs[0]], c.need[op.outputs[0]]))
        reads = []
        for pos in range(len(op.inputs)):
            rr, cc = r.reads[(op_index, pos)], c.reads[(op_index, pos)]
            reads.append(((rr.start, rr.stop), (cc.start, cc.stop),
                          (rr.pad_before, rr.pad_after, cc.pad_before, cc.pad_after)))
        return PatchRegion(op_index, out, reads)

    def patch_iter(self) -> Iterable[tuple[int, int]]:
        return itertools.product(range(self.grid[0]), range(self.grid[1]))

    def block_peaks(self, exclude_input: bool = False) -> dict[int, int]:
        mem = self.step_memory_excluding_input if exclude_input else self.step_memory
        peaks: dict[int, int] = {}
        for i, op in enumerate(self.graph.ops):
            peaks[op.block] = max(peaks.get(op.block, 0), mem[i])
        return peaks

    def to_dict(self) -> dict[str, Any]:
        return {
            "patches": self.grid[0] if self.grid[0] == self.grid[1] else list(self.grid),
            "grid": list(self.grid),
            "patch_blocks": self.n_blocks,
            "patch_ops": len(self.stage),
            "pool": self.pool,
            "accounting": self.accounting,
            "stage_inputs": self.stage_inputs,
            "stage_outputs": self.stage_outputs,
            "input_patch_size": list(self.input_patch_size),
            "peak_sram_bytes": self.peak_sram_bytes,
            "peak_sram_bytes_excluding_input": self.peak_sram_bytes_excluding_input,
            "stage_peak_bytes": self.stage_peak_bytes,
            "stage_peak_bytes_excluding_input": self.stage_peak_bytes_excluding_input,
            "rest_peak_bytes": self.rest_peak_bytes,
            "rest_peak_bytes_excluding_input": self.rest_peak_bytes_excluding_input,
            "stage_macs": self.stage_macs,
            "stage_macs_patched_padded": self.stage_macs_patched_padded,
            "stage_macs_patched_exact": self.stage_macs_patched_exact,
            "macs_patched_padded": self.macs_patched_padded,
            "macs_patched_exact": self.macs_patched_exact,
            "stage_mac_overhead_padded": _ratio(self.stage_macs_patched_padded, self.stage_macs),
            "stage_mac_overhead_exact": _ratio(self.stage_macs_patched_exact, self.stage_macs),
            "mac_overhead_padded": _ratio(self.macs_patched_padded, self.macs),
            "mac_overhead_exact": _ratio(self.macs_patched_exact, self.macs),
            "row_bands": [list(w.band) for w in self.rows],
            "col_bands": [list(w.band) for w in self.cols],
        }


def _ratio(a: int, b: int) -> float:
    return round(a / b - 1.0, 6) if b else 0.0


def _length(r: Range) -> int:
    return max(r[1] - r[0], 0)


def schedule(graph: ir.Graph, patches: int | tuple[int, int], n_blocks: int | None = None,
             n_ops: int | None = None, accounting: str = "separate", ops: Sequence[int] | None = None,
             facts: GraphFacts | None = None) -> PatchSchedule:
    """Schedule the stage (first n_blocks blocks or n_ops ops; or exactly the ops ``ops``, e.g. one layer of the
    rest run by our kernels, ``tfmcu.stage.custom.convs_to_flash``) as a ph x pw grid of patches; memory counted by
    ``accounting`` (see the module docstring). ``facts``: the graph's ``GraphFacts``, when the caller has them."""
    ph, pw = (patches, patches) if isinstance(patches, int) else patches
    idx = list(ops) if ops is not None else stage_ops(graph, n_blocks, n_ops)
    facts = facts if facts is not None else GraphFacts(graph)
    ins, outs = check_stage(graph, idx, facts)
    pool = stage_pool(graph, idx)
    passes = stage_passes(graph, idx, outs)
    tiled = [i for i in idx if i != pool and i not in passes.after]
    tiles = list(graph.ops[pool].inputs) if pool is not None else outs  # what the grid cuts
    oh, ow = graph.tensors[tiles[0]].hw
    if ph > oh or pw > ow:
        raise ScheduleError(f"{ph}x{pw} patches do not fit the {oh}x{ow} stage output")
    rows, row_owns = walk_bands(graph, tiled, tiles, 0, split(oh, ph), passes)
    cols, col_owns = walk_bands(graph, tiled, tiles, 1, split(ow, pw), passes)

    # MACs: exact uses clipped regions, padded the unclipped ones (sum over patches factorises per axis); an op on
    # tiles as often as the passes it runs in, an op on whole tensors once.
    stage_macs = stage_exact = stage_padded = 0
    for i in idx:
        op = graph.ops[i]
        mpp = ir.macs_per_output_pixel(op)
        if not mpp or i == pool:
            continue
        stage_macs += ir.op_macs(graph, op)
        if i in passes.after:
            stage_exact += ir.op_macs(graph, op)
            stage_padded += ir.op_macs(graph, op)
            continue
        t, n = op.outputs[0], passes.runs(i)
        stage_exact += n * mpp * sum(_length(w.need[t]) for w in rows) * sum(_length(w.need[t]) for w in cols)
        stage_padded += n * mpp * (sum(_length(w.need_unclipped[t]) for w in rows)
                                   * sum(_length(w.need_unclipped[t]) for w in cols))

    # Memory: stage steps by patch, rest by layer.
    life = facts.life
    per_layer = facts.steps(accounting)
    per_layer_x = facts.steps(accounting, exclude_inputs=True)
    # (a final global pool: its output and its int32 sums, held for the whole stage; its input is a patch box; an inner
    # reduction's sums and the whole tensors, held for the whole stage too)
    out_bytes = sum(graph.tensors[t].nbytes for t in outs)
    if pool is not None:
        out_bytes += 4 * graph.tensors[tiles[0]].shape[3]
    out_bytes += sum(4 * graph.tensors[graph.ops[r].inputs[0]].shape[3] for r in passes.inner)
    out_bytes += sum(graph.tensors[t].nbytes for t in passes.whole)
    in_bytes = sum(graph.tensors[t].nbytes for t in ins if t in graph.inputs)
    produced = {t for i in idx for t in graph.ops[i].outputs}
    held = held_bytes(graph, idx, ins, produced, life)
    # Patch buffers that share (paper: a depthwise in place, a residual branch over its shortcut, inside one
    # patch; never the stage outputs, which are whole tensors, nor the stage inputs).
    in_place = {i: [(y, x, d) for y, x, d in pairs if y not in outs and x in produced]
                for i, pairs in shared_pairs(graph, accounting, life).items()} if accounting == "paper" else {}
    mem, mem_x = list(per_layer), list(per_layer_x)
    patch_peak = 0

    def box_bytes(t: str, r: AxisWalk, c: AxisWalk) -> int:
        tensor = graph.tensors[t]
        return _length(r.need[t]) * _length(c.need[t]) * tensor.shape[3] * tensor.itemsize

    # one patch's box of a tensor: rows x cols (per band pair), as (tensors x row bands) and (tensors x col bands)
    names = sorted({t for i in idx for t in graph.ops[i].inputs + graph.ops[i].outputs})
    lens_r = np.array([[_length(w.need.get(t, (0, 0))) for w in rows] for t in names], np.int64).reshape(-1, len(rows))
    lens_c = np.array([[_length(w.need.get(t, (0, 0))) for w in cols] for t in names], np.int64).reshape(-1, len(cols))
    per_pixel = np.array([graph.tensors[t].shape[3] * graph.tensors[t].itemsize
                          if graph.tensors[t].is_feature_map else 0 for t in names], np.int64)
    col = {t: k for k, t in enumerate(names)}
    mine = [t for t in names if (t in produced or t in ins) and t not in outs and t not in held.whole
            and t not in passes.whole]
    for i in idx:
        alive = [t for t in mine if life[t][0] <= i <= life[t][1]]
        peak_in = peak_x = 0
        if not in_place.get(i):  # every patch at once: own tensors and the input window, (row band x col band)
            own = np.zeros(len(names), np.int64)
            window = np.zeros(len(names), np.int64)
            for t in alive:
                (window if t in ins else own)[col[t]] = per_pixel[col[t]]
            boxes_own = (lens_r * own[:, None]).T @ lens_c
            boxes_x = boxes_own + (lens_r * window[:, None]).T @ lens_c
            peak_in, peak_x = int(boxes_own.max(initial=0)), int(boxes_x.max(initial=0))
            mem[i] = out_bytes + in_bytes + held.nbytes + peak_in
            mem_x[i] = out_bytes + held.nbytes + peak_x
            patch_peak = max(patch_peak, peak_x)
            continue
        for r, c in itertools.product(rows, cols):
            patch_in = patch_x = 0
            for t in alive:
                nbytes = box_bytes(t, r, c)
                if t in ins:  # stage input: whole image when counted, else one patch window
                    patch_x += nbytes
                else:
                    patch_in += nbytes
                    patch_x += nbytes
            if in_place.get(i):
                shared = sum(shared_bytes(box_bytes(x, r, c), box_bytes(y, r, c), d) for y, x, d in in_place[i])
                patch_in -= shared
                patch_x -= shared
            peak_in, peak_x = max(peak_in, patch_in), max(peak_x, patch_x)
        mem[i] = out_bytes + in_bytes + held.nbytes + peak_in
        mem_x[i] = out_bytes + held.nbytes + peak_x
        patch_peak = max(patch_peak, peak_x)
    last = idx[-1]
    rest = range(last + 1, len(graph.ops))
    input_patch = max((_length(w.need_unclipped[t]) for w in rows for t in ins), default=0), \
        max((_length(w.need_unclipped[t]) for w in cols for t in ins), default=0)
    return PatchSchedule(
        graph=graph, stage=list(idx), n_blocks=n_blocks, grid=(ph, pw), stage_inputs=ins, stage_outputs=outs,
        rows=rows, cols=cols, input_patch_size=input_patch,
        stage_peak_bytes=max(mem[i] for i in idx), stage_peak_bytes_excluding_input=max(mem_x[i] for i in idx),
        rest_peak_bytes=max((mem[i] for i in rest), default=0),
        rest_peak_bytes_excluding_input=max((mem_x[i] for i in rest), default=0),
        stage_macs=stage_macs, stage_macs_patched_padded=stage_padded, stage_macs_patched_exact=stage_exact,
        macs=sum(ir.op_macs(graph, op) for op in graph.ops), accounting=accounting, patch_peak_bytes=patch_peak,
        input_bytes=in_bytes,
        step_memory=mem,
        step_memory_excluding_input=mem_x, pool=pool, passes=passes, row_owns=row_owns, col_owns=col_owns)
