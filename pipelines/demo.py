"""`make demo`: the whole toolchain end to end on real data, in about 10 minutes on 2 CPU cores.

1. profile the chosen model (default ``mcunet-demo``, a small MCUNet-style net at 96x96) layer by layer;
2. train it briefly on Fashion-MNIST (a seeded subset, ``tfmcu.train``), then quantization-aware training;
3. export a full-int8 .tflite with TFLite metadata; int8 test accuracy in TF Lite and in TFLM (sample for sample);
4. rewrite it with ``--patches=auto`` under an SRAM budget the per-layer model does NOT fit (``--budget_fraction``
   of its measured TFLM arena, or ``--sram_kb``): ``tfmcu.rewrite.auto_rewrite`` picks the least-MACs patch schedule
   whose TFLM arena fits, and the real TFLM interpreter confirms it;
5. verify the patched model against the original (``pipelines.verify.run_verify``): bit-exact outputs in TF Lite and
   TFLM on random and real test images, and both arenas measured and predicted;
6. print and write the summary table (accuracy float / int8; peak SRAM per-layer vs patched, analytic and measured;
   Flash; MACs).

Step 0 prints the paper's example first: MobileNetV2-224 per layer vs 4x4 patches (mbv2_224_profile.json,
mbv2_224_memory.png). Everything goes under --out_dir (default out/demo): profile.json, memory.png (per-layer vs
patched, with the budget), model_int8.tflite, model_int8_patched.tflite, train_report.json, training_curves.png,
confusion_matrix.png, rewrite.json, verify.json, summary.md, summary.json (+ spec.json, labels.txt, checkpoints/).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Sequence

from pipelines import _cli
from absl import flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "out/demo", "Where everything goes.")
flags.DEFINE_string("model", "mcunet-demo", "Preset or spec JSON to train.")
flags.DEFINE_integer("resolution", 96, "Input resolution.", lower_bound=16)
flags.DEFINE_string("dataset", "fashion_mnist", "fashion_mnist, mnist or a folder of class folders.")
flags.DEFINE_integer("train_subset", 20000, "Training samples (seeded subset of the training split).", lower_bound=1)
flags.DEFINE_integer("epochs", 2, "Float epochs.", lower_bound=0)
flags.DEFINE_integer("qat_epochs", 1, "QAT epochs.", lower_bound=0)
flags.DEFINE_integer("qat_steps", 60, "Steps of each QAT epoch (0: a whole epoch).", lower_bound=0)
flags.DEFINE_integer("batch_size", 128, "Batch size.", lower_bound=1)
flags.DEFINE_float("lr", 0.1, "Peak learning rate.", lower_bound=0)
flags.DEFINE_bool("augment", False, "Augmentation (off: it slows convergence of a 2-epoch run; the full recipe of "
                                    "pipelines.train has it on).")
flags.DEFINE_integer("val_split", 2000, "Validation samples held out of the training set.", lower_bound=0)
flags.DEFINE_integer("test_subset", None, "Float / QAT accuracy on a seeded subset of N test samples (default: "
                                         "all 10,000).", lower_bound=1)
flags.DEFINE_integer("int8_eval_samples", 2000, "int8 accuracy (TF Lite and TFLM) on a seeded subset of N test "
                                                "samples.",
                     lower_bound=1)
flags.DEFINE_float("budget_fraction", 0.6, "SRAM budget = this fraction of the per-layer model's TFLM arena.",
                   lower_bound=0.05, upper_bound=0.99)
flags.DEFINE_float("sram_kb", None, "SRAM budget in kB (overrides --budget_fraction).", lower_bound=1)
flags.DEFINE_integer("verify_random", 20, "Random inputs for the bit-exactness check.", lower_bound=0)
flags.DEFINE_integer("verify_real", 200, "Real test images for the bit-exactness check.", lower_bound=0)
flags.DEFINE_integer("train_seed", 0, "Seed of the training run (weights, data order, subsets).")
flags.DEFINE_bool("resume", False, "Continue the training from out_dir/checkpoints.")

KB = 1024


def log(msg: str) -> None:
    print(msg, flush=True)


def _kb(n: float | None) -> str:
    return "-" if n is None else f"{n / KB:,.1f} kB"


def summary_table(s: dict[str, Any]) -> str:
    """The README table: per-layer vs patched."""
    a = s["accuracy"]
    p, q = s["per_layer"], s["patched"]
    int8 = f"{a['int8_tflm']:.2%}" + (" (TF Lite = TFLM)" if a["tflite_equals_tflm"] else " (TF Lite != TFLM!)")
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
    head = f"| {s['model']} @ {s['resolution']}, {s['dataset']} | per-layer | patched ({s['schedule']}) |"
    lines = [head, "|---|---:|---:|"] + [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    notes = (f"\nTrained on {s['train_samples']} {s['dataset']} images for {s['epochs']} epochs + "
             f"{s['qat_epochs']} QAT "
             f"epoch(s) of {s['qat_steps']} steps; TFLM arena "
             f"with the input image; verify: {s['verify']['samples']} inputs ({s['verify']['real']} real), "
             f"wall time {s['wall_s']:.0f} s.\n")
    return "\n".join(lines) + "\n" + notes


def main(argv: Sequence[str]) -> int:
    from tfmcu import data, metadata, train

    try:
        return run_demo()
    except (data.DataError, train.TrainError, metadata.MetadataError) as e:
        raise _cli.UsageError(str(e)) from None


def run_demo() -> int:
    from tfmcu import data, ir, models, report, rewrite, scheduler, tflm, train
    from tfmcu.lower_tflite import from_tflite
    from pipelines import verify

    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter (saver, converter) through absl
    ds_probe = data.load(FLAGS.dataset)  # fails first, with install instructions, if the data are missing
    spec = models.load_spec(FLAGS.model, resolution=FLAGS.resolution,
                            num_classes=None if FLAGS.model.endswith(".json") else ds_probe.num_classes)

    t0 = time.time()
    out = FLAGS.out_dir
    os.makedirs(out, exist_ok=True)
    path = lambda name: os.path.join(out, name)  # noqa: E731

    # ------------------------------------------------------------------ 0. the paper's example
    mbv2 = ir.from_spec(models.load_spec("mbv2", resolution=224))
    mb_sched = scheduler.plan(mbv2, 4, n_blocks=5)
    mb = report.profile_report(mbv2, mb_sched, sram_bytes=256 * KB)
    log("== 0/6 MobileNetV2 1.0 @ 224, analytic: per layer vs 4x4 patches over the first 5 blocks ==")
    log(report.format_table(mb).split("\n\nMACs", 1)[1].join(["MACs", ""]).rstrip())
    report.write_outputs({path("mbv2_224_profile.json"): mb, path("mbv2_224_memory.png"): report.plot_memory(mb)})

    # ------------------------------------------------------------------ 1. profile
    log(f"== 1/6 profile {spec.name} @ {spec.resolution} (analytic, per layer) ==")
    prof = report.profile_report(ir.from_spec(spec))
    log(report.format_table(prof).split("\n\nblock", 1)[1].join(["block", ""]).rstrip())

    # ------------------------------------------------------------------ 2-3. train, QAT, int8
    log(f"\n== 2/6 train on {ds_probe.name} ({FLAGS.train_subset} images, {FLAGS.epochs} epochs) + "
        f"{FLAGS.qat_epochs} QAT epoch(s) -> 3/6 int8 .tflite ==")
    cfg = train.TrainConfig(
        model=FLAGS.model, dataset=FLAGS.dataset, resolution=FLAGS.resolution,
        recipe=train.Recipe(epochs=FLAGS.epochs, qat_epochs=FLAGS.qat_epochs, batch_size=FLAGS.batch_size,
                            lr=FLAGS.lr, augment=FLAGS.augment),
        val_split=FLAGS.val_split, train_subset=FLAGS.train_subset, qat_steps_per_epoch=FLAGS.qat_steps or None,
        test_subset=FLAGS.test_subset, int8_eval_samples=FLAGS.int8_eval_samples, seed=FLAGS.train_seed,
        resume=FLAGS.resume)
    tr = train.train(cfg, out, log=log)
    log(train.format_summary(tr).rstrip())
    model_path = tr["files"]["tflite"]
    with open(model_path, "rb") as f:
        model = f.read()

    # ------------------------------------------------------------------ 4. rewrite under a budget
    arena = tr["memory"]["tflm_arena_bytes"]
    budget = int(FLAGS.sram_kb * KB) if FLAGS.sram_kb else int(arena * FLAGS.budget_fraction) // 16 * 16
    log(f"\n== 4/6 rewrite --patches=auto under {budget / KB:.1f} kB (per-layer TFLM arena {arena / KB:.1f} kB "
        f"does not fit) ==")
    if arena <= budget:
        raise _cli.UsageError(f"the per-layer model already fits {budget / KB:.1f} kB (TFLM arena "
                              f"{arena / KB:.1f} kB): choose a smaller --sram_kb or --budget_fraction")
    graph = from_tflite(model, name=spec.name)

    tty = sys.stderr.isatty()

    def progress(n: int, total: int, what: str) -> None:
        if tty:
            print(f"\r  [{n}/{total}] {what:<60}", end="", file=sys.stderr, flush=True)

    auto = rewrite.auto_rewrite(model, graph, budget, where=model_path, progress=progress)
    if tty:
        print("", file=sys.stderr)
    log(auto.message)
    if auto.chosen is None:
        raise _cli.UsageError(f"no patch schedule fits {budget / KB:.1f} kB: {auto.message}")
    ev = auto.chosen
    patched = ev.result.model
    m_patched = tflm.measure_arena(patched, where="patched model")
    if m_patched.total > budget:
        raise _cli.UsageError(f"the patched model's measured TFLM arena ({m_patched.total} B) exceeds the budget "
                              f"({budget} B)")
    sched = ev.candidate.schedule
    chosen_text = scheduler.describe_choice(ev.candidate)
    log(f"chosen: {chosen_text} ({ev.border} borders); TFLM arena {arena:,} -> {m_patched.total:,} B "
        f"({arena / m_patched.total:.2f}x smaller), MACs +{sched.macs_patched_exact / sched.macs - 1:.1%} exact")
    patched_path = path("model_int8_patched.tflite")
    prof_patched = report.profile_report(graph, sched, sram_bytes=budget)
    md_kept = rewrite.read_schedule(patched) is not None and rewrite.split_appended_zip(patched)[1] != []
    rewrite_report = {"input": model_path, "output": patched_path, "budget_bytes": budget, "message": auto.message,
                      "schedule": ev.result.schedule, "border": ev.border,
                      "evaluated": [e.to_dict() for e in auto.evaluated],
                      "tflm": {"original": arena, "rewritten": m_patched.total},
                      "predicted": {"original": auto.original.predicted.total, "rewritten": ev.predicted.total},
                      "ops": {"original": ev.result.ops_before, "rewritten": ev.result.ops_after},
                      "metadata_kept": md_kept}
    report.write_outputs({patched_path: patched, path("rewrite.json"): rewrite_report,
                          path("profile.json"): prof_patched,
                          path("memory.png"): report.plot_memory(prof_patched, budget)})

    # ------------------------------------------------------------------ 5. verify
    log(f"\n== 5/6 verify: {FLAGS.verify_random} random + {FLAGS.verify_real} real test images, TF Lite and TFLM ==")
    import numpy as np

    inputs_path = None
    if FLAGS.verify_real:
        ds = data.load(FLAGS.dataset)
        x_real, _ = data.as_arrays(ds.test, spec.resolution, spec.in_channels, limit=FLAGS.verify_real)
        inputs_path = path("verify_inputs.npy")
        np.save(inputs_path, train.quantize_inputs(model, x_real))
    ver = verify.run_verify({"original": model_path, "rewritten": patched_path}, FLAGS.verify_random, FLAGS.train_seed,
                            inputs_path, "reference", 5)
    report.write_outputs({path("verify.json"): ver})
    log(verify.format_summary(ver).rstrip())

    # ------------------------------------------------------------------ 6. summary
    acc = tr["accuracy"]
    summary = {
        "model": spec.name, "resolution": spec.resolution, "dataset": tr["dataset"]["name"],
        "train_samples": tr["dataset"]["train"], "epochs": FLAGS.epochs, "qat_epochs": FLAGS.qat_epochs,
        "qat_steps": tr["qat_steps_per_epoch"],
        "schedule": chosen_text, "budget_bytes": budget,
        "accuracy": {**{k: acc[k] for k in ("float", "qat", "int8_tflite", "int8_tflm", "keras_test_samples",
                                            "int8_test_samples", "float_on_int8_samples")},
                     "tflite_equals_tflm": tr["tflite_vs_tflm"]["agree"]},
        "per_layer": {"analytic_peak_bytes": prof_patched["peak_sram_per_layer_bytes"],
                      "tflm_arena_bytes": ver["tflm"]["original"]["arena_total_bytes"],
                      "predicted_arena_bytes": ver["predicted"]["original"]["arena_total_bytes"],
                      "flash_bytes": len(model), "macs": sched.macs, "ops": ver["ops"]["original"]},
        "patched": {"analytic_peak_bytes": sched.peak_sram_bytes,
                    "tflm_arena_bytes": ver["tflm"]["rewritten"]["arena_total_bytes"],
                    "predicted_arena_bytes": ver["predicted"]["rewritten"]["arena_total_bytes"],
                    "flash_bytes": len(patched), "macs_exact": sched.macs_patched_exact,
                    "macs_padded": sched.macs_patched_padded,
                    "mac_overhead_exact": sched.macs_patched_exact / sched.macs - 1,
                    "mac_overhead_padded": sched.macs_patched_padded / sched.macs - 1,
                    "ops": ver["ops"]["rewritten"]},
        "verify": {"bit_exact": ver["bit_exact"], "samples": ver["samples"], "real": ver["input_samples"]},
        "metadata_kept": md_kept,
        "wall_s": time.time() - t0,
    }
    table = summary_table(summary)
    report.write_outputs({path("summary.md"): table, path("summary.json"): summary})
    log(f"\n== 6/6 summary ==\n{table}")
    log("wrote: " + ", ".join(sorted(os.path.relpath(p) for p in (
        model_path, patched_path, path("train_report.json"), path("training_curves.png"), path("confusion_matrix.png"),
        path("memory.png"), path("profile.json"), path("rewrite.json"), path("verify.json"), path("summary.md")))))
    ok = ver["bit_exact"] and tr["tflite_vs_tflm"]["agree"]
    return 0 if ok else 1


if __name__ == "__main__":
    _cli.run(main)
