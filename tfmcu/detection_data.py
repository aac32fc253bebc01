"""Object-detection data: images with boxes and class labels, from detection scenes or a COCO-format folder.

Sources (``load_detection(name)``):

* ``scenes-det`` (``scenes-det:source=mnist,canvas=256,objects=0-6,...``): small Fashion-MNIST / MNIST objects with
  exact boxes on cluttered canvases (``tfmcu.scenes_det``), with their own train / val / test splits, in memory.
* any other name is a folder in COCO format, read with pycocotools: ``DIR/annotations.json``, or ``DIR/train.json``
  with optional ``DIR/val.json`` and ``DIR/test.json``. A split without a file of its own is a seeded
  ``val_fraction`` / ``test_fraction`` of the images of ``train.json`` (or ``annotations.json``). Images are found by
  their ``file_name`` under ``DIR`` or ``DIR/images`` and stay on disk (``DetSplit.images`` is then a list of paths).
  COCO boxes ``[x, y, w, h]`` become ``[x0, y0, x1, y1]`` (clipped to the image); category ids map to contiguous
  class ids 0..K-1 in sorted id order, with the categories' names; ``iscrowd`` annotations are left out; images
  without annotations stay (no boxes).

Boxes are float32 ``(n, 4)`` ``[x0, y0, x1, y1]`` in the image's pixels (``x1`` / ``y1`` exclusive, as COCO's
``x + w``), labels int32 ``(n,)``. ``write_coco`` writes a split as PNG images plus a COCO JSON that
``load_detection`` reads back to the same boxes and labels; ``resize_for_model`` turns images and boxes into model
inputs (the normalisation of ``tfmcu.data``) and boxes relative to the image.

Command line (a mistake prints one line and exits with status 2, and nothing is written)::

    python -m tfmcu.detection_data --dataset=scenes-det:train=200,val=50,test=50 --write_coco=out/coco
    python -m tfmcu.detection_data --dataset=out/coco          # a summary of the splits

Every user mistake (a missing folder or file, malformed JSON, an annotation of a missing image, a box with a
negative size, an unknown category) is a one-line ``DetectionDataError`` naming the file and the problem.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

import numpy as np
from pycocotools.coco import COCO

from tfmcu import data, files, scenes, scenes_det
from tfmcu.errors import TfmcuError

SPLITS = ("train", "val", "test")
ANNOTATIONS = "annotations.json"
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
_RGB_TO_GREY = np.array([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale's weights


class DetectionDataError(TfmcuError):
    """A detection data set that is missing, malformed or cannot be written; one line."""


@dataclass
class DetSplit:
    """One split: images with their boxes and labels.

    ``images`` is uint8 ``(N, H, W, C)`` in memory or a list of N image file paths; ``boxes[i]`` is float32
    ``(n_i, 4)`` ``[x0, y0, x1, y1]`` in image i's pixels, ``labels[i]`` int32 ``(n_i,)`` class ids, ``image_ids``
    int64 ``(N,)`` (the COCO image ids; 1..N for scenes)."""

    images: np.ndarray | list[str]
    boxes: list[np.ndarray]
    labels: list[np.ndarray]
    image_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def in_memory(self) -> bool:
        return isinstance(self.images, np.ndarray)

    def image(self, i: int) -> np.ndarray:
        """Image ``i`` as uint8 ``(H, W, C)`` (read from its file when the split holds paths)."""
        return self.images[i] if isinstance(self.images, np.ndarray) else read_image(self.images[i])

    def take(self, index: Sequence[int] | np.ndarray) -> "DetSplit":
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        images = self.images[index] if isinstance(self.images, np.ndarray) else [self.images[i] for i in index]
        return DetSplit(images, [self.boxes[i] for i in index], [self.labels[i] for i in index],
                        self.image_ids[index])


@dataclass
class DetDataset:
    name: str
    class_names: list[str]
    train: DetSplit
    val: DetSplit
    test: DetSplit
    channels: int  # channels of the stored images (1 grey, 3 RGB)
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> DetSplit:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


# ============================================================================= entry point
def load_detection(name: str, data_dir: str | None = None, seed: int = 0, val_fraction: float = 0.1,
                   test_fraction: float = 0.1) -> DetDataset:
    """``scenes-det[:key=value,...]`` (rendered; ``data_dir`` overrides where its object source's IDX files are) or a
    COCO-format folder (``seed``, ``val_fraction`` and ``test_fraction`` make the splits it has no file for)."""
    if scenes_det.is_name(name):
        try:
            config = scenes_det.parse_name(name)
        except scenes.SceneError as e:
            raise DetectionDataError(str(e)) from None
        assert config is not None
        return load_scenes_det(config, data_dir)
    return load_coco_folder(name, seed, val_fraction, test_fraction)


def load_scenes_det(config: scenes_det.DetSceneConfig, data_dir: str | None = None) -> DetDataset:
    """The detection scenes (``tfmcu.scenes_det``): train / val / test in memory, uint8, one channel; objects from
    the installed ``config.source`` (``data_dir`` overrides where its IDX files are)."""
    try:
        src = data.load(config.source, data_dir)
    except data.DataError as e:
        raise DetectionDataError(str(e)) from None
    if src.train.images is None or src.test.images is None:
        raise DetectionDataError(f"{scenes_det.NAME}: source {config.source} is not an in-memory IDX data set")
    train_idx, val_idx = scenes_det.object_pools(config, len(src.train))
    pools = {"train": (src.train.images[train_idx, ..., 0], src.train.labels[train_idx]),
             "val": (src.train.images[val_idx, ..., 0], src.train.labels[val_idx]),
             "test": (src.test.images[..., 0], src.test.labels)}
    splits = {}
    for split, n in (("train", config.train), ("val", config.val), ("test", config.test)):
        images, boxes, labels = scenes_det.render_split(config, split, *pools[split], n)
        splits[split] = DetSplit(images, boxes, labels, np.arange(1, n + 1, dtype=np.int64))
    return DetDataset(f"Detection scenes ({src.name})", list(src.class_names), splits["train"], splits["val"],
                      splits["test"], channels=1, source=config.describe(),
                      info={"scenes_det": {**scenes_det.config_dict(config), "object_source": src.source}})


# ============================================================================= COCO folders
def load_coco_folder(root: str, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1) -> DetDataset:
    """A COCO-format folder (see the module docstring)."""
    if not os.path.isdir(root):
        raise DetectionDataError(f"{root}: no such folder (give {scenes_det.NAME}[:key=value,...] or a COCO folder "
                                 f"with {ANNOTATIONS} or train.json)")
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise DetectionDataError(f"{key}={value}: expected 0 <= fraction < 1")
    if val_fraction + test_fraction >= 1:
        raise DetectionDataError(f"val_fraction + test_fraction = {val_fraction + test_fraction:g}: leaves no "
                                 f"training images")
    json_files = {s: os.path.join(root, f"{s}.json") for s in SPLITS
                  if os.path.isfile(os.path.join(root, f"{s}.json"))}
    single = os.path.join(root, ANNOTATIONS)
    if os.path.isfile(single) and json_files:
        raise DetectionDataError(f"{root}: both {ANNOTATIONS} and "
                                 f"{', '.join(s + '.json' for s in json_files)}; keep one layout")
    if os.path.isfile(single):
        json_files = {"train": single}
    if "train" not in json_files:
        what = (f"{', '.join(s + '.json' for s in json_files)} but no train.json" if json_files
                else "no annotation file")
        raise DetectionDataError(f"{root}: {what}; expected {ANNOTATIONS} or train.json (+ val.json, test.json)")
    class_ids, class_names, channels = None, None, 1
    splits: dict[str, DetSplit] = {}
    for split, path in json_files.items():
        coco = _read_coco(path)
        ids, names = _categories(coco, path)
        if class_ids is None:
            class_ids, class_names = ids, names
        elif (ids, names) != (class_ids, class_names):
            raise DetectionDataError(f"{path}: its categories differ from those of {json_files['train']}")
        splits[split], split_channels = _coco_split(coco, path, root, {c: k for k, c in enumerate(ids)})
        channels = max(channels, split_channels)
    assert class_names is not None
    info = {"files": {s: os.path.basename(p) for s, p in json_files.items()}}
    missing = [s for s in ("val", "test") if s not in splits]
    if missing:
        train = splits["train"]
        order = np.random.default_rng(seed).permutation(len(train))
        cut = {"test": int(round(len(train) * test_fraction)) if "test" in missing else 0,
               "val": int(round(len(train) * val_fraction)) if "val" in missing else 0}
        if cut["test"] + cut["val"] >= len(train):
            raise DetectionDataError(f"{json_files['train']}: {len(train)} images leave none for training after "
                                     f"val_fraction={val_fraction:g}, test_fraction={test_fraction:g}")
        parts = {"test": order[:cut["test"]], "val": order[cut["test"]:cut["test"] + cut["val"]],
                 "train": order[cut["test"] + cut["val"]:]}
        for s in ["train"] + missing:
            splits[s] = train.take(np.sort(parts[s]))
        info["held_out"] = {s: f"{val_fraction if s == 'val' else test_fraction:g} of "
                               f"{os.path.basename(json_files['train'])} (seed {seed})" for s in missing}
    return DetDataset(os.path.basename(os.path.normpath(root)) or root, class_names, splits["train"], splits["val"],
                      splits["test"], channels=channels, source=root, info=info)


def _read_coco(path: str) -> COCO:
    """``pycocotools.coco.COCO`` of an annotation file (its progress prints silenced); problems are one line."""
    layout = "expected a JSON object with lists 'images', 'annotations' and 'categories' of objects"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(path)
    except json.JSONDecodeError as e:
        raise DetectionDataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise DetectionDataError(f"{path}: not UTF-8 JSON text") from None
    except OSError as e:
        raise DetectionDataError(f"{path}: cannot read ({e.strerror or e})") from None
    except KeyError as e:
        raise DetectionDataError(f"{path}: an image, annotation or category lacks the field {e}") from None
    except (AssertionError, TypeError, AttributeError):
        raise DetectionDataError(f"{path}: {layout}") from None
    for key in ("images", "categories"):
        if not isinstance(coco.dataset.get(key), list):
            raise DetectionDataError(f"{path}: no '{key}' list; {layout}")
    if not isinstance(coco.dataset.get("annotations", []), list):
        raise DetectionDataError(f"{path}: 'annotations' is not a list; {layout}")
    return coco


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _categories(coco: COCO, path: str) -> tuple[list[int], list[str]]:
    """Category ids in sorted order and their names."""
    cats = coco.dataset["categories"]
    bad = [c["id"] for c in cats if not _is_int(c["id"])]
    if bad:
        raise DetectionDataError(f"{path}: category id {bad[0]!r} is not an integer")
    if not cats:
        raise DetectionDataError(f"{path}: no categories")
    if len(coco.cats) != len(cats):
        raise DetectionDataError(f"{path}: duplicate category ids")
    ids = sorted(coco.cats)
    return ids, [str(coco.cats[c].get("name", c)) for c in ids]


def _find_image(root: str, file_name: str) -> str | None:
    for folder in (root, os.path.join(root, "images")):
        p = os.path.join(folder, file_name)
        if os.path.isfile(p):
            return p
    return None


def _coco_split(coco: COCO, path: str, root: str, class_of: dict[int, int]) -> tuple[DetSplit, int]:
    """The images, boxes and labels of one annotation file, and its images' channels (1 if all grey, else 3)."""
    from PIL import Image

    images = coco.dataset["images"]
    if len(coco.imgs) != len(images):
        raise DetectionDataError(f"{path}: duplicate image ids")
    unknown = [i for i in coco.imgToAnns if i not in coco.imgs]
    if unknown:
        raise DetectionDataError(f"{path}: an annotation refers to image id {unknown[0]!r}, which is not among its "
                                 f"images")
    paths, boxes, labels, ids = [], [], [], []
    channels = 1
    for img in images:
        image_id, file_name = img["id"], img.get("file_name")
        if not _is_int(image_id):
            raise DetectionDataError(f"{path}: image id {image_id!r} is not an integer")
        if not isinstance(file_name, str) or not file_name:
            raise DetectionDataError(f"{path}: image id {image_id} has no file_name")
        found = _find_image(root, file_name)
        if found is None:
            raise DetectionDataError(f"{path}: image id {image_id}: {file_name} not found under {root} or "
                                     f"{os.path.join(root, 'images')}")
        try:
            with Image.open(found) as im:
                width, height = im.size
                if im.mode not in _GREY_MODES:
                    channels = 3
        except OSError as e:
            raise DetectionDataError(f"{found}: not a readable image ({str(e).splitlines()[0]})") from None
        if (img.get("width", width), img.get("height", height)) != (width, height):
            raise DetectionDataError(f"{path}: image id {image_id}: width x height {img.get('width')} x "
                                     f"{img.get('height')}, but {found} is {width} x {height}")
        b, lab = [], []
        for ann in coco.imgToAnns.get(image_id, []):
            if ann.get("iscrowd", 0):
                continue
            b.append(_box(ann, path, width, height))
            category = ann.get("category_id")
            if category not in class_of:
                raise DetectionDataError(f"{path}: annotation id {ann['id']}: category id {category!r} is not among "
                                         f"its categories ({', '.join(str(c) for c in class_of)})")
            lab.append(class_of[category])
        paths.append(found)
        boxes.append(np.array(b, np.float32).reshape(-1, 4))
        labels.append(np.array(lab, np.int32))
        ids.append(image_id)
    return DetSplit(paths, boxes, labels, np.array(ids, np.int64)), channels


def _box(ann: dict[str, Any], path: str, width: int, height: int) -> list[float]:
    """A COCO ``[x, y, w, h]`` as ``[x0, y0, x1, y1]`` clipped to the image; a bad bbox is one line."""
    bbox = ann.get("bbox")
    where = f"{path}: annotation id {ann['id']}: bbox {bbox!r}"
    if (not isinstance(bbox, list) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)):
        raise DetectionDataError(f"{where} is not 4 numbers [x, y, width, height]")
    x, y, w, h = (float(v) for v in bbox)
    if w < 0 or h < 0:
        raise DetectionDataError(f"{where} has a negative width or height")
    if w == 0 or h == 0:
        raise DetectionDataError(f"{where} has no area (width or height 0)")
    x0, y0, x1, y1 = max(x, 0.0), max(y, 0.0), min(x + w, float(width)), min(y + h, float(height))
    if x1 <= x0 or y1 <= y0:
        raise DetectionDataError(f"{where} lies outside the {width} x {height} image")
    return [x0, y0, x1, y1]


