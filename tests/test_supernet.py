"""The weight-sharing supernet (tfmcu.nets.supernet): sub-networks share the largest network's weights, an
extracted sub-network computes what the supernet computes for it, channel sorting keeps the function, and
training steps learn."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, SearchSpace, SpecError, StageSpec, StemSpec

tf = pytest.importorskip("tensorflow")

from tfmcu.nets import supernet as sn  # noqa: E402

SPACE = SearchSpace(kernels=(3, 5, 7), expands=(3, 4, 6), depths=(1, 2), widths=(0.5, 0.75, 1.0),
                    resolutions=(24, 32))


def base_spec(last_channels: int = 0, padding: str = "same") -> NetSpec:
    return NetSpec(name="base", resolution=32, padding=padding, stem=StemSpec(8, kernel=3, stride=2),
                   stages=[StageSpec([BlockSpec(16, stride=2)]), StageSpec([BlockSpec(24, stride=2)])],
                   head=HeadSpec(last_channels=last_channels, num_classes=5)).validate()


def images(n: int, res: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, res, res, 3)).astype(np.float32)


@pytest.mark.parametrize("last_channels,padding", [(0, "same"), (40, "symmetric")])
def test_extracted_subnet_computes_what_the_supernet_computes(last_channels, padding):
    net = sn.Supernet(base_spec(last_channels, padding), SPACE, seed=1)
    rng = random.Random(3)
    subs = [net.largest.replace(resolution=32)] + [net.sample(rng) for _ in range(2)]
    for sub in subs:
        net.check(sub)
        stats = net.calibrate(sub, [images(16, sub.resolution, s) for s in range(3)])
        x = images(4, sub.resolution, 9)
        want = net(tf.constant(x), sub, stats=stats).numpy()
        got = net.extract(sub, stats)(x, training=False).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_channel_sorting_keeps_the_largest_network():
    net = sn.Supernet(base_spec(), SPACE, seed=2)
    big = net.largest.replace(resolution=32)
    x = tf.constant(images(8, 32, 1))
    before = net(x, big).numpy()  # batch statistics: per-channel, so a permutation does not change the result
    net.sort_channels()
    np.testing.assert_allclose(net(x, big).numpy(), before, rtol=1e-4, atol=1e-4)
    # The front channels are now the heaviest: each block's hidden channels by L1 importance, descending.
    w = np.abs(net.v["s0b0_project/kernel"].numpy()).sum(axis=(0, 1, 3)) + \
        np.abs(net.v["s0b0_depthwise/kernel"].numpy()).sum(axis=(0, 1, 3))
    assert w[0] >= w[len(w) // 2] >= w[-1]


def test_sub_networks_share_weights_and_training_learns():
    from tfmcu.train.qat import make_optimizer

    net = sn.Supernet(base_spec(), SPACE, seed=4)
    x = tf.constant(images(32, 32, 5))
    y = tf.constant(np.arange(32) % 5)
    rng = random.Random(0)
    opt = make_optimizer(0.05, 0.9, False, 4e-5, 40)
    first = last = None
    for step in range(25):
        loss = net.train_step(x, y, [net.largest.replace(resolution=32), net.sample(rng)], opt)
        first = loss if first is None else first
        last = loss
    assert last < 0.7 * first, (first, last)
    # A small sub-network reads the same variables (a prefix of them).
    small = SPACE.decode([24, 1, 3, 3, 0.5, 3, 3, 0.5, 1, 3, 3, 0.5, 3, 3, 0.5], net.base)
    assert small.stages[0].blocks[0].kernel == 3
    before = net(tf.constant(images(2, 24, 1)), small).numpy()
    net.v["s0b0_depthwise/kernel"].assign_add(tf.ones_like(net.v["s0b0_depthwise/kernel"]))
    assert not np.allclose(net(tf.constant(images(2, 24, 1)), small).numpy(), before)


def test_outside_the_supernet_is_refused():
    net = sn.Supernet(base_spec(), SPACE, seed=0)
    too_deep = net.base.replace(stages=[StageSpec([BlockSpec(16, stride=2)] * 3), net.base.stages[1]])
    with pytest.raises(SpecError, match="not inside the supernet"):
        net.check(too_deep)
    wide = net.base.replace(stages=[StageSpec([BlockSpec(16, stride=2, expand=8)]), net.base.stages[1]])
    with pytest.raises(SpecError, match="not inside the supernet"):
        net.check(wide)
    with pytest.raises(SpecError, match="expansion"):
        sn.Supernet(base_spec(), SearchSpace(expands=(1, 3)), seed=0)
