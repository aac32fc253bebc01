"""Run int8 / float .tflite models in the real TFLM interpreter (the ``tflite-micro`` wheel) and measure its arena.

* ``measure_arena(model)``: build a TFLM interpreter (recording allocator) and parse ``print_allocations()``:
  total / head (planned activations + scratch buffers) / tail (persistent) bytes and the per-type lines.
  TFLM prints from C, so the text is captured at the file-descriptor level (``tfmcu.runtime.capture``). The arena
  is chosen generously (``max(4 MiB, 10 x model + 1 MiB)``, a multiple of 16) and doubled on an allocation
  failure; the figures do not depend on the arena size (checked: 4 MiB and 64 MiB give the same bytes).
* ``run_tflm(model, samples)``: outputs per sample (samples: ``tfmcu.runtime.model_io``); ``tflm_outputs(model,
  rows)``: the same for a parsed model and samples already checked against it (``model_io.prepared``).

Errors: ``TFLMError`` (a ``TfmcuError``) with one line: unsupported op (custom ops included: the wheel has only
TFLM's own kernels, among them ``TFLite_Detection_PostProcess``; custom-mode models run whole in
``tfmcu.runtime.tflm_host``), allocation that fails even in a 1 GiB arena, input shape or dtype mismatch, not a
TFLite file.

A detector's outputs (``tfmcu.tflite.detection_postprocess``) come back with the op's unwritten entries (past
``num_detections``) zeroed (``canonical_outputs``), as TF Lite's do (``tfmcu.runtime.tflite``).

Isolation: TFLM ``abort()``s the whole process on some models (a failed ``TFLITE_CHECK``, e.g. an int8 SOFTMAX
whose input scale puts its fixed-point multiplier out of range). ``isolate=True`` runs the work in a child process
(``tfmcu.runtime.isolate``) and turns a crash into a ``TFLMError``; it costs about 0.2 s per call without
TensorFlow. In-process measurement takes ~4 ms for a small model, ~30 ms for MobileNetV2-224 (no memory growth
over repeated calls); one TFLM invoke of int8 MobileNetV2-224 takes ~0.3 s (reference kernels).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu.runtime.capture import capture_fds
from tfmcu.runtime.isolate import isolatable
from tfmcu.runtime.model_io import ModelInfo, TFLMError, parsed, prepared
from tfmcu.tflite.detection_postprocess import OP_NAME as DETECTION_OP
from tfmcu.tflite.detection_postprocess import canonical_outputs, postprocess_outputs
from tfmcu.tflite.model import TfliteModel
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

# Custom ops TFLM itself has a kernel for (the wheel registers them; so do the host runner and deploy's firmware).
TFLM_CUSTOM_OPS = (DETECTION_OP,)

MIB = 1 << 20
MIN_ARENA = 4 * MIB
MAX_ARENA = 1 << 30


@dataclass
class Allocation:
    used: int  # bytes including alignment padding
    requested: int
    count: int


@dataclass
class ArenaStats:
    total: int
    head: int
    tail: int
    by_type: dict[str, Allocation] = field(default_factory=dict)
    arena_size: int = 0  # the arena the interpreter was given for the measurement
    custom: dict[str, Any] | None = None  # custom-mode models: what tfmcu.runtime.host measured (kernel op data...)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "head": self.head, "tail": self.tail, "arena_size": self.arena_size,
                "by_type": {k: asdict(v) for k, v in self.by_type.items()}}


_TOTAL = re.compile(r"\[RecordingMicroAllocator\] Arena allocation (total|head|tail) (\d+) bytes")
_TYPE = re.compile(r"\[RecordingMicroAllocator\] '([^']+)' used (\d+) bytes with alignment overhead "
                   r"\(requested (\d+) bytes for (\d+) ")


def parse_allocations(text: str) -> ArenaStats:
    """Parse the text ``print_allocations()`` prints."""
    totals: dict[str, int] = {}
    by_type: dict[str, Allocation] = {}
    for line in text.splitlines():
        m = _TOTAL.search(line)
        if m:
            totals[m.group(1)] = int(m.group(2))
            continue
        m = _TYPE.search(line)
        if m:
            by_type[m.group(1)] = Allocation(int(m.group(2)), int(m.group(3)), int(m.group(4)))
    missing = [k for k in ("total", "head", "tail") if k not in totals]
    if missing:
        raise TFLMError(f"no arena {'/'.join(missing)} figure in TFLM's print_allocations output")
    return ArenaStats(totals["total"], totals["head"], totals["tail"], by_type)


def _runtime():
    try:
        from tflite_micro.python.tflite_micro import runtime  # lazy: loads the TFLM shared library
    except ImportError as e:  # pragma: no cover - the wheel is a project dependency
        raise TFLMError(f"the tflite-micro wheel is not importable ({e})") from None
    return runtime


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "RecordingMicroAllocator" not in ln]
    return lines[0] if lines else ""


_ALLOC_FAIL = ("Failed to allocate", "Failed to resize buffer", "missing:", "Failed starting model allocation",
               "Too many buffers")


def _default_arena(model: bytes) -> int:
    return max(MIN_ARENA, 10 * len(model) + MIB) // 16 * 16


def check_runnable(info: ModelInfo, where: str = "model") -> None:
    """Refuse models TFLM's stock op resolver cannot run with a clear one-line message."""
    if PATCH_STAGE_OP in info.custom_ops:
        raise TFLMError(f"{where}: custom-mode models ({PATCH_STAGE_OP}) run in TFLM with tfmcu's kernel "
                        f"(tfmcu.runtime.tflm_host), not in the stock tflite-micro wheel")
    unknown = [op for op in info.custom_ops if op not in TFLM_CUSTOM_OPS]
    if unknown:
        raise TFLMError(f"{where}: custom ops {', '.join(unknown)} are not available in stock TFLM")


