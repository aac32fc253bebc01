"""CMSIS-NN's buffer needs on Cortex-M4 / M7 (DSP extension, arm-none-eabi-gcc), as TFLM's CMSIS-NN kernels and the
patch executor's CMSIS-NN backend request them, so the TFLM arena of a CMSIS-NN build is known before deployment.

The buffer sizes are CMSIS-NN 4ab83cc's ``*_get_buffer_size_dsp`` functions (``arm_convolve_get_buffer_sizes_s8.c``,
``arm_depthwise_conv_get_buffer_sizes_s8.c``, ``arm_avgpool_get_buffer_sizes_s8.c``) written out for the DSP case
(with GCC, ``arm_convolve_1x1_s8_fast_get_buffer_size_dsp`` is 0: its buffered path is for Arm Compiler 6 only).
``stage_scratch_bytes`` is ``tfmcu_stage_prepare``'s scratch for a build with ``-DTFMCU_CMSIS_NN``
(``tflm_patch_kernels/patch_stage.c``, ``tflm_patch_kernels/cmsis_nn/``): the patch buffers, then the kernel buffer,
the largest need over every layer and patch. The firmware tests check both against the arena TFLM reports
(``tools/gen/gen_model_whole.py --kernels cmsis_nn``: measured == predicted).
"""

from __future__ import annotations

from typing import Any

from tfmcu import abi
from tfmcu.abi import OP_AVG_POOL, OP_CONV, OP_DEPTHWISE, OP_MAX_POOL

# Where the TfmcuSpan fields start in a row of the span tables (input 0's for the per-input fields).
_SPAN = abi.word_offsets("TfmcuSpan")
_OUT_START, _OUT_STOP, _IN_START, _IN_STOP, _PAD_BEFORE = (_SPAN[f] for f in ("out_start", "out_stop", "in_start",
                                                                              "in_stop", "pad_before"))


def align4(n: int) -> int:
    return (n + 3) // 4 * 4


def conv_buffer_bytes(kernel_h: int, kernel_w: int, in_channels: int, padding: tuple[int, int],
                      dilation: tuple[int, int] = (1, 1)) -> int:
    """``arm_convolve_wrapper_s8_get_buffer_size`` (DSP): 0 for a 1x1 convolution (padding 0, dilation 1), else
    arm_convolve_s8's two im2col columns of int16, kernel_h x kernel_w x in_channels rounded up to 4 each (the 1 x N
    path asks the same on DSP cores, so its conditions on the input height and stride do not matter here)."""
    if kernel_h == 1 and kernel_w == 1 and padding == (0, 0) and dilation == (1, 1):
        return 0
    return 2 * align4(kernel_h * kernel_w * in_channels) * 2


def depthwise_buffer_bytes(kernel_h: int, kernel_w: int, in_channels: int, out_channels: int,
                           padding: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> int:
    """``arm_depthwise_conv_wrapper_s8_get_buffer_size`` (DSP): none for the 3x3 kernel with padding <= 1, an int16
    column of kernel_h x kernel_w x channels for arm_depthwise_conv_s8_opt (depth multiplier 1, dilation 1), none for
    the generic kernel."""
    if in_channels != out_channels or dilation != (1, 1):
        return 0
    if kernel_h == 3 and kernel_w == 3 and padding[0] <= 1 and padding[1] <= 1:
        return 0
    return in_channels * kernel_h * kernel_w * 2


def avgpool_buffer_bytes(channels: int) -> int:
    """``arm_avgpool_s8_get_buffer_size`` (DSP): one int32 per channel."""
    return 4 * channels


# ------------------------------------------------------------------------------------------ the patch stage
def _covers(layer: Any) -> bool:
    """What the backend runs through CMSIS-NN (cmsis_nn/*_cmsis_nn.c: *_covers); the rest is portable. Pooling
    tiles of a valid stage always qualify (every window holds an input pixel: tfmcu_cmsis_pool_covers)."""
    p = layer.params
    if layer.type in (OP_AVG_POOL, OP_MAX_POOL):
        return True
    if p.get("dilation_h", 1) != 1 or p.get("dilation_w", 1) != 1:
        return False
    if not (-127 <= p["input_offset"] <= 128 and -128 <= p["output_offset"] <= 127):
        return False
    if layer.type == OP_CONV:
        return p.get("groups", 1) == 1
    return layer.type == OP_DEPTHWISE and p.get("depth_multiplier", 1) == 1


def stage_kernel_scratch_bytes(packed: Any) -> int:
    """The kernel buffer ``tfmcu_stage_prepare`` computes with -DTFMCU_CMSIS_NN for ``packed`` (a
    ``tfmcu.kernels.pack.PackedStage``): max over the window layers (conv, depthwise, pooling) and patches of
    align4(CMSIS-NN's buffer for the tile) + the staging rows of a non-dense input box (kernel_h x box width x
    channels, rounded up to 4)."""
    most = 0
    rows, cols = packed.row_spans, packed.col_spans
    for l, layer in enumerate(packed.layers):
        if layer.type not in (OP_CONV, OP_DEPTHWISE, OP_AVG_POOL, OP_MAX_POOL) or not _covers(layer):
            continue
        p = layer.params
        kernel_h = p["filter_h"] if layer.type in (OP_AVG_POOL, OP_MAX_POOL) else p["kernel_h"]
        t = packed.layer_inputs[l][0]
        full_w = packed.tensor_shapes[t][1]
        channels = packed.tensor_shapes[t][2]
        out_channels = packed.tensor_shapes[packed.layer_outputs[l]][2]
        for i in range(rows.shape[0]):
            r = rows[i, l]
            in_h = int(r[_IN_STOP] - r[_IN_START])
            for j in range(cols.shape[0]):
                c = cols[j, l]
                if r[_OUT_STOP] == r[_OUT_START] or c[_OUT_STOP] == c[_OUT_START]:
                    continue  # a halo cache holds all of it: the layer does not run in this patch
                in_w = int(c[_IN_STOP] - c[_IN_START])
                if t == packed.input_tensor:
                    held_w = full_w
                elif packed.col_held is not None:  # halo caches: the buffer holds the held columns
                    held = packed.col_held[j, packed.tensor_producers[t]]
                    held_w = int(held[1] - held[0])
                else:  # a patch buffer holds what its producer computes for this column band
                    pc = cols[j, packed.tensor_producers[t]]
                    held_w = int(pc[_OUT_STOP] - pc[_OUT_START])
                dense = in_h <= 1 or in_w == held_w
                pad = (int(r[_PAD_BEFORE]), int(c[_PAD_BEFORE]))
                if layer.type == OP_CONV:
                    need = conv_buffer_bytes(p["kernel_h"], p["kernel_w"], channels, (0, 0))
                elif layer.type == OP_DEPTHWISE:
                    need = depthwise_buffer_bytes(p["kernel_h"], p["kernel_w"], channels, out_channels, pad)
                elif layer.type == OP_AVG_POOL:
                    need = avgpool_buffer_bytes(channels)
                else:
                    need = 0
                need = align4(need) + (0 if dense else align4(kernel_h * in_w * channels))
                most = max(most, need)
    return most


def stage_scratch_bytes(packed: Any) -> int:
    """``TfmcuPreparedStage.scratch_bytes`` with -DTFMCU_CMSIS_NN: the patch buffers, then (if any) the kernel
    buffer at the next 4-byte boundary."""
    kernel = stage_kernel_scratch_bytes(packed)
    return align4(packed.scratch_bytes) + kernel if kernel > 0 else packed.scratch_bytes
