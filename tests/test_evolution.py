"""The evolutionary search (tfmcu.nas.evolution) on a synthetic objective: constraints always hold, the best member
never gets worse, a resumed search equals an uninterrupted one, and bad states or impossible limits are one line."""

from __future__ import annotations

import json

import pytest

from tfmcu.nas import evolution as evo
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, SearchSpace, StageSpec, StemSpec

SPACE = SearchSpace(resolutions=(64, 96, 128, 160))
BASE = NetSpec(name="b", resolution=96, stem=StemSpec(8), stages=[StageSpec([BlockSpec(16, stride=2)]),
                                                                   StageSpec([BlockSpec(24, stride=2)])],
               head=HeadSpec(0, num_classes=10))


def cost(genome) -> int:
    spec = SPACE.decode(genome, BASE)
    return spec.resolution ** 2 * sum(b.hidden * b.kernel ** 2 for b in spec.resolve()) // 1000


def constraints(limit: int):
    def check(genome):
        c = cost(genome)
        return evo.Feasibility(c <= limit, {"cost": c}, "" if c <= limit else f"cost {c} > {limit}")
    return check


def accuracy(genome) -> float:
    """Prefers high resolution and large kernels: the constraint makes it a trade-off."""
    spec = SPACE.decode(genome, BASE)
    return spec.resolution / 160 * 0.5 + sum(b.kernel for b in spec.resolve()) / (7 * len(spec.resolve())) * 0.5


OPTIONS = evo.EvolutionOptions(population=8, parents=3, mutations=4, crossovers=4, mutation_rate=0.3, iterations=4,
                               seed=5)


def test_evolution_respects_limits_and_improves():
    limit = 60_000
    log = evo.evolve(SPACE, BASE, constraints(limit), accuracy, OPTIONS)
    best = log["best"]
    assert best["cost"] <= limit and best["accuracy"] == accuracy(best["genome"])
    curve = [h["best_accuracy"] for h in log["history"]]
    assert len(curve) == OPTIONS.iterations + 1
    assert all(b >= a for a, b in zip(curve, curve[1:])) and curve[-1] > curve[0]
    for h in log["history"]:
        assert all(m["cost"] <= limit for m in h["population"])
        assert len(h["population"]) == (OPTIONS.population if h["iteration"] == 0
                                        else OPTIONS.parents + OPTIONS.mutations + OPTIONS.crossovers)


def test_resume_matches_uninterrupted(tmp_path):
    limit = 60_000
    whole = evo.evolve(SPACE, BASE, constraints(limit), accuracy, OPTIONS)
    state = tmp_path / "state.json"
    calls = []

    def counting(genome):
        calls.append(genome)
        return accuracy(genome)

    first = evo.evolve(SPACE, BASE, constraints(limit), counting,
                       evo.EvolutionOptions(**{**OPTIONS.__dict__, "iterations": 2}), state_path=str(state))
    assert len(first["history"]) == 3
    # The state of a shorter run is another search (its options differ): refused.
    with pytest.raises(evo.SearchError, match="another search"):
        evo.evolve(SPACE, BASE, constraints(limit), accuracy, OPTIONS, state_path=str(state))
    # Same options, interrupted after iteration 2 (history truncated by hand), then resumed.
    data = json.loads(state.read_text())
    data["header"]["options"]["iterations"] = OPTIONS.iterations
    state.write_text(json.dumps(data))
    calls.clear()
    resumed = evo.evolve(SPACE, BASE, constraints(limit), counting, OPTIONS, state_path=str(state))
    assert resumed["history"] == whole["history"] and resumed["best"] == whole["best"]
    assert len(calls) < OPTIONS.iterations * (OPTIONS.mutations + OPTIONS.crossovers)  # cached ones not re-run


def test_impossible_limits_and_bad_options():
    with pytest.raises(evo.SearchError, match="no random member satisfying the constraints") as e:
        evo.evolve(SPACE, BASE, constraints(1), accuracy, evo.EvolutionOptions(max_tries=20))
    assert "\n" not in str(e.value) and "cost" in str(e.value)
    with pytest.raises(evo.SearchError, match="parents"):
        evo.evolve(SPACE, BASE, constraints(1), accuracy, evo.EvolutionOptions(population=4, parents=5))
    assert evo.EvolutionOptions.paper().population == 100


class Batched:
    """A constraint evaluator with ``many`` (as ``ConstraintPool``): records each parallel batch."""

    def __init__(self, limit: int):
        self.check, self.memo, self.batches = constraints(limit), {}, []

    def many(self, genomes):
        todo = [g for g in genomes if json.dumps(g) not in self.memo]
        self.batches.append(len(todo))
        for g in todo:
            self.memo[json.dumps(g)] = self.check(g)
        return [self.memo[json.dumps(g)] for g in genomes]

    def __call__(self, genome):
        return self.many([genome])[0]


def test_prefetch_does_not_change_the_search(tmp_path):
    """Batches evaluated ahead (worker processes) leave the draws, the result and the state file as they were."""
    limit = 60_000
    plain_state, batched_state = tmp_path / "plain.json", tmp_path / "batched.json"
    plain = evo.evolve(SPACE, BASE, constraints(limit), accuracy, OPTIONS, state_path=str(plain_state))
    pool = Batched(limit)
    opts = evo.EvolutionOptions(**{**OPTIONS.__dict__, "prefetch": 5})
    batched = evo.evolve(SPACE, BASE, pool, accuracy, opts, state_path=str(batched_state))
    assert batched["best"] == plain["best"] and batched["history"] == plain["history"]
    assert json.loads(batched_state.read_text()) == json.loads(plain_state.read_text())
    assert max(pool.batches) == 5 and len(pool.memo) > len(plain["evaluations"]["constraints"])  # ahead, in batches
