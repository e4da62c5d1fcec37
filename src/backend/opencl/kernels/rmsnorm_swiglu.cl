/* rmsnorm_swiglu.cl — the Llama family's RMSNorm and SwiGLU gate on the
 * device (rmsnorm_swiglu.c enqueues them; the semantics are the CPU's,
 * src/backend/cpu/rmsnorm.c and swiglu.c). Tensors are (buffer, element
 * offset) pairs; an absent one is a NULL buffer. Row sums run in double
 * where the device has cl_khr_fp64, in a work-group of a fixed size reducing
 * in a fixed tree; dw sums a column's rows in order in one work-item: the
 * same inputs give the same bits. */

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;
#else
typedef float acc_t;
#endif

/* a*b+c stays two roundings, as on the host */
#pragma OPENCL FP_CONTRACT OFF

#define WG 64 /* lanes of a row's work-group (rmsnorm_swiglu.c's RMS_WG) */

/* The sum over the WG lanes of v, the same tree every time; every lane
 * calls it and gets the total. */
static acc_t rms_wg_sum(__local acc_t *s, acc_t v) {
    const int l = get_local_id(0);
    s[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) s[l] += s[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const acc_t r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* ---- RMSNorm over rows of C: one work-group per row ---- */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
rmsnorm(__global const float *x, ulong x_off, __global const float *w, ulong w_off,
        __global float *y, ulong y_off, __global float *srstd, ulong sr_off, long C, float eps) {
    __local acc_t s[WG];
    const long n = get_group_id(0);
    const int l = get_local_id(0);
    __global const float *xp = x + x_off + n * C;
    acc_t q = 0;
    for (long d = l; d < C; d += WG) q += (acc_t)xp[d] * xp[d];
    const acc_t rstd = 1 / sqrt(rms_wg_sum(s, q) / (acc_t)C + (acc_t)eps);
    if (l == 0 && srstd) srstd[sr_off + n] = (float)rstd;
    const float r = (float)rstd;
    for (long d = l; d < C; d += WG) {
        const float v = xp[d] * r;
        y[y_off + n * C + d] = w ? w[w_off + d] * v : v;
    }
}

/* dx of a row: one work-group per row. See fr_k_rmsnorm_bwd. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
rmsnorm_bwd_dx(__global const float *dy, ulong dy_off, __global const float *x, ulong x_off,
               __global const float *w, ulong w_off, __global const float *srstd, ulong sr_off,
               __global float *dx, ulong dx_off, long C, int acc) {
    __local acc_t s[WG];
    const long n = get_group_id(0);
    const int l = get_local_id(0);
    __global const float *xp = x + x_off + n * C, *dyp = dy + dy_off + n * C;
    __global float *dxp = dx + dx_off + n * C;
    const float r = srstd[sr_off + n];
    acc_t a = 0; /* sum g xhat */
    for (long d = l; d < C; d += WG) {
        const acc_t g = w ? (acc_t)dyp[d] * w[w_off + d] : (acc_t)dyp[d];
        a += g * (xp[d] * r);
    }
    const float mgx = (float)(rms_wg_sum(s, a) / (acc_t)C);
    for (long d = l; d < C; d += WG) {
        const float g = w ? dyp[d] * w[w_off + d] : dyp[d];
        const float v = r * (g - (xp[d] * r) * mgx);
        dxp[d] = acc ? dxp[d] + v : v;
    }
}

/* dw: one work-item per column, the rows in order. */
__kernel void rmsnorm_bwd_dw(__global const float *dy, ulong dy_off, __global const float *x,
                             ulong x_off, __global const float *srstd, ulong sr_off,
                             __global float *dw, ulong dw_off, long N, long C, int acc) {
    const long d = get_global_id(0);
    if (d >= C) return;
    acc_t sw = 0;
    for (long n = 0; n < N; n++)
        sw += (acc_t)dy[dy_off + n * C + d] * (x[x_off + n * C + d] * srstd[sr_off + n]);
    dw[dw_off + d] = (float)(acc ? dw[dw_off + d] + sw : sw);
}

/* ---- SwiGLU: one work-item per value ---- */

/* y = (g / (1 + e^-g)) u; y may be gate itself */
__kernel void swiglu(__global const float *gate, ulong g_off, __global const float *up, ulong u_off,
                     __global float *y, ulong y_off, long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float g = gate[g_off + i], u = up[u_off + i];
    y[y_off + i] = (g / (1.0f + exp_poly(-g))) * u;
}

/* dgate = dy u s (1 + g (1 - s)), dup = dy silu(g); dgate may be dy itself */
__kernel void swiglu_bwd(__global const float *dy, ulong dy_off, __global const float *gate,
                         ulong g_off, __global const float *up, ulong u_off, __global float *dg,
                         ulong dg_off, __global float *du, ulong du_off, long n, int acc_g,
                         int acc_u) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float d = dy[dy_off + i], g = gate[g_off + i], u = up[u_off + i];
    const float e1 = 1.0f + exp_poly(-g), s = 1.0f / e1;
    const float vg = d * u * (s * (1.0f + g * (1.0f - s))), vu = d * (g / e1);
    if (dg) dg[dg_off + i] = acc_g ? dg[dg_off + i] + vg : vg;
    if (du) du[du_off + i] = acc_u ? du[du_off + i] + vu : vu;
}
