/* exec.c — the executor (see exec.h). */
#include <string.h>
#include "backend/backend.h"
#include "exec/exec.h"
#include "plan/offload.h"

/* The copies' events and where the step waits for each (exec.h): the
 * positions fr_offload_waits gives, listed per position. */
static int copy_waits(fr_exec *e) {
    fr_ctx *ctx = e->ctx;
    int n = e->plan->n_nodes, m = 0;
    int *at = fr_alloc(ctx, (size_t)(n + 1) * sizeof *at, FR_MEM_OTHER);
    e->copy_ev = fr_calloc(ctx, (size_t)(n + 1) * sizeof *e->copy_ev, FR_MEM_OTHER);
    e->wait_start = fr_calloc(ctx, (size_t)(n + 2) * sizeof *e->wait_start, FR_MEM_OTHER);
    if (!at || !e->copy_ev || !e->wait_start) {
        fr_free(ctx, at);
        return FR_ERR_NOMEM;
    }
    fr_offload_waits(e->g, e->plan, at);
    for (int i = 0; i < n; i++)
        if (at[i] >= 0) e->wait_start[at[i] + 1]++, m++;
    for (int i = 0; i <= n; i++) e->wait_start[i + 1] += e->wait_start[i];
    e->wait = fr_alloc(ctx, (size_t)(m + 1) * sizeof *e->wait, FR_MEM_OTHER);
    if (e->wait) {
        int *fill = fr_alloc(ctx, (size_t)(n + 1) * sizeof *fill, FR_MEM_OTHER);
        if (fill) {
            memcpy(fill, e->wait_start, (size_t)(n + 1) * sizeof *fill);
            for (int i = 0; i < n; i++) /* in position order: the earlier copy first */
                if (at[i] >= 0) e->wait[fill[at[i]]++] = i;
            fr_free(ctx, fill);
        } else {
            fr_free(ctx, e->wait);
            e->wait = NULL;
        }
    }
    fr_free(ctx, at);
    return e->wait ? FR_OK : FR_ERR_NOMEM;
}

/* Wait for the copy enqueued at position q, if it is still pending. */
static fr_status wait_copy(fr_exec *e, int q) {
    void *ev = e->copy_ev[q];
    if (!ev) return FR_OK;
    e->copy_ev[q] = NULL;
    return (fr_status)e->be->wait_copy(e->ctx, ev);
}

/* The step's queue waits for the copies the plan says must be done before
 * position i (n_nodes: the end of the step). */
static fr_status wait_copies(fr_exec *e, int i) {
    fr_status st = FR_OK;
    for (int k = e->wait_start[i]; k < e->wait_start[i + 1] && !st; k++)
        st = wait_copy(e, e->wait[k]);
    return st;
}

/* Every copy still pending (a run that failed, or the end): waited for. */
static void drain_copies(fr_exec *e) {
    for (int q = 0; q <= e->plan->n_nodes; q++) (void)wait_copy(e, q);
}

fr_status fr_exec_init(fr_exec *e, fr_graph *g, fr_plan *plan) {
    fr_ctx *ctx = g->ctx;
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->g = g;
    e->plan = plan;
    e->kernels = fr_backend_of(ctx)->kernels;
    e->be = fr_backend_of(ctx);
    e->ptr = fr_calloc(ctx, g->n_vals * sizeof *e->ptr, FR_MEM_OTHER);
    e->written = fr_calloc(ctx, g->n_vals, FR_MEM_OTHER);
    if (!e->ptr || !e->written) goto fail;
    if (fr_backend_is_device(e->be)) { /* its tensors are .buf and .off, not pointers */
        e->buf = fr_calloc(ctx, g->n_vals * sizeof *e->buf, FR_MEM_OTHER);
        e->off = fr_calloc(ctx, g->n_vals * sizeof *e->off, FR_MEM_OTHER);
        if (!e->buf || !e->off) goto fail;
    }
    if (plan->arena_bytes) {
        fr_mem_set_tag(ctx, "arena");
        e->arena = e->be->arena_alloc(ctx, plan->arena_bytes);
        if (!e->arena) goto fail;
    }
    /* values offloaded between forward and backward: one host block for
     * the step, in the host's activations (on every backend) */
    size_t host_bytes = fr_offload_host_place(g, NULL, NULL);
    if (host_bytes) {
        fr_mem_set_tag(ctx, "offload");
        if (!(e->host = fr_alloc(ctx, host_bytes, FR_MEM_ACTIVATIONS))) goto fail;
        fr_offload_host_place(g, e->host, e->ptr);
        if (e->be->wait_copy && copy_waits(e)) goto fail;
    }
    for (size_t v = 0; v < g->n_vals; v++) {
        if (plan->offset[v] < 0) continue;
        fr_exec_bind_dev(e, (int)v, e->arena, (size_t)plan->offset[v]);
    }
    return FR_OK;
fail:
    fr_exec_release(e);
    return FR_ERR_NOMEM;
}

void fr_exec_release(fr_exec *e) {
    if (!e->ctx) return;
    if (e->copy_ev) { /* no copy may still use the arena or the host block */
        drain_copies(e);
        e->be->finish(e->ctx);
    }
    fr_free(e->ctx, e->copy_ev);
    fr_free(e->ctx, e->wait_start);
    fr_free(e->ctx, e->wait);
    if (e->arena) e->be->arena_free(e->ctx, e->arena);
    fr_free(e->ctx, e->host);
    fr_free(e->ctx, e->buf);
    fr_free(e->ctx, e->off);
    fr_free(e->ctx, e->ptr);
    fr_free(e->ctx, e->written);
    memset(e, 0, sizeof *e);
}

