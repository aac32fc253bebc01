"""Element-wise int8 C kernels (tflm_patch_kernels/: mul.c, sub.c, add.c's broadcast, hard_swish.c, logistic.c,
tanh.c, leaky_relu.c) bit-exact with TFLite's reference kernels and with TFLM.

* Single-op models converted here with tf_keras (Multiply of two activations, Multiply by a [1, 1, 1, C]
  squeeze-excite scale, ADD / SUB of such a scale, swish = x * sigmoid(x), hard_swish, sigmoid, tanh, LeakyReLU,
  Rescaling(1/127.5, -1) and Rescaling(1/255) at the input, Normalization with per-channel mean and variance at the
  input, MobileNetV3's hard sigmoid, SUB of two activations). Each op runs through its C kernel (``binding.run_op``
  on TF Lite's tensors, a constant operand fed as input 2) == TF Lite's output tensor; and the C kernels run op
  after op == the model outputs of TFLM built from the pinned sources (the firmware's and the host runner's), of
  the tflite-micro wheel and of TF Lite, each with its own Prepare arithmetic where they differ (``REFERENCES``:
  SUB's multipliers in float32 at the pinned TFLM, in double in the wheel and TF Lite; MUL's from a float32 product
  in TF Lite): the same kernels given those params match each bit for bit.
* Parameter grids: every model also runs with the quantization of its checked ops' tensors (scales, zero points,
  LeakyReLU's alpha) redrawn from a seeded generator (the flatbuffer edited), on inputs that hold every int8 value of
  each operand (every pair of values for two operands) and on random ones.
* LOGISTIC and TANH on all 256 inputs for a grid of input scales and zero points: the kernel == TFLM (pinned and
  wheel) everywhere, == TF Lite where TF Lite's float table agrees with TFLM's fixed point; where they differ is
  asserted as stated in logistic.h / tanh.h and docs/limitations.md.
* SUB is its own op: a SUB model whose scales make the negated-multiplier ADD round an exact half the other way.
* Builders refuse with one line what the kernels do not run (int16, a broadcast other than per channel, constant
  minus activation, a fused activation the op cannot have, LOGISTIC / TANH output quantization, ...).
* The stage executor runs the one-input ops and MUL / SUB of two activations patch by patch (any grid: bit-exact,
  scratch exact), and so does the TFMCU_PATCH_STAGE op of a custom-mode model in TFLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfmcu import abi, kernels  # noqa: E402
from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.kernels import binding, ops, pack, quant  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite, tflite_all_tensors  # noqa: E402
from tfmcu.runtime.tflm import run_tflm  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole  # noqa: E402
from tfmcu.stage import custom  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

SHAPE = (16, 16, 8)  # one-input ops and constant operands: every int8 value in each channel (16 x 16 pixels)
PAIRS = (16, 16, 256)  # two operands: operand 1 by pixel, operand 2 by channel: every pair of int8 values
GRID = 6  # redrawn quantizations per model (seeded), besides the converter's own


# ============================================================================= models
def convert(model: Any, low: float, high: float) -> bytes:
    """Full-int8 .tflite of a tf_keras model with one or more inputs, int8 inputs and outputs, calibrated on seeded
    uniform samples in [low, high] (a dict by input name: the converter orders the inputs its own way)."""
    import tensorflow as tf

    def representative() -> Any:
        rng = np.random.default_rng(0)
        for _ in range(4):
            yield {layer.name: rng.uniform(low, high, (1, *layer.shape[1:])).astype(np.float32)
                   for layer in model.inputs}

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def _inputs(*shapes: tuple[int, ...]) -> list[Any]:
    import tf_keras

    return [tf_keras.Input(s, name=f"in{k}") for k, s in enumerate(shapes)]


def _one(body: Callable[[Any], Any], shape: tuple[int, ...] = SHAPE) -> Callable[[], Any]:
    def make() -> Any:
        import tf_keras

        (x,) = _inputs(shape)
        return tf_keras.Model(x, body(x))
    return make


def _two(layer: str, shape2: tuple[int, ...] = PAIRS, relu: bool = False) -> Callable[[], Any]:
    def make() -> Any:
        import tf_keras
        from tf_keras import layers as L

        a, b = _inputs(PAIRS, shape2)
        y = getattr(L, layer)()([a, b])
        return tf_keras.Model([a, b], L.ReLU()(y) if relu else y)
    return make


def _hard_swish(x: Any) -> Any:
    import tensorflow as tf
    from tf_keras import layers as L

    return L.Lambda(lambda t: t * tf.nn.relu6(t + 3.0) / 6.0)(x)


def _hard_sigmoid(x: Any) -> Any:  # MobileNetV3's: relu6(x + 3) * (1 / 6)
    import tensorflow as tf
    from tf_keras import layers as L

    return L.Lambda(lambda t: tf.nn.relu6(t + 3.0) * (1.0 / 6.0))(x)


def _swish(x: Any) -> Any:
    from tf_keras import layers as L

    return L.Multiply()([x, L.Activation("sigmoid")(x)])


def _rescaling(scale: float, offset: float = 0.0) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        from tf_keras import layers as L

        return L.Rescaling(scale, offset)(x)
    return f


def _normalization(x: Any) -> Any:
    from tf_keras import layers as L

    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255, 120.0, 10.0, 200.0, 90.0, 127.5]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255, 50.0, 12.0, 80.0, 30.0, 127.5]
    return L.Normalization(mean=mean, variance=[s * s for s in std])(x)


def _activation(name: str) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        from tf_keras import layers as L

        return L.Activation(name)(x)
    return f


def _leaky(alpha: float) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        from tf_keras import layers as L

        return L.LeakyReLU(alpha)(x)
    return f


@dataclass
class Case:
    name: str
    build: Callable[[], Any]  # -> tf_keras.Model
    ops: tuple[str, ...]  # TFLite ops checked with their C kernel, in model order
    low: float = -1.0  # calibration range
    high: float = 1.0
    constant: bool = False  # the checked ops have a constant operand (LayerSpec.operand)
    broadcast: bool = False  # input 2 of a checked op is a [1, 1, 1, C] activation
    alphas: tuple[float, ...] = ()  # LEAKY_RELU: the alpha grid
    grid: int = GRID  # redrawn quantizations
    # where the references' Prepare arithmetic differs (REFERENCES): those that change some output on this grid
    differ: tuple[str, ...] = ()


CASES = [
    Case("mul", _two("Multiply"), ("MUL",), grid=20, differ=("tflite",)),
    Case("mul_relu", _two("Multiply", relu=True), ("MUL",)),
    Case("mul_squeeze_excite", _two("Multiply", (1, 1, PAIRS[2])), ("MUL",), broadcast=True),
    Case("add_channel_scale", _two("Add", (1, 1, PAIRS[2])), ("ADD",), broadcast=True),
    Case("sub", _two("Subtract"), ("SUB",), grid=20, differ=("wheel", "tflite")),
    Case("sub_channel_scale", _two("Subtract", (1, 1, PAIRS[2])), ("SUB",), broadcast=True),
    Case("swish", _one(_swish), ("LOGISTIC", "MUL"), -6.0, 6.0),
    Case("hard_swish", _one(_hard_swish), ("HARD_SWISH",), -6.0, 6.0),
    Case("sigmoid", _one(_activation("sigmoid")), ("LOGISTIC",), -8.0, 8.0),
    Case("tanh", _one(_activation("tanh")), ("TANH",), -4.0, 4.0),
    Case("leaky_relu", _one(_leaky(0.2)), ("LEAKY_RELU",),
         alphas=(0.0, 0.01, 0.1, 0.2, 0.3, 0.5, 1.0, 1.7, 3.0, -0.25)),
    Case("rescaling_127_5", _one(_rescaling(1 / 127.5, -1.0)), ("MUL", "ADD"), 0.0, 255.0, constant=True),
    Case("rescaling_255", _one(_rescaling(1 / 255.0)), ("MUL",), 0.0, 255.0, constant=True),
    Case("normalization", _one(_normalization), ("SUB", "MUL"), 0.0, 255.0, constant=True),
    Case("hard_sigmoid", _one(_hard_sigmoid), ("ADD", "MUL"), -6.0, 6.0, constant=True),
]


@pytest.fixture(scope="module")
def models() -> Callable[[Case], bytes]:
    cache: dict[str, bytes] = {}

    def get(case: Case) -> bytes:
        if case.name not in cache:
            import tf_keras

            tf_keras.utils.set_random_seed(sum(map(ord, case.name)))
            cache[case.name] = convert(case.build(), case.low, case.high)
        return cache[case.name]
    return get


@pytest.fixture(scope="session")
def lib():
    return binding.library()


# ============================================================================= grids and inputs
def _checked(g: ir.Graph, case: Case) -> list[ir.Op]:
    found = [op for op in g.ops if op.attrs["tflite_op"] in case.ops]
    assert [op.attrs["tflite_op"] for op in found] == list(case.ops), \
        f"the converter produced {[op.attrs['tflite_op'] for op in g.ops]}"
    return found


def _quantized_tensors(data: bytes, g: ir.Graph, case: Case) -> list[int]:
    """TFLite tensor indices of the checked ops' operands (constants included) and outputs, LOGISTIC's and TANH's
    outputs left out (their quantization is fixed)."""
    fixed = {int(t) for op in g.ops if op.attrs["tflite_op"] in ("LOGISTIC", "TANH") for t in op.attrs["tflite_outputs"]}
    out: list[int] = []
    for op in _checked(g, case):
        for t in list(op.attrs["tflite_inputs"]) + list(op.attrs["tflite_outputs"]):
            if t >= 0 and t not in out and t not in fixed:
                out.append(int(t))
    return out


def variants(data: bytes, case: Case, n: int = GRID, seed: int = 0) -> list[tuple[str, bytes]]:
    """The model as converted, then ``n`` copies with the checked tensors' scales (x 2^[-2, 2]) and zero points
    ([-128, 127]) redrawn (a HARD_SWISH output scale above input scale / 128: TFLM refuses smaller ones); LEAKY_RELU
    walks its alpha grid."""
    g = from_tflite(data)
    rng = np.random.default_rng(seed + sum(map(ord, case.name)))
    out = [("converted", data)]
    alphas = list(case.alphas)
    for k in range(n + max(0, len(alphas) - n)):
        m = ts.load_model(data)
        sg = m.subgraphs[0]
        for t in _quantized_tensors(data, g, case):
            q = sg.tensors[t].quantization
            q.scale = np.asarray([np.float32(q.scale[0]) * np.float32(2.0 ** rng.uniform(-2, 2))], np.float32)
            q.zeroPoint = np.asarray([int(rng.integers(-128, 128))], np.int64)
        for op in sg.operators:
            name = ts.op_name(m, op)
            if name == "HARD_SWISH":
                s_in = float(sg.tensors[op.inputs[0]].quantization.scale[0])
                sg.tensors[op.outputs[0]].quantization.scale = np.asarray(
                    [s_in * 2.0 ** rng.uniform(-5.5, 1)], np.float32)
            if name == "LEAKY_RELU" and alphas:
                op.builtinOptions.alpha = float(alphas[k % len(alphas)])
        out.append((f"grid {k}", ts.write_model(m)))
    return out


def exhaustive_inputs(data: bytes) -> tuple[np.ndarray, ...]:
    """One sample: the first input of at least 256 pixels holds every int8 value along its pixels (in each channel),
    every other input every int8 value along its channels (at each pixel). With PAIRS-shaped operands (or a
    [1, 1, 1, 256] operand 2) every pair of values meets."""
    sg = ts.load_model(data).subgraphs[0]
    sample, by_pixel = [], True
    for t in sg.inputs:
        shape = tuple(int(d) for d in sg.tensors[t].shape)
        _, h, w, c = shape
        if by_pixel and h * w >= 256:
            values, by_pixel = (np.arange(h * w) % 256 - 128).reshape(1, h, w, 1), False
        else:
            values = (np.arange(c) % 256 - 128).reshape(1, 1, 1, c)
        sample.append(np.ascontiguousarray(np.broadcast_to(values, shape), np.int8))
    return tuple(sample)


# The three references and their Prepare arithmetic, which differs for two ops: TFLM at the pinned commit (what the
# firmware and the host runner build, what the kernels reproduce: tfmcu.kernels.quant) computes SUB's rescaling
# multipliers from float32 quotients, the tflite-micro wheel and TF Lite from double ones (ADD's arithmetic); TF Lite
# computes MUL's multiplier from a float32 product and quotient, TFLM from double ones. Each reference is matched bit
# for bit by the same C kernels given that reference's params.
REFERENCES = ("tflm", "wheel", "tflite")


def _operand_quant(model: Any, src_index: int) -> tuple[list[tuple[float, int]], str]:
    """(scale, zero point) of a two-operand op's inputs (a constant as input 2, as the builder takes it) and output,
    and its fused activation."""
    sg = model.subgraphs[0]
    t_op = sg.operators[src_index]
    ins = [int(t) for t in t_op.inputs if t >= 0]
    if ts.is_constant(model, sg.tensors[ins[0]]):
        ins = ins[::-1]
    q = [(float(sg.tensors[t].quantization.scale[0]), int(sg.tensors[t].quantization.zeroPoint[0]))
         for t in ins + [int(t_op.outputs[0])]]
    return q, ts.activation_name(t_op.builtinOptions.fusedActivationFunction)


def spec_for(model: Any, op: ir.Op, reference: str) -> ops.LayerSpec:
    """The op's LayerSpec with ``reference``'s Prepare arithmetic (REFERENCES)."""
    spec = ops.layer_spec(model, op)
    if reference == "tflm" or op.attrs["tflite_op"] not in ("SUB", "MUL"):
        return spec
    ((s1, z1), (s2, z2), (so, zo)), act = _operand_quant(model, op.src_index)
    if op.attrs["tflite_op"] == "SUB":  # ADD's double quotients
        params = quant.add_params(s1, z1, s2, z2, so, zo, act)
    elif reference == "tflite":  # MUL: float32 product and quotient
        m, shift = quant.quantize_multiplier(float(np.float32(s1) * np.float32(s2) / np.float32(so)))
        params = dict(spec.params, output_multiplier=m, output_shift=shift)
    else:
        return spec
    return ops.LayerSpec(spec.type, params, spec.arrays, spec.name, spec.src_index, spec.padding, spec.operand)


def run_chain(data: bytes, g: ir.Graph, sample: tuple[np.ndarray, ...], reference: str) -> list[np.ndarray]:
    """The model's outputs with every op run by its C kernel (``binding.call_kernel``) on the previous ones'
    outputs, with ``reference``'s params."""
    model = ts.load_model(data)
    values = dict(zip(g.inputs, sample))
    for op in g.ops:
        spec = spec_for(model, op, reference)
        out = np.zeros(g.tensors[op.outputs[0]].shape, np.int8)
        binding.call_kernel(spec, [values[t] for t in op.inputs], out, op.padding[0], op.padding[2])
        values[op.outputs[0]] = out
    return [values[t] for t in g.outputs]


