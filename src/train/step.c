/* step.c — compiling and running one step: model -> graph -> autodiff ->
 * plan -> exec, then the optimizer update with PyTorch's formulas. Also the
 * per-layer byte table of `frugal estimate`. */
#include <math.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "autodiff/autodiff.h"
#include "train/step.h"

static size_t param_bytes(const fr_param *p) {
    return (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
}

static int n_states(const fr_step *s) {
    const fr_optim_opts *o = &s->o.optim;
    if (o->kind == FR_OPTIM_SGD) return o->momentum != 0.0f ? 1 : 0;
    return 2;
}

static fr_status alloc_grads(fr_step *s) {
    fr_model *m = s->m;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || p->grad) continue;
        p->grad = fr_alloc(s->ctx, param_bytes(p), FR_MEM_GRADS);
        if (!p->grad) return FR_ERR_NOMEM;
        p->grad_valid = 0;
    }
    return FR_OK;
}

static fr_status alloc_state(fr_step *s) {
    fr_model *m = s->m;
    int ns = n_states(s);
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0) continue;
        for (int k = 0; k < ns; k++)
            if (!p->state[k] && !(p->state[k] = fr_calloc(s->ctx, param_bytes(p), FR_MEM_OPTIM)))
                return FR_ERR_NOMEM;
    }
    return FR_OK;
}

void fr_step_free(fr_step *s) {
    if (!s) return;
    fr_ctx *ctx = s->ctx;
    fr_exec_release(&s->ex);
    fr_plan_release(&s->plan);
    fr_graph_release(&s->g);
    fr_free(ctx, s->pv);
    fr_free(ctx, s->gv);
    fr_free(ctx, s);
}

fr_step *fr_step_compile(fr_model *m, const fr_step_opts *opts) {
    fr_ctx *ctx = m->ctx;
    if (opts->batch <= 0) {
        fr_fail(ctx, FR_ERR_ARG, "batch size must be positive, got %d", opts->batch);
        return NULL;
    }
    if (!m->initialised && fr_model_init(m, opts->seed)) return NULL;
    fr_step *s = fr_calloc(ctx, sizeof *s, FR_MEM_OTHER);
    if (!s) return NULL;
    s->ctx = ctx;
    s->m = m;
    s->o = *opts;
    fr_graph_init(&s->g, ctx);
    fr_status st = FR_ERR_NOMEM;
    s->pv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->pv, FR_MEM_OTHER);
    s->gv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->gv, FR_MEM_OTHER);
    if (!s->pv || !s->gv) goto fail;
    if ((st = fr_model_build_graph(m, &s->g, opts->batch, opts->training, s->pv))) goto fail;
    for (size_t i = 0; i < m->n_params; i++) s->gv[i] = -1;
    if (opts->training) {
        int *grad_of = fr_alloc(ctx, s->g.n_vals * sizeof *grad_of, FR_MEM_OTHER);
        if (!grad_of) goto fail;
        for (size_t v = 0; v < s->g.n_vals; v++) grad_of[v] = -1;
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!p->trainable || m->layers[p->layer].frozen) continue;
            int gvv = fr_graph_value(&s->g, FR_VAL_GRAD, FR_F32, p->shape);
            if (gvv < 0) {
                fr_free(ctx, grad_of);
                goto fail;
            }
            s->g.vals[gvv].param = (int)i;
            s->gv[i] = gvv;
            grad_of[s->pv[i]] = gvv;
        }
        st = fr_autodiff(&s->g, grad_of);
        fr_free(ctx, grad_of);
        if (st) goto fail;
    } else {
        s->g.n_forward = (int)s->g.n_nodes;
    }
    uint8_t *keep = fr_calloc(ctx, s->g.n_vals, FR_MEM_OTHER);
    if (!keep) goto fail;
    keep[s->g.loss] = keep[s->g.logits] = 1;
    st = fr_plan_build(&s->g, keep, NULL, 0, &s->plan);
    fr_free(ctx, keep);
    if (st) goto fail;
    if (opts->training && ((st = alloc_grads(s)) || (st = alloc_state(s)))) goto fail;
    if ((st = fr_exec_init(&s->ex, &s->g, &s->plan))) goto fail;
    return s;
fail:
    fr_step_free(s);
    return NULL;
}

