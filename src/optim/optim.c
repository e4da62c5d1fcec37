/* optim.c — the optimizer over a model's parameters (optim.h): its records
 * on model->optim, and which tensors are stepped, unscaled and clipped, in
 * which format, at which step. The arithmetic of one tensor is the
 * backend's members (optim_update, grad_*), the host's when the optimizer
 * is offloaded; a ZeRO rank's range goes through the CPU backend's. */
#include "optim/optim.h"

#include <math.h>
#include <string.h>

#include "backend/state.h"

size_t fr_optim_grad_align(fr_dtype dt) { return fr_dtype_size(dt) < 4 ? fr_dtype_size(dt) : 4; }

size_t fr_optim_state_align(int kind, int half_weight) {
    return half_weight || kind == FR_STATE_BF16 ? 2 : 4; /* int8: its absmax floats */
}

static void block_free(fr_ctx *ctx, fr_optim_block *b) {
    if (b->buf) b->be->release(ctx, b->buf);
    memset(b, 0, sizeof *b);
}

/* A block of `bytes` in be's memory (category cat), zeros if `zero`. */
static fr_status block_take(fr_ctx *ctx, const fr_backend *be, int host, size_t bytes,
                            fr_mem_cat cat, int zero, fr_optim_block *b) {
    memset(b, 0, sizeof *b);
    if (!bytes) return FR_OK;
    if (!(b->buf = be->alloc(ctx, bytes, cat))) return FR_ERR_NOMEM;
    b->bytes = bytes, b->be = be, b->host = host;
    fr_status st = zero ? (fr_status)be->zero(ctx, b->buf, 0, bytes) : FR_OK;
    if (st) block_free(ctx, b);
    return st;
}

static void optim_free(fr_model *m) {
    struct fr_optim *o = m->optim;
    if (!o) return;
    block_free(m->ctx, &o->grads);
    block_free(m->ctx, &o->host_grads);
    for (int k = 0; k < 2; k++)
        block_free(m->ctx, &o->state[k]), block_free(m->ctx, &o->host_state[k]);
    block_free(m->ctx, &o->scratch);
    fr_free(m->ctx, o->p);
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
    m->optim = o;
    m->optim_free = optim_free;
    return o;
}

size_t fr_optim_held_bytes(const fr_model *m, size_t i) {
    return m->optim && m->optim->p[i].state[0] ? m->optim->p[i].state_bytes : 0;
}

size_t fr_optim_meta_bytes(const fr_model *m, int reserved) {
    size_t a = sizeof(struct fr_optim), b = (m->n_params + 1) * sizeof(fr_optim_param);
    return reserved ? fr_mem_block_bytes(a) + fr_mem_block_bytes(b) : a + b;
}

size_t fr_optim_grads_bytes(const fr_model *m, fr_optim_size_fn size, const void *arg) {
    size_t end = 0;
    for (size_t i = m->n_params; i-- > 0;) {
        fr_dtype dt = FR_F32;
        size_t b = size(arg, i, &dt);
        if (b) fr_flat_place(&end, b, fr_optim_grad_align(dt));
    }
    return end;
}

fr_status fr_optim_alloc_grads(fr_ctx *ctx, const fr_backend *be, int host, fr_model *m,
                               fr_optim_size_fn size, const void *arg, int zero) {
    struct fr_optim *o = fr_optim_of(m);
    if (!o) return FR_ERR_NOMEM;
    if (o->grads.buf) return FR_OK;
    fr_status st = block_take(ctx, be, host, fr_optim_grads_bytes(m, size, arg), FR_MEM_GRADS, zero,
                              &o->grads);
    if (st) return st;
    size_t end = 0;
    for (size_t i = m->n_params; i-- > 0;) {
        fr_optim_param *q = &o->p[i];
        fr_dtype dt = FR_F32;
        size_t b = size(arg, i, &dt);
        q->grad = NULL, q->grad_off = 0, q->grad_view = 0, q->grad_valid = 0;
        if (!b) continue;
        q->grad_off = fr_flat_place(&end, b, fr_optim_grad_align(dt));
        q->grad = o->grads.buf, q->grad_dt = dt;
    }
    return FR_OK;
}

fr_status fr_optim_alloc_host_grads(fr_ctx *ctx, fr_model *m) {
    struct fr_optim *o = fr_optim_of(m);
    if (!o) return FR_ERR_NOMEM;
    if (o->host_grads.buf || !o->grads.bytes) return FR_OK;
    return block_take(ctx, &fr_cpu_backend, 1, o->grads.bytes, FR_MEM_GRADS, 0, &o->host_grads);
}

