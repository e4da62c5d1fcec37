/* checkpoint.c — weights and optimizer state as safetensors with PyTorch's
 * state_dict names and layouts (Linear weight [out, in], Conv weight
 * [out, in, kh, kw], BatchNorm running_mean / running_var /
 * num_batches_tracked as int64). Optimizer state goes beside the weights as
 * "optimizer.<param>.<state>", the rule's PyTorch names and shapes
 * (fr_optim_state_parts: momentum_buffer for SGD, exp_avg and exp_avg_sq
 * for Adam and AdamW, Adafactor's row_var (..., R, 1) and col_var
 * (..., 1, C) or variance), and
 * the rule's name in the metadata's "optimizer". The metadata holds the
 * step's counters (optimizer.step,
 * runs, scaler), the trainer's position (epoch, batch = batches done in the
 * next epoch) and the run's settings (see checkpoint.h); every number in it
 * is read whole and range-checked, a fault naming the key and the value.
 * A tied parameter is saved under each of its names, as PyTorch's
 * state_dict has it; a Hugging Face GPT-2 checkpoint loads too (see "names"
 * below). Only the tensors the model needs are read from the file. Writes
 * are atomic. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/state.h"
#include "core/half.h"
#include "core/names.h"
#include "parallel/pshard.h"
#include "quant/quant.h"
#include "run/checkpoint.h"
#include "train/place.h"

/* Optimizer state is saved as f32 when its storage is 16-bit (with 16-bit
 * weights, or Adam's moments in bf16): a checkpoint then reads the same in
 * PyTorch, and loading encodes it back exactly. int8 blocks are saved as
 * their raw bytes (U8, "<name>.int8_blockwise": codes then per-block absmax)
 * because decoding and re-encoding would re-derive each block's scale. k = 0
 * is the first moment (signed). */
/* Param i's optimizer state k on the host (optim/optim.h) and its format. */
static void *state_of(const fr_model *m, size_t i, int k) { return fr_optim_host_state(m, i, k); }
static int kind_of(const fr_model *m, size_t i) {
    return m->optim ? fr_optp(m, i)->state_kind : FR_STATE_F32;
}

static int state_is_f32(const fr_model *m, size_t i) {
    return m->params[i].dtype == FR_F32 && kind_of(m, i) == FR_STATE_F32;
}

static void state_decode(const fr_model *m, size_t i, int k, float *out) {
    const fr_param *p = &m->params[i];
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (p->dtype == FR_F16) fr_f16_to_f32_n((const uint16_t *)state_of(m, i, k), out, n);
    else if (p->dtype == FR_BF16) fr_bf16_to_f32_n((const uint16_t *)state_of(m, i, k), out, n);
    else fr_state_decode(state_of(m, i, k), (fr_state_kind)kind_of(m, i), n, k == 0, out);
}

static void state_encode(fr_model *m, size_t i, int k, const float *in) {
    const fr_param *p = &m->params[i];
    size_t n = (size_t)fr_shape_numel(&p->shape);
    if (p->dtype == FR_F16) fr_f32_to_f16_n(in, (uint16_t *)state_of(m, i, k), n);
    else if (p->dtype == FR_BF16) fr_f32_to_bf16_n(in, (uint16_t *)state_of(m, i, k), n);
    else fr_state_encode(in, (fr_state_kind)kind_of(m, i), n, k == 0, state_of(m, i, k));
}

