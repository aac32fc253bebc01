"""Lower a ``tf_keras`` functional model into the graph IR, folding layers the way TFLite's converter does.

``from_keras(model)`` walks the model's layer-call graph (nested functional / sequential models are inlined) and
emits one IR op per TFLite operator:

* ``Conv2D`` / ``DepthwiseConv2D`` (+ a following ``BatchNormalization``, folded into weights and bias,
  + a following ``ReLU`` / ``ReLU6`` / ``Activation('relu'|'relu6')``, fused into ``activation``). A layer is folded
  only when the output it folds over has exactly one consumer and is not a model output. A conv's own
  ``activation=`` argument is kept on the op (``sigmoid`` included, as ``tfmcu.graph.from_spec`` writes SE gates).
  ``SeparableConv2D`` becomes a depthwise op and a 1x1 conv.
* Padding is explicit per side: ``'same'`` through ``tfmcu.graph.ir.same_padding``, ``'valid'`` zeros.
  ``ZeroPadding2D`` is a ``PAD`` op (kernel 1, stride 1) with its per-side padding, except that a *symmetric* pad
  of k//2 (dilated) on every side whose only consumer is a VALID conv of that kernel is folded into the conv
  (``fold_symmetric_pad``): that is the spec's ``"symmetric"`` padding convention (PyTorch-style conv padding)
  and keeps ``from_keras(build_keras(spec)) == from_spec(spec)``. Asymmetric pads, such as the ``(0, 1)`` pads in
  front of the stride-2 depthwise convs of Keras' MobileNetV2, stay ``PAD`` ops as they do in a .tflite file.
* ``Add`` -> ``ADD``, ``Multiply`` -> ``MUL`` (``attrs['broadcast'] = True`` when operand shapes differ; a
  following ReLU/ReLU6 is fused as in TFLite), channel ``Concatenate`` -> ``CONCAT``, pooling -> window ops,
  ``GlobalAveragePooling2D`` -> ``MEAN``, ``Dense`` -> ``FULLY_CONNECTED`` (a softmax activation becomes its own
  ``SOFTMAX`` op), ``Reshape`` / ``Flatten`` -> ``RESHAPE``, ``Softmax`` -> ``SOFTMAX``, a batch norm that cannot
  be folded -> ``MUL`` + ``ADD``, ``Rescaling`` -> ``MUL`` [+ ``ADD``], other activations -> ``ACTIVATION``.
  ``InputLayer``, ``Dropout`` and other inference-time identities are skipped. tfmot quantization-aware models
  lower like the float model (``QuantizeWrapperV2`` is unwrapped, the input ``QuantizeLayer`` is skipped).
* Anything else becomes an op whose type is the layer class name lowercased (or a ``TFOpLambda``'s symbol), with
  its tensor sizes (so memory is right); such ops are not patchable.

Names: an op is named after its main layer (the conv, not its BN/ReLU/pad), its output tensor ``<op>/out`` and the
graph input after its ``InputLayer``, exactly as ``tfmcu.graph.from_spec`` names them. Blocks come from layer names
(``tfmcu.graph.names.block_of_name``: tfmcu builder names and Keras applications MobileNetV2/V3 names); if the
convs' names do not parse, every op is its own block.

This module imports TensorFlow lazily (inside the functions that walk a model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfmcu.graph import ir
from tfmcu.graph.ir import Graph, GraphError, Op, Tensor
from tfmcu.graph.names import HEAD, block_of_name

# ------------------------------------------------------------------------- Keras graph walk
_IDENTITY_LAYERS = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                    "GaussianDropout", "AlphaDropout", "ActivityRegularization",
                    "QuantizeLayer")  # tfmot's input fake-quant: gone with int8 model inputs
_FOLDABLE_ACTS = ("relu", "relu6")
_DTYPES = {1: "int8", 2: "int16", 4: "float32", 8: "float64"}


@dataclass
class _Call:
    """One layer call (a Keras node) with tensor keys for its inputs and outputs."""

    layer: Any
    name: str
    inputs: list[int]
    outputs: list[int]

    @property
    def kind(self) -> str:
        return type(self.layer).__name__


@dataclass
class _Walk:
    calls: list[_Call] = field(default_factory=list)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    used_names: dict[str, int] = field(default_factory=dict)
    next_key: int = 0

    def new_key(self, kt: Any, where: str) -> int:
        key = self.next_key
        self.next_key += 1
        self.shapes[key] = _static_shape(kt, where)
        return key

    def unique(self, name: str) -> str:
        n = self.used_names.get(name, 0)
        self.used_names[name] = n + 1
        return name if n == 0 else f"{name}_{n}"


def _static_shape(kt: Any, where: str) -> tuple[int, ...]:
    dims = list(kt.shape)
    if dims and dims[0] is None:
        dims[0] = 1
    if any(d is None for d in dims):
        raise GraphError(f"{where}: tensor shape {list(kt.shape)} is not fully known; build the model with a fixed "
                         f"input_shape")
    return tuple(int(d) for d in dims)


def _node_of(kt: Any) -> Any:
    layer, node_index, _ = kt._keras_history
    return layer._inbound_nodes[node_index]


def _node_order(outputs: list[Any]) -> list[Any]:
    """Layer-call nodes in post-order of a depth-first walk from the outputs, inputs visited in call order.

    That is a topological order which keeps each branch together in program order (a residual's block body
    right before its add, an SE branch right before its multiply).
    """
    order: list[Any] = []
    done: set[int] = set()
    stack: list[tuple[Any, bool]] = [(_node_of(kt), False) for kt in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            done.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for kt in reversed(node.keras_inputs):
            parent = _node_of(kt)
            if id(parent) not in done:
                stack.append((parent, False))
    return order


def _is_graph_model(layer: Any, tf_keras: Any) -> bool:
    return isinstance(layer, tf_keras.Model) and getattr(layer, "_is_graph_network", False)


def _flatten(model: Any, in_keys: list[int], walk: _Walk, tf: Any, tf_keras: Any) -> list[int]:
    """Append the primitive layer calls of ``model`` (nested graph models inlined); returns its output keys."""
    if len(model.inputs) != len(in_keys):
        raise GraphError(f"nested model '{model.name}' has {len(model.inputs)} inputs, called with {len(in_keys)}")
    key_of: dict[int, int] = {id(kt): k for kt, k in zip(model.inputs, in_keys)}
    for node in _node_order(list(model.outputs)):
        layer = node.layer
        outs = tf.nest.flatten(node.outputs)
        if isinstance(layer, tf_keras.layers.InputLayer) or node.is_input:
            for kt in outs:
                if id(kt) not in key_of:
                    raise GraphError(f"input layer '{layer.name}' of model '{model.name}' is not a model input")
            continue
        try:
            ins = [key_of[id(kt)] for kt in node.keras_inputs]
        except KeyError:
            raise GraphError(f"layer '{layer.name}' reads a tensor that is not computed from the model inputs")
        if _is_graph_model(layer, tf_keras):
            sub_outs = _flatten(layer, ins, walk, tf, tf_keras)
            for kt, k in zip(outs, sub_outs):
                key_of[id(kt)] = k
            continue
        keys = []
        for kt in outs:
            k = walk.new_key(kt, f"layer '{layer.name}'")
            key_of[id(kt)] = k
            keys.append(k)
        if type(layer).__name__.startswith("QuantizeWrapper") and getattr(layer, "layer", None) is not None:
            layer = layer.layer  # tfmot quantization-aware wrapper: lower the wrapped layer, under its own name
        walk.calls.append(_Call(layer, walk.unique(layer.name), ins, keys))
    return [key_of[id(kt)] for kt in model.outputs]


# ------------------------------------------------------------------------- layer classification
def _act_name(fn: Any) -> str:
    inner = getattr(fn, "activation", None)  # tfmot's QuantizeAwareActivation wraps the layer's activation
    if inner is not None and not hasattr(fn, "__name__"):
        return _act_name(inner)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = name.lower()
    return {"linear": "none", "noopactivation": "none", "silu": "swish"}.get(name, name)


def _relu_layer_act(layer: Any) -> str:
    """ReLU layer -> 'relu', 'relu6', 'leaky_relu' or a descriptive clipped-relu name."""
    mx = None if layer.max_value is None else float(layer.max_value)
    slope = float(layer.negative_slope)
    thr = float(layer.threshold)
    if slope == 0 and thr == 0:
        if mx is None:
            return "relu"
        if mx == 6.0:
            return "relu6"
        return f"relu_max{mx:g}"
    if mx is None and thr == 0:
        return "leaky_relu"
    return "relu_custom"


_TFOP_ACTS = {"tf.nn.relu": "relu", "tf.nn.relu6": "relu6", "tf.math.sigmoid": "sigmoid", "tf.nn.sigmoid": "sigmoid",
              "tf.math.tanh": "tanh", "tf.nn.tanh": "tanh", "tf.nn.silu": "swish", "tf.nn.swish": "swish"}
_TFOP_BINARY = {"tf.__operators__.add": ir.ADD, "tf.math.add": ir.ADD, "tf.add": ir.ADD,
                "tf.math.multiply": ir.MUL, "tf.multiply": ir.MUL}


def _standalone_act(layer: Any, kind: str) -> str | None:
    """The elementwise activation a standalone layer applies ('none' = identity), or None if it is not one."""
    if kind == "ReLU":
        return _relu_layer_act(layer)
    if kind == "Activation":
        return _act_name(layer.activation)
    if kind == "LeakyReLU":
        return "leaky_relu"
    if kind in ("ELU", "PReLU", "ThresholdedReLU"):
        return kind.lower()
    if kind == "TFOpLambda":
        return _TFOP_ACTS.get(_symbol(layer))
    return None


def _symbol(layer: Any) -> str:
    """A TFOpLambda's TF function as 'tf.x.y' (tf_keras stores it without the 'tf.')."""
    sym = str(getattr(layer, "symbol", "") or "")
    return sym if not sym or sym.startswith("tf.") else f"tf.{sym}"


