"""tfmcu.graph.from_tflite: .tflite (float and int8, real converter output) -> graph IR.

The converted models come from tests/conftest.py (cached per session). Cross-checks: the same network lowered from
its spec (``ir.from_spec``) and from Keras (``lower_keras.from_keras``) has the same convs, windows and MACs.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest

from tfmcu.graph import ir
from tfmcu.graph.from_spec import from_spec
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.graph.names import assign_blocks, layer_of, name_components
from tfmcu.nets import presets
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec
from tfmcu.tflite import schema as ts

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")
L = tf_keras.layers

MAC_OPS = (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED)


# ============================================================================ models
def small_model() -> "tf_keras.Model":
    """Named like tfmcu's builder for the first block, anonymous after it (zero pad + VALID conv, pools)."""
    i = L.Input((32, 32, 3), name="input")
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu6", name="stem_conv")(i)
    y = L.Conv2D(24, 1, name="block1_expand")(x)
    y = L.ReLU(6.0, name="block1_expand_relu")(y)
    y = L.DepthwiseConv2D(3, padding="same", name="block1_depthwise")(y)
    y = L.BatchNormalization(name="block1_depthwise_bn")(y)
    y = L.ReLU(6.0, name="block1_depthwise_relu")(y)
    y = L.Conv2D(8, 1, name="block1_project")(y)
    x = L.Add(name="block1_add")([x, y])
    x = L.ZeroPadding2D(((1, 1), (1, 1)))(x)
    x = L.Conv2D(16, 3, strides=2, padding="valid", activation="relu")(x)
    x = L.MaxPooling2D(2)(x)
    x = L.AveragePooling2D(3, strides=2, padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(10)(x)
    return tf_keras.Model(i, x, name="small")


SMALL_TYPES = [ir.CONV, ir.CONV, ir.DEPTHWISE, ir.CONV, ir.ADD, ir.PAD, ir.CONV, ir.MAX_POOL, ir.AVG_POOL, ir.MEAN,
               ir.FULLY_CONNECTED]


def small_spec(padding: str, resolution: int = 32) -> NetSpec:
    """No-expand block with residual, k5/k7 stride-2 blocks, an SE block, a grouped block, a head."""
    return NetSpec(
        name=f"lt_{padding}", resolution=resolution, padding=padding, stem=StemSpec(8, 3, 2),
        stages=[StageSpec([BlockSpec(8, 3, expand=1)]),
                StageSpec([BlockSpec(16, 5, expand=3, stride=2), BlockSpec(16, 3, expand=3, se=0.25)]),
                StageSpec([BlockSpec(16, 3, expand=2, groups=2), BlockSpec(24, 7, expand=2, stride=2)])],
        head=HeadSpec(last_channels=32, num_classes=10))


def spec_keras(spec: NetSpec) -> "tf_keras.Model":
    from tfmcu.nets.keras_builder import build_keras

    model = build_keras(spec, seed=3)
    # A non-zero classifier bias: the converter drops an all-zero FULLY_CONNECTED bias.
    dense = model.get_layer("classifier")
    dense.bias.assign(np.linspace(-1, 1, dense.bias.shape[0]).astype(np.float32))
    return model


@pytest.fixture(scope="module")
def small():
    return small_model()


@pytest.fixture(scope="module")
def small_float(small, float_tflite, tflite_file):
    return from_tflite(tflite_file(float_tflite(small), "small_float"))


@pytest.fixture(scope="module")
def small_int8(small, int8_tflite):
    return from_tflite(int8_tflite(small), name="small_int8")


@pytest.fixture(scope="module")
def mbv2():
    return tf_keras.applications.MobileNetV2(alpha=0.35, input_shape=(96, 96, 3), weights=None)


@pytest.fixture(scope="module")
def mbv2_int8(mbv2, int8_tflite, tflite_file):
    return from_tflite(tflite_file(int8_tflite(mbv2), "mbv2_035_96_int8"))


def of_type(graph: ir.Graph, *types: str) -> list[ir.Op]:
    return [op for op in graph.ops if op.type in types]


def total_macs(graph: ir.Graph) -> int:
    return sum(ir.op_macs(graph, op) for op in graph.ops)


def out_shape(graph: ir.Graph, op: ir.Op) -> tuple[int, ...]:
    return graph.tensors[op.outputs[0]].shape


# ============================================================================ small model, float and int8
@pytest.mark.parametrize("kind", ["float", "int8"])
def test_small_model_ops(kind, small_float, small_int8):
    g = small_float if kind == "float" else small_int8
    assert g.source == "tflite"
    assert g.name == ("small_float" if kind == "float" else "small_int8")
    assert [op.type for op in g.ops] == SMALL_TYPES
    assert [op.src_index for op in g.ops] == list(range(len(SMALL_TYPES)))
    stem, expand, dw, project, add, pad, conv, maxp, avgp, mean, fc = g.ops
    # SAME, stride 2, even input: TF puts the extra pixel after.
    assert (stem.kernel, stem.stride, stem.padding) == ((3, 3), (2, 2), (0, 1, 0, 1))
    assert (stem.in_channels, stem.out_channels, stem.groups, stem.activation) == (3, 8, 1, "relu6")
    assert (stem.weights, stem.biases) == (3 * 3 * 3 * 8, 8)
    assert (expand.kernel, expand.padding, expand.activation, expand.weights) == ((1, 1), (0, 0, 0, 0), "relu6",
                                                                                  8 * 24)
    assert (dw.kernel, dw.padding, dw.groups, dw.in_channels, dw.out_channels) == ((3, 3), (1, 1, 1, 1), 24, 24, 24)
    assert (dw.weights, dw.biases, dw.activation) == (3 * 3 * 24, 24, "relu6")  # BN and ReLU6 fused
    assert (project.activation, project.weights, project.biases) == ("none", 24 * 8, 8)
    assert add.inputs == [stem.outputs[0], project.outputs[0]] and not add.attrs["broadcast"] and add.patchable
    # ZeroPadding2D(1) + VALID stride-2 conv is not SAME-equivalent on an even input: PAD stays.
    assert (pad.kernel, pad.stride, pad.padding) == ((1, 1), (1, 1), (1, 1, 1, 1)) and pad.patchable
    assert out_shape(g, pad) == (1, 18, 18, 8)
    assert (conv.padding, conv.stride, conv.activation, out_shape(g, conv)) == ((0, 0, 0, 0), (2, 2), "relu",
                                                                                (1, 8, 8, 16))
    assert (maxp.kernel, maxp.stride, maxp.padding, out_shape(g, maxp)) == ((2, 2), (2, 2), (0, 0, 0, 0),
                                                                            (1, 4, 4, 16))
    assert (avgp.kernel, avgp.stride, avgp.padding, out_shape(g, avgp)) == ((3, 3), (2, 2), (0, 1, 0, 1),
                                                                            (1, 2, 2, 16))
    assert mean.attrs["axes"] == [1, 2] and out_shape(g, mean) == (1, 16) and not mean.patchable
    assert (fc.in_channels, fc.out_channels, fc.weights) == (16, 10, 160)
    assert fc.biases == 0  # Dense's zero-initialised bias is dropped by the converter
    assert [op.name for op in g.ops[:5]] == ["stem_conv", "block1_expand", "block1_depthwise", "block1_project",
                                             "block1_add"]
    assert ";" in dw.attrs["tensor_name"] and "block1_depthwise" in dw.attrs["tensor_name"]
    # Blocks from names: stem, block1, then the anonymous layers stay in block 1 until the head's pooling.
    assert [op.block for op in g.ops] == [0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2]
    assert g.block_names == {0: "stem", 1: "block1", 2: "head"}
    # Tensors: every op's output shape equals the Keras layer's output shape.
    assert g.tensors[g.inputs[0]].shape == (1, 32, 32, 3)
    assert g.outputs == fc.outputs and out_shape(g, fc) == (1, 10)
    itemsize, dtype = (4, "float32") if kind == "float" else (1, "int8")
    assert {(t.itemsize, t.dtype) for t in g.tensors.values()} == {(itemsize, dtype)}
    assert g.tensors[g.inputs[0]].nbytes == 32 * 32 * 3 * itemsize


def test_small_model_matches_keras_lowering(small, small_int8):
    from tfmcu.graph.from_keras import from_keras

    k = from_keras(small)
    assert total_macs(small_int8) == total_macs(k) > 0
    for a, b in zip(of_type(small_int8, *MAC_OPS), of_type(k, *MAC_OPS), strict=True):
        assert (a.type, a.kernel, a.stride, a.in_channels, a.out_channels, a.weights) == \
            (b.type, b.kernel, b.stride, b.in_channels, b.out_channels, b.weights)
        assert ir.op_macs(small_int8, a) == ir.op_macs(k, b)


def test_float_input_int8_starts_with_quantize(small, int8_tflite):
    g = from_tflite(int8_tflite(small, float_io=True))
    first, last = g.ops[0], g.ops[-1]
    assert first.type == ir.QUANTIZE and first.patchable and first.block == 0
    assert last.type == ir.DEQUANTIZE
    x = g.tensors[g.inputs[0]]
    assert (x.dtype, x.itemsize, x.shape) == ("float32", 4, (1, 32, 32, 3))
    assert g.tensors[first.outputs[0]].dtype == "int8"
    assert g.tensors[g.outputs[0]].dtype == "float32"
    assert [op.type for op in g.ops[1:-1]] == SMALL_TYPES
    assert g.ops[1].name == "stem_conv" and g.ops[1].block == 0


# ============================================================================ spec -> Keras -> .tflite vs spec
@pytest.mark.parametrize("padding,resolution,kind", [("same", 32, "int8"), ("symmetric", 32, "float")])
def test_spec_model_matches_from_spec(padding, resolution, kind, int8_tflite, float_tflite):
    spec = small_spec(padding, resolution)
    model = spec_keras(spec)
    data = int8_tflite(model) if kind == "int8" else float_tflite(model)
    g, ref = from_tflite(data), from_spec(spec)
    assert total_macs(g) == total_macs(ref)
    assert g.num_blocks == ref.num_blocks == spec.num_blocks + 1
    assert g.block_names == ref.block_names
    ours, theirs = of_type(g, *MAC_OPS), of_type(ref, *MAC_OPS)
    assert len(ours) == len(theirs)
    pads = {op.outputs[0]: op for op in g.ops if op.type == ir.PAD}
    for a, b in zip(ours, theirs):
        where = f"{b.name}"
        assert (a.type, a.kernel, a.stride, a.dilation) == (b.type, b.kernel, b.stride, b.dilation), where
        assert (a.in_channels, a.out_channels, a.groups) == (b.in_channels, b.out_channels, b.groups), where
        assert (a.weights, a.biases) == (b.weights, b.biases), where
        assert ir.op_macs(g, a) == ir.op_macs(ref, b), where
        assert a.block == b.block, where
        if a.groups == 1:  # the converter drops the layer scope from grouped convs' tensor names
            assert a.name == b.name
        # Padding: the conv's own, plus that of a PAD op feeding it (symmetric convention).
        padding_total = np.array(a.padding)
        if a.inputs and a.inputs[0] in pads:
            padding_total += np.array(pads[a.inputs[0]].padding)
        assert tuple(padding_total) == b.padding, where
        if b.activation == "sigmoid":  # SE gate: LOGISTIC is its own op after the conv
            nxt = g.ops[g.ops.index(a) + 1]
            assert (a.activation, nxt.type, nxt.activation) == ("none", ir.ACTIVATION, "sigmoid")
        else:
            assert a.activation == b.activation, where
    for typ in (ir.ADD, ir.MUL, ir.MEAN):
        assert len(of_type(g, typ)) == len(of_type(ref, typ)), typ
    excite = of_type(g, ir.MUL)[0]
    assert excite.attrs["broadcast"] and not excite.patchable
    assert out_shape(g, of_type(g, ir.MEAN)[0]) == (1, 1, 1, 48)  # SE squeeze keeps dims
    if padding == "symmetric":
        # k//2 pads stay PAD ops only where they differ from SAME: before the stride-2 convs on even inputs.
        assert [(op.name, op.padding) for op in of_type(g, ir.PAD)] == [
            ("stem_conv_pad", (1, 1, 1, 1)), ("block2_depthwise_pad", (2, 2, 2, 2)),
            ("block5_depthwise_pad", (3, 3, 3, 3))]
    else:
        assert not of_type(g, ir.PAD)


# ============================================================================ Keras applications MobileNetV2
def test_mobilenetv2_int8(mbv2, mbv2_int8):
    g = mbv2_int8
    counts = {t: len(of_type(g, t)) for t in (ir.CONV, ir.DEPTHWISE, ir.ADD, ir.MEAN, ir.FULLY_CONNECTED,
                                             ir.SOFTMAX, ir.PAD)}
    # Keras' ZeroPadding2D((0,1),(0,1)) + VALID stride-2 depthwise equals SAME: the converter folds the pad.
    assert counts == {ir.CONV: 35, ir.DEPTHWISE: 17, ir.ADD: 10, ir.MEAN: 1, ir.FULLY_CONNECTED: 1, ir.SOFTMAX: 1,
                      ir.PAD: 0}
    stride2 = [op for op in of_type(g, ir.DEPTHWISE) if op.stride == (2, 2)]
    assert [op.name for op in stride2] == ["block_1_depthwise", "block_3_depthwise", "block_6_depthwise",
                                           "block_13_depthwise"]
    assert all(op.padding == (0, 1, 0, 1) for op in stride2)
    assert "block_1_pad/Pad" in stride2[0].attrs["tensor_name"]
    # Blocks from Keras names: Conv1 = stem 0, expanded_conv = 1, block_i = i + 1, head = 18.
    assert g.num_blocks == 19
    by_name = {op.name: op for op in g.ops}
    assert by_name["Conv1"].block == 0 and by_name["expanded_conv_project"].block == 1
    assert all(op.block == int(op.name.split("_")[1]) + 1 for op in g.ops if op.name.startswith("block_"))
    assert [op.block for op in g.ops[-4:]] == [18] * 4 and g.block_names[18] == "head"
    conv_1, pool, fc = g.ops[-4:-1]  # (Keras numbers default layer names per session: global_average_pooling2d_N)
    assert (conv_1.name, fc.name) == ("Conv_1", "predictions") and pool.name.startswith("global_average_pooling2d")
    # Same MACs, op by op, as the MobileNetV2 preset lowered from its spec.
    ref = from_spec(presets.mbv2(width=0.35, resolution=96, num_classes=1000))
    ours, theirs = of_type(g, *MAC_OPS), of_type(ref, *MAC_OPS)
    assert [ir.op_macs(g, op) for op in ours] == [ir.op_macs(ref, op) for op in theirs]
    assert [(op.kernel, op.stride, op.padding, op.weights) for op in ours] == \
        [(op.kernel, op.stride, op.padding, op.weights) for op in theirs]
    assert [op.block for op in ours] == [op.block for op in theirs]
    assert sum(op.weights for op in g.ops) == sum(op.weights for op in ref.ops)
    assert total_macs(g) == total_macs(ref) == 11_934_128
    assert {t.itemsize for t in g.tensors.values()} == {1}
    # And the Keras lowering of the same model.
    from tfmcu.graph.from_keras import from_keras

    assert total_macs(from_keras(mbv2)) == total_macs(g)
    # Downstream: the analytic memory profile is the spec's.
    from tfmcu.plan.profiler import profile

    assert profile(g).peak_sram_per_layer_bytes == profile(ref).peak_sram_per_layer_bytes


# ============================================================================ other ops, real converter output
@pytest.fixture(scope="module")
def misc_float(float_tflite):
    i = L.Input((16, 16, 4), name="img")
    a = L.Conv2D(8, 3, padding="same", dilation_rate=2, name="dil")(i)
    b = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw2")(i)
    c = L.Concatenate(axis=-1, name="cat_c")([a, b])
    w = L.Concatenate(axis=2, name="cat_w")([a, a])
    s = L.GlobalAveragePooling2D(keepdims=True, name="gap")(c)
    s = L.Activation("sigmoid", name="gate")(s)
    c = L.Multiply(name="scale")([c, s])
    c = L.LeakyReLU(0.2, name="leaky")(c)
    c = L.Lambda(lambda t: tf.pad(t, [[0, 0], [0, 0], [0, 0], [0, 2]]), name="chpad")(c)
    c = L.Lambda(lambda t: tf.image.resize(t, (8, 8)), name="rs")(c)
    w = L.MaxPooling2D((2, 4), name="mp")(w)
    o = L.Concatenate(name="cat_out")([L.Reshape((-1,), name="flat")(c), L.Reshape((-1,), name="flat2")(w)])
    o = L.Dense(5, activation="softmax", name="fc")(o)
    return from_tflite(float_tflite(tf_keras.Model(i, o, name="misc")), name="misc")


def test_misc_ops(misc_float):
    g = misc_float
    by = {op.name: op for op in g.ops}
    # A dilated SAME conv becomes SPACE_TO_BATCH_ND -> VALID conv -> BATCH_TO_SPACE_ND in TFLite.
    assert [op.type for op in g.ops[:3]] == ["space_to_batch_nd", ir.CONV, "batch_to_space_nd"]
    assert not g.ops[0].patchable and not g.ops[2].patchable
    dw = by["dw2"]
    assert (dw.type, dw.in_channels, dw.out_channels, dw.groups, dw.attrs["depth_multiplier"]) == \
        (ir.DEPTHWISE, 4, 8, 4, 2)
    assert dw.weights == 3 * 3 * 8 and ir.op_macs(g, dw) == 16 * 16 * 8 * 9
    assert by["cat_c"].attrs["axis"] == 3 and by["cat_c"].patchable
    assert by["cat_w"].attrs["axis"] == 2 and by["cat_w"].attrs["patchable"] is False
    assert out_shape(g, by["cat_w"]) == (1, 16, 32, 8)
    assert (by["gate"].type, by["gate"].activation, by["gate"].attrs["op"]) == (ir.ACTIVATION, "sigmoid", "logistic")
    assert by["scale"].attrs["broadcast"] and not by["scale"].patchable
    assert by["leaky"].activation == "leaky_relu" and by["leaky"].attrs["alpha"] == pytest.approx(0.2)
    chpad = by["chpad"]
    assert chpad.type == ir.PAD and chpad.attrs["patchable"] is False and chpad.padding == (0, 0, 0, 0)
    assert chpad.attrs["paddings"] == [[0, 0], [0, 0], [0, 0], [0, 2]]
    assert by["rs/resize"].type == "resize_bilinear" and not by["rs/resize"].patchable
    assert by["mp"].kernel == (2, 4) and by["mp"].stride == (2, 4)
    # Reshape((-1,)) on a dynamic batch is stored as [1, 1] (signature [-1, -1]): sizes are recovered.
    reshapes = of_type(g, ir.RESHAPE)
    assert sorted(out_shape(g, op) for op in reshapes) == [(1, 512), (1, 1152)]
    assert out_shape(g, by["cat_out"]) == (1, 1664)
    fc = of_type(g, ir.FULLY_CONNECTED)[0]
    assert (fc.in_channels, fc.out_channels, fc.weights) == (1664, 5, 1664 * 5)
    assert g.ops[-1].type == ir.SOFTMAX
    assert "shape" in {op.type for op in g.ops} and "pack" in {op.type for op in g.ops}
    # No block names and no residual structure: one block per op.
    assert [op.block for op in g.ops] == list(range(len(g.ops)))


def test_anonymous_model_gets_structural_blocks(float_tflite):
    i = L.Input((16, 16, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(i)
    for _ in range(2):  # two inverted residual blocks with default layer names
        y = L.Conv2D(16, 1, activation="relu")(x)
        y = L.DepthwiseConv2D(3, padding="same", activation="relu")(y)
        y = L.Conv2D(8, 1)(y)
        x = L.Add()([x, y])
    x = L.Conv2D(16, 1, activation="relu")(x)
    x = L.DepthwiseConv2D(3, strides=2, padding="same", activation="relu")(x)
    x = L.Conv2D(12, 1)(x)
    x = L.GlobalAveragePooling2D()(x)
    g = from_tflite(float_tflite(tf_keras.Model(i, L.Dense(3)(x))))
    assert [op.type for op in g.ops] == [ir.CONV] + [ir.CONV, ir.DEPTHWISE, ir.CONV, ir.ADD] * 2 + \
        [ir.CONV, ir.DEPTHWISE, ir.CONV, ir.MEAN, ir.FULLY_CONNECTED]
    assert [op.block for op in g.ops] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4]
    assert g.block_names[0] == "stem" and g.block_names[4] == "head"


# ============================================================================ blocks without TensorFlow
def test_structural_blocks_reproduce_spec_blocks():
    spec = presets.mbv2(width=0.35, resolution=96)
    ref = from_spec(spec)
    g = ref.copy()
    names = assign_blocks(g.ops, g.tensors, g.inputs, g.outputs, parser=lambda name: (None, ""))
    assert [op.block for op in g.ops] == [op.block for op in ref.ops]
    assert names[0] == "stem" and names[g.num_blocks - 1] == "head"


def test_name_blocks_and_one_block_per_op_fallback():
    ref = from_spec(small_spec("same"))
    g = ref.copy()
    for op in g.ops:
        op.attrs["tensor_name"] = f"net/{op.name}_relu/Relu6;net/{op.name}/Conv2D"
    names = assign_blocks(g.ops, g.tensors, g.inputs, g.outputs)
    assert [op.block for op in g.ops] == [op.block for op in ref.ops]
    assert names == ref.block_names
    # Plain conv chain with activations: no block boundary is found, so every op is its own block.
    chain = ir.Graph("chain", {"x": ir.Tensor("x", (1, 8, 8, 3)), "a": ir.Tensor("a", (1, 8, 8, 4)),
                               "b": ir.Tensor("b", (1, 8, 8, 4))},
                     [ir.Op("c1", ir.CONV, ["x"], ["a"], activation="relu"),
                      ir.Op("c2", ir.CONV, ["a"], ["b"], activation="relu")], ["x"], ["b"])
    assign_blocks(chain.ops, chain.tensors, chain.inputs, chain.outputs, parser=lambda name: (None, ""))
    assert [op.block for op in chain.ops] == [0, 1]
    # the same chain behind a Keras Rescaling (MUL, ADD by constants: tf_keras.applications' MobileNet): its ADD
    # ends no block, so the chain's ops are still blocks of their own (not one block after the preprocessing)
    pre = ir.Graph("pre", {**chain.tensors, "s": ir.Tensor("s", (1, 8, 8, 3)), "x0": ir.Tensor("x0", (1, 8, 8, 3))},
                   [ir.Op("scale", ir.MUL, ["x0"], ["s"]), ir.Op("offset", ir.ADD, ["s"], ["x"])]
                   + list(chain.ops), ["x0"], ["b"])
    assign_blocks(pre.ops, pre.tensors, pre.inputs, pre.outputs, parser=lambda name: (None, ""))
    assert [op.block for op in pre.ops] == [0, 1, 2, 3]
    # a long chain whose only linear conv is the last but one (a MobileNet's classifier as a 1x1 conv, then a
    # reshape): one boundary, but a "block" of twelve convs is no block: every op its own
    n = 12
    ts = {f"t{i}": ir.Tensor(f"t{i}", (1, 8, 8, 4)) for i in range(n + 2)}
    ts["y"] = ir.Tensor("y", (1, 256))
    long_ops = ([ir.Op(f"c{i}", ir.CONV, [f"t{i}"], [f"t{i + 1}"], activation="relu") for i in range(n)]
                + [ir.Op("logits", ir.CONV, [f"t{n}"], [f"t{n + 1}"]), ir.Op("flat", ir.RESHAPE, [f"t{n + 1}"], ["y"])])
    long = ir.Graph("long", ts, long_ops, ["t0"], ["y"])
    assign_blocks(long.ops, long.tensors, long.inputs, long.outputs, parser=lambda name: (None, ""))
    assert [op.block for op in long.ops] == list(range(n + 2))


def test_name_helpers():
    name = "m/block_1_depthwise_relu/Relu6;m/block_1_depthwise_BN/FusedBatchNormV3;;m/block_1_pad/Pad1"
    assert name_components(name) == ["m/block_1_depthwise_relu/Relu6", "m/block_1_depthwise_BN/FusedBatchNormV3",
                                     "m/block_1_pad/Pad1"]
    assert layer_of("m/block_1_expand/Conv2D1") == "block_1_expand"
    assert layer_of("m/sub/conv/Conv2D") == "sub/conv"
    assert layer_of("serving_default_input_1:0") == "serving_default_input_1"


# ============================================================================ schema helpers, edited models
def edit(data: bytes, fn) -> bytes:
    model = ts.load_model(data)
    fn(model)
    return ts.write_model(model)


def add_code(model, builtin: int, custom: str | None = None) -> int:
    code = ts.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.customCode = custom
    code.version = 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def test_schema_roundtrip(small, float_tflite):
    data = float_tflite(small)
    model = ts.load_model(data)
    assert [ts.op_name(model, op) for op in model.subgraphs[0].operators][:3] == ["CONV_2D", "CONV_2D",
                                                                                 "DEPTHWISE_CONV_2D"]
    assert ts.dtype_name(ts.TensorType.INT8) == "int8" and ts.itemsize(ts.TensorType.INT16) == 2
    assert ts.itemsize(ts.TensorType.FLOAT32) == 4 and ts.itemsize(ts.TensorType.UINT8) == 1
    again = ts.write_model(model)
    assert ts.has_identifier(again)
    a, b = from_tflite(data), from_tflite(again)
    assert [(op.name, op.type, op.padding, op.weights) for op in a.ops] == \
        [(op.name, op.type, op.padding, op.weights) for op in b.ops]


def test_control_flow_is_rejected(small, float_tflite):
    def to_while(model):
        model.subgraphs[0].operators[3].opcodeIndex = add_code(model, ts.BuiltinOperator.WHILE)
    with pytest.raises(ir.GraphError, match=r"op 3 \(WHILE\).*control flow"):
        from_tflite(edit(float_tflite(small), to_while), name="cf.tflite")


def test_custom_op_and_dynamic_dims(small, float_tflite):
    def edit_fn(model):
        sg = model.subgraphs[0]
        sg.operators[7].opcodeIndex = add_code(model, ts.BuiltinOperator.CUSTOM, "MyPool")  # the MAX_POOL_2D
        sg.tensors[sg.inputs[0]].shape[0] = -1
    g = from_tflite(edit(float_tflite(small), edit_fn))
    op = g.ops[7]
    assert op.type == "custom:MyPool" and not op.patchable and op.outputs and op.inputs
    assert g.tensors[g.inputs[0]].shape == (1, 32, 32, 3)


def test_inconsistent_models_raise(small, float_tflite):
    data = float_tflite(small)

    def swap(model):
        ops = model.subgraphs[0].operators
        ops[1], ops[2] = ops[2], ops[1]
    with pytest.raises(ir.GraphError, match=r"op 1 \(DEPTHWISE_CONV_2D\).*before any op produces it"):
        from_tflite(edit(data, swap))

    def bad_shape(model):
        sg = model.subgraphs[0]
        sg.tensors[sg.operators[0].outputs[0]].shape[1] = 15
    with pytest.raises(ir.GraphError, match=r"op 0 \(CONV_2D\).*does not match"):
        from_tflite(edit(data, bad_shape))


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"\x00\x00\x00\x00TFL3" + b"\xff" * 8])
def test_bad_files_raise_one_line(tmp_path, content):
    path = tmp_path / "bad.tflite"
    path.write_bytes(content)
    with pytest.raises(ir.GraphError) as e:
        from_tflite(str(path))
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    if content[4:8] != b"TFL3":
        assert "is not a TFLite flatbuffer" in msg


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ir.GraphError, match="no such file"):
        from_tflite(str(tmp_path / "missing.tflite"))
    with pytest.raises(ir.GraphError, match="is a directory"):
        from_tflite(tmp_path)


