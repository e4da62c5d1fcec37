/* linear_ce.c — a language model's head fused with its cross-entropy,
 * LINEAR_CE and LINEAR_CE_BWD (Liger's FusedLinearCrossEntropy, row chunks;
 * Cut Cross-Entropy's split: backward makes each chunk's logits again): the
 * N x V logits and their gradient never exist, one chunk of R x V logits
 * lives in the workspace at a time. The row arithmetic is the unfused
 * loss's (ce_row.h), so from the same logits the same row values; the loss
 * is summed over loss.c's fixed blocks of rows in row order whatever R, so
 * it is the bits of the unfused kernel on the same logits. The GEMMs are
 * OpenBLAS's (cblas_sgemm, threaded inside); row loops are OpenMP.
 *
 * Workspace (floats, planned by table.c's cpu_ws):
 *   forward  [N doubles: each row's lse - z[y] | R V: a chunk's logits]
 *   backward [V doubles: db's column sums | R V: a chunk's logits, then dz] */
#include <cblas.h>
#include <string.h>
#include "backend/cpu/ce_row.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define LOSS_BLOCKS 64 /* loss.c's fixed partition of the rows */
#define CE_PAR_MIN 16384

/* labels of the N rows in [0, V) (the message: kcheck.h) */
static int labels_ok(fr_kernel_call *c, const char *op, int64_t N, int64_t V) {
    const int32_t *y = (const int32_t *)c->in[3].data;
    for (int64_t n = 0; n < N; n++)
        if (y[n] < 0 || y[n] >= V) return fr_kcheck_linear_ce_label(c, op, n, y[n], V);
    return FR_OK;
}

/* z (r, V) = x[n0 : n0 + r] W^T + b: the chunk's logits, as fr_k_linear makes them */
static void chunk_logits(const float *x, const float *w, const float *b, float *z, int64_t n0,
                         int64_t r, int64_t C, int64_t V) {
    float beta = 0.0f;
    if (b) {
        for (int64_t i = 0; i < r; i++) memcpy(z + i * V, b, (size_t)V * sizeof(float));
        beta = 1.0f;
    }
    if (C == 0) {
        if (!b) memset(z, 0, (size_t)(r * V) * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)V, (int)C, 1.0f, x + n0 * C,
                (int)C, w, (int)C, beta, z, (int)V);
}

// x is (N,C) or (B,T,C) (N rows), W is (V,C), b is (V) or absent, y is (N) i32
// loss (1) = (1/N) sum_n (logsumexp(z[n,:]) - z[n, y[n]]), z = x W^T + b made R rows at a time;
// hits (1) i32 = the rows whose first argmax of z is y
int fr_k_linear_ce(fr_kernel_call *c) {
    fr_ce_dims d;
    int st = fr_kcheck_linear_ce(c, "linear_ce", 2, 2, 0, &d);
    if (st) return st;
    const int64_t N = d.N, C = d.C, V = d.V, R = d.R;
    if ((st = labels_ok(c, "linear_ce", N, V))) return st;
    float *loss = fr_f32(&c->out[0]);
    int32_t *hits = (int32_t *)c->out[1].data;
    if (hits) hits[0] = 0;
    if (N == 0 || V == 0) {
        loss[0] = 0.0f;
        return FR_OK;
    }
    const float *x = fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]), *b = fr_f32(&c->in[2]);
    const int32_t *y = (const int32_t *)c->in[3].data;
    double *term = (double *)(void *)c->out[2].data; /* N doubles, then the chunk */
    float *z = fr_f32(&c->out[2]) + 2 * N;
    int64_t h = 0;
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        chunk_logits(x, w, b, z, n0, r, C, V);
#pragma omp parallel for schedule(static) reduction(+ : h) if (r * V >= CE_PAR_MIN)
        for (int64_t i = 0; i < r; i++) {
            const float *zr = z + i * V;
            float m;
            const double shift = fr_ce_row_lse(zr, V, &m);
            term[n0 + i] = ((double)m + shift) - (double)zr[y[n0 + i]];
            h += fr_ce_row_argmax(zr, V) == y[n0 + i];
        }
    }
    /* loss.c's blocks, each summed in row order, added in block order */
    double s = 0.0;
    for (int bk = 0; bk < LOSS_BLOCKS; bk++) {
        double p = 0.0;
        for (int64_t n = N * bk / LOSS_BLOCKS; n < N * (bk + 1) / LOSS_BLOCKS; n++) p += term[n];
        s += p;
    }
    loss[0] = (float)(s / (double)N);
    if (hits) hits[0] = (int32_t)h;
    return FR_OK;
}

