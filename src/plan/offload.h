/* offload.h — activation offload (torch.autograd.graph.save_on_cpu): a
 * graph pass that moves values saved for backward out of the step's arena
 * between the forward and the backward pass, and the host block that holds
 * them. It knows the order and the values' sizes, nothing of kernels or
 * devices: OFFLOAD and FETCH are ops (ops.h) that each backend runs. */
#ifndef FR_OFFLOAD_H
#define FR_OFFLOAD_H

#include "graph/graph.h"

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
 *   - FETCH h -> v' right before v's first backward reader (no earlier:
 *     transfers are synchronous on every backend here, so fetching sooner
 *     would only hold v' longer);
 *   - every node after the loss that read v reads v' instead.
 * The plan's liveness then frees v at its offload and gives v' storage only
 * from its fetch. *order is replaced (a longer array); *n_off and *bytes
 * (either may be NULL) receive how many values moved and their bytes. */
fr_status fr_offload_saved(fr_graph *g, int **order, int *n_order, size_t min_bytes, int *n_off,
                           size_t *bytes);

/* The host block of g's FR_VAL_HOST values: each at a 64-byte aligned offset,
 * in value order. Returns its bytes; with base non-NULL also sets ptr[v] =
 * base + offset of v for every host value v. */
size_t fr_offload_host_place(const fr_graph *g, char *base, void **ptr);

#endif
