"""The search prices a candidate from its model as the rewriter decides it, before any byte is written
(``tfmcu.tflite.model.TfliteModel.decided``): for EVERY candidate the search enumerates on two small models, in fit's
custom-mode configurations (one and two stages, the input streamed, the rest's convolutions by TFLM or by our
kernels) and in builtin mode, the predicted TFLM arena (total, head, tail) and the latency predictor's instructions
equal to the byte those of the same model written and parsed again -- and nothing was written while pricing."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.firmware.targets import get_target  # noqa: E402
from tfmcu.flows import fit  # noqa: E402
from tfmcu.flows.deploy import DeployOptions  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.plan.arena import predict_model_arena  # noqa: E402
from tfmcu.plan.latency import predict_instructions  # noqa: E402
from tfmcu.plan.search import SearchOptions, candidates  # noqa: E402
from tfmcu.stage.builtin import BORDERS, BuiltinArenaCost  # noqa: E402
from tfmcu.tflite.model import TfliteModel  # noqa: E402

# fit on the Cortex-M4 (CMSIS-NN), objective memory, the image streamed: per model the grids, stages and MAC cap that
# keep the candidates to tens
CASES = {"mbv2_035_96": dict(patch_options=(3,), max_stages=2, max_mac_overhead=0.25),
         "mcunet-demo": dict(patch_options=(2, 4), max_stages=2, max_mac_overhead=0.3)}


@pytest.fixture(scope="module")
def models(zoo_models):
    from tfmcu.graph.load import load_spec
    from tfmcu.train.export import untrained_int8

    def get(name: str) -> bytes:  # the zoo's, or a preset with untrained weights as fit converts it
        return untrained_int8(load_spec(name), 0, as_conv=False) if name == "mcunet-demo" else zoo_models(name)

    return get


def _arena(p) -> tuple[int, int, int]:
    return p.total, p.head, p.tail


def _written(ev) -> TfliteModel:
    """The candidate's model written (the evaluation's bytes) and parsed again."""
    return TfliteModel(ev.result.model, "written")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fit_prices_every_candidate_from_the_decided_model(models, name):
    data = models(name)
    graph = from_tflite(data, name=name)
    caps = CASES[name]
    o = fit.FitOptions(model=name, firmware=DeployOptions(tflite="", target="cortex-m4"), objective="memory",
                       max_latency=1.10, stream_input=True, patch_options=caps["patch_options"],
                       max_stages=caps["max_stages"], halo_modes=("none", "all"))
    t = get_target(o.target)
    cost = fit.cost_function(o, t, data, graph, None)
    plans = candidates(graph, SearchOptions(patch_options=o.patch_options, rectangular=False,
                                            max_mac_overhead=caps["max_mac_overhead"], max_stages=o.max_stages,
                                            objective="memory"))
    evaluations = [cost.evaluate(plans[0], None)]
    evaluations += [cost.evaluate(p, v) for p in plans[1:] for v in cost.variants]
    priced = [e for e in evaluations if e.candidate.patched]
    assert 10 <= len(priced) <= 100, len(priced)
    assert any(len(e.candidate.stages) > 1 for e in priced) == (o.max_stages > 1)
    assert not any(e.result.decided.written for e in priced)  # pricing wrote no model
    compared = 0
    for ev in priced:
        written = _written(ev)
        d = ev.details
        assert (d["predicted_arena_bytes"], d["predicted_arena_head_bytes"], d["predicted_arena_tail_bytes"]) == \
            _arena(predict_model_arena(written, build=cost.build, stage=ev.result.stages)), ev.describe()
        assert ev.instructions == predict_instructions(written, t.core, o.kernels).instructions, ev.describe()
        compared += 1
    assert compared == len(priced) > 0
    assert {e.variant_label for e in priced} == {c.label for c in cost.variants}
    # the stage-plan search's estimate of the tail (``segment_tail``; the rest's convolutions by our kernels) follows
    # the prediction: off by TFLM's fixed records, within the padding between the tail's pieces
    off = [ev.details["predicted_arena_tail_bytes"] - sum(cost.segment_tail(s) for s in ev.candidate.segments)
           for ev in priced if ev.variant.rest_convs == "tfmcu"]
    assert off and min(off) > 0 and max(off) - min(off) <= 96, (min(off), max(off))
    # what is compared is what pricing read: a decided stage op whose options do not match its blob (one layer
    # fewer) is an op the prediction cannot model
    ev = priced[0]
    decided = ev.result.decided
    k, options = next(iter(decided.decided_options.items()))
    bad = TfliteModel.decided(decided.flatbuffer, decided.members,
                              {**decided.decided_options, k: {**options, "layers": options["layers"][1:]}},
                              lambda: b"", name)
    assert not predict_model_arena(decided, build=cost.build, stage=ev.result.stages).details["unmodelled_ops"]
    assert predict_model_arena(bad, build=cost.build, stage=ev.result.stages).details["unmodelled_ops"]


def test_builtin_prices_every_candidate_from_the_decided_model(zoo_models):
    name = "mbv2_035_96"
    data = zoo_models(name)
    graph = from_tflite(data, name=name)
    cost = BuiltinArenaCost(data, graph, name, BORDERS, count_input=True)
    plans = candidates(graph, SearchOptions(patch_options=(2, 3), rectangular=False, max_mac_overhead=0.2))
    priced = [cost.evaluate(p, v) for p in plans[1:] for v in cost.variants]
    assert len(priced) >= 10 and {e.details["border"] for e in priced} == set(BORDERS)
    assert not any(e.result.decided.written for e in priced)
    for ev in priced:
        d = ev.details
        assert (d["predicted_arena_bytes"], d["predicted_arena_head_bytes"], d["predicted_arena_tail_bytes"]) == \
            _arena(predict_model_arena(_written(ev))), ev.describe()
        assert ev.cost == d["predicted_arena_bytes"]
    # a finalist's file is its decided model written: parsed again, the same operators
    assert TfliteModel(priced[0].result.model).op_names == priced[0].result.decided.op_names
