"""C++ sources of a whole model in TFLM firmware (tflm_patch_kernels/tflm/firmware_main.cc reads them through
firmware_model.h): the model as a Flash array (or in the board's external memory), an op resolver with exactly the
model's ops (TFMCU_PATCH_STAGE registered once, however many such ops the model has; TFLM's own custom op
TFLite_Detection_PostProcess for a detector: ``CUSTOM_RESOLVER``), the test inputs (for a model whose stage streams
its input: the images, whose rows the firmware feeds through the kernel's input provider), the output size; and the
firmware folder around them. A detector's firmware is built with ``-DTFMCU_DETECTOR_SLOTS`` (``build_file``): it
hashes all four outputs and prints each input's detections (``detector_expectation`` is what it must print).

* ``check_model(model, kernels)``: what a model must be for the firmware (one input, ops the resolver registers,
  well-formed TFMCU_PATCH_STAGE ops, an in-place memory plan only for the kernels it was derived for): its
  signature, ops and stages, or a one-line ``UsageError``;
* ``model_source(...)``: ``model_data.cc``; ``folder_files(...)``: the whole folder (``model_data.cc``,
  ``main.cc``, ``BUILD``, ``WORKSPACE``) for a target.

``model``: a ``tfmcu.tflite.model.TfliteModel`` (parsed once) or the bytes of one. Used by `deploy`
(tfmcu/flows/deploy.py) and by the firmware tests' generator (tools/gen/gen_model_whole.py).
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.firmware.targets import BUILDS, Target, linker_script
from tfmcu.plan.arena import MVE_CORES
from tfmcu.runtime.host import host_model
from tfmcu.runtime.model_io import ModelInfo, TFLMError, model_info
from tfmcu.runtime.tflm_host import streamed_image
from tfmcu.stage.common import read_schedule
from tfmcu.tflite.detection_postprocess import detections, postprocess_outputs
from tfmcu.tflite.model import TensorInfo, TfliteModel
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = "tfmcu_fw"  # the folder's Bazel repository name (--override_repository)
MAIN_SOURCE = os.path.join(ROOT, "tflm_patch_kernels", "tflm", "firmware_main.cc")
EXAMPLE_SOURCE = "@//examples/classify:main.c"  # the example application, built in each firmware folder

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


# TFLM's own custom ops the firmware can register: {custom op name: MicroMutableOpResolver method}. Their kernel
# libraries are third_party/tflite_micro.BUILD's TFLM_CUSTOM_KERNELS (``custom_kernel_table``).
CUSTOM_RESOLVER: dict[str, str] = {"TFLite_Detection_PostProcess": "AddDetectionPostprocess"}


def resolver_ops(model: TfliteModel | bytes, where: str = "model") -> list[str]:
    """The model's distinct ops in first-use order ("CONV_2D", ..., "custom:TFMCU_PATCH_STAGE"); a one-line
    ``UsageError`` naming the first op the firmware cannot register."""
    info = model_info(model, where)
    ops: list[str] = []
    for i, name in enumerate(info.op_names):
        if name in ops:
            continue
        if name.startswith("custom:"):
            if name != "custom:" + PATCH_STAGE_OP and name.split(":", 1)[1] not in CUSTOM_RESOLVER:
                raise UsageError(f"{where}: op {i} is custom op {name.split(':', 1)[1]!r}; the firmware registers "
                                 f"only the custom ops {', '.join([PATCH_STAGE_OP, *CUSTOM_RESOLVER])} (add your own "
                                 f"kernel to the resolver)")
        elif name not in RESOLVER_METHODS:
            raise UsageError(f"{where}: op {i} is {name}, which deploy cannot register; supported builtin ops: "
                             f"{', '.join(sorted(RESOLVER_METHODS))}")
        ops.append(name)
    return ops


def check_model(model: TfliteModel, kernels: str, core: str | None = None) -> tuple[ModelInfo, list[str], Any]:
    """What the firmware needs of ``model`` (parsed: ``tfmcu.runtime.model_io.read_model``; see the module
    docstring): ``(signature, resolver_ops, stages)``; anything else is a one-line ``UsageError`` naming the file.
    The signature of a model whose stage streams its input is the image's (``tfmcu.runtime.tflm_host``); ``stages``:
    None for a builtin-only model, the ``PackedStage`` of its one ``TFMCU_PATCH_STAGE`` op, or for several
    (``rewrite --rest_convs=tfmcu``) a dict of them by operator index (what ``tfmcu.plan.arena`` takes). ``core``:
    the target's (an in-place plan for CMSIS-NN holds for the read orders it was made for: its DSP code's, or on a
    core with Helium its MVE code's, ``memory_plan_helium``)."""
    path = model.where
    ops = resolver_ops(model, path)
    try:
        info, runner = host_model(model, path)  # a malformed custom-mode model fails here, in one line
    except TFLMError as e:
        raise UsageError(str(e)) from None
    if len(info.inputs) != 1 or len(info.outputs) < 1:
        raise UsageError(f"{path}: deploy runs models with one input; this one has {len(info.inputs)}")
    detector = postprocess_outputs(model.flatbuffer)
    if "custom:TFLite_Detection_PostProcess" in ops and detector != (0, 1, 2, 3):
        raise UsageError(f"{path}: a detector's outputs must be exactly TFLite_Detection_PostProcess's four, in its "
                         f"order (boxes, classes, scores, num), as tfmcu.tflite.detection_postprocess writes them")
    # An in-place memory plan (rewrite --inplace) holds for the read order of the kernels it was derived for
    # (schedule record: memory_plan_kernels, "reference" when absent); other kernels read in another order (im2col,
    # 3x3 depthwise), so the firmware must link those.
    record = read_schedule(model) or {}
    if record.get("memory_plan") == "inplace":
        planned = record.get("memory_plan_kernels", "reference")
        if planned != kernels:
            raise UsageError(f"{path}: its memory plan is in place for --kernels={planned} (rewrite --inplace), "
                             f"which does not hold for --kernels={kernels}: deploy it with --kernels={planned}, or "
                             f"rewrite it in place for {kernels}")
        helium = bool(record.get("memory_plan_helium"))
        if planned == "cmsis_nn" and helium != (core in MVE_CORES):
            made, other = ("Helium", "DSP") if helium else ("DSP", "Helium")
            raise UsageError(f"{path}: its memory plan is in place for CMSIS-NN's {made} code (rewrite --inplace), "
                             f"which does not hold on the {core} (CMSIS-NN's {other} code reads in other orders): "
                             f"rewrite it in place with --core={core}, or without --inplace")
    if runner is None:
        return info, ops, None
    stages = runner.custom.stages
    return info, ops, (next(iter(stages.values())) if len(stages) == 1 else dict(stages))


