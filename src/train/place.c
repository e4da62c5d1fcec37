/* place.c — where a step's tensors live: the model's parameters in the
 * backend's memory (a device's copies, uploaded when a step is made and
 * brought back, with a device's optimizer state, for a checkpoint; on the
 * CPU the host data itself), a micro-batch's inputs and labels (bound in
 * place on the host, written into the step's buffers or read from the
 * feed's slot on a device), the GEMM scratch, the gradients brought down
 * and the weights sent back when the optimizer is offloaded, and the
 * accuracy counted where the logits are. */
#include "core/ctx.h"
#include "train/place.h"
#include "train/feed.h"

static size_t bytes_of(const fr_param *p) {
    return (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
}

/* The one place the engine asks whether the backend's memory is the host's. */
int fr_place_second_memory(const fr_ctx *ctx) { return fr_backend_is_device(fr_backend_of(ctx)); }

size_t fr_place_scratch_floats(const fr_step *s) {
    return fr_place_second_memory(s->ctx) ? s->place.gemm_ws + s->opt.upd_ws_len : s->place.gemm_ws;
}

fr_status fr_place_scratch_take(fr_step *s, int take) {
    const fr_backend *be = fr_backend_of(s->ctx);
    if (!take) {
        be->release(s->ctx, s->place.scratch);
        s->place.scratch = NULL;
        return FR_OK;
    }
    size_t n = fr_place_scratch_floats(s);
    if (!n || s->place.scratch) return FR_OK;
    /* a device's: its GEMMs' temporary buffers, then the fused SGD step's
     * weight gradient (opencl/gemm.c), gradients when it holds only those;
     * the CPU's: oneDNN's 16-bit GEMM scratchpad */
    s->place.scratch =
        be->alloc(s->ctx, n * sizeof(float), s->place.gemm_ws ? FR_MEM_WORKSPACE : FR_MEM_GRADS);
    return s->place.scratch ? FR_OK : FR_ERR_NOMEM;
}

void fr_place_scratch(fr_step *s) {
    fr_exec *e = &s->ex;
    if (fr_place_second_memory(s->ctx)) { /* one device buffer: opencl/gemm.c reads it so */
        e->grad_ws = s->place.scratch;
        e->grad_ws_len = s->place.scratch ? fr_place_scratch_floats(s) : 0;
        return;
    }
    e->grad_ws = s->opt.upd_ws;
    e->grad_ws_len = s->opt.upd_ws_len;
    e->gemm_ws = s->place.scratch;
    e->gemm_ws_len = s->place.scratch ? s->place.gemm_ws * sizeof(float) : 0;
}

fr_status fr_place_materialize(fr_step *s) {
    fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    const fr_backend *be = fr_backend_of(ctx);
    fr_status st;
    /* the backend's copy of the parameter block (none on the CPU, whose
     * kernels read the host's), each parameter at its offset */
    if (!m->dblock && m->pblock_bytes &&
        (st = be->mirror(ctx, &m->dblock, m->pblock, m->pblock_bytes, FR_MEM_PARAMS)))
        return st;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].data == (char *)m->pblock + m->params[i].off)
            m->params[i].ddata = m->dblock;
    /* the batch's: two whole batches uploaded ahead, or buffers for a
     * micro-batch of inputs and of labels (none on the CPU) */
    if (fr_feed_used(s)) return s->place.feed ? FR_OK : fr_feed_new(s, &s->place.feed);
    const fr_graph *g = &s->g;
    size_t xb = fr_value_bytes(&g->vals[g->input]), yb = fr_value_bytes(&g->vals[g->label]);
    if ((st = be->mirror(ctx, &s->place.dev_x, NULL, xb, FR_MEM_DATA))) return st;
    return be->mirror(ctx, &s->place.dev_y, NULL, yb, FR_MEM_DATA);
}

