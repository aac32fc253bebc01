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
* ``tfmcu.stage.cost``: that prediction as the search's cost function (``CustomArenaCost``), for the model
  ``CustomOptions`` (in-place rest, halo caches, streamed input, the rest's convolutions) asks for.

The op's format (blob and options) and the kernel's memory arithmetic live in ``tfmcu.tflite.patch_stage_format``. The TFLM kernel
(``tflm_patch_kernels/tflm``) runs such a model whole in TFLM (``tfmcu.runtime.tflm_host``); ``HostRunner``
(``tfmcu.runtime.host``) runs the stage through ctypes for TF Lite comparisons and kernel tests.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu import abi
from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_model, from_tflite
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.ops import LayerSpec, kernel_op, params_from_words
from tfmcu.kernels.pack import PackedStage, cache_sizes, input_window_bytes, pack_stage, stage_blob
from tfmcu.plan import regions
from tfmcu.plan.arena import ALIGN, MVE_CORES, builtin_of, get_build, op_allocations, persistent_bytes, predict_arena
from tfmcu.plan.halo import HaloCaches, halo_caches
from tfmcu.plan.memory_plan import with_offline_plan
from tfmcu.plan.placer import align_up
from tfmcu.plan.regions import PatchSchedule, ScheduleError
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


def pool_after(graph: ir.Graph, k: int, consumers: dict[str, list[int]]) -> int | None:
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
        pool = pool_after(graph, k, consumers)
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
