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
 *   backward [V doubles: db's column sums | R V: a chunk's logits, then dz]
 *
 * With x in bf16 (the mixed-precision pass gives it where the CPU has a
 * native bf16 GEMM, precision.c) the GEMMs are oneDNN's bf16 ones with f32
 * sums (gemm16.h): W is rounded to bf16 a panel of vocabulary rows at a
 * time (as the pass rounds a linear layer's weight; never the whole V C
 * copy), and so is dz a panel of columns at a time for dx and dW. The
 * panels and oneDNN's scratch are the step's GEMM scratch (gemm_ws,
 * fr_k_linear_ce16_ws). The logits stay f32 in the workspace, so the row
 * arithmetic is the f32 path's. */
#include <cblas.h>
#include <string.h>
#include "backend/cpu/ce_row.h"
#include "backend/cpu/gemm16.h"
#include "core/half.h"
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

/* ---- bf16 GEMMs ------------------------------------------------------------ */

size_t fr_k_linear_ce16_ws(int64_t N, int64_t R, int64_t C, int64_t V, int bwd) {
    if (N < 1 || C < 1 || V < 1) return 0;
    if (R < 1 || R > N) R = N;
    int64_t lastP;
    const int64_t P = fr_gemm16_panel(V, C, &lastP);
    const int64_t rs[2] = {R, N % R ? N % R : R}, ps[2] = {P, lastP};
    static const float some_bias = 0.0f; /* only the bias's presence counts */
    size_t most = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++) { /* the logits (with a bias or not); dx, dW (beta k) */
                fr_gemm16_out e = {k ? &some_bias : NULL, 0, 0};
                size_t a[3] = {fr_gemm16_epi_ws(0, 1, rs[i], ps[j], C, C, C, 0.0f, V, &e), 0, 0};
                if (bwd) {
                    a[1] = fr_gemm16_ws(0, 0, rs[i], C, ps[j], P, C, (float)k, C);
                    a[2] = fr_gemm16_ws(1, 0, ps[j], C, rs[i], P, C, (float)k, C);
                }
                for (int t = 0; t < 3; t++)
                    if (a[t] > most) most = a[t];
            }
    size_t b = fr_gemm16_round((size_t)(P * C) * 2) + most;
    if (bwd) b += fr_gemm16_round((size_t)(R * P) * 2); /* a panel of dz in bf16 */
    return b;
}

typedef struct ce16 {
    uint16_t *wp, *dzp; /* a panel of W, of dz (backward), in bf16 */
    void *ws;           /* oneDNN's scratch */
    size_t ws_bytes;
    int64_t P; /* vocabulary rows a panel */
} ce16;

static int ce16_take(fr_kernel_call *c, const char *op, const fr_ce_dims *d, int bwd, ce16 *g) {
    int st = fr_kcheck_gemm_ws(c, op, fr_k_linear_ce16_ws(d->N, d->R, d->C, d->V, bwd));
    if (st) return st;
    g->P = fr_gemm16_panel(d->V, d->C, NULL);
    char *p = c->gemm_ws;
    g->wp = (uint16_t *)(void *)p;
    p += fr_gemm16_round((size_t)(g->P * d->C) * 2);
    g->dzp = bwd ? (uint16_t *)(void *)p : NULL;
    if (bwd) p += fr_gemm16_round((size_t)(d->R * g->P) * 2);
    g->ws = p;
    g->ws_bytes = c->gemm_ws_len - (size_t)(p - (char *)c->gemm_ws);
    return FR_OK;
}

/* z (r, V) = x16[n0 : n0 + r] W^T + b, W rounded to bf16 a panel at a time */
static int chunk_logits16(fr_kernel_call *c, const ce16 *g, const uint16_t *x, const float *w,
                          const float *b, float *z, int64_t n0, int64_t r, int64_t C, int64_t V) {
    int st = FR_OK;
    for (int64_t v0 = 0; v0 < V && !st; v0 += g->P) {
        const int64_t p = V - v0 < g->P ? V - v0 : g->P;
        fr_f32_to_bf16_n(w + v0 * C, g->wp, (size_t)(p * C));
        fr_gemm16_out e = {b ? b + v0 : NULL, 0, 0};
        st = fr_gemm16_epi(c->ctx, 0, 1, r, p, C, x + n0 * C, C, g->wp, C, 0.0f, z + v0, V, &e,
                           g->ws, g->ws_bytes);
    }
    return st;
}

