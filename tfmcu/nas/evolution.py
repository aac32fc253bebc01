"""Evolutionary search over genomes (MCUNetV2 section 3.3): population, parents, crossover, mutation.

``evolve(space, base, constraints, accuracy, options)``:

1. the population: ``population`` random genomes that satisfy the constraints (``SearchSpace.sample`` until one
   does; at most ``max_tries`` draws per member);
2. each iteration keeps the ``parents`` most accurate members, then adds ``mutations`` children (a random parent,
   every gene re-drawn with probability ``mutation_rate``) and ``crossovers`` children (each gene from one of two
   random parents), every child re-drawn until it satisfies the constraints;
3. after ``iterations`` iterations the most accurate member is the result.

The paper's settings are 100 / 20 / 50 + 50 / 0.1 / 30 (``EvolutionOptions.paper()``); the defaults are scaled for 2
CPU cores. ``constraints(genome)`` returns a ``Feasibility`` (the figures and whether they fit; evaluated without
training), ``accuracy(genome)`` a number in [0, 1] (the supernet's held-out accuracy). Both are cached by genome.

Resumable: ``state_path`` (a JSON log) holds the options, every evaluation and each finished iteration's
population; a run that finds one continues after its last iteration, bit for bit like an uninterrupted run (every
random draw of iteration i comes from ``random.Random(f"{seed}:{i}")``). ``progress(done, total, what)`` reports.

Parallel constraints: when ``constraints`` has ``many(genomes)`` (``tfmcu.nas.constraints.ConstraintPool``), each
draw first evaluates the next ``prefetch`` genomes the same random stream will produce (a copy of the generator, so
the draws themselves are unchanged) in one parallel batch; the result does not depend on the number of workers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.errors import TfmcuError
from tfmcu.files import write_outputs
from tfmcu.nets.spec import NetSpec, SearchSpace

Genome = list[Any]
Progress = Callable[[int, int, str], None]


class SearchError(TfmcuError):
    """The search cannot start or continue (bad options, a state file of another search, nothing feasible)."""


@dataclass
class Feasibility:
    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)  # JSON-able: arena, Flash, MACs, schedule, ...
    why: str = ""  # which constraint failed


@dataclass(frozen=True)
class EvolutionOptions:
    population: int = 16
    parents: int = 4
    mutations: int = 6
    crossovers: int = 6
    mutation_rate: float = 0.1
    iterations: int = 6
    max_tries: int = 200  # random draws per member or child before the search gives up
    seed: int = 0
    prefetch: int = 4  # genomes evaluated ahead in one parallel batch (constraints with ``many`` only)

    @classmethod
    def paper(cls) -> "EvolutionOptions":
        return cls(population=100, parents=20, mutations=50, crossovers=50, mutation_rate=0.1, iterations=30)

    def validate(self) -> "EvolutionOptions":
        checks = [(self.population >= 2, "population must be >= 2"),
                  (1 <= self.parents <= self.population, "parents must be in 1..population"),
                  (self.mutations >= 0 and self.crossovers >= 0, "mutations and crossovers must be >= 0"),
                  (0.0 <= self.mutation_rate <= 1.0, "mutation_rate must be in [0, 1]"),
                  (self.iterations >= 0, "iterations must be >= 0"),
                  (self.max_tries >= 1, "max_tries must be >= 1"), (self.prefetch >= 1, "prefetch must be >= 1")]
        for ok, msg in checks:
            if not ok:
                raise SearchError(f"evolution options: {msg}")
        return self


def key_of(genome: Genome) -> str:
    return json.dumps(genome)


@dataclass
class Member:
    genome: Genome
    accuracy: float
    figures: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"genome": self.genome, "accuracy": self.accuracy, **self.figures}


class _Evaluations:
    """Cached constraint and accuracy evaluations, kept in the state file."""

    def __init__(self, constraints: Callable[[Genome], Feasibility], accuracy: Callable[[Genome], float],
                 saved: dict[str, Any] | None = None):
        self.constraints_fn, self.accuracy_fn = constraints, accuracy
        self.feasible: dict[str, dict[str, Any]] = dict((saved or {}).get("constraints", {}))
        self.acc: dict[str, float] = dict((saved or {}).get("accuracy", {}))

    def fits(self, genome: Genome) -> bool:
        k = key_of(genome)
        if k not in self.feasible:
            f = self.constraints_fn(genome)
            self.feasible[k] = {"ok": f.ok, "why": f.why, **f.figures}
        return bool(self.feasible[k]["ok"])

    def accuracy(self, genome: Genome) -> float:
        k = key_of(genome)
        if k not in self.acc:
            self.acc[k] = float(self.accuracy_fn(genome))
        return self.acc[k]

    def member(self, genome: Genome) -> Member:
        figures = {n: v for n, v in self.feasible[key_of(genome)].items() if n not in ("ok", "why")}
        return Member(genome, self.accuracy(genome), figures)

    def to_dict(self) -> dict[str, Any]:
        return {"constraints": self.feasible, "accuracy": self.acc}


def _genome_sample(space: SearchSpace, base: NetSpec, rng: random.Random) -> Genome:
    return space.encode(space.sample(base, rng), base)


def mutate(genome: Genome, space: SearchSpace, num_stages: int, rate: float, rng: random.Random) -> Genome:
    return [rng.choice(space.choices(i, num_stages)) if rng.random() < rate else g for i, g in enumerate(genome)]


def crossover(a: Genome, b: Genome, rng: random.Random) -> Genome:
    return [x if rng.random() < 0.5 else y for x, y in zip(a, b)]


def evolve(space: SearchSpace, base: NetSpec, constraints: Callable[[Genome], Feasibility],
           accuracy: Callable[[Genome], float], options: EvolutionOptions = EvolutionOptions(),
           state_path: str | None = None, progress: Progress | None = None,
           describe: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the search (see the module docstring); returns the log: options, per-iteration best and population,
    the best member, and every evaluation. ``describe`` (JSON-able) identifies the search in the state file: a
    state written by a search with another description is refused."""
    options.validate()
    n_stages = len(base.stages)
    kept = {k: v for k, v in dataclasses.asdict(options).items() if k != "prefetch"}  # prefetch: not the result
    header = {"options": kept, "space": dataclasses.asdict(space),
              "base": base.to_dict(), "describe": describe or {}}
    state: dict[str, Any] = {}
    if state_path and os.path.isfile(state_path):
        try:
            with open(state_path) as f:
                state = json.load(f)
        except (OSError, ValueError) as e:
            raise SearchError(f"{state_path}: cannot read the search state ({e})") from None
        if state.get("header") != json.loads(json.dumps(header)):
            raise SearchError(f"{state_path}: a state of another search (options, space, base or data differ); "
                              f"use another output folder or remove it")
    ev = _Evaluations(constraints, accuracy, state.get("evaluations"))
    history: list[dict[str, Any]] = list(state.get("history", []))
    total = options.population + options.iterations * (options.mutations + options.crossovers)
    done = len(history) and (options.population + (len(history) - 1) * (options.mutations + options.crossovers))

    def save() -> None:
        if state_path:
            write_outputs({state_path: {"header": header, "history": history, "evaluations": ev.to_dict()}})

    many = getattr(constraints, "many", None)

    def draw(rng: random.Random, make: Callable[[random.Random], Genome], what: str) -> Genome:
        nonlocal done
        for _ in range(options.max_tries):
            if many is not None:
                ahead = random.Random()
                ahead.setstate(rng.getstate())
                batch = [make(ahead) for _ in range(options.prefetch)]
                if key_of(batch[0]) not in ev.feasible:
                    many([b for b in batch if key_of(b) not in ev.feasible])
            g = make(rng)
            if ev.fits(g):
                ev.accuracy(g)
                done += 1
                if progress:
                    m = ev.member(g)
                    progress(done, total, f"{what}: accuracy {m.accuracy:.2%}")
                return g
        raise SearchError(f"no {what} satisfying the constraints in {options.max_tries} draws: "
                          f"loosen the limits (last refusal: {ev.feasible[key_of(g)]['why']})")

    if not history:
        rng = random.Random(f"{options.seed}:0")
        population = [draw(rng, lambda r: _genome_sample(space, base, r), "random member")
                      for _ in range(options.population)]
        history.append(_record(0, population, ev))
        save()
    population = [m["genome"] for m in history[-1]["population"]]
    for it in range(len(history), options.iterations + 1):
        rng = random.Random(f"{options.seed}:{it}")
        ranked = sorted(population, key=lambda g: -ev.accuracy(g))
        parents = ranked[:options.parents]
        children = [draw(rng, lambda r: mutate(r.choice(parents), space, n_stages, options.mutation_rate, r),
                         "mutation") for _ in range(options.mutations)]
        children += [draw(rng, lambda r: crossover(r.choice(parents), r.choice(parents), r), "crossover")
                     for _ in range(options.crossovers)]
        population = parents + children
        history.append(_record(it, population, ev))
        save()
    best = max(population, key=lambda g: ev.accuracy(g))
    return {"header": header, "best": ev.member(best).to_dict(), "history": history, "evaluations": ev.to_dict()}


def _record(iteration: int, population: list[Genome], ev: _Evaluations) -> dict[str, Any]:
    members = sorted((ev.member(g) for g in population), key=lambda m: -m.accuracy)
    return {"iteration": iteration, "best_accuracy": members[0].accuracy,
            "population": [m.to_dict() for m in members]}
