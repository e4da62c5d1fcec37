/* exec.c — the executor (see exec.h). */
#include <string.h>
#include "backend/backend.h"
#include "exec/exec.h"
#include "plan/offload.h"

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
    const int dev = fr_backend_is_device(e->be);
    if (dev) {
        e->buf = fr_calloc(ctx, g->n_vals * sizeof *e->buf, FR_MEM_OTHER);
        e->off = fr_calloc(ctx, g->n_vals * sizeof *e->off, FR_MEM_OTHER);
        if (!e->buf || !e->off) goto fail;
    }
    if (plan->arena_bytes) {
        fr_mem_set_tag(ctx, "arena");
        e->arena = dev ? e->be->arena_alloc(ctx, plan->arena_bytes)
                       : fr_arena_alloc(ctx, plan->arena_bytes);
        if (!e->arena) goto fail;
    }
    /* values offloaded between forward and backward: one host block for
     * the step, in the host's activations (on every backend) */
    size_t host_bytes = fr_offload_host_place(g, NULL, NULL);
    if (host_bytes) {
        fr_mem_set_tag(ctx, "offload");
        if (!(e->host = fr_alloc(ctx, host_bytes, FR_MEM_ACTIVATIONS))) goto fail;
        fr_offload_host_place(g, e->host, e->ptr);
    }
    for (size_t v = 0; v < g->n_vals; v++) {
        if (plan->offset[v] < 0) continue;
        if (dev) e->buf[v] = e->arena, e->off[v] = (size_t)plan->offset[v];
        else e->ptr[v] = e->arena + plan->offset[v];
    }
    return FR_OK;
fail:
    fr_exec_release(e);
    return FR_ERR_NOMEM;
}

void fr_exec_release(fr_exec *e) {
    if (!e->ctx) return;
    if (e->arena && fr_backend_is_device(e->be)) e->be->arena_free(e->ctx, e->arena);
    else fr_arena_free(e->ctx, e->arena);
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
        if (e->be->track) e->be->track(e->ctx, p->cat[v], ev > 0 ? b : -b);
        else fr_mem_track(e->ctx, p->cat[v], ev > 0 ? b : -b);
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
    if (!e->buf) return; /* a CPU run: nothing lives on a device */
    e->buf[v] = buf;
    e->off[v] = off;
}

fr_status fr_exec_run(fr_exec *e, int from, int to, int n, uint64_t seed, uint64_t step) {
    fr_graph *g = e->g;
    for (int i = from; i < to; i++) {
        const fr_node *node = &g->nodes[e->plan->order[i]];
        const fr_op_info *info = fr_op_get(node->op);
        fr_mem_set_tag(e->ctx, info->name);
        apply_events(e, i);
        if (info->view) { /* shares its input's storage, wherever that lives */
            e->ptr[node->out[0]] = e->ptr[node->in[0]];
            if (e->buf) {
                e->buf[node->out[0]] = e->buf[node->in[0]];
                e->off[node->out[0]] = e->off[node->in[0]];
            }
            continue;
        }
        fr_kernel_call c = {0};
        c.ctx = e->ctx;
        c.node = node;
        c.seed = seed;
        c.step = step;
        c.upd_lr = e->upd_lr;
        c.upd_wd = e->upd_wd;
        c.upd_ws = e->upd_ws;
        c.upd_ws_len = e->upd_ws_len;
        c.optim = e->optim;
        for (int j = 0; j < node->n_in; j++) c.in[j] = bind(e, node->in[j], n);
        for (int j = 0; j < node->n_out; j++) {
            int v = node->out[j];
            c.out[j] = bind(e, v, n);
            if (v >= 0 && (node->update & (1u << j))) {
                c.update |= 1u << j;
                continue;
            }
            if (v >= 0 && (node->accumulate & (1u << j))) {
                if (e->written[v]) c.accumulate |= 1u << j;
                e->written[v] = 1;
            }
        }
        int st = e->kernels[node->op](&c);
        if (st) return (fr_status)st;
        if (e->post_node && (st = e->post_node(e->post_arg, i))) return (fr_status)st;
    }
    return FR_OK;
}

void fr_exec_finish(fr_exec *e) {
    apply_events(e, e->plan->n_nodes);
    fr_mem_set_tag(e->ctx, NULL);
}
