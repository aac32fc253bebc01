"""In-place plans for the CMSIS-NN build (``tfmcu.plan.memory_plan``, ``kernels="cmsis_nn"``).

The distances come from ``tfmcu.plan.cmsis_nn.processing_order`` (CMSIS-NN's DSP paths as TFLM's kernels/cmsis_nn and
the patch backend call them) through ``memory_plan.distance_from_order``. Here: that engine reproduces the reference
kernels' closed form on a real model; CMSIS-NN distances worked out by hand; a one-layer TFMCU_PATCH_STAGE op gets its
builtin's distance; the probe firmware's cases cover every kernel path (its QEMU tests on Cortex-M4 / M7,
//tflm_patch_kernels/firmware:inplace_probe_*, run them at D and closer); an offline plan made for the CMSIS-NN build
holds that build's scratch, so a streamed model's predicted arena is not above its unstreamed version's.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.graph import from_tflite as lower_tflite  # noqa: E402
from tfmcu.graph import ir  # noqa: E402
from tfmcu.plan import cmsis_nn  # noqa: E402
from tfmcu.plan import memory_plan  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.plan.arena import builtin_of, predict_arena  # noqa: E402
from tfmcu.stage import custom as custom_stage  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def mbv2(zoo_models):
    data = zoo_models("mbv2_035_96")
    return data, lower_tflite.from_tflite(data, name="mbv2_035_96")


def _graph(kind: str, in_shape, out_c: int, kernel=(1, 1), stride=(1, 1), padding=(0, 0, 0, 0)):
    builtin, typ = {"conv": ("CONV_2D", ir.CONV), "dw": ("DEPTHWISE_CONV_2D", ir.DEPTHWISE),
                    "add": ("ADD", ir.ADD)}[kind]
    h, w, c = in_shape
    ho = ir.window_out_size(h, kernel[0], stride[0], 1, padding[0], padding[1])
    wo = ir.window_out_size(w, kernel[1], stride[1], 1, padding[2], padding[3])
    t = {"x": ir.Tensor("x", (1, h, w, c)), "x2": ir.Tensor("x2", (1, h, w, c)),
         "y": ir.Tensor("y", (1, ho, wo, out_c))}
    inputs = ["x", "x2"] if kind == "add" else ["x"]
    op = ir.Op("op", typ, inputs, ["y"], kernel=kernel, stride=stride, padding=padding, in_channels=c,
               out_channels=out_c, groups=c if kind == "dw" else 1, attrs={"tflite_op": builtin})
    return ir.Graph("g", t, [op], inputs, ["y"]), op


def test_dispatch_is_cmsis_nn_wrappers():
    """The dispatch the buffer sizes and the processing orders share (arm_*_wrapper_s8 on a DSP core, no MVE)."""
    assert cmsis_nn.conv_path(1, 1, (0, 0)) == "1x1_fast"
    assert cmsis_nn.conv_path(1, 1, (0, 0), stride=(2, 2)) == "1x1"
    assert cmsis_nn.conv_path(3, 3, (1, 1)) == cmsis_nn.conv_path(1, 1, (1, 0)) == "im2col"
    assert cmsis_nn.depthwise_path(3, 3, 8, 8, (1, 1)) == "3x3"
    assert cmsis_nn.depthwise_path(3, 3, 8, 8, (2, 0)) == cmsis_nn.depthwise_path(5, 5, 8, 8, (2, 2)) == "opt"
    assert cmsis_nn.depthwise_path(3, 3, 4, 8, (1, 1)) == "generic"
    assert cmsis_nn.conv_buffer_bytes(1, 1, 16, (0, 0)) == 0 < cmsis_nn.conv_buffer_bytes(3, 3, 16, (1, 1))
    assert cmsis_nn.depthwise_buffer_bytes(3, 3, 8, 8, (1, 1)) == 0 < cmsis_nn.depthwise_buffer_bytes(5, 5, 8, 8,
                                                                                                      (2, 2))
    with pytest.raises(ValueError):
        memory_plan.inplace_distance(*_graph("add", (2, 2, 4), 4), "x", kernels="arm")


def _reference_order(g: ir.Graph, op: ir.Op):
    """TFLM's reference loop order as steps (batch 1): one step per output byte (pixel, channel), its window read
    first; the input byte's last read is at its last reading pixel's last channel that uses it."""
    b = builtin_of(op)
    y = g.tensors[op.outputs[0]]
    x = g.tensors[op.inputs[0]]
    if b == "ADD":
        step = np.arange(y.size, dtype=np.int64)
        return step, step
    _, h, w, c = x.shape
    _, ho, wo, co = y.shape

    def last(n_in, n_out, k, s, pad):
        i = np.arange(n_in)
        o = np.minimum((i + pad) // s, n_out - 1)
        return np.where((o >= 0) & (o * s - pad <= i) & (o * s - pad + k - 1 >= i), o, -1)

    ly = last(h, ho, op.kernel[0], op.stride[0], op.padding[0])
    lx = last(w, wo, op.kernel[1], op.stride[1], op.padding[2])
    lp = np.where((ly[:, None] >= 0) & (lx[None, :] >= 0), ly[:, None] * wo + lx[None, :], -1).reshape(-1)
    out_step = np.arange(ho * wo * co, dtype=np.int64)
    if b == "CONV_2D":
        last_channel = np.full(c, co - 1)
    else:
        mult = co // c
        last_channel = (np.arange(c) + 1) * mult - 1
    in_step = np.where(lp[:, None] >= 0, lp[:, None] * co + last_channel[None, :], -1).reshape(-1)
    return out_step, in_step


def test_order_engine_reproduces_the_reference_closed_form(mbv2):
    """distance_from_order over TFLM's reference loop order gives inplace_distance's closed form for every
    (output, dying input) of a MobileNetV2: the engine the CMSIS-NN distances go through is right."""
    _, g = mbv2
    life = memory_plan.lifetimes(g)
    checked = 0
    for i, op in enumerate(g.ops):
        for t in op.inputs:
            if t in life and life[t][1] == i + 1 and t not in g.inputs:
                ref = memory_plan.inplace_distance(g, op, t)
                if ref is None:
                    continue
                assert memory_plan.distance_from_order(*_reference_order(g, op)) == ref, op.name
                checked += 1
    assert checked > 40


def test_cmsis_nn_distances_by_hand():
    # 3x3 depthwise, stride 1, SAME on 8x8x16 (arm_depthwise_conv_3x3_s8): groups of four channels read and written
    # pixel by pixel, so one row and one pixel as with the reference kernels.
    assert memory_plan.inplace_distance(*_graph("dw", (8, 8, 16), 16, (3, 3), (1, 1), (1, 1, 1, 1)), "x",
                                        kernels="cmsis_nn") == (8 + 1) * 16
    # 3x3 conv 4 -> 6 channels on 8x8 (arm_convolve_s8): pixels (2k, 2k + 1) are written after both windows are
    # read; pixel pair (y, 2m), (y, 2m + 1) must end before the next pair's first read, input pixel (y - 1, 2m + 1):
    # (8y + 2m + 2) x 6 - (8(y - 1) + 2m + 1) x 4 = 16y + 4m + 40, largest at y = 7, m = 2.
    assert memory_plan.inplace_distance(*_graph("conv", (8, 8, 4), 6, (3, 3), (1, 1), (1, 1, 1, 1)), "x",
                                        kernels="cmsis_nn") == 160
    # 1x1 projection 16 -> 4 on 8x8 (arm_convolve_1x1_s8_fast): every pair of output channels re-reads the whole
    # input, so only the last pass's two channels of the last pixel may overlap it: 8 x 8 x 4 - 2.
    g, op = _graph("conv", (8, 8, 16), 4)
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn") == 8 * 8 * 4 - 2
    assert memory_plan.inplace_distance(g, op, "x") == 4 - 1  # the reference kernels: pixel by pixel
    # ... which leaves no 16-byte aligned overlap: no in-place pair.
    conv = {"in_channels": 4, "out_channels": 4, "attrs": {"tflite_op": "CONV_2D"}}
    g2 = ir.Graph("g2", dict(g.tensors, z=ir.Tensor("z", (1, 8, 8, 4)), v=ir.Tensor("v", (1, 8, 8, 4))),
                  [ir.Op("pre", ir.CONV, ["z"], ["x"], **dict(conv, out_channels=16)), op,
                   ir.Op("post", ir.CONV, ["y"], ["v"], **conv)], ["z"], ["v"])
    assert ("y", "x") in memory_plan.inplace_pairs(g2) and ("y", "x") not in memory_plan.inplace_pairs(
        g2, kernels="cmsis_nn")
    # Strided 1x1 (arm_convolve_1x1_s8): the same per output row. 8x8x8 -> 4x4x6, stride 2: output row r (24 B)
    # must not reach input row 2r + 2 after its first pass... row 0's first-pass bytes end at 3 x 6 + 1.
    assert memory_plan.inplace_distance(*_graph("conv", (8, 8, 8), 6, (1, 1), (2, 2)), "x", kernels="cmsis_nn") == 22
    # ADD (arm_elementwise_add_s8): four elements read, then written: exactly in place.
    g, op = _graph("add", (6, 6, 7), 7)
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn") == 0
    assert memory_plan.inplace_distance(g, op, "x2", kernels="cmsis_nn") == 0


def test_stage_ops_take_their_builtins_distance(mbv2):
    """A one-layer TFMCU_PATCH_STAGE op (rewrite --rest_convs=tfmcu) runs the same CMSIS-NN call on whole tensors
    (cmsis_nn/window_rows.c: dense boxes, one call): its distance is its builtin's, for both kernel sets."""
    data, g = mbv2
    flash = custom_stage.convs_to_flash(data, "m")
    assert flash.replaced
    gf = lower_tflite.from_tflite(flash.model, name="flash")
    by_src = {op.src_index: op for op in g.ops}
    checked = 0
    for op in gf.ops:
        if builtin_of(op) != f"custom:{custom_stage.PATCH_STAGE_OP}":
            continue
        orig = by_src[op.src_index]
        if builtin_of(orig) not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            continue  # FULLY_CONNECTED runs as a 1x1 conv: no overlap either way
        for kernels in ("reference", "cmsis_nn"):
            assert (memory_plan.inplace_distance(gf, op, op.inputs[0], kernels)
                    == memory_plan.inplace_distance(g, orig, orig.inputs[0], kernels)), (op.name, kernels)
        checked += 1
    assert checked > 20


