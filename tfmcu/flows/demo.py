"""``make demo``: the whole toolchain end to end on real data (``pipelines.demo``), in about 13 minutes on 2 cores.

0. the paper's example: MobileNetV2-224 per layer vs 4x4 patches over 5 blocks (analytic);
1. profile the chosen model (default ``mcunet-demo``, a small MCUNet-style net at 96x96) and check, BEFORE any
   training, that the SRAM budget can be met: the TFLM arena depends only on the architecture, so the same model
   with untrained weights is converted to int8, measured in TFLM and searched for a schedule; a budget that cannot
   be met stops here, in seconds;
2-3. train it briefly on Fashion-MNIST (``tfmcu.train``), then quantization-aware training; export a full-int8
   .tflite with TFLite metadata; int8 test accuracy in TF Lite and in TFLM (sample for sample);
4. rewrite it under the budget (``budget_fraction`` of its measured TFLM arena, or ``sram_kb``): the least-MACs
   builtin schedule whose predicted TFLM arena fits (``tfmcu.plan.search``), confirmed by the real TFLM interpreter;
5. verify the patched model against the original (``tfmcu.flows.verify``): bit-exact outputs in TF Lite and TFLM on
   random and real test images, both arenas measured and predicted;
6. on the microcontroller (``mcu``, default the STM32F405 under QEMU), with TFLM's CMSIS-NN kernels: the trained
   model per layer (``deploy --run``) and through ``fit --run`` (``tfmcu.flows.fit``: the fastest configuration
   whose arena fits the chip, verified, its firmware built and run), on real test images;
7. write the summary table (accuracy float / int8; peak SRAM per-layer vs patched, analytic and measured; Flash; MACs;
   on the MCU: arenas, verdicts, instructions).

Everything goes under ``out_dir`` (default out/demo): mbv2_224_profile.json, mbv2_224_memory.png, profile.json,
memory.png, model_int8.tflite, model_int8_patched.tflite, train_report.json, training_curves.png,
confusion_matrix.png, rewrite.json, verify.json, summary.md, summary.json (+ spec.json, labels.txt, checkpoints/,
tensorflow.log: TensorFlow's C++ start-up messages).
"""

from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.files import write_outputs
from tfmcu.firmware.targets import get_target
from tfmcu.flows.deploy import DeployOptions, DeployReport, FirmwareRun, deploy
from tfmcu.flows.fit import ChosenCandidate, FitCandidate, FitMeasured, FitOptions, run as fit_run
from tfmcu.flows.profile import format_table, plot_memory, profile_report
from tfmcu.flows.verify import VerifyOptions, format_summary as verify_summary, verify
from tfmcu.graph.from_spec import from_spec
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.graph.load import load_spec
from tfmcu.nets.spec import NetSpec
from tfmcu.plan import regions
from tfmcu.plan.search import SearchOptions, SearchResult, search
from tfmcu.records import Record
from tfmcu.runtime.capture import import_tensorflow_quietly
from tfmcu.runtime.tflm import measure_arena
from tfmcu.stage.builtin import BuiltinArenaCost
from tfmcu.stage.common import read_schedule
from tfmcu.tflite.editor import split_appended_zip
from tfmcu.data.catalog import load
from tfmcu.data.classify import as_arrays
from tfmcu.train.config import Recipe, TrainConfig
from tfmcu.train.export import quantize_inputs, untrained_int8
from tfmcu.train.trainer import train, validate as validate_training

KB = 1024


def demo_training() -> TrainConfig:
    """The demo's training: a seeded 12,000-image subset, 2 float epochs + 1 short QAT epoch, no augmentation (it
    slows convergence of a 2-epoch run; the full recipe of ``pipelines.train`` has it on). Sized so that the whole
    demo, the Cortex-M build of TFLM included, stays under 15 minutes on 2 cores."""
    return TrainConfig(model="mcunet-demo", dataset="fashion_mnist", resolution=96,
                       recipe=Recipe(epochs=2, qat_epochs=1, batch_size=128, lr=0.1, augment=False),
                       val_split=2000, train_subset=12000, qat_steps_per_epoch=40, int8_eval_samples=1000)


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    out_dir: str = "out/demo"
    training: TrainConfig = field(default_factory=demo_training)
    budget_fraction: float = 0.6  # SRAM budget = this fraction of the per-layer model's TFLM arena
    sram_kb: float | None = None  # overrides budget_fraction
    verify_random: int = 20
    verify_real: int = 200
    mcu: str | None = "stm32f405"  # 7. run on this target under QEMU (None: skip)
    mcu_images: int = 8


