"""The weight-sharing supernet over the block spec's search space (MCUNetV2 / Once-for-All style), in TensorFlow.

One set of weights, those of the largest network the search space allows over a base spec (every stage at its
largest depth, every block at kernel 7, expansion 6 and width 1.0), serves every sub-network ``SearchSpace.decode``
can give:

* elastic kernel: a k x k depthwise kernel is the centre k x k of the 7 x 7 one;
* elastic expansion and width: a block uses the first channels of every weight (``sort_channels`` first puts the
  most important channels, by L1 norm, at the front: the hidden channels of each block, and each stage's output
  channels, which all its blocks and residual shortcuts share);
* elastic depth: a stage runs its first ``depth`` blocks;
* resolution: the same weights at any input size (images are resized per sub-network).

The stem and the head are the base spec's (not searched). Batch norm uses each batch's statistics while training;
before a sub-network is evaluated its statistics are re-computed (``calibrate``: the paper uses 20 batches of 64).
``extract`` builds the sub-network as an ordinary ``tf_keras`` model (``tfmcu.nets.keras_builder``) with the sliced
weights and calibrated statistics, ready for ``pipelines/train.py --init_weights`` to fine-tune, QAT and export.

The forward pass is eager TensorFlow on plain variables (each training step samples new sub-networks, and a traced
graph per sub-network would cost more than it saves on CPU).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfmcu.nets.keras_builder import BN_EPSILON, build_keras  # noqa: E402
from tfmcu.nets.spec import NetSpec, ResolvedBlock, SearchSpace, SpecError  # noqa: E402

MAX_KERNEL = 7

# BN statistics of one sub-network: layer name -> (mean, variance), each sliced to the sub-network's channels.
BNStats = dict[str, tuple[np.ndarray, np.ndarray]]


def largest_genome(space: SearchSpace, base: NetSpec) -> list[Any]:
    """The genome of the largest sub-network (every choice at its maximum)."""
    genome: list[Any] = [max(space.resolutions)]
    for _ in base.stages:
        genome.append(max(space.depths))
        for _ in range(max(space.depths)):
            genome += [max(space.kernels), max(space.expands), max(space.widths)]
    return genome


def block_slots(spec: NetSpec) -> list[tuple[ResolvedBlock, int, int]]:
    """Each resolved block of ``spec`` with its (stage, slot within the stage): the supernet weights it uses."""
    out, seen = [], {}
    for blk in spec.resolve():
        slot = seen.get(blk.stage, 0)
        seen[blk.stage] = slot + 1
        out.append((blk, blk.stage, slot))
    return out


class Supernet(tf.Module):
    """See the module docstring. ``base`` gives stem, head, stage channels and strides; ``space`` the choices."""

    def __init__(self, base: NetSpec, space: SearchSpace, seed: int = 0):
        super().__init__(name="supernet")
        if max(space.kernels) > MAX_KERNEL:
            raise SpecError(f"search space kernels {space.kernels}: at most {MAX_KERNEL}")
        for st in base.stages:
            for b in st.blocks:
                if b.se or b.groups != 1:
                    raise SpecError("the supernet has no squeeze-excite or grouped blocks (the search space has "
                                    "neither)")
        if min(space.expands) <= 1:
            raise SpecError(f"search space expansions {space.expands}: every block needs its 1x1 expansion (> 1)")
        self.base, self.space = base, space
        self.largest = space.decode(largest_genome(space, base), base)
        self.padding = base.padding
        keras_model = build_keras(self.largest, seed)  # its initialisers, so a sub-network starts like a Keras one
        weights = {w.name.split(":")[0]: w.numpy() for w in keras_model.weights}
        self.v: dict[str, tf.Variable] = {}

        def var(key: str, keras_name: str) -> None:
            self.v[key] = tf.Variable(weights[keras_name], name=key.replace("/", "_"), trainable=True)

        def conv_bn(key: str, keras: str, depthwise: bool = False) -> None:
            var(f"{key}/kernel", f"{keras}/{'depthwise_kernel' if depthwise else 'kernel'}")
            var(f"{key}_bn/gamma", f"{keras}_bn/gamma")
            var(f"{key}_bn/beta", f"{keras}_bn/beta")

        conv_bn("stem", "stem_conv")
        for blk, stage, slot in block_slots(self.largest):
            key = f"s{stage}b{slot}"
            if blk.has_expand:
                conv_bn(f"{key}_expand", f"{blk.name}_expand")
            conv_bn(f"{key}_depthwise", f"{blk.name}_depthwise", depthwise=True)
            conv_bn(f"{key}_project", f"{blk.name}_project")
        if self.largest.last_channels:
            conv_bn("head", "head_conv")
        if self.largest.head.num_classes:
            var("classifier/kernel", "classifier/kernel")
            var("classifier/bias", "classifier/bias")
        del keras_model

    # ------------------------------------------------------------------ sub-networks
    def check(self, sub: NetSpec) -> None:
        """Raises SpecError unless ``sub`` is a sub-network of this supernet."""
        big = {(s, k): b for b, s, k in block_slots(self.largest)}
        for blk, stage, slot in block_slots(sub):
            top = big.get((stage, slot))
            if (top is None or blk.kernel > MAX_KERNEL or blk.in_channels > top.in_channels
                    or blk.hidden > top.hidden or blk.out > top.out or blk.stride != top.stride
                    or (blk.has_expand and not top.has_expand)):
                raise SpecError(f"{blk.path} ({blk.in_channels}->{blk.hidden}->{blk.out}, k{blk.kernel}) is not "
                                f"inside the supernet")

    def sample(self, rng: Any) -> NetSpec:
        return self.space.sample(self.base, rng)

    # ------------------------------------------------------------------ forward
    def _conv(self, x: tf.Tensor, kernel: tf.Tensor, stride: int, depthwise: bool) -> tf.Tensor:
        k = int(kernel.shape[0])
        padding = "SAME"
        if self.padding == "symmetric" and k > 1:
            p = k // 2
            x = tf.pad(x, [[0, 0], [p, p], [p, p], [0, 0]])
            padding = "VALID"
        if depthwise:
            return tf.nn.depthwise_conv2d(x, kernel, [1, stride, stride, 1], padding)
        return tf.nn.conv2d(x, kernel, stride, padding)

    def _bn(self, x: tf.Tensor, key: str, channels: int, stats: BNStats | None, collect: BNStats | None,
            activation: str) -> tf.Tensor:
        gamma = self.v[f"{key}_bn/gamma"][:channels]
        beta = self.v[f"{key}_bn/beta"][:channels]
        if stats is not None:
            mean, var = (tf.constant(a, tf.float32) for a in stats[key])
        else:
            mean, var = tf.nn.moments(x, axes=[0, 1, 2])
            if collect is not None:
                collect[key] = (mean.numpy(), var.numpy())
        x = tf.nn.batch_normalization(x, mean, var, beta, gamma, BN_EPSILON)
        if activation == "relu6":
            return tf.nn.relu6(x)
        if activation == "relu":
            return tf.nn.relu(x)
        return x

    def __call__(self, x: tf.Tensor, sub: NetSpec, stats: BNStats | None = None,
                 collect: BNStats | None = None) -> tf.Tensor:
        """Logits of sub-network ``sub`` on ``x`` (NHWC at ``sub.resolution``). Batch norm: the batch's statistics
        (training; ``collect`` receives them per layer) or the given calibrated ``stats`` (evaluation)."""
        v = self.v
        st = sub.stem
        c = sub.stem_channels
        w = v["stem/kernel"][:, :, :sub.in_channels, :c]
        x = self._bn(self._conv(x, w, st.stride, False), "stem", c, stats, collect, st.activation)
        for blk, stage, slot in block_slots(sub):
            key = f"s{stage}b{slot}"
            shortcut = x
            if blk.has_expand:
                w = v[f"{key}_expand/kernel"][:, :, :blk.in_channels, :blk.hidden]
                x = self._bn(self._conv(x, w, 1, False), f"{key}_expand", blk.hidden, stats, collect,
                             blk.activation)
            lo = (MAX_KERNEL - blk.kernel) // 2
            w = v[f"{key}_depthwise/kernel"][lo:lo + blk.kernel, lo:lo + blk.kernel, :blk.hidden, :]
            x = self._bn(self._conv(x, w, blk.stride, True), f"{key}_depthwise", blk.hidden, stats, collect,
                         blk.activation)
            w = v[f"{key}_project/kernel"][:, :, :blk.hidden, :blk.out]
            x = self._bn(self._conv(x, w, 1, False), f"{key}_project", blk.out, stats, collect, "none")
            if blk.residual:
                x = x + shortcut
        if sub.last_channels:
            w = v["head/kernel"][:, :, :int(x.shape[-1]), :]
            x = self._bn(self._conv(x, w, 1, False), "head", sub.last_channels, stats, collect, sub.head.activation)
        x = tf.reduce_mean(x, axis=[1, 2])
        if sub.head.num_classes:
            x = tf.matmul(x, v["classifier/kernel"][:int(x.shape[-1]), :]) + v["classifier/bias"]
        return x

    # ------------------------------------------------------------------ batch norm
    def calibrate(self, sub: NetSpec, batches: Iterable[np.ndarray]) -> BNStats:
        """Batch-norm statistics of ``sub``: the mean over ``batches`` of each layer's batch mean and variance
        (images at ``sub.resolution``), as Once-for-All / MCUNetV2 re-calibrate sub-networks."""
        sums: dict[str, list[np.ndarray]] = {}
        n = 0
        for images in batches:
            collect: BNStats = {}
            self(tf.constant(images, tf.float32), sub, collect=collect)
            for key, (m, var) in collect.items():
                if key in sums:
                    sums[key][0] += m
                    sums[key][1] += var
                else:
                    sums[key] = [m.copy(), var.copy()]
            n += 1
        if not n:
            raise ValueError("calibrate: no batches")
        return {key: (m / n, var / n) for key, (m, var) in sums.items()}

    # ------------------------------------------------------------------ channel importance
    def sort_channels(self) -> None:
        """Reorder channels so the most important come first (L1 norm of the weights that read them): each
        block's hidden channels, then each stage's output channels (shared by its blocks and shortcuts). The
        largest network computes the same function before and after."""
        v = self.v
        slots = block_slots(self.largest)
        for blk, stage, slot in slots:
            key = f"s{stage}b{slot}"
            # hidden channel j: read by the depthwise (its own kernel) and the projection (input row j).
            importance = (np.abs(v[f"{key}_project/kernel"].numpy()).sum(axis=(0, 1, 3))
                          + np.abs(v[f"{key}_depthwise/kernel"].numpy()).sum(axis=(0, 1, 3)))
            order = np.argsort(-importance, kind="stable")
            self._permute(f"{key}_expand/kernel", 3, order)
            self._permute_bn(f"{key}_expand", order)
            self._permute(f"{key}_depthwise/kernel", 2, order)
            self._permute_bn(f"{key}_depthwise", order)
            self._permute(f"{key}_project/kernel", 2, order)
        for stage in range(len(self.largest.stages)):
            members = [(blk, s, k) for blk, s, k in slots if s == stage]
            readers = self._readers_of_stage(stage, slots)
            importance = sum(np.abs(v[name].numpy()).sum(axis=tuple(a for a in range(v[name].shape.rank)
                                                                    if a != axis))
                             for name, axis in readers)
            order = np.argsort(-importance, kind="stable")
            for blk, s, k in members:
                self._permute(f"s{s}b{k}_project/kernel", 3, order)
                self._permute_bn(f"s{s}b{k}_project", order)
            for name, axis in readers:
                self._permute(name, axis, order)

    def _readers_of_stage(self, stage: int, slots: Sequence[tuple[ResolvedBlock, int, int]]) -> list[tuple[str, int]]:
        """(variable, input axis) of every weight that reads stage ``stage``'s output channels."""
        readers = []
        for blk, s, k in slots:
            key = f"s{s}b{k}"
            first_of_next = s == stage + 1 and k == 0
            if (s == stage and k > 0) or first_of_next:
                readers.append((f"{key}_expand/kernel", 2))
        if stage == len(self.largest.stages) - 1:
            if self.largest.last_channels:
                readers.append(("head/kernel", 2))
            elif self.largest.head.num_classes:
                readers.append(("classifier/kernel", 0))
        return readers

    def _permute(self, name: str, axis: int, order: np.ndarray) -> None:
        var = self.v[name]
        var.assign(np.take(var.numpy(), order, axis=axis))

    def _permute_bn(self, key: str, order: np.ndarray) -> None:
        for part in ("gamma", "beta"):
            self._permute(f"{key}_bn/{part}", 0, order)

    # ------------------------------------------------------------------ export
    def extract(self, sub: NetSpec, stats: BNStats, seed: int = 0) -> Any:
        """``sub`` as a standalone ``tf_keras`` model (``build_keras``) with this supernet's weights sliced and the
        calibrated batch-norm ``stats``: it computes what ``self(x, sub, stats)`` computes."""
        self.check(sub)
        model = build_keras(sub, seed)
        v = self.v

        def set_conv_bn(layer: str, key: str, kernel: np.ndarray, channels: int) -> None:
            model.get_layer(layer).set_weights([kernel])
            mean, var = stats[key]
            model.get_layer(f"{layer}_bn").set_weights([v[f"{key}_bn/gamma"].numpy()[:channels],
                                                        v[f"{key}_bn/beta"].numpy()[:channels], mean, var])

        c = sub.stem_channels
        set_conv_bn("stem_conv", "stem", v["stem/kernel"].numpy()[:, :, :sub.in_channels, :c], c)
        for blk, stage, slot in block_slots(sub):
            key = f"s{stage}b{slot}"
            if blk.has_expand:
                set_conv_bn(f"{blk.name}_expand", f"{key}_expand",
                            v[f"{key}_expand/kernel"].numpy()[:, :, :blk.in_channels, :blk.hidden], blk.hidden)
            lo = (MAX_KERNEL - blk.kernel) // 2
            set_conv_bn(f"{blk.name}_depthwise", f"{key}_depthwise",
                        v[f"{key}_depthwise/kernel"].numpy()[lo:lo + blk.kernel, lo:lo + blk.kernel, :blk.hidden, :],
                        blk.hidden)
            set_conv_bn(f"{blk.name}_project", f"{key}_project",
                        v[f"{key}_project/kernel"].numpy()[:, :, :blk.hidden, :blk.out], blk.out)
        feature = block_slots(sub)[-1][0].out
        if sub.last_channels:
            set_conv_bn("head_conv", "head", v["head/kernel"].numpy()[:, :, :feature, :], sub.last_channels)
            feature = sub.last_channels
        if sub.head.num_classes:
            model.get_layer("classifier").set_weights([v["classifier/kernel"].numpy()[:feature],
                                                       v["classifier/bias"].numpy()])
        return model

    # ------------------------------------------------------------------ training
    def loss(self, images: tf.Tensor, labels: tf.Tensor, subs: Sequence[NetSpec], label_smoothing: float = 0.0,
             global_batch: int | None = None) -> tf.Tensor:
        """Cross-entropy of every sub-network in ``subs`` (images resized to each one's resolution), averaged over
        the sub-networks and over ``global_batch`` samples (default: this batch; a replica of a distributed step
        passes the global batch, so the replicas' losses sum to the mean)."""
        total = 0.0
        n = int(global_batch or images.shape[0])
        for sub in subs:
            x = images
            if int(images.shape[1]) != sub.resolution:
                x = tf.image.resize(images, (sub.resolution, sub.resolution), method="bilinear")
            logits = self(x, sub)
            onehot = tf.one_hot(labels, int(logits.shape[-1]))
            total += tf.reduce_sum(tf.keras.losses.categorical_crossentropy(
                onehot, logits, from_logits=True, label_smoothing=label_smoothing)) / n
        return total / len(subs)

    def train_step(self, images: Any, labels: Any, subs: Sequence[NetSpec], optimizer: Any,
                   label_smoothing: float = 0.0, strategy: Any = None, global_batch: int | None = None) -> float:
        """One step: the gradients of every sub-network in ``subs``, averaged, applied once. Returns the mean loss.

        With a ``tf.distribute`` strategy (variables and optimizer created in its scope, ``images`` / ``labels``
        per-replica values of a distributed data set, ``global_batch`` the global batch), each replica computes its
        share and the optimizer all-reduces the gradients."""
        variables = list(self.v.values())

        def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = self.loss(x, y, subs, label_smoothing, global_batch)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients([(g, w) for g, w in zip(grads, variables) if g is not None])
            return loss

        if strategy is None:
            return float(step(images, labels))
        per_replica = strategy.run(step, args=(images, labels))
        return float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))

    def checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(**{k.replace("/", "__"): var for k, var in self.v.items()})

