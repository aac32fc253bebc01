"""tfmcu.tflite.model: one .tflite parsed once, shared by the steps of a run (deploy, verify, the runtime, the arena
prediction, the firmware sources)."""
import pickle
import zipfile

import numpy as np
import pytest

from tfmcu.errors import UsageError
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import zoo
from tfmcu.plan import regions
from tfmcu.runtime import model_io
from tfmcu.stage import custom
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import append_zip
from tfmcu.tflite.model import TfliteModel, as_model
from tfmcu.tflite.patch_stage_format import PATCH_STAGE_OP, read_options


@pytest.fixture(scope="module")
def tiny(zoo_models) -> bytes:
    return zoo_models("tiny_per_tensor")


def test_parsed_once_and_shared(tiny, monkeypatch):
    m = as_model(tiny, "tiny.tflite")
    assert as_model(m) is m  # a parsed model is passed on, not parsed again

    def parse_again(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(ts, "load_model", parse_again)
    info = model_io.model_info(m)
    samples = model_io.random_inputs(m, 2, seed=1)
    assert model_io.prepared(m, samples)[0] is m
    assert bytes(m) == tiny and len(m) == len(tiny) and m.where == "tiny.tflite"
    assert info == m.info and m.info.op_names == m.op_names and m.op_names[0] == "CONV_2D"


def test_same_facts_as_the_bytes(tiny):
    """What the parsed model gives equals what the byte-taking functions gave (signature, random inputs)."""
    m = TfliteModel(tiny)
    assert model_io.model_info(tiny) == m.info
    for a, b in zip(model_io.random_inputs(tiny, 3, seed=7), model_io.random_inputs(m, 3, seed=7)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_associated_files_split_once_and_kept(tiny):
    data = append_zip(tiny, [(zipfile.ZipInfo("labels.txt"), b"a\nb\n")])
    m = TfliteModel(data)
    assert [i.filename for i, _ in m.members] == ["labels.txt"] and m.members[0][1] == b"a\nb\n"
    assert bytes(m) == data and m.op_names == TfliteModel(tiny).op_names


def test_pickles_as_its_bytes(tiny):
    """A child process (tfmcu.runtime.isolate) gets the bytes and parses them itself."""
    m = TfliteModel(tiny, "x.tflite")
    m.op_names  # noqa: B018 - cached facts do not travel
    assert len(pickle.dumps(m)) < len(tiny) + 200
    back = pickle.loads(pickle.dumps(m))
    assert bytes(back) == tiny and back.where == "x.tflite" and back.info == m.info


def test_custom_options(tiny):
    """The options of each custom op of a name, in operator order (a custom-mode model has one patch stage)."""
    g = from_tflite(tiny, name="tiny")
    rewritten = custom.rewrite_custom(tiny, g, regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks),
                                      "tiny").model
    m = TfliteModel(rewritten)
    [options] = m.custom_options(PATCH_STAGE_OP)
    op = m.flatbuffer.subgraphs[0].operators[0]
    assert m.op_names[0] == f"custom:{PATCH_STAGE_OP}" and options == np.asarray(op.customOptions, np.uint8).tobytes()
    assert read_options(options)["layers"] and TfliteModel(tiny).custom_options(PATCH_STAGE_OP) == []


def test_read_model_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model" * 4)
    with pytest.raises(UsageError, match="bad.tflite is not a TFLite flatbuffer"):
        model_io.read_model(str(bad), "--tflite")
    with pytest.raises(UsageError, match="--tflite=.*missing.tflite: no such file"):
        model_io.read_model(str(tmp_path / "missing.tflite"), "--tflite")


def test_an_edit_leaves_its_source_as_it_was(tiny):
    """Rewriting a parsed model (the editor works on a structural copy, ``fork``, sharing buffers) moves the stage's
    weights into its blob and empties their buffers in the result, not in the source: the source prices and runs
    the same afterwards."""
    source = TfliteModel(tiny, "tiny")
    before = [None if b.data is None else bytes(b.data) for b in source.flatbuffer.buffers]
    g = from_tflite(source, name="tiny")
    res = custom.rewrite_custom(source, g, regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks),
                                "tiny")
    after = [None if b.data is None else bytes(b.data) for b in source.flatbuffer.buffers]
    assert after == before
    out = ts.load_model(res.model)
    op = out.subgraphs[0].operators[0]
    blob = ts.buffer_data(out, out.subgraphs[0].tensors[int(op.inputs[1])])
    kept = [bytes(b.data) for b in out.buffers if b.data is not None and bytes(b.data) != blob]
    moved = [b for b in before if b is not None and len(b) > 64 and b in blob]
    assert moved and not [b for b in moved if b in kept]  # the moved weights are not kept twice
