/* step.c — compiling and running one step: model -> graph -> autodiff ->
 * rematerialization schedule -> plan -> exec, then the optimizer update with
 * PyTorch's formulas. A step may split its batch into micro-batches whose
 * gradients accumulate (the loss of each scaled by its share of the batch),
 * and may recompute activations instead of keeping them; with a budget the
 * planner (planner.c) picks both. */
#include <math.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "core/half.h"
#include "parallel/buckets.h"
#include "parallel/buffers.h"
#include "parallel/pshard.h"
#include "parallel/shard.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"
#include "plan/offload.h"
#include "plan/precision.h"
#include "plan/remat.h"
#include "train/step.h"
#include "train/device.h"
#include "train/feed.h"

static size_t param_bytes(const fr_param *p) {
    return (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
}

int fr_step_optim_states(const fr_optim_opts *o) {
    if (o->kind == FR_OPTIM_SGD) return o->momentum != 0.0f ? 1 : 0;
    return 2;
}

size_t fr_step_grad_bytes(const fr_step *s, size_t i) {
    if (s->gv[i] < 0 || (s->fused && s->fused[i])) return 0;
    return (size_t)fr_shape_numel(&s->m->params[i].shape) *
           fr_dtype_size(s->g.vals[s->gv[i]].dtype);
}

/* A parameter's gradient storage, f32 or 16-bit (NULL while it has none). */
static void *grad_data(const fr_param *p) {
    return p->grad16 ? (void *)p->grad16 : (void *)p->grad;
}

static fr_status alloc_grads(fr_step *s) {
    fr_model *m = s->m;
    if (s->upd_ws_len && !s->upd_ws) {
        s->upd_ws = fr_alloc(s->ctx, s->upd_ws_len * sizeof(float), FR_MEM_GRADS);
        if (!s->upd_ws) return FR_ERR_NOMEM;
    }
    if (s->buckets) { /* data parallel: the gradients are views of their buckets */
        fr_status st = fr_buckets_alloc(s->ctx, s->buckets);
        if (st) return st;
        for (size_t i = 0; i < m->n_params; i++)
            if (fr_step_grad_bytes(s, i) && !m->params[i].grad) {
                m->params[i].grad = fr_buckets_grad(s->buckets, (int)i);
                m->params[i].grad_valid = 0;
            }
        return FR_OK;
    }
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        size_t bytes = fr_step_grad_bytes(s, i);
        if (!bytes || grad_data(p)) continue;
        if (s->g.vals[s->gv[i]].dtype == FR_F32) p->grad = fr_alloc(s->ctx, bytes, FR_MEM_GRADS);
        else p->grad16 = fr_alloc(s->ctx, bytes, FR_MEM_GRADS);
        if (!grad_data(p)) return FR_ERR_NOMEM;
        p->grad_valid = 0;
    }
    return FR_OK;
}

/* The storage of one optimizer-state buffer of param p: Adam's moments may
 * be compressed (bf16, int8 by blocks; small tensors keep fp32); with 16-bit
 * weights (pure half) the state takes the weights' format. */
size_t fr_step_state_bytes(const fr_step *s, const fr_param *p, int *kind) {
    size_t n = (size_t)fr_shape_numel(&p->shape);
    *kind = FR_STATE_F32;
    if (p->dtype != FR_F32) return param_bytes(p);
    if (s->o.optim.kind == FR_OPTIM_SGD) return n * sizeof(float);
    *kind = fr_state_kind_for((fr_state_kind)s->o.optim_state, n);
    return fr_state_bytes((fr_state_kind)*kind, n);
}

int fr_step_owned(const fr_step *s, size_t i, size_t *a, size_t *b) {
    size_t n = (size_t)fr_shape_numel(&s->m->params[i].shape);
    *a = 0, *b = n;
    if (s->gv[i] < 0) return *a = *b = 0, 0;
    if (!s->buckets || s->zero < 1) return n > 0;
    const fr_buckets *bk = s->buckets;
    size_t f = fr_buckets_flat(bk, (int)i);
    size_t lo = bk->lo > f ? bk->lo : f, hi = bk->hi < f + n ? bk->hi : f + n;
    if (bk->bucket_of[i] < 0 || hi <= lo) return *a = *b = 0, 0;
    *a = lo - f, *b = hi - f;
    return 1;
}

/* Bytes of one optimizer-state buffer of param i on this rank: at ZeRO >= 1
 * its owned elements' (the kind is the whole tensor's: f32 or bf16, whose
 * elements are encoded one by one). */
static size_t state_bytes_here(const fr_step *s, size_t i, int *kind) {
    size_t bytes = fr_step_state_bytes(s, &s->m->params[i], kind), a, b;
    if (s->zero >= 1 && s->buckets)
        bytes = fr_step_owned(s, i, &a, &b) ? fr_state_bytes((fr_state_kind)*kind, b - a) : 0;
    return bytes;
}

static fr_status alloc_state(fr_step *s) {
    fr_model *m = s->m;
    int ns = fr_step_optim_states(&s->o.optim);
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0) continue;
        int kind;
        size_t bytes = state_bytes_here(s, i, &kind);
        if (!bytes) continue;
        if (p->state[0] && p->state_kind != kind) { /* resumed with another format: start over */
            fr_free(s->ctx, p->state[0]);
            fr_free(s->ctx, p->state[1]);
            p->state[0] = p->state[1] = NULL;
        }
        p->state_kind = kind;
        for (int k = 0; k < ns; k++)
            if (!p->state[k] && !(p->state[k] = fr_calloc(s->ctx, bytes, FR_MEM_OPTIM)))
                return FR_ERR_NOMEM;
    }
    return FR_OK;
}

/* The host's gradients and optimizer state (a device with the optimizer
 * offloaded keeps them here). */
fr_status fr_step_alloc_host_update(fr_step *s) {
    fr_status st = alloc_grads(s);
    return st ? st : alloc_state(s);
}

/* The step's GEMM scratch: the most any of its nodes asks (the backend's
 * ws_elems, j = -1), planned with the arena's values. */
static void plan_gemm_scratch(fr_step *s) {
    const fr_graph *g = &s->g;
    const fr_backend *be = fr_backend_of(s->ctx);
    int64_t most = 0;
    for (int k = 0; k < s->plan.n_nodes; k++) {
        int64_t f = be->ws_elems(g, &g->nodes[s->plan.order[k]], -1);
        if (f > most) most = f;
    }
    s->gemm_ws = (size_t)most;
}

/* Allocate (take) or release the GEMM scratch: a device buffer (with the
 * fused step's tiles, train/device.c), or a host block; it goes and comes
 * with the arena (an eval step then takes its place). */
static fr_status gemm_scratch(fr_step *s, int take) {
    if (fr_step_on_device(s)) return fr_dev_scratch(s, take);
    if (!take) {
        fr_free(s->ctx, s->gemm_host);
        s->gemm_host = NULL;
        return FR_OK;
    }
    if (!s->gemm_ws || s->gemm_host) return FR_OK;
    s->gemm_host = fr_alloc(s->ctx, s->gemm_ws * sizeof(float), FR_MEM_WORKSPACE);
    return s->gemm_host ? FR_OK : FR_ERR_NOMEM;
}

void fr_step_free(fr_step *s) {
    if (!s) return;
    fr_ctx *ctx = s->ctx;
    if (s->buckets) { /* the gradients were views: the model must not free them */
        for (size_t i = 0; i < s->m->n_params; i++)
            if (s->m->params[i].grad == fr_buckets_grad(s->buckets, (int)i))
                s->m->params[i].grad = NULL;
        fr_buckets_release(ctx, s->buckets);
        fr_free(ctx, s->buckets);
    }
    if (s->gathers) {
        fr_gathers_release(ctx, s->gathers);
        fr_free(ctx, s->gathers);
    }
    if (s->pshard) { /* the weights' shards go with the step that made them */
        if (s->m->shard == s->pshard) s->m->shard = NULL;
        fr_pshard_release(ctx, s->pshard);
        fr_free(ctx, s->pshard);
    }
    fr_dev_step_free(s);
    fr_exec_release(&s->ex);
    fr_plan_release(&s->plan);
    fr_graph_release(&s->g);
    fr_free(ctx, s->pv);
    fr_free(ctx, s->gv);
    fr_free(ctx, s->unit);
    fr_free(ctx, s->fused);
    fr_free(ctx, s->upd_ws);
    fr_free(ctx, s->gemm_host);
    fr_free(ctx, s->slots);
    fr_free(ctx, s->stepped);
    fr_free(ctx, s);
}

/* Unit of every node: its layer's top-level position; the loss belongs to
 * the last unit; gradient sums and copies (no forward node) to the unit of
 * the backward node before them. */
static fr_status assign_units(fr_step *s) {
    fr_graph *g = &s->g;
    s->unit = fr_alloc(s->ctx, (g->n_nodes + 1) * sizeof *s->unit, FR_MEM_OTHER);
    if (!s->unit) return FR_ERR_NOMEM;
    int last = s->m->n_units - 1;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const fr_node *n = &g->nodes[i];
        int layer = n->fwd >= 0 ? g->nodes[n->fwd].layer : n->layer;
        if (n->fwd < 0 && (int)i >= g->n_forward && i > 0) s->unit[i] = s->unit[i - 1];
        else s->unit[i] = layer >= 0 ? s->m->layers[layer].unit : last;
    }
    /* The chain starts at the first unit that has backward work. */
    s->first_unit = s->m->n_units;
    for (size_t i = (size_t)g->n_forward; i < g->n_nodes; i++)
        if (s->unit[i] < s->first_unit) s->first_unit = s->unit[i];
    if (s->first_unit >= s->m->n_units) s->first_unit = s->m->n_units - 1;
    return FR_OK;
}

/* Segment starts for the segment modes; NULL-equivalent (all -1) keeps all. */
static void segments_for(const fr_step *s, fr_ckpt_mode mode, int arg, int *seg) {
    int n = s->m->n_units, f = s->first_unit, L = n - f;
    for (int u = 0; u < n; u++) seg[u] = -1;
    int size = 0;
    switch (mode) {
    case FR_CKPT_MARKS:
        for (size_t i = 0; i < s->m->n_layers; i++)
            if (s->m->layers[i].checkpoint) seg[s->m->layers[i].unit] = s->m->layers[i].unit;
        return;
    case FR_CKPT_ALL: size = 1; break;
    case FR_CKPT_SQRT: size = (int)ceil(sqrt((double)L)); break;
    case FR_CKPT_EVERY: size = arg; break;
    case FR_CKPT_SEGMENTS: size = arg > 0 ? L / arg : L; break;
    default: return;
    }
    if (size < 1) size = 1;
    /* Every segment but the last is recomputed: the last one's backward runs
     * right after the forward, so recomputing it would save nothing. */
    int segs = mode == FR_CKPT_SEGMENTS ? arg : (L + size - 1) / size;
    for (int k = 0; k + 1 < segs; k++)
        for (int u = f + k * size; u < f + (k + 1) * size && u < n; u++) seg[u] = f + k * size;
}

