"""The microcontrollers firmware is built for, as `deploy` and the firmware tests know them.

Each target names its QEMU board, the Bazel platform that compiles for its core, the harness's board library and
linker script (tflm_patch_kernels/firmware/firmware.bzl has the same table for the Bazel macros; tests/test_deploy.py
checks the two agree), and the memory an arena must share with the rest of the firmware.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfmcu.errors import UsageError

KIB = 1024


@dataclass(frozen=True)
class Target:
    name: str  # --target value
    key: str  # firmware.bzl TARGETS key
    machine: str  # qemu-system-arm -M
    platform: str  # Bazel platform (the core's compiler flags)
    board: str  # harness board library
    ld: str  # linker script
    sram_bytes: int  # RAM the firmware may use: stack + .data + .bss (the arena included)
    flash_bytes: int
    what: str
    pointer_bytes: int = 4

    @property
    def core(self) -> str:
        """The core ("cortex-m4", "cortex-m7"): what the latency predictor is calibrated per."""
        return self.platform.rsplit(":", 1)[1].replace("_", "-")


TARGETS: dict[str, Target] = {
    "stm32f405": Target(
        "stm32f405", "stm32f405", "netduinoplus2", "//tools/bazel/arm:cortex_m4", "board_stm32f405", "stm32f405.ld",
        128 * KIB, 1024 * KIB,
        "STM32F405 (Cortex-M4F, 1 MiB Flash, 128 KiB SRAM; QEMU netduinoplus2, which does not emulate the 64 KiB "
        "CCM)"),
    "cortex-m4": Target(
        "cortex-m4", "cortex_m4", "mps2-an386", "//tools/bazel/arm:cortex_m4", "board_cortex_m4", "mps2.ld",
        256 * KIB, 4096 * KIB, "Cortex-M4F with 256 KiB SRAM (QEMU mps2-an386; STM32F412/F429 class)"),
    "cortex-m7": Target(
        "cortex-m7", "cortex_m7", "mps2-an500", "//tools/bazel/arm:cortex_m7", "board_cortex_m7", "mps2.ld",
        320 * KIB, 4096 * KIB, "Cortex-M7 with 320 KiB SRAM (QEMU mps2-an500; STM32F746 class)"),
}


def get_target(name: str) -> Target:
    t = TARGETS.get(name)
    if t is None:
        raise UsageError(f"--target={name}: unknown; supported: {', '.join(TARGETS)}")
    return t
