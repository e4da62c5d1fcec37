/* zero.c — the step's data parallelism over MPI ranks (parallel/): the
 * gradients' buckets summed (or reduce-scattered) during backward, ZeRO's
 * shards of optimizer state (stage 1), gradients (2) and weights (3) by
 * parallel/shard.h's rule over the flat vector of the trainable gradients,
 * the sharded update (each rank steps its range, then the weights are
 * all-gathered), the step of a bucket's share as it arrives, ZeRO 3's
 * gathers of weights before their readers, and the whole state and
 * weights gathered on rank 0 for a checkpoint. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/state.h"
#include "parallel/buckets.h"
#include "parallel/comm.h"
#include "parallel/pshard.h"
#include "parallel/shard.h"
#include "plan/insert.h"
#include "train/place.h"
#include "train/zero.h"

int fr_step_owned(const fr_step *s, size_t i, size_t *a, size_t *b) {
    size_t n = (size_t)fr_shape_numel(&s->m->params[i].shape);
    *a = 0, *b = n;
    if (s->gv[i] < 0) return *a = *b = 0, 0;
    if (!s->dp.buckets || s->o.zero < 1) return n > 0;
    const fr_buckets *bk = s->dp.buckets;
    size_t f = fr_buckets_flat(bk, (int)i);
    size_t lo = bk->lo > f ? bk->lo : f, hi = bk->hi < f + n ? bk->hi : f + n;
    if (bk->bucket_of[i] < 0 || hi <= lo) return *a = *b = 0, 0;
    *a = lo - f, *b = hi - f;
    return 1;
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
fr_status fr_zero_plan_gathers(fr_step *s, const fr_pshard *ps, fr_gathers *out) {
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
        st = fr_gathers_plan(s->ctx, ps, n, off, grp, s->o.training ? s->sched.loss_pos : n, out);
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
    if (s->dp.gathers) {
        *peak = s->dp.gathers->peak, *reserved = s->dp.gathers->peak_reserved;
        return;
    }
    /* one process: the layout alone (no shard block), the same walk */
    fr_pshard ps;
    fr_gathers g;
    if (pshard_of(s, NULL, 0, 0, 0, &ps)) return;
    if (!fr_zero_plan_gathers((fr_step *)s, &ps, &g)) {
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
        ps ? pshard_of(s, c, fr_comm_rank(c), fr_comm_size(c), s->dp.buckets->n, ps) : FR_ERR_NOMEM;
    if (!st && (st = fr_comm_reserve(s->ctx, c, s->dp.buckets->n + 2 * ps->n_groups)))
        fr_pshard_release(s->ctx, ps);
    if (!st) {
        for (size_t i = 0; i < m->n_params; i++) {
            fr_param *p = &m->params[i];
            if (fr_pshard_holds(ps, (int)i) && p->data) fr_pshard_keep(ps, (int)i, p->data);
        }
        m->shard = s->dp.pshard = ps, ps = NULL;
        st = fr_model_relayout(m, NULL); /* the parameter block without the shards' tensors */
    }
    fr_free(s->ctx, ps);
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
    fr_order_uses u = {0};
    fr_status st = !len || !pos || !param_of
                       ? FR_ERR_NOMEM
                       : fr_order_uses_of(s->ctx, &s->g, s->plan.order, s->plan.n_nodes, &u);
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
    if (zero < 2 || !s->o.training || !s->o.rank_step_in_backward || s->opt.scaler.enabled ||
        s->o.clip_grad_norm > 0 || s->sched.accumulate != 1)
        return 0;
    if (zero >= 3) return 1; /* the steps change the shard, never a gathered block */
    /* stage 2: a bucket steps its owned share of the replicated weights after
     * the node at its freeing position: no later node may read them */
    fr_buckets tmp, *b = s->dp.buckets;
    if (!b && bucket_layout(s, 0, 0, &tmp)) return 0;
    if (!b) b = &tmp;
    fr_order_uses u = {0};
    int ok = !fr_order_uses_of(s->ctx, &s->g, s->plan.order, s->plan.n_nodes, &u);
    for (size_t i = 0; ok && i < s->m->n_params; i++)
        if (b->bucket_of[i] >= 0 &&
            u.last_read[s->pv[i]] > fr_buckets_free_pos(b, b->bucket_of[i], s->plan.n_nodes))
            ok = 0;
    fr_free(s->ctx, u.writers);
    if (b == &tmp) fr_buckets_release(s->ctx, &tmp);
    return ok;
}

