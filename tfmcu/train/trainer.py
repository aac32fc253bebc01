"""One trainer for every task (TF Model Garden's ``base_trainer``): ``train(config, out_dir)`` -> ``TrainReport``, the
library behind ``pipelines/train.py`` (and ``make demo``), in steps:

1. the task's inputs (``Task.build_inputs``: the data set, the spec checked against it, the splits) and the checkpoint
   state, both before TensorFlow loads, so a bad setting or checkpoint fails fast; the distribution strategy;
2. the float phase: SGD with momentum, cosine decay (optional linear warm-up), weight decay 4e-5 on conv / dense
   kernels, optional label smoothing -- the MCUNetV2 recipe scaled down (``Recipe``); after every epoch the batch-norm
   statistics are re-calibrated on fixed training batches (as MCUNetV2 does for its sub-networks), then the task's
   validation figures are measured and a checkpoint written; then the float model's test figures;
3. the QAT phase (``qat_epochs`` > 0): the spec's model quantized with tensorflow-model-optimization
   (``tfmcu.train.qat.quantize``), wrapped as the task trains it, trained with the same loss, data and epoch loop at
   ``qat_lr`` (default lr / 10); checkpointed and resumable like the float phase; its test figures;
4. the task's full-int8 export of the last phase's spec model, and its evaluation in TF Lite and TFLM;
5. the report (``TrainReport``: the run's fields and the task's section) and the outputs, all-or-nothing
   (``tfmcu.files``): ``model_int8.tflite``, ``spec.json``, ``labels.txt``, ``model_float_weights.h5`` (the float
   model's Keras weights: ``init_weights`` / ``init_backbone`` of another run), ``train_report.json``,
   ``training_curves.png`` and the task's own; ``checkpoints/`` holds one checkpoint per epoch (``resume=True``
   continues from the last one, bit for bit like an uninterrupted run).

Each step hands its values to the next (``Run``: what the run fixed when it started; ``Trained``: a phase's models);
the only state that grows is the run's ``History``, checkpointed with every epoch.

Determinism: the model's initial weights (``build_keras(spec, seed)``), the data order and augmentation (each phase
its own named stream of the seed: ``tfmcu.data.split.STREAMS``) and TF's op-level randomness are seeded, and
``tf.config.experimental.enable_op_determinism`` is on, so two runs with one seed give the same weights on the same
machine.

Distribution (``strategy``): ``default`` (one device), ``mirrored`` (all local GPUs, synchronous) or
``multi_worker`` (``MultiWorkerMirroredStrategy``, cluster from ``TF_CONFIG``); ``batch_size`` is the global batch.
Only the chief exports, evaluates the int8 model and writes the outputs (``train`` returns None on the others), from
copies of the trained models outside the strategy (``local_copy``, made by every worker);
the other workers checkpoint into a temporary folder (Keras' rule) and every worker resumes from the chief's
``out_dir/checkpoints`` (put ``out_dir`` on a shared filesystem).

Errors the user can fix are ``TfmcuError``s (``TrainError``, ``DataError``, ``ModelError``, ``MetadataError``;
one line).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from tfmcu.data.split import stream_seed
from tfmcu.files import write_outputs
from tfmcu.train import qat
from tfmcu.train.checkpoints import Checkpoints
from tfmcu.train.classify import ClassifyTask
from tfmcu.train.backbone import load_backbone
from tfmcu.train.config import BACKBONE_WEIGHTS, Recipe, TrainConfig, TrainError, backbone_weights
from tfmcu.train.detect import DetectTask
from tfmcu.train.plots import plot_curves
from tfmcu.train.qat import build_model, configure_determinism, current_lr, is_chief, make_optimizer, quantize, \
    recalibrate_bn
from tfmcu.train.report import BackboneLoad, ClassifyResult, DataSummary, History, Strategy, TrainReport
from tfmcu.train.task import Inputs, Task, Trained, check_names

TASKS: dict[str, Task] = {t.name: t for t in (ClassifyTask(), DetectTask())}
TIMING = ("data", "float_training", "evaluation", "qat_training", "export", "int8_eval", "total")


def log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def task_for(cfg: TrainConfig) -> Task:
    if cfg.task not in TASKS:
        raise TrainError(f"unknown task '{cfg.task}'; known: {', '.join(TASKS)}")
    return TASKS[cfg.task]


def validate(cfg: TrainConfig) -> None:
    """The settings that can be checked without data or TensorFlow, and a data set or model named for another
    task."""
    check_names(task_for(cfg.validate()), cfg)


@dataclass
class Run:
    """What the steps of one run share, fixed when it starts (``start``); ``history`` grows with every epoch."""

    cfg: TrainConfig
    task: Task
    inputs: Inputs
    out_dir: str
    log: Callable[[str], None]
    checkpoints: Checkpoints
    state: dict[str, Any] | None  # where a resumed run stopped (None: from scratch)
    strategy: Any
    chief: bool
    replicas: int
    steps: int  # per float epoch
    qat_steps: int  # per QAT epoch
    verbose: int  # Keras fit's
    calibration: Any  # the fixed batches of batch-norm re-calibration
    history: History
    backbone: BackboneLoad | None = None  # with ``init_backbone``: what the float phase loaded


def train(cfg: TrainConfig, out_dir: str, log: Callable[[str], None] = log_stderr) -> TrainReport | None:
    """Train ``cfg``'s task (see the module docstring); returns the report, also written to
    ``out_dir/train_report.json`` (None on a worker that is not the chief: it writes nothing)."""
    t_start = time.time()
    validate(cfg)
    task = task_for(cfg)
    timing: dict[str, float] = {}
    t = time.time()
    inputs = task.build_inputs(cfg, log)
    timing["data"] = time.time() - t
    run = start(cfg, task, inputs, out_dir, log)
    t = time.time()
    phases = {"float": float_phase(run)}
    timing["float_training"] = time.time() - t
    t = time.time()
    evals = {"float": task.evaluate(phases["float"], inputs, cfg, "float", log)}
    timing["evaluation"] = time.time() - t
    qat_notes: list[str] = []
    if cfg.recipe.qat_epochs > 0:
        t = time.time()
        phases["qat"], qat_notes = qat_phase(run, phases["float"])
        timing["qat_training"] = time.time() - t
        evals["qat"] = task.evaluate(phases["qat"], inputs, cfg, "QAT", log)
    if cfg.strategy == "multi_worker":
        phases = {phase: local_copy(run, trained, phase) for phase, trained in phases.items()}  # (every worker)
    if not run.chief:
        log("[train] not the chief worker: the chief exports, evaluates and writes the outputs")
        return None
    t = time.time()
    exported = task.export(cfg, inputs, phases.get("qat", phases["float"]), "qat" in phases, log)
    timing["export"] = time.time() - t
    t = time.time()
    int8 = task.evaluate_int8(cfg, inputs, exported, phases, log) if exported is not None else None
    timing["int8_eval"] = time.time() - t
    section = task.section(cfg, inputs, evals, exported, int8)
    timing["total"] = time.time() - t_start

    files = {"spec": "spec.json", "labels": "labels.txt", "weights": BACKBONE_WEIGHTS, "report": "train_report.json",
             "curves": "training_curves.png"}
    if exported is not None:
        files = {"tflite": "model_int8.tflite", **files}
    own = task.outputs(cfg, inputs, phases, evals, section)
    paths = {key: os.path.join(out_dir, name) for key, name in {**files, **{k: f for k, (f, _) in own.items()}}.items()}
    report = TrainReport(
        task=cfg.task, model=inputs.spec.name, spec=inputs.spec, dataset=data_summary(inputs, cfg.recipe),
        recipe=dataclasses.replace(cfg.recipe, qat_lr=qat_lr(cfg.recipe)), steps_per_epoch=run.steps,
        qat_steps_per_epoch=run.qat_steps, seed=cfg.seed, deterministic=cfg.deterministic,
        strategy=Strategy(name=cfg.strategy, replicas=run.replicas), qat_notes=qat_notes, history=run.history,
        timing_s={k: round(timing.get(k, 0.0), 1) for k in TIMING}, files=paths, backbone=run.backbone,
        **{"classification" if isinstance(section, ClassifyResult) else "detection": section})
    outputs: dict[str, Any] = {
        paths["spec"]: inputs.spec.to_json() + "\n",
        paths["labels"]: "\n".join(inputs.dataset.class_names) + "\n",
        paths["curves"]: plot_curves(run.history, task.title(inputs, section), task.curves),
        paths["weights"]: _keras_weights(phases["float"].spec_model),
        **{paths[k]: content for k, (_, content) in own.items()},
        paths["report"]: report.to_json(),
    }
    if exported is not None:
        outputs[paths["tflite"]] = exported.model
    write_outputs(outputs)
    return report


def qat_lr(recipe: Recipe) -> float:
    return recipe.qat_lr if recipe.qat_lr is not None else recipe.lr / 10


def data_summary(inputs: Inputs, recipe: Recipe) -> DataSummary:
    ds = inputs.dataset
    boxes = ({"train": inputs.train.n_boxes(), "validation": inputs.val.n_boxes(), "test": ds.test.n_boxes()}
             if ds.boxes else None)
    return DataSummary(name=ds.name, source=ds.source, classes=ds.class_names, train=len(inputs.train),
                       validation=len(inputs.val), test=len(ds.test), channels_stored=ds.channels,
                       resolution=inputs.resolution, channels=inputs.channels, augment=recipe.augment,
                       flip=inputs.flip, boxes=boxes, info=ds.info)


# ============================================================================= the run
def start(cfg: TrainConfig, task: Task, inputs: Inputs, out_dir: str, log: Callable[[str], None]) -> Run:
    """The checkpoint state (checked before TensorFlow loads), the strategy, determinism, the steps per epoch."""
    recipe, spec = cfg.recipe, inputs.spec
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    checkpoints = Checkpoints(ckpt_dir, cfg.fingerprint(spec), log)
    state = checkpoints.load_state() if cfg.resume else None
    # Before any other TF work (multi-worker needs it first); through the module, so it can be substituted.
    strategy = qat.make_strategy(cfg.strategy)
    configure_determinism(cfg.seed, cfg.deterministic)
    chief, replicas = is_chief(strategy), strategy.num_replicas_in_sync
    if recipe.batch_size % replicas:
        raise TrainError(f"batch_size {recipe.batch_size} is not a multiple of the {replicas} replicas")
    steps = len(inputs.train) // recipe.batch_size
    steps = min(steps, cfg.steps_per_epoch) if cfg.steps_per_epoch else steps
    log(f"[train] {spec.name} @ {inputs.resolution}x{inputs.resolution}x{inputs.channels} on {inputs.dataset.name}: "
        f"{task.describe(inputs)}; {steps} steps of {recipe.batch_size} per epoch; strategy {cfg.strategy} "
        f"({replicas} replica{'s' if replicas > 1 else ''})")
    if not chief:
        checkpoints.write_folder = tempfile.mkdtemp(prefix="tfmcu-worker-ckpt-")
    if cfg.resume and state is None:
        log(f"[train] --resume: no checkpoint in {ckpt_dir}, starting from scratch")
    calibration = task.batches(inputs, cfg, stream_seed(cfg.seed, "bn_recalibration"), 0,
                               max(1, recipe.bn_recalibration_batches), augment=False)
    return Run(cfg=cfg, task=task, inputs=inputs, out_dir=out_dir, log=log, checkpoints=checkpoints, state=state,
               strategy=strategy, chief=chief, replicas=replicas, steps=steps,
               qat_steps=min(steps, cfg.qat_steps_per_epoch) if cfg.qat_steps_per_epoch else steps,
               verbose=cfg.verbose if cfg.verbose is not None else (1 if sys.stdout.isatty() else 2),
               calibration=calibration,
               history=History.from_json(state["history"]) if state else History())


def float_phase(run: Run) -> Trained:
    """The float model trained (or restored: a run resumed in its QAT phase) for ``recipe.epochs``."""
    import tensorflow as tf

    cfg, recipe, state = run.cfg, run.cfg.recipe, run.state
    with run.strategy.scope():
        spec_model = build_model(run.inputs.spec, cfg.seed, recipe.bn_momentum)
        model = run.task.training_model(spec_model, run.inputs.spec)
        if cfg.init_weights and not state:
            load_init_weights(spec_model, cfg.init_weights, run.log)
        if cfg.init_backbone:  # (a resumed run has them in its checkpoint: which would load, not loaded again)
            loaded = run.backbone = load_backbone(spec_model, backbone_weights(cfg.init_backbone), assign=not state)
            run.log(f"[train] --init_backbone: {len(loaded.loaded)} of {len(loaded.loaded) + len(loaded.not_loaded)} "
                    f"layers with weights loaded from {loaded.source}"
                    + (f"; not loaded: {', '.join(loaded.not_loaded)}" if loaded.not_loaded else ""))
        opt = make_optimizer(recipe.lr, recipe.momentum, recipe.nesterov, recipe.weight_decay,
                             run.steps * max(recipe.epochs, 1), int(round(recipe.warmup_epochs * run.steps)),
                             recipe.optimizer)
        opt.build(model.trainable_variables)
        run.task.compile(model, opt, cfg, run.inputs)
        ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    begin = 0
    if state and state["phase"] == "float":
        begin = resume(run, ckpt, "float")
    elif state and state["phase"] == "qat":
        if not state.get("float_final"):
            raise TrainError(f"{run.checkpoints.state_path}: corrupted checkpoint state (QAT without the float "
                             f"weights); delete {run.checkpoints.folder} or run without --resume")
        run.checkpoints.restore(tf.train.Checkpoint(model=model), state["float_final"], "float")
        begin = recipe.epochs
    fit_epochs(run, "float", model, opt, ckpt, begin, None)
    return Trained(spec_model, model)


def qat_phase(run: Run, floated: Trained) -> tuple[Trained, list[str]]:
    """The float phase's spec model quantized (``quantize``) and trained for ``recipe.qat_epochs``; its notes."""
    import tensorflow as tf

    cfg, recipe, state = run.cfg, run.cfg.recipe, run.state
    float_final = "float-final"  # the float weights, kept before QAT changes them (not again when QAT resumes)
    if not (state and state["phase"] == "qat"):
        run.checkpoints.write_extra(tf.train.Checkpoint(model=floated.model), float_final)
    with run.strategy.scope():
        spec_model, notes = quantize(floated.spec_model)
        model = run.task.training_model(spec_model, run.inputs.spec)
        opt = make_optimizer(qat_lr(recipe), recipe.momentum, recipe.nesterov, recipe.weight_decay,
                             run.qat_steps * recipe.qat_epochs, kind=recipe.optimizer)
        opt.build(model.trainable_variables)
        run.task.compile(model, opt, cfg, run.inputs)
        ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    for note in notes:
        run.log(f"[qat] {note}")
    begin = resume(run, ckpt, "qat") if state and state["phase"] == "qat" else 0
    fit_epochs(run, "qat", model, opt, ckpt, begin, float_final)
    return Trained(spec_model, model), notes


