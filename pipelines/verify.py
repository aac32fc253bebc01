"""Verify a rewritten .tflite against its original: bit-exact outputs and TFLM arena, measured and predicted.

    python -m pipelines.verify --original=a.tflite --rewritten=b.tflite --samples=200 --json_out=v.json \
        [--inputs=x.npy] [--seed=0] [--resolver=reference|builtin]

Both models run on the same inputs (``--samples`` seeded random ones, ``tfmcu.tflm.random_inputs``, plus the real
ones of ``--inputs``: a .npy of shape (N, ...) for a single-input model, float data being quantized with the input's
scale and zero point; a .npz with one such array per input, named ``arr_0``... or by input name) in TF Lite
(reference kernels by default, the ones TFLM's are ported from) and in the TFLM interpreter of the tflite-micro
wheel, each model in its own child process (an interpreter that aborts cannot take the pipeline down). The rewritten
model's outputs must equal the original's bit for bit in both interpreters; TF Lite vs TFLM agreement per model is
reported too (informational). TFLM's arena is measured (``tfmcu.tflm.measure_arena``) and predicted
(``tfmcu.tflm_memory.predict_arena``) for both.

Exit status: 0 bit-exact, 1 any mismatch (the JSON is still written), 2 bad input (missing file, not a TFLite model,
the two models' input/output signatures differ, bad --inputs, an interpreter crash): one line on stderr and no
output file. A rewritten model in custom mode (one TFMCU_PATCH_STAGE op) runs in tfmcu's host runner: the stage in
the C kernels, the rest in TF Lite and in TFLM; its arena is reported "as run here" (the rest's TFLM arena +
scratch + input) and as the single-arena peak a TFLM adapter would have (``custom_mode``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from pipelines import _cli
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("original", None, "The original .tflite model.")
flags.DEFINE_string("rewritten", None, "The rewritten .tflite model (same inputs and outputs).")
flags.DEFINE_integer("samples", 200, "Random input samples to compare.", lower_bound=0)
flags.DEFINE_integer("seed", 0, "Seed of the random samples.")
flags.DEFINE_string("inputs", None, "Real inputs: .npy of shape (N, ...) (single input) or .npz (one per input).")
flags.DEFINE_enum("resolver", "reference", ["reference", "builtin"], "TF Lite kernels: reference or optimized.")
flags.DEFINE_string("json_out", None, "Write the JSON report here.")
flags.DEFINE_integer("max_details", 5, "Mismatches listed in detail (per kind).", lower_bound=0)
flags.DEFINE_bool("quiet", False, "Do not print the summary.")
flags.mark_flag_as_required("original")
flags.mark_flag_as_required("rewritten")

ROLES = ("original", "rewritten")


def read_model(path: str) -> bytes:
    if not os.path.exists(path):
        raise _cli.UsageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise _cli.UsageError(f"{path}: is a directory, not a .tflite file")
    with open(path, "rb") as f:
        return f.read()


def _sig(t: Any) -> str:
    return f"{t.dtype}{list(t.shape)}"


def check_signatures(infos: dict[str, Any]) -> None:
    a, b = infos["original"], infos["rewritten"]
    for kind in ("inputs", "outputs"):
        ta, tb = getattr(a, kind), getattr(b, kind)
        if len(ta) != len(tb):
            raise _cli.UsageError(f"signature mismatch: the original has {len(ta)} {kind}, the rewritten model "
                                  f"{len(tb)}")
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x.signature != y.signature:
                raise _cli.UsageError(f"signature mismatch: {kind[:-1]} {k} is {_sig(x)} in the original, "
                                      f"{_sig(y)} in the rewritten model")


def load_inputs(path: str, info: Any) -> list[tuple[Any, ...]]:
    """Samples from a .npy (single-input models) or .npz; float data for an integer input is quantized."""
    import numpy as np

    if not os.path.isfile(path):
        raise _cli.UsageError(f"--inputs={path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise _cli.UsageError(f"--inputs={path}: not a .npy/.npz file ({str(e).splitlines()[0]})") from None
    if isinstance(loaded, np.ndarray):
        if len(info.inputs) != 1:
            raise _cli.UsageError(f"--inputs={path}: the model has {len(info.inputs)} inputs; give a .npz with one "
                                  f"array per input")
        arrays = [loaded]
    else:
        with loaded:
            keys = list(loaded.files)
            arrays = []
            for k, t in enumerate(info.inputs):
                key = f"arr_{k}" if f"arr_{k}" in keys else t.name if t.name in keys else None
                if key is None:
                    raise _cli.UsageError(f"--inputs={path}: no array 'arr_{k}' or '{t.name}' for input {k}")
                arrays.append(loaded[key])
    per_input = []
    n = None
    for k, (a, t) in enumerate(zip(arrays, info.inputs)):
        shape = tuple(t.shape)
        batch1 = shape[:1] == (1,)
        if batch1 and a.ndim == len(shape) + 1 and tuple(a.shape[1:]) == shape:
            a = a.reshape((a.shape[0],) + shape[1:])  # (N, 1, ...) -> (N, ...)
        want = shape[1:] if batch1 else shape
        if a.ndim != len(want) + 1 or tuple(a.shape[1:]) != want:
            raise _cli.UsageError(f"--inputs={path}: input {k} has shape {list(a.shape)}, expected "
                                  f"(N, {', '.join(str(d) for d in want)}) for model input {_sig(t)}")
        a = _convert(a, t, path, k)
        if n is not None and a.shape[0] != n:
            raise _cli.UsageError(f"--inputs={path}: inputs have different sample counts ({n} and {a.shape[0]})")
        n = a.shape[0]
        per_input.append((a, batch1))
    if not n:
        raise _cli.UsageError(f"--inputs={path}: no samples")
    return [tuple(a[i:i + 1] if b1 else a[i] for a, b1 in per_input) for i in range(n)]


def _convert(a: Any, t: Any, path: str, k: int) -> Any:
    import numpy as np

    want = np.dtype(t.dtype)
    if a.dtype == want:
        return a
    if want.kind in "iu" and a.dtype.kind == "f" and t.scale:
        lim = np.iinfo(want)
        q = np.round(a.astype(np.float64) / t.scale) + t.zero_point
        return np.clip(q, lim.min, lim.max).astype(want)
    if want.kind == "f" and a.dtype.kind in "fiu":
        return a.astype(want)
    raise _cli.UsageError(f"--inputs={path}: input {k} has dtype {a.dtype.name}, the model wants {want.name}")


def compare(a: list[list[Any]], b: list[list[Any]], offset: int = 0) -> list[dict[str, Any]]:
    """Samples whose outputs differ: [{sample, output, max_abs_diff}] (first differing output per sample)."""
    import numpy as np

    out = []
    for i, (xa, xb) in enumerate(zip(a, b)):
        for j, (u, v) in enumerate(zip(xa, xb)):
            if u.shape != v.shape or u.dtype != v.dtype:
                out.append({"sample": i + offset, "output": j, "max_abs_diff": None,
                            "note": f"{u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)}"})
                break
            if not np.array_equal(u, v):
                d = np.abs(u.astype(np.float64) - v.astype(np.float64))
                out.append({"sample": i + offset, "output": j, "max_abs_diff": float(np.nanmax(d))})
                break
    return out


def _arena(stats: Any) -> dict[str, int]:
    return {"arena_total_bytes": stats.total, "arena_head_bytes": stats.head, "arena_tail_bytes": stats.tail}


def predict(data: bytes, where: str) -> dict[str, Any]:
    from tfmcu import ir, tflm_memory
    from tfmcu.lower_tflite import from_tflite

    try:
        p = tflm_memory.predict_arena(from_tflite(data, name=os.path.basename(where)), model=data)
    except ir.GraphError as e:
        return {"arena_total_bytes": None, "arena_head_bytes": None, "arena_tail_bytes": None,
                "error": str(e).splitlines()[0]}
    d = {"arena_total_bytes": p.total, "arena_head_bytes": p.head, "arena_tail_bytes": p.tail}
    if p.details.get("unmodelled_ops"):
        d["unmodelled_ops"] = p.details["unmodelled_ops"]
    return d


def predict_custom(mem: dict[str, Any], data: bytes, where: str) -> dict[str, Any]:
    """Predicted "as run" arena of a custom-mode model: the rest's predicted TFLM arena + scratch + input."""
    from tfmcu.custom_stage import load_custom

    rest = predict(load_custom(data, where).rest, where + " (rest)")
    if rest["arena_total_bytes"] is None:
        return rest
    extra = mem["scratch_bytes"] + mem["input_bytes"]
    return {"arena_total_bytes": rest["arena_total_bytes"] + extra, "arena_head_bytes": rest["arena_head_bytes"] + extra,
            "arena_tail_bytes": rest["arena_tail_bytes"]}


