/* offload.h — activation offload (torch.autograd.graph.save_on_cpu): a
 * graph pass that moves values saved for backward out of the step's arena
 * between the forward and the backward pass, and the host block that holds
 * them. It knows the order and the values' sizes, nothing of kernels or
 * devices: OFFLOAD and FETCH are ops (ops.h) that each backend runs. */
#ifndef FR_OFFLOAD_H
#define FR_OFFLOAD_H

#include "graph/graph.h"
#include "plan/plan.h"

/* Values below this many bytes stay where they are: a transfer costs more
 * than their bytes save. */
#define FR_OFFLOAD_MIN_BYTES 4096

/* For every step value made before the loss node in the order and read
 * after it (saved for backward), at least min_bytes large, not a view and
 * not viewed by another value, not the loss or the logits (kept to the end),
 * and with at least one node between its last forward use and its first
 * backward reader:
 *   - OFFLOAD v -> h right after the last forward node that makes or reads v
 *     (h is FR_VAL_HOST: outside the arena);
 *   - FETCH h -> v' ahead of v's first backward reader: a prefetch, so that
 *     a device copies while it computes (fr_offload_prefetch);
 *   - every node after the loss that read v reads v' instead.
 * The plan's liveness then frees v at its offload and gives v' storage only
 * from its fetch. *order is replaced (a longer array); *n_off and *bytes
 * (either may be NULL) receive how many values moved and their bytes. */
fr_status fr_offload_saved(fr_graph *g, int **order, int *n_order, size_t min_bytes, int *n_off,
                           size_t *bytes);

/* Move each FETCH of order earlier, as far as the rules allow, counted in
 * the order's positions:
 *   - not before the loss, nor before its value's OFFLOAD;
 *   - at most one layer ahead: past the nodes of its reader's layer and of
 *     one other layer's backward, no further (the prefetch hides behind one
 *     layer's backward compute, and holds its bytes no longer than that);
 *   - bounded by memory: at every position it moves across, the live bytes
 *     of the plan of order (fr_plan_build, keep[] as the step keeps them)
 *     plus its own stay within that plan's peak, so prefetching never
 *     raises the predicted peak (the arena's packing may still differ).
 * Fetches are moved in order of position, each against the live bytes the
 * earlier moves left. *moved (may be NULL) receives the positions all
 * fetches moved by, summed. */
fr_status fr_offload_prefetch(fr_graph *g, const uint8_t *keep, int *order, int n_order,
                              int *moved);

/* Where a backend whose copies run beside its kernels must wait for each,
 * from plan p: for the copy at position i, at[i] is the position before
 * whose node the copy must have completed (n_nodes: by the end of the step;
 * -1 at positions that are no copy):
 *   - FETCH: its value's first reader;
 *   - OFFLOAD: the first node that makes a value overlapping the offloaded
 *     value's bytes in the arena (its slot reused), else the end. */
void fr_offload_waits(const fr_graph *g, const fr_plan *p, int *at);

/* The host block of g's FR_VAL_HOST values: each at a 64-byte aligned offset,
 * in value order. Returns its bytes; with base non-NULL also sets ptr[v] =
 * base + offset of v for every host value v. */
size_t fr_offload_host_place(const fr_graph *g, char *base, void **ptr);

#endif
