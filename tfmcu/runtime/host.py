"""Whole models on the host: TF Lite and TFLM outputs and TFLM's arena for one model, builtin-only or custom mode.

* ``evaluate(model, samples, resolver)``: TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's
  arena. A custom-mode model (one ``TFMCU_PATCH_STAGE`` op, ``tfmcu.stage.custom``) runs in ``HostRunner``: the
  stage in the C kernels (ctypes), the rest of the graph in TF Lite (with the same ``resolver``) and in TFLM; its
  arena is the ESTIMATED "as run here" figure (the rest's measured TFLM arena + the C kernels' scratch + the input),
  with ``tfmcu.stage.custom.memory_report`` attached (``ArenaStats.custom``).
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
from tfmcu.stage.custom import PATCH_STAGE_OP, is_custom_model, load_custom, memory_report


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


def _evaluate_custom(model: bytes, samples: Sequence[Any], resolver: str | None, where: str) -> ModelRun:
    try:
        runner = HostRunner(model, where)
        phase("TF Lite")
        tfl = runner.run(samples, rest="tflite", resolver=resolver) if resolver else None
        phase("TFLM")
        outs = runner.run(samples, rest="tflm")
        mem = memory_report(model, where, measure=lambda rest: measure_arena(rest, where=f"{where} (rest)"))
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    rest = mem["rest_tflm"]
    extra = mem["scratch_bytes"] + mem["input_bytes"]
    arena = ArenaStats(rest["arena_total_bytes"] + extra, rest["arena_head_bytes"] + extra, rest["arena_tail_bytes"],
                       custom=mem)
    return ModelRun(tfl, outs, arena, custom_mode=True)
