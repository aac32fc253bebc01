"""What a data-set name means: the task it is for (``kind``) and the data set it loads.

Classification (``load``): ``fashion_mnist`` | ``mnist`` (installed IDX files, ``tfmcu.data.classify``),
``scenes[:key=value,...]`` (``tfmcu.data.scenes``), or a folder of class folders. Detection (``load_detection``):
``scenes-det[:key=value,...]`` (``tfmcu.data.scenes_det``), ``shapes-det[:key=value,...]``
(``tfmcu.data.shapes_det``), a COCO folder (``tfmcu.data.coco``) or a Pascal VOC
folder (``tfmcu.data.voc``); a folder followed by ``:classes=a,b`` keeps the boxes of those classes only, in that
order (e.g. ``coco2017:classes=person``). ``data_dir`` overrides where the IDX files are (for scenes: those of their
object source).
"""

from __future__ import annotations

import os

from tfmcu.data import classify, coco, scenes, scenes_det, shapes_det, voc
from tfmcu.data.split import DataError, Dataset, only_classes

CLASSIFY, DETECTION = "classify", "detection"


CLASSES = ":classes="  # a detection folder's class filter


def _folder(name: str) -> tuple[str, list[str] | None]:
    """A detection folder's path and the classes ``:classes=a,b`` keeps (None: all)."""
    if CLASSES in name:
        folder, classes = name.rsplit(CLASSES, 1)
        names = [c.strip() for c in classes.split(",") if c.strip()]
        if not names:
            raise DataError(f"--dataset={name}: {CLASSES} names no class")
        return folder, names
    return name, None


def kind(name: str) -> str | None:
    """``CLASSIFY`` or ``DETECTION`` when the name alone says which task a data set is for (None: a folder of either
    kind that does not exist, or cannot be told apart without reading it)."""
    folder = name.rsplit(CLASSES, 1)[0]
    if scenes_det.is_name(name) or shapes_det.is_name(name) or coco.is_coco_folder(folder) or voc.is_voc_folder(folder):
        return DETECTION
    if classify.canonical_name(name) or name.lower().split(":")[0] == scenes.SceneConfig.NAME:
        return CLASSIFY
    return None


def load(name: str, data_dir: str | None = None, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """A classification data set: ``fashion_mnist`` | ``mnist`` | ``scenes[:...]`` | a folder of class folders
    (``test_fraction`` and ``seed``: the test split of a folder without a test/ folder)."""
    if classify.canonical_name(name):
        return classify.load_builtin(name, data_dir)
    config = scenes.parse_name(name)
    if config is not None:
        return scenes.load_scenes(config, classify.load_builtin(config.source, data_dir))
    if os.path.isdir(name):
        return classify.load_folder(name, test_fraction, seed)
    raise DataError(f"--dataset={name}: not fashion_mnist, mnist or an existing folder of class folders (nor "
                    f"scenes[:key=value,...])")


def load_detection(name: str, data_dir: str | None = None, seed: int = 0, val_fraction: float = 0.1,
                   test_fraction: float = 0.1) -> Dataset:
    """A detection data set: ``scenes-det[:...]`` or ``shapes-det[:...]`` (rendered), a COCO-format or a VOC folder,
    with ``:classes=...`` (``seed``, ``val_fraction`` and ``test_fraction`` make the splits a folder has no file
    for)."""
    if scenes_det.is_name(name):
        config = scenes_det.parse_name(name)
        assert config is not None
        return scenes.load_scenes(config, classify.load_builtin(config.source, data_dir))
    if shapes_det.is_name(name):
        shapes = shapes_det.parse_name(name)
        assert shapes is not None
        return shapes_det.load_shapes(shapes)
    folder, classes = _folder(name)
    if voc.is_voc_folder(folder) and not coco.is_coco_folder(folder):
        ds = voc.load_voc(folder, seed, val_fraction, test_fraction)
    else:
        ds = coco.load_coco_folder(folder, seed, val_fraction, test_fraction)
    return ds if classes is None else only_classes(ds, classes)
