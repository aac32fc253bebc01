"""Analytic memory / MACs profile of a model, per layer and patch by patch.

    python -m pipelines.profile --model=mbv2 --resolution=224 --width=1.0 --patches=4 --patch_blocks=5 \
        --json_out=r.json --plot_out=r.png
    python -m pipelines.profile --model=model.tflite --patches=auto --sram_kb=256

--model is a preset name, a spec JSON file, a .tflite file or a Keras model file (.keras / .h5).
"""

from __future__ import annotations

from typing import Sequence

from pipelines import _cli
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Preset name, spec JSON, .tflite or Keras model file.")
flags.DEFINE_integer("resolution", None, "Input resolution (presets and spec JSON only).", lower_bound=16)
flags.DEFINE_float("width", None, "Width multiplier (presets and spec JSON only).", lower_bound=0.05)
flags.DEFINE_integer("num_classes", None, "Number of classes (presets and spec JSON only).", lower_bound=1)
flags.DEFINE_string("patches", None, "Patch grid: P (PxP), PxQ, or 'auto' (needs --sram_kb). Omit for per-layer.")
flags.DEFINE_integer("patch_blocks", None, "Patch stage = the first N blocks (the stem conv is block 0).",
                     lower_bound=1)
flags.DEFINE_integer("patch_ops", None, "Patch stage = the first K ops (alternative to --patch_blocks).",
                     lower_bound=1)
flags.DEFINE_float("sram_kb", None, "SRAM budget in kB (1 kB = 1024 B): drawn in the plot; required for auto.",
                   lower_bound=0)
flags.DEFINE_float("max_mac_overhead", None, "Auto mode: largest allowed MAC overhead (0.2 = +20%).",
                   lower_bound=0)
flags.DEFINE_list("patch_options", ["1", "2", "3", "4"], "Auto mode: patch counts p to try (p=1: per-layer).")
flags.DEFINE_bool("count_input", True, "Auto mode: count the input image against the budget.")
flags.DEFINE_enum("stage_unit", "blocks", ["blocks", "ops"], "Auto mode: enumerate stages by blocks or by ops.")
flags.DEFINE_enum("mac_metric", "exact", ["exact", "padded"], "Auto mode: which MAC count to minimise.")
flags.DEFINE_string("json_out", None, "Write the JSON report here.")
flags.DEFINE_string("plot_out", None, "Write the PNG memory plot here.")
flags.DEFINE_bool("quiet", False, "Do not print the table.")
flags.mark_flag_as_required("model")


def main(argv: Sequence[str]) -> None:
    from tfmcu import models, report, scheduler

    if FLAGS.patch_blocks is not None and FLAGS.patch_ops is not None:
        raise _cli.UsageError("give --patch_blocks or --patch_ops, not both")
    auto_mode = FLAGS.patches is not None and FLAGS.patches.lower() == "auto"
    if auto_mode and FLAGS.sram_kb is None:
        raise _cli.UsageError("--patches=auto needs --sram_kb")
    grid = None
    if FLAGS.patches is not None and not auto_mode:
        grid = _cli.parse_patches(FLAGS.patches)
        if FLAGS.patch_blocks is None and FLAGS.patch_ops is None:
            raise _cli.UsageError("--patches needs --patch_blocks or --patch_ops (or use --patches=auto)")
    try:
        options = [int(p) for p in FLAGS.patch_options]
    except ValueError:
        raise _cli.UsageError(f"--patch_options={','.join(FLAGS.patch_options)}: expected integers") from None

    loaded = models.load_model(FLAGS.model, FLAGS.resolution, FLAGS.width, FLAGS.num_classes)
    graph = loaded.graph
    sram = int(FLAGS.sram_kb * 1024) if FLAGS.sram_kb is not None else None
    schedule = auto = None
    if auto_mode:
        auto = scheduler.auto(graph, sram, FLAGS.max_mac_overhead, options, FLAGS.count_input,
                              FLAGS.stage_unit, FLAGS.mac_metric)
        if not auto.feasible:
            raise _cli.UsageError(f"{FLAGS.model}: {auto.message}")
        schedule = auto.best.schedule
    elif grid is not None and grid != (1, 1):
        schedule = scheduler.plan(graph, grid, n_blocks=FLAGS.patch_blocks, n_ops=FLAGS.patch_ops)
    data = report.profile_report(graph, schedule, auto, sram)
    png = report.plot_memory(data, sram) if FLAGS.plot_out else None
    report.write_outputs({FLAGS.json_out: data, FLAGS.plot_out: png})
    if not FLAGS.quiet:
        print(report.format_table(data), end="")


if __name__ == "__main__":
    _cli.run(main)
