/* pending_reduce.c — the ops of this group that have no OpenCL kernel yet:
 * each fails with a message naming it. The group's owner deletes a
 * definition when its kernel lands, and this file when none is left. */
#include "backend/opencl/backend.h"

static int pending(fr_kernel_call *c, const char *name) {
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s has no kernel yet", name);
}

int fr_cl_k_batchnorm(fr_kernel_call *c) { return pending(c, "batchnorm"); }
int fr_cl_k_batchnorm_bwd(fr_kernel_call *c) { return pending(c, "batchnorm_bwd"); }
int fr_cl_k_layernorm(fr_kernel_call *c) { return pending(c, "layernorm"); }
int fr_cl_k_layernorm_bwd(fr_kernel_call *c) { return pending(c, "layernorm_bwd"); }
int fr_cl_k_cross_entropy(fr_kernel_call *c) { return pending(c, "cross_entropy"); }
int fr_cl_k_cross_entropy_bwd(fr_kernel_call *c) { return pending(c, "cross_entropy_bwd"); }
int fr_cl_k_mse(fr_kernel_call *c) { return pending(c, "mse"); }
int fr_cl_k_mse_bwd(fr_kernel_call *c) { return pending(c, "mse_bwd"); }
int fr_cl_k_maxpool2d(fr_kernel_call *c) { return pending(c, "maxpool2d"); }
int fr_cl_k_maxpool2d_bwd(fr_kernel_call *c) { return pending(c, "maxpool2d_bwd"); }
int fr_cl_k_avgpool2d(fr_kernel_call *c) { return pending(c, "avgpool2d"); }
int fr_cl_k_avgpool2d_bwd(fr_kernel_call *c) { return pending(c, "avgpool2d_bwd"); }
int fr_cl_k_global_avgpool(fr_kernel_call *c) { return pending(c, "global_avgpool"); }
int fr_cl_k_global_avgpool_bwd(fr_kernel_call *c) { return pending(c, "global_avgpool_bwd"); }
int fr_cl_k_embedding(fr_kernel_call *c) { return pending(c, "embedding"); }
int fr_cl_k_embedding_bwd(fr_kernel_call *c) { return pending(c, "embedding_bwd"); }
int fr_cl_k_pos_embedding_bwd(fr_kernel_call *c) { return pending(c, "pos_embedding_bwd"); }
