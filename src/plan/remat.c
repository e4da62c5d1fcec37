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

/* Binomial checkpointing in closed form (Griewank and Walther, "Algorithm
 * 799: revolve", 2000). With beta(s, r) = C(s + r, s), the number of steps
 * that s slots reverse with each step run at most r + 1 times, and r the
 * least repetition number with l <= beta(s, r):
 *     T(l, s) = r l - beta(s + 1, r - 1),
 * the least solution of the recurrence in remat.h (tests/test_planner.c
 * checks it against the table and an exhaustive search). Integers stay
 * below l (s + r) < 2^62: the loop stops at the first beta >= l. */
static int64_t rev_reps(int64_t l, int64_t s, int64_t *beta) {
    int64_t r = 0, b = 1; /* b = beta(s, r) */
    while (b < l) {
        r++;
        b = b * (s + r) / r;
    }
    *beta = b;
    return r;
}

int64_t fr_revolve_cost(int l, int s) {
    if (l < 1 || s < 1) return -1;
    if (l == 1) return 0;
    if (s > l) s = l;
    int64_t b, r = rev_reps(l, s, &b);
    return r * l - b * r / (s + 1); /* beta(s + 1, r - 1) = beta(s, r) r / (s + 1) */
}

/* Where to put the next slot: advance j steps from a state held at a before
 * reversing [a+j, a+l) with s-1 slots and then [a, a+j) with s. This is
 * revolve's rule (its binomials bino1..bino5 are beta at neighbouring s and
 * r); it reaches T(l, s) for every 2 <= s (checked against the table). */
static int rev_split(int64_t l, int64_t s) {
    int64_t range, reps = rev_reps(l, s, &range);
    int64_t b1 = range * reps / (s + reps);                              /* beta(s-1, r)   */
    int64_t b2 = s > 1 ? b1 * s / (s + reps - 1) : 1;                    /* beta(s-1, r-1) */
    int64_t b3 = s == 1 ? 0 : s > 2 ? b2 * (s - 1) / (s + reps - 2) : 1; /* beta(s-2, r-1) */
    int64_t b4 = b2 * (reps - 1) / s;                                    /* beta(s, r-2)   */
    int64_t b5 = s > 2 ? b3 * (s - 2) / reps : 1;                        /* beta(s-3, r)   */
    int64_t j = l <= b1 + b3 ? b4 : l >= range - b5 ? b1 : l - b2 - b3;
    return (int)(j < 1 ? 1 : j > l - 1 ? l - 1 : j);
}

/* Reverse units [a, a+l) holding the state at a, with s slots (a's included).
 * Recursion depth at most s: the part that keeps all s slots is a loop. */
static fr_status rev_emit(fr_ctx *ctx, fr_schedule *out, int a, int l, int s) {
    fr_status st = FR_OK;
    while (l > 1 && s > 1 && !st) {
        int j = rev_split(l, s);
        for (int k = 0; k < j && !st; k++) st = push(ctx, out, 0, a + k); /* advance to a+j */
        if (!st) st = rev_emit(ctx, out, a + j, l - j, s - 1);
        l = j;
    }
    if (st) return st;
    if (l == 1) {
        if (!(st = push(ctx, out, 0, a))) st = push(ctx, out, 1, a);
        return st;
    }
    /* one slot: recompute from a each time */
    for (int i = l - 1; i >= 0 && !st; i--) {
        for (int k = 0; k <= i && !st; k++) st = push(ctx, out, 0, a + k);
        if (!st) st = push(ctx, out, 1, a + i);
    }
    return st;
}

