/* offload.c — the activation-offload pass and the host block's layout (see
 * offload.h). Works on the order and the values' sizes only. */
#include <string.h>
#include "plan/offload.h"
#include "plan/plan.h"

#define HOST_ALIGN 64

size_t fr_offload_host_place(const fr_graph *g, char *base, void **ptr) {
    size_t off = 0;
    for (size_t v = 0; v < g->n_vals; v++) {
        if (g->vals[v].kind != FR_VAL_HOST) continue;
        if (base) ptr[v] = base + off;
        off += (fr_value_bytes(&g->vals[v]) + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    }
    return off;
}

/* The unit a node belongs to, for the pair's layer: its forward's layer. */
static int layer_of(const fr_graph *g, int node) {
    const fr_node *n = &g->nodes[node];
    return n->fwd >= 0 ? g->nodes[n->fwd].layer : n->layer;
}

/* Per value: the position that makes it, its last use up to the loss, its
 * first reader after the loss (-1: none), whether a view shares its storage. */
typedef struct uses {
    int loss_pos;
    int *made, *last_fwd, *first_bwd;
    uint8_t *viewed;
} uses;

/* The position after which v goes to the host, or -1 when it stays (see
 * offload.h for the rules). */
static int offload_at(const fr_graph *g, const uses *u, size_t v, size_t min_bytes) {
    const fr_value *val = &g->vals[v];
    if (val->kind != FR_VAL_STEP || val->producer < 0 || u->made[v] < 0 ||
        u->made[v] >= u->loss_pos || u->first_bwd[v] < 0 || val->alias_of >= 0 || u->viewed[v] ||
        (int)v == g->loss || (int)v == g->logits || fr_value_bytes(val) < min_bytes)
        return -1;
    int at = u->last_fwd[v] > u->made[v] ? u->last_fwd[v] : u->made[v];
    return u->first_bwd[v] > at + 1 ? at : -1; /* else back at once: nothing to gain */
}

fr_status fr_offload_saved(fr_graph *g, int **order_io, int *n_io, size_t min_bytes, int *n_off,
                           size_t *bytes) {
    fr_ctx *ctx = g->ctx;
    int n = *n_io, *order = *order_io, loss_pos = -1;
    if (n_off) *n_off = 0;
    if (bytes) *bytes = 0;
    for (int k = 0; k < n && loss_pos < 0; k++)
        for (int j = 0; j < g->nodes[order[k]].n_out; j++)
            if (g->nodes[order[k]].out[j] == g->loss) loss_pos = k;
    if (loss_pos < 0) return FR_OK;
    size_t nv = g->n_vals;
    /* per value: where it is made, its last use up to the loss, its first
     * reader after it, whether a view shares its storage */
    int *made = fr_alloc(ctx, 4 * (nv + 1) * sizeof *made, FR_MEM_OTHER);
    int *last_fwd = made ? made + nv + 1 : NULL, *first_bwd = made ? made + 2 * (nv + 1) : NULL;
    int *fetched = made ? made + 3 * (nv + 1) : NULL; /* per value: its fetched copy, or -1 */
    uint8_t *viewed = fr_calloc(ctx, nv + 1, FR_MEM_OTHER);
    int *after = NULL, *before = NULL, *pair = NULL, *no = NULL, m = 0; /* per moved value */
    uses u = {loss_pos, made, last_fwd, first_bwd, viewed};
    fr_status st = FR_OK;
    if (!made || !viewed) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t v = 0; v < nv; v++) {
        made[v] = last_fwd[v] = first_bwd[v] = fetched[v] = -1;
        if (g->vals[v].alias_of >= 0) viewed[g->vals[v].alias_of] = 1;
    }
    for (int k = 0; k < n; k++) {
        const fr_node *nd = &g->nodes[order[k]];
        for (int j = 0; j < nd->n_out; j++)
            if (nd->out[j] >= 0 && made[nd->out[j]] < 0) made[nd->out[j]] = k;
        for (int j = 0; j < nd->n_in; j++) {
            int x = nd->in[j];
            if (x < 0) continue;
            if (k <= loss_pos) last_fwd[x] = k;
            else if (first_bwd[x] < 0) first_bwd[x] = k;
        }
    }
    int cap = 0;
    for (size_t v = 0; v < nv; v++) cap += offload_at(g, &u, v, min_bytes) >= 0;
    if (!cap) goto done;
    after = fr_alloc(ctx, 3 * (size_t)cap * sizeof *after, FR_MEM_OTHER);
    no = fr_alloc(ctx, ((size_t)n + 2 * (size_t)cap) * sizeof *no, FR_MEM_OTHER);
    if (!after || !no) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    before = after + cap;
    pair = after + 2 * cap; /* the OFFLOAD node of each; its FETCH is the next node */
    for (size_t v = 0; v < nv && m < cap; v++) {
        int out_at = offload_at(g, &u, v, min_bytes);
        if (out_at < 0) continue;
        int vi = (int)v, h, back;
        fr_attr a = {0};
        int off = fr_graph_node(g, FR_OP_OFFLOAD, &vi, 1, &a, -1, 0, &h);
        if (off < 0) {
            st = g->status;
            goto done;
        }
        g->nodes[off].layer = layer_of(g, g->vals[v].producer);
        g->vals[h].kind = FR_VAL_HOST;
        g->vals[h].saved = 1;
        int fe = fr_graph_node(g, FR_OP_FETCH, &h, 1, &a, -1, 0, &back);
        if (fe < 0) {
            st = g->status;
            goto done;
        }
        g->nodes[fe].layer = layer_of(g, order[first_bwd[v]]);
        g->vals[back].saved = 1;
        fetched[v] = back;
        after[m] = out_at;
        before[m] = first_bwd[v];
        pair[m] = off; /* FETCH is off + 1 */
        m++;
        if (n_off) (*n_off)++;
        if (bytes) *bytes += fr_value_bytes(&g->vals[v]);
    }
    for (int q = loss_pos + 1; q < n; q++) { /* backward readers read the fetched values */
        fr_node *r = &g->nodes[order[q]];
        for (int j = 0; j < r->n_in; j++)
            if (r->in[j] >= 0 && (size_t)r->in[j] < nv && fetched[r->in[j]] >= 0)
                r->in[j] = fetched[r->in[j]];
    }
    /* The new order: fetches before their reader, offloads after their last
     * forward use, each group in value order. */
    int *head = fr_alloc(ctx, (2 * (size_t)n + 2 * (size_t)m) * sizeof *head, FR_MEM_OTHER);
    if (!head) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    int *head_after = head + n, *next = head + 2 * n, *next_after = next + m, w = 0;
    for (int k = 0; k < n; k++) head[k] = head_after[k] = -1;
    for (int i = m - 1; i >= 0; i--) { /* lists in value order */
        next[i] = head[before[i]], head[before[i]] = i;
        next_after[i] = head_after[after[i]], head_after[after[i]] = i;
    }
    for (int k = 0; k < n; k++) {
        for (int i = head[k]; i >= 0; i = next[i]) no[w++] = pair[i] + 1;
        no[w++] = order[k];
        for (int i = head_after[k]; i >= 0; i = next_after[i]) no[w++] = pair[i];
    }
    fr_free(ctx, head);
    fr_free(ctx, *order_io);
    *order_io = no;
    *n_io = w;
    no = NULL;
    /* the step keeps the loss and the logits (or a fused head's hits) to the end (step.c) */
    uint8_t *keep = fr_calloc(ctx, g->n_vals + 1, FR_MEM_OTHER); /* values the pass added too */
    if (!keep) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    if (g->loss >= 0) keep[g->loss] = 1;
    if (g->logits >= 0) keep[g->logits] = 1;
    if (g->hits >= 0) keep[g->hits] = 1;
    st = fr_offload_prefetch(g, keep, *order_io, *n_io, NULL);
    fr_free(ctx, keep);
done:
    fr_free(ctx, made);
    fr_free(ctx, viewed);
    fr_free(ctx, after);
    fr_free(ctx, no);
    return st;
}

