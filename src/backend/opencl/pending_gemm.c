/* pending_gemm.c — the ops of this group that have no OpenCL kernel yet:
 * each fails with a message naming it. The group's owner deletes a
 * definition when its kernel lands, and this file when none is left. */
#include "backend/opencl/backend.h"

static int pending(fr_kernel_call *c, const char *name) {
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s has no kernel yet", name);
}

int fr_cl_k_linear(fr_kernel_call *c) { return pending(c, "linear"); }
int fr_cl_k_linear_bwd(fr_kernel_call *c) { return pending(c, "linear_bwd"); }
int fr_cl_k_conv2d(fr_kernel_call *c) { return pending(c, "conv2d"); }
int fr_cl_k_conv2d_bwd(fr_kernel_call *c) { return pending(c, "conv2d_bwd"); }
