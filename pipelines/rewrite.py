"""Rewrite any int8 .tflite so its patch stage runs patch by patch, bit-exact (library: ``tfmcu.flows.rewrite``).

    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=auto --sram_kb=256
    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=auto --objective=memory
    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=4 --patch_blocks=5
    python -m pipelines.rewrite --tflite=model.tflite --out=custom.tflite --mode=custom --patches=4 --patch_blocks=5
    python -m pipelines.rewrite --tflite=model.tflite --out=custom.tflite --mode=custom --patches=4 --patch_blocks=5 \
        --halo=auto
    python -m pipelines.rewrite --tflite=model.tflite --out=small.tflite --mode=custom --patches=9 --patch_blocks=5 \
        --halo=smallest --halo_max_mac_overhead=0.05 --stream_input --rest_convs=tfmcu --inplace

--mode=builtin unrolls the stage into per-patch TFLite builtin ops that stock TFLM runs; --mode=custom replaces it by
one TFMCU_PATCH_STAGE op run by tfmcu's C kernels (its TFLM kernel: tflm_patch_kernels/tflm). Auto mode searches the
schedules (least MACs whose predicted memory fits --sram_kb, or the smallest with --objective=memory); in custom mode
it searches as `fit` does unless --grids / --max_stages are given: grids 1-12, 16, 18, 24, 36, plans of any number of
stages, a worker per core (tfmcu.flows.rewrite.CUSTOM_AUTO_SEARCH). Then both
models' arenas are measured in TFLM (builtin mode: the tflite-micro wheel; custom mode: the whole model in TFLM built
from source with the kernel). A model that makes TFLM abort is a one-line error, not a crash.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.firmware.targets import TARGETS
from tfmcu.flows import rewrite
from tfmcu.plan.halo import DEFAULT_MAX_MAC_OVERHEAD, HALO_MODES, HaloOptions
from tfmcu.stage.cost import REST_CONVS, CustomOptions

FLAGS = flags.FLAGS
_DEFAULTS, _CUSTOM = rewrite.RewriteOptions(tflite="", out=""), CustomOptions()  # the flags' defaults
_cli.define_tflite_flag()
flags.DEFINE_string("out", None, "Output .tflite path.")
flags.DEFINE_enum("mode", _DEFAULTS.mode, list(rewrite.MODES),
                  "builtin: per-patch TFLite builtin ops; custom: one TFMCU_PATCH_STAGE op (tfmcu's C kernels).")
_cli.define_schedule_flags()
flags.DEFINE_enum("border", _DEFAULTS.border, list(rewrite.BORDER_CHOICES),
                  "Builtin mode, border padding of patches: PAD the patch buffer, or VALID + padded border strips for "
                  "strided ops whose input is the patch's largest buffer ('strips'); auto mode tries both.")
flags.DEFINE_bool("inplace", _CUSTOM.inplace,
                  "Custom mode: plan the rest of the graph in place (an op's output may overlap an input that dies "
                  "there, TinyEngine-style) where the kernels of --kernels read before they overwrite; the model "
                  "records them and deploy refuses it with other kernels; verify checks it bit-exact in TFLM.")
_cli.define_kernels_flag()
flags.DEFINE_enum("core", _CUSTOM.core, sorted({t.core for t in TARGETS.values()}),
                  "Custom mode with --inplace --kernels=cmsis_nn: the core the plan is for. CMSIS-NN's Helium code "
                  "(cortex-m55) reads in other orders than its DSP code (the other cores, and the default); deploy "
                  "refuses a plan made for the one on the other.")
flags.DEFINE_enum("halo", _CUSTOM.halo.mode, list(HALO_MODES),
                  "Custom mode: keep the halo between neighbouring patches in caches instead of recomputing it. "
                  "none: recompute (MCUNetV2); all: cache every intermediate tensor (each element computed once); "
                  "auto: the caches that fit --sram_kb (predicted TFLM arena), or without it the caches that keep the "
                  "arena's planned part (activations and scratch) within the recompute schedule's: fewer MACs for "
                  "the same activation memory (the cache tables add about 100 B of TFLM tensor records); smallest: "
                  "the caches that make the stage's memory smallest while the whole model computes at most "
                  "--halo_max_mac_overhead more MACs than the original (some halos recomputed, the costly caches "
                  "dropped).")
flags.DEFINE_float("halo_max_mac_overhead", _CUSTOM.halo.max_mac_overhead,
                   f"--halo=smallest: the whole model's MAC overhead allowed over the original (a fraction; not given: "
                   f"{DEFAULT_MAX_MAC_OVERHEAD:g}, i.e. +{100 * DEFAULT_MAX_MAC_OVERHEAD:g}%).")
_cli.define_stream_input_flag()
flags.DEFINE_enum("rest_convs", _CUSTOM.rest_convs, list(REST_CONVS),
                  "Custom mode: who runs the CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED ops after the patch stage. "
                  "tflm: TFLM's kernels (their per-channel multipliers in TFLM's persistent arena tail); tfmcu: our "
                  "kernels (a fully connected layer as a 1x1 convolution), each "
                  "as a one-layer TFMCU_PATCH_STAGE op with its multipliers computed offline into Flash (where that "
                  "makes the tail smaller).")
_cli.define_max_stages_flag()  # auto mode, custom mode
flags.DEFINE_bool("measure", _DEFAULTS.measure,
                  "Measure both models' arenas in the TFLM interpreter (auto mode needs it to "
                  "guarantee the rewritten arena is not larger, and to check --sram_kb).")
_cli.define_output_flags()
flags.mark_flag_as_required("tflite")
flags.mark_flag_as_required("out")

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> None:
    custom = CustomOptions(inplace=FLAGS.inplace, halo=HaloOptions(mode=FLAGS.halo,
                                                                   max_mac_overhead=FLAGS.halo_max_mac_overhead),
                           stream_input=FLAGS.stream_input, rest_convs=FLAGS.rest_convs, kernels=FLAGS.kernels,
                           core=FLAGS.core)
    schedule = _cli.schedule_request(max_stages=FLAGS.max_stages)
    if FLAGS.mode == "custom" and FLAGS.patches == "auto":  # fit's default search, unless the flags say otherwise
        given = {"patch_options": FLAGS["grids"].present, "max_stages": FLAGS["max_stages"].present}
        wide = {k: v for k, v in rewrite.CUSTOM_AUTO_SEARCH.items() if not given.get(k)}
        schedule = dataclasses.replace(schedule, search=dataclasses.replace(schedule.search, **wide))
    rewrite.run(rewrite.RewriteOptions(tflite=FLAGS.tflite, out=FLAGS.out, mode=FLAGS.mode,
                                       schedule=schedule,
                                       border=FLAGS.border, measure=FLAGS.measure,
                                       json_out=FLAGS.json_out, custom=custom),
                progress=_cli.progress)


if __name__ == "__main__":
    _cli.run(main)
