"""Offline memory plans: tensor offsets better than TFLM's greedy planner, stored where TFLM reads them.

TFLM's greedy planner places buffers largest first, first fit; around residual blocks that leaves holes (MobileNetV2
after the patch stage: 351,232 B planned where at most 326,144 B are ever alive at once). ``plan`` searches
placements (first fit over perturbed orders, seeded, starting from TFLM's own order) and keeps the smallest; the
lower bound is the largest set of buffers alive at one step, and the search stops when it reaches it.
``with_offline_plan`` writes the offsets as TFLM's "OfflineMemoryAllocation" model metadata
([version 1, subgraph 0, number of tensors, offset per tensor or -1 for online]); TFLM then places those tensors
there and plans only the rest (kernel scratch buffers) online. ``tfmcu.plan.arena.predict_arena`` honours such plans.

In-place plans (``inplace=True``, TinyEngine's in-place depthwise generalised): an operator's output may overlap an
input that dies at that operator when the kernel provably reads every input byte before it overwrites it. TFLM places
offline-planned tensors where the plan says and never checks overlaps, so the only question is the kernel's order of
reads and writes, which depends on the kernels the firmware links (``kernels``, ``tfmcu.plan.arena.KERNEL_SETS``).
``inplace_distance`` derives the least number of bytes D by which the output must start before the input: writing
output byte o must not touch an input byte any later step still reads, i.e. D >= o + 1 - (smallest input byte read
after o is written), maximised over o.

* ``kernels="reference"``: TFLM's reference int8 kernels (the tflite-micro wheel, TFLM's default build) and our
  portable C kernels, which share their loop order (batch, out_y, out_x, out channel; the window read before the
  output byte is written).
* ``kernels="cmsis_nn"``: what runs in a CMSIS-NN build on Cortex-M4 / M7 (DSP, no MVE): TFLM's ``kernels/cmsis_nn``
  variants and the patch executor's CMSIS-NN backend, which for a one-layer TFMCU_PATCH_STAGE op on whole tensors
  makes the same CMSIS-NN call (layers it does not cover run the portable kernels, so the reference order).
  ``tfmcu.plan.cmsis_nn.processing_order`` states per kernel path in which step each output byte is written and
  each input byte last read; ``distance_from_order`` takes the maximum above. Depthwise 3x3 and ADD allow about
  what the reference kernels allow, im2col convolutions and pooling a pixel (pair) more; 1x1 convolutions (and fully
  connected layers) re-read their whole input for every pair of output channels, so they allow no useful overlap.
  ``inplace_distance(..., mve=True)``: CMSIS-NN's Helium code (Cortex-M55), whose products run four pixels at a
  time with the output channels inside, so 1x1 convolutions overlap too (up to about four pixels of output more than
  the reference kernels); the other paths allow about what the reference kernels allow, except a depthwise kernel of
  more than 124 channels (arm_depthwise_conv_s8_opt re-reads the input per block of 124 channels: hardly any).

The firmware tests ``//tflm_patch_kernels/firmware:inplace_probe_*`` run every (kernel path, shape class) on
Cortex-M4 and M7 under QEMU at the derived distance (bit-exact) and closer (changed). An offline plan holds the
scratch buffers of the build it is made for (``plan(..., kernels=...)``: TFLM places them online around the plan).
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np

from tfmcu import abi
from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_model, from_tflite
from tfmcu.plan import cmsis_nn
from tfmcu.plan.arena import (ALIGN, KERNEL_SETS, MVE_CORES, builtin_of, lifetimes, mcu_build, offline_offsets,
                              op_allocations, plan_head, tensor_indices)
from tfmcu.plan.placer import Buffer, alive_bound, align_up, compatible, place
from tfmcu.tflite import offline_plan
from tfmcu.tflite.model import TfliteModel
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP, single_layer, stage_of_attrs


# Reference kernels whose read/write order ``inplace_distance`` models (TFLite builtin names).
INPLACE_BUILTINS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD", "SUB", "MUL",
                    "HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU")
# Element-wise operators: element i of the output is written after element i of every input is read, and later
# steps read elements i + 1 onwards, so the output may start at its input (D = 0), in the reference kernels and in
# CMSIS-NN's ADD / MUL (four elements read, then written). Over the operand of the output's shape (a broadcast or
# constant second operand, read again for every pixel, never overlaps).
_ELEMENTWISE_BINARY = ("ADD", "SUB", "MUL")
_ELEMENTWISE = _ELEMENTWISE_BINARY + ("HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU")
# ... those TFLM's CMSIS-NN build runs through CMSIS-NN (kernels/cmsis_nn/add.cc, mul.cc); it runs the others with
# the reference kernels.
_CMSIS_NN_ELEMENTWISE = {"ADD": "add", "MUL": "mul"}


def _window_read_base(op: ir.Op, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Per output pixel (row-major), the element index of the first input element its window reads: the top-left
    in-image tap (TFLM's reference kernels clip the window to the image), channel 0."""
    _, h, w, c = in_shape
    _, ho, wo, _ = out_shape
    iy0 = np.clip(np.arange(ho, dtype=np.int64) * op.stride[0] - op.padding[0], 0, h - 1)
    ix0 = np.clip(np.arange(wo, dtype=np.int64) * op.stride[1] - op.padding[2], 0, w - 1)
    return ((iy0[:, None] * w + ix0[None, :]) * c).reshape(-1)


