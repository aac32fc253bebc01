"""C patch kernels (tflm_patch_kernels/, through tfmcu.kernels): bit-exact with TFLite's reference kernels.

* Each kernel alone (``patch_kernels.run_op``) on single-op int8 models converted here: CONV_2D k1/3/5/7, s1/s2,
  SAME/VALID, dilation, groups, per-channel and per-tensor, none/relu/relu6/relu_n1_to_1; DEPTHWISE_CONV_2D incl.
  depth multiplier 2 and dilation; ADD with different scales and fused ReLU; PAD and PADV2; AVERAGE_POOL_2D and
  MAX_POOL_2D (SAME borders); QUANTIZE float -> int8 incl. rounding ties. Reference: the op's output tensor in
  ``tf.lite.Interpreter`` with the reference kernels (``experimental_preserve_all_tensors``), and TFLM for the model
  output.
* The stage executor on zoo models' patch stages and on a stage that holds every kernel, several grids incl.
  rectangular ones, vs the stage-output tensor of the full model in TFLite; scratch poisoned: the highest byte
  touched == the predicted scratch size == the C library's == the scheduler's analytic patch working set.
* An ASan + UBSan build of the library running C stages emitted by ``stage_to_c`` (exact-size heap buffers);
  ``-Wall -Wextra -Werror`` host and arm-none-eabi builds; the build cache; validation of broken descriptions.

The slow zoo models (keras_mobilenet_v2, MobileNetV2-1.0-224 4x4 over 5 blocks) run too: ``make test`` has the time.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfmcu import abi, kernels  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.kernels import binding, codegen, ops, pack, quant  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan import halo  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflite import tflite_all_tensors  # noqa: E402
from tfmcu.runtime.tflm import run_tflm  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

ARM_FLAGS = ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"]
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-Wshadow", "-Wconversion"]


# ============================================================================= helpers


def convert(model: Any, per_tensor: bool = False, float_io: bool = False) -> bytes:
    from tfmcu.nets.convert import random_representative, to_int8_tflite

    return to_int8_tflite(model, random_representative(tuple(model.input_shape[1:]), samples=3),
                          float_io=float_io, per_tensor=per_tensor)


def set_dilation(data: bytes, dilation: int, ops: tuple[str, ...] = ("CONV_2D", "DEPTHWISE_CONV_2D")) -> bytes:
    """The model with ``dilation`` on its convolutions and their output shapes recomputed (TF's converter turns
    dilated convs into SPACE_TO_BATCH_ND + conv, so dilated CONV_2D ops are made by editing the flatbuffer)."""
    m = ts.load_model(data)
    sg = m.subgraphs[0]
    for op in sg.operators:
        if ts.op_name(m, op) not in ops:
            continue
        o = op.builtinOptions
        o.dilationHFactor = o.dilationWFactor = dilation
        _, h, w, _ = (int(d) for d in sg.tensors[op.inputs[0]].shape)
        kh, kw = (int(d) for d in sg.tensors[op.inputs[1]].shape[1:3])
        out = sg.tensors[op.outputs[0]]
        dims = []
        for size, k, s in ((h, kh, o.strideH), (w, kw, o.strideW)):
            eff = (k - 1) * dilation + 1
            dims.append(-(-size // s) if o.padding == ts.Padding.SAME else (size - eff) // s + 1)
        out.shape = np.asarray([1, dims[0], dims[1], int(out.shape[3])], np.int32)
        out.shapeSignature = None
    return ts.write_model(m)


@pytest.fixture(scope="session")
def lib():
    return binding.library()


# ============================================================================= offline quantization math
def test_quantize_multiplier_matches_tflite_rules():
    assert quant.quantize_multiplier(0.0) == (0, 0)
    assert quant.quantize_multiplier(0.5) == (1 << 30, 0)
    assert quant.quantize_multiplier(1.0) == (1 << 30, 1)
    assert quant.quantize_multiplier(0.75) == (3 << 29, 0)
    # A mantissa that rounds up to 2^31 is halved and the shift incremented.
    assert quant.quantize_multiplier(1.0 - 2.0 ** -40) == (1 << 30, 1)
    # Rounding of the Q31 mantissa is half away from zero (std::round), also for negative multipliers.
    assert quant.quantize_multiplier(0.5 + 2.0 ** -32) == ((1 << 30) + 1, 0)
    assert quant.quantize_multiplier(-(0.5 + 2.0 ** -32)) == (-((1 << 30) + 1), 0)
    # Shifts below -31 flush to zero; -31 itself is kept.
    assert quant.quantize_multiplier(2.0 ** -33) == (0, 0)
    assert quant.quantize_multiplier(2.0 ** -32) == (1 << 30, -31)
    rng = np.random.default_rng(0)
    for x in rng.uniform(1e-6, 4.0, 200):
        m, s = quant.quantize_multiplier(float(x))
        assert (1 << 30) <= m < (1 << 31)
        assert abs(m * 2.0 ** (s - 31) - x) <= x * 2.0 ** -30


def test_activation_ranges():
    assert quant.activation_range("none", 0.1, 3) == (-128, 127)
    assert quant.activation_range("relu", 0.1, -5) == (-5, 127)
    # 6 / 0.05 = 120 (float32) -> 120 + (-100) = 20.
    assert quant.activation_range("relu6", 0.05, -100) == (-100, 20)
    assert quant.activation_range("relu6", 0.01, -128) == (-128, 127)
    assert quant.activation_range("relu_n1_to_1", 0.25, 0) == (-4, 4)
    with pytest.raises(kernels.PatchKernelError, match="tanh"):
        quant.activation_range("tanh", 0.1, 0)


# ============================================================================= kernels alone
@dataclass
class KernelCase:
    name: str
    build: Callable[[], Any]  # -> tf_keras.Model
    ops: tuple[str, ...]  # TFLite ops to check with their C kernel
    per_tensor: bool = False
    float_io: bool = False
    dilation: int = 1
    shape: tuple[int, int, int] = (13, 11, 6)
    expect: dict[str, Any] = field(default_factory=dict)  # IR attributes the checked op must have


def _model(name: str, shape: tuple[int, int, int], body: Callable[[Any], Any]) -> Callable[[], Any]:
    def make() -> Any:
        import tf_keras

        tf_keras.utils.set_random_seed(sum(map(ord, name)))
        i = tf_keras.Input(shape)
        return tf_keras.Model(i, body(i), name=name)
    return make


def _conv(filters: int, k: int, s: int = 1, padding: str = "same", act: Any = None, **kw: Any):
    def f(x: Any) -> Any:
        from tf_keras import layers

        return layers.Conv2D(filters, k, s, padding=padding, activation=act, **kw)(x)
    return f


def _dw(k: int, s: int = 1, padding: str = "same", act: Any = None, **kw: Any):
    def f(x: Any) -> Any:
        from tf_keras import layers

        return layers.DepthwiseConv2D(k, s, padding=padding, activation=act, **kw)(x)
    return f


def _relu_n1_to_1(x: Any) -> Any:
    import tensorflow as tf

    return tf.clip_by_value(x, -1.0, 1.0)


def _add_scales(x: Any) -> Any:
    from tf_keras import layers

    a = layers.Conv2D(8, 1)(x)  # small range
    b = layers.Conv2D(8, 3, padding="same")(layers.Lambda(lambda t: 4.0 * t)(x))  # larger range
    return layers.Add()([a, b])


def _add_relu(x: Any) -> Any:
    from tf_keras import layers

    return layers.ReLU()(layers.Add()([layers.Conv2D(8, 1)(x), layers.Conv2D(8, 3, padding="same")(x)]))


def _pad(x: Any) -> Any:
    from tf_keras import layers

    return layers.ZeroPadding2D(((1, 2), (3, 0)))(layers.Conv2D(4, 1)(x))


def _padv2(x: Any) -> Any:
    import tensorflow as tf
    from tf_keras import layers

    y = layers.Conv2D(4, 1)(x)
    return layers.Lambda(lambda t: tf.pad(t, [[0, 0], [2, 1], [0, 3], [0, 0]], constant_values=0.25))(y)


def _pools(kind: str, k: int, s: int, padding: str):
    def f(x: Any) -> Any:
        from tf_keras import layers

        pool = layers.AveragePooling2D if kind == "avg" else layers.MaxPooling2D
        return pool(k, s, padding=padding)(layers.Conv2D(8, 1)(x))
    return f


KERNEL_CASES = [
    KernelCase("conv_k1_s1_valid", _model("conv_k1_s1_valid", (13, 11, 6), _conv(8, 1, padding="valid")),
               ("CONV_2D",), expect={"kernel": (1, 1)}),
    KernelCase("conv_k3_s1_same_relu", _model("conv_k3_s1_same_relu", (13, 11, 6), _conv(8, 3, act="relu")),
               ("CONV_2D",), expect={"activation": "relu"}),
    KernelCase("conv_k3_s2_same_relu6", _model("conv_k3_s2_same_relu6", (13, 11, 6), _conv(8, 3, 2, act="relu6")),
               ("CONV_2D",), expect={"activation": "relu6", "stride": (2, 2)}),
    KernelCase("conv_k5_s2_valid", _model("conv_k5_s2_valid", (13, 11, 6), _conv(8, 5, 2, padding="valid")),
               ("CONV_2D",), expect={"kernel": (5, 5)}),
    KernelCase("conv_k5_s1_same_per_tensor", _model("conv_k5_s1_same_pt", (13, 11, 6), _conv(8, 5, act="relu6")),
               ("CONV_2D",), per_tensor=True, expect={"weight_scales": 1}),
    KernelCase("conv_k7_s2_same_relu", _model("conv_k7_s2_same_relu", (14, 15, 3), _conv(8, 7, 2, act="relu")),
               ("CONV_2D",), shape=(14, 15, 3), expect={"kernel": (7, 7)}),
    KernelCase("conv_k7_s1_valid_per_tensor", _model("conv_k7_s1_valid_pt", (13, 11, 6), _conv(4, 7, 1, "valid")),
               ("CONV_2D",), per_tensor=True),
    KernelCase("conv_k3_dilation2_same", _model("conv_k3_d2_same", (13, 11, 6), _conv(8, 3, act="relu6")),
               ("CONV_2D",), dilation=2, expect={"dilation": (2, 2)}),
    KernelCase("conv_k3_s2_dilation2_valid", _model("conv_k3_s2_d2_valid", (13, 11, 6), _conv(8, 3, 2, "valid")),
               ("CONV_2D",), dilation=2, expect={"dilation": (2, 2)}),
    KernelCase("conv_k3_groups2", _model("conv_k3_groups2", (13, 11, 6), _conv(8, 3, groups=2)),
               ("CONV_2D",), expect={"groups": 2}),
    KernelCase("conv_k3_no_bias_relu_n1_to_1",
               _model("conv_k3_nobias", (13, 11, 6), _conv(8, 3, act=_relu_n1_to_1, use_bias=False)),
               ("CONV_2D",), expect={"activation": "relu_n1_to_1"}),
    KernelCase("dw_k3_s1_same_relu6", _model("dw_k3_s1_same_relu6", (13, 11, 6), _dw(3, act="relu6")),
               ("DEPTHWISE_CONV_2D",)),
    KernelCase("dw_k5_s2_same_relu", _model("dw_k5_s2_same_relu", (13, 11, 6), _dw(5, 2, act="relu")),
               ("DEPTHWISE_CONV_2D",), expect={"kernel": (5, 5), "stride": (2, 2)}),
    KernelCase("dw_k7_s1_same_per_tensor", _model("dw_k7_s1_same_pt", (13, 11, 6), _dw(7)),
               ("DEPTHWISE_CONV_2D",), per_tensor=True, expect={"weight_scales": 1}),
    KernelCase("dw_k3_s2_valid_multiplier2", _model("dw_k3_s2_valid_m2", (13, 11, 6), _dw(3, 2, "valid",
                                                                                            depth_multiplier=2)),
               ("DEPTHWISE_CONV_2D",), expect={"out_channels": 12}),
    KernelCase("dw_k3_dilation2_same", _model("dw_k3_d2_same", (13, 11, 6), _dw(3, act="relu6")),
               ("DEPTHWISE_CONV_2D",), dilation=2, expect={"dilation": (2, 2)}),
    KernelCase("add_different_scales", _model("add_scales", (13, 11, 6), _add_scales), ("ADD", "CONV_2D")),
    KernelCase("add_relu", _model("add_relu", (13, 11, 6), _add_relu), ("ADD",), expect={"activation": "relu"}),
    KernelCase("pad", _model("pad", (13, 11, 6), _pad), ("PAD",), expect={"padding": (1, 2, 3, 0)}),
    KernelCase("padv2_constant", _model("padv2", (13, 11, 6), _padv2), ("PADV2",), expect={"padding": (2, 1, 0, 3)}),
    KernelCase("avg_pool_k3_s2_same", _model("avg_k3_s2_same", (13, 11, 6), _pools("avg", 3, 2, "same")),
               ("AVERAGE_POOL_2D",), expect={"padding": (1, 1, 1, 1)}),
    KernelCase("avg_pool_k3_s1_same", _model("avg_k3_s1_same", (13, 11, 6), _pools("avg", 3, 1, "same")),
               ("AVERAGE_POOL_2D",)),
    KernelCase("avg_pool_k2_s2_valid", _model("avg_k2_s2_valid", (13, 11, 6), _pools("avg", 2, 2, "valid")),
               ("AVERAGE_POOL_2D",)),
    KernelCase("max_pool_k3_s2_same", _model("max_k3_s2_same", (13, 11, 6), _pools("max", 3, 2, "same")),
               ("MAX_POOL_2D",), expect={"padding": (1, 1, 1, 1)}),
    KernelCase("max_pool_k2_s1_valid", _model("max_k2_s1_valid", (13, 11, 6), _pools("max", 2, 1, "valid")),
               ("MAX_POOL_2D",)),
    KernelCase("quantize_float_input", _model("quantize", (13, 11, 6), _conv(4, 3)), ("QUANTIZE",),
               float_io=True),
]


@pytest.fixture(scope="session")
def kernel_models() -> Callable[[KernelCase], bytes]:
    cache: dict[str, bytes] = {}

    def get(case: KernelCase) -> bytes:
        if case.name not in cache:
            data = convert(case.build(), per_tensor=case.per_tensor, float_io=case.float_io)
            cache[case.name] = set_dilation(data, case.dilation) if case.dilation > 1 else data
        return cache[case.name]
    return get


def _quantize_samples(data: bytes, n: int) -> list[tuple[np.ndarray, ...]]:
    """Random float inputs plus values exactly half-way between quantization steps and far out of the int8 range
    (but with |x / scale| < 2^31: beyond that TFLite's float -> int32 cast is undefined behaviour, see
    test_quantize_saturates)."""
    samples = random_inputs(data, n, seed=4)
    m = ts.load_model(data)
    sg = m.subgraphs[0]
    q = next(op for op in sg.operators if ts.op_name(m, op) == "QUANTIZE")
    scale = float(np.float32(sg.tensors[q.outputs[0]].quantization.scale[0]))
    x = samples[0][0].copy().reshape(-1)
    k = np.arange(x.size) % 300 - 150
    x[: x.size // 2] = ((k + 0.5) * scale).astype(np.float32)[: x.size // 2]
    x[:4] = np.float32([5000 * scale, -5000 * scale, 0.0, -0.0])
    return samples + [(x.reshape(samples[0][0].shape),)]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.name)
def test_kernel_bit_exact_with_tflite(case, kernel_models, lib):
    data = kernel_models(case)
    g = from_tflite(data, name=case.name)
    targets = [op for op in g.ops if op.attrs["tflite_op"] in case.ops]
    assert targets, f"the converter produced {[op.attrs['tflite_op'] for op in g.ops]}"
    for attr, want in case.expect.items():
        got = getattr(targets[-1], attr) if hasattr(targets[-1], attr) else targets[-1].attrs.get(attr)
        assert got == want, f"{attr}: {got} != {want} (the model does not test what it claims)"
    samples = _quantize_samples(data, 3) if case.float_io else random_inputs(data, 3, seed=2)
    micro = run_tflm(data, samples)
    for n, sample in enumerate(samples):
        tensors = tflite_all_tensors(data, sample)
        for op in targets:
            index = op.attrs["tflite_tensor_index"]
            ins = [tensors(index[t]) for t in op.inputs]
            ref = tensors(index[op.outputs[0]])
            got = binding.run_op(data, ins, op.src_index, graph=g)
            assert got.shape == ref.shape
            diff = np.flatnonzero(got != ref)
            assert diff.size == 0, (f"{op.describe()} sample {n}: {diff.size} of {ref.size} values differ, first "
                                    f"at {np.unravel_index(diff[0], ref.shape)}: {got.flat[diff[0]]} vs "
                                    f"{ref.flat[diff[0]]}")
            assert np.unique(ref).size > 4, "constant outputs prove nothing"
            if op.outputs[0] in g.outputs and ref.dtype == np.int8:
                assert np.array_equal(micro[n][0], got), "TFLM disagrees"


def test_quantize_saturates(lib):
    """Out-of-range and non-finite floats: saturation (what Cortex-M's VCVT gives TFLM); NaN -> zero point. TFLite
    on x86 casts |x / scale| >= 2^31 to INT32_MIN (undefined behaviour in C++), i.e. -128 even for +1e9."""
    spec = ops.LayerSpec(ops.OP_QUANTIZE, dict(scale=0.05, zero_point=-3), {}, "q", 0)
    x = np.float32([1e9, -1e9, np.inf, -np.inf, np.nan, 0.025, -0.025, 0.075, 6.2, -6.5]).reshape(1, 1, 10, 1)
    out = np.zeros(x.shape, np.int8)
    binding.call_kernel(spec, [x], out)
    # In float32: 0.025 / 0.05 = 0.5 -> 1 (half away from zero), -0.5 -> -1, 0.075 / 0.05 = 1.5 -> 2,
    # 6.2 / 0.05 = 123.99999 -> 124.
    assert out.reshape(-1).tolist() == [127, -128, 127, -128, -3, -2, -4, -1, 121, -128]


def test_kernels_report_bad_shapes(lib):
    out = np.zeros((1, 4, 4, 8), np.int8)
    spec = ops.LayerSpec(ops.OP_CONV, dict(kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, dilation_h=1, dilation_w=1,
                                         groups=3, input_offset=0, output_offset=0, act_min=-128, act_max=127),
                        dict(filter=np.zeros((8, 1, 1, 2), np.int8), bias=None,
                             output_multiplier=np.full(8, 1 << 30, np.int32), output_shift=np.zeros(8, np.int32)),
                        "bad", 0)
    with pytest.raises(kernels.PatchKernelError, match="shape mismatch"):
        binding.call_kernel(spec, [np.zeros((1, 4, 4, 6), np.int8)], out)  # 8 output channels not divisible by 3
    pool = ops.LayerSpec(ops.OP_AVG_POOL, dict(filter_h=2, filter_w=2, stride_h=1, stride_w=1, act_min=-128,
                                             act_max=127), {}, "pool", 0)
    with pytest.raises(kernels.PatchKernelError, match="without input pixels"):
        binding.call_kernel(pool, [np.zeros((1, 4, 4, 8), np.int8)], out, pad_top=3)


# ============================================================================= the stage executor
@dataclass
class StageModel:
    name: str
    data: bytes
    n_blocks: int | None
    n_ops: int | None


ZOO_DEFAULT = ["tiny_per_tensor", "tiny_float_input", "kernels_symmetric", "resnet_like", "keras_mobilenet_v1",
               "mbv2_035_96"]
ZOO_FULL = ["keras_mobilenet_v2", "mbv2_100_224"]
GRIDS = {"tiny_per_tensor": [2, (3, 1)], "tiny_float_input": [3, (1, 2)], "kernels_symmetric": [2, (2, 3)],
         "resnet_like": [3, (4, 2)], "keras_mobilenet_v1": [(3, 2), 4], "mbv2_035_96": [3, (2, 4)],
         "keras_mobilenet_v2": [4, (3, 2)], "mbv2_100_224": [4, (4, 3)], "all_kernels": [2, (3, 2), 4]}
STAGES = ["all_kernels"] + ZOO_DEFAULT + ZOO_FULL


@pytest.fixture(scope="session")
def stage_models(tmp_path_factory) -> Callable[[str], StageModel]:
    zoo_dir = os.environ.get("TFMCU_ZOO_CACHE") or str(tmp_path_factory.mktemp("zoo"))
    cache: dict[str, StageModel] = {}

    def get(name: str) -> StageModel:
        if name not in cache:
            if name == "all_kernels":
                keras_model = zoo.all_kernels_model((30, 28, 6), channels=12, grouped=24, groups=4, tail=16,
                                                    head_units=5, seed=11)
                data = zoo.dilate_convs(convert(keras_model), "dilated")
                g = from_tflite(data)
                cache[name] = StageModel(name, data, None, scheduler.largest_prefix(g))
            else:
                entry = zoo.ZOO[name]
                cache[name] = StageModel(name, zoo.build(name, zoo_dir), entry.patch_blocks, entry.patch_ops)
        return cache[name]
    return get


def _stage(sm: StageModel, grid: Any) -> tuple[Any, Any, pack.PackedStage]:
    g = from_tflite(sm.data, name=sm.name)
    s = scheduler.schedule(g, grid, n_blocks=sm.n_blocks, n_ops=sm.n_ops)
    return g, s, pack.pack_stage(sm.data, g, s)


def _analytic_working_set(g: Any, s: Any) -> int:
    """The scheduler's patch working set: its stage peak minus the full input image and the stage output."""
    held = sum(g.tensors[t].nbytes for t in s.stage_outputs)
    held += sum(g.tensors[t].nbytes for t in s.stage_inputs if t in g.inputs)
    return s.stage_peak_bytes - held


@pytest.mark.parametrize("name,grid", [(n, g) for n in STAGES for g in GRIDS[n]],
                         ids=lambda v: v if isinstance(v, str) else str(v).replace(" ", ""))
def test_stage_bit_exact_and_scratch_exact(name, grid, stage_models, lib):
    sm = stage_models(name)
    g, s, p = _stage(sm, grid)
    assert binding.check_stage(p) == (0, -1)
    if name == "all_kernels":
        kinds = {ops.OP_NAMES[layer.type] for layer in p.layers}
        assert kinds == {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "PAD", "AVERAGE_POOL_2D", "MAX_POOL_2D"}, kinds
        assert any(layer.params.get("dilation_h") == 2 for layer in p.layers)
        assert any(layer.params.get("depth_multiplier") == 2 for layer in p.layers)
        assert any(layer.params.get("groups") == 4 for layer in p.layers)
    samples = random_inputs(sm.data, 2 if name in ZOO_FULL else 3, seed=7)
    out_index = p.tensor_tflite_index[p.output_tensor]
    outs = []
    for n, (x,) in enumerate(samples):
        ref = tflite_all_tensors(sm.data, (x,))(out_index)
        got = binding.run_stage(p, x)
        diff = np.flatnonzero(got != ref)
        assert diff.size == 0, (f"sample {n}: {diff.size} of {ref.size} values differ, first at "
                                f"{np.unravel_index(diff[0], ref.shape)}")
        outs.append(ref)
    assert np.stack(outs).astype(np.float64).std(axis=0).max() > 0, "outputs do not vary: the check proves nothing"
    # Scratch: touched == planned == C's figure == the scheduler's analytic patch working set.
    touched, out = binding.touched_scratch(p, samples[0][0])
    assert np.array_equal(out, outs[0])
    assert touched == p.scratch_bytes == binding.c_scratch_bytes(p)
    assert p.lower_bound_bytes == _analytic_working_set(g, s)
    assert p.scratch_bytes == p.lower_bound_bytes, "the offline plan is above the alive-tensor bound"
    print(f"{name} {s.grid[0]}x{s.grid[1]}: {len(p.layers)} layers, scratch {p.scratch_bytes} B "
          f"(analytic {_analytic_working_set(g, s)} B), stage peak {s.stage_peak_bytes} B")
    # One byte less is refused before anything runs.
    with pytest.raises(kernels.PatchKernelError, match="scratch buffer too small"):
        binding.run_stage(p, samples[0][0], np.zeros(p.scratch_bytes, np.uint8), p.scratch_bytes - 1)


def test_mbv2_224_scratch_matches_analytic_working_set(stage_models, lib):
    """MobileNetV2-1.0-224, 4x4 patches over 5 blocks: the figure of the paper's headline setting."""
    sm = stage_models("mbv2_100_224")
    g, s, p = _stage(sm, 4)
    assert p.scratch_bytes == _analytic_working_set(g, s)
    assert s.stage_peak_bytes == p.scratch_bytes + g.tensors[s.stage_outputs[0]].nbytes + \
        g.tensors[s.stage_inputs[0]].nbytes


def test_stage_validation_rejects_broken_descriptions(stage_models, lib):
    sm = stage_models("all_kernels")
    _, _, p = _stage(sm, (3, 2))
    x = random_inputs(sm.data, 1, seed=1)[0][0]
    good = binding.run_stage(p, x)

    def broken(mutate: Callable[[pack.PackedStage], None]) -> tuple[int, int]:
        _, _, q = _stage(sm, (3, 2))
        mutate(q)
        return binding.check_stage(q)

    def overlap(q: pack.PackedStage) -> None:  # two live buffers at the same offset
        t = [t for t in range(len(q.tensor_names)) if q.buffer_offsets[0, t] >= 0]
        q.buffer_offsets[0, t[1]] = q.buffer_offsets[0, t[0]]

    def negative_offset(q: pack.PackedStage) -> None:
        t = [t for t in range(len(q.tensor_names)) if q.buffer_offsets[-1, t] >= 0]
        q.buffer_offsets[-1, t[-1]] = -4

    # Span rows are [out_start, out_stop, in_start[2], in_stop[2], pad_before[2], pad_after[2]].
    def window(q: pack.PackedStage) -> None:  # padding that does not add up to the window
        q.col_spans[0, 1, 6] += 1

    def uncovered(q: pack.PackedStage) -> None:  # the output is not covered completely
        last = q.tensor_producers[q.output_tensor]  # an ADD: reads == output span
        q.row_spans[-1, last, [1, 4, 5]] -= 1

    def scratch(q: pack.PackedStage) -> None:
        q.scratch_bytes += 4

    for mutate in (overlap, negative_offset, window, uncovered, scratch):
        rc, _ = broken(mutate)
        assert rc == 3, mutate.__name__  # kTfmcuErrorInvalidStage
    q = _stage(sm, (3, 2))[2]
    q.layers[2].params["depth_multiplier"] = 3
    assert binding.check_stage(q) == (3, 2)
    with pytest.raises(kernels.PatchKernelError, match="invalid stage"):
        binding.run_stage(q, x)
    assert np.array_equal(binding.run_stage(p, x), good)


def test_unsupported_ops_are_named(stage_models):
    import tf_keras
    from tf_keras import layers

    i = tf_keras.Input((12, 12, 3))
    x = layers.Conv2D(4, 3, padding="same")(i)
    x = layers.Concatenate()([x, layers.Conv2D(4, 1)(i)])
    x = layers.Conv2D(4, 3, padding="same")(x)
    data = convert(tf_keras.Model(i, layers.Dense(2)(layers.GlobalAveragePooling2D()(x))))
    g = from_tflite(data)
    s = scheduler.schedule(g, 2, n_ops=4)
    with pytest.raises(kernels.PatchKernelError, match=r"CONCATENATION has no C patch kernel"):
        pack.pack_stage(data, g, s)


def test_committed_golden_vectors_are_current():
    """tflm_patch_kernels/tests/golden_*.h (the C unit tests' data) are what gen_golden.py writes today."""
    import importlib.util

    path = binding.source_dir().parent / "tools" / "gen" / "gen_golden.py"
    if not path.is_file():
        pytest.skip(f"{path} not available here")
    spec = importlib.util.spec_from_file_location("tfmcu_gen_golden", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for name, text in (("golden_kernels.h", gen.golden_kernels()), ("golden_stage.h", gen.golden_stage())):
        assert (binding.source_dir() / "tests" / name).read_text() == text, f"{name} is stale: run {path}"


# ============================================================================= C builds: sanitizers, warnings
def _c_bytes(values: np.ndarray, ctype: str, name: str) -> str:
    flat = np.asarray(values).reshape(-1)
    if ctype == "float":
        body = ", ".join(float(v).hex() + "f" for v in flat.astype(np.float32))
    else:
        body = ", ".join(str(int(v)) for v in flat)
    return f"static const {ctype} {name}[{flat.size}] = {{{body}}};\n"


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run_case(const char* name, const TfmcuStage* stage, const void* input_src, size_t input_bytes,
                    const int8_t* expected, size_t output_bytes, size_t scratch_bytes) {
  /* Heap buffers of exactly the sizes the API promises: ASan reports any byte outside them. */
  void* input = malloc(input_bytes);
  int8_t* output = (int8_t*)malloc(output_bytes);
  void* scratch = malloc(scratch_bytes);
  int failures = 0;
  memcpy(input, input_src, input_bytes);
  memset(output, 0x5A, output_bytes);
  if (tfmcu_stage_scratch_bytes(stage) != scratch_bytes || tfmcu_stage_output_bytes(stage) != output_bytes) {
    printf("%s: sizes disagree\n", name);
    failures++;
  }
  TfmcuPreparedStage prepared;
  if (tfmcu_stage_prepare(stage, &prepared, NULL) != kTfmcuOk) {
    printf("%s: prepare failed\n", name);
    failures++;
  }
  if (tfmcu_stage_run(&prepared, input, output, scratch, scratch_bytes - 1) != kTfmcuErrorScratchTooSmall) {
    printf("%s: a too small scratch buffer was accepted\n", name);
    failures++;
  }
  TfmcuStatus status = tfmcu_stage_run(&prepared, input, output, scratch, scratch_bytes);
  if (status != kTfmcuOk) {
    printf("%s: %s\n", name, tfmcu_status_string(status));
    failures++;
  } else if (memcmp(output, expected, output_bytes) != 0) {
    printf("%s: output differs from TFLite\n", name);
    failures++;
  }
  free(input);
  free(output);
  free(scratch);
  printf("%s: %s\n", name, failures ? "FAIL" : "ok");
  return failures;
}
"""


def test_asan_ubsan_build_runs_emitted_stages(stage_models, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    parts = ['#include "patch_stage.h"\n', DRIVER]
    calls = []
    cases = (("all_kernels", (3, 2), None), ("tiny_float_input", 3, None), ("kernels_symmetric", (2, 3), None),
             ("resnet_like", 3, None), ("all_kernels", (3, 2), "all"), ("resnet_like", (4, 2), "rows"))
    for name, grid, caches in cases:
        sm = stage_models(name)
        g, s, p = _stage(sm, grid)
        if caches is not None:  # halo caches (issue 12): every intermediate tensor, along both axes or rows only
            inter = halo.intermediates(s)
            p = pack.pack_stage(sm.data, g, s, halo=halo.halo_caches(s, inter, inter if caches == "all" else ()))
            assert p.caches
        x = random_inputs(sm.data, 1, seed=9)[0][0]
        expected = tflite_all_tensors(sm.data, (x,))(p.tensor_tflite_index[p.output_tensor])
        ident = codegen.c_ident(name + (f"_halo_{caches}" if caches else ""))
        parts.append(codegen.stage_to_c(p, ident, static=True))
        parts.append(_c_bytes(x, "float" if x.dtype == np.float32 else "int8_t", f"{ident}_input"))
        parts.append(_c_bytes(expected, "int8_t", f"{ident}_expected"))
        calls.append(f'  failures += run_case("{ident}", &{ident}, {ident}_input, sizeof({ident}_input), '
                     f'{ident}_expected, sizeof({ident}_expected), {ident.upper()}_SCRATCH_BYTES);\n')
    parts.append("int main(void) {\n  int failures = 0;\n" + "".join(calls) + "  return failures != 0;\n}\n")
    main_c = tmp_path / "asan_main.c"
    main_c.write_text("".join(parts))
    src = binding.source_dir()
    exe = tmp_path / "asan_main"
    flags = ["-std=c99", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror"]
    cmd = [cc, *flags, "-I", str(src), str(main_c), *[str(f) for f in binding.sources(src) if f.suffix == ".c"],
           "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert r.stdout.count(": ok") == len(cases), r.stdout


@pytest.mark.parametrize("target", ["host", "arm-none-eabi"])
def test_library_builds_warning_free(target, tmp_path):
    cc = shutil.which("cc") if target == "host" else shutil.which("arm-none-eabi-gcc")
    if cc is None:
        print(f"SKIP: {target} compiler not installed (apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)")
        pytest.skip(f"{target} compiler not installed")
    src = binding.source_dir()
    flags = STRICT + (ARM_FLAGS if target != "host" else [])
    for opt in ("-O0", "-O2", "-Os"):
        for f in binding.sources(src):
            if f.suffix != ".c":
                continue
            obj = tmp_path / f"{f.stem}{opt}.o"
            r = subprocess.run([cc, *flags, opt, "-c", str(f), "-o", str(obj)], capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, f"{target} {opt} {f.name}:\n{r.stderr}"
            assert not r.stderr.strip(), r.stderr
    if target != "host":  # no heap, no global mutable state: nothing in .data/.bss, no malloc/free references
        r = subprocess.run([cc, *flags, "-O2", "-c", *[str(f) for f in binding.sources(src) if f.suffix == ".c"]],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        nm = shutil.which("arm-none-eabi-nm")
        if nm:
            objs = sorted(str(p) for p in tmp_path.glob("*.o") if "-O" not in p.name)
            syms = subprocess.run([nm, *objs], capture_output=True, text=True).stdout
            assert not any(f" {k} " in ln for ln in syms.splitlines() for k in ("B", "b", "D", "d", "C")), syms
            undefined = {ln.split()[-1] for ln in syms.splitlines() if ln.strip().startswith("U ")}
            assert not undefined & {"malloc", "free", "calloc", "realloc"}, undefined


def test_ctypes_structs_match_the_c_layout(tmp_path):
    """The ctypes mirror has the C structs' sizes and field offsets (compiled and printed by the host compiler)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    structs = {name: abi.structure(name) for name in abi.STRUCTS}  # every mirror (tfmcu.abi derives them)
    structs.update({"TfmcuConstViewF32": binding.ConstView, "TfmcuView": binding.View})  # binding uses ConstView
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "patch_stage.h"', "int main(void) {"]
    for cname, cls in structs.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        for f, _ in cls._fields_:
            lines.append(f'  printf("{cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    lines.append("  return 0;\n}")
    (tmp_path / "layout.c").write_text("\n".join(lines))
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c99", "-I", str(binding.source_dir()), str(tmp_path / "layout.c"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c_layout = dict(ln.rsplit(" ", 1) for ln in subprocess.run([str(exe)], capture_output=True,
                                                                text=True).stdout.splitlines())
    for cname, cls in structs.items():
        assert int(c_layout[cname]) == ctypes.sizeof(cls), cname
        for f, _ in cls._fields_:
            assert int(c_layout[f"{cname}.{f}"]) == getattr(cls, f).offset, f"{cname}.{f}"


# ============================================================================= building the library
def test_library_cache_and_concurrent_builds(tmp_path):
    env = dict(os.environ, TFMCU_CACHE_DIR=str(tmp_path / "cache"))
    code = "from tfmcu.kernels import binding; print(binding.build_library()); binding.library()"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(binding.__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1, paths
    lib_path = paths.pop()
    assert lib_path.startswith(str(tmp_path / "cache"))
    assert [f.name for f in (tmp_path / "cache").iterdir()] == [os.path.basename(lib_path)]  # no temp files left
    # A changed source gives a new library; the old one stays.
    src = tmp_path / "src"
    shutil.copytree(binding.source_dir(), src, ignore=shutil.ignore_patterns("firmware", "tests", "BUILD"))
    first = binding.build_library(src=src, out_dir=tmp_path / "cache")
    with open(src / "patch_stage.c", "a") as f:
        f.write("\n/* changed */\n")
    second = binding.build_library(src=src, out_dir=tmp_path / "cache")
    assert first != second and first.exists() and second.exists()
    ctypes.CDLL(str(second))
