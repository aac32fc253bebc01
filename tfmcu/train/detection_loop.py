"""Training a yolo detector (``TrainConfig.task == "detection"``): the classification run of ``tfmcu.train.loop``
with detection data, targets, loss and evaluation (``tfmcu.train.detection``). ``train_detector(config, out_dir)``
is the library behind ``python -m pipelines.train --task=detection``.

``DetectionRun`` is a ``tfmcu.train.loop.TrainingRun`` with the task-specific methods replaced:

1. setup: ``tfmcu.detection_data.load_detection`` (``scenes-det[:...]`` with its own splits, or a COCO folder whose
   missing val / test splits are seeded fractions ``val_split`` / ``test_fraction`` of its training images); the
   spec checked against it (``resolve_detection_spec``); anchors clustered from the training boxes (``anchors:
   kmeans``, the default) into the spec that is trained and written; images resized to the spec's resolution once
   (``as_arrays``); the checkpoint state (checked before TensorFlow loads);
2. float training: the shared epoch loop of ``tfmcu.train.loop`` (SGD, cosine decay, warm-up, weight decay, batch
   norm re-calibration, one checkpoint per epoch, ``resume``) on ``training_model`` (the raw outputs concatenated
   ``[B, N, 5 + K]``) with ``detection_loss``; each epoch's batches are augmented in NumPy (flip, zoom, shift;
   deterministic for (seed, epoch, image)) and the validation split's mAP@0.5 / mAP are measured after it;
3. evaluation: COCO mAP@0.5 and mAP@[.5:.95] of the float model on the test split (``test_subset``: a seeded
   subset), the decoder matching DETECTION_POSTPROCESS's fast NMS;
4. int8 (``detection.int8``, on by default): ``tfmcu.train.export.detector_int8`` (full int8, post-training
   quantization on training images, TFLM's DETECTION_POSTPROCESS appended with the evaluation's thresholds), run in
   TF Lite (reference kernels) and TFLM on the test images; its detections scored like the float model's;
5. outputs (all-or-nothing, ``tfmcu.files``): ``model_int8.tflite``, ``spec.json`` (with the fitted anchors),
   ``labels.txt``, ``model_float.weights.h5`` (the spec's Keras weights: ``--init_weights`` takes them),
   ``train_report.json``, ``training_curves.png`` (loss, val mAP@0.5, val mAP per epoch), ``detections.png`` (test
   images, true boxes green, detections red); ``checkpoints/``.

QAT is not wired for detectors yet: ``qat_epochs`` must be 0 (``check_task``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from tfmcu.detection_data import load_detection, resize_for_model
from tfmcu.files import write_outputs
from tfmcu.nets.anchors import AnchorError
from tfmcu.runtime.tflite import run_tflite
from tfmcu.runtime.tflm import measure_arena, run_tflm
from tfmcu.tflite import schema as ts
from tfmcu.tflite.detection_postprocess import detections, postprocess_outputs
from tfmcu.train import detection as det
from tfmcu.train.config import TrainConfig, TrainError, resolve_detection_spec
from tfmcu.train.export import detector_int8, quantize_inputs
from tfmcu.train.loop import TrainingRun
from tfmcu.train.plots import plot_curves
from tfmcu.train.qat import build_model, make_optimizer, quantize

DETECTION_PANELS = (("loss", "loss"), ("map50", "mAP@0.5"), ("map", "mAP@[.5:.95]"))


def _subset(split, n: int | None, seed: int):
    """A seeded random subset of ``n`` images of a ``DetSplit`` (sorted; ``None`` or >= len: the whole split), as
    ``tfmcu.data.subset`` draws it."""
    if n is None or n >= len(split):
        return split
    return split.take(np.sort(np.random.default_rng(seed + 104729).permutation(len(split))[:n]))


def _n_boxes(split) -> int:
    return int(sum(len(b) for b in split.boxes))


def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class DetectionRun(TrainingRun):
    """A detector's run: the task-specific methods of ``TrainingRun`` for detection (module docstring)."""

    # ------------------------------------------------------------------ 1. setup
    def load_data(self) -> None:
        cfg, recipe, opts = self.cfg, self.cfg.recipe, self.cfg.detection
        val_fraction = cfg.val_split if 0 < cfg.val_split < 1 else 0.1
        ds = self.ds = load_detection(cfg.dataset, cfg.data_dir, cfg.seed, val_fraction, cfg.test_fraction)
        spec = resolve_detection_spec(cfg, ds)
        self.res, self.ch = spec.resolution, spec.in_channels
        self.train_split = _subset(ds.train, cfg.train_subset, cfg.seed)
        self.val_split = ds.val
        if len(self.train_split) < recipe.batch_size:
            raise TrainError(f"the training split has {len(self.train_split)} images, fewer than one batch "
                             f"({recipe.batch_size})")
        t = time.time()
        self.train_arrays = det.as_arrays(self.train_split, self.res, self.ch)
        self.val_arrays = det.as_arrays(self.val_split, self.res, self.ch) if len(self.val_split) else None
        self.timing["resize"] = time.time() - t
        if not det.boxes_wh(self.train_arrays.boxes).size:
            raise TrainError(f"{cfg.dataset}: the training split has no boxes")
        self.anchor_info: dict[str, Any] = {"source": opts.anchors, "anchors": spec.head.anchors}
        if opts.anchors == "kmeans":
            try:
                spec, info = det.fit_anchors(spec, self.train_arrays.boxes, cfg.seed)
            except AnchorError as e:
                raise TrainError(f"anchors from the training boxes: {e}; use --anchors=spec") from None
            self.anchor_info.update(info)
        self.spec = spec
        source = ds.info.get("scenes_det", {}).get("source")
        self.flip = source != "mnist" if recipe.flip == "auto" else recipe.flip == "yes"  # no mirrored digits

    def describe(self) -> str:
        ds, a, scales = self.ds, self.anchor_info, self.spec.detection_scales()
        anchors = (f"anchors k-means (mean best IoU {a['fit']:.3f}; the spec's: {a['spec_fit']:.3f})"
                   if a["source"] == "kmeans" else "the spec's anchors")
        return (f"{len(self.train_split)} train / {len(self.val_split)} validation / {len(ds.test)} test images "
                f"({_n_boxes(self.train_split)} / {_n_boxes(self.val_split)} / {_n_boxes(ds.test)} boxes), "
                f"{ds.num_classes} classes, grid {' + '.join(f'{sc.grid}x{sc.grid}' for sc in scales)}, {anchors}")

    def batches(self, arrays: det.DetArrays, seed: int, epoch: int, steps: int | None, augment: bool,
                shuffle: bool = True):
        """A ``tf.data`` of (images, targets) from ``det.epoch_batches``."""
        tf, recipe, opts, spec = self.tf, self.cfg.recipe, self.cfg.detection, self.spec
        n = sum(sc.grid * sc.grid * len(sc.anchors) for sc in spec.detection_scales())
        b = recipe.batch_size
        signature = (tf.TensorSpec((b, self.res, self.res, self.ch), tf.float32),
                     tf.TensorSpec((b, n, det.NUM_FIELDS + spec.head.num_classes), tf.float32))

        def generate():
            yield from det.epoch_batches(arrays, spec, b, seed, epoch, steps, augment, self.flip, opts.scale,
                                         opts.translate, opts.ignore_iou, shuffle)

        return tf.data.Dataset.from_generator(generate, output_signature=signature).prefetch(2)

    def prepare_batches(self) -> None:
        recipe = self.cfg.recipe
        self.val_ds = None
        self.calib_ds = self.batches(self.train_arrays, self.cfg.seed + 2000, 0,
                                     max(1, recipe.bn_recalibration_batches), augment=False)

    def epoch_dataset(self, epoch: int, steps: int, seed: int):
        return self.batches(self.train_arrays, seed, epoch, steps, self.cfg.recipe.augment)

    # ------------------------------------------------------------------ 2. float
    def build_float(self):
        self.base_model = build_model(self.spec, self.cfg.seed, self.cfg.recipe.bn_momentum)
        return det.training_model(self.base_model, self.spec)

    @property
    def spec_model(self):
        return self.base_model

    def compile(self, model, opt) -> None:
        o = self.cfg.detection
        model.compile(optimizer=opt, loss=det.detection_loss(o.box_weight, o.noobj_weight, o.class_weight),
                      metrics=det.loss_metrics(o.noobj_weight))

    def predict(self, model, x: np.ndarray, batch: int = 64) -> np.ndarray:
        """The concatenated raw outputs ``[B, N, 5 + K]`` of the training model on preprocessed images."""
        x = det.batch_images(x, self.ch)
        return np.concatenate([np.asarray(model.predict_on_batch(x[i:i + batch])) for i in range(0, len(x), batch)])

    def validate_epoch(self, model, rec: dict[str, Any]) -> None:
        if self.val_arrays is None:
            return
        o = self.cfg.detection
        arrays = self.val_arrays
        outputs = self.predict(model, arrays.images)
        y = det.assign_targets(arrays.boxes, arrays.labels, self.spec, o.ignore_iou)
        loss = det.detection_loss(o.box_weight, o.noobj_weight, o.class_weight)
        rec["val_loss"] = float(np.mean(loss(self.tf.constant(y), self.tf.constant(outputs)).numpy()))
        dets = det.decode(outputs, self.spec, o.score_threshold, o.iou_threshold, o.max_detections)
        m = det.coco_map(self.val_split, dets, self.spec.head.num_classes)
        rec["val_map50"], rec["val_map"] = m["map50"], m["map"]

    def epoch_summary(self, rec: dict[str, Any]) -> str:
        parts = f"loss {rec['loss']:.4f} (box {rec['box_loss']:.3f}, obj {rec['obj_loss']:.3f}, class " \
                f"{rec['class_loss']:.3f})"
        if rec.get("val_map50") is not None:
            parts += f", val loss {rec['val_loss']:.4f}, val mAP@0.5 {rec['val_map50']:.4f}, mAP {rec['val_map']:.4f}"
        return parts

    def evaluate_float(self, model) -> None:
        cfg, o = self.cfg, self.cfg.detection
        t = time.time()
        self.test_part = _subset(self.ds.test, cfg.test_subset, cfg.seed)
        self.log(f"[eval] float model on {len(self.test_part)} test images ({_n_boxes(self.test_part)} boxes)")
        self.test_dets = det.predict_detections(self.base_model, self.test_part, self.spec, o.score_threshold,
                                                o.iou_threshold, o.max_detections)
        self.float_map = det.coco_map(self.test_part, self.test_dets, self.spec.head.num_classes)
        self.timing["evaluation"] = time.time() - t
        m = self.float_map
        self.log(f"[eval] float test mAP@0.5 {_fmt(m['map50'])}, mAP@[.5:.95] {_fmt(m['map'])} "
                 f"({m['detections']} detections)")

    # ------------------------------------------------------------------ 3. QAT
    def train_qat(self) -> None:
        """``qat_epochs`` of quantization-aware training: the spec's model (``base_model``) quantized with
        ``tfmcu.train.qat.quantize`` (``qat_base``: raw outputs per scale, fake-quantized as the int8 model computes
        them), wrapped in ``training_model`` and trained with the same loss, data and epoch loop as the float phase at
        ``qat_lr`` (default lr / 10); checkpointed and resumable like classification's QAT phase. Then the QAT
        model's test mAP. The int8 export converts ``qat_base`` (``export_int8``)."""
        recipe, tf, state = self.cfg.recipe, self.tf, self.state
        self.qat_model = self.qat_base = self.qat_map = None
        self.qat_notes: list[str] = []
        self.timing["qat_training"] = 0.0
        if recipe.qat_epochs <= 0:
            return
        float_final = self.keep_float_weights()
        with self.strategy.scope():
            self.qat_base, self.qat_notes = quantize(self.base_model)
            model = self.qat_model = det.training_model(self.qat_base, self.spec)
            opt = make_optimizer(self.qat_lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                                 self.qat_steps * recipe.qat_epochs)
            opt.build(model.trainable_variables)
            self.compile(model, opt)
            ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
        for note in self.qat_notes:
            self.log(f"[qat] {note}")
        start = self.resume_phase(ckpt, "qat") if state and state["phase"] == "qat" else 0
        t = time.time()
        self.run_phase("qat", model, opt, ckpt, recipe.qat_epochs, start, 1000, float_final)
        self.timing["qat_training"] = time.time() - t
        o = self.cfg.detection
        self.log(f"[eval] QAT model on {len(self.test_part)} test images")
        dets = det.predict_detections(self.qat_base, self.test_part, self.spec, o.score_threshold, o.iou_threshold,
                                      o.max_detections)
        m = self.qat_map = det.coco_map(self.test_part, dets, self.spec.head.num_classes)
        self.log(f"[eval] QAT test mAP@0.5 {_fmt(m['map50'])}, mAP@[.5:.95] {_fmt(m['map'])} "
                 f"({m['detections']} detections)")

    @property
    def qat_lr(self) -> float:
        recipe = self.cfg.recipe
        return recipe.qat_lr if recipe.qat_lr is not None else recipe.lr / 10

    # ------------------------------------------------------------------ 4. int8
    def export_int8(self) -> None:
        """The full-int8 detector (``tfmcu.train.export.detector_int8``: the spec's Keras model -- the QAT one
        (``qat_base``) after QAT, else the float one -- with its decode layers, calibrated on ``calibration_samples``
        training images (after QAT only the decode layers' ranges come from them), then TFLM's
        DETECTION_POSTPROCESS with the evaluation's thresholds) run in TF Lite (reference kernels) and TFLM on the
        test images; the op's detections scored with ``coco_map`` like the float model's. ``detection.int8=False``
        skips it (the report's int8 entries stay None)."""
        self.int8: dict[str, Any] | None = None
        cfg, o, spec, ds = self.cfg, self.cfg.detection, self.spec, self.ds
        if not o.int8:
            return
        t = time.time()
        arrays = self.train_arrays
        n_cal = min(cfg.calibration_samples, len(arrays))
        pick = np.sort(np.random.default_rng(cfg.seed + 17).permutation(len(arrays))[:n_cal])
        source = self.qat_base if self.qat_base is not None else self.base_model
        how = (f"QAT ({self.cfg.recipe.qat_epochs} epochs)" if self.qat_base is not None
               else "post-training quantization")
        self.log(f"[export] full-int8 .tflite with DETECTION_POSTPROCESS ({how}, {n_cal} calibration images from the "
                 f"training split)")
        model_bytes = detector_int8(source, spec, det.batch_images(arrays.images[pick], self.ch), cfg.seed,
                                    labels=ds.class_names, max_detections=o.max_detections,
                                    score_threshold=o.score_threshold, iou_threshold=o.iou_threshold,
                                    samples=n_cal, dataset_name=ds.name)
        where = postprocess_outputs(ts.load_model(model_bytes))
        if where is None:
            raise TrainError(f"{spec.name}: the int8 export has no DETECTION_POSTPROCESS outputs")
        self.timing["export"] = time.time() - t
        t = time.time()
        part = self.test_part
        self.log(f"[eval] int8 model on {len(part)} test images in tf.lite.Interpreter (reference kernels) and TFLM")

        def as_detections(outputs) -> det.Detections:
            found = detections(outputs, where)
            return det.Detections(np.array([d["box"] for d in found], np.float32).reshape(-1, 4),
                                  np.array([d["class"] for d in found], np.int32),
                                  np.array([d["score"] for d in found], np.float32))

        found: dict[str, list[det.Detections]] = {"tflite": [], "tflm": []}
        mismatching = 0
        for start in range(0, len(part), 64):
            chunk = part.take(np.arange(start, min(start + 64, len(part))))
            x, _ = resize_for_model(chunk.images, chunk.boxes, self.res, self.ch)
            xq = quantize_inputs(model_bytes, x)
            samples = [xq[i:i + 1] for i in range(len(xq))]
            a, b = run_tflite(model_bytes, samples, "reference"), run_tflm(model_bytes, samples)
            mismatching += sum(not all(np.array_equal(p, q) for p, q in zip(u, v)) for u, v in zip(a, b))
            found["tflite"] += [as_detections(u) for u in a]
            found["tflm"] += [as_detections(v) for v in b]
        k = spec.head.num_classes
        tflm_map = det.coco_map(part, found["tflm"], k)
        tflm_map["map50_bootstrap"] = det.bootstrap_map50(part, found["tflm"], k, seed=cfg.seed)
        self.int8 = {"tflite": det.coco_map(part, found["tflite"], k), "tflm": tflm_map,
                     "tflite_vs_tflm": {"agree": mismatching == 0, "mismatching_images": mismatching,
                                        "images": len(part), "tflite_kernels": "reference"},
                     "calibration_images": n_cal, "quantization": how,
                     "postprocess": {"op": "TFLite_Detection_PostProcess", "use_regular_nms": False,
                                     "max_classes_per_detection": 1, "score_threshold": o.score_threshold,
                                     "iou_threshold": o.iou_threshold, "max_detections": o.max_detections},
                     "flash_bytes": len(model_bytes), "tflm_arena_bytes": measure_arena(model_bytes).total,
                     "model_bytes": model_bytes}
        self.timing["int8_eval"] = time.time() - t
        m8 = self.int8["tflm"]
        self.log(f"[eval] int8 test mAP@0.5: TF Lite {_fmt(self.int8['tflite']['map50'])}, TFLM {_fmt(m8['map50'])}"
                 f"; mAP@[.5:.95] TFLM {_fmt(m8['map'])}; outputs agree on {len(part) - mismatching}/{len(part)} "
                 f"images")

    # ------------------------------------------------------------------ 5. report and outputs
    def report(self) -> dict[str, Any]:
        cfg, recipe, ds, spec = self.cfg, self.cfg.recipe, self.ds, self.spec
        timing = {k: round(v, 1) for k, v in self.timing.items()}
        timing["total"] = round(time.time() - self.t_start, 1)
        m, o = self.float_map, cfg.detection
        int8, q = self.int8, self.qat_map
        report: dict[str, Any] = {
            "task": "detection",
            "model": spec.name,
            "spec": spec.to_dict(),
            "dataset": {"name": ds.name, "source": ds.source, "classes": ds.class_names,
                        "train": len(self.train_split), "validation": len(self.val_split), "test": len(ds.test),
                        "boxes": {"train": _n_boxes(self.train_split), "validation": _n_boxes(self.val_split),
                                  "test": _n_boxes(ds.test)},
                        "channels_stored": ds.channels, "resolution": self.res, "channels": self.ch,
                        "augment": recipe.augment, "flip": self.flip, **ds.info},
            "recipe": dataclasses.asdict(recipe) | {"qat_lr": self.qat_lr},
            "detection": dataclasses.asdict(o),
            "anchors": self.anchor_info,
            "steps_per_epoch": self.steps,
            "qat_steps_per_epoch": self.qat_steps,
            "seed": cfg.seed,
            "deterministic": cfg.deterministic,
            "strategy": {"name": cfg.strategy, "replicas": self.replicas},
            "qat_notes": self.qat_notes,
            "history": self.history,
            # COCO box mAP on the test split; "qat" is None without QAT, the int8 figures come with the int8 export.
            "map50": {"float": m["map50"], "qat": q and q["map50"], "int8_tflite": int8 and int8["tflite"]["map50"],
                      "int8_tflm": int8 and int8["tflm"]["map50"]},
            "map": {"float": m["map"], "qat": q and q["map"], "int8_tflite": int8 and int8["tflite"]["map"],
                    "int8_tflm": int8 and int8["tflm"]["map"]},
            "evaluation": {"split": "test", "images": m["images"], "boxes": m["boxes"],
                           "detections": m["detections"], "score_threshold": o.score_threshold,
                           "iou_threshold": o.iou_threshold, "max_detections": o.max_detections,
                           "nms": "class-agnostic fast NMS over each anchor's best class score (DETECTION_POSTPROCESS "
                                  "with use_regular_nms=False, max_classes_per_detection=1)",
                           "metric": "pycocotools COCOeval, bbox, up to 100 detections per image"},
            "int8": int8 and {k: v for k, v in int8.items() if k != "model_bytes"},
            "timing_s": {k: timing.get(k, 0.0) for k in ("resize", "float_training", "evaluation", "qat_training",
                                                         "export", "int8_eval", "total")},
        }
        out = self.out_dir
        files = {
            "spec": os.path.join(out, "spec.json"),
            "labels": os.path.join(out, "labels.txt"),
            "weights": os.path.join(out, "model_float.weights.h5"),
            "report": os.path.join(out, "train_report.json"),
            "curves": os.path.join(out, "training_curves.png"),
            "detections": os.path.join(out, "detections.png"),
        }
        if int8:
            files["tflite"] = os.path.join(out, "model_int8.tflite")
        report["files"] = files
        with tempfile.TemporaryDirectory(prefix="tfmcu-det-") as tmp:
            path = os.path.join(tmp, "model_float.weights.h5")
            self.base_model.save_weights(path)
            with open(path, "rb") as f:
                weights = f.read()
        title = (f"{spec.name} on {ds.name} @ {self.res}: float test mAP@0.5 {_fmt(m['map50'])}, mAP {_fmt(m['map'])}"
                 + (f"; QAT {_fmt(q['map50'])}, {_fmt(q['map'])}" if q else ""))
        outputs: dict[str, Any] = {
            files["spec"]: spec.to_json() + "\n",
            files["labels"]: "\n".join(ds.class_names) + "\n",
            files["weights"]: weights,
            files["report"]: report,
            files["curves"]: plot_curves(self.history, title, DETECTION_PANELS),
            files["detections"]: det.plot_detections(
                self.test_part, self.test_dets, ds.class_names, o.plot_images,
                title="float model, test images: true boxes green, detections (score >= 0.3) red"),
        }
        if int8:
            outputs[files["tflite"]] = int8["model_bytes"]
        write_outputs(outputs)
        return report


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def train_detector(cfg: TrainConfig, out_dir: str, log: Callable[[str], None] = _log_default) -> dict[str, Any]:
    """Train a yolo spec (``cfg.task == "detection"``); returns the report (also ``out_dir/train_report.json``)."""
    if cfg.task != "detection":
        raise TrainError(f"task '{cfg.task}': train_detector trains detectors (task 'detection')")
    run = DetectionRun(cfg, out_dir, log)
    run.setup()
    run.train_float()
    run.train_qat()
    if not run.chief:
        log("[train] not the chief worker: the chief evaluates and writes the outputs")
        return {"chief": False, "task": "detection",
                "map50": {"float": run.float_map["map50"], "qat": run.qat_map and run.qat_map["map50"]}}
    run.export_int8()
    return run.report()


