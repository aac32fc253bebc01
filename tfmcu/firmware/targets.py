"""The boards firmware is built for, as `deploy` and `fit` know them (``--target``): one data file, ``boards.json``.

Each board names its core, its Flash and every SRAM region (base, size, what it is), the region the firmware's
stack, .data and .bss go to (``firmware_ram``: TFLM's arena included), and the firmware build that runs it: the
startup, board file, Bazel platform (the core's compiler flags) and QEMU board of one of the firmware builds of
``tflm_patch_kernels/firmware/firmware.bzl`` (``BUILDS`` here has the same table; tests/test_deploy.py checks the
two agree). A board whose memory differs from that build's linker script gets its own, made from it with the
board's memory (``linker_script``): that link is the board's truth for Flash and RAM. Where the board's memory
lies inside the QEMU board's (``qemu == "board"``), QEMU runs that same ELF; otherwise (``"stand-in"``) QEMU runs
the firmware linked to the QEMU board's memory, held to the board's SRAM.

``get_target(name)``: the board (a one-line ``UsageError`` for an unknown name or a core tfmcu does not build
for yet).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from dataclasses import dataclass

from tfmcu.errors import UsageError

KIB = 1024
BOARDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boards.json")
FIRMWARE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "tflm_patch_kernels", "firmware")


@dataclass(frozen=True)
class Build:
    """A firmware build of firmware.bzl's TARGETS: what runs a board."""

    key: str  # firmware.bzl TARGETS key
    machine: str  # qemu-system-arm -M
    platform: str  # Bazel platform (the core's compiler flags)
    board: str  # harness board library
    ld: str  # its linker script (tflm_patch_kernels/firmware/)
    console: bool  # its board file has a console UART (--console=uart)
    # the QEMU board's external memory, where a model larger than the Flash goes: (origin, bytes) (firmware_model.h
    # TFMCU_MODEL_IN_PSRAM, mps2.ld's .tfmcu_psram; firmware.bzl TARGETS psram): the MPS2 boards' 16 MiB PSRAM (QEMU's
    # `info mtree`), on a real part external QSPI / OSPI Flash; None: none
    psram: tuple[int, int] | None = None
    # the QEMU board's code memory holds only the code (the Cortex-M55's 512 KiB ITCM; firmware.bzl models_in_psram):
    # every model goes to ``psram`` in the links QEMU runs
    models_in_psram: bool = False

    @property
    def core(self) -> str:
        return self.platform.rsplit(":", 1)[1].replace("_", "-")


MIB = 1024 * 1024
BUILDS: dict[str, Build] = {
    "cortex_m3": Build("cortex_m3", "mps2-an385", "//tools/bazel/arm:cortex_m3", "board_cortex_m3", "mps2.ld", True,
                       psram=(0x21000000, 16 * MIB)),
    "stm32f405": Build("stm32f405", "netduinoplus2", "//tools/bazel/arm:cortex_m4", "board_stm32f405", "stm32f405.ld",
                       True),
    "cortex_m4": Build("cortex_m4", "mps2-an386", "//tools/bazel/arm:cortex_m4", "board_cortex_m4", "mps2.ld", True,
                       psram=(0x21000000, 16 * MIB)),
    "cortex_m7": Build("cortex_m7", "mps2-an500", "//tools/bazel/arm:cortex_m7", "board_cortex_m7", "mps2.ld", True,
                       psram=(0x60000000, 16 * MIB)),
    "cortex_m33": Build("cortex_m33", "mps2-an505", "//tools/bazel/arm:cortex_m33", "board_cortex_m33",
                        "mps2_an505.ld", True, psram=(0x80000000, 16 * MIB)),
    "cortex_m55": Build("cortex_m55", "mps3-an547", "//tools/bazel/arm:cortex_m55", "board_cortex_m55",
                        "mps3_an547.ld", True, psram=(0x38000000, 8 * MIB), models_in_psram=True),
    # no QEMU board has the Cortex-M0+ with enough memory: its firmware is built and linked, not run ("")
    "cortex_m0plus": Build("cortex_m0plus", "", "//tools/bazel/arm:cortex_m0plus", "board_cortex_m0plus", "mps2.ld",
                           False),
}

