"""pipelines.demo: its flags live beside pipelines.verify's, the summary table it writes (docs/getting-started.md), a budget
that cannot be met stops it before any training, and a small end-to-end run shows only the pipeline's own lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pipelines

SRC_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pipelines.__file__)))


def test_demo_and_verify_flags_do_not_collide():
    """The demo imports pipelines.verify after its own flags are parsed; a flag defined by both would abort it."""
    code = ("from absl import flags\nimport pipelines.demo\nflags.FLAGS(['demo'])\nimport pipelines.verify\n"
            "print(flags.FLAGS.budget_fraction, flags.FLAGS.samples)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC_ROOT,
                          env=dict(os.environ, PYTHONPATH=SRC_ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0.6", "200"]


def test_summary_table():
    from tfmcu.flows import demo

    s = {
        "model": "mcunet-demo", "resolution": 96, "dataset": "Fashion-MNIST", "train_samples": 20000, "epochs": 2,
        "qat_epochs": 1, "qat_steps": 60, "schedule": "1x3 patches over the first 3 blocks", "budget_bytes": 184528,
        "accuracy": {"float": 0.8937, "qat": 0.8904, "int8_tflite": 0.8855, "int8_tflm": 0.8855,
                     "keras_test_samples": 10000, "int8_test_samples": 2000, "float_on_int8_samples": 0.888,
                     "tflite_equals_tflm": True},
        "per_layer": {"analytic_peak_bytes": 276480, "tflm_arena_bytes": 307568, "predicted_arena_bytes": 307568,
                      "flash_bytes": 275322, "macs": 19_620_000, "ops": 32},
        "patched": {"analytic_peak_bytes": 138240, "tflm_arena_bytes": 178544, "predicted_arena_bytes": 178544,
                    "flash_bytes": 285962, "macs_exact": 19_930_000, "macs_padded": 20_260_000,
                    "mac_overhead_exact": 0.016, "mac_overhead_padded": 0.033, "ops": 79},
        "verify": {"bit_exact": True, "samples": 220, "real": 200},
        "wall_s": 341.0,
    }
    table = demo.summary_table(s)
    lines = table.splitlines()
    assert lines[0].startswith("| mcunet-demo @ 96, Fashion-MNIST | per-layer | patched (1x3 patches")
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:4]] for ln in lines[2:] if ln.startswith("|")}
    assert rows["accuracy, int8 (2000 test images)"] == ["88.55% (TF Lite = TFLM)", "identical (bit-exact outputs)"]
    s["accuracy"]["tflite_tflm_rounding_ties"] = 2  # samples 1 apart by a rounding tie: no disagreement
    assert "88.55% (TF Lite = TFLM but 2 rounding ties)" in demo.summary_table(s)
    s["accuracy"]["tflite_equals_tflm"] = False
    assert "88.55% (TF Lite != TFLM!)" in demo.summary_table(s)
    assert rows["peak SRAM, analytic"] == ["270.0 kB", "135.0 kB"]
    assert rows["peak SRAM, TFLM arena measured"] == ["300.4 kB", "174.4 kB"]
    assert rows["fits the 180.2 kB budget (TFLM)"] == ["no", "yes"]
    assert rows["MACs"][0] == "19.62M" and "+1.6%" in rows["MACs"][1]
    assert "wall time 341 s" in table


def _demo(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC_ROOT, TF_USE_LEGACY_KERAS="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user's shell has: nothing
    return subprocess.run([sys.executable, "-m", "pipelines.demo", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


# A short run: the same pipeline on 512 images (1 float epoch of 8 steps, 1 QAT epoch of 2 steps).
SMALL = ["--train_subset=512", "--batch_size=64", "--epochs=1", "--qat_epochs=1", "--qat_steps_per_epoch=2",
         "--val_split=64", "--test_subset=128", "--int8_eval_samples=32", "--verify_random=2", "--verify_real=4",
         "--bn_recalibration_batches=2", "--calibration_samples=32",
         # Step 6 calls Bazel (deploy --run), which cannot run inside `bazel test`: tests/e2e covers deploy --run.
         "--mcu=none"]


def test_impossible_budget_stops_before_training(tmp_path):
    """Hole 6: a budget no schedule meets used to fail only after training; it is checked first."""
    out = tmp_path / "demo"
    r = _demo(f"--out_dir={out}", "--sram_kb=8", *SMALL, cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "no patch schedule fits 8.0 kB; nothing trained" in errors[0], r.stderr
    assert "== 2/6 train" not in r.stdout
    assert not (out / "checkpoints").exists() and not (out / "model_int8.tflite").exists()


def test_small_demo_end_to_end_shows_only_its_own_lines(tmp_path):
    """The whole demo on a short run; hole 13: TensorFlow's C++ start-up lines (absl's pre-init notice, the CUDA
    probe's 'failed call to cuInit' on a machine without a GPU) go to out_dir/tensorflow.log, not to the user."""
    out = tmp_path / "demo"
    r = _demo(f"--out_dir={out}", *SMALL, cwd=str(tmp_path))
    # 0 on any host: TF Lite and TFLM agree but for rounding ties in a FULLY_CONNECTED head (which the exported
    # 1x1 CONV_2D classifier cannot have), and the patched model is bit-exact
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = r.stdout + r.stderr
    noise = [ln for ln in text.splitlines()
             if re.match(r"^[IWEF]\d{4} ", ln) or "absl::InitializeLog" in ln or "cuInit" in ln or "cuda" in ln]
    assert not noise, noise[:5]
    log = (out / "tensorflow.log").read_text()
    assert "absl::InitializeLog" in log or "cuda" in log.lower()
    summary = (out / "summary.md").read_text()
    assert "| peak SRAM, TFLM arena measured |" in summary and "identical (bit-exact outputs)" in summary
    assert "== 7/7 summary ==" in r.stdout
