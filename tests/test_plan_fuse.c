/* test_plan_fuse.c — the optimizer step in backward as graph passes
 * (plan/fuse.h), on a graph built here and differentiated by autodiff:
 *
 *   x (3,4) -> n0 linear(w1 (5,4), b1) -> n1 layernorm(lnw, lnb) -> n2 relu
 *           -> n3 linear(w2 (2,5), b2) -> n4 cross_entropy(labels) = loss
 *
 * whose backward (autodiff's rules: each parameter gradient written
 * directly by its rule's node) is n5 cross_entropy_bwd, n6 linear_bwd of n3
 * (dr, dw2, db2), n7 relu_bwd, n8 layernorm_bwd (dh, dlnw, dlnb), n9
 * linear_bwd of n0 (no dx, dw1, db1); the order is n0 .. n9 and the loss is
 * made at position 4. Expected results, by the passes' rules:
 *   - plain SGD in LINEAR_BWD: w1, b1, w2, b2 fused (update bits 1 and 2 of
 *     n6 and n9), lnw and lnb not (their writer is a layernorm_bwd); the
 *     scratch asked for w1 (out 5, in 4, rows 3) and w2 (2, 5, 3);
 *   - OPTIM_STEP nodes: all six, each right after its writer, the two of a
 *     writer in the reverse of parameter order;
 *   - neither fuses: a frozen parameter, a 16-bit weight, a weight read by
 *     a node after its gradient's writer, a gradient written before the
 *     loss's position, nor the tied weight of a second graph
 *     (x -> linear(w, b1) -> relu -> linear(w, b2) -> loss: two writers);
 *     OPTIM_STEP also not for a gradient some node reads, nor for one that
 *     is no longer a gradient value;
 *   - every allocation of fr_fuse_optim_steps made to fail in turn: out of
 *     memory, nothing leaked. */
#include <stdio.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "check.h"
#include "core/ctx.h"
#include "fault_sweep.h"
#include "frugal.h"
#include "plan/fuse.h"

enum { B = 3, K = 4, H = 5, C = 2 };
enum { W1, B1, LNW, LNB, W2, B2, NP };
enum { N_FWD = 5, N_ALL = 10, LOSS_POS = 4 };
enum { LIN2_BWD = 6, LN_BWD = 8, LIN1_BWD = 9 }; /* node ids = positions */

static fr_ctx *g_ctx;

typedef struct net {
    fr_graph g;
    int pv[NP], gv[NP], n_params;
    int *order, n;
} net;

/* The order n0 .. n(nodes-1), allocated. */
static fr_status identity(fr_ctx *ctx, net *t) {
    t->n = (int)t->g.n_nodes;
    t->order = fr_alloc(ctx, (size_t)t->n * sizeof *t->order, FR_MEM_OTHER);
    if (!t->order) return FR_ERR_NOMEM;
    for (int k = 0; k < t->n; k++) t->order[k] = k;
    return FR_OK;
}

static void net_release(fr_ctx *ctx, net *t) {
    fr_free(ctx, t->order);
    fr_graph_release(&t->g);
}

/* Parameters of shapes ps[0..np), gradients for all (in order); x, labels. */
static fr_status params(fr_graph *g, const fr_shape *ps, int np, net *t, int *x, int *lab) {
    t->n_params = np;
    for (int i = 0; i < np; i++) {
        if ((t->pv[i] = fr_graph_value(g, FR_VAL_PARAM, FR_F32, ps[i])) < 0) return g->status;
        g->vals[t->pv[i]].param = i;
    }
    for (int i = 0; i < np; i++) {
        if ((t->gv[i] = fr_graph_value(g, FR_VAL_GRAD, FR_F32, ps[i])) < 0) return g->status;
        g->vals[t->gv[i]].param = i;
    }
    *x = fr_graph_value(g, FR_VAL_INPUT, FR_F32, fr_shape2(B, K));
    *lab = fr_graph_value(g, FR_VAL_LABEL, FR_I32, fr_shape1(B));
    return *x < 0 || *lab < 0 ? g->status : FR_OK;
}

static fr_status differentiate(fr_graph *g, net *t, int z, int loss) {
    g->loss = loss, g->logits = z;
    int *gof = fr_alloc(g->ctx, g->n_vals * sizeof *gof, FR_MEM_OTHER);
    if (!gof) return FR_ERR_NOMEM;
    for (size_t v = 0; v < g->n_vals; v++) gof[v] = -1;
    for (int i = 0; i < t->n_params; i++) gof[t->pv[i]] = t->gv[i];
    fr_status st = fr_autodiff(g, gof);
    fr_free(g->ctx, gof);
    /* a layer per node, to see which one an inserted node takes */
    for (size_t k = 0; k < g->n_nodes && !st; k++) g->nodes[k].layer = 100 + (int)k;
    return st ? st : identity(g->ctx, t);
}

