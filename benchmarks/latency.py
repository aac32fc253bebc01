"""Calibration of the latency predictor (``tfmcu.plan.latency``): per-op instruction counts of zoo models under QEMU.

    python -m benchmarks.latency [--cores cortex-m4,cortex-m7] [--kernels cmsis_nn,reference] [--only NAME,...]
                                 [--skip NAME,...] [--zoo_cache DIR] [--out tfmcu/plan/latency_calibration.json]
                                 [--jobs 2] [--build_only | --no_build] [--no_fit]
    python -m benchmarks.latency --merge A.json,B.json [--out ...]   # runs measured apart, into one file, fitted

Runs already in ``--out`` are kept unless measured again (a partial run adds to the file).

For every variant of ``VARIANTS`` (a zoo model per layer, or rewritten in custom mode: recompute, halo caches,
streamed input, the rest's convolutions as one-layer TFMCU_PATCH_STAGE ops, squeeze-excites inside stages) and every
core and kernel set asked for:

1. the model is built (``tfmcu.nets.zoo``, cached), rewritten as ``tools/gen/gen_model_whole.py`` does, and written
   as the firmware's model source (``tfmcu.firmware.sources.model_source``, one seeded random input) into one
   Bazel repository (``out/latency/fw``, built as ``@tfmcu_latency_fw`` the way ``deploy`` builds its folder) with
   one firmware per (variant, core, kernels): ``tflm_patch_kernels/tflm/firmware_main.cc`` compiled with
   ``-DTFMCU_PROFILE_OPS``;
2. ``bazel build`` builds them all; each runs on its QEMU board with the instruction-count plugin
   (``tools/qemu/insn_count.c``), through ``tools/qemu/run_firmware.py`` (the runner deploy uses): the plugin's regions are the Invoke and, nested in it, each of its ops; a firmware
   with a TFMCU_PATCH_STAGE op also counts every instruction address (the plugin's profile), summed over each of
   the portable element-wise kernels' functions (``portable_insns``: ``tfmcu.plan.latency.PORTABLE``);
3. the per-op counts, each op's features (``tfmcu.plan.latency.op_features``) and the Invoke's count go into the
   calibration file with the coefficients ``tfmcu.plan.latency.fit`` derives from them.

The Invoke measured in per-op mode pays the profiler's markers: a few instructions per op, measured against the same
firmware without the mode (the ``PLAIN`` variants, every core and kernel set: ``profile_overhead`` in the file); the
file stores the Invoke without them ("invoke"), which is what the predictor predicts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu import abi
from tfmcu.firmware import sources
from tfmcu.firmware.targets import BUILDS
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan import latency
from tfmcu.plan.halo import HaloOptions, select
from tfmcu.plan.regions import schedule
from tfmcu.runtime.model_io import model_info, random_inputs
from tfmcu.runtime.tflm_host import input_signature
from tfmcu.stage.custom import convs_to_flash, rewrite_custom
from tfmcu.tflite.editor import fold_static_reshapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "out", "latency")
CALIBRATION = os.path.join(ROOT, "tfmcu", "plan", "latency_calibration.json")
REPO = "tfmcu_latency_fw"  # its own name: deploy builds @tfmcu_fw from other folders meanwhile
FW = "@//tflm_patch_kernels/firmware"

# The cores the calibration runs on, and the firmware build of each (tfmcu.firmware.targets.BUILDS: the core's own QEMU
# board, not a named chip's): {core: (build key, QEMU machine, platform, board library, PSRAM origin, linker script)}
CORES = {b.core: (b.key, b.machine, b.platform, b.board, b.psram[0], b.ld)
         for b in BUILDS.values() if b.key == b.core.replace("-", "_") and b.machine and b.psram}
# Cores whose code memory holds only the code (the Cortex-M55's 512 KiB ITCM): every model in their PSRAM
MODELS_IN_PSRAM = tuple(b.core for b in BUILDS.values() if b.models_in_psram)
KERNELS = ("cmsis_nn", "reference")

# Variants also built without the per-op mode: the mode's overhead per op (the markers' calls and the tag store in
# firmware_main.cc's profiler, less the ordinary profiler's stage test), which must be the same for every op.
PLAIN = ("mbv2_035_96", "mbv2_035_96_p")
FOLDED_SYMBOL = abi.CONV1X1_FOLDED_SYMBOL  # counted on its own (tfmcu.plan.latency.FOLDED_FEATURES)


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    model: str
    patches: int | tuple[int, int] | None = None  # n x n, or (rows, columns); None: per layer (builtin ops only)
    blocks: int | None = None
    halo: str = "none"
    stream: bool = False
    rest_convs: bool = False
    inplace: bool = False
    kernels: tuple[str, ...] = KERNELS  # the kernel sets this variant is measured with
    arena_kib: int = 1024
    psram: bool = False
    passes: int = 1  # the stage's sweeps of its grid (1 + its squeeze-excites), checked when it is made


_SMALL = ["mbv2_035_96", "kernels_symmetric", "keras_mobilenet_v2", "keras_mobilenet_v1", "resnet_like",
          "tiny_per_tensor", "tiny_float_input", "mbv2_035_144"]
_PATCHES = {"tiny_per_tensor": 2, "tiny_float_input": 2}

VARIANTS: list[Variant] = (
    [Variant(name=m, model=m) for m in _SMALL]
    + [Variant(name=f"{m}_p", model=m, patches=_PATCHES.get(m, 4)) for m in _SMALL]
    + [Variant(name="mbv2_035_96_p_halo_all", model="mbv2_035_96", patches=4, halo="all"),
       Variant(name="mbv2_035_96_p_auto_stream", model="mbv2_035_96", patches=4, halo="auto", stream=True),
       Variant(name="mbv2_035_144_p9_smallest", model="mbv2_035_144", patches=9, blocks=5, halo="smallest"),
       Variant(name="mbv2_035_96_p_rest", model="mbv2_035_96", patches=4, rest_convs=True, inplace=True,
               kernels=("reference",)),
       Variant(name="mbv2_035_144_p9_smallest_rest", model="mbv2_035_144", patches=9, blocks=5, halo="smallest",
               rest_convs=True, inplace=True, kernels=("reference",)),
       Variant(name="mbv2_035_96_p_inplace", model="mbv2_035_96", patches=4, inplace=True, kernels=("reference",)),
       Variant(name="mbv2_035_96_p_auto_stream_rest", model="mbv2_035_96", patches=4, halo="auto", stream=True,
               rest_convs=True, inplace=True, kernels=("reference",)),
       Variant(name="mbv2_035_144_p9_smallest_stream_rest", model="mbv2_035_144", patches=9, blocks=5,
               halo="smallest", stream=True, rest_convs=True, inplace=True, kernels=("reference",)),
       Variant(name="mbv2_035_144_p9_all_stream_rest", model="mbv2_035_144", patches=9, blocks=5, halo="all",
               stream=True, rest_convs=True, inplace=True),
       Variant(name="mbv2_035_96_p2", model="mbv2_035_96", patches=2),
       Variant(name="mbv2_035_96_p3", model="mbv2_035_96", patches=3),
       Variant(name="mbv2_035_96_p6", model="mbv2_035_96", patches=6),
       Variant(name="mbv2_035_96_p4_b3", model="mbv2_035_96", patches=4, blocks=3),
       Variant(name="mbv2_035_144_p6_all", model="mbv2_035_144", patches=6, halo="all"),
       Variant(name="keras_mobilenet_v2_p3_all", model="keras_mobilenet_v2", patches=3, halo="all"),
       # many small patches: the folded 1x1 product's calls of 2-15 pixels (its own row)
       Variant(name="mbv2_035_144_p12_b3_all", model="mbv2_035_144", patches=12, blocks=3, halo="all"),
       Variant(name="mbv2_035_96_p12_b3", model="mbv2_035_96", patches=12, blocks=3),
       Variant(name="mbv2_035_144_p16_b2_smallest", model="mbv2_035_144", patches=16, blocks=2, halo="smallest"),
       # row bands (the search's usual choice for the later stages) and depthwise 5x5 / 7x7 with SAME padding
       Variant(name="mbv2_035_96_r12_b3_all", model="mbv2_035_96", patches=(12, 1), blocks=3, halo="all"),
       Variant(name="mbv2_035_144_r6_b6_all", model="mbv2_035_144", patches=(6, 1), blocks=6, halo="all"),
       Variant(name="keras_mobilenet_v2_r3", model="keras_mobilenet_v2", patches=(3, 1)),
       Variant(name="kernels_same", model="kernels_same"),
       Variant(name="kernels_same_p", model="kernels_same", patches=4, halo="all"),
       Variant(name="kernels_same_r5", model="kernels_same", patches=(5, 1), blocks=4, halo="all"),
       Variant(name="mbv2_100_224", model="mbv2_100_224", arena_kib=1800, psram=True),
       Variant(name="mbv2_100_224_p", model="mbv2_100_224", patches=4, arena_kib=1800, psram=True),
       Variant(name="mbv2_rd_224", model="mbv2_rd_224", arena_kib=1800, psram=True),
       Variant(name="mbv2_rd_224_p", model="mbv2_rd_224", patches=4, arena_kib=1800, psram=True)]
    # the element-wise ops (HARD_SWISH, LOGISTIC, TANH, LEAKY_RELU, MUL, SUB; broadcast and constant operands) per
    # layer and in stages, squeeze-excites inside stages (their passes: the layers before one run again)
    + [Variant(name=m, model=m) for m in ("mbv3_small_100_128", "efficientnet_like", "eltwise_mix")]
    + [Variant(name="mbv3_small_100_128_p", model="mbv3_small_100_128", patches=4, passes=2),
       Variant(name="mbv3_small_100_128_p4_b5_all", model="mbv3_small_100_128", patches=4, blocks=5, halo="all",
               passes=3),
       Variant(name="mbv3_small_100_128_r8_b1_auto_stream", model="mbv3_small_100_128", patches=(8, 1), blocks=1,
               halo="auto", stream=True),
       Variant(name="efficientnet_like_p", model="efficientnet_like", patches=4, passes=3),
       Variant(name="efficientnet_like_p3_b4_all", model="efficientnet_like", patches=3, blocks=4, halo="all",
               passes=4),
       Variant(name="efficientnet_like_r7_b1_stream", model="efficientnet_like", patches=(7, 1), blocks=1,
               halo="auto", stream=True),
       Variant(name="eltwise_mix_p", model="eltwise_mix", patches=2),
       Variant(name="eltwise_mix_p3_all", model="eltwise_mix", patches=3, halo="all"),
       # calls of fewer elements than abi.LUT_MIN_ELEMENTS (element by element) beside calls through a table
       Variant(name="eltwise_mix_p4_all", model="eltwise_mix", patches=4, halo="all"),
       Variant(name="eltwise_mix_p6", model="eltwise_mix", patches=6),
       Variant(name="mbv3_small_100_128_p12_b2", model="mbv3_small_100_128", patches=12, blocks=2, passes=2)])


def _log(msg: str) -> None:
    print(f"[latency {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_model(v: Variant, zoo_cache: str | None) -> bytes:
    """The variant's .tflite: the zoo model, or rewritten in custom mode as tools/gen/gen_model_whole.py does."""
    original = zoo.build(v.model, zoo_cache)
    if v.patches is None:
        return original
    entry = zoo.ZOO[v.model]
    original = fold_static_reshapes(original, v.model)[0]  # a squeeze-excite's computed reshape, as fit and rewrite
    graph = from_tflite(original, name=v.model)
    blocks = v.blocks if v.blocks is not None else entry.patch_blocks
    ops = None if blocks is not None else entry.patch_ops
    s = schedule(graph, v.patches, n_blocks=blocks, n_ops=ops)
    if s.passes.count != v.passes:
        raise ValueError(f"{v.name}: the stage sweeps its grid {s.passes.count} times, not {v.passes}")
    caches = select(s, HaloOptions(mode=v.halo), None, "streamed" if v.stream else "counted")
    # in place: planned for the CMSIS-NN build when it is measured (such a plan holds for both kernel sets)
    plan_kernels = "cmsis_nn" if "cmsis_nn" in v.kernels else "reference"
    model = rewrite_custom(original, graph, s, v.model, inplace=v.inplace, streamed_input=v.stream,
                           halo=caches, kernels=plan_kernels).model
    if v.rest_convs:
        model = convs_to_flash(model, v.model, inplace=v.inplace, kernels=plan_kernels).model
    return model


