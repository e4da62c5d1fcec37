/* adapter.c — PEFT's LoRA adapter files (see adapter.h). */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/half.h"
#include "core/mem.h"
#include "io/file.h"
#include "io/json.h"
#include "run/adapter.h"
#include "run/checkpoint.h"
#include "train/place.h"

#define PEFT_PREFIX "base_model.model."
#define CONFIG_NAME "adapter_config.json"
#define MODEL_NAME "adapter_model.safetensors"
#define PATH_MAX_LEN 4096

static int is_adapter(const fr_param *p) {
    return p->role == FR_P_LORA_A || p->role == FR_P_LORA_B;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The pair's paths for `path` (a directory, or the .safetensors file). */
static fr_status pair_paths(fr_ctx *ctx, const char *path, char *config, char *model) {
    if (is_dir(path)) {
        if (snprintf(config, PATH_MAX_LEN, "%s/" CONFIG_NAME, path) >= PATH_MAX_LEN ||
            snprintf(model, PATH_MAX_LEN, "%s/" MODEL_NAME, path) >= PATH_MAX_LEN)
            return fr_fail(ctx, FR_ERR_ARG, "--adapter %s: the path is too long", path);
        return FR_OK;
    }
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path) : 1;
    if (snprintf(config, PATH_MAX_LEN, "%.*s/" CONFIG_NAME, dir, slash ? path : ".") >=
            PATH_MAX_LEN ||
        snprintf(model, PATH_MAX_LEN, "%s", path) >= PATH_MAX_LEN)
        return fr_fail(ctx, FR_ERR_ARG, "--adapter %s: the path is too long", path);
    return FR_OK;
}

/* LoraConfig's fields as fr_lora_cfg; what frugal does not do is refused by name. */
static fr_status config_of(fr_ctx *ctx, const char *path, const fr_json *j, fr_lora_cfg *c) {
    const fr_json *v;
    memset(c, 0, sizeof *c);
    if (j->kind != FR_JSON_OBJECT)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: not a JSON object", path);
    if ((v = fr_json_get(j, "peft_type")) && (v->kind != FR_JSON_STRING || strcmp(v->str, "LORA")))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: peft_type is not \"LORA\"", path);
    v = fr_json_get(j, "r");
    if (!v || v->kind != FR_JSON_NUMBER || v->number != floor(v->number) || v->number < 1 ||
        v->number > 1 << 20)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"r\" must be a whole number >= 1", path);
    c->r = (int)v->number;
    v = fr_json_get(j, "lora_alpha");
    c->alpha = 8.0; /* PEFT's default */
    if (v && (v->kind != FR_JSON_NUMBER || !(v->number > 0)))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"lora_alpha\" must be a number > 0", path);
    if (v) c->alpha = v->number;
    v = fr_json_get(j, "lora_dropout");
    if (v && (v->kind != FR_JSON_NUMBER || !(v->number >= 0 && v->number < 1)))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"lora_dropout\" must be in [0, 1)", path);
    if (v) c->dropout = v->number;
    static const char *off[] = {"use_rslora", "use_dora"};
    for (int k = 0; k < 2; k++)
        if ((v = fr_json_get(j, off[k])) && !(v->kind == FR_JSON_BOOL && !v->boolean) &&
            v->kind != FR_JSON_NULL)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"%s\" is not supported (false only)", path,
                           off[k]);
    if ((v = fr_json_get(j, "bias")) && (v->kind != FR_JSON_STRING || strcmp(v->str, "none")))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"bias\" other than \"none\" is not supported",
                       path);
    static const char *empty[] = {"rank_pattern", "alpha_pattern", "modules_to_save"};
    for (int k = 0; k < 3; k++)
        if ((v = fr_json_get(j, empty[k])) && v->kind != FR_JSON_NULL && v->n)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: \"%s\" is not supported (empty only)", path,
                           empty[k]);
    v = fr_json_get(j, "target_modules");
    if (!v || v->kind != FR_JSON_ARRAY || !v->n)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: \"target_modules\" must be a list of layer names (a regular "
                       "expression is not supported)",
                       path);
    size_t k = 0;
    for (size_t i = 0; i < v->n; i++) {
        const fr_json *t = &v->items[i];
        size_t n = t->kind == FR_JSON_STRING ? strlen(t->str) : 0;
        if (!n || strchr(t->str, ','))
            return fr_fail(ctx, FR_ERR_FORMAT,
                           "%s: target_modules[%zu] is not a layer name (a non-empty string "
                           "without commas)",
                           path, i);
        if (k + n + 2 > sizeof c->targets)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: target_modules: over %zu characters", path,
                           sizeof c->targets - 1);
        if (k) c->targets[k++] = ',';
        memcpy(c->targets + k, t->str, n + 1);
        k += n;
    }
    return FR_OK;
}

