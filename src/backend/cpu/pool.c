/* pool.c — max, average and global average pooling, forward and backward.
 * Square windows (attr.kernel, attr.stride), no padding, floor mode. Every
 * loop runs over (n, c) planes, one plane per thread at a time, so gradients
 * of overlapping windows add up in a fixed order. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define POOL_PAR_MIN 16384

typedef fr_pool_dims pool_geom; /* x (..., H, W) as planes of H x W, y (..., OH, OW) */

/* A 16-bit x is widened a plane at a time on the stack (FR_HALF_PLANE_MAX). */
static int half_plane_ok(fr_kernel_call *c, const char *op, const fr_tensor *x,
                         const pool_geom *g) {
    if (x->dtype == FR_F32 || g->H * g->W <= FR_HALF_PLANE_MAX) return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG, "%s: a 16-bit input with planes over %d values", op,
                   FR_HALF_PLANE_MAX);
}

/* Offset (kh*W + kw) in the plane of the window's maximum: the first one in
 * row-major window order, as PyTorch's CPU kernel (a NaN wins, the last one). */
static int64_t window_argmax(const float *x, int64_t W, int64_t K) {
    int64_t best = 0;
    float m = x[0];
    for (int64_t kh = 0; kh < K; kh++)
        for (int64_t kw = 0; kw < K; kw++) {
            float v = x[kh * W + kw];
            if (v > m || isnan(v)) m = v, best = kh * W + kw;
        }
    return best;
}

/* 2x2 windows, the common case, without data-dependent branches (random
 * data would mispredict them every other window). Returns the position 0..3
 * in row-major order of the first maximum (the same rule: the first element
 * equal to the maximum is the one the strict > scan keeps). */
static inline int argmax2(float a, float b, float c, float d) {
    if (isnan(a) | isnan(b) | isnan(c) | isnan(d)) /* rare: the last NaN */
        return isnan(d) ? 3 : isnan(c) ? 2 : isnan(b) ? 1 : 0;
    float m = b > a ? b : a;
    m = c > m ? c : m;
    m = d > m ? d : m;
    const int n0 = a != m, n1 = b != m, n2 = c != m;
    return n0 * (1 + n1 * (1 + n2)); /* arithmetic, not branches */
}

/* g where cond holds, else +0, by masking the bits (no branch) */
static inline float keep_if(float g, int cond) {
    uint32_t u;
    memcpy(&u, &g, sizeof u);
    u &= -(uint32_t)(cond != 0);
    memcpy(&g, &u, sizeof g);
    return g;
}

/* max of a 2x2 window; NaN if any element is NaN (the rule's value) */
static inline float max2(float a, float b, float c, float d) {
    float m = b > a ? b : a;
    m = c > m ? c : m;
    m = d > m ? d : m;
    return isnan(a) | isnan(b) | isnan(c) | isnan(d) ? a + b + c + d : m;
}

/* 2x2 stride-2 windows with AVX-512: up to 16 windows of a row pair at a
 * time, the same comparisons as max2 and argmax2 on 16 lanes (so the same
 * bits); a group holding a NaN returns 0 and goes through the scalar code. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

static int pool512_ok(void) { return __builtin_cpu_supports("avx512f") != 0; }

/* the lanes of the 2n values of a row pair's n windows: the first 16, the rest */
static inline void row_masks(int n, __mmask16 *k0, __mmask16 *k1) {
    const int m2 = 2 * n;
    *k0 = m2 >= 16 ? 0xffff : (__mmask16)((1u << m2) - 1);
    *k1 = m2 <= 16 ? 0 : (__mmask16)((1u << (m2 - 16)) - 1);
}

/* the four corners of n <= 16 windows starting at r0, r1 (rows of 2n values) */
typedef struct corners {
    __m512 a, b, c, d;
    __mmask16 k;
} corners;

__attribute__((target("avx512f"))) static inline corners load_corners(const float *r0,
                                                                      const float *r1, int n) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __mmask16 k0, k1;
    row_masks(n, &k0, &k1);
    const __m512 x0 = _mm512_maskz_loadu_ps(k0, r0), x1 = _mm512_maskz_loadu_ps(k1, r0 + 16);
    const __m512 y0 = _mm512_maskz_loadu_ps(k0, r1), y1 = _mm512_maskz_loadu_ps(k1, r1 + 16);
    corners w = {_mm512_permutex2var_ps(x0, ev, x1), _mm512_permutex2var_ps(x0, od, x1),
                 _mm512_permutex2var_ps(y0, ev, y1), _mm512_permutex2var_ps(y0, od, y1),
                 n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1)};
    return w;
}

/* the same from a bf16 plane's rows (read as their exact f32 values,
 * fr_bf16_bits: x << 16), so that a bf16 x is not widened a plane first */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline corners
