"""Quantization math computed offline, bit for bit as TFLite's kernels compute it at Prepare time.

``quantize_multiplier`` (TFLite's QuantizeMultiplier), ``activation_range`` (CalculateActivationRangeQuantized),
``conv_multipliers`` (PopulateConvolutionQuantizationParams), and the int8 Prepare of the element-wise ops as TFLite
Micro computes it: ``add_params``, ``sub_params`` (ADD's params computed as SUB's Prepare does, in float32),
``mul_params``, ``hard_swish_params``, ``logistic_params`` / ``tanh_params``, ``leaky_relu_params``. The C kernels
take the results as plain integers (per-channel arrays in Flash), so they need no floating point at run time and no
persistent memory.

And the two ways an int32 sum is requantized at run time, recomputed exactly (``tfmcu.runtime.agreement`` proves a
rounding tie with them): ``multiply_by_quantized_multiplier`` (TFLite's MultiplyByQuantizedMultiplier, the
fixed-point multiplier rounding twice: every TFLM kernel, TF Lite's CONV_2D) and ``requantize_float`` (TF Lite's
reference FULLY_CONNECTED: the sum times the float scales in double, rounded once).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from tfmcu.kernels import PatchKernelError


def _round_half_away(x: float | Fraction) -> int:
    """std::round: nearest integer, ties away from zero, computed exactly."""
    f = Fraction(x)
    n = math.floor(abs(f) + Fraction(1, 2))
    return n if f >= 0 else -n


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier (default double-rounding build): ``real`` (a double) as a Q31 multiplier and a
    power-of-two exponent, ``real ~= multiplier * 2^(shift - 31)``. frexp-based; a mantissa that rounds up to 2^31
    is halved (shift + 1); shifts below -31 flush to (0, 0); 0 gives (0, 0)."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = _round_half_away(q * float(1 << 31))  # q * 2^31 is exact in double
    if q_fixed > (1 << 31):
        raise PatchKernelError(f"multiplier {real!r} cannot be quantized")
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if q_fixed > (1 << 31) - 1:
        raise PatchKernelError(f"multiplier {real!r} cannot be quantized")
    if shift < -31:
        shift, q_fixed = 0, 0
    return int(q_fixed), int(shift)


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def multiply_by_quantized_multiplier(x: int, multiplier: int, shift: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier (default double-rounding build) on Python ints: ``x`` times
    ``multiplier * 2^(shift - 31)``, as SaturatingRoundingDoublingHighMul (rounding to nearest) then
    RoundingDivideByPOT (a half away from zero) compute it."""
    left, right = max(shift, 0), max(-shift, 0)
    a = int(x) * (1 << left)
    if not INT32_MIN <= a <= INT32_MAX:
        raise PatchKernelError(f"{x} << {left} overflows int32")
    if a == multiplier == INT32_MIN:
        high = INT32_MAX
    else:
        ab = a * int(multiplier)
        nudged = ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30))
        high = abs(nudged) // (1 << 31) * (1 if nudged >= 0 else -1)  # C's division truncates toward zero
    mask = (1 << right) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> right) + (1 if (high & mask) > threshold else 0)


def requantize_float(x: int, real: float) -> int:
    """TF Lite's reference FULLY_CONNECTED requantization: ``round(double(x) * real)``, the product a double, rounded
    half away from zero (``real``: double(input scale) * double(filter scale) / double(output scale), as
    ``conv_multipliers`` takes it)."""
    return _round_half_away(float(x) * float(real))


