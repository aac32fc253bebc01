"""What every data set is made of: splits of images with their labels, the data set that holds them, one-line errors,
and the seeded draws (subsets, the validation hold-out) with the named streams every random draw of data takes its
generator from.

A ``Split`` holds N images -- uint8 ``(N, H, W, C)`` in memory, or N image file paths -- and their labels: for
classification one class id per image (int32 ``(N,)``); for detection, with ``boxes``, per image the boxes
(float32 ``(n_i, 4)``, ``[x0, y0, x1, y1]`` in the image's pixels, ``x1`` / ``y1`` exclusive as COCO's ``x + w``) and
a class id per box (int32 ``(n_i,)``), and the images' ids (COCO image ids; 1..N for rendered scenes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu.errors import TfmcuError

GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL modes read as one grey channel

# Every random draw of data takes its generator from the run's seed plus the fixed offset of a named stream, so two
# draws never share a generator by accident. (The offsets are those the draws have always used: a seed gives the
# data it gave before.)
STREAMS = {
    "float": 0,  # float epochs: order and augmentation
    "calibration": 17,  # the int8 conversion's calibration images
    "subnet_calibration": 31,  # a sub-network's batch-norm calibration images (the architecture search)
    "qat": 1000,  # QAT epochs: order and augmentation
    "bn_recalibration": 2000,  # the fixed training batches of batch-norm re-calibration
    "validation": 7919,  # the validation hold-out of a training set
    "subset": 104729,  # seeded subsets (``subset``: train_subset, test_subset, int8_eval_samples, ...)
}


class DataError(TfmcuError):
    """A data set that is missing, malformed, laid out in a way we do not understand, or cannot be written; one
    line."""


def stream_seed(seed: int, stream: str) -> int:
    """The seed of ``stream`` (``STREAMS``) in a run seeded with ``seed``."""
    return seed + STREAMS[stream]


@dataclass
class Split:
    """One split: images in memory (``images``) or as files (``paths``), with their labels (module docstring)."""

    labels: np.ndarray | list[np.ndarray]
    images: np.ndarray | None = None
    paths: np.ndarray | None = None
    boxes: list[np.ndarray] | None = None  # detection: per image, [n_i, 4]
    image_ids: np.ndarray | None = None  # detection: int64 (N,)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def in_memory(self) -> bool:
        return self.images is not None

    @property
    def stored(self) -> np.ndarray:
        """The images as stored: the uint8 array, or the file paths."""
        return self.images if self.images is not None else self.paths

    def image(self, i: int) -> np.ndarray:
        """Image ``i`` as uint8 ``(H, W, C)`` (read from its file when the split holds paths)."""
        return self.images[i] if self.images is not None else read_image(str(self.paths[i]))

    def take(self, index: Sequence[int] | np.ndarray) -> "Split":
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        pick = lambda a: None if a is None else a[index]  # noqa: E731
        labels = self.labels[index] if isinstance(self.labels, np.ndarray) else [self.labels[i] for i in index]
        return Split(labels, pick(self.images), pick(self.paths),
                     None if self.boxes is None else [self.boxes[i] for i in index], pick(self.image_ids))

    def n_boxes(self) -> int:
        return int(sum(len(b) for b in self.boxes or []))


@dataclass
class Dataset:
    name: str
    class_names: list[str]
    train: Split
    test: Split
    channels: int  # channels of the stored images (1 grey, 3 RGB)
    flip: bool  # horizontal flips keep the class (clothes, photos; not digits)
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    val: Split | None = None  # a validation split of its own (scenes, detection); else training takes one from train

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def boxes(self) -> bool:
        """Whether the data set is for detection (its splits hold boxes)."""
        return self.train.boxes is not None

    def split(self, name: str) -> Split | None:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def read_image(path: str) -> np.ndarray:
    """An image file as uint8 ``(H, W, 1)`` (grey) or ``(H, W, 3)`` (anything else, converted to RGB)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            grey = im.mode in GREY_MODES
            arr = np.asarray(im.convert("L" if grey else "RGB"))
    except OSError as e:
        raise DataError(f"{path}: not a readable image ({str(e).splitlines()[0]})") from None
    return arr[..., None] if grey else arr


