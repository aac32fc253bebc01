"""The predictor's CMSIS-NN buffer sizes (tfmcu/plan/cmsis_nn.py) against CMSIS-NN's own C functions: the pinned
archive's *_get_buffer_size_dsp functions (the ones a Cortex-M4 / M7 build calls), *_get_buffer_size_mve ones (a
Cortex-M55 build's, plain C too) and the dispatching ones without ARM_MATH_DSP (a Cortex-M3 build's) compiled for
this host with gcc and called over a grid of layer shapes. Runs outside `bazel test` (it reads ../shared/third_party); skipped with the
reason when gcc or the archive is missing."""
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
THIRD_PARTY = os.environ.get("TFMCU_THIRD_PARTY", os.path.join(ROOT, "..", "shared", "third_party"))
ARCHIVE = os.path.join(THIRD_PARTY, "4ab83cc3cc98fb85ed6dafb55e8ca02f1628dcae.tar.gz")  # CMSIS-NN (WORKSPACE)
SOURCES = ("Source/ConvolutionFunctions/arm_convolve_get_buffer_sizes_s8.c",
           "Source/ConvolutionFunctions/arm_depthwise_conv_get_buffer_sizes_s8.c",
           "Source/PoolingFunctions/arm_avgpool_get_buffer_sizes_s8.c",
           "Source/FullyConnectedFunctions/arm_fully_connected_get_buffer_sizes_s8.c")

HARNESS = r"""
#include <stdio.h>
#include "arm_nnfunctions.h"
int main(void) {
  int kh, kw, c, oc, ph, pw, ih;
  while (scanf("%d %d %d %d %d %d %d", &kh, &kw, &c, &oc, &ph, &pw, &ih) == 7) {
    cmsis_nn_conv_params cp = {0};
    cp.stride.w = 1; cp.stride.h = 1; cp.padding.w = pw; cp.padding.h = ph; cp.dilation.w = 1; cp.dilation.h = 1;
    cmsis_nn_dw_conv_params dp = {0};
    dp.ch_mult = 1; dp.stride = cp.stride; dp.padding = cp.padding; dp.dilation = cp.dilation;
    cmsis_nn_dims in = {1, ih, 16, c}, f = {oc, kh, kw, c}, fd = {1, kh, kw, oc}, out = {1, ih, 16, oc};
    cmsis_nn_dims fc = {c, 1, 1, oc};
    printf("%d %d %d %d %d %d %d %d %d %d %d\n", arm_convolve_wrapper_s8_get_buffer_size_dsp(&cp, &in, &f, &out),
           arm_depthwise_conv_wrapper_s8_get_buffer_size_dsp(&dp, &in, &fd, &out),
           arm_avgpool_s8_get_buffer_size_dsp(16, c), arm_convolve_wrapper_s8_get_buffer_size_mve(&cp, &in, &f, &out),
           arm_depthwise_conv_wrapper_s8_get_buffer_size_mve(&dp, &in, &fd, &out),
           arm_avgpool_s8_get_buffer_size_mve(16, c),
           /* without ARM_MATH_DSP (this host build): the plain C paths' */
           arm_convolve_wrapper_s8_get_buffer_size(&cp, &in, &f, &out),
           arm_depthwise_conv_wrapper_s8_get_buffer_size(&dp, &in, &fd, &out), arm_avgpool_s8_get_buffer_size(16, c),
           arm_fully_connected_s8_get_buffer_size_dsp(&fc), arm_fully_connected_s8_get_buffer_size_mve(&fc));
  }
  return 0;
}
"""

CASES = [(kh, kw, c, oc, ph, pw, ih) for kh, kw in ((1, 1), (3, 3), (5, 5), (7, 7), (1, 3), (3, 1))
         for c in (1, 3, 4, 8, 13, 32, 144) for oc in (c, 2 * c) for ph, pw in ((0, 0), (1, 1), (2, 2), (0, 1))
         for ih in (1, 5)]


def test_python_buffer_sizes_equal_cmsis_nn(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed (make setup installs it)")
    if not os.path.exists(ARCHIVE):
        pytest.skip(f"no CMSIS-NN archive at {ARCHIVE}")
    from tfmcu.plan import cmsis_nn

    with tarfile.open(ARCHIVE) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and (m.name.endswith(".h") or
                                                                 m.name.split("/", 1)[1] in SOURCES)]
        tf.extractall(tmp_path, members=members)
    top = tmp_path / members[0].name.split("/")[0]
    (tmp_path / "harness.c").write_text(HARNESS)
    exe = tmp_path / "sizes"
    subprocess.run(["gcc", "-std=c99", "-w", f"-I{top}", f"-I{top / 'Include'}", str(tmp_path / "harness.c")]
                   + [str(top / s) for s in SOURCES] + ["-o", str(exe)], check=True)
    text = "\n".join(" ".join(map(str, c)) for c in CASES)
    got = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.split("\n")
    for case, line in zip(CASES, got):
        kh, kw, c, oc, ph, pw, ih = case
        conv, dw, pool, conv_mve, dw_mve, pool_mve, conv_c, dw_c, pool_c, fc, fc_mve = map(int, line.split())
        assert cmsis_nn.conv_buffer_bytes(kh, kw, c, (ph, pw)) == conv, case
        assert cmsis_nn.depthwise_buffer_bytes(kh, kw, c, oc, (ph, pw)) == dw, case
        assert cmsis_nn.avgpool_buffer_bytes(c) == pool, case
        box = dict(mve=True, in_hw=(ih, 16), out_w=16)  # (the harness's input and output width, stride 1)
        assert cmsis_nn.conv_buffer_bytes(kh, kw, c, (ph, pw), **box) == conv_mve, case
        assert cmsis_nn.depthwise_buffer_bytes(kh, kw, c, oc, (ph, pw), **box) == dw_mve, case
        assert cmsis_nn.avgpool_buffer_bytes(c, mve=True) == pool_mve, case
        assert cmsis_nn.conv_buffer_bytes(kh, kw, c, (ph, pw)) == conv_c, case  # (the same without DSP)
        assert cmsis_nn.depthwise_buffer_bytes(kh, kw, c, oc, (ph, pw), dsp=False) == dw_c, case
        assert cmsis_nn.avgpool_buffer_bytes(c, dsp=False) == pool_c, case
        assert cmsis_nn.fully_connected_buffer_bytes(oc) == fc, case
        assert cmsis_nn.fully_connected_buffer_bytes(oc, mve=True) == fc_mve, case
