"""Typed results (``tfmcu.records``): a record writes the JSON the files hold and reads it back into an equal record;
a part a run did not produce is left out of the JSON; a key no field declares is refused, unless an ``extra()`` field
keeps it; a flat section, a renamed key, a coded value and an options dataclass keep the file's shape; a file of an
earlier shape reads through ``from_earlier``. The flows' own reports round-trip on real runs in their tests
(test_fit, test_deploy, test_verify, test_rewrite, test_train, test_detection_train)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tfmcu.firmware.run import FirmwareRun, Overflow
from tfmcu.flows.fit import ChosenCandidate, FitCandidate, FitMeasured
from tfmcu.records import Pair, Record, coded, extra, flat, named, optional
from tfmcu.runtime.agreement import Agreement, Mismatch, Tie


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


@dataclass(frozen=True, kw_only=True)
class Options:  # a run's options: a plain dataclass, not a record
    depth: int = 1
    sizes: tuple[int, ...] = (1,)


@dataclass(frozen=True, kw_only=True)
class Section(Record):
    score: float
    options: Options = named("settings")
    best: Part | None = optional(key="best_part")


@dataclass(frozen=True, kw_only=True)
class Other(Record):
    frames: int


@dataclass(frozen=True, kw_only=True)
class Report(Record):
    name: str = "unnamed"  # (files of an earlier version have none)
    when: complex = coded(lambda z: [z.real, z.imag], lambda v: complex(*v))
    section: Section | None = flat()
    other: Other | None = flat()
    files: dict[str, str]
    info: dict[str, int] = extra()


def test_flat_sections_renamed_keys_coded_values_and_extra_keys():
    """A report's section writes its keys into the report's object where it stands; ``named`` / ``optional(key=)``
    rename a key; ``coded`` writes a value its own way; an options dataclass goes as its fields; the keys nobody
    declares go to the ``extra()`` field, after the others."""
    r = Report(name="r", when=1 + 2j, section=Section(score=0.5, options=Options(depth=3, sizes=(2, 4)),
                                                      best=Part(name="p", sizes=(1,))),
               files={"a": "a.json"}, info={"seed": 7})
    d = r.to_json()
    assert d == {"name": "r", "when": [1.0, 2.0], "score": 0.5, "settings": {"depth": 3, "sizes": [2, 4]},
                 "best_part": {"name": "p", "sizes": [1]}, "files": {"a": "a.json"}, "seed": 7}
    assert list(d) == ["name", "when", "score", "settings", "best_part", "files", "seed"]  # the fields' order
    back = Report.from_json(json.loads(json.dumps(d)))
    assert back == r and back.other is None and back.section.options.sizes == (2, 4)
    o = Report(when=0j, other=Other(frames=3), files={})
    assert o.to_json() == {"name": "unnamed", "when": [0.0, 0.0], "frames": 3, "files": {}}
    assert Report.from_json({k: v for k, v in o.to_json().items() if k != "name"}) == o  # the default
    assert Report.from_json({**o.to_json(), "spare": 1}).info == {"spare": 1}
    with pytest.raises(ValueError, match="unknown keys deep"):
        Report.from_json({**d, "settings": {"depth": 1, "deep": 2}})  # options refuse unknown keys too


def test_agreement_reads_a_detectors_earlier_report():
    """train_report.json of a detector counted images (``from_earlier``); reports written before ties were told
    apart read as having none."""
    earlier = {"agree": False, "mismatching_images": 2, "images": 16, "tflite_kernels": "reference"}
    a = Agreement.from_json(earlier)
    assert (a.agree, a.samples, a.mismatching_samples, a.tie_samples, a.first, a.ties) == (False, 16, 2, 0, [], [])
    assert not a.identical and "DISAGREE on 2 images" in a.describe("images")
    tie = Tie(sample=3, op=63, channel=9, value=23.49991, tflite=23, tflm=24)
    b = Agreement.of(20, [Mismatch(sample=3, output=0, max_abs_diff=1.0), Mismatch(sample=5, output=0,
                                                                                   max_abs_diff=4.0)], {3: [tie]})
    assert (b.agree, b.mismatching_samples, b.tie_samples, b.ties, [m.sample for m in b.first]) == (
        False, 1, 1, [tie], [5])
    assert Agreement.from_json(json.loads(json.dumps(b.to_json()))) == b
    assert b.describe() == ("identical on 18 of 20 samples; 1 sample 1 apart by a rounding tie in the FULLY_CONNECTED "
                            "head (expected: docs/pipelines.md#rounding-ties); DISAGREE on 1 sample")


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


def test_fit_parts_round_trip():
    c = FitCandidate(describe="3x3 patches over the first 4 blocks", patches=[3, 3], patch_blocks=4, stages=1,
                     config="halo auto", predicted_arena_bytes=1000, predicted_instructions=None, mac_overhead=0.1,
                     macs=10)
    ch = ChosenCandidate(**{**c.to_json(), "patched": True})
    assert ch.to_json() == {**c.to_json(), "patched": True} and ChosenCandidate.from_json(ch.to_json()) == ch
    m = FitMeasured(arena_used_bytes=None, predicted_arena_bytes=1000, arena_equal=None, invoke_instructions=None,
                    predicted_instructions=None, instructions_error=None, outputs_equal_tflite=False, fits=False,
                    measured_by=None, verdict="does not fit")
    assert FitMeasured.from_json(json.loads(json.dumps(m.to_json()))) == m


DEPLOY_JSON = {  # deploy.json of a firmware run under QEMU (``deploy --run``): the shape the file has
    "tflite": "m.tflite", "target": "stm32f405", "target_what": "STM32F405", "kernels": "cmsis_nn",
    "ops": ["TFMCU_PATCH_STAGE", "CONV_2D"], "custom_mode": True, "patch_stage_ops": 1, "inputs": 2,
    "model_bytes": 32776,
    "arena": {"predicted_bytes": 21652, "predicted_by": "tfmcu.plan.arena", "margin": 0.02, "arena_bytes": 22096,
              "host_measured_bytes": None},
    "stack_bytes": 6144,
    "flash": {"model_bytes": 32776, "inputs_bytes": 13824, "code_estimate_bytes": 196608, "estimated_bytes": 243208,
              "flash_bytes": 1048576, "model_in": "flash", "fits": True, "how": "estimated", "note": None},
    "estimate": {"ram_bytes": 29264, "sram_bytes": 131072, "fits": True, "how": "estimated"},
    "run": {"linked": True, "measured_by": "QEMU netduinoplus2", "sizes": {"flash": 300000, "ram": 30000},
            "allocated": True, "arena_used_bytes": 21652, "stack_hwm_bytes": 2000, "ram_static_bytes": 28000,
            "invoke_insns": [1_000_000, 990_000], "top_class": [3, 1], "problems": [], "outputs_equal_tflite": True},
    "fits": True, "verdict": "fits stm32f405"}


def test_deploy_report_with_a_run_and_fits_comparison():
    """deploy.json with ``run`` reads back typed; fit compares the chosen candidate's predictions with it."""
    from tfmcu.flows import fit
    from tfmcu.flows.deploy import DeployReport

    dep = DeployReport.from_json(DEPLOY_JSON)
    assert dep.to_json() == DEPLOY_JSON and dep.run.instructions == 990_000 and dep.detector is None
    ch = ChosenCandidate(describe="2x2", patches=[2, 2], patch_blocks=3, stages=1, config=None,
                         predicted_arena_bytes=21652, predicted_instructions=1_000_000, mac_overhead=0.0, macs=10,
                         patched=True)
    m = fit.compare(ch, dep)
    assert (m.arena_used_bytes, m.arena_equal, m.invoke_instructions, m.instructions_error) == (21652, True, 990_000,
                                                                                                0.0101)
    assert m.outputs_equal_tflite and m.fits and m.verdict == "fits stm32f405"
    not_run = fit.compare(ch, DeployReport.from_json({k: v for k, v in DEPLOY_JSON.items()
                                                      if k not in ("run", "fits", "verdict")}))
    assert not_run.arena_used_bytes is None and not not_run.fits and not not_run.outputs_equal_tflite


