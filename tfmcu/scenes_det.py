"""Detection scenes: several small objects with exact boxes on cluttered canvases, built offline from installed data.

The detection sibling of ``tfmcu.scenes``. Each scene is a ``canvas`` x ``canvas`` grey canvas with the same clutter
(a smooth random background, pixel noise and distractor fragments: ``scenes.cluttered_canvas``) and ``objects``
(lo-hi, 1-4 by default, 0 allowed) Fashion-MNIST or MNIST images of 10 classes pasted on it, each ``object_px``
(8-40 px by default) on a side. Objects overlap at most ``max_iou`` (box IoU); a placement that overlaps more, or a
cut object with less than ``min_visible`` of its ink inside the canvas, is drawn again (``TRIES`` times; then the
object is left out, so a scene may hold fewer objects than drawn). A ``border`` fraction of the objects is placed
across a canvas edge on purpose, so objects cut by the border occur.

Boxes are exact: the tight box ``[x0, y0, x1, y1]`` (float32, canvas pixels, ``x1`` / ``y1`` exclusive: pixel
``(x, y)`` covers ``[x, x + 1)``, as in COCO) of the object's *ink* -- its resized glyph's pixels of at least ``INK``
grey levels -- that lie inside the canvas, not the pasted square. Labels are the source's class ids 0..9. Objects
are pasted over the clutter and each other with ``max`` (the brighter pixel wins), so no ink is erased.

Determinism and splits are those of ``tfmcu.scenes``: every sample draws from its own NumPy generator seeded with
(``seed``, split, index), so a split is the same whatever its size; ``train`` and ``val`` take their objects (and
distractors) from disjoint parts of the source's training set (``scenes.object_pools``), ``test`` from its test set.

This module renders (NumPy only); ``tfmcu.detection_data.load_detection`` reads the object source and assembles the
data set from a name (``parse_name``)::

    scenes-det                                  Fashion-MNIST objects, 160 px canvas, the default sizes
    scenes-det:source=mnist,canvas=256,objects=0-6,object_px=12-48,border=0.3,train=500,val=100,test=100,seed=2

Names are parsed strictly (unknown keys or bad values are one-line ``SceneError``s).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tfmcu import scenes
from tfmcu.scenes import SPLIT_IDS, SOURCES, SceneError

NAME = "scenes-det"
INK = 32  # a resized glyph's pixels at least this bright (0..255) are the object's: its box is their tight box
TRIES = 8  # placements tried per object before it is left out


@dataclass(frozen=True)
class DetSceneConfig:
    source: str = "fashion_mnist"  # where objects come from: fashion_mnist | mnist
    canvas: int = 160  # canvas side (px)
    objects: tuple[int, int] = (1, 4)  # objects drawn per scene, uniform in [lo, hi] (lo may be 0)
    object_px: tuple[int, int] = (8, 40)  # object side (px), uniform in [lo, hi]; distractors are scaled alike
    distractors: tuple[int, int] = (2, 5)  # distractor fragments per scene, uniform in [lo, hi]
    border: float = 0.15  # fraction of the objects placed across a canvas edge (cut by the border)
    min_visible: float = 0.3  # a cut object keeps at least this fraction of its ink inside the canvas
    max_iou: float = 0.5  # the largest box IoU between two objects of a scene
    noise: float = 10.0  # std of the pixel noise (grey levels)
    clutter: float = 60.0  # peak brightness of the smooth background
    train: int = 2000
    val: int = 300
    test: int = 300
    seed: int = 0

    def validate(self) -> "DetSceneConfig":
        if self.source not in SOURCES:
            raise SceneError(f"{NAME}: source={self.source}: expected {' or '.join(SOURCES)}")
        if not 32 <= self.canvas <= 512:
            raise SceneError(f"{NAME}: canvas={self.canvas}: expected 32..512")
        lo, hi = self.object_px
        if not 4 <= lo <= hi or hi > self.canvas // 2:
            raise SceneError(f"{NAME}: object_px={lo}-{hi}: expected 4 <= lo <= hi <= canvas / 2 "
                             f"({self.canvas // 2})")
        if not 0 <= self.objects[0] <= self.objects[1] <= 32:
            raise SceneError(f"{NAME}: objects={self.objects[0]}-{self.objects[1]}: expected 0 <= lo <= hi <= 32")
        if not 0 <= self.distractors[0] <= self.distractors[1] <= 32:
            raise SceneError(f"{NAME}: distractors={self.distractors[0]}-{self.distractors[1]}: expected "
                             f"0 <= lo <= hi <= 32")
        for key, value, low in (("border", self.border, 0.0), ("max_iou", self.max_iou, 0.0),
                                ("min_visible", self.min_visible, 0.01)):
            if not low <= value <= 1:
                raise SceneError(f"{NAME}: {key}={value}: expected {low:g}..1")
        if min(self.train, self.val, self.test) < 0 or not (self.noise >= 0 and self.clutter >= 0):
            raise SceneError(f"{NAME}: sizes, noise and clutter must be >= 0")
        return self

    def describe(self) -> str:
        return (f"detection scenes of {self.objects[0]}-{self.objects[1]} {self.source} objects "
                f"({self.object_px[0]}-{self.object_px[1]} px, {self.border:g} across the border) on "
                f"{self.canvas}x{self.canvas} canvases, {self.distractors[0]}-{self.distractors[1]} distractors, "
                f"seed {self.seed}")


def parse_name(name: str) -> DetSceneConfig | None:
    """The DetSceneConfig a data-set name asks for (None: not a ``scenes-det`` name); see the module docstring."""
    return scenes.parse_options(name, NAME, DetSceneConfig())


def is_name(name: str) -> bool:
    """Whether ``name`` asks for detection scenes (``scenes-det`` or ``scenes-det:...``), valid or not."""
    return name.partition(":")[0].lower() == NAME


def config_dict(config: DetSceneConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


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
    canvas = scenes.cluttered_canvas(c, config.clutter, config.noise, config.distractors, config.object_px, pool, rng)
    boxes: list[np.ndarray] = []
    labels: list[int] = []
    truncated: list[bool] = []
    lo, hi = config.object_px
    for _ in range(int(rng.integers(config.objects[0], config.objects[1] + 1))):
        k = int(rng.integers(len(pool)))
        size = int(rng.integers(lo, hi + 1))
        glyph = np.rint(scenes.resize(pool[k].astype(np.float32), size, size)).astype(np.float32)
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
            scenes.paste(canvas, glyph[gy0:gy1, gx0:gx1], y + gy0, x + gx0)
            boxes.append(box)
            labels.append(int(pool_labels[k]))
            truncated.append(visible < total)
            break
    image = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    return DetScene(image, np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32),
                    np.array(truncated, bool))


def render_split(config: DetSceneConfig, split: str, pool: np.ndarray, pool_labels: np.ndarray,
                 n: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """``n`` scenes of one split: uint8 images ``(n, canvas, canvas, 1)``, per-image float32 boxes ``(k, 4)`` and
    int32 labels ``(k,)``; objects drawn from the split's pool (28x28 uint8 images and their labels)."""
    images = np.zeros((n, config.canvas, config.canvas, 1), np.uint8)
    boxes, labels = [], []
    for i in range(n):
        scene = render(config, pool, pool_labels, np.random.default_rng([config.seed, SPLIT_IDS[split], i]))
        images[i, :, :, 0] = scene.image
        boxes.append(scene.boxes)
        labels.append(scene.labels)
    return images, boxes, labels


def object_pools(config: DetSceneConfig, n_source_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices into the source's training set: the held-out sixth of ``scenes.object_pools`` for the
    same seed."""
    return scenes.object_pools(scenes.SceneConfig(seed=config.seed), n_source_train)
