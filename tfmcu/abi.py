"""The patch-stage ABI, stated once for Python: what ``tflm_patch_kernels/`` and the ``TFMCU_PATCH_STAGE`` custom
options agree on. Every Python user reads it from here; ``tests/test_abi.py`` checks it against the C headers
(``tfmcu_common.h``, ``op_table.h``, ``patch_stage_types.h``, ``patch_stage.h``, the params headers), ``op_table.c``
and the TFLM kernel.

* Codes: ``STATUS`` (``TfmcuStatus``), ``INT8`` / ``FLOAT32`` (``TfmcuDataType``), ``OP_CONV`` .. ``OP_SUB``
  (``TfmcuOpType``), ``ABI_VERSION`` (``TFMCU_PATCH_STAGE_ABI_VERSION``).
* Structs: ``STRUCTS``, every C struct Python builds or reads as its field list ``(name, C type)`` in declaration
  order. ``structure(name)`` derives the ctypes mirror, ``sizeof(name, pointer_bytes)`` the C size on a 64-bit host
  or a 32-bit Cortex-M, ``word_offsets(name)`` where each field of an all-int32 struct (a table row) starts.
* Ops: ``OPS``, one ``Op`` per op type (the rows of ``op_table.c``): its params struct, whose leading pointer
  fields are the op's constant arrays and the rest its scalar "words" (``params_to_words`` / ``params_from_words``).
* The stage blob (``patch_stage_types.h``): the whole stage as one constant byte array without pointers, the same
  bytes for 32- and 64-bit targets: its header ``TfmcuStageBlob`` and its tables (``BLOB_TABLES``: each table's
  row struct or element type, in the order they are laid out), each at a 4-byte aligned byte offset (``BLOB_ALIGN``);
  a layer's params record (``params_record``: its arrays' byte offsets into the constants, then its scalar words).
* Options: ``PATCH_STAGE_OP``, ``FORMAT_VERSION`` / ``OLDEST_FORMAT_VERSION``, the keys the kernel reads
  (``OPTION_KEYS`` with the format version that introduced each), the op's input holding the blob (``BLOB_INPUT``),
  the names of a layer's constant arrays (``ARRAY_NAMES``), the kernel's op data (``STRUCTS["TfmcuPatchStageOpData"]``).
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any, Sequence

ABI_VERSION = 8  # TFMCU_PATCH_STAGE_ABI_VERSION (patch_stage.h)
MAX_PASSES = 16  # TFMCU_MAX_PASSES (patch_stage_types.h)
MAX_LAYER_INPUTS = 2  # TFMCU_MAX_LAYER_INPUTS (op_table.h)
MAX_PARAM_ARRAYS = 4  # TFMCU_MAX_PARAM_ARRAYS (tfmcu_common.h)
# TFMCU_CONV1X1_FOLDED(pixels, in_channels) (cmsis_nn/cmsis_nn_backend.h): the CMSIS-NN backend calls of a 1x1
# convolution whose input offset the packer folded into its bias (input_offset 0) that run our product, not
# CMSIS-NN's (on DSP cores without Helium); ``conv1x1_folded`` decides the same (tests/test_abi.py compares the
# macro's text with CONV1X1_FOLDED_RULE).
CONV1X1_FOLDED_RULE = "((pixels) > 1)"
# That product's function (cmsis_nn/conv1x1_folded.c, declared in cmsis_nn_backend.h): the latency calibration
# counts the instructions run inside it (benchmarks/latency.py)
CONV1X1_FOLDED_SYMBOL = "tfmcu_conv1x1_folded_s8"
# TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS (cmsis_nn/cmsis_nn_backend.h): on cores with the DSP extension and without
# Helium the CMSIS-NN backend runs a depthwise layer with a 3x3 kernel, depth multiplier 1, no dilation and at most
# this many channels through our kernel (depthwise_conv3x3.c), not CMSIS-NN's; ``depthwise3x3_ours`` decides the same
# (the latency predictor prices those layers apart)
DEPTHWISE_CONV3X3_MAX_CHANNELS = 128
DEPTHWISE_CONV3X3_RULE = ("(tfmcu_depthwise_conv3x3_covers(p) && (channels) <= "
                          "TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS)")
# TFMCU_CONV2D_SHALLOW_MAX_DEPTH / _MAX_OUT (conv2d.h) and TFMCU_CONV2D_SHALLOW_OURS (cmsis_nn/cmsis_nn_backend.h): on
# cores with the DSP extension and without Helium the CMSIS-NN backend runs a convolution with a kernel larger than
# 1x1 over a window of at most this many values (kernel_h x kernel_w x in_channels) into at most this many output
# channels, no groups or dilation, through our kernel (conv2d_shallow.c); ``conv_shallow_ours`` decides the same
CONV2D_SHALLOW_MAX_DEPTH = 32
CONV2D_SHALLOW_MAX_OUT = 32
CONV2D_SHALLOW_RULE = ("((p)->kernel_h * (p)->kernel_w > 1 && tfmcu_conv2d_shallow_covers(p, in_channels, "
                       "out_channels))")
# TFMCU_LUT_MIN_ELEMENTS (tfmcu_lut.h): a call of HARD_SWISH, LOGISTIC, TANH or LEAKY_RELU over at least this many
# elements maps them through a table of the op's 256 values built for the call (the latency predictor prices such
# calls apart: ``LUT_OPS``)
LUT_MIN_ELEMENTS = 512
LUT_OPS = ("HARD_SWISH", "LOGISTIC", "TANH", "LEAKY_RELU")
# TFMCU_LUT_MAX_CHANNELS (tfmcu_lut.h): ADD, SUB and MUL with a one-pixel operand 2 map a call through one table
# (every channel of the operand the same value) or one per channel (at most this many), ``lut_lanes``
LUT_MAX_CHANNELS = 4


def lut_lanes(operand: Sequence[int] | None, channels: int) -> int:
    """tfmcu_lut_lanes' tables for a one-pixel operand 2 of ``channels`` channels (``operand``: its values, a
    constant's; None: computed at run time, taken as differing): 1, ``channels`` or 0 (element by element). The
    elements a call needs for them (``lanes x LUT_MIN_ELEMENTS``) are the caller's to check."""
    same = operand is not None and len(set(int(v) for v in operand)) == 1
    lanes = 1 if same or channels == 1 else channels
    return lanes if lanes <= LUT_MAX_CHANNELS else 0


