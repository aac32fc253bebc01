"""from_keras: equality with ir.from_spec, Keras MobileNetV2, TFLite-style folding and its numeric meaning."""

import os
import subprocess
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_keras import from_keras, load_keras  # noqa: E402
from tfmcu.graph.from_spec import from_spec  # noqa: E402
from tfmcu.graph.names import block_of_name  # noqa: E402
from tfmcu.nets.keras_builder import build_keras  # noqa: E402
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec  # noqa: E402

L = tf_keras.layers
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------- specs
def small(padding="same", res=32, se=0.0, groups=1, head=None, name="small") -> NetSpec:
    stages = [
        StageSpec([BlockSpec(16, kernel=3, expand=1, stride=1)]),
        StageSpec([BlockSpec(24, kernel=5, expand=4, stride=2, se=se, groups=groups),
                   BlockSpec(24, kernel=7, expand=3, stride=1, se=se, groups=groups)]),
        StageSpec([BlockSpec(32, kernel=3, expand=6, stride=2, activation="relu")]),
    ]
    return NetSpec(name, res, padding=padding, stem=StemSpec(16, 3, 2), stages=stages,
                   head=head or HeadSpec(64, "avg", 5))


def mbv2_spec(padding="same", res=224) -> NetSpec:
    stages = []
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        stages.append(StageSpec([BlockSpec(c, kernel=3, expand=t, stride=s if i == 0 else 1) for i in range(n)]))
    return NetSpec(f"mbv2_{padding}", res, padding=padding, stem=StemSpec(32, 3, 2), stages=stages,
                   head=HeadSpec(1280, "avg", 1000))


def assert_same_graph(got: ir.Graph, want: ir.Graph) -> None:
    assert [o.name for o in got.ops] == [o.name for o in want.ops]
    for a, b in zip(got.ops, want.ops):
        for f in ("type", "inputs", "outputs", "kernel", "stride", "dilation", "padding", "in_channels",
                  "out_channels", "groups", "activation", "weights", "biases", "block", "attrs"):
            assert getattr(a, f) == getattr(b, f), f"{a.name}.{f}: {getattr(a, f)} != {getattr(b, f)}"
        assert a == b
    assert got.tensors == want.tensors
    assert got.inputs == want.inputs and got.outputs == want.outputs
    present = {o.block for o in want.ops}
    assert got.block_names == {b: n for b, n in want.block_names.items() if b in present}
    assert got.source == "keras" and got.name == want.name


SPECS = {
    "same32": small("same", 32),
    "same33_se_groups": small("same", 33, se=0.25, groups=2),
    "sym33": small("symmetric", 33),
    "sym32_se_groups": small("symmetric", 32, se=0.25, groups=2),
    "no_classifier": small("symmetric", 33, head=HeadSpec(64, "avg", 0)),
    "no_head": small("same", 40, head=HeadSpec(0, "none", 0)),
}


@pytest.mark.parametrize("key", list(SPECS))
def test_from_keras_equals_from_spec(key):
    spec = SPECS[key]
    assert_same_graph(from_keras(build_keras(spec, seed=0)), from_spec(spec))


@pytest.mark.parametrize("padding", ["same", "symmetric"])
def test_mbv2_spec_equals_from_spec(padding):
    spec = mbv2_spec(padding)
    g = from_keras(build_keras(spec, seed=0))
    assert_same_graph(g, from_spec(spec))
    macs = sum(ir.op_macs(g, op) for op in g.ops)
    assert 295e6 < macs < 306e6
    assert g.num_blocks == 19 and g.block_name(18) == "head"


def test_fold_symmetric_pad_off_keeps_pad_ops():
    spec = small("symmetric", 33)
    m = build_keras(spec, seed=0)
    g = from_keras(m, fold_symmetric_pad=False)
    ref = from_spec(spec)
    pads = [op for op in g.ops if op.type == ir.PAD]
    assert {op.name for op in pads} == {f"{op.name}_pad" for op in ref.ops if op.kernel[0] > 1}
    by = {op.name: op for op in g.ops}
    for op in ref.ops:
        if op.kernel[0] > 1:
            pad, conv = by[f"{op.name}_pad"], by[op.name]
            assert pad.padding == op.padding and pad.kernel == (1, 1) and pad.stride == (1, 1)
            assert conv.padding == (0, 0, 0, 0) and conv.inputs == pad.outputs
            assert g.tensors[conv.outputs[0]].shape == ref.tensors[op.outputs[0]].shape
    assert sum(ir.op_macs(g, o) for o in g.ops) == sum(ir.op_macs(ref, o) for o in ref.ops)


