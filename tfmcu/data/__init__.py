"""Data sets that install offline, for both tasks: one split type and one data set type (``split``), classification
(``classify``: installed IDX sets, class folders, the ``tf.data`` pipelines), COCO folders (``coco``), Pascal VOC
folders (``voc``), the scenes (``scenes``, ``scenes_det``: rendered from installed objects by one loader), pixels as
models take them (``images``);
``catalog`` says what a name means. ``python -m tfmcu.data`` installs MNIST, prints a summary, writes COCO.

Errors are ``DataError`` (a ``TfmcuError``) with one line saying what is missing and how to install it.
"""

from tfmcu.data.catalog import kind, load, load_detection
from tfmcu.data.split import DataError, Dataset, Split

__all__ = ["DataError", "Dataset", "Split", "kind", "load", "load_detection"]