fr_status fr_place_batch(fr_step *s, const fr_batch *b, int slot, int off, int n) {
    const fr_graph *g = &s->g;
    fr_exec *e = &s->ex;
    if (s->place.feed) { /* uploaded ahead into the slot */
        fr_feed_bind(s, slot, off);
        return FR_OK;
    }
    int ce = s->m->loss == FR_LOSS_CROSS_ENTROPY, tokens = s->m->in_dtype == FR_I32;
    size_t xs = fr_value_bytes(&g->vals[g->input]) / (size_t)s->sched.micro;
    size_t ys = fr_value_bytes(&g->vals[g->label]) / (size_t)s->sched.micro;
    const char *x = tokens ? (const char *)b->idx : (const char *)b->x;
    const char *y = ce ? (const char *)b->y : (const char *)b->target;
    if (!s->place.dev_x) { /* host memory: the batch itself */
        fr_exec_bind(e, g->input, (void *)(x + (size_t)off * xs));
        fr_exec_bind(e, g->label, (void *)(y + (size_t)off * ys));
        return FR_OK;
    }
    const fr_backend *be = fr_backend_of(s->ctx);
    fr_status st = be->write(s->ctx, s->place.dev_x, 0, x + (size_t)off * xs, (size_t)n * xs);
    if (!st) st = be->write(s->ctx, s->place.dev_y, 0, y + (size_t)off * ys, (size_t)n * ys);
    fr_exec_bind_dev(e, g->input, s->place.dev_x, 0);
    fr_exec_bind_dev(e, g->label, s->place.dev_y, 0);
    return st;
}

fr_status fr_step_hits_of(fr_step *s, int n, int *hits) {
    const fr_graph *g = &s->g;
    const fr_backend *be = fr_backend_of(s->ctx);
    *hits = 0;
    if (s->m->loss != FR_LOSS_CROSS_ENTROPY) return FR_OK;
    if (g->hits >= 0) { /* the fused head counted them (over the bound n samples) */
        int32_t h32 = 0;
        fr_status st = fr_exec_read(&s->ex, g->hits, 0, &h32, sizeof h32);
        *hits = (int)h32;
        return st;
    }
    fr_tensor z = fr_exec_tensor(&s->ex, g->logits), y = fr_exec_tensor(&s->ex, g->label);
    if (z.dtype != FR_F32 || y.dtype != FR_I32)
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "accuracy takes f32 logits and i32 labels, not %s and %s",
                       fr_dtype_name(z.dtype), fr_dtype_name(y.dtype));
    z.shape.d[0] = n, y.shape.d[0] = n; /* the first n samples' rows: (n, K) or (n, T, K) */
    int64_t h = 0;
    fr_status st = be->hits(s->ctx, &z, &y, &h);
    *hits = (int)h;
    return st;
}

fr_status fr_place_grads_down(fr_step *s) { return fr_optim_grads_down(s->m); }

fr_status fr_place_params_up(fr_step *s) {
    fr_model *m = s->m;
    const fr_backend *be = fr_backend_of(s->ctx);
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++)
        if (s->gv[i] >= 0)
            st = be->write(s->ctx, m->params[i].ddata, m->params[i].off, m->params[i].data,
                           bytes_of(&m->params[i]));
    return st;
}

void fr_place_free(fr_step *s) {
    const fr_backend *be = fr_backend_of(s->ctx);
    be->release(s->ctx, s->place.dev_x);
    be->release(s->ctx, s->place.dev_y);
    be->release(s->ctx, s->place.scratch);
    s->place.dev_x = s->place.dev_y = s->place.scratch = NULL;
    fr_feed_free(s->place.feed);
    s->place.feed = NULL;
}

fr_status fr_model_to_host(fr_model *m) {
    const fr_backend *be = fr_backend_of(m->ctx);
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (p->role == FR_P_NUM_BATCHES) continue; /* a host counter no kernel reads */
        if (p->ddata) st = be->read(m->ctx, p->ddata, p->off, p->data, bytes_of(p));
    }
    return st ? st : fr_optim_state_down(m); /* a device's state, one block each */
}

fr_status fr_model_to_device(fr_model *m) {
    const fr_backend *be = fr_backend_of(m->ctx);
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (p->ddata) st = be->write(m->ctx, p->ddata, p->off, p->data, bytes_of(p));
    }
    return st ? st : fr_optim_state_up(m);
}
