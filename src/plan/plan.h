/* plan.h — the memory plan of one step. It knows sizes, lifetimes and
 * categories, nothing of kernels: every step-scoped value gets an offset in
 * one arena by liveness (allocated when produced, freed after its last
 * reader, best fit among free blocks, in place where the op table allows and
 * the input dies at that op). The same event list drives the prediction here
 * and the accounting in the executor, so predicted and measured peaks are
 * two readings of one thing. */
#ifndef FR_PLAN_H
#define FR_PLAN_H

#include "graph/graph.h"

typedef struct fr_plan {
    fr_ctx *ctx;
    int n_vals, n_nodes; /* n_nodes: positions in the execution order */
    int *order;          /* node executed at each position */
    int64_t *offset;     /* per value: byte offset in the arena, -1 if not in it */
    fr_mem_cat *cat;     /* per value: category of a step value while it lives */
    int *ev_start;       /* events at position i: ev[ev_start[i] .. ev_start[i+1]); n_nodes = end */
    int *ev;             /* +(v+1): v becomes live; -(v+1): v dies */
    size_t arena_bytes;
    size_t peak[FR_MEM_CAT_COUNT]; /* predicted per-category peak of step values */
    size_t peak_total;             /* predicted peak of all step values together */
    int peak_node;                 /* node at which peak_total is first reached */
} fr_plan;

/* keep[] (may be NULL): values that must stay readable after the last node
 * (the loss, the logits). order (may be NULL: node index order) lists the
 * nodes in execution order; positions index the events. */
fr_status fr_plan_build(fr_graph *g, const uint8_t *keep, const int *order, int n_order,
                        fr_plan *p);
void fr_plan_release(fr_plan *p);
size_t fr_value_bytes(const fr_value *v);

#endif