fr_status fr_adapter_lora(fr_model *m, const char *path, uint64_t seed) {
    fr_ctx *ctx = m->ctx;
    char config[PATH_MAX_LEN], model[PATH_MAX_LEN], *text = NULL;
    size_t len = 0;
    fr_json j;
    fr_lora_cfg c;
    fr_status st = pair_paths(ctx, path, config, model);
    if (st || (st = fr_read_small(ctx, config, "adapter config", 1u << 20, &text, &len))) return st;
    st = fr_json_parse(ctx, config, text, len, &j);
    fr_free(ctx, text);
    if (st) return st;
    st = config_of(ctx, config, &j, &c);
    fr_json_free(ctx, &j);
    if (st) return st;
    if ((st = fr_model_lora(m, &c, seed)))
        return fr_fail(ctx, st, "--adapter %s: %s", config, fr_last_error(ctx));
    return FR_OK;
}

/* "transformer.h.0.attn.c_attn" and "A" of adapter parameter p. */
static void adapter_parts(const fr_model *m, const fr_param *p, const char **layer, char *which) {
    *layer = m->layers[p->layer].name;
    *which = p->role == FR_P_LORA_A ? 'A' : 'B';
}

fr_status fr_adapter_load(fr_model *m, const char *path) {
    fr_ctx *ctx = m->ctx;
    char config[PATH_MAX_LEN], model[PATH_MAX_LEN], nm[FR_ST_NAME_MAX + 32], sa[64];
    fr_st_file f;
    fr_status st = pair_paths(ctx, path, config, model);
    if (st || (st = fr_st_read(ctx, model, &f, FR_MEM_OTHER))) return st;
    const char *first = "none";
    for (size_t k = 0; k < m->n_params; k++)
        if (is_adapter(&m->params[k])) {
            first = m->params[k].name;
            break;
        }
    /* nothing the model does not have */
    for (int i = 0; i < f.n && !st; i++) {
        const char *e = f.entries[i].name;
        int known = 0;
        for (size_t k = 0; k < m->n_params && !known; k++)
            if (is_adapter(&m->params[k])) {
                snprintf(nm, sizeof nm, PEFT_PREFIX "%s", m->params[k].name);
                known = !strcmp(nm, e);
            }
        if (!known)
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: unexpected tensor '%s': the model has no such adapter (its first "
                         "is '" PEFT_PREFIX "%s')",
                         model, e, first);
    }
    /* every adapter, each its layer's shape; checked before anything changes */
    for (size_t k = 0; k < m->n_params && !st; k++) {
        const fr_param *p = &m->params[k];
        if (!is_adapter(p)) continue;
        const char *layer;
        char which;
        adapter_parts(m, p, &layer, &which);
        snprintf(nm, sizeof nm, PEFT_PREFIX "%s", p->name);
        const fr_st_entry *e = fr_st_find(&f, nm);
        if (!e) {
            st = fr_fail(ctx, FR_ERR_FORMAT, "%s: lora_%c of %s ('%s') is missing", model, which,
                         layer, nm);
            break;
        }
        const fr_shape *s = &e->shape, *w = &p->shape;
        if (e->dtype != FR_F32 && e->dtype != FR_F16 && e->dtype != FR_BF16) {
            st = fr_fail(ctx, FR_ERR_FORMAT, "%s: lora_%c of %s is %s: F32, F16 or BF16 only",
                         model, which, layer, fr_dtype_name(e->dtype));
        } else if (s->ndim != 2) {
            st = fr_fail(ctx, FR_ERR_FORMAT, "%s: lora_%c of %s is %s, not a matrix", model, which,
                         layer, fr_shape_str(s, sa, sizeof sa));
        } else if (which == 'A' && s->d[1] != w->d[1]) {
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: lora_A of %s is %s: the model's layer takes %lld inputs", model,
                         layer, fr_shape_str(s, sa, sizeof sa), (long long)w->d[1]);
        } else if (which == 'B' && s->d[0] != w->d[0]) {
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: lora_B of %s is %s: the model's layer makes %lld outputs", model,
                         layer, fr_shape_str(s, sa, sizeof sa), (long long)w->d[0]);
        } else if (s->d[0] != w->d[0] || s->d[1] != w->d[1]) {
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: lora_%c of %s is %s: rank %lld, the config's r is %d", model, which,
                         layer, fr_shape_str(s, sa, sizeof sa),
                         (long long)(which == 'A' ? s->d[0] : s->d[1]), m->lora.r);
        }
    }
    /* then the values */
    for (size_t k = 0; k < m->n_params && !st; k++) {
        fr_param *p = &m->params[k];
        if (!is_adapter(p)) continue;
        snprintf(nm, sizeof nm, PEFT_PREFIX "%s", p->name);
        const fr_st_entry *e = fr_st_find(&f, nm);
        size_t n = (size_t)fr_shape_numel(&p->shape);
        void *tmp = fr_alloc(ctx, e->nbytes + 1, FR_MEM_WORKSPACE);
        if (!tmp) {
            st = FR_ERR_NOMEM;
            break;
        }
        st = fr_st_load(ctx, &f, e, tmp);
        if (!st && e->dtype == FR_F32) memcpy(p->data, tmp, n * 4);
        else if (!st && e->dtype == FR_F16) fr_f16_to_f32_n(tmp, p->data, n);
        else if (!st) fr_bf16_to_f32_n(tmp, p->data, n);
        fr_free(ctx, tmp);
    }
    fr_st_close(ctx, &f);
    if (!st) st = fr_model_to_device(m); /* a device's copy of the block */
    return st;
}

