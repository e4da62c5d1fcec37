/* checkpoint.c — weights and optimizer state as safetensors with PyTorch's
 * state_dict names and layouts (Linear weight [out, in], Conv weight
 * [out, in, kh, kw], BatchNorm running_mean / running_var /
 * num_batches_tracked as int64). Optimizer state goes beside the weights as
 * "optimizer.<param>.momentum_buffer" (SGD) or ".exp_avg" / ".exp_avg_sq"
 * (Adam, AdamW), with the step count in the metadata. Writes are atomic. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/optim_state.h"
#include "core/half.h"
#include "train/step.h"

static const char *state_name(const fr_step *s, int k) {
    if (s->o.optim.kind == FR_OPTIM_SGD) return "momentum_buffer";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

static int n_states(const fr_step *s) { return fr_step_optim_states(&s->o.optim); }

/* Optimizer state is saved as f32 when its storage is 16-bit (with 16-bit
 * weights, or Adam's moments in bf16): a checkpoint then reads the same in
 * PyTorch, and loading encodes it back exactly. int8 blocks are saved as
 * their raw bytes (U8, "<name>.int8_blockwise": codes then per-block absmax)
 * because decoding and re-encoding would re-derive each block's scale. k = 0
 * is the first moment (signed). */
static int state_is_f32(const fr_param *p) { return p->dtype == FR_F32 && p->state_kind == FR_STATE_F32; }

static void state_decode(const fr_param *p, int k, float *out) {
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (p->dtype == FR_F16) fr_f16_to_f32_n((const uint16_t *)p->state[k], out, n);
    else if (p->dtype == FR_BF16) fr_bf16_to_f32_n((const uint16_t *)p->state[k], out, n);
    else fr_state_decode(p->state[k], (fr_state_kind)p->state_kind, n, k == 0, out);
}

static void state_encode(fr_param *p, int k, const float *in) {
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (p->dtype == FR_F16) fr_f32_to_f16_n(in, (uint16_t *)p->state[k], n);
    else if (p->dtype == FR_BF16) fr_f32_to_bf16_n(in, (uint16_t *)p->state[k], n);
    else fr_state_encode(in, (fr_state_kind)p->state_kind, n, k == 0, p->state[k]);
}

