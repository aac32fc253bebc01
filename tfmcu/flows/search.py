"""``search``: joint architecture + patch-schedule search (``pipelines.search``), MCUNetV2 section 3.3.

``run(options)``:

1. the data set (``tfmcu.data``; the scenes task by default, where resolution matters) and the base spec (a preset
   or spec JSON: stem, head, stage channels and strides), the search space (``tfmcu.nets.spec.SearchSpace``);
2. the supernet trained on it (``tfmcu.nas.train_supernet``; resumes from ``out_dir/supernet``);
3. the evolutionary search (``tfmcu.nas.evolution``) with the constraints evaluated without training
   (``tfmcu.nas.constraints``: predicted TFLM arena in custom mode with the least-MACs patch schedule that fits,
   Flash of the int8 export, MACs) and the supernet's held-out accuracy; then the same search restricted to p = 1
   (per-layer only) unless ``compare_per_layer`` is off; both resumable (``out_dir/search_<name>.json``);
4. outputs (all-or-nothing): ``best.json`` (the joint winner's spec), ``best.weights.h5`` (its weights out of the
   supernet, batch norm calibrated: ``pipelines/train.py --model=best.json --init_weights=best.weights.h5``
   fine-tunes it), ``best_schedule.json`` (grid, stage, predicted arena, Flash, MACs), the same three for the
   per-layer-only winner (``best_per_layer.json``, ``best_per_layer.weights.h5``, ``best_per_layer_schedule.json``),
   ``search_report.json`` and ``pareto.png`` (held-out accuracy against predicted SRAM of every feasible candidate of
   both searches).

Scale-out: the supernet trains under ``strategy`` (``tfmcu.train`` strategies: ``mirrored`` for local GPUs,
``multi_worker`` for several machines, cluster from ``TF_CONFIG``); the constraints of candidates are evaluated in
``workers`` processes (``tfmcu.nas.constraints.ConstraintPool``). ``supernet_dir`` and ``cache_dir`` (default: under
``out_dir``) let several searches (other budgets) share one trained supernet and the converted models.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.data.catalog import load
from tfmcu.data.split import Dataset
from tfmcu.errors import UsageError
from tfmcu.files import check_output_paths, figure_png, write_outputs
from tfmcu.graph.load import load_spec
from tfmcu.nas.constraints import ConstraintPool, Limits, ModelConstraints
from tfmcu.nas.evolution import EvolutionOptions, evolve
from tfmcu.nas.train_supernet import SubnetAccuracy, SupernetRecipe, train_supernet
from tfmcu.nets.spec import NetSpec, SearchSpace

KB = 1024


@dataclass
class SearchRunOptions:
    model: str = "mcunet-demo"  # the base: a preset or spec JSON
    dataset: str = "scenes"
    data_dir: str | None = None
    space: SearchSpace = field(default_factory=lambda: SearchSpace(resolutions=(64, 96, 128)))
    sram_kb: float = 256.0
    flash_kb: float | None = 1024.0
    max_mmacs: float | None = None
    count_input: bool = True
    patch_options: tuple[int, ...] = (1, 2, 3, 4)
    max_stages: int = 1  # > 1: each candidate network's schedule may be a stage plan (docs/multistage.md)
    compare_per_layer: bool = True
    supernet: SupernetRecipe = field(default_factory=SupernetRecipe)
    evolution: EvolutionOptions = field(default_factory=EvolutionOptions)
    seed: int = 0
    out_dir: str = "out/search"
    strategy: str = "default"  # supernet training: tfmcu.train strategies
    workers: int = 0  # processes evaluating constraints (0: this one)
    supernet_dir: str | None = None  # default: out_dir/supernet
    cache_dir: str | None = None  # converted models and constraint figures; default: out_dir/constraints


def parse_numbers(flag: str, values: list[str], kind: type) -> tuple:
    """A list flag's values as numbers (one-line UsageError naming the flag)."""
    try:
        out = tuple(kind(v) for v in values)
    except ValueError:
        raise UsageError(f"--{flag}={','.join(values)}: expected {kind.__name__}s") from None
    if not out:
        raise UsageError(f"--{flag}: empty")
    return out


