"""The portable C patch kernels (``tflm_patch_kernels/``) from Python: build, ctypes binding, stage packing.

* Build: ``library()`` compiles the C sources with the system C compiler (``$CC`` or ``cc``) into a shared library,
  cached by a hash of the sources, the compiler and the flags in ``$TFMCU_CACHE_DIR`` (else
  ``$XDG_CACHE_HOME/tfmcu``, else ``~/.cache/tfmcu``, else the temp dir). Each build writes a private temp file
  and renames it into place, so concurrent processes are safe. ``$TFMCU_PATCH_KERNELS_SRC`` overrides where the
  sources are (default: ``tflm_patch_kernels/`` next to this package, in a Bazel runfiles tree or the checkout).
* ``pack_stage(model_bytes, graph, schedule) -> PackedStage``: the C description (``TfmcuStage``, see
  ``tflm_patch_kernels/patch_stage.h``) of a ``scheduler.PatchSchedule``'s patch stage of an int8 .tflite: weights,
  biases and quantization read from the flatbuffer, per-channel multipliers/shifts computed here offline exactly as
  TFLite does (``quantize_multiplier``), spans from the schedule's per-axis walks, and the patch buffers placed in
  one scratch buffer by an offline plan (``plan_buffers``).
* ``run_stage(packed, x)``: runs it in C; ``scratch_bytes(packed)``; ``touched_scratch(packed, x)`` measures the
  highest scratch byte a run writes (poisoned scratch); ``stage_to_c(packed, name)``: the stage as C source for
  firmware and C tests.
* ``run_op(model_bytes, inputs, op_index)``: one TFLite op of a model through its C kernel alone (whole tensors,
  TFLite padding) - the per-kernel test entry.

Semantics are TFLite's reference integer kernels, bit for bit (see the C headers). Errors are ``PatchKernelError``
(a ``ValueError``) with one line naming the op.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tfmcu import ir
from tfmcu import tflite_schema as ts

SOURCE_ENV = "TFMCU_PATCH_KERNELS_SRC"
CACHE_ENV = "TFMCU_CACHE_DIR"
ABI_VERSION = 1
CFLAGS = ("-O2", "-std=c99", "-fPIC", "-Wall", "-Wextra")

# Op type codes (patch_stage.h TfmcuOpType) and data types (TfmcuDataType).
OP_CONV, OP_DEPTHWISE, OP_ADD, OP_PAD, OP_AVG_POOL, OP_MAX_POOL, OP_QUANTIZE = range(1, 8)
OP_NAMES = {OP_CONV: "CONV_2D", OP_DEPTHWISE: "DEPTHWISE_CONV_2D", OP_ADD: "ADD", OP_PAD: "PAD",
            OP_AVG_POOL: "AVERAGE_POOL_2D", OP_MAX_POOL: "MAX_POOL_2D", OP_QUANTIZE: "QUANTIZE"}
INT8, FLOAT32 = 0, 1
STATUS = {0: "ok", 1: "null pointer", 2: "scratch buffer too small", 3: "invalid stage description",
          4: "unsupported op or data type", 5: "shape mismatch", 6: "pooling window without input pixels"}


class PatchKernelError(ValueError):
    """The op or stage cannot run on the C patch kernels, or the C library cannot be built; one line."""


# ============================================================================= quantization math (offline)
def _round_half_away(x: float | Fraction) -> int:
    """std::round: nearest integer, ties away from zero, computed exactly."""
    f = Fraction(x)
    n = math.floor(abs(f) + Fraction(1, 2))
    return n if f >= 0 else -n


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier (default double-rounding build): ``real`` (a double) as a Q31 multiplier and a
    power-of-two exponent, ``real ~= multiplier * 2^(shift - 31)``. frexp-based; a mantissa that rounds up to 2^31
    is halved (shift + 1); shifts below -31 flush to (0, 0); 0 gives (0, 0)."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = _round_half_away(q * float(1 << 31))  # q * 2^31 is exact in double
    if q_fixed > (1 << 31):
        raise PatchKernelError(f"multiplier {real!r} cannot be quantized")
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if q_fixed > (1 << 31) - 1:
        raise PatchKernelError(f"multiplier {real!r} cannot be quantized")
    if shift < -31:
        shift, q_fixed = 0, 0
    return int(q_fixed), int(shift)


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _quantize_scalar(scale: float, zero_point: int, value: float) -> int:
    """TFLite's Quantize helper for activation ranges: zero_point + round(value / scale), all in float32."""
    with np.errstate(all="ignore"):
        q = _f32(value) / _f32(scale)
    if not np.isfinite(q) or abs(float(q)) > 2 ** 31:
        raise PatchKernelError(f"activation bound {value} does not fit scale {scale}")
    return int(zero_point) + _round_half_away(float(q))


def activation_range(activation: str, scale: float, zero_point: int) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for an int8 output: the fused activation as a clamp range."""
    lo, hi = -128, 127
    if activation == "none":
        return lo, hi
    if activation == "relu":
        return max(lo, _quantize_scalar(scale, zero_point, 0.0)), hi
    if activation == "relu6":
        return max(lo, _quantize_scalar(scale, zero_point, 0.0)), min(hi, _quantize_scalar(scale, zero_point, 6.0))
    if activation == "relu_n1_to_1":
        return (max(lo, _quantize_scalar(scale, zero_point, -1.0)),
                min(hi, _quantize_scalar(scale, zero_point, 1.0)))
    raise PatchKernelError(f"fused activation {activation!r} is not supported (none, relu, relu6, relu_n1_to_1)")


def conv_multipliers(input_scale: float, filter_scales: Sequence[float], output_scale: float,
                     channels: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's PopulateConvolutionQuantizationParams: per output channel,
    QuantizeMultiplier(double(input_scale) * double(filter_scale) / double(output_scale)); a per-tensor filter
    scale is broadcast to every channel."""
    scales = [float(_f32(s)) for s in np.ravel(filter_scales)]
    if len(scales) not in (1, channels):
        raise PatchKernelError(f"{len(scales)} filter scales for {channels} output channels")
    mult = np.zeros(channels, np.int32)
    shift = np.zeros(channels, np.int32)
    for c in range(channels):
        s = scales[c] if len(scales) > 1 else scales[0]
        mult[c], shift[c] = quantize_multiplier(float(_f32(input_scale)) * s / float(_f32(output_scale)))
    return mult, shift


