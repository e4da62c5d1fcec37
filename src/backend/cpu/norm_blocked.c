/* norm_blocked.c — BatchNorm (2d) forward and backward on nChw16c tensors
 * (attr.blocked, plan/layout.h): x (N, C/16, H W, 16), a lane per channel.
 * The per-channel sums are those of norm.c in another order: each image's
 * plane is summed in f32 (four interleaved partial sums a lane), images are
 * added in double over 16 fixed chunks of the batch, and the chunks in
 * order, so the bits depend on neither the thread count nor the schedule
 * (they differ from the NCHW kernel's in the last places). x f32 or bf16;
 * y f32, or f16/bf16 rounded from the stack. */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/norm_blocked.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"
#include "plan/layout.h"

#define CH 16     /* channels a block */
#define CHUNKS 16 /* fixed chunks of the batch for the sums */
#define MAX_BLK (FR_LAYOUT_MAX_C / CH)
#define Y_RUN 64 /* positions of a 16-bit y made in f32 on the stack, then rounded */

static inline float sq(float d) { return d * d; }

/* One image's plane of block b (HW positions of CH lanes at p): per lane
 * the f32 sum over positions of f(position), four interleaved partial sums
 * (positions i = 0, 1, 2, 3 mod 4) added as (s0 + s1) + (s2 + s3). */
#define PLANE_SUMS(out, body)                                                               \
    do {                                                                                    \
        float s0[CH] = {0}, s1[CH] = {0}, s2[CH] = {0}, s3[CH] = {0};                       \
        int64_t i = 0;                                                                      \
        for (; i + 4 <= HW; i += 4) {                                                       \
            _Pragma("omp simd") for (int l = 0; l < CH; l++) {                              \
                s0[l] += body(i, l);                                                        \
                s1[l] += body(i + 1, l);                                                    \
                s2[l] += body(i + 2, l);                                                    \
                s3[l] += body(i + 3, l);                                                    \
            }                                                                               \
        }                                                                                   \
        for (int64_t r = 0; i < HW; i++, r++) {                                             \
            float *sr = r == 0 ? s0 : r == 1 ? s1 : s2;                                     \
            _Pragma("omp simd") for (int l = 0; l < CH; l++) sr[l] += body(i, l);           \
        }                                                                                   \
        for (int l = 0; l < CH; l++) out[l] += (double)((s0[l] + s1[l]) + (s2[l] + s3[l])); \
    } while (0)

/* Two f32 sums a lane at once, in PLANE_SUMS's order each */
#define PLANE_SUMS2(outa, bodya, outb, bodyb)                                                 \
    do {                                                                                      \
        float a0[CH] = {0}, a1[CH] = {0}, a2[CH] = {0}, a3[CH] = {0};                         \
        float b0[CH] = {0}, b1[CH] = {0}, b2[CH] = {0}, b3[CH] = {0};                         \
        int64_t i = 0;                                                                        \
        for (; i + 4 <= HW; i += 4) {                                                         \
            _Pragma("omp simd") for (int l = 0; l < CH; l++) {                                \
                a0[l] += bodya(i, l), b0[l] += bodyb(i, l);                                   \
                a1[l] += bodya(i + 1, l), b1[l] += bodyb(i + 1, l);                           \
                a2[l] += bodya(i + 2, l), b2[l] += bodyb(i + 2, l);                           \
                a3[l] += bodya(i + 3, l), b3[l] += bodyb(i + 3, l);                           \
            }                                                                                 \
        }                                                                                     \
        for (int64_t r = 0; i < HW; i++, r++) {                                               \
            float *sa = r == 0 ? a0 : r == 1 ? a1 : a2, *sb = r == 0 ? b0 : r == 1 ? b1 : b2; \
            _Pragma("omp simd") for (int l = 0; l < CH; l++) {                                \
                sa[l] += bodya(i, l), sb[l] += bodyb(i, l);                                   \
            }                                                                                 \
        }                                                                                     \
        for (int l = 0; l < CH; l++) {                                                        \
            outa[l] += (double)((a0[l] + a1[l]) + (a2[l] + a3[l]));                           \
            outb[l] += (double)((b0[l] + b1[l]) + (b2[l] + b3[l]));                           \
        }                                                                                     \
    } while (0)