def parse_space(kernels: list[str], expands: list[str], depths: list[str], widths: list[str],
                resolutions: list[str]) -> SearchSpace:
    return SearchSpace(kernels=parse_numbers("kernel_sizes", kernels, int),
                       expands=parse_numbers("expands", expands, float), depths=parse_numbers("depths", depths, int),
                       widths=parse_numbers("widths", widths, float),
                       resolutions=parse_numbers("resolutions", resolutions, int))


def validate(o: SearchRunOptions) -> None:
    if o.sram_kb <= 0:
        raise UsageError(f"--sram_kb={o.sram_kb}: must be > 0")
    if o.flash_kb is not None and o.flash_kb <= 0:
        raise UsageError(f"--flash_kb={o.flash_kb}: must be > 0")
    if o.max_mmacs is not None and o.max_mmacs <= 0:
        raise UsageError(f"--max_mmacs={o.max_mmacs}: must be > 0")
    if not o.patch_options or min(o.patch_options) < 1:
        raise UsageError("--grids: integers >= 1")
    if o.workers < 0:
        raise UsageError(f"--search_workers={o.workers}: must be >= 0")
    if o.max_stages < 1:
        raise UsageError(f"--max_stages={o.max_stages}: expected an integer >= 1 (1: one patch stage)")
    check_output_paths({"--out_dir": os.path.join(o.out_dir, "best.json")})


def base_spec(o: SearchRunOptions, ds: Dataset) -> NetSpec:
    """The preset or spec JSON ``o.model`` with the data set's classes, at the space's largest resolution."""
    return load_spec(o.model, max(o.space.resolutions), None, ds.num_classes)


