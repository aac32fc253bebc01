"""Custom mode: the patch stage as ONE TFLite CUSTOM operator, ``TFMCU_PATCH_STAGE``, run by our C kernels.

The custom op's inputs are the stage input, then every layer's constant arrays: the ORIGINAL filter and bias
tensors (no Flash duplication) and the per-channel output multipliers / shifts computed offline (small new int32
constants, so the stage needs no persistent arena). Its flexbuffer custom options describe the stage exactly as
``tflm_patch_kernels/patch_stage.h`` wants it (tensor table, layers with scalar params and the input positions of
their arrays, per-band spans, scratch offsets, scratch size). The rest of the graph is untouched.

``HostRunner`` executes such a model on the host: the stage through the C kernels (ctypes), the rest through the real
TFLM interpreter (PyPI ``tflite-micro``) or ``tf.lite.Interpreter``, on a copy of the model whose input is the
stage output (``rest_model``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from flatbuffers import flexbuffers

from tfmcu import ir
from tfmcu import patch_kernels as pk
from tfmcu import tflite_schema as ts
from tfmcu.rewrite import (RewriteError, RewriteResult, _drop_unused_tensors, _schedule_record, _set_metadata,
                           _Writer, append_zip, read_schedule, split_appended_zip, SCHEDULE_METADATA)
from tfmcu.scheduler import PatchSchedule

CUSTOM_CODE = "TFMCU_PATCH_STAGE"
FORMAT_VERSION = 1
_ARRAYS = ("filter", "bias", "output_multiplier", "output_shift")


def is_custom_model(data: bytes) -> bool:
    model = ts.load_model(split_appended_zip(data)[0])
    return any(ts.op_name(model, op) == f"custom:{CUSTOM_CODE}" for op in model.subgraphs[0].operators or [])


# ----------------------------------------------------------------------------- writing
def rewrite_custom(data: bytes, graph: ir.Graph, schedule: PatchSchedule, where: str = "model",
                   inplace: bool = False) -> RewriteResult:
    """Replace ``schedule``'s stage of the .tflite ``data`` by one TFMCU_PATCH_STAGE operator. ``inplace``: the
    rest of the graph gets an in-place memory plan (``tfmcu.memory_plan``; valid for TFLM's reference kernels),
    recorded in the schedule metadata."""
    flat, members = split_appended_zip(data)
    try:
        packed = pk.pack_stage(flat, graph, schedule)
    except pk.PatchKernelError as e:
        raise RewriteError(f"{where}: {e}") from None
    model = ts.load_model(flat, where)
    w = _Writer(model)
    sg = w.sg
    sg.tensors = list(sg.tensors or [])
    model.buffers = list(model.buffers or [])
    model.operatorCodes = list(model.operatorCodes or [])
    original_ops = list(sg.operators or [])
    stage_src = [graph.ops[k].src_index for k in schedule.stage]
    if sorted(stage_src) != list(range(len(stage_src))):
        raise RewriteError(f"{where}: the patch stage must be the model's first operators")

    inputs = [packed.tensor_tflite_index[packed.input_tensor]]
    layers = []
    for spec, k in zip(packed.layers, schedule.stage):
        t_op = original_ops[graph.ops[k].src_index]
        t_in = [int(t) for t in t_op.inputs]
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
                idx = w.const(np.ascontiguousarray(a, dtype=np.int32), ts.TensorType.INT32,
                              f"tfmcu/{name}")
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
    op = ts.OperatorT()
    op.opcodeIndex = _custom_opcode(model)
    op.inputs = np.asarray(inputs, dtype=np.int32)
    op.outputs = np.asarray([packed.tensor_tflite_index[packed.output_tensor]], dtype=np.int32)
    op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(desc)), dtype=np.uint8).copy()
    op.customOptionsFormat = 0  # FLEXBUFFERS
    sg.operators = [op] + [o for k, o in enumerate(original_ops) if k not in set(stage_src)]
    _drop_unused_tensors(model)
    record = _schedule_record(schedule)
    record["mode"] = "custom"
    record["scratch_bytes"] = int(packed.scratch_bytes)
    record["memory_plan"] = "inplace" if inplace else "disjoint"
    _set_metadata(model, SCHEDULE_METADATA, json.dumps(record).encode())
    out = append_zip(ts.write_model(model), members)
    return RewriteResult(out, len(original_ops), len(sg.operators), w.new_tensors, record)


def _custom_opcode(model: ts.ModelT) -> int:
    for k, code in enumerate(model.operatorCodes):
        if ts.builtin_code(code) == ts.BuiltinOperator.CUSTOM and _text(code.customCode) == CUSTOM_CODE:
            return k
    code = ts.OperatorCodeT()
    code.builtinCode = ts.BuiltinOperator.CUSTOM
    code.deprecatedBuiltinCode = ts.BuiltinOperator.CUSTOM
    code.customCode = CUSTOM_CODE.encode()
    code.version = 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value or "")


# ----------------------------------------------------------------------------- reading
@dataclass
class CustomModel:
    packed: pk.PackedStage
    rest: bytes  # the model without the stage; its input is the stage output
    input_index: int  # TFLite tensor index of the model input read by the stage
    num_tensors: int  # tensors of the custom-mode model
    rest_num_tensors: int


def load_custom(data: bytes, where: str = "model") -> CustomModel:
    flat, _ = split_appended_zip(data)
    model = ts.load_model(flat, where)
    sg = model.subgraphs[0]
    ops = list(sg.operators or [])
    found = [k for k, op in enumerate(ops) if ts.op_name(model, op) == f"custom:{CUSTOM_CODE}"]
    if len(found) != 1 or found[0] != 0:
        raise RewriteError(f"{where}: expected one {CUSTOM_CODE} operator as the first operator")
    op = ops[0]
    try:
        desc = flexbuffers.Loads(np.asarray(op.customOptions, dtype=np.uint8).tobytes())
        if not isinstance(desc, dict):
            raise ValueError("not a map")
    except Exception as e:  # flexbuffers raises assorted errors on garbage
        raise RewriteError(f"{where}: invalid {CUSTOM_CODE} options ({type(e).__name__}: {e})") from None
    if desc.get("version") != FORMAT_VERSION:
        raise RewriteError(f"{where}: {CUSTOM_CODE} options version {desc.get('version')}; "
                           f"this tfmcu reads version {FORMAT_VERSION}")
    ins = [int(t) for t in op.inputs]

    def const(pos: int) -> np.ndarray:
        arr = ts.buffer_array(model, sg.tensors[ins[pos]])
        if arr is None:
            raise RewriteError(f"{where}: {CUSTOM_CODE} input {pos} has no constant data")
        return np.ascontiguousarray(arr)

    layers = []
    for layer in desc["layers"]:
        arrays: dict[str, np.ndarray | None] = {name: None for name in _ARRAYS}
        for name, pos in layer["arrays"].items():
            a = const(int(pos))
            arrays[name] = a.astype(np.int8) if name == "filter" else a.astype(np.int32).reshape(-1)
        layers.append(pk.LayerSpec(int(layer["type"]), dict(layer["params"]), arrays, layer["name"],
                                   int(layer["src"]), tuple(layer["padding"])))
    tensors = desc["tensors"]
    grid = tuple(desc["grid"])
    n_layers = len(layers)
    offsets = np.asarray(desc["buffer_offsets"], np.int32).reshape(grid[0] * grid[1], len(tensors))
    packed = pk.PackedStage(
        name=desc["name"], layers=layers, layer_inputs=[list(x) for x in desc["layer_inputs"]],
        layer_outputs=list(desc["layer_outputs"]), tensor_names=[f"t{k}" for k in range(len(tensors))],
        tensor_shapes=[tuple(t[:3]) for t in tensors], tensor_dtypes=[t[3] for t in tensors],
        tensor_producers=[t[4] for t in tensors], tensor_tflite_index=[-1] * len(tensors),
        input_tensor=int(desc["input_tensor"]), output_tensor=int(desc["output_tensor"]), grid=grid,
        row_spans=np.asarray(desc["row_spans"], np.int32).reshape(grid[0], n_layers, -1),
        col_spans=np.asarray(desc["col_spans"], np.int32).reshape(grid[1], n_layers, -1),
        buffer_offsets=offsets, buffer_sizes=np.zeros_like(offsets, dtype=np.int64),
        scratch_bytes=int(desc["scratch_bytes"]), lower_bound_bytes=0, plan_strategies=[])
    packed.refresh_c()
    record = read_schedule(model) or {}
    rest, rest_tensors = _rest_model(model, int(op.outputs[0]), inplace=record.get("memory_plan") == "inplace")
    return CustomModel(packed, rest, ins[0], len(sg.tensors), rest_tensors)


def _rest_model(model: ts.ModelT, stage_output: int, inplace: bool = False) -> tuple[bytes, int]:
    """The model without its stage (input: the stage output), with an offline memory plan when one beats TFLM's
    greedy planner (``tfmcu.memory_plan``, in-place if ``inplace``): that is the head a single-arena deployment
    plans for the rest."""
    from tfmcu.memory_plan import with_offline_plan

    rest = copy.deepcopy(model)
    sg = rest.subgraphs[0]
    sg.operators = list(sg.operators[1:])
    if not sg.operators:
        raise RewriteError("the model is all patch stage: nothing left for TFLM to run")
    sg.inputs = np.asarray([stage_output], dtype=np.int32)
    rest.signatureDefs = []
    rest.metadata = [m for m in rest.metadata or [] if _text(m.name) != SCHEDULE_METADATA]
    _drop_unused_tensors(rest)
    planned, _, _ = with_offline_plan(ts.write_model(rest), inplace=inplace)
    return planned, len(sg.tensors)


# ----------------------------------------------------------------------------- running
class HostRunner:
    """Runs a custom-mode model on the host: C kernels for the stage, TFLM (or TFLite) for the rest."""

    def __init__(self, data: bytes, where: str = "model"):
        self.where = where
        self.custom = load_custom(data, where)
        rc, layer = pk.check_stage(self.custom.packed)
        if rc != 0:
            raise RewriteError(f"{where}: invalid {CUSTOM_CODE} description ({pk.status_text(rc)}, layer {layer})")

    def stage(self, x: np.ndarray) -> np.ndarray:
        return pk.run_stage(self.custom.packed, x)

    def run(self, samples: Sequence[Any], rest: str = "tflm") -> list[list[np.ndarray]]:
        from tfmcu.tflm import run_tflite, run_tflm

        staged = [(self.stage(s[0] if isinstance(s, (tuple, list)) else s),) for s in samples]
        if rest == "tflm":
            return run_tflm(self.custom.rest, staged, where=f"{self.where} (rest)")
        return run_tflite(self.custom.rest, staged, where=f"{self.where} (rest)")


def memory_report(data: bytes, where: str = "model", measure: bool = True) -> dict[str, Any]:
    """Custom-mode memory, two ways, each with and without the input image:

    (a) as run here: TFLM's measured arena of the rest of the graph (its input = the stage output) + the C
        kernels' scratch + the input image;
    (b) the single-arena peak a TFLM adapter has, where scratch is reused by later tensors:
        max(input + stage output + scratch, planned head of the rest) + persistent bytes (the rest's measured
        tail + the TfLiteEvalTensor records of the custom model's extra tensors + one NodeAndRegistration).
    ``measure=False`` predicts the rest's arena (tfmcu.tflm_memory) instead of measuring it in TFLM."""
    from tfmcu.tflm_memory import ABI

    cm = load_custom(data, where)
    p = cm.packed
    if measure:
        from tfmcu.tflm import measure_arena
        rest = measure_arena(cm.rest, where=f"{where} (rest)")
    else:
        from tfmcu.lower_tflite import from_tflite
        from tfmcu.tflm_memory import predict_arena
        rest = predict_arena(from_tflite(cm.rest), model=cm.rest)
    in_shape = p.tensor_shapes[p.input_tensor]
    in_bytes = int(np.prod(in_shape)) * (4 if p.tensor_dtypes[p.input_tensor] == pk.FLOAT32 else 1)
    out_bytes = int(np.prod(p.tensor_shapes[p.output_tensor]))
    scratch = int(p.scratch_bytes)
    persistent = (rest.tail + ABI["TfLiteEvalTensor"][0] * (cm.num_tensors - cm.rest_num_tensors)
                  + ABI["NodeAndRegistration"][0])
    act_b = max(in_bytes + out_bytes + scratch, rest.head)
    act_b_x = max(out_bytes + scratch, rest.head)
    return {
        "scratch_bytes": scratch, "input_bytes": in_bytes, "stage_output_bytes": out_bytes,
        "rest_tflm": {"arena_total_bytes": rest.total, "arena_head_bytes": rest.head,
                      "arena_tail_bytes": rest.tail},
        "as_run": {"total_bytes": rest.total + scratch + in_bytes, "total_bytes_excluding_input": rest.total + scratch},
        "single_arena": {"activation_bytes": act_b, "activation_bytes_excluding_input": act_b_x,
                         "persistent_bytes": persistent, "total_bytes": act_b + persistent,
                         "total_bytes_excluding_input": act_b_x + persistent},
    }


def auto_custom(data: bytes, graph: ir.Graph, sram_bytes: int | None, patch_options: tuple[int, ...] = (1, 2, 3, 4),
                max_mac_overhead: float | None = None, unit: str = "blocks", where: str = "model",
                count_input: bool = True, progress: Any = None,
                inplace: bool = False) -> tuple[RewriteResult | None, dict[str, Any], str]:
    """Custom mode's auto schedule: with a budget, the least-MACs schedule whose predicted single-arena peak (b)
    fits; without one, the smallest predicted single-arena peak."""
    from tfmcu import scheduler

    cands = [c for c in scheduler.candidates(graph, patch_options, unit, rectangular=True)[1:]
             if max_mac_overhead is None or c.mac_overhead <= max_mac_overhead + 1e-12]
    key = "total_bytes" if count_input else "total_bytes_excluding_input"
    if sram_bytes is not None:
        cands.sort(key=lambda c: (c.macs, c.patches[0] * c.patches[1]))
    best: tuple[RewriteResult, dict[str, Any]] | None = None
    floor = None  # smallest rest-of-net peak among the schedules skipped for it
    for n, cand in enumerate(cands):
        if progress:
            progress(n + 1, len(cands), scheduler.describe_choice(cand))
        if sram_bytes is not None and cand.schedule.rest_peak_bytes > sram_bytes:
            floor = min(floor or cand.schedule.rest_peak_bytes, cand.schedule.rest_peak_bytes)
            continue  # the rest of the net alone needs more
        try:
            res = rewrite_custom(data, graph, cand.schedule, where, inplace=inplace)
        except RewriteError:
            continue
        mem = memory_report(res.model, where, measure=False)
        if sram_bytes is not None and mem["single_arena"][key] <= sram_bytes:
            return res, mem, (f"fits {sram_bytes / 1024:.1f} kB: {scheduler.describe_choice(cand)}, predicted "
                              f"single-arena peak {mem['single_arena'][key] / 1024:.1f} kB, MACs "
                              f"+{cand.mac_overhead * 100:.1f}%")
        if best is None or mem["single_arena"][key] < best[1]["single_arena"][key]:
            best = (res, mem)
    if best is None:
        if floor is not None:
            return None, {}, (f"no schedule fits {sram_bytes / 1024:.1f} kB; the per-layer rest of the net alone "
                              f"needs at least {floor / 1024:.1f} kB")
        return None, {}, "no schedule can run in the C kernels"
    peak = best[1]["single_arena"][key]
    if sram_bytes is not None:
        return None, best[1], f"no schedule fits {sram_bytes / 1024:.1f} kB; smallest predicted single-arena " \
                              f"peak is {peak / 1024:.1f} kB"
    return best[0], best[1], f"smallest predicted single-arena peak: {peak / 1024:.1f} kB"
