"""Lower any .tflite model (float or int8, any producer) into the graph IR (``tfmcu.graph.ir``).

``from_tflite(path_or_bytes)`` reads subgraph 0 in the model's operator order (the order TFLite and TFLM execute);
``src_index`` is the operator index. Models with control flow (IF / WHILE / CALL_ONCE ...) are rejected.

* Tensors: only activation tensors (no constant buffer, not a variable) become IR tensors; op inputs/outputs list
  only those (constants and omitted optional inputs, index -1, are left out; their sizes go on the op). Shapes come
  from ``shape``: dynamic dims count as 1, except where the op fixes them (RESHAPE keeps the element count,
  CONCATENATION sums, elementwise ops keep the input shape: ``Reshape((-1,))`` on a dynamic batch is stored as
  ``[1, 1]``). Itemsize and dtype come from the tensor type.
* Window ops (CONV_2D, DEPTHWISE_CONV_2D, AVERAGE_POOL_2D, MAX_POOL_2D, and PAD/PADV2 as a 1x1 window) carry kernel,
  stride, dilation and explicit per-side padding (SAME resolved with ``ir.same_padding``); the output size implied
  by that padding is checked against the model's output shape.
* ADD, SUB, MUL, CONCATENATION, QUANTIZE, DEQUANTIZE, standalone activations, MEAN, FULLY_CONNECTED, RESHAPE,
  SOFTMAX map to their IR types; any other op keeps its builtin name in lower case (``"custom:NAME"`` for custom ops)
  and is not patchable. ADD / SUB / MUL record ``attrs["broadcast"]`` (their activation operands differ in shape) and
  ``attrs["constant_operands"]``; a constant operand that is a scalar or one value per channel keeps them patchable.
* Ops a patch executor must not run patch by patch although their IR type is patchable get
  ``attrs["patchable"] = False``: PAD of batch/channel dims or with a non-zero pad value, CONCATENATION along a
  non-channel axis or with a constant operand, ADD/SUB/MUL with a constant that varies over space, PRELU with a spatial
  alpha, convs whose weights are computed at run time.
* Op names: the layer part of the output tensor name (TFLite joins fused TF op names with ';', e.g.
  ``m/block_1_expand_relu/Relu6;m/block_1_expand/Conv2D`` -> ``block_1_expand``: for convs the component of the conv
  itself); the full tensor name is ``attrs["tensor_name"]``. Blocks come from those names
  (``tfmcu.graph.names``); for anonymous models a structural rule splits after the stem, each residual
  ADD and each linear 1x1 projection; failing that, one block per op.

What TF 2.21's converter does to Keras models (seen in the tests): BN is folded into the conv and ReLU/ReLU6 fused;
a ``ZeroPadding2D`` + VALID conv that equals SAME is folded into a SAME conv (so Keras MobileNetV2 has no PAD op),
other pads stay PAD ops; a dilated SAME conv becomes SPACE_TO_BATCH_ND -> VALID conv -> BATCH_TO_SPACE_ND; an
all-zero Dense bias is dropped; grouped convs lose their layer scope in tensor names.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from tfmcu.graph import ir, names
from tfmcu.graph.names import assign_blocks, layer_of, name_components, name_ops
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import TfliteModel

# Standalone activation ops -> IR activation name.
_ACTIVATION_OPS = {
    "RELU": "relu", "RELU6": "relu6", "RELU_N1_TO_1": "relu_n1_to_1", "RELU_0_TO_1": "relu_0_to_1",
    "LOGISTIC": "sigmoid", "TANH": "tanh", "HARD_SWISH": "hard_swish", "LEAKY_RELU": "leaky_relu",
    "PRELU": "prelu", "ELU": "elu", "GELU": "gelu",
}
_ELEMENTWISE = set(_ACTIVATION_OPS) | {"ADD", "MUL", "SUB", "DIV", "QUANTIZE", "DEQUANTIZE", "MAXIMUM", "MINIMUM",
                                        "SQUARED_DIFFERENCE", "ABS", "NEG", "EXP", "SQRT", "RSQRT", "LOG"}
_BINARY = {"ADD": ir.ADD, "SUB": ir.SUB, "MUL": ir.MUL}
_SIMPLE = {
    "QUANTIZE": ir.QUANTIZE, "DEQUANTIZE": ir.DEQUANTIZE, "RESHAPE": ir.RESHAPE, "SOFTMAX": ir.SOFTMAX,
}


def from_tflite(source: str | os.PathLike | bytes | bytearray | memoryview | TfliteModel,
                name: str | None = None) -> ir.Graph:
    """Lower a .tflite file (path), its bytes or the model already parsed (``tfmcu.tflite.model``) into a validated
    ``ir.Graph``.

    Raises ``ir.GraphError`` with one line naming the file for a missing file, a file that is not a TFLite
    flatbuffer, and for models the IR cannot represent (control flow, inconsistent shapes, ops out of order).
    """
    if isinstance(source, TfliteModel):
        return from_model(source, name)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        where = name or "<tflite bytes>"
        graph_name = name or "tflite_model"
    else:
        path = os.fspath(source)
        where = path
        graph_name = name or os.path.splitext(os.path.basename(path))[0] or "tflite_model"
        if not os.path.exists(path):
            raise ir.GraphError(f"{path}: no such file")
        if os.path.isdir(path):
            raise ir.GraphError(f"{path}: is a directory, not a .tflite file")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ir.GraphError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        model = ts.load_model(data, where)
    except ts.SchemaError as e:
        raise ir.GraphError(str(e)) from None
    return _lower(model, graph_name, where)


def from_model(model: TfliteModel, name: str | None = None) -> ir.Graph:
    """``from_tflite`` of a model already parsed (``tfmcu.tflite.model``): nothing is read or parsed again. A model
    decided and not written yet (``TfliteModel.decided``) is lowered as its file would be; its custom ops carry the
    decided options map (``attrs["decided_options"]``) where a file's carry their flexbuffer."""
    return _lower(model.flatbuffer, name or "tflite_model", name or model.where, model.decided_options)


