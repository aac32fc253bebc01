# tfmcu — build, test and run. GNU make + bash.
#   make setup   Debian packages, .venv (pinned), Bazel offline repositories (idempotent, fast when done)
#   make test    bazel test //... (every test: Python, C, firmware), then tests/e2e (they call Bazel themselves:
#                deploy --run), then a one-line summary
#   make pytest  the Python tests directly with pytest (quick dev loop)
#   make demo    python -m pipelines.demo
#   make bench   python -m pipelines.bench
#   make docs    the docs' figure tables rendered from the published results (docs/results/), then checked
#   make clean   remove Bazel outputs and out/ (keeps .venv; `make distclean` removes it too)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

VENV   := .venv
PYTHON := $(VENV)/bin/python
BAZEL  ?= bazel

export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: setup test pytest demo bench docs clean distclean

setup:
	@bash tools/setup.sh

# Bazel's exit code is kept; the summary always runs (it also fails on failed tests or none at all).
# The build event file lists exactly this run's tests, so stale test.xml files of deleted tests don't count.
test: setup
	@rc=0; start=$$(date +%s); \
	$(BAZEL) test //... --build_event_json_file=bazel-testlogs-bep.json || rc=$$?; \
	$(PYTHON) -m pytest tests/e2e -q -p no:cacheprovider --junitxml=bazel-testlogs-e2e.xml || { [ $$rc -ne 0 ] || rc=1; }; \
	$(PYTHON) tools/test_summary.py --bep bazel-testlogs-bep.json --junit bazel-testlogs-e2e.xml \
		--started $$start --json out/make_test.json || { [ $$rc -ne 0 ] || rc=1; }; \
	if [ $$rc -eq 4 ]; then echo "make test: bazel found no test targets" >&2; fi; \
	exit $$rc

pytest: setup
	$(PYTHON) -m pytest tests -q

demo: setup
	$(PYTHON) -m pipelines.demo

bench: setup
	$(PYTHON) -m pipelines.bench

# After a measuring run: python -m benchmarks.docs --publish out/bench (or out/demo/summary.json --name demo).
docs: setup
	$(PYTHON) -m benchmarks.docs --write

clean:
	-$(BAZEL) clean 2>/dev/null
	rm -rf out bazel-testlogs-bep.json bazel-testlogs-e2e.xml
	find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	-$(BAZEL) clean --expunge 2>/dev/null
	rm -rf $(VENV) .bazel_local *.egg-info