def fit_epochs(run: Run, phase: str, model: Any, opt: Any, ckpt: Any, begin: int, float_final: str | None) -> None:
    """The epochs ``begin``.. of a phase: fit, batch-norm re-calibration, the task's validation, a checkpoint."""
    cfg, recipe, task, log = run.cfg, run.cfg.recipe, run.task, run.log
    epochs, steps = (recipe.epochs, run.steps) if phase == "float" else (recipe.qat_epochs, run.qat_steps)
    seed = stream_seed(cfg.seed, phase)
    for epoch in range(begin, epochs):
        t0 = time.time()
        log(f"[train] {phase} epoch {epoch + 1}/{epochs} (lr {current_lr(opt):.4g})")
        batches = task.batches(run.inputs, cfg, seed, epoch, steps, recipe.augment)
        t_fit = time.time()
        h = model.fit(batches, epochs=1, verbose=run.verbose)
        rec: dict[str, Any] = {"epoch": epoch + 1, "lr": round(current_lr(opt), 8),
                               "seconds": round(time.time() - t0, 2), "samples": steps * recipe.batch_size}
        rec.update({k: float(v[-1]) for k, v in h.history.items()})
        rec["fit_seconds"] = round(time.time() - t_fit, 2)
        if recipe.bn_recalibration_batches:
            # Only the moving statistics change (training-mode passes use batch statistics), so the training
            # trajectory is the same; validation and the checkpoint then see BN statistics of these weights.
            recalibrate_bn(model, run.calibration, recipe.bn_recalibration_batches, run.strategy)
        rec.update(task.validate(model, run.inputs, cfg))
        rec["seconds"] = round(time.time() - t0, 2)
        t_save = time.time()
        run.history.phase(phase).append(rec)
        run.checkpoints.save(ckpt, phase, epoch + 1, run.history.to_json(), float_final)
        log(f"[train] {phase} epoch {epoch + 1}: {task.epoch_summary(rec)} ({rec['seconds']:.0f} s, training "
            f"{rec['fit_seconds']:.0f} s; checkpoint {time.time() - t_save:.1f} s)")


