"""The bench section *detection*: does running the first layers patch by patch buy a detector the
input resolution it needs, at the same SRAM?

1. **Resolution sensitivity** (MCUNetV2's Figure 2): the same backbone at several input resolutions, each run
   starting from the backbone of one classifier (``TRANSFER_CLS_*``: MobileNetV2-0.35 on Fashion-MNIST at 32 px,
   the objects the scenes are made of) -- MobileNetV2-0.35 classifying ``scenes`` (one object per canvas) and the
   two-scale yolo detector ``mbv2-det2-w035`` on ``scenes-det`` (both 160 px canvases, 8-40 px objects) -- int8 in
   TFLM on the test split; each point's relative drop from the largest resolution both halves trained at.
2. **The claim**: on a chip with 128 kB and one with 256 kB of SRAM (the TFLM arena gets what ``fit`` leaves it after
   the stack, the static data and deploy's margin: ``tfmcu.flows.fit.arena_budget``; Cortex-M4, CMSIS-NN build, the
   image counted), the best per-layer detector (the highest resolution trained here whose unmodified model's predicted
   arena fits) against the patched one (the highest resolution at which ``fit``'s joint schedule search, objective
   ``memory`` within ``MAX_LATENCY`` x the per-layer model's predicted instructions, finds a configuration that
   fits), each at its int8 TFLM mAP@0.5 on the test split. One seed per resolution (2 CPU cores): the spread is a
   bootstrap interval over the test images (``tfmcu.train.detection.bootstrap_map50``), not seeds. With ``measure_m4``
   the four models run on the Cortex-M4 (``deploy --run`` / ``fit --run``, QEMU): TFLM's ``arena_used_bytes`` and
   the instructions measured against their predictions (``measure_m4``).
3. **The 128 kB winner on the STM32F405** through ``fit --run``: detections equal TF Lite's on 8 test images (the
   firmware's output hash against TF Lite's), instructions per inference (QEMU), arena measured against predicted.

Training runs are cached in ``out_dir/detection/<name>/`` (a finished run's ``train_report.json`` is reused), so the
section can be resumed. The search is restricted to the configuration ``fit`` picks for this detector at 96 px with
every configuration open (halo ``smallest``, the rest's convolutions by tfmcu in place): ``SEARCH``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import numpy as np

from benchmarks.fit import measured_row
from tfmcu.files import figure_png, write_outputs
from tfmcu.firmware.targets import get_target
from tfmcu.flows.deploy import DeployOptions, FirmwareRun, deploy
from tfmcu.flows.fit import ChosenCandidate, FitMeasured, FitOptions, arena_budget, price, run as fit_run
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.plan.arena import mcu_build, predict_model_arena
from tfmcu.plan.latency import predict_instructions
from tfmcu.plan.profiler import profile
from tfmcu.data.catalog import load_detection
from tfmcu.data.images import model_inputs
from tfmcu.firmware.sources import check_model, printed_detections
from tfmcu.runtime.host import evaluate
from tfmcu.runtime.model_io import load_inputs, read_model
from tfmcu.tflite.detection_postprocess import postprocess_outputs
from tfmcu.train.config import DetectionOptions, Recipe, TrainConfig, default_config
from tfmcu.graph.load import load_spec
from tfmcu.train.export import quantize_inputs, untrained_detector_int8
from tfmcu.train.report import TrainReport
from tfmcu.train.trainer import train

DET_MODEL = "mbv2-det2-w035"
DET_DATASET = "scenes-det:canvas=160,object_px=8-40,train=2000,val=200,test=300,seed=0"
CLS_MODEL, CLS_WIDTH = "mbv2", 0.35
CLS_DATASET = "scenes:canvas=160,object_px=8-40,train=2000,val=200,test=1000,seed=0"
# (five detector resolutions; each run's training time is in the section's JSON)
DET_RESOLUTIONS = (48, 64, 96, 128, 192)
CLS_RESOLUTIONS = (48, 64, 96, 128)
EPOCHS = 20  # the classifiers'
# The detectors: train --task=detection's defaults at lr 0.1 for DET_EPOCHS epochs, from the transfer classifier's
# backbone. (lr 0.1 was the best at 32 epochs with GIoU alone as the box loss: 42.0% against 38.5% at the default 0.05
# at 128 px; the section's hour rows measure both again. At 32 epochs the 192 px detector reached 48.7% int8 TFLM
# mAP@0.5.)
DET_EPOCHS = 48
DET_RECIPE = dataclasses.replace(default_config("detection").recipe, epochs=DET_EPOCHS, lr=0.1)
# TFLM's TFLite_Detection_PostProcess requests 12 M N + 4 max(K, M) N + ... bytes of scratch for N anchors and M
# detections: M = 100 (the evaluation's default) would make it the largest buffer of the model; 10 is plenty for
# scenes of at most 4 objects, and is what a firmware would use.
DET_OPTIONS = DetectionOptions(max_detections=10)
# The classifier at the detector's lr (0.05) stays at chance on these scenes (measured: 9-10% at 48/64/96 px after 20
# epochs on 1,000 scenes; at 64 px, 6 epochs on 2,000: lr 0.05 batch 64 11.5% val, lr 0.01 batch 32 17.4% test): 0.01.
CLS_RECIPE = Recipe(epochs=EPOCHS, qat_epochs=0, batch_size=32, lr=0.01, warmup_epochs=1.0)
SRAMS = (128 * 1024, 256 * 1024)  # the chip's RAM; the arena gets what fit leaves it (arena_budget)
CORE, TARGET, KERNELS = "cortex-m4", "cortex-m4", "cmsis_nn"
MAX_LATENCY = 1.25
SEARCH = {"halo_modes": ("smallest",), "rest_convs": ("tfmcu",), "search_seconds": None}  # every candidate
BOARD = "stm32f405"
BOARD_IMAGES = 4  # 128x128x3 test images in Flash: 8 and the 585 kB model exceed the STM32F405's 1 MB


def _cached(folder: str) -> TrainReport | None:
    path = os.path.join(folder, "train_report.json")
    return TrainReport.read(path) if os.path.isfile(path) else None


def train_detector_at(resolution: int, out_dir: str, log: Callable[[str], None]) -> TrainReport:
    """The section's detector at ``resolution`` (cached in ``out_dir/detection/det_<resolution>``), from the backbone
    of the transfer classifier (``transfer_classifier``, cached in ``out_dir/detection_recipe``)."""
    init, _ = transfer_classifier(os.path.join(out_dir, "detection_recipe"), log)
    cfg = default_config("detection", model=DET_MODEL, dataset=DET_DATASET, resolution=resolution,
                         recipe=DET_RECIPE, detection=DET_OPTIONS, init_backbone=init, resume=True)
    return _train_cached(os.path.join(out_dir, "detection", f"det_{resolution}"), cfg, f"[detection] training "
                         f"{DET_MODEL} @ {resolution} on {DET_DATASET}, {DET_EPOCHS} epochs", log)


def train_classifier_at(resolution: int, out_dir: str, log: Callable[[str], None]) -> TrainReport:
    """The section's classifier at ``resolution`` (``out_dir/detection/cls_<resolution>``), from the detectors'
    backbone."""
    init, _ = transfer_classifier(os.path.join(out_dir, "detection_recipe"), log)
    cfg = TrainConfig(model=CLS_MODEL, width=CLS_WIDTH, dataset=CLS_DATASET, resolution=resolution,
                      recipe=CLS_RECIPE, init_backbone=init, resume=True)
    return _train_cached(os.path.join(out_dir, "detection", f"cls_{resolution}"), cfg, f"[detection] training "
                         f"{CLS_MODEL}-{CLS_WIDTH} @ {resolution} on {CLS_DATASET}, {EPOCHS} epochs", log)


def _train_cached(folder: str, cfg: TrainConfig, what: str, log: Callable[[str], None]) -> TrainReport:
    """The run cached in ``folder`` (its ``train_report.json``), or ``cfg`` trained there (logging ``what``)."""
    rep = _cached(folder)
    if rep is None:
        log(f"{what} -> {folder}")
        rep = train(cfg, folder, log=log)
    return rep


def arenas(resolution: int, budget: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The per-layer detector's predicted arena and instructions at ``resolution``, and fit's smallest configuration
    within ``MAX_LATENCY`` (``SEARCH``) on the Cortex-M4 with CMSIS-NN, the image counted. Both are the
    architecture's (weights change neither), so the model is the spec with untrained weights and the trained
    models' post-process settings: the search runs apart from the training."""
    t0 = time.time()
    name = f"{DET_MODEL}@{resolution}"
    model = untrained_detector_int8(load_spec(DET_MODEL, resolution=resolution), 0,
                                    max_detections=DET_OPTIONS.max_detections)
    o = FitOptions(model=name, firmware=DeployOptions(tflite="", target=TARGET, kernels=KERNELS), objective="memory",
                   max_latency=MAX_LATENCY, **SEARCH)
    found = price(o, model, name, budget)
    base, small = found.per_layer, found.smallest
    per_layer = base.predicted_arena_bytes  # (the search's unpatched model, the image counted)
    log(f"[detection] {name}: per layer {per_layer:,} B; patched {small.predicted_arena_bytes:,} B "
        f"({small.describe}) [{time.time() - t0:.0f} s]")
    return {"per_layer_bytes": per_layer, "per_layer_instructions": base.predicted_instructions,
            "per_layer_macs": base.macs,
            "patched_bytes": small.predicted_arena_bytes, "patched": small.describe,
            "patched_grid": small.patches,
            "patched_instructions": small.predicted_instructions, "patched_macs": small.macs,
            "patched_mac_overhead": small.mac_overhead}


