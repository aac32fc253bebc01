"""Detection training, the detection task: target assignment, the loss, box-keeping augmentation, decode + fast NMS,
COCO mAP, k-means anchors in the trained spec, the typed report, a tiny run through pipelines.train with --resume, and
user mistakes."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfmcu import train  # noqa: E402
from tfmcu.data.split import Split  # noqa: E402
from tfmcu.nets.anchors import anchor_grid, decode_boxes  # noqa: E402
from tfmcu.nets.presets import DET_ANCHORS  # noqa: E402
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec  # noqa: E402
from tfmcu.train import detection as det  # noqa: E402
from tfmcu.train import trainer  # noqa: E402
from tfmcu.train.config import DetectionOptions, Recipe  # noqa: E402
from tfmcu.train.report import TrainReport  # noqa: E402
from tests.support import MIRRORED_PREAMBLE, ROOT, fake_idx_set, free_ports, interrupted, run_python, \
    without_seconds  # noqa: E402
TWO = [[[0.4, 0.4], [0.6, 0.3]], [[0.1, 0.1], [0.2, 0.2]]]  # coarse scale (4x4 at 64 px) first, then 8x8
ONE = [[[0.25, 0.25]]]  # one anchor per cell, 4x4


def small_det(anchors=TWO, num_classes: int = 3, res: int = 64) -> NetSpec:
    """Output stride 16 (4x4 at 64 px) and a second scale at stride 8 (8x8)."""
    stages = [StageSpec([BlockSpec(8, expand=1)]), StageSpec([BlockSpec(16, expand=2, stride=2)]),
              StageSpec([BlockSpec(16, expand=2, stride=2)]), StageSpec([BlockSpec(24, expand=2, stride=2)])]
    return NetSpec("small-det", res, stem=StemSpec(8, 3, 2), stages=stages,
                   head=HeadSpec.yolo(num_classes, anchors, head_channels=8)).validate()


def perfect_logits(y: np.ndarray, big: float = 20.0) -> np.ndarray:
    """Raw outputs that the targets ``y`` describe exactly: encodings, obj and classes at +-big."""
    out = np.full(y.shape, -big, np.float32)
    out[..., :4] = y[..., :4]
    out[..., 4] = np.where(y[..., 4] == 1, big, -big)
    out[..., 5:] = np.where(y[..., 5:] == 1, big, -big)
    return out


def iou_xyxy(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


# ============================================================================= targets
def test_each_box_goes_to_its_best_anchor_at_its_cell_and_decodes_back():
    spec = small_det()
    grid = anchor_grid(spec)
    # (x0, y0, x1, y1): a is exactly the fine scale's 0.2 anchor, centred at (x 0.33, y 0.7); b (0.5 x 0.36, at
    # the centre of coarse cell (1, 2)) fits the coarse 0.4 x 0.4 anchor best (IoU 0.735), 0.6 x 0.3 next (0.714)
    a = [0.33 - 0.1, 0.7 - 0.1, 0.33 + 0.1, 0.7 + 0.1]
    b = [0.625 - 0.25, 0.375 - 0.18, 0.625 + 0.25, 0.375 + 0.18]
    y = det.assign_targets([np.array([a, b]), np.zeros((0, 4))], [np.array([2, 0]), np.zeros(0)], spec)
    assert y.shape == (2, 4 * 4 * 2 + 8 * 8 * 2, 5 + 3)
    idx_a = 4 * 4 * 2 + (5 * 8 + 2) * 2 + 1  # fine scale after the coarse one's 32; cell (5, 2); its anchor 1
    idx_b = (1 * 4 + 2) * 2 + 0  # coarse scale, cell (1, 2), anchor 0
    assert sorted(np.flatnonzero(y[0, :, 4] == 1)) == sorted([idx_a, idx_b])
    assert y[0, idx_a, 5:].tolist() == [0, 0, 1] and y[0, idx_b, 5:].tolist() == [1, 0, 0]
    # the encodings decode back to the boxes (ymin, xmin, ymax, xmax); box a's anchor sits at cell (5, 2)'s centre
    # (y 0.6875, x 0.3125): centre offsets, no size change
    back = decode_boxes(y[0, [idx_a, idx_b], :4], grid[[idx_a, idx_b]])
    np.testing.assert_allclose(back, np.array([a, b])[:, [1, 0, 3, 2]], atol=1e-6)
    assert np.all(y[0, idx_a, :2] != 0) and np.allclose(y[0, idx_a, 2:4], 0, atol=1e-5)
    # ignored: every other anchor whose box overlaps a true box with IoU > 0.5; the rest are background
    corners = [[g[1] - g[3] / 2, g[0] - g[2] / 2, g[1] + g[3] / 2, g[0] + g[2] / 2] for g in grid]  # x first
    overlapping = {i for i, c in enumerate(corners) if max(iou_xyxy(c, a), iou_xyxy(c, b)) > 0.5}
    assert idx_b + 1 in overlapping  # the 0.6 x 0.3 anchor at b's cell
    assert set(np.flatnonzero(y[0, :, 4] == -1)) == overlapping - {idx_a, idx_b}
    assert np.all(y[1] == 0)  # an image without boxes: all background


def test_a_taken_slot_sends_the_box_to_its_next_best_anchor():
    spec = small_det()
    box = np.array([[0.2, 0.6, 0.4, 0.8]] * 2)  # the same 0.2-anchor box twice
    y = det.assign_targets([box], [np.array([0, 1])], spec)
    pos = np.flatnonzero(y[0, :, 4] == 1)
    assert len(pos) == 2
    back = decode_boxes(y[0, pos, :4], anchor_grid(spec)[pos])
    np.testing.assert_allclose(back, box[:, [1, 0, 3, 2]], atol=1e-6)
    # degenerate boxes are skipped
    assert not det.assign_targets([np.array([[0.3, 0.3, 0.3, 0.5]])], [np.array([0])], spec)[..., 4].any()


def two_images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The anchor grid of ``small_det()``, the targets of two images with three boxes of three classes, which of
    them are assigned, and the outputs that match them (``perfect_logits``)."""
    spec = small_det()
    boxes = [np.array([[0.2, 0.6, 0.4, 0.8], [0.375, 0.195, 0.875, 0.555]]), np.array([[0.6, 0.6, 0.7, 0.7]])]
    y = det.assign_targets(boxes, [np.array([2, 0]), np.array([1])], spec)
    return anchor_grid(spec), y, y[..., 4] == 1, perfect_logits(y)