fr_status fr_adapter_apply(fr_model *m, const char *path, uint64_t seed) {
    fr_status st = fr_adapter_lora(m, path, seed);
    return st ? st : fr_adapter_load(m, path);
}

/* s as a JSON string into b at *k (cap bytes): quotes and escapes. */
static void put_str(char *b, size_t cap, size_t *k, const char *s) {
    *k += (size_t)snprintf(b + *k, *k < cap ? cap - *k : 0, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            *k += (size_t)snprintf(b + *k, *k < cap ? cap - *k : 0, "\\%c", c);
        else if (c < 0x20) *k += (size_t)snprintf(b + *k, *k < cap ? cap - *k : 0, "\\u%04x", c);
        else *k += (size_t)snprintf(b + *k, *k < cap ? cap - *k : 0, "%c", c);
    }
    *k += (size_t)snprintf(b + *k, *k < cap ? cap - *k : 0, "\"");
}

/* adapter_config.json's text: LoraConfig's fields; target_modules the
 * user's names, or the adapted layers' full names where a glob chose them
 * (PEFT matches names, not globs). */
static size_t config_text(const fr_model *m, char *b, size_t cap) {
    size_t k = 0;
    const fr_lora_cfg *c = &m->lora;
    int glob = strpbrk(c->targets, "*?[") != NULL;
    k += (size_t)snprintf(b + k, k < cap ? cap - k : 0,
                          "{\n  \"peft_type\": \"LORA\",\n  \"r\": %d,\n  \"lora_alpha\": %.17g,\n"
                          "  \"lora_dropout\": %.17g,\n  \"bias\": \"none\",\n"
                          "  \"fan_in_fan_out\": %s,\n  \"use_rslora\": false,\n"
                          "  \"use_dora\": false,\n  \"init_lora_weights\": true,\n"
                          "  \"inference_mode\": true,\n  \"modules_to_save\": null,\n"
                          "  \"rank_pattern\": {},\n  \"alpha_pattern\": {},\n"
                          "  \"target_modules\": [",
                          c->r, c->alpha, c->dropout, m->base_conv1d ? "true" : "false");
    int first = 1;
    if (glob) {
        for (size_t i = 0; i < m->n_layers; i++) {
            if (!m->layers[i].lora) continue;
            k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, first ? "" : ", ");
            put_str(b, cap, &k, m->layers[i].name);
            first = 0;
        }
    } else {
        for (const char *p = c->targets; *p;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char t[FR_LORA_TARGETS_MAX];
            memcpy(t, p, len);
            t[len] = 0;
            k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, first ? "" : ", ");
            put_str(b, cap, &k, t);
            first = 0;
            p = e ? e + 1 : p + len;
        }
    }
    k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, "]\n}\n");
    return k;
}

