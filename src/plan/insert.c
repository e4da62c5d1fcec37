/* insert.c — the order utilities of the graph passes (see insert.h). */
#include "plan/insert.h"

fr_status fr_order_uses_of(fr_ctx *ctx, const fr_graph *g, const int *order, int n,
                           fr_order_uses *u) {
    size_t nv = g->n_vals + 1;
    int *a = fr_alloc(ctx, 5 * nv * sizeof *a, FR_MEM_OTHER);
    if (!a) return FR_ERR_NOMEM;
    *u = (fr_order_uses){a, a + nv, a + 2 * nv, a + 3 * nv, a + 4 * nv};
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

void fr_order_uses_release(fr_ctx *ctx, fr_order_uses *u) {
    fr_free(ctx, u->writers);
    *u = (fr_order_uses){0};
}

int fr_order_last_writer(const fr_graph *g, const int *order, int n, int v) {
    int at = -1;
    for (int k = 0; k < n; k++)
        for (int j = 0; j < g->nodes[order[k]].n_out; j++)
            if (g->nodes[order[k]].out[j] == v) at = k;
    return at;
}

/* head[k]: the last listed node to go after position k, next[i]: the one
 * listed before node[i] at the same position (-1 ends both). */
fr_status fr_insert_after(fr_ctx *ctx, int **order_io, int *n_io, const int *pos, const int *node,
                          int n_ins) {
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

void fr_gradient_to_step(fr_graph *g, int w, int slot, int gv, int c) {
    g->vals[gv].kind = FR_VAL_STEP;
    g->vals[gv].producer = w;
    g->nodes[w].accumulate &= ~(1u << slot);
    g->nodes[c].layer = g->nodes[w].layer;
}
