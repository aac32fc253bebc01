"""In-place plans for the CMSIS-NN build (``tfmcu.plan.memory_plan``, ``kernels="cmsis_nn"``).

The distances come from ``tfmcu.plan.cmsis_nn.processing_order`` (CMSIS-NN's DSP paths as TFLM's kernels/cmsis_nn and
the patch backend call them) through ``memory_plan.distance_from_order``. Here: that engine reproduces the reference
kernels' closed form on a real model; CMSIS-NN distances worked out by hand; a one-layer TFMCU_PATCH_STAGE op gets its
builtin's distance; the probe firmware's cases cover every kernel path (its QEMU tests on Cortex-M4 / M7,
//tflm_patch_kernels/firmware:inplace_probe_*, run them at D and closer); an offline plan made for the CMSIS-NN build
holds that build's scratch, so a streamed model's predicted arena is not above its unstreamed version's.

Helium (``mve=True``, CMSIS-NN's MVE code): the dispatch, distances by hand, the probe's --mve cases, and each of
them run through a loop-by-loop transliteration of CMSIS-NN's MVE kernels on one overlapping arena (exact at D,
changed one byte closer), which checks ``processing_order(..., mve=True)`` independently of its step arithmetic.
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
                    "add": ("ADD", ir.ADD), "mul": ("MUL", ir.MUL)}[kind]
    h, w, c = in_shape
    ho = ir.window_out_size(h, kernel[0], stride[0], 1, padding[0], padding[1])
    wo = ir.window_out_size(w, kernel[1], stride[1], 1, padding[2], padding[3])
    t = {"x": ir.Tensor("x", (1, h, w, c)), "x2": ir.Tensor("x2", (1, h, w, c)),
         "y": ir.Tensor("y", (1, ho, wo, out_c))}
    inputs = ["x", "x2"] if kind in ("add", "mul") else ["x"]
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
    # ADD and MUL (arm_elementwise_add_s8, arm_elementwise_mul_s8): four elements read, then written: exactly in
    # place.
    for kind in ("add", "mul"):
        g, op = _graph(kind, (6, 6, 7), 7)
        assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn") == 0
        assert memory_plan.inplace_distance(g, op, "x2", kernels="cmsis_nn") == 0


def test_stage_ops_take_their_builtins_distance(mbv2):
    """A one-layer TFMCU_PATCH_STAGE op (rewrite --rest_convs=tfmcu) runs the same CMSIS-NN call on whole tensors
    (cmsis_nn/window_rows.c: dense boxes, one call): its distance is its builtin's, for both kernel sets (a
    convolution whose stage ends with the global pool after it writes the pool's sums: not compared)."""
    data, g = mbv2
    flash = custom_stage.convs_to_flash(data, "m")
    assert flash.replaced
    gf = lower_tflite.from_tflite(flash.model, name="flash")
    by_src = {op.src_index: op for op in g.ops}
    pooled = {e["op"] for e in flash.replaced if "pool" in e}  # a conv with the global pool after it: another op
    assert pooled
    checked = 0
    for op in gf.ops:
        if builtin_of(op) != f"custom:{custom_stage.PATCH_STAGE_OP}" or op.src_index in pooled:
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
                     "arm_avgpool_s8", "arm_max_pool_s8", "arm_elementwise_add_s8", "arm_elementwise_mul_s8"}
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