def check_model(data: bytes, case: Case, where: str) -> dict[str, int]:
    """``data`` (every op a checked one) on an exhaustive and two random samples:

    * each checked op's C kernel on TF Lite's tensors (``binding.run_op``) == TF Lite's output tensor, wherever the
      op's Prepare arithmetic is the same in TF Lite and in TFLM (every op but MUL and SUB);
    * the C kernels run op after op (``run_chain``) == the model's outputs in TFLM built from the pinned sources
      (``tfmcu.runtime.tflm_host``), in the tflite-micro wheel and in TF Lite, each with its own params.
    Returns, per reference, the output elements where its params change the result (the pinned TFLM's as base)."""
    g = from_tflite(data, name=case.name)
    assert len(g.ops) == len(case.ops), "every op of the model is checked"
    samples = [exhaustive_inputs(data)] + random_inputs(data, 2, seed=5)
    outputs = {"tflm": run_whole(data, samples, case.name).outputs, "wheel": run_tflm(data, samples),
               "tflite": run_tflite(data, samples)}
    changed = dict.fromkeys(REFERENCES, 0)
    for n, sample in enumerate(samples):
        tensors = tflite_all_tensors(data, sample)
        for op in _checked(g, case):
            if op.attrs["tflite_op"] in ("SUB", "MUL"):
                continue
            index = op.attrs["tflite_tensor_index"]
            ref = tensors(index[op.outputs[0]])
            got = binding.run_op(data, [tensors(index[t]) for t in op.inputs], op.src_index, graph=g)
            diff = np.flatnonzero(got != ref)
            assert diff.size == 0, (f"{case.name} {where} sample {n} {op.describe()}: {diff.size} of {ref.size} "
                                    f"differ from TF Lite, first at {np.unravel_index(diff[0], ref.shape)}: "
                                    f"{got.flat[diff[0]]} vs {ref.flat[diff[0]]}")
        base = run_chain(data, g, sample, "tflm")
        for reference in REFERENCES:
            got = run_chain(data, g, sample, reference)
            for k, (a, b) in enumerate(zip(got, outputs[reference][n])):
                diff = np.flatnonzero(a != b)
                assert diff.size == 0, (f"{case.name} {where} sample {n}: output {k} differs from {reference} in "
                                        f"{diff.size} of {a.size} elements, first {a.flat[diff[0]]} vs "
                                        f"{b.flat[diff[0]]}")
                changed[reference] += int(np.count_nonzero(a != base[k]))
    return changed