def add_params(s1: float, zp1: int, s2: float, zp2: int, s_out: float, zp_out: int,
               activation: str) -> dict[str, int]:
    """TFLite's int8 ADD preparation (general rescaling, left shift 20)."""
    left_shift = 20
    twice_max = 2.0 * float(max(_f32(s1), _f32(s2)))
    m1, sh1 = quantize_multiplier(float(_f32(s1)) / twice_max)
    m2, sh2 = quantize_multiplier(float(_f32(s2)) / twice_max)
    mo, sho = quantize_multiplier(twice_max / ((1 << left_shift) * float(_f32(s_out))))
    if max(sh1, sh2, sho) > 0:
        raise PatchKernelError("ADD rescaling multipliers must be smaller than one")
    lo, hi = activation_range(activation, s_out, zp_out)
    return dict(input1_offset=-int(zp1), input2_offset=-int(zp2), output_offset=int(zp_out), left_shift=left_shift,
                input1_multiplier=m1, input1_shift=sh1, input2_multiplier=m2, input2_shift=sh2,
                output_multiplier=mo, output_shift=sho, act_min=lo, act_max=hi)


# ============================================================================= ctypes mirror of the C structs
class ConstView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("height", ctypes.c_int32), ("width", ctypes.c_int32),
                ("channels", ctypes.c_int32), ("row_stride", ctypes.c_int32)]


View = ConstView  # same layout (int8_t* / const int8_t* / const float*)

_I32 = ctypes.c_int32
_PTR = ctypes.c_void_p


class ConvParams(ctypes.Structure):
    _fields_ = [("filter", _PTR), ("bias", _PTR), ("output_multiplier", _PTR), ("output_shift", _PTR)] + [
        (n, _I32) for n in ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w", "groups",
                            "input_offset", "output_offset", "act_min", "act_max")]


class DepthwiseConvParams(ctypes.Structure):
    _fields_ = [("filter", _PTR), ("bias", _PTR), ("output_multiplier", _PTR), ("output_shift", _PTR)] + [
        (n, _I32) for n in ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w",
                            "depth_multiplier", "input_offset", "output_offset", "act_min", "act_max")]


class AddParams(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("input1_offset", "input2_offset", "output_offset", "left_shift",
                                    "input1_multiplier", "input1_shift", "input2_multiplier", "input2_shift",
                                    "output_multiplier", "output_shift", "act_min", "act_max")]


class PadParams(ctypes.Structure):
    _fields_ = [("value", _I32)]


class PoolParams(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("filter_h", "filter_w", "stride_h", "stride_w", "act_min", "act_max")]


class QuantizeParams(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("zero_point", _I32)]


class CTensor(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("height", "width", "channels", "dtype", "producer")]


class CLayer(ctypes.Structure):
    _fields_ = [("type", _I32), ("params", _PTR), ("num_inputs", _I32), ("inputs", _I32 * 2), ("output", _I32)]


class CSpan(ctypes.Structure):
    _fields_ = [("out_start", _I32), ("out_stop", _I32), ("in_start", _I32 * 2), ("in_stop", _I32 * 2),
                ("pad_before", _I32 * 2), ("pad_after", _I32 * 2)]


class CStage(ctypes.Structure):
    _fields_ = [("num_tensors", _I32), ("tensors", ctypes.POINTER(CTensor)), ("num_layers", _I32),
                ("layers", ctypes.POINTER(CLayer)), ("input_tensor", _I32), ("output_tensor", _I32),
                ("grid_rows", _I32), ("grid_cols", _I32), ("row_spans", ctypes.POINTER(CSpan)),
                ("col_spans", ctypes.POINTER(CSpan)), ("buffer_offsets", ctypes.POINTER(_I32)),
                ("scratch_bytes", ctypes.c_uint32)]


_PARAM_STRUCTS = {OP_CONV: ConvParams, OP_DEPTHWISE: DepthwiseConvParams, OP_ADD: AddParams, OP_PAD: PadParams,
                  OP_AVG_POOL: PoolParams, OP_MAX_POOL: PoolParams, OP_QUANTIZE: QuantizeParams}
_C_STRUCT_NAMES = {OP_CONV: "TfmcuConvParams", OP_DEPTHWISE: "TfmcuDepthwiseConvParams", OP_ADD: "TfmcuAddParams",
                   OP_PAD: "TfmcuPadParams", OP_AVG_POOL: "TfmcuPoolParams", OP_MAX_POOL: "TfmcuPoolParams",
                   OP_QUANTIZE: "TfmcuQuantizeParams"}


# ============================================================================= building the library
def source_dir() -> Path:
    """Where the C sources are: $TFMCU_PATCH_KERNELS_SRC, else tflm_patch_kernels/ beside this package (runfiles
    tree first, then the real checkout)."""
    env = os.environ.get(SOURCE_ENV)
    if env:
        return Path(env)
    here = Path(os.path.abspath(__file__)).parent.parent
    candidates = [here / "tflm_patch_kernels", Path(os.path.realpath(__file__)).parent.parent / "tflm_patch_kernels"]
    for c in candidates:
        if (c / "patch_stage.h").is_file():
            return c
    raise PatchKernelError(f"C sources not found (looked in {', '.join(map(str, candidates))}; set {SOURCE_ENV})")


