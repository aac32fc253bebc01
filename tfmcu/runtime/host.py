"""Whole models on the host: TF Lite and TFLM outputs and TFLM's arena for one model, builtin-only or custom mode.

* ``evaluate(model, samples, resolver)``: TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's
  arena. A custom-mode model (one ``TFMCU_PATCH_STAGE`` op, ``tfmcu.stage.custom``) runs WHOLE in TFLM built from
  source with our kernel (``tfmcu.runtime.tflm_host``): outputs and the measured arena (the kernel's persistent
  bytes in ``ArenaStats.custom``). TF Lite has no kernel for the op: ``HostRunner`` runs the stage in the C kernels
  (ctypes) and the rest in TF Lite (with the same ``resolver``). ``tflm=False``: TF Lite's outputs only.
* ``evaluate(..., isolate=True)`` runs all of it in a child process (``tfmcu.runtime.isolate``).
* ``host_model(model)``: the model's signature and, for a custom-mode model, its ``HostRunner`` (a malformed
  description is a one-line ``TFLMError`` here, before anything runs).

``model``: a ``tfmcu.tflite.model.TfliteModel`` (parsed once, shared by the steps) or the bytes of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.binding import prepare, run_stage
from tfmcu.runtime.isolate import isolatable, phase
from tfmcu.runtime.model_io import ModelInfo, TFLMError, prepared
from tfmcu.runtime.tflite import run_tflite, tflite_outputs
from tfmcu.runtime.tflm import ArenaStats, measure_arena, run_tflm, tflm_outputs
from tfmcu.stage.common import RewriteError
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.custom import PATCH_STAGE_OP, load_custom
from tfmcu.tflite.model import TfliteModel


class HostRunner:
    """Runs a custom-mode model on the host: C kernels for the stage, TFLM (or TF Lite) for the rest."""

    def __init__(self, data: TfliteModel | bytes, where: str = "model"):
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
    tflm: list[list[np.ndarray]] | None  # (None: evaluate(tflm=False))
    arena: ArenaStats | None
    custom_mode: bool = False


def host_model(model: TfliteModel, where: str = "model") -> tuple[ModelInfo, HostRunner | None]:
    """The model's inputs, outputs and op names, and its ``HostRunner`` when it is a custom-mode model (one
    ``TFMCU_PATCH_STAGE`` op; None otherwise): a malformed stage is a one-line ``TFLMError``. ``model``: parsed
    (``tfmcu.runtime.model_io.read_model`` or ``parsed``)."""
    try:
        return model.info, (HostRunner(model, where) if PATCH_STAGE_OP in model.info.custom_ops else None)
    except RewriteError as e:
        raise TFLMError(str(e)) from None


@isolatable
def evaluate(model: TfliteModel | bytes, samples: Sequence[Any], resolver: str | None = "reference",
             where: str = "model", tflm: bool = True) -> ModelRun:
    """TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's arena for one model (see the module
    docstring); ``tflm=False``: TF Lite's outputs only, for callers that check them against another TFLM (firmware
    on the target). ``isolate=True``: all of it in a child process."""
    model, _, rows = prepared(model, samples, where)  # parsed and checked once for every interpreter below
    custom = f"custom:{PATCH_STAGE_OP}" in model.op_names
    try:
        tfl = None
        if resolver:
            phase("TF Lite")
            tfl = (HostRunner(model, where).run(rows, rest="tflite", resolver=resolver) if custom else
                   tflite_outputs(model, rows, resolver, where))
        if not tflm:
            return ModelRun(tfl, None, None, custom)
        phase("TFLM")
        if not custom:
            return ModelRun(tfl, tflm_outputs(model, rows, None, where), measure_arena(model, where=where))
        # the whole model in TFLM built from source with our TFMCU_PATCH_STAGE kernel (measured arena)
        whole = run_whole(model, rows, where)
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    a = whole.arena
    stats = {"measured_by": MEASURED_BY, "pointer_bytes": a.pointer_bytes,
             "patch_stage_persistent_bytes": a.patch_stage_persistent_bytes, "allocations": a.allocations}
    return ModelRun(tfl, whole.outputs, ArenaStats(a.arena_used_bytes, a.head_bytes, a.tail_bytes, custom=stats),
                    custom_mode=True)