# ============================================================================= the kernels against TFLite and TFLM
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eltwise_kernel_bit_exact_over_a_parameter_grid(case, models, lib):
    data = models(case)
    g = from_tflite(data, name=case.name)
    checked = _checked(g, case)
    specs = [ops.layer_spec(ts.load_model(data), op) for op in checked]
    assert all((s.operand is not None) == case.constant for s in specs), [s.operand for s in specs]
    for op in checked:  # what the IR says of them: patch by patch unless an activation is broadcast over space
        assert op.patchable == (not case.broadcast), (op.describe(), op.attrs)
    if case.broadcast:
        assert all(op.attrs["broadcast"] for op in checked)
    outputs, changed = [], dict.fromkeys(REFERENCES, 0)
    for where, variant in variants(data, case, case.grid):
        for reference, n in check_model(variant, case, where).items():
            changed[reference] += n
        outputs.append(run_tflm(variant, [exhaustive_inputs(variant)])[0][0])
    assert len({o.tobytes() for o in outputs}) == len(outputs), "two variants gave the same outputs"
    assert np.unique(outputs[0]).size > 8, "constant outputs prove nothing"
    # the grid reaches the inputs where the references' arithmetic differs, and only there
    assert {r for r, n in changed.items() if n} == set(case.differ), changed
    print(f"{case.name}: {len(outputs)} quantizations; output elements another reference's params change: {changed}")


