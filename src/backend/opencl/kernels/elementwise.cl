/* elementwise.cl — the device side of elementwise.c: activations and their
 * backward, ADD, COPY, CAST, dropout, the position embedding's add, and the
 * step's gradient scaling. One work-item per element; every element is
 * computed alone, so an output may alias its input exactly, as on the CPU.
 *
 * The bits follow the CPU kernels (src/backend/cpu/activation.c, cast.c,
 * dropout.c, embedding.c, grad.c): the same float operations in the same
 * order, never contracted into fma (C11 on the host contracts nothing), the
 * 16-bit conversions of core/half.c in integer arithmetic, and dropout's
 * counter-based generator of core/rng.c in ulong. Only the library functions
 * (erf, exp, tanh) may differ from glibc's, within their specified ulp.
 *
 * Tensors are (buffer, element offset) pairs. A 16-bit tensor is passed as
 * the same buffer and read as ushort; `dt` codes: 0 f32, 1 f16, 2 bf16. */
#pragma OPENCL FP_CONTRACT OFF

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

/* element i of a tensor of dtype dt */
static float load(__global const float *p, ulong i, int dt) {
    if (dt == DT_F32) return p[i];
    ushort h = ((__global const ushort *)p)[i];
    return dt == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static void store(__global float *p, ulong i, int dt, float v) {
    if (dt == DT_F32) {
        p[i] = v;
        return;
    }
    ((__global ushort *)p)[i] = dt == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

/* ---- the activations (activation.c's formulas) ---- */

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f
#define SQRT_2_PI 0.79788456080286535588f
#define GELU_A 0.044715f

/* activation.c's gelu_tanh_f and gelu_tanh_grad, the same operations: the
 * tanh GELU as x sigma(2u), e^x the prelude's exp_poly (the CPU's) */
#define GELU_K2 -1.59576912160573071176f
static float gelu_tanh_grad(float v) {
    const float e = exp_poly(GELU_K2 * (v + GELU_A * v * v * v));
    const float s = 1.0f / (1.0f + e), om = e < 1.0f ? e * s : 1.0f - s;
    return s * (1.0f + 2.0f * SQRT_2_PI * v * (1.0f + 3.0f * GELU_A * v * v) * om);
}

/* Each activation's kernels, from its NAME_f(v) and NAME_g(d, v) below: one
 * set per formula, f32 apart from 16 bits (a kernel without branches
 * vectorizes across work-items):
 * NAME_fwd:   y[i] = F(v = x[i]), x and y f32;
 * NAME_fwd_h: the same with y f16 or bf16 (ydt; the f32 result rounded);
 * NAME_bwd:   dx[i] (+)= G(d = dy[i], v = s[i]), dy, s (the saved y, or x
 *             for GELU) and dx f32;
 * NAME_bwd_h: the same with s f16 or bf16 (sdt), widened exactly. */
#define ACTIVATION(NAME)                                                                          \
    __kernel void NAME##_fwd(ulong n, __global const float *x, ulong x_off, __global float *y,    \
                             ulong y_off) {                                                       \
        ulong i = get_global_id(0);                                                               \
        if (i >= n) return;                                                                       \
        float v = x[x_off + i];                                                                   \
        y[y_off + i] = NAME##_f(v);                                                               \
    }                                                                                             \
    __kernel void NAME##_fwd_h(ulong n, __global const float *x, ulong x_off, __global float *y,  \
                               ulong y_off, int ydt) {                                            \
        ulong i = get_global_id(0);                                                               \
        if (i >= n) return;                                                                       \
        float v = x[x_off + i];                                                                   \
        store(y, y_off + i, ydt, NAME##_f(v));                                                    \
    }                                                                                             \
    __kernel void NAME##_bwd(ulong n, __global const float *dy, ulong dy_off,                     \
                             __global const float *s, ulong s_off, __global float *dx,            \
                             ulong dx_off, int acc) {                                             \
        ulong i = get_global_id(0);                                                               \
        if (i >= n) return;                                                                       \
        float d = dy[dy_off + i], v = s[s_off + i];                                               \
        float g = NAME##_g(d, v);                                                                 \
        if (acc) g = dx[dx_off + i] + g;                                                          \
        dx[dx_off + i] = g;                                                                       \
    }                                                                                             \
    __kernel void NAME##_bwd_h(ulong n, __global const float *dy, ulong dy_off,                   \
                               __global const float *s, ulong s_off, int sdt, __global float *dx, \
                               ulong dx_off, int acc) {                                           \
        ulong i = get_global_id(0);                                                               \
        if (i >= n) return;                                                                       \
        float d = dy[dy_off + i], v = load(s, s_off + i, sdt);                                    \
        float g = NAME##_g(d, v);                                                                 \
        if (acc) g = dx[dx_off + i] + g;                                                          \
        dx[dx_off + i] = g;                                                                       \
    }

