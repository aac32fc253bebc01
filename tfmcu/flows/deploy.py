"""``deploy``: a .tflite (builtin ops, or custom mode with TFMCU_PATCH_STAGE) as a self-contained TFLM firmware folder
for a microcontroller, and optionally built with Bazel and run under QEMU.

Every model ``rewrite`` writes is accepted: custom mode with one TFMCU_PATCH_STAGE op or several (``--rest_convs=tfmcu``:
the op is registered once), a stage that streams its input (``--stream_input``: the test inputs are the images, and
the firmware feeds their rows from Flash through the kernel's ``TfmcuInputProvider``), and an in-place memory plan
(``--inplace``) when ``kernels`` are the ones it was planned for (the schedule record's ``memory_plan_kernels``).

The folder (``out_dir``) holds:

* ``model/``: the model library (``tfmcu_model.h``: init, the input or a streamed input's row reader, invoke, the
  outputs with their quantization, error codes; docs/library.md): ``model_data.cc`` (the model as a Flash array, an
  op resolver with exactly the model's ops (and TFMCU_PATCH_STAGE), ``g_tfmcu_stream_rows`` for a streamed input),
  ``tfmcu_model_config.h`` (the arena and the input's shape and quantization as macros) and the API's
  implementation over TFLM (copies of tflm_patch_kernels/tflm/tfmcu_model.h, .cc); tfmcu/firmware/sources.py writes
  them and the files below;
* ``main.cc`` + ``test_inputs.cc``: the test firmware over the library: ``num_inputs`` test inputs (``--inputs`` or
  seeded random ones), one Invoke each, the result line (a copy of tflm_patch_kernels/tflm/firmware_main.cc);
  ``example_frame.c``: the first input as the frame of the example application (examples/classify/main.c);
* ``BUILD`` + ``WORKSPACE``: a Bazel repository that builds ``:firmware`` (the ELF), ``:example`` (the example
  application), ``:model`` and ``:libtfmcu_model`` (the library as one static archive) for the target with this
  project's toolchain, linking TFLM's runtime and only the kernels of the model's ops (``@tflite_micro//:kernel_*``,
  third_party/tflite_micro.BUILD), our kernel and harness from ``@tfmcu_ws``;
* ``expect.json``: the expected outputs for the inputs (their hash, top classes: TF Lite's, TFLM's on this host on an
  input that meets a rounding tie, below; for a streamed input the rows each Invoke reads), the predicted arena;
* ``deploy.json`` (``DeployReport``, which ``deploy`` returns): what was decided: the target, the kernels, the
  predicted TFLM arena on Cortex-M (tfmcu.plan.arena, build "cortex-m-cmsis-nn" or "cortex-m" after ``kernels``:
  32-bit structs), the arena = prediction x (1 + margin) rounded up to 16 bytes, the estimated fit in RAM and in
  Flash (``flash``: a model beyond the Flash goes to the board's external memory, with a note; on a board without
  any, it does not fit); with ``run``, the measured figures (``FirmwareRun``: and what measured them) and the
  verdict.

A detector (its outputs those of TFLite_Detection_PostProcess, ``tfmcu.tflite.detection_postprocess``) gets a
firmware built with ``-DTFMCU_DETECTOR_SLOTS``: the output check hashes all four outputs (the op's unwritten entries
zeroed on both sides), ``top_class`` is each input's top detection, and the result line lists each input's
detections (class, score, box); deploy.json's ``detector`` has TF Lite's, and with ``run`` ``run.detections`` the
firmware's, which must agree to the printed millionth (the expected detections, TF Lite's but at a tie).

The expectation (deploy.json's ``reference``, ``DeployReference``) is TF Lite's outputs, input by input: for a
custom-mode model, every TFMCU_PATCH_STAGE op in the C kernels (ctypes) and the builtin ops in TF Lite
(``tfmcu.runtime.host``), on the same images for a streamed input. The model also runs in TFLM on this host (its arena
goes to deploy.json): a builtin-only model always (the tflite-micro wheel, next to TF Lite in the same child
process), a custom-mode model (TFLM built from source with our kernel) without ``run``, or with ``run`` when it has an
op TF Lite's reference kernels requantize otherwise than TFLM's outside its stages
(``tfmcu.runtime.agreement.may_round_apart``: FULLY_CONNECTED, MUL, SUB, LOGISTIC, TANH). Where TFLM on this host
differs from TF Lite on an input by rounding ties, proven on the model (``tfmcu.runtime.agreement.rounding_ties``: in
the FULLY_CONNECTED head, or of such an op anywhere, replayed op by op), the expectation for that input is
TFLM's output on this host, which is what TFLM on the target computes, and the log says so in one line; any other
difference is a one-line ``DeployError`` naming the input.
``run`` builds ``@tfmcu_fw//:firmware`` from this checkout (``bazel build --override_repository=tfmcu_fw=OUT_DIR``)
and runs it on the target's QEMU board (tfmcu/firmware/run.py): the output bytes must equal the expectation and the
verdict is "fits" when it links into the target's memory and AllocateTensors succeeds; a link that overflows the
target's RAM or Flash, or an arena TFLM finds too small, is "does not fit", with the figure; ``run.measured_by``
names the kernels the firmware ran (``kernels``).

The model is read and parsed once (``tfmcu.tflite.model``); every step below takes that one object. TF Lite and TFLM
run it in a child process (``tfmcu.runtime.isolate``): a model that makes them abort is a one-line error.

Bad input (missing file, not a TFLite model, an op the firmware cannot register, a malformed custom-mode model, an
in-place plan for other kernels) is a one-line ``UsageError`` and writes nothing: the folder is assembled beside
``out_dir`` and renamed into place.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.files import write_folder, write_outputs
from tfmcu.firmware.outputs import EXAMPLE_ELF, board_file_names, flash_commands
from tfmcu.firmware.profile import OpProfile, op_profile, plot as profile_plot, table as profile_table
from tfmcu.firmware.run import DeployError, FirmwareRun, run_elf, run_firmware
from tfmcu.firmware.sources import (CONSOLES, EXTERNAL_MEMORY, KERNELS, check_model, detector_expectation, detector_slots_for,
                                    expectation, folder_files, printed_detections, stream_rows)
from tfmcu.firmware.targets import TARGETS, Target, get_target
from tfmcu.firmware.tree import check_dest, export_tree
from tfmcu.plan.arena import DEFAULT_KERNELS, ArenaPrediction, mcu_build, predict_model_arena
from tfmcu.records import Record, optional
from tfmcu.runtime.agreement import Agreement, ROUNDS_APART, compare, expected, may_round_apart, rounding_ties
from tfmcu.runtime.host import ModelRun, evaluate
from tfmcu.runtime.model_io import TFLMError, load_inputs, random_inputs, read_model
from tfmcu.tflite.detection_postprocess import postprocess_outputs, read_detector
from tfmcu.tflite.model import TfliteModel
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP

STATIC_ESTIMATE = 1024  # bytes of .data + .bss besides the arena (TFLM, harness, kernel): measured 0.8-1 KiB


def detector_static_bytes(slots: int) -> int:
    """A detector firmware's extra .bss (firmware_main.cc): 24 B per detection kept to print, the per-input counts,
    and about 256 B more measured (TFLite_Detection_PostProcess and its kernels' statics: 2,024 B of .data + .bss
    besides the arena with 30 slots on Cortex-M4, 2026-11-25)."""
    return 24 * slots + 68 + 256 if slots else 0
# Flash besides the model and the test inputs (TFLM's runtime, the model's kernels, ours, the harness), an upper
# estimate: the firmware tests' Flash less their model and inputs is about 125 kB with the reference kernels and
# about 45 kB more with CMSIS-NN (docs/firmware.md).
CODE_FLASH_ESTIMATE = 192 * 1024

__all__ = ["DeployError", "DeployOptions", "DeployReport", "FirmwareRun", "deploy", "prepare", "validate"]


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
    kernels: str = DEFAULT_KERNELS  # TFLM's CMSIS-NN kernels + the executor's CMSIS-NN backend, or "reference"
    tree: str | None = None  # also write the firmware as a plain CMake source tree here (docs/tree.md)
    console: str = "semihosting"  # where the firmware reports: semihosting (a debugger, QEMU) or "uart" (the board's)
    # TFLM's persistent data in a buffer of its own in the board's region for it (Target.persistent_ram, the STM32F405's
    # CCM) where it fits there; False: all of it in the one arena
    persistent_apart: bool = True
    # with ``run``: the firmware in per-op mode, and each op of its first Invoke profiled (tfmcu.firmware.profile):
    # profile.json, profile.png and a table
    profile: bool = False


@dataclass(frozen=True, kw_only=True)
class ArenaAtOp(Record):
    """The memory timeline's point at one operator (predicted, tfmcu.plan.arena): the arena region's bytes in use
    during its scope (the planned tensors and scratch alive then, TFLM's persistent data where it shares the arena)."""

    op: int
    type: str  # its TFLite builtin ("custom:TFMCU_PATCH_STAGE": a patch stage)
    arena_bytes: int


@dataclass(frozen=True, kw_only=True)
class DeployArena(Record):
    """The arena the firmware allocates: TFLM's predicted arena x (1 + margin), rounded up to 16 bytes."""

    predicted_bytes: int
    predicted_by: str
    margin: float
    arena_bytes: int
    host_measured_bytes: int | None  # TFLM on this host; None when it did not run here (``DeployReference``)
    # A board with a region for TFLM's persistent data (``Target.persistent_ram``, the STM32F405's CCM) where it fits
    # there: the arena holds only the predicted head (x (1 + margin)), the persistent buffer the tail (x (1 + margin))
    persistent_bytes: int | None = optional()
    persistent_region: str | None = optional()
    predicted_head_bytes: int | None = optional()
    predicted_tail_bytes: int | None = optional()
    region: str | None = optional()  # the board's SRAM region the arena is in (the firmware's RAM: RamEstimate)
    timeline: list[ArenaAtOp] | None = optional()  # per operator, predicted (``timeline_of``)


@dataclass(frozen=True, kw_only=True)
class ExternalMemory(Record):
    origin: str  # its address, "0x..."
    bytes: int


@dataclass(frozen=True, kw_only=True)
class FlashEstimate(Record):
    """Where the model goes and whether it fits the Flash, ESTIMATED (``flash_estimate``; the link decides)."""

    model_bytes: int
    inputs_bytes: int
    code_estimate_bytes: int
    estimated_bytes: int
    flash_bytes: int
    model_in: str  # "flash" or "external"
    fits: bool
    how: str
    note: str | None
    external_memory: ExternalMemory | None = optional()


@dataclass(frozen=True, kw_only=True)
class RamEstimate(Record):
    ram_bytes: int  # arena + stack + the other static data, estimated
    sram_bytes: int
    fits: bool  # the RAM and the Flash
    how: str
    # the region the firmware's RAM goes to: the board's firmware_ram, or its fast_ram where the estimate fits it
    region: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class DeployDetector(Record):
    """A detector's expectation: TF Lite's detections per input ([class, score, ymin, xmin, ymax, xmax], score and
    box in millionths)."""

    max_detections: int
    score_threshold: float | None
    labels: list[str] | None
    detections: list[list[list[int]]]
    how: str


@dataclass(frozen=True, kw_only=True)
class StreamedRows(Record):
    """A streamed input: the image's rows and the rows each input's Invoke read on this host."""

    image_rows: int
    rows_read: list[int]
    how: str


@dataclass(frozen=True, kw_only=True)
class DeployReference(Record):
    """What the firmware's outputs must equal, input by input (expect.json): TF Lite's (reference kernels), except on
    an input where TFLM on this host differs from them by a rounding tie in the FULLY_CONNECTED head, proven on the
    model (``tfmcu.runtime.agreement``): TFLM's there, what TFLM on the target computes too."""

    tflm_inputs: list[int]  # the inputs whose expectation is TFLM's on this host (proven ties)
    tflm_on_host: str | None  # the TFLM that ran on this host; None: not run (``how`` says why)
    tflite_vs_tflm: Agreement | None  # TF Lite against TFLM on this host (every tie listed); None: not run
    how: str


@dataclass(frozen=True, kw_only=True)
class DeployReport(Record):
    """What ``deploy`` wrote and, with ``run``, measured (deploy.json)."""

    tflite: str
    target: str
    target_what: str
    kernels: str
    ops: list[str]
    custom_mode: bool
    patch_stage_ops: int
    inputs: int
    model_bytes: int
    arena: DeployArena
    stack_bytes: int
    flash: FlashEstimate
    estimate: RamEstimate
    detector: DeployDetector | None = optional()
    streamed_input: StreamedRows | None = optional()
    reference: DeployReference | None = optional()  # what the outputs must equal (None: read from a file without it)
    run: FirmwareRun | None = optional()  # with ``run``: built and run under QEMU
    profile: OpProfile | None = optional()  # with ``run`` and ``profile``: per op of the first Invoke
    fits: bool | None = optional()  # with ``run``: the verdict's
    verdict: str | None = optional()
    # with ``run``, once it links: the files a board takes in out_dir (tfmcu.firmware.outputs: elf, bin, hex, map)
    # and the board's flash commands, run in out_dir (boards.json flash_with)
    files: dict[str, str] | None = optional()
    flash_with: list[str] | None = optional()


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
    if o.console not in CONSOLES:
        raise UsageError(f"--console={o.console}: must be one of {', '.join(CONSOLES)}")
    if o.profile and not o.run:
        raise UsageError("--profile measures the firmware under QEMU: give --run too")
    if o.profile and not t.machine:
        raise UsageError(f"--profile: no QEMU board runs the {t.core} of {t.name} (its firmware is linked, not run)")
    if o.console == "uart" and t.console is None:
        raise UsageError(f"--console=uart: {t.name}'s board file has no console UART yet (boards with one: "
                         f"{', '.join(n for n, b in TARGETS.items() if b.console)}); use --console=semihosting")
    if os.path.exists(o.out_dir) and not os.path.isdir(o.out_dir):
        raise UsageError(f"--out_dir={o.out_dir}: exists and is not a folder")
    if o.tree:
        check_dest(o.out_dir, o.tree, "--tree")
    return t


def prepare(o: DeployOptions, log: Callable[[str], None] = print) -> DeployReport:
    """Write the firmware folder (see the module docstring); returns deploy.json's content."""
    t = validate(o)
    model = read_model(o.tflite, "--tflite")
    info, ops, stages = check_model(model, o.kernels, t.core)  # info: a streamed-input model's is its image's
    rows = stream_rows(model)
    samples = (load_inputs(o.inputs, info)[:16] if o.inputs else
               random_inputs(model, o.num_inputs, o.seed, signature=info))
    # The expectation is TF Lite's outputs, but TF Lite's reference FULLY_CONNECTED (and MUL, SUB, LOGISTIC, TANH)
    # requantizes otherwise than TFLM's (an output within rounding of a half comes out 1 apart: a tie) and the
    # firmware runs TFLM, so TFLM runs
    # on this host too and its output is taken on an input where the two differ by a proven tie
    # (``choose_reference``). A builtin-only model: always, in the tflite-micro wheel in the child process that runs
    # TF Lite, at next to no cost (measured, 8 inputs: ResNet-8 3.4 s and VWW 3.4-3.9 s with or without it, most of
    # it the child's TensorFlow import). A custom-mode model runs whole in TFLM built from source with our kernel: a
    # Bazel build of minutes the first time on a machine (4 min here), then under a second a run (0.1-1 s on a small
    # model); with ``run`` only when it has such an op outside its stages (``may_round_apart``), so that deploying one without
    # never waits for that build: TF Lite's bytes are then TFLM's, and the run on the target checks them.
    custom = stages is not None
    host_tflm = not o.run or not custom or may_round_apart(model)
    log(f"deploy: {o.tflite}: {len(ops)} op types, {len(samples)} inputs; TF Lite reference outputs"
        + (" and TFLM on this host ..." if host_tflm else " ..."))
    try:
        ref = evaluate(model, samples, "reference", o.tflite, tflm=host_tflm, isolate=True)
        detector = postprocess_outputs(model.flatbuffer)  # a detector: all four outputs are checked
        reference, chosen = choose_reference(o, model, samples, ref, detector is not None, custom, log)
    except TFLMError as e:
        raise UsageError(str(e)) from None
    outs = [r[0] for r in chosen]
    host_arena = None if ref.arena is None else ref.arena.total
    build = mcu_build(o.kernels, t.core)
    stack = o.stack_kib * 1024
    slots = detector_slots_for(detector, info, len(samples))
    static = STATIC_ESTIMATE + detector_static_bytes(slots)

    def layout(t: Target) -> tuple[ArenaPrediction, int, int, int]:  # prediction, persistent, arena, RAM estimate
        pred, persistent = persistent_split(model, t, build, stages if o.kernels == "cmsis_nn" else None, o.margin,
                                            o.persistent_apart)
        arena = allocated_bytes(pred.head if persistent else pred.total, o.margin)
        return pred, persistent, arena, arena + stack + static

    pred, persistent, arena, ram_estimate = layout(t)
    if t.fast_ram:  # the faster region first, where the firmware's RAM fits it
        fast = t.placed(t.fast_ram)
        fast_layout = layout(fast)
        if fast_layout[3] <= fast.sram_bytes:
            t, (pred, persistent, arena, ram_estimate) = fast, fast_layout
    inputs = [s[0] for s in samples]
    xs = np.concatenate([np.asarray(x).reshape((1,) + tuple(info.inputs[0].shape[1:])) for x in inputs])
    flash = flash_estimate(t, len(model), xs.nbytes)
    comment = f"{os.path.basename(o.tflite)} for {t.name}; {len(xs)} inputs ({o.inputs or f'random, seed {o.seed}'})"
    want = detector_expectation(chosen, detector) if detector else expectation(outs)
    det = None
    if detector:
        record = read_detector(model.flatbuffer) or {}
        det = DeployDetector(
            max_detections=int(np.prod(info.outputs[2].shape)),
            score_threshold=record.get("score_threshold"), labels=record.get("labels"),
            detections=printed_detections(chosen, detector),
            how="the expected detections per input (the first 16; TF Lite's, TFLM's on this host at a rounding "
                "tie: 'reference'): [class, score, ymin, xmin, ymax, xmax], score and box in millionths; the "
                "firmware prints the same list and hashes all four outputs")
    streamed = None
    if rows:  # the kernel reads each image's rows from Flash through the firmware's provider
        read = (ref.streamed_rows_read or {}).get("tflite", [])
        streamed = StreamedRows(image_rows=rows, rows_read=read,
                                how="the firmware feeds each input image's rows from Flash through a "
                                    "TfmcuInputProvider (firmware_main.cc): no image in the arena")
        want["streamed_rows_read"] = read[:16]  # what the C executor read on this host, per input
    report = DeployReport(
        tflite=o.tflite, target=t.name, target_what=t.what, kernels=o.kernels,
        ops=[op.replace("custom:", "") for op in ops], custom_mode=stages is not None,
        patch_stage_ops=sum(name == "custom:" + PATCH_STAGE_OP for name in info.op_names), inputs=len(xs),
        model_bytes=len(model),
        arena=DeployArena(predicted_bytes=pred.total,
                          predicted_by=f"tfmcu.plan.arena, TFLM build {build!r} (32-bit structs, MicroAllocator)",
                          margin=o.margin, arena_bytes=arena, host_measured_bytes=host_arena, region=t.ram.name,
                          timeline=timeline_of(pred, persistent),
                          **(dict(persistent_bytes=persistent, persistent_region=t.persistent_ram,
                                  predicted_head_bytes=pred.head, predicted_tail_bytes=pred.tail)
                             if persistent else {})),
        stack_bytes=stack, flash=flash,
        estimate=RamEstimate(
            ram_bytes=ram_estimate, sram_bytes=t.sram_bytes, region=t.ram.name,
            fits=ram_estimate <= t.sram_bytes and flash.fits,
            how=f"arena + stack + {static} B of other .data/.bss (estimated"
                + (f"; {detector_static_bytes(slots)} B of them for the detector: the detections kept to print, "
                   f"its kernel" if slots else "") + "); the Flash as in 'flash'"),
        detector=det, streamed_input=streamed, reference=reference)
    files = folder_files(model, ops, xs, outs[0].nbytes, comment, t, arena, stack, o.kernels, o.tflite, stream=rows,
                         external=flash.model_in == "external",
                         detector_slots=slots, console=o.console, persistent=persistent, profile=o.profile)
    # what the example application (examples/classify/main.c, the first input as its frame) must print
    example = {} if detector else {"example": {**expectation(outs[:1]), "how": "output 0 of the first input (the "
                                               "example's frame): its FNV-1a hash and top class, TF Lite's"}}
    files["expect.json"] = json.dumps({"expect": want, **example,
                                       "expect_within": {"arena_used_bytes": [pred.total, 0.01]},
                                       "reference": {"tflm_inputs": reference.tflm_inputs, "how": reference.how}},
                                      indent=1) + "\n"
    files["deploy.json"] = json.dumps(report.to_json(), indent=1) + "\n"
    write_folder(o.out_dir, files)
    if t.firmware_ram != TARGETS[t.name].firmware_ram:
        log(f"deploy: the firmware's RAM in {t.ram.name}, the fastest region that holds it ({ram_estimate:,} B of "
            f"{t.sram_bytes:,} B)")
    if persistent:
        log(f"deploy: TFLM's persistent data apart, in {t.persistent_ram}: {persistent:,} B = predicted tail "
            f"{pred.tail:,} B + {o.margin:.0%} (the arena in {t.ram.name}: predicted head {pred.head:,} B + "
            f"{o.margin:.0%})")
    log(f"deploy: wrote {o.out_dir}/ (arena {arena:,} B = predicted {pred.head if persistent else pred.total:,} B "
        f"+ {o.margin:.0%}; "
        f"estimated RAM {ram_estimate:,} B of {t.sram_bytes:,} B: "
        f"{'fits' if ram_estimate <= t.sram_bytes else 'does not fit'})")
    if flash.note:
        log(f"deploy: {flash.note}")
    return report


def choose_reference(o: DeployOptions, model: TfliteModel, samples: list[Any], ref: ModelRun, detector: bool,
                     custom: bool, log: Callable[[str], None]) -> tuple[DeployReference, list[list[np.ndarray]]]:
    """The firmware's expectation, input by input (``DeployReference``), and the expected outputs: TF Lite's (``ref``:
    ``evaluate``'s run), TFLM's on this host on an input where the two differ by rounding ties, proven on the model
    (``rounding_ties``, in a child process). The outputs the firmware checks
    (output 0; a detector's four) differing otherwise on any input is a one-line ``DeployError`` naming the first."""
    if ref.tflm is None:
        return DeployReference(
            tflm_inputs=[], tflm_on_host=None, tflite_vs_tflm=None,
            how="TF Lite's outputs (reference kernels); TFLM did not run on this host: the model has no op TF "
                "Lite's reference kernels requantize otherwise than TFLM's outside its stages, so "
                "TF Lite's bytes are TFLM's (the run on the target checks them)"), ref.tflite
    checked = (lambda r: list(r)) if detector else (lambda r: list(r[:1]))  # what the firmware hashes
    differences = compare([checked(r) for r in ref.tflite], [checked(r) for r in ref.tflm])
    differing = {m.sample for m in differences}
    ties = {k: t for k, t in (rounding_ties(model, samples, ref.tflite, ref.tflm, "reference", where=o.tflite,
                                            isolate=True) if differences else {}).items() if k in differing}
    real = [m for m in differences if m.sample not in ties]
    if real:
        m = real[0]
        what = (f"output {m.output}, largest difference {m.max_abs_diff:g}" if m.max_abs_diff is not None
                else f"output {m.output}: {m.note}")
        raise DeployError(f"{o.tflite}: TFLM on this host differs from TF Lite on input {m.sample} ({what}), and "
                          f"not by a rounding tie (in the FULLY_CONNECTED head, or of an op TF Lite and TFLM "
                          f"requantize apart: {', '.join(ROUNDS_APART)})"
                          + (f" ({len(real)} of {len(samples)} inputs differ)" if len(real) > 1 else ""))
    tied = sorted(ties)
    # ties of other ops than the head (op_ties: MUL, SUB, LOGISTIC, TANH anywhere), by their builtin
    elsewhere = sorted({t.op_type for k in tied for t in ties[k] if t.op_type is not None})
    where = ("in the FULLY_CONNECTED head (TF Lite rounds once, TFLM twice)" if not elsewhere else
             f"of {', '.join(elsewhere)} ops (TF Lite and TFLM requantize them apart, 1 apart on such an input)")
    if tied:
        log(f"deploy: {len(tied)} of {len(samples)} inputs meet a rounding tie {where}: the firmware is checked "
            f"against TFLM on this host for them (input{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))}; "
            f"docs/pipelines.md#rounding-ties)")
    host = ("TFLM built from source (the pinned archive, reference kernels + the TFMCU_PATCH_STAGE kernel), whole "
            "model" if custom else "the tflite-micro wheel (TFLM's reference kernels)")
    how = ("TF Lite's outputs (reference kernels)"
           + (f", but TFLM's on this host on input{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))}: there "
              + (f"an output of the FULLY_CONNECTED head lies within rounding of a half, which TF Lite's reference "
                 f"kernel rounds once with the float scales and TFLM's twice with a fixed-point multiplier, 1 apart "
                 f"(proven on the model: tfmcu.runtime.agreement.head_ties)" if not elsewhere else
                 f"outputs of {', '.join(elsewhere)} ops come out 1 apart, TF Lite's and TFLM's arithmetic of them "
                 f"differing in their rounding (proven op by op: tfmcu.runtime.agreement.op_ties)")
              + "; the firmware runs TFLM" if tied else "; TFLM on this host gives the same bytes"))
    return (DeployReference(tflm_inputs=tied, tflm_on_host=host,
                            tflite_vs_tflm=Agreement.of(len(samples), differences, ties, "reference", max_details=64),
                            how=how),
            expected(ref.tflite, ref.tflm, ties))


def allocated_bytes(predicted: int, margin: float) -> int:
    """The buffer the firmware gets for a predicted arena (or persistent tail): x (1 + margin), rounded up to 16."""
    return -(-int(predicted * (1 + margin)) // 16) * 16


def largest_prediction(room: int, margin: float) -> int:
    """The largest prediction whose ``allocated_bytes`` fit in ``room`` bytes (a bound 16 bytes on the safe side)."""
    return int(room / (1 + margin)) // 16 * 16 - 16


def timeline_of(pred: ArenaPrediction, persistent: int) -> list[ArenaAtOp]:
    """The arena region's bytes in use per operator: the head's planned bytes alive in its scope, plus the tail (TFLM's
    persistent data, allocated first) unless it lives in a region of its own (``persistent`` > 0)."""
    extra = 0 if persistent else pred.tail
    return [ArenaAtOp(op=i, type=typ, arena_bytes=used + extra) for i, (typ, used) in enumerate(pred.timeline)]


def persistent_split(model: TfliteModel, t: Target, build: str, stage: Any, margin: float,
                     apart: bool = True) -> tuple[ArenaPrediction, int]:
    """TFLM's predicted arena for ``model`` on ``t`` and the persistent buffer's bytes: on a board with a region for
    TFLM's persistent data (``Target.persistent_ram``) where the tail x (1 + margin), rounded up to 16 bytes, fits, the
    prediction with the tail apart (``persistent_apart``) and that size; else (or not ``apart``) the one arena's
    prediction and 0."""
    region = t.persistent
    if region is not None and apart:
        split = predict_model_arena(model, build=build, stage=stage, persistent_apart=True)
        size = allocated_bytes(split.tail, margin)
        if size <= region.bytes:
            return split, size
    return predict_model_arena(model, build=build, stage=stage), 0


def flash_estimate(t: Target, model_bytes: int, inputs_bytes: int) -> FlashEstimate:
    """Where the model goes and whether it fits, ESTIMATED (the link decides with ``run``): the model, the test
    inputs and ``CODE_FLASH_ESTIMATE`` in the target's Flash; a model beyond it goes to the board's external memory
    (``tfmcu.firmware.sources.EXTERNAL_MEMORY``: the MPS2 boards' PSRAM, external QSPI Flash on a real part), and
    on a board without any it does not fit."""
    need = model_bytes + inputs_bytes + CODE_FLASH_ESTIMATE
    est = FlashEstimate(model_bytes=model_bytes, inputs_bytes=inputs_bytes, code_estimate_bytes=CODE_FLASH_ESTIMATE,
                        estimated_bytes=need, flash_bytes=t.flash_bytes, model_in="flash", fits=need <= t.flash_bytes,
                        how="model + test inputs + an upper estimate of the code (TFLM, kernels, harness: "
                            f"{CODE_FLASH_ESTIMATE // 1024} KiB), estimated", note=None)
    if est.fits:
        return est
    ext = None if t.own_ld else EXTERNAL_MEMORY.get(t.key)  # (a named board's external memory is not modelled)
    if ext is None:
        return dataclasses.replace(est, note=(
            f"the model ({model_bytes:,} B) does not fit {t.name}'s {t.flash_bytes // 1024:,} KiB of Flash "
            f"(estimated {need:,} B with the code and the test inputs) and the board has no external memory: "
            f"the firmware is written but will not link"))
    origin, size = ext
    return dataclasses.replace(
        est, model_in="external", external_memory=ExternalMemory(origin=f"0x{origin:08x}", bytes=size),
        fits=model_bytes <= size and need - model_bytes <= t.flash_bytes,
        note=(f"the model ({model_bytes:,} B) is beyond {t.name}'s {t.flash_bytes // 1024:,} KiB of Flash "
              f"(estimated {need:,} B with the code and the test inputs): it goes to the board's external memory "
              f"({size // (1024 * 1024)} MiB PSRAM at 0x{origin:08x} on the QEMU board; external QSPI/OSPI Flash "
              f"on a real part, memory-mapped, slower than the internal Flash)"
              + ("" if model_bytes <= size else ", which it does not fit either")))


def firmware_detections(out_dir: str, expected: list[list[list[int]]]) -> list[list[list[int]]]:
    """The detections a detector's firmware printed (its run.json), checked against the expected ones (``expected``:
    TF Lite's, TFLM's on this host at a rounding tie): the same
    detections, classes equal, scores and boxes within 1 millionth (the printed rounding). The output hash has
    already proved the four outputs bit-exact; this checks what the firmware prints from them."""
    try:
        with open(os.path.join(out_dir, "run.json")) as f:
            got = (json.load(f).get("result") or {}).get("detections")
    except (OSError, ValueError):
        got = None
    if not isinstance(got, list):
        raise DeployError(f"{out_dir}/run.json: the detector's firmware printed no detections")
    same = len(got) == len(expected) and all(
        len(g) == len(e) and all(len(a) == 6 and a[0] == b[0] and all(abs(x - y) <= 1 for x, y in zip(a[1:], b[1:]))
                                 for a, b in zip(g, e)) for g, e in zip(got, expected))
    if not same:
        raise DeployError(f"{out_dir}: the firmware's detections differ from the expected ones (TF Lite's): "
                          f"{json.dumps(got)[:200]}")
    return got


def _profile(o: DeployOptions, report: "DeployReport", t: Target, segments: str,
             log: Callable[[str], None]) -> OpProfile:
    """The per-op profile of the run (``tfmcu.firmware.profile``): printed, and written as profile.json and
    profile.png beside deploy.json; the segments file it was read from removed."""
    with open(o.tflite, "rb") as f:
        model = f.read()
    elf = run_elf(os.path.abspath(o.out_dir))
    prof = op_profile(model, report.run, segments, elf, t, o.kernels, report.run.measured_by)
    os.remove(segments)
    title = (f"{os.path.basename(o.tflite)} on {t.name}: instructions per op, one Invoke (QEMU)"
             + (", cycles estimated" if prof.cycles_by else ""))
    write_outputs({os.path.join(o.out_dir, "profile.json"): json.dumps(prof.to_json(), indent=1) + "\n",
                   os.path.join(o.out_dir, "profile.png"): profile_plot(prof, title)})
    log("deploy: per-op profile of the first Invoke (profile.json, profile.png):\n" + profile_table(prof).rstrip())
    return prof


def deploy(o: DeployOptions, log: Callable[[str], None] = print) -> DeployReport:
    """``prepare``; with ``run``, the firmware built and run under QEMU (tfmcu/firmware/run.py): deploy.json gets
    ``run`` (the measured figures), ``fits`` and ``verdict``."""
    report = prepare(o, log)
    if o.run:
        placed = TARGETS[o.target].placed(report.estimate.region)
        segments = os.path.join(os.path.abspath(o.out_dir), "segments.txt") if o.profile else None
        run, fits, verdict = run_firmware(o.out_dir, placed,
                                          (report.arena.arena_bytes, report.arena.predicted_bytes, report.stack_bytes),
                                          o.kernels, o.timeout_s, log, console=o.console,
                                          tflm_inputs=len(report.reference.tflm_inputs) if report.reference else 0,
                                          segments=segments)
        if report.detector is not None and fits:
            run = dataclasses.replace(run, detections=firmware_detections(o.out_dir, report.detector.detections))
        report = dataclasses.replace(report, run=run, fits=fits, verdict=verdict)
        if run.linked:
            report = dataclasses.replace(report, files={**board_file_names(placed), "example": EXAMPLE_ELF},
                                         flash_with=flash_commands(placed))
        if o.profile and fits:
            report = dataclasses.replace(report, profile=_profile(o, report, placed, segments, log))
        write_outputs({os.path.join(o.out_dir, "deploy.json"): json.dumps(report.to_json(), indent=1) + "\n"})
        log(f"deploy: {verdict}")
        if run.example is not None:
            log(f"deploy: the example application ({EXAMPLE_ELF}: examples/classify/main.c over the model library "
                f"in model/) printed top-1 class {run.example.top_class[0]} and output bytes equal to TF Lite's")
        if report.flash_with:
            log(f"deploy: {', '.join(report.files.values())} in {o.out_dir}; onto the {placed.name}, in that "
                f"folder:\n  " + "\n  ".join(report.flash_with))
    if o.tree:
        export_tree(o.out_dir, o.tree, log=log)
    return report
