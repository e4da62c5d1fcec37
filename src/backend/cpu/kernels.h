/* kernels.h — the CPU kernels, one op family per file, declared below in
 * this order: linear.c, conv.c, pool.c, activation.c (ADD too), norm.c,
 * dropout.c, copy.c, offload.c (OFFLOAD, FETCH), cast.c, loss.c (its row
 * arithmetic in ce_row.h, shared with linear_ce.c: the head fused with it),
 * embedding.c, attention.c, optim.c (SGD and Adam on flat arrays), grad.c
 * (unscale, sum of squares and scale of a whole gradient) and optim_state.c
 * (Adam over compressed moments). OPTIM_STEP has no kernel (the optimizer
 * steps it, exec.h). Layout is row-major NCHW, f32 storage with f32 accumulation
 * (16-bit storage: below); f32 GEMMs go through OpenBLAS (cblas_sgemm), bf16
 * ones through oneDNN (gemm16.c), and loops are parallel with OpenMP. A
 * kernel never allocates (workspace comes in as an output planned by the
 * arena) and never decides what to keep; it does decide how to run: which
 * GEMM, how work is split (so that the bits do not depend on scheduling),
 * and, where the node's update bits ask (LINEAR_BWD), the plain SGD step
 * in place.
 *
 * Every kernel takes one fr_kernel_call. in[i]/out[i] follow the op's row in
 * ops.h; a tensor whose data is NULL is absent (an optional bias, or an
 * input gradient nobody needs). Bit i of `accumulate` set means out[i] must
 * be added into (a parameter gradient that already holds a value), clear
 * means overwritten. Results must not depend on scheduling: for a given
 * thread count, the same inputs give the same bits.
 *
 * Some kernels read an input stored in f16/bf16 themselves (the op table's
 * half_in says which and when; half_in.h widens): the activation backwards'
 * saved value, max pooling's x (planes up to FR_HALF_PLANE_MAX values),
 * BatchNorm backward's x (the same limit) and the shifted-GEMM convolution's
 * image. Widening is exact, so the result is the bits of the f32 call on the
 * widened input. Some write out[0] in f16/bf16 when it is bound so (the op
 * table's half_out): the elementwise activations and max pooling; the value
 * is the f32 result rounded, the bits a CAST after the f32 call would make.
 */
#ifndef FR_KERNELS_H
#define FR_KERNELS_H

#include <math.h>

#include "backend/backend.h"

/* A 16-bit plane read by pooling or BatchNorm is widened on the thread's
 * stack: at most this many values (64 KiB). */
#define FR_HALF_PLANE_MAX 16384
#define FR_HALF_OUT_PLANE_MAX 4096 /* max pooling writing 16 bits: output planes up to this */

/* linear.c — over the last dimension: x (..., K) of rank 2..4 is N = numel / K rows
 * (B,T,K) -> (B,T,O); an image batch (N,C,H,W) with K = C H W is N rows).
 * LINEAR      in: x (N,K), W (O,K), b (O)|absent        out: y (N,O) = x W^T + b
 * LINEAR_BWD  in: dy (N,O), x (N,K), W (O,K)            out: dx (N,K) = dy W, dW (O,K) = dy^T x, db (O) = sum_n dy
 * A weight updated inside LINEAR_BWD (update bit 1) takes its gradient in
 * tiles of whole rows, one tile per thread in grad_ws:
 * fr_k_linear_upd_ws(O, K, N, threads) floats (N: the largest number of rows,
 * B T for a (B,T,K) input). */
