/* linear.c — the fully connected layer, LINEAR and LINEAR_BWD, and nothing
 * else; it allocates nothing (its scratch, gemm_ws and grad_ws, is planned by
 * the caller). The policy it holds: the GEMM follows the operands' dtype (all
 * f32: OpenBLAS; all bf16: oneDNN through gemm16.c; a mix is refused; which
 * dtype they have is the mixed-precision pass's choice); the weight gradient
 * is formed in tiles of rows sized here (upd_tile_rows), so its bits do not
 * depend on scheduling; with the node's update bit 1 (2) set the plain SGD
 * step (attr.lr, attr.wd) is fused into the backward, W (b) stepped in place
 * from each tile, its gradient never stored; a thread team only above LIN_PAR_MIN elements.
 * Whether dx, dW and db are wanted is the caller's (data NULL). */
#include <cblas.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define LIN_PAR_MIN 16384 /* elements below which a thread team costs more than it saves */

/* The GEMM operands of a call: all f32 (OpenBLAS), or all bf16 (a 16-bit
 * GEMM, gemm16.c), as the mixed-precision pass binds them when the CPU has
 * one. Returns 1 for bf16, 0 for f32, -1 with the error set. */
static int operands16(fr_kernel_call *c, const char *op, const fr_tensor *const *t, int n) {
    int n32 = 0, n16 = 0, used = 0;
    for (int i = 0; i < n; i++)
        if (t[i]->data) used++, n32 += t[i]->dtype == FR_F32, n16 += t[i]->dtype == FR_BF16;
    if (n32 == used) return 0;
    if (n16 == used) return 1;
    fr_fail(c->ctx, FR_ERR_ARG, "%s: the GEMM's operands must be all f32 or all bf16", op);
    return -1;
}

/* A linear node's attr.scale: y = scale (x W^T) + b, 0 read as 1 (LoRA's
 * B product, alpha / r). OpenBLAS takes it as the GEMM's alpha; the 16-bit
 * and oneDNN GEMMs have none, so a scaled node stays on OpenBLAS in f32 (the
 * mixed-precision pass gives it no 16-bit operands: precision.c). */
static float lin_scale(const fr_kernel_call *c) {
    float s = c->node ? c->node->attr.scale : 0.0f;
    return s == 0.0f ? 1.0f : s;
}

static inline float bf16_at(const uint16_t *p, int64_t i) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)p[i] << 16};
    return v.f;
}

// x is (N,K) (N = numel / K: (B,T,K) is B T rows), W is (O,K), b is (O) or absent, y is (N,O)
// y[n,o] = s sum_k x[n,k] W[o,k] + b[o]   (s: lin_scale, 1 but for a scaled node)
int fr_k_linear(fr_kernel_call *c) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *b = &c->in[2], *y = &c->out[0];
    fr_linear_dims d;
    int st = fr_kcheck_linear(c, &d);
    if (st) return st;
    const int64_t K = d.K, O = d.O, N = d.N;
    if (N == 0 || O == 0) return FR_OK;
    const float *bp = fr_f32(b);
    const fr_tensor *ops[2] = {x, w};
    int h = operands16(c, "linear", ops, 2);
    if (h < 0) return FR_ERR_ARG;
    const float s = lin_scale(c);
    if (h && s != 1.0f)
        return fr_fail(c->ctx, FR_ERR_ARG, "linear: a scaled GEMM (scale %g) takes f32 operands",
                       (double)s);
    const int d32 = !h && s == 1.0f && fr_gemm32_onednn_for(N, O, K); /* f32 on oneDNN */
    if ((h || d32) && K > 0) { /* the bias and a 16-bit y are the GEMM's epilogue: no pass */
        if (y->dtype != FR_F32 && (y->dtype != FR_BF16 || d32))
            return fr_fail(c->ctx, FR_ERR_ARG, "linear: a bf16 GEMM writes y in f32 or bf16");
        fr_gemm16_out e = {bp, y->dtype == FR_BF16, d32};
        st = fr_gemm16_epi(c->ctx, 0, 1, N, O, K, x->data, K, w->data, K, 0.0f, y->data, O, &e,
                           c->gemm_ws, c->gemm_ws_len);
        if (st != FR_GEMM16_DECLINE) return st; /* else: no scratch planned, OpenBLAS */
    }
    if (y->dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG, "linear: y in 16 bits needs a bf16 GEMM (K > 0)");
    float *yp = fr_f32(y);
    float beta = 0.0f;
    if (bp) { /* seed y with the bias, then let the GEMM add x W^T on top */
#pragma omp parallel for schedule(static) if (N * O >= LIN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) memcpy(yp + n * O, bp, (size_t)O * sizeof(float));
        beta = 1.0f;
    }
    if (K == 0) {
        if (!bp) memset(yp, 0, (size_t)(N * O) * sizeof(float));
        return FR_OK;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)K, s, fr_f32(x),
                (int)K, fr_f32(w), (int)K, beta, yp, (int)O);
    return FR_OK;
}

