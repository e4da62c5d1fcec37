/* activation.c — elementwise activations (ReLU, GELU exact or tanh, sigmoid, tanh),
 * their backward, and the residual ADD. Every loop reads element i before it
 * writes element i and touches nothing else, so an output may alias its
 * input exactly (y = x, dx = dy, y = a; vector lanes keep that true): the
 * planner runs these in place. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include "backend/cpu/exp_poly.h"
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define ACT_PAR_MIN 32768
#define ACT_CHUNK 2048 /* a 16-bit saved value is widened this many at a time */

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f
#define SQRT_2_PI 0.79788456080286535588f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* The tanh GELU as x sigma(2u): 0.5 (1 + tanh u) = 1 / (1 + e^-2u), u =
 * sqrt(2/pi) (x + 0.044715 x^3), so one exponential (fr_exp_poly, which
 * vectorizes in `omp simd` loops where libm's calls would not) and one
 * division a value, and no cancellation where tanh nears -1 (tanh's
 * 1 - 2 / (e^2u + 1) also needed a second polynomial near u = 0). GELU_K2 =
 * -2 sqrt(2/pi). */
#define GELU_K2 -1.59576912160573071176f
static inline float gelu_tanh_f(float v) {
    return v / (1.0f + fr_exp_poly(GELU_K2 * (v + GELU_A * v * v * v)));
}

/* d/dx of the tanh GELU: s + x s (1 - s) 2 u', s = 1 / (1 + e), e = e^-2u,
 * u' = sqrt(2/pi) (1 + 3 0.044715 x^2); 1 - s is e s while s > 1/2 (no
 * cancellation as s nears 1), else 1 - s itself (e may be inf there) */
static inline float gelu_tanh_grad(float v) {
    const float e = fr_exp_poly(GELU_K2 * (v + GELU_A * v * v * v));
    const float s = 1.0f / (1.0f + e), om = e < 1.0f ? e * s : 1.0f - s;
    return s * (1.0f + 2.0f * SQRT_2_PI * v * (1.0f + 3.0f * GELU_A * v * v) * om);
}

/* Elementwise forward: y[i] = F(x[i]); y f32, or f16/bf16 (the f32 result
 * rounded, a chunk at a time: mixed precision's saved output, made here
 * instead of by a CAST after); with an f32 y, out[1] where bound (ReLU's
 * fr_op_info.half_copy) y rounded, a chunk at a time. */
/* clang-format cannot lay out the _Pragma lines of these two macros. */
// clang-format off
#define UNARY(name, op, F)                                                  \
    int name(fr_kernel_call *c) {                                           \
        int64_t n;                                                          \
        int st = fr_kcheck_same_numel(c, op, &n);                           \
        if (st) return st;                                                  \
        const float *x = fr_f32(&c->in[0]);                                 \
        if (c->out[0].dtype != FR_F32) {                                    \
            const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;            \
            _Pragma("omp parallel for schedule(static) if (n >= ACT_PAR_MIN)") \
            for (int64_t b = 0; b < nch; b++) {                             \
                float buf[ACT_CHUNK];                                       \
                const int64_t o = b * ACT_CHUNK;                            \
                const int64_t m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;    \
                _Pragma("omp simd")                                         \
                for (int64_t i = 0; i < m; i++) {                           \
                    float v = x[o + i];                                     \
                    buf[i] = (F);                                           \
                }                                                           \
                out_store(&c->out[0], o, buf, m);                           \
            }                                                               \
            return FR_OK;                                                   \
        }                                                                   \
        float *y = fr_f32(&c->out[0]);                                      \
        const fr_tensor *h = fr_kcopy16(c);                                 \
        if (h) { /* and y rounded into out[1], a chunk at a time */         \
            if ((st = fr_kcheck_copy16(c, op))) return st;                  \
            const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;            \
            _Pragma("omp parallel for schedule(static) if (n >= ACT_PAR_MIN)") \
            for (int64_t b = 0; b < nch; b++) {                             \
                const int64_t o = b * ACT_CHUNK;                            \
                const int64_t m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;    \
                _Pragma("omp simd")                                         \
                for (int64_t i = o; i < o + m; i++) {                       \
                    float v = x[i];                                         \
                    y[i] = (F);                                             \
                }                                                           \
                out_store(h, o, y + o, m);                                  \
            }                                                               \
            return FR_OK;                                                   \
        }                                                                   \
        _Pragma("omp parallel for simd schedule(static) if (n >= ACT_PAR_MIN)") \
        for (int64_t i = 0; i < n; i++) {                                   \
            float v = x[i];                                                 \
            y[i] = (F);                                                     \
        }                                                                   \
        return FR_OK;                                                       \
    }

/* Elementwise backward: dx[i] (+)= G(d = dy[i], v = s[i]), s the saved y or x
 * (f32, or f16/bf16 widened a chunk at a time on the stack). */
#define BINARY_BWD(name, op, G)                                                    \
    int name(fr_kernel_call *c) {                                                  \
        int64_t n;                                                                 \
        int st = fr_kcheck_same_numel(c, op, &n);                                  \
        if (st) return st;                                                         \
        if (fr_shape_numel(&c->in[1].shape) != n)                                  \
            return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: saved input has %lld elements, dy %lld", \
                           op, (long long)fr_shape_numel(&c->in[1].shape), (long long)n);  \
        const float *dy = fr_f32(&c->in[0]), *s = fr_f32(&c->in[1]);               \
        float *dx = fr_f32(&c->out[0]);                                            \
        if (!dx) return FR_OK;                                                     \
        if (c->in[0].dtype != FR_F32 || c->out[0].dtype != FR_F32)                 \
            return fr_fail(c->ctx, FR_ERR_ARG, "%s: dy and dx must be f32", op);    \
        if (c->in[1].dtype != FR_F32) {                                            \
            const int acc = acc_bit(c, 0);                                         \
            const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;                   \
            _Pragma("omp parallel for schedule(static) if (n >= ACT_PAR_MIN)")     \
            for (int64_t b = 0; b < nch; b++) {                                    \
                float buf[ACT_CHUNK];                                              \
                const int64_t o = b * ACT_CHUNK;                                   \
                const int64_t m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;           \
                const float *sv = in_f32(&c->in[1], o, m, buf);                    \
                const float *dyo = dy + o;                                         \
                float *dxo = dx + o;                                               \
                if (acc) {                                                         \
                    _Pragma("omp simd")                                            \
                    for (int64_t i = 0; i < m; i++) {                              \
                        float v = sv[i], d = dyo[i];                               \
                        dxo[i] += (G);                                             \
                    }                                                              \
                } else {                                                           \
                    _Pragma("omp simd")                                            \
                    for (int64_t i = 0; i < m; i++) {                              \
                        float v = sv[i], d = dyo[i];                               \
                        dxo[i] = (G);                                              \
                    }                                                              \
                }                                                                  \
            }                                                                      \
            return FR_OK;                                                          \
        }                                                                          \
        if (acc_bit(c, 0)) {                                                       \
            _Pragma("omp parallel for simd schedule(static) if (n >= ACT_PAR_MIN)") \
            for (int64_t i = 0; i < n; i++) {                                      \
                float v = s[i], d = dy[i];                                         \
                dx[i] += (G);                                                      \
            }                                                                      \
        } else {                                                                   \
            _Pragma("omp parallel for simd schedule(static) if (n >= ACT_PAR_MIN)") \
            for (int64_t i = 0; i < n; i++) {                                      \
                float v = s[i], d = dy[i];                                         \
                dx[i] = (G);                                                       \
            }                                                                      \
        }                                                                          \
        return FR_OK;                                                              \
    }

// clang-format on

// dx = dy where y > 0, else 0
BINARY_BWD(fr_k_relu_bwd, "relu_bwd", v > 0.0f ? d : 0.0f)

/* static: the formulas sit behind fr_k_relu and fr_k_gelu (clang-format
 * misreads a macro after static) */
// clang-format off
// y = max(x, 0)
static UNARY(relu_f32, "relu", v < 0.0f ? 0.0f : v) /* a NaN passes through */

// y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))   (exact GELU, PyTorch approximate='none')
static UNARY(gelu_erf, "gelu", 0.5f * v * (1.0f + erff(v * INV_SQRT2)))
// dx = dy * (Phi(x) + x phi(x)), phi(x) = exp(-x^2/2) / sqrt(2 pi)
static BINARY_BWD(gelu_erf_bwd, "gelu_bwd",
                  d * (0.5f * (1.0f + erff(v * INV_SQRT2)) + v * INV_SQRT_2PI * expf(-0.5f * v * v)))

// y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)   (GPT-2's, approximate='tanh')
static UNARY(gelu_tanh, "gelu", gelu_tanh_f(v))
// dx = dy * gelu_tanh_grad(x)
static BINARY_BWD(gelu_tanh_bwd, "gelu_bwd", d * gelu_tanh_grad(v))

/* The tanh GELU on f32 spans, cloned for AVX-512 and AVX2 (FR_V3_CLONES): the same IEEE
 * operations in wider lanes (C11 mode contracts nothing into FMAs), so the
 * same bits as the generic loops above, which serve 16-bit operands. y may
 * be x, dx may be dy (each element is read before it is written). */
#define GELU_SPAN 8192
FR_V3_CLONES static void gelu_tanh_span(const float *x, float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = gelu_tanh_f(v);
    }
}
FR_V3_CLONES static void gelu_tanh_bwd_span(const float *dy, const float *x, float *dx, int64_t n,
                                            int acc) {
    if (acc) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * gelu_tanh_grad(x[i]);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    }
}