def sources(src: Path | None = None) -> list[Path]:
    """The library's .c and .h files (top level of the source dir only: not firmware/ or tests/)."""
    src = src or source_dir()
    files = sorted(p for p in src.iterdir() if p.suffix in (".c", ".h") and p.is_file())
    if not any(p.name == "patch_stage.c" for p in files):
        raise PatchKernelError(f"{src}: patch_stage.c is missing")
    return files


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        root = Path(env)
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "tfmcu"
    else:
        root = Path(os.path.expanduser("~")) / ".cache" / "tfmcu"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"tfmcu-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _compiler_id(cc: list[str]) -> str:
    try:
        r = subprocess.run(cc + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PatchKernelError(f"C compiler {' '.join(cc)!r} cannot run ({e})") from None
    return (r.stdout or r.stderr).splitlines()[0] if (r.stdout or r.stderr) else ""


def build_library(flags: Sequence[str] = (), src: Path | None = None, out_dir: Path | None = None) -> Path:
    """Compile the C sources into a shared library (cached by sources + compiler + flags); returns its path."""
    src = src or source_dir()
    files = sources(src)
    cc = compiler()
    all_flags = list(CFLAGS) + list(flags)
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(cc + all_flags).encode() + _compiler_id(cc).encode())
    out_dir = out_dir or cache_dir()
    lib = out_dir / f"libtfmcu_patch_kernels-{h.hexdigest()[:16]}.so"
    if lib.is_file():
        return lib
    fd, tmp = tempfile.mkstemp(prefix=lib.name + ".", suffix=".tmp", dir=out_dir)
    os.close(fd)
    cmd = cc + all_flags + ["-shared", "-o", tmp] + [str(p) for p in files if p.suffix == ".c"] + ["-I", str(src)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise PatchKernelError(f"building the C patch kernels failed: {first}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)  # atomic: a concurrent build of the same sources writes identical bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


_LIB: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The built and loaded C library (built on first use in this process)."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(build_library()))
        lib.tfmcu_patch_stage_abi_version.restype = ctypes.c_int32
        if lib.tfmcu_patch_stage_abi_version() != ABI_VERSION:
            raise PatchKernelError(f"C library ABI {lib.tfmcu_patch_stage_abi_version()}, expected {ABI_VERSION}")
        lib.tfmcu_stage_scratch_bytes.restype = ctypes.c_size_t
        lib.tfmcu_stage_output_bytes.restype = ctypes.c_size_t
        lib.tfmcu_stage_run.argtypes = [ctypes.POINTER(CStage), _PTR, _PTR, _PTR, ctypes.c_size_t]
        lib.tfmcu_stage_check.argtypes = [ctypes.POINTER(CStage), ctypes.POINTER(_I32)]
        lib.tfmcu_status_string.restype = ctypes.c_char_p
        _LIB = lib
    return _LIB


def status_text(code: int) -> str:
    return STATUS.get(int(code), f"status {code}")


# ============================================================================= layers from the .tflite
@dataclass
class Quant:
    scale: float
    zero_point: int


@dataclass
class LayerSpec:
    """One layer as the C kernels see it: op type, scalar params, constant arrays (weights, biases,
    multipliers, shifts) and where it came from."""

    type: int
    params: dict[str, Any]
    arrays: dict[str, np.ndarray | None]
    name: str
    src_index: int
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # the op's own padding (top, bottom, left, right)

    def c_params(self) -> tuple[ctypes.Structure, list[Any]]:
        """The ctypes params struct (pointing into this spec's arrays, which must stay alive)."""
        cls = _PARAM_STRUCTS[self.type]
        values = dict(self.params)
        keep = []
        for name, f_type in cls._fields_:
            if f_type is _PTR:
                a = self.arrays.get(name)
                values[name] = None if a is None else a.ctypes.data
                keep.append(a)
        return cls(**values), keep


def _tensor_quant(model: ts.ModelT, index: int, where: str) -> Quant:
    t = model.subgraphs[0].tensors[index]
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) == 0:
        raise PatchKernelError(f"{where}: tensor '{ts.tensor_name(t)}' is not quantized")
    if len(q.scale) > 1:
        raise PatchKernelError(f"{where}: activation tensor '{ts.tensor_name(t)}' has per-channel quantization")
    zp = int(np.ravel(q.zeroPoint)[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
    return Quant(float(np.float32(np.ravel(q.scale)[0])), zp)


def _dtype(model: ts.ModelT, index: int) -> str:
    return ts.dtype_name(model.subgraphs[0].tensors[index].type)


def _const(model: ts.ModelT, index: int, where: str, what: str) -> np.ndarray:
    arr = ts.buffer_array(model, model.subgraphs[0].tensors[index])
    if arr is None:
        raise PatchKernelError(f"{where}: {what} is not a constant in the model")
    return arr


def layer_spec(model: ts.ModelT, op: ir.Op, index: int | None = None) -> LayerSpec:
    """The C layer of IR op ``op`` (lowered from ``model``): params read from the flatbuffer, multipliers computed
    here. Raises PatchKernelError for ops / types the C kernels do not cover."""
    t_op = model.subgraphs[0].operators[op.src_index]
    name = ts.op_name(model, t_op)
    where = f"{op.describe(index)}" + (f" [{name}]" if name.lower() != op.type else "")
    ins = [int(t) for t in t_op.inputs]
    outs = [int(t) for t in t_op.outputs]
    opts = t_op.builtinOptions
    act = ts.activation_name(getattr(opts, "fusedActivationFunction", 0)) if opts is not None else "none"

    def int8(i: int, what: str) -> None:
        if _dtype(model, i) != "int8":
            raise PatchKernelError(f"{where}: {what} is {_dtype(model, i)}, the C kernels take int8")

    if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        x, w = ins[0], ins[1]
        b = ins[2] if len(ins) > 2 else -1
        int8(x, "the input")
        int8(outs[0], "the output")
        if _dtype(model, w) != "int8":
            raise PatchKernelError(f"{where}: weights are {_dtype(model, w)}, the C kernels take int8")
        qi, qo = _tensor_quant(model, x, where), _tensor_quant(model, outs[0], where)
        wq = model.subgraphs[0].tensors[w].quantization
        if wq is None or wq.scale is None or len(wq.scale) == 0:
            raise PatchKernelError(f"{where}: weights are not quantized")
        if wq.zeroPoint is not None and np.any(np.asarray(wq.zeroPoint) != 0):
            raise PatchKernelError(f"{where}: weights have non-zero zero points")
        filt = np.ascontiguousarray(_const(model, w, where, "the filter"), dtype=np.int8)
        out_ch, in_ch = int(op.out_channels), int(op.in_channels)
        want = ((out_ch, op.kernel[0], op.kernel[1], in_ch // max(int(op.groups), 1)) if name == "CONV_2D"
                else (1, op.kernel[0], op.kernel[1], out_ch))
        if tuple(filt.shape) != want:
            raise PatchKernelError(f"{where}: filter shape {list(filt.shape)}, expected {list(want)}")
        bias = None
        if b >= 0:
            if _dtype(model, b) != "int32":
                raise PatchKernelError(f"{where}: bias is {_dtype(model, b)}, the C kernels take int32")
            bias = np.ascontiguousarray(_const(model, b, where, "the bias"), dtype=np.int32).reshape(-1)
            if bias.size != out_ch:
                raise PatchKernelError(f"{where}: {bias.size} biases for {out_ch} output channels")
        mult, shift = conv_multipliers(qi.scale, wq.scale, qo.scale, out_ch)
        lo, hi = activation_range(act, qo.scale, qo.zero_point)
        common = dict(kernel_h=op.kernel[0], kernel_w=op.kernel[1], stride_h=op.stride[0], stride_w=op.stride[1],
                      dilation_h=op.dilation[0], dilation_w=op.dilation[1])
        tail = dict(input_offset=-qi.zero_point, output_offset=qo.zero_point, act_min=lo, act_max=hi)
        arrays = dict(filter=filt, bias=bias, output_multiplier=mult, output_shift=shift)
        if name == "CONV_2D":
            params = dict(common, groups=int(op.groups), **tail)
            typ = OP_CONV
        else:
            params = dict(common, depth_multiplier=int(op.attrs.get("depth_multiplier", 1)), **tail)
            typ = OP_DEPTHWISE
        return LayerSpec(typ, params, arrays, op.name, op.src_index, op.padding)

    if name == "ADD":
        if len(op.inputs) != 2 or op.attrs.get("broadcast") or op.attrs.get("constant_operands"):
            raise PatchKernelError(f"{where}: only ADD of two same-shape activations is supported")
        for i in ins[:2] + outs[:1]:
            int8(i, f"tensor {i}")
        q1, q2, qo = (_tensor_quant(model, i, where) for i in (ins[0], ins[1], outs[0]))
        params = add_params(q1.scale, q1.zero_point, q2.scale, q2.zero_point, qo.scale, qo.zero_point, act)
        return LayerSpec(OP_ADD, params, {}, op.name, op.src_index)

    if name in ("PAD", "PADV2"):
        if op.attrs.get("paddings") is None:
            raise PatchKernelError(f"{where}: only constant spatial padding is supported")
        int8(ins[0], "the input")
        qo = _tensor_quant(model, outs[0], where)
        value = qo.zero_point
        if name == "PADV2" and len(ins) > 2 and ins[2] >= 0:
            value = int(np.ravel(_const(model, ins[2], where, "the pad value"))[0])
        pads = np.asarray(op.attrs["paddings"]).reshape(-1, 2)
        if len(pads) != 4 or pads[0].any() or pads[3].any():
            raise PatchKernelError(f"{where}: padding of batch or channels is not supported")
        return LayerSpec(OP_PAD, dict(value=int(value)), {}, op.name, op.src_index, op.padding)

    if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        int8(ins[0], "the input")
        int8(outs[0], "the output")
        qi, qo = _tensor_quant(model, ins[0], where), _tensor_quant(model, outs[0], where)
        if (np.float32(qi.scale), qi.zero_point) != (np.float32(qo.scale), qo.zero_point):
            raise PatchKernelError(f"{where}: input and output quantization differ (TFLite requires them equal)")
        lo, hi = activation_range(act, qo.scale, qo.zero_point)
        params = dict(filter_h=op.kernel[0], filter_w=op.kernel[1], stride_h=op.stride[0], stride_w=op.stride[1],
                      act_min=lo, act_max=hi)
        typ = OP_AVG_POOL if name == "AVERAGE_POOL_2D" else OP_MAX_POOL
        return LayerSpec(typ, params, {}, op.name, op.src_index, op.padding)

    if name == "QUANTIZE":
        if _dtype(model, ins[0]) != "float32" or _dtype(model, outs[0]) != "int8":
            raise PatchKernelError(f"{where}: only QUANTIZE float32 -> int8 is supported "
                                   f"({_dtype(model, ins[0])} -> {_dtype(model, outs[0])})")
        qo = _tensor_quant(model, outs[0], where)
        return LayerSpec(OP_QUANTIZE, dict(scale=qo.scale, zero_point=qo.zero_point), {}, op.name, op.src_index)

    raise PatchKernelError(f"{where}: {name} has no C patch kernel (supported: CONV_2D, DEPTHWISE_CONV_2D, ADD, "
                           f"PAD, PADV2, AVERAGE_POOL_2D, MAX_POOL_2D, QUANTIZE)")


# ============================================================================= one op alone (kernel tests)
def _view(a: np.ndarray) -> ConstView:
    if a.ndim != 4 or a.shape[0] != 1 or not a.flags.c_contiguous:
        raise PatchKernelError(f"expected a contiguous [1, H, W, C] array, got shape {list(a.shape)}")
    _, h, w, c = a.shape
    return ConstView(a.ctypes.data, h, w, c, w * c)


def _check_arrays(spec: LayerSpec, in_channels: int, out_channels: int) -> None:
    """The constant arrays are as large as the params say (the C kernels trust them)."""
    if spec.type not in (OP_CONV, OP_DEPTHWISE):
        return
    p, a = spec.params, spec.arrays
    depth = in_channels // max(int(p.get("groups", 1)), 1) if spec.type == OP_CONV else out_channels
    sizes = {"filter": (out_channels if spec.type == OP_CONV else 1) * p["kernel_h"] * p["kernel_w"] * depth,
             "bias": out_channels, "output_multiplier": out_channels, "output_shift": out_channels}
    for name, n in sizes.items():
        arr = a.get(name)
        if arr is None and name == "bias":
            continue
        if arr is None or arr.size != n or arr.dtype != (np.int8 if name == "filter" else np.int32):
            raise PatchKernelError(f"{spec.name}: {name} must hold {n} values for these channels")


def call_kernel(spec: LayerSpec, inputs: Sequence[np.ndarray], out: np.ndarray, pad_top: int = 0,
                pad_left: int = 0) -> None:
    """Run ``spec``'s C kernel on whole arrays ([1, H, W, C]); ``out`` (int8) is written in place."""
    lib = library()
    want = np.float32 if spec.type == OP_QUANTIZE else np.int8
    if len(inputs) != (2 if spec.type == OP_ADD else 1):
        raise PatchKernelError(f"{spec.name}: {OP_NAMES[spec.type]} takes {2 if spec.type == OP_ADD else 1} inputs")
    if any(np.asarray(a).dtype != want for a in inputs) or out.dtype != np.int8:
        raise PatchKernelError(f"{spec.name}: inputs must be {np.dtype(want).name} and the output int8")
    _check_arrays(spec, int(np.asarray(inputs[0]).shape[-1]), int(out.shape[-1]))
    params, keep = spec.c_params()
    ins = [np.ascontiguousarray(a) for a in inputs]
    views = [_view(a) for a in ins]
    ov = _view(out)
    p = ctypes.byref(params)
    if spec.type == OP_CONV:
        rc = lib.tfmcu_conv2d_s8(p, ctypes.byref(views[0]), pad_top, pad_left, ctypes.byref(ov))
    elif spec.type == OP_DEPTHWISE:
        rc = lib.tfmcu_depthwise_conv2d_s8(p, ctypes.byref(views[0]), pad_top, pad_left, ctypes.byref(ov))
    elif spec.type == OP_ADD:
        rc = lib.tfmcu_add_s8(p, ctypes.byref(views[0]), ctypes.byref(views[1]), ctypes.byref(ov))
    elif spec.type == OP_PAD:
        rc = lib.tfmcu_pad_s8(p, ctypes.byref(views[0]), pad_top, pad_left, ctypes.byref(ov))
    elif spec.type == OP_AVG_POOL:
        rc = lib.tfmcu_avg_pool2d_s8(p, ctypes.byref(views[0]), pad_top, pad_left, ctypes.byref(ov))
    elif spec.type == OP_MAX_POOL:
        rc = lib.tfmcu_max_pool2d_s8(p, ctypes.byref(views[0]), pad_top, pad_left, ctypes.byref(ov))
    elif spec.type == OP_QUANTIZE:
        rc = lib.tfmcu_quantize_f32_s8(p, ctypes.byref(views[0]), ctypes.byref(ov))
    else:
        raise PatchKernelError(f"unknown op type {spec.type}")
    del keep, ins
    if rc != 0:
        raise PatchKernelError(f"{spec.name}: C kernel returned {rc} ({status_text(rc)})")


def run_op(model_bytes: bytes, inputs: Sequence[np.ndarray], op_index: int = 0,
           graph: ir.Graph | None = None) -> np.ndarray:
    """TFLite operator ``op_index`` of the model run alone through its C kernel on whole tensors (TFLite's own
    padding as border padding). ``inputs``: its activation inputs in TFLite order, each [1, H, W, C]."""
    from tfmcu.lower_tflite import from_tflite

    graph = graph or from_tflite(bytes(model_bytes))
    model = ts.load_model(bytes(model_bytes))
    ops = [o for o in graph.ops if o.src_index == op_index]
    if not ops:
        raise PatchKernelError(f"the model has no operator {op_index}")
    op = ops[0]
    spec = layer_spec(model, op, op_index)
    out_shape = graph.tensors[op.outputs[0]].shape
    out = np.zeros(out_shape, np.int8)
    want = np.float32 if spec.type == OP_QUANTIZE else np.int8
    arrays = [np.ascontiguousarray(np.asarray(a).reshape(graph.tensors[t].shape), dtype=want)
              for a, t in zip(inputs, op.inputs)]
    if len(arrays) != len(op.inputs):
        raise PatchKernelError(f"operator {op_index} takes {len(op.inputs)} inputs, got {len(inputs)}")
    call_kernel(spec, arrays, out, op.padding[0], op.padding[2])
    return out


# ============================================================================= scratch planning
@dataclass
class BufferPlan:
    offsets: list[int]
    end: int  # highest byte reached (max offset + size)
    lower_bound: int  # max over steps of the bytes alive at once
    strategy: str


def plan_buffers(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]], align: int = 4) -> BufferPlan:
    """Place buffers (``sizes`` bytes, alive during layers [first, last] inclusive) at offsets so that buffers alive
    at the same time never overlap: greedy first fit (lowest aligned offset) under several orders, keeping the
    plan that reaches the lowest end."""
    n = len(sizes)
    steps = range(min((a for a, _ in lifetimes), default=0), max((b for _, b in lifetimes), default=-1) + 1)
    bound = max((sum(s for s, (a, b) in zip(sizes, lifetimes) if a <= k <= b) for k in steps), default=0)
    orders = {
        "size": sorted(range(n), key=lambda t: (-sizes[t], lifetimes[t][0], t)),
        "start": sorted(range(n), key=lambda t: (lifetimes[t][0], -sizes[t], t)),
        "area": sorted(range(n), key=lambda t: (-(sizes[t] * (lifetimes[t][1] - lifetimes[t][0] + 1)), t)),
        "long": sorted(range(n), key=lambda t: (-(lifetimes[t][1] - lifetimes[t][0]), -sizes[t], t)),
    }
    best: BufferPlan | None = None
    for strategy, order in orders.items():
        offsets = [0] * n
        placed: list[int] = []
        for t in order:
            a, b = lifetimes[t]
            busy = sorted((offsets[u], offsets[u] + sizes[u]) for u in placed
                          if sizes[u] > 0 and lifetimes[u][0] <= b and a <= lifetimes[u][1])
            off = 0
            for lo, hi in busy:
                if off + sizes[t] <= lo:
                    break
                if hi > off:
                    off = -(-hi // align) * align
            offsets[t] = off
            placed.append(t)
        end = max((o + s for o, s in zip(offsets, sizes) if s > 0), default=0)
        if best is None or end < best.end:
            best = BufferPlan(offsets, end, bound, strategy)
    assert best is not None
    return best


# ============================================================================= stage packing
@dataclass
class PackedStage:
    """A patch stage ready for the C executor: the ctypes ``TfmcuStage`` (``c_stage``) plus everything it points to
    (kept alive here) and the same data as plain Python/numpy values for code generators."""

    name: str
    layers: list[LayerSpec]
    layer_inputs: list[list[int]]
    layer_outputs: list[int]
    tensor_names: list[str]
    tensor_shapes: list[tuple[int, int, int]]  # (H, W, C)
    tensor_dtypes: list[int]
    tensor_producers: list[int]
    tensor_tflite_index: list[int]
    input_tensor: int
    output_tensor: int
    grid: tuple[int, int]
    row_spans: np.ndarray  # [grid rows, layers, 10] int32 in CSpan field order
    col_spans: np.ndarray
    buffer_offsets: np.ndarray  # [patches, tensors] int32, -1 for input/output
    buffer_sizes: np.ndarray  # [patches, tensors] bytes (0 for input/output)
    scratch_bytes: int
    lower_bound_bytes: int  # max over patches and steps of the patch bytes alive at once (analytic)
    plan_strategies: list[str]
    c_stage: CStage = field(repr=False, default=None)  # type: ignore[assignment]
    _keep: list[Any] = field(default_factory=list, repr=False)

    def refresh_c(self) -> None:
        """Rebuild ``c_stage`` after changing any of the Python-side fields."""
        _make_c_stage(self)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, *self.tensor_shapes[self.input_tensor])

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (1, *self.tensor_shapes[self.output_tensor])

    @property
    def input_dtype(self) -> Any:
        return np.float32 if self.tensor_dtypes[self.input_tensor] == FLOAT32 else np.int8


_SPAN_FIELDS = 10


def _span_row(out: tuple[int, int], reads: list[Any]) -> list[int]:
    row = [out[0], out[1], 0, 0, 0, 0, 0, 0, 0, 0]
    for k, r in enumerate(reads):
        row[2 + k], row[4 + k], row[6 + k], row[8 + k] = r.start, r.stop, r.pad_before, r.pad_after
    return row


def pack_stage(model_bytes: bytes, graph: ir.Graph, schedule: Any, align: int = 4,
               name: str | None = None) -> PackedStage:
    """The C description of ``schedule``'s patch stage (a ``scheduler.PatchSchedule`` of ``graph``, which was
    lowered from ``model_bytes`` by ``lower_tflite.from_tflite``). ``align``: patch-buffer offsets are multiples
    of it."""
    if graph.source != "tflite":
        raise PatchKernelError("pack_stage needs a graph lowered from the .tflite itself (lower_tflite.from_tflite)")
    model = ts.load_model(bytes(model_bytes))
    s = schedule
    if len(s.stage_inputs) != 1 or len(s.stage_outputs) != 1:
        raise PatchKernelError(f"the C executor runs stages with one input and one output; this one has inputs "
                               f"{s.stage_inputs} and outputs {s.stage_outputs}")
    t_in, t_out = s.stage_inputs[0], s.stage_outputs[0]
    tensor_names = [t_in]
    for k in s.stage:
        for t in graph.ops[k].outputs:
            if t not in tensor_names:
                tensor_names.append(t)
    tid = {t: i for i, t in enumerate(tensor_names)}
    layers, layer_inputs, layer_outputs = [], [], []
    producers = [-1] * len(tensor_names)
    tfl_index = [-1] * len(tensor_names)
    for pos, k in enumerate(s.stage):
        op = graph.ops[k]
        if len(op.outputs) != 1:
            raise PatchKernelError(f"{op.describe(k)}: ops with {len(op.outputs)} outputs are not supported")
        spec = layer_spec(model, op, k)
        layers.append(spec)
        layer_inputs.append([tid[t] for t in op.inputs])
        layer_outputs.append(tid[op.outputs[0]])
        producers[tid[op.outputs[0]]] = pos
        for t, idx in op.attrs.get("tflite_tensor_index", {}).items():
            if t in tid:
                tfl_index[tid[t]] = int(idx)
    shapes, dtypes = [], []
    for t in tensor_names:
        tensor = graph.tensors[t]
        if not tensor.is_feature_map or tensor.shape[0] != 1:
            raise PatchKernelError(f"tensor '{t}' has shape {list(tensor.shape)}: expected [1, H, W, C]")
        shapes.append(tuple(int(d) for d in tensor.shape[1:]))
        if tensor.dtype not in ("int8", "float32") or (tensor.dtype == "float32" and t != t_in):
            raise PatchKernelError(f"tensor '{t}' is {tensor.dtype}: the C executor holds int8 patch buffers "
                                   f"(float32 only as the stage input)")
        dtypes.append(FLOAT32 if tensor.dtype == "float32" else INT8)

    # Spans per axis band (the schedule's walks are separable).
    def spans(walks: list[Any]) -> np.ndarray:
        arr = np.zeros((len(walks), len(s.stage), _SPAN_FIELDS), np.int32)
        for b, w in enumerate(walks):
            for pos, k in enumerate(s.stage):
                op = graph.ops[k]
                if op.outputs[0] not in w.need or any((k, p) not in w.reads for p in range(len(op.inputs))):
                    raise PatchKernelError(f"{op.describe(k)}: its output is not needed by the stage output")
                arr[b, pos] = _span_row(w.need[op.outputs[0]], [w.reads[(k, p)] for p in range(len(op.inputs))])
        return arr

    row_spans, col_spans = spans(s.rows), spans(s.cols)

    # Scratch plan, patch by patch.
    n_t = len(tensor_names)
    lifetimes = []
    for t in range(n_t):
        readers = [pos for pos, ins in enumerate(layer_inputs) if t in ins]
        lifetimes.append((producers[t], max(readers + [producers[t]])))
    scratch_ids = [t for t in range(n_t) if t not in (tid[t_in], tid[t_out])]
    patches = s.grid[0] * s.grid[1]
    offsets = np.full((patches, n_t), -1, np.int32)
    sizes = np.zeros((patches, n_t), np.int64)
    end = bound = 0
    strategies = []
    for i in range(s.grid[0]):
        for j in range(s.grid[1]):
            p = i * s.grid[1] + j
            for t in scratch_ids:
                pos = producers[t]
                rows = row_spans[i, pos, 1] - row_spans[i, pos, 0]
                cols = col_spans[j, pos, 1] - col_spans[j, pos, 0]
                sizes[p, t] = int(rows) * int(cols) * shapes[t][2]
            plan = plan_buffers([int(sizes[p, t]) for t in scratch_ids], [lifetimes[t] for t in scratch_ids], align)
            for t, off in zip(scratch_ids, plan.offsets):
                offsets[p, t] = off
            end, bound = max(end, plan.end), max(bound, plan.lower_bound)
            strategies.append(plan.strategy)
    if end >= 2 ** 31:
        raise PatchKernelError(f"scratch of {end} bytes does not fit the C description (int32 offsets)")
    packed = PackedStage(
        name=name or graph.name, layers=layers, layer_inputs=layer_inputs, layer_outputs=layer_outputs,
        tensor_names=tensor_names, tensor_shapes=shapes, tensor_dtypes=dtypes, tensor_producers=producers,
        tensor_tflite_index=tfl_index, input_tensor=tid[t_in], output_tensor=tid[t_out], grid=tuple(s.grid),
        row_spans=row_spans, col_spans=col_spans, buffer_offsets=offsets, buffer_sizes=sizes,
        scratch_bytes=int(end), lower_bound_bytes=int(bound), plan_strategies=strategies)
    _make_c_stage(packed)
    return packed


def _make_c_stage(p: PackedStage) -> None:
    keep: list[Any] = []
    tensors = (CTensor * len(p.tensor_names))(*[
        CTensor(h, w, c, dt, prod) for (h, w, c), dt, prod in zip(p.tensor_shapes, p.tensor_dtypes,
                                                                  p.tensor_producers)])
    layers = (CLayer * len(p.layers))()
    for k, spec in enumerate(p.layers):
        params, arrays = spec.c_params()
        keep += [params, arrays]
        ins = list(p.layer_inputs[k]) + [-1] * (2 - len(p.layer_inputs[k]))
        layers[k] = CLayer(spec.type, ctypes.addressof(params), len(p.layer_inputs[k]), (_I32 * 2)(*ins),
                           p.layer_outputs[k])

    def span_array(arr: np.ndarray) -> Any:
        flat = arr.reshape(-1, _SPAN_FIELDS)
        out = (CSpan * len(flat))()
        for n, r in enumerate(flat.tolist()):
            out[n] = CSpan(r[0], r[1], (_I32 * 2)(*r[2:4]), (_I32 * 2)(*r[4:6]), (_I32 * 2)(*r[6:8]),
                           (_I32 * 2)(*r[8:10]))
        return out

    rows, cols = span_array(p.row_spans), span_array(p.col_spans)
    offsets = np.ascontiguousarray(p.buffer_offsets, dtype=np.int32)
    keep += [tensors, layers, rows, cols, offsets]
    p.c_stage = CStage(len(p.tensor_names), tensors, len(p.layers), layers, p.input_tensor, p.output_tensor,
                       p.grid[0], p.grid[1], rows, cols, offsets.ctypes.data_as(ctypes.POINTER(_I32)),
                       p.scratch_bytes)
    p._keep = keep


def scratch_bytes(packed: PackedStage) -> int:
    """Bytes of scratch memory the stage needs (planned offline; the C library computes the same)."""
    return packed.scratch_bytes


def c_scratch_bytes(packed: PackedStage) -> int:
    """``tfmcu_stage_scratch_bytes`` of the C library for this stage (0 if the C side finds it invalid)."""
    return int(library().tfmcu_stage_scratch_bytes(ctypes.byref(packed.c_stage)))


def check_stage(packed: PackedStage) -> tuple[int, int]:
    """``tfmcu_stage_check``: (status, failed layer)."""
    failed = _I32(-1)
    rc = library().tfmcu_stage_check(ctypes.byref(packed.c_stage), ctypes.byref(failed))
    return int(rc), int(failed.value)


def _input_array(packed: PackedStage, x: Any) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != packed.input_shape and a.shape == packed.input_shape[1:]:
        a = a[None]
    if a.shape != packed.input_shape:
        raise PatchKernelError(f"stage input has shape {list(packed.input_shape)}, got {list(a.shape)}")
    if a.dtype != np.dtype(packed.input_dtype):
        raise PatchKernelError(f"stage input is {np.dtype(packed.input_dtype).name}, got {a.dtype.name}")
    return np.ascontiguousarray(a)


def run_stage(packed: PackedStage, x: Any, scratch: np.ndarray | None = None,
              scratch_size: int | None = None) -> np.ndarray:
    """The stage output ([1, H, W, C] int8) for input ``x`` computed by the C executor. ``scratch``: a uint8 array
    to use as scratch memory (default: a fresh one of exactly ``scratch_bytes``)."""
    a = _input_array(packed, x)
    out = np.zeros(packed.output_shape, np.int8)
    if scratch is None:
        scratch = np.zeros(max(packed.scratch_bytes, 1), np.uint8)
    size = scratch.nbytes if scratch_size is None else int(scratch_size)
    rc = library().tfmcu_stage_run(ctypes.byref(packed.c_stage), a.ctypes.data, out.ctypes.data,
                                   scratch.ctypes.data, size)
    if rc != 0:
        raise PatchKernelError(f"tfmcu_stage_run failed: {status_text(rc)} ({rc})")
    return out


def touched_scratch(packed: PackedStage, x: Any, guard: int = 256) -> tuple[int, np.ndarray]:
    """(one past the highest scratch byte a run writes, the output): runs twice on scratch poisoned with 0xA5 and
    0x5A plus ``guard`` spare bytes and looks for the last changed byte."""
    highest = 0
    out = None
    for poison in (0xA5, 0x5A):
        scratch = np.full(packed.scratch_bytes + guard, poison, np.uint8)
        out = run_stage(packed, x, scratch)
        changed = np.flatnonzero(scratch != poison)
        if changed.size:
            highest = max(highest, int(changed[-1]) + 1)
    assert out is not None
    return highest, out


# ============================================================================= C source for firmware / C tests
def _c_ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in name)
    return out if out and not out[0].isdigit() else "s_" + out


def _c_array(ctype: str, name: str, values: np.ndarray, per_line: int = 24) -> str:
    flat = np.asarray(values).reshape(-1).tolist()
    lines = [", ".join(str(int(v)) for v in flat[k:k + per_line]) for k in range(0, len(flat), per_line)]
    body = ",\n  ".join(lines) if lines else "0"
    return f"static const {ctype} {name}[{max(len(flat), 1)}] = {{\n  {body}\n}};\n"


def _c_float(x: float) -> str:
    return float(np.float32(x)).hex() + "f"


def layer_to_c(spec: LayerSpec, prefix: str) -> str:
    """C99 definitions of one layer's constant arrays and of ``static const <ParamsStruct> <prefix>_params``."""
    out, fields = [], []
    for f_name, f_type in _PARAM_STRUCTS[spec.type]._fields_:
        if f_type is _PTR:
            a = spec.arrays.get(f_name)
            if a is None:
                fields.append(f".{f_name} = NULL")
                continue
            ctype = "int8_t" if a.dtype == np.int8 else "int32_t"
            out.append(_c_array(ctype, f"{prefix}_{f_name}", a))
            fields.append(f".{f_name} = {prefix}_{f_name}")
        elif f_type is ctypes.c_float:
            fields.append(f".{f_name} = {_c_float(spec.params[f_name])}")
        else:
            fields.append(f".{f_name} = {int(spec.params[f_name])}")
    out.append(f"static const {_C_STRUCT_NAMES[spec.type]} {prefix}_params = {{\n  " + ",\n  ".join(fields)
               + "\n};\n")
    return "".join(out)


def stage_to_c(packed: PackedStage, name: str | None = None, static: bool = False) -> str:
    """C99 source defining ``const TfmcuStage <name>`` (``static const`` with ``static``, e.g. for a header
    included once; the arrays it points to are always ``static const``, weights included) and the macros
    ``<NAME>_SCRATCH_BYTES``, ``<NAME>_INPUT_ELEMENTS``, ``<NAME>_OUTPUT_BYTES``."""
    n = _c_ident(name or packed.name)
    up = n.upper()
    out = [f"/* Patch stage '{packed.name}' generated by tfmcu.patch_kernels.stage_to_c: {len(packed.layers)} "
           f"layers, {packed.grid[0]}x{packed.grid[1]} patches, {packed.scratch_bytes} scratch bytes. */\n",
           '#include "patch_stage.h"\n\n',
           f"#define {up}_SCRATCH_BYTES {packed.scratch_bytes}u\n",
           f"#define {up}_INPUT_ELEMENTS {int(np.prod(packed.input_shape))}u\n",
           f"#define {up}_OUTPUT_BYTES {int(np.prod(packed.output_shape))}u\n\n"]
    for k, spec in enumerate(packed.layers):
        out.append(f"/* layer {k}: {OP_NAMES[spec.type]} '{spec.name}' (tflite op {spec.src_index}) */\n")
        out.append(layer_to_c(spec, f"{n}_l{k}") + "\n")
    out.append(f"static const TfmcuTensor {n}_tensors[{len(packed.tensor_names)}] = {{\n")
    for (h, w, c), dt, prod, tname in zip(packed.tensor_shapes, packed.tensor_dtypes, packed.tensor_producers,
                                          packed.tensor_names):
        safe = "".join(ch if ch.isprintable() else "?" for ch in tname)[:100].replace("*/", "*_").replace("/*", "_*")
        out.append(f"  {{{h}, {w}, {c}, {dt}, {prod}}},  /* {safe} */\n")
    out.append("};\n\n")
    out.append(f"static const TfmcuLayer {n}_layers[{len(packed.layers)}] = {{\n")
    for k, spec in enumerate(packed.layers):
        ins = list(packed.layer_inputs[k]) + [-1] * (2 - len(packed.layer_inputs[k]))
        out.append(f"  {{{spec.type}, &{n}_l{k}_params, {len(packed.layer_inputs[k])}, {{{ins[0]}, {ins[1]}}}, "
                   f"{packed.layer_outputs[k]}}},\n")
    out.append("};\n\n")
    for axis, arr in (("row", packed.row_spans), ("col", packed.col_spans)):
        flat = arr.reshape(-1, _SPAN_FIELDS).tolist()
        out.append(f"static const TfmcuSpan {n}_{axis}_spans[{len(flat)}] = {{\n")
        for r in flat:
            out.append(f"  {{{r[0]}, {r[1]}, {{{r[2]}, {r[3]}}}, {{{r[4]}, {r[5]}}}, {{{r[6]}, {r[7]}}}, "
                       f"{{{r[8]}, {r[9]}}}}},\n")
        out.append("};\n\n")
    out.append(_c_array("int32_t", f"{n}_buffer_offsets", packed.buffer_offsets, per_line=max(len(
        packed.tensor_names), 1)))
    storage = "static const" if static else "const"
    out.append(f"\n{storage} TfmcuStage {n} = {{\n"
               f"  .num_tensors = {len(packed.tensor_names)},\n  .tensors = {n}_tensors,\n"
               f"  .num_layers = {len(packed.layers)},\n  .layers = {n}_layers,\n"
               f"  .input_tensor = {packed.input_tensor},\n  .output_tensor = {packed.output_tensor},\n"
               f"  .grid_rows = {packed.grid[0]},\n  .grid_cols = {packed.grid[1]},\n"
               f"  .row_spans = {n}_row_spans,\n  .col_spans = {n}_col_spans,\n"
               f"  .buffer_offsets = {n}_buffer_offsets,\n  .scratch_bytes = {up}_SCRATCH_BYTES,\n}};\n")
    return "".join(out)


def main(argv: Sequence[str]) -> int:  # pragma: no cover - a tiny CLI for building / locating the library
    print(build_library())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
