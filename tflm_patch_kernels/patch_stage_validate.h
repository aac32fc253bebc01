/* Patch-stage validation (patch_stage_validate.c): the check of a stage description (patch_stage_types.h) that
 * tfmcu_stage_prepare (patch_stage.h) runs once, and the buffer sizes that follow from its tables. */
#ifndef TFMCU_PATCH_KERNELS_PATCH_STAGE_VALIDATE_H_
#define TFMCU_PATCH_KERNELS_PATCH_STAGE_VALIDATE_H_

#include <stddef.h>

#include "patch_stage_types.h"
#include "tfmcu_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The scratch bytes the stage touches, computed from the tables (0 for an invalid stage). */
size_t tfmcu_stage_scratch_bytes(const TfmcuStage* stage);

/* Checks the whole description (ids, types, channels, span arithmetic and border rules, reads inside the held
 * boxes, full coverage of the output, non-overlap of live patch buffers, scratch_bytes; halo caches: held boxes
 * that end where the computed ones do and begin where the cache can fill them, growing band after band, caches
 * disjoint from each other and from every patch buffer). On failure returns
 * kTfmcuErrorInvalidStage (or kTfmcuErrorNullPointer / kTfmcuErrorUnsupportedOp) and, if failed_layer is not NULL,
 * stores the offending layer index there (-1 when the problem is not one layer's). */
TfmcuStatus tfmcu_stage_check(const TfmcuStage* stage, int32_t* failed_layer);

/* The stage a stage blob describes (patch_stage_types.h), `bytes` long at `blob` (4-byte aligned): fills *stage with
 * its counts and pointers to its tables inside the blob, after checking only what that needs (the header's size
 * word, every table inside the blob and aligned: a few comparisons, cheap enough to repeat before every run);
 * the stage itself is checked by tfmcu_stage_check / tfmcu_stage_prepare. Returns kTfmcuOk, kTfmcuErrorNullPointer
 * or kTfmcuErrorInvalidStage (then *stage is all zero). */
TfmcuStatus tfmcu_stage_view(const void* blob, size_t bytes, TfmcuStage* stage);

/* Bytes of the output buffer: height * width * channels of the output tensor (0 for an invalid stage). */
size_t tfmcu_stage_output_bytes(const TfmcuStage* stage);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* TFMCU_PATCH_KERNELS_PATCH_STAGE_VALIDATE_H_ */