static int f32_call(const fr_kernel_call *c, int n_in) {
    for (int j = 0; j < n_in; j++)
        if (c->in[j].dtype != FR_F32) return 0;
    return c->out[0].dtype == FR_F32;
}

/* The tanh GELU of a 16-bit x by table. x takes one of 2^16 values, so
 * gelu_tanh_span of each (widened exactly, as in_f32 widens) and dy's
 * factor gelu_tanh_grad(x) are made once per process and format, on first
 * use, and a call looks them up: the bits of the f32 loops on the widened
 * x by construction (a 16-bit y is the f32 one rounded by out_store, as
 * there; dx = dy g is their one multiply), for a load a value instead of an
 * exponential and a division. A 16-bit y is looked up too, rounded when
 * the table is made (r: out_store's bits in the low half of 32, the width
 * a gather loads), so the call neither writes nor rounds an f32 y. 768 KiB
 * a format of the library's static data, like its code, not the arena's. */
#define GELU_TAB 65536
typedef struct gelu_tab {
    float y[GELU_TAB], g[GELU_TAB];
    uint32_t r[GELU_TAB];
} gelu_tab;
static gelu_tab g_gelu[2]; /* bf16, f16 */
static pthread_once_t g_gelu_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void gelu_tab_make(int f16) {
    gelu_tab *t = &g_gelu[f16];
    for (int o = 0; o < GELU_TAB; o += ACT_CHUNK) {
        uint16_t h[ACT_CHUNK];
        float one[ACT_CHUNK], *x = t->g + o; /* the widened x, then the gradient in place */
        for (int i = 0; i < ACT_CHUNK; i++) h[i] = (uint16_t)(o + i), one[i] = 1.0f;
        fr_half_to_f32_n_seq(h, x, ACT_CHUNK, f16);
        gelu_tanh_span(x, t->y + o, ACT_CHUNK);
        gelu_tanh_bwd_span(one, x, x, ACT_CHUNK, 0); /* 1 grad(x): grad(x) exactly */
        fr_f32_to_half_n_seq(t->y + o, h, ACT_CHUNK, f16); /* out_store's rounding */
        for (int i = 0; i < ACT_CHUNK; i++) t->r[o + i] = h[i];
    }
}
static void gelu_tab_bf16(void) { gelu_tab_make(0); }
static void gelu_tab_f16(void) { gelu_tab_make(1); }

