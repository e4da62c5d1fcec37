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

/* bf16 <-> f32 as src/core/half.c (prelude.cl): round to nearest even, NaN kept quiet. */
static float bf16_load(__global const ushort *x, ulong i) { return bf16_to_f32(x[i]); }
static void bf16_store(__global ushort *x, ulong i, float f) { x[i] = f32_to_bf16(f); }

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

/* ---- 16-bit weights (pure fp16 / bf16 training) ------------------------------
 * p and its state in f16 or bf16, g f32 or (g16) in p's format: each value
 * widened, updated in f32 as above, rounded back to nearest even, as the
 * CPU's step does (fr_k_adam_half; widen, fr_k_sgd, narrow). The f16
 * conversions are src/core/half.c's (prelude.cl), NaN payloads included. */
static float half_load(__global const ushort *x, ulong i, int is_f16) {
    return is_f16 ? f16_to_f32(x[i]) : bf16_load(x, i);
}
static void half_store(__global ushort *x, ulong i, float f, int is_f16) {
    if (is_f16) x[i] = f32_to_f16(f);
    else bf16_store(x, i, f);
}

/* The gradient: g32 (f32) or, when g32 is NULL, g16 in p's format. */
static float grad_at(__global const float *g32, __global const ushort *g16, ulong i, int is_f16) {
    return g32 ? g32[i] : half_load(g16, i, is_f16);
}

__kernel void sgd_half(ulong n, __global ushort *p, ulong p_off, __global const float *g32,
                       __global const ushort *g16, ulong g_off, __global ushort *buf,
                       ulong buf_off, float lr, float wd, float mom, float keep, int nesterov,
                       int first, int is_f16) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    const float pi = half_load(p, p_off + i, is_f16);
    float d = grad_at(g32, g16, g_off + i, is_f16);
    if (wd != 0.0f) d = d + wd * pi;
    if (mom != 0.0f) {
        float b = first ? d : half_load(buf, buf_off + i, is_f16) * mom + keep * d;
        half_store(buf, buf_off + i, b, is_f16);
        d = nesterov ? d + mom * b : b;
    }
    half_store(p, p_off + i, pi + (-lr) * d, is_f16);
}

__kernel void adam_half(ulong n, __global ushort *p, ulong p_off, __global const float *g32,
                        __global const ushort *g16, ulong g_off, __global ushort *m,
                        __global ushort *v, ulong s_off, int is_f16, ADAM_ARGS) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    m += s_off, v += s_off; /* the moments at element s_off of the state blocks */
    float pi = half_load(p, p_off + i, is_f16), mi = half_load(m, i, is_f16),
          vi = half_load(v, i, is_f16);
    adam_elem(ADAM_PASS, &pi, grad_at(g32, g16, g_off + i, is_f16), &mi, &vi);
    half_store(p, p_off + i, pi, is_f16);
    half_store(m, i, mi, is_f16);
    half_store(v, i, vi, is_f16);
}

/* ---- Adam/AdamW with int8 moments (src/backend/cpu/optim_state.h) ---------
 * Layout of one moment of n elements: uchar codes[n], zero padding to a
 * multiple of 4 bytes, then float absmax[ceil(n / 2048)]; element i is
 * val[codes[i]] absmax[i / 2048] (absmax 0: zeros), the signed map for m,
 * the unsigned one for v. One work-group of I8_WG per block: decode, update
 * (p written), the block's new absmax as a tree of maxima in local memory
 * (exact, so any order gives the same value), then each code is the map
 * entry nearest x / absmax, ties to the lower entry: the number of
 * midpoints below y, and y > mid[k] exactly when y >= thr[k] (thr[k] the
 * smallest float above mid[k]). A block holding an inf or NaN gets absmax
 * NaN and zero codes, as on the CPU. */
#define I8_BLOCK 2048
#define I8_WG 256
#define I8_PER (I8_BLOCK / I8_WG)

