"""``verify``: a rewritten .tflite against its original, bit for bit, with TFLM's arena (``pipelines.verify``).

Both models run on the same inputs (``samples`` seeded random ones, ``tfmcu.runtime.model_io.random_inputs``, plus
the real ones of ``inputs``: a .npy of shape (N, ...) for a single-input model, float data being quantized with the
input's scale and zero point; a .npz with one such array per input, named ``arr_0``... or by input name) in TF Lite
(reference kernels by default, the ones TFLM's are ported from; ``resolver="builtin"`` for the optimized ones) and in
the TFLM interpreter of the tflite-micro wheel, each model in its own child process (an interpreter that aborts
cannot take the caller down). The rewritten model's outputs must equal the original's bit for bit in both
interpreters. TF Lite against TFLM is reported per model too (``tfmcu.runtime.agreement``, informational), each
difference classified: a rounding tie in the FULLY_CONNECTED head (TF Lite's reference kernel rounds once with the
float scales, TFLM's twice with a fixed-point multiplier, so an output within rounding of a half comes out 1 apart;
which inputs meet one depends on the model's bytes) is proven on the original by recomputing its head, and is the
rewritten model's too on a sample where it gives the original's outputs in both interpreters; any other difference
is a mismatch. One exception to bit for bit: where TF Lite and TFLM round the original's head apart and a
custom-mode model's TF Lite side gives TFLM's bytes (its classifier runs in our kernels, bit-exact with TFLM's:
``tfmcu.stage.custom.convs_to_flash``), the sample is listed under ``tflm_semantics``, not as a mismatch. TFLM's
arena is measured
(``tfmcu.runtime.tflm.measure_arena``) and predicted (``tfmcu.plan.arena.predict_arena``) for both. ``verify``
returns a ``VerifyReport`` (``--json_out`` is its ``to_json()``).

A rewritten model in custom mode (``TFMCU_PATCH_STAGE`` ops: the patch stage, and with ``rewrite
--rest_convs=tfmcu`` one more per convolution of the rest) runs WHOLE in TFLM built from source with our kernel
(``tfmcu.runtime.tflm_host``): its arena is TFLM's measured ``arena_used_bytes`` there, predicted by the same
``predict_arena``. In TF Lite (no kernel for the op) every such op runs in the C kernels (ctypes) and the builtin
ops between them in TF Lite (``tfmcu.runtime.host.HostRunner``). A model whose stage streams its input (``rewrite
--stream_input``: its input is a one-element placeholder) takes the original's samples as its images: both sides
feed their rows through an input provider that checks the contract (rows in increasing order, each at most once),
and the report has the rows each sample read (``streamed_input``).

A detector (its outputs those of TFLite_Detection_PostProcess: ``tfmcu.tflite.detection_postprocess``) is compared
on those four outputs, boxes, classes, scores and the number of detections, bit for bit as any output; the op leaves
the entries past ``num_detections`` as the arena held them, so every runner zeroes them first (``canonical_outputs``).
The report's ``detector`` adds the detections per sample in each model and interpreter and the largest box
difference between the two models (0.0 when bit-exact).

Bad input (missing file, not a TFLite model, signatures that differ, bad ``inputs``, a malformed custom-mode model,
an interpreter crash) is a one-line ``UsageError`` and no output file.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tfmcu.errors import UsageError
from tfmcu.files import check_output_paths, write_outputs
from tfmcu.flows.common import ArenaFigures
from tfmcu.graph.ir import GraphError
from tfmcu.plan.arena import predict_model_arena
from tfmcu.records import Pair, Record
from tfmcu.runtime.agreement import HOW as TIES, Agreement, Mismatch, Tie, compare, same_outputs
from tfmcu.runtime.agreement import rounding_ties as proven_ties
from tfmcu.runtime.host import evaluate, host_model
from tfmcu.runtime.model_io import TFLMError, load_inputs, random_inputs, read_model
from tfmcu.runtime.tflite import RESOLVERS
from tfmcu.runtime.tflm import check_runnable
from tfmcu.runtime.tflm_host import MEASURED_BY, streamed_image
from tfmcu.tflite.detection_postprocess import OUTPUT_NAMES, detections, postprocess_outputs
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP
from tfmcu.tflite.model import TfliteModel


ROLES = ("original", "rewritten")


@dataclass(frozen=True, kw_only=True)
class Mismatches(Record):
    count: int  # sample x interpreter pairs
    samples: int
    first: list[Mismatch]


@dataclass(frozen=True, kw_only=True)
class TflmSemantics(Record):
    """Samples on which TF Lite and TFLM round the ORIGINAL's head apart (a proven tie) and the rewritten model's TF
    Lite side gives TFLM's bytes (its classifier runs in our kernels, bit-exact with TFLM's): not mismatches."""

    samples: int
    first: list[Mismatch]


@dataclass(frozen=True, kw_only=True)
class ImageShape(Record):
    shape: list[int]
    dtype: str


@dataclass(frozen=True, kw_only=True)
class StreamedInput(Record):
    """A rewritten model that streams its input: the image, and the rows each sample read on each side."""

    image: ImageShape
    rows_read: dict[str, list[int]] | None  # per side: "tflite" (the C executor) and "tflm"
    image_rows: int
    how: str


@dataclass(frozen=True, kw_only=True)
class DetectorCheck(Record):
    """A detector's comparison: the detections per sample in each model and interpreter, the largest box
    difference between the two models (0.0 when bit-exact)."""

    outputs: list[str]
    compared: str
    detections_per_sample: Pair[dict[str, list[int]]]
    max_box_abs_diff: float


@dataclass(frozen=True, kw_only=True)
class VerifyReport(Record):
    """What ``verify`` found (its ``--json_out``)."""

    bit_exact: bool
    samples: int
    random_samples: int
    input_samples: int
    seed: int
    inputs: str | None
    resolver: str
    interpreters: Pair[dict[str, str]]
    models: Pair[str]
    mismatches: Mismatches
    tflm_semantics: TflmSemantics
    tflite_vs_tflm: Pair[Agreement]
    tflm: Pair[ArenaFigures]  # measured
    arena_kind: Pair[str]
    predicted: Pair[ArenaFigures]
    custom_mode: Pair[dict[str, Any]]  # a custom-mode model's kernel figures (``tfmcu.runtime.tflm_host``)
    streamed_input: StreamedInput | None
    flash_bytes: Pair[int]
    ops: Pair[int]
    detector: DetectorCheck | None


def check_signatures(infos: dict[str, Any]) -> None:
    a, b = infos["original"], infos["rewritten"]
    for kind in ("inputs", "outputs"):
        ta, tb = getattr(a, kind), getattr(b, kind)
        if len(ta) != len(tb):
            raise UsageError(f"signature mismatch: the original has {len(ta)} {kind}, the rewritten model "
                                  f"{len(tb)}")
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x.signature != y.signature:
                raise UsageError(f"signature mismatch: {kind[:-1]} {k} is {x.label} in the original, "
                                      f"{y.label} in the rewritten model")


def _as_tflm(results: dict[str, Any], sample: int) -> bool:
    """Whether, on ``sample``, the rewritten model's TF Lite side equals the original in TFLM (every output) and the
    rewritten model in TFLM does too (the caller knows that TF Lite and TFLM round the original's head apart)."""
    orig, new = results["original"], results["rewritten"]
    return same_outputs(new.tflite[sample], orig.tflm[sample]) and same_outputs(new.tflm[sample], orig.tflm[sample])


def rounding_ties(results: dict[str, Any], data: dict[str, Any], samples: list[Any], o: "VerifyOptions",
                  paths: dict[str, str]) -> dict[str, dict[int, list[Tie]]]:
    """Per model, the samples whose TF Lite / TFLM difference is rounding ties (``tfmcu.runtime.agreement``: in the
    head, or of an op the two requantize apart): the original's proven on the original (in a child process); the rewritten
    model's, the original's tie on a sample where it gives the original's outputs in both interpreters."""
    orig, new = results["original"], results["rewritten"]
    differ = any(not same_outputs(a, b) for a, b in zip(orig.tflite, orig.tflm))
    ties = (proven_ties(data["original"], samples, orig.tflite, orig.tflm, o.resolver, where=paths["original"],
                        isolate=True) if differ else {})
    kept = {s: t for s, t in ties.items()
            if same_outputs(new.tflite[s], orig.tflite[s]) and same_outputs(new.tflm[s], orig.tflm[s])}
    return {"original": ties, "rewritten": kept}


def detector_report(results: dict[str, Any], where: dict[str, Any]) -> DetectorCheck | None:
    """For detectors (``where``: per role, ``postprocess_outputs``): the detections per sample in each model and
    interpreter, and the largest box difference between the two models; None when the original is no detector."""
    if where["original"] is None or where["rewritten"] is None:
        return None
    counts = {r: {k: [len(detections(o, where[r])) for o in getattr(results[r], k)] for k in ("tflite", "tflm")}
              for r in ROLES}
    diff = 0.0
    for k in ("tflite", "tflm"):
        for a, b in zip(getattr(results["original"], k), getattr(results["rewritten"], k)):
            u, v = a[where["original"][0]], b[where["rewritten"][0]]
            if u.shape == v.shape:
                diff = max(diff, float(np.max(np.abs(u.astype(np.float64) - v.astype(np.float64)), initial=0.0)))
    return DetectorCheck(outputs=list(OUTPUT_NAMES),
                         compared="the four outputs of TFLite_Detection_PostProcess, bit for bit, entries past "
                                  "num_detections zeroed in every runner (the op leaves them unwritten)",
                         detections_per_sample=Pair(**counts), max_box_abs_diff=diff)


def stage_ops(info: Any) -> int:
    """How many TFMCU_PATCH_STAGE operators the model has."""
    return sum(name == f"custom:{PATCH_STAGE_OP}" for name in info.op_names)


def predict(data: TfliteModel | bytes, where: str) -> ArenaFigures:
    try:
        p = predict_model_arena(data, name=os.path.basename(where))
    except GraphError as e:
        return ArenaFigures(arena_total_bytes=None, error=str(e).splitlines()[0])
    return dataclasses.replace(ArenaFigures.of(p), unmodelled_ops=p.details.get("unmodelled_ops") or None)


@dataclass
class VerifyOptions:
    original: str
    rewritten: str
    samples: int = 200  # seeded random inputs
    seed: int = 0
    inputs: str | None = None  # real inputs: .npy (single input) or .npz
    resolver: str = "reference"  # TF Lite kernels
    json_out: str | None = None
    max_details: int = 5
    quiet: bool = False


def validate(o: VerifyOptions) -> None:
    if o.resolver not in RESOLVERS:
        raise UsageError(f"--resolver={o.resolver}: expected one of {', '.join(RESOLVERS)}")
    if o.samples < 0:
        raise UsageError(f"--samples={o.samples}: must be >= 0")
    if o.samples == 0 and not o.inputs:
        raise UsageError("nothing to compare: --samples=0 and no --inputs")
    check_output_paths({"--json_out": o.json_out})


def verify(o: VerifyOptions) -> VerifyReport:
    """Run both models on the same inputs in TF Lite and TFLM (each in its own child process) and compare; returns
    the report (see the module docstring)."""
    validate(o)
    paths = {"original": o.original, "rewritten": o.rewritten}
    data = {r: read_model(paths[r]) for r in ROLES}  # each file parsed once, shared by every step below
    infos = {}
    custom = {}
    for r in ROLES:
        try:
            infos[r], runner = host_model(data[r], paths[r])
            custom[r] = runner is not None
            if not custom[r]:
                check_runnable(infos[r], paths[r])
        except TFLMError as e:
            raise UsageError(str(e)) from None
    if custom["original"]:
        raise UsageError(f"{paths['original']}: the original must be a model stock TFLM runs, not a custom-mode model")
    streamed = streamed_image(data["rewritten"])
    check_signatures(infos)
    where = {r: postprocess_outputs(data[r].flatbuffer) for r in ROLES}
    if where["original"] is not None and where["rewritten"] is None:
        raise UsageError(f"{paths['rewritten']}: the original is a detector (its outputs are those of "
                         f"TFLite_Detection_PostProcess), the rewritten model is not")
    detector = where if where["original"] is not None else None
    samples = random_inputs(data["original"], o.samples, o.seed) if o.samples else []
    real = load_inputs(o.inputs, infos["original"]) if o.inputs else []
    if not samples and not real:
        raise UsageError("nothing to compare: --samples=0 and no --inputs")
    all_samples = samples + real

    def job(role: str) -> Any:
        return evaluate(data[role], all_samples, o.resolver, paths[role], isolate=True)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = dict(zip(ROLES, pool.map(job, ROLES)))
    except TFLMError as e:
        raise UsageError(str(e)) from None

    interpreters = {"tflite": f"tflite-{o.resolver}", "tflm": "tflm"}
    ties = rounding_ties(results, data, all_samples, o, paths)
    agreement = {r: Agreement.of(len(all_samples), compare(results[r].tflite, results[r].tflm), ties[r], o.resolver,
                                 o.max_details) for r in ROLES}
    mismatches: list[Mismatch] = []
    tflm_bytes: list[Mismatch] = []
    for key, label in interpreters.items():
        for m in compare(getattr(results["original"], key), getattr(results["rewritten"], key)):
            m = dataclasses.replace(m, interpreter=label)
            tied = m.sample in ties["original"]
            if key == "tflite" and custom["rewritten"] and tied and _as_tflm(results, m.sample):
                tflm_bytes.append(m)  # the rewritten model's classifier computes TFLM's bytes (see below)
            else:
                mismatches.append(m)
    mismatches.sort(key=lambda m: (m.sample, m.interpreter))

    def located(m: Mismatch) -> Mismatch:
        pos = None if detector is None else detector["original"]
        return dataclasses.replace(m, source="random" if m.sample < len(samples) else "inputs",
                                   output_name=OUTPUT_NAMES[pos.index(m.output)] if pos and m.output in pos else None)

    mismatches = [located(m) for m in mismatches]
    det = detector_report(results, detector) if detector is not None else None
    return VerifyReport(
        bit_exact=not mismatches, samples=len(all_samples), random_samples=len(samples), input_samples=len(real),
        seed=o.seed, inputs=o.inputs, resolver=o.resolver,
        interpreters=Pair(**{r: ({"tflite": f"{interpreters['tflite']} ({PATCH_STAGE_OP} ops: tfmcu C kernels)",
                                  "tflm": "tflm built from source + TFMCU_PATCH_STAGE kernel (whole model)"}
                                 if custom[r] else interpreters) for r in ROLES}),
        models=Pair(**paths),
        mismatches=Mismatches(count=len(mismatches), samples=len({m.sample for m in mismatches}),
                              first=mismatches[:o.max_details]),
        # samples on which TF Lite and TFLM round the ORIGINAL's FULLY_CONNECTED head apart (a proven tie) and the
        # rewritten model's TF Lite side gives TFLM's bytes: its classifier runs in our kernels, bit-exact with
        # TFLM's, the deployment's interpreter (not a mismatch)
        tflm_semantics=TflmSemantics(samples=len(tflm_bytes), first=tflm_bytes[:o.max_details]),
        tflite_vs_tflm=Pair(**agreement),
        tflm=Pair(**{r: ArenaFigures.of(results[r].arena) for r in ROLES}),
        arena_kind=Pair(**{r: (MEASURED_BY if custom[r] else "measured by TFLM (tflite-micro wheel)") for r in ROLES}),
        predicted=Pair(**{r: predict(data[r], paths[r]) for r in ROLES}),
        custom_mode=Pair(**{r: {**results[r].arena.custom, "patch_stage_ops": stage_ops(infos[r])}
                            for r in ROLES if custom[r]}),
        streamed_input=None if streamed is None else StreamedInput(
            image=ImageShape(shape=list(streamed[0]), dtype=streamed[1]),
            rows_read=results["rewritten"].streamed_rows_read,  # per sample, TF Lite side (C executor) and TFLM
            image_rows=int(streamed[0][0]),
            how="the image rows fed through a TfmcuInputProvider that checks the contract (rows in increasing "
                "order, each at most once): tfmcu_stage_run_streamed through ctypes on the TF Lite side, the host "
                "runner's --stream_input in TFLM"),
        flash_bytes=Pair(**{r: len(data[r]) for r in ROLES}),
        ops=Pair(**{r: infos[r].num_ops for r in ROLES}),
        detector=det)


def run(o: VerifyOptions, log: Callable[[str], None] = print) -> int:
    """``verify`` + the JSON report + the summary; the exit status (0 bit-exact, 1 a mismatch)."""
    rep = verify(o)
    write_outputs({o.json_out: rep.to_json()})
    if not o.quiet:
        log(format_summary(rep).rstrip())
    return 0 if rep.bit_exact else 1


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def format_summary(rep: VerifyReport) -> str:
    lines = []
    o, w = rep.models.original, rep.models.rewritten
    lines.append(f"verify: {o} ({rep.ops.original} ops) vs {w} ({rep.ops.rewritten} ops)")
    src = f"{rep.random_samples} random (seed {rep.seed})"
    if rep.input_samples:
        src += f" + {rep.input_samples} from {rep.inputs}"
    lines.append(f"samples: {src}; TF Lite kernels: {rep.resolver}")
    mm = rep.mismatches
    if rep.bit_exact:
        lines.append(f"outputs: BIT-EXACT in TF Lite and TFLM ({rep.samples} samples)")
    else:
        first = mm.first[0]
        lines.append(f"outputs: MISMATCH in {mm.samples} of {rep.samples} samples ({mm.count} sample x "
                     f"interpreter pairs; first: sample {first.sample} in {first.interpreter}, max abs diff "
                     f"{first.max_abs_diff})")
    sides = [(r, getattr(rep.tflite_vs_tflm, r)) for r in ROLES]
    lines.append("TF Lite == TFLM: " + ", ".join(
        f"{r} " + ("yes" if a.identical else f"yes but {a.tie_samples} rounding ties" if a.agree
                   else f"NO ({a.mismatching_samples} samples)") for r, a in sides))
    if any(a.tie_samples for _, a in sides):
        lines.append(f"rounding ties (expected): {TIES}")
    det = rep.detector
    if det:
        found = det.detections_per_sample.original["tflite"]
        lines.append(f"detector: {', '.join(det.outputs)} compared (entries past num_detections zeroed); "
                     f"{sum(found)} detections in {len(found)} samples (original, TF Lite); largest box difference "
                     f"between the models {det.max_box_abs_diff:g}")
    rows = [("TFLM arena total", rep.tflm, "arena_total_bytes"), ("TFLM arena head", rep.tflm, "arena_head_bytes"),
            ("TFLM arena tail", rep.tflm, "arena_tail_bytes"),
            ("predicted total", rep.predicted, "arena_total_bytes"),
            ("predicted head", rep.predicted, "arena_head_bytes"),
            ("predicted tail", rep.predicted, "arena_tail_bytes")]
    lines.append(f"{'bytes':<18} {'original':>12} {'rewritten':>12}")
    for label, pair, figure in rows:
        lines.append(f"{label:<18} {_n(getattr(pair.original, figure)):>12} "
                     f"{_n(getattr(pair.rewritten, figure)):>12}")
    lines.append(f"{'flash (file)':<18} {_n(rep.flash_bytes.original):>12} {_n(rep.flash_bytes.rewritten):>12}")
    lines.append(f"{'ops':<18} {rep.ops.original:>12} {rep.ops.rewritten:>12}")
    for r in ROLES:
        c = getattr(rep.custom_mode, r)
        if c is not None:
            n = c.get("patch_stage_ops", 1)
            ops = f"{n} {PATCH_STAGE_OP} ops" if n > 1 else f"the {PATCH_STAGE_OP} kernel"
            lines.append(f"{r}: custom mode, whole model in TFLM built from source with {ops} (op data: "
                         f"{c['patch_stage_persistent_bytes']:,} B); arena measured there; in TF Lite, every "
                         f"{PATCH_STAGE_OP} op in tfmcu's C kernels")
    s = rep.streamed_input
    if s:
        read = s.rows_read or {}
        per = ", ".join(f"{side} {'/'.join(map(str, sorted(set(v))))}" for side, v in read.items())
        lines.append(f"rewritten: input streamed ({s.image.dtype}{s.image.shape} images fed row by row "
                     f"through a TfmcuInputProvider checking the contract): rows read per sample: {per} of "
                     f"{s.image_rows}")
    return "\n".join(lines) + "\n"