def stream_rows(model: TfliteModel | bytes) -> int:
    """Rows of each input image when the model's stage streams its input (the firmware feeds them from Flash through
    a ``TfmcuInputProvider``: firmware_main.cc, ``g_tfmcu_stream_rows``); 0 for any other model."""
    image = streamed_image(model)
    return 0 if image is None else int(image[0][0])


# The builds' external memory, where a model larger than the Flash goes, and the builds whose QEMU board keeps every
# model there (targets.Build psram / models_in_psram): {target key: (origin, bytes)}.
EXTERNAL_MEMORY: dict[str, tuple[int, int]] = {k: b.psram for k, b in BUILDS.items() if b.psram is not None}
QEMU_MODEL_IN_PSRAM = tuple(k for k, b in BUILDS.items() if b.models_in_psram)


_TFLM_BUILD = os.path.join(ROOT, "third_party", "tflite_micro.BUILD")


@functools.lru_cache(maxsize=None)
def kernel_table() -> dict[str, tuple[list[str], list[str]]]:
    """third_party/tflite_micro.BUILD's TFLM_KERNELS: {library name: (ops it registers, its kernel files)}."""
    with open(_TFLM_BUILD) as f:
        text = f.read()
    start = text.index("TFLM_KERNELS = {") + len("TFLM_KERNELS = ")
    return ast.literal_eval(text[start:text.index("\n}\n", start) + 2])


