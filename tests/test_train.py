"""tfmcu.train / pipelines.train, the classification task: a few training steps on a tiny subset, QAT, int8 export
with metadata, TF Lite vs TFLM agreement, the typed report, determinism and --resume, checkpoint corruption, specs
that do not fit the data, QAT configs, --help."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from tfmcu import train
from tfmcu.data import classify
from tfmcu.nets.spec import HeadSpec
from tfmcu.train import TrainReport
from tests.support import MIRRORED_PREAMBLE, fake_idx_set, interrupted, run_python, tiny_spec, without_seconds

HAVE_FASHION = os.path.isfile(os.path.join(classify.FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    spec_path = root / "tiny.json"
    spec_path.write_text(tiny_spec().to_json())
    data_dir = None
    if not HAVE_FASHION:  # a synthetic stand-in keeps the test meaningful where the Debian package is missing
        data_dir = fake_idx_set(root / "fake", n_train=400, n_test=100, gz=False)
    return root, str(spec_path), data_dir


def config(spec_path: str, data_dir, **kw) -> train.TrainConfig:
    recipe = train.Recipe(epochs=2, qat_epochs=1, batch_size=16, lr=0.05, bn_recalibration_batches=2)
    base = dict(model=spec_path, dataset="fashion_mnist", data_dir=data_dir, recipe=recipe, val_split=32,
                train_subset=96, steps_per_epoch=3, qat_steps_per_epoch=2, test_subset=64, int8_eval_samples=48,
                calibration_samples=16, seed=3, verbose=0)
    base.update(kw)
    return train.TrainConfig(**base)


@pytest.fixture(scope="module")
def run_a(workdir):
    root, spec_path, data_dir = workdir
    out = root / "a"
    report = train.train(config(spec_path, data_dir), str(out), log=lambda m: None)
    return out, report


def test_train_qat_export_and_agreement(run_a):
    out, r = run_a
    for key in ("tflite", "spec", "labels", "report", "curves", "confusion"):
        assert os.path.isfile(r.files[key]), key
    assert [e["epoch"] for e in r.history.float] == [1, 2]
    assert [e["epoch"] for e in r.history.qat] == [1]
    c = r.classification
    acc = c.accuracy
    for v in (acc.float, acc.qat, acc.int8_tflite, acc.int8_tflm):
        assert 0.0 <= v <= 1.0
    assert acc.int8_test_samples == 48 and acc.keras_test_samples == 64
    # TF Lite (reference kernels) and TFLM agree sample for sample on any host: every difference but a rounding tie
    # in a FULLY_CONNECTED head would be a mismatch, and the classifier is a 1x1 CONV_2D (no FULLY_CONNECTED: see
    # below), which both requantize alike. So the two accuracies are equal.
    a = c.tflite_vs_tflm
    assert a.agree and a.mismatching_samples == 0 and a.tie_samples == 0 and a.samples == 48 and r.agree
    assert acc.int8_tflite == acc.int8_tflm
    m = c.memory
    assert m.analytic_peak_bytes > 0 and m.tflm_arena_bytes >= m.analytic_peak_bytes * 0.5
    assert c.macs > 0 and c.flash_bytes > c.flash_bytes_without_metadata
    assert sum(map(sum, c.confusion_matrix)) == 48
    with open(r.files["report"]) as f:
        on_disk = json.load(f)
    assert on_disk["accuracy"]["int8_tflm"] == acc.int8_tflm and on_disk["tflite_vs_tflm"]["samples"] == 48
    assert TrainReport.from_json(on_disk) == r  # the JSON holds the whole typed report
    assert r.to_json() == on_disk and TrainReport.from_json(r.to_json()) == r  # what the run wrote, read back
    assert r.detection is None and r.task == "classify" and "int8 TFLM" in r.summary()
    with open(r.files["curves"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_rounding_tie_in_a_fully_connected_head_is_no_disagreement(workdir, monkeypatch):
    """With the converter's FULLY_CONNECTED classifier (``classifier_as_conv=False``), TF Lite and TFLM may round a
    logit 1 apart. A tie built into the exported head for the first int8 test sample (tests/support.py:
    tie_in_the_head) makes it certain on any host: the report counts that sample as a proven rounding tie, not a
    disagreement, so the run agrees (``pipelines.train`` exits 0) and says so."""
    from tests.support import tie_in_the_head
    from tfmcu.data.classify import eval_dataset
    from tfmcu.data.split import subset
    from tfmcu.train.classify import ClassifyTask
    from tfmcu.train.export import quantize_inputs

    real_export = ClassifyTask.export

    def export_with_a_tie(self, cfg, inputs, trained, qat, log):
        exported = real_export(self, cfg, inputs, trained, qat, log)
        part = subset(inputs.dataset.test, cfg.int8_eval_samples, cfg.seed)  # evaluate_int8's first sample
        x, _ = next(iter(eval_dataset(part, inputs.resolution, inputs.channels, 1)))
        first = quantize_inputs(exported.model, x.numpy())
        return dataclasses.replace(exported, model=tie_in_the_head(exported.model, (first,)))

    monkeypatch.setattr(ClassifyTask, "export", export_with_a_tie)
    root, spec_path, data_dir = workdir
    cfg = config(spec_path, data_dir, classifier_as_conv=False, int8_eval_samples=8, qat_steps_per_epoch=1,
                 recipe=train.Recipe(epochs=1, qat_epochs=0, batch_size=16, lr=0.05, bn_recalibration_batches=1))
    r = train.train(cfg, str(root / "tie"), log=lambda m: None)
    a = r.classification.tflite_vs_tflm
    assert a.agree and r.agree and a.mismatching_samples == 0 and a.samples == 8
    assert 0 in {t.sample for t in a.ties} and a.tie_samples >= 1 and not a.identical
    assert all(abs(t.tflite - t.tflm) == 1 for t in a.ties)
    assert "1 apart by a rounding tie in the FULLY_CONNECTED head" in r.summary()


def test_exported_model_is_full_int8_with_metadata(run_a):
    from tfmcu.runtime import model_io as tflm
    from tfmcu.tflite import metadata
    from tfmcu.tflite import schema as ts

    _, r = run_a
    model = open(r.files["tflite"], "rb").read()
    info = tflm.model_info(model)
    assert [t.dtype for t in info.inputs] == ["int8"] and [t.dtype for t in info.outputs] == ["int8"]
    assert info.inputs[0].shape == (1, 32, 32, 3) and info.outputs[0].shape == (1, 10)
    m = ts.load_model(model)
    ops = {ts.op_name(m, op) for op in m.subgraphs[0].operators}
    assert "FULLY_CONNECTED" not in ops and {"CONV_2D", "DEPTHWISE_CONV_2D", "MEAN", "RESHAPE"} <= ops
    assert "QUANTIZE" not in ops and "DEQUANTIZE" not in ops
    md = metadata.read_metadata(model)
    assert md["labels"] == classify.FASHION_MNIST_LABELS
    assert metadata.normalization(md) == ([127.5] * 3, [127.5] * 3)
    assert md["name"] == "tiny"


def test_rewritten_model_keeps_metadata(run_a):
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.plan import regions as scheduler
    from tfmcu.runtime import model_io, tflm
    from tfmcu.stage import builtin as rewrite
    from tfmcu.tflite import metadata

    _, r = run_a
    model = open(r.files["tflite"], "rb").read()
    graph = from_tflite(model)
    res = rewrite.rewrite_builtin(model, graph, scheduler.schedule(graph, 2, n_blocks=2))
    assert metadata.read_metadata(res.model)["labels"] == classify.FASHION_MNIST_LABELS
    xs = model_io.random_inputs(model, 3, seed=0)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(tflm.run_tflm(model, xs), tflm.run_tflm(res.model, xs)))


def test_resume_after_interruption_matches_uninterrupted_run(run_a, workdir, monkeypatch):
    """Deterministic: a run stopped after float epoch 1 and resumed ends with the same numbers and the same
    .tflite bytes as the uninterrupted run with the same seed."""
    root, spec_path, data_dir = workdir
    out_a, ra = run_a
    out = root / "b"
    interrupted(monkeypatch, lambda: train.train(config(spec_path, data_dir), str(out), log=lambda m: None))
    state = json.loads((out / "checkpoints" / "state.json").read_text())
    assert (state["phase"], state["epoch"]) == ("float", 1)

    logs = []
    rb = train.train(config(spec_path, data_dir, resume=True), str(out), log=logs.append)
    assert any("resumed after float epoch 1" in m for m in logs)
    assert without_seconds(ra.history) == without_seconds(rb.history)
    assert ra.classification.accuracy == rb.classification.accuracy
    assert open(ra.files["tflite"], "rb").read() == open(rb.files["tflite"], "rb").read()


def test_corrupted_checkpoints(run_a, workdir, tmp_path):
    import shutil

    root, spec_path, data_dir = workdir
    out_a, _ = run_a
    # 1. unreadable state file
    bad = tmp_path / "bad_state"
    shutil.copytree(out_a / "checkpoints", bad / "checkpoints")
    (bad / "checkpoints" / "state.json").write_text("{not json")
    with pytest.raises(train.TrainError, match="corrupted checkpoint state") as e:
        train.train(config(spec_path, data_dir, resume=True), str(bad), log=lambda m: None)
    assert "\n" not in str(e.value)
    # 2. truncated checkpoint data
    trunc = tmp_path / "truncated"
    shutil.copytree(out_a / "checkpoints", trunc / "checkpoints")
    state = json.loads((trunc / "checkpoints" / "state.json").read_text())
    for f in os.listdir(trunc / "checkpoints"):
        if f.startswith(state["checkpoint"] + ".data"):
            p = trunc / "checkpoints" / f
            p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(train.TrainError, match="corrupted or incompatible") as e:
        train.train(config(spec_path, data_dir, resume=True), str(trunc), log=lambda m: None)
    assert "\n" not in str(e.value)
    # 3. a checkpoint of other settings
    other = tmp_path / "other"
    shutil.copytree(out_a / "checkpoints", other / "checkpoints")
    with pytest.raises(train.TrainError, match="another model, data set or recipe"):
        train.train(config(spec_path, data_dir, resume=True, seed=4), str(other), log=lambda m: None)


@pytest.mark.parametrize("change,message", [
    (dict(num_classes=5), "the spec has 5 classes"),
    (dict(num_classes=0), "no classifier"),
    (dict(in_channels=2), "2-channel input"),
])
def test_spec_that_does_not_fit_the_data(workdir, tmp_path, change, message):
    _, _, data_dir = workdir
    spec = tiny_spec(num_classes=change.get("num_classes", 10), in_channels=change.get("in_channels", 3))
    if change.get("num_classes") == 0:
        spec = spec.replace(head=HeadSpec(last_channels=0, num_classes=0, pooling="avg"))
    p = tmp_path / "s.json"
    p.write_text(spec.to_json())
    with pytest.raises(train.TrainError, match=message):
        train.train(config(str(p), data_dir), str(tmp_path / "o"), log=lambda m: None)


def test_recipe_validation():
    with pytest.raises(train.TrainError, match="nothing to train"):
        train.Recipe(epochs=0, qat_epochs=0).validate()
    with pytest.raises(train.TrainError, match="label_smoothing"):
        train.Recipe(label_smoothing=1.5).validate()
    assert train.Recipe().validate().weight_decay == 4e-5


def test_qat_of_squeeze_excite_needs_a_config():
    """tfmot's default registry lacks Multiply (squeeze-excite): quantize() annotates it by configuration."""
    import tensorflow_model_optimization as tfmot

    from tfmcu.nets.keras_builder import build_keras

    model = build_keras(tiny_spec(se=0.25), seed=0)
    with pytest.raises(RuntimeError, match="Multiply"):
        tfmot.quantization.keras.quantize_model(model)
    qat, notes = train.quantize(model)
    assert notes and "Multiply" in notes[0]
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    assert qat(x).shape == (2, 10)
    plain, _ = train.quantize(build_keras(tiny_spec(), seed=0))
    assert any(type(layer).__name__ == "QuantizeWrapperV2" for layer in plain.layers)


