"""TFLM arena: ``tfmcu.plan.arena.predict_arena`` against the tflite-micro wheel's own figures
(``tfmcu.runtime.tflm.measure_arena``), and the ``tfmcu.runtime`` helpers (measuring, running, random inputs,
isolation).

With the model's TFLite facts (``predict_arena(graph, model=bytes)``) head, tail, total and every per-type line of
``print_allocations`` are predicted exactly; from the IR alone the head is exact and the total within a few percent
(exact once ``from_tflite`` records TFLite tensor indices). Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.plan import arena as tm  # noqa: E402
from tfmcu.plan.placer import Buffer  # noqa: E402
from tfmcu.runtime import capture, model_io, tflite, tflm  # noqa: E402
from tfmcu.stage.custom import PATCH_STAGE_OP  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402


# ============================================================================= model builders
@pytest.fixture(scope="session")
def keras():
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    return tf_keras


def convert_function(fn, shapes, float_io=False, seed=0) -> bytes:
    """Full-int8 conversion of a tf.function (for graphs of raw TF ops: slice, pad, concat ...)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)

    def rep():
        for _ in range(2):
            yield [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]

    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not float_io:
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def convert_keras_multi(model) -> bytes:
    """int8 conversion of a Keras model with several inputs (the shared fixture takes one input)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    shapes = [(1,) + tuple(i.shape[1:]) for i in model.inputs]
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
                                           for _ in range(2))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


@pytest.fixture(scope="session")
def small_cnn(keras, int8_tflite) -> bytes:
    L = keras.layers
    i = keras.Input((32, 32, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(i)
    x = L.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = L.Conv2D(16, 1)(x)
    x = L.MaxPooling2D(2)(x)
    x = L.Conv2D(24, 3, padding="valid", activation="relu6")(x)
    x = L.GlobalAveragePooling2D()(x)
    return int8_tflite(keras.Model(i, L.Dense(10)(x), name="small_cnn"))


@pytest.fixture(scope="session")
def residual(keras, int8_tflite) -> bytes:
    L = keras.layers
    i = keras.Input((24, 24, 8))
    x = L.Conv2D(16, 3, padding="same", activation="relu6")(i)
    for _ in range(3):
        y = L.Conv2D(32, 1, activation="relu6")(x)
        y = L.DepthwiseConv2D(3, padding="same", activation="relu6")(y)
        x = L.Add()([x, L.Conv2D(16, 1)(y)])
    x = L.AveragePooling2D(2)(L.MaxPooling2D(2)(x))
    x = L.Softmax()(L.Dense(10)(L.Flatten()(x)))
    return int8_tflite(keras.Model(i, x, name="residual"))


@pytest.fixture(scope="session")
def float_input(keras, int8_tflite) -> bytes:
    """Float in, float out: QUANTIZE first, DEQUANTIZE last."""
    L = keras.layers
    i = keras.Input((20, 20, 3))
    x = L.Conv2D(8, 3, strides=2, activation="relu")(i)
    x = L.Concatenate()([x, L.Conv2D(4, 1)(x)])
    x = L.Dense(5)(L.GlobalAveragePooling2D()(x))
    return int8_tflite(keras.Model(i, x, name="float_input"), float_io=True)


@pytest.fixture(scope="session")
def two_inputs(keras) -> bytes:
    L = keras.layers
    a, b = keras.Input((8, 8, 4)), keras.Input((8, 8, 4))
    x = L.Concatenate()([L.Conv2D(4, 1)(a), b])
    x = L.GlobalAveragePooling2D()(L.Concatenate()([x, L.Add()([a, b])]))
    return convert_keras_multi(keras.Model([a, b], [x, L.Dense(3)(x)], name="two_inputs"))


PATCH_HW, PATCH_GRID = 32, 8


@pytest.fixture(scope="session")
def patch_graph() -> bytes:
    """An unrolled patch stage like the rewriter's: per patch SLICE / STRIDED_SLICE of the input window, PAD at the
    border, VALID CONV_2D and DEPTHWISE_CONV_2D sharing the original weights; CONCATENATION rows and columns; then
    MAX_POOL_2D, CONV_2D, MEAN, FULLY_CONNECTED (8x8 patches: 233 operators)."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    H = W = PATCH_HW
    P = PATCH_GRID
    w1 = tf.constant(rng.normal(0, 0.3, (3, 3, 3, 8)).astype(np.float32))
    b1 = tf.constant(rng.normal(0, 0.1, (8,)).astype(np.float32))
    w2 = tf.constant(rng.normal(0, 0.3, (3, 3, 8, 1)).astype(np.float32))
    b2 = tf.constant(rng.normal(0, 0.1, (8,)).astype(np.float32))
    w3 = tf.constant(rng.normal(0, 0.3, (1, 1, 8, 16)).astype(np.float32))
    wf = tf.constant(rng.normal(0, 0.3, (16, 10)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((1, H, W, 3), tf.float32)])
    def f(x):
        ph = H // P
        rows = []
        for r in range(P):
            cols = []
            for c in range(P):
                t0, b0, l0, r0 = r * ph - 2, (r + 1) * ph + 2, c * ph - 2, (c + 1) * ph + 2
                ct, cb, cl, cr = max(t0, 0), min(b0, H), max(l0, 0), min(r0, W)
                if (r + c) % 2 == 0:
                    p = tf.slice(x, [0, ct, cl, 0], [1, cb - ct, cr - cl, 3])
                else:
                    p = x[:, ct:cb, cl:cr, :]
                pads = [[0, 0], [ct - t0, b0 - cb], [cl - l0, r0 - cr], [0, 0]]
                if any(v for q in pads for v in q):
                    p = tf.pad(p, pads)
                y = tf.nn.relu(tf.nn.conv2d(p, w1, 1, "VALID") + b1)
                cols.append(tf.nn.relu(tf.nn.depthwise_conv2d(y, w2, [1, 1, 1, 1], "VALID") + b2))
            rows.append(tf.concat(cols, axis=2))
        x = tf.nn.max_pool2d(tf.concat(rows, axis=1), 2, 2, "VALID")
        x = tf.reduce_mean(tf.nn.conv2d(x, w3, 1, "VALID"), axis=[1, 2])
        return tf.matmul(x, wf)

    return convert_function(f, [(1, H, W, 3)])