def run_verify(paths: dict[str, str], n_random: int, seed: int, inputs_path: str | None, resolver: str,
               max_details: int) -> dict[str, Any]:
    from tfmcu import tflm

    data = {r: read_model(paths[r]) for r in ROLES}
    infos = {}
    custom = {}
    for r in ROLES:
        try:
            infos[r] = tflm.model_info(data[r], paths[r])
            custom[r] = tflm.PATCH_STAGE_OP in infos[r].custom_ops
            if not custom[r]:
                tflm.check_runnable(infos[r], paths[r])
        except tflm.TFLMError as e:
            raise _cli.UsageError(str(e)) from None
    if custom["original"]:
        raise _cli.UsageError(f"{paths['original']}: the original must be a model stock TFLM runs, not a "
                              f"custom-mode model")
    check_signatures(infos)
    samples = tflm.random_inputs(data["original"], n_random, seed) if n_random else []
    real = load_inputs(inputs_path, infos["original"]) if inputs_path else []
    if not samples and not real:
        raise _cli.UsageError("nothing to compare: --samples=0 and no --inputs")
    all_samples = samples + real

    def job(role: str) -> Any:
        func = "evaluate_custom" if custom[role] else "evaluate"
        return tflm.isolated(func, data[role], all_samples, resolver, paths[role], where=paths[role])

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = dict(zip(ROLES, pool.map(job, ROLES)))
    except tflm.TFLMError as e:
        raise _cli.UsageError(str(e)) from None

    interpreters = {"tflite": f"tflite-{resolver}", "tflm": "tflm"}
    mismatches = []
    for key, label in interpreters.items():
        for m in compare(getattr(results["original"], key), getattr(results["rewritten"], key)):
            mismatches.append({"interpreter": label, **m})
    mismatches.sort(key=lambda m: (m["sample"], m["interpreter"]))
    agreement = {}
    for r in ROLES:
        diff = compare(results[r].tflite, results[r].tflm)
        agreement[r] = {"agree": not diff, "mismatching_samples": len(diff), "first": diff[:max_details]}

    def source(i: int) -> str:
        return "random" if i < len(samples) else "inputs"

    for m in mismatches:
        m["source"] = source(m["sample"])
    return {
        "bit_exact": not mismatches,
        "samples": len(all_samples),
        "random_samples": len(samples),
        "input_samples": len(real),
        "seed": seed,
        "inputs": inputs_path,
        "resolver": resolver,
        "models": dict(paths),
        "mismatches": {"count": len(mismatches),
                       "samples": len({m["sample"] for m in mismatches}),
                       "first": mismatches[:max_details]},
        "tflite_vs_tflm": agreement,
        "tflm": {r: _arena(results[r].arena) for r in ROLES},
        "predicted": {r: (predict_custom(results[r].arena.custom, data[r], paths[r]) if custom[r]
                          else predict(data[r], paths[r])) for r in ROLES},
        "custom_mode": {r: results[r].arena.custom for r in ROLES if custom[r]},
        "flash_bytes": {r: len(data[r]) for r in ROLES},
        "ops": {r: infos[r].num_ops for r in ROLES},
    }


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def format_summary(rep: dict[str, Any]) -> str:
    lines = []
    o, w = rep["models"]["original"], rep["models"]["rewritten"]
    lines.append(f"verify: {o} ({rep['ops']['original']} ops) vs {w} ({rep['ops']['rewritten']} ops)")
    src = f"{rep['random_samples']} random (seed {rep['seed']})"
    if rep["input_samples"]:
        src += f" + {rep['input_samples']} from {rep['inputs']}"
    lines.append(f"samples: {src}; TF Lite kernels: {rep['resolver']}")
    mm = rep["mismatches"]
    if rep["bit_exact"]:
        lines.append(f"outputs: BIT-EXACT in TF Lite and TFLM ({rep['samples']} samples)")
    else:
        first = mm["first"][0]
        lines.append(f"outputs: MISMATCH in {mm['samples']} of {rep['samples']} samples ({mm['count']} sample x "
                     f"interpreter pairs; first: sample {first['sample']} in {first['interpreter']}, max abs diff "
                     f"{first['max_abs_diff']})")
    agree = ", ".join(f"{r} {'yes' if a['agree'] else 'NO (' + str(a['mismatching_samples']) + ' samples)'}"
                      for r, a in rep["tflite_vs_tflm"].items())
    lines.append(f"TF Lite == TFLM: {agree}")
    rows = [("TFLM arena total", "tflm", "arena_total_bytes"), ("TFLM arena head", "tflm", "arena_head_bytes"),
            ("TFLM arena tail", "tflm", "arena_tail_bytes"), ("predicted total", "predicted", "arena_total_bytes"),
            ("predicted head", "predicted", "arena_head_bytes"), ("predicted tail", "predicted", "arena_tail_bytes")]
    lines.append(f"{'bytes':<18} {'original':>12} {'rewritten':>12}")
    for label, sec, key in rows:
        lines.append(f"{label:<18} {_n(rep[sec]['original'][key]):>12} {_n(rep[sec]['rewritten'][key]):>12}")
    lines.append(f"{'flash (file)':<18} {_n(rep['flash_bytes']['original']):>12} "
                 f"{_n(rep['flash_bytes']['rewritten']):>12}")
    lines.append(f"{'ops':<18} {rep['ops']['original']:>12} {rep['ops']['rewritten']:>12}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    from tfmcu import report

    rep = run_verify({"original": FLAGS.original, "rewritten": FLAGS.rewritten}, FLAGS.samples, FLAGS.seed,
                     FLAGS.inputs, FLAGS.resolver, FLAGS.max_details)
    report.write_outputs({FLAGS.json_out: rep})
    if not FLAGS.quiet:
        print(format_summary(rep), end="")
    return 0 if rep["bit_exact"] else 1


if __name__ == "__main__":
    _cli.run(main)
