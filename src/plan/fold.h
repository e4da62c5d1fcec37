/* fold.h — a node folded into the one whose output it reads, where the pair's
 * result is the same bits with one pass over memory fewer.
 *
 * ReLU then max pooling (a CNN's conv, BatchNorm, ReLU, pool): backward
 * runs MAXPOOL2D_BWD, writing dx_pool (dy at each window's first maximum
 * of x = ReLU's y, +0 elsewhere), then RELU_BWD, dx = y > 0 ? dx_pool : 0.
 * Both read the same y; the mask only ever keeps or clears a window's
 * chosen value, so MAXPOOL2D_BWD with attr.masked (dy only where x > 0)
 * writes dx itself: dx_pool is never stored, RELU_BWD never runs.
 *
 * BatchNorm then ReLU (forward): where ReLU alone reads BatchNorm's y,
 * BATCHNORM with attr.relu writes ReLU(y) itself (on the f32 y, or on a
 * 16-bit y's bits after rounding: fr_k_relu's bits either way) into the
 * ReLU's output: y is never stored, RELU never runs. BatchNorm's backward
 * reads its x, not y; ReLU's backward reads the ReLU's output, now
 * BatchNorm's. */
#ifndef FR_FOLD_H
#define FR_FOLD_H

#include "graph/graph.h"

/* On order[0..*n_order) (shortened in place): every RELU_BWD at position
 * k whose dy is written by the node at k - 1, a MAXPOOL2D_BWD whose x is
 * the RELU_BWD's y, where nothing else reads or writes that dy and neither
 * node adds into its output. The MAXPOOL2D_BWD gets attr.masked and the
 * RELU_BWD's output; the RELU_BWD leaves the order (its node stays in the
 * graph, unreferenced). *n_folded: how many (may be NULL). Fails only out
 * of memory (the order's uses, fr_order_uses_of), folding nothing. */
fr_status fr_fold_relu_into_pool(fr_graph *g, int *order, int *n_order, int *n_folded);

/* On order[0..*n_order) (shortened in place): every RELU whose x is out[0]
 * of a BATCHNORM earlier in the order, where nothing else reads or writes
 * that x, neither is a view and neither node adds into its output. The
 * BATCHNORM gets attr.relu and the RELU's output; the RELU leaves the
 * order (its node stays in the graph, unreferenced). *n_folded: how many
 * (may be NULL). Fails only out of memory, folding nothing. */
fr_status fr_fold_relu_into_bn(fr_graph *g, int *order, int *n_order, int *n_folded);

#endif
