r"""Validate a deployed model on a board: its firmware's report read from a serial port and checked against the
deploy folder's expect.json (library: ``tfmcu.flows.validate``).

    python -m pipelines.deploy --tflite=m.tflite --target=nucleo-f446re --console=uart --out_dir=out/fw --run
    # flash out/fw/firmware.elf (deploy prints the board's commands), then, the board's USB serial:
    python -m pipelines.validate --port=/dev/ttyACM0 --expect=out/fw/expect.json [--baud=115200] [--timeout=120]

Reads lines until the firmware's last one (reset the board if it already ran) and checks that its outputs equal TF
Lite's (the hash and top class in expect.json), that it reports success, and its measured arena against the
prediction; prints the arena, the stack high-water mark and the ticks of each Invoke. The firmware must be built
with --console=uart. QEMU's UART on a pseudo-terminal takes the same path (``-serial pty``).

Exit status: 0 every check holds, 1 one does not (outputs differ, the firmware failed, no report before the
timeout), 2 bad input (no such expect.json or not one, a port that cannot be opened): one line on stderr.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.flows import validate

FLAGS = flags.FLAGS
_D = validate.ValidateOptions(port="", expect="")  # the flags' defaults
flags.DEFINE_string("port", None, "The serial port the board reports on (/dev/ttyACM0, COM3, a pseudo-terminal).")
flags.DEFINE_string("expect", None, "The deploy folder's expect.json.")
flags.DEFINE_integer("baud", _D.baud, "The port's baud rate (the firmware's UART: 115200).", lower_bound=1)
flags.DEFINE_float("timeout", _D.timeout_s, "Seconds to wait for the firmware's last line.", lower_bound=0.1)
_cli.define_output_flags()
flags.mark_flag_as_required("port")
flags.mark_flag_as_required("expect")

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help


def main(argv: Sequence[str]) -> int:
    rep = validate.validate(validate.ValidateOptions(port=FLAGS.port, expect=FLAGS.expect, baud=FLAGS.baud,
                                                     timeout_s=FLAGS.timeout, json_out=FLAGS.json_out))
    return 0 if rep.passed else 1


if __name__ == "__main__":
    _cli.run(main)
