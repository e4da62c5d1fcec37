/* test_gemm16.c — the 16-bit GEMMs (backend/cpu/gemm16.c, oneDNN's bf16
 * matmul) and the linear layer on bf16 operands, against float64 sums of the
 * same bf16 values: every transpose, sizes that fill no block (1, 7, 33,
 * 130), leading dimensions wider than the rows, beta 0 and 1. A product of
 * two bf16 values is exact in f32, so the only error is the f32 sums':
 * at most K u sum |a b| (u = 2^-24), checked at 2 K u sum |a b|. Also: the
 * same call twice gives the same bits; the linear kernels' dx, dW, db and
 * bias; dW accumulated onto the dW already there, against dW + the float64
 * sum (bounded by the terms' magnitudes, as every sum here, never by |dW|);
 * the SGD step inside backward gives the kept gradient's step bit for bit;
 * operands of mixed formats and too little scratch are refused.
 * Issue 23: oneDNN's f32 matmul (gemm16_out.ab32, which the linear layers'
 * f32 x W^T and dy W use where fr_gemm32_onednn()), with and without a bias,
 * beta 0 and 1, against float64 sums of the same f32 values (each product
 * rounded too: checked at 2 (K + 2) u sum |a b|, + |bias|), run before the
 * bf16 part on any CPU with oneDNN; and the f32 linear layer in whichever
 * path this process takes, forward and dx, the same way.
 * The bf16 part is skipped (77) where the CPU has no native bf16 GEMM. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

static fr_ctx *g_ctx;
static uint64_t g_seed = 7;

/* n bf16 values uniform in [-1, 1) (bits in h, widened in w) */
static void rand16(int64_t n, uint16_t **h, double **w) {
    *h = malloc((size_t)(n ? n : 1) * 2);
    *w = malloc((size_t)(n ? n : 1) * sizeof(double));
    fr_rng r = fr_rng_make(g_seed++, 3);
    for (int64_t i = 0; i < n; i++) {
        (*h)[i] = fr_f32_to_bf16(-1.0f + 2.0f * fr_rng_next_uniform(&r));
        (*w)[i] = fr_bf16_to_f32((*h)[i]);
    }
}

/* op(A)[m,k] and op(B)[k,n] of gemm16.h's layouts */
static double at_a(const double *A, int ta, int64_t lda, int64_t m, int64_t k) {
    return ta ? A[k * lda + m] : A[m * lda + k];
}
static double at_b(const double *B, int tb, int64_t ldb, int64_t k, int64_t n) {
    return tb ? B[n * ldb + k] : B[k * ldb + n];
}

static void check_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, int pad, float beta) {
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t arows = ta ? K : M, brows = tb ? N : K;
    uint16_t *A, *B;
    double *Aw, *Bw;
    rand16(arows * lda, &A, &Aw);
    rand16(brows * ldb, &B, &Bw);
    float *C = malloc((size_t)(M * ldc) * sizeof(float)), *C2 = malloc((size_t)(M * ldc) * 4);
    float *C0 = malloc((size_t)(M * ldc) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 4);
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = fr_rng_next_uniform(&r);
    memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
    memcpy(C2, C0, (size_t)(M * ldc) * sizeof(float));
    size_t wsb = fr_gemm16_ws(ta, tb, M, N, K, lda, ldb, beta, ldc);
    void *ws = malloc(wsb ? wsb : 1);
    int st = fr_gemm16(g_ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ws, wsb);
    CHECK(st == FR_OK, "ta %d tb %d %lldx%lldx%lld: status %d", ta, tb, (long long)M, (long long)N,
          (long long)K, st);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = beta != 0.0f ? (double)C0[m * ldc + n] : 0.0, mag = fabs(s);
            for (int64_t k = 0; k < K; k++) {
                double p = at_a(Aw, ta, lda, m, k) * at_b(Bw, tb, ldb, k, n);
                s += p;
                mag += fabs(p);
            }
            double err = fabs((double)C[m * ldc + n] - s),
                   tol = 2.0 * (double)(K + 1) * 0x1p-24 * mag;
            if (err > tol + 1e-30) bad++;
            if (mag > 0 && err / mag > worst) worst = err / mag;
        }
    for (int64_t m = 0; m < M; m++) /* the padding between rows is not written */
        for (int64_t n = N; n < ldc; n++) bad += C[m * ldc + n] != C0[m * ldc + n];
    CHECK(bad == 0, "ta %d tb %d %lldx%lldx%lld beta %g: %lld values off (worst %.3g of sum|ab|)",
          ta, tb, (long long)M, (long long)N, (long long)K, beta, (long long)bad, worst);
    fr_gemm16(g_ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C2, ldc, ws, wsb);
    CHECK(memcmp(C, C2, (size_t)(M * ldc) * sizeof(float)) == 0,
          "ta %d tb %d %lldx%lldx%lld: two calls differ", ta, tb, (long long)M, (long long)N,
          (long long)K);
    if (wsb > 0) {
        st = fr_gemm16(g_ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C2, ldc, ws, wsb - 1);
        CHECK(st == FR_ERR_ARG, "a byte less scratch than asked: status %d", st);
    }
    free(A), free(B), free(Aw), free(Bw), free(C), free(C2), free(C0), free(ws);
}