/* The optimizer step in backward (PyTorch's tutorial "fuse the optimizer step
 * into the backward pass"): with plain SGD the update of a Linear weight or
 * bias needs nothing but its gradient, so LINEAR_BWD can apply it right after
 * computing that gradient (for the weight, in the GEMM's epilogue) and the
 * gradient is never stored: the gradient bytes of those tensors vanish, and
 * so do a pass writing them and one reading them back. Only where nothing can
 * tell the difference: SGD without momentum, no loss scaler (it must see every
 * gradient before any update), no clipping (it needs the global norm), one
 * micro-batch (accumulation needs the buffer), f32 weights, the gradient
 * written by exactly one LINEAR_BWD output, after the loss in the plan order,
 * and no node after it reading the parameter. */
static fr_status plan_fused_updates(fr_step *s) {
    const fr_model *m = s->m;
    fr_graph *g = &s->g;
    const fr_plan *pl = &s->plan;
    s->loss_pos = -1;
    for (int k = 0; k < pl->n_nodes; k++)
        for (int j = 0; j < g->nodes[pl->order[k]].n_out; j++)
            if (g->nodes[pl->order[k]].out[j] == g->loss) s->loss_pos = k;
    const fr_optim_opts *o = &s->o.optim;
    /* (on a device with the optimizer offloaded, the step runs on the host) */
    if (!s->o.training || s->o.keep_grads || o->kind != FR_OPTIM_SGD ||
        (fr_step_on_device(s) && (s->o.offload & FR_OFFLOAD_OPTIMIZER)) || o->momentum != 0.0f ||
        s->scaler.enabled || s->o.clip_grad_norm > 0 || s->accumulate != 1 || s->loss_pos < 0)
        return FR_OK;
    s->fused = fr_calloc(s->ctx, m->n_params + 1, FR_MEM_OTHER);
    if (!s->fused) return FR_ERR_NOMEM;
    for (size_t i = 0; i < m->n_params; i++) {
        if (s->gv[i] < 0 || m->params[i].dtype != FR_F32) continue;
        int writers = 0, pos = -1, slot = -1, late_reader = 0;
        for (int k = 0; k < pl->n_nodes; k++) {
            const fr_node *n = &g->nodes[pl->order[k]];
            for (int j = 0; j < n->n_out; j++)
                if (n->out[j] == s->gv[i]) writers++, pos = k, slot = j;
        }
        if (writers != 1 || pos <= s->loss_pos) continue;
        fr_node *w = &g->nodes[pl->order[pos]];
        if (w->op != FR_OP_LINEAR_BWD || (slot != 1 && slot != 2)) continue;
        for (int k = pos + 1; k < pl->n_nodes && !late_reader; k++) {
            const fr_node *n = &g->nodes[pl->order[k]];
            for (int j = 0; j < n->n_in; j++) late_reader |= n->in[j] == s->pv[i];
        }
        if (late_reader) continue;
        w->update |= 1u << slot;
        if (slot == 1) { /* the weight's gradient passes through a tile of scratch */
            const fr_shape *ws = &m->params[i].shape;
            /* the GEMM's rows: the batch, times the positions of a sequence */
            int64_t K = ws->d[0] ? fr_shape_numel(ws) / ws->d[0] : 0;
            int64_t rows = K ? fr_shape_numel(&g->vals[w->in[1]].shape) / K : 0;
            /* on a device the whole gradient, by the kept gradient's one GEMM */
            size_t len = !ws->d[0] ? 0
                         : fr_step_on_device(s)
                             ? (size_t)(ws->d[0] * K)
                             : fr_k_linear_upd_ws(ws->d[0], K, rows, fr_get_threads(s->ctx));
            if (len > s->upd_ws_len) s->upd_ws_len = len;
        }
        s->fused[i] = 1;
        s->n_fused++;
    }
    return FR_OK;
}

/* Where each value is written and read in an order, found in one pass (so
 * the passes below cost O(nodes + parameters), not their product): how many
 * nodes write it (the last at pos, output slot), how many read it, and the
 * last position that reads it (-1: none). */
typedef struct order_uses {
    int *writers, *pos, *slot, *readers, *last_read;
} order_uses;

static fr_status uses_of(fr_ctx *ctx, const fr_graph *g, const int *order, int n, order_uses *u) {
    size_t nv = g->n_vals + 1;
    int *a = fr_alloc(ctx, 5 * nv * sizeof *a, FR_MEM_OTHER);
    if (!a) return FR_ERR_NOMEM;
    *u = (order_uses){a, a + nv, a + 2 * nv, a + 3 * nv, a + 4 * nv};
    for (size_t v = 0; v < nv; v++)
        u->writers[v] = u->readers[v] = 0, u->pos[v] = u->slot[v] = u->last_read[v] = -1;
    for (int k = 0; k < n; k++) {
        const fr_node *nd = &g->nodes[order[k]];
        for (int j = 0; j < nd->n_out; j++)
            if (nd->out[j] >= 0)
                u->writers[nd->out[j]]++, u->pos[nd->out[j]] = k, u->slot[nd->out[j]] = j;
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= 0) u->readers[nd->in[j]]++, u->last_read[nd->in[j]] = k;
    }
    return FR_OK;
}

/* Make parameter gradient gv, written by output `slot` of node w, a step
 * value (arena) that node overwrites; node c goes right after w. */
static void gradient_to_step(fr_graph *g, int w, int slot, int gv, int c) {
    g->vals[gv].kind = FR_VAL_STEP;
    g->vals[gv].producer = w;
    g->nodes[w].accumulate &= ~(1u << slot);
    g->nodes[c].layer = g->nodes[w].layer;
}

/* The order with node node[i] put right after position pos[i]; nodes after
 * the same position in the reverse of their listing (each one placed right
 * after the writer, in front of those placed before it). */
static fr_status insert_after(fr_ctx *ctx, int **order_io, int *n_io, const int *pos,
                              const int *node, int n_ins) {
    if (!n_ins) return FR_OK;
    int n = *n_io, *old = *order_io;
    int *order = fr_alloc(ctx, ((size_t)n + n_ins) * sizeof *order, FR_MEM_OTHER);
    int *head = fr_alloc(ctx, ((size_t)n + 1) * sizeof *head, FR_MEM_OTHER);
    int *next = fr_alloc(ctx, ((size_t)n_ins + 1) * sizeof *next, FR_MEM_OTHER);
    if (!order || !head || !next) {
        fr_free(ctx, order);
        fr_free(ctx, head);
        fr_free(ctx, next);
        return FR_ERR_NOMEM;
    }
    for (int k = 0; k < n; k++) head[k] = -1;
    for (int i = 0; i < n_ins; i++) next[i] = head[pos[i]], head[pos[i]] = i;
    int m = 0;
    for (int k = 0; k < n; k++) {
        order[m++] = old[k];
        for (int i = head[k]; i >= 0; i = next[i]) order[m++] = node[i];
    }
    fr_free(ctx, head);
    fr_free(ctx, next);
    fr_free(ctx, old);
    *order_io = order;
    *n_io = m;
    return FR_OK;
}

/* The optimizer step in backward for momentum SGD, Adam and AdamW (plain
 * SGD has its own, inside LINEAR_BWD: plan_fused_updates). PyTorch's
 * tutorial does it with a hook per parameter: once a parameter's gradient is
 * complete, optimizer.step() for it alone, then the gradient is dropped.
 * Here an OPTIM_STEP node right after the gradient's single writer steps the
 * parameter with exactly the update the step after backward would make, and
 * the gradient becomes an arena value that dies there: the persistent
 * gradient bytes of those parameters vanish. The conditions are the SGD
 * path's: training, no --keep-grads, no loss scaler (it must see every
 * gradient before any update), no clipping (it needs the global norm), one
 * micro-batch (accumulation needs the buffer), f32 weights, one writer after
 * the loss, no node after it reading the parameter or the gradient. */
static fr_status fuse_optim_steps(fr_step *s, int **order_io, int *n_io) {
    const fr_model *m = s->m;
    fr_graph *g = &s->g;
    const fr_optim_opts *o = &s->o.optim;
    int plain_sgd = o->kind == FR_OPTIM_SGD && o->momentum == 0.0f;
    /* on a device with the optimizer offloaded, the step runs on the host */
    if (!s->o.training || s->o.keep_grads ||
        (fr_step_on_device(s) && (s->o.offload & FR_OFFLOAD_OPTIMIZER)) || plain_sgd ||
        s->scaler.enabled || s->o.clip_grad_norm > 0 || s->accumulate != 1)
        return FR_OK;
    int loss_pos = -1;
    for (int k = 0; k < *n_io; k++)
        for (int j = 0; j < g->nodes[(*order_io)[k]].n_out; j++)
            if (g->nodes[(*order_io)[k]].out[j] == g->loss) loss_pos = k;
    if (loss_pos < 0) return FR_OK;
    order_uses u = {0};
    fr_status st = uses_of(s->ctx, g, *order_io, *n_io, &u);
    int *ins = st ? NULL : fr_alloc(s->ctx, 2 * (m->n_params + 1) * sizeof *ins, FR_MEM_OTHER),
        n_ins = 0;
    if (!st &&
        (!ins || (!s->fused && !(s->fused = fr_calloc(s->ctx, m->n_params + 1, FR_MEM_OTHER)))))
        st = FR_ERR_NOMEM;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        int gv = s->gv[i];
        if (gv < 0 || m->params[i].dtype != FR_F32 || g->vals[gv].kind != FR_VAL_GRAD) continue;
        int pos = u.pos[gv];
        /* one writer after the loss, nothing reading the gradient, nothing after it reading the weight */
        if (u.writers[gv] != 1 || u.readers[gv] || pos <= loss_pos || u.last_read[s->pv[i]] > pos)
            continue;
        fr_attr a = {0};
        a.param = (int)i;
        int c = fr_graph_node(g, FR_OP_OPTIM_STEP, &gv, 1, &a, -1, 0, NULL);
        if (c < 0) {
            st = g->status;
            break;
        }
        fr_node *cn = &g->nodes[c];
        g->vals[cn->out[0]].producer = -1; /* the parameter itself, stepped in place */
        cn->out[0] = s->pv[i];
        cn->update = 1u;
        gradient_to_step(g, (*order_io)[pos], u.slot[gv], gv,
                         c); /* keeps .param: planned as a gradient */
        ins[n_ins] = pos, ins[m->n_params + 1 + n_ins] = c, n_ins++;
        s->fused[i] = 2;
        s->n_fused++;
    }
    if (!st)
        st = insert_after(s->ctx, order_io, n_io, ins, ins ? ins + m->n_params + 1 : NULL, n_ins);
    fr_free(s->ctx, ins);
    fr_free(s->ctx, u.writers);
    if (st) return st;
    if (s->n_fused && !(s->slots = fr_calloc(s->ctx, m->n_params * sizeof *s->slots, FR_MEM_OTHER)))
        return FR_ERR_NOMEM;
    return FR_OK;
}

