/* backend.h (opencl) — the OpenCL backend behind the seam of
 * src/backend/backend.h: its kernel table (one fr_cl_k_<name> per op of
 * FR_OPS, declared here, defined in gemm.c, elementwise.c, reduce.c,
 * attention.c and optim.c), its workspace sizes, and the device's memory,
 * accounted in an fr_mem of its own. A context uses it after fr_cl_use. */
#ifndef FR_CL_BACKEND_H
#define FR_CL_BACKEND_H

#include "backend/backend.h"
#include "backend/opencl/runtime.h"
#include "ops/ops.h"

/* What ctx->dev holds while a context runs on an OpenCL device. */
typedef struct fr_cl_state {
    fr_cl *cl;
    fr_mem mem; /* the device's memory: its own stats, limit, cache */
} fr_cl_state;

static inline fr_cl *fr_cl_of(fr_ctx *ctx) { return ((fr_cl_state *)ctx->dev)->cl; }
static inline fr_mem *fr_cl_memory(fr_ctx *ctx) { return &((fr_cl_state *)ctx->dev)->mem; }
static inline cl_mem fr_cl_mem(const fr_tensor *t) { return (cl_mem)t->buf; }
/* The tensor's offset in elements of its dtype (offsets are 64-byte multiples). */
static inline size_t fr_cl_off(const fr_tensor *t) { return t->off / fr_dtype_size(t->dtype); }

#define FR_CL_DECL(NAME, name, nin, nout) int fr_cl_k_##name(fr_kernel_call *c);
FR_OPS(FR_CL_DECL)
#undef FR_CL_DECL

/* fr_backend.wait_copy (offload.c): the step's queue waits for an OFFLOAD's
 * or FETCH's copy event, released here. */
int fr_cl_wait_copy(fr_ctx *ctx, void *event);

extern const fr_backend fr_cl_backend;

/* Run ctx on OpenCL device `index` (fr_cl_count's order): opens it, makes its
 * memory, and sets ctx->be and ctx->dev. fr_cl_unuse closes it (every buffer
 * must have been released). */
int fr_cl_use(fr_ctx *ctx, int index);
void fr_cl_unuse(fr_ctx *ctx);

#endif
