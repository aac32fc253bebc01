"""Whole models in TFLM built from source, with the TFMCU_PATCH_STAGE kernel registered.

``tflm_patch_kernels/tflm:tfmcu_tflm_run`` (Bazel ``cc_binary``) links TFLM (the pinned upstream archive, its
reference kernels, and its own TFLite_Detection_PostProcess for detectors) and our kernel; it runs a ``.tflite`` —
builtin ops only, or custom mode — on ``.npy`` inputs and reports TFLM's ``arena_used_bytes`` and the
RecordingMicroAllocator breakdown. This module calls it. A detector's outputs come back with the op's unwritten
entries (past ``num_detections``) zeroed (``tfmcu.tflite.detection_postprocess.canonical_outputs``), as the other
runners' do.

* ``run_whole(model, samples)``: a ``WholeRun``: outputs per sample and the measured arena (``TflmArena``); for a
  model whose stage streams its input (``streamed_image``) the samples are the images, whose rows the runner feeds
  through a checked ``TfmcuInputProvider`` (``--stream_input``), and ``streamed_rows_read`` the rows each read.
* ``input_signature(model)``, ``image_samples(model, samples)``: what a sample of such a model is (the image).
* ``runner_path()``: the binary: ``$TFMCU_TFLM_RUNNER``, else the Bazel runfiles of a test, else
  ``bazel-bin/`` of this checkout, built on demand with ``bazel build`` (a minute or more the first time: TFLM is
  compiled from source).

This TFLM (commit 90b983c, Aug 2026) is older than the PyPI ``tflite-micro`` wheel (8f6596d, Oct 2026) that
``tfmcu.runtime.tflm`` uses for builtin-op models; ``tests/test_tflm_kernel.py`` compares the two on builtin-op
models (outputs and arena) instead of assuming they agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tfmcu.runtime.model_io import ModelInfo, TensorInfo, TFLMError, as_samples, parsed
from tfmcu.tflite import schema as ts
from tfmcu.tflite.detection_postprocess import canonical_outputs, postprocess_outputs
from tfmcu.tflite.model import TfliteModel, as_model
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP, stage_at, streamed_input

TARGET = "//tflm_patch_kernels/tflm:tfmcu_tflm_run"
MEASURED_BY = ("measured by TFLM built from source (the pinned archive, reference kernels + the TFMCU_PATCH_STAGE "
               "kernel), whole model in MicroInterpreter, on this host")
_REL = Path("tflm_patch_kernels") / "tflm" / "tfmcu_tflm_run"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TflmArena:
    arena_used_bytes: int
    head_bytes: int  # planned activations + scratch buffers (non-persistent)
    tail_bytes: int  # persistent: tensor and node records, op data, quantization data
    pointer_bytes: int  # of the machine that measured (8 on x86-64 hosts, 4 on Cortex-M)
    patch_stage_persistent_bytes: int = 0  # the TFMCU_PATCH_STAGE kernel's op data (part of tail_bytes)
    allocations: dict[str, dict[str, int]] = field(default_factory=dict)  # RecordingMicroAllocator, by type


@dataclass
class WholeRun:
    outputs: list[list[np.ndarray]]  # per sample, per model output
    arena: TflmArena
    streamed_rows_read: list[int] = field(default_factory=list)  # per sample, for a streamed-input model


def streamed_image(model: TfliteModel | bytes) -> tuple[tuple[int, int, int], str] | None:
    """((H, W, C), dtype) of the image a streamed-input TFMCU_PATCH_STAGE reads through its provider (its samples
    are such images); None for any other model."""
    try:
        m = as_model(model)
        first = [i for i, name in enumerate(m.op_names) if name == f"custom:{PATCH_STAGE_OP}"][:1]
        return streamed_input(stage_at(m, first[0], tables=False)) if first else None
    except (ValueError, KeyError, TypeError, IndexError, ts.SchemaError):
        return None


def input_signature(model: TfliteModel | bytes, where: str = "model") -> ModelInfo:
    """What a sample of ``model`` is: its signature (``TfliteModel.info``), except that a streamed-input model's
    input is the image its stage reads through the provider (``streamed_image``: int8[1, H, W, C], or float32 for a
    stage that quantizes its input; index -1 and no quantization, which the rewritten model no longer records)."""
    model = parsed(model, where)
    image = streamed_image(model)
    if image is None:
        return model.info
    shape, dtype = image
    return replace(model.info, inputs=(TensorInfo(-1, "streamed image", (1, *map(int, shape)), dtype),))


def image_samples(model: TfliteModel | bytes, samples: Sequence[Any], where: str = "model") -> list[tuple[np.ndarray]]:
    """The samples of a streamed-input model (images, ``input_signature``) checked as ``model_io.as_samples`` checks
    a model's: one-element tuples of [1, H, W, C] arrays; a one-line ``TFLMError`` on a mismatch."""
    return [(s[0],) for s in as_samples(input_signature(model, where), samples, where)]


