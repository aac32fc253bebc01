"""Run int8 / float .tflite models in the real TFLM interpreter (the ``tflite-micro`` wheel) and in TF Lite, and
measure TFLM's tensor arena.

* ``measure_arena(model)``: build a TFLM interpreter (recording allocator) and parse ``print_allocations()``:
  total / head (planned activations + scratch buffers) / tail (persistent) bytes and the per-type lines.
  TFLM prints from C, so the text is captured at the file-descriptor level (``capture_fds``). The arena is chosen
  generously (``max(4 MiB, 10 x model + 1 MiB)``, a multiple of 16) and doubled on an allocation failure; the
  figures do not depend on the arena size (checked: 4 MiB and 64 MiB give the same bytes).
* ``run_tflm(model, samples)`` / ``run_tflite(model, samples)``: outputs per sample. TF Lite runs with the
  reference kernels (``OpResolverType.BUILTIN_REF``, the kernels TFLM's are ported from) or the optimized
  builtin ones (``resolver="builtin"``).
* ``random_inputs(model, n, seed)``: seeded samples matching the model's input tensors (see its docstring for the
  value ranges).

A *sample* is a tuple of arrays, one per model input, each with the input tensor's shape (a bare array is taken as a
1-tuple; an array missing only the leading batch dimension of 1 gets it added). Outputs come back as a list (one per
sample) of lists (one array per model output).

Errors: ``TFLMError`` (a ``ValueError``) with one line: unsupported op, allocation that fails even in a 1 GiB arena,
input shape or dtype mismatch, not a TFLite file.

Isolation: TFLM (and TF Lite) ``abort()`` the whole process on some models (a failed ``TFLITE_CHECK``, e.g. an int8
SOFTMAX whose input scale puts its fixed-point multiplier out of range). ``isolate=True`` (``measure_arena``,
``run_tflm``, ``run_tflite``) and ``evaluate`` run the work in a child Python process (``python -m tfmcu.tflm``) and
turn a crash into a ``TFLMError``; it costs about 0.2 s per call without TensorFlow (measuring, TFLM) and ~3 s with
it (TF Lite). In-process measurement takes ~4 ms for a small model, ~30 ms for MobileNetV2-224 (no memory growth
over repeated calls); one TFLM invoke of int8 MobileNetV2-224 takes ~0.3 s (reference kernels).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from tfmcu import tflite_schema as ts

MIB = 1 << 20
MIN_ARENA = 4 * MIB
MAX_ARENA = 1 << 30
PATCH_STAGE_OP = "TFMCU_PATCH_STAGE"


class TFLMError(ValueError):
    """A model cannot be run or measured; one line."""


# ============================================================================= model I/O signature
@dataclass(frozen=True)
class TensorInfo:
    index: int  # tensor index in subgraph 0
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "int8", "uint8", "float32", ...
    scale: float = 0.0  # per-tensor quantization (0.0: none)
    zero_point: int = 0

    @property
    def signature(self) -> tuple[tuple[int, ...], str]:
        return self.shape, self.dtype


@dataclass(frozen=True)
class ModelInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_ops: int
    op_names: tuple[str, ...]  # "CONV_2D", ... "custom:NAME", per operator

    @property
    def custom_ops(self) -> list[str]:
        return sorted({n.split(":", 1)[1] for n in self.op_names if n.startswith("custom:")})


def _load(model: bytes | ts.ModelT, where: str = "model") -> ts.ModelT:
    if isinstance(model, ts.ModelT):
        return model
    try:
        return ts.load_model(bytes(model), where)
    except ts.SchemaError as e:
        raise TFLMError(str(e)) from None


def _tensor_info(m: ts.ModelT, index: int) -> TensorInfo:
    t = m.subgraphs[0].tensors[index]
    try:
        dtype = np.dtype(ts.numpy_dtype(t.type)).name
    except ts.SchemaError:
        dtype = ts.dtype_name(t.type)
    scale, zp = 0.0, 0
    q = t.quantization
    if q is not None and q.scale is not None and len(q.scale) > 0:
        scale = float(np.ravel(q.scale)[0])
        zp = int(np.ravel(q.zeroPoint)[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
    return TensorInfo(int(index), ts.tensor_name(t), shape, dtype, scale, zp)


def model_info(model: bytes | ts.ModelT, where: str = "model") -> ModelInfo:
    """Inputs / outputs of subgraph 0 (in the model's order) and the operator names."""
    m = _load(model, where)
    sg = m.subgraphs[0]
    ins = tuple(_tensor_info(m, int(i)) for i in (sg.inputs if sg.inputs is not None else []))
    outs = tuple(_tensor_info(m, int(i)) for i in (sg.outputs if sg.outputs is not None else []))
    names = []
    for op in sg.operators or []:
        try:
            names.append(ts.op_name(m, op))
        except ts.SchemaError as e:
            raise TFLMError(f"{where}: {e}") from None
    return ModelInfo(ins, outs, len(names), tuple(names))


# ============================================================================= capturing C output
_libc = None


def _c_flush() -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no libc symbols
        pass


@contextlib.contextmanager
def capture_fds(fds: Sequence[int] = (1, 2)) -> Iterator[list[str]]:
    """Redirect the OS-level file descriptors (C ``printf`` / ``fprintf(stderr)``) into a temporary file while the
    block runs; the captured text is appended to the yielded list when the block ends (also on exceptions). The
    original descriptors are always restored."""
    box: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    _c_flush()
    saved: list[tuple[int, int]] = []
    with tempfile.TemporaryFile() as tmp:
        try:
            for fd in fds:
                saved.append((fd, os.dup(fd)))
                os.dup2(tmp.fileno(), fd)
            yield box
        finally:
            _c_flush()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            tmp.seek(0)
            box.append(tmp.read().decode("utf-8", "replace"))


# ============================================================================= arena measurement
@dataclass
class Allocation:
    used: int  # bytes including alignment padding
    requested: int
    count: int


@dataclass
class ArenaStats:
    total: int
    head: int
    tail: int
    by_type: dict[str, Allocation] = field(default_factory=dict)
    arena_size: int = 0  # the arena the interpreter was given for the measurement
    custom: dict[str, Any] | None = None  # custom-mode models: tfmcu.custom_stage.memory_report

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "head": self.head, "tail": self.tail, "arena_size": self.arena_size,
                "by_type": {k: asdict(v) for k, v in self.by_type.items()}}