/* The tables of 16-bit format dt */
static const gelu_tab *gelu_tab_of(fr_dtype dt) {
    const int f16 = dt == FR_F16;
    pthread_once(&g_gelu_once[f16], f16 ? gelu_tab_f16 : gelu_tab_bf16);
    return &g_gelu[f16];
}

/* y[i] = tab[x[i]] (f32 or 16-bit y), and dx[i] (+)= dy[i] g[x[i]]: AVX2
 * and AVX-512 gathers where they run (FR_V3_CLONES) */
FR_V3_CLONES static void lookup_span(const uint16_t *x, const float *tab, float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = tab[x[i]];
}
FR_V3_CLONES static void lookup16_span(const uint16_t *x, const uint32_t *tab, uint16_t *y,
                                       int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = (uint16_t)tab[x[i]];
}
FR_V3_CLONES static void lookup_bwd_span(const float *dy, const uint16_t *x, const float *g,
                                         float *dx, int64_t n, int acc) {
    if (acc) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * g[x[i]];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * g[x[i]];
    }
}

/* The same spans for mixed precision, ACT_CHUNK values at a time on the
 * stack: a 16-bit x (a bf16 GEMM's output, or the saved x) widened first,
 * the f32 result rounded into a 16-bit y (the saved output, or the next
 * GEMM's operand); the bits of the generic loops on the widened x, faster.
 * A 16-bit x is looked up instead (gelu_tab). */
