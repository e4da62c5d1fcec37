/* norm.c — batch normalisation (1d and 2d) and layer normalisation, forward
 * and backward. Statistics are summed in double, one channel (BatchNorm) or
 * one sample (LayerNorm) per thread in a fixed order, so results do not
 * depend on scheduling. A missing gamma/beta means the identity affine. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/norm_blocked.h"
#include "backend/cpu/norm_lanes.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define NORM_PAR_MIN 16384
#define LN_CHUNK 256 /* LayerNorm's 16-bit y: values rounded from the stack at a time */

/* Sum of (p[i] - m)^2 in double, in the order of sum_f64 (reduce.h). */
static inline double sumsq_dev_f64(const float *p, int64_t n, double m) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            double d = p[i + j] - m;
            a[j] += d * d;
        }
    for (; i < n; i++) {
        double d = p[i] - m;
        a[0] += d * d;
    }
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Per-plane sums for BatchNorm: a plane (HW <= a few thousand floats) is
 * summed in f32 by a vectorised loop in a fixed order, planes are added in
 * double; the relative error stays near sqrt(HW) u, and the loops run at
 * memory speed instead of one dependent double add per element. */
static float plane_sum(const float *restrict p, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += p[i];
    return s;
}

/* sum of ((p - m_hi) - m_lo)^2 */
static float plane_sumsq_dev(const float *restrict p, int64_t n, float m_hi, float m_lo) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        float d = (p[i] - m_hi) - m_lo;
        s += d * d;
    }
    return s;
}

/* sum of dy and of dy ((x - m_hi) - m_lo) */
static void plane_sum_dy_dyx(const float *restrict dy, const float *restrict x, int64_t n,
                             float m_hi, float m_lo, float *sdy, float *sdyx) {
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (int64_t i = 0; i < n; i++) {
        a += dy[i];
        b += dy[i] * ((x[i] - m_hi) - m_lo);
    }
    *sdy = a, *sdyx = b;
}

/* The same three on a bf16 x read in the loop (fr_bf16_bits): simdlen(4)
 * keeps the lanes of the f32 loops above on the baseline ISA (without it
 * the 16-bit loads make the vectorizer take 8), so the sums are those of
 * the widened plane bit for bit, without widening it into a buffer first. */
static float plane_sum_bf(const uint16_t *restrict p, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s) simdlen(4)
    for (int64_t i = 0; i < n; i++) s += fr_bf16_bits(p[i]);
    return s;
}

static float plane_sumsq_dev_bf(const uint16_t *restrict p, int64_t n, float m_hi, float m_lo) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s) simdlen(4)
    for (int64_t i = 0; i < n; i++) {
        float d = (fr_bf16_bits(p[i]) - m_hi) - m_lo;
        s += d * d;
    }
    return s;
}

static void plane_sum_dy_dyx_bf(const float *restrict dy, const uint16_t *restrict x, int64_t n,
                                float m, float *sdy, float *sdyx) {
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b) simdlen(4)
    for (int64_t i = 0; i < n; i++) {
        a += dy[i];
        b += dy[i] * ((fr_bf16_bits(x[i]) - m) - 0.0f);
    }
    *sdy = a, *sdyx = b;
}

/* A plane of y = ((x - m_hi) - m_lo) scale + b, x f32 (xp) or bf16 (xh),
 * then where relu y = y < lo ? 0 : y (fr_relu_lo: ReLU's bits once y is
 * rounded to its dtype; a NaN passes); element-wise, so cloned for the
 * CPU's widest vectors with the same bits. */
FR_V3_CLONES static void plane_affine(const float *restrict xp, const uint16_t *restrict xh,
                                      int64_t n, float m_hi, float m_lo, float scale, float b,
                                      int relu, float lo, float *restrict yp) {
    if (xh) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) yp[i] = ((fr_bf16_bits(xh[i]) - m_hi) - m_lo) * scale + b;
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) yp[i] = ((xp[i] - m_hi) - m_lo) * scale + b;
    }
    if (relu) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) yp[i] = yp[i] < lo ? 0.0f : yp[i];
    }
}

