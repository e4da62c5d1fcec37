/* embedding.c — table lookups of a GPT's input: the token embedding (a row
 * of W per id) and the learned position embedding (row t of W added at
 * position t), forward and backward. Ids are checked before anything is
 * written; a bad one is an FR_ERR_ARG naming its position. The backward
 * scatters are owned by columns or rows, so no two threads add into one
 * value and the bits do not depend on the thread count. */
#include <string.h>
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define EMB_PAR_MIN 16384 /* elements below which a thread team costs more than it saves */
#define EMB_ROWS 1024     /* rows of dW one task owns in the backward scatter */

/* Every one of the R i32 ids in [0, V) (the message: kcheck.h). */
static int check_ids(fr_kernel_call *c, const char *op, const fr_tensor *idx, int64_t R,
                     int64_t V) {
    const int32_t *id = (const int32_t *)idx->data;
    for (int64_t r = 0; r < R; r++)
        if (id[r] < 0 || id[r] >= V) return fr_kcheck_bad_id(c, op, idx, r, id[r], V);
    return FR_OK;
}

// idx is (B,T) i32, W is (V,C), y is (B,T,C)
// y[b,t,:] = W[idx[b,t],:]
int fr_k_embedding(fr_kernel_call *c) {
    const fr_tensor *idx = &c->in[0], *w = &c->in[1];
    int64_t R, V, C;
    int st = fr_kcheck_embedding(c, &R, &V, &C);
    if (!st) st = check_ids(c, "embedding", idx, R, V);
    if (st) return st;
    const int32_t *id = (const int32_t *)idx->data;
    const float *wp = fr_f32(w);
    float *y = fr_f32(&c->out[0]);
#pragma omp parallel for schedule(static) if (R * C >= EMB_PAR_MIN)
    for (int64_t r = 0; r < R; r++)
        memcpy(y + r * C, wp + (int64_t)id[r] * C, (size_t)C * sizeof(float));
    return FR_OK;
}

// dy is (B,T,C), idx is (B,T), dW is (V,C); out[0] (the ids' gradient) is absent
// dW[v,:] (+)= sum over (b,t) with idx[b,t] == v of dy[b,t,:], rows added in order of (b,t)
// A task owns EMB_ROWS rows of dW (see below), so each value is summed in
// the same order at any thread count.
int fr_k_embedding_bwd(fr_kernel_call *c) {
    const fr_tensor *dyt = &c->in[0], *idx = &c->in[1];
    float *dw = fr_f32(&c->out[1]);
    if (!dw) return FR_OK;
    int64_t R, V, C;
    int st = fr_kcheck_embedding_bwd(c, &R, &V, &C);
    if (!st) st = check_ids(c, "embedding_bwd", idx, R, V);
    if (st) return st;
    const int32_t *id = (const int32_t *)idx->data;
    const float *dy = fr_f32(dyt);
    const int acc = acc_bit(c, 1);
    /* A task owns a range of vocabulary rows: it clears them (one contiguous
     * block: a (50257, 768) table is 154 MB) and adds, in order of r, the
     * dy rows whose id falls in it, so each dW row sums in the same order
     * whatever the thread count. */
    const int64_t nt = (V + EMB_ROWS - 1) / EMB_ROWS;
#pragma omp parallel for schedule(static) if ((R + V) * C >= EMB_PAR_MIN)
    for (int64_t ti = 0; ti < nt; ti++) {
        const int64_t v0 = ti * EMB_ROWS, v1 = V - v0 < EMB_ROWS ? V : v0 + EMB_ROWS;
        if (!acc) memset(dw + v0 * C, 0, (size_t)((v1 - v0) * C) * sizeof(float));
        for (int64_t r = 0; r < R; r++) {
            if (id[r] < v0 || id[r] >= v1) continue;
            float *dst = dw + (int64_t)id[r] * C;
            const float *src = dy + r * C;
            for (int64_t j = 0; j < C; j++) dst[j] += src[j];
        }
    }
    return FR_OK;
}

// x is (B,T,C), W is (Tmax,C) with T <= Tmax, y is (B,T,C) (y may alias x)
// y[b,t,:] = x[b,t,:] + W[t,:]; out[1], where bound (fr_op_info.half_copy),
// y rounded to 16 bits a row at a time
int fr_k_pos_embedding(fr_kernel_call *c) {
    const fr_shape *xs = &c->in[0].shape, *ws = &c->in[1].shape;
    if (xs->ndim != 3 || ws->ndim != 2 || ws->d[1] != xs->d[2] || xs->d[1] > ws->d[0])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "pos_embedding: x must be (B,T,C) and W (Tmax,C) with T <= Tmax");
    int st = fr_kcheck_copy16(c, "pos_embedding");
    if (st) return st;
    const int64_t B = xs->d[0], T = xs->d[1], C = xs->d[2];
    const float *x = fr_f32(&c->in[0]), *w = fr_f32(&c->in[1]);
    float *y = fr_f32(&c->out[0]);
    const fr_tensor *h = fr_kcopy16(c);
#pragma omp parallel for schedule(static) if (B * T * C >= EMB_PAR_MIN)
    for (int64_t r = 0; r < B * T; r++) {
        const float *xr = x + r * C, *wr = w + (r % T) * C;
        float *yr = y + r * C;
        for (int64_t j = 0; j < C; j++) yr[j] = xr[j] + wr[j];
        if (h) out_store(h, r * C, yr, C);
    }
    return FR_OK;
}

// dy is (B,T,C), dW is (Tmax,C); out[0] (x's gradient, dy itself) is absent
// dW[t,:] (+)= sum_b dy[b,t,:] for t < T, in order of b;  dW[t,:] = 0 for t >= T
// (left as it is when accumulating). A task owns a row of dW.
int fr_k_pos_embedding_bwd(fr_kernel_call *c) {
    float *dw = fr_f32(&c->out[1]);
    if (!dw) return FR_OK;
    const fr_shape *ys = &c->in[0].shape, *ws = &c->out[1].shape;
    if (ys->ndim != 3 || ws->ndim != 2 || ws->d[1] != ys->d[2] || ys->d[1] > ws->d[0])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "pos_embedding_bwd: dy must be (B,T,C) and dW (Tmax,C) with T <= Tmax");
    const int64_t B = ys->d[0], T = ys->d[1], C = ys->d[2], Tmax = ws->d[0];
    const float *dy = fr_f32(&c->in[0]);
    const int acc = acc_bit(c, 1);
#pragma omp parallel for schedule(static) if ((B + 1) * Tmax * C >= EMB_PAR_MIN)
    for (int64_t t = 0; t < Tmax; t++) {
        float *dr = dw + t * C;
        if (!acc) memset(dr, 0, (size_t)C * sizeof(float));
        if (t >= T) continue;
        for (int64_t b = 0; b < B; b++) {
            const float *src = dy + (b * T + t) * C;
            for (int64_t j = 0; j < C; j++) dr[j] += src[j];
        }
    }
    return FR_OK;
}