static fr_tensor t16(uint16_t *p, fr_shape s) {
    return (fr_tensor){.dtype = FR_BF16, .shape = s, .data = p};
}
static fr_tensor t32(float *p, fr_shape s) {
    return (fr_tensor){.dtype = FR_F32, .shape = s, .data = p};
}

/* LINEAR and LINEAR_BWD on bf16 x (B,T,K), W (O,K), dy: y, dx, dW, db
 * against float64; the step inside backward against the kept gradient's. */
static void check_linear(int64_t B, int64_t T, int64_t K, int64_t O) {
    int64_t N = B * T;
    uint16_t *x, *w, *dy;
    double *xw, *ww, *dyw;
    rand16(N * K, &x, &xw);
    rand16(O * K, &w, &ww);
    rand16(N * O, &dy, &dyw);
    float *b = malloc((size_t)O * 4), *y = malloc((size_t)(N * O) * 4);
    for (int64_t o = 0; o < O; o++) b[o] = 0.25f * (float)(o % 5) - 0.5f;
    fr_shape xs = fr_shape3(B, T, K), ws = fr_shape2(O, K), ys = fr_shape3(B, T, O);
    size_t fwb = fr_k_linear_gemm16_ws(N, O, K, 0, omp_get_max_threads(), 0),
           bwb = fr_k_linear_gemm16_ws(N, O, K, 1, omp_get_max_threads(), 0);
    void *scratch = malloc((fwb > bwb ? fwb : bwb) + 1);
    fr_node node = {.op = FR_OP_LINEAR, .fwd = -1};
    fr_kernel_call c = {.ctx = g_ctx, .node = &node, .gemm_ws = scratch, .gemm_ws_len = fwb};
    c.in[0] = t16(x, xs), c.in[1] = t16(w, ws), c.in[2] = t32(b, fr_shape1(O));
    c.out[0] = t32(y, ys);
    int st = fr_k_linear(&c);
    CHECK(st == FR_OK, "linear %lldx%lldx%lld: status %d", (long long)N, (long long)O, (long long)K,
          st);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = b[o], mag = fabs(b[o]);
            for (int64_t k = 0; k < K; k++)
                s += xw[n * K + k] * ww[o * K + k], mag += fabs(xw[n * K + k] * ww[o * K + k]);
            bad += fabs(y[n * O + o] - s) > 2.0 * (double)(K + 1) * 0x1p-24 * mag + 1e-30;
        }
    CHECK(bad == 0, "linear %lldx%lldx%lld: %lld outputs off", (long long)N, (long long)O,
          (long long)K, (long long)bad);
    /* one operand in f32: refused */
    float *wf = malloc((size_t)(O * K) * 4);
    for (int64_t i = 0; i < O * K; i++) wf[i] = (float)ww[i];
    c.in[1] = t32(wf, ws);
    CHECK(fr_k_linear(&c) == FR_ERR_ARG, "bf16 x with an f32 W is refused");

    /* backward */
    float *dx = malloc((size_t)(N * K) * 4), *dw = malloc((size_t)(O * K) * 4),
          *db = malloc((size_t)O * 4);
    fr_node bn = {.op = FR_OP_LINEAR_BWD, .fwd = -1};
    fr_kernel_call d = {.ctx = g_ctx, .node = &bn, .gemm_ws = scratch, .gemm_ws_len = bwb};
    d.in[0] = t16(dy, ys), d.in[1] = t16(x, xs), d.in[2] = t16(w, ws);
    d.out[0] = t32(dx, xs), d.out[1] = t32(dw, ws), d.out[2] = t32(db, fr_shape1(O));
    st = fr_k_linear_bwd(&d);
    CHECK(st == FR_OK, "linear_bwd: status %d", st);
    int64_t bx = 0, bw = 0, bb = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0, mag = 0;
            for (int64_t o = 0; o < O; o++)
                s += dyw[n * O + o] * ww[o * K + k], mag += fabs(dyw[n * O + o] * ww[o * K + k]);
            bx += fabs(dx[n * K + k] - s) > 2.0 * (double)O * 0x1p-24 * mag + 1e-30;
        }
    /* dx in bf16 (the dy of a tanh GELU's backward, plan/precision.c): the
     * GEMM's f32 sums rounded once more, so within the f32 bound above plus
     * half a bf16 ulp (8 significant bits: at most 2^-8 |s|); never added
     * into, and only from bf16 operands */
    uint16_t *dx16 = malloc((size_t)(N * K) * 2);
    d.out[0] = (fr_tensor){.dtype = FR_BF16, .shape = xs, .data = dx16};
    st = fr_k_linear_bwd(&d);
    CHECK(st == FR_OK, "linear_bwd into a bf16 dx: %s", fr_last_error(g_ctx));
    int64_t b16 = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0, mag = 0;
            for (int64_t o = 0; o < O; o++)
                s += dyw[n * O + o] * ww[o * K + k], mag += fabs(dyw[n * O + o] * ww[o * K + k]);
            b16 += fabs((double)fr_bf16_to_f32(dx16[n * K + k]) - s) >
                   2.0 * (double)O * 0x1p-24 * mag + 0x1p-8 * fabs(s) + 1e-30;
        }
    CHECK(b16 == 0, "linear_bwd %lldx%lldx%lld: %lld of the bf16 dx off", (long long)N,
          (long long)O, (long long)K, (long long)b16);
    d.accumulate = 1u;
    CHECK(fr_k_linear_bwd(&d) == FR_ERR_ARG, "adding into a bf16 dx is refused");
    d.accumulate = 0;
    float *dyf = malloc((size_t)(N * O) * 4), *xf = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < N * O; i++) dyf[i] = (float)dyw[i];
    for (int64_t i = 0; i < N * K; i++) xf[i] = (float)xw[i];
    d.in[0] = t32(dyf, ys), d.in[1] = t32(xf, xs), d.in[2] = t32(wf, ws);
    CHECK(fr_k_linear_bwd(&d) == FR_ERR_ARG, "a bf16 dx from f32 operands is refused");
    d.in[0] = t16(dy, ys), d.in[1] = t16(x, xs), d.in[2] = t16(w, ws);
    d.out[0] = t32(dx, xs);
    free(dx16), free(dyf), free(xf);
    /* dW's exact sums and their magnitudes sum_n |dy x|, kept for the accumulation below */
    double *dws = malloc((size_t)(O * K) * sizeof(double)),
           *dwm = malloc((size_t)(O * K) * sizeof(double));
    for (int64_t o = 0; o < O; o++) {
        double sb = 0, mb = 0;
        for (int64_t n = 0; n < N; n++) sb += dyw[n * O + o], mb += fabs(dyw[n * O + o]);
        /* summed in double (N 2^-53 sum|dy| at most), rounded once to f32 */
        bb += fabs(db[o] - sb) > 0x1p-24 * fabs(sb) + (double)N * 0x1p-53 * mb + 1e-30;
        for (int64_t k = 0; k < K; k++) {
            double s = 0, mag = 0;
            for (int64_t n = 0; n < N; n++)
                s += dyw[n * O + o] * xw[n * K + k], mag += fabs(dyw[n * O + o] * xw[n * K + k]);
            dws[o * K + k] = s, dwm[o * K + k] = mag;
            bw += fabs(dw[o * K + k] - s) > 2.0 * (double)N * 0x1p-24 * mag + 1e-30;
        }
    }
    CHECK(bx == 0 && bw == 0 && bb == 0, "linear_bwd %lldx%lldx%lld: dx %lld, dW %lld, db %lld off",
          (long long)N, (long long)O, (long long)K, (long long)bx, (long long)bw, (long long)bb);
    /* accumulate: dW += dy^T x onto the dW1 already there. The reference is
     * dW1 + s, s the float64 sum of the same bf16 products. The kernel's sum
     * (oneDNN's sum post-op) adds N + 1 terms, dW1 and the N exact products,
     * in an order of its choosing, so it is off by at most about
     * (N + 1) u (|dW1| + sum_n |dy x|): a bound on the terms' magnitudes, not
     * on |dW|, which cancellation makes small (AMX and AVX512_BF16 kernels
     * order the sums differently, and neither need give dW1's bits again).
     * Checked at twice that, as above. */
    float *dw1 = malloc((size_t)(O * K) * 4);
    memcpy(dw1, dw, (size_t)(O * K) * 4);
    d.accumulate = 2u;
    st = fr_k_linear_bwd(&d);
    int64_t ba = 0, worst = -1;
    double worst_err = 0, worst_tol = 0;
    for (int64_t i = 0; i < O * K; i++) {
        double want = (double)dw1[i] + dws[i], err = fabs((double)dw[i] - want),
               tol = 2.0 * (double)(N + 1) * 0x1p-24 * (fabs((double)dw1[i]) + dwm[i]) + 1e-30;
        if (err > tol) ba++;
        if (worst < 0 || err / tol > worst_err / worst_tol)
            worst = i, worst_err = err, worst_tol = tol;
    }
    CHECK(st == FR_OK && ba == 0,
          "accumulated dW %lldx%lldx%lld: status %d, %lld of %lld off; worst dW[%lld] = %.9g, "
          "want %.9g + %.9g, error %.3g, bound %.3g",
          (long long)N, (long long)O, (long long)K, st, (long long)ba, (long long)(O * K),
          (long long)worst, worst >= 0 ? dw[worst] : 0.0, worst >= 0 ? dw1[worst] : 0.0,
          worst >= 0 ? dws[worst] : 0.0, worst_err, worst_tol);
    printf("accumulated dW %lldx%lldx%lld: worst error %.3g, %.2g of its bound\n", (long long)N,
           (long long)O, (long long)K, worst_err, worst >= 0 ? worst_err / worst_tol : 0.0);
    free(dws), free(dwm);
    /* the step inside backward: W - lr (g + wd W) with g the kept gradient's bits */
    size_t tile = fr_k_linear_upd_ws(O, K, N, omp_get_max_threads());
    float *upd = malloc(tile * 4), *p = malloc((size_t)(O * K) * 4),
          *want = malloc((size_t)(O * K) * 4);
    const float lr = 0.125f, wd = 0.01f;
    for (int64_t i = 0; i < O * K; i++) {
        p[i] = (float)ww[i] * 0.5f;
        want[i] = p[i] + (-lr) * (dw1[i] + wd * p[i]);
    }
    d.accumulate = 0;
    bn.update = 2u, bn.attr.lr = lr, bn.attr.wd = wd, d.grad_ws = upd, d.grad_ws_len = tile;
    d.out[0].data = NULL, d.out[2].data = NULL, d.out[1] = t32(p, ws);
    st = fr_k_linear_bwd(&d);
    CHECK(st == FR_OK && memcmp(p, want, (size_t)(O * K) * 4) == 0,
          "the step inside backward differs from the kept gradient's step (status %d)", st);
    if (bwb > 0) { /* dx's GEMM and the tiles' together ask bwb bytes */
        d.out[0] = t32(dx, xs);
        d.gemm_ws_len = 0;
        CHECK(fr_k_linear_bwd(&d) == FR_ERR_ARG, "linear_bwd without its scratch is refused");
    }
    free(x), free(w), free(dy), free(xw), free(ww), free(dyw), free(b), free(y), free(wf);
    free(dx), free(dw), free(db), free(dw1), free(upd), free(p), free(want), free(scratch);
}

