"""The parts of the detection task (``tfmcu.train.detect``) for yolo specs: anchors from data, targets, the loss,
augmentation, the host decoder with NMS, COCO mAP and a picture of the detections.

Every box passes through the box contract of ``tfmcu.nets.anchors`` (``anchor_grid``, ``encode_boxes``,
``decode_boxes``); nothing here has box math of its own beyond IoUs. Boxes go in as ``tfmcu.data`` gives
them, ``[x0, y0, x1, y1]``, and come out of ``decode`` as ``DETECTION_POSTPROCESS`` gives them,
``[ymin, xmin, ymax, xmax]`` fractions of the input.

* **Anchors from data** (``fit_anchors``): ``kmeans_anchors`` on the training boxes' (w, h) fractions with k = the
  spec's anchor count, ``split_anchors`` into its scales; the spec the run trains (and writes) carries them.
* **Targets** (``assign_targets``): with ``positives="multi"`` (the default, YOLOv5's) a true box goes to every
  anchor shape within ``ANCHOR_RATIO`` of its width and height (the best one if none is), at the cell of that scale
  holding its centre and the two neighbouring cells nearest the centre (an offset of up to a cell and a half, which
  the encoding represents as any other); with ``positives="best"`` (YOLOv3's) only to the anchor, over all scales,
  with the best (w, h) IoU (``wh_iou``) at the centre's cell, and when two boxes want the same slot the second
  takes its next-best anchor. A slot gets objectness 1, the box's class one-hot and ``encode_boxes(box, that
  anchor)``; a slot an earlier box took stays that box's. An unassigned anchor whose box (placed at its cell,
  ``anchor_grid``) overlaps a true box with IoU > ``ignore_iou`` is *ignored*: it gets no no-object loss. Targets
  are ``[B, N, 5 + K]`` in the output's layout (``ty, tx, th, tw, obj, classes``) with obj 1 (assigned), 0
  (background) or -1 (ignored).
* **Loss** (``detection_loss``): on the concatenated outputs ``[B, N, 5 + K]``, summed over the batch and divided by
  its number of assigned anchors (SSD's normalisation): ``box_weight`` x the box loss on assigned anchors +
  objectness BCE on assigned anchors (target ``1 - obj_iou + obj_iou * IoU`` of the anchor's predicted box with its
  true box, YOLOv5's: the best-placed of a box's several positives scores highest, by a margin int8 keeps) +
  ``noobj_weight`` x objectness BCE on background anchors + ``class_weight`` x per-class BCE (sigmoid, as the score
  is ``sigmoid(obj) * sigmoid(class)``) on assigned anchors. The box loss is
  1 - GIoU of the boxes the predicted and the target encodings decode to (``box_loss="giou"``, the default:
  ``decode_boxes`` in the graph, on ``anchor_grid``), which scores the box that comes out whatever anchor encodes
  it; or 1 - CIoU (``box_loss="ciou"``: minus the squared centre distance over the hull's squared diagonal and an
  aspect term); or (``box_loss="smooth_l1"``) smooth-L1 of the four encodings: exact and cheap (the head's box
  outputs *are* the encodings ``DETECTION_POSTPROCESS`` decodes, and the encoding is scale-invariant).
  ``box_l1`` > 0 adds that weight x the smooth-L1 to the IoU loss: a predicted box that contains its true box gets
  no gradient on its centre from GIoU, and on a coarse grid (objects far smaller than a cell, far from the anchors'
  centres) an untrained head's boxes grow to cover their targets and stay there; the L1 term keeps them learning.
* **Augmentation** (``augment``, ``epoch_batches``): on the resized float images and their fractional boxes, before
  batching: horizontal flip, zoom in [1 - scale, 1 + scale] about the centre and a shift of up to ``translate`` per
  axis, one bilinear resampling (pixels that come from outside the image are black, as ``tfmcu.data``'s shifts);
  boxes move with the pixels, are clipped to the image and dropped when less than ``MIN_VISIBLE`` of their area
  stays inside. Each sample's draw is ``np.random.default_rng([seed, epoch, index])``, the epoch's order
  ``default_rng([seed, epoch])``: an epoch depends only on (seed, epoch), so a resumed run sees the same batches.
* **Decoder** (``decode``): raw outputs in anchor order (``flatten_outputs``), scores ``sigmoid(obj) *
  sigmoid(class)``, boxes ``decode_boxes``, then ``DETECTION_POSTPROCESS``'s fast NMS (``use_regular_nms=False``,
  ``max_classes_per_detection=1``): per anchor the best class score, kept if ``>= score_threshold``, sorted by score
  (stable, as TFLM's merge sort), greedy suppression of boxes with IoU ``> iou_threshold`` with a kept one, at most
  ``max_detections``; the class is the anchor's best class. Boxes are not clipped (the op does not clip either).
* **Evaluation** (``evaluate``, ``predict_detections``, ``coco_map``): COCO mAP@[.5:.95] and mAP@0.5 with
  pycocotools' ``COCOeval`` (bbox, 100 detections per image), the ground truth and the detections built in memory,
  in the pixels of the split's images; its prints are silenced.
* **Picture** (``plot_detections``): test images with their true boxes (green) and detections (red, class and
  score).

TensorFlow is imported inside the functions that need it (the loss, the training model); the rest is NumPy.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tfmcu.data.images import model_inputs
from tfmcu.data.split import Split
from tfmcu.files import figure_png
from tfmcu.nets.anchors import anchor_fit, anchor_grid, decode_boxes, encode_boxes, kmeans_anchors, split_anchors, \
    wh_iou
from tfmcu.nets.spec import YOLO_FIELDS, HeadSpec, NetSpec

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

NUM_FIELDS = len(YOLO_FIELDS)  # ty, tx, th, tw, obj (then the class logits)
OBJ = YOLO_FIELDS.index("obj")
MIN_VISIBLE = 0.25  # augmentation: a box keeps at least this fraction of its area inside the image, or is dropped
FILL = -1.0  # augmentation: the normalised value of a black pixel ((0 - 127.5) / 127.5)


# ============================================================================= anchors from data
def boxes_wh(boxes: Sequence[np.ndarray]) -> np.ndarray:
    """The (w, h) [M, 2] of every box of ``boxes`` (per image, ``[x0, y0, x1, y1]`` fractions) with w, h > 0."""
    b = np.concatenate([np.asarray(x, np.float64).reshape(-1, 4) for x in boxes] or [np.zeros((0, 4))])
    wh = b[:, 2:4] - b[:, 0:2]
    return wh[(wh[:, 0] > 0) & (wh[:, 1] > 0)]


def with_anchors(spec: NetSpec, anchors: list[list[list[float]]]) -> NetSpec:
    """``spec`` with a yolo head carrying ``anchors`` (per scale, coarsest first), validated."""
    h = spec.head
    head = HeadSpec.yolo(h.num_classes, [[list(map(float, a)) for a in scale] for scale in anchors], h.head_channels,
                         h.activation)
    return spec.replace(head=head).validate()


def fit_anchors(spec: NetSpec, boxes: Sequence[np.ndarray], seed: int = 0) -> tuple[NetSpec, dict[str, Any]]:
    """``spec`` with anchors clustered from ``boxes`` (per image, fractions ``[x0, y0, x1, y1]``): ``kmeans_anchors``
    with k = the spec's number of anchors, then ``split_anchors`` into its scales. Returns the new spec and
    {anchors, fit (mean best IoU of the boxes with them), spec_anchors, spec_fit}. Raises ``AnchorError`` (one
    line) when the boxes have fewer distinct sizes than k."""
    wh = boxes_wh(boxes)
    scales = spec.detection_scales()
    k = sum(len(sc.anchors) for sc in scales)
    anchors = kmeans_anchors(wh, k, seed=seed)
    new = with_anchors(spec, split_anchors(anchors, len(scales)))
    old = np.array([a for sc in scales for a in sc.anchors])
    return new, {"anchors": new.head.anchors, "fit": round(anchor_fit(wh, anchors), 4),
                 "spec_anchors": spec.head.anchors, "spec_fit": round(anchor_fit(wh, old), 4), "boxes": len(wh)}


# ============================================================================= targets
def _corners(anchors: np.ndarray) -> np.ndarray:
    """(yc, xc, h, w) [N, 4] -> (ymin, xmin, ymax, xmax)."""
    a = np.asarray(anchors, np.float64)
    return np.stack([a[:, 0] - a[:, 2] / 2, a[:, 1] - a[:, 3] / 2, a[:, 0] + a[:, 2] / 2, a[:, 1] + a[:, 3] / 2], 1)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU [N, M] of boxes ``a`` [N, 4] and ``b`` [M, 4], both (ymin, xmin, ymax, xmax) (or both x-first: the IoU is
    the same); 0 where a box has no area (as DETECTION_POSTPROCESS's IoU)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    ok = (area_a[:, None] > 0) & (area_b[None, :] > 0)
    return np.where(ok, inter / np.where(ok, union, 1.0), 0.0)


class _Layout:
    """Where each anchor of a spec sits in the output order (``anchor_grid``'s)."""

    def __init__(self, spec: NetSpec):
        self.grid = anchor_grid(spec)
        self.corners = _corners(self.grid)
        self.num_classes = spec.head.num_classes
        self.scales = []  # (offset, grid, anchors per cell)
        wh, where = [], []
        offset = 0
        for s, sc in enumerate(spec.detection_scales()):
            self.scales.append((offset, sc.grid, len(sc.anchors)))
            for a, (w, h) in enumerate(sc.anchors):
                wh.append((w, h))
                where.append((s, a))
            offset += sc.grid * sc.grid * len(sc.anchors)
        self.n = offset
        self.anchor_wh = np.array(wh, np.float64)
        self.anchor_of = where  # flat anchor shape index -> (scale, anchor of the scale)

    def slot(self, shape_index: int, yc: float, xc: float) -> int:
        """The output index of anchor shape ``shape_index`` at the cell holding (yc, xc)."""
        return self.slots(shape_index, yc, xc, False)[0]

    def slots(self, shape_index: int, yc: float, xc: float, neighbours: bool) -> list[int]:
        """The output indices of anchor shape ``shape_index`` at the cell holding (yc, xc), and with ``neighbours``
        at the two cells beside it nearest the point (the one above or below, the one left or right; inside the
        grid), YOLOv5's three."""
        s, a = self.anchor_of[shape_index]
        offset, g, per_cell = self.scales[s]
        fy, fx = yc * g, xc * g
        gy, gx = min(max(int(np.floor(fy)), 0), g - 1), min(max(int(np.floor(fx)), 0), g - 1)
        cells = [(gy, gx)]
        if neighbours:
            ny, nx = gy + (1 if fy - gy >= 0.5 else -1), gx + (1 if fx - gx >= 0.5 else -1)
            cells += [c for c in ((ny, gx), (gy, nx)) if 0 <= c[0] < g and 0 <= c[1] < g]
        return [offset + (cy * g + cx) * per_cell + a for cy, cx in cells]


POSITIVES = ("best", "multi")  # one anchor per box (YOLOv3), or several anchors and cells per box (YOLOv5)
ANCHOR_RATIO = 4.0  # positives "multi": an anchor shape takes a box whose width and height are within this factor


def assign_targets(boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray], spec: NetSpec,
                   ignore_iou: float = 0.5, layout: _Layout | None = None, positives: str = "best") -> np.ndarray:
    """Training targets float32 ``[B, N, 5 + K]`` for B images (module docstring): ``boxes[i]`` ``[n, 4]``
    ``[x0, y0, x1, y1]`` fractions, ``labels[i]`` ``[n]`` class ids. Boxes without area are skipped.
    ``positives="multi"``: a box goes to every anchor shape whose width and height are within ``ANCHOR_RATIO`` of its
    own (the best one if none is), each at the box's cell and the two neighbouring cells nearest its centre; a slot
    an earlier box took stays that box's."""
    if positives not in POSITIVES:
        raise ValueError(f"positives {positives!r}: expected one of {', '.join(POSITIVES)}")
    lay = layout or _Layout(spec)
    k = lay.num_classes
    y = np.zeros((len(boxes), lay.n, NUM_FIELDS + k), np.float32)
    for i, (b, lab) in enumerate(zip(boxes, labels)):
        b = np.asarray(b, np.float64).reshape(-1, 4)
        lab = np.asarray(lab, np.int64).reshape(-1)
        wh = b[:, 2:4] - b[:, 0:2]
        ok = (wh[:, 0] > 0) & (wh[:, 1] > 0)
        b, lab, wh = b[ok], lab[ok], wh[ok]
        if not len(b):
            continue
        yx = b[:, [1, 0, 3, 2]]  # (ymin, xmin, ymax, xmax)
        ignored = box_iou(lay.corners, yx).max(axis=1) > ignore_iou
        y[i, ignored, OBJ] = -1.0
        ranking = np.argsort(-wh_iou(wh, lay.anchor_wh), axis=1, kind="stable")  # best anchor shape first
        if positives == "multi":
            ratio = wh[:, None, :] / lay.anchor_wh[None]
            near = np.maximum(ratio, 1 / ratio).max(axis=-1) < ANCHOR_RATIO  # [n, shapes]
        for j in range(len(b)):
            yc, xc = (yx[j, 0] + yx[j, 2]) / 2, (yx[j, 1] + yx[j, 3]) / 2
            if positives == "multi":
                shapes = [int(m) for m in ranking[j] if near[j, m]] or [int(ranking[j][0])]
                for m in shapes:
                    for idx in lay.slots(m, yc, xc, True):
                        if y[i, idx, OBJ] != 1.0:
                            y[i, idx, :4] = encode_boxes(yx[j][None], lay.grid[idx:idx + 1])[0]
                            y[i, idx, OBJ] = 1.0
                            y[i, idx, NUM_FIELDS:] = 0.0
                            y[i, idx, NUM_FIELDS + lab[j]] = 1.0
                continue
            for m in ranking[j]:
                idx = lay.slot(int(m), yc, xc)
                if y[i, idx, OBJ] == 1.0:
                    continue  # taken by an earlier box: the next-best anchor
                y[i, idx, :4] = encode_boxes(yx[j][None], lay.grid[idx:idx + 1])[0]
                y[i, idx, OBJ] = 1.0
                y[i, idx, NUM_FIELDS:] = 0.0
                y[i, idx, NUM_FIELDS + lab[j]] = 1.0
                break
    return y