/* y = max(x, 0) (a NaN passes through); dx = dy where y > 0 */
static float relu_f(float v) { return v < 0.0f ? 0.0f : v; }
static float relu_g(float d, float v) { return v > 0.0f ? d : 0.0f; }

/* y = 0.5 x (1 + erf(x / sqrt 2)); dx = dy (Phi(x) + x phi(x)) */
static float gelu_erf_f(float v) { return 0.5f * v * (1.0f + erf(v * INV_SQRT2)); }
static float gelu_erf_g(float d, float v) {
    return d * (0.5f * (1.0f + erf(v * INV_SQRT2)) + v * INV_SQRT_2PI * exp(-0.5f * v * v));
}

/* y = x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))), the CPU's formula */
static float gelu_tanh_f(float v) {
    return v / (1.0f + exp_poly(GELU_K2 * (v + GELU_A * v * v * v)));
}
static float gelu_tanh_g(float d, float v) { return d * gelu_tanh_grad(v); }

/* y = 1 / (1 + exp(-x)); dx = dy y (1 - y) */
static float sigmoid_f(float v) { return 1.0f / (1.0f + exp(-v)); }
static float sigmoid_g(float d, float v) { return d * v * (1.0f - v); }

/* y = tanh(x), which rounds to +-1 in float from |x| = 9.02 on (PoCL's tanh
 * gives 1 - 2^-24 there, even at infinity); dx = dy (1 - y^2) */
static float tanh_f(float v) { return fabs(v) >= 9.1f ? copysign(1.0f, v) : tanh(v); }
static float tanh_g(float d, float v) { return d * (1.0f - v * v); }

ACTIVATION(relu)
ACTIVATION(gelu_erf)
ACTIVATION(gelu_tanh)
ACTIVATION(sigmoid)
ACTIVATION(tanh)

/* y = a + b */
__kernel void add_f32(ulong n, __global const float *a, ulong a_off, __global const float *b,
                      ulong b_off, __global float *y, ulong y_off) {
    ulong i = get_global_id(0);
    if (i < n) y[y_off + i] = a[a_off + i] + b[b_off + i];
}

/* y += x */
__kernel void acc_f32(ulong n, __global const float *x, ulong x_off, __global float *y,
                      ulong y_off) {
    ulong i = get_global_id(0);
    if (i < n) y[y_off + i] += x[x_off + i];
}

/* ---- CAST ---- */

/* y = x converted from dtype xdt to ydt (one of them f32, or both f32
 * with rdt the 16-bit format to round through) */
__kernel void cast(ulong n, __global const float *x, ulong x_off, int xdt, __global float *y,
                   ulong y_off, int ydt, int rdt) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    float v = load(x, x_off + i, xdt);
    if (rdt == DT_F16) v = f16_to_f32(f32_to_f16(v));
    if (rdt == DT_BF16) v = bf16_to_f32(f32_to_bf16(v));
    store(y, y_off + i, ydt, v);
}