def test_cli_bad_dataset_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    for dataset, message in ((str(tmp_path / "empty"), "no class folders"),
                             (str(tmp_path / "missing"), "not fashion_mnist, mnist or an existing folder"),
                             ("scenes:canvas=64,colour=red", "'colour=red' is not key=value")):
        proc = run_python("-m", "pipelines.train", f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}")
        assert proc.returncode == 2, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    proc = run_python("-m", "pipelines.train", f"--data_dir={tmp_path / 'nope'}", f"--out_dir={tmp_path / 'out'}")
    assert proc.returncode == 2 and "apt-get install dataset-fashion-mnist" in proc.stderr


MIRRORED_SCRIPT = MIRRORED_PREAMBLE + """
spec_path, data_dir, out = sys.argv[1], (sys.argv[2] or None), sys.argv[3]
recipe = train.Recipe(epochs=1, qat_epochs=1, batch_size=16, lr=0.05, bn_recalibration_batches=2)
cfg = train.TrainConfig(model=spec_path, data_dir=data_dir, recipe=recipe, val_split=32, train_subset=64,
                        steps_per_epoch=2, qat_steps_per_epoch=2, test_subset=32, int8_eval_samples=16,
                        calibration_samples=8, strategy="mirrored", verbose=0)
r = train.train(cfg, out, log=lambda m: None)
print(json.dumps({"strategy": r.strategy.name, "replicas": r.strategy.replicas, "agree": r.agree}))
"""


