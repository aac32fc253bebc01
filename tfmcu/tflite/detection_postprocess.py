"""The detector's tail: DEQUANTIZE and TFLite's ``TFLite_Detection_PostProcess`` op appended to an int8 model whose
two outputs are the box encodings and the class scores of every anchor.

``append_postprocess(model, anchors, num_classes, box_scales=..., ...)`` takes a model with outputs

* ``boxes`` [1, N, 4]: centre-size encodings (t_y, t_x, t_h, t_w) per anchor, int8 (or float32);
* ``scores`` [1, N, K]: per anchor and class, in [0, 1], int8 (or float32);

(found by the signature's output names ``boxes`` / ``scores``, else by shape) and appends::

    boxes  -> DEQUANTIZE -> float32 [1, N, 4] --.
    scores -> DEQUANTIZE -> float32 [1, N, K] ---+-> TFLite_Detection_PostProcess -> detection_boxes   [1, M, 4]
    anchors: float32 constant [N, 4] -----------'                                  detection_classes [1, M]
                                                                                   detection_scores  [1, M]
                                                                                   num_detections    [1]

the four float32 outputs becoming the model's (and its signature's) outputs, M = ``max_detections``. Boxes are
(ymin, xmin, ymax, xmax) fractions of the input, classes 0..K-1 as floats. The op's inputs, outputs and options are
those TFLM's kernel (tensorflow/lite/micro/kernels/detection_postprocess.cc) and TF Lite's
(tensorflow/lite/kernels/detection_postprocess.cc) read: a flexbuffer map with ``max_detections``,
``max_classes_per_detection`` (1: the fast NMS, one class per box), ``detections_per_class``, ``use_regular_nms``
(False), ``nms_score_threshold``, ``nms_iou_threshold``, ``num_classes`` and ``y_scale``, ``x_scale``, ``h_scale``,
``w_scale`` (the encoding's ``box_scales``, given by the caller: ``tfmcu.nets.anchors.BOX_SCALES``). Both kernels take
float32 inputs only in TFLM (TF Lite also takes uint8, not int8), hence the DEQUANTIZE ops. The model also gets a
``tfmcu_detector`` metadata entry (JSON: that it is a detector, the op's settings, the anchors per scale and the labels
when given; ``read_detector``).

The op writes only the first ``num_detections`` entries of its three [1, M, ...] outputs (both kernels leave the rest
as the arena held it), so outputs are compared after ``canonical_outputs`` zeroes the rest (the runners in
``tfmcu.runtime`` do, and so does the firmware before it hashes the outputs). ``postprocess_outputs(model)`` says
where the op's outputs are among the model's; ``detections(outputs, where)`` lists (class, score, box) per detection.

Errors: ``PostprocessError`` (a ``TfmcuError``), one line.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
from flatbuffers import flexbuffers

from tfmcu.errors import TfmcuError
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import ModelEditor, get_metadata

OP_NAME = "TFLite_Detection_PostProcess"
DETECTOR_METADATA = "tfmcu_detector"
OUTPUT_NAMES = ("detection_boxes", "detection_classes", "detection_scores", "num_detections")
INPUT_NAMES = ("boxes", "scores")  # the signature names of the model's two outputs append_postprocess reads
DEQUANTIZE_VERSION = 2  # int8 input (TFLite's op version table)


class PostprocessError(TfmcuError):
    """A model or argument from which no detection post-processing can be built; one line."""


# ----------------------------------------------------------------------------- options
def postprocess_options(num_classes: int, box_scales: Sequence[float], max_detections: int = 10,
                        score_threshold: float = 0.3, iou_threshold: float = 0.5) -> bytes:
    """The op's custom options: the flexbuffer map both kernels' Init read (see the module docstring)."""
    sy, sx, sh, sw = (float(v) for v in box_scales)
    return bytes(flexbuffers.Dumps({
        "max_detections": int(max_detections),
        "max_classes_per_detection": 1,
        "detections_per_class": int(max_detections),
        "use_regular_nms": False,
        "nms_score_threshold": float(score_threshold),
        "nms_iou_threshold": float(iou_threshold),
        "num_classes": int(num_classes),
        "y_scale": sy, "x_scale": sx, "h_scale": sh, "w_scale": sw,
    }))


def read_postprocess_options(raw: bytes) -> dict[str, Any]:
    """The options of a ``TFLite_Detection_PostProcess`` op as a dict (one-line error on garbage)."""
    try:
        opts = flexbuffers.Loads(bytes(raw))
    except Exception as e:  # flexbuffers raises assorted errors on garbage
        raise PostprocessError(f"{OP_NAME} options are not a flexbuffer map ({type(e).__name__})") from None
    if not isinstance(opts, dict):
        raise PostprocessError(f"{OP_NAME} options are not a flexbuffer map")
    return opts


# ----------------------------------------------------------------------------- append
def _check_args(anchors: Any, n: int, num_classes: int, box_scales: Sequence[float], max_detections: int,
                score_threshold: float, iou_threshold: float) -> np.ndarray:
    a = np.asarray(anchors)
    if a.ndim != 2 or a.shape != (n, 4):
        raise PostprocessError(f"anchors: expected shape [{n}, 4] (y_centre, x_centre, h, w; one per row of the "
                               f"model's box encodings), got {list(a.shape)}")
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)) or np.any(a[:, 2:] <= 0):
        raise PostprocessError("anchors: values must be finite, heights and widths > 0")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise PostprocessError(f"num_classes={num_classes!r}: expected an integer >= 1")
    scales = list(box_scales)
    if len(scales) != 4 or not all(np.isfinite(float(v)) and float(v) > 0 for v in scales):
        raise PostprocessError(f"box_scales={tuple(scales)}: expected 4 positive numbers (y, x, h, w)")
    if not isinstance(max_detections, (int, np.integer)) or isinstance(max_detections, bool) or max_detections < 1:
        raise PostprocessError(f"max_detections={max_detections!r}: expected an integer >= 1")
    if not 0.0 <= float(score_threshold) <= 1.0:
        raise PostprocessError(f"score_threshold={score_threshold}: expected a value in [0, 1]")
    if not 0.0 < float(iou_threshold) <= 1.0:
        raise PostprocessError(f"iou_threshold={iou_threshold}: expected a value in (0, 1] (both kernels check it)")
    return a


def _signature_outputs(model: ts.ModelT) -> dict[str, int]:
    sigs = model.signatureDefs or []
    if len(sigs) != 1:
        return {}
    return {ts.text(tm.name): int(tm.tensorIndex) for tm in sigs[0].outputs or []}


def _find_inputs(model: ts.ModelT, where: str) -> tuple[int, int]:
    """Tensor indices of the box encodings and the scores among the model's two outputs."""
    sg = model.subgraphs[0]
    outs = [int(t) for t in (sg.outputs if sg.outputs is not None else [])]
    if len(outs) != 2:
        raise PostprocessError(f"{where}: expected 2 outputs (box encodings [1, N, 4], scores [1, N, K]), the model "
                               f"has {len(outs)}")
    named = _signature_outputs(model)
    if all(k in named for k in INPUT_NAMES) and {named[k] for k in INPUT_NAMES} == set(outs):
        b, s = named["boxes"], named["scores"]
    else:  # by shape: the box encodings end in 4; with K = 4 classes, the model's order
        shapes = [ts.tensor_shape(sg.tensors[t]) for t in outs]
        fours = [k for k, sh in enumerate(shapes) if sh[-1:] == (4,)]
        b, s = (outs[fours[0]], outs[1 - fours[0]]) if len(fours) == 1 else (outs[0], outs[1])
    bs, ss = ts.tensor_shape(sg.tensors[b]), ts.tensor_shape(sg.tensors[s])
    if len(bs) != 3 or bs[0] != 1 or bs[2] != 4 or len(ss) != 3 or ss[0] != 1 or ss[1] != bs[1]:
        raise PostprocessError(f"{where}: outputs {list(bs)} and {list(ss)}: expected box encodings [1, N, 4] and "
                               f"scores [1, N, K]")
    for t in (b, s):
        dtype = ts.dtype_name(sg.tensors[t].type)
        if dtype not in ("int8", "float32"):
            raise PostprocessError(f"{where}: output '{ts.tensor_name(sg.tensors[t])}' is {dtype}; int8 or float32 "
                                   f"expected")
    return b, s


