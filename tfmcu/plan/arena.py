"""Predict TFLM's tensor arena for a model, without running TFLM.

``predict_arena(graph)`` takes an IR graph lowered from a .tflite (``tfmcu.graph.from_tflite``) or built by a
rewriter in the same terms, and returns the arena the ``tflite-micro`` PyPI wheel (0.dev20261023182759, 64-bit
host, ``RecordingMicroAllocator`` as in ``tfmcu.runtime.tflm.measure_arena``) allocates for it:

* **head** (non-persistent: planned activations and scratch buffers) — an exact re-implementation of TFLM's
  ``GreedyMemoryPlanner`` as ``MicroAllocator::CommitStaticMemoryPlan`` drives it (``plan_head``):
  - one buffer per non-constant, non-variable tensor with bytes > 0, in tensor-index order, then one per scratch
    buffer request in request order; sizes rounded up to 16 (``MicroArenaBufferAlignment``);
  - lifetimes in "allocation scopes" (``AllocationInfoBuilder::MarkAllocationLifetimes``): graph inputs are created
    (and used) at scope 0, operator i runs at scope i + 1 (creates its outputs, uses its inputs and outputs), graph
    outputs live until the last scope; a scratch buffer lives during its operator's scope;
  - placement: buffers sorted by size, descending, with a stable bubble sort of the list *reversed* (so among equal
    sizes the highest index goes first); each is put at the lowest offset whose gap, among the buffers already placed
    that overlap it in time, is large enough (offset-ordered list, first fit); head = max(offset + size).
* **tail** (persistent) — the sequence of persistent allocations (each aligned *down* from the arena end), replayed
  with the struct sizes of the wheel (table ``ABI`` below): allocator objects, ``SubgraphAllocations``,
  ``TfLiteEvalTensor`` per tensor (constants included), ``NodeAndRegistration`` per operator, each operator's parsed
  builtin options, each kernel's ``OpData`` (Init), per-channel quantization arrays (Prepare), scratch buffer
  handles, and the persistent ``TfLiteTensor`` (+ quantization) of each graph input / output.

What the IR does not carry comes from optional op attributes (``from_tflite`` records them when it lowers a model,
``annotate_from_tflite`` adds them to other graphs, ``predict_arena(graph, model=...)`` does that itself;
``predict_model_arena(model)`` lowers a .tflite and predicts it): ``tflite_inputs`` / ``tflite_outputs`` (raw
operator tensor indices), ``tflite_tensor_index`` ({IR tensor name: index}), ``tflite_num_tensors``,
``weight_scales`` and ``weights_dtype`` (conv / fully connected weights). Without them:

* tensor count = activation tensors + constant inputs per op type (``CONST_INPUTS``); ops with equal
  ``attrs["weights_key"]`` share weights and biases, otherwise each op counts its own (a shared constant is then
  over-counted by 24 B per extra use);
* tensor order (ties in the greedy planner) = IR order (the TFLite converter numbers activations in execution
  order, which ``from_tflite`` preserves; a rewriter that appends tensors in its op order does too);
* FULLY_CONNECTED int8/int16 weights are per-channel (the default of TF >= 2.16 converters).

The custom op TFMCU_PATCH_STAGE (our TFLM kernel) gets its op data and its scratch request
(``tfmcu.tflite.patch_stage_format.kernel_memory``). TFLM's custom op TFLite_Detection_PostProcess (the end of a
detector, ``tfmcu.tflite.detection_postprocess``) gets its OpData and its 11 scratch requests. Other unknown op types
get no builtin data, no OpData and no scratch (listed in ``details["unmodelled_ops"]``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_model
from tfmcu.plan import cmsis_nn
from tfmcu.plan.placer import Buffer, align_up, place
from tfmcu.tflite import offline_plan
from tfmcu.tflite.detection_postprocess import OP_NAME as _DPP_NAME
from tfmcu.tflite.detection_postprocess import PostprocessError, read_postprocess_options
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP, kernel_memory, stage_of_attrs, streamed_scratch
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import TfliteModel, as_model

ALIGN = 16  # MicroArenaBufferAlignment(): planned buffer sizes, kernel persistent buffers, scratch buffers.
DETECTION_POSTPROCESS = f"custom:{_DPP_NAME}"  # TFLM's TFLite_Detection_PostProcess, as builtin_of names it

# ----------------------------------------------------------------------------------------------------------------
# THE table of TFLM constants (bytes). Everything predict_arena adds to the tail comes from here.
#
# Source: sizeof/alignof compiled from the tflite-micro source (github tensorflow/tflite-micro @ 90b983c, Aug 2026)
# for x86-64 with the wheel's defines (-DTF_LITE_STATIC_MEMORY -DUSE_TFLM_COMPRESSION), by a small C++ file that
# includes the kernel and allocator headers. The wheel (built later, from 8f6596d) differs in one place found so far:
# TfLiteFullyConnectedParams is 32 B with 8-byte alignment there (source: 16 B, 4-aligned).
# Calibration: predicted vs measured (tfmcu.runtime.tflm.measure_arena) tail, head and every print_allocations line
# (used / requested / count) on 40 one-op-type models (1, 2, 3 ops of CONV_2D, DEPTHWISE_CONV_2D, ADD,
# CONCATENATION, MAX/AVERAGE_POOL_2D, PAD, SLICE, STRIDED_SLICE, FULLY_CONNECTED, MUL+SOFTMAX, MEAN, QUANTIZE,
# DEQUANTIZE), a small convnet, a residual net (+RESHAPE, SOFTMAX), a float-I/O model (SHAPE, STRIDED_SLICE, PACK,
# RESHAPE), a two-input model, an unrolled 4x4 patch graph (69 ops) and MobileNetV2 0.35/96 and 1.0/224: all exact.
# Entries marked (src) are from the source only (no model here used them).
# ----------------------------------------------------------------------------------------------------------------
ABI: dict[str, tuple[int, int]] = {  # struct: (size, alignment)
    # once per interpreter, in this order (RecordingMicroAllocator::Create, MicroAllocator::StartModelAllocation);
    # not itemised by print_allocations: their sum (488 B) is the tail of a model without tensors and ops.
    "RecordingSingleArenaBufferAllocator": (104, 8),
    "GreedyMemoryPlanner": (72, 8),
    "RecordingMicroAllocator": (272, 8),
    "MicroBuiltinDataAllocator": (16, 8),  # vtable + allocator pointer
    "SubgraphAllocations": (24, 8),  # per subgraph: tensors, nodes, compressed-tensor list
    # 'TfLiteEvalTensor data': one array, 24 B per tensor of the subgraph (constants included)
    "TfLiteEvalTensor": (24, 8),
    # 'NodeAndRegistration struct': one array, TfLiteNode (56 B in the static-memory build) + registration pointer
    "NodeAndRegistration": (64, 8),
    # FinishModelAllocation: one array, 8 B per scratch buffer request (unrecorded)
    "ScratchBufferHandle": (8, 8),
    # MicroInterpreter::AllocateTensors, per direction: a pointer array via AllocatePersistentBuffer
    # ('Persistent buffer data', 16-aligned), then per tensor 'Persistent TfLiteTensor data' (64 B, static-memory
    # TfLiteTensor) and, if it is quantized, 'Persistent TfLiteTensor quantization data':
    # TfLiteAffineQuantization (24 B) + zero-point TfLiteIntArray (4 B + 4 B per channel).
    "TfLiteTensor*": (8, 16),
    "TfLiteTensor": (64, 8),
    "TfLiteAffineQuantization": (24, 8),
    "TfLiteIntArray": (4, 4),
}

# Parsed builtin options (MicroBuiltinDataAllocator -> persistent, unrecorded), one per operator, in operator order.
# Operators whose parser allocates nothing (PAD, PADV2, SLICE, QUANTIZE, DEQUANTIZE, activations, ...) are absent.
BUILTIN_DATA: dict[str, tuple[int, int]] = {  # builtin operator: (size, alignment)
    "CONV_2D": (28, 4),  # TfLiteConvParams
    "DEPTHWISE_CONV_2D": (28, 4),  # TfLiteDepthwiseConvParams
    "AVERAGE_POOL_2D": (40, 4), "MAX_POOL_2D": (40, 4), "L2_POOL_2D": (40, 4),  # TfLitePoolParams
    "ADD": (8, 4),  # TfLiteAddParams
    "MUL": (4, 4),  # TfLiteMulParams
    "CONCATENATION": (8, 4),  # TfLiteConcatenationParams
    "RESHAPE": (36, 4),  # TfLiteReshapeParams
    "MEAN": (1, 1), "SUM": (1, 1), "REDUCE_MAX": (1, 1), "REDUCE_MIN": (1, 1),  # TfLiteReducerParams
    "FULLY_CONNECTED": (32, 8),  # TfLiteFullyConnectedParams: 32 B / 8-aligned in the wheel (calibrated)
    "SOFTMAX": (4, 4),  # TfLiteSoftmaxParams
    "STRIDED_SLICE": (24, 4),  # TfLiteStridedSliceParams
    "SHAPE": (4, 4),  # TfLiteShapeParams
    "PACK": (8, 4),  # TfLitePackParams
    # (src)
    "SUB": (8, 4), "DIV": (4, 4), "SQUEEZE": (36, 4), "LEAKY_RELU": (4, 4), "UNPACK": (8, 4), "SPLIT": (4, 4),
    "GATHER": (8, 4), "TRANSPOSE_CONV": (20, 4), "RESIZE_NEAREST_NEIGHBOR": (2, 1), "RESIZE_BILINEAR": (2, 1),
    "DEPTH_TO_SPACE": (4, 4), "SPACE_TO_DEPTH": (4, 4), "CAST": (8, 4), "ARG_MAX": (4, 4), "ARG_MIN": (4, 4),
}

# Kernel OpData from Init (context->AllocatePersistentBuffer: 'Persistent buffer data', 16-aligned), bytes per
# operator. Operators registered with a null init (SLICE, RESHAPE, SHAPE, PACK, TRANSPOSE, SPLIT, ...) are absent.
# Prepare adds, also 16-aligned: CONV_2D / DEPTHWISE_CONV_2D two int32 arrays of output channels (per-channel
# multiplier and shift, always); FULLY_CONNECTED the same when its weights are per-channel quantized; int16
# SOFTMAX two 513-entry int16 lookup tables (op_allocations).
OP_DATA: dict[str, int] = {
    "CONV_2D": 80,  # OpDataConv: 72 + weights/bias decompression scratch indices (USE_TFLM_COMPRESSION)
    "DEPTHWISE_CONV_2D": 80,  # OpDataConv
    "FULLY_CONNECTED": 72,  # OpDataFullyConnected: 64 + compression indices
    "ADD": 60,  # OpDataAdd
    "MUL": 36,  # OpDataMul
    "AVERAGE_POOL_2D": 32, "MAX_POOL_2D": 32,  # OpDataPooling
    "PAD": 56, "PADV2": 56,  # pad OpData: PadParams (52) + output zero point
    "CONCATENATION": 80,  # OpData: ConcatenationParams (40) + compression scratch_indices[10]
    "STRIDED_SLICE": 84,  # StridedSliceParams
    "QUANTIZE": 32,  # OpDataQuantizeReference
    "DEQUANTIZE": 32,  # DequantizeOpData
    "MEAN": 44, "SUM": 44, "REDUCE_MAX": 44, "REDUCE_MIN": 44,  # OpDataReduce
    "SOFTMAX": 80,  # SoftmaxParams
    # (src)
    "SUB": 52, "RELU": 28, "RELU6": 8, "LOGISTIC": 16, "TANH": 16, "HARD_SWISH": 20, "LEAKY_RELU": 24,
    "PRELU": 28,
    # TFLM's custom op (detection_postprocess.cc OpData: no pointers, the source's size; calibrated on a detector)
    DETECTION_POSTPROCESS: 112,
}

# ----------------------------------------------------------------------------------------------------------------
# The TFLM builds the predictor knows. "wheel" (the default): the PyPI wheel on x86-64, tables above (calibrated,
# RecordingMicroAllocator, compression on). "host" and "cortex-m": TFLM built from source here (90b983c,
# -DTF_LITE_STATIC_MEMORY, no compression) for x86-64 (tfmcu_tflm_run, RecordingMicroInterpreter) and for Cortex-M
# (firmware: MicroInterpreter, plain MicroAllocator; 4-byte pointers, arm-none-eabi's short enums), with the sizes
# compiled by tools/gen/gen_tflm_abi.py into tflm_abi.json.
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TflmBuild:
    name: str
    abi: dict[str, tuple[int, int]]
    builtin_data: dict[str, tuple[int, int]]
    op_data: dict[str, int]
    pointer_bytes: int
    recording: bool  # RecordingMicroAllocator (host tools) or MicroAllocator (firmware)
    what: str
    cmsis_nn: bool = False  # TFLM's CMSIS-NN kernels + the patch executor's CMSIS-NN backend (tfmcu.plan.cmsis_nn)
    mve: bool = False  # CMSIS-NN built for a core with Helium (its *_get_buffer_size_mve buffers)
    dsp: bool = True  # CMSIS-NN built with the DSP extension (else its plain C code and buffers)


def _json_build(name: str, profile: str, pointer_bytes: int, recording: bool, what: str,
                cmsis_nn: bool = False, mve: bool = False, dsp: bool = True) -> TflmBuild:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tflm_abi.json")) as f:
        table = json.load(f)
    t = table[profile]
    abi = {k: (v[0], v[1]) for k, v in t["abi"].items()}
    abi["TfLiteTensor*"] = (abi["TfLiteTensor*"][0], ALIGN)  # the array comes from AllocatePersistentBuffer
    op_data = dict(t["op_data"])
    if cmsis_nn:  # the CMSIS-NN kernel variants' own OpData (the other kernels are the reference ones)
        op_data.update(table[profile + "-cmsis-nn"]["op_data"])
    return TflmBuild(name, abi, {k: (v[0], v[1]) for k, v in t["builtin_data"].items()}, op_data,
                     pointer_bytes, recording, what, cmsis_nn, mve, dsp)


BUILDS: dict[str, TflmBuild] = {
    "wheel": TflmBuild("wheel", ABI, BUILTIN_DATA, OP_DATA, 8, True, "the PyPI tflite-micro wheel, x86-64"),
    "host": _json_build("host", "x86_64", 8, True,
                        "TFLM built from source (the pinned archive), x86-64 (tfmcu_tflm_run)"),
    "cortex-m": _json_build("cortex-m", "cortex-m", 4, False,
                            "TFLM built from source (the pinned archive) for Cortex-M (arm-none-eabi, "
                            "MicroInterpreter)"),
    "cortex-m-cmsis-nn": _json_build("cortex-m-cmsis-nn", "cortex-m", 4, False,
                                     "TFLM + CMSIS-NN (pinned sources) for Cortex-M4/M7 (TFLM's CMSIS-NN kernels, "
                                     "the patch executor's CMSIS-NN backend)", cmsis_nn=True),
    # the same sources for a core with Helium: CMSIS-NN's MVE paths, whose buffers differ (the structs do not)
    "cortex-m-cmsis-nn-mve": _json_build("cortex-m-cmsis-nn-mve", "cortex-m", 4, False,
                                         "TFLM + CMSIS-NN (pinned sources) for the Cortex-M55 (CMSIS-NN's Helium "
                                         "paths)", cmsis_nn=True, mve=True),
    # and for a core without the DSP extension (the Cortex-M3, M0+): CMSIS-NN's plain C code, its buffers
    "cortex-m-cmsis-nn-nodsp": _json_build("cortex-m-cmsis-nn-nodsp", "cortex-m", 4, False,
                                           "TFLM + CMSIS-NN (pinned sources) for a core without the DSP extension "
                                           "(CMSIS-NN's plain C paths)", cmsis_nn=True, dsp=False),
}

# Cores with Helium (MVE): CMSIS-NN runs its MVE code there (tfmcu.plan.cmsis_nn's ``mve`` buffers).
MVE_CORES = ("cortex-m55",)
# Cores without the DSP extension (Armv6-M, and the Armv7-M Cortex-M3): CMSIS-NN runs its plain C code there, and the
# patch executor's CMSIS-NN backend has no folded 1x1 product (cmsis_nn/conv1x1_folded.c needs ARM_MATH_DSP).
NO_DSP_CORES = ("cortex-m0plus", "cortex-m3")


# The kernel sets a firmware links (deploy/fit/rewrite --kernels): TFLM's CMSIS-NN kernels with the patch
# executor's CMSIS-NN backend, or TFLM's reference kernels with the executor's portable C kernels.
KERNEL_SETS = ("cmsis_nn", "reference")
DEFAULT_KERNELS = "cmsis_nn"  # what these Arm targets run by default (deploy, fit, rewrite --inplace)


def mcu_build(kernels: str, core: str | None = None) -> str:
    """The Cortex-M TFLM build (BUILDS) that links ``kernels`` (KERNEL_SETS) on ``core`` (None: a core with the DSP
    extension and without Helium; CMSIS-NN's buffers differ on ``MVE_CORES`` and ``NO_DSP_CORES``)."""
    if kernels != "cmsis_nn":
        return "cortex-m"
    if core in MVE_CORES:
        return "cortex-m-cmsis-nn-mve"
    return "cortex-m-cmsis-nn-nodsp" if core in NO_DSP_CORES else "cortex-m-cmsis-nn"


def get_build(build: str | TflmBuild) -> TflmBuild:
    if isinstance(build, TflmBuild):
        return build
    if build not in BUILDS:
        raise ValueError(f"unknown TFLM build {build!r}; known: {', '.join(BUILDS)}")
    return BUILDS[build]


# Scratch buffers requested in Prepare (head side, planned like tensors, living during their operator):
# MEAN / SUM int8/int16: int32 accumulator per output element, then input iterator (4 B x input rank) and resolved
# axes (4 B x axes); float: the last two only. REDUCE_MAX/MIN: iterator and axes. Int4 weights (CONV_2D,
# FULLY_CONNECTED): the unpacked filter. (op_allocations)

# Constant input tensors an operator usually has (the tensor count when the IR records no TFLite indices).
CONST_INPUTS: dict[str, int] = {
    "PAD": 1, "PADV2": 2, "MIRROR_PAD": 1, "MEAN": 1, "SUM": 1, "REDUCE_MAX": 1, "REDUCE_MIN": 1, "RESHAPE": 1,
    "SLICE": 2, "STRIDED_SLICE": 3, "TRANSPOSE": 1, "GATHER": 1, "SPLIT": 1,
}

# IR op type -> TFLite builtin operator (when the op has no attrs["tflite_op"]).
_IR_TO_BUILTIN = {
    ir.CONV: "CONV_2D", ir.DEPTHWISE: "DEPTHWISE_CONV_2D", ir.AVG_POOL: "AVERAGE_POOL_2D",
    ir.MAX_POOL: "MAX_POOL_2D", ir.PAD: "PAD", ir.ADD: "ADD", ir.SUB: "SUB", ir.MUL: "MUL",
    ir.CONCAT: "CONCATENATION", ir.QUANTIZE: "QUANTIZE", ir.DEQUANTIZE: "DEQUANTIZE", ir.MEAN: "MEAN",
    ir.FULLY_CONNECTED: "FULLY_CONNECTED", ir.RESHAPE: "RESHAPE", ir.SOFTMAX: "SOFTMAX",
}
_ACTIVATION_TO_BUILTIN = {"relu": "RELU", "relu6": "RELU6", "sigmoid": "LOGISTIC", "tanh": "TANH",
                          "hard_swish": "HARD_SWISH", "leaky_relu": "LEAKY_RELU", "prelu": "PRELU", "elu": "ELU"}
_QUANTIZED_DTYPES = ("int8", "uint8", "int16", "int4")

# Names of print_allocations' per-type lines (the keys of ArenaStats.by_type).
EVAL_TENSORS = "TfLiteEvalTensor data"
PERSISTENT_TENSORS = "Persistent TfLiteTensor data"
QUANTIZATION = "Persistent TfLiteTensor quantization data"
PERSISTENT_BUFFERS = "Persistent buffer data"
NODES = "NodeAndRegistration struct"


# ============================================================================= greedy planner
def greedy_plan(buffers: Sequence[Buffer]) -> int:
    """Place ``buffers`` (in TFLM's AddBuffer order) exactly as ``GreedyMemoryPlanner::CalculateOffsetsIfNeeded``
    does; sets each ``offset`` and returns the planned size (max offset + size).

    TFLM's order: offline-planned buffers first (at their fixed offsets), then the others by size, descending, in a
    stable sort of the list *reversed* (among equal sizes the highest index goes first); each then goes to the
    lowest offset that fits among the buffers already placed (``tfmcu.plan.placer.place``: the same layout as
    TFLM's walk over its offset-ordered list)."""
    n = len(buffers)
    fixed = [i for i in range(n) if buffers[i].fixed >= 0]
    order = fixed + sorted((i for i in range(n - 1, -1, -1) if buffers[i].fixed < 0), key=lambda i: -buffers[i].size)
    return place([buffers[i] for i in order])


# ============================================================================= model description
@dataclass
class OpAlloc:
    """What one operator allocates (TFLite builtin name and sizes in bytes)."""
    builtin: str
    builtin_data: tuple[int, int] | None  # (size, alignment) of the parsed options, or None
    op_data: int | None  # Init: bytes of OpData (16-aligned), or None
    prepare: list[int] = field(default_factory=list)  # Prepare: persistent buffers (16-aligned), in order
    scratch: list[int] = field(default_factory=list)  # Prepare: scratch buffer requests (bytes), in order
    modelled: bool = True


@dataclass
class ArenaPrediction:
    head: int
    tail: int
    total: int
    details: dict[str, Any] = field(default_factory=dict)
    # the memory timeline: per operator (graph order), its TFLite builtin and the head's bytes in use during its
    # scope (the highest end, in TFLM's plan, of a buffer alive then); the tail is allocated before the first
    timeline: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"head": self.head, "tail": self.tail, "total": self.total, "details": self.details}