/* A plane of dx = k (dy - mdy - (x - m) q), or added into dx (acc) */
FR_V3_CLONES static void plane_dx(const float *restrict xp, const uint16_t *restrict xh,
                                  const float *restrict dy, float *restrict dx, int64_t n, float k,
                                  float mdy, float m, float q, int acc) {
    if (xh && acc) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] += k * (dy[i] - mdy - (fr_bf16_bits(xh[i]) - m) * q);
    } else if (xh) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] = k * (dy[i] - mdy - (fr_bf16_bits(xh[i]) - m) * q);
    } else if (acc) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] += k * (dy[i] - mdy - (xp[i] - m) * q);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] = k * (dy[i] - mdy - (xp[i] - m) * q);
    }
}

/* The sums above for four planes of one channel at once (images n .. n+3,
 * `stride` values apart): each plane's sum is the same loop in the same
 * order (one reduction variable a plane, the lanes as above), so the bits
 * are the one-plane functions'; four independent chains of adds in flight
 * instead of one, whose latency bounded the one-plane loops. */
#define PLANES4(name, T, R4, R8, X)                                                                \
    static void name(const T *restrict p, const float *restrict dy, int64_t stride, int64_t n,     \
                     float m_hi, float m_lo, int kind, float out[8]) {                             \
        const T *p0 = p, *p1 = p + stride, *p2 = p + 2 * stride, *p3 = p + 3 * stride;             \
        float a = 0.0f, b = 0.0f, c = 0.0f, d = 0.0f;                                              \
        if (kind == 0) {                                                                           \
            _Pragma(R4) for (int64_t i = 0; i < n; i++) {                                          \
                a += X(p0[i]), b += X(p1[i]), c += X(p2[i]), d += X(p3[i]);                        \
            }                                                                                      \
            out[0] = a, out[1] = b, out[2] = c, out[3] = d;                                        \
        } else if (kind == 1) {                                                                    \
            _Pragma(R4) for (int64_t i = 0; i < n; i++) {                                          \
                const float e = (X(p0[i]) - m_hi) - m_lo, f = (X(p1[i]) - m_hi) - m_lo,            \
                            g = (X(p2[i]) - m_hi) - m_lo, h = (X(p3[i]) - m_hi) - m_lo;            \
                a += e * e, b += f * f, c += g * g, d += h * h;                                    \
            }                                                                                      \
            out[0] = a, out[1] = b, out[2] = c, out[3] = d;                                        \
        } else {                                                                                   \
            const float *g0 = dy, *g1 = dy + stride, *g2 = dy + 2 * stride, *g3 = dy + 3 * stride; \
            float a2 = 0.0f, b2 = 0.0f, c2 = 0.0f, d2 = 0.0f;                                      \
            _Pragma(R8) for (int64_t i = 0; i < n; i++) {                                          \
                a += g0[i], b += g1[i], c += g2[i], d += g3[i];                                    \
                a2 += g0[i] * ((X(p0[i]) - m_hi) - m_lo);                                          \
                b2 += g1[i] * ((X(p1[i]) - m_hi) - m_lo);                                          \
                c2 += g2[i] * ((X(p2[i]) - m_hi) - m_lo);                                          \
                d2 += g3[i] * ((X(p3[i]) - m_hi) - m_lo);                                          \
            }                                                                                      \
            out[0] = a, out[1] = b, out[2] = c, out[3] = d;                                        \
            out[4] = a2, out[5] = b2, out[6] = c2, out[7] = d2;                                    \
        }                                                                                          \
    }
#define F32_(v) (v)
// clang-format off
PLANES4(planes4_f32_ref, float, "omp simd reduction(+ : a, b, c, d)",
        "omp simd reduction(+ : a, b, c, d, a2, b2, c2, d2)", F32_)
PLANES4(planes4_bf_ref, uint16_t, "omp simd reduction(+ : a, b, c, d) simdlen(4)",
        "omp simd reduction(+ : a, b, c, d, a2, b2, c2, d2) simdlen(4)", fr_bf16_bits)
