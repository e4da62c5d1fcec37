/* attention.c — causal multi-head self-attention, forward and backward, as
 * FlashAttention-2 computes it (the design of PyTorch's CPU flash kernel,
 * aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): scores a tile of
 * queries x a tile of keys at a time by OpenBLAS GEMMs, an online softmax in
 * the forward, the tiles recomputed from lse in the backward. It owns the
 * math and the tiling only: no allocation (the caller gives the workspace),
 * no op-table entry yet.
 *
 * For one (batch, head), with Q, K, V, O (T, HS) and s = 1/sqrt(HS):
 *   S = s Q K^T, masked to S[t,u] = -inf for u > t
 *   P = softmax_rows(S),  O = P V,  lse[t] = log sum_u exp(S[t,u])
 * and, from dO:
 *   dV = P^T dO;  dP = dO V^T;  D[t] = sum_u P[t,u] dP[t,u] = dO[t,:] . O[t,:]
 *   dS = P o (dP - D);  dQ = s dS K;  dK = s dS^T Q
 * P is never stored whole: the backward recomputes each tile as
 * P = exp(S - lse). */
#include "backend/cpu/attention.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "frugal.h"

static int imin(int a, int b) { return a < b ? a : b; }

static size_t slot_floats(int T) {
    size_t bq = (size_t)imin(T, FR_ATTN_BQ), bk = (size_t)imin(T, FR_ATTN_BK);
    return 2 * bq * bk + 2 * bq;
}

size_t fr_attention_ws_floats(int T, int HS, int threads) {
    (void)HS; /* the tiles hold scores and row statistics only: no HS-long row */
    if (T < 1) T = 1;
    return slot_floats(T) * (size_t)(threads > 0 ? threads : 1);
}

/* Threads the kernel uses: as many as ws has slots, at most the maximum and
 * the number of tasks; 0 when ws holds no slot.
 * one_thread_gemms: OpenBLAS's bits depend on how many threads split a GEMM,
 * so every tile GEMM runs on one thread. In a team of several OpenBLAS sees
 * omp_in_parallel() and stays on one; a team of one (one task, or ws with one
 * slot) is not an active region, so each thread also sets its own
 * nthreads-var to 1 (an ICV of the region's implicit task: the caller's
 * setting is untouched), which OpenBLAS's OpenMP build reads. */
static int team(int T, size_t ws_floats, long long tasks) {
    long long slots = (long long)(ws_floats / slot_floats(T)), nt = omp_get_max_threads();
    if (slots < nt) nt = slots;
    if (tasks < nt) nt = tasks;
    return (int)nt;
}

/* The scores of one tile: S (rq, rk; row stride BK) = s Qi Kj^T, with Qi the
 * tile's rq query rows and Kj its rk key rows (HS each). */
static void scores(float *S, int ldS, const float *Qi, const float *Kj, int rq, int rk, int HS,
                   float s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rq, rk, HS, s, Qi, HS, Kj, HS, 0.0f, S,
                ldS);
}

/* Keys of a tile starting at k0 (rk of them) that query row q may attend:
 * columns 0 .. n-1, n = clamp(q - k0 + 1, 0, rk). */
static int visible(int q, int k0, int rk) {
    int n = q - k0 + 1;
    return n < 0 ? 0 : n > rk ? rk : n;
}