def test_giou_box_loss_is_one_minus_giou_of_the_decoded_boxes():
    """``box_loss="giou"``: 0 for perfect outputs; for boxes off by some units, the mean over the assigned anchors of
    1 - GIoU of the boxes both encodings decode to (computed here with NumPy)."""
    import tensorflow as tf

    grid, y, pos, good = two_images()
    loss = det.detection_loss(anchors=grid)
    f = lambda out: float(np.mean(loss(tf.constant(y), tf.constant(out)).numpy()))  # noqa: E731
    assert f(good) < 1e-5
    out = good.copy()
    out[pos, 0] += 2.0  # 0.2 anchor heights down
    out[pos, 3] -= 1.0  # narrower
    want = []
    for p, t, a in zip(out[pos, :4], y[pos, :4], grid[np.argwhere(pos)[:, 1]]):
        bp, bt = decode_boxes(p[None], a[None])[0], decode_boxes(t[None], a[None])[0]
        iou = det.box_iou(bp[None], bt[None])[0, 0]
        inter_union = (bp[2] - bp[0]) * (bp[3] - bp[1]) + (bt[2] - bt[0]) * (bt[3] - bt[1])
        union = inter_union - iou * inter_union / (1 + iou)
        hull = (max(bp[2], bt[2]) - min(bp[0], bt[0])) * (max(bp[3], bt[3]) - min(bp[1], bt[1]))
        want.append(1 - (iou - (hull - union) / hull))
    assert f(out) == pytest.approx(np.mean(want), rel=1e-4) and 0 < f(out) < f(good) + 1
    with pytest.raises(train.TrainError, match="box_loss"):
        DetectionOptions(box_loss="l2").validate()


def test_ciou_box_loss_and_the_l1_term():
    """``box_loss="ciou"``: the mean over the assigned anchors of 1 - CIoU (IoU - centre distance^2 / hull
    diagonal^2 - alpha v, computed here with NumPy); ``box_l1=w`` adds w x smooth-L1 of the encodings. A predicted
    box far larger than its true box, off-centre but containing it, gets no gradient on its centre from GIoU (both
    terms are flat there: the way an untrained head's boxes grow and stay), some from CIoU and from the L1 term."""
    import tensorflow as tf

    grid, y, pos, good = two_images()
    out = good.copy()
    out[pos, 0] += 2.0
    out[pos, 3] -= 1.0

    def f(o, **kw):
        return float(np.mean(det.detection_loss(anchors=grid, **kw)(tf.constant(y), tf.constant(o)).numpy()))
    want = []
    for p, t, a in zip(out[pos, :4], y[pos, :4], grid[np.argwhere(pos)[:, 1]]):
        bp, bt = decode_boxes(p[None], a[None])[0], decode_boxes(t[None], a[None])[0]
        iou = det.box_iou(bp[None], bt[None])[0, 0]
        rho2 = np.sum(((bp[:2] + bp[2:]) / 2 - (bt[:2] + bt[2:]) / 2) ** 2)
        c2 = np.sum((np.maximum(bp[2:], bt[2:]) - np.minimum(bp[:2], bt[:2])) ** 2)
        aspect = lambda b: np.arctan((b[3] - b[1]) / (b[2] - b[0]))  # noqa: E731
        v = 4 / np.pi ** 2 * (aspect(bt) - aspect(bp)) ** 2
        want.append(1 - (iou - rho2 / c2 - v / (1 - iou + v) * v))
    assert f(good, iou_kind="ciou") < 1e-5
    assert f(out, iou_kind="ciou") == pytest.approx(np.mean(want), rel=1e-4)
    d = np.abs(out[pos, :4] - y[pos, :4])
    l1 = np.sum(np.where(d < 1, 0.5 * d ** 2, d - 0.5)) / pos.sum()
    assert f(out, box_l1=0.25) - f(out) == pytest.approx(0.25 * l1, rel=1e-4)
    big = good.copy()
    big[pos, 0] += 1.0  # a tenth of an anchor off-centre
    big[pos, 2:4] += 15.0  # e^3 times the true size
    centre = {}
    for name, kw in {"giou": {}, "ciou": {"iou_kind": "ciou"}, "giou + l1": {"box_l1": 0.05}}.items():
        t = tf.Variable(big)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(det.detection_loss(anchors=grid, **kw)(tf.constant(y), t))
        centre[name] = float(np.abs(tape.gradient(loss, t).numpy()[pos, :2]).max())
    assert centre["giou"] < 1e-6 < centre["ciou"] and centre["giou + l1"] > 1e-3, centre
    with pytest.raises(ValueError, match="box_l1 need anchors"):
        det.detection_loss(box_l1=0.1)
    with pytest.raises(train.TrainError, match="box_l1 must be >= 0"):
        DetectionOptions(box_l1=-0.1).validate()
    DetectionOptions(box_loss="ciou", box_l1=0.1).validate()


