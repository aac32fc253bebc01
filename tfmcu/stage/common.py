"""What the two stage rewriters (builtin ops, one custom op) share: their error, their result, the schedule record.

The rewritten model records its schedule as JSON in the metadata entry ``tfmcu_schedule`` (``schedule_record``,
``read_schedule``): grid, stage, analytic figures, the TFLite operator indices of the stage and every op's
per-patch output region, plus the mode and mode-specific fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tfmcu.errors import TfmcuError
from tfmcu.plan.regions import PatchSchedule
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import get_metadata
from tfmcu.tflite.model import TfliteModel, as_model

SCHEDULE_METADATA = "tfmcu_schedule"


class RewriteError(TfmcuError):
    """The model cannot be rewritten; one line naming the op and what is supported."""


@dataclass
class RewriteResult:
    """A rewritten model, decided (``decided``: what pricing reads) and written the first time its bytes are asked
    for (``model``)."""

    decided: TfliteModel
    ops_before: int
    ops_after: int
    new_tensors: int
    schedule: dict[str, Any]
    stages: dict[int, Any] = field(default_factory=dict)  # custom mode: PackedStage per TFMCU_PATCH_STAGE op index

    @property
    def model(self) -> bytes:
        """The rewritten .tflite's bytes (written on first use)."""
        return self.decided.data


def schedule_record(s: PatchSchedule, mode: str, **extra: Any) -> dict[str, Any]:
    """The JSON record of ``s`` a rewriter stores in the model (see the module docstring)."""
    d = s.to_dict()
    d["tool"] = "tfmcu"
    d["mode"] = mode
    d["stage_ops_tflite"] = [s.graph.ops[k].src_index for k in s.stage]
    d["regions"] = {
        s.graph.ops[k].name: [[list(r) for r in s.region(k, p).out] for p in s.patch_iter()] for k in s.stage}
    d.update(extra)
    return d


def read_schedule(data: TfliteModel | bytes | ts.ModelT) -> dict[str, Any] | None:
    """The schedule a rewritten model (bytes or an already parsed or loaded model) records in its metadata (None for
    other models)."""
    model = data if isinstance(data, ts.ModelT) else as_model(data).flatbuffer
    raw = get_metadata(model, SCHEDULE_METADATA)
    return None if raw is None else json.loads(raw.decode())
