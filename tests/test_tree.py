"""`deploy --tree` (tfmcu/firmware/tree.py): a deploy folder as a plain CMake source tree for vendor IDEs.

- A custom-mode model (a TFMCU_PATCH_STAGE op, builtin ops for the rest; TFLM's reference kernels) for the STM32F405:
  the tree holds TFLM's runtime and the kernels of the model's ops only, our sources as in this checkout; CMake +
  arm-none-eabi-gcc build it (make -j2), and under QEMU netduinoplus2 its output bytes are TF Lite's (expect.json)
  and its arena is the predicted one, which the Bazel build of the same model measures too (`deploy --run`,
  tests/e2e/test_deploy_run.py).
- A per-layer builtin model with the CMSIS-NN kernels for the Cortex-M7 (exported, not built): CMSIS-NN and TFLM's
  CMSIS-NN kernel variants with -DCMSIS_NN, the M7's flags and memory, flatbuffers patched as WORKSPACE patches it.
- Errors: one line, nothing written.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.errors import TfmcuError, UsageError  # noqa: E402
from tfmcu.firmware import bazel_graph, sources, tree  # noqa: E402
from tfmcu.firmware.targets import TARGETS  # noqa: E402
from tfmcu.flows import deploy  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan import regions  # noqa: E402
from tfmcu.stage import custom  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS_DIR = "tflite-micro/tensorflow/lite/micro/kernels/"


def _need(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (make setup installs them)")


def _files(dest):
    return {os.path.relpath(os.path.join(d, f), dest).replace(os.sep, "/")
            for d, _, fs in os.walk(dest) for f in fs}


def _quiet(_):
    return None


def _custom_tiny(zoo_models, tmp_path, inplace):
    """tiny_per_tensor in custom mode (2x2 patches over its stage; the rest planned in place or not), written as
    m.tflite in ``tmp_path``."""
    data = zoo_models("tiny_per_tensor")
    g = from_tflite(data, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    path = tmp_path / "m.tflite"
    path.write_bytes(custom.rewrite_custom(data, g, s, "tiny", inplace=inplace).model)
    return path


def test_tree_builds_with_cmake_and_runs_like_the_bazel_firmware(zoo_models, tmp_path):
    _need("cmake", "make", "arm-none-eabi-gcc", "arm-none-eabi-g++", "qemu-system-arm")
    path = _custom_tiny(zoo_models, tmp_path, inplace=True)
    fw, dest = tmp_path / "fw", tmp_path / "tree"
    # the tree is the board's link, and QEMU's netduinoplus2 maps no CCM: TFLM's persistent data in the one arena
    rep = deploy.prepare(deploy.DeployOptions(str(path), "stm32f405", str(fw), kernels="reference",
                                              persistent_apart=False), log=_quiet)
    man = tree.export_tree(str(fw), str(dest), log=_quiet)
    files = _files(dest)
    assert {"CMakeLists.txt", "arm-none-eabi.cmake", "README.txt", "tree.json", "app/main.cc", "app/test_inputs.cc",
            "app/model/model_data.cc", "app/model/tfmcu_model.h", "app/model/tfmcu_model.cc",
            "app/model/tfmcu_model_config.h", "app/example_frame.c", "app/expect.json",
            "tfmcu/tflm_patch_kernels/firmware/stm32f405.ld",
            "tfmcu/tflm_patch_kernels/tflm/patch_stage_op.cc", "tflite-micro/LICENSE"} <= files
    # TFLM's kernels: exactly those of the model's ops (the libraries the Bazel firmware links) + the shared helpers
    ops = ["custom:" + o if o == "TFMCU_PATCH_STAGE" else o for o in rep.ops]
    table = sources.kernel_table()
    want = {f"{KERNELS_DIR}{f}.cc" for lib in sources.kernel_libraries(ops, "reference")
            for f in table[lib.split(":kernel_")[1]][1]}
    want.add(KERNELS_DIR + "kernel_util.cc")  # the runtime's
    assert {f for f in files if f.startswith(KERNELS_DIR) and f.endswith(".cc")} == want
    # no CMSIS-NN (a header of ours that includes its backend's under #ifdef TFMCU_CMSIS_NN may come along)
    assert not any(f.startswith("third_party/cmsis_nn") or "cmsis" in f and f.endswith((".c", ".cc")) for f in files)
    # ours as in this checkout
    for f in (f for f in files if f.startswith("tfmcu/")):
        with open(os.path.join(ROOT, f[len("tfmcu/"):]), "rb") as mine:
            assert (dest / f).read_bytes() == mine.read(), f
    assert man["arena_bytes"] == rep.arena.arena_bytes and man["target"] == "stm32f405"
    assert (f"#define TFMCU_MODEL_ARENA_BYTES {rep.arena.arena_bytes}u"
            in (dest / "app" / "model" / "tfmcu_model_config.h").read_text())
    assert "add_library(tfmcu_model INTERFACE)" in (dest / "CMakeLists.txt").read_text()

    build = tmp_path / "build"
    t0 = time.monotonic()
    for cmd in (["cmake", "-S", str(dest), "-B", str(build), "-DTFMCU_DEBUG_INFO=OFF"],
                ["cmake", "--build", str(build), "-j2"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built_s = time.monotonic() - t0
    report = tmp_path / "run.json"
    q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf",
                        str(build / "firmware.elf"), "--machine", TARGETS["stm32f405"].machine, "--expect",
                        str(dest / "app" / "expect.json"), "--report", str(report), "--timeout", "60", "--quiet"],
                       capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    res = json.loads(report.read_text())["result"]
    expect = json.loads((fw / "expect.json").read_text())["expect"]
    assert res["output_fnv1a32"] == expect["output_fnv1a32"] and res["top_class"] == expect["top_class"]
    assert res["arena_used_bytes"] == rep.arena.predicted_bytes  # exact, as the Bazel firmware's
    assert res["arena_bytes"] == rep.arena.arena_bytes and res["target"] == "stm32f405"
    print(f"tree: cmake configure + build {built_s:.0f} s")


def test_cmsis_nn_tree_has_cmsis_nn_the_m7_flags_and_patched_flatbuffers(zoo_models, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(zoo_models("tiny_per_tensor"))  # per layer: builtin ops only
    fw, dest = tmp_path / "fw", tmp_path / "tree"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "cortex-m7", str(fw)), log=_quiet)  # kernels: cmsis_nn
    man = tree.export_tree(str(fw), str(dest), log=_quiet)
    files = _files(dest)
    libs = man["libraries"]
    assert "-DCMSIS_NN" in libs["@tflite_micro//:kernel_conv_cmsis_nn"]["copts"]
    assert KERNELS_DIR + "cmsis_nn/conv.cc" in files and KERNELS_DIR + "conv.cc" not in files
    # no TFMCU_PATCH_STAGE op: of ours only the firmware's harness, startup, board and TFLM runtime glue
    assert {f for f in files if f.startswith("tfmcu/") and f.endswith((".c", ".cc"))} == {
        "tfmcu/tflm_patch_kernels/" + f for f in ("firmware/harness.c", "firmware/startup.c", "firmware/board_mps2.c",
                                                   "tflm/model_runtime.cc")}
    # CMSIS-NN: every source third_party/cmsis_nn.BUILD compiles (the archive's Source/**/*.c but float ones)
    cmsis = next(a for n, a in man["archives"].items() if n == "cmsis_nn")
    base = cmsis["url"].rsplit("/", 1)[1]
    archive = next(os.path.join(d, base) for d in tree.archive_dirs() if os.path.isfile(os.path.join(d, base)))
    with tarfile.open(archive) as tf:
        names = [m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile()]
    want = tree.glob_files(names, ["Source/**/*.c"], ["Source/**/*_f16.c", "Source/**/*_f32.c",
                                                      "Source/**/arm_nntables_flt.c"])
    assert len(want) > 50
    assert {f for f in files if f.startswith("third_party/cmsis_nn/Source/")} == {"third_party/cmsis_nn/" + f
                                                                                   for f in want}
    assert "ARM_NN_ENABLE_F16=0" in libs["@cmsis_nn//:cmsis_nn"]["defines"]
    # the Cortex-M7's flags (tools/bazel/arm/cc_toolchain_config.bzl) and memory (mps2.ld, its SRAM budget)
    assert man["flags"]["cpu"] == ["-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard"]
    assert "-O2" in man["flags"]["compile"] and "-std=c++17" in man["flags"]["cxx"]
    cml = (dest / "CMakeLists.txt").read_text()
    assert "tfmcu/tflm_patch_kernels/firmware/mps2.ld" in cml
    assert f"-Wl,--defsym=TFMCU_SRAM_BUDGET={TARGETS['cortex-m7'].sram_bytes}" in cml
    # flatbuffers with TFLM's patch (WORKSPACE: patches = [...flatbuffers.patch])
    base_h = (dest / "third_party/flatbuffers/include/flatbuffers/base.h").read_text()
    assert "#define FLATBUFFERS_LOCALE_INDEPENDENT 0" in base_h
    assert rep.kernels == "cmsis_nn" and man["kernels"] == "cmsis_nn"


def _fake_folder(path, target="cortex-m4"):
    """A deploy folder's files without a model (enough to export, not to run)."""
    path.mkdir()
    (path / "BUILD").write_text(sources.build_file(TARGETS[target], 4096, 2048, ["CONV_2D"], "reference"))
    (path / "deploy.json").write_text(json.dumps({"target": target, "kernels": "reference"}))
    for name in ("main.cc", "test_inputs.cc", "model/model_data.cc", "model/tfmcu_model.cc", "model/tfmcu_model.h",
                 "model/tfmcu_model_config.h", "expect.json"):
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).write_text("\n")
    return path