load_corners_bf(const uint16_t *r0, const uint16_t *r1, int n) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __mmask16 k0, k1;
    row_masks(n, &k0, &k1);
#define WIDEN_(k, p)     \
    _mm512_castsi512_ps( \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((k), (p))), 16))
    const __m512 x0 = WIDEN_(k0, r0), x1 = WIDEN_(k1, r0 + 16);
    const __m512 y0 = WIDEN_(k0, r1), y1 = WIDEN_(k1, r1 + 16);
#undef WIDEN_
    corners w = {_mm512_permutex2var_ps(x0, ev, x1), _mm512_permutex2var_ps(x0, od, x1),
                 _mm512_permutex2var_ps(y0, ev, y1), _mm512_permutex2var_ps(y0, od, y1),
                 n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1)};
    return w;
}

/* AVX512BW and VL too, for load_corners_bf's 16-bit masked loads */
static int pool512bw_ok(void) {
    return pool512_ok() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

/* m = max2's chain (b > a ? b : a, then c, then d); 0 when a lane holds a NaN */
__attribute__((target("avx512f"))) static inline int max_corners(const corners *w, __m512 *m) {
    const __mmask16 nan = _mm512_mask_cmp_ps_mask(w->k, w->a, w->b, _CMP_UNORD_Q) |
                          _mm512_mask_cmp_ps_mask(w->k, w->c, w->d, _CMP_UNORD_Q);
    if (nan) return 0;
    __m512 x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(w->b, w->a, _CMP_GT_OQ), w->a, w->b);
    x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(w->c, x, _CMP_GT_OQ), x, w->c);
    *m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(w->d, x, _CMP_GT_OQ), x, w->d);
    return 1;
}

