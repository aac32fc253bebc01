#!/usr/bin/env python3
"""Runs a firmware ELF under qemu-system-arm and reports what it measured.

usage: run_firmware.py --elf FW.elf --machine mps2-an386 [--plugin libinsn_count.so] [--expect EXPECT.json]
                       [--range LO:HI | --range-symbol FUNC] [--profile TOP] [--profile-out PROFILE.txt]
                       [--timeout 120] [--report OUT.json]
                       [--console semihosting|uart [--console-serial N]] [--quiet]
       run_firmware.py --serial PORT [--baud 115200] [--expect EXPECT.json] [--timeout 120] [--report OUT.json]

- Sizes: .text/.rodata/.data/.bss/.stack of the ELF (arm-none-eabi-size -A).
- Runs `qemu-system-arm -M MACHINE -icount shift=0 -semihosting ...` with a wall-clock timeout; the
  firmware's exit status (semihosting SYS_EXIT_EXTENDED) is QEMU's. With --console uart (a firmware built with
  -DTFMCU_CONSOLE_UART) semihosting is off: the output is the board's first UART (-serial stdio) and the firmware's
  last line `TFMCU_EXIT <status>` gives the status; QEMU is stopped after it. `-icount shift=0` makes the MPS2 timer,
  and so the firmware's "ticks", deterministic (one tick per 40 instructions on MPS2, per instruction on the
  STM32F405 of netduinoplus2).
- With --plugin (tools/qemu/insn_count.c), exact instruction counts: the plugin watches the ELF's
  tfmcu_cost_begin / tfmcu_cost_end markers and its regions are matched, in order, to the regions the
  firmware names in its result line; each gets "insns" (and "range_insns": those inside --range or the function
  --range-symbol). The timer must agree (insns ~ TICK_INSNS x ticks).
- --profile N (with --plugin): instructions per function over the whole run (the plugin's per-address counts
  summed over `nm -S` symbols), the N largest in the report's "profile" and printed; for finding where a
  kernel's instructions go, not a measure of one Invoke. --profile-out PATH keeps the plugin's per-address counts
  ("0xADDR COUNT" lines: what tfmcu.firmware.cycles estimates cycles from).
- --segments PATH (with --plugin): the plugin's per-address counts split at every cost marker, written to PATH
  (insn_count.c's segments=: tfmcu/firmware/profile.py reads each op's addresses from it).
- A firmware built in per-op mode (-DTFMCU_PROFILE_OPS: its result has "profiled_ops" N) opens one plugin region per
  op of its first Invoke, inside that Invoke's: the plugin's regions are then the first named region, the N ops and
  the other named regions; the ops' counts go into the result's "op_insns", in the order of its "op_tags".
- Parses the firmware's one `TFMCU_RESULT {json}` line (tflm_patch_kernels/firmware/harness.h).
- --expect: a JSON file {"expect": {key: value, ...}} (e.g. a checksum computed on the host); every key
  must be in the result with exactly that value. With "expect_failure": "TEXT" next to "expect", the run must
  fail: the firmware's status 1 with a failure containing TEXT (e.g. a model that does not fit the arena).
  "expect_within": {key: [value, fraction]} requires |result[key] - value| <= fraction x value (e.g. the measured
  arena against the host's prediction).

Prints a short human summary and one line `TFMCU_REPORT {json}` (result + sizes + counts); writes the
report to --report, and into $TEST_UNDECLARED_OUTPUTS_DIR when run by `bazel test`. Exit status: 0 if
QEMU exited 0, a result line was found, its status is 0 and every expectation holds; else 1 (or QEMU's
non-zero status).

--serial PORT: no QEMU; the report of a firmware on a board (or QEMU's UART on a pseudo-terminal) read from the
serial port PORT (pyserial) until its TFMCU_EXIT line, then checked as above (sizes and counts need the ELF and
QEMU: none). Exit status 2 when the port cannot be opened.

Standard library only for QEMU runs: it runs with any python3 (Bazel's sh_test uses /usr/bin/python3); --serial
imports pyserial.
"""
import argparse
import bisect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

RESULT_RE = re.compile(r"^TFMCU_RESULT (\{.*\})\s*$", re.M)
PLUGIN_RE = re.compile(r"^INSN_COUNT (\{.*\})\s*$", re.M)
# Instructions per timer tick under -icount shift=0 (one instruction per ns): the MPS2 APB timer runs at 25 MHz, QEMU
# clocks the STM32 timers at 1 GHz.
# What the example application (examples/classify/main.c) prints: its top class, the hash of its output bytes, the
# invoke's timer ticks and the arena TFLM used.
EXAMPLE_RE = {"top_class": re.compile(r"^top-1: class (\d+)", re.M),
              "output_fnv1a32": re.compile(r"^output fnv1a32: (0x[0-9a-f]{8})", re.M),
              "ticks": re.compile(r"^invoke: (\d+) ticks", re.M),
              "arena_used_bytes": re.compile(r"^arena used: (\d+) B", re.M)}
