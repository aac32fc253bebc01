"""Offline memory plans: tensor offsets better than TFLM's greedy planner, stored where TFLM reads them.

TFLM's greedy planner places buffers largest first, first fit; around residual blocks that leaves holes (MobileNetV2
after the patch stage: 351,232 B planned where at most 326,144 B are ever alive at once). ``plan`` searches
placements (first fit over perturbed orders, seeded, starting from TFLM's own order) and keeps the smallest; the
lower bound is the largest set of buffers alive at one step, and the search stops when it reaches it.
``with_offline_plan`` writes the offsets as TFLM's "OfflineMemoryAllocation" model metadata
([version 1, subgraph 0, number of tensors, offset per tensor or -1 for online]); TFLM then places those tensors
there and plans only the rest (kernel scratch buffers) online. ``tflm_memory.predict_arena`` honours such plans.

In-place plans (``inplace=True``, TinyEngine's in-place depthwise generalised): an operator's output may overlap an
input that dies at that operator when the kernel provably reads every input byte before it overwrites it. TFLM places
offline-planned tensors where the plan says and never checks overlaps, so the only question is the kernel's order of
reads and writes. ``inplace_distance`` derives, from TFLM's *reference* int8 kernels' loop order (batch, out_y, out_x,
out channel; the window read before the output byte is written), the least number of bytes D by which the output
must start before the input: writing output byte o must not touch an input byte any later step still reads, i.e.
D >= o + 1 - (smallest input byte read after o is written), maximised over o. Optimised kernels that read in another
order (CMSIS-NN's im2col / 3x3 depthwise paths) do not share that guarantee: in-place plans are for TFLM's reference
kernels (the tflite-micro wheel, TFLM's default build), which is where ``verify`` checks them bit-exact.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np

from tfmcu import ir
from tfmcu import tflite_schema as ts

METADATA_NAME = "OfflineMemoryAllocation"


# Reference kernels whose read/write order ``inplace_distance`` models (TFLite builtin names).
INPLACE_BUILTINS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD")


def _window_read_base(op: ir.Op, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Per output pixel (row-major), the element index of the first input element its window reads: the top-left
    in-image tap (TFLM's reference kernels clip the window to the image), channel 0."""
    _, h, w, c = in_shape
    _, ho, wo, _ = out_shape
    iy0 = np.clip(np.arange(ho, dtype=np.int64) * op.stride[0] - op.padding[0], 0, h - 1)
    ix0 = np.clip(np.arange(wo, dtype=np.int64) * op.stride[1] - op.padding[2], 0, w - 1)
    return ((iy0[:, None] * w + ix0[None, :]) * c).reshape(-1)


def inplace_distance(graph: ir.Graph, op: ir.Op, tensor: str) -> int | None:
    """Least D (bytes) such that ``op``'s output may start D bytes before its input ``tensor`` and overlap it, with
    TFLM's reference int8 kernel reading every input byte before overwriting it; None where that is not modelled
    (other operators, dilation, groups, broadcasting, batch > 1, tensors other than int8). See the module
    docstring."""
    from tfmcu.tflm_memory import _builtin

    b = _builtin(op)
    if b not in INPLACE_BUILTINS or len(op.outputs) != 1 or tensor not in op.inputs:
        return None
    x, y = graph.tensors[tensor], graph.tensors[op.outputs[0]]
    if x.dtype != "int8" or y.dtype != "int8":  # the int8 reference kernels are the ones modelled (and tested)
        return None
    if b == "ADD":
        # Elementwise: output[i] is written after input1[i] and input2[i] are read; later steps read i+1 onwards.
        if op.attrs.get("broadcast") or tuple(x.shape) != tuple(y.shape):
            return None
        return 0
    if tensor != op.inputs[0] or len(x.shape) != 4 or len(y.shape) != 4 or x.shape[0] != 1 or y.shape[0] != 1:
        return None
    if tuple(op.dilation) != (1, 1):
        return None
    cin, cout = int(x.shape[3]), int(y.shape[3])
    j = np.arange(1, cout, dtype=np.int64)  # the next output channel at the same pixel
    if b == "CONV_2D":
        if op.groups not in (0, 1):
            return None
        first_read = np.zeros_like(j)  # every output channel reads the whole window from channel 0
    elif b == "DEPTHWISE_CONV_2D":
        if cout % cin:
            return None
        first_read = j // (cout // cin)  # output channel j reads input channel j / multiplier
    else:  # pooling: channel j reads channel j
        if cin != cout:
            return None
        first_read = j
    base = _window_read_base(op, tuple(x.shape), tuple(y.shape))
    pixels = np.arange(len(base), dtype=np.int64)
    need = 0
    if cout > 1:  # within a pixel: byte (p, j-1) is written before channel j's reads
        need = max(need, int((pixels * cout - base).max() + (j - first_read).max()))
    if len(base) > 1:  # after a pixel's last byte: the smallest first read of any later pixel
        later_min = np.minimum.accumulate(base[::-1])[::-1][1:]
        need = max(need, int(((pixels[:-1] + 1) * cout - later_min).max()))
    return max(need, 0) * x.itemsize