_TOTAL = re.compile(r"\[RecordingMicroAllocator\] Arena allocation (total|head|tail) (\d+) bytes")
_TYPE = re.compile(r"\[RecordingMicroAllocator\] '([^']+)' used (\d+) bytes with alignment overhead "
                   r"\(requested (\d+) bytes for (\d+) ")


def parse_allocations(text: str) -> ArenaStats:
    """Parse the text ``print_allocations()`` prints."""
    totals: dict[str, int] = {}
    by_type: dict[str, Allocation] = {}
    for line in text.splitlines():
        m = _TOTAL.search(line)
        if m:
            totals[m.group(1)] = int(m.group(2))
            continue
        m = _TYPE.search(line)
        if m:
            by_type[m.group(1)] = Allocation(int(m.group(2)), int(m.group(3)), int(m.group(4)))
    missing = [k for k in ("total", "head", "tail") if k not in totals]
    if missing:
        raise TFLMError(f"no arena {'/'.join(missing)} figure in TFLM's print_allocations output")
    return ArenaStats(totals["total"], totals["head"], totals["tail"], by_type)


def _runtime():
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError as e:  # pragma: no cover - the wheel is a project dependency
        raise TFLMError(f"the tflite-micro wheel is not importable ({e})") from None
    return runtime


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "RecordingMicroAllocator" not in ln]
    return lines[0] if lines else ""


_ALLOC_FAIL = ("Failed to allocate", "Failed to resize buffer", "missing:", "Failed starting model allocation",
               "Too many buffers")


def _default_arena(model: bytes) -> int:
    return max(MIN_ARENA, 10 * len(model) + MIB) // 16 * 16


def check_runnable(info: ModelInfo, where: str = "model") -> None:
    """Refuse models TFLM's stock op resolver cannot run with a clear one-line message."""
    if PATCH_STAGE_OP in info.custom_ops:
        raise TFLMError(f"{where}: custom-mode models ({PATCH_STAGE_OP}) run in tfmcu's host runner "
                        f"(tfmcu.custom_stage.HostRunner), not in stock TFLM")
    if info.custom_ops:
        raise TFLMError(f"{where}: custom ops {', '.join(info.custom_ops)} are not available in stock TFLM")


