"""Detection data sets in COCO format, read with pycocotools and written back.

A COCO folder ``DIR`` holds ``DIR/annotations.json``, or ``DIR/train.json`` with optional ``DIR/val.json`` and
``DIR/test.json``. A split without a file of its own is a seeded ``val_fraction`` / ``test_fraction`` of the images of
``train.json`` (or ``annotations.json``). Images are found by their ``file_name`` under ``DIR`` or ``DIR/images`` and
stay on disk (the splits hold paths). COCO boxes ``[x, y, w, h]`` become ``[x0, y0, x1, y1]`` (clipped to the image);
category ids map to contiguous class ids 0..K-1 in sorted id order, with the categories' names; ``iscrowd``
annotations are left out; images without annotations stay (no boxes).

``write_coco`` writes a split as PNG images plus a COCO JSON that ``load_coco_folder`` reads back to the same boxes
and labels. Every user mistake (a missing folder or file, malformed JSON, an annotation of a missing image, a box with
a negative size, an unknown category) is a one-line ``DataError`` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
from typing import Any, Sequence

import numpy as np
from pycocotools.coco import COCO

from tfmcu import files
from tfmcu.data.split import GREY_MODES, DataError, Dataset, Split, check_fractions, hold_out

SPLITS = ("train", "val", "test")
ANNOTATIONS = "annotations.json"


def is_coco_folder(name: str) -> bool:
    """Whether ``name`` is a folder with a COCO annotation file (``annotations.json`` or ``train.json``)."""
    return os.path.isdir(name) and any(os.path.isfile(os.path.join(name, f)) for f in (ANNOTATIONS, "train.json"))


# ============================================================================= COCO folders
def load_coco_folder(root: str, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1) -> Dataset:
    """A COCO-format folder (see the module docstring)."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder (give scenes-det[:key=value,...] or a COCO folder "
                                 f"with {ANNOTATIONS} or train.json)")
    check_fractions(root, val_fraction, test_fraction)
    json_files = {s: os.path.join(root, f"{s}.json") for s in SPLITS
                  if os.path.isfile(os.path.join(root, f"{s}.json"))}
    single = os.path.join(root, ANNOTATIONS)
    if os.path.isfile(single) and json_files:
        raise DataError(f"{root}: both {ANNOTATIONS} and "
                                 f"{', '.join(s + '.json' for s in json_files)}; keep one layout")
    if os.path.isfile(single):
        json_files = {"train": single}
    if "train" not in json_files:
        what = (f"{', '.join(s + '.json' for s in json_files)} but no train.json" if json_files
                else "no annotation file")
        raise DataError(f"{root}: {what}; expected {ANNOTATIONS} or train.json (+ val.json, test.json)")
    class_ids, class_names, channels = None, None, 1
    splits: dict[str, Split] = {}
    for split, path in json_files.items():
        coco = _read_coco(path)
        ids, names = _categories(coco, path)
        if class_ids is None:
            class_ids, class_names = ids, names
        elif (ids, names) != (class_ids, class_names):
            raise DataError(f"{path}: its categories differ from those of {json_files['train']}")
        splits[split], split_channels = _coco_split(coco, path, root, {c: k for k, c in enumerate(ids)})
        channels = max(channels, split_channels)
    assert class_names is not None
    info = {"files": {s: os.path.basename(p) for s, p in json_files.items()}}
    held = hold_out(splits, json_files["train"], seed, val_fraction, test_fraction)
    if held:
        info["held_out"] = held
    return Dataset(os.path.basename(os.path.normpath(root)) or root, class_names, splits["train"], splits["test"],
                   channels=channels, flip=True, source=root, info=info, val=splits["val"])


def _read_coco(path: str) -> COCO:
    """``pycocotools.coco.COCO`` of an annotation file (its progress prints silenced); problems are one line."""
    layout = "expected a JSON object with lists 'images', 'annotations' and 'categories' of objects"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(path)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 JSON text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    except KeyError as e:
        raise DataError(f"{path}: an image, annotation or category lacks the field {e}") from None
    except (AssertionError, TypeError, AttributeError):
        raise DataError(f"{path}: {layout}") from None
    for key in ("images", "categories"):
        if not isinstance(coco.dataset.get(key), list):
            raise DataError(f"{path}: no '{key}' list; {layout}")
    if not isinstance(coco.dataset.get("annotations", []), list):
        raise DataError(f"{path}: 'annotations' is not a list; {layout}")
    return coco


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _categories(coco: COCO, path: str) -> tuple[list[int], list[str]]:
    """Category ids in sorted order and their names."""
    cats = coco.dataset["categories"]
    bad = [c["id"] for c in cats if not _is_int(c["id"])]
    if bad:
        raise DataError(f"{path}: category id {bad[0]!r} is not an integer")
    if not cats:
        raise DataError(f"{path}: no categories")
    if len(coco.cats) != len(cats):
        raise DataError(f"{path}: duplicate category ids")
    ids = sorted(coco.cats)
    return ids, [str(coco.cats[c].get("name", c)) for c in ids]


def _find_image(root: str, file_name: str) -> str | None:
    for folder in (root, os.path.join(root, "images")):
        p = os.path.join(folder, file_name)
        if os.path.isfile(p):
            return p
    return None