@dataclass(frozen=True, kw_only=True)
class McuFit(Record):
    """What ``fit --run`` chose on the target (summary.json's ``mcu.fit``)."""

    message: str
    chosen: ChosenCandidate
    per_layer: FitCandidate
    measured: FitMeasured | None


@dataclass(frozen=True, kw_only=True)
class McuRun(Record):
    """Step 6: the trained model on the target per layer (``deploy --run``) and through ``fit --run``."""

    target: str
    images: int
    schedule: str
    per_layer: DeployReport
    patched: DeployReport  # fit's firmware
    fit: McuFit


def validate(o: DemoOptions) -> None:
    validate_training(o.training)
    if not 0.05 <= o.budget_fraction <= 0.99:
        raise UsageError(f"--budget_fraction={o.budget_fraction}: must be in [0.05, 0.99]")
    if o.sram_kb is not None and o.sram_kb <= 0:
        raise UsageError(f"--sram_kb={o.sram_kb}: must be > 0")
    if o.mcu:
        get_target(o.mcu)
        if not 1 <= o.mcu_images <= 16:
            raise UsageError(f"--mcu_images={o.mcu_images}: must be in [1, 16]")
        if o.mcu_images > o.verify_real:
            raise UsageError(f"--mcu_images={o.mcu_images}: at most --verify_real={o.verify_real} (the same images)")
    if o.verify_random < 0 or o.verify_real < 0 or o.verify_random + o.verify_real == 0:
        raise UsageError("--verify_random and --verify_real must be >= 0, and not both 0")