def make_interpreter(model: bytes, arena_size: int | None = None, where: str = "model",
                     grow: bool = False) -> tuple[Any, int, str]:
    """A TFLM interpreter with its tensors allocated: ``(interpreter, arena_size, captured C text)``.

    Without ``arena_size`` the arena starts at ``max(4 MiB, 10 x model + 1 MiB)`` and doubles on an allocation
    failure up to 1 GiB; a given ``arena_size`` is used as is (``grow`` decides whether it may still grow)."""
    model = bytes(model)
    info = model_info(model, where)
    check_runnable(info, where)
    runtime = _runtime()
    size = int(arena_size) if arena_size else _default_arena(model)
    if arena_size is None:
        grow = True
    while True:
        interp = None
        err: Exception | None = None
        with capture_fds() as out:
            try:
                interp = runtime.Interpreter.from_bytes(model, arena_size=size)
            except (RuntimeError, ValueError) as e:
                err = e
        text = out[0]
        if interp is not None:
            return interp, size, text
        alloc_failure = any(s in text for s in _ALLOC_FAIL)
        if alloc_failure and grow and size < MAX_ARENA:
            size = min(MAX_ARENA, size * 2)
            continue
        detail = _first_error(text) or str(err)
        if alloc_failure:
            raise TFLMError(f"{where}: TFLM cannot allocate the arena in {size} bytes ({detail})")
        raise TFLMError(f"{where}: TFLM cannot load the model ({detail})")


def measure_arena(model: bytes, arena_size: int | None = None, where: str = "model",
                  isolate: bool = False) -> ArenaStats:
    """TFLM's arena figures for ``model`` (bytes of a .tflite), as the wheel's recording allocator reports them
    after ``AllocateTensors`` (the interpreter allocates at construction; invoking does not change them).

    Without ``arena_size`` the arena grows until the model fits (``make_interpreter``); with it, a model that does
    not fit raises ``TFLMError``. Use arena sizes that are multiples of 16: TFLM aligns the tail to the arena end,
    so other sizes add up to 15 bytes of padding to the tail. An arena smaller than the tail can crash the wheel
    (null pointers it does not check): probe small arenas with ``isolate=True``."""
    if isolate:
        return isolated("measure_arena", bytes(model), arena_size, where, where=where)
    interp, size, _ = make_interpreter(model, arena_size, where)
    try:
        with capture_fds() as out:
            interp.print_allocations()
    finally:
        del interp
    stats = parse_allocations(out[0])
    stats.arena_size = size
    return stats


# ============================================================================= running models
def _as_samples(info: ModelInfo, samples: Sequence[Any], where: str) -> list[tuple[np.ndarray, ...]]:
    out = []
    n_in = len(info.inputs)
    for s, sample in enumerate(samples):
        arrays = (sample,) if isinstance(sample, np.ndarray) else tuple(sample)
        if len(arrays) != n_in:
            raise TFLMError(f"{where}: sample {s} has {len(arrays)} arrays, the model has {n_in} inputs")
        fixed = []
        for k, (a, t) in enumerate(zip(arrays, info.inputs)):
            a = np.asarray(a)
            if a.dtype.name != t.dtype:
                raise TFLMError(f"{where}: sample {s} input {k} has dtype {a.dtype.name}, the model wants {t.dtype}")
            if a.shape != t.shape:
                if t.shape[:1] == (1,) and a.shape == t.shape[1:]:
                    a = a[None]
                else:
                    raise TFLMError(f"{where}: sample {s} input {k} has shape {list(a.shape)}, the model wants "
                                    f"{list(t.shape)}")
            fixed.append(np.ascontiguousarray(a))
        out.append(tuple(fixed))
    return out


def run_tflm(model: bytes, samples: Sequence[Any], arena_size: int | None = None, where: str = "model",
             isolate: bool = False) -> list[list[np.ndarray]]:
    """Outputs of the TFLM interpreter for each sample (one interpreter; ``reset()`` before every invoke)."""
    if isolate:
        return isolated("run_tflm", bytes(model), list(samples), arena_size, where, where=where)
    model = bytes(model)
    info = model_info(model, where)
    data = _as_samples(info, samples, where)
    interp, _, _ = make_interpreter(model, arena_size, where)
    results = []
    try:
        for sample in data:
            with capture_fds() as out:
                try:
                    interp.reset()
                    for k, a in enumerate(sample):
                        interp.set_input(a, k)
                    interp.invoke()
                    err = None
                except (RuntimeError, ValueError) as e:
                    err = e
            if err is not None:
                raise TFLMError(f"{where}: TFLM invoke failed ({_first_error(out[0]) or err})")
            results.append([np.array(interp.get_output(j), copy=True) for j in range(len(info.outputs))])
    finally:
        del interp
    return results