/* n f32 values uniform in [-1, 1) (as doubles in w too) */
static float *rand32(int64_t n, double **w) {
    float *p = malloc((size_t)(n ? n : 1) * 4);
    *w = malloc((size_t)(n ? n : 1) * sizeof(double));
    fr_rng r = fr_rng_make(g_seed++, 3);
    for (int64_t i = 0; i < n; i++) (*w)[i] = p[i] = -1.0f + 2.0f * fr_rng_next_uniform(&r);
    return p;
}

/* C = op(A) op(B) (+ bias) + beta C on oneDNN's f32 matmul; 0: no oneDNN */
static int check_gemm32(int ta, int tb, int64_t M, int64_t N, int64_t K, int pad, float beta,
                        int with_bias) {
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    double *Aw, *Bw, *bw;
    float *A = rand32((ta ? K : M) * lda, &Aw), *B = rand32((tb ? N : K) * ldb, &Bw);
    float *bias = rand32(N, &bw), *C = malloc((size_t)(M * ldc) * 4),
          *C0 = malloc((size_t)(M * ldc) * 4);
    fr_rng r = fr_rng_make(g_seed++, 4);
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = C[i] = fr_rng_next_uniform(&r);
    const fr_gemm16_out e = {with_bias ? bias : NULL, 0, 1};
    size_t wsb = fr_gemm16_epi_ws(ta, tb, M, N, K, lda, ldb, beta, ldc, &e);
    void *ws = malloc(wsb ? wsb : 1);
    int st = fr_gemm16_epi(g_ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, &e, ws, wsb);
    int ran = !(st && strstr(fr_last_error(g_ctx), "no oneDNN engine"));
    if (ran) {
        CHECK(st == FR_OK, "f32 ta %d tb %d %lldx%lldx%lld: %s", ta, tb, (long long)M, (long long)N,
              (long long)K, fr_last_error(g_ctx));
        int64_t bad = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = beta != 0.0f ? (double)C0[m * ldc + n] : 0.0, mag = fabs(s);
                if (with_bias) s += bw[n], mag += fabs(bw[n]);
                for (int64_t k = 0; k < K; k++) {
                    double p = at_a(Aw, ta, lda, m, k) * at_b(Bw, tb, ldb, k, n);
                    s += p, mag += fabs(p);
                }
                if (fabs((double)C[m * ldc + n] - s) >
                    2.0 * (double)(K + 2) * 0x1p-24 * mag + 1e-30)
                    bad++;
            }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = N; n < ldc; n++) bad += C[m * ldc + n] != C0[m * ldc + n];
        CHECK(bad == 0, "f32 ta %d tb %d %lldx%lldx%lld beta %g bias %d: %lld values off", ta, tb,
              (long long)M, (long long)N, (long long)K, beta, with_bias, (long long)bad);
    }
    free(A), free(B), free(bias), free(Aw), free(Bw), free(bw), free(C), free(C0), free(ws);
    return ran;
}

