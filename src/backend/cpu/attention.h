/* attention.h — causal multi-head self-attention on the CPU, forward and
 * backward, in tiles (FlashAttention-2): nothing of size T x T is stored,
 * the workspace is a tile per thread. Plain functions for now; the op table
 * does not hold them (the graph has no sequence tensors yet).
 *
 * Layout: q, k, v, out and their gradients are (B, NH, T, HS) row-major f32;
 * lse is (B, NH, T) f32. scale = 1/sqrt(HS); query t attends keys 0..t.
 * Results do not depend on the thread count: every output row is computed by
 * one task, in a fixed order, with one-thread GEMMs. */
#ifndef FR_ATTENTION_H
#define FR_ATTENTION_H

#include <stddef.h>

#define FR_ATTN_BQ 64 /* query rows per tile */
#define FR_ATTN_BK 32 /* key rows per tile */

/* Floats of workspace for `threads` threads: per thread two score tiles
 * (BQ x BK) and two values per query row (BQ), with BQ = min(T, 64) and
 * BK = min(T, 32): at most 2*64*32 + 2*64 = 4224 floats per thread, whatever
 * T and HS. The tiles shrink for T below them, so size ws with the T of the
 * calls. */
size_t fr_attention_ws_floats(int T, int HS, int threads);

/* out = softmax(scale q k^T + causal mask) v, and lse = the log of each
 * softmax's denominator (the max-shifted logsumexp of the row's scores).
 * Returns 0, or FR_ERR_ARG when ws holds less than one thread's slot
 * (the kernel then uses as many threads as ws has slots, at most the
 * OpenMP maximum). */
int fr_attention_fwd(const float *q, const float *k, const float *v, float *out, float *lse, int B,
                     int NH, int T, int HS, float *ws, size_t ws_floats);

/* dq, dk, dv (overwritten) from dout, given the forward's q, k, v, out and
 * lse. The same workspace as the forward. Returns 0 or FR_ERR_ARG. */
int fr_attention_bwd(const float *q, const float *k, const float *v, const float *out,
                     const float *dout, const float *lse, float *dq, float *dk, float *dv, int B,
                     int NH, int T, int HS, float *ws, size_t ws_floats);

#endif