fr_status fr_step_save_meta(fr_step *s, const char *path, const fr_st_meta *meta, int n_meta) {
    fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    int ns = s->o.training ? n_states(s) : 0;
    size_t cap = m->n_params * (size_t)(1 + ns);
    fr_st_entry *e = fr_calloc(ctx, (cap + 1) * sizeof *e, FR_MEM_OTHER);
    float **tmp = fr_calloc(ctx, (cap + 1) * sizeof *tmp, FR_MEM_OTHER);
    fr_status st = FR_OK;
    if (!e || !tmp) {
        fr_free(ctx, e);
        fr_free(ctx, tmp);
        return FR_ERR_NOMEM;
    }
    int n = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        snprintf(e[n].name, FR_ST_NAME_MAX, "%s", p->name);
        e[n].dtype = p->dtype;
        e[n].shape = p->shape;
        e[n].data = p->data;
        e[n].nbytes = (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
        n++;
    }
    for (size_t i = 0; i < m->n_params && s->o.training; i++) {
        const fr_param *p = &m->params[i];
        for (int k = 0; k < ns; k++) {
            if (!p->state[k]) continue;
            snprintf(e[n].name, FR_ST_NAME_MAX, "optimizer.%.100s.%s", p->name, state_name(s, k));
            e[n].dtype = FR_F32;
            e[n].shape = p->shape;
            e[n].data = p->state[k];
            e[n].nbytes = (size_t)fr_shape_numel(&p->shape) * 4;
            if (p->dtype == FR_F32 && p->state_kind == FR_STATE_INT8) {
                size_t nb = fr_state_bytes(FR_STATE_INT8, (size_t)fr_shape_numel(&p->shape));
                snprintf(e[n].name, FR_ST_NAME_MAX, "optimizer.%.100s.%s.int8_blockwise", p->name,
                         state_name(s, k));
                e[n].dtype = FR_U8;
                e[n].shape = fr_shape1((int64_t)nb);
                e[n].nbytes = nb;
            } else if (!state_is_f32(p)) {
                if (!(tmp[n] = fr_alloc(ctx, e[n].nbytes, FR_MEM_WORKSPACE))) {
                    st = FR_ERR_NOMEM;
                    goto done;
                }
                state_decode(p, k, tmp[n]);
                e[n].data = tmp[n];
            }
            n++;
        }
    }
    fr_st_meta all[FR_ST_META_MAX];
    int nm = 0;
    static const char *kinds[] = {"sgd", "adam", "adamw"};
    snprintf(all[nm].key, sizeof all[nm].key, "format");
    snprintf(all[nm++].value, sizeof all[0].value, "frugal-checkpoint-1");
    snprintf(all[nm].key, sizeof all[nm].key, "optimizer");
    snprintf(all[nm++].value, sizeof all[0].value, "%s", kinds[s->o.optim.kind]);
    snprintf(all[nm].key, sizeof all[nm].key, "optimizer.step");
    snprintf(all[nm++].value, sizeof all[0].value, "%" PRId64, s->t);
    snprintf(all[nm].key, sizeof all[nm].key, "runs");
    snprintf(all[nm++].value, sizeof all[0].value, "%" PRIu64, s->runs);
    snprintf(all[nm].key, sizeof all[nm].key, "scaler");
    snprintf(all[nm++].value, sizeof all[0].value, "%.9g %d %llu", (double)s->scaler.scale,
             s->scaler.growth_tracker, (unsigned long long)s->scaler.skipped);
    for (int i = 0; i < n_meta && nm < FR_ST_META_MAX; i++) all[nm++] = meta[i];
    st = fr_st_write(ctx, path, e, n, all, nm);
done:
    for (size_t i = 0; i <= cap; i++) fr_free(ctx, tmp[i]);
    fr_free(ctx, tmp);
    fr_free(ctx, e);
    return st;
}

fr_status fr_save(fr_step *s, const char *path) { return fr_step_save_meta(s, path, NULL, 0); }

/* Copy tensor `name` from f into dst, checking dtype and shape. */
static fr_status copy_in(fr_ctx *ctx, const char *path, const fr_st_file *f, const char *name,
                         fr_dtype dt, const fr_shape *shape, void *dst) {
    const fr_st_entry *e = fr_st_find(f, name);
    char a[64], b[64];
    if (!e) return fr_fail(ctx, FR_ERR_FORMAT, "%s: missing tensor '%s'", path, name);
    if (e->dtype != dt)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' is %s, the model needs %s", path, name,
                       fr_dtype_name(e->dtype), fr_dtype_name(dt));
    int same = fr_shape_numel(&e->shape) == fr_shape_numel(shape) &&
               (e->shape.ndim == shape->ndim || fr_shape_numel(shape) == 1);
    for (int i = 0; same && i < shape->ndim && e->shape.ndim == shape->ndim; i++)
        same = e->shape.d[i] == shape->d[i];
    if (!same)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model needs %s", path,
                       name, fr_shape_str(&e->shape, a, sizeof a), fr_shape_str(shape, b, sizeof b));
    if (dst) memcpy(dst, e->data, e->nbytes);
    return FR_OK;
}

static fr_status load_weights(fr_model *m, const char *path, const fr_st_file *f) {
    fr_ctx *ctx = m->ctx;
    for (int i = 0; i < f->n; i++) { /* strict, like load_state_dict(strict=True) */
        const char *nm = f->entries[i].name;
        if (strncmp(nm, "optimizer.", 10) == 0) continue;
        size_t k = 0;
        while (k < m->n_params && strcmp(m->params[k].name, nm) != 0) k++;
        if (k == m->n_params)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: unexpected tensor '%s': the model has no such "
                           "parameter (first is '%s')", path, nm,
                           m->n_params ? m->params[0].name : "none");
    }
    /* Check everything before changing anything: a failed load leaves the model as it was. */
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        fr_status st = copy_in(ctx, path, f, p->name, p->dtype, &p->shape, NULL);
        if (st) return st;
    }
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        fr_status st = copy_in(ctx, path, f, p->name, p->dtype, &p->shape, p->data);
        if (st) return st;
    }
    m->initialised = 1;
    return FR_OK;
}

