"""The ``TFMCU_PATCH_STAGE`` custom operator as stored in a .tflite: its name, its two parts (written and read here;
the name, versions, keys, structs and table layouts are ``tfmcu.abi``'s) and what the TFLM kernel
(``tflm_patch_kernels/tflm/patch_stage_op.cc``) allocates for it.

Format 4: the op's inputs are [stage input, stage blob] (``abi.BLOB_INPUT``), its output the stage output.

* The stage blob (``patch_stage_types.h``): a constant UINT8 tensor holding the whole stage description, weights
  included, that the kernel reads in place: the ``TfmcuStageBlob`` header, then the tables of ``abi.BLOB_TABLES``
  (tensors, layers, the layers' params records, spans, buffer offsets, halo tables, caches) and the constants (the
  layers' filters, biases, multipliers and shifts), every table and array 4-byte aligned. No pointer: the same
  bytes on 64-bit hosts and 32-bit Cortex-M. TFLM keeps one tensor record for it, and nothing of it in the arena.
* The flexbuffer options: ``version``, ``streamed_input`` (1: the op's input 0 is a one-element int8 placeholder and
  the kernel reads the image through the application's ``TfmcuInputProvider``) with ``input_window_bytes``: what the
  kernel reads; and what tfmcu's tools read back: ``name``, ``layers`` [{name, src, padding}].

Formats 2 and 3 (the stage described in the options, its arrays separate constant inputs, its params structs copied
into the arena by the kernel) are not read any more: rewrite such a model from its original.

* ``write_blob`` / ``stage_options``: the two parts of a stage (``tfmcu.kernels.pack.stage_blob`` and
  ``tfmcu.stage.custom`` call them).
* ``read_options(raw)``: the options map (``ValueError`` for anything else); ``read_blob(blob)``: the blob's
  header, tables and params records (``ValueError`` when malformed); ``read_stage(options, blob)``: both as one
  description (the writer's arguments, back), of an operator of a model (``stage_of``, ``stage_at`` for a model read
  or decided, ``tfmcu.tflite.model``) or of an IR op lowered from one (``stage_of_attrs``).
* ``kernel_memory(stage, pointer_bytes)``: (the kernel's persistent op-data bytes, its scratch request: 0 for no
  request, a stage without intermediate tensors), the same arithmetic as the C++ kernel, for 64-bit hosts and 32-bit
  Cortex-M.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from flatbuffers import flexbuffers

from tfmcu import abi
from tfmcu.abi import FORMAT_VERSION, OLDEST_FORMAT_VERSION, PATCH_STAGE_OP
from tfmcu.tflite import schema as ts
from tfmcu.tflite.model import TfliteModel

__all__ = ["FORMAT_VERSION", "OLDEST_FORMAT_VERSION", "PATCH_STAGE_OP", "kernel_memory", "read_blob", "read_options",
           "read_stage", "single_layer", "stage_at", "stage_of", "stage_of_attrs", "streamed_input",
           "streamed_scratch", "stage_options", "write_blob"]

_HEADER = abi.word_offsets("TfmcuStageBlob")
_HEADER_BYTES = abi.sizeof("TfmcuStageBlob")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


# ============================================================================= writing
def write_blob(*, tensors: Sequence[Sequence[int]], layers: Sequence[tuple[int, Sequence[int]]],
               arrays: Sequence[dict[str, np.ndarray | None]], layer_inputs: Sequence[Sequence[int]],
               layer_outputs: Sequence[int], input_tensor: int, output_tensor: int, grid: tuple[int, int],
               scratch_bytes: int, tables: dict[str, np.ndarray | None],
               passes: Sequence[tuple[int, int]] | None = None, num_passes: int = 1,
               tensor_data: dict[int, np.ndarray] | None = None) -> bytes:
    """The stage blob of a stage: ``tensors`` [height, width, channels, dtype, producer] rows, ``layers`` (op code,
    scalar words) with their constant ``arrays`` by name (filters int8, the others int32; None: absent), every layer's
    input tensor ids and output tensor id, and the int32 ``tables`` row_spans, col_spans, buffer_offsets and, for a
    stage with halo caches or an accumulator, row_held, col_held and caches (None: absent). ``passes``: each layer's
    (passes bit mask, after_pass) of a stage of ``num_passes`` passes (None: one pass, every layer in it);
    ``tensor_data``: the int8 data of the constant tensors by tensor id (the constants hold it)."""
    constants = bytearray()
    tensor_rows = [[int(v) for v in row[:abi.TENSOR_WORDS - 1]] + [-1] for row in tensors]
    for t, data in sorted((tensor_data or {}).items()):
        constants += bytes(_align(len(constants), abi.BLOB_ALIGN) - len(constants))
        tensor_rows[t][-1] = len(constants)
        constants += np.ascontiguousarray(data, np.int8).tobytes()
    params: list[int] = []
    layer_rows = []
    passes = list(passes) if passes is not None else [(1, -1)] * len(layers)
    for (code, words), named, ins, out, (mask, after) in zip(layers, arrays, layer_inputs, layer_outputs, passes):
        offsets = []
        for name in abi.op(code).arrays:
            a = named.get(name)
            if a is None:
                offsets.append(abi.NO_ARRAY)
                continue
            a = np.ascontiguousarray(a, dtype=np.int8 if name == "filter" else "<i4")
            constants += bytes(_align(len(constants), abi.BLOB_ALIGN) - len(constants))
            offsets.append(len(constants))
            constants += a.tobytes()
        ins = [int(t) for t in ins]
        layer_rows.append([int(code), len(params), len(ins), *(ins + [-1] * (abi.MAX_LAYER_INPUTS - len(ins))),
                           int(out), int(mask), int(after)])
        params += abi.params_record(code, offsets, words)
    parts: dict[str, bytes] = {
        "tensors": np.asarray(tensor_rows, "<i4").reshape(-1).tobytes(),
        "layers": np.asarray(layer_rows, "<i4").reshape(-1).tobytes(),
        "params": np.asarray(params, "<i4").tobytes(),
        **{name: np.ascontiguousarray(a, "<i4").reshape(-1).tobytes() for name, a in tables.items() if a is not None},
        "constants": bytes(constants),
    }
    header = dict.fromkeys(_HEADER, 0)  # an absent table: offset 0
    body = bytearray()
    for name in abi.BLOB_TABLES:
        if parts.get(name):
            body += bytes(_align(len(body), abi.BLOB_ALIGN) - len(body))
            header[name] = _HEADER_BYTES + len(body)
            body += parts[name]
    body += bytes(_align(len(body), abi.BLOB_ALIGN) - len(body))
    header.update(bytes=_HEADER_BYTES + len(body), num_tensors=len(tensors), num_layers=len(layers),
                  input_tensor=int(input_tensor), output_tensor=int(output_tensor), grid_rows=int(grid[0]),
                  grid_cols=int(grid[1]), num_passes=int(num_passes), scratch_bytes=int(scratch_bytes),
                  num_caches=len(parts.get("caches", b"")) // (4 * abi.CACHE_WORDS), params_words=len(params),
                  constants_bytes=len(constants))
    if header["bytes"] >= 2 ** 31:
        raise ValueError(f"a stage blob of {header['bytes']} bytes does not fit int32 offsets")
    return np.asarray([header[f] for f, _ in abi.STRUCTS["TfmcuStageBlob"]], "<i4").tobytes() + bytes(body)


def stage_options(name: str, layers: Sequence[dict[str, Any]], streamed_window: int | None = None) -> dict[str, Any]:
    """The op's options map (``tfmcu.tflite.editor`` writes it as a flexbuffer with the model): the format version,
    the streamed input's window (``streamed_window``: the stage reads the image through the provider; None: it
    reads its input tensor) and, for tfmcu's tools, the stage's ``name`` and its ``layers``' {name, src, padding}."""
    desc: dict[str, Any] = {"version": FORMAT_VERSION, "name": str(name),
                            "layers": [{"name": str(entry["name"]), "src": int(entry["src"]),
                                        "padding": [int(p) for p in entry["padding"]]} for entry in layers]}
    if streamed_window is not None:
        desc.update(streamed_input=1, input_window_bytes=int(streamed_window))
    return desc