/* A parameter as a file entry: its state_dict name, dtype, shape and bytes. */
static void param_entry(fr_st_entry *e, const fr_param *p) {
    snprintf(e->name, FR_ST_NAME_MAX, "%s", p->name);
    e->dtype = p->dtype;
    e->shape = p->shape;
    e->data = p->data;
    e->nbytes = (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
}

fr_status fr_step_save_meta(fr_step *s, const char *path, const fr_st_meta *meta, int n_meta) {
    fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    fr_status dst = fr_model_to_host(m); /* a device's current values */
    if (dst) return dst;
    size_t cap = m->n_params * (size_t)(1 + (s->o.training ? FR_STATE_PARTS_MAX : 0)) + m->n_alias;
    fr_st_entry *e = fr_calloc(ctx, (cap + 1) * sizeof *e, FR_MEM_OTHER);
    float **tmp = fr_calloc(ctx, (cap + 1) * sizeof *tmp, FR_MEM_OTHER);
    fr_status st = FR_OK;
    if (!e || !tmp) {
        fr_free(ctx, e);
        fr_free(ctx, tmp);
        return FR_ERR_NOMEM;
    }
    int n = 0;
    for (size_t i = 0; i < m->n_params; i++) param_entry(&e[n++], &m->params[i]);
    for (size_t i = 0; i < m->n_alias; i++) { /* a tied parameter under its second name */
        e[n] = e[m->alias[i].param];
        snprintf(e[n].name, FR_ST_NAME_MAX, "%s", m->alias[i].name);
        n++;
    }
    for (size_t i = 0; i < m->n_params && s->o.training; i++) {
        const fr_param *p = &m->params[i];
        fr_state_part part[FR_STATE_PARTS_MAX];
        int np = fr_optim_state_parts(&s->o.optim, &p->shape, part);
        for (int j = 0; j < np; j++) {
            int k = part[j].block;
            if (!state_of(m, i, k)) continue;
            snprintf(e[n].name, FR_ST_NAME_MAX, "optimizer.%.100s.%s", p->name, part[j].name);
            e[n].dtype = FR_F32;
            e[n].shape = part[j].shape;
            e[n].data = (float *)state_of(m, i, k) + part[j].off;
            e[n].nbytes = (size_t)fr_shape_numel(&part[j].shape) * 4;
            if (p->dtype == FR_F32 && kind_of(m, i) == FR_STATE_INT8) {
                size_t nb = fr_state_bytes(FR_STATE_INT8, (size_t)fr_shape_numel(&p->shape));
                snprintf(e[n].name, FR_ST_NAME_MAX, "optimizer.%.100s.%s.int8_blockwise", p->name,
                         part[j].name);
                e[n].dtype = FR_U8;
                e[n].shape = fr_shape1((int64_t)nb);
                e[n].nbytes = nb;
            } else if (!state_is_f32(m, i)) {
                if (!(tmp[n] = fr_alloc(ctx, e[n].nbytes, FR_MEM_WORKSPACE))) {
                    st = FR_ERR_NOMEM;
                    goto done;
                }
                state_decode(m, i, k, tmp[n]);
                e[n].data = tmp[n];
            }
            n++;
        }
    }
    fr_st_meta all[FR_ST_META_MAX];
    int nm = 0;
    snprintf(all[nm].key, sizeof all[nm].key, "format");
    snprintf(all[nm++].value, sizeof all[0].value, "frugal-checkpoint-1");
    snprintf(all[nm].key, sizeof all[nm].key, "optimizer");
    snprintf(all[nm++].value, sizeof all[0].value, "%s", fr_optim_name(s->o.optim.kind));
    snprintf(all[nm].key, sizeof all[nm].key, "optimizer.step");
    snprintf(all[nm++].value, sizeof all[0].value, "%" PRId64, s->opt.t);
    snprintf(all[nm].key, sizeof all[nm].key, "runs");
    snprintf(all[nm++].value, sizeof all[0].value, "%" PRIu64, s->sched.runs);
    snprintf(all[nm].key, sizeof all[nm].key, "scaler");
    snprintf(all[nm++].value, sizeof all[0].value, "%.9g %d %llu", (double)s->opt.scaler.scale,
             s->opt.scaler.growth_tracker, (unsigned long long)s->opt.scaler.skipped);
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
static int is_float(fr_dtype dt) { return dt == FR_F32 || dt == FR_F16 || dt == FR_BF16; }

/* A floating-point tensor stored in another float format than the model's
 * (f32 weights into a pure bf16 model, say): converted as PyTorch's
 * load_state_dict converts it (param.copy_(input)): widened exactly,
 * narrowed with round-to-nearest-even, through f32. */
static fr_status load_converted(fr_ctx *ctx, const fr_st_file *f, const fr_st_entry *e, fr_dtype dt,
                                void *dst) {
    size_t n = (size_t)fr_shape_numel(&e->shape);
    void *raw = fr_alloc(ctx, e->nbytes ? e->nbytes : 1, FR_MEM_WORKSPACE);
    float *wide = e->dtype == FR_F32 ? raw
                  : dt == FR_F32     ? dst
                                     : fr_alloc(ctx, n * 4 + 4, FR_MEM_WORKSPACE);
    fr_status st = raw && wide ? fr_st_load(ctx, f, e, raw) : FR_ERR_NOMEM;
    if (!st) {
        if (e->dtype == FR_F16) fr_f16_to_f32_n(raw, wide, n);
        if (e->dtype == FR_BF16) fr_bf16_to_f32_n(raw, wide, n);
        if (dt == FR_F16) fr_f32_to_f16_n(wide, dst, n);
        if (dt == FR_BF16) fr_f32_to_bf16_n(wide, dst, n);
    }
    if (wide != raw && wide != dst) fr_free(ctx, wide);
    fr_free(ctx, raw);
    return st;
}

static fr_status copy_in(fr_ctx *ctx, const char *path, const fr_st_file *f, const char *name,
                         fr_dtype dt, const fr_shape *shape, void *dst) {
    const fr_st_entry *e = fr_st_find(f, name);
    char a[64], b[64];
    if (!e) return fr_fail(ctx, FR_ERR_FORMAT, "%s: missing tensor '%s'", path, name);
    if (e->dtype != dt && !(is_float(e->dtype) && is_float(dt)))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' is %s, the model needs %s", path, name,
                       fr_dtype_name(e->dtype), fr_dtype_name(dt));
    int same = fr_shape_numel(&e->shape) == fr_shape_numel(shape) &&
               (e->shape.ndim == shape->ndim || fr_shape_numel(shape) == 1);
    for (int i = 0; same && i < shape->ndim && e->shape.ndim == shape->ndim; i++)
        same = e->shape.d[i] == shape->d[i];
    if (!same)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model needs %s", path,
                       name, fr_shape_str(&e->shape, a, sizeof a),
                       fr_shape_str(shape, b, sizeof b));
    if (!dst) return FR_OK;
    if (e->dtype == dt) return fr_st_load(ctx, f, e, dst);
    return load_converted(ctx, f, e, dt, dst);
}

/* ---- names: tied parameters, Hugging Face GPT-2 -------------------------- */

/* A tied parameter (lm_head.weight = transformer.wte.weight) is one fr_param
 * and an fr_alias naming it. Saving writes the alias too, with the same
 * bytes, as PyTorch's state_dict lists both; loading accepts an alias entry
 * whose bytes equal its target's, refuses one that differs, and does not
 * need it.
 *
 * A Hugging Face GPT-2 checkpoint stores the weights of its Conv1D layers
 * (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as [in, out], the
 * transpose of nn.Linear's [out, in]; the hub's model.safetensors (saved
 * from GPT2Model) names the tensors of transformer.* without that prefix
 * (wte.weight, h.0.ln_1.weight, ln_f.bias), GPT2LMHeadModel.save_pretrained
 * keeps it. A file is read without the prefix when the model has
 * transformer.wte.weight and the file has wte.weight but not
 * transformer.wte.weight; in Conv1D layout when it is without the prefix,
 * or when its first block's attn.c_attn.weight is [C, 3C] where the model's
 * is [3C, C]. The transposes are done on load, one tensor at a time through
 * a buffer of its size.
 *
 * The causal mask of an attention block the model has, h.N.attn.bias (and
 * Hugging Face's h.N.attn.masked_bias), with or without the prefix, is
 * ignored: nanoGPT's and Hugging Face's older checkpoints carry it as a
 * buffer, frugal's attention needs none (nanoGPT's from_pretrained drops it
 * too). */

#define HF_PREFIX "transformer."
#define HF_PREFIX_LEN (sizeof HF_PREFIX - 1)

typedef struct layout {
    int strip;  /* file names lack "transformer." */
    int conv1d; /* Conv1D weights stored [in, out] */
} layout;

/* s is "h.<digits>." followed by rest; returns what follows the dot, or NULL. */
static const char *after_block(const char *s) {
    if (strncmp(s, "h.", 2) != 0 || !isdigit((unsigned char)s[2])) return NULL;
    s += 2;
    while (isdigit((unsigned char)*s)) s++;
    return *s == '.' ? s + 1 : NULL;
}