static int gelu_tanh_half(fr_kernel_call *c, int64_t n) { /* x, y: f32 or 16 bits */
    const int out16 = c->out[0].dtype != FR_F32;
    const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;
    const gelu_tab *t = c->in[0].dtype != FR_F32 ? gelu_tab_of(c->in[0].dtype) : NULL;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t b = 0; b < nch; b++) {
        float buf[ACT_CHUNK], ybuf[ACT_CHUNK];
        const int64_t o = b * ACT_CHUNK, m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;
        const uint16_t *xh = t ? (const uint16_t *)c->in[0].data + o : NULL;
        if (t && out16) { /* y rounded, looked up (a value read before written: y may be x) */
            lookup16_span(xh, t->r, (uint16_t *)c->out[0].data + o, m);
            continue;
        }
        float *y = out16 ? ybuf : fr_f32(&c->out[0]) + o;
        if (t) /* a 16-bit x: y looked up (a chunk read before written: y may be x) */
            lookup_span(xh, t->y, y, m);
        else
            gelu_tanh_span(in_f32(&c->in[0], o, m, buf), y, m);
        if (out16) out_store(&c->out[0], o, ybuf, m);
    }
    return FR_OK;
}
/* dy and x f32 or 16 bits (widened: dy a bf16 GEMM's dx, rounded_bwd in
 * plan/precision.c), dx f32 or 16 bits (rounded: the dy of a bf16 GEMM,
 * never added into) */
static int gelu_tanh_bwd_half(fr_kernel_call *c, int64_t n) {
    const int acc = acc_bit(c, 0), out16 = c->out[0].dtype != FR_F32;
    if (out16 && acc) return fr_fail(c->ctx, FR_ERR_ARG, "gelu_bwd: a 16-bit dx cannot be added into");
    const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;
    const gelu_tab *t = c->in[1].dtype != FR_F32 ? gelu_tab_of(c->in[1].dtype) : NULL;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t b = 0; b < nch; b++) {
        float buf[ACT_CHUNK], dbuf[ACT_CHUNK], dybuf[ACT_CHUNK];
        const int64_t o = b * ACT_CHUNK, m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;
        float *dx = out16 ? dbuf : fr_f32(&c->out[0]) + o;
        const float *dy = in_f32(&c->in[0], o, m, dybuf);
        if (t) /* a 16-bit x: its gradient looked up */
            lookup_bwd_span(dy, (const uint16_t *)c->in[1].data + o, t->g, dx, m, acc);
        else
            gelu_tanh_bwd_span(dy, in_f32(&c->in[1], o, m, buf), dx, m, acc);
        if (out16) out_store(&c->out[0], o, dbuf, m);
    }
    return FR_OK;
}

// attr.approx picks the formula: 0 exact, 1 tanh
int fr_k_gelu(fr_kernel_call *c) {
    if (!(c->node && c->node->attr.approx)) return gelu_erf(c);
    int64_t n;
    if (fr_kcheck_same_numel(c, "gelu", &n)) return gelu_tanh(c);
    if (!f32_call(c, 1)) return gelu_tanh_half(c, n);
    const float *x = fr_f32(&c->in[0]);
    float *y = fr_f32(&c->out[0]);
    const int64_t spans = (n + GELU_SPAN - 1) / GELU_SPAN;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t b = 0; b < spans; b++) {
        const int64_t o = b * GELU_SPAN;
        gelu_tanh_span(x + o, y + o, n - o < GELU_SPAN ? n - o : GELU_SPAN);
    }
    return FR_OK;
}
int fr_k_gelu_bwd(fr_kernel_call *c) {
    if (!(c->node && c->node->attr.approx)) return gelu_erf_bwd(c);
    int64_t n;
    if (!fr_f32(&c->out[0]) || fr_kcheck_same_numel(c, "gelu_bwd", &n) ||
        fr_shape_numel(&c->in[1].shape) != n)
        return gelu_tanh_bwd(c); /* (its errors, or no dx) */
    if (!f32_call(c, 2)) return gelu_tanh_bwd_half(c, n);
    const float *dy = fr_f32(&c->in[0]), *x = fr_f32(&c->in[1]);
    float *dx = fr_f32(&c->out[0]);
    const int acc = acc_bit(c, 0);
    const int64_t spans = (n + GELU_SPAN - 1) / GELU_SPAN;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t b = 0; b < spans; b++) {
        const int64_t o = b * GELU_SPAN;
        gelu_tanh_bwd_span(dy + o, x + o, dx + o, n - o < GELU_SPAN ? n - o : GELU_SPAN, acc);
    }
    return FR_OK;
}
// clang-format on