def format_detection_summary(r: dict[str, Any]) -> str:
    d, e = r["dataset"], r["evaluation"]
    lines = [f"model {r['model']} on {d['name']} @ {d['resolution']}x{d['resolution']}x{d['channels']}, "
             f"{len(r['spec']['head']['anchors'])} scale(s), anchors: {r['anchors']['source']}",
             f"float on {e['images']} test images ({e['boxes']} boxes): mAP@0.5 {_fmt(r['map50']['float'])}, "
             f"mAP@[.5:.95] {_fmt(r['map']['float'])}"
             + (f"; QAT mAP@0.5 {_fmt(r['map50']['qat'])}, mAP@[.5:.95] {_fmt(r['map']['qat'])}"
                if r["map50"].get("qat") is not None or r["recipe"]["qat_epochs"] else ""),
             (f"int8 (DETECTION_POSTPROCESS) on {e['images']} test images: mAP@0.5 TF Lite "
              f"{_fmt(r['map50']['int8_tflite'])}, TFLM {_fmt(r['map50']['int8_tflm'])}; mAP@[.5:.95] TFLM "
              f"{_fmt(r['map']['int8_tflm'])}; TF Lite vs TFLM: "
              + ("identical outputs on every image" if r["int8"]["tflite_vs_tflm"]["agree"] else
                 f"DISAGREE on {r['int8']['tflite_vs_tflm']['mismatching_images']} images")
              + f"; Flash {r['int8']['flash_bytes'] / 1024:.1f} kB, TFLM arena "
                f"{r['int8']['tflm_arena_bytes'] / 1024:.1f} kB"
              if r.get("int8") else "int8: not exported (detection.int8 off)"),
             "wrote " + ", ".join(r["files"][k] for k in ("tflite", "spec", "weights", "report", "curves",
                                                          "detections") if k in r["files"])]
    return "\n".join(lines) + "\n"