/* What follows "[transformer.]h.<N>." in name, or NULL. */
static const char *block_rest(const char *name) {
    if (strncmp(name, HF_PREFIX, HF_PREFIX_LEN) == 0) name += HF_PREFIX_LEN;
    return after_block(name);
}

static layout file_layout(const fr_model *m, const fr_st_file *f) {
    layout l = {0};
    int has_wte = 0;
    for (size_t i = 0; i < m->n_params; i++)
        has_wte |= strcmp(m->params[i].name, HF_PREFIX "wte.weight") == 0;
    l.strip = has_wte && !fr_st_find(f, HF_PREFIX "wte.weight") && fr_st_find(f, "wte.weight");
    l.conv1d = l.strip;
    for (size_t i = 0; i < m->n_params && !l.conv1d; i++) {
        const fr_param *p = &m->params[i];
        const char *rest = block_rest(p->name);
        if (!rest || strcmp(rest, "attn.c_attn.weight") != 0 || p->shape.ndim != 2) continue;
        const fr_st_entry *e = fr_st_find(f, p->name);
        l.conv1d = e && e->shape.ndim == 2 && p->shape.d[0] != p->shape.d[1] &&
                   e->shape.d[0] == p->shape.d[1] && e->shape.d[1] == p->shape.d[0];
        break; /* the first block decides */
    }
    return l;
}

/* The name model tensor `name` has in the file. */
static const char *file_name(const layout *l, const char *name) {
    return l->strip && strncmp(name, HF_PREFIX, HF_PREFIX_LEN) == 0 ? name + HF_PREFIX_LEN : name;
}

/* Whether the file stores model tensor `name` transposed: a Conv1D weight. */
static int is_conv1d(const layout *l, const char *name) {
    static const char *conv1d[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                   "mlp.c_proj.weight"};
    const char *rest = l->conv1d ? block_rest(name) : NULL;
    for (size_t i = 0; rest && i < sizeof conv1d / sizeof *conv1d; i++)
        if (strcmp(rest, conv1d[i]) == 0) return 1;
    return 0;
}

/* Whether file entry `entry` is the causal mask buffer of an attention
 * block of the model: "[transformer.]h.N.attn.bias" or ".attn.masked_bias"
 * where the model has transformer.h.N.attn.c_attn.weight. */
static int is_mask_buffer(const fr_model *m, const char *entry) {
    const char *rest = block_rest(entry);
    if (!rest || (strcmp(rest, "attn.bias") != 0 && strcmp(rest, "attn.masked_bias") != 0))
        return 0;
    char want[FR_ST_NAME_MAX];
    int len = (int)(rest - entry);
    if (strncmp(entry, HF_PREFIX, HF_PREFIX_LEN) == 0)
        entry += HF_PREFIX_LEN, len -= (int)HF_PREFIX_LEN;
    snprintf(want, sizeof want, HF_PREFIX "%.*sattn.c_attn.weight", len, entry);
    for (size_t i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, want) == 0) return 1;
    return 0;
}

static fr_shape transposed(const fr_shape *s) {
    fr_shape t = *s;
    t.d[0] = s->d[1];
    t.d[1] = s->d[0];
    return t;
}

/* dst [cols, rows] = src [rows, cols]^T, elements of `size` bytes. */
static void transpose(void *dst, const void *src, int64_t rows, int64_t cols, size_t size) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy((char *)dst + (size_t)(c * rows + r) * size,
                   (const char *)src + (size_t)(r * cols + c) * size, size);
}

/* A quantized weight (--base-precision) from a float tensor of its (O, K)
 * (Conv1D: transposed): read whole into f32 scratch, then quantized into
 * its place. (A training checkpoint holds the quantized bytes themselves,
 * read as they are.) Checked only when load is 0. */
static fr_status quant_in(fr_ctx *ctx, const char *path, const fr_st_file *f, const layout *l,
                          fr_param *p, int load) {
    const char *name = file_name(l, p->name);
    const int conv1d = is_conv1d(l, p->name);
    fr_shape t = conv1d ? transposed(&p->qshape) : p->qshape;
    if (!load) return copy_in(ctx, path, f, name, FR_F32, &t, NULL);
    const size_t n = (size_t)fr_shape_numel(&t);
    float *a = fr_alloc(ctx, n * sizeof *a + 4, FR_MEM_WORKSPACE);
    float *b = conv1d ? fr_alloc(ctx, n * sizeof *b + 4, FR_MEM_WORKSPACE) : a;
    fr_status st = a && b ? copy_in(ctx, path, f, name, FR_F32, &t, a) : FR_ERR_NOMEM;
    if (!st && conv1d) transpose(b, a, t.d[0], t.d[1], sizeof *a);
    if (!st)
        st = fr_quantize_into(ctx, (fr_qfmt)(p->quant - 1), b, p->qshape.d[0], p->qshape.d[1],
                              p->data, NULL);
    if (st && st != FR_ERR_NOMEM) fr_fail(ctx, st, "%s: '%s': %s", path, name, fr_last_error(ctx));
    if (b != a) fr_free(ctx, b);
    fr_free(ctx, a);
    return st;
}

/* Model parameter p from the file: checked only when load is 0. */
static fr_status param_in(fr_ctx *ctx, const char *path, const fr_st_file *f, const layout *l,
                          fr_param *p, int load) {
    const char *name = file_name(l, p->name);
    const fr_st_entry *qe = p->quant ? fr_st_find(f, name) : NULL;
    if (qe && qe->dtype != FR_U8) return quant_in(ctx, path, f, l, p, load);
    if (!is_conv1d(l, p->name) || p->shape.ndim != 2)
        return copy_in(ctx, path, f, name, p->dtype, &p->shape, load ? p->data : NULL);
    fr_shape t = transposed(&p->shape); /* Conv1D: [in, out] */
    if (!load) return copy_in(ctx, path, f, name, p->dtype, &t, NULL);
    size_t size = fr_dtype_size(p->dtype);
    void *tmp = fr_alloc(ctx, (size_t)fr_shape_numel(&t) * size + 1, FR_MEM_WORKSPACE);
    if (!tmp) return FR_ERR_NOMEM;
    fr_status st = copy_in(ctx, path, f, name, p->dtype, &t, tmp);
    if (!st) transpose(p->data, tmp, t.d[0], t.d[1], size);
    fr_free(ctx, tmp);
    return st;
}

