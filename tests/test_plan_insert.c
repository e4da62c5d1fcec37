/* test_plan_insert.c — the order utilities of the graph passes
 * (plan/insert.h), on a graph and orders built by hand here:
 *   - fr_order_uses_of: writers, last writer's position and slot, readers
 *     and last reader of every value, counted by hand for an order that is
 *     not the node order, with a value written twice, a value read twice by
 *     one node, a three-output node and an absent input; and for a prefix;
 *   - fr_order_last_writer on the same order;
 *   - fr_insert_after: the exact order for insertions after the first, a
 *     middle and the last position, two after the same one (reverse of their
 *     listing); none leaves the order as it is; each of its allocations made
 *     to fail leaves the order untouched and leaks nothing;
 *   - fr_gradient_to_step: the value, the writer's accumulate bits and the
 *     inserted node's layer. */
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "fault_sweep.h"
#include "frugal.h"
#include "plan/insert.h"

static fr_ctx *g_ctx;

/* Values: x (2,4) input, w (3,4), lw (4), lb (4) parameters.
 *   n0 layernorm(x, lw, lb) -> y0, mean, rstd
 *   n1 linear(y0, w, no bias) -> h (2,3)
 *   n2 add(h, h) -> s
 *   n3 relu(h) -> s (its own output replaced: a second writer of s)
 * run in the order n0 n1 n3 n2. */
static void test_uses(void) {
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    int x = fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape2(2, 4));
    int w = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape2(3, 4));
    int lw = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape1(4));
    int lb = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape1(4));
    fr_attr ln = {.eps = 1e-5f};
    int o0[4], o1[4], o2[4], o3[4], in[3] = {x, lw, lb};
    int ok = fr_graph_node(&g, FR_OP_LAYERNORM, in, 3, &ln, -1, 0, o0) == 0;
    in[0] = o0[0], in[1] = w, in[2] = -1;
    ok &= fr_graph_node(&g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o1) == 1;
    int h = o1[0], hh[2] = {h, h};
    ok &= fr_graph_node(&g, FR_OP_ADD, hh, 2, NULL, -1, 0, o2) == 2;
    ok &= fr_graph_node(&g, FR_OP_RELU, &h, 1, NULL, -1, 0, o3) == 3;
    CHECK(ok, "building the graph: %s", fr_last_error(g_ctx));
    if (!ok) return fr_graph_release(&g);
    int s = o2[0], orphan = o3[0];
    g.nodes[3].out[0] = s;
    int order[4] = {0, 1, 3, 2};
    fr_order_uses u;
    CHECK(fr_order_uses_of(g_ctx, &g, order, 4, &u) == FR_OK, "uses: %s", fr_last_error(g_ctx));
    struct {
        const char *name;
        int v, writers, pos, slot, readers, last_read;
    } want[] = {
        {"x", x, 0, -1, -1, 1, 0},       {"w", w, 0, -1, -1, 1, 1},
        {"lw", lw, 0, -1, -1, 1, 0},     {"lb", lb, 0, -1, -1, 1, 0},
        {"y0", o0[0], 1, 0, 0, 1, 1},    {"mean", o0[1], 1, 0, 1, 0, -1},
        {"rstd", o0[2], 1, 0, 2, 0, -1}, {"h", h, 1, 1, 0, 3, 3},
        {"s", s, 2, 3, 0, 0, -1},        {"relu's own output", orphan, 0, -1, -1, 0, -1},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int v = want[k].v;
        CHECK(u.writers[v] == want[k].writers && u.pos[v] == want[k].pos &&
                  u.slot[v] == want[k].slot && u.readers[v] == want[k].readers &&
                  u.last_read[v] == want[k].last_read,
              "%s: writers %d pos %d slot %d readers %d last read %d, want %d %d %d %d %d",
              want[k].name, u.writers[v], u.pos[v], u.slot[v], u.readers[v], u.last_read[v],
              want[k].writers, want[k].pos, want[k].slot, want[k].readers, want[k].last_read);
    }
    fr_order_uses_release(g_ctx, &u);
    CHECK(u.writers == NULL, "released uses keep their block");
    /* the prefix n0 n1 n3: s written once, at position 2; h read once */
    CHECK(fr_order_uses_of(g_ctx, &g, order, 3, &u) == FR_OK, "uses: %s", fr_last_error(g_ctx));
    CHECK(u.writers[s] == 1 && u.pos[s] == 2 && u.readers[h] == 1 && u.last_read[h] == 2,
          "prefix: s writers %d pos %d, h readers %d last read %d (want 1 2 1 2)", u.writers[s],
          u.pos[s], u.readers[h], u.last_read[h]);
    fr_order_uses_release(g_ctx, &u);

    CHECK(fr_order_last_writer(&g, order, 4, s) == 3, "last writer of s at %d, want 3",
          fr_order_last_writer(&g, order, 4, s));
    CHECK(fr_order_last_writer(&g, order, 3, s) == 2,
          "last writer of s in the prefix at %d, want 2", fr_order_last_writer(&g, order, 3, s));
    CHECK(fr_order_last_writer(&g, order, 4, h) == 1, "last writer of h at %d, want 1",
          fr_order_last_writer(&g, order, 4, h));
    CHECK(fr_order_last_writer(&g, order, 4, x) == -1, "the input has a writer at %d",
          fr_order_last_writer(&g, order, 4, x));
    fr_graph_release(&g);
}

