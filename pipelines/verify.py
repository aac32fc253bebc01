r"""Verify a rewritten .tflite against its original: bit-exact outputs in TF Lite and TFLM, and TFLM's arena
(library: ``tfmcu.flows.verify``).

    python -m pipelines.verify --original=a.tflite --rewritten=b.tflite --samples=200 --json_out=v.json \
        [--inputs=x.npy] [--seed=0] [--resolver=reference|builtin]

The rewritten model may be any model `rewrite` writes: custom mode with one TFMCU_PATCH_STAGE op or several
(--rest_convs=tfmcu), or a stage that streams its input (--stream_input: the original's samples are its images, fed
row by row through a checked input provider; the report counts the rows read). The original must be a model stock
TFLM runs.

Exit status: 0 bit-exact, 1 any mismatch (the JSON is still written), 2 bad input (missing file, not a TFLite model,
the two models' input/output signatures differ, bad --inputs, a malformed custom-mode model, an interpreter crash):
one line on stderr and no output file.
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.flows import verify
from tfmcu.runtime.tflite import RESOLVERS

FLAGS = flags.FLAGS
_D = verify.VerifyOptions(original="", rewritten="")  # the flags' defaults
flags.DEFINE_string("original", None, "The original .tflite model.")
flags.DEFINE_string("rewritten", None, "The rewritten .tflite model (same inputs and outputs).")
flags.DEFINE_integer("samples", _D.samples, "Random input samples to compare.", lower_bound=0)
_cli.define_seed_flag()
_cli.define_inputs_flag()
flags.DEFINE_enum("resolver", _D.resolver, list(RESOLVERS), "TF Lite kernels: reference or optimized.")
flags.DEFINE_integer("max_details", _D.max_details, "Mismatches listed in detail (per kind).", lower_bound=0)
_cli.define_output_flags(quiet=True)
flags.mark_flag_as_required("original")
flags.mark_flag_as_required("rewritten")

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> int:
    return verify.run(verify.VerifyOptions(original=FLAGS.original, rewritten=FLAGS.rewritten, samples=FLAGS.samples,
                                           seed=FLAGS.seed, inputs=FLAGS.inputs, resolver=FLAGS.resolver,
                                           json_out=FLAGS.json_out, max_details=FLAGS.max_details, quiet=FLAGS.quiet))


if __name__ == "__main__":
    _cli.run(main)
