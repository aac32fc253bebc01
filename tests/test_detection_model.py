"""The yolo head (issue 24, the model): spec JSON and validation, Keras outputs, IR = Keras / TFLite lowering,
profiler and scheduler on a detector, presets, and k-means anchors (tfmcu.nets.anchors)."""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_spec import from_spec  # noqa: E402
from tfmcu.nets.anchors import AnchorError, anchor_fit, kmeans_anchors, split_anchors, wh_iou  # noqa: E402
from tfmcu.nets.presets import PRESETS, get_preset  # noqa: E402
from tfmcu.nets.spec import (BlockSpec, HeadSpec, NetSpec, SpecError, StageSpec, StemSpec,  # noqa: E402
                             YOLO_FIELDS)
from tfmcu.plan.profiler import profile  # noqa: E402
from tfmcu.plan.regions import max_stage_blocks, schedule  # noqa: E402

ONE = [[[0.2, 0.3], [0.5, 0.5]]]
TWO = [[[0.4, 0.4], [0.8, 0.7], [0.9, 1.0]], [[0.1, 0.1], [0.2, 0.25], [0.3, 0.2]]]


def det(anchors=ONE, head_channels=16, num_classes=3, padding="same", res=64) -> NetSpec:
    """Final output stride 16 (4x4 at 64 px), block 4 the last at stride 8: scales at 16 and 8 (MobileNetV2: 32, 16)."""
    stages = [StageSpec([BlockSpec(16, kernel=3, expand=1, stride=1)]),
              StageSpec([BlockSpec(24, kernel=5, expand=4, stride=2), BlockSpec(24, kernel=3, expand=3)]),
              StageSpec([BlockSpec(32, kernel=3, expand=6, stride=2, se=0.25)]),
              StageSpec([BlockSpec(40, kernel=3, expand=3, stride=2)])]
    return NetSpec("det", res, padding=padding, stem=StemSpec(8, 3, 2), stages=stages,
                   head=HeadSpec.yolo(num_classes, anchors, head_channels=head_channels)).validate()


SPECS = {
    "1scale": det(ONE),
    "2scales": det(TWO),
    "2scales_no_head_conv_symmetric": det(TWO, head_channels=0, padding="symmetric", res=66),
}


# ============================================================================ spec
def test_yolo_json_round_trip_holds_only_its_fields():
    for spec in SPECS.values():
        d = json.loads(spec.to_json())
        assert list(d["head"]) == ["type", "num_classes", "activation", "anchors", "head_channels"]
        assert NetSpec.from_json(spec.to_json()) == spec
    d = json.loads(SPECS["2scales"].to_json())["head"]
    assert d == {"type": "yolo", "num_classes": 3, "activation": "relu6", "anchors": TWO, "head_channels": 16}
    h = SPECS["2scales"].head
    assert (h.last_channels, h.pooling, h.scale_last_channels) == (0, "none", False)


def test_classify_json_unchanged():
    """A classify spec reads and writes exactly what it did before yolo heads (no type / anchors keys)."""
    old = ('{"name": "tiny", "resolution": 32, "in_channels": 3, "width_multiplier": 1.0, "padding": "same", '
           '"stem": {"out_channels": 8, "kernel": 3, "stride": 2, "activation": "relu6"}, "stages": [{"blocks": '
           '[{"out_channels": 8, "kernel": 3, "expand": 2, "stride": 1, "width": 1.0, "se": 0.0, "activation": '
           '"relu6", "groups": 1, "residual": true}]}], "head": {"last_channels": 16, "pooling": "avg", '
           '"num_classes": 10, "scale_last_channels": false, "activation": "relu6"}, "divisor": 8}')
    spec = NetSpec.from_json(old)
    assert spec.head.type == "classify" and spec.head.anchors == [] and spec.detection_scales() == []
    assert spec.to_json(indent=None) == old
    for name, builder in PRESETS.items():
        s = builder()
        if s.head.type == "classify":
            assert set(s.to_dict()["head"]) == {"last_channels", "pooling", "num_classes", "scale_last_channels",
                                                "activation"}, name


def _yolo_json(**head) -> str:
    d = json.loads(det(TWO).to_json())
    d["head"].update(head)
    return json.dumps(d)


