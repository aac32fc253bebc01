r"""Deploy a .tflite (builtin ops, or custom mode with TFMCU_PATCH_STAGE) as TFLM firmware for a microcontroller
(library: ``tfmcu.flows.deploy``).

    python -m pipelines.deploy --tflite=patched.tflite --target=stm32f405|cortex-m4|cortex-m7 --out_dir=fw/ \
        [--run] [--inputs=x.npy | --num_inputs=2 --seed=0] [--margin=0.02] [--stack_kib=6]

Writes a self-contained firmware folder (model/: the model library, tfmcu_model.h over TFLM with the model and its op
resolver; main.cc + test_inputs.cc: the test firmware over it; example_frame.c for the example application; a
Bazel BUILD + WORKSPACE; expect.json; deploy.json). --run builds it with this checkout's Bazel toolchain, runs it on
the target's QEMU board, and prints the measured figures and a "fits / does not fit <target>" verdict. Any model
`rewrite` writes: several TFMCU_PATCH_STAGE ops (--rest_convs=tfmcu), a streamed input (--stream_input: --inputs
are the images, fed row by row from Flash), an in-place plan (--inplace) with the --kernels it was planned for. A
model beyond the target's Flash goes to the board's external memory (MPS2: PSRAM), noted in deploy.json.

The firmware's outputs must equal TF Lite's, but TFLM's on this host on an input where the two differ by a rounding
tie in the model's FULLY_CONNECTED head, proven on the model (the firmware runs TFLM): one line says so, and
deploy.json's "reference" lists those inputs.

Exit status: 0 written (and with --run: fits, outputs as expected), 1 does not fit the target (--run), 2 bad input
(missing file, not a TFLite model, an op the firmware cannot register, a malformed custom-mode model, an in-place
plan for other --kernels, TFLM on this host differing from TF Lite other than by a rounding tie): one line on stderr
and no output folder.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.flows import deploy

FLAGS = flags.FLAGS
_D = deploy.DeployOptions(tflite="")  # the flags' defaults
_cli.define_tflite_flag()
_cli.define_out_dir(_D.out_dir)  # replaced if it exists
_cli.define_firmware_flags()  # --target, --run, --inputs, --num_inputs, --margin, --stack_kib, --kernels
_cli.define_seed_flag()
_cli.define_tree_flag()
flags.mark_flag_as_required("tflite")

flags.adopt_module_key_flags(_cli)


def main(argv: Sequence[str]) -> int:
    rep = deploy.deploy(_cli.firmware_options(FLAGS.tflite, FLAGS.out_dir, FLAGS.seed))
    return 1 if rep.fits is False else 0


if __name__ == "__main__":
    _cli.run(main)
