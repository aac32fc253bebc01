"""Scenes: a classification task where input resolution matters, built offline from installed data.

A small object (a Fashion-MNIST or MNIST image, ``object_px`` = 10-24 px on a side by default) is placed at a random
position on a ``canvas`` x ``canvas`` grey canvas (128-224 px) with clutter: a smooth random background, pixel noise
and distractor fragments (random crops of other images of any class, scaled like objects, dimmer than the object).
The label is the object's class. At a low input resolution the object shrinks to a few pixels and the fragments look
like it, so accuracy falls: the task rewards the higher resolutions that patch-based inference makes affordable.

Everything is deterministic from (``seed``, split, sample index): each sample draws from its own NumPy generator, so
a split is the same whatever its size or the order samples are made in. Splits: ``train`` and ``val`` take their
objects from disjoint parts of the source's training set (``object_pools``; ``val`` is the held-out split the
architecture search scores sub-networks on), ``test`` from the source's test set.

This module renders (NumPy only); ``tfmcu.data.load`` reads the object source and assembles the data set from a
name (``parse_name``)::

    scenes                                  Fashion-MNIST objects, 160 px canvas, the default sizes
    scenes:source=mnist,canvas=128,train=2000,val=500,test=500,object_px=10-24,distractors=2-5,seed=3

Names are parsed strictly (unknown keys or bad values are one-line ``SceneError``s).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from tfmcu.errors import TfmcuError

SOURCES = ("fashion_mnist", "mnist")


class SceneError(TfmcuError):
    """A scenes name or configuration that cannot be built; one line."""


SPLIT_IDS = {"train": 1, "val": 2, "test": 3}


@dataclass(frozen=True)
class SceneConfig:
    source: str = "fashion_mnist"  # where objects come from: fashion_mnist | mnist
    canvas: int = 160  # canvas side (px)
    object_px: tuple[int, int] = (10, 24)  # object side, uniform in [lo, hi]
    distractors: tuple[int, int] = (2, 5)  # distractor fragments per scene, uniform in [lo, hi]
    noise: float = 10.0  # std of the pixel noise (grey levels)
    clutter: float = 60.0  # peak brightness of the smooth background
    train: int = 6000
    val: int = 1000
    test: int = 2000
    seed: int = 0

    def validate(self) -> "SceneConfig":
        if self.source not in SOURCES:
            raise SceneError(f"scenes: source={self.source}: expected {' or '.join(SOURCES)}")
        lo, hi = self.object_px
        if not 4 <= lo <= hi or hi > self.canvas // 2:
            raise SceneError(f"scenes: object_px={lo}-{hi}: expected 4 <= lo <= hi <= canvas / 2 "
                                     f"({self.canvas // 2})")
        if not 16 <= self.canvas <= 512:
            raise SceneError(f"scenes: canvas={self.canvas}: expected 16..512")
        if not 0 <= self.distractors[0] <= self.distractors[1] <= 32:
            raise SceneError(f"scenes: distractors={self.distractors[0]}-{self.distractors[1]}: expected "
                                     f"0 <= lo <= hi <= 32")
        if min(self.train, self.val, self.test) < 0 or self.noise < 0 or self.clutter < 0:
            raise SceneError("scenes: sizes, noise and clutter must be >= 0")
        return self

    def describe(self) -> str:
        return (f"scenes of {self.source} objects ({self.object_px[0]}-{self.object_px[1]} px) on "
                f"{self.canvas}x{self.canvas} canvases, {self.distractors[0]}-{self.distractors[1]} distractors, "
                f"seed {self.seed}")


def parse_options(name: str, head: str, defaults: Any, error: type[TfmcuError] = SceneError) -> Any | None:
    """``defaults`` (a frozen config dataclass with a ``validate()``) with the options of a ``head:key=value,...``
    name applied and validated (None: ``name`` is not a ``head`` name). A field's annotation says how its value
    parses: ``str``, ``int``, ``float``, or ``tuple[int, int]`` (a range ``lo-hi``, or one number for both). Unknown
    keys and bad values are one-line ``error``s."""
    first, _, rest = name.partition(":")
    if first.lower() != head:
        return None
    types = {f.name: f.type for f in fields(defaults)}
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in types:
            raise error(f"--dataset={name}: '{item}' is not key=value with a key among {', '.join(types)}")
        kind = types[key]
        try:
            if kind == "str":
                values[key] = value.strip()
            elif kind == "tuple[int, int]":
                lo, _, hi = value.partition("-")
                values[key] = (int(lo), int(hi or lo))
            elif kind == "float":
                values[key] = float(value)
            else:
                values[key] = int(value)
        except ValueError:
            raise error(f"--dataset={name}: {key}={value} is not a number"
                        f"{' range (lo-hi)' if kind == 'tuple[int, int]' else ''}") from None
    return replace(defaults, **values).validate()


def parse_name(name: str) -> SceneConfig | None:
    """The SceneConfig a data-set name asks for (None: not a scenes name); see the module docstring."""
    return parse_options(name, "scenes", SceneConfig())


# ============================================================================= rendering
def resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize of a 2-D float image (align corners off, like PIL / TF's half-pixel centres)."""
    ih, iw = img.shape
    ys = np.clip((np.arange(h) + 0.5) * ih / h - 0.5, 0, ih - 1)
    xs = np.clip((np.arange(w) + 0.5) * iw / w - 0.5, 0, iw - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, ih - 1), np.minimum(x0 + 1, iw - 1)
    wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = img[y0][:, x0] * (1 - wx) + img[y0][:, x1] * wx
    bottom = img[y1][:, x0] * (1 - wx) + img[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def paste(canvas: np.ndarray, patch: np.ndarray, y: int, x: int) -> None:
    """``patch`` onto ``canvas`` at row ``y``, column ``x`` (in place, the brighter pixel wins; the patch must fit)."""
    h, w = patch.shape
    region = canvas[y:y + h, x:x + w]
    np.maximum(region, patch, out=region)


def cluttered_canvas(side: int, clutter: float, noise: float, distractors: tuple[int, int],
                     fragment_px: tuple[int, int], pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A ``side`` x ``side`` float32 canvas (0..255) of clutter: a smooth random background (peak ``clutter``),
    Gaussian pixel noise (std ``noise``) and ``distractors`` (lo, hi) fragments: crops of random ``pool`` images
    (28x28 uint8), scaled as if their image were ``fragment_px`` (lo, hi) px on a side, dimmed to 0.5-0.9."""
    c = side
    coarse = rng.random((6, 6)) * clutter
    canvas = resize(coarse, c, c) + rng.normal(0.0, noise, (c, c))
    canvas = np.clip(canvas, 0, 255).astype(np.float32)
    lo, hi = fragment_px
    for _ in range(int(rng.integers(distractors[0], distractors[1] + 1))):
        other = pool[int(rng.integers(len(pool)))].astype(np.float32)
        fh, fw = int(rng.integers(8, 17)), int(rng.integers(8, 17))  # a part of another image (<= 16 of 28 px)
        fy, fx = int(rng.integers(0, 28 - fh + 1)), int(rng.integers(0, 28 - fw + 1))
        scale = float(rng.integers(lo, hi + 1)) / 28.0
        frag = resize(other[fy:fy + fh, fx:fx + fw], max(2, round(fh * scale)), max(2, round(fw * scale)))
        frag *= float(rng.uniform(0.5, 0.9))
        paste(canvas, frag, int(rng.integers(0, c - frag.shape[0] + 1)), int(rng.integers(0, c - frag.shape[1] + 1)))
    return canvas


def render(config: SceneConfig, pool: np.ndarray, index: int, rng: np.random.Generator) -> np.ndarray:
    """One scene (float32 canvas, 0..255) with ``pool[index]`` (a 28x28 uint8 image) as its object."""
    c = config.canvas
    canvas = cluttered_canvas(c, config.clutter, config.noise, config.distractors, config.object_px, pool, rng)
    lo, hi = config.object_px
    size = int(rng.integers(lo, hi + 1))
    obj = resize(pool[index].astype(np.float32), size, size)
    paste(canvas, obj, int(rng.integers(0, c - size + 1)), int(rng.integers(0, c - size + 1)))
    return canvas


def render_split(config: SceneConfig, split: str, images: np.ndarray, labels: np.ndarray,
                 n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` scenes of one split (uint8 ``(n, canvas, canvas, 1)``, int32 labels), objects drawn from ``images`` /
    ``labels`` (the split's object pool: 28x28 uint8 images)."""
    out = np.zeros((n, config.canvas, config.canvas, 1), np.uint8)
    ys = np.zeros(n, np.int32)
    for i in range(n):
        rng = np.random.default_rng([config.seed, SPLIT_IDS[split], i])
        k = int(rng.integers(len(images)))
        out[i, :, :, 0] = np.clip(np.rint(render(config, images, k, rng)), 0, 255).astype(np.uint8)
        ys[i] = labels[k]
    return out, ys


def object_pools(config: SceneConfig, n_source_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices into the source's training set: a fixed held-out sixth gives the validation objects,
    never used in training scenes."""
    held = np.random.default_rng([config.seed, 99]).permutation(n_source_train)
    cut = n_source_train // 6
    return np.sort(held[cut:]), np.sort(held[:cut])


def config_dict(config: SceneConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}
