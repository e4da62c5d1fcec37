/* lora.c — LoRA adapters on a model's linear layers (PEFT's LoraConfig with
 * bias "none"): the --lora text, which layers a target names, the adapter
 * parameters added to the model (and everything else frozen), and the
 * adapters' part of a layer's forward graph. It knows nothing of files
 * (run/adapter.c reads and writes PEFT's) or of kernels.
 *
 * For an adapted layer (x -> W (O,K), b; A (r,K), B (O,r), s = alpha / r):
 *   y0 = LINEAR(x, W, b)            the base, frozen: no gradient, nothing saved for W
 *   d  = DROPOUT(x, p)              training with p > 0; else d = x
 *   u  = LINEAR(d, A)               (N, r)
 *   v  = LINEAR(u, B), attr.scale s (N, O)
 *   y  = ADD(y0, v)
 * which is PEFT's lora.Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling. */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/mem.h"
#include "model/model.h"

/* The number v[0..len) in *out; 0 if it is one. */
static int parse_num(const char *v, size_t len, double *out) {
    char buf[64], *end;
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, v, len);
    buf[len] = 0;
    *out = strtod(buf, &end);
    return *end || !isfinite(*out) ? -1 : 0;
}

fr_status fr_lora_parse(fr_ctx *ctx, const char *spec, fr_lora_cfg *out) {
    fr_lora_cfg c = {.r = 0, .alpha = 8.0, .dropout = 0.0};
    const char *p = spec;
    int have_r = 0;
    while (p && *p) {
        const char *eq = strchr(p, '='), *comma = strchr(p, ',');
        if (!eq || (comma && comma < eq))
            return fr_fail(ctx, FR_ERR_ARG,
                           "--lora '%s': expected key=value items (r=8,alpha=16,dropout=0.05,"
                           "target=attn.c_attn,attn.c_proj), at '%s'",
                           spec, p);
        size_t klen = (size_t)(eq - p);
        const char *v = eq + 1;
        if (klen == 6 && !strncmp(p, "target", 6)) { /* the rest: a list of its own */
            size_t n = strlen(v);
            if (n == 0) return fr_fail(ctx, FR_ERR_ARG, "--lora target=: name at least one layer");
            if (n >= sizeof c.targets)
                return fr_fail(ctx, FR_ERR_ARG, "--lora target=: the list is over %zu characters",
                               sizeof c.targets - 1);
            memcpy(c.targets, v, n + 1);
            break;
        }
        size_t vlen = comma ? (size_t)(comma - v) : strlen(v);
        double x;
        if (parse_num(v, vlen, &x))
            return fr_fail(ctx, FR_ERR_ARG, "--lora %.*s=%.*s: expected a number", (int)klen, p,
                           (int)vlen, v);
        if (klen == 1 && p[0] == 'r') {
            if (x != floor(x) || x < 1 || x > 1 << 20)
                return fr_fail(ctx, FR_ERR_ARG, "--lora r=%g: the rank must be a whole number >= 1",
                               x);
            c.r = (int)x, have_r = 1;
        } else if (klen == 5 && !strncmp(p, "alpha", 5)) {
            if (!(x > 0)) return fr_fail(ctx, FR_ERR_ARG, "--lora alpha=%g: must be > 0", x);
            c.alpha = x;
        } else if (klen == 7 && !strncmp(p, "dropout", 7)) {
            if (!(x >= 0 && x < 1))
                return fr_fail(ctx, FR_ERR_ARG, "--lora dropout=%g: must be in [0, 1)", x);
            c.dropout = x;
        } else {
            return fr_fail(ctx, FR_ERR_ARG,
                           "--lora: unknown key '%.*s' (r, alpha, dropout, target)", (int)klen, p);
        }
        p = comma ? comma + 1 : v + vlen;
    }
    if (!have_r) return fr_fail(ctx, FR_ERR_ARG, "--lora '%s': r= (the rank) is missing", spec);
    if (!c.targets[0])
        return fr_fail(ctx, FR_ERR_ARG,
                       "--lora '%s': target= (the layers to adapt, last) is missing", spec);
    *out = c;
    return FR_OK;
}