@functools.lru_cache(maxsize=None)
def custom_kernel_table() -> dict[str, tuple[list[str], list[str]]]:
    """third_party/tflite_micro.BUILD's TFLM_CUSTOM_KERNELS: {library name: (custom ops it registers, its kernel
    files)}; empty when the BUILD has none."""
    with open(_TFLM_BUILD) as f:
        text = f.read()
    if "TFLM_CUSTOM_KERNELS = {" not in text:
        return {}
    start = text.index("TFLM_CUSTOM_KERNELS = {") + len("TFLM_CUSTOM_KERNELS = ")
    return ast.literal_eval(text[start:text.index("\n}\n", start) + 2])


def cmsis_nn_kernels() -> list[str]:
    """third_party/tflite_micro.BUILD's CMSIS_NN_KERNELS: the kernel libraries TFLM has a CMSIS-NN version of."""
    with open(_TFLM_BUILD) as f:
        text = f.read()
    start = text.index("CMSIS_NN_KERNELS = [") + len("CMSIS_NN_KERNELS = ")
    return ast.literal_eval(text[start:text.index("\n]\n", start) + 2])


KERNELS_WHAT = {  # deploy --kernels: TFLM's (and the patch executor's) kernel variant, and what it runs
    "cmsis_nn": "TFLM's CMSIS-NN kernels (portable C ones for ops without) + TFMCU_PATCH_STAGE's CMSIS-NN backend",
    "reference": "TFLM's reference kernels + TFMCU_PATCH_STAGE's portable C kernels",
}
KERNELS = tuple(KERNELS_WHAT)
# deploy --console: where the firmware writes its report, and the harness library that does it
# (tflm_patch_kernels/firmware/BUILD)
CONSOLE_HARNESS = {
    "semihosting": "harness",  # semihosting: QEMU's stdout or a debugger's console (halts a board without one)
    "uart": "harness_uart",  # the board's console UART (board_*.c), semihosting off: a board on its own
}
CONSOLES = tuple(CONSOLE_HARNESS)


def kernel_libraries(ops: Sequence[str], kernels: str = "reference") -> list[str]:
    """The TFLM kernel libraries (``@tflite_micro//:kernel_<name>``, or ``kernel_<name>_cmsis_nn`` where TFLM has a
    CMSIS-NN version and ``kernels`` is "cmsis_nn") a firmware with ``ops`` (resolver_ops) links."""
    lib_of = {op: name for name, (lib_ops, _) in kernel_table().items() for op in lib_ops}
    lib_of.update({f"custom:{op}": name for name, (lib_ops, _) in custom_kernel_table().items() for op in lib_ops})
    cmsis = set(cmsis_nn_kernels()) if kernels == "cmsis_nn" else set()
    missing = [op for op in ops if op.split(":", 1)[-1] in CUSTOM_RESOLVER and op not in lib_of]
    if missing:
        raise UsageError(f"{', '.join(missing)}: third_party/tflite_micro.BUILD compiles no kernel for it "
                         f"(TFLM_CUSTOM_KERNELS)")
    return sorted({f"@tflite_micro//:kernel_{lib_of[op]}" + ("_cmsis_nn" if lib_of[op] in cmsis else "")
                   for op in ops if op in lib_of})


def _c_bytes(data: bytes) -> str:
    vals = np.frombuffer(data, dtype=np.uint8)
    rows = [",".join(str(int(v)) for v in vals[i:i + 32]) for i in range(0, len(vals), 32)]
    return ",\n".join(rows)


def resolver_source(ops: Sequence[str]) -> str:
    """``tfmcu_model_op_resolver()``: a MicroMutableOpResolver with exactly ``ops`` (see firmware_model.h)."""
    adds = []
    for op in ops:
        if op.startswith("custom:") and op.split(":", 1)[1] in CUSTOM_RESOLVER:
            adds.append(f"r.{CUSTOM_RESOLVER[op.split(':', 1)[1]]}()")
        elif op.startswith("custom:"):
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


_INCLUDES = ["#include <new>\n",
             '#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"',
             '#include "tflm_patch_kernels/tflm/firmware_model.h"']