fr_status fr_adapter_save(fr_model *m, const char *dir) {
    fr_ctx *ctx = m->ctx;
    if (!m->lora.r)
        return fr_fail(
            ctx, FR_ERR_ARG,
            "--save-adapter %s: the model has no LoRA adapters (give --lora or --adapter)", dir);
    char config[PATH_MAX_LEN], model[PATH_MAX_LEN];
    if (snprintf(config, sizeof config, "%s/" CONFIG_NAME, dir) >= (int)sizeof config ||
        snprintf(model, sizeof model, "%s/" MODEL_NAME, dir) >= (int)sizeof model)
        return fr_fail(ctx, FR_ERR_ARG, "--save-adapter %s: the path is too long", dir);
    if (!is_dir(dir) && mkdir(dir, 0777) != 0)
        return fr_fail(ctx, FR_ERR_IO, "--save-adapter %s: cannot make the directory: %s", dir,
                       strerror(errno));
    fr_status st = fr_model_to_host(m);
    if (st) return st;
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) n += is_adapter(&m->params[i]);
    fr_st_entry *e = fr_calloc(ctx, (n + 1) * sizeof *e, FR_MEM_OTHER);
    size_t cap = 4096 + 2 * FR_LORA_TARGETS_MAX + m->n_layers * (FR_ST_NAME_MAX + 8);
    char *text = fr_alloc(ctx, cap, FR_MEM_OTHER);
    if (!e || !text) {
        fr_free(ctx, e);
        fr_free(ctx, text);
        return FR_ERR_NOMEM;
    }
    int k = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!is_adapter(p)) continue;
        if (snprintf(e[k].name, sizeof e[k].name, "%s%s", PEFT_PREFIX, p->name) >=
            (int)sizeof e[k].name) {
            fr_free(ctx, e);
            fr_free(ctx, text);
            return fr_fail(ctx, FR_ERR_ARG, "--save-adapter: %s%s is over %d characters",
                           PEFT_PREFIX, p->name, FR_ST_NAME_MAX - 1);
        }
        e[k].dtype = FR_F32;
        e[k].shape = p->shape;
        e[k].data = p->data;
        e[k++].nbytes = (size_t)fr_shape_numel(&p->shape) * 4;
    }
    size_t len = config_text(m, text, cap);
    int had_config = access(config, F_OK) == 0;
    fr_st_meta meta = {"format", "pt"};
    if (len >= cap) st = fr_fail(ctx, FR_ERR_ARG, "%s: the config is too long", config);
    if (!st) st = fr_write_atomic(ctx, config, text, len);
    if (!st && (st = fr_st_write(ctx, model, e, k, &meta, 1)) && !had_config)
        unlink(config); /* nothing half-written */
    fr_free(ctx, e);
    fr_free(ctx, text);
    return st;
}

void fr_adapter_merged(const fr_model *m, int li, float *w) {
    const fr_layer *l = &m->layers[li];
    const fr_param *W = &m->params[l->wparam], *A = &m->params[l->lora_a],
                   *B = &m->params[l->lora_b];
    int O = (int)W->shape.d[0], K = (int)W->shape.d[1], r = (int)A->shape.d[0];
    memcpy(w, W->data, (size_t)O * (size_t)K * sizeof *w);
    /* w (O,K) += s B (O,r) A (r,K) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, K, r, l->lora_scale, B->data, r,
                A->data, K, 1.0f, w, K);
}

fr_status fr_adapter_merge_save(fr_model *m, const char *path) {
    fr_ctx *ctx = m->ctx;
    if (!m->lora.r)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--merge %s: the model has no LoRA adapters to merge (give --lora or "
                       "--adapter)",
                       path);
    size_t first = m->n_params;
    for (size_t i = 0; i < m->n_params; i++)
        if (is_adapter(&m->params[i]) && first == m->n_params) first = i;
    for (size_t i = first; i < m->n_params; i++)
        if (!is_adapter(&m->params[i]))
            return fr_fail(ctx, FR_ERR_ARG, "--merge: a parameter after the adapters (%s)",
                           m->params[i].name);
    for (size_t li = 0; li < m->n_layers; li++) {
        const fr_layer *l = &m->layers[li];
        if (!l->lora) continue;
        const fr_param *W = &m->params[l->wparam];
        if (W->layer != (int)li)
            return fr_fail(ctx, FR_ERR_ARG,
                           "--merge %s: layer %s's weight is tied to %s, which another layer "
                           "reads too: merging would change both",
                           path, l->name, W->name);
        if (W->dtype != FR_F32)
            return fr_fail(ctx, FR_ERR_ARG, "--merge %s: %s is %s: merging needs fp32 weights",
                           path, W->name, fr_dtype_name(W->dtype));
    }
    fr_status st = fr_model_to_host(m);
    if (st) return st;
    void **saved = fr_calloc(ctx, (m->n_layers + 1) * sizeof *saved, FR_MEM_OTHER);
    if (!saved) return FR_ERR_NOMEM;
    for (size_t li = 0; li < m->n_layers && !st; li++) {
        const fr_layer *l = &m->layers[li];
        if (!l->lora) continue;
        fr_param *W = &m->params[l->wparam];
        float *w =
            fr_alloc(ctx, (size_t)fr_shape_numel(&W->shape) * sizeof *w + 1, FR_MEM_WORKSPACE);
        if (!w) {
            st = FR_ERR_NOMEM;
            break;
        }
        fr_adapter_merged(m, (int)li, w);
        saved[li] = W->data; /* the merged copy stands in while the file is written */
        W->data = w;
    }
    size_t n = m->n_params;
    m->n_params = first; /* the state_dict without adapters */
    if (!st) st = fr_ckpt_save_weights(m, path, 0);
    m->n_params = n;
    for (size_t li = 0; li < m->n_layers; li++) {
        if (!saved[li]) continue;
        fr_param *W = &m->params[m->layers[li].wparam];
        fr_free(ctx, W->data);
        W->data = saved[li];
    }
    fr_free(ctx, saved);
    return st;
}
