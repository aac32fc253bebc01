"""The detection task: a yolo spec on ``scenes-det[:...]`` or a COCO folder, with targets, loss, augmentation, decode
and COCO mAP from ``tfmcu.train.detection``; its int8 export ends in TFLM's DETECTION_POSTPROCESS and is scored like
the Keras models, in TF Lite and in TFLM.

* data: ``tfmcu.data.load_detection`` (``scenes-det`` with its own splits, or a COCO folder whose missing val / test
  splits are seeded fractions ``val_split`` / ``test_fraction`` of its training images); the spec checked against it;
  anchors clustered from the training boxes (``anchors: kmeans``, the default) into the spec that is trained and
  written; images resized to the spec's resolution once (``detection.as_arrays``);
* training: ``training_model`` (the raw outputs concatenated ``[B, N, 5 + K]``) with ``detection_loss``; each epoch's
  batches are augmented in NumPy (flip, zoom, shift; deterministic for (seed, epoch, image)) and the validation
  split's loss, mAP@0.5 and mAP are measured after it; QAT trains the quantized spec model wrapped the same way;
* evaluation: COCO mAP@0.5 and mAP@[.5:.95] on the test split (``test_subset``: a seeded subset), the decoder matching
  DETECTION_POSTPROCESS's fast NMS;
* int8 (``detection.int8``, on by default): ``tfmcu.train.export.detector_int8`` (full int8; post-training
  quantization on training images, or the QAT model's ranges; TFLM's DETECTION_POSTPROCESS appended with the
  evaluation's thresholds), run in TF Lite (reference kernels) and TFLM on the test images, its detections scored
  with ``coco_map`` (and a bootstrap interval of mAP@0.5);
* outputs besides the trainer's: ``detections.png`` (test images, true boxes green, detections red).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tfmcu.data import catalog
from tfmcu.data.images import model_inputs
from tfmcu.data.split import draw, stream_seed, subset
from tfmcu.nets.anchors import AnchorError, anchor_grid
from tfmcu.nets.spec import NetSpec
from tfmcu.runtime.agreement import Agreement, Mismatch, Tie, compare, head_ties
from tfmcu.runtime.tflite import run_tflite
from tfmcu.runtime.tflm import measure_arena, run_tflm
from tfmcu.tflite import schema as ts
from tfmcu.tflite.detection_postprocess import detections, postprocess_outputs
from tfmcu.train import detection as det
from tfmcu.train.config import TrainConfig, TrainError
from tfmcu.train.export import detector_int8, quantize_inputs
from tfmcu.train.report import Bootstrap, CocoMap, DetectionInt8, DetectResult, Evaluation, Scores, fmt
from tfmcu.train.task import Exported, Inputs, Log, Trained, check_against_data, check_head, flip, task_spec

PANELS = (("loss", "loss"), ("map50", "mAP@0.5"), ("map", "mAP@[.5:.95]"))
NMS = ("class-agnostic fast NMS over each anchor's best class score (DETECTION_POSTPROCESS with use_regular_nms=False, "
       "max_classes_per_detection=1)")
METRIC = "pycocotools COCOeval, bbox, up to 100 detections per image"


@dataclass(frozen=True, kw_only=True)
class DetectInputs(Inputs):
    """A detector's inputs: the splits, and the training and validation images resized for the model once."""

    train_arrays: det.DetArrays
    val_arrays: det.DetArrays | None
    anchors: dict[str, Any]  # where the spec's anchors come from, and how well they fit the training boxes


@dataclass(frozen=True)
class DetectEval:
    """A Keras model on the test images: COCO mAP (``detection.coco_map``) and its detections."""

    coco: dict[str, Any]
    detections: list[det.Detections]


def _loss_anchors(spec: NetSpec, o: Any) -> np.ndarray | None:
    """The anchor grid the loss decodes boxes on (``box_loss`` giou or ciou); None: the loss works on the encodings."""
    return None if o.box_loss == "smooth_l1" else anchor_grid(spec)


