"""Macros for firmware on QEMU's Cortex-M boards (TARGETS: MPS2 Cortex-M3, M4, M7 and M33, MPS3 Cortex-M55,
STM32F405; the Cortex-M0+ is built and linked only): build it for each target, run it under QEMU in a test.

    mcu_firmware(name = "selftest", srcs = [...], deps = [...], targets = ("cortex_m4", "stm32f405"))
        per target a cc_binary `selftest_<target>_bin` (MCU only: target_compatible_with os:none) linked with the
        harness, the board file and the target's linker script, and mcu_binary `selftest_<target>` (the ELF built
        for the target's platform through the transition in //tools/bazel/arm:transition.bzl).

    qemu_firmware_test(name = "selftest_cortex_m4_test", firmware = ":selftest_cortex_m4", target = "cortex_m4",
                       expect = ":selftest_expect.json")
        sh_test: runs the ELF on the target's QEMU board with the instruction-count plugin
        (tools/qemu/run_firmware.py), checks the result line against `expect`.

    model_stage_firmware(name = "model_tiny_per_tensor", model = "tiny_per_tensor", patches = 2)
        a zoo model's patch stage on the C executor, p x p and layer by layer, checked against TF Lite
        (tools/gen/gen_model_stage.py, model_main.c): generator, firmware per target, a test per target.

    tflm_model_firmware(name = "tflm_mbv2_035_96_custom", model = "mbv2_035_96", patches = 4)
        a whole zoo model (unpatched, or custom mode with the TFMCU_PATCH_STAGE kernel) in TFLM's MicroInterpreter
        on the MCU (tools/gen/gen_model_whole.py, tflm_patch_kernels/tflm/firmware_main.cc), checked against
        TF Lite's output bytes.

The SRAM budget of each MPS2 target is passed to the linker (mps2.ld asserts .data + .bss + stack fit) and printed
by the firmware: Cortex-M4 256 KiB (e.g. STM32F412/F429 class), Cortex-M7 320 KiB (STM32F746). The STM32F405's
linker script has the chip's memory (1 MiB Flash; 128 KiB SRAM for the stack, .data and .bss; the 64 KiB CCM only for
a `.ccm` section, which QEMU does not emulate).
"""

load("//tools/bazel/arm:transition.bzl", "mcu_binary", "platform_files")