def test_quantization_aware_model_lowers_like_float():
    tfmot = pytest.importorskip("tensorflow_model_optimization")
    spec = small("symmetric", 33, se=0.0)
    qat = tfmot.quantization.keras.quantize_model(build_keras(spec, seed=0))
    assert_same_graph(from_keras(qat), from_spec(spec))


# ------------------------------------------------------------------------- Keras MobileNetV2
@pytest.fixture(scope="module")
def keras_mbv2():
    return tf_keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))


def test_keras_mobilenetv2(keras_mbv2):
    g = from_keras(keras_mbv2)
    macs = sum(ir.op_macs(g, op) for op in g.ops)
    assert 295e6 < macs < 306e6  # published: 300M
    assert sorted({op.block for op in g.ops}) == list(range(19))  # stem 0, blocks 1..17, head 18
    assert g.block_names[0] == "stem" and g.block_names[1] == "expanded_conv"
    assert g.block_names[2] == "block_1" and g.block_names[17] == "block_16" and g.block_names[18] == "head"
    pads = [op for op in g.ops if op.type == ir.PAD]
    assert [op.name for op in pads] == ["block_1_pad", "block_3_pad", "block_6_pad", "block_13_pad"]
    by = {op.name: op for op in g.ops}
    for pad in pads:
        assert pad.padding == (0, 1, 0, 1) and pad.kernel == (1, 1) and pad.stride == (1, 1)
        dw = by[pad.name.replace("_pad", "_depthwise")]
        assert dw.inputs == pad.outputs and dw.padding == (0, 0, 0, 0) and dw.stride == (2, 2)
        assert pad.block == dw.block
    assert by["Conv1"].padding == (0, 1, 0, 1) and by["Conv1"].activation == "relu6" and by["Conv1"].biases == 32
    assert by["block_1_project"].activation == "none" and by["block_2_add"].type == ir.ADD
    assert [op.type for op in g.ops[-4:]] == [ir.CONV, ir.MEAN, ir.FULLY_CONNECTED, ir.SOFTMAX]
    assert g.tensors[g.outputs[0]].shape == (1, 1000)
    # Only convs, pads, adds and the head: BN and ReLU6 are all folded.
    assert {op.type for op in g.ops} == {ir.CONV, ir.DEPTHWISE, ir.PAD, ir.ADD, ir.MEAN, ir.FULLY_CONNECTED,
                                         ir.SOFTMAX}
    params = sum(op.params for op in g.ops)
    bn_stats = sum(2 * int(layer.gamma.shape[0]) for layer in keras_mbv2.layers
                   if isinstance(layer, L.BatchNormalization))
    # Keras params minus BN (gamma, beta, mean, var) plus one folded bias per BN channel.
    assert params == keras_mbv2.count_params() - 2 * bn_stats + bn_stats // 2


def test_keras_mobilenetv2_nested_in_functional(keras_mbv2):
    """Transfer-learning style: the application is a layer of an outer model; it is inlined."""
    base = tf_keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), include_top=False)
    inp = tf_keras.Input((96, 96, 3), name="image")
    x = base(inp)
    x = L.GlobalAveragePooling2D(name="global_average_pooling2d_9")(x)
    x = L.Dropout(0.2)(x)
    out = L.Dense(2, name="predictions")(x)
    g = from_keras(tf_keras.Model(inp, out))
    assert g.inputs == ["image"] and g.ops[0].name == "Conv1" and g.ops[0].inputs == ["image"]
    assert g.num_blocks == 19 and g.ops[-1].type == ir.FULLY_CONNECTED
    assert g.ops[-1].inputs == g.ops[-2].outputs  # dropout skipped


def test_keras_mobilenetv3_names_and_hard_swish():
    m = tf_keras.applications.MobileNetV3Small(weights=None, input_shape=(96, 96, 3))
    g = from_keras(m)
    assert g.num_blocks == 13 and g.block_names[0] == "stem" and g.block_names[12] == "head"
    assert g.block_names[4] == "expanded_conv_3"
    # Rescaling -> MUL + ADD, hard-swish (x + 3 -> relu6 -> * 1/6 -> * x) -> ADD(relu6) + MUL + MUL: all IR ops.
    assert {op.type for op in g.ops} <= {ir.CONV, ir.DEPTHWISE, ir.PAD, ir.ADD, ir.MUL, ir.MEAN, ir.RESHAPE,
                                         ir.FULLY_CONNECTED, ir.SOFTMAX}
    by = {op.name: op for op in g.ops}
    assert by["tf.__operators__.add_1"].activation == "relu6" and by["Conv"].block == 0
    assert by["expanded_conv/squeeze_excite/Mul"].attrs == {"broadcast": True}


