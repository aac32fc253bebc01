"""What the firmware bench sections share: running Bazel's firmware tests (QEMU) and reading what they recorded.

* ``firmware_reports(section, pkg, tests, log)``: runs the sh_tests (tags manual included) and returns each one's
  ``TFMCU_REPORT`` (tools/qemu/run_firmware.py).
* ``generator_record(pkg, test)``: the ``host`` record the firmware's generator wrote beside its expectation
  (tools/gen/gen_model_whole.py: model, schedule MACs, predicted arena, reference), from the test's runfiles.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def firmware_reports(section: str, pkg: str, tests: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Runs bazel sh_tests of firmware (tags manual included) and returns each one's TFMCU_REPORT."""
    targets = [f"//{pkg}:{t}" for t in tests]
    log(f"[{section}] bazel test {' '.join(targets)} (converts MobileNetV2-224 once: about a minute)")
    r = subprocess.run([os.environ.get("BAZEL", "bazel"), "test", *targets, "--test_output=errors"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"bazel test failed (exit {r.returncode}):\n{tail}")
    reports = []
    for t in tests:
        with open(os.path.join(ROOT, "bazel-testlogs", pkg, t, "test.log")) as f:
            line = next(x for x in f if x.startswith("TFMCU_REPORT "))
        reports.append(json.loads(line[len("TFMCU_REPORT "):]))
    return reports


def generator_record(pkg: str, test: str) -> dict[str, Any]:
    """The generator's ``host`` record of firmware test ``test`` (``<name>_<target>_test``)."""
    name = test.rsplit("_cortex", 1)[0].rsplit("_stm32", 1)[0]
    with open(os.path.join(ROOT, "bazel-bin", pkg, f"{test}.runfiles", "tfmcu_ws", pkg, f"{name}_expect.json")) as f:
        return json.load(f)["host"]
