"""Rewrite any int8 .tflite so its patch stage runs patch by patch in ordinary TFLite builtin ops.

For every patch of a ``scheduler.PatchSchedule`` the stage is unrolled into:

* SLICE of the stage input's window (skipped when the window is the whole tensor);
* per stage op and input: SLICE when the op reads a smaller box than the patch buffer holds (e.g. the residual ADD
  reads less of the block input than the expansion conv), PAD with the zero point only on the sides where the window
  runs past the feature-map border (PADV2 with -128 before MAX_POOL_2D);
* the op itself with VALID padding on patch-sized tensors, reading the ORIGINAL weight and bias tensors (no Flash
  duplication; only the small slice/pad parameter tensors are new);
* CONCATENATION of each row's patches along width, then of the rows along height, into the original stage-output
  tensor, so the rest of the graph is untouched.

Patches run one after another (row-major) so TFLM's greedy planner reuses the same memory for every patch.
The schedule is recorded in the model metadata (``tfmcu_schedule``, JSON); existing metadata and associated files
(the zip that TFLite metadata appends after the flatbuffer) are kept.
"""

from __future__ import annotations

import copy
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfmcu import ir
from tfmcu import tflite_schema as ts
from tfmcu.scheduler import PatchSchedule

SCHEDULE_METADATA = "tfmcu_schedule"
MAX_CONCAT_INPUTS = 10  # TFLM's CONCATENATION kernel takes at most 10 inputs
# int8 support arrived in these op versions (TFLite's op version tables).
_VERSIONS = {"SLICE": 2, "PAD": 2, "PADV2": 2, "CONCATENATION": 2}
_WINDOW_TFLITE_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D")
_POINTWISE_TFLITE_OPS = ("ADD", "MUL", "QUANTIZE", "DEQUANTIZE", "RELU", "RELU6", "LOGISTIC", "CONCATENATION")


class RewriteError(ValueError):
    """The model cannot be rewritten; one line naming the op and what is supported."""


@dataclass
class RewriteResult:
    model: bytes
    ops_before: int
    ops_after: int
    new_tensors: int
    schedule: dict[str, Any]


def split_appended_zip(data: bytes) -> tuple[bytes, list[tuple[zipfile.ZipInfo, bytes]]]:
    """The flatbuffer and the associated files TFLite metadata appends as a zip after it (if any)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        members = [(info, zf.read(info)) for info in zf.infolist()]
    except zipfile.BadZipFile:
        return data, []
    return data, members


def append_zip(model: bytes, members: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    if not members:
        return model
    buf = io.BytesIO(model)
    buf.seek(0, io.SEEK_END)
    with zipfile.ZipFile(buf, "a") as zf:
        for info, payload in members:
            zf.writestr(info, payload)
    return buf.getvalue()


class _Writer:
    """Appends tensors, constants and operators to a ModelT's subgraph 0."""

    def __init__(self, model: ts.ModelT):
        self.model = model
        self.sg = model.subgraphs[0]
        self.codes: dict[str, int] = {}
        self.consts: dict[tuple, int] = {}
        self.new_tensors = 0

    def opcode(self, name: str) -> int:
        if name in self.codes:
            return self.codes[name]
        code_value = getattr(ts.BuiltinOperator, name)
        version = _VERSIONS.get(name, 1)
        for k, code in enumerate(self.model.operatorCodes or []):
            if ts.builtin_code(code) == code_value:
                code.version = max(int(code.version or 1), version)
                self.codes[name] = k
                return k
        code = ts.OperatorCodeT()
        code.builtinCode = code_value
        code.deprecatedBuiltinCode = min(code_value, 127)
        code.version = version
        self.model.operatorCodes.append(code)
        self.codes[name] = len(self.model.operatorCodes) - 1
        return self.codes[name]

    def tensor_like(self, src: int, shape: tuple[int, ...], name: str) -> int:
        t = copy.deepcopy(self.sg.tensors[src])
        t.shape = np.asarray(shape, dtype=np.int32)
        t.shapeSignature = None
        t.name = name.encode()
        t.buffer = 0
        self.sg.tensors.append(t)
        self.new_tensors += 1
        return len(self.sg.tensors) - 1

    def const(self, values: np.ndarray, tensor_type: int, name: str) -> int:
        values = np.ascontiguousarray(values)
        key = (values.dtype.str, values.shape, values.tobytes(), tensor_type)
        if key in self.consts:
            return self.consts[key]
        buf = ts.BufferT()
        buf.data = np.frombuffer(values.tobytes(), dtype=np.uint8).copy()
        self.model.buffers.append(buf)
        t = ts.TensorT()
        t.shape = np.asarray(values.shape, dtype=np.int32)
        t.type = tensor_type
        t.buffer = len(self.model.buffers) - 1
        t.name = name.encode()
        self.sg.tensors.append(t)
        self.new_tensors += 1
        self.consts[key] = len(self.sg.tensors) - 1
        return self.consts[key]

    def operator(self, name: str, inputs: list[int], outputs: list[int], options_type: int = 0,
                 options: Any = None) -> ts.OperatorT:
        op = ts.OperatorT()
        op.opcodeIndex = self.opcode(name)
        op.inputs = np.asarray(inputs, dtype=np.int32)
        op.outputs = np.asarray(outputs, dtype=np.int32)
        op.builtinOptionsType = options_type
        op.builtinOptions = options
        return op


