/* planner.h — what the planner (planner.c) tells beyond step.h: how
 * --precision auto weighs bf16-mixed against fp32. */
#ifndef FR_RUN_PLANNER_H
#define FR_RUN_PLANNER_H

#include "train/step.h"

/* bf16-mixed's step time less fp32's, as a share of the fp32 step:
 *   cost = cast_share - linear_share (1 - f32 / bf16),  0 term when bf16 is 0.
 * The same for a step built in either precision (its FLOPs are the same). */
typedef struct fr_mixed_estimate {
    double linear_share; /* the share of the step's FLOPs (clones not counted) in products
                          bf16-mixed runs natively: linear, quantized linear, fused head's
                          GEMMs, and convolutions and attention where fr_backend.native16 */
    double f32, bf16;    /* GEMM GFLOP/s weighed; bf16 0: no native bf16 GEMM (none measured) */
    int from_env;        /* 1: the rates are FRUGAL_GEMM_RATES's; 0: fr_gemm_probe's, or none */
    double cast_share;   /* the casts' share of the fp32 step (measured, planner.c) */
    double cost;
} fr_mixed_estimate;

/* The estimate for s's graph at the rates of the host (or FRUGAL_GEMM_RATES
 * "F32,BF16" in GFLOP/s; the host's are measured once per process, about
 * 0.2 s, and only where the backend has a native bf16 GEMM). */
void fr_plan_mixed_estimate(const fr_step *s, fr_mixed_estimate *e);

#endif
