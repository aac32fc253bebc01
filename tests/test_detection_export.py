"""Boxes out of the device (issue 24): a yolo detector exported full int8 with its decode layers, TFLite's
TFLite_Detection_PostProcess appended (tfmcu/tflite/detection_postprocess.py), run in TF Lite, the tflite-micro wheel
and TFLM built from source, rewritten with a patch stage that keeps the head whole, verified, and deploy's firmware
sources for it.

One untrained mbv2-det-w035 at 96 px (3x3 grid, 3 anchors: 27 boxes, 10 classes), its head spread like a trained
one's (``tfmcu.train.export.spread_untrained``); score threshold 0.6, so the number of detections varies between
inputs (5 to 10 of at most 10 on these seeds), and saturated int8 scores make ties the op must break the same way.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.errors import UsageError  # noqa: E402
from tfmcu.firmware import sources  # noqa: E402
from tfmcu.flows.common import ScheduleRequest  # noqa: E402
from tfmcu.flows.deploy import DeployOptions, prepare  # noqa: E402
from tfmcu.flows.rewrite import RewriteOptions  # noqa: E402
from tfmcu.flows.rewrite import run as rewrite  # noqa: E402
from tfmcu.flows.verify import VerifyOptions, verify  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.nets.anchors import BOX_SCALES, anchor_grid, decode_boxes  # noqa: E402
from tfmcu.nets.presets import get_preset  # noqa: E402
from tfmcu.plan import regions  # noqa: E402
from tfmcu.runtime.model_io import TFLMError, model_info, random_inputs  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.runtime.tflm import run_tflm  # noqa: E402
from tfmcu.runtime.tflm_host import run_whole, runner_path  # noqa: E402
from tfmcu.tflite.editor import ModelEditor  # noqa: E402
from tfmcu.tflite.detection_postprocess import (OUTPUT_NAMES, PostprocessError, append_postprocess,  # noqa: E402
                                                detections, postprocess_outputs, read_detector,
                                                read_postprocess_options)
from tfmcu.tflite.metadata import read_metadata  # noqa: E402
from tfmcu.tflite.model import TfliteModel  # noqa: E402

RES, SEED, THRESHOLD, IOU, MAX_DET = 96, 0, 0.6, 0.5, 10


@pytest.fixture(scope="module")
def det():
    """(spec, the int8 export model without the tail, the whole detector .tflite), exported once (~20 s)."""
    from tfmcu.nets.convert import to_int8_tflite
    from tfmcu.nets.keras_builder import build_keras, detector_export_model
    from tfmcu.train.export import detector_tflite, quiet_convert, spread_untrained

    spec = get_preset("mbv2-det-w035", resolution=RES)
    model = build_keras(spec, SEED)
    images = np.random.default_rng(SEED).uniform(-1, 1, (4, RES, RES, 3)).astype(np.float32)
    spread_untrained(model, spec, images, SEED)

    def representative():
        for i in range(len(images)):
            yield [images[i:i + 1]]

    plain = quiet_convert(to_int8_tflite, detector_export_model(model, spec), representative)
    whole = detector_tflite(plain, spec, [f"obj{k}" for k in range(10)], MAX_DET, THRESHOLD, IOU)
    return spec, plain, whole


@pytest.fixture(scope="module")
def samples(det):
    return random_inputs(det[2], 6, seed=3)


def _runner_or_skip():
    try:
        return runner_path()
    except TFLMError as e:
        print(f"SKIP reason: the TFLM host runner is not built: {e}")
        pytest.skip(f"the TFLM host runner is not built: {e}")


def test_export_graph_outputs_and_metadata(det):
    spec, plain, whole = det
    ops = TfliteModel(plain).op_names
    tail = {"RESHAPE", "STRIDED_SLICE", "LOGISTIC", "MUL"}
    assert tail <= set(ops) and not {"SHAPE", "PACK"} & set(ops)  # one constant-shape RESHAPE per scale
    info = model_info(plain)
    assert [(t.shape, t.dtype) for t in info.outputs] == [((1, 27, 4), "int8"), ((1, 27, 10), "int8")]
    m = TfliteModel(whole)
    assert m.op_names[-3:] == ("DEQUANTIZE", "DEQUANTIZE", "custom:TFLite_Detection_PostProcess")
    assert [(t.name, t.shape, t.dtype) for t in m.info.outputs] == [
        ("detection_boxes", (1, MAX_DET, 4), "float32"), ("detection_classes", (1, MAX_DET), "float32"),
        ("detection_scores", (1, MAX_DET), "float32"), ("num_detections", (1,), "float32")]
    assert postprocess_outputs(m.flatbuffer) == (0, 1, 2, 3)
    # every op is one deploy's firmware and the host runner register
    assert all(op in sources.RESOLVER_METHODS or op.split(":", 1)[1] in sources.CUSTOM_RESOLVER for op in m.op_names)
    opts = read_postprocess_options(m.custom_options("TFLite_Detection_PostProcess")[0])
    assert opts == {"max_detections": MAX_DET, "max_classes_per_detection": 1, "detections_per_class": MAX_DET,
                    "use_regular_nms": False, "nms_score_threshold": THRESHOLD, "nms_iou_threshold": IOU,
                    "num_classes": 10, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    anchors = [t for t in m.flatbuffer.subgraphs[0].tensors if t.name == b"detection/anchors"]
    assert len(anchors) == 1
    assert np.array_equal(np.frombuffer(m.flatbuffer.buffers[anchors[0].buffer].data.tobytes(), np.float32)
                          .reshape(-1, 4), anchor_grid(spec))
    rec = read_detector(m.flatbuffer)
    assert rec["type"] == "detector" and rec["score_threshold"] == THRESHOLD and rec["num_anchors"] == 27
    assert rec["anchors_per_scale"] == spec.head.anchors and rec["labels"] == [f"obj{k}" for k in range(10)]
    md = read_metadata(whole)  # tflite-support's object-detector metadata, labels on the category output
    assert md["labels"] == rec["labels"]
    assert [t["name"] for t in md["subgraph_metadata"][0]["output_tensor_metadata"]] == [
        "location", "category", "score", "number of detections"]


def test_int8_encodings_and_scores_bit_exact_in_tflite_and_tflm(det, samples):
    _, plain, _ = det
    a, b = run_tflite(plain, samples), run_tflm(plain, samples)
    assert all(np.array_equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    assert np.stack([r[0] for r in a]).astype(float).std(axis=0).max() > 0  # the encodings vary


def test_op_boxes_are_the_host_decoder_on_the_dequantized_encodings(det, samples):
    """TF Lite's op output against tfmcu.nets.anchors.decode_boxes of the int8 encodings (the box contract)."""
    spec, plain, whole = det
    info = model_info(plain)
    (tb, ts_), anchors = info.outputs, anchor_grid(spec)
    where = postprocess_outputs(TfliteModel(whole).flatbuffer)
    counts = []
    for raw, out in zip(run_tflite(plain, samples), run_tflite(whole, samples)):
        enc = (raw[0].astype(np.float32).reshape(-1, 4) - np.float32(tb.zero_point)) * np.float32(tb.scale)
        scores = (raw[1].astype(np.float32).reshape(-1, 10) - np.float32(ts_.zero_point)) * np.float32(ts_.scale)
        decoded = decode_boxes(enc, anchors)
        found = detections(out, where)
        counts.append(len(found))
        assert len(found) == min(MAX_DET, len(found)) and all(d["score"] >= THRESHOLD for d in found)
        used = set()
        for d in found:
            diff = np.abs(decoded - np.asarray(d["box"])).max(axis=1)
            n = int(np.argmin(diff))
            assert diff[n] < 1e-6, diff[n]  # the op decodes in double, casts to float32
            assert n not in used and d["score"] == scores[n].max() and d["class"] == int(np.argmax(scores[n]))
            used.add(n)
        assert [d["score"] for d in found] == sorted((d["score"] for d in found), reverse=True)
        # the rest: an anchor above the threshold is either kept or overlaps a kept one by more than the IoU bound
        for n in np.flatnonzero(scores.max(axis=1) >= THRESHOLD):
            if n not in used and len(found) < MAX_DET:
                assert max(_iou(decoded[n], np.asarray(d["box"])) for d in found) > IOU
    assert len(set(counts)) > 1 and min(counts) < MAX_DET  # the number of detections varies


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_tflm_outputs_equal_tflite(det, samples):
    """All four outputs bit-exact: the wheel and TFLM built from source (90b983c) against TF Lite; entries past
    num_detections zeroed by every runner (the op leaves them unwritten)."""
    _, _, whole = det
    ref = run_tflite(whole, samples)
    assert any(int(r[3][0]) < MAX_DET for r in ref) and all(not r[0][0, int(r[3][0]):].any() for r in ref)
    for r, w in zip(ref, run_tflm(whole, samples)):
        assert all(np.array_equal(x, y) for x, y in zip(r, w))
    _runner_or_skip()
    for r, h in zip(ref, run_whole(whole, samples).outputs):
        assert all(np.array_equal(x, y) for x, y in zip(r, h))


