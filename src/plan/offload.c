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
done:
    fr_free(ctx, made);
    fr_free(ctx, viewed);
    fr_free(ctx, after);
    fr_free(ctx, no);
    return st;
}
