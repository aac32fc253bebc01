"""End-to-end checks that need this checkout's Bazel (they call it), so they run outside `bazel test`: `make test`
runs them right after it (`pytest tests/e2e`), when TFLM is already built for the targets.

- `deploy --run` for each target with the default kernels (CMSIS-NN: TFLM's and the patch executor's backend): a
  custom-mode model fits, runs under QEMU, its output bytes equal TF Lite's on real Fashion-MNIST test images and its
  arena equals the prediction; the same model planned in place with `--kernels=reference` on the STM32F405; the
  per-layer MobileNetV2-0.35-96 does not fit the STM32F405 (its link overflows the 128 KiB of SRAM), with the
  figure, and exit status 1; a model whose stage streams its input (rewrite --stream_input) on the Cortex-M4, its
  image rows fed from Flash through the input provider.
- In every run the example application (examples/classify/main.c over the deploy folder's model library) runs on the
  same QEMU board: its top class and output bytes equal TF Lite's on its frame; on the Pico it links.
- The resolver table (tfmcu/firmware/sources.py) against TFLM's micro_mutable_op_resolver.h, and the ABI table
  (tfmcu/plan/tflm_abi.json) recompiled from the pinned archives (tools/gen/gen_tflm_abi.py --check).
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
THIRD_PARTY = os.environ.get("TFMCU_THIRD_PARTY", os.path.join(ROOT, "..", "shared", "third_party"))
PY = sys.executable


def _need_bazel():
    if not shutil.which("bazel"):
        pytest.skip("bazel is not installed (make setup installs it)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """tiny_per_tensor in custom mode (rest disjoint, and rest in place), MobileNetV2-0.35-96 per layer, and 4
    Fashion-MNIST test images for each."""
    from tfmcu.data import load
    from tfmcu.data.classify import as_arrays
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.nets import zoo
    from tfmcu.plan import regions
    from tfmcu.runtime.model_io import model_info
    from tfmcu.stage import custom
    from tfmcu.train.export import quantize_inputs
    import numpy as np

    d = tmp_path_factory.mktemp("models")
    out = {}
    for key, name, patches, inplace, core in (("tiny", "tiny_per_tensor", 2, False, None),
                                              ("tiny_inplace", "tiny_per_tensor", 2, True, None),
                                              ("tiny_inplace_helium", "tiny_per_tensor", 2, True, "cortex-m55"),
                                              ("mbv2_035_96", "mbv2_035_96", None, False, None)):
        m = zoo.build(name, os.environ.get("TFMCU_ZOO_CACHE"))
        if patches:
            g = from_tflite(m, name=name)
            m = custom.rewrite_custom(m, g, regions.schedule(g, patches, n_blocks=zoo.ZOO[name].patch_blocks), name,
                                      inplace=inplace, kernels="cmsis_nn" if core else "reference", core=core).model
        shape = model_info(m).inputs[0].shape
        x, _ = as_arrays(load("fashion_mnist").test, shape[1], shape[3], limit=4)
        (d / f"{key}.tflite").write_bytes(m)
        np.save(d / f"{key}.npy", quantize_inputs(m, x))
        out[key] = (str(d / f"{key}.tflite"), str(d / f"{key}.npy"))
    return out


def _deploy(tflite, inputs, target, out_dir, *flags):
    r = subprocess.run([PY, "-m", "pipelines.deploy", f"--tflite={tflite}", f"--inputs={inputs}",
                        f"--target={target}", f"--out_dir={out_dir}", "--run", *flags], cwd=ROOT,
                       capture_output=True, text=True)
    rep = json.load(open(os.path.join(out_dir, "deploy.json"))) if os.path.exists(out_dir) else None
    return r, rep


# The Cortex-M33 and M55 runs report on their CMSDK UART 0 (at its secure alias), semihosting off: one run checks both.
@pytest.mark.parametrize("target,kernels,console", [("stm32f405", "cmsis_nn", "semihosting"),
                                                    ("cortex-m4", "cmsis_nn", "semihosting"),
                                                    ("cortex-m7", "cmsis_nn", "semihosting"),
                                                    ("cortex-m3", "cmsis_nn", "semihosting"),
                                                    ("cortex-m33", "cmsis_nn", "uart"),
                                                    ("cortex-m55", "cmsis_nn", "uart"),
                                                    ("stm32f405", "reference", "semihosting")])
def test_deploy_run_fits_and_equals_tflite(models, tmp_path, target, kernels, console):
    _need_bazel()
    model = models["tiny" if kernels == "cmsis_nn" else "tiny_inplace"]
    r, rep = _deploy(*model, target, str(tmp_path / "fw"), f"--kernels={kernels}", f"--console={console}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert ('"@//tflm_patch_kernels/firmware:harness_uart"' in open(tmp_path / "fw" / "BUILD").read()) == (
        console == "uart")
    assert rep["kernels"] == kernels
    assert ("CMSIS-NN" in rep["run"]["measured_by"]) == (kernels == "cmsis_nn")  # names the kernels it measured
    assert ("_cmsis_nn" in open(tmp_path / "fw" / "BUILD").read()) == (kernels == "cmsis_nn")
    assert f"fits {target}" in r.stdout and rep["fits"] and rep["run"]["outputs_equal_tflite"]
    run = rep["run"]
    assert run["arena_used_bytes"] == rep["arena"]["predicted_bytes"]  # exact on Cortex-M, either kernels
    assert len(run["invoke_insns"]) == 4 and min(run["invoke_insns"]) > 1_000_000
    assert run["stack_hwm_bytes"] < rep["stack_bytes"]
    if target == "stm32f405":  # TFLM's persistent data apart, in the CCM: where QEMU maps it (0x20020000, past the
        # chip's 128 KiB of SRAM), and in the board's own link at the CCM's address
        _persistent_apart(rep, "CCM", (0x20020000, 0x20030000), (0x10000000, 0x10010000), tmp_path / "fw")
    _board_files(tmp_path / "fw", rep, r.stdout)


def _persistent_apart(rep, region, in_qemu, on_board, folder):
    """TFLM's persistent buffer in ``region``: at an address in ``in_qemu`` (lo, hi) in the run, in ``on_board`` in
    the board's own ELF (the folder's copy)."""
    run = rep["run"]
    assert rep["arena"]["persistent_region"] == region and run["persistent_bytes"] == rep["arena"]["persistent_bytes"]
    assert in_qemu[0] <= int(run["persistent_at"], 16) < in_qemu[1]
    nm = subprocess.run(["arm-none-eabi-nm", os.path.join(folder, "firmware.elf")],
                        capture_output=True, text=True, check=True).stdout
    at = next(int(ln.split()[0], 16) for ln in nm.splitlines() if ln.endswith("g_persistentE"))
    assert on_board[0] <= at < on_board[1]


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_deploy_run_profile_per_op(models, tmp_path, target):
    """``--profile``: the per-op firmware's ops each measured by the plugin, their instructions summing to the
    profiled Invoke's less the interpreter's between them (a few dozen per op), the patch stage's own kernels named,
    MACs and the predictor's figures beside; the outputs still checked; profile.json and profile.png written."""
    _need_bazel()
    out = tmp_path / "fw"
    r, rep = _deploy(*models["tiny"], target, str(out), "--profile",
                     *(["--console=uart"] if target == "cortex-m55" else []))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '"-DTFMCU_PROFILE_OPS"' in open(out / "BUILD").read()
    assert rep["fits"] and rep["run"]["outputs_equal_tflite"]
    prof = json.load(open(out / "profile.json"))
    assert prof == rep["profile"] and (out / "profile.png").stat().st_size > 10_000
    assert not (out / "segments.txt").exists()
    ops = prof["ops"]
    tags = rep["run"]["op_tags"]
    assert [o["type"] for o in ops] == tags and tags[0] == "TFMCU_PATCH_STAGE" and set(tags) == set(rep["ops"])
    total = sum(o["instructions"] for o in ops)
    assert total == sum(rep["run"]["op_insns"])
    assert 0 < prof["invoke_instructions"] - total == prof["between_ops"] < 100 * len(ops)
    assert prof["invoke_instructions"] == rep["run"]["invoke_insns"][0]
    stage = ops[0]
    assert stage["macs"] > 0 and any(f["function"].startswith(("tfmcu_", "arm_")) for f in stage["functions"])
    for o in ops:  # each op's instructions as the latency predictor has them (within its calibration's error)
        assert abs(o["predicted_instructions"] / o["instructions"] - 1) < 0.25, o
    assert abs(sum(o["share"] for o in ops) - 1) < 1e-9
    assert "per-op profile of the first Invoke" in r.stdout
    # estimated cycles per op (tfmcu.firmware.cycles) and ms at the board's clock (boards.json)
    assert prof["cycles_by"] and target in prof["cycles_by"] and prof["clock_hz"] > 0
    for o in ops:
        assert o["cycles"] > 0 and o["ms"] == pytest.approx(1000 * o["cycles"] / prof["clock_hz"])
        if target == "cortex-m4":  # one cycle or more per instruction on the M4 (its TRM's table)
            assert o["cycles"] >= o["instructions"]
    layers = stage["layers"]  # the stage's layers, its measured count split as estimated
    assert layers and sum(x["instructions"] for x in layers) + stage["executor_instructions"] == stage["instructions"]