def _check_kernels(kernels: str) -> None:
    if kernels not in KERNEL_SETS:
        raise ValueError(f"unknown kernels {kernels!r}; known: {', '.join(KERNEL_SETS)}")


def distance_from_order(out_step: np.ndarray, in_step: np.ndarray) -> int:
    """Least D >= 0 such that no output byte o, written in step out_step[o], lands (at o - D in input bytes) on an
    input byte read in a later step (in_step: its last read, -1 for never): max over o of o + 1 - min{i : in_step[i]
    > out_step[o]}."""
    order = np.argsort(in_step, kind="stable")
    steps = in_step[order]
    # smallest input byte among those read last at or after steps[k]
    suffix_min = np.minimum.accumulate(order[::-1])[::-1]
    pos = np.searchsorted(steps, out_step, side="right")  # the first byte read after the write
    later = pos < len(steps)
    if not later.any():
        return 0
    need = np.arange(len(out_step), dtype=np.int64)[later] + 1 - suffix_min[pos[later]]
    return max(0, int(need.max()))


def _cmsis_nn_distance(b: str, op: ir.Op, x: ir.Tensor, y: ir.Tensor, mve: bool = False) -> int | None:
    """``inplace_distance`` for what TFLM's CMSIS-NN kernels (and the CMSIS-NN backend's one CMSIS-NN call on whole
    tensors) run: ``tfmcu.plan.cmsis_nn.processing_order`` (``mve``: CMSIS-NN's Helium code)."""
    kind = {"CONV_2D": "conv", "DEPTHWISE_CONV_2D": "depthwise", "AVERAGE_POOL_2D": "avg_pool",
            "MAX_POOL_2D": "max_pool", **_CMSIS_NN_ELEMENTWISE}[b]
    if kind == "conv" and (op.attrs.get("weights_dtype", "int8") != "int8" or op.groups not in (0, 1)):
        return None  # int4 weights: arm_convolve_wrapper_s4; grouped: not modelled
    order = cmsis_nn.processing_order(kind, tuple(x.shape[1:]), tuple(y.shape[1:]), tuple(op.kernel),
                                      tuple(op.stride), (op.padding[0], op.padding[2]), mve=mve)
    if order is None:
        return None
    _, out_step, in_step = order
    return distance_from_order(out_step, in_step) * x.itemsize


def inplace_distance(graph: ir.Graph, op: ir.Op, tensor: str, kernels: str = "reference",
                     mve: bool = False) -> int | None:
    """Least D (bytes) such that ``op``'s output may start D bytes before its input ``tensor`` and overlap it, with
    the ``kernels`` of the build (KERNEL_SETS: "reference", "cmsis_nn") reading every input byte before
    overwriting it; None where that is not modelled (other operators, dilation, groups, broadcasting, batch > 1,
    tensors other than int8). ``mve``: with kernels="cmsis_nn", a Helium build (Cortex-M55: CMSIS-NN's MVE code;
    ignored for the reference kernels). See the module docstring."""
    _check_kernels(kernels)
    b = builtin_of(op)
    if b == f"custom:{PATCH_STAGE_OP}":  # one conv layer run whole by our kernels (convs_to_flash): its builtin
        try:
            options = stage_of_attrs(op.attrs)
            layer = single_layer(options)
            if layer is not None and kernels == "cmsis_nn":
                entry = options["layers"][0]
                params = abi.params_from_words(int(entry["type"]), [int(v) for v in entry["words"]])
                if not cmsis_nn.covers(int(entry["type"]), params):
                    kernels = "reference"  # the backend runs the portable kernel: the reference order
        except (ValueError, KeyError, TypeError, IndexError):
            layer = None
        if layer is None:
            return None
        op = copy.copy(op)
        op.kernel, op.stride, op.dilation, op.padding, op.groups = (layer["kernel"], layer["stride"],
                                                                    layer["dilation"], layer["padding"],
                                                                    layer["groups"])
        op.attrs = {k: v for k, v in op.attrs.items() if k != "weights_dtype"}
        b = layer["builtin"]
    if b not in INPLACE_BUILTINS or len(op.outputs) != 1 or tensor not in op.inputs:
        return None
    x, y = graph.tensors[tensor], graph.tensors[op.outputs[0]]
    if x.dtype != "int8" or y.dtype != "int8":  # the int8 reference kernels are the ones modelled (and tested)
        return None
    if b in _ELEMENTWISE:
        # over an operand of the output's shape; the other operand may be broadcast (a squeeze-excite's 1 x 1 x C
        # scale, a per-channel constant): TFLM then runs the reference broadcast loop (BroadcastBinaryOpSimple) in
        # both builds, which writes output element i after reading element i of the full-size operand, in order
        if tuple(x.shape) != tuple(y.shape) or (b not in _ELEMENTWISE_BINARY and tensor != op.inputs[0]):
            return None
        if kernels == "cmsis_nn" and b in _CMSIS_NN_ELEMENTWISE and not (op.attrs.get("broadcast")
                                                                      or op.attrs.get("constant_operands")):
            return _cmsis_nn_distance(b, op, x, y, mve)
        return 0  # output[i] is written after every input's element i is read; later steps read i + 1 onwards
    if kernels == "cmsis_nn":
        if (tensor != op.inputs[0] or len(x.shape) != 4 or len(y.shape) != 4 or x.shape[0] != 1 or y.shape[0] != 1
                or tuple(op.dilation) != (1, 1)):
            return None
        return _cmsis_nn_distance(b, op, x, y, mve)
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