@pytest.mark.parametrize("head,field", [
    ({"anchors": []}, "head.anchors"),
    ({"anchors": TWO + ONE}, "head.anchors"),
    ({"anchors": [[]]}, "head.anchors[0]"),
    ({"anchors": [[[0.2, 0.3]], [[0.1]]]}, "head.anchors[1][0]"),
    ({"anchors": [[[0.2, 0.3]], [[0.1, 0.2], [0.0, 0.1]]]}, "head.anchors[1][1]"),
    ({"anchors": [[[0.2, 1.5]]]}, "head.anchors[0][0]"),
    ({"anchors": [[[0.2, "big"]]]}, "head.anchors[0][0]"),
    ({"anchors": [[0.2, 0.3]]}, "head.anchors[0][0]"),
    ({"num_classes": 0}, "head.num_classes"),
    ({"head_channels": -1}, "head.head_channels"),
    ({"type": "ssd"}, "head.type"),
    ({"pooling": "avg"}, "head.pooling"),
    ({"last_channels": 1280}, "head.last_channels"),
    ({"scale_last_channels": True}, "head.scale_last_channels"),
    ({"type": "classify", "last_channels": 16, "pooling": "avg"}, "head.anchors"),
    ({"type": "classify", "last_channels": 16, "pooling": "avg", "anchors": []}, "head.head_channels"),
])
def test_bad_yolo_heads_are_one_line_spec_errors(head, field):
    with pytest.raises(SpecError) as e:
        NetSpec.from_json(_yolo_json(**head))
    msg = str(e.value)
    assert f"'{field}'" in msg and "\n" not in msg, msg


def test_second_scale_needs_a_block_at_half_the_final_stride():
    spec = det(ONE)
    flat = spec.replace(stem=StemSpec(8, 3, 1),
                        stages=[StageSpec([BlockSpec(16, stride=1)]), StageSpec([BlockSpec(24, stride=1)])])
    flat.validate()  # 1 scale at output stride 1: fine
    with pytest.raises(SpecError, match="'head.anchors' must be 1 scale for this backbone"):
        flat.replace(head=HeadSpec.yolo(3, TWO)).validate()


def test_detection_scales():
    one, two = SPECS["1scale"].detection_scales(), SPECS["2scales"].detection_scales()
    assert [(s.index, s.block, s.stride, s.grid, s.channels) for s in one] == [(0, 5, 16, 4, 2 * (5 + 3))]
    # Scale 1 reads block 4 (the last at half the final stride), not block 3 (stride 4).
    assert [(s.block, s.stride, s.grid, s.channels) for s in two] == [(5, 16, 4, 24), (4, 8, 8, 24)]
    assert two[1].anchors == tuple(tuple(a) for a in TWO[1]) and len(YOLO_FIELDS) == 5
    assert [s.name for s in two] == ["head_scale0", "head_scale1"]


# ============================================================================ Keras and the IR
def assert_same_graph(got: ir.Graph, want: ir.Graph) -> None:
    """As tests/test_lower_keras.py compares classifiers: every op field, tensors, outputs and blocks."""
    assert [o.name for o in got.ops] == [o.name for o in want.ops]
    for a, b in zip(got.ops, want.ops):
        assert a == b, a.name
    assert got.tensors == want.tensors
    assert got.inputs == want.inputs and got.outputs == want.outputs
    assert got.block_names == want.block_names and got.name == want.name