// clang-format on
#undef F32_

/* The planes4 loops, on 16 lanes where fr_bn_lanes_on (w): the same bits */
static void planes4_f32(int w, const float *p, const float *dy, int64_t stride, int64_t n,
                        float m_hi, float m_lo, int kind, float out[8]) {
    if (w) fr_bn_lanes_f32(p, dy, stride, n, m_hi, m_lo, kind, out);
    else planes4_f32_ref(p, dy, stride, n, m_hi, m_lo, kind, out);
}
static void planes4_bf(int w, const uint16_t *p, const float *dy, int64_t stride, int64_t n,
                       float m_hi, float m_lo, int kind, float out[8]) {
    if (w) fr_bn_lanes_bf(p, dy, stride, n, m_hi, m_lo, kind, out);
    else planes4_bf_ref(p, dy, stride, n, m_hi, m_lo, kind, out);
}

// x is (N,C) or (N,C,H,W), gamma, beta, running_mean, running_var are (C); y is x's shape
// training: mean[c] = E[x], var[c] = E[(x - mean)^2] over (N,H,W); invstd = 1/sqrt(var + eps)
//   y = (x - mean) invstd gamma + beta; saves mean, invstd (C);
//   running_mean = (1-m) running_mean + m mean; running_var = (1-m) running_var + m var n/(n-1)
// eval: y = (x - running_mean) / sqrt(running_var + eps) gamma + beta
// attr.relu: y = ReLU(y), with the bits of fr_k_relu on y (f32, or rounded
// to 16 bits: ReLU reading the rounded y)
int fr_k_batchnorm(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    int64_t N, C, HW;
    int st = fr_kcheck_bn_dims(c, "batchnorm", &c->in[0].shape, &N, &C, &HW);
    if (st) return st;
    /* x f32, bf16 read in the loops, or f16 widened a plane at a time
     * (mixed precision's rounded conv output); y f32, or f16/bf16 rounded a
     * plane at a time (what a rounding reader, ReLU, takes: precision.c) */
    const fr_tensor *x = &c->in[0];
    const uint16_t *xh = x->dtype == FR_BF16 ? (const uint16_t *)x->data : NULL;
    const float *xf = x->dtype == FR_F32 ? (const float *)x->data : NULL;
    const int x4 = xh || xf; /* four planes at a time (not an f16 x, widened a plane) */
    const int w = x4 && fr_bn_lanes_on();
    const float *gamma = fr_f32(&c->in[1]), *beta = fr_f32(&c->in[2]);
    float *rmean = fr_f32(&c->in[3]), *rvar = fr_f32(&c->in[4]);
    float *y = fr_f32(&c->out[0]), *smean = fr_f32(&c->out[1]), *sinv = fr_f32(&c->out[2]);
    const int y16 = c->out[0].dtype != FR_F32;
    const int64_t cnt = N * HW;
    const int training = a->training, relu = a->relu;
    const float lo = fr_relu_lo(c->out[0].dtype);
    if ((st = fr_kcheck_bn_mode(c, N, HW, rmean && rvar))) return st;
    if (fr_blk_in(a, 0)) return fr_k_batchnorm_blocked(c, N, C, HW);
    if (x->dtype != FR_F32 && HW > FR_HALF_PLANE_MAX)
        return fr_fail(c->ctx, FR_ERR_ARG, "batchnorm: a 16-bit input with planes over %d values",
                       FR_HALF_PLANE_MAX);
    if (y16 && HW > FR_HALF_OUT_PLANE_MAX)
        return fr_fail(c->ctx, FR_ERR_ARG, "batchnorm: a 16-bit output with planes over %d values",
                       FR_HALF_OUT_PLANE_MAX);
    const double eps = a->eps, mom = a->momentum;

#pragma omp parallel for schedule(static) if (N * C * HW >= NORM_PAR_MIN)
    for (int64_t ch = 0; ch < C; ch++) {
        float buf[FR_HALF_PLANE_MAX];
        double mean, invstd;
        if (training) {
            double s = 0.0, q = 0.0;
            float t[8];
            int64_t n = 0;
            for (; x4 && n + 4 <= N; n += 4) { /* the planes' sums added in order as below */
                const int64_t o = (n * C + ch) * HW;
                if (xh) planes4_bf(w, xh + o, NULL, C * HW, HW, 0.0f, 0.0f, 0, t);
                else planes4_f32(w, xf + o, NULL, C * HW, HW, 0.0f, 0.0f, 0, t);
                s += t[0], s += t[1], s += t[2], s += t[3];
            }
            for (; n < N; n++) {
                const int64_t o = (n * C + ch) * HW;
                s += xh ? plane_sum_bf(xh + o, HW) : plane_sum(in_f32(x, o, HW, buf), HW);
            }
            mean = s / (double)cnt;
            const float m_hi = (float)mean, m_lo = (float)(mean - m_hi);
            for (n = 0; x4 && n + 4 <= N; n += 4) {
                const int64_t o = (n * C + ch) * HW;
                if (xh) planes4_bf(w, xh + o, NULL, C * HW, HW, m_hi, m_lo, 1, t);
                else planes4_f32(w, xf + o, NULL, C * HW, HW, m_hi, m_lo, 1, t);
                q += t[0], q += t[1], q += t[2], q += t[3];
            }
            for (; n < N; n++) {
                const int64_t o = (n * C + ch) * HW;
                q += xh ? plane_sumsq_dev_bf(xh + o, HW, m_hi, m_lo)
                        : plane_sumsq_dev(in_f32(x, o, HW, buf), HW, m_hi, m_lo);
            }
            double var = q / (double)cnt;
            invstd = 1.0 / sqrt(var + eps);
            if (smean) smean[ch] = (float)mean;
            if (sinv) sinv[ch] = (float)invstd;
            /* a recomputed clone (rematerialization) leaves the running stats alone */
            if (rmean && !a->recompute) rmean[ch] = (float)((1.0 - mom) * rmean[ch] + mom * mean);
            if (rvar && !a->recompute)
                rvar[ch] =
                    (float)((1.0 - mom) * rvar[ch] + mom * var * (double)cnt / (double)(cnt - 1));
        } else {
            mean = rmean[ch];
            invstd = 1.0 / sqrt((double)rvar[ch] + eps);
        }
        /* y = ((x - m_hi) - m_lo) scale + beta, scale = gamma invstd; the mean
         * split in two floats keeps x - mean accurate when var << mean^2 */
        const double g = gamma ? gamma[ch] : 1.0;
        const float m_hi = (float)mean, m_lo = (float)(mean - m_hi);
        const float scale = (float)(g * invstd), b = beta ? beta[ch] : 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const int64_t o = (n * C + ch) * HW;
            float ybuf[FR_HALF_OUT_PLANE_MAX];
            float *yp = y16 ? ybuf : y + o;
            plane_affine(xh ? NULL : in_f32(x, o, HW, buf), xh ? xh + o : NULL, HW, m_hi, m_lo,
                         scale, b, relu, lo, yp);
            if (y16) out_store(&c->out[0], o, ybuf, HW);
        }
    }
    return FR_OK;
}