fr_status fr_schedule_revolve(fr_ctx *ctx, int first, int n, int slots, fr_schedule *out) {
    memset(out, 0, sizeof *out);
    int l = n - first;
    if (l < 1 || slots < 1)
        return fr_fail(ctx, FR_ERR_ARG, "revolve needs at least one unit and one slot");
    if (slots > l) slots = l;
    /* l first forwards, T recomputed ones, l backwards: one allocation */
    int64_t total = 2 * (int64_t)n + fr_revolve_cost(l, slots);
    if (total > INT32_MAX)
        return fr_fail(ctx, FR_ERR_ARG,
                       "revolve: %d units with %d slots recompute %lld unit forwards; "
                       "give it more slots",
                       l, slots, (long long)fr_revolve_cost(l, slots));
    size_t cap = 0;
    if (fr_grow(ctx, (void **)&out->a, &cap, (size_t)total, sizeof *out->a, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    out->cap = (int)cap;
    fr_status st = FR_OK;
    for (int u = 0; u < first && !st; u++) st = push(ctx, out, 0, u);
    if (!st) st = rev_emit(ctx, out, first, l, slots);
    for (int u = first - 1; u >= 0 && !st; u--) st = push(ctx, out, 1, u);
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
    int *clone_of =
        fr_alloc(ctx, ccap * sizeof *clone_of, FR_MEM_OTHER); /* node c: clone_of[c - n0] */
    size_t nv_cap = g->n_vals; /* versions are tracked for the values that existed before */
    int *cur = fr_alloc(ctx, (nv_cap + 1) * sizeof *cur, FR_MEM_OTHER); /* current version */
    uint8_t *seen = fr_calloc(ctx, (size_t)n_units + 1, FR_MEM_OTHER);
    /* Nodes by unit, in index order (a counting sort): first[u] .. first[u+1]
     * in by_unit; an action costs its own nodes, not a scan of the graph. */
    int *first = fr_calloc(ctx, ((size_t)n_units + 2) * sizeof *first, FR_MEM_OTHER);
    int *by_unit = fr_alloc(ctx, (n0 + 1) * sizeof *by_unit, FR_MEM_OTHER);
    fr_status st = FR_OK;
    *extra_flops = 0;
    if (!order || !cur || !seen || !clone_of || !first || !by_unit) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t v = 0; v < nv_cap; v++) cur[v] = (int)v;
    for (size_t i = 0; i < n0; i++) first[unit[i] + 1]++;
    for (int u = 0; u < n_units; u++) first[u + 1] += first[u];
    for (size_t i = 0; i < n0; i++) by_unit[first[unit[i]]++] = (int)i;
    for (int u = n_units; u > 0; u--) first[u] = first[u - 1];
    first[0] = 0;
#define APPEND(id)                                                                     \
    do {                                                                               \
        if (fr_grow(ctx, (void **)&order, &cap, n + 1, sizeof *order, FR_MEM_OTHER)) { \
            st = FR_ERR_NOMEM;                                                         \
            goto done;                                                                 \
        }                                                                              \
        order[n++] = (id);                                                             \
    } while (0)
    for (int k = 0; k < s->n; k++) {
        int u = s->a[k].unit;
        if (s->a[k].back) {
            for (int q = first[u]; q < first[u + 1]; q++) {
                int i = by_unit[q];
                if (i < nf) continue;
                fr_node *nd = &g->nodes[i];
                for (int j = 0; j < nd->n_in; j++)
                    if (nd->in[j] >= 0 && (size_t)nd->in[j] < nv_cap) nd->in[j] = cur[nd->in[j]];
                APPEND(i);
            }
            continue;
        }
        if (!seen[u]) { /* the original forward pass */
            seen[u] = 1;
            for (int q = first[u]; q < first[u + 1]; q++)
                if (by_unit[q] < nf) APPEND(by_unit[q]);
            continue;
        }
        for (int q = first[u]; q < first[u + 1];
             q++) { /* recompute: clones reading the latest versions */
            int i = by_unit[q];
            if (i >= nf) continue;
            fr_node orig = g->nodes[i];
            int in[FR_MAX_IN], out[FR_MAX_OUT];
            for (int j = 0; j < orig.n_in; j++)
                in[j] =
                    orig.in[j] >= 0 && (size_t)orig.in[j] < nv_cap ? cur[orig.in[j]] : orig.in[j];
            uint32_t skip = 0;
            for (int j = 0; j < orig.n_out; j++)
                if (orig.out[j] < 0) skip |= 1u << j;
            fr_attr a = orig.attr;
            a.recompute = FR_REMAT_UNIT;
            int c = fr_graph_node(g, orig.op, in, orig.n_in, &a, -1, skip, out);
            if (c < 0) {
                st = g->status;
                goto done;
            }
            g->nodes[c].layer = orig.layer;
            if (fr_grow(ctx, (void **)&clone_of, &ccap, (size_t)c - n0 + 1, sizeof *clone_of,
                        FR_MEM_OTHER)) {
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
        if (!placed[i])
            st = fr_fail(ctx, FR_ERR_ARG, "schedule leaves node %zu (%s) out", i,
                         fr_op_get(g->nodes[i].op)->name);
    fr_free(ctx, placed);
    /* Each value recomputes itself, a clone's output the original's. */
    if (!st && !(origin = fr_alloc(ctx, (g->n_vals + 1) * sizeof *origin, FR_MEM_OTHER)))
        st = FR_ERR_NOMEM;
    for (size_t v = 0; !st && v < g->n_vals; v++) origin[v] = (int)v;
    for (size_t c = n0; !st && c < g->n_nodes; c++)
        for (int j = 0; j < g->nodes[c].n_out; j++)
            if (g->nodes[c].out[j] >= 0)
                origin[g->nodes[c].out[j]] = g->nodes[clone_of[c - n0]].out[j];
done:
    fr_free(ctx, cur);
    fr_free(ctx, seen);
    fr_free(ctx, clone_of);
    fr_free(ctx, first);
    fr_free(ctx, by_unit);
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

static int cheap_op(fr_op op, int half) {
    return op == FR_OP_GELU ||
           ((op == FR_OP_LAYERNORM || op == FR_OP_RMSNORM || op == FR_OP_SWIGLU) && !half);
}

fr_status fr_remat_cheap(fr_graph *g, int **order_io, int *n_io, int **origin_io,
                         double *extra_flops, int half) {
    fr_ctx *ctx = g->ctx;
    int n = *n_io, *order = *order_io, loss_pos = -1;
    for (int k = 0; k < n && loss_pos < 0; k++)
        for (int j = 0; j < g->nodes[order[k]].n_out; j++)
            if (g->nodes[order[k]].out[j] == g->loss) loss_pos = k;
    if (loss_pos < 0) return FR_OK;
    /* per value: its first reader after the loss and its last reader */
    size_t nv = g->n_vals;
    int *first_late = fr_alloc(ctx, (nv + 1) * sizeof *first_late, FR_MEM_OTHER);
    int *last = fr_alloc(ctx, (nv + 1) * sizeof *last, FR_MEM_OTHER);
    int *at = fr_alloc(ctx, 2 * ((size_t)n + 1) * sizeof *at, FR_MEM_OTHER); /* clone before k */
    int *of = at ? at + n + 1 : NULL; /* the node the clone before k remakes */
    fr_status st = FR_OK;
    if (!first_late || !last || !at) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t v = 0; v < nv; v++) first_late[v] = last[v] = -1;
    for (int k = 0; k < n; k++) {
        at[k] = -1;
        const fr_node *nd = &g->nodes[order[k]];
        for (int j = 0; j < nd->n_in; j++) {
            int x = nd->in[j];
            if (x < 0) continue;
            last[x] = k;
            if (k > loss_pos && first_late[x] < 0) first_late[x] = k;
        }
    }
    int n_clones = 0;
    for (int k = 0; k < loss_pos && !st; k++) {
        int p = order[k];
        const fr_node *nd = &g->nodes[p];
        int v = nd->out[0];
        if (!cheap_op(nd->op, half) || nd->attr.recompute || v < 0 || first_late[v] < 0) continue;
        int fl = first_late[v], inputs_live = at[fl] < 0;
        for (int j = 0; j < nd->n_in; j++) {
            int x = nd->in[j];
            if (x < 0 || g->vals[x].kind == FR_VAL_PARAM || g->vals[x].kind == FR_VAL_BUFFER)
                continue;
            if (last[x] < fl || g->vals[x].alias_of >= 0) inputs_live = 0;
        }
        if (!inputs_live) continue;
        fr_node orig = *nd;
        fr_attr a = orig.attr;
        a.recompute = FR_REMAT_CHEAP;
        int out[FR_MAX_OUT], skip = 0;
        for (int j = 0; j < orig.n_out; j++)
            if (orig.out[j] < 0) skip |= 1 << j;
        int c = fr_graph_node(g, orig.op, orig.in, orig.n_in, &a, -1, (uint32_t)skip, out);
        if (c < 0) {
            st = g->status;
            break;
        }
        g->nodes[c].layer = orig.layer;
        g->vals[out[0]].saved = 0;
        *extra_flops += fr_op_get(orig.op)->flops(g, &g->nodes[c]);
        for (int q = fl; q < n; q++) { /* backward readers read the clone's value */
            fr_node *r = &g->nodes[order[q]];
            for (int j = 0; j < r->n_in; j++)
                if (r->in[j] == v) r->in[j] = out[0];
        }
        g->vals[v].saved = 0;
        at[fl] = c;
        of[fl] = p;
        n_clones++;
    }
    if (!st && n_clones) {
        int *no = fr_alloc(ctx, ((size_t)n + n_clones) * sizeof *no, FR_MEM_OTHER);
        int *origin = fr_alloc(ctx, (g->n_vals + 1) * sizeof *origin, FR_MEM_OTHER);
        if (!no || !origin) {
            fr_free(ctx, no);
            fr_free(ctx, origin);
            st = FR_ERR_NOMEM;
            goto done;
        }
        int m = 0;
        for (int k = 0; k < n; k++) {
            if (at[k] >= 0) no[m++] = at[k];
            no[m++] = order[k];
        }
        memcpy(origin, *origin_io, nv * sizeof *origin);
        for (size_t v = nv; v < g->n_vals; v++) origin[v] = (int)v;
        for (int k = 0; k < n; k++) /* a clone's outputs recompute the original's */
            for (int j = 0; at[k] >= 0 && j < g->nodes[at[k]].n_out; j++) {
                int co = g->nodes[at[k]].out[j], oo = g->nodes[of[k]].out[j];
                if (co >= 0 && oo >= 0) origin[co] = (*origin_io)[oo];
            }
        fr_free(ctx, *order_io);
        fr_free(ctx, *origin_io);
        *order_io = no;
        *origin_io = origin;
        *n_io = m;
    }
done:
    fr_free(ctx, first_late);
    fr_free(ctx, last);
    fr_free(ctx, at);
    return st;
}
