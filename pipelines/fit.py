r"""Fit a model to a microcontroller: the fastest (or smallest) configuration whose TFLM arena fits, verified bit-exact
and written as firmware (library: ``tfmcu.flows.fit``).

    python -m pipelines.fit --tflite=model.tflite --target=stm32f405 --out_dir=fw/ [--run]
    python -m pipelines.fit --tflite=model.tflite --target=cortex-m7 --objective=memory --max_latency=1.05
    python -m pipelines.fit --model=model.keras|spec.json|mbv2 --target=cortex-m4 --stream_input
    python -m pipelines.fit --model=model.h5 --calibration_data=images/ --target=stm32f405

The budget is the target's RAM less the stack and static data (and deploy's arena margin); the kernels are the
target's (--kernels, CMSIS-NN by default). One joint search prices every candidate (patch grid x stage x halo caches
x the rest's convolutions in Flash, the rest in place for those kernels, the input streamed with --stream_input) by
its predicted TFLM arena and its predicted instructions on the target's core. --objective=latency (default): the
fewest instructions that fit; memory: the smallest arena within --max_latency x TFLM + the same kernels per layer.
The chosen model is verified bit-exact (TF Lite and TFLM) and written with its firmware folder; --run builds and runs
it under QEMU and prints the measured arena, instructions and verdict. out_dir: model.tflite, fit.json, fit.png
(every candidate: predicted arena against predicted instructions), firmware/.

--stream_input only when your firmware provides the image rows (a camera or decoder through the TfmcuInputProvider:
docs/firmware.md); the arena then holds no image.

Exit status: 0 written (with --run: it fits, and where it runs the outputs equal TF Lite's, TFLM's on this host at a
rounding tie in the FULLY_CONNECTED head), 1 does not fit (--run measured), 2 bad input or no configuration fits (one
line naming the smallest achievable arena and what it holds).
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.errors import UsageError
from tfmcu.flows import fit

FLAGS = flags.FLAGS
_D = fit.FitOptions(model="")  # the flags' defaults
_cli.define_tflite_flag()
_cli.define_model_flags(default=None)  # the model must be given: --tflite or --model
_cli.define_firmware_flags()
_cli.define_stream_input_flag()
_cli.define_out_dir(_D.out_dir)
_cli.define_seed_flag()
_cli.define_tree_flag()
_cli.define_objective_flag(_D.objective, fit.FIT_OBJECTIVES)  # latency: the fastest that fits; memory: the smallest
flags.DEFINE_float("max_latency", _D.max_latency,
                   "--objective=memory: predicted instructions at most this factor of TFLM + the same kernels per "
                   "layer (1.05: at most 5% slower).", lower_bound=1.0)
_cli.define_grids_flag(_D.patch_options, "Patches per side to try, each up to a stage output's side (square grids, "
                                         "and row bands in plans of several stages; 1: none).")
_cli.define_max_stages_flag(_D.max_stages)
flags.DEFINE_boolean("se_passes", _D.se_passes,
                     "Squeeze-excites inside patch stages: the stage sweeps its grid once per squeeze-excite to sum "
                     "its statistic, then again (the recompute is priced); --nose_passes: stages end at them.")
_cli.define_max_mac_overhead_flag(_D.max_mac_overhead)
_cli.define_search_seconds_flag(_D.search_seconds)
_cli.define_search_workers_flag(_D.search_workers)
flags.DEFINE_string("calibration_data", _D.calibration_data,
                    "--model=a Keras file: the int8 conversion's calibration inputs, a folder <root>/<class>/*.png|jpg "
                    "(resized and normalised as train does) or a .npy array [N, H, W, C] of float model inputs; "
                    "without it, seeded random inputs.")
flags.DEFINE_integer("verify_samples", _D.verify_samples, "Random inputs the chosen model is verified on.",
                     lower_bound=1)

flags.adopt_module_key_flags(_cli)


def main(argv: Sequence[str]) -> int:
    if FLAGS.tflite and FLAGS.model:
        raise UsageError("give --tflite or --model, not both")
    if not FLAGS.tflite and not FLAGS.model:
        raise UsageError("give the model: --tflite=model.tflite (or --model=a Keras file, spec JSON or preset)")
    if FLAGS.resolution is not None or FLAGS.width is not None:
        raise UsageError("--resolution and --width are not taken by fit: give the model as it is")
    o = fit.FitOptions(model=FLAGS.tflite or FLAGS.model, firmware=_cli.firmware_options(),
                       calibration_data=FLAGS.calibration_data, out_dir=FLAGS.out_dir, objective=FLAGS.objective,
                       max_latency=FLAGS.max_latency, stream_input=FLAGS.stream_input, seed=FLAGS.seed,
                       patch_options=_cli.grids(), max_mac_overhead=FLAGS.max_mac_overhead,
                       max_stages=FLAGS.max_stages, se_passes=FLAGS.se_passes, search_seconds=FLAGS.search_seconds,
                       search_workers=FLAGS.search_workers, verify_samples=FLAGS.verify_samples)
    rep = fit.run(o, progress=_cli.progress)
    measured = rep.measured
    if measured is None:
        return 0
    ran = measured.arena_used_bytes is not None  # a target no QEMU board has the core of is linked, not run
    return 1 if not measured.fits or (ran and not measured.outputs_equal_tflite) else 0


if __name__ == "__main__":
    _cli.run(main)
