"""Rewrite any int8 .tflite so its patch stage runs patch by patch in ordinary TFLite builtin ops.

For every patch of a ``tfmcu.plan.regions.PatchSchedule`` the stage is unrolled into:

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
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfmcu.graph import ir
from tfmcu.plan.arena import predict_arena, predict_model_arena
from tfmcu.plan.regions import PatchSchedule
from tfmcu.plan.search import Evaluation, Plan
from tfmcu.stage.common import SCHEDULE_METADATA, RewriteError, RewriteResult, schedule_record
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import ModelEditor
from tfmcu.tflite.model import TfliteModel, as_model

MAX_CONCAT_INPUTS = 10  # TFLM's CONCATENATION kernel takes at most 10 inputs
BORDERS = ("strips", "pad")
_WINDOW_TFLITE_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D")
_POINTWISE_TFLITE_OPS = ("ADD", "SUB", "MUL", "QUANTIZE", "DEQUANTIZE", "RELU", "RELU6", "LOGISTIC", "TANH",
                         "HARD_SWISH", "LEAKY_RELU", "CONCATENATION")


def rewrite_builtin(data: bytes | TfliteModel, graph: ir.Graph, schedule: PatchSchedule, where: str = "model",
                    border: str = "strips") -> RewriteResult:
    """Unroll ``schedule``'s patch stage of the .tflite ``data`` (bytes, or the model parsed once,
    ``tfmcu.tflite.model``; ``graph`` was lowered from it). The model is decided, written when its bytes are asked
    for (``RewriteResult.model``).

    ``border``: how patches at the feature-map border get their zero padding: "pad" (PAD the patch buffer) or
    "strips" (strided ops: VALID on the buffer plus small padded border strips, see ``_emit_strips``)."""
    if border not in ("pad", "strips"):
        raise RewriteError(f"border={border!r}: expected 'pad' or 'strips'")
    if graph.source != "tflite":
        raise RewriteError(f"{where}: the rewriter needs a graph lowered from the .tflite itself")
    w = ModelEditor(as_model(data, where), where)
    model, sg = w.model, w.subgraph
    original_ops = list(sg.operators)

    # IR tensor name -> TFLite tensor index, through each op's activation operands (same order as the IR's).
    index: dict[str, int] = {}
    for op in graph.ops:
        t_op = original_ops[op.src_index]
        act_in = [t for t in t_op.inputs if t >= 0 and not ts.is_constant(model, sg.tensors[t])]
        act_out = [t for t in t_op.outputs if t >= 0]
        index.update(zip(op.inputs, act_in))
        index.update(zip(op.outputs, act_out))

    if schedule.pool is not None:
        raise RewriteError(f"{where}: {graph.ops[schedule.pool].describe(schedule.pool)} ends the patch stage: builtin "
                           f"ops cannot sum a global pool patch by patch (--mode=custom can)")
    if schedule.passes.count > 1:
        r = schedule.passes.inner[0]
        raise RewriteError(f"{where}: {graph.ops[r].describe(r)} (a squeeze-excite) is inside the patch stage: builtin "
                           f"ops cannot sum it patch by patch before the rest of the stage runs (--mode=custom can)")
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
    w.drop_unused_tensors()
    record = schedule_record(schedule, "builtin")
    w.set_metadata(SCHEDULE_METADATA, json.dumps(record).encode())
    return RewriteResult(w.decided(where), len(original_ops), len(sg.operators), w.new_tensors, record)


def _check_supported(model: ts.ModelT, ops: list[ts.OperatorT], graph: ir.Graph, k: int) -> None:
    op = graph.ops[k]
    name = ts.op_name(model, ops[op.src_index])
    if name not in _WINDOW_TFLITE_OPS + _POINTWISE_TFLITE_OPS + ("PAD", "PADV2"):
        raise RewriteError(f"op {op.src_index} ({name}) is not supported in a patch stage")
    if name == "DEPTHWISE_CONV_2D" and int(getattr(ops[op.src_index].builtinOptions, "depthMultiplier", 1)) > 1 \
            and op.in_channels != op.out_channels:
        raise RewriteError(f"op {op.src_index} (DEPTHWISE_CONV_2D) has depth multiplier > 1; supported: 1")


def _emit_patch(w: ModelEditor, graph: ir.Graph, s: PatchSchedule, original_ops: list[ts.OperatorT],
                index: dict[str, int], patch: tuple[int, int], tiles: dict[str, list[int]],
                border: str) -> list[ts.OperatorT]:
    model = w.model
    rows, cols = s.rows[patch[0]], s.cols[patch[1]]
    tag = f"tfmcu/p{patch[0]}_{patch[1]}"
    ops: list[ts.OperatorT] = []
    held: dict[str, tuple[int, tuple[int, int], tuple[int, int]]] = {}  # IR tensor -> (tflite idx, rows, cols)

    def box_shape(t: str, r: tuple[int, int], c: tuple[int, int]) -> tuple[int, ...]:
        shape = graph.tensors[t].shape
        return (shape[0], r[1] - r[0], c[1] - c[0], shape[3])

    def tile(t: str, idx: int, region: tuple[tuple[int, int], tuple[int, int]]) -> int:
        """This patch's tile of stage output ``t``: the computed region itself, or the tile cut out of it when an op
        of the stage also reads ``t`` and so needed a larger region (its halo)."""
        band = (rows.band, cols.band)
        if region == band:
            return idx
        return _slice(w, ops, idx, (band[0][0] - region[0][0], band[1][0] - region[1][0]), box_shape(t, *band),
                      f"{tag}/tile")

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
                    tiles[out_t].append(tile(out_t, out_idx, reg.out))
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
            tiles[out_t].append(tile(out_t, out_idx, reg.out))
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

    # (a stage whose every tensor leaves it has no patch-only buffer: its input window is the largest one)
    biggest = max((nbytes(t) for k in s.stage for t in graph.ops[k].outputs if t not in s.stage_outputs), default=0)
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


def _emit_strips(w: ModelEditor, ops: list, t_op: ts.OperatorT, held: tuple, plan: Any, like: int,
                 out_shape: tuple[int, ...], tag: str, min_value: bool) -> int:
    op, rows, cols, (h, w_) = plan
    src, hr, hc = held
    channels = int(w.subgraph.tensors[like].shape[3])
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
                shape = (1, crb - cra, ccb - cca, int(w.subgraph.tensors[src].shape[3]))
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


def _slice(w: ModelEditor, ops: list, src: int, begin_hw: tuple[int, int], shape: tuple[int, ...], name: str) -> int:
    out = w.tensor_like(src, shape, name)
    begin = w.constant(np.asarray([0, begin_hw[0], begin_hw[1], 0], np.int32), ts.TensorType.INT32, "tfmcu/begin")
    size = w.constant(np.asarray(shape, np.int32), ts.TensorType.INT32, "tfmcu/size")
    opts = ts.schema.SliceOptionsT()
    ops.append(w.builtin_operator("SLICE", [src, begin, size], [out], ts.BuiltinOptions.SliceOptions, opts))
    return out


def _pad(w: ModelEditor, ops: list, src: int, pads: tuple[int, int, int, int], name: str, out: int | None = None,
         min_value: bool = False, value_tensor: int | None = None) -> int:
    t = w.subgraph.tensors[src]
    shape = [int(d) for d in t.shape]
    top, bottom, left, right = pads
    if out is None:
        out = w.tensor_like(src, (shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3]), name)
    paddings = w.constant(np.asarray([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32), ts.TensorType.INT32,
                       "tfmcu/paddings")
    if min_value or value_tensor is not None:
        if value_tensor is None:
            info = np.iinfo(ts.numpy_dtype(t.type))
            value_tensor = w.constant(np.asarray([info.min], ts.numpy_dtype(t.type)), t.type, "tfmcu/pad_min")
            # the constant must carry the input's quantization for TFLite's PADV2 checks
            w.subgraph.tensors[value_tensor].quantization = copy.deepcopy(t.quantization)
        ops.append(w.builtin_operator("PADV2", [src, paddings, value_tensor], [out], ts.BuiltinOptions.PadV2Options,
                              ts.schema.PadV2OptionsT()))
    else:
        ops.append(w.builtin_operator("PAD", [src, paddings], [out], ts.BuiltinOptions.PadOptions,
                                      ts.schema.PadOptionsT()))
    return out


def _concat(w: ModelEditor, ops: list, parts: list[int], axis: int, like: int, name: str = "",
            out: int | None = None) -> int:
    if len(parts) == 1 and out is None:
        return parts[0]
    shapes = [[int(d) for d in w.subgraph.tensors[p].shape] for p in parts]
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    if out is None:
        out = w.tensor_like(like, tuple(shape), name)
    if len(parts) == 1:  # a single part into a given output tensor: copy through a full slice
        begin = w.constant(np.zeros(4, np.int32), ts.TensorType.INT32, "tfmcu/begin")
        size = w.constant(np.asarray(shape, np.int32), ts.TensorType.INT32, "tfmcu/size")
        ops.append(w.builtin_operator("SLICE", [parts[0], begin, size], [out], ts.BuiltinOptions.SliceOptions,
                              ts.schema.SliceOptionsT()))
        return out
    opts = ts.schema.ConcatenationOptionsT()
    opts.axis = axis
    opts.fusedActivationFunction = 0
    ops.append(w.builtin_operator("CONCATENATION", parts, [out], ts.BuiltinOptions.ConcatenationOptions, opts))
    return out


# ----------------------------------------------------------------------------- the search's cost function
def lower_bound(schedule: PatchSchedule, original_tail: int, count_input: bool = True) -> int:
    """A floor under the TFLM arena of any builtin rewrite of ``schedule``: the planned head holds at least the
    unchanged rest of the net's peak and (with the input image counted) one patch's whole working set at once,
    and the persistent tail only grows with the extra op instances."""
    if count_input:
        return max(schedule.rest_peak_bytes, schedule.patch_peak_bytes) + original_tail
    return max(schedule.rest_peak_bytes_excluding_input,
               sum(schedule.graph.tensors[t].nbytes for t in schedule.stage_outputs)) + original_tail


@dataclass(frozen=True)
class Border:
    """A border treatment of the builtin rewrite (``BORDERS``): a variant of ``BuiltinArenaCost``."""

    label: str  # "strips" or "pad" (``rewrite_builtin``'s ``border``)

    def phrase(self, plan: Plan) -> str:
        return f" ({self.label} borders)"


class BuiltinArenaCost:
    """Cost function of ``tfmcu.plan.search``: the predicted TFLM arena (``tfmcu.plan.arena``, exact for these
    models) of the builtin rewrite, one variant per border treatment. It rewrites plans of one patch stage at the
    first op (and the per-layer plan, unchanged); any other plan is a one-line ``RewriteError``."""

    what = "predicted TFLM arena"

    def __init__(self, data: bytes, graph: ir.Graph, where: str = "model", borders: tuple[str, ...] = BORDERS,
                 count_input: bool = True):
        self.data, self.graph, self.where, self.count_input = data, graph, where, count_input
        self.variants = tuple(Border(b) for b in borders)
        self.original = predict_arena(graph, model=data)
        self.source = as_model(data, where)  # parsed once; each rewrite edits a structural copy

    def evaluate(self, candidate: Plan, variant: Border | None) -> Evaluation:
        border = variant.label if variant is not None else BORDERS[0]
        if not _rewritable(candidate):
            raise RewriteError(f"{self.where}: builtin mode rewrites one patch stage; several stages need "
                               f"--mode=custom")
        if not candidate.patched:
            result = None
            p = predict_arena(self.graph, model=self.source, count_input=self.count_input)
        else:  # the rewritten model as decided (what its file would predict); written only if asked for
            result = rewrite_builtin(self.source, self.graph, candidate.schedules()[0], self.where, border=border)
            p = predict_model_arena(result.decided, count_input=self.count_input)
        details = {"border": None if variant is None else border, "predicted_arena_bytes": p.total,
                   "predicted_arena_head_bytes": p.head, "predicted_arena_tail_bytes": p.tail,
                   "ops": result.ops_after if result else None}
        return Evaluation(candidate, variant, p.total, result, details)

    def lower_bound(self, candidate: Plan, variant: Border | None) -> int:
        if not candidate.patched or not _rewritable(candidate):  # (evaluate refuses the other plans)
            return 0
        return lower_bound(candidate.schedules()[0], self.original.tail, self.count_input)


def _rewritable(plan: Plan) -> bool:
    """What the builtin rewrite takes: the per-layer plan, or one patch stage at the first op."""
    stages = plan.stages
    return not stages or (len(stages) == 1 and stages[0].start == 0)
