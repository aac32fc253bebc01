"""A per-op profile of one Invoke on the target (``deploy --run --profile``, ``fit --run --profile``).

The firmware is built in per-op mode (``-DTFMCU_PROFILE_OPS``, tflm_patch_kernels/tflm/firmware_main.cc): its first
Invoke's ops each run between the instruction-count plugin's markers, and the plugin (tools/qemu/insn_count.c,
``segments=``) writes the per-address counts of every stretch between two markers. Each op's stretch is exactly its
instructions, address by address: summed per function (``nm -S`` of the ELF), and with the core's instruction
timings an estimate of its cycles (``tfmcu.firmware.cycles`` where available). Per op: its MACs (the latency
predictor's features: a patch stage's with its recompute), its measured instructions against the predictor's, its
share of the Invoke, instructions per MAC, and the functions it ran. The ops' instructions sum to the profiled
Invoke's less the interpreter's own between the ops (``between_ops``), markers included.

``op_profile(...)`` builds it from one run; ``table`` prints it; ``plot`` draws where the time goes.
"""

from __future__ import annotations

import bisect
import subprocess
from dataclasses import dataclass
from typing import Any

from tfmcu.errors import TfmcuError
from tfmcu.files import figure_png
from tfmcu.firmware import cycles
from tfmcu.plan import latency
from tfmcu.records import Record, optional

TOP_FUNCTIONS = 4  # the functions an op's row names, the most instructions first


class ProfileError(TfmcuError):
    """The per-op profile could not be read from the run (one line)."""


@dataclass(frozen=True, kw_only=True)
class FunctionCost(Record):
    function: str
    instructions: int


@dataclass(frozen=True, kw_only=True)
class LayerCost(Record):
    """A layer inside a patch stage: its share of the stage's measured instructions as the latency predictor splits
    the stage (``tfmcu.plan.latency.stage_split``): an estimate, scaled so the stage's parts sum to its count."""

    layer: int
    type: str
    macs: int
    instructions: int  # estimated split of the measured stage


@dataclass(frozen=True, kw_only=True)
class OpCost(Record):
    """One operator of the profiled Invoke: measured instructions (QEMU's plugin), the rest derived or predicted."""

    op: int  # operator index in the model
    type: str  # TFLM's tag (CONV_2D, TFMCU_PATCH_STAGE, ...)
    macs: int
    instructions: int  # measured
    predicted_instructions: int  # tfmcu.plan.latency
    share: float  # of the ops' instructions
    instructions_per_mac: float | None  # None: an op without MACs
    functions: list[FunctionCost]  # the functions it ran, the most instructions first (at most TOP_FUNCTIONS)
    cycles: int | None = optional()  # estimated (``OpProfile.cycles_by``)
    ms: float | None = optional()  # cycles at the board's clock
    # a patch stage: its layers and the executor's own part (per patch, caches, streamed rows), split as estimated
    layers: list[LayerCost] | None = optional()
    executor_instructions: int | None = optional()


@dataclass(frozen=True, kw_only=True)
class OpProfile(Record):
    target: str
    core: str
    clock_hz: int | None  # the board's clock (boards.json), for ms
    measured_by: str
    invoke_instructions: int  # the profiled Invoke, the markers' few instructions per op included
    between_ops: int  # the Invoke's instructions outside its ops (TFLM's interpreter loop, the markers' calls)
    ops: list[OpCost]
    cycles_by: str | None = optional()  # how the cycles are estimated (None: not estimated)


# --------------------------------------------------------------------------------------------- the plugin's file
def read_segments(path: str) -> list[tuple[str, int, dict[int, int]]]:
    """The plugin's segments file (insn_count.c ``segments=``): per stretch between markers, the kind of the marker
    that ends it (B, E; X at exit), the depth of open regions before that marker, and {address: count}."""
    out: list[tuple[str, int, dict[int, int]]] = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("S "):
                    _, _, kind, depth = line.split()
                    out.append((kind, int(depth), {}))
                elif line.strip():
                    pc, n = line.split()
                    out[-1][2][int(pc, 16)] = int(n)
    except (OSError, ValueError, IndexError) as e:
        raise ProfileError(f"{path}: not the plugin's segments file ({type(e).__name__}: {e})") from None
    return out


def op_stretches(segments: list[tuple[str, int, dict[int, int]]], n_ops: int) -> list[dict[int, int]]:
    """The first Invoke's ops, each its {address: count}: the per-op firmware opens the Invoke's region (depth 0 ->
    1) and one region per op inside it (depth 1 -> 2), so each op is the stretch its end marker closes at depth 2."""
    ops = [counts for kind, depth, counts in segments if kind == "E" and depth == 2][:n_ops]
    if len(ops) != n_ops:
        raise ProfileError(f"the plugin's segments hold {len(ops)} op regions, the firmware profiled {n_ops} ops")
    return ops