def builtin_of(op: ir.Op) -> str:
    """The TFLite builtin operator an IR op is (its ``tflite_op`` when it was lowered from a .tflite)."""
    typ = op.attrs.get("tflite_op")
    if typ:
        return str(typ)
    if op.type == ir.ACTIVATION:
        return _ACTIVATION_TO_BUILTIN.get(op.activation, op.activation.upper())
    return _IR_TO_BUILTIN.get(op.type, op.type.upper())


def _elements(graph: ir.Graph, name: str) -> int:
    return graph.tensors[name].size


def op_allocations(graph: ir.Graph, op: ir.Op, build: str | TflmBuild = "wheel", stage: Any = None) -> OpAlloc:
    """Persistent allocations and scratch requests of one operator in TFLM's reference kernels, or its CMSIS-NN
    kernels for a ``cmsis_nn`` build (``build``: which TFLM, see BUILDS). ``stage``: the op's ``PackedStage`` when
    it is a TFMCU_PATCH_STAGE op of a CMSIS-NN build (its kernel buffer depends on the tiles)."""
    tb = get_build(build)
    b = builtin_of(op)
    in_dtype = graph.tensors[op.inputs[0]].dtype if op.inputs else "int8"
    alloc = OpAlloc(b, tb.builtin_data.get(b), tb.op_data.get(b))
    if b in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        # ConvPrepare / DepthwiseConvPrepare: per-channel multiplier and shift, int32 x output channels (always,
        # float models included).
        alloc.prepare = [4 * op.out_channels, 4 * op.out_channels]
        if op.attrs.get("weights_dtype") == "int4":
            alloc.scratch = [op.weights]  # unpacked int4 filter
        elif tb.cmsis_nn and in_dtype == "int8":  # CMSIS-NN's buffer, requested when not 0 (cmsis_nn/conv.cc)
            need = _cmsis_nn_buffer(graph, op, b, tb.mve, tb.dsp)
            if need > 0:
                alloc.scratch = [need]
    elif b == "AVERAGE_POOL_2D" and tb.cmsis_nn and in_dtype == "int8":
        need = cmsis_nn.avgpool_buffer_bytes(op.out_channels or graph.tensors[op.inputs[0]].shape[-1], tb.mve,
                                             tb.dsp)
        alloc.scratch = [need] if need > 0 else []
    elif b == "FULLY_CONNECTED":
        scales = op.attrs.get("weight_scales")
        per_channel = scales > 1 if scales is not None else in_dtype in ("int8", "int16")
        if per_channel and in_dtype != "float32":
            alloc.prepare = [4 * op.out_channels, 4 * op.out_channels]
        if op.attrs.get("weights_dtype") == "int4":
            alloc.scratch = [op.weights]
        elif tb.cmsis_nn and in_dtype == "int8" and len(graph.tensors[op.outputs[0]].shape) == 2:
            # cmsis_nn/fully_connected.cc: CMSIS-NN's buffer for a [N, K] output, requested when not 0 (with
            # Helium); a higher-rank output over a depth of a multiple of 4 runs as a 1x1 convolution (not modelled)
            need = cmsis_nn.fully_connected_buffer_bytes(op.out_channels, tb.mve)
            alloc.scratch = [need] if need > 0 else []
    elif b in ("MEAN", "SUM"):
        rank = len(graph.tensors[op.inputs[0]].shape) if op.inputs else 4
        axes = op.attrs.get("axes")
        num_axis = len(axes) if axes is not None else 2
        if in_dtype in ("int8", "int16"):
            alloc.scratch.append(4 * _elements(graph, op.outputs[0]))  # int32 accumulator per output element
        alloc.scratch += [4 * rank, 4 * num_axis]  # input iterator, resolved axes
    elif b in ("REDUCE_MAX", "REDUCE_MIN"):
        rank = len(graph.tensors[op.inputs[0]].shape) if op.inputs else 4
        axes = op.attrs.get("axes")
        alloc.scratch = [4 * rank, 4 * (len(axes) if axes is not None else 2)]
    elif b == f"custom:{PATCH_STAGE_OP}":
        # our kernel (tflm_patch_kernels/tflm): one op data from Init, the stage's exact scratch from Prepare; the
        # CMSIS-NN backend's kernel buffer after the patch buffers
        if isinstance(stage, dict):  # several TFMCU_PATCH_STAGE ops: each one's PackedStage by TFLite op index
            stage = stage.get(op.src_index)
        buffer = (cmsis_nn.stage_scratch_bytes(stage, tb.mve, tb.dsp) if tb.cmsis_nn and stage is not None
                  else None)
        try:
            options = stage_of_attrs(op.attrs)
            op_data, scratch = kernel_memory(options, pointer_bytes=tb.pointer_bytes)
        except (ValueError, KeyError, TypeError):
            alloc.modelled = False
        else:
            if tb.cmsis_nn:
                if buffer is None:
                    alloc.modelled = False
                else:
                    scratch = streamed_scratch(options, buffer)
            alloc.op_data, alloc.scratch = op_data, [scratch] if scratch > 0 else []
    elif b == DETECTION_POSTPROCESS:
        scratch = _detection_postprocess_scratch(graph, op)
        if scratch is None or alloc.op_data is None:
            alloc.modelled = False
        else:
            alloc.scratch = scratch
    elif b == "SOFTMAX" and in_dtype == "int16":
        alloc.prepare = [2 * 513, 2 * 513]  # (src) exp and 1/(1+x) int16 lookup tables, LUTSize<int16_t>() = 513
    elif b not in tb.builtin_data and b not in tb.op_data and b not in _NO_ALLOC:
        alloc.modelled = False
    return alloc


