/* CONV_2D over a shallow window (the first layer of an image network: 3x3 over RGB is 27 values): see
 * tfmcu_conv2d_shallow_s8 in conv2d.h. */
#include "conv2d.h"
#include "tfmcu_dsp.h"

#define TFMCU_SHALLOW_WORDS (TFMCU_CONV2D_SHALLOW_MAX_DEPTH / 4)

/* The output quantization of a layer, read once, and each channel's short constants (tfmcu_short_quant; right = -1
 * where the short path does not apply: then all_short is 0). */
typedef struct {
  int32_t offset, act_min, act_max;
  int32_t round[TFMCU_CONV2D_SHALLOW_MAX_OUT];
  int32_t right[TFMCU_CONV2D_SHALLOW_MAX_OUT];
  int all_short;
} TfmcuShallowQuant;

static void tfmcu_shallow_quant(const TfmcuConvParams* p, int32_t out_c, TfmcuShallowQuant* q) {
  q->offset = p->output_offset;
  q->act_min = p->act_min;
  q->act_max = p->act_max;
  q->all_short = 1;
  for (int32_t k = 0; k < out_c; ++k) {
    const int32_t m = p->output_multiplier[k], s = p->output_shift[k];
    if (tfmcu_short_quant_ok(m, s)) {
      const TfmcuShortQuant f = tfmcu_short_quant(m, s, p->output_offset);
      q->round[k] = f.round;
      q->right[k] = f.right;
    } else {
      q->round[k] = 0;
      q->right[k] = -1;
      q->all_short = 0;
    }
  }
}

/* A pixel's out_c accumulators into its outputs o. */
static void tfmcu_shallow_store(const TfmcuConvParams* p, const TfmcuShallowQuant* q, const int32_t* acc,
                                int32_t out_c, int8_t* o) {
  if (q->all_short) {
    tfmcu_requantize_short_channels(acc, p->output_multiplier, q->round, q->right, out_c, q->act_min, q->act_max, o);
    return;
  }
  for (int32_t k = 0; k < out_c; ++k) {
    int32_t v;
    if (q->right[k] >= 0) {
      const TfmcuShortQuant f = {p->output_multiplier[k], q->round[k], q->right[k]};
      v = tfmcu_requantize_short(acc[k], f);
    } else {
      v = tfmcu_wrap_add(tfmcu_multiply_by_quantized_multiplier(acc[k], p->output_multiplier[k], p->output_shift[k]),
                         q->offset);
    }
    o[k] = (int8_t)tfmcu_clamp(v, q->act_min, q->act_max);
  }
}

/* The columns of a pair of pixels: per pixel 2 x TFMCU_SHALLOW_WORDS words (the second pixel's right after). */
#define TFMCU_SHALLOW_COL (2 * TFMCU_SHALLOW_WORDS)

/* The products of a pair of filter rows (w: per word of the window the two rows' words, four int8 each) with the
 * columns of two pixels, `words` words each, added to a[0] (row a, pixel 0), a[1] (a, 1), a[2] (b, 0), a[3] (b, 1). */