def symbols(elf: str, cxxfilt: str = "arm-none-eabi-c++filt") -> tuple[list[int], list[tuple[int, int, str]]]:
    """The ELF's sized code symbols (``tfmcu.firmware.cycles.function_symbols``) as (their starts, [(start, end,
    short name)]) sorted by address: C++ names demangled (``c++filt``) and cut to the function's own name
    (``short_name``)."""
    syms = cycles.function_symbols(elf)
    try:
        names = subprocess.run([cxxfilt], input="\n".join(s.name for s in syms), check=True, capture_output=True,
                               text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = [s.name for s in syms]  # (mangled names: still one per function)
    if len(names) != len(syms):
        names = [s.name for s in syms]
    spans = sorted((s.address, s.address + s.size, short_name(n)) for s, n in zip(syms, names))
    return [sp[0] for sp in spans], spans


def short_name(name: str) -> str:
    """A demangled symbol as a function's name: no namespaces, template or call arguments, nor GCC's clone suffixes
    (``tflite::(anonymous namespace)::EvalQuantizedPerChannel(...)`` -> ``EvalQuantizedPerChannel``,
    ``tfmcu_logistic_s8.part.0`` -> ``tfmcu_logistic_s8``)."""
    name = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].split(" [clone")[0]
    return name.rsplit("::", 1)[-1].split(".")[0]


def by_function(counts: dict[int, int], syms: tuple[list[int], list[tuple[int, int, str]]]) -> list[FunctionCost]:
    """{address: count} summed per function, the most instructions first ("?" outside every sized symbol)."""
    los, spans = syms
    totals: dict[str, int] = {}
    for pc, n in counts.items():
        k = bisect.bisect_right(los, pc) - 1
        name = spans[k][2] if k >= 0 and pc < spans[k][1] else "?"
        totals[name] = totals.get(name, 0) + n
    return [FunctionCost(function=f, instructions=n) for f, n in sorted(totals.items(), key=lambda kv: -kv[1])]


# --------------------------------------------------------------------------------------------- the profile
def op_profile(model: Any, run: Any, segments_path: str, elf: str, target: Any, kernels: str,
               measured_by: str) -> OpProfile:
    """The per-op profile of ``run`` (``tfmcu.firmware.run.FirmwareRun`` of a per-op firmware) of ``model``
    (.tflite bytes or ``TfliteModel``) on ``target``: its ops' measured instructions and per-address counts (the
    plugin's ``segments_path``), MACs and predictions from ``tfmcu.plan.latency``, cycles estimated where the core's
    timings are known."""
    if not run.op_insns or not run.op_tags:
        raise ProfileError("the run has no per-op counts (a firmware built without -DTFMCU_PROFILE_OPS?)")
    feats = latency.op_features(model)
    if len(feats) != len(run.op_insns):
        raise ProfileError(f"the firmware profiled {len(run.op_insns)} ops, the model has {len(feats)}")
    stretches = op_stretches(read_segments(segments_path), len(run.op_insns))
    for i, (counts, n) in enumerate(zip(stretches, run.op_insns)):
        if sum(counts.values()) != n:
            raise ProfileError(f"op {i}: the plugin's addresses sum to {sum(counts.values()):,} instructions, its "
                               f"region to {n:,}")
    pred = latency.predict_instructions(model, target.core, kernels).per_op
    coef = latency.coefficients(target.core, kernels)
    syms = symbols(elf)
    estimate = _cycles_estimator(elf, target.core)
    total = sum(run.op_insns)
    clock = getattr(target, "clock_hz", None)
    ops = []
    for i, (f, tag, n, counts, p) in enumerate(zip(feats, run.op_tags, run.op_insns, stretches, pred)):
        macs = int(round(sum(lf.get("macs", 0.0) for lf in f["layers"]) if "layers" in f else f.get("macs", 0.0)))
        cycles = estimate(counts) if estimate else None
        layers = executor = None
        if "layers" in f:
            layers, executor = _split(f, coef, kernels, n)
        ops.append(OpCost(op=i, type=tag, macs=macs, instructions=n, predicted_instructions=p["instructions"],
                          share=n / total if total else 0.0,
                          instructions_per_mac=n / macs if macs else None,
                          functions=by_function(counts, syms)[:TOP_FUNCTIONS], cycles=cycles,
                          ms=(1000.0 * cycles / clock) if cycles is not None and clock else None,
                          layers=layers, executor_instructions=executor))
    invoke = (run.invoke_insns or [0])[0] or 0
    return OpProfile(target=target.name, core=target.core, clock_hz=clock, measured_by=measured_by,
                     invoke_instructions=invoke, between_ops=invoke - total, ops=ops,
                     cycles_by=estimate.what if estimate else None)


def _split(f: dict[str, Any], coef: dict[str, Any], kernels: str, measured: int) -> tuple[list[LayerCost], int]:
    """A stage's ``measured`` instructions split over its layers and the executor as the predictor splits it."""
    parts, rest = latency.stage_split(f, coef, kernels)
    scale = measured / max(sum(parts) + rest, 1.0)
    layers = [LayerCost(layer=k, type=lf["type"], macs=int(round(lf.get("macs", 0.0))),
                        instructions=int(round(c * scale))) for k, (lf, c) in enumerate(zip(f["layers"], parts))]
    return layers, measured - sum(x.instructions for x in layers)


