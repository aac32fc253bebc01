"""Training the supernet (``tfmcu.nets.supernet``) on a ``tfmcu.data`` data set, and scoring sub-networks with it.

The MCUNetV2 recipe, scaled down (``SupernetRecipe``):

1. ``largest_epochs`` epochs of the largest network alone (SGD with momentum, cosine decay, weight decay on kernels);
   then ``Supernet.sort_channels`` puts the most important channels first;
2. ``epochs`` epochs of the supernet: each step trains the largest network and ``random_subnets`` random
   sub-networks of the search space (each on the batch resized to its resolution) and applies their averaged
   gradients once (the paper: 4 random sub-networks, twice the largest network's epochs).

Batches come at the largest resolution of the search space (``tfmcu.data.classify.train_dataset``: seeded order and
augmentation per epoch); a sub-network sees them resized. One checkpoint per epoch (``tfmcu.train.checkpoints``,
phases ``largest`` and ``supernet``): ``resume=True`` continues after the last finished epoch.

``SubnetAccuracy(net, ds)(genome)``: re-calibrates the sub-network's batch-norm statistics on ``calibration_batches``
batches of ``calibration_batch_size`` training images (the paper: 20 x 64), then its top-1 accuracy on the held-out
split (``ds.val``, or ``eval_samples`` of it), both at the sub-network's resolution.

Distribution (``strategy``, as ``tfmcu.train``): ``default`` (one device), ``mirrored`` (all local GPUs) or
``multi_worker`` (``MultiWorkerMirroredStrategy``, cluster from ``TF_CONFIG``): the supernet's variables and the
optimizer live in the strategy's scope, batches are split over the replicas (``batch_size`` is the global batch:
each replica's loss is its share of the global mean) and the optimizer all-reduces the gradients. The sub-networks of
a step are drawn from the same seeded generator on every worker, so all replicas train the same ones. Only the chief
writes checkpoints to ``out_dir``; other workers write to a private temporary folder and resume from the chief's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tfmcu.data.classify import as_arrays, train_dataset
from tfmcu.data.split import Dataset, stream_seed, subset
from tfmcu.nets.spec import NetSpec, SearchSpace
from tfmcu.train.checkpoints import Checkpoints
from tfmcu.train.config import TrainError
from tfmcu.train import qat
from tfmcu.train.qat import configure_determinism, current_lr, is_chief, make_optimizer

if TYPE_CHECKING:
    from tfmcu.nets.supernet import BNStats, Supernet

PHASES = ("largest", "supernet")


@dataclass(frozen=True)
class SupernetRecipe:
    largest_epochs: int = 3
    epochs: int = 6
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 4e-5
    random_subnets: int = 2  # sampled per step besides the largest
    steps_per_epoch: int | None = None  # cap
    augment: bool = True
    calibration_batches: int = 20
    calibration_batch_size: int = 64
    eval_samples: int | None = None  # held-out samples per sub-network (None: the whole split)

    def validate(self) -> "SupernetRecipe":
        checks = [(self.largest_epochs >= 0 and self.epochs >= 0, "epochs must be >= 0"),
                  (self.largest_epochs + self.epochs > 0, "nothing to train"),
                  (self.batch_size >= 1 and self.calibration_batch_size >= 1, "batch sizes must be >= 1"),
                  (self.lr > 0, "lr must be > 0"), (self.random_subnets >= 0, "random_subnets must be >= 0"),
                  (self.calibration_batches >= 1, "calibration_batches must be >= 1")]
        for ok, msg in checks:
            if not ok:
                raise TrainError(f"supernet recipe: {msg}")
        return self


def _fingerprint(base: NetSpec, space: SearchSpace, recipe: SupernetRecipe, dataset: str, seed: int) -> str:
    keep = {"base": base.to_dict(), "space": dataclasses.asdict(space), "recipe": dataclasses.asdict(recipe),
            "dataset": dataset, "seed": seed}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def train_supernet(base: NetSpec, space: SearchSpace, ds: Dataset, dataset_name: str, out_dir: str,
                   recipe: SupernetRecipe = SupernetRecipe(), seed: int = 0, resume: bool = True,
                   log: Callable[[str], None] = print, strategy: str = "default") -> tuple["Supernet", dict[str, Any]]:
    """Train (or continue training) the supernet; returns it and its history (loss per epoch and phase)."""
    import tensorflow as tf

    from tfmcu.nets.supernet import Supernet  # lazy: imports TensorFlow (the search's flags parse without it)

    recipe.validate()
    dist = qat.make_strategy(strategy)  # before any other TF work (multi-worker needs it first)
    replicas = dist.num_replicas_in_sync
    distributed = replicas > 1 or strategy != "default"  # steps through strategy.run on distributed batches
    if recipe.batch_size % replicas:
        raise TrainError(f"supernet batch_size {recipe.batch_size} is not a multiple of the {replicas} replicas")
    configure_determinism(seed, True)
    with dist.scope():
        net = Supernet(base, space, seed)
    net.chief = is_chief(dist)  # the search runs on the chief only
    max_res = max(space.resolutions)
    steps = len(ds.train) // recipe.batch_size
    if recipe.steps_per_epoch:
        steps = min(steps, recipe.steps_per_epoch)
    if steps < 1:
        raise TrainError(f"the training split has {len(ds.train)} samples, fewer than one batch ({recipe.batch_size})")
    ckpts = Checkpoints(os.path.join(out_dir, "checkpoints"), _fingerprint(base, space, recipe, dataset_name, seed),
                        log, phases=PHASES)
    if not net.chief:
        ckpts.write_folder = tempfile.mkdtemp(prefix="tfmcu-worker-ckpt-")
    state = ckpts.load_state() if resume else None
    history: dict[str, Any] = state["history"] if state else {"largest": [], "supernet": []}
    log(f"[supernet] {base.name}: largest {net.largest.num_blocks - 1} blocks (k7, e{max(space.expands)}, "
        f"w{max(space.widths)}), {len(net.v)} weight tensors; {len(ds.train)} training images at {max_res} px, "
        f"{steps} steps of {recipe.batch_size} per epoch; strategy {strategy} ({replicas} replica"
        f"{'s' if replicas > 1 else ''})")
    for phase, epochs in (("largest", recipe.largest_epochs), ("supernet", recipe.epochs)):
        if epochs == 0:
            continue
        with dist.scope():
            opt = make_optimizer(recipe.lr, recipe.momentum, False, recipe.weight_decay, steps * epochs)
            opt.build(list(net.v.values()))
        ckpt = tf.train.Checkpoint(net=net.checkpoint(), optimizer=opt)
        start = 0
        if state and state["phase"] == phase:
            ckpts.restore(ckpt, state["checkpoint"], f"supernet {phase}")
            start = state["epoch"]
        elif state and PHASES.index(state["phase"]) > PHASES.index(phase):
            continue
        elif state and phase == "supernet":  # the largest phase finished in an earlier run
            ckpts.restore(tf.train.Checkpoint(net=net.checkpoint()), state["checkpoint"], "supernet largest")
        if phase == "supernet" and start == 0 and recipe.largest_epochs:
            net.sort_channels()
        for epoch in range(start, epochs):
            t0 = time.time()
            rng = random.Random(f"{seed}:{phase}:{epoch}")
            losses = []
            batches = train_dataset(ds.train, max_res, base.in_channels, recipe.batch_size, seed,
                                             epoch + (1000 if phase == "supernet" else 0), recipe.augment,
                                             ds.flip, steps=steps)
            if distributed:
                batches = dist.experimental_distribute_dataset(batches)
            for x, y in batches:
                subs = [net.largest.replace(resolution=max_res)]
                if phase == "supernet":
                    subs += [net.sample(rng) for _ in range(recipe.random_subnets)]
                losses.append(net.train_step(x, y, subs, opt, strategy=dist if distributed else None,
                                             global_batch=recipe.batch_size))
            record = {"epoch": epoch + 1, "loss": float(np.mean(losses)), "lr": current_lr(opt),
                      "seconds": round(time.time() - t0, 1)}
            history[phase].append(record)
            ckpts.save(ckpt, phase, epoch + 1, history, None)
            log(f"[supernet] {phase} epoch {epoch + 1}/{epochs}: loss {record['loss']:.3f} ({record['seconds']} s)")
        state = {"phase": phase, "epoch": epochs, "checkpoint": f"{phase}-{epochs:04d}"}
    return net, history


class SubnetAccuracy:
    """genome -> held-out top-1 accuracy of that sub-network (see the module docstring); also keeps each one's
    calibrated BN statistics for ``extract``."""

    def __init__(self, net: "Supernet", ds: Dataset, recipe: SupernetRecipe = SupernetRecipe(),
                 seed: int = 0):
        self.net, self.ds, self.recipe, self.seed = net, ds, recipe, seed
        held = ds.val if ds.val is not None and len(ds.val) else None
        if held is None:
            raise TrainError(f"{ds.name}: no held-out validation split to score sub-networks on")
        self.held = subset(held, recipe.eval_samples, seed)
        n_cal = recipe.calibration_batches * recipe.calibration_batch_size
        self.calibration = subset(ds.train, n_cal, stream_seed(seed, "subnet_calibration"))
        self.stats: dict[str, "BNStats"] = {}

    def spec(self, genome: list[Any]) -> NetSpec:
        return self.net.space.decode(genome, self.net.base)

    def calibrate(self, sub: NetSpec) -> "BNStats":
        x, _ = as_arrays(self.calibration, sub.resolution, sub.in_channels)
        b = self.recipe.calibration_batch_size
        return self.net.calibrate(sub, (x[i:i + b] for i in range(0, len(x), b)))

    def __call__(self, genome: list[Any]) -> float:
        import tensorflow as tf

        sub = self.spec(genome)
        stats = self.calibrate(sub)
        self.stats[json.dumps(genome)] = stats
        x, y = as_arrays(self.held, sub.resolution, sub.in_channels)
        hits = 0
        for i in range(0, len(x), 256):
            logits = self.net(tf.constant(x[i:i + 256]), sub, stats=stats).numpy()
            hits += int((logits.argmax(1) == y[i:i + 256]).sum())
        return hits / max(1, len(y))