/* Rows per tile: at least FR_UPD_TILE floats (a tile stays in L2 while it
 * is stepped), and at least half the batch up to 512 rows, because every
 * tile's GEMM packs x (N x K) again: at batch 1024 tiles of 20 rows made the
 * seed MLP's step 10% slower than one GEMM into W, tiles of 512 rows 1-2%. */
static int64_t upd_tile_rows(int64_t O, int64_t K, int64_t N, int threads) {
    int64_t t = K > 0 ? FR_UPD_TILE / K : O, by_n = N / 2 < 512 ? N / 2 : 512;
    if (t < by_n) t = by_n;
    if (t < 1) t = 1;
    if (t > O) t = O;
    /* Balanced: a multiple of the threads' count of tiles, of equal rows (3
     * tiles on 2 threads would leave one idle a third of the time). */
    int64_t tiles = O > 0 ? (O + t - 1) / t : 1;
    if (threads > 1 && O >= threads) tiles = (tiles + threads - 1) / threads * threads;
    return O > 0 ? (O + tiles - 1) / tiles : 1;
}

size_t fr_k_linear_upd_ws(int64_t O, int64_t K, int64_t N, int threads) {
    return (size_t)(upd_tile_rows(O, K, N, threads) * K) * (size_t)(threads > 0 ? threads : 1);
}

/* fr_k_sgd without momentum on one tile: p = p + (-lr)(g + wd p), a loop
 * for each case so that both vectorize. */
static void sgd_tile(float *restrict p, const float *restrict g, int64_t len, float lr, float wd) {
    if (wd != 0.0f) {
#pragma omp simd
        for (int64_t i = 0; i < len; i++) p[i] = p[i] + (-lr) * (g[i] + wd * p[i]);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < len; i++) p[i] = p[i] + (-lr) * g[i];
    }
}

/* dW (O,K) = dy^T x a tile of rows per task, each tile by a one-thread GEMM
 (OpenBLAS runs single-threaded inside a parallel region; a lone tile may use
 * its threads), so a tile's bits do not depend on which thread computes it.
 * OpenBLAS's blocking makes a GEMM's bits depend on how its rows are split
 * and on its thread count (on its Haswell kernel a 54-row tile of a 512-row
 * product differs from the whole product in about 4% of its values), so the
 * kept gradient and the SGD step inside backward form dW in the same tiles:
 * at the same thread count the step gives the bits of the kept gradient's
 * update.
 * The tiles are scaled by s (lin_scale).
 * update 0: the tile goes into dw's rows (beta 0, or 1 to accumulate);
 * update 1: into the thread's slot of grad_ws, then W's rows take
 * W = W - lr (g + wd W), lr and wd the node's attr. */
