"""One graph IR for specs, Keras models and .tflite files.

Everything tfmcu computes (memory, MACs, receptive fields, patch regions) reads this IR and nothing else.

* ``Tensor``: an activation tensor (constants such as weights are not tensors here; their sizes are on the op).
  Shapes are NHWC with N = 1 for feature maps; ``itemsize`` is the bytes per element as deployed (1 for int8).
* ``Op``: one operator in execution order. Window ops (conv, depthwise conv, pooling, pad) carry kernel, stride,
  dilation and explicit per-side padding (top, bottom, left, right) so that the output size is
  ``(in + top + bottom - ((k - 1) * d + 1)) // s + 1`` exactly, whatever convention produced them. Ops outside the
  conv family keep their tensor sizes and are marked not patchable.
* ``Graph``: ops in a valid execution (topological) order plus tensors, graph inputs and outputs. Residual adds,
  projection shortcuts and concatenations are ordinary DAG edges through tensor names.

Lowerings: ``from_spec`` (here), ``tfmcu.lower_keras.from_keras``, ``tfmcu.lower_tflite.from_tflite``; ``load_graph``
picks one from a path or preset name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from tfmcu.spec import NetSpec

# Op types. Window ops have a spatial window; pointwise ops map each spatial position to itself.
CONV = "conv2d"
DEPTHWISE = "depthwise_conv2d"
AVG_POOL = "avg_pool2d"
MAX_POOL = "max_pool2d"
PAD = "pad"
ADD = "add"
MUL = "mul"
CONCAT = "concatenation"
QUANTIZE = "quantize"
DEQUANTIZE = "dequantize"
ACTIVATION = "activation"  # standalone relu / relu6 / logistic ... (elementwise)
MEAN = "mean"  # global average pooling
FULLY_CONNECTED = "fully_connected"
RESHAPE = "reshape"
SOFTMAX = "softmax"

WINDOW_OPS = (CONV, DEPTHWISE, AVG_POOL, MAX_POOL, PAD)
POINTWISE_OPS = (ADD, MUL, CONCAT, QUANTIZE, DEQUANTIZE, ACTIVATION)
PATCHABLE_OPS = WINDOW_OPS + POINTWISE_OPS


class GraphError(ValueError):
    """The graph cannot be built or analysed; the message names the op (index, name, type) and the problem."""


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    itemsize: int = 1
    dtype: str = "int8"

    @property
    def size(self) -> int:
        return int(math.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def is_feature_map(self) -> bool:
        return len(self.shape) == 4

    @property
    def hw(self) -> tuple[int, int]:
        if not self.is_feature_map:
            raise GraphError(f"tensor '{self.name}' with shape {list(self.shape)} is not a feature map")
        return self.shape[1], self.shape[2]


@dataclass
class Op:
    name: str
    type: str
    inputs: list[str]
    outputs: list[str]
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    in_channels: int = 0
    out_channels: int = 0
    groups: int = 1
    activation: str = "none"
    weights: int = 0  # number of weight elements (int8 in Flash)
    biases: int = 0  # number of bias elements (int32 in Flash)
    block: int = 0
    block_name: str = ""
    src_index: int | None = None  # operator index in the source .tflite, if any
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def depthwise(self) -> bool:
        return self.type == DEPTHWISE

    @property
    def is_window(self) -> bool:
        return self.type in WINDOW_OPS

    @property
    def patchable(self) -> bool:
        """Spatially local: each output pixel depends on a bounded input window (so it can run on a patch)."""
        if self.attrs.get("patchable") is False:  # set by a lowering (e.g. PAD of channels, constant operands)
            return False
        if self.type in WINDOW_OPS or self.type in (QUANTIZE, DEQUANTIZE, ACTIVATION):
            return True
        if self.type in (ADD, MUL, CONCAT):
            # Elementwise only when no operand is broadcast over space (SE's channel scaling is not local).
            return not self.attrs.get("broadcast", False)
        return False

    @property
    def params(self) -> int:
        return self.weights + self.biases

    @property
    def flash_bytes(self) -> int:
        return self.weights + 4 * self.biases

    def describe(self, index: int | None = None) -> str:
        where = f"op {index} " if index is not None else "op "
        src = f" (tflite op {self.src_index})" if self.src_index is not None and self.src_index != index else ""
        return f"{where}'{self.name}' ({self.type.upper()}){src}"


@dataclass
class Graph:
    name: str
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]
    source: str = "spec"
    block_names: dict[int, str] = field(default_factory=dict)

    # ------------------------------------------------------------ structure
    def producer(self) -> dict[str, int]:
        return {t: i for i, op in enumerate(self.ops) for t in op.outputs}

    def consumers(self) -> dict[str, list[int]]:
        cons: dict[str, list[int]] = {t: [] for t in self.tensors}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                cons.setdefault(t, []).append(i)
        return cons

    def lifetimes(self) -> dict[str, tuple[int, int]]:
        """[first, last] op index during which each tensor must be held.

        Graph inputs are alive from step 0 (-1 would mean before any op); graph outputs until the last op.
        A tensor nobody consumes lives only during the op that produces it.
        """
        prod = self.producer()
        cons = self.consumers()
        last_step = len(self.ops) - 1
        life = {}
        for name in self.tensors:
            first = prod.get(name, 0)
            uses = cons.get(name, [])
            last = max(uses) if uses else first
            if name in self.outputs:
                last = last_step
            life[name] = (first, last)
        return life

    def alive_at(self, step: int, lifetimes: dict[str, tuple[int, int]] | None = None) -> list[str]:
        life = lifetimes or self.lifetimes()
        return [t for t, (a, b) in life.items() if a <= step <= b]

    @property
    def num_blocks(self) -> int:
        return max((op.block for op in self.ops), default=-1) + 1

    def block_ops(self, block: int) -> list[int]:
        return [i for i, op in enumerate(self.ops) if op.block == block]

    def block_name(self, block: int) -> str:
        return self.block_names.get(block, f"block{block}")

    def validate(self) -> "Graph":
        seen = set(self.inputs)
        top_block = -1
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                if t not in self.tensors:
                    raise GraphError(f"{op.describe(i)} reads unknown tensor '{t}'")
                if t not in seen:
                    raise GraphError(f"{op.describe(i)} reads '{t}' before it is produced (ops not in order)")
            for t in op.outputs:
                if t not in self.tensors:
                    raise GraphError(f"{op.describe(i)} writes unknown tensor '{t}'")
                seen.add(t)
            if op.block < top_block:
                raise GraphError(f"{op.describe(i)} belongs to block {op.block} after block {top_block} began")
            top_block = max(top_block, op.block)
        return self

    def copy(self) -> "Graph":
        return dataclasses.replace(self, tensors={k: dataclasses.replace(v) for k, v in self.tensors.items()},
                                   ops=[dataclasses.replace(o, inputs=list(o.inputs), outputs=list(o.outputs),
                                                            attrs=dict(o.attrs)) for o in self.ops],
                                   inputs=list(self.inputs), outputs=list(self.outputs),
                                   block_names=dict(self.block_names))


# ------------------------------------------------------------------------- window math (the only copy)
def window_out_size(size: int, kernel: int, stride: int, dilation: int, pad_before: int, pad_after: int) -> int:
    eff = (kernel - 1) * dilation + 1
    return (size + pad_before + pad_after - eff) // stride + 1


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF 'SAME': total padding split with the extra pixel after (bottom/right)."""
    eff = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + eff - size, 0)
    return total // 2, total - total // 2