def _budget(sram: int) -> int:
    """The arena budget fit leaves on a chip like the target with ``sram`` bytes of RAM."""
    return arena_budget(FitOptions(model="", firmware=DeployOptions(tflite="", target=TARGET)),
                        dataclasses.replace(get_target(TARGET), sram_bytes=sram))


def _tflite(report: TrainReport) -> bytes:
    with open(report.files["tflite"], "rb") as f:
        return f.read()


def detection_section(o: Any, log: Callable[[str], None] = print, measure_m4: bool = True) -> dict[str, Any]:
    """The section (see the module docstring); ``measure_m4=False`` skips the four Cortex-M4 runs of part 2 (their
    arenas stay predicted), not the STM32F405 run of part 3."""
    work = os.path.join(o.out_dir, "detection")
    os.makedirs(work, exist_ok=True)
    # 1. resolution sensitivity
    det_runs = {r: train_detector_at(r, o.out_dir, log) for r in DET_RESOLUTIONS}
    cls_runs = {r: train_classifier_at(r, o.out_dir, log) for r in CLS_RESOLUTIONS}
    top = max(set(DET_RESOLUTIONS) & set(CLS_RESOLUTIONS))  # (both relative to the same resolution)
    m_top = det_runs[top].detection.map50.int8_tflm
    a_top = cls_runs[top].classification.accuracy.int8_tflm
    sens = []
    for r in sorted(set(DET_RESOLUTIONS) | set(CLS_RESOLUTIONS)):
        d = det_runs[r].detection if r in det_runs else None
        c = cls_runs[r].classification if r in cls_runs else None
        m = d and d.map50.int8_tflm
        a = c and c.accuracy.int8_tflm
        sens.append({"resolution": r,
                     "map50_int8_tflm": m, "map50_float": d and d.map50.float,
                     "map50_interval": d and [d.int8.tflm.bootstrap.low, d.int8.tflm.bootstrap.high],
                     "detection_relative": None if m is None else m / m_top,
                     "accuracy_int8_tflm": a, "classification_relative": None if a is None else a / a_top,
                     "detector_training_seconds": det_runs[r].timing_s["float_training"] if r in det_runs else None})
    # 2. the claim: arenas of every trained detector, then per budget the best per-layer and patched ones
    sizes = {}
    for r in DET_RESOLUTIONS:
        cache = os.path.join(work, f"det_{r}", "arenas.json")
        if os.path.isfile(cache):
            with open(cache) as f:
                sizes[r] = json.load(f)
        else:
            sizes[r] = arenas(r, _budget(max(SRAMS)), log)
            write_outputs({cache: sizes[r]})
        trained = predict_model_arena(_tflite(det_runs[r]), build=mcu_build(KERNELS)).total
        if trained != sizes[r]["per_layer_bytes"]:  # (the same architecture: a change in the export would show here)
            raise RuntimeError(f"{DET_MODEL}@{r}: the trained model's predicted arena {trained:,} B is not the "
                               f"untrained one's {sizes[r]['per_layer_bytes']:,} B")
    claims = []
    for sram in SRAMS:
        budget = _budget(sram)
        flat = [r for r in DET_RESOLUTIONS if sizes[r]["per_layer_bytes"] <= budget]
        patched = [r for r in DET_RESOLUTIONS if sizes[r]["patched_bytes"] <= budget]
        row: dict[str, Any] = {"sram_bytes": sram, "budget_bytes": budget}
        for kind, fits in (("per_layer", flat), ("patched", patched)):
            if not fits:
                row[kind] = None
                continue
            r = max(fits)
            rep = det_runs[r].detection
            b = rep.int8.tflm.bootstrap
            row[kind] = {"resolution": r, "map50": rep.map50.int8_tflm, "map": rep.map.int8_tflm,
                         "map50_interval": [b.low, b.high],
                         "predicted_arena_bytes": sizes[r][f"{kind}_bytes"],
                         "schedule": "per layer" if kind == "per_layer" else sizes[r]["patched"],
                         "grid": None if kind == "per_layer" else sizes[r].get("patched_grid"),
                         "predicted_instructions": sizes[r][f"{kind}_instructions"]}
        if row["per_layer"] and row["patched"]:
            row["gain_points"] = 100 * (row["patched"]["map50"] - row["per_layer"]["map50"])
        claims.append(row)
    if measure_m4:
        for row in claims:
            for kind in ("per_layer", "patched"):
                if row[kind]:
                    row[kind]["measured"] = _measure_m4(row[kind], det_runs, work, kind, log)
    # 3. the 128 kB winner on the STM32F405
    board = None
    small = claims[0]["patched"]
    if small:
        board = _board_run(det_runs[small["resolution"]], work, log)
    result = {"sensitivity": sens, "claims": claims, "arenas": {str(r): s for r, s in sizes.items()},
              "board": board, "setup": _setup()}
    plot = os.path.join(o.out_dir, "detection.png")
    write_outputs({plot: _plot(sens, claims)})
    return {"rows": result, "plot": "detection.png"}


