/* optim.c (opencl) — SGD, Adam, AdamW and Adafactor on the device (see
 * optim.h): the scalars formed on the host as the CPU forms them
 * (fr_adam_setup, fr_k_sgd's roundings, fr_adafactor_setup), passed as
 * kernel arguments to kernels/optim.cl. */
#include "backend/opencl/optim.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"
#include <string.h>

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

/* Adafactor (cpu/adafactor.c) in six passes: the weights' sum of squares
 * (reduce.cl's blocks, fr_k_grad_sumsq's) read back for alpha; the factors
 * (or the variance); each slice's floor of mean(r); U^2's block sums, their
 * total read back for the clipping; the update. state[0] is the parameter's
 * state region, state[1] the optimizer's scratch (fr_factored_scratch's
 * layout). The host forms the scalars as the CPU does (fr_adafactor_setup,
 * fr_adafactor_finish): with cl_khr_fp64 the bits are the CPU's. */
static int adafactor(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *o, int64_t t,
                     const fr_tensor *state, fr_tensor *p, const fr_tensor *g, cl_ulong n) {
    const fr_factored f = fr_factored_of(&p->shape);
    size_t rden_at, need = fr_factored_scratch(&f, &rden_at);
    const cl_mem st = fr_cl_mem(&state[0]), sc = fr_cl_mem(&state[1]);
    if (p->dtype != FR_F32 || g->dtype != FR_F32 || !st || !sc ||
        (size_t)fr_shape_numel(&state[1].shape) * 4 < need || state[1].off)
        return fr_fail(ctx, FR_ERR_ARG,
                       "opencl: adafactor steps f32 weights with an f32 gradient, its state and "
                       "%zu bytes of scratch at offset 0 (weights %s, gradient %s, scratch %lld "
                       "floats)",
                       need, fr_dtype_name(p->dtype), fr_dtype_name(g->dtype),
                       (long long)fr_shape_numel(&state[1].shape));
    const size_t each_acc = fr_cl_info_of(cl)->fp64 ? sizeof(double) : sizeof(float);
    const cl_mem pm = fr_cl_mem(p), gm = fr_cl_mem(g);
    const cl_ulong p_off = fr_cl_off(p), g_off = fr_cl_off(g), chunk = FR_FACTORED_CHUNK;
    const cl_ulong s0 = state[0].off / 4, d_off = rden_at / 4;
    const cl_ulong slices = (cl_ulong)(f.factored ? f.L : 1), R = (cl_ulong)f.R, C = (cl_ulong)f.C,
                   each = f.factored ? R * C : n;
    const cl_ulong r_off = s0, c_off = s0 + (cl_ulong)(f.L * f.R),
                   m_off = s0 + (cl_ulong)f.first_at;
    const cl_ulong cps = (each + chunk - 1) / chunk, nb = (n + chunk - 1) / chunk;
    const cl_int factored = f.factored;
    const size_t one = 1;
    double sum = 0;
    unsigned char b[sizeof(double)];
    float fsum;
    /* the weights' sum of squares */
    cl_kernel k = fr_cl_kernel(ctx, cl, "reduce", "sumsq_blocks");
    int e = k ? FR_CL_ARGS(ctx, k, sizeof pm, &pm, sizeof p_off, &p_off, sizeof n, &n, sizeof chunk,
                           &chunk, sizeof sc, &sc)
              : FR_ERR_ARG;
    if (!e) e = run_1d(ctx, cl, k, (size_t)nb);
    if (!e && !(k = fr_cl_kernel(ctx, cl, "reduce", "sum_in_order"))) e = FR_ERR_ARG;
    if (!e) e = FR_CL_ARGS(ctx, k, sizeof sc, &sc, sizeof nb, &nb);
    if (!e) e = fr_cl_run(ctx, cl, k, 1, &one, NULL);
    if (!e) e = fr_cl_read(ctx, cl, sc, (size_t)nb * each_acc, b, each_acc);
    if (e) return e;
    if (each_acc == sizeof(double)) memcpy(&sum, b, sizeof sum);
    else memcpy(&fsum, b, sizeof fsum), sum = fsum;
    fr_adafactor_consts c = fr_adafactor_setup(o, t, sum, (int64_t)n);
    /* the second moment: rows, columns and each slice's floor; or the variance */
    if (f.factored) {
        const cl_ulong rows = slices * R;
        if (!(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_rows"))) return FR_ERR_ARG;
        e = FR_CL_ARGS(ctx, k, sizeof rows, &rows, sizeof C, &C, sizeof gm, &gm, sizeof g_off,
                       &g_off, sizeof st, &st, sizeof r_off, &r_off, sizeof c.w, &c.w);
        if (!e) e = run_1d(ctx, cl, k, (size_t)rows);
        if (!e && !(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_cols"))) e = FR_ERR_ARG;
        if (!e)
            e = FR_CL_ARGS(ctx, k, sizeof slices, &slices, sizeof R, &R, sizeof C, &C, sizeof gm,
                           &gm, sizeof g_off, &g_off, sizeof st, &st, sizeof c_off, &c_off,
                           sizeof c.w, &c.w);
        if (!e) e = run_1d(ctx, cl, k, (size_t)(slices * C));
        if (!e && !(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_rden"))) e = FR_ERR_ARG;
        if (!e)
            e = FR_CL_ARGS(ctx, k, sizeof slices, &slices, sizeof R, &R, sizeof st, &st,
                           sizeof r_off, &r_off, sizeof sc, &sc, sizeof d_off, &d_off,
                           sizeof c.eps1, &c.eps1);
        if (!e) e = run_1d(ctx, cl, k, (size_t)slices);
    } else {
        if (!(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_var"))) return FR_ERR_ARG;
        e = FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof gm, &gm, sizeof g_off, &g_off, sizeof st, &st,
                       sizeof r_off, &r_off, sizeof c.w, &c.w);
        if (!e) e = run_1d(ctx, cl, k, (size_t)n);
    }
    /* the sum of U^2: blocks within each slice, then in order */
    if (!e && !(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_usq"))) e = FR_ERR_ARG;
    if (!e)
        e = FR_CL_ARGS(ctx, k, sizeof slices, &slices, sizeof each, &each, sizeof cps, &cps,
                       sizeof R, &R, sizeof C, &C, sizeof factored, &factored, sizeof gm, &gm,
                       sizeof g_off, &g_off, sizeof st, &st, sizeof r_off, &r_off, sizeof c_off,
                       &c_off, sizeof sc, &sc, sizeof d_off, &d_off, sizeof c.eps_sq, &c.eps_sq,
                       sizeof sc, &sc);
    if (!e) e = run_1d(ctx, cl, k, (size_t)(slices * cps));
    if (!e && !(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_usq_total"))) e = FR_ERR_ARG;
    if (!e) e = FR_CL_ARGS(ctx, k, sizeof slices, &slices, sizeof cps, &cps, sizeof sc, &sc);
    if (!e) e = fr_cl_run(ctx, cl, k, 1, &one, NULL);
    if (!e) e = fr_cl_read(ctx, cl, sc, (size_t)(slices * cps) * each_acc, b, each_acc);
    if (e) return e;
    if (each_acc == sizeof(double)) memcpy(&sum, b, sizeof sum);
    else memcpy(&fsum, b, sizeof fsum), sum = fsum;
    fr_adafactor_finish(&c, o, sum, (int64_t)n);
    /* the update */
    if (!(k = fr_cl_kernel(ctx, cl, "optim", "adafactor_apply"))) return FR_ERR_ARG;
    const cl_int decay = c.decay, first = c.first_moment;
    e = FR_CL_ARGS(ctx, k, sizeof n, &n, sizeof each, &each, sizeof R, &R, sizeof C, &C,
                   sizeof factored, &factored, sizeof pm, &pm, sizeof p_off, &p_off, sizeof gm, &gm,
                   sizeof g_off, &g_off, sizeof st, &st, sizeof r_off, &r_off, sizeof c_off, &c_off,
                   sizeof m_off, &m_off, sizeof sc, &sc, sizeof d_off, &d_off, sizeof c.eps_sq,
                   &c.eps_sq, sizeof c.neg, &c.neg, sizeof c.fden, &c.fden, sizeof c.falpha,
                   &c.falpha, sizeof c.shrink, &c.shrink, sizeof decay, &decay, sizeof first,
                   &first, sizeof c.b1, &c.b1, sizeof c.keep, &c.keep);
    return e ? e : run_1d(ctx, cl, k, (size_t)n);
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
    if (o->kind == FR_OPTIM_ADAFACTOR) return adafactor(ctx, cl, o, t, state, p, g, (cl_ulong)n);
    return adam(ctx, cl, o, t, state, state_kind, p, g, (cl_ulong)n);
}
