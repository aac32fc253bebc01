"""The one .tflite model editor: every tfmcu tool that changes a model goes through ``ModelEditor``.

    ed = ModelEditor(data, where="model.tflite")   # unpacks subgraph 0; keeps the associated files
    x = ed.tensor_like(src, (1, 8, 8, 16), "tfmcu/p0_0/slice")
    k = ed.constant(np.asarray([0, 2, 2, 0], np.int32), TensorType.INT32, "tfmcu/begin")
    op = ed.builtin_operator("SLICE", [src, k, size], [x], BuiltinOptions.SliceOptions, SliceOptionsT())
    ed.subgraph.operators = [...]
    ed.drop_unused_tensors()
    ed.set_metadata("tfmcu_schedule", b"{...}")
    data = ed.to_bytes()          # or: model = ed.decided(), the same model before it is written

Editing is in two phases. The first decides the model: ``ModelEditor`` edits the unpacked object tree, and a custom
operator may be given its options as a map (``custom_operator(..., options={...})``), kept decoded. The second only
writes it: ``to_bytes`` (``write``) serializes those options as flexbuffers and the tree as a flatbuffer.
``decided()`` hands the first phase's model on as a ``tfmcu.tflite.model.TfliteModel`` that writes itself the first
time its bytes are asked for: what reads models (lowering, predictors) reads it unwritten, and an editor made from it
(``ModelEditor(decided)``) edits a structural copy (``fork``), as it would a parsed ``TfliteModel``, without parsing
anything again.

What it covers: operator codes (builtin, with the least op version that supports int8, and custom), new tensors
(copies of an existing tensor's type and quantization with a new shape) and constants (deduplicated by value),
operators, dropping tensors nothing uses any more (renumbering every reference; an offline memory plan indexes
tensors, so it is dropped too), named metadata buffers, and the zip of associated files that TFLite metadata
appends after the flatbuffer (``tfmcu.tflite.model``'s ``split_appended_zip`` / ``append_zip``): ``to_bytes`` writes
it back unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from flatbuffers import flexbuffers

from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import Members, TfliteModel, append_zip, split_appended_zip

__all__ = ["INT8_VERSIONS", "OFFLINE_PLAN_METADATA", "Members", "ModelEditor", "append_zip", "fork", "get_metadata",
           "load", "split_appended_zip", "write"]

# int8 support arrived in these op versions (TFLite's op version tables); other new operator codes get version 1.
INT8_VERSIONS = {"SLICE": 2, "PAD": 2, "PADV2": 2, "CONCATENATION": 2}
OFFLINE_PLAN_METADATA = "OfflineMemoryAllocation"

def get_metadata(model: ts.ModelT, name: str) -> bytes | None:
    """The bytes of the metadata entry ``name`` of an unpacked model (None if it has none)."""
    for m in model.metadata or []:
        if ts.text(m.name) == name:
            buffers = model.buffers or []
            if not 0 <= int(m.buffer) < len(buffers) or buffers[m.buffer].data is None:
                return None
            return np.asarray(buffers[m.buffer].data, dtype=np.uint8).tobytes()
    return None


def load(data: bytes, where: str = "model") -> ts.ModelT:
    """The unpacked model of ``data`` (a .tflite that may carry associated files)."""
    return ts.load_model(split_appended_zip(bytes(data))[0], where)


def fork(model: ts.ModelT) -> ts.ModelT:
    """A structural copy of an unpacked model that ``ModelEditor`` may edit while ``model`` stays as it is: the
    containers it changes (subgraph 0's tensor, operator, input and output lists, the operators themselves, the
    buffer, operator-code and metadata lists, the signatures) are new; what it never changes in place (tensors,
    buffers' data, options) is shared."""
    m = copy.copy(model)
    sg = copy.copy(model.subgraphs[0])
    m.subgraphs = [sg] + list(model.subgraphs[1:])
    sg.tensors = list(sg.tensors or [])
    sg.operators = [copy.copy(op) for op in sg.operators or []]
    m.buffers = list(model.buffers or [])
    m.operatorCodes = [copy.copy(c) for c in model.operatorCodes or []]
    m.metadata = list(model.metadata) if model.metadata is not None else None
    m.signatureDefs = copy.deepcopy(model.signatureDefs)
    return m


def write(model: ts.ModelT, members: Members, options: dict[int, Any] | None = None) -> bytes:
    """The second phase: ``model`` as the bytes of a .tflite, the decoded custom ``options`` of its operators (by
    index) serialized as flexbuffers first, the associated files ``members`` appended."""
    ops = model.subgraphs[0].operators or []
    for i, value in (options or {}).items():
        ops[i].customOptions = np.frombuffer(bytes(flexbuffers.Dumps(value)), dtype=np.uint8).copy()
        ops[i].customOptionsFormat = 0  # FLEXBUFFERS
    return append_zip(ts.write_model(model), members)


class ModelEditor:
    """Edits subgraph 0 of a .tflite (see the module docstring)."""

    def __init__(self, data: bytes | ts.ModelT | TfliteModel, where: str = "model", members: Members | None = None):
        self._options: dict[int, tuple[ts.OperatorT, Any]] = {}  # id(operator) -> (operator, decoded options)
        if isinstance(data, ts.ModelT):
            self.model, self.members = data, list(members or [])
        elif isinstance(data, (bytes, bytearray, memoryview)):
            flat, self.members = split_appended_zip(bytes(data))
            self.model = ts.load_model(flat, where)
        else:  # a parsed or decided TfliteModel: edit a structural copy, its undecoded options carried over
            self.model, self.members = fork(data.flatbuffer), list(data.members)
            ops = self.model.subgraphs[0].operators
            self._options = {id(ops[i]): (ops[i], value) for i, value in data.decided_options.items()}
        self.subgraph = self.model.subgraphs[0]
        self.subgraph.tensors = list(self.subgraph.tensors or [])
        self.subgraph.operators = list(self.subgraph.operators or [])
        self.model.buffers = list(self.model.buffers or [])
        self.model.operatorCodes = list(self.model.operatorCodes or [])
        self._codes: dict[str, int] = {}
        self._consts: dict[tuple, int] = {}
        self.new_tensors = 0

    # ------------------------------------------------------------------ operator codes and operators
    def builtin_opcode(self, name: str, version: int | None = None) -> int:
        """Index of the operator code of builtin ``name`` (added if missing); its version is raised to at least
        ``version`` (default: the least version with int8 support, ``INT8_VERSIONS``, else 1)."""
        version = version if version is not None else INT8_VERSIONS.get(name, 1)
        value = getattr(ts.BuiltinOperator, name)
        for k, code in enumerate(self.model.operatorCodes):
            if ts.builtin_code(code) == value:
                code.version = max(int(code.version or 1), version)
                return k
        code = ts.OperatorCodeT()
        code.builtinCode = value
        code.deprecatedBuiltinCode = min(value, 127)
        code.version = version
        self.model.operatorCodes.append(code)
        return len(self.model.operatorCodes) - 1

    def custom_opcode(self, name: str) -> int:
        """Index of the operator code of custom op ``name`` (added if missing)."""
        for k, code in enumerate(self.model.operatorCodes):
            if ts.builtin_code(code) == ts.BuiltinOperator.CUSTOM and ts.text(code.customCode) == name:
                return k
        code = ts.OperatorCodeT()
        code.builtinCode = ts.BuiltinOperator.CUSTOM
        code.deprecatedBuiltinCode = ts.BuiltinOperator.CUSTOM
        code.customCode = name.encode()
        code.version = 1
        self.model.operatorCodes.append(code)
        return len(self.model.operatorCodes) - 1

    def builtin_operator(self, name: str, inputs: list[int], outputs: list[int], options_type: int = 0,
                         options: Any = None) -> ts.OperatorT:
        """A new builtin operator (not yet placed in the subgraph's operator list)."""
        if name not in self._codes:
            self._codes[name] = self.builtin_opcode(name)
        op = ts.OperatorT()
        op.opcodeIndex = self._codes[name]
        op.inputs = np.asarray(inputs, dtype=np.int32)
        op.outputs = np.asarray(outputs, dtype=np.int32)
        op.builtinOptionsType = options_type
        op.builtinOptions = options
        return op

    def custom_operator(self, name: str, inputs: list[int], outputs: list[int], options: bytes | Any) -> ts.OperatorT:
        """A new custom operator with ``options``: flexbuffer bytes, or a map kept decoded until the model is written
        (``decided``, ``to_bytes``)."""
        op = ts.OperatorT()
        op.opcodeIndex = self.custom_opcode(name)
        op.inputs = np.asarray(inputs, dtype=np.int32)
        op.outputs = np.asarray(outputs, dtype=np.int32)
        if isinstance(options, (bytes, bytearray, memoryview)):
            op.customOptions = np.frombuffer(bytes(options), dtype=np.uint8).copy()
            op.customOptionsFormat = 0  # FLEXBUFFERS
        else:
            self._options[id(op)] = (op, options)
        return op

    def decided_options(self) -> dict[int, Any]:
        """The decoded options of the subgraph's operators that have them (by operator index)."""
        return {i: self._options[id(op)][1] for i, op in enumerate(self.subgraph.operators) if id(op) in self._options}

    def op_name(self, op: ts.OperatorT) -> str:
        return ts.op_name(self.model, op)

    # ------------------------------------------------------------------ tensors and constants
    def tensor(self, index: int) -> ts.TensorT:
        return self.subgraph.tensors[index]

    def is_constant(self, index: int) -> bool:
        return ts.is_constant(self.model, self.subgraph.tensors[index])

    def tensor_like(self, src: int, shape: tuple[int, ...], name: str) -> int:
        """A new activation tensor with ``src``'s type and quantization and shape ``shape``."""
        t = copy.deepcopy(self.subgraph.tensors[src])
        t.shape = np.asarray(shape, dtype=np.int32)
        t.shapeSignature = None
        t.name = name.encode()
        t.buffer = 0
        self.subgraph.tensors.append(t)
        self.new_tensors += 1
        return len(self.subgraph.tensors) - 1

    def constant(self, values: np.ndarray, tensor_type: int, name: str, dedupe: bool = True) -> int:
        """A constant tensor holding ``values`` (one tensor per distinct value, type and shape when ``dedupe``)."""
        values = np.ascontiguousarray(values)
        key = (values.dtype.str, values.shape, values.tobytes(), tensor_type)
        if dedupe and key in self._consts:
            return self._consts[key]
        buf = ts.BufferT()
        buf.data = np.frombuffer(values.tobytes(), dtype=np.uint8).copy()
        self.model.buffers.append(buf)
        t = ts.TensorT()
        t.shape = np.asarray(values.shape, dtype=np.int32)
        t.type = tensor_type
        t.buffer = len(self.model.buffers) - 1
        t.name = name.encode()
        self.subgraph.tensors.append(t)
        self.new_tensors += 1
        if dedupe:
            self._consts[key] = len(self.subgraph.tensors) - 1
        return len(self.subgraph.tensors) - 1

    def drop_unused_tensors(self) -> None:
        """Remove tensors no operator, input, output or signature uses any more, renumbering every reference, and
        empty the buffers no tensor or metadata entry refers to any more (e.g. weights moved into a stage blob; the
        buffer list keeps its indices). An offline memory plan indexes tensors: it no longer applies and is
        removed."""
        model, sg = self.model, self.subgraph
        used: set[int] = set(int(t) for t in (sg.inputs if sg.inputs is not None else []))
        used |= set(int(t) for t in (sg.outputs if sg.outputs is not None else []))
        for op in sg.operators:
            used |= {int(t) for t in op.inputs if t >= 0} | {int(t) for t in op.outputs if t >= 0}
            if op.intermediates is not None:
                used |= {int(t) for t in op.intermediates if t >= 0}
        for sig in model.signatureDefs or []:
            for tm in list(sig.inputs or []) + list(sig.outputs or []):
                used.add(int(tm.tensorIndex))
        keep = sorted(used)
        remap = {old: new for new, old in enumerate(keep)}
        sg.tensors = [sg.tensors[i] for i in keep]

        def fix(values: Any) -> Any:
            if values is None:
                return None
            return np.asarray([remap[int(t)] if t >= 0 else -1 for t in values], dtype=np.int32)

        sg.inputs, sg.outputs = fix(sg.inputs), fix(sg.outputs)
        for op in sg.operators:
            op.inputs, op.outputs = fix(op.inputs), fix(op.outputs)
            if op.intermediates is not None:
                op.intermediates = fix(op.intermediates)
        for sig in model.signatureDefs or []:
            for tm in list(sig.inputs or []) + list(sig.outputs or []):
                tm.tensorIndex = remap[int(tm.tensorIndex)]
        self.remove_metadata(OFFLINE_PLAN_METADATA)
        self._consts.clear()
        referenced = {int(m.buffer) for m in model.metadata or []}
        referenced |= {int(b) for b in (model.metadataBuffer if model.metadataBuffer is not None else [])}
        for g in model.subgraphs or []:
            referenced |= {int(t.buffer or 0) for t in g.tensors or []}
        for i, buf in enumerate(model.buffers):
            if i not in referenced and buf.data is not None:
                model.buffers[i] = ts.BufferT()  # a new entry: the buffer itself may be shared (``fork``)

    # ------------------------------------------------------------------ metadata
    def get_metadata(self, name: str) -> bytes | None:
        return get_metadata(self.model, name)

    def set_metadata(self, name: str, payload: bytes) -> None:
        """Store ``payload`` as metadata entry ``name`` (replacing an entry of that name)."""
        buf = ts.BufferT()
        buf.data = np.frombuffer(bytes(payload), dtype=np.uint8).copy()
        self.model.buffers.append(buf)
        entries = [m for m in (self.model.metadata or []) if ts.text(m.name) != name]
        m = ts.schema.MetadataT()
        m.name = name.encode()
        m.buffer = len(self.model.buffers) - 1
        self.model.metadata = entries + [m]

    def remove_metadata(self, name: str) -> None:
        if self.model.metadata:
            self.model.metadata = [m for m in self.model.metadata if ts.text(m.name) != name]

    # ------------------------------------------------------------------ output
    def decided(self, where: str = "model") -> TfliteModel:
        """The model as edited so far, decided and not written (``tfmcu.tflite.model.TfliteModel.decided``): a
        structural copy (``fork``), so this editor may go on editing; written (``write``) the first time its bytes
        are asked for."""
        model, members, options = fork(self.model), list(self.members), self.decided_options()
        return TfliteModel.decided(model, members, options, lambda: write(model, members, options), where)

    def to_bytes(self, keep_files: bool = True) -> bytes:
        """The edited model, with the associated files appended again unless ``keep_files`` is False."""
        return write(self.model, self.members if keep_files else [], self.decided_options())


# ----------------------------------------------------------------------------- static shapes
SHAPE_OPS = ("SHAPE", "STRIDED_SLICE", "PACK", "CONCATENATION", "GATHER")  # what computes a RESHAPE's shape


def fold_static_reshapes(data: bytes | TfliteModel, where: str = "model") -> tuple[bytes, int]:
    """The model with every RESHAPE whose shape an int32 computation makes at run time (Keras' ``Reshape`` on a
    dynamic batch: SHAPE -> STRIDED_SLICE -> PACK, as the converter writes a squeeze-excite's reshape) given its
    output's static shape as a constant instead, and the operators left computing nothing anybody reads removed:
    (the model bytes, how many reshapes were folded). A reshape moves no byte: the outputs are the same. The model as
    it is when no reshape is folded."""
    ed = ModelEditor(data, where)
    sg = ed.subgraph
    ops = sg.operators
    producer = {int(t): i for i, op in enumerate(ops) for t in (op.outputs if op.outputs is not None else [])}
    folded = 0
    for op in ops:
        if ed.op_name(op) != "RESHAPE" or op.inputs is None or len(op.inputs) < 2 or int(op.inputs[1]) < 0:
            continue
        shape_t, out_t = int(op.inputs[1]), int(op.outputs[0])
        if ed.is_constant(shape_t) or producer.get(shape_t) is None:
            continue
        src = ops[producer[shape_t]]
        if ed.op_name(src) not in SHAPE_OPS or ed.tensor(shape_t).type != ts.TensorType.INT32:
            continue
        out = ed.tensor(out_t)
        shape = [int(d) for d in (out.shape if out.shape is not None else [])]
        signature = [int(d) for d in (out.shapeSignature if out.shapeSignature is not None else shape)]
        if not shape or any(d < 0 for d in shape) or any(d < 0 for d in signature[1:]):
            continue  # (only the batch may be dynamic: it runs as 1)
        op.inputs = np.asarray([int(op.inputs[0]), ed.constant(np.asarray(shape, np.int32), ts.TensorType.INT32,
                                                                f"tfmcu/static_shape_{folded}")], np.int32)
        folded += 1
    if not folded:
        return (data if isinstance(data, bytes) else data.data), 0
    outputs = {int(t) for t in (sg.outputs if sg.outputs is not None else [])}
    while True:  # drop the shape arithmetic nobody reads any more (a chain: repeat until none is left)
        read = outputs | {int(t) for op in sg.operators for t in (op.inputs if op.inputs is not None else [])}
        dead = [op for op in sg.operators if ed.op_name(op) in SHAPE_OPS
                and not any(int(t) in read for t in (op.outputs if op.outputs is not None else []))]
        if not dead:
            break
        sg.operators = [op for op in sg.operators if all(op is not d for d in dead)]
    ed.drop_unused_tensors()
    return ed.to_bytes(), folded