static void apply_events(fr_exec *e, int i) {
    const fr_plan *p = e->plan;
    for (int k = p->ev_start[i]; k < p->ev_start[i + 1]; k++) {
        int ev = p->ev[k], v = (ev > 0 ? ev : -ev) - 1;
        int64_t b = (int64_t)fr_value_bytes(&e->g->vals[v]);
        e->be->track(e->ctx, p->cat[v], ev > 0 ? b : -b);
    }
}

static fr_tensor bind(const fr_exec *e, int v, int n) {
    fr_tensor t = {0};
    if (v < 0) return t;
    const fr_value *val = &e->g->vals[v];
    t.dtype = val->dtype;
    t.shape = val->shape;
    if (val->batched) t.shape.d[0] = n;
    t.data = e->ptr[v];
    if (e->buf) {
        t.buf = e->buf[v];
        t.off = e->off[v];
    }
    return t;
}

void fr_exec_bind(fr_exec *e, int v, void *p) { e->ptr[v] = p; }

void fr_exec_bind_dev(fr_exec *e, int v, void *buf, size_t off) {
    if (!e->buf) { /* host memory: the handle is the pointer */
        e->ptr[v] = buf ? (char *)buf + off : NULL;
        return;
    }
    e->buf[v] = buf;
    e->off[v] = off;
}

fr_tensor fr_exec_tensor(const fr_exec *e, int v) {
    const fr_value *x = &e->g->vals[v];
    fr_tensor t = {.dtype = x->dtype, .shape = x->shape, .data = e->ptr[v]};
    if (e->buf) t.buf = e->buf[v], t.off = e->off[v];
    return t;
}

fr_status fr_exec_read(const fr_exec *e, int v, size_t off, void *dst, size_t n) {
    if (e->buf) return e->be->read(e->ctx, e->buf[v], e->off[v] + off, dst, n);
    memcpy(dst, (const char *)e->ptr[v] + off, n);
    return FR_OK;
}

fr_status fr_exec_run(fr_exec *e, int from, int to, int n, uint64_t seed, uint64_t step) {
    fr_graph *g = e->g;
    fr_status st0;
    for (int i = from; i < to; i++) {
        const fr_node *node = &g->nodes[e->plan->order[i]];
        const fr_op_info *info = fr_op_get(node->op);
        if (e->pre_node) {
            fr_status ps = e->pre_node(e->post_arg, i);
            if (ps) return ps;
        }
        fr_mem_set_tag(e->ctx, info->name);
        apply_events(e, i);
        if (e->copy_ev) {
            fr_status ws = wait_copies(e, i);
            if (ws) return ws;
        }
        if (info->view) { /* shares its input's storage, wherever that lives */
            e->ptr[node->out[0]] = e->ptr[node->in[0]];
            if (e->buf) {
                e->buf[node->out[0]] = e->buf[node->in[0]];
                e->off[node->out[0]] = e->off[node->in[0]];
            }
            if (e->post_node && (st0 = e->post_node(e->post_arg, i))) return st0;
            continue;
        }
        if (node->op == FR_OP_OPTIM_STEP) { /* the optimizer's step, not a kernel */
            if (!e->param_step)
                return fr_fail(e->ctx, FR_ERR_ARG, "optim_step of parameter %d: no optimizer",
                               node->attr.param);
            fr_tensor grad = bind(e, node->in[0], n);
            fr_mem_mark(e->ctx, info->name);
            fr_status ps = e->param_step(e->param_arg, node, &grad);
            fr_mem_mark(e->ctx, NULL);
            if (ps) return ps;
            if (e->post_node && (st0 = e->post_node(e->post_arg, i))) return st0;
            continue;
        }
        fr_kernel_call c = {0};
        c.ctx = e->ctx;
        c.node = node;
        c.seed = seed;
        c.step = step;
        c.grad_ws = e->grad_ws;
        c.grad_ws_len = e->grad_ws_len;
        c.gemm_ws = e->gemm_ws;
        c.gemm_ws_len = e->gemm_ws_len;
        for (int j = 0; j < node->n_in; j++) c.in[j] = bind(e, node->in[j], n);
        for (int j = 0; j < node->n_out; j++) {
            int v = node->out[j];
            c.out[j] = bind(e, v, n);
            if (v >= 0 && (node->update & (1u << j))) continue; /* the parameter, stepped */
            if (v >= 0 && (node->accumulate & (1u << j))) {
                if (e->written[v]) c.accumulate |= 1u << j;
                e->written[v] = 1;
            }
        }
        if (e->copy_ev && (node->op == FR_OP_OFFLOAD || node->op == FR_OP_FETCH)) {
            fr_status ws = wait_copy(e, i); /* the last step's, were it left */
            if (ws) return ws;
            c.copy_event = &e->copy_ev[i];
        }
        fr_mem_mark(e->ctx, info->name); /* the kernel's span in a trace */
        int st = e->kernels[node->op](&c);
        fr_mem_mark(e->ctx, NULL);
        if (st) return (fr_status)st;
        if (e->post_node && (st = e->post_node(e->post_arg, i))) return (fr_status)st;
    }
    if (e->copy_ev && to == e->plan->n_nodes) return wait_copies(e, to);
    return FR_OK;
}

void fr_exec_finish(fr_exec *e) {
    if (e->copy_ev) drain_copies(e);
    apply_events(e, e->plan->n_nodes);
    fr_mem_set_tag(e->ctx, NULL);
}