# ============================================================================= loss
def _iou_terms(a, b, kind: str = "giou"):
    """(IoU, the box loss's IoU variant) of predicted boxes ``a`` and true boxes ``b`` [..., 4] (ymin, xmin, ymax,
    xmax), TensorFlow tensors. ``kind="giou"``: IoU - (hull - union) / hull; ``"ciou"``: IoU - (centre distance /
    hull diagonal)^2 - alpha v, v the squared difference of the boxes' aspect angles x 4 / pi^2 and alpha = v /
    (1 - IoU + v) (no gradient through alpha), Zheng et al.'s Complete IoU."""
    import tensorflow as tf

    if kind not in ("giou", "ciou"):
        raise ValueError(f"IoU loss {kind!r}: expected giou or ciou")
    area = lambda t: tf.maximum(t[..., 2] - t[..., 0], 0.0) * tf.maximum(t[..., 3] - t[..., 1], 0.0)  # noqa: E731
    lo, hi = tf.maximum(a[..., :2], b[..., :2]), tf.minimum(a[..., 2:], b[..., 2:])
    inter = tf.reduce_prod(tf.maximum(hi - lo, 0.0), axis=-1)
    union = area(a) + area(b) - inter
    iou = inter / tf.maximum(union, 1e-9)
    hull_hw = tf.maximum(a[..., 2:], b[..., 2:]) - tf.minimum(a[..., :2], b[..., :2])
    if kind == "giou":
        hull = tf.reduce_prod(hull_hw, axis=-1)
        return iou, iou - (hull - union) / tf.maximum(hull, 1e-9)
    centre = lambda t: (t[..., :2] + t[..., 2:]) / 2  # noqa: E731
    rho2 = tf.reduce_sum(tf.square(centre(a) - centre(b)), axis=-1)
    c2 = tf.maximum(tf.reduce_sum(tf.square(hull_hw), axis=-1), 1e-9)
    angle = lambda t: tf.atan((t[..., 3] - t[..., 1]) / tf.maximum(t[..., 2] - t[..., 0], 1e-9))  # noqa: E731
    v = (4.0 / np.pi ** 2) * tf.square(angle(b) - angle(a))
    alpha = tf.stop_gradient(v / tf.maximum(1.0 - iou + v, 1e-9))
    return iou, iou - rho2 / c2 - alpha * v