/* y of n <= 16 windows from their corners (load_corners or load_corners_bf) */
__attribute__((target("avx512f"), always_inline)) static inline int max16w(corners w, float *y) {
    __m512 m;
    if (!max_corners(&w, &m)) return 0;
    _mm512_mask_storeu_ps(y, w.k, m);
    return 1;
}
__attribute__((target("avx512f"))) static int max16(const float *r0, const float *r1, int n,
                                                    float *y) {
    return max16w(load_corners(r0, r1, n), y);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static int
max16_bf(const uint16_t *r0, const uint16_t *r1, int n, float *y) {
    return max16w(load_corners_bf(r0, r1, n), y);
}

/* dx's 2n values of each row from dy's n (g): dy where the window's first
 * maximum is, +0 elsewhere (argmax2, keep_if); added into dx when acc */
__attribute__((target("avx512f"), always_inline)) static inline int
grad16w(corners w, const float *g, int n, float *d0, float *d1, int acc, int masked) {
    __m512 m;
    if (!max_corners(&w, &m)) return 0;
    const __mmask16 e0 = _mm512_cmp_ps_mask(w.a, m, _CMP_EQ_OQ);
    const __mmask16 e1 = _mm512_cmp_ps_mask(w.b, m, _CMP_EQ_OQ) & (__mmask16)~e0;
    const __mmask16 e2 = _mm512_cmp_ps_mask(w.c, m, _CMP_EQ_OQ) & (__mmask16) ~(e0 | e1);
    const __mmask16 e3 = (__mmask16) ~(e0 | e1 | e2);
    /* masked: +0 for a window whose maximum is not above 0 */
    const __mmask16 kg =
        masked ? _mm512_mask_cmp_ps_mask(w.k, m, _mm512_setzero_ps(), _CMP_GT_OQ) : w.k;
    const __m512 gv = _mm512_maskz_loadu_ps(kg, g);
    const __m512 v0 = _mm512_maskz_mov_ps(e0, gv), v1 = _mm512_maskz_mov_ps(e1, gv);
    const __m512 v2 = _mm512_maskz_mov_ps(e2, gv), v3 = _mm512_maskz_mov_ps(e3, gv);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    __mmask16 k0, k1;
    row_masks(n, &k0, &k1);
    __m512 o[4] = {_mm512_permutex2var_ps(v0, lo, v1), _mm512_permutex2var_ps(v0, hi, v1),
                   _mm512_permutex2var_ps(v2, lo, v3), _mm512_permutex2var_ps(v2, hi, v3)};
    float *dst[4] = {d0, d0 + 16, d1, d1 + 16};
    const __mmask16 ks[4] = {k0, k1, k0, k1};
    for (int i = 0; i < 4; i++) {
        if (acc) o[i] = _mm512_add_ps(_mm512_maskz_loadu_ps(ks[i], dst[i]), o[i]);
        _mm512_mask_storeu_ps(dst[i], ks[i], o[i]);
    }
    return 1;
}
__attribute__((target("avx512f"))) static int grad16(const float *r0, const float *r1,
                                                     const float *g, int n, float *d0, float *d1,
                                                     int acc, int masked) {
    return grad16w(load_corners(r0, r1, n), g, n, d0, d1, acc, masked);
}
#else /* no AVX-512 here: the scalar code only (these never run) */
static int pool512_ok(void) { return 0; }
static int pool512bw_ok(void) { return 0; }
static int max16(const float *r0, const float *r1, int n, float *y) {
    (void)r0, (void)r1, (void)n, (void)y;
    return 0;
}
static int max16_bf(const uint16_t *r0, const uint16_t *r1, int n, float *y) {
    (void)r0, (void)r1, (void)n, (void)y;
    return 0;
}
static int grad16(const float *r0, const float *r1, const float *g, int n, float *d0, float *d1,
                  int acc, int masked) {
    (void)r0, (void)r1, (void)g, (void)n, (void)d0, (void)d1, (void)acc, (void)masked;
    return 0;
}
#endif

/* ---- nChw16c operands (attr.blocked) ----------------------------------------
 * With any operand blocked, max pooling runs over blocks of 16 channels of
 * one image, a window position at a time on 16 lanes, each operand read or
 * written in its own layout: value (n, c, pos) of a blocked tensor of C
 * channels and hw positions is at ((n C/16 + c/16) hw + pos) 16 + c % 16,
 * of an NCHW one at (n C + c) hw + pos. Each lane makes the comparisons
 * of the NCHW loops above (max2, argmax2, the window scan) on the same
 * values, and 16-bit values are widened and rounded by the same
 * converters, so the bits are the NCHW call's. */
typedef struct lanes {
    const fr_tensor *t;
    int64_t lane, at; /* lane stride; the block's first value (position 0, lane 0) */
    int pos;          /* position stride: 16 blocked, 1 NCHW */
} lanes;

/* operand t (C channels, hw positions) at block b = n C/16 + c/16 */
static lanes lanes_of(const fr_tensor *t, int blk, int64_t b, int64_t hw) {
    lanes r = {t, blk ? 1 : hw, blk ? b * hw * 16 : b * 16 * hw, blk ? 16 : 1};
    return r;
}

/* the 16 lanes' values at position pos, as f32 */
static inline void ld16(const lanes *o, int64_t pos, float *v) {
    const int64_t at = o->at + pos * o->pos;
    if (o->t->dtype == FR_F32) {
        const float *s = (const float *)o->t->data + at;
        for (int l = 0; l < 16; l++) v[l] = s[l * o->lane];
        return;
    }
    uint16_t h[16];
    const uint16_t *s = (const uint16_t *)o->t->data + at;
    for (int l = 0; l < 16; l++) h[l] = s[l * o->lane];
    fr_half_to_f32_n_seq(h, v, 16, o->t->dtype == FR_F16);
}

/* the 16 lanes' values v at position pos (rounded when 16-bit); add: += (f32) */
static inline void st16(const lanes *o, int64_t pos, const float *v, int add) {
    const int64_t at = o->at + pos * o->pos;
    if (o->t->dtype == FR_F32) {
        float *d = (float *)o->t->data + at;
        if (add)
            for (int l = 0; l < 16; l++) d[l * o->lane] += v[l];
        else
            for (int l = 0; l < 16; l++) d[l * o->lane] = v[l];
        return;
    }
    uint16_t h[16];
    fr_f32_to_half_n_seq(v, h, 16, o->t->dtype == FR_F16);
    uint16_t *d = (uint16_t *)o->t->data + at;
    for (int l = 0; l < 16; l++) d[l * o->lane] = h[l];
}

static int blk_channels(fr_kernel_call *c, const char *op, int64_t C) {
    return C % 16
               ? fr_fail(c->ctx, FR_ERR_SHAPE, "%s: nChw16c operands with C %lld", op, (long long)C)
               : FR_OK;
}

/* two rows of blocked x from value at (2 W 16 values) as f32: x's own, or
 * widened into xr */
static inline const float *x_rows(const fr_tensor *x, int64_t at, int64_t W, float *xr) {
    if (x->dtype == FR_F32) return (const float *)x->data + at;
    fr_half_to_f32_n_seq((const uint16_t *)x->data + at, xr, (size_t)(2 * W * 16),
                         x->dtype == FR_F16);
    return xr;
}

/* Whether the row loops below take g: 2x2 windows of stride 2 whose two
 * rows of x (xr) and row of y or dy (yr, dr) fit their stack buffers */
static int rows_2x2(const pool_geom *g) {
    return g->K == 2 && g->S == 2 && 2 * g->W * 16 <= FR_HALF_PLANE_MAX &&
           g->OW * 16 <= FR_HALF_OUT_PLANE_MAX;
}

/* The common case on its own: 2x2 windows of stride 2, x blocked (f32 or
 * bf16), a row of windows at a time. Two rows of x (widened into xr when
 * bf16, 2 W 16 floats) make y's row of OW x 16 lanes (in yr unless y is a
 * blocked f32 tensor), then stored: rounded by one conversion of the row
 * when 16-bit, scattered to 16 planes when NCHW. */
FR_V3_CLONES static void max_rows_2x2(const fr_tensor *x, const fr_tensor *y, int by, int64_t b,
                                      const pool_geom *g, float *xr, float *yr) {
    const int64_t W = g->W, H = g->H, OH = g->OH, OW = g->OW;
    const int64_t xb = b * H * W * 16;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *r0 = x_rows(x, xb + 2 * oh * W * 16, W, xr), *r1 = r0 + W * 16;
        const int direct = by && y->dtype == FR_F32;
        float *o = direct ? (float *)y->data + (b * OH + oh) * OW * 16 : yr;
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *a = r0 + 2 * ow * 16, *c = r1 + 2 * ow * 16;
            float *d = o + ow * 16;
#pragma omp simd
            for (int l = 0; l < 16; l++) d[l] = max2(a[l], a[16 + l], c[l], c[16 + l]);
        }
        if (direct) continue;
        if (by) { /* blocked 16-bit: one row, contiguous */
            fr_f32_to_half_n_seq(yr, (uint16_t *)y->data + (b * OH + oh) * OW * 16,
                                 (size_t)(OW * 16), y->dtype == FR_F16);
            continue;
        }
        const int64_t plane = OH * OW, at = b * 16 * plane + oh * OW; /* NCHW: 16 planes */
        if (y->dtype == FR_F32) {
            float *yd = (float *)y->data + at;
            for (int l = 0; l < 16; l++)
                for (int64_t ow = 0; ow < OW; ow++) yd[l * plane + ow] = yr[ow * 16 + l];
        } else {
            uint16_t h[16];
            uint16_t *yd = (uint16_t *)y->data + at;
            for (int64_t ow = 0; ow < OW; ow++) {
                fr_f32_to_half_n_seq(yr + ow * 16, h, 16, y->dtype == FR_F16);
                for (int l = 0; l < 16; l++) yd[l * plane + ow] = h[l];
            }
        }
    }
}