# ------------------------------------------------------------------------------------------ Helium (MVE)
# The probe's distances on a DSP core (gen_inplace_probe.py without --mve): the MVE orders leave them as they were.
_DSP_DISTANCES = {
    "conv3x3_s1": 160, "conv3x3_s1_odd_pixels": 86, "conv3x3_s2": 4, "conv1x3_height1": 20, "conv1x1_expand": 254,
    "conv1x1_project": 142, "conv1x1_odd": 124, "conv1x1_s2": 22, "conv1x1_s2_odd": 11, "dw3x3_s1": 144,
    "dw3x3_s1_leftover": 70, "dw3x3_s2_leftover": 0, "dw3x3_s2_same_even": 0, "dw5x5_opt": 144, "dw5x5_opt_s2": 36,
    "dw3x3_mult2": 172, "dw3x3_mult4": 342, "avgpool2x2_s2": 0, "avgpool3x3_s1": 35, "maxpool2x2_s2": 0,
    "maxpool3x3_s1": 35, "add_in1": 0, "add_in2": 0, "mul_in1": 0, "mul_in2": 0, "stage_conv3x3": 86, "stage_conv3x3_s2_rgb": 22,
    "stage_conv1x1": 142,
    "stage_conv1x1_s2": 11, "stage_conv1x1_folded": 34, "stage_conv1x1_folded_odd": 74,
    "stage_conv1x1_folded_steps": 58, "stage_conv1x1_folded_k8": 418, "stage_dw3x3": 0, "stage_dw3x3_groups": 144,
    "stage_dw3x3_groups_s2": 0, "stage_dw5x5_opt": 144}


def test_mve_dispatch_is_cmsis_nn_wrappers():
    """arm_convolve_wrapper_s8 / arm_depthwise_conv_wrapper_s8 with ARM_MATH_MVEI (GCC's conversion threshold)."""
    assert cmsis_nn.conv_path(1, 3, (0, 1), mve=True, in_hw=(1, 9), in_channels=4) == "1xn"
    assert cmsis_nn.conv_path(1, 3, (0, 1), mve=True, in_hw=(1, 9), in_channels=3) == "im2col"  # 1 x 3 % 4
    assert cmsis_nn.conv_path(1, 3, (0, 1), stride=(1, 2), mve=True, in_hw=(1, 9), in_channels=2) == "1xn"
    assert cmsis_nn.conv_path(1, 3, (0, 1), mve=True, in_hw=(2, 9), in_channels=4) == "im2col"
    assert cmsis_nn.conv_path(1, 3, (0, 1), in_hw=(1, 9), in_channels=4) == "im2col"  # DSP: arm_convolve_s8
    assert cmsis_nn.conv_path(1, 1, (0, 0), mve=True, in_hw=(1, 9), in_channels=4) == "1x1_fast"
    assert cmsis_nn.depthwise_path(3, 3, 8, 8, (1, 1), mve=True) == "opt"  # no arm_depthwise_conv_3x3_s8
    assert cmsis_nn.depthwise_path(3, 3, 1, 8, (1, 1), mve=True) == "conv"
    assert cmsis_nn.depthwise_path(3, 3, 1, 1, (1, 1), mve=True) == "opt"
    assert cmsis_nn.depthwise_path(3, 3, 4, 8, (1, 1), mve=True) == "generic"
    # ... and the orders follow it
    assert cmsis_nn.processing_order("depthwise", (6, 6, 1), (6, 6, 8), (3, 3), (1, 1), (1, 1),
                                     mve=True)[0] == "arm_convolve_s8"
    assert cmsis_nn.processing_order("depthwise", (6, 6, 8), (6, 6, 8), (3, 3), (1, 1), (1, 1),
                                     mve=True)[0] == "arm_depthwise_conv_s8_opt"
    # arm_convolve_1_x_n_s8 refuses a left padding that is not half the total (ARM_CMSIS_NN_FAILURE; its total is
    # not clamped at 0: 1x2, stride 4 on 4 pixels gives -2): not modelled
    assert cmsis_nn.processing_order("conv", (1, 9, 4), (1, 9, 6), (1, 3), (1, 1), (0, 2), mve=True) is None
    assert cmsis_nn.processing_order("conv", (1, 4, 4), (1, 1, 6), (1, 2), (1, 4), (0, 0), mve=True) is None
    # ... and its right copy (kernel_w - 1 pixels) reaches past the input with stride 2 and an even right padding:
    # 1x5, stride 2, SAME (2, 2) on 9 pixels copies pixels 6..9 for output 4, pixel 9 where padding belongs
    assert cmsis_nn.processing_order("conv", (1, 9, 2), (1, 5, 6), (1, 5), (1, 2), (0, 2), mve=True) is None
    assert cmsis_nn.processing_order("conv", (1, 9, 2), (1, 5, 6), (1, 5), (1, 2), (0, 2))[0] == "arm_convolve_s8"


