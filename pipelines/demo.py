"""`make demo`: the whole toolchain end to end on real data, in about 13 minutes on 2 CPU cores (library:
``tfmcu.flows.demo``): the paper's example, profile, a budget check before training, train + QAT + int8 export on
Fashion-MNIST, rewrite under an SRAM budget the per-layer model does not fit, verify, summary table.

    python -m pipelines.demo [--out_dir=out/demo] [--budget_fraction=0.6 | --sram_kb=N] [training flags]

Training flags override the demo's short run (``tfmcu.flows.demo.demo_training``: 20,000 images, 2 epochs + 1 QAT
epoch of 60 steps).
"""

from __future__ import annotations

from typing import Sequence

from absl import flags, logging

from pipelines import _cli
from tfmcu.firmware.targets import TARGETS
from tfmcu.flows import demo

FLAGS = flags.FLAGS
_DEFAULTS = demo.DemoOptions()  # the flags' defaults
_cli.define_training_flags()
_cli.define_out_dir(_DEFAULTS.out_dir)
_cli.define_budget_flag()
flags.DEFINE_float("budget_fraction", _DEFAULTS.budget_fraction,
                   "SRAM budget = this fraction of the per-layer model's TFLM arena (--sram_kb overrides it).",
                   lower_bound=0.05, upper_bound=0.99)
flags.DEFINE_integer("verify_random", _DEFAULTS.verify_random, "Random inputs for the bit-exactness check.",
                     lower_bound=0)
flags.DEFINE_integer("verify_real", _DEFAULTS.verify_real, "Real test images for the bit-exactness check.",
                     lower_bound=0)
flags.DEFINE_enum("mcu", _DEFAULTS.mcu or "none", [*TARGETS, "none"],
                  "Step 6: deploy per layer and in custom mode to this target and run both under QEMU; none skips it.")
flags.DEFINE_integer("mcu_images", _DEFAULTS.mcu_images, "Step 6: real test images classified on the target.",
                     lower_bound=1, upper_bound=16)

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> int:
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter (saver, converter) through absl
    training = _cli.training_config(demo.demo_training())
    return demo.run(demo.DemoOptions(out_dir=FLAGS.out_dir, training=training,
                                     budget_fraction=FLAGS.budget_fraction, sram_kb=FLAGS.sram_kb,
                                     verify_random=FLAGS.verify_random, verify_real=FLAGS.verify_real,
                                     mcu=None if FLAGS.mcu == "none" else FLAGS.mcu, mcu_images=FLAGS.mcu_images))


if __name__ == "__main__":
    _cli.run(main)