def test_patch_stage_stops_before_the_head(det):
    _, _, whole = det
    g = from_tflite(whole, name="det")
    head = min(i for i, op in enumerate(g.ops) if op.name.startswith("head_scale"))
    assert regions.largest_prefix(g) <= head
    with pytest.raises(regions.ScheduleError, match="detection head"):
        regions.schedule(g, 1, n_ops=head + 1)
    assert max(i for i in regions.schedule(g, 2, n_blocks=regions.max_stage_blocks(g)).stage) < head


def test_rewrite_with_patches_then_verify_compares_boxes(det, tmp_path):
    _, _, whole = det
    _runner_or_skip()
    src, out = tmp_path / "det.tflite", tmp_path / "det_patched.tflite"
    src.write_bytes(whole)
    rep = rewrite(RewriteOptions(tflite=str(src), out=str(out), mode="custom", measure=False,
                                 schedule=ScheduleRequest(patches="2", patch_blocks=4)), log=lambda s: None)
    assert rep.patched
    patched = TfliteModel(out.read_bytes())
    assert patched.op_names[0] == "custom:TFMCU_PATCH_STAGE" and "CONV_2D" in patched.op_names
    assert patched.op_names[-1] == "custom:TFLite_Detection_PostProcess"
    names = [t.name for t in from_tflite(out.read_bytes(), name="p").ops]
    assert sum(n.startswith("head_scale0_") for n in names) >= 2  # the head's convs stay ops of their own
    v = verify(VerifyOptions(original=str(src), rewritten=str(out), samples=4, seed=1, quiet=True))
    assert v.bit_exact and v.tflite_vs_tflm.original.agree and v.tflite_vs_tflm.rewritten.agree
    d = v.detector
    assert d.outputs == list(OUTPUT_NAMES) and d.max_box_abs_diff == 0.0
    assert d.detections_per_sample.original == d.detections_per_sample.rewritten
    assert sum(d.detections_per_sample.original["tflite"]) > 0