def test_mve_distances_by_hand():
    # 1x1 projection 16 -> 4 on 6x6 (arm_nn_mat_mult_nt_t_s8, MVE): four pixels per block, channel by channel, so
    # channels 0..2 of pixels 0..3 are written before channel 3 reads pixels 0..3 again: 4 x 4 - 1 (DSP: 6 x 6 x 4 - 2).
    g, op = _graph("conv", (6, 6, 16), 4)
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn", mve=True) == 15
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn") == 6 * 6 * 4 - 2
    # One pixel 16 -> 8 (the leftover-row loop: four channels per step, the row read again for each): 4.
    g, op = _graph("conv", (1, 1, 16), 8)
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn", mve=True) == 4
    # 3x3 conv 4 -> 6 on 8x8 (arm_convolve_s8, four columns): pixels (8y + 4m .. 8y + 4m + 3) end before the next
    # block's first read, input pixel (y - 1, 4m + 3): (8y + 4m + 4) x 6 - (8(y - 1) + 4m + 3) x 4 = 16y + 8m + 44,
    # largest at y = 7, m = 1 (the last block, y = 7, m = 1, has no next one: y = 7, m = 0 gives 156).
    assert memory_plan.inplace_distance(*_graph("conv", (8, 8, 4), 6, (3, 3), (1, 1), (1, 1, 1, 1)), "x",
                                        kernels="cmsis_nn", mve=True) == 156
    # The same geometry through the reference kernels or "reference" with mve: mve changes CMSIS-NN's only.
    g, op = _graph("conv", (8, 8, 4), 6, (3, 3), (1, 1), (1, 1, 1, 1))
    assert memory_plan.inplace_distance(g, op, "x", mve=True) == memory_plan.inplace_distance(g, op, "x")
    # ADD: four elements (a predicated tail too) read, then written: exactly in place.
    g, op = _graph("add", (3, 3, 5), 5)
    assert memory_plan.inplace_distance(g, op, "x", kernels="cmsis_nn", mve=True) == 0


def test_probe_dsp_cases_unchanged():
    """Without --mve the probe's cases and distances are what they were (and the folded product is in them)."""
    gen = _probe_generator()
    assert {c["name"]: c["distance"] for c in gen.cases()} == _DSP_DISTANCES
    assert {c["name"]: c["distance"] for c in gen.cases(mve=False)} == _DSP_DISTANCES


def test_probe_mve_cases_cover_every_mve_path():
    """--mve: every DSP case but the folded product's, plus the MVE classes; every path the MVE build runs."""
    gen = _probe_generator()
    cases = gen.cases(mve=True)
    names = {c["name"] for c in cases}
    assert names == {n for n in _DSP_DISTANCES if "folded" not in n} | {c[0] for c in gen.MVE_CASES}
    assert {c["path"] for c in cases} == {
        "arm_convolve_s8", "arm_convolve_1_x_n_s8", "arm_convolve_1x1_s8_fast", "arm_convolve_1x1_s8",
        "arm_depthwise_conv_s8_opt", "arm_depthwise_conv_s8", "arm_avgpool_s8", "arm_max_pool_s8",
        "arm_elementwise_add_s8", "arm_elementwise_mul_s8"}
    assert {c["path"] for c in cases if c["via"] == "backend"} == {
        "arm_convolve_s8", "arm_convolve_1_x_n_s8", "arm_convolve_1x1_s8_fast", "arm_convolve_1x1_s8",
        "arm_depthwise_conv_s8_opt"}
    for c in cases:
        assert c["distance"] is not None and 0 <= c["distance"] < int(np.prod(c["out"])), c["name"]
        # a kernel that reads input after writing output (every window op but a strided one) needs D > 0
        if c["kind"] not in ("add", "mul") and c["stride"] == (1, 1) and int(np.prod(c["out"][:2])) > 4:
            assert c["distance"] > 0, c["name"]
    assert sum(c["distance"] > 0 for c in cases) > 35