# ============================================================================= reading
def read_options(raw: bytes) -> dict[str, Any]:
    """The decoded options map; ``ValueError`` naming what is wrong."""
    try:
        desc = flexbuffers.Loads(bytes(raw))
    except Exception as e:  # flexbuffers raises assorted errors on garbage
        raise ValueError(f"not a flexbuffer ({type(e).__name__}: {e})") from None
    if not isinstance(desc, dict):
        raise ValueError("not a flexbuffer map")
    if desc.get("version") not in range(OLDEST_FORMAT_VERSION, FORMAT_VERSION + 1):
        raise ValueError(f"options version {desc.get('version')}; this tfmcu reads versions "
                         f"{OLDEST_FORMAT_VERSION}..{FORMAT_VERSION} (rewrite the model from its original)")
    return desc


def read_blob(blob: bytes | np.ndarray, tables: bool = True) -> dict[str, Any]:
    """A stage blob decoded (``ValueError`` when its header or a table does not fit it): the header's scalars
    (``grid`` as [rows, cols]), ``tensors``, ``layers`` [{type, words, arrays: {name: byte offset into the
    constants}}], ``layer_inputs``, ``layer_outputs``; with ``tables`` also the int32 tables (row_spans [rows,
    layers, span words], col_spans, buffer_offsets [patches, tensors]; row_held, col_held [bands, layers, 2] and
    caches [n, 3] where present) and ``constants`` (uint8, a view of the blob)."""
    raw = np.frombuffer(bytes(blob) if not isinstance(blob, np.ndarray) else blob.tobytes(), np.uint8)
    if raw.size < _HEADER_BYTES:
        raise ValueError(f"a stage blob of {raw.size} bytes has no header")
    h = {f: int(v) for f, v in zip(_HEADER, np.frombuffer(raw[:_HEADER_BYTES].tobytes(), "<i4"))}
    if h["bytes"] != raw.size:
        raise ValueError(f"the stage blob's header says {h['bytes']} bytes, it holds {raw.size}")
    nt, nl, rows, cols = h["num_tensors"], h["num_layers"], h["grid_rows"], h["grid_cols"]

    def table(name: str, count: int) -> np.ndarray | None:
        at = h[name]
        if at == 0:
            return None
        size = count * 4 * abi.BLOB_TABLES[name] if name != "constants" else count
        if count < 0 or at % abi.BLOB_ALIGN or at < _HEADER_BYTES or at + size > raw.size:
            raise ValueError(f"the stage blob's {name} table lies outside it")
        part = raw[at:at + size]
        return part if name == "constants" else np.frombuffer(part.tobytes(), "<i4")

    t_rows = table("tensors", nt)
    l_rows = table("layers", nl)
    params = table("params", h["params_words"])
    if t_rows is None or l_rows is None or params is None or nt < 1 or nl < 1:
        raise ValueError("the stage blob has no tensors, layers or params")
    fields = abi.word_offsets("TfmcuLayer")
    layers, layer_inputs, layer_outputs = [], [], []
    for row in l_rows.reshape(nl, abi.LAYER_WORDS):
        code, at = int(row[fields["type"]]), int(row[fields["params"]])
        o = abi.op(code)
        record = [int(v) for v in params[at:at + len(o.arrays) + len(o.words)]]
        if at < 0 or len(record) != len(o.arrays) + len(o.words):
            raise ValueError(f"the stage blob's params record of a {o.name} layer lies outside its params")
        layers.append({"type": code, "words": record[len(o.arrays):],
                       "arrays": {n: v for n, v in zip(o.arrays, record) if v != abi.NO_ARRAY},
                       "passes": int(row[fields["passes"]]), "after_pass": int(row[fields["after_pass"]])})
        n_in = int(row[fields["num_inputs"]])
        layer_inputs.append([int(v) for v in row[fields["inputs"]:fields["inputs"] + n_in]])
        layer_outputs.append(int(row[fields["output"]]))
    out: dict[str, Any] = {
        "grid": [rows, cols], "input_tensor": h["input_tensor"], "output_tensor": h["output_tensor"],
        "scratch_bytes": h["scratch_bytes"], "num_caches": h["num_caches"], "num_passes": h["num_passes"],
        "tensors": [[int(v) for v in r] for r in t_rows.reshape(nt, abi.TENSOR_WORDS)],
        "layers": layers, "layer_inputs": layer_inputs, "layer_outputs": layer_outputs}
    if tables:
        shapes = {"row_spans": (rows, nl, abi.SPAN_WORDS), "col_spans": (cols, nl, abi.SPAN_WORDS),
                  "buffer_offsets": (rows * cols, nt), "row_held": (rows, nl, abi.HELD_WORDS),
                  "col_held": (cols, nl, abi.HELD_WORDS), "caches": (h["num_caches"], abi.CACHE_WORDS)}
        for name, shape in shapes.items():
            a = table(name, int(np.prod(shape[:-1])) if name != "buffer_offsets" else rows * cols * nt)
            out[name] = None if a is None else a.reshape(shape)
        if out["row_spans"] is None or out["col_spans"] is None or out["buffer_offsets"] is None:
            raise ValueError("the stage blob has no spans or buffer offsets")
        out["constants"] = table("constants", h["constants_bytes"])
    return out


