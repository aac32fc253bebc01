"""The files a board takes, written to the deploy folder after each firmware build (``tfmcu.firmware.run``):

* ``firmware.elf``: the board's own link (the one to flash), and ``firmware_qemu.elf`` where QEMU runs a link of its
  own (a stand-in board, a region QEMU maps elsewhere, a board library of its own: ``Target.qemu_link``);
* ``firmware.bin`` (raw image from the lowest load address) and ``firmware.hex`` (Intel HEX), by
  ``arm-none-eabi-objcopy``;
* ``firmware.map``: the ELF's sections and its symbols by address with their sizes (``arm-none-eabi-objdump -h``,
  ``arm-none-eabi-nm``), what a linker map is read for: what lies where and how large it is;
* the board's flash commands (boards.json ``flash_with``) with those files' names (``flash_commands``);
* ``example.elf``: the example application (examples/classify/main.c over the model library), linked as the ELF
  QEMU runs; ``model/libtfmcu_model.a``: the model library as one static archive (``write_library_archive``).

Bazel writes the ELF to one place for every deploy folder (``bazel-bin/external/<repo>/``); ``build_lock`` keeps one
build-and-copy at a time, so a run reads the copy of its own build even while another deploy builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Iterator

from tfmcu.firmware.targets import Target

ELF = "firmware.elf"
QEMU_ELF = "firmware_qemu.elf"
EXAMPLE_ELF = "example.elf"  # the example application (examples/classify/main.c), linked as the ELF QEMU runs
LIBRARY_ARCHIVE = "libtfmcu_model.a"  # the model library as one static archive (the folder's :libtfmcu_model)
KINDS = ("elf", "bin", "hex", "map")


@contextlib.contextmanager
def build_lock(root: str) -> Iterator[None]:
    """An exclusive lock per checkout (a file in the temporary folder) around a firmware build and its copy."""
    name = "tfmcu-firmware-" + hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:12] + ".lock"
    with open(os.path.join(tempfile.gettempdir(), name), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tool(name: str) -> str:
    path = shutil.which(f"arm-none-eabi-{name}")
    if path is None:
        raise FileNotFoundError(f"arm-none-eabi-{name} is not on PATH (make setup installs the Arm toolchain)")
    return path


def _map_text(elf: str) -> str:
    sections = subprocess.run([_tool("objdump"), "-h", elf], capture_output=True, text=True, check=True).stdout
    symbols = subprocess.run([_tool("nm"), "-n", "-S", "-C", elf], capture_output=True, text=True, check=True).stdout
    return (f"# {os.path.basename(elf)}: its sections, then its symbols by address (address, size, type, name),\n"
            f"# read from the ELF by arm-none-eabi-objdump -h and arm-none-eabi-nm -n -S -C\n\n"
            f"## Sections\n{sections.strip()}\n\n## Symbols\n{symbols}")


def write_board_files(out_dir: str, built_elf: str, qemu_elf: str | None = None) -> dict[str, str]:
    """Copies the board's ELF (and the link QEMU runs, when it is another) into ``out_dir`` and writes its .bin,
    .hex and .map beside it; returns {kind: path} (kinds ``KINDS``, and "qemu_elf")."""
    files = {"elf": os.path.join(out_dir, ELF)}
    shutil.copyfile(built_elf, files["elf"])
    own = os.path.join(out_dir, QEMU_ELF)
    if qemu_elf is not None and qemu_elf != built_elf:
        files["qemu_elf"] = own
        shutil.copyfile(qemu_elf, own)
    elif os.path.exists(own):  # an earlier build's, for another board
        os.remove(own)
    stem = files["elf"][:-len(".elf")]
    for kind, fmt in (("bin", "binary"), ("hex", "ihex")):
        files[kind] = f"{stem}.{kind}"
        subprocess.run([_tool("objcopy"), "-O", fmt, files["elf"], files[kind]], check=True, capture_output=True)
    files["map"] = f"{stem}.map"
    with open(files["map"], "w") as f:
        f.write(_map_text(files["elf"]))
    return files


def write_library_archive(built: str, library_dir: str) -> str:
    """The model library's archive (Bazel's ``:libtfmcu_model``) copied into the library's folder without its
    debug sections (``arm-none-eabi-strip -g``: the code is the same); returns its path."""
    path = os.path.join(library_dir, LIBRARY_ARCHIVE)
    if os.path.exists(path):
        os.remove(path)
    subprocess.run([_tool("strip"), "-g", built, "-o", path], check=True, capture_output=True)
    os.chmod(path, 0o644)
    return path


def flash_commands(t: Target) -> list[str]:
    """The board's flash commands (boards.json ``flash_with``), run in the deploy folder (the files' names)."""
    return [c.format(elf=ELF, bin="firmware.bin", hex="firmware.hex") for c in t.flash_with]
