"""The host decoder with fast NMS, COCO mAP and a picture of the detections (``tfmcu.train.detection``)."""

from __future__ import annotations

from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Sequence
import contextlib
import io

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tfmcu.data.images import model_inputs
from tfmcu.data.split import Split
from tfmcu.files import figure_png
from tfmcu.nets.anchors import anchor_grid, decode_boxes
from tfmcu.nets.spec import NetSpec
from tfmcu.train.detection.targets import NUM_FIELDS, OBJ, box_iou

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
