"""CMSIS-NN's buffer needs on Cortex-M4 / M7 (DSP extension, arm-none-eabi-gcc), as TFLM's CMSIS-NN kernels and the
patch executor's CMSIS-NN backend request them, so the TFLM arena of a CMSIS-NN build is known before deployment.

The buffer sizes are CMSIS-NN 4ab83cc's ``*_get_buffer_size_dsp`` functions (``arm_convolve_get_buffer_sizes_s8.c``,
``arm_depthwise_conv_get_buffer_sizes_s8.c``, ``arm_avgpool_get_buffer_sizes_s8.c``) written out for the DSP case
(with GCC, ``arm_convolve_1x1_s8_fast_get_buffer_size_dsp`` is 0: its buffered path is for Arm Compiler 6 only).
``stage_scratch_bytes`` is ``tfmcu_stage_prepare``'s scratch for a build with ``-DTFMCU_CMSIS_NN``
(``tflm_patch_kernels/patch_stage.c``, ``tflm_patch_kernels/cmsis_nn/``): the patch buffers, then the kernel buffer,
the largest need over every layer and patch. The firmware tests check both against the arena TFLM reports
(``tools/gen/gen_model_whole.py --kernels cmsis_nn``: measured == predicted).

``conv_path`` / ``depthwise_path`` are CMSIS-NN's dispatch (``arm_convolve_wrapper_s8``,
``arm_depthwise_conv_wrapper_s8``) on a DSP core without MVE (Cortex-M4 / M7, ``__ARM_FEATURE_DSP``): the buffer
sizes above and the processing orders below follow them. ``processing_order`` states, for each kernel path that runs
in a CMSIS-NN build, in which step every output byte is written and in which step every input byte is read last
(``tfmcu.plan.memory_plan`` turns that into in-place distances). The steps, read from CMSIS-NN 4ab83cc's DSP code:

* ``arm_convolve_s8`` (im2col, every conv that is not 1x1; the 1 x N path is arm_convolve_s8 on DSP cores): two
  output pixels per step. Each pixel's whole window (in-image taps, every channel) is copied into the int16 column
  buffer, and after the second column ``arm_nn_mat_mult_kernel_s8_s16`` writes both pixels' every channel; an odd
  last pixel is its own step.
* ``arm_convolve_1x1_s8_fast`` (1x1, stride 1, no padding; GCC: the unbuffered path) is one
  ``arm_nn_mat_mult_nt_t_s8`` over all pixels, whose DSP loop runs output channels in pairs OUTSIDE the pixels: the
  pass for channels (2q, 2q + 1) reads every input pixel (two at a time) and writes those two channels of each; an odd
  last channel is a last pass, pixel by pixel. Every pass reads the whole input again, so nothing written before the
  last pass may touch it. ``arm_convolve_1x1_s8`` (strided) does the same per output row.
* ``arm_depthwise_conv_3x3_s8`` (3x3, padding <= 1, depth multiplier 1): per output pixel, per group of four
  channels (then each leftover channel), the in-image taps of those channels are read, then the four outputs
  written.
* ``arm_depthwise_conv_s8_opt`` (other depth-multiplier-1 kernels): per output pixel the whole window into the
  column buffer, then every channel written.
* ``arm_depthwise_conv_s8`` (depth multiplier > 1): per output pixel, per input channel, per tile of four outputs
  (multiplier % 4 == 0) or per output channel: that channel's window read, then the tile written.
* ``arm_avgpool_s8``: per output pixel, the window summed into the int32 buffer, then every channel written.
  ``arm_max_pool_s8`` uses the output as its accumulator: a pixel's output is copied from its first in-image tap
  (memcpy) and updated at every later tap, channel by channel (one step per tap and channel).
* ``arm_elementwise_add_s8``, ``arm_elementwise_mul_s8``: four elements of each input read, then those four
  written; then one by one.

With ``mve`` (Helium, ``ARM_MATH_MVEI``: Cortex-M55) the dispatch and the orders are those of CMSIS-NN 4ab83cc's MVE
code. The wrappers differ: ``arm_convolve_wrapper_s8`` takes ``arm_convolve_1_x_n_s8`` for an input of height 1 with a
one-row kernel and stride x channels a multiple of 4 (its MVE body; it falls back to arm_convolve_s8 when its left,
unpadded and right output sections do not add up to the output width, and fails when the left padding is not half
the total); ``arm_depthwise_conv_wrapper_s8`` runs one input channel into several as a convolution
(``arm_depthwise_conv_to_conv_s8``: the transposed filter through arm_convolve_wrapper_s8; GCC's threshold is one
output channel) and every other depth-multiplier-1 kernel, 3x3 too, as ``arm_depthwise_conv_s8_opt``. The steps:

* ``arm_nn_mat_mult_nt_t_s8`` (MVE), the product of every convolution path: the rows (pixels) OUTSIDE, four at a
  time: per output channel the four rows are read whole (tail-predicated ``vldrb.8``: no byte past a row), then that
  channel of the four written (``vstrbq_scatter_offset_s32``), so the four rows' last read is at the last channel;
  then each leftover row alone, per group of four output channels the row read again and the four written
  (``vstrbq_s32``), the last group (a tail of 1 to 3 channels is written after the loop) being the row's last read.
* ``arm_convolve_s8``: four output pixels per step. Each window (in-image taps, every channel; ``arm_memcpy_s8``) is
  copied into the int8 buffer of four columns and the product over the four (or, at the end, over the one to three
  left) reads only the buffer: a step reads the windows of its pixels, then writes them.
* ``arm_convolve_1_x_n_s8``: step 0 copies the first kernel_w pixels (with the left padding) into the buffer and
  writes the left-padded outputs from it; the unpadded outputs are one product straight on the input (rows = output
  pixels, stride x channels apart); the last step copies the right-padded outputs' in-image pixels and writes them.
  (The right copy runs even without right-padded outputs; nothing uses it then.) It copies kernel_w - 1 pixels from
  the first right-padded window's start, which with a stride above 1 can reach past the input where padding belongs
  (stride 2: an even right padding); the result then depends on the bytes after the input: not modelled (None).
* ``arm_convolve_1x1_s8_fast``: one product over every pixel; ``arm_convolve_1x1_s8`` (strided): one per output
  row, on the input pixels (y x stride_h, x x stride_w).
* ``arm_depthwise_conv_s8_opt``: channel blocks of CH_IN_BLOCK_MVE (124) OUTSIDE the pixels. Per block, each output
  pixel's window (those channels) is copied into the buffer; after four pixels ``arm_nn_depthwise_conv_nt_t_s8``
  writes them from the buffer; the one to three left are written from it at the end of the block. So a step reads
  four windows of one block and writes those four pixels' channels of the block; a later block re-reads the input.
* ``arm_depthwise_conv_s8`` (depth multiplier > 1, more than one input channel): the DSP order (``vstrbq_s32``
  writes the tile of four that the DSP code writes byte by byte).
* ``arm_avgpool_s8``: per output pixel, per block of 16 channels (the last one tail-predicated), the block's window
  summed, then those channels written. ``arm_max_pool_s8``: as on DSP cores, with ``arm_memcpy_s8`` and
  ``compare_and_replace_if_larger_q7`` working 16 channels at a time (one step per pixel, tap and block of 16).
* ``arm_elementwise_add_s8``, ``arm_elementwise_mul_s8``: four elements of each input read, then those four written;
  the tail (1 to 3) likewise.

The MVE loads of the input are tail-predicated or exact (no read past a window or a row that feeds a result); the
kernels read the input again after writing only where a step above says so (the product's rows per channel, the
depthwise channel blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfmcu import abi
from tfmcu.abi import OP_AVG_POOL, OP_CONV, OP_DEPTHWISE, OP_MAX_POOL

# Where the TfmcuSpan fields start in a row of the span tables (input 0's for the per-input fields).
_SPAN = abi.word_offsets("TfmcuSpan")
_OUT_START, _OUT_STOP, _IN_START, _IN_STOP, _PAD_BEFORE = (_SPAN[f] for f in ("out_start", "out_stop", "in_start",
                                                                              "in_stop", "pad_before"))


def align4(n: int) -> int:
    return (n + 3) // 4 * 4


def conv_path(kernel_h: int, kernel_w: int, padding: tuple[int, int], dilation: tuple[int, int] = (1, 1),
              stride: tuple[int, int] = (1, 1), mve: bool = False, in_hw: tuple[int, int] | None = None,
              in_channels: int | None = None) -> str:
    """The kernel ``arm_convolve_wrapper_s8`` runs for an ungrouped convolution on a DSP core without MVE:
    "1x1_fast" (arm_convolve_1x1_s8_fast: 1x1, padding 0, dilation 1, stride 1), "1x1" (arm_convolve_1x1_s8: the
    same with another stride), else "im2col" (arm_convolve_s8; the 1 x N path for an input of height 1 calls it on
    such cores). ``padding``: (top, left). ``mve`` (Helium): "1xn" (arm_convolve_1_x_n_s8) for an input of height 1
    (``in_hw``) with a one-row kernel, dilation 1 across and stride x ``in_channels`` a multiple of 4
    (``arm_nn_is_convolve_1_x_n``); without ``in_hw`` and ``in_channels`` that path is not recognised."""
    if kernel_h == 1 and kernel_w == 1 and tuple(padding) == (0, 0) and tuple(dilation) == (1, 1):
        return "1x1_fast" if tuple(stride) == (1, 1) else "1x1"
    if (mve and in_hw is not None and in_channels is not None and in_hw[0] == 1 and kernel_h == 1
            and dilation[1] == 1 and (stride[1] * in_channels) % 4 == 0):
        return "1xn"
    return "im2col"


def depthwise_path(kernel_h: int, kernel_w: int, in_channels: int, out_channels: int, padding: tuple[int, int],
                   dilation: tuple[int, int] = (1, 1), mve: bool = False) -> str:
    """The kernel ``arm_depthwise_conv_wrapper_s8`` runs (batch 1, DSP core without MVE): "3x3"
    (arm_depthwise_conv_3x3_s8: depth multiplier 1, dilation 1, 3x3, padding <= 1), "opt" (arm_depthwise_conv_s8_opt:
    other depth-multiplier-1 kernels without dilation), else "generic" (arm_depthwise_conv_s8). ``padding``: (top,
    left). ``mve`` (Helium): "conv" for one input channel into several (arm_depthwise_conv_to_conv_s8: a
    convolution), "opt" for every depth-multiplier-1 kernel without dilation (3x3 too), else "generic"."""
    if mve:
        if in_channels == 1 and out_channels > 1:
            return "conv"
        return "opt" if in_channels == out_channels and tuple(dilation) == (1, 1) else "generic"
    if in_channels != out_channels or tuple(dilation) != (1, 1):
        return "generic"
    if kernel_h == 3 and kernel_w == 3 and padding[0] <= 1 and padding[1] <= 1:
        return "3x3"
    return "opt"


def conv_buffer_bytes(kernel_h: int, kernel_w: int, in_channels: int, padding: tuple[int, int],
                      dilation: tuple[int, int] = (1, 1), mve: bool = False, stride: tuple[int, int] = (1, 1),
                      in_hw: tuple[int, int] | None = None, out_w: int | None = None) -> int:
    """``arm_convolve_wrapper_s8_get_buffer_size``. DSP: 0 for a 1x1 convolution (padding 0, dilation 1), else
    arm_convolve_s8's two im2col columns of int16, kernel_h x kernel_w x in_channels rounded up to 4 each (the 1 x N
    path asks the same on DSP cores, so its conditions on the input height and stride do not matter there).
    ``mve`` (Helium, ``*_get_buffer_size_mve``): 0 for a 1x1 convolution; the 1 x N path (an input of height 1
    (``in_hw``), a 1-row kernel, stride x channels a multiple of 4) its padded row (``_conv_1xn_mve``); else four
    im2col columns of int8, kernel_h x kernel_w x in_channels rounded up to 16 each."""
    if conv_path(kernel_h, kernel_w, padding, dilation, stride).startswith("1x1"):
        return 0
    if not mve:
        return 2 * align4(kernel_h * kernel_w * in_channels) * 2
    if out_w is not None and conv_path(kernel_h, kernel_w, padding, dilation, stride, True, in_hw,
                                       in_channels) == "1xn":
        return _conv_1xn_mve(kernel_w, in_channels, padding[1], stride[1], in_hw[1], out_w)
    return _im2col_mve(kernel_h * kernel_w * in_channels)


def _im2col_mve(column: int) -> int:
    """``arm_convolve_s8_get_buffer_size_mve``: four int8 columns, each rounded up to 16 elements."""
    return 4 * (-(-column // 16)) * 16


def _c_div(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _conv_1xn_sections(kernel_w: int, pad_x: int, stride_x: int, input_x: int,
                       output_x: int) -> tuple[int, int, int, int, int]:
    """``arm_convolve_1_x_n_s8``'s (MVE) split of the output row: (left-padded outputs, unpadded, right-padded, the
    asymmetric padding (total % 2, C's), the total padding). The kernel fails unless 2 x pad_x + asymmetric == total,
    and runs arm_convolve_s8 unless the three sections add up to the output width."""
    total_pad = (output_x - 1) * stride_x + kernel_w - input_x
    asym = total_pad - _c_div(total_pad, 2) * 2  # (C's %)
    right = max(1, _c_div(pad_x + asym + stride_x - 1, stride_x)) if pad_x + asym != 0 else 0
    left = max(1, _c_div(pad_x + stride_x - 1, stride_x)) if pad_x != 0 else 0
    return left, max(output_x - (right + left), 0), right, asym, total_pad


def _conv_1xn_mve(kernel_w: int, channels: int, pad_x: int, stride_x: int, input_x: int, output_x: int) -> int:
    """``arm_convolve_1_x_n_s8_get_buffer_size_mve``: the longer of the left and the right padded windows (the
    output split into left-padded, unpadded and right-padded pixels), else arm_convolve_s8's."""
    left, unpadded, right, asym, _ = _conv_1xn_sections(kernel_w, pad_x, stride_x, input_x, output_x)
    if right + unpadded + left != output_x:
        return _im2col_mve(kernel_w * channels)
    pad_left = pad_x * channels
    pad_right = right * channels if asym else pad_left
    return max(kernel_w * channels + pad_left, kernel_w * channels - channels + pad_right)


def depthwise_buffer_bytes(kernel_h: int, kernel_w: int, in_channels: int, out_channels: int,
                           padding: tuple[int, int], dilation: tuple[int, int] = (1, 1), mve: bool = False,
                           stride: tuple[int, int] = (1, 1), in_hw: tuple[int, int] | None = None,
                           out_w: int | None = None, dsp: bool = True) -> int:
    """``arm_depthwise_conv_wrapper_s8_get_buffer_size``. DSP: none for the 3x3 kernel with padding <= 1, an int16
    column of kernel_h x kernel_w x channels for arm_depthwise_conv_s8_opt (depth multiplier 1, dilation 1), none for
    the generic kernel. ``mve``: one input channel into several is run as a convolution (its buffer plus the
    filter); depth multiplier 1 without dilation (3x3 too) arm_depthwise_conv_s8_opt's four blocks of 124 channels
    x kernel_h x kernel_w int8; else none. Without the DSP extension (``dsp`` False: plain C) none."""
    if mve:
        path = depthwise_path(kernel_h, kernel_w, in_channels, out_channels, padding, dilation, mve=True)
        if path == "conv":
            return (conv_buffer_bytes(kernel_h, kernel_w, 1, padding, dilation, True, stride, in_hw, out_w)
                    + kernel_h * kernel_w * out_channels)
        return 4 * CH_IN_BLOCK_MVE * kernel_h * kernel_w if path == "opt" else 0
    if not dsp or depthwise_path(kernel_h, kernel_w, in_channels, out_channels, padding, dilation) != "opt":
        return 0
    return in_channels * kernel_h * kernel_w * 2


CH_IN_BLOCK_MVE = 124  # CMSIS-NN's arm_nnsupportfunctions.h: channels arm_depthwise_conv_s8_opt (MVE) takes a block


def avgpool_buffer_bytes(channels: int, mve: bool = False, dsp: bool = True) -> int:
    """``arm_avgpool_s8_get_buffer_size``: one int32 per channel (DSP); none (MVE, or plain C: ``dsp`` False)."""
    return 0 if mve or not dsp else 4 * channels


def fully_connected_buffer_bytes(out_channels: int, mve: bool = False) -> int:
    """``arm_fully_connected_s8_get_buffer_size`` (TFLM's CMSIS-NN FULLY_CONNECTED of int8 weights into a ``[N, K]``
    output): none (DSP, plain C); one int32 per output channel with Helium (its kernel sums)."""
    return 4 * out_channels if mve else 0


# ------------------------------------------------------------------------------------------ the patch stage
def covers(op_type: int, p: dict[str, Any]) -> bool:
    """Whether the backend runs a layer of ``op_type`` (abi.OP_*) with params ``p`` through CMSIS-NN
    (cmsis_nn/*_cmsis_nn.c: *_covers); the rest runs the portable kernels. Pooling tiles of a valid stage always
    qualify (every window holds an input pixel: tfmcu_cmsis_pool_covers)."""
    if op_type in (OP_AVG_POOL, OP_MAX_POOL):
        return True
    if p.get("dilation_h", 1) != 1 or p.get("dilation_w", 1) != 1:
        return False
    if not (-127 <= p["input_offset"] <= 128 and -128 <= p["output_offset"] <= 127):
        return False
    if op_type == OP_CONV:
        return p.get("groups", 1) == 1
    return op_type == OP_DEPTHWISE and p.get("depth_multiplier", 1) == 1


def _covers(layer: Any) -> bool:
    return covers(layer.type, layer.params)


def stage_kernel_scratch_bytes(packed: Any, mve: bool = False, dsp: bool = True) -> int:
    """The kernel buffer ``tfmcu_stage_prepare`` computes with -DTFMCU_CMSIS_NN for ``packed`` (a
    ``tfmcu.kernels.pack.PackedStage``): max over the window layers (conv, depthwise, pooling) and patches of
    align4(CMSIS-NN's buffer for the tile) + the staging rows of a non-dense input box (kernel_h x box width x
    channels, rounded up to 4). ``mve``: CMSIS-NN's Helium buffers (a Cortex-M55 build); ``dsp`` False: its plain C
    ones (a core without the DSP extension)."""
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
                # (the box's dimensions, as the backend gives CMSIS-NN's *_get_buffer_size: the MVE 1 x N path's)
                box = dict(mve=mve, in_hw=(in_h, in_w), out_w=int(c[_OUT_STOP] - c[_OUT_START]),
                           stride=(p["stride_h"], p["stride_w"])) if layer.type in (OP_CONV, OP_DEPTHWISE) else {}
                if layer.type == OP_CONV:
                    need = conv_buffer_bytes(p["kernel_h"], p["kernel_w"], channels, (0, 0), **box)
                    if mve and p["kernel_h"] == 1 and in_h > 1:  # (a call of one row: the 1 x N path's too)
                        need = max(need, conv_buffer_bytes(p["kernel_h"], p["kernel_w"], channels, (0, 0),
                                                           **{**box, "in_hw": (1, in_w)}))
                elif layer.type == OP_DEPTHWISE:
                    need = depthwise_buffer_bytes(p["kernel_h"], p["kernel_w"], channels, out_channels, pad, dsp=dsp,
                                                  **box)
                elif layer.type == OP_AVG_POOL:
                    need = avgpool_buffer_bytes(channels, mve, dsp)
                else:
                    need = 0
                need = align4(need) + (0 if dense else align4(kernel_h * in_w * channels))
                most = max(most, need)
    return most


def stage_scratch_bytes(packed: Any, mve: bool = False, dsp: bool = True) -> int:
    """``TfmcuPreparedStage.scratch_bytes`` with -DTFMCU_CMSIS_NN: the patch buffers, then (if any) the kernel
    buffer at the next 4-byte boundary (``mve``: Helium's; ``dsp`` False: plain C's)."""
    kernel = stage_kernel_scratch_bytes(packed, mve, dsp)
    return align4(packed.scratch_bytes) + kernel if kernel > 0 else packed.scratch_bytes


# ------------------------------------------------------------------------------------------ processing order
def _last_reader(n_in: int, n_out: int, kernel: int, stride: int, pad: int) -> np.ndarray:
    """Per input coordinate, the last output coordinate whose window (in-image taps) holds it; -1 for none."""
    i = np.arange(n_in, dtype=np.int64)
    last = np.minimum((i + pad) // stride, n_out - 1)
    ok = (last >= 0) & (last * stride - pad <= i) & (last * stride - pad + kernel - 1 >= i)
    return np.where(ok, last, -1)


def _chunk_step(n: int, chunk: int) -> np.ndarray:
    """Step of each of n elements processed ``chunk`` at a time, then one by one (CMSIS-NN's x4 loops + leftovers)."""
    j = np.arange(n, dtype=np.int64)
    body = n - n % chunk
    return np.where(j < body, j // chunk, body // chunk + (j - body))


def _mat_mult_mve(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``arm_nn_mat_mult_nt_t_s8``'s MVE loops over ``rows`` lhs rows (pixels) and ``cols`` output channels:
    (step writing each (row, channel), step of each row's last read, number of steps). Four rows per block, one step
    per channel (the four rows read, that channel written); then each leftover row, one step per group of four
    channels (the row read, the group written; the tail group with the last)."""
    blocks, groups = rows // 4, -(-cols // 4)
    r = np.arange(rows, dtype=np.int64)
    ch = np.arange(cols, dtype=np.int64)
    in_block = r < 4 * blocks
    base = np.where(in_block, (r // 4) * cols, blocks * cols + (r - 4 * blocks) * groups)
    write = base[:, None] + np.where(in_block[:, None], ch[None, :], (ch // 4)[None, :])
    last = base + np.where(in_block, cols - 1, groups - 1)
    return write, last, blocks * cols + (rows - 4 * blocks) * groups


def processing_order(kind: str, in_shape: tuple[int, int, int], out_shape: tuple[int, int, int],
                     kernel: tuple[int, int] = (1, 1), stride: tuple[int, int] = (1, 1),
                     padding: tuple[int, int] = (0, 0), mve: bool = False) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(kernel path, step in which each output byte is written, step in which each input byte is read for the last
    time or -1 if never) for one int8 operator of batch 1 as CMSIS-NN runs it on a DSP core, or with ``mve`` on a
    Helium core (see the module docstring); within a step every read comes before every write. ``kind``: "conv"
    (groups 1, dilation 1), "depthwise" (dilation 1), "avg_pool", "max_pool", "add" or "mul" (same shapes, one
    input: the other is alike; four elements of each input read, then four written, then the leftovers one by one);
    shapes (height, width, channels); ``padding`` (top, left). None for what is not modelled (and for what CMSIS-NN
    refuses: arm_convolve_1_x_n_s8's padding check)."""
    h, w, c = (int(v) for v in in_shape)
    ho, wo, co = (int(v) for v in out_shape)
    if kind in ("add", "mul"):
        if (h, w, c) != (ho, wo, co):
            return None
        step = np.arange(h * w * c, dtype=np.int64) // 4 if mve else _chunk_step(h * w * c, 4)
        return f"arm_elementwise_{kind}_s8", step, step
    kh, kw = kernel
    sh, sw = stride
    pt, pl = padding
    ly, lx = _last_reader(h, ho, kh, sh, pt), _last_reader(w, wo, kw, sw, pl)
    last_pix = np.where((ly[:, None] >= 0) & (lx[None, :] >= 0), ly[:, None] * wo + lx[None, :], -1).reshape(-1)
    pixels = np.arange(ho * wo, dtype=np.int64)

    def per_pixel(out_step: np.ndarray, in_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (np.repeat(out_step, co), np.where(np.repeat(last_pix, c) >= 0, np.repeat(in_step, c), -1))

    if kind == "depthwise" and mve and depthwise_path(kh, kw, c, co, padding, mve=True) == "conv":
        return processing_order("conv", in_shape, out_shape, kernel, stride, padding, mve=True)
    if kind == "conv":
        path = conv_path(kh, kw, padding, (1, 1), stride, mve, (h, w), c)
        if path == "1xn":
            if ho != 1 or pt != 0:
                return None  # (arm_convolve_1_x_n_s8 computes one row and ignores padding across)
            left, unpadded, right, asym, total = _conv_1xn_sections(kw, pl, sw, w, wo)
            if 2 * pl + asym != total:
                return None  # ARM_CMSIS_NN_FAILURE
            # the last input pixel each copy feeds a result from (past the input, as the right copy's can be with a
            # stride above 1: the result depends on the bytes after the input; not modelled)
            left_end = (left - 1) * sw - pl + kw - 1 if left else -1
            right_end = sw * (left + unpadded) - pl + kw - 2 if right else -1
            if left + unpadded + right == wo and max(left_end, right_end) >= w:
                return None
            if left + unpadded + right == wo:
                # step 0: the left copy and outputs; the unpadded product on the input; last: the right copy, outputs
                write, last, n = _mat_mult_mve(unpadded, co)
                out_step = np.zeros((wo, co), dtype=np.int64)
                out_step[left:left + unpadded] = 1 + write
                out_step[left + unpadded:] = n + 1
                in_step = np.where(lx >= 0, 0, -1)  # (lx: the last output pixel whose window holds it)
                mid = (lx >= left) & (lx < left + unpadded)
                in_step[mid] = 1 + last[lx[mid] - left]
                in_step[lx >= left + unpadded] = n + 1
                return "arm_convolve_1_x_n_s8", out_step.reshape(-1), np.repeat(in_step, c)
            path = "im2col"  # (arm_convolve_1_x_n_s8 calls arm_convolve_s8)
        if path == "im2col":  # two pixels per step (MVE: four)
            per = 4 if mve else 2
            return ("arm_convolve_s8",) + per_pixel(pixels // per, np.where(last_pix >= 0, last_pix // per, -1))
        rows = ho * wo if path == "1x1_fast" else wo
        call = pixels // rows  # one call (stride 1) or one per output row
        r = pixels % rows
        if mve:  # arm_nn_mat_mult_nt_t_s8 (MVE): pixels outside, four at a time, channels inside
            write, last, n = _mat_mult_mve(rows, co)
            out_step = (call[:, None] * n + write[r]).reshape(-1)
            in_step_px = call * n + last[r]
        else:
            # arm_nn_mat_mult_nt_t_s8 over `rows` pixels: channel pairs outside, pixel pairs inside, an odd channel
            # last
            pairs, passes = co // 2, co // 2 + co % 2
            q = np.minimum(np.arange(co, dtype=np.int64) // 2, pairs)  # the pass of each output channel
            within = np.where(q[None, :] < pairs, (r // 2)[:, None], r[:, None])
            out_step = (call[:, None] * passes * rows + q[None, :] * rows + within).reshape(-1)
            final = passes - 1
            in_step_px = call * passes * rows + final * rows + (r // 2 if final < pairs else r)
        if path == "1x1_fast":
            in_step = np.repeat(in_step_px, c)
        else:  # input pixel (y * sh, x * sw) feeds output pixel (y, x); the others are never read
            yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
            read = (yy % sh == 0) & (yy // sh < ho) & (xx % sw == 0) & (xx // sw < wo)
            src = np.where(read, (yy // sh) * wo + xx // sw, 0).reshape(-1)
            in_step = np.repeat(np.where(read.reshape(-1), in_step_px[src], -1), c)
        return ("arm_convolve_1x1_s8_fast" if path == "1x1_fast" else "arm_convolve_1x1_s8"), out_step, in_step
    if kind == "depthwise":
        if co % c:
            return None
        path = depthwise_path(kh, kw, c, co, padding, mve=mve)
        if path == "opt" and mve:  # channel blocks of CH_IN_BLOCK_MVE outside, four pixels per step inside
            n = -(-(ho * wo) // 4)
            block = np.arange(c, dtype=np.int64) // CH_IN_BLOCK_MVE
            out_step = (block[None, :] * n + (pixels // 4)[:, None]).reshape(-1)
            in_step = np.where(last_pix[:, None] >= 0, block[None, :] * n + (last_pix // 4)[:, None], -1).reshape(-1)
            return "arm_depthwise_conv_s8_opt", out_step, in_step
        if path == "opt":
            return ("arm_depthwise_conv_s8_opt",) + per_pixel(pixels, last_pix)
        if path == "3x3":  # per pixel, groups of four channels then leftovers
            g = _chunk_step(c, 4)
            ng = int(g[-1]) + 1
            out_step = (pixels[:, None] * ng + g[None, :]).reshape(-1)
            in_step = np.where(last_pix[:, None] >= 0, last_pix[:, None] * ng + g[None, :], -1).reshape(-1)
            return "arm_depthwise_conv_3x3_s8", out_step, in_step
        mult = co // c
        tile = 4 if mult % 4 == 0 else 1  # depthwise_conv_s8_mult_4 or depthwise_conv_s8_generic
        nt = co // tile
        out_step = (pixels[:, None] * nt + np.arange(co)[None, :] // tile).reshape(-1)
        last_tile = ((np.arange(c) + 1) * mult - 1) // tile
        in_step = np.where(last_pix[:, None] >= 0, last_pix[:, None] * nt + last_tile[None, :], -1).reshape(-1)
        return "arm_depthwise_conv_s8", out_step, in_step
    # MVE pooling: blocks of 16 channels (tail-predicated) where the DSP code goes pixel by pixel / byte by byte
    block = np.arange(c, dtype=np.int64) // 16 if mve else np.arange(c, dtype=np.int64)
    nb = -(-c // 16) if mve else c
    if kind == "avg_pool" and c == co:
        if mve:  # per pixel, per block of 16 channels: the block's window read, then written
            out_step = (pixels[:, None] * nb + block[None, :]).reshape(-1)
            in_step = np.where(last_pix[:, None] >= 0, last_pix[:, None] * nb + block[None, :], -1).reshape(-1)
            return "arm_avgpool_s8", out_step, in_step
        return ("arm_avgpool_s8",) + per_pixel(pixels, last_pix)
    if kind == "max_pool" and c == co:
        # Step (pixel, tap, channel; MVE: block of 16 channels): the first in-image tap is copied into the output,
        # each later tap compared into it; forward (a write may land on the same tap's input only at or below it).
        taps = kh * kw
        oy, ox = pixels // wo, pixels % wo
        first_tap = np.maximum(0, pt - oy * sh) * kw + np.maximum(0, pl - ox * sw)
        out_step = (((pixels * taps + first_tap) * nb)[:, None] + block[None, :]).reshape(-1)
        ty = np.arange(h)[:, None] - (ly[:, None] * sh - pt)
        tx = np.arange(w)[None, :] - (lx[None, :] * sw - pl)
        tap = (ty * kw + tx).reshape(-1)
        in_px = np.where(last_pix >= 0, (last_pix * taps + tap) * nb, -1)
        in_step = np.where(in_px[:, None] >= 0, in_px[:, None] + block[None, :], -1).reshape(-1)
        return "arm_max_pool_s8", out_step, in_step
    return None