def _new_tensor(ed: ModelEditor, shape: tuple[int, ...], name: str) -> int:
    """A float32 activation tensor."""
    t = ts.TensorT()
    t.shape = np.asarray(shape, dtype=np.int32)
    t.type = ts.TensorType.FLOAT32
    t.buffer = 0
    t.name = name.encode()
    ed.subgraph.tensors.append(t)
    ed.new_tensors += 1
    return len(ed.subgraph.tensors) - 1


def _as_float(ed: ModelEditor, src: int, name: str, ops: list) -> int:
    """``src`` as float32: itself when it is float32, else a DEQUANTIZE's output."""
    t = ed.tensor(src)
    if ts.dtype_name(t.type) == "float32":
        return src
    out = _new_tensor(ed, ts.tensor_shape(t), name)
    op = ed.builtin_operator("DEQUANTIZE", [src], [out])
    op.opcodeIndex = ed.builtin_opcode("DEQUANTIZE", DEQUANTIZE_VERSION)
    ops.append(op)
    return out


def append_postprocess(model_bytes: bytes, anchors: Any, num_classes: int, max_detections: int = 10,
                       score_threshold: float = 0.3, iou_threshold: float = 0.5, *,
                       box_scales: Sequence[float], labels: Sequence[str] | None = None,
                       anchors_per_scale: Any = None, where: str = "model") -> bytes:
    """``model_bytes`` with DEQUANTIZE and ``TFLite_Detection_PostProcess`` appended (see the module docstring).

    ``anchors``: [N, 4] (y_centre, x_centre, h, w), one per row of the box encodings (``anchor_grid``);
    ``box_scales``: the encoding's (y, x, h, w) scales (``BOX_SCALES``); ``labels`` (K class names) and
    ``anchors_per_scale`` (the spec's ``HeadSpec.anchors``) are only recorded in the ``tfmcu_detector`` entry. Any
    other metadata and associated files are kept."""
    ed = ModelEditor(model_bytes, where)
    m, sg = ed.model, ed.subgraph
    if any(ts.op_name(m, op) == f"custom:{OP_NAME}" for op in sg.operators):
        raise PostprocessError(f"{where}: the model already ends in {OP_NAME}")
    b, s = _find_inputs(m, where)
    n, k = ts.tensor_shape(sg.tensors[b])[1], ts.tensor_shape(sg.tensors[s])[2]
    a = _check_args(anchors, n, num_classes, box_scales, max_detections, score_threshold, iou_threshold)
    if num_classes != k:
        raise PostprocessError(f"num_classes={num_classes}: the scores output has {k} classes")
    if labels is not None and len(labels) != k:
        raise PostprocessError(f"labels: {len(labels)} given for {k} classes")
    tail: list[ts.OperatorT] = []
    bf = _as_float(ed, b, "detection/box_encodings", tail)
    sf = _as_float(ed, s, "detection/scores_float", tail)
    anchor_t = ed.constant(a, ts.TensorType.FLOAT32, "detection/anchors", dedupe=False)
    mdet = int(max_detections)
    outs = [_new_tensor(ed, shape, name) for shape, name in
            zip(((1, mdet, 4), (1, mdet), (1, mdet), (1,)), OUTPUT_NAMES)]
    options = postprocess_options(int(num_classes), box_scales, mdet, score_threshold, iou_threshold)
    tail.append(ed.custom_operator(OP_NAME, [bf, sf, anchor_t], outs, options))
    sg.operators = list(sg.operators) + tail
    sg.outputs = np.asarray(outs, dtype=np.int32)
    for sig in m.signatureDefs or []:
        maps = []
        for name, t in zip(OUTPUT_NAMES, outs):
            tm = ts.schema.TensorMapT()
            tm.name = name.encode()
            tm.tensorIndex = t
            maps.append(tm)
        sig.outputs = maps
    record = {
        "type": "detector",
        "op": OP_NAME,
        "outputs": list(OUTPUT_NAMES),
        "num_classes": int(num_classes),
        "num_anchors": int(n),
        "max_detections": mdet,
        "score_threshold": float(score_threshold),
        "iou_threshold": float(iou_threshold),
        "box_scales": [float(v) for v in box_scales],
        "box_format": "ymin, xmin, ymax, xmax (fractions of the input)",
        "anchor_format": "y_centre, x_centre, h, w (fractions of the input)",
    }
    if anchors_per_scale is not None:
        record["anchors_per_scale"] = json.loads(json.dumps(anchors_per_scale))
    if labels is not None:
        record["labels"] = [str(v) for v in labels]
    ed.set_metadata(DETECTOR_METADATA, json.dumps(record, sort_keys=True).encode())
    return ed.to_bytes()


