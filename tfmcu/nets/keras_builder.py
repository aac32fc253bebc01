"""Build a ``NetSpec`` as a ``tf_keras`` functional model.

One small function per block, every layer named after its block (the Keras applications style), with exactly the
op names ``tfmcu.graph.from_spec`` gives, so that ``tfmcu.graph.from_keras.from_keras(build_keras(spec))`` equals
``tfmcu.graph.from_spec.from_spec(spec)`` op by op:

* a conv is ``<name>`` (``stem_conv``, ``block3_expand``, ``block3_depthwise``, ``block3_project``, ``head_conv``),
  its batch norm ``<name>_bn``, its activation ``<name>_relu`` (ReLU or ReLU6) and, with symmetric padding,
  its explicit padding ``<name>_pad`` (``ZeroPadding2D`` of k//2 on each side, then a VALID conv);
* squeeze-excite is ``block{i}_se_squeeze`` / ``_se_reduce`` / ``_se_expand`` / ``_se_excite``;
* the residual is ``block{i}_add``; the head is ``head_conv``, ``head_pool`` and ``classifier`` (logits), or for a
  yolo head, per scale ``i`` (``NetSpec.detection_scales``), ``head_scale{i}_conv`` (with ``head_channels``) and
  ``head_scale{i}_pred``: a linear 1x1 conv with bias whose output is a model output, ``[1, S, S, A * (5 + K)]``
  raw logits. Outputs are ordered by scale, coarsest first: one tensor for 1 scale, ``[stride 32, stride 16]``
  for 2 (the finest last). The TFLite converter does not keep that order in the .tflite subgraph's outputs (it
  gave ``[stride 16, stride 32]`` with TF 2.21); its ``serving_default`` signature names each output
  ``head_scale{i}_pred``, and the grid sizes differ, so read a .tflite's scales by name or by shape.

Channel counts come from ``NetSpec.resolve`` only, so the builder and the IR agree by construction.
"""

from __future__ import annotations

import math
import os

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tf_keras  # noqa: E402

from tfmcu.nets.spec import YOLO_FIELDS, NetSpec, ResolvedBlock  # noqa: E402

layers = tf_keras.layers

# Keras MobileNetV2 batch-norm settings.
BN_MOMENTUM = 0.999
BN_EPSILON = 1e-3


class _Seeds:
    """Hands every initializer its own seed, derived from the model seed, so a build is deterministic."""

    def __init__(self, seed: int | None):
        self.seed = seed
        self.count = 0

    def _next(self) -> int | None:
        if self.seed is None:
            return None
        self.count += 1
        return self.seed * 1009 + self.count

    def conv(self) -> tf_keras.initializers.Initializer:
        return tf_keras.initializers.GlorotUniform(seed=self._next())

    def dense(self) -> tf_keras.initializers.Initializer:
        return tf_keras.initializers.GlorotUniform(seed=self._next())


def _act(x, activation: str, name: str):
    if activation == "relu6":
        return layers.ReLU(6.0, name=f"{name}_relu")(x)
    if activation == "relu":
        return layers.ReLU(name=f"{name}_relu")(x)
    return x


def _pad(x, spec: NetSpec, kernel: int, name: str) -> tuple[object, str]:
    """Explicit k//2 zero padding for the symmetric convention; returns (x, Keras padding of the conv)."""
    if spec.padding == "same":
        return x, "same"
    p = kernel // 2
    if p > 0:
        x = layers.ZeroPadding2D(((p, p), (p, p)), name=f"{name}_pad")(x)
    return x, "valid"


def conv_bn(x, spec: NetSpec, seeds: _Seeds, name: str, filters: int, kernel: int = 1, stride: int = 1,
            activation: str = "relu6", groups: int = 1):
    """[pad] -> Conv2D (no bias) -> BN -> [ReLU/ReLU6], all named after ``name``."""
    x, padding = _pad(x, spec, kernel, name)
    x = layers.Conv2D(filters, kernel, strides=stride, padding=padding, groups=groups, use_bias=False,
                      kernel_initializer=seeds.conv(), name=name)(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=f"{name}_bn")(x)
    return _act(x, activation, name)


