/* remat.c — schedules over units and their application to the graph (see
 * remat.h). Knows lifetimes and costs, nothing of kernels. */
#include <string.h>
#include "plan/remat.h"

void fr_schedule_release(fr_ctx *ctx, fr_schedule *s) {
    fr_free(ctx, s->a);
    memset(s, 0, sizeof *s);
}

static fr_status push(fr_ctx *ctx, fr_schedule *s, int back, int unit) {
    size_t cap = (size_t)s->cap;
    if (fr_grow(ctx, (void **)&s->a, &cap, (size_t)s->n + 1, sizeof *s->a, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    s->cap = (int)cap;
    s->a[s->n++] = (fr_action){back, unit};
    return FR_OK;
}

fr_status fr_schedule_segments(fr_ctx *ctx, int n, const int *seg_start, fr_schedule *out) {
    memset(out, 0, sizeof *out);
    fr_status st = FR_OK;
    for (int u = 0; u < n && !st; u++) st = push(ctx, out, 0, u);
    for (int u = n - 1; u >= 0 && !st; u--) {
        int a = seg_start ? seg_start[u] : -1;
        if (a >= 0 && (u == n - 1 || seg_start[u + 1] != a)) /* the end of a recomputed segment */
            for (int k = a; k <= u && !st; k++) st = push(ctx, out, 0, k);
        if (!st) st = push(ctx, out, 1, u);
    }
    if (st) fr_schedule_release(ctx, out);
    return st;
}

/* T(l, s) by dynamic programming; the table is filled on first use. */
#define REV_MAX_L 512
#define REV_MAX_S 64

typedef struct revolve {
    int64_t *t; /* t[l * (S + 1) + s] */
    int *arg;
    int L, S;
} revolve;

static int64_t rev_t(const revolve *r, int l, int s) { return r->t[(size_t)l * (r->S + 1) + s]; }

static fr_status rev_fill(fr_ctx *ctx, revolve *r, int L, int S) {
    r->L = L;
    r->S = S;
    size_t n = (size_t)(L + 1) * (S + 1);
    r->t = fr_alloc(ctx, n * sizeof *r->t, FR_MEM_OTHER);
    r->arg = fr_alloc(ctx, n * sizeof *r->arg, FR_MEM_OTHER);
    if (!r->t || !r->arg) {
        fr_free(ctx, r->t);
        fr_free(ctx, r->arg);
        return FR_ERR_NOMEM;
    }
    for (int l = 1; l <= L; l++)
        for (int s = 1; s <= S; s++) {
            size_t k = (size_t)l * (S + 1) + s;
            r->arg[k] = 0;
            if (l == 1) {
                r->t[k] = 0;
            } else if (s == 1) {
                r->t[k] = (int64_t)l * (l - 1) / 2;
            } else {
                int64_t best = INT64_MAX;
                for (int j = 1; j < l; j++) {
                    int64_t c = j + rev_t(r, l - j, s - 1) + rev_t(r, j, s);
                    if (c < best) {
                        best = c;
                        r->arg[k] = j;
                    }
                }
                r->t[k] = best;
            }
        }
    return FR_OK;
}

int64_t fr_revolve_cost(int l, int s) {
    if (l < 1 || s < 1) return -1;
    if (s > l) s = l;
    fr_ctx *ctx = fr_ctx_new();
    revolve r;
    int64_t c = -1;
    if (ctx && l <= REV_MAX_L && !rev_fill(ctx, &r, l, s)) {
        c = rev_t(&r, l, s);
        fr_free(ctx, r.t);
        fr_free(ctx, r.arg);
    }
    fr_ctx_free(ctx);
    return c;
}

/* Reverse units [a, a+l) holding the state at a, with s slots (a's included). */
static fr_status rev_emit(fr_ctx *ctx, const revolve *r, fr_schedule *out, int a, int l, int s) {
    fr_status st = FR_OK;
    if (l == 1) {
        if (!(st = push(ctx, out, 0, a))) st = push(ctx, out, 1, a);
        return st;
    }
    if (s == 1) { /* recompute from a each time */
        for (int i = l - 1; i >= 0 && !st; i--) {
            for (int k = 0; k <= i && !st; k++) st = push(ctx, out, 0, a + k);
            if (!st) st = push(ctx, out, 1, a + i);
        }
        return st;
    }
    int j = r->arg[(size_t)l * (r->S + 1) + s];
    for (int k = 0; k < j && !st; k++) st = push(ctx, out, 0, a + k); /* advance to a+j */
    if (!st) st = rev_emit(ctx, r, out, a + j, l - j, s - 1);
    if (!st) st = rev_emit(ctx, r, out, a, j, s);
    return st;
}

fr_status fr_schedule_revolve(fr_ctx *ctx, int first, int n, int slots, fr_schedule *out) {
    memset(out, 0, sizeof *out);
    int l = n - first;
    if (l < 1 || slots < 1)
        return fr_fail(ctx, FR_ERR_ARG, "revolve needs at least one unit and one slot");
    if (l > REV_MAX_L) return fr_fail(ctx, FR_ERR_ARG, "revolve: at most %d units", REV_MAX_L);
    if (slots > l) slots = l;
    if (slots > REV_MAX_S) slots = REV_MAX_S;
    revolve r;
    fr_status st = rev_fill(ctx, &r, l, slots);
    if (st) return st;
    for (int u = 0; u < first && !st; u++) st = push(ctx, out, 0, u);
    if (!st) st = rev_emit(ctx, &r, out, first, l, slots);
    for (int u = first - 1; u >= 0 && !st; u--) st = push(ctx, out, 1, u);
    fr_free(ctx, r.t);
    fr_free(ctx, r.arg);
    if (st) fr_schedule_release(ctx, out);
    return st;
}

int fr_schedule_recomputed(const fr_schedule *s) {
    /* Units arrive in order the first time (the forward pass), so a FWD of
     * a unit at or below the highest one seen so far is a recomputation. */
    int n = 0, highest = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->a[i].back) continue;
        if (s->a[i].unit <= highest) n++;
        else highest = s->a[i].unit;
    }
    return n;
}

