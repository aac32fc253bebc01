"""Macros for firmware on QEMU's MPS2 Cortex-M boards: build it for each core, run it under QEMU in a test.

    mps2_firmware(name = "selftest", srcs = [...], deps = [...])
        cc_binary `selftest` (MCU only: target_compatible_with os:none) linked with the harness and mps2.ld,
        plus mcu_binary `selftest_cortex_m4` / `selftest_cortex_m7` (the ELF built for that core through
        the platform transition in //tools/bazel/arm:transition.bzl).

    qemu_firmware_test(name = "selftest_cortex_m4_test", firmware = ":selftest_cortex_m4", core = "cortex_m4",
                       expect = ":selftest_expect.json")
        sh_test: runs the ELF on the core's QEMU board with the instruction-count plugin
        (tools/qemu/run_firmware.py), checks the result line against `expect`.

    model_stage_firmware(name = "model_tiny_per_tensor", model = "tiny_per_tensor", patches = 2)
        a zoo model's patch stage on the C executor, p x p and layer by layer, checked against TF Lite
        (tools/gen/gen_model_stage.py, model_main.c): generator, firmware for both cores, a test per core.

    tflm_model_firmware(name = "tflm_mbv2_035_96_custom", model = "mbv2_035_96", patches = 4)
        a whole zoo model (unpatched, or custom mode with the TFMCU_PATCH_STAGE kernel) in TFLM's MicroInterpreter
        on the MCU (tools/gen/gen_model_whole.py, tflm_patch_kernels/tflm/firmware_main.cc), checked against
        TF Lite's output bytes.

The SRAM budget of each core is passed to the linker (mps2.ld asserts .data + .bss + stack fit) and
printed by the firmware: Cortex-M4 256 KiB (e.g. STM32F412/F429 class), Cortex-M7 320 KiB (STM32F746).
"""

load("//tools/bazel/arm:transition.bzl", "mcu_binary", "platform_files")

CORES = {
    "cortex_m4": struct(
        platform = "//tools/bazel/arm:cortex_m4",
        config = "//tools/bazel/arm:is_cortex_m4",
        machine = "mps2-an386",
        name = "cortex-m4",
        sram_budget = 256 * 1024,
    ),
    "cortex_m7": struct(
        platform = "//tools/bazel/arm:cortex_m7",
        config = "//tools/bazel/arm:is_cortex_m7",
        machine = "mps2-an500",
        name = "cortex-m7",
        sram_budget = 320 * 1024,
    ),
}

_LD = "//tflm_patch_kernels/firmware:mps2.ld"

def core_select(values, default):
    """select() over the cores: {core: value} (keys of CORES), `default` on any other platform."""
    conditions = {CORES[core].config: value for core, value in values.items()}
    conditions["//conditions:default"] = default
    return select(conditions)