static int maxpool_blocked(fr_kernel_call *c, const pool_geom *g, int bx, int by) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, K = g->K, S = g->S;
    const int64_t blocks = g->planes / 16;
    if (bx && rows_2x2(g)) {
#pragma omp parallel for schedule(static) if (g->planes * H * W >= POOL_PAR_MIN)
        for (int64_t b = 0; b < blocks; b++) {
            float xr[FR_HALF_PLANE_MAX], yr[FR_HALF_OUT_PLANE_MAX];
            max_rows_2x2(&c->in[0], &c->out[0], by, b, g, xr, yr);
        }
        return FR_OK;
    }
#pragma omp parallel for schedule(static) if (g->planes * H * W >= POOL_PAR_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        const lanes x = lanes_of(&c->in[0], bx, b, H * W), y = lanes_of(&c->out[0], by, b, OH * OW);
        float m[16], v[16], q[16], r[16];
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t at = oh * S * W + ow * S;
                ld16(&x, at, m);
                if (K == 2) { /* max2, as the NCHW loop */
                    ld16(&x, at + 1, v), ld16(&x, at + W, q), ld16(&x, at + W + 1, r);
                    for (int l = 0; l < 16; l++) m[l] = max2(m[l], v[l], q[l], r[l]);
                } else { /* window_argmax's scan */
                    for (int64_t k = 1; k < K * K; k++) {
                        ld16(&x, at + (k / K) * W + k % K, v);
                        for (int l = 0; l < 16; l++)
                            if (v[l] > m[l] || isnan(v[l])) m[l] = v[l];
                    }
                }
                st16(&y, oh * OW + ow, m, 0);
            }
    }
    return FR_OK;
}

/* The common case's backward: 2x2 windows of stride 2, x and dx blocked
 * (x f32 or bf16, widened two rows at a time into xr), dy blocked or NCHW
 * (its row of OW x 16 lanes gathered into dr); the writes of the NCHW loop,
 * a window's four values, the positions in no window cleared. */
