"""Measures the sizes and alignments of the TFLM structs the arena predictor (tfmcu/plan/arena.py) adds to the arena's
tail, by compiling them: for the host (x86-64, g++) and for Cortex-M (arm-none-eabi-g++, 32-bit), from the pinned TFLM
archive with the defines our build uses (third_party/tflite_micro.BUILD: -DTF_LITE_STATIC_MEMORY, no compression).

usage: gen_tflm_abi.py [--third-party ../shared/third_party] [--out tfmcu/plan/tflm_abi.json] [--check]

Each struct goes into a small translation unit as `extern "C" const unsigned tfmcu_abi[] = {sizeof(T), alignof(T)}`
(kernel OpData structs that live in a kernel's .cc are reached by including that .cc); the unit is compiled with
-c only and the two words are read back from the object's .rodata section (objcopy), so no target code runs.
--check compares with the committed file instead of writing it (test_abi_table_is_current in
tests/e2e/test_deploy_run.py runs it when both compilers and the archives are present).
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCHIVES = {  # third_party/*.BUILD: TFLM and the headers its kernels include
    "tflm": "90b983c2b3f1480642e040bbd2ddb37b998f3424",
    "flatbuffers": "187240970746d00bbd26b0f5873ed54d2477f9f3",
    "gemmlowp": "719139ce755a0f31cbf1c37f7f98adcc7fc9f425",
    "ruy": "d37128311b445e758136b8602d1bbd2a755e115d",
    "cmsis_nn": "4ab83cc3cc98fb85ed6dafb55e8ca02f1628dcae",
}

# name -> (include, C++ type). "micro_allocator.cc" brings MicroBuiltinDataAllocator (its anonymous namespace).
CORE = {
    "SingleArenaBufferAllocator": ("arena_allocator/single_arena_buffer_allocator.h",
                                   "tflite::SingleArenaBufferAllocator"),
    "RecordingSingleArenaBufferAllocator": ("arena_allocator/recording_single_arena_buffer_allocator.h",
                                            "tflite::RecordingSingleArenaBufferAllocator"),
    "PersistentArenaBufferAllocator": ("arena_allocator/persistent_arena_buffer_allocator.h",
                                       "tflite::PersistentArenaBufferAllocator"),
    "NonPersistentArenaBufferAllocator": ("arena_allocator/non_persistent_arena_buffer_allocator.h",
                                          "tflite::NonPersistentArenaBufferAllocator"),
    "GreedyMemoryPlanner": ("memory_planner/greedy_memory_planner.h", "tflite::GreedyMemoryPlanner"),
    "MicroAllocator": ("micro_allocator.h", "tflite::MicroAllocator"),
    "RecordingMicroAllocator": ("recording_micro_allocator.h", "tflite::RecordingMicroAllocator"),
    "MicroBuiltinDataAllocator": ("micro_allocator.cc", "tflite::MicroBuiltinDataAllocator"),
    "SubgraphAllocations": ("micro_allocator.h", "tflite::SubgraphAllocations"),
    "TfLiteEvalTensor": ("micro_allocator.h", "TfLiteEvalTensor"),
    "NodeAndRegistration": ("micro_allocator.h", "tflite::NodeAndRegistration"),
    "ScratchBufferHandle": ("micro_allocator.h", "tflite::ScratchBufferHandle"),
    "TfLiteTensor*": ("micro_allocator.h", "TfLiteTensor*"),
    "TfLiteTensor": ("micro_allocator.h", "TfLiteTensor"),
    "TfLiteAffineQuantization": ("micro_allocator.h", "TfLiteAffineQuantization"),
    "TfLiteIntArray": ("micro_allocator.h", "TfLiteIntArray"),
}
_BD = "../core/c/builtin_op_data.h"
BUILTIN_DATA = {
    "CONV_2D": "TfLiteConvParams", "DEPTHWISE_CONV_2D": "TfLiteDepthwiseConvParams",
    "AVERAGE_POOL_2D": "TfLitePoolParams", "MAX_POOL_2D": "TfLitePoolParams", "L2_POOL_2D": "TfLitePoolParams",
    "ADD": "TfLiteAddParams", "MUL": "TfLiteMulParams", "CONCATENATION": "TfLiteConcatenationParams",
    "RESHAPE": "TfLiteReshapeParams", "MEAN": "TfLiteReducerParams", "SUM": "TfLiteReducerParams",
    "REDUCE_MAX": "TfLiteReducerParams", "REDUCE_MIN": "TfLiteReducerParams",
    "FULLY_CONNECTED": "TfLiteFullyConnectedParams", "SOFTMAX": "TfLiteSoftmaxParams",
    "STRIDED_SLICE": "TfLiteStridedSliceParams", "SHAPE": "TfLiteShapeParams", "PACK": "TfLitePackParams",
    "SUB": "TfLiteSubParams", "DIV": "TfLiteDivParams", "SQUEEZE": "TfLiteSqueezeParams",
    "LEAKY_RELU": "TfLiteLeakyReluParams", "UNPACK": "TfLiteUnpackParams", "SPLIT": "TfLiteSplitParams",
    "GATHER": "TfLiteGatherParams", "TRANSPOSE_CONV": "TfLiteTransposeConvParams",
    "RESIZE_NEAREST_NEIGHBOR": "TfLiteResizeNearestNeighborParams", "RESIZE_BILINEAR": "TfLiteResizeBilinearParams",
    "DEPTH_TO_SPACE": "TfLiteDepthToSpaceParams", "SPACE_TO_DEPTH": "TfLiteSpaceToDepthParams",
    "CAST": "TfLiteCastParams", "ARG_MAX": "TfLiteArgMaxParams", "ARG_MIN": "TfLiteArgMinParams",
}
_TYPES = "../kernels/internal/types.h"
OP_DATA = {  # builtin -> (include, type): what the kernel's Init allocates
    "CONV_2D": ("kernels/conv.h", "tflite::OpDataConv"),
    "DEPTHWISE_CONV_2D": ("kernels/conv.h", "tflite::OpDataConv"),
    "FULLY_CONNECTED": ("kernels/fully_connected.h", "tflite::OpDataFullyConnected"),
    "ADD": ("kernels/add.h", "tflite::OpDataAdd"),
    "MUL": ("kernels/mul.h", "tflite::OpDataMul"),
    "SUB": ("kernels/sub.h", "tflite::OpDataSub"),
    "AVERAGE_POOL_2D": ("kernels/pooling.h", "tflite::OpDataPooling"),
    "MAX_POOL_2D": ("kernels/pooling.h", "tflite::OpDataPooling"),
    "PAD": ("kernels/pad.h", "tflite::OpData"),
    "PADV2": ("kernels/pad.h", "tflite::OpData"),
    "CONCATENATION": ("kernels/concatenation.cc", "tflite::OpData"),
    "STRIDED_SLICE": (_TYPES, "tflite::StridedSliceParams"),
    "QUANTIZE": ("kernels/quantize.h", "tflite::OpDataQuantizeReference"),
    "DEQUANTIZE": ("kernels/dequantize.h", "tflite::DequantizeOpData"),
    "MEAN": ("kernels/reduce.h", "tflite::OpDataReduce"),
    "SUM": ("kernels/reduce.h", "tflite::OpDataReduce"),
    "REDUCE_MAX": ("kernels/reduce.h", "tflite::OpDataReduce"),
    "REDUCE_MIN": ("kernels/reduce.h", "tflite::OpDataReduce"),
    "SOFTMAX": (_TYPES, "tflite::SoftmaxParams"),
    "RELU": ("kernels/activations.h", "tflite::ReluOpData"),
    "RELU6": ("kernels/activations.h", "tflite::Relu6OpData"),
    "LOGISTIC": ("kernels/logistic.h", "tflite::OpDataLogistic"),
    "TANH": ("kernels/tanh.cc", "tflite::OpData"),
    "HARD_SWISH": (_TYPES, "tflite::HardSwishParams"),
    "LEAKY_RELU": ("kernels/leaky_relu.h", "tflite::LeakyReluOpData"),
    "PRELU": (_TYPES, "tflite::PreluParams"),
    # custom ops TFLM ships, keyed as the predictor names them (tfmcu.plan.arena.builtin_of)
    "custom:TFLite_Detection_PostProcess": ("kernels/detection_postprocess.cc", "tflite::OpData"),
}

# TFLM's CMSIS-NN kernel variants (kernels/cmsis_nn/*.cc, third_party/tflite_micro.BUILD) allocate their own
# OpData; the other kernels of a CMSIS-NN build are the reference ones (OP_DATA).
CMSIS_NN_OP_DATA = {
    "CONV_2D": ("kernels/cmsis_nn/conv.cc", "tflite::OpData"),
    "DEPTHWISE_CONV_2D": ("kernels/cmsis_nn/depthwise_conv.cc", "tflite::OpData"),
    "FULLY_CONNECTED": ("kernels/cmsis_nn/fully_connected.cc", "tflite::OpData"),
    "ADD": ("kernels/cmsis_nn/add.cc", "tflite::OpData"),
    "AVERAGE_POOL_2D": ("kernels/cmsis_nn/pooling.cc", "tflite::OpData"),
    "MAX_POOL_2D": ("kernels/cmsis_nn/pooling.cc", "tflite::OpData"),
    "SOFTMAX": ("kernels/cmsis_nn/softmax.cc", "tflite::CMSISNNSoftmaxParams"),
}

PROFILES = {
    "x86_64": {"cxx": "g++", "objcopy": "objcopy", "flags": []},
    "cortex-m": {"cxx": "arm-none-eabi-g++", "objcopy": "arm-none-eabi-objcopy",
                 "flags": ["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"]},
    # The CMSIS-NN kernels' OpData only (the rest is "cortex-m").
    "cortex-m-cmsis-nn": {"cxx": "arm-none-eabi-g++", "objcopy": "arm-none-eabi-objcopy",
                          "flags": ["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard",
                                    "-DCMSIS_NN"]},
}


def extract(third_party, dest):
    """The archives' include roots (TFLM top folder, flatbuffers/include, gemmlowp, ruy)."""
    roots = {}
    for name, commit in ARCHIVES.items():
        path = os.path.join(third_party, commit + ".tar.gz")
        if not os.path.exists(path):
            raise SystemExit("gen_tflm_abi: %s archive %s not found" % (name, path))
        with tarfile.open(path) as tf:
            top = tf.getmembers()[0].name.split("/")[0]
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".h", ".cc", ".inc"))]
            if name == "cmsis_nn":  # TFLM includes "Include/arm_nnfunctions.h" from the archive's top folder
                top = members[0].name.split("/")[0]
            tf.extractall(dest, members=members)
        root = os.path.join(dest, top)
        roots[name] = os.path.join(root, "include") if name == "flatbuffers" else root
        if name == "cmsis_nn":
            roots["cmsis_nn_include"] = os.path.join(root, "Include")
    return roots


