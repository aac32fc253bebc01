"""What a .tflite model takes and gives: its input/output signature, samples matching it, seeded random inputs.

A *sample* is a tuple of arrays, one per model input, each with the input tensor's shape (a bare array is taken as a
1-tuple; an array missing only the leading batch dimension of 1 gets it added). Runners return outputs as a list (one
per sample) of lists (one array per model output).

* ``model_info(model)``: inputs / outputs of subgraph 0 (shape, dtype, quantization) and the operator names.
* ``as_samples(info, samples)``: samples checked against the signature (one-line ``TFLMError`` on a mismatch).
* ``random_inputs(model, n, seed)``: seeded samples (see its docstring for the value ranges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfmcu.errors import TfmcuError
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import load


class TFLMError(TfmcuError):
    """A model cannot be run or measured (in TFLM, TF Lite or the host runner); one line."""


@dataclass(frozen=True)
class TensorInfo:
    index: int  # tensor index in subgraph 0
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "int8", "uint8", "float32", ...
    scale: float = 0.0  # per-tensor quantization (0.0: none)
    zero_point: int = 0

    @property
    def signature(self) -> tuple[tuple[int, ...], str]:
        return self.shape, self.dtype


@dataclass(frozen=True)
class ModelInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_ops: int
    op_names: tuple[str, ...]  # "CONV_2D", ... "custom:NAME", per operator

    @property
    def custom_ops(self) -> list[str]:
        return sorted({n.split(":", 1)[1] for n in self.op_names if n.startswith("custom:")})


def _load(model: bytes | ts.ModelT, where: str = "model") -> ts.ModelT:
    if isinstance(model, ts.ModelT):
        return model
    try:
        return load(bytes(model), where)
    except ts.SchemaError as e:
        raise TFLMError(str(e)) from None


def _tensor_info(m: ts.ModelT, index: int) -> TensorInfo:
    t = m.subgraphs[0].tensors[index]
    try:
        dtype = np.dtype(ts.numpy_dtype(t.type)).name
    except ts.SchemaError:
        dtype = ts.dtype_name(t.type)
    scale, zp = 0.0, 0
    q = t.quantization
    if q is not None and q.scale is not None and len(q.scale) > 0:
        scale = float(np.ravel(q.scale)[0])
        zp = int(np.ravel(q.zeroPoint)[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
    return TensorInfo(int(index), ts.tensor_name(t), shape, dtype, scale, zp)


def model_info(model: bytes | ts.ModelT, where: str = "model") -> ModelInfo:
    """Inputs / outputs of subgraph 0 (in the model's order) and the operator names."""
    m = _load(model, where)
    sg = m.subgraphs[0]
    ins = tuple(_tensor_info(m, int(i)) for i in (sg.inputs if sg.inputs is not None else []))
    outs = tuple(_tensor_info(m, int(i)) for i in (sg.outputs if sg.outputs is not None else []))
    names = []
    for op in sg.operators or []:
        try:
            names.append(ts.op_name(m, op))
        except ts.SchemaError as e:
            raise TFLMError(f"{where}: {e}") from None
    return ModelInfo(ins, outs, len(names), tuple(names))


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


def _consumer_quantization(m: ts.ModelT, tensor_index: int) -> tuple[float, int, str] | None:
    """(scale, zero point, dtype) of the QUANTIZE op output that reads a float input, if any."""
    sg = m.subgraphs[0]
    for op in sg.operators or []:
        if ts.op_name(m, op) == "QUANTIZE" and op.inputs is not None and int(op.inputs[0]) == tensor_index:
            info = _tensor_info(m, int(op.outputs[0]))
            if info.scale:
                return info.scale, info.zero_point, info.dtype
    return None


def input_range(model: bytes | ts.ModelT, tensor: TensorInfo) -> tuple[float, float]:
    """The value range random float inputs are drawn from: the range the input's own quantization represents,
    else that of the QUANTIZE op that reads it, else [-1, 1]."""
    m = _load(model)
    q = (tensor.scale, tensor.zero_point, "int8") if tensor.scale else _consumer_quantization(m, tensor.index)
    if q is None:
        return -1.0, 1.0
    scale, zp, qdtype = q
    lim = np.iinfo(np.dtype(qdtype)) if qdtype in ("int8", "uint8", "int16") else np.iinfo(np.int8)
    return float((lim.min - zp) * scale), float((lim.max - zp) * scale)


def random_inputs(model: bytes, n: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``n`` seeded samples, each a tuple with one array per model input (shape and dtype of the input tensor).

    Integer inputs cover their type's whole range uniformly (int8: [-128, 127], uint8: [0, 255], int16/int32:
    [-32768, 32767]); bool inputs are fair coin flips; float inputs are uniform in the range their quantization
    represents (``input_range``: the input's own scale/zero point, else those of the QUANTIZE op that consumes
    it), else in [-1, 1]."""
    m = _load(model)
    info = model_info(m)
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