def test_constant_operands_are_per_channel_input_2(models, lib):
    """The LayerSpec.operand contract: int8, shape [C] (a scalar repeated), the constant's values; params computed
    with the constant's quantization as input 2, also where TFLite has it as input 1 (ADD and MUL commute)."""
    data = models(CASES[[c.name for c in CASES].index("normalization")])
    m = ts.load_model(data)
    g = from_tflite(data)
    sub, mul = _checked(g, CASES[[c.name for c in CASES].index("normalization")])
    spec = ops.layer_spec(m, sub)
    const = ts.buffer_array(m, m.subgraphs[0].tensors[sub.attrs["tflite_inputs"][1]])
    assert spec.type == abi.OP_SUB and spec.operand.dtype == np.int8 and spec.operand.shape == (SHAPE[2],)
    assert np.array_equal(spec.operand, np.ravel(const))
    assert sub.inputs == [g.inputs[0]] and sub.attrs["constant_operands"] == 1 and sub.patchable
    # A scalar constant is repeated to every channel.
    data = models(CASES[[c.name for c in CASES].index("rescaling_255")])
    m = ts.load_model(data)
    (op,) = from_tflite(data).ops
    spec = ops.layer_spec(m, op)
    scalar = ts.buffer_array(m, m.subgraphs[0].tensors[op.attrs["tflite_inputs"][1]])
    assert spec.operand.shape == (SHAPE[2],) and np.all(spec.operand == np.ravel(scalar)[0])
    # The constant as TFLite's input 1 of a MUL: the same spec as with it as input 2.
    swapped = ts.load_model(data)
    t_op = swapped.subgraphs[0].operators[0]
    t_op.inputs = np.asarray(list(t_op.inputs)[::-1], np.int32)
    swapped_bytes = ts.write_model(swapped)
    spec2 = ops.layer_spec(ts.load_model(swapped_bytes), from_tflite(swapped_bytes).ops[0])
    assert spec2.params == spec.params and np.array_equal(spec2.operand, spec.operand)
    x = exhaustive_inputs(swapped_bytes)
    assert np.array_equal(binding.run_op(swapped_bytes, list(x), 0), run_tflite(swapped_bytes, [x])[0][0])
    assert np.array_equal(binding.run_op(swapped_bytes, list(x), 0), run_tflm(swapped_bytes, [x])[0][0])