FR_V3_CLONES static void grad_rows_2x2(const fr_tensor *dyt, const fr_tensor *x, float *dx, int bdy,
                                       int64_t b, const pool_geom *g, int acc, int masked,
                                       float *xr, float *dr) {
    const int64_t W = g->W, H = g->H, OH = g->OH, OW = g->OW;
    const int64_t xb = b * H * W * 16;
    const float *dy = (const float *)dyt->data;
    for (int64_t oh = 0; oh < OH; oh++) {
        const float *r0 = x_rows(x, xb + 2 * oh * W * 16, W, xr), *r1 = r0 + W * 16, *gy = dr;
        if (bdy) {
            gy = dy + (b * OH + oh) * OW * 16;
        } else {
            const int64_t plane = OH * OW, at = b * 16 * plane + oh * OW;
            for (int l = 0; l < 16; l++)
                for (int64_t ow = 0; ow < OW; ow++) dr[ow * 16 + l] = dy[at + l * plane + ow];
        }
        float *d0 = dx + xb + 2 * oh * W * 16, *d1 = d0 + W * 16;
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *a = r0 + 2 * ow * 16, *c = r1 + 2 * ow * 16, *gv = gy + ow * 16;
            float *e0 = d0 + 2 * ow * 16, *e1 = d1 + 2 * ow * 16;
#pragma omp simd
            for (int l = 0; l < 16; l++) {
                const int j = argmax2(a[l], a[16 + l], c[l], c[16 + l]);
                const float xm = j == 0 ? a[l] : j == 1 ? a[16 + l] : j == 2 ? c[l] : c[16 + l];
                const float gr = masked && !(xm > 0.0f) ? 0.0f : gv[l];
                const float v0 = keep_if(gr, j == 0), v1 = keep_if(gr, j == 1);
                const float v2 = keep_if(gr, j == 2), v3 = keep_if(gr, j == 3);
                if (acc) e0[l] += v0, e0[16 + l] += v1, e1[l] += v2, e1[16 + l] += v3;
                else e0[l] = v0, e0[16 + l] = v1, e1[l] = v2, e1[16 + l] = v3;
            }
        }
        if (!acc && W > 2 * OW) /* floor mode: the last column is in no window */
            for (int64_t w = 2 * OW; w < W; w++)
                for (int l = 0; l < 16; l++) d0[w * 16 + l] = d1[w * 16 + l] = 0.0f;
    }
    if (!acc && H > 2 * OH)
        memset(dx + xb + 2 * OH * W * 16, 0, (size_t)((H - 2 * OH) * W * 16) * sizeof(float));
}

static int maxpool_bwd_blocked(fr_kernel_call *c, const pool_geom *g, int bdy, int bx, int bdx,
                               int acc, int masked) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, K = g->K, S = g->S;
    const int64_t blocks = g->planes / 16;
    static const float zero[16];
    if (bx && bdx && rows_2x2(g)) {
#pragma omp parallel for schedule(static) if (g->planes * H * W >= POOL_PAR_MIN)
        for (int64_t b = 0; b < blocks; b++) {
            float xr[FR_HALF_PLANE_MAX], dr[FR_HALF_OUT_PLANE_MAX];
            grad_rows_2x2(&c->in[0], &c->in[1], fr_f32(&c->out[0]), bdy, b, g, acc, masked, xr, dr);
        }
        return FR_OK;
    }
#pragma omp parallel for schedule(static) if (g->planes * H * W >= POOL_PAR_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        const lanes dy = lanes_of(&c->in[0], bdy, b, OH * OW),
                    x = lanes_of(&c->in[1], bx, b, H * W), dx = lanes_of(&c->out[0], bdx, b, H * W);
        float a[4][16], gy[16], d[4][16];
        const int disjoint = K == 2 && S == 2;
        if (!acc && (!disjoint || H > 2 * OH || W > 2 * OW)) /* positions in no window */
            for (int64_t i = 0; i < H * W; i++) st16(&dx, i, zero, 0);
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t at = oh * S * W + ow * S;
                ld16(&dy, oh * OW + ow, gy);
                if (disjoint) { /* argmax2 and the four writes, as the NCHW loop */
                    const int64_t p[4] = {at, at + 1, at + W, at + W + 1};
                    for (int k = 0; k < 4; k++) ld16(&x, p[k], a[k]);
                    for (int l = 0; l < 16; l++) {
                        const int j = argmax2(a[0][l], a[1][l], a[2][l], a[3][l]);
                        const float gr = masked && !(a[j][l] > 0.0f) ? 0.0f : gy[l];
                        for (int k = 0; k < 4; k++) d[k][l] = keep_if(gr, j == k);
                    }
                    for (int k = 0; k < 4; k++) st16(&dx, p[k], d[k], acc);
                    continue;
                }
                /* window_argmax per lane, then dx at it += dy (or 0, masked) */
                float best[16];
                int64_t where[16];
                ld16(&x, at, best);
                for (int l = 0; l < 16; l++) where[l] = at;
                for (int64_t k = 1; k < K * K; k++) {
                    const int64_t p = at + (k / K) * W + k % K;
                    ld16(&x, p, a[0]);
                    for (int l = 0; l < 16; l++)
                        if (a[0][l] > best[l] || isnan(a[0][l])) best[l] = a[0][l], where[l] = p;
                }
                for (int l = 0; l < 16; l++) {
                    float *o = (float *)dx.t->data + dx.at + where[l] * dx.pos + l * dx.lane;
                    *o += masked && !(best[l] > 0.0f) ? 0.0f : gy[l];
                }
            }
    }
    return FR_OK;
}