class DetectTask:
    """The detection task (module docstring)."""

    name = catalog.DETECTION
    head = "yolo"
    other_data = ("a classification data set (no boxes); --task=detection needs scenes-det[:key=value,...] or a COCO "
                  "folder")
    other_head = "a classifier (head.type '{head}'); --task=detection needs a yolo head (e.g. --model=mbv2-det-w035)"
    curves = PANELS

    def build_inputs(self, cfg: TrainConfig, log: Log) -> DetectInputs:
        opts = cfg.detection
        val_fraction = cfg.val_split if 0 < cfg.val_split < 1 else 0.1
        ds = catalog.load_detection(cfg.dataset, cfg.data_dir, cfg.seed, val_fraction, cfg.test_fraction)
        spec = task_spec(cfg, ds)
        check_head(self, spec, cfg.model)
        check_against_data(spec, ds, cfg.model)
        train = subset(ds.train, cfg.train_subset, cfg.seed)
        if len(train) < cfg.recipe.batch_size:
            raise TrainError(f"the training split has {len(train)} images, fewer than one batch "
                             f"({cfg.recipe.batch_size})")
        train_arrays = det.as_arrays(train, spec.resolution, spec.in_channels)
        val_arrays = det.as_arrays(ds.val, spec.resolution, spec.in_channels) if len(ds.val) else None
        if not det.boxes_wh(train_arrays.boxes).size:
            raise TrainError(f"{cfg.dataset}: the training split has no boxes")
        anchors: dict[str, Any] = {"source": opts.anchors, "anchors": spec.head.anchors}
        if opts.anchors == "kmeans":
            try:
                spec, fitted = det.fit_anchors(spec, train_arrays.boxes, cfg.seed)
            except AnchorError as e:
                raise TrainError(f"anchors from the training boxes: {e}; use --anchors=spec") from None
            anchors.update(fitted)
        return DetectInputs(dataset=ds, spec=spec, train=train, val=ds.val,
                            test=subset(ds.test, cfg.test_subset, cfg.seed), flip=flip(cfg, ds),
                            train_arrays=train_arrays, val_arrays=val_arrays, anchors=anchors)

    def describe(self, inputs: DetectInputs) -> str:
        ds, a, scales = inputs.dataset, inputs.anchors, inputs.spec.detection_scales()
        anchors = (f"anchors k-means (mean best IoU {a['fit']:.3f}; the spec's: {a['spec_fit']:.3f})"
                   if a["source"] == "kmeans" else "the spec's anchors")
        return (f"{len(inputs.train)} train / {len(inputs.val)} validation / {len(ds.test)} test images "
                f"({inputs.train.n_boxes()} / {inputs.val.n_boxes()} / {ds.test.n_boxes()} boxes), "
                f"{ds.num_classes} classes, grid {' + '.join(f'{sc.grid}x{sc.grid}' for sc in scales)}, {anchors}")

    def training_model(self, spec_model: Any, spec: NetSpec) -> Any:
        return det.training_model(spec_model, spec)

    def compile(self, model: Any, opt: Any, cfg: TrainConfig, inputs: Inputs) -> None:
        o = cfg.detection
        anchors = _loss_anchors(inputs.spec, o)
        model.compile(optimizer=opt, loss=det.detection_loss(o.box_weight, o.noobj_weight, o.class_weight, anchors,
                                                             o.obj_iou, o.box_loss, o.l1_term),
                      metrics=det.loss_metrics(o.noobj_weight, anchors, o.obj_iou, o.box_loss, o.l1_term))

    def batches(self, inputs: DetectInputs, cfg: TrainConfig, seed: int, epoch: int, steps: int,
                augment: bool) -> Any:
        """A ``tf.data`` of (images, targets) from ``detection.epoch_batches``."""
        import tensorflow as tf

        spec, opts, b = inputs.spec, cfg.detection, cfg.recipe.batch_size
        n = sum(sc.grid * sc.grid * len(sc.anchors) for sc in spec.detection_scales())
        signature = (tf.TensorSpec((b, spec.resolution, spec.resolution, spec.in_channels), tf.float32),
                     tf.TensorSpec((b, n, det.NUM_FIELDS + spec.head.num_classes), tf.float32))

        def generate():
            yield from det.epoch_batches(inputs.train_arrays, spec, b, seed, epoch, steps, augment, inputs.flip,
                                         opts.scale, opts.translate, opts.ignore_iou, positives=opts.positives)

        n_batches = det.batches_per_epoch(len(inputs.train_arrays), b, steps)
        # (the cardinality gives Keras' progress bar its total)
        return (tf.data.Dataset.from_generator(generate, output_signature=signature)
                .apply(tf.data.experimental.assert_cardinality(n_batches)).prefetch(2))

    def validate(self, model: Any, inputs: DetectInputs, cfg: TrainConfig) -> dict[str, float]:
        import tensorflow as tf

        if inputs.val_arrays is None:
            return {}
        o, spec, arrays = cfg.detection, inputs.spec, inputs.val_arrays
        outputs = _predict(model, arrays.images, spec.in_channels)
        y = det.assign_targets(arrays.boxes, arrays.labels, spec, o.ignore_iou, positives=o.positives)
        loss = det.detection_loss(o.box_weight, o.noobj_weight, o.class_weight, _loss_anchors(spec, o), o.obj_iou,
                                  o.box_loss, o.l1_term)
        val_loss = float(np.mean(loss(tf.constant(y), tf.constant(outputs)).numpy()))
        dets = det.decode(outputs, spec, o.score_threshold, o.iou_threshold, o.max_detections)
        m = det.coco_map(inputs.val, dets, spec.head.num_classes)
        return {"val_loss": val_loss, "val_map50": m["map50"], "val_map": m["map"]}

    def epoch_summary(self, record: dict[str, Any]) -> str:
        parts = (f"loss {record['loss']:.4f} (box {record['box_loss']:.3f}, obj {record['obj_loss']:.3f}, class "
                 f"{record['class_loss']:.3f})")
        if record.get("val_map50") is not None:
            parts += (f", val loss {record['val_loss']:.4f}, val mAP@0.5 {record['val_map50']:.4f}, mAP "
                      f"{record['val_map']:.4f}")
        return parts

    def evaluate(self, trained: Trained, inputs: DetectInputs, cfg: TrainConfig, label: str, log: Log) -> DetectEval:
        """COCO mAP of the spec's Keras model on the test images."""
        o, spec, test = cfg.detection, inputs.spec, inputs.test
        log(f"[eval] {label} model on {len(test)} test images ({test.n_boxes()} boxes)")
        dets = det.predict_detections(trained.spec_model, test, spec, o.score_threshold, o.iou_threshold,
                                      o.max_detections)
        m = det.coco_map(test, dets, spec.head.num_classes)
        log(f"[eval] {label} test mAP@0.5 {fmt(m['map50'])}, mAP@[.5:.95] {fmt(m['map'])} "
            f"({m['detections']} detections)")
        return DetectEval(m, dets)

    def export(self, cfg: TrainConfig, inputs: DetectInputs, trained: Trained, qat: bool,
               log: Log) -> Exported | None:
        """The full-int8 detector (``tfmcu.train.export.detector_int8``): the phase's spec model with its decode
        layers, calibrated on ``calibration_samples`` training images (after QAT only the decode layers' ranges come
        from them), then TFLM's DETECTION_POSTPROCESS with the evaluation's thresholds. ``detection.int8=False``
        skips it."""
        o, spec, ds, arrays = cfg.detection, inputs.spec, inputs.dataset, inputs.train_arrays
        if not o.int8:
            return None
        n_cal = min(cfg.calibration_samples, len(arrays))
        pick = draw(len(arrays), n_cal, stream_seed(cfg.seed, "calibration"))
        how = f"QAT ({cfg.recipe.qat_epochs} epochs)" if qat else "post-training quantization"
        log(f"[export] full-int8 .tflite with DETECTION_POSTPROCESS ({how}, {n_cal} calibration images from the "
            f"training split)")
        model = detector_int8(trained.spec_model, spec, det.batch_images(arrays.images[pick], spec.in_channels),
                              cfg.seed, labels=ds.class_names, max_detections=o.max_detections,
                              score_threshold=o.score_threshold, iou_threshold=o.iou_threshold, samples=n_cal,
                              dataset_name=ds.name)
        if postprocess_outputs(ts.load_model(model)) is None:
            raise TrainError(f"{spec.name}: the int8 export has no DETECTION_POSTPROCESS outputs")
        return Exported(model=model, quantization=how, calibration=n_cal)

    def evaluate_int8(self, cfg: TrainConfig, inputs: DetectInputs, exported: Exported, phases: dict[str, Trained],
                      log: Log) -> DetectionInt8:
        """The op's detections in TF Lite (reference kernels) and TFLM on the test images, scored with
        ``coco_map`` like the Keras models'."""
        o, spec, part, model = cfg.detection, inputs.spec, inputs.test, exported.model
        where = postprocess_outputs(ts.load_model(model))
        log(f"[eval] int8 model on {len(part)} test images in tf.lite.Interpreter (reference kernels) and TFLM")

        def as_detections(outputs) -> det.Detections:
            found = detections(outputs, where)
            return det.Detections(np.array([d["box"] for d in found], np.float32).reshape(-1, 4),
                                  np.array([d["class"] for d in found], np.int32),
                                  np.array([d["score"] for d in found], np.float32))

        found: dict[str, list[det.Detections]] = {"tflite": [], "tflm": []}
        differences: list[Mismatch] = []
        ties: dict[int, list[Tie]] = {}
        for start in range(0, len(part), 64):
            x, _ = model_inputs(part.take(np.arange(start, min(start + 64, len(part)))), spec.resolution,
                                spec.in_channels)
            xq = quantize_inputs(model, x)
            samples = [xq[i:i + 1] for i in range(len(xq))]
            a, b = run_tflite(model, samples, "reference"), run_tflm(model, samples)
            differences += compare(a, b, start)
            ties.update(head_ties(model, samples, a, b, offset=start))
            found["tflite"] += [as_detections(u) for u in a]
            found["tflm"] += [as_detections(v) for v in b]
        agreement = Agreement.of(len(part), differences, ties)
        k = spec.head.num_classes
        boot = det.bootstrap_map50(part, found["tflm"], k, seed=cfg.seed)
        result = DetectionInt8(
            tflite=CocoMap(**det.coco_map(part, found["tflite"], k)),
            tflm=CocoMap(**det.coco_map(part, found["tflm"], k), bootstrap=Bootstrap(**boot)),
            tflite_vs_tflm=agreement,
            calibration_images=exported.calibration, quantization=exported.quantization,
            postprocess={"op": "TFLite_Detection_PostProcess", "use_regular_nms": False,
                         "max_classes_per_detection": 1, "score_threshold": o.score_threshold,
                         "iou_threshold": o.iou_threshold, "max_detections": o.max_detections},
            flash_bytes=len(model), tflm_arena_bytes=measure_arena(model).total)
        log(f"[eval] int8 test mAP@0.5: TF Lite {fmt(result.tflite.map50)}, TFLM {fmt(result.tflm.map50)}; "
            f"mAP@[.5:.95] TFLM {fmt(result.tflm.map)}; TF Lite vs TFLM: {agreement.describe('images')}")
        return result

    def section(self, cfg: TrainConfig, inputs: DetectInputs, evals: dict[str, Any], exported: Exported | None,
                int8: DetectionInt8 | None) -> DetectResult:
        o, m = cfg.detection, evals["float"].coco
        q = evals["qat"].coco if "qat" in evals else None

        def scores(key: str) -> Scores:
            return Scores(float=m[key], qat=q and q[key], int8_tflite=int8 and getattr(int8.tflite, key),
                          int8_tflm=int8 and getattr(int8.tflm, key))

        return DetectResult(options=o, anchors=inputs.anchors, map50=scores("map50"), map=scores("map"),
                            evaluation=Evaluation(split="test", images=m["images"], boxes=m["boxes"],
                                                  detections=m["detections"], score_threshold=o.score_threshold,
                                                  iou_threshold=o.iou_threshold, max_detections=o.max_detections,
                                                  nms=NMS, metric=METRIC),
                            int8=int8)

    def title(self, inputs: DetectInputs, section: DetectResult) -> str:
        m50, m = section.map50, section.map
        return (f"{inputs.spec.name} on {inputs.dataset.name} @ {inputs.resolution}: float test mAP@0.5 "
                f"{fmt(m50.float)}, mAP {fmt(m.float)}"
                + (f"; QAT {fmt(m50.qat)}, {fmt(m.qat)}" if m50.qat is not None else ""))

    def outputs(self, cfg: TrainConfig, inputs: DetectInputs, phases: dict[str, Trained], evals: dict[str, Any],
                section: DetectResult) -> dict[str, tuple[str, Any]]:
        png = det.plot_detections(inputs.test, evals["float"].detections, inputs.dataset.class_names,
                                  cfg.detection.plot_images,
                                  title="float model, test images: true boxes green, detections (score >= 0.3) red")
        return {"detections": ("detections.png", png)}


def _predict(model: Any, x: np.ndarray, channels: int, batch: int = 64) -> np.ndarray:
    """The concatenated raw outputs ``[B, N, 5 + K]`` of the training model on preprocessed images."""
    x = det.batch_images(x, channels)
    return np.concatenate([np.asarray(model.predict_on_batch(x[i:i + batch])) for i in range(0, len(x), batch)])