def test_deploy_run_helium_inplace_plan(models, tmp_path):
    """A model whose rest is planned in place for CMSIS-NN's Helium code (rewrite --inplace --core=cortex-m55)
    runs on the Cortex-M55 with outputs equal to TF Lite's and the predicted arena; a DSP core refuses it."""
    _need_bazel()
    r, rep = _deploy(*models["tiny_inplace_helium"], "cortex-m55", str(tmp_path / "fw"), "--kernels=cmsis_nn")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert rep["fits"] and rep["run"]["outputs_equal_tflite"]
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]
    r, _ = _deploy(*models["tiny_inplace_helium"], "cortex-m4", str(tmp_path / "m4"), "--kernels=cmsis_nn")
    assert r.returncode == 2 and "Helium" in r.stderr and not (tmp_path / "m4").exists()


@pytest.mark.parametrize("board,usart", [("stm32f405", 1), ("nucleo-f446re", 2)])
def test_deploy_run_reports_on_the_uart(models, tmp_path, board, usart):
    """--console=uart: the firmware writes its report on the board's UART with semihosting off, as a board without a
    debugger runs it: the STM32F405's USART1 (QEMU netduinoplus2's first serial port), a Nucleo's USART2 (its ST-LINK
    virtual COM port; the QEMU board's second); the same figures as through semihosting. (CMSDK UART 0 of the
    Cortex-M33's mps2-an505 and the Cortex-M55's mps3-an547: their runs above.)"""
    _need_bazel()
    r, rep = _deploy(*models["tiny"], board, str(tmp_path / "fw"), "--console=uart")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    build = open(tmp_path / "fw" / "BUILD").read()
    assert '"@//tflm_patch_kernels/firmware:harness_uart"' in build
    assert ('board_stm32f405_usart2"' in build) == (usart == 2)
    assert rep["fits"] and rep["run"]["outputs_equal_tflite"]
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]
    assert len(rep["run"]["invoke_insns"]) == 4 and min(rep["run"]["invoke_insns"]) > 1_000_000
    _board_files(tmp_path / "fw", rep, r.stdout)  # the example application too, on the same UART


