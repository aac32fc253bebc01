"""A firmware folder (``tfmcu.firmware.sources.folder_files``) built with Bazel and run under QEMU.

``run_firmware(out_dir, target, arena, kernels)`` builds ``@tfmcu_fw//:firmware`` from this checkout
(``bazel build --override_repository=tfmcu_fw=OUT_DIR``), copies the build's ELF into the folder with the files a
board takes (``tfmcu.firmware.outputs``) and runs that copy on the target's QEMU board (tools/qemu/run_firmware.py),
which checks the output bytes against the folder's ``expect.json``. It returns what was measured (``FirmwareRun``,
deploy.json's ``run``), whether the model fits and the verdict: "fits" when it links into the target's memory and
AllocateTensors succeeds; a link that overflows the target's RAM or Flash, or an arena TFLM finds too small, is
"does not fit", with the figure. Anything else that goes wrong is a one-line ``DeployError``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

from tfmcu.errors import TfmcuError
from tfmcu.firmware.outputs import (EXAMPLE_ELF, ELF, LIBRARY_ARCHIVE, QEMU_ELF, build_lock, write_board_files,
                                    write_example, write_library_archive)
from tfmcu.firmware.sources import KERNELS_WHAT, LIBRARY_DIR, REPO, ROOT
from tfmcu.firmware.targets import Target
from tfmcu.records import Record, optional, present


_OVERFLOW = re.compile(r"region `(\w+)' overflowed by (\d+) bytes")
_BUDGET = "exceed the target SRAM budget (TFMCU_SRAM_BUDGET)"  # tflm_patch_kernels/firmware/mps2.ld
_TFLM_MISSING = re.compile(r"Requested: (\d+), available (\d+), missing: (\d+)")


class DeployError(TfmcuError):
    """The firmware could not be built or run for a reason other than the model not fitting; one line."""


@dataclass(frozen=True, kw_only=True)
class Overflow(Record):
    """The memory region a link overflowed, and by how many bytes (None: the linker script's SRAM assertion)."""

    region: str
    bytes: int | None


def _linked(r: "FirmwareRun") -> bool:
    return r.linked


def _short(r: "FirmwareRun") -> bool:
    return r.linked and not r.allocated


def _allocated(r: "FirmwareRun") -> bool:
    return r.linked and bool(r.allocated)


@dataclass(frozen=True, kw_only=True)
class ExampleRun(Record):
    """What the example application (examples/classify/main.c over the model library) printed on the board: its top
    class, the FNV-1a hash of output 0, the ticks of the board's timer for the invoke and the arena TFLM used."""

    top_class: list[int]
    output_fnv1a32: str
    ticks: int
    arena_used_bytes: int


@dataclass(frozen=True, kw_only=True)
class FirmwareRun(Record):
    """What a firmware's build and run measured (deploy.json's ``run``). Not linked: only ``overflow``; linked: the
    QEMU run's figures; ``outputs_equal_tflite`` once TFLM allocated the arena and the outputs were checked: they
    equal expect.json's, TF Lite's outputs but on an input that meets a rounding tie in the FULLY_CONNECTED head,
    TFLM's on this host there (deploy.json's ``reference``)."""

    linked: bool
    overflow: Overflow | None = optional()
    measured_by: str | None = present(_linked)
    sizes: dict[str, int] | None = present(_linked)
    allocated: bool | None = present(_linked)
    arena_used_bytes: int | None = present(_linked)
    stack_hwm_bytes: int | None = present(_linked)
    ram_static_bytes: int | None = present(_linked)
    invoke_insns: list[int | None] | None = present(_linked)
    top_class: list[int] | None = present(_linked)
    problems: list[str] | None = present(_linked)
    tflm_missing_bytes: int | None = present(_short)  # AllocateTensors failed: the bytes TFLM said it missed
    outputs_equal_tflite: bool = present(_allocated, default=False)
    streamed_rows_read: list[int] | None = optional()
    detections: list[list[list[int]]] | None = optional()  # a detector's, as the firmware printed them
    persistent_bytes: int | None = optional()  # TFLM's persistent buffer apart from the arena (its size)
    persistent_at: str | None = optional()  # and its address, "0x..." (in the board's persistent_ram region)
    # a per-op firmware (deploy --profile): the first Invoke's ops as TFLM tags them, and each one's instructions
    op_tags: list[str] | None = optional()
    op_insns: list[int] | None = optional()
    # the example application on the same QEMU board: what it printed, equal to TF Lite's on its frame
    example: ExampleRun | None = optional()

    @property
    def instructions(self) -> int | None:
        """The fewest instructions of one Invoke over the test inputs (None: not run)."""
        counts = [i for i in self.invoke_insns or [] if i is not None]
        return min(counts) if counts else None


def measured_by(t: Target, kernels: str) -> str:
    """Where and with which kernels the run measured (deploy.json's ``run.measured_by``)."""
    how = (f"QEMU {t.machine} running the firmware linked for the QEMU board's memory with {t.name}'s "
           f"{t.sram_bytes // 1024} KiB of SRAM as the limit" if t.qemu == "stand-in" else
           f"QEMU {t.machine} running the board's firmware with the QEMU board's timer and UART" if t.board_elf else
           f"QEMU {t.machine}")
    return f"{how}, TFLM built from source (the pinned archive; {KERNELS_WHAT[kernels]})"


def firmware_elf(t: Target, out_dir: str | None = None) -> str:
    """The ELF QEMU runs for ``t`` (``run_firmware``'s last build): the board's own, or its QEMU link
    (``firmware_qemu``) where the board needs one (``out_dir``: the folder, whose qemu.ld asks for one too)."""
    own = t.qemu == "stand-in" or t.board_elf or (out_dir is not None and os.path.exists(os.path.join(out_dir,
                                                                                                          "qemu.ld")))
    return os.path.join(ROOT, "bazel-bin", "external", REPO, f"{'firmware_qemu' if own else 'firmware'}.elf")


def run_elf(out_dir: str) -> str:
    """The folder's copy of the ELF QEMU ran (``run_firmware`` copies every build: ``tfmcu.firmware.outputs``)."""
    own = os.path.join(out_dir, QEMU_ELF)
    return own if os.path.exists(own) else os.path.join(out_dir, ELF)


def run_firmware(out_dir: str, t: Target, arena: tuple[int, int, int], kernels: str, timeout_s: int = 300,
                 log: Callable[[str], None] = print, console: str = "semihosting",
                 tflm_inputs: int = 0, segments: str | None = None) -> tuple[FirmwareRun, bool, str]:
    """Build the folder's firmware and run it under QEMU (see the module docstring): ``(run, fits, verdict)``.
    ``arena``: the folder's arena, its predicted arena and its stack in bytes (they go into the verdict);
    ``console``: the firmware's (deploy --console: "uart" runs QEMU with semihosting off, the report on the UART);
    ``tflm_inputs``: on how many inputs expect.json has TFLM's outputs on this host (rounding ties: deploy's
    ``DeployReference``), for the verdict; ``segments``: where the plugin writes its per-address counts split at
    every marker (a per-op firmware's profile: ``tfmcu.firmware.profile``)."""
    arena_bytes, predicted_bytes, stack_bytes = arena
    out = os.path.abspath(out_dir)
    log(f"deploy: bazel build @{REPO}//:firmware for {t.name} (TFLM is compiled the first time: minutes) ...")
    # a board QEMU runs through a link or a board library of its own (targets.Target.qemu_link): both binaries, the
    # board's decides what fits
    run_name = os.path.basename(firmware_elf(t, out))[:-len(".elf")]
    example_name = run_name.replace("firmware", "example")  # the example application, linked the same way
    cmd = ["bazel", "build", "--noshow_progress", f"--override_repository={REPO}={out}", f"@{REPO}//:firmware",
           *([f"@{REPO}//:{run_name}"] if run_name != "firmware" else []), f"@{REPO}//:{example_name}",
           f"@{REPO}//:{LIBRARY_ARCHIVE[:-2]}", "//tools/qemu:libinsn_count.so"]
    with build_lock(ROOT):  # Bazel's output is one path for every folder: this build's ELF copied before another
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            built = os.path.dirname(firmware_elf(t, out))
            uf2 = (t.flash.base, t.uf2_family) if t.uf2_family is not None else None
            files = write_board_files(out, os.path.join(built, "firmware.elf"), firmware_elf(t, out), uf2=uf2)
            write_example(out, os.path.join(built, f"{example_name}.elf"), uf2=uf2)
            write_library_archive(os.path.join(built, LIBRARY_ARCHIVE), os.path.join(out, LIBRARY_DIR))
    if r.returncode != 0:
        m = _OVERFLOW.search(r.stderr)
        if not m and _BUDGET in r.stderr:  # mps2.ld's ASSERT: .data + .bss + stack over the target's SRAM
            verdict = (f"does not fit {t.name}: .data + .bss + stack exceed its {t.sram_bytes:,} B of SRAM (arena "
                       f"{arena_bytes:,} B + stack {stack_bytes:,} B + the rest)")
            return FirmwareRun(linked=False, overflow=Overflow(region="RAM", bytes=None)), False, verdict
        if not m:
            log_path = os.path.join(out, "build.log")
            with open(log_path, "w") as f:
                f.write(r.stderr)
            raise DeployError(f"bazel build @{REPO}//:firmware failed (not a memory overflow): see {log_path}")
        region, missing = m.group(1), int(m.group(2))
        verdict = (f"does not fit {t.name}: the link overflows {region} by {missing:,} bytes "
                   f"(arena {arena_bytes:,} B + stack {stack_bytes:,} B + the rest > "
                   f"{t.sram_bytes:,} B of SRAM)" if region == "RAM" else
                   f"does not fit {t.name}: the link overflows {region} by {missing:,} bytes")
        return FirmwareRun(linked=False, overflow=Overflow(region=region, bytes=missing)), False, verdict
    elf = files.get("qemu_elf", files["elf"])  # the folder's copy of the link QEMU runs
    plugin = os.path.join(ROOT, "bazel-bin", "tools", "qemu", "libinsn_count.so")
    run_json = os.path.join(out, "run.json")
    if not t.machine:  # no QEMU board has the core: the link is the check
        q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf", elf,
                            "--sizes-only", "--report", run_json, "--quiet"], capture_output=True, text=True)
        if q.returncode != 0:
            raise DeployError(f"{elf}: no sizes: {(q.stderr or q.stdout).strip()[-300:]}")
        with open(run_json) as f:
            sizes = json.load(f)["sizes"]
        verdict = (f"links for {t.name}: Flash {sizes['flash']:,} of {t.flash_bytes:,} B, RAM {sizes['ram']:,} of "
                   f"{t.sram_bytes:,} B (arena {arena_bytes:,} B + stack {stack_bytes:,} B + the rest); not run: no "
                   f"QEMU board has the {t.core}")
        return FirmwareRun(linked=True, measured_by=f"linked for {t.name} (not run: no QEMU board has the {t.core})",
                           sizes=sizes, allocated=None, arena_used_bytes=None, stack_hwm_bytes=None,
                           ram_static_bytes=None, invoke_insns=[], top_class=None, problems=[]), True, verdict
    log(f"deploy: running on QEMU {t.machine} ...")
    q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf", elf,
                        "--machine", t.machine, "--plugin", plugin, "--timeout", str(timeout_s),
                        "--expect", os.path.join(out, "expect.json"), "--report", run_json, "--quiet",
                        "--console", console, "--console-serial", str(t.console_serial),
                        *(["--segments", segments] if segments else [])],
                       capture_output=True, text=True)
    try:
        with open(run_json) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        raise DeployError(f"QEMU run of {elf} gave no report: {(q.stderr or q.stdout).strip()[-300:]}") from None
    res = rep.get("result") or {}
    regions = res.get("regions", [])
    figures: dict[str, Any] = dict(
        linked=True, measured_by=measured_by(t, kernels), sizes=rep["sizes"], allocated=bool(res.get("allocated")),
        arena_used_bytes=res.get("arena_used_bytes"), stack_hwm_bytes=res.get("stack_hwm"),
        ram_static_bytes=res.get("ram_static"), invoke_insns=[g.get("insns") for g in regions],
        top_class=res.get("top_class"), problems=rep["problems"])
    if not res.get("allocated"):
        m = _TFLM_MISSING.search(q.stdout)
        verdict = (f"does not fit {t.name}: AllocateTensors failed in the {arena_bytes:,}-byte "
                   f"arena" + (f" (TFLM: {m.group(3)} bytes missing)" if m else ""))
        return FirmwareRun(**figures, tflm_missing_bytes=int(m.group(3)) if m else None), False, verdict
    if rep["problems"]:
        raise DeployError(f"firmware on {t.machine}: {'; '.join(rep['problems'])}")
    example = None
    with open(os.path.join(out, "expect.json")) as f:
        has_example = "example" in json.load(f)
    if has_example:  # the example application on the same board: its top class and output bytes = TF Lite's
        log(f"deploy: running the example application on QEMU {t.machine} ...")
        ex_json = os.path.join(out, "example_run.json")
        q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf",
                            os.path.join(out, EXAMPLE_ELF), "--machine", t.machine, "--example", "--timeout",
                            str(timeout_s), "--expect", os.path.join(out, "expect.json"), "--report", ex_json,
                            "--quiet", "--console", console, "--console-serial", str(t.console_serial)],
                           capture_output=True, text=True)
        try:
            with open(ex_json) as f:
                ex = json.load(f)
        except (OSError, ValueError):
            raise DeployError(f"QEMU run of the example gave no report: {(q.stderr or q.stdout).strip()[-300:]}") \
                from None
        if ex["problems"]:
            raise DeployError(f"example application on {t.machine}: {'; '.join(ex['problems'])}")
        example = ExampleRun(**ex["example"])
    run = FirmwareRun(**figures, outputs_equal_tflite=True, streamed_rows_read=res.get("streamed_rows_read"),
                      persistent_bytes=res.get("persistent_bytes"), persistent_at=res.get("persistent_at"),
                      op_tags=res.get("op_tags"), op_insns=res.get("op_insns"), example=example)
    psram = rep["sizes"].get("psram", 0)
    apart = (f" ({arena_bytes:,} B in {t.ram.name}, TFLM's persistent data in a {res['persistent_bytes']:,} B buffer in "
             f"{t.persistent_ram} at {res['persistent_at']})" if res.get("persistent_bytes") else "")
    verdict = (f"fits {t.name}: arena {res['arena_used_bytes']:,} B used (predicted {predicted_bytes:,}"
               f" B){apart}, RAM {res['ram_static'] + res['stack_size']:,} of {t.sram_bytes:,} B, Flash "
               f"{rep['sizes']['flash']:,} of {t.flash_bytes:,} B"
               + (f" + the model's {psram:,} B in external memory (PSRAM)" if psram else "")
               + (f"; outputs equal TF Lite's on {len(regions) - tflm_inputs} of {len(regions)} inputs and TFLM's "
                  f"on this host on {tflm_inputs} (rounding ties in the FULLY_CONNECTED head)" if tflm_inputs else
                  f"; outputs equal TF Lite's on {len(regions)} inputs")
               + (f", image rows streamed from Flash ({'/'.join(map(str, sorted(set(res['streamed_rows_read']))))} "
                  f"per input)" if res.get("streamed_rows_read") else ""))
    return run, True, verdict