static inline void tfmcu_shallow_dot(const uint32_t* w, const uint32_t* col, int32_t words, int32_t* a) {
  int32_t a00 = a[0], a01 = a[1], a10 = a[2], a11 = a[3];
#if TFMCU_DSP_ASM
  uint32_t va, vb, x0, x1, t;
  __asm__(
      "1:\n\t"
      "ldrd %[va], %[vb], [%[w]], #8\n\t"
      "ldr %[x0], [%[col], #0]\n\t"
      "ldr %[x1], [%[col], %[c1]]\n\t"
      "sxtb16 %[t], %[va]\n\t"
      "smlad %[a00], %[t], %[x0], %[a00]\n\t"
      "smlad %[a01], %[t], %[x1], %[a01]\n\t"
      "sxtb16 %[t], %[vb]\n\t"
      "smlad %[a10], %[t], %[x0], %[a10]\n\t"
      "smlad %[a11], %[t], %[x1], %[a11]\n\t"
      "ldr %[x0], [%[col], #4]\n\t"
      "ldr %[x1], [%[col], %[c1o]]\n\t"
      "sxtb16 %[t], %[va], ror #8\n\t"
      "smlad %[a00], %[t], %[x0], %[a00]\n\t"
      "smlad %[a01], %[t], %[x1], %[a01]\n\t"
      "sxtb16 %[t], %[vb], ror #8\n\t"
      "smlad %[a10], %[t], %[x0], %[a10]\n\t"
      "smlad %[a11], %[t], %[x1], %[a11]\n\t"
      "add %[col], %[col], #8\n\t"
      "subs %[n], %[n], #1\n\t"
      "bne 1b\n\t"
      : [a00] "+r"(a00), [a01] "+r"(a01), [a10] "+r"(a10), [a11] "+r"(a11), [w] "+r"(w), [col] "+r"(col),
        [n] "+r"(words), [va] "=&r"(va), [vb] "=&r"(vb), [x0] "=&r"(x0), [x1] "=&r"(x1), [t] "=&r"(t)
      : [c1] "I"(4 * TFMCU_SHALLOW_COL), [c1o] "I"(4 * TFMCU_SHALLOW_COL + 4)
      : "cc", "memory");
#else
  for (int32_t j = 0; j < words; ++j, w += 2, col += 2) {
    const uint32_t ae = tfmcu_sxtb16(w[0]), ao = tfmcu_sxtb16_ror8(w[0]);
    const uint32_t be = tfmcu_sxtb16(w[1]), bo = tfmcu_sxtb16_ror8(w[1]);
    const uint32_t x0e = col[0], x0o = col[1], x1e = col[TFMCU_SHALLOW_COL], x1o = col[TFMCU_SHALLOW_COL + 1];
    a00 = tfmcu_smlad(ao, x0o, tfmcu_smlad(ae, x0e, a00));
    a01 = tfmcu_smlad(ao, x1o, tfmcu_smlad(ae, x1e, a01));
    a10 = tfmcu_smlad(bo, x0o, tfmcu_smlad(be, x0e, a10));
    a11 = tfmcu_smlad(bo, x1o, tfmcu_smlad(be, x1e, a11));
  }
#endif
  a[0] = a00;
  a[1] = a01;
  a[2] = a10;
  a[3] = a11;
}

/* The window of the output pixel whose top-left tap is input (iy, ix), as `words` pairs of int16 words (input +
 * offset) in the order SXTB16 splits four filter bytes: (x0, x2) then (x1, x3). A tap outside the input box, and
 * the values past the window's depth up to a multiple of 4, are the byte -input_offset: 0 once the offset is added
 * (tfmcu_conv2d_shallow_covers keeps the offset where that byte exists). */
/* (GCC would turn the word copies into calls of memcpy, slower for the few bytes of a window's row) */
#if defined(__GNUC__) && !defined(__clang__)
#define TFMCU_NO_MEMCPY_CALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define TFMCU_NO_MEMCPY_CALLS
#endif

TFMCU_NO_MEMCPY_CALLS
static void tfmcu_shallow_column(const TfmcuConvParams* p, const TfmcuConstView* in, int32_t iy, int32_t ix,
                                 int32_t words, uint32_t off2, uint32_t* col) {
  /* the window's bytes row after row (each written as whole words: a row's last word runs into the next row, which
   * then overwrites it, or into the slack word) */
  union {
    uint32_t w[TFMCU_SHALLOW_WORDS + 1];
    int8_t b[4 * TFMCU_SHALLOW_WORDS + 4];
  } win;
  const uint32_t pad4 = ((uint32_t)(-p->input_offset) & 0xFFu) * 0x01010101u;
  const int32_t C = in->channels, row = p->kernel_w * C, row_words = (row + 3) / 4;
  const int inside_x = ix >= 0 && ix + p->kernel_w <= in->width;
  int8_t* b = win.b;
  for (int32_t ky = 0; ky < p->kernel_h; ++ky, b += row) {
    const int32_t y = iy + ky;
    if (y < 0 || y >= in->height) {
      for (int32_t i = 0; i < row_words; ++i) {
        memcpy(b + 4 * i, &pad4, 4);
      }
      continue;
    }
    const int8_t* src = in->data + (ptrdiff_t)y * in->row_stride + (ptrdiff_t)ix * C;
    /* whole words may read up to 3 bytes past the row's window: where they stay inside the box's bytes */
    if (inside_x && (ptrdiff_t)y * in->row_stride + (ptrdiff_t)(ix * C + 4 * row_words) <=
                        (ptrdiff_t)(in->height - 1) * in->row_stride + (ptrdiff_t)in->width * C) {
      for (int32_t i = 0; i < row_words; ++i) {
        const uint32_t v = tfmcu_read_s8x4(src + 4 * i);
        memcpy(b + 4 * i, &v, 4);
      }
      continue;
    }
    for (int32_t kx = 0; kx < p->kernel_w; ++kx) {
      const int in_box = ix + kx >= 0 && ix + kx < in->width;
      for (int32_t c = 0; c < C; ++c) {
        b[kx * C + c] = in_box ? src[kx * C + c] : (int8_t)pad4;
      }
    }
  }
  const int32_t depth = p->kernel_h * row;
  if (depth % 4 != 0) { /* the last word's bytes past the window */
    const uint32_t keep = 0xFFFFFFFFu >> (8 * (4 - depth % 4));
    win.w[words - 1] = (win.w[words - 1] & keep) | (pad4 & ~keep);
  }
  for (int32_t j = 0; j < words; ++j) {
    col[2 * j] = tfmcu_sxtab16(off2, win.w[j]);
    col[2 * j + 1] = tfmcu_sxtab16_ror8(off2, win.w[j]);
  }
}