/* An alias entry, when the file has one: the dtype, shape and bytes of its
 * target's entry. */
static fr_status check_alias(fr_ctx *ctx, const char *path, const fr_st_file *f, const layout *l,
                             const fr_model *m, const fr_alias *a) {
    const char *target = file_name(l, m->params[a->param].name);
    const fr_st_entry *e = fr_st_find(f, file_name(l, a->name)), *t = fr_st_find(f, target);
    char sa[64], sb[64];
    if (!e) return FR_OK;
    if (!t) return fr_fail(ctx, FR_ERR_FORMAT, "%s: missing tensor '%s'", path, target);
    int same = e->dtype == t->dtype && e->shape.ndim == t->shape.ndim;
    for (int i = 0; same && i < e->shape.ndim; i++) same = e->shape.d[i] == t->shape.d[i];
    if (!same)
        return fr_fail(
            ctx, FR_ERR_FORMAT, "%s: tensor '%s' is tied to '%s' but is %s %s, not %s %s like it",
            path, e->name, target, fr_dtype_name(e->dtype), fr_shape_str(&e->shape, sa, sizeof sa),
            fr_dtype_name(t->dtype), fr_shape_str(&t->shape, sb, sizeof sb));
    void *x = fr_alloc(ctx, e->nbytes + 1, FR_MEM_WORKSPACE);
    void *y = fr_alloc(ctx, t->nbytes + 1, FR_MEM_WORKSPACE);
    fr_status st = x && y ? fr_st_load(ctx, f, e, x) : FR_ERR_NOMEM;
    if (!st) st = fr_st_load(ctx, f, t, y);
    if (!st && memcmp(x, y, e->nbytes) != 0) {
        size_t size = fr_dtype_size(e->dtype), k = 0;
        while (memcmp((char *)x + k * size, (char *)y + k * size, size) == 0) k++;
        st = fr_fail(ctx, FR_ERR_FORMAT,
                     "%s: tensor '%s' is tied to '%s' (one parameter) but holds other values "
                     "(first at element %zu)",
                     path, e->name, target, k);
    }
    fr_free(ctx, x);
    fr_free(ctx, y);
    return st;
}

/* Whether file entry `nm` is what the model reads or may read. */
static int expected(const fr_model *m, const layout *l, const char *nm) {
    if (strncmp(nm, "optimizer.", 10) == 0 || is_mask_buffer(m, nm)) return 1;
    for (size_t k = 0; k < m->n_params; k++)
        if (strcmp(file_name(l, m->params[k].name), nm) == 0) return 1;
    for (size_t k = 0; k < m->n_alias; k++)
        if (strcmp(file_name(l, m->alias[k].name), nm) == 0) return 1;
    return 0;
}

/* A LoRA adapter the file does not hold (a base model's weights): it keeps
 * the values it has (A drawn, B zeros), or LoRA could never leave zero. */
static int adapter_absent(const fr_param *p, const layout *l, const fr_st_file *f) {
    return (p->role == FR_P_LORA_A || p->role == FR_P_LORA_B) &&
           !fr_st_find(f, file_name(l, p->name));
}

static fr_status load_weights(fr_model *m, const char *path, const fr_st_file *f) {
    fr_ctx *ctx = m->ctx;
    layout l = file_layout(m, f);
    fr_status st;
    for (int i = 0; i < f->n; i++) /* strict, like load_state_dict(strict=True) */
        if (!expected(m, &l, f->entries[i].name))
            return fr_fail(ctx, FR_ERR_FORMAT,
                           "%s: unexpected tensor '%s': the model has no such "
                           "parameter (first is '%s')",
                           path, f->entries[i].name,
                           m->n_params ? file_name(&l, m->params[0].name) : "none");
    /* Adapters: all in the file (a trained model's), or none (a base's) */
    size_t n_lora = 0, absent = 0, first_lora = m->n_params, first_absent = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (p->role != FR_P_LORA_A && p->role != FR_P_LORA_B) continue;
        if (!n_lora++) first_lora = i;
        if (adapter_absent(p, &l, f) && !absent++) first_absent = i;
    }
    if (absent && absent < n_lora)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: holds %zu of the model's %zu LoRA adapter tensors: '%s' is missing",
                       path, n_lora - absent, n_lora, m->params[first_absent].name);
    /* Check everything before changing anything: a failed load leaves the model as it was. */
    for (size_t i = 0; i < m->n_params; i++)
        if (!adapter_absent(&m->params[i], &l, f) &&
            (st = param_in(ctx, path, f, &l, &m->params[i], 0)))
            return st;
    for (size_t i = 0; i < m->n_alias; i++)
        if ((st = check_alias(ctx, path, f, &l, m, &m->alias[i]))) return st;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        if (adapter_absent(p, &l, f)) continue;
        if (!fr_pshard_holds(m->shard, (int)i)) {
            if ((st = param_in(ctx, path, f, &l, p, 1))) return st;
            continue;
        }
        /* ZeRO 3: the tensor read whole into scratch, this rank's slice kept */
        if (!(p->data = fr_alloc(ctx, (size_t)fr_shape_numel(&p->shape) * sizeof(float),
                                 FR_MEM_WORKSPACE)))
            return FR_ERR_NOMEM;
        if (!(st = param_in(ctx, path, f, &l, p, 1))) fr_pshard_keep(m->shard, (int)i, p->data);
        fr_free(ctx, p->data);
        p->data = NULL;
        if (st) return st;
    }
    /* a base's weights into a model never initialised: its adapters drawn
     * (seed 0; the trainer initialises first, with the run's seed) */
    if (absent && !m->initialised && (st = fr_model_init_params(m, 0, first_lora))) return st;
    m->initialised = 1;
    m->base_conv1d = l.conv1d;
    return FR_OK;
}

fr_status fr_model_load_weights(fr_model *m, const char *path) {
    fr_st_file f;
    fr_status st;
    char *file = NULL;
    if ((st = fr_model_alloc_params(m))) return st;
    if ((st = fr_st_open(m->ctx, path, &f, FR_MEM_OTHER, &file))) return st;
    /* on a device (a step compiled there holds the block's copy): the host's
     * values current first, the loaded ones sent back after; nothing on the CPU */
    if (!(st = fr_model_to_host(m)) && !(st = load_weights(m, file, &f)))
        st = fr_model_to_device(m);
    fr_st_close(m->ctx, &f);
    fr_free(m->ctx, file);
    return st;
}