def library_model_source(model: TfliteModel | bytes, comment: str, where: str = "model",
                         ops: Sequence[str] | None = None, stream: int = 0) -> str:
    """The model library's ``model_data.cc``: the model array, its op resolver (``ops``: ``resolver_ops(model)``
    when known) and, for a model whose stage streams its input, ``g_tfmcu_stream_rows`` = ``stream`` (the image's
    rows, ``stream_rows``; tfmcu_model.cc then hands the stage the application's row reader)."""
    ops = resolver_ops(model, where) if ops is None else list(ops)
    includes = _INCLUDES + (['#include "tflm_patch_kernels/tflm/patch_stage_op.h"']
                            if "custom:" + PATCH_STAGE_OP in ops else [])
    return "".join([
        "// Generated by tfmcu (tfmcu/firmware/sources.py): do not edit.\n",
        f"// {comment}\n",
        f"// ops: {', '.join(op.replace('custom:', '') for op in ops)}\n",
        "\n".join(includes) + "\n\n",
        # TFMCU_MODEL_STORAGE (firmware_model.h): Flash, or the MPS2 boards' PSRAM for models beyond their code memory
        f"alignas(16) TFMCU_MODEL_STORAGE const unsigned char g_tfmcu_model[{len(model)}] = {{\n"
        f"{_c_bytes(bytes(model))}\n}};\n",
        f"const unsigned int g_tfmcu_model_len = {len(model)};\n\n",
        resolver_source(ops),
        "" if not stream else (
            "\n// The stage streams its input: tfmcu_model.cc hands it the application's row reader (rows in\n"
            "// increasing order, each at most once).\n"
            f'extern "C" const unsigned int g_tfmcu_stream_rows = {int(stream)}u;\n'),
    ])


def test_inputs_source(inputs: np.ndarray, output_len: int, comment: str) -> str:
    """The test firmware's ``test_inputs.cc`` (firmware_model.h): ``inputs`` is (N, ...) of the model's input 0 (its
    dtype; for a streamed-input model, the images), ``output_len`` the bytes of output 0."""
    return "".join(["// Generated by tfmcu (tfmcu/firmware/sources.py): do not edit.\n",
                    f"// {comment}\n",
                    '#include "tflm_patch_kernels/tflm/firmware_model.h"\n\n', _inputs_part(inputs, output_len)])


def _inputs_part(inputs: np.ndarray, output_len: int) -> str:
    inputs = np.ascontiguousarray(inputs)
    n = int(inputs.shape[0])
    per = inputs[0].nbytes if n else 0
    return "".join([
        f"alignas(16) const unsigned char g_tfmcu_inputs[{max(1, inputs.nbytes)}] = {{\n"
        f"{_c_bytes(inputs.tobytes()) or '0'}\n}};\n",
        f"const unsigned int g_tfmcu_input_len = {per};\n",
        f"const unsigned int g_tfmcu_num_inputs = {n};\n",
        f"const unsigned int g_tfmcu_output_len = {output_len};\n"])


def model_source(model: TfliteModel | bytes, inputs: np.ndarray, output_len: int, comment: str, where: str = "model",
                 ops: Sequence[str] | None = None, stream: int = 0) -> str:
    """The library's model data and the test inputs in one .cc (the firmware tests' generator and the latency
    calibration, which build the test firmware in one step): ``library_model_source`` + ``test_inputs_source``."""
    return library_model_source(model, comment, where, ops, stream) + "\n" + _inputs_part(inputs, output_len)


def example_frame_source(frame: np.ndarray, info: TensorInfo, comment: str) -> str:
    """The example application's ``example_frame.c``: ``frame`` (one input of the model: its dtype, or a streamed
    input's image) as the float values the model takes: an int8 / uint8 input dequantized with ``info``'s scale and
    zero point (the example quantizes them back exactly), a float input as it is; a quantized image whose scale is
    not recorded (0) as its integer values."""
    x = np.asarray(frame).reshape(-1)
    if x.dtype != np.float32 and info.scale:
        x = (x.astype(np.float64) - info.zero_point) * info.scale
    values = np.asarray(x, np.float32)
    rows = [", ".join(f"{float(v)!r}f" for v in values[i:i + 12]) for i in range(0, len(values), 12)]
    return ("/* Generated by tfmcu (tfmcu/firmware/sources.py) for the example application\n"
            f" * (examples/classify/main.c): the camera frame it classifies. {comment} */\n"
            f"const float g_example_frame[{len(values)}] = {{\n" + ",\n".join(rows) + "\n};\n")