def test_iou_objectness_target_mixes_in_the_predicted_boxes_iou():
    """``obj_iou=g`` (YOLOv5's gr): an assigned anchor's objectness BCE has label 1 - g + g * IoU of its decoded box
    with the true box, so with logits l the loss exceeds the binary target's (g = 0) by the sum of
    g * (1 - IoU) * l over the assigned anchors (BCE(t, l) = softplus(l) - t * l), divided by their count; equal for
    perfect boxes."""
    import tensorflow as tf

    grid, y, pos, good = two_images()
    out = good.copy()
    out[pos, 0] += 1.5
    out[pos, 2] -= 0.5
    out[pos, 4] = np.linspace(-2.0, 3.0, int(pos.sum()))
    ious = np.array([det.box_iou(decode_boxes(p[None], a[None]), decode_boxes(t[None], a[None]))[0, 0]
                     for p, t, a in zip(out[pos, :4], y[pos, :4], grid[np.argwhere(pos)[:, 1]])])
    assert 0.1 < ious.min() and ious.max() < 0.95

    def f(o, g):
        return float(np.mean(det.detection_loss(anchors=grid, obj_iou=g)(tf.constant(y), tf.constant(o))))
    for g in (1.0, 0.5):
        want = np.sum(g * (1 - ious) * out[pos, 4]) / pos.sum()
        assert f(out, g) - f(out, 0.0) == pytest.approx(want, rel=1e-4, abs=1e-6)
        assert f(good, g) == pytest.approx(f(good, 0.0), abs=1e-6)
    with pytest.raises(ValueError, match="obj_iou and box_l1 need anchors"):
        det.detection_loss(obj_iou=0.5)  # (no anchors to decode the boxes on)
    with pytest.raises(train.TrainError, match="obj_iou > 0 needs box_loss giou or ciou"):
        DetectionOptions(box_loss="smooth_l1").validate()
    with pytest.raises(train.TrainError, match=r"obj_iou must be in \[0, 1\]"):
        DetectionOptions(obj_iou=1.5).validate()
    DetectionOptions(box_loss="smooth_l1", obj_iou=0.0).validate()


def test_multi_positives_take_every_near_anchor_at_three_cells_and_decode_back():
    """``positives="multi"`` (YOLOv5's): box a (the fine scale's 0.2 anchor, centre x 0.33 y 0.7, in fine cell (5, 2)
    at fractions x 0.64, y 0.6 of it) goes to every anchor shape within 4x of its size, each at cell (5, 2), the cell
    below (6, 2) and the cell right (5, 3) on the fine scale (coarse: its own cell's neighbours); every positive's
    encoding decodes back to the box."""
    spec = small_det()
    grid = anchor_grid(spec)
    a = [0.33 - 0.1, 0.7 - 0.1, 0.33 + 0.1, 0.7 + 0.1]
    y = det.assign_targets([np.array([a])], [np.array([1])], spec, positives="multi")
    pos = np.flatnonzero(y[0, :, 4] == 1)
    one = det.assign_targets([np.array([a])], [np.array([1])], spec)
    assert set(np.flatnonzero(one[0, :, 4] == 1)) < set(pos) and len(pos) >= 3
    fine = 4 * 4 * 2
    for cell in ((5, 2), (6, 2), (5, 3)):
        assert fine + (cell[0] * 8 + cell[1]) * 2 + 1 in pos, cell
    assert fine + (4 * 8 + 2) * 2 + 1 not in pos and fine + (5 * 8 + 1) * 2 + 1 not in pos  # the far neighbours
    back = decode_boxes(y[0, pos, :4], grid[pos])
    np.testing.assert_allclose(back, np.repeat(np.array([a])[:, [1, 0, 3, 2]], len(pos), 0), atol=1e-6)
    assert (y[0, pos, 5:] == [0, 1, 0]).all() and not (y[0, :, 4] == -1)[pos].any()
    with pytest.raises(ValueError, match="positives"):
        det.assign_targets([np.array([a])], [np.array([1])], spec, positives="all")


# ============================================================================= loss
def test_loss_is_zero_for_perfect_outputs_and_grows_with_each_mistake():
    import tensorflow as tf

    spec = small_det()
    boxes = [np.array([[0.2, 0.6, 0.4, 0.8], [0.375, 0.195, 0.875, 0.555]]), np.array([[0.6, 0.6, 0.7, 0.7]])]
    y = det.assign_targets(boxes, [np.array([2, 0]), np.array([1])], spec)
    loss = det.detection_loss()
    f = lambda out: float(np.mean(loss(tf.constant(y), tf.constant(out)).numpy()))  # noqa: E731
    good = perfect_logits(y)
    assert f(good) < 1e-5
    pos = y[..., 4] == 1
    background = np.argwhere(y[..., 4] == 0)[0]
    ignored = np.argwhere(y[..., 4] == -1)
    assert len(ignored)
    mistakes = {}
    out = good.copy()
    out[pos, 0] += 2.0
    mistakes["box off by 2 units"] = out
    out = good.copy()
    out[pos, 5:] = -out[pos, 5:]
    mistakes["wrong classes"] = out
    out = good.copy()
    out[pos, 4] = -20.0
    mistakes["missed objects"] = out
    out = good.copy()
    out[tuple(background)][4] = 20.0
    mistakes["a false positive"] = out
    for what, o in mistakes.items():
        assert f(o) > 1.0, what
    out = good.copy()
    out[tuple(ignored[0])][4] = 20.0  # an ignored anchor that fires costs nothing
    assert f(out) < 1e-5
    parts = [float(m(tf.constant(y), tf.constant(mistakes["box off by 2 units"])).numpy())
             for m in det.loss_metrics()]
    assert parts[0] == pytest.approx(1.5, rel=1e-4) and parts[1] < 1e-6 and parts[2] < 1e-6  # smooth-L1(2) = 1.5


# ============================================================================= augmentation
class FixedRng:
    """Stands in for the generator ``augment`` draws from: zoom offset, (ty, tx), then the flip coin."""

    def __init__(self, zoom: float, ty: float, tx: float, mirror: bool):
        self.values = [zoom - 1.0, np.array([ty, tx])]
        self.coin = 0.0 if mirror else 0.9

    def uniform(self, lo, hi, size=None):
        return self.values.pop(0)

    def random(self):
        return self.coin


