"""TFLM's offline memory plan as stored in a model: the "OfflineMemoryAllocation" metadata.

Format (TFLM's ``micro_allocation_info.cc``): int32 little-endian ``[version = 1, subgraph = 0, number of tensors,
offset of tensor 0, offset of tensor 1, ...]``, an offset of -1 meaning "planned online". TFLM places every tensor
with an offset exactly there and plans the others (and kernel scratch buffers) around them; it does not check that
the offsets are consistent. Tensors are named by their index in subgraph 0.
"""

from __future__ import annotations

import numpy as np

from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import OFFLINE_PLAN_METADATA, ModelEditor, get_metadata
from tfmcu.tflite.model import TfliteModel, as_model

VERSION = 1


def read(model: bytes | TfliteModel | ts.ModelT) -> list[int] | None:
    """Offsets per tensor index (-1: online) of the model's offline plan; None if it has none (or another version)."""
    m = model if isinstance(model, ts.ModelT) else as_model(model).flatbuffer
    raw = get_metadata(m, OFFLINE_PLAN_METADATA)
    if raw is None or len(raw) < 12 or len(raw) % 4:
        return None
    values = np.frombuffer(raw, dtype="<i4")
    if values[0] != VERSION:
        return None
    return [int(v) for v in values[3:]]


def write(data: bytes | TfliteModel, offsets: dict[int, int]) -> bytes | TfliteModel:
    """``data`` with an offline plan placing tensor ``index`` at ``offsets[index]`` (the others online), replacing
    any plan it had. Associated files appended after the flatbuffer are kept. Bytes in, bytes out; a parsed or
    decided model in (``tfmcu.tflite.model``), a decided model out (nothing written)."""
    ed = ModelEditor(data)
    values = [-1] * len(ed.subgraph.tensors)
    for index, off in offsets.items():
        values[int(index)] = int(off)
    ed.set_metadata(OFFLINE_PLAN_METADATA, np.asarray([VERSION, 0, len(values)] + values, dtype="<i4").tobytes())
    return ed.to_bytes() if isinstance(data, (bytes, bytearray, memoryview)) else ed.decided(data.where)
