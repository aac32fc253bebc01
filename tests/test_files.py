"""tfmcu.files: one-line errors for unusable paths, and outputs written all-or-nothing (hole 3 of issue 8)."""

from __future__ import annotations

import os

import pytest

from tfmcu.errors import UsageError
from tfmcu.files import check_output_paths, read_bytes, write_outputs


def test_read_bytes_errors(tmp_path):
    with pytest.raises(UsageError, match=r"--tflite=.*missing.tflite: no such file"):
        read_bytes(str(tmp_path / "missing.tflite"), "--tflite")
    with pytest.raises(UsageError, match="is a directory"):
        read_bytes(str(tmp_path))
    (tmp_path / "f").write_bytes(b"abc")
    assert read_bytes(str(tmp_path / "f")) == b"abc"


def test_output_paths_are_checked_before_any_work(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UsageError, match="--json_out=.*is a directory"):
        check_output_paths({"--out": str(tmp_path / "o"), "--json_out": str(tmp_path)})
    with pytest.raises(UsageError, match="a_file is a file, not a folder"):
        check_output_paths({"--json_out": str(tmp_path / "a_file" / "sub" / "r.json")})
    with pytest.raises(UsageError, match="the same file as --out"):
        check_output_paths({"--out": str(tmp_path / "o"), "--json_out": str(tmp_path / "o")})
    check_output_paths({"--out": str(tmp_path / "new" / "folder" / "o"), "--json_out": None})
    assert not (tmp_path / "new").exists()  # folders are made only when writing


def test_write_outputs_all_or_nothing(tmp_path):
    (tmp_path / "a_file").write_text("x")
    good, bad = str(tmp_path / "out" / "model.bin"), str(tmp_path / "a_file" / "r.json")
    with pytest.raises(UsageError):
        write_outputs({good: b"\x00\x01", bad: {"k": 1}})
    assert not os.path.exists(good)
    assert sorted(os.listdir(tmp_path)) == ["a_file"]  # no temporary file, no half-made folder left
    write_outputs({good: b"\x00\x01", str(tmp_path / "r.json"): {"k": 1}, str(tmp_path / "t.txt"): "hi", "": b""})
    assert open(good, "rb").read() == b"\x00\x01" and open(tmp_path / "t.txt").read() == "hi"
    assert open(tmp_path / "r.json").read() == '{\n  "k": 1\n}\n'
    assert oct(os.stat(good).st_mode & 0o777) != oct(0o600)  # the usual permissions, not mkstemp's
