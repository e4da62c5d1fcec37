/* test_plan_narrow.c — half gradients for 16-bit weights (plan/narrow.h),
 * on a graph built here by hand. Six parameters of 4 elements, each with an
 * f32 gradient value but the last (frozen):
 *   p0 f16 and p1 bf16, each gradient written by one node: narrowed;
 *   p2 f32: left alone;
 *   p3 f16 written by two nodes (micro-batches adding into it), p4 f16 read
 *   by a node: both keep their f32 gradient;
 *   p5 f16 frozen (no gradient).
 * The writers are relus of a step value a = relu(x) whose outputs are
 * replaced by the gradients, as autodiff points a rule's output at the
 * parameter's gradient (accumulate bit 0 set):
 *   n0 a = relu(x); n1 -> g0; n2 -> g1; n3 -> g2; n4 -> g3; n5 -> g3;
 *   n6 -> g4; n7 relu(g4)
 * in the order n0 .. n7. By the pass's rule: a CAST n8 (g0 -> a new f16
 * gradient) right after n1 and a CAST n9 (g1 -> a new bf16 gradient) right
 * after n2: the order n0 n1 n8 n2 n9 n3 .. n7; g0 and g1 become step
 * values made afresh by n1 and n2, belonging to no parameter; the new
 * gradients belong to p0 and p1, and the casts add into them. Then every
 * allocation made to fail in turn: out of memory, nothing leaked. */
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "fault_sweep.h"
#include "frugal.h"
#include "plan/narrow.h"

enum { NP = 6, N = 4 };

static fr_ctx *g_ctx;

typedef struct hand {
    fr_graph g;
    int pv[NP], gv[NP], *order, n;
} hand;

static fr_status build(fr_ctx *ctx, hand *h) {
    memset(h, 0, sizeof *h);
    fr_graph *g = &h->g;
    fr_graph_init(g, ctx);
    const fr_dtype dt[NP] = {FR_F16, FR_BF16, FR_F32, FR_F16, FR_F16, FR_F16};
    for (int i = 0; i < NP; i++) {
        if ((h->pv[i] = fr_graph_value(g, FR_VAL_PARAM, dt[i], fr_shape1(N))) < 0) return g->status;
        g->vals[h->pv[i]].param = i;
        h->gv[i] = -1;
        if (i == 5) continue;
        if ((h->gv[i] = fr_graph_value(g, FR_VAL_GRAD, FR_F32, fr_shape1(N))) < 0) return g->status;
        g->vals[h->gv[i]].param = i;
    }
    int x = fr_graph_value(g, FR_VAL_INPUT, FR_F32, fr_shape1(N)), a;
    if (x < 0 || fr_graph_node(g, FR_OP_RELU, &x, 1, NULL, -1, 0, &a) < 0) return g->status;
    const int writes[6] = {0, 1, 2, 3, 3, 4}; /* n1 .. n6 */
    for (int k = 0; k < 6; k++) {
        int c = fr_graph_node(g, FR_OP_RELU, &a, 1, NULL, -1, 0, NULL);
        if (c < 0) return g->status;
        g->vals[g->nodes[c].out[0]].producer = -1;
        g->nodes[c].out[0] = h->gv[writes[k]];
        g->nodes[c].accumulate = 1u;
    }
    if (fr_graph_node(g, FR_OP_RELU, &h->gv[4], 1, NULL, -1, 0, NULL) < 0) return g->status;
    for (size_t k = 0; k < g->n_nodes; k++) g->nodes[k].layer = 100 + (int)k;
    h->n = (int)g->n_nodes;
    if (!(h->order = fr_alloc(ctx, (size_t)h->n * sizeof *h->order, FR_MEM_OTHER)))
        return FR_ERR_NOMEM;
    for (int k = 0; k < h->n; k++) h->order[k] = k;
    return FR_OK;
}

static void release(fr_ctx *ctx, hand *h) {
    fr_free(ctx, h->order);
    fr_graph_release(&h->g);
}

