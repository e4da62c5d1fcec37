/* device.c — the training step on a device backend (see device.h). */
#include "train/device.h"
#include <math.h>
#include <string.h>
#include "backend/cpu/optim_state.h"
#include "core/ctx.h"
#include "train/feed.h"

int fr_step_on_device(const fr_step *s) { return fr_backend_is_device(fr_backend_of(s->ctx)); }

static size_t numel(const fr_param *p) { return (size_t)fr_shape_numel(&p->shape); }
static size_t bytes_of(const fr_param *p) { return numel(p) * fr_dtype_size(p->dtype); }

/* One optimizer-state buffer of p in its format (fr_state_bytes' layout; a
 * 16-bit weight's state in the weight's format, fr_step_state_bytes). */
static size_t state_bytes(const fr_param *p) {
    if (p->dtype != FR_F32) return bytes_of(p);
    return fr_state_bytes((fr_state_kind)p->state_kind, numel(p));
}

static fr_tensor dev_tensor(const fr_param *p, void *buf, fr_dtype dt) {
    return (fr_tensor){.dtype = dt, .shape = p->shape, .buf = buf};
}

/* Parameter i's gradient on the device: f32, or 16-bit in its format (pure
 * half precision: the graph's gradient value says which). */
static fr_tensor dev_grad(const fr_step *s, size_t i) {
    const fr_param *p = &s->m->params[i];
    return dev_tensor(p, p->dgrad, s->g.vals[s->gv[i]].dtype);
}

/* The step's GEMM scratch: its GEMMs' temporary buffers, then the fused SGD
 * step's weight gradient (opencl/gemm.c), in floats. */
static size_t scratch_floats(const fr_step *s) { return s->gemm_ws + s->upd_ws_len; }

fr_status fr_dev_scratch(fr_step *s, int take) {
    const fr_backend *be = fr_backend_of(s->ctx);
    if (!take) {
        be->release(s->ctx, s->dev_ws);
        s->dev_ws = NULL;
        return FR_OK;
    }
    if (!scratch_floats(s) || s->dev_ws) return FR_OK;
    /* workspace (CLBlast's buffers), or gradients when it holds only the
     * fused step's (fr_step_persistent's categories) */
    s->dev_ws = be->alloc(s->ctx, scratch_floats(s) * sizeof(float),
                          s->gemm_ws ? FR_MEM_WORKSPACE : FR_MEM_GRADS);
    return s->dev_ws ? FR_OK : FR_ERR_NOMEM;
}

/* A device buffer of `bytes` in category cat, holding src (or zeros). */
static fr_status upload(fr_ctx *ctx, void **buf, const void *src, size_t bytes, fr_mem_cat cat) {
    const fr_backend *be = fr_backend_of(ctx);
    if (!*buf && !(*buf = be->alloc(ctx, bytes, cat))) return FR_ERR_NOMEM;
    return src ? be->write(ctx, *buf, 0, src, bytes) : be->zero(ctx, *buf, 0, bytes);
}

fr_status fr_dev_materialize(fr_step *s) {
    fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    fr_status st;
    const fr_optim_opts *o = &s->o.optim;
    const int offload = s->o.offload & FR_OFFLOAD_OPTIMIZER;
    int ns = offload ? 0 : fr_optim_states(o);
    if (s->o.training && offload && (st = fr_step_alloc_host_update(s))) return st;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (!p->ddata && (st = upload(ctx, &p->ddata, p->data, bytes_of(p), FR_MEM_PARAMS)))
            return st;
        if (!s->o.training || s->gv[i] < 0) continue;
        int kind; /* (a parameter stepped inside backward keeps no gradient buffer) */
        size_t sb = fr_optim_state_bytes(&s->o.optim, s->o.optim_state, p, &kind);
        p->state_kind = kind;        /* f32, bf16 or int8 blocks: the device's kernels take each */
        for (int k = 0; k < ns; k++) /* a resumed run's host state, or zeros */
            if (!p->dstate[k] && (st = upload(ctx, &p->dstate[k], p->state[k], sb, FR_MEM_OPTIM)))
                return st;
    }
    if ((st = fr_dev_scratch(s, 1))) return st;
    /* the batch's device buffers: two whole batches uploaded ahead, or a
     * micro-batch of inputs and of labels */
    if (fr_feed_used(s)) return s->feed ? FR_OK : fr_feed_new(s, &s->feed);
    const fr_graph *g = &s->g;
    size_t xb = fr_value_bytes(&g->vals[g->input]), yb = fr_value_bytes(&g->vals[g->label]);
    if (!s->dev_x && !(s->dev_x = fr_backend_of(ctx)->alloc(ctx, xb, FR_MEM_DATA)))
        return FR_ERR_NOMEM;
    if (!s->dev_y && !(s->dev_y = fr_backend_of(ctx)->alloc(ctx, yb, FR_MEM_DATA)))
        return FR_ERR_NOMEM;
    return FR_OK;
}

