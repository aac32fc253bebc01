"""Lower a ``NetSpec`` into the graph IR, with exactly the op names the Keras builder gives its layers.

``from_spec(spec)`` needs no TensorFlow: the stem conv is block 0, each inverted residual block one block (named
``block{i}``), the head the last block; ops are ``stem_conv``, ``block{i}_expand`` / ``_depthwise`` / ``_se_*`` /
``_project`` / ``_add``, ``head_conv``, ``head_pool``, ``classifier`` (a yolo head: ``head_scale{i}_conv`` /
``_pred`` per scale, coarsest first, each prediction a graph output in that order), so that
``from_keras(build_keras(spec)) == from_spec(spec)`` op by op (``tests/test_lower_keras.py``,
``tests/test_detection_model.py``). The head's ops are the last block, after every backbone block, even when a
yolo scale reads an earlier block's output.
"""

from __future__ import annotations

from typing import Any, Sequence

from tfmcu.graph.ir import (ADD, CONV, DEPTHWISE, FULLY_CONNECTED, MEAN, MUL, Graph, Op, Tensor, same_padding,
                            symmetric_padding, window_out_size)
from tfmcu.nets.spec import NetSpec

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
    features = [x]  # output of block 0 (the stem), 1, ..., N
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
        features.append(x)
    b.block += 1
    b.block_names[b.block] = "head"
    outputs = [x]
    if with_head:
        outputs = _yolo_head(b, spec, features) if spec.head.type == "yolo" else [_classify_head(b, spec, x)]
    if not any(op.block == b.block for op in b.ops):
        b.block_names.pop(b.block, None)  # no head ops
    return Graph(name=spec.name, tensors=b.tensors, ops=b.ops, inputs=["input"], outputs=outputs, source="spec",
                 block_names=b.block_names).validate()


def _classify_head(b: _Builder, spec: NetSpec, x: str) -> str:
    """[head_conv] -> [head_pool] -> [classifier]; returns the output tensor."""
    h = spec.head
    if spec.last_channels:
        x = b.window("head_conv", CONV, x, spec.last_channels, 1, 1, h.activation)
    c = b.tensors[x].shape[3]
    if h.pooling == "avg":
        x = b.op("head_pool", MEAN, [x], (1, c), in_channels=c, out_channels=c)
    if h.num_classes:
        x = b.op("classifier", FULLY_CONNECTED, [x], (1, h.num_classes), in_channels=c,
                 out_channels=h.num_classes, weights=c * h.num_classes, biases=h.num_classes)
    return x


def _yolo_head(b: _Builder, spec: NetSpec, features: list[str]) -> list[str]:
    """Per scale, coarsest first: [head_scale{i}_conv] -> head_scale{i}_pred; returns the prediction tensors.
    ``features[k]`` is the output of block k (0 = the stem)."""
    h = spec.head
    outputs = []
    for sc in spec.detection_scales():
        y = features[sc.block]
        if h.head_channels:
            y = b.window(f"{sc.name}_conv", CONV, y, h.head_channels, 1, 1, h.activation)
        outputs.append(b.window(f"{sc.name}_pred", CONV, y, sc.channels, 1, 1, "none"))
    return outputs