// q, k, v, out are (B,NH,T,HS), lse is (B,NH,T)
// out[t] = sum_{u<=t} exp(S[t,u] - lse[t]) v[u],  lse[t] = log sum_{u<=t} exp(S[t,u])
// One task per (b, head, query tile); out's rows are the accumulator. Per key
// tile j (left to right, those with a key at or left of the tile's last
// query): S = s Qi Kj^T; per row the running max m and sum l become
// m' = max(m, max_u S), l' = l e^(m - m') + sum_u e^(S - m'), the row of out
// is multiplied by e^(m - m') and gets P Vj added with P = e^(S - m').
// Key tiles wholly right of the diagonal are skipped, the diagonal ones
// masked. At the end out /= l and lse = m + log l.
int fr_attention_fwd(const float *q, const float *k, const float *v, float *out, float *lse, int B,
                     int NH, int T, int HS, float *ws, size_t ws_floats) {
    if (B <= 0 || NH <= 0 || T <= 0 || HS <= 0) return FR_OK;
    const int BQ = imin(T, FR_ATTN_BQ), BK = imin(T, FR_ATTN_BK);
    const int nq = (T + BQ - 1) / BQ;
    const long long tasks = (long long)B * NH * nq;
    const int nt = team(T, ws_floats, tasks);
    if (nt < 1) return FR_ERR_ARG;
    const float s = 1.0f / sqrtf((float)HS);
    const size_t per = slot_floats(T);
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (see one_thread_gemms) */
        float *S = ws + (size_t)omp_get_thread_num() * per;
        float *m = S + 2 * (size_t)BQ * BK, *l = m + BQ;
#pragma omp for schedule(static)
        for (long long task = 0; task < tasks; task++) {
            const size_t bh = (size_t)(task / nq);
            const int q0 = (int)(task % nq) * BQ, rq = imin(BQ, T - q0);
            const size_t base = bh * (size_t)T * HS;
            const float *Qi = q + base + (size_t)q0 * HS;
            float *Oi = out + base + (size_t)q0 * HS;
            memset(Oi, 0, (size_t)rq * HS * sizeof(float));
            for (int r = 0; r < rq; r++) m[r] = -INFINITY, l[r] = 0.0f;
            for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK) {
                const int rk = imin(BK, T - k0);
                scores(S, BK, Qi, k + base + (size_t)k0 * HS, rq, rk, HS, s);
                for (int r = 0; r < rq; r++) {
                    float *Sr = S + (size_t)r * BK;
                    const int n = visible(q0 + r, k0, rk);
                    float mx = m[r];
                    for (int c = 0; c < n; c++) mx = Sr[c] > mx ? Sr[c] : mx;
                    float sum = 0.0f;
                    for (int c = 0; c < n; c++) {
                        Sr[c] = expf(Sr[c] - mx);
                        sum += Sr[c];
                    }
                    for (int c = n; c < rk; c++) Sr[c] = 0.0f;
                    if (mx != m[r]) { /* m was -inf before the first tile: alpha 0 */
                        const float alpha = expf(m[r] - mx);
                        float *Or = Oi + (size_t)r * HS;
                        for (int d = 0; d < HS; d++) Or[d] *= alpha;
                        l[r] *= alpha;
                    }
                    l[r] += sum;
                    m[r] = mx;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rq, HS, rk, 1.0f, S, BK,
                            v + base + (size_t)k0 * HS, HS, 1.0f, Oi, HS);
            }
            for (int r = 0; r < rq; r++) {
                float *Or = Oi + (size_t)r * HS;
                const float inv = 1.0f / l[r];
                for (int d = 0; d < HS; d++) Or[d] *= inv;
                lse[bh * (size_t)T + (size_t)q0 + r] = m[r] + logf(l[r]);
            }
        }
    }
    return FR_OK;
}

/* D (rq) = rowsum(dOi o Oi), summed in double in a fixed order. */
static void row_dots(float *D, const float *dOi, const float *Oi, int rq, int HS) {
    for (int r = 0; r < rq; r++) {
        double a = 0.0;
        for (int d = 0; d < HS; d++) a += (double)dOi[(size_t)r * HS + d] * Oi[(size_t)r * HS + d];
        D[r] = (float)a;
    }
}

/* One tile of the backward's recomputation: S = s Qi Kj^T becomes
 * P = exp(S - lse) (0 where masked) in place, dP = dOi Vj^T becomes
 * dS = P o (dP - D) in place. */
static void tile_grads(float *P, float *dS, int ld, const float *Qi, const float *Kj,
                       const float *Vj, const float *dOi, const float *lse_i, const float *D,
                       int q0, int k0, int rq, int rk, int HS, float s) {
    scores(P, ld, Qi, Kj, rq, rk, HS, s);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rq, rk, HS, 1.0f, dOi, HS, Vj, HS, 0.0f,
                dS, ld);
    for (int r = 0; r < rq; r++) {
        float *Pr = P + (size_t)r * ld, *dSr = dS + (size_t)r * ld;
        const int n = visible(q0 + r, k0, rk);
        for (int c = 0; c < n; c++) {
            Pr[c] = expf(Pr[c] - lse_i[r]);
            dSr[c] = Pr[c] * (dSr[c] - D[r]);
        }
        for (int c = n; c < rk; c++) Pr[c] = 0.0f, dSr[c] = 0.0f;
    }
}