def model_config(info: ModelInfo, arena: int, persistent: int = 0, stream: int = 0,
                 image: tuple[tuple[int, int, int], str] | None = None, comment: str = "") -> str:
    """The model library's ``tfmcu_model_config.h``: sizes and the input's quantization as macros (tfmcu_model.h).
    ``info``: the model's signature; ``stream``: a streamed input's rows and ``image`` its ((H, W, C), dtype)."""
    x = info.inputs[0]
    shape, dtype = (tuple(image[0]), image[1]) if stream and image else (tuple(x.shape[1:]), x.dtype)
    h, w, c = shape if len(shape) == 3 else (1, 1, int(np.prod(shape)))
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    out = info.outputs[0]
    out_bytes = int(np.prod(out.shape)) * np.dtype(out.dtype).itemsize
    types = {"float32": 1, "uint8": 3, "int8": 9}
    lines = [
        ("ARENA_BYTES", f"{arena}u", "the tensor arena (.bss): the predicted arena and its margin"),
        ("PERSISTENT_BYTES", f"{persistent}u", "TFLM's persistent data in section .tfmcu_persistent (0: in the "
                                               "arena)"),
        ("INPUT_TYPE", f"{types.get(dtype, -1)}", "TFLite TensorType of the input: 1 float32, 3 uint8, 9 int8"),
        ("INPUT_HEIGHT", f"{h}", ""), ("INPUT_WIDTH", f"{w}", ""), ("INPUT_CHANNELS", f"{c}", ""),
        ("INPUT_BYTES", f"{size}u", "one input image, NHWC"),
        ("INPUT_ROW_BYTES", f"{w * c * np.dtype(dtype).itemsize}u", ""),
        ("INPUT_SCALE", f"{float(x.scale)!r}f" if not stream else "0.0f",
         "real = scale x (q - zero_point); 0: not recorded (a streamed input: the stage quantizes)"
         if stream else "real = scale x (q - zero_point); 0: not quantized"),
        ("INPUT_ZERO_POINT", f"{int(x.zero_point) if not stream else 0}", ""),
        ("STREAM_ROWS", f"{int(stream)}u", "rows a streamed input's reader gives (0: the input is a buffer)"),
        ("NUM_OUTPUTS", f"{len(info.outputs)}u", ""),
        ("OUTPUT_BYTES", f"{out_bytes}u", "output 0"),
        ("OUTPUT_SCALE", f"{float(out.scale)!r}f", ""), ("OUTPUT_ZERO_POINT", f"{int(out.zero_point)}", ""),
    ]
    body = "\n".join(f"#define TFMCU_MODEL_{k} {v}" + (f"  /* {why} */" if why else "") for k, v, why in lines)
    return (f"/* Generated by tfmcu (tfmcu/firmware/sources.py) for the model library (tfmcu_model.h): do not edit.\n"
            f" * {comment} */\n#ifndef TFMCU_MODEL_CONFIG_H_\n#define TFMCU_MODEL_CONFIG_H_\n\n{body}\n\n"
            f"#endif /* TFMCU_MODEL_CONFIG_H_ */\n")