@pytest.mark.parametrize("board", ["nucleo-f446re", "nrf52840-dk", "nucleo-h743zi", "nucleo-u575zi",
                                   "alif-ensemble-e7"])
def test_deploy_run_on_named_boards(models, tmp_path, board):
    """A named board (tfmcu/firmware/boards.json) links with its own memory map (board.ld) and runs under QEMU: the
    STM32F446's and the nRF52840's maps lie inside netduinoplus2's / mps2-an386's, so QEMU runs the board's own ELF;
    the STM32H743's Flash is where mps2-an500 has none, so QEMU runs the same firmware linked for it, held to the
    board's 128 KiB of DTCM (the model's RAM fits it: fast_ram); so does the STM32U575's (Cortex-M33: mps2-an505),
    held to its 512 KiB of SRAM3, and the Alif Ensemble E7's (Cortex-M55: mps3-an547; its MRAM at 0x80000000), held
    to its 1 MiB of DTCM. Outputs equal TF Lite's, the arena the prediction. The STM32H743 then keeps TFLM's
    persistent data in its AXI SRAM: at 0x24000000 in the board's link, in a region of its size at the end of QEMU's
    RAM in the link QEMU runs. The nRF52840, STM32H743 and STM32U575 boards report on the UART: their ELFs link
    their chips' UART drivers, what QEMU runs the MPS board's."""
    from tfmcu.firmware.targets import TARGETS

    _need_bazel()
    uart = ["--console=uart"] if board in ("nrf52840-dk", "nucleo-h743zi", "nucleo-u575zi") else []
    r, rep = _deploy(*models["tiny"], board, str(tmp_path / "fw"), *uart)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"fits {board}" in r.stdout and rep["fits"] and rep["run"]["outputs_equal_tflite"]
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]
    assert ("linked for the QEMU board's memory" in rep["run"]["measured_by"]) == (board in ("nucleo-h743zi",
                                                                                             "nucleo-u575zi",
                                                                                             "alif-ensemble-e7"))
    assert (tmp_path / "fw" / "board.ld").is_file()
    if uart:
        build = open(tmp_path / "fw" / "BUILD").read()
        assert '"@//tflm_patch_kernels/firmware:harness_uart"' in build
        assert f'"@//tflm_patch_kernels/firmware:{TARGETS[board].board_elf}"' in build  # the chip's UART driver
    if board == "nucleo-h743zi":  # the arena in the DTCM; the persistent data in the AXI SRAM: at the end of QEMU's
        # RAM in the run, at 0x24000000 on the board
        assert rep["estimate"]["region"] == rep["arena"]["region"] == "DTCM"
        _persistent_apart(rep, "AXI SRAM", (0x20380000, 0x20400000), (0x24000000, 0x24080000), tmp_path / "fw")
    _board_files(tmp_path / "fw", rep, r.stdout)
    # QEMU ran a link of its own where the board's is not the QEMU board's: both ELFs in the folder
    assert (tmp_path / "fw" / "firmware_qemu.elf").is_file() == TARGETS[board].qemu_link


