/* optim.c — the optimizer over a model's parameters (optim.h): its records
 * on model->optim, and which tensors are stepped, unscaled and clipped, in
 * which format, at which step. The arithmetic of one tensor is the
 * backend's members (optim_update, grad_*), the host's when the optimizer
 * is offloaded; a ZeRO rank's range goes through the CPU backend's. */
#include "optim/optim.h"

#include <math.h>

#include "backend/state.h"

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

static void optim_free(fr_model *m) {
    struct fr_optim *o = m->optim;
    const fr_backend *be = fr_backend_of(m->ctx);
    for (size_t i = 0; o && i < o->n; i++) {
        fr_optim_param *q = &o->p[i];
        if (!q->grad_view) be->release(m->ctx, q->grad);
        for (int k = 0; k < 2; k++) {
            if (o->state_host) fr_free(m->ctx, q->state[k]);
            else be->release(m->ctx, q->state[k]);
            fr_free(m->ctx, q->host_state[k]);
        }
        fr_free(m->ctx, q->host_grad);
    }
    if (o) fr_free(m->ctx, o->p);
    fr_free(m->ctx, o);
    m->optim = NULL;
}

struct fr_optim *fr_optim_of(fr_model *m) {
    if (m->optim) return m->optim;
    struct fr_optim *o = fr_calloc(m->ctx, sizeof *o, FR_MEM_OTHER);
    if (o && !(o->p = fr_calloc(m->ctx, (m->n_params + 1) * sizeof *o->p, FR_MEM_OTHER))) {
        fr_free(m->ctx, o);
        o = NULL;
    }
    if (!o) return NULL;
    o->n = m->n_params;
    o->state_host = 1;
    m->optim = o;
    m->optim_free = optim_free;
    return o;
}

size_t fr_optim_held_bytes(const fr_model *m, size_t i) {
    const fr_param *p = &m->params[i];
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (p->dtype != FR_F32) return n * fr_dtype_size(p->dtype);
    return fr_state_bytes((fr_state_kind)fr_optp(m, i)->state_kind, n);
}

size_t fr_optim_meta_bytes(const fr_model *m, int reserved) {
    size_t a = sizeof(struct fr_optim), b = (m->n_params + 1) * sizeof(fr_optim_param);
    return reserved ? fr_mem_block_bytes(a) + fr_mem_block_bytes(b) : a + b;
}

void *fr_optim_host_grad(const fr_model *m, size_t i) {
    if (!m->optim) return NULL;
    return m->optim->grad_host ? m->optim->p[i].grad : m->optim->p[i].host_grad;
}

void *fr_optim_host_state(const fr_model *m, size_t i, int k) {
    if (!m->optim) return NULL;
    return m->optim->state_host ? m->optim->p[i].state[k] : m->optim->p[i].host_state[k];
}

/* The tensors of param i the update reads and writes, in be's memory: the
 * weights (.data on the host, .buf on a device: each backend reads its
 * own), the gradient (the host's copy when offloaded) and the state. */
static fr_tensor weights_t(const fr_param *p) {
    return (fr_tensor){.dtype = p->dtype, .shape = p->shape, .data = p->data, .buf = p->ddata};
}

static fr_tensor grad_t(const fr_model *m, size_t i, int offloaded) {
    const fr_optim_param *q = fr_optp(m, i);
    void *g = offloaded ? q->host_grad : q->grad;
    return (fr_tensor){.dtype = q->grad_dt, .shape = m->params[i].shape, .data = g, .buf = g};
}

static int has_grad(const fr_model *m, const int *gv, size_t i) {
    return gv[i] >= 0 && fr_optp(m, i)->grad && fr_optp(m, i)->grad_valid;
}

fr_status fr_optim_update(fr_ctx *ctx, const fr_backend *be, const fr_optim_opts *o, fr_model *m,
                          const int *gv, const uint8_t *fused, int64_t t, int offloaded) {
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_optim_param *q = fr_optp(m, i);
        if (gv[i] < 0 || !q->grad_valid) continue; /* PyTorch skips params whose grad is None */
        if (fused && fused[i]) continue;           /* updated inside backward */
        fr_tensor w = weights_t(&m->params[i]), g = grad_t(m, i, offloaded);
        fr_tensor state[2];
        for (int k = 0; k < 2; k++)
            state[k] = (fr_tensor){.dtype = FR_F32,
                                   .shape = m->params[i].shape,
                                   .data = q->state[k],
                                   .buf = q->state[k]};
        st = be->optim_update(ctx, o, t, &w, &g, state, q->state_kind);
    }
    return st;
}

