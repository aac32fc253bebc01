"""`deploy` without building: the firmware folder (model, op resolver with exactly the model's ops, inputs, BUILD,
expectation, arena from the Cortex-M prediction + margin), one-line errors and no partial folder, the targets table
against firmware.bzl's. Building and running the folders under QEMU (`deploy --run`, which calls Bazel) and the
resolver table against TFLM's header are in tests/e2e/test_deploy_run.py, which `make test` runs after `bazel test`."""
import json
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu.errors import UsageError  # noqa: E402
from tfmcu.firmware import sources  # noqa: E402
from tfmcu.firmware.targets import TARGETS  # noqa: E402
from tfmcu.flows import deploy  # noqa: E402
from tfmcu.graph import ir  # noqa: E402
from tfmcu.graph.from_tflite import from_tflite  # noqa: E402
from tfmcu.nets import zoo  # noqa: E402
from tfmcu.plan import regions  # noqa: E402
from tfmcu.plan.arena import predict_arena  # noqa: E402
from tfmcu.runtime.model_io import model_info  # noqa: E402
from tfmcu.runtime.tflite import run_tflite  # noqa: E402
from tfmcu.stage import custom  # noqa: E402
from tfmcu.tflite import schema as ts  # noqa: E402
from tfmcu.tflite.editor import ModelEditor  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _custom_tiny(zoo_models):
    data = zoo_models("tiny_per_tensor")
    g = from_tflite(data, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    return data, custom.rewrite_custom(data, g, s, "tiny", inplace=True).model


def test_folder_has_model_resolver_inputs_and_expectation(zoo_models, tmp_path):
    data, model = _custom_tiny(zoo_models)
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    out = tmp_path / "fw"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "cortex-m4", str(out), num_inputs=3, seed=4,
                                              kernels="reference"), log=lambda s: 0)
    assert sorted(os.listdir(out)) == ["BUILD", "WORKSPACE", "deploy.json", "example_frame.c", "expect.json",
                                       "main.cc", "model", "test_inputs.cc"]
    # the model library: the API and its implementation as in this checkout, the model data, the sizes
    assert sorted(os.listdir(out / "model")) == ["model_data.cc", "tfmcu_model.cc", "tfmcu_model.h",
                                                 "tfmcu_model_config.h"]
    for name in ("tfmcu_model.cc", "tfmcu_model.h"):
        assert (out / "model" / name).read_text() == open(os.path.join(sources.ROOT, "tflm_patch_kernels", "tflm",
                                                                       name)).read()
    src = (out / "model" / "model_data.cc").read_text()
    assert "g_tfmcu_inputs" not in src  # the test inputs are the test firmware's (test_inputs.cc), not the library's
    # exactly the model's ops: the custom op plus the rest's builtins, nothing else
    adds = re.findall(r"r\.(Add\w+)\(", src)
    assert adds[0] == "AddCustom" and sorted(adds[1:]) == sorted(
        sources.RESOLVER_METHODS[o] for o in rep.ops if o != "TFMCU_PATCH_STAGE")
    assert f"MicroMutableOpResolver<{len(adds)}>" in src
    assert "g_tfmcu_num_inputs = 3;" in (out / "test_inputs.cc").read_text()
    # the arena: the Cortex-M prediction + the margin, 16-byte aligned
    pred = predict_arena(from_tflite(model), model=model, build="cortex-m").total
    assert rep.arena.predicted_bytes == pred
    assert rep.arena.arena_bytes % 16 == 0 and pred * 1.02 <= rep.arena.arena_bytes < pred * 1.02 + 16
    config = (out / "model" / "tfmcu_model_config.h").read_text()
    assert f"#define TFMCU_MODEL_ARENA_BYTES {rep.arena.arena_bytes}u" in config
    assert "#define TFMCU_MODEL_PERSISTENT_BYTES 0u" in config and "#define TFMCU_MODEL_STREAM_ROWS 0u" in config
    x = model_info(model).inputs[0]
    assert f"#define TFMCU_MODEL_INPUT_BYTES {int(np.prod(x.shape))}u" in config
    assert f"#define TFMCU_MODEL_INPUT_SCALE {x.scale!r}f" in config
    assert f"#define TFMCU_MODEL_INPUT_ZERO_POINT {x.zero_point}" in config
    build = (out / "BUILD").read_text()
    assert 'name = "libtfmcu_model"' in build and 'name = "example"' in build and 'name = "model"' in build
    # deploy.json is the report, and reads back into it
    written = json.loads((out / "deploy.json").read_text())
    assert written == rep.to_json() and deploy.DeployReport.from_json(written) == rep
    # the expectation is TF Lite's (original model, same inputs)
    from tfmcu.runtime.model_io import random_inputs
    ref = [o[0] for o in run_tflite(data, random_inputs(data, 3, 4))]
    expect = json.loads((out / "expect.json").read_text())
    assert expect["expect"] == sources.expectation(ref)
    # the example application's frame is the first input, and what it must print TF Lite's output on it
    assert {k: v for k, v in expect["example"].items() if k != "how"} == sources.expectation(ref[:1])
    frame = re.search(r"g_example_frame\[(\d+)\] = \{(.*?)\};", (out / "example_frame.c").read_text(), re.S)
    values = np.array([float(v.rstrip("f")) for v in frame.group(2).replace("\n", "").split(",")], np.float32)
    q = np.round(values / np.float32(x.scale)).astype(np.int32) + x.zero_point
    assert int(frame.group(1)) == values.size and np.array_equal(q, random_inputs(data, 3, 4)[0][0].reshape(-1))


