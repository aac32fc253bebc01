"""One .tflite, parsed once: the bytes, the unpacked flatbuffer, its op names, and what the steps of a run read.

A pipeline reads a user's model once (``tfmcu.runtime.model_io.read_model``) and hands the ``TfliteModel`` to every
step (checks, inputs, interpreters, the arena prediction, the firmware sources); functions that also serve callers
holding bytes take either and call ``as_model``, which parses only when given bytes.

* ``data``: the whole file (flatbuffer + any associated files appended as a zip); ``bytes(m)`` and ``len(m)``
  are those of ``data``, so code that writes or measures the file is unchanged;
* ``flatbuffer``: the unpacked ``ModelT`` (shared: read it, never edit it; ``tfmcu.tflite.editor.ModelEditor``
  edits a copy of the bytes);
* ``members``: the associated files (``split_appended_zip``: the zip TFLite metadata appends after the flatbuffer),
  split once;
* ``op_names`` (``"CONV_2D"`` ... ``"custom:NAME"``, per operator of subgraph 0), ``info`` (the signature: inputs
  and outputs with shape, dtype and quantization, ``ModelInfo``) and ``custom_options(name)``.

A model the one editor decided (``tfmcu.tflite.editor.ModelEditor.decided``) is a ``TfliteModel`` too, before any
byte of it exists: its ``flatbuffer`` is the edited object tree, the custom options of the operators the editor
added are still their decoded maps (``decided_options``), and ``data`` is written the first time it is asked for.
Whatever reads a model (the graph lowering, the arena and latency predictors) reads such a model as it would read
its file, so a candidate is priced without being written, and only the ones kept are.

A file that is not a readable TFLite model is a one-line ``SchemaError`` naming ``where``.
"""

from __future__ import annotations

import functools
import io
import zipfile
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu.tflite import schema as ts

Members = list[tuple[zipfile.ZipInfo, bytes]]


def split_appended_zip(data: bytes) -> tuple[bytes, Members]:
    """The flatbuffer and the associated files TFLite metadata appends as a zip after it (if any)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        members = [(info, zf.read(info)) for info in zf.infolist()]
    except zipfile.BadZipFile:
        return data, []
    return data, members


def append_zip(model: bytes, members: Members) -> bytes:
    """``model`` with the associated files ``members`` appended as a zip (unchanged if there are none)."""
    if not members:
        return model
    buf = io.BytesIO(model)
    buf.seek(0, io.SEEK_END)
    with zipfile.ZipFile(buf, "a") as zf:
        for info, payload in members:
            zf.writestr(info, payload)
    return buf.getvalue()


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

    @property
    def label(self) -> str:
        """``int8[1, 96, 96, 3]``: the dtype and shape, for messages."""
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class ModelInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_ops: int
    op_names: tuple[str, ...]  # "CONV_2D", ... "custom:NAME", per operator

    @property
    def custom_ops(self) -> list[str]:
        return sorted({n.split(":", 1)[1] for n in self.op_names if n.startswith("custom:")})


def tensor_info(m: ts.ModelT, index: int) -> TensorInfo:
    """Name, shape, dtype and per-tensor quantization of tensor ``index`` of subgraph 0."""
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


class TfliteModel:
    """A .tflite read and unpacked once, or decided by the editor and written on demand (see the module
    docstring)."""

    def __init__(self, data: bytes, where: str = "model"):
        self.data = bytes(data)
        self.where = where
        flat, members = split_appended_zip(self.data)
        self.members: Members = members
        self.flatbuffer = ts.load_model(flat, where)
        self.decided_options: dict[int, Any] = {}

    @classmethod
    def decided(cls, flatbuffer: ts.ModelT, members: Members, options: dict[int, Any],
                write: Callable[[], bytes], where: str = "model") -> "TfliteModel":
        """A model decided by the editor and not written yet: ``flatbuffer`` (read only from here on), the decoded
        custom ``options`` of the operators whose options are not serialized yet (by operator index), and ``write``,
        which serializes it (``data``, called once, the first time the bytes are asked for)."""
        m = cls.__new__(cls)
        m.where, m.members, m.flatbuffer, m.decided_options = where, list(members), flatbuffer, dict(options)
        m._write = write
        return m

    @functools.cached_property
    def data(self) -> bytes:  # (set in __init__ for a model read from bytes: only a decided model gets here)
        """The whole file: written from the decided model the first time it is asked for."""
        return self._write()

    @property
    def written(self) -> bool:
        """Whether the bytes exist (a model read from bytes, or a decided model written since)."""
        return "data" in self.__dict__

    def __bytes__(self) -> bytes:
        return self.data

    def __len__(self) -> int:
        return len(self.data)

    def __reduce__(self) -> tuple:  # a child process (tfmcu.runtime.isolate) gets the bytes and parses them itself
        return TfliteModel, (self.data, self.where)

    @functools.cached_property
    def op_names(self) -> tuple[str, ...]:
        """Per operator of subgraph 0: ``"CONV_2D"`` ... or ``"custom:NAME"`` (``SchemaError`` for a bad op code)."""
        m = self.flatbuffer
        return tuple(ts.op_name(m, op) for op in m.subgraphs[0].operators or [])

    @functools.cached_property
    def info(self) -> ModelInfo:
        """Inputs / outputs of subgraph 0 (in the model's order) and the operator names (``SchemaError`` for a bad
        op code)."""
        sg = self.flatbuffer.subgraphs[0]
        ins = tuple(tensor_info(self.flatbuffer, int(i)) for i in (sg.inputs if sg.inputs is not None else []))
        outs = tuple(tensor_info(self.flatbuffer, int(i)) for i in (sg.outputs if sg.outputs is not None else []))
        return ModelInfo(ins, outs, len(self.op_names), self.op_names)

    def custom_options(self, name: str) -> list[bytes]:
        """The options (flexbuffer bytes) of every custom op ``name`` of subgraph 0, in operator order (ops without
        options are skipped)."""
        ops = self.flatbuffer.subgraphs[0].operators or []
        return [np.asarray(op.customOptions, np.uint8).tobytes() for op, n in zip(ops, self.op_names)
                if n == f"custom:{name}" and op.customOptions is not None]


def as_model(model: TfliteModel | bytes | bytearray | memoryview, where: str = "model") -> TfliteModel:
    """``model`` itself when already parsed; else its bytes parsed (``where`` names the file in errors)."""
    return model if isinstance(model, TfliteModel) else TfliteModel(bytes(model), where)