def resume(run: Run, ckpt: Any, phase: str) -> int:
    """Restore ``ckpt`` from the checkpoint the state names for ``phase`` ("float" or "qat"); drop the history of the
    epochs after it; return the epoch to start from."""
    label = "float" if phase == "float" else "QAT"
    run.checkpoints.restore(ckpt, run.state["checkpoint"], label)
    begin = run.state["epoch"]
    del run.history.phase(phase)[begin:]
    run.log(f"[train] resumed after {label} epoch {begin} from "
            f"{os.path.join(run.checkpoints.folder, run.state['checkpoint'])}")
    return begin


def local_copy(run: Run, trained: Trained, phase: str) -> Trained:
    """A phase's models rebuilt outside the distribution strategy with the trained weights. Every worker calls it at
    the same point: under multi_worker, reading a batch norm's moving statistics is a collective across the workers,
    so the chief alone could not read them (to export or save) after the others have left."""
    spec = run.inputs.spec
    spec_model = build_model(spec, run.cfg.seed, run.cfg.recipe.bn_momentum)
    if phase == "qat":
        spec_model, _ = quantize(spec_model)
    spec_model.set_weights(trained.spec_model.get_weights())
    return Trained(spec_model, run.task.training_model(spec_model, spec))


def _keras_weights(model: Any) -> bytes:
    """The Keras .h5 weights of ``model`` (``--init_weights`` and ``--init_backbone`` take them)."""
    with tempfile.TemporaryDirectory(prefix="tfmcu-weights-") as tmp:
        path = os.path.join(tmp, BACKBONE_WEIGHTS)
        model.save_weights(path)  # (a name not ending .weights.h5: Keras' h5 layout, weights by layer name)
        with open(path, "rb") as f:
            return f.read()


def load_init_weights(model: Any, path: str, log: Callable[[str], None]) -> None:
    """``--init_weights``: Keras weights of this very spec (e.g. a sub-network ``pipelines/search.py`` took out of its
    supernet); anything else is a one-line error."""
    try:
        model.load_weights(path)
    except (OSError, ValueError, KeyError) as e:
        raise TrainError(f"--init_weights={path}: not weights of this model ({str(e).splitlines()[0][:120]})") from None
    log(f"[train] initial weights from {path}")