/* Per lane of block b, the backward's sums over chunk k (images N k /
 * CHUNKS ..): part[(b CHUNKS + k) CH + l] of dy, part2 there of dy (x - m),
 * x f32 or bf16 (xbf). chunk_one makes item it = b CHUNKS + k; it and the
 * loops below are cloned for the CPU's widest vectors (FR_V3_CLONES): every
 * sum runs along one lane in a fixed order, so each clone gives the same
 * bits. */
FR_V3_CLONES static void chunk_one(const void *xv, int xbf, const float *dy, int64_t N, int64_t CB,
                                   int64_t HW, const float *m, int64_t it, double *part,
                                   double *part2) {
    const int64_t b = it / CHUNKS, k = it % CHUNKS;
    double acc[CH] = {0}, acc2[CH] = {0};
    const float *mb = m + b * CH;
    for (int64_t n = N * k / CHUNKS; n < N * (k + 1) / CHUNKS; n++) {
        const int64_t base = (n * CB + b) * HW * CH;
        const float *x = xbf ? NULL : (const float *)xv + base, *g = dy + base;
        const uint16_t *xh = xbf ? (const uint16_t *)xv + base : NULL;
#define DY_(i, l) g[(i)*CH + (l)]
#define DYX_(i, l) (g[(i)*CH + (l)] * (x[(i)*CH + (l)] - mb[l]))
#define DYXH_(i, l) (g[(i)*CH + (l)] * (fr_bf16_bits(xh[(i)*CH + (l)]) - mb[l]))
        if (xbf) PLANE_SUMS2(acc, DY_, acc2, DYXH_);
        else PLANE_SUMS2(acc, DY_, acc2, DYX_);
#undef DY_
#undef DYX_
#undef DYXH_
    }
    for (int l = 0; l < CH; l++) part[it * CH + l] = acc[l], part2[it * CH + l] = acc2[l];
}

/* the mean of n values of sum s split in two floats, hi + lo */
static void split_mean(double s, int64_t n, float *hi, float *lo) {
    const double m = n ? s / (double)n : 0.0;
    *hi = (float)m, *lo = (float)(m - *hi);
}

/* The statistics of item it = b CHUNKS + k with one read of the chunk from
 * memory: per lane its sum S (PLANE_SUMS of x, into part), then, over the
 * chunk again while it is in cache (8 images of a block of 28x28 at batch
 * 128: 400 KB), the sums of d = (x - c_hi) - c_lo (into part2) and of d^2
 * (part3) about the chunk's own mean c = S / n (split_mean). stats() adds
 * the chunks up, shifted to the batch's mean. */
FR_V3_CLONES static void chunk_stats_one(const void *xv, int xbf, int64_t N, int64_t CB, int64_t HW,
                                         int64_t it, double *part, double *part2, double *part3) {
    const int64_t b = it / CHUNKS, k = it % CHUNKS;
    const int64_t n0 = N * k / CHUNKS, n1 = N * (k + 1) / CHUNKS;
    double s[CH] = {0}, d[CH] = {0}, q[CH] = {0};
    float mh[CH], ml[CH];
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t n = n0; n < n1; n++) {
            const int64_t base = (n * CB + b) * HW * CH;
            const float *x = xbf ? NULL : (const float *)xv + base;
            const uint16_t *xh = xbf ? (const uint16_t *)xv + base : NULL;
#define X_(i, l) x[(i)*CH + (l)]
#define XH_(i, l) fr_bf16_bits(xh[(i)*CH + (l)])
#define DEV_(i, l) ((x[(i)*CH + (l)] - mh[l]) - ml[l])
#define DEVH_(i, l) ((fr_bf16_bits(xh[(i)*CH + (l)]) - mh[l]) - ml[l])
#define DEV2_(i, l) sq(DEV_(i, l))
#define DEV2H_(i, l) sq(DEVH_(i, l))
            if (pass == 0 && xbf) PLANE_SUMS(s, XH_);
            else if (pass == 0) PLANE_SUMS(s, X_);
            else if (xbf) PLANE_SUMS2(d, DEVH_, q, DEV2H_);
            else PLANE_SUMS2(d, DEV_, q, DEV2_);
#undef X_
#undef XH_
#undef DEV_
#undef DEVH_
#undef DEV2_
#undef DEV2H_
        }
        if (pass == 0)
            for (int l = 0; l < CH; l++) split_mean(s[l], (n1 - n0) * HW, &mh[l], &ml[l]);
    }
    for (int l = 0; l < CH; l++) {
        part[it * CH + l] = s[l];
        part2[it * CH + l] = d[l];
        part3[it * CH + l] = q[l];
    }
}