def _detection_postprocess_scratch(graph: ir.Graph, op: ir.Op) -> list[int] | None:
    """The 11 scratch buffers TFLM's TFLite_Detection_PostProcess requests in Prepare (kernels/
    detection_postprocess.cc), in request order, from its box encodings [1, N, 4], its class predictions [1, N, C]
    and its options (max_detections M, num_classes K): active candidates N, decoded boxes 16N, scores 4NC, score
    buffer 4N, keep scores 4N, scores after regular NMS 4MN, sorted values 4MN, keep indices 4N, sorted indices
    4MN, buffer 4 max(K, M) N, selected 4 min(N, M) N. (Its three temporary input tensors are freed in Prepare.)
    None when the op's inputs or options are not those (the op is then unmodelled)."""
    try:
        opts = read_postprocess_options(op.attrs["custom_options"])
        m, k = int(opts["max_detections"]), int(opts["num_classes"])
        boxes = graph.tensors[op.inputs[0]].shape
        scores = graph.tensors[op.inputs[1]].shape
    except (PostprocessError, KeyError, IndexError, TypeError, ValueError):
        return None
    if len(boxes) != 3 or len(scores) != 3:
        return None
    n = int(boxes[1])
    return [n, 16 * n, 4 * int(scores[1]) * int(scores[2]), 4 * n, 4 * n, 4 * m * n, 4 * m * n, 4 * n,
            4 * m * n, 4 * max(k, m) * n, 4 * min(n, m) * n]