/* The f32 linear layer, on whichever path this process takes: y = x W^T + b
 * and dx = dy W against float64 sums. */
static void check_linear32(int64_t N, int64_t K, int64_t O) {
    double *xw, *ww, *bw, *dyw;
    float *x = rand32(N * K, &xw), *w = rand32(O * K, &ww), *b = rand32(O, &bw),
          *dy = rand32(N * O, &dyw);
    float *y = malloc((size_t)(N * O) * 4), *dx = malloc((size_t)(N * K) * 4);
    size_t wsb = fr_k_linear_gemm16_ws(N, O, K, 0, omp_get_max_threads(), 1),
           wsb2 = fr_k_linear_gemm16_ws(N, O, K, 1, omp_get_max_threads(), 1);
    if (wsb2 > wsb) wsb = wsb2;
    void *ws = malloc(wsb ? wsb : 1);
    fr_node node = {.op = FR_OP_LINEAR, .fwd = -1};
    fr_kernel_call c = {.ctx = g_ctx, .node = &node, .gemm_ws = ws, .gemm_ws_len = wsb};
    c.in[0] = t32(x, fr_shape2(N, K));
    c.in[1] = t32(w, fr_shape2(O, K));
    c.in[2] = t32(b, fr_shape1(O));
    c.out[0] = t32(y, fr_shape2(N, O));
    CHECK(fr_k_linear(&c) == FR_OK, "f32 linear: %s", fr_last_error(g_ctx));
    node.op = FR_OP_LINEAR_BWD;
    fr_kernel_call cb = {.ctx = g_ctx, .node = &node, .gemm_ws = ws, .gemm_ws_len = wsb};
    cb.in[0] = t32(dy, fr_shape2(N, O));
    cb.in[1] = t32(x, fr_shape2(N, K));
    cb.in[2] = t32(w, fr_shape2(O, K));
    cb.out[0] = t32(dx, fr_shape2(N, K));
    CHECK(fr_k_linear_bwd(&cb) == FR_OK, "f32 linear_bwd: %s", fr_last_error(g_ctx));
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t o = 0; o < O; o++) {
            double s = bw[o], mag = fabs(bw[o]);
            for (int64_t k = 0; k < K; k++)
                s += xw[n * K + k] * ww[o * K + k], mag += fabs(xw[n * K + k] * ww[o * K + k]);
            bad += fabs(y[n * O + o] - s) > 2.0 * (double)(K + 2) * 0x1p-24 * mag;
        }
        for (int64_t k = 0; k < K; k++) {
            double s = 0, mag = 0;
            for (int64_t o = 0; o < O; o++)
                s += dyw[n * O + o] * ww[o * K + k], mag += fabs(dyw[n * O + o] * ww[o * K + k]);
            bad += fabs(dx[n * K + k] - s) > 2.0 * (double)(O + 2) * 0x1p-24 * mag;
        }
    }
    CHECK(bad == 0, "f32 linear %lldx%lldx%lld (linear f32 on %s): %lld values off", (long long)N,
          (long long)K, (long long)O, fr_gemm32_onednn() ? "oneDNN" : "OpenBLAS", (long long)bad);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(xw), free(ww), free(bw), free(dyw),
        free(ws);
}