def rewrite_builtin(data: bytes, graph: ir.Graph, schedule: PatchSchedule, where: str = "model",
                    border: str = "strips") -> RewriteResult:
    """Unroll ``schedule``'s patch stage of the .tflite ``data`` (which ``graph`` was lowered from).

    ``border``: how patches at the feature-map border get their zero padding: "pad" (PAD the patch buffer) or
    "strips" (strided ops: VALID on the buffer plus small padded border strips, see ``_emit_strips``)."""
    if border not in ("pad", "strips"):
        raise RewriteError(f"border={border!r}: expected 'pad' or 'strips'")
    if graph.source != "tflite":
        raise RewriteError(f"{where}: the rewriter needs a graph lowered from the .tflite itself")
    flat, members = split_appended_zip(data)
    model = ts.load_model(flat, where)
    w = _Writer(model)
    sg = w.sg
    original_ops = list(sg.operators or [])
    sg.tensors = list(sg.tensors or [])
    model.buffers = list(model.buffers or [])
    model.operatorCodes = list(model.operatorCodes or [])

    # IR tensor name -> TFLite tensor index, through each op's activation operands (same order as the IR's).
    index: dict[str, int] = {}
    for op in graph.ops:
        t_op = original_ops[op.src_index]
        act_in = [t for t in t_op.inputs if t >= 0 and not ts.is_constant(model, sg.tensors[t])]
        act_out = [t for t in t_op.outputs if t >= 0]
        index.update(zip(op.inputs, act_in))
        index.update(zip(op.outputs, act_out))

    if max(schedule.grid) > MAX_CONCAT_INPUTS:
        raise RewriteError(f"{where}: {schedule.grid[0]}x{schedule.grid[1]} patches: TFLM concatenates at most "
                           f"{MAX_CONCAT_INPUTS} tensors, use at most {MAX_CONCAT_INPUTS} patches per side")
    stage_src = {graph.ops[k].src_index for k in schedule.stage}
    for k in schedule.stage:
        _check_supported(model, original_ops, graph, k)
    new_ops: list[ts.OperatorT] = []
    row_tiles: dict[str, list[list[int]]] = {t: [] for t in schedule.stage_outputs}
    for i in range(schedule.grid[0]):
        tiles: dict[str, list[int]] = {t: [] for t in schedule.stage_outputs}
        for j in range(schedule.grid[1]):
            new_ops += _emit_patch(w, graph, schedule, original_ops, index, (i, j), tiles, border)
        for t in schedule.stage_outputs:
            if schedule.grid[0] == 1:  # one row: its concatenation is the stage output
                _concat(w, new_ops, tiles[t], axis=2, like=index[t], out=index[t])
            else:
                row_tiles[t].append(_concat(w, new_ops, tiles[t], axis=2, like=index[t],
                                            name=f"tfmcu_row{i}"))
    if schedule.grid[0] > 1:
        for t in schedule.stage_outputs:
            _concat(w, new_ops, row_tiles[t], axis=1, like=index[t], out=index[t])
    rest = [op for k, op in enumerate(original_ops) if k not in stage_src]
    sg.operators = new_ops + rest
    _drop_unused_tensors(model)
    record = _schedule_record(schedule)
    _set_metadata(model, SCHEDULE_METADATA, json.dumps(record).encode())
    out = append_zip(ts.write_model(model), members)
    return RewriteResult(out, len(original_ops), len(sg.operators), w.new_tensors, record)


