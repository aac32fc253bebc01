"""Train -> QAT -> full-int8 .tflite on real data, with accuracy measured in TF Lite and TFLM and the model's memory.

``train(config, out_dir)`` is the library behind ``pipelines/train.py`` (and ``make demo``), in phases:

1. setup: ``tfmcu.data`` (Fashion-MNIST by default, MNIST, or a folder of class folders), resized to the
   spec's resolution, grey replicated to 3 channels; a validation split held out of the training set; the test set
   is used only for the final numbers; the checkpoint state (checked before TensorFlow loads);
2. float training: SGD with momentum, cosine decay (optional linear warm-up), weight decay 4e-5 on conv / dense
   kernels, optional label smoothing -- the MCUNetV2 recipe scaled down (``Recipe``); after every epoch the
   batch-norm statistics are re-calibrated on fixed training batches (as MCUNetV2 does for its sub-networks), then
   the validation split is evaluated and a checkpoint written;
3. quantization-aware training with tensorflow-model-optimization for ``qat_epochs`` at a tenth of the learning
   rate (``tfmcu.train.qat.quantize``);
4. export: full-int8 .tflite (int8 input and output, per-channel weights) calibrated on a representative set drawn
   from the training data; the classifier as a 1x1 CONV_2D (``tfmcu.train.export.classifier_as_conv``: TF Lite's
   reference FULLY_CONNECTED rounds differently from TFLM's); TFLite metadata (labels, normalisation;
   ``tfmcu.tflite.metadata``);
5. evaluation: float, QAT and int8 test accuracy; the int8 model runs in ``tf.lite.Interpreter`` (reference
   kernels) and in the TFLM interpreter, whose outputs must agree sample for sample; analytic peak SRAM, TFLM's
   measured and predicted arena, Flash and MACs;
6. outputs (all-or-nothing, ``tfmcu.files``): ``model_int8.tflite``, ``spec.json``, ``labels.txt``,
   ``train_report.json``, ``training_curves.png``, ``confusion_matrix.png``; ``checkpoints/`` holds one checkpoint
   per epoch (``resume=True`` continues from the last one, bit for bit like an uninterrupted run).

Determinism: the model's initial weights (``build_keras(spec, seed)``), the data order and augmentation
(``tfmcu.data``) and TF's op-level randomness are seeded, and ``tf.config.experimental.enable_op_determinism``
is on, so two runs with one seed give the same weights on the same machine.

Distribution (``strategy``): ``default`` (one device), ``mirrored`` (all local GPUs, synchronous) or
``multi_worker`` (``MultiWorkerMirroredStrategy``, cluster from ``TF_CONFIG``); ``batch_size`` is the global batch.
Only the chief writes the outputs; the other workers checkpoint into a temporary folder (Keras' rule) and every
worker resumes from the chief's ``out_dir/checkpoints`` (put ``out_dir`` on a shared filesystem).

Errors the user can fix are ``TfmcuError``s (``TrainError``, ``DataError``, ``ModelError``, ``MetadataError``;
one line).

Detectors (``TrainConfig.task == "detection"``) train with ``tfmcu.train.detection_loop.train_detector``, whose run
is a ``TrainingRun`` with the task-specific methods replaced (data, targets, loss, mAP).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from tfmcu.files import write_outputs
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets.convert import to_int8_tflite
from tfmcu.plan.arena import predict_arena
from tfmcu.plan.profiler import profile
from tfmcu.runtime.model_io import model_info
from tfmcu.runtime.tflm import measure_arena
from tfmcu import data as data_mod
from tfmcu.train.checkpoints import Checkpoints
from tfmcu.train.config import STRATEGIES, TrainConfig, TrainError, check_task, resolve_spec
from tfmcu.train.export import (classifier_as_conv, confusion, quantize_inputs, quiet_convert, run_int8,
                                with_metadata)
from tfmcu.train.plots import plot_confusion, plot_curves
from tfmcu.train import qat
from tfmcu.train.qat import (build_model, compile_model, configure_determinism, current_lr, is_chief, make_optimizer,
                             quantize, recalibrate_bn)

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

KB = 1024


def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _verbose(cfg: TrainConfig) -> int:
    if cfg.verbose is not None:
        return cfg.verbose
    return 1 if sys.stdout.isatty() else 2


def _epoch_record(h: dict[str, list[float]], epoch: int, lr: float, seconds: float, samples: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"epoch": epoch, "lr": round(lr, 8), "seconds": round(seconds, 2), "samples": samples}
    for k, v in h.items():
        rec[k] = float(v[-1])
    return rec


def validate(cfg: TrainConfig) -> None:
    """The settings that can be checked without data or TensorFlow."""
    cfg.recipe.validate()
    check_task(cfg)
    if cfg.strategy not in STRATEGIES:
        raise TrainError(f"unknown strategy '{cfg.strategy}'; known: {', '.join(STRATEGIES)}")
    if cfg.calibration_samples < 1:
        raise TrainError("calibration_samples must be >= 1")


class TrainingRun:
    """One training run, phase by phase (see the module docstring); the attributes are what the phases share.

    The task-specific parts are methods a detector's run (``tfmcu.train.detection_loop``) overrides: ``load_data``,
    ``describe``, ``prepare_batches``, ``epoch_dataset``, ``validate_epoch``, ``epoch_summary``, ``build_float``,
    ``compile``, ``evaluate_float``; the rest (checkpoints, resume, the epoch loop, batch-norm re-calibration, QAT)
    is shared."""

    def __init__(self, cfg: TrainConfig, out_dir: str, log: Callable[[str], None]):
        self.cfg, self.out_dir, self.log = cfg, out_dir, log
        self.t_start = time.time()
        self.timing: dict[str, float] = {}

    # ------------------------------------------------------------------ 1. setup
    def load_data(self) -> None:
        """The data set, the spec, the train / validation splits and the flip setting."""
        cfg, recipe = self.cfg, self.cfg.recipe
        ds = self.ds = data_mod.load(cfg.dataset, cfg.data_dir, cfg.test_fraction, cfg.seed)
        spec = self.spec = resolve_spec(cfg, ds)
        self.res, self.ch = spec.resolution, spec.in_channels
        if ds.val is not None:  # the data set's own validation split (scenes)
            self.train_split, self.val_split = ds.train, ds.val
        else:
            self.train_split, self.val_split = data_mod.split_validation(ds.train, cfg.val_split, cfg.seed)
        self.train_split = data_mod.subset(self.train_split, cfg.train_subset, cfg.seed)
        if len(self.train_split) < recipe.batch_size:
            raise TrainError(f"the training split has {len(self.train_split)} samples, fewer than one batch "
                             f"({recipe.batch_size})")
        data_mod.check_decodable(self.train_split)
        self.flip = ds.flip if recipe.flip == "auto" else recipe.flip == "yes"

    def describe(self) -> str:
        ds = self.ds
        return (f"{len(self.train_split)} train / {len(self.val_split)} validation / {len(ds.test)} test samples, "
                f"{ds.num_classes} classes")

    def setup(self) -> None:
        cfg, recipe = self.cfg, self.cfg.recipe
        validate(cfg)
        self.load_data()
        ds, spec = self.ds, self.spec
        # The checkpoint state is checked before TensorFlow loads, so a bad one fails fast.
        self.ckpt_dir = os.path.join(self.out_dir, "checkpoints")
        self.ckpts = Checkpoints(self.ckpt_dir, cfg.fingerprint(spec), self.log)
        self.state = self.ckpts.load_state() if cfg.resume else None

        import tensorflow as tf

        self.tf = tf
        # Before any other TF work (multi-worker needs it first); through the module, so it can be substituted.
        self.strategy = qat.make_strategy(cfg.strategy)
        configure_determinism(cfg.seed, cfg.deterministic)
        self.chief = is_chief(self.strategy)
        self.replicas = self.strategy.num_replicas_in_sync
        if recipe.batch_size % self.replicas:
            raise TrainError(f"batch_size {recipe.batch_size} is not a multiple of the {self.replicas} replicas")
        steps = len(self.train_split) // recipe.batch_size
        self.steps = min(steps, cfg.steps_per_epoch) if cfg.steps_per_epoch else steps
        self.log(f"[train] {spec.name} @ {self.res}x{self.res}x{self.ch} on {ds.name}: {self.describe()}; "
                 f"{self.steps} steps of {recipe.batch_size} per epoch; strategy {cfg.strategy} ({self.replicas} "
                 f"replica{'s' if self.replicas > 1 else ''})")
        if not self.chief:
            self.ckpts.write_folder = tempfile.mkdtemp(prefix="tfmcu-worker-ckpt-")
        if cfg.resume and self.state is None:
            self.log(f"[train] --resume: no checkpoint in {self.ckpt_dir}, starting from scratch")
        self.history: dict[str, list[dict[str, Any]]] = (self.state["history"] if self.state
                                                          else {"float": [], "qat": []})
        self.history.setdefault("float", [])
        self.history.setdefault("qat", [])
        self.verbose = _verbose(cfg)
        self.qat_steps = min(self.steps, cfg.qat_steps_per_epoch) if cfg.qat_steps_per_epoch else self.steps
        self.prepare_batches()

    def prepare_batches(self) -> None:
        """The validation batches and the batch-norm re-calibration batches (fixed training images, no
        augmentation)."""
        cfg, recipe = self.cfg, self.cfg.recipe
        self.val_ds = (data_mod.eval_dataset(self.val_split, self.res, self.ch, 256).map(self.onehot)
                       if len(self.val_split) else None)
        self.calib_ds = data_mod.train_dataset(self.train_split, self.res, self.ch, recipe.batch_size, cfg.seed + 2000,
                                               0, augment=False,
                                               steps=max(1, recipe.bn_recalibration_batches)).map(self.onehot)

    def onehot(self, x, y):
        return x, self.tf.one_hot(y, self.ds.num_classes)

    def run_phase(self, phase: str, model, opt, ckpt, epochs: int, start: int, seed_offset: int,
                  float_final: str | None) -> None:
        cfg, recipe, log = self.cfg, self.cfg.recipe, self.log
        n_steps = self.steps if phase == "float" else self.qat_steps
        for epoch in range(start, epochs):
            t0 = time.time()
            log(f"[train] {phase} epoch {epoch + 1}/{epochs} (lr {current_lr(opt):.4g})")
            train_ds = self.epoch_dataset(epoch, n_steps, cfg.seed + seed_offset)
            t_fit = time.time()
            h = model.fit(train_ds, epochs=1, verbose=self.verbose)
            rec = _epoch_record(h.history, epoch + 1, current_lr(opt), time.time() - t0, n_steps * recipe.batch_size)
            rec["fit_seconds"] = round(time.time() - t_fit, 2)
            if recipe.bn_recalibration_batches:
                # Only the moving statistics change (training-mode passes use batch statistics), so the training
                # trajectory is the same; validation and the checkpoint then see BN statistics of these weights.
                recalibrate_bn(model, self.calib_ds, recipe.bn_recalibration_batches, self.strategy)
            self.validate_epoch(model, rec)
            rec["seconds"] = round(time.time() - t0, 2)
            t_save = time.time()
            self.history[phase].append(rec)
            self.ckpts.save(ckpt, phase, epoch + 1, self.history, float_final)
            log(f"[train] {phase} epoch {epoch + 1}: {self.epoch_summary(rec)} "
                f"({rec['seconds']:.0f} s, training {rec['fit_seconds']:.0f} s; checkpoint "
                f"{time.time() - t_save:.1f} s)")

    def epoch_dataset(self, epoch: int, steps: int, seed: int):
        """One epoch of shuffled, augmented training batches (deterministic for (seed, epoch))."""
        recipe = self.cfg.recipe
        return data_mod.train_dataset(self.train_split, self.res, self.ch, recipe.batch_size, seed, epoch,
                                      augment=recipe.augment, flip=self.flip, steps=steps).map(self.onehot)

    def validate_epoch(self, model, rec: dict[str, Any]) -> None:
        """The validation figures of the epoch, into ``rec``."""
        if self.val_ds is not None:
            v = model.evaluate(self.val_ds, verbose=0, return_dict=True)
            rec["val_loss"], rec["val_accuracy"] = float(v["loss"]), float(v["accuracy"])

    def epoch_summary(self, rec: dict[str, Any]) -> str:
        val = f", val acc {rec['val_accuracy']:.4f}" if "val_accuracy" in rec else ""
        return f"loss {rec['loss']:.4f}, acc {rec['accuracy']:.4f}{val}"

    # ------------------------------------------------------------------ 2. float
    def train_float(self) -> None:
        cfg, recipe, tf, state = self.cfg, self.cfg.recipe, self.tf, self.state
        with self.strategy.scope():
            model = self.float_model = self.build_float()
            if cfg.init_weights and not state:
                self.load_init_weights(self.spec_model)
            opt = make_optimizer(recipe.lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                                 self.steps * max(recipe.epochs, 1), int(round(recipe.warmup_epochs * self.steps)))
            opt.build(model.trainable_variables)
            self.compile(model, opt)
            ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
        start = 0
        if state and state["phase"] == "float":
            start = self.resume_phase(ckpt, "float")
        elif state and state["phase"] == "qat":
            if not state.get("float_final"):
                raise TrainError(f"{self.ckpts.state_path}: corrupted checkpoint state (QAT without the float "
                                 f"weights); delete {self.ckpt_dir} or run without --resume")
            self.ckpts.restore(tf.train.Checkpoint(model=model), state["float_final"], "float")
            start = recipe.epochs
        t = time.time()
        self.run_phase("float", model, opt, ckpt, recipe.epochs, start, 0, None)
        self.timing["float_training"] = time.time() - t
        self.evaluate_float(model)

    def build_float(self):
        """The float model to train (in the strategy's scope)."""
        return build_model(self.spec, self.cfg.seed, self.cfg.recipe.bn_momentum)

    @property
    def spec_model(self):
        """The Keras model of the spec (what ``--init_weights`` loads into)."""
        return self.float_model

    def compile(self, model, opt) -> None:
        compile_model(model, opt, self.cfg.recipe.label_smoothing)

    def evaluate_float(self, model) -> None:
        """The float model on the test split (``self.test_part``)."""
        cfg = self.cfg
        self.test_part = data_mod.subset(self.ds.test, cfg.test_subset, cfg.seed)
        self.test_ds = data_mod.eval_dataset(self.test_part, self.res, self.ch, 256).map(self.onehot)
        self.log(f"[eval] float model on {len(self.test_part)} test samples")
        self.float_acc = float(model.evaluate(self.test_ds, verbose=0, return_dict=True)["accuracy"])
        self.log(f"[eval] float test accuracy {self.float_acc:.4f}")

    def load_init_weights(self, model: Any) -> None:
        """``--init_weights``: Keras weights of this very spec (e.g. a sub-network ``pipelines/search.py`` took out
        of its supernet); anything else is a one-line error."""
        path = self.cfg.init_weights
        try:
            model.load_weights(path)
        except (OSError, ValueError, KeyError) as e:
            raise TrainError(f"--init_weights={path}: not weights of this model ({str(e).splitlines()[0][:120]})"
                             ) from None
        self.log(f"[train] initial weights from {path}")

    def resume_phase(self, ckpt: Any, phase: str) -> int:
        """Restore ``ckpt`` from the checkpoint the state names for ``phase`` ("float" or "qat"); drop the history
        of the epochs after it; return the epoch to start from."""
        label = "float" if phase == "float" else "QAT"
        self.ckpts.restore(ckpt, self.state["checkpoint"], label)
        start = self.state["epoch"]
        self.history[phase] = self.history[phase][:start]
        self.log(f"[train] resumed after {label} epoch {start} from "
                 f"{os.path.join(self.ckpt_dir, self.state['checkpoint'])}")
        return start

    # ------------------------------------------------------------------ 3. QAT
    def keep_float_weights(self) -> str:
        """The float model's final weights as an extra checkpoint before QAT changes them (not again when QAT
        resumes); returns its name."""
        name = "float-final"
        if not (self.state and self.state["phase"] == "qat"):
            self.ckpts.write_extra(self.tf.train.Checkpoint(model=self.float_model), name)
        return name

    def train_qat(self) -> None:
        recipe, tf, state = self.cfg.recipe, self.tf, self.state
        self.qat_model, self.qat_notes, self.qat_acc = None, [], None
        self.timing["qat_training"] = 0.0
        if recipe.qat_epochs <= 0:
            return
        float_final = self.keep_float_weights()
        with self.strategy.scope():
            model, self.qat_notes = quantize(self.float_model)
            qat_lr = recipe.qat_lr if recipe.qat_lr is not None else recipe.lr / 10
            opt = make_optimizer(qat_lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                                 self.qat_steps * recipe.qat_epochs)
            opt.build(model.trainable_variables)
            self.compile(model, opt)
            ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
        self.qat_model = model
        for note in self.qat_notes:
            self.log(f"[qat] {note}")
        start = 0
        if state and state["phase"] == "qat":
            start = self.resume_phase(ckpt, "qat")
        t = time.time()
        self.run_phase("qat", model, opt, ckpt, recipe.qat_epochs, start, 1000, float_final)
        self.timing["qat_training"] = time.time() - t
        self.log(f"[eval] QAT model on {len(self.test_part)} test samples")
        self.qat_acc = float(model.evaluate(self.test_ds, verbose=0, return_dict=True)["accuracy"])
        self.log(f"[eval] QAT test accuracy {self.qat_acc:.4f}")

    # ------------------------------------------------------------------ 4. export
    def export(self) -> None:
        cfg, ds, spec, ch = self.cfg, self.ds, self.spec, self.ch
        t = time.time()
        calib = data_mod.subset(self.train_split, cfg.calibration_samples, cfg.seed + 17)
        x_cal, _ = data_mod.as_arrays(calib, self.res, ch)

        def representative():
            for i in range(len(x_cal)):
                yield [x_cal[i:i + 1]]

        source = self.qat_model if self.qat_model is not None else self.float_model
        self.log(f"[export] full-int8 .tflite ({'QAT' if self.qat_model is not None else 'post-training quantization'}"
                 f", {len(x_cal)} calibration samples from the training split)")
        plain = quiet_convert(to_int8_tflite, source, representative)
        self.export_notes = []
        if cfg.classifier_as_conv:
            plain, n_fc = classifier_as_conv(plain)
            if n_fc:
                self.export_notes.append(f"{n_fc} FULLY_CONNECTED exported as RESHAPE + 1x1 CONV_2D + RESHAPE (same "
                                         f"arithmetic in TFLM; makes TF Lite's reference kernels agree with TFLM)")
        self.plain = plain
        self.mean, self.std = [data_mod.NORM_MEAN] * ch, [data_mod.NORM_STD] * ch
        self.model_bytes = with_metadata(plain, spec, ds.name, ds.class_names, self.res, ch, cfg.fingerprint(spec))
        self.timing["export"] = time.time() - t

    # ------------------------------------------------------------------ 5. int8 accuracy in TF Lite and TFLM
    def evaluate_int8(self) -> None:
        import tf_keras

        t = time.time()
        part = data_mod.subset(self.ds.test, self.cfg.int8_eval_samples, self.cfg.seed)
        n8 = self.n8 = len(part)
        self.log(f"[eval] int8 model on {n8} test samples in tf.lite.Interpreter (reference kernels) and TFLM")
        bar = tf_keras.utils.Progbar(n8, verbose=1 if sys.stderr.isatty() else 0, unit_name="sample")
        # Streamed in batches (a 10,000-image test set at 96x96x3 would be 1.1 GB of float32 at once).
        parts: dict[str, list[np.ndarray]] = {"tfl": [], "tflm": [], "y": [], "float": [], "qat": []}
        for xb, yb in data_mod.eval_dataset(part, self.res, self.ch, 250):
            xb = xb.numpy()
            a, b = run_int8(self.model_bytes, quantize_inputs(self.model_bytes, xb))
            parts["tfl"].append(a)
            parts["tflm"].append(b)
            parts["y"].append(yb.numpy())
            parts["float"].append(np.asarray(self.float_model.predict_on_batch(xb)).argmax(1))
            if self.qat_model is not None:
                parts["qat"].append(np.asarray(self.qat_model.predict_on_batch(xb)).argmax(1))
            bar.update(sum(len(y) for y in parts["y"]))
        out_tfl, out_tflm, y_test = (np.concatenate(parts[k]) for k in ("tfl", "tflm", "y"))
        self.agree_rows = np.all(out_tfl == out_tflm, axis=1)
        pred_tfl, pred_tflm = out_tfl.argmax(1), out_tflm.argmax(1)
        self.acc_tfl = float(np.mean(pred_tfl == y_test))
        self.acc_tflm = float(np.mean(pred_tflm == y_test))
        self.cm = confusion(y_test, pred_tflm, self.ds.num_classes)
        self.float_same = float(np.mean(np.concatenate(parts["float"]) == y_test))
        self.qat_same = (float(np.mean(np.concatenate(parts["qat"]) == y_test)) if self.qat_model is not None
                         else None)
        self.timing["int8_eval"] = time.time() - t
        self.log(f"[eval] int8 accuracy: TF Lite {self.acc_tfl:.4f}, TFLM {self.acc_tflm:.4f}; outputs agree on "
                 f"{int(self.agree_rows.sum())}/{n8} samples")

    # ------------------------------------------------------------------ 6. report and outputs
    def report(self) -> dict[str, Any]:
        cfg, recipe, ds, spec, model_bytes = self.cfg, self.cfg.recipe, self.ds, self.spec, self.model_bytes
        graph = from_tflite(model_bytes, name=spec.name)
        prof = profile(graph)
        arena = measure_arena(model_bytes)
        predicted = predict_arena(graph, model=model_bytes)
        info = model_info(model_bytes)
        agree = self.agree_rows
        timing = {k: round(v, 1) for k, v in self.timing.items()}
        timing["total"] = round(time.time() - self.t_start, 1)
        report: dict[str, Any] = {
            "model": spec.name,
            "spec": spec.to_dict(),
            "dataset": {"name": ds.name, "source": ds.source, "classes": ds.class_names,
                        "train": len(self.train_split), "validation": len(self.val_split), "test": len(ds.test),
                        "channels_stored": ds.channels, "resolution": self.res, "channels": self.ch,
                        "augment": recipe.augment, "flip": self.flip, **ds.info},
            "recipe": dataclasses.asdict(recipe) | {"qat_lr": recipe.qat_lr if recipe.qat_lr is not None
                                                    else recipe.lr / 10},
            "steps_per_epoch": self.steps,
            "qat_steps_per_epoch": self.qat_steps,
            "seed": cfg.seed,
            "deterministic": cfg.deterministic,
            "strategy": {"name": cfg.strategy, "replicas": self.replicas},
            "qat_notes": self.qat_notes,
            "export_notes": self.export_notes,
            "history": self.history,
            "accuracy": {"float": self.float_acc, "qat": self.qat_acc, "int8_tflite": self.acc_tfl,
                         "int8_tflm": self.acc_tflm, "keras_test_samples": len(self.test_part),
                         "int8_test_samples": self.n8, "float_on_int8_samples": self.float_same,
                         "qat_on_int8_samples": self.qat_same},
            "tflite_vs_tflm": {"agree": bool(agree.all()), "mismatching_samples": int((~agree).sum()),
                               "samples": self.n8, "tflite_kernels": "reference"},
            "confusion_matrix": self.cm.tolist(),
            "memory": {
                "analytic_peak_bytes": prof.peak_sram_per_layer_bytes,
                "analytic_peak_bytes_excluding_input": prof.peak_sram_per_layer_bytes_excluding_input,
                "analytic_peak_layer": prof.peak_layer,
                "tflm_arena_bytes": arena.total, "tflm_arena_head_bytes": arena.head,
                "tflm_arena_tail_bytes": arena.tail,
                "predicted_arena_bytes": predicted.total,
            },
            "flash_bytes": len(model_bytes),
            "flash_bytes_without_metadata": len(self.plain),
            "macs": prof.macs,
            "params": prof.params,
            "input_quantization": {"scale": info.inputs[0].scale, "zero_point": info.inputs[0].zero_point},
            "normalization": {"mean": self.mean, "std": self.std},
            "timing_s": {k: timing.get(k, 0.0) for k in ("float_training", "qat_training", "export", "int8_eval",
                                                         "total")},
        }
        out = self.out_dir
        files = {
            "tflite": os.path.join(out, "model_int8.tflite"),
            "spec": os.path.join(out, "spec.json"),
            "labels": os.path.join(out, "labels.txt"),
            "report": os.path.join(out, "train_report.json"),
            "curves": os.path.join(out, "training_curves.png"),
            "confusion": os.path.join(out, "confusion_matrix.png"),
        }
        report["files"] = files
        title = (f"{spec.name} on {ds.name} @ {self.res}: float {self.float_acc:.2%}"
                 + (f", QAT {self.qat_acc:.2%}" if self.qat_acc is not None else "") + f", int8 {self.acc_tflm:.2%}")
        write_outputs({
            files["tflite"]: model_bytes,
            files["spec"]: spec.to_json() + "\n",
            files["labels"]: "\n".join(ds.class_names) + "\n",
            files["report"]: report,
            files["curves"]: plot_curves(self.history, title),
            files["confusion"]: plot_confusion(self.cm, ds.class_names, f"int8 (TFLM) on {self.n8} test samples: "
                                                                        f"{self.acc_tflm:.2%}"),
        })
        return report


def train(cfg: TrainConfig, out_dir: str, log: Callable[[str], None] = _log_default) -> dict[str, Any]:
    """Run the whole pipeline; returns the report (also written to ``out_dir/train_report.json``). Classifiers only:
    ``tfmcu.train.detection_loop.train_detector`` trains detectors."""
    if cfg.task != "classify":
        raise TrainError(f"task '{cfg.task}': tfmcu.train.train trains classifiers; detectors train with "
                         f"tfmcu.train.detection_loop.train_detector")
    run = TrainingRun(cfg, out_dir, log)
    run.setup()
    run.train_float()
    run.train_qat()
    if not run.chief:
        log("[train] not the chief worker: the chief exports and evaluates")
        return {"chief": False, "accuracy": {"float": run.float_acc, "qat": run.qat_acc}}
    run.export()
    run.evaluate_int8()
    return run.report()


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
