"""Bench section ``search`` (``python -m pipelines.bench --sections=search``): MCUNetV2's headline claim on the scenes
task -- under the same SRAM budget, the jointly searched (architecture + patch schedule) network is more accurate
than the best one a per-layer-only search finds.

1. One weight-sharing supernet (``tfmcu.nas.train_supernet``) over ``SPACE`` on ``DATASET`` (the resolution
   section's scenes: 10-24 px objects on cluttered 128 px canvases), shared by every search below.
2. Per budget (``BUDGETS_KB``: the predicted TFLM arena of the int8 model, custom mode, image counted): the joint
   search (patches 1-4 per side) and the same search restricted to p = 1 (``tfmcu.flows.search``), two constraint
   worker processes.
3. Each winner fine-tuned from its supernet weights (``tfmcu.train``, ``FINETUNE``), exported to int8; a patched
   winner rewritten to custom mode with its schedule (one TFMCU_PATCH_STAGE op) and run WHOLE on the test split in
   TFLM built from source with our kernel (``tfmcu.runtime.tflm_host``): its test accuracy, its outputs against the
   unpatched int8 model's in the TFLM wheel (must be equal), its MEASURED arena; an unpatched winner measured in the
   TFLM wheel. MACs include the patch overhead; Flash is the deployed .tflite's size.

Every figure is measured by this code; the outputs are ``out/bench/search.{json,md}``, ``search_pareto.png`` and
the search folders under ``out/bench/search/``. Resumable: the supernet, the searches and the fine-tuning continue
from their checkpoints / states. About 1 h on 2 CPU cores.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from tfmcu.data.catalog import load
from tfmcu.data.classify import as_arrays
from tfmcu.data.split import Dataset
from tfmcu.files import figure_png, read_bytes, write_outputs
from tfmcu.flows import search as search_flow
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nas.evolution import EvolutionOptions
from tfmcu.nas.train_supernet import SupernetRecipe
from tfmcu.nets.spec import NetSpec, SearchSpace
from tfmcu.plan import regions
from tfmcu.runtime.tflm import measure_arena, run_tflm
from tfmcu.runtime.tflm_host import MEASURED_BY, run_whole
from tfmcu.stage.custom import rewrite_custom
from tfmcu.train.config import Recipe, TrainConfig
from tfmcu.train.export import quantize_inputs
from tfmcu.train.trainer import train

KB = 1024
DATASET = "scenes:canvas=128,object_px=10-24,distractors=2-5,train=2000,val=500,test=1000,seed=0"
BASE = "mcunet-demo"
SPACE = SearchSpace(kernels=(3, 5, 7), expands=(3, 4), depths=(1, 2, 3), widths=(0.5, 0.75),
                    resolutions=(48, 64, 80, 96))
BUDGETS_KB = (128, 256)
SUPERNET = SupernetRecipe(largest_epochs=2, epochs=4, batch_size=64, lr=0.05, random_subnets=1,
                          calibration_batches=8, calibration_batch_size=64, eval_samples=300)
EVOLUTION = EvolutionOptions(population=8, parents=3, mutations=4, crossovers=4, iterations=2, prefetch=2)
FINETUNE = Recipe(epochs=4, qat_epochs=0, batch_size=64, lr=0.01, warmup_epochs=0.0)
WORKERS = 2


def _deployed(best: dict[str, Any], int8: bytes, name: str) -> tuple[bytes, Any]:
    """The model as deployed: the int8 export, or its custom-mode rewrite when the winner is patched."""
    if list(best["grid"]) == [1, 1]:
        return int8, None
    graph = from_tflite(int8, name=name)
    schedule = regions.schedule(graph, tuple(best["grid"]), n_blocks=best["patch_blocks"])
    return rewrite_custom(int8, graph, schedule, name).model, schedule


def _measure(best: dict[str, Any], folder: str, ds: Dataset, spec: NetSpec,
             log: Callable[[str], None]) -> dict[str, Any]:
    """Test accuracy, arena, MACs, Flash of the deployed winner (see the module docstring)."""
    int8 = read_bytes(os.path.join(folder, "model_int8.tflite"))
    model, schedule = _deployed(best, int8, spec.name)
    x, y = as_arrays(ds.test, spec.resolution, spec.in_channels)
    xq = quantize_inputs(int8, x)
    samples = [xq[i:i + 1] for i in range(len(xq))]
    reference = np.concatenate([o[0].reshape(1, -1) for o in run_tflm(int8, samples)])  # TFLM wheel, unpatched
    if schedule is None:
        outputs, arena, measured_by = reference, measure_arena(int8).total, "TFLM (tflite-micro wheel)"
    else:
        log(f"[search bench] running the patched model on {len(samples)} test scenes in TFLM (host build)")
        run = run_whole(model, samples, spec.name)
        outputs = np.concatenate([o[0].reshape(1, -1) for o in run.outputs])
        arena, measured_by = run.arena.arena_used_bytes, MEASURED_BY
    return {"test_accuracy": float(np.mean(outputs.argmax(1) == y)), "test_samples": int(len(y)),
            "equals_unpatched_tflm": bool(np.array_equal(outputs, reference)), "measured_arena_bytes": int(arena),
            "arena_measured_by": measured_by, "flash_bytes": len(model), "macs": int(best["macs"]),
            "mac_overhead": float(best.get("mac_overhead", 0.0))}


def search_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    root = os.path.join(o.out_dir, "search")
    ds = load(DATASET, seed=0)
    rows, reports = [], {}
    for budget in BUDGETS_KB:
        t0 = time.time()
        out = os.path.join(root, f"sram_{budget}kb")
        opts = search_flow.SearchRunOptions(
            model=BASE, dataset=DATASET, space=SPACE, sram_kb=budget, flash_kb=1024.0, supernet=SUPERNET,
            evolution=EVOLUTION, seed=0, out_dir=out, workers=WORKERS, supernet_dir=os.path.join(root, "supernet"),
            cache_dir=os.path.join(root, "constraints"))
        log(f"[search bench] budget {budget} kB: joint and per-layer-only searches in {out}")
        report = reports[budget] = search_flow.run(
            opts, log=log, progress=lambda n, total, what: log(f"[search bench] {budget} kB {n}/{total} {what}"))
        search_s = round(time.time() - t0)
        for name, suffix in (("joint", ""), ("per_layer", "_per_layer")):
            t1 = time.time()
            best = report["searches"][name]["best"]
            spec_path = os.path.join(out, f"best{suffix}.json")
            folder = os.path.join(out, f"finetune_{name}")
            cfg = TrainConfig(model=spec_path, dataset=DATASET, init_weights=os.path.join(out, f"best{suffix}"
                                                                                          ".weights.h5"),
                              recipe=FINETUNE, resume=True)
            log(f"[search bench] {budget} kB {name}: fine-tuning the winner ({best['resolution']} px, grid "
                f"{best['grid'][0]}x{best['grid'][1]}) for {FINETUNE.epochs} epochs in {folder}")
            r = train(cfg, folder, log=log).classification
            spec = NetSpec.from_json(read_bytes(spec_path).decode())
            m = _measure(best, folder, ds, spec, log)
            rows.append({"budget_kb": budget, "search": name, "resolution": best["resolution"],
                         "grid": best["grid"], "patch_blocks": best.get("patch_blocks"),
                         "supernet_accuracy": best["accuracy"], "float_test_accuracy": r.accuracy.float,
                         "int8_tflm_accuracy_unpatched": r.accuracy.int8_tflm,
                         "predicted_arena_bytes": best["arena_bytes"], **m,
                         "fits": m["measured_arena_bytes"] <= budget * KB,
                         "search_wall_s": search_s, "finetune_wall_s": round(time.time() - t1)})
    write_outputs({os.path.join(o.out_dir, "search_pareto.png"): _pareto(reports)})
    return {"rows": rows, "plot": "search_pareto.png"}


def table(result: dict[str, Any]) -> str:
    """Section *search*'s table, from its JSON."""
    rows = result["rows"]
    md = [f"Joint architecture + patch-schedule search vs the same search restricted to per-layer execution (p = 1), "
          f"base `{BASE}`, space kernels {SPACE.kernels} / expansions {SPACE.expands} / depths {SPACE.depths} / "
          f"widths {SPACE.widths} / resolutions {SPACE.resolutions}, on `{DATASET}`; supernet "
          f"{SUPERNET.largest_epochs} + {SUPERNET.epochs} epochs; evolution {EVOLUTION.population} / "
          f"{EVOLUTION.parents} / {EVOLUTION.mutations} + {EVOLUTION.crossovers} / {EVOLUTION.iterations} "
          f"iterations; winners fine-tuned {FINETUNE.epochs} epochs, int8. Test accuracy of the deployed int8 model "
          f"({rows[0]['test_samples'] if rows else 0} test scenes), arena measured in TFLM (patched: host build "
          f"with our kernel; unpatched: the tflite-micro wheel), image counted:", "",
          "| budget | search | input | schedule | supernet held-out | test acc. (int8, TFLM) | measured arena | "
          "predicted | MACs | Flash | = unpatched |",
          "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        sched = ("per layer" if list(r["grid"]) == [1, 1] else
                 f"{r['grid'][0]}x{r['grid'][1]} over {r['patch_blocks']} blocks")
        md.append(f"| {r['budget_kb']} kB | {r['search'].replace('_', '-')} | {r['resolution']} | {sched} | "
                  f"{r['supernet_accuracy']:.1%} | {r['test_accuracy']:.1%} | "
                  f"{r['measured_arena_bytes'] / KB:.1f} kB{'' if r['fits'] else ' (over)'} | "
                  f"{r['predicted_arena_bytes'] / KB:.1f} kB | {r['macs'] / 1e6:.1f}M "
                  f"({r['mac_overhead']:+.1%}) | {r['flash_bytes'] / KB:.1f} kB | "
                  f"{'yes' if r['equals_unpatched_tflm'] else 'NO'} |")
    return "\n".join(md) + "\n"


def _pareto(reports: dict[int, dict[str, Any]]) -> bytes:
    """Held-out accuracy (supernet) against predicted arena of every feasible candidate, one panel per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(reports), figsize=(6.0 * len(reports), 4.2), squeeze=False)
    for ax, (budget, report) in zip(axes[0], reports.items()):
        search_flow.pareto_axes(ax, report, budget)
        ax.set_title(f"SRAM {budget} kB (image counted): joint vs per-layer-only search", fontsize=10)
    return figure_png(fig)
