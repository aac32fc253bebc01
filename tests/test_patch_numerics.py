"""Numerical proof of the scheduler's region math with float Keras models.

For random specs (k in {1,3,5,7}, s in {1,2}, residuals, both padding conventions) the patch stage is run patch by
patch: every op reads exactly the input region the scheduler says, adds zero padding only where the scheduler says
the window runs past the feature-map border, and applies the layer's own weights with a VALID convolution. The
stitched stage output must equal the full-layer Keras result.
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_spec import from_spec  # noqa: E402
from tfmcu.nets.keras_builder import build_keras  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec  # noqa: E402


def random_spec(rng: random.Random, padding: str) -> NetSpec:
    stages = []
    for _ in range(rng.randint(2, 3)):
        c = rng.choice([4, 8])
        blocks = [BlockSpec(c, kernel=rng.choice([1, 3, 5, 7]), expand=rng.choice([1, 2, 3]),
                            stride=rng.choice([1, 2]) if i == 0 else 1) for i in range(rng.randint(1, 3))]
        stages.append(StageSpec(blocks))
    return NetSpec(name=f"rand_{padding}", resolution=rng.choice([23, 32, 37, 48]), padding=padding,
                   stem=StemSpec(8, kernel=rng.choice([1, 3, 5, 7]), stride=rng.choice([1, 2])), stages=stages,
                   head=HeadSpec(0, num_classes=0, pooling="none"))


def randomize_bn(model: "tf_keras.Model", rng: np.random.Generator) -> None:
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.3, beta.shape),
                               rng.normal(0, 0.3, mean.shape), rng.uniform(0.5, 1.5, var.shape)])


def apply_op(model: "tf_keras.Model", op: ir.Op, xs: list[np.ndarray]) -> np.ndarray:
    """The float op on already padded patch inputs, VALID padding, then its BN and activation layers."""
    if op.type == ir.ADD:
        return model.get_layer(op.name)([tf.constant(x) for x in xs]).numpy()
    if op.type == ir.PAD:
        return xs[0]
    layer = model.get_layer(op.name)
    x = tf.constant(xs[0])
    strides = (1, *op.stride, 1)
    if op.type == ir.DEPTHWISE:
        y = tf.nn.depthwise_conv2d(x, layer.depthwise_kernel, strides, "VALID")
    elif op.type == ir.CONV:
        y = tf.nn.conv2d(x, layer.kernel, strides, "VALID")
    else:
        raise AssertionError(f"unexpected op {op.type}")
    if layer.use_bias:
        y = y + layer.bias
    names = {layer.name for layer in model.layers}
    if f"{op.name}_bn" in names:
        y = model.get_layer(f"{op.name}_bn")(y, training=False)
    if f"{op.name}_relu" in names:
        y = model.get_layer(f"{op.name}_relu")(y)
    return y.numpy()


def run_patched(model, graph: ir.Graph, s: scheduler.PatchSchedule, image: np.ndarray) -> np.ndarray:
    out_t = s.stage_outputs[0]
    result = np.full(graph.tensors[out_t].shape, np.nan, np.float32)
    for i, j in s.patch_iter():
        rows, cols = s.rows[i], s.cols[j]
        buf = {t: image[:, slice(*rows.need[t]), slice(*cols.need[t]), :] for t in s.stage_inputs}
        for k in s.stage:
            op = graph.ops[k]
            reg = s.region(k, (i, j))
            xs = []
            for t, (rr, cc, (pt, pb, pl, pr)) in zip(op.inputs, reg.reads):
                r0, c0 = rows.need[t][0], cols.need[t][0]
                x = buf[t][:, rr[0] - r0:rr[1] - r0, cc[0] - c0:cc[1] - c0, :]
                assert x.shape[1:3] == (rr[1] - rr[0], cc[1] - cc[0]), "patch buffer too small"
                xs.append(np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0))))
            y = apply_op(model, op, xs)
            (o0, o1), (p0, p1) = reg.out
            assert y.shape[1:3] == (o1 - o0, p1 - p0), f"{op.name}: region math gives wrong output size"
            buf[op.outputs[0]] = y
        (o0, o1), (p0, p1) = s.region(s.stage[-1], (i, j)).out
        result[:, o0:o1, p0:p1, :] = buf[out_t]
    return result


@pytest.mark.parametrize("seed", range(10))
def test_patched_stage_equals_full_layer(seed):
    rng = random.Random(seed)
    spec = random_spec(rng, "same" if seed % 2 == 0 else "symmetric")
    graph = from_spec(spec)
    n = rng.randint(1, scheduler.max_stage_blocks(graph))
    out_t = scheduler.check_stage(graph, scheduler.stage_ops(graph, n_blocks=n))[1][0]
    oh, ow = graph.tensors[out_t].hw
    grid = (rng.randint(1, min(4, oh)), rng.randint(1, min(4, ow)))
    s = scheduler.schedule(graph, grid, n_blocks=n)

    tf_keras.utils.set_random_seed(seed)
    model = build_keras(spec, seed=seed)
    randomize_bn(model, np.random.default_rng(seed))
    image = np.random.default_rng(seed).normal(size=(1, spec.resolution, spec.resolution, 3)).astype(np.float32)
    layer_out = {op.outputs[0]: op.name for op in graph.ops}[out_t]
    # The Keras tensor for the stage output: the op's last fused layer (activation, BN or the layer itself).
    names = {layer.name for layer in model.layers}
    tail = next(n for n in (f"{layer_out}_relu", f"{layer_out}_bn", layer_out) if n in names)
    ref_model = tf_keras.Model(model.inputs, model.get_layer(tail).output)
    ref = ref_model(image, training=False).numpy()
    got = run_patched(model, graph, s, image)
    assert not np.isnan(got).any(), "some output pixels were never written"
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
