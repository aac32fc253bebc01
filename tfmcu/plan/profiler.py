"""Analytic profiler (MCUNetV2 definitions): per-layer SRAM, MACs, params and Flash from the graph IR.

* Memory of a layer = every activation tensor alive at that step: its inputs, its outputs and every other tensor
  produced earlier and still needed later (residual branches). A tensor shared by several consumers is counted once.
  Activations are counted with the tensor's deployed item size (1 byte for int8). kB = 1024 B.
* "excluding input" drops the graph input tensors (the image may be streamed and need not be stored whole).
* MACs: conv, depthwise conv and fully-connected multiply-accumulates. Params: weights + biases (BN folded).
  Flash: int8 weights + int32 biases.

Accounting modes (``ACCOUNTINGS``): what an operator's output may share with an input that dies at that operator.
* ``separate``: nothing; every tensor has its own buffer (a plain memory planner such as TFLM's default).
* ``paper``: the MCUNetV2 paper's count. A depthwise convolution runs in place (TinyEngine): its output is written
  into its dying input's buffer, so the pair needs max(input, output) bytes. A residual ADD's branch is written over
  the shortcut by the op that produces it (MCUNet's own profiler counts an inverted-residual block's projection as
  input + output, the shortcut's buffer reused), and the sum stays there. Per layer and per patch.
* ``tflm_inplace``: the in-place distances TFLM's reference kernels allow (``tfmcu.plan.memory_plan.inplace_pairs``,
  rounded up to TFLM's 16-byte alignment as the offline plans use them): the output may start D bytes before the
  dying input, so the pair needs input + output - max(0, min(input, output - D)) bytes. Only operators TFLM runs
  itself share; the patch executor keeps its patch buffers disjoint, so patch-stage steps share nothing.
Graph inputs and outputs never share (the caller owns them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tfmcu.graph import ir
from tfmcu.plan import memory_plan
from tfmcu.plan.placer import shared_bytes


@dataclass
class LayerProfile:
    index: int
    name: str
    op: str
    block: int
    block_name: str
    in_shape: list[int]
    out_shape: list[int]
    memory_bytes: int
    memory_bytes_excluding_input: int
    macs: int
    params: int
    flash_bytes: int
    alive: list[str] = field(default_factory=list)


@dataclass
class BlockProfile:
    index: int
    name: str
    peak_memory_bytes: int
    peak_memory_bytes_excluding_input: int
    macs: int
    params: int
    flash_bytes: int


@dataclass
class Profile:
    model: str
    resolution: int
    macs: int
    params: int
    flash_bytes: int
    peak_sram_per_layer_bytes: int
    peak_sram_per_layer_bytes_excluding_input: int
    peak_layer: str
    peak_block: int
    layers: list[LayerProfile]
    blocks: list[BlockProfile]
    accounting: str = "separate"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for layer in d["layers"]:
            layer.pop("alive")
        return d


ACCOUNTINGS = ("separate", "paper", "tflm_inplace")


def check_accounting(accounting: str) -> str:
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting {accounting!r}: expected one of {', '.join(ACCOUNTINGS)}")
    return accounting


def shared_pairs(graph: ir.Graph, accounting: str,
                 lifetimes: dict[str, tuple[int, int]] | None = None) -> dict[int, list[tuple[str, str, int]]]:
    """Per op index, the (tensor, input, distance D in bytes) pairs whose buffers overlap during that op under
    ``accounting`` (see the module docstring): the tensor starts D bytes before the input. The savings of one op's
    pairs add up (they share disjoint parts)."""
    check_accounting(accounting)
    pairs: dict[int, list[tuple[str, str, int]]] = {}
    if accounting == "separate":
        return pairs
    keep = set(graph.inputs) | set(graph.outputs)
    if accounting == "paper":
        life = lifetimes or graph.lifetimes()
        producer, consumers = graph.producer(), graph.consumers()
        for i, op in enumerate(graph.ops):
            if len(op.outputs) != 1 or not op.inputs or op.outputs[0] in keep:
                continue
            z = op.outputs[0]
            if op.type == ir.DEPTHWISE:  # in place: the output inside the input's buffer
                x = op.inputs[0]
                if x not in keep and life[x][1] == i:
                    pairs.setdefault(i, []).append((z, x, 0))
            elif op.type == ir.ADD and len(op.inputs) == 2 and len(set(op.inputs)) == 2:
                # A residual ADD: the branch y (produced last, read only here) is written over the shortcut s
                # (alive from before, dying here) by the op producing y, and the sum stays there.
                y, s = sorted(op.inputs, key=lambda t: producer.get(t, -1), reverse=True)
                shapes = {tuple(graph.tensors[t].shape) for t in (y, s, z)}
                if (len(shapes) != 1 or y in keep or s in keep or y not in producer or consumers.get(y) != [i]
                        or life[s][1] != i or producer.get(s, -1) >= producer[y]):
                    continue
                pairs.setdefault(producer[y], []).append((y, s, 0))
                pairs.setdefault(i, []).extend([(y, s, 0), (z, s, 0)])
        return pairs
    producer = graph.producer()
    for (y, x), d in memory_plan.inplace_overlaps(graph).items():
        pairs.setdefault(producer[y], []).append((y, x, d))
    # One output overlaps one input at a time: keep each op's largest saving.
    return {i: [max(ps, key=lambda p: shared_bytes(graph.tensors[p[1]].nbytes, graph.tensors[p[0]].nbytes, p[2]))]
            for i, ps in pairs.items()}


def step_memory(graph: ir.Graph, lifetimes: dict[str, tuple[int, int]] | None = None,
                exclude_inputs: bool = False, accounting: str = "separate") -> list[int]:
    """Bytes of all activations alive at each op (the paper's multi-branch rule), less what in-place pairs share
    under ``accounting``."""
    life = lifetimes or graph.lifetimes()
    skip = set(graph.inputs) if exclude_inputs else set()
    mem = [0] * len(graph.ops)
    for name, (a, b) in life.items():
        if name in skip:
            continue
        nbytes = graph.tensors[name].nbytes
        for i in range(max(a, 0), b + 1):
            mem[i] += nbytes
    for i, pairs in shared_pairs(graph, accounting, life).items():
        mem[i] -= sum(shared_bytes(graph.tensors[x].nbytes, graph.tensors[y].nbytes, d) for y, x, d in pairs)
    return mem


def resolution_of(graph: ir.Graph) -> int:
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.is_feature_map:
            return t.shape[1]
    return 0


def profile(graph: ir.Graph, accounting: str = "separate") -> Profile:
    life = graph.lifetimes()
    mem = step_memory(graph, life, accounting=accounting)
    mem_x = step_memory(graph, life, exclude_inputs=True, accounting=accounting)
    layers = []
    for i, op in enumerate(graph.ops):
        first_in = graph.tensors[op.inputs[0]].shape if op.inputs else ()
        layers.append(LayerProfile(
            index=i, name=op.name, op=op.type, block=op.block, block_name=graph.block_name(op.block),
            in_shape=list(first_in), out_shape=list(graph.tensors[op.outputs[0]].shape),
            memory_bytes=mem[i], memory_bytes_excluding_input=mem_x[i], macs=ir.op_macs(graph, op),
            params=op.params, flash_bytes=op.flash_bytes, alive=graph.alive_at(i, life)))
    blocks = []
    for b in sorted({op.block for op in graph.ops}):
        ls = [layer for layer in layers if layer.block == b]
        blocks.append(BlockProfile(
            index=b, name=graph.block_name(b),
            peak_memory_bytes=max(layer.memory_bytes for layer in ls),
            peak_memory_bytes_excluding_input=max(layer.memory_bytes_excluding_input for layer in ls),
            macs=sum(layer.macs for layer in ls), params=sum(layer.params for layer in ls),
            flash_bytes=sum(layer.flash_bytes for layer in ls)))
    peak = max(layers, key=lambda layer: layer.memory_bytes)
    return Profile(
        model=graph.name, resolution=resolution_of(graph), macs=sum(layer.macs for layer in layers),
        params=sum(layer.params for layer in layers), flash_bytes=sum(layer.flash_bytes for layer in layers),
        peak_sram_per_layer_bytes=peak.memory_bytes,
        peak_sram_per_layer_bytes_excluding_input=max(layer.memory_bytes_excluding_input for layer in layers),
        peak_layer=peak.name, peak_block=peak.block, layers=layers, blocks=blocks, accounting=accounting)
