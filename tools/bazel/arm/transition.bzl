"""mcu_binary: builds a cc_binary for a microcontroller platform, from a build for any platform.

    mcu_binary(name = "fw_cortex_m4", binary = ":fw", platform = "//tools/bazel/arm:cortex_m4")

gives `fw_cortex_m4.elf`: the cc_binary `:fw` compiled with the arm-none-eabi toolchain that the platform
selects (toolchain resolution, --incompatible_enable_cc_toolchain_resolution in .bazelrc). An outgoing-edge
transition on `binary` sets --platforms for that dependency only, so a plain `bazel test //...` (host
platform) builds the firmware for the MCU, while host cc_test / py_test targets keep the host toolchain.
An sh_test can take the mcu_binary as data and run the ELF under QEMU.

platform_files(name = "x_c", srcs = [":x_gen"], platform = "//tools/bazel/arm:generator_host") builds
generated files once for every consumer (see its doc).

The firmware cc_binary should carry target_compatible_with = ["@platforms//os:none"]: `bazel build //...`
then skips it as a top-level target on the host (it cannot link there) and builds it only through here.
"""

def _platform_transition_impl(settings, attr):
    _ignore = settings
    return {"//command_line_option:platforms": str(attr.platform)}

_platform_transition = transition(
    implementation = _platform_transition_impl,
    inputs = [],
    outputs = ["//command_line_option:platforms"],
)

def _mcu_binary_impl(ctx):
    # An attribute with a Starlark transition is a list (one entry per configuration of a split).
    binary = ctx.attr.binary[0]
    src = binary[DefaultInfo].files_to_run.executable
    if src == None:
        fail("%s: %s has no executable" % (ctx.label, binary.label))
    out = ctx.actions.declare_file(ctx.label.name + ".elf")
    ctx.actions.symlink(output = out, target_file = src)
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

mcu_binary = rule(
    implementation = _mcu_binary_impl,
    attrs = {
        "binary": attr.label(mandatory = True, cfg = _platform_transition, doc = "a cc_binary"),
        "platform": attr.label(mandatory = True, doc = "e.g. //tools/bazel/arm:cortex_m4"),
        # Bazel 4 only allows Starlark transitions for rules that name this allowlist.
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    doc = "The ELF of `binary` built for `platform` (see the module docstring).",
)

def _platform_files_impl(ctx):
    files = depset(transitive = [src[DefaultInfo].files for src in ctx.attr.srcs])
    return [DefaultInfo(files = files, runfiles = ctx.runfiles(transitive_files = files))]

platform_files = rule(
    implementation = _platform_files_impl,
    attrs = {
        "srcs": attr.label_list(mandatory = True, allow_files = True, cfg = _platform_transition),
        "platform": attr.label(mandatory = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    doc = """The files of `srcs`, built for `platform`, whatever configuration asks for them.

For a generator whose outputs both firmware (cortex_m4, cortex_m7 configurations) and a host test use:
consumed directly, a genrule would run once per configuration, and outputs that are slow to make or not
bit-for-bit repeatable (a TF model conversion) could differ between the firmware and the test that checks
it. With platform = //tools/bazel/arm:generator_host every consumer reaches one configuration, so it runs
once. (Not the host platform itself: from the host, that transition is a no-op and lands in the plain host
configuration, from an MCU configuration in a differently named one; Bazel 4's exec transition keeps such
differences too.) The files are not on the consumer's include path: use them as sources or data.""",
)

# The archiver of the arm-none-eabi toolchain (tools/bazel/arm/cc_toolchain_config.bzl's tool_paths "ar").
_ARM_AR = "/usr/bin/arm-none-eabi-ar"

def _mcu_static_library_impl(ctx):
    library = ctx.attr.library[0]
    archives = []
    for linker_input in library[CcInfo].linking_context.linker_inputs.to_list():
        for lib in linker_input.libraries:
            a = lib.static_library or lib.pic_static_library
            if a != None and a not in archives:
                archives.append(a)
    out = ctx.actions.declare_file(ctx.label.name + ".a")
    script = ctx.actions.declare_file(ctx.label.name + ".mri")
    ctx.actions.write(script, "create %s\n%ssave\nend\n" % (out.path, "".join(["addlib %s\n" % a.path for a in archives])))
    ctx.actions.run_shell(
        inputs = archives + [script],
        outputs = [out],
        command = "%s -M < %s" % (_ARM_AR, script.path),
        mnemonic = "McuStaticLibrary",
        progress_message = "Merging %d archives into %s" % (len(archives), out.short_path),
    )
    return [DefaultInfo(files = depset([out]))]

mcu_static_library = rule(
    implementation = _mcu_static_library_impl,
    attrs = {
        "library": attr.label(mandatory = True, cfg = _platform_transition, providers = [CcInfo],
                              doc = "a cc_library"),
        "platform": attr.label(mandatory = True, doc = "e.g. //tools/bazel/arm:cortex_m4"),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    doc = """`<name>.a`: one static archive holding `library` and every library it depends on, built for `platform`
(what a build system other than Bazel links: the deploy folder's libtfmcu_model with model/tfmcu_model.h). The
members of `alwayslink` libraries become ordinary members: what the application references is linked.""",
)
