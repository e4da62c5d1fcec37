/* plan.c — liveness, in-place reuse and best-fit offsets in one arena (the
 * approach of ggml's graph allocator and TFLite's arena planner). Values are
 * freed by liveness, never by name: x0..x6 or one reused x make one plan.
 *
 * Complexity: O(V + E) for liveness, O(V * F) for the in-order placement
 * where F is the number of free blocks at a time (small: a step has few
 * holes), O(B^2) for the greedy-by-size one over B blocks (by_size). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "plan/plan.h"

#define ALIGN 64

size_t fr_value_bytes(const fr_value *v) {
    return (size_t)fr_shape_numel(&v->shape) * fr_dtype_size(v->dtype);
}

static size_t aligned(size_t b) { return (b + ALIGN - 1) / ALIGN * ALIGN; }

typedef struct block {
    size_t off, size;
} block;

typedef struct arena_sim {
    block *free;
    size_t n_free, cap_free;
    size_t top;
} arena_sim;

static int take(fr_ctx *ctx, arena_sim *a, size_t size, size_t *off) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < a->n_free; i++)
        if (a->free[i].size >= size && (best == SIZE_MAX || a->free[i].size < a->free[best].size))
            best = i;
    if (best != SIZE_MAX) {
        *off = a->free[best].off;
        a->free[best].off += size;
        a->free[best].size -= size;
        if (a->free[best].size == 0) {
            memmove(&a->free[best], &a->free[best + 1], (a->n_free - best - 1) * sizeof(block));
            a->n_free--;
        }
        return 0;
    }
    /* Grow the top; a free block touching the top is absorbed. */
    if (a->n_free && a->free[a->n_free - 1].off + a->free[a->n_free - 1].size == a->top) {
        *off = a->free[a->n_free - 1].off;
        a->n_free--;
    } else {
        *off = a->top;
    }
    a->top = *off + size;
    (void)ctx;
    return 0;
}