def inplace_pairs(graph: ir.Graph, kernels: str = "reference", core: str | None = None) -> dict[tuple[str, str], int]:
    """(output, input) -> D for every operator input that dies at that operator and may be overlapped by its
    output (``inplace_distance`` for ``kernels`` on ``core``: CMSIS-NN's Helium read orders on ``MVE_CORES``, its
    DSP code's on the others and for None), at least by one 16-byte aligned step. Graph inputs and outputs are
    excluded: the caller owns them. A plan for "cmsis_nn" takes the larger of the CMSIS-NN and the reference
    distance: the same model then runs bit-exact in both builds (the target's, and TFLM on the host where ``verify``
    and ``rewrite`` check it)."""
    mve = core in MVE_CORES
    life = lifetimes(graph)
    keep = set(graph.inputs) | set(graph.outputs)
    pairs: dict[tuple[str, str], int] = {}
    for i, op in enumerate(graph.ops):
        if len(op.outputs) != 1 or op.outputs[0] in keep:
            continue
        for t in dict.fromkeys(op.inputs):
            if t in keep or t not in life or life[t][1] != i + 1 or t == op.outputs[0]:
                continue
            d = inplace_distance(graph, op, t, kernels, mve)
            if kernels != "reference" and d is not None:
                ref = inplace_distance(graph, op, t, "reference")
                d = None if ref is None else max(d, ref)
            size = align_up(graph.tensors[op.outputs[0]].nbytes, ALIGN)
            if d is not None and align_up(d, ALIGN) < size:  # they still overlap at TFLM's buffer alignment
                pairs[(op.outputs[0], t)] = d
    return pairs


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
        if all(compatible(a, ra, b, rb, overlap) for a, ra in gy for b, rb in moved):
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


def inplace_overlaps(graph: ir.Graph, kernels: str = "reference",
                     core: str | None = None) -> dict[tuple[str, str], int]:
    """``inplace_pairs`` with the distances rounded up to TFLM's 16-byte buffer alignment (a larger distance is
    always safe): what the plans use (and the profiler's ``tflm_inplace`` accounting)."""
    return {k: align_up(d, ALIGN) for k, d in inplace_pairs(graph, kernels, core).items()}


def head_buffers(graph: ir.Graph, kernels: str = "reference", stages: Any = None,
                 core: str | None = None) -> tuple[int, list[Buffer]]:
    """TFLM's greedy head and planned buffers (``tfmcu.plan.arena.plan_head``) with the scratch buffers of the
    Cortex-M build that links ``kernels`` on ``core`` (``tfmcu.plan.arena.mcu_build``; the reference kernels' scratch
    is the same in every reference build). ``stages``: {TFLite operator index: PackedStage} of the TFMCU_PATCH_STAGE
    ops, whose CMSIS-NN kernel buffer depends on their tiles (without it their scratch is left out of a CMSIS-NN
    plan)."""
    _check_kernels(kernels)
    if kernels == "reference":
        return plan_head(graph)
    build = mcu_build(kernels, core)
    return plan_head(graph, [op_allocations(graph, op, build, stage=stages) for op in graph.ops])