static int weight_grad(fr_kernel_call *c, const float *dyp, const float *xp, float *dw, int64_t N,
                       int64_t O, int64_t K, int update, float beta, float s) {
    int nt = omp_get_max_threads();
    int64_t rows = upd_tile_rows(O, K, N, nt), tile = rows * K, ntiles = (O + rows - 1) / rows;
    if (update) {
        int64_t slots = tile ? (int64_t)(c->grad_ws_len / (size_t)tile) : 0;
        if (!c->grad_ws || slots < 1)
            return fr_fail(c->ctx, FR_ERR_ARG,
                           "linear_bwd: the weight update needs %lld floats of "
                           "scratch per thread, %zu given",
                           (long long)tile, c->grad_ws_len);
        if (nt > slots) nt = (int)slots;
    }
    if (nt > ntiles) nt = (int)ntiles;
    const float lr = c->node->attr.lr, wd = c->node->attr.wd;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *g = update ? c->grad_ws + (size_t)omp_get_thread_num() * (size_t)tile : NULL;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntiles; t++) {
            int64_t o0 = t * rows, r = O - o0 < rows ? O - o0 : rows;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r, (int)K, (int)N, s,
                        dyp + o0, (int)O, xp, (int)K, update ? 0.0f : beta,
                        update ? g : dw + o0 * K, (int)K);
            if (update) sgd_tile(dw + o0 * K, g, r * K, lr, wd);
        }
    }
    return FR_OK;
}

/* weight_grad of bf16 dy and x: the same tiles, one after another, each a
 * 16-bit GEMM on all the threads (into grad_ws's first slot when updating). */
static int weight_grad16(fr_kernel_call *c, const uint16_t *dyp, const uint16_t *xp, float *dw,
                         int64_t N, int64_t O, int64_t K, int update, float beta) {
    int64_t rows = upd_tile_rows(O, K, N, omp_get_max_threads());
    if (update && (!c->grad_ws || c->grad_ws_len < (size_t)(rows * K)))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "linear_bwd: the weight update needs %lld floats of scratch, %zu given",
                       (long long)(rows * K), c->grad_ws_len);
    for (int64_t o0 = 0; o0 < O; o0 += rows) {
        int64_t r = O - o0 < rows ? O - o0 : rows;
        float *g = update ? c->grad_ws : dw + o0 * K;
        int st = fr_gemm16(c->ctx, 1, 0, r, K, N, dyp + o0, O, xp, K, update ? 0.0f : beta, g, K,
                           c->gemm_ws, c->gemm_ws_len);
        if (st) return st;
        if (update) sgd_tile(dw + o0 * K, g, r * K, c->node->attr.lr, c->node->attr.wd);
    }
    return FR_OK;
}

size_t fr_k_linear_gemm16_ws(int64_t N, int64_t O, int64_t K, int backward, int threads, int ab32) {
    size_t most = 0;
    if (!backward) {                         /* with a bias or not, y f32 or bf16 (fr_k_linear) */
        static const float some_bias = 0.0f; /* any non-NULL bias: only its presence counts */
        for (int k = 0; k < 4; k++) {
            fr_gemm16_out e = {k & 1 ? &some_bias : NULL, k >> 1 && !ab32, ab32};
            size_t a = fr_gemm16_epi_ws(0, 1, N, O, K, K, K, 0.0f, O, &e);
            if (a > most) most = a;
        }
        return most;
    }
    const fr_gemm16_out e = {NULL, 0, ab32}, e16 = {NULL, !ab32, ab32}; /* dx f32, bf16 */
    for (int beta = 0; beta < 2; beta++) {
        size_t dx = fr_gemm16_epi_ws(0, 0, N, K, O, O, K, (float)beta, K, &e),
               dx16 = fr_gemm16_epi_ws(0, 0, N, K, O, O, K, (float)beta, K, &e16);
        if (dx > most) most = dx;
        if (dx16 > most) most = dx16;
        if (ab32) continue; /* an f32 weight gradient is OpenBLAS's (fr_k_linear_bwd) */
        int64_t rows = upd_tile_rows(O, K, N, threads), last = O % rows ? O % rows : rows;
        size_t full = fr_gemm16_epi_ws(1, 0, rows, K, N, O, K, (float)beta, K, &e),
               tail = fr_gemm16_epi_ws(1, 0, last, K, N, O, K, (float)beta, K, &e);
        if (full > most) most = full;
        if (tail > most) most = tail;
    }
    return most;
}

