"""TF Lite against TFLM on the same inputs: outputs compared sample by sample, each difference classified.

The two interpreters run the same integer arithmetic for every op of an int8 model but one. TF Lite's reference
FULLY_CONNECTED requantizes its int32 sums with the float scales and rounds once (``round(sum x input scale x
filter scale / output scale)``, in double); TFLM's multiplies them by QuantizeMultiplier's fixed point and rounds
twice (SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT). So an output whose exact value lies within
rounding of a half comes out 1 apart (23.49991: 23 in TF Lite, 24 in TFLM): a rounding tie, expected, not a bug in
the model. Which inputs meet a tie depends on the model's bytes, and those on the host that converted or trained it
(TensorFlow's float kernels differ by instruction set), so no caller may presume that the two agree, or disagree, on
given inputs: it classifies the differences.

* ``compare(a, b)``: the samples whose outputs differ (``Mismatch``: the first differing output of each);
  ``same_outputs(a, b)``: one sample's outputs equal.
* ``head_ties(model, samples, tflite, tflm)``: the differing samples that rounding ties in the model's FULLY_CONNECTED
  head explain, each with its ties (``Tie``), proven on the model. The head is the model's last int8
  FULLY_CONNECTED; the ops after it (its tail: RESHAPE, SOFTMAX, DEQUANTIZE, ...) may read only its output, their
  own and constants. For each differing sample:

  1. the model with the head's input and output as extra outputs runs again in both interpreters: it gives the
     outputs compared, and the head's input is the same in both (everything before the head is bit-exact);
  2. the head's int32 sums are recomputed from that input, with its weights and bias: TF Lite's head output is TF Lite's
     requantization of them (``tfmcu.kernels.quant.requantize_float``), TFLM's is TFLM's
     (``multiply_by_quantized_multiplier`` with QuantizeMultiplier's multiplier and shift), element for element, and
     the two are at most 1 apart;
  3. the tail, run in TF Lite on TFLM's head output, gives TFLM's outputs (the tail is bit-exact), and the outputs
     that do not depend on the head are equal.

  A sample with any difference not so explained is a real mismatch. A custom-mode model (``TFMCU_PATCH_STAGE`` ops)
  runs as ``tfmcu.runtime.host.evaluate`` runs it: its stages in our C kernels on the TF Lite side, whole in TFLM
  built from source with our kernel on the other; its head is a builtin FULLY_CONNECTED after them.
* ``op_ties(model, samples, tflite, tflm)``: the differing samples that rounding ties of ops of ``ROUNDS_APART``
  anywhere explain (TF Lite takes MUL's multiplier from a float32 product, SUB's from other quotients, LOGISTIC and
  TANH from a float table: each 1 apart from TFLM on rare inputs), proven op by op: every operator's output of the
  TFLM run, from the first that differs on, equals its own op run alone in TF Lite on TFLM's inputs, or is 1 apart
  from it for such an op. ``rounding_ties`` is both (the head first).
* ``Agreement``: what a report holds (``agree``: no difference but rounding ties), ``Agreement.of`` builds it.
* ``may_round_apart(model)``: whether the model has an op TF Lite's reference kernels requantize otherwise than
  TFLM's (``ROUNDS_APART``); a model without one gives TFLM's bytes in TF Lite. ``expected(tflite, tflm, ties)``: per
  sample, what a TFLM deployment must give: TF Lite's outputs, TFLM's on a proven tie.

``train`` (its int8 model), ``verify`` (each model, and the ``tflm_semantics`` of a rewritten model), ``deploy`` (the
firmware's expectation, input by input) and the demo read TF Lite against TFLM through these;
``docs/pipelines.md#rounding-ties`` explains the tie to users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu.kernels.quant import (activation_range, conv_multipliers, multiply_by_quantized_multiplier, real_scales,
                                 requantize_float)
from tfmcu.records import Record, optional
from tfmcu.runtime.host import evaluate, segment_model
from tfmcu.runtime.isolate import isolatable
from tfmcu.runtime.model_io import parsed
from tfmcu.runtime.tflite import run_tflite
from tfmcu.runtime.tflm import run_tflm
from tfmcu.runtime.tflm_host import streamed_image
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import OFFLINE_PLAN_METADATA, ModelEditor, fold_static_reshapes
from tfmcu.tflite.model import TfliteModel
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

HOW = ("TF Lite's reference FULLY_CONNECTED rounds once with the float scales, TFLM's twice with a fixed-point "
       "multiplier: an output within rounding of a half comes out 1 apart (docs/pipelines.md#rounding-ties)")
# The ops whose TF Lite reference kernel requantizes otherwise than TFLM's (module docstring): FULLY_CONNECTED rounds
# once with float scales; MUL takes its multiplier from a float32 product, SUB its rescaling multipliers from other
# quotients; LOGISTIC and TANH look up a float table where TFLM computes gemmlowp's fixed point. Each comes out 1
# apart on rare inputs (tests/test_eltwise_kernels.py measures where).
ROUNDS_APART = ("FULLY_CONNECTED", "MUL", "SUB", "LOGISTIC", "TANH")


@dataclass(frozen=True, kw_only=True)
class Mismatch(Record):
    """A sample whose outputs differ (the first differing output)."""

    interpreter: str | None = optional()  # "tflite-<resolver>" or "tflm" (None: TF Lite against TFLM, one model)
    sample: int
    output: int
    max_abs_diff: float | None  # None: shapes or types differ (``note``)
    note: str | None = optional()
    source: str | None = optional()  # "random" or "inputs"
    output_name: str | None = optional()  # a detector's output


@dataclass(frozen=True, kw_only=True)
class Tie(Record):
    """An output element that TF Lite and TFLM round 1 apart, proven (module docstring): of the FULLY_CONNECTED head
    (``head_ties``), or of an op of ``ROUNDS_APART`` anywhere (``op_ties``: ``op_type`` names it)."""

    sample: int
    op: int  # the operator index
    channel: int  # its output element
    # before rounding: the int32 sum x the real scale + the output zero point (within rounding of .5; the head's)
    value: float | None = optional()
    tflite: int
    tflm: int
    op_type: str | None = optional()  # an op_ties tie: the operator's builtin


@dataclass(frozen=True, kw_only=True)
class Agreement(Record):
    """TF Lite against TFLM on the same inputs: ``agree`` when every output is equal or 1 apart by a rounding tie in
    the head (``tie_samples``: expected, module docstring); any other difference makes a ``mismatching_samples``."""

    agree: bool
    samples: int
    mismatching_samples: int
    tie_samples: int = 0
    first: list[Mismatch] = field(default_factory=list)  # the first mismatching samples
    ties: list[Tie] = field(default_factory=list)  # the first ties
    tflite_kernels: str = "reference"

    @property
    def identical(self) -> bool:
        """Every output equal, bit for bit."""
        return self.mismatching_samples == 0 and self.tie_samples == 0

    @classmethod
    def of(cls, samples: int, differences: Sequence[Mismatch], ties: dict[int, list[Tie]],
           tflite_kernels: str = "reference", max_details: int = 5) -> "Agreement":
        """From ``compare``'s differences and ``head_ties``' proven ties (of those samples)."""
        real = [m for m in differences if m.sample not in ties]
        tied = sorted(ties)
        return cls(agree=not real, samples=samples, mismatching_samples=len(real), tie_samples=len(tied),
                   first=list(real[:max_details]), ties=[t for s in tied for t in ties[s]][:max_details],
                   tflite_kernels=tflite_kernels)

    @classmethod
    def from_earlier(cls, d: dict[str, Any]) -> dict[str, Any]:
        """A detector's train_report.json counted images: ``images``, ``mismatching_images``."""
        renamed = {"images": "samples", "mismatching_images": "mismatching_samples"}
        return {renamed.get(k, k): v for k, v in d.items()}

    def describe(self, unit: str = "samples") -> str:
        """One line for a summary."""
        def n(count: int) -> str:
            return f"{count} {unit[:-1] if count == 1 and unit.endswith('s') else unit}"

        if self.identical:
            return f"identical outputs on all {n(self.samples)}"
        parts = []
        if self.tie_samples:
            others = sorted({t.op_type for t in self.ties if t.op_type is not None})
            where = "in the FULLY_CONNECTED head" if not others else f"of {', '.join(others)} ops"
            parts.append(f"{n(self.tie_samples)} 1 apart by a rounding tie {where} (expected: "
                         f"docs/pipelines.md#rounding-ties)")
        if self.mismatching_samples:
            parts.append(f"DISAGREE on {n(self.mismatching_samples)}")
        same = self.samples - self.tie_samples - self.mismatching_samples
        return f"identical on {same} of {n(self.samples)}; " + "; ".join(parts)