def run_tflite(model: bytes, samples: Sequence[Any], resolver: str = "reference", where: str = "model",
               isolate: bool = False) -> list[list[np.ndarray]]:
    """Outputs of ``tf.lite.Interpreter`` for each sample, with the reference kernels (``resolver="reference"``,
    ``OpResolverType.BUILTIN_REF``) or the optimized builtin ones (``"builtin"``)."""
    if isolate:
        return isolated("run_tflite", bytes(model), list(samples), resolver, where, where=where)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    import tensorflow as tf

    model = bytes(model)
    info = model_info(model, where)
    data = _as_samples(info, samples, where)
    kinds = {"reference": tf.lite.experimental.OpResolverType.BUILTIN_REF,
             "builtin": tf.lite.experimental.OpResolverType.BUILTIN}
    if resolver not in kinds:
        raise TFLMError(f"resolver {resolver!r}: expected one of {', '.join(kinds)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
            interp = tf.lite.Interpreter(model_content=model, experimental_op_resolver_type=kinds[resolver])
        interp.allocate_tensors()
    except (RuntimeError, ValueError) as e:
        raise TFLMError(f"{where}: TF Lite cannot load the model ({str(e).splitlines()[0]})") from None
    results = []
    for sample in data:
        for a, t in zip(sample, info.inputs):
            interp.set_tensor(t.index, a)
        interp.invoke()
        results.append([np.array(interp.get_tensor(t.index), copy=True) for t in info.outputs])
    return results


# ============================================================================= inputs
def _consumer_quantization(m: ts.ModelT, tensor_index: int) -> tuple[float, int, str] | None:
    """(scale, zero point, dtype) of the QUANTIZE op output that reads a float input, if any."""
    sg = m.subgraphs[0]
    for op in sg.operators or []:
        if ts.op_name(m, op) == "QUANTIZE" and op.inputs is not None and int(op.inputs[0]) == tensor_index:
            info = _tensor_info(m, int(op.outputs[0]))
            if info.scale:
                return info.scale, info.zero_point, info.dtype
    return None


def input_range(model: bytes | ts.ModelT, tensor: TensorInfo) -> tuple[float, float]:
    """The value range random float inputs are drawn from: the range the input's own quantization represents,
    else that of the QUANTIZE op that reads it, else [-1, 1]."""
    m = _load(model)
    q = (tensor.scale, tensor.zero_point, "int8") if tensor.scale else _consumer_quantization(m, tensor.index)
    if q is None:
        return -1.0, 1.0
    scale, zp, qdtype = q
    lim = np.iinfo(np.dtype(qdtype)) if qdtype in ("int8", "uint8", "int16") else np.iinfo(np.int8)
    return float((lim.min - zp) * scale), float((lim.max - zp) * scale)


def random_inputs(model: bytes, n: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``n`` seeded samples, each a tuple with one array per model input (shape and dtype of the input tensor).

    Integer inputs cover their type's whole range uniformly (int8: [-128, 127], uint8: [0, 255], int16/int32:
    [-32768, 32767]); bool inputs are fair coin flips; float inputs are uniform in the range their quantization
    represents (``input_range``: the input's own scale/zero point, else those of the QUANTIZE op that consumes
    it), else in [-1, 1]."""
    m = _load(model)
    info = model_info(m)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(int(n)):
        sample = []
        for t in info.inputs:
            dt = np.dtype(t.dtype)
            if dt.kind in "iu":
                lim = np.iinfo(dt) if dt.itemsize <= 2 else np.iinfo(np.int16)
                a = rng.integers(lim.min, int(lim.max) + 1, size=t.shape, dtype=np.int64).astype(dt)
            elif dt.kind == "b":
                a = rng.integers(0, 2, size=t.shape).astype(bool)
            elif dt.kind == "f":
                lo, hi = input_range(m, t)
                a = rng.uniform(lo, hi, size=t.shape).astype(dt)
            else:
                raise TFLMError(f"input {t.index} '{t.name}' has type {t.dtype}: no random inputs for it")
            sample.append(a)
        out.append(tuple(sample))
    return out


# ============================================================================= all of it at once, isolated
@dataclass
class Evaluation:
    tflite: list[list[np.ndarray]] | None  # outputs per sample (None when not asked)
    tflm: list[list[np.ndarray]]
    arena: ArenaStats


def evaluate(model: bytes, samples: Sequence[Any], resolver: str | None = "reference", where: str = "model",
             isolate: bool = False) -> Evaluation:
    """TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's arena for one model."""
    if isolate:
        return isolated("evaluate", bytes(model), list(samples), resolver, where, where=where)
    model = bytes(model)
    _phase("TF Lite")
    tfl = run_tflite(model, samples, resolver, where) if resolver else None
    _phase("TFLM")
    outs = run_tflm(model, samples, where=where)
    return Evaluation(tfl, outs, measure_arena(model, where=where))


def evaluate_custom(model: bytes, samples: Sequence[Any], resolver: str | None = "reference",
                    where: str = "model") -> Evaluation:
    """``evaluate`` for a custom-mode model (one TFMCU_PATCH_STAGE op): the stage runs in the C kernels, the rest
    in TF Lite and in TFLM. The arena is the "as run here" figure: the rest's TFLM arena + scratch + input."""
    from tfmcu.custom_stage import HostRunner, memory_report
    from tfmcu.rewrite import RewriteError

    model = bytes(model)
    try:
        runner = HostRunner(model, where)
        _phase("TF Lite")
        tfl = runner.run(samples, rest="tflite") if resolver else None
        _phase("TFLM")
        outs = runner.run(samples, rest="tflm")
        mem = memory_report(model, where)
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    rest = mem["rest_tflm"]
    extra = mem["scratch_bytes"] + mem["input_bytes"]
    arena = ArenaStats(rest["arena_total_bytes"] + extra, rest["arena_head_bytes"] + extra, rest["arena_tail_bytes"],
                       custom=mem)
    return Evaluation(tfl, outs, arena)


_PHASE = "tfmcu-tflm-phase: "
_FUNC_PHASE = {"measure_arena": "TFLM", "run_tflm": "TFLM", "run_tflite": "TF Lite", "evaluate": "the interpreter"}


def _phase(name: str) -> None:
    """Tell a parent ``isolated`` call which interpreter runs now (so a crash can be attributed)."""
    if os.environ.get("TFMCU_TFLM_WORKER") == "1":
        print(f"{_PHASE}{name}", file=sys.stderr, flush=True)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def isolated(func: str, *args: Any, where: str = "model", timeout: float | None = None, **kwargs: Any) -> Any:
    """``tfmcu.tflm.<func>(*args, **kwargs)`` in a child Python process; a crash (abort, segfault) or a non-zero
    exit becomes a one-line ``TFLMError`` naming ``where``."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TFMCU_TFLM_WORKER"] = "1"
    with tempfile.TemporaryDirectory(prefix="tfmcu-tflm-") as tmp:
        req, res = os.path.join(tmp, "request.pkl"), os.path.join(tmp, "result.pkl")
        with open(req, "wb") as f:
            pickle.dump((func, args, kwargs), f, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            proc = subprocess.run([sys.executable, "-m", "tfmcu.tflm", req, res], env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TFLMError(f"{where}: {func} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(res):
            how = _signal_name(proc.returncode) if proc.returncode < 0 else f"exit status {proc.returncode}"
            who = _FUNC_PHASE.get(func, func)
            other = []
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


def _worker(request: str, result: str) -> int:
    from tfmcu import tflm as mod  # the importable module, so results unpickle as tfmcu.tflm classes

    with open(request, "rb") as f:
        func, args, kwargs = pickle.load(f)
    try:
        value = (True, getattr(mod, func)(*args, **kwargs))
    except (TFLMError, ts.SchemaError) as e:
        value = (False, str(e))
    except Exception as e:  # anything unexpected still comes back as one line
        value = (False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    with open(result + ".tmp", "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(result + ".tmp", result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m tfmcu.tflm REQUEST.pkl RESULT.pkl  (worker of tfmcu.tflm.isolated)", file=sys.stderr)
        sys.exit(2)
    sys.exit(_worker(sys.argv[1], sys.argv[2]))


def tflite_all_tensors(model: bytes, sample: Sequence[np.ndarray]) -> Any:
    """Every tensor of one ``tf.lite.Interpreter`` run (reference kernels, all intermediates preserved): a
    function tensor index -> array (used to read a patch stage's output tensor inside a whole model)."""
    import warnings

    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = tf.lite.Interpreter(model_content=bytes(model), experimental_preserve_all_tensors=True,
                                 experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d, a in zip(it.get_input_details(), sample):
        it.set_tensor(d["index"], a)
    it.invoke()
    return lambda index: np.array(it.get_tensor(index), copy=True)
