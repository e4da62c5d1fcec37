/* exec.h — runs a planned graph on the context's backend. It knows kernels and
 * pointers, nothing of policy: the plan says where each value lives and when
 * it is born and dies; the executor binds pointers, calls each node's kernel
 * from the backend's table (an OPTIM_STEP's step is the optimizer's, through
 * param_step) and reports the plan's events to the allocator. */
#ifndef FR_EXEC_H
#define FR_EXEC_H

#include "ops/ops.h"
#include "plan/plan.h"

typedef struct fr_exec {
    fr_ctx *ctx;
    fr_graph *g;
    fr_plan *plan;
    const struct fr_backend *be; /* the context's backend */
    const fr_kernel_fn *kernels; /* and its table */
    char *arena;                 /* fr_arena_alloc'd, plan->arena_bytes (on a device: its handle) */
    char *host;                  /* the host block of offloaded values (fr_offload_host_place) */
    void **ptr;                  /* per value: bound host storage (params, grads, batch, arena) */
    void **buf;                  /* on a device backend, per value: the buffer holding it */
    size_t *off;                 /* and its byte offset there (fr_exec_bind_dev) */
    uint8_t *written;            /* per FR_VAL_GRAD value: already holds a gradient this step */
    float *grad_ws;              /* the kernels' scratch (fr_kernel_call.grad_ws and gemm_ws) */
    size_t grad_ws_len;
    void *gemm_ws;
    size_t gemm_ws_len;
    /* An OPTIM_STEP node, which no backend has a kernel for: the optimizer
     * steps parameter node->attr.param (bound in place as out[0]) from its
     * gradient grad, in[0] as a kernel would see it; the step sets it
     * (train/step.c), with param_arg. A failure stops the run. */
    fr_status (*param_step)(void *arg, const fr_node *node, const fr_tensor *grad);
    void *param_arg;
    /* A backend whose copies run beside its kernels (fr_backend.wait_copy):
     * per position, the event of the OFFLOAD or FETCH there until waited
     * for; and per position, the copies waited for before its node runs,
     * wait[wait_start[i] .. wait_start[i+1]) (fr_offload_waits; position
     * n_nodes: the end of the step). NULL elsewhere. */
    void **copy_ev;
    int *wait_start, *wait;
    /* Called after the node at each plan position has run (NULL: none):
     * data parallelism starts a gradient bucket's sum once its last writer
     * has run; a failure stops the run with its status. pre_node, called
     * with the same arg before the node's inputs are read, may rebind them
     * (ZeRO 3 gathers a unit's weights there). */
    fr_status (*post_node)(void *arg, int pos);
    fr_status (*pre_node)(void *arg, int pos);
    void *post_arg;
} fr_exec;

fr_status fr_exec_init(fr_exec *e, fr_graph *g, fr_plan *plan);
void fr_exec_release(fr_exec *e);
/* Bind value v to host storage p. */
void fr_exec_bind(fr_exec *e, int v, void *p);
/* Bind value v to a buffer of the backend's memory at byte off (a device's
 * handle; the host's pointer on the CPU). */
void fr_exec_bind_dev(fr_exec *e, int v, void *buf, size_t off);
/* Value v as a kernel sees it (.data on the host; .buf and .off on a
 * device), and n bytes of it from byte off read to the host. */
fr_tensor fr_exec_tensor(const fr_exec *e, int v);
fr_status fr_exec_read(const fr_exec *e, int v, size_t off, void *dst, size_t n);
/* Run the nodes at plan positions [from, to) with batch size n (<= the compiled batch). */
fr_status fr_exec_run(fr_exec *e, int from, int to, int n, uint64_t seed, uint64_t step);
/* Apply the end-of-step events (kept values die). */
void fr_exec_finish(fr_exec *e);

#endif