/* ZeRO >= 1: the optimizer's step t on param i's owned elements [a, b)
 * with their summed gradients g; the weights are the replica's at stages 1
 * and 2, the shard's at 3. */
static fr_status step_owned(fr_step *s, size_t i, size_t a, size_t b, const float *g, int64_t t) {
    fr_param *p = &s->m->params[i];
    size_t a3, b3;
    float *w = s->m->shard ? fr_pshard_slice(s->m->shard, (int)i, &a3, &b3) : (float *)p->data + a;
    return fr_optim_step_range(s->ctx, &s->o.optim, fr_optp(s->m, i), w, g, b - a, t);
}

/* The step inside backward of a rank (fr_step_shard_steps): bucket k's
 * share of the sums, the flat elements [a, e) at share, steps the owned
 * elements of its parameters now (Adam's t is the step's, t + 1). */
static fr_status share_step(void *arg, int k, const float *share, size_t a, size_t e) {
    fr_step *s = arg;
    (void)e;
    fr_status st = FR_OK;
    for (size_t i = 0; i < s->m->n_params && !st; i++) {
        size_t pa, pb;
        if (s->dp.buckets->bucket_of[i] != k || !s->ex.written[s->gv[i]] ||
            !fr_step_owned(s, i, &pa, &pb))
            continue;
        st = step_owned(s, i, pa, pb, share + (fr_buckets_flat(s->dp.buckets, (int)i) + pa - a),
                        s->opt.t + 1);
        s->dp.stepped[i] = 1;
    }
    return st;
}

void fr_step_bucket_peak(const fr_step *s, int zero, size_t *peak, size_t *reserved) {
    *peak = *reserved = 0;
    if (zero < 2) return;
    if (s->dp.buckets) {
        fr_buckets_peak(s->dp.buckets, s->plan.n_nodes, s->sched.accumulate, peak, reserved);
        return;
    }
    fr_buckets b; /* one process: DDP's caps, the same walk */
    if (bucket_layout(s, 0, 0, &b)) return;
    b.zero = zero;
    fr_buckets_peak(&b, s->plan.n_nodes, s->sched.accumulate, peak, reserved);
    fr_buckets_release(s->ctx, &b);
}

/* Stages 2 and 3: bucket k's block is gone; its gradients' views with it. */
static void bucket_freed(void *arg, int k) {
    fr_step *s = arg;
    for (size_t i = 0; i < s->m->n_params; i++)
        if (s->dp.buckets->bucket_of[i] == k) {
            fr_optp(s->m, i)->grad = NULL;
            if (s->ex.ptr) s->ex.ptr[s->gv[i]] = NULL;
        }
}

/* Stages 2 and 3: the buckets whose first writer is at pos (or before it)
 * take their blocks; their gradients are views of them. */
fr_status fr_zero_take_buckets(fr_step *s, int pos) {
    fr_buckets *b = s->dp.buckets;
    for (int k = 0; k < b->n; k++) {
        if (b->buf[k] || b->done[k] || b->first_pos[k] > pos) continue;
        fr_status st = fr_buckets_take(s->ctx, b, k);
        if (st) return st;
        for (size_t i = 0; i < s->m->n_params; i++)
            if (b->bucket_of[i] == k) {
                fr_optim_param *q = fr_optp(s->m, i);
                q->grad = fr_buckets_grad(b, (int)i), q->grad_off = 0;
                q->grad_dt = FR_F32, q->grad_view = 1, q->grad_valid = 0;
                s->ex.ptr[s->gv[i]] = q->grad;
                s->ex.written[s->gv[i]] = 0;
            }
    }
    return FR_OK;
}

