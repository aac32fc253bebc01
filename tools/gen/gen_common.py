"""What the firmware generators share: the environment TensorFlow needs, the repository root, and the FNV-1a hash
the firmware prints of its output bytes (tflm_patch_kernels/firmware/harness.h: tfmcu_fnv1a32)."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # run from anywhere, also outside Bazel

from tfmcu.firmware.sources import fnv1a32  # noqa: E402,F401