// x is (N,C,H,W), y is (N,C,OH,OW); y[n,c,oh,ow] = max_{kh,kw} x[n,c,oh*S+kh,ow*S+kw]
// (x and y each NCHW or nChw16c: attr.blocked)
int fr_k_maxpool2d(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "maxpool2d", &c->in[0].shape, &c->out[0].shape, &g);
    if (st || (st = half_plane_ok(c, "maxpool2d", &c->in[0], &g))) return st;
    const int half_out = c->out[0].dtype != FR_F32;
    if (half_out && g.OH * g.OW > FR_HALF_OUT_PLANE_MAX)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "maxpool2d: a 16-bit output needs planes of at most %d "
                       "values, got %lld",
                       FR_HALF_OUT_PLANE_MAX, (long long)(g.OH * g.OW));
    const int bx = c->node && fr_blk_in(&c->node->attr, 0),
              by = c->node && fr_blk_out(&c->node->attr, 0);
    if (bx || by)
        return (st = blk_channels(c, "maxpool2d", c->out[0].shape.d[1]))
                   ? st
                   : maxpool_blocked(c, &g, bx, by);
    float *y = fr_f32(&c->out[0]);
    const int64_t H = g.H, W = g.W, OH = g.OH, OW = g.OW, K = g.K, S = g.S;
    const int v512 = pool512_ok();
    /* a bf16 x of 2x2 stride-2 windows is read as it is (load_corners_bf) */
    const uint16_t *xbf = c->in[0].dtype == FR_BF16 && K == 2 && S == 2 && pool512bw_ok()
                              ? (const uint16_t *)c->in[0].data
                              : NULL;
#pragma omp parallel for schedule(static) if (g.planes * H * W >= POOL_PAR_MIN)
    for (int64_t p = 0; p < g.planes; p++) {
        float buf[FR_HALF_PLANE_MAX], obuf[FR_HALF_OUT_PLANE_MAX];
        if (xbf) { /* 16 windows at once; a group with a NaN or the row's tail by max2 */
            const uint16_t *xq = xbf + p * H * W;
            float *yp = half_out ? obuf : y + p * OH * OW;
            for (int64_t oh = 0; oh < OH; oh++) {
                const uint16_t *q0 = xq + 2 * oh * W, *q1 = q0 + W;
                float *yr = yp + oh * OW;
                for (int64_t ow = 0; ow < OW; ow++) {
                    if (ow % 16 == 0) {
                        const int n = OW - ow < 16 ? (int)(OW - ow) : 16;
                        if (max16_bf(q0 + 2 * ow, q1 + 2 * ow, n, yr + ow)) {
                            ow += n - 1;
                            continue;
                        }
                    }
                    const int64_t i = 2 * ow;
                    yr[ow] = max2(fr_bf16_bits(q0[i]), fr_bf16_bits(q0[i + 1]), fr_bf16_bits(q1[i]),
                                  fr_bf16_bits(q1[i + 1]));
                }
            }
            if (half_out) out_store(&c->out[0], p * OH * OW, obuf, OH * OW);
            continue;
        }
        const float *xp = in_f32(&c->in[0], p * H * W, H * W, buf);
        /* a 16-bit output plane is made in f32 and rounded: each value is
         * one of the inputs, so exact when they are 16-bit too */
        float *yp = half_out ? obuf : y + p * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *row = xp + oh * S * W;
            float *yr = yp + oh * OW;
            if (K == 2)
                for (int64_t ow = 0; ow < OW; ow++) {
                    if (v512 && S == 2 && ow % 16 == 0) { /* 16 windows at once */
                        const int n = OW - ow < 16 ? (int)(OW - ow) : 16;
                        if (max16(row + 2 * ow, row + 2 * ow + W, n, yr + ow)) {
                            ow += n - 1;
                            continue;
                        }
                    }
                    const float *r0 = row + ow * S, *r1 = r0 + W;
                    yr[ow] = max2(r0[0], r0[1], r1[0], r1[1]);
                }
            else
                for (int64_t ow = 0; ow < OW; ow++) {
                    const float *win = row + ow * S;
                    yr[ow] = win[window_argmax(win, W, K)];
                }
        }
        if (half_out) out_store(&c->out[0], p * OH * OW, obuf, OH * OW);
    }
    return FR_OK;
}