def build_file(t: Target, arena: int, stack: int, ops: list[str], kernels: str, external: bool = False,
               detector_slots: int = 0, console: str = "semihosting", persistent: int = 0,
               profile: bool = False) -> str:
    """The folder's BUILD: ``:firmware`` (the ELF for ``t``'s core) with the arena, the stack, TFLM's runtime and the
    kernel libraries of ``ops`` (``kernels``: "cmsis_nn" or "reference"); ``external``: the model array in the
    board's external memory (``EXTERNAL_MEMORY``) instead of the Flash; ``detector_slots``: a detector's firmware
    (``-DTFMCU_DETECTOR_SLOTS``: the detections it keeps to print, ``detector_slots_for``); ``console``: the harness
    that writes its report (``CONSOLE_HARNESS``); ``persistent``: the bytes of TFLM's persistent buffer in the board's
    ``persistent_ram`` region (``-DTFMCU_PERSISTENT_BYTES``; 0: none, the arena holds it all); ``profile``: the
    per-op mode (``-DTFMCU_PROFILE_OPS``: the first Invoke's ops each between the plugin's markers, firmware_main.cc)."""
    fw = "@//tflm_patch_kernels/firmware"
    # TFLM's runtime and only the kernels of the model's ops (a cross-build compiles these, not all of TFLM)
    libs = ["@//tflm_patch_kernels/tflm:model_runtime", "@tflite_micro//:runtime", "@tflite_micro//:platform_mcu"]
    libs += kernel_libraries(ops, kernels)
    if "custom:" + PATCH_STAGE_OP in ops:
        libs.append("@//tflm_patch_kernels/tflm:patch_stage_op" + ("_cmsis_nn" if kernels == "cmsis_nn" else ""))
    deps = "\n".join(f'        "{d}",' for d in libs)
    budget = [] if t.key == "stm32f405" else [f'"-Wl,--defsym=TFMCU_SRAM_BUDGET={t.sram_bytes}"']
    if persistent and t.persistent is None:
        raise UsageError(f"--target={t.name}: the board has no region for TFLM's persistent data")
    copts = []  # the test firmware's (main.cc); the library's sizes are in model/tfmcu_model_config.h
    lib_copts = ['"-Wall"', '"-Wextra"', '"-Werror"', '"-fno-rtti"', '"-fno-exceptions"']
    if detector_slots:
        copts.append(f'"-DTFMCU_DETECTOR_SLOTS={int(detector_slots)}"')
    if profile:
        copts.append('"-DTFMCU_PROFILE_OPS"')
    if external:
        if t.key not in EXTERNAL_MEMORY or t.own_ld:
            raise UsageError(f"--target={t.name}: the board has no external memory for the model")
        lib_copts.append('"-DTFMCU_MODEL_IN_PSRAM"')
        budget.append(f'"-Wl,--defsym=TFMCU_PSRAM_ORIGIN={EXTERNAL_MEMORY[t.key][0]}"')
    ld = ":board.ld" if t.own_ld else f"{fw}:{t.ld}"  # the board's memory (folder_files writes board.ld)
    # (name, linker script, board library, what): the board's ELF with the board's library (a chip QEMU does not
    # emulate: board_dwt, the core's cycle counter), and where QEMU runs another link or library, that one
    own = t.board_elf or t.board
    binaries = [("firmware", ld, own, "The ELF for the board (its memory map), through the platform transition"
                                      + (" (the core's DWT cycle counter as its timer)." if t.board_elf else "."))]
    qemu_extra: dict[str, list[str]] = {}  # a binary's own copts and linkopts beside the folder's
    if t.qemu == "stand-in":  # QEMU runs the same sources linked to its board's memory, held to the board's SRAM
        # (with a persistent buffer: qemu.ld, its region past that RAM, targets.stand_in_script)
        psram = t.key in QEMU_MODEL_IN_PSRAM and not external
        if psram:  # the QEMU board's code memory holds the code only: the model in its external memory there
            qemu_extra = {"copts": ['"-DTFMCU_MODEL_IN_PSRAM"'],
                          "linkopts": [f'"-Wl,--defsym=TFMCU_PSRAM_ORIGIN={EXTERNAL_MEMORY[t.key][0]}"']}
        binaries.append(("firmware_qemu", ":qemu.ld" if persistent else f"{fw}:{t.ld}", t.board,
                         f"The same firmware linked for QEMU {t.machine} (its memory, the board's SRAM as the limit"
                         + (f", TFLM's persistent data in a region of {t.persistent_ram}'s size" if persistent else "")
                         + (", the model in its external memory: its code memory holds the code only" if psram
                            else "") + "): what --run runs."))
    elif persistent and t.qemu_bases:  # the persistent buffer's region where the QEMU board maps it (qemu.ld)
        binaries.append(("firmware_qemu", ":qemu.ld", t.board, f"The same firmware linked for QEMU {t.machine}, its "
                                                               f"{t.persistent_ram} where QEMU maps it: what --run "
                                                               f"runs."))
    elif t.board_elf:  # the board's memory lies inside the QEMU board's: the same link, the QEMU board's library
        binaries.append(("firmware_qemu", ld, t.board, f"The same firmware with QEMU {t.machine}'s board library "
                                                       f"(its timer and UART): what --run runs."))
    out = [f"""# Generated by tfmcu deploy for {t.name}: {t.what}.
# Build from the tfmcu checkout:
#   bazel build @{REPO}//:firmware --override_repository={REPO}=$PWD/<this folder>
load("@//tools/bazel/arm:transition.bzl", "mcu_binary", "mcu_static_library")
"""]
    libraries = [("model", lib_copts, "The model library (model/tfmcu_model.h): the model, TFLM and the kernels; "
                                      "nothing of the test harness.")]
    if qemu_extra:
        libraries.append(("model_qemu", lib_copts + qemu_extra["copts"],
                          "The model library as the QEMU link places the model (firmware_qemu)."))
    for name, lcopts, what in libraries:
        out.append(f"""
# {what}
cc_library(
    name = "{name}",
    srcs = [
        "model/model_data.cc",
        "model/tfmcu_model.cc",
    ],
    hdrs = [
        "model/tfmcu_model.h",
        "model/tfmcu_model_config.h",
    ],
    copts = [{", ".join(lcopts)}],
    includes = ["model"],
    target_compatible_with = ["@platforms//os:none"],
    deps = [
{deps}
    ],
)
""")
    out.append(f"""
# The model library as one static archive for the {t.core}: libtfmcu_model.a (the library, TFLM, the kernels) with
# model/tfmcu_model.h, for another build system.
mcu_static_library(
    name = "libtfmcu_model",
    library = ":model",
    platform = "@{t.platform}",
)
""")
    for name, script, board, what in binaries:
        extra = qemu_extra if name == "firmware_qemu" else {}
        linkopts = ['"-T"', f'"$(location {script})"', f'"-Wl,--defsym=TFMCU_STACK_SIZE={stack}"'] + budget + \
            extra.get("linkopts", [])
        deps = [f":{'model_qemu' if extra else 'model'}", f"{fw}:{CONSOLE_HARNESS[console]}", f"{fw}:{board}"]
        example = name.replace("firmware", "example")
        out.append(_program(example, [EXAMPLE_SOURCE, "example_frame.c"], ['"-Wall"', '"-Wextra"', '"-Werror"'],
                            script, linkopts, deps, t.platform,
                            "The example application (examples/classify/main.c) over the model library"
                            + (" as QEMU runs it." if name != "firmware" else ".")))
        out.append(_program(name, ["main.cc", "test_inputs.cc"], copts, script, linkopts, deps, t.platform, what))
    return "".join(out)


