/* layout.h — which activations are stored in oneDNN's blocked format
 * (nChw16c) rather than NCHW: a graph pass after the others, before the
 * memory plan. A convolution on oneDNN reads and writes nChw16c; on NCHW
 * tensors it reorders each image, filter gradient and output around every
 * call (a copy of every activation in and out, and workspace for the
 * copies). The pass keeps the convolutions' neighbours in the blocked
 * format instead, where their kernels take it (the backend's blocked_io:
 * on the CPU BatchNorm, ReLU, add, cast, copy, max pooling and global
 * average pooling).
 *
 * Values tied by a node (the operands of an element-wise op, of BatchNorm)
 * share one layout: a component of tied values is blocked when every value
 * in it is a 4-d step value with C a multiple of 16 (at most
 * FR_LAYOUT_MAX_C), f32 or bf16, no view's storage, every node touching it
 * takes it blocked, and a convolution reads or writes one of its values.
 * The batch, parameters, gradients, views and everything a node outside
 * that set reads stay NCHW, so the change is invisible outside the step.
 * FRUGAL_LAYOUT=plain turns the pass off (a test's reference). */
#ifndef FR_LAYOUT_H
#define FR_LAYOUT_H

#include "graph/graph.h"

#define FR_LAYOUT_MAX_C 512 /* BatchNorm's blocked kernel keeps per-channel sums on its stack */

/* Marks g's values (fr_value.blocked) and the nodes of order (attr.blocked)
 * and sizes the convolutions' workspaces again for it; *n_blocked: values
 * marked (may be NULL). Nothing is marked where the context's backend has
 * no blocked_io or FRUGAL_LAYOUT=plain. */
fr_status fr_layout_apply(fr_graph *g, const int *order, int n_order, int *n_blocked);

/* 1 when FRUGAL_LAYOUT does not turn the pass off (read once). */
int fr_layout_enabled(void);

#endif