# ------------------------------------------------------------------------- shapes and numbers
def test_every_layer_shape_matches_ir():
    spec = small("symmetric", 33, se=0.25, groups=2)
    m = build_keras(spec, seed=0)
    g = from_keras(m)
    ops = {op.name: op for op in g.ops}
    checked = 0
    for layer in m.layers:
        shape = (1,) + tuple(layer.output_shape[1:]) if layer.name != "input" else None
        if layer.name == "input":
            assert g.tensors["input"].shape == (1,) + tuple(layer.output_shape[0][1:])
            continue
        base = layer.name
        for suffix in ("_bn", "_relu", "_pad"):
            if base.endswith(suffix) and base[: -len(suffix)] in ops:
                base = base[: -len(suffix)]
        op = ops[base]
        if layer.name.endswith("_pad"):
            _, h, w, c = g.tensors[op.inputs[0]].shape
            t, b, l, r = op.padding
            assert shape == (1, h + t + b, w + l + r, c), layer.name
        else:
            assert shape == g.tensors[op.outputs[0]].shape, layer.name
        checked += 1
    assert checked == len(m.layers) - 1


def _fused_layers(layer):
    """The conv layer and the BN / ReLU layers that follow it one-to-one (what the IR folds)."""
    chain = [layer]
    while len(chain[-1]._outbound_nodes) == 1:
        nxt = chain[-1]._outbound_nodes[0].layer
        if isinstance(nxt, L.BatchNormalization) and len(chain) == 1 or isinstance(nxt, L.ReLU):
            chain.append(nxt)
            if isinstance(nxt, L.ReLU):
                break
        else:
            break
    return chain


def _reference_conv(op: ir.Op, x: np.ndarray, chain) -> np.ndarray:
    """Execute one IR conv op: explicit per-side zero pad, VALID conv with BN folded into weights and bias."""
    conv = chain[0]
    t, b, l, r = op.padding
    x = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)))
    w = (conv.depthwise_kernel if op.type == ir.DEPTHWISE else conv.kernel).numpy()
    bias = conv.bias.numpy() if conv.use_bias else np.zeros(op.out_channels, np.float32)
    bns = [layer for layer in chain if isinstance(layer, L.BatchNormalization)]
    if bns:
        bn = bns[0]
        scale = bn.gamma.numpy() / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
        w = w * (scale.reshape(1, 1, -1, 1) if op.type == ir.DEPTHWISE else scale)
        bias = (bias - bn.moving_mean.numpy()) * scale + bn.beta.numpy()
    assert op.biases == (op.out_channels if (conv.use_bias or bns) else 0)
    strides = (1,) + tuple(op.stride) + (1,)
    if op.type == ir.DEPTHWISE:
        y = tf.nn.depthwise_conv2d(x, w, strides, "VALID", dilations=op.dilation)
    else:
        y = tf.nn.conv2d(x, w, strides, "VALID", dilations=op.dilation)
    y = y.numpy() + bias
    act = {"relu6": lambda v: np.clip(v, 0, 6), "relu": lambda v: np.maximum(v, 0),
           "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "none": lambda v: v}[op.activation]
    return act(y)


def _randomize_bn(model, seed=0):
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            n = layer.gamma.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, n), rng.normal(0, 0.3, n), rng.normal(0, 0.3, n),
                               rng.uniform(0.5, 2.0, n)])


def check_numerics(model, g: ir.Graph, res: int) -> int:
    """Run every IR window op with numpy/tf.nn from its explicit padding and compare with Keras."""
    _randomize_bn(model)
    layers = {layer.name: layer for layer in model.layers}
    producer = {}
    for op in g.ops:
        for t in op.outputs:
            producer[t] = op
    # Keras tensor for each IR tensor: the graph input, or the output of the last layer the op folds.
    want = {}
    for op in g.ops:
        if op.name not in layers:
            continue
        layer = layers[op.name]
        chain = _fused_layers(layer) if op.type in (ir.CONV, ir.DEPTHWISE) else [layer]
        want[op.outputs[0]] = (op, chain)
    tensors = {t: chain[-1].output for t, (op, chain) in want.items()}
    tensors[g.inputs[0]] = model.inputs[0]
    names = sorted(tensors)
    probe = tf_keras.Model(model.inputs, [tensors[n] for n in names])
    x = np.random.default_rng(1).normal(size=(1, res, res, model.input_shape[-1])).astype("float32")
    values = dict(zip(names, probe(x, training=False)))
    checked = 0
    for op in g.ops:
        if op.type not in (ir.CONV, ir.DEPTHWISE, ir.PAD) or op.inputs[0] not in values:
            continue
        inp = values[op.inputs[0]].numpy()
        if op.type == ir.PAD:
            t, b, l, r = op.padding
            ref = np.pad(inp, ((0, 0), (t, b), (l, r), (0, 0)))
        else:
            ref = _reference_conv(op, inp, want[op.outputs[0]][1])
        got = values[op.outputs[0]].numpy()
        assert got.shape == ref.shape == (1,) + g.tensors[op.outputs[0]].shape[1:], op.name
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=op.name)
        checked += 1
    return checked


