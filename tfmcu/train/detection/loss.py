"""The detection loss and the training model of a yolo head (``tfmcu.train.detection``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from tfmcu.nets.anchors import decode_boxes
from tfmcu.nets.spec import NetSpec
from tfmcu.train.detection.targets import NUM_FIELDS, OBJ

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
