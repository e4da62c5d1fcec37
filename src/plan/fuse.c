/* fuse.c — the optimizer step in backward, as graph passes (see fuse.h).
 * Works on the graph and the order; the update itself is LINEAR_BWD's
 * epilogue or, for an OPTIM_STEP, the optimizer's, and which rule runs is
 * the caller's. */
#include "plan/fuse.h"
#include "plan/insert.h"

int fr_fuse_linear_updates(fr_graph *g, const int *order, int n_order, int loss_pos,
                           size_t n_params, const int *pv, const int *gv, fr_fuse_tile_fn tile,
                           void *arg, uint8_t *fused, size_t *tile_len) {
    int n_fused = 0;
    for (size_t i = 0; i < n_params; i++) {
        if (gv[i] < 0 || g->vals[pv[i]].dtype != FR_F32) continue;
        int writers = 0, pos = -1, slot = -1, late_reader = 0;
        for (int k = 0; k < n_order; k++) {
            const fr_node *n = &g->nodes[order[k]];
            for (int j = 0; j < n->n_out; j++)
                if (n->out[j] == gv[i]) writers++, pos = k, slot = j;
        }
        if (writers != 1 || pos <= loss_pos) continue;
        fr_node *w = &g->nodes[order[pos]];
        if (w->op != FR_OP_LINEAR_BWD || (slot != 1 && slot != 2)) continue;
        for (int k = pos + 1; k < n_order && !late_reader; k++) {
            const fr_node *n = &g->nodes[order[k]];
            for (int j = 0; j < n->n_in; j++) late_reader |= n->in[j] == pv[i];
        }
        if (late_reader) continue;
        w->update |= 1u << slot;
        if (slot == 1) { /* the weight's gradient passes through a tile of scratch */
            const fr_shape *ws = &g->vals[pv[i]].shape;
            /* the GEMM's rows: the batch, times the positions of a sequence */
            int64_t K = ws->d[0] ? fr_shape_numel(ws) / ws->d[0] : 0;
            int64_t rows = K ? fr_shape_numel(&g->vals[w->in[1]].shape) / K : 0;
            size_t len = ws->d[0] ? tile(ws->d[0], K, rows, arg) : 0;
            if (len > *tile_len) *tile_len = len;
        }
        fused[i] = 1;
        n_fused++;
    }
    return n_fused;
}

/* The insertions are listed in ins: positions in [0, n_params], nodes after
 * them (one block, freed here). */
fr_status fr_fuse_optim_steps(fr_graph *g, int **order_io, int *n_io, int loss_pos, size_t n_params,
                              const int *pv, const int *gv, uint8_t *fused, int *n_fused) {
    fr_ctx *ctx = g->ctx;
    fr_order_uses u = {0};
    fr_status st = fr_order_uses_of(ctx, g, *order_io, *n_io, &u);
    int *ins = st ? NULL : fr_alloc(ctx, 2 * (n_params + 1) * sizeof *ins, FR_MEM_OTHER), n_ins = 0;
    if (!st && !ins) st = FR_ERR_NOMEM;
    for (size_t i = 0; i < n_params && !st; i++) {
        int gvi = gv[i];
        if (gvi < 0 || g->vals[pv[i]].dtype != FR_F32 || g->vals[gvi].kind != FR_VAL_GRAD) continue;
        int pos = u.pos[gvi];
        /* one writer after the loss, nothing reading the gradient, nothing after it reading the weight */
        if (u.writers[gvi] != 1 || u.readers[gvi] || pos <= loss_pos || u.last_read[pv[i]] > pos)
            continue;
        fr_attr a = {0};
        a.param = (int)i;
        int c = fr_graph_node(g, FR_OP_OPTIM_STEP, &gvi, 1, &a, -1, 0, NULL);
        if (c < 0) {
            st = g->status;
            break;
        }
        fr_node *cn = &g->nodes[c];
        g->vals[cn->out[0]].producer = -1; /* the parameter itself, stepped in place */
        cn->out[0] = pv[i];
        cn->update = 1u;
        fr_gradient_to_step(g, (*order_io)[pos], u.slot[gvi], gvi, c);
        ins[n_ins] = pos, ins[n_params + 1 + n_ins] = c, n_ins++;
        fused[i] = 2;
        (*n_fused)++;
    }
    if (!st) st = fr_insert_after(ctx, order_io, n_io, ins, ins ? ins + n_params + 1 : NULL, n_ins);
    fr_free(ctx, ins);
    fr_order_uses_release(ctx, &u);
    return st;
}