// dy is (N,C,OH,OW), x is (N,C,H,W) (the max is found again in x), dx is (N,C,H,W)
// dx[n,c,h,w] = sum of dy over the windows whose first maximum is (h,w);
// attr.masked: and 0 where x[n,c,h,w] <= 0 (or NaN), ReLU's backward after
// it (x = ReLU's y: relu_bwd's v > 0 ? d : 0 on this dx), in the same bits
// (dy, x and dx each NCHW or nChw16c: attr.blocked)
int fr_k_maxpool2d_bwd(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "maxpool2d_bwd", &c->in[1].shape, &c->in[0].shape, &g);
    if (st || (st = half_plane_ok(c, "maxpool2d_bwd", &c->in[1], &g))) return st;
    const float *dy = fr_f32(&c->in[0]);
    float *dx = fr_f32(&c->out[0]);
    if (!dx) return FR_OK;
    const int acc = acc_bit(c, 0), v512 = pool512_ok(), masked = c->node && c->node->attr.masked;
    const int bdy = c->node && fr_blk_in(&c->node->attr, 0),
              bx = c->node && fr_blk_in(&c->node->attr, 1),
              bdx = c->node && fr_blk_out(&c->node->attr, 0);
    if (bdy || bx || bdx)
        return (st = blk_channels(c, "maxpool2d_bwd", c->out[0].shape.d[1]))
                   ? st
                   : maxpool_bwd_blocked(c, &g, bdy, bx, bdx, acc, masked);
    const int64_t H = g.H, W = g.W, OH = g.OH, OW = g.OW, K = g.K, S = g.S;
#pragma omp parallel for schedule(static) if (g.planes * H * W >= POOL_PAR_MIN)
    for (int64_t p = 0; p < g.planes; p++) {
        float buf[FR_HALF_PLANE_MAX];
        const float *xp = in_f32(&c->in[1], p * H * W, H * W, buf), *dyp = dy + p * OH * OW;
        float *dxp = dx + p * H * W;
        if (K == 2 && S == 2) { /* disjoint windows: write each one whole, no clearing pass */
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *r0 = xp + 2 * oh * W, *r1 = r0 + W, *dyr = dyp + oh * OW;
                float *d0 = dxp + 2 * oh * W, *d1 = d0 + W;
                for (int64_t ow = 0; ow < OW; ow++) {
                    const int64_t i = 2 * ow;
                    if (v512 && ow % 16 == 0) { /* 16 windows at once */
                        const int n = OW - ow < 16 ? (int)(OW - ow) : 16;
                        if (grad16(r0 + i, r1 + i, dyr + ow, n, d0 + i, d1 + i, acc, masked)) {
                            ow += n - 1;
                            continue;
                        }
                    }
                    const int j = argmax2(r0[i], r0[i + 1], r1[i], r1[i + 1]);
                    const float xm = j < 2 ? r0[i + j] : r1[i + j - 2];
                    const float gr = masked && !(xm > 0.0f) ? 0.0f : dyr[ow];
                    const float v0 = keep_if(gr, j == 0), v1 = keep_if(gr, j == 1);
                    const float v2 = keep_if(gr, j == 2), v3 = keep_if(gr, j == 3);
                    if (acc) d0[i] += v0, d0[i + 1] += v1, d1[i] += v2, d1[i + 1] += v3;
                    else d0[i] = v0, d0[i + 1] = v1, d1[i] = v2, d1[i + 1] = v3;
                }
                if (!acc && W > 2 * OW) /* floor mode: the last column is in no window */
                    for (int64_t w = 2 * OW; w < W; w++) d0[w] = d1[w] = 0.0f;
            }
            if (!acc && H > 2 * OH)
                memset(dxp + 2 * OH * W, 0, (size_t)((H - 2 * OH) * W) * sizeof(float));
            continue;
        }
        if (!acc) memset(dxp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t oh = 0; oh < OH; oh++) {
            const int64_t base = oh * S * W;
            const float *dyr = dyp + oh * OW;
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t b = base + ow * S, at = b + window_argmax(xp + b, W, K);
                dxp[at] += masked && !(xp[at] > 0.0f) ? 0.0f : dyr[ow];
            }
        }
    }
    return FR_OK;
}

// x is (N,C,H,W), y is (N,C,OH,OW); y[n,c,oh,ow] = mean_{kh,kw} x[n,c,oh*S+kh,ow*S+kw]
int fr_k_avgpool2d(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "avgpool2d", &c->in[0].shape, &c->out[0].shape, &g);
    if (st) return st;
    const float *x = fr_f32(&c->in[0]);
    float *y = fr_f32(&c->out[0]);
    const float inv = 1.0f / (float)(g.K * g.K);
#pragma omp parallel for schedule(static) if (g.planes * g.H * g.W >= POOL_PAR_MIN)
    for (int64_t p = 0; p < g.planes; p++) {
        const float *xp = x + p * g.H * g.W;
        float *yp = y + p * g.OH * g.OW;
        for (int64_t oh = 0; oh < g.OH; oh++)
            for (int64_t ow = 0; ow < g.OW; ow++) {
                const float *win = xp + oh * g.S * g.W + ow * g.S;
                float s = 0.0f;
                for (int64_t kh = 0; kh < g.K; kh++)
                    for (int64_t kw = 0; kw < g.K; kw++) s += win[kh * g.W + kw];
                yp[oh * g.OW + ow] = s * inv;
            }
    }
    return FR_OK;
}