/* Pure half precision (16-bit weights): each weight's gradient is kept in
 * the weights' format, as model.half() keeps it. Its single writer makes
 * the f32 gradient as a step value (arena, dying at once) and a CAST right
 * after it narrows it into the persistent 16-bit gradient, adding to what is
 * there when micro-batches accumulate (f32 sum, one rounding). A gradient
 * with several writers keeps f32 storage. */
static fr_status narrow_half_grads(fr_step *s, int **order_io, int *n_io) {
    const fr_model *m = s->m;
    fr_graph *g = &s->g;
    order_uses u;
    fr_status st = uses_of(s->ctx, g, *order_io, *n_io, &u);
    if (st) return st;
    int *ins = fr_alloc(s->ctx, 2 * (m->n_params + 1) * sizeof *ins, FR_MEM_OTHER), n_ins = 0;
    if (!ins) st = FR_ERR_NOMEM;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        const fr_param *p = &m->params[i];
        int gv = s->gv[i];
        if (gv < 0 || (p->dtype != FR_F16 && p->dtype != FR_BF16)) continue;
        if (u.writers[gv] != 1 || u.readers[gv]) continue;
        int g16 = fr_graph_value(g, FR_VAL_GRAD, p->dtype, p->shape);
        fr_attr a = {0};
        a.dtype = p->dtype;
        int c = g16 < 0 ? -1 : fr_graph_node(g, FR_OP_CAST, &gv, 1, &a, -1, 0, NULL);
        if (c < 0) {
            st = g->status;
            break;
        }
        fr_node *cn = &g->nodes[c];
        g->vals[cn->out[0]].producer = -1; /* replaced by the 16-bit gradient */
        cn->out[0] = g16;
        cn->accumulate = 1u;
        g->vals[g16].param = (int)i;
        g->vals[gv].param = -1;
        gradient_to_step(g, (*order_io)[u.pos[gv]], u.slot[gv], gv, c);
        ins[n_ins] = u.pos[gv], ins[m->n_params + 1 + n_ins] = c, n_ins++;
        s->gv[i] = g16;
    }
    if (!st) st = insert_after(s->ctx, order_io, n_io, ins, ins + m->n_params + 1, n_ins);
    fr_free(s->ctx, ins);
    fr_free(s->ctx, u.writers);
    return st;
}

/* Build graph, backward, schedule and plan for the given options; no
 * parameters, arena, gradients or optimizer state yet (the planner compares
 * candidates). */
fr_step *fr_step_build(fr_model *m, const fr_step_opts *opts) {
    fr_ctx *ctx = m->ctx;
    if (opts->batch <= 0) {
        fr_fail(ctx, FR_ERR_ARG, "batch size must be positive, got %d", opts->batch);
        return NULL;
    }
    int micro = opts->micro_batch > 0 ? opts->micro_batch : opts->batch;
    if (micro > opts->batch || opts->batch % micro != 0) {
        fr_fail(ctx, FR_ERR_ARG,
                "micro-batch %d does not divide the batch %d: choose a divisor (e.g. %d) or "
                "change --batch",
                micro, opts->batch, opts->batch % 2 == 0 ? opts->batch / 2 : 1);
        return NULL;
    }
    if (m->n_units == 0) {
        fr_fail(ctx, FR_ERR_ARG, "the model has no layers");
        return NULL;
    }
    /* Building works on shapes and dtypes only: the parameters are allocated
     * and initialised by fr_step_materialize, so planning and estimating
     * never take the model's bytes. */
    if ((unsigned)opts->optim_state > FR_OPTIM_STATE_INT8 ||
        (opts->loss_scaling != FR_LOSS_SCALE_AUTO && opts->loss_scaling != FR_LOSS_SCALE_DYNAMIC &&
         opts->loss_scaling != FR_LOSS_SCALE_NONE)) {
        fr_fail(ctx, FR_ERR_ARG,
                "optim_state %d or loss_scaling %d is not a value of its enum (fr_optim_state, "
                "fr_loss_scaling)",
                (int)opts->optim_state, (int)opts->loss_scaling);
        return NULL;
    }
    if (opts->precision == FR_PREC_FP16 || opts->precision == FR_PREC_BF16) {
        /* model.half(): weights and biases stored in 16 bits from here on
         * (BatchNorm's running statistics stay f32: they are updated in place
         * by an f32 kernel, as cuDNN keeps them in f32 for half inputs); on
         * a model not yet allocated only the dtype changes. */
        if (fr_model_to_dtype(m, opts->precision == FR_PREC_FP16 ? FR_F16 : FR_BF16)) return NULL;
    }
    fr_mem_stats before;
    fr_mem_get_stats(ctx, &before);
    fr_step *s = fr_calloc(ctx, sizeof *s, FR_MEM_OTHER);
    if (!s) return NULL;
    s->ctx = ctx;
    s->m = m;
    s->o = *opts;
    s->micro = micro;
    s->accumulate = opts->batch / micro;
    fr_graph_init(&s->g, ctx);
    fr_status st = FR_ERR_NOMEM;
    int *grad_of = NULL, *seg = NULL, *order = NULL, *origin = NULL, n_order = 0;
    uint8_t *keep = NULL;
    fr_schedule sched = {0};
    s->pv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->pv, FR_MEM_OTHER);
    s->gv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->gv, FR_MEM_OTHER);
    if (!s->pv || !s->gv) goto fail;
    if ((st = fr_model_build_graph(m, &s->g, micro, opts->training, s->pv))) goto fail;
    for (size_t i = 0; i < m->n_params; i++) s->gv[i] = -1;
    int any_trainable = 0;
    if (opts->training) {
        st = FR_ERR_NOMEM;
        if (!(grad_of = fr_alloc(ctx, s->g.n_vals * sizeof *grad_of, FR_MEM_OTHER))) goto fail;
        for (size_t v = 0; v < s->g.n_vals; v++) grad_of[v] = -1;
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!p->trainable || m->layers[p->layer].frozen) continue;
            int gvv = fr_graph_value(&s->g, FR_VAL_GRAD, FR_F32, p->shape);
            if (gvv < 0) goto fail;
            s->g.vals[gvv].param = (int)i;
            s->gv[i] = gvv;
            grad_of[s->pv[i]] = gvv;
            any_trainable = 1;
        }
        if (!any_trainable) {
            st = fr_fail(ctx, FR_ERR_ARG, "every layer is frozen: nothing to train");
            goto fail;
        }
        if ((st = fr_autodiff(&s->g, grad_of))) goto fail;
    } else {
        s->g.n_forward = (int)s->g.n_nodes;
    }
    if ((st = assign_units(s))) goto fail;
    st = FR_ERR_NOMEM;
    if (!(seg = fr_alloc(ctx, ((size_t)m->n_units + 1) * sizeof *seg, FR_MEM_OTHER))) goto fail;
    if (!opts->training) {
        st = fr_schedule_segments(ctx, m->n_units, NULL, &sched);
    } else if (opts->checkpoint == FR_CKPT_REVOLVE) {
        st = fr_schedule_revolve(ctx, s->first_unit, m->n_units, opts->ckpt_arg, &sched);
    } else {
        if ((opts->checkpoint == FR_CKPT_EVERY || opts->checkpoint == FR_CKPT_SEGMENTS) &&
            opts->ckpt_arg < 1) {
            st = fr_fail(ctx, FR_ERR_ARG, "checkpoint every:N and --segments N need N >= 1");
            goto fail;
        }
        segments_for(s, opts->checkpoint, opts->ckpt_arg, seg);
        st = fr_schedule_segments(ctx, m->n_units, seg, &sched);
    }
    if (st) goto fail;
    s->recomputed_units = fr_schedule_recomputed(&sched);
    int n_nodes0 = (int)s->g.n_nodes;
    if ((st = fr_remat_apply(&s->g, s->unit, m->n_units, &sched, &order, &n_order, &origin,
                             &s->extra_flops)))
        goto fail;
    fr_precision prec = opts->precision;
    int store16 = opts->training && prec != FR_PREC_FP32 && prec != FR_PREC_AUTO;
    if (opts->training &&
        (st = fr_remat_cheap(&s->g, &order, &n_order, &origin, &s->extra_flops, store16)))
        goto fail;
    int half_weights = 0;
    for (size_t i = 0; i < m->n_params; i++)
        half_weights |= m->params[i].dtype == FR_F16 || m->params[i].dtype == FR_BF16;
    if (store16 || half_weights) {
        fr_dtype half = !store16                                               ? FR_F32
                        : (prec == FR_PREC_FP16 || prec == FR_PREC_FP16_MIXED) ? FR_F16
                                                                               : FR_BF16;
        if ((st = fr_precision_apply(&s->g, half, n_nodes0, origin, &order, &n_order))) goto fail;
    }
    if (opts->training && half_weights && (st = narrow_half_grads(s, &order, &n_order))) goto fail;
    if (opts->training && (opts->offload & FR_OFFLOAD_ACTIVATIONS) &&
        (st = fr_offload_saved(&s->g, &order, &n_order, FR_OFFLOAD_MIN_BYTES, &s->n_offloaded,
                               &s->offloaded_bytes)))
        goto fail;
    s->scaler = fr_scaler_default();
    s->scaler.enabled = opts->loss_scaling == FR_LOSS_SCALE_DYNAMIC ||
                        (opts->loss_scaling == FR_LOSS_SCALE_AUTO &&
                         (prec == FR_PREC_FP16 || prec == FR_PREC_FP16_MIXED));
    if ((st = fuse_optim_steps(s, &order, &n_order))) goto fail;
    st = FR_ERR_NOMEM;
    if (!(keep = fr_calloc(ctx, s->g.n_vals + 1, FR_MEM_OTHER))) goto fail;
    keep[s->g.loss] = keep[s->g.logits] = 1;
    if ((st = fr_plan_build(&s->g, keep, order, n_order, &s->plan))) goto fail;
    if ((st = plan_fused_updates(s))) goto fail;
    plan_gemm_scratch(s);
    for (int i = 0; i < n_order; i++) {
        const fr_node *n = &s->g.nodes[order[i]];
        s->flops += fr_op_get(n->op)->flops(&s->g, n);
    }
    s->flops *= s->accumulate;
    s->extra_flops *= s->accumulate;
    fr_free(ctx, grad_of);
    fr_free(ctx, seg);
    fr_free(ctx, order);
    fr_free(ctx, origin);
    fr_free(ctx, keep);
    fr_schedule_release(ctx, &sched);
    fr_mem_stats after;
    fr_mem_get_stats(ctx, &after);
    s->meta_bytes = after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
    /* the blocks still held (freed temporaries are back in the system or cached) */
    s->meta_reserved = (after.reserved - after.cached) - (before.reserved - before.cached);
    return s;
