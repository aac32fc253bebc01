"""What the firmware generators share: the environment TensorFlow needs, the repository root, and the FNV-1a hash
the firmware prints of its output bytes (tflm_patch_kernels/firmware/harness.h: tfmcu_fnv1a32)."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fnv1a32(data):
    h = 2166136261
    for b in bytes(data):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h
