/* attention.h — causal multi-head self-attention on the CPU, forward and
 * backward, in tiles (FlashAttention-2): nothing of size T x T is stored,
 * the workspace is a tile per thread. The op table's ATTENTION and
 * ATTENTION_BWD (kernels.h) call these on the fused layout.
 *
 * Layout: q, k, v, out and their gradients are read through strides
 * (fr_attn_layout): element (b, h, t, j) of q, k, v, dq, dk, dv is at
 * b qb + h qh + t qt + j from its pointer, of out and dout at
 * b ob + h oh + t ot + j. Two layouts are used:
 *  - packed (B, NH, T, HS) tensors each (fr_attn_packed);
 *  - fused, as a GPT holds them (fr_attn_fused): q, k, v are the column
 *    blocks [0,C), [C,2C), [2C,3C) of qkv (B, T, 3C), head h at columns
 *    h HS .. (h+1) HS of each (row stride 3C), out is (B, T, C) (row
 *    stride C); dq, dk, dv are the same blocks of dqkv. The GEMMs take the
 *    row strides as leading dimensions: no transposed copies.
 * lse and D are (B, NH, T) f32. scale = 1/sqrt(HS); query t attends keys 0..t.
 * Grouped-query attention (NKV < NH): k, v, dk, dv have NKV heads, query head
 * h reads kv head h / (NH / NKV), and dk, dv of a kv head are the sums over
 * its group's query heads, added in increasing head order.
 * Results do not depend on the thread count: every output row is computed by
 * one task, in a fixed order, with one-thread GEMMs. */
#ifndef FR_ATTENTION_H
#define FR_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#define FR_ATTN_BQ 64 /* query rows per tile */
#define FR_ATTN_BK 64 /* key rows per tile */

typedef struct fr_attn_layout {
    int B, NH, T, HS;
    size_t qb, qh, qt; /* strides of q (and dq), in floats; qt also k's and v's */
    size_t ob, oh, ot; /* strides of out (and dout) */
    /* grouped-query attention: NKV key/value heads (dividing NH), query head
     * h reading kv head h / (NH / NKV); k, v, dk, dv's batch and head strides
     * (their row stride is qt). NKV = NH: multi-head attention. */
    int NKV;
    size_t kb, kh;
} fr_attn_layout;

/* q, k, v, out each (B, NH, T, HS) */
fr_attn_layout fr_attn_packed(int B, int NH, int T, int HS);
/* q, out (B, NH, T, HS), k, v (B, NKV, T, HS) */
fr_attn_layout fr_attn_packed_gqa(int B, int NH, int NKV, int T, int HS);
/* q, k, v = qkv + 0, C, 2C of qkv (B, T, 3C); out (B, T, C); C = NH HS */
fr_attn_layout fr_attn_fused(int B, int NH, int T, int HS);
/* grouped: q, k, v = qkv + 0, NH HS, (NH + NKV) HS of qkv (B, T, (NH + 2 NKV) HS)
 * (q heads | k heads | v heads); out (B, T, NH HS) */
fr_attn_layout fr_attn_fused_gqa(int B, int NH, int NKV, int T, int HS);

/* Floats of workspace for `threads` threads: per thread two score tiles
 * (BQ x BK) and two values per query row (BQ), with BQ = min(T, 64) and
 * BK = min(T, 64): at most 2*64*64 + 2*64 = 8320 floats per thread, whatever
 * T and HS. The tiles shrink for T below them, so size ws with the T of the
 * calls. */
size_t fr_attention_ws_floats(int T, int HS, int threads);

/* 16-bit operands: q, k and v stored in qkv (f32, f16 or bf16; widened a
 * tile at a time into the workspace, exactly, so the result is the f32
 * call's on the widened values), out in `out` (f32, or 16 bits: the f32
 * result rounded to nearest even, as a CAST would round it); in the
 * backward, dq, dk and dv of dqkv (f32, or 16 bits: each row summed in f32
 * as the f32 call sums it, then rounded to nearest even, as a CAST would;
 * 0 is f32). */