/* A function cloned for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and a
 * baseline, picked at load time; one function elsewhere. The IEEE
 * operations are the same in all three (C11 mode contracts nothing into
 * FMAs, and the loops keep their order of sums whatever the lane width), so
 * are the bits: test_golden's records hold on either clone. On this AMD
 * host the AVX-512 clones took gpt-tiny's GELU from 43 to 29 ms a step. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FR_V3_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FR_V3_CLONES
#endif
#define FR_UPD_TILE 16384
int fr_k_linear(fr_kernel_call *c);
int fr_k_linear_bwd(fr_kernel_call *c);
int fr_k_qlinear(fr_kernel_call *c); /* qlinear.c */
int fr_k_qlinear_bwd(fr_kernel_call *c);
/* QLINEAR's (bwd: QLINEAR_BWD's) GEMM scratch, in bytes, for N rows of a
 * bf16 input: a bf16 panel of W' and oneDNN's scratch (qlinear.c) */
size_t fr_k_qlinear16_ws(int64_t N, int64_t O, int64_t K, int bwd);
size_t fr_k_linear_upd_ws(int64_t O, int64_t K, int64_t N, int threads);
/* With bf16 operands (all of x, W, and dy for LINEAR_BWD) the GEMMs are
 * 16-bit ones with f32 accumulation (gemm16.h), the weight gradient in the
 * same tiles as above; with f32 operands they run on oneDNN's f32 matmul
 * where fr_gemm32_onednn_for() says so (the same tiles, the bias in the
 * forward's epilogue), else on OpenBLAS. oneDNN's scratch, in bytes, for N
 * rows (ab32: f32 operands): */
size_t fr_k_linear_gemm16_ws(int64_t N, int64_t O, int64_t K, int backward, int threads, int ab32);

/* conv.c — im2col + GEMM; attr.kernel (square), attr.stride, attr.pad (zeros).
 * CONV2D      in: x (N,C,H,W), W (OC,C,K,K), b (OC)|absent   out: y (N,OC,OH,OW), ws (f32 workspace)
 * CONV2D_BWD  in: dy (N,OC,OH,OW), x, W                     out: dx|absent, dW|absent, db|absent, ws
 * OH = (H + 2 pad - K) / stride + 1. The workspace length in floats is
 * fr_conv2d_ws_elems() for an image of dtype xdt and the operands blocked
 * (the path depends on both: conv_dnnl.h); the planner sizes it, the kernel
 * only uses it. A blocked operand (attr.blocked) runs on oneDNN only. */
int64_t fr_conv2d_ws_elems(const fr_shape *x, fr_dtype xdt, int64_t out_ch, int kernel, int stride,
                           int pad, int backward, int blk);
/* Whether oneDNN runs this geometry, forward and backward, with x, y, dy
 * and dx in nChw16c (blk in fr_conv2d_ws_elems: FR_CONV_BLK_*, conv_dnnl.h):
 * the layout pass's question (plan/layout.h). */
int fr_conv2d_blockable(const fr_shape *x, fr_dtype xdt, int64_t out_ch, int kernel, int stride,
                        int pad);
/* Whether the kernel writes a bf16 y for an f32 x (the model's input) off
 * oneDNN: on the im2col path, each image's f32 y rounded from the slot
 * (the shifted-GEMM path crops its wide rows into y itself). */
int fr_conv2d_rounds_y(const fr_shape *x, int64_t out_ch, int kernel, int stride, int pad);
/* Whether the kernel takes x in 16-bit dtype half: on the shifted-GEMM path
 * (see conv.c), or on oneDNN's where it runs such an image. */
int fr_conv2d_reads_half(const fr_shape *x, fr_dtype half, int64_t out_ch, int kernel, int stride,
                         int pad);
int fr_k_conv2d(fr_kernel_call *c);
int fr_k_conv2d_bwd(fr_kernel_call *c);

/* pool.c — attr.kernel (square), attr.stride, no padding, floor mode.
 * MAXPOOL2D          in: x (N,C,H,W)             out: y (N,C,OH,OW)
 * MAXPOOL2D_BWD      in: dy, x, absent           out: dx (gradient to the first max of each window, as PyTorch)
 * AVGPOOL2D          in: x                       out: y
 * AVGPOOL2D_BWD      in: dy                      out: dx (shape from the forward input)
 * GLOBAL_AVGPOOL     in: x (N,C,H,W)             out: y (N,C)
 * GLOBAL_AVGPOOL_BWD in: dy (N,C)                out: dx (N,C,H,W) */