// dy, x are (N,C) or (N,C,H,W); gamma, mean, invstd are (C) (batch statistics of the forward)
// xhat = (x - mean) invstd; dbeta[c] = sum dy; dgamma[c] = sum dy xhat   (sums over N,H,W; n terms)
// dx = gamma invstd (dy - dbeta/n - xhat dgamma/n)
int fr_k_batchnorm_bwd(fr_kernel_call *c) {
    int64_t N, C, HW;
    int st = fr_kcheck_bn_dims(c, "batchnorm_bwd", &c->in[1].shape, &N, &C, &HW);
    if (st) return st;
    if (!fr_f32(&c->in[3]) || !fr_f32(&c->in[4]))
        return fr_fail(c->ctx, FR_ERR_ARG, "batchnorm_bwd: the saved mean and invstd are missing");
    if (fr_blk_in(&c->node->attr, 1)) return fr_k_batchnorm_bwd_blocked(c, N, C, HW);
    const float *dy = fr_f32(&c->in[0]), *gamma = fr_f32(&c->in[2]);
    const fr_tensor *x = &c->in[1]; /* f32, bf16 read in the loops, or f16 widened a plane */
    const uint16_t *xh = x->dtype == FR_BF16 ? (const uint16_t *)x->data : NULL;
    const float *xf = x->dtype == FR_F32 ? (const float *)x->data : NULL;
    const int x4 = xh || xf; /* four planes at a time (not an f16 x, widened a plane) */
    const int w = x4 && fr_bn_lanes_on();
    if (x->dtype != FR_F32 && HW > FR_HALF_PLANE_MAX)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "batchnorm_bwd: a 16-bit input with planes over %d values",
                       FR_HALF_PLANE_MAX);
    const float *smean = fr_f32(&c->in[3]), *sinv = fr_f32(&c->in[4]);
    float *dx = fr_f32(&c->out[0]), *dgamma = fr_f32(&c->out[1]), *dbeta = fr_f32(&c->out[2]);
    const int64_t cnt = N * HW;
    const int acc_x = acc_bit(c, 0), acc_g = acc_bit(c, 1), acc_b = acc_bit(c, 2);