MIB = 1024 * KIB
# Linker scripts made from another with other memory (``build_linker_script``; a genrule writes them for Bazel,
# tools/gen/gen_linker_script.py): mps2-an505 (Cortex-M33) boots secure with its vector table at 0x10000000, the
# secure alias of its 4 MiB code SRAM (SSRAM1), and has 4 MiB of data SRAM (SSRAM2 + SSRAM3) at 0x38000000, their
# secure alias (QEMU's `info mtree`; nothing is mapped just below it, so a stack overflow faults, as on MPS2).
DERIVED_LD: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {
    "mps2_an505.ld": ("mps2.ld", {"FLASH": (0x10000000, 4 * MIB), "RAM": (0x38000000, 4 * MIB)}),
    # mps3-an547 (Cortex-M55) boots secure from its 512 KiB ITCM at 0x10000000 (secure alias) and has 4 MiB of internal
    # SRAM (ISRAM0/1) at 0x31000000 (secure alias; unmapped below it)
    "mps3_an547.ld": ("mps2.ld", {"FLASH": (0x10000000, 512 * KIB), "RAM": (0x31000000, 4 * MIB)}),
}


def build_linker_script(name: str) -> str:
    """The text of firmware build linker script ``name`` (tflm_patch_kernels/firmware/): the file, or for a
    ``DERIVED_LD`` one its base's with the MEMORY block's origins and lengths replaced."""
    base, memory = DERIVED_LD.get(name, (name, {}))
    with open(os.path.join(FIRMWARE_DIR, base)) as f:
        text = f.read()
    for region, (origin, length) in memory.items():
        text, n = re.subn(rf"^(\s*{region}\s*\(\w+\)\s*:\s*ORIGIN\s*=\s*)\w+(\s*,\s*LENGTH\s*=\s*)\w+",
                          rf"\g<1>0x{origin:08X}\g<2>{length // KIB}K", text, flags=re.M)
        if n != 1:
            raise ValueError(f"{base}: no MEMORY region {region} to place for {name}")
    if memory:
        text = (f"/* {name}: made from {base} by tfmcu.firmware.targets.build_linker_script with "
                + ", ".join(f"{r} at 0x{o:08X} ({s // KIB} KiB)" for r, (o, s) in memory.items()) + ". */\n" + text)
    return text


@dataclass(frozen=True)
class Region:
    name: str
    base: int
    bytes: int
    what: str = ""