/* The graph of the header, differentiated, with the order n0 .. n9. */
static fr_status build_mlp(fr_ctx *ctx, net *t) {
    memset(t, 0, sizeof *t);
    fr_graph *g = &t->g;
    fr_graph_init(g, ctx);
    fr_shape ps[NP] = {fr_shape2(H, K), fr_shape1(H),    fr_shape1(H),
                       fr_shape1(H),    fr_shape2(C, H), fr_shape1(C)};
    int x, lab, o[4];
    fr_status st = params(g, ps, NP, t, &x, &lab);
    if (st) return st;
    fr_attr ln = {.eps = 1e-5f}, ce = {.scale = 1.0f};
    int in[3] = {x, t->pv[W1], t->pv[B1]};
    if (fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) < 0) return g->status;
    in[0] = o[0], in[1] = t->pv[LNW], in[2] = t->pv[LNB];
    if (fr_graph_node(g, FR_OP_LAYERNORM, in, 3, &ln, -1, 0, o) < 0) return g->status;
    if (fr_graph_node(g, FR_OP_RELU, o, 1, NULL, -1, 0, o) < 0) return g->status;
    in[0] = o[0], in[1] = t->pv[W2], in[2] = t->pv[B2];
    if (fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) < 0) return g->status;
    int z = o[0];
    in[0] = z, in[1] = lab;
    if (fr_graph_node(g, FR_OP_CROSS_ENTROPY, in, 2, &ce, -1, 0, o) < 0) return g->status;
    return differentiate(g, t, z, o[0]);
}

/* x -> linear(w (4,4), b1) -> relu -> linear(w, b2) -> cross_entropy: w's
 * gradient has two writers (n5's and n7's linear_bwd). */
static fr_status build_tied(fr_ctx *ctx, net *t) {
    memset(t, 0, sizeof *t);
    fr_graph *g = &t->g;
    fr_graph_init(g, ctx);
    fr_shape ps[3] = {fr_shape2(K, K), fr_shape1(K), fr_shape1(K)};
    int x, lab, o[4];
    fr_status st = params(g, ps, 3, t, &x, &lab);
    if (st) return st;
    fr_attr ce = {.scale = 1.0f};
    int in[3] = {x, t->pv[0], t->pv[1]};
    if (fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) < 0) return g->status;
    if (fr_graph_node(g, FR_OP_RELU, o, 1, NULL, -1, 0, o) < 0) return g->status;
    in[0] = o[0], in[1] = t->pv[0], in[2] = t->pv[2];
    if (fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) < 0) return g->status;
    int z = o[0];
    in[0] = z, in[1] = lab;
    if (fr_graph_node(g, FR_OP_CROSS_ENTROPY, in, 2, &ce, -1, 0, o) < 0) return g->status;
    return differentiate(g, t, z, o[0]);
}

/* Append a relu reading value v (a node after every other) to the order. */
static int append_reader(net *t, int v) {
    int c = fr_graph_node(&t->g, FR_OP_RELU, &v, 1, NULL, -1, 0, NULL);
    int *o = fr_alloc(t->g.ctx, ((size_t)t->n + 1) * sizeof *o, FR_MEM_OTHER);
    if (c < 0 || !o) return fr_free(t->g.ctx, o), 0;
    memcpy(o, t->order, (size_t)t->n * sizeof *o);
    o[t->n++] = c;
    fr_free(t->g.ctx, t->order);
    t->order = o;
    return 1;
}

/* The tile callback: records its calls, returns out * in * rows. */
static int n_calls;
static int64_t calls[8][3];
static size_t tile(int64_t out, int64_t in, int64_t rows, void *arg) {
    CHECK(arg == &n_calls, "the callback's argument is not the caller's");
    if (n_calls < 8) calls[n_calls][0] = out, calls[n_calls][1] = in, calls[n_calls][2] = rows;
    n_calls++;
    return (size_t)(out * in * rows);
}

static void check_fused(int line, const uint8_t *fused, const uint8_t *want, int np,
                        const char *what) {
    for (int i = 0; i < np; i++)
        CHECK_AT(line, fused[i] == want[i], "%s: param %d fused %d, want %d", what, i, fused[i],
                 want[i]);
}