def model_source(model: bytes, comment: str) -> str:
    """The firmware's model source with one seeded random input (the streamed images for a streamed stage)."""
    stream = sources.stream_rows(model)
    info = model_info(model)
    if stream:
        x = random_inputs(model, 1, seed=0, signature=input_signature(model))[0][0]
    else:
        x = random_inputs(model, 1, seed=0)[0][0]
    out = info.outputs[0]
    out_bytes = int(np.prod(out.shape)) * np.dtype(out.dtype).itemsize
    return sources.model_source(model, x, out_bytes, comment, stream=stream)


def build_rules(name: str, core: str, kernels: str, ops: list[str], v: Variant, profile: bool = True) -> str:
    """One firmware (cc_binary + mcu_binary ``name``) in the folder's BUILD; ``profile``: in per-op mode."""

    key, _, platform, board, psram, ld = CORES[core]
    libs = ["@//tflm_patch_kernels/tflm:model_runtime", "@tflite_micro//:runtime", "@tflite_micro//:platform_mcu"]
    libs += sources.kernel_libraries(ops, kernels)
    if any(op.startswith("custom:") for op in ops):
        libs.append("@//tflm_patch_kernels/tflm:patch_stage_op" + ("_cmsis_nn" if kernels == "cmsis_nn" else ""))
    copts = ["-DTFMCU_MODEL_CONFIG_FROM_FLAGS", f"-DTFMCU_MODEL_ARENA_BYTES={v.arena_kib * 1024}"] + (["-DTFMCU_PROFILE_OPS"] if profile else [])
    if v.psram or core in MODELS_IN_PSRAM:
        copts.append("-DTFMCU_MODEL_IN_PSRAM")
    linkopts = ["-T", f"$(location {FW}:{ld})", "-Wl,--defsym=TFMCU_STACK_SIZE=16384",
                f"-Wl,--defsym=TFMCU_SRAM_BUDGET={4 * 1024 * 1024}", f"-Wl,--defsym=TFMCU_PSRAM_ORIGIN={psram}"]
    return f'''
cc_binary(
    name = "{name}_bin",
    srcs = ["main.cc", "tfmcu_model.cc", "tfmcu_model.h", "{v.name}_model.cc"],
    additional_linker_inputs = ["{FW}:{ld}"],
    copts = {json.dumps(copts)},
    linkopts = {json.dumps(linkopts)},
    target_compatible_with = ["@platforms//os:none"],
    deps = {json.dumps([f"{FW}:harness", f"{FW}:{board}"] + libs)},
)

mcu_binary(name = "{name}", binary = ":{name}_bin", platform = "@{platform}")
'''


