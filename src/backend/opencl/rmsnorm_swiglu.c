/* rmsnorm_swiglu.c (opencl) — the Llama family's RMSNORM and SWIGLU and
 * their backward on an OpenCL device, with the CPU kernels' semantics and
 * messages (src/backend/cpu/rmsnorm.c, swiglu.c; the checks are
 * backend/kcheck.h's); their OpenCL C is kernels/rmsnorm_swiglu.cl.
 * Kernels are enqueued without waiting. */
#include "backend/kcheck.h"
#include "backend/opencl/dref.h"
#include "backend/opencl/backend.h"

#define PROG "rmsnorm_swiglu"
#define RMS_WG 64 /* the .cl's WG: lanes of a row's work-group */

static cl_int acc_bit(const fr_kernel_call *c, int i) {
    return (cl_int)((c->accumulate >> i) & 1u);
}

static int kernel(fr_ctx *ctx, fr_cl *cl, const char *name, cl_kernel *k) {
    *k = fr_cl_kernel(ctx, cl, PROG, name);
    return *k ? FR_OK : FR_ERR_ARG;
}

/* n work-items, the implementation's groups (of RMS_WG: a multiple) */
static int run_items(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int64_t n) {
    if (n <= 0) return FR_OK;
    const size_t g = (size_t)((n + RMS_WG - 1) / RMS_WG * RMS_WG);
    return fr_cl_run(ctx, cl, k, 1, &g, NULL);
}

/* `groups` work-groups of RMS_WG lanes */
static int run_groups(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int64_t groups) {
    if (groups <= 0) return FR_OK;
    const size_t g = (size_t)groups * RMS_WG, l = RMS_WG;
    return fr_cl_run(ctx, cl, k, 1, &g, &l);
}

// x (N, C) or (B,T,C), w (C), y x's shape, rstd (N): rstd = 1/sqrt(mean x^2 + eps),
// y = w (x rstd). One work-group per row.
int fr_cl_k_rmsnorm(fr_kernel_call *c) {
    int64_t N, C;
    int st = fr_kcheck_rmsnorm(c, "rmsnorm", &c->in[0], &c->in[1], &c->out[1], &N, &C);
    if (st) return st;
    if (c->out[0].dtype != FR_F32) return fr_fail(c->ctx, FR_ERR_ARG, "rmsnorm: y must be f32");
    if (N == 0 || C == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "rmsnorm", &k))) return st;
    dref x = dref_of(&c->in[0]), w = dref_of(&c->in[1]), y = dref_of(&c->out[0]),
         sr = dref_of(&c->out[1]);
    cl_long d = C;
    cl_float eps = c->node->attr.eps;
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(w), TA(y), TA(sr), VA(d), VA(eps));
    return st ? st : run_groups(c->ctx, cl, k, N);
}

// dy, x (N, C), w (C), rstd (N): dx = rstd (g - xhat mean(g xhat)), g = dy w (a
// work-group per row); dw = sum_n dy xhat (a work-item per column, the rows in order).
int fr_cl_k_rmsnorm_bwd(fr_kernel_call *c) {
    int64_t N, C;
    int st = fr_kcheck_rmsnorm_bwd(c, &N, &C);
    if (st) return st;
    if (N == 0 || C == 0) return FR_OK;
    if (!c->in[3].buf) return fr_fail(c->ctx, FR_ERR_ARG, "rmsnorm_bwd: the saved rstd is missing");
    fr_cl *cl = fr_cl_of(c->ctx);
    dref dy = dref_of(&c->in[0]), x = dref_of(&c->in[1]), w = dref_of(&c->in[2]),
         sr = dref_of(&c->in[3]), dx = dref_of(&c->out[0]), dw = dref_of(&c->out[1]);
    cl_long n = N, d = C;
    cl_int ax = acc_bit(c, 0), aw = acc_bit(c, 1);
    cl_kernel k;
    if (dx.m) {
        if ((st = kernel(c->ctx, cl, "rmsnorm_bwd_dx", &k))) return st;
        st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(w), TA(sr), TA(dx), VA(d), VA(ax));
        if (st || (st = run_groups(c->ctx, cl, k, N))) return st;
    }
    if (dw.m) {
        if ((st = kernel(c->ctx, cl, "rmsnorm_bwd_dw", &k))) return st;
        st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(sr), TA(dw), VA(n), VA(d), VA(aw));
        if (st || (st = run_items(c->ctx, cl, k, C))) return st;
    }
    return FR_OK;
}

// gate, up, y of n values: y = silu(gate) up. One work-item per value.
int fr_cl_k_swiglu(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_swiglu(c, "swiglu", 0, &n);
    if (st) return st;
    dref g = dref_of(&c->in[0]), u = dref_of(&c->in[1]), y = dref_of(&c->out[0]);
    if (!y.m || n == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "swiglu", &k))) return st;
    cl_long nn = n;
    st = FR_CL_ARGS(c->ctx, k, TA(g), TA(u), TA(y), VA(nn));
    return st ? st : run_items(c->ctx, cl, k, n);
}

// dy, gate, up -> dgate = dy up silu'(gate), dup = dy silu(gate). One work-item per value.
int fr_cl_k_swiglu_bwd(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_swiglu(c, "swiglu_bwd", 1, &n);
    if (st) return st;
    dref dy = dref_of(&c->in[0]), g = dref_of(&c->in[1]), u = dref_of(&c->in[2]),
         dg = dref_of(&c->out[0]), du = dref_of(&c->out[1]);
    if (n == 0 || (!dg.m && !du.m)) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "swiglu_bwd", &k))) return st;
    cl_long nn = n;
    cl_int ag = acc_bit(c, 0), au = acc_bit(c, 1);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(g), TA(u), TA(dg), TA(du), VA(nn), VA(ag), VA(au));
    return st ? st : run_items(c->ctx, cl, k, n);
}