@pytest.fixture(scope="session")
def mbv2_035(keras, int8_tflite) -> bytes:
    # classifier_activation=None: the untrained net's logits are so small after random calibration that the int8
    # SOFTMAX input scale makes TFLM (and TF Lite) abort in Prepare (see test_crash_is_isolated).
    m = keras.applications.MobileNetV2(alpha=0.35, input_shape=(96, 96, 3), weights=None, include_top=True,
                                       classes=10, classifier_activation=None)
    return int8_tflite(m)


# ============================================================================= the greedy planner itself
def test_greedy_planner_matches_tflm_unit_tests():
    # GreedyMemoryPlannerTest.TestGreedyMedium and TestOverlapCase (tflite-micro memory_planner tests).
    bufs = [Buffer(str(i), s, a, b) for i, (s, a, b) in
            enumerate([(10, 0, 1), (20, 1, 2), (30, 2, 3), (40, 3, 4), (50, 0, 1)])]
    assert tm.greedy_plan(bufs) == 90
    assert [b.offset for b in bufs] == [50, 70, 40, 0, 0]
    bufs = [Buffer(str(i), s, a, b) for i, (s, a, b) in enumerate([(100, 0, 1), (50, 2, 3), (20, 1, 2)])]
    assert tm.greedy_plan(bufs) == 120
    assert tm.greedy_plan([]) == 0


def test_planned_buffers_never_overlap(mbv2_035):
    buffers = tm.planned_buffers(from_tflite(mbv2_035))
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a["first"] <= b["last"] and b["first"] <= a["last"]:
                assert a["offset"] + a["size"] <= b["offset"] or b["offset"] + b["size"] <= a["offset"], (a, b)


def test_lifetimes_follow_tflm_scopes(small_cnn):
    g = from_tflite(small_cnn)
    life = tm.lifetimes(g)
    n = len(g.ops)
    assert life[g.inputs[0]] == (0, 1)  # created at scope 0, read by operator 0 (scope 1)
    assert life[g.outputs[0]] == (n, n)  # produced by the last operator, kept to the end
    assert life[g.ops[0].outputs[0]] == (1, 2)