/* n host f32 values at x as a tensor (a ZeRO rank's range). */
static fr_tensor range_t(const float *x, size_t n) {
    return (fr_tensor){
        .dtype = FR_F32, .shape = fr_shape1((int64_t)n), .data = (void *)x, .buf = (void *)x};
}

fr_status fr_optim_step_range(fr_ctx *ctx, const fr_optim_opts *o, fr_optim_param *q, float *w,
                              const float *g, size_t n, int64_t t) {
    fr_tensor wt = range_t(w, n), gt = range_t(g, n);
    fr_tensor st[2] = {range_t(q->state[0], n), range_t(q->state[1], n)};
    return fr_cpu_backend.optim_update(ctx, o, t, &wt, &gt, st, q->state_kind);
}

int fr_optim_range_unscale(fr_ctx *ctx, float *g, size_t n, float inv) {
    fr_tensor t = range_t(g, n);
    int found = 0;
    fr_cpu_backend.grad_unscale(ctx, &t, inv, &found);
    return found;
}

double fr_optim_range_sumsq(fr_ctx *ctx, const float *g, size_t n) {
    fr_tensor t = range_t(g, n);
    double out = 0;
    fr_cpu_backend.grad_sumsq(ctx, &t, &out);
    return out;
}

void fr_optim_range_scale(fr_ctx *ctx, float *g, size_t n, float f) {
    fr_tensor t = range_t(g, n);
    fr_cpu_backend.grad_scale(ctx, &t, f);
}

fr_status fr_optim_unscale(fr_ctx *ctx, const fr_backend *be, fr_model *m, const int *gv, float inv,
                           int offloaded, int *found_inf) {
    fr_status st = FR_OK;
    *found_inf = 0;
    for (size_t i = 0; i < m->n_params && !*found_inf && !st; i++) {
        if (!has_grad(m, gv, i)) continue;
        fr_tensor g = grad_t(m, i, offloaded);
        st = be->grad_unscale(ctx, &g, inv, found_inf);
    }
    return st;
}

float fr_optim_clip_coef(double sumsq, float max_norm) {
    return max_norm / ((float)sqrt(sumsq) + 1e-6f);
}

fr_status fr_optim_clip(fr_ctx *ctx, const fr_backend *be, fr_model *m, const int *gv,
                        float max_norm, int offloaded) {
    fr_status st = FR_OK;
    double total = 0;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        if (!has_grad(m, gv, i)) continue;
        fr_tensor g = grad_t(m, i, offloaded);
        double part = 0;
        st = be->grad_sumsq(ctx, &g, &part);
        total += part;
    }
    float coef = fr_optim_clip_coef(total, max_norm);
    for (size_t i = 0; coef < 1.0f && i < m->n_params && !st; i++) {
        if (!has_grad(m, gv, i)) continue;
        fr_tensor g = grad_t(m, i, offloaded);
        st = be->grad_scale(ctx, &g, coef);
    }
    return st;
}

fr_status fr_optim_after_backward(fr_ctx *ctx, const fr_backend *be, fr_model *m,
                                  const fr_optim_opts *o, const int *gv, const uint8_t *fused,
                                  fr_scaler *sc, float max_norm, float loss, int64_t *t,
                                  int offloaded) {
    fr_status st = FR_OK;
    /* Scanning every gradient is the scaler's job (an overflow in a scaled
     * backward shows as inf/NaN); without one, as in PyTorch, a non-finite
     * gradient reaches the weights and the next loss reports it. */
    int found_inf = !isfinite(loss);
    if (!found_inf && sc->enabled)
        st = fr_optim_unscale(ctx, be, m, gv, fr_scaler_inv_scale(sc), offloaded, &found_inf);
    if (st) return st;
    if (found_inf) {
        fr_scaler_update(sc, 1); /* skip the step: the weights stay as they were */
        return FR_OK;
    }
    if (max_norm > 0 && (st = fr_optim_clip(ctx, be, m, gv, max_norm, offloaded))) return st;
    ++*t;
    if ((st = fr_optim_update(ctx, be, o, m, gv, fused, *t, offloaded))) return st;
    if (sc->enabled) fr_scaler_update(sc, 0);
    return FR_OK;
}

void fr_optim_zero_grad(fr_model *m, int to_none) {
    const fr_backend *be = fr_backend_of(m->ctx);
    for (size_t i = 0; m->optim && i < m->n_params; i++) {
        fr_optim_param *q = fr_optp(m, i);
        q->grad_valid = 0;
        if (!to_none) continue;
        if (!q->grad_view) { /* a bucket's view stays: the buckets are sent */
            be->release(m->ctx, q->grad);
            q->grad = NULL;
        }
        fr_free(m->ctx, q->host_grad);
        q->host_grad = NULL;
    }
}
