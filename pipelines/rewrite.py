"""Rewrite any int8 .tflite so its patch stage runs patch by patch in stock TFLM / TFLite, bit-exact.

    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=auto --sram_kb=256
    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=4 --patch_blocks=5
    python -m pipelines.rewrite --tflite=model.tflite --out=patched.tflite --patches=3x2 --patch_ops=9

Auto mode tries schedules in order of MACs and keeps the first whose rewritten model's predicted TFLM arena
(planned activations + the persistent data each extra op instance costs) fits --sram_kb and is smaller than the
original's; then it measures both models in the real TFLM interpreter and falls back to the unpatched model if the
rewritten one is not smaller (saying so).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from pipelines import _cli
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("tflite", None, "Input int8 .tflite model (any producer).")
flags.DEFINE_string("out", None, "Output .tflite path.")
flags.DEFINE_string("patches", "auto", "P (PxP grid), PxQ, or 'auto' (needs --sram_kb).")
flags.DEFINE_integer("patch_blocks", None, "Patch stage = the first N blocks.", lower_bound=1)
flags.DEFINE_integer("patch_ops", None, "Patch stage = the first K operators.", lower_bound=1)
flags.DEFINE_float("sram_kb", None, "Auto mode: TFLM arena budget in kB (1 kB = 1024 B).", lower_bound=0)
flags.DEFINE_float("max_mac_overhead", None, "Auto mode: largest allowed MAC overhead (0.2 = +20%).",
                   lower_bound=0)
flags.DEFINE_list("patch_options", ["1", "2", "3", "4"], "Auto mode: patch counts p to try.")
flags.DEFINE_enum("objective", "macs", ["macs", "arena"],
                  "Auto mode: 'macs' = least MACs whose predicted arena fits --sram_kb; 'arena' = smallest "
                  "predicted TFLM arena (--sram_kb optional, checked if given).")
flags.DEFINE_enum("stage_unit", "blocks", ["blocks", "ops"], "Auto mode: enumerate stages by blocks or ops.")
flags.DEFINE_enum("mode", "builtin", ["builtin", "custom"],
                  "builtin: unroll into TFLite builtin ops; custom: one TFMCU_PATCH_STAGE op (later issue).")
flags.DEFINE_enum("border", "auto", ["auto", "strips", "pad"],
                  "Border padding of patches: PAD the patch buffer, or VALID + padded border strips for strided "
                  "ops whose input is the patch's largest buffer ('strips'); auto mode tries both.")
flags.DEFINE_bool("inplace", False,
                  "Custom mode: plan the rest of the graph in place (an op's output may overlap an input that dies "
                  "there, TinyEngine-style) where TFLM's reference kernels read before they overwrite. Valid for "
                  "TFLM's reference kernels (the tflite-micro wheel, TFLM's default build), not for optimized "
                  "kernels such as CMSIS-NN; verify checks it bit-exact in TFLM.")
flags.DEFINE_bool("measure", True, "Measure both models' arenas in the TFLM interpreter (auto mode needs it to "
                                   "guarantee the rewritten arena is not larger).")
flags.DEFINE_string("json_out", None, "Write a JSON report here.")
flags.mark_flag_as_required("tflite")
flags.mark_flag_as_required("out")


def _progress(n: int, total: int, what: str) -> None:
    if sys.stderr.isatty():
        print(f"\r  [{n}/{total}] {what:<60}", end="", file=sys.stderr, flush=True)
    elif n == 1 or n % 10 == 0:
        print(f"  [{n}/{total}] {what}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> None:
    from tfmcu import lower_tflite, rewrite, scheduler
    from tfmcu import tflite_schema as ts
    from tfmcu.report import write_outputs

    path = FLAGS.tflite
    if not os.path.isfile(path):
        raise _cli.UsageError(f"{path}: no such file")
    with open(path, "rb") as f:
        data = f.read()
    try:
        graph = lower_tflite.from_tflite(data, name=os.path.splitext(os.path.basename(path))[0])
    except ts.SchemaError as e:
        raise _cli.UsageError(f"{path}: {e}" if path not in str(e) else str(e)) from None
    if FLAGS.mode == "custom":
        return _custom_mode(data, graph, path)
    if FLAGS.inplace:
        raise _cli.UsageError("--inplace is supported with --mode=custom only")
    if FLAGS.patch_blocks is not None and FLAGS.patch_ops is not None:
        raise _cli.UsageError("give --patch_blocks or --patch_ops, not both")
    auto_mode = FLAGS.patches.lower() == "auto"
    if auto_mode and FLAGS.sram_kb is None and FLAGS.objective == "macs":
        raise _cli.UsageError("--patches=auto needs --sram_kb (or --objective=arena)")
    if not auto_mode and FLAGS.patch_blocks is None and FLAGS.patch_ops is None:
        raise _cli.UsageError("--patches needs --patch_blocks or --patch_ops (or use --patches=auto)")
    if os.path.abspath(FLAGS.out) == os.path.abspath(FLAGS.tflite):
        raise _cli.UsageError("--out must differ from --tflite")
    try:
        options = tuple(int(p) for p in FLAGS.patch_options)
    except ValueError:
        raise _cli.UsageError(f"--patch_options={','.join(FLAGS.patch_options)}: expected integers") from None
    graph_where = path

    report: dict = {"input": path, "output": FLAGS.out, "mode": FLAGS.mode}
    if auto_mode:
        sram = int(FLAGS.sram_kb * 1024) if FLAGS.sram_kb is not None else None
        borders = ("strips", "pad") if FLAGS.border == "auto" else (FLAGS.border,)
        if FLAGS.objective == "macs":
            print(f"auto: least-MACs schedule for {path} under {FLAGS.sram_kb:.0f} kB ...", file=sys.stderr)
            res = rewrite.auto_rewrite(data, graph, sram, options, FLAGS.max_mac_overhead, FLAGS.stage_unit,
                                       graph_where, progress=_progress, borders=borders)
        else:
            print(f"auto: smallest-arena schedule for {path} ...", file=sys.stderr)
            res = rewrite.smallest_arena(data, graph, options, FLAGS.max_mac_overhead, FLAGS.stage_unit,
                                         graph_where, progress=_progress, borders=borders)
        if sys.stderr.isatty():
            print("", file=sys.stderr)
        report["auto"] = {"message": res.message, "evaluated": [e.to_dict() for e in res.evaluated]}
        report["predicted"] = {"original": _pred(res.original.predicted)}
        best = res.chosen or res.original
        if sram is not None and best.predicted.total > sram:
            msg = res.message if FLAGS.objective == "macs" else (
                f"no schedule fits {FLAGS.sram_kb:.1f} kB; smallest achievable predicted TFLM arena is "
                f"{best.predicted.total / 1024:.1f} kB")
            raise _cli.UsageError(f"{path}: {msg}")
        chosen = res.chosen
    else:
        grid = _cli.parse_patches(FLAGS.patches)
        schedule = scheduler.plan(graph, grid, n_blocks=FLAGS.patch_blocks, n_ops=FLAGS.patch_ops)
        cand = scheduler.Candidate(grid, FLAGS.patch_blocks, FLAGS.patch_ops, schedule.peak_sram_bytes,
                                   schedule.peak_sram_bytes_excluding_input, schedule.macs_patched_exact,
                                   schedule.macs_patched_exact / schedule.macs - 1, schedule)
        original = rewrite.evaluate(data, graph, scheduler.Candidate((1, 1), None, None, 0, 0, schedule.macs, 0.0),
                                    graph_where)
        chosen = rewrite.evaluate(data, graph, cand, graph_where,
                                  border="strips" if FLAGS.border == "auto" else FLAGS.border)
        report["predicted"] = {"original": _pred(original.predicted)}
        res = None

    out_bytes = data if chosen is None else chosen.result.model
    message = res.message if res is not None else "rewritten as requested"
    if chosen is not None:
        report["predicted"]["rewritten"] = _pred(chosen.predicted)
        report["schedule"] = chosen.result.schedule
        report["ops"] = {"original": chosen.result.ops_before, "rewritten": chosen.result.ops_after}
    if FLAGS.measure:
        from tfmcu.tflm import measure_arena

        m_orig = measure_arena(data, where=path)
        report["tflm"] = {"original": _arena(m_orig)}
        if chosen is not None:
            m_rw = measure_arena(out_bytes, where=FLAGS.out)
            report["tflm"]["rewritten"] = _arena(m_rw)
            if auto_mode and m_rw.total >= m_orig.total:
                message = (f"the rewritten model's measured TFLM arena ({m_rw.total} B) is not smaller than the "
                           f"original's ({m_orig.total} B): falling back to no patching (output = input model)")
                out_bytes, chosen = data, None
    report["message"] = message
    report["patched"] = chosen is not None
    report["flash_bytes"] = {"original": len(data), "output": len(out_bytes)}
    write_outputs({FLAGS.out: out_bytes, FLAGS.json_out: report})
    _summary(report)


def _custom_mode(data: bytes, graph, path: str) -> None:
    """--mode=custom: the stage becomes one TFMCU_PATCH_STAGE op run by tfmcu's C kernels."""
    from tfmcu import custom_stage, scheduler
    from tfmcu.report import write_outputs

    if FLAGS.patches.lower() == "auto":
        sram = int(FLAGS.sram_kb * 1024) if FLAGS.sram_kb is not None else None
        options = tuple(int(p) for p in FLAGS.patch_options)
        res, _, message = custom_stage.auto_custom(data, graph, sram, options, FLAGS.max_mac_overhead,
                                                   FLAGS.stage_unit, path, progress=_progress,
                                                   inplace=FLAGS.inplace)
        if res is None:
            raise _cli.UsageError(f"{path}: {message}")
    else:
        schedule = scheduler.plan(graph, _cli.parse_patches(FLAGS.patches), n_blocks=FLAGS.patch_blocks,
                                  n_ops=FLAGS.patch_ops)
        res = custom_stage.rewrite_custom(data, graph, schedule, path, inplace=FLAGS.inplace)
        message = "rewritten as requested"
    mem = custom_stage.memory_report(res.model, FLAGS.out, measure=FLAGS.measure)
    report = {"input": path, "output": FLAGS.out, "mode": "custom", "message": message, "patched": True,
              "schedule": res.schedule, "ops": {"original": res.ops_before, "rewritten": res.ops_after},
              "custom_mode": mem, "flash_bytes": {"original": len(data), "output": len(res.model)}}
    if FLAGS.measure:
        from tfmcu.tflm import measure_arena
        report["tflm"] = {"original": _arena(measure_arena(data, where=path))}
    write_outputs({FLAGS.out: res.model, FLAGS.json_out: report})
    print(message)
    s = res.schedule
    print(f"schedule: {s['grid'][0]}x{s['grid'][1]} patches, stage of {len(s['stage_ops_tflite'])} ops -> one "
          f"{custom_stage.CUSTOM_CODE} op; scratch {mem['scratch_bytes']:,} B; rest of the graph planned "
          f"{'in place' if FLAGS.inplace else 'without overlaps'}")
    sa = mem["single_arena"]
    orig = report.get("tflm", {}).get("original", {}).get("arena_total_bytes")
    vs = f" (original TFLM arena {orig:,} B: {orig / sa['total_bytes']:.2f}x smaller)" if orig else ""
    print(f"single-arena peak: {sa['total_bytes']:,} B with the input, {sa['total_bytes_excluding_input']:,} B "
          f"without{vs}")
    print(f"Flash: {len(data):,} -> {len(res.model):,} B; wrote {FLAGS.out}")


