/* kcheck.h — the checks of a kernel call that do not depend on where it runs:
 * shapes, dtypes and attributes of each op's tensors, the sizes derived from
 * them (rows N, inner K, outputs O, a convolution's geometry...) and the
 * error messages (word for word what the tests expect). The CPU kernels
 * (src/backend/cpu) and the OpenCL ones (src/backend/opencl) both call these
 * before they touch any data, so a bad call fails the same way on both.
 * Each returns FR_OK or the fr_fail status, with the context's error set. */
#ifndef FR_BACKEND_KCHECK_H
#define FR_BACKEND_KCHECK_H
#include <stdint.h>
#include "backend/backend.h"

/* LINEAR / LINEAR_BWD: x is (N, K) with N = numel(x) / K ((B,T,K) is B T
 * rows, an image batch (N,C,H,W) is N rows of C H W), W is (O, K). */
typedef struct fr_linear_dims {
    int64_t N, K, O;
} fr_linear_dims;
int fr_kcheck_linear(fr_kernel_call *c, fr_linear_dims *d);     /* also y (N, O) */
int fr_kcheck_linear_bwd(fr_kernel_call *c, fr_linear_dims *d); /* also dy (N, O) */

/* QLINEAR / QLINEAR_BWD: the node's attr.shape (O, K) and attr.qfmt, Wq
 * in[1] of fr_quant_bytes of them, x (QLINEAR) or dy (QLINEAR_BWD) in[0] N
 * rows of K (O) values, f32 (or bf16 where the backend's kernel takes it:
 * bf16_in), y (dx) out[0] N rows of O (K), f32. */
int fr_kcheck_qlinear(fr_kernel_call *c, int bwd, int bf16_in, fr_linear_dims *d);
/* The step's GEMM scratch (c->gemm_ws) holds need bytes: what a kernel that
 * takes a bf16 input carves its bf16 panels and oneDNN's scratch from. */
int fr_kcheck_gemm_ws(fr_kernel_call *c, const char *op, size_t need);

/* CONV2D: x (N,C,H,W), W (OC,C,K,K), y (N,OC,OH,OW) at stride S, padding P. */
typedef struct fr_conv_dims {
    int64_t N, C, H, W, OC, K, S, P, OH, OW;
    int64_t ckk, ohw, chw;       /* GEMM inner dimension, output positions, values per image */
    int64_t col;                 /* floats of one image's im2col unroll (0 when direct) */
    int direct;                  /* 1x1, stride 1, no padding: the image is its own unroll */
    int same;                    /* stride 1, OH = H and OW = W: rows of col are shifted planes */
    int64_t Hp, Wp, plane, wide; /* padded plane Hp x Wp, wide rows H x Wp */
} fr_conv_dims;
/* The geometry of x convolved to oc channels; -1 (no error set) when the
 * kernel, stride or padding do not fit x. */
int fr_conv_dims_make(fr_conv_dims *g, const fr_shape *x, int64_t oc, int k, int s, int p);
/* x, W and the output shape y against the node's kernel, stride and pad; op
 * names the op in the message ("conv2d", "conv2d_bwd"). */
int fr_kcheck_conv2d(fr_kernel_call *c, const char *op, fr_conv_dims *g, const fr_tensor *x,
                     const fr_tensor *w, const fr_shape *y);

/* MAXPOOL2D / AVGPOOL2D: x (..., H, W), y (..., OH, OW), planes = numel / (H W). */
typedef struct fr_pool_dims {
    int64_t planes, H, W, K, S, OH, OW;
} fr_pool_dims;
int fr_kcheck_pool(fr_kernel_call *c, const char *op, const fr_shape *x, const fr_shape *y,
                   fr_pool_dims *g);

/* BATCHNORM: x (N,C) or (N,C,H,W); HW is 1 for (N,C). */
int fr_kcheck_bn_dims(fr_kernel_call *c, const char *op, const fr_shape *x, int64_t *N, int64_t *C,
                      int64_t *HW);
/* The forward's mode: training needs N HW > 1, eval the running statistics
 * (in[3], in[4], present when `have_running`). */
int fr_kcheck_bn_mode(fr_kernel_call *c, int64_t N, int64_t HW, int have_running);

/* LAYERNORM: rows N and normalised size D of x: D = numel(gamma) (the
 * trailing shape, (C) for x (B,T,C), (C,H,W) for x (N,C,H,W)); without
 * gamma the saved statistics (mean) give the rows, without them dim 0 does. */
int fr_kcheck_ln_rows(fr_kernel_call *c, const char *op, const fr_tensor *x, const fr_tensor *gamma,
                      const fr_tensor *mean, int64_t *N, int64_t *D);

/* CROSS_ENTROPY(_BWD): logits in[0] (..., C) of rank 2..4 are N = numel / C
 * rows, labels in[1] i32, one per row. The labels' values are the
 * backend's to scan (they may live on a device); fr_kcheck_bad_label is the
 * message for the first one outside [0, C): label y of row n. */