fr_status fr_model_load_weights(fr_model *m, const char *path) {
    fr_st_file f;
    fr_status st;
    if ((st = fr_model_alloc_params(m))) return st;
    if ((st = fr_st_read(m->ctx, path, &f, FR_MEM_OTHER))) return st;
    st = load_weights(m, path, &f);
    fr_st_close(m->ctx, &f);
    return st;
}

fr_status fr_step_load_meta(fr_step *s, const char *path, fr_st_meta *meta, int *n_meta) {
    fr_ctx *ctx = s->ctx;
    fr_model *m = s->m;
    fr_st_file f;
    fr_status st = fr_st_read(ctx, path, &f, FR_MEM_OTHER);
    if (st) return st;
    if ((st = load_weights(m, path, &f))) goto done;
    if (s->o.training) {
        static const char *kinds[] = {"sgd", "adam", "adamw"};
        const char *kind = fr_st_meta_get(&f, "optimizer");
        if (kind && strcmp(kind, kinds[s->o.optim.kind]) != 0) {
            st = fr_fail(ctx, FR_ERR_ARG, "%s: saved with optimizer %s, resuming with %s", path,
                         kind, kinds[s->o.optim.kind]);
            goto done;
        }
        int ns = n_states(s);
        for (size_t i = 0; i < m->n_params; i++) {
            fr_param *p = &m->params[i];
            for (int k = 0; k < ns && p->state[k]; k++) {
                char nm[FR_ST_NAME_MAX];
                snprintf(nm, sizeof nm, "optimizer.%.100s.%s", p->name, state_name(s, k));
                if (state_is_f32(p)) {
                    if ((st = copy_in(ctx, path, &f, nm, FR_F32, &p->shape, p->state[k]))) goto done;
                    continue;
                }
                if (p->dtype == FR_F32 && p->state_kind == FR_STATE_INT8) {
                    fr_shape raw = fr_shape1((int64_t)fr_state_bytes(FR_STATE_INT8, (size_t)fr_shape_numel(&p->shape)));
                    size_t len = strlen(nm);
                    snprintf(nm + len, sizeof nm - len, ".int8_blockwise");
                    if ((st = copy_in(ctx, path, &f, nm, FR_U8, &raw, p->state[k]))) goto done;
                    continue;
                }
                float *t = fr_alloc(ctx, (size_t)fr_shape_numel(&p->shape) * 4, FR_MEM_WORKSPACE);
                if (!t) {
                    st = FR_ERR_NOMEM;
                    goto done;
                }
                if (!(st = copy_in(ctx, path, &f, nm, FR_F32, &p->shape, t))) state_encode(p, k, t);
                fr_free(ctx, t);
                if (st) goto done;
            }
        }
        const char *t = fr_st_meta_get(&f, "optimizer.step");
        const char *r = fr_st_meta_get(&f, "runs");
        s->t = t ? strtoll(t, NULL, 10) : 0;
        s->runs = r ? strtoull(r, NULL, 10) : 0;
        const char *sc = fr_st_meta_get(&f, "scaler");
        unsigned long long skipped = 0;
        float scale;
        int tracker;
        if (sc && sscanf(sc, "%g %d %llu", &scale, &tracker, &skipped) == 3) {
            s->scaler.scale = scale;
            s->scaler.growth_tracker = tracker;
            s->scaler.skipped = skipped;
        }
    }
    if (meta && n_meta) {
        int n = f.n_meta < *n_meta ? f.n_meta : *n_meta;
        for (int i = 0; i < n; i++) meta[i] = f.meta[i];
        *n_meta = n;
    }
done:
    fr_st_close(ctx, &f);
    return st;
}

fr_status fr_load(fr_step *s, const char *path) { return fr_step_load_meta(s, path, NULL, NULL); }
