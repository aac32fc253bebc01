"""Run .tflite models in TensorFlow Lite's own interpreter (``tf.lite.Interpreter``), the reference for outputs.

``run_tflite(model, samples, resolver)``: outputs per sample with the reference kernels (``"reference"``,
``OpResolverType.BUILTIN_REF``, the kernels TFLM's are ported from) or the optimized builtin ones (``"builtin"``);
``tflite_outputs(model, rows, resolver)``: the same for a parsed model and samples already checked against it.
``tflite_all_tensors(model, sample)``: every tensor of one run (to read an intermediate such as a patch stage's
output). TensorFlow is imported on first use. A detector's outputs (``tfmcu.tflite.detection_postprocess``) come back
with the op's unwritten entries (past ``num_detections``) zeroed (``canonical_outputs``), as TFLM's do.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

import numpy as np

from tfmcu.runtime.isolate import isolatable
from tfmcu.runtime.model_io import TFLMError, prepared
from tfmcu.tflite.detection_postprocess import canonical_outputs, postprocess_outputs
from tfmcu.tflite.model import TfliteModel

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
RESOLVERS = ("reference", "builtin")


@isolatable
def run_tflite(model: TfliteModel | bytes, samples: Sequence[Any], resolver: str = "reference",
               where: str = "model") -> list[list[np.ndarray]]:
    """Outputs of ``tf.lite.Interpreter`` for each sample, with the reference kernels (``resolver="reference"``,
    ``OpResolverType.BUILTIN_REF``) or the optimized builtin ones (``"builtin"``); ``isolate=True``: in a child
    process (``tfmcu.runtime.isolate``)."""
    model, _, rows = prepared(model, samples, where)
    return tflite_outputs(model, rows, resolver, where)


def tflite_outputs(model: TfliteModel, rows: Sequence[tuple[np.ndarray, ...]], resolver: str = "reference",
                   where: str = "model") -> list[list[np.ndarray]]:
    """``run_tflite`` of a parsed model on samples already checked against it (``model_io.prepared``)."""
    import tensorflow as tf  # lazy: TensorFlow takes seconds to import and most callers never need it

    info = model.info
    kinds = {"reference": tf.lite.experimental.OpResolverType.BUILTIN_REF,
             "builtin": tf.lite.experimental.OpResolverType.BUILTIN}
    if resolver not in kinds:
        raise TFLMError(f"resolver {resolver!r}: expected one of {', '.join(kinds)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
            interp = tf.lite.Interpreter(model_content=model.data, experimental_op_resolver_type=kinds[resolver])
        interp.allocate_tensors()
    except (RuntimeError, ValueError) as e:
        raise TFLMError(f"{where}: TF Lite cannot load the model ({str(e).splitlines()[0]})") from None
    detector = postprocess_outputs(model.flatbuffer)
    results = []
    for sample in rows:
        for a, t in zip(sample, info.inputs):
            interp.set_tensor(t.index, a)
        interp.invoke()
        results.append(canonical_outputs([interp.get_tensor(t.index) for t in info.outputs], detector))
    return results


def tflite_all_tensors(model: bytes, sample: Sequence[np.ndarray]) -> Any:
    """Every tensor of one ``tf.lite.Interpreter`` run (reference kernels, all intermediates preserved): a
    function tensor index -> array (used to read a patch stage's output tensor inside a whole model)."""
    import tensorflow as tf  # lazy: TensorFlow takes seconds to import and most callers never need it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = tf.lite.Interpreter(model_content=bytes(model), experimental_preserve_all_tensors=True,
                                 experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d, a in zip(it.get_input_details(), sample):
        it.set_tensor(d["index"], a)
    it.invoke()
    return lambda index: np.array(it.get_tensor(index), copy=True)
