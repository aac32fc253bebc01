"""Train -> QAT -> full-int8 .tflite on real data, with accuracy measured in TF Lite and TFLM and the model's memory.

``train(config, out_dir)`` is the library behind ``pipelines/train.py`` (and ``make demo``):

1. data: ``tfmcu.data`` (Fashion-MNIST by default, MNIST, or a folder of class folders), resized to the spec's
   resolution, grey replicated to 3 channels; a validation split held out of the training set; the test set is
   used only for the final numbers;
2. float training: SGD with momentum, cosine decay (optional linear warm-up), weight decay 4e-5 on conv / dense
   kernels, optional label smoothing -- the MCUNetV2 recipe scaled down (``Recipe``); after every epoch the
   batch-norm statistics are re-calibrated on fixed training batches (as MCUNetV2 does for its sub-networks), then
   the validation split is evaluated and a checkpoint written;
3. quantization-aware training with tensorflow-model-optimization for ``qat_epochs`` at a tenth of the learning
   rate (``quantize``: the default 8-bit scheme; layers its registry does not know, the squeeze-excite
   ``Multiply``, get an output-only quantize config -- configuration only, the builder is untouched);
4. export: full-int8 .tflite (int8 input and output, per-channel weights) calibrated on a representative set drawn
   from the training data; the classifier as a 1x1 CONV_2D (``classifier_as_conv``: TF Lite's reference
   FULLY_CONNECTED rounds differently from TFLM's); TFLite metadata (labels, normalisation; ``tfmcu.metadata``);
5. evaluation: float, QAT and int8 test accuracy; the int8 model runs in ``tf.lite.Interpreter`` (reference
   kernels) and in the TFLM interpreter, whose outputs must agree sample for sample; analytic peak SRAM, TFLM's
   measured and predicted arena, Flash and MACs;
6. outputs (written atomically): ``model_int8.tflite``, ``spec.json``, ``labels.txt``, ``train_report.json``,
   ``training_curves.png``, ``confusion_matrix.png``; ``checkpoints/`` holds one checkpoint per epoch
   (``resume=True`` continues from the last one, bit for bit like an uninterrupted run).

Determinism: the model's initial weights (``build_keras(spec, seed)``), the data order and augmentation
(``tfmcu.data``) and TF's op-level randomness are seeded, and ``tf.config.experimental.enable_op_determinism`` is
on, so two runs with one seed give the same weights on the same machine.

Distribution (``strategy``): ``default`` (one device), ``mirrored`` (all local GPUs, synchronous) or
``multi_worker`` (``MultiWorkerMirroredStrategy``, cluster from ``TF_CONFIG``); ``batch_size`` is the global batch.
Only the chief writes the outputs; the other workers checkpoint into a temporary folder (Keras' rule) and every
worker resumes from the chief's ``out_dir/checkpoints`` (put ``out_dir`` on a shared filesystem).

Errors the user can fix are ``TrainError`` / ``tfmcu.data.DataError`` / ``tfmcu.models.ModelError`` /
``tfmcu.metadata.MetadataError`` (ValueErrors, one line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu import data as data_mod  # noqa: E402
from tfmcu.spec import NetSpec  # noqa: E402

KB = 1024
STATE_FILE = "state.json"
STATE_VERSION = 1


class TrainError(ValueError):
    """A training setting, checkpoint or spec that cannot be used; one line."""


# ============================================================================= configuration
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
    dataset: str = "fashion_mnist"  # fashion_mnist | mnist | folder of class folders
    data_dir: str | None = None  # where the IDX files are (default: the installed location)
    resolution: int | None = None  # default: the spec's
    width: float | None = None
    recipe: Recipe = field(default_factory=Recipe)
    val_split: float = 5000  # samples (or a fraction < 1) held out of the training set
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
    verbose: int | None = None  # Keras fit verbosity (None: progress bar on a terminal, one line per epoch else)

    def fingerprint(self, spec: NetSpec) -> str:
        """What a checkpoint depends on: resuming with other settings would silently train something else."""
        keep = {"spec": spec.to_dict(), "dataset": self.dataset, "recipe": dataclasses.asdict(self.recipe),
                "val_split": self.val_split, "train_subset": self.train_subset,
                "steps_per_epoch": self.steps_per_epoch, "qat_steps_per_epoch": self.qat_steps_per_epoch,
                "seed": self.seed}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


# ============================================================================= helpers
def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def resolve_spec(cfg: TrainConfig, ds: data_mod.Dataset) -> NetSpec:
    """The spec to train, checked against the data set: classes, channels, resolution."""
    from tfmcu import models

    is_json = cfg.model.endswith(".json")
    spec = models.load_spec(cfg.model, resolution=cfg.resolution, width=cfg.width,
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


def make_strategy(name: str):
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise TrainError("--strategy=multi_worker needs TF_CONFIG (JSON with 'cluster' and 'task') on every "
                             "worker")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise TrainError(f"TF_CONFIG is not valid JSON ({e.msg})") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise TrainError(f"unknown strategy '{name}'; known: default, mirrored, multi_worker")


def is_chief(strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


def configure_determinism(seed: int, deterministic: bool) -> None:
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


# ============================================================================= QAT
def quantize(model) -> tuple[Any, list[str]]:
    """``tfmot.quantization.keras.quantize_model`` for our builder's models; returns (QAT model, notes).

    Conv-BN-ReLU(6), depthwise-BN-ReLU(6), Add, zero padding, pooling and Dense are in tfmot's default 8-bit
    registry. The squeeze-excite ``Multiply`` is not: it is annotated with ``Default8BitOutputQuantizeConfig``
    (fake-quantize its output, as the int8 MUL kernel requires) -- configuration only, the model is unchanged."""
    import tensorflow_model_optimization as tfmot
    import tf_keras
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit.default_8bit_quantize_configs \
        import Default8BitOutputQuantizeConfig

    qk = tfmot.quantization.keras
    multiply = [layer.name for layer in model.layers if isinstance(layer, tf_keras.layers.Multiply)]
    notes = []
    try:
        if not multiply:
            return qk.quantize_model(model), notes

        def annotate(layer):
            if isinstance(layer, tf_keras.layers.Multiply):
                return qk.quantize_annotate_layer(layer, Default8BitOutputQuantizeConfig())
            return layer  # the same layer object: weights are shared, not copied

        annotated = qk.quantize_annotate_model(tf_keras.models.clone_model(model, clone_function=annotate))
        with qk.quantize_scope({"Default8BitOutputQuantizeConfig": Default8BitOutputQuantizeConfig}):
            qat = qk.quantize_apply(annotated)
        notes.append(f"{len(multiply)} Multiply layer(s) (squeeze-excite) quantized with "
                     f"Default8BitOutputQuantizeConfig (not in tfmot's default 8-bit registry)")
        return qat, notes
    except (RuntimeError, ValueError) as e:
        raise TrainError(f"QAT: tfmot cannot quantize {model.name}: {str(e).splitlines()[0]}") from None


# ============================================================================= optimizer
def make_optimizer(lr: float, momentum: float, nesterov: bool, weight_decay: float, total_steps: int,
                   warmup_steps: int = 0):
    import tf_keras

    total_steps = max(1, int(total_steps))
    warmup_steps = min(int(warmup_steps), total_steps - 1) if total_steps > 1 else 0
    if warmup_steps > 0:
        schedule = tf_keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=lr * 0.01, decay_steps=total_steps - warmup_steps, alpha=0.0,
            warmup_target=lr, warmup_steps=warmup_steps)
    else:
        schedule = tf_keras.optimizers.schedules.CosineDecay(initial_learning_rate=lr, decay_steps=total_steps,
                                                             alpha=0.0)
    opt = tf_keras.optimizers.SGD(learning_rate=schedule, momentum=momentum, nesterov=nesterov,
                                  weight_decay=weight_decay or None)
    if weight_decay:
        # Decay conv / depthwise / dense kernels only: not batch-norm scales and shifts, biases or quantizer ranges.
        opt.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "_min", "_max", "min_var", "max_var"])
    return opt


def current_lr(opt) -> float:
    lr = opt.learning_rate
    if callable(lr):
        return float(lr(opt.iterations))
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


def compile_model(model, opt, label_smoothing: float) -> None:
    import tf_keras

    model.compile(optimizer=opt,
                  loss=tf_keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
                  metrics=[tf_keras.metrics.CategoricalAccuracy(name="accuracy")])


_RECAL_STEPS: "weakref.WeakKeyDictionary[Any, dict[float, Any]]" = weakref.WeakKeyDictionary()


def recalibrate_bn(model, batches, n: int, strategy=None) -> None:
    """Re-estimate every batch norm's moving mean / variance for the current weights (MCUNetV2 re-calibrates BN
    statistics the same way): forward passes in training mode over ``n`` fixed batches, the first with momentum 0
    (its statistics replace the stale ones), the others with momentum 0.9. Weights are not touched. Short runs need
    it: the moving averages lag far behind weights that change quickly, and the error compounds with depth.

    The two forward functions are traced once per model and cached (BN reads its momentum when traced), so
    re-calibrating every epoch costs only the forward passes."""
    import tensorflow as tf
    import tf_keras

    bns = [layer for layer in _all_layers(model) if isinstance(layer, tf_keras.layers.BatchNormalization)]
    if not bns or n <= 0:
        return
    strategy = strategy or tf.distribute.get_strategy()
    fns = _RECAL_STEPS.setdefault(model, {})

    def make_step():
        @tf.function
        def step(x):
            def fwd(xs):
                model(xs, training=True)
                return tf.constant(0)
            return strategy.run(fwd, args=(x,))
        return step

    images = batches.map(lambda x, y: x).take(n)
    if strategy.num_replicas_in_sync > 1:
        images = strategy.experimental_distribute_dataset(images)
    saved = [b.momentum for b in bns]
    try:
        for i, x in enumerate(images):
            momentum = 0.0 if i == 0 else 0.9
            for b in bns:  # read when the step function is traced (first use), so set it before every call
                b.momentum = momentum
            if momentum not in fns:
                fns[momentum] = make_step()
            fns[momentum](x)
    finally:
        for b, m in zip(bns, saved):
            b.momentum = m


def _all_layers(model) -> list[Any]:
    """Layers, looking inside tfmot's QuantizeWrapper (which holds the real layer as ``.layer``)."""
    out = []
    for layer in model.layers:
        out.append(layer)
        inner = getattr(layer, "layer", None)
        if inner is not None:
            out.append(inner)
    return out