# ============================================================================= LOGISTIC and TANH, every input
# Input scales (x zero points -128, 0, 127: every input - zero point in [-255, 255]): the kernel is TFLM's fixed
# point everywhere. TF Lite's float table agrees on every input at the scales of AGREE; at DIFFER it does not: exact
# powers of two up to 1/128 (LOGISTIC) or 1/256 (TANH) (round-half ties), LOGISTIC's input scales in [2, about 6.2],
# and from 8 on, where TFLM's input shift reaches 31 and its radius 0 (logistic.h, tanh.h, docs/limitations.md).
FIXEDPOINT_SCALES = {
    "LOGISTIC": {"agree": (2.0 ** -14 * 1.3, 0.001, 0.0079, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 1.96, 6.3, 7.86),
                 "differ": (2.0 ** -10, 2.0 ** -8, 2.0 ** -7, 2.0, 4.0, 5.0, 6.1, 8.0, 12.0, 16.0, 100.0)},
    "TANH": {"agree": (2.0 ** -14 * 1.3, 0.001, 0.004, 0.01, 0.05, 0.1, 0.3, 0.8, 1.0, 2.0, 4.0, 6.0, 7.86),
             "differ": (2.0 ** -10, 2.0 ** -8, 8.0, 12.0, 16.0, 100.0)},
}


@pytest.mark.parametrize("builtin", ["LOGISTIC", "TANH"])
def test_logistic_and_tanh_every_input_against_tflm_and_tflite(builtin, models, lib):
    case = CASES[[c.name for c in CASES].index("sigmoid" if builtin == "LOGISTIC" else "tanh")]
    data = models(case)
    x = exhaustive_inputs(data)
    assert np.array_equal(np.sort(x[0][..., 0].reshape(-1)), np.arange(-128, 128))
    for kind, scales in FIXEDPOINT_SCALES[builtin].items():
        for scale in scales:
            differ = 0
            for zp in (-128, 0, 127):
                m = ts.load_model(data)
                q = m.subgraphs[0].tensors[m.subgraphs[0].inputs[0]].quantization
                q.scale, q.zeroPoint = np.asarray([scale], np.float32), np.asarray([zp], np.int64)
                variant = ts.write_model(m)
                got = binding.run_op(variant, list(x), 0)
                assert np.array_equal(got, run_whole(variant, [x]).outputs[0][0]), (builtin, scale, zp)
                assert np.array_equal(got, run_tflm(variant, [x])[0][0]), (builtin, scale, zp)
                differ += int(np.count_nonzero(got != run_tflite(variant, [x])[0][0]))
            assert (differ == 0) == (kind == "agree"), (builtin, scale, kind, differ)
    # From an input scale of 8 on, TFLM's shift is 31 or more and every input saturates (the radius is 0); the
    # params keep TFLM's shift.
    p = quant.logistic_params(16.0, 0)
    assert (p["input_left_shift"], p["input_range_radius"]) == (32, 0)
    assert quant.logistic_params(1.0 / 16, 0)["input_range_radius"] == 15 * 2 ** 27 >> 24


