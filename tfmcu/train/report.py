"""The typed result of a training run: ``TrainReport``, what ``tfmcu.train.train`` returns and writes as
``train_report.json`` (``to_json`` / ``from_json``), with a section per task -- ``classification``
(``ClassifyResult``: accuracy, TF Lite against TFLM, the confusion matrix, memory, Flash, MACs) or ``detection``
(``DetectResult``: anchors, COCO mAP of each model, the int8 detector's figures) -- and its summary lines.

The JSON keeps one flat object: the run's fields, then the section's (``accuracy``, ``memory``, ... or
``detection`` (the options), ``anchors``, ``map50``, ``map``, ``evaluation``, ``int8``). Benches, flows and tests read
reports through ``TrainReport.from_json`` / ``TrainReport.read``, never by string keys.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tfmcu.nets.spec import NetSpec
from tfmcu.train.config import DetectionOptions, Recipe

KB = 1024


def _fields(obj: Any) -> dict[str, Any]:
    """A flat record's fields by name (nested records stay objects)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


# ============================================================================= the run
@dataclass(frozen=True, kw_only=True)
class DataSummary:
    """The data a run trained and tested on."""

    name: str
    source: str
    classes: list[str]
    train: int  # images trained on (after the validation hold-out and train_subset)
    validation: int
    test: int  # the whole test split (the figures may use a subset: see the sections)
    channels_stored: int
    resolution: int
    channels: int
    augment: bool
    flip: bool
    boxes: dict[str, int] | None = None  # detection: boxes in train / validation / test
    info: dict[str, Any] = field(default_factory=dict)  # what the data set says of itself (scenes, held-out splits)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in _fields(self).items() if k not in ("boxes", "info")}
        if self.boxes is not None:
            d = {**{k: d[k] for k in ("name", "source", "classes", "train", "validation", "test")},
                 "boxes": self.boxes, **d}
        return {**d, **self.info}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DataSummary":
        names = {f.name for f in dataclasses.fields(cls)} - {"info"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   info={k: v for k, v in d.items() if k not in names})


@dataclass
class History:
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

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        return {"float": self.float, "qat": self.qat}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "History":
        return cls(float=list(d.get("float", [])), qat=list(d.get("qat", [])))


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """The int8 model in TF Lite (reference kernels) against TFLM on the same inputs."""

    agree: bool
    mismatching: int
    count: int
    unit: str  # what was compared: "samples" (classifier outputs) or "images" (a detector's detections)
    tflite_kernels: str = "reference"

    def to_json(self) -> dict[str, Any]:
        return {"agree": self.agree, f"mismatching_{self.unit}": self.mismatching, self.unit: self.count,
                "tflite_kernels": self.tflite_kernels}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Agreement":
        unit = "images" if "images" in d else "samples"
        return cls(agree=d["agree"], mismatching=d[f"mismatching_{unit}"], count=d[unit], unit=unit,
                   tflite_kernels=d.get("tflite_kernels", "reference"))


# ============================================================================= classification
@dataclass(frozen=True, kw_only=True)
class Accuracy:
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
class Memory:
    analytic_peak_bytes: int
    analytic_peak_bytes_excluding_input: int
    analytic_peak_layer: str
    tflm_arena_bytes: int  # measured (tflite-micro wheel)
    tflm_arena_head_bytes: int
    tflm_arena_tail_bytes: int
    predicted_arena_bytes: int  # tfmcu.plan.arena


