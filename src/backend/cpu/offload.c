/* offload.c — OFFLOAD and FETCH on the CPU: the saved value's bytes copied
 * between the step's arena and the host block that holds it between forward
 * and backward (plan/offload.c inserts them). Any dtype: a copy of bytes. */
#include <string.h>
#include "backend/cpu/kernels.h"

// x and h have the same shape and dtype; bytes = numel * dtype size
int fr_k_offload(fr_kernel_call *c) {
    memcpy(c->out[0].data, c->in[0].data, fr_tensor_bytes(&c->in[0]));
    return 0;
}

int fr_k_fetch(fr_kernel_call *c) {
    memcpy(c->out[0].data, c->in[0].data, fr_tensor_bytes(&c->in[0]));
    return 0;
}
