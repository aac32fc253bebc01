"""``fit --model=a Keras file``: the int8 conversion calibrated on the user's data (``--calibration_data``: a folder
of class folders or a ``.npy``) or, without it, on seeded random inputs, which the report says; a model whose batch
norms were never trained (``weights=None``) gets their statistics estimated first, so that TF Lite can run what fit
converted (``tfmcu.train.export.int8_from_keras``, ``tfmcu.nets.convert.calibrate_batchnorm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.data import DataError  # noqa: E402
from tfmcu.errors import TfmcuError, UsageError  # noqa: E402
from tfmcu.flows import fit  # noqa: E402
from tfmcu.nets.convert import calibrate_batchnorm, initial_batchnorm, to_int8_tflite  # noqa: E402
from tfmcu.runtime.model_io import TFLMError, model_info  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.train.export import int8_from_keras, quiet_convert  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (16, 16, 3)


def _untrained(blocks: int = 12):
    """Conv / batch norm / ReLU6 and depthwise / batch norm / ReLU6 ``blocks`` times, untrained (the batch norms at
    their initial statistics, as ``weights=None`` leaves them): the activations shrink layer by layer, converted
    as they are the int8 ranges make TF Lite abort."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    x = inp = L.Input(SHAPE)
    for _ in range(blocks):
        x = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, padding="same", use_bias=False)(x)))
        x = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)))
    x = L.Dense(10, activation="softmax")(L.GlobalAveragePooling2D()(x))
    return tf_keras.Model(inp, x)


@pytest.fixture(scope="module")
def untrained_h5(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keras") / "untrained.h5")
    _untrained().save(path)
    return path


def _input_scale(data: bytes) -> float:
    (t,) = model_info(data).inputs
    return t.scale


def test_an_untrained_keras_model_converts_into_one_tflite_runs(untrained_h5, tmp_path):
    """Its batch norms' statistics are estimated on the calibration inputs before conversion (said in the origin);
    converted as they were, TF Lite aborts on the model (a quantization scale out of range)."""
    import tf_keras

    x = np.random.default_rng(1).integers(-128, 128, (2, 1, *SHAPE)).astype(np.int8)
    as_is = quiet_convert(to_int8_tflite, tf_keras.models.load_model(untrained_h5, compile=False))
    with pytest.raises(TFLMError, match="TF Lite crashed"):  # the failure the estimate prevents
        run_tflite(as_is, list(x), where="as is", isolate=True)
    lines = []
    data, origin = fit.model_bytes(fit.FitOptions(model=untrained_h5), lines.append)
    assert "calibrated on seeded random inputs" in origin and "initial statistics (untrained weights)" in origin
    assert any("--calibration_data" in ln for ln in lines)  # the log says how to calibrate on real data
    out = run_tflite(data, list(x), where="converted", isolate=True)
    assert len(out) == 2
    # a model whose batch norms have statistics is converted as it is
    model = tf_keras.models.load_model(untrained_h5, compile=False)
    assert initial_batchnorm(model)
    calibrate_batchnorm(model, np.random.default_rng(2).uniform(-1, 1, (4, *SHAPE)).astype(np.float32))
    assert not initial_batchnorm(model)
    model.save(tmp_path / "trained.h5")
    k = int8_from_keras(str(tmp_path / "trained.h5"))
    assert k.batchnorm_on is None and k.calibrated_on == "seeded random inputs"


def test_calibration_data_sets_the_int8_ranges(untrained_h5, tmp_path):
    """A .npy of model inputs calibrates as it is; a folder of class folders is resized and normalised as train
    does ([-1, 1]); the input's int8 scale is that of the data (random inputs: [-1, 1])."""
    from PIL import Image

    random = int8_from_keras(untrained_h5)
    assert _input_scale(random.data) == pytest.approx(2 / 255, rel=0.02)
    npy = tmp_path / "x.npy"
    np.save(npy, np.random.default_rng(0).uniform(0, 4, (10, *SHAPE)).astype(np.float32))
    k = int8_from_keras(untrained_h5, calibration_data=str(npy))
    assert k.calibrated_on == f"10 inputs from {npy}" and k.batchnorm_on == k.calibrated_on
    assert _input_scale(k.data) == pytest.approx(4 / 255, rel=0.02)
    rng = np.random.default_rng(0)
    for c in ("a", "b"):  # dark images (0..127: [-1, 0] normalised) of another size than the model's input
        os.makedirs(tmp_path / "images" / c)
        for i in range(3):
            Image.fromarray(rng.integers(0, 128, (20, 24, 3)).astype(np.uint8)).save(tmp_path / "images" / c /
                                                                                   f"{i}.png")
    k = int8_from_keras(untrained_h5, calibration_data=str(tmp_path / "images"))
    assert k.calibrated_on.startswith("4 inputs from")  # the training split of 6 images (one per class held out)
    assert _input_scale(k.data) == pytest.approx(1 / 255, rel=0.05)


def test_calibration_data_that_does_not_match_is_one_line(untrained_h5, tmp_path):
    npy = tmp_path / "small.npy"
    np.save(npy, np.zeros((3, 8, 8, 3), np.float32))
    with pytest.raises(DataError, match=r"^--calibration_data=.*small\.npy: a float32 array of shape \[3, 8, 8, 3\], "
                                        r"the model takes float inputs \[N, 16, 16, 3\] \(N >= 1\)$"):
        fit.model_bytes(fit.FitOptions(model=untrained_h5, calibration_data=str(npy)), lambda m: None)
    with pytest.raises(DataError, match="neither a .npy file nor a folder"):
        fit.model_bytes(fit.FitOptions(model=untrained_h5, calibration_data=str(tmp_path / "nothing")),
                        lambda m: None)
    for model in ("m.tflite", "mbv2"):  # checked before any file is read
        with pytest.raises(UsageError, match=f"--calibration_data applies to a Keras model .*, not {model}: "):
            fit.validate(fit.FitOptions(model=model, calibration_data=str(npy)))
    assert issubclass(DataError, TfmcuError)


def test_fit_command_line_calibrates_a_keras_model(untrained_h5, tmp_path):
    """``pipelines.fit --model=k.h5 --calibration_data=x.npy``: the untrained model is fitted, verified and written
    (TF Lite runs it); fit.json says what it was calibrated on."""
    npy = tmp_path / "x.npy"
    np.save(npy, np.random.default_rng(0).uniform(-1, 1, (6, *SHAPE)).astype(np.float32))
    out = tmp_path / "fit"
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "pipelines.fit", f"--model={untrained_h5}", f"--calibration_data={npy}",
                        "--target=stm32f405", "--kernels=reference", "--grids=1,2", "--verify_samples=2",
                        f"--out_dir={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((out / "fit.json").read_text())
    assert rep["model_origin"] == (f"converted from the Keras file, calibrated on 6 inputs from {npy}; its batch "
                                   f"norms had their initial statistics (untrained weights): estimated on 6 inputs "
                                   f"from {npy}")
    text = subprocess.run([sys.executable, "-m", "pipelines.fit", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300).stdout
    assert "--calibration_data:" in text