def make_interpreter(model: TfliteModel, arena_size: int | None = None, where: str = "model",
                     grow: bool = False) -> tuple[Any, int, str]:
    """A TFLM interpreter with its tensors allocated: ``(interpreter, arena_size, captured C text)``; ``model``:
    parsed (``tfmcu.runtime.model_io.parsed``).

    Without ``arena_size`` the arena starts at ``max(4 MiB, 10 x model + 1 MiB)`` and doubles on an allocation
    failure up to 1 GiB; a given ``arena_size`` is used as is (``grow`` decides whether it may still grow)."""
    check_runnable(model.info, where)
    runtime = _runtime()
    size = int(arena_size) if arena_size else _default_arena(model.data)
    if arena_size is None:
        grow = True
    while True:
        interp = None
        err: Exception | None = None
        with capture_fds() as out:
            try:
                interp = runtime.Interpreter.from_bytes(model.data, arena_size=size)
            except (RuntimeError, ValueError) as e:
                err = e
        text = out[0]
        if interp is not None:
            return interp, size, text
        alloc_failure = any(s in text for s in _ALLOC_FAIL)
        if alloc_failure and grow and size < MAX_ARENA:
            size = min(MAX_ARENA, size * 2)
            continue
        detail = _first_error(text) or str(err)
        if alloc_failure:
            raise TFLMError(f"{where}: TFLM cannot allocate the arena in {size} bytes ({detail})")
        raise TFLMError(f"{where}: TFLM cannot load the model ({detail})")


@isolatable
def measure_arena(model: TfliteModel | bytes, arena_size: int | None = None, where: str = "model") -> ArenaStats:
    """TFLM's arena figures for ``model`` (bytes of a .tflite), as the wheel's recording allocator reports them
    after ``AllocateTensors`` (the interpreter allocates at construction; invoking does not change them).

    Without ``arena_size`` the arena grows until the model fits (``make_interpreter``); with it, a model that does
    not fit raises ``TFLMError``. Use arena sizes that are multiples of 16: TFLM aligns the tail to the arena end,
    so other sizes add up to 15 bytes of padding to the tail. An arena smaller than the tail can crash the wheel
    (null pointers it does not check): probe small arenas with ``isolate=True`` (in a child process)."""
    interp, size, _ = make_interpreter(parsed(model, where), arena_size, where)
    try:
        with capture_fds() as out:
            interp.print_allocations()
    finally:
        del interp
    stats = parse_allocations(out[0])
    stats.arena_size = size
    return stats


@isolatable
def run_tflm(model: TfliteModel | bytes, samples: Sequence[Any], arena_size: int | None = None,
             where: str = "model") -> list[list[np.ndarray]]:
    """Outputs of the TFLM interpreter for each sample (one interpreter; ``reset()`` before every invoke);
    ``isolate=True``: in a child process."""
    model, _, rows = prepared(model, samples, where)
    return tflm_outputs(model, rows, arena_size, where)


def tflm_outputs(model: TfliteModel, rows: Sequence[tuple[np.ndarray, ...]], arena_size: int | None = None,
                 where: str = "model") -> list[list[np.ndarray]]:
    """``run_tflm`` of a parsed model on samples already checked against it (``model_io.prepared``)."""
    interp, _, _ = make_interpreter(model, arena_size, where)
    detector = postprocess_outputs(model.flatbuffer)
    results = []
    try:
        for sample in rows:
            with capture_fds() as out:
                try:
                    interp.reset()
                    for k, a in enumerate(sample):
                        interp.set_input(a, k)
                    interp.invoke()
                    err = None
                except (RuntimeError, ValueError) as e:
                    err = e
            if err is not None:
                raise TFLMError(f"{where}: TFLM invoke failed ({_first_error(out[0]) or err})")
            results.append(canonical_outputs([interp.get_output(j) for j in range(len(model.info.outputs))],
                                             detector))
    finally:
        del interp
    return results
