"""The typed result of a training run: ``TrainReport``, what ``tfmcu.train.train`` returns and writes as
``train_report.json`` (a ``tfmcu.records.Record``: ``to_json`` / ``from_json``), with a section per task --
``classification`` (``ClassifyResult``: accuracy, TF Lite against TFLM, the confusion matrix, memory, Flash, MACs) or
``detection`` (``DetectResult``: anchors, COCO mAP of each model, the int8 detector's figures) -- and its summary
lines.

The JSON keeps one flat object: the run's fields, then the section's (``accuracy``, ``memory``, ... or
``detection`` (the options), ``anchors``, ``map50``, ``map``, ``evaluation``, ``int8``: ``tfmcu.records.flat``), then
``timing_s`` and ``files``. TF Lite against TFLM is ``tfmcu.runtime.agreement.Agreement`` (a rounding tie in a
FULLY_CONNECTED head is no disagreement). Benches, flows and tests read reports through ``TrainReport.from_json`` /
``TrainReport.read``, never by string keys; reports written before the agreement counted ties read as having none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tfmcu.nets.spec import NetSpec
from tfmcu.records import Record, coded, extra, flat, named, optional
from tfmcu.runtime.agreement import Agreement
from tfmcu.train.config import DETECTION_ADDED_LATER, DetectionOptions, Recipe

KB = 1024


# ============================================================================= the run
@dataclass(frozen=True, kw_only=True)
class DataSummary(Record):
    """The data a run trained and tested on."""

    name: str
    source: str
    classes: list[str]
    train: int  # images trained on (after the validation hold-out and train_subset)
    validation: int
    test: int  # the whole test split (the figures may use a subset: see the sections)
    boxes: dict[str, int] | None = optional()  # detection: boxes in train / validation / test
    channels_stored: int
    resolution: int
    channels: int
    augment: bool
    flip: bool
    info: dict[str, Any] = extra()  # what the data set says of itself (scenes, held-out splits)


@dataclass(frozen=True, kw_only=True)
class Strategy(Record):
    """The distribution strategy a run trained under (``tfmcu.train.qat.make_strategy``)."""

    name: str
    replicas: int


@dataclass(frozen=True, kw_only=True)
class BackboneLoad(Record):
    """``--init_backbone``: the Keras weights file the run started from and which of the model's layers (those with
    weights) took theirs from it; a layer loads when the file has one of its name with the same weight shapes."""

    source: str  # the weights file (a run folder's model_float_weights.h5, or the file given)
    loaded: list[str]
    not_loaded: list[str]


@dataclass
class History(Record):
    """The epochs of a run, per phase: one record per epoch (``epoch``, ``lr``, ``seconds``, ``samples``, the
    training metrics, ``fit_seconds``, the validation metrics ``val_*``). Grows while the run trains; checkpointed
    with it."""

    float: list[dict[str, Any]] = field(default_factory=list)
    qat: list[dict[str, Any]] = field(default_factory=list)

    def phase(self, name: str) -> list[dict[str, Any]]:
        return {"float": self.float, "qat": self.qat}[name]

    def values(self, metric: str, phase: str = "float") -> list[float]:
        """``metric`` of every epoch of ``phase`` that has it."""
        return [e[metric] for e in self.phase(phase) if e.get(metric) is not None]


# ============================================================================= classification
@dataclass(frozen=True, kw_only=True)
class Accuracy(Record):
    """Test accuracy: the Keras models on ``keras_test_samples``, the int8 model (and the Keras models again) on
    ``int8_test_samples``."""

    float: float
    qat: float | None  # None without QAT
    int8_tflite: float
    int8_tflm: float
    keras_test_samples: int
    int8_test_samples: int
    float_on_int8_samples: float
    qat_on_int8_samples: float | None

    @property
    def int8_minus_float_points(self) -> float:
        """int8 (TFLM) minus float accuracy on the same test samples, in points."""
        return (self.int8_tflm - self.float_on_int8_samples) * 100


@dataclass(frozen=True, kw_only=True)
class Memory(Record):
    analytic_peak_bytes: int
    analytic_peak_bytes_excluding_input: int
    analytic_peak_layer: str
    tflm_arena_bytes: int  # measured (tflite-micro wheel)
    tflm_arena_head_bytes: int
    tflm_arena_tail_bytes: int
    predicted_arena_bytes: int  # tfmcu.plan.arena


@dataclass(frozen=True, kw_only=True)
class ClassifyResult(Record):
    """A classifier's figures: accuracy, TF Lite against TFLM, the int8 model's memory, Flash and MACs."""

    export_notes: list[str]
    accuracy: Accuracy
    tflite_vs_tflm: Agreement  # over the int8 test samples
    confusion_matrix: list[list[int]]  # int8 (TFLM) on the int8 test samples: rows true, columns predicted
    memory: Memory
    flash_bytes: int
    flash_bytes_without_metadata: int
    macs: int
    params: int
    input_quantization: dict[str, float]  # scale, zero_point
    normalization: dict[str, list[float]]  # mean, std per channel

    def summary_lines(self, r: "TrainReport") -> list[str]:
        a, m, agree = self.accuracy, self.memory, self.tflite_vs_tflm
        return [f"accuracy on {a.keras_test_samples} test images: float {a.float:.4f}"
                + (f", QAT {a.qat:.4f}" if a.qat is not None else ""),
                f"accuracy on {a.int8_test_samples} test images: int8 TF Lite {a.int8_tflite:.4f}, int8 TFLM "
                f"{a.int8_tflm:.4f}, float {a.float_on_int8_samples:.4f} (int8 - float "
                f"{a.int8_minus_float_points:+.2f} points)",
                "TF Lite vs TFLM: " + agree.describe("samples"),
                f"memory: analytic peak {m.analytic_peak_bytes / KB:.1f} kB "
                f"({m.analytic_peak_bytes_excluding_input / KB:.1f} kB without the input), TFLM arena "
                f"{m.tflm_arena_bytes / KB:.1f} kB measured / {m.predicted_arena_bytes / KB:.1f} kB predicted",
                f"Flash {self.flash_bytes / KB:.1f} kB, {self.macs / 1e6:.2f}M MACs, {self.params / 1e3:.1f}k params",
                "wrote " + ", ".join(r.files[k] for k in ("tflite", "report", "curves", "confusion"))]


# ============================================================================= detection
@dataclass(frozen=True, kw_only=True)
class Scores(Record):
    """One measure of the model after each step: float, QAT (None without QAT), int8 in TF Lite and in TFLM (None
    without the int8 export)."""

    float: float | None
    qat: float | None
    int8_tflite: float | None
    int8_tflm: float | None


@dataclass(frozen=True, kw_only=True)
class Bootstrap(Record):
    """A bootstrap interval of mAP@0.5 over the test images (``tfmcu.train.detection.bootstrap_map50``)."""

    map50: float | None
    low: float | None
    high: float | None
    samples: int
    seed: int
    level: float


@dataclass(frozen=True, kw_only=True)
class CocoMap(Record):
    """COCO box mAP of one model on the test images (``tfmcu.train.detection.coco_map``); None without boxes."""

    map50: float | None
    map: float | None
    images: int
    boxes: int
    detections: int
    bootstrap: Bootstrap | None = optional(key="map50_bootstrap")


@dataclass(frozen=True, kw_only=True)
class DetectionInt8(Record):
    """The full-int8 detector (with TFLM's DETECTION_POSTPROCESS) on the test images."""

    tflite: CocoMap
    tflm: CocoMap  # with its bootstrap interval
    tflite_vs_tflm: Agreement  # over the test images
    calibration_images: int
    quantization: str  # "QAT (n epochs)" or "post-training quantization"
    postprocess: dict[str, Any]  # the op and its settings
    flash_bytes: int
    tflm_arena_bytes: int


@dataclass(frozen=True, kw_only=True)
class Evaluation(Record):
    """How the test mAPs were measured."""

    split: str
    images: int
    boxes: int
    detections: int  # the float model's
    score_threshold: float
    iou_threshold: float
    max_detections: int
    nms: str
    metric: str


@dataclass(frozen=True, kw_only=True)
class DetectResult(Record):
    """A detector's figures: its anchors, COCO mAP@0.5 and mAP@[.5:.95] of each model, the int8 detector."""

    options: DetectionOptions = named("detection")
    anchors: dict[str, Any]  # source, anchors (and with k-means: fit, spec_anchors, spec_fit, boxes)
    map50: Scores
    map: Scores
    evaluation: Evaluation
    int8: DetectionInt8 | None = None  # None: not exported (DetectionOptions.int8 off)

    @classmethod
    def from_earlier(cls, d: dict[str, Any]) -> dict[str, Any]:
        """A report written before an option existed trained with the option's value then."""
        if isinstance(d.get("detection"), dict):
            d = {**d, "detection": {**DETECTION_ADDED_LATER, **d["detection"]}}
        return d

    def summary_lines(self, r: "TrainReport") -> list[str]:
        e, q, i8 = self.evaluation, self.map50.qat is not None or r.recipe.qat_epochs, self.int8
        lines = [f"float on {e.images} test images ({e.boxes} boxes): mAP@0.5 {fmt(self.map50.float)}, "
                 f"mAP@[.5:.95] {fmt(self.map.float)}"
                 + (f"; QAT mAP@0.5 {fmt(self.map50.qat)}, mAP@[.5:.95] {fmt(self.map.qat)}" if q else "")]
        if i8 is None:
            lines.append("int8: not exported (detection.int8 off)")
        else:
            lines.append(f"int8 (DETECTION_POSTPROCESS) on {e.images} test images: mAP@0.5 TF Lite "
                         f"{fmt(self.map50.int8_tflite)}, TFLM {fmt(self.map50.int8_tflm)}; mAP@[.5:.95] TFLM "
                         f"{fmt(self.map.int8_tflm)}; TF Lite vs TFLM: {i8.tflite_vs_tflm.describe('images')}"
                         f"; Flash {i8.flash_bytes / KB:.1f} kB, TFLM arena {i8.tflm_arena_bytes / KB:.1f} kB")
        return lines + ["wrote " + ", ".join(r.files[k] for k in ("tflite", "spec", "weights", "report", "curves",
                                                                  "detections") if k in r.files)]


def fmt(v: float | None) -> str:
    """A score to 4 decimals, or n/a."""
    return "n/a" if v is None else f"{v:.4f}"


# ============================================================================= the report
@dataclass(frozen=True, kw_only=True)
class TrainReport(Record):
    """A training run's result (module docstring); exactly one of ``classification`` and ``detection`` is set."""

    task: str = "classify"  # classify | detection (reports written before detection existed have none)
    model: str
    spec: NetSpec = coded(NetSpec.to_dict, NetSpec.from_dict)  # as trained (a detector's with its fitted anchors)
    dataset: DataSummary
    recipe: Recipe  # with qat_lr resolved
    steps_per_epoch: int
    qat_steps_per_epoch: int
    seed: int
    deterministic: bool
    strategy: Strategy
    qat_notes: list[str]
    history: History
    classification: ClassifyResult | None = flat()
    detection: DetectResult | None = flat()
    timing_s: dict[str, float]
    files: dict[str, str]  # what the run wrote: tflite, spec, labels, weights, report, curves, ... -> path
    backbone: BackboneLoad | None = optional()  # with ``init_backbone``: what loaded

    @property
    def tflite_vs_tflm(self) -> Agreement | None:
        """The int8 model in TF Lite against TFLM (None: no int8 model was exported)."""
        if self.classification is not None:
            return self.classification.tflite_vs_tflm
        return self.detection.int8.tflite_vs_tflm if self.detection and self.detection.int8 else None

    @property
    def agree(self) -> bool:
        """TF Lite and TFLM gave the same outputs but for rounding ties in a FULLY_CONNECTED head
        (``tfmcu.runtime.agreement``), or there was no int8 model to compare."""
        return self.tflite_vs_tflm is None or self.tflite_vs_tflm.agree

    @classmethod
    def read(cls, path: str) -> "TrainReport":
        """A ``train_report.json``."""
        with open(path) as f:
            return cls.from_json(json.load(f))

    def summary(self) -> str:
        """What the run measured, a few lines (``pipelines.train`` prints them)."""
        d = self.dataset
        head = f"model {self.model} on {d.name} @ {d.resolution}x{d.resolution}x{d.channels}"
        if self.detection is not None:
            head += f", {len(self.spec.head.anchors)} scale(s), anchors: {self.detection.anchors['source']}"
        section = self.classification or self.detection
        assert section is not None
        return "\n".join([head, *section.summary_lines(self)]) + "\n"