@dataclass(frozen=True, kw_only=True)
class ClassifyResult:
    """A classifier's figures: accuracy, TF Lite against TFLM, the int8 model's memory, Flash and MACs."""

    export_notes: list[str]
    accuracy: Accuracy
    tflite_vs_tflm: Agreement
    confusion_matrix: list[list[int]]  # int8 (TFLM) on the int8 test samples: rows true, columns predicted
    memory: Memory
    flash_bytes: int
    flash_bytes_without_metadata: int
    macs: int
    params: int
    input_quantization: dict[str, float]  # scale, zero_point
    normalization: dict[str, list[float]]  # mean, std per channel

    def to_json(self) -> dict[str, Any]:
        return {**_fields(self), "accuracy": dataclasses.asdict(self.accuracy),
                "tflite_vs_tflm": self.tflite_vs_tflm.to_json(), "memory": dataclasses.asdict(self.memory)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ClassifyResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: d[k] for k in names}, "accuracy": Accuracy(**d["accuracy"]),
                      "tflite_vs_tflm": Agreement.from_json(d["tflite_vs_tflm"]), "memory": Memory(**d["memory"])})

    def summary_lines(self, r: "TrainReport") -> list[str]:
        a, m, agree = self.accuracy, self.memory, self.tflite_vs_tflm
        return [f"accuracy on {a.keras_test_samples} test images: float {a.float:.4f}"
                + (f", QAT {a.qat:.4f}" if a.qat is not None else ""),
                f"accuracy on {a.int8_test_samples} test images: int8 TF Lite {a.int8_tflite:.4f}, int8 TFLM "
                f"{a.int8_tflm:.4f}, float {a.float_on_int8_samples:.4f} (int8 - float "
                f"{a.int8_minus_float_points:+.2f} points)",
                "TF Lite vs TFLM: " + ("identical outputs on every sample" if agree.agree else
                                       f"DISAGREE on {agree.mismatching} samples"),
                f"memory: analytic peak {m.analytic_peak_bytes / KB:.1f} kB "
                f"({m.analytic_peak_bytes_excluding_input / KB:.1f} kB without the input), TFLM arena "
                f"{m.tflm_arena_bytes / KB:.1f} kB measured / {m.predicted_arena_bytes / KB:.1f} kB predicted",
                f"Flash {self.flash_bytes / KB:.1f} kB, {self.macs / 1e6:.2f}M MACs, {self.params / 1e3:.1f}k params",
                "wrote " + ", ".join(r.files[k] for k in ("tflite", "report", "curves", "confusion"))]


# ============================================================================= detection
@dataclass(frozen=True, kw_only=True)
class Scores:
    """One measure of the model after each step: float, QAT (None without QAT), int8 in TF Lite and in TFLM (None
    without the int8 export)."""

    float: float | None
    qat: float | None
    int8_tflite: float | None
    int8_tflm: float | None


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """A bootstrap interval of mAP@0.5 over the test images (``tfmcu.train.detection.bootstrap_map50``)."""

    map50: float | None
    low: float | None
    high: float | None
    samples: int
    seed: int
    level: float


