"""Training configuration: the recipe (``Recipe``), what detection adds to it (``DetectionOptions``) and the run
(``TrainConfig``), with each task's defaults (``default_config``). Errors the user can fix are ``TrainError`` (one
line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import json
from dataclasses import dataclass, field

from tfmcu.errors import TfmcuError
from tfmcu.nets.spec import NetSpec

STRATEGIES = ("default", "mirrored", "multi_worker")
TASKS = ("classify", "detection")
ANCHOR_SOURCES = ("kmeans", "spec")
OPTIMIZERS = ("sgd", "adam")


class TrainError(TfmcuError):
    """A training setting, checkpoint or spec that cannot be used; one line."""


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Training hyper-parameters: the MCUNetV2 recipe (SGD 0.9, lr 0.2 at batch 1024, cosine, wd 4e-5, QAT 10
    epochs; the paper fine-tunes at 1/10 of the learning rate) scaled down to small data sets and 2 CPU cores."""

    optimizer: str = "sgd"  # sgd: SGD with momentum | adam: Adam (weight decay decoupled, as AdamW)
    epochs: int = 15
    qat_epochs: int = 3
    batch_size: int = 128
    lr: float = 0.1
    qat_lr: float | None = None  # default lr / 10
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 4e-5
    label_smoothing: float = 0.0
    warmup_epochs: float = 0.0
    bn_momentum: float = 0.99  # the builder's Keras default is 0.999: too slow for short runs
    bn_recalibration_batches: int = 20  # re-estimate BN statistics after training (0: off)
    augment: bool = True
    flip: str = "auto"  # auto (per data set) | yes | no

    def validate(self) -> "Recipe":
        checks = [
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}"),
            (self.epochs >= 0, "epochs must be >= 0"),
            (self.qat_epochs >= 0, "qat_epochs must be >= 0"),
            (self.epochs + self.qat_epochs > 0, "nothing to train: epochs and qat_epochs are both 0"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.lr > 0, "lr must be > 0"),
            (self.qat_lr is None or self.qat_lr > 0, "qat_lr must be > 0"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (0 <= self.warmup_epochs <= max(self.epochs, 0), "warmup_epochs must be in [0, epochs]"),
            (self.flip in ("auto", "yes", "no"), "flip must be auto, yes or no"),
            (0 < self.bn_momentum < 1, "bn_momentum must be in (0, 1)"),
            (self.bn_recalibration_batches >= 0, "bn_recalibration_batches must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise TrainError(msg)
        return self


BOX_LOSSES = ("giou", "ciou", "smooth_l1")


@dataclass(frozen=True, kw_only=True)
class DetectionOptions:
    """What detection training adds to the recipe (``tfmcu.train.detection`` documents each part)."""

    anchors: str = "kmeans"  # kmeans: fit to the training boxes (k = the spec's anchor count) | spec: keep the spec's
    ignore_iou: float = 0.5  # an unassigned anchor whose box overlaps a true box more than this: no no-object loss
    positives: str = "multi"  # multi: several anchors and cells per box (YOLOv5) | best: one anchor per box (YOLOv3)
    box_weight: float = 1.0  # the box loss on assigned anchors
    box_loss: str = "giou"  # giou / ciou: 1 - GIoU / CIoU of the decoded boxes | smooth_l1: of the encodings
    box_l1: float = 0.05  # giou / ciou: plus this x smooth-L1 of the encodings (keeps far-off boxes learning)
    obj_iou: float = 0.5  # an assigned anchor's objectness target: 1 - obj_iou + obj_iou x its box's IoU (YOLOv5's gr)
    noobj_weight: float = 0.5  # objectness BCE of the unassigned, not-ignored anchors (assigned ones weigh 1)
    class_weight: float = 1.0  # class BCE, on assigned anchors
    scale: float = 0.25  # augmentation: random zoom in [1 - scale, 1 + scale]
    translate: float = 0.125  # augmentation: random shift of up to this fraction of the image, per axis
    score_threshold: float = 0.01  # evaluation: detections scoring below are dropped before NMS
    iou_threshold: float = 0.5  # evaluation: NMS suppresses a box overlapping a higher-scoring one more than this
    max_detections: int = 100  # evaluation: detections per image after NMS (COCO counts up to 100)
    plot_images: int = 8  # test images drawn in detections.png
    int8: bool = True  # export the full-int8 .tflite with DETECTION_POSTPROCESS; its mAP in TF Lite and TFLM

    @property
    def l1_term(self) -> float:
        """The weight of the smooth-L1 term the IoU box loss adds (none with ``box_loss="smooth_l1"``: it is all
        smooth-L1 already)."""
        return 0.0 if self.box_loss == "smooth_l1" else self.box_l1

    def validate(self) -> "DetectionOptions":
        checks = [
            (self.anchors in ANCHOR_SOURCES, f"anchors must be one of {', '.join(ANCHOR_SOURCES)}"),
            (0 < self.ignore_iou <= 1, "ignore_iou must be in (0, 1]"),
            (self.positives in ("best", "multi"), "positives must be best or multi"),
            (self.box_loss in BOX_LOSSES, f"box_loss must be one of {', '.join(BOX_LOSSES)}"),
            (0 <= self.obj_iou <= 1, "obj_iou must be in [0, 1]"),
            (self.box_l1 >= 0, "box_l1 must be >= 0"),
            (self.obj_iou == 0 or self.box_loss != "smooth_l1",
             "obj_iou > 0 needs box_loss giou or ciou (the loss decodes the boxes to measure their IoU)"),
            (self.box_weight >= 0 and self.noobj_weight >= 0 and self.class_weight >= 0,
             "the loss weights must be >= 0"),
            (0 <= self.scale < 1, "scale must be in [0, 1)"),
            (0 <= self.translate <= 0.5, "translate must be in [0, 0.5]"),
            (0 <= self.score_threshold < 1, "score_threshold must be in [0, 1)"),
            (0 < self.iou_threshold <= 1, "iou_threshold must be in (0, 1]"),
            (self.max_detections >= 1, "max_detections must be >= 1"),
            (self.plot_images >= 0, "plot_images must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise TrainError(msg)
        return self


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: the model, the data, the recipe and the run's settings. The defaults are classification's;
    ``default_config("detection")`` gives detection's."""

    model: str = "mcunet-demo"  # preset name or spec JSON
    dataset: str = "fashion_mnist"  # fashion_mnist | mnist | scenes[:key=value,...] | folder of class folders
    data_dir: str | None = None  # where the IDX files are (default: the installed location)
    resolution: int | None = None  # default: the spec's
    width: float | None = None
    recipe: Recipe = field(default_factory=Recipe)
    val_split: float = 5000  # samples (or a fraction < 1) held out of the training set (not for scenes: its own)
    train_subset: int | None = None  # train on a seeded subset of this many samples
    steps_per_epoch: int | None = None  # cap the steps of an epoch
    qat_steps_per_epoch: int | None = None  # cap the steps of a QAT epoch (default: as float epochs)
    test_subset: int | None = None  # Keras float / QAT accuracy on a seeded subset of N test samples (None: all)
    int8_eval_samples: int | None = None  # TF Lite / TFLM accuracy on a seeded subset of N test samples (None: all)
    calibration_samples: int = 256
    classifier_as_conv: bool = True  # export the classifier as a 1x1 CONV_2D (see classifier_as_conv)
    test_fraction: float = 0.2  # folder data sets without a test/ folder
    seed: int = 0
    deterministic: bool = True
    strategy: str = "default"  # default | mirrored | multi_worker
    resume: bool = False
    init_weights: str | None = None  # start from these Keras weights (.h5 of the same spec: a searched sub-network)
    init_backbone: str | None = None  # start the layers of the same name and shapes from a run's folder or an .h5
    verbose: int | None = None  # Keras fit verbosity (None: progress bar on a terminal, one line per epoch else)
    task: str = "classify"  # classify | detection (a yolo spec on scenes-det or a COCO folder)
    detection: DetectionOptions = field(default_factory=DetectionOptions)  # task "detection" only

    def validate(self) -> "TrainConfig":
        """The settings, checked before any data is read or TensorFlow loads."""
        self.recipe.validate()
        if self.task not in TASKS:
            raise TrainError(f"unknown task '{self.task}'; known: {', '.join(TASKS)}")
        if self.strategy not in STRATEGIES:
            raise TrainError(f"unknown strategy '{self.strategy}'; known: {', '.join(STRATEGIES)}")
        if self.calibration_samples < 1:
            raise TrainError("calibration_samples must be >= 1")
        if self.task == "detection":
            self.detection.validate()
        if self.init_weights and self.init_backbone:
            raise TrainError("give --init_weights (this very spec's weights) or --init_backbone (the layers of the "
                             "same name), not both")
        if self.init_backbone:
            backbone_weights(self.init_backbone)
        return self

    def fingerprint(self, spec: NetSpec) -> str:
        """What a checkpoint depends on: resuming with other settings would silently train something else."""
        recipe = {k: v for k, v in dataclasses.asdict(self.recipe).items() if RECIPE_ADDED_LATER.get(k, object()) != v}
        keep = {"spec": spec.to_dict(), "dataset": self.dataset, "recipe": recipe,
                "val_split": self.val_split, "train_subset": self.train_subset,
                "steps_per_epoch": self.steps_per_epoch, "qat_steps_per_epoch": self.qat_steps_per_epoch,
                "seed": self.seed, "init_weights": _file_digest(self.init_weights, "--init_weights")}
        if self.init_backbone:  # (a fingerprint without it stays what it was before it existed)
            keep["init_backbone"] = _file_digest(backbone_weights(self.init_backbone), "--init_backbone")
        if self.task != "classify":  # (a classification fingerprint stays what it was before detection)
            keep["task"] = self.task
            keep["detection"] = {k: v for k, v in dataclasses.asdict(self.detection).items()
                                 if k not in _EVALUATION_ONLY and DETECTION_ADDED_LATER.get(k, object()) != v}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


# Detection options that change only the evaluation, not the trained weights (not part of the fingerprint).
_EVALUATION_ONLY = ("score_threshold", "iou_threshold", "max_detections", "plot_images", "int8")
# Detection options added after runs were checkpointed, and their values then: left out of the fingerprint when they
# have them, so those runs still resume.
DETECTION_ADDED_LATER = {"positives": "best", "box_loss": "smooth_l1", "obj_iou": 0.0, "box_l1": 0.0}
RECIPE_ADDED_LATER = {"optimizer": "sgd"}


def default_config(task: str = "classify", **changes) -> TrainConfig:
    """A task's default run, with ``changes``: classification's are ``TrainConfig()``'s; detection trains
    ``mbv2-det2-w035`` on ``scenes-det`` with a shorter, warmed-up SGD recipe and no QAT by default (``qat_epochs`` > 0
    adds it), and holds a tenth of a COCO folder's training images out for validation and test when it has no files
    for them."""
    if task == "classify":
        return dataclasses.replace(TrainConfig(), **changes)
    if task == "detection":
        recipe = Recipe(epochs=30, qat_epochs=0, batch_size=16, lr=0.05, warmup_epochs=1.0)
        return TrainConfig(**{"model": "mbv2-det2-w035", "dataset": "scenes-det", "recipe": recipe, "task": task,
                              "val_split": 0.1, "test_fraction": 0.1, **changes})
    raise TrainError(f"unknown task '{task}'; known: {', '.join(TASKS)}")


def _file_digest(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError as e:
        raise TrainError(f"{flag}={path}: cannot read ({e.strerror})") from None


BACKBONE_WEIGHTS = "model_float_weights.h5"  # what every training run writes: its float model's Keras weights


def backbone_weights(path: str) -> str:
    """The Keras weights file ``--init_backbone=path`` names: a training run's folder (its ``BACKBONE_WEIGHTS``) or
    an .h5 weights file; anything else is a one-line ``TrainError``."""
    if os.path.isdir(path):
        found = os.path.join(path, BACKBONE_WEIGHTS)
        if not os.path.isfile(found):
            raise TrainError(f"--init_backbone={path}: a folder without {BACKBONE_WEIGHTS} (give a training run's "
                             f"folder, or a Keras .h5 weights file)")
        return found
    if not os.path.isfile(path):
        raise TrainError(f"--init_backbone={path}: no such file or folder")
    if not path.endswith(".h5"):
        raise TrainError(f"--init_backbone={path}: expected a training run's folder or a Keras .h5 weights file")
    return path
