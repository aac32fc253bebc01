"""Result files: the JSON a measuring run wrote, with the record of the run (date, host, command), and where the
docs keep the copies their figures are rendered from (``docs/results/<name>.json``, ``benchmarks.docs``).

A result is a JSON object; its ``run`` entry records the run: ``date`` (ISO), ``host`` (machine and cores, not its
name) and ``command`` (what was run, from the checkout's root). ``make bench`` writes it into every section's JSON;
``benchmarks.docs --publish`` adds it to a run's JSON that has none (``make demo``'s ``summary.json``).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from typing import Any, Callable

from tfmcu.plan import latency

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "docs", "results")
# Results that a run writes into the source tree itself (not copied: the committed file is the run's output), with
# their reader: the latency calibration (``python -m benchmarks.latency``), read as the predictor reads it.
SOURCES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "latency_calibration": (os.path.join("tfmcu", "plan", "latency_calibration.json"), latency.load_calibration)}


def command_line(argv: list[str] | None = None) -> str:
    """``argv`` as the command a user types from the checkout's root: ``python -m pipelines.bench --sections=...``
    (a module run by ``-m`` shows its path in ``sys.argv[0]``)."""
    argv = list(sys.argv if argv is None else argv)
    first = os.path.abspath(argv[0]) if argv else ""
    if first.endswith(".py") and first.startswith(ROOT + os.sep):
        module = os.path.relpath(first, ROOT)[:-3].replace(os.sep, ".")
        return " ".join(["python -m " + module.removesuffix(".__main__")] + argv[1:])
    return " ".join(["python"] + argv)


def run_record(argv: list[str] | None = None, date: datetime.date | None = None) -> dict[str, Any]:
    """The record of the run in progress: date, host (machine, cores, OS; not its name) and command."""
    return {"date": (date or datetime.date.today()).isoformat(),
            "host": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            "command": command_line(argv)}


def path_of(name: str, root: str = ROOT) -> str:
    """Where result ``name`` lives: ``docs/results/<name>.json``, or its file in the tree (``SOURCES``)."""
    if name in SOURCES:
        return os.path.join(root, SOURCES[name][0])
    return os.path.join(root, "docs", "results", f"{name}.json")


def load(name: str, root: str = ROOT) -> dict[str, Any] | None:
    """Result ``name``, or None when it has not been published."""
    path = path_of(name, root)
    if not os.path.isfile(path):
        return None
    if name in SOURCES:
        return SOURCES[name][1](path)
    with open(path) as f:
        return json.load(f)


def with_run(data: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A run's JSON as a result: an object with its ``run`` record (``run`` added when it has none; a bare list of
    rows becomes ``{"rows": [...]}``)."""
    out = {"rows": data} if isinstance(data, list) else dict(data)
    out.setdefault("run", run)
    return out