static int built(int line, fr_status st, net *t) {
    CHECK_AT(line, st == FR_OK, "building the graph: %s", fr_last_error(g_ctx));
    if (st) net_release(g_ctx, t);
    return st == FR_OK;
}

static void check_structure(void) {
    net t;
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    const fr_graph *g = &t.g;
    /* what the expectations rest on: autodiff's nodes and slots as the header says */
    CHECK(g->n_nodes == N_ALL && g->nodes[4].out[0] == g->loss, "%zu nodes, loss by n4: %d",
          g->n_nodes, g->nodes[4].out[0] == g->loss);
    const struct {
        int node, op, slot, param;
    } w[] = {{LIN2_BWD, FR_OP_LINEAR_BWD, 1, W2},   {LIN2_BWD, FR_OP_LINEAR_BWD, 2, B2},
             {LN_BWD, FR_OP_LAYERNORM_BWD, 1, LNW}, {LN_BWD, FR_OP_LAYERNORM_BWD, 2, LNB},
             {LIN1_BWD, FR_OP_LINEAR_BWD, 1, W1},   {LIN1_BWD, FR_OP_LINEAR_BWD, 2, B1}};
    for (size_t k = 0; k < sizeof w / sizeof w[0] && g->n_nodes == N_ALL; k++)
        CHECK((int)g->nodes[w[k].node].op == w[k].op &&
                  g->nodes[w[k].node].out[w[k].slot] == t.gv[w[k].param],
              "node %d is %s, its output %d is not param %d's gradient", w[k].node,
              fr_op_get(g->nodes[w[k].node].op)->name, w[k].slot, w[k].param);
    net_release(g_ctx, &t);
}

static void test_linear_updates(void) {
    net t;
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    uint8_t fused[NP + 1] = {0};
    size_t len = 0;
    n_calls = 0;
    int n = fr_fuse_linear_updates(&t.g, t.order, t.n, LOSS_POS, NP, t.pv, t.gv, tile, &n_calls,
                                   fused, &len);
    const uint8_t want[NP] = {[W1] = 1, [B1] = 1, [W2] = 1, [B2] = 1};
    CHECK(n == 4, "%d fused, want 4", n);
    check_fused(__LINE__, fused, want, NP, "plain SGD");
    CHECK(t.g.nodes[LIN2_BWD].update == 6u && t.g.nodes[LIN1_BWD].update == 6u &&
              t.g.nodes[LN_BWD].update == 0u,
          "update bits %#x %#x %#x, want 0x6 0x6 0", t.g.nodes[LIN2_BWD].update,
          t.g.nodes[LIN1_BWD].update, t.g.nodes[LN_BWD].update);
    /* params in order: w1 (5 x 4, rows 3: 60 floats), then w2 (2 x 5, rows 3: 30) */
    CHECK(n_calls == 2 && calls[0][0] == H && calls[0][1] == K && calls[0][2] == B &&
              calls[1][0] == C && calls[1][1] == H && calls[1][2] == B,
          "%d tile calls: (%lld %lld %lld) (%lld %lld %lld), want (5 4 3) (2 5 3)", n_calls,
          (long long)calls[0][0], (long long)calls[0][1], (long long)calls[0][2],
          (long long)calls[1][0], (long long)calls[1][1], (long long)calls[1][2]);
    CHECK(len == 60, "tile length %zu, want 60", len);
    CHECK(t.n == N_ALL && t.g.n_nodes == N_ALL, "the pass changed the order or the nodes");
    net_release(g_ctx, &t);

    /* a larger tile length already asked for stays; fused[] past the
     * parameters stays as given */
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    memset(fused, 0, sizeof fused);
    fused[NP] = 9;
    len = 1000;
    n_calls = 0;
    fr_fuse_linear_updates(&t.g, t.order, t.n, LOSS_POS, NP, t.pv, t.gv, tile, &n_calls, fused,
                           &len);
    CHECK(len == 1000 && fused[NP] == 9, "tile length %zu (want 1000), fused[NP] %d (want 9)", len,
          fused[NP]);
    net_release(g_ctx, &t);

    /* frozen b1, bf16 w2, w1 read after its writer (a relu at the end):
     * b2 alone is fused */
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    t.gv[B1] = -1;
    t.g.vals[t.pv[W2]].dtype = FR_BF16;
    CHECK(append_reader(&t, t.pv[W1]), "appending a reader: %s", fr_last_error(g_ctx));
    memset(fused, 0, sizeof fused);
    len = 0;
    n_calls = 0;
    n = fr_fuse_linear_updates(&t.g, t.order, t.n, LOSS_POS, NP, t.pv, t.gv, tile, &n_calls, fused,
                               &len);
    const uint8_t want2[NP] = {[B2] = 1};
    CHECK(n == 1 && len == 0 && n_calls == 0, "%d fused, tile %zu, %d calls: want 1, 0, 0", n, len,
          n_calls);
    check_fused(__LINE__, fused, want2, NP, "plain SGD, three refused");
    CHECK(t.g.nodes[LIN2_BWD].update == 4u && t.g.nodes[LIN1_BWD].update == 0u,
          "update bits %#x %#x, want 0x4 0", t.g.nodes[LIN2_BWD].update,
          t.g.nodes[LIN1_BWD].update);
    net_release(g_ctx, &t);

    /* the loss said to be made at n7's position: only n8 and n9's
     * gradients come after it (w1, b1) */
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    memset(fused, 0, sizeof fused);
    len = 0;
    n = fr_fuse_linear_updates(&t.g, t.order, t.n, 7, NP, t.pv, t.gv, tile, &n_calls, fused, &len);
    const uint8_t want3[NP] = {[W1] = 1, [B1] = 1};
    CHECK(n == 2, "%d fused after position 7, want 2", n);
    check_fused(__LINE__, fused, want3, NP, "after position 7");
    net_release(g_ctx, &t);

    /* the tied weight: two writers */
    if (!built(__LINE__, build_tied(g_ctx, &t), &t)) return;
    memset(fused, 0, sizeof fused);
    len = 0;
    n = fr_fuse_linear_updates(&t.g, t.order, t.n, 3, 3, t.pv, t.gv, tile, &n_calls, fused, &len);
    const uint8_t want4[3] = {0, 1, 1};
    CHECK(n == 2, "tied: %d fused, want 2 (the biases)", n);
    check_fused(__LINE__, fused, want4, 3, "tied");
    net_release(g_ctx, &t);
}