def inplace_pairs(graph: ir.Graph) -> dict[tuple[str, str], int]:
    """(output, input) -> D for every operator input that dies at that operator and may be overlapped by its
    output (``inplace_distance``). Graph inputs and outputs are excluded: the caller owns them."""
    from tfmcu.tflm_memory import lifetimes

    life = lifetimes(graph)
    keep = set(graph.inputs) | set(graph.outputs)
    pairs: dict[tuple[str, str], int] = {}
    for i, op in enumerate(graph.ops):
        if len(op.outputs) != 1 or op.outputs[0] in keep:
            continue
        for t in dict.fromkeys(op.inputs):
            if t in keep or t not in life or life[t][1] != i + 1 or t == op.outputs[0]:
                continue
            d = inplace_distance(graph, op, t)
            if d is not None and d < graph.tensors[op.outputs[0]].nbytes:
                pairs[(op.outputs[0], t)] = d
    return pairs


def _compatible(a: Any, a_off: int, b: Any, b_off: int, overlap: dict[tuple[str, str], int]) -> bool:
    """Whether buffers ``a`` at ``a_off`` and ``b`` at ``b_off`` can coexist."""
    if a.first > b.last or b.first > a.last:
        return True
    if a_off + a.size <= b_off or b_off + b.size <= a_off:
        return True
    d = overlap.get((a.name, b.name))
    if d is not None and a_off <= b_off - d:
        return True
    d = overlap.get((b.name, a.name))
    return d is not None and b_off <= a_off - d


def _forbidden(b: Any, p: Any, overlap: dict[tuple[str, str], int]) -> tuple[int, int] | None:
    """The open interval of offsets ``b`` may not take next to placed ``p`` (None: no conflict in time)."""
    if p.first > b.last or b.first > p.last:
        return None
    lo, hi = p.offset - b.size, p.offset + p.size
    d = overlap.get((b.name, p.name))
    if d is not None:  # b is the output: it may start d bytes before p
        lo = p.offset - min(d, b.size)
    d = overlap.get((p.name, b.name))
    if d is not None:  # b is the input: it may start d bytes after p
        hi = p.offset + min(d, p.size)
    return lo, hi


def _first_fit(buffers: list[Any], overlap: dict[tuple[str, str], int] | None = None,
               groups: list[list[tuple[Any, int]]] | None = None) -> int:
    """Place ``buffers`` in order, each at the lowest offset where it conflicts with no placed buffer alive at the
    same time; ``overlap[(out, in)] = D`` also allows ``out`` to start D or more bytes before ``in`` (in-place).
    ``groups``: buffers tied together at relative offsets, placed as one (in the order of their first member)."""
    overlap = overlap or {}
    units = groups if groups is not None else [[(b, 0)] for b in buffers]
    placed: list[Any] = []
    for unit in units:
        cmin = -min(rel for _, rel in unit)  # keeps every member at offset >= 0
        forbidden = []
        for m, rel in unit:
            for p in placed:
                iv = _forbidden(m, p, overlap)
                if iv is not None:
                    forbidden.append((iv[0] - rel, iv[1] - rel))
        base = cmin
        for c in sorted({cmin, *(hi for _, hi in forbidden if hi > cmin)}):
            if all(not (lo < c < hi) for lo, hi in forbidden):
                base = c
                break
        for m, rel in unit:
            m.offset = base + rel
            placed.append(m)
    return max((b.offset + b.size for b in buffers), default=0)


def _random_groups(order: list[Any], overlap: dict[tuple[str, str], int], rng: random.Random,
                   p_merge: float) -> list[list[tuple[Any, int]]]:
    """Tie a random subset of in-place pairs together at their distance (output D bytes under input), keeping only
    ties consistent with every other member of the group; groups keep the order of their first member."""
    by_name = {b.name: b for b in order}
    group = {b.name: [(b, 0)] for b in order}
    pairs = [k for k in overlap if k[0] in by_name and k[1] in by_name]
    rng.shuffle(pairs)
    for y, x in pairs:
        if rng.random() >= p_merge or group[y] is group[x]:
            continue
        gy, gx = group[y], group[x]
        rel_y = dict((m.name, r) for m, r in gy)[y]
        rel_x = dict((m.name, r) for m, r in gx)[x]
        shift = rel_y + overlap[(y, x)] - rel_x
        moved = [(m, r + shift) for m, r in gx]
        if all(_compatible(a, ra, b, rb, overlap) for a, ra in gy for b, rb in moved):
            merged = gy + moved
            for m, _ in merged:
                group[m.name] = merged
    units, seen = [], set()
    for b in order:
        g = group[b.name]
        if id(g) not in seen:
            seen.add(id(g))
            units.append(g)
    return units


