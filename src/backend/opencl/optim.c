/* optim.c (opencl) — SGD, Adam and AdamW on the device (see optim.h): the
 * scalars formed on the host as the CPU forms them (fr_adam_setup, and
 * fr_k_sgd's roundings), passed as kernel arguments to kernels/optim.cl. */
#include "backend/opencl/optim.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"

#define OPTIM_WG 64     /* work-items per group; the global size is n rounded up to it */
#define OPTIM_I8_WG 256 /* optim.cl's I8_WG: a work-group per int8 block */

static int run_1d(fr_ctx *ctx, fr_cl *cl, cl_kernel k, size_t n) {
    const size_t global = (n + OPTIM_WG - 1) / OPTIM_WG * OPTIM_WG;
    return fr_cl_run(ctx, cl, k, 1, &global, NULL);
}

static int sgd(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *op, int64_t t, const fr_tensor *state,
               fr_tensor *p, const fr_tensor *g, cl_ulong n) {
    const float lr = (float)op->lr, wd = (float)op->weight_decay, mom = (float)op->momentum;
    const float keep = (float)(1.0 - op->dampening);
    const cl_int nesterov = op->nesterov, first = t == 1, is_f16 = p->dtype == FR_F16;
    cl_mem buf = mom != 0.0f ? fr_cl_mem(&state[0]) : NULL;
    if (mom != 0.0f && !buf)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: sgd: momentum %g needs a momentum buffer",
                       op->momentum);
    const int half = p->dtype != FR_F32, g32 = g->dtype == FR_F32;
    /* the momentum's element in the state block (optim/optim.h: a view at a byte offset) */
    const cl_ulong p_off = fr_cl_off(p), g_off = fr_cl_off(g),
                   b_off = buf ? state[0].off / (half ? 2 : 4) : 0;
    const cl_mem pm = fr_cl_mem(p), gm = fr_cl_mem(g), none = NULL;
    cl_kernel k = fr_cl_kernel(ctx, cl, "optim", half ? "sgd_half" : "sgd_f32");
    if (!k) return FR_ERR_ARG;
    int st = half
                 ? FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof pm, &pm, sizeof p_off, &p_off,
                              sizeof(cl_mem), g32 ? &gm : &none, sizeof(cl_mem), g32 ? &none : &gm,
                              sizeof g_off, &g_off, sizeof buf, &buf, sizeof b_off, &b_off)
                 : FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof pm, &pm, sizeof p_off, &p_off, sizeof gm,
                              &gm, sizeof g_off, &g_off, sizeof buf, &buf, sizeof b_off, &b_off);
    const cl_uint a = half ? 8 : 7; /* the scalars follow */
    if (!st) st = fr_cl_arg(ctx, k, a, sizeof lr, &lr);
    if (!st) st = fr_cl_arg(ctx, k, a + 1, sizeof wd, &wd);
    if (!st) st = fr_cl_arg(ctx, k, a + 2, sizeof mom, &mom);
    if (!st) st = fr_cl_arg(ctx, k, a + 3, sizeof keep, &keep);
    if (!st) st = fr_cl_arg(ctx, k, a + 4, sizeof nesterov, &nesterov);
    if (!st) st = fr_cl_arg(ctx, k, a + 5, sizeof first, &first);
    if (!st && half) st = fr_cl_arg(ctx, k, a + 6, sizeof is_f16, &is_f16);
    return st ? st : run_1d(ctx, cl, k, (size_t)n);
}

/* Adam's scalars as arguments first, first + 1, ... of k (optim.cl's ADAM_ARGS). */
static int set_adam_consts(fr_ctx *ctx, cl_kernel k, cl_uint first, const fr_adam_consts *c) {
    const float f[9] = {c->neg_step_size, c->bc2_sqrt,     c->b1, c->b2,    c->eps,
                        c->one_minus_b1,  c->one_minus_b2, c->wd, c->shrink};
    const cl_int l2 = c->l2, dec = c->dec;
    int st = FR_OK;
    for (cl_uint i = 0; i < 9 && !st; i++) st = fr_cl_arg(ctx, k, first + i, sizeof f[i], &f[i]);
    if (!st) st = fr_cl_arg(ctx, k, first + 9, sizeof l2, &l2);
    if (!st) st = fr_cl_arg(ctx, k, first + 10, sizeof dec, &dec);
    return st;
}

/* 16-bit weights: the moments in p's format whatever the state's kind, as
 * the CPU's step (fr_k_adam_half). */
