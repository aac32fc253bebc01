"""What a .tflite model takes and gives: its input/output signature, samples matching it, seeded random inputs.

A *sample* is a tuple of arrays, one per model input, each with the input tensor's shape (a bare array is taken as a
1-tuple; an array missing only the leading batch dimension of 1 gets it added). Runners return outputs as a list (one
per sample) of lists (one array per model output).

``model`` is a ``tfmcu.tflite.model.TfliteModel`` (parsed once per run) or the bytes of one.

* ``model_info(model)``: inputs / outputs of subgraph 0 (shape, dtype, quantization) and the operator names.
* ``as_samples(info, samples)``: samples checked against the signature (one-line ``TFLMError`` on a mismatch);
  ``prepared(model, samples)``: the parsed model, its signature and the checked samples, what a runner starts from.
* ``random_inputs(model, n, seed)``: seeded samples (see its docstring for the value ranges).
* ``read_model(path, flag)``: a user's .tflite, read and parsed once (one-line ``UsageError``).
* ``load_inputs(path, info)``: real samples from a .npy / .npz (``--inputs``; one-line ``UsageError``).
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Sequence

import numpy as np

from tfmcu.errors import TfmcuError, UsageError
from tfmcu.files import read_bytes
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import ModelInfo, TensorInfo, TfliteModel, as_model, tensor_info

__all__ = ["ModelInfo", "TFLMError", "TensorInfo", "as_samples", "input_range", "load_inputs", "model_info", "parsed",
           "prepared", "random_inputs", "read_model"]


class TFLMError(TfmcuError):
    """A model cannot be run or measured (in TFLM, TF Lite or the host runner); one line."""


def parsed(model: TfliteModel | bytes, where: str = "model") -> TfliteModel:
    """``as_model`` with its signature read (``info``): a file that is not a TFLite model, or an operator with an
    operator code the model lacks, is a one-line ``TFLMError``."""
    try:
        model = as_model(model, where)
    except ts.SchemaError as e:
        raise TFLMError(str(e)) from None
    try:
        model.info
    except ts.SchemaError as e:
        raise TFLMError(f"{where}: {e}") from None
    return model


def read_model(path: str, what: str = "") -> TfliteModel:
    """The .tflite at ``path``, read and parsed once for a whole run: a missing or unreadable file, or one that is
    not a TFLite model, is a one-line ``UsageError`` (``what``: the flag that named it)."""
    try:
        return parsed(read_bytes(path, what), path)
    except TFLMError as e:
        raise UsageError(str(e)) from None


def model_info(model: TfliteModel | bytes, where: str = "model") -> ModelInfo:
    """Inputs / outputs of subgraph 0 (in the model's order) and the operator names (``TfliteModel.info``)."""
    return parsed(model, where).info


def prepared(model: TfliteModel | bytes, samples: Sequence[Any],
             where: str = "model") -> tuple[TfliteModel, ModelInfo, list[tuple[np.ndarray, ...]]]:
    """What a runner needs: the parsed model, its signature and ``samples`` checked against it (``as_samples``)."""
    model = parsed(model, where)
    return model, model.info, as_samples(model.info, samples, where)


def as_samples(info: ModelInfo, samples: Sequence[Any], where: str) -> list[tuple[np.ndarray, ...]]:
    out = []
    n_in = len(info.inputs)
    for s, sample in enumerate(samples):
        arrays = (sample,) if isinstance(sample, np.ndarray) else tuple(sample)
        if len(arrays) != n_in:
            raise TFLMError(f"{where}: sample {s} has {len(arrays)} arrays, the model has {n_in} inputs")
        fixed = []
        for k, (a, t) in enumerate(zip(arrays, info.inputs)):
            a = np.asarray(a)
            if a.dtype.name != t.dtype:
                raise TFLMError(f"{where}: sample {s} input {k} has dtype {a.dtype.name}, the model wants {t.dtype}")
            if a.shape != t.shape:
                if t.shape[:1] == (1,) and a.shape == t.shape[1:]:
                    a = a[None]
                else:
                    raise TFLMError(f"{where}: sample {s} input {k} has shape {list(a.shape)}, the model wants "
                                    f"{list(t.shape)}")
            fixed.append(np.ascontiguousarray(a))
        out.append(tuple(fixed))
    return out


def _consumer_quantization(model: TfliteModel, tensor_index: int) -> tuple[float, int, str] | None:
    """(scale, zero point, dtype) of the QUANTIZE op output that reads a float input, if any."""
    m = model.flatbuffer
    for op, name in zip(m.subgraphs[0].operators or [], model.op_names):
        if name == "QUANTIZE" and op.inputs is not None and int(op.inputs[0]) == tensor_index:
            info = tensor_info(m, int(op.outputs[0]))
            if info.scale:
                return info.scale, info.zero_point, info.dtype
    return None


def input_range(model: TfliteModel | bytes, tensor: TensorInfo) -> tuple[float, float]:
    """The value range random float inputs are drawn from: the range the input's own quantization represents,
    else that of the QUANTIZE op that reads it, else [-1, 1]."""
    q = ((tensor.scale, tensor.zero_point, "int8") if tensor.scale else
         _consumer_quantization(parsed(model), tensor.index))
    if q is None:
        return -1.0, 1.0
    scale, zp, qdtype = q
    lim = np.iinfo(np.dtype(qdtype)) if qdtype in ("int8", "uint8", "int16") else np.iinfo(np.int8)
    return float((lim.min - zp) * scale), float((lim.max - zp) * scale)


def random_inputs(model: TfliteModel | bytes, n: int, seed: int = 0,
                  signature: ModelInfo | None = None) -> list[tuple[np.ndarray, ...]]:
    """``n`` seeded samples, each a tuple with one array per model input (shape and dtype of the input tensor);
    ``signature``: the inputs to draw for instead of the model's own (a streamed-input model's image,
    ``tfmcu.runtime.tflm_host.input_signature``).

    Integer inputs cover their type's whole range uniformly (int8: [-128, 127], uint8: [0, 255], int16/int32:
    [-32768, 32767]); bool inputs are fair coin flips; float inputs are uniform in the range their quantization
    represents (``input_range``: the input's own scale/zero point, else those of the QUANTIZE op that consumes
    it), else in [-1, 1]."""
    m = parsed(model)
    info = m.info if signature is None else signature
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(int(n)):
        sample = []
        for t in info.inputs:
            dt = np.dtype(t.dtype)
            if dt.kind in "iu":
                lim = np.iinfo(dt) if dt.itemsize <= 2 else np.iinfo(np.int16)
                a = rng.integers(lim.min, int(lim.max) + 1, size=t.shape, dtype=np.int64).astype(dt)
            elif dt.kind == "b":
                a = rng.integers(0, 2, size=t.shape).astype(bool)
            elif dt.kind == "f":
                lo, hi = input_range(m, t)
                a = rng.uniform(lo, hi, size=t.shape).astype(dt)
            else:
                raise TFLMError(f"input {t.index} '{t.name}' has type {t.dtype}: no random inputs for it")
            sample.append(a)
        out.append(tuple(sample))
    return out


def load_inputs(path: str, info: Any) -> list[tuple[Any, ...]]:
    """Samples from a .npy (single-input models) or .npz; float data for an integer input is quantized. A file that
    is not a readable .npy / .npz of numeric arrays is a one-line ``UsageError``."""
    if not os.path.isfile(path):
        raise UsageError(f"--inputs={path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            if len(info.inputs) != 1:
                raise UsageError(f"--inputs={path}: the model has {len(info.inputs)} inputs; give a .npz with one "
                                 f"array per input")
            arrays = [loaded]
        else:
            with loaded:
                keys = list(loaded.files)
                arrays = []
                for k, t in enumerate(info.inputs):
                    key = f"arr_{k}" if f"arr_{k}" in keys else t.name if t.name in keys else None
                    if key is None:
                        raise UsageError(f"--inputs={path}: no array 'arr_{k}' or '{t.name}' for input {k}")
                    arrays.append(np.asarray(loaded[key]))
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"--inputs={path}: not a readable .npy/.npz of numeric arrays ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    for k, a in enumerate(arrays):
        if a.dtype.kind not in "biuf":
            raise UsageError(f"--inputs={path}: input {k} holds {a.dtype.name} values; numbers are needed")
    per_input = []
    n = None
    for k, (a, t) in enumerate(zip(arrays, info.inputs)):
        shape = tuple(t.shape)
        batch1 = shape[:1] == (1,)
        if batch1 and a.ndim == len(shape) + 1 and tuple(a.shape[1:]) == shape:
            a = a.reshape((a.shape[0],) + shape[1:])  # (N, 1, ...) -> (N, ...)
        want = shape[1:] if batch1 else shape
        if a.ndim != len(want) + 1 or tuple(a.shape[1:]) != want:
            raise UsageError(f"--inputs={path}: input {k} has shape {list(a.shape)}, expected "
                                  f"(N, {', '.join(str(d) for d in want)}) for model input {t.label}")
        a = _convert(a, t, path, k)
        if n is not None and a.shape[0] != n:
            raise UsageError(f"--inputs={path}: inputs have different sample counts ({n} and {a.shape[0]})")
        n = a.shape[0]
        per_input.append((a, batch1))
    if not n:
        raise UsageError(f"--inputs={path}: no samples")
    return [tuple(a[i:i + 1] if b1 else a[i] for a, b1 in per_input) for i in range(n)]


def _convert(a: Any, t: Any, path: str, k: int) -> Any:
    want = np.dtype(t.dtype)
    if a.dtype == want:
        return a
    if want.kind in "iu" and a.dtype.kind == "f" and t.scale:
        lim = np.iinfo(want)
        q = np.round(a.astype(np.float64) / t.scale) + t.zero_point
        return np.clip(q, lim.min, lim.max).astype(want)
    if want.kind == "f" and a.dtype.kind in "fiu":
        return a.astype(want)
    raise UsageError(f"--inputs={path}: input {k} has dtype {a.dtype.name}, the model wants {want.name}")