static void test_narrow(void) {
    hand h;
    fr_status st = build(g_ctx, &h);
    CHECK(st == FR_OK && h.n == 8, "building the graph: %s", fr_last_error(g_ctx));
    if (st || h.n != 8) return release(g_ctx, &h);
    int gv0[NP];
    memcpy(gv0, h.gv, sizeof gv0);
    CHECK(fr_narrow_half_grads(&h.g, &h.order, &h.n, NP, h.pv, h.gv) == FR_OK, "narrow: %s",
          fr_last_error(g_ctx));
    const int want[10] = {0, 1, 8, 2, 9, 3, 4, 5, 6, 7};
    int same = h.n == 10;
    for (int k = 0; same && k < h.n; k++) same = h.order[k] == want[k];
    CHECK(same, "the order (%d nodes) is not n0 n1 n8 n2 n9 n3 n4 n5 n6 n7", h.n);
    const fr_graph *g = &h.g;
    CHECK(g->n_nodes == 10, "%zu nodes, want 10", g->n_nodes);
    const fr_dtype dt[2] = {FR_F16, FR_BF16};
    for (int i = 0; i < 2 && g->n_nodes == 10; i++) {
        const fr_node *c = &g->nodes[8 + i];
        int g16 = h.gv[i], w = 1 + i;
        CHECK(c->op == FR_OP_CAST && c->n_in == 1 && c->in[0] == gv0[i] && c->out[0] == g16 &&
                  c->attr.dtype == dt[i] && c->accumulate == 1u && c->layer == 100 + w,
              "param %d: node %d is %s reading %d writing %d (dtype %d, accumulate %#x, layer %d)",
              i, 8 + i, fr_op_get(c->op)->name, c->in[0], c->out[0], (int)c->attr.dtype,
              c->accumulate, c->layer);
        const fr_value *v = &g->vals[g16];
        CHECK(g16 != gv0[i] && v->kind == FR_VAL_GRAD && v->dtype == dt[i] && v->param == i &&
                  v->shape.ndim == 1 && v->shape.d[0] == N,
              "param %d: its new gradient %d of kind %d, dtype %d, param %d", i, g16, (int)v->kind,
              (int)v->dtype, v->param);
        const fr_value *f = &g->vals[gv0[i]];
        CHECK(f->kind == FR_VAL_STEP && f->dtype == FR_F32 && f->param == -1 && f->producer == w &&
                  g->nodes[w].accumulate == 0u,
              "param %d: the f32 gradient of kind %d, param %d, made by %d (accumulate %#x)", i,
              (int)f->kind, f->param, f->producer, g->nodes[w].accumulate);
    }
    for (int i = 2; i < NP; i++)
        CHECK(h.gv[i] == gv0[i] && (h.gv[i] < 0 || (g->vals[h.gv[i]].kind == FR_VAL_GRAD &&
                                                    g->vals[h.gv[i]].param == i)),
              "param %d: its gradient changed", i);
    CHECK(g->nodes[3].accumulate == 1u && g->nodes[4].accumulate == 1u &&
              g->nodes[5].accumulate == 1u && g->nodes[6].accumulate == 1u,
          "the writers of kept gradients no longer add into them");
    release(g_ctx, &h);
}

/* Building and narrowing with allocation n failing (the sweep in
 * fault_sweep.h): each fails cleanly, nothing leaks. */
static fr_status narrow_scenario(fr_ctx *ctx, void *arg) {
    (void)arg;
    hand h;
    fr_status st = build(ctx, &h);
    if (!st) st = fr_narrow_half_grads(&h.g, &h.order, &h.n, NP, h.pv, h.gv);
    release(ctx, &h);
    return st;
}

int main(void) {
    g_ctx = fr_ctx_new();
    test_narrow();
    fault_sweep_least("narrowing", 1, narrow_scenario, NULL);
    return ctx_free_done(g_ctx);
}
