"""Generates the cases of the in-place probe firmware (inplace_probe.c): one int8 operator per CMSIS-NN kernel path
and shape class that runs in a CMSIS-NN build (TFLM's kernels/cmsis_nn and the patch executor's CMSIS-NN backend),
each with the in-place distance ``tfmcu.plan.memory_plan.inplace_distance(..., kernels="cmsis_nn")`` derives, so the
derivation and the evidence cannot drift apart.

usage: gen_inplace_probe.py [--mve] --out-c inplace_probe_cases.c --out-expect inplace_probe_expect.json

The firmware runs every case with the output D bytes before its input (bit-exact with a disjoint run required) and
D - 1 ... D - slack bytes before it (one of them must change the output: the distance is tight). ``CASES`` lists the
shape classes; ``cases()`` returns them with their distances (tests/test_inplace_cmsis_nn.py checks them too).

``--mve``: the cases for a Helium build (Cortex-M55, CMSIS-NN's MVE code): distances from ``inplace_distance(...,
mve=True)``, the folded 1x1 product left out (conv1x1_folded.c is compiled out there), ``MVE_CASES`` added (the
shape classes of the MVE-only paths and loops).
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # run from anywhere, also outside Bazel

from tfmcu import abi  # noqa: E402
from tfmcu.graph import ir  # noqa: E402
from tfmcu.plan import cmsis_nn  # noqa: E402
from tfmcu.plan.memory_plan import inplace_distance  # noqa: E402

# The probe's operator kinds (inplace_probe.c: ProbeKind) and how each one is called.
KINDS = {"conv": 0, "depthwise": 1, "avg_pool": 2, "max_pool": 3, "add": 4, "mul": 5}
BINARY = ("add", "mul")  # the kinds with two inputs (a case named *_in2 overlaps input 2)
# the call TFLM's kernels/cmsis_nn makes, the patch backend's *_cmsis_nn_run, or that run of a 1x1 convolution whose
# input offset the packer folded into its bias (input offset 0; a call abi.conv1x1_folded chooses: our product
# without per-call filter sums, in CMSIS-NN's order)
VIA = {"tflm": 0, "backend": 1, "backend_folded": 2}

# (name, kind, via, input (h, w, c), output channels, kernel, stride, padding (top, bottom, left, right))
CASES = [
    # arm_convolve_s8 (im2col, two pixels per step): even and odd pixel counts, stride 2 with TF's SAME split,
    # the 1 x N class (input height 1: arm_convolve_s8 on DSP cores)
    ("conv3x3_s1", "conv", "tflm", (8, 8, 4), 6, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("conv3x3_s1_odd_pixels", "conv", "tflm", (7, 5, 3), 5, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("conv3x3_s2", "conv", "tflm", (8, 8, 3), 8, (3, 3), (2, 2), (0, 1, 0, 1)),
    ("conv1x3_height1", "conv", "tflm", (1, 9, 4), 6, (1, 3), (1, 1), (0, 0, 1, 1)),
    # arm_convolve_1x1_s8_fast (channel pairs outside the pixels): expansion, projection, odd channels / pixels
    ("conv1x1_expand", "conv", "tflm", (4, 4, 4), 16, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("conv1x1_project", "conv", "tflm", (6, 6, 16), 4, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("conv1x1_odd", "conv", "tflm", (5, 5, 6), 5, (1, 1), (1, 1), (0, 0, 0, 0)),
    # arm_convolve_1x1_s8 (strided: the same per output row)
    ("conv1x1_s2", "conv", "tflm", (8, 8, 8), 6, (1, 1), (2, 2), (0, 0, 0, 0)),
    ("conv1x1_s2_odd", "conv", "tflm", (7, 7, 4), 3, (1, 1), (2, 2), (0, 0, 0, 0)),
    # arm_depthwise_conv_3x3_s8: groups of four channels, leftovers, stride 2
    ("dw3x3_s1", "depthwise", "tflm", (8, 8, 16), 16, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("dw3x3_s1_leftover", "depthwise", "tflm", (6, 6, 10), 10, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("dw3x3_s2_leftover", "depthwise", "tflm", (9, 9, 10), 10, (3, 3), (2, 2), (1, 1, 1, 1)),
    ("dw3x3_s2_same_even", "depthwise", "tflm", (8, 8, 7), 7, (3, 3), (2, 2), (0, 1, 0, 1)),
    # arm_depthwise_conv_s8_opt (other kernels, depth multiplier 1)
    ("dw5x5_opt", "depthwise", "tflm", (8, 8, 8), 8, (5, 5), (1, 1), (2, 2, 2, 2)),
    ("dw5x5_opt_s2", "depthwise", "tflm", (9, 9, 6), 6, (5, 5), (2, 2), (2, 2, 2, 2)),
    # arm_depthwise_conv_s8 (depth multiplier > 1): per output channel, and tiles of four (multiplier 4)
    ("dw3x3_mult2", "depthwise", "tflm", (6, 6, 4), 8, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("dw3x3_mult4", "depthwise", "tflm", (6, 6, 3), 12, (3, 3), (1, 1), (1, 1, 1, 1)),
    # arm_avgpool_s8 / arm_max_pool_s8
    ("avgpool2x2_s2", "avg_pool", "tflm", (8, 8, 8), 8, (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avgpool3x3_s1", "avg_pool", "tflm", (6, 6, 5), 5, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("maxpool2x2_s2", "max_pool", "tflm", (8, 8, 8), 8, (2, 2), (2, 2), (0, 0, 0, 0)),
    ("maxpool3x3_s1", "max_pool", "tflm", (6, 6, 5), 5, (3, 3), (1, 1), (1, 1, 1, 1)),
    # arm_elementwise_add_s8: four at a time, then the leftovers (output over either input)
    ("add_in1", "add", "tflm", (6, 6, 7), 7, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("add_in2", "add", "tflm", (4, 4, 9), 9, (1, 1), (1, 1), (0, 0, 0, 0)),
    # arm_elementwise_mul_s8: the same order
    ("mul_in1", "mul", "tflm", (5, 6, 7), 7, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mul_in2", "mul", "tflm", (4, 4, 9), 9, (1, 1), (1, 1), (0, 0, 0, 0)),
    # The patch backend's run on whole tensors (a one-layer TFMCU_PATCH_STAGE op, rewrite --rest_convs=tfmcu)
    ("stage_conv3x3", "conv", "backend", (7, 5, 3), 5, (3, 3), (1, 1), (1, 1, 1, 1)),
    # (on DSP cores these two run tfmcu_conv2d_shallow_s8, in arm_convolve_s8's order: pairs of pixels across rows)
    ("stage_conv3x3_s2_rgb", "conv", "backend", (9, 9, 3), 8, (3, 3), (2, 2), (1, 1, 1, 1)),
    ("stage_conv1x1", "conv", "backend", (6, 6, 16), 4, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("stage_conv1x1_s2", "conv", "backend", (7, 7, 4), 3, (1, 1), (2, 2), (0, 0, 0, 0)),
    ("stage_conv1x1_folded", "conv", "backend_folded", (3, 3, 16), 4, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("stage_conv1x1_folded_odd", "conv", "backend_folded", (3, 5, 12), 5, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("stage_conv1x1_folded_steps", "conv", "backend_folded", (2, 5, 30), 6, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("stage_conv1x1_folded_k8", "conv", "backend_folded", (5, 7, 8), 12, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("stage_dw3x3", "depthwise", "backend", (9, 9, 10), 10, (3, 3), (2, 2), (1, 1, 1, 1)),
    # (on DSP cores channels in fours run tfmcu_depthwise_conv3x3_s8's inner pixels: a group read, then written)
    ("stage_dw3x3_groups", "depthwise", "backend", (8, 8, 16), 16, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("stage_dw3x3_groups_s2", "depthwise", "backend", (9, 9, 8), 8, (3, 3), (2, 2), (1, 1, 1, 1)),
    ("stage_dw5x5_opt", "depthwise", "backend", (8, 8, 8), 8, (5, 5), (1, 1), (2, 2, 2, 2)),
]
# Cases whose kernel reads in an order safer than the one their distance is derived from: checked bit-exact at the
# distance, not for tightness (slack 0). tfmcu_conv1x1_folded_s8 over 8 input channels reads each chunk of 32 pixels
# once, before it writes the chunk's outputs; the plans keep CMSIS-NN's order (every pass re-reads the input).
SAFER_THAN_DECLARED = ("stage_conv1x1_folded_k8",)
# Helium only (cases(mve=True)): arm_convolve_1_x_n_s8 (sections, asymmetric padding, stride 2, its fallback to
# arm_convolve_s8; arm_convolve_s8 for stride x channels not a multiple of 4), arm_nn_mat_mult_nt_t_s8's
# blocks of four pixels with leftover pixels, channels and a 16-byte tail, arm_depthwise_conv_s8_opt's channel blocks
# of 124, one input channel into several run as a convolution, 16-channel blocks of the pooling kernels, ADD's and
# MUL's tails.
MVE_CASES = [
    ("mve_conv1x5_height1", "conv", "tflm", (1, 12, 4), 6, (1, 5), (1, 1), (0, 0, 2, 2)),
    ("mve_conv1x3_height1_leftover", "conv", "tflm", (1, 11, 8), 5, (1, 3), (1, 1), (0, 0, 1, 1)),
    ("mve_conv1x3_height1_valid", "conv", "tflm", (1, 10, 4), 6, (1, 3), (1, 1), (0, 0, 0, 0)),
    ("mve_conv1x4_height1_asym", "conv", "tflm", (1, 9, 4), 4, (1, 4), (1, 1), (0, 0, 1, 2)),
    ("mve_conv1x3_height1_s2", "conv", "tflm", (1, 16, 2), 6, (1, 3), (1, 2), (0, 0, 0, 1)),
    ("mve_conv1x7_height1_narrow", "conv", "tflm", (1, 5, 4), 6, (1, 7), (1, 1), (0, 0, 3, 3)),
    ("mve_conv1x3_height1_c3", "conv", "tflm", (1, 9, 3), 6, (1, 3), (1, 1), (0, 0, 1, 1)),
    ("mve_conv3x3_c16", "conv", "tflm", (5, 5, 16), 8, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_conv1x1_leftover", "conv", "tflm", (3, 5, 20), 6, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_conv1x1_expand_leftover", "conv", "tflm", (3, 3, 8), 24, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_conv1x1_s2_leftover", "conv", "tflm", (5, 10, 4), 7, (1, 1), (2, 2), (0, 0, 0, 0)),
    ("mve_dw3x3_channel_blocks", "depthwise", "tflm", (2, 3, 130), 130, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_dw3x3_pixel_leftover", "depthwise", "tflm", (5, 5, 12), 12, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_dw3x3_one_in_channel", "depthwise", "tflm", (6, 6, 1), 8, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_dw1x1_one_in_channel", "depthwise", "tflm", (5, 5, 1), 6, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_avgpool3x3_c20", "avg_pool", "tflm", (5, 5, 20), 20, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_maxpool3x3_c33", "max_pool", "tflm", (4, 4, 33), 33, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("mve_add_tail", "add", "tflm", (3, 3, 5), 5, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_mul_tail", "mul", "tflm", (3, 3, 5), 5, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_stage_conv1x1_one_pixel", "conv", "backend", (1, 1, 16), 8, (1, 1), (1, 1), (0, 0, 0, 0)),
    ("mve_stage_conv1x5_height1", "conv", "backend", (1, 12, 4), 6, (1, 5), (1, 1), (0, 0, 2, 2)),
    ("mve_stage_dw3x3_channel_blocks", "depthwise", "backend", (2, 3, 130), 130, (3, 3), (1, 1), (1, 1, 1, 1)),
]
_BUILTIN = {"conv": ("CONV_2D", ir.CONV), "depthwise": ("DEPTHWISE_CONV_2D", ir.DEPTHWISE),
            "avg_pool": ("AVERAGE_POOL_2D", ir.AVG_POOL), "max_pool": ("MAX_POOL_2D", ir.MAX_POOL),
            "add": ("ADD", ir.ADD), "mul": ("MUL", ir.MUL)}


def out_shape(in_shape, out_c, kernel, stride, padding):
    h, w, _ = in_shape
    return (ir.window_out_size(h, kernel[0], stride[0], 1, padding[0], padding[1]),
            ir.window_out_size(w, kernel[1], stride[1], 1, padding[2], padding[3]), out_c)


def case_graph(kind, in_shape, out_c, kernel, stride, padding):
    """The case as a one-operator graph (what inplace_distance sees for such a TFLite operator)."""
    y_shape = out_shape(in_shape, out_c, kernel, stride, padding)
    tensors = {"x": ir.Tensor("x", (1,) + tuple(in_shape)), "y": ir.Tensor("y", (1,) + y_shape)}
    inputs = ["x"]
    if kind in BINARY:
        tensors["x2"] = ir.Tensor("x2", (1,) + tuple(in_shape))
        inputs = ["x", "x2"]
    builtin, typ = _BUILTIN[kind]
    op = ir.Op("op", typ, inputs, ["y"], kernel=tuple(kernel), stride=tuple(stride), padding=tuple(padding),
               in_channels=in_shape[2], out_channels=out_c, groups=in_shape[2] if kind == "depthwise" else 1,
               attrs={"tflite_op": builtin})
    return ir.Graph("probe", tensors, [op], inputs, ["y"]), op


def cases(mve: bool = False):
    """Every case as a dict: its geometry, the CMSIS-NN path it takes, its distance D and the slack (how many bytes
    closer than D one byte of the output may still come out the same: a 1x1 or im2col convolution's binding byte
    may be overwritten with an equal value, or change its one accumulator by less than an output step; 4 for the
    convolution paths, 1 for the others, whose binding byte feeds several outputs or moves a mean or a maximum).
    ``mve``: for a Helium build (see the module docstring)."""
    out = []
    for name, kind, via, in_shape, out_c, kernel, stride, padding in CASES + (MVE_CASES if mve else []):
        if via == "backend_folded" and mve:
            continue  # (conv1x1_folded.c is built for DSP cores without Helium only)
        if via == "backend_folded" and not abi.conv1x1_folded(in_shape[0] * in_shape[1], in_shape[2]):
            raise SystemExit(f"gen_inplace_probe: case {name} does not run the folded product (abi.conv1x1_folded)")
        g, op = case_graph(kind, in_shape, out_c, kernel, stride, padding)
        overlapped = "x2" if kind in BINARY and name.endswith("_in2") else "x"
        d = inplace_distance(g, op, overlapped, kernels="cmsis_nn", mve=mve)
        ref = inplace_distance(g, op, overlapped, kernels="reference")
        order = cmsis_nn.processing_order(kind, in_shape, g.tensors["y"].shape[1:], kernel, stride,
                                          (padding[0], padding[2]), mve=mve)
        path = None if order is None else order[0]
        # (with Helium one input channel into several runs as a convolution)
        convolution = kind == "conv" or (path or "").startswith("arm_convolve")
        out.append({"name": name, "kind": kind, "via": via, "in": tuple(in_shape),
                    "out": g.tensors["y"].shape[1:], "kernel": kernel, "stride": stride, "padding": padding,
                    "overlapped": 2 if overlapped == "x2" else 1, "distance": d, "path": path,
                    "slack": 0 if name in SAFER_THAN_DECLARED else 4 if convolution else 1,
                    "reference_distance": -1 if ref is None else ref})
    return out


def _c_array(ctype, name, values):
    body = ", ".join(str(int(v)) for v in values)
    return f"static const {ctype} {name}[{max(len(values), 1)}] = {{{body or '0'}}};\n"


def source(all_cases, seed=0):
    """The cases as C (inplace_probe.h: kProbeCases, kProbeNumCases), with seeded random tensors."""
    rng = np.random.default_rng(seed)
    lines = ["/* Generated by tflm_patch_kernels/firmware/gen_inplace_probe.py: the in-place probe's cases. */\n",
             "#include \"tflm_patch_kernels/firmware/inplace_probe.h\"\n\n"]
    rows = []
    for k, c in enumerate(all_cases):
        h, w, ci = c["in"]
        ho, wo, co = c["out"]
        x = rng.integers(-128, 128, h * w * ci)
        x2 = rng.integers(-128, 128, h * w * ci) if c["kind"] in BINARY else np.zeros(1)
        lines.append(_c_array("int8_t", f"k_in{k}", x))
        lines.append(_c_array("int8_t", f"k_in2_{k}", x2))
        taps = c["kernel"][0] * c["kernel"][1] * (ci if c["kind"] == "conv" else 1)
        if c["kind"] in ("conv", "depthwise"):  # filters [co][kh][kw][ci] and [1][kh][kw][co]
            filt = rng.integers(-127, 128, co * taps)
            bias = rng.integers(-2000, 2000, co)
            # Output scale: accumulators of about 64 x 74 x sqrt(taps) brought to about +-50 (few clamped bytes).
            acc = 64.0 * 74.0 * np.sqrt(taps)
            mult = rng.integers(1 << 30, (1 << 31) - 1, co)
            shift = np.full(co, -int(np.round(np.log2(acc / 50.0))))
        else:
            filt, bias, mult, shift = np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1)
        lines.append(_c_array("int8_t", f"k_filter{k}", filt))
        lines.append(_c_array("int32_t", f"k_bias{k}", bias))
        lines.append(_c_array("int32_t", f"k_mult{k}", mult))
        lines.append(_c_array("int32_t", f"k_shift{k}", shift))
        pt, _, pl, _ = c["padding"]
        rows.append("  {\"%s\", %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d,\n"
                    "   k_in%d, k_in2_%d, k_filter%d, k_bias%d, k_mult%d, k_shift%d}" % (
                        c["name"], KINDS[c["kind"]], VIA[c["via"]], h, w, ci, ho, wo, co, c["kernel"][0],
                        c["kernel"][1], c["stride"][0], c["stride"][1], pt, pl, c["overlapped"], c["distance"],
                        c["slack"], c["reference_distance"], k, k, k, k, k, k))
    lines.append("\nconst ProbeCase kProbeCases[] = {\n" + ",\n".join(rows) + "\n};\n")
    lines.append("const int32_t kProbeNumCases = %d;\n" % len(all_cases))
    return "".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-c", required=True)
    ap.add_argument("--out-expect", required=True)
    ap.add_argument("--mve", action="store_true", help="the cases for a Helium (Cortex-M55) build")
    a = ap.parse_args(argv)
    all_cases = cases(mve=a.mve)
    if any(c["distance"] is None for c in all_cases):
        raise SystemExit("gen_inplace_probe: no distance for %s" % [c["name"] for c in all_cases
                                                                     if c["distance"] is None])
    with open(a.out_c, "w") as f:
        f.write(source(all_cases))
    expect = {"test": "inplace_probe",
              "expect": {"test": "inplace_probe", "cases": len(all_cases), "failed": 0, "status": 0},
              "host": {c["name"]: {"path": c["path"], "via": c["via"], "distance": c["distance"],
                                   "reference_distance": c["reference_distance"]} for c in all_cases}}
    with open(a.out_expect, "w") as f:
        json.dump(expect, f, indent=1)


if __name__ == "__main__":
    main()