#pragma omp parallel for schedule(static) if (N * C * HW >= NORM_PAR_MIN)
    for (int64_t ch = 0; ch < C; ch++) {
        float buf[FR_HALF_PLANE_MAX];
        const double inv = sinv[ch];
        const float m = smean[ch];
        double sdy = 0.0, sdyx = 0.0; /* sum dy, sum dy (x - mean) */
        int64_t n = 0;
        for (; x4 && n + 4 <= N; n += 4) {
            const int64_t o = (n * C + ch) * HW;
            float t[8];
            if (xh) planes4_bf(w, xh + o, dy + o, C * HW, HW, m, 0.0f, 2, t);
            else planes4_f32(w, xf + o, dy + o, C * HW, HW, m, 0.0f, 2, t);
            for (int k = 0; k < 4; k++) sdy += t[k], sdyx += t[4 + k];
        }
        for (; n < N; n++) {
            const int64_t o = (n * C + ch) * HW;
            float a, b;
            if (xh) plane_sum_dy_dyx_bf(dy + o, xh + o, HW, m, &a, &b);
            else plane_sum_dy_dyx(dy + o, in_f32(x, o, HW, buf), HW, m, 0.0f, &a, &b);
            sdy += a, sdyx += b;
        }
        const double dg = sdyx * inv; /* sum dy xhat */
        if (dgamma) dgamma[ch] = (float)(acc_g ? dgamma[ch] + dg : dg);
        if (dbeta) dbeta[ch] = (float)(acc_b ? dbeta[ch] + sdy : sdy);
        if (!dx || cnt == 0) continue;
        /* dx = k (dy - mdy - (x - mean) inv^2 mdyx), k = gamma inv */
        const double g = gamma ? gamma[ch] : 1.0;
        const float k = (float)(g * inv), mdy = (float)(sdy / (double)cnt),
                    q = (float)(sdyx / (double)cnt * inv * inv);
        for (int64_t n = 0; n < N; n++) {
            const int64_t o = (n * C + ch) * HW;
            plane_dx(xh ? NULL : in_f32(x, o, HW, buf), xh ? xh + o : NULL, dy + o, dx + o, HW, k,
                     mdy, m, q, acc_x);
        }
    }
    return FR_OK;
}

/* LayerNorm's statistics of one row: mean and rstd in double, the sums in
 * the fixed order of sum_f64 and sumsq_dev_f64, so every clone (the CPU's
 * widest vectors) gives the same bits. */
FR_V3_CLONES static void ln_stats(const float *xp, int64_t D, double eps, double *mean,
                                  double *rstd) {
    double m = sum_f64(xp, D) / (double)D;
    *mean = m;
    *rstd = 1.0 / sqrt(sumsq_dev_f64(xp, D, m) / (double)D + eps);
}