def real_scales(input_scale: float, filter_scales: Sequence[float], output_scale: float,
                channels: int) -> list[float]:
    """Per output channel, double(input_scale) * double(filter_scale) / double(output_scale) (the scales float32),
    the real multiplier ``conv_multipliers`` quantizes; a per-tensor filter scale is broadcast to every channel."""
    scales = [float(_f32(s)) for s in np.ravel(filter_scales)]
    if len(scales) not in (1, channels):
        raise PatchKernelError(f"{len(scales)} filter scales for {channels} output channels")
    return [float(_f32(input_scale)) * scales[c if len(scales) > 1 else 0] / float(_f32(output_scale))
            for c in range(channels)]


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _quantize_scalar(scale: float, zero_point: int, value: float) -> int:
    """TFLite's Quantize helper for activation ranges: zero_point + round(value / scale), all in float32."""
    with np.errstate(all="ignore"):
        q = _f32(value) / _f32(scale)
    if not np.isfinite(q) or abs(float(q)) > 2 ** 31:
        raise PatchKernelError(f"activation bound {value} does not fit scale {scale}")
    return int(zero_point) + _round_half_away(float(q))


def activation_range(activation: str, scale: float, zero_point: int) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for an int8 output: the fused activation as a clamp range."""
    lo, hi = -128, 127
    if activation == "none":
        return lo, hi
    if activation == "relu":
        return max(lo, _quantize_scalar(scale, zero_point, 0.0)), hi
    if activation == "relu6":
        return max(lo, _quantize_scalar(scale, zero_point, 0.0)), min(hi, _quantize_scalar(scale, zero_point, 6.0))
    if activation == "relu_n1_to_1":
        return (max(lo, _quantize_scalar(scale, zero_point, -1.0)),
                min(hi, _quantize_scalar(scale, zero_point, 1.0)))
    raise PatchKernelError(f"fused activation {activation!r} is not supported (none, relu, relu6, relu_n1_to_1)")


def conv_multipliers(input_scale: float, filter_scales: Sequence[float], output_scale: float,
                     channels: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's PopulateConvolutionQuantizationParams: per output channel,
    QuantizeMultiplier(double(input_scale) * double(filter_scale) / double(output_scale)); a per-tensor filter
    scale is broadcast to every channel."""
    scales = tuple(float(_f32(s)) for s in np.ravel(filter_scales))
    mult, shift = _conv_multipliers(float(_f32(input_scale)), scales, float(_f32(output_scale)), channels)
    return mult.copy(), shift.copy()


@functools.lru_cache(maxsize=4096)
def _conv_multipliers(input_scale: float, scales: tuple[float, ...], output_scale: float,
                      channels: int) -> tuple[np.ndarray, np.ndarray]:
    """``conv_multipliers`` of float32 scales, computed once per layer (a search packs a layer into many candidate
    stages)."""
    mult = np.zeros(channels, np.int32)
    shift = np.zeros(channels, np.int32)
    for c, real in enumerate(real_scales(input_scale, scales, output_scale, channels)):
        mult[c], shift[c] = quantize_multiplier(real)
    return mult, shift


def add_params(s1: float, zp1: int, s2: float, zp2: int, s_out: float, zp_out: int,
               activation: str) -> dict[str, int]:
    """TFLite's int8 ADD preparation (general rescaling, left shift 20)."""
    left_shift = 20
    twice_max = 2.0 * float(max(_f32(s1), _f32(s2)))
    m1, sh1 = quantize_multiplier(float(_f32(s1)) / twice_max)
    m2, sh2 = quantize_multiplier(float(_f32(s2)) / twice_max)
    mo, sho = quantize_multiplier(twice_max / ((1 << left_shift) * float(_f32(s_out))))
    if max(sh1, sh2, sho) > 0:
        raise PatchKernelError("ADD rescaling multipliers must be smaller than one")
    lo, hi = activation_range(activation, s_out, zp_out)
    return dict(input1_offset=-int(zp1), input2_offset=-int(zp2), output_offset=int(zp_out), left_shift=left_shift,
                input1_multiplier=m1, input1_shift=sh1, input2_multiplier=m2, input2_shift=sh2,
                output_multiplier=mo, output_shift=sho, act_min=lo, act_max=hi)


