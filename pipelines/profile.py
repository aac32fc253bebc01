r"""Analytic memory / MACs profile of a model, per layer and patch by patch (library: ``tfmcu.flows.profile``).

    python -m pipelines.profile --model=mbv2 --resolution=224 --width=1.0 --patches=4 --patch_blocks=5 \
        --json_out=r.json --plot_out=r.png
    python -m pipelines.profile --model=mbv2 --resolution=224 --patches=4 --patch_blocks=5 --accounting=paper
    python -m pipelines.profile --model=model.tflite --patches=auto --sram_kb=256

--model is a preset name, a spec JSON file, a .tflite file or a Keras model file (.keras / .h5).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.flows import profile
from tfmcu.plan.profiler import ACCOUNTINGS

FLAGS = flags.FLAGS
_D = profile.ProfileOptions(model="")  # the flags' defaults
_cli.define_model_flags(default=None)  # the model must be given
flags.DEFINE_integer("num_classes", None, "Number of classes (presets and spec JSON only).", lower_bound=1)
_cli.define_schedule_flags()
_cli.define_output_flags(plot=True, quiet=True)
flags.DEFINE_enum("accounting", _D.schedule.search.accounting, list(ACCOUNTINGS),
                  "Analytic memory: 'separate' (every tensor its own buffer), 'paper' (depthwise in place, as the "
                  "MCUNetV2 paper and TinyEngine count), 'tflm_inplace' (the in-place overlaps TFLM's reference "
                  "kernels allow, as rewrite --inplace plans them).")

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> None:
    request = _cli.schedule_request()
    request = dataclasses.replace(request, search=dataclasses.replace(request.search, accounting=FLAGS.accounting))
    profile.run(profile.ProfileOptions(model=FLAGS.model, resolution=FLAGS.resolution, width=FLAGS.width,
                                       num_classes=FLAGS.num_classes, schedule=request, json_out=FLAGS.json_out,
                                       plot_out=FLAGS.plot_out, quiet=FLAGS.quiet))


if __name__ == "__main__":
    _cli.run(main)