# ============================================================================= predicted == measured
def check_prediction(name: str, data: bytes, ir_tolerance: float = 0.05, weights_keys: bool = False) -> None:
    measured = tflm.measure_arena(data)
    graph = from_tflite(data)
    exact = tm.predict_arena(graph, model=data)
    print(f"\n{name}: {len(graph.ops)} ops  measured head {measured.head:,} tail {measured.tail:,} total "
          f"{measured.total:,}  predicted head {exact.head:,} tail {exact.tail:,} total {exact.total:,}")
    assert (exact.head, exact.tail, exact.total) == (measured.head, measured.tail, measured.total)
    for kind, rec in measured.by_type.items():
        assert exact.details["by_type"].get(kind) == {"used": rec.used, "requested": rec.requested,
                                                      "count": rec.count}, kind
    assert set(exact.details["by_type"]) == set(measured.by_type)
    assert exact.details["unmodelled_ops"] == []

    if weights_keys:  # what a rewriter states about the per-patch copies of a layer
        for op in graph.ops:
            if op.type in (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED):
                op.attrs["weights_key"] = (op.type, op.kernel, op.in_channels, op.out_channels)
    from_ir = tm.predict_arena(graph)
    print(f"{name}: IR only ({from_ir.details['tensor_indices']} tensor indices): head {from_ir.head:,} "
          f"tail {from_ir.tail:,} total {from_ir.total:,} ({100 * (from_ir.total / measured.total - 1):+.2f}%)")
    assert from_ir.head == measured.head
    if from_ir.details["tensor_indices"] == "tflite":  # from_tflite records TFLite tensor indices
        assert from_ir.total == measured.total
    else:
        assert abs(from_ir.total - measured.total) <= ir_tolerance * measured.total


def test_small_cnn(small_cnn):
    check_prediction("small cnn", small_cnn)


def test_residual_net(residual):
    check_prediction("residual", residual)


def test_float_input_model(float_input):
    assert from_tflite(float_input).ops[0].type == ir.QUANTIZE
    check_prediction("float input", float_input)


def test_two_input_model(two_inputs):
    check_prediction("two inputs", two_inputs)


def test_unrolled_patch_graph(patch_graph):
    ops = [ts.op_name(m, op) for m in [ts.load_model(patch_graph)] for op in m.subgraphs[0].operators]
    for typ in ("SLICE", "STRIDED_SLICE", "PAD", "CONV_2D", "DEPTHWISE_CONV_2D", "CONCATENATION"):
        assert typ in ops
    assert len(ops) > 200
    check_prediction("patch graph", patch_graph, weights_keys=True)


def test_mobilenet_v2_035(mbv2_035):
    check_prediction("MobileNetV2 0.35 96x96", mbv2_035)


def test_mobilenet_v2_224(keras, int8_tflite):
    """The issue's figures: TFLM total 1,665,168 B and head 1,505,280 B for int8 MobileNetV2 1.0 224x224."""
    m = keras.applications.MobileNetV2(alpha=1.0, input_shape=(224, 224, 3), weights=None, include_top=True,
                                       classifier_activation=None)
    data = int8_tflite(m)
    measured = tflm.measure_arena(data)
    assert (measured.head, measured.total) == (1_505_280, 1_665_168)
    check_prediction("MobileNetV2 1.0 224x224", data)


# ============================================================================= measuring
def test_measure_arena_figures_do_not_depend_on_arena_size(small_cnn):
    a = tflm.measure_arena(small_cnn)
    b = tflm.measure_arena(small_cnn, arena_size=64 << 20)
    assert (a.head, a.tail, a.total) == (b.head, b.tail, b.total)
    assert a.total == a.head + a.tail
    assert tflm.measure_arena(small_cnn, arena_size=a.total).total == a.total  # the measured total suffices
    with pytest.raises(tflm.TFLMError, match="cannot allocate"):
        tflm.measure_arena(small_cnn, arena_size=a.total - 16)


def test_arena_grows_on_allocation_failure(small_cnn, monkeypatch):
    # 8 KiB: big enough for the tail, too small for the planned head (TFLM fails cleanly there; arenas smaller than
    # the tail can crash the wheel, which is why the automatic arena starts at 4 MiB).
    monkeypatch.setattr(tflm, "_default_arena", lambda model: 8192)
    stats = tflm.measure_arena(small_cnn)
    assert stats.arena_size > 8192 and stats.total <= stats.arena_size
    assert stats.total == tflm.measure_arena(small_cnn).total


