"""Capture what C code prints (TFLM's ``print_allocations``, the TFLite converter's chatter) at the file-descriptor
level: ``with capture_fds() as out: ...`` then ``out[0]`` is the text."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from typing import Any, Iterator, Sequence

_libc = None


def _c_flush() -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no libc symbols
        pass


@contextlib.contextmanager
def capture_fds(fds: Sequence[int] = (1, 2)) -> Iterator[list[str]]:
    """Redirect the OS-level file descriptors (C ``printf`` / ``fprintf(stderr)``) into a temporary file while the
    block runs; the captured text is appended to the yielded list when the block ends (also on exceptions). The
    original descriptors are always restored."""
    box: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    _c_flush()
    saved: list[tuple[int, int]] = []
    with tempfile.TemporaryFile() as tmp:
        try:
            for fd in fds:
                saved.append((fd, os.dup(fd)))
                os.dup2(tmp.fileno(), fd)
            yield box
        finally:
            _c_flush()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            tmp.seek(0)
            box.append(tmp.read().decode("utf-8", "replace"))


def import_tensorflow_quietly(log_path: str | None = None) -> Any:
    """Import TensorFlow with its C++ start-up chatter captured: the absl "log messages before InitializeLog" notice
    and the CUDA probing of a machine without a GPU (``Could not find cuda drivers``, ``failed call to cuInit``),
    which read like failures and carry nothing for a CPU run. The text goes to ``log_path`` (appended) when given.
    Later messages follow ``TF_CPP_MIN_LOG_LEVEL`` (the pipelines set 2: errors only)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with capture_fds((2,)) as out:
        import tensorflow as tf

        tf.config.list_physical_devices()  # the CUDA probe happens here, not at import
    if log_path:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        with open(log_path, "a") as f:
            f.write(out[0])
    return tf
