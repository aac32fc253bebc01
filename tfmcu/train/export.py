"""Export and int8 evaluation: the classifier as a 1x1 convolution, inputs quantized like the model's, and the int8
model run in TF Lite and TFLM side by side.

Detectors (a yolo ``NetSpec``): ``detector_int8(model, spec, calibration_images, seed)`` exports the Keras model with
its decode layers (``tfmcu.nets.keras_builder.detector_export_model``: box encodings and scores), full int8, then
appends the detection post-processing (``tfmcu.tflite.detection_postprocess.append_postprocess``: DEQUANTIZE and
TFLite_Detection_PostProcess on ``anchor_grid(spec)`` with ``BOX_SCALES``) and the metadata (labels, anchors per
scale, thresholds; tflite-support's object-detector metadata). ``untrained_detector_int8(spec, seed)`` does the same
for an untrained model (tests, memory work).
"""

from __future__ import annotations

import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tfmcu.data.classify import calibration_inputs
from tfmcu.data.images import NORM_MEAN, NORM_STD
from tfmcu.nets.anchors import BOX_SCALES, anchor_grid
from tfmcu.nets.spec import NetSpec
from tfmcu.runtime.capture import capture_fds, import_tensorflow_quietly
from tfmcu.runtime.model_io import model_info
from tfmcu.runtime.tflite import run_tflite
from tfmcu.runtime.tflm import run_tflm
from tfmcu.tflite import schema as ts
from tfmcu.tflite.detection_postprocess import append_postprocess
from tfmcu.tflite.editor import ModelEditor
from tfmcu.tflite.metadata import add_detector_metadata, add_metadata
from tfmcu.train.config import TrainConfig, TrainError


def with_metadata(plain: bytes, spec: NetSpec, dataset_name: str, class_names: list[str], resolution: int,
                  channels: int, version: str) -> bytes:
    """The exported model's TFLite metadata: labels, the input normalisation (``tfmcu.data``), a description
    (the architecture search counts these bytes in Flash too: ``tfmcu.nas.constraints``)."""
    mean, std = [NORM_MEAN] * channels, [NORM_STD] * channels
    desc = (f"{spec.name} trained on {dataset_name} at {resolution}x{resolution} by tfmcu; int8 input = "
            f"quantize((pixel - {NORM_MEAN}) / {NORM_STD})")
    return add_metadata(plain, class_names, mean, std, name=spec.name, description=desc, version=version,
                        grayscale=(channels == 1))


