"""The models of the bench section *foreign* (``benchmarks.foreign``): what users bring, taken straight from
``tf_keras.applications`` with their preprocessing layers left in, and one small ResNet built here (tf_keras'
ResNets start at ResNet50, far beyond any MCU).

Random weights; the batch norms get random scales and offsets and their moving statistics from random images in
``INPUT_RANGE`` (``tfmcu.nets.zoo.random_batchnorm``, as for the zoo's models with Keras' preprocessing); then full
int8 (int8 input and output, ``tfmcu.nets.convert.to_int8_tflite``) on a representative set of random images in the
same range. The classifier's softmax is left out (as the zoo does), so that the int8 outputs compared bit for bit
vary from input to input. ``convert`` caches the .tflite by the content of what made it (this file, the converter,
``random_batchnorm``, TensorFlow's version): the converter's float calibration is not bit-reproducible from run to
run, so the cached bytes are the model a run measures.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

CLASSES = 100
INPUT_RANGE = (0.0, 255.0)  # images as a camera gives them; the models' own layers preprocess them
BATCHNORM_SAMPLES = 4
REPRESENTATIVE_SAMPLES = 8


@dataclass(frozen=True)
class ForeignModel:
    name: str
    title: str  # what it is, for the docs
    make: Callable[[], Any]  # -> tf_keras.Model with untrained weights
    se: bool  # squeeze-excites (the bench also fits it with se_passes=False)


def _apps() -> Any:
    import tf_keras  # lazy: imports TensorFlow

    return tf_keras.applications


def _mbv3(large: bool, alpha: float, resolution: int, minimalistic: bool) -> Callable[[], Any]:
    def make() -> Any:
        build = _apps().MobileNetV3Large if large else _apps().MobileNetV3Small
        return build(input_shape=(resolution, resolution, 3), alpha=alpha, minimalistic=minimalistic, weights=None,
                     classes=CLASSES, classifier_activation=None, include_preprocessing=True)
    return make


def _efficientnet_b0(resolution: int) -> Callable[[], Any]:
    def make() -> Any:
        return _apps().EfficientNetB0(input_shape=(resolution, resolution, 3), weights=None, classes=CLASSES,
                                      classifier_activation=None)
    return make


def _rescaled(resolution: int) -> tuple[Any, Any]:
    """An image input and the preprocessing a user puts into the model in front of a model without its own: [0, 255]
    to [-1, 1] (a Rescaling layer, what ``preprocess_input`` does outside those models)."""
    import tf_keras
    from tf_keras import layers

    inp = tf_keras.Input((resolution, resolution, 3), name="image")
    return inp, layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescaling")(inp)


def _mobilenet_v1(alpha: float, resolution: int) -> Callable[[], Any]:
    """tf_keras' MobileNet (V1) behind the Rescaling layer (``input_tensor``: one flat model)."""
    def make() -> Any:
        _, x = _rescaled(resolution)
        return _apps().MobileNet(input_tensor=x, alpha=alpha, weights=None, classes=CLASSES,
                                 classifier_activation=None, dropout=0.0)
    return make


def _resnet(resolution: int, widths: tuple[int, ...], blocks: tuple[int, ...]) -> Callable[[], Any]:
    """A small ResNet of basic blocks (ResNet-18's layout: 7x7/2 stem, 3x3/2 max pool, two 3x3 convs per block,
    projection shortcuts where the shape changes), behind the Rescaling layer. tf_keras.applications' ResNets start at
    ResNet50 (25M parameters, 4 GMACs at 224 px), far beyond any MCU, so the bench builds this one."""
    def body(x: Any) -> Any:
        from tf_keras import layers

        x = layers.Conv2D(widths[0], 7, 2, padding="same", use_bias=False, name="conv1_conv")(x)
        x = layers.BatchNormalization(name="conv1_bn")(x)
        x = layers.ReLU(name="conv1_relu")(x)
        x = layers.MaxPooling2D(3, 2, padding="same", name="pool1_pool")(x)
        for s, (c, n) in enumerate(zip(widths, blocks)):
            for b in range(n):
                p = f"conv{s + 2}_block{b + 1}"
                stride = 2 if s > 0 and b == 0 else 1
                y = layers.Conv2D(c, 3, stride, padding="same", use_bias=False, name=f"{p}_1_conv")(x)
                y = layers.BatchNormalization(name=f"{p}_1_bn")(y)
                y = layers.ReLU(name=f"{p}_1_relu")(y)
                y = layers.Conv2D(c, 3, 1, padding="same", use_bias=False, name=f"{p}_2_conv")(y)
                y = layers.BatchNormalization(name=f"{p}_2_bn")(y)
                if stride != 1 or x.shape[-1] != c:
                    x = layers.Conv2D(c, 1, stride, use_bias=False, name=f"{p}_0_conv")(x)
                    x = layers.BatchNormalization(name=f"{p}_0_bn")(x)
                x = layers.ReLU(name=f"{p}_out")(layers.Add(name=f"{p}_add")([x, y]))
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        return layers.Dense(CLASSES, name="predictions")(x)

    def make() -> Any:
        import tf_keras

        inp, x = _rescaled(resolution)
        return tf_keras.Model(inp, body(x), name=f"resnet18_{widths[0]}_{resolution}")
    return make