def depthwise3x3_ours(kernel: Sequence[int], depth_multiplier: int, dilation: Sequence[int], channels: int) -> bool:
    """TFMCU_DEPTHWISE_CONV3X3_OURS: whether a depthwise layer the CMSIS-NN backend covers runs our 3x3 kernel (on a
    core with the DSP extension and without Helium)."""
    return (tuple(kernel) == (3, 3) and depth_multiplier == 1 and tuple(dilation) == (1, 1)
            and channels <= DEPTHWISE_CONV3X3_MAX_CHANNELS)


def conv_shallow_ours(kernel: Sequence[int], groups: int, dilation: Sequence[int], in_channels: int,
                      out_channels: int, input_offset: int) -> bool:
    """TFMCU_CONV2D_SHALLOW_OURS: whether a convolution the CMSIS-NN backend covers runs our shallow-window kernel
    (on a core with the DSP extension and without Helium)."""
    kh, kw = (int(k) for k in kernel)
    return (kh * kw > 1 and groups == 1 and tuple(dilation) == (1, 1)
            and kh * kw * in_channels <= CONV2D_SHALLOW_MAX_DEPTH and out_channels <= CONV2D_SHALLOW_MAX_OUT
            and -127 <= input_offset <= 128)


def conv1x1_folded(pixels: Any, in_channels: Any) -> Any:
    """TFMCU_CONV1X1_FOLDED: whether a call of ``pixels`` pixels over ``in_channels`` input channels runs the folded
    product (ints, or numpy arrays element-wise)."""
    del in_channels  # (the rule's signature: every call of two pixels or more)
    return pixels > 1

# TfmcuStatus (tfmcu_common.h): (enumerator, value, what Python says).
STATUSES = (
    ("kTfmcuOk", 0, "ok"),
    ("kTfmcuErrorNullPointer", 1, "null pointer"),
    ("kTfmcuErrorScratchTooSmall", 2, "scratch buffer too small"),
    ("kTfmcuErrorInvalidStage", 3, "invalid stage description"),
    ("kTfmcuErrorUnsupportedOp", 4, "unsupported op or data type"),
    ("kTfmcuErrorShapeMismatch", 5, "shape mismatch"),
    ("kTfmcuErrorEmptyWindow", 6, "pooling window without input pixels"),
)
STATUS = {value: text for _, value, text in STATUSES}

