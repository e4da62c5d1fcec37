/* fuse.h — the optimizer step in backward (PyTorch's tutorial "fuse the
 * optimizer step into the backward pass"): once a parameter's gradient is
 * complete, the parameter is stepped right there and the gradient is never
 * stored, so the persistent gradient bytes of those parameters vanish. Two
 * graph passes, one per kind of update:
 *   - plain SGD (no momentum) needs nothing but the gradient, so LINEAR_BWD
 *     applies it itself (for the weight, in its GEMM's epilogue), with the
 *     rate and weight decay the step writes into its attr (lr, wd):
 *     fr_fuse_linear_updates marks those outputs;
 *   - every other update (momentum SGD, Adam, AdamW) gets an OPTIM_STEP node
 *     right after the gradient's writer, which no kernel runs: the executor
 *     hands it to the optimizer (exec.h's param_step, optim/optim.h's fr_optim_step_param),
 *     the same update as after backward: fr_fuse_optim_steps.
 * Whether a step may run inside backward at all is the caller's decision:
 * only where nothing can tell the difference (training, gradients not kept,
 * no loss scaler, which must see every gradient before any update, no
 * clipping, which needs the global norm, one micro-batch, since accumulation
 * needs the buffer, and the optimizer on the backend that runs backward).
 * These passes decide which parameters, from the graph and the order alone:
 * f32 weights whose gradient has one writer after the loss and no node
 * after that writer reading the parameter. */
#ifndef FR_FUSE_H
#define FR_FUSE_H

#include "graph/graph.h"

/* The floats of scratch that LINEAR_BWD needs to update an out x in weight
 * in its epilogue, with `rows` rows in its GEMM (the batch, times a
 * sequence's positions): the backend's tile size. */
typedef size_t (*fr_fuse_tile_fn)(int64_t out, int64_t in, int64_t rows, void *arg);

/* Plain SGD inside LINEAR_BWD. Parameters i < n_params, with graph value
 * pv[i] and gradient gv[i] (-1: none), on order[0..n_order) (the plan's),
 * the loss made at position loss_pos: parameter i is stepped by the
 * LINEAR_BWD that computes its gradient when
 *   - it is f32 and has a gradient;
 *   - one node writes that gradient, after loss_pos: a LINEAR_BWD, through
 *     its weight (1) or bias (2) output;
 *   - no node after that one reads the parameter.
 * Then that node's update bit of the output is set (its attr.lr and attr.wd
 * are the caller's to set before it runs), fused[i] = 1 (fused[]
 * is the caller's, n_params long, other entries left alone) and, for a
 * weight whose first dimension is not 0, *tile_len is raised to at least
 * tile(out, in, rows, arg), rows being the LINEAR_BWD input's numel / in.
 * Returns how many parameters it fused. */
int fr_fuse_linear_updates(fr_graph *g, const int *order, int n_order, int loss_pos,
                           size_t n_params, const int *pv, const int *gv, fr_fuse_tile_fn tile,
                           void *arg, uint8_t *fused, size_t *tile_len);

/* An OPTIM_STEP node for every other update rule, on *order (replaced by a
 * longer one), the loss made at position loss_pos: parameter i < n_params
 * is stepped by an OPTIM_STEP node (attr.param = i, reading gv[i], writing
 * the parameter pv[i] in place: update bit 0) put right after its
 * gradient's writer when
 *   - it is f32 and gv[i] is a gradient value (FR_VAL_GRAD);
 *   - one node writes it, after loss_pos, and no node reads it;
 *   - no node after that writer reads the parameter.
 * The gradient becomes a step value that its writer makes and the OPTIM_STEP
 * consumes (fr_gradient_to_step; it keeps .param, so the plan sizes it as a
 * gradient); fused[i] = 2 and *n_fused counts it. On failure the graph may
 * hold nodes that no order lists. */
fr_status fr_fuse_optim_steps(fr_graph *g, int **order, int *n_order, int loss_pos, size_t n_params,
                              const int *pv, const int *gv, uint8_t *fused, int *n_fused);

#endif
