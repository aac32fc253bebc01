"""The classification task: a classifier spec on ``tfmcu.data`` (Fashion-MNIST by default, MNIST, scenes, or a folder
of class folders), categorical cross-entropy, accuracy; its int8 export (the classifier as a 1x1 CONV_2D, TFLite
metadata) run in TF Lite and TFLM sample for sample; the int8 model's memory, Flash and MACs.

* data: images resized to the spec's resolution, grey replicated to 3 channels; a validation split held out of the
  training set (``val_split``; scenes have their own); ``train_subset`` a seeded subset; the test split gives the
  final numbers (``test_subset``: the Keras models', ``int8_eval_samples``: the int8 model's, seeded subsets);
* batches: ``tfmcu.data.classify.train_dataset`` (order and augmentation deterministic for (seed, epoch)), labels
  one-hot;
* export: full-int8 .tflite (int8 input and output, per-channel weights) calibrated on ``calibration_samples``
  training images; the classifier as a 1x1 CONV_2D (``tfmcu.train.export.classifier_as_conv``: TF Lite's reference
  FULLY_CONNECTED rounds differently from TFLM's); TFLite metadata (labels, normalisation);
* int8 evaluation: ``tf.lite.Interpreter`` (reference kernels) and the TFLM interpreter, whose outputs must agree
  sample for sample (``tfmcu.runtime.agreement``: but for rounding ties in a FULLY_CONNECTED head, which the 1x1
  CONV_2D classifier cannot have); the confusion matrix of TFLM's; the analytic peak SRAM, TFLM's measured and
  predicted arena.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfmcu.data import catalog
from tfmcu.data.classify import as_arrays, check_decodable, eval_dataset, train_dataset
from tfmcu.data.images import NORM_MEAN, NORM_STD
from tfmcu.data.split import split_validation, stream_seed, subset
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets.convert import to_int8_tflite
from tfmcu.nets.spec import NetSpec
from tfmcu.plan.arena import predict_arena
from tfmcu.plan.profiler import profile
from tfmcu.runtime.agreement import Agreement, Mismatch, Tie, compare, head_ties
from tfmcu.runtime.model_io import model_info
from tfmcu.runtime.tflm import measure_arena
from tfmcu.train.config import TrainConfig, TrainError
from tfmcu.train.export import classifier_as_conv, confusion, quantize_inputs, quiet_convert, run_int8, with_metadata
from tfmcu.train.plots import CLASSIFY_PANELS, plot_confusion
from tfmcu.train.qat import compile_model
from tfmcu.train.report import Accuracy, ClassifyResult, Memory
from tfmcu.train.task import Exported, Inputs, Log, Trained, check_against_data, check_head, flip, task_spec

@dataclass(frozen=True)
class Int8Accuracy:
    """The int8 model on the int8 test samples, in TF Lite and TFLM, with the Keras models on the same samples."""

    samples: int
    tflite: float
    tflm: float
    agreement: Agreement
    confusion: np.ndarray  # TFLM's
    float_same: float
    qat_same: float | None


class ClassifyTask:
    """The classification task (module docstring)."""

    name = catalog.CLASSIFY
    head = "classify"
    other_data = ("a detection data set (boxes); train a detector on it with --task=detection (e.g. "
                  "--model=mbv2-det-w035)")
    other_head = ("a detector ({head} head); train it with --task=detection on a detection data set (scenes-det[:...] "
                  "or a COCO folder)")
    curves = CLASSIFY_PANELS

    def build_inputs(self, cfg: TrainConfig, log: Log) -> Inputs:
        ds = catalog.load(cfg.dataset, cfg.data_dir, cfg.test_fraction, cfg.seed)
        spec = task_spec(cfg, ds)
        check_head(self, spec, cfg.model)
        if spec.head.num_classes == 0 or spec.head.pooling != "avg":
            raise TrainError(f"{cfg.model}: the spec has no classifier (head.num_classes=0); set head.num_classes to "
                             f"{ds.num_classes} for {ds.name}")
        check_against_data(spec, ds, cfg.model)
        if ds.val is not None:  # the data set's own validation split (scenes)
            train, val = ds.train, ds.val
        else:
            train, val = split_validation(ds.train, cfg.val_split, cfg.seed)
        train = subset(train, cfg.train_subset, cfg.seed)
        if len(train) < cfg.recipe.batch_size:
            raise TrainError(f"the training split has {len(train)} samples, fewer than one batch "
                             f"({cfg.recipe.batch_size})")
        check_decodable(train)
        return Inputs(dataset=ds, spec=spec, train=train, val=val, test=subset(ds.test, cfg.test_subset, cfg.seed),
                      flip=flip(cfg, ds))

    def describe(self, inputs: Inputs) -> str:
        ds = inputs.dataset
        return (f"{len(inputs.train)} train / {len(inputs.val)} validation / {len(ds.test)} test samples, "
                f"{ds.num_classes} classes")

    def training_model(self, spec_model: Any, spec: NetSpec) -> Any:
        return spec_model

    def compile(self, model: Any, opt: Any, cfg: TrainConfig, inputs: Inputs) -> None:
        compile_model(model, opt, cfg.recipe.label_smoothing)

    def batches(self, inputs: Inputs, cfg: TrainConfig, seed: int, epoch: int, steps: int, augment: bool) -> Any:
        ds = train_dataset(inputs.train, inputs.resolution, inputs.channels, cfg.recipe.batch_size, seed, epoch,
                           augment=augment, flip=inputs.flip, steps=steps)
        return ds.map(_one_hot(inputs.dataset.num_classes))

    def validate(self, model: Any, inputs: Inputs, cfg: TrainConfig) -> dict[str, float]:
        if not len(inputs.val):
            return {}
        v = model.evaluate(_eval_batches(inputs.val, inputs), verbose=0, return_dict=True)
        return {"val_loss": float(v["loss"]), "val_accuracy": float(v["accuracy"])}

    def epoch_summary(self, record: dict[str, Any]) -> str:
        val = f", val acc {record['val_accuracy']:.4f}" if "val_accuracy" in record else ""
        return f"loss {record['loss']:.4f}, acc {record['accuracy']:.4f}{val}"

    def evaluate(self, trained: Trained, inputs: Inputs, cfg: TrainConfig, label: str, log: Log) -> float:
        """Test accuracy of the Keras model on the test samples."""
        log(f"[eval] {label} model on {len(inputs.test)} test samples")
        acc = float(trained.model.evaluate(_eval_batches(inputs.test, inputs), verbose=0,
                                           return_dict=True)["accuracy"])
        log(f"[eval] {label} test accuracy {acc:.4f}")
        return acc

    def export(self, cfg: TrainConfig, inputs: Inputs, trained: Trained, qat: bool, log: Log) -> Exported:
        spec, ds, res, ch = inputs.spec, inputs.dataset, inputs.resolution, inputs.channels
        calib = subset(inputs.train, cfg.calibration_samples, stream_seed(cfg.seed, "calibration"))
        x_cal, _ = as_arrays(calib, res, ch)

        def representative():
            for i in range(len(x_cal)):
                yield [x_cal[i:i + 1]]

        how = "QAT" if qat else "post-training quantization"
        log(f"[export] full-int8 .tflite ({how}, {len(x_cal)} calibration samples from the training split)")
        plain = quiet_convert(to_int8_tflite, trained.spec_model, representative)
        notes = []
        if cfg.classifier_as_conv:
            plain, n_fc = classifier_as_conv(plain)
            if n_fc:
                notes.append(f"{n_fc} FULLY_CONNECTED exported as RESHAPE + 1x1 CONV_2D + RESHAPE (same arithmetic in "
                             f"TFLM; makes TF Lite's reference kernels agree with TFLM)")
        model = with_metadata(plain, spec, ds.name, ds.class_names, res, ch, cfg.fingerprint(spec))
        return Exported(model=model, quantization=how, calibration=len(x_cal), bytes_without_metadata=len(plain),
                        notes=tuple(notes))

    def evaluate_int8(self, cfg: TrainConfig, inputs: Inputs, exported: Exported, phases: dict[str, Trained],
                      log: Log) -> Int8Accuracy:
        import tf_keras

        part = subset(inputs.dataset.test, cfg.int8_eval_samples, cfg.seed)
        n8 = len(part)
        log(f"[eval] int8 model on {n8} test samples in tf.lite.Interpreter (reference kernels) and TFLM")
        bar = tf_keras.utils.Progbar(n8, verbose=1 if sys.stderr.isatty() else 0, unit_name="sample")
        # Streamed in batches (a 10,000-image test set at 96x96x3 would be 1.1 GB of float32 at once).
        parts: dict[str, list[np.ndarray]] = {"tfl": [], "tflm": [], "y": [], "float": [], "qat": []}
        differences: list[Mismatch] = []
        ties: dict[int, list[Tie]] = {}
        for xb, yb in eval_dataset(part, inputs.resolution, inputs.channels, 250):
            xb = xb.numpy()
            xq = quantize_inputs(exported.model, xb)
            a, b = run_int8(exported.model, xq)
            start = sum(len(y) for y in parts["y"])
            rows = [[u] for u in a], [[v] for v in b]
            differences += compare(*rows, start)
            ties.update(head_ties(exported.model, [xq[i:i + 1] for i in range(len(xq))], *rows, offset=start))
            parts["tfl"].append(a)
            parts["tflm"].append(b)
            parts["y"].append(yb.numpy())
            for phase, trained in phases.items():
                parts[phase].append(np.asarray(trained.model.predict_on_batch(xb)).argmax(1))
            bar.update(sum(len(y) for y in parts["y"]))
        out_tfl, out_tflm, y_test = (np.concatenate(parts[k]) for k in ("tfl", "tflm", "y"))
        agreement = Agreement.of(n8, differences, ties)
        pred_tflm = out_tflm.argmax(1)
        same = {phase: float(np.mean(np.concatenate(parts[phase]) == y_test)) for phase in phases}
        result = Int8Accuracy(samples=n8, tflite=float(np.mean(out_tfl.argmax(1) == y_test)),
                              tflm=float(np.mean(pred_tflm == y_test)),
                              agreement=agreement,
                              confusion=confusion(y_test, pred_tflm, inputs.dataset.num_classes),
                              float_same=same["float"], qat_same=same.get("qat"))
        log(f"[eval] int8 accuracy: TF Lite {result.tflite:.4f}, TFLM {result.tflm:.4f}; TF Lite vs TFLM: "
            f"{agreement.describe('samples')}")
        return result

    def section(self, cfg: TrainConfig, inputs: Inputs, evals: dict[str, Any], exported: Exported | None,
                int8: Int8Accuracy | None) -> ClassifyResult:
        assert exported is not None and int8 is not None  # (a classifier is always exported)
        spec, model = inputs.spec, exported.model
        graph = from_tflite(model, name=spec.name)
        prof = profile(graph)
        arena = measure_arena(model)
        info = model_info(model)
        return ClassifyResult(
            export_notes=list(exported.notes),
            accuracy=Accuracy(float=evals["float"], qat=evals.get("qat"), int8_tflite=int8.tflite,
                              int8_tflm=int8.tflm, keras_test_samples=len(inputs.test), int8_test_samples=int8.samples,
                              float_on_int8_samples=int8.float_same, qat_on_int8_samples=int8.qat_same),
            tflite_vs_tflm=int8.agreement,
            confusion_matrix=int8.confusion.tolist(),
            memory=Memory(analytic_peak_bytes=prof.peak_sram_per_layer_bytes,
                          analytic_peak_bytes_excluding_input=prof.peak_sram_per_layer_bytes_excluding_input,
                          analytic_peak_layer=prof.peak_layer, tflm_arena_bytes=arena.total,
                          tflm_arena_head_bytes=arena.head, tflm_arena_tail_bytes=arena.tail,
                          predicted_arena_bytes=predict_arena(graph, model=model).total),
            flash_bytes=len(model), flash_bytes_without_metadata=exported.bytes_without_metadata,
            macs=prof.macs, params=prof.params,
            input_quantization={"scale": info.inputs[0].scale, "zero_point": info.inputs[0].zero_point},
            normalization={"mean": [NORM_MEAN] * inputs.channels, "std": [NORM_STD] * inputs.channels})

    def title(self, inputs: Inputs, section: ClassifyResult) -> str:
        a = section.accuracy
        return (f"{inputs.spec.name} on {inputs.dataset.name} @ {inputs.resolution}: float {a.float:.2%}"
                + (f", QAT {a.qat:.2%}" if a.qat is not None else "") + f", int8 {a.int8_tflm:.2%}")

    def outputs(self, cfg: TrainConfig, inputs: Inputs, phases: dict[str, Trained], evals: dict[str, Any],
                section: ClassifyResult) -> dict[str, tuple[str, Any]]:
        a = section.accuracy
        png = plot_confusion(np.asarray(section.confusion_matrix), inputs.dataset.class_names,
                             f"int8 (TFLM) on {a.int8_test_samples} test samples: {a.int8_tflm:.2%}")
        return {"confusion": ("confusion_matrix.png", png)}


def _one_hot(k: int):
    import tensorflow as tf

    return lambda x, y: (x, tf.one_hot(y, k))


def _eval_batches(split: Any, inputs: Inputs) -> Any:
    """A split's batches in order, labels one-hot (what the compiled metrics read)."""
    return eval_dataset(split, inputs.resolution, inputs.channels, 256).map(_one_hot(inputs.dataset.num_classes))
