"""Pixels as a model takes them: the one normalisation (``(pixel - NORM_MEAN) / NORM_STD``, what the .tflite
metadata records), a NumPy bilinear resize (half-pixel centres, as ``tf.image.resize``), and images with boxes resized
for a detector (``resize_for_model``, ``model_inputs``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tfmcu.data.split import DataError, Split, read_image

NORM_MEAN = 127.5
NORM_STD = 127.5
RGB_TO_GREY = np.array([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale's weights


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


def resize_for_model(images: np.ndarray | Sequence[np.ndarray] | Sequence[str], boxes: Sequence[np.ndarray],
                     resolution: int, channels: int = 3) -> tuple[np.ndarray, list[np.ndarray]]:
    """Images (uint8 ``(N, H, W, C)``, or a list of ``(H, W, C)`` arrays or paths of any sizes) resized bilinearly
    to float32 ``(N, resolution, resolution, channels)`` and normalised, grey replicated to 3 channels (or RGB to
    grey for ``channels=1``); and each image's boxes (pixels ``[x0, y0, x1, y1]``) as float32 fractions of its width
    and height, in [0, 1]."""
    if channels not in (1, 3):
        raise DataError(f"channels={channels}: expected 1 or 3")
    if len(images) != len(boxes):
        raise DataError(f"{len(images)} images but {len(boxes)} box arrays")
    out = np.zeros((len(images), resolution, resolution, channels), np.float32)
    rel = []
    for i, img in enumerate(images):
        arr = read_image(img) if isinstance(img, str) else np.asarray(img)
        if arr.ndim == 2:
            arr = arr[..., None]
        h, w = arr.shape[:2]
        x = arr.astype(np.float32)
        if (h, w) != (resolution, resolution):
            x = np.stack([resize(x[..., c], resolution, resolution) for c in range(x.shape[-1])], axis=-1)
        if channels == 3 and x.shape[-1] == 1:
            x = np.repeat(x, 3, axis=-1)
        elif channels == 1 and x.shape[-1] == 3:
            x = (x @ RGB_TO_GREY)[..., None]
        out[i] = (np.clip(x, 0.0, 255.0) - NORM_MEAN) / NORM_STD
        b = np.asarray(boxes[i], np.float32).reshape(-1, 4) / np.array([w, h, w, h], np.float32)
        rel.append(np.clip(b, 0.0, 1.0))
    return out, rel


def model_inputs(split: Split, resolution: int, channels: int = 3) -> tuple[np.ndarray, list[np.ndarray]]:
    """``resize_for_model`` of a detection split's images and boxes."""
    return resize_for_model(split.stored, split.boxes, resolution, channels)
