"""Augmentation of images with their boxes, and the epochs' batches (``tfmcu.train.detection``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from tfmcu.data.images import model_inputs
from tfmcu.data.split import Split
from tfmcu.nets.spec import NetSpec
from tfmcu.train.detection.targets import TargetLayout, assign_targets

MIN_VISIBLE = 0.25  # augmentation: a box keeps at least this fraction of its area inside the image, or is dropped
FILL = -1.0  # augmentation: the normalised value of a black pixel ((0 - 127.5) / 127.5)


# ============================================================================= augmentation
def _resample_taps(n: int, zoom: float, shift: float, mirror: bool) -> tuple[np.ndarray, ...]:
    """The bilinear taps along one axis of the map f -> (f - 0.5) * zoom + 0.5 + shift (then f -> 1 - f if
    ``mirror``), f a fraction of the side: per output pixel the two source pixels (clipped into the image) and their
    weights (0 for a source pixel outside it, so an output pixel that samples outside has weights summing to less
    than 1)."""
    out = (np.arange(n) + 0.5) / n
    if mirror:
        out = 1.0 - out
    src = ((out - 0.5 - shift) / zoom + 0.5) * n - 0.5  # the source pixel coordinate (pixel centres at integers)
    p0 = np.floor(src).astype(np.int64)
    w1 = src - p0
    w0 = 1.0 - w1
    p1 = p0 + 1
    w0 = np.where((p0 >= 0) & (p0 < n), w0, 0.0)
    w1 = np.where((p1 >= 0) & (p1 < n), w1, 0.0)
    return np.clip(p0, 0, n - 1), w0, np.clip(p1, 0, n - 1), w1


def _resample(image: np.ndarray, taps: tuple[np.ndarray, ...], axis: int) -> np.ndarray:
    """``image`` resampled along ``axis`` (0: rows, 1: columns) with ``_resample_taps``' taps."""
    p0, w0, p1, w1 = taps
    shape = (-1, 1, 1) if axis == 0 else (1, -1, 1)
    return (np.take(image, p0, axis=axis) * w0.reshape(shape) + np.take(image, p1, axis=axis) * w1.reshape(shape))


def augment(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator, flip: bool = True,
            scale: float = 0.25, translate: float = 0.125) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image (float32 ``[H, W, C]``, normalised), its boxes (``[n, 4]`` ``[x0, y0, x1, y1]`` fractions) and
    labels, zoomed by ``1 + U(-scale, scale)`` about the centre, shifted by ``U(-translate, translate)`` of the side
    per axis and, if ``flip``, mirrored with probability 1/2 (module docstring). Returns (image, boxes, labels)."""
    zoom = 1.0 + rng.uniform(-scale, scale)
    ty, tx = rng.uniform(-translate, translate, 2)
    mirror = bool(flip) and bool(rng.random() < 0.5)
    h, w = image.shape[:2]
    ty_taps, tx_taps = _resample_taps(h, zoom, ty, False), _resample_taps(w, zoom, tx, mirror)
    img = _resample(_resample(image.astype(np.float64), ty_taps, 0), tx_taps, 1)  # (separable: two taps per axis)
    img += FILL * (1.0 - np.outer(ty_taps[1] + ty_taps[3], tx_taps[1] + tx_taps[3]))[..., None]
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    moved = np.empty_like(b)
    moved[:, [0, 2]] = (b[:, [0, 2]] - 0.5) * zoom + 0.5 + tx
    moved[:, [1, 3]] = (b[:, [1, 3]] - 0.5) * zoom + 0.5 + ty
    if mirror:
        moved[:, [0, 2]] = 1.0 - moved[:, [2, 0]]
    clipped = np.clip(moved, 0.0, 1.0)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    keep = (area(clipped) > 0) & (area(clipped) >= MIN_VISIBLE * area(moved))
    return (img.astype(np.float32), clipped[keep].astype(np.float32),
            np.asarray(labels).reshape(-1)[keep].astype(np.int32))


@dataclass
class DetArrays:
    """A split as model inputs: float32 images ``[N, R, R, C]`` (normalised; C may be 1 for grey images that the
    model takes as 3 channels: replicated per batch), boxes per image ``[n, 4]`` ``[x0, y0, x1, y1]`` fractions,
    labels per image."""

    images: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.boxes)


def as_arrays(split: Split, resolution: int, channels: int) -> DetArrays:
    """A detection split resized for the model (``model_inputs``); grey images stay 1 channel (``batch_images``
    replicates them)."""
    grey = split.in_memory and split.images.shape[-1] == 1
    x, boxes = model_inputs(split, resolution, 1 if grey else channels)
    return DetArrays(x, boxes, [np.asarray(lab, np.int32) for lab in split.labels])


def batch_images(x: np.ndarray, channels: int) -> np.ndarray:
    return np.repeat(x, channels, axis=-1) if x.shape[-1] == 1 and channels != 1 else x


def batches_per_epoch(n: int, batch_size: int, steps: int | None = None) -> int:
    """The batches ``epoch_batches`` yields for ``n`` images: full batches only, at most ``steps``."""
    return min(n // batch_size, steps) if steps is not None else n // batch_size


def epoch_batches(arrays: DetArrays, spec: NetSpec, batch_size: int, seed: int, epoch: int,
                  steps: int | None = None, augment_images: bool = True, flip: bool = True, scale: float = 0.25,
                  translate: float = 0.125, ignore_iou: float = 0.5, shuffle: bool = True, positives: str = "best"
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of (images ``[B, R, R, C]``, targets ``[B, N, 5 + K]``) batches: order ``default_rng([seed,
    epoch])``, sample i augmented with ``default_rng([seed, epoch, i])``; the last partial batch is dropped and
    ``steps`` caps the batches. Deterministic for (seed, epoch)."""
    lay = TargetLayout(spec)
    order = np.random.default_rng([seed, epoch]).permutation(len(arrays)) if shuffle else np.arange(len(arrays))
    n_batches = batches_per_epoch(len(arrays), batch_size, steps)
    for s in range(n_batches):
        idx = order[s * batch_size:(s + 1) * batch_size]
        xs, bs, ls = [], [], []
        for i in idx:
            x, b, lab = arrays.images[i], arrays.boxes[i], arrays.labels[i]
            if augment_images:
                x, b, lab = augment(x, b, lab, np.random.default_rng([seed, epoch, int(i)]), flip, scale, translate)
            xs.append(x)
            bs.append(b)
            ls.append(lab)
        yield (batch_images(np.stack(xs), spec.in_channels).astype(np.float32),
               assign_targets(bs, ls, spec, ignore_iou, lay, positives))
