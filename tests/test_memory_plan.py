"""Offline memory plans, disjoint and in place, checked in the real TFLM interpreter.

In-place plans let an operator's output overlap an input that dies there, by the distance ``inplace_distance``
derives from TFLM's reference kernels' loop order. Here TFLM runs models with such plans: outputs are bit-exact,
the measured head equals the planned one, and one byte less distance than derived corrupts the output (the distance
is tight, and TFLM really places the tensors where the plan says).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.graph import from_tflite as lower_tflite  # noqa: E402
from tfmcu.plan import arena as tflm_memory  # noqa: E402
from tfmcu.plan import memory_plan  # noqa: E402
from tfmcu.plan import regions as scheduler  # noqa: E402
from tfmcu.runtime.host import HostRunner  # noqa: E402
from tfmcu.runtime.model_io import random_inputs  # noqa: E402
from tfmcu.runtime.tflm import measure_arena, run_tflm  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole  # noqa: E402
from tfmcu.stage import custom as custom_stage  # noqa: E402


@pytest.fixture(scope="module")
def mbv2(zoo_models):
    data = zoo_models("mbv2_035_96")
    return data, lower_tflite.from_tflite(data, name="mbv2_035_96")


def _same(a, b) -> bool:
    return all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))


def test_inplace_distance_by_hand():
    """Distances worked out by hand from the reference loops (batch, out_y, out_x, out channel)."""
    g = lower_tflite_free_graph()
    ops = {op.name: op for op in g.ops}
    # 3x3 stride-1 SAME depthwise on 8x8x16: output pixel (y, x) is written after the window from (y-1, x-1) is
    # read, so the output may start one row and one pixel (9 pixels x 16 channels) before the input.
    assert memory_plan.inplace_distance(g, ops["dw"], "e") == (8 + 1) * 16
    # 1x1 projection 16 -> 4 channels: pixel 0's last output byte is written after its reads; the next pixel reads
    # from byte 16, so the output may start 3 bytes before the input.
    assert memory_plan.inplace_distance(g, ops["proj"], "d") == 4 - 1
    # 1x1 expansion 4 -> 16 over 64 pixels: the output must end at least 3 bytes before the input ends.
    assert memory_plan.inplace_distance(g, ops["exp"], "x") == 63 * (16 - 4) + 16 - 1
    # Elementwise ADD: exactly in place.
    assert memory_plan.inplace_distance(g, ops["add"], "p") == 0
    assert memory_plan.inplace_distance(g, ops["add"], "x") == 0
    pairs = memory_plan.inplace_pairs(g)
    assert ("d", "e") in pairs and ("p", "d") in pairs and ("e", "x") not in pairs  # x lives on for the ADD


def lower_tflite_free_graph():
    from tfmcu.graph import ir

    t = {n: ir.Tensor(n, s) for n, s in [("x", (1, 8, 8, 4)), ("e", (1, 8, 8, 16)), ("d", (1, 8, 8, 16)),
                                          ("p", (1, 8, 8, 4)), ("y", (1, 8, 8, 4))]}
    ops = [
        ir.Op("exp", ir.CONV, ["x"], ["e"], in_channels=4, out_channels=16, attrs={"tflite_op": "CONV_2D"}),
        ir.Op("dw", ir.DEPTHWISE, ["e"], ["d"], kernel=(3, 3), padding=(1, 1, 1, 1), in_channels=16,
              out_channels=16, groups=16, attrs={"tflite_op": "DEPTHWISE_CONV_2D"}),
        ir.Op("proj", ir.CONV, ["d"], ["p"], in_channels=16, out_channels=4, attrs={"tflite_op": "CONV_2D"}),
        ir.Op("add", ir.ADD, ["p", "x"], ["y"], in_channels=4, out_channels=4, attrs={"tflite_op": "ADD"}),
    ]
    return ir.Graph("hand", t, ops, ["x"], ["y"])


def test_inplace_plan_is_bit_exact_and_measured_in_tflm(mbv2):
    data, g = mbv2
    disjoint, h0, greedy = memory_plan.with_offline_plan(data, g)
    inplace, h1, _ = memory_plan.with_offline_plan(data, g, inplace=True)
    assert h1 < h0
    m = measure_arena(inplace)
    assert m.head == h1 == tflm_memory.predict_arena(g, model=inplace).head
    # The plan really overlaps tensors that are alive at the same operator.
    offsets = memory_plan.read_offline_plan(inplace, g)
    life = tflm_memory.lifetimes(g)
    sizes = {n: tflm_memory.align_up(g.tensors[n].nbytes, 16) for n in offsets}
    shared = [(a, b) for a in offsets for b in offsets if a < b and not (life[a][1] < life[b][0] or
              life[b][1] < life[a][0]) and offsets[a] < offsets[b] + sizes[b] and offsets[b] < offsets[a] + sizes[a]]
    assert shared
    inputs = random_inputs(data, 4, seed=11)
    ref = run_tflm(data, inputs)
    assert _same(ref, run_tflm(inplace, inputs)) and _same(ref, run_tflm(disjoint, inputs))


def test_inplace_distance_is_tight_in_tflm(mbv2):
    """Every in-place pair of the model, moved to fresh space: at exactly the derived distance TFLM's output is
    bit-exact, and closer it changes (TFLM really places the tensors where the plan says, and no distance is loose).
    One byte closer already corrupts for depthwise, pooling and ADD; for a 1x1 CONV_2D the bound can bind at a single
    output byte whose overwritten input byte may happen to hold the same value, so up to 4 bytes are allowed for."""
    from tfmcu.plan.arena import builtin_of as _builtin

    data, g = mbv2
    pairs = memory_plan.inplace_pairs(g)
    producer = g.producer()
    kinds = {_builtin(g.ops[producer[y]]) for y, _ in pairs}
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD"} <= kinds
    head, offsets, _ = memory_plan.plan(g)
    top = (head + 1024) // 16 * 16 + 1024  # room below the output for distances < 0
    inputs = random_inputs(data, 3, seed=2)
    ref = run_tflm(data, inputs)

    def exact_at(y: str, x: str, dist: int) -> bool:
        plan = dict(offsets)
        plan[y], plan[x] = top, top + dist
        return _same(ref, run_tflm(memory_plan.write_offline_plan(data, plan, g), inputs))

    problems = []
    for (y, x), d in pairs.items():
        kind = _builtin(g.ops[producer[y]])
        if not exact_at(y, x, d):
            problems.append(f"{kind} {y}: distance {d} is not safe")
            continue
        slack = 4 if kind == "CONV_2D" else 1
        if all(exact_at(y, x, dist) for dist in range(d - 1, d - 1 - slack, -1)):
            problems.append(f"{kind} {y}: distances {d - slack}..{d - 1} should corrupt the output")
    assert not problems, problems


def _eltwise_model() -> bytes:
    """conv -> HARD_SWISH -> swish (LOGISTIC, MUL) -> LEAKY_RELU -> TANH -> LOGISTIC -> SUB of a 1x1 conv of it and
    it -> conv: every element-wise op but swish's LOGISTIC has an input that dies at it (an in-place pair)."""
    import tensorflow as tf
    import tf_keras
    from tf_keras import layers as L

    from tfmcu.nets.convert import random_representative, to_int8_tflite

    tf_keras.utils.set_random_seed(4)
    i = tf_keras.Input((12, 10, 3))
    h = L.Lambda(lambda t: t * tf.nn.relu6(t + 3.0) / 6.0)(L.Conv2D(8, 3, padding="same")(i))
    t = L.Activation("tanh")(L.LeakyReLU(0.2)(L.Multiply()([h, L.Activation("sigmoid")(h)])))
    t = L.Activation("sigmoid")(t)
    d = L.Subtract()([L.Conv2D(8, 1)(t), t])
    return to_int8_tflite(tf_keras.Model(i, L.Conv2D(4, 3, padding="same")(d)),
                          random_representative((12, 10, 3), samples=3))


