"""Shared absl plumbing: every flag that several pipelines take is defined here, once; user mistakes become one line
on stderr and exit code 2, never a traceback.

A flag's default is the pipeline's: a ``define_*`` function that takes a ``default`` is given it by the pipeline, from
that pipeline's options dataclass (``FitOptions``, ``SearchRunOptions``, ...), so ``--help`` shows what runs.

Flag groups (a pipeline calls the ``define_*`` functions it needs; defining a group twice in one process is a no-op):

* model: ``--model`` (fit and profile: no default, the model must be given), ``--resolution``, ``--width``;
* schedule: ``--patches`` (default: none, i.e. no patching), ``--patch_blocks``, ``--patch_ops``, ``--sram_kb``,
  ``--objective``, ``--max_mac_overhead``, ``--grids``, ``--stage_unit``, ``--mac_metric``, ``--count_input`` ->
  ``schedule_request()``; ``--grids`` (patches per side to try, in every pipeline that searches) -> ``grids()``;
* output: ``--json_out``, ``--plot_out``, ``--quiet``, ``--out_dir`` (default: each pipeline's own folder);
* training: the recipe and data flags; each defaults to "the job's own setting" (``tfmcu.train.default_config`` of
  the task for ``train``, ``tfmcu.flows.demo.demo_training`` for ``demo``: --help shows each) ->
  ``training_config(base)``;
* ``--seed`` (0).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines

from absl import app, flags  # noqa: E402

from tfmcu.errors import TfmcuError, UsageError  # noqa: E402
from tfmcu.flows.common import ScheduleRequest, parse_grids  # noqa: E402
from tfmcu.firmware.sources import CONSOLES  # noqa: E402
from tfmcu.firmware.targets import BOARDS_ERROR, TARGETS, UNSUPPORTED  # noqa: E402
from tfmcu.flows.demo import demo_training  # noqa: E402
from tfmcu.flows.deploy import DeployOptions  # noqa: E402
from tfmcu.plan.arena import DEFAULT_KERNELS, KERNEL_SETS  # noqa: E402
from tfmcu.plan.plans import MAC_METRICS, OBJECTIVES, SEARCH_SECONDS, UNITS, SearchOptions  # noqa: E402
from tfmcu.stage.cost import CustomOptions  # noqa: E402
from tfmcu.train.config import OPTIMIZERS, STRATEGIES, TASKS, TrainConfig, default_config  # noqa: E402

FLAGS = flags.FLAGS


def _define(kind: str, name: str, default: Any, *args: Any, **kw: Any) -> None:
    """``flags.DEFINE_<kind>(name, default, *args, **kw)`` unless the flag exists (defined by another group)."""
    if name not in FLAGS:
        getattr(flags, f"DEFINE_{kind}")(name, default, *args, **kw)


# ============================================================================= groups
def define_model_flags(default: str | None = TrainConfig().model) -> None:
    """``--model`` (``default``: the training job's; None where the model must be given), ``--resolution``,
    ``--width``."""
    _define("string", "model", default, "Preset name (mbv2, mbv2-rd, mnasnet-a1, fbnet-a, proxyless-mobile, "
                                        "mcunet-demo), spec JSON file, .tflite or Keras file.")
    _define("integer", "resolution", None, "Input resolution (presets and spec JSON only).", lower_bound=16)
    _define("float", "width", None, "Width multiplier (presets and spec JSON only).", lower_bound=0.05)


def define_search_workers_flag(default: int) -> None:
    _define("integer", "search_workers", default, "Processes pricing the search's candidates (their int8 models, "
                                                  "predicted arenas and instructions); 0: one per core for fit, in "
                                                  "this process for search.", lower_bound=0)


def define_count_input_flag(default: bool) -> None:
    _define("bool", "count_input", default, "Count the input image against --sram_kb.")


def define_budget_flag(default: float | None = None, what: str = "") -> None:
    """``--sram_kb``: the SRAM budget (``what``: what it limits, in a pipeline that says more)."""
    _define("float", "sram_kb", default, "SRAM budget in kB (1 kB = 1024 B)" + (f": {what}" if what else "") + ".",
            lower_bound=0)


def define_schedule_flags() -> None:
    d = SearchOptions()  # the search flags' defaults
    _define("string", "patches", None, "Patch grid: P (PxP), PxQ, or 'auto' (searched: least MACs under --sram_kb, "
                                       "or the smallest with --objective=memory). Omitted: no patching.")
    _define("integer", "patch_blocks", None, "Patch stage = the first N blocks (the stem conv is block 0).",
            lower_bound=1)
    _define("integer", "patch_ops", None, "Patch stage = the first K operators (instead of --patch_blocks).",
            lower_bound=1)
    define_budget_flag()
    define_objective_flag()
    define_max_mac_overhead_flag(d.max_mac_overhead)
    define_grids_flag(d.patch_options, "Auto mode: patches per side to try (PxQ grids, 1: none).")
    _define("enum", "stage_unit", d.unit, list(UNITS), "Auto mode: patch stages by blocks or by operators.")
    _define("enum", "mac_metric", d.mac_metric, list(MAC_METRICS), "Auto mode: which MAC count to minimise.")
    define_count_input_flag(d.count_input)
    define_search_seconds_flag(SEARCH_SECONDS)


def define_search_seconds_flag(default: float) -> None:
    _define("float", "search_seconds", default, "Time budget of the schedule search (seconds): when it runs out, the "
                                                "best plan found so far is taken and the report says the search was "
                                                "cut short.", lower_bound=1.0)


def define_grids_flag(default: Sequence[int], help_text: str) -> None:
    """``--grids``: the patches per side a search tries (``default``: the pipeline's options)."""
    _define("list", "grids", [str(p) for p in default], help_text)


def define_max_mac_overhead_flag(default: float | None) -> None:
    _define("float", "max_mac_overhead", default, "Largest MAC overhead a patched candidate may have (0.2 = +20%; "
                                                  "not given: no cap).", lower_bound=0)


def define_firmware_flags() -> None:
    """What a firmware is built for and run with (deploy, fit); defaults from ``tfmcu.flows.deploy.DeployOptions``."""
    d = DeployOptions(tflite="")
    _define("enum", "target", d.target, [*TARGETS, *UNSUPPORTED],
            "The board (its core, Flash and SRAM regions, and the QEMU board that runs it; "
            "tfmcu/firmware/boards.json, docs/boards.md).")
    _define("bool", "run", d.run, "Build the firmware with Bazel and run it under QEMU: measured figures and a "
                                  "'fits / does not fit <target>' verdict.")
    define_inputs_flag()
    _define("integer", "num_inputs", d.num_inputs, "Seeded random test inputs when --inputs is not given (at most "
                                                   "16 inputs are used).", lower_bound=1, upper_bound=16)
    _define("float", "margin", d.margin, "Arena = predicted TFLM arena x (1 + margin).", lower_bound=0.0,
            upper_bound=1.0)
    _define("integer", "stack_kib", d.stack_kib, "Stack reserved for the firmware (KiB).", lower_bound=2,
            upper_bound=64)
    _define("bool", "persistent_apart", d.persistent_apart,
            "On a board with a region for it (the STM32F405's CCM; boards.json persistent_ram): TFLM's persistent "
            "data in a buffer of its own there when it fits, the arena in the firmware's RAM then holding only the "
            "rest. --nopersistent_apart: all of it in the one arena.")
    define_kernels_flag()
    _define("bool", "profile", d.profile,
            "With --run: build the firmware in per-op mode and profile one Invoke on the target: per operator its "
            "MACs, instructions (QEMU), the latency predictor's, its share, instructions per MAC, the functions it "
            "ran and, where the core's timings are known, estimated cycles and ms at the board's clock (a table, "
            "profile.json and profile.png).")
    _define("enum", "console", d.console, list(CONSOLES),
            "Where the firmware writes its report: semihosting (QEMU's stdout, or a debugger's console; a board "
            "without a debugger halts) or uart (the board's console UART, 115200 8N1: a board on its own; "
            "docs/boards.md).")


def firmware_options(tflite: str = "", out_dir: str = "", seed: int = 0) -> DeployOptions:
    """deploy's options from the firmware flags (``define_firmware_flags``, ``--tree``): deploy's own, and fit's
    ``FitOptions.firmware`` (fit sets the model, folder and seed)."""
    return DeployOptions(tflite=tflite, target=FLAGS.target, out_dir=out_dir or DeployOptions(tflite="").out_dir,
                         run=FLAGS.run, inputs=FLAGS.inputs, num_inputs=FLAGS.num_inputs, seed=seed,
                         margin=FLAGS.margin, stack_kib=FLAGS.stack_kib, kernels=FLAGS.kernels, tree=FLAGS.tree,
                         console=FLAGS.console, persistent_apart=FLAGS.persistent_apart, profile=FLAGS.profile)


def define_max_stages_flag(default: int | None = SearchOptions().max_stages) -> None:
    _define("integer", "max_stages", default,
            "At most this many patch stages anywhere in the network (each its own TFMCU_PATCH_STAGE op, proposed by "
            "a dynamic programme over cut points; docs/multistage.md). 1: one stage at the start"
            + ("; by default any number." if default is None else "."), lower_bound=1)


def define_tree_flag() -> None:
    _define("string", "tree", None, "Also write the firmware as a plain source tree with a CMakeLists.txt for "
                                    "arm-none-eabi-gcc and vendor IDEs (docs/tree.md).")


def define_kernels_flag() -> None:
    _define("enum", "kernels", DEFAULT_KERNELS, list(KERNEL_SETS),
            "The firmware's kernels: cmsis_nn (TFLM's CMSIS-NN kernels + the patch executor's CMSIS-NN backend) or "
            "reference (TFLM's reference kernels + our portable C ones). Memory plans (rewrite --inplace) and "
            "predictions are for these; a model planned in place runs only with the kernels it was planned for.")


def define_stream_input_flag() -> None:
    _define("bool", "stream_input", CustomOptions().stream_input,
            "Custom mode: the patch stage reads the image row band by row band through a TfmcuInputProvider your "
            "firmware registers (a camera, a decoder, rows in Flash): the model's input becomes a one-byte "
            "placeholder and the arena holds no image (tflm_patch_kernels/tflm/patch_stage_op.h).")


_OBJECTIVES_HELP = {"macs": "macs: least MACs whose memory fits --sram_kb",
                    "memory": "memory: the smallest memory (--sram_kb optional, checked if given; fit: within "
                              "--max_latency)",
                    "latency": "latency (fit): the fewest predicted instructions that fit the target"}


def define_objective_flag(default: str = SearchOptions().objective, choices: Sequence[str] = OBJECTIVES) -> None:
    """``--objective`` (``default`` and ``choices``: the pipeline's; the schedule search's by default)."""
    _define("enum", "objective", default, list(choices),
            "What the schedule search optimises. " + "; ".join(_OBJECTIVES_HELP[c] for c in choices) + ".")


def define_output_flags(plot: bool = False, quiet: bool = False) -> None:
    _define("string", "json_out", None, "Write the JSON report here.")
    if plot:
        _define("string", "plot_out", None, "Write the PNG plot here.")
    if quiet:
        _define("bool", "quiet", False, "Do not print the summary.")


def define_out_dir(default: str | None = None) -> None:
    """``--out_dir`` (``default``: the pipeline's options'; None: out/<pipeline>, ``out_dir()``)."""
    _define("string", "out_dir", default, "Output folder" + ("." if default else " (default: out/<pipeline>)."))


def define_tflite_flag() -> None:
    _define("string", "tflite", None, "Input int8 .tflite model (any producer; deploy: also custom mode).")


def define_inputs_flag() -> None:
    _define("string", "inputs", None, "Real inputs: .npy of shape (N, ...) (single input) or .npz (one per input).")


def define_seed_flag() -> None:
    _define("integer", "seed", 0, "Seed of everything random (weights, data order, random inputs).")


# flag -> (absl kind, TrainConfig / Recipe field, extra keyword arguments, help)
_TRAINING: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "dataset": ("string", "dataset", {},
                "classify: fashion_mnist, mnist, scenes[:key=value,...] (small objects on cluttered canvases: "
                "tfmcu.data.scenes), or a folder <root>/<class>/*.png|jpg; detection: scenes-det[:key=value,...], "
                "shapes-det[:key=value,...] (flat shapes on noise), or a COCO or VOC folder"),
    "data_dir": ("string", "data_dir", {},
                 "Folder with the IDX files of fashion_mnist / mnist (scenes: those of its objects)"),
    "optimizer": ("enum", "recipe.optimizer", {"enum_values": list(OPTIMIZERS)},
                  "sgd (with momentum) or adam (weight decay decoupled, as AdamW)"),
    "epochs": ("integer", "recipe.epochs", {"lower_bound": 0}, "Float training epochs"),
    "qat_epochs": ("integer", "recipe.qat_epochs", {"lower_bound": 0},
                   "Quantization-aware training epochs (0: post-training quantization)"),
    "batch_size": ("integer", "recipe.batch_size", {"lower_bound": 1}, "Global batch size"),
    "lr": ("float", "recipe.lr", {"lower_bound": 0}, "Peak learning rate (cosine decay to 0)"),
    "qat_lr": ("float", "recipe.qat_lr", {"lower_bound": 0}, "QAT learning rate (lr / 10 if not set)"),
    "momentum": ("float", "recipe.momentum", {"lower_bound": 0, "upper_bound": 0.999}, "SGD momentum"),
    "nesterov": ("bool", "recipe.nesterov", {}, "Nesterov momentum"),
    "weight_decay": ("float", "recipe.weight_decay", {"lower_bound": 0}, "Weight decay on conv / dense kernels"),
    "label_smoothing": ("float", "recipe.label_smoothing", {"lower_bound": 0, "upper_bound": 0.99},
                        "Label smoothing (e.g. 0.1)"),
    "warmup_epochs": ("float", "recipe.warmup_epochs", {"lower_bound": 0},
                      "Linear warm-up epochs before the cosine decay"),
    "bn_momentum": ("float", "recipe.bn_momentum", {"lower_bound": 0.5, "upper_bound": 0.9999},
                    "Batch-norm moving-average momentum"),
    "bn_recalibration_batches": ("integer", "recipe.bn_recalibration_batches", {"lower_bound": 0},
                                 "Re-estimate batch-norm statistics on this many training batches after each epoch "
                                 "(0: off)"),
    "augment": ("bool", "recipe.augment", {}, "Random shift (and flip where the classes allow it)"),
    "flip": ("enum", "recipe.flip", {"enum_values": ["auto", "yes", "no"]}, "Horizontal flips: auto = not for digits"),
    "val_split": ("float", "val_split", {"lower_bound": 0},
                  "Validation samples held out of the training set (or a fraction < 1); data sets with their own "
                  "validation split (scenes) use it instead"),
    "train_subset": ("integer", "train_subset", {"lower_bound": 1}, "Train on a seeded subset of this many samples"),
    "steps_per_epoch": ("integer", "steps_per_epoch", {"lower_bound": 1}, "Cap the steps of an epoch"),
    "qat_steps_per_epoch": ("integer", "qat_steps_per_epoch", {"lower_bound": 1}, "Cap the steps of a QAT epoch"),
    "test_subset": ("integer", "test_subset", {"lower_bound": 1},
                    "Float / QAT accuracy on a seeded subset of N test samples"),
    "int8_eval_samples": ("integer", "int8_eval_samples", {"lower_bound": 1},
                          "int8 accuracy (TF Lite and TFLM) on a seeded subset of N test samples"),
    "init_weights": ("string", "init_weights", {},
                     "Start from these Keras weights of the same spec (.h5; pipelines/search.py writes best.weights.h5 "
                     "next to best.json)"),
    "init_backbone": ("string", "init_backbone", {},
                      "Start the layers of the same name and shapes from another run of the same spec family: its "
                      "folder (model_float_weights.h5) or a Keras .h5 weights file, e.g. a detector's backbone from "
                      "a classification run; the report lists the layers loaded"),
    "calibration_samples": ("integer", "calibration_samples", {"lower_bound": 1},
                            "Representative training images for the int8 conversion"),
    "test_fraction": ("float", "test_fraction", {"lower_bound": 0.01, "upper_bound": 0.9},
                      "Image folders without a test/ folder: test share of each class"),
    "deterministic": ("bool", "deterministic", {}, "tf.config.experimental.enable_op_determinism()"),
    "strategy": ("enum", "strategy", {"enum_values": list(STRATEGIES)}, "tf.distribute strategy"),
    "resume": ("bool", "resume", {}, "Continue from the last checkpoint in --out_dir/checkpoints"),
    "classifier_as_conv": ("bool", "classifier_as_conv", {}, "Export the classifier as a 1x1 CONV_2D "
                                                             "(TF Lite == TFLM)"),
}


def _field(config: TrainConfig, target: str) -> Any:
    obj: Any = config
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def define_training_flag(name: str, default: Any) -> None:
    """One of the training flags (``_TRAINING``: its kind and meaning) with a pipeline's own ``default``: the same
    flag wherever it is taken (``pipelines.search``'s supernet takes ``--dataset``, ``--data_dir``, ``--strategy``)."""
    kind, _, kw, help_text = _TRAINING[name]
    kw = dict(kw)
    args = (kw.pop("enum_values"),) if kind == "enum" else ()
    _define(kind, name, default, *args, f"{help_text}.", **kw)


def define_training_flags() -> None:
    """The training flags; unset, each keeps the job's own setting, which --help shows (each task's for ``train``,
    and the demo's short run)."""
    define_model_flags()
    define_seed_flag()
    jobs = {**{task: default_config(task) for task in TASKS}, "demo": demo_training()}
    for name, (kind, target, kw, help_text) in _TRAINING.items():
        kw = dict(kw)
        values = {job: _field(cfg, target) for job, cfg in jobs.items()}
        shown = (f"default {values['classify']}" if len(set(map(repr, values.values()))) == 1
                 else ", ".join(f"{job}: {value}" for job, value in values.items()))
        args = (kw.pop("enum_values"),) if kind == "enum" else ()
        _define(kind, name, None, *args, f"{help_text} ({shown}).", **kw)
    _define("bool", "progress", True, "Progress bars (Keras; one line per epoch when not on a terminal).")


# ============================================================================= flags -> library options
def grids() -> tuple[int, ...]:
    """``--grids`` as patch counts per side (a one-line ``UsageError`` naming the flag)."""
    return parse_grids(FLAGS.grids)


def schedule_request(**search_options: Any) -> ScheduleRequest:
    """The schedule flags (and a pipeline's own ``search_options``, e.g. rewrite's ``max_stages``)."""
    search = SearchOptions(patch_options=grids(), unit=FLAGS.stage_unit,
                           max_mac_overhead=FLAGS.max_mac_overhead, mac_metric=FLAGS.mac_metric,
                           count_input=FLAGS.count_input, objective=FLAGS.objective,
                           search_seconds=FLAGS.search_seconds, **search_options)
    return ScheduleRequest(patches=FLAGS.patches, patch_blocks=FLAGS.patch_blocks, patch_ops=FLAGS.patch_ops,
                           sram_kb=FLAGS.sram_kb, search=search)


def training_config(base: TrainConfig) -> TrainConfig:
    """``base`` with every training flag the user gave (flags left unset keep ``base``'s value)."""
    config: dict[str, Any] = {"model": FLAGS.model if FLAGS["model"].present else base.model,
                              "resolution": FLAGS.resolution or base.resolution, "width": FLAGS.width,
                              "seed": FLAGS.seed}
    recipe: dict[str, Any] = {}
    for name, (_, target, _, _) in _TRAINING.items():
        value = getattr(FLAGS, name)
        if value is None:
            continue
        if target.startswith("recipe."):
            recipe[target[len("recipe."):]] = value
        else:
            config[target] = int(value) if name == "val_split" and value >= 1 else value
    if not FLAGS.progress:
        config["verbose"] = 0
    return dataclasses.replace(base, recipe=dataclasses.replace(base.recipe, **recipe), **config)


def out_dir(pipeline: str) -> str:
    return FLAGS.out_dir or os.path.join("out", pipeline)


def log_stderr(msg: str) -> None:
    """A library's log lines, on stderr (stdout keeps the summary)."""
    print(msg, file=sys.stderr, flush=True)


class _ProgressBar:
    """Progress of a long search on stderr: a bar, the count, the time since it started, what is being priced (in
    place on a terminal; every tenth line otherwise). A count that starts again (a new search) restarts the clock."""

    WIDTH = 20

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.last = 0

    def __call__(self, n: int, total: int, what: str) -> None:
        if n <= self.last or n == 1:
            self.start = time.monotonic()
        self.last = n
        done = round(self.WIDTH * n / max(total, 1))
        line = f"  [{'#' * done}{'.' * (self.WIDTH - done)}] {n}/{total} {time.monotonic() - self.start:5.0f} s  {what}"
        if sys.stderr.isatty():
            print(f"\r{line[:110]:<110}", end="" if n < total else "\n", file=sys.stderr, flush=True)
        elif n == 1 or n % 10 == 0 or n == total:
            print(line, file=sys.stderr, flush=True)


progress = _ProgressBar()  # a ``tfmcu.plan.search.Progress``: what the pipelines pass to a long search


# ============================================================================= running
USER_ERRORS: tuple[type[BaseException], ...] = (TfmcuError, FileNotFoundError, IsADirectoryError,
                                                NotADirectoryError, PermissionError)


def fail(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def run(main: Callable[[Sequence[str]], int | None]) -> None:
    """``app.run(main)`` with flag errors and ``USER_ERRORS`` as one line on stderr and exit status 2."""
    prog = os.path.basename(sys.argv[0]).removesuffix(".py")
    if prog == "__main__":
        prog = (main.__module__ or "tfmcu").rsplit(".", 1)[-1]

    def parse(argv: list[str]) -> list[str]:
        if BOARDS_ERROR:  # the user's own boards file ($TFMCU_BOARDS) is not what --target can take
            fail(prog, BOARDS_ERROR)
        try:
            rest = FLAGS(argv)
        except flags.Error as e:
            fail(prog, str(e).splitlines()[0])
        if len(rest) > 1:
            fail(prog, f"unexpected arguments: {' '.join(rest[1:])}")
        return rest

    def wrapped(argv: Sequence[str]) -> int | None:
        try:
            return main(argv)
        except USER_ERRORS as e:
            fail(prog, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None

    app.run(wrapped, flags_parser=parse)


__all__ = ["FLAGS", "UsageError", "define_budget_flag", "define_grids_flag", "define_max_mac_overhead_flag",
           "define_model_flags", "define_objective_flag", "define_out_dir", "define_output_flags",
           "define_schedule_flags", "define_seed_flag", "define_training_flags", "grids", "out_dir", "progress", "run",
           "schedule_request", "training_config"]
