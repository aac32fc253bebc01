"""The ``TFMCU_PATCH_STAGE`` custom operator as stored in a .tflite: its name, its flexbuffer options (format
version 2) and what the TFLM kernel (``tflm_patch_kernels/tflm/patch_stage_op.cc``) allocates for it.

Format 2 (written by ``tfmcu.stage.custom``): a map with ``version``, ``name``, ``grid`` [rows, cols], ``tensors``
[[height, width, channels, dtype, producer], ...], ``input_tensor``, ``output_tensor``, ``layers`` [{type, name,
src, words (the params struct's scalar fields, floats as bits), padding, arrays {filter|bias|output_multiplier|
output_shift: input position}}], ``layer_inputs``, ``layer_outputs``, ``scratch_bytes``, and the input positions of
the INT32 tables ``row_spans``, ``col_spans``, ``buffer_offsets`` (read in place by the kernel).

Format 3 (a stage with halo caches, ``tfmcu.plan.halo``, or streamed input): format 2 plus ``num_caches`` and the
input positions of the INT32 tables ``row_held``, ``col_held`` ([bands, layers, 2]) and ``caches`` ([num_caches, 3]:
tensor, axis, offset); ``streamed_input`` (1: the op's input 0 is a one-element int8 placeholder and the kernel reads
the image through the application's ``TfmcuInputProvider``) with ``input_window_bytes``. A stage with neither is
still written as format 2.

* ``read_options(raw)``: the options map (``ValueError`` for anything else).
* ``kernel_memory(options, pointer_bytes)``: (the kernel's persistent op-data bytes, its scratch request: 0 for no
  request, a stage without intermediate tensors), the
  same arithmetic as ``PatchStagePersistentBytes`` in the C++ kernel, for 64-bit hosts and 32-bit Cortex-M.
"""

from __future__ import annotations

from typing import Any

from flatbuffers import flexbuffers

PATCH_STAGE_OP = "TFMCU_PATCH_STAGE"
FORMAT_VERSION = 3  # written for a stage with halo caches
OLDEST_FORMAT_VERSION = 2  # written for a stage without (the same bytes as before halo caches existed)

# Params struct layout per op type (tflm_patch_kernels/op_table.c): (leading pointer fields, 4-byte scalar fields).
_PARAMS_LAYOUT = {1: (4, 11), 2: (4, 11), 3: (0, 12), 4: (0, 1), 5: (0, 6), 6: (0, 6), 7: (0, 2)}


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


def single_layer(options: dict[str, Any]) -> dict[str, Any] | None:
    """The geometry of a stage that is one CONV_2D / DEPTHWISE_CONV_2D layer run whole (grid 1x1, no scratch: the
    rest's convolutions, ``tfmcu.stage.custom.convs_to_flash``): its TFLite builtin, kernel, stride, dilation,
    groups and padding (top, bottom, left, right); None for any other stage. Our portable kernels read and write in
    the reference kernels' order, so in-place plans treat such an op as that builtin."""
    layers = options.get("layers") or []
    if len(layers) != 1 or [int(g) for g in options.get("grid", [])] != [1, 1]:
        return None
    code = int(layers[0]["type"])
    if code not in (1, 2):
        return None
    w = [int(v) for v in layers[0]["words"]]  # kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, ...
    return {"builtin": "CONV_2D" if code == 1 else "DEPTHWISE_CONV_2D", "kernel": (w[0], w[1]),
            "stride": (w[2], w[3]), "dilation": (w[4], w[5]), "groups": w[6] if code == 1 else 1,
            "padding": tuple(int(p) for p in layers[0]["padding"])}


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _struct(fields: list[int], pointer_bytes: int) -> int:
    """sizeof a C struct of scalar fields (sizes 4 or pointer_bytes, each aligned to its size)."""
    at, top = 0, 4
    for size in fields:
        at = _align(at, size) + size
        top = max(top, size)
    return _align(at, top)


def kernel_memory(options: dict[str, Any], pointer_bytes: int = 8) -> tuple[int, int]:
    """(persistent op-data bytes of the TFLM kernel, scratch bytes it requests) for decoded ``options``."""
    p = pointer_bytes
    stage = _struct([4, p, 4, p, 4, 4, 4, 4, p, p, p, 4, p, p, 4, p], p)  # TfmcuStage
    prepared = _struct([p, 4, 4, 4, 4, 4, 4, 4, 4], p)  # TfmcuPreparedStage
    # OpData: the two structs, 4 pointers, a size_t, an int
    op_data = _align(stage + prepared + 5 * p + 8, p)
    layer = _struct([4, p, 4, 4, 4, 4], p)  # TfmcuLayer
    n_tensors, layers = len(options["tensors"]), options["layers"]
    params = 0
    for entry in layers:
        arrays, words = _PARAMS_LAYOUT[int(entry["type"])]
        params += _align(_struct([p] * arrays + [4] * words, p), p)
    persistent = op_data + _align(20 * n_tensors, p) + _align(layer * len(layers), p) + params
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