def read_stage(options: bytes | dict[str, Any], blob: bytes | np.ndarray, tables: bool = True) -> dict[str, Any]:
    """The options (flexbuffer bytes, or the map a writer decided and has not serialized yet) and the blob of one op
    as one description (``ValueError`` when either is malformed): the blob's (``read_blob``), the options'
    ``version``, ``name``, ``streamed_input`` and ``input_window_bytes`` (0 when not streamed), and each layer's
    ``name``, ``src`` and ``padding``."""
    o = read_options(options) if not isinstance(options, dict) else options
    stage = read_blob(blob, tables)
    meta = o.get("layers") or []
    if len(meta) != len(stage["layers"]):
        raise ValueError(f"the options name {len(meta)} layers, the stage blob holds {len(stage['layers'])}")
    for layer, m in zip(stage["layers"], meta):
        layer.update(name=str(m["name"]), src=int(m["src"]), padding=[int(p) for p in m["padding"]])
    stage.update(version=int(o["version"]), name=str(o.get("name", "")),
                 streamed_input=int(o.get("streamed_input", 0) or 0),
                 input_window_bytes=int(o.get("input_window_bytes", 0) or 0))
    return stage


def stage_of(model: ts.ModelT, op: ts.OperatorT, tables: bool = True,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``read_stage`` of a TFMCU_PATCH_STAGE operator of ``model`` (``ValueError`` when malformed); ``options``:
    the map its writer decided (a model not written yet), instead of the operator's flexbuffer."""
    ins = [int(t) for t in op.inputs] if op.inputs is not None else []
    if len(ins) != abi.BLOB_INPUT + 1 or ins[abi.BLOB_INPUT] < 0:
        raise ValueError(f"{len(ins)} inputs; the op takes [stage input, stage blob]")
    blob = ts.buffer_data(model, model.subgraphs[0].tensors[ins[abi.BLOB_INPUT]])
    if blob is None:
        raise ValueError(f"its input {abi.BLOB_INPUT} (the stage blob) has no constant data")
    if options is None:
        options = np.asarray(op.customOptions if op.customOptions is not None else [], np.uint8).tobytes()
    return read_stage(options, blob, tables)


def stage_at(model: TfliteModel, index: int, tables: bool = True) -> dict[str, Any]:
    """``stage_of`` operator ``index`` of a model read or decided (``tfmcu.tflite.model.TfliteModel``)."""
    return stage_of(model.flatbuffer, model.flatbuffer.subgraphs[0].operators[index], tables,
                    model.decided_options.get(index))


def stage_of_attrs(attrs: dict[str, Any], tables: bool = False) -> dict[str, Any]:
    """``read_stage`` of an IR op lowered from a model (``tfmcu.graph.from_tflite``): its options (the map its writer
    decided, ``decided_options``, or its flexbuffer, ``custom_options``) and its constant input ``BLOB_INPUT``
    (``constant_inputs``); ``ValueError`` when malformed or missing."""
    blob = (attrs.get("constant_inputs") or {}).get(abi.BLOB_INPUT)
    if blob is None:
        raise ValueError(f"its input {abi.BLOB_INPUT} (the stage blob) is not a constant")
    options = attrs["decided_options"] if "decided_options" in attrs else attrs.get("custom_options", b"")
    return read_stage(options, blob, tables)


# ============================================================================= what the stage is
def single_layer(stage: dict[str, Any]) -> dict[str, Any] | None:
    """The geometry of a stage that is one CONV_2D / DEPTHWISE_CONV_2D layer run whole (grid 1x1, no scratch: the
    rest's convolutions, ``tfmcu.stage.custom.convs_to_flash``): its TFLite builtin, kernel, stride, dilation,
    groups and padding (top, bottom, left, right); None for any other stage. Our portable kernels read and write in
    the reference kernels' order, so in-place plans treat such an op as that builtin."""
    layers = stage.get("layers") or []
    if len(layers) != 1 or [int(g) for g in stage.get("grid", [])] != [1, 1]:
        return None
    code = int(layers[0]["type"])
    if code not in (abi.OP_CONV, abi.OP_DEPTHWISE):
        return None
    w = abi.params_from_words(code, [int(v) for v in layers[0]["words"]])
    return {"builtin": abi.OPS[code].name, "kernel": (w["kernel_h"], w["kernel_w"]),
            "stride": (w["stride_h"], w["stride_w"]), "dilation": (w["dilation_h"], w["dilation_w"]),
            "groups": w["groups"] if code == abi.OP_CONV else 1,
            "padding": tuple(int(p) for p in layers[0]["padding"])}


def kernel_memory(stage: dict[str, Any], pointer_bytes: int = 8) -> tuple[int, int]:
    """(persistent op-data bytes of the TFLM kernel, scratch bytes it requests) for a stage (``read_stage``'s
    description, or any dict with its ``scratch_bytes``, ``streamed_input`` and ``input_window_bytes``): the kernel
    keeps only its op data (``TfmcuPatchStageOpData``, the same for every stage), whatever the stage's size."""
    return (abi.sizeof("TfmcuPatchStageOpData", pointer_bytes),
            streamed_scratch(stage, int(stage["scratch_bytes"])))


def streamed_scratch(stage: dict[str, Any], scratch: int) -> int:
    """The kernel's scratch request given the stage's ``scratch`` (its patch buffers, plus an optimised backend's
    kernel buffer): with streamed input, the input row window after it (at a 4-byte boundary)."""
    if not stage.get("streamed_input"):
        return scratch
    return _align(scratch, 4) + int(stage["input_window_bytes"])


def streamed_input(stage: dict[str, Any]) -> tuple[tuple[int, int, int], str] | None:
    """((H, W, C), dtype name) of the image a streamed-input stage reads through its provider; None when the stage
    reads its input tensor."""
    if not stage.get("streamed_input"):
        return None
    h, w, c, dtype = stage["tensors"][int(stage["input_tensor"])][:4]
    return (int(h), int(w), int(c)), ("float32" if int(dtype) == 1 else "int8")