size_t fr_optim_state_block_bytes(const fr_model *m, fr_optim_state_fn size, const void *arg) {
    size_t end = 0;
    for (size_t i = m->n_params; i-- > 0;) {
        int kind = 0;
        size_t b = size(arg, i, &kind);
        if (b) fr_flat_place(&end, b, fr_optim_state_align(kind, m->params[i].dtype != FR_F32));
    }
    return end;
}

fr_status fr_optim_alloc_state(fr_ctx *ctx, const fr_backend *be, int host, fr_model *m, int ns,
                               fr_optim_state_fn size, const void *arg) {
    struct fr_optim *o = fr_optim_of(m);
    if (!o) return FR_ERR_NOMEM;
    size_t end = fr_optim_state_block_bytes(m, size, arg);
    int same = 1; /* the records' formats (the offsets follow from the sizes and formats) */
    for (size_t i = 0; i < m->n_params; i++) {
        int kind = 0;
        if (size(arg, i, &kind)) same &= o->p[i].state_kind == kind;
    }
    for (int k = 0; k < 2; k++) /* a resumed run with another format or layout starts over */
        if (o->state[k].buf &&
            (!same || o->state[k].bytes != end || o->state[k].be != be || k >= ns))
            block_free(ctx, &o->state[k]);
    fr_status st = FR_OK;
    for (int k = 0; k < ns && !st; k++) {
        if (o->state[k].buf) continue;
        const fr_optim_block *h = &o->host_state[k]; /* a device's state loaded on the host */
        int from_host = h->buf && h->bytes == end && same;
        if ((st = block_take(ctx, be, host, end, FR_MEM_OPTIM, !from_host, &o->state[k]))) break;
        if (from_host && end) st = (fr_status)be->write(ctx, o->state[k].buf, 0, h->buf, end);
    }
    end = 0;
    for (size_t i = m->n_params; i-- > 0 && !st;) {
        fr_optim_param *q = &o->p[i];
        int kind = 0;
        size_t b = size(arg, i, &kind);
        q->state[0] = q->state[1] = NULL;
        if (!b) continue;
        q->state_off =
            fr_flat_place(&end, b, fr_optim_state_align(kind, m->params[i].dtype != FR_F32));
        q->state_kind = kind, q->state_bytes = b;
        for (int k = 0; k < ns; k++) q->state[k] = o->state[k].buf;
    }
    return st;
}

fr_status fr_optim_alloc_scratch(fr_ctx *ctx, const fr_backend *be, fr_model *m, size_t bytes) {
    struct fr_optim *o = fr_optim_of(m);
    if (!o) return FR_ERR_NOMEM;
    if (o->scratch.buf && o->scratch.bytes == bytes && o->scratch.be == be) return FR_OK;
    block_free(ctx, &o->scratch);
    return block_take(ctx, be, 0, bytes, FR_MEM_OPTIM, 0, &o->scratch);
}

void *fr_optim_host_grad(const fr_model *m, size_t i) {
    const struct fr_optim *o = m->optim;
    if (!o || !o->p[i].grad) return NULL;
    if (o->p[i].grad == o->grads.buf && !o->grads.host) /* a device's: the host copy */
        return fr_optim_at(o->host_grads.buf, o->p[i].grad_off);
    return fr_optim_at(o->p[i].grad, o->p[i].grad_off);
}

void *fr_optim_host_state(const fr_model *m, size_t i, int k) {
    const struct fr_optim *o = m->optim;
    if (!o || !o->p[i].state[k]) return NULL;
    if (o->p[i].state[k] == o->state[k].buf && !o->state[k].host) /* a device's */
        return fr_optim_at(o->host_state[k].buf, o->p[i].state_off);
    return fr_optim_at(o->p[i].state[k], o->p[i].state_off);
}

/* The tensors of param i the update reads and writes, in be's memory: the
 * weights (.data on the host, .buf on a device: each backend reads its
 * own), the gradient (the host's copy when offloaded) and the state. */
/* A view (handle, off) of a backend's memory as a tensor: on the host its
 * pointer (the CPU's handle is one), on a device .buf and .off. */
static fr_tensor view_t(void *h, size_t off, fr_dtype dt, fr_shape shape) {
    return (fr_tensor){
        .dtype = dt, .shape = shape, .data = fr_optim_at(h, off), .buf = h, .off = off};
}

static fr_tensor weights_t(const fr_param *p) {
    return (fr_tensor){
        .dtype = p->dtype, .shape = p->shape, .data = p->data, .buf = p->ddata, .off = p->off};
}