# The targets firmware is built for. `platform` picks the compiler flags (the core), `board` the harness's timer and
# name, `ld` the memory map; `sram_budget` (MPS2 only: QEMU maps 4 MiB there) is what mps2.ld enforces, while
# stm32f405.ld has the chip's real memory (1 MiB Flash, 128 KiB SRAM + 64 KiB CCM). The STM32F405 firmware shares
# the Cortex-M4 platform, so TFLM is compiled once for both. `psram`: the MPS2 boards' 16 MiB PSRAM (QEMU's
# `info mtree`), where mps2.ld puts a model built with -DTFMCU_MODEL_IN_PSRAM.
TARGETS = {
    "cortex_m3": struct(
        platform = "//tools/bazel/arm:cortex_m3",
        board = "//tflm_patch_kernels/firmware:board_cortex_m3",
        ld = "//tflm_patch_kernels/firmware:mps2.ld",
        machine = "mps2-an385",
        name = "cortex-m3",
        psram = 0x21000000,
        sram_budget = 128 * 1024,
    ),
    "cortex_m4": struct(
        platform = "//tools/bazel/arm:cortex_m4",
        board = "//tflm_patch_kernels/firmware:board_cortex_m4",
        ld = "//tflm_patch_kernels/firmware:mps2.ld",
        machine = "mps2-an386",
        name = "cortex-m4",
        psram = 0x21000000,
        sram_budget = 256 * 1024,
    ),
    "cortex_m7": struct(
        platform = "//tools/bazel/arm:cortex_m7",
        board = "//tflm_patch_kernels/firmware:board_cortex_m7",
        ld = "//tflm_patch_kernels/firmware:mps2.ld",
        machine = "mps2-an500",
        name = "cortex-m7",
        psram = 0x60000000,
        sram_budget = 320 * 1024,
    ),
    # Armv8-M: QEMU's mps2-an505 boots secure; code SRAM at 0x10000000, data SRAM at 0x38000000 and its
    # peripherals at their secure aliases (tfmcu.firmware.targets.DERIVED_LD, board_mps2.c); its 16 MiB at
    # 0x80000000 stand for the PSRAM.
    "cortex_m33": struct(
        platform = "//tools/bazel/arm:cortex_m33",
        board = "//tflm_patch_kernels/firmware:board_cortex_m33",
        ld = "//tflm_patch_kernels/firmware:mps2_an505.ld",
        machine = "mps2-an505",
        name = "cortex-m33",
        psram = 0x80000000,
        sram_budget = 256 * 1024,
        peripherals = {"TIMER0": 0x50000000, "UART0": 0x50200000, "TICKS_HZ": 20000000},
    ),
    # Armv8.1-M with Helium: QEMU's mps3-an547 boots secure from its 512 KiB ITCM (0x10000000, the secure alias: the
    # code memory); data in its 4 MiB of internal SRAM (ISRAM0/1 at 0x31000000: nothing is mapped just below, so a
    # stack overflow faults); its 8 MiB QSPI at 0x38000000 stands for the PSRAM; no CMSDK timer: the FPGA IO counter.
    "cortex_m55": struct(
        platform = "//tools/bazel/arm:cortex_m55",
        board = "//tflm_patch_kernels/firmware:board_cortex_m55",
        ld = "//tflm_patch_kernels/firmware:mps3_an547.ld",
        machine = "mps3-an547",
        name = "cortex-m55",
        psram = 0x38000000,
        sram_budget = 512 * 1024,
        peripherals = {"COUNTER": 0x59302018, "UART0": 0x59303000, "TICKS_HZ": 32000000},
        models_in_psram = True,  # (the ITCM holds the code; a zoo model's array goes to the PSRAM)
    ),
    # Armv6-M: no QEMU board has the core with enough memory; built and linked (`bazel test //...` builds its
    # selftest), never run. The RP2040's memory: its QSPI Flash at 0x10000000 and 256 KiB of SRAM (boards.json).
    "cortex_m0plus": struct(
        platform = "//tools/bazel/arm:cortex_m0plus",
        board = "//tflm_patch_kernels/firmware:board_cortex_m0plus",
        ld = "//tflm_patch_kernels/firmware:mps2.ld",
        machine = None,
        name = "cortex-m0plus",
        psram = None,
        sram_budget = 256 * 1024,
    ),
    "stm32f405": struct(
        platform = "//tools/bazel/arm:cortex_m4",
        board = "//tflm_patch_kernels/firmware:board_stm32f405",
        ld = "//tflm_patch_kernels/firmware:stm32f405.ld",
        machine = "netduinoplus2",
        name = "stm32f405",
        psram = None,
        sram_budget = None,
    ),
}

MPS2 = ("cortex_m4", "cortex_m7")

# -DTFMCU_MODEL_IN_PSRAM on the targets whose code memory holds only the code (TARGETS' models_in_psram)
_MODEL_IN_PSRAM = select(dict(
    [("//tools/bazel/arm:is_%s" % t, ["-DTFMCU_MODEL_IN_PSRAM"]) for t in TARGETS
     if getattr(TARGETS[t], "models_in_psram", False)] + [("//conditions:default", [])],
))

# The harness per console (tflm_patch_kernels/firmware/BUILD).
_HARNESS = {
    "semihosting": "//tflm_patch_kernels/firmware:harness",
    "uart": "//tflm_patch_kernels/firmware:harness_uart",
}