def _nasnet_mobile(resolution: int) -> Callable[[], Any]:
    """tf_keras' NASNet-Mobile behind the Rescaling layer (``input_tensor``: one flat model)."""
    def make() -> Any:
        _, x = _rescaled(resolution)
        return _apps().NASNetMobile(input_tensor=x, weights=None, classes=CLASSES, classifier_activation=None)
    return make


MODELS: tuple[ForeignModel, ...] = (
    ForeignModel("mbv3_small_100_224", "MobileNetV3-Small 1.0 @ 224", _mbv3(False, 1.0, 224, False), se=True),
    ForeignModel("mbv3_small_min_100_224", "MobileNetV3-Small minimalistic 1.0 @ 224", _mbv3(False, 1.0, 224, True),
                 se=False),
    ForeignModel("mbv3_large_075_160", "MobileNetV3-Large 0.75 @ 160", _mbv3(True, 0.75, 160, False), se=True),
    ForeignModel("mbv3_large_min_075_160", "MobileNetV3-Large minimalistic 0.75 @ 160",
                 _mbv3(True, 0.75, 160, True), se=False),
    ForeignModel("efficientnet_b0_160", "EfficientNet-B0 @ 160", _efficientnet_b0(160), se=True),
    ForeignModel("mobilenet_v1_050_160", "MobileNet (V1) 0.5 @ 160", _mobilenet_v1(0.5, 160), se=False),
    ForeignModel("resnet18_025_128", "ResNet-18 layout at a quarter width (16-128 channels) @ 128 (the bench's own)",
                 _resnet(128, (16, 32, 64, 128), (2, 2, 2, 2)), se=False),
    ForeignModel("nasnet_mobile_96", "NASNet-Mobile @ 96", _nasnet_mobile(96), se=False),
)
BY_NAME = {m.name: m for m in MODELS}


def _digest() -> str:
    """What a conversion depends on: this file, the converter, ``random_batchnorm`` and TensorFlow's version (not the
    section's code, nor the rest of the zoo: they may change without converting again)."""
    import tensorflow as tf

    from tfmcu.nets import convert  # lazy: imports TensorFlow
    from tfmcu.nets.zoo import random_batchnorm  # lazy: imports TensorFlow

    h = hashlib.sha1(tf.__version__.encode())
    for path in (__file__, convert.__file__):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(inspect.getsource(random_batchnorm).encode())
    return h.hexdigest()[:12]


def convert(m: ForeignModel, cache_dir: str | None) -> bytes:
    """``m`` as a full-int8 .tflite (int8 input and output), converted once and cached in ``cache_dir`` by content."""
    path = None
    if cache_dir:
        path = os.path.join(cache_dir, f"foreign-{m.name}-{_digest()}.tflite")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                return f.read()
    import tf_keras

    from tfmcu.nets.convert import random_representative, to_int8_tflite  # lazy: imports TensorFlow
    from tfmcu.nets.zoo import random_batchnorm  # lazy: imports TensorFlow

    tf_keras.utils.set_random_seed(0)
    low, high = INPUT_RANGE
    model = random_batchnorm(m.make(), samples=BATCHNORM_SAMPLES, low=low, high=high)
    shape = tuple(model.input_shape[1:])
    data = to_int8_tflite(model, random_representative(shape, REPRESENTATIVE_SAMPLES, 0, low, high))
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=cache_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return data
