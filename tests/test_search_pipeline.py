"""pipelines/search.py end to end on a tiny configuration (a few minutes): supernet, evolution under the predicted
TFLM arena, the winner's spec and weights; then pipelines/train.py fine-tunes it from those weights to int8, and
pipelines/rewrite.py + verify patch it bit-exactly. Bad flags are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tfmcu.train.report import TrainReport
from tests.support import fake_idx_set, free_ports
from tests.support import tiny_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
SCENES = "scenes:canvas=48,object_px=10-20,train=64,val=24,test=24"


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=900)


def test_search_then_finetune_rewrite_verify(tmp_path):
    data_dir = fake_idx_set(tmp_path / "idx", n_train=120, n_test=30)
    base = tmp_path / "base.json"
    base.write_text(tiny_spec().to_json())
    out = tmp_path / "search"
    common = [f"--base={base}", f"--dataset={SCENES}", f"--data_dir={data_dir}", "--kernel_sizes=3,5",
              "--expands=3,6", "--depths=1,2", "--widths=0.5,1.0", "--resolutions=32,48", "--largest_epochs=1",
              "--supernet_epochs=1", "--supernet_batch_size=16", "--supernet_steps_per_epoch=2",
              "--calibration_batches=2", "--calibration_batch_size=16",
              "--population=2", "--parents=1", "--mutations=1", "--crossovers=0", "--iterations=1",
              "--sram_kb=64", "--flash_kb=256", "--grids=1,2", "--search_workers=1", f"--out_dir={out}"]
    r = run("pipelines.search", *common)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "joint: held-out accuracy" in r.stdout
    report = json.loads((out / "search_report.json").read_text())
    best = report["searches"]["joint"]["best"]
    assert best["arena_bytes"] <= 64 * 1024 and best["flash_bytes"] <= 256 * 1024 and 0 <= best["accuracy"] <= 1
    schedule = json.loads((out / "best_schedule.json").read_text())
    assert schedule["arena_bytes"] == best["arena_bytes"] and (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # The per-layer-only search's winner too (p = 1), with its own spec and weights.
    assert "per_layer: held-out accuracy" in r.stdout and report["searches"]["per_layer"]["best"]["grid"] == [1, 1]
    assert json.loads((out / "best_per_layer_schedule.json").read_text())["grid"] == [1, 1]
    assert (out / "best_per_layer.json").is_file() and (out / "best_per_layer.weights.h5").stat().st_size > 0
    # (Resuming: tests/test_evolution.py and tests/test_nas.py.)

    ft = tmp_path / "ft"
    r = run("pipelines.train", f"--model={out / 'best.json'}", f"--init_weights={out / 'best.weights.h5'}",
            f"--dataset={SCENES}", f"--data_dir={data_dir}", "--epochs=1", "--qat_epochs=0", "--batch_size=16",
            "--steps_per_epoch=2", "--int8_eval_samples=16", "--test_subset=16", "--calibration_samples=16",
            "--bn_recalibration_batches=1", f"--out_dir={ft}", "--noprogress")
    assert r.returncode == 0, r.stderr[-3000:]
    train_report = TrainReport.read(str(ft / "train_report.json"))
    # TF Lite and TFLM agree on any host: the classifier is a 1x1 CONV_2D, so no rounding tie, and any other
    # difference would be a mismatch (tfmcu.runtime.agreement)
    agreement = train_report.classification.tflite_vs_tflm
    assert agreement.agree and agreement.identical and train_report.agree
    d = train_report.dataset  # the scenes' own validation split, not --val_split
    assert d.name.startswith("Scenes") and (d.train, d.validation, d.test) == (64, 24, 24)
    assert d.info["scenes"]["canvas"] == 48 and d.resolution == best["resolution"]
    patched = tmp_path / "patched.tflite"
    r = run("pipelines.rewrite", f"--tflite={ft / 'model_int8.tflite'}", f"--out={patched}", "--mode=custom",
            "--patches=2", "--patch_blocks=2")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("pipelines.verify", f"--original={ft / 'model_int8.tflite'}", f"--rewritten={patched}", "--samples=4")
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]

    # Weights of another spec: one line, exit 2.
    r = run("pipelines.train", f"--model={base}", f"--init_weights={out / 'best.weights.h5'}",
            f"--dataset={SCENES}", f"--data_dir={data_dir}", "--epochs=1", "--qat_epochs=0", "--batch_size=16",
            f"--out_dir={ft}2")
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1 and "--init_weights" in errors[0] and "not weights of this model" \
        in errors[0] and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_multi_worker_search(tmp_path):
    """docs/search.md's several-machines recipe on one machine: two processes, --strategy=multi_worker with TF_CONFIG;
    the supernet trains on both (gradients all-reduced), only the chief searches and writes; the outputs then
    resume on one process with the default strategy (nothing trained or searched again)."""
    data_dir = fake_idx_set(tmp_path / "idx", n_train=120, n_test=30)
    base = tmp_path / "base.json"
    base.write_text(tiny_spec().to_json())
    out = tmp_path / "search"
    args = [f"--base={base}", f"--dataset={SCENES}", f"--data_dir={data_dir}", "--kernel_sizes=3,5", "--expands=3",
            "--depths=1", "--widths=1.0", "--resolutions=32", "--largest_epochs=1", "--supernet_epochs=1",
            "--supernet_batch_size=16", "--supernet_steps_per_epoch=2", "--calibration_batches=1",
            "--calibration_batch_size=16",
            "--population=2", "--parents=1", "--mutations=0", "--crossovers=0", "--iterations=0",
            "--nocompare_per_layer", "--sram_kb=64", f"--out_dir={out}"]
    cluster = [f"localhost:{p}" for p in free_ports(2)]
    procs = []
    for index in range(2):
        config = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, "-m", "pipelines.search", *args, "--strategy=multi_worker"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                      env=dict(ENV, TF_CONFIG=config)))
    results = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-3000:]
        assert "strategy multi_worker (2 replicas)" in stderr
    assert "joint: held-out accuracy" in results[0][0] and "not the chief" in results[1][0]
    state = json.loads((out / "supernet" / "checkpoints" / "state.json").read_text())
    assert state["phase"] == "supernet" and len(state["history"]["largest"]) == 1
    before = (out / "search_report.json").read_text()
    r = run("pipelines.search", *args)  # one process, default strategy: resumes everything
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 1/1" not in r.stderr and json.loads((out / "search_report.json").read_text()) == json.loads(before)


def test_bad_flags_are_one_line(tmp_path):
    for args, message in ((["--sram_kb=0"], "--sram_kb"), (["--kernel_sizes=3,x"], "--kernel_sizes"),
                          (["--population=1"], "population"), (["--search_workers=-1"], "--search_workers"),
                          (["--strategy=multi_worker"], "TF_CONFIG"), (["--grids=1,x"], "--grids=1,x")):
        r = run("pipelines.search", *args, f"--out_dir={tmp_path / 'o'}")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr
        assert "Traceback" not in r.stderr
