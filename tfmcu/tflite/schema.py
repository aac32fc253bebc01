"""The TFLite flatbuffer schema: the one place tfmcu imports it (object API from the tflite-micro wheel).

Generic helpers shared by the reader (``tfmcu.graph.from_tflite``) and the model editor (``tfmcu.tflite.editor``):

* ``load_model(data, where)``: bytes -> ``ModelT`` (checks the ``TFL3`` file identifier first);
* ``write_model(model)``: ``ModelT`` -> bytes (finished with the ``TFL3`` identifier);
* ``op_name(model, op)``: ``"CONV_2D"`` ... or ``"custom:NAME"``; ``builtin_name`` / ``builtin_code`` for codes;
* ``dtype_name`` / ``itemsize`` for a ``TensorType`` value; ``buffer_array`` for a constant tensor's data;
* ``is_constant`` / ``tensor_name`` / ``tensor_shape``; ``text`` for a flatbuffer string (bytes or str).

Nothing here knows about tfmcu's IR. Errors are ``SchemaError`` (a ``ValueError``) with one line.
"""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

from tfmcu.errors import TfmcuError

FILE_IDENTIFIER = b"TFL3"

ModelT = schema.ModelT
SubGraphT = schema.SubGraphT
OperatorT = schema.OperatorT
OperatorCodeT = schema.OperatorCodeT
TensorT = schema.TensorT
BufferT = schema.BufferT
BuiltinOperator = schema.BuiltinOperator
BuiltinOptions = schema.BuiltinOptions
TensorType = schema.TensorType
Padding = schema.Padding
ActivationFunctionType = schema.ActivationFunctionType


class SchemaError(TfmcuError):
    """The bytes are not a readable TFLite model; one line naming the file."""


def _enum_names(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


BUILTIN_NAMES: dict[int, str] = _enum_names(BuiltinOperator)
TENSOR_TYPE_NAMES: dict[int, str] = _enum_names(TensorType)
ACTIVATION_NAMES: dict[int, str] = _enum_names(ActivationFunctionType)

# Bytes per element as stored (sub-byte types count as one byte: TFLM unpacks them per element).
_ITEMSIZE = {
    "FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "STRING": 1, "BOOL": 1, "INT16": 2,
    "COMPLEX64": 8, "INT8": 1, "FLOAT64": 8, "COMPLEX128": 16, "UINT64": 8, "RESOURCE": 1, "VARIANT": 1,
    "UINT32": 4, "UINT16": 2, "INT4": 1, "BFLOAT16": 2, "INT2": 1, "UINT4": 1, "FLOAT8_E4M3FN": 1,
    "FLOAT8_E5M2": 1,
}
_NUMPY = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8, "INT64": np.int64,
    "BOOL": np.bool_, "INT16": np.int16, "INT8": np.int8, "FLOAT64": np.float64, "UINT64": np.uint64,
    "UINT32": np.uint32, "UINT16": np.uint16, "COMPLEX64": np.complex64, "COMPLEX128": np.complex128,
}

CONTROL_FLOW_OPS = ("IF", "WHILE", "CALL_ONCE", "CALL", "STABLEHLO_WHILE", "STABLEHLO_CASE",
                    "STABLEHLO_COMPOSITE")


# ----------------------------------------------------------------------------- reading and writing
def has_identifier(data: bytes) -> bool:
    return len(data) >= 8 and bytes(data[4:8]) == FILE_IDENTIFIER


def load_model(data: bytes, where: str = "model") -> ModelT:
    """Unpack a .tflite flatbuffer into the object API; ``where`` names the file in error messages."""
    if not has_identifier(data):
        raise SchemaError(f"{where} is not a TFLite flatbuffer (no 'TFL3' file identifier)")
    try:
        # A private bytearray: the object API's numpy vectors (shapes, buffer data) are views into it, so they are
        # writable for rewriters and independent of the caller's bytes.
        model = ModelT.InitFromPackedBuf(bytearray(data), 0)
    except Exception as e:  # flatbuffers raises struct.error / IndexError / ... on corrupt data
        raise SchemaError(f"{where} is a corrupt TFLite flatbuffer ({type(e).__name__}: {e})") from None
    if not model.subgraphs:
        raise SchemaError(f"{where} is a TFLite flatbuffer without subgraphs")
    return model


