"""A `deploy` firmware folder as a plain source tree for CMake and vendor IDEs (STM32CubeIDE, Make), the way TFLM's
``tensorflow/lite/micro/tools/project_generation/create_tflm_tree.py`` exports TFLM (``deploy --tree=DIR``).

``export_tree(folder, dest)`` writes ``dest`` (all-or-nothing: assembled beside it, then renamed into place)::

    CMakeLists.txt        one library per Bazel cc_library the firmware links (same sources, flags, defines, paths),
                          the test firmware, and tfmcu_model / tfmcu_board for an application of your own
    arm-none-eabi.cmake   the toolchain file (arm-none-eabi-gcc from PATH, or -DTFMCU_TOOLCHAIN_PREFIX=...)
    README.txt            how to build and run it, where a camera frame goes
    tree.json             what was exported: the target, the libraries, the archives (url, sha256)
    app/                  the folder's model library (model/: tfmcu_model.h, its implementation, the model and its
                          op resolver), its test firmware (main.cc, test_inputs.cc), example_frame.c, expect.json,
                          deploy.json
    tfmcu/                ours: tflm_patch_kernels/ (the TFMCU_PATCH_STAGE kernel, the C kernels and their CMSIS-NN
                          backend when the model has the op; the harness, startup, board file and linker script)
    tflite-micro/         TFLM: its runtime and the kernels of the model's ops only
    third_party/          flatbuffers (with TFLM's patch), gemmlowp, ruy, and CMSIS-NN for --kernels=cmsis_nn;
                          each with its LICENSE

What goes in is exactly what the Bazel build of the folder links, found the way Bazel finds it: the folder's BUILD
(``:firmware_bin``) is evaluated, and so is every BUILD file its dependencies name (tflm_patch_kernels/**/BUILD; the
third_party/*.BUILD files that WORKSPACE gives the pinned upstream archives, globbed over the archives' contents).
Each cc_library reached keeps its sources, copts, defines and include paths; the compiler and linker flags are those
of the arm-none-eabi toolchain Bazel selects for the folder's platform (tools/bazel/arm/cc_toolchain_config.bzl,
evaluated for its core) and .bazelrc's --conlyopt / --cxxopt. Headers: those the sources include, followed through
the include paths. The upstream sources are read at export time from the archives WORKSPACE declares (its URL's file
name, checked against its sha256) in Bazel's --distdir (``.bazel_local/repos.bazelrc``), ``$TFMCU_THIRD_PARTY`` or
``../shared/third_party``; with the patches WORKSPACE applies (TFLM's flatbuffers.patch). Nothing of them enters
this repository.

BUILD, .bzl and WORKSPACE files are this repository's own; they are read as the Python subset of Starlark they are
written in (unknown rules and functions are recorded or ignored).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from tfmcu.errors import UsageError
from tfmcu.files import write_folder
from tfmcu.firmware.bazel_graph import (MAIN, REPO, TREE_DIRS, ArchiveRepo, BazelGraph, Repo, TreeError, archive_dirs,
                                        find_archive, glob_files, included_headers, unique, workspace_archives)
from tfmcu.firmware.cmake import TOOLCHAIN_FILE, cmake_lists, readme
from tfmcu.firmware.targets import DERIVED_LD, TARGETS, build_linker_script

__all__ = ["TreeError", "archive_dirs", "check_dest", "export_tree", "glob_files"]

MANIFEST = "tree.json"
APP_EXTRA = ("expect.json", "deploy.json", "example_frame.c")  # copied next to the folder's sources


# ---- the export -----------------------------------------------------------------------------------------------------

def check_dest(folder: str, dest: str, what: str = "--tree", third_party: str | None = None) -> None:
    """What ``export_tree(folder, dest)`` needs besides the folder, checked before any work (``deploy --tree``
    validates its flags with it): ``dest`` outside ``folder`` (and not containing it), not a file, empty or an
    earlier tree (it has tree.json: only then is it replaced); the archives WORKSPACE pins found, with their sha256.
    A one-line ``UsageError`` (``what``: the flag that named ``dest``) or ``TreeError`` otherwise."""
    a_dest, a_folder = os.path.abspath(dest), os.path.abspath(folder)
    if a_dest == a_folder or a_dest.startswith(a_folder + os.sep) or a_folder.startswith(a_dest + os.sep):
        raise UsageError(f"{what}={dest}: must lie outside the deploy folder {folder} (and not contain it)")
    if os.path.exists(dest):
        if not os.path.isdir(dest):
            raise UsageError(f"{what}={dest}: exists and is not a folder")
        if os.listdir(dest) and not os.path.isfile(os.path.join(dest, MANIFEST)):
            raise UsageError(f"{what}={dest}: a folder that is neither empty nor a tfmcu tree ({MANIFEST}); "
                             f"not replacing it")
    for name, decl in workspace_archives().items():
        find_archive(name, decl, third_party)


def export_tree(folder: str, dest: str, *, third_party: str | None = None, what: str = "--tree",
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the source tree of the firmware folder ``folder`` (written by ``tfmcu.flows.deploy.prepare``) into
    ``dest`` (see the module docstring); returns tree.json's content. ``third_party``: a folder holding the pinned
    archives (default: see ``archive_dirs``). ``what``: the flag that named ``dest``, for error messages. An existing
    ``dest`` is replaced only if it is empty or an earlier tree (it has tree.json); see ``check_dest``."""
    deploy_json = os.path.join(folder, "deploy.json")
    if not os.path.isfile(deploy_json) or not os.path.isfile(os.path.join(folder, "BUILD")):
        raise UsageError(f"{folder}: not a deploy folder (no deploy.json / BUILD)")
    check_dest(folder, dest, what, third_party)
    with open(deploy_json) as f:
        report = json.load(f)
    t = TARGETS.get(report.get("target", ""))
    if t is None:
        raise UsageError(f"{deploy_json}: unknown target {report.get('target')!r}")
    graph = BazelGraph(folder, third_party)
    try:
        libs, mcu = graph.libraries()
        flags = graph.toolchain_flags(mcu["platform"])
        headers = included_headers(graph, libs)
        files: dict[str, tuple[Repo, str]] = {}
        generated: dict[str, str] = {}  # the genrule-made linker scripts (tflm_patch_kernels/firmware/BUILD)
        for lib in libs:
            for p in lib.srcs + lib.link_inputs:
                name = os.path.basename(p)
                if p == f"{TREE_DIRS[MAIN]}/tflm_patch_kernels/firmware/{name}" and name in DERIVED_LD:
                    generated[p] = build_linker_script(name)
                else:
                    files[p] = _locate(graph, p)
        for p in headers:
            files[p] = _locate(graph, p)
        for name in APP_EXTRA:
            if graph.repos[REPO].has(name):
                files[f"{TREE_DIRS[REPO]}/{name}"] = (graph.repos[REPO], name)
        for name, r in graph.repos.items():
            if isinstance(r, ArchiveRepo):
                for lic in ("LICENSE", "LICENSE.txt", "LICENSE.md"):
                    if r.has(lic):
                        files[f"{r.tree}/{lic}"] = (r, lic)
        manifest = {
            "generated_by": "tfmcu.firmware.tree.export_tree",
            "folder": os.path.abspath(folder),
            "target": t.name,
            "machine": t.machine,
            "kernels": report.get("kernels"),
            "ops": report.get("ops"),
            "arena_bytes": report.get("arena", {}).get("arena_bytes"),
            "archives": {n: {k: v for k, v in a.items() if k != "archive"} for n, a in graph.archives.items()},
            "flags": flags,
            "libraries": {lib.label: {"cmake": lib.cmake_name, "srcs": lib.srcs, "copts": lib.copts,
                                      "defines": unique(lib.defines + lib.local_defines),
                                      "include_dirs": unique(lib.quote_dirs + lib.system_dirs)} for lib in libs},
            "files": len(files) + len(generated) + 4,
        }
        texts = {
            "CMakeLists.txt": cmake_lists(libs, flags, t.name, t.what),
            "arm-none-eabi.cmake": TOOLCHAIN_FILE,
            "README.txt": readme(t.name, t.machine, t.what, report.get("kernels", ""), libs, graph.archives, flags,
                                 stand_in=t.qemu == "stand-in"),
            MANIFEST: json.dumps(manifest, indent=1) + "\n",
        }
        write_folder(dest, {**{p: r.read(rel) for p, (r, rel) in files.items()}, **generated, **texts}, what)
    finally:
        graph.close()
    log(f"tree: wrote {dest}/ ({manifest['files']} files, {sum(len(lib.srcs) for lib in libs)} sources in "
        f"{len(libs)} libraries; build: cmake -S {dest} -B {dest}/build && cmake --build {dest}/build -j2)")
    return manifest


def _locate(graph: BazelGraph, tree_path: str) -> tuple[Repo, str]:
    for name, r in sorted(graph.repos.items(), key=lambda kv: -len(kv[1].tree)):
        if tree_path.startswith(r.tree + "/"):
            rel = tree_path[len(r.tree) + 1:]
            if r.has(rel):
                return r, rel
            break
    raise TreeError(f"{tree_path}: named by a BUILD file but not found")