@pytest.mark.parametrize("padding,res", [("symmetric", 33), ("same", 33), ("same", 32)])
def test_numeric_fold_and_padding_semantics(padding, res):
    spec = small(padding, res, se=0.25, groups=2)
    m = build_keras(spec, seed=3)
    g = from_keras(m)
    n = check_numerics(m, g, res)
    assert n == sum(op.type in (ir.CONV, ir.DEPTHWISE) for op in g.ops)


def test_numeric_keras_mobilenetv2_pads():
    m = tf_keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), alpha=0.35)
    g = from_keras(m)
    n = check_numerics(m, g, 96)
    assert n == sum(op.type in (ir.CONV, ir.DEPTHWISE, ir.PAD) for op in g.ops)


# ------------------------------------------------------------------------- generic layers
def test_generic_model_lowering_and_fallback_blocks():
    inp = tf_keras.Input((20, 20, 3), name="img")
    a = L.Conv2D(8, 3, padding="same", activation="relu", name="c1")(inp)  # own activation, bias
    b = L.BatchNormalization(name="bn_after_relu")(a)  # conv has its own activation: not foldable
    c = L.Conv2D(8, 3, padding="valid", dilation_rate=2, use_bias=False, name="c2")(b)
    d = L.BatchNormalization(name="c2_bn")(c)  # folded
    e = L.ReLU(name="c2_relu")(d)  # folded (its own output being used twice does not matter)
    f = L.Add(name="sum")([e, e])
    f = L.ReLU(6.0, name="sum_relu")(f)  # fused into the add
    g1 = L.MaxPooling2D(3, 2, padding="same", name="mp")(f)
    g2 = L.AveragePooling2D(2, 2, name="ap")(f)
    h = L.Concatenate(name="cat")([g1[:, :8, :8, :], g2])  # slicing: a SlicingOpLambda layer
    h = L.SeparableConv2D(16, 3, padding="same", name="sep")(h)
    h = L.LeakyReLU(name="leaky")(h)
    h = L.UpSampling2D(name="up")(h)
    h = L.Flatten(name="flat")(h)
    h = L.Dropout(0.5, name="drop")(h)
    out = L.Dense(4, activation="softmax", name="fc")(h)
    model = tf_keras.Model(inp, out, name="generic")
    g = from_keras(model)
    by = {op.name: op for op in g.ops}
    assert by["c1"].activation == "relu" and by["c1"].biases == 8 and by["c1"].padding == (1, 1, 1, 1)
    assert by["bn_after_relu_mul"].type == ir.MUL and by["bn_after_relu"].type == ir.ADD
    assert by["c2"].biases == 8 and by["c2"].activation == "relu" and by["c2"].dilation == (2, 2)
    assert g.tensors[by["c2"].outputs[0]].shape == (1, 16, 16, 8) and "c2_relu" not in by
    assert by["sum"].activation == "relu6" and by["sum"].inputs == by["c2"].outputs * 2
    assert not by["sum"].attrs.get("broadcast")
    assert by["mp"].type == ir.MAX_POOL and by["mp"].padding == (0, 1, 0, 1) and by["mp"].kernel == (3, 3)
    assert by["ap"].type == ir.AVG_POOL and by["ap"].padding == (0, 0, 0, 0)
    assert by["cat"].type == ir.CONCAT and by["cat"].patchable
    sl = by["tf.__operators__.getitem"]  # slicing: kept as an opaque op with its sizes
    assert sl.type == "tf.__operators__.getitem" and not sl.patchable and sl.inputs == by["mp"].outputs
    assert by["sep_depthwise"].type == ir.DEPTHWISE and by["sep"].type == ir.CONV
    assert by["sep"].inputs == by["sep_depthwise"].outputs and by["sep"].weights == 16 * 16
    assert by["leaky"].type == ir.ACTIVATION and by["leaky"].activation == "leaky_relu"
    up = by["up"]
    assert up.type == "upsampling2d" and not up.patchable
    assert g.tensors[up.outputs[0]].shape == (1, 16, 16, 16) and up.in_channels == 16
    assert by["flat"].type == ir.RESHAPE and g.tensors[by["flat"].outputs[0]].shape == (1, 4096)
    assert by["fc"].type == ir.FULLY_CONNECTED and by["fc"].inputs == by["flat"].outputs  # dropout skipped
    assert by["fc_softmax"].type == ir.SOFTMAX and g.outputs == by["fc_softmax"].outputs
    # Names do not parse: one block per op, in order.
    assert [op.block for op in g.ops] == list(range(len(g.ops)))
    assert g.block_names[0] == g.ops[0].name


