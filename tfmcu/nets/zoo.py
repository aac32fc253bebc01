"""A zoo of int8 .tflite models built and converted here, covering what real models contain.

Used by the tests (verify suite) and by ``make bench``. Random weights, with batch-norm statistics calibrated on
random data (one training-mode pass with momentum 0) so activations neither vanish nor saturate and int8 outputs
really vary from input to input — a bit-exactness check on constant outputs would prove nothing.

Each entry says which features it covers; ``build(name, cache_dir)`` converts once and caches the bytes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tfmcu.nets.convert import calibrate_batchnorm, random_representative, to_int8_tflite
from tfmcu.nets.presets import get_preset
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec
from tfmcu.tflite import schema as ts

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@dataclass
class ZooModel:
    name: str
    features: list[str]
    make: Callable[[], Any]  # -> tf_keras.Model
    float_io: bool = False
    per_tensor: bool = False
    patch_blocks: int | None = None  # a sensible patch stage for tests (None: use patch_ops)
    patch_ops: int | None = None
    tags: list[str] = field(default_factory=list)
    # the range of the float inputs its batch norms and its int8 conversion see ([0, 255] for Keras' preprocessing)
    input_range: tuple[float, float] = (-1.0, 1.0)


def random_batchnorm(model: Any, samples: int = 8, seed: int = 0, low: float = -1.0, high: float = 1.0) -> Any:
    """Random batch-norm scales and offsets, then every BN layer's moving statistics set to the batch statistics of
    random inputs uniform in [low, high] (``tfmcu.nets.convert.calibrate_batchnorm``)."""
    import tf_keras  # lazy: imports TensorFlow

    bns = [layer for layer in model.layers if isinstance(layer, tf_keras.layers.BatchNormalization)]
    if not bns:
        return model
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, high, (samples, *model.input_shape[1:])).astype(np.float32)
    for bn in bns:
        gamma, beta = bn.gamma, bn.beta
        if gamma is not None:
            gamma.assign(rng.uniform(0.6, 1.4, gamma.shape).astype(np.float32))
        if beta is not None:
            beta.assign(rng.normal(0.2, 0.3, beta.shape).astype(np.float32))
    return calibrate_batchnorm(model, x)


def _spec_model(spec_fn: Callable[[], Any]) -> Callable[[], Any]:
    def make() -> Any:
        from tfmcu.nets.keras_builder import build_keras  # lazy: imports TensorFlow
        return random_batchnorm(build_keras(spec_fn(), seed=0))
    return make


def _mbv2_035_96() -> Any:
    return get_preset("mbv2", width=0.35, resolution=96, num_classes=10)


def _mbv2_rd_224() -> Any:
    return get_preset("mbv2-rd", width=1.0, resolution=224, num_classes=1000)


def _kernels_symmetric() -> Any:
    return NetSpec(name="kernels_symmetric", resolution=64, padding="symmetric",
                   stem=StemSpec(16, kernel=5, stride=2, activation="relu"),
                   stages=[StageSpec([BlockSpec(16, kernel=7, expand=3, stride=1, activation="relu"),
                                      BlockSpec(16, kernel=5, expand=3, activation="relu")]),
                           StageSpec([BlockSpec(24, kernel=7, expand=4, stride=2, activation="relu")]),
                           StageSpec([BlockSpec(32, kernel=5, expand=4, stride=2, activation="relu6"),
                                      BlockSpec(32, kernel=3, expand=4, activation="relu6")])],
                   head=HeadSpec(64, num_classes=8, activation="relu"))


def _kernels_same() -> Any:
    """Depthwise 5x5 and 7x7 with SAME padding down to 5x5 maps (MCUNet's kind of block), input channels that
    are not multiples of 16: the latency calibration's (``benchmarks.latency``)."""
    return NetSpec(name="kernels_same", resolution=80, stem=StemSpec(16, kernel=3, stride=2),
                   stages=[StageSpec([BlockSpec(16, kernel=3, expand=1)]),
                           StageSpec([BlockSpec(24, kernel=7, expand=3, stride=2), BlockSpec(24, kernel=5, expand=4)]),
                           StageSpec([BlockSpec(40, kernel=5, expand=4, stride=2), BlockSpec(40, kernel=7, expand=3)]),
                           StageSpec([BlockSpec(72, kernel=5, expand=5, stride=2), BlockSpec(72, kernel=7, expand=4)])],
                   head=HeadSpec(96, num_classes=10))


def _keras_mobilenet_v2() -> Any:
    import tf_keras
    m = tf_keras.applications.MobileNetV2(alpha=0.35, input_shape=(96, 96, 3), weights=None, classes=10,
                                          classifier_activation=None)
    return random_batchnorm(m)


def _keras_mobilenet_v1() -> Any:
    import tf_keras
    m = tf_keras.applications.MobileNet(alpha=0.25, input_shape=(128, 128, 3), weights=None, classes=10,
                                        classifier_activation=None, dropout=0.0)
    return random_batchnorm(m)


def _resnet_like() -> Any:
    """ResNet-style stem (7x7/2 conv, 3x3/2 SAME max pool), projection shortcuts (1x1/2 conv), VALID convs,
    a linear conv and a 1x1 conv on the stem."""
    import tf_keras
    from tf_keras import layers

    inp = tf_keras.Input((72, 72, 3), name="input")
    x = layers.Conv2D(16, 7, 2, padding="same", use_bias=False, name="stem_conv")(inp)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.MaxPooling2D(3, 2, padding="same", name="stem_pool")(x)
    for i, (c, s) in enumerate([(16, 1), (24, 2), (32, 2)]):
        p = f"block{i + 1}"
        y = layers.Conv2D(c, 3, s, padding="same", use_bias=False, name=f"{p}_conv1")(x)
        y = layers.BatchNormalization(name=f"{p}_bn1")(y)
        y = layers.ReLU(name=f"{p}_relu1")(y)
        y = layers.Conv2D(c, 3, 1, padding="same", use_bias=False, name=f"{p}_conv2")(y)
        y = layers.BatchNormalization(name=f"{p}_bn2")(y)
        if s != 1 or x.shape[-1] != c:
            x = layers.Conv2D(c, 1, s, padding="valid", use_bias=False, name=f"{p}_shortcut")(x)
            x = layers.BatchNormalization(name=f"{p}_shortcut_bn")(x)
        x = layers.Add(name=f"{p}_add")([x, y])
        x = layers.ReLU(name=f"{p}_out")(x)
    x = layers.Conv2D(48, 3, 1, padding="valid", name="head_valid_conv")(x)
    x = layers.GlobalAveragePooling2D(name="head_pool")(x)
    x = layers.Dense(10, name="classifier")(x)
    return random_batchnorm(tf_keras.Model(inp, x, name="resnet_like"))


def all_kernels_model(input_shape: tuple[int, int, int], channels: int, grouped: int, groups: int, tail: int,
                      head_units: int, seed: int, name: str = "all_kernels") -> Any:
    """A stage holding every kernel: PAD (asymmetric), VALID conv, depthwise s2 with multiplier 2, SAME average and
    max pooling, a grouped conv, residual ADDs with a fused ReLU and different scales, and a SAME stride-1 conv named
    ``dilated`` (give it dilation 2 with ``dilate_convs``); then a head that ends the stage. Shared by the C golden
    generator (tools/gen/gen_golden.py) and the kernel tests."""
    import tf_keras
    from tf_keras import layers as L

    tf_keras.utils.set_random_seed(seed)
    i = tf_keras.Input(input_shape)
    x = L.ZeroPadding2D(((1, 2), (2, 1)))(i)
    x = L.Conv2D(channels, 3, padding="valid", activation="relu")(x)
    x = L.DepthwiseConv2D(3, 2, padding="same", depth_multiplier=2, activation="relu6")(x)
    a = L.AveragePooling2D(3, 1, padding="same")(x)
    b = L.Conv2D(grouped, 3, padding="same", groups=groups, activation="relu")(a)
    x = L.ReLU()(L.Add()([a, b]))
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    c = L.Conv2D(tail, 3, padding="same", name="dilated")(x)
    x = L.Add()([c, L.Conv2D(tail, 1, activation="relu")(c)])
    return tf_keras.Model(i, L.Dense(head_units)(L.GlobalAveragePooling2D()(x)), name=name)


def dilate_convs(data: bytes, fragment: str) -> bytes:
    """Dilation 2 on the (SAME, stride 1) convs whose output name contains ``fragment`` (TF's converter never
    emits dilated CONV_2D ops; shapes do not change for SAME stride 1)."""
    m = ts.load_model(data)
    sg = m.subgraphs[0]
    for op in sg.operators:
        if ts.op_name(m, op) in ("CONV_2D", "DEPTHWISE_CONV_2D") and fragment in ts.tensor_name(
                sg.tensors[op.outputs[0]]):
            if op.builtinOptions.padding != ts.Padding.SAME or op.builtinOptions.strideH != 1:
                raise ValueError(f"dilate_convs: op {ts.tensor_name(sg.tensors[op.outputs[0]])} is not SAME stride 1")
            op.builtinOptions.dilationHFactor = op.builtinOptions.dilationWFactor = 2
    return ts.write_model(m)


def _tiny_spec() -> Any:
    return NetSpec(name="tiny", resolution=48, stem=StemSpec(8, kernel=3, stride=2),
                   stages=[StageSpec([BlockSpec(8, kernel=3, expand=1)]),
                           StageSpec([BlockSpec(16, kernel=5, expand=4, stride=2), BlockSpec(16, kernel=3)]),
                           StageSpec([BlockSpec(24, kernel=3, expand=4, stride=2)])],
                   head=HeadSpec(32, num_classes=5))


def _mbv2_1_224() -> Any:
    import tf_keras
    m = tf_keras.applications.MobileNetV2(alpha=1.0, input_shape=(224, 224, 3), weights=None,
                                          classifier_activation=None)
    return random_batchnorm(m, samples=2)


def _mbv2_035_144() -> Any:
    import tf_keras
    m = tf_keras.applications.MobileNetV2(alpha=0.35, input_shape=(144, 144, 3), weights=None,
                                          classifier_activation=None)
    return random_batchnorm(m, samples=4)


def _mbv3_small_100_128() -> Any:
    """MobileNetV3-Small with its preprocessing (Rescaling: MUL and ADD by constants), hard-swish, squeeze-excites
    (a MEAN kept 4-D, hard-sigmoid: relu6 folded into the expanding 1x1 convolution, MUL by a constant) scaling the
    map (a broadcast MUL), inputs in [0, 255]."""
    import tf_keras
    m = tf_keras.applications.MobileNetV3Small(alpha=1.0, input_shape=(128, 128, 3), weights=None, classes=10,
                                               include_preprocessing=True, classifier_activation=None)
    return random_batchnorm(m, samples=4, low=0.0, high=255.0)


def efficientnet_like(resolution: int = 112, width: float = 0.5, classes: int = 10,
                      blocks: tuple[tuple[int, int, int, int, int], ...] = (
                          (1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (2, 3, 2, 6, 80), (1, 5, 1, 6, 112)),
                      stem: int = 32, top: int = 640, name: str = "efficientnet_like") -> Any:
    """EfficientNet's structure at a small size, with its layer names (``stem_*``, ``block{stage}{letter}_*``,
    ``top_*``): Rescaling and Normalization at the input (MUL / ADD by constants), swish (LOGISTIC x MUL), per stage
    of ``blocks`` (repeats, kernel, stride, expansion, output channels at width 1) MBConv blocks with a 3x3 or 5x5
    depthwise convolution (a stride 2 one after a ZeroPadding2D, VALID, which the converter makes one SAME
    convolution), a squeeze-excite (MEAN, a Reshape of a computed shape: SHAPE, STRIDED_SLICE, PACK; 1x1 convolutions
    with swish and sigmoid, a broadcast MUL) and a residual ADD where the shapes allow. Random weights, batch norms
    calibrated on inputs in [0, 255]."""
    import tf_keras
    from tf_keras import layers as L

    def ch(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    def block(x: Any, p: str, cin: int, cout: int, kernel: int, stride: int, expand: int) -> Any:
        inputs, filters = x, cin * expand
        if expand != 1:
            x = L.Conv2D(filters, 1, padding="same", use_bias=False, name=p + "expand_conv")(x)
            x = L.BatchNormalization(name=p + "expand_bn")(x)
            x = L.Activation("swish", name=p + "expand_activation")(x)
        if stride == 2:
            before, after = (kernel - 1) // 2 - 1, (kernel - 1) // 2  # imagenet_utils.correct_pad, even sizes
            x = L.ZeroPadding2D(((before, after), (before, after)), name=p + "dwconv_pad")(x)
        x = L.DepthwiseConv2D(kernel, stride, padding="valid" if stride == 2 else "same", use_bias=False,
                              name=p + "dwconv")(x)
        x = L.Activation("swish", name=p + "activation")(L.BatchNormalization(name=p + "bn")(x))
        se = L.GlobalAveragePooling2D(name=p + "se_squeeze")(x)
        se = L.Reshape((1, 1, filters), name=p + "se_reshape")(se)
        se = L.Conv2D(max(1, cin // 4), 1, padding="same", activation="swish", name=p + "se_reduce")(se)
        se = L.Conv2D(filters, 1, padding="same", activation="sigmoid", name=p + "se_expand")(se)
        x = L.multiply([x, se], name=p + "se_excite")
        x = L.Conv2D(cout, 1, padding="same", use_bias=False, name=p + "project_conv")(x)
        x = L.BatchNormalization(name=p + "project_bn")(x)
        return L.add([x, inputs], name=p + "add") if stride == 1 and cin == cout else x

    inp = tf_keras.Input((resolution, resolution, 3), name="input")
    x = L.Rescaling(1.0 / 255.0, name="rescaling")(inp)
    x = L.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.229 ** 2, 0.224 ** 2, 0.225 ** 2],
                        name="normalization")(x)
    x = L.ZeroPadding2D(((0, 1), (0, 1)), name="stem_conv_pad")(x)
    x = L.Conv2D(ch(stem), 3, 2, padding="valid", use_bias=False, name="stem_conv")(x)
    x = L.Activation("swish", name="stem_activation")(L.BatchNormalization(name="stem_bn")(x))
    cin = ch(stem)
    for stage, (repeats, kernel, stride, expand, cout) in enumerate(blocks):
        for i in range(repeats):
            x = block(x, f"block{stage + 1}{chr(ord('a') + i)}_", cin, ch(cout), kernel, stride if i == 0 else 1,
                      expand)
            cin = ch(cout)
    x = L.Conv2D(ch(top), 1, padding="same", use_bias=False, name="top_conv")(x)
    x = L.Activation("swish", name="top_activation")(L.BatchNormalization(name="top_bn")(x))
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    x = L.Dense(classes, name="predictions")(x)
    return random_batchnorm(tf_keras.Model(inp, x, name=name), samples=4, low=0.0, high=255.0)


def _eltwise_mix() -> Any:
    """The element-wise ops the other models lack, a few layers: TANH, LEAKY_RELU, SUB of two maps and of a
    per-channel constant, ADD of a per-channel constant, MUL of two maps, LOGISTIC alone."""
    import tf_keras
    from tf_keras import layers as L

    inp = tf_keras.Input((48, 48, 3), name="input")
    x = L.BatchNormalization(name="stem_bn")(L.Conv2D(16, 3, 2, padding="same", name="stem_conv")(inp))
    x = L.Activation("tanh", name="stem_tanh")(x)
    y = L.BatchNormalization(name="block1_bn")(L.DepthwiseConv2D(3, padding="same", name="block1_dw")(x))
    y = L.LeakyReLU(0.1, name="block1_leaky")(y)
    offsets = np.linspace(-0.5, 0.5, 16).astype(np.float32)
    y = L.Lambda(lambda v: v - offsets, name="block1_sub_const")(y)
    x = L.Subtract(name="block1_sub")([y, x])
    z = L.BatchNormalization(name="block2_bn")(L.Conv2D(24, 1, name="block2_expand")(x))
    g = L.Activation("sigmoid", name="block2_gate")(z)
    z = L.Multiply(name="block2_mul")([L.Activation("tanh", name="block2_tanh")(z), g])
    z = L.Lambda(lambda v: v + np.linspace(0.0, 1.0, 24).astype(np.float32), name="block2_add_const")(z)
    z = L.BatchNormalization(name="block3_dw_bn")(L.DepthwiseConv2D(3, 2, padding="same", name="block3_dw")(z))
    z = L.BatchNormalization(name="block3_bn")(L.Conv2D(32, 1, name="block3_project")(z))
    z = L.LeakyReLU(0.2, name="block3_leaky")(z)
    x = L.GlobalAveragePooling2D(name="head_pool")(z)
    return random_batchnorm(tf_keras.Model(inp, L.Dense(10, name="classifier")(x), name="eltwise_mix"))


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("mbv2_035_96", ["spec preset", "residual ADD", "ReLU6", "SAME", "k3", "s1/s2", "per-channel"],
             _spec_model(_mbv2_035_96), patch_blocks=5),
    ZooModel("kernels_symmetric", ["k5/k7", "symmetric padding (PAD + VALID)", "ReLU", "ReLU6", "s2 with k5/k7"],
             _spec_model(_kernels_symmetric), patch_blocks=3),
    ZooModel("keras_mobilenet_v2", ["tf_keras.applications", "ZeroPadding2D -> PAD", "VALID s2 depthwise"],
             _keras_mobilenet_v2, patch_blocks=4),
    ZooModel("keras_mobilenet_v1", ["tf_keras.applications", "plain conv chain", "PAD", "stage by op count"],
             _keras_mobilenet_v1, patch_ops=9),
    ZooModel("resnet_like", ["k7 stem", "MAX_POOL SAME", "projection shortcut", "VALID conv", "no activation",
                             "ReLU"], _resnet_like, patch_blocks=3),
    ZooModel("tiny_per_tensor", ["per-tensor quantization", "k5"], _spec_model(_tiny_spec), per_tensor=True,
             patch_blocks=3),
    ZooModel("tiny_float_input", ["float input -> QUANTIZE in the stage", "float output"], _spec_model(_tiny_spec),
             float_io=True, patch_blocks=3),
    ZooModel("mbv2_100_224", ["MobileNetV2 1.0 224 (tf_keras.applications)"], _mbv2_1_224, patch_blocks=5,
             tags=["large"]),
    ZooModel("mbv2_035_144", ["MobileNetV2 0.35 144 (tf_keras.applications)"], _mbv2_035_144, patch_blocks=5,
             tags=["bench"]),
    ZooModel("kernels_same", ["k5/k7 depthwise SAME on small maps", "channels not multiples of 16"],
             _spec_model(_kernels_same), patch_blocks=3, tags=["calibration"]),
    ZooModel("mbv2_rd_224", ["MbV2-RD 224 (spec preset: receptive field redistributed, MCUNetV2)"],
             _spec_model(_mbv2_rd_224), patch_blocks=3, tags=["large"]),
    ZooModel("mbv3_small_100_128", ["MobileNetV3-Small 1.0 128 (tf_keras.applications, include_preprocessing)",
                                    "HARD_SWISH", "squeeze-excite: MEAN, broadcast MUL", "MUL / ADD by constants"],
             _mbv3_small_100_128, patch_blocks=3, tags=["calibration"], input_range=(0.0, 255.0)),
    ZooModel("efficientnet_like", ["EfficientNet's blocks (names, swish, squeeze-excite with a computed reshape, "
                                   "k3/k5 depthwise)", "LOGISTIC", "MUL / SUB by constants"],
             efficientnet_like, patch_blocks=3, tags=["calibration"], input_range=(0.0, 255.0)),
    ZooModel("eltwise_mix", ["TANH", "LEAKY_RELU", "SUB", "ADD / SUB by per-channel constants", "LOGISTIC x MUL"],
             _eltwise_mix, patch_blocks=4, tags=["calibration"]),
]}


def build(name: str, cache_dir: str | None = None) -> bytes:
    """The int8 .tflite bytes of zoo model ``name`` (converted once, then cached in ``cache_dir``)."""
    entry = ZOO[name]
    path = None
    if cache_dir:
        key = hashlib.sha1(repr((entry.name, entry.features, entry.float_io, entry.per_tensor,
                                 _source_digest())).encode()).hexdigest()[:12]
        path = os.path.join(cache_dir, f"{name}-{key}.tflite")
        if os.path.exists(path):
            with open(path, "rb") as f:
                return f.read()
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = entry.make()
    low, high = entry.input_range
    data = to_int8_tflite(model, random_representative(tuple(model.input_shape[1:]), samples=8, low=low, high=high),
                          float_io=entry.float_io, per_tensor=entry.per_tensor)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        # Several test processes may build the same model at once: each writes its own temporary file and the
        # rename is atomic, so readers see either no file or a whole one.
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    return data


def _source_digest() -> str:
    """Digest of the code a conversion depends on (this file, the spec, presets, builder and converter)."""
    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("zoo.py", "spec.py", "presets.py", "keras_builder.py", "convert.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:8]