def test_cmsis_nn_kernels_link_cmsis_variants_and_refuse_inplace_plans(zoo_models, tmp_path):
    """--kernels=cmsis_nn (the default): TFLM's CMSIS-NN kernel libraries and our kernel's CMSIS-NN backend, the
    arena predicted for that build; a model planned in place (for the reference kernels' read order) is a one-line
    error that writes nothing."""
    data = zoo_models("tiny_per_tensor")
    g = from_tflite(data, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    disjoint = custom.rewrite_custom(data, g, s, "tiny", inplace=False).model
    path = tmp_path / "m.tflite"
    path.write_bytes(disjoint)
    out = tmp_path / "fw"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "cortex-m7", str(out)), log=lambda s: 0)
    build = (out / "BUILD").read_text()
    assert rep.kernels == "cmsis_nn" and "tflm_patch_kernels/tflm:patch_stage_op_cmsis_nn" in build
    assert "@tflite_micro//:kernel_conv_cmsis_nn" in build and "@tflite_micro//:kernel_conv\"" not in build
    stage = custom.load_custom(disjoint).packed
    pred = predict_arena(from_tflite(disjoint), model=disjoint, build="cortex-m-cmsis-nn", stage=stage)
    assert rep.arena.predicted_bytes == pred.total and not pred.details["unmodelled_ops"]
    # the CMSIS-NN kernel buffer comes on top of the patch buffers
    from tfmcu.plan import cmsis_nn
    assert cmsis_nn.stage_scratch_bytes(stage) > stage.scratch_bytes
    _, inplace = _custom_tiny(zoo_models)
    path.write_bytes(inplace)
    out2 = tmp_path / "fw2"
    with pytest.raises(UsageError) as e:
        deploy.prepare(deploy.DeployOptions(str(path), "cortex-m7", str(out2)), log=lambda s: 0)
    assert "\n" not in str(e.value) and "--kernels=reference" in str(e.value) and str(path) in str(e.value)
    assert not out2.exists()
    with pytest.raises(UsageError, match="--kernels=fast"):
        deploy.validate(deploy.DeployOptions("m.tflite", kernels="fast"))
    with pytest.raises(UsageError, match="--profile measures the firmware under QEMU: give --run too"):
        deploy.validate(deploy.DeployOptions("m.tflite", target="cortex-m4", profile=True))
    with pytest.raises(UsageError, match="--profile: no QEMU board runs the cortex-m0plus of rpi-pico"):
        deploy.validate(deploy.DeployOptions("m.tflite", target="rpi-pico", run=True, profile=True))


@pytest.mark.parametrize("case", ["missing", "garbage", "malformed_options", "unsupported_op"])
def test_bad_input_is_one_line_and_writes_nothing(zoo_models, tmp_path, case):
    _, model = _custom_tiny(zoo_models)
    path = tmp_path / "m.tflite"
    if case == "garbage":
        path.write_bytes(b"not a model" * 10)
    elif case == "malformed_options":
        ed = ModelEditor(model)
        ed.subgraph.operators[0].customOptions = list(b"\x01\x02\x03")
        path.write_bytes(ed.to_bytes())
    elif case == "unsupported_op":
        ed = ModelEditor(model)
        m = ed.model
        code = next(c for c in m.operatorCodes if ts.builtin_code(c) == ts.BuiltinOperator.CUSTOM)
        code.customCode = "MY_OP"
        path.write_bytes(ed.to_bytes())
    out = tmp_path / "fw"
    with pytest.raises(UsageError) as e:
        deploy.prepare(deploy.DeployOptions(str(path), "stm32f405", str(out)), log=lambda s: 0)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    if case == "unsupported_op":
        assert "op 0" in msg and "MY_OP" in msg
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_a_model_that_aborts_the_interpreters_is_one_line(aborting_tflite, tmp_path):
    """TF Lite and TFLM abort() on ``aborting_tflite`` (conftest): deploy runs them in a child process
    (tfmcu.runtime.isolate), so such a model is a one-line error that writes nothing."""
    path = tmp_path / "m.tflite"
    path.write_bytes(aborting_tflite)
    out = tmp_path / "fw"
    with pytest.raises(UsageError, match=r"crashed \(SIGABRT\)") as e:
        deploy.prepare(deploy.DeployOptions(str(path), "cortex-m4", str(out), kernels="reference"), log=lambda s: 0)
    assert "\n" not in str(e.value) and str(path) in str(e.value) and not out.exists()


def _dense_head(int8_tflite) -> bytes:
    """A small int8 model whose classifier is a FULLY_CONNECTED head (where TF Lite and TFLM can round apart)."""
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(i)
    x = L.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    return int8_tflite(keras.Model(i, L.Dense(6)(L.GlobalAveragePooling2D()(x)), name="dense_head"))


@pytest.fixture(scope="module")
def tied(int8_tflite, tmp_path_factory):
    """The dense-head model with a rounding tie built into its head on input 1 of three (tests/support.py:
    tie_in_the_head: TF Lite rounds that output down, TFLM up, whatever the host that converted the model), the
    same model in custom mode (a 2x2 patch stage over its first block), and the three inputs (.npy)."""
    from tests.support import tie_in_the_head
    from tfmcu.runtime.model_io import random_inputs

    root = tmp_path_factory.mktemp("tied")
    data = _dense_head(int8_tflite)
    xs = random_inputs(data, 3, seed=5)
    model = tie_in_the_head(data, xs[1])
    g = from_tflite(model, name="tied")
    paths = {"builtin": root / "tied.tflite", "custom": root / "tied_custom.tflite", "inputs": root / "x.npy"}
    paths["builtin"].write_bytes(model)
    paths["custom"].write_bytes(custom.rewrite_custom(model, g, regions.schedule(g, 2, n_blocks=1), "tied").model)
    np.save(paths["inputs"], np.concatenate([x[0] for x in xs]))
    return {k: str(v) for k, v in paths.items()}, xs


