"""The bench section *fit*: models on their targets through the user's path, ``deploy --run`` per layer against
``fit --run`` at several latency caps, all with CMSIS-NN, all measured under QEMU.

Per (model, target): TFLM + CMSIS-NN per layer (``tfmcu.flows.deploy``), then ``tfmcu.flows.fit`` with
``objective=memory`` at ``max_latency`` 1.00 / 1.05 / 1.25 and the smallest (no latency cap). Each row: the
measured TFLM arena (``arena_used_bytes`` on the target) and instructions per Invoke (QEMU instruction counts, the
fewest over the test inputs), MACs, the model's Flash, outputs = TF Lite, and the predictions (``tfmcu.plan.arena``,
``tfmcu.plan.latency``) with their errors. ``fit`` searches with its defaults (its grids, any number of stages, its
configurations) and no time budget, so a row does not depend on the machine's speed; the two MobileNetV2s stream
their image. Each row is kept in ``fit/rows.json`` as it is measured (a row that says why a fit failed too: delete the
file to measure again): a run that stops resumes after the last row; a run with another search (``search_record``) keeps
only the per-layer rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from tfmcu import abi
from tfmcu.errors import UsageError
from tfmcu.files import write_outputs
from tfmcu.firmware.targets import TARGETS, get_target
from tfmcu.flows.deploy import DeployOptions, DeployReport, deploy
from tfmcu.flows.fit import FitOptions, run as fit_run
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.graph.load import load_spec
from tfmcu.nets import zoo
from tfmcu.plan.latency import load_calibration, predict_instructions
from tfmcu.plan.profiler import profile
from tfmcu.plan.stage_plans import LATENCY_LADDER, MAX_PLANS_PER_FRONT, MAX_PLANS_UNDER_CAP
from tfmcu.train.export import untrained_int8

# (zoo model or preset, target, input streamed); the demo model is trained by make demo, so the bench uses its
# architecture untrained. The two MobileNetV2s stream their image (counted, 144x144x3 alone is 62,208 B).
CASES = (("keras_mobilenet_v2", "stm32f405", False),
         ("mcunet-demo", "stm32f405", False),
         ("mbv2_035_144", "cortex-m4", True),
         ("mbv2_100_224", "cortex-m7", True))
CAPS = (1.00, 1.05, 1.25, None)  # None: the smallest arena, whatever its instructions
# Section *cores*: every core QEMU runs, on its own board (the core's generic target), the zoo's two small
# MobileNetV2s per layer against fit at one cap
CORE_TARGETS = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")
CORE_CASES = tuple((m, t, s) for t in CORE_TARGETS for m, s in (("mbv2_035_96", False), ("mbv2_035_144", True)))
CORE_CAPS = (1.05,)
PER_LAYER = "TFLM + CMSIS-NN per layer"  # the per-layer row's "what" (it does not depend on fit's search)


def selection(models: tuple[str, ...] = (), caps: tuple[str, ...] = ()) -> dict[str, Any]:
    """``fit_section``'s cases and caps for ``pipelines.bench --fit_models --fit_caps`` (empty: all)."""
    known = [c[0] for c in CASES]
    unknown = [m for m in models if m not in known]
    if unknown:
        raise UsageError(f"--fit_models: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        chosen_caps = tuple(None if c == "none" else float(c) for c in caps) if caps else CAPS
    except ValueError:
        raise UsageError(f"--fit_caps={','.join(caps)}: expected factors such as 1.05, or none") from None
    return {"cases": tuple(c for c in CASES if not models or c[0] in models), "caps": chosen_caps}


def _model(name: str, cache: str) -> bytes:
    if name in zoo.ZOO:
        return zoo.build(name, cache)
    return untrained_int8(load_spec(name), 0, as_conv=False)


def search_record(cases=CASES) -> dict[str, Any]:
    """What fit searched (its defaults) and what the patch kernels run, as the JSON records it (the latency
    coefficients of the cores ``cases`` run on)."""
    d = FitOptions(model="")
    return {"grids": list(d.patch_options), "max_stages": d.max_stages, "halo_modes": list(d.halo_modes),
            "rest_convs": list(d.rest_convs), "search_seconds": None, "latency_ladder": list(LATENCY_LADDER),
            "plans_per_front": MAX_PLANS_PER_FRONT, "plans_under_cap": MAX_PLANS_UNDER_CAP,
            # what the patch kernels run (a fit row's instructions change with them), the latency predictor's
            # calibration (the plans a cap admits change with it) and where TFLM's persistent data goes
            "stage_abi": abi.ABI_VERSION, "conv1x1_folded_rule": abi.CONV1X1_FOLDED_RULE,
            "latency_coefficients": _coefficients_hash(cases),
            "persistent_apart": d.firmware.persistent_apart}


def _coefficients_hash(cases=CASES) -> str:
    """The latency coefficients of the cores ``cases`` run on (a fit row's plan at a cap changes with them)."""
    cores = {get_target(t).core for _, t, _ in cases}
    coef = {k: v for k, v in (load_calibration().get("coefficients") or {}).items() if k.split("/")[0] in cores}
    return hashlib.sha1(json.dumps(coef, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FitRow:
    """A fit row besides the caps' (``fit_section``'s ``extra``): its label, its cap (None: the smallest) and the
    ``FitOptions`` fields it sets apart from the bench's (e.g. ``(("se_passes", False),)``)."""
    what: str
    cap: float | None
    options: tuple[tuple[str, Any], ...] = ()


def fit_section(o: Any, log: Callable[[str], None] = print, cases=CASES, caps=CAPS,
                work_name: str = "fit", model: Callable[[str, str], bytes] | None = None,
                extra: Callable[[str], tuple[FitRow, ...]] = lambda name: (), record_cases=None) -> dict[str, Any]:
    """Per case its per-layer row and a fit row per cap (and per ``extra(name)``), each measured under QEMU (rows an
    earlier run of the same search measured on the same model bytes are kept in ``<out_dir>/<work_name>/rows.json``
    and not measured again). ``model(name, zoo_cache)``: a case's int8 .tflite (default: the zoo model or preset);
    ``record_cases``: the cases whose search the rows record (default ``cases``; a run of some of a section's cases
    records the section's, so a later run of all of them keeps its rows)."""
    rows: list[dict[str, Any]] = []
    work = os.path.join(o.out_dir, work_name)
    os.makedirs(work, exist_ok=True)
    kept_path = os.path.join(work, "rows.json")
    record = search_record(record_cases or cases)
    kept: dict[str, dict[str, Any]] = {}
    if os.path.isfile(kept_path):  # rows an earlier run measured: fit's with the same search, per layer any
        with open(kept_path) as f:
            earlier = json.load(f)
        same = earlier.get("search") == record
        kept = {k: r for k, r in earlier.get("rows", {}).items() if same or r.get("what") == PER_LAYER}

    def keep(row: dict[str, Any]) -> dict[str, Any]:
        kept[f"{row['model']}|{row['target']}|{row['what']}"] = row
        write_outputs({kept_path: json.dumps({"search": record, "rows": kept}, indent=1).encode()})
        return row

    def earlier_row(name: str, target: str, what: str, sha: str) -> dict[str, Any] | None:
        row = kept.get(f"{name}|{target}|{what}")
        if row is not None and row.get("model_sha1", sha) != sha:  # measured on other bytes of the model
            return None
        if row is not None:
            log(f"fit bench: {name} on {target}: {what}: measured by an earlier run ({kept_path})")
        return row

    def timed(measure: Callable[[], dict[str, Any]], sha: str) -> dict[str, Any]:
        t0 = time.time()
        row = measure()
        return {**row, "model_sha1": sha, "wall_seconds": round(time.time() - t0)}

    for name, target, stream in cases:
        path = os.path.join(work, f"{name}.tflite")
        data = (model or _model)(name, o.zoo_cache)
        sha = hashlib.sha1(data).hexdigest()[:12]
        write_outputs({path: data})
        macs = profile(from_tflite(data)).macs
        base = earlier_row(name, target, PER_LAYER, sha)
        if base is not None:  # measured then; the prediction is the predictor's now (it takes milliseconds)
            pred_i = predict_instructions(data, _core(target), "cmsis_nn").instructions
            base = {**base, "predicted_instructions": pred_i,
                    "instructions_error": (round(pred_i / base["instructions"] - 1, 4)
                                           if base.get("instructions") else None)}
            rows.append(keep(base))
        else:
            base = timed(lambda: _per_layer(name, target, path, data, macs, work, log), sha)
            rows.append(keep(base) if "error" not in base else base)
            if "error" in base:
                continue
        fits = [FitRow("fit, smallest" if cap is None else f"fit, max_latency {cap:.2f}", cap) for cap in caps]
        for f in fits + list(extra(name)):
            row = earlier_row(name, target, f.what, sha)
            if row is None:  # (an error row too: "nothing fits within 1.00x" is a result)
                row = keep(timed(lambda: _fitted(name, target, stream, f.cap, f.what, path, base, work, log,
                                                 **dict(f.options)), sha))
            rows.append(row)
    return {"rows": rows, "search": record}


def cores_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """``make bench`` section *cores*: ``CORE_CASES`` per layer and at ``CORE_CAPS``, on every core QEMU runs."""
    return fit_section(o, log, CORE_CASES, CORE_CAPS, work_name="cores")


# Section *boards*: the named boards of boards.json (the generic MPS boards are section *cores*'), each with the
# zoo's MobileNetV2-0.35-96 through what a user types: ``fit --target=BOARD --run`` with fit's defaults (objective
# latency: the fastest configuration that fits the board), every candidate priced (no time budget).
BOARD_MODEL = "mbv2_035_96"


def board_names() -> list[str]:
    return [n for n in TARGETS if n not in LIFTED]


def boards_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per named board its ``fit --run`` row (rows an earlier run of the same search measured are kept in
    ``<out_dir>/boards/rows.json``)."""
    work = os.path.join(o.out_dir, "boards")
    os.makedirs(work, exist_ok=True)
    kept_path = os.path.join(work, "rows.json")
    cases = tuple((BOARD_MODEL, b, False) for b in board_names())
    record = search_record(cases)
    kept: dict[str, dict[str, Any]] = {}
    if os.path.isfile(kept_path):
        with open(kept_path) as f:
            earlier = json.load(f)
        kept = earlier.get("rows", {}) if earlier.get("search") == record else {}
    path = os.path.join(work, f"{BOARD_MODEL}.tflite")
    data = _model(BOARD_MODEL, o.zoo_cache)
    write_outputs({path: data})
    macs = profile(from_tflite(data)).macs
    rows = []
    for board in board_names():
        row = kept.get(board)
        if row is not None:
            log(f"boards bench: {board}: measured by an earlier run ({kept_path})")
        else:
            row = _board_row(board, path, macs, work, log)
            kept[board] = row
            write_outputs({kept_path: json.dumps({"search": record, "rows": kept}, indent=1).encode()})
        rows.append(row)
    return {"rows": rows, "search": record, "model": BOARD_MODEL}


def _board_row(board: str, path: str, macs: int, work: str, log: Callable[[str], None]) -> dict[str, Any]:
    """``fit --target=board --run`` with fit's defaults, as a row."""
    t = get_target(board)
    log(f"boards bench: {BOARD_MODEL} on {board} ({t.core}): fit --run ...")
    try:
        rep = fit_run(FitOptions(model=path, firmware=DeployOptions(tflite="", target=board, run=True),
                                 out_dir=os.path.join(work, board), verify_samples=4, search_seconds=None), log=log)
    except Exception as e:  # noqa: BLE001 -- a row that says why, the bench goes on
        return {"model": BOARD_MODEL, "target": board, "core": t.core, "error": row_error(e, path)}
    ch, dep = rep.chosen, rep.deploy
    row = measured_row(BOARD_MODEL, board, f"fit, objective {rep.objective}", ch.describe, ch.predicted_total_bytes,
                       ch.predicted_instructions, dep, macs, dep.model_bytes)
    run = dep.run
    row.update(core=t.core, machine=t.machine or None, qemu=t.qemu, firmware_region=dep.estimate.region,
               sram_bytes=dep.estimate.sram_bytes, persistent_region=dep.arena.persistent_region,
               persistent_bytes=dep.arena.persistent_bytes, linked=None if run is None else run.linked,
               sizes=None if run is None else run.sizes, console=t.console, fits=dep.fits,
               measured_by=None if run is None else run.measured_by, search_seconds=rep.search_seconds)
    return row


def boards_table(result: dict[str, Any]) -> str:
    """Section *boards*' table, from its JSON."""
    md = [f"The zoo's {result.get('model', BOARD_MODEL)} on every named board through `fit --target=BOARD --run` "
          "with fit's defaults (the fastest configuration that fits), every candidate priced. Measured under QEMU "
          "on the board's core (TFLM arena_used_bytes, QEMU instruction count of one Invoke), or, where no QEMU "
          "board has the core, built and linked with the board's memory; predicted by tfmcu.plan.arena (arena) and "
          "tfmcu.plan.latency (instructions, estimated).", "",
          "| board | core | run by | configuration | arena (B) | = predicted | firmware RAM in | TFLM persistent "
          "data | Flash, RAM linked (B) | instructions | predicted error | outputs = TF Lite |",
          "|---|---|---|---|---:|---|---|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        if "error" in r:
            error = r["error"].split(".tflite: ", 1)[-1]  # (without the bench's file name)
            md.append(f"| {r['target']} | {r['core']} | - | {error} | | | | | | | | |")
            continue
        ran = r["arena_used_bytes"] is not None
        by = ("linked only (no QEMU board has the core)" if not r.get("machine") else
              f"`{r['machine']}`" + (" (stand-in link)" if r.get("qemu") == "stand-in" else ""))
        equal = ("yes" if r["arena_equal"] else f"no ({_n(r['predicted_arena_bytes'])})") if ran else \
            f"- (predicted {_n(r['predicted_arena_bytes'])})"
        err = "-" if r["instructions_error"] is None else f"{100 * r['instructions_error']:+.1f}%"
        persistent = (f"{_n(r['persistent_bytes'])} B in {r['persistent_region']}" if r.get("persistent_region")
                      else "in the arena")
        sizes = r.get("sizes") or {}
        linked = f"{_n(sizes.get('flash'))}, {_n(sizes.get('ram'))}" if sizes else "-"
        md.append(f"| {r['target']} | {r['core']} | {by} | {r['schedule'] or 'per layer'} | "
                  f"{_n(r['arena_used_bytes'])} | {equal} | {r['firmware_region']} "
                  f"({_n(r['sram_bytes'])} B) | {persistent} | {linked} | {_n(r['instructions'])} | {err} | "
                  f"{('yes' if r['outputs_equal_tflite'] else 'NO') if ran else '-'} |")
    return "\n".join(md) + "\n"


def row_error(e: Exception, path: str) -> str:
    """A failed run's row: the error's first line, the model named by its file (not the machine's folders)."""
    return str(e).strip().splitlines()[0].replace(path, os.path.basename(path)) if str(e).strip() else type(e).__name__


def _per_layer(name: str, target: str, path: str, data: bytes, macs: int, work: str,
               log: Callable[[str], None]) -> dict[str, Any]:
    """The per-layer row: ``deploy --run`` with TFLM + CMSIS-NN."""
    log(f"fit bench: {name} on {target}: per layer (deploy --run, CMSIS-NN) ...")
    try:
        dep = deploy(DeployOptions(tflite=path, target=target,
                                   out_dir=os.path.join(work, f"{name}_{target}_per_layer"), run=True), log=log)
    except Exception as e:  # noqa: BLE001 -- a row that says why, the bench goes on
        return {"model": name, "target": target, "what": PER_LAYER, "error": row_error(e, path)}
    pred_i = predict_instructions(data, _core(target), "cmsis_nn").instructions
    base = measured_row(name, target, PER_LAYER, None, dep.arena.predicted_bytes, pred_i, dep,
                        macs, len(data))
    if not dep.fits:  # it does not link for the target: its instructions on the core's MPS2 board, more SRAM
        measured = _lifted_invoke(name, path, target, work, log)
        if measured is not None:
            base["instructions"] = measured
            base["instructions_error"] = round(pred_i / measured - 1, 4)
            base["instructions_from"] = lifted_note(target)
    return base


# the core's MPS2 / MPS3 board (4 MiB of SRAM in QEMU)
LIFTED = {c: c for c in ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")}


def lifted_deploy(name: str, path: str, target: str, work: str, log: Callable[[str], None],
                  profile: bool = False) -> DeployReport | None:
    """The per-layer firmware of a model that does not fit ``target``, run on its core's MPS2 board with the SRAM
    limit lifted to the board's 4 MiB (``profile``: per op): what the target would run (the same core, the same
    code). None where it does not run there either."""
    board = LIFTED.get(_core(target))
    if board is None:
        return None
    t = TARGETS[board]
    TARGETS[board] = dataclasses.replace(t, sram_bytes=4 * 1024 * 1024)
    try:
        dep = deploy(DeployOptions(tflite=path, target=board, run=True, profile=profile,
                                   out_dir=os.path.join(work, f"{name}_{target}_per_layer_lifted")), log=log)
    except Exception:  # noqa: BLE001 -- the row says it has no count
        return None
    finally:
        TARGETS[board] = t
    return dep if dep.fits and dep.run is not None else None


def lifted_note(target: str) -> str:
    """What a row measured by ``lifted_deploy`` says of its instructions."""
    core = _core(target)
    return (f"QEMU count of the same per-layer firmware on the {get_target(LIFTED[core]).machine} board of its core "
            f"({core}) with the SRAM limit lifted")


def _lifted_invoke(name: str, path: str, target: str, work: str, log: Callable[[str], None]) -> int | None:
    dep = lifted_deploy(name, path, target, work, log)
    return None if dep is None else dep.run.instructions


def _fitted(name: str, target: str, stream: bool, cap: float | None, what: str, path: str, base: dict[str, Any],
            work: str, log: Callable[[str], None], **options: Any) -> dict[str, Any]:
    """A fit row: ``fit --run`` at ``cap`` (None: the smallest), against the per-layer row ``base``; ``options``:
    ``FitOptions`` fields apart from the bench's."""
    log(f"fit bench: {name} on {target}: {what} ...")
    folder = f"{name}_{target}_{cap or 'smallest'}" + "".join(f"_{k}-{v}" for k, v in sorted(options.items()))
    try:
        rep = fit_run(FitOptions(model=path, firmware=DeployOptions(tflite="", target=target, run=True),
                                 out_dir=os.path.join(work, folder), objective="memory",
                                 max_latency=cap if cap is not None else 100.0, stream_input=stream, verify_samples=4,
                                 search_seconds=None, **options),
                     log=log)
    except Exception as e:  # noqa: BLE001 -- a row that says why, the bench goes on
        return {"model": name, "target": target, "what": what, "error": row_error(e, path)}
    ch = rep.chosen
    row = measured_row(name, target, what, ch.describe, ch.predicted_total_bytes, ch.predicted_instructions,
                       rep.deploy, ch.macs, rep.deploy.model_bytes)
    # TFLM's persistent data in its own buffer (the board's persistent_ram region): its predicted bytes
    row["persistent_apart_bytes"] = ch.predicted_persistent_bytes
    row["persistent_region"] = rep.deploy.arena.persistent_region
    # against the per-layer arena measured on the target, or predicted where it does not link there
    ref = base.get("arena_used_bytes") or base["predicted_arena_bytes"]
    row["arena_ratio"] = round(ref / row["arena_used_bytes"], 2) if row.get("arena_used_bytes") else None
    row["instructions_ratio"] = round(row["instructions"] / base["instructions"], 3) \
        if base.get("instructions") and row.get("instructions") else None
    row["verified_bit_exact"] = rep.verify is None or rep.verify.bit_exact
    row["fits"] = None if rep.measured is None else rep.measured.fits
    row["stream_input"] = stream
    row["search_seconds"] = rep.search_seconds  # on the bench's machine, every candidate priced
    row["candidates"] = len(rep.candidates)
    # squeeze-excites run inside stages: each such stage's passes (its description says "N passes"), and how many
    # of the candidates priced had such a stage
    row["stage_passes"] = [int(n) for n in re.findall(r"(\d+) passes", ch.describe)]
    row["candidates_with_passes"] = sum("passes" in c.describe for c in rep.candidates)
    if options:
        row["options"] = dict(options)
    return row


def _core(target: str) -> str:
    return get_target(target).core


def measured_row(name: str, target: str, what: str, schedule: str | None, pred_arena: int, pred_insns: int | None,
                 dep: DeployReport, macs: int, flash: int) -> dict[str, Any]:
    """A bench row: a model's firmware run (``dep``, ``deploy --run``) against the predictions."""
    run = dep.run
    measured_i = None if run is None else run.instructions
    arena = None if run is None else run.arena_used_bytes
    return {"model": name, "target": target, "what": what, "schedule": schedule,
            "arena_used_bytes": arena, "predicted_arena_bytes": pred_arena,
            "arena_equal": arena == pred_arena if arena is not None else None,
            "instructions": measured_i, "predicted_instructions": pred_insns,
            "instructions_error": round(pred_insns / measured_i - 1, 4) if measured_i and pred_insns else None,
            "macs": macs, "flash_model_bytes": flash,
            "outputs_equal_tflite": run is not None and run.outputs_equal_tflite, "verdict": dep.verdict,
            # the inputs the firmware ran, and those whose expected outputs are TFLM's on this host (proven rounding
            # ties: ``outputs_equal_tflite`` compares with those there)
            "inputs": dep.inputs, "tflm_reference_inputs": len(dep.reference.tflm_inputs) if dep.reference else 0}


def table(result: dict[str, Any]) -> str:
    """Section *fit*'s table, from its JSON."""
    rows = result["rows"]
    md = ["Measured on the target under QEMU (TFLM arena_used_bytes, QEMU instruction counts of one Invoke), "
          "TFLM's CMSIS-NN kernels and the patch executor's CMSIS-NN backend, the image counted unless the "
          "configuration streams it; predicted by "
          "tfmcu.plan.arena (arena) and tfmcu.plan.latency (instructions, estimated)." + searched(result), "",
          "| model | target | configuration | schedule | arena (B) | vs per layer | = predicted | instructions | "
          "vs per layer | predicted error | MACs | model Flash (B) | outputs = TF Lite | search |",
          "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['model']} | {r['target']} | {r['what']} | {r['error']} | | | | | | | | | | |")
            continue
        if r["arena_used_bytes"] is None:
            equal = f"- (predicted {_n(r['predicted_arena_bytes'])})"
        else:
            equal = "yes" if r["arena_equal"] else f"no ({_n(r['predicted_arena_bytes'])})"
        err = "-" if r["instructions_error"] is None else f"{100 * r['instructions_error']:+.1f}%"
        ratio = "-" if r.get("arena_ratio") is None else f"{r['arena_ratio']:.2f}x smaller"
        slower = "-" if r.get("instructions_ratio") is None else f"{r['instructions_ratio']:.3f}x"
        what = r["what"] + (" (does not fit; instructions: the same core, more SRAM)" if r.get("instructions_from")
                            else "")
        if r.get("persistent_apart_bytes"):
            what += f" (TFLM's persistent {_n(r['persistent_apart_bytes'])} B of the arena in {r['persistent_region']})"
        md.append(f"| {r['model']} | {r['target']} | {what} | {r['schedule'] or 'per layer'} | "
                  f"{_n(r['arena_used_bytes'])} | {ratio} | {equal} | {_n(r['instructions'])} | {slower} | {err} | "
                  f"{r['macs'] / 1e6:.1f}M | {_n(r['flash_model_bytes'])} | "
                  f"{'-' if r['arena_used_bytes'] is None else 'yes' if r['outputs_equal_tflite'] else 'NO'} | "
                  + ("-" if r.get("search_seconds") is None else f"{r['search_seconds']:.0f} s") + " |")
    return "\n".join(md) + "\n"


def searched(result: dict[str, Any]) -> str:
    """What fit searched, for the table's header (runs that recorded it)."""
    search = result.get("search")
    if search is None:
        return ""
    stages = "any number of" if search["max_stages"] is None else f"at most {search['max_stages']}"
    return (f" fit searched with its defaults: grids {'/'.join(map(str, search['grids']))}, {stages} stages, no time "
            f"budget (search: its time on the bench's machine, every candidate priced; fit's default budget is "
            f"{FitOptions(model='').search_seconds:g} s).")


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"
