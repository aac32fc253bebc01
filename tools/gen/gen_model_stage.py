"""Generates the model firmware's C data: a zoo model's patch stage, packed twice (p x p patches, and 1 x 1 =
layer by layer), a test input, RAM buffers, and the stage output the host expects; plus the expectation JSON.

usage: gen_model_stage.py --model NAME --out-c OUT.c --out-expect OUT.json
                          [--patches 2] [--blocks N | --ops K] [--seed 0] [--cache-dir DIR | --tflite FILE]

- The model comes from tfmcu.nets.zoo, converted with TF here (5-20 s), or taken from --cache-dir (zoo.build's cache,
  keyed by zoo.py only: fine by hand), or from --tflite (the Bazel build converts each zoo model once, with
  tools/gen/gen_zoo_model.py, for every generator that reads it: a change anywhere in tfmcu is still seen). The stage defaults to the zoo entry's patch_blocks / patch_ops.
- Both schedules are packed with tfmcu.kernels.pack.pack_stage and written with stage_to_c (weights as const
  arrays, i.e. in Flash).
- The expected stage output is TF Lite's (tf.lite.Interpreter, reference kernels, all tensors preserved: the
  stage output is an intermediate tensor of the model), for a seeded random input
  (tfmcu.runtime.model_io.random_inputs).
  The host C executor (ctypes) runs both schedules too; whether it agrees with TF Lite is recorded under "host"
  in the JSON (the firmware test does not depend on it).

The C file defines what model_main.c declares in model_data.h. The JSON holds {"expect": {...}} for
tools/qemu/run_firmware.py --expect: the firmware must print the same output hashes (FNV-1a of the int8 output).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_common import ROOT, fnv1a32  # noqa: E402


def c_bytes(ctype, name, data, attrs=""):
    flat = np.asarray(data).reshape(-1)
    vals = [str(int(v)) for v in flat.view(np.uint8)] if ctype == "uint8_t" else [str(int(v)) for v in flat]
    lines = [", ".join(vals[i:i + 24]) for i in range(0, len(vals), 24)]
    return "const %s %s[%d]%s = {\n  %s\n};\n" % (ctype, name, len(vals), attrs, ",\n  ".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a tfmcu.nets.zoo model name, e.g. tiny_per_tensor, mbv2_035_96")
    ap.add_argument("--out-c", required=True)
    ap.add_argument("--out-expect", required=True)
    ap.add_argument("--patches", type=int, default=2, help="p: the stage runs as a p x p grid (and as 1 x 1)")
    ap.add_argument("--blocks", type=int, help="patch stage = the first N blocks (default: the zoo entry's)")
    ap.add_argument("--ops", type=int, help="patch stage = the first K ops")
    ap.add_argument("--seed", type=int, default=0, help="seed of the test input")
    ap.add_argument("--cache-dir", help="cache of converted zoo models (default: none)")
    ap.add_argument("--tflite", help="the zoo model's .tflite, converted already (gen_zoo_model.py)")
    a = ap.parse_args(argv)
    if a.patches < 2:
        ap.error("--patches must be at least 2 (1 x 1 is always generated as the per-layer run)")

    sys.path.insert(0, ROOT)  # run from anywhere, also outside Bazel
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.kernels import PatchKernelError
    from tfmcu.kernels.binding import run_stage
    from tfmcu.kernels.codegen import INCLUDE, stage_to_c
    from tfmcu.kernels.pack import pack_stage
    from tfmcu.nets import zoo
    from tfmcu.plan.regions import schedule
    from tfmcu.runtime.model_io import random_inputs
    from tfmcu.runtime.tflite import tflite_all_tensors

    entry = zoo.ZOO[a.model]
    if a.tflite:  # the zoo model converted once for every generator (tools/gen/gen_zoo_model.py)
        with open(a.tflite, "rb") as f:
            model = f.read()
    else:
        model = zoo.build(a.model, a.cache_dir)
    graph = from_tflite(model, name=a.model)
    if a.blocks is None and a.ops is None:
        blocks, ops = entry.patch_blocks, entry.patch_ops
    else:
        blocks, ops = a.blocks, a.ops

    scheds = {"patched": schedule(graph, a.patches, n_blocks=blocks, n_ops=ops),
              "layer": schedule(graph, 1, n_blocks=blocks, n_ops=ops)}
    packed = {k: pack_stage(model, graph, s, name="tfmcu_model_stage_" + k) for k, s in scheds.items()}
    pp = packed["patched"]
    if scheds["patched"].stage_inputs[0] not in graph.inputs:
        raise SystemExit("gen_model_stage: the patch stage must start at the model input")

    x = random_inputs(model, 1, seed=a.seed)[0][0]
    if x.shape != pp.input_shape or x.dtype != np.dtype(pp.input_dtype):
        raise SystemExit("gen_model_stage: model input %s %s, stage input %s %s" % (
            x.shape, x.dtype, pp.input_shape, np.dtype(pp.input_dtype)))
    out_index = pp.tensor_tflite_index[pp.output_tensor]
    ref = tflite_all_tensors(model, (x,))(out_index)
    if ref.shape != pp.output_shape or ref.dtype != np.int8:
        raise SystemExit("gen_model_stage: TF Lite tensor %d is %s %s, the stage output %s int8" % (
            out_index, ref.shape, ref.dtype, pp.output_shape))
    ref_hash = fnv1a32(ref.tobytes())
    host = {}
    for k, p in packed.items():
        try:
            y = run_stage(p, x)
            host["c_matches_tflite_" + k] = bool(np.array_equal(y, ref))
            host["c_output_hash_" + k] = "0x%08x" % fnv1a32(y.tobytes())
        except PatchKernelError as e:  # the host build is only a cross-check here
            host["c_error_" + k] = str(e)

    scratch = max(p.scratch_bytes for p in packed.values())
    in_bytes = int(x.nbytes)
    out_bytes = int(ref.nbytes)
    grid = "%dx%d" % tuple(pp.grid)
    parts = [
        "/* Generated by tflm_patch_kernels/firmware/gen_model_stage.py: do not edit.\n"
        " * model %s, stage of %s, %d layers, patched grid %s; input seed %d. */\n" % (
            a.model, "%d blocks" % blocks if blocks is not None else "%d ops" % ops, len(pp.layers), grid, a.seed),
        '#include "tflm_patch_kernels/firmware/model_data.h"\n\n',
    ]
    for k, p in packed.items():
        src = stage_to_c(p, "tfmcu_model_stage_" + k)
        src = src.replace(INCLUDE, "")  # model_data.h, included above, brings the stage's types
        parts.append(src + "\n")
    parts += [
        'const char tfmcu_model_name[] = "%s";\n' % a.model,
        'const char tfmcu_model_grid[] = "%s";\n' % grid,
        "const uint32_t tfmcu_model_input_bytes = %du;\n" % in_bytes,
        "const uint32_t tfmcu_model_output_bytes = %du;\n" % out_bytes,
        "const uint32_t tfmcu_model_scratch_bytes = %du;\n" % scratch,
        "const uint32_t tfmcu_model_expected_hash = 0x%08xu;\n" % ref_hash,
        "const int64_t tfmcu_model_macs_patched = %d;\n" % scheds["patched"].stage_macs_patched_exact,
        "const int64_t tfmcu_model_macs_layer = %d;\n" % scheds["layer"].stage_macs,
        c_bytes("uint8_t", "tfmcu_model_input_flash", x, " __attribute__((aligned(8)))"),
        "\n/* RAM: the input (copied from Flash at start, as a camera frame would land), the stage output, and one\n"
        " * scratch buffer for the patch buffers, large enough for both schedules. */\n",
        "uint8_t tfmcu_model_input[%d] __attribute__((aligned(8)));\n" % in_bytes,
        "int8_t tfmcu_model_output[%d] __attribute__((aligned(8)));\n" % out_bytes,
        "uint8_t tfmcu_model_scratch[%d] __attribute__((aligned(8)));\n" % max(scratch, 1),
    ]
    with open(a.out_c, "w") as f:
        f.write("".join(parts))

    expect = {
        "expect": {
            "test": "model_stage",
            "model": a.model,
            "grid": grid,
            "expected_hash": "0x%08x" % ref_hash,
            "output_hash_patched": "0x%08x" % ref_hash,
            "output_hash_layer": "0x%08x" % ref_hash,
            "scratch_planned_patched": pp.scratch_bytes,
            "scratch_planned_layer": packed["layer"].scratch_bytes,
            "status": 0,
        },
        "host": dict(host, tflite_output_tensor=int(out_index), input_shape=list(pp.input_shape),
                     output_shape=list(pp.output_shape), layers=[s.name for s in pp.layers],
                     macs_layer=int(scheds["layer"].stage_macs),
                     macs_patched_exact=int(scheds["patched"].stage_macs_patched_exact),
                     peak_bytes_patched=int(scheds["patched"].stage_peak_bytes),
                     peak_bytes_layer=int(scheds["layer"].stage_peak_bytes)),
    }
    with open(a.out_expect, "w") as f:
        json.dump(expect, f, indent=1)
        f.write("\n")
    mism = [k for k, v in host.items() if k.startswith("c_matches") and not v] + [k for k in host if "error" in k]
    if mism:
        print("gen_model_stage: note: the host C executor disagrees with TF Lite (%s)" % ", ".join(mism),
              file=sys.stderr)


if __name__ == "__main__":
    main()