@pytest.mark.parametrize("mode", ["builtin", "custom"])
def test_a_rounding_tie_takes_tflms_output_on_this_host(tied, tmp_path, mode):
    """TF Lite and TFLM round the tied model's head 1 apart on input 1: deploy proves it a tie on the model (its
    head recomputed; a custom-mode model's stage in our C kernels on one side, TFLM built from source with our
    kernel on the other), takes TFLM's output on this host as that input's expectation (what the firmware computes),
    says so in one line and records it in deploy.json; TF Lite's elsewhere (equal to TFLM's)."""
    from tfmcu.runtime.tflm import run_tflm

    paths, xs = tied
    out = tmp_path / "fw"
    lines: list[str] = []
    rep = deploy.prepare(deploy.DeployOptions(paths[mode], "cortex-m4", str(out), inputs=paths["inputs"],
                                              kernels="reference"), log=lines.append)
    original = open(paths["builtin"], "rb").read()
    tfl, tflm = run_tflite(original, xs), run_tflm(original, xs)
    apart = [k for k, (a, b) in enumerate(zip(tfl, tflm)) if not np.array_equal(a[0], b[0])]
    assert 1 in apart  # the tie built in; other inputs meet one only by the converter's floats on this host
    ref = rep.reference
    assert ref.tflm_inputs == apart and ref.tflite_vs_tflm.agree and ref.tflite_vs_tflm.tie_samples == len(apart)
    assert any(t.sample == 1 and t.tflm == t.tflite + 1 for t in ref.tflite_vs_tflm.ties)
    assert ("built from source" in ref.tflm_on_host) == (mode == "custom")
    # the firmware's expectation is TFLM's outputs on every input (TF Lite's where they agree), not TF Lite's
    want = json.loads((out / "expect.json").read_text())
    assert want["expect"] == sources.expectation([o[0] for o in tflm])
    assert want["expect"]["output_fnv1a32"] != sources.expectation([o[0] for o in tfl])["output_fnv1a32"]
    assert want["reference"]["tflm_inputs"] == apart
    said = [s for s in lines if "rounding tie" in s]
    assert len(said) == 1 and f"{len(apart)} of 3 inputs meet a rounding tie in the FULLY_CONNECTED head" in said[0]
    assert "checked against TFLM on this host" in said[0]
    written = json.loads((out / "deploy.json").read_text())
    assert deploy.DeployReport.from_json(written) == rep and written["reference"]["tflm_inputs"] == apart


def test_a_difference_that_is_no_tie_is_one_line(tied, tmp_path):
    """TFLM on this host giving an output that TF Lite does not, other than by a proven rounding tie (planted: TFLM's
    output on input 2 moved by 64, its bit 6 flipped), stops deploy with one line naming the input, exit status 2,
    and nothing is written."""
    from tests.support import run_python

    paths, _ = tied
    out = tmp_path / "fw"
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from tfmcu.flows import deploy\n"
        "real = deploy.evaluate\n"
        "def planted(*args, **kwargs):\n"
        "    run = real(*args, **kwargs)\n"
        "    y = run.tflm[2][0].copy()\n"
        "    y.view(np.uint8).flat[0] ^= 0x40\n"
        "    run.tflm[2][0] = y\n"
        "    return run\n"
        "deploy.evaluate = planted\n"
        "from pipelines import _cli, deploy as cli\n"
        f"sys.argv = ['deploy', '--tflite={paths['builtin']}', '--inputs={paths['inputs']}', '--target=cortex-m4', "
        f"'--out_dir={out}']\n"
        "_cli.run(cli.main)\n")
    r = run_python("-c", script)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deploy: error: ")
    assert "TFLM on this host differs from TF Lite on input 2 (output 0, largest difference 64)" in err[0]
    assert "not by a rounding tie (in the FULLY_CONNECTED head" in err[0]
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_measured_by_names_the_kernels():
    """deploy.json's ``run.measured_by`` names the kernels the firmware ran (--kernels), CMSIS-NN or reference."""
    from tfmcu.firmware.run import measured_by

    t = TARGETS["cortex-m7"]
    cmsis, ref = measured_by(t, "cmsis_nn"), measured_by(t, "reference")
    assert t.machine in cmsis and "CMSIS-NN" in cmsis and "reference" not in cmsis
    assert "reference" in ref and "CMSIS-NN" not in ref


def test_unknown_target_and_flags(monkeypatch):
    with pytest.raises(UsageError, match="--target=esp32: unknown; supported: stm32f405"):
        deploy.validate(deploy.DeployOptions("m.tflite", "esp32"))
    with pytest.raises(UsageError, match="--margin"):
        deploy.validate(deploy.DeployOptions("m.tflite", margin=-1))
    with pytest.raises(UsageError, match="--console=usb: must be one of semihosting, uart"):
        deploy.validate(deploy.DeployOptions("m.tflite", console="usb"))
    import dataclasses

    # (every named board has a console UART: a board added without one)
    monkeypatch.setitem(TARGETS, "my-board", dataclasses.replace(TARGETS["rpi-pico"], name="my-board", console=None))
    with pytest.raises(UsageError, match="--console=uart: my-board's board file has no console UART yet"):
        deploy.validate(deploy.DeployOptions("m.tflite", "my-board", console="uart"))


def test_targets_match_firmware_bzl():
    """Every firmware build of targets.py is firmware.bzl's (QEMU board, platform, board library, linker script,
    external memory), and its own board's SRAM is the budget firmware.bzl gives it."""
    from tfmcu.firmware.targets import BUILDS, BUILDS_BY_NAME

    bzl = open(os.path.join(ROOT, "tflm_patch_kernels", "firmware", "firmware.bzl")).read()
    for b in BUILDS.values():
        block = bzl[bzl.index(f'"{b.key}": struct('):]
        block = block[:block.index("),")]
        machine = f'"{b.machine}"' if b.machine else "None"  # (a core no QEMU board runs: none)
        assert f"machine = {machine}" in block and f'platform = "{b.platform}"' in block
        assert f':{b.board}"' in block and f':{b.ld}"' in block
        # the external memory and whether the QEMU board keeps every model there
        assert (f"psram = 0x{b.psram[0]:08x}" if b.psram else "psram = none") in block.lower(), b.key
        assert ("models_in_psram = True" in block) == b.models_in_psram, b.key
    for name, key in BUILDS_BY_NAME.items():
        t = TARGETS[name]
        assert (t.key, t.own_ld, t.qemu) == (key, False, "board")
        if key != "stm32f405":
            block = bzl[bzl.index(f'"{key}": struct('):]
            assert f"sram_budget = {t.sram_bytes // 1024} * 1024" in block[:block.index("),")]
    ld = open(os.path.join(ROOT, "tflm_patch_kernels", "firmware", "stm32f405.ld")).read()
    assert "RAM (rwx)  : ORIGIN = 0x20000000, LENGTH = 128K" in ld
    assert TARGETS["stm32f405"].sram_bytes == 128 * 1024 and TARGETS["stm32f405"].flash_bytes == 1024 * 1024


