"""Keras -> full-int8 .tflite conversion (the one place tfmcu drives the TFLite converter), and the batch-norm
statistics an untrained model needs before it converts into ranges TF Lite can run (``calibrate_batchnorm``)."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def random_representative(shape: tuple[int, ...], samples: int = 8, seed: int = 0, low: float = -1.0,
                          high: float = 1.0) -> Callable[[], Iterable[list[np.ndarray]]]:
    """A representative dataset of seeded uniform random batches (for memory and bit-exactness work)."""
    def gen() -> Iterable[list[np.ndarray]]:
        rng = np.random.default_rng(seed)
        for _ in range(samples):
            yield [rng.uniform(low, high, (1, *shape)).astype(np.float32)]
    return gen


def batchnorm_layers(model: Any) -> list[Any]:
    """Every ``BatchNormalization`` layer of a tf_keras model, nested models included."""
    import tf_keras  # lazy: imports TensorFlow

    return [m for m in model.submodules if isinstance(m, tf_keras.layers.BatchNormalization)]


def initial_batchnorm(model: Any) -> bool:
    """True when the model has batch norms and every one still has its initial moving statistics (mean 0, variance
    1): weights never trained (e.g. ``weights=None``), whose activations shrink layer by layer until the int8 ranges
    are degenerate (a quantization scale TF Lite rejects)."""
    bns = batchnorm_layers(model)
    return bool(bns) and all(not np.any(bn.moving_mean.numpy()) and np.all(bn.moving_variance.numpy() == 1.0)
                             for bn in bns)


def calibrate_batchnorm(model: Any, images: np.ndarray) -> Any:
    """Set every batch norm's moving statistics to the batch statistics of ``images`` (float model inputs
    ``(N, H, W, C)``): one training-mode pass with momentum 0, as training would set them. Returns the model."""
    bns = batchnorm_layers(model)
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    try:
        model(np.asarray(images, np.float32), training=True)
    finally:
        for bn, m in zip(bns, saved):
            bn.momentum = m
    return model


def to_int8_tflite(model: Any, representative: Callable[[], Iterable[list[np.ndarray]]] | None = None,
                   float_io: bool = False, per_tensor: bool = False) -> bytes:
    """Full-integer int8 model: int8 weights (per-channel unless ``per_tensor``), int8 activations, int8 input and
    output unless ``float_io`` (then the model starts with QUANTIZE and ends with DEQUANTIZE)."""
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative or random_representative(tuple(model.input_shape[1:]))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not float_io:
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    if per_tensor:
        conv._experimental_disable_per_channel = True
    return conv.convert()