def _loss_terms(y_true, y_pred, anchors=None, obj_iou=0.0, iou_kind="giou", box_l1=0.0):
    """Per image: the box loss (smooth-L1 of the encodings; with ``anchors`` [N, 4], 1 - GIoU (``iou_kind``
    "giou") or 1 - CIoU ("ciou") of the boxes both encodings decode to on them), objectness BCE (assigned),
    objectness BCE (background), class BCE, as [B] sums; and the batch's number of assigned anchors (at least 1).
    ``obj_iou`` > 0 (needs ``anchors``): an assigned anchor's objectness target is ``1 - obj_iou + obj_iou * IoU`` of
    its predicted box with the true box (no gradient through the IoU), not 1. ``box_l1`` > 0 (with ``anchors``): plus
    ``box_l1`` x smooth-L1 of the encodings."""
    import tensorflow as tf

    y_true = tf.cast(y_true, y_pred.dtype)
    obj = y_true[..., OBJ]
    pos = tf.cast(tf.equal(obj, 1.0), y_pred.dtype)
    neg = tf.cast(tf.equal(obj, 0.0), y_pred.dtype)
    obj_true = pos
    if anchors is not None:
        grid = tf.constant(np.asarray(anchors, np.float32), dtype=y_pred.dtype)
        # (the encodings clipped where exp would overflow: an untrained head's sizes are far off)
        t_pred = tf.concat([y_pred[..., :2], tf.clip_by_value(y_pred[..., 2:4], -50.0, 50.0)], axis=-1)
        boxes = decode_boxes(t_pred, grid, tf), decode_boxes(y_true[..., :4], grid, tf)
        iou, score = _iou_terms(*boxes, iou_kind)
        box_term = 1.0 - score
        if box_l1:
            box_term += box_l1 * _smooth_l1(y_pred[..., :4] - y_true[..., :4])
        if obj_iou:
            obj_true = pos * (1.0 - obj_iou + obj_iou * tf.stop_gradient(tf.clip_by_value(iou, 0.0, 1.0)))
    else:
        box_term = _smooth_l1(y_pred[..., :4] - y_true[..., :4])
    obj_bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=obj_true, logits=y_pred[..., OBJ])
    cls_bce = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=y_true[..., NUM_FIELDS:],
                                                                    logits=y_pred[..., NUM_FIELDS:]), axis=-1)
    terms = [tf.reduce_sum(box_term * pos, axis=1), tf.reduce_sum(obj_bce * pos, axis=1),
             tf.reduce_sum(obj_bce * neg, axis=1), tf.reduce_sum(cls_bce * pos, axis=1)]
    n_pos = tf.maximum(tf.reduce_sum(pos), 1.0)
    return terms, n_pos


