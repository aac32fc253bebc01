"""The search's constraints on one architecture, evaluated without training: SRAM, Flash and MACs of its int8 model.

``ModelConstraints(space, base, limits)(genome)``:

1. the genome's spec (``SearchSpace.decode``) must not exceed ``max_macs`` per layer (analytic, ``tfmcu.plan
   .profiler``), nor ``flash_bytes`` by its int8 weights and int32 biases alone, nor ``sram_bytes`` by its SRAM
   floor (``sram_floor``: the least analytic lower bound over every schedule the search may pick, each a floor under
   that schedule's predicted arena) -- all checked on the spec's graph, before anything is built or converted;
2. the spec is built (``tf_keras``, seeded weights) and exported as training exports it (``tfmcu.nets.convert``:
   full int8, the classifier as a 1x1 CONV_2D, the same TFLite metadata: ``tfmcu.train.export.with_metadata``); its
   Flash is that file's size;
3. SRAM: the least-MACs patch schedule (grid p x q with p, q in ``patch_options``, stage n) whose predicted TFLM
   arena in custom mode (one TFMCU_PATCH_STAGE op, the rest planned disjoint: ``tfmcu.stage.custom
   .CustomArenaCost``, the predictor ``tfmcu.plan.arena``) fits ``sram_bytes``, the input image counted unless
   ``count_input`` is off; ``patch_options=(1,)`` is the per-layer-only search;
4. MACs: that schedule's exact MACs (patch overhead included) must fit ``max_macs``.

Results are cached by genome in memory and, with ``cache_dir``, on disk (one JSON per architecture and limits;
the int8 model itself once per architecture under ``cache_dir/models``, shared by searches under other limits), so a
resumed or repeated search does not convert again.

``ConstraintPool(constraints, workers)``: the same evaluation in ``workers`` processes (``spawn``; each builds its
own ``ModelConstraints``); ``many(genomes)`` evaluates a batch in parallel (the evolution prefetches the genomes it
is about to draw), ``__call__`` one genome. With no workers there is nothing to gain from batches: pass the
``ModelConstraints`` itself (the evolution then evaluates only what it draws).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from tfmcu.errors import TfmcuError
from tfmcu.files import write_outputs
from tfmcu.graph import ir
from tfmcu.graph.from_spec import from_spec
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nas.evolution import Feasibility, Genome
from tfmcu.nets.spec import NetSpec, SearchSpace
from tfmcu.plan.profiler import profile
from tfmcu.plan.search import SearchOptions, candidates, search
from tfmcu.stage.cost import CustomArenaCost

KB = 1024


@dataclass(frozen=True)
class Limits:
    sram_bytes: int
    flash_bytes: int | None = None
    max_macs: int | None = None
    count_input: bool = True
    patch_options: tuple[int, ...] = (1, 2, 3, 4)
    max_stages: int = 1  # > 1: plans of several patch stages anywhere are candidates too

    def describe(self) -> str:
        parts = [f"SRAM {self.sram_bytes / KB:.0f} kB ({'image counted' if self.count_input else 'image streamed'})"]
        if self.flash_bytes is not None:
            parts.append(f"Flash {self.flash_bytes / KB:.0f} kB")
        if self.max_macs is not None:
            parts.append(f"{self.max_macs / 1e6:.0f}M MACs")
        parts.append("per layer only" if self.patch_options == (1,) else
                     f"patches {'/'.join(map(str, self.patch_options))}")
        if self.max_stages > 1 and self.patch_options != (1,):
            parts.append(f"up to {self.max_stages} stages")
        return ", ".join(parts)


def int8_model(spec: NetSpec, dataset_name: str, class_names: list[str], seed: int = 0) -> bytes:
    """The spec's .tflite as training exports it (full int8, classifier as a 1x1 CONV_2D, the same metadata with a
    version string of the same length), from seeded weights and random calibration data."""
    from tfmcu.nets.convert import random_representative, to_int8_tflite  # lazy: imports TensorFlow
    from tfmcu.nets.keras_builder import build_keras  # lazy: imports TensorFlow
    from tfmcu.train.export import classifier_as_conv, quiet_convert, with_metadata  # lazy: imports TensorFlow

    model = build_keras(spec, seed)
    shape = (spec.resolution, spec.resolution, spec.in_channels)
    data = classifier_as_conv(quiet_convert(to_int8_tflite, model, random_representative(shape, 4, seed)))[0]
    return with_metadata(data, spec, dataset_name, class_names, spec.resolution, spec.in_channels, "0" * 16)


def sram_floor(graph: ir.Graph, limits: Limits) -> int:
    """A floor under the predicted TFLM arena (custom mode, the rest planned disjoint) of every schedule the search
    may choose for ``graph``, from the graph alone: the unpatched model's analytic per-layer peak (TFLM's planned head
    holds every activation alive at an op), and per patched candidate ``CustomArenaCost.lower_bound``; the least of
    them. ``count_input=False`` subtracts the input image from each (as the cost does)."""
    options = SearchOptions(patch_options=limits.patch_options, count_input=True,
                            max_stages=limits.max_stages if limits.patch_options != (1,) else 1)
    cands = candidates(graph, options)
    cost = CustomArenaCost(b"", graph, count_input=True)
    image = 0 if limits.count_input else sum(-(-graph.tensors[t].nbytes // 16) * 16 for t in graph.inputs)
    floors = [cands[0].peak(True)] + [cost.lower_bound(c, None) for c in cands[1:]]
    return max(0, min(floors) - image)


class ModelConstraints:
    """Callable genome -> Feasibility (see the module docstring)."""

    def __init__(self, space: SearchSpace, base: NetSpec, limits: Limits, dataset_name: str, class_names: list[str],
                 cache_dir: str | None = None):
        self.space, self.base, self.limits, self.cache_dir = space, base, limits, cache_dir
        self.dataset_name, self.class_names = dataset_name, list(class_names)
        self.memo: dict[str, Feasibility] = {}

    def _cache_path(self, spec: NetSpec) -> str | None:
        if not self.cache_dir:
            return None
        key = json.dumps({"spec": spec.to_dict(), "limits": asdict(self.limits), "dataset": self.dataset_name,
                          "labels": self.class_names}, sort_keys=True)
        return os.path.join(self.cache_dir, hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")

    def __call__(self, genome: Genome) -> Feasibility:
        k = json.dumps(genome)
        if k not in self.memo:
            self.memo[k] = self._evaluate(self.space.decode(genome, self.base))
        return self.memo[k]

    def _evaluate(self, spec: NetSpec) -> Feasibility:
        path = self._cache_path(spec)
        if path and os.path.isfile(path):
            with open(path) as f:
                d = json.load(f)
            return Feasibility(d["ok"], d["figures"], d["why"])
        result = self.evaluate_spec(spec)
        if path:
            write_outputs({path: {"ok": result.ok, "figures": result.figures, "why": result.why}})
        return result

    def _int8(self, spec: NetSpec) -> bytes:
        """The spec's int8 model, converted once per architecture (cached under ``cache_dir/models``)."""
        path = None
        if self.cache_dir:
            key = json.dumps({"spec": spec.to_dict(), "dataset": self.dataset_name, "labels": self.class_names},
                             sort_keys=True)
            path = os.path.join(self.cache_dir, "models", hashlib.sha256(key.encode()).hexdigest()[:20] + ".tflite")
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    return f.read()
        data = int8_model(spec, self.dataset_name, self.class_names)
        if path:
            write_outputs({path: data})
        return data

    def evaluate_spec(self, spec: NetSpec) -> Feasibility:
        lim = self.limits
        spec_graph = from_spec(spec)
        prof = profile(spec_graph)
        figures: dict[str, Any] = {"resolution": spec.resolution, "macs_per_layer": prof.macs,
                                   "analytic_peak_bytes": prof.peak_sram_per_layer_bytes}
        if lim.max_macs is not None and prof.macs > lim.max_macs:
            return Feasibility(False, figures, f"{prof.macs / 1e6:.1f}M MACs > {lim.max_macs / 1e6:.1f}M")
        if lim.flash_bytes is not None and prof.flash_bytes > lim.flash_bytes:
            return Feasibility(False, figures, f"weights {prof.flash_bytes / KB:.0f} kB > Flash "
                                               f"{lim.flash_bytes / KB:.0f} kB")
        floor = sram_floor(spec_graph, lim)
        figures["sram_floor_bytes"] = floor
        if floor > lim.sram_bytes:
            return Feasibility(False, figures, f"analytic SRAM floor {floor / KB:.0f} kB > {lim.sram_bytes / KB:.0f} kB "
                                               f"(not converted)")
        data = self._int8(spec)
        figures["flash_bytes"] = len(data)
        if lim.flash_bytes is not None and figures["flash_bytes"] > lim.flash_bytes:
            return Feasibility(False, figures, f"Flash {figures['flash_bytes'] / KB:.0f} kB > "
                                               f"{lim.flash_bytes / KB:.0f} kB")
        graph = from_tflite(data, name=spec.name)
        options = SearchOptions(patch_options=lim.patch_options, count_input=lim.count_input,
                                max_stages=lim.max_stages if lim.patch_options != (1,) else 1)
        try:
            result = search(graph, CustomArenaCost(data, graph, count_input=lim.count_input), lim.sram_bytes,
                            options)
        except TfmcuError as e:
            return Feasibility(False, figures, f"no schedule: {str(e).splitlines()[0]}")
        figures["smallest_arena_bytes"] = result.smallest.cost
        if not result.feasible:
            return Feasibility(False, figures, f"predicted TFLM arena >= {result.smallest.cost / KB:.0f} kB > "
                                               f"{lim.sram_bytes / KB:.0f} kB")
        c = result.chosen
        figures.update({"arena_bytes": c.cost, "grid": list(c.candidate.grid), "patch_blocks": c.candidate.n_blocks,
                        "patch_ops": c.candidate.n_ops, "macs": c.candidate.macs,
                        "mac_overhead": round(c.candidate.mac_overhead, 6), **c.candidate.stage_plan_field()})
        if lim.max_macs is not None and c.candidate.macs > lim.max_macs:
            return Feasibility(False, figures, f"{c.candidate.macs / 1e6:.1f}M MACs with patches > "
                                               f"{lim.max_macs / 1e6:.1f}M")
        return Feasibility(True, figures)