@dataclass(frozen=True, kw_only=True)
class CocoMap:
    """COCO box mAP of one model on the test images (``tfmcu.train.detection.coco_map``); None without boxes."""

    map50: float | None
    map: float | None
    images: int
    boxes: int
    detections: int
    bootstrap: Bootstrap | None = None  # JSON "map50_bootstrap"

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in _fields(self).items() if k != "bootstrap"}
        return d if self.bootstrap is None else {**d, "map50_bootstrap": dataclasses.asdict(self.bootstrap)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CocoMap":
        b = d.get("map50_bootstrap")
        return cls(**{k: v for k, v in d.items() if k != "map50_bootstrap"},
                   bootstrap=None if b is None else Bootstrap(**b))


@dataclass(frozen=True, kw_only=True)
class DetectionInt8:
    """The full-int8 detector (with TFLM's DETECTION_POSTPROCESS) on the test images."""

    tflite: CocoMap
    tflm: CocoMap  # with its bootstrap interval
    tflite_vs_tflm: Agreement
    calibration_images: int
    quantization: str  # "QAT (n epochs)" or "post-training quantization"
    postprocess: dict[str, Any]  # the op and its settings
    flash_bytes: int
    tflm_arena_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {**_fields(self), "tflite": self.tflite.to_json(), "tflm": self.tflm.to_json(),
                "tflite_vs_tflm": self.tflite_vs_tflm.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DetectionInt8":
        return cls(**{**d, "tflite": CocoMap.from_json(d["tflite"]), "tflm": CocoMap.from_json(d["tflm"]),
                      "tflite_vs_tflm": Agreement.from_json(d["tflite_vs_tflm"])})


@dataclass(frozen=True, kw_only=True)
class Evaluation:
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
class DetectResult:
    """A detector's figures: its anchors, COCO mAP@0.5 and mAP@[.5:.95] of each model, the int8 detector."""

    options: DetectionOptions  # JSON "detection"
    anchors: dict[str, Any]  # source, anchors (and with k-means: fit, spec_anchors, spec_fit, boxes)
    map50: Scores
    map: Scores
    evaluation: Evaluation
    int8: DetectionInt8 | None  # None: not exported (DetectionOptions.int8 off)

    def to_json(self) -> dict[str, Any]:
        return {"detection": dataclasses.asdict(self.options), "anchors": self.anchors,
                "map50": dataclasses.asdict(self.map50), "map": dataclasses.asdict(self.map),
                "evaluation": dataclasses.asdict(self.evaluation),
                "int8": None if self.int8 is None else self.int8.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DetectResult":
        return cls(options=DetectionOptions(**d["detection"]), anchors=d["anchors"], map50=Scores(**d["map50"]),
                   map=Scores(**d["map"]), evaluation=Evaluation(**d["evaluation"]),
                   int8=None if d.get("int8") is None else DetectionInt8.from_json(d["int8"]))

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
                         f"{fmt(self.map.int8_tflm)}; TF Lite vs TFLM: "
                         + ("identical outputs on every image" if i8.tflite_vs_tflm.agree else
                            f"DISAGREE on {i8.tflite_vs_tflm.mismatching} images")
                         + f"; Flash {i8.flash_bytes / KB:.1f} kB, TFLM arena {i8.tflm_arena_bytes / KB:.1f} kB")
        return lines + ["wrote " + ", ".join(r.files[k] for k in ("tflite", "spec", "weights", "report", "curves",
                                                                  "detections") if k in r.files)]


def fmt(v: float | None) -> str:
    """A score to 4 decimals, or n/a."""
    return "n/a" if v is None else f"{v:.4f}"


# ============================================================================= the report
@dataclass(frozen=True, kw_only=True)
class TrainReport:
    """A training run's result (module docstring); exactly one of ``classification`` and ``detection`` is set."""

    task: str  # classify | detection
    model: str
    spec: NetSpec  # as trained (a detector's with its fitted anchors)
    dataset: DataSummary
    recipe: Recipe  # with qat_lr resolved
    steps_per_epoch: int
    qat_steps_per_epoch: int
    seed: int
    deterministic: bool
    strategy: str
    replicas: int
    qat_notes: list[str]
    history: History
    timing_s: dict[str, float]
    files: dict[str, str]  # what the run wrote: tflite, spec, labels, report, curves, ... -> path
    classification: ClassifyResult | None = None
    detection: DetectResult | None = None

    @property
    def tflite_vs_tflm(self) -> Agreement | None:
        """The int8 model in TF Lite against TFLM (None: no int8 model was exported)."""
        if self.classification is not None:
            return self.classification.tflite_vs_tflm
        return self.detection.int8.tflite_vs_tflm if self.detection and self.detection.int8 else None

    @property
    def agree(self) -> bool:
        """TF Lite and TFLM gave the same outputs (or there was no int8 model to compare)."""
        return self.tflite_vs_tflm is None or self.tflite_vs_tflm.agree

    def to_json(self) -> dict[str, Any]:
        section = self.classification or self.detection
        assert section is not None
        return {"task": self.task, "model": self.model, "spec": self.spec.to_dict(), "dataset": self.dataset.to_json(),
                "recipe": dataclasses.asdict(self.recipe), "steps_per_epoch": self.steps_per_epoch,
                "qat_steps_per_epoch": self.qat_steps_per_epoch, "seed": self.seed,
                "deterministic": self.deterministic, "strategy": {"name": self.strategy, "replicas": self.replicas},
                "qat_notes": self.qat_notes, "history": self.history.to_json(), **section.to_json(),
                "timing_s": self.timing_s, "files": self.files}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TrainReport":
        task = d.get("task", "classify")  # (reports written before detection existed have no task)
        return cls(task=task, model=d["model"], spec=NetSpec.from_dict(d["spec"]),
                   dataset=DataSummary.from_json(d["dataset"]), recipe=Recipe(**d["recipe"]),
                   steps_per_epoch=d["steps_per_epoch"], qat_steps_per_epoch=d["qat_steps_per_epoch"], seed=d["seed"],
                   deterministic=d["deterministic"], strategy=d["strategy"]["name"],
                   replicas=d["strategy"]["replicas"], qat_notes=d["qat_notes"],
                   history=History.from_json(d["history"]), timing_s=d["timing_s"], files=d["files"],
                   classification=ClassifyResult.from_json(d) if task == "classify" else None,
                   detection=DetectResult.from_json(d) if task == "detection" else None)

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