def depthwise_bn(x, spec: NetSpec, seeds: _Seeds, name: str, kernel: int, stride: int, activation: str):
    """[pad] -> DepthwiseConv2D (no bias) -> BN -> [ReLU/ReLU6]."""
    x, padding = _pad(x, spec, kernel, name)
    x = layers.DepthwiseConv2D(kernel, strides=stride, padding=padding, use_bias=False,
                               depthwise_initializer=seeds.conv(), name=name)(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=f"{name}_bn")(x)
    return _act(x, activation, name)


def squeeze_excite(x, seeds: _Seeds, prefix: str, se_channels: int):
    """GAP (keepdims) -> 1x1 conv ReLU -> 1x1 conv sigmoid -> channel-wise Multiply."""
    channels = int(x.shape[-1])
    s = layers.GlobalAveragePooling2D(keepdims=True, name=f"{prefix}_se_squeeze")(x)
    s = layers.Conv2D(se_channels, 1, activation="relu", use_bias=True, kernel_initializer=seeds.conv(),
                      name=f"{prefix}_se_reduce")(s)
    s = layers.Conv2D(channels, 1, activation="sigmoid", use_bias=True, kernel_initializer=seeds.conv(),
                      name=f"{prefix}_se_expand")(s)
    return layers.Multiply(name=f"{prefix}_se_excite")([x, s])


def inverted_residual(x, spec: NetSpec, seeds: _Seeds, blk: ResolvedBlock):
    """[1x1 expand] -> kxk depthwise -> [SE] -> 1x1 linear project [+ shortcut]."""
    p = blk.name
    shortcut = x
    if blk.has_expand:
        x = conv_bn(x, spec, seeds, f"{p}_expand", blk.hidden, 1, 1, blk.activation, groups=blk.groups)
    x = depthwise_bn(x, spec, seeds, f"{p}_depthwise", blk.kernel, blk.stride, blk.activation)
    if blk.se_channels:
        x = squeeze_excite(x, seeds, p, blk.se_channels)
    x = conv_bn(x, spec, seeds, f"{p}_project", blk.out, 1, 1, "none", groups=blk.groups)
    if blk.residual:
        x = layers.Add(name=f"{p}_add")([shortcut, x])
    return x


def head(x, spec: NetSpec, seeds: _Seeds):
    """The classify head: [last 1x1 conv] -> [global average pool] -> [Dense logits]."""
    h = spec.head
    if spec.last_channels:
        x = conv_bn(x, spec, seeds, "head_conv", spec.last_channels, 1, 1, h.activation)
    if h.pooling == "avg":
        x = layers.GlobalAveragePooling2D(name="head_pool")(x)
    if h.num_classes:
        x = layers.Dense(h.num_classes, kernel_initializer=seeds.dense(), name="classifier")(x)
    return x


OBJ_PRIOR = 0.01  # a yolo head's objectness starts at this probability (its bias at logit(OBJ_PRIOR))


def yolo_head(features: list, spec: NetSpec, seeds: _Seeds) -> list:
    """Per scale (coarsest first): [1x1 conv + activation] -> linear 1x1 conv with bias to A * (5 + K) logits.

    ``features[b]`` is the output of block ``b`` (0 = the stem). The objectness biases start at logit(``OBJ_PRIOR``)
    (RetinaNet's prior, YOLOv5's bias init): an untrained head says "nothing here" everywhere, so the many background
    anchors do not swamp the first steps' gradients; the other biases start at 0."""
    h = spec.head
    outputs = []
    fields = len(YOLO_FIELDS) + h.num_classes
    for sc in spec.detection_scales():
        x = features[sc.block]
        if h.head_channels:
            x = conv_bn(x, spec, seeds, f"{sc.name}_conv", h.head_channels, 1, 1, h.activation)
        bias = np.zeros(sc.channels, np.float32)
        bias[YOLO_FIELDS.index("obj")::fields] = math.log(OBJ_PRIOR / (1 - OBJ_PRIOR))
        outputs.append(layers.Conv2D(sc.channels, 1, use_bias=True, kernel_initializer=seeds.conv(),
                                     bias_initializer=tf_keras.initializers.Constant(bias),
                                     name=f"{sc.name}_pred")(x))
    return outputs


