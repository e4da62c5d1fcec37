/* rope.c (opencl) — ROPE_QKV and ROPE_QKV_BWD on the device: the shape
 * checks of the CPU's kernels (backend/cpu/rope.c), then kernels/rope.cl,
 * a work-item per (row, head). No workspace. */
#include <stdint.h>
#include "backend/opencl/backend.h"
#include "backend/cpu/reduce.h"
#include "core/ctx.h"

typedef struct cl_rope_dims {
    cl_int T, NH, NKV, HS;
    int64_t rows;
} cl_rope_dims;

/* The dims from qkv (B, T, (NH + 2 NKV) HS) and attr; q, k, v (those bound)
 * checked against them, as the CPU's */
static int dims(fr_kernel_call *c, const char *op, const fr_tensor *qkv, const fr_tensor *t[3],
                cl_rope_dims *d) {
    const fr_attr *a = &c->node->attr;
    const fr_shape *x = &qkv->shape;
    const int nh = a->heads, nkv = a->kv_heads ? a->kv_heads : a->heads, w = nh + 2 * nkv;
    if (nh < 1 || nkv < 1 || x->ndim != 3 || x->d[2] % w || (x->d[2] / w) % 2 || x->d[2] == 0 ||
        x->d[1] > INT32_MAX)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: qkv must be (B,T,(heads+2 kv_heads) HS) with HS even (heads %d, "
                       "kv_heads %d)",
                       op, nh, nkv);
    d->T = (cl_int)x->d[1], d->NH = nh, d->NKV = nkv, d->HS = (cl_int)(x->d[2] / w);
    d->rows = x->d[0] * x->d[1];
    const int n[3] = {nh, nkv, nkv};
    for (int i = 0; i < 3; i++) {
        const fr_shape *s = &t[i]->shape;
        if (!fr_cl_mem(t[i])) continue;
        if (s->ndim != 3 || s->d[0] != x->d[0] || s->d[1] != x->d[1] ||
            s->d[2] != (int64_t)n[i] * d->HS || t[i]->dtype != FR_F32)
            return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: %s must be f32 (%lld, %lld, %lld)", op,
                           i == 0   ? "q"
                           : i == 1 ? "k"
                                    : "v",
                           (long long)x->d[0], (long long)x->d[1], (long long)n[i] * d->HS);
    }
    if (qkv->dtype != FR_F32 || !fr_cl_mem(qkv))
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: qkv must be f32 and bound", op);
    return FR_OK;
}

/* the rope's arguments after the dims: T, NH, NKV, HS, pos0, theta, type,
 * factor, low, high, orig; then the range (rows, NH + 2 NKV) */
static int run(fr_kernel_call *c, fr_cl *cl, cl_kernel k, cl_uint first, const cl_rope_dims *d) {
    const fr_rope *r = &c->node->attr.rope;
    const cl_ulong pos0 = r->pos_from_step ? (cl_ulong)c->step : 0;
    const cl_float theta = r->theta, factor = r->factor, lo = r->low_freq_factor,
                   hi = r->high_freq_factor;
    const cl_int type = r->type, orig = r->orig_context;
    const fr_cl_argv tail[] = {
        {sizeof d->T, &d->T},   {sizeof d->NH, &d->NH},   {sizeof d->NKV, &d->NKV},
        {sizeof d->HS, &d->HS}, {sizeof pos0, &pos0},     {sizeof theta, &theta},
        {sizeof type, &type},   {sizeof factor, &factor}, {sizeof lo, &lo},
        {sizeof hi, &hi},       {sizeof orig, &orig}};
    for (cl_uint i = 0; i < sizeof tail / sizeof tail[0]; i++)
        if (clSetKernelArg(k, first + i, tail[i].size, tail[i].value) != CL_SUCCESS)
            return fr_fail(c->ctx, FR_ERR_ARG, "opencl: rope_qkv: setting argument %u failed",
                           first + i);
    const size_t global[2] = {(size_t)d->rows, (size_t)(d->NH + 2 * d->NKV)};
    return fr_cl_run(c->ctx, cl, k, 2, global, NULL);
}

// q (B,T,NH HS), k, v (B,T,NKV HS) -> qkv (B,T,(NH+2NKV)HS) = [rot(q) | rot(k) | v]
int fr_cl_k_rope_qkv(fr_kernel_call *c) {
    cl_rope_dims d;
    const fr_tensor *t[3] = {&c->in[0], &c->in[1], &c->in[2]};
    int st = dims(c, "rope_qkv", &c->out[0], t, &d);
    if (st) return st;
    if (!fr_cl_mem(&c->in[0]) || !fr_cl_mem(&c->in[1]) || !fr_cl_mem(&c->in[2]))
        return fr_fail(c->ctx, FR_ERR_ARG, "rope_qkv: q, k or v is not bound");
    if (d.rows == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k = fr_cl_kernel(c->ctx, cl, "rope", "rope_qkv");
    if (!k) return FR_ERR_ARG;
    const cl_mem q = fr_cl_mem(&c->in[0]), kk = fr_cl_mem(&c->in[1]), v = fr_cl_mem(&c->in[2]),
                 y = fr_cl_mem(&c->out[0]);
    const cl_ulong q_off = fr_cl_off(&c->in[0]), k_off = fr_cl_off(&c->in[1]),
                   v_off = fr_cl_off(&c->in[2]), y_off = fr_cl_off(&c->out[0]);
    st = FR_CL_ARGS(c->ctx, k, sizeof q, &q, sizeof q_off, &q_off, sizeof kk, &kk, sizeof k_off,
                    &k_off, sizeof v, &v, sizeof v_off, &v_off, sizeof y, &y, sizeof y_off, &y_off);
    return st ? st : run(c, cl, k, 8, &d);
}

// dqkv -> dq, dk (the transposed rotation), dv (a copy), each when wanted, overwritten
int fr_cl_k_rope_qkv_bwd(fr_kernel_call *c) {
    cl_rope_dims d;
    const fr_tensor *t[3] = {&c->out[0], &c->out[1], &c->out[2]};
    int st = dims(c, "rope_qkv_bwd", &c->in[0], t, &d);
    if (st) return st;
    if (acc_bit(c, 0) || acc_bit(c, 1) || acc_bit(c, 2))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "rope_qkv_bwd: dq, dk and dv are written whole, they cannot be added into");
    const cl_int has = (fr_cl_mem(&c->out[0]) ? 1 : 0) | (fr_cl_mem(&c->out[1]) ? 2 : 0) |
                       (fr_cl_mem(&c->out[2]) ? 4 : 0);
    if (d.rows == 0 || !has) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k = fr_cl_kernel(c->ctx, cl, "rope", "rope_qkv_bwd");
    if (!k) return FR_ERR_ARG;
    const cl_mem g = fr_cl_mem(&c->in[0]), dq = fr_cl_mem(&c->out[0]), dk = fr_cl_mem(&c->out[1]),
                 dv = fr_cl_mem(&c->out[2]);
    const cl_ulong g_off = fr_cl_off(&c->in[0]), dq_off = fr_cl_off(&c->out[0]),
                   dk_off = fr_cl_off(&c->out[1]), dv_off = fr_cl_off(&c->out[2]);
    st = FR_CL_ARGS(c->ctx, k, sizeof g, &g, sizeof g_off, &g_off, sizeof dq, &dq, sizeof dq_off,
                    &dq_off, sizeof dk, &dk, sizeof dk_off, &dk_off, sizeof dv, &dv, sizeof dv_off,
                    &dv_off, sizeof has, &has);
    return st ? st : run(c, cl, k, 9, &d);
}