def _alive_bound(buffers: list[Any], overlap: dict[tuple[str, str], int] | None = None) -> int:
    """A lower bound of any plan's head: the most bytes alive at one step, less what in-place pairs can share."""
    by_name = {b.name: b for b in buffers}
    last = max((b.last for b in buffers), default=-1)
    best = 0
    for t in range(last + 1):
        alive = sum(b.size for b in buffers if b.first <= t <= b.last)
        for (y, x), d in (overlap or {}).items():
            by, bx = by_name.get(y), by_name.get(x)
            if by and bx and by.first <= t <= by.last and bx.first <= t <= bx.last:
                alive -= bx.size + by.size - max(by.size, bx.size + d, bx.size)
        best = max(best, alive)
    return best


def plan(graph: ir.Graph, tries: int | None = None, seed: int = 0,
         inplace: bool = False) -> tuple[int, dict[str, int], int]:
    """(planned head bytes, tensor name -> offset, TFLM greedy head) for ``graph``'s activation tensors.
    ``inplace``: outputs may overlap dying inputs where TFLM's reference kernels allow it (``inplace_pairs``);
    ``tries`` (default 400, 2000 in place) placements are searched, fewer when one reaches the lower bound."""
    from tfmcu.tflm_memory import ALIGN, align_up, plan_head

    tries = tries if tries is not None else (2000 if inplace else 400)
    greedy, buffers = plan_head(graph)
    # Distances rounded up to TFLM's 16-byte buffer alignment (a larger distance is always safe).
    overlap = {k: align_up(d, ALIGN) for k, d in inplace_pairs(graph).items()} if inplace else {}
    tensors = [b for b in buffers if b.name in graph.tensors]
    others = [b for b in buffers if b.name not in graph.tensors]  # kernel scratch: left to TFLM
    base = sorted(tensors + others, key=lambda b: -b.size)
    bound = _alive_bound(base, overlap)
    best_head, best = greedy, {b.name: b.offset for b in tensors}
    rng = random.Random(seed)
    for k in range(tries):
        order = copy.deepcopy(base)
        for _ in range(rng.randint(1, 6) if k else 0):
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            order[i], order[j] = order[j], order[i]
        groups = _random_groups(order, overlap, rng, rng.random()) if overlap and k else None
        head = _first_fit(order, overlap, groups)
        if head < best_head:
            best_head, best = head, {b.name: b.offset for b in order if b.name in graph.tensors}
        if best_head <= bound:
            break
    return best_head, best, greedy


def with_offline_plan(data: bytes, graph: ir.Graph | None = None, tries: int | None = None,
                      inplace: bool = False) -> tuple[bytes, int, int]:
    """``data`` with an OfflineMemoryAllocation plan (replacing any) if it beats TFLM's greedy plan:
    (model bytes, planned head, greedy head). Associated files appended after the flatbuffer are kept.
    ``inplace``: see ``plan`` (valid for TFLM's reference kernels only)."""
    from tfmcu.lower_tflite import from_tflite
    from tfmcu.rewrite import split_appended_zip

    flat, _ = split_appended_zip(data)
    graph = graph or from_tflite(flat)
    head, offsets, greedy = plan(graph, tries, inplace=inplace)
    if head >= greedy:
        return data, greedy, greedy
    return write_offline_plan(data, offsets, graph), head, greedy


def write_offline_plan(data: bytes, offsets: dict[str, int], graph: ir.Graph | None = None) -> bytes:
    """``data`` with the OfflineMemoryAllocation metadata ``offsets`` (tensor name -> byte offset; others online),
    replacing any plan it had. Associated files appended after the flatbuffer are kept."""
    from tfmcu.lower_tflite import from_tflite
    from tfmcu.rewrite import _set_metadata, append_zip, split_appended_zip

    flat, members = split_appended_zip(data)
    graph = graph or from_tflite(flat)
    model = ts.load_model(flat)
    index = _tensor_index(graph)
    values = [-1] * len(model.subgraphs[0].tensors)
    for name, off in offsets.items():
        values[index[name]] = int(off)
    payload = np.asarray([1, 0, len(values)] + values, dtype="<i4").tobytes()
    model.buffers = list(model.buffers or [])
    _set_metadata(model, METADATA_NAME, payload)
    return append_zip(ts.write_model(model), members)


def _tensor_index(graph: ir.Graph) -> dict[str, int]:
    index: dict[str, int] = {}
    for op in graph.ops:
        index.update(op.attrs.get("tflite_tensor_index", {}))
    return index


def read_offline_plan(data: bytes, graph: ir.Graph) -> dict[str, int] | None:
    """Tensor name -> offset of the model's OfflineMemoryAllocation metadata (None if it has none)."""
    from tfmcu.rewrite import split_appended_zip

    model = ts.load_model(split_appended_zip(bytes(data))[0])
    for m in model.metadata or []:
        name = m.name.decode() if isinstance(m.name, (bytes, bytearray)) else str(m.name or "")
        if name == METADATA_NAME:
            raw = np.frombuffer(np.asarray(model.buffers[m.buffer].data, dtype=np.uint8).tobytes(), dtype="<i4")
            if len(raw) < 3 or raw[0] != 1:
                return None
            offsets = raw[3:]
            return {t: int(offsets[i]) for t, i in _tensor_index(graph).items()
                    if i < len(offsets) and offsets[i] >= 0}
    return None