def test_every_board_resolves_with_its_memory():
    """boards.json: every board resolves to a firmware build of its core, its firmware RAM is one of its regions,
    its regions do not overlap, and a board with its own memory gets a linker script with exactly its Flash and
    that region (what the link checks); a board whose core is not built for yet is a one-line error naming it."""
    from tfmcu.firmware.targets import BUILDS, UNSUPPORTED, linker_script

    assert len(TARGETS) + len(UNSUPPORTED) >= 10
    build = open(os.path.join(ROOT, "tflm_patch_kernels", "firmware", "BUILD")).read()
    libraries = set(re.findall(r'"(board_\w+)"', build))
    per = re.search(r'name = "board_" \+ t,.*?for t in \(([^)]*)\)', build, re.S)  # the MPS2 boards' libraries
    libraries |= {f"board_{k}" for k in re.findall(r'"(\w+)"', per[1])}
    per = re.search(r'\("board_dwt", t\) for t in \(([^)]*)\)', build)  # the DWT ones of real boards of their cores
    libraries |= {f"board_dwt_{k}" for k in re.findall(r'"(\w+)"', per[1])}
    consoles = re.findall(r'^\s*\("(board_\w+)", "(\w+)", "(\w+)"\),$', build, re.M)  # BOARD_CONSOLES
    assert len(consoles) >= 7
    libraries |= {f"{'board_dwt_' + t if src == 'board_dwt' else src}_{c}" for src, t, c in consoles}
    assert all(f'"{c}": ("console_' in build for _, _, c in consoles)  # each a driver of CONSOLES
    for t in TARGETS.values():
        assert t.board in libraries, t.board  # its board library exists
        assert not t.board_elf or t.board_elf in libraries, t.board_elf
        # a console UART on every named board; on a chip QEMU does not emulate, its ELF's own driver
        assert t.console is not None, t.name
        real = t.board_elf or (t.board if not t.machine else "")
        assert not real or re.search(r"_(stm32|nrf|rp2040|alif)\w+$", real), t.name
        assert t.core == BUILDS[t.key].core and t.ram in t.regions and t.sram_bytes == t.ram.bytes
        spans = sorted((r.base, r.base + r.bytes) for r in (*t.regions, t.flash))
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), t.name
        if t.own_ld:
            ld = linker_script(t)
            assert f"FLASH (rx) : ORIGIN = 0x{t.flash.base:08X}, LENGTH = {t.flash.bytes // 1024}K" in ld
            assert f"RAM (rwx)  : ORIGIN = 0x{t.ram.base:08X}, LENGTH = {t.ram.bytes // 1024}K" in ld
            assert ld.count("MEMORY") == 1 and "SECTIONS" in ld
        # how it goes onto the board: commands naming only the files deploy writes
        assert t.flash_with, t.name
        for c in t.flash_with:
            # ({uf2}: a board whose boot ROM takes UF2 files; deploy writes one for it)
            allowed = {"elf", "bin", "hex"} | ({"uf2"} if t.uf2_family else set())
            assert set(re.findall(r"\{(\w*)\}", c)) <= allowed, c
    for name, core in UNSUPPORTED.items():
        with pytest.raises(UsageError, match=f"--target={name}: its core \\({core}\\) is not supported yet"):
            deploy.validate(deploy.DeployOptions("m.tflite", name))


def test_a_board_folder_links_with_its_memory(zoo_models, tmp_path):
    """A board with its own memory map: the folder has board.ld and links with it; a board QEMU cannot run as it is
    (its Flash where the QEMU board has none) gets a second binary linked for the QEMU board, held to its SRAM. The
    STM32H743's persistent data goes to its DTCM (0x20000000) in the board's link, and in the QEMU board's link to a
    region of the DTCM's size at the end of the RAM, past what the firmware may use."""
    data, model = _custom_tiny(zoo_models)
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    for board, stand_in in (("nucleo-f446re", False), ("nucleo-h743zi", True), ("nrf52840-dk", False)):
        out = tmp_path / board
        deploy.prepare(deploy.DeployOptions(str(path), board, str(out), kernels="reference"), log=lambda s: 0)
        build = (out / "BUILD").read_text()
        assert (out / "board.ld").is_file() and '"$(location :board.ld)"' in build
        # a chip QEMU does not emulate: its ELF with the core's cycle counter (board_dwt), QEMU's with the MPS board's
        real = board != "nucleo-f446re"
        assert ('name = "firmware_qemu"' in build) == real
        assert (f":board_dwt_{TARGETS[board].key}" in build) == real and f":{TARGETS[board].board}" in build
        if stand_in:  # the model's RAM fits the DTCM (fast_ram): the arena there, the persistent data in AXI SRAM
            assert f"TFMCU_SRAM_BUDGET={128 * 1024}" in build
            assert "TFMCU_MODEL_PERSISTENT_BYTES 0u" not in (out / "model" / "tfmcu_model_config.h").read_text()
            assert '"$(location :qemu.ld)"' in build
            board_ld = (out / "board.ld").read_text()
            assert "RAM (rwx)  : ORIGIN = 0x20000000, LENGTH = 128K" in board_ld
            assert "PERSISTENT (rw) : ORIGIN = 0x24000000, LENGTH = 512K" in board_ld
            qemu_ld = (out / "qemu.ld").read_text()
            assert "RAM (rwx)  : ORIGIN = 0x20000000, LENGTH = 3584K" in qemu_ld
            assert "PERSISTENT (rw) : ORIGIN = 0x20380000, LENGTH = 512K" in qemu_ld