def _coco_split(coco: COCO, path: str, root: str, class_of: dict[int, int]) -> tuple[Split, int]:
    """The images, boxes and labels of one annotation file, and its images' channels (1 if all grey, else 3)."""
    from PIL import Image

    images = coco.dataset["images"]
    if len(coco.imgs) != len(images):
        raise DataError(f"{path}: duplicate image ids")
    unknown = [i for i in coco.imgToAnns if i not in coco.imgs]
    if unknown:
        raise DataError(f"{path}: an annotation refers to image id {unknown[0]!r}, which is not among its "
                                 f"images")
    paths, boxes, labels, ids = [], [], [], []
    channels = 1
    for img in images:
        image_id, file_name = img["id"], img.get("file_name")
        if not _is_int(image_id):
            raise DataError(f"{path}: image id {image_id!r} is not an integer")
        if not isinstance(file_name, str) or not file_name:
            raise DataError(f"{path}: image id {image_id} has no file_name")
        found = _find_image(root, file_name)
        if found is None:
            raise DataError(f"{path}: image id {image_id}: {file_name} not found under {root} or "
                                     f"{os.path.join(root, 'images')}")
        try:
            with Image.open(found) as im:
                width, height = im.size
                if im.mode not in GREY_MODES:
                    channels = 3
        except OSError as e:
            raise DataError(f"{found}: not a readable image ({str(e).splitlines()[0]})") from None
        if (img.get("width", width), img.get("height", height)) != (width, height):
            raise DataError(f"{path}: image id {image_id}: width x height {img.get('width')} x "
                                     f"{img.get('height')}, but {found} is {width} x {height}")
        b, lab = [], []
        for ann in coco.imgToAnns.get(image_id, []):
            if ann.get("iscrowd", 0):
                continue
            b.append(_box(ann, path, width, height))
            category = ann.get("category_id")
            if category not in class_of:
                raise DataError(f"{path}: annotation id {ann['id']}: category id {category!r} is not among "
                                         f"its categories ({', '.join(str(c) for c in class_of)})")
            lab.append(class_of[category])
        paths.append(found)
        boxes.append(np.array(b, np.float32).reshape(-1, 4))
        labels.append(np.array(lab, np.int32))
        ids.append(image_id)
    return Split(labels, paths=np.asarray(paths, dtype=str), boxes=boxes, image_ids=np.array(ids, np.int64)), channels


def _box(ann: dict[str, Any], path: str, width: int, height: int) -> list[float]:
    """A COCO ``[x, y, w, h]`` as ``[x0, y0, x1, y1]`` clipped to the image; a bad bbox is one line."""
    bbox = ann.get("bbox")
    where = f"{path}: annotation id {ann['id']}: bbox {bbox!r}"
    if (not isinstance(bbox, list) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)):
        raise DataError(f"{where} is not 4 numbers [x, y, width, height]")
    x, y, w, h = (float(v) for v in bbox)
    if w < 0 or h < 0:
        raise DataError(f"{where} has a negative width or height")
    if w == 0 or h == 0:
        raise DataError(f"{where} has no area (width or height 0)")
    x0, y0, x1, y1 = max(x, 0.0), max(y, 0.0), min(x + w, float(width)), min(y + h, float(height))
    if x1 <= x0 or y1 <= y0:
        raise DataError(f"{where} lies outside the {width} x {height} image")
    return [x0, y0, x1, y1]


# ============================================================================= writing
def write_coco(split: Split, out_dir: str, split_name: str, class_names: Sequence[str]) -> str:
    """Write ``split`` as ``out_dir/images/<split_name>/<image id>.png`` (files of a path split are copied as they
    are) and ``out_dir/<split_name>.json`` (COCO: category id = class id + 1, named ``class_names``; ``area`` is the
    box's); returns the JSON's path. ``load_detection(out_dir)`` reads back the same boxes and labels."""
    from PIL import Image

    folder = os.path.join(out_dir, "images", split_name)
    os.makedirs(folder, exist_ok=True)
    images, annotations = [], []
    for i in range(len(split)):
        image_id = int(split.image_ids[i])
        if split.in_memory:
            arr = split.images[i]
            file_name = f"{split_name}/{image_id:06d}.png"
            Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr).save(os.path.join(out_dir, "images",
                                                                                          file_name))
            height, width = arr.shape[:2]
        else:
            src = str(split.paths[i])
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
        json.dump({"info": {"description": f"tfmcu.data.coco.write_coco: {split_name}"}, "images": images,
                   "annotations": annotations, "categories": categories}, f)
    return path


def check_out_dir(out_dir: str, what: str = "--write_coco") -> None:
    """Raise ``DataError`` unless ``out_dir`` is free for a new COCO folder: absent, or an empty folder
    (an existing data set is never replaced)."""
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise DataError(f"{what}={out_dir}: already exists and is not an empty folder")


def write_coco_dataset(dataset: Dataset, out_dir: str) -> list[str]:
    """All three splits of ``dataset`` as a COCO folder ``out_dir`` (train.json, val.json, test.json + images/),
    all-or-nothing (``files.assembled_folder``: assembled beside it, then renamed into place). ``out_dir`` must not
    exist, or be empty (``check_out_dir``). Returns the JSON paths."""
    check_out_dir(out_dir)
    try:
        with files.assembled_folder(out_dir, "--write_coco") as tmp:
            for s in SPLITS:
                write_coco(dataset.split(s), tmp, s, dataset.class_names)
    except OSError as e:
        raise DataError(f"{out_dir}: cannot write ({e.strerror or e})") from None
    return [os.path.join(out_dir, f"{s}.json") for s in SPLITS]
