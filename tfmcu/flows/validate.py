"""Validation on a board: the report a deployed firmware prints on its console UART, read from a serial port and
checked against the deploy folder's ``expect.json`` (TF Lite's outputs, the predicted arena).

``validate(ValidateOptions(port=..., expect=...))`` runs ``tools/qemu/run_firmware.py --serial PORT`` (pyserial: a
board's USB serial, or QEMU's UART on a pseudo-terminal: the same code path), which reads lines until the firmware's
``TFMCU_EXIT`` line and checks its ``TFMCU_RESULT`` as a QEMU run's (the firmware's status, ``expect``, the arena
within ``expect_within``). The firmware must be built with ``--console=uart`` (a semihosting console prints nothing
on a board without a debugger). The report: passed or not and why, the outputs' verdict, the measured arena and
stack, the ticks of each Invoke (the board's timer: core cycles where the board links board_dwt) and, with the
board's clock, milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.errors import UsageError
from tfmcu.files import check_output_paths, write_outputs
from tfmcu.firmware.sources import ROOT
from tfmcu.records import Record, optional

RUNNER = os.path.join(ROOT, "tools", "qemu", "run_firmware.py")


@dataclass(frozen=True, kw_only=True)
class ValidateOptions:
    port: str  # the serial port: /dev/ttyACM0, COM3, or a pseudo-terminal
    expect: str  # the deploy folder's expect.json
    baud: int = 115200
    timeout_s: float = 120.0  # wall clock from opening the port (reset the board meanwhile)
    json_out: str | None = None


@dataclass(frozen=True, kw_only=True)
class ValidateReport(Record):
    """What ``validate`` read and checked (``--json_out``)."""

    port: str
    expect: str
    passed: bool
    problems: list[str]
    outputs_equal_tflite: bool  # the output hash (and top class) equal expect.json's
    target: str | None = optional()  # the firmware's target name, as it reports it
    arena_used_bytes: int | None = optional()
    stack_hwm_bytes: int | None = optional()
    invoke_ticks: list[int] = field(default_factory=list)
    result: dict[str, Any] | None = optional()  # the firmware's TFMCU_RESULT


def check(o: ValidateOptions) -> None:
    """The options checked (one-line UsageError), expect.json read as a deploy folder's."""
    if o.baud <= 0:
        raise UsageError(f"--baud={o.baud}: must be positive")
    if o.timeout_s <= 0:
        raise UsageError(f"--timeout={o.timeout_s}: must be positive")
    try:
        with open(o.expect) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--expect={o.expect}: no such file (deploy writes expect.json to its --out_dir)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--expect={o.expect}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("expect"), dict):
        raise UsageError(f"--expect={o.expect}: not a deploy folder's expect.json (no \"expect\" object)")
    check_output_paths({"--json_out": o.json_out})


def validate(o: ValidateOptions, log: Callable[[str], None] = print) -> ValidateReport:
    """Reads the firmware's report from ``o.port`` and checks it against ``o.expect`` (see the module docstring)."""
    check(o)
    log(f"validate: reading {o.port} at {o.baud} baud for up to {o.timeout_s:g} s (reset the board if it has already "
        f"run) ...")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        r = subprocess.run([sys.executable, RUNNER, "--serial", o.port, "--baud", str(o.baud), "--expect", o.expect,
                            "--timeout", str(o.timeout_s), "--report", out, "--quiet"],
                           capture_output=True, text=True)
        if r.returncode == 2:  # the port could not be opened
            raise UsageError((r.stderr.strip().splitlines() or [f"--port={o.port}: cannot open it"])[-1]
                             .replace("run_firmware: ", "--port: "))
        if not os.path.exists(out):
            raise UsageError(f"--port={o.port}: {(r.stderr or r.stdout).strip()[-300:]}")
        with open(out) as f:
            rep = json.load(f)
    res = rep.get("result") or {}
    problems = list(rep.get("problems", []))
    hashes = ("output_fnv1a32", "top_class")
    report = ValidateReport(
        port=o.port, expect=o.expect, passed=not problems, problems=problems,
        outputs_equal_tflite=bool(res) and not any(p.startswith(hashes) for p in problems) and res.get("status") == 0,
        target=res.get("target"), arena_used_bytes=res.get("arena_used_bytes"), stack_hwm_bytes=res.get("stack_hwm"),
        invoke_ticks=[int(g["ticks"]) for g in res.get("regions", [])], result=res or None)
    if o.json_out:
        write_outputs({o.json_out: json.dumps(report.to_json(), indent=1) + "\n"})
    log(summary(report))
    return report


def summary(r: ValidateReport) -> str:
    """The report in a few lines."""
    lines = [f"validate: {'passed' if r.passed else 'FAILED'}: {r.target or 'the firmware'} on {r.port}"]
    if r.result:
        lines.append(f"  outputs {'equal' if r.outputs_equal_tflite else 'DIFFER from'} TF Lite's (expect.json) on "
                     f"{len(r.invoke_ticks)} inputs; arena {r.arena_used_bytes:,} B used, stack high-water mark "
                     f"{r.stack_hwm_bytes:,} B; ticks per Invoke {', '.join(f'{t:,}' for t in r.invoke_ticks)}")
    lines += [f"  {p}" for p in r.problems]
    return "\n".join(lines)
