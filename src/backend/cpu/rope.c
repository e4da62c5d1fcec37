/* rope.c — ROPE_QKV and ROPE_QKV_BWD on the CPU (rope.h has the formulas):
 * q, k, v rows into the packed qkv of (grouped-query) attention, q's and k's
 * heads rotated, v's copied; the backward the transposed rotation. A task per
 * row (b, t): its angles computed once a block of frequencies at a time and
 * shared by its heads, so no workspace and no allocation; each element is
 * one task's, so the bits do not depend on the thread count. */
#include "backend/cpu/rope.h"
#include <math.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "frugal.h"

#define ROPE_BLOCK 64 /* frequencies whose cos and sin a row holds at once */

float fr_rope_inv_freq(const fr_rope *r, int i, int HS) {
    /* default: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), float32 */
    const float e = (float)(2 * i) / (float)HS;
    const float f = 1.0f / (float)pow((double)r->theta, (double)e);
    if (r->type == FR_ROPE_LINEAR) return f / r->factor;
    if (r->type != FR_ROPE_LLAMA3) return f;
    const double pi = 3.14159265358979323846;
    const double wavelen = 2.0 * pi / (double)f;
    const double orig = (double)r->orig_context, lo = r->low_freq_factor, hi = r->high_freq_factor;
    if (wavelen > orig / lo) return f / r->factor;
    if (wavelen < orig / hi) return f;
    const double smooth = (orig / wavelen - lo) / (hi - lo);
    return (float)((1.0 - smooth) * (double)f / (double)r->factor + smooth * (double)f);
}

typedef struct rope_dims {
    int64_t B, T;
    int NH, NKV, HS;
} rope_dims;

/* The dims from qkv (B, T, (NH + 2 NKV) HS) and attr; checks q, k, v (when
 * bound) against them. */
static int dims(fr_kernel_call *c, const char *op, const fr_tensor *qkv, const fr_tensor *q,
                const fr_tensor *k, const fr_tensor *v, rope_dims *d) {
    const fr_attr *a = &c->node->attr;
    const fr_shape *x = &qkv->shape;
    d->NH = a->heads, d->NKV = a->kv_heads ? a->kv_heads : a->heads;
    const int w = d->NH + 2 * d->NKV;
    if (d->NH < 1 || d->NKV < 1 || x->ndim != 3 || x->d[2] % w || (x->d[2] / w) % 2 || x->d[2] == 0)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: qkv must be (B,T,(heads+2 kv_heads) HS) with HS even (heads %d, "
                       "kv_heads %d)",
                       op, d->NH, d->NKV);
    d->B = x->d[0], d->T = x->d[1], d->HS = (int)(x->d[2] / w);
    const int n[3] = {d->NH, d->NKV, d->NKV};
    const fr_tensor *t[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        const fr_shape *s = &t[i]->shape;
        if (!t[i]->data) continue;
        if (s->ndim != 3 || s->d[0] != d->B || s->d[1] != d->T ||
            s->d[2] != (int64_t)n[i] * d->HS || t[i]->dtype != FR_F32)
            return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: %s must be f32 (%lld, %lld, %lld)", op,
                           i == 0   ? "q"
                           : i == 1 ? "k"
                                    : "v",
                           (long long)d->B, (long long)d->T, (long long)n[i] * d->HS);
    }
    if (qkv->dtype != FR_F32 || !qkv->data)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: qkv must be f32 and bound", op);
    return FR_OK;
}

/* heads rows of HS values from src to dst, each rotated by the angles of
 * position pos (inv = 1: the transposed rotation); src NULL: nothing. */