# TfmcuDataType (op_table.h).
INT8, FLOAT32 = 0, 1
DATA_TYPES = (("kTfmcuInt8", INT8), ("kTfmcuFloat32", FLOAT32))

# TfmcuOpType (op_table.h).
OP_CONV, OP_DEPTHWISE, OP_ADD, OP_PAD, OP_AVG_POOL, OP_MAX_POOL, OP_QUANTIZE, OP_MEAN = range(1, 9)
OP_MUL, OP_HARD_SWISH, OP_LOGISTIC, OP_TANH, OP_LEAKY_RELU, OP_SUB = range(9, 15)


# ============================================================================= structs
def _i32(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "int32_t") for n in names)


def _u32(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "uint32_t") for n in names)


_VIEW = _i32("height", "width", "channels", "row_stride")  # after `data`
_CONV_ARRAYS = (("filter", "const int8_t*"), ("bias", "const int32_t*"), ("output_multiplier", "const int32_t*"),
                ("output_shift", "const int32_t*"))
_GEOMETRY = _i32("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w")
_QUANT = _i32("input_offset", "output_offset", "act_min", "act_max")
# LOGISTIC's and TANH's params (TFLM's int8 OpData of both)
_FIXEDPOINT_ACTIVATION = _i32("input_zero_point", "input_range_radius", "input_multiplier", "input_left_shift")

# (field, C type) in declaration order; "T[n]" is an array field, "T*" a pointer, a struct name a nested struct.
STRUCTS: dict[str, tuple[tuple[str, str], ...]] = {
    # tfmcu_common.h
    "TfmcuConstView": (("data", "const int8_t*"),) + _VIEW,
    "TfmcuView": (("data", "int8_t*"),) + _VIEW,
    "TfmcuConstViewF32": (("data", "const float*"),) + _VIEW,
    "TfmcuPoolParams": _i32("filter_h", "filter_w", "stride_h", "stride_w", "act_min", "act_max"),
    # the params headers
    "TfmcuConvParams": _CONV_ARRAYS + _GEOMETRY + _i32("groups") + _QUANT,
    "TfmcuDepthwiseConvParams": _CONV_ARRAYS + _GEOMETRY + _i32("depth_multiplier") + _QUANT,
    "TfmcuAddParams": _i32("input1_offset", "input2_offset", "output_offset", "left_shift", "input1_multiplier",
                           "input1_shift", "input2_multiplier", "input2_shift", "output_multiplier",
                           "output_shift", "act_min", "act_max"),
    "TfmcuPadParams": _i32("value"),
    "TfmcuQuantizeParams": (("scale", "float"), ("zero_point", "int32_t")),
    "TfmcuMeanParams": _i32("input_offset", "output_offset", "output_multiplier", "output_shift"),
    "TfmcuMulParams": _i32("input1_offset", "input2_offset", "output_offset", "output_multiplier", "output_shift",
                           "act_min", "act_max"),
    "TfmcuHardSwishParams": _i32("input_zero_point", "output_zero_point", "reluish_multiplier_fixedpoint_int16",
                                 "reluish_multiplier_exponent", "output_multiplier_fixedpoint_int16",
                                 "output_multiplier_exponent"),
    "TfmcuLogisticParams": _FIXEDPOINT_ACTIVATION,
    "TfmcuTanhParams": _FIXEDPOINT_ACTIVATION,
    "TfmcuLeakyReluParams": _i32("input_zero_point", "output_zero_point", "output_multiplier_alpha",
                                 "output_shift_alpha", "output_multiplier_identity", "output_shift_identity"),
    # patch_stage_types.h
    "TfmcuTensor": _i32("height", "width", "channels", "dtype", "producer", "constant"),
    "TfmcuLayer": (("type", "int32_t"), ("params", "int32_t"), ("num_inputs", "int32_t"),
                   ("inputs", f"int32_t[{MAX_LAYER_INPUTS}]"), ("output", "int32_t"), ("passes", "int32_t"),
                   ("after_pass", "int32_t")),
    "TfmcuSpan": _i32("out_start", "out_stop") + tuple(
        (n, f"int32_t[{MAX_LAYER_INPUTS}]") for n in ("in_start", "in_stop", "pad_before", "pad_after")),
    "TfmcuCache": _i32("tensor", "axis", "offset"),
    "TfmcuStage": (("num_tensors", "int32_t"), ("tensors", "const TfmcuTensor*"), ("num_layers", "int32_t"),
                   ("layers", "const TfmcuLayer*")) + _i32("input_tensor", "output_tensor", "grid_rows", "grid_cols",
                                                           "num_passes")
                  + (("row_spans", "const TfmcuSpan*"), ("col_spans", "const TfmcuSpan*"),
                     ("buffer_offsets", "const int32_t*"), ("scratch_bytes", "uint32_t"),
                     ("row_held", "const int32_t*"), ("col_held", "const int32_t*"), ("num_caches", "int32_t"),
                     ("caches", "const TfmcuCache*"), ("params", "const int32_t*"), ("params_words", "int32_t"),
                     ("constants", "const uint8_t*"), ("constants_bytes", "uint32_t")),
    "TfmcuStageBlob": _i32("bytes", "num_tensors", "num_layers", "input_tensor", "output_tensor", "grid_rows",
                           "grid_cols", "num_passes", "scratch_bytes", "num_caches", "params_words", "constants_bytes", "tensors",
                           "layers", "params", "row_spans", "col_spans", "buffer_offsets", "row_held", "col_held",
                           "caches", "constants"),
    # patch_stage.h
    "TfmcuPreparedStage": (("stage", "const TfmcuStage*"),) + _u32("scratch_bytes", "output_bytes")
                          + _i32("ready") + _u32("kernel_scratch_offset", "kernel_scratch_bytes",
                                                 "input_window_offset", "input_window_bytes",
                                                 "streamed_scratch_bytes"),
    "TfmcuInputProvider": (("read_rows", "TfmcuReadRows"), ("context", "void*")),
    # the TFLM kernel's op data (tflm/patch_stage_op.cc), all it keeps in the arena's persistent tail
    "TfmcuPatchStageOpData": (("prepared", "TfmcuPreparedStage"),) + _i32("scratch_index", "streamed_input",
                                                                         "input_window_bytes"),
}