/* ---- weights only --------------------------------------------------------- */

/* The mask entry of the attention block whose c_attn weight is param `name`
 * ("transformer.h.N.attn.c_attn.weight" -> "transformer.h.N.attn.bias");
 * 0 when name is not one. */
static int mask_name(const char *name, char *out, size_t cap) {
    if (strncmp(name, HF_PREFIX, HF_PREFIX_LEN) != 0) return 0;
    const char *rest = block_rest(name);
    if (!rest || strcmp(rest, "attn.c_attn.weight") != 0) return 0;
    return snprintf(out, cap, "%.*sattn.bias", (int)(rest - name), name) < (int)cap;
}

fr_status fr_ckpt_save_weights(fr_model *m, const char *path, int nanogpt_masks) {
    fr_ctx *ctx = m->ctx;
    fr_status st = fr_model_to_host(m); /* a device's current values */
    if (st) return st;
    int64_t T = fr_model_context(m);
    size_t blocks = 0;
    char nm[FR_ST_NAME_MAX];
    for (size_t i = 0; i < m->n_params; i++) {
        if (!m->params[i].data)
            return fr_fail(ctx, FR_ERR_ARG,
                           "%s: parameter '%s' is not held whole in this process (ZeRO-3 shards "
                           "it): gather the weights before saving them",
                           path, m->params[i].name);
        blocks += mask_name(m->params[i].name, nm, sizeof nm);
    }
    if (nanogpt_masks && (!blocks || T <= 0))
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: nanoGPT masks asked for, but the model has no nanoGPT attention "
                       "block (a parameter transformer.h.N.attn.c_attn.weight in a token model)",
                       path);
    if (!nanogpt_masks) blocks = 0;
    size_t cap = m->n_params + m->n_alias + blocks;
    fr_st_entry *e = fr_calloc(ctx, (cap + 1) * sizeof *e, FR_MEM_OTHER);
    /* the one (1, 1, T, T) mask every block's entry points at:
     * torch.tril(torch.ones(T, T)), 1 where key <= query */
    float *mask = blocks ? fr_alloc(ctx, (size_t)(T * T) * sizeof *mask, FR_MEM_WORKSPACE) : NULL;
    if (!e || (blocks && !mask)) {
        fr_free(ctx, mask);
        fr_free(ctx, e);
        return fr_fail(ctx, FR_ERR_NOMEM, "%s: out of memory for the weights' table", path);
    }
    for (int64_t q = 0; q < T && mask; q++)
        for (int64_t k = 0; k < T; k++) mask[q * T + k] = k <= q ? 1.0f : 0.0f;
    /* a quantized base (--base-precision) is written dequantized, in f32: a
     * state_dict PyTorch loads (the quantized bytes stay in training
     * checkpoints) */
    float **wide = fr_calloc(ctx, (m->n_params + 1) * sizeof *wide, FR_MEM_OTHER);
    st = wide ? FR_OK : FR_ERR_NOMEM;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        const fr_param *p = &m->params[i];
        if (!p->quant) continue;
        wide[i] = fr_alloc(ctx, (size_t)fr_param_numel(p) * sizeof(float), FR_MEM_WORKSPACE);
        st = wide[i] ? fr_param_read_f32(ctx, p, wide[i]) : FR_ERR_NOMEM;
    }
    int n = 0;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        const fr_param *p = &m->params[i];
        param_entry(&e[n++], p);
        if (wide[i]) {
            e[n - 1].dtype = FR_F32;
            e[n - 1].shape = p->qshape;
            e[n - 1].data = wide[i];
            e[n - 1].nbytes = (size_t)fr_param_numel(p) * sizeof(float);
        }
        if (blocks && mask_name(p->name, nm, sizeof nm)) {
            snprintf(e[n].name, FR_ST_NAME_MAX, "%s", nm);
            e[n].dtype = FR_F32;
            e[n].shape = (fr_shape){4, {1, 1, T, T}};
            e[n].data = mask;
            e[n].nbytes = (size_t)(T * T) * sizeof *mask;
            n++;
        }
    }
    for (size_t i = 0; i < m->n_alias && !st; i++) { /* a tied parameter under its second name */
        param_entry(&e[n], &m->params[m->alias[i].param]);
        snprintf(e[n++].name, FR_ST_NAME_MAX, "%s", m->alias[i].name);
    }
    fr_st_meta meta = {"format", "pt"}; /* what safetensors.torch.save_file's callers write */
    if (!st) st = fr_st_write(ctx, path, e, n, &meta, 1);
    for (size_t i = 0; wide && i < m->n_params; i++) fr_free(ctx, wide[i]);
    fr_free(ctx, wide);
    fr_free(ctx, mask);
    fr_free(ctx, e);
    return st;
}

fr_status fr_model_load_weights_file(fr_model *m, const char *path, const fr_st_file *f) {
    fr_status st = fr_model_alloc_params(m);
    return st ? st : load_weights(m, path, f);
}

/* ---- strict metadata ------------------------------------------------------ */

#define META_COUNT_MAX ((int64_t)1 << 62) /* counters: far from overflow when incremented */

/* The whole of v a non-negative decimal integer <= hi: digits only (no
 * sign, space, fraction or exponent), checked before it can overflow. */
static int strict_uint(const char *v, int64_t hi, int64_t *out) {
    if (!isdigit((unsigned char)v[0])) return 0;
    int64_t x = 0;
    for (const char *c = v; *c; c++) {
        if (!isdigit((unsigned char)*c)) return 0;
        int d = *c - '0';
        if (x > hi / 10 || (x == hi / 10 && d > hi % 10)) return 0;
        x = x * 10 + d;
    }
    *out = x;
    return 1;
}