def _cmsis_nn_buffer(graph: ir.Graph, op: ir.Op, builtin: str, mve: bool = False, dsp: bool = True) -> int:
    """The buffer TFLM's CMSIS-NN CONV_2D / DEPTHWISE_CONV_2D requests in Prepare (tfmcu.plan.cmsis_nn; ``mve``:
    Helium's, ``dsp`` False: plain C's), with TFLM's padding (the top / left of TF's SAME split)."""
    in_shape = graph.tensors[op.inputs[0]].shape
    out_shape = graph.tensors[op.outputs[0]].shape
    pad = (op.padding[0], op.padding[2])
    dims = dict(mve=mve, stride=tuple(op.stride), in_hw=(in_shape[1], in_shape[2]), out_w=out_shape[2]) \
        if len(in_shape) == 4 and len(out_shape) == 4 else dict(mve=mve)
    if builtin == "CONV_2D":
        return cmsis_nn.conv_buffer_bytes(op.kernel[0], op.kernel[1], in_shape[-1], pad, tuple(op.dilation),
                                          **dims)
    return cmsis_nn.depthwise_buffer_bytes(op.kernel[0], op.kernel[1], in_shape[-1], op.out_channels, pad,
                                           tuple(op.dilation), dsp=dsp, **dims)


# Operators without builtin data and without OpData (null init, parser without options): modelled, nothing to add.
_NO_ALLOC = {"SLICE", "TRANSPOSE", "FLOOR", "NEG", "EXP", "ABS", "MAXIMUM", "MINIMUM", "ZEROS_LIKE", "EXPAND_DIMS",
             "BATCH_TO_SPACE_ND", "LOGICAL_AND", "LOGICAL_OR"}