int fr_kcheck_ce(fr_kernel_call *c, const char *op, int64_t *N, int64_t *C);
int fr_kcheck_bad_label(fr_kernel_call *c, const char *op, int64_t n, int32_t y, int64_t C);
/* CROSS_ENTROPY_BWD's dlogits out[0]: N C values. */
int fr_kcheck_ce_dlogits(fr_kernel_call *c, int64_t N, int64_t C);
/* LINEAR_CE(_BWD): x in[0] (N, C) or (B, T, C), W in[1] (V, C), b in[2] (V)
 * or absent, labels in[3] i32 (N); R the rows a chunk (attr.rows clamped to
 * 1 .. N, as fr_op_ce_chunk_rows); the workspace out[ws] holds at least
 * R V floats (a chunk's logits) and n_mult N + v_mult V more (the backend's). The backward's dx,
 * dW, db (out[0..2], where present) have x's, W's, b's sizes. The labels'
 * values are the backend's to scan (fr_kcheck_bad_label's message). */
typedef struct fr_ce_dims {
    int64_t N, C, V, R;
} fr_ce_dims;
int fr_kcheck_linear_ce(fr_kernel_call *c, const char *op, int ws, int64_t n_mult, int64_t v_mult,
                        fr_ce_dims *d);
/* The message for label y of row n outside [0, V) (rows of x, by sample and
 * position as fr_kcheck_bad_label words it). */
int fr_kcheck_linear_ce_label(fr_kernel_call *c, const char *op, int64_t n, int32_t y, int64_t V);
/* MSE(_BWD): pred in[0] and target in[1] of *n values each. */
int fr_kcheck_mse(fr_kernel_call *c, const char *op, int64_t *n);

/* EMBEDDING: ids in[0] i32 (B,T), W in[1] (V,C), y (B,T,C): R = numel(ids).
 * EMBEDDING_BWD: dy in[0] (B,T,C), ids in[1], dW out[1] (V,C). The ids'
 * dtype is checked here; their values, like labels, by the backend, with
 * fr_kcheck_bad_id the message for id `id` at flat position r of idx. */
int fr_kcheck_embedding(fr_kernel_call *c, int64_t *R, int64_t *V, int64_t *C);
int fr_kcheck_embedding_bwd(fr_kernel_call *c, int64_t *R, int64_t *V, int64_t *C);
int fr_kcheck_bad_id(fr_kernel_call *c, const char *op, const fr_tensor *idx, int64_t r, int32_t id,
                     int64_t V);

/* Elementwise: out[0] has in[0]'s number of elements, *n. */
int fr_kcheck_same_numel(fr_kernel_call *c, const char *op, int64_t *n);
/* ADD: in[0], in[1] and out[0] all of *n elements (and out[1] too, where
 * bound: fr_kcheck_copy16). */
int fr_kcheck_add(fr_kernel_call *c, int64_t *n);
/* A 16-bit copy of out[0] (fr_op_info.half_copy) in out[1], where the node
 * has one: f16 or bf16, out[0]'s number of elements. */
int fr_kcheck_copy16(fr_kernel_call *c, const char *op);
static inline const fr_tensor *fr_kcopy16(const fr_kernel_call *c) {
    return c->node && c->node->n_out > 1 && c->out[1].data ? &c->out[1] : NULL;
}

/* ATTENTION(_BWD), ATTENTION_KV: qkv (B,T,(NH+2NKV)HS) with heads NH and
 * kv_heads NKV dividing NH (0: NH, then qkv is (B,T,3C), C = NH HS), causal. */
typedef struct fr_attn_dims {
    int B, T, NH, HS;
    int NKV; /* key/value heads: attr.kv_heads, or NH when 0 */
} fr_attn_dims;
int fr_kcheck_attention(fr_kernel_call *c, const char *op, const fr_tensor *qkv, fr_attn_dims *d);

/* LAST_ROW: x (B,T,...) of any dtype, y (B,1,...) of x's dtype; *row is the
 * bytes of one x[b, t], 0 when x is empty. */
int fr_kcheck_last_row(fr_kernel_call *c, int64_t *B, int64_t *T, size_t *row);

/* RMSNORM(_BWD): x (..., C) is N = numel / C rows of C (its last
 * dimension), w (C) or absent, rstd (N) or absent, all f32. */
int fr_kcheck_rmsnorm(fr_kernel_call *c, const char *op, const fr_tensor *x, const fr_tensor *w,
                      const fr_tensor *rstd, int64_t *N, int64_t *C);
/* RMSNORM_BWD's inputs (dy, x, w, rstd): fr_kcheck_rmsnorm's checks and dy f32 of x's size. */
int fr_kcheck_rmsnorm_bwd(fr_kernel_call *c, int64_t *N, int64_t *C);
/* SWIGLU(_BWD): gate and up (in[0], in[1]; the backward's in[1], in[2]) of
 * *n values, as every present output and the backward's dy; all f32. */
int fr_kcheck_swiglu(fr_kernel_call *c, const char *op, int bwd, int64_t *n);

#endif