def _smooth_l1(d):
    """Smooth-L1 (Huber, delta 1) of the differences ``d`` [..., 4], summed over the last axis."""
    import tensorflow as tf

    d = tf.abs(d)
    return tf.reduce_sum(tf.where(d < 1.0, 0.5 * tf.square(d), d - 0.5), axis=-1)


def detection_loss(box_weight: float = 1.0, noobj_weight: float = 0.5, class_weight: float = 1.0,
                   anchors: np.ndarray | None = None, obj_iou: float = 0.0, iou_kind: str = "giou",
                   box_l1: float = 0.0) -> Callable:
    """The loss ``fn(y_true, y_pred)`` for ``model.compile``: y_true from ``assign_targets``, y_pred the raw outputs
    concatenated ``[B, N, 5 + K]`` (``training_model``). Per-image values whose batch mean (Keras' reduction) is the
    batch's weighted sum divided by its assigned anchors (module docstring). ``anchors`` (``anchor_grid(spec)``):
    the box loss is 1 - GIoU (or, ``iou_kind="ciou"``, 1 - CIoU) of the decoded boxes instead of smooth-L1 of the
    encodings (plus ``box_l1`` x that smooth-L1); with them, ``obj_iou`` mixes the boxes' IoU into the assigned
    anchors' objectness target (``_loss_terms``)."""
    import tensorflow as tf

    if not 0 <= obj_iou <= 1 or ((obj_iou or box_l1) and anchors is None):
        raise ValueError("obj_iou must be in [0, 1]; obj_iou and box_l1 need anchors to decode the boxes on")

    def detection_loss(y_true, y_pred):
        (box, obj_pos, obj_neg, cls), n_pos = _loss_terms(y_true, y_pred, anchors, obj_iou, iou_kind, box_l1)
        total = box_weight * box + obj_pos + noobj_weight * obj_neg + class_weight * cls
        return total * tf.cast(tf.shape(total)[0], total.dtype) / n_pos

    return detection_loss