def generate(variants: list[Variant], cores: list[str], kernels: list[str], zoo_cache: str | None) -> list[dict]:
    """Writes the folder (models, sources, BUILD); returns the firmware list."""

    fw_dir = os.path.join(OUT, "fw")
    os.makedirs(fw_dir, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "tflm_patch_kernels", "tflm", "firmware_main.cc"), os.path.join(fw_dir, "main.cc"))
    for name in sources.LIBRARY_SOURCES:  # the model library the test firmware runs the model through
        shutil.copy(os.path.join(ROOT, "tflm_patch_kernels", "tflm", name), os.path.join(fw_dir, name))
    rules = ['load("@//tools/bazel/arm:transition.bzl", "mcu_binary")\n']
    firmwares = []
    for v in variants:
        path = os.path.join(OUT, "models", f"{v.name}.tflite")
        src = os.path.join(fw_dir, f"{v.name}_model.cc")
        if os.path.exists(path) and os.path.exists(src):
            with open(path, "rb") as f:
                model = f.read()
        else:
            _log(f"model {v.name}")
            model = make_model(v, zoo_cache)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(src, "w") as f:
                f.write(model_source(model, f"latency calibration: {v}"))
            with open(path, "wb") as f:
                f.write(model)
        ops = sources.resolver_ops(model)
        for core in cores:
            for k in kernels:
                if k not in v.kernels:
                    continue
                name = f"{v.name}__{CORES[core][0]}__{k}"
                rules.append(build_rules(name, core, k, ops, v))
                firmwares.append({"name": name, "variant": v.name, "core": core, "kernels": k, "model": path,
                                  "zoo": v.model, "profile": True,
                                  "stage": any(op.startswith("custom:") for op in ops)})
                if v.name in PLAIN:  # the same firmware without the per-op mode: the mode's overhead
                    rules.append(build_rules(name + "__plain", core, k, ops, v, profile=False))
                    firmwares.append({"name": name + "__plain", "variant": v.name, "core": core, "kernels": k,
                                      "model": path, "profile": False})
    with open(os.path.join(fw_dir, "BUILD"), "w") as f:
        f.write("".join(rules))
    with open(os.path.join(fw_dir, "WORKSPACE"), "w") as f:
        f.write(f'workspace(name = "{REPO}")\n')
    return firmwares


