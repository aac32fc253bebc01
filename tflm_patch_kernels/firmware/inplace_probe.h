/* The in-place probe's case record (inplace_probe.c; the cases come from gen_inplace_probe.py). */
#ifndef TFMCU_FIRMWARE_INPLACE_PROBE_H_
#define TFMCU_FIRMWARE_INPLACE_PROBE_H_

#include <stdint.h>

typedef enum {
  kProbeConv = 0,
  kProbeDepthwise = 1,
  kProbeAvgPool = 2,
  kProbeMaxPool = 3,
  kProbeAdd = 4,
  kProbeMul = 5
} ProbeKind;

/* The call under test: TFLM's kernels/cmsis_nn call (arm_*_s8 / *_wrapper_s8 as TFLM makes it), or the patch
 * backend's run on whole, dense tensors (a one-layer TFMCU_PATCH_STAGE op). */
/* TFLM's call, the patch backend's run, or the backend's run of a 1x1 convolution with its input offset folded into
 * its bias (input offset 0: our product without per-call filter sums, cmsis_nn/conv2d_cmsis_nn.c) */
typedef enum { kProbeViaTflm = 0, kProbeViaBackend = 1, kProbeViaBackendFolded = 2 } ProbeVia;

typedef struct {
  const char* name;
  int32_t kind;  /* ProbeKind */
  int32_t via;   /* ProbeVia */
  int32_t in_h, in_w, in_c;
  int32_t out_h, out_w, out_c;
  int32_t kernel_h, kernel_w;
  int32_t stride_h, stride_w;
  int32_t pad_top, pad_left;
  int32_t overlapped;  /* ADD, MUL: which input the output overlaps (1 or 2); 1 otherwise */
  int32_t distance;    /* bytes the output starts before the overlapped input: tfmcu.plan.memory_plan's D */
  int32_t slack;       /* one of distance - 1 ... distance - slack must change the output (when >= 0) */
  int32_t reference_distance; /* what TFLM's reference kernels allow (-1: none) */
  const int8_t* input;
  const int8_t* input2;
  const int8_t* filter;
  const int32_t* bias;
  const int32_t* multiplier;
  const int32_t* shift;
} ProbeCase;

/* inplace_probe_cases.c (generated) */
extern const ProbeCase kProbeCases[];
extern const int32_t kProbeNumCases;

#endif  /* TFMCU_FIRMWARE_INPLACE_PROBE_H_ */
