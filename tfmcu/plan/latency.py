"""The latency predictor: instructions per Invoke of a model in TFLM on a Cortex-M core, per-op cost models
calibrated on QEMU instruction counts.

    p = predict_instructions(model, "cortex-m4", "cmsis_nn")
    p.instructions, p.per_op, p.what

* ``op_features(model)``: per operator of subgraph 0, its cost features: MACs, output / input elements, output
  pixels and rows, kernel size, stride, the code path it takes (``path``: CMSIS-NN's 1x1 fast conv, 3x3 depthwise,
  generic ...). A ``TFMCU_PATCH_STAGE`` op (``tfmcu.tflite.patch_stage_format``) is its layers run on every patch
  of its grid: the same features summed over the kernel calls its span tables describe (the boxes each layer
  computes per patch; with halo caches, only what the caches do not hold), plus what the executor copies (cache
  bytes, the streamed input's rows) and its call counts. One-layer stages (``rewrite --rest_convs=tfmcu``) are
  the same with one call.
* A builtin op's cost is a linear function of its features, one row of coefficients per (core, kernels, op path);
  an element-wise op of two operands with one broadcast has rows of its own (TFLM's broadcast loops).
  A stage's cost with CMSIS-NN is linear in its calls' costs summed per kind (conv, depthwise, other: priced by the
  builtin rows of the same path, since the backend calls the CMSIS-NN functions TFLM's kernels call) and in the
  executor's terms (calls, output rows, patches, cache and streamed bytes); with the portable C kernels (not TFLM's
  reference kernels) its calls have rows of their own (``stage_rows``), fitted on the stage ops. In both, the calls of
  the portable element-wise kernels (``PORTABLE``) are priced by those kernels' rows, fitted on their own counts.
  A stage of squeeze-excites sweeps its grid in passes: a layer counts in every pass it runs in.
  The Invoke adds a constant and a per-op cost (TFLM's interpreter loop and the profiler hook).
* The coefficients and the measurements they were fitted on are in ``latency_calibration.json`` beside this file;
  ``python -m benchmarks.latency`` measures and fits them again (``fit`` here), see docs/latency.md.

The model is parsed once (``tfmcu.tflite.model``); no TensorFlow: a prediction takes milliseconds.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfmcu import abi
from tfmcu.errors import UsageError
from tfmcu.plan.arena import MVE_CORES, NO_DSP_CORES
from tfmcu.tflite import patch_stage_format as psf
from tfmcu.tflite.detection_postprocess import OP_NAME as DETECTION_POSTPROCESS
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import TfliteModel, as_model

CALIBRATION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "latency_calibration.json")
CORES = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")  # calibrated (benchmarks/latency.py)
# Cores without calibration rows (no QEMU board runs them), priced with a calibrated core's rows: an estimate of an
# estimate, which ``LatencyPrediction.what`` says. The Cortex-M0+ runs CMSIS-NN's plain C paths (no DSP
# instructions) as the Cortex-M3 does, on the Armv6-M instruction set (fewer instructions than Armv7-M: more of them
# per operation); what `fit` uses are ratios between plans of one model on one core.
STAND_INS = {"cortex-m0plus": "cortex-m3"}
KERNELS = ("cmsis_nn", "reference")

# The features of one kernel call (a builtin op, or one layer on one patch), in the coefficient rows' order.
# wts: filter elements times the kernel calls (CMSIS-NN's 1x1 path sums every filter row once per call).
# rmacs: a convolution's MACs past the last multiple of 16 of each output's reduction (kh x kw x cin), which
# CMSIS-NN's DSP matrix product runs in its 4-wide loop after the 16-wide one (a 1x1 convolution over 24 input
# channels costs more per MAC than one over 16 or 32); wide: the outputs of a convolution whose reduction is 16
# or longer (that loop entered); omacs: a convolution's MACs for the odd last pixel of each call (the product
# runs pixels in pairs, an odd last one by a loop of its own); chans: a convolution's output channels times its
# calls (each pair of filter rows set up once per call).
# On a Helium core (MVE_CORES) a convolution's product (arm_nn_mat_mult_nt_t_s8's MVE loop) runs its pixels four
# at a time, per output channel its reduction in 16-wide predicated steps, then each leftover pixel four output
# channels at a time: those steps (mve_steps4, mve_steps1), the four-pixel blocks' and leftover pixels' output
# channel passes (mve_blocks4, mve_blocks1) and the leftover pixels (mve_rows1), summed over its calls. They are
# fitted on Helium cores only (DSP rows leave them out: MVE_FEATURES).
MVE_FEATURES = ("mve_steps4", "mve_steps1", "mve_blocks4", "mve_blocks1", "mve_rows1")
# loops: a builtin element-wise op with a broadcast operand runs TFLM's BroadcastBinaryOpSimple, which fuses the
# dimensions it can into one innermost loop and recurses over the others: its innermost loops (one for a scalar
# operand, one per pixel for a 1 x 1 x C one). tail: a 1x1 convolution over input channels that are not a multiple
# of 4 (a squeeze-excite's): its outputs times the product's one-by-one steps after the 4-wide ones. Only such ops
# have these two.
FEATURES = ("macs", "vmacs", "col", "inner", "vinner", "out", "pix", "rows", "inp", "calls", "wts", "rmacs",
            "wide", "omacs", "chans", "loops", "tail") + MVE_FEATURES
# The stage's own terms: per kind of layer the summed predicted cost of its calls, and the executor's overheads.
# "dw_tfmcu": a depthwise layer the CMSIS-NN backend runs through our 3x3 kernel (abi.depthwise3x3_ours, DSP cores
# without Helium), priced by CMSIS-NN's depthwise row with a coefficient of its own; "conv_tfmcu" likewise a
# convolution it runs through our shallow-window kernel (abi.conv_shallow_ours).
STAGE_KINDS = ("conv", "conv_tfmcu", "dw", "dw_tfmcu", "other")
# Element-wise ops of two operands: with one broadcast (a 1 x 1 x C or constant operand) they take other code paths,
# rows of their own: "<TYPE>:broadcast", or "<TYPE>:scalar" where TFLM's innermost loop reads one value of an operand.
BINARY = ("ADD", "SUB", "MUL")
# TFLM's element-wise kernels run one flat loop over the elements (with an operand broadcast, BroadcastBinaryOpSimple's
# loops): their rows are fitted on the elements, the innermost loops and the calls only (ADD's row as it was).
ELEMENTWISE = ("SUB", "MUL", "HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU")
ELEMENTWISE_FEATURES = ("out", "loops", "calls")
# Ops whose cost is arithmetic over windows or a fixed-point function per element (their own rows only); the rest
# also price ops never measured.
HEAVY = ("FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D", "MEAN", "SOFTMAX", "HARD_SWISH", "LOGISTIC", "TANH")
STAGE_TERMS = tuple(f"cost_{k}" for k in STAGE_KINDS) + ("calls", "rows", "patches", "cache_bytes", "stream_bytes")
# Terms at coefficient 1, not fitted: the folded 1x1 product's calls (its own row, fitted on its own counts), a
# residual ADD's calls, which run the very function TFLM's ADD runs (CMSIS-NN's arm_elementwise_add_s8, priced by
# ADD's row), a MUL's of same-shape operands likewise (arm_elementwise_mul_s8, MUL's row), and the portable kernels'
# calls (their rows, ``PORTABLE``). A free ADD term would trade against the executor's per-call and per-patch terms,
# which the ADDs of MobileNets correlate with, and misprice a stage whose ADDs are larger.
FIXED_TERMS = ("cost_folded", "cost_add", "cost_mul", "cost_portable")
# The patch executor's portable element-wise kernels (tflm_patch_kernels/<op>.c, the function tfmcu_<op>_s8): the
# same code in both builds (the CMSIS-NN build runs ADD and MUL through CMSIS-NN's functions unless an operand is
# broadcast). The calibration counts each one's instructions over a run (the plugin's per-address counts summed over
# its function, ``portable_insns`` of a run) and ``fit`` gives each a row over these features of the stage layers
# that ran it ("portable" of a core's coefficients, the same for both kernel sets). The stage calls of the element-wise
# ops are priced by those rows (``cost_portable``, at coefficient 1), a residual ADD as before (``cost_add``; with
# the portable kernels the stage's own ADD terms).
PORTABLE = ("ADD", "SUB", "MUL", "HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU")
# A portable kernel's row: per output element it computes element by element ("out"), per pixel, output row and call,
# and for the kernels of ``abi.LUT_OPS`` (and ADD, SUB, MUL with a one-pixel operand 2: ``abi.lut_lanes``) per table
# a call builds of the op's 256 values ("lut_calls": a call of ``abi.LUT_MIN_ELEMENTS`` elements or more per table)
# and per element so mapped ("lut_out" through one table, "lut_lanes_out" through one per channel; "out" then counts
# the other calls' elements only: ``portable_terms``)
PORTABLE_FEATURES = ("out", "pix", "rows", "calls", "lut_calls", "lut_out", "lut_lanes_out")
# The folded 1x1 product's features (cmsis_nn/conv1x1_folded.c), summed over its calls of p pixels, c input and k
# output channels: inner-loop iterations (4 input channels each) over pairs of pixels and over an odd last pixel,
# per pair of output channels; of the pairs' iterations those past a multiple of 16 (steps of their own after the
# 16-wide loop); the pairs' blocks where that loop runs; those blocks (their setup and requantization); an odd last
# output channel's iterations and pixels; the input channels beyond a multiple of 4 per output; channel pairs and
# calls; of the pairs' blocks those of 4-32 input channels (a multiple of 4: straight code, no loop), and the
# requantization passes (per channel pair and call, one per 16 pairs of pixels). Its row ("folded" of a core's
# coefficients) is fitted on the product's own instruction counts.
FOLDED_FEATURES = ("pair_iters", "pair_steps4", "pair_wide", "odd_iters", "pair_blocks", "odd_blocks", "chan_iters",
                   "chan_pixels", "tail", "channel_pairs", "calls", "pair_short", "chunks")


@dataclass(frozen=True, kw_only=True)
class LatencyPrediction:
    instructions: int  # predicted per Invoke
    per_op: list[dict]  # {"op": tflite op index, "type": "CONV_2D" | "custom:TFMCU_PATCH_STAGE" | ..., "instructions"}
    core: str
    kernels: str
    what: str  # "estimated: per-op cost model calibrated on QEMU counts (<file>, <date>)"


def core_of(target: Any) -> str:
    """The core of a firmware target (``tfmcu.firmware.targets.Target``, or its ``platform`` string, or a core
    name): "cortex-m4" or "cortex-m7". The STM32F405 is a Cortex-M4."""
    platform = getattr(target, "platform", target)
    if not isinstance(platform, str):
        raise UsageError(f"core_of: not a target: {target!r}")
    for core in (*CORES, *STAND_INS):
        if platform.endswith(core.replace("-", "_")) or platform == core:
            return core
    raise UsageError(f"core_of: no Cortex-M core known for {platform!r} (known: {', '.join((*CORES, *STAND_INS))})")


# ============================================================================= features
def _same_pad(size: int, k: int, s: int, d: int) -> int:
    """TFLite SAME padding before (the smaller half)."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2


