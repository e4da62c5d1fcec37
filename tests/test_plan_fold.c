/* test_plan_fold.c — ReLU's backward folded into max pooling's, and ReLU
 * into the BatchNorm before it (plan/fold.h), on graphs built here node by
 * node (the second: expect_bn below). The first:
 *
 *   x (2,16,8,8) -> n0 relu = y -> n1 maxpool2d 2x2 = p
 *   backward: n2 maxpool2d_bwd(dp, y) = d1 -> n3 relu_bwd(d1, y) = dx
 *
 * Folds: n2 gets attr.masked and writes dx, n3 leaves the order, dx's
 * producer is n2. Does not fold (each a graph of its own): relu_bwd adding
 * into dx (accumulate bit), pooling adding into d1, another node reading d1,
 * relu_bwd reading another y than pooling's x, a node between the two. And
 * two relu_bwd in a row after one pooling (the second reads the first's dx)
 * fold the first only and touch nothing out of bounds (ASan). */
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "frugal.h"
#include "graph/graph.h"
#include "plan/fold.h"

enum { PLAIN, ACC_RELU, ACC_POOL, READ_D1, OTHER_Y, BETWEEN, TWO_RELU };

typedef struct net {
    fr_graph g;
    int order[8], n, pool_bwd, relu_bwd, dx;
} net;

static fr_ctx *g_ctx;

/* a node; fwd: the forward node a backward one differentiates, else -1 */
static int node(fr_graph *g, fr_op op, int *in, int n_in, const fr_attr *a, int fwd, int *out) {
    int id = fr_graph_node(g, op, in, n_in, a, fwd, 0, out);
    CHECK(id >= 0, "node %s: %s", fr_op_get(op)->name, fr_last_error(g->ctx));
    return id;
}

static void build(net *t, int kind) {
    memset(t, 0, sizeof *t);
    fr_graph *g = &t->g;
    fr_graph_init(g, g_ctx);
    fr_attr pa = {.kernel = 2, .stride = 2};
    int x = fr_graph_value(g, FR_VAL_INPUT, FR_F32, fr_shape4(2, 16, 8, 8)), o[2], y, y2, p;
    const int relu = node(g, FR_OP_RELU, &x, 1, NULL, -1, o);
    y = o[0];
    node(g, FR_OP_RELU, &x, 1, NULL, -1, o), y2 = o[0]; /* another y, same shape */
    const int pool = node(g, FR_OP_MAXPOOL2D, &y, 1, &pa, -1, o);
    p = o[0];
    g->n_forward = (int)g->n_nodes;
    int dp = fr_graph_value(g, FR_VAL_STEP, FR_F32, g->vals[p].shape);
    int in[3] = {dp, y, p};
    t->pool_bwd = node(g, FR_OP_MAXPOOL2D_BWD, in, 3, &pa, pool, o);
    const int d1 = o[0];
    int between = -1;
    if (kind == BETWEEN) {
        int bin = x;
        between = node(g, FR_OP_RELU, &bin, 1, NULL, -1, o);
    }
    in[0] = d1, in[1] = kind == OTHER_Y ? y2 : y;
    t->relu_bwd = node(g, FR_OP_RELU_BWD, in, 2, NULL, relu, o), t->dx = o[0];
    int extra = -1;
    if (kind == READ_D1) extra = node(g, FR_OP_RELU, in, 1, NULL, -1, o); /* reads d1 */
    if (kind == TWO_RELU) { /* a second relu_bwd right after, reading the first's dx */
        in[0] = t->dx, in[1] = y;
        extra = node(g, FR_OP_RELU_BWD, in, 2, NULL, relu, o);
    }
    if (kind == ACC_RELU) g->nodes[t->relu_bwd].accumulate = 1u;
    if (kind == ACC_POOL) g->nodes[t->pool_bwd].accumulate = 1u;
    for (int i = 0; i < 3; i++) t->order[t->n++] = i;
    t->order[t->n++] = t->pool_bwd;
    if (between >= 0) t->order[t->n++] = between;
    t->order[t->n++] = t->relu_bwd;
    if (extra >= 0) t->order[t->n++] = extra;
}

