"""Generates the data of a whole-model TFLM firmware (tflm_patch_kernels/tflm/firmware_main.cc): a zoo model, as is or
rewritten in custom mode (one TFMCU_PATCH_STAGE op), as a C++ array in Flash with its op resolver and test inputs
(tfmcu/firmware/sources.py, as `deploy` writes them), and what the host expects: TF Lite's output bytes (their
FNV-1a hash) and top classes, TFLM's on an input where the two round the model's FULLY_CONNECTED head apart (a
rounding tie proven on the model: tfmcu.runtime.agreement), and the predicted TFLM arena.

usage: gen_model_whole.py --model NAME [--tflite FILE] --out-cc OUT.cc --out-expect OUT.json
                          [--patches P [--blocks N] [--inplace] [--stream] [--halo MODE] [--rest-convs]]
                          [--seed 0] [--images fashion_mnist:N]
                          [--expect-no-fit] [--kernel-libs conv,depthwise_conv,...]

- --tflite: the zoo model's .tflite as tools/gen/gen_zoo_model.py converted it (the Bazel build converts each zoo
  model once for every generator); without it the model is converted here.
- Without --patches the model runs unpatched (the per-layer baseline); with it, custom mode with a P x P grid over
  the first N blocks (default: the zoo entry's stage), the rest planned in place with --inplace (with the overlaps
  the --kernels allow: tfmcu.plan.memory_plan, recorded as memory_plan_kernels); --stream: the stage
  streams its input (the firmware feeds the image rows from Flash through a TfmcuInputProvider; no image in the
  arena); --halo all|auto|smallest: halo caches (tfmcu.plan.halo.select; auto: at the recompute schedule's analytic
  peak; smallest: the smallest stage within +5% whole-model MACs);
  --rest-convs: the convolutions after the stage run by our kernels with their multipliers in Flash
  (tfmcu.stage.custom.convs_to_flash, decided for Cortex-M).
- Inputs: one seeded random input, or with --images the first N real test images of a dataset (tfmcu.data),
  resized to the model's input and quantized with its input scale.
- The JSON holds {"expect": {"output_fnv1a32": ..., "top_class": [...]}} for tools/qemu/run_firmware.py --expect
  and "expect_within": the firmware's arena_used_bytes equal to the predicted arena for Cortex-M
  (tfmcu.plan.arena, build "cortex-m", or with --kernels cmsis_nn "cortex-m-cmsis-nn", "cortex-m-cmsis-nn-mve" with
  --core cortex-m55: mcu_build). --expect-no-fit: the firmware must fail at AllocateTensors instead
  ({"expect": {"allocated": 0}, "expect_failure": "AllocateTensors failed"}).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_common import ROOT  # noqa: E402,F401  (sets the environment and sys.path)


def real_images(spec, model):
    """(N, H, W, C) int8 inputs: the first N test images of dataset NAME (spec "NAME:N")."""
    from tfmcu.data import load
    from tfmcu.data.classify import as_arrays
    from tfmcu.runtime.model_io import model_info
    from tfmcu.train.export import quantize_inputs

    name, n = spec.split(":")
    shape = model_info(model).inputs[0].shape
    ds = load(name)
    x, _ = as_arrays(ds.test, shape[1], shape[3], limit=int(n))
    return quantize_inputs(model, x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a tfmcu.nets.zoo model name")
    ap.add_argument("--tflite", help="the zoo model's .tflite, converted already (gen_zoo_model.py)")
    ap.add_argument("--out-cc", required=True)
    ap.add_argument("--out-expect", required=True)
    ap.add_argument("--patches", type=int, help="custom mode with a P x P grid (default: the unpatched model)")
    ap.add_argument("--blocks", type=int, help="patch stage = the first N blocks (default: the zoo entry's)")
    ap.add_argument("--inplace", action="store_true", help="plan the rest of the graph in place")
    ap.add_argument("--stream", action="store_true", help="custom mode: the stage streams its input from Flash")
    ap.add_argument("--halo", choices=("none", "all", "auto", "smallest"), default="none",
                    help="custom mode: halo caches (smallest: the smallest stage within +5%% MACs)")
    ap.add_argument("--rest-convs", action="store_true",
                    help="custom mode: the rest's convolutions run by our kernels (multipliers in Flash)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the test input")
    ap.add_argument("--images", help="NAME:N: the first N real test images of dataset NAME (e.g. fashion_mnist:4)")
    ap.add_argument("--expect-no-fit", action="store_true", help="the firmware must fail at AllocateTensors")
    ap.add_argument("--stage-of", type=int, metavar="P",
                    help="unpatched model: measure the ops a P x P schedule (over --blocks) would patch as a cost "
                         "region \"stage\" (the per-layer side of a stage comparison)")
    ap.add_argument("--reference", choices=("tflite", "tflm"), default="tflite",
                    help="whose outputs the firmware must reproduce: TF Lite's reference kernels (the tflite-micro "
                         "wheel's on an input where the two round the FULLY_CONNECTED head apart, a proven tie), or "
                         "(for a model on which TFLM itself differs from TF Lite) the wheel's; both are recorded")
    ap.add_argument("--kernels", choices=("reference", "cmsis_nn"), default="reference",
                    help="the kernels the firmware links (TFLM's and the patch executor's backend)")
    ap.add_argument("--core", help="the core the firmware runs on, where its CMSIS-NN build differs (cortex-m55: "
                                   "CMSIS-NN's Helium buffers); default: a core without Helium")
    ap.add_argument("--kernel-libs", help="the TFLM kernel libraries the firmware links (names of "
                                         "third_party/tflite_micro.BUILD's TFLM_KERNELS, comma-separated): checked "
                                         "against the model's ops")
    a = ap.parse_args(argv)
    if a.rest_convs and a.kernels == "cmsis_nn":
        ap.error("--rest-convs is for the reference build (the predictor models one stage's CMSIS-NN buffer)")

    from tfmcu.firmware.sources import expectation, model_source
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.nets import zoo
    from tfmcu.plan.arena import mcu_build, predict_arena
    from tfmcu.plan.memory_plan import with_offline_plan
    from tfmcu.plan import regions
    from tfmcu.runtime.model_io import random_inputs
    from tfmcu.runtime.tflite import run_tflite
    from tfmcu.stage.custom import load_custom, rewrite_custom

    entry = zoo.ZOO[a.model]
    if a.tflite:  # the zoo model converted once for every generator (tools/gen/gen_zoo_model.py)
        with open(a.tflite, "rb") as f:
            original = f.read()
    else:
        original = zoo.build(a.model, None)
    model = original
    what = "unpatched"
    stage_ops = 0  # the leading ops measured as the cost region "stage" (firmware_main.cc)
    schedule = None
    if a.patches or a.stage_of:
        graph = from_tflite(original, name=a.model)
        blocks = a.blocks if a.blocks is not None else entry.patch_blocks
        ops = None if blocks is not None else entry.patch_ops
        s = schedule = regions.schedule(graph, a.patches or a.stage_of, n_blocks=blocks, n_ops=ops)
        src = {graph.ops[k].src_index for k in s.stage}
        stage_ops = len(src) if src == set(range(len(src))) else 0
    if a.patches:
        from tfmcu.plan.halo import HaloOptions, select
        from tfmcu.stage.custom import convs_to_flash
        caches = select(s, HaloOptions(mode=a.halo), None, "streamed" if a.stream else "counted")
        model = rewrite_custom(original, graph, s, a.model, inplace=a.inplace, streamed_input=a.stream,
                               halo=caches, kernels=a.kernels).model
        if a.kernels == "cmsis_nn":
            # The offline plan (in place: with the overlaps CMSIS-NN's kernels allow) around the CMSIS-NN build's
            # scratch buffers, the stage's kernel buffer included (tfmcu.plan.memory_plan).
            model = with_offline_plan(model, inplace=a.inplace, kernels="cmsis_nn",
                                      stages={0: load_custom(model).packed})[0]
        if a.rest_convs:
            model = convs_to_flash(model, a.model, inplace=a.inplace).model
        stage_ops = 1  # the TFMCU_PATCH_STAGE op comes first
        what = "custom mode, %dx%d patches over %s, rest %s" % (
            a.patches, a.patches, "%d blocks" % blocks if blocks is not None else "%d ops" % ops,
            "in place" if a.inplace else "disjoint") + (", streamed input" if a.stream else "") + (
            ", halo caches %s" % a.halo if a.halo != "none" else "") + (
            ", the rest's convolutions by our kernels" if a.rest_convs else "")
    if a.images:
        xs = real_images(a.images, original)
        inputs = "the first %d %s test images" % (len(xs), a.images.split(":")[0])
    else:
        xs = random_inputs(original, 1, seed=a.seed)[0][0]
        inputs = "input seed %d" % a.seed
    samples = [(x[None],) for x in xs]
    tfl = run_tflite(original, samples)
    refs = [o[0] for o in tfl]
    reference = {"by": "TF Lite reference kernels"}
    if a.reference == "tflite":
        # TF Lite's outputs, but the tflite-micro wheel's on an input where the two round the original's
        # FULLY_CONNECTED head apart, a tie proven on the model: the firmware runs TFLM (as deploy's expectation)
        from tfmcu.runtime.agreement import expected, head_ties
        from tfmcu.runtime.tflm import run_tflm
        tflm = run_tflm(original, samples)
        ties = head_ties(original, samples, tfl, tflm)
        if ties:
            refs = [o[0] for o in expected(tfl, tflm, ties)]
            reference = {"by": "TF Lite reference kernels; the tflite-micro wheel on rounding ties in the "
                               "FULLY_CONNECTED head", "tflm_inputs": sorted(ties)}
    if a.reference == "tflm":
        from tfmcu.runtime.tflm import run_tflm
        tflm_refs = [o[0] for o in run_tflm(original, samples)]
        differ = int(sum(int((r != t).sum()) for r, t in zip(refs, tflm_refs)))
        reference = {"by": "tflite-micro wheel (TFLM per layer)", "tflite_bytes_differing_from_tflm": differ,
                     "tflite": expectation(refs)}
        refs = tflm_refs
    build = mcu_build(a.kernels, a.core)
    stage = load_custom(model).packed if a.patches and a.kernels == "cmsis_nn" else None
    pred = predict_arena(from_tflite(model), model=model, build=build, stage=stage)
    if pred.details["unmodelled_ops"]:
        raise SystemExit("gen_model_whole: the predictor does not model %s" % pred.details["unmodelled_ops"])
    if a.kernel_libs is not None:
        from tfmcu.firmware.sources import kernel_libraries, resolver_ops
        need = {lib.split(":kernel_", 1)[1].removesuffix("_cmsis_nn") for lib in kernel_libraries(resolver_ops(model))}
        missing = sorted(need - set(a.kernel_libs.split(",")))
        if missing:
            raise SystemExit("gen_model_whole: %s needs the TFLM kernel libraries %s: add them to MODEL_KERNELS "
                             "(tflm_patch_kernels/firmware/firmware.bzl)" % (a.model, ", ".join(missing)))
    src = model_source(model, xs, refs[0].nbytes, "model %s (%s); %s." % (a.model, what, inputs))
    with open(a.out_cc, "w") as f:
        f.write(src)
        f.write('\n// The leading ops firmware_main.cc measures as the cost region "stage" (0: none).\n'
                'extern "C" const unsigned int g_tfmcu_stage_ops = %du;\n' % stage_ops)
        if a.stream:  # the images' rows come from Flash through the kernel's input provider (firmware_main.cc)
            f.write('extern "C" const unsigned int g_tfmcu_stream_rows = %du;\n' % xs.shape[1])
    # The predictor for Cortex-M (32-bit structs, plain MicroAllocator; "cortex-m-cmsis-nn": TFLM's CMSIS-NN kernels
    # and the patch executor's CMSIS-NN backend) must give the firmware's arena exactly.
    want = expectation(refs)
    if a.stream:  # every image row read once per input
        want["streamed_rows_read"] = [int(xs.shape[1])] * min(len(xs), 16)
    expect = {"expect": want, "expect_within": {"arena_used_bytes": [pred.total, 0.0]}}
    if a.expect_no_fit:
        expect = {"expect": {"allocated": 0}, "expect_failure": "AllocateTensors failed"}
    expect["host"] = {"model": a.model, "what": what, "inputs": inputs, "model_bytes": len(model),
                      "predicted_arena_bytes_cortex_m": pred.total, "top_class": want["top_class"],
                      "kernels": a.kernels, "stage_ops": stage_ops, "reference": reference}
    if schedule is not None:
        expect["host"].update(grid=list(schedule.grid), stage_macs=schedule.stage_macs,
                              stage_macs_patched_exact=schedule.stage_macs_patched_exact, macs=schedule.macs,
                              macs_patched_exact=schedule.macs_patched_exact)
        # what the firmware executes: the unpatched model's MACs, the recompute schedule's, or with the halo caches'
        executed = schedule.macs
        if a.patches:
            executed = (schedule.macs_patched_exact if caches is None
                        else schedule.macs - schedule.stage_macs + caches.stage_macs_exact)
        expect["host"]["macs_executed"] = int(executed)
    with open(a.out_expect, "w") as f:
        json.dump(expect, f, indent=1)


if __name__ == "__main__":
    main()
