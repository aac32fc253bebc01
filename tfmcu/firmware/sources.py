"""C++ sources of a whole model in TFLM firmware (tflm_patch_kernels/tflm/firmware_main.cc reads them through
firmware_model.h): the model as a Flash array, an op resolver with exactly the model's ops (and TFMCU_PATCH_STAGE
when the model uses it), the test inputs, the output size.

Used by `deploy` (tfmcu/flows/deploy.py) and by the firmware tests' generator (tools/gen/gen_model_whole.py).
"""

from __future__ import annotations

import ast
import functools
import os
from typing import Sequence

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.runtime.model_io import model_info
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

# MicroMutableOpResolver's method for each builtin op (TFLM 90b983c, micro_mutable_op_resolver.h; the ops int8
# CNNs and their classifier heads use; tests/test_deploy.py checks each against the header). The host runner
# (tflm_patch_kernels/tflm/host_runner.cc) registers the same set, and third_party/tflite_micro.BUILD compiles only
# their kernels (TFLM_KERNELS, one library per kernel file): an op outside this set is a one-line error, not a link
# error.
RESOLVER_METHODS: dict[str, str] = {
    "ABS": "AddAbs", "ADD": "AddAdd", "ARG_MAX": "AddArgMax", "ARG_MIN": "AddArgMin",
    "AVERAGE_POOL_2D": "AddAveragePool2D", "BATCH_MATMUL": "AddBatchMatMul",
    "BATCH_TO_SPACE_ND": "AddBatchToSpaceNd", "CAST": "AddCast",
    "CONCATENATION": "AddConcatenation", "CONV_2D": "AddConv2D", "DEPTHWISE_CONV_2D": "AddDepthwiseConv2D",
    "DEPTH_TO_SPACE": "AddDepthToSpace", "DEQUANTIZE": "AddDequantize", "DIV": "AddDiv", "ELU": "AddElu",
    "EXP": "AddExp", "EXPAND_DIMS": "AddExpandDims", "FULLY_CONNECTED": "AddFullyConnected", "GATHER": "AddGather",
    "HARD_SWISH": "AddHardSwish", "L2_NORMALIZATION": "AddL2Normalization", "L2_POOL_2D": "AddL2Pool2D",
    "LEAKY_RELU": "AddLeakyRelu", "LOGISTIC": "AddLogistic", "LOG_SOFTMAX": "AddLogSoftmax",
    "MAXIMUM": "AddMaximum", "MAX_POOL_2D": "AddMaxPool2D", "MEAN": "AddMean", "MINIMUM": "AddMinimum",
    "MIRROR_PAD": "AddMirrorPad", "MUL": "AddMul", "PACK": "AddPack", "PAD": "AddPad", "PADV2": "AddPadV2",
    "PRELU": "AddPrelu", "QUANTIZE": "AddQuantize", "REDUCE_MAX": "AddReduceMax", "RELU": "AddRelu",
    "RELU6": "AddRelu6", "RESHAPE": "AddReshape", "RESIZE_BILINEAR": "AddResizeBilinear",
    "RESIZE_NEAREST_NEIGHBOR": "AddResizeNearestNeighbor", "SHAPE": "AddShape", "SLICE": "AddSlice",
    "SOFTMAX": "AddSoftmax", "SPACE_TO_BATCH_ND": "AddSpaceToBatchNd", "SPACE_TO_DEPTH": "AddSpaceToDepth",
    "SPLIT": "AddSplit", "SPLIT_V": "AddSplitV",
    "SQUEEZE": "AddSqueeze", "STRIDED_SLICE": "AddStridedSlice", "SUB": "AddSub", "SUM": "AddSum",
    "TANH": "AddTanh", "TRANSPOSE": "AddTranspose", "TRANSPOSE_CONV": "AddTransposeConv", "UNPACK": "AddUnpack",
}


def resolver_ops(model: bytes, where: str = "model") -> list[str]:
    """The model's distinct ops in first-use order ("CONV_2D", ..., "custom:TFMCU_PATCH_STAGE"); a one-line
    ``UsageError`` naming the first op the firmware cannot register."""
    info = model_info(model, where)
    ops: list[str] = []
    for i, name in enumerate(info.op_names):
        if name in ops:
            continue
        if name.startswith("custom:"):
            if name != "custom:" + PATCH_STAGE_OP:
                raise UsageError(f"{where}: op {i} is custom op {name.split(':', 1)[1]!r}; the firmware registers "
                                 f"only the custom op {PATCH_STAGE_OP} (add your own kernel to the resolver)")
        elif name not in RESOLVER_METHODS:
            raise UsageError(f"{where}: op {i} is {name}, which deploy cannot register; supported builtin ops: "
                             f"{', '.join(sorted(RESOLVER_METHODS))}")
        ops.append(name)
    return ops


_TFLM_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "third_party", "tflite_micro.BUILD")


@functools.lru_cache(maxsize=None)
def kernel_table() -> dict[str, tuple[list[str], list[str]]]:
    """third_party/tflite_micro.BUILD's TFLM_KERNELS: {library name: (ops it registers, its kernel files)}."""
    with open(_TFLM_BUILD) as f:
        text = f.read()
    start = text.index("TFLM_KERNELS = {") + len("TFLM_KERNELS = ")
    return ast.literal_eval(text[start:text.index("\n}\n", start) + 2])


