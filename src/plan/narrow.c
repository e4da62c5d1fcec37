/* narrow.c — half gradients for 16-bit weights (see narrow.h). Works on the
 * graph and the order; the CAST is an op every backend runs. */
#include "plan/narrow.h"
#include "plan/insert.h"

/* The insertions are listed in ins: positions in [0, n_params], nodes after
 * them (one block, freed here). */
fr_status fr_narrow_half_grads(fr_graph *g, int **order_io, int *n_io, size_t n_params,
                               const int *pv, int *gv) {
    fr_ctx *ctx = g->ctx;
    fr_order_uses u;
    fr_status st = fr_order_uses_of(ctx, g, *order_io, *n_io, &u);
    if (st) return st;
    int *ins = fr_alloc(ctx, 2 * (n_params + 1) * sizeof *ins, FR_MEM_OTHER), n_ins = 0;
    if (!ins) st = FR_ERR_NOMEM;
    for (size_t i = 0; i < n_params && !st; i++) {
        int gvi = gv[i];
        if (gvi < 0) continue;
        fr_dtype dt = g->vals[pv[i]].dtype;
        if (dt != FR_F16 && dt != FR_BF16) continue;
        if (u.writers[gvi] != 1 || u.readers[gvi]) continue;
        int g16 = fr_graph_value(g, FR_VAL_GRAD, dt, g->vals[pv[i]].shape);
        fr_attr a = {0};
        a.dtype = dt;
        int c = g16 < 0 ? -1 : fr_graph_node(g, FR_OP_CAST, &gvi, 1, &a, -1, 0, NULL);
        if (c < 0) {
            st = g->status;
            break;
        }
        fr_node *cn = &g->nodes[c];
        g->vals[cn->out[0]].producer = -1; /* replaced by the 16-bit gradient */
        cn->out[0] = g16;
        cn->accumulate = 1u;
        g->vals[g16].param = (int)i;
        g->vals[gvi].param = -1;
        fr_gradient_to_step(g, (*order_io)[u.pos[gvi]], u.slot[gvi], gvi, c);
        ins[n_ins] = u.pos[gvi], ins[n_params + 1 + n_ins] = c, n_ins++;
        gv[i] = g16;
    }
    if (!st) st = fr_insert_after(ctx, order_io, n_io, ins, ins + n_params + 1, n_ins);
    fr_free(ctx, ins);
    fr_order_uses_release(ctx, &u);
    return st;
}