def _taps(size: int, pad: int, k: int, s: int, d: int, out: int) -> int:
    """Kernel taps inside the input (not in the padding), summed over ``out`` output positions along one axis."""
    n = 0
    for o in range(max(out, 0)):
        start = o * s - pad
        n += sum(1 for t in range(k) if 0 <= start + t * d < size)
    return n


def _call(macs: float, inner: float, out: float, pix: float, rows: float, inp: float, col: float = 0.0,
          vmacs: float | None = None, vinner: float | None = None, wts: float = 0.0,
          rmacs: float = 0.0, wide: float = 0.0, omacs: float = 0.0,
          chans: float = 0.0, mve: dict[str, float] | None = None) -> dict[str, float]:
    return {"macs": macs, "vmacs": macs if vmacs is None else vmacs, "col": col, "inner": inner,
            "vinner": inner if vinner is None else vinner, "out": out, "pix": pix, "rows": rows, "inp": inp,
            "calls": 1.0, "wts": wts, "rmacs": rmacs, "wide": wide, "omacs": omacs,
            "chans": chans, **(mve or _mve_terms(np.zeros(0), np.zeros(0), 0, 0))}


def _mve_terms(pixels: np.ndarray, calls: np.ndarray, cout: int, reduction: int) -> dict[str, float]:
    """``MVE_FEATURES`` of a convolution's product over calls of ``pixels`` pixels each (``calls`` of each size),
    ``cout`` output channels and a reduction of ``reduction`` (kh x kw x input channels)."""
    pixels, calls = np.asarray(pixels, np.float64), np.asarray(calls, np.float64)
    quads, rest = (pixels // 4) * calls, (pixels % 4) * calls
    steps = -(-reduction // 16)
    return {"mve_steps4": float(quads.sum()) * cout * steps, "mve_steps1": float(rest.sum()) * cout * steps,
            "mve_blocks4": float(quads.sum()) * cout, "mve_blocks1": float(rest.sum()) * -(-cout // 4),
            "mve_rows1": float(rest.sum())}


def _conv_path(kernels: str, kh: int, kw: int, sh: int, sw: int, pad: tuple[int, int], dil: tuple[int, int],
               depthwise: bool, mult: int, mve: bool = False) -> str:
    """The code path a convolution takes (CMSIS-NN's wrappers choose by these, 4ab83cc; the reference kernels
    have one each). With Helium (``mve``) the 3x3 depthwise kernel is arm_depthwise_conv_s8_opt's, as the others."""
    if kernels == "reference":
        return "dw" if depthwise else "conv"
    if depthwise:
        if mult != 1 or dil != (1, 1):
            return "dw_generic"
        return "dw_3x3" if (kh, kw) == (3, 3) and max(pad) <= 1 and not mve else "dw_opt"
    if (kh, kw) == (1, 1) and pad == (0, 0) and dil == (1, 1):
        return "conv_1x1" if (sh, sw) == (1, 1) else "conv_1x1_strided"
    return "conv"


def _builtin(m: ts.ModelT, op: ts.OperatorT, name: str) -> dict[str, Any]:
    """Features of one builtin op (kernel-independent; the path is chosen per kernel set later)."""
    sg = m.subgraphs[0]
    shape = lambda i: tuple(int(d) for d in (sg.tensors[i].shape if sg.tensors[i].shape is not None else []))  # noqa
    ins = [int(i) for i in (op.inputs if op.inputs is not None else []) if i >= 0]
    outs = [int(i) for i in (op.outputs if op.outputs is not None else [])]
    o = shape(outs[0]) if outs else ()
    out = float(np.prod(o)) if o else 0.0
    i0 = shape(ins[0]) if ins else ()
    inp = float(np.prod(i0)) if i0 else 0.0
    pix = float(np.prod(o[1:3])) if len(o) == 4 else 1.0
    rows = float(o[1]) if len(o) == 4 else 1.0
    f: dict[str, Any] = {"type": name, "geometry": None}
    opts = op.builtinOptions
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = shape(ins[1])
        dw = name == "DEPTHWISE_CONV_2D"
        kh, kw = w[1], w[2]
        cin = i0[3]
        sh, sw = int(opts.strideH), int(opts.strideW)
        dh, dwl = int(getattr(opts, "dilationHFactor", 1) or 1), int(getattr(opts, "dilationWFactor", 1) or 1)
        same = int(opts.padding) == 0  # Padding.SAME
        pad = (_same_pad(i0[1], kh, sh, dh), _same_pad(i0[2], kw, sw, dwl)) if same else (0, 0)
        mult = int(getattr(opts, "depthMultiplier", 1) or 1) if dw else 1
        k = kh * kw * (1 if dw else w[3])
        # col: the im2col elements (each output pixel's window over the input channels) of a convolution;
        # vmacs / vinner: the MACs and window steps over taps inside the input (reference kernels skip the padding)
        cout = o[3]
        taps = _taps(i0[1], pad[0], kh, sh, dh, o[1]) * _taps(i0[2], pad[1], kw, sw, dwl, o[2])
        per_tap = 1 if dw else w[3]
        # the product's calls: one over every pixel, or one per output row (a strided 1x1 convolution)
        strided = (kh, kw) == (1, 1) and pad == (0, 0) and (sh, sw) != (1, 1)
        mve = None if dw else _mve_terms(np.array([o[2] if strided else pix]), np.array([o[1] if strided else 1]),
                                         cout, k)
        f.update(_call(out * k, out * kh * kw, out, pix, rows, inp, col=0.0 if dw else pix * k,
                       vmacs=float(taps * cout * per_tap), vinner=float(taps * cout), wts=float(k * cout),
                       rmacs=0.0 if dw else out * (k % 16), wide=out if not dw and k >= 16 else 0.0,
                       omacs=0.0 if dw else float(int(pix) % 2 * cout * k), chans=0.0 if dw else float(cout),
                       mve=mve))
        f["geometry"] = {"kernel": [kh, kw], "stride": [sh, sw], "pad": list(pad), "dilation": [dh, dwl],
                         "in_h": i0[1], "depthwise": dw, "mult": mult, "cin": cin}
        if not dw and (kh, kw) == (1, 1) and cin % 4:
            f["tail"] = out * (cin % 4)  # the product's one-by-one steps after its 4-wide ones, per output
        return f
    if name == "FULLY_CONNECTED":
        w = shape(ins[1])
        f.update(_call(out * w[-1], out * w[-1], out, 1.0, 1.0, inp, wts=out * w[-1]))
        return f
    if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        k = int(opts.filterHeight) * int(opts.filterWidth)
        f.update(_call(0.0, out * k, out, pix, rows, inp))
        return f
    if name == "MEAN":
        f.update(_call(0.0, inp, out, pix, rows, inp))
        return f
    f.update(_call(0.0, 0.0, out, pix, rows, inp))
    if name in BINARY and len(ins) == 2 and any(float(np.prod(shape(t))) != out for t in ins):
        # an operand broadcast (1 x 1 x C, a constant): TFLM's Broadcast*Slow loops, whose innermost loop reads one
        # value of an operand ("scalar") or runs over both
        f["loops"], one_value = _broadcast_loops(shape(ins[0]), shape(ins[1]), o)
        f["broadcast"] = "scalar" if one_value else True
    return f


def _broadcast_loops(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> tuple[float, bool]:
    """How often TFLM's BroadcastBinaryOpSimple (broadcast_loop.h) runs its innermost loop for operands of shapes
    ``a`` and ``b`` (from the last dimension on, a dimension joins the loop before it where every stride continues
    that loop's, or is 0 in both, or the dimension is 1; else it opens a loop of its own), and whether that loop
    reads one value of an operand (stride 0: its own loop body)."""
    n = max(len(a), len(b), len(out))
    a, b, out = ((1,) * (n - len(s)) + tuple(s) for s in (a, b, out))
    loops: list[list[int]] = []  # per loop: [a stride, b stride, output stride, extent]
    acc = [1, 1, 1]
    for i in range(n - 1, -1, -1):
        strides = [0 if d == 1 and out[i] != 1 else acc[k] for k, d in enumerate((a[i], b[i], out[i]))]
        if loops and (out[i] == 1 or all((s == 0) if loops[-1][k] == 0 else (s == acc[k])
                                         for k, s in enumerate(strides))):
            loops[-1][3] *= out[i]
        else:
            loops.append(strides + [out[i]])
        acc = [acc[0] * a[i], acc[1] * b[i], acc[2] * out[i]]
    if not loops:
        return 1.0, False
    return float(np.prod([lp[3] for lp in loops[1:]])), loops[0][0] == 0 or loops[0][1] == 0


def _postprocess(m: ts.ModelT, op: ts.OperatorT, name: str) -> dict[str, Any]:
    """Features of TFLM's TFLite_Detection_PostProcess (fast NMS, one class per box): per anchor its box decoded
    (``out``: N anchors; ``inp``: the 4N box encodings) and its K class scores searched for the best (``inner``:
    N K). Its non-maximum suppression depends on how many boxes pass the score threshold (the data), which no
    feature sees: its row is fitted on the calibration firmware's seeded inputs."""
    sg = m.subgraphs[0]
    boxes = [int(d) for d in sg.tensors[int(op.inputs[0])].shape]
    scores = [int(d) for d in sg.tensors[int(op.inputs[1])].shape]
    n, k = boxes[1], scores[2]
    return {"type": name, "geometry": None, **_call(0.0, float(n * k), float(n), 1.0, 1.0, float(4 * n))}


def _stage(o: dict[str, Any]) -> dict[str, Any]:
    """Features of one TFMCU_PATCH_STAGE op (``o``: its stage, ``tfmcu.tflite.patch_stage_format.read_stage`` with
    its tables): per layer its calls' summed features, and the executor's terms."""
    grid_r, grid_c = (int(g) for g in o["grid"])
    tensors = [[int(v) for v in t] for t in o["tensors"]]
    layers = o["layers"]
    n_layers = len(layers)
    sw = abi.SPAN_WORDS
    offs = abi.word_offsets("TfmcuSpan")
    row_spans = np.asarray(o["row_spans"]).reshape(grid_r, n_layers, sw)
    col_spans = np.asarray(o["col_spans"]).reshape(grid_c, n_layers, sw)
    held = None
    if int(o.get("num_caches", 0) or 0) > 0:
        held = (np.asarray(o["row_held"]).reshape(grid_r, n_layers, 2),
                np.asarray(o["col_held"]).reshape(grid_c, n_layers, 2))
    producers = {int(t): li for li, t in enumerate(o["layer_outputs"])}
    t_in, t_out = int(o["input_tensor"]), int(o["output_tensor"])
    col_offs = (offs["out_start"], offs["out_stop"])

    def held_cols(t: int, j: int) -> int:
        """Columns of tensor t's buffer in column band j (patch_stage.c's tfmcu_held)."""
        if t in (t_in, t_out):
            return tensors[t][1]
        if held is not None:
            return int(held[1][j, producers[t], 1] - held[1][j, producers[t], 0])
        span = col_spans[j, producers[t]]
        return int(span[col_offs[1]] - span[col_offs[0]])

    layer_feats = []
    cache_bytes = 0.0
    calls = rows_total = 0.0
    for li, layer in enumerate(layers):
        code = int(layer["type"])
        p = abi.params_from_words(code, [int(v) for v in layer["words"]])
        out_t = tensors[int(o["layer_outputs"][li])]
        in_ts = [tensors[int(t)] for t in o["layer_inputs"][li]]
        cout = out_t[2]
        cin = in_ts[0][2]
        r_out = row_spans[:, li, offs["out_stop"]] - row_spans[:, li, offs["out_start"]]
        c_out = col_spans[:, li, offs["out_stop"]] - col_spans[:, li, offs["out_start"]]
        r_in = row_spans[:, li, offs["in_stop"]] - row_spans[:, li, offs["in_start"]]
        c_in = col_spans[:, li, offs["in_stop"]] - col_spans[:, li, offs["in_start"]]
        boxes = np.outer(np.maximum(r_out, 0), np.maximum(c_out, 0))  # output pixels per patch
        live = boxes > 0
        passes = int(layer.get("passes", 1))
        if passes == 0:  # a layer on whole tensors runs once per run (its spans are 0..1 in every band)
            live = np.zeros_like(live)
            live[0, 0] = True
            boxes = boxes * live
        name = abi.op(code).name
        kh = int(p.get("kernel_h", p.get("filter_h", 1)))
        kw = int(p.get("kernel_w", p.get("filter_w", 1)))
        groups = int(p.get("groups", 1)) or 1
        # The CMSIS-NN backend's calls (patch_stage.c, cmsis_nn/window_rows.c): one per patch, or one per output row
        # where its input box is narrower than its buffer, or it writes part of the stage output's rows.
        t_first = int(o["layer_inputs"][li][0])
        per_row = np.zeros_like(live)
        for i in range(grid_r):
            for j in range(grid_c):
                per_row[i, j] = live[i, j] and (
                    (r_in[i] > 1 and c_in[j] != held_cols(t_first, j))
                    or (int(o["layer_outputs"][li]) == t_out and r_out[i] > 1 and c_out[j] != out_t[1]))
        call_pixels = np.where(per_row, np.maximum(c_out, 0)[None, :], boxes)  # pixels per kernel call
        kernel_calls = np.where(per_row, np.maximum(r_out, 0)[:, None], 1) * live  # kernel calls per patch
        # A 1x1 convolution whose input offset the packer folded into its bias runs the calls abi.conv1x1_folded
        # chooses through the CMSIS-NN backend's own product (cmsis_nn/conv1x1_folded.c): those calls are the
        # layer's "folded" part, with features of their own (FOLDED_FEATURES).
        fold = np.zeros_like(live)
        if (code == abi.OP_CONV and (kh, kw) == (1, 1) and int(p["stride_h"]) == int(p["stride_w"]) == 1
                and groups == 1 and int(p["input_offset"]) == 0):
            fold = live & abi.conv1x1_folded(call_pixels, cin)
        geometry = None
        if code in (abi.OP_CONV, abi.OP_DEPTHWISE):
            pad = [int(v) for v in layer.get("padding", [0, 0, 0, 0])]
            geometry = {"kernel": [kh, kw], "stride": [int(p["stride_h"]), int(p["stride_w"])],
                        "pad": [max(pad[0], pad[1]), max(pad[2], pad[3])],
                        "dilation": [int(p["dilation_h"]), int(p["dilation_w"])], "in_h": in_ts[0][0],
                        "depthwise": code == abi.OP_DEPTHWISE, "mult": int(p.get("depth_multiplier", 1) or 1),
                        "cin": cin, "cout": cout, "groups": groups, "input_offset": int(p["input_offset"])}
            # every call one output pixel of a 1x1 convolution (a classifier run as one): the CMSIS-NN backend
            # calls the vector-matrix product TFLM's FULLY_CONNECTED calls (conv2d_cmsis_nn.c)
            geometry["vector"] = (code == abi.OP_CONV and (kh, kw) == (1, 1) and max(pad) == 0 and live.any()
                                  and bool((boxes[live] == 1).all()))

        # calls through tables (tfmcu_lut.h): the activations' one table, a binary op's per distinct channel of a
        # one-pixel operand 2 (a constant's values read from the blob; a computed one's taken as differing)
        lanes = 1 if name in abi.LUT_OPS else 0
        if name in BINARY and len(in_ts) == 2 and in_ts[1][0] * in_ts[1][1] == 1 and out_t[0] * out_t[1] > 1:
            at = tensors[int(o["layer_inputs"][li][1])][abi.word_offsets("TfmcuTensor")["constant"]]
            consts = o.get("constants")
            values = (np.asarray(consts[at:at + cout]).view(np.int8).tolist() if at >= 0 and consts is not None
                      else None)
            lanes = abi.lut_lanes(values, cout)

        def features(mask: np.ndarray) -> dict[str, float]:
            """The layer's features over the patches of ``mask``."""
            pix = float(boxes[mask].sum())
            n_calls = float(mask.sum())
            rows = float((np.outer(np.maximum(r_out, 0), np.ones(grid_c)) * mask).sum())
            inp = float((np.outer(np.maximum(r_in, 0), np.maximum(c_in, 0)) * mask).sum()) * cin
            out = pix * cout
            vmacs = vinner = None
            if code in (abi.OP_CONV, abi.OP_DEPTHWISE):
                sh, sw_, dh, dwl = (int(p[k]) for k in ("stride_h", "stride_w", "dilation_h", "dilation_w"))
                pb_r = row_spans[:, li, offs["pad_before"]]
                pb_c = col_spans[:, li, offs["pad_before"]]
                t_r = np.array([_taps(int(r_in[i]), int(pb_r[i]), kh, sh, dh, int(r_out[i])) for i in range(grid_r)])
                t_c = np.array([_taps(int(c_in[j]), int(pb_c[j]), kw, sw_, dwl, int(c_out[j]))
                                for j in range(grid_c)])
                vinner = float((np.outer(t_r, t_c) * mask).sum()) * cout
            if code == abi.OP_CONV:
                macs, inner = out * kh * kw * cin / groups, out * kh * kw
                vmacs = vinner * cin / groups
            elif code == abi.OP_DEPTHWISE:
                macs, inner = out * kh * kw, out * kh * kw
                vmacs = vinner
            elif code in (abi.OP_AVG_POOL, abi.OP_MAX_POOL):
                macs, inner = 0.0, out * kh * kw
            else:
                macs, inner = 0.0, 0.0
            col = pix * kh * kw * cin / groups if code == abi.OP_CONV else 0.0
            weights = (kh * kw * (1 if code == abi.OP_DEPTHWISE else cin / groups) * cout
                       if code in (abi.OP_CONV, abi.OP_DEPTHWISE) else 0.0)
            reduction = kh * kw * cin // groups if code == abi.OP_CONV else 0
            rmacs, wide = out * (reduction % 16), out if reduction >= 16 else 0.0
            omacs = float(((call_pixels % 2) * kernel_calls)[mask].sum()) * cout * reduction
            chans = float(kernel_calls[mask].sum()) * cout if code == abi.OP_CONV else 0.0
            mve = (_mve_terms(call_pixels[mask], kernel_calls[mask], cout, reduction) if code == abi.OP_CONV
                   else _mve_terms(np.zeros(0), np.zeros(0), 0, 0))
            lut = {}
            if lanes:  # one call per patch (the portable kernel): its elements decide the tables
                elements = boxes * cout
                on = mask & (elements >= lanes * abi.LUT_MIN_ELEMENTS)
                lut = {"lut_calls": float(on.sum()) * lanes,
                       "lut_out" if lanes == 1 else "lut_lanes_out": float(elements[on].sum())}
            return {**lut, "macs": macs, "vmacs": macs if vmacs is None else vmacs, "col": col, "inner": inner,
                    "vinner": inner if vinner is None else vinner, "out": out, "pix": pix, "rows": rows,
                    "inp": inp, "calls": n_calls, "wts": weights * float(kernel_calls[mask].sum()), "rmacs": rmacs,
                    "wide": wide, "omacs": omacs, "chans": chans, **mve}

        feats = {"type": name, "geometry": geometry, **features(live)}
        if name in BINARY and any(t[0] * t[1] * t[2] != out_t[0] * out_t[1] * out_t[2] for t in in_ts):
            feats["broadcast"] = True  # a 1 x 1 x C operand: the portable kernel's loop in every build
        if code == abi.OP_MEAN:  # our sums, not TFLM's MEAN (its row is TFLM's generic Reduce): the light row
            feats["type"] = "MEAN_SUMS"
        if fold.any():  # the folded calls: the layer's features over them, and their product's own
            n, px = kernel_calls[fold].astype(float), call_pixels[fold].astype(float)
            kp, k_odd, c4, c_rest = cout // 2, cout % 2, cin // 4, cin % 4
            pairs, odd = n * (px // 2), n * (px % 2)
            feats["folded"] = {
                "layer": features(fold),
                "product": {"pair_iters": float(pairs.sum()) * kp * c4,
                            "pair_steps4": float(pairs.sum()) * kp * ((cin & 15) >> 2),
                            "pair_wide": float(pairs.sum()) * kp * (cin >= 16), "odd_iters": float(odd.sum()) * kp * c4,
                            "pair_blocks": float(pairs.sum()) * kp, "odd_blocks": float(odd.sum()) * kp,
                            "chan_iters": float((n * px).sum()) * k_odd * c4,
                            "chan_pixels": float((n * px).sum()) * k_odd,
                            "tail": float((n * px).sum()) * cout * c_rest, "channel_pairs": float(n.sum()) * kp,
                            "calls": float(n.sum()),
                            "pair_short": float(pairs.sum()) * kp * (4 <= cin <= 32 and cin % 4 == 0),
                            "chunks": float((n * -(-(px // 2) // 16)).sum()) * kp}}
        runs = bin(passes).count("1")  # a layer on tiles runs in every pass its bits name (recomputed)
        if runs > 1:
            feats = _scaled(feats, runs)
        layer_feats.append(feats)
        calls += feats["calls"]
        rows_total += feats["rows"]
        if held is not None:  # the part of the held box a cache restores (then saves for the next patch), per run
            h_r = held[0][:, li, 1] - held[0][:, li, 0]
            h_c = held[1][:, li, 1] - held[1][:, li, 0]
            cache_bytes += float((np.outer(h_r, h_c) - boxes).clip(min=0).sum()) * cout * (runs if passes else 0)
    stream = 0.0
    if int(o.get("streamed_input", 0) or 0):
        t = tensors[int(o["input_tensor"])]
        stream = float(t[0] * t[1] * t[2])
    # each pass sweeps the whole grid (a stage of squeeze-excites runs 1 + their number)
    sweeps = int(o.get("num_passes", 1) or 1)
    return {"type": f"custom:{abi.PATCH_STAGE_OP}", "layers": layer_feats, "grid": [grid_r, grid_c],
            "calls": calls, "rows": rows_total, "patches": float(grid_r * grid_c * sweeps), "cache_bytes": cache_bytes,
            "stream_bytes": stream, "single_layer": psf.single_layer(o) is not None}


def _scaled(feats: dict[str, Any], k: int) -> dict[str, Any]:
    """A layer's features for ``k`` runs of it (its numbers times ``k``; its type and geometry as they are)."""
    return {n: (v * k if isinstance(v, float) and n != "type" else _scaled(v, k) if isinstance(v, dict) and
                n != "geometry" else v) for n, v in feats.items()}


def op_features(model: bytes | TfliteModel, where: str = "model") -> list[dict[str, Any]]:
    """Per operator of subgraph 0 its cost features (see the module docstring), with ``op`` (its index). A model
    decided and not written (``tfmcu.tflite.model.TfliteModel.decided``) has the features of its file."""
    tm = as_model(model, where)
    m = tm.flatbuffer
    out = []
    for i, (op, name) in enumerate(zip(m.subgraphs[0].operators or [], tm.op_names)):
        if name == f"custom:{abi.PATCH_STAGE_OP}":
            f = _stage(psf.stage_at(tm, i))
        elif name == f"custom:{DETECTION_POSTPROCESS}":
            f = _postprocess(m, op, name)
        elif name.startswith("custom:"):
            raise UsageError(f"{where}: the latency predictor knows no custom op {name[7:]} (it knows "
                             f"{abi.PATCH_STAGE_OP} and {DETECTION_POSTPROCESS})")
        else:
            f = _builtin(m, op, name)
        f["op"] = i
        out.append(f)
    return out


# ============================================================================= the cost model
def path_of(f: dict[str, Any], kernels: str, mve: bool = False) -> str:
    """The coefficient row of a builtin op or stage layer: "<TYPE>" or "<TYPE>:<path>" for convolutions. ``mve``:
    a Helium core's (``coefficients["mve"]``), where the backend has no vector-matrix shortcut for one pixel."""
    g = f.get("geometry")
    if g is None:
        b = f.get("broadcast")
        return f"{f['type']}:{'scalar' if b == 'scalar' else 'broadcast'}" if b else f["type"]
    if kernels == "cmsis_nn" and g.get("vector") and not mve:
        return "FULLY_CONNECTED"
    p = _conv_path(kernels, g["kernel"][0], g["kernel"][1], g["stride"][0], g["stride"][1], tuple(g["pad"]),
                   tuple(g["dilation"]), g["depthwise"], g["mult"], mve)
    if p == "conv_1x1" and "vector" not in g and f.get("pix") == 1.0:
        # a builtin 1x1 convolution of one pixel (a squeeze-excite's, a classifier's): the product's odd-pixel loop
        # alone, a row of its own
        p = "conv_1x1_pixel"
    return f"{f['type']}:{p}"


def _elementwise_row(row: str) -> bool:
    """Whether a row is an element-wise kernel's (``ELEMENTWISE``, or a broadcast one of ``BINARY``)."""
    return row.split(":")[0] in ELEMENTWISE or row.endswith((":broadcast", ":scalar"))


def _depthwise3x3_ours(lf: dict[str, Any]) -> bool:
    """Whether a stage layer is a depthwise one the CMSIS-NN backend runs through our 3x3 kernel (on a DSP core
    without Helium: the caller's to check)."""
    g = lf.get("geometry")
    return (lf["type"] == "DEPTHWISE_CONV_2D" and g is not None
            and abi.depthwise3x3_ours(g["kernel"], g["mult"], g["dilation"], int(g["cin"]) * g["mult"]))


def _conv_shallow_ours(lf: dict[str, Any]) -> bool:
    """Whether a stage layer is a convolution the CMSIS-NN backend runs through our shallow-window kernel (on a DSP
    core without Helium: the caller's to check)."""
    g = lf.get("geometry")
    return (lf["type"] == "CONV_2D" and g is not None and "cout" in g
            and abi.conv_shallow_ours(g["kernel"], g["groups"], g["dilation"], int(g["cin"]), int(g["cout"]),
                                      int(g["input_offset"])))


def _kind(f: dict[str, Any]) -> str:
    return {"CONV_2D": "conv", "DEPTHWISE_CONV_2D": "dw", "ADD": "add", "MUL": "mul"}.get(f["type"], "other")


def portable_kernel(lf: dict[str, Any], kernels: str) -> str | None:
    """The portable kernel (``PORTABLE``) a stage layer's calls run with ``kernels``, or None."""
    t = lf["type"]
    if t not in PORTABLE or (kernels == "cmsis_nn" and t in ("ADD", "MUL") and not lf.get("broadcast")):
        return None
    return t


def _priced_portable(lf: dict[str, Any], kernels: str) -> bool:
    """Whether a stage layer is priced by its portable kernel's row (a residual ADD is not: see PORTABLE)."""
    return portable_kernel(lf, kernels) is not None and not (lf["type"] == "ADD" and not lf.get("broadcast"))


def portable_cost(lf: dict[str, Any], coef: dict[str, Any], kernels: str) -> float:
    """A stage layer's instructions in its portable kernel: that kernel's row, or where the calibration has none,
    the builtin row of the layer's path (TFLM's reference kernels compute the same arithmetic)."""
    c = coef.get("portable", {}).get(portable_kernel(lf, kernels) or "")
    if c is None:
        return _row_cost(coef, path_of(lf, kernels), lf)
    terms = portable_terms(lf)
    return float(sum(c.get(k, 0.0) * terms[k] for k in PORTABLE_FEATURES))


def portable_terms(lf: dict[str, Any]) -> dict[str, float]:
    """A stage layer's ``PORTABLE_FEATURES``: its features, "out" without the elements its calls map through tables
    ("lut_out")."""
    terms = {k: float(lf.get(k, 0.0)) for k in PORTABLE_FEATURES}
    terms["out"] -= terms["lut_out"] + terms["lut_lanes_out"]
    return terms


def _row_cost(coef: dict[str, Any], row: str, f: dict[str, Any]) -> float:
    c = coef["ops"].get(row)
    if c is None:  # a path never measured: another path of the op; an op never measured: the light ops' row
        op = row.split(":")[0]
        c = next((coef["ops"][r] for r in sorted(coef["ops"]) if r.split(":")[0] == op), coef["light"])
    return float(sum(c.get(k, 0.0) * f.get(k, 0.0) for k in FEATURES))


def folded_cost(product: dict[str, float], coef: dict[str, Any]) -> float:
    """The folded 1x1 product's instructions for its ``product`` features (``FOLDED_FEATURES``)."""
    c = coef.get("folded", {})
    return float(sum(c.get(k, 0.0) * product.get(k, 0.0) for k in FOLDED_FEATURES))


def stage_terms(f: dict[str, Any], coef: dict[str, Any], kernels: str) -> dict[str, float]:
    """A stage op's terms (``STAGE_TERMS`` and ``FIXED_TERMS``): its layers' calls priced by the builtin rows,
    summed per kind (residual ADDs in ``cost_add``); the folded 1x1 calls (``folded`` of a layer's features) by the
    folded product's row instead, in ``cost_folded`` (DSP cores: a Helium build has no folded product, its calls run
    CMSIS-NN's 1x1 product as the others, and so has a core without the DSP extension: ``coef["dsp"]`` False)."""
    terms = {t: 0.0 for t in STAGE_TERMS + FIXED_TERMS}
    mve = bool(coef.get("mve"))
    folds = kernels == "cmsis_nn" and not mve and coef.get("dsp", True)
    for lf in f["layers"]:
        kind = ("dw_tfmcu" if folds and _depthwise3x3_ours(lf) else
                "conv_tfmcu" if folds and _conv_shallow_ours(lf) else _kind(lf))
        row = path_of(lf, kernels, mve)
        if _priced_portable(lf, kernels):
            terms["cost_portable"] += portable_cost(lf, coef, kernels)
            continue
        parts = [(lf, 1.0)]
        if lf.get("folded") and folds:
            parts.append((lf["folded"]["layer"], -1.0))
            terms["cost_folded"] += folded_cost(lf["folded"]["product"], coef)
        for part, sign in parts:
            if row == "FULLY_CONNECTED":  # the features FULLY_CONNECTED's row is fitted on (_builtin)
                part = {**part, "inner": part["macs"], "vinner": part["macs"], "col": 0.0}
            terms[f"cost_{kind}"] += sign * _row_cost(coef, row, part)
    for t in ("calls", "rows", "patches", "cache_bytes", "stream_bytes"):
        terms[t] = float(f[t])
    return terms


def stage_row_terms(f: dict[str, Any], kernels: str, mve: bool = False) -> dict[str, float]:
    """A stage op's terms when its kernels have rows of their own (``stage_rows``: the portable C kernels, which
    are not TFLM's reference kernels): per row and feature the sum over its calls ("<row>.<feature>"), and the
    executor's terms; the element-wise layers priced by their kernels' rows are left out (``portable_cost``)."""
    terms: dict[str, float] = {}
    for lf in f["layers"]:
        if _priced_portable(lf, kernels):
            continue
        row = path_of(lf, kernels)
        for k in FEATURES:
            if lf.get(k) and (mve or k not in MVE_FEATURES):
                terms[f"{row}.{k}"] = terms.get(f"{row}.{k}", 0.0) + float(lf[k])
    for t in ("patches", "cache_bytes", "stream_bytes"):
        terms[t] = float(f[t])
    return terms


def op_cost(f: dict[str, Any], coef: dict[str, Any], kernels: str) -> float:
    if f["type"] == f"custom:{abi.PATCH_STAGE_OP}":
        s = coef["stage"]
        if coef.get("stage_rows"):
            terms = stage_row_terms(f, kernels, bool(coef.get("mve")))
            return float(sum(s.get(t, 0.0) * v for t, v in terms.items()) + _stage_portable(f, coef, kernels))
        terms = stage_terms(f, coef, kernels)
        return float(sum(terms[t] for t in FIXED_TERMS)
                     + sum(s.get(t, 0.0) * v for t, v in terms.items() if t not in FIXED_TERMS))
    return _row_cost(coef, path_of(f, kernels, bool(coef.get("mve"))), f)


def _stage_portable(f: dict[str, Any], coef: dict[str, Any], kernels: str) -> float:
    """A stage op's instructions in the portable kernels that price its element-wise layers."""
    return float(sum(portable_cost(lf, coef, kernels) for lf in f["layers"] if _priced_portable(lf, kernels)))


def portable_features(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per portable kernel the ``PORTABLE_FEATURES`` summed over the stage layers of a run that ran it."""
    out: dict[str, dict[str, float]] = {}
    for f in run["ops"]:
        for lf in f.get("layers", []) if f["type"] == f"custom:{abi.PATCH_STAGE_OP}" else []:
            k = portable_kernel(lf, run["kernels"])
            if k is not None:
                acc = out.setdefault(k, dict.fromkeys(PORTABLE_FEATURES, 0.0))
                for n, v in portable_terms(lf).items():
                    acc[n] += v
    return out


def _fit_portable(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The portable kernels' rows of one core, from its runs of both kernel sets that counted them."""
    pts: dict[str, tuple[list[list[float]], list[float]]] = {}
    for r in runs:
        measured = r.get("portable_insns")
        if not measured:
            continue
        feats = portable_features(r)
        for k, n in measured.items():
            if k in feats:
                pts.setdefault(k, ([], []))[0].append([feats[k][n_] for n_ in PORTABLE_FEATURES])
                pts[k][1].append(float(n))
    rows = {}
    for k, (a, b) in sorted(pts.items()):
        x = _nnls(np.array(a, dtype=float), np.array(b, dtype=float))
        rows[k] = {n: float(v) for n, v in zip(PORTABLE_FEATURES, x) if v}
    return rows


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def load_calibration(path: str = CALIBRATION_FILE) -> dict[str, Any]:
    """The calibration file with each run's ``ops``: the features of its model's ops (stored once per model, in
    ``models``) with the instructions the run measured for each (``insns``); ``coefficients`` per
    "core/kernels"."""
    data = json.loads(json.dumps(_load(os.path.abspath(path))))
    models = data.pop("models", {})
    for r in data.get("runs", []):
        if "op_insns" in r:
            m = models[r["variant"]]
            r["zoo_model"], r["model_sha1"] = m["zoo_model"], m["model_sha1"]
            r["ops"] = [{**f, "insns": n} for f, n in zip(json.loads(json.dumps(m["ops"])), r.pop("op_insns"))]
            for f, n in zip(r["ops"], r.pop("op_folded_insns", [])):
                if n is not None:
                    f["folded_insns"] = n
    return data


def save_calibration(data: dict[str, Any], path: str = CALIBRATION_FILE) -> None:
    """Writes ``data`` (as ``load_calibration`` returns it) with each model's features stored once."""
    out = {k: v for k, v in data.items() if k != "runs"}
    out["models"], out["runs"] = {}, []
    per_run = ("insns", "folded_insns")  # measured by the run; the rest are the model's features
    for r in data.get("runs", []):
        ops = [{k: v for k, v in f.items() if k not in per_run} for f in r["ops"]]
        out["models"][r["variant"]] = {"zoo_model": r["zoo_model"], "model_sha1": r["model_sha1"], "ops": ops}
        run = {**{k: v for k, v in r.items() if k not in ("ops", "zoo_model", "model_sha1")},
               "op_insns": [f["insns"] for f in r["ops"]]}
        if any("folded_insns" in f for f in r["ops"]):
            run["op_folded_insns"] = [f.get("folded_insns") for f in r["ops"]]
        out["runs"].append(run)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh, indent=None, separators=(",", ":"), sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    _load.cache_clear()


def predict_from_features(ops: list[dict[str, Any]], coef: dict[str, Any], kernels: str) -> tuple[float, list[float]]:
    """(Invoke instructions, per-op instructions) for features ``ops`` under one core/kernels' coefficients."""
    per_op = [op_cost(f, coef, kernels) for f in ops]
    inv = coef["invoke"]
    return float(sum(per_op) + inv["const"] + inv["per_op"] * len(ops)), per_op


def stage_split(f: dict[str, Any], coef: dict[str, Any], kernels: str) -> tuple[list[float], float]:
    """A patch stage op's predicted instructions split: per layer (its row's cost, with its own kernel calls and
    output rows of the executor's terms) and the rest of the executor (per patch, halo caches, streamed rows); the
    parts sum to ``op_cost(f, ...)``. An estimate: what ``tfmcu.firmware.profile`` splits a measured stage by."""
    bare = {**f, "calls": 0.0, "rows": 0.0, "patches": 0.0, "cache_bytes": 0.0, "stream_bytes": 0.0}
    layers = [op_cost({**bare, "layers": [lf], "calls": float(lf.get("calls", 0.0)),
                       "rows": float(lf.get("rows", 0.0))}, coef, kernels) for lf in f["layers"]]
    return layers, op_cost(f, coef, kernels) - sum(layers)


def coefficients(core: str, kernels: str, calibration: str = CALIBRATION_FILE) -> dict[str, Any]:
    """The calibrated coefficients of ``core`` (or the core whose rows price it) with ``kernels``."""
    data = _load(os.path.abspath(calibration))
    coef = data.get("coefficients", {}).get(f"{STAND_INS.get(core, core)}/{kernels}")
    if coef is None:
        raise UsageError(f"{os.path.basename(calibration)} has no calibration for {core} with {kernels} "
                         "(python -m benchmarks.latency)")
    return coef


def stage_overheads(core: str = "cortex-m4", kernels: str = "cmsis_nn",
                    calibration: str = CALIBRATION_FILE, ours: bool = True) -> dict[str, float]:
    """The calibrated instructions (estimated) a patch stage adds to its MACs, for the stage-plan search's
    per-segment estimate (``tfmcu.plan.stage_plans.stage_segments``): per patch, per kernel call, per filter element a
    1x1 convolution re-reads on each call (CMSIS-NN sums the filter rows per call), per MAC of a 1x1 and of a
    depthwise convolution, per output element of a 1x1 convolution and of an ADD, per output pixel of a depthwise
    convolution (the bulk of a MobileNet's). ``ours``: the depthwise and shallow-window convolutions at the rate of
    our kernels (what a stage and the rest's one-layer stages run on a DSP core); else TFLM + CMSIS-NN's per layer
    (what ``--max_latency`` is a factor of)."""
    coef = _load(os.path.abspath(calibration)).get("coefficients", {}).get(f"{core}/{kernels}")
    if coef is None:
        raise UsageError(f"{os.path.basename(calibration)} has no calibration for {core} with {kernels}")
    ops, stage = coef["ops"], coef["stage"]
    conv = ops.get("CONV_2D:conv_1x1", {})
    dw = next((ops[r] for r in sorted(ops) if r.startswith("DEPTHWISE_CONV_2D")), {})
    portable = coef.get("portable", {})
    # the element-wise ops (ELEMENTWISE): per output element per layer (TFLM's kernels; a broadcast operand its own
    # row) and in a stage (the portable kernels: element by element, or per call and element through a table)
    layer = {row: float(ops[row].get("out", 0.0)) for row in ops if row.split(":")[0] in ELEMENTWISE}
    in_stage = {k: {n: float(portable.get(k, {}).get(n, 0.0)) for n in ("out", "lut_out", "lut_lanes_out", "lut_calls")}
                for k in ELEMENTWISE}
    # a depthwise layer in a stage on a DSP core runs our 3x3 kernel, a first layer our shallow-window kernel (their
    # stage coefficients against CMSIS-NN's rows)
    dw_scale = float(stage.get("cost_dw_tfmcu", 1.0)) if ours else 1.0
    shallow_scale = float(stage.get("cost_conv_tfmcu", 1.0)) if ours else 1.0
    return {"patch": float(stage.get("patches", 0.0)), "call": float(stage.get("calls", 0.0)),
            "shallow_scale": shallow_scale,
            "weight_call": float(conv.get("wts", 0.0)), "conv_mac": float(conv.get("macs", 1.0)),
            "dw_mac": dw_scale * float(dw.get("macs", 1.0)), "conv_element": float(conv.get("inner", 0.0)),
            "dw_pixel": dw_scale * float(dw.get("pix", 0.0)), "add_element": float(ops.get("ADD", {}).get("out", 0.0)),
            "layer_element": layer, "stage_element": in_stage}


def predict_instructions(model: bytes | TfliteModel, core: str, kernels: str, where: str = "model",
                         calibration: str = CALIBRATION_FILE) -> LatencyPrediction:
    """Predicted instructions per Invoke of ``model`` in TFLM on ``core`` ("cortex-m4" | "cortex-m7") with
    ``kernels`` ("cmsis_nn" | "reference"); per op too. Estimated, not measured (see ``what``)."""
    if core not in CORES and core not in STAND_INS:
        raise UsageError(f"core {core!r}: the latency predictor knows {', '.join((*CORES, *STAND_INS))}")
    if kernels not in KERNELS:
        raise UsageError(f"kernels {kernels!r}: the latency predictor knows {', '.join(KERNELS)}")
    data = _load(os.path.abspath(calibration))
    rows = STAND_INS.get(core, core)  # the calibrated core whose rows price it
    coef = data.get("coefficients", {}).get(f"{rows}/{kernels}")
    if coef is None:
        raise UsageError(f"{os.path.basename(calibration)} has no calibration for {core} with {kernels} "
                         "(python -m benchmarks.latency)")
    ops = op_features(model, where)
    total, per = predict_from_features(ops, coef, kernels)
    return LatencyPrediction(
        instructions=int(round(total)),
        per_op=[{"op": f["op"], "type": f["type"], "instructions": int(round(c))} for f, c in zip(ops, per)],
        core=core, kernels=kernels,
        what=(f"estimated: per-op cost model calibrated on QEMU counts ({os.path.basename(calibration)}, "
              f"{data.get('date', '?')}, {data.get('commit', '?')})"
              + (f"; no rows for the {core} yet: priced with the {rows}'s (an estimate of its instructions; "
                 f"ratios between plans are what the search uses)" if rows != core else "")))


# ============================================================================= fitting (benchmarks/latency.py)
def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """min |a x - b| subject to x >= 0 (Lawson and Hanson's active set method; the fits are a few columns)."""
    n = a.shape[1]
    x = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    for _ in range(iterations):
        grad = a.T @ (b - a @ x)
        if free.all() or grad[~free].max(initial=-np.inf) <= 1e-10 * max(1.0, float(np.abs(grad).max())):
            break
        free[np.argmax(np.where(free, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if (z[free] > 0).all():
                x = z
                break
            neg = free & (z <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            free &= x > 1e-12
            x[~free] = 0.0
    return x


def _nnls(a: np.ndarray, b: np.ndarray, total: np.ndarray | None = None) -> np.ndarray:
    """Non-negative least squares, relative errors weighted equally (each row scaled by 1 / b, or by 1 / ``total``:
    the whole count of which ``b`` is the part left to fit)."""
    w = 1.0 / np.maximum(np.abs(b if total is None else total), 1.0)
    aw, bw = a * w[:, None], b * w
    scale = np.maximum(np.abs(aw).max(axis=0), 1e-12)
    return nnls(aw / scale, bw) / scale


def fit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Coefficients per "core/kernels" from the measured ``runs`` (benchmarks/latency.py's calibration runs):
    builtin rows fitted on the per-op counts, then the stage terms on the stage ops, then the Invoke's constant and
    per-op cost on what the ops' counts leave of the Invoke."""
    out: dict[str, Any] = {}
    for core in CORES:
        portable = _fit_portable([r for r in runs if r["core"] == core])
        for kernels in KERNELS:
            rs = [r for r in runs if r["core"] == core and r["kernels"] == kernels]
            if not rs:
                continue
            coef: dict[str, Any] = {"ops": {}, "stage": {}, "invoke": {"const": 0.0, "per_op": 0.0}, "light": {}}
            if portable:
                coef["portable"] = portable
            mve = core in MVE_CORES
            if mve:  # CMSIS-NN's Helium code: its paths (path_of), no folded product (stage_terms)
                coef["mve"] = True
            if core in NO_DSP_CORES:  # CMSIS-NN's plain C code: no folded product either (stage_terms)
                coef["dsp"] = False
            rows: dict[str, list[dict]] = {}
            for r in rs:
                for f in r["ops"]:
                    if f["type"] != f"custom:{abi.PATCH_STAGE_OP}":
                        rows.setdefault(path_of(f, kernels, mve), []).append(f)
            for row, fs in sorted(rows.items()):
                used = [k for k in FEATURES if any(f.get(k) for f in fs) and (mve or k not in MVE_FEATURES)
                        and (k in ELEMENTWISE_FEATURES or not _elementwise_row(row))]
                a = np.array([[f.get(k, 0.0) for k in used] for f in fs], dtype=float)
                b = np.array([f["insns"] for f in fs], dtype=float)
                x = _nnls(a, b)
                coef["ops"][row] = {k: float(v) for k, v in zip(used, x) if v}
            # an op type never measured is priced like the light ops (element-wise, shape and copy ops)
            light = [f for row, fs in rows.items() if row not in HEAVY for f in fs if ":" not in row]
            if light:
                a = np.array([[f["out"], f["inp"], 1.0] for f in light])
                x = _nnls(a, np.array([f["insns"] for f in light], dtype=float))
                coef["light"] = {k: float(v) for k, v in zip(("out", "inp", "calls"), x)}
            # Convolution paths measured only inside stages fall back to the op's generic row (path_of).
            stages = [f for r in rs for f in r["ops"] if f["type"] == f"custom:{abi.PATCH_STAGE_OP}"]
            # The CMSIS-NN backend calls the functions TFLM's CMSIS-NN kernels call: its calls are priced by the
            # builtin rows. The portable kernels are not TFLM's reference kernels: rows of their own.
            coef["stage_rows"] = kernels == "reference"
            if stages and coef["stage_rows"]:
                terms = [stage_row_terms(f, kernels, mve) for f in stages]
                used = sorted({t for tm in terms for t in tm})
                a = np.array([[tm.get(t, 0.0) for t in used] for tm in terms], dtype=float)
                b = np.array([f["insns"] - _stage_portable(f, coef, kernels) for f in stages], dtype=float)
                total = np.array([f["insns"] for f in stages], dtype=float)
                coef["stage"] = {t: float(v) for t, v in zip(used, _nnls(a, b, total)) if v}
            elif stages:
                # the folded 1x1 product's row, on its own counts (the instructions run inside it, per stage op)
                counted = [f for f in stages if f.get("folded_insns") and any(lf.get("folded") for lf in f["layers"])]
                if counted:
                    a = np.array([[sum(lf["folded"]["product"].get(k, 0.0) for lf in f["layers"] if lf.get("folded"))
                                   for k in FOLDED_FEATURES] for f in counted], dtype=float)
                    used = [k for i, k in enumerate(FOLDED_FEATURES) if a[:, i].any()]
                    x = _nnls(a[:, [FOLDED_FEATURES.index(k) for k in used]],
                              np.array([f["folded_insns"] for f in counted], dtype=float))
                    coef["folded"] = {k: float(v) for k, v in zip(used, x) if v}
                terms = [stage_terms(f, coef, kernels) for f in stages]
                used = [t for t in STAGE_TERMS if any(tm[t] for tm in terms)]
                a = np.array([[tm[t] for t in used] for tm in terms], dtype=float)
                # what the stage runs besides the fixed terms (the folded product measured where counted)
                b = np.array([f["insns"] - (f["folded_insns"] if "folded_insns" in f else tm["cost_folded"])
                              - sum(tm[t] for t in FIXED_TERMS if t != "cost_folded")
                              for f, tm in zip(stages, terms)], dtype=float)
                total = np.array([f["insns"] for f in stages], dtype=float)
                coef["stage"] = {t: float(v) for t, v in zip(used, _nnls(a, b, total))}
            # the Invoke beyond its ops: TFLM's loop over the ops and the profiler hook
            n = np.array([[1.0, len(r["ops"])] for r in rs])
            left = np.array([r["invoke"] - sum(f["insns"] for f in r["ops"]) for r in rs], dtype=float)
            const, per_op = np.linalg.lstsq(n, left, rcond=None)[0]
            coef["invoke"] = {"const": float(const), "per_op": float(per_op)}
            out[f"{core}/{kernels}"] = coef
    return out


def accuracy(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stored run: measured and predicted Invoke instructions and the relative error (from the stored
    features: the cost model alone)."""
    rows = []
    for r in data["runs"]:
        coef = data["coefficients"].get(f"{r['core']}/{r['kernels']}")
        if coef is None:
            continue
        pred, _ = predict_from_features(r["ops"], coef, r["kernels"])
        rows.append({"variant": r["variant"], "core": r["core"], "kernels": r["kernels"], "measured": r["invoke"],
                     "predicted": int(round(pred)), "error": pred / r["invoke"] - 1.0})
    return rows


def cross_validate(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Leave one zoo model out: for each, the coefficients fitted without any of its runs predict its runs (the
    error a model the calibration never saw gets)."""
    rows = []
    for name in sorted({r["zoo_model"] for r in data["runs"]}):
        rest = [r for r in data["runs"] if r["zoo_model"] != name]
        held = {"runs": [r for r in data["runs"] if r["zoo_model"] == name], "coefficients": fit(rest)}
        rows += accuracy(held)
    return rows
