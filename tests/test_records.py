"""Typed results (``tfmcu.records``): a record writes the JSON the files hold and reads it back into an equal record;
a part a run did not produce is left out of the JSON; a key no field declares is refused. The flows' own reports
round-trip on real runs in their tests (test_fit, test_deploy, test_verify, test_rewrite)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tfmcu.files import write_outputs
from tfmcu.firmware.run import FirmwareRun, Overflow
from tfmcu.flows.fit import ChosenCandidate, FitCandidate, FitMeasured
from tfmcu.records import Pair, Record, optional


@dataclass(frozen=True, kw_only=True)
class Part(Record):
    name: str
    sizes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Whole(Record):
    parts: list[Part]
    by_name: dict[str, Part]
    pair: Pair[Part]
    counts: Pair[int]
    note: str | None = optional()
    maybe: Part | None = None


def test_nested_records_round_trip_and_optional_fields_are_left_out():
    p, q = Part(name="a", sizes=(1, 2)), Part(name="b", sizes=())
    w = Whole(parts=[p, q], by_name={"a": p}, pair=Pair(original=p), counts=Pair(original=1, rewritten=2))
    d = w.to_json()
    assert d == {"parts": [{"name": "a", "sizes": [1, 2]}, {"name": "b", "sizes": []}],
                 "by_name": {"a": {"name": "a", "sizes": [1, 2]}}, "pair": {"original": {"name": "a", "sizes": [1, 2]}},
                 "counts": {"original": 1, "rewritten": 2}, "maybe": None}  # no "note", no pair.rewritten
    back = Whole.from_json(json.loads(json.dumps(d)))
    assert back == w and isinstance(back.pair.original, Part) and back.parts[0].sizes == (1, 2)
    assert Whole.from_json({**d, "note": "n"}).note == "n"


def test_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="unknown keys extra"):
        Part.from_json({"name": "a", "sizes": [], "extra": 1})
    with pytest.raises(ValueError, match="expected a JSON object"):
        Whole.from_json({"parts": [1], "by_name": {}, "pair": {}, "counts": {}})


def test_firmware_run_keeps_the_shape_of_each_outcome():
    """deploy.json's ``run``: a link overflow has only ``overflow``; an arena TFLM found too small has the run's
    figures and the bytes it missed; a run that fits has ``outputs_equal_tflite``."""
    overflow = FirmwareRun(linked=False, overflow=Overflow(region="RAM", bytes=1234))
    assert overflow.to_json() == {"linked": False, "overflow": {"region": "RAM", "bytes": 1234}}
    figures = dict(linked=True, measured_by="QEMU", sizes={"flash": 1}, allocated=False, arena_used_bytes=None,
                   stack_hwm_bytes=None, ram_static_bytes=None, invoke_insns=[], top_class=None, problems=[])
    short = FirmwareRun(**figures, tflm_missing_bytes=None)
    assert short.to_json() == {**figures, "tflm_missing_bytes": None}
    fits = FirmwareRun(**{**figures, "allocated": True, "arena_used_bytes": 100, "invoke_insns": [7, 5, None]},
                       outputs_equal_tflite=True, streamed_rows_read=[48, 48])
    assert fits.to_json()["outputs_equal_tflite"] is True and "tflm_missing_bytes" not in fits.to_json()
    assert fits.instructions == 5 and overflow.instructions is None
    for run in (overflow, short, fits):
        assert FirmwareRun.from_json(json.loads(json.dumps(run.to_json()))) == run


def test_fit_parts_round_trip_and_records_inside_json_data(tmp_path):
    c = FitCandidate(describe="3x3 patches over the first 4 blocks", patches=[3, 3], patch_blocks=4, stages=1,
                     config="halo auto", predicted_arena_bytes=1000, predicted_instructions=None, mac_overhead=0.1,
                     macs=10)
    ch = ChosenCandidate(**{**c.to_json(), "patched": True})
    assert ch.to_json() == {**c.to_json(), "patched": True} and ChosenCandidate.from_json(ch.to_json()) == ch
    m = FitMeasured(arena_used_bytes=None, predicted_arena_bytes=1000, arena_equal=None, invoke_instructions=None,
                    predicted_instructions=None, instructions_error=None, outputs_equal_tflite=False, fits=False,
                    measured_by=None, verdict="does not fit")
    assert FitMeasured.from_json(m.to_json()) == m
    write_outputs({str(tmp_path / "s.json"): {"chosen": ch, "measured": m}})  # typed results inside JSON data
    assert json.loads((tmp_path / "s.json").read_text()) == {"chosen": ch.to_json(), "measured": m.to_json()}
