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

Lowerings: ``tfmcu.graph.from_spec``, ``tfmcu.graph.from_keras``, ``tfmcu.graph.from_tflite``; ``tfmcu.graph.load``
picks one from what a user names (preset, spec JSON, Keras file, .tflite).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from tfmcu.errors import TfmcuError

# Op types. Window ops have a spatial window; pointwise ops map each spatial position to itself.
CONV = "conv2d"
DEPTHWISE = "depthwise_conv2d"
AVG_POOL = "avg_pool2d"
MAX_POOL = "max_pool2d"
PAD = "pad"
ADD = "add"
SUB = "sub"
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
POINTWISE_OPS = (ADD, SUB, MUL, CONCAT, QUANTIZE, DEQUANTIZE, ACTIVATION)
PATCHABLE_OPS = WINDOW_OPS + POINTWISE_OPS


class GraphError(TfmcuError):
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
        if self.type in (ADD, SUB, MUL, CONCAT):
            # Elementwise only when no activation operand is broadcast over space (SE's channel scaling is not
            # local); a constant operand that varies over space is marked by the lowering.
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