fr_status fr_step_distribute(fr_step *s, fr_comm *c) {
    fr_model *m = s->m;
    int zero = s->o.zero;
    if (!c || !s->o.training) return FR_OK;
    if (zero < 0 || zero > 3)
        return fr_fail(s->ctx, FR_ERR_ARG, "ZeRO stage %d: the stages are 0, 1, 2 and 3", zero);
    /* The shard rule splits tensors at any element: bf16 moments are
     * encoded element by element, int8 ones by blocks of 2048 values whose
     * scale a shard boundary would cut. */
    if (zero >= 1 && s->o.optim_state == FR_OPTIM_STATE_INT8 && fr_optim_compresses(&s->o.optim))
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "--zero %d shards Adam's state at any element, and int8 state is encoded "
                       "by blocks of 2048 values that a shard would cut: use --optimizer-state "
                       "bf16 or fp32 with --zero 1 to 3",
                       zero);
    if (fr_optim_check(s->ctx, &s->o.optim, s->o.optim_state, s->o.precision, zero))
        return FR_ERR_ARG;
    if (s->dp.buckets || s->ex.ctx)
        return fr_fail(s->ctx, FR_ERR_ARG, "fr_step_distribute after materializing the step");
    if (s->opt.n_fused || fr_place_second_memory(s->ctx))
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "data parallel training needs every gradient stored on the host (%s)",
                       s->opt.n_fused ? "the step updates parameters inside backward"
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
    st = b ? bucket_layout(s, s->o.bucket_first_cap, s->o.bucket_cap, b) : FR_ERR_NOMEM;
    if (!st) st = fr_comm_reserve(s->ctx, c, b->n);
    if (!st) {
        b->overlap = !s->o.no_overlap;
        fr_buckets_shard(b, zero, fr_comm_rank(c), fr_comm_size(c));
        b->on_free = bucket_freed, b->free_arg = s;
        s->dp.buckets = b, b = NULL;
        s->dp.comm = c;
        if (fr_step_shard_steps(s, zero)) { /* each share steps as it arrives: no shard */
            s->dp.buckets->on_share = share_step;
            if (!(s->dp.stepped = fr_calloc(s->ctx, m->n_params + 1, FR_MEM_OTHER)))
                st = FR_ERR_NOMEM;
        }
        if (zero == 3) st = shard_weights(s, c);
        /* rank 0 keeps the one process's stream */
        s->dp.rank_seed = (uint64_t)fr_comm_rank(c) * 0x9E3779B97F4A7C15ull;
    }
    if (b) fr_buckets_release(s->ctx, b);
    fr_free(s->ctx, b);
    /* the buckets' tables and the requests are the step's metadata now */
    fr_mem_get_stats(s->ctx, &after);
    s->meta_bytes += after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
    s->meta_reserved += (after.reserved - after.cached) - (before.reserved - before.cached);
    return st;
}

/* ZeRO >= 1: this rank's gradients of param i from element a on (stage
 * 1: in its bucket, where the reduce-scatter put the sums; stages 2 and 3:
 * in the shard). */
static float *owned_grad(const fr_step *s, size_t i, size_t a) {
    const fr_buckets *b = s->dp.buckets;
    if (b->zero >= 2) return b->shard + (fr_buckets_flat(b, (int)i) + a - b->lo);
    const fr_optim_param *q = fr_optp(s->m, i);
    return (float *)fr_optim_at(q->grad, q->grad_off) + a;
}

/* After the reduce-scatter, each rank holds the summed gradients of its
 * shard only: the scaler's inf/NaN check and clipping's sum of squares run
 * over the shard and are combined by one small allreduce each; each rank
 * steps its shard (the updates are elementwise), then the parameters are
 * all-gathered, so every rank has the whole updated weights. */