int fr_k_maxpool2d(fr_kernel_call *c);
int fr_k_maxpool2d_bwd(fr_kernel_call *c);
int fr_k_avgpool2d(fr_kernel_call *c);
int fr_k_avgpool2d_bwd(fr_kernel_call *c);
int fr_k_global_avgpool(fr_kernel_call *c);
int fr_k_global_avgpool_bwd(fr_kernel_call *c);

/* activation.c — elementwise; out may alias in (the planner runs them in place).
 * RELU in: x out: y          RELU_BWD in: dy, y out: dx (dx may alias dy)
 * GELU (attr.approx 0: exact, erf; 1: tanh, GPT-2's)   GELU_BWD in: dy, x
 * SIGMOID                    SIGMOID_BWD in: dy, y
 * TANH                       TANH_BWD in: dy, y
 * ADD in: a, b out: y (same shapes; y may alias a) */
int fr_k_relu(fr_kernel_call *c);
int fr_k_relu_bwd(fr_kernel_call *c);
int fr_k_gelu(fr_kernel_call *c);
int fr_k_gelu_bwd(fr_kernel_call *c);
int fr_k_sigmoid(fr_kernel_call *c);
int fr_k_sigmoid_bwd(fr_kernel_call *c);
int fr_k_tanh(fr_kernel_call *c);
int fr_k_tanh_bwd(fr_kernel_call *c);
int fr_k_add(fr_kernel_call *c);

/* norm.c
 * BATCHNORM  in: x (N,C) or (N,C,H,W), gamma (C), beta (C), running_mean (C), running_var (C)
 *            out: y, mean (C), invstd (C)
 *   training (attr.training): batch statistics (biased variance for y); saves
 *   mean and invstd = 1/sqrt(var + eps); updates running stats in place as
 *   PyTorch: r = (1 - momentum) r + momentum * stat, with the unbiased
 *   variance (count/(count-1)) for running_var. eval: uses the running stats,
 *   mean/invstd outputs absent.
 * BATCHNORM_BWD in: dy, x, gamma, mean, invstd   out: dx|absent, dgamma|absent, dbeta|absent
 * LAYERNORM  in: x (N, D...) or (B,T,C), gamma (D...) or (C), beta as gamma; normalised
 *            over gamma's numel D, rows = numel(x) / D; eps = attr.eps
 *            out: y, mean (N) or (B,T), rstd (as mean)
 * LAYERNORM_BWD in: dy, x, gamma, mean, rstd     out: dx|absent, dgamma|absent, dbeta|absent */
int fr_k_batchnorm(fr_kernel_call *c);
int fr_k_batchnorm_bwd(fr_kernel_call *c);
int fr_k_layernorm(fr_kernel_call *c);
int fr_k_layernorm_bwd(fr_kernel_call *c);

/* rmsnorm.c — the Llama family's norm (HF LlamaRMSNorm), f32
 * RMSNORM     in: x (N, C) or (B,T,C), w (C) or absent (1)   out: y, rstd (N) or (B,T)
 *             rstd = 1/sqrt(mean_c x^2 + attr.eps), y = w (x rstd)
 * RMSNORM_BWD in: dy, x, w, rstd                              out: dx|absent, dw|absent */
int fr_k_rmsnorm(fr_kernel_call *c);
int fr_k_rmsnorm_bwd(fr_kernel_call *c);

/* swiglu.c — the Llama family's MLP gate, elementwise, f32
 * SWIGLU     in: gate, up (same numel)  out: y = silu(gate) up (y may alias gate)
 * SWIGLU_BWD in: dy, gate, up           out: dgate|absent (may alias dy), dup|absent */
int fr_k_swiglu(fr_kernel_call *c);
int fr_k_swiglu_bwd(fr_kernel_call *c);