int main(void) {
    /* the linear layers' f32 GEMMs on oneDNN (opt-in; decided once per
     * process), so that check_linear32 runs that path */
    setenv("FRUGAL_GEMM", "onednn", 1);
    g_ctx = fr_ctx_new();
    int f32 = 1;
    for (int ta = 0; ta < 2 && f32; ta++)
        for (int tb = 0; tb < 2 && f32; tb++)
            for (int i = 0; i < 3 && f32; i++) {
                static const int64_t sz[] = {1, 33, 130};
                f32 = check_gemm32(ta, tb, sz[i], sz[(i + 1) % 3], sz[(i + 2) % 3], i % 2,
                                   i == 1 ? 1.0f : 0.0f, i != 0);
            }
    if (f32) check_gemm32(0, 1, 1024, 200, 300, 0, 0.0f, 1);
    else printf("skipped the f32 matmul: built without oneDNN\n");
    check_linear32(32, 100, 70);
    check_linear32(300, 130, 257);
    if (!fr_gemm16_native(FR_BF16)) {
        printf("skipped the bf16 part: no native bf16 GEMM here (oneDNN missing or no AVX-512 "
               "BF16)\n");
        int r = check_done();
        fr_ctx_free(g_ctx);
        return r;
    }
    static const int64_t sz[] = {1, 7, 33, 130};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    int64_t M = sz[i], N = sz[(i + j) % 4], K = sz[j];
                    check_gemm(ta, tb, M, N, K, (i + j) % 3, (i + j) % 2 ? 1.0f : 0.0f);
                }
    check_gemm(0, 1, 512, 384, 1152, 0, 0.0f); /* gpt-tiny's shapes, over several blocks */
    /* the scratch planned on 1 thread serves a run on 2 (fr_set_threads
     * after a step was compiled): the same bits as one planned on 2 */
    {
        const int64_t M = 512, N = 384, K = 1152;
        uint16_t *A, *B;
        double *Aw, *Bw;
        rand16(M * K, &A, &Aw);
        rand16(K * N, &B, &Bw);
        omp_set_num_threads(1);
        size_t w1 = fr_gemm16_ws(0, 0, M, N, K, K, N, 0.0f, N);
        omp_set_num_threads(2);
        size_t w2 = fr_gemm16_ws(0, 0, M, N, K, K, N, 0.0f, N);
        void *ws1 = malloc(w1 + 1), *ws2 = malloc(w2 + 1);
        float *C1 = calloc((size_t)(M * N), 4), *C2 = calloc((size_t)(M * N), 4);
        int s1 = fr_gemm16(g_ctx, 0, 0, M, N, K, A, K, B, N, 0.0f, C1, N, ws1, w1);
        int s2 = fr_gemm16(g_ctx, 0, 0, M, N, K, A, K, B, N, 0.0f, C2, N, ws2, w2);
        CHECK(s1 == FR_OK && s2 == FR_OK,
              "scratch planned on 1 thread (%zu B), run on 2: status %d (%s); planned on 2 (%zu "
              "B): %d",
              w1, s1, fr_last_error(g_ctx), w2, s2);
        CHECK(memcmp(C1, C2, (size_t)(M * N) * 4) == 0,
              "run on 2 threads: planned on 1 and on 2 differ");
        free(A), free(B), free(Aw), free(Bw), free(ws1), free(ws2), free(C1), free(C2);
        omp_set_num_threads(omp_get_num_procs());
    }
    check_gemm(1, 0, 288, 384, 2048, 0, 1.0f);
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        check_linear(2, 5, 7, 3);
        check_linear(4, 33, 64, 130);
        check_linear(2, 256, 96, 384);
    }
    fr_ctx_free(g_ctx);
    return check_done();
}