/* The whole of v a finite decimal number (strtod's syntax, no spaces). */
static int strict_real(const char *v, double *out) {
    if (!v[0] || isspace((unsigned char)v[0])) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno == ERANGE || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

static const char *range_str(int64_t hi, char *buf, size_t len) {
    if (hi == META_COUNT_MAX) return "2^62";
    snprintf(buf, len, "%" PRId64, hi);
    return buf;
}

/* Metadata integer `key` into *out (left as it is when absent). */
static fr_status meta_uint(fr_ctx *ctx, const char *path, const fr_st_file *f, const char *key,
                           int64_t hi, int64_t *out) {
    const char *v = fr_st_meta_get(f, key);
    char r[32];
    if (v && !strict_uint(v, hi, out))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: metadata '%s' = '%s': not an integer in [0, %s]",
                       path, key, v, range_str(hi, r, sizeof r));
    return FR_OK;
}

/* The step's counters as a checkpoint stores them. */
typedef struct counters {
    int64_t t, runs;
    int have_scaler;
    float scale;
    int64_t tracker, skipped;
} counters;

/* optimizer.step, runs and scaler ("<scale> <growth tracker> <skipped>"),
 * each checked whole; nothing is applied here. */
static fr_status read_counters(fr_ctx *ctx, const char *path, const fr_st_file *f, counters *c) {
    fr_status st;
    memset(c, 0, sizeof *c);
    if ((st = meta_uint(ctx, path, f, "optimizer.step", META_COUNT_MAX, &c->t))) return st;
    if ((st = meta_uint(ctx, path, f, "runs", META_COUNT_MAX, &c->runs))) return st;
    const char *sc = fr_st_meta_get(f, "scaler");
    if (!sc) return FR_OK;
    char buf[sizeof f->meta[0].value], *field[3] = {NULL, NULL, NULL}, *save = NULL;
    snprintf(buf, sizeof buf, "%s", sc);
    int n = 0;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (n == 3) {
            n = 4;
            break;
        }
        field[n++] = tok;
    }
    double scale;
    char r[32];
    if (n != 3 || strstr(sc, "  ") || sc[0] == ' ')
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: metadata 'scaler' = '%s': not three fields "
                       "'<scale> <growth tracker> <skipped steps>'",
                       path, sc);
    if (!strict_real(field[0], &scale) || !(scale > 0) || scale > FLT_MAX)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: metadata 'scaler' = '%s': scale '%s' is not a "
                       "positive finite float",
                       path, sc, field[0]);
    if (!strict_uint(field[1], INT_MAX, &c->tracker))
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: metadata 'scaler' = '%s': growth tracker '%s' is not "
                       "an integer in [0, %d]",
                       path, sc, field[1], INT_MAX);
    if (!strict_uint(field[2], META_COUNT_MAX, &c->skipped))
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: metadata 'scaler' = '%s': skipped steps '%s' is not "
                       "an integer in [0, %s]",
                       path, sc, field[2], range_str(META_COUNT_MAX, r, sizeof r));
    c->scale = (float)scale;
    c->have_scaler = 1;
    return FR_OK;
}

static void apply_counters(fr_step *s, const counters *c) {
    s->opt.t = c->t;
    s->sched.runs = (uint64_t)c->runs;
    if (c->have_scaler) {
        s->opt.scaler.scale = c->scale;
        s->opt.scaler.growth_tracker = (int)c->tracker;
        s->opt.scaler.skipped = (uint64_t)c->skipped;
    }
}

/* The optimizer the file was saved with against the step's. */
static fr_status check_kind(fr_step *s, const char *path, const fr_st_file *f) {
    const char *kind = fr_st_meta_get(f, "optimizer"), *mine = fr_optim_name(s->o.optim.kind);
    if (s->o.training && kind && strcmp(kind, mine) != 0)
        return fr_fail(s->ctx, FR_ERR_ARG, "%s: saved with optimizer %s, resuming with %s", path,
                       kind, mine);
    return FR_OK;
}

/* Weights and (when training) optimizer state from f into s. */
static fr_status load_state(fr_step *s, const char *path, const fr_st_file *f) {
    fr_ctx *ctx = s->ctx;
    fr_model *m = s->m;
    fr_status st;
    if ((st = check_kind(s, path, f)) || (st = load_weights(m, path, f))) return st;
    if (!s->o.training) return FR_OK;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        fr_state_part part[FR_STATE_PARTS_MAX];
        int np = fr_optim_state_parts(&s->o.optim, &p->shape, part);
        for (int j = 0; j < np; j++) {
            int k = part[j].block;
            if (!state_of(m, i, k)) continue;
            float *at = (float *)state_of(m, i, k) + part[j].off;
            char nm[FR_ST_NAME_MAX];
            snprintf(nm, sizeof nm, "optimizer.%.100s.%s", p->name, part[j].name);
            size_t a, b;
            if (s->o.zero >= 1 && fr_step_owned(s, i, &a, &b)) { /* ZeRO: this rank's shard */
                float *t = fr_alloc(ctx, (size_t)fr_shape_numel(&p->shape) * 4, FR_MEM_WORKSPACE);
                if (!t) return FR_ERR_NOMEM;
                if (!(st = copy_in(ctx, path, f, nm, FR_F32, &p->shape, t)))
                    fr_state_encode(t + a, (fr_state_kind)kind_of(m, i), b - a, k == 0,
                                    state_of(m, i, k));
                fr_free(ctx, t);
                if (st) return st;
                continue;
            }
            if (state_is_f32(m, i)) {
                if ((st = copy_in(ctx, path, f, nm, FR_F32, &part[j].shape, at))) return st;
                continue;
            }
            if (p->dtype == FR_F32 && kind_of(m, i) == FR_STATE_INT8) {
                fr_shape raw = fr_shape1(
                    (int64_t)fr_state_bytes(FR_STATE_INT8, (size_t)fr_shape_numel(&p->shape)));
                size_t len = strlen(nm);
                snprintf(nm + len, sizeof nm - len, ".int8_blockwise");
                if ((st = copy_in(ctx, path, f, nm, FR_U8, &raw, state_of(m, i, k)))) return st;
                continue;
            }
            float *t = fr_alloc(ctx, (size_t)fr_shape_numel(&p->shape) * 4, FR_MEM_WORKSPACE);
            if (!t) return FR_ERR_NOMEM;
            if (!(st = copy_in(ctx, path, f, nm, FR_F32, &p->shape, t))) state_encode(m, i, k, t);
            fr_free(ctx, t);
            if (st) return st;
        }
    }
    return FR_OK;
}