def test_the_firmware_ram_goes_to_the_fastest_region_that_holds_it(zoo_models, tmp_path):
    """The Nucleo-H743ZI (boards.json: firmware_ram AXI SRAM, fast_ram DTCM, persistent_ram DTCM): a model whose
    RAM estimate fits the 128 KiB DTCM has its arena there and TFLM's persistent data in the AXI SRAM; one that does
    not (MobileNetV2-0.35-96 per layer, a 205 kB arena) has its arena in the AXI SRAM and the persistent data in the
    DTCM. deploy.json names the regions; a region that is neither is refused."""
    from tfmcu.firmware.targets import linker_script

    t = TARGETS["nucleo-h743zi"]
    fast = t.placed("DTCM")
    assert (fast.firmware_ram, fast.sram_bytes, fast.persistent_ram) == ("DTCM", 128 * 1024, "AXI SRAM")
    assert t.placed("AXI SRAM") is t
    with pytest.raises(ValueError, match="not 'SRAM4'"):
        t.placed("SRAM4")
    assert "RAM (rwx)  : ORIGIN = 0x20000000, LENGTH = 128K" in linker_script(fast)
    _, small = _custom_tiny(zoo_models)
    for name, model, ram, persistent in (("small", small, "DTCM", "AXI SRAM"),
                                         ("large", zoo_models("mbv2_035_96"), "AXI SRAM", "DTCM")):
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(model)
        rep = deploy.prepare(deploy.DeployOptions(str(path), "nucleo-h743zi", str(tmp_path / name),
                                                  kernels="reference"), log=lambda s: 0)
        assert (rep.estimate.region, rep.arena.region, rep.arena.persistent_region) == (ram, ram, persistent), name
        region = next(r for r in t.regions if r.name == ram)
        assert rep.estimate.sram_bytes == region.bytes and rep.estimate.fits
        assert (ram == "DTCM") == (rep.estimate.ram_bytes <= 128 * 1024)
        written = json.loads((tmp_path / name / "deploy.json").read_text())
        assert written["estimate"]["region"] == ram and written["arena"]["persistent_region"] == persistent
        assert f"TFMCU_SRAM_BUDGET={region.bytes}" in (tmp_path / name / "BUILD").read_text()


def test_persistent_data_apart_in_the_boards_region_for_it(zoo_models, tmp_path):
    """On the STM32F405 (boards.json: persistent_ram CCM) TFLM's persistent data goes to a buffer of its own in the
    CCM: the arena is the predicted head + margin, the buffer the tail + margin (the tail with the two buffers'
    allocators instead of the one arena's), the firmware is built with
    -DTFMCU_PERSISTENT_BYTES, and QEMU runs a link with the CCM where netduinoplus2 maps RAM (qemu.ld). Not with
    --nopersistent_apart, nor on a board without such a region."""
    from tfmcu.firmware.targets import linker_script
    from tfmcu.plan.arena import mcu_build, predict_model_arena

    _, model = _custom_tiny(zoo_models)
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    t = TARGETS["stm32f405"]
    assert t.persistent is not None and t.persistent.name == "CCM" and t.persistent.base == 0x10000000
    one = predict_model_arena(model, build=mcu_build("reference"))
    apart = predict_model_arena(model, build=mcu_build("reference"), persistent_apart=True)
    assert apart.head == one.head and 0 < apart.tail - one.tail <= 12 + 16  # (+ alignment of what follows)
    items = apart.details["tail_items"]
    assert {"PersistentArenaBufferAllocator", "NonPersistentArenaBufferAllocator"} <= set(items)
    assert "SingleArenaBufferAllocator" in one.details["tail_items"] and "SingleArenaBufferAllocator" not in items
    out = tmp_path / "apart"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "stm32f405", str(out), kernels="reference"), log=lambda s: 0)
    a = rep.arena
    assert a.persistent_region == "CCM" and a.predicted_bytes == apart.total
    assert (a.predicted_head_bytes, a.predicted_tail_bytes) == (apart.head, apart.tail)
    assert a.arena_bytes == -(-int(apart.head * 1.02) // 16) * 16
    assert a.persistent_bytes == -(-int(apart.tail * 1.02) // 16) * 16
    build = (out / "BUILD").read_text()
    assert f"#define TFMCU_MODEL_PERSISTENT_BYTES {a.persistent_bytes}u" in (out / "model" /
                                                                             "tfmcu_model_config.h").read_text()
    assert 'name = "firmware_qemu"' in build
    qemu_ld = (out / "qemu.ld").read_text()
    assert re.search(r"CCM \(rw\) : ORIGIN = 0x20020000, LENGTH = 64K", qemu_ld)
    assert re.search(r"CCM \(rw\) : ORIGIN = 0x10000000, LENGTH = 64K", linker_script(t))  # the board's own
    expect = json.loads((out / "expect.json").read_text())
    assert expect["expect_within"]["arena_used_bytes"][0] == apart.total
    for board, flags in (("stm32f405", dict(persistent_apart=False)), ("cortex-m4", {})):
        out = tmp_path / f"one-{board}"
        rep = deploy.prepare(deploy.DeployOptions(str(path), board, str(out), kernels="reference", **flags),
                             log=lambda s: 0)
        assert rep.arena.persistent_bytes is None and rep.arena.predicted_bytes == one.total
        assert "PERSISTENT" not in (out / "BUILD").read_text() and not (out / "qemu.ld").exists()


def test_expectation_hash_matches_the_firmware_hash():
    outs = [np.array([1, -2, 3], np.int8), np.array([5, 4, -1], np.int8)]
    e = sources.expectation(outs)
    assert e["top_class"] == [2, 0]
    assert e["output_fnv1a32"] == "0x%08x" % sources.fnv1a32(b"\x01\xfe\x03\x05\x04\xff")
    assert sources.fnv1a32(b"") == 2166136261


def test_resolver_host_runner_and_compiled_kernels_agree():
    """deploy's resolver table, the host runner's AddOps and the TFLM kernel libraries third_party/tflite_micro.BUILD
    compiles name the same builtin ops: a model deploy accepts also runs in `verify`, and links (a kernel missing
    from the BUILD would fail the host runner's link, which every TFLM test builds; deploy links the libraries of
    its model's ops only, tests/e2e/test_deploy_run.py)."""
    runner = open(os.path.join(ROOT, "tflm_patch_kernels", "tflm", "host_runner.cc")).read()
    body = runner[runner.index("void AddOps(Resolver* r) {"):]
    body = body[:body.index("\n}\n")]
    adds = re.findall(r"r->(Add\w+)\(\)", body)
    assert sorted(adds) == sorted(sources.RESOLVER_METHODS.values()) and len(set(adds)) == len(adds)
    kmax = int(re.search(r"constexpr int kMaxOps = (\d+);", runner).group(1))
    assert kmax >= len(adds) + 1
    table = sources.kernel_table()  # third_party/tflite_micro.BUILD's TFLM_KERNELS
    ops = [op for lib_ops, _ in table.values() for op in lib_ops]
    assert sorted(ops) == sorted(sources.RESOLVER_METHODS) and len(set(ops)) == len(ops)
    files = [f for _, fs in table.values() for f in fs]
    assert len(set(files)) == len(files)  # a file in two libraries would be linked twice
    assert sources.kernel_libraries(["CONV_2D", "MEAN", "SUM", "custom:TFMCU_PATCH_STAGE"]) == [
        "@tflite_micro//:kernel_conv", "@tflite_micro//:kernel_reduce"]


# ============================================================================= every model rewrite writes (issue 23)
def _rewrites(zoo_models):
    """tiny_per_tensor 2x2 in custom mode: input streamed, and the rest's convolutions by our kernels (several
    TFMCU_PATCH_STAGE ops)."""
    data = zoo_models("tiny_per_tensor")
    g = from_tflite(data, name="tiny")
    s = regions.schedule(g, 2, n_blocks=zoo.ZOO["tiny_per_tensor"].patch_blocks)
    plain = custom.rewrite_custom(data, g, s, "tiny").model
    return data, {"streamed": custom.rewrite_custom(data, g, s, "tiny", streamed_input=True).model,
                  "rest_convs": custom.convs_to_flash(plain, "tiny").model}


def test_streamed_model_folder_feeds_image_rows(zoo_models, tmp_path):
    """A streamed-input model: the test inputs are images (seeded as the original's would be), model_data.cc sets
    g_tfmcu_stream_rows so that firmware_main.cc feeds their rows from Flash, and the expectation is TF Lite's
    outputs of the original on those images, with every row read once per input. TFLM on this host (the host
    runner's checked provider) agreed, or prepare would have refused."""
    from tfmcu.runtime.model_io import random_inputs

    data, models = _rewrites(zoo_models)
    path = tmp_path / "m.tflite"
    path.write_bytes(models["streamed"])
    out = tmp_path / "fw"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "cortex-m4", str(out), num_inputs=2, seed=3,
                                              kernels="reference"), log=lambda s: 0)
    src = (out / "model" / "model_data.cc").read_text()
    assert 'extern "C" const unsigned int g_tfmcu_stream_rows = 48u;' in src
    inputs_src = (out / "test_inputs.cc").read_text()
    assert "g_tfmcu_input_len = 6912;" in inputs_src and "g_tfmcu_num_inputs = 2;" in inputs_src  # 48x48x3 images
    config = (out / "model" / "tfmcu_model_config.h").read_text()
    assert "#define TFMCU_MODEL_STREAM_ROWS 48u" in config and "#define TFMCU_MODEL_INPUT_ROW_BYTES 144u" in config
    assert rep.streamed_input.image_rows == 48 and rep.streamed_input.rows_read == [48, 48]
    ref = [o[0] for o in run_tflite(data, random_inputs(data, 2, 3))]
    expect = json.loads((out / "expect.json").read_text())["expect"]
    assert expect == {**sources.expectation(ref), "streamed_rows_read": [48, 48]}
    assert rep.arena.host_measured_bytes > 0
    # a model that does not stream defines no rows (model_runtime.cc's weak 0)
    assert "g_tfmcu_stream_rows" not in sources.model_source(data, np.zeros((1, 48, 48, 3), np.int8), 10, "x")