/* The same for a window inside the input box whose rows' whole words stay inside the box's bytes (every pixel but
 * those of the border): src the window's top-left byte, `rows` rows of `row` bytes (`row_words` words read from each),
 * `keep` the mask of the last word's bytes inside the window (0: the depth is a multiple of 4). */
TFMCU_NO_MEMCPY_CALLS
static inline void tfmcu_shallow_column_inside(const int8_t* src, int32_t row_stride, int32_t rows, int32_t row,
                                               int32_t row_words, int32_t words, uint32_t keep, uint32_t pad4,
                                               uint32_t off2, uint32_t* col) {
  union {
    uint32_t w[TFMCU_SHALLOW_WORDS + 1];
    int8_t b[4 * TFMCU_SHALLOW_WORDS + 4];
  } win;
  int8_t* b = win.b;
  for (int32_t ky = 0; ky < rows; ++ky, b += row, src += row_stride) {
    for (int32_t i = 0; i < row_words; ++i) {
      const uint32_t v = tfmcu_read_s8x4(src + 4 * i);
      memcpy(b + 4 * i, &v, 4);
    }
  }
  if (keep != 0) {
    win.w[words - 1] = (win.w[words - 1] & keep) | (pad4 & ~keep);
  }
  for (int32_t j = 0; j < words; ++j) {
    col[2 * j] = tfmcu_sxtab16(off2, win.w[j]);
    col[2 * j + 1] = tfmcu_sxtab16_ror8(off2, win.w[j]);
  }
}

int tfmcu_conv2d_shallow_covers(const TfmcuConvParams* p, int32_t in_channels, int32_t out_channels) {
  return p->groups == 1 && p->dilation_h == 1 && p->dilation_w == 1 &&
         p->kernel_h * p->kernel_w * in_channels <= TFMCU_CONV2D_SHALLOW_MAX_DEPTH &&
         out_channels <= TFMCU_CONV2D_SHALLOW_MAX_OUT && p->input_offset >= -127 && p->input_offset <= 128;
}