fr_status fr_step_load_meta(fr_step *s, const char *path, fr_st_meta *meta, int *n_meta) {
    fr_ctx *ctx = s->ctx;
    fr_st_file f;
    counters c;
    /* on a device: host buffers for the state to land in, sent back below */
    fr_status st = fr_model_to_host(s->m);
    if (st || (st = fr_st_read(ctx, path, &f, FR_MEM_OTHER))) return st;
    if ((st = read_counters(ctx, path, &f, &c)) || (st = load_state(s, path, &f)) ||
        (st = fr_model_to_device(s->m)))
        goto done;
    if (s->o.training) apply_counters(s, &c);
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

/* ---- the run's settings ---------------------------------------------------- */

/* What a bit-exact resume depends on besides the state: each setting under
 * its metadata key, with the option that sets it. lr is the exception: it
 * may differ (PyTorch users lower it on resume by editing param_groups), and
 * the trainer warns; every other difference is refused. */
typedef enum { RS_INT, RS_REAL, RS_WORD } rs_kind;

typedef struct run_setting {
    const char *key, *option;
    rs_kind kind;
    int64_t i;
    double r;
    char w[128];
} run_setting;

/* room for every setting run_settings records (it stops at this many: a
 * new setting past it trips the assert there, not the stack) */
#define RUN_SETTINGS 40

/* The frozen parameters (trainable ones that get no gradient) as index ranges
 * ("0-1,4"; "none"): the same set whichever --freeze text named it. */
static int is_frozen(const fr_model *m, size_t i) {
    return m->params[i].trainable && m->params[i].frozen;
}

static void frozen_ranges(const fr_model *m, char *out, size_t cap) {
    size_t len = 0;
    int any = 0, fits = 1;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the flags, when ranges do not fit */
    out[0] = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        h = (h ^ (uint64_t)is_frozen(m, i)) * 1099511628211ULL;
        if (!is_frozen(m, i)) continue;
        size_t j = i;
        while (j + 1 < m->n_params && is_frozen(m, j + 1)) j++;
        for (size_t q = i + 1; q <= j; q++) h = (h ^ 1u) * 1099511628211ULL;
        int k = j > i ? snprintf(out + len, cap - len, "%s%zu-%zu", any ? "," : "", i, j)
                      : snprintf(out + len, cap - len, "%s%zu", any ? "," : "", i);
        if (k < 0 || (size_t)k >= cap - len) fits = 0;
        else len += (size_t)k;
        any = 1;
        i = j;
    }
    if (!any) snprintf(out, cap, "none");
    else if (!fits) snprintf(out, cap, "fnv:%016" PRIx64, h);
}

