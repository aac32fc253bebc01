"""Runs one test file with pytest inside a Bazel test (used by tools/bazel/pytest.bzl).

usage: pytest_runner.py TEST_FILE [extra pytest args...]

Writes JUnit XML to $XML_OUTPUT_FILE, so bazel-testlogs/<pkg>/<test>/test.xml has one <testcase> per
pytest test (tools/test_summary.py adds them up). Exits with pytest's code, except that "no tests
collected" (5) is a failure too: a test file that runs nothing should not pass silently.
"""
import os
import sys

# Before anything imports TensorFlow (conftest.py, the test module).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
_tmp = os.environ.get("TEST_TMPDIR")
if _tmp:
    # Bazel gives tests no usable HOME; keep caches in the test's own scratch dir.
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(_tmp, "matplotlib"))
    os.environ.setdefault("HOME", _tmp)

import pytest  # noqa: E402


def main(argv):
    if not argv:
        print("usage: pytest_runner.py TEST_FILE [pytest args...]", file=sys.stderr)
        return 2
    args = [argv[0], "-q", "-rfEs", "-p", "no:cacheprovider"]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append("--junitxml=" + xml)
    # `bazel test --test_filter=EXPR` selects tests with pytest's -k.
    test_filter = os.environ.get("TESTBRIDGE_TEST_ONLY")
    if test_filter:
        args += ["-k", test_filter]
    args += argv[1:]
    code = pytest.main(args)
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("pytest_runner: no tests were collected from %s: failing" % argv[0], file=sys.stderr)
        return 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
