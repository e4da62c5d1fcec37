/* offload.c — OFFLOAD and FETCH on an OpenCL device: a saved activation
 * read from the step's arena buffer into its host block after forward, and
 * written back into a fresh arena value before its backward reader
 * (plan/offload.c inserts them and places each FETCH ahead of its reader).
 *
 * The copies run on a copy queue of their own beside the step's queue, so
 * kernels go on while bytes move:
 *   - each copy waits for a marker of the step's queue enqueued where the
 *     node stands in the order: an OFFLOAD reads its value only once the
 *     kernels before it (its producer) are done; a FETCH writes its arena
 *     slot only once the kernels before it (the slot's previous users) are;
 *   - the copy queue is in order: a FETCH of a host value follows its
 *     OFFLOAD, and the next step's OFFLOAD into the host block follows this
 *     step's FETCH from it, so the host block is never written while a copy
 *     reads it, and never read before it is written;
 *   - the step's queue waits for a copy's event (fr_cl_wait_copy, called by
 *     the executor at the position fr_offload_waits gives) only before the
 *     fetched value's first reader, or before the first kernel that makes a
 *     value in an offloaded value's arena slot: a slot is free for reuse
 *     only once its OFFLOAD has read it.
 * The host block is ordinary host memory (the accounting allocator's, in the
 * host's activations); OpenCL allows a non-blocking transfer to or from it
 * as long as the host does not touch it in flight, which nothing does. On a
 * GPU, pinned memory (CL_MEM_ALLOC_HOST_PTR, mapped) would copy faster; on
 * PoCL, a CPU device, it would change nothing. Without an event slot (no
 * executor asked for one) both copies are blocking on the step's queue. */
#include "backend/opencl/backend.h"

/* The marker of everything enqueued on the step's queue so far, submitted so
 * that the copy queue may wait on it. */
static int step_marker(fr_ctx *ctx, fr_cl *cl, cl_event *m) {
    int st = fr_cl_mark(ctx, cl, m);
    if (!st && (st = fr_cl_flush(ctx, cl))) {
        clReleaseEvent(*m);
        *m = NULL;
    }
    return st;
}

// in: x on the device (buf, off) -> out: h in host memory (data)
int fr_cl_k_offload(fr_kernel_call *c) {
    fr_cl *cl = fr_cl_of(c->ctx);
    size_t n = fr_tensor_bytes(&c->in[0]);
    if (!c->copy_event)
        return fr_cl_read(c->ctx, cl, fr_cl_mem(&c->in[0]), c->in[0].off, c->out[0].data, n);
    cl_command_queue q;
    cl_event m = NULL;
    int st = fr_cl_copy_queue(c->ctx, cl, &q);
    if (!st) st = step_marker(c->ctx, cl, &m);
    if (!st)
        st = fr_cl_read_on(c->ctx, q, fr_cl_mem(&c->in[0]), c->in[0].off, c->out[0].data, n, 1, &m,
                           (cl_event *)c->copy_event);
    if (m) clReleaseEvent(m);
    return st;
}

// in: h in host memory (data) -> out: x' on the device (buf, off)
int fr_cl_k_fetch(fr_kernel_call *c) {
    fr_cl *cl = fr_cl_of(c->ctx);
    size_t n = fr_tensor_bytes(&c->in[0]);
    if (!c->copy_event)
        return fr_cl_write(c->ctx, cl, fr_cl_mem(&c->out[0]), c->out[0].off, c->in[0].data, n);
    cl_command_queue q;
    cl_event m = NULL;
    int st = fr_cl_copy_queue(c->ctx, cl, &q);
    if (!st) st = step_marker(c->ctx, cl, &m);
    if (!st)
        st = fr_cl_write_on(c->ctx, q, fr_cl_mem(&c->out[0]), c->out[0].off, c->in[0].data, n, 1,
                            &m, (cl_event *)c->copy_event);
    if (m) clReleaseEvent(m);
    return st;
}

int fr_cl_wait_copy(fr_ctx *ctx, void *event) {
    cl_event ev = event;
    int st = fr_cl_wait_for(ctx, fr_cl_of(ctx), 1, &ev);
    clReleaseEvent(ev);
    return st;
}
