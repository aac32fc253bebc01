"""Custom mode: the patch stage as ONE TFLite CUSTOM operator, ``TFMCU_PATCH_STAGE``, run by our C kernels.

The custom op's inputs are the stage input and the stage blob: one constant byte array holding the whole stage as
``tflm_patch_kernels/patch_stage_types.h`` wants it (tensor table, layers, params records, spans, buffer offsets,
halo tables, and the layers' weights, biases and per-channel multipliers / shifts computed offline), which the kernel
reads in place from Flash: TFLM keeps one tensor record for it and the kernel a few words of op data, whatever the
stage's size. The layers' own filter and bias tensors move into the blob (each weight is in Flash once). Its small
flexbuffer options say what the kernel reads besides (format version, streamed input) and what tfmcu's tools read
back (names, source operators, padding). The rest of the graph is untouched; the whole model gets an offline memory
plan when one beats TFLM's greedy planner (the rest in place with ``inplace``).

* ``rewrite_custom(data, graph, schedule)``: the custom-mode model (``inplace``: the rest of the graph gets an
  in-place offline memory plan, ``tfmcu.plan.memory_plan``).
* ``load_custom(data)``: the op's description back as a ``PackedStage`` plus ``rest``, the model without the stage
  (its input is the stage output), with the offline memory plan a single-arena deployment would use.
* ``memory_report(data)``: the stage's scratch / input / output bytes, the kernel's persistent bytes (64-bit host and
  32-bit Cortex-M) and the model's predicted TFLM arena.
* ``CustomArenaCost``: that prediction as a cost function of ``tfmcu.plan.search``, for the model ``CustomOptions``
  (in-place rest, halo caches, streamed input, the rest's convolutions) asks for.

The op's format (blob and options) and the kernel's memory arithmetic live in ``tfmcu.tflite.patch_stage_format``. The TFLM kernel
(``tflm_patch_kernels/tflm``) runs such a model whole in TFLM (``tfmcu.runtime.tflm_host``); ``HostRunner``
(``tfmcu.runtime.host``) runs the stage through ctypes for TF Lite comparisons and kernel tests.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tfmcu import abi
from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_model, from_tflite
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.ops import LayerSpec, kernel_op, params_from_words
from tfmcu.kernels.pack import PackedStage, cache_sizes, input_window_bytes, pack_stage, stage_blob
from tfmcu.plan import regions
from tfmcu.plan.arena import (ALIGN, DEFAULT_KERNELS, KERNEL_SETS, MVE_CORES, builtin_of, const_inputs, get_build,
                              op_allocations, operator_tail, persistent_bytes, predict_arena, predict_model_arena,
                              stage_op_alloc)
from tfmcu.plan.halo import HaloCaches, HaloOptions, halo_caches, select
from tfmcu.plan.memory_plan import with_offline_plan
from tfmcu.plan.placer import align_up
from tfmcu.plan.regions import PatchSchedule, ScheduleError
from tfmcu.plan.search import Evaluation, Plan, Segment
from tfmcu.stage.common import SCHEDULE_METADATA, RewriteError, RewriteResult, read_schedule, schedule_record
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import ModelEditor, load
from tfmcu.tflite.model import TfliteModel, as_model
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP, kernel_memory, stage_of, stage_options

_ARRAYS = abi.ARRAY_NAMES


def is_custom_model(data: bytes | ts.ModelT) -> bool:
    model = data if isinstance(data, ts.ModelT) else load(data)
    return any(ts.op_name(model, op) == f"custom:{PATCH_STAGE_OP}" for op in model.subgraphs[0].operators or [])


# ----------------------------------------------------------------------------- writing
# Writing is in two phases (``tfmcu.tflite.editor``): ``rewrite_custom`` / ``rewrite_stages`` / ``convs_to_flash``
# decide the rewritten model (its tensors, operators, options, tables, metadata and offline memory plan) and return
# it decided, not written (``RewriteResult.decided``); its bytes are written the first time they are asked for
# (``RewriteResult.model``). A cost function prices the decided model (``tfmcu.plan.arena``, ``tfmcu.plan.latency``
# read it as they read its file) and only the models kept are written.
def rewrite_custom(data: bytes | TfliteModel, graph: ir.Graph, schedule: PatchSchedule, where: str = "model",
                   inplace: bool = False, halo: HaloCaches | None = None,
                   streamed_input: bool = False, kernels: str = "reference",
                   core: str | None = None) -> RewriteResult:
    """Replace ``schedule``'s stage of the .tflite ``data`` (bytes, or the model parsed once,
    ``tfmcu.tflite.model``) by one TFMCU_PATCH_STAGE operator. The offline memory
    plan is made around the scratch buffers of the build that links ``kernels`` on ``core`` (None: a core without
    Helium; ``tfmcu.plan.memory_plan``), recorded in the schedule metadata (``memory_plan_kernels``, and
    ``memory_plan_helium`` for CMSIS-NN's Helium read orders, ``plan_record``); ``inplace``: the rest of the graph
    planned in place with the overlaps those kernels allow. ``halo``: halo caches of this schedule
    (``tfmcu.plan.halo``), recorded too. ``streamed_input``: the stage reads the image through the application's
    ``TfmcuInputProvider`` (tflm_patch_kernels/tflm/patch_stage_op.h) row band by row band: the model's input becomes
    a one-element int8 placeholder and the arena holds no image. The model is decided, written when its bytes are
    asked for."""
    ed, packed, record, ops_before = _first_stage(as_model(data, where), graph, schedule, where, inplace, halo,
                                                  streamed_input, kernels, core)
    ed.set_metadata(SCHEDULE_METADATA, json.dumps(record).encode())
    # The whole model's offline memory plan (the stage op's input and output, the rest in place if asked), when it
    # beats TFLM's greedy planner; TFLM places the op's scratch around it.
    planned, _, _ = with_offline_plan(ed.decided(where), inplace=inplace, kernels=kernels, stages={0: packed},
                                      core=core)
    return RewriteResult(planned, ops_before, len(ed.subgraph.operators), ed.new_tensors, record, {0: packed})


def _first_stage(source: TfliteModel, graph: ir.Graph, schedule: PatchSchedule, where: str, inplace: bool,
                 halo: HaloCaches | None, streamed_input: bool, kernels: str,
                 core: str | None = None) -> tuple[ModelEditor, PackedStage, dict[str, Any], int]:
    """``rewrite_custom``'s model before its metadata and memory plan: (the editor holding it, the stage packed, its
    schedule record, the operators before)."""
    try:
        packed = pack_stage(source, graph, schedule, halo=halo)
    except PatchKernelError as e:
        raise RewriteError(f"{where}: {e}") from None
    ed = ModelEditor(source, where)
    original_ops = list(ed.subgraph.operators)
    stage_src = [graph.ops[k].src_index for k in schedule.stage]
    if sorted(stage_src) != list(range(len(stage_src))):
        raise RewriteError(f"{where}: the patch stage must be the model's first operators")

    inputs = [packed.tensor_tflite_index[packed.input_tensor]]
    stream: dict[str, int] = {}
    if streamed_input:
        image = inputs[0]
        sg = ed.subgraph
        if image not in [int(t) for t in sg.inputs] or any(
                image in [int(t) for t in op.inputs] for k, op in enumerate(original_ops) if k not in stage_src):
            raise RewriteError(f"{where}: streamed input needs the stage input to be a model input read by the "
                               f"stage only")
        window = input_window_bytes(packed)
        if window == 0:
            raise RewriteError(f"{where}: this stage cannot stream its input (a row band reads rows above those of "
                               f"the band before)")
        token = ed.tensor_like(image, (1,), "tfmcu/streamed_input")
        ed.tensor(token).type = ts.TensorType.INT8
        q = ts.schema.QuantizationParametersT()  # int8 like any quantized input (scale 1, zero point 0): TFLM allocates
        q.scale, q.zeroPoint = np.asarray([1.0], np.float32), np.asarray([0], np.int64)  # it the same way
        ed.tensor(token).quantization = q
        sg.inputs = np.asarray([token if int(t) == image else int(t) for t in sg.inputs], dtype=np.int32)
        for sig in ed.model.signatureDefs or []:
            for tm in sig.inputs or []:
                if int(tm.tensorIndex) == image:
                    tm.tensorIndex = token
        inputs = [token]
        stream = {"streamed_input": 1, "input_window_bytes": window}
    op = _stage_operator(ed, packed, inputs, stream)
    ed.subgraph.operators = [op] + [o for k, o in enumerate(original_ops) if k not in set(stage_src)]
    ed.drop_unused_tensors()
    record = schedule_record(schedule, "custom", scratch_bytes=int(packed.scratch_bytes),
                             **plan_record(inplace, kernels, core), **stream)
    if halo is not None:
        record["halo"] = halo.to_dict()
    return ed, packed, record, len(original_ops)


def plan_record(inplace: bool, kernels: str, core: str | None) -> dict[str, Any]:
    """What the schedule metadata says of the memory plan: in place or disjoint, for which kernels' read orders
    (``memory_plan_kernels``) and, in place with CMSIS-NN on a core with Helium, ``memory_plan_helium`` (CMSIS-NN's
    MVE code reads in other orders than its DSP code: ``tfmcu.firmware.sources.check_model`` holds the two apart)."""
    record: dict[str, Any] = {"memory_plan": "inplace" if inplace else "disjoint", "memory_plan_kernels": kernels}
    if inplace and kernels == "cmsis_nn" and core in MVE_CORES:
        record["memory_plan_helium"] = True
    return record


def rewrite_stages(data: bytes | TfliteModel, graph: ir.Graph,
                   stages: Sequence[tuple[PatchSchedule, HaloCaches | None]],
                   where: str = "model", inplace: bool = False, streamed_input: bool = False,
                   kernels: str = "reference", core: str | None = None) -> RewriteResult:
    """A plan's patch stages (``tfmcu.plan.plans.Plan.schedules``, each with its halo caches), each ONE
    TFMCU_PATCH_STAGE operator with its own grid and caches, in the place of its operators; the first may start at
    operator 0 and stream the image (``streamed_input``, as ``rewrite_custom``; a single such stage is exactly
    ``rewrite_custom``'s model). The stages must be runs of consecutive operators that do not overlap. The schedule
    metadata is the first stage's record (what one-stage readers read) with ``stage_plan``: every stage's operators,
    grid and caches. One offline memory plan for the whole model (``inplace``: the builtin ops in place) with every
    stage's scratch. The model is decided, written when its bytes are asked for (``RewriteResult.model``)."""
    if not stages:
        raise RewriteError(f"{where}: no patch stage given")
    source = as_model(data, where)
    order = sorted(stages, key=lambda sh: graph.ops[sh[0].stage[0]].src_index)
    if len(order) == 1 and graph.ops[order[0][0].stage[0]].src_index == 0:
        return rewrite_custom(source, graph, order[0][0], where, inplace, order[0][1], streamed_input, kernels, core)
    first, rest = order[0], order[1:]
    record: dict[str, Any] | None = None
    packs: dict[int, PackedStage] = {}  # by operator index in the model the loop below edits
    if graph.ops[first[0].stage[0]].src_index == 0:  # the first stage as rewrite_custom makes it (streamed or not)
        ed0, packs[0], record, _ = _first_stage(source, graph, first[0], where, inplace, first[1], streamed_input,
                                                kernels, core)
        source = ed0.decided(where)
        base = from_model(source, name=where)
        shift = len(first[0].stage) - 1  # operators before the later stages: the first stage's became one
        todo = [(sch, h, [graph.ops[k].src_index - shift for k in sch.stage]) for sch, h in rest]
        orig = [[graph.ops[k].src_index for k in sch.stage] for sch, _ in rest]
    else:
        if streamed_input:
            raise RewriteError(f"{where}: streamed input needs a patch stage that starts at the first operator")
        base = graph
        todo = [(sch, h, [graph.ops[k].src_index for k in sch.stage]) for sch, h in order]
        orig = [src for _, _, src in todo]
    ed = ModelEditor(source, where)
    original_ops = list(ed.subgraph.operators)
    replace: dict[int, Any] = {}
    drop: set[int] = set()
    by_src = {op.src_index: k for k, op in enumerate(base.ops)}
    entries: list[tuple[int, dict[str, Any]]] = [] if record is None else [(0, _stage_entry(first[0], first[1]))]
    last = -1
    for (sch, halo, src), src0 in zip(todo, orig):
        if src != list(range(src[0], src[0] + len(src))) or src[0] <= last:
            raise RewriteError(f"{where}: a patch stage must be a run of consecutive operators after the one before "
                               f"(operators {src[0]}..{src[-1]})")
        last = src[-1]
        ops = [by_src[i] for i in src]
        s = regions.schedule(base, sch.grid, ops=ops, accounting=sch.accounting)
        h = None if halo is None else halo_caches(s, halo.cache_rows, halo.cache_cols)
        try:
            packed = pack_stage(source, base, s, halo=h, name=f"stage_{src[0]}")
        except PatchKernelError as e:
            raise RewriteError(f"{where}: {e}") from None
        replace[src[0]] = _stage_operator(ed, packed, [packed.tensor_tflite_index[packed.input_tensor]], {})
        packs[src[0]] = packed
        drop |= set(src[1:])
        entries.append((src[0], {**_stage_entry(s, h), "ops_tflite": src0}))
    new_ops, index = [], {}
    for i, o in enumerate(original_ops):
        if i not in drop:
            index[i] = len(new_ops)
            new_ops.append(replace.get(i, o))
    ed.subgraph.operators = new_ops
    ed.drop_unused_tensors()
    record = dict(record) if record is not None else schedule_record(order[0][0], "custom",
                                                                     **plan_record(inplace, kernels, core))
    record["stage_plan"] = [{"operator": index[i], **e} for i, e in entries]
    ed.set_metadata(SCHEDULE_METADATA, json.dumps(record).encode())
    found = {index[i]: p for i, p in packs.items()}
    planned, _, _ = with_offline_plan(ed.decided(where), inplace=inplace, kernels=kernels, stages=found, core=core)
    return RewriteResult(planned, len(graph.ops), len(ed.subgraph.operators), ed.new_tensors, record, found)


def _stage_entry(s: PatchSchedule, halo: HaloCaches | None) -> dict[str, Any]:
    """One stage of a stage plan as the schedule metadata records it (its operators in the original model)."""
    return {"ops_tflite": [s.graph.ops[k].src_index for k in s.stage], "grid": list(s.grid),
            "halo": None if halo is None else halo.to_dict()}


def _stage_operator(ed: ModelEditor, packed: PackedStage, inputs: list[int], stream: dict[str, int]) -> Any:
    """The TFMCU_PATCH_STAGE operator of ``packed``: its inputs are ``inputs`` (the stage input) and the stage blob, a
    new constant holding the whole stage, weights included (``stage_blob``: the layers' own filters and biases move
    into it, so the model's Flash holds each weight once); its options a map the editor writes as a flexbuffer with
    the model. What the op holds is decided here, for the writer and for pricing alike."""
    blob = ed.constant(np.frombuffer(stage_blob(packed), np.uint8), ts.TensorType.UINT8, f"tfmcu/{packed.name}",
                       dedupe=False)
    desc = stage_options(packed.name, [{"name": spec.name, "src": spec.src_index, "padding": spec.padding}
                                       for spec in packed.layers],
                         stream["input_window_bytes"] if stream else None)
    return ed.custom_operator(PATCH_STAGE_OP, [*inputs, blob], [packed.tensor_tflite_index[packed.output_tensor]],
                              desc)


# ----------------------------------------------------------------------------- the rest's convolutions in Flash
FLASH_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def _as_conv(graph: ir.Graph, k: int) -> ir.Graph:
    """``graph`` with its FULLY_CONNECTED op ``k`` ([1, C] -> [1, K]) seen as the 1x1 CONV_2D it computes
    ([1, 1, 1, C] -> [1, 1, 1, K]: TFLM's int8 FullyConnected and Conv arithmetic are the same per output channel),
    for the one-layer stage that runs it; other ops are left as they are. ``ScheduleError`` for other shapes."""
    op = graph.ops[k]
    if op.type != ir.FULLY_CONNECTED:
        return graph
    shapes = [graph.tensors[t].shape for t in (op.inputs[0], op.outputs[0])]
    if op.attrs.get("dynamic_weights") or any(len(sh) != 2 or sh[0] != 1 for sh in shapes):
        raise ScheduleError(f"{op.describe(k)}: only [1, C] -> [1, K] with constant weights runs as a 1x1 "
                            f"convolution (shapes {[list(sh) for sh in shapes]})")
    g = graph.copy()
    for t in (op.inputs[0], op.outputs[0]):
        g.tensors[t].shape = (1, 1, 1, int(g.tensors[t].shape[1]))
    g.ops[k].type = ir.CONV
    return g


def _pool_after(graph: ir.Graph, k: int, consumers: dict[str, list[int]]) -> int | None:
    """The global average pool (``regions.is_global_pool``) that is the only reader of CONV_2D ``k``'s output, else
    None: the conv's one-layer stage ends with it (the stage sums the conv's output as it computes it)."""
    op = graph.ops[k]
    if op.type != ir.CONV or len(op.outputs) != 1 or op.outputs[0] in graph.outputs:
        return None
    readers = consumers.get(op.outputs[0], [])
    if len(readers) != 1 or not regions.is_global_pool(graph, graph.ops[readers[0]]):
        return None
    return readers[0]


def _float_quantize(graph: ir.Graph, k: int) -> bool:
    """Whether operator ``k`` is a QUANTIZE of a float32 tensor to int8 (a float model's input): its one-layer stage
    quantizes in about a third of TFLM's reference instructions (tflm_patch_kernels/quantize.h)."""
    op = graph.ops[k]
    return (op.type == ir.QUANTIZE and len(op.inputs) == 1 and graph.tensors[op.inputs[0]].dtype == "float32"
            and len(op.outputs) == 1 and graph.tensors[op.outputs[0]].dtype == "int8")


@dataclass
class FlashResult:
    decided: TfliteModel  # the model, decided; written the first time ``model`` is asked for
    replaced: list[dict[str, Any]]  # per op run by our kernel: index, name, out channels, persistent bytes saved
    kept: list[dict[str, Any]]  # convolutions left to TFLM (our kernel's op data would not be smaller)
    stages: dict[int, PackedStage] = field(default_factory=dict)  # every TFMCU_PATCH_STAGE op's, by op index

    @property
    def model(self) -> bytes:
        """The model's bytes (written on first use)."""
        return self.decided.data


def convs_to_flash(data: bytes | TfliteModel, where: str = "model", inplace: bool = False, build: str = "cortex-m",
                   kernels: str = "reference", stages: dict[int, PackedStage] | None = None,
                   core: str | None = None) -> FlashResult:
    """Run the model's CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED operators outside a patch stage through our
    kernels too: each becomes a one-layer TFMCU_PATCH_STAGE op (one patch, no scratch; a fully connected layer as the
    1x1 convolution it computes) whose per-channel multipliers and shifts are computed offline into Flash, so TFLM's
    persistent tail no longer holds them (TFLM's Prepare allocates 2 x 4 x out channels bytes per convolution, and
    per fully connected layer with per-channel weights: a 1000-class classifier's 8,000 B). An operator is replaced
    where that makes the tail smaller: our kernel's op data (``kernel_memory``) below TFLM's own allocations for it
    (``tfmcu.plan.arena``, TFLM build ``build``: Cortex-M's 32-bit structs by default). A CONV_2D whose only reader
    is a global average pool is always replaced, the pool with it (one stage: the conv, then the pool's sums, where
    TFLM runs its generic reference reduction); so is a QUANTIZE of a float tensor (a float model's input: our
    kernel takes about a third of TFLM's reference instructions). Otherwise tensors and their lifetimes are unchanged
    (the memory plan is made again; ``inplace``: in place, for ``kernels`` on ``core``); results are bit-exact as for
    the stage. ``data``: bytes, or a model parsed or decided
    (``tfmcu.tflite.model``); the result's model is decided, written when asked for."""
    source = as_model(data, where)
    graph = from_model(source, name=where)
    ed = ModelEditor(source, where)
    original_ops = list(ed.subgraph.operators)
    tb = get_build(build)
    replaced: dict[int, Any] = {}
    done, kept = [], []
    packs: dict[int, PackedStage] = dict(stages or {})  # the model's own TFMCU ops keep their operator index
    uses: dict[int, int] = {}  # tensor -> operators reading it
    for o in original_ops:
        for t in set(int(t) for t in (o.inputs if o.inputs is not None else [])):
            uses[t] = uses.get(t, 0) + 1
    consumers = graph.consumers()
    for k, op in enumerate(graph.ops):
        quant = _float_quantize(graph, k)
        if builtin_of(op) not in FLASH_OPS and not quant:
            continue
        pool = _pool_after(graph, k, consumers)
        ops = [k] if pool is None else [k, pool]
        try:
            g = _as_conv(graph, k)
            packed = pack_stage(source, g, regions.schedule(g, (1, 1), ops=ops), name=op.name)
        except (PatchKernelError, ScheduleError) as e:
            kept.append({"op": op.src_index, "name": op.name, "why": str(e)})
            continue
        ours, _ = kernel_memory({"scratch_bytes": packed.scratch_bytes}, tb.pointer_bytes)
        # one TfLiteEvalTensor in the tail for its stage blob; the filter and bias tensors it replaces lose theirs
        # where no other operator reads them
        record = tb.abi["TfLiteEvalTensor"][0]
        own = [int(t) for t in original_ops[op.src_index].inputs[1:] if int(t) >= 0 and uses.get(int(t)) == 1]
        ours = align_up(ours, ALIGN) + record
        theirs = sum(persistent_bytes(op_allocations(graph, graph.ops[i], tb)) for i in ops) + record * len(own)
        entry = {"op": op.src_index, "name": op.name, "builtin": builtin_of(op), "out_channels": op.out_channels,
                 "tflm_persistent_bytes": theirs, "tfmcu_persistent_bytes": ours}
        if pool is not None:
            entry["pool"] = graph.ops[pool].src_index
        # with the global pool after it, ours runs TFLM's reference MEAN's work as sums (tflm_patch_kernels/mean.h),
        # a float input's QUANTIZE in a third of TFLM's instructions: replaced even where the tail does not shrink
        if ours < theirs or pool is not None or quant:
            replaced[op.src_index] = _stage_operator(ed, packed, [packed.tensor_tflite_index[packed.input_tensor]],
                                                     {})
            if pool is not None:
                replaced[graph.ops[pool].src_index] = None
            packs[op.src_index] = packed
            done.append(entry)
        else:
            kept.append({**entry, "why": "our kernel's op data would not be smaller"})
    ops_after = [replaced.get(i, o) for i, o in enumerate(original_ops)]
    index = {i: n for n, i in enumerate(i for i, o in enumerate(ops_after) if o is not None)}
    packs = {index[i]: p for i, p in packs.items()}
    ed.subgraph.operators = [o for o in ops_after if o is not None]
    ed.drop_unused_tensors()
    planned, _, _ = with_offline_plan(ed.decided(where), inplace=inplace, kernels=kernels, stages=packs, core=core)
    return FlashResult(planned, done, kept, packs)


# ----------------------------------------------------------------------------- reading
@dataclass
class CustomModel:
    packed: PackedStage  # the patch stage's (operator 0); with ``all_stages``, the first TFMCU_PATCH_STAGE op's
    rest: bytes | None  # the model without the stage, its input the stage output (None: not one stage at op 0)
    input_index: int  # TFLite tensor index of the model input read by the stage
    num_tensors: int  # tensors of the custom-mode model
    rest_num_tensors: int
    stages: dict[int, PackedStage] = field(default_factory=dict)  # every TFMCU_PATCH_STAGE op's, by operator index


def load_custom(data: TfliteModel | bytes, where: str = "model", all_stages: bool = False) -> CustomModel:
    """The TFMCU_PATCH_STAGE description of a custom-mode model (parsed, ``tfmcu.tflite.model``, or its bytes) and
    the rest of its graph (``RewriteError`` with one line for anything that is not a well-formed custom-mode model).
    By default the model must have exactly one such op, its first. ``all_stages``: any number of them anywhere
    (``rewrite --rest_convs=tfmcu`` adds one per convolution of the rest): each one's description in ``stages`` (by
    operator index); ``rest`` only for one stage at operator 0."""
    model = as_model(data, where).flatbuffer
    sg = model.subgraphs[0]
    ops = list(sg.operators or [])
    found = [k for k, op in enumerate(ops) if ts.op_name(model, op) == f"custom:{PATCH_STAGE_OP}"]
    if not all_stages and len(found) > 1 and found[0] == 0:
        raise RewriteError(f"{where}: {len(found)} {PATCH_STAGE_OP} operators (the rest's convolutions run by our "
                           f"kernels, rewrite --rest_convs=tfmcu): this reader takes models whose only "
                           f"{PATCH_STAGE_OP} is the patch stage (load_custom(..., all_stages=True) reads them all)")
    if not found or (not all_stages and (len(found) != 1 or found[0] != 0)):
        raise RewriteError(f"{where}: expected {'a' if all_stages else 'one'} {PATCH_STAGE_OP} operator"
                           + ("" if all_stages else " as the first operator"))
    stages: dict[int, PackedStage] = {}
    for k in found:
        op = ops[k]
        at = f" {k}" if k else ""
        try:
            stages[k] = _packed_from_stage(stage_of(model, op))
        except (KeyError, IndexError, TypeError, ValueError, PatchKernelError) as e:
            raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} operator{at} ({type(e).__name__}: {e})") from None
    first = found[0]
    rest, rest_tensors = None, 0
    if found == [0]:
        record = read_schedule(model) or {}
        rest, rest_tensors = rest_model(model, int(ops[0].outputs[0]),
                                        inplace=record.get("memory_plan") == "inplace")
    return CustomModel(stages[first], rest, int(ops[first].inputs[0]), len(sg.tensors), rest_tensors, stages)


