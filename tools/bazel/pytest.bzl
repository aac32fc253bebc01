"""pytest_files: one py_test per test file, each running that file through pytest (tools/pytest_runner.py)."""

def pytest_files(srcs, deps = [], data = [], env = {}, size = "medium", timeout = "long", tags = [], **kwargs):
    """Declares py_test `<file without .py>` for each file in srcs (typically glob(["test_*.py"])).

    The runner writes pytest's JUnit XML to $XML_OUTPUT_FILE (bazel-testlogs/.../test.xml), which
    tools/test_summary.py sums up.
    """
    test_env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "MPLBACKEND": "Agg"}
    test_env.update(env)
    for src in srcs:
        native.py_test(
            name = src[:-len(".py")],
            srcs = [src, "//tools:pytest_runner.py"],
            main = "//tools:pytest_runner.py",
            args = ["$(location %s)" % src],
            deps = deps,
            # The lock file is an input so that a change of pinned packages re-runs the tests.
            data = data + ["//:pyproject.toml", "//tools:requirements.lock"],
            env = test_env,
            python_version = "PY3",
            srcs_version = "PY3",
            size = size,
            timeout = timeout,
            tags = tags + ["pytest"],
            **kwargs
        )