static void rotate(const float *src, float *dst, int heads, int HS, float pos, const fr_rope *r,
                   int inv) {
    if (!src) return;
    if (r->theta == 0.0f) { /* no rotation */
        memcpy(dst, src, (size_t)heads * HS * sizeof(float));
        return;
    }
    const int h2 = HS / 2;
    float cs[ROPE_BLOCK], sn[ROPE_BLOCK];
    for (int i0 = 0; i0 < h2; i0 += ROPE_BLOCK) {
        const int n = h2 - i0 < ROPE_BLOCK ? h2 - i0 : ROPE_BLOCK;
        for (int i = 0; i < n; i++) {
            const float a = fr_rope_inv_freq(r, i0 + i, HS) * pos;
            cs[i] = (float)cos((double)a), sn[i] = (float)sin((double)a);
            if (inv) sn[i] = -sn[i];
        }
        for (int h = 0; h < heads; h++) {
            const float *x = src + (size_t)h * HS + i0;
            float *y = dst + (size_t)h * HS + i0;
            for (int i = 0; i < n; i++) {
                const float x1 = x[i], x2 = x[i + h2];
                y[i] = x1 * cs[i] - x2 * sn[i];
                y[i + h2] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

/* The row's position: t, or step + t (attr.rope.pos_from_step) */
static float position(const fr_kernel_call *c, int64_t t) {
    const uint64_t p = (c->node->attr.rope.pos_from_step ? c->step : 0) + (uint64_t)t;
    return (float)p;
}

// q (B,T,NH HS), k and v (B,T,NKV HS) -> qkv (B,T,(NH+2NKV)HS) = [rot(q) | rot(k) | v]
int fr_k_rope_qkv(fr_kernel_call *c) {
    rope_dims d;
    int st = dims(c, "rope_qkv", &c->out[0], &c->in[0], &c->in[1], &c->in[2], &d);
    if (st) return st;
    if (!c->in[0].data || !c->in[1].data || !c->in[2].data)
        return fr_fail(c->ctx, FR_ERR_ARG, "rope_qkv: q, k or v is not bound");
    const float *q = fr_f32(&c->in[0]), *k = fr_f32(&c->in[1]), *v = fr_f32(&c->in[2]);
    float *y = fr_f32(&c->out[0]);
    const size_t C = (size_t)d.NH * d.HS, CK = (size_t)d.NKV * d.HS, W = C + 2 * CK;
    const int64_t rows = d.B * d.T;
    const fr_rope *r = &c->node->attr.rope;
#pragma omp parallel for schedule(static) if ((size_t)rows * W >= 32768)
    for (int64_t row = 0; row < rows; row++) {
        const float pos = position(c, row % d.T);
        float *o = y + (size_t)row * W;
        rotate(q + (size_t)row * C, o, d.NH, d.HS, pos, r, 0);
        rotate(k + (size_t)row * CK, o + C, d.NKV, d.HS, pos, r, 0);
        memcpy(o + C + CK, v + (size_t)row * CK, CK * sizeof(float));
    }
    return FR_OK;
}

// dqkv (B,T,(NH+2NKV)HS) -> dq (B,T,NH HS), dk, dv (B,T,NKV HS), each when wanted:
// dq, dk the transposed rotation of dqkv's blocks, dv its copy (written whole)
int fr_k_rope_qkv_bwd(fr_kernel_call *c) {
    rope_dims d;
    int st = dims(c, "rope_qkv_bwd", &c->in[0], &c->out[0], &c->out[1], &c->out[2], &d);
    if (st) return st;
    if (c->accumulate & 7u)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "rope_qkv_bwd: dq, dk and dv are written whole, they cannot be added into");
    const float *g = fr_f32(&c->in[0]);
    float *dq = fr_f32(&c->out[0]), *dk = fr_f32(&c->out[1]), *dv = fr_f32(&c->out[2]);
    const size_t C = (size_t)d.NH * d.HS, CK = (size_t)d.NKV * d.HS, W = C + 2 * CK;
    const int64_t rows = d.B * d.T;
    const fr_rope *r = &c->node->attr.rope;
#pragma omp parallel for schedule(static) if ((size_t)rows * W >= 32768)
    for (int64_t row = 0; row < rows; row++) {
        const float pos = position(c, row % d.T);
        const float *gr = g + (size_t)row * W;
        if (dq) rotate(gr, dq + (size_t)row * C, d.NH, d.HS, pos, r, 1);
        if (dk) rotate(gr + C, dk + (size_t)row * CK, d.NKV, d.HS, pos, r, 1);
        if (dv) memcpy(dv + (size_t)row * CK, gr + C + CK, CK * sizeof(float));
    }
    return FR_OK;
}
