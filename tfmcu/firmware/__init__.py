"""Firmware for microcontrollers: the targets (memory, QEMU board, Bazel platform), the C++ sources of a whole model
in TFLM (model array, op resolver with exactly the model's ops, inputs), and building and running it under QEMU."""