def _lower(model: ts.ModelT, graph_name: str, where: str, decided: dict[int, Any] | None = None) -> ir.Graph:
    try:
        return _Lowering(model, graph_name, where, decided).run()
    except ir.GraphError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        # A flatbuffer that parses but whose fields are inconsistent (corrupt or hand-edited file).
        raise ir.GraphError(f"{where}: inconsistent TFLite model ({type(e).__name__}: {e})") from None


def lower_model(model: ts.ModelT, name: str = "tflite_model", where: str | None = None) -> ir.Graph:
    """Lower an unpacked ``ModelT`` (subgraph 0). ``where`` names the model in error messages."""
    return _Lowering(model, name, where or name).run()


# ============================================================================= lowering
class _Lowering:
    def __init__(self, model: ts.ModelT, name: str, where: str, decided: dict[int, Any] | None = None):
        self.model = model
        self.decided = decided or {}  # operator index -> custom options decided and not serialized
        self.name = name
        self.where = where
        self.sg = model.subgraphs[0]
        self.raw = list(self.sg.tensors or [])
        self.names: dict[int, str] = {}  # tensor index -> unique IR tensor name (activations only)
        self.tensors: dict[str, ir.Tensor] = {}
        self.fixed: dict[int, tuple[int, ...]] = {}  # tensor index -> shape with dynamic dims resolved

    # ----------------------------------------------------------------- errors and tensors
    def fail(self, index: int | None, typ: str, msg: str) -> ir.GraphError:
        where = f"op {index} ({typ})" if index is not None else typ
        return ir.GraphError(f"{self.where}: {where}: {msg}")

    def _tensor(self, t: int) -> ts.TensorT:
        if not 0 <= t < len(self.raw):
            raise ir.GraphError(f"{self.where}: tensor index {t} out of range (subgraph 0 has {len(self.raw)})")
        return self.raw[t]

    def is_activation(self, t: int) -> bool:
        tensor = self._tensor(t)
        return not tensor.isVariable and not ts.is_constant(self.model, tensor)

    def shape(self, t: int) -> tuple[int, ...]:
        if t in self.fixed:
            return self.fixed[t]
        return ts.tensor_shape(self._tensor(t))

    def unknown_dims(self, t: int) -> list[int]:
        """Dimensions other than the leading (batch) one that are dynamic (-1) in the shape signature and were not
        resolved yet: their static ``shape`` entry (often 1) is not the real size."""
        if t in self.fixed:
            return []
        sig = self._tensor(t).shapeSignature
        if sig is None:
            return []
        return [a for a, d in enumerate(sig) if int(d) < 0 and a > 0]

    def _resolve_shapes(self, typ: str, opts: Any, in_idx: list[int], out_idx: list[int]) -> None:
        """Fill dynamic output dims (``Reshape((-1,))`` on a dynamic batch gives ``[-1, -1]``, stored as [1, 1]) from
        the inputs where the op's semantics fix them: RESHAPE keeps the element count, CONCATENATION sums along its
        axis, elementwise ops keep their input shape."""
        ins = [t for t in in_idx if t >= 0]
        if not ins or not out_idx or any(self.unknown_dims(t) for t in ins):
            return
        out = out_idx[0]
        unknown = self.unknown_dims(out)
        if not unknown:
            return
        shape = list(self.shape(out))
        if typ == "RESHAPE":
            if len(unknown) != 1:
                return
            known = int(np.prod([d for a, d in enumerate(shape) if a != unknown[0]], dtype=np.int64))
            total = int(np.prod(self.shape(ins[0]), dtype=np.int64))
            if known <= 0 or total % known:
                return
            shape[unknown[0]] = total // known
        elif typ == "CONCATENATION":
            axis = int(getattr(opts, "axis", 0) or 0)
            axis = axis + len(shape) if axis < 0 else axis
            parts = [self.shape(t) for t in ins]
            if any(len(p) != len(shape) for p in parts):
                return
            shape = list(parts[0])
            shape[axis] = sum(p[axis] for p in parts)
        elif typ in _ELEMENTWISE:
            same = [self.shape(t) for t in ins if len(self.shape(t)) == len(shape)]
            if not same:
                return
            shape = [max(p[a] for p in same) for a in range(len(shape))]
        else:
            return
        self.fixed[out] = tuple(int(d) for d in shape)

    def ir_name(self, t: int) -> str:
        """The IR name of activation tensor ``t`` (its TFLite name, made unique), registering it on first use."""
        if t in self.names:
            return self.names[t]
        tensor = self._tensor(t)
        base = ts.tensor_name(tensor) or f"tensor_{t}"
        nm, k = base, 1
        while nm in self.tensors:
            nm, k = f"{base}#{k}", k + 1
        self.names[t] = nm
        self.tensors[nm] = ir.Tensor(nm, self.shape(t), ts.itemsize(tensor.type), ts.dtype_name(tensor.type))
        return nm

    def const(self, t: int) -> np.ndarray | None:
        return ts.buffer_array(self.model, self._tensor(t))

    # ----------------------------------------------------------------- main loop
    def run(self) -> ir.Graph:
        ops_t = list(self.sg.operators or [])
        for i, op in enumerate(ops_t):
            typ = self._op_name(i, op)
            if typ in ts.CONTROL_FLOW_OPS:
                raise self.fail(i, typ, "control flow is not supported (only subgraph 0 without IF/WHILE/CALL ops "
                                        "can be lowered)")
        inputs = [self.ir_name(t) for t in _ints(self.sg.inputs) if t >= 0 and self.is_activation(t)]
        produced = set(inputs)
        ops: list[ir.Op] = []
        for i, op in enumerate(ops_t):
            typ = self._op_name(i, op)
            in_idx = _ints(op.inputs)
            out_idx = [t for t in _ints(op.outputs) if t >= 0]
            act_in = [t for t in in_idx if t >= 0 and self.is_activation(t)]
            act_out = [t for t in out_idx if self.is_activation(t)]
            if not act_out:
                raise self.fail(i, typ, "has no output activation tensor (stateful/variable ops are not supported)")
            self._resolve_shapes(typ, op.builtinOptions, in_idx, out_idx)
            for t in act_in:
                nm = self.ir_name(t)
                if nm not in produced:
                    raise self.fail(i, typ, f"reads tensor '{nm}' before any op produces it (operators are not "
                                            f"in a valid execution order)")
            for t in act_out:
                nm = self.ir_name(t)
                if nm in produced:
                    raise self.fail(i, typ, f"writes tensor '{nm}', which is already produced")
                produced.add(nm)
            irop = self._lower_op(i, typ, op, in_idx, out_idx, act_in, act_out)
            irop.src_index = i
            irop.attrs["tflite_inputs"] = in_idx
            irop.attrs["tflite_outputs"] = out_idx
            irop.attrs["tflite_tensor_index"] = {self.ir_name(t): t for t in act_in + act_out}
            irop.attrs["tflite_num_tensors"] = len(self.raw)
            if self.unknown_dims(act_out[0]):
                irop.attrs["dynamic_shape"] = True  # output size not known statically (counted with 1s)
            irop.attrs.setdefault("tflite_op", typ)
            irop.attrs["tensor_name"] = ts.tensor_name(self._tensor(act_out[0]))
            source = self._name_source(irop.attrs["tensor_name"], in_idx, act_in)
            if source != irop.attrs["tensor_name"]:
                irop.attrs["name_source"] = source
            ops.append(irop)
        outputs = [self.ir_name(t) for t in _ints(self.sg.outputs) if t >= 0 and self.is_activation(t)]
        for nm in outputs:
            if nm not in produced:
                raise ir.GraphError(f"{self.where}: graph output '{nm}' is produced by no operator")
        name_ops(ops)
        block_names = assign_blocks(ops, self.tensors, inputs, outputs)
        graph = ir.Graph(name=self.name, tensors=self.tensors, ops=ops, inputs=inputs, outputs=outputs,
                         source="tflite", block_names=block_names)
        try:
            return graph.validate()
        except ir.GraphError as e:
            raise ir.GraphError(f"{self.where}: {e}") from None

    def _name_source(self, out_name: str, in_idx: list[int], act_in: list[int]) -> str:
        """The tensor name that names the op: its output's, unless that is a generic graph-output name
        (``StatefulPartitionedCall:0``), then its first named constant input's (the weights: ``model/dense/MatMul``)."""
        comps = name_components(out_name)
        if comps and not all(names.GENERIC_NAMES.match(layer_of(c)) for c in comps):
            return out_name
        for t in in_idx:
            if t >= 0 and t not in act_in:
                nm = ts.tensor_name(self._tensor(t))
                if "/" in nm:
                    return nm
        return out_name

    def _op_name(self, i: int, op: ts.OperatorT) -> str:
        try:
            return ts.op_name(self.model, op)
        except ts.SchemaError as e:
            raise self.fail(i, "?", str(e)) from None

    # ----------------------------------------------------------------- per op
    def _lower_op(self, i: int, typ: str, op: ts.OperatorT, in_idx: list[int], out_idx: list[int],
                  act_in: list[int], act_out: list[int]) -> ir.Op:
        opts = op.builtinOptions
        ins = [self.ir_name(t) for t in act_in]
        outs = [self.ir_name(t) for t in act_out]
        base = dict(name="", inputs=ins, outputs=outs)
        if typ in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            return self._conv(i, typ, opts, in_idx, out_idx, base)
        if typ in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
            return self._pool(i, typ, opts, in_idx, out_idx, base)
        if typ in ("PAD", "PADV2"):
            return self._pad(i, typ, in_idx, out_idx, base)
        out_shape = self.shape(out_idx[0])
        in_shape = self.shape(act_in[0]) if act_in else out_shape
        ch = dict(in_channels=in_shape[-1] if in_shape else 1, out_channels=out_shape[-1] if out_shape else 1)
        act = ts.activation_name(getattr(opts, "fusedActivationFunction", 0))
        if typ in _BINARY:
            # "broadcast": the activation operands differ in shape (a squeeze-excite's [1, 1, 1, C] scale); a
            # constant operand that is a scalar or one value per channel reads the same for every pixel
            attrs: dict[str, Any] = {"broadcast": len({self.shape(t) for t in act_in}) > 1}
            consts = [self.shape(t) for t in in_idx if t >= 0 and t not in act_in]
            if consts:
                attrs["constant_operands"] = len(consts)
                if not all(int(np.prod(c[:-1], dtype=np.int64)) == 1 for c in consts):
                    attrs["patchable"] = False  # a constant that varies over space would need slicing per patch
            return ir.Op(type=_BINARY[typ], activation=act, attrs=attrs, **ch, **base)
        if typ == "CONCATENATION":
            rank = len(out_shape)
            axis = int(getattr(opts, "axis", 0) or 0)
            axis = axis + rank if axis < 0 else axis
            attrs = {"axis": axis}
            if not (rank == 4 and axis == 3):
                attrs["patchable"] = False  # concatenating along batch/height/width is not pixel-local
            if len(act_in) != len([t for t in in_idx if t >= 0]):
                attrs["patchable"] = False  # a constant operand would have to be sliced per patch
            return ir.Op(type=ir.CONCAT, activation=act, attrs=attrs, **ch, **base)
        if typ in _ACTIVATION_OPS:
            attrs = {"op": typ.lower()}
            if typ == "LEAKY_RELU":
                attrs["alpha"] = float(getattr(opts, "alpha", 0.0))
            if typ == "PRELU" and len(in_idx) > 1 and in_idx[1] >= 0:
                alpha = self.shape(in_idx[1])
                if any(d != 1 for d in alpha[:-1]):
                    attrs["patchable"] = False  # alpha varies over space
            return ir.Op(type=ir.ACTIVATION, activation=_ACTIVATION_OPS[typ], attrs=attrs, **ch, **base)
        if typ == "MEAN":
            axes = self.const(in_idx[1]) if len(in_idx) > 1 and in_idx[1] >= 0 else None
            attrs = {"keep_dims": bool(getattr(opts, "keepDims", False))}
            if axes is not None:
                attrs["axes"] = [int(a) + len(in_shape) if int(a) < 0 else int(a) for a in np.ravel(axes)]
            return ir.Op(type=ir.MEAN, attrs=attrs, **ch, **base)
        if typ == "FULLY_CONNECTED":
            return self._fully_connected(i, typ, opts, in_idx, base, act)
        if typ in _SIMPLE:
            return ir.Op(type=_SIMPLE[typ], **ch, **base)
        attrs = {"patchable": False}
        if typ.startswith("custom:") and i in self.decided:  # the map the writer decided (a model not written)
            attrs["decided_options"] = self.decided[i]
        elif typ.startswith("custom:") and op.customOptions is not None:
            attrs["custom_options"] = np.asarray(op.customOptions, dtype=np.uint8).tobytes()  # the arena needs them
        if typ.startswith("custom:"):  # its constant inputs' bytes by input position (e.g. a patch stage's blob)
            attrs["constant_inputs"] = {pos: data for pos, t in enumerate(in_idx) if t >= 0 and
                                        (data := ts.buffer_data(self.model, self._tensor(t))) is not None}
        return ir.Op(type=typ.lower() if not typ.startswith("custom:") else typ, activation=act, attrs=attrs, **ch,
                     **base)

    def _feature_map(self, i: int, typ: str, t: int, what: str) -> tuple[int, int, int, int]:
        s = self.shape(t)
        if len(s) != 4:
            raise self.fail(i, typ, f"{what} '{ts.tensor_name(self._tensor(t))}' has shape {list(s)}, "
                                    f"expected NHWC (4 dims)")
        return s  # type: ignore[return-value]

    def _window_padding(self, i: int, typ: str, mode: int, size: tuple[int, int], kernel: tuple[int, int],
                        stride: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int, int, int]:
        if mode == ts.Padding.SAME:
            pt, pb = ir.same_padding(size[0], kernel[0], stride[0], dilation[0])
            pl, pr = ir.same_padding(size[1], kernel[1], stride[1], dilation[1])
            return pt, pb, pl, pr
        if mode == ts.Padding.VALID:
            return 0, 0, 0, 0
        raise self.fail(i, typ, f"unknown padding mode {mode}")

    def _check_out(self, i: int, typ: str, in_hw: Sequence[int], out_hw: Sequence[int], kernel, stride, dilation,
                   padding) -> None:
        got = tuple(ir.window_out_size(in_hw[a], kernel[a], stride[a], dilation[a], padding[2 * a],
                                       padding[2 * a + 1]) for a in (0, 1))
        if got != tuple(out_hw):
            raise self.fail(i, typ, f"output {list(out_hw)} does not match input {list(in_hw)} with kernel "
                                    f"{list(kernel)}, stride {list(stride)}, dilation {list(dilation)} and padding "
                                    f"{list(padding)} (expected {list(got)})")

    def _conv(self, i: int, typ: str, opts: Any, in_idx: list[int], out_idx: list[int], base: dict) -> ir.Op:
        want = ts.schema.Conv2DOptionsT if typ == "CONV_2D" else ts.schema.DepthwiseConv2DOptionsT
        if not isinstance(opts, want) or len(in_idx) < 2 or in_idx[0] < 0 or in_idx[1] < 0:
            raise self.fail(i, typ, f"needs an input, a filter and {want.__name__[:-1]}")
        _, h, w, cin = self._feature_map(i, typ, in_idx[0], "input")
        _, oh, ow, cout = self._feature_map(i, typ, out_idx[0], "output")
        fshape = self.shape(in_idx[1])
        if len(fshape) != 4:
            raise self.fail(i, typ, f"filter has shape {list(fshape)}, expected 4 dims")
        kernel = (int(fshape[1]), int(fshape[2]))
        stride = (int(opts.strideH or 1), int(opts.strideW or 1))
        dilation = (int(getattr(opts, "dilationHFactor", 1) or 1), int(getattr(opts, "dilationWFactor", 1) or 1))
        padding = self._window_padding(i, typ, opts.padding, (h, w), kernel, stride, dilation)
        self._check_out(i, typ, (h, w), (oh, ow), kernel, stride, dilation, padding)
        attrs: dict[str, Any] = {"padding_mode": "same" if opts.padding == ts.Padding.SAME else "valid"}
        if typ == "CONV_2D":
            fin = int(fshape[3])
            if fin <= 0 or cin % fin or cout != int(fshape[0]) or cout % (cin // fin):
                raise self.fail(i, typ, f"filter {list(fshape)} does not fit input channels {cin} and output "
                                        f"channels {cout}")
            irtype, groups = ir.CONV, cin // fin
        else:
            fch = int(fshape[3])
            if fch != cout or cout % cin:
                raise self.fail(i, typ, f"filter {list(fshape)} does not fit input channels {cin} and output "
                                        f"channels {cout}")
            mult = cout // cin
            declared = int(getattr(opts, "depthMultiplier", 0) or 0)
            if declared and declared != mult:  # TFLite's kernel rejects this too (0 = infer from shapes)
                raise self.fail(i, typ, f"depth_multiplier {declared} but channels {cin} -> {cout}")
            attrs["depth_multiplier"] = mult
            irtype, groups = ir.DEPTHWISE, cin
        weights = int(np.prod(fshape))
        attrs.update(self._weight_quant(in_idx[1]))
        bias = in_idx[2] if len(in_idx) > 2 else -1
        biases = int(np.prod(self.shape(bias))) if bias >= 0 else 0
        if not self.is_activation(in_idx[0]):
            raise self.fail(i, typ, "input is a constant")
        if self.is_activation(in_idx[1]) or (bias >= 0 and self.is_activation(bias)):
            attrs["patchable"] = False  # weights computed at run time
        return ir.Op(type=irtype, kernel=kernel, stride=stride, dilation=dilation, padding=padding,
                     in_channels=cin, out_channels=cout, groups=groups,
                     activation=ts.activation_name(opts.fusedActivationFunction), weights=weights, biases=biases,
                     attrs=attrs, **base)

    def _pool(self, i: int, typ: str, opts: Any, in_idx: list[int], out_idx: list[int], base: dict) -> ir.Op:
        if not isinstance(opts, ts.schema.Pool2DOptionsT) or not in_idx or in_idx[0] < 0:
            raise self.fail(i, typ, "needs an input and Pool2DOptions")
        _, h, w, cin = self._feature_map(i, typ, in_idx[0], "input")
        _, oh, ow, cout = self._feature_map(i, typ, out_idx[0], "output")
        kernel = (int(opts.filterHeight), int(opts.filterWidth))
        stride = (int(opts.strideH or 1), int(opts.strideW or 1))
        padding = self._window_padding(i, typ, opts.padding, (h, w), kernel, stride, (1, 1))
        self._check_out(i, typ, (h, w), (oh, ow), kernel, stride, (1, 1), padding)
        if cin != cout:
            raise self.fail(i, typ, f"channels change {cin} -> {cout}")
        return ir.Op(type=ir.AVG_POOL if typ == "AVERAGE_POOL_2D" else ir.MAX_POOL, kernel=kernel, stride=stride,
                     padding=padding, in_channels=cin, out_channels=cout,
                     activation=ts.activation_name(opts.fusedActivationFunction),
                     attrs={"padding_mode": "same" if opts.padding == ts.Padding.SAME else "valid"}, **base)

    def _pad(self, i: int, typ: str, in_idx: list[int], out_idx: list[int], base: dict) -> ir.Op:
        if len(in_idx) < 2 or in_idx[0] < 0 or in_idx[1] < 0:
            raise self.fail(i, typ, "needs an input and a paddings tensor")
        in_shape, out_shape = self.shape(in_idx[0]), self.shape(out_idx[0])
        pads = self.const(in_idx[1])
        attrs: dict[str, Any] = {}
        if pads is None:
            attrs["patchable"] = False
            return ir.Op(type=ir.PAD, in_channels=in_shape[-1] if in_shape else 1,
                         out_channels=out_shape[-1] if out_shape else 1,
                         attrs={**attrs, "paddings": None}, **base)
        pads = np.asarray(pads, dtype=np.int64).reshape(-1, 2)
        attrs["paddings"] = pads.tolist()
        if len(pads) != len(in_shape) or tuple(int(a + p.sum()) for a, p in zip(in_shape, pads)) != out_shape:
            raise self.fail(i, typ, f"paddings {pads.tolist()} do not turn {list(in_shape)} into {list(out_shape)}")
        if typ == "PADV2" and len(in_idx) > 2 and in_idx[2] >= 0:
            value = self.const(in_idx[2])
            zero = _zero_point(self._tensor(in_idx[0]))
            if value is None or np.any(np.ravel(value) != zero):
                attrs["pad_value"] = None if value is None else np.ravel(value).tolist()
                attrs["patchable"] = False  # the patch executor reproduces zero padding only
        if len(in_shape) != 4 or pads[0].any() or pads[3].any():
            attrs["patchable"] = False  # padding of batch or channels: not a spatial window
            padding = (0, 0, 0, 0)
        else:
            padding = (int(pads[1][0]), int(pads[1][1]), int(pads[2][0]), int(pads[2][1]))
        return ir.Op(type=ir.PAD, padding=padding, in_channels=in_shape[-1] if in_shape else 1,
                     out_channels=out_shape[-1] if out_shape else 1, attrs=attrs, **base)

    def _weight_quant(self, t: int) -> dict[str, Any]:
        """How many scales the weights carry (per-channel arrays in TFLM's persistent arena) and their type."""
        w = self._tensor(t)
        q = w.quantization
        return {"weight_scales": 0 if q is None or q.scale is None else len(q.scale),
                "weights_dtype": ts.dtype_name(w.type)}

    def _fully_connected(self, i: int, typ: str, opts: Any, in_idx: list[int], base: dict, act: str) -> ir.Op:
        if len(in_idx) < 2 or in_idx[1] < 0:
            raise self.fail(i, typ, "needs an input and a weights tensor")
        wshape = self.shape(in_idx[1])
        if len(wshape) != 2:
            raise self.fail(i, typ, f"weights have shape {list(wshape)}, expected [out, in]")
        bias = in_idx[2] if len(in_idx) > 2 else -1
        attrs: dict[str, Any] = {"keep_num_dims": bool(getattr(opts, "keepNumDims", False))}
        attrs.update(self._weight_quant(in_idx[1]))
        if self.is_activation(in_idx[1]):
            attrs["dynamic_weights"] = True
        return ir.Op(type=ir.FULLY_CONNECTED, in_channels=int(wshape[1]), out_channels=int(wshape[0]),
                     weights=int(np.prod(wshape)), biases=int(np.prod(self.shape(bias))) if bias >= 0 else 0,
                     activation=act, attrs=attrs, **base)


def _ints(values: Any) -> list[int]:
    """A flatbuffer int vector (None, list or numpy array: never use its truth value) as a list of ints."""
    return [] if values is None else [int(v) for v in values]


def _zero_point(tensor: ts.TensorT) -> int:
    q = tensor.quantization
    if q is None or q.zeroPoint is None or len(q.zeroPoint) == 0:
        return 0
    return int(np.ravel(q.zeroPoint)[0])