/* DYNAMIC_MAP_TABLE_BEGIN (generated by test_opencl_optim --print-map from fr_state_decode: do not edit) */
#define DYN_ZERO_UNSIGNED 0
#define DYN_ZERO_SIGNED 127
__constant float dyn_val[2][256] = {
    {0x0p+0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f, 0x1.2599ecp-18f, 0x1.bc98a2p-18f,
     0x1.29cbaap-17f, 0x1.0624dcp-16f, 0x1.c2e34p-16f, 0x1.3fd0cep-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
     0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f, 0x1.82a994p-13f, 0x1.f8a09p-13f,
     0x1.374bc8p-12f, 0x1.724744p-12f, 0x1.ad42c4p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
     0x1.4c9862p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f, 0x1.c28f5ep-11f, 0x1.e00d1cp-11f,
     0x1.fd8adcp-11f, 0x1.2b020cp-10f, 0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041892p-9f, 0x1.28f5c2p-9f,
     0x1.4dd2fp-9f, 0x1.72b01ep-9f, 0x1.978d4ep-9f, 0x1.bc6a7cp-9f, 0x1.e147aep-9f, 0x1.03126ep-8f,
     0x1.158104p-8f, 0x1.27ef9cp-8f, 0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b66p-8f, 0x1.71a9fap-8f,
     0x1.841894p-8f, 0x1.96872ap-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f, 0x1.cdd2fp-8f, 0x1.e0418ap-8f,
     0x1.f2b02p-8f, 0x1.028f5cp-7f, 0x1.0bc6a8p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
     0x1.30a3d6p-7f, 0x1.39db24p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f, 0x1.8ccccep-7f, 0x1.bae146p-7f,
     0x1.e8f5c4p-7f, 0x1.0b851ep-6f, 0x1.228f5cp-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
     0x1.7eb852p-6f, 0x1.95c28ep-6f, 0x1.accccep-6f, 0x1.c3d70ap-6f, 0x1.dae146p-6f, 0x1.f1eb86p-6f,
     0x1.047aep-5f, 0x1.1p-5f, 0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
     0x1.49999ap-5f, 0x1.551eb6p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f, 0x1.77ae14p-5f, 0x1.833334p-5f,
     0x1.8eb85p-5f, 0x1.9a3d7p-5f, 0x1.a5c29p-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
     0x1.d3d70ap-5f, 0x1.df5c2ap-5f, 0x1.eae14ap-5f, 0x1.f66666p-5f, 0x1.00f5c4p-4f, 0x1.06b852p-4f,
     0x1.0c7ae2p-4f, 0x1.123d72p-4f, 0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23851ep-4f, 0x1.2947aep-4f,
     0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f, 0x1.46147cp-4f, 0x1.4bd70ap-4f,
     0x1.51999ap-4f, 0x1.575c2ap-4f, 0x1.5d1eb8p-4f, 0x1.62e148p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
     0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae16p-4f, 0x1.8570a4p-4f, 0x1.8b3334p-4f, 0x1.90f5c4p-4f,
     0x1.96b852p-4f, 0x1.a8p-4f, 0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
     0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f, 0x1.559998p-3f, 0x1.64p-3f,
     0x1.726666p-3f, 0x1.80ccccp-3f, 0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6666p-3f,
     0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e5999ap-3f, 0x1.f4p-3f, 0x1.013334p-2f, 0x1.086666p-2f,
     0x1.0f9998p-2f, 0x1.16ccccp-2f, 0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6666p-2f, 0x1.339998p-2f,
     0x1.3accccp-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f, 0x1.579998p-2f, 0x1.5eccccp-2f,
     0x1.66p-2f, 0x1.6d3332p-2f, 0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
     0x1.913332p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f, 0x1.aep-2f, 0x1.b53332p-2f,
     0x1.bc6664p-2f, 0x1.c39998p-2f, 0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93332p-2f, 0x1.e06664p-2f,
     0x1.e79998p-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f, 0x1.023334p-1f, 0x1.05ccccp-1f,
     0x1.096668p-1f, 0x1.0dp-1f, 0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
     0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f, 0x1.2d6668p-1f, 0x1.31p-1f,
     0x1.34999ap-1f, 0x1.383334p-1f, 0x1.3bccccp-1f, 0x1.3f6668p-1f, 0x1.43p-1f, 0x1.46999ap-1f,
     0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f, 0x1.58999ap-1f, 0x1.5c3334p-1f,
     0x1.5fccccp-1f, 0x1.636668p-1f, 0x1.67p-1f, 0x1.6a999ap-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
     0x1.756668p-1f, 0x1.79p-1f, 0x1.7c999ap-1f, 0x1.803334p-1f, 0x1.83ccccp-1f, 0x1.876668p-1f,
     0x1.8bp-1f, 0x1.8e9998p-1f, 0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996668p-1f, 0x1.9dp-1f,
     0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f, 0x1.afp-1f, 0x1.b29998p-1f,
     0x1.b63334p-1f, 0x1.b9ccccp-1f, 0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c49998p-1f, 0x1.c83334p-1f,
     0x1.cbccccp-1f, 0x1.cf6668p-1f, 0x1.d3p-1f, 0x1.d69998p-1f, 0x1.da3334p-1f, 0x1.ddccccp-1f,
     0x1.e16668p-1f, 0x1.e5p-1f, 0x1.e89998p-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
     0x1.f7p-1f, 0x1.fa9998p-1f, 0x1.fe3334p-1f, 0x1p+0f},
    {-0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f, -0x1.d86666p-1f,
     -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f,
     -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f,
     -0x1.7acccep-1f, -0x1.73999ap-1f, -0x1.6c6666p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56cccep-1f,
     -0x1.4f999ap-1f, -0x1.486666p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32cccep-1f, -0x1.2b999ap-1f,
     -0x1.246666p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.07999ap-1f, -0x1.006666p-1f,
     -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73332p-2f, -0x1.b8ccccp-2f, -0x1.aa6664p-2f,
     -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626664p-2f, -0x1.54p-2f,
     -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6666p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f,
     -0x1.de6666p-3f, -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3332p-3f, -0x1.4e6666p-3f,
     -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eep-4f,
     -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f,
     -0x1.37ae16p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f,
     -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a4p-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb84p-5f,
     -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c28ep-5f, -0x1.fd70a4p-6f, -0x1.cf5c26p-6f,
     -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451eb8p-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
     -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, -0x1.e978d4p-8f, -0x1.c49ba6p-8f,
     -0x1.9fbe78p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
     -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
     -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02dep-11f, -0x1.8fc504p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
     -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
     -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
     0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc504p-12f,
     0x1.02dep-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
     0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f,
     0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe78p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
     0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f,
     0x1.451eb8p-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c26p-6f, 0x1.fd70a4p-6f, 0x1.15c28ep-5f,
     0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb84p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f,
     0x1.b70a4p-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
     0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae16p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f,
     0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
     0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3332p-3f, 0x1.88p-3f,
     0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6666p-2f,
     0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626664p-2f, 0x1.70ccccp-2f,
     0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6664p-2f, 0x1.b8ccccp-2f, 0x1.c73332p-2f,
     0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, 0x1.07999ap-1f, 0x1.0eccccp-1f,
     0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246666p-1f, 0x1.2b999ap-1f, 0x1.32cccep-1f, 0x1.3ap-1f,
     0x1.413334p-1f, 0x1.486666p-1f, 0x1.4f999ap-1f, 0x1.56cccep-1f, 0x1.5ep-1f, 0x1.653334p-1f,
     0x1.6c6666p-1f, 0x1.73999ap-1f, 0x1.7acccep-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
     0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f,
     0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f,
     0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f}};