/* y[j] = ((x[j] - m_hi) - m_lo) r gamma[j] + beta[j], j < w (gamma, beta: the
 * row's slice, or NULL for 1 and 0); a loop per case so that each vectorizes */
FR_V3_CLONES static void ln_affine(const float *restrict xp, const float *restrict gamma,
                                   const float *restrict beta, int64_t w, float m_hi, float m_lo,
                                   float r, float *restrict yp) {
    if (gamma && beta) {
#pragma omp simd
        for (int64_t j = 0; j < w; j++) yp[j] = ((xp[j] - m_hi) - m_lo) * r * gamma[j] + beta[j];
    } else if (gamma) {
#pragma omp simd
        for (int64_t j = 0; j < w; j++) yp[j] = ((xp[j] - m_hi) - m_lo) * r * gamma[j];
    } else if (beta) {
#pragma omp simd
        for (int64_t j = 0; j < w; j++) yp[j] = ((xp[j] - m_hi) - m_lo) * r + beta[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < w; j++) yp[j] = ((xp[j] - m_hi) - m_lo) * r;
    }
}

// x is (N, D...) or (B, T, D), gamma, beta are (D...) (N = numel(x) / numel(gamma) rows),
// y is x's shape, mean, rstd are (N) (as x's leading dims: (B) or (B,T))
// mean[n] = E_d x[n,d], var[n] = E_d (x - mean)^2, rstd = 1/sqrt(var + eps)
// y[n,d] = (x[n,d] - mean[n]) rstd[n] gamma[d] + beta[d]
int fr_k_layernorm(fr_kernel_call *c) {
    int64_t N, D;
    int st = fr_kcheck_ln_rows(c, "layernorm", &c->in[0], &c->in[1], &c->out[1], &N, &D);
    if (st) return st;
    const fr_tensor *gt = &c->in[1];
    if (D == 0) return FR_OK;
    const float *x = fr_f32(&c->in[0]), *gamma = fr_f32(gt), *beta = fr_f32(&c->in[2]);
    float *smean = fr_f32(&c->out[1]), *srstd = fr_f32(&c->out[2]);
    const int out16 = c->out[0].dtype != FR_F32; /* y rounded, LN_CHUNK values at a time */
    if (out16 && c->in[0].dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG, "layernorm: x must be f32");
    const double eps = c->node->attr.eps;
#pragma omp parallel for schedule(static) if (N * D >= NORM_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xp = x + n * D;
        double mean, rstd;
        ln_stats(xp, D, eps, &mean, &rstd);
        if (smean) smean[n] = (float)mean;
        if (srstd) srstd[n] = (float)rstd;
        /* the mean split in two floats keeps x - mean accurate when var << mean^2 */
        const float m_hi = (float)mean, m_lo = (float)(mean - m_hi), r = (float)rstd;
        for (int64_t d0 = 0; d0 < D; d0 += LN_CHUNK) {
            float buf[LN_CHUNK];
            const int64_t w = D - d0 < LN_CHUNK ? D - d0 : LN_CHUNK;
            float *yp = out16 ? buf : fr_f32(&c->out[0]) + n * D + d0;
            ln_affine(xp + d0, gamma ? gamma + d0 : NULL, beta ? beta + d0 : NULL, w, m_hi, m_lo, r,
                      yp);
            if (out16) out_store(&c->out[0], n * D + d0, buf, w);
        }
    }
    return FR_OK;
}

#define LN_ROWS 4 /* rows whose sums LayerNorm's backward runs side by side */
_Static_assert(LN_ROWS == 4, "ln_bwd_sums names four rows' chains");

/* For R <= LN_ROWS rows k: sg[k] = sum_d g, sgx[k] = sum_d g xhat in double,
 * g = dy gamma, xhat = (x - m) r, each over d in order: one row's sums are
 * two dependent chains of adds, so R rows run side by side (2 R chains
 * instead of 2) with each row's bits those of the row alone. */
