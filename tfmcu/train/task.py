"""What a task is to the trainer (TF Model Garden's ``base_task``): its data, its model, its loss and metrics, its
batches, its validation and test figures, its int8 export and evaluation in TF Lite and TFLM, and its report
section. ``tfmcu.train.trainer`` runs any task -- float phase, QAT phase, checkpoints, resume, distribution -- and
hands each step's values to the next; a task keeps no state between the calls.

The tasks: ``tfmcu.train.classify.ClassifyTask`` and ``tfmcu.train.detect.DetectTask``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from tfmcu.data import catalog
from tfmcu.data.split import Dataset, Split
from tfmcu.graph.load import load_spec
from tfmcu.nets.spec import NetSpec
from tfmcu.train.config import TrainConfig, TrainError
from tfmcu.train.report import ClassifyResult, DetectResult

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What a task trains and tests on (``Task.build_inputs``)."""

    dataset: Dataset
    spec: NetSpec  # the spec that trains (checked against the data set)
    train: Split  # after the validation hold-out and train_subset
    val: Split
    test: Split  # the test images the Keras models are scored on (test_subset of the test split)
    flip: bool  # horizontal flips in the augmentation

    @property
    def resolution(self) -> int:
        return self.spec.resolution

    @property
    def channels(self) -> int:
        return self.spec.in_channels


@dataclass(frozen=True)
class Trained:
    """The Keras models of one phase: the spec's (what exports) and the one that trains (the spec's own, or a
    wrapper around it that a task's loss reads)."""

    spec_model: Any
    model: Any


@dataclass(frozen=True, kw_only=True)
class Exported:
    """The int8 .tflite a task exported."""

    model: bytes  # as written (with metadata)
    quantization: str  # how: "QAT ..." or "post-training quantization"
    calibration: int  # calibration images
    bytes_without_metadata: int | None = None
    notes: tuple[str, ...] = ()  # what the export changed


class Task(Protocol):
    """A task (module docstring). ``name`` is ``TrainConfig.task`` (and the ``tfmcu.data.kind`` of its data sets);
    ``head`` the head type of its specs; ``other_data`` / ``other_head`` what is wrong with a data set / a spec for
    another task (``check_names``); ``curves`` the panels of ``training_curves.png`` ((history key, label), ...)."""

    name: str
    head: str
    other_data: str
    other_head: str
    curves: tuple[tuple[str, str], ...]

    def build_inputs(self, cfg: TrainConfig, log: Log) -> Inputs:
        """The data set, the spec checked against it and the splits (before TensorFlow loads)."""

    def describe(self, inputs: Inputs) -> str:
        """The splits in a few words, for the run's first log line."""

    def training_model(self, spec_model: Any, spec: NetSpec) -> Any:
        """The model that trains: ``spec_model`` itself, or a model sharing its layers."""

    def compile(self, model: Any, opt: Any, cfg: TrainConfig, inputs: Inputs) -> None:
        """``model.compile`` with the task's loss and metrics."""

    def batches(self, inputs: Inputs, cfg: TrainConfig, seed: int, epoch: int, steps: int, augment: bool) -> Any:
        """One epoch of shuffled training batches (a ``tf.data.Dataset`` of (images, targets)), deterministic for
        (seed, epoch)."""

    def validate(self, model: Any, inputs: Inputs, cfg: TrainConfig) -> dict[str, float]:
        """The validation figures after an epoch (``val_*``; empty without a validation split)."""

    def epoch_summary(self, record: dict[str, Any]) -> str:
        """An epoch's figures in a few words."""

    def evaluate(self, trained: Trained, inputs: Inputs, cfg: TrainConfig, label: str, log: Log) -> Any:
        """The Keras model's test figures (``label``: "float" or "QAT")."""

    def export(self, cfg: TrainConfig, inputs: Inputs, trained: Trained, qat: bool, log: Log) -> Exported | None:
        """The full-int8 .tflite of the phase's spec model (None: the task's options skip it)."""

    def evaluate_int8(self, cfg: TrainConfig, inputs: Inputs, exported: Exported, phases: dict[str, Trained],
                      log: Log) -> Any:
        """The int8 model in TF Lite and TFLM on the test images (``phases``: the Keras models, by phase)."""

    def section(self, cfg: TrainConfig, inputs: Inputs, evals: dict[str, Any], exported: Exported | None,
                int8: Any) -> ClassifyResult | DetectResult:
        """The task's section of the report, from the test figures (``evals`` by phase) and the int8 ones."""

    def title(self, inputs: Inputs, section: Any) -> str:
        """The training curves' title."""

    def outputs(self, cfg: TrainConfig, inputs: Inputs, phases: dict[str, Trained], evals: dict[str, Any],
                section: Any) -> dict[str, tuple[str, Any]]:
        """The task's own output files: key -> (file name, content)."""


def task_spec(cfg: TrainConfig, ds: Dataset) -> NetSpec:
    """The spec ``cfg.model`` names, sized for ``ds`` (a preset takes the data set's classes; a spec JSON keeps its
    own)."""
    return load_spec(cfg.model, resolution=cfg.resolution, width=cfg.width,
                     num_classes=None if cfg.model.endswith(".json") else ds.num_classes)


def check_against_data(spec: NetSpec, ds: Dataset, where: str) -> None:
    """The spec's classes and input channels against the data set's (both tasks)."""
    if spec.head.num_classes != ds.num_classes:
        raise TrainError(f"{where}: the spec has {spec.head.num_classes} classes, {ds.name} has {ds.num_classes}; "
                         f"set head.num_classes to {ds.num_classes}")
    if spec.in_channels not in (1, 3):
        raise TrainError(f"{where}: the spec takes {spec.in_channels}-channel input; {ds.name} images give 1 "
                         f"(grey) or 3 (RGB) channels")
    if spec.in_channels == 1 and ds.channels == 3:
        raise TrainError(f"{where}: the spec takes 1-channel (grey) input, {ds.name} has colour images; use "
                         f"in_channels=3")


def check_names(task: Task, cfg: TrainConfig) -> None:
    """A data set or a model that is plainly for another task: one line each, before any data is read."""
    kind = catalog.kind(cfg.dataset)
    if kind is not None and kind != task.name:
        raise TrainError(f"--dataset={cfg.dataset}: {task.other_data}")
    check_head(task, load_spec(cfg.model, resolution=cfg.resolution, width=cfg.width), cfg.model)


def check_head(task: Task, spec: NetSpec, where: str) -> None:
    if spec.head.type != task.head:
        raise TrainError(f"{where}: {task.other_head.format(head=spec.head.type)}")


def flip(cfg: TrainConfig, ds: Dataset) -> bool:
    """Horizontal flips: the data set's say (not for digits) unless the recipe decides."""
    return ds.flip if cfg.recipe.flip == "auto" else cfg.recipe.flip == "yes"
