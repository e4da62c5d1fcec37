/* loss.c — the losses with mean reduction (PyTorch's defaults): softmax
 * cross-entropy on integer labels and mean squared error, forward and
 * backward. Labels are checked before anything is written; a bad one is an
 * FR_ERR_ARG naming the sample. Sums are in double over fixed blocks added in
 * block order, so the loss is the same bits at any thread count. */
#include <math.h>
#include "backend/cpu/ce_row.h"
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define LOSS_BLOCKS 64 /* fixed partition of a reduction, independent of threads */
#define LOSS_PAR_MIN 16384

/* logits (..., C) of rank 2..4 are N = numel / C rows; labels one per row,
 * each in [0, C) (the shapes and messages: kcheck.h) */
static int ce_check(fr_kernel_call *c, const char *op, int64_t *N, int64_t *C) {
    int st = fr_kcheck_ce(c, op, N, C);
    if (st) return st;
    const int32_t *y = (const int32_t *)c->in[1].data;
    for (int64_t n = 0; n < *N; n++)
        if (y[n] < 0 || y[n] >= *C) return fr_kcheck_bad_label(c, op, n, y[n], *C);
    return FR_OK;
}

#define CE_SPAN 2048 /* a row's dlogits made in f32 this many at a time, then rounded */

// logits z is (N,C) or (B,T,C) (N = B T rows), labels y is (N) or (B,T) i32, loss is (1)
// loss = (1/N) sum_n (logsumexp(z[n,:]) - z[n, y[n]])
int fr_k_cross_entropy(fr_kernel_call *c) {
    int64_t N, C;
    int st = ce_check(c, "cross_entropy", &N, &C);
    if (st) return st;
    const float *z = fr_f32(&c->in[0]);
    const int32_t *y = (const int32_t *)c->in[1].data;
    float *loss = fr_f32(&c->out[0]);
    if (N == 0 || C == 0) {
        loss[0] = 0.0f;
        return FR_OK;
    }
    double part[LOSS_BLOCKS];
#pragma omp parallel for schedule(static) if (N * C >= LOSS_PAR_MIN)
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        double s = 0.0;
        float m;
        for (int64_t n = N * b / LOSS_BLOCKS; n < N * (b + 1) / LOSS_BLOCKS; n++) {
            const double shift = fr_ce_row_lse(z + n * C, C, &m);
            s += ((double)m + shift) - (double)z[n * C + y[n]];
        }
        part[b] = s;
    }
    double s = 0.0;
    for (int b = 0; b < LOSS_BLOCKS; b++) s += part[b];
    loss[0] = (float)(s / (double)N);
    return FR_OK;
}

// logits z is (N,C) or (B,T,C) (N = B T rows), labels y is (N) or (B,T), dz is z's shape
// dz[n,j] = scale (softmax(z[n,:])_j - [j == y[n]]) / N
int fr_k_cross_entropy_bwd(fr_kernel_call *c) {
    int64_t N, C;
    int st = ce_check(c, "cross_entropy_bwd", &N, &C);
    if (st) return st;
    if ((st = fr_kcheck_ce_dlogits(c, N, C))) return st;
    const float *z = fr_f32(&c->in[0]);
    const int32_t *y = (const int32_t *)c->in[1].data;
    float *dz = fr_f32(&c->out[0]);
    if (!dz || N == 0 || C == 0) return FR_OK;
    const float k = (float)((double)c->node->attr.scale / (double)N);
    const int acc = acc_bit(c, 0);
    if (c->out[0].dtype != FR_F32) { /* 16-bit dlogits (for a bf16 GEMM): spans rounded */
        if (acc)
            return fr_fail(c->ctx, FR_ERR_ARG,
                           "cross_entropy_bwd: 16-bit dlogits cannot be added into");
#pragma omp parallel for schedule(static) if (N * C >= LOSS_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            float m, buf[CE_SPAN];
            const float shift = (float)fr_ce_row_lse(z + n * C, C, &m);
            for (int64_t c0 = 0; c0 < C; c0 += CE_SPAN) {
                int64_t len = C - c0 < CE_SPAN ? C - c0 : CE_SPAN;
                fr_ce_row_dlogits(z + n * C + c0, buf, len, m, shift, k, y[n] - c0, 0);
                out_store(&c->out[0], n * C + c0, buf, len);
            }
        }
        return FR_OK;
    }
#pragma omp parallel for schedule(static) if (N * C >= LOSS_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        float m;
        const float shift = (float)fr_ce_row_lse(z + n * C, C, &m);
        fr_ce_row_dlogits(z + n * C, dz + n * C, C, m, shift, k, y[n], acc);
    }
    return FR_OK;
}

// z is (rows,C), y is (rows) i32: the rows whose argmax is their label
int64_t fr_k_argmax_hits(const float *z, const int32_t *y, int64_t rows, int64_t C) {
    int64_t hits = 0;
    if (C <= 0) return 0;
#pragma omp parallel for schedule(static) reduction(+ : hits) if (rows * C >= LOSS_PAR_MIN)
    for (int64_t n = 0; n < rows; n++) hits += fr_ce_row_argmax(z + n * C, C) == y[n];
    return hits;
}

// pred, target are (N,D); loss is (1) = (1/(N D)) sum (pred - target)^2
int fr_k_mse(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_mse(c, "mse", &n);
    if (st) return st;
    const float *p = fr_f32(&c->in[0]), *t = fr_f32(&c->in[1]);
    float *loss = fr_f32(&c->out[0]);
    if (n == 0) {
        loss[0] = 0.0f;
        return FR_OK;
    }
    double part[LOSS_BLOCKS];
#pragma omp parallel for schedule(static) if (n >= LOSS_PAR_MIN)
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        double s = 0.0;
        for (int64_t i = n * b / LOSS_BLOCKS; i < n * (b + 1) / LOSS_BLOCKS; i++) {
            double d = (double)p[i] - t[i];
            s += d * d;
        }
        part[b] = s;
    }
    double s = 0.0;
    for (int b = 0; b < LOSS_BLOCKS; b++) s += part[b];
    loss[0] = (float)(s / (double)n);
    return FR_OK;
}

// pred, target, dpred are (N,D); dpred = scale 2 (pred - target) / (N D)
int fr_k_mse_bwd(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_mse(c, "mse_bwd", &n);
    if (st) return st;
    const float *p = fr_f32(&c->in[0]), *t = fr_f32(&c->in[1]);
    float *dp = fr_f32(&c->out[0]);
    if (!dp || n == 0) return FR_OK;
    const float k = (float)(2.0 * (double)c->node->attr.scale / (double)n);
    const int acc = acc_bit(c, 0);
#pragma omp parallel for schedule(static) if (n >= LOSS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = k * (p[i] - t[i]);
        dp[i] = acc ? dp[i] + g : g;
    }
    return FR_OK;
}
