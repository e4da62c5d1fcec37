/* attention.h (opencl) — ATTENTION and ATTENTION_BWD on the device
 * (fr_cl_k_attention, fr_cl_k_attention_bwd, declared in backend.h) on the
 * fused qkv (B,T,3C) layout, as src/backend/cpu/attention.c; the OpenCL C is
 * kernels/attention.cl. */
#ifndef FR_CL_ATTENTION_H
#define FR_CL_ATTENTION_H

#include "backend/opencl/backend.h"

/* Workspace output j of an ATTENTION or ATTENTION_BWD node, in f32 elements:
 * the device kernels keep their tiles in registers and need none, so out[2]
 * is planned as one float (a non-empty tensor the kernels leave alone);
 * -1 for any other j (not a workspace of these ops). */
int64_t fr_cl_ws_attention(const fr_graph *g, const fr_node *n, int j);

#endif