def test_deploy_sources_for_a_detector(det, tmp_path):
    """deploy without --run: the resolver registers the op, the BUILD links its kernel and builds the detector's
    firmware, the expectation hashes all four outputs."""
    _, _, whole = det
    src = tmp_path / "det.tflite"
    src.write_bytes(whole)
    out = tmp_path / "fw"
    rep = prepare(DeployOptions(tflite=str(src), out_dir=str(out), num_inputs=3, kernels="reference"),
                  log=lambda s: None)
    assert "TFLite_Detection_PostProcess" in rep.ops
    assert "r.AddDetectionPostprocess()" in (out / "model" / "model_data.cc").read_text()
    build = (out / "BUILD").read_text()
    assert "@tflite_micro//:kernel_detection_postprocess" in build and f"-DTFMCU_DETECTOR_SLOTS={3 * MAX_DET}" in build
    ref = run_tflite(whole, random_inputs(whole, 3, 0))
    where = (0, 1, 2, 3)
    want = json.loads((out / "expect.json").read_text())["expect"]
    assert want == sources.detector_expectation(ref, where)
    assert want["top_class"] == [detections(r, where)[0]["class"] if int(r[3][0]) else -1 for r in ref]
    assert rep.detector.detections == sources.printed_detections(ref, where)


def test_append_postprocess_rejects_bad_arguments_in_one_line(det):
    spec, plain, _ = det
    anchors = anchor_grid(spec)
    for bad, match in ((anchors[:-1], r"anchors: expected shape \[27, 4\]"), (anchors[:, :3], r"\[27, 4\]"),
                       (anchors.reshape(1, 27, 4), r"\[27, 4\]")):
        with pytest.raises(PostprocessError, match=match) as e:
            append_postprocess(plain, bad, 10, box_scales=BOX_SCALES)
        assert "\n" not in str(e.value)
    with pytest.raises(PostprocessError, match="num_classes=3"):
        append_postprocess(plain, anchors, 3, box_scales=BOX_SCALES)
    with pytest.raises(PostprocessError, match="iou_threshold"):
        append_postprocess(plain, anchors, 10, iou_threshold=0.0, box_scales=BOX_SCALES)
    with pytest.raises(PostprocessError, match="already ends"):
        append_postprocess(det[2], anchors, 10, box_scales=BOX_SCALES)
    with pytest.raises(UsageError, match="custom op"):  # a custom op deploy has no kernel for
        sources.resolver_ops(_renamed_op(det[2]))


