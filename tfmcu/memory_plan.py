"""Offline memory plans: tensor offsets better than TFLM's greedy planner, stored where TFLM reads them.

TFLM's greedy planner places buffers largest first, first fit; around residual blocks that leaves holes (MobileNetV2
after the patch stage: 351,232 B planned where at most 326,144 B are ever alive at once). ``plan`` searches
placements (first fit over perturbed orders, seeded, starting from TFLM's own order) and keeps the smallest; the
lower bound is the largest set of buffers alive at one step, and the search stops when it reaches it.
``with_offline_plan`` writes the offsets as TFLM's "OfflineMemoryAllocation" model metadata
([version 1, subgraph 0, number of tensors, offset per tensor or -1 for online]); TFLM then places those tensors
there and plans only the rest (kernel scratch buffers) online. ``tflm_memory.predict_arena`` honours such plans.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np

from tfmcu import ir
from tfmcu import tflite_schema as ts

METADATA_NAME = "OfflineMemoryAllocation"


def _first_fit(buffers: list[Any]) -> int:
    placed: list[Any] = []
    for b in buffers:
        candidate = 0
        for p in sorted(placed, key=lambda q: q.offset):
            if p.first > b.last or b.first > p.last:
                continue
            if p.offset - candidate >= b.size:
                break
            candidate = max(candidate, p.offset + p.size)
        b.offset = candidate
        placed.append(b)
    return max((b.offset + b.size for b in buffers), default=0)


def _alive_bound(buffers: list[Any]) -> int:
    last = max((b.last for b in buffers), default=-1)
    return max((sum(b.size for b in buffers if b.first <= t <= b.last) for t in range(last + 1)), default=0)


def plan(graph: ir.Graph, tries: int = 400, seed: int = 0) -> tuple[int, dict[str, int], int]:
    """(planned head bytes, tensor name -> offset, TFLM greedy head) for ``graph``'s activation tensors."""
    from tfmcu.tflm_memory import plan_head

    greedy, buffers = plan_head(graph)
    tensors = [b for b in buffers if b.name in graph.tensors]
    others = [b for b in buffers if b.name not in graph.tensors]  # kernel scratch: left to TFLM
    base = sorted(tensors + others, key=lambda b: -b.size)
    bound = _alive_bound(base)
    best_head, best = greedy, {b.name: b.offset for b in tensors}
    rng = random.Random(seed)
    for k in range(tries):
        order = copy.deepcopy(base)
        for _ in range(rng.randint(1, 6) if k else 0):
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            order[i], order[j] = order[j], order[i]
        head = _first_fit(order)
        if head < best_head:
            best_head, best = head, {b.name: b.offset for b in order if b.name in graph.tensors}
        if best_head <= bound:
            break
    return best_head, best, greedy


def with_offline_plan(data: bytes, graph: ir.Graph | None = None, tries: int = 400) -> tuple[bytes, int, int]:
    """``data`` with an OfflineMemoryAllocation plan (replacing any) if it beats TFLM's greedy plan:
    (model bytes, planned head, greedy head). Associated files appended after the flatbuffer are kept."""
    from tfmcu.lower_tflite import from_tflite
    from tfmcu.rewrite import _set_metadata, append_zip, split_appended_zip

    flat, members = split_appended_zip(data)
    graph = graph or from_tflite(flat)
    head, offsets, greedy = plan(graph, tries)
    if head >= greedy:
        return data, greedy, greedy
    model = ts.load_model(flat)
    index = _tensor_index(graph)
    values = [-1] * len(model.subgraphs[0].tensors)
    for name, off in offsets.items():
        values[index[name]] = int(off)
    payload = np.asarray([1, 0, len(values)] + values, dtype="<i4").tobytes()
    model.buffers = list(model.buffers or [])
    _set_metadata(model, METADATA_NAME, payload)
    return append_zip(ts.write_model(model), members), head, greedy


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
