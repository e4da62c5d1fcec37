/* offload.c — OFFLOAD and FETCH on an OpenCL device: a saved activation
 * read from the step's arena buffer into its host block after forward, and
 * written back into a fresh arena value before its backward reader
 * (plan/offload.c inserts them). The queue is in order, so the read sees
 * every kernel enqueued before it and the kernels after the write see its
 * bytes; both transfers are blocking (the host block is plain memory, not a
 * mapped or pinned buffer, and must not be touched while a copy is under
 * way), so an offloaded step trades its saved bytes for two transfers and
 * the waits they imply. */
#include "backend/opencl/backend.h"

// in: x on the device (buf, off) -> out: h in host memory (data)
int fr_cl_k_offload(fr_kernel_call *c) {
    return fr_cl_read(c->ctx, fr_cl_of(c->ctx), fr_cl_mem(&c->in[0]), c->in[0].off, c->out[0].data,
                      fr_tensor_bytes(&c->in[0]));
}

// in: h in host memory (data) -> out: x' on the device (buf, off)
int fr_cl_k_fetch(fr_kernel_call *c) {
    return fr_cl_write(c->ctx, fr_cl_of(c->ctx), fr_cl_mem(&c->out[0]), c->out[0].off,
                       c->in[0].data, fr_tensor_bytes(&c->in[0]));
}
