"""Run a function in a child Python process, so that an interpreter that aborts cannot take the caller down.

TFLM and TF Lite ``abort()`` the whole process on some models (a failed ``TFLITE_CHECK``, e.g. an int8 SOFTMAX
whose input scale puts its fixed-point multiplier out of range). ``isolated(fn, *args, where=...)`` pickles the
function (by reference: module and name) and its arguments, runs it with ``python -m tfmcu.runtime.isolate`` and
returns its result; a crash (abort, segfault), a non-zero exit or a ``TfmcuError`` in the child becomes a one-line
``TFLMError`` naming ``where`` and, when the child announced it (``phase``), which interpreter was running.

``@isolatable`` gives a runner (``run_tflite``, ``run_tflm``, ``measure_arena``, ``evaluate``) an ``isolate``
keyword: ``isolate=True`` makes the call through ``isolated``, its ``where`` argument naming the model. A parsed
model (``tfmcu.tflite.model.TfliteModel``) travels to the child as its bytes.
"""

from __future__ import annotations

import functools
import inspect
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable

from tfmcu.errors import TfmcuError
from tfmcu.runtime.model_io import TFLMError

_PHASE = "tfmcu-runtime-phase: "
_WORKER_ENV = "TFMCU_RUNTIME_WORKER"
_FUNC_PHASE = {"measure_arena": "TFLM", "run_tflm": "TFLM", "run_tflite": "TF Lite", "evaluate": "the interpreter"}


def phase(name: str) -> None:
    """Tell a parent ``isolated`` call which interpreter runs now (so a crash can be attributed)."""
    if os.environ.get(_WORKER_ENV) == "1":
        print(f"{_PHASE}{name}", file=sys.stderr, flush=True)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def isolated(fn: Callable[..., Any], *args: Any, where: str = "model", timeout: float | None = None,
             **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a child Python process (see the module docstring); ``fn`` must be a module-level
    function of an importable module."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env[_WORKER_ENV] = "1"
    name = getattr(fn, "__name__", str(fn))
    with tempfile.TemporaryDirectory(prefix="tfmcu-runtime-") as tmp:
        req, res = os.path.join(tmp, "request.pkl"), os.path.join(tmp, "result.pkl")
        with open(req, "wb") as f:
            pickle.dump((fn, args, kwargs), f, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            proc = subprocess.run([sys.executable, "-m", "tfmcu.runtime.isolate", req, res], env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TFLMError(f"{where}: {name} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(res):
            how = _signal_name(proc.returncode) if proc.returncode < 0 else f"exit status {proc.returncode}"
            who = _FUNC_PHASE.get(name, name)
            other: list[str] = []
            for ln in proc.stderr.splitlines():
                if ln.startswith(_PHASE):
                    who, other = ln[len(_PHASE):].strip(), []
                elif ln.strip() and not ln.startswith(("WARNING:", "I0000", "W0000", "E0000")):
                    other.append(ln.strip())
            detail = other[0] if other else ("a failed TFLITE_CHECK, e.g. a quantization scale out of range"
                                             if how == "SIGABRT" else "")
            raise TFLMError(f"{where}: {who} crashed ({how})" + (f": {detail}" if detail else ""))
        with open(res, "rb") as f:
            ok, value = pickle.load(f)
    if not ok:
        raise TFLMError(value)
    return value


def isolatable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with an ``isolate=False`` keyword (see the module docstring); ``fn`` is module-level and its arguments
    pickle."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, isolate: bool = False, **kwargs: Any) -> Any:
        if not isolate:
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return isolated(call, *bound.args, where=str(bound.arguments.get("where", "model")), **bound.kwargs)

    return call


def _worker(request: str, result: str) -> int:
    with open(request, "rb") as f:
        fn, args, kwargs = pickle.load(f)
    try:
        value = (True, fn(*args, **kwargs))
    except TfmcuError as e:
        value = (False, str(e))
    except Exception as e:  # anything unexpected still comes back as one line
        value = (False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    with open(result + ".tmp", "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(result + ".tmp", result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m tfmcu.runtime.isolate REQUEST.pkl RESULT.pkl  (worker of isolated())",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