def loss_metrics(noobj_weight: float = 0.5, anchors: np.ndarray | None = None, obj_iou: float = 0.0,
                 iou_kind: str = "giou", box_l1: float = 0.0) -> list[Callable]:
    """Keras metrics logging the loss's parts (unweighted, per assigned anchor): ``box_loss``, ``obj_loss``
    (assigned + ``noobj_weight`` x background) and ``class_loss``."""
    import tensorflow as tf

    def box_loss(y_true, y_pred):
        (box, _, _, _), n = _loss_terms(y_true, y_pred, anchors, iou_kind=iou_kind, box_l1=box_l1)
        return tf.reduce_sum(box) / n

    obj_anchors = anchors if obj_iou else None  # (decided here: autograph loses closures in conditionals)

    def obj_loss(y_true, y_pred):
        (_, pos, neg, _), n = _loss_terms(y_true, y_pred, obj_anchors, obj_iou)
        return (tf.reduce_sum(pos) + noobj_weight * tf.reduce_sum(neg)) / n

    def class_loss(y_true, y_pred):
        (_, _, _, cls), n = _loss_terms(y_true, y_pred)
        return tf.reduce_sum(cls) / n

    return [box_loss, obj_loss, class_loss]


def training_model(model, spec: NetSpec):
    """A ``tf_keras.Model`` sharing ``model``'s layers (``build_keras(spec)``) whose one output is the raw outputs
    concatenated in anchor order, ``[B, N, 5 + K]`` (each scale ``[B, S, S, A * (5 + K)]`` reshaped to
    ``[B, S * S * A, 5 + K]``, coarsest first): what the loss and ``decode`` read."""
    import tf_keras

    layers = tf_keras.layers
    fields = NUM_FIELDS + spec.head.num_classes
    flat = [layers.Reshape((sc.grid * sc.grid * len(sc.anchors), fields), name=f"{sc.name}_flat")(out)
            for sc, out in zip(spec.detection_scales(), model.outputs)]
    y = flat[0] if len(flat) == 1 else layers.Concatenate(axis=1, name="head_flat")(flat)
    return tf_keras.Model(model.inputs, y, name=f"{model.name}_train")


# ============================================================================= augmentation
def _resample_taps(n: int, zoom: float, shift: float, mirror: bool) -> tuple[np.ndarray, ...]:
    """The bilinear taps along one axis of the map f -> (f - 0.5) * zoom + 0.5 + shift (then f -> 1 - f if
    ``mirror``), f a fraction of the side: per output pixel the two source pixels (clipped into the image) and their
    weights (0 for a source pixel outside it, so an output pixel that samples outside has weights summing to less
    than 1)."""
    out = (np.arange(n) + 0.5) / n
    if mirror:
        out = 1.0 - out
    src = ((out - 0.5 - shift) / zoom + 0.5) * n - 0.5  # the source pixel coordinate (pixel centres at integers)
    p0 = np.floor(src).astype(np.int64)
    w1 = src - p0
    w0 = 1.0 - w1
    p1 = p0 + 1
    w0 = np.where((p0 >= 0) & (p0 < n), w0, 0.0)
    w1 = np.where((p1 >= 0) & (p1 < n), w1, 0.0)
    return np.clip(p0, 0, n - 1), w0, np.clip(p1, 0, n - 1), w1


def _resample(image: np.ndarray, taps: tuple[np.ndarray, ...], axis: int) -> np.ndarray:
    """``image`` resampled along ``axis`` (0: rows, 1: columns) with ``_resample_taps``' taps."""
    p0, w0, p1, w1 = taps
    shape = (-1, 1, 1) if axis == 0 else (1, -1, 1)
    return (np.take(image, p0, axis=axis) * w0.reshape(shape) + np.take(image, p1, axis=axis) * w1.reshape(shape))