fail:
    fr_free(ctx, grad_of);
    fr_free(ctx, seg);
    fr_free(ctx, order);
    fr_free(ctx, origin);
    fr_free(ctx, keep);
    fr_schedule_release(ctx, &sched);
    fr_step_free(s);
    return NULL;
}

/* The flat vector of ZeRO's shards: the trainable gradients end to end in
 * reverse parameter order (parallel/buckets.h's layout, whatever the caps);
 * flat[i] = FR_PSHARD_NONE for a parameter without a gradient. Its length. */
static size_t flat_layout(const fr_step *s, size_t *flat, size_t *numel, int *unit) {
    const fr_model *m = s->m;
    size_t at = 0;
    for (size_t k = m->n_params; k-- > 0;) {
        numel[k] = (size_t)fr_shape_numel(&m->params[k].shape);
        unit[k] = m->layers[m->params[k].layer].unit;
        flat[k] = FR_PSHARD_NONE;
        if (!fr_step_grad_bytes(s, k)) continue;
        flat[k] = at, at += numel[k];
    }
    return at;
}

/* ZeRO 3's gathers of this step: the groups each plan position reads (a
 * view reads what its input reads; forward ends at the loss). */
static fr_status plan_gathers(fr_step *s, const fr_pshard *ps, fr_gathers *out) {
    fr_model *m = s->m;
    const fr_graph *g = &s->g;
    int n = s->plan.n_nodes;
    size_t nv = g->n_vals + 1, cap = 0;
    for (int k = 0; k < n; k++) cap += (size_t)g->nodes[s->plan.order[k]].n_in;
    int *root = fr_alloc(s->ctx, nv * sizeof *root, FR_MEM_OTHER);
    int *off = fr_alloc(s->ctx, ((size_t)n + 1) * sizeof *off, FR_MEM_OTHER);
    int *grp = fr_alloc(s->ctx, (cap + 1) * sizeof *grp, FR_MEM_OTHER);
    fr_status st = !root || !off || !grp ? FR_ERR_NOMEM : FR_OK;
    for (size_t v = 0; v < nv && !st; v++) root[v] = -1;
    for (size_t i = 0; i < m->n_params && !st; i++)
        if (fr_pshard_holds(ps, (int)i)) root[s->pv[i]] = ps->group[i];
    int u = 0;
    for (int k = 0; k < n && !st; k++) {
        const fr_node *nd = &g->nodes[s->plan.order[k]];
        off[k] = u;
        for (int j = 0; j < nd->n_in; j++) {
            int v = nd->in[j];
            if (v < 0 || root[v] < 0) continue;
            int dup = 0;
            for (int q = off[k]; q < u; q++) dup |= grp[q] == root[v];
            if (!dup) grp[u++] = root[v];
        }
        if (fr_op_get(nd->op)->view && nd->in[0] >= 0 && root[nd->in[0]] >= 0)
            st = fr_fail(s->ctx, FR_ERR_ARG,
                         "ZeRO 3 gathers weights for the nodes that read them, but node %d (%s) "
                         "makes a view of one",
                         s->plan.order[k], fr_op_get(nd->op)->name);
    }
    if (!st) {
        off[n] = u;
        st = fr_gathers_plan(s->ctx, ps, n, off, grp, s->o.training ? s->loss_pos : n, out);
    }
    fr_free(s->ctx, root);
    fr_free(s->ctx, off);
    fr_free(s->ctx, grp);
    return st;
}

/* The weights' shards of this step's flat layout (flat_layout), rank
 * `rank` of `ranks` (0: the layout alone), request slots from slot0. */
static fr_status pshard_of(const fr_step *s, fr_comm *c, int rank, int ranks, int slot0,
                           fr_pshard *ps) {
    size_t np = s->m->n_params + 1;
    size_t *flat = fr_alloc(s->ctx, np * sizeof *flat, FR_MEM_OTHER);
    size_t *numel = fr_alloc(s->ctx, np * sizeof *numel, FR_MEM_OTHER);
    int *unit = fr_alloc(s->ctx, np * sizeof *unit, FR_MEM_OTHER);
    fr_status st = !flat || !numel || !unit ? FR_ERR_NOMEM : FR_OK;
    if (!st) {
        size_t total = flat_layout(s, flat, numel, unit);
        st = fr_pshard_init(s->ctx, c, (int)s->m->n_params, flat, numel, unit, total, rank, ranks,
                            slot0, ps);
    }
    fr_free(s->ctx, flat);
    fr_free(s->ctx, numel);
    fr_free(s->ctx, unit);
    return st;
}

void fr_step_gathered_peak(const fr_step *s, size_t *peak, size_t *reserved) {
    *peak = *reserved = 0;
    if (s->gathers) {
        *peak = s->gathers->peak, *reserved = s->gathers->peak_reserved;
        return;
    }
    /* one process: the layout alone (no shard block), the same walk */
    fr_pshard ps;
    fr_gathers g;
    if (pshard_of(s, NULL, 0, 0, 0, &ps)) return;
    if (!plan_gathers((fr_step *)s, &ps, &g)) {
        *peak = g.peak, *reserved = g.peak_reserved;
        fr_gathers_release(s->ctx, &g);
    }
    fr_pshard_release(s->ctx, &ps);
}

/* ZeRO 3 (in fr_step_distribute): the model's trainable weights become this
 * rank's shard; weights already made keep only their slice. */
static fr_status shard_weights(fr_step *s, fr_comm *c) {
    fr_model *m = s->m;
    fr_pshard *ps = fr_calloc(s->ctx, sizeof *ps, FR_MEM_OTHER);
    fr_status st =
        ps ? pshard_of(s, c, fr_comm_rank(c), fr_comm_size(c), s->buckets->n, ps) : FR_ERR_NOMEM;
    if (!st && (st = fr_comm_reserve(s->ctx, c, s->buckets->n + 2 * ps->n_groups)))
        fr_pshard_release(s->ctx, ps);
    if (!st) {
        for (size_t i = 0; i < m->n_params; i++) {
            fr_param *p = &m->params[i];
            if (!fr_pshard_holds(ps, (int)i) || !p->data) continue;
            fr_pshard_keep(ps, (int)i, p->data);
            fr_free(s->ctx, p->data);
            p->data = NULL;
        }
        m->shard = s->pshard = ps, ps = NULL;
    }
    fr_free(s->ctx, ps);
    return st;
}

fr_status fr_step_materialize(fr_step *s) {
    fr_status st;
    if (!s->m->initialised && (st = fr_model_init(s->m, s->o.seed))) return st;
    if (fr_step_on_device(s)) {
        if ((st = fr_dev_materialize(s))) return st;
    } else {
        if (s->o.training && (st = alloc_grads(s))) return st;
        if (s->o.training && (st = alloc_state(s))) return st;
        if ((st = gemm_scratch(s, 1))) return st;
    }
    if (s->m->shard && !s->gathers) { /* ZeRO 3: this step's gathers, its metadata */
        fr_mem_stats before, after;
        fr_mem_get_stats(s->ctx, &before);
        if (!(s->gathers = fr_calloc(s->ctx, sizeof *s->gathers, FR_MEM_OTHER)))
            return FR_ERR_NOMEM;
        if ((st = plan_gathers(s, s->m->shard, s->gathers))) {
            fr_free(s->ctx, s->gathers);
            s->gathers = NULL;
            return st;
        }
        fr_mem_get_stats(s->ctx, &after);
        s->meta_bytes += after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
        s->meta_reserved += (after.reserved - after.cached) - (before.reserved - before.cached);
    }
    return fr_exec_init(&s->ex, &s->g, &s->plan);
}

fr_status fr_step_arena_release(fr_step *s) {
    fr_exec_release(&s->ex);
    return gemm_scratch(s, 0); /* the GEMM scratch goes with it */
}

fr_status fr_step_arena_acquire(fr_step *s) {
    if (s->ex.ctx) return FR_OK;
    fr_status st = gemm_scratch(s, 1);
    return st ? st : fr_exec_init(&s->ex, &s->g, &s->plan);
}

/* 16-bit storage <-> f32 working copies for the optimizer (pure half mode). */
static void widen(const void *src, fr_dtype dt, float *dst, size_t n) {
    if (dt == FR_F16) fr_f16_to_f32_n(src, dst, n);
    else fr_bf16_to_f32_n(src, dst, n);
}

static void narrow(const float *src, fr_dtype dt, void *dst, size_t n) {
    if (dt == FR_F16) fr_f32_to_f16_n(src, dst, n);
    else fr_f32_to_bf16_n(src, dst, n);
}