typedef struct fr_attn_io {
    int qkv, out, dqkv; /* fr_dtype */
} fr_attn_io;

/* The workspace with 16-bit operands (half): per thread also the widened
 * q, k and v tiles and out's f32 rows, (2 BQ + 2 BK) HS floats more, or,
 * where the CPU has the bf16 tile products, their buffers if larger: the
 * packs of up to 16 key tiles of a head, so a slot grows with T up to
 * T = 1024 (attention.c, t16_layout). */
size_t fr_attention_ws_floats_io(int T, int HS, int threads, int half);
/* The backward's: with 16-bit gradients (grad16) each thread also sums a
 * query head's dq and its kv head's dk and dv in f32, 3 T HS floats more. */
size_t fr_attention_bwd_ws_floats(int T, int HS, int threads, int half, int grad16);

/* out = softmax(scale q k^T + causal mask) v, and lse = the log of each
 * softmax's denominator (the max-shifted logsumexp of the row's scores;
 * lse may be NULL: not kept). Returns 0, or FR_ERR_ARG when ws holds less
 * than one thread's slot (the kernel then uses as many threads as ws has
 * slots, at most the OpenMP maximum). */
int fr_attention_fwd(const fr_attn_layout *L, const float *q, const float *k, const float *v,
                     float *out, float *lse, float *ws, size_t ws_floats);
/* the same with io's dtypes (q, k, v of io->qkv, out of io->out) */
int fr_attention_fwd_io(const fr_attn_layout *L, const fr_attn_io *io, const void *q, const void *k,
                        const void *v, void *out, float *lse, float *ws, size_t ws_floats);

/* dq, dk, dv (overwritten) from dout, given the forward's q, k, v, out and
 * lse; D (B, NH, T) receives rowsum(dout o out). The same workspace as the
 * forward. Returns 0 or FR_ERR_ARG. */
int fr_attention_bwd(const fr_attn_layout *L, const float *q, const float *k, const float *v,
                     const float *out, const float *dout, const float *lse, float *D, float *dq,
                     float *dk, float *dv, float *ws, size_t ws_floats);
/* the same with io's dtypes (q, k, v of io->qkv, out of io->out, dq, dk
 * and dv of io->dqkv; dout f32), on the workspace of
 * fr_attention_bwd_ws_floats */
int fr_attention_bwd_io(const fr_attn_layout *L, const fr_attn_io *io, const void *q, const void *k,
                        const void *v, const void *out, const float *dout, const float *lse,
                        float *D, void *dq, void *dk, void *dv, float *ws, size_t ws_floats);

/* ---- generation (ATTENTION_KV, LAST_ROW) ----
 * fr_k_attention_kv: a chunk of P positions from pos (fr_kernel_call.step),
 * qkv (B,P,(NH+2NKV)HS) in the fused layout, the caches K, V (B,NKV,Tc,HS): the
 * chunk's keys and values go to rows pos .. pos+P-1 of the caches, then
 * y (B,P,C) is the causal attention of query row t over positions 0 ..
 * pos+t. At pos 0 the chunk is all there is: fr_attention_fwd on qkv itself
 * (the tiled kernel a prefill has always run). Past it, row by row, each
 * head's scores over the cached keys into ws (Tc floats a head), then their
 * softmax (the sum in double) and the weighted values.
 * fr_k_last_row: y (B,1,...) = x[:, T-1] of x (B,T,...), any dtype. */
struct fr_kernel_call;
int fr_k_attention_kv(struct fr_kernel_call *c);
int fr_k_last_row(struct fr_kernel_call *c);
/* ATTENTION_KV's workspace in floats: the tiled kernel's for a chunk of P
 * rows and `threads` threads, or NH Tc scores, whichever is larger. */
int64_t fr_attention_kv_ws(int P, int NH, int Tc, int HS, int threads);

#endif