def mcu_firmware(name, srcs, deps = [], targets = MPS2, stack_size = 16 * 1024, sram_budget = {}, copts = [],
                 console = "semihosting", board = None, **kwargs):
    """Per target t (keys of TARGETS): a cc_binary `<name>_<t>_bin` linked with the harness, the board and the
    target's linker script, and mcu_binary `<name>_<t>` (its ELF built for the target's platform).

    Args:
      stack_size: bytes reserved for the stack (counted in the SRAM budget).
      sram_budget: {target: bytes} to override TARGETS[t].sram_budget (MPS2 targets only).
      console: "semihosting" (QEMU's stdout; the exit status is QEMU's) or "uart" (the board's console UART,
        semihosting off: what a board without a debugger runs; run it with qemu_firmware_test(console = "uart")).
      board: a board library other than the target's (e.g. board_stm32f405_usart2: its console on USART2).
    """
    tags = kwargs.pop("tags", [])
    for t in targets:
        target = TARGETS[t]
        budget = sram_budget.get(t, target.sram_budget)
        native.cc_binary(
            name = "%s_%s_bin" % (name, t),
            srcs = srcs,
            deps = deps + [_HARNESS[console], board or target.board],
            copts = copts,
            additional_linker_inputs = [target.ld],
            linkopts = [
                "-T",
                "$(location %s)" % target.ld,
                "-Wl,--defsym=TFMCU_STACK_SIZE=%d" % stack_size,
            ] + (["-Wl,--defsym=TFMCU_SRAM_BUDGET=%d" % budget] if budget else []) +
            (["-Wl,--defsym=TFMCU_PSRAM_ORIGIN=%d" % target.psram] if target.psram else []),
            target_compatible_with = ["@platforms//os:none"],
            tags = tags,
            **kwargs
        )
        mcu_binary(
            name = "%s_%s" % (name, t),
            binary = ":%s_%s_bin" % (name, t),
            platform = target.platform,
            tags = tags,
        )

def qemu_firmware_test(name, firmware, target, expect = None, timeout_s = 50, size = "small",
                       console = "semihosting", serial = 0, **kwargs):
    """sh_test running `firmware` (an mcu_binary) on the QEMU board of `target` (see the module docstring).

    timeout_s: QEMU's wall-clock limit; keep it below Bazel's for `size` (small 60 s, medium 300 s).
    console: the firmware's (mcu_firmware): "uart" runs QEMU with semihosting off and the board's UART as output.
    serial: with console "uart", which of the QEMU board's serial ports is that UART (netduinoplus2: USART1 is 0,
      USART2 is 1).
    """
    args = [
        "$(rootpath //tools/qemu:run_firmware.py)",
        "--elf",
        "$(rootpath %s)" % firmware,
        "--machine",
        TARGETS[target].machine,
        "--plugin",
        "$(rootpath //tools/qemu:libinsn_count.so)",
        "--timeout",
        str(timeout_s),
        "--console",
        console,
        "--console-serial",
        str(serial),
    ]
    data = [firmware, "//tools/qemu:run_firmware.py", "//tools/qemu:libinsn_count.so"]
    if expect:
        args += ["--expect", "$(rootpath %s)" % expect]
        data.append(expect)
    native.sh_test(
        name = name,
        srcs = ["//tools/qemu:firmware_test.sh"],
        args = args,
        data = data,
        size = size,
        **kwargs
    )

def model_stage_firmware(name, model, patches, blocks = None, targets = MPS2, timeout_s = 50,
                         size = "small", tags = [], kernels = "//tflm_patch_kernels:patch_kernels", **kwargs):
    """Firmware running zoo `model`'s patch stage on the C executor (model_main.c), p x p and 1 x 1, and its tests.

    Targets: genrule `<name>_gen` (gen_model_stage.py: converts the model with TF, packs both schedules,
    computes TF Lite's stage output), used through platform_files `<name>_src` and `<name>_expect` so that it
    runs once and firmware and test see the same outputs; firmware `<name>_<target>` (mcu_firmware); sh_tests
    `<name>_<target>_test`, which require the firmware's output hashes to equal
    TF Lite's. `blocks`: the patch stage's length (default: the zoo entry's); `tags` go to the firmware and the
    tests (["manual"] keeps a slow model out of `bazel test //...`: `make bench` runs it).
    """
    _generated_firmware(
        name = name,
        tool = "//tools/gen:gen_model_stage",
        model = model,
        args = "--model %s --patches %d%s" % (model, patches, " --blocks %d" % blocks if blocks else ""),
        source = (name + "_stage.c", "--out-c"),
        srcs = ["//tflm_patch_kernels/firmware:model_main.c", "//tflm_patch_kernels/firmware:model_data.h"],
        deps = [kernels],
        targets = targets,
        timeout_s = timeout_s,
        size = size,
        tags = tags,
        **kwargs
    )

# The zoo models the generators read, each converted once (zoo_tflite; tflm_patch_kernels/firmware/BUILD).
ZOO_TFLITE = "//tflm_patch_kernels/firmware:zoo_%s.tflite"

