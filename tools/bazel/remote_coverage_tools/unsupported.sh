#!/usr/bin/env bash
echo "remote_coverage_tools is a local stub: 'bazel coverage' is not supported in this project" >&2
exit 1