@pytest.mark.parametrize("kernels", ["reference", "cmsis_nn"])
def test_several_patch_stage_ops_register_once(zoo_models, tmp_path, kernels):
    """rewrite --rest_convs=tfmcu: several TFMCU_PATCH_STAGE ops, one AddCustom; the arena is predicted with each
    op's own stage (for CMSIS-NN, each one's kernel buffer), and the expectation is the original's TF Lite outputs."""
    from tfmcu.runtime.model_io import random_inputs

    data, models = _rewrites(zoo_models)
    model = models["rest_convs"]
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    out = tmp_path / "fw"
    rep = deploy.prepare(deploy.DeployOptions(str(path), "cortex-m7", str(out), kernels=kernels), log=lambda s: 0)
    src = (out / "model" / "model_data.cc").read_text()
    adds = re.findall(r"r\.(Add\w+)\(", src)
    assert adds.count("AddCustom") == 1 and len(adds) == len(set(adds)) == len(rep.ops)
    assert rep.patch_stage_ops > 1 and "g_tfmcu_stream_rows" not in src
    stages = custom.load_custom(model, all_stages=True).stages
    assert len(stages) == rep.patch_stage_ops
    build = "cortex-m-cmsis-nn" if kernels == "cmsis_nn" else "cortex-m"
    pred = predict_arena(from_tflite(model), model=model, build=build,
                         stage=stages if kernels == "cmsis_nn" else None)
    assert rep.arena.predicted_bytes == pred.total and not pred.details["unmodelled_ops"]
    ref = [o[0] for o in run_tflite(data, random_inputs(data, 2, 0))]
    assert json.loads((out / "expect.json").read_text())["expect"] == sources.expectation(ref)