fr_status fr_zero_update(fr_step *s, float l) {
    fr_model *m = s->m;
    fr_status st;
    size_t a, b;
    if (s->opt.inject_inf && !s->dp.buckets->on_share) { /* testing: an overflow in backward */
        for (size_t i = 0; i < m->n_params; i++)
            if (fr_optp(m, i)->grad_valid && fr_step_owned(s, i, &a, &b)) {
                owned_grad(s, i, a)[0] = INFINITY;
                break;
            }
        s->opt.inject_inf = 0;
    }
    double flag = 0;
    if (s->opt.scaler.enabled) {
        float inv = fr_scaler_inv_scale(&s->opt.scaler);
        for (size_t i = 0; i < m->n_params && !flag; i++)
            if (fr_optp(m, i)->grad_valid && fr_step_owned(s, i, &a, &b))
                flag = fr_optim_range_unscale(s->ctx, owned_grad(s, i, a), b - a, inv);
        if ((st = fr_comm_sum_f64(s->ctx, s->dp.comm, &flag, 1, "the loss scaler's inf/NaN flag")))
            return st;
    }
    if (!isfinite(l) || flag > 0) {
        fr_scaler_update(&s->opt.scaler, 1); /* skip the step on every rank */
    } else {
        if (s->o.clip_grad_norm > 0) {
            double total = 0;
            for (size_t i = 0; i < m->n_params; i++)
                if (fr_optp(m, i)->grad_valid && fr_step_owned(s, i, &a, &b))
                    total += fr_optim_range_sumsq(s->ctx, owned_grad(s, i, a), b - a);
            if ((st =
                     fr_comm_sum_f64(s->ctx, s->dp.comm, &total, 1, "the gradients' squared norm")))
                return st;
            float coef = fr_optim_clip_coef(total, s->o.clip_grad_norm);
            for (size_t i = 0; i < m->n_params && coef < 1.0f; i++)
                if (fr_optp(m, i)->grad_valid && fr_step_owned(s, i, &a, &b))
                    fr_optim_range_scale(s->ctx, owned_grad(s, i, a), b - a, coef);
        }
        s->opt.t++;
        for (size_t i = 0; i < m->n_params; i++) {
            if (!fr_optp(m, i)->grad_valid || !fr_step_owned(s, i, &a, &b)) continue;
            if (s->dp.stepped && s->dp.stepped[i]) { /* stepped in backward as its sums arrived */
                s->dp.stepped[i] = 0;
                continue;
            }
            if ((st = step_owned(s, i, a, b, owned_grad(s, i, a), s->opt.t))) return st;
        }
        for (size_t i = 0; i < m->n_params && !s->m->shard; i++) { /* ZeRO 3 keeps shards */
            fr_param *p = &m->params[i];
            if (s->gv[i] < 0 || !fr_optp(m, i)->grad_valid || s->dp.buckets->bucket_of[i] < 0)
                continue;
            char what[160];
            snprintf(what, sizeof what, "the updated shards of %.100s", p->name);
            if ((st = fr_comm_allgather_shards_f32(
                     s->ctx, s->dp.comm, p->data, fr_buckets_flat(s->dp.buckets, (int)i),
                     (size_t)fr_shape_numel(&p->shape), s->dp.buckets->total, what)))
                return st;
        }
        if (s->opt.scaler.enabled) fr_scaler_update(&s->opt.scaler, 0);
    }
    /* zero_grad (at stages 2 and 3 the buckets, and the gradients' views,
     * went as their shares arrived) */
    for (size_t i = 0; i < m->n_params; i++) fr_optp(m, i)->grad_valid = 0;
    return FR_OK;
}

fr_status fr_step_state_whole(fr_step *s, int on) {
    fr_model *m = s->m;
    int ns = fr_optim_states(&s->o.optim), root = fr_comm_rank(s->dp.comm) == 0;
    fr_status st = FR_OK;
    if (s->o.zero < 1 || !s->dp.buckets || !ns) return FR_OK;
    if (!on) {
        for (size_t i = 0; s->dp.whole_state && i < m->n_params; i++)
            for (int k = 0; k < ns; k++) {
                if (s->dp.whole_state[2 * i + k] == (void *)s) continue; /* not swapped */
                fr_free(s->ctx, fr_optp(m, i)->state[k]);
                fr_optp(m, i)->state[k] = NULL;
            }
        fr_free(s->ctx, s->dp.whole_state);
        s->dp.whole_state = NULL;
        return fr_step_alloc_state(s); /* the records back to their views of the shard's blocks */
    }
    if (root && !(s->dp.whole_state =
                      fr_alloc(s->ctx, 2 * (m->n_params + 1) * sizeof(void *), FR_MEM_WORKSPACE)))
        return FR_ERR_NOMEM; /* (every rank returns here only if rank 0's fails: see below) */
    for (size_t i = 0; root && i < 2 * m->n_params; i++) s->dp.whole_state[i] = s;
    fr_mem_set_tag(s->ctx, "checkpoint: whole optimizer state");
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || s->dp.buckets->bucket_of[i] < 0) continue;
        size_t n = (size_t)fr_shape_numel(&p->shape), a, b;
        const fr_state_kind kind = (fr_state_kind)fr_optp(m, i)->state_kind;
        const size_t mine = fr_step_owned(s, i, &a, &b) ? b - a : 0;
        fr_optim_param *q = fr_optp(m, i);
        void *wholes[2] = {NULL, NULL};
        for (int k = 0; k < ns && !st; k++) {
            void *shard = fr_optim_at(q->state[k], q->state_off); /* this rank's range */
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
            if (dec) fr_state_decode(shard, kind, mine, k == 0, dec);
            char what[160];
            snprintf(what, sizeof what, "the optimizer state of %.100s", p->name);
            st = fr_comm_gather_shards_f32(s->ctx, s->dp.comm, dec ? dec : shard, full,
                                           fr_buckets_flat(s->dp.buckets, (int)i), n,
                                           s->dp.buckets->total, what);
            fr_free(s->ctx, dec);
            if (root && whole != full) {
                if (!st) fr_state_encode(full, kind, n, k == 0, whole);
                fr_free(s->ctx, full);
            }
            wholes[k] = whole;
        }
        for (int k = 0; root && k < ns; k++) { /* the records see the whole tensors, from byte 0 */
            if (!wholes[k]) continue;
            s->dp.whole_state[2 * i + k] = q->state[k];
            q->state[k] = wholes[k];
            q->state_off = 0;
        }
    }
    fr_mem_set_tag(s->ctx, NULL);
    if (st) fr_step_state_whole(s, 0);
    return st;
}

