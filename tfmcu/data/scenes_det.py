"""Detection scenes: several small objects with exact boxes on cluttered canvases, built offline from installed data.

A detection scene is a scene (``tfmcu.data.scenes``: the same canvas, clutter, object source, seeds, splits and
loader) with ``objects`` (lo-hi, 1-4 by default, 0 allowed) Fashion-MNIST or MNIST images of 10 classes pasted on it,
each ``object_px`` (8-40 px by default) on a side. Objects overlap at most ``max_iou`` (box IoU); a placement that
overlaps more, or a cut object with less than ``min_visible`` of its ink inside the canvas, is drawn again (``TRIES``
times; then the object is left out, so a scene may hold fewer objects than drawn). A ``border`` fraction of the
objects is placed across a canvas edge on purpose, so objects cut by the border occur.

Boxes are exact: the tight box ``[x0, y0, x1, y1]`` (float32, canvas pixels, ``x1`` / ``y1`` exclusive: pixel
``(x, y)`` covers ``[x, x + 1)``, as in COCO) of the object's *ink* -- its resized glyph's pixels of at least ``INK``
grey levels -- that lie inside the canvas, not the pasted square. Labels are the source's class ids 0..9. Objects
are pasted over the clutter and each other with ``max`` (the brighter pixel wins), so no ink is erased.

Names (``parse_name``), parsed strictly like the scenes'::

    scenes-det                                  Fashion-MNIST objects, 160 px canvas, the default sizes
    scenes-det:source=mnist,canvas=256,objects=0-6,object_px=12-48,border=0.3,train=500,val=100,test=100,seed=2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tfmcu.data.images import resize
from tfmcu.data.scenes import SceneConfig, cluttered_canvas, paste, parse_options, sample_rngs
from tfmcu.data.split import DataError, Split

INK = 32  # a resized glyph's pixels at least this bright (0..255) are the object's: its box is their tight box
TRIES = 8  # placements tried per object before it is left out


@dataclass(frozen=True, kw_only=True)
class DetSceneConfig(SceneConfig):
    """A detection scene: several objects with their boxes (the scene's other fields: ``SceneConfig``)."""

    NAME: ClassVar[str] = "scenes-det"
    TITLE: ClassVar[str] = "Detection scenes"
    MIN_CANVAS: ClassVar[int] = 32

    object_px: tuple[int, int] = (8, 40)
    train: int = 2000
    val: int = 300
    test: int = 300
    objects: tuple[int, int] = (1, 4)  # objects drawn per scene, uniform in [lo, hi] (lo may be 0)
    border: float = 0.15  # fraction of the objects placed across a canvas edge (cut by the border)
    min_visible: float = 0.3  # a cut object keeps at least this fraction of its ink inside the canvas
    max_iou: float = 0.5  # the largest box IoU between two objects of a scene

    def validate(self) -> "DetSceneConfig":
        super().validate()
        if not 0 <= self.objects[0] <= self.objects[1] <= 32:
            raise DataError(f"{self.NAME}: objects={self.objects[0]}-{self.objects[1]}: expected 0 <= lo <= hi <= 32")
        for key, value, low in (("border", self.border, 0.0), ("max_iou", self.max_iou, 0.0),
                                ("min_visible", self.min_visible, 0.01)):
            if not low <= value <= 1:
                raise DataError(f"{self.NAME}: {key}={value}: expected {low:g}..1")
        return self

    def describe(self) -> str:
        return (f"detection scenes of {self.objects[0]}-{self.objects[1]} {self.source} objects "
                f"({self.object_px[0]}-{self.object_px[1]} px, {self.border:g} across the border) on "
                f"{self.canvas}x{self.canvas} canvases, {self.distractors[0]}-{self.distractors[1]} distractors, "
                f"seed {self.seed}")

    def render_split(self, split: str, images: np.ndarray, labels: np.ndarray, n: int) -> Split:
        """``n`` scenes of one split: uint8 images ``(n, canvas, canvas, 1)``, per-image float32 boxes ``(k, 4)``,
        int32 labels ``(k,)`` and image ids 1..n; objects drawn from the split's pool (28x28 uint8 images and their
        labels)."""
        out = np.zeros((n, self.canvas, self.canvas, 1), np.uint8)
        boxes, box_labels = [], []
        for i, rng in enumerate(sample_rngs(self, split, n)):
            scene = render(self, images, labels, rng)
            out[i, :, :, 0] = scene.image
            boxes.append(scene.boxes)
            box_labels.append(scene.labels)
        return Split(box_labels, out, boxes=boxes, image_ids=np.arange(1, n + 1, dtype=np.int64))


def parse_name(name: str) -> DetSceneConfig | None:
    """The DetSceneConfig a data-set name asks for (None: not a ``scenes-det`` name); see the module docstring."""
    return parse_options(name, DetSceneConfig())


def is_name(name: str) -> bool:
    """Whether ``name`` asks for detection scenes (``scenes-det`` or ``scenes-det:...``), valid or not."""
    return name.partition(":")[0].lower() == DetSceneConfig.NAME


# ============================================================================= rendering
@dataclass
class DetScene:
    """One rendered scene."""

    image: np.ndarray  # uint8 (canvas, canvas)
    boxes: np.ndarray  # float32 (n, 4): x0, y0, x1, y1 in canvas pixels (x1, y1 exclusive)
    labels: np.ndarray  # int32 (n,): class ids
    truncated: np.ndarray  # bool (n,): some of the object's ink lies outside the canvas


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``[x0, y0, x1, y1]`` boxes (0 when both are empty)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, float(w)) * max(0.0, float(h))
    union = float((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])) - inter
    return inter / union if union > 0 else 0.0