static fr_status optimizer_update(fr_step *s) {
    fr_model *m = s->m;
    const fr_optim_opts *o = &s->o.optim;
    s->t++;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || !p->grad_valid) continue; /* PyTorch skips params whose grad is None */
        if (s->fused && s->fused[i]) continue;        /* updated inside backward */
        size_t n = (size_t)fr_shape_numel(&p->shape);
        int half = p->dtype != FR_F32, ns = fr_step_optim_states(o);
        if (half && o->kind != FR_OPTIM_SGD) { /* one fused pass over the 16-bit tensors */
            fr_k_adam_half(p->data, grad_data(p), p->grad16 != NULL, (uint16_t *)p->state[0],
                           (uint16_t *)p->state[1], n, o, s->t, o->kind == FR_OPTIM_ADAMW,
                           p->dtype == FR_F16);
            continue;
        }
        float *w = p->data, *st[2] = {p->state[0], p->state[1]}, *grad = p->grad;
        if (half) { /* the update in f32, the result rounded back to 16 bits, state too */
            w = fr_alloc(s->ctx, n * sizeof *w * (size_t)(2 + ns), FR_MEM_WORKSPACE);
            if (!w) return FR_ERR_NOMEM;
            widen(p->data, p->dtype, w, n);
            if (p->grad16) {
                grad = w + n * (size_t)(1 + ns);
                widen(p->grad16, p->dtype, grad, n);
            }
            for (int k = 0; k < ns; k++) {
                st[k] = w + n * (size_t)(k + 1);
                widen(p->state[k], p->dtype, st[k], n);
            }
        }
        if (o->kind == FR_OPTIM_SGD) fr_k_sgd(w, grad, st[0], n, o, s->t == 1);
        else if (p->state_kind != FR_STATE_F32 && !half)
            fr_k_adam_state(w, p->grad, st[0], st[1], n, o, s->t, o->kind == FR_OPTIM_ADAMW,
                            (fr_state_kind)p->state_kind);
        else fr_k_adam(w, grad, st[0], st[1], n, o, s->t, o->kind == FR_OPTIM_ADAMW);
        if (half) {
            narrow(w, p->dtype, p->data, n);
            for (int k = 0; k < ns; k++) narrow(st[k], p->dtype, p->state[k], n);
            fr_free(s->ctx, w);
        }
    }
    return FR_OK;
}

/* Set one element of a gradient, f32 or in the weights' 16-bit format
 * (testing: the overflow injection). */
static void grad_set(fr_param *p, int64_t k, float x) {
    if (!p->grad16) p->grad[k] = x;
    else p->grad16[k] = p->dtype == FR_F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
}

static fr_dtype grad_dtype(const fr_param *p) { return p->grad16 ? p->dtype : FR_F32; }

/* The scaler's unscale: every gradient times 1/scale, in one pass that also
 * looks for inf or NaN (a scaled overflow); 1 if it found one. After a find
 * the rest is left: the step is skipped and the gradients dropped. */
static int unscale_grads(fr_step *s, float inv_scale) {
    fr_model *m = s->m;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || !grad_data(p) || !p->grad_valid) continue;
        if (fr_k_grad_unscale(grad_data(p), grad_dtype(p), (size_t)fr_shape_numel(&p->shape),
                              inv_scale))
            return 1;
    }
    return 0;
}

/* torch.nn.utils.clip_grad_norm_(max_norm, 2): total = ||(||g_i||)||; the
 * gradients are multiplied by min(1, max_norm / (total + 1e-6)). The squares
 * are summed in double (fr_k_grad_sumsq's fixed blocks), tensors in order. */
float fr_step_clip_coef(double sumsq, float max_norm) {
    return max_norm / ((float)sqrt(sumsq) + 1e-6f);
}

static void clip_grads(fr_step *s, float max_norm) {
    fr_model *m = s->m;
    double total = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || !grad_data(p) || !p->grad_valid) continue;
        total += fr_k_grad_sumsq(grad_data(p), grad_dtype(p), (size_t)fr_shape_numel(&p->shape));
    }
    float coef = fr_step_clip_coef(total, max_norm);
    if (coef >= 1.0f) return;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || !grad_data(p) || !p->grad_valid) continue;
        fr_k_grad_scale(grad_data(p), grad_dtype(p), (size_t)fr_shape_numel(&p->shape), coef);
    }
}

void fr_step_scaler(const fr_step *s, float *scale, uint64_t *skipped) {
    if (scale) *scale = s->scaler.enabled ? s->scaler.scale : 1.0f;
    if (skipped) *skipped = s->scaler.skipped;
}

/* Rows of outputs a sample has: 1, or its positions (a token model). */
static int64_t rows_per_sample(const fr_step *s) {
    const fr_shape *z = &s->g.vals[s->g.logits].shape;
    return fr_shape_numel(z) / z->d[z->ndim - 1] / z->d[0];
}

/* Argmax hits over the rows of samples off..off+n (every position of a
 * token model). */
int fr_step_hits(const fr_step *s, const float *z, const fr_batch *b, int off, int n) {
    const fr_shape *zs = &s->g.vals[s->g.logits].shape;
    int64_t c = zs->d[zs->ndim - 1], r = rows_per_sample(s);
    if (s->m->loss != FR_LOSS_CROSS_ENTROPY) return 0;
    return (int)fr_k_argmax_hits(z, b->y + off * r, n * r, c);
}

static int count_hits(const fr_step *s, const fr_batch *b, int off, int n) {
    return fr_step_hits(s, s->ex.ptr[s->g.logits], b, off, n);
}

void fr_step_set_loss_scale(fr_step *s, float scale) {
    fr_graph *g = &s->g;
    for (size_t i = 0; i < g->n_nodes; i++) {
        fr_op op = g->nodes[i].op;
        if (op == FR_OP_CROSS_ENTROPY_BWD || op == FR_OP_MSE_BWD) g->nodes[i].attr.scale = scale;
    }
}

/* The batch's mean loss from its micro-batches' sums, into *loss, *correct
 * and *l; a non-finite one is an error unless the scaler will skip it. */
fr_status fr_step_nonfinite(fr_step *s, float l, uint64_t step) {
    return fr_fail(s->ctx, FR_ERR_NUMERIC,
                   "non-finite loss (%g) at step %llu: lower the learning rate or check the data; "
                   "the weights were not updated",
                   (double)l, (unsigned long long)step);
}

fr_status fr_step_report(fr_step *s, const fr_batch *b, double total, int hits, float *loss,
                         int *correct, float *l) {
    *l = (float)(total / b->n);
    if (correct) *correct = hits;
    if (loss) *loss = *l;
    if (!isfinite(*l) && !(s->o.training && s->scaler.enabled))
        return fr_step_nonfinite(s, *l, s->runs);
    return FR_OK;
}

static fr_status after_node(void *arg, int pos);
static fr_status before_node(void *arg, int pos);
static fr_status take_buckets(fr_step *s, int pos);

/* ZeRO 3: group grp's weights are at block (NULL: gone) for the model and
 * the executor. */
static void bind_group(void *arg, int grp, float *block) {
    fr_step *s = arg;
    const fr_pshard *ps = s->m->shard;
    for (size_t i = 0; i < s->m->n_params; i++) {
        if (ps->group[i] != grp) continue;
        fr_param *p = &s->m->params[i];
        p->data = block ? block + (ps->flat[i] - ps->g_at[grp]) : NULL;
        s->ex.ptr[s->pv[i]] = p->data;
    }
}