def _program(name: str, srcs: list[str], copts: list[str], script: str, linkopts: list[str], deps: list[str],
             platform: str, what: str) -> str:
    """A firmware folder's program: its cc_binary ``<name>_bin`` and the mcu_binary ``name`` building it for
    ``platform`` (``copts`` and ``linkopts`` quoted already)."""
    lines = "\n".join
    return f"""
cc_binary(
    name = "{name}_bin",
    srcs = [
{lines(f'        "{s}",' for s in srcs)}
    ],
    additional_linker_inputs = ["{script}"],
    copts = [{", ".join(copts)}],
    linkopts = [{", ".join(linkopts)}],
    target_compatible_with = ["@platforms//os:none"],
    deps = [
{lines(f'        "{d}",' for d in deps)}
    ],
)

# {what}
mcu_binary(
    name = "{name}",
    binary = ":{name}_bin",
    platform = "@{platform}",
)
"""


LIBRARY_DIR = "model"  # the model library's folder inside the firmware folder
LIBRARY_SOURCES = ("tfmcu_model.h", "tfmcu_model.cc")  # copied from tflm_patch_kernels/tflm/


def folder_files(model: TfliteModel | bytes, ops: Sequence[str], inputs: np.ndarray, output_len: int, comment: str,
                 target: Target, arena: int, stack: int, kernels: str, where: str = "model", stream: int = 0,
                 external: bool = False, detector_slots: int = 0, console: str = "semihosting",
                 persistent: int = 0, profile: bool = False) -> dict[str, str]:
    """The firmware folder's sources {name: text}: the model library in ``model/`` (``tfmcu_model.h`` and
    ``tfmcu_model.cc``, copies of tflm_patch_kernels/tflm/'s; ``model_data.cc``, ``library_model_source``, ``stream``:
    the streamed images' rows; ``tfmcu_model_config.h``, ``model_config``: the arena, ``persistent``: TFLM's
    persistent buffer apart), the test firmware over it: ``main.cc`` (a copy of
    tflm_patch_kernels/tflm/firmware_main.cc) and ``test_inputs.cc`` (``test_inputs_source``); ``BUILD``
    (``build_file``, ``external``: the model in the board's external memory; ``detector_slots``: a detector's;
    ``console``: where it reports; ``profile``: the per-op mode), ``WORKSPACE`` and, for a board with its own memory
    map, ``board.ld`` (``targets.linker_script``); ``qemu.ld`` when QEMU runs a link of its own (the persistent
    buffer's region mapped elsewhere there)."""
    with open(MAIN_SOURCE) as f:
        main = f.read()
    library = {}
    for name in LIBRARY_SOURCES:
        with open(os.path.join(os.path.dirname(MAIN_SOURCE), name)) as f:
            library[f"{LIBRARY_DIR}/{name}"] = f.read()
    info = model_info(model, where)
    x = info.inputs[0] if not stream else replace(info.inputs[0], scale=0.0, zero_point=0)
    return {
        "example_frame.c": example_frame_source(np.asarray(inputs)[0], x, comment),
        **library,
        f"{LIBRARY_DIR}/model_data.cc": library_model_source(model, comment, where, ops=ops, stream=stream),
        f"{LIBRARY_DIR}/tfmcu_model_config.h": model_config(info, arena, persistent, stream, streamed_image(model),
                                                             comment),
        "main.cc": main,
        "test_inputs.cc": test_inputs_source(inputs, output_len, comment),
        "BUILD": build_file(target, arena, stack, list(ops), kernels, external, detector_slots, console, persistent,
                            profile),
        "WORKSPACE": f'workspace(name = "{REPO}")\n',
        **({"board.ld": linker_script(target)} if target.own_ld else {}),
        **({"qemu.ld": linker_script(target, qemu=True)} if persistent and target.qemu_link else {}),
    }


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


