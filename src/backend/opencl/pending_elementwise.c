/* pending_elementwise.c — the ops of this group that have no OpenCL kernel yet:
 * each fails with a message naming it. The group's owner deletes a
 * definition when its kernel lands, and this file when none is left. */
#include "backend/opencl/backend.h"

static int pending(fr_kernel_call *c, const char *name) {
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s has no kernel yet", name);
}

int fr_cl_k_relu(fr_kernel_call *c) { return pending(c, "relu"); }
int fr_cl_k_relu_bwd(fr_kernel_call *c) { return pending(c, "relu_bwd"); }
int fr_cl_k_gelu(fr_kernel_call *c) { return pending(c, "gelu"); }
int fr_cl_k_gelu_bwd(fr_kernel_call *c) { return pending(c, "gelu_bwd"); }
int fr_cl_k_sigmoid(fr_kernel_call *c) { return pending(c, "sigmoid"); }
int fr_cl_k_sigmoid_bwd(fr_kernel_call *c) { return pending(c, "sigmoid_bwd"); }
int fr_cl_k_tanh(fr_kernel_call *c) { return pending(c, "tanh"); }
int fr_cl_k_tanh_bwd(fr_kernel_call *c) { return pending(c, "tanh_bwd"); }
int fr_cl_k_add(fr_kernel_call *c) { return pending(c, "add"); }
int fr_cl_k_copy(fr_kernel_call *c) { return pending(c, "copy"); }
int fr_cl_k_cast(fr_kernel_call *c) { return pending(c, "cast"); }
int fr_cl_k_dropout(fr_kernel_call *c) { return pending(c, "dropout"); }
int fr_cl_k_dropout_bwd(fr_kernel_call *c) { return pending(c, "dropout_bwd"); }
int fr_cl_k_pos_embedding(fr_kernel_call *c) { return pending(c, "pos_embedding"); }