TfmcuStatus tfmcu_conv2d_shallow_s8(const TfmcuConvParams* params, const TfmcuConstView* input, int32_t pad_top,
                                    int32_t pad_left, const TfmcuView* output) {
  if (params == NULL || input == NULL || output == NULL || params->filter == NULL ||
      params->output_multiplier == NULL || params->output_shift == NULL) {
    return kTfmcuErrorNullPointer;
  }
  const TfmcuConvParams* p = params;
  const int32_t out_c = output->channels;
  if (!tfmcu_conv2d_shallow_covers(p, input->channels, out_c) || out_c < 1) {
    return kTfmcuErrorShapeMismatch;
  }
  const int32_t depth = p->kernel_h * p->kernel_w * input->channels;
  const int32_t words = (depth + 3) / 4, pairs = (out_c + 1) / 2;
  const uint32_t off2 = ((uint32_t)p->input_offset & 0xFFFFu) * 0x10001u;
  TfmcuShallowQuant q;
  tfmcu_shallow_quant(p, out_c, &q);
  /* Per call, the filter as pairs of rows word by word (zeros past the window's depth; an odd last channel paired
   * with itself) and the bias per channel (0 without one). */
  union {
    uint32_t w[TFMCU_CONV2D_SHALLOW_MAX_OUT * TFMCU_SHALLOW_WORDS];
    int8_t b[4 * TFMCU_CONV2D_SHALLOW_MAX_OUT * TFMCU_SHALLOW_WORDS];
  } packed;
  int32_t bias[TFMCU_CONV2D_SHALLOW_MAX_OUT + 1];
  for (int32_t k = 0; k < 2 * pairs; ++k) {
    const int32_t from = k < out_c ? k : out_c - 1;
    int8_t* to = packed.b + 4 * ((k / 2) * 2 * words + (k % 2));
    for (int32_t i = 0; i < 4 * words; ++i) {
      to[8 * (i / 4) + i % 4] = i < depth ? p->filter[(ptrdiff_t)from * depth + i] : 0;
    }
    bias[k] = p->bias != NULL ? p->bias[from] : 0;
  }
  uint32_t col[2 * TFMCU_SHALLOW_COL];
  /* the window of an inner pixel: rows of `row` bytes, `row_words` words read from each; its last row's words end at
   * most `last_word_end` bytes past the box's first (then inside the box's bytes) */
  const int32_t C = input->channels, row = p->kernel_w * C, row_words = (row + 3) / 4;
  const uint32_t pad4 = ((uint32_t)(-p->input_offset) & 0xFFu) * 0x01010101u;
  const uint32_t keep = depth % 4 != 0 ? 0xFFFFFFFFu >> (8 * (4 - depth % 4)) : 0u;
  const ptrdiff_t last_word_end = (ptrdiff_t)(input->height - 1) * input->row_stride + (ptrdiff_t)input->width * C;
  int32_t acc[2][TFMCU_CONV2D_SHALLOW_MAX_OUT + 1];
  /* the output pixels two at a time in row-major order (a pair may span two rows), as arm_convolve_s8 runs them */
  const int32_t pixels = output->height * output->width;
  for (int32_t i = 0; i < pixels; i += 2) {
    const int two = i + 1 < pixels;
    const int32_t y0 = i / output->width, x0 = i % output->width;
    const int32_t y1 = (i + 1) / output->width, x1 = (i + 1) % output->width;
    int8_t* o0 = output->data + (ptrdiff_t)y0 * output->row_stride + (ptrdiff_t)x0 * out_c;
    int8_t* o1 = output->data + (ptrdiff_t)y1 * output->row_stride + (ptrdiff_t)x1 * out_c;
    for (int32_t j = 0; j < 1 + two; ++j) {
      const int32_t iy = (j ? y1 : y0) * p->stride_h - pad_top, ix = (j ? x1 : x0) * p->stride_w - pad_left;
      uint32_t* cj = col + j * TFMCU_SHALLOW_COL;
      if (iy >= 0 && ix >= 0 && iy + p->kernel_h <= input->height && ix + p->kernel_w <= input->width &&
          (ptrdiff_t)(iy + p->kernel_h - 1) * input->row_stride + (ptrdiff_t)ix * C + 4 * row_words <=
              last_word_end) {
        tfmcu_shallow_column_inside(input->data + (ptrdiff_t)iy * input->row_stride + (ptrdiff_t)ix * C,
                                    input->row_stride, p->kernel_h, row, row_words, words, keep, pad4, off2, cj);
      } else {
        tfmcu_shallow_column(p, input, iy, ix, words, off2, cj);
      }
    }
    if (!two) { /* (the products of the second column are not stored) */
      memcpy(col + TFMCU_SHALLOW_COL, col, sizeof(uint32_t) * 2 * (size_t)words);
    }
    const uint32_t* w = packed.w;
    for (int32_t k = 0; k < 2 * pairs; k += 2, w += 2 * words) {
      int32_t a[4] = {bias[k], bias[k], bias[k + 1], bias[k + 1]};
      tfmcu_shallow_dot(w, col, words, a);
      acc[0][k] = a[0];
      acc[1][k] = a[1];
      acc[0][k + 1] = a[2];
      acc[1][k + 1] = a[3];
    }
    tfmcu_shallow_store(p, &q, acc[0], out_c, o0);
    if (two) {
      tfmcu_shallow_store(p, &q, acc[1], out_c, o1);
    }
  }
  return kTfmcuOk;
}