static int run_settings(const fr_step *s, run_setting *r) {
    static const char *states[] = {"fp32", "bf16", "int8"};
    const fr_optim_opts *o = &s->o.optim;
    int n = 0;
#define RS(k, opt, kind_, field, val)                                 \
    do {                                                              \
        assert(n < RUN_SETTINGS);                                     \
        r[n] = (run_setting){.key = k, .option = opt, .kind = kind_}; \
        r[n].field = val;                                             \
        n++;                                                          \
    } while (0)
    /* data parallel: the one process's settings (global batch, its micro-batch),
     * so that a checkpoint resumes on any number of ranks */
    int batch = s->dp.global_batch ? s->dp.global_batch : s->o.batch;
    RS("batch_size", "--batch", RS_INT, i, batch);
    RS("micro_batch", "--micro-batch", RS_INT, i,
       s->dp.global_batch ? s->dp.global_batch / s->sched.accumulate : s->sched.micro);
    RS("seed", "--seed", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%" PRIu64, s->o.seed);
    RS("precision", "--precision", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%s", fr_precision_name(s->o.precision));
    RS("base_precision", "--base-precision", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%s", fr_base_precision_name(s->o.base_precision));
    RS("optimizer_state", "--optimizer-state", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%s",
             s->o.optim_state >= 0 && s->o.optim_state < 3 ? states[s->o.optim_state] : "?");
    RS("loss_scaling", "--loss-scale", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%s", s->opt.scaler.enabled ? "dynamic" : "none");
    RS("clip_grad_norm", "--clip-grad-norm", RS_REAL, r, (double)s->o.clip_grad_norm);
    RS("lora", "--lora", RS_WORD, i, 0); /* before frozen: it freezes the base */
    if (s->m->lora.r)
        snprintf(r[n - 1].w, sizeof r[n - 1].w, "r=%d,alpha=%.17g,dropout=%.17g", s->m->lora.r,
                 s->m->lora.alpha, s->m->lora.dropout);
    else snprintf(r[n - 1].w, sizeof r[n - 1].w, "none");
    RS("frozen", "--freeze", RS_WORD, i, 0);
    frozen_ranges(s->m, r[n - 1].w, sizeof r[n - 1].w);
    RS("lr", "--lr", RS_REAL, r, (double)o->lr);
    RS("momentum", "--momentum", RS_REAL, r, (double)o->momentum);
    RS("dampening", "--dampening", RS_REAL, r, (double)o->dampening);
    RS("nesterov", "--nesterov", RS_INT, i, o->nesterov);
    RS("betas", "betas", RS_WORD, i, 0);
    snprintf(r[n - 1].w, sizeof r[n - 1].w, "%.17g,%.17g", (double)o->beta1, (double)o->beta2);
    RS("eps", "--eps", RS_REAL, r, (double)o->eps);
    RS("weight_decay", "--weight-decay", RS_REAL, r, (double)o->weight_decay);
    if (o->kind == FR_OPTIM_ADAFACTOR) { /* only its files carry them */
        RS("beta2_decay", "--beta2-decay", RS_REAL, r, o->beta2_decay);
        RS("eps2", "--eps2", RS_REAL, r, o->eps2);
        RS("clip_threshold", "--clip-threshold", RS_REAL, r, o->clip_threshold);
    }
#undef RS
    return n;
}

static void setting_str(const run_setting *r, char *out, size_t cap) {
    if (r->kind == RS_INT) snprintf(out, cap, "%" PRId64, r->i);
    else if (r->kind == RS_REAL) snprintf(out, cap, "%.17g", r->r);
    else snprintf(out, cap, "%s", r->w);
}

fr_status fr_ckpt_save(fr_step *s, const char *path, const char *freeze, int epoch,
                       int64_t batches_done) {
    run_setting r[RUN_SETTINGS];
    fr_st_meta meta[RUN_SETTINGS + 3];
    int n = run_settings(s, r), nm = 0;
    snprintf(meta[nm].key, sizeof meta[nm].key, "epoch");
    snprintf(meta[nm++].value, sizeof meta[0].value, "%d", epoch);
    snprintf(meta[nm].key, sizeof meta[nm].key, "batch"); /* batches done inside the epoch */
    snprintf(meta[nm++].value, sizeof meta[0].value, "%" PRId64, batches_done);
    snprintf(meta[nm].key, sizeof meta[nm].key, "freeze"); /* the text, for messages */
    snprintf(meta[nm++].value, sizeof meta[0].value, "%s", freeze && *freeze ? freeze : "none");
    for (int k = 0; k < n; k++) {
        snprintf(meta[nm].key, sizeof meta[nm].key, "%s", r[k].key);
        setting_str(&r[k], meta[nm++].value, sizeof meta[0].value);
    }
    return fr_step_save_meta(s, path, meta, nm);
}

/* A file written by fr_step_save_meta names its optimizer; a weights-only
 * file (a PyTorch state_dict, `frugal train --save` of an eval step) has
 * neither that nor any optimizer tensor. */
static int has_optimizer_state(const fr_st_file *f) {
    if (fr_st_meta_get(f, "optimizer")) return 1;
    for (int i = 0; i < f->n; i++)
        if (strncmp(f->entries[i].name, "optimizer.", 10) == 0) return 1;
    return 0;
}

/* Each stored setting against the step's; a key that is absent (a file
 * from before the settings were stored) is not checked. */
static fr_status check_settings(fr_step *s, const char *path, const fr_st_file *f,
                                const char *freeze, fr_ckpt_pos *pos) {
    fr_ctx *ctx = s->ctx;
    run_setting r[RUN_SETTINGS];
    int n = run_settings(s, r);
    for (int k = 0; k < n; k++) {
        const char *v = fr_st_meta_get(f, r[k].key);
        if (!v) continue;
        int64_t i = 0;
        double x = 0;
        int same;
        if (r[k].kind == RS_INT) {
            if (!strict_uint(v, INT64_MAX, &i))
                return fr_fail(ctx, FR_ERR_FORMAT,
                               "%s: metadata '%s' = '%s': not an integer in [0, %" PRId64 "]", path,
                               r[k].key, v, INT64_MAX);
            same = i == r[k].i;
        } else if (r[k].kind == RS_REAL) {
            if (!strict_real(v, &x))
                return fr_fail(ctx, FR_ERR_FORMAT, "%s: metadata '%s' = '%s': not a finite number",
                               path, r[k].key, v);
            same = x == r[k].r;
        } else {
            same = strcmp(v, r[k].w) == 0;
        }
        if (same) continue;
        if (!strcmp(r[k].key, "lr")) {
            pos->lr_differs = 1;
            pos->saved_lr = x;
            continue;
        }
        char now[160];
        setting_str(&r[k], now, sizeof now);
        if (!strcmp(r[k].key, "frozen")) {
            const char *was = fr_st_meta_get(f, "freeze");
            return fr_fail(ctx, FR_ERR_ARG,
                           "%s: --freeze %s differs from the checkpoint's %s "
                           "(frozen parameters %s, the checkpoint's %s)",
                           path, freeze && *freeze ? freeze : "none", was ? was : "?", now, v);
        }
        char was[160];
        snprintf(was, sizeof was, "%s", v);
        if (r[k].kind == RS_REAL) /* the shortest forms that tell the two apart */
            for (int d = 6; d <= 17; d++) {
                snprintf(now, sizeof now, "%.*g", d, r[k].r);
                snprintf(was, sizeof was, "%.*g", d, x);
                if (strcmp(now, was) != 0) break;
            }
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: %s %s differs from the checkpoint's %s: resume with the "
                       "settings it was saved with",
                       path, r[k].option, now, was);
    }
    return FR_OK;
}

fr_status fr_ckpt_resume(fr_step *s, const char *path, const char *freeze, fr_ckpt_pos *pos) {
    fr_ctx *ctx = s->ctx;
    fr_st_file f;
    counters c;
    int64_t epoch = 0, batches = 0;
    memset(pos, 0, sizeof *pos);
    fr_status st = fr_st_read(ctx, path, &f, FR_MEM_OTHER);
    if (st) return st;
    if (!has_optimizer_state(&f)) {
        st = fr_fail(ctx, FR_ERR_ARG,
                     "%s: no optimizer state and no training position: a "
                     "weights-only file cannot be resumed; use --init %s to start from its weights "
                     "with a fresh optimizer",
                     path, path);
        goto done;
    }
    /* Everything is checked before anything is loaded. A file with optimizer
     * state that lacks a counter or the position was edited: its absence
     * would silently restart it at 0. */
    static const struct {
        const char *key, *why;
    } needed[] = {{"optimizer.step", "the steps taken, which Adam's bias correction divides by"},
                  {"runs", "the micro-batches run, which the dropout stream continues from"},
                  {"epoch", "the epochs done"},
                  {"batch", "the batches done inside the next epoch"}};
    for (size_t k = 0; k < sizeof needed / sizeof needed[0]; k++)
        if (!fr_st_meta_get(&f, needed[k].key)) {
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: metadata '%s' is missing (%s): a checkpoint frugal saves has it; "
                         "this one cannot be resumed exactly (--init starts from its weights)",
                         path, needed[k].key, needed[k].why);
            goto done;
        }
    if ((st = read_counters(ctx, path, &f, &c))) goto done;
    if ((st = meta_uint(ctx, path, &f, "epoch", INT_MAX, &epoch))) goto done;
    if ((st = meta_uint(ctx, path, &f, "batch", META_COUNT_MAX, &batches))) goto done;
    if ((st = check_kind(s, path, &f)) || (st = check_settings(s, path, &f, freeze, pos)))
        goto done;
    /* on a device: host buffers for the state to land in, then sent there */
    if ((st = fr_model_to_host(s->m)) || (st = load_state(s, path, &f)) ||
        (st = fr_model_to_device(s->m)))
        goto done;
    apply_counters(s, &c);
    pos->epoch = (int)epoch;
    pos->batches_done = batches;
done:
    fr_st_close(ctx, &f);
    return st;
}