# Function-pointer typedefs a struct holds: name -> (return type, parameter types).
CALLBACKS = {
    "TfmcuReadRows": ("TfmcuStatus", ("void*", "int32_t", "int32_t", "void*")),  # context, row_start, count, dst
}

_SCALARS = {"int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "float": ctypes.c_float,
            "TfmcuStatus": ctypes.c_int32}


def _split(ctype: str) -> tuple[str, int]:
    """("T", n) for an array type "T[n]", else (ctype, 0)."""
    if ctype.endswith("]"):
        base, _, n = ctype[:-1].partition("[")
        return base, int(n)
    return ctype, 0


def _pointee(ctype: str) -> str | None:
    """The struct a pointer type points to ("const TfmcuSpan*" -> "TfmcuSpan"), else None."""
    name = ctype.rstrip("*").replace("const ", "").strip()
    return name if ctype.endswith("*") and name in STRUCTS else None


_CTYPES: dict[str, type] = {}


def _ctype(ctype: str) -> Any:
    base, n = _split(ctype)
    if n:
        return _ctype(base) * n
    if ctype in _SCALARS:
        return _SCALARS[ctype]
    if ctype in STRUCTS:
        return structure(ctype)
    if ctype in CALLBACKS:
        ret, args = CALLBACKS[ctype]
        return ctypes.CFUNCTYPE(_ctype(ret), *[_ctype(a) for a in args])
    pointee = _pointee(ctype)
    if pointee is not None:
        return ctypes.POINTER(structure(pointee))
    if ctype.endswith("*"):
        return ctypes.c_void_p  # arrays and opaque pointers: an address (or None)
    raise ValueError(f"C type {ctype!r} is not in the ABI")


def structure(name: str) -> type:
    """The ctypes mirror of C struct ``name`` (one class per struct, built on first use): pointers to other ABI
    structs are typed pointers, every other pointer a ``c_void_p``, callbacks ``CFUNCTYPE``s."""
    if name not in _CTYPES:
        _CTYPES[name] = type(name, (ctypes.Structure,), {"_fields_": [(f, _ctype(t)) for f, t in STRUCTS[name]]})
    return _CTYPES[name]


def callback(name: str) -> Any:
    """The ctypes ``CFUNCTYPE`` of function-pointer typedef ``name`` (``CALLBACKS``)."""
    if name not in CALLBACKS:
        raise ValueError(f"{name!r} is not a callback of the ABI")
    return _ctype(name)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _size_align(ctype: str, pointer_bytes: int) -> tuple[int, int]:
    base, n = _split(ctype)
    if n:
        size, align = _size_align(base, pointer_bytes)
        return size * n, align
    if ctype in STRUCTS:
        return sizeof(ctype, pointer_bytes), _struct_align(ctype, pointer_bytes)
    if ctype.endswith("*") or ctype in CALLBACKS:
        return pointer_bytes, pointer_bytes
    if ctype in _SCALARS:
        return 4, 4
    raise ValueError(f"C type {ctype!r} is not in the ABI")


