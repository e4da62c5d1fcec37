/* narrow.h — half gradients for 16-bit weights (pure half precision, as
 * model.half() keeps them): a graph pass that stores each such weight's
 * gradient in the weight's format. The gradient's single writer makes it in
 * f32 as a step value (in the arena, dying at once) and a CAST right after
 * the writer narrows it into the persistent 16-bit gradient, adding to what
 * is there when micro-batches accumulate (an f32 sum, one rounding). */
#ifndef FR_NARROW_H
#define FR_NARROW_H

#include "graph/graph.h"

/* For every parameter i < n_params with a gradient gv[i] >= 0 whose value
 * pv[i] is FR_F16 or FR_BF16, if one node of *order writes gv[i] and none
 * reads it: a new gradient value g16 (FR_VAL_GRAD, the parameter's dtype
 * and shape, .param = i) made by a CAST of gv[i] (accumulate bit 0) put
 * right after the writer; gv[i] becomes a step value of that writer
 * (fr_gradient_to_step) with .param -1, and gv[i] is set to g16. A gradient
 * with several writers or a reader keeps its f32 storage. *order is replaced
 * by a longer one. */
fr_status fr_narrow_half_grads(fr_graph *g, int **order, int *n_order, size_t n_params,
                               const int *pv, int *gv);

#endif
