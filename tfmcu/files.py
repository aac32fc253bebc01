"""Reading inputs and writing outputs the way every pipeline does: one-line errors, and all-or-nothing outputs.

* ``read_bytes(path, what)``: the file's bytes, or a ``UsageError`` naming it ("no such file", "is a directory",
  "cannot read").
* ``check_output_paths({flag: path})``: before any work starts, each output path must be writable: not a
  directory, no file where a folder of its path should be, an existing folder that is writable. Folders that do
  not exist yet are created only when the outputs are written.
* ``write_outputs({path: data})``: every output is first written to a temporary file beside its destination; only
  when all of them are complete are they renamed into place. If anything fails, the temporary files are removed
  and no output appears (a ``UsageError`` names the path). ``data`` is bytes, str, or anything JSON-serialisable
  (written indented); entries whose path is empty or None are skipped.
* ``write_folder(out_dir, {path: text or bytes})`` / ``assembled_folder(out_dir)``: a whole folder, all-or-nothing
  the same way (assembled beside it, then renamed into place; an existing folder is replaced).
* ``figure_png(fig)``: a matplotlib figure as PNG bytes (tight layout, 110 dpi), the figure closed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from typing import Any, Iterator, Mapping

from tfmcu.errors import UsageError


def read_bytes(path: str, what: str = "") -> bytes:
    """The bytes of ``path``; ``what`` (e.g. ``--tflite``) prefixes the error message."""
    where = f"{what}={path}" if what else path
    if not os.path.exists(path):
        raise UsageError(f"{where}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{where}: is a directory, not a file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror or e})") from None


def _existing_ancestor(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def check_output_path(path: str, what: str = "") -> None:
    """Raise ``UsageError`` unless an output can be written to ``path`` (see the module docstring)."""
    where = f"{what}={path}" if what else path
    if os.path.isdir(path):
        raise UsageError(f"{where}: is a directory; give a file path")
    folder = _existing_ancestor(path)
    if not os.path.isdir(folder):
        raise UsageError(f"{where}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: folder {folder} is not writable")


def check_output_paths(paths: Mapping[str, str | None]) -> None:
    """``check_output_path`` for each {flag: path} with a path; also refuses two outputs on one path."""
    seen: dict[str, str] = {}
    for what, path in paths.items():
        if not path:
            continue
        check_output_path(path, what)
        key = os.path.abspath(path)
        if key in seen:
            raise UsageError(f"{what}={path}: the same file as {seen[key]}")
        seen[key] = what


def _serialise(data: Any) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    return (json.dumps(data, indent=2) + "\n").encode()


def write_outputs(outputs: Mapping[str, Any]) -> None:
    """Write every output ({path: data}) all-or-nothing (see the module docstring)."""
    blobs = {path: _serialise(data) for path, data in outputs.items() if path}
    for path in blobs:
        check_output_path(path)
    umask = os.umask(0)
    os.umask(umask)
    temps: list[tuple[str, str]] = []
    try:
        for path, blob in blobs.items():
            folder = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(folder, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + os.path.basename(path))
            except OSError as e:
                raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
            temps.append((tmp, path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual permissions
            except OSError as e:
                raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
        for tmp, path in temps:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextlib.contextmanager
def assembled_folder(out_dir: str, what: str = "--out_dir") -> Iterator[str]:
    """A temporary folder beside ``out_dir`` to assemble it in: renamed into place when the block completes (an
    existing ``out_dir`` is replaced), removed when it fails, so ``out_dir`` appears whole or not at all.
    ``what``: the flag that named it (in the error when the parent cannot be written)."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-" + os.path.basename(os.path.abspath(out_dir)) + "-")
    except OSError as e:
        raise UsageError(f"{what}={out_dir}: cannot write ({e.strerror or e})") from None
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_folder(out_dir: str, files: Mapping[str, str | bytes], what: str = "--out_dir") -> None:
    """Write the folder ``out_dir`` holding ``files`` ({relative path: text or bytes}) all-or-nothing
    (``assembled_folder``). ``what``: the flag that named it."""
    with assembled_folder(out_dir, what) as tmp:
        for name, data in files.items():
            full = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)


def figure_png(fig: Any) -> bytes:
    """``fig`` (a matplotlib figure) as PNG bytes, laid out tight at 110 dpi; the figure is closed."""
    import matplotlib.pyplot as plt  # lazy: matplotlib is only needed where a plot is drawn

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