def zoo_tflite(model):
    """`zoo_<model>.tflite`: the zoo model's int8 .tflite (tools/gen/gen_zoo_model.py), which every generator of a
    firmware of that model reads (--tflite) instead of converting it again."""
    native.genrule(
        name = "zoo_" + model,
        outs = ["zoo_%s.tflite" % model],
        cmd = ("log=$$(mktemp); $(location //tools/gen:gen_zoo_model) --model %s --out $@ >$$log 2>&1 || " +
               "{ cat $$log >&2; rm -f $$log; exit 1; }; rm -f $$log") % model,
        tools = ["//tools/gen:gen_zoo_model"],
        # Built only through the generators (platform_files: one conversion for every configuration).
        tags = ["manual"],
    )

def _generated_firmware(name, tool, args, source, srcs, deps, targets, timeout_s, size, tags, copts = [],
                        model = None, **kwargs):
    """Generator `tool` (writes `source` = (file, its flag) and `<name>_expect.json`; with `model`, reads that zoo
    model's .tflite: ZOO_TFLITE), the firmware per target built from `srcs` + that file, and a QEMU test per target
    checking the result line against the expectation."""
    src, flag = source
    zoo = [ZOO_TFLITE % model] if model else []
    if model:
        args += " --tflite $(location %s)" % zoo[0]
    native.genrule(
        name = name + "_gen",
        srcs = zoo,
        outs = [src, name + "_expect.json"],
        # TensorFlow's start-up noise goes to a log that is shown only when the generator fails.
        cmd = ("log=$$(mktemp); $(location %s) %s %s $(location %s) --out-expect $(location %s_expect.json) " +
               ">$$log 2>&1 || { cat $$log >&2; rm -f $$log; exit 1; }; rm -f $$log") % (tool, args, flag, src, name),
        tools = [tool],
        # Built only through platform_files (one run for every configuration that uses the outputs).
        tags = ["manual"],
    )
    # `tags` here too: `bazel test //...` builds every target that is not manual, and these two run the generator.
    platform_files(name = name + "_src", srcs = [src], platform = "//tools/bazel/arm:generator_host", tags = tags)
    platform_files(
        name = name + "_expect",
        srcs = [name + "_expect.json"],
        platform = "//tools/bazel/arm:generator_host",
        tags = tags,
    )
    mcu_firmware(
        name = name,
        srcs = srcs + [":%s_src" % name],
        deps = deps,
        copts = copts,
        targets = targets,
        tags = tags,
        **kwargs
    )
    for t in [t for t in targets if TARGETS[t].machine]:  # (a core no QEMU board runs: built only)
        qemu_firmware_test(
            name = "%s_%s_test" % (name, t),
            target = t,
            expect = ":%s_expect" % name,
            firmware = ":%s_%s" % (name, t),
            timeout_s = timeout_s,
            size = size,
            tags = tags,
        )

# The TFLM kernel libraries (third_party/tflite_micro.BUILD's TFLM_KERNELS names) a zoo model's firmware links, as
# deploy links its model's: the few its ops need, not all of TFLM's (each kernel file is a compile per core; a model
# not named here, e.g. the bench's, links them all).
# gen_model_whole checks them against the model's ops (tfmcu.firmware.sources.kernel_libraries).
MODEL_KERNELS = {
    "mbv2_035_96": ["add", "conv", "depthwise_conv", "fully_connected", "reduce"],
    "mbv3_small_100_128": ["add", "conv", "depthwise_conv", "hard_swish", "mul", "reduce", "reshape"],
    "tiny_per_tensor": ["add", "conv", "depthwise_conv", "fully_connected", "reduce"],
}

