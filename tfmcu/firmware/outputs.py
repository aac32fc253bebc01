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
import re
import shutil
import struct
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


BOOT2_BYTES = 256  # the RP2040's second-stage bootloader: 252 bytes and their CRC-32


def boot2_crc(data: bytes) -> int:
    """The CRC-32 the RP2040's boot ROM checks over the second stage's first 252 bytes: polynomial 0x04C11DB7,
    initial value 0xFFFFFFFF, neither input nor output reflected, no final XOR (CRC-32/MPEG-2)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def seal_boot2(elf: str) -> bool:
    """Writes the CRC into the ELF's section .boot2 (the RP2040's second stage, board_cortex_m0plus.c) so that the
    boot ROM runs it; False when the ELF has no such section (another board)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "boot2.bin")
        subprocess.run([_tool("objcopy"), "-O", "binary", "--only-section=.boot2", elf, raw], check=True,
                       capture_output=True)
        data = open(raw, "rb").read() if os.path.exists(raw) else b""
        if not data:
            return False
        if len(data) != BOOT2_BYTES:
            raise ValueError(f"{elf}: section .boot2 holds {len(data)} bytes, not {BOOT2_BYTES}")
        with open(raw, "wb") as f:
            f.write(data[:-4] + boot2_crc(data[:-4]).to_bytes(4, "little"))
        subprocess.run([_tool("objcopy"), f"--update-section=.boot2={raw}", elf], check=True, capture_output=True)
    return True


UF2_MAGIC = (0x0A324655, 0x9E5D5157, 0x0AB16F30)  # the first two words of a block, and its last
UF2_FAMILY_PRESENT = 0x00002000
UF2_PAYLOAD = 256


def uf2_bytes(image: bytes, base: int, family: int) -> bytes:
    """``image`` (loaded at ``base``) as UF2 (Microsoft's USB flashing format, as a board's boot ROM takes it over USB
    mass storage): 512-byte blocks of 256 payload bytes each, the family ID in every block."""
    count = -(-len(image) // UF2_PAYLOAD)
    out = bytearray()
    for n in range(count):
        chunk = image[n * UF2_PAYLOAD:(n + 1) * UF2_PAYLOAD].ljust(UF2_PAYLOAD, b"\0")
        head = struct.pack("<8I", UF2_MAGIC[0], UF2_MAGIC[1], UF2_FAMILY_PRESENT, base + n * UF2_PAYLOAD,
                           UF2_PAYLOAD, n, count, family)
        out += head + chunk.ljust(476, b"\0") + struct.pack("<I", UF2_MAGIC[2])
    return bytes(out)


def write_board_files(out_dir: str, built_elf: str, qemu_elf: str | None = None,
                      uf2: tuple[int, int] | None = None) -> dict[str, str]:
    """Copies the board's ELF (and the link QEMU runs, when it is another) into ``out_dir`` and writes its .bin,
    .hex and .map beside it; returns {kind: path} (kinds ``KINDS``, and "qemu_elf"). ``uf2``: (the Flash's base, the
    UF2 family ID) of a board that boots a UF2 (the Raspberry Pi Pico): its second stage sealed (``seal_boot2``) and
    ``firmware.uf2`` written too."""
    files = {"elf": os.path.join(out_dir, ELF)}
    shutil.copyfile(built_elf, files["elf"])
    if uf2 is not None and not seal_boot2(files["elf"]):
        raise ValueError(f"{built_elf}: no section .boot2 (the RP2040's second stage) to boot a UF2 from")
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
    if uf2 is not None:
        files["uf2"] = write_uf2(files["elf"], *uf2)
    return files


def write_uf2(elf: str, base: int, family: int) -> str:
    """``<elf stem>.uf2``: the ELF's raw image (objcopy -O binary: from its lowest load address, which must be the
    Flash's ``base``) as UF2 blocks of ``family``."""
    lines = subprocess.run([_tool("objdump"), "-h", elf], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    # a section's line (index, name, size, VMA, LMA, ...) and its flags on the next line
    lowest = min(int(ln.split()[4], 16) for ln, flags in zip(lines, lines[1:])
                 if re.match(r"\s*\d+\s+\S+\s+[0-9a-f]{8}\s", ln) and int(ln.split()[2], 16) > 0 and "LOAD" in flags)
    if lowest != base:
        raise ValueError(f"{elf}: its image starts at 0x{lowest:08x}, not at the Flash's 0x{base:08x}")
    path = elf[:-len(".elf")] + ".uf2"
    with tempfile.TemporaryDirectory() as tmp:
        image = os.path.join(tmp, "image.bin")
        subprocess.run([_tool("objcopy"), "-O", "binary", elf, image], check=True, capture_output=True)
        with open(image, "rb") as f, open(path, "wb") as out:
            out.write(uf2_bytes(f.read(), base, family))
    return path


def write_library_archive(built: str, library_dir: str) -> str:
    """The model library's archive (Bazel's ``:libtfmcu_model``) copied into the library's folder without its
    debug sections (``arm-none-eabi-strip -g``: the code is the same); returns its path."""
    path = os.path.join(library_dir, LIBRARY_ARCHIVE)
    if os.path.exists(path):
        os.remove(path)
    subprocess.run([_tool("strip"), "-g", built, "-o", path], check=True, capture_output=True)
    os.chmod(path, 0o644)
    return path


def board_file_names(t: Target | None = None) -> dict[str, str]:
    """{kind: file name} of the files a board takes (``KINDS``, and "uf2" for a board that boots UF2 files)."""
    names = {k: f"firmware.{k}" for k in KINDS}
    return {**names, "uf2": "firmware.uf2"} if t is None or t.uf2_family is not None else names


def flash_commands(t: Target) -> list[str]:
    """The board's flash commands (boards.json ``flash_with``), run in the deploy folder (the files' names)."""
    return [c.format(**board_file_names()) for c in t.flash_with]


def write_example(out_dir: str, built: str, uf2: tuple[int, int] | None = None) -> str:
    """Copies the example application's ELF into ``out_dir`` (``EXAMPLE_ELF``); for a board that boots UF2 files
    its second stage sealed and ``example.uf2`` beside it."""
    path = os.path.join(out_dir, EXAMPLE_ELF)
    shutil.copyfile(built, path)
    if uf2 is not None:
        seal_boot2(path)
        write_uf2(path, *uf2)
    return path