@dataclass(frozen=True)
class Target:
    name: str  # --target value
    key: str  # firmware.bzl TARGETS key: the build that runs it
    machine: str  # qemu-system-arm -M
    platform: str  # Bazel platform (the core's compiler flags)
    board: str  # harness board library
    ld: str  # the build's linker script
    sram_bytes: int  # RAM the firmware may use: stack + .data + .bss (the arena included): its firmware_ram region
    flash_bytes: int
    what: str
    pointer_bytes: int = 4
    flash: Region | None = None
    regions: tuple[Region, ...] = ()  # every SRAM region of the board
    firmware_ram: str = ""  # the region the firmware's RAM goes to
    qemu: str = "board"  # "board": QEMU runs the board's own link; "stand-in": the QEMU board's link; "none": not run
    console: str | None = None  # what --console=uart writes to on the board (None: no console UART in its file)
    console_serial: int = 0  # which of the QEMU board's serial ports that UART is
    own_ld: bool = False  # linked with a script made from the build's and the board's memory (linker_script)
    persistent_ram: str = ""  # the region TFLM's persistent data goes to, in a buffer of its own ("": the arena's)
    qemu_bases: tuple[tuple[str, int], ...] = ()  # regions the QEMU board maps elsewhere: (name, base there)
    # the board library of the ELF flashed to the board when it is not the one QEMU runs ("": the same, ``board``):
    # a named board whose chip QEMU does not emulate takes board_dwt_<core> (the core's cycle counter), QEMU the MPS
    # board's library (firmware_qemu)
    board_elf: str = ""
    # a faster region the firmware's RAM goes to instead of firmware_ram when it holds it (``placed``): the
    # STM32H743's DTCM before its AXI SRAM; TFLM's persistent data then goes to firmware_ram
    fast_ram: str = ""
    clock_hz: int | None = None  # the core clock the board runs at (boards.json clock_mhz): ms from cycles
    # how the firmware goes onto the board (boards.json flash_with): commands with {elf}, {bin}, {hex}, {uf2}
    flash_with: tuple[str, ...] = ()
    # a board whose boot ROM takes UF2 files (boards.json uf2_family: the Raspberry Pi Pico's RP2040): deploy writes
    # firmware.uf2 for this family ID, the second-stage bootloader sealed
    uf2_family: int | None = None

    @property
    def core(self) -> str:
        """The core ("cortex-m4", "cortex-m7"): what the latency predictor is calibrated per."""
        return self.platform.rsplit(":", 1)[1].replace("_", "-")

    @property
    def ram(self) -> Region:
        return next(r for r in self.regions if r.name == self.firmware_ram)

    @property
    def persistent(self) -> Region | None:
        """The region of TFLM's persistent data when the board keeps it apart from the arena (None: in the arena)."""
        return next((r for r in self.regions if r.name == self.persistent_ram), None)

    def placed(self, region: str) -> "Target":
        """The board with its firmware's RAM (stack, .data, .bss: the arena) in ``region``: ``firmware_ram`` or
        ``fast_ram``. In ``fast_ram`` TFLM's persistent data, where the board keeps it apart, goes to the region the
        firmware's RAM leaves (the STM32H743: the arena in the DTCM, the persistent data in the AXI SRAM)."""
        if region == self.firmware_ram:
            return self
        if not region or region != self.fast_ram:
            raise ValueError(f"{self.name}: the firmware's RAM goes to {self.firmware_ram}"
                             + (f" or {self.fast_ram}" if self.fast_ram else "") + f", not {region!r}")
        r = next(r for r in self.regions if r.name == region)
        persistent = self.firmware_ram if self.persistent_ram == region else self.persistent_ram
        return dataclasses.replace(self, firmware_ram=region, sram_bytes=r.bytes, persistent_ram=persistent,
                                   fast_ram="")

    @property
    def qemu_link(self) -> bool:
        """Whether the firmware QEMU runs is linked apart from the board's (``firmware_qemu``): a stand-in board, a
        region the QEMU board maps elsewhere (the persistent buffer's, when the firmware has one), or a board ELF with
        a board library of its own (``board_elf``)."""
        return self.qemu == "stand-in" or bool(self.qemu_bases) or bool(self.board_elf)