/* ReLU on a 16-bit x (the mixed-precision pass makes ReLU read its input
 * rounded where every reader of y reads y rounded: max(round x, 0) is
 * round(max(x, 0)), rounding being monotone with round(0) = 0, bit for bit
 * but for a negative x that rounds to -0, which stays -0: fr_relu_lo):
 * on the bits (fr_relu16); y 16-bit of x's format, or f32. y may be x. */
static int relu_half(fr_kernel_call *c, int64_t n) {
    const uint16_t *x = c->in[0].data;
    const int f16 = c->in[0].dtype == FR_F16;
    if (c->out[0].dtype == c->in[0].dtype) {
        uint16_t *y = c->out[0].data;
#pragma omp parallel for simd schedule(static) if (n >= ACT_PAR_MIN)
        for (int64_t i = 0; i < n; i++) y[i] = fr_relu16(x[i], f16);
        return FR_OK;
    }
    if (c->out[0].dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG, "relu: a %s x with a %s y",
                       fr_dtype_name(c->in[0].dtype), fr_dtype_name(c->out[0].dtype));
    float *y = fr_f32(&c->out[0]);
    const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t b = 0; b < nch; b++) {
        const int64_t o = b * ACT_CHUNK, m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;
        fr_half_to_f32_n_seq(x + o, y + o, (size_t)m, f16);
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[o + i] = y[o + i] < 0.0f ? 0.0f : y[o + i];
    }
    return FR_OK;
}

// y = max(x, 0): relu_f32, or relu_half for a 16-bit x
int fr_k_relu(fr_kernel_call *c) {
    if (c->in[0].dtype == FR_F32) return relu_f32(c);
    if (fr_kcopy16(c))
        return fr_fail(c->ctx, FR_ERR_ARG, "relu: a 16-bit copy of y from a %s x",
                       fr_dtype_name(c->in[0].dtype));
    int64_t n;
    int st = fr_kcheck_same_numel(c, "relu", &n);
    return st ? st : relu_half(c, n);
}

// y = 1 / (1 + exp(-x))
UNARY(fr_k_sigmoid, "sigmoid", 1.0f / (1.0f + expf(-v)))
// dx = dy * y (1 - y)
BINARY_BWD(fr_k_sigmoid_bwd, "sigmoid_bwd", d *v *(1.0f - v))

// y = tanh(x)
UNARY(fr_k_tanh, "tanh", tanhf(v))
// dx = dy * (1 - y^2)
BINARY_BWD(fr_k_tanh_bwd, "tanh_bwd", d *(1.0f - v * v))

// a, b, y all the same shape; y = a + b (y may alias a or b); out[1], where
// the mixed-precision pass binds it (fr_op_info.half_copy), y rounded to
// 16 bits, a chunk at a time while it is in cache
int fr_k_add(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_add(c, &n);
    if (st) return st;
    const float *a = fr_f32(&c->in[0]), *b = fr_f32(&c->in[1]);
    float *y = fr_f32(&c->out[0]);
    const fr_tensor *h = fr_kcopy16(c);
    if (!h) {
#pragma omp parallel for simd schedule(static) if (n >= ACT_PAR_MIN)
        for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
        return FR_OK;
    }
    const int64_t nch = (n + ACT_CHUNK - 1) / ACT_CHUNK;
#pragma omp parallel for schedule(static) if (n >= ACT_PAR_MIN)
    for (int64_t k = 0; k < nch; k++) {
        const int64_t o = k * ACT_CHUNK, m = n - o < ACT_CHUNK ? n - o : ACT_CHUNK;
#pragma omp simd
        for (int64_t i = o; i < o + m; i++) y[i] = a[i] + b[i];
        out_store(h, o, y + o, m);
    }
    return FR_OK;
}