def augment(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator, flip: bool = True,
            scale: float = 0.25, translate: float = 0.125) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image (float32 ``[H, W, C]``, normalised), its boxes (``[n, 4]`` ``[x0, y0, x1, y1]`` fractions) and
    labels, zoomed by ``1 + U(-scale, scale)`` about the centre, shifted by ``U(-translate, translate)`` of the side
    per axis and, if ``flip``, mirrored with probability 1/2 (module docstring). Returns (image, boxes, labels)."""
    zoom = 1.0 + rng.uniform(-scale, scale)
    ty, tx = rng.uniform(-translate, translate, 2)
    mirror = bool(flip) and bool(rng.random() < 0.5)
    h, w = image.shape[:2]
    ty_taps, tx_taps = _resample_taps(h, zoom, ty, False), _resample_taps(w, zoom, tx, mirror)
    img = _resample(_resample(image.astype(np.float64), ty_taps, 0), tx_taps, 1)  # (separable: two taps per axis)
    img += FILL * (1.0 - np.outer(ty_taps[1] + ty_taps[3], tx_taps[1] + tx_taps[3]))[..., None]
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    moved = np.empty_like(b)
    moved[:, [0, 2]] = (b[:, [0, 2]] - 0.5) * zoom + 0.5 + tx
    moved[:, [1, 3]] = (b[:, [1, 3]] - 0.5) * zoom + 0.5 + ty
    if mirror:
        moved[:, [0, 2]] = 1.0 - moved[:, [2, 0]]
    clipped = np.clip(moved, 0.0, 1.0)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    keep = (area(clipped) > 0) & (area(clipped) >= MIN_VISIBLE * area(moved))
    return (img.astype(np.float32), clipped[keep].astype(np.float32),
            np.asarray(labels).reshape(-1)[keep].astype(np.int32))


@dataclass
class DetArrays:
    """A split as model inputs: float32 images ``[N, R, R, C]`` (normalised; C may be 1 for grey images that the
    model takes as 3 channels: replicated per batch), boxes per image ``[n, 4]`` ``[x0, y0, x1, y1]`` fractions,
    labels per image."""

    images: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.boxes)


def as_arrays(split: Split, resolution: int, channels: int) -> DetArrays:
    """A detection split resized for the model (``model_inputs``); grey images stay 1 channel (``batch_images``
    replicates them)."""
    grey = split.in_memory and split.images.shape[-1] == 1
    x, boxes = model_inputs(split, resolution, 1 if grey else channels)
    return DetArrays(x, boxes, [np.asarray(lab, np.int32) for lab in split.labels])


def batch_images(x: np.ndarray, channels: int) -> np.ndarray:
    return np.repeat(x, channels, axis=-1) if x.shape[-1] == 1 and channels != 1 else x


def batches_per_epoch(n: int, batch_size: int, steps: int | None = None) -> int:
    """The batches ``epoch_batches`` yields for ``n`` images: full batches only, at most ``steps``."""
    return min(n // batch_size, steps) if steps is not None else n // batch_size


def epoch_batches(arrays: DetArrays, spec: NetSpec, batch_size: int, seed: int, epoch: int,
                  steps: int | None = None, augment_images: bool = True, flip: bool = True, scale: float = 0.25,
                  translate: float = 0.125, ignore_iou: float = 0.5, shuffle: bool = True, positives: str = "best"
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of (images ``[B, R, R, C]``, targets ``[B, N, 5 + K]``) batches: order ``default_rng([seed,
    epoch])``, sample i augmented with ``default_rng([seed, epoch, i])``; the last partial batch is dropped and
    ``steps`` caps the batches. Deterministic for (seed, epoch)."""
    lay = _Layout(spec)
    order = np.random.default_rng([seed, epoch]).permutation(len(arrays)) if shuffle else np.arange(len(arrays))
    n_batches = batches_per_epoch(len(arrays), batch_size, steps)
    for s in range(n_batches):
        idx = order[s * batch_size:(s + 1) * batch_size]
        xs, bs, ls = [], [], []
        for i in idx:
            x, b, lab = arrays.images[i], arrays.boxes[i], arrays.labels[i]
            if augment_images:
                x, b, lab = augment(x, b, lab, np.random.default_rng([seed, epoch, int(i)]), flip, scale, translate)
            xs.append(x)
            bs.append(b)
            ls.append(lab)
        yield (batch_images(np.stack(xs), spec.in_channels).astype(np.float32),
               assign_targets(bs, ls, spec, ignore_iou, lay, positives))


# ============================================================================= decoding
@dataclass
class Detections:
    """One image's detections, highest score first, as DETECTION_POSTPROCESS gives them: boxes ``[m, 4]`` (ymin,
    xmin, ymax, xmax) fractions of the input, class ids ``[m]``, scores ``[m]``."""

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def flatten_outputs(outputs: Any, spec: NetSpec) -> np.ndarray:
    """Raw outputs as ``[B, N, 5 + K]`` in anchor order: the Keras model's per-scale outputs (a list, coarsest first,
    each ``[B, S, S, A * (5 + K)]``; or one array for one scale), or an array already ``[B, N, 5 + K]``."""
    scales = spec.detection_scales()
    fields = NUM_FIELDS + spec.head.num_classes
    n = sum(sc.grid * sc.grid * len(sc.anchors) for sc in scales)
    if not isinstance(outputs, (list, tuple)):
        a = np.asarray(outputs)
        if a.ndim == 3 and a.shape[1:] == (n, fields):
            return a.astype(np.float32)
        outputs = [a]
    if len(outputs) != len(scales):
        raise ValueError(f"{len(outputs)} outputs for a spec with {len(scales)} scales")
    flat = []
    for sc, out in zip(scales, outputs):
        a = np.asarray(out, np.float32)
        want = (sc.grid, sc.grid, sc.channels)
        if a.ndim != 4 or a.shape[1:] != want:
            raise ValueError(f"output of scale {sc.index}: shape {list(a.shape)}, expected [B, {want[0]}, "
                             f"{want[1]}, {want[2]}]")
        flat.append(a.reshape(a.shape[0], sc.grid * sc.grid * len(sc.anchors), fields))
    return np.concatenate(flat, axis=1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -np.asarray(x, np.float64)))