def test_eltwise_ops_run_in_place_in_tflm():
    """The element-wise ops' output may start at their input (D = 0) with both kernel sets: the in-place plan is
    bit-exact in TFLM (the wheel and the pinned sources), and one byte closer (the output one byte after the input's
    start) corrupts every pair: TFLM reads element i + 1 after writing element i."""
    from tfmcu.plan.arena import builtin_of

    data = _eltwise_model()
    g = lower_tflite.from_tflite(data, name="eltwise")
    producer = g.producer()
    pairs = memory_plan.inplace_pairs(g)
    kinds = {builtin_of(g.ops[producer[y]]): d for (y, _), d in pairs.items()}
    eltwise = ("HARD_SWISH", "MUL", "LEAKY_RELU", "TANH", "LOGISTIC", "SUB")
    assert {k: kinds.get(k) for k in eltwise} == dict.fromkeys(eltwise, 0), kinds
    assert memory_plan.inplace_pairs(g, kernels="cmsis_nn") == pairs
    assert memory_plan.inplace_pairs(g, kernels="cmsis_nn", core="cortex-m55") == pairs
    inputs = random_inputs(data, 3, seed=5)
    ref = run_tflm(data, inputs)
    inplace, _, _ = memory_plan.with_offline_plan(data, g, inplace=True)
    assert _same(ref, run_tflm(inplace, inputs))
    assert _same(ref, run_whole(inplace, inputs).outputs)
    head, offsets, _ = memory_plan.plan(g)
    top = (head + 1024) // 16 * 16 + 1024

    def exact_at(y: str, x: str, dist: int) -> bool:
        plan = dict(offsets)
        plan[y], plan[x] = top, top + dist
        return _same(ref, run_tflm(memory_plan.write_offline_plan(data, plan, g), inputs))

    for (y, x), d in pairs.items():
        if builtin_of(g.ops[producer[y]]) in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            continue
        assert exact_at(y, x, d) and not exact_at(y, x, d - 1), (builtin_of(g.ops[producer[y]]), y, x)


