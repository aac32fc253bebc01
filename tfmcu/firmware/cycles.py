"""Estimated cycles from QEMU's per-address instruction profile: every executed instruction decoded from the ELF and
priced by its class on a core's timing table.

    est = estimate_cycles("fw.elf", "profile.txt", "cortex-m4")
    est.cycles, est.cycles_per_instruction, est.by_class["load"]
    est.cycles_in(lo, hi)                      # the instructions whose address lies in [lo, hi)
    est.per_function(function_symbols("fw.elf"))   # or symbols_from_nm(`nm -S` output)
    est.milliseconds(168e6)                    # at a board's clock

* The profile is what tools/qemu/insn_count.c writes with ``profile=PATH`` (one line ``0xADDR COUNT`` per executed
  instruction address; ``run_firmware.py --profile-out``), or the same as a dict.
* The ELF's executable sections are read with pyelftools and each executed address decoded as Thumb with capstone
  (Armv8.1-M: the M55's Helium and low-overhead loops decode too), in address order so that an IT block's
  instructions are decoded as the block's.
* Each instruction falls in one class (``CLASSES``); ``TIMINGS`` holds one table per core: cycles per class, the
  pipeline refill ``P`` a taken branch adds, the load pipelining and address-dependency rules. The Cortex-M3 and M4
  tables are their Technical Reference Manuals' instruction timings; the M33, M7 and M55 tables are estimates with
  their assumptions stated (docs/cycles.md has every table, its source and what is not modelled).
* Sequence rules see only the instruction just before in the code (``A - 2`` or ``A - 4``): it falls through to ``A``
  exactly ``count(prev)`` times (it is not a branch), so ``min(count(A), count(prev))`` executions of ``A`` follow
  it. A load after a single load (whose result it does not use for its address) is pipelined; a load or store whose
  address register the ALU instruction before it wrote waits a cycle; on the M55 a vector memory instruction after a
  vector arithmetic one (or the reverse) overlaps it.
* Branches: the profile has no taken/not-taken counts. A conditional branch at ``A`` (``B<cond>``, ``CBZ``,
  ``CBNZ``, ``WLS``) falls through at most ``count(next)`` times, ``next`` being the instruction after it in the
  code; the estimate takes ``not_taken = min(count(A), count(next))`` and ``taken = count(A) - not_taken``. This is
  exact when ``next`` is reached only by falling through (nothing branches to it), and otherwise counts too few
  taken branches. Unconditional branches, calls, returns and other writes of the PC are always taken.

No user mistake raises anything but a one-line ``UsageError``: an unknown core, a missing or unreadable ELF, a
malformed profile line, an address outside the ELF's code or one that does not decode.
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Mapping

import capstone
from capstone import arm
from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from tfmcu.errors import UsageError
from tfmcu.firmware.targets import board_entries

# The instruction classes, in the order reports list them.
CLASSES = (
    "alu",  # data processing, moves, compares, shifts, extends, bit fields, saturation, NOP, ADR, DLS/DLSTP
    "it",  # IT (if-then)
    "simd",  # the DSP extension's parallel 8/16-bit arithmetic, packing, SEL, saturating Q-ops
    "mul",  # 32-bit results: MUL, MLA, MLS, SMUL<x><y>, SMLA<x><y>, SMLAD, SMUAD, SMMUL, SMMLA, ...
    "mul_long",  # 64-bit results: UMULL, SMULL, UMLAL, SMLAL, UMAAL, SMLALD, SMLAL<x><y>, ...
    "div",  # SDIV, UDIV
    "load",  # LDR, LDRB, LDRH, LDRSB, LDRSH, LDREX*: one register
    "store",  # STR, STRB, STRH, STREX*: one register
    "load_multiple",  # LDM, POP, LDRD, VLDM, VPOP: N registers (words)
    "store_multiple",  # STM, PUSH, STRD, VSTM, VPUSH: N registers (words)
    "branch",  # B, BL, BX, BLX, and every write of the PC that is not a load (MOV PC, ADD PC)
    "branch_cond",  # B<cond>, CBZ, CBNZ, WLS, WLSTP
    "table_branch",  # TBB, TBH
    "loop_end",  # LE, LETP (Armv8.1-M low-overhead loops)
    "fp",  # floating point: VADD, VSUB, VMUL, VABS, VNEG, VCVT, VMOV, VCMP, VMRS, ...
    "fp_mac",  # VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS
    "fp_div",  # VDIV, VSQRT
    "fp_load",  # VLDR (one S or D register)
    "fp_store",  # VSTR
    "mve",  # Helium (MVE) arithmetic and predication on Q registers
    "mve_load",  # Helium loads: VLDR<size>, VLD2/VLD4, gathers
    "mve_store",  # Helium stores: VSTR<size>, VST2/VST4, scatters
    "system",  # MSR, MRS, CPS, barriers, SVC, BKPT, WFI, WFE, coprocessor moves
)
_MEMORY = ("load", "store", "load_multiple", "store_multiple", "fp_load", "fp_store")
_WRITERS = ("alu", "simd", "mul", "mul_long")  # classes whose result a following address may wait for


@dataclass(frozen=True)
class CoreTiming:
    """One core's timing table: cycles per instruction class at zero wait states.

    ``cycles[c]`` is what one instruction of class ``c`` costs when nothing special applies; ``load_multiple`` and
    ``store_multiple`` cost ``cycles[c] + per_register x N``. A taken branch (and every write of the PC) adds
    ``refill`` (the TRMs' ``P``); a not-taken conditional branch costs ``cycles["branch_cond"]``. ``pipelined_load``:
    the cycles a single load costs right after a single load that it does not depend on for its address (None: no
    such rule). ``address_stall``: cycles a load or store waits when its address register was written by the ALU
    instruction just before it. ``mve_overlap``: cycles saved when a Helium memory instruction follows a Helium
    arithmetic one or the reverse (beat-wise overlap). None in ``cycles``: the core lacks the class (the M55's
    Helium on an M4): a profile with such instructions is from another core."""

    core: str
    source: str  # where the figures come from (document, section), or how they were estimated
    estimate: bool  # True: not transcribed from a timing table of the core's own manual
    cycles: Mapping[str, float | None]
    refill: float
    per_register: float = 1.0
    pipelined_load: float | None = None
    address_stall: float = 0.0
    mve_overlap: float = 0.0
    notes: str = ""


def _table(**cycles: float | None) -> dict[str, float | None]:
    missing = set(CLASSES) - set(cycles)
    if missing or set(cycles) - set(CLASSES):
        raise ValueError(f"a timing table names every class once: missing {sorted(missing)}")
    return cycles


_NO_MVE = {"mve": None, "mve_load": None, "mve_store": None}
_NO_LOB = {"loop_end": None}

# Divides take 2 to 12 cycles on the M3, M4 (early termination, by the operands); 7, the middle, is assumed.
_DIVIDE = 7.0
# P, the pipeline refill of a taken branch, is 1 to 3 on the M3 and M4 (by the target's alignment and width and
# whether the address was speculated early); 2, the middle, is assumed.
_REFILL_M3_M4 = 2.0

_M4 = _table(alu=1, it=1, simd=1, mul=1, mul_long=1, div=_DIVIDE, load=2, store=1, load_multiple=1,
             store_multiple=1, branch=1, branch_cond=1, table_branch=2, fp=1, fp_mac=3, fp_div=14, fp_load=2,
             fp_store=2, system=2, **_NO_MVE, **_NO_LOB)

TIMINGS: dict[str, CoreTiming] = {
    "cortex-m3": CoreTiming(
        core="cortex-m3",
        source="Arm Cortex-M3 Processor Technical Reference Manual (r2p0 / r2p1): section 3.3, Table 3-1 "
               "\"Cortex-M3 instruction set summary\", and the load/store timings after it",
        estimate=False,
        # MLA/MLS 2; long multiplies 3 to 5 (UMULL/SMULL) and 4 to 7 (UMLAL/SMLAL): 4 assumed; no DSP or FPU.
        cycles=_table(alu=1, it=1, simd=None, mul=1, mul_long=4, div=_DIVIDE, load=2, store=1, load_multiple=1,
                      store_multiple=1, branch=1, branch_cond=1, table_branch=2, fp=None, fp_mac=None, fp_div=None,
                      fp_load=None, fp_store=None, system=2, **_NO_MVE, **_NO_LOB),
        refill=_REFILL_M3_M4, pipelined_load=1, address_stall=1,
        notes="MLA and MLS take 2 cycles (the table prices every 32-bit multiply as 1: MUL's); long multiplies 4 "
              "(3 to 5 and 4 to 7 in the TRM)."),
    "cortex-m4": CoreTiming(
        core="cortex-m4",
        source="Arm Cortex-M4 Processor Technical Reference Manual (r0p1): section 3.3.1, Table 3-1 \"Cortex-M4 "
               "instruction set summary\" (with the DSP instructions), section 3.3.2 \"Load/store timings\", and "
               "Table 7-1 (FPU instruction set) for the floating point",
        estimate=False,
        cycles=_M4,
        refill=_REFILL_M3_M4, pipelined_load=1, address_stall=1,
        notes="STR with an immediate offset is 1 cycle (section 3.3.2: the data phase overlaps the next "
              "instruction); LDM/STM/PUSH/POP/LDRD/STRD are 1 + N; TBB/TBH 2 + P; VLDM/VSTM 1 + N."),
    "cortex-m33": CoreTiming(
        core="cortex-m33",
        source="estimate: the Cortex-M4 table (same Armv7E-M / Armv8-M Mainline instruction classes, a 3-stage "
               "pipeline with the DSP extension and single-precision FPU); no per-instruction timing table of "
               "the Cortex-M33 is used",
        estimate=True,
        cycles=_M4,
        refill=_REFILL_M3_M4, pipelined_load=1, address_stall=0,
        notes="The M33 generates addresses a stage earlier than the M4 (no address-dependency stall assumed) and "
              "can dual-issue some pairs of 16-bit instructions (not modelled: an overestimate there)."),
    "cortex-m7": CoreTiming(
        core="cortex-m7",
        source="estimate: the Arm Cortex-M7 Processor Technical Reference Manual describes a 6-stage, in-order, "
               "dual-issue pipeline with a branch predictor and 64-bit load/store ports, without per-instruction "
               "cycles; the figures here assume half of the ALU-type instructions pair",
        estimate=True,
        cycles=_table(alu=0.5, it=0.5, simd=1, mul=1, mul_long=1, div=_DIVIDE, load=1, store=1, load_multiple=1,
                      store_multiple=1, branch=1, branch_cond=0.5, table_branch=2, fp=1, fp_mac=1, fp_div=14,
                      fp_load=1, fp_store=1, system=2, **_NO_MVE, **_NO_LOB),
        # LDM/STM move 64 bits (two registers) per cycle; a predicted taken branch costs about a cycle more than a
        # not-taken one (mispredictions, about 8 cycles, not modelled).
        per_register=0.5, refill=1.0, pipelined_load=None, address_stall=0,
        notes="Dual issue: ALU, IT and not-taken branches priced 0.5 (they pair with the instruction next to "
              "them), multiplies, DSP and memory 1 (one such pipe each); caches and TCM wait states not "
              "modelled (zero wait states assumed: code and data in the TCMs or in the caches)."),
    "cortex-m55": CoreTiming(
        core="cortex-m55",
        source="estimate: the scalar part as the Cortex-M4 table with pipelined loads (a 4-stage pipeline); "
               "Helium as the Arm Cortex-M55 Processor Technical Reference Manual's dual-beat implementation: "
               "a 128-bit vector instruction is 4 beats, 2 per cycle, so 2 cycles, 1 when it overlaps the one "
               "before (a memory and an arithmetic instruction)",
        estimate=True,
        cycles=_table(alu=1, it=1, simd=1, mul=1, mul_long=1, div=_DIVIDE, load=1, store=1, load_multiple=1,
                      store_multiple=1, branch=1, branch_cond=1, table_branch=2, loop_end=1, fp=1, fp_mac=2,
                      fp_div=14, fp_load=1, fp_store=1, mve=2, mve_load=2, mve_store=2, system=2),
        refill=2.0, pipelined_load=None, address_stall=0, mve_overlap=1,
        notes="LE/LETP: 1 cycle (the loop is held by the low-overhead-loop branch cache after its first "
              "iteration); vector reductions and 32-bit multiplies that take more beats not modelled."),
}
CORES = tuple(TIMINGS)


@dataclass(frozen=True)
class CycleOptions:
    """What may be changed about the model (the defaults are the core's table).

    ``refill``: the cycles a taken branch adds (None: the core's). ``divide``: cycles of SDIV/UDIV (None: the core's).
    ``pipelining``: the sequence rules (pipelined loads, address stalls, Helium overlap); off prices every
    instruction alone."""

    refill: float | None = None
    divide: float | None = None
    pipelining: bool = True


@dataclass(frozen=True)
class ClassCost:
    """One instruction class's executed instructions and their estimated cycles."""

    instructions: int
    cycles: float


@dataclass(frozen=True)
class Symbol:
    """A sized symbol (as ``nm -S`` lists it): code in [address, address + size)."""

    name: str
    address: int
    size: int


@dataclass(frozen=True)
class FunctionCycles:
    name: str
    instructions: int
    cycles: float


@dataclass(frozen=True)
class CycleEstimate:
    """Estimated cycles of a profiled run on one core (an estimate: see ``timing.source``).

    ``addresses`` (ascending), ``counts`` and ``address_cycles`` are per executed instruction address: what
    ``cycles_in`` and ``per_function`` sum."""

    core: str
    instructions: int
    cycles: float
    by_class: dict[str, ClassCost]
    taken_branches: int  # estimated (the module's branch rule), of the conditional and unconditional branches
    pipelined: int  # executions the sequence rules changed (pipelined loads, address stalls, Helium overlaps)
    timing: CoreTiming
    options: CycleOptions
    addresses: tuple[int, ...] = field(repr=False)
    counts: tuple[int, ...] = field(repr=False)
    address_cycles: tuple[float, ...] = field(repr=False)

    @property
    def cycles_per_instruction(self) -> float:
        return self.cycles / self.instructions if self.instructions else 0.0

    def _span(self, lo: int, hi: int) -> range:
        return range(bisect.bisect_left(self.addresses, lo), bisect.bisect_left(self.addresses, hi))

    def cycles_in(self, lo: int, hi: int) -> float:
        """Estimated cycles of the instructions whose address lies in [lo, hi) (bit 0, Thumb's, is ignored)."""
        return sum(self.address_cycles[i] for i in self._span(lo & ~1, hi & ~1))

    def instructions_in(self, lo: int, hi: int) -> int:
        return sum(self.counts[i] for i in self._span(lo & ~1, hi & ~1))

    def per_function(self, symbols: Iterable[Symbol]) -> list[FunctionCycles]:
        """Instructions and cycles per sized symbol that ran, most cycles first; symbols of one span (aliases such as
        ``memcpy`` and ``__aeabi_memcpy``) are one entry named ``a/b``; what no symbol covers is "?"."""
        spans: dict[tuple[int, int], list[str]] = {}
        for s in symbols:
            spans.setdefault((s.address & ~1, s.size), []).append(s.name)
        out: list[FunctionCycles] = []
        covered_insns, covered_cycles = 0, 0.0
        for (lo, size), names in sorted(spans.items()):
            n = self.instructions_in(lo, lo + size)
            if n:
                c = self.cycles_in(lo, lo + size)
                out.append(FunctionCycles("/".join(sorted(set(names))), n, c))
                covered_insns, covered_cycles = covered_insns + n, covered_cycles + c
        if covered_insns < self.instructions:
            out.append(FunctionCycles("?", self.instructions - covered_insns, self.cycles - covered_cycles))
        return sorted(out, key=lambda f: -f.cycles)

    def seconds(self, clock_hz: float) -> float:
        """The estimate in seconds at a core clock of ``clock_hz``."""
        if clock_hz <= 0:
            raise UsageError(f"clock {clock_hz!r} Hz: want a positive frequency")
        return self.cycles / clock_hz

    def milliseconds(self, clock_hz: float) -> float:
        return 1e3 * self.seconds(clock_hz)

    def summary(self) -> str:
        """One line: instructions, cycles, cycles per instruction and the table's kind."""
        kind = "estimated table" if self.timing.estimate else "TRM table"
        return (f"{self.core}: {self.instructions} instructions, {self.cycles:.0f} estimated cycles "
                f"({self.cycles_per_instruction:.2f} per instruction; {kind}, zero wait states)")


# ----------------------------------------------------------------------------------------------- inputs
def core_timing(core: str) -> CoreTiming:
    """The timing table of ``core`` ("cortex-m4", ...) or of a board's core (a ``--target`` name, boards.json)."""
    if core in TIMINGS:
        return TIMINGS[core]
    board = board_entries().get(core)
    if board is not None and board.get("core") in TIMINGS:
        return TIMINGS[board["core"]]
    raise UsageError(f"core {core!r}: cycles are estimated for {', '.join(CORES)} (or a board with one of them)")


def read_profile(profile: Mapping[int, int] | str) -> dict[int, int]:
    """Executions per instruction address: the plugin's profile file (``0xADDR COUNT`` lines) or such a dict."""
    if not isinstance(profile, str):
        out = {}
        for addr, n in profile.items():
            if not isinstance(addr, int) or not isinstance(n, int) or addr < 0 or n < 0:
                raise UsageError(f"profile entry {addr!r}: {n!r}: want a non-negative address and count")
            if n:
                out[addr & ~1] = out.get(addr & ~1, 0) + n
        return out
    if not os.path.isfile(profile):
        raise UsageError(f"{profile}: no such profile file (insn_count's profile=PATH output)")
    out = {}
    with open(profile) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                addr, n = int(parts[0], 16), int(parts[1])
                if len(parts) != 2 or n < 0:
                    raise ValueError
            except (ValueError, IndexError):
                raise UsageError(f"{profile}:{lineno}: {line.strip()!r} is not '0xADDR COUNT'") from None
            if n:
                out[addr & ~1] = out.get(addr & ~1, 0) + n
    return out


def _elf(path: str) -> tuple[BinaryIO, ELFFile]:
    """The open file (the caller closes it) and the ELF read from it; a one-line ``UsageError`` for a missing or
    malformed file."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such ELF file")
    f = open(path, "rb")
    try:
        elf = ELFFile(f)
    except ELFError as e:
        f.close()
        raise UsageError(f"{path}: not an ELF file ({e})") from None
    if elf["e_machine"] != "EM_ARM":
        f.close()
        raise UsageError(f"{path}: an ELF for {elf['e_machine']}, not for Arm")
    return f, elf


def code_sections(elf_path: str) -> list[tuple[int, bytes]]:
    """(address, bytes) of every loaded executable section of the ELF."""
    f, elf = _elf(elf_path)
    with f:
        want = SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_EXECINSTR
        return [(s["sh_addr"], s.data()) for s in elf.iter_sections()
                if s["sh_type"] == "SHT_PROGBITS" and s["sh_flags"] & want == want and s["sh_size"]]


def function_symbols(elf_path: str) -> list[Symbol]:
    """The ELF's sized function symbols (what ``nm -S`` lists as t/T/w/W), Thumb bit cleared."""
    f, elf = _elf(elf_path)
    with f:
        tab = elf.get_section_by_name(".symtab")
        if tab is None:
            raise UsageError(f"{elf_path}: no symbol table (stripped?)")
        return [Symbol(s.name, s["st_value"] & ~1, s["st_size"]) for s in tab.iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC" and s["st_size"] and s.name]


def symbols_from_nm(text: str) -> list[Symbol]:
    """The sized code symbols of ``nm -S`` output (``ADDR SIZE t|T|w|W NAME`` lines)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            out.append(Symbol(parts[3], int(parts[0], 16) & ~1, int(parts[1], 16)))
    return out


# ----------------------------------------------------------------------------------------------- classification
_CONDS = "eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le"
_COND_BRANCH = re.compile(rf"^b({_CONDS})$")
_IT = re.compile(r"^it[te]{0,3}$")
_Q_REG = re.compile(r"\bq[0-7]\b")
_MUL = re.compile(r"^(muls?|mla|mls|smul[bt][bt]|smulw[bt]|smla[bt][bt]|smlaw[bt]|smla[ds]x?|smls[d]x?|smu[as]dx?|"
                  r"smusdx?|smmulr?|smmlar?|smmlsr?)$")
_MUL_LONG = re.compile(r"^(umull|smull|umlal|smlal|umaal|smlal[bt][bt]|smlaldx?|smlsldx?)$")
_SIMD = frozenset(
    [p + op for p in ("s", "q", "sh", "u", "uq", "uh") for op in ("add16", "asx", "sax", "sub16", "add8", "sub8")]
    + ["sxtb16", "sxtab16", "uxtb16", "uxtab16", "pkhbt", "pkhtb", "sel", "usad8", "usada8", "ssat16", "usat16",
       "qadd", "qsub", "qdadd", "qdsub"])
_SYSTEM = re.compile(r"^(msr|mrs|cps(id|ie)|dmb|dsb|isb|svc|bkpt|wfi|wfe|sev|udf|mcrr?2?|mrrc2?|mrc2?|ldc2?l?|"
                     r"stc2?l?|cdp2?|vscclrm|sg|tt[at]?t?|bxns|blxns|clrm)$")
_FP_MAC = re.compile(r"^v(n?ml[as]|f?n?m[as]|fn?m[as])$")


def _register_words(op_str: str) -> int:
    """Words a register list moves: ``{r4, r5, lr}`` 3, ``{d8, d9}`` 4 (a D register is two)."""
    m = re.search(r"\{([^}]*)\}", op_str)
    if not m:
        return 1
    words = 0
    for item in m.group(1).split(","):
        item = item.strip()
        lo_hi = item.split("-")
        n = 1
        if len(lo_hi) == 2 and lo_hi[0][1:].isdigit() and lo_hi[1][1:].isdigit():
            n = int(lo_hi[1][1:]) - int(lo_hi[0][1:]) + 1
        words += n * (2 if item.startswith("d") else 1)
    return words


@dataclass(frozen=True)
class Decoded:
    """One executed instruction as the estimate sees it."""

    address: int
    size: int
    text: str  # "ldr r0, [r1, #4]"
    cls: str
    words: int = 0  # registers (words) moved, for load_multiple / store_multiple
    writes_pc: bool = False  # a branch, return or any other write of the PC
    conditional: bool = False  # executed under a condition (B<cond>, or in an IT block)
    dest: frozenset[str] = frozenset()  # registers written
    address_regs: frozenset[str] = frozenset()  # base and index registers of a memory operand


def classify(mnemonic: str, op_str: str, writes_pc: bool = False, conditional: bool = False) -> tuple[str, int]:
    """(class, words) of an instruction from capstone's mnemonic and operand text (``conditional``: in an IT block,
    its mnemonic ends with the condition, which is dropped)."""
    m = mnemonic.lower().split(".")[0]
    ops = op_str.lower()
    if conditional and not _COND_BRANCH.match(m) and len(m) > 2 and m[-2:] in _CONDS.split("|") + ["al"]:
        m = m[:-2]
    if m.startswith("v"):
        if _Q_REG.search(ops):  # Helium (also predicated: vldrbt, vaddt)
            return ("mve_load" if re.match(r"^vld[r24]", m) else "mve_store" if re.match(r"^vst[r24]", m)
                    else "mve"), 0
        if m.startswith(("vpst", "vpt", "vctp", "vpnot", "vpsel")):  # Helium predication
            return "mve", 0
        if m in ("vldr",):
            return "fp_load", 0
        if m in ("vstr",):
            return "fp_store", 0
        if m.startswith(("vldm", "vpop")):
            return "load_multiple", _register_words(ops)
        if m.startswith(("vstm", "vpush")):
            return "store_multiple", _register_words(ops)
        if m in ("vdiv", "vsqrt"):
            return "fp_div", 0
        if _FP_MAC.match(m):
            return "fp_mac", 0
        if m in ("vscclrm", "vlstm", "vlldm"):
            return "system", 0
        return "fp", 0
    if _IT.match(m):
        return "it", 0
    if m in ("tbb", "tbh"):
        return "table_branch", 0
    if m in ("le", "letp"):
        return "loop_end", 0
    if _COND_BRANCH.match(m) or m in ("cbz", "cbnz", "wls", "wlstp"):
        return "branch_cond", 0
    if m in ("b", "bl", "bx", "blx", "bxaut") or m.startswith("bf"):
        return "branch", 0
    if m in ("pop", "ldrd") or m.startswith(("ldm",)) or m == "ldaexd":
        return "load_multiple", (2 if m in ("ldrd", "ldaexd") else _register_words(ops))
    if m in ("push", "strd") or m.startswith("stm") or m == "stlexd":
        return "store_multiple", (2 if m in ("strd", "stlexd") else _register_words(ops))
    if re.match(r"^(ldr|lda)", m):
        return "load", 0
    if re.match(r"^(str|stl)", m):
        return "store", 0
    if m in ("sdiv", "udiv"):
        return "div", 0
    if _MUL_LONG.match(m):
        return "mul_long", 0
    if _MUL.match(m):
        return "mul", 0
    if m in _SIMD:
        return "simd", 0
    if _SYSTEM.match(m):
        return "system", 0
    if writes_pc:  # MOV PC, Rm; ADD PC, PC, Rm
        return "branch", 0
    return "alu", 0


def _disassembler():
    md = capstone.Cs(capstone.CS_ARCH_ARM, capstone.CS_MODE_THUMB | capstone.CS_MODE_MCLASS | capstone.CS_MODE_V8)
    md.detail = True
    return md


def decode(elf_path: str, addresses: Iterable[int]) -> dict[int, Decoded]:
    """The instructions at ``addresses`` of the ELF's code, decoded as Thumb (one ``UsageError`` naming the first
    address outside the code or that does not decode)."""
    sections = code_sections(elf_path)
    if not sections:
        raise UsageError(f"{elf_path}: no executable section")
    return decode_code(sections, addresses, f"the code of {elf_path}")


def decode_code(sections: Iterable[tuple[int, bytes]], addresses: Iterable[int],
                where: str = "the code given") -> dict[int, Decoded]:
    """``decode`` on code given as (address, bytes) pieces (``where`` names them in errors)."""
    sections = sorted(sections)
    starts = [s for s, _ in sections]
    out: dict[int, Decoded] = {}
    md, next_addr = None, None
    for addr in sorted(addresses):
        k = bisect.bisect_right(starts, addr) - 1
        if k < 0 or addr + 2 > starts[k] + len(sections[k][1]):
            raise UsageError(f"profile address 0x{addr:x} lies outside {where} (is the profile from this ELF?)")
        base, data = sections[k]
        if md is None or addr != next_addr:
            md = _disassembler()  # a fresh decoder: no IT state carried over a gap
        insn = next(md.disasm(data[addr - base: addr - base + 4], addr, 1), None)
        if insn is None:
            raise UsageError(f"profile address 0x{addr:x} of {where} does not decode as a Thumb instruction "
                             f"({data[addr - base: addr - base + 4].hex()}): is the profile from this ELF?")
        next_addr = addr + insn.size
        reads, writes = insn.regs_access()
        writes_pc = arm.ARM_REG_PC in writes
        conditional = insn.cc not in (arm.ARM_CC_AL, getattr(arm, "ARM_CC_INVALID", arm.ARM_CC_AL))
        cls, words = classify(insn.mnemonic, insn.op_str, writes_pc, conditional)
        writes_pc = writes_pc or cls in ("branch", "branch_cond", "table_branch", "loop_end")
        mem = frozenset(insn.reg_name(r) for o in insn.operands if o.type == arm.ARM_OP_MEM
                        for r in (o.mem.base, o.mem.index) if r)
        out[addr] = Decoded(addr, insn.size, f"{insn.mnemonic} {insn.op_str}".strip(), cls, words, writes_pc,
                            conditional or cls == "branch_cond", frozenset(insn.reg_name(r) for r in writes), mem)
    return out


# ----------------------------------------------------------------------------------------------- the estimate
def _previous(addr: int, decoded: Mapping[int, Decoded]) -> Decoded | None:
    """The executed instruction just before ``addr`` in the code (it ends at ``addr``), if any."""
    for size in (4, 2):
        d = decoded.get(addr - size)
        if d is not None and d.size == size:
            return d
    return None


def estimate_cycles(elf_path: str, profile: Mapping[int, int] | str, core: str,
                    options: CycleOptions = CycleOptions()) -> CycleEstimate:
    """Estimated cycles of a run whose executions per instruction address ``profile`` holds (the insn_count
    plugin's profile file, or a dict), on ``core`` ("cortex-m4", ..., or a board name), with the code of
    ``elf_path``."""
    timing = core_timing(core)
    counts = read_profile(profile)
    return _estimate(elf_path, counts, decode(elf_path, counts), timing, options)


def estimate_code_cycles(code: Iterable[tuple[int, bytes]], profile: Mapping[int, int] | str, core: str,
                         options: CycleOptions = CycleOptions()) -> CycleEstimate:
    """``estimate_cycles`` on code given as (address, bytes) pieces instead of an ELF (hand-assembled Thumb)."""
    timing = core_timing(core)
    counts = read_profile(profile)
    return _estimate("the code given", counts, decode_code(code, counts), timing, options)


def cycles_per_instruction(elf_path: str, profile: Mapping[int, int] | str, cores: Iterable[str] = CORES,
                           options: CycleOptions = CycleOptions()) -> dict[str, float]:
    """Estimated cycles per instruction of one profile on each of ``cores`` that has every class it ran (a profile
    with Helium instructions: only the M55)."""
    timings = [core_timing(c) for c in cores]
    counts = read_profile(profile)
    decoded = decode(elf_path, counts)
    ran = {d.cls for d in decoded.values()}
    return {t.core: _estimate(elf_path, counts, decoded, t, options).cycles_per_instruction for t in timings
            if all(t.cycles[c] is not None for c in ran)}


def _estimate(where: str, counts: Mapping[int, int], decoded: Mapping[int, Decoded], timing: CoreTiming,
              options: CycleOptions) -> CycleEstimate:
    table = dict(timing.cycles)
    if options.divide is not None:
        table["div"] = options.divide
    refill = timing.refill if options.refill is None else options.refill
    by_class: dict[str, list[float]] = {}
    addresses = sorted(counts)
    address_cycles = []
    taken_total, pipelined_total = 0, 0
    for addr in addresses:
        d, n = decoded[addr], counts[addr]
        base = table[d.cls]
        if base is None:
            raise UsageError(f"0x{addr:x} '{d.text}' ({d.cls}): {timing.core} has no such instructions (is "
                             f"{where} built for another core?)")
        cycles = n * base
        if d.cls in ("load_multiple", "store_multiple"):
            cycles += n * timing.per_register * d.words
        taken = 0
        if d.conditional and (d.writes_pc or d.cls in ("branch", "branch_cond")) or d.cls == "loop_end":
            # the branch rule: it falls through at most as often as the next instruction ran
            taken = n - min(n, counts.get(addr + d.size, 0))
        elif d.writes_pc or d.cls in ("branch", "table_branch"):
            taken = n
        if d.cls != "loop_end":  # LE: the low-overhead-loop cache holds the loop (no refill)
            cycles += taken * refill
        taken_total += taken
        prev = _previous(addr, decoded) if options.pipelining else None
        if prev is not None and not prev.writes_pc and prev.cls not in ("branch_cond", "loop_end", "table_branch"):
            follows = min(n, counts[prev.address])  # executions of addr right after prev (it falls through)
            saved = 0.0
            if (d.cls == "load" and prev.cls == "load" and timing.pipelined_load is not None
                    and not prev.dest & d.address_regs):
                saved = base - timing.pipelined_load
            elif d.cls in _MEMORY and prev.cls in _WRITERS and prev.dest & d.address_regs:
                saved = -timing.address_stall
            elif timing.mve_overlap and {d.cls, prev.cls} in ({"mve", "mve_load"}, {"mve", "mve_store"}):
                saved = timing.mve_overlap
            if saved:
                cycles -= follows * saved
                pipelined_total += follows
        row = by_class.setdefault(d.cls, [0, 0.0])
        row[0] += n
        row[1] += cycles
        address_cycles.append(cycles)
    return CycleEstimate(
        core=timing.core,
        instructions=sum(counts.values()),
        cycles=sum(address_cycles),
        by_class={c: ClassCost(int(by_class[c][0]), by_class[c][1]) for c in CLASSES if c in by_class},
        taken_branches=taken_total,
        pipelined=pipelined_total,
        timing=timing,
        options=options,
        addresses=tuple(addresses),
        counts=tuple(counts[a] for a in addresses),
        address_cycles=tuple(address_cycles),
    )


# ----------------------------------------------------------------------------------------------- the table as text
def _num(x: float) -> str:
    return f"{x:g}"


def timing_table_markdown() -> str:
    """``TIMINGS`` as a Markdown table (docs/cycles.md holds this text; tests/test_cycles.py compares them): cycles per
    class and core, ``N`` the registers moved, ``P`` the refill of a taken branch, "-" a class the core lacks."""
    head = "| class | " + " | ".join(CORES) + " |"
    rows = [head, "|---" * (len(CORES) + 1) + "|"]
    for cls in CLASSES:
        cells = []
        for t in TIMINGS.values():
            c = t.cycles[cls]
            if c is None:
                cells.append("-")
            elif cls in ("load_multiple", "store_multiple"):
                per = "N" if t.per_register == 1 else f"{_num(t.per_register)} N"
                cells.append(f"{_num(c)} + {per}")
            elif cls in ("branch", "table_branch"):
                cells.append(f"{_num(c)} + P")
            elif cls == "branch_cond":
                cells.append(f"{_num(c)}, taken {_num(c)} + P")
            elif cls == "load" and t.pipelined_load is not None:
                cells.append(f"{_num(c)} ({_num(t.pipelined_load)} pipelined)")
            else:
                cells.append(_num(c))
        rows.append(f"| {cls} | " + " | ".join(cells) + " |")
    rows.append("| P (taken branch) | " + " | ".join(_num(t.refill) for t in TIMINGS.values()) + " |")
    rows.append("| address stall | " + " | ".join(f"+{_num(t.address_stall)}" for t in TIMINGS.values()) + " |")
    rows.append("| Helium overlap | " + " | ".join(f"-{_num(t.mve_overlap)}" if t.mve_overlap else "-"
                                                   for t in TIMINGS.values()) + " |")
    rows.append("| kind | " + " | ".join("estimate" if t.estimate else "TRM" for t in TIMINGS.values()) + " |")
    return "\n".join(rows) + "\n"