__constant float dyn_thr[2][256] = {
    {0x1.5cf756p-23f, 0x1.27476ep-21f, 0x1.853b3ep-20f, 0x1.b43526p-19f, 0x1.711948p-18f, 0x1.040bfep-17f,
     0x1.9b0ab2p-17f, 0x1.64841p-16f, 0x1.10a138p-15f, 0x1.6f0068p-15f, 0x1.cd5f9cp-15f, 0x1.15df68p-14f,
     0x1.450efep-14f, 0x1.743e96p-14f, 0x1.d29dc8p-14f, 0x1.47ae16p-13f, 0x1.bda514p-13f, 0x1.19ce0ap-12f,
     0x1.54c988p-12f, 0x1.8fc506p-12f, 0x1.cac086p-12f, 0x1.02de04p-11f, 0x1.205bc2p-11f, 0x1.3dd982p-11f,
     0x1.5b5742p-11f, 0x1.78d5p-11f, 0x1.9652cp-11f, 0x1.b3d08p-11f, 0x1.d14e3ep-11f, 0x1.eecbfep-11f,
     0x1.14e3bep-10f, 0x1.4fdf3cp-10f, 0x1.99999ap-10f, 0x1.e353f8p-10f, 0x1.16872cp-9f, 0x1.3b645ap-9f,
     0x1.604188p-9f, 0x1.851eb8p-9f, 0x1.a9fbe6p-9f, 0x1.ced916p-9f, 0x1.f3b646p-9f, 0x1.0c49bap-8f,
     0x1.1eb852p-8f, 0x1.3126eap-8f, 0x1.439582p-8f, 0x1.56041ap-8f, 0x1.6872b2p-8f, 0x1.7ae148p-8f,
     0x1.8d4fep-8f, 0x1.9fbe78p-8f, 0x1.b22d1p-8f, 0x1.c49ba8p-8f, 0x1.d70a3ep-8f, 0x1.e978d6p-8f,
     0x1.fbe76ep-8f, 0x1.072b04p-7f, 0x1.10624ep-7f, 0x1.19999ap-7f, 0x1.22d0e6p-7f, 0x1.2c0832p-7f,
     0x1.353f7ep-7f, 0x1.3e76cap-7f, 0x1.50e562p-7f, 0x1.75c292p-7f, 0x1.a3d70cp-7f, 0x1.d1eb86p-7f,
     0x1.000002p-6f, 0x1.170a3ep-6f, 0x1.2e147cp-6f, 0x1.451ebap-6f, 0x1.5c28f8p-6f, 0x1.733336p-6f,
     0x1.8a3d72p-6f, 0x1.a147bp-6f, 0x1.b851eep-6f, 0x1.cf5c2ap-6f, 0x1.e66668p-6f, 0x1.fd70a4p-6f,
     0x1.0a3d72p-5f, 0x1.15c29p-5f, 0x1.2147bp-5f, 0x1.2cccdp-5f, 0x1.3851eep-5f, 0x1.43d70cp-5f,
     0x1.4f5c2ap-5f, 0x1.5ae148p-5f, 0x1.666668p-5f, 0x1.71eb86p-5f, 0x1.7d70a6p-5f, 0x1.88f5c4p-5f,
     0x1.947ae2p-5f, 0x1.a00002p-5f, 0x1.ab852p-5f, 0x1.b70a4p-5f, 0x1.c28f6p-5f, 0x1.ce147ep-5f,
     0x1.d9999cp-5f, 0x1.e51ebcp-5f, 0x1.f0a3dap-5f, 0x1.fc28f8p-5f, 0x1.03d70cp-4f, 0x1.09999cp-4f,
     0x1.0f5c2cp-4f, 0x1.151ebap-4f, 0x1.1ae14ap-4f, 0x1.20a3d8p-4f, 0x1.266668p-4f, 0x1.2c28f8p-4f,
     0x1.31eb88p-4f, 0x1.37ae18p-4f, 0x1.3d70a6p-4f, 0x1.433336p-4f, 0x1.48f5c4p-4f, 0x1.4eb854p-4f,
     0x1.547ae4p-4f, 0x1.5a3d72p-4f, 0x1.600002p-4f, 0x1.65c29p-4f, 0x1.6b852p-4f, 0x1.7147bp-4f,
     0x1.770a4p-4f, 0x1.7cccdp-4f, 0x1.828f5ep-4f, 0x1.8851eep-4f, 0x1.8e147ep-4f, 0x1.93d70cp-4f,
     0x1.9f5c2ap-4f, 0x1.b66668p-4f, 0x1.d33334p-4f, 0x1.f00002p-4f, 0x1.066666p-3f, 0x1.14cccep-3f,
     0x1.233336p-3f, 0x1.31999cp-3f, 0x1.400002p-3f, 0x1.4e6668p-3f, 0x1.5ccccep-3f, 0x1.6b3334p-3f,
     0x1.79999ap-3f, 0x1.880002p-3f, 0x1.966668p-3f, 0x1.a4cccep-3f, 0x1.b33334p-3f, 0x1.c1999ap-3f,
     0x1.d00002p-3f, 0x1.de6668p-3f, 0x1.eccccep-3f, 0x1.fb3336p-3f, 0x1.04cccep-2f, 0x1.0cp-2f,
     0x1.133334p-2f, 0x1.1a6668p-2f, 0x1.21999cp-2f, 0x1.28cccep-2f, 0x1.3p-2f, 0x1.373334p-2f,
     0x1.3e6668p-2f, 0x1.45999cp-2f, 0x1.4ccccep-2f, 0x1.54p-2f, 0x1.5b3334p-2f, 0x1.626668p-2f,
     0x1.69999ap-2f, 0x1.70cccep-2f, 0x1.78p-2f, 0x1.7f3334p-2f, 0x1.866668p-2f, 0x1.8d999ap-2f,
     0x1.94cccep-2f, 0x1.9cp-2f, 0x1.a33334p-2f, 0x1.aa6668p-2f, 0x1.b1999ap-2f, 0x1.b8ccccp-2f,
     0x1.cp-2f, 0x1.c73334p-2f, 0x1.ce6668p-2f, 0x1.d5999ap-2f, 0x1.dcccccp-2f, 0x1.e4p-2f,
     0x1.eb3334p-2f, 0x1.f26668p-2f, 0x1.f9999ap-2f, 0x1.006668p-1f, 0x1.040002p-1f, 0x1.07999cp-1f,
     0x1.0b3336p-1f, 0x1.0ecccep-1f, 0x1.126668p-1f, 0x1.160002p-1f, 0x1.19999cp-1f, 0x1.1d3336p-1f,
     0x1.20cccep-1f, 0x1.246668p-1f, 0x1.280002p-1f, 0x1.2b999cp-1f, 0x1.2f3336p-1f, 0x1.32cccep-1f,
     0x1.366668p-1f, 0x1.3a0002p-1f, 0x1.3d999cp-1f, 0x1.413336p-1f, 0x1.44cccep-1f, 0x1.486668p-1f,
     0x1.4c0002p-1f, 0x1.4f999cp-1f, 0x1.533336p-1f, 0x1.56cccep-1f, 0x1.5a6668p-1f, 0x1.5e0002p-1f,
     0x1.61999cp-1f, 0x1.653336p-1f, 0x1.68cccep-1f, 0x1.6c6668p-1f, 0x1.700002p-1f, 0x1.73999cp-1f,
     0x1.773336p-1f, 0x1.7acccep-1f, 0x1.7e6668p-1f, 0x1.820002p-1f, 0x1.85999cp-1f, 0x1.893336p-1f,
     0x1.8ccccep-1f, 0x1.906668p-1f, 0x1.940002p-1f, 0x1.97999cp-1f, 0x1.9b3336p-1f, 0x1.9ecccep-1f,
     0x1.a26668p-1f, 0x1.a60002p-1f, 0x1.a9999cp-1f, 0x1.ad3336p-1f, 0x1.b0cccep-1f, 0x1.b46668p-1f,
     0x1.b80002p-1f, 0x1.bb999cp-1f, 0x1.bf3336p-1f, 0x1.c2cccep-1f, 0x1.c66668p-1f, 0x1.ca0002p-1f,
     0x1.cd999cp-1f, 0x1.d13336p-1f, 0x1.d4cccep-1f, 0x1.d86668p-1f, 0x1.dc0002p-1f, 0x1.df999cp-1f,
     0x1.e33336p-1f, 0x1.e6cccep-1f, 0x1.ea6668p-1f, 0x1.ee0002p-1f, 0x1.f1999cp-1f, 0x1.f53336p-1f,
     0x1.f8cccep-1f, 0x1.fc6668p-1f, 0x1.ff199cp-1f, INFINITY},
    {-0x1.f8ccccp-1f, -0x1.f19998p-1f, -0x1.ea6664p-1f, -0x1.e33332p-1f, -0x1.dbfffep-1f, -0x1.d4ccccp-1f,
     -0x1.cd9998p-1f, -0x1.c66664p-1f, -0x1.bf3332p-1f, -0x1.b7fffep-1f, -0x1.b0ccccp-1f, -0x1.a99998p-1f,
     -0x1.a26664p-1f, -0x1.9b3332p-1f, -0x1.93fffep-1f, -0x1.8cccccp-1f, -0x1.859998p-1f, -0x1.7e6666p-1f,
     -0x1.773332p-1f, -0x1.6ffffep-1f, -0x1.68ccccp-1f, -0x1.619998p-1f, -0x1.5a6666p-1f, -0x1.533332p-1f,
     -0x1.4bfffep-1f, -0x1.44ccccp-1f, -0x1.3d9998p-1f, -0x1.366666p-1f, -0x1.2f3332p-1f, -0x1.27fffep-1f,
     -0x1.20ccccp-1f, -0x1.199998p-1f, -0x1.126664p-1f, -0x1.0b3332p-1f, -0x1.03fffep-1f, -0x1.f99996p-2f,
     -0x1.eb333p-2f, -0x1.dccccap-2f, -0x1.ce6664p-2f, -0x1.bffffep-2f, -0x1.b19996p-2f, -0x1.a3333p-2f,
     -0x1.94cccap-2f, -0x1.866664p-2f, -0x1.77fffep-2f, -0x1.699996p-2f, -0x1.5b333p-2f, -0x1.4ccccap-2f,
     -0x1.3e6664p-2f, -0x1.2ffffep-2f, -0x1.219998p-2f, -0x1.133332p-2f, -0x1.04ccccp-2f, -0x1.eccccap-3f,
     -0x1.cffffep-3f, -0x1.b33332p-3f, -0x1.966664p-3f, -0x1.799998p-3f, -0x1.5ccccap-3f, -0x1.3ffffep-3f,
     -0x1.233332p-3f, -0x1.066664p-3f, -0x1.d33332p-4f, -0x1.a51eb8p-4f, -0x1.8e147ap-4f, -0x1.828f5cp-4f,
     -0x1.770a3cp-4f, -0x1.6b851ep-4f, -0x1.5ffffep-4f, -0x1.547aep-4f, -0x1.48f5c2p-4f, -0x1.3d70a4p-4f,
     -0x1.31eb84p-4f, -0x1.266664p-4f, -0x1.1ae146p-4f, -0x1.0f5c28p-4f, -0x1.03d70ap-4f, -0x1.f0a3d6p-5f,
     -0x1.d99998p-5f, -0x1.c28f5cp-5f, -0x1.ab851ep-5f, -0x1.947aep-5f, -0x1.7d70a2p-5f, -0x1.666664p-5f,
     -0x1.4f5c26p-5f, -0x1.3851eap-5f, -0x1.2147acp-5f, -0x1.0a3d6ep-5f, -0x1.e66664p-6f, -0x1.b851e8p-6f,
     -0x1.8a3d7p-6f, -0x1.5c28f4p-6f, -0x1.2e147ap-6f, -0x1p-6f, -0x1.a3d70ap-7f, -0x1.5a1caap-7f,
     -0x1.353f7ap-7f, -0x1.22d0e4p-7f, -0x1.10624cp-7f, -0x1.fbe76ap-8f, -0x1.d70a3cp-8f, -0x1.b22d0ep-8f,
     -0x1.8d4fdep-8f, -0x1.6872bp-8f, -0x1.43958p-8f, -0x1.1eb85p-8f, -0x1.f3b642p-9f, -0x1.a9fbe4p-9f,
     -0x1.604188p-9f, -0x1.16872ap-9f, -0x1.999998p-10f, -0x1.23a29cp-10f, -0x1.d14e3cp-11f, -0x1.9652bcp-11f,
     -0x1.5b574p-11f, -0x1.205bcp-11f, -0x1.cac08p-12f, -0x1.54c986p-12f, -0x1.bda514p-13f, -0x1.00e6bp-13f,
     -0x1.450efcp-14f, -0x1.cd5f98p-15f, -0x1.10a136p-15f, -0x1.e68a0ap-17f, -0x1.711946p-18f, -0x1.fe0702p-20f,
     -0x1.27476cp-22f, 0x1.27477p-22f, 0x1.fe0704p-20f, 0x1.71194ap-18f, 0x1.e68a0cp-17f, 0x1.10a138p-15f,
     0x1.cd5f9cp-15f, 0x1.450fp-14f, 0x1.00e6b2p-13f, 0x1.bda516p-13f, 0x1.54c988p-12f, 0x1.cac084p-12f,
     0x1.205bc2p-11f, 0x1.5b5742p-11f, 0x1.9652cp-11f, 0x1.d14e3ep-11f, 0x1.23a29ep-10f, 0x1.99999ap-10f,
     0x1.16872cp-9f, 0x1.60418ap-9f, 0x1.a9fbe8p-9f, 0x1.f3b646p-9f, 0x1.1eb852p-8f, 0x1.439582p-8f,
     0x1.6872b2p-8f, 0x1.8d4fe2p-8f, 0x1.b22d1p-8f, 0x1.d70a3ep-8f, 0x1.fbe76ep-8f, 0x1.10625p-7f,
     0x1.22d0e6p-7f, 0x1.353f7ep-7f, 0x1.5a1caep-7f, 0x1.a3d70cp-7f, 0x1.000002p-6f, 0x1.2e147cp-6f,
     0x1.5c28f8p-6f, 0x1.8a3d72p-6f, 0x1.b851ecp-6f, 0x1.e66666p-6f, 0x1.0a3d72p-5f, 0x1.2147bp-5f,
     0x1.3851eep-5f, 0x1.4f5c2ap-5f, 0x1.666666p-5f, 0x1.7d70a4p-5f, 0x1.947ae2p-5f, 0x1.ab8522p-5f,
     0x1.c28f5ep-5f, 0x1.d9999cp-5f, 0x1.f0a3dap-5f, 0x1.03d70cp-4f, 0x1.0f5c2cp-4f, 0x1.1ae14ap-4f,
     0x1.266668p-4f, 0x1.31eb88p-4f, 0x1.3d70a6p-4f, 0x1.48f5c6p-4f, 0x1.547ae4p-4f, 0x1.600002p-4f,
     0x1.6b852p-4f, 0x1.770a4p-4f, 0x1.828f6p-4f, 0x1.8e147ep-4f, 0x1.a51ebap-4f, 0x1.d33336p-4f,
     0x1.066668p-3f, 0x1.233334p-3f, 0x1.400002p-3f, 0x1.5ccccep-3f, 0x1.79999ap-3f, 0x1.966668p-3f,
     0x1.b33334p-3f, 0x1.d00002p-3f, 0x1.eccccep-3f, 0x1.04cccep-2f, 0x1.133334p-2f, 0x1.21999ap-2f,
     0x1.300002p-2f, 0x1.3e6668p-2f, 0x1.4ccccep-2f, 0x1.5b3334p-2f, 0x1.69999ap-2f, 0x1.780002p-2f,
     0x1.866668p-2f, 0x1.94cccep-2f, 0x1.a33334p-2f, 0x1.b1999ap-2f, 0x1.cp-2f, 0x1.ce6666p-2f,
     0x1.dccccep-2f, 0x1.eb3334p-2f, 0x1.f9999ap-2f, 0x1.040002p-1f, 0x1.0b3334p-1f, 0x1.126668p-1f,
     0x1.19999cp-1f, 0x1.20cccep-1f, 0x1.280002p-1f, 0x1.2f3336p-1f, 0x1.366668p-1f, 0x1.3d999cp-1f,
     0x1.44cccep-1f, 0x1.4c0002p-1f, 0x1.533336p-1f, 0x1.5a6668p-1f, 0x1.61999cp-1f, 0x1.68cccep-1f,
     0x1.700002p-1f, 0x1.773336p-1f, 0x1.7e6668p-1f, 0x1.85999cp-1f, 0x1.8ccccep-1f, 0x1.940002p-1f,
     0x1.9b3334p-1f, 0x1.a26668p-1f, 0x1.a9999cp-1f, 0x1.b0cccep-1f, 0x1.b80002p-1f, 0x1.bf3334p-1f,
     0x1.c66668p-1f, 0x1.cd999cp-1f, 0x1.d4cccep-1f, 0x1.dc0002p-1f, 0x1.e33334p-1f, 0x1.ea6668p-1f,
     0x1.f1999cp-1f, 0x1.f8cccep-1f, 0x1.fe3334p-1f, INFINITY}};
