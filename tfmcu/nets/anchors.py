"""Anchor boxes for the yolo head (``HeadSpec.anchors``), from the boxes of a data set (NumPy only).

* ``wh_iou(a, b)``: IoU of boxes given by (w, h) only, as if they shared a centre (the anchor-matching IoU).
* ``kmeans_anchors(boxes_wh, k)``: YOLOv2's dimension clusters (Redmon & Farhadi, CVPR 2017, Sec. 2): k-means on
  (w, h) with the distance ``1 - IoU(box, centroid)``, so large boxes do not dominate as with Euclidean distance.
  Deterministic for a given ``seed``; anchors are returned sorted by area, smallest first.
* ``anchor_fit(boxes_wh, anchors)``: the mean best IoU of the boxes with the anchors (YOLOv2's "Avg IOU").
* ``split_anchors(anchors, scales)``: anchors per scale in the spec's order (coarsest scale first), the smallest
  anchors going to the finest scale.

Boxes and anchors are (w, h) fractions of the input size, as the spec stores anchors.

The detector's box contract (every part of the detection path reads it from here):

* ``anchor_grid(spec)``: the N anchor boxes of a yolo spec as [N, 4] float32 (y_centre, x_centre, h, w), fractions
  of the input, in output order: scales as ``spec.detection_scales()`` (coarsest first), then cells row by row
  (gy, gx), then the scale's anchors. That is the order of ``[1, S, S, A * (5 + K)]`` reshaped to
  ``[1, S * S * A, 5 + K]`` and the scales concatenated.
* ``decode_boxes(encodings, anchors)`` / ``encode_boxes(boxes, anchors)``: TFLite's ``DETECTION_POSTPROCESS``
  centre-size encoding with ``BOX_SCALES`` (y, x, h, w) = (10, 10, 5, 5): y = a_y + t_y / 10 * a_h,
  x = a_x + t_x / 10 * a_w, h = a_h * exp(t_h / 5), w = a_w * exp(t_w / 5); boxes are (ymin, xmin, ymax, xmax)
  fractions of the input, as the op outputs them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfmcu.errors import TfmcuError


class AnchorError(TfmcuError):
    """Boxes or arguments from which no anchors can be computed; one line."""


def _check_wh(values: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise AnchorError(f"{what}: expected an array of (w, h) pairs, shape [N, 2], got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise AnchorError(f"{what}: widths and heights must be finite and > 0")
    return a


def wh_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` [N, 2] with every box in ``b`` [K, 2], boxes given as (w, h) on a common centre."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    inter = np.minimum(a[:, None, 0], b[None, :, 0]) * np.minimum(a[:, None, 1], b[None, :, 1])
    union = (a[:, 0] * a[:, 1])[:, None] + (b[:, 0] * b[:, 1])[None, :] - inter
    return inter / union


def anchor_fit(boxes_wh: np.ndarray, anchors: np.ndarray) -> float:
    """Mean over the boxes of their best IoU with any anchor (1.0 = every box is an anchor)."""
    return float(wh_iou(_check_wh(boxes_wh, "boxes"), _check_wh(anchors, "anchors")).max(axis=1).mean())


def _init_plus_plus(boxes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding under the 1 - IoU distance."""
    centres = [boxes[rng.integers(len(boxes))]]
    for _ in range(1, k):
        d = 1.0 - wh_iou(boxes, np.array(centres)).max(axis=1)
        total = d.sum()
        p = d / total if total > 0 else np.full(len(boxes), 1.0 / len(boxes))
        centres.append(boxes[rng.choice(len(boxes), p=p)])
    return np.array(centres)


