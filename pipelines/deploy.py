r"""Deploy a .tflite (builtin ops, or custom mode with TFMCU_PATCH_STAGE) as TFLM firmware for a microcontroller
(library: ``tfmcu.flows.deploy``).

    python -m pipelines.deploy --tflite=patched.tflite --target=stm32f405|cortex-m4|cortex-m7 --out_dir=fw/ \
        [--run] [--inputs=x.npy | --num_inputs=2 --seed=0] [--margin=0.02] [--stack_kib=6]

Writes a self-contained firmware folder (model_data.cc with the model, its op resolver and test inputs; main.cc; a
Bazel BUILD + WORKSPACE; expect.json; deploy.json). --run builds it with this checkout's Bazel toolchain, runs it on
the target's QEMU board, and prints the measured figures and a "fits / does not fit <target>" verdict.

Exit status: 0 written (and with --run: fits, outputs equal TF Lite's), 1 does not fit the target (--run), 2 bad
input (missing file, not a TFLite model, an op the firmware cannot register, a malformed custom-mode model): one line
on stderr and no output folder.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.firmware.targets import TARGETS
from tfmcu.flows import deploy

FLAGS = flags.FLAGS
_cli.define_tflite_flag()
flags.DEFINE_enum("target", "stm32f405", list(TARGETS), "The microcontroller (and its QEMU board).")
flags.DEFINE_string("out_dir", "out/deploy", "The firmware folder to write (replaced if it exists).")
flags.DEFINE_bool("run", False, "Build the firmware with Bazel and run it under QEMU: figures and a verdict.")
_cli.define_inputs_flag()  # at most 16 are used
flags.DEFINE_integer("num_inputs", 2, "Seeded random test inputs when --inputs is not given.", lower_bound=1,
                     upper_bound=16)
_cli.define_seed_flag()
flags.DEFINE_float("margin", 0.02, "Arena = predicted TFLM arena x (1 + margin).", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_enum("kernels", "cmsis_nn", ["cmsis_nn", "reference"],
                  "TFLM's kernels (and the patch executor's backend): CMSIS-NN (the default on these Arm targets) or "
                  "the reference / portable C ones. A model rewritten with --inplace needs reference.")
flags.DEFINE_integer("stack_kib", 6, "Stack reserved for the firmware (KiB).", lower_bound=2, upper_bound=64)
flags.mark_flag_as_required("tflite")

flags.adopt_module_key_flags(_cli)


def main(argv: Sequence[str]) -> int:
    rep = deploy.deploy(deploy.DeployOptions(tflite=FLAGS.tflite, target=FLAGS.target, out_dir=FLAGS.out_dir,
                                             run=FLAGS.run, inputs=FLAGS.inputs, num_inputs=FLAGS.num_inputs,
                                             seed=FLAGS.seed, margin=FLAGS.margin, stack_kib=FLAGS.stack_kib,
                                             kernels=FLAGS.kernels))
    return 0 if rep.get("fits", True) else 1


if __name__ == "__main__":
    _cli.run(main)