def measure(profile, roots, items, tmp):
    """[[size, align], ...] of items [(include, type), ...]: the headers in one translation unit, each .cc (whose
    anonymous-namespace names may clash) in its own. FlatBuffers' TFLite schema, which every unit includes, is
    precompiled once (GCC's .gch, as the Bazel build does: tools/bazel/pch.bzl) and the units compile in parallel."""
    micro = "tensorflow/lite/micro/"
    units = {}
    for k, (include, typ) in enumerate(items):
        unit = include if include.endswith(".cc") else "headers"
        units.setdefault(unit, []).append((k, include, typ))
    p = PROFILES[profile]
    flags = ["-std=c++17", "-O0", "-fno-rtti", "-fno-exceptions", "-DTF_LITE_STATIC_MEMORY", "-fdata-sections",
             "-w"] + p["flags"] + ["-I" + r for r in roots.values()]
    pch_dir = os.path.join(tmp, "pch_" + profile)
    os.makedirs(pch_dir, exist_ok=True)
    pch = os.path.join(pch_dir, "tfmcu_abi_pch.h")
    with open(pch, "w") as f:
        f.write('#include "tensorflow/lite/schema/schema_generated.h"\n')
    r = subprocess.run([p["cxx"]] + flags + ["-x", "c++-header", pch, "-o", pch + ".gch"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit("gen_tflm_abi: %s: precompiling the schema: %s" % (profile, r.stderr[-2000:]))

    def compile_unit(u, unit, members):
        src = os.path.join(tmp, "%s_probe%d.cc" % (profile, u))
        with open(src, "w") as f:
            for inc in sorted({inc for _, inc, _ in members}):
                f.write('#include "%s"\n' % os.path.normpath(micro + inc))
            for k, _, typ in members:
                f.write('extern "C" const unsigned tfmcu_abi_%d[2] = {sizeof(%s), alignof(%s)};\n' % (k, typ, typ))
        obj = os.path.join(tmp, "%s_probe%d.o" % (profile, u))
        r = subprocess.run([p["cxx"], "-c"] + flags + ["-include", pch, src, "-o", obj], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit("gen_tflm_abi: %s %s: %s" % (profile, unit, r.stderr[-2000:]))
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objs = list(pool.map(lambda a: compile_unit(*a), [(u, unit, m) for u, (unit, m) in enumerate(units.items())]))
    out = [None] * len(items)
    for obj, members in zip(objs, units.values()):
        for k, _, _ in members:
            raw = os.path.join(tmp, "abi.bin")
            subprocess.run([p["objcopy"], "-O", "binary", "--only-section=.rodata.tfmcu_abi_%d" % k, obj, raw],
                           check=True)
            data = open(raw, "rb").read()
            out[k] = [int.from_bytes(data[0:4], "little"), int.from_bytes(data[4:8], "little")]
    return out


def generate(third_party):
    out = {"source": "tflite-micro %s, -DTF_LITE_STATIC_MEMORY, compiled by tools/gen/gen_tflm_abi.py" %
           ARCHIVES["tflm"][:7]}
    with tempfile.TemporaryDirectory() as tmp:
        roots = extract(third_party, tmp)
        for profile in PROFILES:
            if profile == "cortex-m-cmsis-nn":
                sizes = measure(profile, roots, list(CMSIS_NN_OP_DATA.values()), tmp)
                out[profile] = {"op_data": {op: sz[0] for op, sz in zip(CMSIS_NN_OP_DATA, sizes)}}
                print("gen_tflm_abi: %s done" % profile, file=sys.stderr)
                continue
            items = list(CORE.values()) + [(_BD, t) for t in BUILTIN_DATA.values()] + list(OP_DATA.values())
            sizes = measure(profile, roots, items, tmp)
            n1, n2 = len(CORE), len(CORE) + len(BUILTIN_DATA)
            out[profile] = {
                "abi": dict(zip(CORE, sizes[:n1])),
                "builtin_data": dict(zip(BUILTIN_DATA, sizes[n1:n2])),
                "op_data": {op: sz[0] for op, sz in zip(OP_DATA, sizes[n2:])},
            }
            print("gen_tflm_abi: %s done" % profile, file=sys.stderr)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--third-party", default=os.environ.get("TFMCU_THIRD_PARTY",
                                                            os.path.join(ROOT, "..", "shared", "third_party")))
    ap.add_argument("--out", default=os.path.join(ROOT, "tfmcu", "plan", "tflm_abi.json"))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args(argv)
    table = generate(a.third_party)
    if a.check:
        with open(a.out) as f:
            committed = json.load(f)
        if committed != table:
            print("gen_tflm_abi: %s is stale: run tools/gen/gen_tflm_abi.py" % a.out, file=sys.stderr)
            return 1
        print("gen_tflm_abi: %s is current" % a.out)
        return 0
    with open(a.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