/* DYNAMIC_MAP_TABLE_END */

static uchar nearest_code(__constant const float *thr, float y) {
    uint k = 0;
    for (uint s = 128; s; s >>= 1)
        if (y >= thr[k + s - 1]) k += s;
    return (uchar)k;
}

__kernel __attribute__((reqd_work_group_size(I8_WG, 1, 1))) void adam_int8(
    ulong n, __global float *p, ulong p_off, __global const float *g, ulong g_off,
    __global uchar *m, __global uchar *v, ulong s_off, ADAM_ARGS) {
    __local float lm[I8_WG], lv[I8_WG];
    m += s_off, v += s_off; /* the moments at byte s_off of the state blocks (a multiple of 4) */
    __local int lbad[I8_WG];
    const size_t blk = get_group_id(0), lid = get_local_id(0);
    const ulong lo = (ulong)blk * I8_BLOCK, cnt = min(n - lo, (ulong)I8_BLOCK);
    const ulong codes = (n + 3) & ~(ulong)3;
    __global float *mabs = (__global float *)(m + codes), *vabs = (__global float *)(v + codes);
    const float am = mabs[blk], av = vabs[blk];
    float mb[I8_PER], vb[I8_PER];
    float mmax = 0.0f, vmax = 0.0f;
    int bad = 0;
    for (int j = 0; j < I8_PER; j++) {
        const ulong i = lid + (ulong)j * I8_WG;
        if (i >= cnt) break;
        float mi = am == 0.0f ? 0.0f : dyn_val[1][m[lo + i]] * am;
        float vi = av == 0.0f ? 0.0f : dyn_val[0][v[lo + i]] * av;
        float pi = p[p_off + lo + i];
        adam_elem(ADAM_PASS, &pi, g[g_off + lo + i], &mi, &vi);
        p[p_off + lo + i] = pi;
        mb[j] = mi, vb[j] = vi;
        const float ma = fabs(mi), va = fabs(vi);
        bad |= !(ma <= FLT_MAX) | (!(va <= FLT_MAX) << 1);
        mmax = ma > mmax ? ma : mmax;
        vmax = va > vmax ? va : vmax;
    }
    lm[lid] = mmax, lv[lid] = vmax, lbad[lid] = bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = I8_WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lm[lid] = lm[lid + s] > lm[lid] ? lm[lid + s] : lm[lid];
            lv[lid] = lv[lid + s] > lv[lid] ? lv[lid + s] : lv[lid];
            lbad[lid] |= lbad[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float amax[2] = {lm[0], lv[0]};
    const int bads = lbad[0];
    for (int w = 0; w < 2; w++) { /* w 0: m (signed map), 1: v (unsigned) */
        const int is_bad = (bads >> w) & 1, zero = amax[w] == 0.0f;
        __global uchar *c = w ? v : m;
        __constant const float *thr = dyn_thr[w ? 0 : 1];
        const uchar zc = w ? DYN_ZERO_UNSIGNED : DYN_ZERO_SIGNED;
        for (int j = 0; j < I8_PER; j++) {
            const ulong i = lid + (ulong)j * I8_WG;
            if (i >= cnt) break;
            const float x = w ? vb[j] : mb[j];
            c[lo + i] = is_bad || zero ? zc : nearest_code(thr, div_rn(x, amax[w]));
        }
        if (lid == 0) (w ? vabs : mabs)[blk] = is_bad ? as_float(0x7fc00000u) : amax[w];
    }
}

/* ---- Adafactor (src/backend/cpu/adafactor.c): the same sums in the same
 * order (double with cl_khr_fp64), the same float operations ---- */
#ifdef cl_khr_fp64
typedef double af_acc_t;
#else
typedef float af_acc_t;
#endif
#define AF_CHUNK 2048 /* FR_FACTORED_CHUNK */

/* torch.lerp with a scalar weight (ATen's Lerp.h) */
static float af_lerp(float a, float b, float w) {
    return fabs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

/* row_var (L R): r = lerp(r, mean_j g^2, w); a work-item a row, j in order */
__kernel void adafactor_rows(ulong rows, ulong C, __global const float *g, ulong g_off,
                             __global float *st, ulong r_off, float w) {
    const ulong i = get_global_id(0);
    if (i >= rows) return;
    __global const float *gi = g + g_off + i * C;
    af_acc_t s = 0;
    for (ulong j = 0; j < C; j++) s += (af_acc_t)gi[j] * gi[j];
    st[r_off + i] = af_lerp(st[r_off + i], (float)(s / (af_acc_t)C), w);
}

/* col_var (L C): c = lerp(c, mean_i g^2, w); a work-item a column, i in order */
__kernel void adafactor_cols(ulong L, ulong R, ulong C, __global const float *g, ulong g_off,
                             __global float *st, ulong c_off, float w) {
    const ulong q = get_global_id(0);
    if (q >= L * C) return;
    __global const float *gl = g + g_off + (q / C) * R * C + q % C;
    af_acc_t s = 0;
    for (ulong i = 0; i < R; i++) s += (af_acc_t)gl[i * C] * gl[i * C];
    st[c_off + q] = af_lerp(st[c_off + q], (float)(s / (af_acc_t)R), w);
}

/* rden[l] = max(mean_i r_i, eps1) of slice l, i in order */
__kernel void adafactor_rden(ulong L, ulong R, __global const float *st, ulong r_off,
                             __global float *rden, ulong d_off, float eps1) {
    const ulong l = get_global_id(0);
    if (l >= L) return;
    af_acc_t s = 0;
    for (ulong i = 0; i < R; i++) s += st[r_off + l * R + i];
    const float mean = (float)(s / (af_acc_t)R);
    rden[d_off + l] = mean > eps1 ? mean : eps1;
}

/* variance (n): v = lerp(v, g^2, w) */
__kernel void adafactor_var(ulong n, __global const float *g, ulong g_off, __global float *st,
                            ulong v_off, float w) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    st[v_off + k] = af_lerp(st[v_off + k], g[g_off + k] * g[g_off + k], w);
}

/* U = g / sqrt(max(V, eps1^2)) of element kk of slice l (each values):
 * V = r_i c_j / rden_l factored, the variance otherwise */
static float af_u(int factored, ulong l, ulong kk, ulong each, ulong R, ulong C,
                  __global const float *g, ulong g_off, __global const float *st, ulong r_off,
                  ulong c_off, __global const float *rden, ulong d_off, float eps_sq) {
    const ulong k = l * each + kk;
    float var = factored ? div_rn(st[r_off + l * R + kk / C] * st[c_off + l * C + kk % C],
                                  rden[d_off + l])
                         : st[r_off + k];
    return g[g_off + k] * div_rn(1.0f, sqrt_rn(var > eps_sq ? var : eps_sq));
}

/* part[l cps + b] = the sum of U^2 over block b of slice l, in index order */
__kernel void adafactor_usq(ulong slices, ulong each, ulong cps, ulong R, ulong C, int factored,
                            __global const float *g, ulong g_off, __global const float *st,
                            ulong r_off, ulong c_off, __global const float *rden, ulong d_off,
                            float eps_sq, __global af_acc_t *part) {
    const ulong q = get_global_id(0);
    if (q >= slices * cps) return;
    const ulong l = q / cps, lo = (q % cps) * AF_CHUNK;
    const ulong hi = each - lo < AF_CHUNK ? each : lo + AF_CHUNK;
    af_acc_t s = 0;
    for (ulong kk = lo; kk < hi; kk++) {
        const float u = af_u(factored, l, kk, each, R, C, g, g_off, st, r_off, c_off, rden, d_off,
                             eps_sq);
        s += (af_acc_t)u * u;
    }
    part[q] = s;
}

/* part[slices cps] = the slices' sums (each its blocks in order) added in order */
__kernel void adafactor_usq_total(ulong slices, ulong cps, __global af_acc_t *part) {
    af_acc_t total = 0;
    for (ulong l = 0; l < slices; l++) {
        af_acc_t s = 0;
        for (ulong b = 0; b < cps; b++) s += part[l * cps + b];
        total += s;
    }
    part[slices * cps] = total;
}

/* p = p (1 - lr wd) + (-alpha / denom) U; with a first moment (Hugging
 * Face's) m = b1 m + (1 - b1) (U / denom alpha), p = p (1 - lr wd) - m */
__kernel void adafactor_apply(ulong n, ulong each, ulong R, ulong C, int factored,
                              __global float *p, ulong p_off, __global const float *g, ulong g_off,
                              __global float *st, ulong r_off, ulong c_off, ulong m_off,
                              __global const float *rden, ulong d_off, float eps_sq, float neg,
                              float fden, float falpha, float shrink, int decay, int first,
                              float b1, float keep) {
    const ulong k = get_global_id(0);
    if (k >= n) return;
    const float u = af_u(factored, k / each, k % each, each, R, C, g, g_off, st, r_off, c_off,
                         rden, d_off, eps_sq);
    const float pk = decay ? p[p_off + k] * shrink : p[p_off + k];
    if (first) {
        const float m = st[m_off + k] * b1 + keep * (div_rn(u, fden) * falpha);
        st[m_off + k] = m;
        p[p_off + k] = pk - m;
    } else {
        p[p_off + k] = pk + neg * u;
    }
}