def fast_nms(boxes: np.ndarray, scores: np.ndarray, score_threshold: float, iou_threshold: float,
             max_detections: int) -> np.ndarray:
    """Indices kept by DETECTION_POSTPROCESS's single-class NMS: scores ``>= score_threshold``, stable sort by
    decreasing score, greedy, a box suppressed when its IoU with a kept one is ``> iou_threshold``; at most
    ``max_detections``, highest first."""
    cand = np.flatnonzero(scores >= score_threshold)
    order = cand[np.argsort(-scores[cand], kind="stable")]
    active = np.ones(len(order), bool)
    kept: list[int] = []
    for i in range(len(order)):
        if len(kept) >= max_detections:
            break
        if not active[i]:
            continue
        kept.append(int(order[i]))
        if i + 1 < len(order):
            iou = box_iou(boxes[order[i]][None], boxes[order[i + 1:]])[0]
            active[i + 1:] &= ~(iou > iou_threshold)
    return np.array(kept, np.int64)


def decode(outputs: Any, spec: NetSpec, score_threshold: float = 0.01, iou_threshold: float = 0.5,
           max_detections: int = 100) -> list[Detections]:
    """Detections per image of raw outputs (``flatten_outputs``' forms) of the yolo ``spec`` (module docstring)."""
    flat = flatten_outputs(outputs, spec).astype(np.float64)
    anchors = anchor_grid(spec)
    boxes = decode_boxes(flat[..., :4], anchors)  # [B, N, 4]
    scores = _sigmoid(flat[..., OBJ:OBJ + 1]) * _sigmoid(flat[..., NUM_FIELDS:])  # [B, N, K]
    best = scores.argmax(axis=-1)
    best_score = np.take_along_axis(scores, best[..., None], axis=-1)[..., 0]
    out = []
    for b in range(flat.shape[0]):
        keep = fast_nms(boxes[b], best_score[b], score_threshold, iou_threshold, max_detections)
        out.append(Detections(boxes[b, keep].astype(np.float32), best[b, keep].astype(np.int32),
                              best_score[b, keep].astype(np.float32)))
    return out


# ============================================================================= evaluation
def _image_sizes(split: Split) -> list[tuple[int, int]]:
    """(width, height) of each image of a detection split."""
    if split.in_memory:
        h, w = split.images.shape[1:3]
        return [(int(w), int(h))] * len(split)
    from PIL import Image

    sizes = []
    for p in split.paths:
        with Image.open(p) as im:
            sizes.append(im.size)
    return sizes


def predict_detections(model_or_predict_fn: Any, split: Split, spec: NetSpec, score_threshold: float = 0.01,
                       iou_threshold: float = 0.5, max_detections: int = 100, batch_size: int = 64
                       ) -> list[Detections]:
    """``decode`` of the model's outputs on every image of ``split`` (a detection split, resized batch by batch with
    ``model_inputs``). ``model_or_predict_fn``: a Keras model (``predict_on_batch``) or a function from a
    float32 batch ``[B, R, R, C]`` to raw outputs (any form ``flatten_outputs`` takes)."""
    predict = getattr(model_or_predict_fn, "predict_on_batch", model_or_predict_fn)
    dets: list[Detections] = []
    for start in range(0, len(split), batch_size):
        part = split.take(np.arange(start, min(start + batch_size, len(split))))
        x, _ = model_inputs(part, spec.resolution, spec.in_channels)
        dets.extend(decode(predict(x), spec, score_threshold, iou_threshold, max_detections))
    return dets


def _coco_sets(split: Split, detections: Sequence[Detections], num_classes: int) -> tuple[COCO | None, list, list]:
    """pycocotools' ground truth of ``split`` (None when it has no boxes), the images and the detections as COCO
    results (in the images' pixels)."""
    if len(detections) != len(split):
        raise ValueError(f"{len(detections)} detection lists for {len(split)} images")
    sizes = _image_sizes(split)
    images, annotations, results = [], [], []
    for i in range(len(split)):
        image_id = int(split.image_ids[i])
        w, h = sizes[i]
        images.append({"id": image_id, "width": w, "height": h})
        for box, label in zip(np.asarray(split.boxes[i]).reshape(-1, 4), np.asarray(split.labels[i]).reshape(-1)):
            x0, y0, x1, y1 = (float(v) for v in box)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(label) + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
        d = detections[i]
        for box, cls, score in zip(d.boxes, d.classes, d.scores):
            ymin, xmin, ymax, xmax = (float(v) for v in box)
            results.append({"image_id": image_id, "category_id": int(cls) + 1, "score": float(score),
                            "bbox": [xmin * w, ymin * h, (xmax - xmin) * w, (ymax - ymin) * h]})
    if not annotations:
        return None, images, results
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": annotations,
                      "categories": [{"id": k + 1, "name": str(k)} for k in range(num_classes)]}
        gt.createIndex()
    return gt, images, results


