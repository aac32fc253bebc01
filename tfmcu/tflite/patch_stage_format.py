"""The ``TFMCU_PATCH_STAGE`` custom operator as stored in a .tflite: its name, its flexbuffer options (format
versions 2 and 3; the name, versions, keys and table layouts are ``tfmcu.abi``'s) and what the TFLM kernel
(``tflm_patch_kernels/tflm/patch_stage_op.cc``) allocates for it.

Format 2 (written by ``tfmcu.stage.custom`` for a stage without halo caches or streamed input): a map with ``version``, ``name``, ``grid`` [rows, cols], ``tensors``
[[height, width, channels, dtype, producer], ...], ``input_tensor``, ``output_tensor``, ``layers`` [{type, name,
src, words (the params struct's scalar fields, floats as bits), padding, arrays {filter|bias|output_multiplier|
output_shift: input position}}], ``layer_inputs``, ``layer_outputs``, ``scratch_bytes``, and the input positions of
the INT32 tables ``row_spans``, ``col_spans``, ``buffer_offsets`` (read in place by the kernel).

Format 3 (a stage with halo caches, ``tfmcu.plan.halo``, or streamed input): format 2 plus ``num_caches`` and the
input positions of the INT32 tables ``row_held``, ``col_held`` ([bands, layers, 2]) and ``caches`` ([num_caches, 3]:
tensor, axis, offset); ``streamed_input`` (1: the op's input 0 is a one-element int8 placeholder and the kernel reads
the image through the application's ``TfmcuInputProvider``) with ``input_window_bytes``. Written for a stage with
either; a stage with neither is still written as format 2 (the same bytes as before format 3 existed).

* ``read_options(raw)``: the options map (``ValueError`` for anything else); ``options_of(attrs)`` the options of
  an IR op lowered from a model (the map the writer decided, or its flexbuffer read), ``options_at(model, index)``
  those of an operator of a model read or decided (``tfmcu.tflite.model``).
* ``kernel_memory(options, pointer_bytes)``: (the kernel's persistent op-data bytes, its scratch request: 0 for no
  request, a stage without intermediate tensors), the
  same arithmetic as ``PatchStagePersistentBytes`` in the C++ kernel, for 64-bit hosts and 32-bit Cortex-M.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flatbuffers import flexbuffers

from tfmcu import abi
from tfmcu.abi import FORMAT_VERSION, OLDEST_FORMAT_VERSION, PATCH_STAGE_OP
from tfmcu.tflite.model import TfliteModel

__all__ = ["FORMAT_VERSION", "OLDEST_FORMAT_VERSION", "PATCH_STAGE_OP", "kernel_memory", "options_at", "options_of",
           "read_options", "single_layer", "streamed_input", "streamed_scratch"]


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
                         f"{OLDEST_FORMAT_VERSION}..{FORMAT_VERSION}")
    return desc


def options_of(attrs: dict[str, Any]) -> dict[str, Any]:
    """The options of an IR op lowered from a model (``tfmcu.graph.from_tflite``): the map its writer decided
    (``decided_options``, a model not written yet) or its flexbuffer (``custom_options``) read; ``ValueError`` as
    ``read_options`` (``KeyError``: neither)."""
    if "decided_options" in attrs:
        return attrs["decided_options"]
    return read_options(attrs["custom_options"])


def options_at(model: TfliteModel, index: int) -> dict[str, Any]:
    """The options of operator ``index`` of a model read or decided (``tfmcu.tflite.model.TfliteModel``)."""
    if index in model.decided_options:
        return model.decided_options[index]
    op = model.flatbuffer.subgraphs[0].operators[index]
    return read_options(np.asarray(op.customOptions if op.customOptions is not None else [], np.uint8).tobytes())


def single_layer(options: dict[str, Any]) -> dict[str, Any] | None:
    """The geometry of a stage that is one CONV_2D / DEPTHWISE_CONV_2D layer run whole (grid 1x1, no scratch: the
    rest's convolutions, ``tfmcu.stage.custom.convs_to_flash``): its TFLite builtin, kernel, stride, dilation,
    groups and padding (top, bottom, left, right); None for any other stage. Our portable kernels read and write in
    the reference kernels' order, so in-place plans treat such an op as that builtin."""
    layers = options.get("layers") or []
    if len(layers) != 1 or [int(g) for g in options.get("grid", [])] != [1, 1]:
        return None
    code = int(layers[0]["type"])
    if code not in (abi.OP_CONV, abi.OP_DEPTHWISE):
        return None
    w = abi.params_from_words(code, [int(v) for v in layers[0]["words"]])
    return {"builtin": abi.OPS[code].name, "kernel": (w["kernel_h"], w["kernel_w"]),
            "stride": (w["stride_h"], w["stride_w"]), "dilation": (w["dilation_h"], w["dilation_w"]),
            "groups": w["groups"] if code == abi.OP_CONV else 1,
            "padding": tuple(int(p) for p in layers[0]["padding"])}


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def kernel_memory(options: dict[str, Any], pointer_bytes: int = 8) -> tuple[int, int]:
    """(persistent op-data bytes of the TFLM kernel, scratch bytes it requests) for decoded ``options``."""
    p = pointer_bytes
    # OpData: a TfmcuStage, a TfmcuPreparedStage, 4 pointers, a size_t, two ints
    op_data = _align(abi.sizeof("TfmcuStage", p) + abi.sizeof("TfmcuPreparedStage", p) + 5 * p + 8, p)
    n_tensors, layers = len(options["tensors"]), options["layers"]
    params = sum(_align(abi.sizeof(abi.op(int(entry["type"])).c_struct, p), p) for entry in layers)
    persistent = (op_data + _align(abi.sizeof("TfmcuTensor", p) * n_tensors, p)
                  + _align(abi.sizeof("TfmcuLayer", p) * len(layers), p) + params)
    return persistent, streamed_scratch(options, int(options["scratch_bytes"]))


def streamed_scratch(options: dict[str, Any], scratch: int) -> int:
    """The kernel's scratch request given the stage's ``scratch`` (its patch buffers, plus an optimised backend's
    kernel buffer): with streamed input, the input row window after it (at a 4-byte boundary)."""
    if not options.get("streamed_input"):
        return scratch
    return _align(scratch, 4) + int(options["input_window_bytes"])


def streamed_input(options: dict[str, Any]) -> tuple[tuple[int, int, int], str] | None:
    """((H, W, C), dtype name) of the image a streamed-input stage reads through its provider; None when the stage
    reads its input tensor."""
    if not options.get("streamed_input"):
        return None
    h, w, c, dtype = options["tensors"][int(options["input_tensor"])][:4]
    return (int(h), int(w), int(c)), ("float32" if int(dtype) == 1 else "int8")