def run(o: SearchRunOptions, log: Callable[[str], None] = print,
        progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    validate(o)
    ds = load(o.dataset, o.data_dir, seed=o.seed)
    base = base_spec(o, ds)
    space = o.space
    net, history = train_supernet(base, space, ds, o.dataset, o.supernet_dir or os.path.join(o.out_dir, "supernet"),
                                  o.supernet, o.seed, resume=True, log=log, strategy=o.strategy)
    if not getattr(net, "chief", True):
        log("[search] not the chief worker: the supernet is trained; the chief searches and writes the outputs")
        return {"chief": False, "supernet_history": history}
    score = SubnetAccuracy(net, ds, o.supernet, o.seed)
    common = dict(sram_bytes=int(o.sram_kb * KB), flash_bytes=None if o.flash_kb is None else int(o.flash_kb * KB),
                  max_macs=None if o.max_mmacs is None else int(o.max_mmacs * 1e6), count_input=o.count_input)
    runs = [("joint", Limits(**common, patch_options=o.patch_options, max_stages=o.max_stages))]
    if o.compare_per_layer:
        runs.append(("per_layer", Limits(**common, patch_options=(1,))))
    results: dict[str, Any] = {}
    for name, limits in runs:
        log(f"[search] {name}: {limits.describe()}; population {o.evolution.population}, "
            f"{o.evolution.iterations} iterations")
        constraints = ModelConstraints(space, base, limits, o.dataset, ds.class_names,
                                       cache_dir=o.cache_dir or os.path.join(o.out_dir, "constraints"))

        def report(n: int, total: int, what: str, name: str = name) -> None:
            if progress:
                progress(n, total, f"{name}: {what}")

        with ConstraintPool(constraints, o.workers) as pool:
            # Batches ahead only pay with worker processes; in this process, evaluate just what is drawn.
            results[name] = evolve(space, base, pool if o.workers else constraints, score, o.evolution,
                                   state_path=os.path.join(o.out_dir, f"search_{name}.json"), progress=report,
                                   describe={"dataset": o.dataset, "limits": dataclasses.asdict(limits),
                                             "supernet": dataclasses.asdict(o.supernet), "seed": o.seed})
        b = results[name]["best"]
        log(f"[search] {name}: best held-out accuracy {b['accuracy']:.2%} at {b['resolution']} px, predicted arena "
            f"{b['arena_bytes'] / KB:.1f} kB, {b['macs'] / 1e6:.1f}M MACs, grid {b['grid']}")
    winners: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tfmcu-search-") as tmp:
        for name, suffix, label in (("joint", "", "searched"), ("per_layer", "_per_layer", "searched-per-layer")):
            if name not in results:
                continue
            best = results[name]["best"]
            spec = space.decode(best["genome"], base).replace(name=f"{base.name}-{label}")
            model = net.extract(spec, score.calibrate(spec), o.seed)
            weights_tmp = os.path.join(tmp, f"best{suffix}.weights.h5")
            model.save_weights(weights_tmp)
            with open(weights_tmp, "rb") as f:
                weights = f.read()
            out = o.out_dir
            winners.update({os.path.join(out, f"best{suffix}.json"): spec.to_json() + "\n",
                            os.path.join(out, f"best{suffix}.weights.h5"): weights,
                            os.path.join(out, f"best{suffix}_schedule.json"):
                                {k: best[k] for k in best if k != "genome"}})
    report = {"dataset": {"name": ds.name, "source": ds.source, **ds.info}, "base": base.to_dict(),
              "space": dataclasses.asdict(space), "supernet_history": history,
              "searches": {name: {"best": r["best"], "history": [{"iteration": h["iteration"],
                                                                  "best_accuracy": h["best_accuracy"]}
                                                                 for h in r["history"]],
                                  "evaluated": _points(r)} for name, r in results.items()},
              "accuracy_is": "supernet held-out accuracy (BN re-calibrated per sub-network), not fine-tuned"}
    write_outputs({**winners, os.path.join(o.out_dir, "search_report.json"): report,
                   os.path.join(o.out_dir, "pareto.png"): pareto_plot(report, o.sram_kb)})
    return report


def _points(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every feasible evaluated candidate: accuracy and the constraint figures."""
    acc = result["evaluations"]["accuracy"]
    return [{"accuracy": acc[k], **{n: v for n, v in f.items() if n not in ("ok", "why")}}
            for k, f in result["evaluations"]["constraints"].items() if f["ok"] and k in acc]


def pareto_axes(ax: Any, report: dict[str, Any], sram_kb: float) -> None:
    """Every feasible candidate of each search (held-out accuracy against predicted arena) and its Pareto front."""
    for (name, r), colour in zip(report["searches"].items(), ("#4c72b0", "#c44e52")):
        pts = sorted(r["evaluated"], key=lambda p: p["arena_bytes"])
        ax.scatter([p["arena_bytes"] / KB for p in pts], [100 * p["accuracy"] for p in pts], s=14, alpha=0.5,
                   color=colour, label=f"{name.replace('_', '-')} candidates")
        front, top = [], -1.0
        for p in pts:
            if p["accuracy"] > top:
                front.append(p)
                top = p["accuracy"]
        ax.step([p["arena_bytes"] / KB for p in front], [100 * p["accuracy"] for p in front], where="post",
                color=colour, linewidth=1.5)
    ax.axvline(sram_kb, color="black", linestyle="--", linewidth=1, label=f"SRAM {sram_kb:.0f} kB")
    ax.set_xlabel("predicted TFLM arena (kB, custom mode)")
    ax.set_ylabel("held-out accuracy (%, supernet)")
    ax.legend(fontsize=8)


def pareto_plot(report: dict[str, Any], sram_kb: float) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    pareto_axes(ax, report, sram_kb)
    ax.set_title("joint architecture + schedule search vs per-layer only", fontsize=10)
    return figure_png(fig)