static int *order_of(const int *v, int n) {
    int *o = fr_alloc(g_ctx, (size_t)n * sizeof *o, FR_MEM_OTHER);
    if (o) memcpy(o, v, (size_t)n * sizeof *o);
    return o;
}

static int same(const int *a, int na, const int *b, int nb) {
    return na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
}

static void test_insert_after(void) {
    /* insert_after knows node ids only: any ids will do */
    const int base[4] = {5, 6, 7, 8};
    const int pos[4] = {1, 1, 3, 0}, node[4] = {10, 11, 12, 13};
    /* after position 0 (5): 13; after 1 (6): 11 then 10, the later listed
     * first; after 3 (8): 12 */
    const int want[8] = {5, 13, 6, 11, 10, 7, 8, 12};
    int n = 4, *order = order_of(base, 4);
    CHECK(fr_insert_after(g_ctx, &order, &n, pos, node, 4) == FR_OK, "insert: %s",
          fr_last_error(g_ctx));
    CHECK(same(order, n, want, 8), "order %d %d %d %d %d %d %d %d (n %d), want 5 13 6 11 10 7 8 12",
          order[0], order[1], order[2], order[3], order[4], order[5], order[6], order[7], n);
    fr_free(g_ctx, order);

    n = 4, order = order_of(base, 4);
    int *before = order;
    CHECK(fr_insert_after(g_ctx, &order, &n, NULL, NULL, 0) == FR_OK, "no insertion failed");
    CHECK(order == before && same(order, n, base, 4), "no insertion changed the order");
    fr_free(g_ctx, order);

    /* three allocations (the new order, the heads, the links): each failing */
    for (int f = 1; f <= 3; f++) {
        n = 4, order = before = order_of(base, 4);
        fr_mem_fail_at(g_ctx, (uint64_t)f);
        fr_status st = fr_insert_after(g_ctx, &order, &n, pos, node, 4);
        fr_mem_fail_at(g_ctx, 0);
        CHECK(st == FR_ERR_NOMEM && strstr(fr_last_error(g_ctx), "out of memory"),
              "allocation %d failing: status %d, '%s'", f, st, fr_last_error(g_ctx));
        CHECK(order == before && same(order, n, base, 4), "allocation %d failing changed the order",
              f);
        fr_free(g_ctx, order);
    }
}

static void test_gradient_to_step(void) {
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    int x = fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape1(4));
    int gv = fr_graph_value(&g, FR_VAL_GRAD, FR_F32, fr_shape1(4));
    int w = fr_graph_node(&g, FR_OP_RELU, &x, 1, NULL, -1, 0, NULL);
    int c = fr_graph_node(&g, FR_OP_RELU, &gv, 1, NULL, -1, 0, NULL);
    CHECK(gv >= 0 && w == 0 && c == 1, "building the graph: %s", fr_last_error(g_ctx));
    if (w != 0 || c != 1) return fr_graph_release(&g);
    g.nodes[w].out[0] = gv;
    g.nodes[w].accumulate = 0x5u; /* as if outputs 0 and 2 added into gradients */
    g.nodes[w].layer = 7;
    g.nodes[c].layer = -1;
    fr_gradient_to_step(&g, w, 0, gv, c);
    CHECK(g.vals[gv].kind == FR_VAL_STEP && g.vals[gv].producer == w,
          "the gradient is of kind %d made by %d, want a step value (%d) made by %d",
          (int)g.vals[gv].kind, g.vals[gv].producer, (int)FR_VAL_STEP, w);
    CHECK(g.nodes[w].accumulate == 0x4u, "the writer's accumulate bits %#x, want 0x4",
          g.nodes[w].accumulate);
    CHECK(g.nodes[c].layer == 7, "the inserted node's layer %d, want the writer's 7",
          g.nodes[c].layer);
    fr_graph_release(&g);
}

int main(void) {
    g_ctx = fr_ctx_new();
    test_uses();
    test_insert_after();
    test_gradient_to_step();
    return ctx_free_done(g_ctx);
}