/* The most bytes live at each position of p, events applied in order (a
 * position's births before its deaths, as the plan counts its peak). */
static void live_peaks(const fr_graph *g, const fr_plan *p, size_t *hi) {
    size_t cur = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        hi[i] = cur;
        for (int k = p->ev_start[i]; k < p->ev_start[i + 1]; k++) {
            int ev = p->ev[k], v = (ev > 0 ? ev : -ev) - 1;
            size_t b = fr_value_bytes(&g->vals[v]);
            cur = ev > 0 ? cur + b : cur - b;
            if (cur > hi[i]) hi[i] = cur;
        }
    }
}

fr_status fr_offload_prefetch(fr_graph *g, const uint8_t *keep, int *order, int n, int *moved) {
    fr_ctx *ctx = g->ctx;
    if (moved) *moved = 0;
    int loss_pos = -1;
    for (int k = 0; k < n && loss_pos < 0; k++)
        for (int j = 0; j < g->nodes[order[k]].n_out; j++)
            if (g->nodes[order[k]].out[j] == g->loss) loss_pos = k;
    int any = 0;
    for (int k = loss_pos + 1; k < n && !any; k++) any = g->nodes[order[k]].op == FR_OP_FETCH;
    if (loss_pos < 0 || !any) return FR_OK;
    fr_plan p;
    fr_status st = fr_plan_build(g, keep, order, n, &p);
    if (st) return st;
    size_t *hi = fr_alloc(ctx, (size_t)n * sizeof *hi, FR_MEM_OTHER);
    if (!hi) {
        fr_plan_release(&p);
        return FR_ERR_NOMEM;
    }
    live_peaks(g, &p, hi);
    const size_t peak = p.peak_total;
    fr_plan_release(&p);
    for (int f = loss_pos + 1; f < n; f++) {
        const fr_node *fe = &g->nodes[order[f]];
        if (fe->op != FR_OP_FETCH) continue;
        int v = fe->out[0], h = fe->in[0], r = f + 1;
        size_t b = fr_value_bytes(&g->vals[v]);
        for (; r < n; r++) { /* its first reader */
            const fr_node *nd = &g->nodes[order[r]];
            int reads = 0;
            for (int j = 0; j < nd->n_in; j++) reads |= nd->in[j] == v;
            if (reads) break;
        }
        if (r == n) continue;
        int own = layer_of(g, order[r]), other = -1, q = f;
        while (q - 1 > loss_pos) {
            int at = order[q - 1], l = layer_of(g, at);
            if (at == g->vals[h].producer || hi[q - 1] + b > peak) break;
            if (g->nodes[at].op != FR_OP_FETCH && l >= 0 && l != own) {
                if (other < 0) other = l;
                else if (l != other) break; /* a second layer ahead: far enough */
            }
            q--;
        }
        if (q == f) continue;
        /* FETCH to position q; the nodes at [q, f) one later, each holding b more */
        int node = order[f];
        size_t hq = hi[q] + b;
        for (int k = f; k > q; k--) {
            order[k] = order[k - 1];
            hi[k] = hi[k - 1] + b;
        }
        order[q] = node;
        hi[q] = hq;
        if (moved) *moved += f - q;
    }
    fr_free(ctx, hi);
    return FR_OK;
}