/* Channel c's mean and variance from its chunks, in order: mean = sum S / n;
 * n var = sum over chunks of Q + 2 (c - mean) D + m (c - mean)^2, where a
 * chunk of m values has mean c (split_mean of its S, as chunk_stats_one
 * used), D = sum (x - c) and Q = sum (x - c)^2 (expand (x - c + c - mean)^2) */
static void stats(const double *part, const double *part2, const double *part3, int64_t c,
                  int64_t N, int64_t HW, double *mean, double *var) {
    const int64_t b = c / CH, l = c % CH, cnt = N * HW;
    double s = 0.0, m2 = 0.0;
    for (int k = 0; k < CHUNKS; k++) s += part[(b * CHUNKS + k) * CH + l];
    *mean = cnt ? s / (double)cnt : 0.0;
    for (int k = 0; k < CHUNKS; k++) {
        const int64_t i = (b * CHUNKS + k) * CH + l,
                      m = (N * (k + 1) / CHUNKS - N * k / CHUNKS) * HW;
        float hi, lo;
        split_mean(part[i], m, &hi, &lo);
        const double dc = ((double)hi + (double)lo) - *mean;
        m2 += part3[i] + 2.0 * dc * part2[i] + (double)m * dc * dc;
    }
    *var = cnt ? m2 / (double)cnt : 0.0;
}

static void chunk_sums(const void *xv, int xbf, const float *dy, int64_t N, int64_t CB, int64_t HW,
                       const float *m, double *part, double *part2) {
#pragma omp parallel for schedule(static) if (N * CB * HW * CH >= 16384)
    for (int64_t it = 0; it < CB * CHUNKS; it++)
        chunk_one(xv, xbf, dy, N, CB, HW, m, it, part, part2);
}

/* The chunks of channel c = b CH + l, in order. */
static double total(const double *part, int64_t c) {
    const int64_t b = c / CH, l = c % CH;
    double s = 0.0;
    for (int k = 0; k < CHUNKS; k++) s += part[(b * CHUNKS + k) * CH + l];
    return s;
}

/* y of image and block it = n CB + b: ((x - m_hi) - m_lo) scale + shift,
 * then where relu y < lo ? 0 : y (norm.c's plane_affine, fr_relu_lo) */
FR_V3_CLONES static void bn_y_block(fr_kernel_call *c, const void *x, int xbf, float *y, int y16,
                                    int relu, float lo, int64_t HW, int64_t it, int64_t b,
                                    const float *m_hi, const float *m_lo, const float *scale,
                                    const float *shift) {
    const float *mh = m_hi + b * CH, *ml = m_lo + b * CH, *sc = scale + b * CH,
                *sh = shift + b * CH;
    const float *xp = xbf ? NULL : (const float *)x + it * HW * CH;
    const uint16_t *xq = xbf ? (const uint16_t *)x + it * HW * CH : NULL;
    float yb[Y_RUN * CH];
    for (int64_t i0 = 0; i0 < HW; i0 += Y_RUN) {
        const int64_t i1 = i0 + Y_RUN < HW ? i0 + Y_RUN : HW;
        /* position i's lanes at yp + (i - i0) CH: the run's stack, or y itself */
        float *yp = y16 ? yb : y + (it * HW + i0) * CH;
        for (int64_t i = i0; i < i1; i++) {
            float xs[CH];
            if (xbf) {
#pragma omp simd
                for (int l = 0; l < CH; l++) xs[l] = fr_bf16_bits(xq[i * CH + l]);
            } else {
#pragma omp simd
                for (int l = 0; l < CH; l++) xs[l] = xp[i * CH + l];
            }
#pragma omp simd
            for (int l = 0; l < CH; l++)
                yp[(i - i0) * CH + l] = ((xs[l] - mh[l]) - ml[l]) * sc[l] + sh[l];
            if (relu) {
#pragma omp simd
                for (int l = 0; l < CH; l++) {
                    const float v = yp[(i - i0) * CH + l];
                    yp[(i - i0) * CH + l] = v < lo ? 0.0f : v;
                }
            }
        }
        if (y16) out_store(&c->out[0], (it * HW + i0) * CH, yb, (i1 - i0) * CH);
    }
}