// dy is (N,C,OH,OW), dx is (N,C,H,W) (its shape is the forward input's)
// dx[n,c,h,w] = sum over the windows holding (h,w) of dy / (K*K)
int fr_k_avgpool2d_bwd(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "avgpool2d_bwd", &c->out[0].shape, &c->in[0].shape, &g);
    if (st) return st;
    const float *dy = fr_f32(&c->in[0]);
    float *dx = fr_f32(&c->out[0]);
    if (!dx) return FR_OK;
    const float inv = 1.0f / (float)(g.K * g.K);
    int acc = acc_bit(c, 0);
#pragma omp parallel for schedule(static) if (g.planes * g.H * g.W >= POOL_PAR_MIN)
    for (int64_t p = 0; p < g.planes; p++) {
        const float *dyp = dy + p * g.OH * g.OW;
        float *dxp = dx + p * g.H * g.W;
        if (!acc) memset(dxp, 0, (size_t)(g.H * g.W) * sizeof(float));
        for (int64_t oh = 0; oh < g.OH; oh++)
            for (int64_t ow = 0; ow < g.OW; ow++) {
                float v = dyp[oh * g.OW + ow] * inv;
                float *win = dxp + oh * g.S * g.W + ow * g.S;
                for (int64_t kh = 0; kh < g.K; kh++)
                    for (int64_t kw = 0; kw < g.K; kw++) win[kh * g.W + kw] += v;
            }
    }
    return FR_OK;
}

// x is (N,C,H,W), y is (N,C); y[n,c] = mean_{h,w} x[n,c,h,w]
int fr_k_global_avgpool(fr_kernel_call *c) {
    const fr_shape *xs = &c->in[0].shape;
    if (xs->ndim != 4 || fr_shape_numel(&c->out[0].shape) != xs->d[0] * xs->d[1])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "global_avgpool: input must be (N,C,H,W), output (N,C)");
    const int64_t planes = xs->d[0] * xs->d[1], hw = xs->d[2] * xs->d[3];
    const float *x = fr_f32(&c->in[0]);
    float *y = fr_f32(&c->out[0]);
    /* nChw16c (attr.blocked): plane p's values 16 apart in its block's run;
     * each summed in the same order as in NCHW, so the same bits */
    const int blk = fr_blk_in(&c->node->attr, 0);
    if (blk && xs->d[1] % 16)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "global_avgpool: nChw16c with C %lld",
                       (long long)xs->d[1]);
#pragma omp parallel for schedule(static) if (planes * hw >= POOL_PAR_MIN)
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = blk ? x + (p - p % 16) * hw + p % 16 : x + p * hw;
        const int64_t step = blk ? 16 : 1;
        double s = 0.0;
        for (int64_t i = 0; i < hw; i++) s += xp[i * step];
        y[p] = hw ? (float)(s / (double)hw) : 0.0f;
    }
    return FR_OK;
}

// dy is (N,C), dx is (N,C,H,W); dx[n,c,h,w] = dy[n,c] / (H*W)
int fr_k_global_avgpool_bwd(fr_kernel_call *c) {
    const fr_shape *xs = &c->out[0].shape;
    if (xs->ndim != 4 || fr_shape_numel(&c->in[0].shape) != xs->d[0] * xs->d[1])
        return fr_fail(c->ctx, FR_ERR_SHAPE, "global_avgpool_bwd: dy must be (N,C), dx (N,C,H,W)");
    const int64_t planes = xs->d[0] * xs->d[1], hw = xs->d[2] * xs->d[3];
    const float *dy = fr_f32(&c->in[0]);
    float *dx = fr_f32(&c->out[0]);
    if (!dx || hw == 0) return FR_OK;
    int acc = acc_bit(c, 0);
    const int blk = fr_blk_out(&c->node->attr, 0); /* nChw16c, as the forward's x */
    if (blk && xs->d[1] % 16)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "global_avgpool_bwd: nChw16c with C %lld",
                       (long long)xs->d[1]);
    const int64_t step = blk ? 16 : 1;
#pragma omp parallel for schedule(static) if (planes * hw >= POOL_PAR_MIN)
    for (int64_t p = 0; p < planes; p++) {
        float v = dy[p] / (float)hw, *dxp = blk ? dx + (p - p % 16) * hw + p % 16 : dx + p * hw;
        if (acc)
            for (int64_t i = 0; i < hw; i++) dxp[i * step] += v;
        else
            for (int64_t i = 0; i < hw; i++) dxp[i * step] = v;
    }
    return FR_OK;
}
