/* optim.cl — the optimizer updates of src/backend/cpu/optim.c on the device,
 * one work-item per element, the CPU's float operations in the CPU's order:
 * no contraction to fma (FP_CONTRACT OFF) except where the CPU calls fmaf.
 * Division and square root: OpenCL C allows them 2.5 and 3 ulp; with
 * cl_khr_fp64 they are taken in double and rounded once to float, which is
 * the correctly rounded float result (53 >= 2 x 24 + 2 bits: double rounding
 * is harmless for / and sqrt), so the bits are the CPU's. Without fp64 the
 * device's own / and sqrt are used (within their ulp). */
#pragma OPENCL FP_CONTRACT OFF

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
static float div_rn(float a, float b) { return (float)((double)a / (double)b); }
static float sqrt_rn(float a) { return (float)sqrt((double)a); }
#else
static float div_rn(float a, float b) { return a / b; }
static float sqrt_rn(float a) { return sqrt(a); }
#endif

/* bf16 <-> f32 as src/core/half.c: round to nearest even, NaN kept quiet. */
static float bf16_load(__global const ushort *x, ulong i) {
    uint b = (uint)x[i] << 16;
    if ((b & 0x7fffffffu) > 0x7f800000u) b |= 0x400000u;
    return as_float(b);
}
static void bf16_store(__global ushort *x, ulong i, float f) {
    uint b = as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        x[i] = (ushort)((b >> 16) | 0x0040u);
        return;
    }
    b += 0x7fffu + ((b >> 16) & 1u);
    x[i] = (ushort)(b >> 16);
}

/* fr_k_sgd: d = g + wd p; with momentum buf = first ? d : buf mom + keep d,
 * d = nesterov ? d + mom buf : buf; p = p + (-lr) d. buf may be NULL when
 * mom is 0. */
__kernel void sgd_f32(ulong n, __global float *p, ulong p_off, __global const float *g,
                      ulong g_off, __global float *buf, ulong buf_off, float lr, float wd,
                      float mom, float keep, int nesterov, int first) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    float pi = p[p_off + i];
    float d = g[g_off + i];
    if (wd != 0.0f) d = d + wd * pi;
    if (mom != 0.0f) {
        float b = first ? d : buf[buf_off + i] * mom + keep * d;
        buf[buf_off + i] = b;
        d = nesterov ? d + mom * b : b;
    }
    p[p_off + i] = pi + (-lr) * d;
}

/* fr_adam_elem (kernels.h) with fr_adam_consts passed member by member. */
static void adam_elem(float nss, float bc2_sqrt, float b1, float b2, float eps, float omb1,
                      float omb2, float wd, float shrink, int l2, int dec, float *p, float g,
                      float *m, float *v) {
    float gi = g;
    float pi = *p;
    if (l2) gi = fma(pi, wd, gi);
    if (dec) pi = pi * shrink;
    float mi = fma(gi, omb1, *m * b1);
    float vi = fma(omb2 * gi, gi, *v * b2);
    float denom = div_rn(sqrt_rn(vi), bc2_sqrt) + eps;
    *m = mi;
    *v = vi;
    *p = pi + div_rn(nss * mi, denom);
}

#define ADAM_ARGS                                                                         \
    float nss, float bc2_sqrt, float b1, float b2, float eps, float omb1, float omb2, float wd, \
        float shrink, int l2, int dec
#define ADAM_PASS nss, bc2_sqrt, b1, b2, eps, omb1, omb2, wd, shrink, l2, dec

/* Adam/AdamW with f32 moments m, v (n each). */
__kernel void adam_f32(ulong n, __global float *p, ulong p_off, __global const float *g,
                       ulong g_off, __global float *m, ulong m_off, __global float *v,
                       ulong v_off, ADAM_ARGS) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    float pi = p[p_off + i], mi = m[m_off + i], vi = v[v_off + i];
    adam_elem(ADAM_PASS, &pi, g[g_off + i], &mi, &vi);
    p[p_off + i] = pi;
    m[m_off + i] = mi;
    v[v_off + i] = vi;
}

/* The same with bf16 moments: decoded, updated in f32, rounded back; p gets
 * the update from the f32 moments (fr_k_adam_state's FR_STATE_BF16). */
__kernel void adam_bf16(ulong n, __global float *p, ulong p_off, __global const float *g,
                        ulong g_off, __global ushort *m, ulong m_off, __global ushort *v,
                        ulong v_off, ADAM_ARGS) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    float pi = p[p_off + i], mi = bf16_load(m, m_off + i), vi = bf16_load(v, v_off + i);
    adam_elem(ADAM_PASS, &pi, g[g_off + i], &mi, &vi);
    p[p_off + i] = pi;
    bf16_store(m, m_off + i, mi);
    bf16_store(v, v_off + i, vi);
}