void fr_dev_bind(fr_step *s) {
    fr_model *m = s->m;
    fr_exec *e = &s->ex;
    const fr_backend *be = fr_backend_of(s->ctx);
    if (s->slots) { /* OPTIM_STEP nodes: step t + 1 on the device's state */
        for (size_t i = 0; i < m->n_params; i++)
            s->slots[i] =
                (fr_optim_slot){.state_buf = {m->params[i].dstate[0], m->params[i].dstate[1]},
                                .state_kind = m->params[i].state_kind};
        s->optim_ctx = (fr_optim_ctx){&s->o.optim, s->t + 1, s->slots};
        e->optim = &s->optim_ctx;
    }
    e->upd_lr = s->o.optim.lr; /* the plain SGD step inside LINEAR_BWD */
    e->upd_wd = s->o.optim.weight_decay;
    e->upd_ws = (float *)s->dev_ws; /* a device buffer: opencl/gemm.c reads it so */
    e->upd_ws_len = s->dev_ws ? scratch_floats(s) : 0;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        fr_exec_bind_dev(e, s->pv[i], p->ddata, 0);
        if (s->gv[i] < 0) continue;
        if (s->fused && s->fused[i] == 1) { /* LINEAR_BWD steps the weight itself */
            fr_exec_bind_dev(e, s->gv[i], p->ddata, 0);
            continue;
        }
        if (s->fused && s->fused[i]) continue; /* an arena value */
        if (!p->dgrad) {
            p->dgrad = be->alloc(s->ctx, fr_step_grad_bytes(s, i), FR_MEM_GRADS);
            p->grad_valid = 0;
        }
        fr_exec_bind_dev(e, s->gv[i], p->dgrad, 0);
        e->written[s->gv[i]] = (uint8_t)(p->dgrad && p->grad_valid);
    }
}

/* fr_dev_bind's refusal (its message set), if a gradient could not be allocated. */
static fr_status grads_bound(const fr_step *s) {
    for (size_t i = 0; i < s->m->n_params; i++)
        if (s->gv[i] >= 0 && !(s->fused && s->fused[i]) && !s->m->params[i].dgrad)
            return FR_ERR_NOMEM;
    return FR_OK;
}

fr_status fr_dev_batch(fr_step *s, const fr_batch *b, int off, int n) {
    const fr_graph *g = &s->g;
    const fr_backend *be = fr_backend_of(s->ctx);
    if (grads_bound(s)) return FR_ERR_NOMEM;
    int ce = s->m->loss == FR_LOSS_CROSS_ENTROPY, tokens = s->m->in_dtype == FR_I32;
    size_t xs = fr_value_bytes(&g->vals[g->input]) / (size_t)s->micro;
    size_t ys = fr_value_bytes(&g->vals[g->label]) / (size_t)s->micro;
    const char *x = tokens ? (const char *)b->idx : (const char *)b->x;
    const char *y = ce ? (const char *)b->y : (const char *)b->target;
    fr_status st = be->write(s->ctx, s->dev_x, 0, x + (size_t)off * xs, (size_t)n * xs);
    if (!st) st = be->write(s->ctx, s->dev_y, 0, y + (size_t)off * ys, (size_t)n * ys);
    fr_exec_bind_dev(&s->ex, g->input, s->dev_x, 0);
    fr_exec_bind_dev(&s->ex, g->label, s->dev_y, 0);
    return st;
}