# ============================================================================= section detection_recipe
# The recipe on a task a detector should all but solve: flat shapes on noise (tfmcu.data.shapes_det; 96 px, 1,000
# training images), trained by `train --task=detection` with its defaults within a 10-minute budget, int8 in TFLM.
# "objectness target 1": the defaults but the assigned anchors' objectness target (no IoU mixed in).
# "previous options": the same run with the options the detector trained with before (one positive anchor per box,
# smooth-L1 of the encodings, batch 32, the one-scale mbv2-det-w035; both start with the objectness prior).
RECIPE_DATASET = "shapes-det"
RECIPE_RESOLUTION = 96
RECIPE_EPOCHS = 20
RECIPE_RUNS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "objectness target 1": {"detection": {"obj_iou": 0.0}},
    "previous options": {"model": "mbv2-det-w035", "recipe": {"optimizer": "sgd", "lr": 0.05, "batch_size": 32},
                         "detection": {"positives": "best", "box_loss": "smooth_l1", "obj_iou": 0.0}},
}


# --init_backbone: classifiers of the detector's family (MobileNetV2-0.35), then the detector on the detection scenes
# from scratch and from each classifier's backbone, the same recipe (the defaults) and steps, and from each for half
# the steps; each epoch's validation mAP says how many steps a run from a backbone needs to reach the from-scratch
# run's final figure. TRANSFER_CLS_*: Fashion-MNIST, the objects the scenes are made of, at 32 px (the size of the
# scenes' objects in the detectors' inputs; Adam: SGD at lr 0.1 was unstable at 32 px, 69% after 6 epochs); the
# detection section's runs start from it. CLUTTER_CLS_*: one of those objects (16-24 px, the training objects of
# the detection scenes) on a 48 px canvas of the scenes' clutter -- a classifier that has learnt to find an object
# among fragments of others. (By hand, 10 detector epochs from the backbone: Fashion-MNIST trained 15 epochs to 88.2%
# gave 17.7% int8 mAP@0.5 (the 6-epoch one 17.6%); the clutter classifier trained 15 epochs on 12,000 scenes (56.6%)
# gave 23.1%, 30 on 20,000 (71.7%) 27.2%.)
TRANSFER_CLS_DATASET = "fashion_mnist"
TRANSFER_CLS_RESOLUTION = 32
TRANSFER_CLS_RECIPE = Recipe(optimizer="adam", epochs=6, qat_epochs=0, batch_size=128, lr=0.002, warmup_epochs=1.0)
CLUTTER_CLS_DATASET = "scenes:canvas=48,object_px=16-24,train=20000,val=1000,test=1000,seed=0"
CLUTTER_CLS_RESOLUTION = 48
CLUTTER_CLS_RECIPE = Recipe(epochs=30, qat_epochs=0, lr=0.1, warmup_epochs=1.0)
TRANSFER_CLASSIFIERS = {"fashion_mnist": (TRANSFER_CLS_DATASET, TRANSFER_CLS_RESOLUTION, TRANSFER_CLS_RECIPE),
                        "clutter": (CLUTTER_CLS_DATASET, CLUTTER_CLS_RESOLUTION, CLUTTER_CLS_RECIPE)}
