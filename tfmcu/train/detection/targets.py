"""Anchors from data and the training targets of a yolo head (``tfmcu.train.detection``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tfmcu.nets.anchors import anchor_fit, anchor_grid, encode_boxes, kmeans_anchors, split_anchors, wh_iou
from tfmcu.nets.spec import HeadSpec, NetSpec, YOLO_FIELDS

NUM_FIELDS = len(YOLO_FIELDS)  # ty, tx, th, tw, obj (then the class logits)
OBJ = YOLO_FIELDS.index("obj")


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


class TargetLayout:
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
                   ignore_iou: float = 0.5, layout: TargetLayout | None = None, positives: str = "best") -> np.ndarray:
    """Training targets float32 ``[B, N, 5 + K]`` for B images (module docstring): ``boxes[i]`` ``[n, 4]``
    ``[x0, y0, x1, y1]`` fractions, ``labels[i]`` ``[n]`` class ids. Boxes without area are skipped.
    ``positives="multi"``: a box goes to every anchor shape whose width and height are within ``ANCHOR_RATIO`` of its
    own (the best one if none is), each at the box's cell and the two neighbouring cells nearest its centre; a slot
    an earlier box took stays that box's."""
    if positives not in POSITIVES:
        raise ValueError(f"positives {positives!r}: expected one of {', '.join(POSITIVES)}")
    lay = layout or TargetLayout(spec)
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