static fr_tensor grad_t(const fr_model *m, size_t i, int offloaded) {
    const fr_optim_param *q = fr_optp(m, i);
    if (offloaded) { /* the host copy, at the block's offsets */
        void *g = fr_optim_at(m->optim->host_grads.buf, q->grad_off);
        return (fr_tensor){.dtype = q->grad_dt, .shape = m->params[i].shape, .data = g, .buf = g};
    }
    return view_t(q->grad, q->grad_off, q->grad_dt, m->params[i].shape);
}

static int has_grad(const fr_model *m, const int *gv, size_t i) {
    return gv[i] >= 0 && fr_optp(m, i)->grad && fr_optp(m, i)->grad_valid;
}

fr_status fr_optim_step_param(fr_ctx *ctx, const fr_backend *be, const fr_optim_opts *o,
                              fr_model *m, size_t i, const fr_tensor *g, int64_t t) {
    if (!m->optim || i >= m->n_params)
        return fr_fail(ctx, FR_ERR_ARG, "optimizer step of parameter %zu: the model has %s", i,
                       m->optim ? "fewer parameters" : "no optimizer state");
    const fr_optim_param *q = fr_optp(m, i);
    fr_tensor w = weights_t(&m->params[i]), state[2];
    for (int k = 0; k < 2; k++)
        state[k] = view_t(q->state[k], q->state_off, FR_F32, m->params[i].shape);
    const fr_optim_block *sc = &m->optim->scratch; /* a whole-tensor rule's, on its backend */
    if (fr_optim_whole_tensor(o) && sc->buf && sc->be == be)
        state[1] = view_t(sc->buf, 0, FR_F32, fr_shape1((int64_t)(sc->bytes / 4)));
    return (fr_status)be->optim_update(ctx, o, t, &w, g, state, q->state_kind);
}

fr_status fr_optim_update(fr_ctx *ctx, const fr_backend *be, const fr_optim_opts *o, fr_model *m,
                          const int *gv, const uint8_t *fused, int64_t t, int offloaded) {
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        const fr_optim_param *q = fr_optp(m, i);
        if (gv[i] < 0 || !q->grad_valid) continue; /* PyTorch skips params whose grad is None */
        if (fused && fused[i]) continue;           /* updated inside backward */
        fr_tensor g = grad_t(m, i, offloaded);
        st = fr_optim_step_param(ctx, be, o, m, i, &g, t);
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
    fr_tensor st[2] = {range_t(fr_optim_at(q->state[0], q->state_off), n),
                       range_t(fr_optim_at(q->state[1], q->state_off), n)};
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
    struct fr_optim *o = m->optim;
    for (size_t i = 0; o && i < m->n_params; i++) {
        fr_optim_param *q = fr_optp(m, i);
        q->grad_valid = 0;
        if (to_none && !q->grad_view)
            q->grad = NULL; /* a bucket's view stays: the buckets are sent */
    }
    if (o && to_none) block_free(m->ctx, &o->grads), block_free(m->ctx, &o->host_grads);
}

fr_status fr_optim_grads_down(fr_model *m) {
    const struct fr_optim *o = m->optim;
    if (!o || !o->grads.buf || !o->host_grads.buf) return FR_OK;
    return (fr_status)o->grads.be->read(m->ctx, o->grads.buf, 0, o->host_grads.buf, o->grads.bytes);
}

fr_status fr_optim_state_down(fr_model *m) {
    struct fr_optim *o = m->optim;
    for (int k = 0; o && k < 2; k++) {
        fr_optim_block *b = &o->state[k], *h = &o->host_state[k];
        if (!b->buf || b->host) continue; /* the host's state is its own copy */
        if (h->buf && h->bytes != b->bytes) block_free(m->ctx, h);
        fr_status st =
            h->buf ? FR_OK : block_take(m->ctx, &fr_cpu_backend, 1, b->bytes, FR_MEM_OPTIM, 0, h);
        if (st) return st;
        if ((st = (fr_status)b->be->read(m->ctx, b->buf, 0, h->buf, b->bytes))) return st;
    }
    return FR_OK;
}

fr_status fr_optim_state_up(fr_model *m) {
    struct fr_optim *o = m->optim;
    for (int k = 0; o && k < 2; k++) {
        fr_optim_block *b = &o->state[k], *h = &o->host_state[k];
        if (!b->buf || b->host || !h->buf || h->bytes != b->bytes) continue;
        fr_status st = (fr_status)b->be->write(m->ctx, b->buf, 0, h->buf, b->bytes);
        if (st) return st;
    }
    return FR_OK;
}