# ============================================================================= seeded draws
def draw(n_items: int, n: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded random sample of ``n`` of ``n_items`` items (all of them: ``None`` or >= n_items)."""
    return np.sort(np.random.default_rng(seed).permutation(n_items)[:n])


def subset(split: Split, n: int | None, seed: int) -> Split:
    """A seeded random subset of ``n`` samples, in split order, drawn from the stream "subset" of ``seed`` (``None``
    or >= len: the whole split)."""
    if n is None or n >= len(split):
        return split
    return split.take(draw(len(split), n, stream_seed(seed, "subset")))


def split_validation(split: Split, n_val: int | float, seed: int) -> tuple[Split, Split]:
    """(train, validation): a seeded (stream "validation"), class-stratified hold-out of ``n_val`` samples (or that
    fraction) of a classification split."""
    n = len(split)
    k = int(round(n * n_val)) if isinstance(n_val, float) and n_val < 1 else int(n_val)
    if k <= 0:
        return split, split.take(np.zeros(0, np.int64))
    if k >= n:
        raise DataError(f"validation split of {k} leaves no training data (the training set has {n} samples)")
    rng = np.random.default_rng(stream_seed(seed, "validation"))
    val = []
    for c in np.unique(split.labels):
        idx = np.flatnonzero(split.labels == c)
        take = int(round(k * len(idx) / n))
        val.append(rng.permutation(idx)[:take])
    val_idx = np.sort(np.concatenate(val))
    mask = np.ones(n, bool)
    mask[val_idx] = False
    return split.take(np.flatnonzero(mask)), split.take(val_idx)


def hold_out(splits: dict[str, Split], what: str, seed: int, val_fraction: float,
             test_fraction: float) -> dict[str, str]:
    """A detection data set's val and test splits that have no file of their own (missing from ``splits``): seeded
    ``val_fraction`` / ``test_fraction`` of ``splits["train"]`` (``what``: the file it was read from), taken out of
    it, in place; returns how each held-out split was made (empty: none was)."""
    missing = [s for s in ("val", "test") if s not in splits]
    if not missing:
        return {}
    train = splits["train"]
    order = np.random.default_rng(seed).permutation(len(train))
    cut = {"test": int(round(len(train) * test_fraction)) if "test" in missing else 0,
           "val": int(round(len(train) * val_fraction)) if "val" in missing else 0}
    if cut["test"] + cut["val"] >= len(train):
        raise DataError(f"{what}: {len(train)} images leave none for training after val_fraction={val_fraction:g}, "
                        f"test_fraction={test_fraction:g}")
    parts = {"test": order[:cut["test"]], "val": order[cut["test"]:cut["test"] + cut["val"]],
             "train": order[cut["test"] + cut["val"]:]}
    for s in ["train"] + missing:
        splits[s] = train.take(np.sort(parts[s]))
    return {s: f"{val_fraction if s == 'val' else test_fraction:g} of {os.path.basename(what)} (seed {seed})"
            for s in missing}


def check_fractions(root: str, val_fraction: float, test_fraction: float) -> None:
    """The held-out fractions of a detection folder, checked (one line naming the problem)."""
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise DataError(f"{key}={value}: expected 0 <= fraction < 1")
    if val_fraction + test_fraction >= 1:
        raise DataError(f"val_fraction + test_fraction = {val_fraction + test_fraction:g}: leaves no training "
                        f"images ({root})")


def only_classes(dataset: Dataset, names: Sequence[str]) -> Dataset:
    """A detection data set with the boxes of the classes ``names`` only, numbered in that order (e.g. COCO-person:
    ``["person"]``); every image stays (one without such a box has none). An unknown name is a one-line error."""
    unknown = [n for n in names if n not in dataset.class_names]
    if unknown:
        raise DataError(f"{dataset.source or dataset.name}: no class {', '.join(unknown)} (its classes: "
                        f"{', '.join(dataset.class_names)})")
    new = {dataset.class_names.index(n): k for k, n in enumerate(names)}

    def keep(split: Split | None) -> Split | None:
        if split is None:
            return None
        assert split.boxes is not None
        masks = [np.isin(lab, list(new)) for lab in split.labels]
        labels = [np.array([new[int(c)] for c in lab[m]], np.int32) for lab, m in zip(split.labels, masks)]
        boxes = [b[m].reshape(-1, 4) for b, m in zip(split.boxes, masks)]
        return Split(labels, split.images, split.paths, boxes, split.image_ids)

    train, test = keep(dataset.train), keep(dataset.test)
    assert train is not None and test is not None
    return Dataset(dataset.name, list(names), train, test, channels=dataset.channels, flip=dataset.flip,
                   source=dataset.source, info={**dataset.info, "classes": list(names)}, val=keep(dataset.val))
