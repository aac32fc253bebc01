"""Detection data sets in Pascal VOC's layout, read as they are (``train --task=detection --dataset=VOC2012``) or
written as a COCO folder (``python -m tfmcu.data --dataset=VOC2012 --write_coco=DIR``).

A VOC folder ``DIR`` (e.g. ``VOCdevkit/VOC2012``) holds ``Annotations/<id>.xml``, ``JPEGImages/<id>.jpg`` and
``ImageSets/Main/train.txt`` with optional ``val.txt`` and ``test.txt`` (one image id per line); without
``ImageSets/Main/train.txt`` every annotation is the training set. A split without a list of its own is a seeded
``val_fraction`` / ``test_fraction`` of the training images (``tfmcu.data.split.hold_out``, as COCO folders).

Boxes: VOC's ``bndbox`` (1-based pixel corners, both inclusive) becomes ``[xmin - 1, ymin - 1, xmax, ymax]`` (clipped
to the image's ``size``); objects marked ``difficult`` are left out, as VOC's own evaluation ignores them. Classes:
every object name of the annotations, sorted (VOC's 20 for VOC itself; ``DIR:classes=person`` keeps some:
``tfmcu.data.catalog``). Every user
mistake (a missing folder, list or image, malformed XML, an id listed without its annotation, a box outside its
image) is a one-line ``DataError`` naming the file.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
import numpy as np

from tfmcu.data.split import DataError, Dataset, Split, check_fractions, hold_out

LISTS = os.path.join("ImageSets", "Main")


def is_voc_folder(name: str) -> bool:
    """Whether ``name`` is a folder in VOC's layout (``Annotations/`` and ``JPEGImages/``)."""
    return all(os.path.isdir(os.path.join(name, d)) for d in ("Annotations", "JPEGImages"))


def _object(obj: ET.Element, path: str, width: int, height: int) -> tuple[str, list[float]] | None:
    """One ``<object>``: its name and box, or None when it is marked difficult."""
    name = (obj.findtext("name") or "").strip()
    if not name:
        raise DataError(f"{path}: an object without a name")
    if (obj.findtext("difficult") or "0").strip() == "1":
        return None
    box = obj.find("bndbox")
    try:
        x0, y0, x1, y1 = (float(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        raise DataError(f"{path}: object '{name}' has no bndbox of four numbers (xmin, ymin, xmax, ymax)") from None
    b = [max(x0 - 1, 0.0), max(y0 - 1, 0.0), min(x1, float(width)), min(y1, float(height))]
    if b[2] <= b[0] or b[3] <= b[1]:
        raise DataError(f"{path}: object '{name}': bndbox ({x0:g}, {y0:g}, {x1:g}, {y1:g}) has no area inside the "
                        f"{width} x {height} image")
    return name, b


def _annotation(root: str, image_id: str) -> tuple[str, list[tuple[str, list[float]]]]:
    """The image path and the (name, box) objects of ``image_id``."""
    path = os.path.join(root, "Annotations", f"{image_id}.xml")
    try:
        tree = ET.parse(path).getroot()
    except FileNotFoundError:
        raise DataError(f"{path}: missing (image id '{image_id}' is listed, its annotation is not there)") from None
    except ET.ParseError as e:
        raise DataError(f"{path}: not well-formed XML ({e})") from None
    file_name = (tree.findtext("filename") or f"{image_id}.jpg").strip()
    image = os.path.join(root, "JPEGImages", file_name)
    if not os.path.isfile(image):
        raise DataError(f"{path}: its image {image} is missing")
    try:
        width, height = int(tree.findtext("size/width") or ""), int(tree.findtext("size/height") or "")
    except ValueError:
        from PIL import Image

        with Image.open(image) as im:
            width, height = im.size
    objects = [o for o in (_object(obj, path, width, height) for obj in tree.findall("object")) if o is not None]
    return image, objects


def _ids(root: str, split: str) -> list[str] | None:
    """The image ids of ``ImageSets/Main/<split>.txt`` (None: no such list)."""
    path = os.path.join(root, LISTS, f"{split}.txt")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return [line.split()[0] for line in f if line.strip()]


def load_voc(root: str, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1) -> Dataset:
    """A VOC folder (see the module docstring)."""
    if not is_voc_folder(root):
        raise DataError(f"{root}: not a VOC folder (expected Annotations/ and JPEGImages/)")
    check_fractions(root, val_fraction, test_fraction)
    lists = {s: _ids(root, s) for s in ("train", "val", "test")}
    if lists["train"] is None:
        lists["train"] = sorted(f[:-4] for f in os.listdir(os.path.join(root, "Annotations")) if f.endswith(".xml"))
        if not lists["train"]:
            raise DataError(f"{os.path.join(root, 'Annotations')}: no .xml annotation")
    read = {s: [(i, *_annotation(root, i)) for i in ids] for s, ids in lists.items() if ids is not None}
    names = sorted({name for rows in read.values() for _, _, objects in rows for name, _ in objects})
    class_of = {n: k for k, n in enumerate(names)}
    splits: dict[str, Split] = {}
    number = {}  # image id -> a COCO-style integer id, in the order of first listing
    for s, rows in read.items():
        paths, boxes, labels, ids = [], [], [], []
        for image_id, image, objects in rows:
            paths.append(image)
            boxes.append(np.array([b for _, b in objects], np.float32).reshape(-1, 4))
            labels.append(np.array([class_of[n] for n, _ in objects], np.int32))
            ids.append(number.setdefault(image_id, len(number) + 1))
        splits[s] = Split(labels, paths=np.asarray(paths, dtype=str), boxes=boxes, image_ids=np.array(ids, np.int64))
    info = {"files": {s: os.path.join(LISTS, f"{s}.txt") for s, ids in lists.items() if ids is not None
                      and os.path.isfile(os.path.join(root, LISTS, f"{s}.txt"))}}
    held = hold_out(splits, os.path.join(root, LISTS, "train.txt"), seed, val_fraction, test_fraction)
    if held:
        info["held_out"] = held
    return Dataset(os.path.basename(os.path.normpath(root)) or root, names, splits["train"], splits["test"],
                   channels=3, flip=True, source=root, info=info, val=splits["val"])