def test_parse_allocations():
    text = ("[RecordingMicroAllocator] Arena allocation total 10416 bytes\n"
            "[RecordingMicroAllocator] Arena allocation head 8192 bytes\n"
            "[RecordingMicroAllocator] Arena allocation tail 2224 bytes\n"
            "[RecordingMicroAllocator] 'Persistent buffer data' used 744 bytes with alignment overhead "
            "(requested 708 bytes for 15 allocations)\n")
    s = tflm.parse_allocations(text)
    assert (s.total, s.head, s.tail) == (10416, 8192, 2224)
    assert s.by_type["Persistent buffer data"] == tflm.Allocation(744, 708, 15)
    with pytest.raises(tflm.TFLMError):
        tflm.parse_allocations("nothing here")


def test_capture_fds_restores_descriptors_on_error():
    before = os.fstat(2).st_ino, os.fstat(1).st_ino
    with pytest.raises(RuntimeError):
        with capture.capture_fds() as out:
            os.write(2, b"from C\n")
            raise RuntimeError("boom")
    assert "from C" in out[0]
    assert (os.fstat(2).st_ino, os.fstat(1).st_ino) == before


def test_not_a_model_and_custom_ops(small_cnn):
    with pytest.raises(tflm.TFLMError, match="not a TFLite"):
        tflm.measure_arena(b"0123456789abcdef")
    m = ts.load_model(small_cnn)
    code = ts.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = ts.BuiltinOperator.CUSTOM
    code.customCode = PATCH_STAGE_OP
    m.operatorCodes.append(code)
    op = m.subgraphs[0].operators[0]
    op.opcodeIndex, op.builtinOptions, op.builtinOptionsType = len(m.operatorCodes) - 1, None, 0
    with pytest.raises(tflm.TFLMError, match="run in TFLM with tfmcu.s kernel"):
        tflm.measure_arena(ts.write_model(m))


def test_crash_is_isolated(residual):
    """An int8 SOFTMAX with a tiny input scale makes TFLM abort(); isolated, it is an error instead."""
    m = ts.load_model(residual)
    sg = m.subgraphs[0]
    softmax = [op for op in sg.operators if ts.op_name(m, op) == "SOFTMAX"][0]
    sg.tensors[int(softmax.inputs[0])].quantization.scale = np.array([1e-9], np.float32)
    with pytest.raises(tflm.TFLMError, match=r"TFLM crashed \(SIGABRT\)"):
        tflm.measure_arena(ts.write_model(m), isolate=True)
    assert tflm.measure_arena(residual, isolate=True).total == tflm.measure_arena(residual).total


# ============================================================================= running
def test_tflm_matches_tflite_reference(residual, float_input):
    """TFLM computes TF Lite's reference bytes, but for one known difference (``tfmcu.runtime.agreement``): every op
    before the FULLY_CONNECTED head gives the same bytes in both (the head's input, read back from each interpreter),
    the head's outputs are each interpreter's own requantization of the same int32 sums (TF Lite: float scales,
    rounded once; TFLM: fixed-point multiplier, rounded twice), at most 1 apart, and the ops after it (SOFTMAX,
    DEQUANTIZE) give the same bytes on the same head output. So the model outputs differ exactly on the samples
    ``head_ties`` proves to be rounding ties. Whether random inputs meet a tie depends on the bytes this host
    converted; the same model with a tie built into its head for one input (``tie_in_the_head``) meets it on any
    host."""
    from tests.support import rounded_apart, tie_in_the_head
    from tfmcu.runtime.agreement import Head, head_ties, probe_model
    from tfmcu.tflite.model import as_model

    for data in (residual, float_input):
        x = model_io.random_inputs(data, 4, seed=1)
        for model in (data, tie_in_the_head(data, x[0])):
            m = as_model(model)
            head = Head.find(m)
            assert head is not None and head.tail and m.op_names[head.op] == "FULLY_CONNECTED"
            probe = probe_model(m, [head.input, head.output])
            a, b = tflm.run_tflm(probe, x), tflite.run_tflite(probe, x)
            assert len(a) == len(b) == 4
            for u, v in zip(a, b):
                assert np.array_equal(u[1], v[1])  # the head's input: every op before the head, bit for bit
                want_tflite, want_tflm, _ = head.outputs(v[1])
                assert np.array_equal(v[2].reshape(-1), want_tflite) and np.array_equal(u[2].reshape(-1), want_tflm)
                assert np.abs(want_tflite - want_tflm).max() <= 1
            heads_apart = [k for k, (u, v) in enumerate(zip(a, b)) if not np.array_equal(u[2], v[2])]
            apart = rounded_apart(model, x)
            assert set(apart) <= set(heads_apart)  # the outputs differ only where the head's do
            outs_tflite, outs_tflm = [v[:1] for v in b], [u[:1] for u in a]
            assert sorted(head_ties(model, x, outs_tflite, outs_tflm)) == apart  # each difference a proven tie
            if model is not data:  # the built tie: 1 apart on any host
                assert 0 in heads_apart
                if m.op_names[head.tail[-1]] == "DEQUANTIZE":  # keeps it (a SOFTMAX may absorb it), so head_ties
                    assert 0 in apart  # proved the tail bit-exact on TFLM's head output
        builtin = tflite.run_tflite(data, x[:1], resolver="builtin")
        assert builtin[0][0].shape == a[0][0].shape


