"""`make demo`: the main job end to end on the bundled default (MobileNetV2 at 224).

Profiles MobileNetV2-224 layer by layer, then patch by patch (4x4 patches over the first 5 blocks, the paper's
choice), then lets auto mode pick the least-MACs schedule under an SRAM budget; writes JSON reports and the memory
plot under --out_dir (default out/demo).
"""

from __future__ import annotations

import os
from typing import Sequence

from pipelines import _cli
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "out/demo", "Where the reports and plots go.")
flags.DEFINE_string("model", "mbv2", "Preset or spec JSON to profile.")
flags.DEFINE_integer("resolution", 224, "Input resolution.", lower_bound=16)
flags.DEFINE_float("sram_kb", 320, "SRAM budget for auto mode (kB).", lower_bound=1)


def main(argv: Sequence[str]) -> None:
    from tfmcu import ir, models, report, scheduler

    spec = models.load_spec(FLAGS.model, resolution=FLAGS.resolution)
    graph = ir.from_spec(spec)
    sram = int(FLAGS.sram_kb * 1024)
    os.makedirs(FLAGS.out_dir, exist_ok=True)

    print(f"== 1/3 {spec.name} @ {spec.resolution}: per-layer profile ==")
    per_layer = report.profile_report(graph, sram_bytes=sram)
    print(report.format_table(per_layer))

    print("== 2/3 patch-based: 4x4 patches over the first 5 blocks ==")
    fixed = scheduler.plan(graph, 4, n_blocks=5)
    patched = report.profile_report(graph, fixed, sram_bytes=sram)
    print(report.format_table(patched).split("\n\nblock", 1)[1].join(["block", ""]))

    print(f"== 3/3 auto mode under {FLAGS.sram_kb:.0f} kB ==")
    auto = scheduler.auto(graph, sram)
    print(auto.message)
    outputs = {
        os.path.join(FLAGS.out_dir, "profile_per_layer.json"): per_layer,
        os.path.join(FLAGS.out_dir, "profile_patched.json"): patched,
        os.path.join(FLAGS.out_dir, "memory.png"): report.plot_memory(patched, sram),
    }
    if auto.feasible and auto.best.schedule is not None:
        chosen = report.profile_report(graph, auto.best.schedule, auto, sram)
        outputs[os.path.join(FLAGS.out_dir, "profile_auto.json")] = chosen
        outputs[os.path.join(FLAGS.out_dir, "memory_auto.png")] = report.plot_memory(chosen, sram)
    report.write_outputs(outputs)
    print("\nwrote: " + ", ".join(sorted(outputs)))


if __name__ == "__main__":
    _cli.run(main)