TRANSFER_RESOLUTION = 96
TRANSFER_DET_DATASET = "scenes-det:canvas=96,object_px=16-40,objects=1-3,train=1000,val=200,test=300,seed=0"
TRANSFER_EPOCHS = 20

# Within the hour: the detection section's scenes (DET_DATASET, its max_detections) at 128 px, the detector from the
# transfer classifier's backbone for DET_EPOCHS epochs: with the defaults, and at lr 0.1 (DET_RECIPE: that run is
# the detection section's 128 px detector); the classifier's and the detector's training together take about an hour
# on 2 cores.
HOUR_RESOLUTION = 128
HOUR_BUDGET_SECONDS = 3600


def recipe_config(changes: dict[str, Any], dataset: str = RECIPE_DATASET, resolution: int = RECIPE_RESOLUTION,
                  epochs: int = RECIPE_EPOCHS) -> TrainConfig:
    """The section's run: ``train --task=detection`` with its defaults on ``dataset`` at ``resolution`` for
    ``epochs`` (default: ``RECIPE_*``), with ``changes`` (a run of ``RECIPE_RUNS``)."""
    base = default_config("detection")
    recipe = dataclasses.replace(base.recipe, epochs=epochs, **changes.get("recipe", {}))
    detection = dataclasses.replace(base.detection, **changes.get("detection", {}))
    rest = {k: v for k, v in changes.items() if k not in ("recipe", "detection")}
    return default_config("detection", dataset=dataset, resolution=resolution, recipe=recipe,
                          detection=detection, resume=True, **rest)


def _recipe_row(name: str, changes: dict[str, Any], rep: TrainReport) -> dict[str, Any]:
    d = rep.detection
    per_epoch = [e.get("val_map50") for e in rep.history.float]
    return {"run": name, "model": rep.model, "changes": changes,
            "optimizer": rep.recipe.optimizer, "lr": rep.recipe.lr, "epochs": rep.recipe.epochs,
            "steps": rep.steps_per_epoch * rep.recipe.epochs, "steps_per_epoch": rep.steps_per_epoch,
            "batch_size": rep.recipe.batch_size, "positives": d.options.positives, "box_loss": d.options.box_loss,
            "box_l1": d.options.l1_term, "obj_iou": d.options.obj_iou,
            "map50_int8_tflm": d.map50.int8_tflm, "map_int8_tflm": d.map.int8_tflm,
            "map50_interval": [d.int8.tflm.bootstrap.low, d.int8.tflm.bootstrap.high],
            "map50_float": d.map50.float, "map_float": d.map.float,
            "tflite_vs_tflm": d.int8.tflite_vs_tflm.describe("images"),
            "training_seconds": rep.timing_s["float_training"], "total_seconds": rep.timing_s["total"],
            "val_map50_per_epoch": per_epoch}