TICK_INSNS = {"mps2-an385": 40, "mps2-an386": 40, "mps2-an500": 40, "netduinoplus2": 1}


def _tool(name, override):
    path = override or shutil.which(name) or os.path.join("/usr/bin", name)
    if not os.path.exists(path):
        raise SystemExit("run_firmware: %s not found (make setup installs it)" % name)
    return path


def elf_sizes(elf, size_tool):
    """Section sizes (bytes) from `size -A`; plus flash/ram totals."""
    out = subprocess.run([size_tool, "-A", elf], check=True, capture_output=True, text=True).stdout
    sections = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(".") and parts[1].isdigit():
            sections[parts[0]] = int(parts[1])
    get = lambda *names: sum(sections.get(n, 0) for n in names)  # noqa: E731
    text = get(".vectors", ".text", ".ARM.exidx", ".ARM.extab", ".init_array")
    return {
        "text": text,
        "rodata": get(".rodata"),
        "data": get(".data"),
        "bss": get(".bss"),
        "stack": get(".stack"),
        "flash": text + get(".rodata", ".data"),
        # read-only data in the MPS2 boards' PSRAM (mps2.ld: a model beyond the 4 MiB code memory); 0 otherwise
        "psram": get(".model_psram"),
        "ram": get(".data", ".bss", ".stack"),
    }