FR_V3_CLONES static void ln_bwd_sums(const float *const *xp, const float *const *dyp,
                                     const float *gamma, const float *m, const float *r, int R,
                                     int64_t D, double *sg, double *sgx) {
    if (R == LN_ROWS) { /* the chains in named locals, so that they stay in registers */
        const float *x0 = xp[0], *x1 = xp[1], *x2 = xp[2], *x3 = xp[3];
        const float *d0 = dyp[0], *d1 = dyp[1], *d2 = dyp[2], *d3 = dyp[3];
        const float m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3];
        const float r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
#define LN_ROW_STEP(k, G)                      \
    {                                          \
        const double g = (G);                  \
        a##k += g;                             \
        b##k += g * ((x##k[d] - m##k) * r##k); \
    }
        if (gamma) {
            for (int64_t d = 0; d < D; d++) {
                LN_ROW_STEP(0, (double)d0[d] * gamma[d])
                LN_ROW_STEP(1, (double)d1[d] * gamma[d])
                LN_ROW_STEP(2, (double)d2[d] * gamma[d])
                LN_ROW_STEP(3, (double)d3[d] * gamma[d])
            }
        } else {
            for (int64_t d = 0; d < D; d++) {
                LN_ROW_STEP(0, d0[d])
                LN_ROW_STEP(1, d1[d])
                LN_ROW_STEP(2, d2[d])
                LN_ROW_STEP(3, d3[d])
            }
        }
#undef LN_ROW_STEP
        sg[0] = a0, sg[1] = a1, sg[2] = a2, sg[3] = a3;
        sgx[0] = b0, sgx[1] = b1, sgx[2] = b2, sgx[3] = b3;
        return;
    }
    for (int k = 0; k < R; k++) {
        double a = 0, b = 0;
        for (int64_t d = 0; d < D; d++) {
            double g = gamma ? (double)dyp[k][d] * gamma[d] : dyp[k][d];
            a += g;
            b += g * ((xp[k][d] - m[k]) * r[k]);
        }
        sg[k] = a, sgx[k] = b;
    }
}

/* dx[d] (+)= r (g - mg - (x - m) r mgx), g = dy gamma, over one row */
FR_V3_CLONES static void ln_bwd_dx(const float *restrict xp, const float *restrict dyp,
                                   const float *restrict gamma, int64_t D, float m, float r,
                                   float mg, float mgx, int acc, float *restrict dxp) {
    if (gamma && acc) {
#pragma omp simd
        for (int64_t d = 0; d < D; d++)
            dxp[d] += r * (dyp[d] * gamma[d] - mg - (xp[d] - m) * r * mgx);
    } else if (gamma) {
#pragma omp simd
        for (int64_t d = 0; d < D; d++)
            dxp[d] = r * (dyp[d] * gamma[d] - mg - (xp[d] - m) * r * mgx);
    } else if (acc) {
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dxp[d] += r * (dyp[d] - mg - (xp[d] - m) * r * mgx);
    } else {
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dxp[d] = r * (dyp[d] - mg - (xp[d] - m) * r * mgx);
    }
}

#define LN_SPAN 1024 /* dgamma and dbeta: the widest span of columns a thread sums */

/* sg[j] += dy xhat, sb[j] += dy over the rows in order, for the columns
 * [d0, d0 + w) of each row (fr_col_span's spans); x f32 or 16 bits, widened
 * a span at a time */
FR_V3_CLONES static void ln_bwd_cols(const fr_tensor *xt, const float *dy, const float *smean,
                                     const float *srstd, int64_t N, int64_t D, int64_t d0,
                                     int64_t w, double *sg, double *sb) {
    float xb[LN_SPAN];
    for (int64_t n = 0; n < N; n++) {
        const float *xp = in_f32(xt, n * D + d0, w, xb), *dyp = dy + n * D + d0;
        const float m = smean[n], r = srstd[n];
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
            sb[j] += dyp[j];
            sg[j] += (double)dyp[j] * ((xp[j] - m) * r);
        }
    }
}