fr_status fr_dev_loss(fr_step *s, float *loss) {
    const fr_exec *e = &s->ex;
    int v = s->g.loss;
    return fr_backend_of(s->ctx)->read(s->ctx, e->buf[v], e->off[v], loss, sizeof *loss);
}

/* The logits of the n samples just run against their labels where the step
 * bound them (a micro-batch's buffer or the feed's slot), counted on the
 * device: 8 bytes come back, not the logits. */
fr_status fr_dev_hits(fr_step *s, int n, int *hits) {
    const fr_graph *g = &s->g;
    const fr_exec *e = &s->ex;
    const fr_backend *be = fr_backend_of(s->ctx);
    *hits = 0;
    if (s->m->loss != FR_LOSS_CROSS_ENTROPY) return FR_OK;
    const fr_value *zv = &g->vals[g->logits], *yv = &g->vals[g->label];
    if (zv->dtype != FR_F32 || yv->dtype != FR_I32)
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "accuracy on the device takes f32 logits and i32 labels, not %s and %s",
                       fr_dtype_name(zv->dtype), fr_dtype_name(yv->dtype));
    /* the first n samples' rows: (n, K) or (n, T, K) */
    fr_shape zs = zv->shape, ys = yv->shape;
    zs.d[0] = n, ys.d[0] = n;
    const fr_tensor z = {
        .dtype = FR_F32, .shape = zs, .buf = e->buf[g->logits], .off = e->off[g->logits]};
    const fr_tensor y = {
        .dtype = FR_I32, .shape = ys, .buf = e->buf[g->label], .off = e->off[g->label]};
    int64_t h = 0;
    if (!be->hits)
        return fr_fail(s->ctx, FR_ERR_ARG, "%s counts no accuracy on the device", be->name);
    fr_status st = be->hits(s->ctx, &z, &y, &h);
    *hits = (int)h;
    return st;
}

fr_status fr_dev_run(fr_step *s, const fr_batch *b, float *loss, int *correct) {
    fr_model *m = s->m;
    fr_exec *e = &s->ex;
    fr_status st = FR_OK;
    fr_dev_bind(s);
    double total = 0;
    int hits = 0;
    int slot = -1;
    if (s->feed && ((st = grads_bound(s)) || (st = fr_feed_acquire(s, b, &slot)))) return st;
    for (int off = 0; off < b->n && !st; off += s->micro) {
        int n = b->n - off < s->micro ? b->n - off : s->micro, h = 0;
        float share = (float)n / (float)b->n, l = 0;
        if (s->feed) fr_feed_bind(s, slot, off);
        else if ((st = fr_dev_batch(s, b, off, n))) break;
        fr_step_set_loss_scale(s, s->scaler.enabled ? share * s->scaler.scale : share);
        /* with steps inside backward, the loss is checked before any runs */
        int split = s->n_fused ? s->loss_pos + 1 : s->plan.n_nodes;
        st = fr_exec_run(e, 0, split, n, s->o.seed, s->runs);
        if (!st) st = fr_dev_loss(s, &l);
        if (!st && split < s->plan.n_nodes && !isfinite(l))
            st = fr_step_nonfinite(s, l, s->runs + 1);
        if (!st) st = fr_exec_run(e, split, s->plan.n_nodes, n, s->o.seed, s->runs);
        s->runs++;
        if (!st) st = fr_dev_hits(s, n, &h);
        total += (double)l * n;
        hits += h;
        fr_exec_finish(e);
    }
    if (slot >= 0) { /* its last read of the slot is enqueued */
        fr_status rs = fr_feed_release(s, slot);
        if (!st) st = rs;
    }
    if (st) return st;
    float l;
    if ((st = fr_step_report(s, b, total, hits, loss, correct, &l)) || !s->o.training) return st;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].role == FR_P_NUM_BATCHES) (*(int64_t *)m->params[i].data) += s->accumulate;
    return fr_dev_update(s, l);
}

static fr_status no_pass(fr_step *s, const char *what) {
    return fr_fail(s->ctx, FR_ERR_ARG, "%s has no %s pass on the device yet",
                   fr_backend_of(s->ctx)->name, what);
}