def symmetric_padding(kernel: int, dilation: int = 1) -> tuple[int, int]:
    """PyTorch / MCUNet export convention: k//2 on every side, then a VALID conv."""
    p = ((kernel - 1) * dilation + 1) // 2
    return p, p


def input_range(op: Op, axis: int, out_start: int, out_stop: int) -> tuple[int, int]:
    """Input index range [start, stop) (unclipped; may be negative / past the end = border padding) that a window
    op reads to produce outputs [out_start, out_stop) along ``axis`` (0 = height, 1 = width)."""
    if out_stop <= out_start:
        return 0, 0
    k, s, d = op.kernel[axis], op.stride[axis], op.dilation[axis]
    pad_before = op.padding[2 * axis]
    start = out_start * s - pad_before
    stop = (out_stop - 1) * s - pad_before + (k - 1) * d + 1
    return start, stop


# ------------------------------------------------------------------------- lowering from a spec
_ACT = {"relu6": "relu6", "relu": "relu", "none": "none"}


class _Builder:
    """Appends ops while tracking the current feature map; used by ``from_spec``."""

    def __init__(self, spec: NetSpec):
        self.spec = spec
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.block = 0
        self.block_names: dict[int, str] = {}

    def tensor(self, name: str, shape: Sequence[int]) -> str:
        self.tensors[name] = Tensor(name, tuple(int(x) for x in shape))
        return name

    def window(self, name: str, typ: str, x: str, out_ch: int, k: int, s: int, act: str,
               groups: int = 1, bias: bool = True) -> str:
        _, h, w, c = self.tensors[x].shape
        if self.spec.padding == "same":
            pt, pb = same_padding(h, k, s)
            pl, pr = same_padding(w, k, s)
        else:
            pt, pb = symmetric_padding(k)
            pl, pr = pt, pb
        oh = window_out_size(h, k, s, 1, pt, pb)
        ow = window_out_size(w, k, s, 1, pl, pr)
        if typ == DEPTHWISE:
            weights, groups = k * k * c, c
        else:
            weights = k * k * (c // groups) * out_ch
        y = self.tensor(f"{name}/out", (1, oh, ow, out_ch))
        self.ops.append(Op(name=name, type=typ, inputs=[x], outputs=[y], kernel=(k, k), stride=(s, s),
                           padding=(pt, pb, pl, pr), in_channels=c, out_channels=out_ch, groups=groups,
                           activation=_ACT[act], weights=weights, biases=out_ch if bias else 0,
                           block=self.block))
        return y

    def op(self, name: str, typ: str, inputs: list[str], shape: Sequence[int], **kw: Any) -> str:
        y = self.tensor(f"{name}/out", shape)
        self.ops.append(Op(name=name, type=typ, inputs=inputs, outputs=[y], block=self.block, **kw))
        return y


def from_spec(spec: NetSpec, with_head: bool = True) -> Graph:
    """Lower a spec into the IR with the same op names the Keras builder gives its layers."""
    spec.validate()
    b = _Builder(spec)
    x = b.tensor("input", (1, spec.resolution, spec.resolution, spec.in_channels))
    b.block_names[0] = "stem"
    st = spec.stem
    x = b.window("stem_conv", CONV, x, spec.stem_channels, st.kernel, st.stride, st.activation)
    for blk in spec.resolve():
        b.block = blk.index
        b.block_names[blk.index] = blk.name
        inp = x
        p = blk.name
        if blk.has_expand:
            x = b.window(f"{p}_expand", CONV, x, blk.hidden, 1, 1, blk.activation, groups=blk.groups)
        x = b.window(f"{p}_depthwise", DEPTHWISE, x, blk.hidden, blk.kernel, blk.stride, blk.activation)
        if blk.se_channels:
            _, h, w, c = b.tensors[x].shape
            s = b.op(f"{p}_se_squeeze", MEAN, [x], (1, 1, 1, c), in_channels=c, out_channels=c)
            s = b.window(f"{p}_se_reduce", CONV, s, blk.se_channels, 1, 1, "relu")
            s = b.window(f"{p}_se_expand", CONV, s, c, 1, 1, "none")
            b.ops[-1].activation = "sigmoid"
            x = b.op(f"{p}_se_excite", MUL, [x, s], (1, h, w, c), in_channels=c, out_channels=c,
                     attrs={"broadcast": True})
        x = b.window(f"{p}_project", CONV, x, blk.out, 1, 1, "none", groups=blk.groups)
        if blk.residual:
            shape = b.tensors[x].shape
            x = b.op(f"{p}_add", ADD, [inp, x], shape, in_channels=shape[3], out_channels=shape[3])
    h = spec.head
    b.block += 1
    b.block_names[b.block] = "head"
    if with_head:
        if spec.last_channels:
            x = b.window("head_conv", CONV, x, spec.last_channels, 1, 1, h.activation)
        c = b.tensors[x].shape[3]
        if h.pooling == "avg":
            x = b.op("head_pool", MEAN, [x], (1, c), in_channels=c, out_channels=c)
        if h.num_classes:
            x = b.op("classifier", FULLY_CONNECTED, [x], (1, h.num_classes), in_channels=c,
                     out_channels=h.num_classes, weights=c * h.num_classes, biases=h.num_classes)
    if not any(op.block == b.block for op in b.ops):
        b.block_names.pop(b.block, None)  # no head ops
    return Graph(name=spec.name, tensors=b.tensors, ops=b.ops, inputs=["input"], outputs=[x], source="spec",
                 block_names=b.block_names).validate()


def op_macs(graph: Graph, op: Op) -> int:
    """Multiply-accumulates of one op over its full output (conv family and fully connected only)."""
    out = graph.tensors[op.outputs[0]]
    if op.type in (CONV, DEPTHWISE):
        _, h, w, c = out.shape
        return h * w * c * op.kernel[0] * op.kernel[1] * (op.in_channels // op.groups)
    if op.type == FULLY_CONNECTED:
        return op.in_channels * op.out_channels
    return 0


def macs_per_output_pixel(op: Op) -> int:
    """MACs per output spatial position (for patch accounting; 0 for ops without MACs)."""
    if op.type in (CONV, DEPTHWISE):
        return op.out_channels * op.kernel[0] * op.kernel[1] * (op.in_channels // op.groups)
    return 0


def iter_feature_ops(graph: Graph) -> Iterable[tuple[int, Op]]:
    for i, op in enumerate(graph.ops):
        if graph.tensors[op.outputs[0]].is_feature_map:
            yield i, op