def test_errors_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    fw = _fake_folder(tmp_path / "fw")
    with pytest.raises(UsageError, match="not a deploy folder") as e:
        tree.export_tree(str(tmp_path / "nothing"), str(tmp_path / "t"), log=_quiet)
    with pytest.raises(UsageError, match="--tree=.*: must lie outside the deploy folder"):
        tree.export_tree(str(fw), str(fw / "tree"), log=_quiet)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a folder"):
        tree.check_dest(str(fw), str(tmp_path / "file"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="neither empty nor a tfmcu tree") as e:
        tree.export_tree(str(fw), str(other), log=_quiet)
    assert "\n" not in str(e.value) and (other / "keep.txt").read_text() == "mine"
    # an earlier tree is replaced
    dest = tmp_path / "tree"
    tree.export_tree(str(fw), str(dest), log=_quiet)
    (dest / "stale.txt").write_text("old")
    tree.export_tree(str(fw), str(dest), log=_quiet)
    assert not (dest / "stale.txt").exists() and (dest / "tree.json").exists()
    # archives missing: one line naming the archive, and no tree
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(bazel_graph, "archive_dirs", lambda third_party=None: [str(empty)])
    with pytest.raises(TfmcuError, match=r"@\w+: archive \w+\.tar\.gz .* not found in") as e:
        tree.check_dest(str(fw), str(tmp_path / "t2"))  # what deploy --tree checks before any work
    with pytest.raises(TfmcuError, match=r"@\w+: archive \w+\.tar\.gz .* not found in") as e:
        tree.export_tree(str(fw), str(tmp_path / "t2"), log=_quiet)
    assert "\n" not in str(e.value) and not (tmp_path / "t2").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


OUTSIDE_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(classify C CXX)
add_subdirectory(${TFMCU_TREE} tfmcu)
add_executable(classify main.c ${TFMCU_TREE}/app/example_frame.c)
target_link_libraries(classify PRIVATE tfmcu_model tfmcu_board)
set_target_properties(classify PROPERTIES SUFFIX .elf)
"""


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_model_library_links_into_a_cmake_project_outside_the_repository(zoo_models, tmp_path, target):
    """The model library as a user takes it: a CMake project in a temporary folder (the example application,
    examples/classify/main.c, and its frame) adds the exported tree as a subdirectory and links its tfmcu_model and
    tfmcu_board targets; nothing else of the tree is built (not its test firmware). Under QEMU it prints TF Lite's top
    class and output bytes on the frame (expect.json's "example") and the predicted arena. A custom-mode model: the
    library holds our kernels, TFLM and the model."""
    _need("cmake", "make", "arm-none-eabi-gcc", "arm-none-eabi-g++", "qemu-system-arm")
    path = _custom_tiny(zoo_models, tmp_path, inplace=False)
    fw, dest, app = tmp_path / "fw", tmp_path / "tree", tmp_path / "app"
    rep = deploy.prepare(deploy.DeployOptions(str(path), target, str(fw), kernels="reference"), log=_quiet)
    tree.export_tree(str(fw), str(dest), log=_quiet)
    app.mkdir()
    shutil.copyfile(os.path.join(ROOT, "examples", "classify", "main.c"), app / "main.c")
    (app / "CMakeLists.txt").write_text(OUTSIDE_CMAKE)
    build = app / "build"
    for cmd in (["cmake", "-S", str(app), "-B", str(build), f"-DTFMCU_TREE={dest}", "-DTFMCU_DEBUG_INFO=OFF",
                 f"-DCMAKE_TOOLCHAIN_FILE={dest / 'arm-none-eabi.cmake'}"],
                ["cmake", "--build", str(build), "-j2"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (build / "classify.elf").is_file() and not (build / "tfmcu" / "firmware.elf").exists()
    report = tmp_path / "run.json"
    q = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "qemu", "run_firmware.py"), "--elf",
                        str(build / "classify.elf"), "--machine", TARGETS[target].machine, "--example", "--expect",
                        str(dest / "app" / "expect.json"), "--report", str(report), "--timeout", "60"],
                       capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    example = json.loads(report.read_text())["example"]
    want = json.loads((fw / "expect.json").read_text())["example"]
    assert example["top_class"] == want["top_class"] and example["output_fnv1a32"] == want["output_fnv1a32"]
    assert example["arena_used_bytes"] == rep.arena.predicted_bytes
    assert "top-1: class" in q.stdout and "invoke:" in q.stdout