/* The optimizer offloaded: gradients down to the host, the host's update,
 * the updated weights up (running statistics stay where kernels keep them). */
static fr_status offloaded_update(fr_step *s, float loss) {
    fr_model *m = s->m;
    const fr_backend *be = fr_backend_of(s->ctx);
    fr_status st = fr_step_alloc_host_update(s); /* zero_grad may have freed them */
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0) continue;
        p->grad_valid = s->ex.written[s->gv[i]];
        if (p->grad_valid) /* f32, or the weights' 16 bits (fr_step_alloc_host_update's too) */
            st = be->read(s->ctx, p->dgrad, 0, p->grad16 ? (void *)p->grad16 : (void *)p->grad,
                          fr_step_grad_bytes(s, i));
    }
    if (st || (st = fr_step_host_update(s, loss))) return st;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] >= 0) st = be->write(s->ctx, p->ddata, 0, p->data, bytes_of(p));
        if (s->o.optim.zero_grad_to_none && p->dgrad) {
            be->release(s->ctx, p->dgrad);
            p->dgrad = NULL;
        }
    }
    return st;
}

fr_status fr_dev_update(fr_step *s, float loss) {
    fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    const fr_backend *be = fr_backend_of(ctx);
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params; i++)
        if (s->gv[i] >= 0 && !(s->fused && s->fused[i]))
            m->params[i].grad_valid = s->ex.written[s->gv[i]];
    if (s->o.offload & FR_OFFLOAD_OPTIMIZER) return offloaded_update(s, loss);
    int found_inf = !isfinite(loss);
    if (!found_inf && s->scaler.enabled) {
        if (!be->grad_unscale) return no_pass(s, "loss scaler");
        float inv = fr_scaler_inv_scale(&s->scaler);
        for (size_t i = 0; i < m->n_params && !found_inf && !st; i++) {
            fr_param *p = &m->params[i];
            if (s->gv[i] < 0 || !p->grad_valid) continue;
            fr_tensor g = dev_grad(s, i);
            st = be->grad_unscale(ctx, &g, inv, &found_inf);
        }
    }
    if (st) return st;
    if (found_inf) {
        fr_scaler_update(&s->scaler, 1);
    } else {
        if (s->o.clip_grad_norm > 0) {
            if (!be->grad_sumsq || !be->grad_scale) return no_pass(s, "clipping");
            double total = 0;
            for (size_t i = 0; i < m->n_params && !st; i++) {
                fr_param *p = &m->params[i];
                if (s->gv[i] < 0 || !p->grad_valid) continue;
                fr_tensor g = dev_grad(s, i);
                double part = 0;
                st = be->grad_sumsq(ctx, &g, &part);
                total += part;
            }
            float coef = fr_optim_clip_coef(total, s->o.clip_grad_norm);
            for (size_t i = 0; coef < 1.0f && i < m->n_params && !st; i++) {
                fr_param *p = &m->params[i];
                if (s->gv[i] < 0 || !p->grad_valid) continue;
                fr_tensor g = dev_grad(s, i);
                st = be->grad_scale(ctx, &g, coef);
            }
            if (st) return st;
        }
        if (!be->optim_update) return no_pass(s, "optimizer");
        s->t++;
        for (size_t i = 0; i < m->n_params && !st; i++) {
            fr_param *p = &m->params[i];
            if (s->gv[i] < 0 || (s->fused && s->fused[i]) || !p->grad_valid) continue;
            fr_tensor w = dev_tensor(p, p->ddata, p->dtype), g = dev_grad(s, i);
            fr_tensor state[2] = {dev_tensor(p, p->dstate[0], FR_F32),
                                  dev_tensor(p, p->dstate[1], FR_F32)};
            st = be->optim_update(ctx, &s->o.optim, s->t, &w, &g, state, p->state_kind);
        }
        if (st) return st;
        if (s->scaler.enabled) fr_scaler_update(&s->scaler, 0);
    }
    for (size_t i = 0; i < m->n_params; i++) { /* zero_grad */
        fr_param *p = &m->params[i];
        p->grad_valid = 0;
        if (s->o.optim.zero_grad_to_none && p->dgrad) {
            be->release(ctx, p->dgrad);
            p->dgrad = NULL;
        }
    }
    return FR_OK;
}