def _packed_from_stage(desc: dict[str, Any]) -> PackedStage:
    """A stage as ``tfmcu.tflite.patch_stage_format.read_stage`` describes it, as the ``PackedStage`` it was written
    from (its layers' arrays cut from the blob's constants by the sizes their params give; ``ValueError`` where they
    do not fit)."""
    tensors = desc["tensors"]
    constants = desc["constants"] if desc["constants"] is not None else np.zeros(0, np.uint8)
    layers = []
    for k, layer in enumerate(desc["layers"]):
        code = int(layer["type"])
        params = params_from_words(code, layer["words"])
        op = kernel_op(code)
        ins = desc["layer_inputs"][k]
        sizes = op.array_sizes(params, int(tensors[int(ins[0])][2]),
                               int(tensors[int(desc["layer_outputs"][k])][2])) if op.array_sizes else {}
        arrays: dict[str, np.ndarray | None] = {name: None for name in _ARRAYS}
        for name, at in layer["arrays"].items():
            dtype = np.int8 if name == "filter" else np.dtype("<i4")
            n = int(sizes.get(name, 0)) * np.dtype(dtype).itemsize
            if at < 0 or at + n > constants.size:
                raise ValueError(f"layer {k}'s {name} lies outside the blob's constants")
            arrays[name] = np.frombuffer(constants[at:at + n].tobytes(), dtype).astype(
                np.int8 if name == "filter" else np.int32)
        layers.append(LayerSpec(code, params, arrays, layer["name"], int(layer["src"]), tuple(layer["padding"])))
    grid = tuple(int(g) for g in desc["grid"])
    offsets = np.asarray(desc["buffer_offsets"], np.int32)
    halo: dict[str, Any] = {}
    if int(desc.get("num_caches", 0)) > 0:
        halo = dict(row_held=np.asarray(desc["row_held"], np.int32), col_held=np.asarray(desc["col_held"], np.int32),
                    caches=[tuple(int(v) for v in c) for c in desc["caches"]])
        halo["cache_bytes"] = cache_sizes(halo["row_held"], halo["col_held"], [c[:2] for c in halo["caches"]],
                                          [t[4] for t in tensors], [t[2] for t in tensors])
    num_passes = int(desc.get("num_passes", 1) or 1)
    tensor_data = {k: np.frombuffer(constants[t[5]:t[5] + t[0] * t[1] * t[2]].tobytes(), np.int8).copy()
                   for k, t in enumerate(tensors) if len(t) > 5 and t[5] >= 0}
    return PackedStage(
        layer_passes=None if num_passes == 1 else [(int(la["passes"]), int(la["after_pass"])) for la in desc["layers"]],
        num_passes=num_passes, tensor_data=tensor_data,
        name=desc["name"], layers=layers, layer_inputs=[list(x) for x in desc["layer_inputs"]],
        layer_outputs=list(desc["layer_outputs"]), tensor_names=[f"t{k}" for k in range(len(tensors))],
        tensor_shapes=[tuple(t[:3]) for t in tensors], tensor_dtypes=[t[3] for t in tensors],
        tensor_producers=[t[4] for t in tensors], tensor_tflite_index=[-1] * len(tensors),
        input_tensor=int(desc["input_tensor"]), output_tensor=int(desc["output_tensor"]), grid=grid,
        row_spans=np.asarray(desc["row_spans"], np.int32), col_spans=np.asarray(desc["col_spans"], np.int32),
        buffer_offsets=offsets, buffer_sizes=np.zeros_like(offsets, dtype=np.int64),
        scratch_bytes=int(desc["scratch_bytes"]), lower_bound_bytes=0, plan_strategies=[], **halo)


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
def memory_report(data: bytes, where: str = "model") -> dict[str, Any]:
    """What custom mode's TFLM arena is made of, PREDICTED (``tfmcu.plan.arena.predict_arena`` on the whole
    custom-mode model: the TFMCU_PATCH_STAGE kernel's op data and exact scratch included; measured figures come from
    running it, ``tfmcu.runtime.tflm_host``): the stage's scratch, input and output bytes, the kernel's persistent
    op data on a 64-bit host and on 32-bit Cortex-M, and the predicted arena (head / tail / total)."""
    model = load(data, where)
    found = [(k, op) for k, op in enumerate(model.subgraphs[0].operators or [])
             if ts.op_name(model, op) == f"custom:{PATCH_STAGE_OP}"]
    if not found:
        raise RewriteError(f"{where}: no {PATCH_STAGE_OP} operator")
    stages = []
    for k, op in found:
        try:
            opts = stage_of(model, op, tables=False)
            host, scratch = kernel_memory(opts, pointer_bytes=8)
            mcu, _ = kernel_memory(opts, pointer_bytes=4)
            shapes, dtypes = opts["tensors"], [t[3] for t in opts["tensors"]]
            i, o = int(opts["input_tensor"]), int(opts["output_tensor"])
            in_bytes = int(np.prod(shapes[i][:3])) * (4 if dtypes[i] == abi.FLOAT32 else 1)
            out_bytes = int(np.prod(shapes[o][:3]))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} operator {k} ({e})") from None
        stages.append({"operator": k, "scratch_bytes": int(opts["scratch_bytes"]), "scratch_request_bytes": scratch,
                       "input_bytes": in_bytes, "stage_output_bytes": out_bytes,
                       "patch_stage_persistent_bytes": {"host_64bit": host, "cortex_m_32bit": mcu}})
    p = predict_arena(from_tflite(data), model=data)
    # the first stage's figures at the top (one-stage readers), every stage's in "stages"
    return {**{key: v for key, v in stages[0].items() if key != "operator"}, "stages": stages,
            "predicted": {"arena_total_bytes": p.total, "arena_head_bytes": p.head, "arena_tail_bytes": p.tail}}