def white_square(x0: int, y0: int, x1: int, y1: int, side: int = 64) -> np.ndarray:
    img = np.full((side, side, 1), -1.0, np.float32)
    img[y0:y1, x0:x1] = 1.0
    return img


def ink_box(img: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(img[..., 0] > 0)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)


@pytest.mark.parametrize("seed", range(12))
def test_augmentation_keeps_boxes_on_the_object(seed):
    img = white_square(4, 10, 20, 34)  # off-centre, so a mirrored square lands far from an unmirrored one
    box = np.array([[4, 10, 20, 34]]) / 64
    out, b, lab = det.augment(img, box, np.array([7]), np.random.default_rng([5, 0, seed]))
    assert out.shape == img.shape and out.dtype == np.float32 and lab.tolist() == [7]
    np.testing.assert_allclose(b[0] * 64, ink_box(out), atol=1.0)  # clipped at the border where it was pushed out
    again = det.augment(img, box, np.array([7]), np.random.default_rng([5, 0, seed]))
    assert np.array_equal(again[0], out) and np.array_equal(again[1], b)


def test_flip_zoom_shift_and_dropping_exactly():
    img = white_square(8, 16, 24, 40)
    box = np.array([[8, 16, 24, 40]]) / 64
    out, b, _ = det.augment(img, box, np.array([1]), FixedRng(1.0, 0.0, 0.0, True))  # mirror only: exact
    np.testing.assert_allclose(b[0] * 64, [40, 16, 56, 40], atol=1e-9)
    assert np.array_equal(out, img[:, ::-1])
    out, b, _ = det.augment(img, box, np.array([1]), FixedRng(1.25, 0.125, -0.125, False))
    expect = ((np.array([8, 16, 24, 40]) / 64 - 0.5) * 1.25 + 0.5 + np.array([-0.125, 0.125] * 2)) * 64
    assert expect[0] < 0  # x0 leaves the image: clipped
    expect = np.clip(expect, 0, 64)
    np.testing.assert_allclose(b[0] * 64, expect, atol=1e-9)
    np.testing.assert_allclose(ink_box(out), expect, atol=1.0)
    # pushed almost out of the image: dropped with its label
    out, b, lab = det.augment(img, box, np.array([1]), FixedRng(1.0, 0.0, -0.35, False))
    assert b.shape == (0, 4) and lab.shape == (0,)


def test_epoch_batches_are_deterministic_per_seed_and_epoch():
    spec = small_det()
    rng = np.random.default_rng(0)
    arrays = det.DetArrays(rng.uniform(-1, 1, (10, 64, 64, 1)).astype(np.float32),
                           [np.array([[0.1, 0.1, 0.5, 0.6]])] * 10, [np.array([1])] * 10)
    a = list(det.epoch_batches(arrays, spec, 4, seed=3, epoch=1))
    b = list(det.epoch_batches(arrays, spec, 4, seed=3, epoch=1))
    c = list(det.epoch_batches(arrays, spec, 4, seed=3, epoch=2))
    assert len(a) == 2 and a[0][0].shape == (4, 64, 64, 3) and a[0][1].shape == (4, 160, 8)  # grey -> 3 channels
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not np.array_equal(a[0][0], c[0][0])
    assert all(int((t[..., 4] == 1).sum()) == 4 for _, t in a)  # every image keeps its box


# ============================================================================= decode + NMS
def hand_made_outputs(spec: NetSpec) -> np.ndarray:
    """[1, 4, 4, 8]: one anchor (0.25) per cell, 3 classes; everything off except four cells."""
    out = np.full((1, 4, 4, 8), -10.0, np.float32)
    out[0, 0, 0, :] = [0, 0, 0, 0, 3, 5, -5, -5]  # the anchor box (0, 0, .25, .25), class 0, score .9478
    out[0, 0, 1, :] = [0, -8, 0, 0, 2, -5, 4, -5]  # x shifted 0.2 left: IoU 2/3 with the first, class 1, lower score
    out[0, 3, 3, :] = [0, 0, 5 * np.log(2), 0, 1, -5, -5, 2]  # twice as tall, beyond the image (not clipped)
    out[0, 2, 0, :] = [0, 0, 0, 0, -3, 5, -5, -5]  # score 0.047: below the threshold
    return out


def test_decode_runs_fast_nms_over_the_best_class():
    spec = small_det(ONE)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    out = hand_made_outputs(spec)
    d = det.decode(out, spec, score_threshold=0.1, iou_threshold=0.5)
    assert len(d) == 1 and d[0].classes.tolist() == [0, 2]  # the class-1 box is suppressed by the class-0 one
    np.testing.assert_allclose(d[0].scores, [sig(3) * sig(5), sig(1) * sig(2)], rtol=1e-6)
    np.testing.assert_allclose(d[0].boxes, [[0, 0, 0.25, 0.25], [0.625, 0.75, 1.125, 1.0]], atol=1e-6)
    d = det.decode(out, spec, score_threshold=0.1, iou_threshold=0.7)[0]  # IoU 2/3 is not > 0.7: kept
    assert d.classes.tolist() == [0, 1, 2]
    np.testing.assert_allclose(d.boxes[1], [0, 0.05, 0.25, 0.30], atol=1e-6)
    assert det.decode(out, spec, score_threshold=0.1, max_detections=1)[0].classes.tolist() == [0]
    assert len(det.decode(out, spec, score_threshold=0.01)[0]) == 3  # the 0.047 one joins (the rest stay ~0)
    flat = out.reshape(1, 16, 8)
    assert det.decode(flat, spec, 0.1)[0].classes.tolist() == [0, 2]  # [B, N, 5 + K] reads the same