fr_status fr_model_to_host(fr_model *m) {
    const fr_backend *be = fr_backend_of(m->ctx);
    if (!fr_backend_is_device(be)) return FR_OK;
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (p->role == FR_P_NUM_BATCHES) continue; /* a host counter no kernel reads */
        if (p->ddata) st = be->read(m->ctx, p->ddata, 0, p->data, bytes_of(p));
        for (int k = 0; k < 2 && !st; k++) {
            if (!p->dstate[k]) continue;
            if (!p->state[k] && !(p->state[k] = fr_alloc(m->ctx, state_bytes(p), FR_MEM_OPTIM)))
                return FR_ERR_NOMEM;
            st = be->read(m->ctx, p->dstate[k], 0, p->state[k], state_bytes(p));
        }
    }
    return st;
}

fr_status fr_model_to_device(fr_model *m) {
    const fr_backend *be = fr_backend_of(m->ctx);
    if (!fr_backend_is_device(be)) return FR_OK;
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (p->ddata) st = be->write(m->ctx, p->ddata, 0, p->data, bytes_of(p));
        for (int k = 0; k < 2 && !st; k++)
            if (p->dstate[k] && p->state[k])
                st = be->write(m->ctx, p->dstate[k], 0, p->state[k], state_bytes(p));
    }
    return st;
}

void fr_model_release_device(fr_model *m) {
    const fr_backend *be = fr_backend_of(m->ctx);
    if (!fr_backend_is_device(be)) return;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        void **h[4] = {&p->ddata, &p->dgrad, &p->dstate[0], &p->dstate[1]};
        for (int k = 0; k < 4; k++) {
            be->release(m->ctx, *h[k]);
            *h[k] = NULL;
        }
    }
}

void fr_dev_step_free(fr_step *s) {
    const fr_backend *be = fr_backend_of(s->ctx);
    if (!fr_backend_is_device(be)) return;
    be->release(s->ctx, s->dev_x);
    be->release(s->ctx, s->dev_y);
    be->release(s->ctx, s->dev_ws);
    s->dev_x = s->dev_y = s->dev_ws = NULL;
    fr_feed_free(s->feed);
    s->feed = NULL;
}

size_t fr_dev_step_reserved(const fr_step *s) {
    const fr_model *m = s->m;
    const fr_mem *dm = s->ctx->dmem;
    const fr_backend *be = fr_backend_of(s->ctx);
    if (s->plan.arena_bytes > be->max_buffer(s->ctx)) return SIZE_MAX; /* cannot be one buffer */
    size_t r = 0;
    int ns = fr_optim_states(&s->o.optim);
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        r += fr_mem_class_bytes(dm, bytes_of(p));
        if (!s->o.training || s->gv[i] < 0) continue;
        if (!(s->fused && s->fused[i])) /* its gradient, unless stepped inside backward */
            r += fr_mem_class_bytes(dm, fr_step_grad_bytes(s, i));
        int kind;
        if (!(s->o.offload & FR_OFFLOAD_OPTIMIZER)) /* else on the host */
            r += (size_t)ns * fr_mem_class_bytes(dm, fr_optim_state_bytes(
                                                         &s->o.optim, s->o.optim_state, p, &kind));
    }
    const fr_graph *g = &s->g;
    if (fr_feed_used(s)) r += fr_feed_reserved(s);
    else
        r += fr_mem_class_bytes(dm, fr_value_bytes(&g->vals[g->input])) +
             fr_mem_class_bytes(dm, fr_value_bytes(&g->vals[g->label]));
    if (s->plan.arena_bytes) r += fr_mem_class_bytes(dm, s->plan.arena_bytes);
    if (s->m->loss == FR_LOSS_CROSS_ENTROPY) /* fr_dev_hits' count */
        r += fr_mem_class_bytes(dm, FR_HITS_SCRATCH);
    if (scratch_floats(s)) r += fr_mem_class_bytes(dm, scratch_floats(s) * sizeof(float));
    return r;
}
