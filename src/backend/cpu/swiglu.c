/* swiglu.c — the Llama family's MLP gate: y = silu(gate) up, silu(g) =
 * g sigmoid(g) = g / (1 + e^-g) (PyTorch's F.silu), and its backward.
 * Elementwise: every loop reads element i of each input before it writes
 * element i of an output, so y may take gate's storage and dgate dy's (the
 * planner runs them in place). The exponential is fr_exp_poly (exp_poly.h),
 * which vectorizes; OpenCL's swiglu.cl computes the same polynomial. */
#include <stdint.h>
#include "backend/cpu/exp_poly.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define SWIGLU_PAR_MIN 32768 /* values below which one thread does all */

// gate, up, y of n values: y = (g / (1 + exp(-g))) u
int fr_k_swiglu(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_swiglu(c, "swiglu", 0, &n);
    if (st) return st;
    const float *gt = fr_f32(&c->in[0]), *up = fr_f32(&c->in[1]);
    float *y = fr_f32(&c->out[0]);
    if (!y || n == 0) return FR_OK;
#pragma omp parallel for simd schedule(static) if (n >= SWIGLU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gt[i], u = up[i];
        y[i] = (g / (1.0f + fr_exp_poly(-g))) * u;
    }
    return FR_OK;
}

// dy, gate, up of n values; s = sigmoid(g) = 1 / (1 + exp(-g)):
// dgate = dy u s (1 + g (1 - s)), dup = dy silu(g) (silu as the forward makes it)
int fr_k_swiglu_bwd(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_swiglu(c, "swiglu_bwd", 1, &n);
    if (st) return st;
    const float *dy = fr_f32(&c->in[0]), *gt = fr_f32(&c->in[1]), *up = fr_f32(&c->in[2]);
    float *dg = fr_f32(&c->out[0]), *du = fr_f32(&c->out[1]);
    if (n == 0 || (!dg && !du)) return FR_OK;
    const int acc_g = acc_bit(c, 0), acc_u = acc_bit(c, 1);
#pragma omp parallel for simd schedule(static) if (n >= SWIGLU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float d = dy[i], g = gt[i], u = up[i];
        const float e1 = 1.0f + fr_exp_poly(-g), s = 1.0f / e1;
        const float vg = d * u * (s * (1.0f + g * (1.0f - s))), vu = d * (g / e1);
        if (dg) dg[i] = acc_g ? dg[i] + vg : vg;
        if (du) du[i] = acc_u ? du[i] + vu : vu;
    }
    return FR_OK;
}
