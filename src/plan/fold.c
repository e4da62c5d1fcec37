/* fold.c — nodes folded into the one whose output they read (see fold.h). */
#include "plan/fold.h"
#include "plan/insert.h"

fr_status fr_fold_relu_into_pool(fr_graph *g, int *order, int *n_order, int *n_folded) {
    const int n = *n_order;
    int folded = 0;
    fr_order_uses u;
    fr_status st = fr_order_uses_of(g->ctx, g, order, n, &u);
    if (st) return st;
    for (int k = 1; k < n; k++) {
        if (order[k - 1] < 0) continue; /* folded just now: no node before this one */
        fr_node *r = &g->nodes[order[k]], *p = &g->nodes[order[k - 1]];
        const int dy = r->in[0];
        /* pooling's dx: written by p alone, read by r alone */
        if (r->op != FR_OP_RELU_BWD || p->op != FR_OP_MAXPOOL2D_BWD || dy < 0 || p->out[0] != dy ||
            p->in[1] != r->in[1] || r->out[0] < 0 || (r->accumulate & 1u) || (p->accumulate & 1u) ||
            u.writers[dy] != 1 || u.readers[dy] != 1)
            continue;
        p->attr.masked = 1;
        p->out[0] = r->out[0];
        g->vals[r->out[0]].producer = order[k - 1];
        g->vals[dy].producer = -1;
        order[k] = -1; /* r leaves the order */
        folded++;
    }
    fr_order_uses_release(g->ctx, &u);
    int w = 0;
    for (int k = 0; k < n; k++)
        if (order[k] >= 0) order[w++] = order[k];
    *n_order = w;
    if (n_folded) *n_folded = folded;
    return FR_OK;
}

fr_status fr_fold_relu_into_bn(fr_graph *g, int *order, int *n_order, int *n_folded) {
    const int n = *n_order;
    int folded = 0;
    fr_order_uses u;
    fr_status st = fr_order_uses_of(g->ctx, g, order, n, &u);
    if (st) return st;
    for (int k = 0; k < n; k++) {
        fr_node *r = &g->nodes[order[k]];
        const int y = r->in[0], p = y >= 0 ? g->vals[y].producer : -1;
        if (r->op != FR_OP_RELU || y < 0 || p < 0 || r->out[0] < 0 || (r->accumulate & 1u))
            continue;
        fr_node *b = &g->nodes[p];
        /* BatchNorm's y: written by b alone, read by r alone, no view of either */
        if (b->op != FR_OP_BATCHNORM || b->out[0] != y || b->attr.relu || (b->accumulate & 1u) ||
            u.writers[y] != 1 || u.readers[y] != 1 || g->vals[y].alias_of >= 0 ||
            g->vals[r->out[0]].alias_of >= 0 || u.pos[y] >= k)
            continue;
        b->attr.relu = 1;
        b->out[0] = r->out[0];
        g->vals[r->out[0]].producer = p;
        g->vals[y].producer = -1;
        order[k] = -1; /* r leaves the order */
        folded++;
    }
    fr_order_uses_release(g->ctx, &u);
    int w = 0;
    for (int k = 0; k < n; k++)
        if (order[k] >= 0) order[w++] = order[k];
    *n_order = w;
    if (n_folded) *n_folded = folded;
    return FR_OK;
}
