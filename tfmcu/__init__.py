"""tfmcu: patch-based inference (MCUNetV2) for TensorFlow Lite for Microcontrollers."""

__version__ = "0.1.0"
