"""The joint search's parts on a tiny scale: supernet training (resumable), sub-network scoring, the constraints of
an architecture (int8 export, custom-mode arena prediction, Flash, MACs)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tfmcu.data import catalog, classify
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, SearchSpace, StageSpec, StemSpec

tf = pytest.importorskip("tensorflow")

from tfmcu.nas import constraints as cons  # noqa: E402
from tfmcu.nas import train_supernet as ts  # noqa: E402
from tests.support import fake_idx_set  # noqa: E402

SPACE = SearchSpace(kernels=(3, 5, 7), expands=(3, 6), depths=(1, 2), widths=(0.5, 1.0), resolutions=(32, 48))
BASE = NetSpec(name="tiny", resolution=48, stem=StemSpec(8, kernel=3, stride=2),
               stages=[StageSpec([BlockSpec(16, stride=2)]), StageSpec([BlockSpec(24, stride=2)])],
               head=HeadSpec(0, num_classes=10)).validate()
RECIPE = ts.SupernetRecipe(largest_epochs=1, epochs=1, batch_size=16, steps_per_epoch=3, calibration_batches=2,
                           calibration_batch_size=16, eval_samples=24)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    folder = fake_idx_set(tmp_path_factory.mktemp("idx"), n_train=120, n_test=30)
    return catalog.load("scenes:canvas=48,object_px=10-20,train=64,val=24,test=24", data_dir=folder)


def test_supernet_trains_resumes_and_scores(scenes, tmp_path):
    logs = []
    net, history = ts.train_supernet(BASE, SPACE, scenes, "scenes-test", str(tmp_path), RECIPE, log=logs.append)
    assert [len(history[p]) for p in ts.PHASES] == [1, 1]
    assert all(np.isfinite(h["loss"]) for p in ts.PHASES for h in history[p])
    # Resumed with everything done: no epoch runs again, the weights are the checkpoint's.
    again, history2 = ts.train_supernet(BASE, SPACE, scenes, "scenes-test", str(tmp_path), RECIPE, log=logs.append)
    assert history2 == history
    for k in net.v:
        np.testing.assert_array_equal(again.v[k].numpy(), net.v[k].numpy())
    # Another recipe in the same folder is refused (one line).
    with pytest.raises(ts.TrainError, match="another model"):
        ts.train_supernet(BASE, SPACE, scenes, "scenes-test", str(tmp_path),
                          ts.SupernetRecipe(**{**RECIPE.__dict__, "lr": 0.01}))
    score = ts.SubnetAccuracy(net, scenes, RECIPE)
    rng = random.Random(1)
    genome = SPACE.encode(SPACE.sample(BASE, rng), BASE)
    acc = score(genome)
    assert 0.0 <= acc <= 1.0 and score(genome) == acc  # deterministic
    # The extracted model with the calibrated statistics agrees with the supernet on the held-out images.
    sub = score.spec(genome)
    model = net.extract(sub, score.stats[json.dumps(genome)])
    x, y = classify.as_arrays(score.held, sub.resolution, sub.in_channels)
    assert np.mean(model(x, training=False).numpy().argmax(1) == y) == pytest.approx(acc)


def test_constraints_of_an_architecture(tmp_path):
    labels = [str(i) for i in range(10)]
    genome = SPACE.encode(SPACE.sample(BASE, random.Random(2)), BASE)
    loose = cons.ModelConstraints(SPACE, BASE, cons.Limits(sram_bytes=512 * 1024), "t", labels,
                                  cache_dir=str(tmp_path))
    f = loose(genome)
    assert f.ok and f.figures["arena_bytes"] <= 512 * 1024 and f.figures["flash_bytes"] > 0
    assert f.figures["grid"] == [1, 1] and f.figures["macs"] == f.figures["macs_per_layer"]  # fits unpatched
    # From the disk cache: the same answer without converting again.
    cached = cons.ModelConstraints(SPACE, BASE, cons.Limits(sram_bytes=512 * 1024), "t", labels,
                                   cache_dir=str(tmp_path))
    assert cached(genome).figures == f.figures
    # The SRAM floor (no conversion) is under the predicted arena; below it the genome is refused unconverted.
    graph = cons.from_spec(SPACE.decode(genome, BASE))
    for patches in ((1,), (1, 2, 3)):
        floor = cons.sram_floor(graph, cons.Limits(sram_bytes=1, patch_options=patches))
        assert 0 < floor <= f.figures["smallest_arena_bytes"]
    tight = cons.ModelConstraints(SPACE, BASE, cons.Limits(sram_bytes=1024, patch_options=(1,)), "t", labels)
    g = tight(genome)
    assert not g.ok and "analytic SRAM floor" in g.why and "not converted" in g.why and "flash_bytes" not in g.figures
    floor = cons.sram_floor(graph, cons.Limits(sram_bytes=1, patch_options=(1,)))
    between = cons.ModelConstraints(SPACE, BASE, cons.Limits(sram_bytes=floor, patch_options=(1,)), "t", labels)
    g = between(genome)
    assert not g.ok and "predicted TFLM arena" in g.why and g.figures["sram_floor_bytes"] == floor
    macs = cons.ModelConstraints(SPACE, BASE, cons.Limits(sram_bytes=512 * 1024, max_macs=1000), "t", labels)
    assert not macs(genome).ok and "MACs" in macs(genome).why


def test_constraints_with_stage_plans(tmp_path):
    """``Limits.max_stages`` > 1: each architecture's schedule search also weighs stage plans (several patch stages
    anywhere): its floor and its smallest predicted arena are no higher than with one stage."""
    labels = [str(i) for i in range(10)]
    genome = SPACE.encode(SPACE.sample(BASE, random.Random(2)), BASE)
    graph = cons.from_spec(SPACE.decode(genome, BASE))
    one, many = (cons.Limits(sram_bytes=512 * 1024, patch_options=(1, 2, 3), max_stages=k) for k in (1, 3))
    assert "up to 3 stages" in many.describe() and "stages" not in one.describe()
    assert cons.sram_floor(graph, many) <= cons.sram_floor(graph, one)
    f1 = cons.ModelConstraints(SPACE, BASE, one, "t", labels, cache_dir=str(tmp_path / "1"))(genome)
    f3 = cons.ModelConstraints(SPACE, BASE, many, "t", labels, cache_dir=str(tmp_path / "3"))(genome)
    assert f1.ok and f3.ok
    assert f3.figures["smallest_arena_bytes"] <= f1.figures["smallest_arena_bytes"]


def test_constraints_in_a_worker_process():
    """ConstraintPool: the same figures from a spawned worker as in this process."""
    labels = [str(i) for i in range(10)]
    genome = SPACE.encode(SPACE.sample(BASE, random.Random(4)), BASE)
    limits = cons.Limits(sram_bytes=512 * 1024)
    local = cons.ModelConstraints(SPACE, BASE, limits, "t", labels)(genome)
    with cons.ConstraintPool(cons.ModelConstraints(SPACE, BASE, limits, "t", labels), workers=1) as pool:
        [remote] = pool.many([genome])
        assert pool(genome) is remote  # kept
    assert (remote.ok, remote.figures, remote.why) == (local.ok, local.figures, local.why)