def test_inplace_plan_only_with_the_kernels_it_was_planned_for(zoo_models, tmp_path):
    """An in-place plan holds for the kernels it was derived for (the schedule record's memory_plan_kernels,
    "reference" when absent): deploy takes it with those kernels and refuses any other in one line naming both."""
    from tfmcu.stage.common import SCHEDULE_METADATA, read_schedule

    _, inplace = _custom_tiny(zoo_models)  # planned for the reference kernels (no memory_plan_kernels: reference)
    ed = ModelEditor(inplace)
    ed.set_metadata(SCHEDULE_METADATA, json.dumps({**read_schedule(inplace), "memory_plan_kernels": "cmsis_nn"})
                    .encode())
    for model, planned in ((inplace, "reference"), (ed.to_bytes(), "cmsis_nn")):
        path = tmp_path / f"{planned}.tflite"
        path.write_bytes(model)
        other = "reference" if planned == "cmsis_nn" else "cmsis_nn"
        out = tmp_path / f"fw_{other}"
        with pytest.raises(UsageError) as e:
            deploy.prepare(deploy.DeployOptions(str(path), "cortex-m4", str(out), kernels=other), log=lambda s: 0)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and not out.exists()
        assert f"in place for --kernels={planned}" in msg and f"not hold for --kernels={other}" in msg
    # with the kernels it was planned for: written (the record's kernels are what deploy checks; the plan's
    # overlaps themselves are the rewrite's business)
    rep = deploy.prepare(deploy.DeployOptions(str(tmp_path / "cmsis_nn.tflite"), "cortex-m4", str(tmp_path / "ok"),
                                              kernels="cmsis_nn", num_inputs=1), log=lambda s: 0)
    assert rep.kernels == "cmsis_nn" and (tmp_path / "ok" / "BUILD").exists()
    # ... but not on a core with Helium: CMSIS-NN's MVE code reads in other orders than the DSP code's it was
    # derived from
    with pytest.raises(UsageError) as e:
        deploy.prepare(deploy.DeployOptions(str(tmp_path / "cmsis_nn.tflite"), "cortex-m55", str(tmp_path / "m55"),
                                            kernels="cmsis_nn", num_inputs=1), log=lambda s: 0)
    assert "\n" not in str(e.value) and "Helium" in str(e.value) and not (tmp_path / "m55").exists()
    # a plan made for the Helium code (memory_plan_helium: rewrite --core=cortex-m55) goes there, and not to a DSP core
    ed = ModelEditor(inplace)
    ed.set_metadata(SCHEDULE_METADATA, json.dumps({**read_schedule(inplace), "memory_plan_kernels": "cmsis_nn",
                                                   "memory_plan_helium": True}).encode())
    (tmp_path / "helium.tflite").write_bytes(ed.to_bytes())
    rep = deploy.prepare(deploy.DeployOptions(str(tmp_path / "helium.tflite"), "cortex-m55", str(tmp_path / "h55"),
                                              kernels="cmsis_nn", num_inputs=1), log=lambda s: 0)
    assert rep.kernels == "cmsis_nn" and (tmp_path / "h55" / "BUILD").exists()
    with pytest.raises(UsageError, match="in place for CMSIS-NN's Helium code .* does not hold on the cortex-m4"):
        deploy.prepare(deploy.DeployOptions(str(tmp_path / "helium.tflite"), "cortex-m4", str(tmp_path / "h4"),
                                            kernels="cmsis_nn", num_inputs=1), log=lambda s: 0)


def test_cmsis_nn_buffers_by_core_of_pooling_and_fully_connected():
    """TFLM's CMSIS-NN AVERAGE_POOL_2D asks for one int32 per channel on a DSP core, none in plain C (the Cortex-M3)
    or with Helium; its FULLY_CONNECTED into [N, K] for one int32 per output channel with Helium only (MLPerf Tiny's
    ResNet-8: its arena on the M3 and the M55 measured 16 B apart from the M4's)."""
    from tfmcu.plan.arena import op_allocations

    t = {"x": ir.Tensor("x", (1, 8, 8, 64)), "p": ir.Tensor("p", (1, 1, 1, 64)), "f": ir.Tensor("f", (1, 64)),
         "y": ir.Tensor("y", (1, 10))}
    pool = ir.Op("pool", ir.AVG_POOL, ["x"], ["p"], kernel=(8, 8), stride=(8, 8), in_channels=64, out_channels=64,
                 attrs={"tflite_op": "AVERAGE_POOL_2D"})
    fc = ir.Op("fc", ir.FULLY_CONNECTED, ["f"], ["y"], in_channels=64, out_channels=10,
               attrs={"tflite_op": "FULLY_CONNECTED"})
    g = ir.Graph("g", t, [pool, fc], ["x"], ["y"])
    assert op_allocations(g, pool, "cortex-m-cmsis-nn").scratch == [4 * 64]
    assert op_allocations(g, pool, "cortex-m-cmsis-nn-nodsp").scratch == []
    assert op_allocations(g, pool, "cortex-m-cmsis-nn-mve").scratch == []
    assert op_allocations(g, fc, "cortex-m-cmsis-nn").scratch == []
    assert op_allocations(g, fc, "cortex-m-cmsis-nn-mve").scratch == [4 * 10]


