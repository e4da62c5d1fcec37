/* insert.h — the order utilities the graph passes share: where each value
 * is written and read in an execution order (one pass over it), putting new
 * nodes right after given positions of an order, and turning a parameter
 * gradient into a step value that a node put after its writer consumes.
 * Graphs and orders only: which nodes a pass inserts is the pass's business
 * (plan/fuse.c, plan/narrow.c). */
#ifndef FR_INSERT_H
#define FR_INSERT_H

#include "graph/graph.h"

/* Per value v of a graph, in one order: writers[v] nodes write it, the last
 * at position pos[v] through its output slot[v] (-1: none); readers[v]
 * nodes read it, the last at position last_read[v] (-1: none). A node
 * reading v twice counts twice. One block (writers), released with
 * fr_order_uses_release. */
typedef struct fr_order_uses {
    int *writers, *pos, *slot, *readers, *last_read;
} fr_order_uses;

/* The uses of g's values in order[0..n), in one pass: O(n + values). */
fr_status fr_order_uses_of(fr_ctx *ctx, const fr_graph *g, const int *order, int n,
                           fr_order_uses *u);
void fr_order_uses_release(fr_ctx *ctx, fr_order_uses *u);

/* The last position of order[0..n) whose node writes value v; -1: none. */
int fr_order_last_writer(const fr_graph *g, const int *order, int n, int v);

/* *order (n_order nodes) with node[i] put right after position pos[i], for
 * i < n_ins; nodes after the same position come in the reverse of their
 * listing (each goes right after the position, in front of those listed
 * before it). The order is replaced by a longer one (category other) and
 * the old one freed; n_ins = 0 leaves it as it is. On failure (out of
 * memory) order and n_order are untouched. */
fr_status fr_insert_after(fr_ctx *ctx, int **order, int *n_order, const int *pos, const int *node,
                          int n_ins);

/* Parameter gradient gv, written by output `slot` of node w, becomes a step
 * value (planned in the arena) that w makes afresh instead of adding into;
 * node c, to be put right after w, takes w's layer. */
void fr_gradient_to_step(fr_graph *g, int w, int slot, int gv, int c);

#endif
