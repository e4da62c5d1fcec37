/* layout.c — the blocked-layout pass (layout.h): union-find over the values
 * the nodes tie, then a component's verdict. */
#include "plan/layout.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static int g_enabled = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    const char *e = getenv("FRUGAL_LAYOUT");
    g_enabled = !(e && strcmp(e, "plain") == 0);
}

int fr_layout_enabled(void) {
    pthread_once(&g_once, read_env);
    return g_enabled;
}

static int root(int *up, int v) {
    while (up[v] != v) v = up[v] = up[up[v]];
    return v;
}

static void join(int *up, int a, int b) {
    a = root(up, a), b = root(up, b);
    if (a != b) up[a < b ? b : a] = a < b ? a : b;
}

static int eligible(const fr_value *v) {
    return v->shape.ndim == 4 && v->kind == FR_VAL_STEP && v->alias_of < 0 &&
           (v->dtype == FR_F32 || v->dtype == FR_BF16) && v->shape.d[1] > 0 &&
           v->shape.d[1] % 16 == 0 && v->shape.d[1] <= FR_LAYOUT_MAX_C;
}

fr_status fr_layout_apply(fr_graph *g, const int *order, int n_order, int *n_blocked) {
    const fr_backend *be = fr_backend_of(g->ctx);
    if (n_blocked) *n_blocked = 0;
    if (!be->blocked_io || !fr_layout_enabled()) return FR_OK;
    const size_t nv = g->n_vals;
    int *up = fr_alloc(g->ctx, nv * sizeof *up, FR_MEM_OTHER);
    uint8_t *flag = fr_calloc(g->ctx, nv, FR_MEM_OTHER); /* bit 0 refused, bit 1 a conv's */
    if (!up || !flag) {
        fr_free(g->ctx, up);
        fr_free(g->ctx, flag);
        return FR_ERR_NOMEM;
    }
    for (size_t v = 0; v < nv; v++) {
        up[v] = (int)v;
        if (!eligible(&g->vals[v])) flag[v] |= 1;
        if (g->vals[v].alias_of >= 0) flag[g->vals[v].alias_of] |= 1; /* a view's storage */
    }
    for (int t = 0; t < n_order; t++) {
        const fr_node *n = &g->nodes[order[t]];
        const int conv = n->op == FR_OP_CONV2D || n->op == FR_OP_CONV2D_BWD;
        int tied = -1;
        for (int k = 0; k < n->n_in + n->n_out; k++) {
            const int j = k < n->n_in ? k : -1 - (k - n->n_in);
            const int v = k < n->n_in ? n->in[k] : n->out[k - n->n_in];
            if (v < 0 || g->vals[v].shape.ndim != 4) continue;
            const int r = be->blocked_io(g, n, j);
            if (r == FR_BLK_NO) flag[v] |= 1;
            if (conv) flag[v] |= 2;
            if (r == FR_BLK_TIED) {
                if (tied >= 0) join(up, tied, v);
                tied = v;
            }
        }
    }
    for (size_t v = 0; v < nv; v++) flag[root(up, (int)v)] |= flag[v];
    int count = 0;
    for (size_t v = 0; v < nv; v++) {
        const uint8_t f = flag[root(up, (int)v)];
        g->vals[v].blocked = f == 2; /* not refused (eligible: 4-d, ...), a conv's */
        count += g->vals[v].blocked;
    }
    for (int t = 0; t < n_order; t++) {
        fr_node *n = &g->nodes[order[t]];
        n->attr.blocked = 0;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] >= 0 && g->vals[n->in[j]].blocked) n->attr.blocked |= 1u << j;
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0 && g->vals[n->out[j]].blocked)
                n->attr.blocked |= 1u << (FR_BLK_OUT + j);
    }
    fr_free(g->ctx, up);
    fr_free(g->ctx, flag);
    if (count) fr_ops_resize_ws(g, order, n_order);
    if (n_blocked) *n_blocked = count;
    return FR_OK;
}