class _Memory:
    """One int8 arena holding the output and the overlapped input (``distance`` bytes after the output's start) as
    the probe places them (None: disjoint), plus the other ADD input apart. Reads of the input are checked to stay
    inside it (a kernel that read past a window would be modelled wrong)."""

    def __init__(self, x: np.ndarray, out_bytes: int, distance: int | None, x2: np.ndarray | None = None):
        self.out = 16
        self.inp = self.out + (out_bytes + 16 if distance is None else distance)
        self.mem = np.full(self.inp + len(x) + out_bytes + 64, 0x5A, dtype=np.int64)
        self.mem[self.inp:self.inp + len(x)] = x
        self.n_in, self.n_out = len(x), out_bytes
        self.x2 = x2

    def read(self, offset: int, n: int) -> np.ndarray:
        assert 0 <= offset and offset + n <= self.n_in, (offset, n, self.n_in)
        return self.mem[self.inp + offset:self.inp + offset + n].copy()

    def read_out(self, offset: int, n: int) -> np.ndarray:
        return self.mem[self.out + offset:self.out + offset + n].copy()

    def write(self, offset: int, values) -> None:
        values = np.atleast_1d(np.asarray(values, dtype=np.int64))
        self.mem[self.out + offset:self.out + offset + len(values)] = (values + 128) % 256 - 128

    def output(self) -> np.ndarray:
        return self.mem[self.out:self.out + self.n_out].copy()


_PAD = 7  # the im2col padding byte (CMSIS-NN: -input_offset); any constant


def _mat_mult_mve(lhs_row, rows: int, weights: np.ndarray, bias: np.ndarray, write) -> None:
    """arm_nn_mat_mult_nt_t_s8 (MVE) as written: rows in fours, per output channel the four rows read, then that
    channel of the four written; then each leftover row, written four channels at a time, the tail after."""
    cols_out = weights.shape[0]
    r = 0
    while r + 4 <= rows:
        for i in range(cols_out):
            vals = [lhs_row(r + j) for j in range(4)]
            for j in range(4):
                write(r + j, i, int(vals[j] @ weights[i]) + bias[i])
        r += 4
    while r < rows:
        acc = {}
        for i in range(cols_out):
            acc[i] = int(lhs_row(r) @ weights[i]) + bias[i]
            if i % 4 == 3:
                for k in range(i - 3, i + 1):
                    write(r, k, acc[k])
        for k in range(cols_out - cols_out % 4, cols_out):
            write(r, k, acc[k])
        r += 1


def _window(mem: _Memory, c: dict, oy: int, ox: int, ch0: int = 0, n: int | None = None) -> list:
    """The taps of output pixel (oy, ox): the input bytes [ch0, ch0 + n) of each in-image tap (read now), None for
    a padded one."""
    h, w, cin = c["in"]
    n = cin if n is None else n
    taps = []
    for ky in range(c["kernel"][0]):
        for kx in range(c["kernel"][1]):
            iy, ix = oy * c["stride"][0] - c["padding"][0] + ky, ox * c["stride"][1] - c["padding"][2] + kx
            taps.append(mem.read((iy * w + ix) * cin + ch0, n) if 0 <= iy < h and 0 <= ix < w else None)
    return taps