int fr_k_batchnorm_blocked(fr_kernel_call *c, int64_t N, int64_t C, int64_t HW) {
    const fr_attr *a = &c->node->attr;
    const int xbf = c->in[0].dtype == FR_BF16;
    if (C % CH || C > FR_LAYOUT_MAX_C || (c->in[0].dtype != FR_F32 && !xbf))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "batchnorm: an nChw16c input needs f32 or bf16 and C a multiple of 16 up "
                       "to %d",
                       FR_LAYOUT_MAX_C);
    const void *x = c->in[0].data;
    const float *gamma = fr_f32(&c->in[1]), *beta = fr_f32(&c->in[2]);
    float *rmean = fr_f32(&c->in[3]), *rvar = fr_f32(&c->in[4]);
    float *y = fr_f32(&c->out[0]), *smean = fr_f32(&c->out[1]), *sinv = fr_f32(&c->out[2]);
    const int y16 = c->out[0].dtype != FR_F32; /* rounded Y_RUN positions at a time */
    const int64_t CB = C / CH, cnt = N * HW;
    const double eps = a->eps, mom = a->momentum;
    float m_hi[FR_LAYOUT_MAX_C], m_lo[FR_LAYOUT_MAX_C], scale[FR_LAYOUT_MAX_C],
        shift[FR_LAYOUT_MAX_C];
    static_assert(MAX_BLK * CHUNKS * CH <= 8192, "the sums' stack");
    double part[MAX_BLK * CHUNKS * CH], part2[MAX_BLK * CHUNKS * CH], part3[MAX_BLK * CHUNKS * CH];
    double mean[FR_LAYOUT_MAX_C], var[FR_LAYOUT_MAX_C];
    if (a->training) {
#pragma omp parallel for schedule(static) if (N * CB * HW * CH >= 16384)
        for (int64_t it = 0; it < CB * CHUNKS; it++)
            chunk_stats_one(x, xbf, N, CB, HW, it, part, part2, part3);
        for (int64_t ch = 0; ch < C; ch++)
            stats(part, part2, part3, ch, N, HW, &mean[ch], &var[ch]);
    } else {
        for (int64_t ch = 0; ch < C; ch++) mean[ch] = rmean[ch], var[ch] = rvar[ch];
    }
    for (int64_t ch = 0; ch < C; ch++) {
        const double invstd = 1.0 / sqrt(var[ch] + eps);
        if (a->training) {
            if (smean) smean[ch] = (float)mean[ch];
            if (sinv) sinv[ch] = (float)invstd;
            /* a recomputed clone (rematerialization) leaves the running stats alone */
            if (rmean && !a->recompute)
                rmean[ch] = (float)((1.0 - mom) * rmean[ch] + mom * mean[ch]);
            if (rvar && !a->recompute)
                rvar[ch] = (float)((1.0 - mom) * rvar[ch] +
                                   mom * var[ch] * (double)cnt / (double)(cnt - 1));
        }
        m_hi[ch] = (float)mean[ch], m_lo[ch] = (float)(mean[ch] - m_hi[ch]);
        scale[ch] = (float)((gamma ? gamma[ch] : 1.0) * invstd);
        shift[ch] = beta ? beta[ch] : 0.0f;
    }
#pragma omp parallel for schedule(static) if (N * C * HW >= 16384)
    for (int64_t it = 0; it < N * CB; it++)
        bn_y_block(c, x, xbf, y, y16, a->relu, fr_relu_lo(c->out[0].dtype), HW, it, it % CB, m_hi,
                   m_lo, scale, shift);
    return FR_OK;
}