def _tensor_order(graph: ir.Graph) -> tuple[dict[str, float], int, bool]:
    """(sort key per activation tensor, the subgraph's tensor count, whether both are exact).

    With TFLite indices on every op (``tflite_tensor_index`` / ``tflite_outputs``, ``tflite_num_tensors`` or
    ``tflite_inputs``): the key is the tensor index and the count exact. Otherwise the key is the IR position and
    the count = activation tensors + estimated constant inputs (``const_inputs``)."""
    index: dict[str, int] = {}
    referenced: set[int] = set()
    declared: set[int] = set()
    exact = bool(graph.ops)
    for op in graph.ops:
        tin, tout = op.attrs.get("tflite_inputs"), op.attrs.get("tflite_outputs")
        if tin is None or tout is None:
            exact = False
            continue
        referenced.update(int(t) for t in list(tin) + list(tout) if int(t) >= 0)
        outs = [int(t) for t in tout if int(t) >= 0]
        if len(outs) == len(op.outputs):
            index.update(zip(op.outputs, outs))
        m = op.attrs.get("tflite_tensor_index")
        if isinstance(m, dict):
            index.update({k: int(v) for k, v in m.items()})
        if isinstance(op.attrs.get("tflite_num_tensors"), int):
            declared.add(int(op.attrs["tflite_num_tensors"]))
    names = list(graph.tensors)
    if exact:
        # A graph input no op records keeps the converter's convention: inputs come first.
        key: dict[str, float] = {n: float(index[n]) if n in index else
                                 (-1.0 + graph.inputs.index(n) * 1e-3 if n in graph.inputs else 1e9 + i)
                                 for i, n in enumerate(names)}
        count = max(declared) if declared else max(max(referenced, default=-1) + 1, len(referenced))
        return key, count, True
    key = {n: float(i) for i, n in enumerate(names)}
    seen: set[Any] = set()
    count = len(graph.tensors) + sum(const_inputs(op, seen) for op in graph.ops)
    return key, count, False