def _details(p: Any) -> dict[str, Any]:
    return {"predicted_arena_bytes": p.total, "predicted_arena_head_bytes": p.head,
            "predicted_arena_tail_bytes": p.tail, "persistent_apart": bool(p.details.get("persistent_apart"))}


REST_CONVS = ("tflm", "tfmcu")


@dataclass(frozen=True, kw_only=True)
class CustomOptions:
    """What custom mode builds besides the schedule (``rewrite --mode=custom``'s flags; their defaults here).

    ``inplace``: the rest of the graph planned in place, with the overlaps ``kernels`` allow (TFLM's reference
    kernels, or the CMSIS-NN build: ``tfmcu.plan.memory_plan``); ``halo``: the halo caches
    (``tfmcu.plan.halo.HaloOptions``); ``stream_input``: the stage reads the image through the application's input
    provider; ``rest_convs``: ``tfmcu`` runs the rest's convolutions by our kernels (``convs_to_flash``)."""

    inplace: bool = False
    halo: HaloOptions = field(default_factory=HaloOptions)
    stream_input: bool = False
    rest_convs: str = "tflm"
    kernels: str = DEFAULT_KERNELS  # the kernels an in-place plan is derived for (tfmcu.plan.arena.KERNEL_SETS)
    core: str | None = None  # the core whose read orders it holds for (CMSIS-NN's Helium code on MVE_CORES; None: DSP)

    def validate(self) -> "CustomOptions":
        """``ScheduleError`` (one line, naming the flag) for a value no custom-mode rewrite takes."""
        self.halo.validate()
        if self.rest_convs not in REST_CONVS:
            raise ScheduleError(f"--rest_convs={self.rest_convs}: expected one of {', '.join(REST_CONVS)}")
        if self.kernels not in KERNEL_SETS:
            raise ScheduleError(f"--kernels={self.kernels}: expected one of {', '.join(KERNEL_SETS)}")
        return self

    @property
    def label(self) -> str:
        """How a search report names this configuration (a variant of ``CustomArenaCost``)."""
        return ", ".join(self._parts(halo=True))

    def phrase(self, plan: Plan) -> str:
        """How this configuration reads after ``plan``'s description: its halo mode only where the plan leaves a
        stage's caches to it."""
        first = next((st for st in plan.stages if st.start == 0), None)
        held = first is not None and first.passes > 1  # a first stage in passes reads its input in every pass
        parts = self._parts(halo=bool(plan.open_stages), streamed=not held)
        return f" ({', '.join(parts)})" if parts else ""

    def _parts(self, halo: bool, streamed: bool = True) -> list[str]:
        parts = [f"halo {self.halo.mode}"] if halo else []
        if self.inplace:
            helium = self.kernels == "cmsis_nn" and self.core in MVE_CORES
            parts.append(f"rest in place ({self.kernels}{', Helium' if helium else ''})")
        if self.stream_input:
            parts.append("input streamed" if streamed else "input held whole: the first stage runs in passes")
        if self.rest_convs == "tfmcu":
            parts.append("rest convs by tfmcu")
        return parts