def build_keras(spec: NetSpec, seed: int | None = None) -> tf_keras.Model:
    """The spec as a functional ``tf_keras.Model`` with input ``(res, res, in_channels)`` and logits output(s).

    A yolo head gives one output per scale (a list for 2 scales, coarsest first; see the module docstring).
    ``seed`` makes the initial weights deterministic (each layer gets its own derived seed); ``None`` is random.
    """
    spec.validate()
    seeds = _Seeds(seed)
    inputs = tf_keras.Input((spec.resolution, spec.resolution, spec.in_channels), name="input")
    st = spec.stem
    x = conv_bn(inputs, spec, seeds, "stem_conv", spec.stem_channels, st.kernel, st.stride, st.activation)
    features = [x]
    for blk in spec.resolve():
        x = inverted_residual(x, spec, seeds, blk)
        features.append(x)
    if spec.head.type == "yolo":
        outputs = yolo_head(features, spec, seeds)
        return tf_keras.Model(inputs, outputs[0] if len(outputs) == 1 else outputs, name=spec.name)
    return tf_keras.Model(inputs, head(x, spec, seeds), name=spec.name)


def _channels(lo: int, hi: int | None, name: str):
    """A Lambda layer taking channels ``lo:hi`` of a [1, N, C] tensor (a STRIDED_SLICE in the .tflite)."""
    return layers.Lambda(lambda t: t[:, :, lo:hi], name=name)


def _flatten(rows: int, fields: int, name: str):
    """[1, S, S, A * F] -> [1, S * S * A, F] as one RESHAPE with a constant shape (Keras' Reshape layer reads the batch
    size at run time: SHAPE, STRIDED_SLICE and PACK before the RESHAPE in the .tflite)."""
    return layers.Lambda(lambda t: tf_keras.backend.reshape(t, (-1, rows, fields)), name=name)


def detector_export_model(model: tf_keras.Model, spec: NetSpec) -> tf_keras.Model:
    """``model`` (``build_keras(spec)`` of a yolo ``spec``: raw outputs [1, S, S, A * (5 + K)] per scale, coarsest
    first) with the decode layers that turn it into what ``DETECTION_POSTPROCESS`` takes, two outputs in order:

    * ``boxes`` [1, N, 4]: the box encodings (t_y, t_x, t_h, t_w) of every anchor, raw;
    * ``scores`` [1, N, K]: ``sigmoid(obj) * sigmoid(class logit)`` per anchor and class.

    Per scale a reshape to [1, S * S * A, 5 + K] (``head_scale{i}_flat``), the scales concatenated (``head_concat``,
    2 scales only), so anchor ``n`` is row ``n`` of ``tfmcu.nets.anchors.anchor_grid(spec)``. In the .tflite:
    RESHAPE, CONCATENATION, STRIDED_SLICE, LOGISTIC and MUL, all int8 (TFLM has each). The weights are ``model``'s
    (the layers are shared, not copied)."""
    scales = spec.detection_scales()
    if not scales:
        raise ValueError(f"{spec.name}: detector_export_model needs a yolo head (head.type 'yolo')")
    raw = list(model.outputs)
    if len(raw) != len(scales):
        raise ValueError(f"{spec.name}: the model has {len(raw)} outputs, the spec {len(scales)} detection scales")
    fields = 5 + spec.head.num_classes
    flat = [_flatten(sc.grid * sc.grid * len(sc.anchors), fields, f"{sc.name}_flat")(x) for sc, x in zip(scales, raw)]
    x = flat[0] if len(flat) == 1 else layers.Concatenate(axis=1, name="head_concat")(flat)
    boxes = _channels(0, 4, "boxes")(x)
    obj = layers.Activation("sigmoid", name="head_obj_sigmoid")(_channels(4, 5, "head_obj")(x))
    cls = layers.Activation("sigmoid", name="head_class_sigmoid")(_channels(5, None, "head_class")(x))
    scores = layers.Multiply(name="scores")([obj, cls])
    return tf_keras.Model(model.inputs, [boxes, scores], name=f"{model.name}_export")