static void test_optim_steps(void) {
    net t;
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    uint8_t fused[NP + 1] = {0};
    int n_fused = 0, gv0[NP];
    memcpy(gv0, t.gv, sizeof gv0);
    CHECK(fr_fuse_optim_steps(&t.g, &t.order, &t.n, LOSS_POS, NP, t.pv, t.gv, fused, &n_fused) ==
              FR_OK,
          "optim steps: %s", fr_last_error(g_ctx));
    const uint8_t want[NP] = {2, 2, 2, 2, 2, 2};
    CHECK(n_fused == NP, "%d fused, want 6", n_fused);
    check_fused(__LINE__, fused, want, NP, "optim steps");
    /* the step of param i is node 10 + i; after each writer the later
     * parameter's first */
    const int order[N_ALL + NP] = {0,       1, 2, 3,        4,        5, 6,       10 + B2,
                                   10 + W2, 7, 8, 10 + LNB, 10 + LNW, 9, 10 + B1, 10 + W1};
    int same = t.n == N_ALL + NP;
    for (int k = 0; same && k < t.n; k++) same = t.order[k] == order[k];
    CHECK(same, "the order is not n0..n6 s5 s4 n7 n8 s3 s2 n9 s1 s0");
    const int writer[NP] = {[W1] = LIN1_BWD, [B1] = LIN1_BWD, [LNW] = LN_BWD,
                            [LNB] = LN_BWD,  [W2] = LIN2_BWD, [B2] = LIN2_BWD};
    for (int i = 0; i < NP && (int)t.g.n_nodes == N_ALL + NP; i++) {
        const fr_node *c = &t.g.nodes[N_ALL + i];
        CHECK(c->op == FR_OP_OPTIM_STEP && c->attr.param == i && c->n_in == 1 &&
                  c->in[0] == gv0[i] && c->out[0] == t.pv[i] && c->update == 1u,
              "param %d: node %d is %s (param %d) reading %d writing %d, update %#x", i, N_ALL + i,
              fr_op_get(c->op)->name, c->attr.param, c->in[0], c->out[0], c->update);
        CHECK(c->layer == 100 + writer[i], "param %d: its step's layer %d, want its writer's %d", i,
              c->layer, 100 + writer[i]);
        const fr_value *gv = &t.g.vals[gv0[i]];
        CHECK(gv->kind == FR_VAL_STEP && gv->producer == writer[i] && gv->param == i &&
                  t.gv[i] == gv0[i],
              "param %d: its gradient of kind %d made by %d (param %d)", i, (int)gv->kind,
              gv->producer, gv->param);
    }
    CHECK(t.g.nodes[LIN2_BWD].accumulate == 0u && t.g.nodes[LN_BWD].accumulate == 0u &&
              t.g.nodes[LIN1_BWD].accumulate == 0u,
          "the writers still add into their gradients: %#x %#x %#x", t.g.nodes[LIN2_BWD].accumulate,
          t.g.nodes[LN_BWD].accumulate, t.g.nodes[LIN1_BWD].accumulate);
    net_release(g_ctx, &t);

    /* frozen b1; bf16 w2; w1 read at the end; lnw's gradient read at the
     * end; lnb's already a step value: b2 alone gets a step */
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    t.gv[B1] = -1;
    t.g.vals[t.pv[W2]].dtype = FR_BF16;
    t.g.vals[t.gv[LNB]].kind = FR_VAL_STEP;
    CHECK(append_reader(&t, t.pv[W1]) && append_reader(&t, t.gv[LNW]), "appending readers: %s",
          fr_last_error(g_ctx));
    memset(fused, 0, sizeof fused);
    n_fused = 0;
    int n0 = t.n;
    CHECK(fr_fuse_optim_steps(&t.g, &t.order, &t.n, LOSS_POS, NP, t.pv, t.gv, fused, &n_fused) ==
              FR_OK,
          "optim steps: %s", fr_last_error(g_ctx));
    const uint8_t want2[NP] = {[B2] = 2};
    CHECK(n_fused == 1, "%d fused, want 1", n_fused);
    check_fused(__LINE__, fused, want2, NP, "optim steps, five refused");
    CHECK(t.n == n0 + 1 && t.order[LIN2_BWD + 1] == n0 && t.g.nodes[n0].op == FR_OP_OPTIM_STEP &&
              t.g.nodes[n0].attr.param == B2,
          "b2's step is not right after n6");
    net_release(g_ctx, &t);

    /* the loss said to be made at n8's position: only n9's gradients */
    if (!built(__LINE__, build_mlp(g_ctx, &t), &t)) return;
    memset(fused, 0, sizeof fused);
    n_fused = 0;
    CHECK(fr_fuse_optim_steps(&t.g, &t.order, &t.n, LN_BWD, NP, t.pv, t.gv, fused, &n_fused) ==
              FR_OK,
          "optim steps: %s", fr_last_error(g_ctx));
    const uint8_t want3[NP] = {[W1] = 2, [B1] = 2};
    CHECK(n_fused == 2 && t.n == N_ALL + 2 && t.order[N_ALL] == N_ALL + 1 &&
              t.order[N_ALL + 1] == N_ALL,
          "after position 8: %d fused, order of %d", n_fused, t.n);
    check_fused(__LINE__, fused, want3, NP, "after position 8");
    net_release(g_ctx, &t);

    /* the tied weight: two writers */
    if (!built(__LINE__, build_tied(g_ctx, &t), &t)) return;
    memset(fused, 0, sizeof fused);
    n_fused = 0;
    CHECK(fr_fuse_optim_steps(&t.g, &t.order, &t.n, 3, 3, t.pv, t.gv, fused, &n_fused) == FR_OK,
          "optim steps: %s", fr_last_error(g_ctx));
    const uint8_t want4[3] = {0, 2, 2};
    CHECK(n_fused == 2, "tied: %d fused, want 2 (the biases)", n_fused);
    check_fused(__LINE__, fused, want4, 3, "tied");
    net_release(g_ctx, &t);
}

/* Building the graph and running the pass with allocation n failing (the
 * sweep in fault_sweep.h): each fails cleanly, nothing leaks. */
static fr_status optim_steps_scenario(fr_ctx *ctx, void *arg) {
    (void)arg;
    net t;
    uint8_t fused[NP + 1] = {0};
    int n_fused = 0;
    fr_status st = build_mlp(ctx, &t);
    if (!st)
        st = fr_fuse_optim_steps(&t.g, &t.order, &t.n, LOSS_POS, NP, t.pv, t.gv, fused, &n_fused);
    net_release(ctx, &t);
    return st;
}

int main(void) {
    g_ctx = fr_ctx_new();
    check_structure();
    test_linear_updates();
    test_optim_steps();
    fault_sweep_least("optim steps", 1, optim_steps_scenario, NULL);
    return ctx_free_done(g_ctx);
}