# ============================================================================= calls through a table
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "hard_swish", "leaky_relu"])
def test_calls_through_a_table_equal_calls_element_by_element(name, models, lib):
    """A call of at least abi.LUT_MIN_ELEMENTS elements maps them through a table of the op's 256 values (tfmcu_lut.h):
    on every int8 input, over the parameter grid, it equals calls too small for a table (one pixel row each), and a
    call run in place (the output over its input) equals both; rows of a multiple of 4 elements and not."""
    case = CASES[[c.name for c in CASES].index(name)]
    h, w, c = SHAPE
    assert h * w * c >= abi.LUT_MIN_ELEMENTS > w * c  # the whole map through a table, a row element by element
    seen = set()
    for where, variant in variants(models(case), case, case.grid):
        g = from_tflite(variant, name=case.name)
        [op] = _checked(g, case)
        spec = ops.layer_spec(ts.load_model(variant), op)
        full = exhaustive_inputs(variant)[0]
        for x in (full, np.ascontiguousarray(full[:, :, :15, :7]), np.ascontiguousarray(full[:, :, :13, :5])):
            assert x.size >= abi.LUT_MIN_ELEMENTS > x.shape[2] * x.shape[3]
            whole = np.zeros(x.shape, np.int8)
            binding.call_kernel(spec, [x], whole)
            rows = np.zeros(x.shape, np.int8)
            for y in range(x.shape[1]):
                out = np.zeros((1, 1) + x.shape[2:], np.int8)
                binding.call_kernel(spec, [np.ascontiguousarray(x[:, y:y + 1])], out)
                rows[:, y:y + 1] = out
            assert np.array_equal(whole, rows), (name, where, x.shape, int(np.count_nonzero(whole != rows)))
            buf = x.copy()
            binding.call_kernel(spec, [buf], buf)  # (the same contiguous array: the views alias)
            assert np.array_equal(buf, whole), (name, where, x.shape, "in place")
            seen.add(whole.tobytes())
    assert len(seen) > 3, "the grid changed nothing"


@pytest.mark.parametrize("name", ["rescaling_127_5", "rescaling_255", "normalization", "hard_sigmoid"])
def test_constant_operand_calls_through_tables_equal_calls_element_by_element(name, models, lib):
    """ADD, SUB and MUL with a one-pixel operand 2 map a call through one table (every channel's value the same: a
    scalar constant) or one per channel (at most TFMCU_LUT_MAX_CHANNELS channels) when it is large enough
    (tfmcu_lut.h): over the parameter grid, on every int8 input, equal to calls one pixel row each (too small for a
    table); with all the channels, and with 3 of them (their constants), in place too."""
    import dataclasses

    case = CASES[[c.name for c in CASES].index(name)]
    for where, variant in variants(models(case), case, 3):
        g = from_tflite(variant, name=case.name)
        model = ts.load_model(variant)
        for op in _checked(g, case):
            spec = ops.layer_spec(model, op)
            full = np.ascontiguousarray(np.concatenate([exhaustive_inputs(variant)[0]] * 3, axis=1))
            for c in (full.shape[3], 3):
                x = np.ascontiguousarray(full[..., :c])
                s = dataclasses.replace(spec, operand=np.ascontiguousarray(spec.operand[:c]))
                whole = np.zeros(x.shape, np.int8)
                binding.call_kernel(s, [x], whole)
                rows = np.zeros(x.shape, np.int8)
                for y in range(x.shape[1]):
                    out = np.zeros((1, 1) + x.shape[2:], np.int8)
                    binding.call_kernel(s, [np.ascontiguousarray(x[:, y:y + 1])], out)
                    rows[:, y:y + 1] = out
                assert x.shape[2] * c < abi.LUT_MIN_ELEMENTS and x.size >= 3 * abi.LUT_MIN_ELEMENTS
                assert np.array_equal(whole, rows), (name, where, op.describe(), c)
                buf = x.copy()
                binding.call_kernel(s, [buf], buf)
                assert np.array_equal(buf, whole), (name, where, op.describe(), c, "in place")


# ============================================================================= SUB is not ADD with a negated multiplier
def _pairs() -> tuple[np.ndarray, np.ndarray]:
    """Two PAIRS-shaped int8 operands holding every pair of values (operand 1 by pixel, operand 2 by channel)."""
    a = np.broadcast_to((np.arange(256) - 128).reshape(1, 16, 16, 1), (1, *PAIRS))
    b = np.broadcast_to((np.arange(256) - 128).reshape(1, 1, 1, 256), (1, *PAIRS))
    return np.ascontiguousarray(a, np.int8), np.ascontiguousarray(b, np.int8)


def _negated_add(params: dict[str, int]) -> ops.LayerSpec:
    """ADD with SUB's params and input 2's multiplier negated."""
    return ops.LayerSpec(abi.OP_ADD, dict(params, input2_multiplier=-params["input2_multiplier"]), {}, "add", 0)