// x, W, b, y as the forward; k = scale / N (scale: attr.scale, the micro-batch share)
// per chunk of R rows: z = x_c W^T + b;  dz = k (softmax(z) - onehot(y)) (in place)
//   dx_c = dz W (overwritten, or added with accumulate bit 0)
//   dW  += dz^T x_c (the first chunk overwrites unless accumulate bit 1)
//   db  += sum_n dz[n,:] (in double across the chunks, rows in order; accumulate bit 2)
int fr_k_linear_ce_bwd(fr_kernel_call *c) {
    fr_ce_dims d;
    int st = fr_kcheck_linear_ce(c, "linear_ce_bwd", 4, 0, 2, &d);
    if (st) return st;
    const int64_t N = d.N, C = d.C, V = d.V, R = d.R;
    if ((st = labels_ok(c, "linear_ce_bwd", N, V))) return st;
    float *dx = fr_f32(&c->out[0]), *dw = fr_f32(&c->out[1]), *db = fr_f32(&c->out[2]);
    const int ax = acc_bit(c, 0), aw = acc_bit(c, 1), ab = acc_bit(c, 2);
    if (c->node->update)
        return fr_fail(c->ctx, FR_ERR_ARG, "linear_ce_bwd: no optimizer step inside this kernel");
    if (N == 0 || V == 0) { /* no rows (or no classes): zero gradients */
        if (dx && !ax) memset(dx, 0, (size_t)(N * C) * sizeof(float));
        if (dw && !aw) memset(dw, 0, (size_t)(V * C) * sizeof(float));
        if (db && !ab) memset(db, 0, (size_t)V * sizeof(float));
        return FR_OK;
    }
    const float *x = fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]), *b = fr_f32(&c->in[2]);
    const int32_t *y = (const int32_t *)c->in[3].data;
    double *dbs = (double *)(void *)c->out[4].data;
    float *z = fr_f32(&c->out[4]) + 2 * V;
    const float k = (float)((double)c->node->attr.scale / (double)N);
    if (db) memset(dbs, 0, (size_t)V * sizeof(double));
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        chunk_logits(x, w, b, z, n0, r, C, V);
#pragma omp parallel for schedule(static) if (r * V >= CE_PAR_MIN)
        for (int64_t i = 0; i < r; i++) {
            float m;
            const float shift = (float)fr_ce_row_lse(z + i * V, V, &m);
            fr_ce_row_dlogits(z + i * V, z + i * V, V, m, shift, k, y[n0 + i], 0);
        }
        if (dx && C > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)C, (int)V, 1.0f, z,
                        (int)V, w, (int)C, ax ? 1.0f : 0.0f, dx + n0 * C, (int)C);
        if (dw && C > 0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)V, (int)C, (int)r, 1.0f, z,
                        (int)V, x + n0 * C, (int)C, n0 == 0 && !aw ? 0.0f : 1.0f, dw, (int)C);
        if (db) {
#pragma omp parallel for schedule(static) if (r * V >= CE_PAR_MIN)
            for (int64_t j0 = 0; j0 < V; j0 += 64) {
                const int64_t m = V - j0 < 64 ? V - j0 : 64;
                for (int64_t i = 0; i < r; i++)
                    for (int64_t j = 0; j < m; j++) dbs[j0 + j] += z[i * V + j0 + j];
            }
        }
    }
    if (db)
        for (int64_t j = 0; j < V; j++) db[j] = (float)(ab ? db[j] + dbs[j] : dbs[j]);
    return FR_OK;
}