def _renamed_op(model: bytes) -> bytes:
    ed = ModelEditor(model)
    for code in ed.model.operatorCodes:
        if code.customCode == b"TFLite_Detection_PostProcess":
            code.customCode = b"MyPostProcess"
    return ed.to_bytes()


def test_arena_prediction_models_the_postprocess_op(det):
    """The arena predictor models TFLite_Detection_PostProcess (OpData from Init, 11 scratch buffers from Prepare):
    predicted == measured, to the byte, in the wheel (every per-type line too) and in TFLM built from source."""
    from tfmcu.plan import arena
    from tfmcu.runtime.tflm import measure_arena

    _, _, whole = det
    wheel = arena.predict_model_arena(whole, build="wheel")
    assert wheel.details["unmodelled_ops"] == [] and wheel.details["scratch_buffers"] == 11
    m = measure_arena(whole)
    assert (wheel.head, wheel.tail, wheel.total) == (m.head, m.tail, m.total)
    for kind, rec in m.by_type.items():
        assert wheel.details["by_type"].get(kind) == {"used": rec.used, "requested": rec.requested,
                                                       "count": rec.count}, kind
    _runner_or_skip()
    host = arena.predict_model_arena(whole, build="host")
    assert host.details["unmodelled_ops"] == []
    assert run_whole(whole, random_inputs(whole, 1, seed=0)).arena.arena_used_bytes == host.total


def test_latency_prediction_prices_the_postprocess_op(det):
    """The latency predictor takes a detector: the op's features are its anchors, box encodings and scores, and
    every core and kernel set gives it a positive cost (so fit can price detectors)."""
    from tfmcu.plan import latency

    _, _, whole = det
    feats = latency.op_features(whole)
    [f] = [f for f in feats if f["type"] == "custom:TFLite_Detection_PostProcess"]
    boxes = [o for o in feats if o["op"] < f["op"]]
    assert f["out"] > 0 and f["inp"] == 4 * f["out"] and f["inner"] % f["out"] == 0 and boxes
    for core in latency.CORES:
        for kernels in latency.KERNELS:
            p = latency.predict_instructions(whole, core, kernels)
            assert p.per_op[f["op"]]["type"] == "custom:TFLite_Detection_PostProcess"
            assert p.per_op[f["op"]]["instructions"] > 0 and p.instructions > p.per_op[f["op"]]["instructions"]