def _lloyd(boxes: np.ndarray, centres: np.ndarray, iterations: int) -> np.ndarray:
    assign = None
    for _ in range(iterations):
        iou = wh_iou(boxes, centres)
        new = iou.argmax(axis=1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        for j in range(len(centres)):
            members = boxes[assign == j]
            if len(members):
                centres[j] = members.mean(axis=0)
            else:  # an empty cluster takes the box that is worst served
                centres[j] = boxes[int(iou.max(axis=1).argmin())]
    return centres


def kmeans_anchors(boxes_wh: np.ndarray, k: int, seed: int = 0, restarts: int = 3,
                   iterations: int = 300) -> np.ndarray:
    """``k`` anchors [k, 2] (w, h) clustering ``boxes_wh`` [N, 2] with the 1 - IoU distance, sorted by area.

    ``restarts`` k-means++ seedings from ``np.random.default_rng(seed)``; the clustering with the best
    ``anchor_fit`` is kept. Same boxes and seed, same anchors.
    """
    boxes = _check_wh(boxes_wh, "boxes")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise AnchorError(f"k={k!r}: expected a positive integer")
    if len(np.unique(boxes, axis=0)) < k:
        raise AnchorError(f"k={k}: the boxes have only {len(np.unique(boxes, axis=0))} distinct sizes")
    rng = np.random.default_rng(seed)
    best, best_fit = None, -1.0
    for _ in range(max(1, restarts)):
        centres = _lloyd(boxes, _init_plus_plus(boxes, k, rng), iterations)
        fit = float(wh_iou(boxes, centres).max(axis=1).mean())
        if fit > best_fit:
            best, best_fit = centres, fit
    assert best is not None
    return best[np.argsort(best[:, 0] * best[:, 1], kind="stable")]


def split_anchors(anchors: np.ndarray, scales: int) -> list[list[list[float]]]:
    """Anchors per scale as ``HeadSpec.anchors`` wants them: coarsest scale first, each scale sorted by area.

    Sorted by area, the anchors are cut into ``scales`` groups as evenly as possible (a coarser scale takes any
    extra one); the smallest group goes to the finest scale (the last one), the largest to scale 0.
    """
    a = _check_wh(anchors, "anchors")
    if not isinstance(scales, int) or isinstance(scales, bool) or not 1 <= scales <= len(a):
        raise AnchorError(f"scales={scales!r}: expected an integer in 1..{len(a)} (the number of anchors)")
    a = a[np.argsort(a[:, 0] * a[:, 1], kind="stable")]
    groups = np.array_split(a[::-1], scales)  # largest first: array_split gives the first groups the extra ones
    return [[[float(w), float(h)] for w, h in g[::-1]] for g in groups]


# ----------------------------------------------------------------------------- the box contract
BOX_SCALES = (10.0, 10.0, 5.0, 5.0)  # DETECTION_POSTPROCESS's y_scale, x_scale, h_scale, w_scale


def anchor_grid(spec: "Any") -> np.ndarray:
    """[N, 4] float32 (y_centre, x_centre, h, w) of every anchor of a yolo ``spec`` (a ``NetSpec``), output order."""
    rows = []
    for sc in spec.detection_scales():
        g = np.arange(sc.grid, dtype=np.float64)
        cy, cx = np.meshgrid((g + 0.5) / sc.grid, (g + 0.5) / sc.grid, indexing="ij")
        for y, x in zip(cy.ravel(), cx.ravel()):
            for w, h in sc.anchors:
                rows.append((y, x, h, w))
    return np.asarray(rows, dtype=np.float32).reshape(-1, 4)


def decode_boxes(encodings: Any, anchors: Any, xp: Any = np) -> Any:
    """(ymin, xmin, ymax, xmax) of ``encodings`` [..., N, 4] (t_y, t_x, t_h, t_w) on ``anchors`` [N, 4]; ``xp``: the
    array module (NumPy, in float64; or TensorFlow, ``tf``, on its tensors: the detection loss decodes in the
    graph)."""
    if xp is np:
        t, a = np.asarray(encodings, dtype=np.float64), np.asarray(anchors, dtype=np.float64)
    else:
        t, a = encodings, anchors
    sy, sx, sh, sw = BOX_SCALES
    yc = a[:, 0] + t[..., 0] / sy * a[:, 2]
    xc = a[:, 1] + t[..., 1] / sx * a[:, 3]
    h = a[:, 2] * xp.exp(t[..., 2] / sh)
    w = a[:, 3] * xp.exp(t[..., 3] / sw)
    return xp.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)


def encode_boxes(boxes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """The encodings (t_y, t_x, t_h, t_w) [..., N, 4] that ``decode_boxes`` turns back into ``boxes`` [..., N, 4]
    (ymin, xmin, ymax, xmax; positive sizes) on ``anchors`` [N, 4]."""
    b = np.asarray(boxes, dtype=np.float64)
    a = np.asarray(anchors, dtype=np.float64)
    sy, sx, sh, sw = BOX_SCALES
    h, w = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    yc, xc = b[..., 0] + h / 2, b[..., 1] + w / 2
    return np.stack([(yc - a[:, 0]) / a[:, 2] * sy, (xc - a[:, 1]) / a[:, 3] * sx,
                     np.log(h / a[:, 2]) * sh, np.log(w / a[:, 3]) * sw], axis=-1)