static int adam_half(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *o, int64_t t, cl_mem m, cl_mem v,
                     cl_ulong s_off, fr_tensor *p, const fr_tensor *g, cl_ulong n) {
    const fr_adam_consts c = fr_adam_setup(o, t, o->kind == FR_OPTIM_ADAMW);
    const cl_ulong p_off = fr_cl_off(p), g_off = fr_cl_off(g);
    const cl_mem pm = fr_cl_mem(p), gm = fr_cl_mem(g), none = NULL;
    const cl_int is_f16 = p->dtype == FR_F16;
    const int g32 = g->dtype == FR_F32;
    cl_kernel k = fr_cl_kernel(ctx, cl, "optim", "adam_half");
    if (!k) return FR_ERR_ARG;
    int st = FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof pm, &pm, sizeof p_off, &p_off, sizeof(cl_mem),
                        g32 ? &gm : &none, sizeof(cl_mem), g32 ? &none : &gm, sizeof g_off, &g_off,
                        sizeof m, &m, sizeof v, &v, sizeof s_off, &s_off, sizeof is_f16, &is_f16);
    if (st || (st = set_adam_consts(ctx, k, 10, &c))) return st;
    return run_1d(ctx, cl, k, (size_t)n);
}

static int adam(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *o, int64_t t, const fr_tensor *state,
                int kind, fr_tensor *p, const fr_tensor *g, cl_ulong n) {
    static const char *const names[FR_STATE_KIND_COUNT] = {"adam_f32", "adam_bf16", "adam_int8"};
    if (p->dtype != FR_F32) {
        if (!state[0].buf || !state[1].buf)
            return fr_fail(ctx, FR_ERR_ARG,
                           "opencl: adam: the moments' device buffers are missing");
        return adam_half(ctx, cl, o, t, fr_cl_mem(&state[0]), fr_cl_mem(&state[1]),
                         state[0].off / 2, p, g, n);
    }
    if (kind < 0 || kind >= FR_STATE_KIND_COUNT)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: adam: unknown optimizer state kind %d", kind);
    const cl_mem m = fr_cl_mem(&state[0]), v = fr_cl_mem(&state[1]);
    if (!m || !v)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: adam: the moments' device buffers are missing");
    const fr_adam_consts c = fr_adam_setup(o, t, o->kind == FR_OPTIM_ADAMW);
    const cl_ulong p_off = fr_cl_off(p), g_off = fr_cl_off(g);
    const cl_mem pm = fr_cl_mem(p), gm = fr_cl_mem(g);
    cl_kernel k = fr_cl_kernel(ctx, cl, "optim", names[kind]);
    if (!k) return FR_ERR_ARG;
    int st;
    if (kind == FR_STATE_INT8) { /* codes, then absmax, from byte s_off */
        const cl_ulong s_off = state[0].off;
        st = FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof pm, &pm, sizeof p_off, &p_off, sizeof gm, &gm,
                        sizeof g_off, &g_off, sizeof m, &m, sizeof v, &v, sizeof s_off, &s_off);
        if (st || (st = set_adam_consts(ctx, k, 8, &c))) return st;
        const size_t local = OPTIM_I8_WG;
        const size_t global = (size_t)((n + FR_STATE_INT8_BLOCK - 1) / FR_STATE_INT8_BLOCK) * local;
        return fr_cl_run(ctx, cl, k, 1, &global, &local);
    }
    const size_t es = kind == FR_STATE_BF16 ? 2 : 4; /* the moments' elements */
    const cl_ulong m_off = state[0].off / es, v_off = state[1].off / es;
    st = FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof pm, &pm, sizeof p_off, &p_off, sizeof gm, &gm,
                    sizeof g_off, &g_off, sizeof m, &m, sizeof m_off, &m_off, sizeof v, &v,
                    sizeof v_off, &v_off);
    if (st || (st = set_adam_consts(ctx, k, 9, &c))) return st;
    return run_1d(ctx, cl, k, (size_t)n);
}

int fr_cl_optim_update(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                       const fr_tensor *g, const fr_tensor *state, int state_kind) {
    if (!o) return fr_fail(ctx, FR_ERR_ARG, "opencl: optimizer update: no optimizer");
    const int half = p->dtype == FR_F16 || p->dtype == FR_BF16;
    if ((p->dtype != FR_F32 && !half) || (g->dtype != FR_F32 && g->dtype != p->dtype) || !p->buf ||
        !g->buf)
        return fr_fail(ctx, FR_ERR_ARG,
                       "opencl: optimizer update: needs an f32, f16 or bf16 parameter and an "
                       "f32 gradient or one in its format, on the device");
    const int64_t n = fr_shape_numel(&g->shape);
    if (fr_shape_numel(&p->shape) != n)
        return fr_fail(ctx, FR_ERR_SHAPE,
                       "opencl: optimizer update: gradient of %lld values for a parameter of %lld",
                       (long long)n, (long long)fr_shape_numel(&p->shape));
    if (n == 0) return FR_OK;
    if (o->kind == FR_OPTIM_SGD) return sgd(ctx, cl, o, t, state, p, g, (cl_ulong)n);
    return adam(ctx, cl, o, t, state, state_kind, p, g, (cl_ulong)n);
}