def _check_supported(model: ts.ModelT, ops: list[ts.OperatorT], graph: ir.Graph, k: int) -> None:
    op = graph.ops[k]
    name = ts.op_name(model, ops[op.src_index])
    if name not in _WINDOW_TFLITE_OPS + _POINTWISE_TFLITE_OPS + ("PAD", "PADV2"):
        raise RewriteError(f"op {op.src_index} ({name}) is not supported in a patch stage")
    if name == "DEPTHWISE_CONV_2D" and int(getattr(ops[op.src_index].builtinOptions, "depthMultiplier", 1)) > 1 \
            and op.in_channels != op.out_channels:
        raise RewriteError(f"op {op.src_index} (DEPTHWISE_CONV_2D) has depth multiplier > 1; supported: 1")


def _emit_patch(w: _Writer, graph: ir.Graph, s: PatchSchedule, original_ops: list[ts.OperatorT],
                index: dict[str, int], patch: tuple[int, int], tiles: dict[str, list[int]],
                border: str) -> list[ts.OperatorT]:
    model, sg = w.model, w.sg
    rows, cols = s.rows[patch[0]], s.cols[patch[1]]
    tag = f"tfmcu/p{patch[0]}_{patch[1]}"
    ops: list[ts.OperatorT] = []
    held: dict[str, tuple[int, tuple[int, int], tuple[int, int]]] = {}  # IR tensor -> (tflite idx, rows, cols)

    def box_shape(t: str, r: tuple[int, int], c: tuple[int, int]) -> tuple[int, ...]:
        shape = graph.tensors[t].shape
        return (shape[0], r[1] - r[0], c[1] - c[0], shape[3])

    for t in s.stage_inputs:
        r, c = rows.need[t], cols.need[t]
        full = graph.tensors[t].shape
        if (r, c) == ((0, full[1]), (0, full[2])):
            held[t] = (index[t], r, c)
            continue
        held[t] = (_slice(w, ops, index[t], (r[0], c[0]), box_shape(t, r, c), f"{tag}/in"), r, c)

    for k in s.stage:
        op = graph.ops[k]
        t_op = original_ops[op.src_index]
        name = ts.op_name(model, t_op)
        reg = s.region(k, patch)
        out_t = op.outputs[0]
        out_shape = box_shape(out_t, *reg.out)
        if border == "strips" and name in _STRIP_OPS and _is_big(graph, s, op, reg, patch):
            strips = _strip_plan(graph, op, held[op.inputs[0]][1:], reg)
            if strips is not None:
                out_idx = _emit_strips(w, ops, t_op, held[op.inputs[0]], strips, index[out_t], out_shape,
                                       f"{tag}/{k}", min_value=(name == "MAX_POOL_2D"))
                held[out_t] = (out_idx, *reg.out)
                if out_t in tiles:
                    tiles[out_t].append(out_idx)
                continue
        act_inputs = []
        for t, (rr, cc, pads) in zip(op.inputs, reg.reads):
            src, hr, hc = held[t]
            if (rr, cc) != (hr, hc):
                src = _slice(w, ops, src, (rr[0] - hr[0], cc[0] - hc[0]), box_shape(t, rr, cc),
                             f"{tag}/{k}/slice")
            if any(pads) and name == "AVERAGE_POOL_2D":
                raise RewriteError(f"op {op.src_index} (AVERAGE_POOL_2D) needs border padding in this patch; "
                                   f"TFLite averages over valid pixels only, which a padded patch cannot "
                                   f"reproduce: end the stage before it or use VALID pooling")
            if any(pads) and name not in ("PAD", "PADV2"):
                src = _pad(w, ops, src, pads, f"{tag}/{k}/pad",
                           min_value=(name == "MAX_POOL_2D"))
            act_inputs.append((src, pads))
        out_idx = w.tensor_like(index[out_t], out_shape, f"{tag}/{k}")
        if name in ("PAD", "PADV2"):
            # The original PAD only adds the border: reproduce it where this patch touches the border.
            src, pads = act_inputs[0]
            if any(pads):
                _pad(w, ops, src, pads, "", out=out_idx, min_value=False,
                     value_tensor=(int(t_op.inputs[2]) if name == "PADV2" and len(t_op.inputs) > 2 else None))
            else:
                out_idx = src
        else:
            ops.append(_clone(model, t_op, [a[0] for a in act_inputs], out_idx, name in _WINDOW_TFLITE_OPS))
        held[out_t] = (out_idx, *reg.out)
        if out_t in tiles:
            tiles[out_t].append(out_idx)
    return ops


