#!/usr/bin/env bash
# sh_test entry point for firmware tests (tflm_patch_kernels/firmware/firmware.bzl: qemu_firmware_test).
#   firmware_test.sh RUN_FIRMWARE_PY [run_firmware.py args...]
# Runs the firmware under QEMU through tools/qemu/run_firmware.py (standard library only) with the
# system python3, so the test needs neither the venv nor a Python toolchain.
set -euo pipefail
runner=$1
shift
exec python3 "$runner" "$@"