def sub_params(s1: float, zp1: int, s2: float, zp2: int, s_out: float, zp_out: int,
               activation: str) -> dict[str, int]:
    """TFLM's int8 SUB preparation (CalculateOpDataSub at the pinned commit, what the firmware builds): ADD's params
    (left shift 20), but the rescaling multipliers come from float32 quotients: twice_max = 2 max(s1, s2),
    s1 / twice_max, s2 / twice_max and twice_max / (2^20 s_out), each a float32 then
    QuantizeMultiplierSmallerThanOneExp. (The tflite-micro wheel and TF Lite take ADD's double quotients.)"""
    left_shift = 20
    f1, f2, fo = _f32(s1), _f32(s2), _f32(s_out)
    with np.errstate(all="ignore"):
        twice_max = np.float32(2.0) * max(f1, f2)
        reals = (f1 / twice_max, f2 / twice_max, twice_max / (np.float32(1 << left_shift) * fo))
    if not all(np.isfinite(r) and 0.0 < float(r) < 1.0 for r in reals):
        raise PatchKernelError("SUB rescaling multipliers must be between 0 and 1")
    (m1, sh1), (m2, sh2), (mo, sho) = (quantize_multiplier(float(r)) for r in reals)
    lo, hi = activation_range(activation, s_out, zp_out)
    return dict(input1_offset=-int(zp1), input2_offset=-int(zp2), output_offset=int(zp_out), left_shift=left_shift,
                input1_multiplier=m1, input1_shift=sh1, input2_multiplier=m2, input2_shift=sh2,
                output_multiplier=mo, output_shift=sho, act_min=lo, act_max=hi)


def mul_params(s1: float, zp1: int, s2: float, zp2: int, s_out: float, zp_out: int,
               activation: str) -> dict[str, int]:
    """TFLM's int8 MUL preparation (CalculateOpDataMul): QuantizeMultiplier(double(s1) * double(s2) /
    double(s_out)) (the shift may be positive), the offsets, the fused activation's clamp range. (TF Lite takes the
    float32 product and quotient.)"""
    real = float(_f32(s1)) * float(_f32(s2)) / float(_f32(s_out))
    m, shift = quantize_multiplier(real)
    if not -31 <= shift <= 31:
        raise PatchKernelError(f"MUL multiplier {real!r} is out of range")
    lo, hi = activation_range(activation, s_out, zp_out)
    return dict(input1_offset=-int(zp1), input2_offset=-int(zp2), output_offset=int(zp_out), output_multiplier=m,
                output_shift=shift, act_min=lo, act_max=hi)


def downscale_multiplier_int16(multiplier: int) -> int:
    """TFLite's DownScaleInt32ToInt16Multiplier: a Q31 multiplier rounded to Q15 (saturating at 32767)."""
    if multiplier >= INT32_MAX - (1 << 15):
        return (1 << 15) - 1
    return (int(multiplier) + (1 << 15)) >> 16


def hard_swish_params(s_in: float, zp_in: int, s_out: float, zp_out: int) -> dict[str, int]:
    """TFLM's int8 HARD_SWISH preparation (HardSwishPrepare), in its float32 arithmetic: hires = s_in / 128, the
    output multiplier hires / s_out and the "relu-ish" multiplier hires / (3 / 32768), each a float32 quotient,
    QuantizeMultiplier, then rounded to Q15. TFLM fails a model whose output multiplier is 1 or more."""
    f_in, f_out = _f32(s_in), _f32(s_out)
    with np.errstate(all="ignore"):
        hires = np.float32(1.0 / 128.0) * f_in
        output_real = hires / f_out
        reluish_real = hires / (np.float32(3.0) / np.float32(32768.0))
    if not (np.isfinite(output_real) and np.isfinite(reluish_real)):
        raise PatchKernelError(f"HARD_SWISH scales {s_in!r} -> {s_out!r} give no finite multiplier")
    mo, eo = quantize_multiplier(float(output_real))
    mr, er = quantize_multiplier(float(reluish_real))
    if eo > 0:
        raise PatchKernelError(f"HARD_SWISH output multiplier {float(output_real)!r} is 1 or more (input scale "
                               f"{float(f_in)!r} > 128 x output scale {float(f_out)!r}): TFLM refuses it")
    if not -31 <= er <= 31:
        raise PatchKernelError(f"HARD_SWISH input scale {float(f_in)!r} is out of range")
    return dict(input_zero_point=int(zp_in), output_zero_point=int(zp_out),
                reluish_multiplier_fixedpoint_int16=downscale_multiplier_int16(mr), reluish_multiplier_exponent=er,
                output_multiplier_fixedpoint_int16=downscale_multiplier_int16(mo), output_multiplier_exponent=eo)