/* dx of image and block it = n CB + b: k (dy - mdy - (x - m) q), or added */
FR_V3_CLONES static void bn_dx_block(const fr_tensor *x, int xbf, const float *dy, float *dx,
                                     int acc_x, int64_t HW, int64_t it, int64_t b, const float *m,
                                     const float *k, const float *mdy, const float *q) {
    const int64_t o = it * HW * CH;
    const float *mb = m + b * CH, *kb = k + b * CH, *db = mdy + b * CH, *qb = q + b * CH;
    const float *xf = xbf ? NULL : (const float *)x->data + o;
    const uint16_t *xh = xbf ? (const uint16_t *)x->data + o : NULL;
    const float *dyp = dy + o;
    float *dxp = dx + o;
    for (int64_t i = 0; i < HW * CH; i += CH) {
        float xs[CH], v[CH];
        if (xbf) {
#pragma omp simd
            for (int l = 0; l < CH; l++) xs[l] = fr_bf16_bits(xh[i + l]);
        } else {
#pragma omp simd
            for (int l = 0; l < CH; l++) xs[l] = xf[i + l];
        }
#pragma omp simd
        for (int l = 0; l < CH; l++) v[l] = kb[l] * (dyp[i + l] - db[l] - (xs[l] - mb[l]) * qb[l]);
        if (acc_x) {
#pragma omp simd
            for (int l = 0; l < CH; l++) dxp[i + l] += v[l];
        } else {
#pragma omp simd
            for (int l = 0; l < CH; l++) dxp[i + l] = v[l];
        }
    }
}

int fr_k_batchnorm_bwd_blocked(fr_kernel_call *c, int64_t N, int64_t C, int64_t HW) {
    const fr_tensor *x = &c->in[1];
    if (C % CH || C > FR_LAYOUT_MAX_C || (x->dtype != FR_F32 && x->dtype != FR_BF16))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "batchnorm_bwd: an nChw16c input needs f32 or bf16 x and C a multiple "
                       "of 16 up to %d",
                       FR_LAYOUT_MAX_C);
    const float *dy = fr_f32(&c->in[0]), *gamma = fr_f32(&c->in[2]);
    const float *smean = fr_f32(&c->in[3]), *sinv = fr_f32(&c->in[4]);
    float *dx = fr_f32(&c->out[0]), *dgamma = fr_f32(&c->out[1]), *dbeta = fr_f32(&c->out[2]);
    const int xbf = x->dtype == FR_BF16;
    const int64_t CB = C / CH, cnt = N * HW;
    const int acc_x = acc_bit(c, 0), acc_g = acc_bit(c, 1), acc_b = acc_bit(c, 2);
    float k[FR_LAYOUT_MAX_C], mdy[FR_LAYOUT_MAX_C], q[FR_LAYOUT_MAX_C];
    double part[MAX_BLK * CHUNKS * CH], part2[MAX_BLK * CHUNKS * CH];
    chunk_sums(x->data, xbf, dy, N, CB, HW, smean, part, part2);
    for (int64_t ch = 0; ch < C; ch++) {
        const double inv = sinv[ch], sdy = total(part, ch), sdyx = total(part2, ch);
        const double dg = sdyx * inv; /* sum dy xhat */
        if (dgamma) dgamma[ch] = (float)(acc_g ? dgamma[ch] + dg : dg);
        if (dbeta) dbeta[ch] = (float)(acc_b ? dbeta[ch] + sdy : sdy);
        /* dx = k (dy - mdy - (x - mean) inv^2 mdyx), k = gamma inv */
        k[ch] = (float)((gamma ? gamma[ch] : 1.0) * inv);
        mdy[ch] = cnt ? (float)(sdy / (double)cnt) : 0.0f;
        q[ch] = cnt ? (float)(sdyx / (double)cnt * inv * inv) : 0.0f;
    }
    if (!dx || cnt == 0) return FR_OK;
#pragma omp parallel for schedule(static) if (N * C * HW >= 16384)
    for (int64_t it = 0; it < N * CB; it++)
        bn_dx_block(x, xbf, dy, dx, acc_x, HW, it, it % CB, smean, k, mdy, q);
    return FR_OK;
}
