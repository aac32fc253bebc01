"""The one placer: buffers with lifetimes laid out in one address range, first fit, optionally in place.

Every memory layout tfmcu computes goes through ``place``: TFLM's own greedy planner as the arena predictor replays
it (``tfmcu.plan.arena``), the offline memory plans that beat it (``tfmcu.plan.memory_plan``, with in-place
overlaps), and the patch buffers of the C executor's scratch (``tfmcu.kernels.pack``, aligned offsets).

``place(buffers)`` takes the buffers in the order given. A buffer with a ``fixed`` offset (an offline plan) goes
there. Every other buffer goes to the lowest offset (a multiple of ``align``) where it conflicts with no buffer
already placed: two buffers conflict when their lifetimes ``[first, last]`` intersect and their byte ranges
overlap, except that ``overlap[(out, in)] = D`` lets buffer ``out`` start ``D`` or more bytes before buffer ``in``
and overlap it (an operator that reads every input byte before it overwrites it: see ``memory_plan``). That lowest
offset is always 0 or the end of a placed buffer, which is also where TFLM's ``GreedyMemoryPlanner`` puts it (it
walks the placed buffers in offset order and takes the first gap that fits): for the same order both give the same
layout. ``groups`` ties buffers together at fixed relative offsets and places each group as one unit.

``alive_bound(buffers)``: the most bytes alive at one step (less what in-place pairs may share): no layout is
smaller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

Overlap = dict[tuple[Any, Any], int]


@dataclass
class Buffer:
    name: Any  # a tensor name, a scratch request, a tensor id
    size: int  # bytes
    first: int  # first step during which it is alive
    last: int  # last step during which it is alive (inclusive)
    offset: int = -1  # set by place()
    fixed: int = -1  # offset fixed in advance (an offline plan); -1: placed by place()


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def alive_together(a: Buffer, b: Buffer) -> bool:
    return not (a.first > b.last or b.first > a.last)


def _forbidden(b: Buffer, p: Buffer, overlap: Overlap) -> tuple[int, int] | None:
    """The open interval of offsets ``b`` may not take next to placed ``p`` (None: they never conflict)."""
    if b.size <= 0 or p.size <= 0 or not alive_together(b, p):
        return None
    lo, hi = p.offset - b.size, p.offset + p.size
    d = overlap.get((b.name, p.name))
    if d is not None:  # b is the output: it may start d bytes before p
        lo = p.offset - min(d, b.size)
    d = overlap.get((p.name, b.name))
    if d is not None:  # b is the input: it may start d bytes after p
        hi = p.offset + min(d, p.size)
    return lo, hi


def compatible(a: Buffer, a_off: int, b: Buffer, b_off: int, overlap: Overlap) -> bool:
    """Whether ``a`` at ``a_off`` and ``b`` at ``b_off`` can coexist."""
    if a.size <= 0 or b.size <= 0 or not alive_together(a, b):
        return True
    if a_off + a.size <= b_off or b_off + b.size <= a_off:
        return True
    d = overlap.get((a.name, b.name))
    if d is not None and a_off <= b_off - d:
        return True
    d = overlap.get((b.name, a.name))
    return d is not None and b_off <= a_off - d


def place(buffers: Sequence[Buffer], overlap: Overlap | None = None,
          groups: Iterable[Sequence[tuple[Buffer, int]]] | None = None, align: int = 1) -> int:
    """Lay out ``buffers`` in the given order (see the module docstring); sets each ``offset`` and returns the end
    of the layout (the highest offset + size of a non-empty buffer, 0 if none). ``groups``: units of (buffer,
    relative offset), placed in the order of the units (then ``buffers`` only gives the result's extent)."""
    overlap = overlap or {}
    units = list(groups) if groups is not None else [[(b, 0)] for b in buffers]
    placed: list[Buffer] = []
    for unit in units:
        if len(unit) == 1 and unit[0][0].fixed >= 0:
            unit[0][0].offset = unit[0][0].fixed
            placed.append(unit[0][0])
            continue
        start = -min(rel for _, rel in unit)  # keeps every member at offset >= 0
        forbidden = []
        for m, rel in unit:
            for p in placed:
                iv = _forbidden(m, p, overlap)
                if iv is not None:
                    forbidden.append((iv[0] - rel, iv[1] - rel))
        base = start
        for c in sorted({start, *(align_up(hi, align) for _, hi in forbidden if hi > start)}):
            if all(not (lo < c < hi) for lo, hi in forbidden):
                base = c
                break
        for m, rel in unit:
            m.offset = base + rel
            placed.append(m)
    return max((b.offset + b.size for b in buffers if b.size > 0), default=0)


def shared_bytes(in_size: int, out_size: int, distance: int) -> int:
    """Bytes an output of ``out_size`` starting ``distance`` bytes before an input of ``in_size`` shares with it
    (the pair then spans max(out_size, in_size + distance) bytes)."""
    return max(0, min(in_size, out_size - distance))


def alive_bound(buffers: Sequence[Buffer], overlap: Overlap | None = None) -> int:
    """A lower bound of any layout's end: the most bytes alive at one step, less what in-place pairs can share."""
    by_name = {b.name: b for b in buffers}
    steps = range(min((b.first for b in buffers), default=0), max((b.last for b in buffers), default=-1) + 1)
    best = 0
    for t in steps:
        alive = sum(b.size for b in buffers if b.first <= t <= b.last)
        for (y, x), d in (overlap or {}).items():
            by, bx = by_name.get(y), by_name.get(x)
            if by and bx and by.first <= t <= by.last and bx.first <= t <= bx.last:
                alive -= shared_bytes(bx.size, by.size, d)
        best = max(best, alive)
    return best