fr_status fr_step_run(fr_step *s, const fr_batch *b, float *loss, int *correct) {
    fr_model *m = s->m;
    fr_graph *g = &s->g;
    fr_exec *e = &s->ex;
    if (!e->ctx) return fr_fail(s->ctx, FR_ERR_ARG, "the step's arena is released");
    if (b->n <= 0 || b->n > s->o.batch)
        return fr_fail(s->ctx, FR_ERR_ARG, "batch of %d samples for a step compiled for %d", b->n,
                       s->o.batch);
    int ce = m->loss == FR_LOSS_CROSS_ENTROPY, tokens = m->in_dtype == FR_I32;
    const void *labels = ce ? (const void *)b->y : (const void *)b->target;
    const void *inputs = tokens ? (const void *)b->idx : (const void *)b->x;
    if ((!inputs || !labels) && !(s->feed && fr_feed_holds(s->feed, b))) /* else on the device */
        return fr_fail(s->ctx, FR_ERR_ARG, "batch without %s",
                       inputs   ? "labels"
                       : tokens ? "token ids (idx)"
                                : "inputs");
    /* Labels (and token ids) are checked once for the whole batch, by their
     * position in it, before any micro-batch runs (a dataset's are checked
     * against the model, by index in their file, before training; a fed
     * batch's, on the device only, were checked so). */
    int64_t rows = ce && b->y ? b->n * rows_per_sample(s) : 0;
    for (int64_t i = 0, classes = fr_model_num_classes(m); i < rows; i++)
        if (b->y[i] < 0 || b->y[i] >= classes)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "label %d at position %lld of the batch is outside [0, %lld)",
                           (int)b->y[i], (long long)i, (long long)classes);
    if (fr_step_on_device(s)) return fr_dev_run(s, b, loss, correct);
    fr_status st = FR_OK;
    if (s->o.training && (st = alloc_grads(s))) return st;
    if (s->slots) { /* OPTIM_STEP nodes take step t + 1, as optimizer_update will */
        for (size_t i = 0; i < m->n_params; i++)
            s->slots[i] = (fr_optim_slot){.state = {m->params[i].state[0], m->params[i].state[1]},
                                          .state_kind = m->params[i].state_kind};
        s->optim_ctx = (fr_optim_ctx){&s->o.optim, s->t + 1, s->slots};
        e->optim = &s->optim_ctx;
    }
    for (size_t i = 0; i < m->n_params; i++) {
        e->ptr[s->pv[i]] = m->params[i].data;
        if (s->gv[i] >= 0 && s->fused && s->fused[i] == 2) continue; /* an arena value */
        if (s->gv[i] >= 0) {
            int f = s->fused && s->fused[i];
            e->ptr[s->gv[i]] = f ? m->params[i].data : grad_data(&m->params[i]);
            e->written[s->gv[i]] = (uint8_t)(!f && m->params[i].grad_valid);
        }
    }
    e->upd_lr = s->o.optim.lr;
    e->upd_wd = s->o.optim.weight_decay;
    e->upd_ws = s->upd_ws;
    e->upd_ws_len = s->upd_ws_len;
    e->gemm_ws = s->gemm_host;
    e->gemm_ws_len = s->gemm_host ? s->gemm_ws * sizeof(float) : 0;
    int64_t x_per = fr_shape_numel(&g->vals[g->input].shape) / s->micro;
    int64_t y_per = fr_shape_numel(&g->vals[g->label].shape) / s->micro;
    double total = 0;
    int hits = 0;
    /* Data parallel: b is this rank's slice of a global batch of global_n
     * samples; each micro-batch's loss is seeded with its share of the
     * global batch, so the sum over the ranks of the gradients is the one
     * process's gradient of the whole batch. */
    int ranks = s->o.training && s->buckets ? fr_comm_size(s->comm) : 1;
    int global = ranks > 1 && s->global_n > 0 ? s->global_n : b->n;
    uint64_t seed = s->o.seed + s->rank_seed; /* dropout: a stream per rank */
    for (int off = 0; off < b->n && !st; off += s->micro) {
        int n = b->n - off < s->micro ? b->n - off : s->micro;
        e->ptr[g->input] = tokens ? (void *)(b->idx + off * x_per) : (void *)(b->x + off * x_per);
        e->ptr[g->label] = ce ? (void *)(b->y + off * y_per) : (void *)(b->target + off * y_per);
        float share = (float)n / (float)global;
        fr_step_set_loss_scale(s, s->scaler.enabled ? share * s->scaler.scale : share);
        /* the buckets are sent during the last micro-batch's backward only:
         * before it, the gradients are partial sums of this rank */
        int last = off + s->micro >= b->n;
        s->dp_active = ranks > 1 && last;
        if (s->buckets && s->o.training && (off == 0 || s->dp_active)) /* a step's first or */
            fr_buckets_begin(s->buckets); /* sending micro-batch: none started nor freed yet */
        if (s->gathers) fr_gathers_begin(s->gathers);
        int lazy = s->buckets && s->zero >= 2; /* buckets taken before their first writer */
        e->post_node = s->dp_active || s->gathers ? after_node : NULL;
        e->pre_node = s->gathers || lazy ? before_node : NULL;
        e->post_arg = s;
        int split = s->n_fused ? s->loss_pos + 1 : s->plan.n_nodes; /* updates in backward: */
        st = fr_exec_run(e, 0, split, n, seed, s->runs);            /* check the loss first */
        float lm = st ? 0.0f : *(const float *)e->ptr[g->loss];
        if (!st && split < s->plan.n_nodes && !isfinite(lm)) { /* (never sharded: no gathers) */
            fr_exec_finish(e);
            s->runs++;
            if (loss) *loss = lm;
            if (correct) *correct = hits + count_hits(s, b, off, n);
            return fr_step_nonfinite(s, lm, s->runs);
        }
        if (!st) st = fr_exec_run(e, split, s->plan.n_nodes, n, seed, s->runs);
        e->post_node = NULL, e->pre_node = NULL;
        if (s->gathers) {
            fr_status gs = fr_gathers_end(s->ctx, s->m->shard, s->gathers, !st, bind_group, s);
            if (!st) st = gs;
        }
        if (!st && ranks > 1 && last) st = fr_buckets_finish(s->ctx, s->comm, s->buckets);
        s->runs++;
        if (!st) {
            total += (double)*(const float *)e->ptr[g->loss] * n;
            hits += count_hits(s, b, off, n);
        }
        fr_exec_finish(e);
    }
    if (st || (ranks > 1 && (st = fr_buffers_bcast(s->ctx, s->comm, m)))) return st;
    fr_batch gb = *b; /* the global batch: its loss and hits summed over the ranks */
    if (ranks > 1) {
        double sums[2] = {total, (double)hits};
        if ((st = fr_comm_sum_f64(s->ctx, s->comm, sums, 2, "the loss and hits of a step")))
            return st;
        total = sums[0], hits = (int)sums[1], gb.n = global;
    }
    float l;
    if ((st = fr_step_report(s, &gb, total, hits, loss, correct, &l)) || !s->o.training) return st;
    for (size_t i = 0; i < m->n_params; i++) {
        if (s->gv[i] >= 0 && !(s->fused && s->fused[i]))
            m->params[i].grad_valid = e->written[s->gv[i]];
        if (m->params[i].role == FR_P_NUM_BATCHES) (*(int64_t *)m->params[i].data) += s->accumulate;
    }
    return fr_step_host_update(s, l);
}

/* The executor's post-node hook under data parallelism: start the buckets
 * whose last gradient the node at plan position pos wrote (on the micro-
 * batch that sends them); at ZeRO 3, free the weights whose last use in
 * this interval it was. */
static fr_status after_node(void *arg, int pos) {
    fr_step *s = arg;
    fr_status st = s->dp_active ? fr_buckets_after_node(s->ctx, s->comm, s->buckets, pos) : FR_OK;
    if (!st && s->gathers) fr_gathers_post(s->ctx, s->gathers, pos, bind_group, s);
    return st;
}

/* ZeRO 3's pre-node hook: the weights the node reads gathered and bound. */
static fr_status before_node(void *arg, int pos) {
    fr_step *s = arg;
    fr_status st = s->buckets && s->zero >= 2 ? take_buckets(s, pos) : FR_OK;
    if (!st && s->gathers) st = fr_gathers_pre(s->ctx, s->m->shard, s->gathers, pos, bind_group, s);
    return st;
}

/* The gradients' buckets of this step (parallel/buckets.h): sizes, and the plan
 * positions of each gradient's first and last writer. */
static fr_status bucket_layout(const fr_step *s, size_t first_cap, size_t cap, fr_buckets *b) {
    const fr_model *m = s->m;
    size_t np = m->n_params + 1;
    size_t *len = fr_calloc(s->ctx, np * sizeof *len, FR_MEM_OTHER);
    int *pos = fr_alloc(s->ctx, 2 * np * sizeof *pos, FR_MEM_OTHER), *first = pos + np;
    int *param_of = fr_alloc(s->ctx, (s->g.n_vals + 1) * sizeof *param_of, FR_MEM_OTHER);
    order_uses u = {0};
    fr_status st = !len || !pos || !param_of
                       ? FR_ERR_NOMEM
                       : uses_of(s->ctx, &s->g, s->plan.order, s->plan.n_nodes, &u);
    for (size_t v = 0; v < s->g.n_vals && !st; v++) param_of[v] = -1;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        pos[i] = first[i] = -1;
        if (!fr_step_grad_bytes(s, i)) continue;
        len[i] = (size_t)fr_shape_numel(&m->params[i].shape);
        pos[i] = u.pos[s->gv[i]];
        param_of[s->gv[i]] = (int)i;
    }
    for (int k = 0; k < s->plan.n_nodes && !st; k++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[k]];
        for (int j = 0; j < nd->n_out; j++) {
            int v = nd->out[j], i = v >= 0 ? param_of[v] : -1;
            if (i >= 0 && first[i] < 0) first[i] = k;
        }
    }
    if (!st) st = fr_buckets_plan(s->ctx, (int)m->n_params, len, pos, first, first_cap, cap, b);
    fr_free(s->ctx, u.writers);
    fr_free(s->ctx, len);
    fr_free(s->ctx, pos);
    fr_free(s->ctx, param_of);
    return st;
}

int fr_step_shard_steps(const fr_step *s, int zero) {
    if (zero < 2 || !s->o.training || !s->o.rank_step_in_backward || s->scaler.enabled ||
        s->o.clip_grad_norm > 0 || s->accumulate != 1)
        return 0;
    if (zero >= 3) return 1; /* the steps change the shard, never a gathered block */
    /* stage 2: a bucket steps its owned share of the replicated weights after
     * the node at its freeing position: no later node may read them */
    fr_buckets tmp, *b = s->buckets;
    if (!b && bucket_layout(s, 0, 0, &tmp)) return 0;
    if (!b) b = &tmp;
    order_uses u = {0};
    int ok = !uses_of(s->ctx, &s->g, s->plan.order, s->plan.n_nodes, &u);
    for (size_t i = 0; ok && i < s->m->n_params; i++)
        if (b->bucket_of[i] >= 0 &&
            u.last_read[s->pv[i]] > fr_buckets_free_pos(b, b->bucket_of[i], s->plan.n_nodes))
            ok = 0;
    fr_free(s->ctx, u.writers);
    if (b == &tmp) fr_buckets_release(s->ctx, &tmp);
    return ok;
}

/* ZeRO >= 1: the optimizer's step t on param i's owned elements [a, b)
 * with their summed gradients g (the update is elementwise); the weights
 * are the replica's at stages 1 and 2, the shard's at 3. */
static void step_owned(fr_step *s, size_t i, size_t a, size_t b, const float *g, int64_t t) {
    fr_param *p = &s->m->params[i];
    const fr_optim_opts *o = &s->o.optim;
    size_t a3, b3;
    float *w = s->m->shard ? fr_pshard_slice(s->m->shard, (int)i, &a3, &b3) : (float *)p->data + a;
    if (o->kind == FR_OPTIM_SGD) fr_k_sgd(w, g, p->state[0], b - a, o, t == 1);
    else if (p->state_kind != FR_STATE_F32) /* bf16 moments: element by element */
        fr_k_adam_state(w, g, p->state[0], p->state[1], b - a, o, t, o->kind == FR_OPTIM_ADAMW,
                        (fr_state_kind)p->state_kind);
    else fr_k_adam(w, g, p->state[0], p->state[1], b - a, o, t, o->kind == FR_OPTIM_ADAMW);
}

/* The step inside backward of a rank (fr_step_shard_steps): bucket k's
 * share of the sums, the flat elements [a, e) at share, steps the owned
 * elements of its parameters now (Adam's t is the step's, t + 1). */
static fr_status share_step(void *arg, int k, const float *share, size_t a, size_t e) {
    fr_step *s = arg;
    (void)e;
    for (size_t i = 0; i < s->m->n_params; i++) {
        size_t pa, pb;
        if (s->buckets->bucket_of[i] != k || !s->ex.written[s->gv[i]] ||
            !fr_step_owned(s, i, &pa, &pb))
            continue;
        step_owned(s, i, pa, pb, share + (fr_buckets_flat(s->buckets, (int)i) + pa - a), s->t + 1);
        s->stepped[i] = 1;
    }
    return FR_OK;
}

void fr_step_bucket_peak(const fr_step *s, int zero, size_t *peak, size_t *reserved) {
    *peak = *reserved = 0;
    if (zero < 2) return;
    if (s->buckets) {
        fr_buckets_peak(s->buckets, s->plan.n_nodes, s->accumulate, peak, reserved);
        return;
    }
    fr_buckets b; /* one process: DDP's caps, the same walk */
    if (bucket_layout(s, 0, 0, &b)) return;
    b.zero = zero;
    fr_buckets_peak(&b, s->plan.n_nodes, s->accumulate, peak, reserved);
    fr_buckets_release(s->ctx, &b);
}

