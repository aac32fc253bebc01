"""`pipelines/profile.py` contract: flags, JSON fields, plot, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_profile(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "pipelines.profile", *args], capture_output=True, text=True,
                          env=env, cwd=cwd or ROOT, timeout=300)


def test_mbv2_patched_report(tmp_path):
    j, png = tmp_path / "r.json", tmp_path / "r.png"
    r = run_profile("--model=mbv2", "--resolution=224", "--width=1.0", "--patches=4", "--patch_blocks=5",
                    f"--json_out={j}", f"--plot_out={png}")
    assert r.returncode == 0, r.stderr
    assert "peak SRAM patched" in r.stdout and "block2_depthwise" in r.stdout
    d = json.loads(j.read_text())
    for key in ("model", "resolution", "macs", "params", "flash_bytes", "peak_sram_per_layer_bytes", "layers",
                "blocks", "patch"):
        assert key in d, key
    assert d["model"] == "mbv2" and d["resolution"] == 224
    layer = d["layers"][0]
    for key in ("name", "op", "block", "in_shape", "out_shape", "memory_bytes", "macs"):
        assert key in layer, key
    assert {"index", "peak_memory_bytes", "macs"} <= set(d["blocks"][0])
    p = d["patch"]
    for key in ("patches", "patch_blocks", "input_patch_size", "peak_sram_bytes", "peak_sram_bytes_excluding_input",
                "stage_macs", "stage_macs_patched_padded", "stage_macs_patched_exact", "macs_patched_padded",
                "macs_patched_exact"):
        assert key in p, key
    assert p["patches"] == 4 and p["patch_blocks"] == 5 and p["input_patch_size"] == [75, 75]
    assert d["peak_sram_per_layer_bytes"] == 1_505_280
    assert p["peak_sram_bytes"] < d["peak_sram_per_layer_bytes"]
    assert sum(layer["macs"] for layer in d["layers"]) == d["macs"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accounting_flag(tmp_path):
    j = tmp_path / "p.json"
    r = run_profile("--model=mbv2", "--resolution=224", "--width=1.0", "--patches=4", "--patch_blocks=5",
                    "--accounting=paper", f"--json_out={j}")
    assert r.returncode == 0, r.stderr
    assert "memory accounting: paper" in r.stdout
    d = json.loads(j.read_text())
    assert d["accounting"] == "paper" and d["patch"]["accounting"] == "paper"
    assert d["peak_sram_per_layer_bytes"] == 1372 * 1024
    assert d["patch"]["peak_sram_bytes_excluding_input"] == 175_616  # 171.5 kB (paper: about 172 kB)


def test_auto_mode_and_rectangular_grid(tmp_path):
    j = tmp_path / "a.json"
    r = run_profile("--model=mbv2", "--width=0.35", "--resolution=144", "--patches=auto", "--sram_kb=128",
                    f"--json_out={j}", "--quiet")
    assert r.returncode == 0, r.stderr
    d = json.loads(j.read_text())
    assert d["auto"]["feasible"] and d["patch"]["peak_sram_bytes"] <= 128 * 1024
    assert d["peak_sram_per_layer_bytes"] > 128 * 1024
    r = run_profile("--model=mbv2-rd", "--patches=2x3", "--patch_blocks=3", f"--json_out={j}", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(j.read_text())["patch"]["grid"] == [2, 3]


def test_grids_are_the_ones_searched(tmp_path):
    """--grids (the patches per side every searching pipeline tries) limits auto mode's candidates."""
    j = tmp_path / "a.json"
    r = run_profile("--model=mbv2", "--width=0.35", "--resolution=144", "--patches=auto", "--objective=memory",
                    "--grids=1,3", f"--json_out={j}", "--quiet")
    assert r.returncode == 0, r.stderr
    seen = {p for c in json.loads(j.read_text())["auto"]["candidates"] for p in c["patches"]}
    assert seen == {1, 3}
    help_text = run_profile("--help").stdout
    assert "--grids: Auto mode: patches per side to try" in help_text and "(default: '1,2,3,4')" in help_text


def test_spec_json_model(tmp_path):
    from tfmcu.nets.presets import get_preset

    spec = tmp_path / "net.json"
    spec.write_text(get_preset("mnasnet-a1", resolution=160).to_json())
    j = tmp_path / "s.json"
    r = run_profile(f"--model={spec}", f"--json_out={j}", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(j.read_text())["resolution"] == 160


@pytest.mark.parametrize("args, message", [
    (["--model=resnet9000"], "unknown preset 'resnet9000'"),
    (["--model={tmp}/missing.json"], "no such file"),
    (["--model={tmp}/bad.json"], "malformed JSON"),
    (["--model={tmp}/badfield.json"], "stages[0].blocks[0].kernel"),
    (["--model={tmp}/fake.tflite"], "not a TFLite"),
    (["--model={tmp}/missing.tflite"], "no such file"),
    (["--model=mbv2", "--patches=auto", "--sram_kb=1"], "smallest achievable peak"),
    (["--model=mbv2", "--patches=auto"], "--sram_kb"),
    (["--model=mbv2", "--patches=4"], "--patch_blocks"),
    (["--model=mbv2", "--patches=4", "--patch_blocks=40"], "blocks"),
    (["--model=mbv2", "--patches=four", "--patch_blocks=5"], "--patches=four"),
    (["--model=mbv2", "--patches=4", "--patch_ops=64"], "must be 1..63"),
    (["--model=mbv2", "--resolution=3"], "resolution"),
    (["--model=mbv2", "--bogus=1"], "bogus"),
    (["--model=mbv2", "--accounting=tinyengine"], "accounting"),
    (["--model=mbv2", "--patches=auto", "--sram_kb=128", "--grids=2,x"], "--grids=2,x"),
    ([], "give the model: --model="),  # no silent default model
])
def test_bad_input_one_line_exit_2(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "badfield.json").write_text(json.dumps(
        {"name": "x", "stages": [{"blocks": [{"out_channels": 8, "kernel": 4}]}]}))
    (tmp_path / "fake.tflite").write_bytes(b"this is not a flatbuffer at all")
    j, png = tmp_path / "out.json", tmp_path / "out.png"
    args = [a.format(tmp=tmp_path) for a in args] + [f"--json_out={j}", f"--plot_out={png}"]
    r = run_profile(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert not j.exists() and not png.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
