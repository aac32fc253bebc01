"""Repository rule: a Python toolchain that runs py_binary/py_test with <workspace>/.venv/bin/python3.

The workspace root is computed when the repository is fetched, so no absolute path is committed and
every clone (a developer's, CI's) uses its own .venv, created by `make setup`. Bazel keeps one output
base per workspace path, so two clones never share this generated repository.
"""

def _venv_python_impl(rctx):
    root = str(rctx.path(Label("@//:WORKSPACE")).dirname)
    python = "%s/%s/bin/python3" % (root, rctx.attr.venv)
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD.bazel", """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

py_runtime(
    name = "venv_py3",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "venv_runtime_pair",
    py3_runtime = ":venv_py3",
)

toolchain(
    name = "toolchain",
    toolchain = ":venv_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    attrs = {"venv": attr.string(default = ".venv", doc = "virtualenv folder, relative to the workspace root")},
    local = True,
)