def test_a_difference_no_tie_explains_is_a_mismatch(float_input):
    """``head_ties`` proves a tie on the model, not on the outputs it is given: outputs that differ elsewhere, or by
    something the head's two requantizations do not give, are real mismatches (``Agreement``: not ``agree``)."""
    from tests.support import tie_in_the_head
    from tfmcu.runtime.agreement import Agreement, compare, head_ties

    x = model_io.random_inputs(float_input, 3, seed=1)
    tied = tie_in_the_head(float_input, x[0])
    a, b = tflite.run_tflite(tied, x), tflm.run_tflm(tied, x)
    assert 0 in head_ties(tied, x, a, b)
    forged = [[o.copy() for o in outs] for outs in b]
    forged[0][0].reshape(-1)[:] += 1.0  # the tied sample, every output moved
    forged[1][0].reshape(-1)[0] += 1.0  # another sample
    ties = head_ties(tied, x, a, forged)
    assert 0 not in ties and 1 not in ties
    agreement = Agreement.of(3, compare(a, forged), ties)
    assert not agreement.agree and agreement.mismatching_samples >= 2 and {0, 1} <= {m.sample for m in agreement.first}


def test_multi_input_samples(two_inputs):
    info = model_io.model_info(two_inputs)
    assert len(info.inputs) == 2 and len(info.outputs) == 2
    x = model_io.random_inputs(two_inputs, 3, seed=2)
    assert all(isinstance(s, tuple) and len(s) == 2 for s in x)
    outs = tflm.run_tflm(two_inputs, x)
    assert len(outs) == 3 and len(outs[0]) == 2
    ref = tflite.run_tflite(two_inputs, x)
    assert all(np.array_equal(p, q) for u, v in zip(outs, ref) for p, q in zip(u, v))
    with pytest.raises(tflm.TFLMError, match="has 1 arrays"):
        tflm.run_tflm(two_inputs, [x[0][:1]])


def test_random_inputs(small_cnn, float_input):
    x = model_io.random_inputs(small_cnn, 5, seed=3)
    assert len(x) == 5 and x[0][0].dtype == np.int8 and x[0][0].shape == (1, 32, 32, 3)
    assert np.array_equal(x[0][0], model_io.random_inputs(small_cnn, 1, seed=3)[0][0])
    assert x[0][0].min() < -100 and x[0][0].max() > 100
    f = model_io.random_inputs(float_input, 2, seed=0)[0][0]
    lo, hi = model_io.input_range(float_input, model_io.model_info(float_input).inputs[0])
    assert f.dtype == np.float32 and lo <= f.min() and f.max() <= hi and lo < 0 < hi
    with pytest.raises(tflm.TFLMError, match="shape"):
        tflm.run_tflm(small_cnn, [np.zeros((1, 8, 8, 3), np.int8)])
    with pytest.raises(tflm.TFLMError, match="dtype"):
        tflm.run_tflm(small_cnn, [np.zeros((1, 32, 32, 3), np.float32)])
