/* optim.c — the optimizer's rules over a model's parameters (optim.h): which
 * tensors, in which format, at which step; the arithmetic of one tensor is
 * the CPU backend's kernels. */
#include "optim/optim.h"

#include <math.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"
#include "core/half.h"

int fr_optim_states(const fr_optim_opts *o) {
    if (o->kind == FR_OPTIM_SGD) return o->momentum != 0.0f ? 1 : 0;
    return 2;
}

size_t fr_optim_state_bytes(const fr_optim_opts *o, fr_optim_state fmt, const fr_param *p,
                            int *kind) {
    size_t n = (size_t)fr_shape_numel(&p->shape);
    *kind = FR_STATE_F32;
    if (p->dtype != FR_F32) return n * fr_dtype_size(p->dtype);
    if (o->kind == FR_OPTIM_SGD) return n * sizeof(float);
    *kind = fr_state_kind_for((fr_state_kind)fmt, n);
    return fr_state_bytes((fr_state_kind)*kind, n);
}

void *fr_grad_data(const fr_param *p) { return p->grad16 ? (void *)p->grad16 : (void *)p->grad; }

fr_dtype fr_grad_dtype(const fr_param *p) { return p->grad16 ? p->dtype : FR_F32; }

void fr_grad_set(fr_param *p, int64_t k, float x) {
    if (!p->grad16) p->grad[k] = x;
    else p->grad16[k] = p->dtype == FR_F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
}

/* 16-bit storage <-> f32 working copies for the optimizer (pure half mode). */
static void widen(const void *src, fr_dtype dt, float *dst, size_t n) {
    if (dt == FR_F16) fr_f16_to_f32_n(src, dst, n);
    else fr_bf16_to_f32_n(src, dst, n);
}

static void narrow(const float *src, fr_dtype dt, void *dst, size_t n) {
    if (dt == FR_F16) fr_f32_to_f16_n(src, dst, n);
    else fr_f32_to_bf16_n(src, dst, n);
}

fr_status fr_optim_update(fr_ctx *ctx, const fr_optim_opts *o, fr_model *m, const int *gv,
                          const uint8_t *fused, int64_t t) {
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (gv[i] < 0 || !p->grad_valid) continue; /* PyTorch skips params whose grad is None */
        if (fused && fused[i]) continue;           /* updated inside backward */
        size_t n = (size_t)fr_shape_numel(&p->shape);
        int half = p->dtype != FR_F32, ns = fr_optim_states(o);
        if (half && o->kind != FR_OPTIM_SGD) { /* one fused pass over the 16-bit tensors */
            fr_k_adam_half(p->data, fr_grad_data(p), p->grad16 != NULL, (uint16_t *)p->state[0],
                           (uint16_t *)p->state[1], n, o, t, o->kind == FR_OPTIM_ADAMW,
                           p->dtype == FR_F16);
            continue;
        }
        float *w = p->data, *st[2] = {p->state[0], p->state[1]}, *grad = p->grad;
        if (half) { /* the update in f32, the result rounded back to 16 bits, state too */
            w = fr_alloc(ctx, n * sizeof *w * (size_t)(2 + ns), FR_MEM_WORKSPACE);
            if (!w) return FR_ERR_NOMEM;
            widen(p->data, p->dtype, w, n);
            if (p->grad16) {
                grad = w + n * (size_t)(1 + ns);
                widen(p->grad16, p->dtype, grad, n);
            }
            for (int k = 0; k < ns; k++) {
                st[k] = w + n * (size_t)(k + 1);
                widen(p->state[k], p->dtype, st[k], n);
            }
        }
        if (o->kind == FR_OPTIM_SGD) fr_k_sgd(w, grad, st[0], n, o, t == 1);
        else if (p->state_kind != FR_STATE_F32 && !half)
            fr_k_adam_state(w, p->grad, st[0], st[1], n, o, t, o->kind == FR_OPTIM_ADAMW,
                            (fr_state_kind)p->state_kind);
        else fr_k_adam(w, grad, st[0], st[1], n, o, t, o->kind == FR_OPTIM_ADAMW);
        if (half) {
            narrow(w, p->dtype, p->data, n);
            for (int k = 0; k < ns; k++) narrow(st[k], p->dtype, p->state[k], n);
            fr_free(ctx, w);
        }
    }
    return FR_OK;
}

void fr_optim_step_range(const fr_optim_opts *o, fr_param *p, float *w, const float *g, size_t n,
                         int64_t t) {
    if (o->kind == FR_OPTIM_SGD) fr_k_sgd(w, g, p->state[0], n, o, t == 1);
    else if (p->state_kind != FR_STATE_F32) /* bf16 moments: element by element */
        fr_k_adam_state(w, g, p->state[0], p->state[1], n, o, t, o->kind == FR_OPTIM_ADAMW,
                        (fr_state_kind)p->state_kind);
    else fr_k_adam(w, g, p->state[0], p->state[1], n, o, t, o->kind == FR_OPTIM_ADAMW);
}

int fr_optim_unscale(fr_model *m, const int *gv, float inv) {
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (gv[i] < 0 || !fr_grad_data(p) || !p->grad_valid) continue;
        if (fr_k_grad_unscale(fr_grad_data(p), fr_grad_dtype(p), (size_t)fr_shape_numel(&p->shape),
                              inv))
            return 1;
    }
    return 0;
}

float fr_optim_clip_coef(double sumsq, float max_norm) {
    return max_norm / ((float)sqrt(sumsq) + 1e-6f);
}

void fr_optim_clip(fr_model *m, const int *gv, float max_norm) {
    double total = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (gv[i] < 0 || !fr_grad_data(p) || !p->grad_valid) continue;
        total +=
            fr_k_grad_sumsq(fr_grad_data(p), fr_grad_dtype(p), (size_t)fr_shape_numel(&p->shape));
    }
    float coef = fr_optim_clip_coef(total, max_norm);
    if (coef >= 1.0f) return;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (gv[i] < 0 || !fr_grad_data(p) || !p->grad_valid) continue;
        fr_k_grad_scale(fr_grad_data(p), fr_grad_dtype(p), (size_t)fr_shape_numel(&p->shape), coef);
    }
}