def test_deploy_run_on_a_core_no_qemu_board_runs(models, tmp_path):
    """The Raspberry Pi Pico (RP2040, Cortex-M0+): --run builds and links the firmware (and the example application)
    with the board's memory and reports its sizes; nothing runs (no QEMU board has the core), so no figure is
    measured. Both ELFs as UF2 files, with the RP2040's second stage and its checksum in front."""
    _need_bazel()
    r, rep = _deploy(*models["tiny"], "rpi-pico", str(tmp_path / "fw"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "links for rpi-pico" in r.stdout and "not run: no QEMU board has the cortex-m0plus" in r.stdout
    run = rep["run"]
    assert rep["fits"] and run["linked"] and run["sizes"]["flash"] > rep["model_bytes"]
    assert run["invoke_insns"] == [] and run["arena_used_bytes"] is None
    assert "ORIGIN = 0x10000000, LENGTH = 2048K" in (tmp_path / "fw" / "board.ld").read_text()
    _board_files(tmp_path / "fw", rep, r.stdout)
    # what the RP2040 boots: the second stage (256 bytes, its CRC the boot ROM's), then the vector table at
    # 0x10000100 (the stack top in SRAM, the reset handler in Flash, Thumb); the UF2 holds the same image
    import struct

    from tfmcu.firmware.outputs import boot2_crc
    for name in ("firmware", "example"):
        uf2 = (tmp_path / "fw" / f"{name}.uf2").read_bytes()
        blocks = [uf2[i:i + 512] for i in range(0, len(uf2), 512)]
        image = b"".join(b[32:32 + 256] for b in blocks)
        assert [struct.unpack("<I", b[12:16])[0] for b in blocks] == [0x10000000 + 256 * n for n in range(len(blocks))]
        assert all(struct.unpack("<I", b[28:32])[0] == 0xE48BFF56 for b in blocks)
        if name == "firmware":
            raw = (tmp_path / "fw" / "firmware.bin").read_bytes()
            assert image[:len(raw)] == raw
        assert boot2_crc(image[:252]) == struct.unpack("<I", image[252:256])[0]
        sp, reset = struct.unpack("<2I", image[256:264])
        assert 0x20000000 < sp <= 0x20042000 and 0x10000100 < reset < 0x10200000 and reset & 1
    assert rep["files"]["uf2"] == "firmware.uf2" and "cp firmware.uf2 /media/$USER/RPI-RP2/" in rep["flash_with"][0]


def _board_files(folder, rep, stdout):
    """The files a board takes in the deploy folder (firmware.elf, .bin, .hex, .map), the board's flash commands
    in deploy.json with the folder's files in them, printed at the end."""
    elf = (folder / "firmware.elf").read_bytes()
    assert elf[:4] == b"\x7fELF"
    sizes = subprocess.run(["arm-none-eabi-size", "-A", str(folder / "firmware.elf")], capture_output=True, text=True,
                           check=True).stdout
    loaded = sum(int(ln.split()[1]) for ln in sizes.splitlines() if ln.startswith((".text", ".rodata", ".data")))
    assert (folder / "firmware.bin").stat().st_size >= loaded * 0.9
    hex_lines = (folder / "firmware.hex").read_text().splitlines()
    assert hex_lines[0].startswith(":") and hex_lines[-1] == ":00000001FF"  # Intel HEX, its end-of-file record
    assert "## Sections" in (folder / "firmware.map").read_text()
    assert {k: v for k, v in rep["files"].items() if k != "uf2"} == {
        "elf": "firmware.elf", "bin": "firmware.bin", "hex": "firmware.hex", "map": "firmware.map",
        "example": "example.elf"}
    # the example application (examples/classify/main.c over the model library) linked, and where QEMU runs the
    # board, run: its top class and output bytes TF Lite's on its frame (the first input); the library's archive
    assert (folder / "example.elf").read_bytes()[:4] == b"\x7fELF"
    archive = subprocess.run(["arm-none-eabi-nm", str(folder / "model" / "libtfmcu_model.a")], capture_output=True,
                             text=True, check=True).stdout
    assert " T tfmcu_model_invoke" in archive and " T tfmcu_model_init" in archive
    expect = json.load(open(folder / "expect.json"))["example"]
    if rep["run"]["invoke_insns"]:
        example = rep["run"]["example"]
        assert example["top_class"] == expect["top_class"] and example["output_fnv1a32"] == expect["output_fnv1a32"]
        assert example["arena_used_bytes"] == rep["run"]["arena_used_bytes"] and example["ticks"] > 0
        assert f"printed top-1 class {expect['top_class'][0]} and output bytes equal to TF Lite's" in stdout
    else:
        assert rep["run"].get("example") is None
    assert rep["flash_with"] and all("{" not in c for c in rep["flash_with"])
    assert any("firmware." in c for c in rep["flash_with"]) and rep["flash_with"][-1] in stdout


def test_deploy_run_persistent_apart_off_is_one_arena(models, tmp_path):
    """--nopersistent_apart: TFLM's persistent data in the one arena (no CCM buffer), as exactly predicted."""
    _need_bazel()
    r, rep = _deploy(*models["tiny"], "stm32f405", str(tmp_path / "fw"), "--nopersistent_apart")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "persistent_bytes" not in rep["arena"] and "persistent_bytes" not in rep["run"]
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]


def _opened(path: str, but: int) -> bool:
    """Whether a process other than ``but`` has ``path`` open (Linux /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == but:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                    return True
            except OSError:
                pass
    return False


def _validate_on_pty(elf, expect):
    """pipelines.validate on QEMU's UART: QEMU started halted with the UART on a pseudo-terminal, let run once
    validate holds the terminal open (QEMU drops what it writes to a terminal nobody has open). (exit, output)."""
    import re
    import time

    q = subprocess.Popen(["qemu-system-arm", "-M", "mps2-an386", "-nographic", "-S", "-monitor", "stdio", "-serial",
                          "pty", "-kernel", str(elf)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        pty, end = None, time.monotonic() + 30
        while pty is None and time.monotonic() < end:
            m = re.search(r"char device redirected to (/dev/pts/\d+)", q.stdout.readline())
            pty = m.group(1) if m else None
        assert pty, "QEMU named no pseudo-terminal"
        v = subprocess.Popen([PY, "-m", "pipelines.validate", f"--port={pty}", f"--expect={expect}", "--timeout=120"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while not _opened(pty, q.pid) and time.monotonic() < end + 60 and v.poll() is None:
            time.sleep(0.1)
        q.stdin.write("cont\n")
        q.stdin.flush()
        out, _ = v.communicate(timeout=180)
        return v.returncode, out
    finally:
        q.kill()
        q.wait()


def test_validate_over_a_serial_port(models, tmp_path):
    """pipelines.validate reads a firmware's report from a serial port (pyserial) and checks it against the deploy
    folder's expect.json: QEMU's UART on a pseudo-terminal, the path a board's USB serial takes. Exit 0 when the
    outputs equal TF Lite's, 1 on a planted wrong expectation, 2 on a port that cannot be opened or no expect.json
    (one line on stderr)."""
    _need_bazel()
    out = tmp_path / "fw"
    r, rep = _deploy(*models["tiny"], "cortex-m4", str(out), "--console=uart")
    assert r.returncode == 0 and rep["fits"], r.stdout[-2000:] + r.stderr[-2000:]
    expect = json.load(open(out / "expect.json"))
    wrong = dict(expect, expect=dict(expect["expect"], output_fnv1a32="0x00000000"))
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    rc, text = _validate_on_pty(out / "firmware.elf", out / "expect.json")
    assert rc == 0 and "validate: passed" in text and "outputs equal TF Lite's" in text, text
    assert f"arena {rep['arena']['predicted_bytes']:,} B used" in text
    rc, text = _validate_on_pty(out / "firmware.elf", tmp_path / "wrong.json")
    assert rc == 1 and "validate: FAILED" in text and "output_fnv1a32: got" in text, text
    for port, expect_path, what in (("/dev/nonexistent-tty", out / "expect.json", "cannot open"),
                                    ("/dev/null", tmp_path / "none.json", "no such file")):
        bad = subprocess.run([PY, "-m", "pipelines.validate", f"--port={port}", f"--expect={expect_path}"], cwd=ROOT,
                             capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and what in bad.stderr, bad.stderr


def test_deploy_run_per_layer_does_not_fit_stm32f405(models, tmp_path):
    _need_bazel()
    r, rep = _deploy(*models["mbv2_035_96"], "stm32f405", str(tmp_path / "fw"))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "does not fit stm32f405: the link overflows RAM by" in r.stdout
    assert rep["fits"] is False and rep["run"]["linked"] is False
    # measured per layer with TFLM + CMSIS-NN on Cortex-M4 / M7 (firmware tests tflm_mbv2_035_96_cmsis_nn)
    assert rep["arena"]["predicted_bytes"] == 204_644
    assert rep["run"]["overflow"]["bytes"] > 204_644 - 128 * 1024


def test_deploy_run_streamed_input(zoo_models_e2e, tmp_path):
    """A model whose patch stage streams its input (rewrite --stream_input): the firmware feeds the test images' rows
    from Flash through the kernel's TfmcuInputProvider (firmware_main.cc checks the contract); outputs equal TF
    Lite's on the original, every row read once per input, the arena the prediction."""
    _need_bazel()
    tflite = zoo_models_e2e["tiny_streamed"]
    out = str(tmp_path / "fw")
    r = subprocess.run([PY, "-m", "pipelines.deploy", f"--tflite={tflite}", "--num_inputs=2", "--target=cortex-m4",
                        f"--out_dir={out}", "--kernels=reference", "--run"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.load(open(os.path.join(out, "deploy.json")))
    assert rep["fits"] and rep["run"]["outputs_equal_tflite"] and rep["streamed_input"]["image_rows"] == 48
    assert rep["run"]["streamed_rows_read"] == [48, 48] and "image rows streamed from Flash" in r.stdout
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]


@pytest.fixture(scope="module")
def zoo_models_e2e(tmp_path_factory):
    """tiny_per_tensor 2x2 in custom mode with its input streamed."""
    from tfmcu.graph.from_tflite import from_tflite
    from tfmcu.nets import zoo
    from tfmcu.plan import regions
    from tfmcu.stage import custom

    d = tmp_path_factory.mktemp("streamed")
    m = zoo.build("tiny_per_tensor", os.environ.get("TFMCU_ZOO_CACHE"))
    g = from_tflite(m, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    (d / "tiny_streamed.tflite").write_bytes(custom.rewrite_custom(m, g, s, "tiny", streamed_input=True).model)
    return {"tiny_streamed": str(d / "tiny_streamed.tflite")}


def test_resolver_methods_exist_in_tflm():
    from tfmcu.firmware import sources

    archive = os.path.join(THIRD_PARTY, "90b983c2b3f1480642e040bbd2ddb37b998f3424.tar.gz")
    if not os.path.exists(archive):
        pytest.skip(f"no TFLM archive at {archive}")
    with tarfile.open(archive) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("micro/micro_mutable_op_resolver.h"))
        header = tf.extractfile(member).read().decode()
    for op, method in sources.RESOLVER_METHODS.items():
        body = header[header.index(f"TfLiteStatus {method}("):]
        body = body[:body.index("\n  }")]
        assert f"BuiltinOperator_{op}" in body, (op, method)


def test_abi_table_is_current():
    for tool in ("g++", "arm-none-eabi-g++", "objcopy", "arm-none-eabi-objcopy"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (make setup installs it)")
    r = subprocess.run([PY, os.path.join(ROOT, "tools", "gen", "gen_tflm_abi.py"), "--check",
                        "--third-party", THIRD_PARTY], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_board_added_in_a_boards_file_of_ones_own(models, tmp_path):
    """Adding a board is one entry in a boards file ($TFMCU_BOARDS, boards.json's format, beside the user's project;
    nothing in the checkout changes): deploy --run links the firmware with the board's memory (board.ld), runs it
    under the QEMU board of its build, and prints the board's own flash command; its outputs equal TF Lite's and its
    arena the prediction. A broken file is one line and exit status 2."""
    _need_bazel()
    boards = tmp_path / "my_boards.json"
    boards.write_text(json.dumps({"boards": {"my-m4-board": {
        "what": "My board: a Cortex-M4F part with 1 MiB of Flash and 192 KiB of SRAM", "core": "cortex-m4",
        "clock_mhz": 120, "flash": {"name": "Flash", "base": "0x00000000", "size_kib": 1024},
        "sram": [{"name": "SRAM", "base": "0x20000000", "size_kib": 192, "what": "SRAM1 + SRAM2"}],
        "firmware_ram": "SRAM", "runs_on": "cortex_m4", "qemu": "board", "console": "CMSDK APB UART 0",
        "flash_with": ["pyocd flash -t my_part {hex}   # my board's probe"]}}}))
    env = dict(os.environ, TFMCU_BOARDS=str(boards))
    tflite, inputs = models["tiny"]
    out = tmp_path / "fw"
    r = subprocess.run([PY, "-m", "pipelines.deploy", f"--tflite={tflite}", f"--inputs={inputs}",
                        "--target=my-m4-board", f"--out_dir={out}", "--run"], cwd=ROOT, capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.load(open(out / "deploy.json"))
    assert rep["target"] == "my-m4-board" and rep["fits"] and rep["run"]["outputs_equal_tflite"]
    assert rep["run"]["arena_used_bytes"] == rep["arena"]["predicted_bytes"]
    assert "RAM (rwx)  : ORIGIN = 0x20000000, LENGTH = 192K" in (out / "board.ld").read_text()
    assert rep["flash_with"] == ["pyocd flash -t my_part firmware.hex   # my board's probe"]
    assert r.stdout.rstrip().endswith(rep["flash_with"][-1])
    broken = tmp_path / "broken.json"
    broken.write_text('{"boards": {"b": {"what": "no core"}}}')
    r = subprocess.run([PY, "-m", "pipelines.deploy", f"--tflite={tflite}", "--target=b",
                        f"--out_dir={tmp_path / 'x'}"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, TFMCU_BOARDS=str(broken)))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "broken.json: board b: a board needs" in lines[0], r.stderr
    assert not (tmp_path / "x").exists()