// dy, x are (N, D...) or (B, T, D), gamma is (D...), mean, rstd are (N) or (B, T)
// xhat = (x - mean) rstd, g = dy gamma
// dx[n,d] = rstd (g - E_d g - xhat E_d(g xhat));  dgamma[d] = sum_n dy xhat;  dbeta[d] = sum_n dy
int fr_k_layernorm_bwd(fr_kernel_call *c) {
    int64_t N, D;
    int st = fr_kcheck_ln_rows(c, "layernorm_bwd", &c->in[1], &c->in[2], &c->in[3], &N, &D);
    if (st) return st;
    const float *dy = fr_f32(&c->in[0]), *gamma = fr_f32(&c->in[2]);
    const float *smean = fr_f32(&c->in[3]), *srstd = fr_f32(&c->in[4]);
    const fr_tensor *xt = &c->in[1]; /* f32, or 16 bits widened a row at a time */
    if (xt->dtype != FR_F32 && D > FR_HALF_PLANE_MAX)
        return fr_fail(c->ctx, FR_ERR_ARG, "layernorm_bwd: a 16-bit x has rows over %d values",
                       FR_HALF_PLANE_MAX);
    float *dx = fr_f32(&c->out[0]), *dgamma = fr_f32(&c->out[1]), *dbeta = fr_f32(&c->out[2]);
    if (D == 0) return FR_OK;
    if (!smean || !srstd)
        return fr_fail(c->ctx, FR_ERR_ARG, "layernorm_bwd: the saved mean and rstd are missing");
    const int acc_x = acc_bit(c, 0), acc_g = acc_bit(c, 1), acc_b = acc_bit(c, 2);

    if (dx) {
        /* groups of R rows; a 16-bit x widened into one buffer of R rows */
        const int R = D * LN_ROWS <= FR_HALF_PLANE_MAX ? LN_ROWS : 1;
        const int64_t groups = (N + R - 1) / R;
#pragma omp parallel for schedule(static) if (N * D >= NORM_PAR_MIN)
        for (int64_t gi = 0; gi < groups; gi++) {
            float rows[FR_HALF_PLANE_MAX];
            const int64_t n0 = gi * R;
            const int nr = N - n0 < R ? (int)(N - n0) : R;
            const float *xp[LN_ROWS], *dyp[LN_ROWS];
            for (int k = 0; k < nr; k++) {
                xp[k] = in_f32(xt, (n0 + k) * D, D, rows + k * D);
                dyp[k] = dy + (n0 + k) * D;
            }
            double sg[LN_ROWS], sgx[LN_ROWS]; /* sum g, sum g xhat */
            ln_bwd_sums(xp, dyp, gamma, smean + n0, srstd + n0, nr, D, sg, sgx);
            for (int k = 0; k < nr; k++) {
                const float mg = (float)(sg[k] / (double)D), mgx = (float)(sgx[k] / (double)D);
                ln_bwd_dx(xp[k], dyp[k], gamma, D, smean[n0 + k], srstd[n0 + k], mg, mgx, acc_x,
                          dx + (n0 + k) * D);
            }
        }
    }
    if (dgamma || dbeta) {
        /* columns in spans: one thread owns a span and sums the rows in order */
        const int64_t span =
            fr_col_span(D, N * D >= NORM_PAR_MIN ? omp_get_max_threads() : 1, LN_SPAN);
        const int64_t nblk = (D + span - 1) / span;
#pragma omp parallel for schedule(static) if (N * D >= NORM_PAR_MIN)
        for (int64_t bi = 0; bi < nblk; bi++) {
            double sg[LN_SPAN] = {0}, sb[LN_SPAN] = {0};
            const int64_t d0 = bi * span, w = D - d0 < span ? D - d0 : span;
            ln_bwd_cols(xt, dy, smean, srstd, N, D, d0, w, sg, sb);
            for (int64_t j = 0; j < w; j++) {
                if (dgamma) dgamma[d0 + j] = (float)(acc_g ? dgamma[d0 + j] + sg[j] : sg[j]);
                if (dbeta) dbeta[d0 + j] = (float)(acc_b ? dbeta[d0 + j] + sb[j] : sb[j]);
            }
        }
    }
    return FR_OK;
}