def may_round_apart(model: TfliteModel) -> bool:
    """Whether TF Lite's reference kernels may give ``model`` other bytes than TFLM: it has an op of ``ROUNDS_APART``
    (outside a ``TFMCU_PATCH_STAGE``, whose ops run in our C kernels on both sides). Without one, every op requantizes
    alike in both, and TF Lite's outputs are TFLM's."""
    return any(name in ROUNDS_APART for name in model.op_names)


def expected(tflite: Sequence[Sequence[np.ndarray]], tflm: Sequence[Sequence[np.ndarray]],
             ties: dict[int, list[Tie]]) -> list[list[np.ndarray]]:
    """Per sample, what TFLM must give: TF Lite's outputs, except on a sample whose difference is a proven rounding
    tie (``ties``: ``head_ties``' samples, numbered from 0), TFLM's there."""
    return [list(b) if k in ties else list(a) for k, (a, b) in enumerate(zip(tflite, tflm))]


def same_outputs(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """The same values, output for output (a caller's outputs may be flattened)."""
    return len(a) == len(b) and all(np.array_equal(np.ravel(u), np.ravel(v)) for u, v in zip(a, b))


def compare(a: Sequence[Sequence[np.ndarray]], b: Sequence[Sequence[np.ndarray]], offset: int = 0) -> list[Mismatch]:
    """Samples whose outputs differ (the first differing output of each); sample numbers from ``offset``."""
    out = []
    for i, (xa, xb) in enumerate(zip(a, b)):
        for j, (u, v) in enumerate(zip(xa, xb)):
            u, v = np.asarray(u), np.asarray(v)
            if u.shape != v.shape or u.dtype != v.dtype:
                out.append(Mismatch(sample=i + offset, output=j, max_abs_diff=None,
                                    note=f"{u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)}"))
                break
            if not np.array_equal(u, v):
                d = np.abs(u.astype(np.float64) - v.astype(np.float64))
                out.append(Mismatch(sample=i + offset, output=j, max_abs_diff=float(np.nanmax(d))))
                break
    return out


@dataclass(frozen=True)
class Head:
    """A model's FULLY_CONNECTED head and what recomputing it takes (``Head.find``)."""

    op: int  # operator index
    input: int  # tensor indices
    output: int
    weights: np.ndarray  # int64 [channels, depth]
    bias: np.ndarray  # int64 [channels]
    input_zero_point: int
    output_zero_point: int
    real: list[float]  # per channel: TF Lite's scale
    multiplier: np.ndarray  # per channel: TFLM's fixed point
    shift: np.ndarray
    clamp: tuple[int, int]  # the fused activation's range
    tail: list[int]  # the operators after it (each reading only the head's output, the tail's and constants)

    @classmethod
    def find(cls, model: TfliteModel) -> "Head | None":
        """The model's last FULLY_CONNECTED, when it is int8 with constant weights (zero zero points), a constant
        int32 bias or none, one sample per batch, and only its tail after it; else None."""
        m = model.flatbuffer
        sg = m.subgraphs[0]
        names = model.op_names
        heads = [k for k, name in enumerate(names) if name == "FULLY_CONNECTED"]
        if not heads:
            return None
        k = heads[-1]
        op = sg.operators[k]
        ins = [int(i) for i in op.inputs]
        if len(ins) < 2 or len(op.outputs) != 1:
            return None
        x, w, y = (sg.tensors[i] for i in (ins[0], ins[1], int(op.outputs[0])))
        if any(ts.dtype_name(t.type) != "int8" for t in (x, w, y)) or not ts.is_constant(m, w):
            return None
        wq, xq, yq = w.quantization, x.quantization, y.quantization
        if wq is None or xq is None or yq is None or np.any(np.asarray(wq.zeroPoint if wq.zeroPoint is not None
                                                                          else [0]) != 0):
            return None
        channels, depth = ts.tensor_shape(w)[0], int(np.prod(ts.tensor_shape(w)[1:]))
        if int(np.prod(ts.tensor_shape(x))) != depth or int(np.prod(ts.tensor_shape(y))) != channels:
            return None
        weights = np.frombuffer(bytes(m.buffers[w.buffer].data), np.int8).astype(np.int64).reshape(channels, depth)
        bias = np.zeros(channels, np.int64)
        if len(ins) > 2 and ins[2] >= 0:
            b = sg.tensors[ins[2]]
            if ts.dtype_name(b.type) != "int32" or not ts.is_constant(m, b):
                return None
            bias = np.frombuffer(bytes(m.buffers[b.buffer].data), np.int32).astype(np.int64)
        produced, tail = {int(op.outputs[0])}, list(range(k + 1, len(sg.operators)))
        for j in tail:
            reads = [int(i) for i in sg.operators[j].inputs if i >= 0]
            if any(i not in produced and not ts.is_constant(m, sg.tensors[i]) for i in reads):
                return None  # an op after the head that reads something else: not a tail
            produced |= {int(i) for i in sg.operators[j].outputs}
        in_scale, out_scale = float(xq.scale[0]), float(yq.scale[0])
        mult, shift = conv_multipliers(in_scale, wq.scale, out_scale, channels)
        act = ts.activation_name(getattr(op.builtinOptions, "fusedActivationFunction", 0))
        return cls(op=k, input=ins[0], output=int(op.outputs[0]), weights=weights, bias=bias,
                   input_zero_point=int(xq.zeroPoint[0]), output_zero_point=int(yq.zeroPoint[0]),
                   real=real_scales(in_scale, wq.scale, out_scale, channels), multiplier=mult, shift=shift,
                   clamp=activation_range(act, out_scale, int(yq.zeroPoint[0])), tail=tail)

    def sums(self, x: np.ndarray) -> np.ndarray:
        """The int32 sums of the head's input ``x`` (int8): weights x (x - zero point) + bias."""
        return self.weights @ (np.asarray(x).astype(np.int64).reshape(-1) - self.input_zero_point) + self.bias

    def outputs(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TF Lite's output, TFLM's output, the values before rounding) of the head on its input ``x``."""
        acc = self.sums(x)
        lo, hi = self.clamp
        zp = self.output_zero_point
        tfl = [min(hi, max(lo, requantize_float(a, r) + zp)) for a, r in zip(acc, self.real)]
        tflm = [min(hi, max(lo, multiply_by_quantized_multiplier(a, int(m), int(s)) + zp))
                for a, m, s in zip(acc, self.multiplier, self.shift)]
        return np.asarray(tfl, np.int64), np.asarray(tflm, np.int64), np.asarray(
            [float(a) * r + zp for a, r in zip(acc, self.real)])


def probe_model(model: TfliteModel, tensors: Sequence[int]) -> bytes:
    """``model`` with ``tensors`` as extra outputs, after its own (no signature, no offline memory plan: every
    tensor where TFLM's own planner puts it)."""
    ed = ModelEditor(model.data)
    sg = ed.subgraph
    sg.outputs = np.asarray([int(t) for t in sg.outputs] + [int(t) for t in tensors], dtype=np.int32)
    ed.model.signatureDefs = []
    ed.remove_metadata(OFFLINE_PLAN_METADATA)
    return ed.to_bytes()


@isolatable
def head_ties(model: TfliteModel | bytes, samples: Sequence[Any], tflite: Sequence[Sequence[np.ndarray]],
              tflm: Sequence[Sequence[np.ndarray]], resolver: str = "reference", offset: int = 0,
              where: str = "model") -> dict[int, list[Tie]]:
    """The samples on which ``tflite`` and ``tflm`` (the outputs of ``model`` on ``samples`` in TF Lite with
    ``resolver``'s kernels and in TFLM) differ only by rounding ties in the FULLY_CONNECTED head, proven (module
    docstring), each with its ties; sample numbers from ``offset``. ``isolate=True``: in a child process."""
    differing = [k for k, (a, b) in enumerate(zip(tflite, tflm)) if not same_outputs(a, b)]
    if not differing:
        return {}
    model = parsed(model, where)
    head = Head.find(model)
    if head is None or any(model.op_names[j] == f"custom:{PATCH_STAGE_OP}" for j in head.tail):
        return {}  # no head, or a tail TF Lite cannot run alone
    sg = model.flatbuffer.subgraphs[0]
    outputs = [int(t) for t in sg.outputs]
    n = len(outputs)
    downstream = {head.output} | {int(t) for j in head.tail for t in sg.operators[j].outputs}
    probe = probe_model(model, [head.input, head.output])
    picked = [samples[k] for k in differing]
    if f"custom:{PATCH_STAGE_OP}" in model.op_names:  # the stages in our C kernels / whole in TFLM with our kernel
        run = evaluate(probe, picked, resolver, where)
        p_tfl, p_tflm = run.tflite, run.tflm
    else:
        p_tfl, p_tflm = run_tflite(probe, picked, resolver, where), run_tflm(probe, picked, where=where)
    candidates: dict[int, tuple[np.ndarray, list[Tie]]] = {}
    for k, a, b in zip(differing, p_tfl, p_tflm):
        if not (same_outputs(a[:n], tflite[k]) and same_outputs(b[:n], tflm[k]) and np.array_equal(a[n], b[n])):
            continue  # not the outputs compared, or the head's input differs: something before the head
        want_tfl, want_tflm, value = head.outputs(a[n])
        got_tfl, got_tflm = a[n + 1].astype(np.int64).reshape(-1), b[n + 1].astype(np.int64).reshape(-1)
        if not (np.array_equal(got_tfl, want_tfl) and np.array_equal(got_tflm, want_tflm)
                and np.abs(got_tfl - got_tflm).max() <= 1):
            continue  # the head computes something else than the two requantizations
        if any(outputs[j] not in downstream and not same_outputs([tflite[k][j]], [tflm[k][j]]) for j in range(n)):
            continue  # an output that does not depend on the head differs
        ties = [Tie(sample=k + offset, op=head.op, channel=int(c), value=float(value[c]), tflite=int(got_tfl[c]),
                    tflm=int(got_tflm[c])) for c in np.flatnonzero(got_tfl != got_tflm)]
        candidates[k] = (b[n + 1], ties)
    later = [j for j in range(n) if outputs[j] != head.output and outputs[j] in downstream]
    if later and candidates:  # the tail in TF Lite on TFLM's head output must give TFLM's outputs
        tail = segment_model(model.flatbuffer, head.tail, [head.output], [outputs[j] for j in later])
        runs = run_tflite(tail, [(y,) for y, _ in candidates.values()], resolver, where)
        for k, got in zip(list(candidates), runs):
            if not same_outputs(got, [tflm[k][j] for j in later]):
                del candidates[k]
    return {k + offset: ties for k, (_, ties) in candidates.items() if ties}


# the most ties an op_ties sample lists (its count of differing elements is in the record's length otherwise)
MAX_OP_TIES = 64


@isolatable
def op_ties(model: TfliteModel | bytes, samples: Sequence[Any], tflite: Sequence[Sequence[np.ndarray]],
            tflm: Sequence[Sequence[np.ndarray]], resolver: str = "reference", offset: int = 0,
            where: str = "model") -> dict[int, list[Tie]]:
    """The samples on which ``tflite`` and ``tflm`` differ only by rounding ties of ops of ``ROUNDS_APART`` anywhere
    in the model, proven op by op: the model runs again in both interpreters with every operator's output as an
    extra output; from the first operator whose output differs on, each builtin operator runs alone in TF Lite on
    TFLM's inputs (``segment_model``), and its output must be TFLM's, or, for an op of ``ROUNDS_APART`` with int8
    outputs, at most 1 apart from it (the two arithmetics' rounding). Every op then computes in TFLM what TF Lite's
    arithmetic computes up to those ties, so TFLM's outputs are the model's outputs with TFLM's rounding. A
    ``TFMCU_PATCH_STAGE`` op runs our C kernels on both sides (its outputs follow its inputs). A model that streams
    its input is not replayed (no differing sample is explained). ``isolate=True``: in a child process."""
    differing = [k for k, (a, b) in enumerate(zip(tflite, tflm)) if not same_outputs(a, b)]
    if not differing:
        return {}
    # (a reshape's shape computed at run time given as a constant first: the same outputs, no int32 arithmetic to
    # replay)
    model = parsed(fold_static_reshapes(parsed(model, where), where)[0], where)
    m = model.flatbuffer
    sg = m.subgraphs[0]
    ops = list(sg.operators or [])
    names = model.op_names
    stage = f"custom:{PATCH_STAGE_OP}"
    if streamed_image(model) is not None:
        return {}
    inputs = [int(t) for t in sg.inputs]
    outputs = [int(t) for t in sg.outputs]
    n = len(outputs)
    made = [t for op in ops for t in (int(v) for v in (op.outputs if op.outputs is not None else [])) if t >= 0]
    probe = probe_model(model, made)
    picked = [samples[k] for k in differing]
    if stage in names:
        run = evaluate(probe, picked, resolver, where)
        p_tfl, p_tflm = run.tflite, run.tflm
    else:
        p_tfl, p_tflm = run_tflite(probe, picked, resolver, where), run_tflm(probe, picked, where=where)
    found: dict[int, list[Tie]] = {}
    for k, x, a, b in zip(differing, picked, p_tfl, p_tflm):
        if not (same_outputs(a[:n], tflite[k]) and same_outputs(b[:n], tflm[k])):
            continue  # not the outputs compared
        values = dict(zip(inputs, [np.asarray(v) for v in (x if isinstance(x, (list, tuple)) else [x])]))
        tfl = dict(zip(made, a[n:]))
        tm = {**values, **dict(zip(made, b[n:]))}
        first = next((i for i, op in enumerate(ops) for t in (op.outputs if op.outputs is not None else [])
                      if int(t) >= 0 and not np.array_equal(tfl[int(t)], tm[int(t)])), None)
        ties: list[Tie] = []
        explained = first is not None
        for i in range(first if first is not None else len(ops), len(ops)):
            if names[i] == stage:
                continue
            op = ops[i]
            ins = [int(t) for t in op.inputs if t >= 0 and not ts.is_constant(m, sg.tensors[int(t)])]
            outs = [int(t) for t in op.outputs if t >= 0]
            if any(t not in tm for t in ins):
                explained = False
                break
            feed = tuple(_as_declared(tm[t], sg.tensors[t]) for t in ins)
            got = run_tflite(segment_model(m, [i], ins, outs), [feed], resolver, where)[0]
            for t, g in zip(outs, got):
                want = tm[t]
                g = np.asarray(g).reshape(want.shape)
                if np.array_equal(g, want):
                    continue
                diff = np.abs(g.astype(np.int64) - want.astype(np.int64)).reshape(-1)
                if names[i] not in ROUNDS_APART or want.dtype != np.int8 or int(diff.max()) > 1:
                    explained = False
                    break
                ties += [Tie(sample=k + offset, op=i, channel=int(c), tflite=int(g.reshape(-1)[c]),
                             tflm=int(want.reshape(-1)[c]), op_type=names[i]) for c in np.flatnonzero(diff)]
            if not explained:
                break
        if explained and ties:
            found[k + offset] = ties[:MAX_OP_TIES]
    return found


def _as_declared(value: np.ndarray, tensor: Any) -> np.ndarray:
    """``value`` in its tensor's declared shape (an interpreter may hand a scalar back as [1]), where the sizes agree."""
    shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else []))
    v = np.asarray(value)
    return v.reshape(shape) if int(np.prod(shape, dtype=np.int64)) == v.size else v


@isolatable
def rounding_ties(model: TfliteModel | bytes, samples: Sequence[Any], tflite: Sequence[Sequence[np.ndarray]],
                  tflm: Sequence[Sequence[np.ndarray]], resolver: str = "reference", offset: int = 0,
                  where: str = "model") -> dict[int, list[Tie]]:
    """Every differing sample that rounding ties explain, proven: ``head_ties`` (the FULLY_CONNECTED head), then
    ``op_ties`` (any op of ``ROUNDS_APART``) for the samples the head does not explain. ``isolate=True``: in a child
    process."""
    model = parsed(model, where)
    ties = head_ties(model, samples, tflite, tflm, resolver, offset, where)
    left = [k for k, (a, b) in enumerate(zip(tflite, tflm)) if not same_outputs(a, b) and k + offset not in ties]
    if left and may_round_apart(model):
        more = op_ties(model, [samples[k] for k in left], [tflite[k] for k in left], [tflm[k] for k in left],
                       resolver, 0, where)
        ties.update({left[j] + offset: t for j, t in more.items()})
    return ties
