/* precision.h — mixed precision as a graph pass: each activation saved for
 * backward is stored in a 16-bit format (a CAST right after it is made) and
 * brought back to f32 right before each backward op that reads it (a CAST
 * there), so the bytes held between the forward and the backward pass
 * halve. Matmuls and convolutions read 16-bit-rounded inputs and weights (an
 * f32 copy of the weight rounded through 16 bits, made for each reader
 * and dropped after it), which with f32 accumulation is
 * exactly a 16-bit GEMM with f32 accumulate: products of 16-bit values are
 * exact in f32. Values that need range stay f32, following PyTorch autocast's
 * lists: the logits read by the loss, BatchNorm/LayerNorm statistics, masks. */
#ifndef FR_PRECISION_H
#define FR_PRECISION_H

#include "graph/graph.h"

/* Rewrites g and the execution order (reallocated); n_nodes0 is the node
 * count before rematerialization and origin[] (fr_remat_apply) maps each
 * recomputed value to the value it recomputes: every version of a value is
 * rounded the same way, decided on the graph without recomputation, so a
 * checkpointing schedule never changes a bit. half = FR_F16 or FR_BF16 stores saved
 * activations in that format; FR_F32 only inserts the casts that bring
 * 16-bit weights (pure half precision) to f32 where ops read them. */
fr_status fr_precision_apply(fr_graph *g, fr_dtype half, int n_nodes0, const int *origin,
                             int **order, int *n_order);

#endif