/* dropout.c — attr.p; training: keep element i when
 * fr_rng_uniform(seed, ((uint64_t)step << 32) | attr.salt, i) >= p, scale kept
 * by 1/(1-p); eval (attr.training == 0): y = x, mask absent.
 * DROPOUT     in: x       out: y, mask (u8, same numel, 1 = kept)
 * DROPOUT_BWD in: dy, mask out: dx (may alias dy) */
int fr_k_dropout(fr_kernel_call *c);
int fr_k_dropout_bwd(fr_kernel_call *c);

/* copy.c
 * COPY in: x out: y = x, or y += x when the accumulate bit is set (a
 * gradient that passes through an add or a view into a parameter gradient) */
int fr_k_copy(fr_kernel_call *c);

/* offload.c
 * OFFLOAD in: x (arena) out: h (host memory) = x, byte for byte
 * FETCH   in: h (host memory) out: x' (arena) = h; on the CPU both are memcpy */
int fr_k_offload(fr_kernel_call *c);
int fr_k_fetch(fr_kernel_call *c);

/* cast.c
 * CAST in: x out: y = x converted to attr.dtype (f32, f16, bf16; round to
 * nearest even, exact where representable) */
int fr_k_cast(fr_kernel_call *c);

/* loss.c — mean reduction, as PyTorch's defaults. Cross-entropy's logits
 * (..., C) of rank 2..4 are N = numel / C rows ((B,T,C): B T rows, labels (B,T)),
 * as F.cross_entropy(z.view(-1, C), y.view(-1)).
 * CROSS_ENTROPY     in: logits (N,C), labels (i32 N)   out: loss (1) = mean_n (logsumexp(z_n) - z_n[y_n])
 * CROSS_ENTROPY_BWD in: logits, labels                 out: dlogits = attr.scale * (softmax(z) - onehot(y)) / N
 * MSE               in: pred (N,D), target (N,D)        out: loss (1) = mean (pred - target)^2
 * MSE_BWD           in: pred, target                    out: dpred = attr.scale * 2 (pred - target) / (N D)
 * A label outside [0, C) is an FR_ERR_ARG naming the sample. */
int fr_k_cross_entropy(fr_kernel_call *c);
int fr_k_cross_entropy_bwd(fr_kernel_call *c);
int fr_k_mse(fr_kernel_call *c);
int fr_k_mse_bwd(fr_kernel_call *c);
/* Accuracy's count on the host: the rows n of z (rows, C) whose first
 * maximum (strict >: ties go to the earliest, NaNs are passed over; a row
 * starting with NaN counts as class 0) is at y[n]. */
int64_t fr_k_argmax_hits(const float *z, const int32_t *y, int64_t rows, int64_t C);

/* linear_ce.c — the head fused with its cross-entropy (ops.h: LINEAR_CE):
 * LINEAR_CE      in: x (N,C), W (V,C), b (V)|absent, y (N) i32   out: loss (1), hits (1) i32, ws
 * LINEAR_CE_BWD  in: x, W, b, y          out: dx (N,C), dW (V,C), db (V), (none), ws
 * R = attr.rows logits rows a chunk; ws floats: R V + 2 N (forward), R V + 2 V (backward). */
int fr_k_linear_ce(fr_kernel_call *c);
int fr_k_linear_ce_bwd(fr_kernel_call *c);
/* LINEAR_CE's (bwd: LINEAR_CE_BWD's) GEMM scratch in bytes for N rows of a
 * bf16 x in chunks of R, C features, V classes: panels of W and dz in bf16
 * and oneDNN's scratch (linear_ce.c) */
size_t fr_k_linear_ce16_ws(int64_t N, int64_t R, int64_t C, int64_t V, int bwd);
#define FR_K_LINEAR_CE_WS(R, N, V, bwd) ((R) * (V) + 2 * ((bwd) ? (V) : (N)))