def test_truncated_file(small, float_tflite, tmp_path):
    path = tmp_path / "cut.tflite"
    path.write_bytes(float_tflite(small)[:200])
    with pytest.raises(ir.GraphError, match="cut.tflite"):
        from_tflite(path)


@pytest.mark.parametrize("offset", [0, 3])
def test_padv2_value(small, int8_tflite, offset):
    """PADV2 padding with the zero point is zero padding; any other value cannot be reproduced per patch."""
    def to_padv2(model):
        sg = model.subgraphs[0]
        op = sg.operators[5]  # the PAD
        x = sg.tensors[op.inputs[0]]
        value = int(x.quantization.zeroPoint[0]) + offset
        buf = ts.BufferT()
        buf.data = np.array([value], dtype=np.int8).view(np.uint8)
        model.buffers.append(buf)
        t = ts.TensorT()
        t.shape, t.type, t.buffer, t.name = np.zeros(0, np.int32), ts.TensorType.INT8, len(model.buffers) - 1, "v"
        sg.tensors.append(t)
        op.inputs = np.append(op.inputs, len(sg.tensors) - 1).astype(np.int32)
        op.opcodeIndex = add_code(model, ts.BuiltinOperator.PADV2)
    g = from_tflite(edit(int8_tflite(small), to_padv2))
    pad = g.ops[5]
    assert (pad.type, pad.padding, pad.attrs["tflite_op"]) == (ir.PAD, (1, 1, 1, 1), "PADV2")
    assert ("patchable" in pad.attrs) == bool(offset) and len(pad.inputs) == 1