def const_inputs(op: ir.Op, seen: set[Any]) -> int:
    """Constant input tensors of ``op`` not counted before: ops with the same ``attrs["weights_key"]`` (e.g. the
    per-patch copies of one conv that a rewriter makes) share their weight and bias tensors."""
    b = builtin_of(op)
    if b in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"):
        wkey = op.attrs.get("weights_key")
        if wkey is not None:
            if wkey in seen:
                return 0
            seen.add(wkey)
        return (1 if op.weights else 0) + (1 if op.biases else 0)
    if b in ("ADD", "MUL", "SUB", "DIV", "MAXIMUM", "MINIMUM", "CONCATENATION", "PRELU"):
        return int(op.attrs.get("constant_operands", 0))
    return CONST_INPUTS.get(b, 0)


def lifetimes(graph: ir.Graph) -> dict[str, tuple[int, int]]:
    """TFLM allocation scopes [first, last] per activation tensor (see the module docstring)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def create(t: str, s: int) -> None:
        if t not in first:
            first[t] = s

    def use(t: str, s: int) -> None:
        last[t] = s

    for t in graph.inputs:
        create(t, 0)
        use(t, 0)
    for i, op in enumerate(graph.ops):
        s = i + 1
        for t in op.outputs:
            create(t, s)
        for t in op.inputs:
            use(t, s)
        for t in op.outputs:
            use(t, s)
    end = len(graph.ops)
    for t in graph.outputs:
        create(t, end)
        use(t, end)
    return {t: (first[t], last[t]) for t in first if t in last}


def plan_head(graph: ir.Graph, allocs: Sequence[OpAlloc] | None = None,
              key: dict[str, float] | None = None,
              offline: dict[str, int] | None = None, count_input: bool = True) -> tuple[int, list[Buffer]]:
    """The head TFLM plans: (bytes, the planned buffers with their offsets, in AddBuffer order). ``offline``:
    tensor name -> offset fixed by an offline plan. ``count_input=False``: the graph inputs take no space (an image
    streamed from elsewhere)."""
    allocs = allocs if allocs is not None else [op_allocations(graph, op) for op in graph.ops]
    key = key if key is not None else _tensor_order(graph)[0]
    life = lifetimes(graph)
    missing = [t for op in graph.ops for t in op.inputs + op.outputs if t not in graph.tensors]
    if missing:
        raise ir.GraphError(f"graph '{graph.name}' refers to unknown tensor '{missing[0]}'")
    buffers = []
    for name in sorted(life, key=lambda n: key.get(n, 1e12)):
        nbytes = graph.tensors[name].nbytes
        if nbytes > 0 and (count_input or name not in graph.inputs):
            first, last = life[name]
            buffers.append(Buffer(name, align_up(nbytes, ALIGN), first, last, fixed=(offline or {}).get(name, -1)))
    for i, a in enumerate(allocs):
        for k, nbytes in enumerate(a.scratch):
            buffers.append(Buffer(f"scratch:{i}:{k}", align_up(nbytes, ALIGN), i + 1, i + 1))
    return greedy_plan(buffers), buffers


class _Tail:
    """Replays persistent allocations from the arena end (which is 16-aligned); records per-type figures the way
    RecordingMicroAllocator prints them."""

    def __init__(self, abi: dict[str, tuple[int, int]]) -> None:
        self.abi = abi
        self.used = 0
        self.by_type: dict[str, dict[str, int]] = {}
        self.items: dict[str, int] = {}

    def alloc(self, size: int, align: int, what: str, category: str | None = None, count: int = 1) -> None:
        before = self.used
        self.used = align_up(self.used + size, align)
        self.items[what] = self.items.get(what, 0) + self.used - before
        if category:
            rec = self.by_type.setdefault(category, {"used": 0, "requested": 0, "count": 0})
            rec["used"] += self.used - before
            rec["requested"] += size
            rec["count"] += count

    def struct(self, name: str, category: str | None = None, n: int = 1, count: int | None = None) -> None:
        size, align = self.abi[name]
        self.alloc(size * n, align, name, category, n if count is None else count)


def _io_tensor(tail: _Tail, t: ir.Tensor) -> None:
    tail.struct("TfLiteTensor", PERSISTENT_TENSORS)
    if t.dtype in _QUANTIZED_DTYPES:  # quantized: TfLiteAffineQuantization + zero-point array (1 channel)
        tail.struct("TfLiteAffineQuantization", QUANTIZATION)
        size, align = tail.abi["TfLiteIntArray"]
        tail.alloc(size + 4, align, "TfLiteIntArray", QUANTIZATION)


def predict_tail(graph: ir.Graph, allocs: Sequence[OpAlloc], num_tensors: int,
                 build: str | TflmBuild = "wheel", persistent_apart: bool = False) -> _Tail:
    """The persistent allocations. ``persistent_apart``: in a buffer of their own (the firmware's
    ``MicroAllocator::Create`` of two buffers), which first holds the two buffers' allocators instead of the one
    arena's."""
    tb = get_build(build)
    tail = _Tail(tb.abi)
    prefix = "Recording" if tb.recording else ""
    if persistent_apart and tb.recording:
        raise ValueError(f"TFLM build {tb.name!r}: the persistent buffer apart is a firmware's (MicroAllocator)")
    allocators = (("PersistentArenaBufferAllocator", "NonPersistentArenaBufferAllocator") if persistent_apart
                  else (prefix + "SingleArenaBufferAllocator",))
    for name in (*allocators, "GreedyMemoryPlanner", prefix + "MicroAllocator", "MicroBuiltinDataAllocator",
                 "SubgraphAllocations"):
        tail.struct(name)
    tail.struct("TfLiteEvalTensor", EVAL_TENSORS, n=num_tensors)
    if graph.ops:
        tail.struct("NodeAndRegistration", NODES, n=len(graph.ops))
    for a in allocs:  # PrepareNodeAndRegistrationDataFromFlatbuffer: parsed options, operator by operator
        if a.builtin_data:
            tail.alloc(a.builtin_data[0], a.builtin_data[1], f"builtin data {a.builtin}")
    for a in allocs:  # InitSubgraphs
        if a.op_data:
            tail.alloc(a.op_data, ALIGN, f"OpData {a.builtin}", PERSISTENT_BUFFERS)
    for a in allocs:  # PrepareSubgraphs
        for nbytes in a.prepare:
            tail.alloc(nbytes, ALIGN, f"Prepare {a.builtin}", PERSISTENT_BUFFERS)
    n_scratch = sum(len(a.scratch) for a in allocs)
    if n_scratch:
        tail.struct("ScratchBufferHandle", n=n_scratch)
    for names in (graph.inputs, graph.outputs):
        size, align = tb.abi["TfLiteTensor*"]
        tail.alloc(size * len(names), align, "TfLiteTensor*", PERSISTENT_BUFFERS)
        for name in names:
            _io_tensor(tail, graph.tensors[name])
    return tail


