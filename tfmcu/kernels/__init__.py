"""The C patch kernels from Python: quantization math, the per-op table, stage packing, C code generation, and the
ctypes binding (``tflm_patch_kernels/``)."""

from tfmcu.errors import TfmcuError


class PatchKernelError(TfmcuError):
    """The op or stage cannot run on the C patch kernels, or the C library cannot be built; one line."""