# ----------------------------------------------------------------------------- worker processes
_WORKER: ModelConstraints | None = None


def _worker_init(args: tuple) -> None:
    global _WORKER
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _WORKER = ModelConstraints(*args)


def _worker_eval(genome: Genome) -> tuple[bool, dict[str, Any], str]:
    assert _WORKER is not None
    f = _WORKER(genome)
    return f.ok, f.figures, f.why


class ConstraintPool:
    """``ModelConstraints`` evaluated in worker processes (see the module docstring). Use as a context manager (or
    call ``close``)."""

    def __init__(self, constraints: ModelConstraints, workers: int = 0):
        if workers < 0:
            raise ValueError("workers must be >= 0")
        self.local, self._pool = constraints, None
        if workers:
            c = constraints
            args = (c.space, c.base, c.limits, c.dataset_name, c.class_names, c.cache_dir)
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init, initargs=(args,))

    def __call__(self, genome: Genome) -> Feasibility:
        return self.many([genome])[0]

    def many(self, genomes: list[Genome]) -> list[Feasibility]:
        todo = [g for g in dict.fromkeys(json.dumps(g) for g in genomes) if g not in self.local.memo]
        if self._pool is not None and todo:
            for k, (ok, figures, why) in zip(todo, self._pool.map(_worker_eval, [json.loads(k) for k in todo])):
                self.local.memo[k] = Feasibility(ok, figures, why)
        return [self.local(g) for g in genomes]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> "ConstraintPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
