"""Scenes: small objects on cluttered canvases, built offline from installed data -- the classification task where
input resolution matters, and what the detection scenes (``tfmcu.data.scenes_det``) build on.

A scene is a ``canvas`` x ``canvas`` grey canvas of clutter -- a smooth random background, pixel noise and distractor
fragments (random crops of other images of any class, scaled like objects, dimmer than the objects:
``cluttered_canvas``) -- with objects on it: Fashion-MNIST or MNIST images, ``object_px`` on a side. A
classification scene (``SceneConfig``) holds one object (10-24 px by default, on 160 px) and is labelled with its
class. At a low input resolution the object shrinks to a few pixels and the fragments look like it, so accuracy
falls: the task rewards the higher resolutions that patch-based inference makes affordable.

Everything is deterministic from (``seed``, split, sample index): each sample draws from its own NumPy generator, so
a split is the same whatever its size or the order samples are made in. Splits: ``train`` and ``val`` take their
objects from disjoint parts of the source's training set (``object_pools``; ``val`` is the held-out split the
architecture search scores sub-networks on), ``test`` from the source's test set. ``load_scenes`` builds the data set
of either kind of scene from its object source: the one scene loader.

Names (``parse_name``) are parsed strictly (unknown keys or bad values are one-line ``DataError``s)::

    scenes                                  Fashion-MNIST objects, 160 px canvas, the default sizes
    scenes:source=mnist,canvas=128,train=2000,val=500,test=500,object_px=10-24,distractors=2-5,seed=3
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from tfmcu.data.images import resize
from tfmcu.data.split import DataError, Dataset, Split

SOURCES = ("fashion_mnist", "mnist")
SPLIT_IDS = {"train": 1, "val": 2, "test": 3}


@dataclass(frozen=True, kw_only=True)
class SceneConfig:
    """A classification scene: one object per canvas (and what every scene has: source, canvas, clutter, sizes)."""

    NAME: ClassVar[str] = "scenes"
    TITLE: ClassVar[str] = "Scenes"
    MIN_CANVAS: ClassVar[int] = 16

    source: str = "fashion_mnist"  # where objects come from: fashion_mnist | mnist
    canvas: int = 160  # canvas side (px)
    object_px: tuple[int, int] = (10, 24)  # object side, uniform in [lo, hi]; distractors are scaled alike
    distractors: tuple[int, int] = (2, 5)  # distractor fragments per scene, uniform in [lo, hi]
    noise: float = 10.0  # std of the pixel noise (grey levels)
    clutter: float = 60.0  # peak brightness of the smooth background
    train: int = 6000
    val: int = 1000
    test: int = 2000
    seed: int = 0

    def validate(self) -> "SceneConfig":
        name = self.NAME
        if self.source not in SOURCES:
            raise DataError(f"{name}: source={self.source}: expected {' or '.join(SOURCES)}")
        if not self.MIN_CANVAS <= self.canvas <= 512:
            raise DataError(f"{name}: canvas={self.canvas}: expected {self.MIN_CANVAS}..512")
        lo, hi = self.object_px
        if not 4 <= lo <= hi or hi > self.canvas // 2:
            raise DataError(f"{name}: object_px={lo}-{hi}: expected 4 <= lo <= hi <= canvas / 2 ({self.canvas // 2})")
        if not 0 <= self.distractors[0] <= self.distractors[1] <= 32:
            raise DataError(f"{name}: distractors={self.distractors[0]}-{self.distractors[1]}: expected "
                            f"0 <= lo <= hi <= 32")
        if min(self.train, self.val, self.test) < 0 or not (self.noise >= 0 and self.clutter >= 0):
            raise DataError(f"{name}: sizes, noise and clutter must be >= 0")
        return self

    def describe(self) -> str:
        return (f"scenes of {self.source} objects ({self.object_px[0]}-{self.object_px[1]} px) on "
                f"{self.canvas}x{self.canvas} canvases, {self.distractors[0]}-{self.distractors[1]} distractors, "
                f"seed {self.seed}")

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON holds them (ranges as lists)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    def render_split(self, split: str, images: np.ndarray, labels: np.ndarray, n: int) -> Split:
        """``n`` scenes of one split (uint8 ``(n, canvas, canvas, 1)``, int32 labels), objects drawn from ``images``
        / ``labels`` (the split's object pool: 28x28 uint8 images)."""
        out = np.zeros((n, self.canvas, self.canvas, 1), np.uint8)
        ys = np.zeros(n, np.int32)
        for i, rng in enumerate(sample_rngs(self, split, n)):
            k = int(rng.integers(len(images)))
            out[i, :, :, 0] = np.clip(np.rint(render(self, images, k, rng)), 0, 255).astype(np.uint8)
            ys[i] = labels[k]
        return Split(ys, out)


def parse_options(name: str, defaults: Any) -> Any | None:
    """``defaults`` (a frozen scene config with a ``NAME`` and a ``validate()``) with the options of a
    ``NAME:key=value,...`` name applied and validated (None: ``name`` is not such a name). A field's annotation says
    how its value parses: ``str``, ``int``, ``float``, or ``tuple[int, int]`` (a range ``lo-hi``, or one number for
    both). Unknown keys and bad values are one-line ``DataError``s."""
    first, _, rest = name.partition(":")
    if first.lower() != defaults.NAME:
        return None
    types = {f.name: f.type for f in fields(defaults)}
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in types:
            raise DataError(f"--dataset={name}: '{item}' is not key=value with a key among {', '.join(types)}")
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
            raise DataError(f"--dataset={name}: {key}={value} is not a number"
                            f"{' range (lo-hi)' if kind == 'tuple[int, int]' else ''}") from None
    return replace(defaults, **values).validate()


def parse_name(name: str) -> SceneConfig | None:
    """The SceneConfig a data-set name asks for (None: not a scenes name); see the module docstring."""
    return parse_options(name, SceneConfig())


# ============================================================================= the one scene loader
def object_pools(seed: int, n_source_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices into the source's training set: a fixed held-out sixth gives the validation objects,
    never used in training scenes."""
    held = np.random.default_rng([seed, 99]).permutation(n_source_train)
    cut = n_source_train // 6
    return np.sort(held[cut:]), np.sort(held[:cut])


def load_scenes(config: SceneConfig, source: Dataset) -> Dataset:
    """The scenes of ``config`` (classification or detection scenes) as a data set: train / val / test in memory,
    uint8, one channel; objects from ``source`` (an installed IDX data set, ``config.source``)."""
    if source.train.images is None or source.test.images is None:
        raise DataError(f"{config.NAME}: source {config.source} is not an in-memory IDX data set")
    train_idx, val_idx = object_pools(config.seed, len(source.train))
    pools = {"train": (source.train.images[train_idx, ..., 0], source.train.labels[train_idx]),
             "val": (source.train.images[val_idx, ..., 0], source.train.labels[val_idx]),
             "test": (source.test.images[..., 0], source.test.labels)}
    splits = {split: config.render_split(split, *pools[split], getattr(config, split)) for split in SPLIT_IDS}
    key = config.NAME.replace("-", "_")
    return Dataset(name=f"{config.TITLE} ({source.name})", class_names=list(source.class_names),
                   train=splits["train"], test=splits["test"], channels=1, flip=source.flip,
                   source=config.describe(), val=splits["val"],
                   info={key: {**config.as_dict(), "object_source": source.source}})


# ============================================================================= rendering
def sample_rngs(config: SceneConfig, split: str, n: int):
    """The generators of samples 0..n-1 of a split: each its own, seeded with (seed, split, index)."""
    return (np.random.default_rng([config.seed, SPLIT_IDS[split], i]) for i in range(n))


def paste(canvas: np.ndarray, patch: np.ndarray, y: int, x: int) -> None:
    """``patch`` onto ``canvas`` at row ``y``, column ``x`` (in place, the brighter pixel wins; the patch must fit)."""
    h, w = patch.shape
    region = canvas[y:y + h, x:x + w]
    np.maximum(region, patch, out=region)


def cluttered_canvas(config: SceneConfig, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A ``canvas`` x ``canvas`` float32 canvas (0..255) of clutter: a smooth random background (peak ``clutter``),
    Gaussian pixel noise (std ``noise``) and ``distractors`` (lo, hi) fragments: crops of random ``pool`` images
    (28x28 uint8), scaled as if their image were ``object_px`` (lo, hi) px on a side, dimmed to 0.5-0.9."""
    c = config.canvas
    coarse = rng.random((6, 6)) * config.clutter
    canvas = resize(coarse, c, c) + rng.normal(0.0, config.noise, (c, c))
    canvas = np.clip(canvas, 0, 255).astype(np.float32)
    lo, hi = config.object_px
    for _ in range(int(rng.integers(config.distractors[0], config.distractors[1] + 1))):
        other = pool[int(rng.integers(len(pool)))].astype(np.float32)
        fh, fw = int(rng.integers(8, 17)), int(rng.integers(8, 17))  # a part of another image (<= 16 of 28 px)
        fy, fx = int(rng.integers(0, 28 - fh + 1)), int(rng.integers(0, 28 - fw + 1))
        scale = float(rng.integers(lo, hi + 1)) / 28.0
        frag = resize(other[fy:fy + fh, fx:fx + fw], max(2, round(fh * scale)), max(2, round(fw * scale)))
        frag *= float(rng.uniform(0.5, 0.9))
        paste(canvas, frag, int(rng.integers(0, c - frag.shape[0] + 1)), int(rng.integers(0, c - frag.shape[1] + 1)))
    return canvas


def render(config: SceneConfig, pool: np.ndarray, index: int, rng: np.random.Generator) -> np.ndarray:
    """One classification scene (float32 canvas, 0..255) with ``pool[index]`` (a 28x28 uint8 image) as its
    object."""
    c = config.canvas
    canvas = cluttered_canvas(config, pool, rng)
    lo, hi = config.object_px
    size = int(rng.integers(lo, hi + 1))
    obj = resize(pool[index].astype(np.float32), size, size)
    paste(canvas, obj, int(rng.integers(0, c - size + 1)), int(rng.integers(0, c - size + 1)))
    return canvas
