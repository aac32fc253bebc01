"""Shared fixtures: convert tf_keras models to .tflite once per session.

* ``float_tflite(model) -> bytes``: plain float conversion.
* ``int8_tflite(model, rep_shape=None, float_io=False) -> bytes``: full-integer int8 (``Optimize.DEFAULT``,
  ``TFLITE_BUILTINS_INT8``, int8 input/output unless ``float_io``) calibrated on a few seeded random batches.
* ``tflite_file(data, name) -> str``: the bytes written to the session's tmp dir (for path-based APIs).
* ``aborting_tflite``: an int8 CNN classifier on which TF Lite and TFLM abort() (its SOFTMAX input scale).

Conversions are cached by (model architecture + weights + settings), in memory and as files in a session tmp dir, so
several tests (and test files) can ask for the same model cheaply. TensorFlow is imported only when a conversion is
actually requested.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class TFLiteCache:
    def __init__(self, root: Path):
        self.root = root
        self._mem: dict[str, bytes] = {}

    def _key(self, model: Any, kind: str) -> str:
        h = hashlib.sha1(model.to_json().encode())
        for w in model.get_weights():
            h.update(w.tobytes())
        h.update(kind.encode())
        return f"{model.name}-{h.hexdigest()[:16]}"

    def _get(self, key: str, convert) -> bytes:
        if key not in self._mem:
            path = self.root / f"{key}.tflite"
            if not path.exists():
                path.write_bytes(convert())
            self._mem[key] = path.read_bytes()
        return self._mem[key]

    def float(self, model: Any) -> bytes:
        def convert() -> bytes:
            import tensorflow as tf
            return tf.lite.TFLiteConverter.from_keras_model(model).convert()
        return self._get(self._key(model, "float"), convert)

    def int8(self, model: Any, rep_shape: tuple[int, ...] | None = None, float_io: bool = False,
             samples: int = 2, seed: int = 0) -> bytes:
        shape = tuple(rep_shape) if rep_shape else (1,) + tuple(int(d) for d in model.input_shape[1:])

        def convert() -> bytes:
            from tfmcu.nets.convert import random_representative, to_int8_tflite

            return to_int8_tflite(model, random_representative(shape[1:], samples=samples, seed=seed),
                                  float_io=float_io)
        return self._get(self._key(model, f"int8-{shape}-{float_io}-{samples}-{seed}"), convert)

    def file(self, data: bytes, name: str) -> str:
        path = self.root / f"{name}.tflite"
        path.write_bytes(data)
        return str(path)


@pytest.fixture(scope="session")
def tflite_cache(tmp_path_factory) -> TFLiteCache:
    return TFLiteCache(tmp_path_factory.mktemp("tflite"))


@pytest.fixture(scope="session")
def float_tflite(tflite_cache):
    return tflite_cache.float


@pytest.fixture(scope="session")
def int8_tflite(tflite_cache):
    return tflite_cache.int8


@pytest.fixture(scope="session")
def tflite_file(tflite_cache):
    return tflite_cache.file


@pytest.fixture(scope="session")
def aborting_tflite(int8_tflite) -> bytes:
    """An int8 CNN classifier whose SOFTMAX input scale (1e-9) puts the kernel's fixed-point multiplier out of range:
    TF Lite and TFLM abort() on it (a failed TFLITE_CHECK), so a pipeline must run their interpreters isolated."""
    import numpy as np
    import tf_keras as keras

    from tfmcu.tflite import schema as ts

    L = keras.layers
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, padding="same", activation="relu")(i)
    x = L.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = L.Conv2D(16, 1, activation="relu")(x)
    x = L.Softmax()(L.Dense(10)(L.GlobalAveragePooling2D()(x)))
    m = ts.load_model(int8_tflite(keras.Model(i, x, name="aborts")))
    sg = m.subgraphs[0]
    softmax = [op for op in sg.operators if ts.op_name(m, op) == "SOFTMAX"][0]
    sg.tensors[int(softmax.inputs[0])].quantization.scale = np.array([1e-9], np.float32)
    return ts.write_model(m)


@pytest.fixture(scope="session")
def zoo_models(tmp_path_factory):
    """``get(name) -> bytes``: a ``tfmcu.nets.zoo`` model, converted once (cached in $TFMCU_ZOO_CACHE when set, which
    ``make test`` shares between test files, else in the session's tmp dir)."""
    from tfmcu.nets import zoo

    cache_dir = os.environ.get("TFMCU_ZOO_CACHE") or str(tmp_path_factory.mktemp("zoo"))
    cache: dict[str, bytes] = {}

    def get(name: str) -> bytes:
        if name not in cache:
            cache[name] = zoo.build(name, cache_dir)
        return cache[name]
    return get