def persistent_bytes(alloc: OpAlloc) -> int:
    """What an operator's allocations keep in TFLM's tail: its parsed options, op data and Prepare's buffers (each
    rounded as ``predict_tail`` allocates it)."""
    return ((alloc.builtin_data[0] if alloc.builtin_data else 0)
            + sum(align_up(n, ALIGN) for n in [alloc.op_data or 0, *alloc.prepare]))


def operator_tail(alloc: OpAlloc, tensors: int, build: str | TflmBuild = "wheel") -> int:
    """An estimate of what one operator adds to TFLM's persistent tail: ``persistent_bytes``, its node record, the
    eval records of the ``tensors`` it adds to the subgraph and a handle per scratch request (``predict_tail``'s
    pieces, so a model's tail is the sum over its operators within the padding between pieces)."""
    abi = get_build(build).abi
    return (persistent_bytes(alloc) + abi["NodeAndRegistration"][0] + tensors * abi["TfLiteEvalTensor"][0]
            + len(alloc.scratch) * abi["ScratchBufferHandle"][0])


def stage_op_alloc(build: str | TflmBuild = "wheel") -> OpAlloc:
    """What a TFMCU_PATCH_STAGE op allocates, as far as its tail goes: its op data (the same for every stage) and one
    scratch request (its size here 0: the head's)."""
    op_data, _ = kernel_memory({"scratch_bytes": 0}, pointer_bytes=get_build(build).pointer_bytes)
    return OpAlloc(f"custom:{PATCH_STAGE_OP}", None, op_data, scratch=[0])


def predict_arena(graph: ir.Graph, model: TfliteModel | bytes | None = None, count_input: bool = True,
                  build: str | TflmBuild = "wheel", stage: Any = None,
                  persistent_apart: bool = False) -> ArenaPrediction:
    """Head, tail and total bytes of TFLM's arena for ``graph`` (see the module docstring).

    ``model``: the .tflite ``graph`` was lowered from (parsed, ``tfmcu.tflite.model``, or its bytes), if at hand: its
    tensor indices, tensor count and weight
    quantization are then read from it (``annotate_from_tflite`` on a copy), which makes the tail exact for models
    that share constant tensors between operators, and an offline memory plan in its metadata is honoured.
    ``count_input=False``: the arena TFLM would plan if the graph inputs took no space (the image held elsewhere;
    a figure for comparison, TFLM itself always plans its inputs). ``build``: the TFLM whose structs count (BUILDS:
    "wheel", "host", "cortex-m", "cortex-m-cmsis-nn"). ``stage``: for "cortex-m-cmsis-nn" and a custom-mode graph,
    its ``PackedStage`` (``tfmcu.stage.custom.load_custom(model).packed``), whose tiles size the CMSIS-NN kernel
    buffer (without it the op is listed as unmodelled); for several TFMCU_PATCH_STAGE ops, a dict of them by TFLite
    operator index. ``persistent_apart``: the tail in a buffer of its own (the head alone is then the arena's; a
    firmware build). Never runs TFLM."""
    m = None
    if model is not None:
        m = as_model(model).flatbuffer
        graph = annotate_from_tflite(graph.copy(), m)
    return _predict(graph, m, count_input, build, stage, persistent_apart)


