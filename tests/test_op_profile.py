"""The per-op profile's reading of the plugin's segments file (``tfmcu.firmware.profile``), without QEMU: the stretch
each op's end marker closes at depth 2 is the op, a file with fewer op regions than the firmware profiled or a
malformed one is a one-line ProfileError, and C++ symbols read as their functions' names. (deploy --run --profile
under QEMU: tests/e2e/test_deploy_run.py.)"""

from __future__ import annotations

import pytest

from tfmcu.firmware.profile import ProfileError, by_function, op_stretches, read_segments, short_name

# markers: begin(invoke) B@0, begin(op0) B@1, end(op0) E@2, begin(op1) B@1, end(op1) E@2, end(invoke) E@1, exit X@0
SEGMENTS = """S 0 B 0
0x100 5
S 1 B 1
0x200 2
S 2 E 2
0x300 7
0x302 3
S 3 B 1
0x200 1
S 4 E 2
0x400 11
S 5 E 1
0x200 1
S 6 X 0
0x100 4
"""


def test_each_op_is_the_stretch_its_end_marker_closes(tmp_path):
    path = tmp_path / "segments.txt"
    path.write_text(SEGMENTS)
    segs = read_segments(str(path))
    assert [(k, d) for k, d, _ in segs] == [("B", 0), ("B", 1), ("E", 2), ("B", 1), ("E", 2), ("E", 1), ("X", 0)]
    ops = op_stretches(segs, 2)
    assert ops == [{0x300: 7, 0x302: 3}, {0x400: 11}]
    with pytest.raises(ProfileError, match="2 op regions, the firmware profiled 3 ops"):
        op_stretches(segs, 3)
    path.write_text("S 0 B\n")
    with pytest.raises(ProfileError, match="not the plugin's segments file"):
        read_segments(str(path))


def test_functions_by_address_and_their_names():
    syms = ([0x300, 0x400], [(0x300, 0x310, "tfmcu_logistic_s8"), (0x400, 0x420, "arm_nn_mat_mult_nt_t_s8")])
    got = by_function({0x300: 7, 0x302: 3, 0x400: 11, 0x500: 1}, syms)
    assert [(f.function, f.instructions) for f in got] == [("arm_nn_mat_mult_nt_t_s8", 11),
                                                           ("tfmcu_logistic_s8", 10), ("?", 1)]
    assert short_name("tflite::(anonymous namespace)::EvalQuantizedPerChannel(TfLiteContext*, TfLiteNode*)") == \
        "EvalQuantizedPerChannel"
    assert short_name("tflite::Foo<signed char, long>(int)") == "Foo"
    assert short_name("tfmcu_logistic_s8.part.0") == "tfmcu_logistic_s8"
