"""cc_toolchain_config for Debian's arm-none-eabi GCC 12 (bare-metal Cortex-M, newlib-nano).

One config per core (cortex_m0plus, cortex_m3, cortex_m4, cortex_m7, cortex_m33, cortex_m55); tools/bazel/arm/BUILD
instantiates them and registers them as toolchains that platforms //tools/bazel/arm:cortex_m4 / :cortex_m7 / ...
select (toolchain resolution).

Firmware is always built optimised (-O2, plus -g, which does not change the code), whatever the
compilation mode, so that instruction counts measured under QEMU mean the same in every build.
"""

load(
    "@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl",
    "feature",
    "flag_group",
    "flag_set",
    "tool_path",
)
load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")

_GCC_VERSION = "12.2.1"

# Where arm-none-eabi-gcc looks for system headers (`arm-none-eabi-gcc -E -Wp,-v -`). Bazel checks every
# header a compile reports in its .d file against these. GCC reports system headers canonicalized unless
# told otherwise; /usr/lib/arm-none-eabi/include is a symlink (via /etc/alternatives) to
# /usr/include/newlib, so both spellings are listed.
_BUILTIN_INCLUDES = [
    "/usr/lib/gcc/arm-none-eabi/%s/include" % _GCC_VERSION,
    "/usr/lib/gcc/arm-none-eabi/%s/include-fixed" % _GCC_VERSION,
    "/usr/lib/arm-none-eabi/include",
    "/usr/include/newlib",
]

# -mcpu / FPU flags per core: M3 has no FPU (soft-float ABI), M4F a single-precision FPv4, M7 (as in STM32F7/H7 and
# QEMU's mps2-an500) a double-precision FPv5 (hard-float ABI for both).
CPU_FLAGS = {
    "cortex_m0plus": ["-mcpu=cortex-m0plus", "-mthumb", "-mfloat-abi=soft"],
    "cortex_m3": ["-mcpu=cortex-m3", "-mthumb", "-mfloat-abi=soft"],
    "cortex_m4": ["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"],
    "cortex_m7": ["-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard"],
    # Armv8-M mainline with the DSP extension and a single-precision FPv5 (STM32U5, nRF5340, QEMU's mps2-an505)
    "cortex_m33": ["-mcpu=cortex-m33", "-mthumb", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard"],
    # Armv8.1-M mainline with Helium (MVE, integer and float: __ARM_FEATURE_MVE, which turns on CMSIS-NN's MVE code)
    # and a double-precision FPv5 (Alif Ensemble, STM32N6, QEMU's mps3-an547); newlib's closest multilib is
    # v8-m.main+dp/hard (the same calling convention)
    "cortex_m55": ["-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"],
}

_ALL_COMPILE = [
    ACTION_NAMES.assemble,
    ACTION_NAMES.preprocess_assemble,
    ACTION_NAMES.c_compile,
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]
_CXX_COMPILE = [
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]
_ALL_LINK = [
    ACTION_NAMES.cpp_link_executable,
    ACTION_NAMES.cpp_link_dynamic_library,
    ACTION_NAMES.cpp_link_nodeps_dynamic_library,
]

def _flags(actions, flags):
    return flag_set(actions = actions, flag_groups = [flag_group(flags = flags)])

def _impl(ctx):
    cpu = CPU_FLAGS[ctx.attr.core]
    tool_paths = [
        tool_path(name = "gcc", path = "/usr/bin/arm-none-eabi-gcc"),
        tool_path(name = "cpp", path = "/usr/bin/arm-none-eabi-cpp"),
        tool_path(name = "ld", path = "/usr/bin/arm-none-eabi-ld"),
        tool_path(name = "ar", path = "/usr/bin/arm-none-eabi-ar"),
        tool_path(name = "nm", path = "/usr/bin/arm-none-eabi-nm"),
        tool_path(name = "objcopy", path = "/usr/bin/arm-none-eabi-objcopy"),
        tool_path(name = "objdump", path = "/usr/bin/arm-none-eabi-objdump"),
        tool_path(name = "strip", path = "/usr/bin/arm-none-eabi-strip"),
        tool_path(name = "gcov", path = "/bin/false"),
        tool_path(name = "dwp", path = "/bin/false"),
    ]

    features = [
        feature(
            name = "mcu_compile_flags",
            enabled = True,
            flag_sets = [
                _flags(_ALL_COMPILE, cpu + [
                    "-O2",
                    "-g",
                    "-ffunction-sections",
                    "-fdata-sections",
                    "-fno-common",
                    "-Wall",
                    "-Wextra",
                    # Keep system-header paths as spelled (see _BUILTIN_INCLUDES) and builds reproducible.
                    "-no-canonical-prefixes",
                    "-fno-canonical-system-headers",
                    "-Wno-builtin-macro-redefined",
                    "-D__DATE__=\"redacted\"",
                    "-D__TIMESTAMP__=\"redacted\"",
                    "-D__TIME__=\"redacted\"",
                ]),
                # Pointer/integer mix-ups are errors (GCC 14 makes them so): on a 32-bit target they
                # silently compile into wrong constants, e.g. NULL in an int32_t field.
                _flags([ACTION_NAMES.c_compile], [
                    "-Werror=int-conversion",
                    "-Werror=incompatible-pointer-types",
                    "-Werror=implicit-function-declaration",
                ]),
                _flags(_CXX_COMPILE, ["-fno-exceptions", "-fno-rtti", "-fno-threadsafe-statics"]),
            ],
        ),
        feature(
            name = "mcu_link_flags",
            enabled = True,
            flag_sets = [
                # The firmware brings its own startup code, vector table and linker script
                # (tflm_patch_kernels/firmware); newlib-nano supplies memcpy & co.
                _flags(_ALL_LINK, cpu + [
                    "-no-canonical-prefixes",
                    "-nostartfiles",
                    "--specs=nano.specs",
                    "-Wl,--gc-sections",
                    "-Wl,--no-warn-rwx-segments",
                ]),
            ],
        ),
        # After the objects and libraries on the link line (features come after Bazel's own
        # libraries_to_link): the C runtime, resolved in one group.
        feature(
            name = "mcu_link_libs",
            enabled = True,
            flag_sets = [
                _flags(_ALL_LINK, ["-Wl,--start-group", "-lc_nano", "-lm", "-lgcc", "-Wl,--end-group"]),
            ],
        ),
        # Bazel's compilation modes exist, but change nothing (see the module docstring).
        feature(name = "opt"),
        feature(name = "dbg"),
        feature(name = "fastbuild"),
    ]

    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        features = features,
        cxx_builtin_include_directories = _BUILTIN_INCLUDES,
        toolchain_identifier = "arm-none-eabi-" + ctx.attr.core,
        host_system_name = "x86_64-linux-gnu",
        target_system_name = "arm-none-eabi",
        target_cpu = ctx.attr.core,
        target_libc = "newlib",
        compiler = "gcc",
        abi_version = "eabi",
        abi_libc_version = "newlib",
        tool_paths = tool_paths,
    )

arm_none_eabi_toolchain_config = rule(
    implementation = _impl,
    attrs = {"core": attr.string(mandatory = True, values = CPU_FLAGS.keys())},
    provides = [CcToolchainConfigInfo],
)