# ============================================================================= checkpoints
class Checkpoints:
    """One checkpoint per epoch under ``folder`` (the latest kept), and ``state.json`` saying where we are.

    ``write_folder`` (default ``folder``) is where new checkpoints go: non-chief workers of a multi-worker run must
    save too (collective ops) but into a private folder; everyone resumes from the chief's ``folder``."""

    def __init__(self, folder: str, fingerprint: str, log: Callable[[str], None], write_folder: str | None = None):
        self.folder = folder
        self.write_folder = write_folder or folder
        self.fingerprint = fingerprint
        self.log = log
        self.state_path = os.path.join(folder, STATE_FILE)

    def load_state(self) -> dict[str, Any] | None:
        if not os.path.exists(self.state_path):
            return None
        try:
            with open(self.state_path) as f:
                state = json.load(f)
            ok = (isinstance(state, dict) and state.get("version") == STATE_VERSION
                  and state.get("phase") in ("float", "qat") and isinstance(state.get("epoch"), int)
                  and isinstance(state.get("history"), dict) and isinstance(state.get("checkpoint"), str))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TrainError(f"{self.state_path}: corrupted checkpoint state ({type(e).__name__}); delete "
                             f"{self.folder} or run without --resume") from None
        if not ok:
            raise TrainError(f"{self.state_path}: corrupted checkpoint state (missing fields); delete {self.folder} "
                             f"or run without --resume")
        if state.get("fingerprint") != self.fingerprint:
            raise TrainError(f"{self.folder}: the checkpoint was written for another model, data set or recipe; "
                             f"run with the same settings, or without --resume to start over")
        return state

    def save(self, ckpt, phase: str, epoch: int, history: dict[str, Any], float_final: str | None) -> None:
        from tfmcu.report import write_outputs

        name = f"{phase}-{epoch:04d}"
        os.makedirs(self.write_folder, exist_ok=True)
        ckpt.write(os.path.join(self.write_folder, name))
        state = {"version": STATE_VERSION, "fingerprint": self.fingerprint, "phase": phase, "epoch": epoch,
                 "checkpoint": name, "float_final": float_final, "history": history}
        write_outputs({os.path.join(self.write_folder, STATE_FILE): state})
        self._prune(keep={name, float_final})

    def write_extra(self, ckpt, name: str) -> str:
        os.makedirs(self.write_folder, exist_ok=True)
        ckpt.write(os.path.join(self.write_folder, name))
        return name

    def restore(self, ckpt, name: str, what: str) -> None:
        import tensorflow as tf

        prefix = os.path.join(self.folder, name)
        try:
            status = ckpt.read(prefix)
            status.assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError, OSError, IndexError, KeyError, TypeError) as e:
            # (a truncated data file surfaces as IndexError from the checkpoint reader)
            msg = getattr(e, "message", None) or str(e)
            raise TrainError(f"{prefix}: corrupted or incompatible {what} checkpoint ({type(e).__name__}: "
                             f"{msg.splitlines()[0][:160] if msg else ''}); delete {self.folder} or run without "
                             f"--resume") from None

    def _prune(self, keep: set[str | None]) -> None:
        for f in os.listdir(self.write_folder):
            base = f.split(".")[0]
            if f == STATE_FILE or base in keep or f.startswith(".tmp-"):
                continue
            if base.startswith(("float-", "qat-")) and (".index" in f or ".data-" in f):
                os.unlink(os.path.join(self.write_folder, f))


