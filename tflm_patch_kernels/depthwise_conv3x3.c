/* DEPTHWISE_CONV_2D with a 3x3 kernel, depth multiplier 1 and no dilation (every depthwise layer of the MobileNet
 * family): see tfmcu_depthwise_conv3x3_s8 in depthwise_conv2d.h. */
#include "depthwise_conv2d.h"
#include "tfmcu_dsp.h"

/* The output quantization of a layer, read once (the output stores could alias the params otherwise). */
typedef struct {
  int32_t offset, act_min, act_max;
} TfmcuDw3x3Out;

/* One tap of four channels: x (four input bytes) plus the input offset (both halves of off2) times w (four filter
 * bytes), into the channels' accumulators (a0..a3: channels 0..3). */
#define TFMCU_DW3X3_TAP(x, w)                                                    \
  do {                                                                           \
    const uint32_t xv_ = tfmcu_read_s8x4(x), wv_ = tfmcu_read_s8x4(w);           \
    const uint32_t xo_ = tfmcu_sxtab16(off2, tfmcu_ror8(xv_));                  \
    const uint32_t wo_ = tfmcu_sxtb16(tfmcu_ror8(wv_));                         \
    a1 = tfmcu_smlabb(xo_, wo_, a1);                                            \
    a3 = tfmcu_smlatt(xo_, wo_, a3);                                            \
    const uint32_t xe_ = tfmcu_sxtab16(off2, xv_), we_ = tfmcu_sxtb16(wv_);     \
    a0 = tfmcu_smlabb(xe_, we_, a0);                                            \
    a2 = tfmcu_smlatt(xe_, we_, a2);                                            \
  } while (0)

static inline int8_t tfmcu_dw3x3_output(int32_t acc, int32_t multiplier, int32_t shift, TfmcuDw3x3Out q) {
  return (int8_t)tfmcu_clamp(tfmcu_wrap_add(tfmcu_requantize(acc, multiplier, shift), q.offset), q.act_min,
                             q.act_max);
}

/* Channels of an inner pixel per pass: the accumulators of a pass, then their requantization (two loops, each with
 * the registers to itself). */
#define TFMCU_DW3X3_PASS 16

/* The requantized outputs of `n` accumulators of channels c0.. into o[c0..]. */
static void tfmcu_dw3x3_store(const TfmcuDepthwiseConvParams* p, TfmcuDw3x3Out q, const int32_t* acc, int32_t c0,
                              int32_t n, int8_t* o) {
  const int32_t* m = p->output_multiplier + c0;
  const int32_t* s = p->output_shift + c0;
  o += c0;
  for (int32_t k = 0; k < n; ++k) {
    o[k] = tfmcu_dw3x3_output(acc[k], m[k], s[k], q);
  }
}

/* One output pixel `o` whose window lies inside the input box: x is the input pixel under its top-left tap. Its
 * channels four at a time (nine taps, no bounds), then a tail one at a time. */
static void tfmcu_dw3x3_inner(const TfmcuDepthwiseConvParams* p, TfmcuDw3x3Out q, uint32_t off2, const int8_t* x,
                              int32_t row_stride, int32_t C, int8_t* o) {
  int32_t acc[TFMCU_DW3X3_PASS];
  const int32_t* bias = p->bias;
  int32_t c = 0;
  while (c + 4 <= C) {
    const int32_t c0 = c;
    int32_t* a = acc;
    for (; c + 4 <= C && c - c0 < TFMCU_DW3X3_PASS; c += 4, a += 4) {
      int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      if (bias != NULL) {
        a0 = bias[c];
        a1 = bias[c + 1];
        a2 = bias[c + 2];
        a3 = bias[c + 3];
      }
      const int8_t* xp = x + c;
      const int8_t* w = p->filter + c;
      for (int32_t ky = 0; ky < 3; ++ky) {
        TFMCU_DW3X3_TAP(xp, w);
        TFMCU_DW3X3_TAP(xp + C, w + C);
        TFMCU_DW3X3_TAP(xp + 2 * C, w + 2 * C);
        xp += row_stride;
        w += 3 * C;
      }
      a[0] = a0;
      a[1] = a1;
      a[2] = a2;
      a[3] = a3;
    }
    tfmcu_dw3x3_store(p, q, acc, c0, c - c0, o);
  }
  for (; c < C; ++c) {
    int32_t sum = bias != NULL ? bias[c] : 0;
    const int8_t* xr = x + c;
    const int8_t* wr = p->filter + c;
    for (int32_t ky = 0; ky < 3; ++ky, xr += row_stride, wr += 3 * C) {
      for (int32_t kx = 0; kx < 3; ++kx) {
        sum = tfmcu_wrap_add(sum, wr[kx * C] * (xr[kx * C] + p->input_offset));
      }
    }
    o[c] = tfmcu_dw3x3_output(sum, p->output_multiplier[c], p->output_shift[c], q);
  }
}

