"""What the firmware bench sections share: running Bazel's firmware tests (QEMU) and reading what they recorded.

* ``firmware_reports(section, labels, log)``: runs the sh_tests (``//pkg:name``, tags manual included) and returns
  each one's ``TFMCU_REPORT`` (tools/qemu/run_firmware.py).
* ``generator_record(label)``: the ``host`` record the firmware's generator wrote beside its expectation
  (tools/gen/gen_model_whole.py: model, schedule MACs, predicted arena, reference), from the test's runfiles.

The bench-only firmware (tags manual: only ``make bench`` runs it) is in ``PKG`` (benchmarks/firmware/BUILD); the
firmware of ``make test`` stays with the kernels (tflm_patch_kernels/firmware, tflm_patch_kernels/tflm).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "benchmarks/firmware"


def label(pkg: str, test: str) -> str:
    return f"//{pkg}:{test}"


def _split(test_label: str) -> tuple[str, str]:
    pkg, _, name = test_label[2:].partition(":")
    return pkg, name


def firmware_reports(section: str, labels: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Runs bazel sh_tests of firmware (tags manual included) and returns each one's TFMCU_REPORT."""
    log(f"[{section}] bazel test {' '.join(labels)} (converts MobileNetV2-224 once: about a minute)")
    r = subprocess.run([os.environ.get("BAZEL", "bazel"), "test", *labels, "--test_output=errors"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"bazel test failed (exit {r.returncode}):\n{tail}")
    reports = []
    for test_label in labels:
        pkg, t = _split(test_label)
        with open(os.path.join(ROOT, "bazel-testlogs", pkg, t, "test.log")) as f:
            line = next(x for x in f if x.startswith("TFMCU_REPORT "))
        reports.append(json.loads(line[len("TFMCU_REPORT "):]))
    return reports


def generator_record(test_label: str) -> dict[str, Any]:
    """The generator's ``host`` record of firmware test ``test_label`` (``//pkg:<name>_<target>_test``)."""
    pkg, test = _split(test_label)
    name = test.rsplit("_cortex", 1)[0].rsplit("_stm32", 1)[0]
    with open(os.path.join(ROOT, "bazel-bin", pkg, f"{test}.runfiles", "tfmcu_ws", pkg, f"{name}_expect.json")) as f:
        return json.load(f)["host"]