def _clone(model: ts.ModelT, t_op: ts.OperatorT, act_inputs: list[int], out_idx: int, valid: bool) -> ts.OperatorT:
    """A copy of operator ``t_op`` on new activation tensors, reading the same constant tensors."""
    sg = model.subgraphs[0]
    new = copy.deepcopy(t_op)
    it = iter(act_inputs)
    new.inputs = np.asarray([next(it) if (t >= 0 and not ts.is_constant(model, sg.tensors[t])) else t
                             for t in t_op.inputs], dtype=np.int32)
    new.outputs = np.asarray([out_idx], dtype=np.int32)
    if valid:
        new.builtinOptions.padding = ts.Padding.VALID
    return new


# Border strips: instead of padding a whole patch buffer (a copy as large as the op's input), run the op VALID on
# the patch buffer for the outputs whose window lies inside the feature map, and compute the few border rows and
# columns from small padded slices; then concatenate. Pays off for strided ops, whose output is 4x smaller than
# the input the PAD would copy.
_STRIP_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D")
Band = tuple[int, int, bool]  # output start, stop, is core


def _is_big(graph: ir.Graph, s: PatchSchedule, op: ir.Op, reg: Any, patch: tuple[int, int]) -> bool:
    """Whether this op's input patch buffer is among the largest of the patch (>= half the largest), i.e. where
    a PAD copy could set the peak; elsewhere a PAD costs fewer op instances (and less persistent arena)."""
    rows, cols = s.rows[patch[0]], s.cols[patch[1]]

    def nbytes(t: str) -> int:
        r, c = rows.need[t], cols.need[t]
        return (r[1] - r[0]) * (c[1] - c[0]) * graph.tensors[t].shape[3] * graph.tensors[t].itemsize

    biggest = max(nbytes(t) for k in s.stage for t in graph.ops[k].outputs if t not in s.stage_outputs)
    return 2 * nbytes(op.inputs[0]) >= biggest


def _axis_bands(op: ir.Op, axis: int, out: tuple[int, int], held: tuple[int, int], size: int) -> list[Band] | None:
    k, st, d = op.kernel[axis], op.stride[axis], op.dilation[axis]
    eff = (k - 1) * d + 1
    pad = op.padding[2 * axis]
    core = [y for y in range(*out) if y * st - pad >= 0 and y * st - pad + eff <= size]
    if not core or core != list(range(core[0], core[-1] + 1)):
        return None
    y0, y1 = core[0], core[-1] + 1
    # VALID over the whole held buffer must give exactly the core outputs.
    if y0 * st - pad != held[0] or (held[1] - held[0] - eff) // st + 1 != y1 - y0:
        return None
    bands = []
    if out[0] < y0:
        bands.append((out[0], y0, False))
    bands.append((y0, y1, True))
    if y1 < out[1]:
        bands.append((y1, out[1], False))
    return bands


