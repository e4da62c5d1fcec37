/* gemm.h (opencl) — the OpenCL kernels of LINEAR, LINEAR_BWD, CONV2D and
 * CONV2D_BWD (gemm.c: CLBlast GEMMs around gemm.cl's kernels; the kernels
 * themselves are declared with every op's in backend.h), the workspace the
 * convolutions need on the device, and the step's GEMM scratch. */
#ifndef FR_CL_GEMM_H
#define FR_CL_GEMM_H

#include "backend/opencl/backend.h"

/* Floats of workspace output j of a CONV2D node (j = 1) or CONV2D_BWD node
 * (j = 3; its forward is g->nodes[n->fwd]); 0 for any other j. The unroll of
 * a chunk of images, (C*K*K, OH*OW) each, as many images as fit in 16 MiB
 * (at least one, at most the batch); 0 for a 1x1, stride 1, unpadded
 * convolution, whose GEMMs read the images themselves. */
int64_t fr_cl_ws_conv2d(const fr_graph *g, const fr_node *n, int j);
int64_t fr_cl_ws_conv2d_bwd(const fr_graph *g, const fr_node *n, int j);

/* Floats of workspace output j of a QLINEAR node (j = 1) or QLINEAR_BWD
 * node (j = 3): a tile of the dequantized weight's rows (about 4 MiB, at
 * least one row); 0 for any other j. */
int64_t fr_cl_ws_qlinear(const fr_graph *g, const fr_node *n, int j);
/* Floats of workspace output j of a LINEAR_CE node (j = 2) or its backward
 * (j = 4): a chunk's logits and the row or column sums (gemm.c); 0 else. */
int64_t fr_cl_ws_linear_ce(const fr_graph *g, const fr_node *n, int j);

/* Floats of the step's GEMM scratch node n needs (the backend's ws_elems
 * with j = -1; gemm.c's top comment): the largest temporary buffer CLBlast
 * asks for any of the node's GEMMs at any operand offset, 0 for a node that
 * is none of LINEAR, LINEAR_BWD, CONV2D, CONV2D_BWD or whose GEMMs need none.
 * g->ctx must use the device (its queue answers). */
int64_t fr_cl_ws_gemm(const fr_graph *g, const fr_node *n);

#endif