/* PEFT's rule: the name is the target, or ends in "." + target; a target
 * with a glob character matches the whole name by fnmatch. */
static int target_match(const char *name, const char *t, size_t len) {
    char buf[FR_LORA_TARGETS_MAX];
    memcpy(buf, t, len);
    buf[len] = 0;
    if (strpbrk(buf, "*?[")) return fnmatch(buf, name, 0) == 0;
    size_t n = strlen(name);
    return (n == len && !memcmp(name, buf, len)) ||
           (n > len && name[n - len - 1] == '.' && !memcmp(name + n - len, buf, len));
}

/* Whether layer l is named by one of the comma-separated targets. */
static int layer_targeted(const fr_layer *l, const char *targets) {
    for (const char *p = targets; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len && target_match(l->name, p, len)) return 1;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

static fr_status add_adapter(fr_model *m, int li, const char *suffix, fr_shape shape,
                             fr_param_role role, int64_t fan_in) {
    if (fr_grow(m->ctx, (void **)&m->params, &m->cap_params, m->n_params + 1, sizeof(fr_param),
                FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    fr_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%.100s.%s", m->layers[li].name, suffix);
    p->shape = shape;
    p->dtype = FR_F32;
    p->role = role;
    p->trainable = 1;
    p->layer = li;
    p->fan_in = fan_in;
    return FR_OK;
}

fr_status fr_model_lora(fr_model *m, const fr_lora_cfg *c, uint64_t seed) {
    fr_ctx *ctx = m->ctx;
    if (m->lora.r)
        return fr_fail(ctx, FR_ERR_ARG, "--lora: the model has adapters already (r=%d)", m->lora.r);
    if (c->r < 1) return fr_fail(ctx, FR_ERR_ARG, "--lora r=%d: the rank must be >= 1", c->r);
    if (!(c->alpha > 0)) return fr_fail(ctx, FR_ERR_ARG, "--lora alpha=%g: must be > 0", c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return fr_fail(ctx, FR_ERR_ARG, "--lora dropout=%g: must be in [0, 1)", c->dropout);
    if (m->shard)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--lora: not with ZeRO 3's sharded weights (--zero 2 or less)");
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].frozen)
            return fr_fail(ctx, FR_ERR_ARG,
                           "--lora freezes every base parameter itself: drop --freeze (%s is "
                           "frozen by it)",
                           m->params[i].name);
    /* Check everything before changing anything: each target names a linear
     * layer, the rank fits each one matched */
    for (const char *p = c->targets; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int hit = 0;
        const fr_layer *other = NULL;
        for (size_t i = 0; i < m->n_layers && len; i++) {
            const fr_layer *l = &m->layers[i];
            if (!target_match(l->name, p, len)) continue;
            if (l->kind != FR_L_LINEAR) {
                other = other ? other : l;
                continue;
            }
            hit = 1;
            const fr_shape *w = &m->params[l->wparam].shape; /* (O, K) */
            int64_t lim = w->d[0] < w->d[1] ? w->d[0] : w->d[1];
            if (c->r > lim)
                return fr_fail(ctx, FR_ERR_ARG,
                               "--lora r=%d: layer %s is %lld x %lld (out x in): the rank can be "
                               "at most %lld",
                               c->r, l->name, (long long)w->d[0], (long long)w->d[1],
                               (long long)lim);
        }
        if (!hit && other)
            return fr_fail(ctx, FR_ERR_ARG,
                           "--lora target '%.*s' names layer %s, a %s layer: adapters go on "
                           "linear layers only",
                           (int)len, p, other->name, fr_layer_kind_name(other->kind));
        if (!hit) {
            char names[256];
            size_t k = 0;
            names[0] = 0;
            for (size_t i = 0; i < m->n_layers && k + 1 < sizeof names; i++) {
                if (m->layers[i].kind != FR_L_LINEAR) continue;
                int n =
                    snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", m->layers[i].name);
                k = n < 0 || (size_t)n >= sizeof names - k ? sizeof names : k + (size_t)n;
            }
            if (k >= sizeof names) strcpy(names + sizeof names - 5, "...");
            return fr_fail(ctx, FR_ERR_ARG,
                           "--lora target '%.*s' matches no linear layer (the model's linear "
                           "layers: %s)",
                           (int)len, p, names[0] ? names : "none");
        }
        p = e ? e + 1 : p + len;
    }
    size_t first = m->n_params;
    for (size_t i = 0; i < m->n_layers; i++) {
        fr_layer *l = &m->layers[i];
        if (l->kind != FR_L_LINEAR || !layer_targeted(l, c->targets)) continue;
        const fr_shape w = m->params[l->wparam].shape;
        fr_status st;
        l->lora_a = (int)m->n_params;
        if ((st = add_adapter(m, (int)i, "lora_A.weight", fr_shape2(c->r, w.d[1]), FR_P_LORA_A,
                              w.d[1])))
            return st;
        l->lora_b = (int)m->n_params;
        if ((st = add_adapter(m, (int)i, "lora_B.weight", fr_shape2(w.d[0], c->r), FR_P_LORA_B,
                              c->r)))
            return st;
        l->lora = 1;
        l->lora_scale = (float)(c->alpha / c->r);
        l->lora_p = (float)c->dropout;
    }
    for (size_t i = 0; i < first; i++) /* PEFT: every base parameter frozen */
        if (m->params[i].trainable) m->params[i].frozen = 1;
    m->lora = *c;
    if (m->optim_free) m->optim_free(m); /* its records were sized for the base */
    if (m->pblock) {                     /* a model holding values: the adapters join its block */
        fr_status st = fr_model_alloc_params(m);
        if (!st && m->initialised) st = fr_model_init_params(m, seed, first);
        if (st) return st;
    }
    return FR_OK;
}

fr_status fr_model_lora_spec(fr_model *m, const char *spec, uint64_t seed) {
    fr_lora_cfg c;
    fr_status st = fr_lora_parse(m->ctx, spec, &c);
    return st ? st : fr_model_lora(m, &c, seed);
}

int fr_model_lora_rank(const fr_model *m) { return m->lora.r; }

size_t fr_model_num_trained(const fr_model *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if (fr_param_learns(&m->params[i])) n += (size_t)fr_shape_numel(&m->params[i].shape);
    return n;
}

int fr_lora_emit(fr_graph *g, const fr_layer *l, int li, int x, int base, const int *pv,
                 int training, int *out) {
    int y0 = out[0], d = x, o[FR_MAX_OUT], in[3];
    g->nodes[base].layer = li;
    if (training && l->lora_p > 0.0f) {
        fr_attr a = {0};
        a.p = l->lora_p;
        a.training = 1;
        a.salt = 0x80000000u | (uint32_t)li; /* its own: base dropouts keep their streams */
        int n = fr_graph_node(g, FR_OP_DROPOUT, &x, 1, &a, -1, 0, o);
        if (n < 0) return -1;
        g->nodes[n].layer = li;
        d = o[0];
    }
    fr_attr a = {0};
    in[0] = d, in[1] = pv[l->lora_a], in[2] = -1;
    int n = fr_graph_node(g, FR_OP_LINEAR, in, 3, &a, -1, 0, o);
    if (n < 0) return -1;
    g->nodes[n].layer = li;
    a.scale = l->lora_scale;
    in[0] = o[0], in[1] = pv[l->lora_b];
    if ((n = fr_graph_node(g, FR_OP_LINEAR, in, 3, &a, -1, 0, o)) < 0) return -1;
    g->nodes[n].layer = li;
    fr_attr none = {0};
    in[0] = y0, in[1] = o[0];
    if ((n = fr_graph_node(g, FR_OP_ADD, in, 2, &none, -1, 0, out)) < 0) return -1;
    return n;
}