def bazel_build(firmwares: list[dict]) -> None:
    fw_dir = os.path.join(OUT, "fw")
    cmd = [os.environ.get("BAZEL", "bazel"), "build", "--noshow_progress", "--keep_going",
           f"--override_repository={REPO}={fw_dir}", "//tools/qemu:libinsn_count.so"]
    cmd += [f"@{REPO}//:{fw['name']}" for fw in firmwares]
    _log(f"bazel build: {len(firmwares)} firmwares")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        _log("bazel build failed for some firmwares (those are skipped)")
    # Copied out at once: another build of @tfmcu_fw (deploy's folders) replaces Bazel's outputs.
    os.makedirs(os.path.join(OUT, "elf"), exist_ok=True)
    for fw in firmwares:
        src = os.path.join(ROOT, "bazel-bin", "external", REPO, fw["name"] + ".elf")
        if os.path.exists(src):
            shutil.copyfile(src, _elf(fw))


def _elf(fw: dict) -> str:
    return os.path.join(OUT, "elf", fw["name"] + ".elf")


def run_one(fw: dict, timeout: int = 3000) -> dict | None:
    """Runs one firmware under QEMU with the plugin (tools/qemu/run_firmware.py, the runner deploy uses): its Invoke
    and per-op counts (None if it failed)."""
    elf = _elf(fw)
    if not os.path.exists(elf):
        return None
    nm = subprocess.run(["arm-none-eabi-nm", "-S", elf], check=True, capture_output=True, text=True).stdout
    syms = {p[-1]: int(p[0], 16) for p in (ln.split() for ln in nm.splitlines()) if len(p) in (3, 4)}
    sizes = {p[3]: int(p[1], 16) for p in (ln.split() for ln in nm.splitlines()) if len(p) == 4}
    out = os.path.join(OUT, "runs", fw["name"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf", elf, "--machine",
           CORES[fw["core"]][1], "--plugin", os.path.join(ROOT, "bazel-bin", "tools", "qemu", "libinsn_count.so"),
           "--timeout", str(timeout), "--report", f"{out}.json", "--quiet"]
    if FOLDED_SYMBOL in sizes:  # the folded 1x1 product's own count per op (its row: tfmcu.plan.latency.fit)
        cmd += ["--range-symbol", FOLDED_SYMBOL]
    if fw.get("stage"):  # every instruction address's count: the portable kernels' own counts over the run
        cmd += ["--profile-out", f"{out}.profile"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        with open(f"{out}.json") as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = None
    r = (rep or {}).get("result")
    if p.returncode != 0 or r is None or rep["problems"]:
        _log(f"{fw['name']}: failed: {(rep or {}).get('problems') or (p.stderr or p.stdout)[-400:]}")
        return None
    invoke = r["regions"][0]["insns"]
    if not fw["profile"]:
        _log(f"{fw['name']}: invoke {invoke:,} insns (without the per-op mode)")
        return {"invoke": invoke}
    n_ops = r["profiled_ops"]
    if len(r.get("op_insns") or []) != n_ops:
        _log(f"{fw['name']}: {len(r.get('op_insns') or [])} plugin regions for {n_ops} ops")
        return None
    _log(f"{fw['name']}: invoke {invoke:,} insns, {n_ops} ops ({time.time() - t0:.0f} s)")
    return {"invoke_profiled": invoke, "op_insns": r["op_insns"], "op_tags": r["op_tags"],
            "op_folded": r.get("op_range_insns") if FOLDED_SYMBOL in sizes else None,
            "portable": portable_counts(f"{out}.profile", syms, sizes) if fw.get("stage") else None}


def portable_counts(profile: str, syms: dict[str, int], sizes: dict[str, int]) -> dict[str, int]:
    """Per portable kernel (``tfmcu.plan.latency.PORTABLE``) the instructions its function ran (tfmcu_<op>_s8 and
    the parts GCC split off it, ``.part.N``, and its element function where GCC kept it apart: the kernels of
    ``abi.LUT_OPS`` call it from two places, per element and to build a call's table), from the plugin's
    per-address counts of a run of one Invoke."""
    spans = []
    for name, size in sizes.items():
        base = name.split(".")[0]
        for k in latency.PORTABLE:
            if base in (f"tfmcu_{k.lower()}_s8", f"tfmcu_{k.lower()}_element"):
                spans.append((syms[name] & ~1, (syms[name] & ~1) + size, k))
    totals = dict.fromkeys(sorted({k for _, _, k in spans}), 0)
    with open(profile) as f:
        for line in f:
            pc, n = line.split()
            pc = int(pc, 16)
            for lo, hi, k in spans:
                if lo <= pc < hi:
                    totals[k] += int(n)
                    break
    return totals


def finish(data: dict, plain: dict, runs: dict, no_fit: bool = False) -> None:
    """The per-op mode's overhead per op (from the variants measured both ways: one figure per core), each run's
    Invoke without it, the label and the coefficients (``tfmcu.plan.latency.fit``)."""
    # profiled - plain = a x ops + b (the markers per op; a few instructions once), one (a, b) per core
    pts: dict[str, list[tuple[int, int]]] = {}
    for key, p in plain.items():
        if key in runs:
            r = runs[key]
            pts.setdefault(r["core"], []).append((len(r["ops"]), r["invoke_profiled"] - p["invoke"]))
    over = {}
    for core, xy in pts.items():
        a, b = np.linalg.lstsq(np.array([[n, 1.0] for n, _ in xy]), np.array([d for _, d in xy], float),
                               rcond=None)[0]
        over[core] = {"per_op": round(float(a), 3), "const": round(float(b), 3),
                      "points": [{"ops": n, "difference": d} for n, d in xy]}
    if not over and os.path.exists(CALIBRATION):  # none measured in this run: the committed figures
        over = latency.load_calibration(CALIBRATION).get("profile_overhead", {})
    _log(f"per-op mode overhead: {over}")
    data["profile_overhead"] = over
    data["runs"] = sorted(runs.values(), key=lambda r: (r["core"], r["kernels"], r["variant"]))
    data["plain"] = sorted(plain.values(), key=lambda r: (r["core"], r["kernels"], r["variant"]))
    for r in data["runs"]:
        o = over.get(r["core"]) or next(iter(over.values()), {"per_op": 0.0, "const": 0.0})
        r["invoke"] = int(round(r["invoke_profiled"] - o["per_op"] * len(r["ops"]) - o["const"]))
        p = plain.get((r["variant"], r["core"], r["kernels"]))
        if p is not None:
            r["invoke"] = p["invoke"]  # measured without the mode
    boards = " / ".join(f"{CORES[c][1]} ({c.replace('cortex-m', 'Cortex-M')})" for c in CORES
                        if any(r["core"] == c for r in data["runs"]))
    data["measured_by"] = (f"QEMU 7.2 {boards}, tools/qemu/insn_count.c, firmware_main.cc -DTFMCU_PROFILE_OPS; TFLM "
                           "and CMSIS-NN from their pinned archives")
    data["date"] = datetime.date.today().isoformat()
    try:
        data["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip() or "?"
    except OSError:
        data["commit"] = "?"
    if not no_fit:
        data["coefficients"] = latency.fit(data["runs"])
        for row in latency.accuracy(data):
            _log(f"{row['variant']:32s} {row['core']} {row['kernels']:9s} measured {row['measured']:>13,} "
                 f"predicted {row['predicted']:>13,} {100 * row['error']:+6.2f}%")


def _runs_model(r: dict, path: str) -> bool:
    """Whether stored run ``r`` measured the model at ``path`` or one of the same ops (``_same_ops``)."""
    with open(path, "rb") as f:
        model = f.read()
    return hashlib.sha1(model).hexdigest()[:12] == r.get("model_sha1") or _same_ops(latency.op_features(model),
                                                                                       r["ops"])


def refresh_features(runs: dict[tuple[str, str, str], dict], models: dict[str, str]) -> int:
    """The features of stored runs whose variant's model is at ``models[variant]``, re-extracted by the current
    ``latency.op_features`` (each op's measured instructions kept): the file stores one feature set per variant,
    which must be the code's of today for every core and kernel set, not the last run's. A run takes them from the
    model it measured, or from one of the same structure (a conversion elsewhere, or the other kernel set's model:
    other weights or another in-place plan, the same features wherever both have them). Returns the runs
    refreshed."""
    done = 0
    for r in runs.values():
        path = models.get(r["variant"])
        if path is None or not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            model = f.read()
        ops = latency.op_features(model)
        if hashlib.sha1(model).hexdigest()[:12] == r.get("model_sha1") or _same_ops(ops, r["ops"]):
            for o, old in zip(ops, r["ops"]):
                o.update({k: old[k] for k in ("insns", "folded_insns") if k in old})
            r["ops"] = ops
            done += 1
    return done


def measure(variants: list[Variant], cores: list[str], kernels: list[str], zoo_cache: str | None, out: str,
            jobs: int = 2, build: bool = True, no_fit: bool = False) -> dict:
    """Generate, build and run ``variants`` on ``cores`` x ``kernels``; the runs are added to calibration file
    ``out`` (kept as they come), then fitted (``finish``)."""
    firmwares = generate(variants, cores, kernels, zoo_cache)
    if build:
        bazel_build(firmwares)
    data = latency.load_calibration(out) if os.path.exists(out) else {"runs": []}
    runs = {(r["variant"], r["core"], r["kernels"]): r for r in data.get("runs", [])}
    plain = {(r["variant"], r["core"], r["kernels"]): r for r in data.get("plain", [])}
    models = {fw["variant"]: fw["model"] for fw in firmwares}
    refreshed = refresh_features(runs, models)
    if refreshed:
        _log(f"features of {refreshed} kept runs re-extracted from their models (the current op_features)")
    measured_now = {(fw["variant"], fw["core"], fw["kernels"]) for fw in firmwares}
    stale = sorted(k for k, r in runs.items() if k[0] in models and k not in measured_now
                   and r.get("model_sha1") and not _runs_model(r, models[k[0]]))
    if stale:
        _log(f"kept runs of another model than the variant's now (measure them again): {stale}")
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for fw, res in zip(firmwares, pool.map(run_one, firmwares)):
            if res is None:
                continue
            if not fw["profile"]:
                plain[(fw["variant"], fw["core"], fw["kernels"])] = {
                    "variant": fw["variant"], "core": fw["core"], "kernels": fw["kernels"], "invoke": res["invoke"]}
                data["plain"] = sorted(plain.values(), key=lambda r: (r["core"], r["kernels"], r["variant"]))
                continue
            with open(fw["model"], "rb") as f:
                model = f.read()
            ops = latency.op_features(model)
            if [o["type"].replace("custom:", "") for o in ops] != res["op_tags"]:
                _log(f"{fw['name']}: the firmware's ops {res['op_tags']} are not the model's")
                continue
            for i, (o, n) in enumerate(zip(ops, res["op_insns"])):
                o["insns"] = n
                if res["op_folded"] is not None and o["type"] == f"custom:{abi.PATCH_STAGE_OP}":
                    o["folded_insns"] = res["op_folded"][i]
            runs[(fw["variant"], fw["core"], fw["kernels"])] = {
                "variant": fw["variant"], "zoo_model": fw["zoo"], "core": fw["core"], "kernels": fw["kernels"],
                "model_sha1": hashlib.sha1(model).hexdigest()[:12],
                "invoke_profiled": res["invoke_profiled"], "ops": ops}
            if res["portable"]:
                runs[(fw["variant"], fw["core"], fw["kernels"])]["portable_insns"] = res["portable"]
            data["runs"] = sorted(runs.values(), key=lambda r: (r["core"], r["kernels"], r["variant"]))
            latency.save_calibration(data, out)
    finish(data, plain, runs, no_fit)
    latency.save_calibration(data, out)
    _log(f"wrote {out}: {len(data['runs'])} runs")
    return data


def accuracy_table(rows: list[dict]) -> str:
    """The accuracy table (Markdown): measured and predicted instructions per Invoke."""
    lines = ["| model | core | kernels | measured (QEMU) | predicted | error |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['core']} | {r['kernels']} | {r['measured']:,} | {r['predicted']:,} | "
                     f"{100 * r['error']:+.2f}% |")
    worst = max((abs(r["error"]) for r in rows), default=0.0)
    lines.append(f"\nWorst error: {100 * worst:.2f}% over {len(rows)} runs.")
    return "\n".join(lines) + "\n"


def latency_section(o: Any, log: Callable[[str], None] = print) -> dict:
    """``make bench`` section *latency*: every variant measured again (out/bench/latency_calibration.json), the
    predictor as committed (tfmcu/plan/latency_calibration.json) against those counts, and refitted."""
    out = os.path.join(o.out_dir, "latency_calibration.json")
    os.makedirs(o.out_dir, exist_ok=True)
    log(f"[latency] {len(VARIANTS)} variants on {', '.join(CORES)} with {', '.join(KERNELS)} -> {out}")
    data = measure(VARIANTS, list(CORES), list(KERNELS), o.zoo_cache, out)
    committed = latency.load_calibration()
    rows = []
    for r in latency.accuracy({"runs": data["runs"], "coefficients": committed["coefficients"]}):
        rows.append({**r, "coefficients": "committed"})
    for r in latency.accuracy(data):
        rows.append({**r, "coefficients": "refitted"})
    return {"rows": rows}


def section_table(result: dict[str, Any]) -> str:
    """Section *latency*'s table, from its JSON: the committed predictor against the counts measured again."""
    return ("Instructions per Invoke: measured by QEMU (tools/qemu/insn_count.c, per-op mode), predicted by "
            "tfmcu.plan.latency (estimated) with the committed coefficients:\n\n"
            + accuracy_table([r for r in result["rows"] if r["coefficients"] == "committed"]))


def _same_ops(new: list[dict], old: list[dict]) -> bool:
    """Whether features ``new`` describe the ops of ``old``: the same op types in the same order, and in each patch
    stage the same layer types and geometry (what the op_features of another code version may price differently,
    the ops themselves the same)."""
    def key(f: dict, keep: list) -> tuple:
        return (f["type"], tuple((lf["type"], json.dumps(_common(lf.get("geometry"), k), sort_keys=True))
                                 for lf, k in zip(f.get("layers", []), keep)))

    def _common(g: dict | None, keys: set | None) -> dict | None:
        return g if g is None or keys is None else {k: v for k, v in g.items() if k in keys}

    if len(new) != len(old):
        return False
    for a, b in zip(new, old):
        la, lb = a.get("layers", []), b.get("layers", [])
        if len(la) != len(lb):
            return False
        # the geometry's fields both versions have (a newer op_features may add fields, derived from the same op)
        keep = [None if x.get("geometry") is None or y.get("geometry") is None
                else set(x["geometry"]) & set(y["geometry"]) for x, y in zip(la, lb)]
        if key(a, keep) != key(b, keep):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cores", default=",".join(CORES))
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--only", help="comma-separated variant names (default: all)")
    ap.add_argument("--skip", help="comma-separated variant names to leave out")
    ap.add_argument("--zoo_cache", default=os.path.join(ROOT, ".bazel_local", "zoo_cache"))
    ap.add_argument("--out", default=CALIBRATION)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no_build", action="store_true", help="run what is built")
    ap.add_argument("--build_only", action="store_true", help="generate and build, run nothing")
    ap.add_argument("--no_fit", action="store_true", help="only add the measurements to the file")
    ap.add_argument("--merge", help="comma-separated calibration files: their runs into --out, then fit (no runs)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if a.merge:
        data = {"runs": []}
        runs, plain = {}, {}
        for path in [a.out] * os.path.exists(a.out) + a.merge.split(","):
            d = latency.load_calibration(path)
            runs.update({(r["variant"], r["core"], r["kernels"]): r for r in d.get("runs", [])})
            plain.update({(r["variant"], r["core"], r["kernels"]): r for r in d.get("plain", [])})
        # the features as op_features computes them now, from the models measured
        refresh_features(runs, {r["variant"]: os.path.join(OUT, "models", f"{r['variant']}.tflite")
                                for r in runs.values()})
        finish(data, plain, runs, a.no_fit)
        latency.save_calibration(data, a.out)
        _log(f"wrote {a.out}: {len(data['runs'])} runs")
        return 0
    variants = [v for v in VARIANTS if (not a.only or v.name in a.only.split(","))
                and (not a.skip or v.name not in a.skip.split(","))]
    if a.build_only:
        bazel_build(generate(variants, a.cores.split(","), a.kernels.split(","), a.zoo_cache))
        return 0
    data = measure(variants, a.cores.split(","), a.kernels.split(","), a.zoo_cache, a.out, a.jobs, not a.no_build,
                   a.no_fit)
    if not a.no_fit:
        print(accuracy_table(latency.accuracy(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