/* dx_c (+)= dz W and dW (+)= dz^T x_c, panel by panel of V: W's rows and
 * dz's columns rounded to bf16 (beta: dx's, dW's for the first panel) */
static int chunk_grads16(fr_kernel_call *c, const ce16 *g, const uint16_t *xc, const float *w,
                         const float *z, float *dxc, float *dw, float bx, float bw, int64_t r,
                         int64_t C, int64_t V) {
    int st = FR_OK;
    for (int64_t v0 = 0; v0 < V && !st; v0 += g->P) {
        const int64_t p = V - v0 < g->P ? V - v0 : g->P;
#pragma omp parallel for schedule(static) if (r * p >= CE_PAR_MIN)
        for (int64_t i = 0; i < r; i++)
            fr_f32_to_bf16_n_seq(z + i * V + v0, g->dzp + i * g->P, (size_t)p);
        if (dxc) {
            fr_f32_to_bf16_n(w + v0 * C, g->wp, (size_t)(p * C));
            st = fr_gemm16(c->ctx, 0, 0, r, C, p, g->dzp, g->P, g->wp, C, v0 ? 1.0f : bx, dxc, C,
                           g->ws, g->ws_bytes);
        }
        if (!st && dw)
            st = fr_gemm16(c->ctx, 1, 0, p, C, r, g->dzp, g->P, xc, C, bw, dw + v0 * C, C, g->ws,
                           g->ws_bytes);
    }
    return st;
}

/* ---- the kernels -------------------------------------------------------------- */

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
    const int x16 = c->in[0].dtype == FR_BF16 && C > 0;
    const float *x = x16 ? NULL : fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]), *b = fr_f32(&c->in[2]);
    const int32_t *y = (const int32_t *)c->in[3].data;
    double *term = (double *)(void *)c->out[2].data; /* N doubles, then the chunk */
    float *z = fr_f32(&c->out[2]) + 2 * N;
    ce16 g;
    if (x16 && (st = ce16_take(c, "linear_ce", &d, 0, &g))) return st;
    int64_t h = 0;
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        if (x16 && (st = chunk_logits16(c, &g, c->in[0].data, w, b, z, n0, r, C, V))) return st;
        if (!x16) chunk_logits(x, w, b, z, n0, r, C, V);
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
    const int x16 = c->in[0].dtype == FR_BF16 && C > 0;
    const float *x = x16 ? NULL : fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]), *b = fr_f32(&c->in[2]);
    const uint16_t *xh = x16 ? c->in[0].data : NULL;
    const int32_t *y = (const int32_t *)c->in[3].data;
    double *dbs = (double *)(void *)c->out[4].data;
    float *z = fr_f32(&c->out[4]) + 2 * V;
    const float k = (float)((double)c->node->attr.scale / (double)N);
    ce16 g;
    if (x16 && (st = ce16_take(c, "linear_ce_bwd", &d, 1, &g))) return st;
    if (db) memset(dbs, 0, (size_t)V * sizeof(double));
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        if (x16 && (st = chunk_logits16(c, &g, xh, w, b, z, n0, r, C, V))) return st;
        if (!x16) chunk_logits(x, w, b, z, n0, r, C, V);
#pragma omp parallel for schedule(static) if (r * V >= CE_PAR_MIN)
        for (int64_t i = 0; i < r; i++) {
            float m;
            const float shift = (float)fr_ce_row_lse(z + i * V, V, &m);
            fr_ce_row_dlogits(z + i * V, z + i * V, V, m, shift, k, y[n0 + i], 0);
        }
        if (x16 && (dx || dw) &&
            (st = chunk_grads16(c, &g, xh + n0 * C, w, z, dx ? dx + n0 * C : NULL, dw,
                                ax ? 1.0f : 0.0f, n0 == 0 && !aw ? 0.0f : 1.0f, r, C, V)))
            return st;
        if (!x16 && dx && C > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)C, (int)V, 1.0f, z,
                        (int)V, w, (int)C, ax ? 1.0f : 0.0f, dx + n0 * C, (int)C);
        if (!x16 && dw && C > 0)
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