fr_status fr_step_params_whole(fr_step *s, int on) {
    fr_model *m = s->m;
    fr_pshard *ps = m->shard;
    int root = fr_comm_rank(s->dp.comm) == 0;
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

/* ZeRO 3: group grp's weights are at block (NULL: gone) for the model and
 * the executor. */
void fr_zero_bind_group(void *arg, int grp, float *block) {
    fr_step *s = arg;
    const fr_pshard *ps = s->m->shard;
    for (size_t i = 0; i < s->m->n_params; i++) {
        if (ps->group[i] != grp) continue;
        fr_param *p = &s->m->params[i];
        p->data = block ? block + (ps->flat[i] - ps->g_at[grp]) : NULL;
        s->ex.ptr[s->pv[i]] = p->data;
    }
}

/* The executor's post-node hook under data parallelism: start the buckets
 * whose last gradient the node at plan position pos wrote (on the micro-
 * batch that sends them); at ZeRO 3, free the weights whose last use in
 * this interval it was. */
fr_status fr_zero_after_node(void *arg, int pos) {
    fr_step *s = arg;
    fr_status st =
        s->dp.active ? fr_buckets_after_node(s->ctx, s->dp.comm, s->dp.buckets, pos) : FR_OK;
    if (!st && s->dp.gathers) fr_gathers_post(s->ctx, s->dp.gathers, pos, fr_zero_bind_group, s);
    return st;
}

/* ZeRO 3's pre-node hook: the weights the node reads gathered and bound. */
fr_status fr_zero_before_node(void *arg, int pos) {
    fr_step *s = arg;
    fr_status st = s->dp.buckets && s->o.zero >= 2 ? fr_zero_take_buckets(s, pos) : FR_OK;
    if (!st && s->dp.gathers)
        st = fr_gathers_pre(s->ctx, s->m->shard, s->dp.gathers, pos, fr_zero_bind_group, s);
    return st;
}

/* One rank's bytes at ZeRO stage `zero`: the stages' formulas (written out
 * above fr_step_ranks_table in report/estimate.c) over the step's
 * persistent bytes, buckets and gathers; the budget and the estimate share
 * them. */
void fr_step_rank_bytes(const fr_step *s, int ranks, int zero, fr_rank_bytes *out) {
    const fr_model *m = s->m;
    size_t per[FR_MEM_CAT_COUNT], pred[FR_MEM_CAT_COUNT], total;
    fr_step_persistent(s, per);
    fr_step_predicted(s, pred, &total);
    size_t P = per[FR_MEM_PARAMS], G = per[FR_MEM_GRADS], O = per[FR_MEM_OPTIM];
    if (ranks < 1) ranks = 1;
    size_t E = 0, Pt = 0; /* the trainable elements (what the shards split) and their bytes */
    for (size_t i = 0; i < m->n_params; i++)
        if (s->gv[i] >= 0) {
            size_t n = (size_t)fr_shape_numel(&m->params[i].shape);
            E += n, Pt += n * fr_dtype_size(m->params[i].dtype);
        }
    size_t bucket = 0, gathered = 0, res;
    fr_step_bucket_peak(s, zero, &bucket, &res);
    if (zero == 3) fr_step_gathered_peak(s, &gathered, &res);
    out->params = zero < 3 ? P : fr_shard_bytes(Pt, E, ranks) + (P - Pt) + gathered;
    out->grads = zero < 2 ? G : fr_step_shard_steps(s, zero) ? 0 : fr_shard_bytes(G, E, ranks);
    out->optim = zero < 1 ? O : fr_shard_bytes(O, E, ranks);
    out->buckets = zero < 2 ? 0 : bucket;
    out->rest = total - P - G - O; /* the rank's step: activations, workspace, data, other */
    out->total = out->params + out->grads + out->optim + out->buckets + out->rest;
    size_t kept = out->params + out->grads + out->optim + out->buckets;
    out->saving = P + G + O > kept ? P + G + O - kept : 0;
}