def test_flatten_outputs_follows_the_anchor_order():
    spec = small_det()
    scales = spec.detection_scales()
    outs = [np.zeros((2, sc.grid, sc.grid, sc.channels), np.float32) for sc in scales]
    outs[1][1, 5, 2, 1 * 8 + 4] = 7.0  # image 1, fine scale, cell (5, 2), anchor 1, obj
    flat = det.flatten_outputs(outs, spec)
    assert flat.shape == (2, 160, 8)
    assert np.argwhere(flat == 7.0).tolist() == [[1, 32 + (5 * 8 + 2) * 2 + 1, 4]]
    with pytest.raises(ValueError, match="shape"):
        det.flatten_outputs([outs[1], outs[0]], spec)


# ============================================================================= evaluation
def box_split(n: int = 6, side: int = 64, seed: int = 0) -> Split:
    """Blank images with 1-3 boxes each, all in the left half (x1 < 0.5)."""
    rng = np.random.default_rng(seed)
    boxes, labels = [], []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        wh = rng.uniform(0.08, 0.3, (k, 2))
        x0 = rng.uniform(0.02, 0.48 - wh[:, 0])
        y0 = rng.uniform(0.02, 0.98 - wh[:, 1])
        boxes.append((np.stack([x0, y0, x0 + wh[:, 0], y0 + wh[:, 1]], 1) * side).astype(np.float32))
        labels.append(rng.integers(0, 3, k).astype(np.int32))
    return Split(labels, np.zeros((n, side, side, 1), np.uint8), boxes=boxes, image_ids=np.arange(1, n + 1,
                                                                                                 dtype=np.int64))


def predictor(split: Split, spec: NetSpec, mirror: bool = False):
    """A predict function giving perfect outputs for the split's boxes, batch after batch (x mirrored: nonsense)."""
    state = {"at": 0}

    def predict(x):
        i = state["at"]
        state["at"] += len(x)
        boxes = [b / 64 for b in split.boxes[i:i + len(x)]]
        if mirror:
            boxes = [np.stack([1 - b[:, 2], b[:, 1], 1 - b[:, 0], b[:, 3]], 1) for b in boxes]
        return perfect_logits(det.assign_targets(boxes, split.labels[i:i + len(x)], spec))

    return predict


def test_evaluate_gives_one_for_the_truth_and_zero_for_nonsense():
    spec = small_det()
    split = box_split()
    m = det.evaluate(predictor(split, spec), split, spec, batch_size=4)
    assert m["map50"] == pytest.approx(1.0) and m["map"] == pytest.approx(1.0)
    assert m["images"] == 6 and m["boxes"] == m["detections"] == sum(len(b) for b in split.boxes)
    m = det.evaluate(predictor(split, spec, mirror=True), split, spec, batch_size=4)
    assert m["map50"] == 0.0 and m["map"] == 0.0
    none = det.coco_map(split, [det.Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0))] * 6, 3)
    assert none["map50"] == 0.0 and none["detections"] == 0


def test_bootstrap_interval_of_map50():
    """The bootstrap over test images: the full split's mAP@0.5 equals coco_map's, the interval holds it, the truth
    gives [1, 1], and half the images' boxes missed widen nothing below 0 nor above 1."""
    split = box_split(40)
    truth = [det.Detections(np.asarray(b, np.float32)[:, [1, 0, 3, 2]] / 64, np.asarray(l), np.ones(len(l)))
             for b, l in zip(split.boxes, split.labels)]
    b = det.bootstrap_map50(split, truth, 3, samples=50)
    assert (b["map50"], b["low"], b["high"]) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    empty = det.Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0))
    half = [d if i % 2 else empty for i, d in enumerate(truth)]
    b = det.bootstrap_map50(split, half, 3, samples=100, seed=1)
    assert b["map50"] == pytest.approx(det.coco_map(split, half, 3)["map50"])
    assert 0.0 < b["low"] < b["map50"] < b["high"] < 1.0 and b["samples"] == 100
    assert det.bootstrap_map50(split, half, 3, samples=100, seed=1) == b  # seeded


def test_fit_anchors_keeps_the_spec_shape():
    spec = small_det()
    split = box_split(40)
    new, info = det.fit_anchors(spec, [b / 64 for b in split.boxes])
    assert [len(s) for s in new.head.anchors] == [2, 2] and new.head.anchors == info["anchors"]
    areas = [w * h for s in new.head.anchors for w, h in s]
    assert min(areas[:2]) >= max(areas[2:])  # the larger anchors on the coarse scale
    assert info["fit"] >= info["spec_fit"] and info["boxes"] == sum(len(b) for b in split.boxes)


def test_plot_detections_is_a_png():
    spec = small_det()
    split = box_split(3)
    dets = det.predict_detections(predictor(split, spec), split, spec)
    png = det.plot_detections(split, dets, ["a", "b", "c"], n=3)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# ============================================================================= training runs
DATASET = "scenes-det:canvas=128,train=96,val=16,test=16,seed=1"


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory) -> str:
    return fake_idx_set(tmp_path_factory.mktemp("idx") / "fm", n_train=200, n_test=50)


