"""cc_pch: a precompiled C++ header (GCC's .gch) for the configuration it is built in, for cc_library targets whose
every compile parses the same large headers.

    cc_pch(name = "pch", header = "tflm_pch.h", includes = ["tensorflow/lite/schema/schema_generated.h"],
           copts = COPTS, deps = [":headers"])
    cc_library(name = "lib", srcs = [...], copts = COPTS + ["-include", "tflm_pch.h"], deps = [":headers", ":pch"])

TFLM's sources all include tensorflow/lite/schema/schema_generated.h (25,000 lines of FlatBuffers code): parsing it
is most of each compile (about 7 of 8 s per file with arm-none-eabi-gcc 12), once per file and per core. The rule
compiles `includes` once into `<header>.gch/` with the same compiler, features and flags as a cc_library of this
configuration (the toolchain's, --copt / --cxxopt, `copts`, the defines and include paths of `deps`), and gives the
library the folder holding it. `-include <header>` makes GCC load a .gch before the source (the headers' include
guards then skip them). The `<header>` beside the .gch folder is only an #error: if GCC ever rejects the .gch (flags
that differ), the build fails with that message instead of silently parsing everything again.
"""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _cc_pch_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    deps = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    source = ctx.actions.declare_file("%s_src/%s" % (ctx.label.name, ctx.attr.header))
    guard = ctx.actions.declare_file("%s/%s" % (ctx.label.name, ctx.attr.header))
    ctx.actions.write(source, "".join(['#include "%s"\n' % h for h in ctx.attr.includes]))
    ctx.actions.write(guard, '#error "%s: GCC took none of %s.gch/ (their flags differ from this compile\'s)"\n' % (
        ctx.label,
        ctx.attr.header,
    ))

    # A folder <header>.gch holding one .gch per way the libraries compile (GCC takes the one that matches): the
    # position-independent objects of a host build (the host toolchain's shared libraries and tests) and the plain
    # ones (the MCU's only).
    variants = [False] + ([True] if cc_toolchain.needs_pic_for_dynamic_libraries(
        feature_configuration = features,
    ) else [])
    outputs = []
    for pic in variants:
        gch = ctx.actions.declare_file("%s/%s.gch/%s.gch" % (
            ctx.label.name,
            ctx.attr.header,
            "pic" if pic else "plain",
        ))
        outputs.append(gch)
        variables = cc_common.create_compile_variables(
            feature_configuration = features,
            cc_toolchain = cc_toolchain,
            source_file = source.path,
            output_file = gch.path,
            user_compile_flags = ctx.fragments.cpp.copts + ctx.fragments.cpp.cxxopts + ctx.attr.copts +
                                 ["-x", "c++-header"],
            include_directories = deps.includes,
            quote_include_directories = deps.quote_includes,
            system_include_directories = deps.system_includes,
            preprocessor_defines = deps.defines,
            use_pic = pic,
        )
        ctx.actions.run(
            executable = cc_common.get_tool_for_action(
                feature_configuration = features,
                action_name = ACTION_NAMES.cpp_compile,
            ),
            arguments = cc_common.get_memory_inefficient_command_line(
                feature_configuration = features,
                action_name = ACTION_NAMES.cpp_compile,
                variables = variables,
            ),
            env = cc_common.get_environment_variables(
                feature_configuration = features,
                action_name = ACTION_NAMES.cpp_compile,
                variables = variables,
            ),
            inputs = depset([source], transitive = [deps.headers, cc_toolchain.all_files]),
            outputs = [gch],
            mnemonic = "CppPch",
            progress_message = "Precompiling %s for %s%s" % (ctx.attr.header, ctx.label, " (pic)" if pic else ""),
        )
    return [CcInfo(compilation_context = cc_common.create_compilation_context(
        headers = depset([guard] + outputs),
        quote_includes = depset([guard.dirname]),
    ))]

cc_pch = rule(
    implementation = _cc_pch_impl,
    attrs = {
        "header": attr.string(mandatory = True, doc = "the name the libraries pass to -include"),
        "includes": attr.string_list(mandatory = True, doc = "the headers precompiled, as #include names"),
        "copts": attr.string_list(doc = "the libraries' copts (without the -include)"),
        "deps": attr.label_list(providers = [CcInfo], doc = "where the headers come from"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)