def classifier_as_conv(model: bytes) -> tuple[bytes, int]:
    """Re-express every int8 FULLY_CONNECTED on a ``(1, C)`` input as RESHAPE -> 1x1 CONV_2D -> RESHAPE.

    Why: TF Lite 2.21's reference FULLY_CONNECTED rescales its accumulators with a single rounding, TFLM's with
    the classic double rounding (SaturatingRoundingDoublingHighMul + RoundingDivideByPOT, which both runtimes'
    CONV_2D use), so some samples get a logit 1 LSB apart (a rounding tie: ``tfmcu.runtime.agreement`` tells it
    from a real difference) and the two interpreters do not give the same bytes. A 1x1 convolution on a 1x1 map is
    the same arithmetic; TFLM's result is unchanged (same multiplier, same rounding) and TF Lite now matches it.
    The weights and bias keep their buffers (the filter tensor is only re-shaped to ``(out, 1, 1, C)``), so Flash
    grows by two tiny shape constants. Returns ``(model, number of FCs converted)``; ops of any other form are left
    alone."""
    ed = ModelEditor(model)
    m, sg = ed.model, ed.subgraph
    fc_code = ts.BuiltinOperator.FULLY_CONNECTED
    targets = []
    for k, op in enumerate(sg.operators):
        if ts.builtin_code(m.operatorCodes[op.opcodeIndex]) != fc_code:
            continue
        ins = [int(i) for i in op.inputs]
        if len(ins) < 2 or len(op.outputs) != 1:
            continue
        x, w, out = sg.tensors[ins[0]], sg.tensors[ins[1]], sg.tensors[int(op.outputs[0])]
        xs, ws, os_ = ts.tensor_shape(x), ts.tensor_shape(w), ts.tensor_shape(out)
        users = sum(int(i) == ins[1] for o in sg.operators for i in o.inputs)
        if (len(xs) == 2 and xs[0] == 1 and len(ws) == 2 and ws[1] == xs[1] and os_ == (1, ws[0]) and users == 1
                and ts.dtype_name(x.type) == "int8" and ts.dtype_name(w.type) == "int8"):
            targets.append(k)
    if not targets:
        return model, 0

    def shape_const(shape: tuple[int, ...], name: str) -> int:
        return ed.constant(np.asarray(shape, np.int32), ts.TensorType.INT32, name, dedupe=False)

    conv_code, reshape_code = ed.builtin_opcode("CONV_2D", 3), ed.builtin_opcode("RESHAPE", 1)
    new_ops = []
    for k, op in enumerate(sg.operators):
        if k not in targets:
            new_ops.append(op)
            continue
        ins = [int(i) for i in op.inputs]
        x_idx, w_idx, out_idx = ins[0], ins[1], int(op.outputs[0])
        c_in = ts.tensor_shape(sg.tensors[x_idx])[1]
        c_out = ts.tensor_shape(sg.tensors[w_idx])[0]
        sg.tensors[w_idx].shape = np.asarray([c_out, 1, 1, c_in], dtype=np.int32)
        sg.tensors[w_idx].shapeSignature = None
        x4 = ed.tensor_like(x_idx, (1, 1, 1, c_in), ts.tensor_name(sg.tensors[x_idx]) + "/as_map")
        y4 = ed.tensor_like(out_idx, (1, 1, 1, c_out), ts.tensor_name(sg.tensors[out_idx]) + "/as_map")
        r1 = ts.OperatorT()
        r1.opcodeIndex = reshape_code
        r1.inputs = np.asarray([x_idx, shape_const((1, 1, 1, c_in), f"fc{k}_in_shape")], dtype=np.int32)
        r1.outputs = np.asarray([x4], dtype=np.int32)
        conv = ts.OperatorT()
        conv.opcodeIndex = conv_code
        conv.inputs = np.asarray([x4, w_idx] + ins[2:3], dtype=np.int32)
        conv.outputs = np.asarray([y4], dtype=np.int32)
        opts = ts.schema.Conv2DOptionsT()
        opts.padding = ts.Padding.VALID
        opts.strideH = opts.strideW = 1
        opts.dilationHFactor = opts.dilationWFactor = 1
        opts.fusedActivationFunction = int(getattr(op.builtinOptions, "fusedActivationFunction", 0) or 0)
        conv.builtinOptionsType = ts.BuiltinOptions.Conv2DOptions
        conv.builtinOptions = opts
        r2 = ts.OperatorT()
        r2.opcodeIndex = reshape_code
        r2.inputs = np.asarray([y4, shape_const((1, c_out), f"fc{k}_out_shape")], dtype=np.int32)
        r2.outputs = np.asarray([out_idx], dtype=np.int32)
        new_ops += [r1, conv, r2]
    sg.operators = new_ops
    return ed.to_bytes(), len(targets)


def quantize_inputs(model: bytes, x: np.ndarray) -> np.ndarray:
    """Float model inputs -> the int8 input tensor's values (its scale and zero point)."""
    t = model_info(model).inputs[0]
    if t.dtype != "int8" or not t.scale:
        raise TrainError(f"the exported model's input is {t.dtype}, expected quantized int8")
    q = np.round(x.astype(np.float64) / t.scale) + t.zero_point
    return np.clip(q, -128, 127).astype(np.int8)