def lower_bound(graph: ir.Graph, inplace: bool = False, kernels: str = "reference", stages: Any = None,
                core: str | None = None) -> int:
    """No plan of ``graph``'s head is smaller: the most bytes alive at one step (less what in-place pairs share)."""
    _, buffers = head_buffers(graph, kernels, stages, core)
    return alive_bound(buffers, inplace_overlaps(graph, kernels, core) if inplace else {})


def inplace_lower_bound(graph: ir.Graph, kernels: str = "reference", stages: Any = None,
                        core: str | None = None) -> int:
    return lower_bound(graph, inplace=True, kernels=kernels, stages=stages, core=core)


def plan(graph: ir.Graph, tries: int | None = None, seed: int = 0, inplace: bool = False,
         kernels: str = "reference", stages: Any = None, core: str | None = None) -> tuple[int, dict[str, int], int]:
    """(planned head bytes, tensor name -> offset, TFLM greedy head) for ``graph``'s activation tensors, around the
    scratch buffers of the build that links ``kernels`` ("reference" or "cmsis_nn") on ``core`` (None: a core
    without Helium; ``stages``: see ``head_buffers``). ``inplace``: outputs may overlap dying inputs where those
    kernels allow it (``inplace_pairs``); ``tries`` (default 400, 2000 in place) placements are searched, fewer when
    one reaches the lower bound."""
    tries = tries if tries is not None else (2000 if inplace else 400)
    greedy, buffers = head_buffers(graph, kernels, stages, core)
    overlap = inplace_overlaps(graph, kernels, core) if inplace else {}
    tensors = [b for b in buffers if b.name in graph.tensors]
    others = [b for b in buffers if b.name not in graph.tensors]  # kernel scratch: left to TFLM
    base = sorted(tensors + others, key=lambda b: -b.size)
    bound = alive_bound(base, overlap)
    best_head, best = greedy, {b.name: b.offset for b in tensors}
    rng = random.Random(seed)
    for k in range(tries):
        order = copy.deepcopy(base)
        for _ in range(rng.randint(1, 6) if k else 0):
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            order[i], order[j] = order[j], order[i]
        groups = _random_groups(order, overlap, rng, rng.random()) if overlap and k else None
        head = place(order, overlap, groups)
        if head < best_head:
            best_head, best = head, {b.name: b.offset for b in order if b.name in graph.tensors}
        if best_head <= bound:
            break
    return best_head, best, greedy


def with_offline_plan(data: bytes | TfliteModel, graph: ir.Graph | None = None, tries: int | None = None,
                      inplace: bool = False, kernels: str = "reference", stages: Any = None,
                      core: str | None = None) -> tuple[bytes | TfliteModel, int, int]:
    """``data`` with an OfflineMemoryAllocation plan (replacing any) if it beats TFLM's greedy plan, else without
    one (a plan it had becomes all online): (model, planned head, greedy head). Associated files appended
    after the flatbuffer are kept. Bytes in, bytes out; a parsed or decided model in (``tfmcu.tflite.model``), a
    decided model out (nothing written: ``graph``, when given, is the one lowered from it).
    ``inplace``, ``kernels``, ``stages``, ``core``: see ``plan``; an in-place plan is valid only for the ``kernels``
    it was made for, and with CMSIS-NN for its read orders (a core with Helium or not: the caller records them)."""
    graph = graph or _lowered(data)
    head, offsets, greedy = plan(graph, tries, inplace=inplace, kernels=kernels, stages=stages, core=core)
    if head >= greedy:
        if offline_plan.read(data) is not None:  # a plan made before (maybe for other kernels): all online
            return write_offline_plan(data, {}, graph), greedy, greedy
        return data, greedy, greedy
    return write_offline_plan(data, offsets, graph), head, greedy


def _lowered(data: bytes | TfliteModel) -> ir.Graph:
    return from_model(data) if isinstance(data, TfliteModel) else from_tflite(data)


def write_offline_plan(data: bytes | TfliteModel, offsets: dict[str, int],
                       graph: ir.Graph | None = None) -> bytes | TfliteModel:
    """``data`` with the OfflineMemoryAllocation metadata ``offsets`` (tensor name -> byte offset; others online),
    replacing any plan it had. Associated files appended after the flatbuffer are kept (bytes in, bytes out; a
    model in, a decided model out)."""
    index = tensor_indices(graph or _lowered(data))
    return offline_plan.write(data, {index[name]: off for name, off in offsets.items()})


def read_offline_plan(data: bytes | TfliteModel, graph: ir.Graph) -> dict[str, int] | None:
    """Tensor name -> offset of the model's OfflineMemoryAllocation metadata (None if it has none)."""
    return offline_offsets(graph, offline_plan.read(data))
