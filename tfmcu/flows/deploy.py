"""``deploy``: a .tflite (builtin ops, or custom mode with TFMCU_PATCH_STAGE) as a self-contained TFLM firmware folder
for a microcontroller, and optionally built with Bazel and run under QEMU.

The folder (``out_dir``) holds:

* ``model_data.cc``: the model as a Flash array, an op resolver with exactly the model's ops (and TFMCU_PATCH_STAGE),
  ``num_inputs`` test inputs (``--inputs`` or seeded random ones) (tfmcu/firmware/sources.py);
* ``main.cc``: MicroInterpreter, the arena (``TFMCU_ARENA_BYTES``), one Invoke per input, the result line
  (a copy of tflm_patch_kernels/tflm/firmware_main.cc);
* ``BUILD`` + ``WORKSPACE``: a Bazel repository that builds ``:firmware`` (the ELF) for the target with this
  project's toolchain, linking TFLM's runtime and only the kernels of the model's ops (``@tflite_micro//:kernel_*``,
  third_party/tflite_micro.BUILD), our kernel and harness from ``@tfmcu_ws``;
* ``expect.json``: TF Lite's outputs for the inputs (their hash, top classes), the predicted arena;
* ``deploy.json``: what was decided: the target, the predicted TFLM arena on Cortex-M (tfmcu.plan.arena, build
  "cortex-m": 32-bit structs), the arena = prediction x (1 + margin) rounded up to 16 bytes, and the estimated fit;
  with ``run``, the measured figures and the verdict.

Without ``run`` the model also runs in TFLM on this host (its outputs must equal TF Lite's; its arena goes to
deploy.json); with ``run`` the target's run is that check, and no host build of TFLM is needed.
``run`` builds ``@tfmcu_fw//:firmware`` from this checkout (``bazel build --override_repository=tfmcu_fw=OUT_DIR``)
and runs it on the target's QEMU board (tools/qemu/run_firmware.py): the output bytes must equal TF Lite's and the
verdict is "fits" when it links into the target's memory and AllocateTensors succeeds; a link that overflows the
target's RAM or Flash, or an arena TFLM finds too small, is "does not fit", with the figure.

Bad input (missing file, not a TFLite model, an op the firmware cannot register, a malformed custom-mode model) is a
one-line ``UsageError`` and writes nothing: the folder is assembled beside ``out_dir`` and renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu.errors import TfmcuError, UsageError
from tfmcu.files import read_bytes
from tfmcu.firmware.sources import KERNELS, expectation, kernel_libraries, model_source, resolver_ops
from tfmcu.firmware.targets import Target, get_target
from tfmcu.flows.verify import load_inputs
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.plan.arena import predict_arena
from tfmcu.runtime.host import HostRunner, evaluate, tflite_outputs
from tfmcu.runtime.model_io import TFLMError, model_info, random_inputs
from tfmcu.runtime.tflm_host import streamed_image
from tfmcu.stage.common import RewriteError, read_schedule
from tfmcu.stage.custom import load_custom
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = "tfmcu_fw"  # the folder's Bazel repository name (--override_repository)
MAIN_SOURCE = os.path.join(ROOT, "tflm_patch_kernels", "tflm", "firmware_main.cc")
STATIC_ESTIMATE = 1024  # bytes of .data + .bss besides the arena (TFLM, harness, kernel): measured 0.8-1 KiB


class DeployError(TfmcuError):
    """The firmware could not be built or run for a reason other than the model not fitting; one line."""


@dataclass
class DeployOptions:
    tflite: str
    target: str = "stm32f405"
    out_dir: str = "out/deploy"
    run: bool = False
    inputs: str | None = None  # real inputs (.npy / .npz); default: num_inputs seeded random ones
    num_inputs: int = 2
    seed: int = 0
    margin: float = 0.02  # arena = predicted x (1 + margin)
    stack_kib: int = 6
    timeout_s: int = 300
    kernels: str = "cmsis_nn"  # TFLM's CMSIS-NN kernels + the patch executor's CMSIS-NN backend, or "reference"


def validate(o: DeployOptions) -> Target:
    t = get_target(o.target)
    if not 0.0 <= o.margin <= 1.0:
        raise UsageError(f"--margin={o.margin}: must be in [0, 1]")
    if not 1 <= o.num_inputs <= 16:
        raise UsageError(f"--num_inputs={o.num_inputs}: must be in [1, 16]")
    if not 2 <= o.stack_kib <= 64:
        raise UsageError(f"--stack_kib={o.stack_kib}: must be in [2, 64]")
    if o.kernels not in KERNELS:
        raise UsageError(f"--kernels={o.kernels}: must be one of {', '.join(KERNELS)}")
    if os.path.exists(o.out_dir) and not os.path.isdir(o.out_dir):
        raise UsageError(f"--out_dir={o.out_dir}: exists and is not a folder")
    return t


def _build_file(t: Target, arena: int, stack: int, ops: list[str], kernels: str) -> str:
    fw = "@//tflm_patch_kernels/firmware"
    # TFLM's runtime and only the kernels of the model's ops (a cross-build compiles these, not all of TFLM)
    libs = ["@//tflm_patch_kernels/tflm:firmware_runtime", "@tflite_micro//:runtime", "@tflite_micro//:platform_mcu"]
    libs += kernel_libraries(ops, kernels)
    if any(op.startswith("custom:") for op in ops):
        libs.append("@//tflm_patch_kernels/tflm:patch_stage_op" + ("_cmsis_nn" if kernels == "cmsis_nn" else ""))
    deps = "\n".join(f'        "{d}",' for d in libs)
    budget = [] if t.key == "stm32f405" else [f'"-Wl,--defsym=TFMCU_SRAM_BUDGET={t.sram_bytes}"']
    linkopts = ", ".join([f'"-T"', f'"$(location {fw}:{t.ld})"', f'"-Wl,--defsym=TFMCU_STACK_SIZE={stack}"']
                         + budget)
    return f'''# Generated by tfmcu deploy for {t.name}: {t.what}.
# Build from the tfmcu checkout:
#   bazel build @{REPO}//:firmware --override_repository={REPO}=$PWD/<this folder>
load("@//tools/bazel/arm:transition.bzl", "mcu_binary")

cc_binary(
    name = "firmware_bin",
    srcs = [
        "main.cc",
        "model_data.cc",
    ],
    additional_linker_inputs = ["{fw}:{t.ld}"],
    copts = ["-DTFMCU_ARENA_BYTES={arena}"],
    linkopts = [{linkopts}],
    target_compatible_with = ["@platforms//os:none"],
    deps = [
        "{fw}:harness",
        "{fw}:{t.board}",
{deps}
    ],
)

# The ELF for the target's core (through the platform transition).
mcu_binary(
    name = "firmware",
    binary = ":firmware_bin",
    platform = "@{t.platform}",
)
'''


def _check_model(model: bytes, path: str) -> Any:
    if streamed_image(model) is not None:
        raise UsageError(f"{path}: its patch stage streams its input (rewrite --stream_input); deploy does not generate "
                         f"firmware for such models yet (your firmware registers the TfmcuInputProvider: see "
                         f"tflm_patch_kernels/tflm/firmware_main.cc, which feeds image rows from Flash)")
    try:
        info = model_info(model, path)
        if PATCH_STAGE_OP in info.custom_ops:
            HostRunner(model, path)  # a malformed custom-mode model fails here, in one line
    except (TFLMError, RewriteError) as e:
        raise UsageError(str(e)) from None
    if len(info.inputs) != 1 or len(info.outputs) < 1:
        raise UsageError(f"{path}: deploy runs models with one input; this one has {len(info.inputs)}")
    return info


def _check_kernels(model: bytes, path: str, kernels: str) -> None:
    """An in-place memory plan (rewrite --inplace) is derived for TFLM's reference kernels' read order; CMSIS-NN's
    kernels read in another order (im2col, 3x3 depthwise), so the two do not go together."""
    record = read_schedule(model)
    if kernels == "cmsis_nn" and record is not None and record.get("memory_plan") == "inplace":
        raise UsageError(f"{path}: its memory plan is in place (rewrite --inplace), which holds for TFLM's reference "
                         "kernels only; deploy it with --kernels=reference, or rewrite it without --inplace for "
                         "--kernels=cmsis_nn")


def prepare(o: DeployOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the firmware folder (see the module docstring); returns deploy.json's content."""
    t = validate(o)
    model = read_bytes(o.tflite, "--tflite")
    info = _check_model(model, o.tflite)
    ops = resolver_ops(model, o.tflite)
    _check_kernels(model, o.tflite, o.kernels)
    samples = load_inputs(o.inputs, info)[:16] if o.inputs else random_inputs(model, o.num_inputs, o.seed)
    host_arena = None
    try:
        if o.run:
            # The run on the target compares the firmware's outputs with these; TFLM on this host would add nothing
            # to that check but a host build of TFLM (minutes on a fresh machine, for custom-mode models).
            log(f"deploy: {o.tflite}: {len(ops)} op types, {len(samples)} inputs; TF Lite reference outputs ...")
            outs = [r[0] for r in tflite_outputs(model, samples, "reference", o.tflite, isolate=True)]
        else:
            log(f"deploy: {o.tflite}: {len(ops)} op types, {len(samples)} inputs; TF Lite reference outputs and "
                "TFLM on this host ...")
            ref = evaluate(model, samples, "reference", o.tflite, isolate=True)
            outs = [r[0] for r in ref.tflite]
            if any(not (a[0] == b[0]).all() for a, b in zip(ref.tflite, ref.tflm)):
                raise DeployError(f"{o.tflite}: TFLM on this host differs from TF Lite; run `verify` first")
            host_arena = ref.arena.total
    except TFLMError as e:
        raise UsageError(str(e)) from None
    build = "cortex-m-cmsis-nn" if o.kernels == "cmsis_nn" else "cortex-m"
    stage = (load_custom(model).packed if o.kernels == "cmsis_nn" and PATCH_STAGE_OP in info.custom_ops else None)
    pred = predict_arena(from_tflite(model), model=model, build=build, stage=stage)
    arena = -(-int(pred.total * (1 + o.margin)) // 16) * 16
    stack = o.stack_kib * 1024
    ram_estimate = arena + stack + STATIC_ESTIMATE
    inputs = [s[0] for s in samples]
    xs = np.concatenate([np.asarray(x).reshape((1,) + tuple(info.inputs[0].shape[1:])) for x in inputs])
    comment = f"{os.path.basename(o.tflite)} for {t.name}; {len(xs)} inputs ({o.inputs or f'random, seed {o.seed}'})"
    report: dict[str, Any] = {
        "tflite": o.tflite,
        "target": t.name,
        "target_what": t.what,
        "kernels": o.kernels,
        "ops": [op.replace("custom:", "") for op in ops],
        "custom_mode": PATCH_STAGE_OP in info.custom_ops,
        "inputs": len(xs),
        "model_bytes": len(model),
        "arena": {
            "predicted_bytes": pred.total,
            "predicted_by": f"tfmcu.plan.arena, TFLM build {build!r} (32-bit structs, MicroAllocator)",
            "margin": o.margin,
            "arena_bytes": arena,
            "host_measured_bytes": host_arena,  # None with --run (measured on the target instead)
        },
        "stack_bytes": stack,
        "estimate": {
            "ram_bytes": ram_estimate,
            "sram_bytes": t.sram_bytes,
            "fits": ram_estimate <= t.sram_bytes,
            "how": f"arena + stack + {STATIC_ESTIMATE} B of other .data/.bss (estimated)",
        },
    }
    files = {
        "model_data.cc": model_source(model, xs, outs[0].nbytes, comment, o.tflite),
        "main.cc": open(MAIN_SOURCE).read(),
        "BUILD": _build_file(t, arena, stack, ops, o.kernels),
        "WORKSPACE": f'workspace(name = "{REPO}")\n',
        "expect.json": json.dumps({"expect": expectation(outs),
                                   "expect_within": {"arena_used_bytes": [pred.total, 0.01]}}, indent=1) + "\n",
        "deploy.json": json.dumps(report, indent=1) + "\n",
    }
    _write_folder(o.out_dir, files)
    log(f"deploy: wrote {o.out_dir}/ (arena {arena:,} B = predicted {pred.total:,} B + {o.margin:.0%}; "
        f"estimated RAM {ram_estimate:,} B of {t.sram_bytes:,} B: {'fits' if report['estimate']['fits'] else 'does not fit'})")
    return report


def _write_folder(out_dir: str, files: dict[str, str]) -> None:
    """All files or nothing: assembled in a temporary folder beside out_dir, then renamed into place (an existing
    out_dir is replaced)."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-deploy-")
    except OSError as e:
        raise UsageError(f"--out_dir={out_dir}: cannot write ({e.strerror or e})") from None
    try:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_OVERFLOW = re.compile(r"region `(\w+)' overflowed by (\d+) bytes")
_TFLM_MISSING = re.compile(r"Requested: (\d+), available (\d+), missing: (\d+)")


def run_firmware(o: DeployOptions, report: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the folder's firmware with Bazel and run it under QEMU; adds "run" and "verdict" to the report."""
    t = get_target(o.target)
    out = os.path.abspath(o.out_dir)
    log(f"deploy: bazel build @{REPO}//:firmware for {t.name} (TFLM is compiled the first time: minutes) ...")
    cmd = ["bazel", "build", "--noshow_progress", f"--override_repository={REPO}={out}", f"@{REPO}//:firmware",
           "//tools/qemu:libinsn_count.so"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    run: dict[str, Any] = {}
    if r.returncode != 0:
        m = _OVERFLOW.search(r.stderr)
        if not m:
            log_path = os.path.join(out, "build.log")
            with open(log_path, "w") as f:
                f.write(r.stderr)
            raise DeployError(f"bazel build @{REPO}//:firmware failed (not a memory overflow): see {log_path}")
        region, missing = m.group(1), int(m.group(2))
        run = {"linked": False, "overflow": {"region": region, "bytes": missing}}
        verdict = (f"does not fit {t.name}: the link overflows {region} by {missing:,} bytes "
                   f"(arena {report['arena']['arena_bytes']:,} B + stack {report['stack_bytes']:,} B + the rest > "
                   f"{t.sram_bytes:,} B of SRAM)" if region == "RAM" else
                   f"does not fit {t.name}: the link overflows {region} by {missing:,} bytes")
        return _finish(o, report, run, False, verdict, log)
    elf = os.path.join(ROOT, "bazel-bin", "external", REPO, "firmware.elf")
    plugin = os.path.join(ROOT, "bazel-bin", "tools", "qemu", "libinsn_count.so")
    run_json = os.path.join(out, "run.json")
    log(f"deploy: running on QEMU {t.machine} ...")
    q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf", elf,
                        "--machine", t.machine, "--plugin", plugin, "--timeout", str(o.timeout_s),
                        "--expect", os.path.join(out, "expect.json"), "--report", run_json, "--quiet"],
                       capture_output=True, text=True)
    try:
        with open(run_json) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        raise DeployError(f"QEMU run of {elf} gave no report: {(q.stderr or q.stdout).strip()[-300:]}") from None
    res = rep.get("result") or {}
    regions = res.get("regions", [])
    run = {
        "linked": True,
        "measured_by": f"QEMU {t.machine}, TFLM 90b983c built from source (reference kernels + TFMCU_PATCH_STAGE)",
        "sizes": rep["sizes"],
        "allocated": bool(res.get("allocated")),
        "arena_used_bytes": res.get("arena_used_bytes"),
        "stack_hwm_bytes": res.get("stack_hwm"),
        "ram_static_bytes": res.get("ram_static"),
        "invoke_insns": [g.get("insns") for g in regions],
        "top_class": res.get("top_class"),
        "problems": rep["problems"],
    }
    if not res.get("allocated"):
        m = _TFLM_MISSING.search(q.stdout)
        run["tflm_missing_bytes"] = int(m.group(3)) if m else None
        verdict = (f"does not fit {t.name}: AllocateTensors failed in the {report['arena']['arena_bytes']:,}-byte "
                   f"arena" + (f" (TFLM: {m.group(3)} bytes missing)" if m else ""))
        return _finish(o, report, run, False, verdict, log)
    if rep["problems"]:
        raise DeployError(f"firmware on {t.machine}: {'; '.join(rep['problems'])}")
    run["outputs_equal_tflite"] = True
    verdict = (f"fits {t.name}: arena {res['arena_used_bytes']:,} B used (predicted {report['arena']['predicted_bytes']:,}"
               f" B), RAM {res['ram_static'] + res['stack_size']:,} of {t.sram_bytes:,} B, Flash "
               f"{rep['sizes']['flash']:,} of {t.flash_bytes:,} B; outputs equal TF Lite's on {len(regions)} inputs")
    return _finish(o, report, run, True, verdict, log)


def _finish(o: DeployOptions, report: dict[str, Any], run: dict[str, Any], fits: bool, verdict: str,
            log: Callable[[str], None]) -> dict[str, Any]:
    report["run"] = run
    report["fits"] = fits
    report["verdict"] = verdict
    with open(os.path.join(o.out_dir, "deploy.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    log(f"deploy: {verdict}")
    return report


def deploy(o: DeployOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    report = prepare(o, log)
    if o.run:
        report = run_firmware(o, report, log)
    return report
