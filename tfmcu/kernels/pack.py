"""A patch stage packed for the C executor: ``pack_stage(model_bytes, graph, schedule) -> PackedStage``.

The C description (``TfmcuStage``, see ``tflm_patch_kernels/patch_stage.h``) of a ``tfmcu.plan.regions``
schedule's patch stage of an int8 .tflite, as plain data: every layer's ``LayerSpec`` (``tfmcu.kernels.ops``: weights
and biases read from the flatbuffer, multipliers computed offline), the tensor table, per-band spans from the
schedule's per-axis walks, and the patch buffers of every patch placed in one scratch buffer by the one placer
(``tfmcu.plan.placer``, offsets aligned to 4 bytes): ``scratch_bytes`` is known before deployment.
``stage_blob(packed)``: all of it as one stage blob (``tfmcu.tflite.patch_stage_format.write_blob``), what the
TFMCU_PATCH_STAGE op, the ctypes binding and the generated C read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu import abi
from tfmcu.abi import FLOAT32, INT8
from tfmcu.graph import ir
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.ops import LayerSpec, layer_spec
from tfmcu.plan.placer import Buffer, align_up, alive_bound, place
from tfmcu.plan.regions import Read
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import TfliteModel, as_model
from tfmcu.tflite.patch_stage_format import write_blob


# ============================================================================= scratch planning
@dataclass
class BufferPlan:
    offsets: list[int]
    end: int  # highest byte reached (max offset + size)
    lower_bound: int  # max over steps of the bytes alive at once
    strategy: str


def plan_buffers(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]], align: int = 4) -> BufferPlan:
    """Place buffers (``sizes`` bytes, alive during layers [first, last] inclusive) at offsets so that buffers alive
    at the same time never overlap: the one placer (lowest aligned offset) under several orders, keeping the
    plan that reaches the lowest end."""
    n = len(sizes)
    buffers = [Buffer(t, int(sizes[t]), lifetimes[t][0], lifetimes[t][1]) for t in range(n)]
    bound = alive_bound(buffers)
    orders = {
        "size": sorted(range(n), key=lambda t: (-sizes[t], lifetimes[t][0], t)),
        "start": sorted(range(n), key=lambda t: (lifetimes[t][0], -sizes[t], t)),
        "area": sorted(range(n), key=lambda t: (-(sizes[t] * (lifetimes[t][1] - lifetimes[t][0] + 1)), t)),
        "long": sorted(range(n), key=lambda t: (-(lifetimes[t][1] - lifetimes[t][0]), -sizes[t], t)),
    }
    best: BufferPlan | None = None
    for strategy, order in orders.items():
        end = place([buffers[t] for t in order], align=align)
        if best is None or end < best.end:
            best = BufferPlan([b.offset if b.size > 0 else 0 for b in buffers], end, bound, strategy)
    assert best is not None
    return best


@dataclass
class PackedStage:
    """A patch stage ready for the C executor, as plain Python / numpy data: what ``TfmcuStage`` (patch_stage.h)
    holds. ``tfmcu.kernels.binding`` turns it into the C struct, ``tfmcu.kernels.codegen`` into C source."""

    name: str
    layers: list[LayerSpec]
    layer_inputs: list[list[int]]
    layer_outputs: list[int]
    tensor_names: list[str]
    tensor_shapes: list[tuple[int, int, int]]  # (H, W, C)
    tensor_dtypes: list[int]
    tensor_producers: list[int]
    tensor_tflite_index: list[int]
    input_tensor: int
    output_tensor: int
    grid: tuple[int, int]
    row_spans: np.ndarray  # [grid rows, layers, SPAN_FIELDS] int32 in TfmcuSpan field order
    col_spans: np.ndarray
    buffer_offsets: np.ndarray  # [patches, tensors] int32, -1 for input/output
    buffer_sizes: np.ndarray  # [patches, tensors] bytes (0 for input/output)
    scratch_bytes: int
    lower_bound_bytes: int  # max over patches and steps of the patch bytes alive at once (analytic)
    plan_strategies: list[str]
    # Halo caches (patch_stage.h; none: None / []): held ranges [bands, layers, 2] and (tensor, axis, offset).
    row_held: np.ndarray | None = None
    col_held: np.ndarray | None = None
    caches: list[tuple[int, int, int]] = field(default_factory=list)
    cache_bytes: list[int] = field(default_factory=list)  # per cache, as the C library computes them
    # Passes (patch_stage_types.h): per layer (passes bit mask, after_pass); None: one pass, every layer in it.
    layer_passes: list[tuple[int, int]] | None = None
    num_passes: int = 1
    tensor_data: dict[int, np.ndarray] = field(default_factory=dict)  # the constant tensors' int8 data by id

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, *self.tensor_shapes[self.input_tensor])

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (1, *self.tensor_shapes[self.output_tensor])

    @property
    def input_dtype(self) -> Any:
        return np.float32 if self.tensor_dtypes[self.input_tensor] == FLOAT32 else np.int8


SPAN_FIELDS = abi.SPAN_WORDS  # int32 words of a TfmcuSpan
_SWAPPABLE = (abi.OP_ADD,) + ((abi.OP_MUL,) if hasattr(abi, "OP_MUL") else ())  # commutative two-input ops


def swap_operands(spec: LayerSpec) -> LayerSpec:
    """``spec`` of a commutative op (ADD, MUL) with its two operands' params exchanged (the same results with the
    inputs swapped)."""
    p = dict(spec.params)
    for a, b in (("input1_offset", "input2_offset"), ("input1_multiplier", "input2_multiplier"),
                 ("input1_shift", "input2_shift")):
        if a in p:
            p[a], p[b] = p[b], p[a]
    return LayerSpec(spec.type, p, spec.arrays, spec.name, spec.src_index, spec.padding)
SPAN = abi.word_offsets("TfmcuSpan")  # where each TfmcuSpan field starts in a row of SPAN_FIELDS
_NO_READ = Read(0, 0, 0, 0)  # what a layer that computes nothing in a band reads
_READ_FIELDS = (("in_start", "start"), ("in_stop", "stop"), ("pad_before", "pad_before"), ("pad_after", "pad_after"))


def _span_row(out: tuple[int, int], reads: list[Any]) -> list[int]:
    row = [0] * SPAN_FIELDS
    row[SPAN["out_start"]], row[SPAN["out_stop"]] = out
    for k, r in enumerate(reads):
        for span_field, read_field in _READ_FIELDS:
            row[SPAN[span_field] + k] = getattr(r, read_field)
    return row


def input_window_bytes(packed: "PackedStage") -> int:
    """Bytes of a streamed run's input row window: the most stage-input rows a row band reads x whole rows
    (``tfmcu_input_window_bytes`` of patch_stage.c); 0 when the bands' input rows do not move forward or the stage
    sweeps its grid more than once (it reads its input in every pass)."""
    if packed.num_passes != 1:
        return 0
    t = packed.input_tensor
    h, w, c = packed.tensor_shapes[t]
    row_bytes = w * c * (4 if packed.tensor_dtypes[t] == FLOAT32 else 1)
    most = prev_start = prev_stop = 0
    for band in packed.row_spans:
        i0, i1 = SPAN["in_start"], SPAN["in_stop"]
        reads = [(int(span[i0 + k]), int(span[i1 + k])) for pos, span in enumerate(band)
                 for k, src in enumerate(packed.layer_inputs[pos]) if src == t and span[i1 + k] > span[i0 + k]]
        start, stop = (min(a for a, _ in reads), max(b for _, b in reads)) if reads else (prev_stop, prev_stop)
        if start < prev_start or stop < prev_stop:
            return 0
        most, prev_start, prev_stop = max(most, stop - start), start, stop
    return most * row_bytes


def cache_sizes(row_held: np.ndarray, col_held: np.ndarray, caches: Sequence[tuple[int, int]],
                producers: Sequence[int], channels: Sequence[int]) -> list[int]:
    """Bytes of each halo cache ``(tensor, axis)`` from the held tables (axis 2: a reduction's accumulator, C int32):
    ``tfmcu_cache_bytes`` of patch_stage_validate.c."""
    sizes = []
    for t, axis in caches:
        if axis == 2:  # a reduction's accumulator: C int32
            sizes.append(4 * channels[t])
            continue
        p = producers[t]
        held = (row_held, col_held)[axis][:, p]
        along = max([max(int(held[b, 1]) - int(held[b + 1, 0]), 0) for b in range(len(held) - 1)], default=0)
        if axis == 0:
            across = int(col_held[-1, p, 1]) - int(col_held[0, p, 0])
        else:
            across = max(int(r[1]) - int(r[0]) for r in row_held[:, p])
        sizes.append(along * across * channels[t])
    return sizes


def pack_stage(model_bytes: bytes | ts.ModelT | TfliteModel, graph: ir.Graph, schedule: Any, align: int = 4,
               name: str | None = None, halo: Any = None) -> PackedStage:
    """The C description of ``schedule``'s patch stage (a ``tfmcu.plan.regions.PatchSchedule`` of ``graph``, which was
    lowered from ``model_bytes`` by ``tfmcu.graph.from_tflite``; the model may be given already parsed or unpacked,
    read only, when many stages of one model are packed). ``align``: patch-buffer offsets are multiples
    of it. ``halo``: the ``tfmcu.plan.halo.HaloCaches`` of the same schedule (its caches are placed first in scratch,
    the patch buffers after them)."""
    if halo is not None and halo.schedule is not schedule:
        raise PatchKernelError("the halo caches belong to another schedule")
    if graph.source != "tflite":
        raise PatchKernelError("pack_stage needs a graph lowered from the .tflite itself (tfmcu.graph.from_tflite)")
    model = model_bytes if isinstance(model_bytes, ts.ModelT) else as_model(model_bytes).flatbuffer
    s = schedule
    if len(s.stage_inputs) != 1 or len(s.stage_outputs) != 1:
        raise PatchKernelError(f"the C executor runs stages with one input and one output; this one has inputs "
                               f"{s.stage_inputs} and outputs {s.stage_outputs}")
    t_in, t_out = s.stage_inputs[0], s.stage_outputs[0]
    passes = s.passes
    # A reshape of a whole tensor (a squeeze-excite's [1, C] -> [1, 1, 1, C]) moves no byte: its output is its input.
    alias = {graph.ops[k].outputs[0]: graph.ops[k].inputs[0] for k in s.stage
             if k in passes.after and graph.ops[k].type == ir.RESHAPE}

    def real(t: str) -> str:
        while t in alias:
            t = alias[t]
        return t

    layer_ops = [k for k in s.stage if graph.ops[k].outputs[0] not in alias]
    tensor_names = [t_in]
    for k in layer_ops:
        for t in graph.ops[k].outputs:
            if t not in tensor_names:
                tensor_names.append(t)
    tid = {t: i for i, t in enumerate(tensor_names)}
    layers, layer_inputs, layer_outputs = [], [], []
    producers = [-1] * len(tensor_names)
    tfl_index = [-1] * len(tensor_names)
    tensor_data: dict[int, np.ndarray] = {}
    swapped: set[int] = set()  # layers whose two operands run swapped (the whole tensor second)
    for pos, k in enumerate(layer_ops):
        op = graph.ops[k]
        if len(op.outputs) != 1:
            raise PatchKernelError(f"{op.describe(k)}: ops with {len(op.outputs)} outputs are not supported")
        spec = layer_spec(model, op, k)
        ins = [tid[real(t)] for t in op.inputs]
        operand = spec.operand
        if operand is not None:  # a constant second operand: a constant tensor of the stage, 1 x 1 x C
            tid[f"{op.name}/operand"] = len(tensor_names)
            tensor_names.append(f"{op.name}/operand")
            producers.append(-1)
            tfl_index.append(-1)
            tensor_data[len(tensor_names) - 1] = np.ascontiguousarray(operand, np.int8).reshape(-1)
            ins.append(len(tensor_names) - 1)
        if len(ins) == 2 and real(op.inputs[0]) in passes.whole and spec.type in _SWAPPABLE:
            ins, spec = ins[::-1], swap_operands(spec)  # the broadcast whole tensor as the second operand
            swapped.add(pos)
        layers.append(spec)
        layer_inputs.append(ins)
        layer_outputs.append(tid[op.outputs[0]])
        producers[tid[op.outputs[0]]] = pos
        for t, idx in op.attrs.get("tflite_tensor_index", {}).items():
            if t in tid:
                tfl_index[tid[t]] = int(idx)
    shapes, dtypes = [], []
    for t in tensor_names:
        if tid[t] in tensor_data:
            shapes.append((1, 1, int(tensor_data[tid[t]].size)))
            dtypes.append(INT8)
            continue
        tensor = graph.tensors[t]
        if (t == t_out and s.pool is not None) or t in passes.whole:  # 1 x 1 x C: a pool's output, a whole tensor
            shapes.append((1, 1, int(tensor.shape[-1])))
            dtypes.append(INT8)
            continue
        if not tensor.is_feature_map or tensor.shape[0] != 1:
            raise PatchKernelError(f"tensor '{t}' has shape {list(tensor.shape)}: expected [1, H, W, C]")
        shapes.append(tuple(int(d) for d in tensor.shape[1:]))
        if tensor.dtype not in ("int8", "float32") or (tensor.dtype == "float32" and t != t_in):
            raise PatchKernelError(f"tensor '{t}' is {tensor.dtype}: the C executor holds int8 patch buffers "
                                   f"(float32 only as the stage input)")
        dtypes.append(FLOAT32 if tensor.dtype == "float32" else INT8)

    # Spans per axis band (the schedule's walks are separable); with halo caches a layer computes w.comp and its
    # patch buffer holds w.need.
    def spans(walks: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        arr = np.zeros((len(walks), len(layer_ops), SPAN_FIELDS), np.int32)
        held = np.zeros((len(walks), len(layer_ops), 2), np.int32)
        for b, w in enumerate(walks):
            computed = w.comp if halo is not None else w.need
            for pos, k in enumerate(layer_ops):
                op = graph.ops[k]
                t = op.outputs[0]
                if k == s.pool:  # the band's tile of its input into the 1 x 1 sums (patch_stage.h: reductions)
                    arr[b, pos] = _span_row((0, 1), [Read(w.band[0], w.band[1], 0, 0)])
                    held[b, pos] = (0, 1)
                    continue
                if k in passes.inner:  # the band's own tile of its input into the sums
                    arr[b, pos] = _span_row((0, 1), [w.reads[(k, 0)]])
                    held[b, pos] = (0, 1)
                    continue
                if k in passes.after:  # once per run on 1 x 1 tensors (a constant operand: its one pixel too)
                    arr[b, pos] = _span_row((0, 1), [Read(0, 1, 0, 0)] * len(layer_inputs[pos]))
                    held[b, pos] = (0, 1)
                    continue
                if t not in computed:
                    raise PatchKernelError(f"{op.describe(k)}: its output is not needed by the stage output")
                need, comp = w.need.get(t, (0, 0)), computed[t]
                if need[1] <= need[0]:  # nothing left to do in this band (its need was clipped at the border)
                    need = comp = (int(held[b - 1, pos, 1]),) * 2 if b else (0, 0)
                reads = [w.reads.get((k, p), _NO_READ) if comp[1] > comp[0] else _NO_READ
                         for p in range(len(op.inputs))]
                if comp[1] > comp[0] and any((k, p) not in w.reads for p in range(len(op.inputs))):
                    raise PatchKernelError(f"{op.describe(k)}: its output is not needed by the stage output")
                if len(layer_inputs[pos]) > len(reads):  # a constant operand: broadcast, its one pixel
                    reads.append(Read(0, 1, 0, 0) if comp[1] > comp[0] else _NO_READ)
                if pos in swapped:
                    reads = reads[::-1]
                arr[b, pos] = _span_row(comp, reads)
                held[b, pos] = need
        return arr, held

    (row_spans, row_held), (col_spans, col_held) = spans((halo or s).rows), spans((halo or s).cols)
    caches: list[tuple[int, int]] = []
    if halo is not None:
        caches = [(tid[t], 0) for t in sorted(halo.cache_rows)] + [(tid[t], 1) for t in sorted(halo.cache_cols)]
    caches += [(tid[graph.ops[r].outputs[0]], 2) for r in passes.inner]  # the inner reductions' int32 sums
    if s.pool is not None:  # the global pool's int32 sums: a cache of the output tensor along "axis" 2
        caches.append((tid[t_out], 2))
    sizes_c = cache_sizes(row_held, col_held, caches, producers, [sh[2] for sh in shapes])
    cache_offsets, base = [], 0
    for n in sizes_c:
        cache_offsets.append(base)
        base = align_up(base + n, align)
    whole_ids = [tid[t] for t in tensor_names if t in passes.whole]  # at one offset for the whole run, after the caches
    whole_offsets = {}
    for t in whole_ids:
        whole_offsets[t] = base
        base = align_up(base + shapes[t][2], align)

    # Scratch plan, patch by patch.
    n_t = len(tensor_names)
    lifetimes = []
    for t in range(n_t):
        readers = [pos for pos, ins in enumerate(layer_inputs) if t in ins]
        lifetimes.append((producers[t], max(readers + [producers[t]])))
    scratch_ids = [t for t in range(n_t) if t not in (tid[t_in], tid[t_out]) and t not in tensor_data
                   and t not in whole_offsets]
    patches = s.grid[0] * s.grid[1]
    offsets = np.full((patches, n_t), -1, np.int32)
    sizes = np.zeros((patches, n_t), np.int64)
    end = bound = 0
    strategies = []
    plans: dict[tuple[int, ...], BufferPlan] = {}  # patches of the same buffer sizes (most of a grid) share a plan
    for i in range(s.grid[0]):
        for j in range(s.grid[1]):
            p = i * s.grid[1] + j
            for t in scratch_ids:
                pos = producers[t]
                rows = row_held[i, pos, 1] - row_held[i, pos, 0]
                cols = col_held[j, pos, 1] - col_held[j, pos, 0]
                sizes[p, t] = int(rows) * int(cols) * shapes[t][2]
            key = tuple(int(sizes[p, t]) for t in scratch_ids)
            if key not in plans:
                plans[key] = plan_buffers(list(key), [lifetimes[t] for t in scratch_ids], align)
            plan = plans[key]
            for t, off in zip(scratch_ids, plan.offsets):
                offsets[p, t] = base + off
            for t, off in whole_offsets.items():
                offsets[p, t], sizes[p, t] = off, shapes[t][2]
            end, bound = max(end, base + plan.end), max(bound, sum(sizes_c) + plan.lower_bound)
            strategies.append(plan.strategy)
    if end >= 2 ** 31:
        raise PatchKernelError(f"scratch of {end} bytes does not fit the C description (int32 offsets)")
    packed = PackedStage(
        name=name or graph.name, layers=layers, layer_inputs=layer_inputs, layer_outputs=layer_outputs,
        tensor_names=tensor_names, tensor_shapes=shapes, tensor_dtypes=dtypes, tensor_producers=producers,
        tensor_tflite_index=tfl_index, input_tensor=tid[t_in], output_tensor=tid[t_out], grid=tuple(s.grid),
        row_spans=row_spans, col_spans=col_spans, buffer_offsets=offsets, buffer_sizes=sizes,
        scratch_bytes=int(max([end, base if whole_offsets else 0] + [o + n for o, n in zip(cache_offsets, sizes_c)
                                                                     if n])),
        lower_bound_bytes=int(bound),
        plan_strategies=strategies,
        row_held=row_held if caches else None, col_held=col_held if caches else None,
        caches=[(t, a, o) for (t, a), o in zip(caches, cache_offsets)], cache_bytes=sizes_c,
        layer_passes=None if passes.count == 1 else [
            (0, passes.after[k]) if k in passes.after else (passes.masks[k], -1) for k in layer_ops],
        num_passes=passes.count, tensor_data=tensor_data)
    return packed


def stage_blob(packed: PackedStage) -> bytes:
    """``packed`` as one stage blob (patch_stage_types.h): its tables, its layers' params records and arrays (weights
    included) in one constant byte array without pointers."""
    tables: dict[str, np.ndarray | None] = {"row_spans": packed.row_spans, "col_spans": packed.col_spans,
                                            "buffer_offsets": packed.buffer_offsets, "row_held": None,
                                            "col_held": None, "caches": None}
    if packed.caches:
        tables.update(row_held=packed.row_held, col_held=packed.col_held, caches=np.asarray(packed.caches))
    return write_blob(
        tensors=[[*map(int, shape), int(dt), int(prod)] for shape, dt, prod in
                 zip(packed.tensor_shapes, packed.tensor_dtypes, packed.tensor_producers)],
        layers=[(int(spec.type), spec.words()) for spec in packed.layers],
        arrays=[spec.arrays for spec in packed.layers], layer_inputs=packed.layer_inputs,
        layer_outputs=packed.layer_outputs, input_tensor=packed.input_tensor, output_tensor=packed.output_tensor,
        grid=packed.grid, scratch_bytes=packed.scratch_bytes, tables=tables, passes=packed.layer_passes,
        num_passes=packed.num_passes, tensor_data=packed.tensor_data)
