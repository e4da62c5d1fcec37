/* autodiff.h — reverse-mode differentiation of a forward graph: appends the
 * backward nodes (each op's backward rule from the op table), sums the
 * gradients of values used more than once, and routes parameter gradients
 * into their persistent gradient values. */
#ifndef FR_AUTODIFF_H
#define FR_AUTODIFF_H

#include "graph/graph.h"

/* grad_value[p] is the FR_VAL_GRAD value of parameter value p (-1 if it is
 * frozen or has none); indexed by value id, length g->n_vals at the call.
 * Differentiates g->loss with respect to every parameter value that has a
 * gradient value. */
fr_status fr_autodiff(fr_graph *g, const int *grad_value);

/* The backward rules the op table points at. */
int fr_bw_linear(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_qlinear(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_conv2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_maxpool2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_avgpool2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_global_avgpool(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_by_output(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_by_input(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_batchnorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_layernorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_dropout(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_add(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_view(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_loss(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_embedding(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_pos_embedding(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_linear_ce(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_attention(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_rmsnorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_swiglu(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);
int fr_bw_rope_qkv(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din);

#endif