Built = tuple[int, RewriteResult, dict[str, Any], int | None]  # cost, model, details, predicted instructions


class CustomArenaCost:
    """Cost function of ``tfmcu.plan.search``: the predicted TFLM arena of the custom-mode model built with
    ``options`` (the kernel's op data and scratch included; ``tfmcu.plan.arena``, TFLM build ``build``).
    ``count_input=False`` subtracts the input image's buffer; ``budget``: the arena budget halo mode ``auto`` fits
    its caches under.

    Every patched plan is rewritten by ``rewrite_stages`` (a single stage is a list of one), each stage with its
    halo caches: those the plan fixed (the stage-plan search's), else the configuration's halo mode (none, all,
    smallest, auto).

    ``configs``: the joint search: every patched plan is evaluated in each configuration (a variant of the search,
    ``CustomOptions``) instead of ``options`` alone. ``instructions``: a latency predictor (a model -> predicted
    instructions per Invoke, ``tfmcu.plan.latency``) that every evaluation then carries (``Evaluation.instructions``),
    for the search's ``latency`` objective and ``max_latency``.

    ``persistent_room``: a region of its own for TFLM's persistent data (the bytes a tail may have there, the
    deploy margin applied; ``Target.persistent_ram``, the STM32F405's CCM): a model whose tail fits it is predicted
    with the tail apart and costs only its head, the rest what the one arena would (the bytes the budget's region
    holds, either way).

    A plan is priced from the rewritten model as the writer decides it, before any byte is written
    (``RewriteResult.decided``: what the arena and latency predictors read of its file); the model of an evaluation
    is written only when its bytes are asked for (``Evaluation.result.model``: the search's finalists)."""

    what = "predicted TFLM arena with the TFMCU_PATCH_STAGE kernel"

    def __init__(self, data: bytes, graph: ir.Graph, where: str = "model", *,
                 options: CustomOptions = CustomOptions(), count_input: bool = True, budget: int | None = None,
                 configs: Sequence[CustomOptions] = (), build: str = "wheel",
                 instructions: Callable[[bytes | TfliteModel], int] | None = None,
                 persistent_room: int | None = None):
        self.data, self.graph, self.where = data, graph, where
        self.persistent_room = persistent_room
        self.options, self.count_input, self.budget = options.validate(), count_input, budget
        configs = {c.validate().label: c for c in configs}  # (one per label)
        self.variants: tuple[CustomOptions | None, ...] = tuple(configs.values()) or (None,)
        self.build, self.instructions = get_build(build).name, instructions
        self._source: TfliteModel | None = None
        self._caches: dict[tuple[Any, ...], HaloCaches | None] = {}
        self._persistent: dict[int, tuple[int, bool]] | None = None
        self._pools: set[int] | None = None
        self._built: dict[tuple[Any, ...], Built] = {}

    def _tail_bound(self, plan: Plan, o: CustomOptions) -> int:
        """A floor under the custom model's persistent tail: what the operators outside the stages allocate in TFLM
        (op data, parsed options, Prepare's buffers; ``tfmcu.plan.arena.op_allocations``), which the rewrite leaves
        as they are -- except the convolutions ``rest_convs=tfmcu`` may move to our kernel (counted 0)."""
        if self._persistent is None:
            tb = get_build(self.build)
            pools = self._moved_pools()
            self._persistent = {}
            for k, op in enumerate(self.graph.ops):
                self._persistent[k] = (persistent_bytes(op_allocations(self.graph, op, tb)),
                                       builtin_of(op) in FLASH_OPS or k in pools)
        stages = {k for s in plan.schedules() for k in s.stage}
        return sum(size for k, (size, movable) in self._persistent.items()
                   if k not in stages and not (movable and o.rest_convs == "tfmcu"))

    def segment_tail(self, segment: Segment) -> int:
        """An estimate of the TFLM tail a stage plan's segment adds (``tfmcu.plan.arena.operator_tail``; the
        stage-plan search weighs it): a patch stage is one TFMCU_PATCH_STAGE op with its blob and output records;
        an op per layer is TFLM's, with its output and constant records, or ours where a configuration moves it
        (``rest_convs=tfmcu``) and ours is smaller (as ``convs_to_flash`` decides)."""
        tb = get_build(self.build)
        ours = operator_tail(stage_op_alloc(tb), 2, tb)
        if segment.patched:
            return ours
        op = self.graph.ops[segment.start]
        theirs = operator_tail(op_allocations(self.graph, op, tb), 1 + const_inputs(op, set()), tb)
        if not any(self.config(v).rest_convs == "tfmcu" for v in self.variants):
            return theirs
        if segment.start in self._moved_pools():  # it joins its convolution's stage
            return 0
        return min(ours, theirs) if builtin_of(op) in FLASH_OPS else theirs

    def _moved_pools(self) -> set[int]:
        """The global pools ``rest_convs=tfmcu`` moves into their convolution's one-layer stage (``_pool_after``)."""
        if self._pools is None:
            consumers = self.graph.consumers()
            self._pools = {p for k in range(len(self.graph.ops))
                           if (p := _pool_after(self.graph, k, consumers)) is not None}
        return self._pools

    @property
    def source(self) -> TfliteModel:
        """The model, parsed once for every rewrite (each edits a structural copy: ``tfmcu.tflite.editor.fork``)."""
        if self._source is None:
            self._source = as_model(self.data, self.where)
        return self._source

    def config(self, variant: CustomOptions | None) -> CustomOptions:
        """The configuration of a variant (None: ``options``)."""
        return self.options if variant is None else variant

    def _input_bytes(self, o: CustomOptions, patched: bool = False) -> int:
        """What the cost leaves out: the image's arena buffer when not counted (a streamed stage has none)."""
        if self.count_input or (patched and o.stream_input):
            return 0
        return sum(-(-self.graph.tensors[t].nbytes // 16) * 16 for t in self.graph.inputs)

    def _predict(self, result: RewriteResult) -> Any:
        """The arena of the decided model (as its file's would be: ``predict_model_arena``); nothing is written. With
        a ``persistent_room`` the tail goes apart where it fits there."""
        stages = result.stages if get_build(self.build).cmsis_nn else None
        return self._apart(lambda apart: predict_model_arena(result.decided, build=self.build, stage=stages,
                                                             persistent_apart=apart))

    def _apart(self, predict: Callable[[bool], Any]) -> Any:
        if self.persistent_room is not None:
            p = predict(True)
            if p.tail <= self.persistent_room:
                return p
        return predict(False)

    def _cost(self, p: Any, o: CustomOptions, patched: bool = False) -> int:
        """The cost of a prediction ``p``: the arena's bytes in the budget's region (its head alone when its tail is
        apart), less the image when it is not counted."""
        apart = bool(p.details.get("persistent_apart"))
        return (p.head if apart else p.total) - self._input_bytes(o, patched)

    def _image(self, o: CustomOptions) -> str:
        return "streamed" if o.stream_input else ("counted" if self.count_input else "excluded")

    def _analytic_caches(self, plan: Plan, k: int, halo: HaloOptions, image: str) -> HaloCaches | None:
        """Stage ``k``'s halo caches in an analytic mode of ``halo`` (``all``, ``smallest``; for ``auto``, whose
        caches depend on the predicted arena, every cache: its fewest MACs), once per plan; None: none (or not
        buildable)."""
        key = (id(plan), k, halo.mode if halo.mode != "smallest" else f"smallest {halo.mac_cap}", image)
        if key not in self._caches:
            try:
                mode = HaloOptions(mode="all") if halo.mode == "auto" else halo
                self._caches[key] = select(plan.schedules()[k], mode, None, image) if halo.caches else None
            except ScheduleError:
                self._caches[key] = None
        return self._caches[key]

    def variant_macs(self, plan: Plan, variant: CustomOptions | None) -> int:
        """The plan's MACs in a variant, for the search's order: with every halo cached (``all``, and ``auto`` at
        best) in the stages whose caches the configuration chooses, each element is computed once; ``smallest``
        recomputes some halos (its MACs are known only once its caches are chosen: the recompute count stands for
        them)."""
        o = self.config(variant)
        if o.halo.mode not in ("all", "auto"):
            return plan.macs
        caches = {k: self._analytic_caches(plan, k, o.halo, self._image(o)) for k in plan.open_stages}
        return _with_caches(plan, {k: h for k, h in caches.items() if h is not None})[0]

    def evaluate(self, plan: Plan, variant: CustomOptions | None) -> Evaluation:
        """The plan's predicted arena (and instructions, with a latency predictor). Each stage's caches: the plan's
        own, or the configuration's halo mode: ``none`` recomputes, ``all`` and ``smallest`` choose their caches
        analytically, ``auto`` needs the recompute model's prediction as its reference and builds each choice it
        tries once. ``rest_convs=tfmcu`` then moves the chosen model's convolutions (the model predicted). Each
        (plan, caches, memory plan, streaming, rest convs) is built and predicted once."""
        o = self.config(variant)
        if not plan.patched:  # the per-layer model in TFLM
            p = self._apart(lambda apart: predict_arena(self.graph, model=self.data, build=self.build,
                                                        persistent_apart=apart))
            return Evaluation(plan, None, self._cost(p, o), None, _details(p), self._instructions(self.data))
        schedules = plan.schedules()
        # (a first stage of several passes reads its input in each: it holds it whole, never streams it)
        stream = o.stream_input and plan.stages[0].start == 0 and plan.schedules()[0].passes.count == 1
        built: dict[Any, RewriteResult] = {}  # halo caches -> the model: each (plan, caches) rewritten once
        predicted: dict[Any, Any] = {}  # and predicted at most once

        def build(caches: tuple[HaloCaches | None, ...]) -> RewriteResult:
            key = _caches_key(caches)
            if key not in built:
                built[key] = rewrite_stages(self.source, self.graph, list(zip(schedules, caches)), self.where,
                                            inplace=o.inplace, streamed_input=stream, kernels=o.kernels,
                                            core=o.core)
            return built[key]

        def predict(caches: tuple[HaloCaches | None, ...]) -> Any:
            key = _caches_key(caches)
            if key not in predicted:
                predicted[key] = self._predict(build(caches))
            return predicted[key]

        image = self._image(o)
        chosen: list[HaloCaches | None] = []
        for k, (s, seg) in enumerate(zip(schedules, plan.stages)):
            halo = seg.halo_with(o.halo)
            h: HaloCaches | None = None
            if halo.mode == "auto":  # (the later stages recompute while it is chosen)
                before, later = tuple(chosen), (None,) * (len(schedules) - k - 1)
                h = self._auto_caches(s, o, image, lambda c, a=before, z=later: predict((*a, c, *z)))
            elif halo.caches:  # all, smallest: analytic choices (smallest's MAC cap not met: the user's to change)
                h = self._analytic_caches(plan, k, halo, image) or select(s, halo, None, image)
            chosen.append(h)
        caches = tuple(chosen)
        key = (id(plan), _caches_key(caches), o.inplace, stream, o.rest_convs, o.kernels, o.core)
        if key not in self._built:
            result = build(caches)
            configured = {k: caches[k] for k in plan.open_stages if caches[k] is not None}
            extra: dict[str, Any] = {"mac_overhead_exact": round(_with_caches(plan, configured)[1], 6)}
            for h in configured.values():  # (a plan leaves one stage's caches to the configuration: a single stage)
                extra["halo"] = h.to_dict()
            extra.update(plan.stage_plan_field())
            if o.rest_convs == "tfmcu":
                result, extra["rest_convs"] = self._rest_convs(result, o)
                p = self._predict(result)
            else:
                p = predict(caches)
            self._built[key] = (self._cost(p, o, stream), result,
                                {**_details(p), "ops": result.ops_after, **extra}, self._instructions(result.decided))
        cost, result, details, ins = self._built[key]
        return Evaluation(plan, variant, cost, result, dict(details), ins)

    def _rest_convs(self, result: RewriteResult, o: CustomOptions) -> tuple[RewriteResult, dict[str, int]]:
        """``rest_convs=tfmcu``: the rewritten model's remaining convolutions by our kernels (``convs_to_flash``),
        and what moved."""
        flash = convs_to_flash(result.decided, self.where, inplace=o.inplace, kernels=o.kernels, stages=result.stages,
                               build=self.build if self.build.startswith("cortex-m") else "cortex-m", core=o.core)
        moved = sum(e["tflm_persistent_bytes"] - e["tfmcu_persistent_bytes"] for e in flash.replaced)
        return (RewriteResult(flash.decided, result.ops_before, result.ops_after, result.new_tensors, result.schedule,
                              flash.stages),
                {"replaced": len(flash.replaced), "kept": len(flash.kept), "tflm_persistent_bytes_moved": moved})

    def _instructions(self, model: bytes | TfliteModel) -> int | None:
        return None if self.instructions is None else int(self.instructions(model))

    def _auto_caches(self, s: PatchSchedule, o: CustomOptions, image: str,
                     predict: Callable[[HaloCaches | None], Any]) -> HaloCaches:
        """Halo ``auto``'s caches. Their analytic budget: the arena budget less what TFLM adds to the analytic peak
        (persistent data, alignment, the rest of the graph's plan) in the recompute model's prediction; lowered by
        any overshoot of the prediction and tried again (at most four choices). Without a budget, the arena's head
        (activations and scratch) stays within the recompute model's: only the cache tables' three tensor records
        are added to the tail. ``predict`` builds each choice's model once (the recompute model: None)."""
        recompute = predict(None)
        analytic = halo_caches(s).peak(image)
        if self.budget is not None:
            analytic = self.budget - max(self._cost(recompute, o, True) - analytic, 0)
        for _ in range(4):
            try:
                caches = select(s, o.halo, analytic, image)
            except ScheduleError:  # not even the recompute schedule fits: no cache
                caches = halo_caches(s)
            assert caches is not None
            p = predict(caches)
            over = (p.head - recompute.head if self.budget is None else self._cost(p, o, True) - self.budget)
            if over <= 0 or not (caches.cache_rows or caches.cache_cols):
                break
            analytic -= over
        return caches

    def lower_bound(self, plan: Plan, variant: CustomOptions | None) -> int:
        """A floor under the predicted arena. A stage whose caches the plan fixed: its analytic peak, unless it
        reads the image (which the configuration may stream: 0). A stage whose caches the configuration chooses:
        its analytic peak (input + stage output + one patch's working set <= input + output + scratch; with the
        caches of an analytic halo mode, their peak), and, for a disjoint plan of the rest, the rest's analytic peak
        (<= its planned head), on top of the persistent tail of the ops outside the stages (not with a
        ``persistent_room``: a tail apart costs nothing)."""
        o = self.config(variant)
        bound, open_stages = 0, plan.open_stages
        for k, seg in enumerate(plan.stages):
            if k not in open_stages:
                bound = max(bound, seg.peak if seg.start > 0 else 0)
                continue
            s = plan.schedules()[k]
            counted = self.count_input and not o.stream_input
            stage = s.stage_peak_bytes if counted else s.stage_peak_bytes - s.input_bytes
            if o.halo.caches:  # caches can make the stage smaller than the recompute schedule's
                h = self._analytic_caches(plan, k, o.halo, self._image(o)) if o.halo.mode == "all" else None
                stage = 0 if h is None else h.stage_peak(self._image(o))  # (the other modes: costly to know)
            if not o.inplace:  # an in-place plan of the rest can go below its analytic peak
                stage = max(stage, s.rest_peak_bytes)
            bound = max(bound, stage + (0 if self.persistent_room is not None else self._tail_bound(plan, o)))
        return bound


def _caches_key(caches: Sequence[HaloCaches | None]) -> tuple[Any, ...]:
    return tuple(None if h is None else (h.cache_rows, h.cache_cols) for h in caches)


def _with_caches(plan: Plan, caches: dict[int, HaloCaches]) -> tuple[int, float]:
    """The plan's MACs and MAC overhead with halo caches on some of its stages (by index; exact MACs): its own
    figures without any."""
    if not caches:
        return plan.macs, plan.mac_overhead
    g = plan.graph
    base = sum(ir.op_macs(g, op) for op in g.ops)
    extra = 0
    for k, seg in enumerate(plan.stages):
        if k in caches:
            extra += caches[k].stage_macs_exact - caches[k].schedule.stage_macs
        else:
            extra += seg.macs - sum(ir.op_macs(g, g.ops[i]) for i in range(seg.start, seg.stop))
    return base + extra, extra / base if base else 0.0