def write_model(model: ModelT) -> bytes:
    """Serialize a ``ModelT`` (e.g. after rewriting) with the ``TFL3`` file identifier."""
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


# ----------------------------------------------------------------------------- operators
def builtin_code(code: OperatorCodeT) -> int:
    """The builtin operator of an operator code (schema v3a: the larger of the deprecated int8 field and
    ``builtinCode``; old files only fill the deprecated one)."""
    return max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))


def builtin_name(code: int) -> str:
    return BUILTIN_NAMES.get(int(code), f"BUILTIN_{int(code)}")


def text(value: Any) -> str:
    """A flatbuffer string field (bytes, str or None) as str."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def op_name(model: ModelT, op: OperatorT) -> str:
    """``"CONV_2D"``, ``"DEPTHWISE_CONV_2D"`` ... for builtins, ``"custom:NAME"`` for custom ops."""
    codes = model.operatorCodes or []
    if not 0 <= op.opcodeIndex < len(codes):
        raise SchemaError(f"operator refers to operator code {op.opcodeIndex}, the model has {len(codes)}")
    code = codes[op.opcodeIndex]
    b = builtin_code(code)
    if b == BuiltinOperator.CUSTOM:
        return f"custom:{text(code.customCode)}"
    return builtin_name(b)


def activation_name(value: int | None) -> str:
    """Fused activation enum -> "none", "relu", "relu6", "relu_n1_to_1", "tanh", "sign_bit"."""
    return ACTIVATION_NAMES.get(int(value or 0), f"activation_{value}").lower()


# ----------------------------------------------------------------------------- tensors
def dtype_name(tensor_type: int) -> str:
    """``TensorType`` value -> "int8", "float32", ... (lower case)."""
    return TENSOR_TYPE_NAMES.get(int(tensor_type), f"type_{tensor_type}").lower()


def itemsize(tensor_type: int) -> int:
    return _ITEMSIZE.get(TENSOR_TYPE_NAMES.get(int(tensor_type), ""), 1)


def numpy_dtype(tensor_type: int) -> Any:
    name = TENSOR_TYPE_NAMES.get(int(tensor_type), "")
    if name not in _NUMPY:
        raise SchemaError(f"tensor type {name or tensor_type} has no numpy equivalent")
    return _NUMPY[name]


def tensor_name(tensor: TensorT) -> str:
    return text(tensor.name)


def tensor_shape(tensor: TensorT) -> tuple[int, ...]:
    """Static shape; dynamic (-1) dimensions count as 1."""
    shape = [] if tensor.shape is None else [int(d) for d in tensor.shape]
    return tuple(d if d > 0 else 1 for d in shape)


def buffer_data(model: ModelT, tensor: TensorT) -> bytes | None:
    """Raw bytes of a tensor's constant buffer, or None when it has none (activations, variables)."""
    buffers = model.buffers or []
    idx = int(tensor.buffer or 0)
    if idx <= 0 or idx >= len(buffers):
        return None
    data = buffers[idx].data
    if data is None or len(data) == 0:
        return None
    return np.asarray(data, dtype=np.uint8).tobytes()


def is_constant(model: ModelT, tensor: TensorT) -> bool:
    """A tensor with constant data: a non-empty buffer, a buffer stored past the flatbuffer (offset, models over
    2 GB) or an external buffer."""
    if getattr(tensor, "externalBuffer", 0):
        return True
    buffers = model.buffers or []
    idx = int(tensor.buffer or 0)
    if idx <= 0 or idx >= len(buffers):
        return False
    buf = buffers[idx]
    if buf.data is not None and len(buf.data) > 0:
        return True
    return int(getattr(buf, "offset", 0) or 0) > 1


def buffer_array(model: ModelT, tensor: TensorT) -> np.ndarray | None:
    """A constant tensor's data as a numpy array of its shape, or None if it has no inline buffer."""
    raw = buffer_data(model, tensor)
    if raw is None:
        return None
    arr = np.frombuffer(raw, dtype=numpy_dtype(tensor.type))
    shape = tensor_shape(tensor)
    return arr.reshape(shape) if int(np.prod(shape, dtype=np.int64)) == arr.size else arr
