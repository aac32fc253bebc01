"""Training configuration: the recipe (``Recipe``), the run (``TrainConfig``) and the spec it trains.

``Recipe`` is the MCUNetV2 training recipe scaled down to small data sets and 2 CPU cores; ``TrainConfig`` adds the
model, the data and the run's settings; ``resolve_spec`` checks the spec against the data set. Errors the user can fix
are ``TrainError`` (one line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from tfmcu.errors import TfmcuError
from tfmcu.graph.load import load_spec
from tfmcu.nets.spec import NetSpec
from tfmcu import data as data_mod

STRATEGIES = ("default", "mirrored", "multi_worker")


class TrainError(TfmcuError):
    """A training setting, checkpoint or spec that cannot be used; one line."""


@dataclass
class Recipe:
    """Training hyper-parameters: the MCUNetV2 recipe (SGD 0.9, lr 0.2 at batch 1024, cosine, wd 4e-5, QAT 10
    epochs; the paper fine-tunes at 1/10 of the learning rate) scaled down to small data sets and 2 CPU cores."""

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


@dataclass
class TrainConfig:
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
    verbose: int | None = None  # Keras fit verbosity (None: progress bar on a terminal, one line per epoch else)

    def fingerprint(self, spec: NetSpec) -> str:
        """What a checkpoint depends on: resuming with other settings would silently train something else."""
        keep = {"spec": spec.to_dict(), "dataset": self.dataset, "recipe": dataclasses.asdict(self.recipe),
                "val_split": self.val_split, "train_subset": self.train_subset,
                "steps_per_epoch": self.steps_per_epoch, "qat_steps_per_epoch": self.qat_steps_per_epoch,
                "seed": self.seed, "init_weights": _file_digest(self.init_weights)}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError as e:
        raise TrainError(f"--init_weights={path}: cannot read ({e.strerror})") from None


def resolve_spec(cfg: TrainConfig, ds: data_mod.Dataset) -> NetSpec:
    """The spec to train, checked against the data set: classes, channels, resolution."""
    is_json = cfg.model.endswith(".json")
    spec = load_spec(cfg.model, resolution=cfg.resolution, width=cfg.width,
                            num_classes=None if is_json else ds.num_classes)
    where = cfg.model
    if spec.head.num_classes == 0 or spec.head.pooling != "avg":
        raise TrainError(f"{where}: the spec has no classifier (head.num_classes=0); set head.num_classes to "
                         f"{ds.num_classes} for {ds.name}")
    if spec.head.num_classes != ds.num_classes:
        raise TrainError(f"{where}: the spec has {spec.head.num_classes} classes, {ds.name} has {ds.num_classes}; "
                         f"set head.num_classes to {ds.num_classes}")
    if spec.in_channels not in (1, 3):
        raise TrainError(f"{where}: the spec takes {spec.in_channels}-channel input; {ds.name} images give 1 "
                         f"(grey) or 3 (RGB) channels")
    if spec.in_channels == 1 and ds.channels == 3:
        raise TrainError(f"{where}: the spec takes 1-channel (grey) input, {ds.name} has colour images; use "
                         f"in_channels=3")
    return spec