/* embedding.c — a GPT's input lookups. Ids outside the table are an
 * FR_ERR_ARG naming the sample and position.
 * EMBEDDING         in: idx (B,T) i32, W (V,C)         out: y (B,T,C), y[b,t] = W[idx[b,t]]
 * EMBEDDING_BWD     in: dy (B,T,C), idx                out: absent, dW (V,C): dW[v] (+)= sum of dy rows with idx == v
 * POS_EMBEDDING     in: x (B,T,C), W (Tmax,C), T<=Tmax out: y (B,T,C) = x + W[t] (y may alias x)
 * POS_EMBEDDING_BWD in: dy (B,T,C)                     out: absent, dW (Tmax,C): rows t < T (+)= sum_b dy[b,t],
 *                                                           rows >= T zero (untouched when accumulating) */
int fr_k_embedding(fr_kernel_call *c);
int fr_k_embedding_bwd(fr_kernel_call *c);
int fr_k_pos_embedding(fr_kernel_call *c);
int fr_k_pos_embedding_bwd(fr_kernel_call *c);

/* attention.c — causal multi-head self-attention in tiles (attention.h has
 * the math); attr.heads = NH divides C, HS = C / NH, attr.causal must be 1.
 * ATTENTION     in: qkv (B,T,3C): q = [..., 0:C], k = [..., C:2C], v = [..., 2C:3C],
 *                   head h in columns h HS .. (h+1) HS of each
 *               out: y (B,T,C) (y[b,t,h HS + j]), lse (B,NH,T), ws (fr_attention_ws_floats)
 * ATTENTION_BWD in: dy (B,T,C), qkv, y, lse
 *               out: dqkv (B,T,3C) (overwritten: accumulating is refused), D (B,NH,T) = rowsum(dy o y)
 *                    per head, ws (the forward's size)
 * attr.kv_heads = NKV (0 or NH: the above): grouped-query attention, qkv and dqkv
 * (B,T,(NH+2NKV)HS) = [q heads | k heads | v heads], query head h reading kv head h/(NH/NKV),
 * dk and dv summed over a kv head's group; y (B,T,NH HS) */
int fr_k_attention(fr_kernel_call *c);
int fr_k_attention_bwd(fr_kernel_call *c);

/* rope.c — rotary position embeddings (rope.h has the formulas); attr.heads NH,
 * attr.kv_heads NKV (0: NH), attr.rope; HS even.
 * ROPE_QKV     in: q (B,T,NH HS), k, v (B,T,NKV HS)
 *              out: qkv (B,T,(NH+2NKV)HS) = [rot(q) | rot(k) | v], row t at position t,
 *                   or fr_kernel_call.step + t with attr.rope.pos_from_step
 * ROPE_QKV_BWD in: dqkv   out: dq, dk (the transposed rotation), dv (a copy), each when
 *                   wanted, overwritten (accumulating is refused) */
int fr_k_rope_qkv(fr_kernel_call *c);
int fr_k_rope_qkv_bwd(fr_kernel_call *c);

/* optim.c — parameter updates on flat arrays, PyTorch's formulas exactly.
 * SGD: d = g + wd p; with momentum: buf = d on the first step, else
 *      buf = momentum buf + (1 - dampening) d; d = nesterov ? d + momentum buf : buf;
 *      p -= lr d.
 * Adam (decoupled = 0): g += wd p. AdamW (decoupled = 1): p *= 1 - lr wd.
 *      m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *      p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = step (1-based). */
/* grad.c — whole-gradient passes; g is dt (f32, f16 or bf16) with n values.
 * unscale: g = g * f (PyTorch's _amp_foreach_non_finite_check_and_unscale_),
 *          returning 1 if any value it read was inf or NaN, else 0.
 * sumsq:   the sum of g^2 in double, in fixed blocks (thread-count free).
 * scale:   g = g * f. 16-bit values are rounded back after the multiply. */
int fr_k_grad_unscale(void *g, fr_dtype dt, size_t n, float f);
double fr_k_grad_sumsq(const void *g, fr_dtype dt, size_t n);
void fr_k_grad_scale(void *g, fr_dtype dt, size_t n, float f);

void fr_k_sgd(float *p, const float *g, float *buf, size_t n, const fr_optim_opts *o,
              int first_step);