static void expect(int kind, int folds, const char *what) {
    net t;
    build(&t, kind);
    const int n0 = t.n, d1 = t.g.nodes[t.pool_bwd].out[0];
    int folded = -1;
    CHECK(fr_fold_relu_into_pool(&t.g, t.order, &t.n, &folded) == FR_OK, "%s: %s", what,
          fr_last_error(g_ctx));
    const fr_node *pb = &t.g.nodes[t.pool_bwd];
    int relu_left = 0;
    for (int k = 0; k < t.n; k++) relu_left += t.order[k] == t.relu_bwd;
    if (folds) {
        CHECK(folded == 1 && t.n == n0 - 1 && !relu_left, "%s: folded %d, order %d -> %d", what,
              folded, n0, t.n);
        CHECK(pb->attr.masked && pb->out[0] == t.dx && t.g.vals[t.dx].producer == t.pool_bwd &&
                  t.g.vals[d1].producer == -1,
              "%s: masked %d, pooling writes %d (dx %d), dx's producer %d", what, pb->attr.masked,
              pb->out[0], t.dx, t.g.vals[t.dx].producer);
    } else {
        CHECK(folded == 0 && t.n == n0 && relu_left == 1 && !pb->attr.masked && pb->out[0] == d1,
              "%s: folded %d, order %d -> %d, masked %d", what, folded, n0, t.n, pb->attr.masked);
    }
    fr_graph_release(&t.g);
}

/* BatchNorm then ReLU, forward:
 *   x (2,16,8,8) -> n0 batchnorm = y -> n1 relu = r   (and kind's extra node)
 * Folds: n0 gets attr.relu and writes r, n1 leaves the order. Does not
 * fold: another node reading y, relu adding into r, batchnorm adding into y. */
enum { BN_PLAIN, BN_READ_Y, BN_ACC_RELU, BN_ACC_BN, BN_TWO };

static void expect_bn(int kind, int folds, const char *what) {
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    fr_attr ba = {0};
    ba.training = 1, ba.eps = 1e-5f, ba.momentum = 0.1f;
    int x = fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape4(2, 16, 8, 8)), o[3];
    int in[5] = {x};
    for (int j = 1; j < 5; j++) in[j] = fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape1(16));
    const int bn = node(&g, FR_OP_BATCHNORM, in, 5, &ba, -1, o), y = o[0];
    const int relu = node(&g, FR_OP_RELU, (int[]){y}, 1, NULL, -1, o), r = o[0];
    int order[4] = {bn, relu}, n = 2, extra = -1;
    if (kind == BN_READ_Y) extra = node(&g, FR_OP_RELU, (int[]){y}, 1, NULL, -1, o);
    if (kind == BN_TWO) { /* a second batchnorm and relu on r: both pairs fold */
        in[0] = r;
        int b2 = node(&g, FR_OP_BATCHNORM, in, 5, &ba, -1, o);
        order[n++] = b2;
        extra = node(&g, FR_OP_RELU, (int[]){o[0]}, 1, NULL, -1, o);
    }
    if (extra >= 0) order[n++] = extra;
    if (kind == BN_ACC_RELU) g.nodes[relu].accumulate = 1u;
    if (kind == BN_ACC_BN) g.nodes[bn].accumulate = 1u;
    g.n_forward = (int)g.n_nodes;
    const int n0 = n;
    int folded = -1, relu_left = 0;
    CHECK(fr_fold_relu_into_bn(&g, order, &n, &folded) == FR_OK, "%s: %s", what,
          fr_last_error(g_ctx));
    for (int k = 0; k < n; k++) relu_left += order[k] == relu;
    const fr_node *b = &g.nodes[bn];
    if (folds) {
        const int want = kind == BN_TWO ? 2 : 1;
        CHECK(folded == want && n == n0 - want && !relu_left, "%s: folded %d, order %d -> %d", what,
              folded, n0, n);
        CHECK(b->attr.relu && b->out[0] == r && g.vals[r].producer == bn &&
                  g.vals[y].producer == -1,
              "%s: relu %d, batchnorm writes %d (r %d), r's producer %d", what, b->attr.relu,
              b->out[0], r, g.vals[r].producer);
    } else {
        CHECK(folded == 0 && n == n0 && relu_left == 1 && !b->attr.relu && b->out[0] == y,
              "%s: folded %d, order %d -> %d, relu %d", what, folded, n0, n, b->attr.relu);
    }
    fr_graph_release(&g);
}

int main(void) {
    g_ctx = fr_ctx_new();
    expect_bn(BN_PLAIN, 1, "batchnorm then relu");
    expect_bn(BN_READ_Y, 0, "another node reads batchnorm's y");
    expect_bn(BN_ACC_RELU, 0, "relu adds into its output");
    expect_bn(BN_ACC_BN, 0, "batchnorm adds into y");
    expect_bn(BN_TWO, 1, "two batchnorm-relu pairs in a row");
    expect(PLAIN, 1, "relu then max pooling");
    expect(ACC_RELU, 0, "relu_bwd adds into dx");
    expect(ACC_POOL, 0, "pooling adds into its dx");
    expect(READ_D1, 0, "another node reads pooling's dx");
    expect(OTHER_Y, 0, "relu_bwd reads another y");
    expect(BETWEEN, 0, "a node between the two");
    expect(TWO_RELU, 1, "two relu_bwd in a row: the first folds");
    fr_ctx_free(g_ctx);
    return check_done();
}
