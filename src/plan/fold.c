/* fold.c — backward nodes folded into the one before them (see fold.h). */
#include "plan/fold.h"

/* Whether value v is read or written by a node of order[0..n) other than
 * those at positions a and b (entries of -1 are nodes already folded). */
static int used_elsewhere(const fr_graph *g, const int *order, int n, int v, int a, int b) {
    for (int k = 0; k < n; k++) {
        if (k == a || k == b || order[k] < 0) continue;
        const fr_node *nd = &g->nodes[order[k]];
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] == v) return 1;
        for (int j = 0; j < nd->n_out; j++)
            if (nd->out[j] == v) return 1;
    }
    return 0;
}

void fr_fold_relu_into_pool(fr_graph *g, int *order, int *n_order, int *n_folded) {
    const int n = *n_order;
    int folded = 0;
    for (int k = 1; k < n; k++) {
        if (order[k - 1] < 0) continue; /* folded just now: no node before this one */
        fr_node *r = &g->nodes[order[k]], *p = &g->nodes[order[k - 1]];
        const int dy = r->in[0];
        if (r->op != FR_OP_RELU_BWD || p->op != FR_OP_MAXPOOL2D_BWD || dy < 0 || p->out[0] != dy ||
            p->in[1] != r->in[1] || r->out[0] < 0 || (r->accumulate & 1u) || (p->accumulate & 1u) ||
            used_elsewhere(g, order, n, dy, k - 1, k))
            continue;
        p->attr.masked = 1;
        p->out[0] = r->out[0];
        g->vals[r->out[0]].producer = order[k - 1];
        g->vals[dy].producer = -1;
        order[k] = -1; /* r leaves the order */
        folded++;
    }
    int w = 0;
    for (int k = 0; k < n; k++)
        if (order[k] >= 0) order[w++] = order[k];
    *n_order = w;
    if (n_folded) *n_folded = folded;
}
