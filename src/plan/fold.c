/* fold.c — nodes folded into the one whose output they read (see fold.h). */
#include "plan/fold.h"
#include "plan/insert.h"

/* Whether order[k] folds into another node: that node's id, its attr set,
 * or -1. The node at k reads the other's out[0] and writes the value the
 * other then writes in its place. */
typedef int (*fold_fn)(fr_graph *g, const fr_order_uses *u, const int *order, int k);

/* A pass of f over the order: each folded node's output is taken over by
 * the node it folds into, whose own out[0] is no longer made, and the
 * folded node leaves the order (it stays in the graph, unreferenced). */
static fr_status fold_pass(fr_graph *g, int *order, int *n_order, int *n_folded, fold_fn f) {
    const int n = *n_order;
    int folded = 0;
    fr_order_uses u;
    fr_status st = fr_order_uses_of(g->ctx, g, order, n, &u);
    if (st) return st;
    for (int k = 0; k < n; k++) {
        const int p = f(g, &u, order, k);
        if (p < 0) continue;
        fr_node *r = &g->nodes[order[k]], *q = &g->nodes[p];
        g->vals[q->out[0]].producer = -1;
        q->out[0] = r->out[0];
        g->vals[r->out[0]].producer = p;
        order[k] = -1;
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

/* RELU_BWD at k into the MAXPOOL2D_BWD at k - 1 (attr.masked) */
static int into_pool(fr_graph *g, const fr_order_uses *u, const int *order, int k) {
    if (k < 1 || order[k - 1] < 0) return -1; /* folded just now: no node before this one */
    fr_node *r = &g->nodes[order[k]], *p = &g->nodes[order[k - 1]];
    const int dy = r->in[0];
    /* pooling's dx: written by p alone, read by r alone */
    if (r->op != FR_OP_RELU_BWD || p->op != FR_OP_MAXPOOL2D_BWD || dy < 0 || p->out[0] != dy ||
        p->in[1] != r->in[1] || r->out[0] < 0 || (r->accumulate & 1u) || (p->accumulate & 1u) ||
        u->writers[dy] != 1 || u->readers[dy] != 1)
        return -1;
    p->attr.masked = 1;
    return order[k - 1];
}

fr_status fr_fold_relu_into_pool(fr_graph *g, int *order, int *n_order, int *n_folded) {
    return fold_pass(g, order, n_order, n_folded, into_pool);
}

/* RELU at k into the BATCHNORM that makes its x (attr.relu) */
static int into_bn(fr_graph *g, const fr_order_uses *u, const int *order, int k) {
    fr_node *r = &g->nodes[order[k]];
    const int y = r->in[0], p = y >= 0 ? g->vals[y].producer : -1;
    if (r->op != FR_OP_RELU || y < 0 || p < 0 || r->out[0] < 0 || (r->accumulate & 1u)) return -1;
    fr_node *b = &g->nodes[p];
    /* BatchNorm's y: written by b alone, earlier, read by r alone, no view of either */
    if (b->op != FR_OP_BATCHNORM || b->out[0] != y || b->attr.relu || (b->accumulate & 1u) ||
        u->writers[y] != 1 || u->readers[y] != 1 || g->vals[y].alias_of >= 0 ||
        g->vals[r->out[0]].alias_of >= 0 || u->pos[y] >= k)
        return -1;
    b->attr.relu = 1;
    return p;
}

fr_status fr_fold_relu_into_bn(fr_graph *g, int *order, int *n_order, int *n_folded) {
    return fold_pass(g, order, n_order, n_folded, into_bn);
}
