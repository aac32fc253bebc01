"""Estimated cycles from QEMU's instruction profile (tfmcu/firmware/cycles.py): hand-encoded Thumb with known counts
priced by the tables, one-line errors, and a real firmware's profile under QEMU (the self-test on the Cortex-M4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfmcu.errors import UsageError
from tfmcu.firmware import cycles

ROOT = Path(__file__).resolve().parent.parent


def _code(*halfwords: str) -> list[tuple[int, bytes]]:
    """Thumb code at address 0 from instructions written as objdump shows them ("2000", "fb0e 1107"): each
    16-bit halfword stored little-endian."""
    out = b""
    for insn in halfwords:
        for hw in insn.split():
            out += int(hw, 16).to_bytes(2, "little")
    return [(0, out)]


# A loop of 10 iterations: two independent loads, a counter, a compare and the back branch; then a return.
LOOP = _code(
    "2000",  # 0x0  movs r0, #0
    "6811",  # 0x2  ldr r1, [r2]
    "6823",  # 0x4  ldr r3, [r4]       (pipelined after the load before it: r1 is not its address)
    "3001",  # 0x6  adds r0, #1
    "280a",  # 0x8  cmp r0, #10
    "d1fa",  # 0xa  bne 0x2            (taken 9 times: 0xc runs once)
    "4770",  # 0xc  bx lr
)
LOOP_COUNTS = {0x0: 1, 0x2: 10, 0x4: 10, 0x6: 10, 0x8: 10, 0xa: 10, 0xc: 1}


def test_instructions_decode_into_their_classes():
    d = cycles.decode_code(LOOP, LOOP_COUNTS)
    assert [d[a].cls for a in sorted(d)] == ["alu", "load", "load", "alu", "alu", "branch_cond", "branch"]
    assert d[0xa].conditional and d[0xc].writes_pc and d[0x2].address_regs == {"r2"}
    assert cycles.classify("mla", "r1, lr, r7, r1") == ("mul", 0)
    assert cycles.classify("smlad", "r0, r1, r2, r3") == ("mul", 0)
    assert cycles.classify("umlal", "r0, r1, r2, r3") == ("mul_long", 0)
    assert cycles.classify("sxtb16", "r0, r1") == ("simd", 0)
    assert cycles.classify("push.w", "{r4, r5, r6, lr}") == ("store_multiple", 4)
    assert cycles.classify("vpush", "{d8, d9}") == ("store_multiple", 4)
    assert cycles.classify("vmla.f32", "s0, s1, s2") == ("fp_mac", 0)
    assert cycles.classify("vldrb.s16", "q0, [r0]") == ("mve_load", 0)
    assert cycles.classify("ldreq", "r0, [r1]", conditional=True) == ("load", 0)
    assert cycles.classify("ble", "#0x20", conditional=True) == ("branch_cond", 0)
    assert cycles.classify("le", "lr, #0x20") == ("loop_end", 0)


def test_a_loop_on_the_cortex_m4_costs_what_the_trm_table_says():
    e = cycles.estimate_code_cycles(LOOP, LOOP_COUNTS, "cortex-m4")
    p = cycles.TIMINGS["cortex-m4"].refill
    assert p == 2
    # movs 1; ldr 2 x 10; the second ldr pipelined: 1 x 10; adds, cmp 1 x 10 each; bne 1 x 10 + P x 9 taken;
    # bx lr 1 + P
    want = 1 + 20 + 10 + 10 + 10 + (10 + 9 * p) + (1 + p)
    assert e.instructions == 52 and e.cycles == want == 82
    assert e.taken_branches == 10 and e.pipelined == 10
    assert e.by_class["load"] == cycles.ClassCost(20, 30.0)
    assert e.by_class["branch_cond"] == cycles.ClassCost(10, 28.0)
    assert sum(c.instructions for c in e.by_class.values()) == e.instructions
    assert e.cycles_in(0x2, 0x6) == 30 and e.instructions_in(0x2, 0x6) == 20
    assert e.cycles_per_instruction == pytest.approx(82 / 52)
    assert e.milliseconds(82_000) == pytest.approx(1.0)
    # no sequence rules: the second load costs 2 as well
    assert cycles.estimate_code_cycles(LOOP, LOOP_COUNTS, "cortex-m4",
                                       cycles.CycleOptions(pipelining=False)).cycles == want + 10
    assert cycles.estimate_code_cycles(LOOP, LOOP_COUNTS, "cortex-m4", cycles.CycleOptions(refill=1)).cycles == 72


def test_per_function_splits_the_cycles():
    e = cycles.estimate_code_cycles(LOOP, LOOP_COUNTS, "cortex-m4")
    split = e.per_function([cycles.Symbol("head", 0x0, 0x2), cycles.Symbol("loop", 0x2, 0xa)])
    assert split == [cycles.FunctionCycles("loop", 50, 78.0), cycles.FunctionCycles("?", 1, 3.0),
                     cycles.FunctionCycles("head", 1, 1.0)]  # most cycles first; "?": what no symbol covers
    aliases = e.per_function([cycles.Symbol("loop", 0x2, 0xa), cycles.Symbol("__loop", 0x3, 0xa)])
    assert aliases[0] == cycles.FunctionCycles("__loop/loop", 50, 78.0)
    nm = "00000000 00000002 T head\n00000003 0000000a t loop\n         U undefined\n"
    assert cycles.symbols_from_nm(nm) == [cycles.Symbol("head", 0, 2), cycles.Symbol("loop", 2, 10)]


def test_an_address_computed_just_before_a_load_stalls_a_cycle_on_the_m3_and_m4():
    code = _code("3204", "6811")  # adds r2, #4 ; ldr r1, [r2]
    counts = {0x0: 5, 0x2: 5}
    assert cycles.estimate_code_cycles(code, counts, "cortex-m4").cycles == 5 + 5 * 3
    assert cycles.estimate_code_cycles(code, counts, "cortex-m33").cycles == 5 + 5 * 2


def test_multiple_loads_cost_one_plus_n_and_a_pop_of_pc_refills():
    e = cycles.estimate_code_cycles(_code("bd10"), {0x0: 4}, "cortex-m4")  # pop {r4, pc}
    assert e.by_class["load_multiple"] == cycles.ClassCost(4, 4 * (1 + 2 + 2))
    assert e.taken_branches == 4
    e = cycles.estimate_code_cycles(_code("bd10"), {0x0: 4}, "cortex-m7")  # two registers a cycle, a predicted return
    assert e.cycles == 4 * (1 + 0.5 * 2 + 1)


def test_divide_multiply_and_the_m3s_long_multiply():
    code = _code("fb91 f0f2", "fb0e 1107", "fba1 0102")  # sdiv r0, r1, r2 ; mla r1, lr, r7, r1 ; umull r0, r1, r1, r2
    counts = {0x0: 1, 0x4: 1, 0x8: 1}
    d = cycles.decode_code(code, counts)
    assert [d[a].cls for a in sorted(d)] == ["div", "mul", "mul_long"], [d[a].text for a in sorted(d)]
    assert cycles.estimate_code_cycles(code, counts, "cortex-m4").cycles == 7 + 1 + 1
    assert cycles.estimate_code_cycles(code, counts, "cortex-m3").cycles == 7 + 1 + 4
    assert cycles.estimate_code_cycles(code, counts, "cortex-m4", cycles.CycleOptions(divide=12)).cycles == 14


def test_helium_on_the_m55_overlaps_and_is_refused_on_the_m4():
    code = _code("ed90 0e80", "ef22 0844")  # vldrb.s16 q0, [r0] ; vadd.i32 q0, q1, q2
    counts = {0x0: 4, 0x4: 4}
    e = cycles.estimate_code_cycles(code, counts, "cortex-m55")
    assert e.by_class == {"mve_load": cycles.ClassCost(4, 8.0), "mve": cycles.ClassCost(4, 4.0)}
    with pytest.raises(UsageError, match="cortex-m4 has no such instructions"):
        cycles.estimate_code_cycles(code, counts, "cortex-m4")


def test_every_core_has_a_full_table_with_its_source():
    assert set(cycles.CORES) == {"cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55"}
    for core, t in cycles.TIMINGS.items():
        assert t.core == core and set(t.cycles) == set(cycles.CLASSES) and t.source
        assert t.estimate == (core not in ("cortex-m3", "cortex-m4")), core
        assert ("estimate" in t.source) == t.estimate
    assert cycles.core_timing("stm32f405") is cycles.TIMINGS["cortex-m4"]  # a board: its core


def test_the_docs_page_holds_the_tables_as_the_code_has_them():
    page = (ROOT / "docs" / "cycles.md").read_text()
    assert cycles.timing_table_markdown() in page
    for t in cycles.TIMINGS.values():
        assert t.core.replace("cortex-m", "Cortex-M") in page


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_user_mistakes_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError) as e:
        cycles.estimate_code_cycles(LOOP, LOOP_COUNTS, "cortex-m99")
    assert "cortex-m99" in _one_line(e) and "cortex-m4" in _one_line(e)
    with pytest.raises(UsageError) as e:
        cycles.estimate_cycles(str(tmp_path / "none.elf"), LOOP_COUNTS, "cortex-m4")
    assert "no such ELF file" in _one_line(e)
    not_elf = tmp_path / "fw.elf"
    not_elf.write_bytes(b"not an elf at all")
    with pytest.raises(UsageError) as e:
        cycles.estimate_cycles(str(not_elf), LOOP_COUNTS, "cortex-m4")
    assert "not an ELF" in _one_line(e)
    with pytest.raises(UsageError) as e:
        cycles.estimate_code_cycles(LOOP, {0x1000: 3}, "cortex-m4")
    assert "0x1000 lies outside" in _one_line(e)
    bad = tmp_path / "profile.txt"
    bad.write_text("0x2 10\nnonsense\n")
    with pytest.raises(UsageError) as e:
        cycles.estimate_code_cycles(LOOP, str(bad), "cortex-m4")
    assert "profile.txt:2" in _one_line(e)
    with pytest.raises(UsageError) as e:
        cycles.estimate_code_cycles(LOOP, str(tmp_path / "missing.txt"), "cortex-m4")
    assert "no such profile file" in _one_line(e)


def test_a_profile_file_reads_as_the_dict(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("".join(f"0x{a:x} {n}\n" for a, n in LOOP_COUNTS.items()))
    assert cycles.read_profile(str(path)) == LOOP_COUNTS
    assert cycles.estimate_code_cycles(LOOP, str(path), "cortex-m4").cycles == 82


# ---- assembled by arm-none-eabi-as (when on PATH): an ELF read with pyelftools, as a firmware's is
ASM = """
    .syntax unified
    .thumb
    .text
    .global f
    .type f, %function