/* One output pixel `o` at the border: the window rows ky0..ky1 and columns kx0..kx1 of the filter lie inside the
 * input box (none when ky0 >= ky1 or kx0 >= kx1: the bias alone, as the reference); x: the input pixel under tap
 * (ky0, kx0), or any pixel when there is none. */
static void tfmcu_dw3x3_border(const TfmcuDepthwiseConvParams* p, TfmcuDw3x3Out q, uint32_t off2, const int8_t* x,
                               int32_t row_stride, int32_t C, int32_t ky0, int32_t ky1, int32_t kx0, int32_t kx1,
                               int8_t* o) {
  const int8_t* w0 = p->filter + (ptrdiff_t)(ky0 * 3 + kx0) * C;
  int32_t c = 0;
  for (; c + 4 <= C; c += 4) {
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    if (p->bias != NULL) {
      a0 = p->bias[c];
      a1 = p->bias[c + 1];
      a2 = p->bias[c + 2];
      a3 = p->bias[c + 3];
    }
    const int8_t* xr = x + c;
    const int8_t* wr = w0 + c;
    for (int32_t ky = ky0; ky < ky1; ++ky, xr += row_stride, wr += 3 * C) {
      for (int32_t kx = 0; kx < kx1 - kx0; ++kx) {
        TFMCU_DW3X3_TAP(xr + kx * C, wr + kx * C);
      }
    }
    o[c] = tfmcu_dw3x3_output(a0, p->output_multiplier[c], p->output_shift[c], q);
    o[c + 1] = tfmcu_dw3x3_output(a1, p->output_multiplier[c + 1], p->output_shift[c + 1], q);
    o[c + 2] = tfmcu_dw3x3_output(a2, p->output_multiplier[c + 2], p->output_shift[c + 2], q);
    o[c + 3] = tfmcu_dw3x3_output(a3, p->output_multiplier[c + 3], p->output_shift[c + 3], q);
  }
  for (; c < C; ++c) {
    int32_t acc = p->bias != NULL ? p->bias[c] : 0;
    const int8_t* xr = x + c;
    const int8_t* wr = w0 + c;
    for (int32_t ky = ky0; ky < ky1; ++ky, xr += row_stride, wr += 3 * C) {
      for (int32_t kx = 0; kx < kx1 - kx0; ++kx) {
        acc = tfmcu_wrap_add(acc, wr[kx * C] * (xr[kx * C] + p->input_offset));
      }
    }
    o[c] = tfmcu_dw3x3_output(acc, p->output_multiplier[c], p->output_shift[c], q);
  }
}

int tfmcu_depthwise_conv3x3_covers(const TfmcuDepthwiseConvParams* p) {
  return p->kernel_h == 3 && p->kernel_w == 3 && p->depth_multiplier == 1 && p->dilation_h == 1 &&
         p->dilation_w == 1;
}

TfmcuStatus tfmcu_depthwise_conv3x3_s8(const TfmcuDepthwiseConvParams* params, const TfmcuConstView* input,
                                       int32_t pad_top, int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL || params->filter == NULL ||
      params->output_multiplier == NULL || params->output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  if (!tfmcu_depthwise_conv3x3_covers(params) || input->channels != output->channels) {
    return kTfmcuErrorShapeMismatch;
  }
  const TfmcuDw3x3Out q = {params->output_offset, params->act_min, params->act_max};
  const uint32_t off2 = ((uint32_t)params->input_offset & 0xFFFFu) * 0x10001u;
  const int32_t C = output->channels;
  for (int32_t oy = 0; oy < output->height; ++oy) {
    const int32_t iy = oy * params->stride_h - pad_top;
    const int32_t ky0 = iy < 0 ? -iy : 0;
    const int32_t ky1 = tfmcu_min_i32(3, input->height - iy);
    int8_t* o = output->data + (ptrdiff_t)oy * output->row_stride;
    for (int32_t ox = 0; ox < output->width; ++ox, o += C) {
      const int32_t ix = ox * params->stride_w - pad_left;
      const int32_t kx0 = ix < 0 ? -ix : 0;
      const int32_t kx1 = tfmcu_min_i32(3, input->width - ix);
      if (ky0 >= ky1 || kx0 >= kx1) {
        tfmcu_dw3x3_border(params, q, off2, input->data, input->row_stride, C, 0, 0, 0, 0, o);
        continue;
      }
      const int8_t* x = input->data + (ptrdiff_t)(iy + ky0) * input->row_stride + (ptrdiff_t)(ix + kx0) * C;
      if (ky0 == 0 && ky1 == 3 && kx0 == 0 && kx1 == 3) {
        tfmcu_dw3x3_inner(params, q, off2, x, input->row_stride, C, o);
      } else {
        tfmcu_dw3x3_border(params, q, off2, x, input->row_stride, C, ky0, ky1, kx0, kx1, o);
      }
    }
  }
  return kTfmcuOk;
}
