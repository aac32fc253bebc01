"""build_keras: shapes, parameter counts, layer names and structure per spec field (no training)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tf_keras  # noqa: E402

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_spec import from_spec  # noqa: E402
from tfmcu.nets.keras_builder import BN_EPSILON, BN_MOMENTUM, build_keras  # noqa: E402
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec  # noqa: E402

L = tf_keras.layers


def tiny(**kw) -> NetSpec:
    """res 16, stem 8, one block (expand 2, SE 0.25, residual), head 16, 10 classes."""
    args = dict(name="tiny", resolution=16, stem=StemSpec(8, 3, 2),
                stages=[StageSpec([BlockSpec(8, kernel=3, expand=2, stride=1, se=0.25)])],
                head=HeadSpec(16, "avg", 10))
    args.update(kw)
    return NetSpec(**args)


def small(padding="same", res=32, se=0.0, groups=1, head=None) -> NetSpec:
    stages = [
        StageSpec([BlockSpec(16, kernel=3, expand=1, stride=1)]),
        StageSpec([BlockSpec(24, kernel=5, expand=4, stride=2, se=se, groups=groups),
                   BlockSpec(24, kernel=7, expand=3, stride=1, se=se, groups=groups)]),
        StageSpec([BlockSpec(32, kernel=3, expand=6, stride=2, activation="relu")]),
    ]
    return NetSpec("small", res, padding=padding, stem=StemSpec(16, 3, 2), stages=stages,
                   head=head or HeadSpec(64, "avg", 5))


def by_name(model):
    return {layer.name: layer for layer in model.layers}


def test_tiny_param_count_by_hand():
    m = build_keras(tiny(), seed=0)
    # stem 216+32(BN) | expand 128+64 | dw 144+64 | SE reduce 16*2+2, expand 2*16+16 | project 128+32 |
    # head 128+64 | classifier 160+10
    assert m.count_params() == 1252
    assert m.output_shape == (None, 10)
    assert m.input_shape == (None, 16, 16, 3)
    # Non-trainable = BN moving mean/variance.
    non_trainable = sum(int(np.prod(w.shape)) for w in m.non_trainable_weights)
    assert non_trainable == 2 * (8 + 16 + 16 + 8 + 16)


@pytest.mark.parametrize("padding,res,expect_hw", [("same", 32, 4), ("same", 33, 5), ("symmetric", 33, 5),
                                                  ("symmetric", 32, 4)])
def test_output_shapes_both_paddings(padding, res, expect_hw):
    head = HeadSpec(0, "none", 0)
    m = build_keras(small(padding, res, head=head), seed=1)
    assert m.output_shape == (None, expect_hw, expect_hw, 32)
    g = from_spec(small(padding, res, head=head))
    assert g.tensors[g.outputs[0]].shape == (1, expect_hw, expect_hw, 32)
    m2 = build_keras(small(padding, res), seed=1)
    assert m2.output_shape == (None, 5)


def test_layer_names_match_ir_ops():
    spec = small("symmetric", 33, se=0.25, groups=2)
    m = build_keras(spec, seed=0)
    names = by_name(m)
    g = from_spec(spec)
    for op in g.ops:
        assert op.name in names, op.name
    for op in g.ops:
        if op.type in (ir.CONV, ir.DEPTHWISE):
            assert (f"{op.name}_bn" in names) == ("_se_" not in op.name), op.name
    assert names["stem_conv_relu"].max_value == 6.0
    assert names["block4_expand_relu"].max_value is None  # activation "relu"
    assert "block1_project_relu" not in names  # linear bottleneck
    assert isinstance(names["head_pool"], L.GlobalAveragePooling2D)
    assert isinstance(names["classifier"], L.Dense)
    assert names["classifier"].activation.__name__ == "linear"  # logits


def test_symmetric_padding_layers():
    spec = small("symmetric", 33)
    names = by_name(build_keras(spec, seed=0))
    pads = {n: layer for n, layer in names.items() if isinstance(layer, L.ZeroPadding2D)}
    assert set(pads) == {"stem_conv_pad", "block1_depthwise_pad", "block2_depthwise_pad", "block3_depthwise_pad",
                         "block4_depthwise_pad"}
    assert pads["block2_depthwise_pad"].padding == ((2, 2), (2, 2))
    assert pads["block3_depthwise_pad"].padding == ((3, 3), (3, 3))
    for n in pads:
        assert names[n[: -len("_pad")]].padding == "valid"
    assert names["block2_expand"].padding == "valid"  # 1x1: no pad layer
    same = by_name(build_keras(small("same", 33), seed=0))
    assert not any(isinstance(layer, L.ZeroPadding2D) for layer in same.values())
    assert same["block2_depthwise"].padding == "same"


def test_se_groups_residual_structure():
    spec = small("same", 32, se=0.25, groups=2)
    m = build_keras(spec, seed=0)
    names = by_name(m)
    for blk in spec.resolve():
        p = blk.name
        assert (f"{p}_add" in names) == blk.residual
        assert (f"{p}_expand" in names) == blk.has_expand
        if blk.se_channels:
            sq = names[f"{p}_se_squeeze"]
            assert isinstance(sq, L.GlobalAveragePooling2D) and sq.keepdims
            assert names[f"{p}_se_reduce"].filters == blk.se_channels
            assert names[f"{p}_se_reduce"].activation.__name__ == "relu"
            assert names[f"{p}_se_expand"].filters == blk.hidden
            assert names[f"{p}_se_expand"].activation.__name__ == "sigmoid"
            assert isinstance(names[f"{p}_se_excite"], L.Multiply)
    assert [b.residual for b in spec.resolve()] == [True, False, True, False]
    exp = names["block3_expand"]
    assert exp.groups == 2 and tuple(exp.kernel.shape) == (1, 1, 12, 72)
    proj = names["block3_project"]
    assert proj.groups == 2 and tuple(proj.kernel.shape) == (1, 1, 36, 24)
    assert not exp.use_bias and names["block3_se_reduce"].use_bias


def test_param_counts_match_ir_weights():
    spec = small("symmetric", 33, se=0.25, groups=2)
    m = build_keras(spec, seed=0)
    g = from_spec(spec)
    kernels = sum(int(np.prod(layer.kernel.shape)) if hasattr(layer, "kernel")
                  else int(np.prod(layer.depthwise_kernel.shape)) if hasattr(layer, "depthwise_kernel") else 0
                  for layer in m.layers)
    assert kernels == sum(op.weights for op in g.ops)
    bn_channels = sum(int(layer.gamma.shape[0]) for layer in m.layers if isinstance(layer, L.BatchNormalization))
    own_bias = sum(int(layer.bias.shape[0]) for layer in m.layers if getattr(layer, "use_bias", False)
                   and getattr(layer, "bias", None) is not None)
    # Folded BN gives every conv a bias in the IR.
    assert bn_channels + own_bias == sum(op.biases for op in g.ops)
    assert m.count_params() == kernels + own_bias + 4 * bn_channels


def test_batchnorm_settings_and_bias():
    names = by_name(build_keras(small(), seed=0))
    bns = [layer for layer in names.values() if isinstance(layer, L.BatchNormalization)]
    assert bns and all(b.momentum == BN_MOMENTUM == 0.999 and b.epsilon == BN_EPSILON == 1e-3 for b in bns)
    assert all(not names[b.name[: -len("_bn")]].use_bias for b in bns)


def test_deterministic_init():
    a = build_keras(small(se=0.25), seed=7).get_weights()
    b = build_keras(small(se=0.25), seed=7).get_weights()
    c = build_keras(small(se=0.25), seed=8).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def test_forward_pass_runs():
    spec = small("symmetric", 33, se=0.25, groups=2)
    m = build_keras(spec, seed=0)
    y = m(np.random.default_rng(0).normal(size=(2, 33, 33, 3)).astype("float32"), training=False)
    assert y.shape == (2, 5) and np.all(np.isfinite(y.numpy()))


def test_activation_none_and_relu():
    spec = small()
    spec.stem.activation = "none"
    spec.head.activation = "relu"
    names = by_name(build_keras(spec, seed=0))
    assert "stem_conv_relu" not in names and "stem_conv_bn" in names
    assert names["head_conv_relu"].max_value is None
