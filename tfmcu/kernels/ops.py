"""The C patch kernels' ops, one table: everything Python knows about each op is its row of ``KERNEL_OPS``.

A row (``KernelOp``) holds the op's ABI row (``tfmcu.abi.OPS``: its code, C params struct and its ctypes mirror,
its number and type of inputs, as ``tflm_patch_kernels/op_table.c`` states them), the TFLite builtins it
implements and the function that builds its ``LayerSpec`` from a .tflite operator (params read from the
flatbuffer, quantized multipliers computed offline by ``tfmcu.kernels.quant``). Adding a C kernel op: its row of
``op_table.c``, its ABI row and params struct in ``tfmcu.abi`` (``tests/test_abi.py`` checks the two agree), and
its row here with its builder function.

``LayerSpec``: one layer as the C kernels see it (op code, scalar params, constant arrays, name, source op index,
the op's own padding, and the constant second operand of an ADD / SUB / MUL). ``layer_spec(model, op)``: the
LayerSpec of an IR op lowered from ``model``.

Element-wise ops with two operands (ADD, SUB, MUL): input 1 is an activation of the output's shape; input 2 is an
activation of the same shape, an activation ``[1, 1, 1, C]`` broadcast over space (a squeeze-excite scale), or a
constant: a scalar, ``[C]`` or ``[1, 1, 1, C]`` (any shape whose dims are 1 but the last). A constant operand is not
an input of the IR op; its int8 values, repeated to the C channels, are the spec's ``operand`` and the kernel reads
them as input 2, a 1 x 1 x C box. An ADD or MUL whose constant is TFLite's input 1 takes it as input 2 (both
commute exactly); a SUB whose constant is input 1 (constant - activation) is refused.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tfmcu import abi
from tfmcu.abi import FLOAT32  # noqa: F401 (re-exported for tfmcu.stage.custom)
from tfmcu.abi import (OP_ADD, OP_AVG_POOL, OP_CONV, OP_DEPTHWISE, OP_HARD_SWISH, OP_LEAKY_RELU, OP_LOGISTIC,
                       OP_MAX_POOL, OP_MEAN, OP_MUL, OP_PAD, OP_QUANTIZE, OP_SUB, OP_TANH)
from tfmcu.graph import ir
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.quant import (activation_range, add_params, conv_multipliers, hard_swish_params,
                                 leaky_relu_params, logistic_params, mul_params, quantize_multiplier, sub_params,
                                 tanh_params)
from tfmcu.tflite import schema as ts

# ============================================================================= layers
@dataclass
class LayerSpec:
    """One layer as the C kernels see it: op code, scalar params, constant arrays (weights, biases, multipliers,
    shifts) and where it came from."""

    type: int
    params: dict[str, Any]
    arrays: dict[str, np.ndarray | None]
    name: str
    src_index: int
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # the op's own padding (top, bottom, left, right)
    # ADD / SUB / MUL with a constant operand: its int8 values, one per output channel (shape [C], a scalar
    # repeated), which the kernel reads as input 2, a 1 x 1 x C box; None when both operands are activations.
    operand: np.ndarray | None = None

    @property
    def op(self) -> "KernelOp":
        return kernel_op(self.type)

    def c_params(self) -> tuple[ctypes.Structure, list[Any]]:
        """The ctypes params struct (pointing into this spec's arrays, which must stay alive)."""
        values = dict(self.params)
        keep = []
        for name in self.op.abi.arrays:
            a = self.arrays.get(name)
            values[name] = None if a is None else a.ctypes.data
            keep.append(a)
        return self.op.params(**values), keep

    def words(self) -> list[int]:
        """The params as the C struct's scalar fields in order (a float as its IEEE-754 bits): what
        ``tfmcu_op_bind`` reads (the TFMCU_PATCH_STAGE custom options store them so)."""
        return abi.params_to_words(self.op.code, self.params)

    def check_arrays(self, in_channels: int, out_channels: int) -> None:
        """The constant arrays are as large as the params say (the C kernels trust them)."""
        sizes = self.op.array_sizes(self.params, in_channels, out_channels) if self.op.array_sizes else {}
        for name, n in sizes.items():
            arr = self.arrays.get(name)
            if arr is None and name == "bias":
                continue
            if arr is None or arr.size != n or arr.dtype != (np.int8 if name == "filter" else np.int32):
                raise PatchKernelError(f"{self.name}: {name} must hold {n} values for these channels")


@dataclass
class _Source:
    """The .tflite operator an IR op came from, with helpers for the builders."""

    model: ts.ModelT
    op: ir.Op
    name: str  # TFLite builtin name
    where: str
    ins: list[int]
    outs: list[int]
    activation: str

    def dtype(self, index: int) -> str:
        return ts.dtype_name(self.model.subgraphs[0].tensors[index].type)

    def int8(self, index: int, what: str) -> None:
        if self.dtype(index) != "int8":
            raise PatchKernelError(f"{self.where}: {what} is {self.dtype(index)}, the C kernels take int8")

    def quant(self, index: int) -> tuple[float, int]:
        t = self.model.subgraphs[0].tensors[index]
        q = t.quantization
        if q is None or q.scale is None or len(q.scale) == 0:
            raise PatchKernelError(f"{self.where}: tensor '{ts.tensor_name(t)}' is not quantized")
        if len(q.scale) > 1:
            raise PatchKernelError(f"{self.where}: activation tensor '{ts.tensor_name(t)}' has per-channel "
                                   f"quantization")
        zp = int(np.ravel(q.zeroPoint)[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
        return float(np.float32(np.ravel(q.scale)[0])), zp

    def is_const(self, index: int) -> bool:
        return ts.is_constant(self.model, self.model.subgraphs[0].tensors[index])

    def shape(self, index: int) -> tuple[int, ...]:
        return ts.tensor_shape(self.model.subgraphs[0].tensors[index])

    def const(self, index: int, what: str) -> np.ndarray:
        arr = ts.buffer_array(self.model, self.model.subgraphs[0].tensors[index])
        if arr is None:
            raise PatchKernelError(f"{self.where}: {what} is not a constant in the model")
        return arr

    def spec(self, code: int, params: dict[str, Any], arrays: dict[str, Any] | None = None,
             padding: tuple[int, int, int, int] = (0, 0, 0, 0), operand: np.ndarray | None = None) -> LayerSpec:
        return LayerSpec(code, params, arrays or {}, self.op.name, self.op.src_index, padding, operand)


def _conv_like(src: _Source, code: int) -> LayerSpec:
    op, ins = src.op, src.ins
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else -1
    src.int8(x, "the input")
    src.int8(src.outs[0], "the output")
    if src.dtype(w) != "int8":
        raise PatchKernelError(f"{src.where}: weights are {src.dtype(w)}, the C kernels take int8")
    (si, zi), (so, zo) = src.quant(x), src.quant(src.outs[0])
    wq = src.model.subgraphs[0].tensors[w].quantization
    if wq is None or wq.scale is None or len(wq.scale) == 0:
        raise PatchKernelError(f"{src.where}: weights are not quantized")
    if wq.zeroPoint is not None and np.any(np.asarray(wq.zeroPoint) != 0):
        raise PatchKernelError(f"{src.where}: weights have non-zero zero points")
    filt = np.ascontiguousarray(src.const(w, "the filter"), dtype=np.int8)
    out_ch, in_ch = int(op.out_channels), int(op.in_channels)
    if src.name == "FULLY_CONNECTED":  # run as a 1x1 convolution (tfmcu.stage.custom._as_conv): [K, C] weights
        opts = src.model.subgraphs[0].operators[op.src_index].builtinOptions
        if opts is not None and (getattr(opts, "weightsFormat", 0) != 0 or getattr(opts, "asymmetricQuantizeInputs",
                                                                                    False)):
            raise PatchKernelError(f"{src.where}: only default-format weights and int8 inputs are supported")
        if code != OP_CONV or filt.shape != (out_ch, in_ch) or tuple(op.kernel) != (1, 1):
            raise PatchKernelError(f"{src.where}: runs only as a 1x1 convolution of [1, C] (weights "
                                   f"{list(filt.shape)})")
        filt = filt.reshape(out_ch, 1, 1, in_ch)
    want = ((out_ch, op.kernel[0], op.kernel[1], in_ch // max(int(op.groups), 1)) if code == OP_CONV
            else (1, op.kernel[0], op.kernel[1], out_ch))
    if tuple(filt.shape) != want:
        raise PatchKernelError(f"{src.where}: filter shape {list(filt.shape)}, expected {list(want)}")
    bias = None
    if b >= 0:
        if src.dtype(b) != "int32":
            raise PatchKernelError(f"{src.where}: bias is {src.dtype(b)}, the C kernels take int32")
        bias = np.ascontiguousarray(src.const(b, "the bias"), dtype=np.int32).reshape(-1)
        if bias.size != out_ch:
            raise PatchKernelError(f"{src.where}: {bias.size} biases for {out_ch} output channels")
    mult, shift = conv_multipliers(si, wq.scale, so, out_ch)
    lo, hi = activation_range(src.activation, so, zo)
    params = dict(kernel_h=op.kernel[0], kernel_w=op.kernel[1], stride_h=op.stride[0], stride_w=op.stride[1],
                  dilation_h=op.dilation[0], dilation_w=op.dilation[1])
    if code == OP_CONV:
        params["groups"] = int(op.groups)
    else:
        params["depth_multiplier"] = int(op.attrs.get("depth_multiplier", 1))
    params.update(input_offset=-zi, output_offset=zo, act_min=lo, act_max=hi)
    folded = (fold_input_offset(filt, bias, -zi)
              if code == OP_CONV and filt.shape[1:3] == (1, 1) and int(op.groups) == 1 and not any(op.padding)
              else None)
    if folded is not None:
        bias, params["input_offset"] = folded, 0
    arrays = dict(filter=filt, bias=bias, output_multiplier=mult, output_shift=shift)
    return src.spec(code, params, arrays, op.padding)


def fold_input_offset(filt: np.ndarray, bias: np.ndarray | None, input_offset: int) -> np.ndarray | None:
    """A 1x1 convolution's bias with its input offset folded in: bias + input offset x the sum of each filter row,
    so that it runs with input offset 0 (no padding reads an offset input: the integer sums are the same, the
    output bit-exact). The CMSIS-NN backend's 1x1 product then sums no filter row per call
    (cmsis_nn/conv2d_cmsis_nn.c); TFLM sums them once per layer, a patch stage once per patch. None: nothing to
    fold (offset 0), or the folded bias would not fit int32."""
    if input_offset == 0:
        return None
    folded = (np.zeros(filt.shape[0], np.int64) if bias is None else bias.astype(np.int64)) + \
        int(input_offset) * filt.reshape(filt.shape[0], -1).astype(np.int64).sum(axis=1)
    if np.abs(folded).max(initial=0) >= 2 ** 31:
        return None
    return folded.astype(np.int32)


def _build_conv(src: _Source) -> LayerSpec:
    return _conv_like(src, OP_CONV)


def _build_depthwise(src: _Source) -> LayerSpec:
    return _conv_like(src, OP_DEPTHWISE)


def _conv_arrays(params: dict[str, Any], in_channels: int, out_channels: int) -> dict[str, int]:
    depth = in_channels // max(int(params.get("groups", 1)), 1)
    return {"filter": out_channels * params["kernel_h"] * params["kernel_w"] * depth, "bias": out_channels,
            "output_multiplier": out_channels, "output_shift": out_channels}


def _depthwise_arrays(params: dict[str, Any], in_channels: int, out_channels: int) -> dict[str, int]:
    return {"filter": params["kernel_h"] * params["kernel_w"] * out_channels, "bias": out_channels,
            "output_multiplier": out_channels, "output_shift": out_channels}


_BINARY_CODES = {"ADD": OP_ADD, "SUB": OP_SUB, "MUL": OP_MUL}


def _per_channel(shape: tuple[int, ...], channels: int) -> bool:
    """A shape TFLite broadcasts to every pixel of a [1, H, W, C] tensor, one value per channel (or one for all)."""
    return int(np.prod(shape[:-1], dtype=np.int64)) == 1 and (len(shape) == 0 or shape[-1] in (1, channels))


def _build_binary(src: _Source) -> LayerSpec:
    """ADD, SUB and MUL (module docstring): two activations of the output's shape, input 2 a per-channel
    activation broadcast over space, or a constant operand (``LayerSpec.operand``)."""
    code = _BINARY_CODES[src.name]
    ins = [t for t in src.ins if t >= 0]
    if len(ins) != 2:
        raise PatchKernelError(f"{src.where}: {src.name} takes two operands, not {len(ins)}")
    out = src.outs[0]
    for i in ins + [out]:
        src.int8(i, f"tensor {i}")
    out_shape = src.shape(out)
    if len(out_shape) != 4 or out_shape[0] != 1:
        raise PatchKernelError(f"{src.where}: the output has shape {list(out_shape)}, not [1, H, W, C]")
    channels = int(out_shape[-1])
    constant = [src.is_const(t) for t in ins]
    if all(constant):
        raise PatchKernelError(f"{src.where}: both operands are constants (fold them before conversion)")
    operand = None
    if any(constant):
        k = constant.index(True)
        const, act = ins[k], ins[1 - k]
        if k == 0 and code == OP_SUB:
            raise PatchKernelError(f"{src.where}: SUB of a constant minus an activation is not supported (only "
                                   f"activation - constant)")
        if src.shape(act) != out_shape:
            raise PatchKernelError(f"{src.where}: the activation operand {list(src.shape(act))} is not the output's "
                                   f"shape {list(out_shape)}")
        if not _per_channel(src.shape(const), channels):
            raise PatchKernelError(f"{src.where}: constant operand of shape {list(src.shape(const))}: only a scalar "
                                   f"or one value per channel is supported")
        q = src.model.subgraphs[0].tensors[const].quantization
        if q is not None and q.scale is not None and len(q.scale) > 1:
            raise PatchKernelError(f"{src.where}: the constant operand has per-channel quantization")
        values = np.ravel(src.const(const, "the constant operand")).astype(np.int8)
        operand = np.ascontiguousarray(np.broadcast_to(values, (channels,)) if values.size == 1 else values)
        first, second = act, const  # ADD and MUL commute: the constant is input 2 either way
    else:
        first, second = ins
        if src.shape(first) != out_shape:
            raise PatchKernelError(f"{src.where}: input 1 {list(src.shape(first))} is not the output's shape "
                                   f"{list(out_shape)} (only input 2 may be broadcast)")
        shape2 = src.shape(second)
        if shape2 != out_shape and not (len(shape2) == 4 and shape2[:3] == (1, 1, 1) and shape2[3] == channels):
            raise PatchKernelError(f"{src.where}: input 2 {list(shape2)} is broadcast other than per channel "
                                   f"(only [1, 1, 1, C] or the output's shape {list(out_shape)})")
    (s1, z1), (s2, z2), (so, zo) = src.quant(first), src.quant(second), src.quant(out)
    prepare = {OP_ADD: add_params, OP_SUB: sub_params, OP_MUL: mul_params}[code]
    return src.spec(code, prepare(s1, z1, s2, z2, so, zo, src.activation), operand=operand)


def _unary_quant(src: _Source) -> tuple[tuple[float, int], tuple[float, int]]:
    """The input's and the output's (scale, zero point) of a one-input int8 op of the same shape."""
    src.int8(src.ins[0], "the input")
    src.int8(src.outs[0], "the output")
    if src.shape(src.ins[0]) != src.shape(src.outs[0]):
        raise PatchKernelError(f"{src.where}: input {list(src.shape(src.ins[0]))} and output "
                               f"{list(src.shape(src.outs[0]))} differ")
    return src.quant(src.ins[0]), src.quant(src.outs[0])


def _build_hard_swish(src: _Source) -> LayerSpec:
    (si, zi), (so, zo) = _unary_quant(src)
    return src.spec(OP_HARD_SWISH, hard_swish_params(si, zi, so, zo))


def _fixed_output(src: _Source, want: tuple[float, int]) -> None:
    """LOGISTIC and TANH compute a fixed output scale and zero point (TFLM's int8 kernels)."""
    scale, zp = src.quant(src.outs[0])
    if (np.float32(scale), zp) != (np.float32(want[0]), want[1]):
        raise PatchKernelError(f"{src.where}: output scale {scale!r} zero point {zp}; the int8 kernel writes scale "
                               f"{want[0]!r} zero point {want[1]}")


def _build_logistic(src: _Source) -> LayerSpec:
    (si, zi), _ = _unary_quant(src)
    _fixed_output(src, (1.0 / 256.0, -128))
    return src.spec(OP_LOGISTIC, logistic_params(si, zi))


def _build_tanh(src: _Source) -> LayerSpec:
    (si, zi), _ = _unary_quant(src)
    _fixed_output(src, (1.0 / 128.0, 0))
    return src.spec(OP_TANH, tanh_params(si, zi))


def _build_leaky_relu(src: _Source) -> LayerSpec:
    (si, zi), (so, zo) = _unary_quant(src)
    opts = src.model.subgraphs[0].operators[src.op.src_index].builtinOptions
    alpha = float(getattr(opts, "alpha", 0.0) or 0.0) if opts is not None else 0.0
    return src.spec(OP_LEAKY_RELU, leaky_relu_params(si, zi, so, zo, alpha))


def _build_pad(src: _Source) -> LayerSpec:
    op = src.op
    if op.attrs.get("paddings") is None:
        raise PatchKernelError(f"{src.where}: only constant spatial padding is supported")
    src.int8(src.ins[0], "the input")
    value = src.quant(src.outs[0])[1]
    if src.name == "PADV2" and len(src.ins) > 2 and src.ins[2] >= 0:
        value = int(np.ravel(src.const(src.ins[2], "the pad value"))[0])
    pads = np.asarray(op.attrs["paddings"]).reshape(-1, 2)
    if len(pads) != 4 or pads[0].any() or pads[3].any():
        raise PatchKernelError(f"{src.where}: padding of batch or channels is not supported")
    return src.spec(OP_PAD, dict(value=int(value)), padding=op.padding)


def _build_pool(src: _Source) -> LayerSpec:
    op = src.op
    src.int8(src.ins[0], "the input")
    src.int8(src.outs[0], "the output")
    (si, zi), (so, zo) = src.quant(src.ins[0]), src.quant(src.outs[0])
    if (np.float32(si), zi) != (np.float32(so), zo):
        raise PatchKernelError(f"{src.where}: input and output quantization differ (TFLite requires them equal)")
    lo, hi = activation_range(src.activation, so, zo)
    params = dict(filter_h=op.kernel[0], filter_w=op.kernel[1], stride_h=op.stride[0], stride_w=op.stride[1],
                  act_min=lo, act_max=hi)
    return src.spec(OP_AVG_POOL if src.name == "AVERAGE_POOL_2D" else OP_MAX_POOL, params, padding=op.padding)


def _build_quantize(src: _Source) -> LayerSpec:
    if src.dtype(src.ins[0]) != "float32" or src.dtype(src.outs[0]) != "int8":
        raise PatchKernelError(f"{src.where}: only QUANTIZE float32 -> int8 is supported "
                               f"({src.dtype(src.ins[0])} -> {src.dtype(src.outs[0])})")
    scale, zp = src.quant(src.outs[0])
    return src.spec(OP_QUANTIZE, dict(scale=scale, zero_point=zp))


def _build_mean(src: _Source) -> LayerSpec:
    """MEAN over height and width (global average pooling) as TFLM's int8 MEAN computes it: the multiplier of
    input scale / output scale (its Prepare); the kernel folds 1 / count in (mean.h)."""
    op = src.op
    axes = sorted(op.attrs.get("axes") or [])
    if axes != [1, 2]:
        raise PatchKernelError(f"{src.where}: only MEAN over height and width (axes [1, 2]) is supported, not {axes}")
    src.int8(src.ins[0], "the input")
    src.int8(src.outs[0], "the output")
    (si, zi), (so, zo) = src.quant(src.ins[0]), src.quant(src.outs[0])
    mult, shift = quantize_multiplier(float(np.float64(np.float32(si)) / np.float64(np.float32(so))))
    return src.spec(OP_MEAN, dict(input_offset=-zi, output_offset=zo, output_multiplier=mult, output_shift=shift))


# ============================================================================= the table
@dataclass(frozen=True)
class KernelOp:
    """An op of the C kernels: its ABI row (``tfmcu.abi.OPS``: code, params struct, inputs) plus what Python adds
    (the TFLite builtins it implements, the LayerSpec builder, the sizes of its constant arrays)."""

    abi: abi.Op
    tflite: tuple[str, ...]  # TFLite builtins it implements
    build: Callable[[_Source], LayerSpec]
    array_sizes: Callable[[dict[str, Any], int, int], dict[str, int]] | None = None

    @property
    def code(self) -> int:  # TfmcuOpType
        return self.abi.code

    @property
    def name(self) -> str:  # the TFLite op it is named after (messages, C comments)
        return self.abi.name

    @property
    def c_struct(self) -> str:  # the C params struct
        return self.abi.c_struct

    @property
    def params(self) -> type:  # its ctypes mirror
        return abi.structure(self.abi.c_struct)

    @property
    def inputs(self) -> int:  # activation inputs
        return self.abi.num_inputs

    @property
    def input_dtype(self) -> int:  # TfmcuDataType of its input(s)
        return self.abi.input_dtype


KERNEL_OPS: dict[int, KernelOp] = {k.code: k for k in [
    KernelOp(abi.OPS[OP_CONV], ("CONV_2D", "FULLY_CONNECTED"), _build_conv, _conv_arrays),
    KernelOp(abi.OPS[OP_DEPTHWISE], ("DEPTHWISE_CONV_2D",), _build_depthwise, _depthwise_arrays),
    KernelOp(abi.OPS[OP_ADD], ("ADD",), _build_binary),
    KernelOp(abi.OPS[OP_PAD], ("PAD", "PADV2"), _build_pad),
    KernelOp(abi.OPS[OP_AVG_POOL], ("AVERAGE_POOL_2D",), _build_pool),
    KernelOp(abi.OPS[OP_MAX_POOL], ("MAX_POOL_2D",), _build_pool),
    KernelOp(abi.OPS[OP_QUANTIZE], ("QUANTIZE",), _build_quantize),
    KernelOp(abi.OPS[OP_MEAN], ("MEAN",), _build_mean),
    KernelOp(abi.OPS[OP_MUL], ("MUL",), _build_binary),
    KernelOp(abi.OPS[OP_SUB], ("SUB",), _build_binary),
    KernelOp(abi.OPS[OP_HARD_SWISH], ("HARD_SWISH",), _build_hard_swish),
    KernelOp(abi.OPS[OP_LOGISTIC], ("LOGISTIC",), _build_logistic),
    KernelOp(abi.OPS[OP_TANH], ("TANH",), _build_tanh),
    KernelOp(abi.OPS[OP_LEAKY_RELU], ("LEAKY_RELU",), _build_leaky_relu),
]}
OP_NAMES = {code: k.name for code, k in KERNEL_OPS.items()}
_BY_TFLITE = {name: k for k in KERNEL_OPS.values() for name in k.tflite}
SUPPORTED_TFLITE = tuple(_BY_TFLITE)


def kernel_op(code: int) -> KernelOp:
    if code not in KERNEL_OPS:
        raise PatchKernelError(f"unknown C kernel op type {code}")
    return KERNEL_OPS[code]


def params_from_words(code: int, words: Sequence[int]) -> dict[str, Any]:
    """``tfmcu.abi.params_from_words`` for a known op (``PatchKernelError`` for an unknown type)."""
    return abi.params_from_words(kernel_op(code).code, words)


def layer_spec(model: ts.ModelT, op: ir.Op, index: int | None = None) -> LayerSpec:
    """The C layer of IR op ``op`` (lowered from ``model``): params read from the flatbuffer, multipliers computed
    here. Raises PatchKernelError for ops / types the C kernels do not cover."""
    t_op = model.subgraphs[0].operators[op.src_index]
    name = ts.op_name(model, t_op)
    where = f"{op.describe(index)}" + (f" [{name}]" if name.lower() != op.type else "")
    opts = t_op.builtinOptions
    act = ts.activation_name(getattr(opts, "fusedActivationFunction", 0)) if opts is not None else "none"
    kop = _BY_TFLITE.get(name)
    if kop is None:
        raise PatchKernelError(f"{where}: {name} has no C patch kernel (supported: {', '.join(SUPPORTED_TFLITE)})")
    try:
        return kop.build(_Source(model, op, name, where, [int(t) for t in t_op.inputs],
                                 [int(t) for t in t_op.outputs], act))
    except PatchKernelError as e:  # the quantization math's own messages name no op
        text = str(e)
        raise PatchKernelError(text if text.startswith(where) else f"{where}: {text}") from None
