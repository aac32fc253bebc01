"""Custom mode: the patch stage as ONE TFLite CUSTOM operator, ``TFMCU_PATCH_STAGE``, run by our C kernels.

The custom op's inputs are the stage input, then every layer's constant arrays: the ORIGINAL filter and bias
tensors (no Flash duplication) and the per-channel output multipliers / shifts computed offline (small new int32
constants, so the stage needs no persistent arena). Its flexbuffer custom options describe the stage exactly as
``tflm_patch_kernels/patch_stage.h`` wants it (tensor table, layers with scalar params and the input positions of
their arrays, per-band spans, scratch offsets, scratch size). The rest of the graph is untouched.

* ``rewrite_custom(data, graph, schedule)``: the custom-mode model (``inplace``: the rest of the graph gets an
  in-place offline memory plan, ``tfmcu.plan.memory_plan``).
* ``load_custom(data)``: the op's description back as a ``PackedStage`` plus ``rest``, the model without the stage
  (its input is the stage output), with the offline memory plan a single-arena deployment would use.
* ``memory_report(data)``: custom mode's memory, ESTIMATED by formula until a TFLM kernel for the op exists: the
  rest of the graph's TFLM arena (predicted, or measured by a given function) + the C kernels' scratch + input.
* ``CustomArenaCost``: that estimate as a cost function of ``tfmcu.plan.search``.

``tfmcu.runtime.host.HostRunner`` executes such a model on the host (C kernels for the stage, TFLM or TF Lite for the
rest).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from flatbuffers import flexbuffers

from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.ops import FLOAT32, LayerSpec
from tfmcu.kernels.pack import PackedStage, pack_stage
from tfmcu.plan.arena import ABI, predict_arena
from tfmcu.plan.memory_plan import with_offline_plan
from tfmcu.plan.regions import PatchSchedule
from tfmcu.plan.search import Candidate, Evaluation
from tfmcu.stage.common import SCHEDULE_METADATA, RewriteError, RewriteResult, read_schedule, schedule_record
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import ModelEditor, load

PATCH_STAGE_OP = "TFMCU_PATCH_STAGE"
FORMAT_VERSION = 1
_ARRAYS = ("filter", "bias", "output_multiplier", "output_shift")
ESTIMATE = ("estimated: single-arena peak of a TFLM kernel for TFMCU_PATCH_STAGE, which does not exist yet = "
            "max(input + stage output + scratch, planned head of the rest) + the rest's persistent bytes + the "
            "custom op's tensor and node records")


def is_custom_model(data: bytes | ts.ModelT) -> bool:
    model = data if isinstance(data, ts.ModelT) else load(data)
    return any(ts.op_name(model, op) == f"custom:{PATCH_STAGE_OP}" for op in model.subgraphs[0].operators or [])


# ----------------------------------------------------------------------------- writing
def rewrite_custom(data: bytes, graph: ir.Graph, schedule: PatchSchedule, where: str = "model",
                   inplace: bool = False) -> RewriteResult:
    """Replace ``schedule``'s stage of the .tflite ``data`` by one TFMCU_PATCH_STAGE operator. ``inplace``: the
    rest of the graph gets an in-place memory plan (``tfmcu.plan.memory_plan``; valid for TFLM's reference
    kernels), recorded in the schedule metadata."""
    try:
        packed = pack_stage(data, graph, schedule)
    except PatchKernelError as e:
        raise RewriteError(f"{where}: {e}") from None
    ed = ModelEditor(data, where)
    original_ops = list(ed.subgraph.operators)
    stage_src = [graph.ops[k].src_index for k in schedule.stage]
    if sorted(stage_src) != list(range(len(stage_src))):
        raise RewriteError(f"{where}: the patch stage must be the model's first operators")

    inputs = [packed.tensor_tflite_index[packed.input_tensor]]
    layers = []
    for spec, k in zip(packed.layers, schedule.stage):
        t_in = [int(t) for t in original_ops[graph.ops[k].src_index].inputs]
        positions = {}
        for name in _ARRAYS:
            a = spec.arrays.get(name)
            if a is None:
                continue
            if name == "filter":
                idx = t_in[1]
            elif name == "bias":
                idx = t_in[2]
            else:
                idx = ed.constant(np.ascontiguousarray(a, dtype=np.int32), ts.TensorType.INT32, f"tfmcu/{name}")
            positions[name] = len(inputs)
            inputs.append(idx)
        layers.append({"type": int(spec.type), "name": spec.name, "src": int(spec.src_index),
                       "params": {k: (float(v) if isinstance(v, float) else int(v)) for k, v in spec.params.items()},
                       "padding": [int(p) for p in spec.padding], "arrays": positions})
    desc = {
        "version": FORMAT_VERSION,
        "name": packed.name,
        "grid": [int(g) for g in packed.grid],
        "tensors": [[*map(int, shp), int(dt), int(prod)] for shp, dt, prod in
                    zip(packed.tensor_shapes, packed.tensor_dtypes, packed.tensor_producers)],
        "input_tensor": int(packed.input_tensor),
        "output_tensor": int(packed.output_tensor),
        "layers": layers,
        "layer_inputs": [[int(t) for t in ins] for ins in packed.layer_inputs],
        "layer_outputs": [int(t) for t in packed.layer_outputs],
        "row_spans": packed.row_spans.reshape(-1).tolist(),
        "col_spans": packed.col_spans.reshape(-1).tolist(),
        "buffer_offsets": packed.buffer_offsets.reshape(-1).tolist(),
        "scratch_bytes": int(packed.scratch_bytes),
    }
    op = ed.custom_operator(PATCH_STAGE_OP, inputs, [packed.tensor_tflite_index[packed.output_tensor]],
                            bytes(flexbuffers.Dumps(desc)))
    ed.subgraph.operators = [op] + [o for k, o in enumerate(original_ops) if k not in set(stage_src)]
    ed.drop_unused_tensors()
    record = schedule_record(schedule, "custom", scratch_bytes=int(packed.scratch_bytes),
                             memory_plan="inplace" if inplace else "disjoint")
    ed.set_metadata(SCHEDULE_METADATA, json.dumps(record).encode())
    return RewriteResult(ed.to_bytes(), len(original_ops), len(ed.subgraph.operators), ed.new_tensors, record)


# ----------------------------------------------------------------------------- reading
@dataclass
class CustomModel:
    packed: PackedStage
    rest: bytes  # the model without the stage; its input is the stage output
    input_index: int  # TFLite tensor index of the model input read by the stage
    num_tensors: int  # tensors of the custom-mode model
    rest_num_tensors: int


def load_custom(data: bytes, where: str = "model") -> CustomModel:
    """The TFMCU_PATCH_STAGE description of a custom-mode model and the rest of its graph (``RewriteError`` with one
    line for anything that is not a well-formed custom-mode model)."""
    model = load(data, where)
    sg = model.subgraphs[0]
    ops = list(sg.operators or [])
    found = [k for k, op in enumerate(ops) if ts.op_name(model, op) == f"custom:{PATCH_STAGE_OP}"]
    if len(found) != 1 or found[0] != 0:
        raise RewriteError(f"{where}: expected one {PATCH_STAGE_OP} operator as the first operator")
    op = ops[0]
    try:
        desc = flexbuffers.Loads(np.asarray(op.customOptions, dtype=np.uint8).tobytes())
        if not isinstance(desc, dict):
            raise ValueError("not a map")
    except Exception as e:  # flexbuffers raises assorted errors on garbage
        raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} options ({type(e).__name__}: {e})") from None
    if desc.get("version") != FORMAT_VERSION:
        raise RewriteError(f"{where}: {PATCH_STAGE_OP} options version {desc.get('version')}; "
                           f"this tfmcu reads version {FORMAT_VERSION}")
    try:
        packed = _packed_from_options(model, op, desc, where)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        if isinstance(e, RewriteError):
            raise
        raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} options ({type(e).__name__}: {e})") from None
    record = read_schedule(model) or {}
    rest, rest_tensors = rest_model(model, int(op.outputs[0]), inplace=record.get("memory_plan") == "inplace")
    return CustomModel(packed, rest, int(op.inputs[0]), len(sg.tensors), rest_tensors)


def _packed_from_options(model: ts.ModelT, op: ts.OperatorT, desc: dict[str, Any], where: str) -> PackedStage:
    sg = model.subgraphs[0]
    ins = [int(t) for t in op.inputs]

    def const(pos: int) -> np.ndarray:
        arr = ts.buffer_array(model, sg.tensors[ins[pos]])
        if arr is None:
            raise RewriteError(f"{where}: {PATCH_STAGE_OP} input {pos} has no constant data")
        return np.ascontiguousarray(arr)

    layers = []
    for layer in desc["layers"]:
        arrays: dict[str, np.ndarray | None] = {name: None for name in _ARRAYS}
        for name, pos in layer["arrays"].items():
            a = const(int(pos))
            arrays[name] = a.astype(np.int8) if name == "filter" else a.astype(np.int32).reshape(-1)
        layers.append(LayerSpec(int(layer["type"]), dict(layer["params"]), arrays, layer["name"], int(layer["src"]),
                                tuple(layer["padding"])))
    tensors = desc["tensors"]
    grid = tuple(desc["grid"])
    n_layers = len(layers)
    offsets = np.asarray(desc["buffer_offsets"], np.int32).reshape(grid[0] * grid[1], len(tensors))
    return PackedStage(
        name=desc["name"], layers=layers, layer_inputs=[list(x) for x in desc["layer_inputs"]],
        layer_outputs=list(desc["layer_outputs"]), tensor_names=[f"t{k}" for k in range(len(tensors))],
        tensor_shapes=[tuple(t[:3]) for t in tensors], tensor_dtypes=[t[3] for t in tensors],
        tensor_producers=[t[4] for t in tensors], tensor_tflite_index=[-1] * len(tensors),
        input_tensor=int(desc["input_tensor"]), output_tensor=int(desc["output_tensor"]), grid=grid,
        row_spans=np.asarray(desc["row_spans"], np.int32).reshape(grid[0], n_layers, -1),
        col_spans=np.asarray(desc["col_spans"], np.int32).reshape(grid[1], n_layers, -1),
        buffer_offsets=offsets, buffer_sizes=np.zeros_like(offsets, dtype=np.int64),
        scratch_bytes=int(desc["scratch_bytes"]), lower_bound_bytes=0, plan_strategies=[])


def rest_model(model: ts.ModelT, stage_output: int, inplace: bool = False) -> tuple[bytes, int]:
    """The model without its stage (input: the stage output), with an offline memory plan when one beats TFLM's
    greedy planner (``tfmcu.plan.memory_plan``, in-place if ``inplace``): that is the head a single-arena deployment
    plans for the rest. Returns (model bytes, its tensor count)."""
    ed = ModelEditor(copy.deepcopy(model))
    sg = ed.subgraph
    sg.operators = list(sg.operators[1:])
    if not sg.operators:
        raise RewriteError("the model is all patch stage: nothing left for TFLM to run")
    sg.inputs = np.asarray([stage_output], dtype=np.int32)
    ed.model.signatureDefs = []
    ed.remove_metadata(SCHEDULE_METADATA)
    ed.drop_unused_tensors()
    planned, _, _ = with_offline_plan(ed.to_bytes(), inplace=inplace)
    return planned, len(sg.tensors)


# ----------------------------------------------------------------------------- memory
def memory_report(data: bytes, where: str = "model",
                  measure: Callable[[bytes], Any] | None = None) -> dict[str, Any]:
    """Custom-mode memory, two ways, each with and without the input image (ESTIMATES: no TFLM kernel runs the op
    yet):

    (a) as run here: the rest of the graph's TFLM arena (its input = the stage output) + the C kernels' scratch +
        the input image;
    (b) the single-arena peak a TFLM kernel would have, where scratch is reused by later tensors:
        max(input + stage output + scratch, planned head of the rest) + persistent bytes (the rest's tail + the
        TfLiteEvalTensor records of the custom model's extra tensors + one NodeAndRegistration).
    The rest's arena is predicted (``tfmcu.plan.arena``), or measured by ``measure`` (e.g.
    ``tfmcu.runtime.tflm.measure_arena``: a function of the rest's bytes returning head / tail / total)."""
    cm = load_custom(data, where)
    p = cm.packed
    if measure is not None:
        rest = measure(cm.rest)
    else:
        rest = predict_arena(from_tflite(cm.rest), model=cm.rest)
    in_shape = p.tensor_shapes[p.input_tensor]
    in_bytes = int(np.prod(in_shape)) * (4 if p.tensor_dtypes[p.input_tensor] == FLOAT32 else 1)
    out_bytes = int(np.prod(p.tensor_shapes[p.output_tensor]))
    scratch = int(p.scratch_bytes)
    persistent = (rest.tail + ABI["TfLiteEvalTensor"][0] * (cm.num_tensors - cm.rest_num_tensors)
                  + ABI["NodeAndRegistration"][0])
    act_b = max(in_bytes + out_bytes + scratch, rest.head)
    act_b_x = max(out_bytes + scratch, rest.head)
    return {
        "estimated": ESTIMATE,
        "scratch_bytes": scratch, "input_bytes": in_bytes, "stage_output_bytes": out_bytes,
        "rest_tflm": {"arena_total_bytes": rest.total, "arena_head_bytes": rest.head,
                      "arena_tail_bytes": rest.tail},
        "as_run": {"total_bytes": rest.total + scratch + in_bytes, "total_bytes_excluding_input": rest.total + scratch},
        "single_arena": {"activation_bytes": act_b, "activation_bytes_excluding_input": act_b_x,
                         "persistent_bytes": persistent, "total_bytes": act_b + persistent,
                         "total_bytes_excluding_input": act_b_x + persistent},
    }


class CustomArenaCost:
    """Cost function of ``tfmcu.plan.search``: custom mode's single-arena peak (ESTIMATED, ``memory_report``),
    with the rest of the graph planned disjoint or in place."""

    what = "estimated single-arena peak"
    variants: tuple[str | None, ...] = (None,)

    def __init__(self, data: bytes, graph: ir.Graph, where: str = "model", inplace: bool = False,
                 count_input: bool = True):
        self.data, self.graph, self.where, self.inplace, self.count_input = data, graph, where, inplace, count_input

    def evaluate(self, candidate: Candidate, variant: str | None) -> Evaluation:
        if candidate.schedule is None:  # the unpatched model in TFLM
            p = predict_arena(self.graph, model=self.data, count_input=self.count_input)
            return Evaluation(candidate, None, p.total, None, {"predicted_arena_bytes": p.total})
        result = rewrite_custom(self.data, self.graph, candidate.schedule, self.where, inplace=self.inplace)
        mem = memory_report(result.model, self.where)
        key = "total_bytes" if self.count_input else "total_bytes_excluding_input"
        return Evaluation(candidate, None, mem["single_arena"][key], result,
                          {"estimated_single_arena_bytes": mem["single_arena"][key],
                           "scratch_bytes": mem["scratch_bytes"], "ops": result.ops_after})

    def lower_bound(self, candidate: Candidate, variant: str | None) -> int:
        """The stage's analytic peak (input + stage output + one patch's working set <= input + output + scratch),
        and, for a disjoint plan of the rest, the rest's analytic peak (<= its planned head)."""
        s = candidate.schedule
        if s is None:
            return 0
        bound = s.stage_peak_bytes if self.count_input else s.stage_peak_bytes - s.input_bytes
        if not self.inplace:  # an in-place plan of the rest can go below its analytic peak
            bound = max(bound, s.rest_peak_bytes)
        return bound