# ------------------------------------------------------------------------- lowering
class _Lowerer:
    def __init__(self, walk: _Walk, outputs: list[int], itemsize: int, fold_symmetric_pad: bool):
        self.walk = walk
        self.calls = walk.calls
        self.itemsize = itemsize
        self.fold_symmetric_pad = fold_symmetric_pad
        self.alias: dict[int, int] = {}  # key of an identity layer's output -> its input key
        self.names: dict[int, str] = {}  # key -> IR tensor name
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.op_layer: list[str] = []  # the layer name each op is parsed for its block
        self.absorbed: set[int] = set()
        self.pad_into: dict[int, int] = {}
        # Identity layers first, so consumer counts see through them.
        self.live: list[int] = []
        for i, c in enumerate(self.calls):
            if self._is_identity(c):
                self.alias[c.outputs[0]] = self.key(c.inputs[0])
            else:
                self.live.append(i)
        self.outputs = [self.key(k) for k in outputs]
        self.consumers: dict[int, list[int]] = {}
        for i in self.live:
            for k in self.calls[i].inputs:
                self.consumers.setdefault(self.key(k), []).append(i)

    # ---------------------------------------------------------------- helpers
    def key(self, k: int) -> int:
        while k in self.alias:
            k = self.alias[k]
        return k

    def _is_identity(self, c: _Call) -> bool:
        if c.kind in _IDENTITY_LAYERS and len(c.inputs) == 1 and len(c.outputs) == 1:
            return True
        if c.kind == "Activation" and _act_name(c.layer.activation) == "none":
            return True
        if c.kind == "TFOpLambda" and _symbol(c.layer) == "tf.identity" and len(c.inputs) == 1:
            return True
        return False

    def sole_consumer(self, k: int) -> int | None:
        """The only call consuming key ``k`` (as its only input), if ``k`` is not a graph output."""
        k = self.key(k)
        cons = self.consumers.get(k, [])
        if len(cons) != 1 or k in self.outputs:
            return None
        j = cons[0]
        if len(self.calls[j].inputs) != 1 or len(self.calls[j].outputs) != 1:
            return None
        return j

    def shape(self, k: int) -> tuple[int, ...]:
        return self.walk.shapes[self.key(k)]

    def tname(self, k: int) -> str:
        k = self.key(k)
        if k not in self.names:
            raise GraphError(f"internal: tensor {k} used before it is produced")
        return self.names[k]

    def emit(self, name: str, typ: str, in_keys: list[int], out_keys: list[int], parse_name: str,
             **kw: Any) -> Op:
        outs = []
        for n, k in enumerate(out_keys):
            tname = f"{name}/out" if n == 0 else f"{name}/out{n}"
            self.tensors[tname] = Tensor(tname, self.shape(k), itemsize=self.itemsize,
                                         dtype=_DTYPES.get(self.itemsize, f"int{8 * self.itemsize}"))
            self.names[self.key(k)] = tname
            outs.append(tname)
        op = Op(name=name, type=typ, inputs=[self.tname(k) for k in in_keys], outputs=outs, **kw)
        self.ops.append(op)
        self.op_layer.append(parse_name)
        return op

    def fold_tail(self, last: int, allow_bn: bool) -> tuple[int, bool, str]:
        """Fold [BN] then [ReLU/ReLU6] after call ``last``; returns (last folded call, bn folded, activation)."""
        bn = False
        if allow_bn:
            j = self.sole_consumer(self.calls[last].outputs[0])
            if j is not None and self.calls[j].kind == "BatchNormalization" and self._bn_last_axis(self.calls[j]):
                self.absorbed.add(j)
                bn, last = True, j
        act = "none"
        j = self.sole_consumer(self.calls[last].outputs[0])
        if j is not None:
            a = _standalone_act(self.calls[j].layer, self.calls[j].kind)
            if a in _FOLDABLE_ACTS:
                self.absorbed.add(j)
                act, last = a, j
        return last, bn, act

    def _bn_last_axis(self, c: _Call) -> bool:
        axis = c.layer.axis
        axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
        rank = len(self.shape(c.inputs[0]))
        return [a % rank for a in axes] == [rank - 1]

    # ---------------------------------------------------------------- main loop
    def run(self) -> None:
        for i in self.live:
            c = self.calls[i]
            if c.kind == "ZeroPadding2D" and self.fold_symmetric_pad:
                self._maybe_fold_pad(i)
        for i in self.live:
            if i in self.absorbed:
                continue
            c = self.calls[i]
            kind = c.kind
            if getattr(c.layer, "data_format", "channels_last") == "channels_first":
                raise GraphError(f"layer '{c.layer.name}' ({kind}) uses channels_first; only NHWC models are "
                                 f"supported")
            handler = getattr(self, f"_lower_{kind}", None)
            if handler is not None:
                handler(i, c)
            else:
                self._lower_other(i, c)

    def _maybe_fold_pad(self, i: int) -> None:
        c = self.calls[i]
        (pt, pb), (pl, pr) = c.layer.padding
        j = self.sole_consumer(c.outputs[0])
        if j is None or (pt, pb, pl, pr) == (0, 0, 0, 0):
            return
        conv = self.calls[j]
        if conv.kind not in ("Conv2D", "DepthwiseConv2D") or conv.layer.padding != "valid":
            return
        (kh, kw), (dh, dw) = conv.layer.kernel_size, conv.layer.dilation_rate
        if (pt, pb) == ir.symmetric_padding(kh, dh) and (pl, pr) == ir.symmetric_padding(kw, dw):
            self.absorbed.add(i)
            self.pad_into[j] = i

    # ---------------------------------------------------------------- window ops
    def _window_padding(self, i: int, c: _Call, x: int, k: tuple[int, int], s: tuple[int, int],
                        d: tuple[int, int], padding: str) -> tuple[int, tuple[int, int, int, int]]:
        if i in self.pad_into:
            pad_call = self.calls[self.pad_into[i]]
            (pt, pb), (pl, pr) = pad_call.layer.padding
            return pad_call.inputs[0], (pt, pb, pl, pr)
        _, h, w, _ = self._fmap(x, c)
        if padding == "same":
            return x, ir.same_padding(h, k[0], s[0], d[0]) + ir.same_padding(w, k[1], s[1], d[1])
        if padding == "valid":
            return x, (0, 0, 0, 0)
        raise GraphError(f"layer '{c.layer.name}' ({c.kind}): padding '{padding}' is not supported")

    def _fmap(self, k: int, c: _Call) -> tuple[int, int, int, int]:
        shape = self.shape(k)
        if len(shape) != 4:
            raise GraphError(f"layer '{c.layer.name}' ({c.kind}) needs an NHWC input, got shape {list(shape)}")
        return shape  # type: ignore[return-value]

    def _check_out(self, c: _Call, op: Op, x_shape: tuple[int, ...], out_key: int) -> None:
        _, h, w, _ = x_shape
        t, b, l, r = op.padding
        oh = ir.window_out_size(h, op.kernel[0], op.stride[0], op.dilation[0], t, b)
        ow = ir.window_out_size(w, op.kernel[1], op.stride[1], op.dilation[1], l, r)
        got = self.shape(out_key)
        if (oh, ow) != tuple(got[1:3]):
            raise GraphError(f"layer '{c.layer.name}' ({c.kind}): IR window math gives {oh}x{ow} but Keras "
                             f"gives {got[1]}x{got[2]}")

    def _conv_like(self, i: int, c: _Call, typ: str) -> None:
        layer = c.layer
        k, s, d = tuple(layer.kernel_size), tuple(layer.strides), tuple(layer.dilation_rate)
        x, pad = self._window_padding(i, c, c.inputs[0], k, s, d, layer.padding)
        _, _, _, cin = self._fmap(x, c)
        own = _act_name(layer.activation)
        if typ == ir.DEPTHWISE:
            cout = cin * int(layer.depth_multiplier)
            groups, weights = cin, k[0] * k[1] * cout
        else:
            groups = int(getattr(layer, "groups", 1))
            cout = int(layer.filters)
            weights = k[0] * k[1] * (cin // groups) * cout
        out_key, bn, act = self._tail(i, c, own)
        op = self.emit(c.name, typ, [x], [out_key], layer.name, kernel=k, stride=s, dilation=d, padding=pad,
                       in_channels=cin, out_channels=cout, groups=groups, activation=act, weights=weights,
                       biases=cout if (layer.use_bias or bn) else 0)
        self._check_out(c, op, self.shape(x), out_key)
        self._softmax_tail(c, own, out_key)

    def _tail(self, i: int, c: _Call, own: str) -> tuple[int, bool, str]:
        """Output key, BN folded?, fused activation of a conv/dense call with its own activation ``own``."""
        if own == "none":
            last, bn, act = self.fold_tail(i, allow_bn=True)
            return self.calls[last].outputs[0], bn, act
        if own == "softmax":  # not elementwise: its own SOFTMAX op follows, writing the layer output
            return self.new_key(self.shape(c.outputs[0])), False, "none"
        return c.outputs[0], False, own

    def _softmax_tail(self, c: _Call, own: str, key: int) -> None:
        if own == "softmax":
            n = self.shape(key)[-1]
            self.emit(f"{c.name}_softmax", ir.SOFTMAX, [key], [c.outputs[0]], c.layer.name, in_channels=n,
                      out_channels=n)

    def new_key(self, shape: tuple[int, ...]) -> int:
        """A tensor Keras does not expose (the middle of a layer TFLite splits in two)."""
        k = self.walk.next_key
        self.walk.next_key += 1
        self.walk.shapes[k] = tuple(shape)
        return k

    def _lower_Conv2D(self, i: int, c: _Call) -> None:
        self._conv_like(i, c, ir.CONV)

    def _lower_DepthwiseConv2D(self, i: int, c: _Call) -> None:
        self._conv_like(i, c, ir.DEPTHWISE)

    def _lower_SeparableConv2D(self, i: int, c: _Call) -> None:
        layer = c.layer
        k, s, d = tuple(layer.kernel_size), tuple(layer.strides), tuple(layer.dilation_rate)
        x, pad = self._window_padding(i, c, c.inputs[0], k, s, d, layer.padding)
        _, h, w, cin = self._fmap(x, c)
        dm = int(layer.depth_multiplier)
        oh = ir.window_out_size(h, k[0], s[0], d[0], pad[0], pad[1])
        ow = ir.window_out_size(w, k[1], s[1], d[1], pad[2], pad[3])
        mid = self.new_key((1, oh, ow, cin * dm))
        dw_name = f"{c.name}_depthwise"
        self.emit(dw_name, ir.DEPTHWISE, [x], [mid], layer.name, kernel=k, stride=s, dilation=d, padding=pad,
                  in_channels=cin, out_channels=cin * dm, groups=cin, weights=k[0] * k[1] * cin * dm)
        own = _act_name(layer.activation)
        out_key, bn, act = self._tail(i, c, own)
        cout = int(layer.filters)
        self.emit(c.name, ir.CONV, [mid], [out_key], layer.name, in_channels=cin * dm, out_channels=cout,
                  activation=act, weights=cin * dm * cout, biases=cout if (layer.use_bias or bn) else 0)
        self._softmax_tail(c, own, out_key)

    def _pool(self, i: int, c: _Call, typ: str) -> None:
        layer = c.layer
        k, s = tuple(layer.pool_size), tuple(layer.strides)
        x, pad = self._window_padding(i, c, c.inputs[0], k, s, (1, 1), layer.padding)
        cin = self._fmap(x, c)[3]
        op = self.emit(c.name, typ, [x], [c.outputs[0]], layer.name, kernel=k, stride=s, padding=pad,
                       in_channels=cin, out_channels=cin)
        self._check_out(c, op, self.shape(x), c.outputs[0])

    def _lower_AveragePooling2D(self, i: int, c: _Call) -> None:
        self._pool(i, c, ir.AVG_POOL)

    def _lower_MaxPooling2D(self, i: int, c: _Call) -> None:
        self._pool(i, c, ir.MAX_POOL)

    def _lower_ZeroPadding2D(self, i: int, c: _Call) -> None:
        (pt, pb), (pl, pr) = c.layer.padding
        cin = self._fmap(c.inputs[0], c)[3]
        self.emit(c.name, ir.PAD, [c.inputs[0]], [c.outputs[0]], c.layer.name, padding=(pt, pb, pl, pr),
                  in_channels=cin, out_channels=cin)

    # ---------------------------------------------------------------- pointwise / head ops
    def _binary(self, i: int, c: _Call, typ: str) -> None:
        shapes = [self.shape(k) for k in c.inputs]
        out = self.shape(c.outputs[0])
        last, _, act = self.fold_tail(i, allow_bn=False)
        attrs = {"broadcast": True} if len(set(shapes)) > 1 else {}
        self.emit(c.name, typ, list(c.inputs), [self.calls[last].outputs[0]], c.layer.name, in_channels=out[-1],
                  out_channels=out[-1], activation=act, attrs=attrs)

    def _lower_Add(self, i: int, c: _Call) -> None:
        self._binary(i, c, ir.ADD)

    def _lower_Multiply(self, i: int, c: _Call) -> None:
        self._binary(i, c, ir.MUL)

    def _lower_Concatenate(self, i: int, c: _Call) -> None:
        out = self.shape(c.outputs[0])
        if c.layer.axis % len(out) != len(out) - 1:
            return self._lower_other(i, c)
        self.emit(c.name, ir.CONCAT, list(c.inputs), [c.outputs[0]], c.layer.name,
                  in_channels=out[-1], out_channels=out[-1], attrs={"axis": -1})

    def _lower_GlobalAveragePooling2D(self, i: int, c: _Call) -> None:
        cin = self._fmap(c.inputs[0], c)[3]
        self.emit(c.name, ir.MEAN, [c.inputs[0]], [c.outputs[0]], c.layer.name, in_channels=cin, out_channels=cin)

    def _lower_Dense(self, i: int, c: _Call) -> None:
        layer = c.layer
        cin = self.shape(c.inputs[0])[-1]
        units = int(layer.units)
        own = _act_name(layer.activation)
        out_key, bn, act = self._tail(i, c, own)
        self.emit(c.name, ir.FULLY_CONNECTED, [c.inputs[0]], [out_key], layer.name, in_channels=cin,
                  out_channels=units, activation=act, weights=cin * units,
                  biases=units if (layer.use_bias or bn) else 0)
        self._softmax_tail(c, own, out_key)

    def _reshape(self, i: int, c: _Call) -> None:
        self.emit(c.name, ir.RESHAPE, [c.inputs[0]], [c.outputs[0]], c.layer.name,
                  in_channels=self.shape(c.inputs[0])[-1], out_channels=self.shape(c.outputs[0])[-1])

    _lower_Reshape = _reshape
    _lower_Flatten = _reshape

    def _lower_Softmax(self, i: int, c: _Call) -> None:
        n = self.shape(c.outputs[0])[-1]
        self.emit(c.name, ir.SOFTMAX, [c.inputs[0]], [c.outputs[0]], c.layer.name, in_channels=n, out_channels=n)

    def _lower_BatchNormalization(self, i: int, c: _Call) -> None:
        """A batch norm that could not be folded: x * scale + offset, two elementwise ops in TFLite."""
        self._scale_shift(c, with_add=True)

    def _lower_Rescaling(self, i: int, c: _Call) -> None:
        self._scale_shift(c, with_add=bool(np.any(np.asarray(c.layer.offset) != 0)))

    def _scale_shift(self, c: _Call, with_add: bool) -> None:
        n = self.shape(c.outputs[0])[-1]
        if not with_add:
            self.emit(c.name, ir.MUL, [c.inputs[0]], [c.outputs[0]], c.layer.name, in_channels=n, out_channels=n)
            return
        mid = self.new_key(self.shape(c.outputs[0]))
        self.emit(f"{c.name}_mul", ir.MUL, [c.inputs[0]], [mid], c.layer.name, in_channels=n, out_channels=n)
        self.emit(c.name, ir.ADD, [mid], [c.outputs[0]], c.layer.name, in_channels=n, out_channels=n)

    def _lower_other(self, i: int, c: _Call) -> None:
        kind = c.kind
        act = _standalone_act(c.layer, kind) if len(c.inputs) == 1 else None
        if act == "softmax":
            return self._lower_Softmax(i, c)
        if act is not None:
            n = self.shape(c.outputs[0])[-1]
            self.emit(c.name, ir.ACTIVATION, [c.inputs[0]], [c.outputs[0]], c.layer.name, in_channels=n,
                      out_channels=n, activation=act, weights=int(c.layer.count_params()))
            return
        sym = _symbol(c.layer) if kind.endswith("OpLambda") else ""
        if sym in _TFOP_BINARY and c.inputs:
            return self._binary(i, c, _TFOP_BINARY[sym])
        typ = sym or kind.lower()
        if typ in ir.PATCHABLE_OPS or typ in (ir.MEAN, ir.FULLY_CONNECTED, ir.RESHAPE, ir.SOFTMAX):
            typ = f"keras_{typ}"  # never pass an unknown layer off as an IR op
        in_ch = self.shape(c.inputs[0])[-1] if c.inputs and self.shape(c.inputs[0]) else 0
        out_shape = self.shape(c.outputs[0]) if c.outputs else ()
        try:
            params = int(c.layer.count_params())
        except Exception:  # unbuilt layers without weights
            params = 0
        self.emit(c.name, typ, list(c.inputs), list(c.outputs), c.layer.name, in_channels=int(in_ch),
                  out_channels=int(out_shape[-1]) if out_shape else 0, weights=params)


# ------------------------------------------------------------------------- blocks
def _assign_blocks(ops: list[Op], parse_names: list[str], graph_inputs: list[str]) -> tuple[list[Op], dict]:
    """Blocks from layer names when every conv's name parses; else one block per op. Returns sorted ops, names."""
    parsed = [block_of_name(n) for n in parse_names]
    convs = [p for op, p in zip(ops, parsed) if op.type in (ir.CONV, ir.DEPTHWISE)]
    by_name = bool(convs) and all(idx is not None or label == HEAD for idx, label in convs)
    if by_name:
        numbered = sorted({idx for idx, _ in parsed if idx is not None})
        dense = {idx: n for n, idx in enumerate(numbered)}
        head = len(numbered)
        labels: dict[int, str] = {}
        producer_block: dict[str, int] = {t: 0 for t in graph_inputs}
        blocks: list[int] = []
        for op, (idx, label) in zip(ops, parsed):
            inherited = max((producer_block.get(t, 0) for t in op.inputs), default=0)
            if idx is not None:
                b = dense[idx]
                labels.setdefault(b, label)
            elif label == HEAD:
                b = head
                labels[b] = HEAD
            else:
                b = inherited
            if b < inherited:  # a name places an op before one of its inputs: names cannot be trusted
                by_name = False
                break
            blocks.append(b)
            for t in op.outputs:
                producer_block[t] = b
    if not by_name:
        for i, op in enumerate(ops):
            op.block, op.block_name = i, ""
        return ops, {i: op.name for i, op in enumerate(ops)}
    for op, b in zip(ops, blocks):
        op.block = b
    # Stable sort by block: still topological, since every edge goes to an equal or later block.
    order = sorted(range(len(ops)), key=lambda i: blocks[i])
    names = {b: labels.get(b, f"block{b}") for b in sorted(set(blocks))}
    return [ops[i] for i in order], names


# ------------------------------------------------------------------------- entry points
def from_keras(model: Any, itemsize: int = 1, *, fold_symmetric_pad: bool = True) -> Graph:
    """Lower a ``tf_keras`` functional (or built sequential) model into the IR, with TFLite's folding.

    ``itemsize`` is the bytes per activation element as deployed (1 = int8). See the module docstring for the
    folding rules; ``fold_symmetric_pad=False`` keeps every ``ZeroPadding2D`` as a ``PAD`` op.
    """
    import tensorflow as tf
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise GraphError(f"expected a tf_keras.Model, got {type(model).__module__}.{type(model).__name__} (Keras 3 "
                         f"models are not supported; set TF_USE_LEGACY_KERAS=1 and build with tf_keras)")
    if not _is_graph_model(model, tf_keras) or not model.inputs:
        raise GraphError(f"model '{model.name}' is not a functional graph (subclassed, or a Sequential model built "
                         f"without an input shape); only functional/sequential tf_keras models can be lowered")
    walk = _Walk()
    input_names: list[str] = []
    in_keys: list[int] = []
    for kt in model.inputs:
        layer = kt._keras_history.layer
        k = walk.new_key(kt, f"input '{layer.name}'")
        in_keys.append(k)
        input_names.append(walk.unique(layer.name))
    out_keys = _flatten(model, in_keys, walk, tf, tf_keras)
    low = _Lowerer(walk, out_keys, itemsize, fold_symmetric_pad)
    dtype = _DTYPES.get(itemsize, f"int{8 * itemsize}")
    for k, name in zip(in_keys, input_names):
        low.names[k] = name
        low.tensors[name] = Tensor(name, walk.shapes[k], itemsize=itemsize, dtype=dtype)
    low.run()
    ops, block_names = _assign_blocks(low.ops, low.op_layer, input_names)
    outputs = [low.tname(k) for k in low.outputs]
    return Graph(name=model.name, tensors=low.tensors, ops=ops, inputs=input_names, outputs=outputs,
                 source="keras", block_names=block_names).validate()


def load_keras(path: str, itemsize: int = 1) -> Graph:
    """Load a ``.keras`` / ``.h5`` / SavedModel file with tf_keras (``compile=False``) and lower it."""
    if not os.path.exists(path):
        raise GraphError(f"cannot load Keras model '{path}': no such file")
    try:
        import tf_keras

        model = tf_keras.models.load_model(path, compile=False)
    except Exception as e:  # noqa: BLE001 - any loader failure is one line naming the file
        msg = " ".join(str(e).split()) or type(e).__name__
        if len(msg) > 300:
            msg = msg[:297] + "..."
        raise GraphError(f"cannot load Keras model '{path}': {msg}") from None
    try:
        return from_keras(model, itemsize=itemsize)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from None