def test_cmsis_nn_on_a_core_with_helium_is_priced_with_its_mve_buffers(zoo_models):
    """The Cortex-M55's CMSIS-NN build (``mcu_build(kernels, core)``): its MVE buffers (a 3x3 depthwise takes
    arm_depthwise_conv_s8_opt's four 124-channel blocks there, none on a DSP core; average pooling none), and fit
    plans the rest in place for the core's read orders (CMSIS-NN's Helium code there)."""
    from tfmcu.flows import fit
    from tfmcu.plan.arena import mcu_build, op_allocations

    assert mcu_build("cmsis_nn", "cortex-m55") == "cortex-m-cmsis-nn-mve"
    assert mcu_build("cmsis_nn", "cortex-m4") == mcu_build("cmsis_nn") == "cortex-m-cmsis-nn"
    assert mcu_build("reference", "cortex-m55") == "cortex-m"
    # a core without the DSP extension: CMSIS-NN's plain C buffers (average pooling none)
    assert mcu_build("cmsis_nn", "cortex-m3") == "cortex-m-cmsis-nn-nodsp"
    g = from_tflite(zoo_models("mbv2_035_96"), name="mbv2")
    dw = next(op for op in g.ops if op.type == ir.DEPTHWISE and tuple(op.kernel) == (3, 3) and op.padding[0] <= 1)
    assert op_allocations(g, dw, "cortex-m-cmsis-nn").scratch == []
    assert op_allocations(g, dw, "cortex-m-cmsis-nn-mve").scratch == [4 * 124 * 9]
    conv = next(op for op in g.ops if op.type == ir.CONV and tuple(op.kernel) == (3, 3))
    col = 9 * g.tensors[conv.inputs[0]].shape[-1]
    assert op_allocations(g, conv, "cortex-m-cmsis-nn").scratch == [2 * 2 * (-(-col // 4) * 4)]
    assert op_allocations(g, conv, "cortex-m-cmsis-nn-mve").scratch == [4 * (-(-col // 16) * 16)]
    for target, kernels in (("cortex-m55", "cmsis_nn"), ("cortex-m55", "reference"), ("cortex-m4", "cmsis_nn")):
        o = fit.FitOptions(model="m.tflite", firmware=deploy.DeployOptions(tflite="", target=target, kernels=kernels))
        assert {(c.inplace, c.core) for c in fit.configurations(o, target)} == {(True, target)}, (target, kernels)
    # the rewrite records the Helium read orders when it plans in place for CMSIS-NN on such a core
    from tfmcu.stage.custom import plan_record
    assert plan_record(True, "cmsis_nn", "cortex-m55") == {"memory_plan": "inplace", "memory_plan_kernels": "cmsis_nn",
                                                           "memory_plan_helium": True}
    assert "memory_plan_helium" not in plan_record(True, "cmsis_nn", "cortex-m7")
    assert "memory_plan_helium" not in plan_record(False, "cmsis_nn", "cortex-m55")
    assert "memory_plan_helium" not in plan_record(True, "reference", "cortex-m55")


def test_model_beyond_flash_goes_to_external_memory():
    """A model larger than the target's Flash (estimated: model + inputs + the code's upper estimate): on the MPS2
    boards it goes to their PSRAM (-DTFMCU_MODEL_IN_PSRAM, the board's PSRAM origin), with a note; the STM32F405
    board has no external memory: it does not fit, said plainly."""
    m4, stm = TARGETS["cortex-m4"], TARGETS["stm32f405"]
    small = deploy.flash_estimate(m4, 100_000, 10_000)
    assert small.model_in == "flash" and small.fits and small.note is None
    assert "external_memory" not in small.to_json()
    big = deploy.flash_estimate(m4, 5_000_000, 30_000)
    assert big.model_in == "external" and big.fits and "external memory" in big.note
    assert big.to_json()["external_memory"] == {"origin": "0x21000000", "bytes": 16 * 1024 * 1024}
    huge = deploy.flash_estimate(m4, 20_000_000, 30_000)
    assert huge.model_in == "external" and not huge.fits and "does not fit either" in huge.note
    no = deploy.flash_estimate(stm, 1_000_000, 10_000)
    assert no.model_in == "flash" and not no.fits and "no external memory" in no.note
    build = sources.build_file(TARGETS["cortex-m7"], 1024, 4096, ["CONV_2D"], "reference", external=True)
    assert '"-DTFMCU_MODEL_IN_PSRAM"' in build and f"TFMCU_PSRAM_ORIGIN={0x60000000}" in build
    assert "PSRAM" not in sources.build_file(m4, 1024, 4096, ["CONV_2D"], "reference")
    with pytest.raises(UsageError, match="no external memory"):
        sources.build_file(stm, 1024, 4096, ["CONV_2D"], "reference", external=True)
    # the origins are firmware.bzl's (the Bazel macros' table of the same boards)
    bzl = open(os.path.join(ROOT, "tflm_patch_kernels", "firmware", "firmware.bzl")).read()
    for t in TARGETS.values():
        block = bzl[bzl.index(f'"{t.key}": struct('):]
        block = block[:block.index("),")]
        ext = sources.EXTERNAL_MEMORY.get(t.key)
        assert (f"psram = 0x{ext[0]:08x}" if ext else "psram = none") in block.lower(), t.key


@pytest.mark.parametrize("margin", [0.0, 0.02, 0.1])
def test_the_largest_prediction_a_room_takes_is_allocated_within_it(margin):
    """fit's budgets (``largest_prediction``: the arena's room, the persistent region's) and deploy's buffers
    (``allocated_bytes``) are the same rule: what fit admits, deploy allocates within the room, 16 bytes aligned."""
    for room in range(1024, 300_000, 997):
        p = deploy.largest_prediction(room, margin)
        assert deploy.allocated_bytes(p, margin) <= room
        assert deploy.allocated_bytes(p, margin) % 16 == 0
        assert room - deploy.allocated_bytes(p, margin) <= 32 * (1 + margin) + 16  # and little of it left over


def test_uf2_blocks_and_the_rp2040_boot2_checksum():
    """The files a Raspberry Pi Pico takes: UF2 blocks (512 bytes: the magic words, the flags with the family ID
    present, the address of each 256-byte payload, block number and count, the family) and the CRC its boot ROM
    checks over the second stage (CRC-32/MPEG-2: its check value on "123456789" is 0x0376E6E7)."""
    import struct

    from tfmcu.firmware.outputs import boot2_crc, uf2_bytes

    assert boot2_crc(b"123456789") == 0x0376E6E7 and boot2_crc(b"") == 0xFFFFFFFF
    image = bytes(range(256)) * 2 + b"\x5a" * 10  # 3 blocks, the last one padded
    data = uf2_bytes(image, 0x10000000, 0xE48BFF56)
    assert len(data) == 3 * 512
    got = b""
    for n in range(3):
        block = data[512 * n:512 * (n + 1)]
        m0, m1, flags, addr, size, no, count, family = struct.unpack("<8I", block[:32])
        assert (m0, m1, struct.unpack("<I", block[-4:])[0]) == (0x0A324655, 0x9E5D5157, 0x0AB16F30)
        assert flags == 0x2000 and addr == 0x10000000 + 256 * n and size == 256 and (no, count) == (n, 3)
        assert family == 0xE48BFF56
        got += block[32:32 + size]
    assert got[:len(image)] == image and got[len(image):] == b"\0" * (3 * 256 - len(image))