static int give(fr_ctx *ctx, arena_sim *a, size_t off, size_t size) {
    if (fr_grow(ctx, (void **)&a->free, &a->cap_free, a->n_free + 1, sizeof(block), FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    size_t i = 0;
    while (i < a->n_free && a->free[i].off < off) i++;
    memmove(&a->free[i + 1], &a->free[i], (a->n_free - i) * sizeof(block));
    a->free[i] = (block){off, size};
    a->n_free++;
    if (i + 1 < a->n_free && a->free[i].off + a->free[i].size == a->free[i + 1].off) {
        a->free[i].size += a->free[i + 1].size;
        memmove(&a->free[i + 1], &a->free[i + 2], (a->n_free - i - 2) * sizeof(block));
        a->n_free--;
    }
    if (i > 0 && a->free[i - 1].off + a->free[i - 1].size == a->free[i].off) {
        a->free[i - 1].size += a->free[i].size;
        memmove(&a->free[i], &a->free[i + 1], (a->n_free - i - 1) * sizeof(block));
        a->n_free--;
    }
    return 0;
}

/* The storage blocks of the in-order placement: grp[v] the block value v
 * lives in (its first owner's id; in-place successors share it, -1 where v
 * took none), and per block its size and the positions in the order where it
 * is taken and given back (both inclusive: inputs dying at a node are still
 * live while it writes its outputs). */
typedef struct lifetimes {
    int *grp, *start, *end;
    size_t *size;
} lifetimes;

static int lifetimes_init(fr_ctx *ctx, lifetimes *lt, int nv) {
    lt->grp = fr_alloc(ctx, (size_t)nv * sizeof *lt->grp, FR_MEM_OTHER);
    lt->start = fr_calloc(ctx, (size_t)nv * sizeof *lt->start, FR_MEM_OTHER);
    lt->end = fr_calloc(ctx, (size_t)nv * sizeof *lt->end, FR_MEM_OTHER);
    lt->size = fr_calloc(ctx, (size_t)nv * sizeof *lt->size, FR_MEM_OTHER);
    if (!lt->grp || !lt->start || !lt->end || !lt->size) return -1;
    for (int v = 0; v < nv; v++) lt->grp[v] = -1;
    return 0;
}

static void lifetimes_free(fr_ctx *ctx, lifetimes *lt) {
    fr_free(ctx, lt->grp), fr_free(ctx, lt->start), fr_free(ctx, lt->end), fr_free(ctx, lt->size);
}

static int root_of(const fr_graph *g, int v) {
    while (g->vals[v].alias_of >= 0) v = g->vals[v].alias_of;
    return v;
}

static int is_step(const fr_graph *g, int v) {
    return v >= 0 && g->vals[v].kind == FR_VAL_STEP && g->vals[v].producer >= 0;
}

/* Greedy by size (TFLite's arena planner's "greedy by size"): the blocks
 * placed largest first, each in the smallest gap left by the placed blocks
 * whose lifetimes meet its own, else above them. The in-order best fit
 * leaves holes where a short-lived block (a workspace) splits a long gap;
 * this order fills big gaps with big blocks. Kept when it needs a smaller
 * arena; the live bytes, and so every peak, are the same either way. Up to
 * BY_SIZE_MAX blocks (quadratic in them). */
#define BY_SIZE_MAX 16384

typedef struct size_key {
    size_t size;
    int start, id;
} size_key;

/* larger first; then earlier; then the lower id (a total order: the same plan every time) */
static int by_size_cmp(const void *a, const void *b) {
    const size_key *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static fr_status by_size(fr_ctx *ctx, fr_graph *g, fr_plan *p, const lifetimes *lt) {
    const int nv = p->n_vals;
    int nb = 0;
    for (int v = 0; v < nv; v++) nb += lt->grp[v] == v;
    if (nb < 2 || nb > BY_SIZE_MAX) return FR_OK;
    size_key *blk = fr_alloc(ctx, (size_t)nb * sizeof *blk, FR_MEM_OTHER);
    int *placed = fr_alloc(ctx, (size_t)nb * sizeof *placed, FR_MEM_OTHER); /* by offset */
    size_t *off = fr_alloc(ctx, (size_t)nv * sizeof *off, FR_MEM_OTHER);
    if (!blk || !placed || !off) {
        fr_free(ctx, blk), fr_free(ctx, placed), fr_free(ctx, off);
        return FR_ERR_NOMEM;
    }
    nb = 0;
    for (int v = 0; v < nv; v++)
        if (lt->grp[v] == v) blk[nb++] = (size_key){lt->size[v], lt->start[v], v};
    qsort(blk, (size_t)nb, sizeof *blk, by_size_cmp);
    size_t top = 0;
    int np = 0;
    for (int k = 0; k < nb; k++) {
        const int b = blk[k].id;
        const size_t need = lt->size[b];
        size_t prev = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
        for (int q = 0; q < np; q++) {
            const int o = placed[q];
            if (lt->start[o] > lt->end[b] || lt->start[b] > lt->end[o]) continue;
            if (off[o] >= prev && off[o] - prev >= need && off[o] - prev < best_gap)
                best = prev, best_gap = off[o] - prev;
            if (off[o] + lt->size[o] > prev) prev = off[o] + lt->size[o];
        }
        off[b] = best != SIZE_MAX ? best : prev;
        if (off[b] + need > top) top = off[b] + need;
        int q = np++;
        while (q > 0 && off[placed[q - 1]] > off[b]) placed[q] = placed[q - 1], q--;
        placed[q] = b;
    }
    if (top < p->arena_bytes) {
        for (int v = 0; v < nv; v++)
            if (lt->grp[v] >= 0) p->offset[v] = (int64_t)off[lt->grp[v]];
        for (int i = 0; i < p->n_nodes; i++) { /* views share their input's storage */
            const fr_node *n = &g->nodes[p->order[i]];
            if (!fr_op_get(n->op)->view) continue;
            for (int k = 0; k < n->n_out; k++) {
                const int o = n->out[k];
                if (is_step(g, o) && g->vals[o].producer == p->order[i])
                    p->offset[o] = p->offset[n->in[0]];
            }
        }
        p->arena_bytes = top;
    }
    fr_free(ctx, blk), fr_free(ctx, placed), fr_free(ctx, off);
    return FR_OK;
}

void fr_plan_release(fr_plan *p) {
    fr_ctx *ctx = p->ctx;
    if (!ctx) return;
    fr_free(ctx, p->offset);
    fr_free(ctx, p->cat);
    fr_free(ctx, p->ev_start);
    fr_free(ctx, p->ev);
    fr_free(ctx, p->order);
    memset(p, 0, sizeof *p);
}

fr_status fr_plan_build(fr_graph *g, const uint8_t *keep, const int *order, int n_order,
                        fr_plan *p) {
    fr_ctx *ctx = g->ctx;
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    int nv = (int)g->n_vals, nn = order ? n_order : (int)g->n_nodes;
    p->n_vals = nv;
    p->n_nodes = nn;
    p->order = fr_alloc(ctx, (size_t)(nn + 1) * sizeof *p->order, FR_MEM_OTHER);
    if (!p->order) return FR_ERR_NOMEM;
    for (int i = 0; i < nn; i++) p->order[i] = order ? order[i] : i;
    int *last = fr_alloc(ctx, (size_t)nv * sizeof *last, FR_MEM_OTHER);
    int *slot = fr_alloc(ctx, (size_t)nv * sizeof *slot, FR_MEM_OTHER); /* storage owner */
    lifetimes lt = {0};
    uint8_t *dead = fr_calloc(ctx, (size_t)nv, FR_MEM_OTHER);
    p->offset = fr_alloc(ctx, (size_t)nv * sizeof *p->offset, FR_MEM_OTHER);
    p->cat = fr_calloc(ctx, (size_t)nv * sizeof *p->cat, FR_MEM_OTHER);
    p->ev_start = fr_calloc(ctx, (size_t)(nn + 2) * sizeof *p->ev_start, FR_MEM_OTHER);
    size_t cap_ev = 0, n_ev = 0;
    arena_sim a = {0};
    fr_status st = FR_OK;
    if (!last || !slot || !dead || !p->offset || !p->cat || !p->ev_start ||
        lifetimes_init(ctx, &lt, nv)) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    /* Liveness per storage root: the last node that reads it or any view of it. */
    for (int v = 0; v < nv; v++) {
        last[v] = -1;
        p->offset[v] = -1;
        slot[v] = -1;
    }
    for (int i = 0; i < nn; i++) /* a value nobody reads dies where it is made */
        for (int k = 0; k < g->nodes[p->order[i]].n_out; k++) {
            int o = g->nodes[p->order[i]].out[k];
            if (o >= 0 && is_step(g, o)) last[o] = i;
        }
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[p->order[i]].n_in; j++) {
            int x = g->nodes[p->order[i]].in[j];
            if (x >= 0 && is_step(g, x)) {
                int r = root_of(g, x);
                if (last[r] < i) last[r] = i;
            }
        }
    for (int v = 0; v < nv; v++) {
        if (!is_step(g, v)) continue;
        int r = root_of(g, v);
        if (keep && keep[v] && is_step(g, r)) last[r] = nn;
        /* a parameter's gradient living in the arena (stepped in backward) is a gradient */
        p->cat[v] = g->vals[v].param >= 0                  ? FR_MEM_GRADS
                    : g->vals[r].saved || g->vals[v].saved ? FR_MEM_ACTIVATIONS
                                                           : FR_MEM_WORKSPACE;
    }
    size_t cur[FR_MEM_CAT_COUNT] = {0}, cur_total = 0;
#define EVENT(e)                                                                              \
    do {                                                                                      \
        if (fr_grow(ctx, (void **)&p->ev, &cap_ev, n_ev + 1, sizeof *p->ev, FR_MEM_OTHER)) {  \
            st = FR_ERR_NOMEM;                                                                \
            goto done;                                                                        \
        }                                                                                     \
        int e_ = (e), v_ = (e_ > 0 ? e_ : -e_) - 1;                                           \
        size_t b_ = fr_value_bytes(&g->vals[v_]);                                             \
        p->ev[n_ev++] = e_;                                                                   \
        if (e_ > 0) {                                                                         \
            cur[p->cat[v_]] += b_;                                                            \
            cur_total += b_;                                                                  \
            if (cur[p->cat[v_]] > p->peak[p->cat[v_]]) p->peak[p->cat[v_]] = cur[p->cat[v_]]; \
            if (cur_total > p->peak_total) {                                                  \
                p->peak_total = cur_total;                                                    \
                p->peak_node = i;                                                             \
            }                                                                                 \
        } else {                                                                              \
            cur[p->cat[v_]] -= b_;                                                            \
            cur_total -= b_;                                                                  \
        }                                                                                     \
    } while (0)

    for (int i = 0; i <= nn; i++) {
        p->ev_start[i] = (int)n_ev;
        if (i == nn) { /* end of step: what was kept dies */
            for (int v = 0; v < nv; v++)
                if (slot[v] == v && !dead[v] && last[v] == nn) {
                    dead[v] = 1;
                    EVENT(-(v + 1));
                    lt.end[lt.grp[v]] = nn;
                }
            break;
        }
        const fr_node *n = &g->nodes[p->order[i]];
        const fr_op_info *info = fr_op_get(n->op);
        for (int k = 0; k < n->n_out; k++) {
            int o = n->out[k];
            if (!is_step(g, o) || g->vals[o].producer != p->order[i]) continue;
            if (info->view) { /* shares the storage of its input */
                p->offset[o] = p->offset[n->in[0]];
                continue;
            }
            int j = info->inplace_in;
            if (k == 0 && j >= 0 && is_step(g, n->in[j])) {
                int r = root_of(g, n->in[j]);
                int owner = slot[r];
                if (owner >= 0 && !dead[owner] && last[r] == i && owner == r &&
                    fr_value_bytes(&g->vals[r]) == fr_value_bytes(&g->vals[o])) {
                    /* Run in place: o takes r's storage; r dies here. */
                    p->offset[o] = p->offset[r];
                    slot[o] = o;
                    lt.grp[o] = lt.grp[r];
                    dead[r] = 1;
                    EVENT(-(r + 1));
                    EVENT(o + 1);
                    continue;
                }
            }
            size_t off;
            take(ctx, &a, aligned(fr_value_bytes(&g->vals[o])), &off);
            p->offset[o] = (int64_t)off;
            slot[o] = o;
            lt.grp[o] = o, lt.start[o] = i, lt.size[o] = aligned(fr_value_bytes(&g->vals[o]));
            EVENT(o + 1);
        }
        /* Free what dies here: inputs at their last use and outputs nobody reads. */
        int cand[FR_MAX_IN + FR_MAX_OUT], nc = 0;
        for (int j = 0; j < n->n_in; j++)
            if (is_step(g, n->in[j])) cand[nc++] = root_of(g, n->in[j]);
        for (int k = 0; k < n->n_out; k++)
            if (is_step(g, n->out[k]) && !info->view) cand[nc++] = n->out[k];
        for (int c = 0; c < nc; c++) {
            int r = cand[c];
            if (slot[r] != r || dead[r] || last[r] != i) continue;
            dead[r] = 1;
            EVENT(-(r + 1));
            lt.end[lt.grp[r]] = i;
            if (give(ctx, &a, (size_t)p->offset[r], aligned(fr_value_bytes(&g->vals[r])))) {
                st = FR_ERR_NOMEM;
                goto done;
            }
        }
    }
    p->ev_start[nn + 1] = (int)n_ev;
    p->arena_bytes = a.top;
    if ((st = by_size(ctx, g, p, &lt))) goto done;
#undef EVENT
done:
    lifetimes_free(ctx, &lt);
    fr_free(ctx, a.free);
    fr_free(ctx, last);
    fr_free(ctx, slot);
    fr_free(ctx, dead);
    if (st) fr_plan_release(p);
    return st;
}