#define COL_SPAN 1024 /* the bias gradient's widest span of columns, summed a row at a time */

/* s[j] += dy[n, o0 + j] for n = 0 .. N-1 in order, j < m <= COL_SPAN: the
 * bias gradient's sums of one span of columns, dy f32 (dyp) or bf16 (dyh,
 * widened exactly as it is added), in double; cloned for AVX-512 and AVX2,
 * the same sums. The spans are fr_col_span's, so the rows stream through
 * the cache. */
FR_V3_CLONES static void col_sums(const float *dyp, const uint16_t *dyh, int64_t N, int64_t O,
                                  int64_t o0, int64_t m, double *restrict s) {
    int64_t n = 0;
    if (dyh) /* four rows a pass over s, each added in turn: the same sums, s loaded once */
        for (; n + 4 <= N; n += 4) {
            const uint16_t *r0 = dyh + n * O + o0, *r1 = r0 + O, *r2 = r1 + O, *r3 = r2 + O;
#pragma omp simd
            for (int64_t j = 0; j < m; j++)
                s[j] =
                    (((s[j] + bf16_at(r0, j)) + bf16_at(r1, j)) + bf16_at(r2, j)) + bf16_at(r3, j);
        }
    for (; n < N; n++) {
        if (dyh) {
            const uint16_t *row = dyh + n * O + o0;
#pragma omp simd
            for (int64_t j = 0; j < m; j++) s[j] += bf16_at(row, j);
        } else {
            const float *row = dyp + n * O + o0;
#pragma omp simd
            for (int64_t j = 0; j < m; j++) s[j] += row[j];
        }
    }
}

/* db (+)= sum_n dy[n, :], or the bias's SGD step with it (update bit 2),
 * for fr_k_linear_bwd: columns in spans, one thread owning a span and
 * summing its rows in order (double accumulators), so the bits do not
 * depend on scheduling. */
static void bias_grad(const fr_kernel_call *c, const float *dyp, const uint16_t *dyh, float *db,
                      int64_t N, int64_t O) {
    int acc = acc_bit(c, 2), upd = (c->node->update & 4u) != 0;
    const float lr = c->node->attr.lr, wd = c->node->attr.wd;
    const int64_t span = fr_col_span(O, N * O >= LIN_PAR_MIN ? omp_get_max_threads() : 1, COL_SPAN);
    const int64_t nblk = (O + span - 1) / span;
#pragma omp parallel for schedule(static) if (N * O >= LIN_PAR_MIN)
    for (int64_t bi = 0; bi < nblk; bi++) {
        double s[COL_SPAN] = {0};
        int64_t o0 = bi * span, m = O - o0 < span ? O - o0 : span;
        col_sums(dyp, dyh, N, O, o0, m, s);
        if (upd) {
            for (int64_t j = 0; j < m; j++) {
                float g = (float)s[j], bj = db[o0 + j];
                if (wd != 0.0f) g = g + wd * bj;
                db[o0 + j] = bj + (-lr) * g;
            }
        } else {
            for (int64_t j = 0; j < m; j++) db[o0 + j] = (float)(acc ? db[o0 + j] + s[j] : s[j]);
        }
    }
}