def predict_model_arena(model: TfliteModel | bytes, build: str | TflmBuild = "wheel", stage: Any = None,
                        name: str | None = None, count_input: bool = True,
                        persistent_apart: bool = False) -> ArenaPrediction:
    """``predict_arena`` of a .tflite (parsed, ``tfmcu.tflite.model``, or its bytes; or decided by the editor and not
    written: the same prediction as its file's): the graph lowered from it (``tfmcu.graph.from_tflite``; ``name``
    names it in errors), which carries the model's own tensor facts (what ``annotate_from_tflite`` would add), and
    its offline memory plan."""
    model = as_model(model)
    return _predict(from_model(model, name), model.flatbuffer, count_input, build, stage, persistent_apart)


def _predict(graph: ir.Graph, model: ts.ModelT | None, count_input: bool, build: str | TflmBuild,
             stage: Any, persistent_apart: bool = False) -> ArenaPrediction:
    """``predict_arena`` of a graph that carries its TFLite facts; ``model``: the one it was lowered from, for its
    offline memory plan (None: no model)."""
    tb = get_build(build)
    allocs = [op_allocations(graph, op, tb, stage) for op in graph.ops]
    plan = offline_plan.read(model) if model is not None else None
    key, num_tensors, exact = _tensor_order(graph)
    head, buffers = plan_head(graph, allocs, key, offline_offsets(graph, plan), count_input)
    tail = predict_tail(graph, allocs, num_tensors, tb, persistent_apart)
    details = {
        "tflm_build": tb.name,
        "persistent_apart": persistent_apart,
        "num_tensors": num_tensors,
        "tensor_indices": "tflite" if exact else "estimated",
        "num_ops": len(graph.ops),
        "planned_buffers": len(buffers),
        "scratch_buffers": sum(len(a.scratch) for a in allocs),
        "largest_buffer": max((b.size for b in buffers), default=0),
        "by_type": tail.by_type,
        "tail_items": tail.items,
        "unmodelled_ops": sorted({a.builtin for a in allocs if not a.modelled}),
    }
    timeline = [(builtin_of(op), max((b.offset + b.size for b in buffers if b.first <= step <= b.last), default=0))
                for step, op in enumerate(graph.ops, start=1)]
    return ArenaPrediction(head=head, tail=tail.used, total=head + tail.used, details=details, timeline=timeline)


def tensor_indices(graph: ir.Graph) -> dict[str, int]:
    """IR tensor name -> TFLite tensor index, from the ops' ``tflite_tensor_index`` (graphs lowered from a .tflite)."""
    index: dict[str, int] = {}
    for op in graph.ops:
        index.update(op.attrs.get("tflite_tensor_index", {}))
    return index


def offline_offsets(graph: ir.Graph, offsets: list[int] | None) -> dict[str, int] | None:
    """Tensor name -> offset of an offline memory plan (``offline_plan.read``: offsets per tensor index; None if
    the model has none)."""
    if offsets is None:
        return None
    return {t: offsets[i] for t, i in tensor_indices(graph).items() if i < len(offsets) and offsets[i] >= 0}


def planned_buffers(graph: ir.Graph) -> list[dict[str, Any]]:
    """The head's buffers with their TFLM offsets and lifetimes (for reports and debugging), in TFLM's order."""
    _, buffers = plan_head(graph)
    return [{"name": b.name, "size": b.size, "first": b.first, "last": b.last, "offset": b.offset}
            for b in buffers]


def annotate_from_tflite(graph: ir.Graph, model: TfliteModel | bytes | ts.ModelT) -> ir.Graph:
    """Add the TFLite facts ``predict_arena`` uses when present (``tflite_inputs``, ``tflite_outputs``,
    ``tflite_tensor_index``, ``tflite_num_tensors``, ``weight_scales``, ``weights_dtype``) to the ops of ``graph``,
    which must have been lowered from ``model`` by ``from_tflite`` (ops matched by ``src_index``). Returns
    ``graph`` (modified in place). A no-op for ops that already carry them."""
    m = model if isinstance(model, ts.ModelT) else as_model(model).flatbuffer
    sg = m.subgraphs[0]
    raw_ops = list(sg.operators or [])
    tensors = list(sg.tensors or [])
    for op in graph.ops:
        if op.src_index is None or not 0 <= op.src_index < len(raw_ops) or "tflite_inputs" in op.attrs:
            continue
        r = raw_ops[op.src_index]
        tin = [int(t) for t in (r.inputs if r.inputs is not None else [])]
        tout = [int(t) for t in (r.outputs if r.outputs is not None else [])]
        op.attrs["tflite_inputs"] = tin
        op.attrs["tflite_outputs"] = tout
        op.attrs["tflite_num_tensors"] = len(tensors)
        act = [t for t in tin if t >= 0 and not ts.is_constant(m, tensors[t]) and not tensors[t].isVariable]
        index = dict(zip(op.inputs, act)) if len(act) == len(op.inputs) else {}
        outs = [t for t in tout if t >= 0]
        if len(outs) == len(op.outputs):
            index.update(zip(op.outputs, outs))
        op.attrs["tflite_tensor_index"] = index
        if op.type in (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED) and len(tin) > 1 and tin[1] >= 0:
            w = tensors[tin[1]]
            q = w.quantization
            op.attrs["weight_scales"] = 0 if q is None or q.scale is None else len(q.scale)
            op.attrs["weights_dtype"] = ts.dtype_name(w.type)
    return graph
