"""`pipelines/verify.py` contract: bit-exact comparison of two models in TF Lite and TFLM, arena figures (measured and
predicted), exit codes 0 / 1 / 2, one-line errors and no partial output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tests.support import rounded_apart  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_verify(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                    if p]))
    return subprocess.run([sys.executable, "-m", "pipelines.verify", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def build(seed: int):
    import tf_keras as keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(i)
    x = L.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    x = L.Add()([x, L.Conv2D(8, 1)(x)])
    x = L.Dense(6)(L.GlobalAveragePooling2D()(x))
    return keras.Model(i, x, name=f"verify_net_{seed}")


@pytest.fixture(scope="session")
def models(int8_tflite, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("verify_models")
    paths = {}
    for name, seed in (("a", 0), ("b", 1)):  # same architecture, different weights
        paths[name] = str(root / f"{name}.tflite")
        with open(paths[name], "wb") as f:
            f.write(int8_tflite(build(seed)))
    m = ts.load_model(open(paths["a"], "rb").read())
    code = ts.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = ts.BuiltinOperator.CUSTOM
    code.customCode = "TFMCU_PATCH_STAGE"
    m.operatorCodes.append(code)
    op = m.subgraphs[0].operators[0]
    op.opcodeIndex, op.builtinOptions, op.builtinOptionsType, op.customOptions = len(m.operatorCodes) - 1, None, 0, [0]
    paths["custom"] = str(root / "custom.tflite")
    with open(paths["custom"], "wb") as f:
        f.write(ts.write_model(m))
    return paths


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_model_against_itself(models, tmp_path):
    from tfmcu.runtime.model_io import random_inputs

    j = tmp_path / "v.json"
    x = np.random.default_rng(7).integers(-128, 128, (3, 16, 16, 3)).astype(np.int8)
    np.save(tmp_path / "x.npy", x)
    r = run_verify(f"--original={models['a']}", f"--rewritten={models['a']}", "--samples=12",
                   f"--inputs={tmp_path / 'x.npy'}", f"--json_out={j}", "--seed=3")
    assert r.returncode == 0, r.stderr
    assert "BIT-EXACT" in r.stdout and "TFLM arena total" in r.stdout
    d = json.loads(j.read_text())
    assert d["bit_exact"] is True and d["samples"] == 15 and d["random_samples"] == 12 and d["input_samples"] == 3
    assert d["mismatches"]["count"] == 0 and d["seed"] == 3
    size = os.path.getsize(models["a"])
    assert d["flash_bytes"] == {"original": size, "rewritten": size}
    assert d["ops"]["original"] == d["ops"]["rewritten"] == 6
    data = _read(models["a"])  # the samples verify ran: 12 seeded random ones, then the 3 of x.npy
    apart = rounded_apart(data, random_inputs(data, 12, seed=3) + [(x[i:i + 1],) for i in range(3)])
    for role in ("original", "rewritten"):
        # Where TF Lite and TFLM differ (on some hosts' bytes), it is a rounding tie in the Dense head, proven.
        a = d["tflite_vs_tflm"][role]
        assert a["agree"] is True and a["mismatching_samples"] == 0 and a["tie_samples"] == len(apart)
        assert {t["sample"] for t in a["ties"]} <= set(apart) and a["samples"] == 15
        t, p = d["tflm"][role], d["predicted"][role]
        assert t["arena_total_bytes"] == t["arena_head_bytes"] + t["arena_tail_bytes"] > 0
        assert p == t  # the prediction is exact for this model
    from tfmcu.flows.verify import VerifyReport

    report = VerifyReport.from_json(d)  # the JSON reads back into the report, and writes the same JSON
    assert report.to_json() == d and report.tflm.original.arena_total_bytes == t["arena_total_bytes"]


def test_different_weights_mismatch(models, tmp_path):
    from tfmcu.runtime.model_io import random_inputs

    j = tmp_path / "v.json"
    r = run_verify(f"--original={models['a']}", f"--rewritten={models['b']}", "--samples=5", f"--json_out={j}")
    assert r.returncode == 1, r.stderr
    assert "MISMATCH" in r.stdout
    d = json.loads(j.read_text())
    assert d["bit_exact"] is False and d["mismatches"]["count"] > 0
    first = d["mismatches"]["first"][0]
    assert {"sample", "interpreter", "max_abs_diff"} <= set(first) and first["max_abs_diff"] > 0
    assert first["interpreter"] in ("tflite-reference", "tflm")
    apart = rounded_apart(_read(models["a"]), random_inputs(_read(models["a"]), 5, seed=0))
    a = d["tflite_vs_tflm"]["original"]
    assert a["agree"] is True and a["mismatching_samples"] == 0 and a["tie_samples"] == len(apart)
    # The rewritten model's differences are ties only where it gives the original's outputs (here: nowhere), so
    # any of its own counts as a disagreement of this informational check (verify's verdict is the mismatch).
    b = d["tflite_vs_tflm"]["rewritten"]
    assert b["tie_samples"] == 0 and b["mismatching_samples"] == len(rounded_apart(
        _read(models["b"]), random_inputs(_read(models["b"]), 5, seed=0)))
    from tfmcu.flows.verify import VerifyReport

    report = VerifyReport.from_json(d)  # mismatches read back typed
    assert report.to_json() == d and report.mismatches.first[0].max_abs_diff == first["max_abs_diff"]


def test_rounding_tie_is_no_disagreement(models, tmp_path):
    """A rounding tie built into the Dense head for one input (tests/support.py: tie_in_the_head): TF Lite and TFLM
    give that input's output 1 apart, on any host. ``verify`` proves it a tie on the model (its head recomputed) and
    reports it as such, for the model and for its copy (the same outputs in both interpreters); both stay bit-exact
    against each other, exit 0."""
    from tests.support import tie_in_the_head
    from tfmcu.flows.verify import VerifyReport
    from tfmcu.runtime.model_io import random_inputs

    data = _read(models["a"])
    x = random_inputs(data, 1, seed=11)[0]
    tied = tmp_path / "tied.tflite"
    tied.write_bytes(tie_in_the_head(data, x))
    np.save(tmp_path / "x.npy", x[0])
    j = tmp_path / "v.json"
    r = run_verify(f"--original={tied}", f"--rewritten={tied}", "--samples=2", f"--inputs={tmp_path / 'x.npy'}",
                   "--max_details=100", f"--json_out={j}")
    assert r.returncode == 0, r.stderr
    rep = VerifyReport.from_json(json.loads(j.read_text()))
    apart = rounded_apart(tied.read_bytes(), random_inputs(tied.read_bytes(), 2, seed=0) + [x])
    assert 2 in apart and rep.bit_exact
    for a in (rep.tflite_vs_tflm.original, rep.tflite_vs_tflm.rewritten):
        assert a.agree and not a.identical and a.mismatching_samples == 0 and a.tie_samples == len(apart)
        # just below a half: TF Lite rounds it down, TFLM up
        assert any(t.sample == 2 and t.tflm == t.tflite + 1 and 0.499 < t.value - t.tflite < 0.5 for t in a.ties)
    assert "yes but" in r.stdout and "rounding ties (expected)" in r.stdout


def test_float_inputs_are_quantized(models, tmp_path):
    np.save(tmp_path / "xf.npy", np.random.default_rng(1).uniform(-1, 1, (2, 1, 16, 16, 3)).astype(np.float32))
    j = tmp_path / "v.json"
    r = run_verify(f"--original={models['a']}", f"--rewritten={models['a']}", "--samples=0",
                   f"--inputs={tmp_path / 'xf.npy'}", f"--json_out={j}", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    d = json.loads(j.read_text())
    assert d["samples"] == d["input_samples"] == 2 and d["random_samples"] == 0


@pytest.mark.parametrize("case", ["missing", "not_tflite", "signature", "inputs_shape", "inputs_dtype", "custom",
                                  "nothing", "inputs_corrupt_npz", "inputs_object_npz", "inputs_strings"])
def test_bad_input_exit_2(models, tmp_path, case):
    j = tmp_path / "v.json"
    a = models["a"]
    np.save(tmp_path / "bad.npy", np.zeros((2, 8, 8, 3), np.int8))
    np.save(tmp_path / "badtype.npy", np.zeros((2, 16, 16, 3), np.int32))
    (tmp_path / "junk.tflite").write_bytes(b"not a model at all")
    np.savez(tmp_path / "good.npz", arr_0=np.zeros((2, 16, 16, 3), np.int8))
    (tmp_path / "corrupt.npz").write_bytes((tmp_path / "good.npz").read_bytes()[:200])  # truncated zip
    np.savez(tmp_path / "object.npz", arr_0=np.array([{"a": 1}, None], dtype=object))
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    other = tmp_path / "other.tflite"
    if case == "signature":
        import tensorflow as tf
        import tf_keras as keras

        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        other.write_bytes(tf.lite.TFLiteConverter.from_keras_model(m).convert())
    args = {
        "missing": [f"--original={tmp_path / 'nope.tflite'}", f"--rewritten={a}"],
        "not_tflite": [f"--original={a}", f"--rewritten={tmp_path / 'junk.tflite'}"],
        "signature": [f"--original={a}", f"--rewritten={other}"],
        "inputs_shape": [f"--original={a}", f"--rewritten={a}", f"--inputs={tmp_path / 'bad.npy'}"],
        "inputs_dtype": [f"--original={a}", f"--rewritten={a}", f"--inputs={tmp_path / 'badtype.npy'}"],
        "custom": [f"--original={a}", f"--rewritten={models['custom']}"],
        "nothing": [f"--original={a}", f"--rewritten={a}", "--samples=0"],
        "inputs_corrupt_npz": [f"--original={a}", f"--rewritten={a}", f"--inputs={tmp_path / 'corrupt.npz'}"],
        "inputs_object_npz": [f"--original={a}", f"--rewritten={a}", f"--inputs={tmp_path / 'object.npz'}"],
        "inputs_strings": [f"--original={a}", f"--rewritten={a}", f"--inputs={tmp_path / 'strings.npy'}"],
    }[case]
    r = run_verify(*args, f"--json_out={j}")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("verify:")]
    assert len(lines) == 1 and lines[0].startswith("verify: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert not j.exists()
    expected = {"missing": "no such file", "not_tflite": "not a TFLite", "signature": "signature mismatch",
                "inputs_shape": "expected (N, 16, 16, 3)", "inputs_dtype": "dtype int32",
                "custom": "invalid TFMCU_PATCH_STAGE operator",
                "nothing": "nothing to compare", "inputs_corrupt_npz": "not a readable .npy/.npz",
                "inputs_object_npz": "not a readable .npy/.npz", "inputs_strings": "numbers are needed"}[case]
    assert expected in lines[0]


def test_resolver_reaches_the_rest_of_a_custom_mode_model(models, monkeypatch):
    """Hole 4: --resolver=builtin was ignored for custom-mode models (their rest always ran with the reference
    kernels) yet reported as tflite-builtin."""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.plan.regions import schedule
    from tfmcu.runtime import host
    from tfmcu.runtime.model_io import random_inputs
    from tfmcu.stage.custom import rewrite_custom

    data = open(models["a"], "rb").read()
    g = from_tflite(data)
    custom = rewrite_custom(data, g, schedule(g, 2, n_ops=2)).model
    seen = []
    real = host.run_tflite

    def spy(model, samples, resolver="reference", where="model", **kw):
        seen.append(resolver)
        return real(model, samples, resolver, where, **kw)

    monkeypatch.setattr(host, "run_tflite", spy)
    samples = random_inputs(data, 2, seed=1)
    run = host.evaluate(custom, samples, resolver="builtin")
    assert seen == ["builtin"] and run.custom_mode and len(run.tflite) == 2


# ============================================================================= every model rewrite writes (issue 23)
@pytest.fixture(scope="module")
def rewritten(zoo_models, tmp_path_factory) -> dict[str, str]:
    """tiny_per_tensor (48x48x3) and, 2x2 over its zoo stage, custom mode with the input streamed (rewrite
    --stream_input), with the rest's convolutions run by our kernels too (--rest_convs=tfmcu: several
    TFMCU_PATCH_STAGE ops), and both at once."""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.nets import zoo
    from tfmcu.plan import regions
    from tfmcu.stage import custom

    root = tmp_path_factory.mktemp("rewritten")
    data = zoo_models("tiny_per_tensor")
    g = from_tflite(data, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    streamed = custom.rewrite_custom(data, g, s, "tiny", streamed_input=True).model
    plain = custom.rewrite_custom(data, g, s, "tiny").model
    models = {"original": data, "streamed": streamed, "rest_convs": custom.convs_to_flash(plain, "tiny").model,
              "both": custom.convs_to_flash(streamed, "tiny").model}
    paths = {}
    for k, m in models.items():
        paths[k] = str(root / f"{k}.tflite")
        with open(paths[k], "wb") as f:
            f.write(m)
    return paths


def _verify(original: str, rewritten_path: str, **kw):
    from tfmcu.flows import verify

    return verify.verify(verify.VerifyOptions(original=original, rewritten=rewritten_path, quiet=True, **kw))


@pytest.mark.parametrize("kind", ["streamed", "rest_convs", "both"])
def test_streamed_and_several_stage_ops_bit_exact(rewritten, kind):
    """A streamed-input model takes the original's samples as its images (fed row by row through a provider that
    checks the contract, on both sides); a model with several TFMCU_PATCH_STAGE ops runs each op in the C kernels
    on the TF Lite side and whole in TFLM built from source. Both are bit-exact with the original, in TF Lite and
    TFLM, and the report counts the rows read and the ops."""
    from tfmcu.flows.verify import format_summary
    from tfmcu.runtime.model_io import random_inputs

    rep = _verify(rewritten["original"], rewritten[kind], samples=3, seed=2)
    assert rep.bit_exact and rep.mismatches.count == 0, rep.mismatches
    data = _read(rewritten["original"])
    agreement = rep.tflite_vs_tflm
    # Where TF Lite and TFLM differ about the original (on some hosts' bytes), it is a proven rounding tie in the head.
    assert agreement.original.agree and agreement.original.mismatching_samples == 0
    assert agreement.original.tie_samples == len(rounded_apart(data, random_inputs(data, 3, seed=2)))
    # The rewritten model has the original's ties, but where its TF Lite side gives TFLM's bytes (its classifier in
    # our kernels: tflm_semantics).
    assert agreement.rewritten.agree and agreement.rewritten.mismatching_samples == 0
    assert agreement.rewritten.tie_samples == agreement.original.tie_samples - rep.tflm_semantics.samples
    c = rep.custom_mode.rewritten
    assert (c["patch_stage_ops"] > 1) == (kind != "streamed")
    assert rep.tflm.rewritten.arena_total_bytes > 0
    assert type(rep).from_json(rep.to_json()) == rep  # the report reads back from its JSON
    text = format_summary(rep)
    assert "BIT-EXACT" in text
    s = rep.streamed_input
    if kind == "rest_convs":
        assert s is None
        assert f"{c['patch_stage_ops']} TFMCU_PATCH_STAGE ops" in text
        return
    # every one of the 48 image rows read once per sample, by the C executor (ctypes) and by TFLM's kernel
    assert s.image.to_json() == {"shape": [48, 48, 3], "dtype": "int8"} and s.image_rows == 48
    assert s.rows_read == {"tflite": [48] * 3, "tflm": [48] * 3}
    assert "input streamed" in text and "rows read per sample: tflite 48, tflm 48 of 48" in text


def test_streamed_model_errors_are_one_line(rewritten, tmp_path):
    """A streamed model compared with an original of another input, images of the wrong shape, or a streamed model
    given as the original: one line, exit 2, no output."""
    np.save(tmp_path / "small.npy", np.zeros((2, 8, 8, 1), np.int8))
    j = tmp_path / "v.json"
    cases = [
        ([f"--original={rewritten['streamed']}", f"--rewritten={rewritten['streamed']}"],
         "the original must be a model stock TFLM runs"),
        ([f"--original={rewritten['original']}", f"--rewritten={rewritten['streamed']}",
          f"--inputs={tmp_path / 'small.npy'}"], "expected (N, 48, 48, 3)"),
    ]
    for args, message in cases:
        r = run_verify(*args, f"--json_out={j}", "--samples=1")
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("verify:")]
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr[-800:]
        assert "Traceback" not in r.stderr and not j.exists()


def test_streamed_signature_is_the_image(rewritten, models):
    """A streamed model's signature is its image's: an original with another input is a signature mismatch."""
    from tfmcu.errors import UsageError

    with pytest.raises(UsageError, match=r"signature mismatch: input 0 is int8\[1, 16, 16, 3\] in the original, "
                                         r"int8\[1, 48, 48, 3\] in the rewritten model"):
        _verify(models["a"], rewritten["streamed"], samples=1)