def tflm_model_firmware(name, model, arena_bytes, patches = None, blocks = None, inplace = False, images = None,
                        fits = True, targets = MPS2, timeout_s = 50, size = "small", tags = [], sram_budget = {},
                        model_in_psram = False, tflm_kernels = "reference", stage_of = None, reference = "tflite",
                        streamed_input = False, halo = "none", rest_convs = False, core = None, **kwargs):
    """A whole zoo model in TFLM on the MCU (see the module docstring): generator, firmware per target, a test per
    target.

    `patches`: custom mode with a p x p grid (over `blocks`, default the zoo entry's stage; `inplace`: the rest
    planned in place); None: the unpatched model. `arena_bytes`: the tensor arena in RAM (part of the SRAM budget).
    `images`: "fashion_mnist:N" runs N real test images (default: one seeded random input). `fits = False`: the test
    requires AllocateTensors to fail, with the figure (a model whose per-layer arena the target cannot hold).
    `stage_of`: an unpatched model measures the ops a stage_of x stage_of schedule (over `blocks`) would patch as the
    cost region "stage" (patched models always measure their TFMCU_PATCH_STAGE op).
    `reference`: "tflite" (the outputs must be TF Lite's, the tflite-micro wheel's on a rounding tie in the
    FULLY_CONNECTED head proven on the model) or "tflm" (the wheel's, for a model on which TFLM itself differs from
    TF Lite; gen_model_whole records both).
    `halo`: custom mode with halo caches ("all", "auto" or "smallest"); `rest_convs`: the convolutions after the stage run by
    our kernels, their multipliers in Flash.
    `streamed_input`: custom mode whose stage streams its input: the firmware feeds the image rows from Flash
    through the kernel's TfmcuInputProvider (no image in the arena).
    `model_in_psram`: the model array in the MPS2 boards' PSRAM instead of their 4 MiB code memory (mps2.ld); on a
    target with `models_in_psram` (the Cortex-M55's 512 KiB ITCM) always.
    `tflm_kernels`: "reference" (TFLM's reference kernels and the portable patch kernels) or "cmsis_nn" (TFLM's
    CMSIS-NN variant where it has one, and the patch executor's CMSIS-NN backend).
    `core`: the core of `targets` where the expectation differs by core (the Cortex-M55's CMSIS-NN buffers).
    """
    if tflm_kernels not in ("reference", "cmsis_nn"):
        fail("tflm_kernels must be reference or cmsis_nn, not %s" % tflm_kernels)
    # A model not in MODEL_KERNELS (the bench's) links every kernel.
    kernel_libs = ["@tflite_micro//:kernel_%s%s" % (k, "_for_cmsis_nn" if tflm_kernels == "cmsis_nn" else "")
                   for k in MODEL_KERNELS[model]] if model in MODEL_KERNELS else [
        "@tflite_micro//:micro" if tflm_kernels == "reference" else "@tflite_micro//:micro_cmsis_nn",
    ]
    _generated_firmware(
        name = name,
        tool = "//tools/gen:gen_model_whole",
        model = model,
        args = "--model %s%s%s%s%s%s%s%s%s%s%s%s%s%s" % (
            model,
            " --kernel-libs %s" % ",".join(MODEL_KERNELS[model]) if model in MODEL_KERNELS else "",
            " --core %s" % core if core else "",
            " --stream" if streamed_input else "",
            " --halo %s" % halo if halo != "none" else "",
            " --rest-convs" if rest_convs else "",
            " --patches %d" % patches if patches else "",
            " --blocks %d" % blocks if blocks else "",
            " --stage-of %d" % stage_of if stage_of and not patches else "",
            " --inplace" if inplace else "",
            " --images %s" % images if images else "",
            "" if fits else " --expect-no-fit",
            " --kernels %s" % tflm_kernels,
            " --reference %s" % reference if reference != "tflite" else "",
        ),
        source = (name + "_model.cc", "--out-cc"),
        srcs = [
            "//tflm_patch_kernels/tflm:firmware_main.cc",
            "//tflm_patch_kernels/tflm:tfmcu_model.cc",
            "//tflm_patch_kernels/tflm:tfmcu_model.h",
        ],
        deps = [
            "//tflm_patch_kernels/tflm:model_runtime",
            "//tflm_patch_kernels/tflm:patch_stage_op" if tflm_kernels == "reference" else
            "//tflm_patch_kernels/tflm:patch_stage_op_cmsis_nn",
            "@tflite_micro//:runtime",
            "@tflite_micro//:platform_mcu",
        ] + kernel_libs,
        copts = ["-DTFMCU_MODEL_CONFIG_FROM_FLAGS", "-DTFMCU_MODEL_ARENA_BYTES=%d" % arena_bytes] + (["-DTFMCU_MODEL_IN_PSRAM"] if model_in_psram else
                                                            _MODEL_IN_PSRAM),
        targets = targets,
        timeout_s = timeout_s,
        size = size,
        tags = tags,
        sram_budget = sram_budget,
        **kwargs
    )
