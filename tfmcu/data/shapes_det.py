"""Shapes: flat coloured shapes on noise with exact boxes, rendered -- a detection task a detector should all but
solve, for checking a recipe in minutes (and a data set with RGB images that needs nothing installed).

An image is a ``canvas`` x ``canvas`` RGB canvas of noise (per pixel and channel, uniform around a random grey
level of the image, amplitude ``noise``) with ``objects`` (lo-hi) shapes on it, each ``object_px`` (lo-hi) on its
longer side, its other side 0.75-1 of that (either way round), of one flat random colour that differs from the
background's grey by at least ``MIN_CONTRAST`` in some channel. The class is the shape; the first ``classes`` of
``SHAPES``: circle (an ellipse), square (a rectangle), triangle (pointing up), diamond, cross. Shapes lie wholly
inside the canvas and do not touch: their boxes, grown by a pixel, do not overlap (drawn again ``TRIES`` times, then
left out). A box is the tight box ``[x0, y0, x1, y1]`` of the shape's pixels (canvas pixels, ``x1``/``y1``
exclusive, as COCO's), labels the class ids 0..classes-1.

Every image is its own draw, ``default_rng([seed, split, index])``: a split is the same on every machine.

Names, parsed strictly as the scenes' (``tfmcu.data.scenes.parse_options``)::

    shapes-det                                  3 shapes, 96 px, 1-3 per image, 1,000 / 200 / 200 images
    shapes-det:classes=5,canvas=128,objects=0-6,object_px=10-48,noise=60,train=4000,seed=2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tfmcu.data.scenes import SPLIT_IDS, SceneConfig, parse_options
from tfmcu.data.split import DataError, Dataset, Split

SHAPES = ("circle", "square", "triangle", "diamond", "cross")
MIN_CONTRAST = 80  # a shape's colour differs from the background's grey level by this much in some channel
TRIES = 20  # placements tried per shape before it is left out


@dataclass(frozen=True, kw_only=True)
class ShapesConfig:
    """A shapes data set (module docstring)."""

    NAME: ClassVar[str] = "shapes-det"
    TITLE: ClassVar[str] = "Shapes"

    classes: int = 3  # the first ``classes`` of SHAPES
    canvas: int = 96
    object_px: tuple[int, int] = (12, 40)  # a shape's longer side, uniform in [lo, hi]
    objects: tuple[int, int] = (1, 3)  # shapes per image, uniform in [lo, hi]
    noise: float = 40.0  # amplitude of the background noise (grey levels)
    train: int = 1000
    val: int = 200
    test: int = 200
    seed: int = 0

    def validate(self) -> "ShapesConfig":
        name = self.NAME
        if not 1 <= self.classes <= len(SHAPES):
            raise DataError(f"{name}: classes={self.classes}: expected 1..{len(SHAPES)} ({', '.join(SHAPES)})")
        if not 16 <= self.canvas <= 512:
            raise DataError(f"{name}: canvas={self.canvas}: expected 16..512")
        lo, hi = self.object_px
        if not 6 <= lo <= hi or hi > self.canvas // 2:
            raise DataError(f"{name}: object_px={lo}-{hi}: expected 6 <= lo <= hi <= canvas / 2 ({self.canvas // 2})")
        if not 0 <= self.objects[0] <= self.objects[1] <= 16:
            raise DataError(f"{name}: objects={self.objects[0]}-{self.objects[1]}: expected 0 <= lo <= hi <= 16")
        if not 0 <= self.noise <= 255 or min(self.train, self.val, self.test) < 0:
            raise DataError(f"{name}: noise must be 0..255 and the split sizes >= 0")
        return self

    def describe(self) -> str:
        return (f"{self.objects[0]}-{self.objects[1]} flat shapes of {self.classes} kinds "
                f"({self.object_px[0]}-{self.object_px[1]} px) on {self.canvas}x{self.canvas} noise "
                f"(amplitude {self.noise:g}), seed {self.seed}")

    as_dict = SceneConfig.as_dict  # the fields as JSON holds them (ranges as lists)


def parse_name(name: str) -> ShapesConfig | None:
    """The ShapesConfig a data-set name asks for (None: not a ``shapes-det`` name); see the module docstring."""
    return parse_options(name, ShapesConfig())


def is_name(name: str) -> bool:
    """Whether ``name`` asks for shapes (``shapes-det`` or ``shapes-det:...``), valid or not."""
    return name.partition(":")[0].lower() == ShapesConfig.NAME


def load_shapes(config: ShapesConfig) -> Dataset:
    """The data set ``config`` describes, rendered: uint8 RGB images, per-image boxes and labels, image ids 1..n."""
    splits = {split: render_split(config, split, getattr(config, split)) for split in ("train", "val", "test")}
    return Dataset(name=config.TITLE, class_names=list(SHAPES[:config.classes]), train=splits["train"],
                   test=splits["test"], channels=3, flip=True, source=config.describe(), val=splits["val"],
                   info={config.NAME: config.as_dict()})


def render_split(config: ShapesConfig, split: str, n: int) -> Split:
    c = config.canvas
    images = np.zeros((n, c, c, 3), np.uint8)
    boxes, labels = [], []
    for i in range(n):
        rng = np.random.default_rng([config.seed, SPLIT_IDS[split], i])
        images[i], b, k = render(config, rng)
        boxes.append(b)
        labels.append(k)
    return Split(labels, images, boxes=boxes, image_ids=np.arange(1, n + 1, dtype=np.int64))


def shape_mask(shape: str, h: int, w: int) -> np.ndarray:
    """The pixels (bool ``(h, w)``) of ``shape`` drawn in an ``h`` x ``w`` box."""
    y = (np.arange(h) + 0.5)[:, None] / h * 2 - 1  # pixel centres in [-1, 1]
    x = (np.arange(w) + 0.5)[None, :] / w * 2 - 1
    if shape == "circle":
        m = x ** 2 + y ** 2 <= 1.0
    elif shape == "square":
        m = np.ones((h, w), bool)
    elif shape == "triangle":  # apex at the top centre, base along the bottom row
        m = np.abs(x) <= (y + 1) / 2
    elif shape == "diamond":
        m = np.abs(x) + np.abs(y) <= 1.0
    elif shape == "cross":
        m = (np.abs(x) <= 1 / 3) | (np.abs(y) <= 1 / 3)
    else:
        raise ValueError(shape)
    return np.broadcast_to(m, (h, w)).copy()


def _colour(grey: float, rng: np.random.Generator) -> np.ndarray:
    while True:
        colour = rng.integers(0, 256, 3)
        if np.abs(colour - grey).max() >= MIN_CONTRAST:
            return colour.astype(np.float32)


def render(config: ShapesConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image: uint8 ``(canvas, canvas, 3)``, float32 boxes ``(n, 4)``, int32 labels ``(n,)``."""
    c = config.canvas
    grey = float(rng.uniform(60, 196))
    image = grey + rng.uniform(-config.noise, config.noise, (c, c, 3))
    boxes: list[list[float]] = []
    labels: list[int] = []
    lo, hi = config.object_px
    for _ in range(int(rng.integers(config.objects[0], config.objects[1] + 1))):
        k = int(rng.integers(config.classes))
        long = int(rng.integers(lo, hi + 1))
        short = max(lo // 2, round(long * float(rng.uniform(0.75, 1.0))))
        h, w = (long, short) if rng.random() < 0.5 else (short, long)
        colour = _colour(grey, rng)
        for _ in range(TRIES):
            y, x = int(rng.integers(0, c - h + 1)), int(rng.integers(0, c - w + 1))
            if any(x - 1 < b[2] and b[0] < x + w + 1 and y - 1 < b[3] and b[1] < y + h + 1 for b in boxes):
                continue
            mask = shape_mask(SHAPES[k], h, w)
            image[y:y + h, x:x + w][mask] = colour
            rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
            boxes.append([x + cols[0], y + rows[0], x + cols[-1] + 1, y + rows[-1] + 1])
            labels.append(k)
            break
    out = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return out, np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32)