def test_relu_not_folded_when_conv_output_shared():
    inp = tf_keras.Input((8, 8, 4), name="input")
    x = L.Conv2D(4, 1, use_bias=False, name="block1_expand")(inp)
    y = L.ReLU(6.0, name="block1_expand_relu")(x)
    z = L.Add(name="block1_add")([x, y])
    g = from_keras(tf_keras.Model(inp, z))
    assert [op.type for op in g.ops] == [ir.CONV, ir.ACTIVATION, ir.ADD]
    assert g.ops[0].activation == "none" and g.ops[0].biases == 0
    assert g.ops[1].activation == "relu6" and all(op.block == 0 for op in g.ops)  # block1 -> dense index 0


def test_broadcast_multiply_and_itemsize():
    inp = tf_keras.Input((8, 8, 4), name="input")
    s = L.GlobalAveragePooling2D(keepdims=True, name="stem_pool")(inp)
    y = L.Multiply(name="stem_scale")([inp, s])
    g = from_keras(tf_keras.Model(inp, y), itemsize=4)
    mul = g.ops[-1]
    assert mul.type == ir.MUL and mul.attrs == {"broadcast": True} and not mul.patchable
    assert all(t.itemsize == 4 and t.dtype == "float32" for t in g.tensors.values())
    assert g.tensors["input"].nbytes == 8 * 8 * 4 * 4


# ------------------------------------------------------------------------- block names
@pytest.mark.parametrize("name,expected", [
    ("stem_conv", (0, "stem")), ("stem_conv_relu", (0, "stem")), ("block12_depthwise_pad", (12, "block12")),
    ("block3", (3, "block3")), ("head_conv_bn", (None, "head")), ("classifier", (None, "head")),
    ("Conv1", (0, "stem")), ("bn_Conv1", (0, "stem")), ("Conv1_relu", (0, "stem")),
    ("expanded_conv_depthwise_BN", (1, "expanded_conv")), ("block_1_pad", (2, "block_1")),
    ("block_16_project_BN", (17, "block_16")), ("Conv_1_bn", (None, "head")), ("out_relu", (None, "head")),
    ("global_average_pooling2d_3", (None, "head")), ("predictions", (None, "head")),
    ("expanded_conv_3/depthwise/BatchNorm", (4, "expanded_conv_3")), ("Conv/BatchNorm", (0, "stem")),
    ("mbv2/block3_expand_relu/Relu6;mbv2/block3_expand_bn/FusedBatchNormV3", (3, "block3")),
    ("model/block_2_add/add", (3, "block_2")), ("block3_expand/Conv2D", (3, "block3")),
    ("expanded_conv_3/squeeze_excite/Conv_1", (4, "expanded_conv_3")),
    ("dense_1", (None, "")), ("blockade", (None, "")), ("header", (None, "")), ("Conv2D", (None, "")),
    ("", (None, "")),
])
def test_block_of_name(name, expected):
    assert block_of_name(name) == expected


def test_block_of_name_prefix():
    assert block_of_name("head_net/block3_expand/Conv2D") == (None, "head")
    assert block_of_name("head_net/block3_expand/Conv2D", prefix="head_net") == (3, "block3")


def test_lower_keras_imports_no_tensorflow():
    code = "import sys, tfmcu.graph.from_keras, tfmcu.graph.names as m; m.block_of_name('block_1_pad'); " \
           "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------------- files
@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
def test_load_keras_roundtrip_and_errors(tmp_path):
    spec = small("symmetric", 33, se=0.25)
    m = build_keras(spec, seed=0)
    for ext in ("keras", "h5"):
        path = str(tmp_path / f"m.{ext}")
        m.save(path)
        assert_same_graph(load_keras(path), from_spec(spec))
    with pytest.raises(ir.GraphError, match="missing.keras"):
        load_keras(str(tmp_path / "missing.keras"))
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not a model")
    with pytest.raises(ir.GraphError) as e:
        load_keras(str(bad))
    assert "bad.h5" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ir.GraphError, match="tf_keras.Model"):
        from_keras(object())