def _strip_plan(graph: ir.Graph, op: ir.Op, held: tuple[tuple[int, int], tuple[int, int]], reg: Any):
    if len(op.inputs) != 1 or not any(reg.reads[0][2]):
        return None
    if max(op.stride) < 2:
        return None  # stride 1: the strips' concatenation copies as much as a PAD would
    h, w_ = graph.tensors[op.inputs[0]].hw
    rows = _axis_bands(op, 0, reg.out[0], held[0], h)
    cols = _axis_bands(op, 1, reg.out[1], held[1], w_)
    if rows is None or cols is None:
        return None
    return op, rows, cols, (h, w_)


def _emit_strips(w: _Writer, ops: list, t_op: ts.OperatorT, held: tuple, plan: Any, like: int,
                 out_shape: tuple[int, ...], tag: str, min_value: bool) -> int:
    op, rows, cols, (h, w_) = plan
    src, hr, hc = held
    channels = int(w.sg.tensors[like].shape[3])
    bands = []
    for bi, (r0, r1, rcore) in enumerate(rows):
        pieces = []
        for ci, (c0, c1, ccore) in enumerate(cols):
            piece_shape = (1, r1 - r0, c1 - c0, channels)
            out = w.tensor_like(like, piece_shape, f"{tag}/s{bi}{ci}")
            if rcore and ccore:
                ops.append(_clone(w.model, t_op, [src], out, True))
            else:
                ra, rb = ir.input_range(op, 0, r0, r1)
                ca, cb = ir.input_range(op, 1, c0, c1)
                cra, crb, cca, ccb = max(ra, 0), min(rb, h), max(ca, 0), min(cb, w_)
                shape = (1, crb - cra, ccb - cca, int(w.sg.tensors[src].shape[3]))
                x = _slice(w, ops, src, (cra - hr[0], cca - hc[0]), shape, f"{tag}/s{bi}{ci}/in")
                pads = (cra - ra, rb - crb, cca - ca, cb - ccb)
                if any(pads):
                    x = _pad(w, ops, x, pads, f"{tag}/s{bi}{ci}/pad", min_value=min_value)
                ops.append(_clone(w.model, t_op, [x], out, True))
            pieces.append(out)
        band_shape = (1, rows[bi][1] - rows[bi][0], out_shape[2], channels)
        bands.append(pieces[0] if len(pieces) == 1 else
                     _concat(w, ops, pieces, axis=2, like=like, name=f"{tag}/b{bi}",
                             out=None if len(rows) > 1 else w.tensor_like(like, band_shape, f"{tag}")))
    if len(bands) == 1:
        return bands[0]
    return _concat(w, ops, bands, axis=1, like=like, out=w.tensor_like(like, out_shape, f"{tag}"))


def _slice(w: _Writer, ops: list, src: int, begin_hw: tuple[int, int], shape: tuple[int, ...], name: str) -> int:
    out = w.tensor_like(src, shape, name)
    begin = w.const(np.asarray([0, begin_hw[0], begin_hw[1], 0], np.int32), ts.TensorType.INT32, "tfmcu/begin")
    size = w.const(np.asarray(shape, np.int32), ts.TensorType.INT32, "tfmcu/size")
    opts = ts.schema.SliceOptionsT()
    ops.append(w.operator("SLICE", [src, begin, size], [out], ts.BuiltinOptions.SliceOptions, opts))
    return out


