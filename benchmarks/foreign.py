"""The bench section *foreign*: models users bring, taken straight from ``tf_keras.applications`` with their
preprocessing left in, through the one command (``fit --run``) on the Cortex-M4, M7 and M55, against TFLM +
CMSIS-NN per layer (``deploy --run``).

The models (``MODELS``) are built here with random weights, their batch norms given random scales and offsets and
their moving statistics set on random images of the range the model reads (``INPUT_RANGE``: [0, 255] for a model
with its own preprocessing layers), then converted to full int8 (int8 input and output) on a representative set of
the same range; the .tflite is cached under ``--zoo_cache`` by the content of what made it (this file, the
converter, TensorFlow's version). A model that does not convert, or whose conversion TF Lite cannot run, is a row
saying why.

Each model then goes through ``benchmarks.fit.fit_section`` (its resumable rows, per-layer rows, fit rows, the
records of the search), on ``TARGETS`` at ``CAPS`` with the image streamed, and for a model with squeeze-excites
also at ``SE_CAP`` with ``se_passes=False`` (squeeze-excites kept out of patch stages), so that the table says where
the search ran a squeeze-excite inside a stage in passes and what that saved.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from benchmarks import fit as bench_fit
from tfmcu.files import figure_png, write_outputs

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

TARGETS = ("cortex-m4", "cortex-m7", "cortex-m55")
CAPS = (1.00, 1.10, None)  # None: the smallest arena, whatever its instructions
SE_CAP = 1.10  # squeeze-excite models: also fit here with se_passes=False
NO_SE_PASSES = f"fit, max_latency {SE_CAP:.2f}, squeeze-excites out of stages"
CLASSES = 100
INPUT_RANGE = (0.0, 255.0)  # images as a camera gives them; the models' own layers preprocess them
BATCHNORM_SAMPLES = 4
REPRESENTATIVE_SAMPLES = 8


@dataclass(frozen=True)
class ForeignModel:
    name: str
    title: str  # what it is, for the docs
    make: Callable[[], Any]  # -> tf_keras.Model with untrained weights
    se: bool  # squeeze-excites (also fit with se_passes=False)
    why: str  # why this width / resolution


def _apps() -> Any:
    import tf_keras  # lazy: imports TensorFlow

    return tf_keras.applications


def _mbv3(large: bool, alpha: float, resolution: int, minimalistic: bool) -> Callable[[], Any]:
    def make() -> Any:
        build = _apps().MobileNetV3Large if large else _apps().MobileNetV3Small
        return build(input_shape=(resolution, resolution, 3), alpha=alpha, minimalistic=minimalistic, weights=None,
                     classes=CLASSES, classifier_activation=None, include_preprocessing=True)
    return make


def _efficientnet_b0(resolution: int) -> Callable[[], Any]:
    def make() -> Any:
        return _apps().EfficientNetB0(input_shape=(resolution, resolution, 3), weights=None, classes=CLASSES,
                                      classifier_activation=None)
    return make


def _with_rescaling(body: Callable[[Any], Any], resolution: int, name: str) -> Any:
    """``body`` behind the preprocessing a user puts into the model: [0, 255] to [-1, 1] (a Rescaling layer)."""
    import tf_keras
    from tf_keras import layers

    inp = tf_keras.Input((resolution, resolution, 3), name="image")
    x = layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescaling")(inp)
    return tf_keras.Model(inp, body(x), name=name)


def _mobilenet_v1(alpha: float, resolution: int) -> Callable[[], Any]:
    """tf_keras' MobileNet (V1) has no preprocessing layer (``preprocess_input`` maps [0, 255] to [-1, 1] outside
    it): the model behind a Rescaling layer that does the same, as a user who keeps the preprocessing in the model
    builds it."""
    def make() -> Any:
        inner = _apps().MobileNet(input_shape=(resolution, resolution, 3), alpha=alpha, weights=None,
                                  classes=CLASSES, classifier_activation=None, dropout=0.0)
        return _with_rescaling(inner, resolution, f"mobilenet_{alpha}_{resolution}")
    return make


def _resnet(resolution: int, widths: tuple[int, ...], blocks: tuple[int, ...]) -> Callable[[], Any]:
    """A small ResNet of basic blocks (ResNet-18's layout: 7x7/2 stem, 3x3/2 max pool, two 3x3 convs per block,
    projection shortcuts where the shape changes), behind a Rescaling layer. tf_keras.applications' ResNets start at
    ResNet50 (25M parameters, 4 GMACs at 224 px), far beyond any MCU, so the bench builds this one."""
    def body(x: Any) -> Any:
        from tf_keras import layers

        x = layers.Conv2D(widths[0], 7, 2, padding="same", use_bias=False, name="conv1_conv")(x)
        x = layers.BatchNormalization(name="conv1_bn")(x)
        x = layers.ReLU(name="conv1_relu")(x)
        x = layers.MaxPooling2D(3, 2, padding="same", name="pool1_pool")(x)
        for s, (c, n) in enumerate(zip(widths, blocks)):
            for b in range(n):
                p = f"conv{s + 2}_block{b + 1}"
                stride = 2 if s > 0 and b == 0 else 1
                y = layers.Conv2D(c, 3, stride, padding="same", use_bias=False, name=f"{p}_1_conv")(x)
                y = layers.BatchNormalization(name=f"{p}_1_bn")(y)
                y = layers.ReLU(name=f"{p}_1_relu")(y)
                y = layers.Conv2D(c, 3, 1, padding="same", use_bias=False, name=f"{p}_2_conv")(y)
                y = layers.BatchNormalization(name=f"{p}_2_bn")(y)
                if stride != 1 or x.shape[-1] != c:
                    x = layers.Conv2D(c, 1, stride, use_bias=False, name=f"{p}_0_conv")(x)
                    x = layers.BatchNormalization(name=f"{p}_0_bn")(x)
                x = layers.ReLU(name=f"{p}_out")(layers.Add(name=f"{p}_add")([x, y]))
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        return layers.Dense(CLASSES, name="predictions")(x)

    return lambda: _with_rescaling(body, resolution, f"resnet18_{widths[0]}_{resolution}")


def _nasnet_mobile(resolution: int) -> Callable[[], Any]:
    def make() -> Any:
        inner = _apps().NASNetMobile(input_shape=(resolution, resolution, 3), weights=None, classes=CLASSES,
                                     classifier_activation=None)
        return _with_rescaling(inner, resolution, f"nasnet_mobile_{resolution}")
    return make


def _densenet121(resolution: int) -> Callable[[], Any]:
    def make() -> Any:
        inner = _apps().DenseNet121(input_shape=(resolution, resolution, 3), weights=None, classes=CLASSES,
                                    classifier_activation=None)
        return _with_rescaling(inner, resolution, f"densenet121_{resolution}")
    return make


MODELS: tuple[ForeignModel, ...] = (
    ForeignModel("mbv3_small_100_224", "MobileNetV3-Small 1.0 @ 224", _mbv3(False, 1.0, 224, False), se=True,
                 why="the model a user reported, as tf_keras builds it"),
    ForeignModel("mbv3_small_min_100_224", "MobileNetV3-Small minimalistic 1.0 @ 224", _mbv3(False, 1.0, 224, True),
                 se=False, why="the same without squeeze-excites, hard-swish or 5x5 kernels"),
    ForeignModel("mbv3_large_075_160", "MobileNetV3-Large 0.75 @ 160", _mbv3(True, 0.75, 160, False), se=True,
                 why="-Large at the width and resolution of an MCU"),
    ForeignModel("mbv3_large_min_075_160", "MobileNetV3-Large minimalistic 0.75 @ 160",
                 _mbv3(True, 0.75, 160, True), se=False, why="the same without squeeze-excites"),
    ForeignModel("efficientnet_b0_160", "EfficientNet-B0 @ 160", _efficientnet_b0(160), se=True,
                 why="the other model a user reported"),
    ForeignModel("mobilenet_v1_050_160", "MobileNet (V1) 0.5 @ 160", _mobilenet_v1(0.5, 160), se=False,
                 why="a plain chain of convolutions"),
    ForeignModel("resnet18_025_128", "ResNet-18 layout at a quarter width (16-128 channels) @ 128 (the bench's own)",
                 _resnet(128, (16, 32, 64, 128), (2, 2, 2, 2)), se=False, why="residual blocks of plain 3x3 convs"),
    ForeignModel("nasnet_mobile_96", "NASNet-Mobile @ 96", _nasnet_mobile(96), se=False, why="a searched DAG"),
    ForeignModel("densenet121_96", "DenseNet-121 @ 96", _densenet121(96), se=False,
                 why="a DAG of concatenations"),
)
BY_NAME = {m.name: m for m in MODELS}


def random_batchnorm(model: Any, samples: int = BATCHNORM_SAMPLES, seed: int = 0) -> Any:
    """Random batch-norm scales and offsets (as ``tfmcu.nets.zoo.random_batchnorm`` gives them), then every batch
    norm's moving statistics set on random images in ``INPUT_RANGE`` (``tfmcu.nets.convert.calibrate_batchnorm``:
    the zoo's calibrate on [-1, 1], what these models' own preprocessing layers make of [0, 255])."""
    from tfmcu.nets.convert import batchnorm_layers, calibrate_batchnorm

    rng = np.random.default_rng(seed)
    for bn in batchnorm_layers(model):
        if bn.gamma is not None:
            bn.gamma.assign(rng.uniform(0.6, 1.4, bn.gamma.shape).astype(np.float32))
        if bn.beta is not None:
            bn.beta.assign(rng.normal(0.2, 0.3, bn.beta.shape).astype(np.float32))
    x = rng.uniform(*INPUT_RANGE, (samples, *model.input_shape[1:])).astype(np.float32)
    return calibrate_batchnorm(model, x)


def _digest() -> str:
    """What a conversion depends on: this file, the converter and TensorFlow's version."""
    import tensorflow as tf

    from tfmcu.nets import convert

    h = hashlib.sha1(tf.__version__.encode())
    for path in (__file__, convert.__file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def convert(m: ForeignModel, cache_dir: str | None) -> bytes:
    """``m`` as a full-int8 .tflite (int8 input and output), converted once and cached in ``cache_dir`` by content."""
    path = None
    if cache_dir:
        path = os.path.join(cache_dir, f"foreign-{m.name}-{_digest()}.tflite")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                return f.read()
    import tf_keras

    from tfmcu.nets.convert import random_representative, to_int8_tflite

    tf_keras.utils.set_random_seed(0)
    model = random_batchnorm(m.make())
    shape = tuple(model.input_shape[1:])
    data = to_int8_tflite(model, random_representative(shape, REPRESENTATIVE_SAMPLES, 0, *INPUT_RANGE))
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=cache_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return data


def selection(models: tuple[str, ...] = (), targets: tuple[str, ...] = ()) -> tuple[list[ForeignModel], list[str]]:
    """The models and targets ``pipelines.bench --foreign_models --foreign_targets`` name (empty: all)."""
    from tfmcu.errors import UsageError

    bad = [m for m in models if m not in BY_NAME]
    if bad:
        raise UsageError(f"--foreign_models: unknown {', '.join(bad)}; known: {', '.join(BY_NAME)}")
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise UsageError(f"--foreign_targets: unknown {', '.join(bad)}; known: {', '.join(TARGETS)}")
    return [m for m in MODELS if not models or m.name in models], [t for t in TARGETS if not targets or t in targets]


def _extra(name: str) -> tuple[bench_fit.FitRow, ...]:
    return (bench_fit.FitRow(NO_SE_PASSES, SE_CAP, (("se_passes", False),)),) if BY_NAME[name].se else ()


def foreign_section(o: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every model of ``MODELS`` converted (or the reason it does not convert), then per target its per-layer row and
    its fit rows (``benchmarks.fit.fit_section``: kept in ``<out_dir>/foreign/rows.json`` as they are measured), and
    the plot."""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.plan.profiler import profile

    t0 = time.time()
    chosen, targets = selection(getattr(o, "foreign_models", ()), getattr(o, "foreign_targets", ()))
    converted: dict[str, bytes] = {}
    models, failed = [], []
    for m in chosen:
        entry = {"model": m.name, "title": m.title, "why": m.why, "squeeze_excite": m.se,
                 "input_range": list(INPUT_RANGE), "classes": CLASSES}
        log(f"[foreign] {m.name}: {m.title}: converting (cached in {o.zoo_cache}) ...")
        try:
            data = convert(m, o.zoo_cache)
            profile_ = profile(from_tflite(data, name=m.name))
        except Exception as e:  # noqa: BLE001 -- the row says why, the bench goes on
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failed.append({"model": m.name, "target": "-", "what": "conversion",
                           "error": f"does not convert to full int8: {reason}"})
            models.append({**entry, "error": failed[-1]["error"]})
            continue
        converted[m.name] = data
        models.append({**entry, "tflite_bytes": len(data), "macs": profile_.macs,
                       "analytic_peak_per_layer_bytes": profile_.peak_sram_per_layer_bytes})
    cases = tuple((m.name, t, True) for m in chosen if m.name in converted for t in targets)
    every = tuple((m.name, t, True) for m in MODELS for t in TARGETS)
    res = bench_fit.fit_section(o, log, cases, CAPS, work_name="foreign", model=lambda name, cache: converted[name],
                                extra=_extra, record_cases=every)
    rows = res["rows"] + failed
    order = {m.name: i for i, m in enumerate(MODELS)}
    rows.sort(key=lambda r: order[r["model"]])  # (stable: a model's targets and rows in the order measured)
    plot = os.path.join(o.out_dir, "foreign.png")
    write_outputs({plot: _plot(rows, models)})
    return {"rows": rows, "models": models, "targets": list(targets), "caps": list(CAPS), "se_cap": SE_CAP,
            "search": res["search"], "plot": "foreign.png", "wall_seconds": round(time.time() - t0)}


# ------------------------------------------------------------------------------------------------ the table
def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def _fit_what(cap: float | None) -> str:
    return "fit, smallest" if cap is None else f"fit, max_latency {cap:.2f}"


def _outputs(r: dict[str, Any]) -> str:
    """Outputs = TF Lite's (TFLM's on this host where deploy proved a rounding tie: deploy.reference)."""
    if r.get("arena_used_bytes") is None:
        return "-"
    if not r["outputs_equal_tflite"]:
        return "NO"
    ties = r.get("tflm_reference_inputs") or 0
    return "yes" + (f" ({ties} of {r['inputs']} inputs: TFLM's, a proven tie)" if ties else "")


def _per_layer_arena(base: dict[str, Any]) -> str:
    if base.get("arena_used_bytes"):
        return _n(base["arena_used_bytes"])
    return f"{_n(base['predicted_arena_bytes'])} (predicted: does not fit)"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if "error" in r:  # (the rows below say why)
        return ("does not fit" if "does not fit" in r["error"] else
                "model exceeds the Flash" if "exceeds" in r["error"] else "failed")
    if r.get("arena_used_bytes") is None:
        return f"{_n(r['predicted_arena_bytes'])} predicted, not run"
    ratio = "" if r.get("arena_ratio") is None else f" ({r['arena_ratio']:.2f}x)"
    insns = "" if r.get("instructions_ratio") is None else f", {r['instructions_ratio']:.3f}x instr."
    return f"{_n(r['arena_used_bytes'])}{ratio}{insns}"


def _passes(r: dict[str, Any]) -> str:
    if "error" in r or r["what"] == bench_fit.PER_LAYER:
        return ""
    stages = r.get("stage_passes") or []
    used = (f"{len(stages)} stage{'s' if len(stages) > 1 else ''} in passes ({'/'.join(map(str, stages))})"
            if stages else "none")
    return f"{used}; {r.get('candidates_with_passes', 0)} of {r.get('candidates', 0)} priced"


def table(result: dict[str, Any]) -> str:
    """Section *foreign*'s tables, from its JSON: the models, a summary per model and target, the squeeze-excites'
    passes against stages that end at them, and every row."""
    rows, models = result["rows"], result.get("models", [])
    caps = [None if c is None else float(c) for c in result.get("caps", CAPS)]
    se_cap = result.get("se_cap", SE_CAP)
    no_se = f"fit, max_latency {se_cap:.2f}, squeeze-excites out of stages"
    low, high = (models[0]["input_range"] if models else INPUT_RANGE)
    md = [f"Random weights, batch norms calibrated on random images in [{low:g}, {high:g}], full int8 (int8 input "
          "and output), the preprocessing layers in the model:", "",
          "| model | what | MACs | int8 .tflite (B) | squeeze-excites | analytic peak per layer (B) |",
          "|---|---|---:|---:|---|---:|"]
    for m in models:
        if "error" in m:
            md.append(f"| {m['model']} | {m['title']} | {m['error']} | | | |")
            continue
        md.append(f"| {m['model']} | {m['title']} | {m['macs'] / 1e6:.1f}M | {_n(m['tflite_bytes'])} | "
                  f"{'yes' if m['squeeze_excite'] else 'no'} | {_n(m['analytic_peak_per_layer_bytes'])} |")
    by = {(r["model"], r["target"], r["what"]): r for r in rows}
    cases = list(dict.fromkeys((r["model"], r["target"]) for r in rows if r["target"] != "-"))
    se_models = {m["model"] for m in models if m.get("squeeze_excite")}
    md += ["", "Arena measured under QEMU (TFLM arena_used_bytes, B) and, in brackets, how many times smaller than "
           "per layer; instructions per Invoke against per layer:", "",
           "| model | target | per layer (B) | " + " | ".join(_fit_what(c) for c in caps) + f" | {no_se} |",
           "|---|---|---:|" + "---:|" * (len(caps) + 1)]
    for model, target in cases:
        base = by.get((model, target, bench_fit.PER_LAYER))
        first = (_per_layer_arena(base) if base and "error" not in base else
                 f"error: {base['error']}" if base else "-")
        md.append(f"| {model} | {target} | {first} | " + " | ".join(_cell(by.get((model, target, _fit_what(c))))
                                                                 for c in caps)
                  + f" | {_cell(by.get((model, target, no_se))) if model in se_models else 'no squeeze-excite'} |")
    if se_models:
        md += ["", f"Squeeze-excites inside patch stages, in passes, at max_latency {se_cap:.2f}: the plan fit chose "
               "(stages run in passes, and how many of the candidates priced had such a stage) against fit with "
               "squeeze-excites kept out of stages (`--nose_passes`):", "",
               "| model | target | with passes: arena (B) | stages in passes | without: arena (B) | passes saved | "
               "instructions with / without |", "|---|---|---:|---|---:|---:|---|"]
        for model, target in cases:
            if model not in se_models:
                continue
            a, b = by.get((model, target, _fit_what(se_cap))), by.get((model, target, no_se))
            if a is None or b is None:
                continue
            ok_a, ok_b = "error" not in a and a.get("arena_used_bytes"), "error" not in b and b.get("arena_used_bytes")
            saved = (f"{b['arena_used_bytes'] - a['arena_used_bytes']:,} B ({b['arena_used_bytes'] / a['arena_used_bytes']:.2f}x)"
                     if ok_a and ok_b else "-")
            insns = (f"{_n(a['instructions'])} / {_n(b['instructions'])}" if ok_a and ok_b else "-")
            md.append(f"| {model} | {target} | {_cell(a) if not ok_a else _n(a['arena_used_bytes'])} | "
                      f"{_passes(a) if ok_a else '-'} | {_cell(b) if not ok_b else _n(b['arena_used_bytes'])} | "
                      f"{saved} | {insns} |")
    md += ["", "Every row: measured on the target under QEMU (TFLM + CMSIS-NN, the patch executor's CMSIS-NN backend; "
           "fit's rows with the image streamed), predicted by tfmcu.plan.arena and tfmcu.plan.latency."
           + bench_fit._searched(result), "",
           "| model | target | configuration | schedule | arena (B) | vs per layer | predicted arena (error) | "
           "instructions | vs per layer | predicted instructions (error) | outputs = TF Lite | squeeze-excites in "
           "passes | search |", "|---|---|---|---|---:|---:|---|---:|---:|---|---|---|---:|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['model']} | {r['target']} | {r['what']} | {r['error']} | | | | | | | | | |")
            continue
        measured = r.get("arena_used_bytes")
        pred = r["predicted_arena_bytes"]
        arena_err = f"{_n(pred)} ({100 * (pred / measured - 1):+.1f}%)" if measured else f"{_n(pred)} (not run)"
        insn_err = ("-" if r.get("predicted_instructions") is None else
                    f"{_n(r['predicted_instructions'])}"
                    + ("" if r.get("instructions_error") is None else f" ({100 * r['instructions_error']:+.1f}%)"))
        what = r["what"] + (" (does not fit; instructions: the same core, more SRAM)" if r.get("instructions_from")
                            else "")
        ratio = "-" if r.get("arena_ratio") is None else f"{r['arena_ratio']:.2f}x smaller"
        slower = "-" if r.get("instructions_ratio") is None else f"{r['instructions_ratio']:.3f}x"
        md.append(f"| {r['model']} | {r['target']} | {what} | {r['schedule'] or 'per layer'} | {_n(measured)} | "
                  f"{ratio} | {arena_err} | {_n(r.get('instructions'))} | {slower} | {insn_err} | {_outputs(r)} | "
                  f"{_passes(r)} | "
                  + ("-" if r.get("search_seconds") is None else f"{r['search_seconds']:.0f} s") + " |")
    return "\n".join(md) + "\n"


# ------------------------------------------------------------------------------------------------ the plot
def _plot(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> bytes:
    """Per model, per core: the per-layer arena (hatched where predicted: it does not fit) against fit's at each cap
    (and with squeeze-excites out of stages), measured under QEMU; the core's SRAM marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tfmcu.firmware.targets import get_target

    names = [m["model"] for m in models if "error" not in m]
    series = [bench_fit.PER_LAYER] + [_fit_what(c) for c in CAPS] + [NO_SE_PASSES]
    labels = ["per layer", "fit 1.00", "fit 1.10", "fit, smallest", "fit 1.10, SE out of stages"]
    colors = ["#888888", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
    by = {(r["model"], r["target"], r["what"]): r for r in rows}
    cols = 3
    fig, axes = plt.subplots(max(1, -(-len(names) // cols)), cols, figsize=(15, 3.6 * max(1, -(-len(names) // cols))),
                             squeeze=False)
    width = 0.16
    for ax, name in zip(axes.flat, names):
        targets = list(dict.fromkeys(r["target"] for r in rows if r["model"] == name and r["target"] != "-"))
        for k, (what, label, color) in enumerate(zip(series, labels, colors)):
            xs, ys, hatch = [], [], []
            for i, t in enumerate(targets):
                r = by.get((name, t, what))
                if r is None or "error" in r:
                    continue
                v = r.get("arena_used_bytes") or r.get("predicted_arena_bytes")
                xs.append(i + (k - 2) * width)
                ys.append(v / 1024)
                hatch.append(not r.get("arena_used_bytes"))
            bars = ax.bar(xs, ys, width, color=color, label=label)
            for b, h in zip(bars, hatch):
                if h:
                    b.set_hatch("//")
                    b.set_alpha(0.5)
        for i, t in enumerate(targets):
            sram = get_target(t).sram_bytes / 1024
            ax.plot([i - 2.5 * width, i + 2.5 * width], [sram, sram], "k--", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylim(bottom=8)
        ax.set_xticks(range(len(targets)))
        ax.set_xticklabels(targets, fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("TFLM arena (KiB)", fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Models users bring: TFLM arena per layer (hatched: predicted, it does not fit) against fit "
                 "--run (measured under QEMU); dashed: the target's SRAM", fontsize=10)
    return figure_png(fig)