def test_mirrored_strategy_two_replicas(workdir, tmp_path):
    """--strategy=mirrored end to end (float, BN re-calibration, QAT, export) on two logical CPU devices."""
    _, spec_path, data_dir = workdir
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    proc = run_python(str(script), spec_path, data_dir or "", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"strategy": "mirrored", "replicas": 2, "agree": True}


def test_cli_spec_that_does_not_fit_is_one_line_exit_2(workdir, tmp_path):
    _, _, data_dir = workdir
    p = tmp_path / "five.json"
    p.write_text(tiny_spec(num_classes=5).to_json())
    args = ["-m", "pipelines.train", f"--model={p}", f"--out_dir={tmp_path / 'out'}"]
    if data_dir:
        args.append(f"--data_dir={data_dir}")
    proc = run_python(*args)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the spec has 5 classes" in lines[0] and "head.num_classes to 10" in lines[0]


def test_cli_help_shows_each_tasks_defaults():
    """The training flags default to the task's own settings (``tfmcu.train.default_config``); --help says which."""
    proc = run_python("-m", "pipelines.train", "--help")  # (absl's --help exits with status 1)
    text = " ".join(proc.stdout.split())
    d, c = train.default_config("detection"), train.default_config("classify")
    assert f"--epochs: Float training epochs (classify: {c.recipe.epochs}, detection: {d.recipe.epochs}, demo: 2)" \
        in text
    assert f"(classify: {c.recipe.batch_size}, detection: {d.recipe.batch_size}, demo: 128)" in text
    assert f"--momentum: SGD momentum (default {c.recipe.momentum})" in text