def _struct_align(name: str, pointer_bytes: int) -> int:
    return max(_size_align(t, pointer_bytes)[1] for _, t in STRUCTS[name])


def sizeof(name: str, pointer_bytes: int = 8) -> int:
    """sizeof C struct ``name`` where pointers take ``pointer_bytes`` (8: 64-bit hosts, 4: Cortex-M): each field
    at its natural alignment, the size rounded up to the largest one."""
    at = 0
    for _, t in STRUCTS[name]:
        size, align = _size_align(t, pointer_bytes)
        at = _align(at, align) + size
    return _align(at, _struct_align(name, pointer_bytes))


def word_offsets(name: str) -> dict[str, int]:
    """For a struct of int32 fields (a row of an INT32 table, e.g. TfmcuSpan): the word where each field starts."""
    out, at = {}, 0
    for f, t in STRUCTS[name]:
        base, n = _split(t)
        if base != "int32_t":
            raise ValueError(f"{name}.{f} is {t}, not int32")
        out[f] = at
        at += max(n, 1)
    return out


def words(name: str) -> int:
    """The int32 words of an all-int32 struct (a table row)."""
    last, ctype = STRUCTS[name][-1]
    return word_offsets(name)[last] + max(_split(ctype)[1], 1)


SPAN_WORDS = words("TfmcuSpan")  # one TfmcuSpan in the row_spans / col_spans tables
TENSOR_WORDS = words("TfmcuTensor")  # one row of the "tensors" table
LAYER_WORDS = words("TfmcuLayer")  # one row of the "layers" table
CACHE_WORDS = words("TfmcuCache")  # one row of the "caches" table
HELD_WORDS = 2  # one [start, stop) pair of the row_held / col_held tables


# ============================================================================= ops
@dataclass(frozen=True)
class Op:
    """One row of the op table (``op_table.c``): type code and enumerator, the TFLite op it is named after, its
    params struct, its activation inputs and their data type."""

    code: int
    enumerator: str  # TfmcuOpType
    name: str
    c_struct: str
    num_inputs: int = 1
    input_dtype: int = INT8

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        return STRUCTS[self.c_struct]

    @property
    def arrays(self) -> tuple[str, ...]:
        """The leading pointer fields: the op's constant arrays, in order (``tfmcu_op_bind``)."""
        out = []
        for f, t in self.fields:
            if not t.endswith("*"):
                break
            out.append(f)
        return tuple(out)

    @property
    def words(self) -> tuple[tuple[str, str], ...]:
        """The scalar fields after the arrays, each a 4-byte word (int32, or a float as its bits)."""
        return self.fields[len(self.arrays):]


OPS: dict[int, Op] = {op.code: op for op in (
    Op(OP_CONV, "kTfmcuOpConv2D", "CONV_2D", "TfmcuConvParams"),
    Op(OP_DEPTHWISE, "kTfmcuOpDepthwiseConv2D", "DEPTHWISE_CONV_2D", "TfmcuDepthwiseConvParams"),
    Op(OP_ADD, "kTfmcuOpAdd", "ADD", "TfmcuAddParams", num_inputs=2),
    Op(OP_PAD, "kTfmcuOpPad", "PAD", "TfmcuPadParams"),
    Op(OP_AVG_POOL, "kTfmcuOpAveragePool2D", "AVERAGE_POOL_2D", "TfmcuPoolParams"),
    Op(OP_MAX_POOL, "kTfmcuOpMaxPool2D", "MAX_POOL_2D", "TfmcuPoolParams"),
    Op(OP_QUANTIZE, "kTfmcuOpQuantize", "QUANTIZE", "TfmcuQuantizeParams", input_dtype=FLOAT32),
    Op(OP_MEAN, "kTfmcuOpMean", "MEAN", "TfmcuMeanParams"),
    Op(OP_MUL, "kTfmcuOpMul", "MUL", "TfmcuMulParams", num_inputs=2),
    Op(OP_HARD_SWISH, "kTfmcuOpHardSwish", "HARD_SWISH", "TfmcuHardSwishParams"),
    Op(OP_LOGISTIC, "kTfmcuOpLogistic", "LOGISTIC", "TfmcuLogisticParams"),
    Op(OP_TANH, "kTfmcuOpTanh", "TANH", "TfmcuTanhParams"),
    Op(OP_LEAKY_RELU, "kTfmcuOpLeakyRelu", "LEAKY_RELU", "TfmcuLeakyReluParams"),
    Op(OP_SUB, "kTfmcuOpSub", "SUB", "TfmcuAddParams", num_inputs=2),
)}


