/* pending_attn_optim.c — the ops of this group that have no OpenCL kernel yet:
 * each fails with a message naming it. The group's owner deletes a
 * definition when its kernel lands, and this file when none is left. */
#include "backend/opencl/backend.h"

static int pending(fr_kernel_call *c, const char *name) {
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s has no kernel yet", name);
}

int fr_cl_k_attention(fr_kernel_call *c) { return pending(c, "attention"); }
int fr_cl_k_attention_bwd(fr_kernel_call *c) { return pending(c, "attention_bwd"); }
int fr_cl_k_optim_step(fr_kernel_call *c) { return pending(c, "optim_step"); }