// dy is (N,O), x is (N,K), W is (O,K) (N = numel(x) / K rows, as the forward)
// dx (N,K) = s dy W;  dW (O,K) = s dy^T x;  db (O) = sum_n dy[n,:]  (s: lin_scale)
// each added into its output when its accumulate bit (0, 1, 2) is set.
// dx may be bf16 (its f32 sums rounded by the GEMM's epilogue, as the
// forward's y): on bf16 operands, set, not added into.
// With the node's update bit 1 (2) the output is the weight (bias) itself and
// takes the plain SGD step with its gradient instead, element by element in
// the order of fr_k_sgd: p = p + (-lr)(g + wd p), lr and wd the node's attr.
// The weight's gradient is formed a tile of rows at a time in grad_ws (a GEMM's epilogue would add it to W in
// pieces, one per block of the batch, and lose what each piece rounds away).
// db comes first, while dy is still in the cache the op that made it left it
// in (it reads nothing the GEMMs write), then dx, from the weights before the
// step, then dW.
int fr_k_linear_bwd(fr_kernel_call *c) {
    const fr_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2];
    void *dx = c->out[0].data;
    float *dw = fr_f32(&c->out[1]), *db = fr_f32(&c->out[2]);
    fr_linear_dims d;
    int st = fr_kcheck_linear_bwd(c, &d);
    if (st) return st;
    const int dx16 = dx && c->out[0].dtype != FR_F32;
    const int64_t K = d.K, O = d.O, N = d.N;
    const fr_tensor *ops[3] = {dy, x, w};
    int h = operands16(c, "linear_bwd", ops, 3);
    if (h < 0) return FR_ERR_ARG;
    const float s = lin_scale(c);
    if (h && s != 1.0f)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "linear_bwd: a scaled GEMM (scale %g) takes f32 operands", (double)s);
    const float *dyp = fr_f32(dy);
    const uint16_t *dyh = h ? (const uint16_t *)dy->data : NULL;
    const int d32 = !h && s == 1.0f && fr_gemm32_onednn_for(N, O, K); /* f32 on oneDNN */
    if (dx16 && (!h || c->out[0].dtype != FR_BF16 || acc_bit(c, 0)))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "linear_bwd: a 16-bit dx is a bf16 GEMM's (bf16 operands), never added "
                       "into");
    if (db && O > 0) bias_grad(c, dyp, dyh, db, N, O);
    if (dx && N * K > 0) {
        if (O == 0) {
            if (!acc_bit(c, 0)) memset(dx, 0, (size_t)(N * K) * (dx16 ? 2 : sizeof(float)));
        } else { /* oneDNN's matmul where it runs the operands, else (or declining: no
                  * scratch planned) OpenBLAS */
            st = FR_GEMM16_DECLINE;
            if (h || d32) {
                const fr_gemm16_out e = {NULL, dx16, d32};
                st = fr_gemm16_epi(c->ctx, 0, 0, N, K, O, dy->data, O, w->data, K,
                                   acc_bit(c, 0) ? 1.0f : 0.0f, dx, K, &e, c->gemm_ws,
                                   c->gemm_ws_len);
                if (st && st != FR_GEMM16_DECLINE) return st;
            }
            if (st == FR_GEMM16_DECLINE && dx16)
                return fr_fail(c->ctx, FR_ERR_ARG,
                               "linear_bwd: a bf16 dx needs the bf16 GEMM (its scratch: %zu "
                               "bytes given)",
                               c->gemm_ws_len);
            if (st == FR_GEMM16_DECLINE)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)K, (int)O, s,
                            dyp, (int)O, fr_f32(w), (int)K, acc_bit(c, 0) ? 1.0f : 0.0f, dx,
                            (int)K);
        }
    }
    if (dw && O * K > 0) {
        int update = (c->node->update & 2u) != 0;
        float beta = acc_bit(c, 1) ? 1.0f : 0.0f;
        if (N > 0) {
            /* f32: OpenBLAS's one-thread tiles even where oneDNN runs x W^T
             * and dy W (a oneDNN call per tile costs tens of microseconds:
             * at batch 32 the seed MLP's 125 tiles a step ran 3x slower) */
            st = h ? weight_grad16(c, dyh, x->data, dw, N, O, K, update, beta)
                   : weight_grad(c, dyp, fr_f32(x), dw, N, O, K, update, beta, s);
            if (st) return st;
        } else if (!update && !acc_bit(c, 1)) {
            memset(dw, 0, (size_t)(O * K) * sizeof(float));
        }
    }
    return FR_OK;
}
