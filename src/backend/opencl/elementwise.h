/* elementwise.h — the elementwise group's entry points beyond the op table
 * (whose fr_cl_k_relu ... fr_cl_k_pos_embedding backend.h declares): the
 * training step's whole-gradient passes on a device buffer, as the CPU's
 * fr_k_grad_scale and fr_k_grad_unscale (src/backend/cpu/grad.c): on f32,
 * or on f16/bf16 (pure half precision) widened, worked in f32 and rounded
 * back to nearest even, as the CPU does. */
#ifndef FR_CL_ELEMENTWISE_H
#define FR_CL_ELEMENTWISE_H

#include <stddef.h>

#include "backend/opencl/runtime.h"

/* g[off + i] *= f for i in [0, n), g of dtype dt (f32, f16, bf16), off in
 * elements. Enqueued, not waited for. fr_cl_scale: dt f32. */
int fr_cl_grad_scale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, fr_dtype dt, size_t n, float f);
int fr_cl_scale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, size_t n, float f);

/* g[off + i] *= inv for i in [0, n), g of dtype dt, off in elements;
 * *found_inf = 1 when any value read was inf or NaN (the loss scaler then
 * skips the step), else 0. Waits: reads the flag back (from a 4-byte buffer
 * it makes and releases). fr_cl_unscale_check: dt f32. */
int fr_cl_grad_unscale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, fr_dtype dt, size_t n,
                       float inv, int *found_inf);
int fr_cl_unscale_check(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, size_t n, float inv,
                        int *found_inf);

#endif