def _simulate_mve(c: dict, mem: _Memory, weights: np.ndarray, bias: np.ndarray) -> None:
    """The case's CMSIS-NN MVE kernel, transliterated loop by loop (its arithmetic replaced by sums that change
    with every byte they read), on ``mem``."""
    h, w, cin = c["in"]
    ho, wo, co = c["out"]
    kh, kw = c["kernel"]
    sh, sw = c["stride"]
    pl = c["padding"][2]
    path = c["path"]

    def put(pixel_base):
        return lambda r, i, v: mem.write((pixel_base + r) * co + i, v)

    if path == "arm_convolve_s8":  # columns of four windows, then the product on the buffer
        cols = []
        for p in range(ho * wo):
            taps = _window(mem, c, p // wo, p % wo)
            cols.append((p, np.concatenate([np.full(cin, _PAD) if t is None else t for t in taps])))
            if len(cols) == 4:
                _mat_mult_mve(lambda r, b=cols: b[r][1], 4, weights, bias, put(cols[0][0]))
                cols = []
        if cols:
            _mat_mult_mve(lambda r, b=cols: b[r][1], len(cols), weights, bias, put(cols[0][0]))
    elif path == "arm_convolve_1_x_n_s8":
        left, unpadded, right, asym, _ = cmsis_nn._conv_1xn_sections(kw, pl, sw, w, wo)
        row = kw * cin
        buf = np.concatenate([np.full(pl * cin, _PAD), mem.read(0, row)])
        _mat_mult_mve(lambda r: buf[r * sw * cin:r * sw * cin + row], left, weights, bias, put(0))
        start = (sw * left - pl) * cin
        _mat_mult_mve(lambda r: mem.read(start + r * sw * cin, row), unpadded, weights, bias, put(left))
        if right:  # (the copy also runs without right-padded outputs; nothing reads it then)
            start = (sw * (left + unpadded) - pl) * cin
            pad = right * cin if asym else pl * cin
            rbuf = np.concatenate([mem.read(start, row - cin), np.full(pad, _PAD)])
            _mat_mult_mve(lambda r: rbuf[r * sw * cin:r * sw * cin + row], right, weights, bias,
                          put(left + unpadded))
    elif path == "arm_convolve_1x1_s8_fast":
        _mat_mult_mve(lambda r: mem.read(r * cin, cin), h * w, weights, bias, put(0))
    elif path == "arm_convolve_1x1_s8":
        for y in range(ho):
            base = y * sh * w * cin
            _mat_mult_mve(lambda r, b=base: mem.read(b + r * sw * cin, cin), wo, weights, bias, put(y * wo))
    elif path == "arm_depthwise_conv_s8_opt":  # channel blocks of 124 outside; four windows, then four pixels
        for ch0 in range(0, cin, cmsis_nn.CH_IN_BLOCK_MVE):
            active = min(cmsis_nn.CH_IN_BLOCK_MVE, cin - ch0)
            cols = []

            def flush(cols=None, ch0=ch0, active=active):
                for p, taps in cols:
                    for k in range(active):
                        acc = bias[ch0 + k] + sum(int((_PAD if t is None else t[k]) * weights[j, ch0 + k])
                                                  for j, t in enumerate(taps))
                        mem.write(p * co + ch0 + k, acc)
            for p in range(ho * wo):
                cols.append((p, _window(mem, c, p // wo, p % wo, ch0, active)))
                if len(cols) == 4:
                    flush(cols)
                    cols = []
            flush(cols)
    elif path == "arm_depthwise_conv_s8":  # per pixel, input channel, tile of four (or one) output channels
        mult = co // cin
        tile = 4 if mult % 4 == 0 else 1
        for p in range(ho * wo):
            for ic in range(cin):
                for t0 in range(0, mult, tile):
                    taps = [t for t in _window(mem, c, p // wo, p % wo, ic, 1) if t is not None]
                    for k in range(tile):
                        oc = ic * mult + t0 + k
                        mem.write(p * co + oc, bias[oc] + sum(int(t[0]) * (2 * (j + oc) + 1) for j, t in
                                                              enumerate(taps)))
    elif path == "arm_avgpool_s8":  # per pixel, per block of 16 channels
        for p in range(ho * wo):
            for ch0 in range(0, cin, 16):
                taps = [t for t in _window(mem, c, p // wo, p % wo, ch0, min(16, cin - ch0)) if t is not None]
                mem.write(p * co + ch0, sum(t * (2 * j + 1) for j, t in enumerate(taps)) + len(taps))
    elif path == "arm_max_pool_s8":  # the output is the accumulator: the first tap copied, the others compared in
        for p in range(ho * wo):
            first = True
            for t in range(kh * kw):
                ky, kx = divmod(t, kw)
                iy, ix = (p // wo) * sh - c["padding"][0] + ky, (p % wo) * sw - pl + kx
                if not (0 <= iy < h and 0 <= ix < w):
                    continue
                for ch0 in range(0, cin, 16):
                    n = min(16, cin - ch0)
                    src = mem.read((iy * w + ix) * cin + ch0, n)
                    mem.write(p * co + ch0, src if first else np.maximum(mem.read_out(p * co + ch0, n), src))
                first = False
    elif path in ("arm_elementwise_add_s8", "arm_elementwise_mul_s8"):
        # four elements (the tail predicated) of each input, then written
        for j in range(0, ho * wo * co, 4):
            n = min(4, ho * wo * co - j)
            a, b = mem.read(j, n), mem.x2[j:j + n]
            if c["overlapped"] == 2:
                a, b = b, a
            mem.write(j, a + 3 * b if path == "arm_elementwise_add_s8" else (a + 5) * (b - 4))
    else:
        raise AssertionError(path)


def _simulated(c: dict, distance: int | None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_in, n_out = int(np.prod(c["in"])), int(np.prod(c["out"]))
    x, x2 = rng.integers(-128, 128, n_in), rng.integers(-128, 128, n_in)
    cin, co = c["in"][2], c["out"][2]
    taps = c["kernel"][0] * c["kernel"][1]
    # odd weights: a sum changes (mod 256) with every byte it reads
    if c["kind"] == "depthwise" and cin == 1 and co > 1:  # run as a convolution of one input channel
        weights = rng.integers(-64, 64, (co, taps)) * 2 + 1
    elif c["kind"] == "depthwise":
        weights = rng.integers(-64, 64, (taps, co)) * 2 + 1
    else:
        weights = rng.integers(-64, 64, (co, taps * cin)) * 2 + 1
    bias = rng.integers(-1000, 1000, co)
    mem = _Memory(x, n_out, distance, x2)
    _simulate_mve(c, mem, weights, bias)
    return mem.output()


@pytest.mark.parametrize("name", [c[0] for c in _probe_generator().CASES + _probe_generator().MVE_CASES
                                  if c[2] != "backend_folded"])
def test_mve_distance_holds_and_is_tight_in_a_simulation(name):
    """Each MVE probe case run by a line-by-line transliteration of CMSIS-NN's MVE loops (an independent check of
    processing_order(mve=True)): bit-exact at D, changed at some distance in D - 1 ... D - slack (the QEMU probe on
    Cortex-M55 asks the same of the real kernels)."""
    c = next(c for c in _probe_generator().cases(mve=True) if c["name"] == name)
    d = c["distance"]
    reference = _simulated(c, None)
    assert np.array_equal(_simulated(c, d), reference), (name, d)
    closer = [k for k in range(1, c["slack"] + 1) if d - k >= 0]
    assert not closer or any(not np.array_equal(_simulated(c, d - k), reference) for k in closer), (name, d)
    if d > 0:  # and without the slack: one byte closer already breaks it here (sums change with every byte)
        assert not np.array_equal(_simulated(c, d - 1), reference), (name, d)