static void optimizer_update(fr_step *s) {
    fr_model *m = s->m;
    const fr_optim_opts *o = &s->o.optim;
    s->t++;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || !p->grad_valid) continue; /* PyTorch skips params whose grad is None */
        size_t n = (size_t)fr_shape_numel(&p->shape);
        if (o->kind == FR_OPTIM_SGD)
            fr_k_sgd(p->data, p->grad, p->state[0], n, o, s->t == 1);
        else
            fr_k_adam(p->data, p->grad, p->state[0], p->state[1], n, o, s->t,
                      o->kind == FR_OPTIM_ADAMW);
    }
}

fr_status fr_step_run(fr_step *s, const fr_batch *b, float *loss, int *correct) {
    fr_model *m = s->m;
    fr_graph *g = &s->g;
    fr_exec *e = &s->ex;
    if (b->n <= 0 || b->n > s->o.batch)
        return fr_fail(s->ctx, FR_ERR_ARG, "batch of %d samples for a step compiled for %d", b->n,
                       s->o.batch);
    const void *labels = m->loss == FR_LOSS_CROSS_ENTROPY ? (const void *)b->y : (const void *)b->target;
    if (!b->x || !labels)
        return fr_fail(s->ctx, FR_ERR_ARG, "batch without %s", b->x ? "labels" : "inputs");
    fr_status st;
    if (s->o.training && (st = alloc_grads(s))) return st;
    for (size_t i = 0; i < m->n_params; i++) {
        e->ptr[s->pv[i]] = m->params[i].data;
        if (s->gv[i] >= 0) {
            e->ptr[s->gv[i]] = m->params[i].grad;
            e->written[s->gv[i]] = (uint8_t)m->params[i].grad_valid;
        }
    }
    e->ptr[g->input] = (void *)b->x;
    e->ptr[g->label] = (void *)labels;
    st = fr_exec_run(e, 0, (int)g->n_nodes, b->n, s->o.seed, s->runs);
    s->runs++;
    float l = st ? NAN : *(const float *)e->ptr[g->loss];
    if (!st && correct) {
        const float *z = e->ptr[g->logits];
        int64_t c = g->vals[g->logits].shape.d[1];
        int hits = 0;
        for (int i = 0; i < b->n; i++) {
            int best = 0;
            for (int64_t k = 1; k < c; k++)
                if (z[i * c + k] > z[i * c + best]) best = (int)k;
            if (m->loss == FR_LOSS_CROSS_ENTROPY ? best == b->y[i] : 0) hits++;
        }
        *correct = hits;
    }
    fr_exec_finish(e);
    if (st) return st;
    if (loss) *loss = l;
    if (!isfinite(l))
        return fr_fail(s->ctx, FR_ERR_NUMERIC,
                       "non-finite loss (%g) at step %llu: lower the learning rate or check the "
                       "data; the weights were not updated",
                       (double)l, (unsigned long long)s->runs);
    if (!s->o.training) return FR_OK;
    for (size_t i = 0; i < m->n_params; i++) {
        if (s->gv[i] >= 0) m->params[i].grad_valid = e->written[s->gv[i]];
        if (m->params[i].role == FR_P_NUM_BATCHES) (*(int64_t *)m->params[i].data)++;
    }
    optimizer_update(s);
    /* zero_grad: set_to_none releases the buffers, otherwise the next backward
     * overwrites them (the same as zeroing, without the memset). */
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        p->grad_valid = 0;
        if (s->o.optim.zero_grad_to_none && p->grad) {
            fr_free(s->ctx, p->grad);
            p->grad = NULL;
        }
    }
    return FR_OK;
}

void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]) {
    const fr_model *m = s->m;
    memset(out, 0, FR_MEM_CAT_COUNT * sizeof out[0]);
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        size_t b = param_bytes(p);
        out[FR_MEM_PARAMS] += b;
        if (s->gv[i] >= 0) {
            out[FR_MEM_GRADS] += b;
            out[FR_MEM_OPTIM] += (size_t)n_states(s) * b;
        }
    }
    out[FR_MEM_DATA] = fr_value_bytes(&s->g.vals[s->g.input]) + fr_value_bytes(&s->g.vals[s->g.label]);
}

void fr_step_predicted(const fr_step *s, size_t out[FR_MEM_CAT_COUNT], size_t *peak_total) {
    fr_step_persistent(s, out);
    size_t persistent = 0;
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) persistent += out[c];
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) out[c] += s->plan.peak[c];
    if (peak_total) *peak_total = persistent + s->plan.peak_total;
}
