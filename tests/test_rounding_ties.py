"""Rounding ties of ops TF Lite and TFLM requantize apart, anywhere in a model (``tfmcu.runtime.agreement.op_ties``).

TF Lite takes an int8 MUL's multiplier from a float32 product and quotient of the scales, TFLM from double ones. The
model here is one MUL of two inputs whose scales are set (not calibrated) to values where the two multipliers differ
(1594406784 and 1594406864, shift -9), and the inputs are the 8 pairs of int8 values whose products then round 1
apart: the difference is built in, independent of the host that converts the model. A RESHAPE after the MUL shows the
replay going on past the op that differs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfmcu.kernels.quant import multiply_by_quantized_multiplier, quantize_multiplier  # noqa: E402
from tfmcu.runtime.agreement import Agreement, compare, op_ties, rounding_ties  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.runtime.tflm import run_tflm  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

SCALES = (0.010742419, 0.0043325424, 0.032095607)  # input 1, input 2, output (float32)


def _multipliers() -> tuple[tuple[int, int], tuple[int, int]]:
    s1, s2, so = (np.float32(s) for s in SCALES)
    return (quantize_multiplier(float(s1 * s2 / so)),  # TF Lite: float32 product and quotient
            quantize_multiplier(float(s1) * float(s2) / float(so)))  # TFLM: double


def _pairs() -> list[tuple[int, int]]:
    tfl, tflm = _multipliers()
    out = []
    for a in range(-128, 128):
        for b in range(-128, 128):
            x = np.clip([multiply_by_quantized_multiplier(a * b, *m) for m in (tfl, tflm)], -128, 127)
            if x[0] != x[1]:
                out.append((a, b))
    return out


@pytest.fixture(scope="module")
def mul_model() -> bytes:
    import tf_keras
    from tf_keras import layers as L

    from tfmcu.nets.convert import to_int8_tflite

    a, b = tf_keras.Input((4, 4, 16)), tf_keras.Input((4, 4, 16))
    model = tf_keras.Model([a, b], L.Reshape((256,))(L.Multiply()([a, b])))

    def rep():
        rng = np.random.default_rng(0)
        for _ in range(4):
            yield [rng.uniform(-1, 1, (1, 4, 4, 16)).astype(np.float32) for _ in range(2)]

    m = ts.load_model(to_int8_tflite(model, rep))
    sg = m.subgraphs[0]
    mul = next(op for op in sg.operators if ts.op_name(m, op) == "MUL")
    tensors = [int(t) for t in mul.inputs] + [int(mul.outputs[0])]
    reshaped = int(sg.outputs[0])
    for t, s in zip(tensors + [reshaped], SCALES + (SCALES[2],)):
        q = sg.tensors[t].quantization
        q.scale, q.zeroPoint = np.asarray([s], np.float32), np.asarray([0], np.int64)
    return ts.write_model(m)


def _samples(pairs: list[tuple[int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = np.zeros((1, 4, 4, 16), np.int8), np.zeros((1, 4, 4, 16), np.int8)
    for k, (a, b) in enumerate(pairs):
        x.flat[k], y.flat[k] = a, b
    return [(x, y), (np.zeros_like(x), np.zeros_like(y))]


def test_a_mul_tie_is_proven_op_by_op(mul_model):
    tfl_m, tflm_m = _multipliers()
    assert tfl_m != tflm_m
    pairs = _pairs()
    assert len(pairs) == 8
    samples = _samples(pairs)
    tfl, tflm = run_tflite(mul_model, samples), run_tflm(mul_model, samples)
    differences = compare(tfl, tflm)
    assert [m.sample for m in differences] == [0] and differences[0].max_abs_diff == 1
    ties = op_ties(mul_model, samples, tfl, tflm)
    assert list(ties) == [0] and [t.channel for t in ties[0]] == list(range(8))
    assert all(t.op_type == "MUL" and abs(t.tflite - t.tflm) == 1 and t.value is None for t in ties[0])
    assert rounding_ties(mul_model, samples, tfl, tflm) == ties  # the head (none here) first, then the ops
    agreement = Agreement.of(2, differences, ties)
    assert agreement.agree and agreement.tie_samples == 1 and "of MUL ops" in agreement.describe()


def test_any_other_difference_is_a_mismatch(mul_model):
    samples = _samples(_pairs())
    tfl, tflm = run_tflite(mul_model, samples), run_tflm(mul_model, samples)
    planted = [[o.copy() for o in r] for r in tflm]
    planted[0][0].flat[100] = planted[0][0].flat[100] + 1  # an element no tie explains (its product is 0)
    assert op_ties(mul_model, samples, tfl, planted) == {}
    far = [[o.copy() for o in r] for r in tflm]
    far[0][0].flat[0] = np.int8(far[0][0].flat[0] + 2)  # a tie's element, 2 apart
    assert op_ties(mul_model, samples, tfl, far) == {}