// q, k, v, out, dout, dq, dk, dv are (B,NH,T,HS), lse is (B,NH,T)
// dv = P^T dout;  dk = s dS^T q;  dq = s dS k;  dS = P o (dout v^T - D),
// D[t] = dout[t,:] . out[t,:], P = exp(s q k^T - lse) masked.
// Two passes, each row of a gradient written by one task, so no two threads
// touch a row and the bits do not depend on the thread count:
//  1. one task per (b, head, key tile j): dk_j, dv_j summed over the query
//     tiles i that see a key of j, in increasing i;
//  2. one task per (b, head, query tile i): dq_i summed over key tiles j in
//     increasing j.
// Each pass recomputes P and dS of its tiles (the price of storing no T x T).
int fr_attention_bwd(const float *q, const float *k, const float *v, const float *out,
                     const float *dout, const float *lse, float *dq, float *dk, float *dv, int B,
                     int NH, int T, int HS, float *ws, size_t ws_floats) {
    if (B <= 0 || NH <= 0 || T <= 0 || HS <= 0) return FR_OK;
    const int BQ = imin(T, FR_ATTN_BQ), BK = imin(T, FR_ATTN_BK);
    const int nq = (T + BQ - 1) / BQ, nk = (T + BK - 1) / BK;
    const long long tasks_k = (long long)B * NH * nk, tasks_q = (long long)B * NH * nq;
    const int nt = team(T, ws_floats, tasks_k > tasks_q ? tasks_k : tasks_q);
    if (nt < 1) return FR_ERR_ARG;
    const float s = 1.0f / sqrtf((float)HS);
    const size_t per = slot_floats(T);
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (see one_thread_gemms) */
        float *P = ws + (size_t)omp_get_thread_num() * per;
        float *dS = P + (size_t)BQ * BK, *D = dS + (size_t)BQ * BK;
#pragma omp for schedule(static)
        for (long long task = 0; task < tasks_k; task++) {
            const size_t bh = (size_t)(task / nk);
            const int k0 = (int)(task % nk) * BK, rk = imin(BK, T - k0);
            const size_t base = bh * (size_t)T * HS;
            const float *Kj = k + base + (size_t)k0 * HS, *Vj = v + base + (size_t)k0 * HS;
            float *dKj = dk + base + (size_t)k0 * HS, *dVj = dv + base + (size_t)k0 * HS;
            memset(dKj, 0, (size_t)rk * HS * sizeof(float));
            memset(dVj, 0, (size_t)rk * HS * sizeof(float));
            for (int q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) { /* the first tile with a query >= k0 */
                const int rq = imin(BQ, T - q0);
                const size_t off = base + (size_t)q0 * HS;
                row_dots(D, dout + off, out + off, rq, HS);
                tile_grads(P, dS, BK, q + off, Kj, Vj, dout + off, lse + bh * (size_t)T + q0, D, q0,
                           k0, rq, rk, HS, s);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rk, HS, rq, 1.0f, P, BK,
                            dout + off, HS, 1.0f, dVj, HS);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rk, HS, rq, s, dS, BK, q + off,
                            HS, 1.0f, dKj, HS);
            }
        }
#pragma omp for schedule(static)
        for (long long task = 0; task < tasks_q; task++) {
            const size_t bh = (size_t)(task / nq);
            const int q0 = (int)(task % nq) * BQ, rq = imin(BQ, T - q0);
            const size_t base = bh * (size_t)T * HS, off = base + (size_t)q0 * HS;
            float *dQi = dq + off;
            memset(dQi, 0, (size_t)rq * HS * sizeof(float));
            row_dots(D, dout + off, out + off, rq, HS);
            for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK) {
                const int rk = imin(BK, T - k0);
                const float *Kj = k + base + (size_t)k0 * HS;
                tile_grads(P, dS, BK, q + off, Kj, v + base + (size_t)k0 * HS, dout + off,
                           lse + bh * (size_t)T + q0, D, q0, k0, rq, rk, HS, s);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rq, HS, rk, s, dS, BK, Kj,
                            HS, 1.0f, dQi, HS);
            }
        }
    }
    return FR_OK;
}