# ----------------------------------------------------------------------------- reading
def read_detector(model: ts.ModelT) -> dict[str, Any] | None:
    """The ``tfmcu_detector`` record of an unpacked model (None when it has none)."""
    raw = get_metadata(model, DETECTOR_METADATA)
    if raw is None:
        return None
    try:
        rec = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise PostprocessError(f"the {DETECTOR_METADATA} metadata is not JSON") from None
    return rec if isinstance(rec, dict) else None


def postprocess_outputs(model: ts.ModelT) -> tuple[int, int, int, int] | None:
    """Where the outputs (boxes, classes, scores, num) of the model's ``TFLite_Detection_PostProcess`` op are among
    the model's outputs (positions), or None when the model has no such op with all four as model outputs."""
    sg = model.subgraphs[0]
    outs = [int(t) for t in (sg.outputs if sg.outputs is not None else [])]
    for op in sg.operators or []:
        if ts.op_name(model, op) != f"custom:{OP_NAME}":
            continue
        mine = [int(t) for t in op.outputs]
        if len(mine) == 4 and all(t in outs for t in mine):
            return tuple(outs.index(t) for t in mine)  # type: ignore[return-value]
    return None


def canonical_outputs(outputs: Sequence[np.ndarray], where: tuple[int, int, int, int] | None) -> list[np.ndarray]:
    """``outputs`` (one sample's, in model order) with the op's unwritten entries (past ``num_detections``) zeroed;
    unchanged when ``where`` is None."""
    outs = [np.array(o, copy=True) for o in outputs]
    if where is None:
        return outs
    ib, ic, isc, inum = where
    num = outs[inum].reshape(-1)
    count = int(num[0]) if num.size and np.isfinite(num[0]) else 0
    for j in (ib, ic, isc):
        if outs[j].ndim >= 2:  # [1, M] / [1, M, 4]
            outs[j][:, max(0, count):] = 0
    return outs


def detections(outputs: Sequence[np.ndarray], where: tuple[int, int, int, int]) -> list[dict[str, Any]]:
    """The detections of one sample's outputs: [{class, score, box: [ymin, xmin, ymax, xmax]}] in the op's order
    (decreasing score)."""
    ib, ic, isc, inum = where
    count = int(np.asarray(outputs[inum]).reshape(-1)[0])
    boxes = np.asarray(outputs[ib]).reshape(-1, 4)
    classes = np.asarray(outputs[ic]).reshape(-1)
    scores = np.asarray(outputs[isc]).reshape(-1)
    return [{"class": int(classes[i]), "score": float(scores[i]), "box": [float(v) for v in boxes[i]]}
            for i in range(max(0, min(count, len(scores))))]