def op(code: int) -> Op:
    """The op of type ``code`` (``ValueError`` for an unknown one)."""
    if code not in OPS:
        raise ValueError(f"unknown C kernel op type {code}")
    return OPS[code]


def params_to_words(code: int, params: dict[str, Any]) -> list[int]:
    """Op ``code``'s scalar params in the C struct's field order, floats as their IEEE-754 bits: what
    ``tfmcu_op_bind`` reads (the options' layer "words")."""
    out = []
    for name, ctype in op(code).words:
        v = params[name]
        out.append(struct.unpack("<i", struct.pack("<f", float(v)))[0] if ctype == "float" else int(v))
    return out


def params_from_words(code: int, words: Sequence[int]) -> dict[str, Any]:
    """The inverse of ``params_to_words`` (ValueError when the count is not the op's)."""
    fields = op(code).words
    if len(words) != len(fields):
        raise ValueError(f"{op(code).name} has {len(fields)} scalar params, not {len(words)}")
    return {name: (struct.unpack("<f", struct.pack("<i", int(w)))[0] if ctype == "float" else int(w))
            for (name, ctype), w in zip(fields, words)}


# ============================================================================= the stage blob
# The tables of a stage blob in the order they are laid out after the TfmcuStageBlob header (its field of the same
# name holds each one's byte offset, 0 for an absent one), with the int32 words of one row ("constants": bytes):
# tensors [num_tensors], layers [num_layers], params [params_words], row_spans / col_spans [bands][layers],
# buffer_offsets [patches][tensors], row_held / col_held [bands][layers] (only with caches), caches [num_caches],
# constants [constants_bytes] (each array 4-byte aligned; filters int8, the other arrays int32).
BLOB_TABLES = {"tensors": TENSOR_WORDS, "layers": LAYER_WORDS, "params": 1, "row_spans": SPAN_WORDS,
               "col_spans": SPAN_WORDS, "buffer_offsets": 1, "row_held": HELD_WORDS, "col_held": HELD_WORDS,
               "caches": CACHE_WORDS, "constants": 0}
BLOB_ALIGN = 4  # every table and every array of the constants starts at a multiple of it
NO_ARRAY = -1  # a params record's array offset for a NULL array (e.g. a convolution without bias)


def params_record(code: int, offsets: Sequence[int], words: Sequence[int]) -> list[int]:
    """A layer's params record (patch_stage_types.h): its arrays' byte offsets into the constants (``NO_ARRAY``: none;
    op table order), then its scalar words (``params_to_words``)."""
    o = op(code)
    if len(offsets) != len(o.arrays) or len(words) != len(o.words):
        raise ValueError(f"{o.name}: {len(o.arrays)} arrays and {len(o.words)} words, not {len(offsets)} and "
                         f"{len(words)}")
    return [int(v) for v in offsets] + [int(v) for v in words]


# ============================================================================= the TFMCU_PATCH_STAGE custom options
PATCH_STAGE_OP = "TFMCU_PATCH_STAGE"  # kPatchStageOpName
FORMAT_VERSION = 5  # kPatchStageFormatVersion: the stage as a stage blob of this ABI, the op's constant input BLOB_INPUT
OLDEST_FORMAT_VERSION = 5  # kPatchStageOldestFormatVersion (an older blob: rewrite the model from its original)
BLOB_INPUT = 1  # kPatchStageBlobInput: the op's inputs are [stage input, stage blob]

# The keys of the options map the kernel reads, with the format version that introduced each. The writer adds what
# tfmcu's tools read back and the kernel does not: "name", and per layer its "name", "src" (the TFLite operator it
# came from) and "padding" (top, bottom, left, right).
OPTION_KEYS = {"version": 2, "streamed_input": 3, "input_window_bytes": 3}
ARRAY_NAMES = tuple(f for f, _ in _CONV_ARRAYS)  # an op's constant arrays, in a params record's order