def read_image(path: str) -> np.ndarray:
    """An image file as uint8 ``(H, W, 1)`` (grey) or ``(H, W, 3)`` (anything else, converted to RGB)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            grey = im.mode in _GREY_MODES
            arr = np.asarray(im.convert("L" if grey else "RGB"))
    except OSError as e:
        raise DetectionDataError(f"{path}: not a readable image ({str(e).splitlines()[0]})") from None
    return arr[..., None] if grey else arr


# ============================================================================= writing
def write_coco(split: DetSplit, out_dir: str, split_name: str, class_names: Sequence[str]) -> str:
    """Write ``split`` as ``out_dir/images/<split_name>/<image id>.png`` (files of a path split are copied as they
    are) and ``out_dir/<split_name>.json`` (COCO: category id = class id + 1, named ``class_names``; ``area`` is the
    box's); returns the JSON's path. ``load_detection(out_dir)`` reads back the same boxes and labels."""
    from PIL import Image

    folder = os.path.join(out_dir, "images", split_name)
    os.makedirs(folder, exist_ok=True)
    images, annotations = [], []
    for i in range(len(split)):
        image_id = int(split.image_ids[i])
        if isinstance(split.images, np.ndarray):
            arr = split.images[i]
            file_name = f"{split_name}/{image_id:06d}.png"
            Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr).save(os.path.join(out_dir, "images",
                                                                                          file_name))
            height, width = arr.shape[:2]
        else:
            src = split.images[i]
            file_name = f"{split_name}/{image_id:06d}{os.path.splitext(src)[1].lower()}"
            shutil.copyfile(src, os.path.join(out_dir, "images", file_name))
            with Image.open(src) as im:
                width, height = im.size
        images.append({"id": image_id, "file_name": file_name, "width": int(width), "height": int(height)})
        for box, label in zip(split.boxes[i], split.labels[i]):
            x0, y0, x1, y1 = (float(v) for v in box)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(label) + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    categories = [{"id": k + 1, "name": str(n), "supercategory": ""} for k, n in enumerate(class_names)]
    path = os.path.join(out_dir, f"{split_name}.json")
    with open(path, "w") as f:
        json.dump({"info": {"description": f"tfmcu.detection_data.write_coco: {split_name}"}, "images": images,
                   "annotations": annotations, "categories": categories}, f)
    return path


def check_out_dir(out_dir: str, what: str = "--write_coco") -> None:
    """Raise ``DetectionDataError`` unless ``out_dir`` is free for a new COCO folder: absent, or an empty folder
    (an existing data set is never replaced)."""
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise DetectionDataError(f"{what}={out_dir}: already exists and is not an empty folder")


def write_coco_dataset(dataset: DetDataset, out_dir: str) -> list[str]:
    """All three splits of ``dataset`` as a COCO folder ``out_dir`` (train.json, val.json, test.json + images/),
    all-or-nothing (``files.assembled_folder``: assembled beside it, then renamed into place). ``out_dir`` must not
    exist, or be empty (``check_out_dir``). Returns the JSON paths."""
    check_out_dir(out_dir)
    try:
        with files.assembled_folder(out_dir, "--write_coco") as tmp:
            for s in SPLITS:
                write_coco(dataset.split(s), tmp, s, dataset.class_names)
    except OSError as e:
        raise DetectionDataError(f"{out_dir}: cannot write ({e.strerror or e})") from None
    return [os.path.join(out_dir, f"{s}.json") for s in SPLITS]


# ============================================================================= model inputs
def resize_for_model(images: np.ndarray | Sequence[np.ndarray] | Sequence[str], boxes: Sequence[np.ndarray],
                     resolution: int, channels: int = 3) -> tuple[np.ndarray, list[np.ndarray]]:
    """Images (uint8 ``(N, H, W, C)``, or a list of ``(H, W, C)`` arrays or paths of any sizes) resized bilinearly
    (half-pixel centres, as ``tf.image.resize``) to float32 ``(N, resolution, resolution, channels)`` normalised as
    ``tfmcu.data``: ``(pixel - 127.5) / 127.5``, grey replicated to 3 channels (or RGB to grey for ``channels=1``);
    and each image's boxes (pixels ``[x0, y0, x1, y1]``) as float32 fractions of its width and height, in [0, 1]."""
    if channels not in (1, 3):
        raise DetectionDataError(f"channels={channels}: expected 1 or 3")
    if len(images) != len(boxes):
        raise DetectionDataError(f"{len(images)} images but {len(boxes)} box arrays")
    out = np.zeros((len(images), resolution, resolution, channels), np.float32)
    rel = []
    for i, img in enumerate(images):
        arr = read_image(img) if isinstance(img, str) else np.asarray(img)
        if arr.ndim == 2:
            arr = arr[..., None]
        h, w = arr.shape[:2]
        x = arr.astype(np.float32)
        if (h, w) != (resolution, resolution):
            x = np.stack([scenes.resize(x[..., c], resolution, resolution) for c in range(x.shape[-1])], axis=-1)
        if channels == 3 and x.shape[-1] == 1:
            x = np.repeat(x, 3, axis=-1)
        elif channels == 1 and x.shape[-1] == 3:
            x = (x @ _RGB_TO_GREY)[..., None]
        out[i] = (np.clip(x, 0.0, 255.0) - data.NORM_MEAN) / data.NORM_STD
        b = np.asarray(boxes[i], np.float32).reshape(-1, 4) / np.array([w, h, w, h], np.float32)
        rel.append(np.clip(b, 0.0, 1.0))
    return out, rel


# ============================================================================= command line
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2 (argparse prints the usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="python -m tfmcu.detection_data",
                 description="Load a detection data set (scenes-det[:...] or a COCO folder); write it as COCO.")
    ap.add_argument("--dataset", required=True, help="scenes-det[:key=value,...] or a COCO folder")
    ap.add_argument("--data_dir", default=None, help="where the scenes' object source's IDX files are")
    ap.add_argument("--seed", type=int, default=0, help="seed of the val / test hold-out of a COCO folder")
    ap.add_argument("--val_fraction", type=float, default=0.1)
    ap.add_argument("--test_fraction", type=float, default=0.1)
    ap.add_argument("--write_coco", default=None, metavar="DIR",
                    help="write train.json, val.json, test.json and images/ into DIR (must not exist, or be empty)")
    args = ap.parse_args(argv)
    try:
        if args.write_coco:
            check_out_dir(args.write_coco)  # before the work
        ds = load_detection(args.dataset, args.data_dir, args.seed, args.val_fraction, args.test_fraction)
        sizes = ", ".join(f"{s} {len(ds.split(s))} images / {sum(len(b) for b in ds.split(s).boxes)} boxes"
                          for s in SPLITS)
        print(f"{ds.name}: {sizes}; {ds.num_classes} classes, {ds.channels} channel(s), from {ds.source}")
        if args.write_coco:
            paths = write_coco_dataset(ds, args.write_coco)
            print(f"wrote {', '.join(paths)}")
    except TfmcuError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