def _probe_generator():
    path = os.path.join(ROOT, "tflm_patch_kernels", "firmware", "gen_inplace_probe.py")
    spec = importlib.util.spec_from_file_location("gen_inplace_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_cases_cover_every_cmsis_nn_path():
    """The QEMU probe (inplace_probe.c) runs every kernel path processing_order models, through TFLM's call and the
    patch backend's, each with a distance that leaves an overlap."""
    cases = _probe_generator().cases()
    paths = {c["path"] for c in cases}
    assert paths == {"arm_convolve_s8", "arm_convolve_1x1_s8_fast", "arm_convolve_1x1_s8",
                     "arm_depthwise_conv_3x3_s8", "arm_depthwise_conv_s8_opt", "arm_depthwise_conv_s8",
                     "arm_avgpool_s8", "arm_max_pool_s8", "arm_elementwise_add_s8"}
    assert {c["path"] for c in cases if c["via"] == "backend"} == {
        "arm_convolve_s8", "arm_convolve_1x1_s8_fast", "arm_convolve_1x1_s8", "arm_depthwise_conv_3x3_s8",
        "arm_depthwise_conv_s8_opt"}
    for c in cases:
        assert 0 <= c["distance"] < int(np.prod(c["out"])), c["name"]
    assert sum(c["distance"] > 0 for c in cases) > 20  # the others are exactly in place (no closer run)


def test_cmsis_nn_plan_holds_the_cmsis_nn_scratch(mbv2):
    """Item 3 of issue 23: an offline plan made for the reference kernels leaves no room for the CMSIS-NN build's
    scratch (TFLM then places it above the plan); one made for kernels="cmsis_nn" does. So with CMSIS-NN a streamed
    model's predicted arena is not above its unstreamed version's, disjoint or in place, and the plan's head is
    what the predictor gives for the CMSIS-NN build."""
    data, g = mbv2
    s = scheduler.schedule(g, 4, n_blocks=4)
    totals = {}
    for stream in (False, True):
        base = custom_stage.rewrite_custom(data, g, s, "m", streamed_input=stream)
        packed = custom_stage.load_custom(base.model).packed
        for inplace in (False, True):
            model, head, _ = memory_plan.with_offline_plan(base.model, inplace=inplace, kernels="cmsis_nn",
                                                           stages={0: packed})
            pred = predict_arena(lower_tflite.from_tflite(model), model=model, build="cortex-m-cmsis-nn",
                                 stage=packed)
            assert pred.head == head, (stream, inplace)
            totals[(stream, inplace)] = pred.total
    assert totals[(True, False)] <= totals[(False, False)] and totals[(True, True)] <= totals[(False, True)]
    assert totals[(True, True)] <= totals[(True, False)]


def test_a_plan_that_does_not_beat_greedy_replaces_the_old_one(mbv2):
    """with_offline_plan never leaves a plan made before (perhaps for other kernels) in the model: without a better
    plan every tensor goes back online."""
    data, g = mbv2
    planned, head, greedy = memory_plan.with_offline_plan(data, g, inplace=True)
    assert head < greedy and memory_plan.read_offline_plan(planned, g)
    again, head2, greedy2 = memory_plan.with_offline_plan(planned, g, tries=0, kernels="cmsis_nn")
    assert head2 == greedy2 and not memory_plan.read_offline_plan(again, g)
    assert predict_arena(g, model=again, build="cortex-m-cmsis-nn").head == greedy2