def _place(canvas: int, size: int, cut: bool, rng: np.random.Generator) -> tuple[int, int]:
    """Top-left (y, x) of a ``size`` square: inside the canvas, or (``cut``) across one random edge by 20-70%."""
    y, x = int(rng.integers(0, canvas - size + 1)), int(rng.integers(0, canvas - size + 1))
    if cut:
        out = max(1, round(size * float(rng.uniform(0.2, 0.7))))
        side = int(rng.integers(4))  # left, right, top, bottom
        if side == 0:
            x = -out
        elif side == 1:
            x = canvas - size + out
        elif side == 2:
            y = -out
        else:
            y = canvas - size + out
    return y, x


def render(config: DetSceneConfig, pool: np.ndarray, pool_labels: np.ndarray,
           rng: np.random.Generator) -> DetScene:
    """One scene with objects drawn from ``pool`` (28x28 uint8 images) / ``pool_labels``; see the module docstring."""
    c = config.canvas
    canvas = cluttered_canvas(config, pool, rng)
    boxes: list[np.ndarray] = []
    labels: list[int] = []
    truncated: list[bool] = []
    lo, hi = config.object_px
    for _ in range(int(rng.integers(config.objects[0], config.objects[1] + 1))):
        k = int(rng.integers(len(pool)))
        size = int(rng.integers(lo, hi + 1))
        glyph = np.rint(resize(pool[k].astype(np.float32), size, size)).astype(np.float32)
        ink = glyph >= INK
        total = int(ink.sum())
        cut = bool(rng.random() < config.border)
        for _ in range(TRIES if total else 0):  # (a blank glyph has nothing to box: left out)
            y, x = _place(c, size, cut, rng)
            # The part of the glyph inside the canvas: glyph rows gy0:gy1, columns gx0:gx1.
            gy0, gx0 = max(0, -y), max(0, -x)
            gy1, gx1 = min(size, c - y), min(size, c - x)
            seen = ink[gy0:gy1, gx0:gx1]
            visible = int(seen.sum())
            if visible < config.min_visible * total:
                continue
            rows, cols = np.flatnonzero(seen.any(axis=1)), np.flatnonzero(seen.any(axis=0))
            box = np.array([x + gx0 + cols[0], y + gy0 + rows[0], x + gx0 + cols[-1] + 1, y + gy0 + rows[-1] + 1],
                           np.float32)
            if any(iou(box, other) > config.max_iou for other in boxes):
                continue
            paste(canvas, glyph[gy0:gy1, gx0:gx1], y + gy0, x + gx0)
            boxes.append(box)
            labels.append(int(pool_labels[k]))
            truncated.append(visible < total)
            break
    image = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    return DetScene(image, np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32),
                    np.array(truncated, bool))