def coco_map(split: Split, detections: Sequence[Detections], num_classes: int) -> dict[str, Any]:
    """COCO box mAP of ``detections`` (one per image of ``split``, a detection split) against the split's boxes, with
    pycocotools' ``COCOeval`` in the images' pixels: {"map": mAP@[.5:.95], "map50": mAP@0.5, "images", "boxes",
    "detections"}; the mAPs are None when the split has no boxes, 0.0 when there are no detections."""
    gt, images, results = _coco_sets(split, detections, num_classes)
    summary: dict[str, Any] = {"map50": None, "map": None, "images": len(split),
                               "boxes": 0 if gt is None else len(gt.dataset["annotations"]),
                               "detections": len(results)}
    if gt is None:
        return summary
    if not results:
        return summary | {"map50": 0.0, "map": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.params.imgIds = [im["id"] for im in images]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    ap, ap50 = float(ev.stats[0]), float(ev.stats[1])
    return summary | {"map": max(ap, 0.0), "map50": max(ap50, 0.0)}


def bootstrap_map50(split: Split, detections: Sequence[Detections], num_classes: int, samples: int = 200,
                    seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """A bootstrap interval of ``coco_map``'s mAP@0.5 over the split's images: pycocotools matches every image once
    (``COCOeval.evaluate`` at IoU 0.5), then each of ``samples`` seeded resamples of the images (with replacement)
    is accumulated from those matches. {"map50": the full split's, "low", "high": the ``level`` percentile interval,
    "samples", "seed"}; None entries when the split has no boxes."""
    out: dict[str, Any] = {"map50": None, "low": None, "high": None, "samples": samples, "seed": seed,
                           "level": level}
    gt, images, results = _coco_sets(split, detections, num_classes)
    if gt is None:
        return out
    if not results:
        return out | {"map50": 0.0, "low": 0.0, "high": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.params.imgIds = [im["id"] for im in images]
        ev.params.iouThrs = np.array([0.5])
        ev.evaluate()
    matched = list(ev.evalImgs)  # ordered (category, area range, image)
    n, per_cat = len(images), len(ev.params.areaRng) * len(images)

    def map50(idx: np.ndarray) -> float:
        ev.evalImgs = [matched[c * per_cat + a * n + int(i)] for c in range(len(ev.params.catIds))
                       for a in range(len(ev.params.areaRng)) for i in idx]
        ev.params.imgIds = list(range(len(idx)))
        ev._paramsEval.imgIds = ev.params.imgIds
        with contextlib.redirect_stdout(io.StringIO()):
            ev.accumulate()
        p = ev.eval["precision"][0, :, :, 0, -1]  # IoU 0.5, every recall, every class, area "all", 100 detections
        p = p[p > -1]
        return float(p.mean()) if p.size else 0.0

    rng = np.random.default_rng(seed)
    boot = [map50(rng.integers(0, n, n)) for _ in range(samples)]
    tail = (1.0 - level) / 2 * 100
    return out | {"map50": map50(np.arange(n)), "low": float(np.percentile(boot, tail)),
                  "high": float(np.percentile(boot, 100 - tail))}


def evaluate(model_or_predict_fn: Any, split: Split, spec: NetSpec, score_threshold: float = 0.01,
             iou_threshold: float = 0.5, max_detections: int = 100, batch_size: int = 64) -> dict[str, Any]:
    """{"map50", "map", "images", "boxes", "detections"} of a model (or predict function, ``predict_detections``)
    on a detection split (``coco_map``)."""
    dets = predict_detections(model_or_predict_fn, split, spec, score_threshold, iou_threshold, max_detections,
                              batch_size)
    return coco_map(split, dets, spec.head.num_classes)


# ============================================================================= picture
def plot_detections(split: Split, detections: Sequence[Detections], class_names: Sequence[str], n: int = 8,
                    min_score: float = 0.3, title: str = "") -> bytes:
    """PNG of the first ``n`` images of ``split`` with their true boxes (green, class) and the detections scoring at
    least ``min_score`` (red, class and score)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = max(1, min(n, len(split)))
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for i in range(min(n, len(split))):
        ax = axes.ravel()[i]
        img = split.image(i)
        h, w = img.shape[:2]
        ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=255)
        for box, label in zip(np.asarray(split.boxes[i]).reshape(-1, 4), np.asarray(split.labels[i]).reshape(-1)):
            x0, y0, x1, y1 = box
            ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, color="#22cc22", lw=1.2))
            ax.text(x0, y1 + 0.5, class_names[int(label)], color="#22cc22", fontsize=6, va="top")
        d = detections[i]
        for box, cls, score in zip(d.boxes, d.classes, d.scores):
            if score < min_score:
                continue
            ymin, xmin, ymax, xmax = box
            ax.add_patch(Rectangle((xmin * w - 0.5, ymin * h - 0.5), (xmax - xmin) * w, (ymax - ymin) * h,
                                   fill=False, color="#ee2222", lw=1.0))
            ax.text(xmin * w, ymin * h - 1, f"{class_names[int(cls)]} {score:.2f}", color="#ee2222", fontsize=6)
        ax.set_title(f"image {int(split.image_ids[i])}", fontsize=8)
    fig.suptitle(title or f"green: true boxes; red: detections scoring >= {min_score:g}", fontsize=9)
    return figure_png(fig)