_BUILT: dict[str, Path] = {}  # built (or found) once per process


def runner_path(build: bool = True, name: str = "tfmcu_tflm_run") -> Path:
    """A binary of //tflm_patch_kernels/tflm (the runner by default; see the module docstring): ``TFLMError`` when it
    cannot be found or built."""
    if name in _BUILT:
        return _BUILT[name]
    env = os.environ.get("TFMCU_TFLM_RUNNER") if name == "tfmcu_tflm_run" else None
    if env:
        return Path(env)
    rel = _REL.parent / name
    target = f"//tflm_patch_kernels/tflm:{name}"
    for var in ("RUNFILES_DIR", "TEST_SRCDIR"):
        base = os.environ.get(var)
        if base:
            for ws in ("tfmcu_ws", "__main__"):
                p = Path(base) / ws / rel
                if p.exists():
                    _BUILT[name] = p
                    return p
    p = ROOT / "bazel-bin" / rel
    if build:
        print(f"[tflm] bazel build {target} (TFLM from source; slow the first time)", file=sys.stderr, flush=True)
        r = subprocess.run(["bazel", "build", "--noshow_progress", target], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            tail = " | ".join(r.stderr.strip().splitlines()[-3:])
            raise TFLMError(f"cannot build {target}: {tail}")
    if not p.exists():
        raise TFLMError(f"{p}: not built (bazel build {target})")
    _BUILT[name] = p
    return p


def run_whole(model: TfliteModel | bytes, samples: Sequence[Any], where: str = "model",
              arena_bytes: int | None = None) -> WholeRun:
    """Run ``model`` on ``samples`` (``tfmcu.runtime.model_io`` forms) in the TFLM host runner."""
    model = parsed(model, where)
    info = model.info
    images = None
    if streamed_image(model) is not None:  # samples are images for the provider; the model input is a placeholder
        images = np.concatenate([s[0] for s in image_samples(model, samples, where)]) if len(samples) else None
        if images is None:
            raise TFLMError(f"{where}: no samples")
        samples = [tuple(np.zeros(t.shape, t.dtype) for t in info.inputs) for _ in range(len(images))]
    rows = as_samples(info, samples, where)
    exe = runner_path()
    with tempfile.TemporaryDirectory(prefix="tfmcu-tflm-") as tmp:
        model_path = os.path.join(tmp, "model.tflite")
        with open(model_path, "wb") as f:
            f.write(model.data)
        args = [str(exe), model_path, tmp]
        for k in range(len(info.inputs)):
            path = os.path.join(tmp, f"input_{k}.npy")
            np.save(path, np.stack([np.asarray(r[k]).reshape(info.inputs[k].shape[1:]) for r in rows]))
            args.append(path)
        if arena_bytes:
            args.append(f"--arena_bytes={int(arena_bytes)}")
        if images is not None:
            np.save(os.path.join(tmp, "images.npy"), images)
            args.append(f"--stream_input={os.path.join(tmp, 'images.npy')}")
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            # the first message is the cause (e.g. the kernel naming a bad field), the last what failed
            lines = [ln.strip().replace(model_path, "model") for ln in (r.stderr or "").splitlines() if ln.strip()]
            detail = "; ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else f"exit status {r.returncode}"
            raise TFLMError(f"{where}: TFLM (host build) failed: {detail}")
        with open(os.path.join(tmp, "report.json")) as f:
            report = json.load(f)
        outs = [np.load(os.path.join(tmp, f"output_{j}.npy")) for j in range(len(info.outputs))]
    detector = postprocess_outputs(model.flatbuffer)  # the op's unwritten entries zeroed, as the other runners do
    per_sample = [canonical_outputs([outs[j][s].reshape(info.outputs[j].shape) for j in range(len(outs))], detector)
                  for s in range(len(rows))]
    arena = TflmArena(int(report["arena_used_bytes"]), int(report["head_bytes"]), int(report["tail_bytes"]),
                      int(report["pointer_bytes"]), int(report["patch_stage_persistent_bytes"]),
                      report.get("allocations", {}))
    return WholeRun(per_sample, arena, [int(n) for n in report.get("streamed_rows_read", [])])