def test_demo_summary_reads_the_typed_mcu_run():
    """The demo's step 6 keeps deploy's and fit's reports typed (``McuRun``); its table reads their attributes."""
    from tfmcu.flows import demo
    from tfmcu.flows.deploy import DeployReport

    per_layer = DeployReport.from_json({**DEPLOY_JSON, "fits": False, "verdict": "does not fit",
                                        "run": {"linked": False, "overflow": {"region": "RAM", "bytes": 4096}}})
    patched = DeployReport.from_json(DEPLOY_JSON)
    ch = ChosenCandidate(describe="2x2", patches=[2, 2], patch_blocks=3, stages=1, config="halo auto",
                         predicted_arena_bytes=21652, predicted_instructions=1_000_000, mac_overhead=0.0, macs=10,
                         patched=True)
    mcu = demo.McuRun(target="stm32f405", images=2, schedule="2x2 patches over 3 blocks, halo auto",
                      per_layer=per_layer, patched=patched,
                      fit=demo.McuFit(message="fits", chosen=ch, per_layer=FitCandidate.from_json(
                          {k: v for k, v in ch.to_json().items() if k != "patched"}), measured=None))
    assert demo.McuRun.from_json(json.loads(json.dumps(mcu.to_json()))) == mcu
    s = {"model": "m", "resolution": 96, "dataset": "d", "train_samples": 1, "epochs": 1, "qat_epochs": 0,
         "qat_steps": 0, "schedule": "2x2", "budget_bytes": 1024,
         "accuracy": {"float": 0.5, "qat": None, "int8_tflite": 0.5, "int8_tflm": 0.5, "keras_test_samples": 1,
                      "int8_test_samples": 1, "float_on_int8_samples": 0.5, "tflite_equals_tflm": True},
         "per_layer": {"analytic_peak_bytes": 1, "tflm_arena_bytes": 2048, "predicted_arena_bytes": 2048,
                       "flash_bytes": 1, "macs": 1, "ops": 1},
         "patched": {"analytic_peak_bytes": 1, "tflm_arena_bytes": 512, "predicted_arena_bytes": 512,
                     "flash_bytes": 1, "macs_exact": 1, "macs_padded": 1, "mac_overhead_exact": 0.0,
                     "mac_overhead_padded": 0.0, "ops": 1},
         "verify": {"bit_exact": True, "samples": 1, "real": 0}, "mcu": mcu.to_json(), "wall_s": 1.0}
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:4]]
            for ln in demo.summary_table(s).splitlines() if ln.startswith("| stm32f405")}
    assert rows["stm32f405 (QEMU), verdict"] == ["does not fit (link: RAM overflowed by 4,096 B)",
                                                 "fits, 2x2 patches over 3 blocks, halo auto"]
    assert rows["stm32f405 (QEMU), TFLM arena: predicted / measured"] == ["21.1 kB / -", "21.1 kB / 21.1 kB (fit)"]
    assert rows["stm32f405 (QEMU), instructions per inference (CMSIS-NN)"] == ["-", "1.0M"]