@pytest.mark.parametrize("key", list(SPECS))
def test_keras_outputs_and_ir_equal_from_spec(key):
    from tfmcu.graph.from_keras import from_keras
    from tfmcu.nets.keras_builder import build_keras

    spec = SPECS[key]
    scales = spec.detection_scales()
    model = build_keras(spec, seed=0)
    want = [(None, s.grid, s.grid, s.channels) for s in scales]
    assert model.output_shape == (want[0] if len(want) == 1 else want)
    assert model.output_names == [f"head_scale{i}_pred" for i in range(len(scales))]
    assert model.name == "det"
    pred = model.get_layer("head_scale0_pred")
    assert pred.use_bias and pred.activation.__name__ == "linear" and pred.kernel_size == (1, 1)
    g = from_spec(spec)
    assert_same_graph(from_keras(model), g)
    head = [op for op in g.ops if op.block == g.num_blocks - 1]
    assert g.block_name(g.num_blocks - 1) == "head" and all(op.type == ir.CONV for op in head)
    assert [g.tensors[t].shape for t in g.outputs] == [(1, s.grid, s.grid, s.channels) for s in scales]
    y = model(np.random.default_rng(0).normal(size=(2, spec.resolution, spec.resolution, 3)).astype("float32"))
    y = y if isinstance(y, list) else [y]
    assert [tuple(t.shape) for t in y] == [(2, s.grid, s.grid, s.channels) for s in scales]
    # the objectness biases start at the prior (logit(OBJ_PRIOR)), the box and class biases at 0
    from tfmcu.nets.keras_builder import OBJ_PRIOR
    from tfmcu.nets.spec import YOLO_FIELDS

    fields = len(YOLO_FIELDS) + spec.head.num_classes
    for i, s in enumerate(scales):
        bias = model.get_layer(f"head_scale{i}_pred").get_weights()[1].reshape(-1, fields)
        assert bias.shape[0] == len(s.anchors)
        obj = YOLO_FIELDS.index("obj")
        np.testing.assert_allclose(1 / (1 + np.exp(-bias[:, obj])), OBJ_PRIOR, rtol=1e-5)
        assert not np.delete(bias, obj, axis=1).any()


@pytest.mark.parametrize("key", ["1scale", "2scales"])
def test_int8_tflite_lowers_like_the_spec(key, int8_tflite):
    """Same MAC ops, windows, blocks and output shapes from the int8 .tflite as from the spec. (The converter does not
    keep Keras's output order; the signature names the outputs.)"""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.nets.keras_builder import build_keras

    spec = SPECS[key]
    model = build_keras(spec, seed=3)
    for layer in model.layers:  # non-zero biases, so that the converter keeps every one
        if layer.name.endswith("_pred"):
            layer.bias.assign(np.linspace(-1, 1, layer.bias.shape[0]).astype(np.float32))
    g, ref = from_tflite(int8_tflite(model)), from_spec(spec)
    assert g.block_names == ref.block_names
    macs = [op for op in g.ops if op.type in (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED)]
    ref_macs = [op for op in ref.ops if op.type in (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED)]
    assert [op.name for op in macs] == [op.name for op in ref_macs]
    for a, b in zip(macs, ref_macs, strict=True):
        assert (a.kernel, a.stride, a.padding, a.in_channels, a.out_channels, a.weights, a.biases, a.block) == \
            (b.kernel, b.stride, b.padding, b.in_channels, b.out_channels, b.weights, b.biases, b.block), b.name
        assert (a.activation == b.activation) or b.activation == "sigmoid", b.name
        assert ir.op_macs(g, a) == ir.op_macs(ref, b), b.name
    assert sorted(g.tensors[t].shape for t in g.outputs) == sorted(ref.tensors[t].shape for t in ref.outputs)
    assert all(g.tensors[t].dtype == "int8" for t in g.outputs)


# ============================================================================ profiler and scheduler
def test_profiler_counts_the_head_and_the_held_stride16_map():
    spec = get_preset("mbv2-det2-w035")
    g = from_spec(spec)
    prof = profile(g)
    head = prof.blocks[-1]
    assert head.name == "head" and head.index == g.num_blocks - 1 == spec.num_blocks
    # 1x1 conv 112 -> 128 and 128 -> 45 at 5x5; 32 -> 128 and 128 -> 45 at 10x10.
    assert head.macs == 25 * (112 * 128 + 128 * 45) + 100 * (32 * 128 + 128 * 45) > 0
    assert prof.macs == sum(ir.op_macs(g, op) for op in g.ops)
    tap = g.ops[max(i for i, op in enumerate(g.ops) if op.block == 13)].outputs[0]
    assert g.tensors[tap].shape == (1, 10, 10, 32)
    assert all(tap in layer.alive for layer in prof.layers if 14 <= layer.block <= 16)