@dataclass(frozen=True)
class _Cycles:
    """{address: count} -> estimated cycles on one core (``tfmcu.firmware.cycles``), the ELF's code read once."""

    code: list[tuple[int, bytes]]
    core: str
    what: str

    def __call__(self, counts: dict[int, int]) -> int:
        return int(round(cycles.estimate_code_cycles(self.code, counts, self.core).cycles))


def _cycles_estimator(elf: str, core: str) -> _Cycles | None:
    """The cycle estimator of ``core`` for ``elf`` (None when no timing table covers the core)."""
    if core not in cycles.TIMINGS:
        return None
    timing = cycles.core_timing(core)
    what = ("tfmcu.firmware.cycles: each executed instruction decoded and priced by the "
            + ("estimated " if timing.estimate else "") + f"{core} timing table ({timing.source})")
    return _Cycles(cycles.code_sections(elf), core, what)


# --------------------------------------------------------------------------------------------- reports
def table(p: OpProfile) -> str:
    """The profile as a text table, one row per op, and the Invoke's total."""
    cyc = p.cycles_by is not None
    head = (f"{'op':>4} {'type':<22} {'MACs':>12} {'instructions':>14} {'predicted':>14} {'share':>7} "
            f"{'instr/MAC':>9}" + (f" {'est. cycles':>13} {'ms':>9}" if cyc else "") + "  functions")
    lines = [head]
    for o in p.ops:
        ipm = f"{o.instructions_per_mac:9.2f}" if o.instructions_per_mac is not None else f"{'-':>9}"
        extra = (f" {o.cycles or 0:>13,} {o.ms if o.ms is not None else 0:9.3f}" if cyc else "")
        funcs = ", ".join(f"{fc.function} {100 * fc.instructions / max(o.instructions, 1):.0f}%"
                          for fc in o.functions[:2])
        lines.append(f"{o.op:>4} {o.type[:22]:<22} {o.macs:>12,} {o.instructions:>14,} "
                     f"{o.predicted_instructions:>14,} {100 * o.share:6.1f}% {ipm}{extra}  {funcs}")
        for lc in o.layers or []:
            lipm = f"{lc.instructions / lc.macs:9.2f}" if lc.macs else f"{'-':>9}"
            lines.append(f"{'':>4}   {lc.layer:>2} {lc.type[:17]:<17} {lc.macs:>12,} {lc.instructions:>14,} "
                         f"{'(split)':>14} {100 * lc.instructions / max(o.instructions, 1):6.1f}% {lipm}")
        if o.layers:
            lines.append(f"{'':>4}      {'executor':<17} {'':>12} {o.executor_instructions or 0:>14,} {'(split)':>14}")
    ops_total = sum(o.instructions for o in p.ops)
    macs = sum(o.macs for o in p.ops)
    lines.append(f"{'':>4} {'ops':<22} {macs:>12,} {ops_total:>14,} {sum(o.predicted_instructions for o in p.ops):>14,}"
                 f" {'100.0%':>7} {ops_total / max(macs, 1):9.2f}"
                 + (f" {sum(o.cycles or 0 for o in p.ops):>13,} "
                    f"{sum(o.ms or 0 for o in p.ops):9.3f}" if cyc else ""))
    if any(o.layers for o in p.ops):
        lines.append("A patch stage's layers and executor: its measured instructions split as the latency predictor "
                     "splits it (an estimate; their share of the stage).")
    lines.append(f"Invoke {p.invoke_instructions:,} instructions measured on {p.measured_by}: the ops "
                 f"{ops_total:,}, TFLM's interpreter between them and the profile's markers {p.between_ops:,}"
                 + (f"; cycles estimated ({p.cycles_by})" if cyc else "; cycles not estimated for this core")
                 + (f", ms at {p.clock_hz / 1e6:g} MHz" if cyc and p.clock_hz else ""))
    return "\n".join(lines) + "\n"


def plot(p: OpProfile, title: str) -> bytes:
    """Where the time goes: each op's instructions (and estimated cycles) as bars, in op order, the largest named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8.0, 0.18 * len(p.ops) + 4), 4.2))
    xs = [o.op for o in p.ops]
    ax.bar(xs, [o.instructions / 1e6 for o in p.ops], color="#1f77b4", label="instructions (QEMU)")
    if p.cycles_by is not None:
        ax.plot(xs, [(o.cycles or 0) / 1e6 for o in p.ops], "r.", label=f"cycles (estimated: {p.cycles_by[:40]})")
    for o in sorted(p.ops, key=lambda o: -o.instructions)[:6]:
        ax.annotate(f"{o.type}\n{100 * o.share:.0f}%", (o.op, o.instructions / 1e6), fontsize=7, ha="center",
                    va="bottom")
    ax.set_xlabel("operator (model order)")
    ax.set_ylabel("millions")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return figure_png(fig)

