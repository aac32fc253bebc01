"""The bench section *fit* resumes from its rows file: rows an earlier run measured with the same search are kept,
a run with another search measures fit's rows again and keeps the per-layer rows (``benchmarks.fit``). The
measurements themselves are replaced by stand-ins here (the bench measures under QEMU, in ``make bench``)."""

from __future__ import annotations

import json
import types

from benchmarks import fit as bench_fit


def _run(tmp_path, monkeypatch) -> list[tuple[str, str]]:
    measured: list[tuple[str, str]] = []
    monkeypatch.setattr(bench_fit, "_model", lambda name, cache: b"model")
    monkeypatch.setattr(bench_fit, "from_tflite", lambda data: None)
    monkeypatch.setattr(bench_fit, "profile", lambda graph: types.SimpleNamespace(macs=1))
    monkeypatch.setattr(bench_fit, "predict_instructions", lambda data, core, kernels: types.SimpleNamespace(
        instructions=90))  # (a kept per-layer row takes the predictor's figure of now)

    def per_layer(name, target, *args):
        measured.append((name, bench_fit.PER_LAYER))
        return {"model": name, "target": target, "what": bench_fit.PER_LAYER, "arena": 2, "instructions": 100,
                "predicted_instructions": 80, "instructions_error": -0.2}

    def fitted(name, target, stream, cap, what, *args):
        measured.append((name, what))
        return {"model": name, "target": target, "what": what, "arena": 1}

    monkeypatch.setattr(bench_fit, "_per_layer", per_layer)
    monkeypatch.setattr(bench_fit, "_fitted", fitted)
    o = types.SimpleNamespace(out_dir=str(tmp_path), zoo_cache=None)
    out = bench_fit.fit_section(o, log=lambda s: None, cases=(("m", "cortex-m4", False),), caps=(1.05, None))
    assert [r["what"] for r in out["rows"]] == [bench_fit.PER_LAYER, "fit, max_latency 1.05", "fit, smallest"]
    return measured


def test_rows_of_the_same_search_are_reused(tmp_path, monkeypatch):
    assert len(_run(tmp_path, monkeypatch)) == 3
    assert _run(tmp_path, monkeypatch) == []
    [base] = [r for r in json.loads((tmp_path / "fit" / "rows.json").read_text())["rows"].values()
              if r["what"] == bench_fit.PER_LAYER]  # the measurement kept, its prediction the predictor's now
    assert (base["instructions"], base["predicted_instructions"], base["instructions_error"]) == (100, 90, -0.1)


def test_another_search_keeps_only_the_per_layer_rows(tmp_path, monkeypatch):
    _run(tmp_path, monkeypatch)
    path = tmp_path / "fit" / "rows.json"
    kept = json.loads(path.read_text())
    kept["search"]["plans_under_cap"] = -1  # what an earlier search recorded
    path.write_text(json.dumps(kept))
    assert _run(tmp_path, monkeypatch) == [("m", "fit, max_latency 1.05"), ("m", "fit, smallest")]