@pytest.mark.parametrize("name,largest", [("mbv2-det-w035", 18), ("mbv2-det2-w035", 14)])
def test_patch_stage_stays_before_the_head(name, largest):
    """The head is the last block, so a stage of blocks never holds it; with 2 scales a stage cannot pass block 13
    either (its stride-16 output would be a second stage output at another resolution)."""
    g = from_spec(get_preset(name))
    assert max_stage_blocks(g) == largest and g.num_blocks == 19
    s = schedule(g, 4, n_blocks=5)
    assert s.peak_sram_bytes < profile(g).peak_sram_per_layer_bytes


# ============================================================================ presets
def test_detector_presets():
    one, two = get_preset("mbv2-det-w035"), get_preset("mbv2-det2-w035")
    assert (one.resolution, one.width_multiplier, one.head.num_classes) == (160, 0.35, 10)
    assert [(s.grid, s.channels, len(s.anchors)) for s in one.detection_scales()] == [(5, 45, 3)]
    assert [(s.stride, s.grid) for s in two.detection_scales()] == [(32, 5), (16, 10)]
    assert one.resolve() == two.resolve() == get_preset("mbv2", width=0.35, resolution=160).resolve()
    small, large = (np.prod(np.array(a), axis=1) for a in reversed(two.head.anchors))
    assert small.max() < large.min()  # the finer scale has the smaller anchors
    assert get_preset("mbv2-det-w035", num_classes=2, resolution=96).detection_scales()[0].channels == 3 * 7
    one.head.anchors[0][0][0] = 0.5  # the preset's defaults are copied, not shared
    assert get_preset("mbv2-det-w035").head.anchors[0][0][0] == 0.0625


# ============================================================================ anchors
def three_clusters(n: int = 300, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    centres = np.array([[0.05, 0.08], [0.2, 0.12], [0.5, 0.6]])
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    return centres[labels] * rng.uniform(0.93, 1.07, (n, 2)), centres


def test_kmeans_anchors_recovers_clusters_deterministically():
    boxes, centres = three_clusters()
    a = kmeans_anchors(boxes, 3, seed=0)
    assert a.shape == (3, 2)
    np.testing.assert_array_equal(a, kmeans_anchors(boxes, 3, seed=0))
    areas = a[:, 0] * a[:, 1]
    assert np.all(np.diff(areas) > 0)  # sorted by area
    np.testing.assert_allclose(a, centres, rtol=0.03)
    assert anchor_fit(boxes, a) > 0.9
    five = kmeans_anchors(boxes, 5, seed=4)
    assert five.shape == (5, 2) and np.all(np.diff(five[:, 0] * five[:, 1]) >= 0)
    assert anchor_fit(boxes, five) >= anchor_fit(boxes, a) - 1e-9


def test_wh_iou_and_split_anchors():
    np.testing.assert_allclose(wh_iou([[1, 1], [2, 1]], [[1, 1], [1, 2]]), [[1, 0.5], [0.5, 1 / 3]])
    anchors = np.array([[0.5, 0.5], [0.05, 0.05], [0.3, 0.2], [0.1, 0.1], [0.2, 0.2], [0.08, 0.12]])
    two = split_anchors(anchors, 2)  # coarsest scale first, each sorted by area
    assert two == [[[0.2, 0.2], [0.3, 0.2], [0.5, 0.5]], [[0.05, 0.05], [0.08, 0.12], [0.1, 0.1]]]
    assert split_anchors(anchors[:5], 2) == [[[0.2, 0.2], [0.3, 0.2], [0.5, 0.5]], [[0.05, 0.05], [0.1, 0.1]]]
    assert split_anchors(anchors, 1) == [sorted(anchors.tolist(), key=lambda a: a[0] * a[1])]
    det(two).validate()  # spec-ready lists of floats


@pytest.mark.parametrize("call,match", [
    (lambda: kmeans_anchors(np.ones((4, 3)), 2), "shape"),
    (lambda: kmeans_anchors(np.array([[0.1, 0.0]]), 1), "> 0"),
    (lambda: kmeans_anchors(np.array([[0.1, 0.1]] * 5), 2), "distinct"),
    (lambda: kmeans_anchors(np.array([[0.1, 0.1]]), 0), "k=0"),
    (lambda: split_anchors(np.array([[0.1, 0.1]]), 2), "scales=2"),
])
def test_anchor_errors_are_one_line(call, match):
    with pytest.raises(AnchorError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