/* y = round(widen(y) + x), x f32, y f16 or bf16 (a 16-bit gradient adding in) */
__kernel void cast_add(ulong n, __global const float *x, ulong x_off, __global float *y,
                       ulong y_off, int ydt) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    store(y, y_off + i, ydt, load(y, y_off + i, ydt) + x[x_off + i]);
}

/* ---- dropout: core/rng.c's splitmix64 chain ---- */

static ulong mix(ulong z) {
    z += 0x9e3779b97f4a7c15UL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9UL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebUL;
    return z ^ (z >> 31);
}

/* fr_rng_uniform(seed, stream, i) given mixed = mix(mix(seed) ^ stream),
 * which the host computes once */
static float uniform(ulong mixed, ulong i) {
    return (float)(mix(mixed ^ i) >> 40) * (1.0f / 16777216.0f);
}

/* training: keep_i = uniform >= p; y_i = keep_i ? x_i * scale : 0; mask_i = keep_i
 * (has_mask 0: no mask written) */
__kernel void dropout_fwd(ulong n, __global const float *x, ulong x_off, __global float *y,
                          ulong y_off, __global uchar *mask, ulong mask_off, int has_mask,
                          ulong mixed, float p, float scale) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    int keep = uniform(mixed, i) >= p;
    y[y_off + i] = keep ? x[x_off + i] * scale : 0.0f;
    if (has_mask) mask[mask_off + i] = (uchar)keep;
}

/* dx_i (+)= mask_i ? dy_i * scale : 0 */
__kernel void dropout_bwd(ulong n, __global const float *dy, ulong dy_off,
                          __global const uchar *mask, ulong mask_off, __global float *dx,
                          ulong dx_off, float scale, int acc) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    float g = mask[mask_off + i] ? dy[dy_off + i] * scale : 0.0f;
    dx[dx_off + i] = acc ? dx[dx_off + i] + g : g;
}

/* ---- position embedding ---- */

/* x, y (B,T,C), W (Tmax,C): y[r, j] = x[r, j] + W[r % T, j], r = b T + t */
__kernel void pos_embedding(ulong n, ulong T, ulong C, __global const float *x, ulong x_off,
                            __global const float *w, ulong w_off, __global float *y, ulong y_off) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong r = i / C, j = i - r * C;
    y[y_off + i] = x[x_off + i] + w[w_off + (r % T) * C + j];
}

/* ---- the step's gradient passes (grad.c) ---- */

/* g = g * f */
__kernel void scale_f32(ulong n, __global float *g, ulong g_off, float f) {
    ulong i = get_global_id(0);
    if (i < n) g[g_off + i] = g[g_off + i] * f;
}

/* g = g * f; *found = 1 when any value read is inf or NaN (every writer
 * writes the same 1, so the flag is the same whatever the order) */
__kernel void unscale_check_f32(ulong n, __global float *g, ulong g_off, float f,
                                __global int *found) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    float x = g[g_off + i];
    if (!(fabs(x) <= FLT_MAX)) *found = 1;
    g[g_off + i] = x * f;
}

/* The same on a 16-bit gradient (is_f16: f16, else bf16): widened, the f32
 * operation, rounded back (grad.c's chunks do the same per element). */
static float load_h(__global const ushort *g, ulong i, int is_f16) {
    return is_f16 ? f16_to_f32(g[i]) : bf16_to_f32(g[i]);
}
static ushort store_h(float x, int is_f16) { return is_f16 ? f32_to_f16(x) : f32_to_bf16(x); }

__kernel void scale_h(ulong n, __global ushort *g, ulong g_off, float f, int is_f16) {
    ulong i = get_global_id(0);
    if (i < n) g[g_off + i] = store_h(load_h(g, g_off + i, is_f16) * f, is_f16);
}

__kernel void unscale_check_h(ulong n, __global ushort *g, ulong g_off, float f,
                              __global int *found, int is_f16) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    float x = load_h(g, g_off + i, is_f16);
    if (!(fabs(x) <= FLT_MAX)) *found = 1;
    g[g_off + i] = store_h(x * f, is_f16);
}
