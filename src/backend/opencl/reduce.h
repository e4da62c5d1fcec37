/* reduce.h (opencl) — the device's reductions, norms, losses, pooling and
 * embeddings (their kernels are the fr_cl_k_<name> of backend.h, defined in
 * reduce.c), and two whole-tensor passes of the training step: the sum of
 * squares of a gradient (clipping) and the count of correct predictions. */
#ifndef FR_CL_REDUCE_H
#define FR_CL_REDUCE_H

#include <stdint.h>
#include "backend/opencl/backend.h"

/* *out = sum of x^2 over the n f32 values of m from element off_elems, in
 * double where the device has cl_khr_fp64 (float otherwise), in the blocks
 * and order of fr_k_grad_sumsq. Waits for the result. Its scratch (8 bytes
 * a 2048-value block) comes from the device's memory (ctx must use the
 * device: fr_cl_use). */
int fr_cl_sumsq(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off_elems, size_t n, double *out);
/* The same over n values of dtype dt (f32, or f16/bf16 widened exactly, as
 * fr_k_grad_sumsq reads a 16-bit gradient). */
int fr_cl_grad_sumsq(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off_elems, fr_dtype dt, size_t n,
                     double *out);

/* *hits = the rows i of logits (N,K) f32 whose first maximum (strict >, as
 * step.c's count_hits) is at labels[i] (i32). Offsets in elements. Waits for
 * the result; 8 bytes of scratch from the device's memory. */
int fr_cl_hits(fr_ctx *ctx, fr_cl *cl, cl_mem logits, size_t logits_off, cl_mem labels,
               size_t labels_off, int N, int K, int64_t *hits);

#endif