def small_det_file(idx_dir: str) -> str:
    """``small_det`` for DATASET's 10 classes as a spec file beside the data folder: the runs here train it (what
    they check is the trainer's, not the architecture's; a MobileNetV2 detector's graph takes minutes to trace)."""
    path = os.path.join(os.path.dirname(idx_dir), "small-det.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(small_det(num_classes=10).to_json())
    return path


def tiny_config(idx_dir: str, **kw) -> train.TrainConfig:
    recipe = Recipe(epochs=2, qat_epochs=0, batch_size=16, lr=0.05, warmup_epochs=0.5, bn_recalibration_batches=2)
    base = dict(dataset=DATASET, data_dir=idx_dir, resolution=64, recipe=recipe, steps_per_epoch=3, seed=3,
                verbose=0, detection=DetectionOptions(int8=False),  # (the CLI run exports int8)
                model=small_det_file(idx_dir))
    base.update(kw)
    return train.default_config("detection", **base)


@pytest.fixture(scope="module")
def run_a(idx_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("det") / "a"
    return out, train.train(tiny_config(idx_dir), str(out), log=lambda m: None)


def test_library_run_writes_everything(run_a):
    out, r = run_a
    d = r.detection
    assert r.task == "detection" and r.classification is None and r.dataset.train == 96 and r.dataset.resolution == 64
    for key in ("spec", "labels", "weights", "report", "curves", "detections"):
        assert os.path.isfile(r.files[key]), key
    assert [e["epoch"] for e in r.history.float] == [1, 2]
    for e in r.history.float:
        assert {"loss", "box_loss", "obj_loss", "class_loss", "val_loss", "val_map50", "val_map"} <= set(e)
    for s in (d.map50, d.map):
        assert 0.0 <= s.float <= 1.0 and s.int8_tflite is None and s.int8_tflm is None
    assert d.int8 is None and "tflite" not in r.files and r.tflite_vs_tflm is None and r.agree
    assert d.evaluation.images == 16 and d.evaluation.boxes == r.dataset.boxes["test"]
    spec = NetSpec.load(r.files["spec"])  # the trained spec carries the k-means anchors
    assert spec.head.anchors == d.anchors["anchors"] == r.spec.head.anchors != DET_ANCHORS
    assert d.anchors["source"] == "kmeans" and d.anchors["fit"] > 0
    with open(r.files["report"]) as f:
        on_disk = json.load(f)
    assert on_disk["map50"]["float"] == d.map50.float and on_disk["detection"]["int8"] is False
    assert TrainReport.from_json(on_disk) == r  # the JSON holds the whole typed report
    assert r.to_json() == on_disk and TrainReport.from_json(r.to_json()) == r  # what the run wrote, read back
    # a report written before an option existed reads with the value runs trained with then
    earlier = {**on_disk, "detection": {k: v for k, v in on_disk["detection"].items() if k != "obj_iou"}}
    assert d.options.obj_iou == DetectionOptions().obj_iou > 0
    assert TrainReport.from_json(earlier).detection.options.obj_iou == 0.0
    assert "int8: not exported" in r.summary()
    for key in ("curves", "detections"):
        assert open(r.files[key], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    from tfmcu.nets.keras_builder import build_keras

    model = build_keras(spec, 0)
    model.load_weights(r.files["weights"])  # the spec's own Keras model reads the weights


def test_resume_after_interruption_matches_uninterrupted_run(run_a, idx_dir, tmp_path, monkeypatch):
    _, ra = run_a
    out = tmp_path / "b"
    interrupted(monkeypatch, lambda: train.train(tiny_config(idx_dir), str(out), log=lambda m: None))
    assert not (out / "train_report.json").exists()
    logs: list[str] = []
    rb = train.train(tiny_config(idx_dir, resume=True), str(out), log=logs.append)
    assert any("resumed after float epoch 1" in m for m in logs)
    assert without_seconds(ra.history) == without_seconds(rb.history)
    assert ra.detection.map50 == rb.detection.map50 and ra.detection.map == rb.detection.map


def test_a_classifier_backbone_loads_into_the_detector(tmp_path):
    """``load_backbone``: a MobileNetV2-0.35 classifier's weights (.h5) start the detector of the same family: every
    backbone layer takes the classifier's weights, the yolo head (and no classifier layer) is left as initialised."""
    from tfmcu.nets.keras_builder import build_keras
    from tfmcu.nets.presets import mbv2, mbv2_det
    from tfmcu.train.backbone import load_backbone

    classifier = build_keras(mbv2(0.35, 96, 10), 1)
    path = str(tmp_path / "classifier.h5")
    classifier.save_weights(path)
    detector = build_keras(mbv2_det(0.35, 64, 10), 2)
    before = {layer.name: layer.get_weights() for layer in detector.layers}
    r = load_backbone(detector, path)
    theirs = {layer.name: layer.get_weights() for layer in classifier.layers}
    assert "stem_conv" in r.loaded and r.not_loaded and all(n.startswith("scale") or "pred" in n or "conv" in n
                                                                for n in r.not_loaded)
    assert not set(r.loaded) & {"classifier", "head_conv"} and r.source == path
    for layer in detector.layers:
        now = layer.get_weights()
        if layer.name in r.loaded:
            assert all(np.array_equal(a, b) for a, b in zip(now, theirs[layer.name]))
        elif now:
            assert all(np.array_equal(a, b) for a, b in zip(now, before[layer.name]))
    assert set(r.loaded) | set(r.not_loaded) == {layer.name for layer in detector.layers if layer.get_weights()}
    classifier.save_weights(str(tmp_path / "newer.weights.h5"))  # Keras' newer layout: no layer names
    with pytest.raises(train.TrainError, match="newer layout"):
        load_backbone(detector, str(tmp_path / "newer.weights.h5"))
    import tf_keras

    with pytest.raises(train.TrainError, match="no layer of this model"):
        load_backbone(tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3, name="other")]), path)
    with pytest.raises(train.TrainError, match="a folder without model_float_weights.h5"):
        train.validate(train.default_config("detection", init_backbone=str(tmp_path / "..")))
    with pytest.raises(train.TrainError, match="not both"):
        train.validate(train.default_config("detection", init_backbone=path, init_weights=path))


def test_a_run_starts_from_another_runs_folder(run_a, idx_dir, tmp_path):
    """``init_backbone=RUN_DIR``: the run folder's float weights (every run writes them) start the next run; its
    report says which layers loaded."""
    out_a, ra = run_a
    assert os.path.isfile(os.path.join(out_a, "model_float_weights.h5")) and ra.backbone is None
    logs: list[str] = []
    r = train.train(tiny_config(idx_dir, init_backbone=str(out_a), recipe=Recipe(
        epochs=1, qat_epochs=0, batch_size=16, lr=0.05, bn_recalibration_batches=1)), str(tmp_path / "o"),
        log=logs.append)
    assert r.backbone.source == os.path.join(out_a, "model_float_weights.h5") and not r.backbone.not_loaded
    assert "stem_conv" in r.backbone.loaded and any("--init_backbone: " in m for m in logs)
    with open(r.files["report"]) as f:
        assert TrainReport.from_json(json.load(f)).backbone == r.backbone


