"""The C patch kernels (``tflm_patch_kernels/``) from Python through ctypes: build, load, run.

* Build: ``library()`` compiles the C sources with the system C compiler (``$CC`` or ``cc``) into a shared library,
  cached by a hash of the sources, the compiler and the flags in ``$TFMCU_CACHE_DIR`` (else
  ``$XDG_CACHE_HOME/tfmcu``, else ``~/.cache/tfmcu``, else the temp dir). Each build writes a private temp file
  and renames it into place, so concurrent processes are safe. ``$TFMCU_PATCH_KERNELS_SRC`` overrides where the
  sources are (default: ``tflm_patch_kernels/`` next to this package, in a Bazel runfiles tree or the checkout).
* A ``PackedStage`` (``tfmcu.kernels.pack``) becomes the C ``TfmcuStage`` (``c_stage``, cached on the stage: a
  view of its stage blob, ``tfmcu_stage_view``),
  validated once by ``tfmcu_stage_prepare`` (``prepare``), then run by ``tfmcu_stage_run`` (``run_stage``);
  ``check_stage``, ``c_scratch_bytes``, ``touched_scratch`` (the highest scratch byte a run writes, on poisoned
  scratch).
* ``call_kernel(spec, inputs, out)``: one layer on whole arrays through ``tfmcu_op_run`` (the C op table), a spec's
  constant operand (``LayerSpec.operand``) fed as input 2, a 1 x 1 x C box; ``run_op(model_bytes, inputs,
  op_index)``: one TFLite op of a model through its C kernel -- the per-kernel test entry.

Semantics are TFLite's reference integer kernels, bit for bit (see the C headers). Errors are ``PatchKernelError``
(a ``TfmcuError``) with one line naming the op.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tfmcu import abi
from tfmcu.abi import ABI_VERSION, FLOAT32, STATUS
from tfmcu.graph import ir
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.ops import LayerSpec, kernel_op, layer_spec
from tfmcu.kernels.pack import PackedStage, stage_blob
from tfmcu.tflite.editor import load

SOURCE_ENV = "TFMCU_PATCH_KERNELS_SRC"
CACHE_ENV = "TFMCU_CACHE_DIR"
CFLAGS = ("-O2", "-std=c99", "-fPIC", "-Wall", "-Wextra")

_I32 = ctypes.c_int32
_PTR = ctypes.c_void_p


# ============================================================================= ctypes mirror of the C structs
# Derived from their field lists in tfmcu.abi (tests/test_abi.py checks those against the C headers).
ConstView = abi.structure("TfmcuConstView")
View = ConstView  # same layout (int8_t* / const int8_t* / const float*)
CStage = abi.structure("TfmcuStage")
CPreparedStage = abi.structure("TfmcuPreparedStage")
READ_ROWS = abi.callback("TfmcuReadRows")  # (context, row_start, row_count, destination) -> status
CInputProvider = abi.structure("TfmcuInputProvider")


# ============================================================================= building the library
def source_dir() -> Path:
    """Where the C sources are: $TFMCU_PATCH_KERNELS_SRC, else tflm_patch_kernels/ beside this package (runfiles
    tree first, then the real checkout)."""
    env = os.environ.get(SOURCE_ENV)
    if env:
        return Path(env)
    here = Path(os.path.abspath(__file__)).parents[2]
    candidates = [here / "tflm_patch_kernels", Path(os.path.realpath(__file__)).parents[2] / "tflm_patch_kernels"]
    for c in candidates:
        if (c / "patch_stage.h").is_file():
            return c
    raise PatchKernelError(f"C sources not found (looked in {', '.join(map(str, candidates))}; set {SOURCE_ENV})")


def sources(src: Path | None = None) -> list[Path]:
    """The library's .c and .h files (top level of the source dir only: not firmware/ or tests/)."""
    src = src or source_dir()
    files = sorted(p for p in src.iterdir() if p.suffix in (".c", ".h") and p.is_file())
    if not any(p.name == "patch_stage.c" for p in files):
        raise PatchKernelError(f"{src}: patch_stage.c is missing")
    return files


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        root = Path(env)
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "tfmcu"
    else:
        root = Path(os.path.expanduser("~")) / ".cache" / "tfmcu"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"tfmcu-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _compiler_id(cc: list[str]) -> str:
    try:
        r = subprocess.run(cc + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PatchKernelError(f"C compiler {' '.join(cc)!r} cannot run ({e})") from None
    return (r.stdout or r.stderr).splitlines()[0] if (r.stdout or r.stderr) else ""


def build_library(flags: Sequence[str] = (), src: Path | None = None, out_dir: Path | None = None) -> Path:
    """Compile the C sources into a shared library (cached by sources + compiler + flags); returns its path."""
    src = src or source_dir()
    files = sources(src)
    cc = compiler()
    all_flags = list(CFLAGS) + list(flags)
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(cc + all_flags).encode() + _compiler_id(cc).encode())
    out_dir = out_dir or cache_dir()
    lib = out_dir / f"libtfmcu_patch_kernels-{h.hexdigest()[:16]}.so"
    if lib.is_file():
        return lib
    fd, tmp = tempfile.mkstemp(prefix=lib.name + ".", suffix=".tmp", dir=out_dir)
    os.close(fd)
    cmd = cc + all_flags + ["-shared", "-o", tmp] + [str(p) for p in files if p.suffix == ".c"] + ["-I", str(src)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise PatchKernelError(f"building the C patch kernels failed: {first}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)  # atomic: a concurrent build of the same sources writes identical bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


_LIB: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The built and loaded C library (built on first use in this process)."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(build_library()))
        lib.tfmcu_patch_stage_abi_version.restype = ctypes.c_int32
        if lib.tfmcu_patch_stage_abi_version() != ABI_VERSION:
            raise PatchKernelError(f"C library ABI {lib.tfmcu_patch_stage_abi_version()}, expected {ABI_VERSION}")
        lib.tfmcu_stage_scratch_bytes.restype = ctypes.c_size_t
        lib.tfmcu_stage_output_bytes.restype = ctypes.c_size_t
        lib.tfmcu_stage_check.argtypes = [ctypes.POINTER(CStage), ctypes.POINTER(_I32)]
        lib.tfmcu_stage_view.argtypes = [_PTR, ctypes.c_size_t, ctypes.POINTER(CStage)]
        lib.tfmcu_stage_prepare.argtypes = [ctypes.POINTER(CStage), ctypes.POINTER(CPreparedStage),
                                            ctypes.POINTER(_I32)]
        lib.tfmcu_stage_run.argtypes = [ctypes.POINTER(CPreparedStage), _PTR, _PTR, _PTR, ctypes.c_size_t]
        lib.tfmcu_stage_run_streamed.argtypes = [ctypes.POINTER(CPreparedStage), ctypes.POINTER(CInputProvider),
                                                 _PTR, _PTR, ctypes.c_size_t]
        lib.tfmcu_op_run.argtypes = [_I32, _PTR, ctypes.POINTER(ConstView), _I32, _I32, _I32,
                                     ctypes.POINTER(ConstView)]
        lib.tfmcu_status_string.restype = ctypes.c_char_p
        _LIB = lib
    return _LIB


def status_text(code: int) -> str:
    return STATUS.get(int(code), f"status {code}")


# ============================================================================= stages
class _CStageData:
    """The C struct of a packed stage: a view (``tfmcu_stage_view``) of its stage blob (``stage_blob``), which it keeps
    alive: the same bytes and the same C reading of them as the TFMCU_PATCH_STAGE op's."""

    def __init__(self, p: PackedStage):
        blob = stage_blob(p)
        self.blob = (_I32 * (len(blob) // 4)).from_buffer_copy(blob)  # 4-byte aligned
        self.stage = CStage()
        rc = library().tfmcu_stage_view(self.blob, len(blob), ctypes.byref(self.stage))
        if rc != 0:
            raise PatchKernelError(f"the stage blob is malformed: {status_text(rc)} ({rc})")
        self.prepared: CPreparedStage | None = None


def c_stage(packed: PackedStage, refresh: bool = False) -> _CStageData:
    """The C ``TfmcuStage`` of ``packed`` (built once and cached on it; ``refresh`` after changing its fields)."""
    data = packed.__dict__.get("_c_stage")
    if data is None or refresh:
        data = _CStageData(packed)
        packed.__dict__["_c_stage"] = data
    return data


def check_stage(packed: PackedStage) -> tuple[int, int]:
    """``tfmcu_stage_check`` of the C description: (status, failed layer)."""
    failed = _I32(-1)
    rc = library().tfmcu_stage_check(ctypes.byref(c_stage(packed, refresh=True).stage), ctypes.byref(failed))
    return int(rc), int(failed.value)


def prepare(packed: PackedStage) -> CPreparedStage:
    """``tfmcu_stage_prepare``: the stage validated once (raises ``PatchKernelError`` for an invalid one)."""
    data = c_stage(packed)
    if data.prepared is None:
        prepared, failed = CPreparedStage(), _I32(-1)
        rc = library().tfmcu_stage_prepare(ctypes.byref(data.stage), ctypes.byref(prepared), ctypes.byref(failed))
        if rc != 0:
            raise PatchKernelError(f"invalid stage description: {status_text(rc)} ({rc}), layer {failed.value}")
        data.prepared = prepared
    return data.prepared


def c_scratch_bytes(packed: PackedStage) -> int:
    """``tfmcu_stage_scratch_bytes`` of the C library for this stage (0 if the C side finds it invalid)."""
    return int(library().tfmcu_stage_scratch_bytes(ctypes.byref(c_stage(packed).stage)))


def _input_array(packed: PackedStage, x: Any) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != packed.input_shape and a.shape == packed.input_shape[1:]:
        a = a[None]
    if a.shape != packed.input_shape:
        raise PatchKernelError(f"stage input has shape {list(packed.input_shape)}, got {list(a.shape)}")
    if a.dtype != np.dtype(packed.input_dtype):
        raise PatchKernelError(f"stage input is {np.dtype(packed.input_dtype).name}, got {a.dtype.name}")
    return np.ascontiguousarray(a)


def run_stage(packed: PackedStage, x: Any, scratch: np.ndarray | None = None,
              scratch_size: int | None = None) -> np.ndarray:
    """The stage output ([1, H, W, C] int8) for input ``x`` computed by the C executor. ``scratch``: a uint8 array
    to use as scratch memory (default: a fresh one of exactly ``scratch_bytes``)."""
    prepared = prepare(packed)
    a = _input_array(packed, x)
    out = np.zeros(packed.output_shape, np.int8)
    if scratch is None:
        scratch = np.zeros(max(packed.scratch_bytes, 1), np.uint8)
    size = scratch.nbytes if scratch_size is None else int(scratch_size)
    rc = library().tfmcu_stage_run(ctypes.byref(prepared), a.ctypes.data, out.ctypes.data, scratch.ctypes.data,
                                   size)
    if rc != 0:
        raise PatchKernelError(f"tfmcu_stage_run failed: {status_text(rc)} ({rc})")
    return out


def run_stage_streamed(packed: PackedStage, x: Any, scratch: np.ndarray | None = None,
                       fail_at: int | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``tfmcu_stage_run_streamed`` with a provider that copies rows of ``x``: (the output, the provider's calls as
    (row_start, row_count)). ``scratch`` defaults to exactly ``streamed_scratch_bytes``; ``fail_at``: the provider
    returns status 99 on that call (0-based)."""
    prepared = prepare(packed)
    a = _input_array(packed, x)
    rows = a.reshape(a.shape[1], -1)
    calls: list[tuple[int, int]] = []

    def read_rows(_: Any, start: int, count: int, dst: int) -> int:
        calls.append((start, count))
        if fail_at is not None and len(calls) - 1 == fail_at:
            return 99
        block = np.ascontiguousarray(rows[start:start + count])
        ctypes.memmove(dst, block.ctypes.data, block.nbytes)
        return 0

    callback = READ_ROWS(read_rows)
    provider = CInputProvider(callback, None)
    out = np.zeros(packed.output_shape, np.int8)
    if scratch is None:
        scratch = np.zeros(max(prepared.streamed_scratch_bytes, 1), np.uint8)
    rc = library().tfmcu_stage_run_streamed(ctypes.byref(prepared), ctypes.byref(provider), out.ctypes.data,
                                            scratch.ctypes.data, scratch.nbytes)
    if rc != 0:
        raise PatchKernelError(f"tfmcu_stage_run_streamed failed: {status_text(rc)} ({rc})")
    return out, calls


def touched_scratch(packed: PackedStage, x: Any, guard: int = 256) -> tuple[int, np.ndarray]:
    """(one past the highest scratch byte a run writes, the output): runs twice on scratch poisoned with 0xA5 and
    0x5A plus ``guard`` spare bytes and looks for the last changed byte."""
    highest = 0
    out = None
    for poison in (0xA5, 0x5A):
        scratch = np.full(packed.scratch_bytes + guard, poison, np.uint8)
        out = run_stage(packed, x, scratch)
        changed = np.flatnonzero(scratch != poison)
        if changed.size:
            highest = max(highest, int(changed[-1]) + 1)
    assert out is not None
    return highest, out


# ============================================================================= one op alone (kernel tests)
def _view(a: np.ndarray) -> ConstView:
    if a.ndim != 4 or a.shape[0] != 1 or not a.flags.c_contiguous:
        raise PatchKernelError(f"expected a contiguous [1, H, W, C] array, got shape {list(a.shape)}")
    _, h, w, c = a.shape
    return ConstView(a.ctypes.data, h, w, c, w * c)


def call_kernel(spec: LayerSpec, inputs: Sequence[np.ndarray], out: np.ndarray, pad_top: int = 0,
                pad_left: int = 0) -> None:
    """Run ``spec``'s C kernel on whole arrays ([1, H, W, C]); ``out`` (int8) is written in place. ``inputs``: the
    op's activation inputs; a constant operand (``spec.operand``) follows them as input 2, a [1, 1, 1, C] box."""
    kop = kernel_op(spec.type)
    if spec.operand is not None:
        inputs = list(inputs) + [np.ascontiguousarray(spec.operand, dtype=np.int8).reshape(1, 1, 1, -1)]
    want = np.float32 if kop.input_dtype == FLOAT32 else np.int8
    if len(inputs) != kop.inputs:
        raise PatchKernelError(f"{spec.name}: {kop.name} takes {kop.inputs} inputs")
    if any(np.asarray(a).dtype != want for a in inputs) or out.dtype != np.int8:
        raise PatchKernelError(f"{spec.name}: inputs must be {np.dtype(want).name} and the output int8")
    spec.check_arrays(int(np.asarray(inputs[0]).shape[-1]), int(out.shape[-1]))
    params, keep = spec.c_params()
    ins = [np.ascontiguousarray(a) for a in inputs]
    views = (ConstView * len(ins))(*[_view(a) for a in ins])
    ov = _view(out)
    rc = library().tfmcu_op_run(spec.type, ctypes.byref(params), views, len(ins), pad_top, pad_left,
                                ctypes.byref(ov))
    del keep, ins
    if rc != 0:
        raise PatchKernelError(f"{spec.name}: C kernel returned {rc} ({status_text(rc)})")


def run_op(model_bytes: bytes, inputs: Sequence[np.ndarray], op_index: int = 0,
           graph: ir.Graph | None = None) -> np.ndarray:
    """TFLite operator ``op_index`` of the model run alone through its C kernel on whole tensors (TFLite's own
    padding as border padding). ``inputs``: its activation inputs in TFLite order, each [1, H, W, C] (a constant
    operand is the spec's, ``call_kernel``)."""
    graph = graph or from_tflite(bytes(model_bytes))
    model = load(model_bytes)
    ops = [o for o in graph.ops if o.src_index == op_index]
    if not ops:
        raise PatchKernelError(f"the model has no operator {op_index}")
    op = ops[0]
    spec = layer_spec(model, op, op_index)
    out = np.zeros(graph.tensors[op.outputs[0]].shape, np.int8)
    want = np.float32 if spec.op.input_dtype == FLOAT32 else np.int8
    arrays = [np.ascontiguousarray(np.asarray(a).reshape(graph.tensors[t].shape), dtype=want)
              for a, t in zip(inputs, op.inputs)]
    if len(arrays) != len(op.inputs):
        raise PatchKernelError(f"operator {op_index} takes {len(op.inputs)} inputs, got {len(inputs)}")
    call_kernel(spec, arrays, out, op.padding[0], op.padding[2])
    return out


def main(argv: Sequence[str]) -> int:  # pragma: no cover - a tiny CLI for building / locating the library
    print(build_library())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