fr_status fr_remat_apply(fr_graph *g, const int *unit, int n_units, const fr_schedule *s,
                         int **order_out, int *n_order, int **origin_out, double *extra_flops) {
    fr_ctx *ctx = g->ctx;
    size_t n0 = g->n_nodes;
    int nf = g->n_forward;
    size_t cap = n0 * 2 + 16, n = 0, ccap = 16;
    int *order = fr_alloc(ctx, cap * sizeof *order, FR_MEM_OTHER), *origin = NULL;
    int *clone_of = fr_alloc(ctx, ccap * sizeof *clone_of, FR_MEM_OTHER); /* node c: clone_of[c - n0] */
    size_t nv_cap = g->n_vals; /* versions are tracked for the values that existed before */
    int *cur = fr_alloc(ctx, (nv_cap + 1) * sizeof *cur, FR_MEM_OTHER); /* current version */
    uint8_t *seen = fr_calloc(ctx, (size_t)n_units + 1, FR_MEM_OTHER);
    fr_status st = FR_OK;
    *extra_flops = 0;
    if (!order || !cur || !seen || !clone_of) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t v = 0; v < nv_cap; v++) cur[v] = (int)v;
#define APPEND(id)                                                                          \
    do {                                                                                    \
        if (fr_grow(ctx, (void **)&order, &cap, n + 1, sizeof *order, FR_MEM_OTHER)) {      \
            st = FR_ERR_NOMEM;                                                              \
            goto done;                                                                      \
        }                                                                                   \
        order[n++] = (id);                                                                  \
    } while (0)
    for (int k = 0; k < s->n; k++) {
        int u = s->a[k].unit;
        if (s->a[k].back) {
            for (size_t i = (size_t)nf; i < n0; i++) {
                if (unit[i] != u) continue;
                fr_node *nd = &g->nodes[i];
                for (int j = 0; j < nd->n_in; j++)
                    if (nd->in[j] >= 0 && (size_t)nd->in[j] < nv_cap) nd->in[j] = cur[nd->in[j]];
                APPEND((int)i);
            }
            continue;
        }
        if (!seen[u]) { /* the original forward pass */
            seen[u] = 1;
            for (int i = 0; i < nf; i++)
                if (unit[i] == u) APPEND(i);
            continue;
        }
        for (int i = 0; i < nf; i++) { /* recompute: clones reading the latest versions */
            if (unit[i] != u) continue;
            fr_node orig = g->nodes[i];
            int in[FR_MAX_IN], out[FR_MAX_OUT];
            for (int j = 0; j < orig.n_in; j++)
                in[j] = orig.in[j] >= 0 && (size_t)orig.in[j] < nv_cap ? cur[orig.in[j]] : orig.in[j];
            uint32_t skip = 0;
            for (int j = 0; j < orig.n_out; j++)
                if (orig.out[j] < 0) skip |= 1u << j;
            fr_attr a = orig.attr;
            a.recompute = 1;
            int c = fr_graph_node(g, orig.op, in, orig.n_in, &a, -1, skip, out);
            if (c < 0) {
                st = g->status;
                goto done;
            }
            g->nodes[c].layer = orig.layer;
            if (fr_grow(ctx, (void **)&clone_of, &ccap, (size_t)c - n0 + 1, sizeof *clone_of, FR_MEM_OTHER)) {
                st = FR_ERR_NOMEM;
                goto done;
            }
            clone_of[(size_t)c - n0] = i;
            for (int j = 0; j < orig.n_out; j++) {
                int o = orig.out[j];
                if (o < 0 || out[j] < 0) continue;
                g->vals[out[j]].saved = g->vals[o].saved;
                if ((size_t)o < nv_cap) cur[o] = out[j];
            }
            *extra_flops += fr_op_get(orig.op)->flops(g, &g->nodes[c]);
            APPEND(c);
        }
    }
#undef APPEND
    /* Nodes the schedule never placed (a unit without actions) run in index order at the end. */
    uint8_t *placed = fr_calloc(ctx, g->n_nodes, FR_MEM_OTHER);
    if (!placed) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < n; i++) placed[order[i]] = 1;
    for (size_t i = 0; i < n0 && !st; i++)
        if (!placed[i]) st = fr_fail(ctx, FR_ERR_ARG, "schedule leaves node %zu (%s) out", i,
                                     fr_op_get(g->nodes[i].op)->name);
    fr_free(ctx, placed);
    /* Each value recomputes itself, a clone's output the original's. */
    if (!st && !(origin = fr_alloc(ctx, (g->n_vals + 1) * sizeof *origin, FR_MEM_OTHER))) st = FR_ERR_NOMEM;
    for (size_t v = 0; !st && v < g->n_vals; v++) origin[v] = (int)v;
    for (size_t c = n0; !st && c < g->n_nodes; c++)
        for (int j = 0; j < g->nodes[c].n_out; j++)
            if (g->nodes[c].out[j] >= 0) origin[g->nodes[c].out[j]] = g->nodes[clone_of[c - n0]].out[j];
done:
    fr_free(ctx, cur);
    fr_free(ctx, seen);
    fr_free(ctx, clone_of);
    if (st) {
        fr_free(ctx, order);
        fr_free(ctx, origin);
        return st;
    }
    *origin_out = origin;
    *order_out = order;
    *n_order = (int)n;
    return FR_OK;
}
