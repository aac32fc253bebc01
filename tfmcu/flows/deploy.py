"""``deploy``: a .tflite (builtin ops, or custom mode with TFMCU_PATCH_STAGE) as a self-contained TFLM firmware folder
for a microcontroller, and optionally built with Bazel and run under QEMU.

The folder (``out_dir``) holds:

* ``model_data.cc``: the model as a Flash array, an op resolver with exactly the model's ops (and TFMCU_PATCH_STAGE),
  ``num_inputs`` test inputs (``--inputs`` or seeded random ones) (tfmcu/firmware/sources.py, which also writes
  the three files below);
* ``main.cc``: MicroInterpreter, the arena (``TFMCU_ARENA_BYTES``), one Invoke per input, the result line
  (a copy of tflm_patch_kernels/tflm/firmware_main.cc);
* ``BUILD`` + ``WORKSPACE``: a Bazel repository that builds ``:firmware`` (the ELF) for the target with this
  project's toolchain, linking TFLM's runtime and only the kernels of the model's ops (``@tflite_micro//:kernel_*``,
  third_party/tflite_micro.BUILD), our kernel and harness from ``@tfmcu_ws``;
* ``expect.json``: TF Lite's outputs for the inputs (their hash, top classes), the predicted arena;
* ``deploy.json``: what was decided: the target, the kernels, the predicted TFLM arena on Cortex-M
  (tfmcu.plan.arena, build "cortex-m-cmsis-nn" or "cortex-m" after ``kernels``: 32-bit structs), the arena =
  prediction x (1 + margin) rounded up to 16 bytes, and the estimated fit; with ``run``, the measured figures (and
  what measured them) and the verdict.

Without ``run`` the model also runs in TFLM on this host (its outputs must equal TF Lite's; its arena goes to
deploy.json); with ``run`` the target's run is that check, and no host build of TFLM is needed.
``run`` builds ``@tfmcu_fw//:firmware`` from this checkout (``bazel build --override_repository=tfmcu_fw=OUT_DIR``)
and runs it on the target's QEMU board (tfmcu/firmware/run.py): the output bytes must equal TF Lite's and the
verdict is "fits" when it links into the target's memory and AllocateTensors succeeds; a link that overflows the
target's RAM or Flash, or an arena TFLM finds too small, is "does not fit", with the figure; ``run.measured_by``
names the kernels the firmware ran (``kernels``).

The model is read and parsed once (``tfmcu.tflite.model``); every step below takes that one object. TF Lite and TFLM
run it in a child process (``tfmcu.runtime.isolate``): a model that makes them abort is a one-line error.

Bad input (missing file, not a TFLite model, an op the firmware cannot register, a malformed custom-mode model) is a
one-line ``UsageError`` and writes nothing: the folder is assembled beside ``out_dir`` and renamed into place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.files import write_folder, write_outputs
from tfmcu.firmware.run import DeployError, run_firmware
from tfmcu.firmware.sources import KERNELS, check_model, expectation, folder_files
from tfmcu.firmware.targets import TARGETS, Target, get_target
from tfmcu.plan.arena import predict_model_arena
from tfmcu.runtime.host import evaluate
from tfmcu.runtime.model_io import TFLMError, load_inputs, random_inputs, read_model

STATIC_ESTIMATE = 1024  # bytes of .data + .bss besides the arena (TFLM, harness, kernel): measured 0.8-1 KiB

__all__ = ["DeployError", "DeployOptions", "deploy", "prepare", "validate"]


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


def prepare(o: DeployOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the firmware folder (see the module docstring); returns deploy.json's content."""
    t = validate(o)
    model = read_model(o.tflite, "--tflite")
    info, ops, stage = check_model(model, o.kernels)
    samples = load_inputs(o.inputs, info)[:16] if o.inputs else random_inputs(model, o.num_inputs, o.seed)
    # TF Lite's outputs are the reference. With ``run`` the run on the target compares the firmware's outputs with
    # them; TFLM on this host would add nothing to that check but a host build of TFLM (minutes on a fresh machine,
    # for custom-mode models). Without it, TFLM on this host must agree with TF Lite.
    log(f"deploy: {o.tflite}: {len(ops)} op types, {len(samples)} inputs; TF Lite reference outputs"
        + (" ..." if o.run else " and TFLM on this host ..."))
    try:
        ref = evaluate(model, samples, "reference", o.tflite, tflm=not o.run, isolate=True)
    except TFLMError as e:
        raise UsageError(str(e)) from None
    outs = [r[0] for r in ref.tflite]
    if ref.tflm is not None and any(not (a[0] == b[0]).all() for a, b in zip(ref.tflite, ref.tflm)):
        raise DeployError(f"{o.tflite}: TFLM on this host differs from TF Lite; run `verify` first")
    host_arena = None if ref.arena is None else ref.arena.total
    build = "cortex-m-cmsis-nn" if o.kernels == "cmsis_nn" else "cortex-m"
    pred = predict_model_arena(model, build=build, stage=stage if o.kernels == "cmsis_nn" else None)
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
        "custom_mode": stage is not None,
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
    files = folder_files(model, ops, xs, outs[0].nbytes, comment, t, arena, stack, o.kernels, o.tflite)
    files["expect.json"] = json.dumps({"expect": expectation(outs),
                                       "expect_within": {"arena_used_bytes": [pred.total, 0.01]}}, indent=1) + "\n"
    files["deploy.json"] = json.dumps(report, indent=1) + "\n"
    write_folder(o.out_dir, files)
    log(f"deploy: wrote {o.out_dir}/ (arena {arena:,} B = predicted {pred.total:,} B + {o.margin:.0%}; "
        f"estimated RAM {ram_estimate:,} B of {t.sram_bytes:,} B: {'fits' if report['estimate']['fits'] else 'does not fit'})")
    return report


def deploy(o: DeployOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """``prepare``; with ``run``, the firmware built and run under QEMU (tfmcu/firmware/run.py): deploy.json gets
    ``run`` (the measured figures), ``fits`` and ``verdict``."""
    report = prepare(o, log)
    if o.run:
        report["run"], report["fits"], report["verdict"] = run_firmware(o.out_dir, TARGETS[o.target], report,
                                                                        o.kernels, o.timeout_s, log)
        write_outputs({os.path.join(o.out_dir, "deploy.json"): json.dumps(report, indent=1) + "\n"})
        log(f"deploy: {report['verdict']}")
    return report