def transfer_runs(work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The ``--init_backbone`` rows (``TRANSFER_*``, ``CLUTTER_CLS_*``): each classifier's figures, the detector from
    scratch and from each classifier's backbone in the same steps and in half of them, and the steps a run from a
    backbone takes to reach the from-scratch run's final validation mAP@0.5."""
    half = TRANSFER_EPOCHS // 2
    scratch_rep = _train_cached(os.path.join(work, "transfer_from_scratch"),
                                recipe_config({}, TRANSFER_DET_DATASET, TRANSFER_RESOLUTION, TRANSFER_EPOCHS),
                                f"[detection_recipe] from scratch: detector on {TRANSFER_DET_DATASET}", log)
    scratch = _recipe_row("from scratch", {}, scratch_rep)
    target = scratch["val_map50_per_epoch"][-1]
    rows, classifiers = [scratch], []
    for key in TRANSFER_CLASSIFIERS:
        cls_folder, cls = transfer_classifier(work, log, key)
        dataset, resolution, _ = TRANSFER_CLASSIFIERS[key]
        tag = "" if key == "fashion_mnist" else "_" + key  # (the folder names the first runs were cached under)
        runs = {}
        for epochs in (TRANSFER_EPOCHS, half):
            cut = epochs < TRANSFER_EPOCHS
            name = f"--init_backbone {key}" + (f", {epochs} epochs" if cut else "")
            folder = os.path.join(work, "transfer_init_backbone" + tag + (f"_{epochs}_epochs" if cut else ""))
            cfg = recipe_config({"init_backbone": cls_folder}, TRANSFER_DET_DATASET, TRANSFER_RESOLUTION, epochs)
            rep = _train_cached(folder, cfg, f"[detection_recipe] {name}: detector on {TRANSFER_DET_DATASET}", log)
            row = runs[epochs] = _recipe_row(name, {}, rep)
            row["init"] = key
            row["backbone_layers"] = {"loaded": len(rep.backbone.loaded), "not_loaded": len(rep.backbone.not_loaded)}
        rows += runs.values()
        init, shorter = runs[TRANSFER_EPOCHS], runs[half]
        reach = next((i + 1 for i, v in enumerate(init["val_map50_per_epoch"]) if v is not None and v >= target),
                     None)
        acc = cls.classification.accuracy
        classifiers.append({
            "name": key, "model": f"{CLS_MODEL} width {CLS_WIDTH}", "dataset": dataset, "resolution": resolution,
            "epochs": cls.recipe.epochs, "optimizer": cls.recipe.optimizer, "lr": cls.recipe.lr,
            "steps": cls.steps_per_epoch * cls.recipe.epochs, "accuracy_float": acc.float,
            "training_seconds": cls.timing_s["float_training"],
            "init_epochs_to_reach": reach, "init_steps_to_reach": reach and reach * init["steps_per_epoch"],
            "steps_ratio": reach and reach * init["steps_per_epoch"] / scratch["steps"],
            # the same mAP in half the steps: the run with half the epochs (its own schedule) against from scratch's
            "half_steps": {"steps": shorter["steps"], "map50_int8_tflm": shorter["map50_int8_tflm"],
                           "scratch_map50_int8_tflm": scratch["map50_int8_tflm"],
                           "reaches": shorter["map50_int8_tflm"] >= scratch["map50_int8_tflm"]}})
    return {"dataset": TRANSFER_DET_DATASET, "resolution": TRANSFER_RESOLUTION, "runs": rows,
            "scratch_final_val_map50": target, "classifiers": classifiers}


def transfer_classifier(work: str, log: Callable[[str], None], key: str = "fashion_mnist") -> tuple[str, TrainReport]:
    """The classifier ``TRANSFER_CLASSIFIERS[key]`` (trained, or cached in ``work``): its folder and report."""
    dataset, resolution, recipe = TRANSFER_CLASSIFIERS[key]
    folder = os.path.join(work, "transfer_classifier_" + key)
    cfg = TrainConfig(model=CLS_MODEL, width=CLS_WIDTH, dataset=dataset, resolution=resolution, recipe=recipe,
                      resume=True)
    return folder, _train_cached(folder, cfg, f"[detection_recipe] classifier {CLS_MODEL}-{CLS_WIDTH} on "
                                 f"{dataset} @ {resolution}", log)


def hour_run(work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The within-the-hour row (``HOUR_*``): the detector on ``DET_DATASET`` at ``HOUR_RESOLUTION`` from the transfer
    classifier's backbone; the training time counts the classifier's."""
    cls_folder, cls = transfer_classifier(work, log)
    rows = []
    for name, extra in (("defaults", {}), (f"lr {DET_RECIPE.lr:g}", {"recipe": {"lr": DET_RECIPE.lr}})):
        changes = {**extra, "detection": {"max_detections": DET_OPTIONS.max_detections}}
        if extra:  # the detection section's run
            rep = train_detector_at(HOUR_RESOLUTION, os.path.dirname(work), log)
        else:
            cfg = recipe_config({**changes, "init_backbone": cls_folder}, DET_DATASET, HOUR_RESOLUTION, DET_EPOCHS)
            rep = _train_cached(os.path.join(work, f"hour_{HOUR_RESOLUTION}"), cfg, f"[detection_recipe] within "
                                f"the hour ({name}): detector on {DET_DATASET} @ {HOUR_RESOLUTION} from the "
                                f"classifier's backbone", log)
        row = _recipe_row(name, changes, rep)
        row["with_classifier_seconds"] = cls.timing_s["float_training"] + row["training_seconds"]
        rows.append(row)
    return {"dataset": DET_DATASET, "resolution": HOUR_RESOLUTION, "budget_seconds": HOUR_BUDGET_SECONDS,
            "classifier_seconds": cls.timing_s["float_training"], "runs": rows}


def recipe_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Section *detection_recipe*: each run of ``RECIPE_RUNS`` trained (cached in ``out_dir/detection_recipe/<run>``),
    its int8 TFLM mAP@0.5 on the test split with its bootstrap interval, its float mAP, and its training time; then
    the ``--init_backbone`` rows (``transfer_runs``), the within-the-hour row (``hour_run``) and a plot of every
    run's validation mAP per step."""
    work = os.path.join(o.out_dir, "detection_recipe")
    rows = []
    for name, changes in RECIPE_RUNS.items():
        folder = os.path.join(work, name.replace(" ", "_"))
        rep = _train_cached(folder, recipe_config(changes), f"[detection_recipe] {name}: training on "
                            f"{RECIPE_DATASET} @ {RECIPE_RESOLUTION}", log)
        rows.append(_recipe_row(name, changes, rep))
    transfer = transfer_runs(work, log)
    hour = hour_run(work, log)
    write_outputs({os.path.join(o.out_dir, "detection_recipe.png"): _recipe_plot(rows, transfer, hour)})
    return {"rows": {"runs": rows, "transfer": transfer, "hour": hour,
                     "setup": {"dataset": RECIPE_DATASET, "resolution": RECIPE_RESOLUTION,
                               "budget_seconds": 600, "seeds": 1,
                               "spread": "bootstrap 95% interval over the test images"}},
            "plot": "detection_recipe.png"}


def _recipe_plot(rows: list[dict[str, Any]], transfer: dict[str, Any], hour: dict[str, Any]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, runs, title in ((axes[0], rows, f"{RECIPE_DATASET} @ {RECIPE_RESOLUTION} px"),
                            (axes[1], transfer["runs"], f"scenes-det @ {transfer['resolution']} px"),
                            (axes[2], hour["runs"], f"scenes-det @ {hour['resolution']} px, within the hour")):
        for r in runs:
            steps = [(i + 1) * r["steps_per_epoch"] for i in range(len(r["val_map50_per_epoch"]))]
            ax.plot(steps, [100 * (v or 0.0) for v in r["val_map50_per_epoch"]], "o-", ms=3, label=r["run"])
        ax.set_xlabel("training steps")
        ax.set_ylabel("validation mAP@0.5 (%), float")
        ax.set_title(f"{title} (measured)", fontsize=10)
        ax.legend(fontsize=8)
    return figure_png(fig)


_RECIPE_HEADER = ("| run | model | optimizer, lr | positives | box loss | objectness target | epochs x batch (steps) | "
                  "training | mAP@0.5 float | mAP@0.5 int8 TFLM [95%] | mAP@[.5:.95] float / int8 |",
                  "|---|---|---|---|---|---|---:|---:|---:|---:|---:|")


def recipe_table(result: dict[str, Any]) -> str:
    """Section *detection_recipe*'s tables, from its JSON."""
    res = result["rows"]
    s = res["setup"]
    md = [f"`train --task=detection` on `{s['dataset']}` ({s['resolution']} px, one seed), int8 mAP@0.5 in TFLM on "
          f"the test split [{s['spread']}]; training time measured on this run's machine (the float phase: training "
          f"and the per-epoch validation):", "",
          *_RECIPE_HEADER]
    for r in res["runs"]:
        md.append(_recipe_line(r))
    t = res.get("transfer")
    if t:
        md += ["", f"`--init_backbone`: the detector on `{t['dataset']}` at {t['resolution']} px with the defaults, "
               "from scratch and from the backbone of each classifier below, in the same steps and in half of them "
               "(each run's learning-rate schedule complete):", "",
               "| classifier | data @ px | optimizer, lr | epochs (steps) | training | float test accuracy | "
               "reaches the from-scratch final validation mAP@0.5 | half the steps: int8 mAP@0.5 (from scratch, all "
               "the steps) |", "|---|---|---|---:|---:|---:|---|---:|"]
        for c in t["classifiers"]:
            reach = (f"after {c['init_steps_to_reach']} steps, {c['steps_ratio']:.2f} x" if c["init_steps_to_reach"]
                     else "not within its steps")
            hs = c["half_steps"]
            md.append(f"| {c['name']} ({c['model']}) | `{c['dataset']}` @ {c['resolution']} | {c['optimizer']}, "
                      f"{c['lr']:g} | {c['epochs']} ({c['steps']}) | {c['training_seconds'] / 60:.1f} min | "
                      f"{_pct(c['accuracy_float'])} | {reach} | {_pct(hs['map50_int8_tflm'])} "
                      f"({_pct(hs['scratch_map50_int8_tflm'])}) |")
        md += ["", *_RECIPE_HEADER]
        md += [_recipe_line(r) for r in t["runs"]]
        md += ["", f"The from-scratch run's final validation mAP@0.5: {_pct(t['scratch_final_val_map50'])}."]
    h = res.get("hour")
    if h:
        md += ["", f"Within the hour: the detector on `{h['dataset']}` at {h['resolution']} px from the fashion_mnist "
               f"classifier's backbone (its training: {h['classifier_seconds'] / 60:.1f} min; with the detector's: "
               + ", ".join(f"{r['run']} {r['with_classifier_seconds'] / 60:.1f} min" for r in h["runs"]) + "):", "",
               *_RECIPE_HEADER]
        md += [_recipe_line(r) for r in h["runs"]]
    return "\n".join(md) + "\n"


def _recipe_line(r: dict[str, Any]) -> str:
    iv = r["map50_interval"]
    target = "IoU share " + f"{r['obj_iou']:g}" if r.get("obj_iou") else "1"
    float_map = _pct(r["map_float"]) if r.get("map_float") is not None else "-"
    box = r["box_loss"] + (f" + {r['box_l1']:g} x L1" if r.get("box_l1") else "")
    return (f"| {r['run']} | {r['model']} | {r['optimizer']}, {r['lr']:g} | {r['positives']} | {box} | "
            f"{target} | {r['epochs']} x {r['batch_size']} ({r['steps']}) | {r['training_seconds'] / 60:.1f} min | "
            f"{_pct(r['map50_float'])} | {_pct(r['map50_int8_tflm'])} [{_pct(iv[0])}, {_pct(iv[1])}] | "
            f"{float_map} / {_pct(r['map_int8_tflm'])} |")


def _setup() -> dict[str, Any]:
    return {"detector": DET_MODEL, "detection_data": DET_DATASET, "classifier": f"{CLS_MODEL} width {CLS_WIDTH}",
            "classification_data": CLS_DATASET, "epochs": DET_EPOCHS, "classifier_epochs": EPOCHS,
            "detector_lr": DET_RECIPE.lr, "classifier_lr": CLS_RECIPE.lr,
            "init_backbone": f"{CLS_MODEL} width {CLS_WIDTH} on {TRANSFER_CLS_DATASET} at {TRANSFER_CLS_RESOLUTION} px",
            "seeds": 1,
            "max_detections": DET_OPTIONS.max_detections,
            "spread": "bootstrap 95% interval over the test images (200 resamples)", "core": CORE,
            "kernels": KERNELS, "max_latency": MAX_LATENCY,
            "search": {k: list(v) if isinstance(v, tuple) else v for k, v in SEARCH.items()},
            "image": "counted in the arena"}


def _measure_m4(entry: dict[str, Any], det_runs: dict[int, TrainReport], work: str, kind: str,
                log: Callable[[str], None]) -> dict[str, Any]:
    """``deploy --run`` on the Cortex-M4 (CMSIS-NN): the model as it is (per layer) or fit's chosen one (patched,
    ``fit --run`` with the same search): measured arena and instructions against their predictions."""
    r = entry["resolution"]
    folder = os.path.join(work, f"m4_{kind}_{r}")
    done = os.path.join(work, f"m4_{kind}_{r}.json")
    if os.path.isfile(done):
        with open(done) as f:
            return json.load(f)
    src = det_runs[r].files["tflite"]
    data = _tflite(det_runs[r])
    name = f"{DET_MODEL}@{r}"
    if kind == "per_layer":
        dep = deploy(DeployOptions(tflite=src, target=TARGET, out_dir=folder, run=True, kernels=KERNELS,
                                   num_inputs=1), log=log)
        m = measured_row(name, TARGET, "per layer", None, dep.arena.predicted_bytes,
                         predict_instructions(data, CORE, KERNELS).instructions, dep, profile(from_tflite(data)).macs,
                         len(data))
    else:
        # (the search restricted to the grid the section's search chose, where it is known: the same choice, 1/6
        # of the candidates)
        grids = {"patch_options": (entry["grid"][0],)} if entry.get("grid") else {}  # (an entry of this bench)
        rep = fit_run(FitOptions(model=src,
                                 firmware=DeployOptions(tflite="", target=TARGET, kernels=KERNELS, run=True,
                                                        num_inputs=1),
                                 objective="memory", max_latency=MAX_LATENCY, verify_samples=4, out_dir=folder,
                                 **SEARCH, **grids), log=log)
        ch = rep.chosen
        m = measured_row(name, TARGET, "patched (fit)", ch.describe, ch.predicted_arena_bytes,
                         ch.predicted_instructions, rep.deploy, ch.macs, rep.deploy.model_bytes)
    write_outputs({done: m})
    return m


def _board_run(rep: TrainReport, work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """``fit --run`` on the STM32F405 with the first ``BOARD_IMAGES`` test images (the firmware prints their
    detections), then fit's model with the next ``BOARD_IMAGES`` (``deploy --run``: the same firmware with other
    inputs in Flash, which holds only ``BOARD_IMAGES`` beside the model), their detections also checked against the
    unmodified model's in TF Lite."""
    done = os.path.join(work, f"{BOARD}_fit.json")
    if os.path.isfile(done):
        with open(done) as f:
            out = json.load(f)
    else:
        out = None
    model = _tflite(rep)
    res = rep.dataset.resolution
    ds = load_detection(DET_DATASET)
    x, _ = model_inputs(ds.test.take(np.arange(2 * BOARD_IMAGES)), res, 3)
    q = quantize_inputs(model, x)
    folder = os.path.join(work, f"{BOARD}_fit")
    if out is None:
        inputs = os.path.join(work, f"{BOARD}_inputs.npy")
        np.save(inputs, q[:BOARD_IMAGES])
        r = fit_run(FitOptions(model=rep.files["tflite"],
                               firmware=DeployOptions(tflite="", target=BOARD, kernels=KERNELS, run=True,
                                                      inputs=inputs, num_inputs=BOARD_IMAGES),
                               objective="memory", max_latency=MAX_LATENCY, out_dir=folder, **SEARCH), log=log)
        out = {"resolution": res, "chosen": r.chosen.to_json(),
               "measured": None if r.measured is None else r.measured.to_json(), "images": BOARD_IMAGES,
               "run": {} if r.deploy.run is None else r.deploy.run.to_json()}
        write_outputs({done: out})
    if "second" not in out:
        inputs = os.path.join(work, f"{BOARD}_inputs_2.npy")
        np.save(inputs, q[BOARD_IMAGES:])
        dep = deploy(DeployOptions(tflite=os.path.join(folder, "model.tflite"), target=BOARD, kernels=KERNELS,
                                   out_dir=os.path.join(work, f"{BOARD}_deploy_2"), run=True, inputs=inputs,
                                   num_inputs=BOARD_IMAGES), log=log)
        run = dep.run
        # the unmodified model's detections in TF Lite (deploy's expectation is the fitted model's in TF Lite)
        src = read_model(rep.files["tflite"], "model")
        samples = load_inputs(inputs, check_model(src, KERNELS)[0])
        original = printed_detections(evaluate(src, samples, "reference", rep.files["tflite"], tflm=False).tflite,
                                      postprocess_outputs(src.flatbuffer))
        out["second"] = {"images": BOARD_IMAGES, "fits": dep.fits, "verdict": dep.verdict,
                         "arena_used_bytes": None if run is None else run.arena_used_bytes,
                         "predicted_arena_bytes": dep.arena.predicted_bytes,
                         "invoke_insns": None if run is None else run.invoke_insns,
                         "outputs_equal_tflite": run is not None and run.outputs_equal_tflite,
                         "detections_equal_original_tflite": run is not None and run.detections == original,
                         "detections": None if run is None else run.detections}
        out["images"] = 2 * BOARD_IMAGES
        write_outputs({done: out})
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}"


def table(result: dict[str, Any]) -> str:
    """Section *detection*'s tables, from its JSON (its ``rows``: sensitivity, claims, arenas, board, setup)."""
    res = result["rows"]
    s = res["setup"]
    start = (f"each from the backbone of {s['init_backbone']} (detectors {s['epochs']} epochs at lr "
             f"{s['detector_lr']:g}, classifiers {s['classifier_epochs']} at {s['classifier_lr']:g}; one seed)")
    md = [f"Resolution sensitivity: {s['classifier']} on `{s['classification_data']}` and {s['detector']} on "
          f"`{s['detection_data']}` at every resolution, {start}, int8 in TFLM on the test split (measured by this "
          f"code):", "",
          "| input | classification acc. (int8 TFLM) | relative | detection mAP@0.5 (int8 TFLM) [95% bootstrap] "
          "| relative |", "|---:|---:|---:|---:|---:|"]
    for r in res["sensitivity"]:
        iv = r["map50_interval"]
        md.append(f"| {r['resolution']} | {_pct(r['accuracy_int8_tflm'])} | {_pct(r['classification_relative'])} | "
                  f"{_pct(r['map50_int8_tflm'])}" + (f" [{_pct(iv[0])}, {_pct(iv[1])}]" if iv else "")
                  + f" | {_pct(r['detection_relative'])} |")
    md += ["", f"The claim, on a chip with 128 / 256 kB of SRAM (the TFLM arena gets what fit leaves it after the "
               f"stack, static data and deploy's margin; {s['core']}, {s['kernels']}, image counted): the best "
               f"per-layer detector against the patched one (fit's search, within {s['max_latency']}x the per-layer "
               f"predicted instructions). Arena: predicted (tfmcu.plan.arena) and, where measured, TFLM's "
               f"arena_used_bytes under QEMU:", "",
           "| SRAM (arena budget) | per layer: input, mAP@0.5 [95%], arena "
           "| patched: input, mAP@0.5 [95%], arena, schedule | gain |",
           "|---:|---|---|---:|"]
    for c in res["claims"]:
        cells = []
        for kind in ("per_layer", "patched"):
            e = c[kind]
            if not e:
                cells.append("nothing fits")
                continue
            m = e.get("measured") or {}  # (measured_row's: the trained model's prediction and TFLM's count)
            meas = m.get("arena_used_bytes")
            cell = (f"{e['resolution']} px, {_pct(e['map50'])} [{_pct(e['map50_interval'][0])}, "
                    f"{_pct(e['map50_interval'][1])}], "
                    + (f"{meas:,} B measured (predicted {m.get('predicted_arena_bytes', 0):,} B), "
                       f"{m.get('instructions') or 0:,} instructions" if meas else
                       f"{e['predicted_arena_bytes']:,} B predicted"))
            if kind == "patched":
                cell += f", {e['schedule']}"
            cells.append(cell)
        gain = c.get("gain_points")
        md.append(f"| {c['sram_bytes'] // 1024} kB ({c['budget_bytes']:,} B) | {cells[0]} | {cells[1]} | "
                  f"{'n/a' if gain is None else f'{gain:+.1f} points'} |")
    b = res.get("board")
    if b:
        # fit's report, as the board run kept it
        chosen = ChosenCandidate.from_json(b["chosen"])
        m = FitMeasured.from_json(b["measured"]) if b.get("measured") else None
        run = FirmwareRun.from_json(b["run"]) if b.get("run") else None
        second = b.get("second") or {}
        md += ["", f"The 128 kB winner ({b['resolution']} px) through `fit --run` on the STM32F405 (QEMU): "
                   f"{chosen.describe}; arena {(m and m.arena_used_bytes) or 0:,} B measured (predicted "
                   f"{(m and m.predicted_arena_bytes) or 0:,} B), {(m and m.invoke_instructions) or 0:,} "
                   f"instructions per inference (predicted {(m and m.predicted_instructions) or 0:,}); detections "
                   f"equal TF Lite's on its {len((run and run.invoke_insns) or [])} test images: "
                   f"{m and m.outputs_equal_tflite}"
                   + (f"; the same model on the next {second.get('images')} (deploy --run): arena "
                      f"{second.get('arena_used_bytes') or 0:,} B, detections equal TF Lite's: "
                      f"{second.get('outputs_equal_tflite')}, equal the unmodified model's in TF Lite: "
                      f"{second.get('detections_equal_original_tflite')}" if second else "") + "."]
    return "\n".join(md) + "\n"


def _plot(sens: list[dict[str, Any]], claims: list[dict[str, Any]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    d = [r for r in sens if r["detection_relative"] is not None]
    c = [r for r in sens if r["classification_relative"] is not None]
    a1.plot([r["resolution"] for r in c], [100 * r["classification_relative"] for r in c], "o-",
            label="classification (scenes), accuracy")
    a1.plot([r["resolution"] for r in d], [100 * r["detection_relative"] for r in d], "s-",
            label="detection (scenes-det), mAP@0.5")
    a1.set_xlabel("input resolution (px)")
    a1.set_ylabel("% of the figure at the largest resolution both have (int8, TFLM)", fontsize=9)
    a1.set_title("resolution sensitivity (measured)", fontsize=10)
    a1.legend(fontsize=8)
    labels, flat, patched = [], [], []
    for row in claims:
        labels.append(f"{row['sram_bytes'] // 1024} kB SRAM")
        flat.append(100 * row["per_layer"]["map50"] if row["per_layer"] else 0.0)
        patched.append(100 * row["patched"]["map50"] if row["patched"] else 0.0)
    x = np.arange(len(labels))
    a2.bar(x - 0.2, flat, 0.4, label="per layer (TFLM + CMSIS-NN)")
    a2.bar(x + 0.2, patched, 0.4, label="patched (fit)")
    for i, row in enumerate(claims):
        for dx, kind in ((-0.2, "per_layer"), (0.2, "patched")):
            e = row[kind]
            if e:
                a2.annotate(f"{e['resolution']} px", (i + dx, 100 * e["map50"]), ha="center",
                            textcoords="offset points", xytext=(0, 3), fontsize=8)
    a2.set_xticks(x, labels)
    a2.set_xlabel("chip SRAM (TFLM arena + stack + static data; Cortex-M4, image counted)")
    a2.set_ylabel("test mAP@0.5 (%), int8 TFLM")
    a2.set_title("same SRAM: per layer vs patched (measured mAP)", fontsize=10)
    a2.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)