def mps2_firmware(name, srcs, deps = [], cores = ("cortex_m4", "cortex_m7"), stack_size = 16 * 1024,
                  sram_budget = {}, copts = [], **kwargs):
    """cc_binary `name` for the MCU plus one mcu_binary `<name>_<core>` per core (see the module docstring).

    Args:
      stack_size: bytes reserved for the stack (counted in the SRAM budget).
      sram_budget: {core: bytes} to override CORES[core].sram_budget.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["//tflm_patch_kernels/firmware:harness"],
        copts = copts,
        additional_linker_inputs = [_LD],
        linkopts = [
            "-T",
            "$(location %s)" % _LD,
            "-Wl,--defsym=TFMCU_STACK_SIZE=%d" % stack_size,
        ] + core_select(
            {
                core: ["-Wl,--defsym=TFMCU_SRAM_BUDGET=%d" % sram_budget.get(core, CORES[core].sram_budget)]
                for core in CORES
            },
            # Another platform: the link stops at mps2.ld's use of the undefined TFMCU_SRAM_BUDGET.
            default = [],
        ),
        target_compatible_with = ["@platforms//os:none"],
        **kwargs
    )
    for core in cores:
        mcu_binary(
            name = "%s_%s" % (name, core),
            binary = ":" + name,
            platform = CORES[core].platform,
            tags = kwargs.get("tags", []),
        )

def qemu_firmware_test(name, firmware, core, expect = None, timeout_s = 50, size = "small", **kwargs):
    """sh_test running `firmware` (an mcu_binary) on the QEMU board of `core` (see the module docstring).

    timeout_s: QEMU's wall-clock limit; keep it below Bazel's for `size` (small 60 s, medium 300 s).
    """
    args = [
        "$(rootpath //tools/qemu:run_firmware.py)",
        "--elf",
        "$(rootpath %s)" % firmware,
        "--machine",
        CORES[core].machine,
        "--plugin",
        "$(rootpath //tools/qemu:libinsn_count.so)",
        "--timeout",
        str(timeout_s),
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

def model_stage_firmware(name, model, patches, blocks = None, cores = ("cortex_m4", "cortex_m7"), timeout_s = 50,
                         size = "small", tags = [], kernels = "//tflm_patch_kernels:patch_kernels", **kwargs):
    """Firmware running zoo `model`'s patch stage on the C executor (model_main.c), p x p and 1 x 1, and its tests.

    Targets: genrule `<name>_gen` (gen_model_stage.py: converts the model with TF, packs both schedules,
    computes TF Lite's stage output), used through platform_files `<name>_src` and `<name>_expect` so that it
    runs once and firmware and test see the same outputs; firmware `<name>` / `<name>_<core>`
    (mps2_firmware); sh_tests `<name>_<core>_test`, which require the firmware's output hashes to equal
    TF Lite's. `blocks`: the patch stage's length (default: the zoo entry's); `tags` go to the firmware and the
    tests (["manual"] keeps a slow model out of `bazel test //...`: `make bench` runs it).
    """
    _generated_firmware(
        name = name,
        tool = "//tools/gen:gen_model_stage",
        args = "--model %s --patches %d%s" % (model, patches, " --blocks %d" % blocks if blocks else ""),
        source = (name + "_stage.c", "--out-c"),
        srcs = ["//tflm_patch_kernels/firmware:model_main.c", "//tflm_patch_kernels/firmware:model_data.h"],
        deps = [kernels],
        cores = cores,
        timeout_s = timeout_s,
        size = size,
        tags = tags,
        **kwargs
    )

def _generated_firmware(name, tool, args, source, srcs, deps, cores, timeout_s, size, tags, copts = [], **kwargs):
    """Generator `tool` (writes `source` = (file, its flag) and `<name>_expect.json`), the firmware per core built
    from `srcs` + that file, and a QEMU test per core checking the result line against the expectation."""
    src, flag = source
    native.genrule(
        name = name + "_gen",
        outs = [src, name + "_expect.json"],
        # TensorFlow's start-up noise goes to a log that is shown only when the generator fails.
        cmd = ("log=$$(mktemp); $(location %s) %s %s $(location %s) --out-expect $(location %s_expect.json) " +
               ">$$log 2>&1 || { cat $$log >&2; rm -f $$log; exit 1; }; rm -f $$log") % (tool, args, flag, src, name),
        tools = [tool],
        # Built only through platform_files (one run for every configuration that uses the outputs).
        tags = ["manual"],
    )
    platform_files(name = name + "_src", srcs = [src], platform = "//tools/bazel/arm:generator_host")
    platform_files(
        name = name + "_expect",
        srcs = [name + "_expect.json"],
        platform = "//tools/bazel/arm:generator_host",
    )
    mps2_firmware(
        name = name,
        srcs = srcs + [":%s_src" % name],
        deps = deps,
        copts = copts,
        cores = cores,
        tags = tags,
        **kwargs
    )
    for core in cores:
        qemu_firmware_test(
            name = "%s_%s_test" % (name, core),
            core = core,
            expect = ":%s_expect" % name,
            firmware = ":%s_%s" % (name, core),
            timeout_s = timeout_s,
            size = size,
            tags = tags,
        )

def tflm_model_firmware(name, model, arena_bytes, patches = None, blocks = None, inplace = False,
                        cores = ("cortex_m4", "cortex_m7"), timeout_s = 50, size = "small", tags = [],
                        sram_budget = {}, **kwargs):
    """A whole zoo model in TFLM on the MCU (see the module docstring): generator, firmware per core, a test per core.

    `patches`: custom mode with a p x p grid (over `blocks`, default the zoo entry's stage; `inplace`: the rest
    planned in place); None: the unpatched model. `arena_bytes`: the tensor arena in RAM (part of the SRAM budget).
    """
    _generated_firmware(
        name = name,
        tool = "//tools/gen:gen_model_whole",
        args = "--model %s%s%s%s" % (
            model,
            " --patches %d" % patches if patches else "",
            " --blocks %d" % blocks if blocks else "",
            " --inplace" if inplace else "",
        ),
        source = (name + "_model.cc", "--out-cc"),
        srcs = ["//tflm_patch_kernels/tflm:firmware_main.cc"],
        deps = [
            "//tflm_patch_kernels/tflm:firmware_runtime",
            "//tflm_patch_kernels/tflm:patch_stage_op",
            "@tflite_micro//:micro",
            "@tflite_micro//:platform_mcu",
        ],
        copts = ["-DTFMCU_ARENA_BYTES=%d" % arena_bytes],
        cores = cores,
        timeout_s = timeout_s,
        size = size,
        tags = tags,
        sram_budget = sram_budget,
        **kwargs
    )