# ============================================================================= export
def classifier_as_conv(model: bytes) -> tuple[bytes, int]:
    """Re-express every int8 FULLY_CONNECTED on a ``(1, C)`` input as RESHAPE -> 1x1 CONV_2D -> RESHAPE.

    Why: TF Lite 2.21's reference FULLY_CONNECTED rescales its accumulators with a single rounding, TFLM's with
    the classic double rounding (SaturatingRoundingDoublingHighMul + RoundingDivideByPOT, which both runtimes'
    CONV_2D use), so about 2% of samples got a logit 1 LSB apart and the two interpreters could not agree sample
    for sample. A 1x1 convolution on a 1x1 map is the same arithmetic; TFLM's result is unchanged (same
    multiplier, same rounding) and TF Lite now matches it. The weights and bias keep their buffers (the filter
    tensor is only re-shaped to ``(out, 1, 1, C)``), so Flash grows by two tiny shape constants. Returns
    ``(model, number of FCs converted)``; ops of any other form are left alone."""
    from tfmcu import tflite_schema as ts

    m = ts.load_model(model)
    sg = m.subgraphs[0]
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

    def code(name: str, version: int) -> int:
        value = getattr(ts.BuiltinOperator, name)
        for i, c in enumerate(m.operatorCodes):
            if ts.builtin_code(c) == value:
                c.version = max(int(c.version or 1), version)
                return i
        c = ts.OperatorCodeT()
        c.builtinCode = value
        c.deprecatedBuiltinCode = min(value, 127)
        c.version = version
        m.operatorCodes.append(c)
        return len(m.operatorCodes) - 1

    def new_tensor(like: int, shape: tuple[int, ...], suffix: str) -> int:
        import copy

        t = copy.deepcopy(sg.tensors[like])
        t.shape = np.asarray(shape, dtype=np.int32)
        t.shapeSignature = None
        t.name = (ts.tensor_name(sg.tensors[like]) + suffix).encode()
        t.buffer = 0
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    def shape_const(shape: tuple[int, ...], name: str) -> int:
        buf = ts.BufferT()
        buf.data = np.frombuffer(np.asarray(shape, np.int32).tobytes(), dtype=np.uint8).copy()
        m.buffers.append(buf)
        t = ts.TensorT()
        t.shape = np.asarray([len(shape)], dtype=np.int32)
        t.type = ts.TensorType.INT32
        t.buffer = len(m.buffers) - 1
        t.name = name.encode()
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    conv_code, reshape_code = code("CONV_2D", 3), code("RESHAPE", 1)
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
        x4 = new_tensor(x_idx, (1, 1, 1, c_in), "/as_map")
        y4 = new_tensor(out_idx, (1, 1, 1, c_out), "/as_map")
        r1 = ts.OperatorT()
        r1.opcodeIndex = reshape_code
        r1.inputs = np.asarray([x_idx, shape_const((1, 1, 1, c_in), f"fc{k}_in_shape")], dtype=np.int32)
        r1.outputs = np.asarray([x4], dtype=np.int32)
        conv = ts.OperatorT()
        conv.opcodeIndex = conv_code
        conv.inputs = np.asarray([x4, w_idx] + ins[2:3], dtype=np.int32)
        conv.outputs = np.asarray([y4], dtype=np.int32)
        opts = schema.Conv2DOptionsT()
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
    return ts.write_model(m), len(targets)


