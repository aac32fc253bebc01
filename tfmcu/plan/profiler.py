"""Analytic profiler (MCUNetV2 definitions): per-layer SRAM, MACs, params and Flash from the graph IR.

* Memory of a layer = every activation tensor alive at that step: its inputs, its outputs and every other tensor
  produced earlier and still needed later (residual branches). A tensor shared by several consumers is counted once.
  Activations are counted with the tensor's deployed item size (1 byte for int8). kB = 1024 B.
* "excluding input" drops the graph input tensors (the image may be streamed and need not be stored whole).
* MACs: conv, depthwise conv and fully-connected multiply-accumulates. Params: weights + biases (BN folded).
  Flash: int8 weights + int32 biases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tfmcu.graph import ir


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for layer in d["layers"]:
            layer.pop("alive")
        return d


def step_memory(graph: ir.Graph, lifetimes: dict[str, tuple[int, int]] | None = None,
                exclude_inputs: bool = False) -> list[int]:
    """Bytes of all activations alive at each op (the paper's multi-branch rule)."""
    life = lifetimes or graph.lifetimes()
    skip = set(graph.inputs) if exclude_inputs else set()
    mem = [0] * len(graph.ops)
    for name, (a, b) in life.items():
        if name in skip:
            continue
        nbytes = graph.tensors[name].nbytes
        for i in range(max(a, 0), b + 1):
            mem[i] += nbytes
    return mem


def resolution_of(graph: ir.Graph) -> int:
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.is_feature_map:
            return t.shape[1]
    return 0


def profile(graph: ir.Graph) -> Profile:
    life = graph.lifetimes()
    mem = step_memory(graph, life)
    mem_x = step_memory(graph, life, exclude_inputs=True)
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
        peak_layer=peak.name, peak_block=peak.block, layers=layers, blocks=blocks)