def summary_table(s: dict[str, Any]) -> str:
    """The summary table (docs/getting-started.md): per-layer vs patched; ``s``: summary.json's content (its ``mcu``:
    ``McuRun.to_json()``)."""
    a = s["accuracy"]
    p, q = s["per_layer"], s["patched"]
    ties = a.get("tflite_tflm_rounding_ties", 0)  # samples 1 apart by a rounding tie (docs/pipelines.md#rounding-ties)
    int8 = f"{a['int8_tflm']:.2%}" + ((f" (TF Lite = TFLM but {ties} rounding ties)" if ties else " (TF Lite = TFLM)")
                                      if a["tflite_equals_tflm"] else " (TF Lite != TFLM!)")
    n_k, n_8 = a["keras_test_samples"], a["int8_test_samples"]
    rows = [
        (f"accuracy, float (Keras, {n_k} test images)", f"{a['float']:.2%}", "-"),
        (f"accuracy, QAT (Keras, {n_k} test images)", "-" if a["qat"] is None else f"{a['qat']:.2%}", "-"),
        (f"accuracy, float (Keras, the {n_8} int8 test images)", f"{a['float_on_int8_samples']:.2%}", "-"),
        (f"accuracy, int8 ({n_8} test images)", int8,
         "identical (bit-exact outputs)" if s["verify"]["bit_exact"] else "NOT bit-exact"),
        ("peak SRAM, analytic", _kb(p["analytic_peak_bytes"]), _kb(q["analytic_peak_bytes"])),
        ("peak SRAM, TFLM arena measured", _kb(p["tflm_arena_bytes"]), _kb(q["tflm_arena_bytes"])),
        ("peak SRAM, TFLM arena predicted", _kb(p["predicted_arena_bytes"]), _kb(q["predicted_arena_bytes"])),
        (f"fits the {s['budget_bytes'] / KB:.1f} kB budget (TFLM)", "no" if p["tflm_arena_bytes"] > s["budget_bytes"]
         else "yes", "yes" if q["tflm_arena_bytes"] <= s["budget_bytes"] else "no"),
        ("Flash (.tflite file)", _kb(p["flash_bytes"]), _kb(q["flash_bytes"])),
        ("MACs", f"{p['macs'] / 1e6:.2f}M", f"{q['macs_exact'] / 1e6:.2f}M exact (+{q['mac_overhead_exact']:.1%}), "
                                            f"{q['macs_padded'] / 1e6:.2f}M padded (+{q['mac_overhead_padded']:.1%})"),
        ("TFLite ops", str(p["ops"]), str(q["ops"])),
    ]
    mcu = McuRun.from_json(s["mcu"]) if s.get("mcu") else None  # (summary.json's, in this run or read back)
    if mcu:
        pl, pa = mcu.per_layer, mcu.patched
        lrun, prun = pl.run, pa.run
        t = mcu.target
        overflow = lrun.overflow if lrun is not None else None
        rows += [
            (f"{t} (QEMU), TFLM arena: predicted / measured", _kb(pl.arena.predicted_bytes) + " / " +
             _kb(lrun.arena_used_bytes if lrun is not None else None),
             f"{_kb(pa.arena.predicted_bytes)} / {_kb(prun.arena_used_bytes if prun is not None else None)} (fit)"),
            (f"{t} (QEMU), verdict", ("fits" if pl.fits else "does not fit") + (
                f" (link: RAM overflowed by {overflow.bytes:,} B)" if overflow and overflow.bytes is not None else ""),
             ("fits" if pa.fits else "does not fit") + f", {mcu.schedule}"),
            (f"{t} (QEMU), top-1 of {mcu.images} test images = TF Lite", "-",
             "yes" if prun is not None and prun.outputs_equal_tflite else "NO"),
            (f"{t} (QEMU), instructions per inference (CMSIS-NN)",
             _minstructions(lrun), _minstructions(prun)),
        ]
    head = f"| {s['model']} @ {s['resolution']}, {s['dataset']} | per-layer | patched ({s['schedule']}) |"
    lines = [head, "|---|---:|---:|"] + [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    notes = (f"\nTrained on {s['train_samples']} {s['dataset']} images for {s['epochs']} epochs + "
             f"{s['qat_epochs']} QAT "
             f"epoch(s) of {s['qat_steps']} steps; TFLM arena "
             f"with the input image; verify: {s['verify']['samples']} inputs ({s['verify']['real']} real), "
             f"wall time {s['wall_s']:.0f} s.\n")
    return "\n".join(lines) + "\n" + notes


def _kb(n: float | None) -> str:
    return "-" if n is None else f"{n / KB:,.1f} kB"


def _minstructions(run: FirmwareRun | None) -> str:
    n = None if run is None else run.instructions
    return "-" if n is None else f"{n / 1e6:.1f}M"


def budget_bytes(o: DemoOptions, arena: int) -> int:
    """The demo's SRAM budget for a per-layer TFLM arena of ``arena`` bytes, which must not already fit it."""
    budget = int(o.sram_kb * KB) if o.sram_kb else int(arena * o.budget_fraction) // 16 * 16
    if arena <= budget:
        raise UsageError(f"the per-layer model already fits {budget / KB:.1f} kB (TFLM arena {arena / KB:.1f} kB): "
                         f"choose a smaller --sram_kb or --budget_fraction")
    return budget


def check_budget(spec: NetSpec, o: DemoOptions, log: Callable[[str], None]) -> tuple[int, SearchResult]:
    """Before training: the budget the demo will use, and the search proving a schedule meets it."""
    model = untrained_int8(spec, o.training.seed)
    arena = measure_arena(model, where="the untrained model", isolate=True).total
    budget = budget_bytes(o, arena)
    graph = from_tflite(model, name=spec.name)
    res = search(graph, BuiltinArenaCost(model, graph, "the untrained model"), budget, SearchOptions())
    if not res.patched:
        raise UsageError(f"no patch schedule fits {budget / KB:.1f} kB; nothing trained: {res.message}")
    log(f"budget check (untrained weights, same arena): per-layer TFLM arena {arena / KB:.1f} kB, budget "
        f"{budget / KB:.1f} kB, {res.chosen.describe()} fits ({res.chosen.cost / KB:.1f} kB predicted)")
    return budget, res


def run(o: DemoOptions, log: Callable[[str], None] = print) -> int:
    """The demo (see the module docstring); 0 when every check holds, 1 otherwise."""
    validate(o)
    t0 = time.time()
    out = o.out_dir
    path = lambda name: os.path.join(out, name)  # noqa: E731
    tc = o.training
    ds_probe = load(tc.dataset, tc.data_dir)  # fails first, with install instructions, if data are missing
    spec = load_spec(tc.model, resolution=tc.resolution,
                     num_classes=None if tc.model.endswith(".json") else ds_probe.num_classes)
    import_tensorflow_quietly(path("tensorflow.log"))

    # ------------------------------------------------------------------ 0. the paper's example
    mbv2 = from_spec(load_spec("mbv2", resolution=224))
    mb = profile_report(mbv2, regions.schedule(mbv2, 4, n_blocks=5), sram_bytes=256 * KB)
    log("== 0/7 MobileNetV2 1.0 @ 224, analytic: per layer vs 4x4 patches over the first 5 blocks ==")
    log(format_table(mb).split("\n\nMACs", 1)[1].join(["MACs", ""]).rstrip())
    write_outputs({path("mbv2_224_profile.json"): mb, path("mbv2_224_memory.png"): plot_memory(mb)})

    # ------------------------------------------------------------------ 1. profile, and the budget before training
    log(f"== 1/7 profile {spec.name} @ {spec.resolution} (analytic, per layer); can the budget be met? ==")
    log(format_table(profile_report(from_spec(spec))).split("\n\nblock", 1)[1].join(["block", ""]).rstrip())
    check_budget(spec, o, log)

    # ------------------------------------------------------------------ 2-3. train, QAT, int8
    log(f"\n== 2/7 train on {ds_probe.name} ({tc.train_subset} images, {tc.recipe.epochs} epochs) + "
        f"{tc.recipe.qat_epochs} QAT epoch(s) -> 3/7 int8 .tflite ==")
    tr = train(tc, out, log=log)
    assert tr is not None and tr.classification is not None  # (a classifier, on one device: its own chief)
    trained = tr.classification
    log(tr.summary().rstrip())
    model_path = tr.files["tflite"]
    with open(model_path, "rb") as f:
        model = f.read()

    # ------------------------------------------------------------------ 4. rewrite under the budget
    arena = trained.memory.tflm_arena_bytes
    budget = budget_bytes(o, arena)
    log(f"\n== 4/7 rewrite --patches=auto under {budget / KB:.1f} kB (per-layer TFLM arena {arena / KB:.1f} kB "
        f"does not fit) ==")
    graph = from_tflite(model, name=spec.name)
    tty = sys.stderr.isatty()

    def progress(n: int, total: int, what: str) -> None:
        if tty:
            print(f"\r  [{n}/{total}] {what:<60}", end="", file=sys.stderr, flush=True)

    res = search(graph, BuiltinArenaCost(model, graph, model_path), budget, SearchOptions(), progress)
    if tty:
        print("", file=sys.stderr)
    log(res.message)
    if not res.patched:
        raise UsageError(f"no patch schedule fits {budget / KB:.1f} kB: {res.message}")
    ev = res.chosen
    patched = ev.result.model
    m_patched = measure_arena(patched, where="patched model", isolate=True)
    if m_patched.total > budget:
        raise UsageError(f"the patched model's measured TFLM arena ({m_patched.total} B) exceeds the budget "
                         f"({budget} B)")
    sched = ev.candidate.schedules()[0]
    chosen_text = ev.candidate.describe()
    log(f"chosen: {chosen_text} ({ev.variant_label} borders); TFLM arena {arena:,} -> {m_patched.total:,} B "
        f"({arena / m_patched.total:.2f}x smaller), MACs +{sched.macs_patched_exact / sched.macs - 1:.1%} exact")
    patched_path = path("model_int8_patched.tflite")
    prof_patched = profile_report(graph, sched, sram_bytes=budget)
    md_kept = read_schedule(patched) is not None and split_appended_zip(patched)[1] != []
    rewrite_report = {"input": model_path, "output": patched_path, "budget_bytes": budget, "message": res.message,
                      "schedule": ev.result.schedule, "border": ev.variant_label, "search": res.to_dict(),
                      "tflm": {"original": arena, "rewritten": m_patched.total},
                      "predicted": {"original": res.baseline.cost, "rewritten": ev.cost},
                      "ops": {"original": ev.result.ops_before, "rewritten": ev.result.ops_after},
                      "metadata_kept": md_kept}
    write_outputs({patched_path: patched, path("rewrite.json"): rewrite_report, path("profile.json"): prof_patched,
                   path("memory.png"): plot_memory(prof_patched, budget)})

    # ------------------------------------------------------------------ 5. verify
    log(f"\n== 5/7 verify: {o.verify_random} random + {o.verify_real} real test images, TF Lite and TFLM ==")
    inputs_path = None
    if o.verify_real:
        x_real, _ = as_arrays(ds_probe.test, spec.resolution, spec.in_channels, limit=o.verify_real)
        inputs_path = path("verify_inputs.npy")
        write_outputs({inputs_path: _npy(quantize_inputs(model, x_real))})
    ver = verify(VerifyOptions(model_path, patched_path, o.verify_random, tc.seed, inputs_path, "reference"))
    write_outputs({path("verify.json"): ver.to_json()})
    log(verify_summary(ver).rstrip())

    # ------------------------------------------------------------------ 6. on the microcontroller
    mcu = on_mcu(o, model_path, inputs_path, path, log) if o.mcu else None

    # ------------------------------------------------------------------ 7. summary
    acc = trained.accuracy
    summary = {
        "model": spec.name, "resolution": spec.resolution, "dataset": tr.dataset.name,
        "train_samples": tr.dataset.train, "epochs": tc.recipe.epochs, "qat_epochs": tc.recipe.qat_epochs,
        "qat_steps": tr.qat_steps_per_epoch,
        "schedule": chosen_text, "budget_bytes": budget,
        "accuracy": {"float": acc.float, "qat": acc.qat, "int8_tflite": acc.int8_tflite, "int8_tflm": acc.int8_tflm,
                     "keras_test_samples": acc.keras_test_samples, "int8_test_samples": acc.int8_test_samples,
                     "float_on_int8_samples": acc.float_on_int8_samples,
                     "tflite_equals_tflm": trained.tflite_vs_tflm.agree,
                     "tflite_tflm_rounding_ties": trained.tflite_vs_tflm.tie_samples},
        "per_layer": {"analytic_peak_bytes": prof_patched["peak_sram_per_layer_bytes"],
                      "tflm_arena_bytes": ver.tflm.original.arena_total_bytes,
                      "predicted_arena_bytes": ver.predicted.original.arena_total_bytes,
                      "flash_bytes": len(model), "macs": sched.macs, "ops": ver.ops.original},
        "patched": {"analytic_peak_bytes": sched.peak_sram_bytes,
                    "tflm_arena_bytes": ver.tflm.rewritten.arena_total_bytes,
                    "predicted_arena_bytes": ver.predicted.rewritten.arena_total_bytes,
                    "flash_bytes": len(patched), "macs_exact": sched.macs_patched_exact,
                    "macs_padded": sched.macs_patched_padded,
                    "mac_overhead_exact": sched.macs_patched_exact / sched.macs - 1,
                    "mac_overhead_padded": sched.macs_patched_padded / sched.macs - 1,
                    "ops": ver.ops.rewritten},
        "verify": {"bit_exact": ver.bit_exact, "samples": ver.samples, "real": ver.input_samples},
        "metadata_kept": md_kept,
        "mcu": None if mcu is None else mcu.to_json(),
        "wall_s": time.time() - t0,
    }
    table = summary_table(summary)
    write_outputs({path("summary.md"): table, path("summary.json"): summary})
    log(f"\n== 7/7 summary ==\n{table}")
    log("wrote: " + ", ".join(sorted(os.path.relpath(p) for p in (
        model_path, patched_path, path("train_report.json"), path("training_curves.png"), path("confusion_matrix.png"),
        path("memory.png"), path("profile.json"), path("rewrite.json"), path("verify.json"), path("summary.md")))))
    mcu_ok = mcu is None or (bool(mcu.patched.fits) and mcu.patched.run is not None
                             and mcu.patched.run.outputs_equal_tflite)
    return 0 if ver.bit_exact and tr.agree and mcu_ok else 1


def on_mcu(o: DemoOptions, model_path: str, inputs_path: str | None, path: Callable[[str], str],
           log: Callable[[str], None]) -> McuRun:
    """Step 6: the trained model on the emulated microcontroller, both with TFLM's CMSIS-NN kernels: per layer
    (``deploy --run``), and through ``fit --run`` (the fastest configuration whose predicted arena fits the target,
    verified bit-exact, its firmware built and run); both on the first ``mcu_images`` real test images, whose outputs
    must equal TF Lite's."""
    t = get_target(o.mcu)
    log(f"\n== 6/7 on the {t.name} (QEMU {t.machine}): per layer (deploy --run), and fit --run ==")
    mcu_inputs = path("mcu_inputs.npy")
    write_outputs({mcu_inputs: _npy(np.load(inputs_path)[:o.mcu_images])})
    per_layer = deploy(DeployOptions(tflite=model_path, target=t.name, out_dir=path(f"firmware_{t.name}_per_layer"),
                                     run=True, inputs=mcu_inputs), log=log)
    fitted = fit_run(FitOptions(model=model_path,
                                firmware=DeployOptions(tflite="", target=t.name, run=True, inputs=mcu_inputs),
                                out_dir=path(f"fit_{t.name}"), verify_samples=4), log=log)
    ch = fitted.chosen
    schedule = ch.describe if ch.patched else "per layer (it fits as it is)"
    return McuRun(target=t.name, images=o.mcu_images, schedule=schedule, per_layer=per_layer, patched=fitted.deploy,
                  fit=McuFit(message=fitted.message, chosen=ch, per_layer=fitted.per_layer, measured=fitted.measured))


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()
