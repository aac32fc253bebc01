"""Whole models on the host: TF Lite and TFLM outputs and TFLM's arena for one model, builtin-only or custom mode.

* ``evaluate(model, samples, resolver)``: TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's
  arena. A custom-mode model (one ``TFMCU_PATCH_STAGE`` op, ``tfmcu.stage.custom``) runs WHOLE in TFLM built from
  source with our kernel (``tfmcu.runtime.tflm_host``): outputs and the measured arena (the kernel's persistent
  bytes in ``ArenaStats.custom``). TF Lite has no kernel for the op: ``HostRunner`` runs the stage in the C kernels
  (ctypes) and the rest in TF Lite (with the same ``resolver``).
* ``evaluate(..., isolate=True)`` runs all of it in a child process (``tfmcu.runtime.isolate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.binding import prepare, run_stage
from tfmcu.runtime.isolate import isolated, phase
from tfmcu.runtime.model_io import TFLMError
from tfmcu.runtime.tflite import run_tflite
from tfmcu.runtime.tflm import ArenaStats, measure_arena, run_tflm
from tfmcu.stage.common import RewriteError
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.custom import PATCH_STAGE_OP, is_custom_model, load_custom


class HostRunner:
    """Runs a custom-mode model on the host: C kernels for the stage, TFLM (or TF Lite) for the rest."""

    def __init__(self, data: bytes, where: str = "model"):
        self.where = where
        self.custom = load_custom(data, where)
        p = self.custom.packed
        try:  # the description comes from a file: every array must fit its params, the C side checks the rest
            for spec, ins, out in zip(p.layers, p.layer_inputs, p.layer_outputs):
                spec.check_arrays(p.tensor_shapes[ins[0]][2], p.tensor_shapes[out][2])
            prepare(p)
        except (PatchKernelError, IndexError, KeyError, TypeError) as e:
            raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} description ({e})") from None

    def stage(self, x: np.ndarray) -> np.ndarray:
        return run_stage(self.custom.packed, x)

    def run(self, samples: Sequence[Any], rest: str = "tflm", resolver: str = "reference") -> list[list[np.ndarray]]:
        """Outputs per sample; ``rest``: "tflm" or "tflite" (with TF Lite's ``resolver`` kernels)."""
        staged = [(self.stage(s[0] if isinstance(s, (tuple, list)) else s),) for s in samples]
        if rest == "tflm":
            return run_tflm(self.custom.rest, staged, where=f"{self.where} (rest)")
        return run_tflite(self.custom.rest, staged, resolver, where=f"{self.where} (rest)")


@dataclass
class ModelRun:
    tflite: list[list[np.ndarray]] | None  # outputs per sample (None when not asked)
    tflm: list[list[np.ndarray]]
    arena: ArenaStats
    custom_mode: bool = False


def evaluate(model: bytes, samples: Sequence[Any], resolver: str | None = "reference", where: str = "model",
             isolate: bool = False) -> ModelRun:
    """TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's arena for one model (see the module
    docstring)."""
    if isolate:
        return isolated(evaluate, bytes(model), list(samples), resolver, where, where=where)
    model = bytes(model)
    if is_custom_model(model):
        return _evaluate_custom(model, samples, resolver, where)
    phase("TF Lite")
    tfl = run_tflite(model, samples, resolver, where) if resolver else None
    phase("TFLM")
    outs = run_tflm(model, samples, where=where)
    return ModelRun(tfl, outs, measure_arena(model, where=where))


def tflite_outputs(model: bytes, samples: Sequence[Any], resolver: str = "reference", where: str = "model",
                   isolate: bool = False) -> list[list[np.ndarray]]:
    """TF Lite's outputs only (custom mode: the stage in the C kernels, the rest in TF Lite), for callers that check
    them against another TFLM (firmware on the target) and need no TFLM run here."""
    if isolate:
        return isolated(tflite_outputs, bytes(model), list(samples), resolver, where, where=where)
    model = bytes(model)
    try:
        if is_custom_model(model):
            return HostRunner(model, where).run(samples, rest="tflite", resolver=resolver)
        return run_tflite(model, samples, resolver, where)
    except RewriteError as e:
        raise TFLMError(str(e)) from None


def _evaluate_custom(model: bytes, samples: Sequence[Any], resolver: str | None, where: str) -> ModelRun:
    """TFLM: the whole model in TFLM built from source with our TFMCU_PATCH_STAGE kernel (measured arena). TF Lite
    has no kernel for the op: there the stage runs in the C kernels (ctypes) and the rest in TF Lite."""
    try:
        tfl = None
        if resolver:
            phase("TF Lite")
            tfl = HostRunner(model, where).run(samples, rest="tflite", resolver=resolver)
        phase("TFLM")
        whole = run_whole(model, samples, where)
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    a = whole.arena
    custom = {"measured_by": MEASURED_BY, "pointer_bytes": a.pointer_bytes,
              "patch_stage_persistent_bytes": a.patch_stage_persistent_bytes, "allocations": a.allocations}
    return ModelRun(tfl, whole.outputs, ArenaStats(a.arena_used_bytes, a.head_bytes, a.tail_bytes, custom=custom),
                    custom_mode=True)