# ============================================================================= int8 evaluation
def quantize_inputs(model: bytes, x: np.ndarray) -> np.ndarray:
    """Float model inputs -> the int8 input tensor's values (its scale and zero point)."""
    from tfmcu import tflm

    t = tflm.model_info(model).inputs[0]
    if t.dtype != "int8" or not t.scale:
        raise TrainError(f"the exported model's input is {t.dtype}, expected quantized int8")
    q = np.round(x.astype(np.float64) / t.scale) + t.zero_point
    return np.clip(q, -128, 127).astype(np.int8)


def run_int8(model: bytes, xq: np.ndarray, chunk: int = 250, progress: Callable[[int, int], None] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Outputs (N, classes) of the int8 model in TF Lite (reference kernels) and in TFLM.

    The two interpreters run side by side (TF Lite's ``invoke`` releases the GIL); chunks keep memory flat and
    feed the progress bar."""
    from concurrent.futures import ThreadPoolExecutor

    from tfmcu import tflm

    n = len(xq)
    outs_tfl, outs_tflm = [], []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for start in range(0, n, chunk):
            samples = [xq[i:i + 1] for i in range(start, min(n, start + chunk))]
            fa = pool.submit(tflm.run_tflite, model, samples, "reference")
            fb = pool.submit(tflm.run_tflm, model, samples)
            outs_tfl += [o[0].reshape(-1) for o in fa.result()]
            outs_tflm += [o[0].reshape(-1) for o in fb.result()]
            if progress:
                progress(min(n, start + chunk), n)
    return np.stack(outs_tfl), np.stack(outs_tflm)


def confusion(labels: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    m = np.zeros((k, k), np.int64)
    np.add.at(m, (labels, pred), 1)
    return m


# ============================================================================= plots
def plot_curves(history: dict[str, list[dict[str, Any]]], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("float", r) for r in history.get("float", [])] + [("qat", r) for r in history.get("qat", [])]
    x = np.arange(1, len(rows) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "loss", "loss"), (axes[1], "accuracy", "accuracy")):
        for prefix, style in (("", "-o"), ("val_", "-s")):
            ys = [r.get(prefix + key) for _, r in rows]
            if any(v is not None for v in ys):
                ax.plot(x, [np.nan if v is None else v for v in ys], style, markersize=3,
                        label=("validation " if prefix else "train ") + label)
        n_float = len(history.get("float", []))
        if history.get("qat"):
            ax.axvspan(n_float + 0.5, len(rows) + 0.5, color="#dddddd", alpha=0.6, label="QAT")
        ax.set_xlabel("epoch (float, then QAT)")
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def plot_confusion(matrix: np.ndarray, names: list[str], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(names)
    size = max(5.0, 0.5 * k + 2.5)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    ax.imshow(matrix, cmap="Blues")
    if k <= 30:
        peak = matrix.max() or 1
        for i in range(k):
            for j in range(k):
                if matrix[i, j]:
                    ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if matrix[i, j] > peak / 2 else "black")
        ax.set_xticks(range(k))
        ax.set_yticks(range(k))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


# ============================================================================= the pipeline
def _verbose(cfg: TrainConfig) -> int:
    if cfg.verbose is not None:
        return cfg.verbose
    return 1 if sys.stdout.isatty() else 2


def _epoch_record(h: dict[str, list[float]], epoch: int, lr: float, seconds: float, samples: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"epoch": epoch, "lr": round(lr, 8), "seconds": round(seconds, 2), "samples": samples}
    for k, v in h.items():
        rec[k] = float(v[-1])
    return rec


def train(cfg: TrainConfig, out_dir: str, log: Callable[[str], None] = _log_default) -> dict[str, Any]:
    """Run the whole pipeline; returns the report (also written to ``out_dir/train_report.json``)."""
    t_start = time.time()
    recipe = cfg.recipe.validate()
    if cfg.strategy not in ("default", "mirrored", "multi_worker"):
        raise TrainError(f"unknown strategy '{cfg.strategy}'; known: default, mirrored, multi_worker")
    if cfg.calibration_samples < 1:
        raise TrainError("calibration_samples must be >= 1")

    ds = data_mod.load(cfg.dataset, cfg.data_dir, cfg.test_fraction, cfg.seed)
    spec = resolve_spec(cfg, ds)
    res, ch = spec.resolution, spec.in_channels
    train_split, val_split = data_mod.split_validation(ds.train, cfg.val_split, cfg.seed)
    train_split = data_mod.subset(train_split, cfg.train_subset, cfg.seed)
    if len(train_split) < recipe.batch_size:
        raise TrainError(f"the training split has {len(train_split)} samples, fewer than one batch "
                         f"({recipe.batch_size})")
    data_mod.check_decodable(train_split)
    flip = ds.flip if recipe.flip == "auto" else recipe.flip == "yes"
    # The checkpoint state is checked before TensorFlow loads, so a bad one fails fast.
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    ckpts = Checkpoints(ckpt_dir, cfg.fingerprint(spec), log)
    state = ckpts.load_state() if cfg.resume else None

    import tensorflow as tf
    import tf_keras

    strategy = make_strategy(cfg.strategy)  # before any other TF work (multi-worker needs it first)
    configure_determinism(cfg.seed, cfg.deterministic)
    chief = is_chief(strategy)
    replicas = strategy.num_replicas_in_sync
    if recipe.batch_size % replicas:
        raise TrainError(f"batch_size {recipe.batch_size} is not a multiple of the {replicas} replicas")

    steps = len(train_split) // recipe.batch_size
    if cfg.steps_per_epoch:
        steps = min(steps, cfg.steps_per_epoch)
    log(f"[train] {spec.name} @ {res}x{res}x{ch} on {ds.name}: {len(train_split)} train / {len(val_split)} "
        f"validation / {len(ds.test)} test samples, {ds.num_classes} classes; {steps} steps of {recipe.batch_size} "
        f"per epoch; strategy {cfg.strategy} ({replicas} replica{'s' if replicas > 1 else ''})")

    if not chief:
        ckpts.write_folder = tempfile.mkdtemp(prefix="tfmcu-worker-ckpt-")
    if cfg.resume and state is None:
        log(f"[train] --resume: no checkpoint in {ckpt_dir}, starting from scratch")
    history: dict[str, list[dict[str, Any]]] = state["history"] if state else {"float": [], "qat": []}
    history.setdefault("float", [])
    history.setdefault("qat", [])

    def onehot(x, y):
        return x, tf.one_hot(y, ds.num_classes)

    val_ds = (data_mod.eval_dataset(val_split, res, ch, 256).map(onehot) if len(val_split) else None)
    verbose = _verbose(cfg)

    qat_steps = min(steps, cfg.qat_steps_per_epoch) if cfg.qat_steps_per_epoch else steps
    # Batch-norm re-calibration batches: fixed training images, no augmentation.
    calib_ds = data_mod.train_dataset(train_split, res, ch, recipe.batch_size, cfg.seed + 2000, 0, augment=False,
                                      steps=max(1, recipe.bn_recalibration_batches)).map(onehot)

    def run_phase(phase: str, model, opt, ckpt, epochs: int, start: int, seed_offset: int,
                  float_final: str | None) -> None:
        n_steps = steps if phase == "float" else qat_steps
        for epoch in range(start, epochs):
            t0 = time.time()
            log(f"[train] {phase} epoch {epoch + 1}/{epochs} (lr {current_lr(opt):.4g})")
            train_ds = data_mod.train_dataset(train_split, res, ch, recipe.batch_size, cfg.seed + seed_offset, epoch,
                                              augment=recipe.augment, flip=flip, steps=n_steps).map(onehot)
            t_fit = time.time()
            h = model.fit(train_ds, epochs=1, verbose=verbose)
            rec = _epoch_record(h.history, epoch + 1, current_lr(opt), time.time() - t0, n_steps * recipe.batch_size)
            rec["fit_seconds"] = round(time.time() - t_fit, 2)
            if recipe.bn_recalibration_batches:
                # Only the moving statistics change (training-mode passes use batch statistics), so the training
                # trajectory is the same; validation and the checkpoint then see BN statistics of these weights.
                recalibrate_bn(model, calib_ds, recipe.bn_recalibration_batches, strategy)
            if val_ds is not None:
                v = model.evaluate(val_ds, verbose=0, return_dict=True)
                rec["val_loss"], rec["val_accuracy"] = float(v["loss"]), float(v["accuracy"])
            rec["seconds"] = round(time.time() - t0, 2)
            t_save = time.time()
            history[phase].append(rec)
            ckpts.save(ckpt, phase, epoch + 1, history, float_final)
            val = f", val acc {rec['val_accuracy']:.4f}" if "val_accuracy" in rec else ""
            log(f"[train] {phase} epoch {epoch + 1}: loss {rec['loss']:.4f}, acc {rec['accuracy']:.4f}{val} "
                f"({rec['seconds']:.0f} s, training {rec['fit_seconds']:.0f} s; checkpoint "
                f"{time.time() - t_save:.1f} s)")

    # ---------------------------------------------------------------- float
    with strategy.scope():
        float_model = _build(spec, cfg.seed, recipe.bn_momentum)
        float_opt = make_optimizer(recipe.lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                                   steps * max(recipe.epochs, 1), int(round(recipe.warmup_epochs * steps)))
        float_opt.build(float_model.trainable_variables)
        compile_model(float_model, float_opt, recipe.label_smoothing)
        float_ckpt = tf.train.Checkpoint(model=float_model, optimizer=float_opt)
    float_start = 0
    if state and state["phase"] == "float":
        ckpts.restore(float_ckpt, state["checkpoint"], "float")
        float_start = state["epoch"]
        history["float"] = history["float"][:float_start]
        log(f"[train] resumed after float epoch {float_start} from {os.path.join(ckpt_dir, state['checkpoint'])}")
    elif state and state["phase"] == "qat":
        if not state.get("float_final"):
            raise TrainError(f"{ckpts.state_path}: corrupted checkpoint state (QAT without the float weights); "
                             f"delete {ckpt_dir} or run without --resume")
        ckpts.restore(tf.train.Checkpoint(model=float_model), state["float_final"], "float")
        float_start = recipe.epochs
    t_float = time.time()
    run_phase("float", float_model, float_opt, float_ckpt, recipe.epochs, float_start, 0, None)
    t_float = time.time() - t_float

    def onehot_eval(split, limit):
        part = data_mod.subset(split, limit, cfg.seed)
        return part, data_mod.eval_dataset(part, res, ch, 256).map(onehot)

    test_part, test_ds = onehot_eval(ds.test, cfg.test_subset)
    log(f"[eval] float model on {len(test_part)} test samples")
    float_acc = float(float_model.evaluate(test_ds, verbose=0, return_dict=True)["accuracy"])
    log(f"[eval] float test accuracy {float_acc:.4f}")

    # ---------------------------------------------------------------- QAT
    qat_model, qat_notes, qat_acc = None, [], None
    t_qat = 0.0
    if recipe.qat_epochs > 0:
        float_final = "float-final"
        if not (state and state["phase"] == "qat"):
            ckpts.write_extra(tf.train.Checkpoint(model=float_model), float_final)
        with strategy.scope():
            qat_model, qat_notes = quantize(float_model)
            qat_lr = recipe.qat_lr if recipe.qat_lr is not None else recipe.lr / 10
            qat_opt = make_optimizer(qat_lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                                     qat_steps * recipe.qat_epochs)
            qat_opt.build(qat_model.trainable_variables)
            compile_model(qat_model, qat_opt, recipe.label_smoothing)
            qat_ckpt = tf.train.Checkpoint(model=qat_model, optimizer=qat_opt)
        for note in qat_notes:
            log(f"[qat] {note}")
        qat_start = 0
        if state and state["phase"] == "qat":
            ckpts.restore(qat_ckpt, state["checkpoint"], "QAT")
            qat_start = state["epoch"]
            history["qat"] = history["qat"][:qat_start]
            log(f"[train] resumed after QAT epoch {qat_start} from {os.path.join(ckpt_dir, state['checkpoint'])}")
        t_qat = time.time()
        run_phase("qat", qat_model, qat_opt, qat_ckpt, recipe.qat_epochs, qat_start, 1000, float_final)
        t_qat = time.time() - t_qat
        log(f"[eval] QAT model on {len(test_part)} test samples")
        qat_acc = float(qat_model.evaluate(test_ds, verbose=0, return_dict=True)["accuracy"])
        log(f"[eval] QAT test accuracy {qat_acc:.4f}")

    if not chief:
        log("[train] not the chief worker: the chief exports and evaluates")
        return {"chief": False, "accuracy": {"float": float_acc, "qat": qat_acc}}

    # ---------------------------------------------------------------- export
    t_export = time.time()
    calib = data_mod.subset(train_split, cfg.calibration_samples, cfg.seed + 17)
    x_cal, _ = data_mod.as_arrays(calib, res, ch)

    def representative():
        for i in range(len(x_cal)):
            yield [x_cal[i:i + 1]]

    from tfmcu.convert import to_int8_tflite
    from tfmcu.metadata import add_metadata

    log(f"[export] full-int8 .tflite ({'QAT' if qat_model is not None else 'post-training quantization'}, "
        f"{len(x_cal)} calibration samples from the training split)")
    plain = _quiet_convert(to_int8_tflite, qat_model if qat_model is not None else float_model, representative)
    export_notes = []
    if cfg.classifier_as_conv:
        plain, n_fc = classifier_as_conv(plain)
        if n_fc:
            export_notes.append(f"{n_fc} FULLY_CONNECTED exported as RESHAPE + 1x1 CONV_2D + RESHAPE (same "
                                f"arithmetic in TFLM; makes TF Lite's reference kernels agree with TFLM)")
    mean, std = [data_mod.NORM_MEAN] * ch, [data_mod.NORM_STD] * ch
    desc = (f"{spec.name} trained on {ds.name} at {res}x{res} by tfmcu; int8 input = quantize((pixel - "
            f"{data_mod.NORM_MEAN}) / {data_mod.NORM_STD})")
    model_bytes = add_metadata(plain, ds.class_names, mean, std, name=spec.name, description=desc,
                               version=cfg.fingerprint(spec), grayscale=(ch == 1))
    t_export = time.time() - t_export

    # ---------------------------------------------------------------- int8 accuracy in TF Lite and TFLM
    t_int8 = time.time()
    int8_part = data_mod.subset(ds.test, cfg.int8_eval_samples, cfg.seed)
    n8 = len(int8_part)
    log(f"[eval] int8 model on {n8} test samples in tf.lite.Interpreter (reference kernels) and TFLM")
    bar = tf_keras.utils.Progbar(n8, verbose=1 if sys.stderr.isatty() else 0, unit_name="sample")
    # Streamed in batches (a 10,000-image test set at 96x96x3 would be 1.1 GB of float32 at once).
    parts: dict[str, list[np.ndarray]] = {"tfl": [], "tflm": [], "y": [], "float": [], "qat": []}
    for xb, yb in data_mod.eval_dataset(int8_part, res, ch, 250):
        xb = xb.numpy()
        a, b = run_int8(model_bytes, quantize_inputs(model_bytes, xb))
        parts["tfl"].append(a)
        parts["tflm"].append(b)
        parts["y"].append(yb.numpy())
        parts["float"].append(np.asarray(float_model.predict_on_batch(xb)).argmax(1))
        if qat_model is not None:
            parts["qat"].append(np.asarray(qat_model.predict_on_batch(xb)).argmax(1))
        bar.update(sum(len(y) for y in parts["y"]))
    out_tfl, out_tflm, y_test = (np.concatenate(parts[k]) for k in ("tfl", "tflm", "y"))
    agree_rows = np.all(out_tfl == out_tflm, axis=1)
    pred_tfl, pred_tflm = out_tfl.argmax(1), out_tflm.argmax(1)
    acc_tfl = float(np.mean(pred_tfl == y_test))
    acc_tflm = float(np.mean(pred_tflm == y_test))
    cm = confusion(y_test, pred_tflm, ds.num_classes)
    float_same = float(np.mean(np.concatenate(parts["float"]) == y_test))
    qat_same = float(np.mean(np.concatenate(parts["qat"]) == y_test)) if qat_model is not None else None
    t_int8 = time.time() - t_int8
    log(f"[eval] int8 accuracy: TF Lite {acc_tfl:.4f}, TFLM {acc_tflm:.4f}; outputs agree on "
        f"{int(agree_rows.sum())}/{n8} samples")

    # ---------------------------------------------------------------- memory
    from tfmcu import profiler, tflm, tflm_memory
    from tfmcu.lower_tflite import from_tflite

    graph = from_tflite(model_bytes, name=spec.name)
    prof = profiler.profile(graph)
    arena = tflm.measure_arena(model_bytes)
    predicted = tflm_memory.predict_arena(graph, model=model_bytes)
    info = tflm.model_info(model_bytes)

    report: dict[str, Any] = {
        "model": spec.name,
        "spec": spec.to_dict(),
        "dataset": {"name": ds.name, "source": ds.source, "classes": ds.class_names, "train": len(train_split),
                    "validation": len(val_split), "test": len(ds.test), "channels_stored": ds.channels,
                    "resolution": res, "channels": ch, "augment": recipe.augment, "flip": flip, **ds.info},
        "recipe": dataclasses.asdict(recipe) | {"qat_lr": recipe.qat_lr if recipe.qat_lr is not None
                                                else recipe.lr / 10},
        "steps_per_epoch": steps,
        "qat_steps_per_epoch": qat_steps,
        "seed": cfg.seed,
        "deterministic": cfg.deterministic,
        "strategy": {"name": cfg.strategy, "replicas": replicas},
        "qat_notes": qat_notes,
        "export_notes": export_notes,
        "history": history,
        "accuracy": {"float": float_acc, "qat": qat_acc, "int8_tflite": acc_tfl, "int8_tflm": acc_tflm,
                     "keras_test_samples": len(test_part), "int8_test_samples": n8,
                     "float_on_int8_samples": float_same, "qat_on_int8_samples": qat_same},
        "tflite_vs_tflm": {"agree": bool(agree_rows.all()), "mismatching_samples": int((~agree_rows).sum()),
                           "samples": n8, "tflite_kernels": "reference"},
        "confusion_matrix": cm.tolist(),
        "memory": {
            "analytic_peak_bytes": prof.peak_sram_per_layer_bytes,
            "analytic_peak_bytes_excluding_input": prof.peak_sram_per_layer_bytes_excluding_input,
            "analytic_peak_layer": prof.peak_layer,
            "tflm_arena_bytes": arena.total, "tflm_arena_head_bytes": arena.head,
            "tflm_arena_tail_bytes": arena.tail,
            "predicted_arena_bytes": predicted.total,
        },
        "flash_bytes": len(model_bytes),
        "flash_bytes_without_metadata": len(plain),
        "macs": prof.macs,
        "params": prof.params,
        "input_quantization": {"scale": info.inputs[0].scale, "zero_point": info.inputs[0].zero_point},
        "normalization": {"mean": mean, "std": std},
        "timing_s": {"float_training": round(t_float, 1), "qat_training": round(t_qat, 1),
                     "export": round(t_export, 1), "int8_eval": round(t_int8, 1),
                     "total": round(time.time() - t_start, 1)},
    }
    files = {
        "tflite": os.path.join(out_dir, "model_int8.tflite"),
        "spec": os.path.join(out_dir, "spec.json"),
        "labels": os.path.join(out_dir, "labels.txt"),
        "report": os.path.join(out_dir, "train_report.json"),
        "curves": os.path.join(out_dir, "training_curves.png"),
        "confusion": os.path.join(out_dir, "confusion_matrix.png"),
    }
    report["files"] = files
    title = (f"{spec.name} on {ds.name} @ {res}: float {float_acc:.2%}"
             + (f", QAT {qat_acc:.2%}" if qat_acc is not None else "") + f", int8 {acc_tflm:.2%}")
    from tfmcu.report import write_outputs

    write_outputs({
        files["tflite"]: model_bytes,
        files["spec"]: spec.to_json() + "\n",
        files["labels"]: "\n".join(ds.class_names) + "\n",
        files["report"]: report,
        files["curves"]: plot_curves(history, title),
        files["confusion"]: plot_confusion(cm, ds.class_names, f"int8 (TFLM) on {n8} test samples: "
                                                               f"{acc_tflm:.2%}"),
    })
    return report


def _quiet_convert(convert, *args):
    """The TFLite converter without its stderr chatter (a UserWarning and C++ prints on every conversion); the
    captured text is shown if the conversion fails."""
    import warnings

    from tfmcu.tflm import capture_fds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with capture_fds((2,)) as text:
                return convert(*args)
        except Exception:
            sys.stderr.write("".join(text)[-4000:] if text else "")
            raise


def _build(spec: NetSpec, seed: int, bn_momentum: float | None = None):
    """``build_keras(spec, seed)``, with the batch-norm momentum set by configuration (not in the builder)."""
    import tf_keras

    from tfmcu.keras_builder import build_keras

    model = build_keras(spec, seed)
    if bn_momentum is not None:
        for layer in model.layers:
            if isinstance(layer, tf_keras.layers.BatchNormalization):
                layer.momentum = bn_momentum
    return model


def format_summary(r: dict[str, Any]) -> str:
    a, m = r["accuracy"], r["memory"]
    agree = r["tflite_vs_tflm"]
    lines = [f"model {r['model']} on {r['dataset']['name']} @ {r['dataset']['resolution']}x"
             f"{r['dataset']['resolution']}x{r['dataset']['channels']}",
             f"accuracy on {a['keras_test_samples']} test images: float {a['float']:.4f}"
             + (f", QAT {a['qat']:.4f}" if a["qat"] is not None else ""),
             f"accuracy on {a['int8_test_samples']} test images: int8 TF Lite {a['int8_tflite']:.4f}, int8 TFLM "
             f"{a['int8_tflm']:.4f}, float {a['float_on_int8_samples']:.4f} (int8 - float "
             f"{(a['int8_tflm'] - a['float_on_int8_samples']) * 100:+.2f} points)",
             "TF Lite vs TFLM: " + ("identical outputs on every sample" if agree["agree"] else
                                    f"DISAGREE on {agree['mismatching_samples']} samples"),
             f"memory: analytic peak {m['analytic_peak_bytes'] / KB:.1f} kB "
             f"({m['analytic_peak_bytes_excluding_input'] / KB:.1f} kB without the input), TFLM arena "
             f"{m['tflm_arena_bytes'] / KB:.1f} kB measured / {m['predicted_arena_bytes'] / KB:.1f} kB predicted",
             f"Flash {r['flash_bytes'] / KB:.1f} kB, {r['macs'] / 1e6:.2f}M MACs, {r['params'] / 1e3:.1f}k params",
             "wrote " + ", ".join(r["files"][k] for k in ("tflite", "report", "curves", "confusion"))]
    return "\n".join(lines) + "\n"


__all__ = ["Recipe", "TrainConfig", "TrainError", "train", "quantize", "make_optimizer", "classifier_as_conv",
           "recalibrate_bn", "format_summary"]