void fr_offload_waits(const fr_graph *g, const fr_plan *p, int *at) {
    const int n = p->n_nodes;
    for (int i = 0; i < n; i++) {
        const fr_node *nd = &g->nodes[p->order[i]];
        at[i] = -1;
        if (nd->op == FR_OP_FETCH) {
            int v = nd->out[0], k = i + 1;
            for (; k < n; k++) {
                const fr_node *r = &g->nodes[p->order[k]];
                int reads = 0;
                for (int j = 0; j < r->n_in; j++) reads |= r->in[j] == v;
                if (reads) break;
            }
            at[i] = k;
        } else if (nd->op == FR_OP_OFFLOAD) {
            int x = nd->in[0], k = i + 1;
            int64_t lo = p->offset[x], end = lo + (int64_t)fr_value_bytes(&g->vals[x]);
            for (; k < n && lo >= 0; k++) { /* the first value made over its bytes */
                int hit = 0;
                for (int e = p->ev_start[k]; e < p->ev_start[k + 1] && !hit; e++) {
                    if (p->ev[e] < 0) continue;
                    int u = p->ev[e] - 1;
                    int64_t a = p->offset[u], z = a + (int64_t)fr_value_bytes(&g->vals[u]);
                    hit = a >= 0 && a < end && lo < z;
                }
                if (hit) break;
            }
            at[i] = k;
        }
    }
}