def _tie_scales() -> tuple[float, float, float]:
    """Scales (s1, s2, s_out), zero points 0, for which ADD with input 2's multiplier negated gives another output
    than SUB for some pair of inputs (seeded search): gemmlowp's SaturatingRoundingDoublingHighMul rounds an exact
    half towards +infinity, so SRDHM(x, -m) = -SRDHM(x, m) - 1 where x * m / 2^31 ends in exactly one half."""
    a, b = _pairs()
    rng = np.random.default_rng(7)
    for _ in range(2000):
        s1, s2, so = (float(np.float32(v)) for v in rng.uniform((0.01, 0.005, 0.01), (0.1, 0.05, 0.2)))
        p = quant.sub_params(s1, 0, s2, 0, so, 0, "none")
        ties = [v for v in range(-128, 128)  # zero point 0: input 2 itself
                if quant.multiply_by_quantized_multiplier(v << 20, -p["input2_multiplier"], p["input2_shift"])
                != -quant.multiply_by_quantized_multiplier(v << 20, p["input2_multiplier"], p["input2_shift"])]
        if not ties:
            continue
        sub, add = np.zeros_like(a), np.zeros_like(a)
        binding.call_kernel(ops.LayerSpec(abi.OP_SUB, p, {}, "sub", 0), [a, b], sub)
        binding.call_kernel(_negated_add(p), [a, b], add)
        if np.any(sub != add):
            return s1, s2, so
    raise AssertionError("no scales found")


def test_sub_is_not_add_with_the_multiplier_negated(models, lib):
    s1, s2, so = _tie_scales()
    data = models(CASES[[c.name for c in CASES].index("sub")])
    m = ts.load_model(data)
    sg = m.subgraphs[0]
    (t_op,) = sg.operators
    for t, scale in zip(list(t_op.inputs) + list(t_op.outputs), (s1, s2, so)):
        sg.tensors[t].quantization.scale = np.asarray([scale], np.float32)
        sg.tensors[t].quantization.zeroPoint = np.asarray([0], np.int64)
    variant = ts.write_model(m)
    g = from_tflite(variant)
    operands = _pairs()
    x = tuple(operands[g.ops[0].inputs.index(t)] for t in g.inputs)  # the model's inputs in its order
    got = binding.run_op(variant, list(operands), 0, graph=g)
    assert np.array_equal(got, run_whole(variant, [x]).outputs[0][0])  # TFLM at the pinned commit
    assert np.array_equal(run_chain(variant, g, x, "wheel")[0], run_tflm(variant, [x])[0][0])
    assert np.array_equal(run_chain(variant, g, x, "tflite")[0], run_tflite(variant, [x])[0][0])
    spec = ops.layer_spec(ts.load_model(variant), g.ops[0])
    as_add = np.zeros_like(got)
    binding.call_kernel(_negated_add(spec.params), list(operands), as_add)
    assert np.count_nonzero(as_add != got) > 0, "the negated ADD would have been exact here"
    # SUB's multipliers are TFLM's float32 quotients, not ADD's double ones (they differ for most scales).
    assert any(quant.sub_params(a, 0, b, 0, 0.1, 0, "none") != quant.add_params(a, 0, b, 0, 0.1, 0, "none")
               for a, b in np.random.default_rng(3).uniform(0.001, 0.2, (200, 2)))


# ============================================================================= refusals, one line each
def _edited(data: bytes, edit: Callable[[Any], None]) -> bytes:
    m = ts.load_model(data)
    edit(m)
    return ts.write_model(m)


