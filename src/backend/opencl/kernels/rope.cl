/* rope.cl — the device side of opencl/rope.c: ROPE_QKV and its backward, as
 * src/backend/cpu/rope.c computes them (rope.h has the formulas): per head
 * of HS values at position p, for i < HS/2, a = inv_freq[i] p (a float
 * product), out[i] = x[i] cos a - x[i + HS/2] sin a, out[i + HS/2] =
 * x[i + HS/2] cos a + x[i] sin a; the backward with sin a negated (the
 * transposed rotation). inv_freq as rope.c's fr_rope_inv_freq (Hugging
 * Face's default, linear and llama3 rope parameters), in double where the
 * device has it. A work-item per (row, head); no float operation contracted. */
#pragma OPENCL FP_CONTRACT OFF

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real_t;
#else
typedef float real_t;
#endif

#define ROPE_DEFAULT 0
#define ROPE_LINEAR 1
#define ROPE_LLAMA3 2

static float inv_freq(int i, int HS, float theta, int type, float factor, float lo, float hi,
                      int orig) {
    const float e = (float)(2 * i) / (float)HS;
    const float f = 1.0f / (float)pow((real_t)theta, (real_t)e);
    if (type == ROPE_LINEAR) return f / factor;
    if (type != ROPE_LLAMA3) return f;
    const real_t wavelen = (real_t)2.0 * (real_t)3.14159265358979323846 / (real_t)f;
    const real_t o = (real_t)orig;
    if (wavelen > o / (real_t)lo) return f / factor;
    if (wavelen < o / (real_t)hi) return f;
    const real_t smooth = (o / wavelen - (real_t)lo) / ((real_t)hi - (real_t)lo);
    return (float)(((real_t)1.0 - smooth) * (real_t)f / (real_t)factor + smooth * (real_t)f);
}

/* one head: HS values from x to y rotated at position pos (sgn -1: transposed) */
static void rotate(__global const float *x, __global float *y, int HS, float pos, float sgn,
                   float theta, int type, float factor, float lo, float hi, int orig) {
    const int h2 = HS / 2;
    if (theta == 0.0f) {
        for (int i = 0; i < HS; i++) y[i] = x[i];
        return;
    }
    for (int i = 0; i < h2; i++) {
        const float a = inv_freq(i, HS, theta, type, factor, lo, hi, orig) * pos;
        const float c = (float)cos((real_t)a), s = sgn * (float)sin((real_t)a);
        const float x1 = x[i], x2 = x[i + h2];
        y[i] = x1 * c - x2 * s;
        y[i + h2] = x2 * c + x1 * s;
    }
}

/* qkv (rows, (NH + 2 NKV) HS) from q (rows, NH HS), k, v (rows, NKV HS); row
 * r at position pos0 + r % T. Global size (rows, NH + 2 NKV). */
__kernel void rope_qkv(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
                       __global const float *v, ulong v_off, __global float *y, ulong y_off,
                       int T, int NH, int NKV, int HS, ulong pos0, float theta, int type,
                       float factor, float lo, float hi, int orig) {
    const long row = (long)get_global_id(0);
    const int h = (int)get_global_id(1);
    const long C = (long)NH * HS, CK = (long)NKV * HS, W = C + 2 * CK;
    const float pos = (float)(pos0 + (ulong)(row % T));
    __global float *o = y + y_off + row * W + (long)h * HS;
    if (h < NH)
        rotate(q + q_off + row * C + (long)h * HS, o, HS, pos, 1.0f, theta, type, factor, lo, hi,
               orig);
    else if (h < NH + NKV)
        rotate(k + k_off + row * CK + (long)(h - NH) * HS, o, HS, pos, 1.0f, theta, type, factor,
               lo, hi, orig);
    else {
        __global const float *s = v + v_off + row * CK + (long)(h - NH - NKV) * HS;
        for (int i = 0; i < HS; i++) o[i] = s[i];
    }
}

/* dq, dk (the transposed rotation) and dv (a copy) from dqkv; has: bit 0 dq,
 * 1 dk, 2 dv wanted. Global size (rows, NH + 2 NKV). */
__kernel void rope_qkv_bwd(__global const float *g, ulong g_off, __global float *dq, ulong dq_off,
                           __global float *dk, ulong dk_off, __global float *dv, ulong dv_off,
                           int has, int T, int NH, int NKV, int HS, ulong pos0, float theta,
                           int type, float factor, float lo, float hi, int orig) {
    const long row = (long)get_global_id(0);
    const int h = (int)get_global_id(1);
    const long C = (long)NH * HS, CK = (long)NKV * HS, W = C + 2 * CK;
    const float pos = (float)(pos0 + (ulong)(row % T));
    __global const float *s = g + g_off + row * W + (long)h * HS;
    if (h < NH) {
        if (has & 1)
            rotate(s, dq + dq_off + row * C + (long)h * HS, HS, pos, -1.0f, theta, type, factor,
                   lo, hi, orig);
    } else if (h < NH + NKV) {
        if (has & 2)
            rotate(s, dk + dk_off + row * CK + (long)(h - NH) * HS, HS, pos, -1.0f, theta, type,
                   factor, lo, hi, orig);
    } else if (has & 4) {
        __global float *o = dv + dv_off + row * CK + (long)(h - NH - NKV) * HS;
        for (int i = 0; i < HS; i++) o[i] = s[i];
    }
}