/* Stages 2 and 3: bucket k's block is gone; its gradients' views with it. */
static void bucket_freed(void *arg, int k) {
    fr_step *s = arg;
    for (size_t i = 0; i < s->m->n_params; i++)
        if (s->buckets->bucket_of[i] == k) {
            s->m->params[i].grad = NULL;
            if (s->ex.ptr) s->ex.ptr[s->gv[i]] = NULL;
        }
}

/* Stages 2 and 3: the buckets whose first writer is at pos (or before it)
 * take their blocks; their gradients are views of them. */
static fr_status take_buckets(fr_step *s, int pos) {
    fr_buckets *b = s->buckets;
    for (int k = 0; k < b->n; k++) {
        if (b->buf[k] || b->done[k] || b->first_pos[k] > pos) continue;
        fr_status st = fr_buckets_take(s->ctx, b, k);
        if (st) return st;
        for (size_t i = 0; i < s->m->n_params; i++)
            if (b->bucket_of[i] == k) {
                s->m->params[i].grad = fr_buckets_grad(b, (int)i);
                s->m->params[i].grad_valid = 0;
                s->ex.ptr[s->gv[i]] = s->m->params[i].grad;
                s->ex.written[s->gv[i]] = 0;
            }
    }
    return FR_OK;
}

fr_status fr_step_distribute(fr_step *s, fr_comm *c, size_t first_cap, size_t cap, int overlap,
                             int zero) {
    fr_model *m = s->m;
    if (!c || !s->o.training) return FR_OK;
    if (zero < 0 || zero > 3)
        return fr_fail(s->ctx, FR_ERR_ARG, "ZeRO stage %d: the stages are 0, 1, 2 and 3", zero);
    /* The shard rule splits tensors at any element: bf16 moments are
     * encoded element by element, int8 ones by blocks of 2048 values whose
     * scale a shard boundary would cut. */
    if (zero >= 1 && s->o.optim_state == FR_OPTIM_STATE_INT8 && s->o.optim.kind != FR_OPTIM_SGD)
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "--zero %d shards Adam's state at any element, and int8 state is encoded "
                       "by blocks of 2048 values that a shard would cut: use --optimizer-state "
                       "bf16 or fp32 with --zero 1 to 3",
                       zero);
    if (s->buckets || s->ex.ctx)
        return fr_fail(s->ctx, FR_ERR_ARG, "fr_step_distribute after materializing the step");
    if (s->n_fused || fr_step_on_device(s))
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "data parallel training needs every gradient stored on the host (%s)",
                       s->n_fused ? "the step updates parameters inside backward"
                                  : "the step runs on a device");
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++)
        if (fr_step_grad_bytes(s, i) && s->g.vals[s->gv[i]].dtype != FR_F32)
            st = fr_fail(s->ctx, FR_ERR_ARG,
                         "data parallel training sums f32 gradients; %s has %s gradients (pure "
                         "16-bit weights): use --precision fp32, bf16-mixed or fp16-mixed",
                         m->params[i].name, fr_dtype_name(s->g.vals[s->gv[i]].dtype));
    if (st) return st;
    fr_mem_stats before, after;
    fr_mem_get_stats(s->ctx, &before);
    fr_buckets *b = fr_calloc(s->ctx, sizeof *b, FR_MEM_OTHER);
    st = b ? bucket_layout(s, first_cap, cap, b) : FR_ERR_NOMEM;
    if (!st) st = fr_comm_reserve(s->ctx, c, b->n);
    if (!st) {
        b->overlap = overlap;
        fr_buckets_shard(b, zero, fr_comm_rank(c), fr_comm_size(c));
        s->zero = zero;
        b->on_free = bucket_freed, b->free_arg = s;
        s->buckets = b, b = NULL;
        s->comm = c;
        if (fr_step_shard_steps(s, zero)) { /* each share steps as it arrives: no shard */
            s->buckets->on_share = share_step;
            if (!(s->stepped = fr_calloc(s->ctx, m->n_params + 1, FR_MEM_OTHER))) st = FR_ERR_NOMEM;
        }
        if (zero == 3) st = shard_weights(s, c);
        /* rank 0 keeps the one process's stream */
        s->rank_seed = (uint64_t)fr_comm_rank(c) * 0x9E3779B97F4A7C15ull;
    }
    if (b) fr_buckets_release(s->ctx, b);
    fr_free(s->ctx, b);
    /* the buckets' tables and the requests are the step's metadata now */
    fr_mem_get_stats(s->ctx, &after);
    s->meta_bytes += after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
    s->meta_reserved += (after.reserved - after.cached) - (before.reserved - before.cached);
    return st;
}

/* After backward, on the host: the scaler's check, clipping, the optimizer
 * step and zero_grad, over the gradients in fr_param.grad/grad16 (on a
 * device with the optimizer offloaded, those downloaded into them). */
static fr_status sharded_update(fr_step *s, float l);

fr_status fr_step_host_update(fr_step *s, float l) {
    fr_model *m = s->m;
    fr_status st;
    if (s->zero >= 1 && s->buckets) return sharded_update(s, l);
    if (s->inject_inf) { /* testing: an overflow in backward */
        for (size_t i = 0; i < m->n_params; i++)
            if (grad_data(&m->params[i]) && m->params[i].grad_valid) {
                grad_set(&m->params[i], 0, INFINITY);
                break;
            }
        s->inject_inf = 0;
    }
    /* Scanning every gradient is the scaler's job (an overflow in a scaled
     * backward shows as inf/NaN); without one, as in PyTorch, a non-finite
     * gradient reaches the weights and the next loss reports it. */
    int found_inf =
        !isfinite(l) || (s->scaler.enabled && unscale_grads(s, fr_scaler_inv_scale(&s->scaler)));
    if (found_inf) {
        fr_scaler_update(&s->scaler, 1); /* skip the step: the weights stay as they were */
    } else {
        if (s->o.clip_grad_norm > 0) clip_grads(s, s->o.clip_grad_norm);
        if ((st = optimizer_update(s))) return st;
        if (s->scaler.enabled) fr_scaler_update(&s->scaler, 0);
    }
    /* zero_grad: set_to_none releases the buffers, otherwise the next backward
     * overwrites them (the same as zeroing, without the memset). */
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        p->grad_valid = 0;
        if (s->o.optim.zero_grad_to_none && !s->buckets) { /* buckets stay: they are sent */
            fr_free(s->ctx, p->grad);
            fr_free(s->ctx, p->grad16);
            p->grad = NULL;
            p->grad16 = NULL;
        }
    }
    return FR_OK;
}

/* ZeRO >= 1: this rank's gradients of param i from element a on (stage
 * 1: in its bucket, where the reduce-scatter put the sums; stages 2 and 3:
 * in the shard). */
static float *owned_grad(const fr_step *s, size_t i, size_t a) {
    const fr_buckets *b = s->buckets;
    if (b->zero >= 2) return b->shard + (fr_buckets_flat(b, (int)i) + a - b->lo);
    return s->m->params[i].grad + a;
}

/* After the reduce-scatter, each rank holds the summed gradients of its
 * shard only: the scaler's inf/NaN check and clipping's sum of squares run
 * over the shard and are combined by one small allreduce each; each rank
 * steps its shard (the updates are elementwise), then the parameters are
 * all-gathered, so every rank has the whole updated weights. */
static fr_status sharded_update(fr_step *s, float l) {
    fr_model *m = s->m;
    fr_status st;
    size_t a, b;
    if (s->inject_inf && !s->buckets->on_share) { /* testing: an overflow in backward */
        for (size_t i = 0; i < m->n_params; i++)
            if (m->params[i].grad_valid && fr_step_owned(s, i, &a, &b)) {
                owned_grad(s, i, a)[0] = INFINITY;
                break;
            }
        s->inject_inf = 0;
    }
    double flag = 0;
    if (s->scaler.enabled) {
        float inv = fr_scaler_inv_scale(&s->scaler);
        for (size_t i = 0; i < m->n_params && !flag; i++)
            if (m->params[i].grad_valid && fr_step_owned(s, i, &a, &b))
                flag = fr_k_grad_unscale(owned_grad(s, i, a), FR_F32, b - a, inv);
        if ((st = fr_comm_sum_f64(s->ctx, s->comm, &flag, 1, "the loss scaler's inf/NaN flag")))
            return st;
    }
    if (!isfinite(l) || flag > 0) {
        fr_scaler_update(&s->scaler, 1); /* skip the step on every rank */
    } else {
        if (s->o.clip_grad_norm > 0) {
            double total = 0;
            for (size_t i = 0; i < m->n_params; i++)
                if (m->params[i].grad_valid && fr_step_owned(s, i, &a, &b))
                    total += fr_k_grad_sumsq(owned_grad(s, i, a), FR_F32, b - a);
            if ((st = fr_comm_sum_f64(s->ctx, s->comm, &total, 1, "the gradients' squared norm")))
                return st;
            float coef = fr_step_clip_coef(total, s->o.clip_grad_norm);
            for (size_t i = 0; i < m->n_params && coef < 1.0f; i++)
                if (m->params[i].grad_valid && fr_step_owned(s, i, &a, &b))
                    fr_k_grad_scale(owned_grad(s, i, a), FR_F32, b - a, coef);
        }
        s->t++;
        for (size_t i = 0; i < m->n_params; i++) {
            if (!m->params[i].grad_valid || !fr_step_owned(s, i, &a, &b)) continue;
            if (s->stepped && s->stepped[i]) { /* stepped in backward as its sums arrived */
                s->stepped[i] = 0;
                continue;
            }
            step_owned(s, i, a, b, owned_grad(s, i, a), s->t);
        }
        for (size_t i = 0; i < m->n_params && !s->m->shard; i++) { /* ZeRO 3 keeps shards */
            fr_param *p = &m->params[i];
            if (s->gv[i] < 0 || !p->grad_valid || s->buckets->bucket_of[i] < 0) continue;
            char what[160];
            snprintf(what, sizeof what, "the updated shards of %.100s", p->name);
            if ((st = fr_comm_allgather_shards_f32(
                     s->ctx, s->comm, p->data, fr_buckets_flat(s->buckets, (int)i),
                     (size_t)fr_shape_numel(&p->shape), s->buckets->total, what)))
                return st;
        }
        if (s->scaler.enabled) fr_scaler_update(&s->scaler, 0);
    }
    /* zero_grad (at stages 2 and 3 the buckets, and the gradients' views,
     * went as their shares arrived) */
    for (size_t i = 0; i < m->n_params; i++) m->params[i].grad_valid = 0;
    return FR_OK;
}