def cmsis_nn_kernels() -> list[str]:
    """third_party/tflite_micro.BUILD's CMSIS_NN_KERNELS: the kernel libraries TFLM has a CMSIS-NN version of."""
    with open(_TFLM_BUILD) as f:
        text = f.read()
    start = text.index("CMSIS_NN_KERNELS = [") + len("CMSIS_NN_KERNELS = ")
    return ast.literal_eval(text[start:text.index("\n]\n", start) + 2])


KERNELS = ("cmsis_nn", "reference")  # deploy --kernels: TFLM's (and the patch executor's) kernel variant


def kernel_libraries(ops: Sequence[str], kernels: str = "reference") -> list[str]:
    """The TFLM kernel libraries (``@tflite_micro//:kernel_<name>``, or ``kernel_<name>_cmsis_nn`` where TFLM has a
    CMSIS-NN version and ``kernels`` is "cmsis_nn") a firmware with ``ops`` (resolver_ops) links."""
    lib_of = {op: name for name, (lib_ops, _) in kernel_table().items() for op in lib_ops}
    cmsis = set(cmsis_nn_kernels()) if kernels == "cmsis_nn" else set()
    return sorted({f"@tflite_micro//:kernel_{lib_of[op]}" + ("_cmsis_nn" if lib_of[op] in cmsis else "")
                   for op in ops if not op.startswith("custom:")})


def _c_bytes(data: bytes) -> str:
    vals = np.frombuffer(data, dtype=np.uint8)
    rows = [",".join(str(int(v)) for v in vals[i:i + 32]) for i in range(0, len(vals), 32)]
    return ",\n".join(rows)


def resolver_source(ops: Sequence[str]) -> str:
    """``tfmcu_model_op_resolver()``: a MicroMutableOpResolver with exactly ``ops`` (see firmware_model.h)."""
    adds = []
    for op in ops:
        if op.startswith("custom:"):
            adds.append("r.AddCustom(tfmcu::kPatchStageOpName, tfmcu::Register_TFMCU_PATCH_STAGE())")
        else:
            adds.append(f"r.{RESOLVER_METHODS[op]}()")
    checks = " ||\n        ".join(f"{a} != kTfLiteOk" for a in adds)
    t = f"tflite::MicroMutableOpResolver<{len(ops)}>"
    # Placement new into static storage: no global constructor or destructor (a freestanding image has no atexit).
    return (
        "const tflite::MicroOpResolver* tfmcu_model_op_resolver() {\n"
        f"  using Resolver = {t};\n"
        "  alignas(Resolver) static unsigned char storage[sizeof(Resolver)];\n"
        "  static Resolver* resolver = nullptr;\n"
        "  if (resolver == nullptr) {\n"
        "    Resolver& r = *new (storage) Resolver();\n"
        f"    if ({checks}) {{\n"
        "      return nullptr;\n"
        "    }\n"
        "    resolver = &r;\n"
        "  }\n"
        "  return resolver;\n"
        "}\n")


def model_source(model: bytes, inputs: np.ndarray, output_len: int, comment: str, where: str = "model") -> str:
    """The whole generated .cc: ``inputs`` is (N, ...) of the model's input 0 (its dtype), ``output_len`` the bytes
    of output 0. ``comment`` says what the model is (one line)."""
    ops = resolver_ops(model, where)
    inputs = np.ascontiguousarray(inputs)
    n = int(inputs.shape[0])
    per = inputs[0].nbytes if n else 0
    includes = ["#include <new>\n",
                '#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"',
                '#include "tflm_patch_kernels/tflm/firmware_model.h"']
    if any(op.startswith("custom:") for op in ops):
        includes.append('#include "tflm_patch_kernels/tflm/patch_stage_op.h"')
    return "".join([
        "// Generated by tfmcu (tfmcu/firmware/sources.py): do not edit.\n",
        f"// {comment}\n",
        f"// ops: {', '.join(op.replace('custom:', '') for op in ops)}\n",
        "\n".join(includes) + "\n\n",
        # TFMCU_MODEL_STORAGE (firmware_model.h): Flash, or the MPS2 boards' PSRAM for models beyond their code memory
        f"alignas(16) TFMCU_MODEL_STORAGE const unsigned char g_tfmcu_model[{len(model)}] = {{\n"
        f"{_c_bytes(bytes(model))}\n}};\n",
        f"const unsigned int g_tfmcu_model_len = {len(model)};\n",
        f"alignas(16) const unsigned char g_tfmcu_inputs[{max(1, inputs.nbytes)}] = {{\n"
        f"{_c_bytes(inputs.tobytes()) or '0'}\n}};\n",
        f"const unsigned int g_tfmcu_input_len = {per};\n",
        f"const unsigned int g_tfmcu_num_inputs = {n};\n",
        f"const unsigned int g_tfmcu_output_len = {output_len};\n\n",
        resolver_source(ops),
    ])


def fnv1a32(data: bytes) -> int:
    """The hash the firmware prints of its output bytes (harness.h: tfmcu_fnv1a32)."""
    h = 2166136261
    for b in bytes(data):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def expectation(outputs: Sequence[np.ndarray]) -> dict:
    """What the firmware must print for these reference outputs (output 0 per input): the FNV-1a hash of all output
    bytes and the top class of each input (the first 16)."""
    data = b"".join(np.ascontiguousarray(o).tobytes() for o in outputs)
    return {"output_fnv1a32": "0x%08x" % fnv1a32(data),
            "top_class": [int(np.argmax(np.asarray(o).reshape(-1))) for o in outputs[:16]]}