def _kib(entry: dict, where: str) -> Region:
    try:
        return Region(str(entry["name"]), int(str(entry["base"]), 16), int(entry["size_kib"]) * KIB,
                      str(entry.get("what", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: a region needs name, base (hex) and size_kib ({type(e).__name__}: {e})") from None


def _board(name: str, b: dict, source: str = BOARDS_FILE) -> tuple[Target | None, str]:
    """The Target of board ``name`` (None when tfmcu does not build for its core yet) and its core; ``source``: the
    file it comes from (for messages)."""
    where = f"{source}: board {name}"
    if not isinstance(b, dict) or not all(k in b for k in ("what", "core", "flash", "sram", "runs_on", "qemu")):
        raise ValueError(f"{where}: a board needs what, core, flash, sram, firmware_ram, runs_on and qemu "
                         f"(docs/boards.md#add-a-board)")
    regions = tuple(_kib(r, where) for r in b.get("sram") or [])
    flash = _kib(b["flash"], where)
    if not regions or b.get("firmware_ram") not in [r.name for r in regions]:
        raise ValueError(f"{where}: firmware_ram {b.get('firmware_ram')!r} is not one of its sram regions")
    if b.get("supported", True) is False:
        return None, str(b["core"])
    build = BUILDS.get(b.get("runs_on"))
    if build is None or b.get("qemu") not in ("board", "stand-in", "none") or (b["qemu"] == "none") != (not build.machine):
        raise ValueError(f"{where}: runs_on must be one of {', '.join(BUILDS)} and qemu 'board' or 'stand-in' ('none' "
                         f"for a build no QEMU board runs)")
    if build.core != b["core"]:
        raise ValueError(f"{where}: core {b['core']} but runs_on {build.key} builds for {build.core}")
    ram = next(r for r in regions if r.name == b["firmware_ram"])
    persistent = str(b.get("persistent_ram") or "")
    if persistent and (persistent == ram.name or persistent not in [r.name for r in regions]):
        raise ValueError(f"{where}: persistent_ram {persistent!r} must be another of its sram regions")
    fast = str(b.get("fast_ram") or "")
    if fast and (fast == ram.name or fast not in [r.name for r in regions]):
        raise ValueError(f"{where}: fast_ram {fast!r} must be another of its sram regions")
    if fast and dict((r.name, r.bytes) for r in regions)[fast] >= ram.bytes:
        raise ValueError(f"{where}: fast_ram {fast!r} must be smaller than firmware_ram {ram.name!r} (tried first)")
    try:
        qemu_bases = tuple((str(k), int(str(v), 16)) for k, v in (b.get("qemu_bases") or {}).items())
    except ValueError:
        raise ValueError(f"{where}: qemu_bases maps region names to hex addresses") from None
    if any(k not in [r.name for r in regions] for k, _ in qemu_bases):
        raise ValueError(f"{where}: qemu_bases names a region the board does not have")
    # a real board's console UART (tflm_patch_kernels/firmware/BUILD: CONSOLES): its ELF's board library is the
    # build's board file (or board_dwt) with that driver, <library>_<console_uart>
    console_uart = str(b.get("console_uart") or "")
    if console_uart and not b.get("console"):
        raise ValueError(f"{where}: console_uart {console_uart!r} needs 'console': where it writes on the board")
    dwt = name not in BUILDS_BY_NAME and build.key in DWT_BUILDS
    if console_uart and not dwt and build.machine:
        raise ValueError(f"{where}: console_uart is for a chip QEMU does not emulate (use board_file)")
    board = str(b.get("board_file") or build.board) + (f"_{console_uart}" if console_uart and not dwt else "")
    t = Target(name, build.key, build.machine, build.platform, board, build.ld,
               ram.bytes, flash.bytes, str(b["what"]), flash=flash, regions=regions, firmware_ram=ram.name,
               qemu=str(b["qemu"]), console=b.get("console") if build.console or console_uart else None,
               console_serial=int(b.get("console_serial", 0)), own_ld=name not in BUILDS_BY_NAME,
               persistent_ram=persistent, qemu_bases=qemu_bases, fast_ram=fast,
               board_elf=(f"board_dwt_{build.key}" + (f"_{console_uart}" if console_uart else "")) if dwt else "",
               clock_hz=int(b["clock_mhz"]) * 1_000_000 if b.get("clock_mhz") else None,
               flash_with=tuple(str(c) for c in b.get("flash_with") or ()),
               uf2_family=int(str(b["uf2_family"]), 16) if b.get("uf2_family") else None)
    return t, str(b["core"])


# The MPS2 / MPS3 builds: a named board that runs on one of them is another chip with the same core, whose own ELF
# takes the core's DWT cycle counter as its timer (board_dwt.c) instead of the MPS board's peripherals
DWT_BUILDS = ("cortex_m3", "cortex_m4", "cortex_m7", "cortex_m33", "cortex_m55")


# the builds' own boards, linked with the builds' linker scripts as they are: --target name -> build key
BUILDS_BY_NAME = {"stm32f405": "stm32f405", "cortex-m3": "cortex_m3", "cortex-m4": "cortex_m4",
                  "cortex-m7": "cortex_m7", "cortex-m33": "cortex_m33",
                  "cortex-m55": "cortex_m55"}


@functools.lru_cache(maxsize=None)
def board_entries() -> dict[str, dict]:
    """The boards as ``boards.json`` has them (its entries, in its order)."""
    with open(BOARDS_FILE) as f:
        return json.load(f)["boards"]


# A boards file of the user's own (boards.json's format): its boards are added to tfmcu's (a name of tfmcu's replaced),
# so that a board is one entry in a file beside the user's project, with no change to this checkout.
BOARDS_ENV = "TFMCU_BOARDS"


def _load() -> tuple[dict[str, Target], dict[str, str], str]:
    """The boards (name -> Target), those whose core tfmcu does not build for yet (name -> core), and what is wrong
    with the file ``$TFMCU_BOARDS`` names ("": nothing; ``get_target`` says it in one line)."""
    entries = [(name, b, BOARDS_FILE) for name, b in board_entries().items()]
    error = ""
    path = os.environ.get(BOARDS_ENV)
    if path:
        try:
            with open(path) as f:
                extra = json.load(f)["boards"]
            if not isinstance(extra, dict):
                raise TypeError("'boards' must map board names to boards")
            entries = [e for e in entries if e[0] not in extra] + [(n, b, path) for n, b in extra.items()]
        except (OSError, ValueError, KeyError, TypeError) as e:
            error = f"${BOARDS_ENV}={path}: {type(e).__name__}: {e} (a JSON file {{\"boards\": {{name: board}}}})"
    targets, unsupported = {}, {}
    for name, b, source in entries:
        try:
            t, core = _board(name, b, source)
        except (KeyError, TypeError, ValueError) as e:
            if source == BOARDS_FILE:
                raise
            error = error or (str(e) if isinstance(e, ValueError) else f"{source}: board {name}: missing {e}")
            continue
        if t is None:
            unsupported[name] = core
        else:
            targets[name] = t
    return targets, unsupported, error


TARGETS, UNSUPPORTED, BOARDS_ERROR = _load()  # the boards tfmcu builds for (name -> Target), those whose core it
# does not build for yet (name -> core), and what is wrong with $TFMCU_BOARDS' file


def get_target(name: str) -> Target:
    if BOARDS_ERROR:
        raise UsageError(BOARDS_ERROR)
    t = TARGETS.get(name)
    if t is None:
        if name in UNSUPPORTED:
            raise UsageError(f"--target={name}: its core ({UNSUPPORTED[name]}) is not supported yet; supported "
                             f"cores: {', '.join(sorted({t.core for t in TARGETS.values()}))}")
        raise UsageError(f"--target={name}: unknown; supported: {', '.join(TARGETS)}")
    return t


def linker_script(t: Target, qemu: bool = False) -> str:
    """The board's linker script: its build's (tflm_patch_kernels/firmware/<ld>) with the MEMORY block holding the
    board's Flash and its firmware RAM region (the other regions listed in a comment, unused by the link, but those
    the build's script names: the STM32F405's CCM, and PERSISTENT, the board's ``persistent_ram``). ``qemu``: the
    link QEMU runs, with the regions the QEMU board maps elsewhere (``qemu_bases``) at their QEMU addresses; for a
    stand-in board (``qemu == "stand-in"``) the build's own memory with the persistent region past the RAM the
    firmware may use (``stand_in_script``)."""
    text = build_linker_script(t.ld)
    m = re.search(r"MEMORY\s*\{[^}]*\}", text)
    if m is None:
        raise ValueError(f"{t.ld}: no MEMORY block")
    if qemu and t.qemu == "stand-in":
        return stand_in_script(t, text, m)
    ram = t.ram
    others = "".join(f"\n *   {r.name} {r.bytes // KIB} KiB at 0x{r.base:08x} ({r.what})"
                     + (": TFLM's persistent data (.tfmcu_persistent)" if r.name == t.persistent_ram else "")
                     for r in t.regions if r.name != ram.name)
    header = (f"/* {t.name}: {t.what}. Made by tfmcu deploy from {t.ld} with the board's memory: Flash "
              f"{t.flash.bytes // KIB} KiB at 0x{t.flash.base:08x}; {ram.name} {ram.bytes // KIB} KiB at "
              f"0x{ram.base:08x} ({ram.what}): stack, .data, .bss."
              + (f" Other regions:{others}" if others else "")
              + (f" Linked for QEMU {t.machine}: {', '.join(n for n, _ in t.qemu_bases)} where it maps them."
                 if qemu and t.qemu_bases else "") + " */\n")
    lines = [f"    FLASH (rx) : ORIGIN = 0x{t.flash.base:08X}, LENGTH = {t.flash.bytes // KIB}K",
             f"    RAM (rwx)  : ORIGIN = 0x{ram.base:08X}, LENGTH = {ram.bytes // KIB}K"]
    by_name = {r.name: r for r in t.regions}
    for other in re.finditer(r"^\s*(\w+)\s*\((\w+)\)\s*:\s*ORIGIN\s*=\s*(\w+)", m.group(0), re.M):
        name, attrs, origin = other.groups()
        if name in ("FLASH", "RAM"):
            continue
        # a region the build's script names (the STM32F405's CCM; PERSISTENT: the board's persistent_ram): the
        # board's, or none
        r = t.persistent if name == PERSISTENT else by_name.get(name)
        base = dict(t.qemu_bases).get(name) if qemu else None
        where = f"  /* the board's 0x{r.base:08X}, where QEMU {t.machine} maps it */" if base is not None else ""
        base = r.base if base is None and r is not None else base
        lines.append(f"    {name} ({attrs}) : ORIGIN = 0x{base:08X}, LENGTH = {r.bytes // KIB}K{where}"
                     if r is not None else f"    {name} ({attrs}) : ORIGIN = {origin}, LENGTH = 0  /* not on this board */")
    memory = "MEMORY\n{\n" + "\n".join(lines) + "\n}"
    return header + text[:m.start()] + memory + text[m.end():]


PERSISTENT = "PERSISTENT"  # the MEMORY region of TFLM's persistent buffer in the MPS2 builds' script (mps2.ld)


def stand_in_script(t: Target, text: str, m: re.Match) -> str:
    """The link QEMU runs for a stand-in board whose firmware keeps TFLM's persistent data apart: the build's
    script ``text`` (its MEMORY block ``m``) with its RAM shortened by the board's persistent region and that region
    (``PERSISTENT``) placed at the RAM's end, so each buffer stays held to its own region there as on the board (the
    firmware's RAM to the board's size by TFMCU_SRAM_BUDGET)."""
    p = t.persistent
    memory = m.group(0)
    ram = re.search(r"^(\s*RAM\s*\(\w+\)\s*:\s*ORIGIN\s*=\s*)(\w+)(\s*,\s*LENGTH\s*=\s*)(\w+)", memory, re.M)
    if p is None or ram is None or not re.search(rf"^\s*{PERSISTENT}\s*\(", memory, re.M):
        raise ValueError(f"{t.ld}: no RAM and {PERSISTENT} regions for {t.name}'s persistent data")
    origin, length = int(ram.group(2), 0), _ld_size(ram.group(4))
    base = origin + length - p.bytes
    memory = (memory[:ram.start()] + f"{ram.group(1)}0x{origin:08X}{ram.group(3)}{(length - p.bytes) // KIB}K"
              + memory[ram.end():])
    memory = re.sub(rf"^(\s*{PERSISTENT}\s*\(\w+\)\s*:\s*ORIGIN\s*=\s*)\w+(\s*,\s*LENGTH\s*=\s*)\w+",
                    rf"\g<1>0x{base:08X}\g<2>{p.bytes // KIB}K", memory, flags=re.M)
    header = (f"/* {t.name}: {t.what}. The link QEMU {t.machine} runs (a stand-in: the board's memory is not where "
              f"QEMU has it): {t.ld}'s memory, the firmware's RAM held to the board's {t.ram.name} "
              f"({t.ram.bytes // KIB} KiB) by TFMCU_SRAM_BUDGET, TFLM's persistent data in {t.persistent_ram} "
              f"({p.bytes // KIB} KiB; the board's at 0x{p.base:08X}) at 0x{base:08X}, the end of QEMU's RAM. */\n")
    return header + text[:m.start()] + memory + text[m.end():]


def _ld_size(v: str) -> int:
    """A MEMORY LENGTH (``4M``, ``512K``, ``0x1000``) in bytes."""
    mult = {"K": KIB, "M": KIB * KIB}.get(v[-1].upper(), 1)
    return int(v[:-1] if mult > 1 else v, 0) * mult