def _pad(w: _Writer, ops: list, src: int, pads: tuple[int, int, int, int], name: str, out: int | None = None,
         min_value: bool = False, value_tensor: int | None = None) -> int:
    t = w.sg.tensors[src]
    shape = [int(d) for d in t.shape]
    top, bottom, left, right = pads
    if out is None:
        out = w.tensor_like(src, (shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3]), name)
    paddings = w.const(np.asarray([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32), ts.TensorType.INT32,
                       "tfmcu/paddings")
    if min_value or value_tensor is not None:
        if value_tensor is None:
            info = np.iinfo(ts.numpy_dtype(t.type))
            value_tensor = w.const(np.asarray([info.min], ts.numpy_dtype(t.type)), t.type, "tfmcu/pad_min")
            # the constant must carry the input's quantization for TFLite's PADV2 checks
            w.sg.tensors[value_tensor].quantization = copy.deepcopy(t.quantization)
        ops.append(w.operator("PADV2", [src, paddings, value_tensor], [out], ts.BuiltinOptions.PadV2Options,
                              ts.schema.PadV2OptionsT()))
    else:
        ops.append(w.operator("PAD", [src, paddings], [out], ts.BuiltinOptions.PadOptions, ts.schema.PadOptionsT()))
    return out


def _concat(w: _Writer, ops: list, parts: list[int], axis: int, like: int, name: str = "",
            out: int | None = None) -> int:
    if len(parts) == 1 and out is None:
        return parts[0]
    shapes = [[int(d) for d in w.sg.tensors[p].shape] for p in parts]
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    if out is None:
        out = w.tensor_like(like, tuple(shape), name)
    if len(parts) == 1:  # a single part into a given output tensor: copy through a full slice
        begin = w.const(np.zeros(4, np.int32), ts.TensorType.INT32, "tfmcu/begin")
        size = w.const(np.asarray(shape, np.int32), ts.TensorType.INT32, "tfmcu/size")
        ops.append(w.operator("SLICE", [parts[0], begin, size], [out], ts.BuiltinOptions.SliceOptions,
                              ts.schema.SliceOptionsT()))
        return out
    opts = ts.schema.ConcatenationOptionsT()
    opts.axis = axis
    opts.fusedActivationFunction = 0
    ops.append(w.operator("CONCATENATION", parts, [out], ts.BuiltinOptions.ConcatenationOptions, opts))
    return out


def _drop_unused_tensors(model: ts.ModelT) -> None:
    """Remove tensors no operator, input, output or signature uses any more (the stage's full-size
    intermediates), renumbering every reference."""
    sg = model.subgraphs[0]
    used: set[int] = set(int(t) for t in (sg.inputs if sg.inputs is not None else []))
    used |= set(int(t) for t in (sg.outputs if sg.outputs is not None else []))
    for op in sg.operators:
        used |= {int(t) for t in op.inputs if t >= 0} | {int(t) for t in op.outputs if t >= 0}
        if op.intermediates is not None:
            used |= {int(t) for t in op.intermediates if t >= 0}
    for sig in model.signatureDefs or []:
        for tm in list(sig.inputs or []) + list(sig.outputs or []):
            used.add(int(tm.tensorIndex))
    keep = sorted(used)
    remap = {old: new for new, old in enumerate(keep)}
    sg.tensors = [sg.tensors[i] for i in keep]

    def fix(values: Any) -> Any:
        if values is None:
            return None
        return np.asarray([remap[int(t)] if t >= 0 else -1 for t in values], dtype=np.int32)

    sg.inputs, sg.outputs = fix(sg.inputs), fix(sg.outputs)
    for op in sg.operators:
        op.inputs, op.outputs = fix(op.inputs), fix(op.outputs)
        if op.intermediates is not None:
            op.intermediates = fix(op.intermediates)
    for sig in model.signatureDefs or []:
        for tm in list(sig.inputs or []) + list(sig.outputs or []):
            tm.tensorIndex = remap[int(tm.tensorIndex)]
    # Offline memory plans index tensors; they no longer apply to the rewritten graph.
    if model.metadata:
        model.metadata = [m for m in model.metadata if _text(m.name) != "OfflineMemoryAllocation"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value or "")


def _set_metadata(model: ts.ModelT, name: str, payload: bytes) -> None:
    buf = ts.BufferT()
    buf.data = np.frombuffer(payload, dtype=np.uint8).copy()
    model.buffers.append(buf)
    entries = [m for m in (model.metadata or []) if _text(m.name) != name]
    m = ts.schema.MetadataT()
    m.name = name.encode()
    m.buffer = len(model.buffers) - 1
    model.metadata = entries + [m]


def read_schedule(data: bytes | ts.ModelT) -> dict[str, Any] | None:
    """The schedule a rewritten model (bytes or an already loaded model) records in its metadata (None for other
    models)."""
    model = data if isinstance(data, ts.ModelT) else ts.load_model(data)
    for m in model.metadata or []:
        if _text(m.name) == SCHEDULE_METADATA:
            raw = model.buffers[m.buffer].data
            return json.loads(np.asarray(raw, dtype=np.uint8).tobytes().decode())
    return None


def _schedule_record(s: PatchSchedule) -> dict[str, Any]:
    d = s.to_dict()
    d["tool"] = "tfmcu"
    d["mode"] = "builtin"
    d["stage_ops_tflite"] = [s.graph.ops[k].src_index for k in s.stage]
    d["regions"] = {
        s.graph.ops[k].name: [[list(r) for r in s.region(k, p).out] for p in s.patch_iter()] for k in s.stage}
    return d


# ----------------------------------------------------------------------------- choosing a schedule for TFLM
@dataclass
class Evaluated:
    """A candidate schedule rewritten and its TFLM arena predicted (persistent per-op data included)."""

    candidate: Any  # scheduler.Candidate
    result: RewriteResult | None  # None for the unpatched original
    predicted: Any  # tflm_memory.ArenaPrediction
    border: str = "pad"

    def to_dict(self) -> dict[str, Any]:
        d = self.candidate.to_dict()
        d["border"] = self.border if self.result else None
        d["predicted_arena_bytes"] = self.predicted.total
        d["predicted_arena_head_bytes"] = self.predicted.head
        d["predicted_arena_tail_bytes"] = self.predicted.tail
        d["ops"] = self.result.ops_after if self.result else None
        return d


@dataclass
class AutoRewrite:
    chosen: Evaluated | None
    original: Evaluated
    evaluated: list[Evaluated]
    message: str
    skipped: int = 0  # candidates ruled out by the lower bound without rewriting


def evaluate(data: bytes, graph: ir.Graph, candidate: Any, where: str = "model", border: str = "strips") -> Evaluated:
    from tfmcu.lower_tflite import from_tflite
    from tfmcu.tflm_memory import predict_arena

    if candidate.schedule is None:
        return Evaluated(candidate, None, predict_arena(graph, model=data), border)
    result = rewrite_builtin(data, graph, candidate.schedule, where, border=border)
    return Evaluated(candidate, result, predict_arena(from_tflite(result.model), model=result.model), border)


def lower_bound(schedule: PatchSchedule, original_tail: int) -> int:
    """A floor under the TFLM arena of any builtin rewrite of ``schedule``: the planned head holds at least the
    unchanged rest of the net's peak and one patch's whole working set at once, and the persistent tail only
    grows with the extra op instances."""
    return max(schedule.rest_peak_bytes, schedule.patch_peak_bytes) + original_tail


def auto_rewrite(data: bytes, graph: ir.Graph, sram_bytes: int, patch_options: tuple[int, ...] = (1, 2, 3, 4),
                 max_mac_overhead: float | None = None, unit: str = "blocks", where: str = "model",
                 progress: Any = None, rectangular: bool = True,
                 borders: tuple[str, ...] = ("strips", "pad")) -> AutoRewrite:
    """The least-MACs schedule whose rewritten model's predicted TFLM arena fits ``sram_bytes`` and is smaller
    than the original's. Candidates are tried in order of MACs, so the first that fits is the answer; a candidate
    whose lower bound (the unchanged rest of the net's analytic peak + the original's persistent arena) already
    exceeds the budget (``lower_bound``) is skipped without rewriting."""
    from tfmcu import scheduler

    cands = scheduler.candidates(graph, patch_options, unit, rectangular=rectangular)
    original = evaluate(data, graph, cands[0], where)
    if original.predicted.total <= sram_bytes:
        return AutoRewrite(None, original, [original],
                           f"the original model already fits {sram_bytes / 1024:.1f} kB (predicted TFLM arena "
                           f"{original.predicted.total / 1024:.1f} kB): no patching needed")
    floor = original.predicted.tail
    todo = [(c, b) for c in cands[1:] for b in borders
            if max_mac_overhead is None or c.mac_overhead <= max_mac_overhead + 1e-12]
    feasible = [(c, b) for c, b in todo if lower_bound(c.schedule, floor) <= sram_bytes]
    feasible.sort(key=lambda cb: (cb[0].macs, cb[0].patches[0] * cb[0].patches[1], borders.index(cb[1])))
    evaluated = [original]
    for n, (cand, border) in enumerate(feasible):
        if progress:
            progress(n + 1, len(feasible), f"{scheduler.describe_choice(cand)} ({border})")
        try:
            ev = evaluate(data, graph, cand, where, border)
        except RewriteError:
            continue
        evaluated.append(ev)
        if ev.predicted.total <= sram_bytes and ev.predicted.total < original.predicted.total:
            return AutoRewrite(ev, original, evaluated,
                               f"fits {sram_bytes / 1024:.1f} kB: {scheduler.describe_choice(cand)} ({border} "
                               f"borders), predicted TFLM arena {ev.predicted.total / 1024:.1f} kB (original "
                               f"{original.predicted.total / 1024:.1f} kB), MACs +{cand.mac_overhead * 100:.1f}%",
                               skipped=len(todo) - len(feasible))
    cap = "" if max_mac_overhead is None else f" with MAC overhead <= {max_mac_overhead * 100:.0f}%"
    tried = evaluated[1:] or evaluated
    best = min(tried, key=lambda e: e.predicted.total)
    lower = min((lower_bound(c.schedule, floor) for c, _ in todo), default=original.predicted.total)
    return AutoRewrite(None, original, evaluated,
                       f"no schedule fits {sram_bytes / 1024:.1f} kB{cap}; smallest achievable predicted TFLM arena "
                       f"is {min(best.predicted.total, original.predicted.total) / 1024:.1f} kB"
                       + (f" with {scheduler.describe_choice(best.candidate)}" if best.result else " (no patching)")
                       + (f" ({len(tried)} schedules tried; the others need at least {lower / 1024:.1f} kB)"
                          if len(todo) > len(tried) else ""),
                       skipped=len(todo) - len(feasible))


def smallest_arena(data: bytes, graph: ir.Graph, patch_options: tuple[int, ...] = (1, 2, 3, 4),
                   max_mac_overhead: float | None = None, unit: str = "blocks", where: str = "model",
                   progress: Any = None, rectangular: bool = True,
                   borders: tuple[str, ...] = ("strips", "pad")) -> AutoRewrite:
    """The schedule with the smallest predicted TFLM arena (branch and bound on ``lower_bound``)."""
    from tfmcu import scheduler

    cands = scheduler.candidates(graph, patch_options, unit, rectangular=rectangular)
    original = evaluate(data, graph, cands[0], where)
    floor = original.predicted.tail
    todo = sorted(((lower_bound(c.schedule, floor), c, b) for c in cands[1:] for b in borders
                   if max_mac_overhead is None or c.mac_overhead <= max_mac_overhead + 1e-12),
                  key=lambda x: (x[0], x[1].macs))
    best, evaluated = original, [original]
    for n, (bound, cand, border) in enumerate(todo):
        if bound >= best.predicted.total:
            break
        if progress:
            progress(n + 1, len(todo), f"{scheduler.describe_choice(cand)} ({border})")
        try:
            ev = evaluate(data, graph, cand, where, border)
        except RewriteError:
            continue
        evaluated.append(ev)
        if ev.predicted.total < best.predicted.total:
            best = ev
    if best is original:
        return AutoRewrite(None, original, evaluated, "no schedule has a smaller predicted TFLM arena than the "
                                                      "original model: no patching")
    return AutoRewrite(best, original, evaluated,
                       f"smallest predicted TFLM arena: {scheduler.describe_choice(best.candidate)} ({best.border} "
                       f"borders), {best.predicted.total / 1024:.1f} kB (original "
                       f"{original.predicted.total / 1024:.1f} kB), MACs +{best.candidate.mac_overhead * 100:.1f}% "
                       f"({len(evaluated) - 1} of {len(todo)} schedules rewritten, the rest bounded out)")