def _refusal(data: bytes, op_name: str) -> str:
    g = from_tflite(data)
    op = next(o for o in g.ops if o.attrs["tflite_op"] == op_name)
    with pytest.raises(kernels.PatchKernelError) as e:
        ops.layer_spec(ts.load_model(data), op)
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_builders_refuse_what_the_kernels_do_not_run(models):
    def case(name: str) -> bytes:
        return models(CASES[[c.name for c in CASES].index(name)])

    def int16(m: Any) -> None:
        m.subgraphs[0].tensors[m.subgraphs[0].operators[0].inputs[0]].type = ts.TensorType.INT16

    assert "is int16, the C kernels take int8" in _refusal(_edited(case("hard_swish"), int16), "HARD_SWISH")
    assert "is int16" in _refusal(_edited(case("mul"), int16), "MUL")

    def swap(m: Any) -> None:
        op = m.subgraphs[0].operators[0]
        op.inputs = np.asarray(list(op.inputs)[::-1], np.int32)

    assert "only input 2 may be broadcast" in _refusal(_edited(case("mul_squeeze_excite"), swap), "MUL")
    assert "constant minus an activation" in _refusal(_edited(case("normalization"), swap), "SUB")

    def row_broadcast(m: Any) -> None:  # input 2 [1, 1, W, C]: broadcast over rows only
        sg = m.subgraphs[0]
        t = sg.tensors[sg.operators[0].inputs[1]]
        t.shape = np.asarray([1, 1, PAIRS[1], PAIRS[2]], np.int32)
        t.shapeSignature = None

    assert "broadcast other than per channel" in _refusal(_edited(case("mul"), row_broadcast), "MUL")

    def spatial_constant(m: Any) -> None:  # the constant as a whole feature map
        sg = m.subgraphs[0]
        t = sg.tensors[sg.operators[0].inputs[1]]
        t.shape = np.asarray([1, 2, 1, SHAPE[2] // 2], np.int32)

    text = _refusal(_edited(case("normalization"), spatial_constant), "SUB")
    assert "only a scalar or one value per channel" in text
    assert not from_tflite(_edited(case("normalization"), spatial_constant)).ops[0].patchable

    def fused_tanh(m: Any) -> None:
        m.subgraphs[0].operators[0].builtinOptions.fusedActivationFunction = ts.schema.ActivationFunctionType.TANH

    assert "fused activation 'tanh' is not supported" in _refusal(_edited(case("mul"), fused_tanh), "MUL")

    def output_scale(m: Any) -> None:
        sg = m.subgraphs[0]
        sg.tensors[sg.operators[0].outputs[0]].quantization.scale = np.asarray([0.01], np.float32)

    assert "the int8 kernel writes scale 0.00390625 zero point -128" in _refusal(
        _edited(case("sigmoid"), output_scale), "LOGISTIC")
    assert "writes scale 0.0078125 zero point 0" in _refusal(_edited(case("tanh"), output_scale), "TANH")

    def big_output_multiplier(m: Any) -> None:  # input scale > 128 x output scale: TFLM's Prepare fails
        sg = m.subgraphs[0]
        sg.tensors[sg.operators[0].outputs[0]].quantization.scale = np.asarray([1e-5], np.float32)

    assert "TFLM refuses it" in _refusal(_edited(case("hard_swish"), big_output_multiplier), "HARD_SWISH")


# ============================================================================= patch by patch
def _eltwise_stage_model() -> Any:
    import tf_keras
    from tf_keras import layers as L

    tf_keras.utils.set_random_seed(5)
    i = tf_keras.Input((20, 18, 3))
    x = L.Conv2D(8, 3, padding="same")(i)
    x = _hard_swish(x)
    y = _swish(L.DepthwiseConv2D(3, padding="same")(x))
    y = L.LeakyReLU(0.2)(L.Conv2D(8, 1)(y))
    z = L.Activation("tanh")(L.Subtract()([y, x]))
    z = L.Multiply()([z, L.Activation("sigmoid")(L.Conv2D(8, 1)(x))])
    z = L.Conv2D(4, 3, padding="same")(z)
    return tf_keras.Model(i, L.Dense(3)(L.GlobalAveragePooling2D()(z)))


@pytest.mark.parametrize("grid", [2, (3, 2), 4])
def test_stage_runs_the_eltwise_ops_patch_by_patch(grid, lib):
    """A stage of convolutions and every one-input op, swish, MUL and SUB of two activations: the executor runs them
    from the op table like any pointwise op, bit-exact with TF Lite; scratch touched == planned."""
    data = convert(_eltwise_stage_model(), -1.0, 1.0)
    g = from_tflite(data)
    s = scheduler.schedule(g, grid, n_ops=scheduler.largest_prefix(g))  # up to the global pool
    p = pack.pack_stage(data, g, s)
    kinds = [ops.OP_NAMES[layer.type] for layer in p.layers]
    assert {"HARD_SWISH", "LOGISTIC", "MUL", "LEAKY_RELU", "SUB", "TANH"} <= set(kinds), kinds
    assert kinds[-1] == "CONV_2D"
    for n, (x,) in enumerate(random_inputs(data, 2, seed=3)):
        ref = tflite_all_tensors(data, (x,))(p.tensor_tflite_index[p.output_tensor])
        assert np.array_equal(binding.run_stage(p, x), ref), f"sample {n}"
    touched, _ = binding.touched_scratch(p, x)
    assert touched == p.scratch_bytes == binding.c_scratch_bytes(p)
    # ... and as the TFMCU_PATCH_STAGE op of a custom-mode model (the rest planned in place) in TFLM built from the
    # pinned sources: the original model's outputs
    model = custom.rewrite_custom(data, g, s, "eltwise", inplace=True).model
    inputs = random_inputs(data, 2, seed=4)
    got, want = run_whole(model, inputs).outputs, run_whole(data, inputs).outputs
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, want))


def test_constant_operands_run_in_a_stage(models):
    """A stage with constant-operand ops (a Rescaling's MUL and ADD by constants) holds each operand as a constant
    tensor of the stage blob, read as a 1 x 1 x C input 2: bit-exact with TF Lite patch by patch."""
    data = models(CASES[[c.name for c in CASES].index("rescaling_127_5")])
    g = from_tflite(data)
    assert scheduler.largest_prefix(g) == len(g.ops)  # patchable in the IR
    for grid in (2, (3, 1)):
        s = scheduler.schedule(g, grid, n_ops=len(g.ops) - 1)
        p = pack.pack_stage(data, g, s)
        assert p.tensor_data  # the operands, in the blob's constants
        for x in random_inputs(data, 2, seed=8):
            want = tflite_all_tensors(data, x)(p.tensor_tflite_index[p.output_tensor])
            got = binding.run_stage(p, x[0])
            assert np.array_equal(got, want.reshape(got.shape))