def run_int8(model: bytes, xq: np.ndarray, chunk: int = 250, progress: Callable[[int, int], None] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Outputs (N, classes) of the int8 model in TF Lite (reference kernels) and in TFLM.

    The two interpreters run side by side (TF Lite's ``invoke`` releases the GIL); chunks keep memory flat and
    feed the progress bar."""
    n = len(xq)
    outs_tfl, outs_tflm = [], []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for start in range(0, n, chunk):
            samples = [xq[i:i + 1] for i in range(start, min(n, start + chunk))]
            fa = pool.submit(run_tflite, model, samples, "reference")
            fb = pool.submit(run_tflm, model, samples)
            outs_tfl += [o[0].reshape(-1) for o in fa.result()]
            outs_tflm += [o[0].reshape(-1) for o in fb.result()]
            if progress:
                progress(min(n, start + chunk), n)
    return np.stack(outs_tfl), np.stack(outs_tflm)


def confusion(labels: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    m = np.zeros((k, k), np.int64)
    np.add.at(m, (labels, pred), 1)
    return m




def quiet_convert(convert, *args):
    """The TFLite converter without its stderr chatter (a UserWarning and C++ prints on every conversion); the
    captured text is shown if the conversion fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with capture_fds((2,)) as text:
                return convert(*args)
        except Exception:
            sys.stderr.write("".join(text)[-4000:] if text else "")
            raise


def untrained_int8(spec: NetSpec, seed: int, as_conv: bool = True) -> bytes:
    """The spec as a full-int8 .tflite with untrained weights, exported like a trained one (classifier as a 1x1
    conv: the same operators and tensors, hence the same TFLM arena and instructions). ``as_conv=False`` keeps the
    converter's FULLY_CONNECTED classifier (a model TF Lite runs whatever the weights, for ``fit --model``)."""
    from tfmcu.nets.convert import random_representative, to_int8_tflite  # lazy: imports TensorFlow
    from tfmcu.nets.keras_builder import build_keras  # lazy: imports TensorFlow

    model = build_keras(spec, seed)
    data = quiet_convert(to_int8_tflite, model, random_representative(tuple(model.input_shape[1:]), samples=2))
    return classifier_as_conv(data)[0] if as_conv else data


BATCHNORM_SAMPLES = 32  # untrained batch norms' statistics: from at most this many of the calibration inputs


@dataclass(frozen=True, kw_only=True)
class KerasInt8:
    """A Keras file converted to full int8 (``int8_from_keras``) and what its ranges came from."""

    data: bytes
    calibrated_on: str  # what the int8 ranges were calibrated on
    batchnorm_on: str | None  # untrained batch norms: what their statistics were estimated on (None: the file's)


def int8_from_keras(path: str, seed: int = 0, calibration_data: str | None = None) -> KerasInt8:
    """A Keras model file as a full-int8 .tflite. Its int8 ranges are calibrated on ``calibration_data`` (a folder
    of class folders or a ``.npy`` of model inputs: ``tfmcu.data.classify.calibration_inputs``; at most
    ``TrainConfig.calibration_samples`` of them, drawn with ``seed``) or, without it, on seeded random inputs (what
    the model computes is the file's; its ranges are not those of real data). Batch norms that still have their
    initial statistics (untrained weights: ``tfmcu.nets.convert.initial_batchnorm``) get those of the first
    ``BATCHNORM_SAMPLES`` of these inputs (``calibrate_batchnorm``): their activations would otherwise shrink into
    ranges TF Lite cannot run."""
    from tfmcu.nets.convert import (  # lazy: imports TensorFlow
        calibrate_batchnorm, initial_batchnorm, random_representative, to_int8_tflite)

    import_tensorflow_quietly()
    import tf_keras  # lazy: imports TensorFlow (TF_USE_LEGACY_KERAS: the Keras 2 loader)

    model = tf_keras.models.load_model(path, compile=False)
    shape = tuple(model.input_shape[1:])
    if calibration_data:
        x = calibration_inputs(calibration_data, shape, TrainConfig().calibration_samples, seed)
        on = f"{len(x)} inputs from {calibration_data}"
    else:
        x = np.concatenate([b for (b,) in random_representative(shape, samples=4, seed=seed)()])
        on = "seeded random inputs"
    batchnorm_on = None
    if initial_batchnorm(model):
        calibrate_batchnorm(model, x[:BATCHNORM_SAMPLES])
        batchnorm_on = on

    def representative():
        for i in range(len(x)):
            yield [x[i:i + 1]]

    return KerasInt8(data=quiet_convert(to_int8_tflite, model, representative), calibrated_on=on,
                     batchnorm_on=batchnorm_on)


# ----------------------------------------------------------------------------- detectors
def detector_tflite(plain: bytes, spec: NetSpec, labels: list[str] | None = None, max_detections: int = 10,
                    score_threshold: float = 0.3, iou_threshold: float = 0.5, dataset_name: str = "",
                    version: str = "", metadata: bool = True) -> bytes:
    """The full-int8 export of ``detector_export_model`` (outputs: box encodings, scores) with the detection
    post-processing on ``anchor_grid(spec)`` and, with ``metadata``, the object-detector metadata (labels: the
    class names, default ``class_0`` ...)."""
    k = spec.head.num_classes
    labels = [f"class_{i}" for i in range(k)] if labels is None else [str(v) for v in labels]
    data = append_postprocess(plain, anchor_grid(spec), k, max_detections, score_threshold, iou_threshold,
                              box_scales=BOX_SCALES, labels=labels, anchors_per_scale=spec.head.anchors,
                              where=spec.name)
    if not metadata:
        return data
    ch = spec.in_channels
    desc = (f"{spec.name} object detector" + (f" trained on {dataset_name}" if dataset_name else "")
            + f" at {spec.resolution}x{spec.resolution} by tfmcu; int8 input = quantize((pixel - "
            f"{NORM_MEAN}) / {NORM_STD}); outputs: TFLite_Detection_PostProcess's boxes (ymin, "
            f"xmin, ymax, xmax fractions), classes, scores, number of detections")
    return add_detector_metadata(data, labels, [NORM_MEAN] * ch, [NORM_STD] * ch, name=spec.name,
                                 description=desc, version=version, grayscale=(ch == 1))


def detector_int8(model, spec: NetSpec, calibration_images: np.ndarray, seed: int, labels: list[str] | None = None,
                  max_detections: int = 10, score_threshold: float = 0.3, iou_threshold: float = 0.5,
                  samples: int = 200, dataset_name: str = "", version: str = "", metadata: bool = True) -> bytes:
    """A yolo Keras model (``build_keras(spec)``, trained or QAT) as a full-int8 detector .tflite that ends in
    TFLite_Detection_PostProcess (see the module docstring). ``calibration_images``: float model inputs
    [n, H, W, C] (normalised as for training); at most ``samples`` of them, drawn with ``seed``, calibrate."""
    from tfmcu.nets.convert import to_int8_tflite  # lazy: imports TensorFlow
    from tfmcu.nets.keras_builder import detector_export_model  # lazy: imports TensorFlow

    x = np.asarray(calibration_images, dtype=np.float32)
    want = tuple(int(d) for d in model.input_shape[1:])
    if x.ndim != 4 or tuple(x.shape[1:]) != want or len(x) == 0:
        raise TrainError(f"calibration images: expected [n, {', '.join(map(str, want))}] with n >= 1, got "
                         f"{list(x.shape)}")
    pick = np.sort(np.random.default_rng(seed).permutation(len(x))[:max(1, int(samples))])

    def representative():
        for i in pick:
            yield [x[i:i + 1]]

    plain = quiet_convert(to_int8_tflite, detector_export_model(model, spec), representative)
    return detector_tflite(plain, spec, labels, max_detections, score_threshold, iou_threshold, dataset_name,
                           version, metadata)


def spread_untrained(model, spec: NetSpec, images: np.ndarray, seed: int) -> None:
    """Give an untrained yolo model, in place, the activation spread of a trained one on ``images``: every batch
    norm's moving statistics become those of ``images`` (one forward pass in training mode with momentum 0, as
    training would set them), then each prediction conv (``head_scale{i}_pred``) is rescaled so that every output
    channel has mean 0 and standard deviation 1, plus a seeded N(0, 0.5) offset. Why: with Glorot weights and the
    initial statistics (mean 0, variance 1) the features shrink layer by layer to about 1e-10 at the head, so every
    anchor got the same encodings and a 0.25 score: nothing to compare detections on."""
    import tf_keras  # lazy: imports TensorFlow

    from tfmcu.nets.convert import calibrate_batchnorm  # lazy: imports TensorFlow

    calibrate_batchnorm(model, images)
    rng = np.random.default_rng(seed)
    for sc in spec.detection_scales():
        pred = model.get_layer(f"{sc.name}_pred")
        feats = tf_keras.Model(model.inputs, pred.input)(images, training=False).numpy().astype(np.float64)
        kernel, bias = pred.get_weights()
        y = feats.reshape(-1, feats.shape[-1]) @ kernel.reshape(kernel.shape[-2], kernel.shape[-1])
        mean, std = y.mean(axis=0), y.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        offset = rng.normal(0.0, 0.5, size=bias.shape)
        pred.set_weights([(kernel / std).astype(kernel.dtype), (offset - mean / std).astype(bias.dtype)])


def untrained_detector_int8(spec: NetSpec, seed: int, max_detections: int = 10, score_threshold: float = 0.3,
                            iou_threshold: float = 0.5, calibration: int = 4, metadata: bool = True) -> bytes:
    """A yolo ``spec`` with untrained weights (spread as a trained model's: ``spread_untrained``) as the detector
    .tflite ``detector_int8`` writes, calibrated on ``calibration`` seeded uniform random inputs in [-1, 1]."""
    from tfmcu.nets.keras_builder import build_keras  # lazy: imports TensorFlow

    model = build_keras(spec, seed)
    shape = tuple(int(d) for d in model.input_shape[1:])
    images = np.random.default_rng(seed).uniform(-1.0, 1.0, (max(1, calibration),) + shape).astype(np.float32)
    spread_untrained(model, spec, images, seed)
    return detector_int8(model, spec, images, seed, max_detections=max_detections, score_threshold=score_threshold,
                         iou_threshold=iou_threshold, samples=len(images), metadata=metadata)