f:
    push {r4, lr}
    movs r0, #0
1:  ldr r1, [r2]
    ldr r3, [r4]
    adds r0, #1
    cmp r0, #10
    bne 1b
    pop {r4, pc}
    .size f, . - f
"""


def test_an_assembled_elf(tmp_path):
    tools = [shutil.which(t) for t in ("arm-none-eabi-as", "arm-none-eabi-ld")]
    if not all(tools):
        print("skipped: arm-none-eabi-as / -ld not on PATH")
        pytest.skip("arm-none-eabi-as / -ld not on PATH")
    (tmp_path / "f.s").write_text(ASM)
    subprocess.run([tools[0], "-mcpu=cortex-m4", "-mthumb", "-o", str(tmp_path / "f.o"), str(tmp_path / "f.s")],
                   check=True)
    subprocess.run([tools[1], "-Ttext=0x100", "-e", "f", "-o", str(tmp_path / "f.elf"), str(tmp_path / "f.o")],
                   check=True)
    elf = str(tmp_path / "f.elf")
    counts = {0x100: 1, 0x102: 1, 0x104: 10, 0x106: 10, 0x108: 10, 0x10a: 10, 0x10c: 10, 0x10e: 1}
    e = cycles.estimate_cycles(elf, counts, "cortex-m4")
    # push {r4, lr} 1 + 2; the loop as LOOP's: 20 + 10 + 10 + 10 + 28; pop {r4, pc} 1 + 2 + P
    assert e.cycles == 3 + 1 + 78 + 5
    assert e.per_function(cycles.function_symbols(elf)) == [cycles.FunctionCycles("f", 53, 87.0)]


# ---- a real firmware: the self-test (an int8 3x3 convolution) on QEMU's Cortex-M4 with the plugin's profile
FIRMWARE = "tflm_patch_kernels/firmware/selftest_cortex_m4.elf"
PLUGIN = "tools/qemu/libinsn_count.so"
BAZEL_TARGETS = ("//tflm_patch_kernels/firmware:selftest_cortex_m4", "//tools/qemu:libinsn_count.so")


def _find(rel: str) -> Path | None:
    for base in (Path.cwd(), ROOT, ROOT / "bazel-bin"):
        if (base / rel).exists():
            return base / rel
    return None


def _built() -> tuple[Path, Path]:
    """The self-test ELF and the plugin: Bazel's (tests/BUILD gives them to this test), or built here with Bazel."""
    elf, plugin = _find(FIRMWARE), _find(PLUGIN)
    if elf and plugin:
        return elf, plugin
    missing = [t for t in ("bazel", "arm-none-eabi-gcc") if not shutil.which(t)]
    if missing or os.environ.get("TEST_SRCDIR"):
        reason = f"{' and '.join(missing)} not on PATH" if missing else "not given the firmware by Bazel"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    r = subprocess.run(["bazel", "build", "--jobs=2", *BAZEL_TARGETS], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    elf, plugin = _find(FIRMWARE), _find(PLUGIN)
    assert elf and plugin
    return elf, plugin


def test_a_firmware_profile_under_qemu(tmp_path):
    if not shutil.which("qemu-system-arm"):
        print("skipped: qemu-system-arm not on PATH")
        pytest.skip("qemu-system-arm not on PATH")
    elf, plugin = _built()
    runner = _find("tools/qemu/run_firmware.py")
    profile, report = tmp_path / "profile.txt", tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(runner), "--elf", str(elf), "--machine", "mps2-an386", "--plugin",
                        str(plugin), "--profile", "3", "--profile-out", str(profile), "--report", str(report),
                        "--quiet", "--timeout", "60"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]
    total = json.loads(report.read_text())["result"]["insns_total"]

    counts = cycles.read_profile(str(profile))
    decoded = cycles.decode(str(elf), counts)  # every profiled instruction decodes (else a UsageError)
    assert set(decoded) == set(counts)
    e = cycles.estimate_cycles(str(elf), str(profile), "cortex-m4")
    assert e.instructions == total  # the profile is the plugin's whole count
    assert sum(c.instructions for c in e.by_class.values()) == total
    assert e.cycles >= e.instructions
    assert 1.0 <= e.cycles_per_instruction <= 2.5, e.summary()
    assert sum(c.cycles for c in e.by_class.values()) == pytest.approx(e.cycles)
    funcs = e.per_function(cycles.function_symbols(str(elf)))
    assert funcs[0].name == "main"  # the convolution is inlined into main
    assert sum(f.instructions for f in funcs) == total and sum(f.cycles for f in funcs) == pytest.approx(e.cycles)
    # the same split from `nm -S` output
    nm = shutil.which("arm-none-eabi-nm")
    if nm:
        text = subprocess.run([nm, "-S", "--defined-only", str(elf)], capture_output=True, text=True).stdout
        assert e.per_function(cycles.symbols_from_nm(text))[0] == funcs[0]
    # every core but the M55-only Helium classes: the M7's dual issue below the M4's, the M3's long multiplies above
    cpi = cycles.cycles_per_instruction(str(elf), counts)
    assert set(cpi) == set(cycles.CORES)
    assert cpi["cortex-m7"] < cpi["cortex-m4"] <= cpi["cortex-m3"]
    print(e.summary())
    print({core: round(v, 3) for core, v in cpi.items()})
