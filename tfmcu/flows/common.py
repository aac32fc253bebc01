"""What the flows share: the schedule a user asks for (``ScheduleRequest``), checked once for every mode; a TFLM
arena's figures in their reports (``ArenaFigures``).

A request is the flags ``--patches`` (``None``: no patching; ``auto``; ``P``; ``PxQ``), ``--patch_blocks`` /
``--patch_ops``, ``--sram_kb`` and the search options (``tfmcu.plan.search.SearchOptions``: the grids, stage
unit, MAC cap and metric, whether the input image counts, the objective). ``validate()`` turns every bad
combination into one ``UsageError`` naming the flag, before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tfmcu.errors import UsageError
from tfmcu.plan.regions import ScheduleError
from tfmcu.plan.search import SearchOptions
from tfmcu.records import Record, optional

KB = 1024


def parse_grid(value: str) -> tuple[int, int]:
    """``--patches``: P (a PxP grid) or PxQ (rows x columns)."""
    try:
        parts = [int(v) for v in value.lower().split("x")]
    except ValueError:
        raise UsageError(f"--patches={value}: expected P, PxQ or auto") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise UsageError(f"--patches={value}: expected P, PxQ or auto with P, Q >= 1")
    return parts[0], parts[1]


def parse_grids(values: Sequence[str | int]) -> tuple[int, ...]:
    """``--grids``: patch counts per side to try, integers >= 1."""
    try:
        options = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise UsageError(f"--grids={','.join(map(str, values))}: expected integers >= 1") from None
    if not options or min(options) < 1:
        raise UsageError(f"--grids={','.join(map(str, values))}: expected integers >= 1")
    return options


@dataclass(frozen=True, kw_only=True)
class ScheduleRequest:
    patches: str | None = None
    patch_blocks: int | None = None
    patch_ops: int | None = None
    sram_kb: float | None = None
    search: SearchOptions = field(default_factory=SearchOptions)

    @property
    def auto(self) -> bool:
        return self.patches is not None and self.patches.lower() == "auto"

    @property
    def grid(self) -> tuple[int, int] | None:
        """The requested grid (None for no patching or auto)."""
        if self.patches is None or self.auto:
            return None
        return parse_grid(self.patches)

    @property
    def budget_bytes(self) -> int | None:
        return None if self.sram_kb is None else int(self.sram_kb * KB)

    def validate(self) -> "ScheduleRequest":
        if self.patch_blocks is not None and self.patch_ops is not None:
            raise UsageError("give --patch_blocks or --patch_ops, not both")
        if self.sram_kb is not None and self.sram_kb < 0:
            raise UsageError(f"--sram_kb={self.sram_kb}: must be >= 0")
        try:
            self.search.validate()
        except ScheduleError as e:
            raise UsageError(str(e)) from None
        if self.search.objective == "latency":
            raise UsageError("--objective=latency needs a core's instruction predictions: use python -m pipelines.fit "
                             "(a model and a target)")
        if self.auto:
            if self.sram_kb is None and self.search.objective == "macs":
                raise UsageError("--patches=auto needs --sram_kb (or --objective=memory for the smallest arena)")
        elif self.patches is not None:
            self.grid  # parses (raises UsageError)
            if self.patch_blocks is None and self.patch_ops is None:
                raise UsageError("--patches needs --patch_blocks or --patch_ops (or use --patches=auto)")
        return self


@dataclass(frozen=True, kw_only=True)
class ArenaFigures(Record):
    """A TFLM arena, measured or predicted: total, head (activations and scratch), tail (persistent); how it was
    measured, or why it could not be predicted."""

    arena_total_bytes: int | None
    arena_head_bytes: int | None = optional()
    arena_tail_bytes: int | None = optional()
    error: str | None = optional()  # the model cannot be predicted (its first line)
    unmodelled_ops: list[str] | None = optional()
    measured_by: str | None = optional()
    patch_stage_persistent_bytes: int | None = optional()
    outputs_equal_original_on: str | None = optional()

    @staticmethod
    def of(stats: Any) -> "ArenaFigures":
        """From a measurement or prediction with ``total``, ``head`` and ``tail``."""
        return ArenaFigures(arena_total_bytes=stats.total, arena_head_bytes=stats.head, arena_tail_bytes=stats.tail)