def elf_symbols(elf, nm_tool, names):
    out = subprocess.run([nm_tool, elf], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in names:
            found[parts[2]] = int(parts[0], 16)
    return found


def symbol_range(elf, nm_tool, name):
    """"LO:HI" of function `name` (from `nm -S`), for the plugin's range count."""
    out = subprocess.run([nm_tool, "-S", elf], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == name:
            lo = int(parts[0], 16) & ~1
            return "0x%x:0x%x" % (lo, lo + int(parts[1], 16))
    raise SystemExit("run_firmware: no sized symbol %s in %s" % (name, elf))


def function_profile(elf, nm_tool, profile_text, top):
    """[(function, instructions)], largest first: the plugin's per-address counts summed per sized symbol."""
    out = subprocess.run([nm_tool, "-S", "--defined-only", elf], check=True, capture_output=True, text=True).stdout
    spans = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            lo = int(parts[0], 16) & ~1
            spans.append((lo, lo + int(parts[1], 16), parts[3]))
    spans.sort()
    los = [s[0] for s in spans]
    totals = {}
    for line in profile_text.splitlines():
        pc, count = line.split()
        pc = int(pc, 16)
        k = bisect.bisect_right(los, pc) - 1
        name = spans[k][2] if k >= 0 and pc < spans[k][1] else "?"
        totals[name] = totals.get(name, 0) + int(count)
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


EXIT_RE = re.compile(r"^TFMCU_EXIT (-?\d+)\s*$", re.M)


def run_qemu(args, plugin_out):
    cmd = [_tool("qemu-system-arm", args.qemu), "-M", args.machine, "-nographic", "-monitor", "none"]
    if args.console == "uart":  # the firmware's report on one of the board's UARTs, semihosting off
        cmd += ["-serial", "null"] * args.console_serial + ["-serial", "stdio"]
    else:
        cmd += ["-serial", "none", "-semihosting-config", "enable=on,target=native"]
    if not args.no_icount:
        cmd += ["-icount", "shift=0"]
    if args.plugin:
        syms = elf_symbols(args.elf, _tool("arm-none-eabi-nm", args.nm), {"tfmcu_cost_begin", "tfmcu_cost_end"})
        if len(syms) != 2:
            raise SystemExit("run_firmware: %s lacks tfmcu_cost_begin/tfmcu_cost_end (link the harness)" % args.elf)
        popts = ["begin=0x%x" % syms["tfmcu_cost_begin"], "end=0x%x" % syms["tfmcu_cost_end"], "out=" + plugin_out]
        if args.range_symbol:
            args.range = symbol_range(args.elf, _tool("arm-none-eabi-nm", args.nm), args.range_symbol)
        if args.range:
            popts.append("range=" + args.range)
        if args.profile or args.profile_out or args.segments:
            popts.append("profile=" + plugin_out + ".profile")
        if args.segments:
            popts.append("segments=" + os.path.abspath(args.segments))
        cmd += ["-plugin", ",".join([os.path.abspath(args.plugin)] + popts)]
    cmd += ["-kernel", args.elf]
    if args.console == "uart":
        return _run_until_exit_line(cmd, args.timeout)
    try:
        # QEMU 7.2 writes semihosting output to stderr: merge the streams, in order.
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=args.timeout)
        return p.returncode, p.stdout.decode(errors="replace"), cmd
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        return None, out, cmd


def read_serial(port, baud, timeout):
    """The firmware's report from a serial port: lines until its TFMCU_EXIT line (harness.c) or ``timeout`` seconds.
    Returns (its status, or None on a timeout; the text). SystemExit(2) when the port cannot be opened."""
    import time

    try:
        import serial  # pyserial
    except ImportError:
        raise SystemExit("run_firmware: --serial needs pyserial (make setup installs it)") from None
    try:
        ser = serial.Serial(port, baudrate=baud, timeout=0.2)
    except (serial.SerialException, OSError, ValueError) as e:
        print("run_firmware: cannot open the serial port %s: %s" % (port, e), file=sys.stderr)
        raise SystemExit(2) from None
    lines, buf, end = [], b"", time.monotonic() + timeout
    with ser:
        while time.monotonic() < end:
            buf += ser.read(4096)
            *done, buf = buf.split(b"\n")
            new = [raw.decode(errors="replace").rstrip("\r") + "\n" for raw in done]
            lines += new
            if any(EXIT_RE.match(ln) for ln in new):
                break
    out = "".join(lines) + buf.decode(errors="replace")
    m = EXIT_RE.search(out)
    return (int(m.group(1)) if m else None), out


def _run_until_exit_line(cmd, timeout):
    """A UART-console run: the firmware cannot stop QEMU, so its last line says how it ended (TFMCU_EXIT <status>,
    harness.c); QEMU is stopped (SIGTERM: the plugin still writes its counts) once that line is read. Returns
    (that status, or None on a timeout or when QEMU ends without it; the output; cmd)."""
    import threading

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    done = threading.Event()

    def read():
        for raw in iter(p.stdout.readline, b""):
            lines.append(raw.decode(errors="replace"))
            if EXIT_RE.match(lines[-1]):
                break
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done.wait(timeout)
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    reader.join(5)
    out = "".join(lines)
    m = EXIT_RE.search(out)
    return (int(m.group(1)) if m else None), out, cmd


def check_expect(result, expect):
    problems = []
    for key, want in expect.items():
        if key not in result:
            problems.append("%s: missing (want %r)" % (key, want))
        elif result[key] != want:
            problems.append("%s: got %r, want %r" % (key, result[key], want))
    return problems


def _qemu_run(args):
    """QEMU's run of --elf: (its status, its output, the command, the plugin's text, the --profile functions)."""
    with tempfile.TemporaryDirectory() as tmp:
        plugin_out = os.path.join(tmp, "insn_count.txt")
        rc, output, cmd = run_qemu(args, plugin_out)
        plugin_text = open(plugin_out).read() if os.path.exists(plugin_out) else ""
        profile = None
        if args.plugin and args.profile and os.path.exists(plugin_out + ".profile"):
            with open(plugin_out + ".profile") as f:
                profile = function_profile(args.elf, _tool("arm-none-eabi-nm", args.nm), f.read(), args.profile)
        if args.plugin and args.profile_out and os.path.exists(plugin_out + ".profile"):
            shutil.copyfile(plugin_out + ".profile", args.profile_out)
    return rc, output, cmd, plugin_text, profile


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elf", help="the firmware (required but with --serial)")
    ap.add_argument("--serial", help="read the report of a firmware on a board from this serial port (no QEMU)")
    ap.add_argument("--baud", type=int, default=115200, help="with --serial: the port's baud rate")
    ap.add_argument("--machine", help="mps2-an386 (Cortex-M4) or mps2-an500 (Cortex-M7), ... (not with --sizes-only)")
    ap.add_argument("--sizes-only", action="store_true",
                    help="no run: the report holds the ELF's sizes (a core no QEMU board runs)")
    ap.add_argument("--plugin", help="the insn_count QEMU plugin (.so)")
    ap.add_argument("--range", help="LO:HI addresses whose instructions the plugin counts separately")
    ap.add_argument("--range-symbol", help="the same for one function, e.g. tfmcu_conv2d_s8")
    ap.add_argument("--profile", type=int, default=0, help="with --plugin: the N functions that ran most instructions")
    ap.add_argument("--profile-out", help="with --plugin: write the per-address counts (0xADDR COUNT) here")
    ap.add_argument("--segments", help="with --plugin: write the per-address counts split at every marker here")
    ap.add_argument("--expect", help='JSON file {"expect": {key: value}}')
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds (wall clock)")
    ap.add_argument("--report", help="write the report JSON here")
    ap.add_argument("--no-icount", action="store_true", help="run without -icount (ticks become host time)")
    ap.add_argument("--console", choices=("semihosting", "uart"), default="semihosting",
                    help="where the firmware writes: semihosting (its exit status is QEMU's), or the board's UART "
                         "(semihosting off; the firmware's last line TFMCU_EXIT <status> ends the run)")
    ap.add_argument("--console-serial", type=int, default=0,
                    help="--console uart: which of the QEMU board's serial ports the firmware's UART is (0: the first)")
    ap.add_argument("--example", action="store_true",
                    help="the ELF is the example application: check its printed top class and output hash against "
                         "--expect's \"example\" (no TFMCU_RESULT line)")
    ap.add_argument("--quiet", action="store_true", help="no firmware output echo")
    ap.add_argument("--qemu")
    ap.add_argument("--size-tool")
    ap.add_argument("--nm")
    args = ap.parse_args(argv)

    problems = []
    expect = {}
    if args.expect:
        with open(args.expect) as f:
            expect = json.load(f)
    want_failure = expect.get("expect_failure")
    if not args.elf and not args.serial:
        ap.error("--elf is required (or --serial)")
    sizes = elf_sizes(args.elf, _tool("arm-none-eabi-size", args.size_tool)) if args.elf else None
    if args.sizes_only:
        report = {"elf": os.path.basename(args.elf), "machine": None, "problems": [], "result": None, "sizes": sizes}
        if args.report:
            with open(args.report, "w") as f:
                json.dump(report, f, indent=1, sort_keys=True)
        print("TFMCU_REPORT " + json.dumps(report, sort_keys=True))
        return 0
    if args.serial:
        rc, output = read_serial(args.serial, args.baud, args.timeout)
        cmd, plugin_text, profile = ["serial", args.serial], "", None
        args.plugin = None
    elif not args.machine:
        ap.error("--machine is required (or --sizes-only, or --serial)")
    else:
        rc, output, cmd, plugin_text, profile = _qemu_run(args)

    if not args.quiet:
        sys.stdout.write(output if output.endswith("\n") or not output else output + "\n")
    if rc is None:
        problems.append("timed out after %gs" % args.timeout + (" (no TFMCU_EXIT line)" if args.serial else ""))
    elif rc != 0 and not (want_failure and rc == 1):
        problems.append("%s exit status %d" % ("firmware" if args.serial else "qemu", rc))
    if "Lockup" in output:
        # A fault whose exception frame cannot be pushed: usually the stack ran past its limit (mps2.ld).
        problems.append("CPU lockup (stack overflow past __stack_limit?)")

    if args.example:  # the example application: its printed lines, checked against expect.json's "example"
        result = {k: (([int(m.group(1))] if k == "top_class" else m.group(1) if k == "output_fnv1a32"
                       else int(m.group(1))) if m else None)
                  for k, m in ((k, r.search(output)) for k, r in EXAMPLE_RE.items())}
        problems += ["the example printed no %s line" % k for k, v in result.items() if v is None]
        problems += check_expect(result, {k: v for k, v in expect.get("example", {}).items() if k != "how"})
        report = {"elf": os.path.basename(args.elf) if args.elf else None, "machine": args.machine,
                  "serial": args.serial, "qemu_status": rc, "sizes": sizes, "example": result, "problems": problems}
        if args.report:
            with open(args.report, "w") as f:
                json.dump(report, f, indent=1, sort_keys=True)
        print("TFMCU_REPORT " + json.dumps(report, sort_keys=True))
        if problems:
            print("FAILED: " + "; ".join(problems), file=sys.stderr)
            return rc if rc not in (None, 0) else 1
        return 0

    results = RESULT_RE.findall(output)
    result = None
    if not results:
        problems.append("no TFMCU_RESULT line in the output")
    else:
        if len(results) > 1:
            problems.append("%d TFMCU_RESULT lines (want one)" % len(results))
        try:
            result = json.loads(results[-1])
        except ValueError as e:
            problems.append("TFMCU_RESULT is not JSON: %s" % e)

    counts = None
    if args.plugin:
        m = PLUGIN_RE.search(plugin_text)
        if not m:
            problems.append("the instruction-count plugin wrote nothing")
        else:
            counts = json.loads(m.group(1))
    if result is not None:
        if want_failure:
            if result.get("status") != 1 or not any(want_failure in f for f in result.get("failures", [])):
                problems.append("expected a failure containing %r, got status %r, failures: %s" % (
                    want_failure, result.get("status"), result.get("failures")))
        elif result.get("status") != 0:
            problems.append("firmware status %r, failures: %s" % (result.get("status"), result.get("failures")))
        regions = result.get("regions", [])
        if counts is not None:
            if counts["open"] or counts["bad_nesting"] or counts["dropped"]:
                problems.append("plugin: unbalanced cost regions %s" % counts)
            n_ops = int(result.get("profiled_ops") or 0)
            if n_ops and regions and len(counts["regions"]) >= 1 + n_ops:  # per-op mode: the ops inside region 0
                ops = counts["regions"][1:1 + n_ops]
                result["op_insns"] = [c["insns"] for c in ops]
                if args.range:  # each op's instructions in the --range too
                    result["op_range_insns"] = [c.get("range_insns", 0) for c in ops]
                counts = dict(counts, regions=counts["regions"][:1] + counts["regions"][1 + n_ops:])
            if len(counts["regions"]) != len(regions):
                problems.append("plugin counted %d regions, firmware named %d" % (len(counts["regions"]), len(regions)))
            else:
                for reg, cnt in zip(regions, counts["regions"]):
                    reg["insns"] = cnt["insns"]
                    if args.range:
                        reg["range_insns"] = cnt["range_insns"]
                    # The timer is the plugin's independent check (only deterministic with -icount).
                    tick = TICK_INSNS.get(args.machine)
                    if tick and not args.no_icount and abs(cnt["insns"] - tick * reg["ticks"]) > 2 * tick + 64:
                        problems.append("region %s: plugin %d insns, timer %d ticks (x%d = %d) disagree" % (
                            reg["name"], cnt["insns"], reg["ticks"], tick, tick * reg["ticks"]))
            result["insns_total"] = counts["total"]
        if expect:
            problems += check_expect(result, expect.get("expect", {}))
            for key, (want, frac) in expect.get("expect_within", {}).items():
                got = result.get(key)
                if not isinstance(got, (int, float)) or abs(got - want) > frac * want:
                    problems.append("%s: got %r, want %r within %g%%" % (key, got, want, 100 * frac))

    report = {
        "elf": os.path.basename(args.elf) if args.elf else None,
        "machine": args.machine,
        "serial": args.serial,
        "qemu_status": rc,
        "cost_source": "plugin" if counts is not None else "icount-timer",
        "sizes": sizes,
        "result": result,
        "problems": problems,
    }
    if profile is not None:
        report["profile"] = [{"function": name, "insns": n} for name, n in profile]
        for name, n in profile:
            print("%14d  %s" % (n, name))
    _print_summary(report)
    print("TFMCU_REPORT " + json.dumps(report, sort_keys=True))
    for path in filter(None, [args.report, os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")]):
        if os.path.isdir(path):
            path = os.path.join(path, os.path.splitext(os.path.basename(args.elf or "serial"))[0] + ".report.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
            f.write("\n")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        print("command: " + " ".join(cmd), file=sys.stderr)
        return rc if rc not in (None, 0) else 1
    return 0


_HARNESS_KEYS = {"target", "sram_budget", "ram_static", "stack_size", "stack_hwm", "regions", "failures", "status",
                 "insns_total"}


def _print_summary(report):
    s, r = report["sizes"] or {}, report["result"] or {}
    print("== %s on %s (%s)" % (report["elf"] or "the firmware", report["machine"] or report.get("serial"),
                                r.get("target", "?")))
    if s:
        print("   flash %d (.text %d, .rodata %d, .data %d)   ram %d (.data %d, .bss %d, .stack %d) of budget %s" % (
            s["flash"], s["text"], s["rodata"], s["data"], s["ram"], s["data"], s["bss"], s["stack"],
            r.get("sram_budget", "?")))
    if s.get("psram"):
        print("   psram %d (read-only data outside the code memory: the model)" % s["psram"])
    if r:
        print("   stack high-water mark: %s of %s bytes" % (r.get("stack_hwm"), r.get("stack_size")))
        own = {k: v for k, v in r.items() if k not in _HARNESS_KEYS}
        if own:
            print("   result: " + ", ".join("%s=%s" % kv for kv in own.items()))
        for reg in r.get("regions", []):
            print("   region %-24s insns %12s   ticks %10s" % (reg["name"], reg.get("insns", "-"), reg["ticks"]))


if __name__ == "__main__":
    sys.exit(main())