def _broadcast_model() -> bytes:
    """conv -> depthwise -> a squeeze-excite (its MUL broadcasts the 1 x 1 x C scale over the map) -> a MUL and an ADD
    by per-channel constants -> conv: the broadcast ops' map operand dies at them (in-place pairs)."""
    import tensorflow as tf
    import tf_keras
    from tf_keras import layers as L

    from tfmcu.nets.convert import random_representative, to_int8_tflite

    tf_keras.utils.set_random_seed(6)
    i = tf_keras.Input((12, 10, 3))
    x = L.DepthwiseConv2D(3, padding="same", activation="relu")(L.Conv2D(8, 3, padding="same")(i))
    s = L.Conv2D(8, 1, activation="sigmoid")(L.GlobalAveragePooling2D(keepdims=True)(x))
    x = L.Multiply()([x, s])
    x = L.Lambda(lambda t: t * tf.constant(np.linspace(0.5, 2.0, 8), tf.float32)
                 + tf.constant(np.linspace(-1.0, 1.0, 8), tf.float32))(x)
    return to_int8_tflite(tf_keras.Model(i, L.Conv2D(4, 3, padding="same")(x)),
                          random_representative((12, 10, 3), samples=3))


def test_broadcast_ops_run_in_place_over_their_map_operand():
    """A MUL or ADD whose other operand is broadcast (a squeeze-excite's scale, a per-channel constant) runs TFLM's
    reference broadcast loop in both builds: its output may start at its full-size operand (D = 0), bit-exact in
    TFLM (the wheel and the pinned sources), and one byte closer corrupts it; the broadcast operand never overlaps."""
    from tfmcu.plan.arena import builtin_of

    data = _broadcast_model()
    g = lower_tflite.from_tflite(data, name="broadcast")
    producer = g.producer()
    pairs = memory_plan.inplace_pairs(g)
    broadcast = {(y, x): d for (y, x), d in pairs.items()
                 if g.ops[producer[y]].attrs.get("broadcast") or g.ops[producer[y]].attrs.get("constant_operands")}
    assert len(broadcast) == 3 and set(broadcast.values()) == {0}, pairs  # the SE's MUL, the constants' MUL, ADD
    assert all(g.tensors[x].shape == g.tensors[y].shape for y, x in broadcast)
    assert memory_plan.inplace_pairs(g, kernels="cmsis_nn") == pairs
    assert memory_plan.inplace_pairs(g, kernels="cmsis_nn", core="cortex-m55") == pairs
    inputs = random_inputs(data, 3, seed=5)
    ref = run_tflm(data, inputs)
    inplace, _, _ = memory_plan.with_offline_plan(data, g, inplace=True)
    assert _same(ref, run_tflm(inplace, inputs))
    assert _same(ref, run_whole(inplace, inputs).outputs)
    head, offsets, _ = memory_plan.plan(g)
    top = (head + 1024) // 16 * 16 + 1024

    def exact_at(y: str, x: str, dist: int) -> bool:
        plan = dict(offsets)
        plan[y], plan[x] = top, top + dist
        return _same(ref, run_tflm(memory_plan.write_offline_plan(data, plan, g), inputs))

    for (y, x), d in broadcast.items():
        assert exact_at(y, x, d) and not exact_at(y, x, d - 1), (builtin_of(g.ops[producer[y]]), y, x)


def test_custom_mode_inplace_rest(zoo_models):
    """Custom mode with an in-place rest: recorded in the schedule, a smaller head for the rest, a measured TFLM arena
    no larger (the whole model in TFLM built from source with the kernel; the predictor agrees), still bit-exact."""
    data = zoo_models("mbv2_035_96")
    g = lower_tflite.from_tflite(data, name="m")
    s = scheduler.schedule(g, 4, n_blocks=4)
    plain = custom_stage.rewrite_custom(data, g, s, "m")
    res = custom_stage.rewrite_custom(data, g, s, "m", inplace=True)
    assert res.schedule["memory_plan"] == "inplace" and plain.schedule["memory_plan"] == "disjoint"
    inputs = random_inputs(data, 4, seed=1)
    a, b = run_whole(res.model, inputs, "m"), run_whole(plain.model, inputs, "m")
    assert a.arena.arena_used_bytes <= b.arena.arena_used_bytes  # here the stage sets the peak
    rest_heads = [measure_arena(custom_stage.load_custom(m.model).rest).head for m in (res, plain)]
    assert rest_heads[0] < rest_heads[1]
    assert custom_stage.memory_report(res.model)["predicted"]["arena_head_bytes"] == a.arena.head_bytes
    assert _same(run_tflm(data, inputs), a.outputs)
    assert _same(run_tflm(data, inputs), HostRunner(res.model, "m").run(inputs))