def test_spec_that_does_not_fit_the_data(idx_dir, tmp_path):
    p = tmp_path / "three.json"
    p.write_text(small_det().to_json())
    with pytest.raises(train.TrainError, match="the spec has 3 classes, .* has 10; set head.num_classes to 10"):
        train.train(tiny_config(idx_dir, model=str(p)), str(tmp_path / "o"), log=lambda m: None)
    assert not (tmp_path / "o").exists()


def test_each_task_takes_its_own_data_and_model(idx_dir, tmp_path):
    with pytest.raises(train.TrainError, match="a detector \\(yolo head\\); train it with --task=detection"):
        train.train(dataclasses.replace(tiny_config(idx_dir), task="classify", dataset="fashion_mnist"),
                    str(tmp_path / "o"), log=lambda m: None)
    with pytest.raises(train.TrainError, match="a detection data set \\(boxes\\); train a detector on it"):
        train.train(dataclasses.replace(tiny_config(idx_dir), task="classify"), str(tmp_path / "o"),
                    log=lambda m: None)
    with pytest.raises(train.TrainError, match="a classification data set \\(no boxes\\)"):
        train.train(train.TrainConfig(task="detection"), str(tmp_path / "o"), log=lambda m: None)
    with pytest.raises(train.TrainError, match="unknown task 'segment'"):
        train.validate(train.TrainConfig(task="segment"))
    assert not (tmp_path / "o").exists()


def test_coco_folder_run(idx_dir, tmp_path):
    """Images on disk (paths, read with PIL) and splits from the COCO files."""
    from tfmcu.data import coco, load_detection

    folder = str(tmp_path / "coco")
    coco.write_coco_dataset(load_detection(DATASET, idx_dir), folder)
    r = train.train(tiny_config(idx_dir, dataset=folder, data_dir=None, recipe=Recipe(
        epochs=1, qat_epochs=0, batch_size=16, lr=0.05, bn_recalibration_batches=1)), str(tmp_path / "o"),
        log=lambda m: None)
    assert (r.dataset.train, r.dataset.validation, r.dataset.test) == (96, 16, 16)
    assert r.dataset.channels_stored == 1 and 0.0 <= r.detection.map50.float <= 1.0
    assert os.path.isfile(r.files["detections"])


def test_qat_run_exports_the_qat_weights(idx_dir, tmp_path, monkeypatch):
    """1 float + 1 QAT epoch on 64 images at 64 px, then the int8 export: the report has the QAT mAP, TF Lite and
    TFLM agree, and the .tflite's prediction conv holds the QAT model's weights (not the float model's)."""
    cfg = tiny_config(idx_dir, dataset="scenes-det:canvas=128,train=64,val=16,test=16,seed=1", steps_per_epoch=None,
                      calibration_samples=16, detection=DetectionOptions(), recipe=Recipe(
                          epochs=1, qat_epochs=1, batch_size=16, lr=0.05, qat_lr=0.05, bn_recalibration_batches=1))
    logs: list[str] = []
    phases = {}
    real_qat_phase = trainer.qat_phase

    def keep(run, floated):  # (the trainer's QAT phase, with its models kept to look at)
        phases["float"] = floated
        phases["qat"], notes = real_qat_phase(run, floated)
        return phases["qat"], notes

    monkeypatch.setattr(trainer, "qat_phase", keep)
    r = train.train(cfg, str(tmp_path / "q"), log=logs.append)
    d = r.detection
    assert [e["epoch"] for e in r.history.qat] == [1] and "val_map50" in r.history.qat[0]
    for s in (d.map50, d.map):
        assert all(0.0 <= v <= 1.0 for v in (s.float, s.qat, s.int8_tflite, s.int8_tflm)), s
        assert s.int8_tflite == s.int8_tflm
    assert d.int8.tflite_vs_tflm.agree and d.int8.quantization == "QAT (1 epochs)"
    with open(r.files["report"]) as f:  # with the int8 detector's section (its bootstrap interval, the agreement)
        on_disk = json.load(f)
    assert "map50_bootstrap" in on_disk["int8"]["tflm"] and on_disk["int8"]["tflite_vs_tflm"]["samples"] == 16
    assert r.to_json() == on_disk and TrainReport.from_json(on_disk) == r
    assert r.recipe.qat_lr == 0.05 and r.timing_s["qat_training"] > 0
    assert any("[eval] QAT test mAP@0.5" in m for m in logs) and "QAT mAP@0.5" in r.summary()
    model_bytes = open(r.files["tflite"], "rb").read()
    assert len(model_bytes) == d.int8.flash_bytes
    import tensorflow as tf

    interp = tf.lite.Interpreter(model_content=model_bytes)
    [w] = [t for t in interp.get_tensor_details() if "head_scale0_pred/Conv2D" in t["name"]
           and "BiasAdd" not in t["name"] and t["dtype"] == np.int8]  # the filter (not the activation)
    scales = w["quantization_parameters"]["scales"]
    got = interp.get_tensor(w["index"]).astype(np.float64) * scales[:, None, None, None]  # [out, 1, 1, in]
    as_tflite = lambda k: np.transpose(np.asarray(k), (3, 0, 1, 2))  # noqa: E731  (Keras [1, 1, in, out])
    [qat_kernel] = [as_tflite(v.numpy()) for v in phases["qat"].spec_model.get_layer("quant_head_scale0_pred").weights
                    if v.name.endswith("/kernel:0")]  # (the wrapped layer's .kernel is the fake-quantized tensor)
    float_kernel = as_tflite(phases["float"].spec_model.get_layer("head_scale0_pred").kernel)
    assert np.all(np.abs(got - qat_kernel) <= 0.51 * scales[:, None, None, None])  # the QAT weights, rounded
    assert np.abs(got - qat_kernel).mean() < 0.5 * np.abs(got - float_kernel).mean()


