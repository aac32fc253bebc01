"""Shared absl plumbing: user mistakes become one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402


class UsageError(ValueError):
    """A bad flag combination or argument found after flag parsing."""


def user_errors() -> tuple[type[BaseException], ...]:
    from tfmcu.ir import GraphError
    from tfmcu.models import ModelError
    from tfmcu.rewrite import RewriteError
    from tfmcu.scheduler import ScheduleError
    from tfmcu.spec import SpecError
    from tfmcu.tflite_schema import SchemaError

    errors: tuple[type[BaseException], ...] = (UsageError, GraphError, ModelError, RewriteError, ScheduleError,
                                               SpecError, SchemaError, FileNotFoundError, IsADirectoryError,
                                               PermissionError)
    try:
        from tfmcu.tflm import TFLMError
        errors += (TFLMError,)
    except ImportError:  # pragma: no cover - the TFLM wheel is part of the pinned environment
        pass
    return errors


def fail(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def run(main: Callable[[Sequence[str]], int | None]) -> None:
    prog = os.path.basename(sys.argv[0]).removesuffix(".py")
    if prog == "__main__":
        prog = (main.__module__ or "tfmcu").rsplit(".", 1)[-1]

    def parse(argv: list[str]) -> list[str]:
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as e:
            fail(prog, str(e).splitlines()[0])
        if len(rest) > 1:
            fail(prog, f"unexpected arguments: {' '.join(rest[1:])}")
        return rest

    def wrapped(argv: Sequence[str]) -> int | None:
        try:
            return main(argv)
        except user_errors() as e:
            fail(prog, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None

    app.run(wrapped, flags_parser=parse)


def parse_patches(value: str) -> tuple[int, int]:
    """--patches: P (a PxP grid) or PxQ (rows x columns)."""
    try:
        parts = [int(v) for v in value.lower().split("x")]
    except ValueError:
        raise UsageError(f"--patches={value}: expected P, PxQ or auto") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise UsageError(f"--patches={value}: expected P, PxQ or auto with P, Q >= 1")
    return parts[0], parts[1]
