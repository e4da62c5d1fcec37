/* passes.c — the CPU backend's whole-tensor passes of the step (members of
 * fr_backend; see backend/backend.h): one parameter's optimizer step, the
 * loss scaler's unscale, clipping's sum of squares and scale, and the
 * accuracy count, each over one tensor's .data with the kernels and the
 * float operations the host step uses (optim.c, optim_state.c, grad.c,
 * loss.c), so a step that calls them per tensor is bit for bit the host's. */
#include "backend/cpu/host.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"
#include "core/ctx.h"
#include "core/half.h"

/* 16-bit storage <-> f32 working copies (pure 16-bit training). */
static void widen(const void *src, fr_dtype dt, float *dst, size_t n) {
    if (dt == FR_F16) fr_f16_to_f32_n(src, dst, n);
    else fr_bf16_to_f32_n(src, dst, n);
}

static void narrow(const float *src, fr_dtype dt, void *dst, size_t n) {
    if (dt == FR_F16) fr_f32_to_f16_n(src, dst, n);
    else fr_f32_to_bf16_n(src, dst, n);
}

/* Adafactor: p and g f32, state[0] its f32 region (fr_k_adafactor). p
 * f32: g f32, the state in state_kind's format (SGD: f32 momentum). p f16
 * or bf16: g f32 or in p's format, the state in p's; Adam then in one fused
 * pass over the 16-bit tensors, SGD in f32 working copies (workspace) whose
 * results are rounded back. */
int fr_cpu_optim_update(fr_ctx *ctx, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                        const fr_tensor *g, fr_tensor *state, int state_kind) {
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (o->kind == FR_OPTIM_ADAFACTOR) { /* f32 weights and gradient, its f32 state region */
        if (p->dtype != FR_F32 || g->dtype != FR_F32 || !fr_shape_eq(&g->shape, &p->shape) ||
            !state || !state[0].data)
            return fr_fail(ctx, FR_ERR_ARG,
                           "cpu: adafactor steps f32 weights with an f32 gradient of their shape "
                           "and its state (weights %s, gradient %s)",
                           fr_dtype_name(p->dtype), fr_dtype_name(g->dtype));
        fr_k_adafactor(p->data, g->data, state[0].data, &p->shape, o, t);
        return FR_OK;
    }
    int half = p->dtype != FR_F32, adamw = o->kind == FR_OPTIM_ADAMW;
    int ns = o->kind == FR_OPTIM_SGD ? o->momentum != 0.0f : 2;
    void *s0 = state ? state[0].data : NULL, *s1 = state ? state[1].data : NULL;
    if (fr_shape_numel(&g->shape) != (int64_t)n)
        return fr_fail(ctx, FR_ERR_ARG, "cpu: optimizer step of %zu values from %lld gradients", n,
                       (long long)fr_shape_numel(&g->shape));
    if ((ns > 0 && !s0) || (ns > 1 && !s1))
        return fr_fail(ctx, FR_ERR_ARG, "cpu: optimizer step of %zu values without its state", n);
    if (half && o->kind != FR_OPTIM_SGD) {
        fr_k_adam_half(p->data, g->data, g->dtype != FR_F32, s0, s1, n, o, t, adamw,
                       p->dtype == FR_F16);
        return FR_OK;
    }
    float *w = p->data, *st[2] = {s0, s1}, *grad = g->data;
    if (half) {
        w = fr_alloc(ctx, n * sizeof *w * (size_t)(2 + ns), FR_MEM_WORKSPACE);
        if (!w) return FR_ERR_NOMEM;
        widen(p->data, p->dtype, w, n);
        if (g->dtype != FR_F32) {
            grad = w + n * (size_t)(1 + ns);
            widen(g->data, g->dtype, grad, n);
        }
        for (int k = 0; k < ns; k++) {
            st[k] = w + n * (size_t)(k + 1);
            widen(state[k].data, p->dtype, st[k], n);
        }
    }
    if (o->kind == FR_OPTIM_SGD) fr_k_sgd(w, grad, st[0], n, o, t == 1);
    else if (state_kind != FR_STATE_F32 && !half)
        fr_k_adam_state(w, grad, st[0], st[1], n, o, t, adamw, (fr_state_kind)state_kind);
    else fr_k_adam(w, grad, st[0], st[1], n, o, t, adamw);
    if (half) {
        narrow(w, p->dtype, p->data, n);
        for (int k = 0; k < ns; k++) narrow(st[k], p->dtype, state[k].data, n);
        fr_free(ctx, w);
    }
    return FR_OK;
}

int fr_cpu_grad_unscale(fr_ctx *ctx, fr_tensor *g, float inv, int *found_inf) {
    (void)ctx;
    *found_inf = fr_k_grad_unscale(g->data, g->dtype, (size_t)fr_shape_numel(&g->shape), inv);
    return FR_OK;
}

int fr_cpu_grad_sumsq(fr_ctx *ctx, const fr_tensor *g, double *out) {
    (void)ctx;
    *out = fr_k_grad_sumsq(g->data, g->dtype, (size_t)fr_shape_numel(&g->shape));
    return FR_OK;
}

int fr_cpu_grad_scale(fr_ctx *ctx, fr_tensor *g, float f) {
    (void)ctx;
    fr_k_grad_scale(g->data, g->dtype, (size_t)fr_shape_numel(&g->shape), f);
    return FR_OK;
}

// logits (N,K) f32, labels (N) i32: the rows whose first maximum is their label
int fr_cpu_hits(fr_ctx *ctx, const fr_tensor *z, const fr_tensor *y, int64_t *out) {
    const fr_shape *zs = &z->shape;
    int64_t K = zs->ndim ? zs->d[zs->ndim - 1] : 0, N = K ? fr_shape_numel(zs) / K : 0;
    if (fr_shape_numel(&y->shape) != N || z->dtype != FR_F32 || y->dtype != FR_I32)
        return fr_fail(ctx, FR_ERR_ARG,
                       "cpu: hits of %lld rows of %lld %s logits against %lld %s labels",
                       (long long)N, (long long)K, fr_dtype_name(z->dtype),
                       (long long)fr_shape_numel(&y->shape), fr_dtype_name(y->dtype));
    *out = fr_k_argmax_hits(z->data, y->data, N, K);
    return FR_OK;
}