fr_status fr_step_state_whole(fr_step *s, int on) {
    fr_model *m = s->m;
    int ns = fr_step_optim_states(&s->o.optim), root = fr_comm_rank(s->comm) == 0;
    fr_status st = FR_OK;
    if (s->zero < 1 || !s->buckets || !ns) return FR_OK;
    if (!on) {
        for (size_t i = 0; s->whole_state && i < m->n_params; i++)
            for (int k = 0; k < ns; k++) {
                if (s->whole_state[2 * i + k] == (void *)s) continue; /* not swapped */
                fr_free(s->ctx, m->params[i].state[k]);
                m->params[i].state[k] = s->whole_state[2 * i + k];
            }
        fr_free(s->ctx, s->whole_state);
        s->whole_state = NULL;
        return FR_OK;
    }
    if (root && !(s->whole_state =
                      fr_alloc(s->ctx, 2 * (m->n_params + 1) * sizeof(void *), FR_MEM_WORKSPACE)))
        return FR_ERR_NOMEM; /* (every rank returns here only if rank 0's fails: see below) */
    for (size_t i = 0; root && i < 2 * m->n_params; i++) s->whole_state[i] = s;
    fr_mem_set_tag(s->ctx, "checkpoint: whole optimizer state");
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || s->buckets->bucket_of[i] < 0) continue;
        size_t n = (size_t)fr_shape_numel(&p->shape), a, b;
        const fr_state_kind kind = (fr_state_kind)p->state_kind;
        const size_t mine = fr_step_owned(s, i, &a, &b) ? b - a : 0;
        for (int k = 0; k < ns && !st; k++) {
            /* bf16 moments travel as f32 (decoded here, encoded back on
             * rank 0: the same bits) */
            float *dec = kind == FR_STATE_F32 || !mine
                             ? NULL
                             : fr_alloc(s->ctx, mine * sizeof(float), FR_MEM_WORKSPACE);
            float *full = root ? fr_alloc(s->ctx, n * sizeof(float), FR_MEM_WORKSPACE) : NULL;
            void *whole = root && kind != FR_STATE_F32
                              ? fr_alloc(s->ctx, fr_state_bytes(kind, n), FR_MEM_WORKSPACE)
                              : full;
            if ((root && (!full || !whole)) || (kind != FR_STATE_F32 && mine && !dec)) {
                fr_free(s->ctx, dec);
                if (whole != full) fr_free(s->ctx, whole);
                fr_free(s->ctx, full);
                st = FR_ERR_NOMEM; /* the others wait in the gather: the job ends on the failure */
                break;
            }
            if (dec) fr_state_decode(p->state[k], kind, mine, k == 0, dec);
            char what[160];
            snprintf(what, sizeof what, "the optimizer state of %.100s", p->name);
            st = fr_comm_gather_shards_f32(s->ctx, s->comm, dec ? dec : p->state[k], full,
                                           fr_buckets_flat(s->buckets, (int)i), n,
                                           s->buckets->total, what);
            fr_free(s->ctx, dec);
            if (root && whole != full) {
                if (!st) fr_state_encode(full, kind, n, k == 0, whole);
                fr_free(s->ctx, full);
            }
            if (root) {
                s->whole_state[2 * i + k] = p->state[k];
                p->state[k] = whole;
            }
        }
    }
    fr_mem_set_tag(s->ctx, NULL);
    if (st) fr_step_state_whole(s, 0);
    return st;
}

fr_status fr_step_params_whole(fr_step *s, int on) {
    fr_model *m = s->m;
    fr_pshard *ps = m->shard;
    int root = fr_comm_rank(s->comm) == 0;
    fr_status st = FR_OK;
    if (!ps) return FR_OK;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (!fr_pshard_holds(ps, (int)i)) continue;
        if (!on || st) {
            if (root) fr_free(s->ctx, p->data), p->data = NULL;
            continue;
        }
        fr_mem_set_tag(s->ctx, "checkpoint: whole weights");
        if (root && !(p->data = fr_alloc(s->ctx, ps->numel[i] * sizeof(float), FR_MEM_WORKSPACE)))
            st = FR_ERR_NOMEM; /* the others wait in the gather: the job ends on the failure */
        fr_mem_set_tag(s->ctx, NULL);
        if (!st) st = fr_pshard_gather_root(s->ctx, ps, (int)i, p->data);
    }
    if (st) fr_step_params_whole(s, 0);
    return st;
}

void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]) {
    const fr_model *m = s->m;
    memset(out, 0, FR_MEM_CAT_COUNT * sizeof out[0]);
    const fr_pshard *ps = m->shard;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!fr_pshard_holds(ps, (int)i)) out[FR_MEM_PARAMS] += param_bytes(p);
        if (s->gv[i] >= 0) {
            int kind;
            out[FR_MEM_GRADS] += fr_step_grad_bytes(s, i);
            out[FR_MEM_OPTIM] +=
                (size_t)fr_step_optim_states(&s->o.optim) * state_bytes_here(s, i, &kind);
        }
    }
    if (s->buckets && s->zero >= 2) { /* the gradient shard, and the buckets at their worst */
        size_t peak, res;
        fr_step_bucket_peak(s, s->zero, &peak, &res);
        out[FR_MEM_GRADS] += peak;
        if (!s->buckets->on_share) out[FR_MEM_GRADS] += (s->buckets->hi - s->buckets->lo) * 4;
    }
    if (ps) { /* ZeRO 3: the weights' shard and what the step gathers at its worst */
        size_t peak, res;
        fr_step_gathered_peak(s, &peak, &res);
        out[FR_MEM_PARAMS] += (ps->hi - ps->lo) * sizeof(float) + peak;
    }
    size_t per = (fr_value_bytes(&s->g.vals[s->g.input]) + fr_value_bytes(&s->g.vals[s->g.label])) /
                 (size_t)s->micro;
    out[FR_MEM_GRADS] += s->upd_ws_len * sizeof(float);
    out[FR_MEM_WORKSPACE] += s->gemm_ws * sizeof(float);                 /* the GEMM scratch */
    out[FR_MEM_ACTIVATIONS] += fr_offload_host_place(&s->g, NULL, NULL); /* host block */
    out[FR_MEM_DATA] = per * (size_t)s->o.batch;
    out[FR_MEM_OTHER] = s->meta_bytes;
}

void fr_step_predicted(const fr_step *s, size_t out[FR_MEM_CAT_COUNT], size_t *peak_total) {
    fr_step_persistent(s, out);
    size_t persistent = 0;
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) persistent += out[c];
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) out[c] += s->plan.peak[c];
    if (peak_total) *peak_total = persistent + s->plan.peak_total;
}

size_t fr_step_reserved(const fr_step *s) {
    if (fr_step_on_device(s)) return fr_dev_step_reserved(s); /* the budget is the device's */
    const fr_model *m = s->m;
    size_t r = 0;
    int ns = fr_step_optim_states(&s->o.optim);
    const fr_pshard *ps = m->shard;
    if (ps) { /* ZeRO 3: the weights' shard and the gathered blocks at the worst position */
        size_t peak, res;
        fr_step_gathered_peak(s, &peak, &res);
        if (ps->hi > ps->lo) r += fr_mem_block_bytes((ps->hi - ps->lo) * sizeof(float));
        r += res;
    }
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!fr_pshard_holds(ps, (int)i)) r += fr_mem_block_bytes(param_bytes(p));
        size_t g = fr_step_grad_bytes(s, i);
        if (g && !s->buckets) r += fr_mem_block_bytes(g);
        if (s->gv[i] >= 0 && s->o.training) {
            int kind;
            size_t sb = state_bytes_here(s, i, &kind);
            if (sb) r += (size_t)ns * fr_mem_block_bytes(sb);
        }
    }
    if (s->upd_ws_len) r += fr_mem_block_bytes(s->upd_ws_len * sizeof(float));
    if (s->gemm_ws) r += fr_mem_block_bytes(s->gemm_ws * sizeof(float));
    if (s->buckets && s->zero < 2) r += fr_buckets_reserved(s->buckets); /* a block a bucket */
    if (s->buckets && s->zero >= 2) { /* the shard, and the bucket blocks at their worst */
        size_t peak, res;
        fr_step_bucket_peak(s, s->zero, &peak, &res);
        r += res;
        if (s->buckets->hi > s->buckets->lo && !s->buckets->on_share)
            r += fr_mem_block_bytes((s->buckets->hi - s->buckets->lo) * sizeof(float));
    }
    /* optimizer_update's f32 working copies of one 16-bit tensor at a time
     * (SGD on 16-bit weights; Adam there is one fused pass without them) */
    size_t widest = 0;
    for (size_t i = 0; s->o.training && s->o.optim.kind == FR_OPTIM_SGD && i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || p->dtype == FR_F32 || (s->fused && s->fused[i])) continue;
        size_t w = (size_t)fr_shape_numel(&p->shape) * sizeof(float) * (size_t)(2 + ns);
        if (w > widest) widest = w;
    }
    if (widest) r += fr_mem_block_bytes(widest);
    if (s->plan.arena_bytes) r += fr_mem_block_bytes(s->plan.arena_bytes);
    size_t host = fr_offload_host_place(&s->g, NULL, NULL); /* offloaded activations */
    if (host) r += fr_mem_block_bytes(host);
    r += fr_mem_block_bytes(s->g.n_vals * sizeof(void *)) +
         fr_mem_block_bytes(s->g.n_vals); /* fr_exec_init */
    size_t per[FR_MEM_CAT_COUNT];
    fr_step_persistent(s, per);
    return r + s->meta_reserved + per[FR_MEM_DATA];
}

void fr_step_plan_info(const fr_step *s, fr_plan_info *o) {
    memset(o, 0, sizeof *o);
    o->micro_batch = s->micro;
    o->accumulate = s->accumulate;
    o->units = s->m->n_units;
    o->recomputed_units = s->recomputed_units;
    o->flops = s->flops;
    o->extra_flops = s->extra_flops;
    o->arena = s->plan.arena_bytes;
    o->mode = s->o.checkpoint;
    o->ckpt_arg = s->o.ckpt_arg;
    o->reserved = fr_step_reserved(s);
}