def _pred(p) -> dict:
    return {"arena_total_bytes": p.total, "arena_head_bytes": p.head, "arena_tail_bytes": p.tail}


def _arena(a) -> dict:
    return {"arena_total_bytes": a.total, "arena_head_bytes": a.head, "arena_tail_bytes": a.tail}


def _summary(r: dict) -> None:
    print(r["message"])
    if r.get("schedule"):
        s = r["schedule"]
        g = s["grid"]
        stage = f"{s['patch_blocks']} blocks" if s["patch_blocks"] is not None else f"{s['patch_ops']} ops"
        print(f"schedule: {g[0]}x{g[1]} patches over the first {stage}; ops {r['ops']['original']} -> "
              f"{r['ops']['rewritten']}; MACs +{s['mac_overhead_exact'] * 100:.1f}% (exact), "
              f"+{s['mac_overhead_padded'] * 100:.1f}% (padded)")
    rows = [("predicted", r.get("predicted", {})), ("TFLM measured", r.get("tflm", {}))]
    for label, d in rows:
        if not d:
            continue
        o = d.get("original", {}).get("arena_total_bytes")
        w = d.get("rewritten", {}).get("arena_total_bytes")
        line = f"{label:>14}: original {o:,} B" if o is not None else f"{label:>14}:"
        if w is not None:
            line += f", rewritten {w:,} B ({o / w:.2f}x smaller)"
        print(line)
    print(f"{'Flash':>14}: {r['flash_bytes']['original']:,} -> {r['flash_bytes']['output']:,} B; wrote {r['output']}")


if __name__ == "__main__":
    _cli.run(main)