def cli(*args: str):
    return run_python("-m", "pipelines.train", *args)


def test_cli_tiny_run_and_resume(idx_dir, tmp_path):
    out = tmp_path / "cli"
    args = ["--task=detection", f"--dataset={DATASET}", f"--data_dir={idx_dir}", "--resolution=64", "--epochs=1",
            "--batch_size=16", "--bn_recalibration_batches=2", f"--out_dir={out}", "--noprogress",
            f"--model={small_det_file(idx_dir)}"]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "float on 16 test images" in proc.stdout
    assert "TF Lite vs TFLM: identical outputs on all 16 images" in proc.stdout
    assert "[train] float epoch 1: loss" in proc.stderr and "val mAP@0.5" in proc.stderr
    r = TrainReport.read(str(out / "train_report.json"))
    d = r.detection
    assert r.model == "small-det" and r.steps_per_epoch == 6  # (the spec's name)
    for s in (d.map50, d.map):
        assert all(0.0 <= v <= 1.0 for v in (s.float, s.int8_tflite, s.int8_tflm)), s
        assert s.int8_tflite == s.int8_tflm  # TF Lite and TFLM give the same detections
    assert json.loads((out / "train_report.json").read_text())["int8"]["tflite_vs_tflm"] == {
        "agree": True, "samples": 16, "mismatching_samples": 0, "tie_samples": 0, "first": [], "ties": [],
        "tflite_kernels": "reference"}
    from tfmcu.runtime.model_io import model_info

    info = model_info(open(r.files["tflite"], "rb").read())
    assert [t.dtype for t in info.inputs] == ["int8"] and len(info.outputs) == 4  # DETECTION_POSTPROCESS's four
    assert (out / "checkpoints" / "float-0001.index").is_file()
    proc = cli(*args, "--resume", "--noint8")  # (int8 changes no weights: the checkpoint still fits)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed after float epoch 1" in proc.stderr and "float epoch 1/1" not in proc.stderr
    assert TrainReport.read(str(out / "train_report.json")).detection.map50.float == d.map50.float


@pytest.mark.parametrize("args,message", [
    (["--task=detection", "--model=mcunet-demo"], "mcunet-demo: a classifier (head.type 'classify'); "
                                                  "--task=detection needs a yolo head"),
    (["--task=detection", "--dataset=fashion_mnist"], "a classification data set (no boxes)"),
    (["--model=mbv2-det-w035"], "mbv2-det-w035: a detector (yolo head); train it with --task=detection"),
    (["--dataset=scenes-det:canvas=64"], "a detection data set (boxes); train a detector on it with --task=detection"),
    (["--anchors=spec", "--int8"], "--anchors, --int8: only for --task=detection"),
    (["--max_detections=5"], "--max_detections: only for --task=detection"),
])
def test_cli_user_mistakes_are_one_line_exit_2(tmp_path, args, message):
    proc = cli(*args, f"--out_dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


MIRRORED_DETECTION = MIRRORED_PREAMBLE + """
from tfmcu.train.config import DetectionOptions
data_dir, dataset, out, model = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
recipe = train.Recipe(epochs=1, qat_epochs=0, batch_size=16, lr=0.05, bn_recalibration_batches=1)
cfg = train.default_config("detection", dataset=dataset, data_dir=data_dir, resolution=64, recipe=recipe,
                           steps_per_epoch=2, seed=3, verbose=0, strategy="mirrored", model=model,
                           detection=DetectionOptions(int8=False))
r = train.train(cfg, out, log=lambda m: None)
print(json.dumps({"strategy": r.strategy.name, "replicas": r.strategy.replicas,
                  "map50": r.detection.map50.float}))
"""


def test_mirrored_strategy_trains_the_detector(idx_dir, tmp_path):
    """--strategy=mirrored trains a detector as it trains a classifier (two logical CPU devices)."""
    script = tmp_path / "mirrored_detection.py"
    script.write_text(MIRRORED_DETECTION)
    proc = run_python(str(script), idx_dir, DATASET, str(tmp_path / "out"), small_det_file(idx_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["strategy"] == "mirrored" and result["replicas"] == 2 and 0.0 <= result["map50"] <= 1.0


def test_multi_worker_strategy_trains_the_detector(idx_dir, tmp_path):
    """--strategy=multi_worker trains a detector as it trains a classifier: two processes with TF_CONFIG (one
    machine standing in for two), the gradients all-reduced; only the chief exports, evaluates the int8 model and
    writes the run's outputs, from copies of the models every worker made (reading a batch norm's moving statistics
    is a collective: the chief alone could not)."""
    import subprocess
    import sys

    out = tmp_path / "mw"
    args = ["-m", "pipelines.train", "--task=detection", f"--dataset={DATASET}", f"--data_dir={idx_dir}",
            "--resolution=64", "--epochs=1", "--batch_size=16", "--steps_per_epoch=2", "--noprogress",
            f"--model={small_det_file(idx_dir)}", "--strategy=multi_worker", f"--out_dir={out}"]
    cluster = [f"localhost:{p}" for p in free_ports(2)]
    procs = []
    for index in range(2):
        config = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}})
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, TF_CONFIG=config)
        procs.append(subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=ROOT, env=env))
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-3000:]
        assert "strategy multi_worker (2 replicas)" in stderr and "[train] float epoch 1: loss" in stderr
    assert "not the chief worker" in results[1][1] and "[eval] int8 test mAP@0.5" in results[0][1]
    r = TrainReport.read(str(out / "train_report.json"))
    assert r.strategy.name == "multi_worker" and r.strategy.replicas == 2 and 0.0 <= r.detection.map50.float <= 1.0
    assert r.agree and os.path.isfile(r.files["tflite"]) and os.path.isfile(r.files["weights"])
