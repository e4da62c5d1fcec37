/* rmsnorm.c — root-mean-square normalisation (the Llama family's norm, as
 * Hugging Face's LlamaRMSNorm in float32), forward and backward. Each row's
 * sums run in double in a fixed order, a row per thread (dw: a block of
 * columns per thread, the rows in order), so the results are the same bits
 * for any thread count. A missing weight means w = 1. */
#include <math.h>
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define RMS_PAR_MIN 16384 /* values below which one thread does all the rows */
#define RMS_BLK 64        /* dw's columns a thread owns */

/* Sum of p[i]^2 in double, eight chains in a fixed order (as sum_f64). */
static double sumsq_f64(const float *p, int64_t n) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += (double)p[i + j] * p[i + j];
    for (; i < n; i++) a[0] += (double)p[i] * p[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// x is (N, C) or (B, T, C), w (C), y x's shape, rstd (N) or (B, T):
// rstd[n] = 1/sqrt(mean_c x[n,c]^2 + eps), y[n,c] = w[c] (x[n,c] rstd[n])
int fr_k_rmsnorm(fr_kernel_call *c) {
    int64_t N, C;
    int st = fr_kcheck_rmsnorm(c, "rmsnorm", &c->in[0], &c->in[1], &c->out[1], &N, &C);
    if (st) return st;
    if (c->out[0].dtype != FR_F32) return fr_fail(c->ctx, FR_ERR_ARG, "rmsnorm: y must be f32");
    if (N == 0 || C == 0) return FR_OK;
    const float *x = fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]);
    float *y = fr_f32(&c->out[0]), *srstd = fr_f32(&c->out[1]);
    const double eps = c->node->attr.eps;
#pragma omp parallel for schedule(static) if (N * C >= RMS_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xp = x + n * C;
        float *yp = y + n * C;
        const double rstd = 1.0 / sqrt(sumsq_f64(xp, C) / (double)C + eps);
        if (srstd) srstd[n] = (float)rstd;
        const float r = (float)rstd;
        if (w) {
#pragma omp simd
            for (int64_t d = 0; d < C; d++) yp[d] = w[d] * (xp[d] * r);
        } else {
#pragma omp simd
            for (int64_t d = 0; d < C; d++) yp[d] = xp[d] * r;
        }
    }
    return FR_OK;
}

// dy, x are (N, C) or (B, T, C), w (C), rstd (N): xhat = x rstd, g = dy w
// dx[n,c] = rstd (g - xhat mean_c(g xhat));  dw[c] = sum_n dy xhat
// (d rstd / d x_k = -rstd^3 x_k / C, so the mean-of-g term of LayerNorm's is absent)
int fr_k_rmsnorm_bwd(fr_kernel_call *c) {
    int64_t N, C;
    int st = fr_kcheck_rmsnorm_bwd(c, &N, &C);
    if (st) return st;
    const float *dy = fr_f32(&c->in[0]), *x = fr_f32(&c->in[1]), *w = fr_f32(&c->in[2]);
    const float *srstd = fr_f32(&c->in[3]);
    float *dx = fr_f32(&c->out[0]), *dw = fr_f32(&c->out[1]);
    if (N == 0 || C == 0) return FR_OK;
    if (!srstd) return fr_fail(c->ctx, FR_ERR_ARG, "rmsnorm_bwd: the saved rstd is missing");
    const int acc_x = acc_bit(c, 0), acc_w = acc_bit(c, 1);
    if (dx) {
#pragma omp parallel for schedule(static) if (N * C >= RMS_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const float *xp = x + n * C, *dyp = dy + n * C;
            float *dxp = dx + n * C;
            const float r = srstd[n];
            double sgx = 0.0; /* sum g xhat */
            for (int64_t d = 0; d < C; d++) {
                const double g = w ? (double)dyp[d] * w[d] : dyp[d];
                sgx += g * (xp[d] * r);
            }
            const float mgx = (float)(sgx / (double)C);
            for (int64_t d = 0; d < C; d++) {
                const float g = w ? dyp[d] * w[d] : dyp[d];
                const float v = r * (g - (xp[d] * r) * mgx);
                dxp[d] = acc_x ? dxp[d] + v : v;
            }
        }
    }
    if (dw) {
        const int64_t nblk = (C + RMS_BLK - 1) / RMS_BLK;
#pragma omp parallel for schedule(static) if (N * C >= RMS_PAR_MIN)
        for (int64_t bi = 0; bi < nblk; bi++) {
            double s[RMS_BLK] = {0};
            const int64_t d0 = bi * RMS_BLK, bw = C - d0 < RMS_BLK ? C - d0 : RMS_BLK;
            for (int64_t n = 0; n < N; n++) {
                const float *xp = x + n * C + d0, *dyp = dy + n * C + d0;
                const float r = srstd[n];
                for (int64_t j = 0; j < bw; j++) s[j] += (double)dyp[j] * (xp[j] * r);
            }
            for (int64_t j = 0; j < bw; j++) dw[d0 + j] = (float)(acc_w ? dw[d0 + j] + s[j] : s[j]);
        }
    }
    return FR_OK;
}