# The input of TFLM's int8 LOGISTIC / TANH in fixed point: 4 integer bits (kInputIntegerBits).
_ACTIVATION_INPUT_INTEGER_BITS = 4


def _fixedpoint_activation_params(what: str, s_in: float, zp_in: int) -> dict[str, int]:
    """The int8 LOGISTIC / TANH preparation of TFLM (CalculateArithmeticOpDataLogistic, TanhPrepare): frexp of
    double(s_in) * 2^27 as a Q31 multiplier (TfLiteRound) and a left shift, and CalculateInputRadius(4, shift, 31) =
    floor(15 * 2^27 / 2^shift), 0 from a shift of 31 on (input scales of 8 and more: every input saturates)."""
    real = float(_f32(s_in)) * float(1 << (31 - _ACTIVATION_INPUT_INTEGER_BITS))
    if not (real > 0.0 and math.isfinite(real)):
        raise PatchKernelError(f"{what} input scale {s_in!r} is not positive")
    q, shift = math.frexp(real)
    if not 0 <= shift <= 62:
        raise PatchKernelError(f"{what} input scale {float(_f32(s_in))!r} is out of range (TFLM's input shift "
                               f"{shift})")
    multiplier = _round_half_away(q * float(1 << 31))
    if multiplier >= (1 << 31):
        raise PatchKernelError(f"{what} input scale {float(_f32(s_in))!r} cannot be quantized")
    radius = math.floor(Fraction(((1 << _ACTIVATION_INPUT_INTEGER_BITS) - 1) << (31 - _ACTIVATION_INPUT_INTEGER_BITS),
                                 1 << shift))
    return dict(input_zero_point=int(zp_in), input_range_radius=int(radius), input_multiplier=int(multiplier),
                input_left_shift=int(shift))


def logistic_params(s_in: float, zp_in: int) -> dict[str, int]:
    """TFLM's int8 LOGISTIC preparation (output scale 1/256, zero point -128)."""
    return _fixedpoint_activation_params("LOGISTIC", s_in, zp_in)


def tanh_params(s_in: float, zp_in: int) -> dict[str, int]:
    """TFLM's int8 TANH preparation (output scale 1/128, zero point 0): LOGISTIC's."""
    return _fixedpoint_activation_params("TANH", s_in, zp_in)


def leaky_relu_params(s_in: float, zp_in: int, s_out: float, zp_out: int, alpha: float) -> dict[str, int]:
    """TFLM's int8 LEAKY_RELU preparation (CalculateOpDataLeakyRelu), in its float32 arithmetic:
    QuantizeMultiplier(s_in * alpha / s_out) (negative for a negative alpha) and QuantizeMultiplier(s_in / s_out)."""
    f_in, f_out, f_alpha = _f32(s_in), _f32(s_out), _f32(alpha)
    with np.errstate(all="ignore"):
        alpha_real, identity_real = f_in * f_alpha / f_out, f_in / f_out
    if not (np.isfinite(alpha_real) and np.isfinite(identity_real)):
        raise PatchKernelError(f"LEAKY_RELU scales {s_in!r} -> {s_out!r} give no finite multiplier")
    ma, sa = quantize_multiplier(float(alpha_real))
    mi, si = quantize_multiplier(float(identity_real))
    if not (-31 <= sa <= 31 and -31 <= si <= 31) or ma == INT32_MIN:
        raise PatchKernelError(f"LEAKY_RELU multipliers {float(alpha_real)!r}, {float(identity_real)!r} are out of "
                               f"range")
    return dict(input_zero_point=int(zp_in), output_zero_point=int(zp_out), output_multiplier_alpha=ma,
                output_shift_alpha=sa, output_multiplier_identity=mi, output_shift_identity=si)