# ----------------------------------------------------------------------------- detectors
MAX_PRINTED_INPUTS = 16  # firmware_main.cc keeps the results of the first 16 inputs (top_class, detections)


def detector_slots_for(where: tuple[int, int, int, int] | None, info: ModelInfo, num_inputs: int) -> int:
    """The detections a detector's firmware keeps to print (``-DTFMCU_DETECTOR_SLOTS``): max_detections for each
    of the first 16 inputs; 0 for a model that is not a detector (``where``: ``postprocess_outputs``)."""
    if where is None:
        return 0
    max_detections = int(np.prod(info.outputs[where[2]].shape))
    return max_detections * max(1, min(int(num_inputs), MAX_PRINTED_INPUTS))


def millionths(value: float) -> int:
    """A box coordinate or score as the firmware prints it: round(value x 1e6) (float32 product, halves away from
    zero; the firmware's float arithmetic may land 1 away)."""
    x = np.float32(value) * np.float32(1e6)
    return int(x - np.float32(0.5)) if x < 0 else int(x + np.float32(0.5))


def detector_expectation(outputs: Sequence[Sequence[np.ndarray]], where: tuple[int, int, int, int]) -> dict:
    """What a detector's firmware must print for these reference outputs (per input, all four outputs of
    TFLite_Detection_PostProcess, unwritten entries zeroed: ``canonical_outputs``): the FNV-1a hash of the four
    outputs' bytes, input by input, in the model's order (the op's: ``check_model`` requires it), and per input (the
    first 16) the top detection's class (-1: none)."""
    data = b"".join(np.ascontiguousarray(a).tobytes() for o in outputs for a in o)
    top = []
    for o in outputs[:MAX_PRINTED_INPUTS]:
        found = detections(o, where)
        top.append(found[0]["class"] if found else -1)
    return {"output_fnv1a32": "0x%08x" % fnv1a32(data), "top_class": top}


def printed_detections(outputs: Sequence[Sequence[np.ndarray]], where: tuple[int, int, int, int]) -> list[list]:
    """The detections the firmware prints for these outputs: per input (the first 16), [class, score, ymin, xmin,
    ymax, xmax] per detection, score and box in millionths (``millionths``)."""
    return [[[d["class"], millionths(d["score"]), *(millionths(v) for v in d["box"])] for d in detections(o, where)]
            for o in outputs[:MAX_PRINTED_INPUTS]]