void fr_k_adam(float *p, const float *g, float *m, float *v, size_t n, const fr_optim_opts *o,
               int64_t step, int decoupled);
/* adafactor.c — torch.optim.Adafactor's step on p (shape), g and its state
 * region st (backend/state.h's fr_factored layout; exp_avg after it when
 * o->beta1 != 0), step 1-based; bits independent of the thread count. */
void fr_k_adafactor(float *p, const float *g, float *st, const fr_shape *shape,
                    const fr_optim_opts *o, int64_t step);
/* Adafactor's scalars at step `step`, formed in double from the options
 * and rounded once, as PyTorch's Python floats: fr_adafactor_setup from the
 * weights' sum of squares (fr_k_grad_sumsq's blocks), fr_adafactor_finish
 * from the update's (U = g rsqrt(max(V, eps1^2)), summed slice by slice).
 * Every backend steps with these. */
typedef struct fr_adafactor_consts {
    float w, eps1, eps_sq;   /* t^beta2_decay; eps1; eps1^2 */
    double alpha;            /* max(eps2, RMS(p)) min(lr, 1/sqrt(t)) */
    float neg, fden, falpha; /* -alpha/denom; denom; alpha */
    float shrink, b1, keep;  /* 1 - lr wd; beta1; 1 - beta1 */
    int decay, first_moment;
} fr_adafactor_consts;
fr_adafactor_consts fr_adafactor_setup(const fr_optim_opts *o, int64_t step, double sumsq_p,
                                       int64_t n);
void fr_adafactor_finish(fr_adafactor_consts *c, const fr_optim_opts *o, double sumsq_u, int64_t n);

/* Adam's scalars for step `step` (1-based), formed as PyTorch forms them
 * from its Python floats (double): 1 - b1, 1 - b2, lr / (1 - b1^t),
 * sqrt(1 - b2^t) and 1 - lr wd in double, each rounded to float once where
 * it meets a float tensor; b1, b2, eps and wd rounded to float as they are.
 * Every state format (f32, bf16, int8, 16-bit weights) updates with these. */
typedef struct fr_adam_consts {
    float neg_step_size, bc2_sqrt, b1, b2, eps, one_minus_b1, one_minus_b2, wd, shrink;
    int l2, dec; /* Adam's L2 term, AdamW's decoupled decay */
} fr_adam_consts;
fr_adam_consts fr_adam_setup(const fr_optim_opts *o, int64_t step, int decoupled);

/* One element of Adam/AdamW, PyTorch's operations in PyTorch's order with
 * its roundings. PyTorch's CPU kernels (AVX2 and AVX-512 builds) fuse
 * `a.add_(b, alpha=s)` into fma(b, s, a) and `a.addcmul_(b, c, value=s)`
 * into fma(s b, c, a); fmaf gives the same single rounding:
 *   g = fma(p, wd, g)                                 (Adam: grad.add(p, alpha=wd))
 *   p = p (1 - lr wd)                                 (AdamW: p.mul_)
 *   m = fma(g, 1 - b1, m b1)                          (m.mul_(b1).add_(g, alpha=1-b1))
 *   v = fma((1 - b2) g, g, v b2)                      (v.mul_(b2).addcmul_(g, g, value=1-b2))
 *   p = p + (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (addcdiv_)
 * m and v come in as f32 and leave as f32 (the caller decodes and encodes
 * other state formats). */
static inline void fr_adam_elem(const fr_adam_consts *c, float *p, float g, float *m, float *v) {
    float gi = g;
    float pi = *p;
    if (c->l2) gi = fmaf(pi, c->wd, gi);
    if (c->dec) pi = pi * c->shrink;
    float mi = fmaf(gi, c->one_minus_b1, *m * c->b1);
    float vi = fmaf(c->one_minus_b2 * gi, gi, *v * c->b2);
    float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
    *m = mi;
    *v = vi;
    *p = pi + c->neg_step_size * mi / denom;
}

#endif
