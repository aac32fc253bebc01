"""The bench section *kernels*: our kernels against CMSIS-NN's on the shapes of the MobileNetV2 family, per core.

The firmware ``//tflm_patch_kernels/firmware:fast_kernels_<core>`` (fast_kernels.c) runs, on the same random layer,
CMSIS-NN's function and ours, each in its own cost region, and checks that their outputs are equal (after the
differential fuzz of the host test, with the core's instructions): the 3x3 depthwise convolution
(arm_depthwise_conv_wrapper_s8 against tfmcu_depthwise_conv3x3_s8) and, on cores with the DSP extension and without
Helium, the 1x1 product (arm_nn_mat_mult_nt_t_s8 against the backend's folded product tfmcu_conv1x1_folded_s8) and
the first layer of an image network (arm_convolve_wrapper_s8 against tfmcu_conv2d_shallow_s8: 3x3 over RGB, stride
2).
Per region: the instructions QEMU's plugin counted, and the cycles ``tfmcu.firmware.cycles`` estimates from the
executed instructions (the core's timing table: an estimate), so the ratios come from one run of each firmware.
Which of them the backend runs is ``tfmcu.abi.depthwise3x3_ours`` / ``conv1x1_folded`` / ``conv_shallow_ours``: the
table says where ours is faster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

from benchmarks.firmware_runs import ROOT, firmware_reports
from tfmcu.firmware.cycles import estimate_cycles
from tfmcu.firmware.profile import read_segments

PKG = "tflm_patch_kernels/firmware"
CORES = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")
MACHINES = {"cortex-m3": "mps2-an385", "cortex-m4": "mps2-an386", "cortex-m7": "mps2-an500",
            "cortex-m33": "mps2-an505", "cortex-m55": "mps3-an547"}


def _bazel_name(core: str) -> str:
    return core.replace("-", "_")


def _region_counts(elf: str, machine: str, n_regions: int) -> list[dict[int, int]]:
    """Per cost region of the firmware, in order, the plugin's executions per instruction address."""
    with tempfile.TemporaryDirectory() as tmp:
        seg = os.path.join(tmp, "segments.txt")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf", elf,
                            "--machine", machine, "--plugin",
                            os.path.join(ROOT, "bazel-bin", "tools", "qemu", "libinsn_count.so"),
                            "--segments", seg, "--quiet"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{elf} on {machine}: exit {r.returncode}\n{(r.stdout + r.stderr)[-2000:]}")
        segments = read_segments(seg)
    # the stretches alternate: before a region, inside it (regions are not nested here)
    inside = [counts for i, (_, _, counts) in enumerate(segments) if i % 2 == 1]
    return inside[:n_regions]


def kernels_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the fast_kernels firmware on every core QEMU runs; a row per core, shape and function."""
    labels = [f"//{PKG}:fast_kernels_{_bazel_name(c)}_test" for c in CORES]
    reports = firmware_reports("kernels", labels, log)
    rows = []
    for core, rep in zip(CORES, reports):
        res = rep["result"]
        regions = res["regions"]
        elf = os.path.join(ROOT, "bazel-bin", PKG, f"fast_kernels_{_bazel_name(core)}.elf")
        log(f"[kernels] {core}: cycles of {len(regions)} regions (tfmcu.firmware.cycles) ...")
        counts = _region_counts(elf, MACHINES[core], len(regions))
        for reg, c in zip(regions, counts):
            if sum(c.values()) != reg["insns"]:
                raise RuntimeError(f"{core}: region {reg['name']}: segments {sum(c.values())} != plugin "
                                   f"{reg['insns']} instructions")
        for ours_reg, ours_c, theirs_reg, theirs_c in zip(regions[1::2], counts[1::2], regions[0::2], counts[0::2]):
            shape = ours_reg["name"].split("_", 1)[1]
            kind = ("1x1" if shape.startswith("1x1") else "conv 3x3, stride 2" if shape.startswith("conv_")
                    else "depthwise 3x3")
            shape = shape.removeprefix("conv_")
            cyc_ours = estimate_cycles(elf, ours_c, core).cycles
            cyc_theirs = estimate_cycles(elf, theirs_c, core).cycles
            rows.append({"core": core, "shape": shape, "kernel": kind,
                         "cmsis_nn_instructions": theirs_reg["insns"], "tfmcu_instructions": ours_reg["insns"],
                         "instructions_ratio": round(ours_reg["insns"] / theirs_reg["insns"], 4),
                         "cmsis_nn_cycles": round(cyc_theirs), "tfmcu_cycles": round(cyc_ours),
                         "cycles_ratio": round(cyc_ours / cyc_theirs, 4)})
        rows.append({"core": core, "fuzz_differences": res["fuzz_differences"],
                     "shape_mismatches": res["shape_mismatches"]})
    return {"rows": rows, "cores": list(CORES), "measured_by": (
        "QEMU instruction counts (tools/qemu/insn_count.c) of each function's cost region; cycles estimated by "
        "tfmcu.firmware.cycles (the core's timing table over the executed instructions, zero wait states)")}


def table(data: dict[str, Any]) -> str:
    rows = [r for r in data["rows"] if "shape" in r]
    checks = {r["core"]: r for r in data["rows"] if "fuzz_differences" in r}
    md = ["| core | kernel | shape | CMSIS-NN instructions | tfmcu | ratio | est. cycles ratio |",
          "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['core']} | {r['kernel']} | {r['shape']} | {r['cmsis_nn_instructions']:,} | "
                  f"{r['tfmcu_instructions']:,} | {r['instructions_ratio']:.3f}x | {r['cycles_ratio']:.3f}x |")
    ok = all(c["fuzz_differences"] == 0 and c["shape_mismatches"] == 0 for c in checks.values())
    md.append("")
    md.append(f"Measured: {data['measured_by']}. Outputs equal CMSIS-NN's on every shape, and the differential fuzz "
              f"found {'no difference' if ok else 'DIFFERENCES'} on {', '.join(checks)}. Shapes: HxWxC and stride "
              "(depthwise, SAME padding), pixels x input channels x output channels (1x1, input offset folded), "
              "HxWxC x output channels (conv 3x3, stride 2, SAME padding).")
    return "\n".join(md) + "\n"
