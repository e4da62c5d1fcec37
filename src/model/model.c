/* model.c — the model builder (the public fr_model_* calls), parameter
 * naming after PyTorch's nn.Sequential (index or given name, ".weight",
 * ".bias", BatchNorm's running stats), PyTorch's default initialisation, and
 * the forward graph a model emits. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "core/half.h"
#include "core/rng.h"
#include "backend/backend.h"
#include "model/model.h"
#include "core/flat.h"
#include "parallel/pshard.h"
#include "quant/quant.h"

static const char *layer_names[FR_L_COUNT] = {
    "linear",    "conv2d",   "maxpool2d", "avgpool2d", "global_avgpool", "relu",
    "gelu",      "sigmoid",  "tanh",      "batchnorm", "layernorm",      "dropout",
    "flatten",   "residual", "shortcut",  "end",       "embedding",      "pos_embedding",
    "attention", "add",      "rmsnorm",   "swiglu",    "rope_qkv"};

const char *fr_layer_kind_name(fr_layer_kind k) {
    return (unsigned)k < FR_L_COUNT ? layer_names[k] : "?";
}

fr_model *fr_model_new(fr_ctx *ctx, int c, int h, int w) {
    if (c <= 0 || h <= 0 || w <= 0) {
        fr_fail(ctx, FR_ERR_ARG, "model input must have positive dimensions, got (%d, %d, %d)", c,
                h, w);
        return NULL;
    }
    fr_model *m = fr_calloc(ctx, sizeof *m, FR_MEM_OTHER);
    if (!m) return NULL;
    m->ctx = ctx;
    m->in = (h == 1 && w == 1) ? fr_shape1(c) : fr_shape3(c, h, w);
    m->in_dtype = FR_F32;
    m->cur = m->in;
    m->cur_val = FR_MODEL_INPUT;
    m->loss = FR_LOSS_CROSS_ENTROPY;
    return m;
}

fr_model *fr_model_new_tokens(fr_ctx *ctx, int context) {
    if (context <= 0) {
        fr_fail(ctx, FR_ERR_ARG, "a token model's context must be positive, got %d", context);
        return NULL;
    }
    fr_model *m = fr_model_new(ctx, context, 1, 1);
    if (!m) return NULL;
    m->in_dtype = FR_I32;
    m->seq = context;
    return m;
}

int fr_model_context(const fr_model *m) { return m->in_dtype == FR_I32 ? (int)m->in.d[0] : 0; }
int fr_model_seq(const fr_model *m) { return m->in_dtype == FR_I32 ? m->seq : 0; }

fr_status fr_model_set_seq(fr_model *m, int seq) {
    if (m->in_dtype != FR_I32)
        return fr_fail(m->ctx, FR_ERR_ARG, "--seq applies to token models (input tokens N)");
    if (seq <= 0 || seq > m->in.d[0])
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "--seq %d is outside [1, %lld]: the model's context is %lld positions", seq,
                       (long long)m->in.d[0], (long long)m->in.d[0]);
    m->seq = seq;
    return FR_OK;
}

fr_val fr_model_last_value(const fr_model *m) { return m->cur_val; }

static int in_old(const fr_model *m, const void *p);

void fr_model_free(fr_model *m) {
    if (!m) return;
    fr_ctx *ctx = m->ctx;
    const fr_backend *be = fr_backend_of(ctx);
    for (size_t i = 0; i < m->n_params; i++) /* a shard's whole values, made on their own */
        if (!in_old(m, m->params[i].data)) fr_free(ctx, m->params[i].data);
    be->release(ctx, m->dblock); /* a device's copy (NULL on the CPU) */
    fr_free(ctx, m->pblock);
    if (m->optim_free) m->optim_free(m); /* gradients and optimizer state */
    fr_free(ctx, m->params);
    fr_free(ctx, m->layers);
    fr_free(ctx, m->alias);
    fr_free(ctx, m);
}

/* The state_dict prefix of the next layer at the current nesting. */
static void next_name(fr_model *m, char *out) {
    if (m->depth == 0) {
        snprintf(out, FR_ST_NAME_MAX, "%d", m->top_index++);
        return;
    }
    int d = m->depth - 1, sc = m->res_in_shortcut[d];
    snprintf(out, FR_ST_NAME_MAX, "%.100s.%s.%d", m->layers[m->res_layer[d]].name,
             sc ? "shortcut" : "body", m->res_index[d][sc]++);
}

/* Tensors past 2^31 elements (per sample for activations) are refused: no
 * model here needs them, and it keeps every size product far from overflow. */
#define FR_MAX_NUMEL ((int64_t)1 << 31)

static int64_t checked_numel(const fr_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        if (s->d[i] < 0 || __builtin_mul_overflow(n, s->d[i], &n) || n > FR_MAX_NUMEL) return -1;
    return n;
}

int fr_model_name_width(const fr_model *m, int min) {
    for (size_t i = 0; i < m->n_layers; i++)
        if ((int)strlen(m->layers[i].name) > min) min = (int)strlen(m->layers[i].name);
    return min;
}

fr_shape fr_model_value_shape(const fr_model *m, int v) {
    return v >= 0 && (size_t)v < m->n_layers ? m->layers[v].out_shape : m->in;
}

/* Is v a value of m: the input or a layer's output? */
static int valid_value(const fr_model *m, int v) {
    if (v == FR_MODEL_INPUT) return 1;
    if (v < 0 || (size_t)v >= m->n_layers) return 0;
    fr_layer_kind k = m->layers[v].kind;
    return k != FR_L_RES_BEGIN && k != FR_L_RES_SHORTCUT;
}

/* The graph-level calls: check value x, make it the current value (what
 * the sequential call then applies its layer to), run that call. */
static int use_value(fr_model *m, int x, const char *what) {
    if (!valid_value(m, x)) {
        m->status = fr_fail(m->ctx, FR_ERR_ARG, "%s: %d is not a value of this model", what, x);
        return 0;
    }
    if (m->depth && x != m->cur_val) { /* inside a block only the sequential flow */
        m->status = fr_fail(m->ctx, FR_ERR_ARG,
                            "%s: inside a residual block a layer reads the value made last", what);
        return 0;
    }
    m->cur = fr_model_value_shape(m, x);
    m->cur_val = x;
    return 1;
}

static fr_val made(fr_model *m, fr_status st) { return st ? FR_NO_VAL : m->cur_val; }

static fr_layer *add_layer(fr_model *m, fr_layer_kind kind, fr_shape out) {
    char b[64];
    m->status = FR_ERR_SHAPE;
    if (checked_numel(&out) < 0) {
        fr_fail(m->ctx, FR_ERR_SHAPE, "%s: output %s per sample is too large (over 2^31 values)",
                layer_names[kind], fr_shape_str(&out, b, sizeof b));
        return NULL;
    }
    m->status = FR_ERR_NOMEM;
    if (fr_grow(m->ctx, (void **)&m->layers, &m->cap_layers, m->n_layers + 1, sizeof(fr_layer),
                FR_MEM_OTHER))
        return NULL;
    fr_layer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->in = m->cur;
    l->out_shape = out;
    l->first_param = (int)m->n_params;
    l->src[0] = m->cur_val;
    l->src[1] = l->src[2] = FR_NO_VAL;
    l->wparam = l->bparam = -1;
    if (kind != FR_L_RES_SHORTCUT && kind != FR_L_RES_END) {
        next_name(m, l->name);
        for (size_t i = 0; i + 1 < m->n_layers; i++)
            if (strcmp(m->layers[i].name, l->name) == 0) {
                m->n_layers--;
                m->status = fr_fail(m->ctx, FR_ERR_ARG,
                                    "layer name '%s' is already taken by an earlier name=: "
                                    "choose names that are not positions",
                                    l->name);
                return NULL;
            }
    }
    /* Units, what checkpointing keeps or recomputes as a whole: a layer with
     * weights (linear, conv2d) or a residual block starts one, and the
     * parameter-free or per-channel layers after it (BatchNorm, activations,
     * pooling, dropout, flatten) join it, the way one writes blocks in
     * PyTorch (nn.Sequential(conv, bn, relu)). A residual block's inner
     * layers and markers belong to the block's unit. index is the top-level
     * nn.Sequential position (what --freeze numbers name). */
    if (kind == FR_L_RES_SHORTCUT) {
        l->unit = m->layers[m->res_layer[m->depth - 1]].unit;
        l->index = m->layers[m->res_layer[m->depth - 1]].index;
    } else if (kind == FR_L_RES_END) {
        l->unit = m->layers[m->res_layer[m->depth]].unit;
        l->index = m->layers[m->res_layer[m->depth]].index;
    } else if (m->depth > 0) {
        l->unit = m->layers[m->res_layer[0]].unit;
        l->index = m->layers[m->res_layer[0]].index;
    } else if (m->block) {
        l->unit = m->block_unit;
        l->index = m->block_index;
    } else {
        int starts = kind == FR_L_LINEAR || kind == FR_L_CONV2D || kind == FR_L_RES_BEGIN ||
                     kind == FR_L_EMBEDDING;
        l->unit = (starts || m->n_units == 0) ? m->n_units++ : m->n_units - 1;
        l->index = m->top_index - 1;
    }
    m->cur = out;
    if (kind != FR_L_RES_BEGIN && kind != FR_L_RES_SHORTCUT) m->cur_val = (int)(m->n_layers - 1);
    return l;
}

static fr_status add_param(fr_model *m, fr_layer *l, const char *suffix, fr_shape shape,
                           fr_param_role role, int64_t fan_in) {
    char b[64];
    if (checked_numel(&shape) < 0)
        return fr_fail(m->ctx, FR_ERR_SHAPE, "%s.%s: %s is too large (over 2^31 values)", l->name,
                       suffix, fr_shape_str(&shape, b, sizeof b));
    if (fr_grow(m->ctx, (void **)&m->params, &m->cap_params, m->n_params + 1, sizeof(fr_param),
                FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    fr_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%.120s.%s", l->name, suffix);
    p->shape = shape;
    p->dtype = role == FR_P_NUM_BATCHES ? FR_I64 : FR_F32;
    p->role = role;
    p->trainable = role == FR_P_WEIGHT || role == FR_P_BIAS;
    p->layer = (int)(l - m->layers);
    p->fan_in = fan_in;
    l->n_params++;
    return FR_OK;
}

static char *shape_str(const fr_shape *s, char *buf) { return (char *)fr_shape_str(s, buf, 64); }

static fr_status need_image(fr_model *m, const char *what) {
    char b[64];
    if (m->cur.ndim == 3) return FR_OK;
    return fr_fail(m->ctx, FR_ERR_SHAPE, "%s needs an image input (C, H, W), got %s", what,
                   shape_str(&m->cur, b));
}

fr_status fr_model_linear(fr_model *m, int out, int bias) {
    char b[64];
    if (out <= 0) return fr_fail(m->ctx, FR_ERR_ARG, "linear: out_features must be positive");
    if (m->cur.ndim != 1 && !(m->cur.ndim == 2 && m->in_dtype == FR_I32))
        return fr_fail(m->ctx, FR_ERR_SHAPE,
                       "linear needs a flat input: add flatten before it (input is %s)",
                       shape_str(&m->cur, b));
    /* over the last dimension: (K) -> (O), (T, K) -> (T, O) */
    int64_t in = m->cur.d[m->cur.ndim - 1];
    fr_shape os = m->cur;
    os.d[os.ndim - 1] = out;
    fr_layer *l = add_layer(m, FR_L_LINEAR, os);
    if (!l) return m->status;
    l->out = out;
    l->bias = bias;
    l->wparam = l->first_param;
    l->bparam = bias ? l->first_param + 1 : -1;
    fr_status st;
    if ((st = add_param(m, l, "weight", fr_shape2(out, in), FR_P_WEIGHT, in))) return st;
    if (bias && (st = add_param(m, l, "bias", fr_shape1(out), FR_P_BIAS, in))) return st;
    return FR_OK;
}

fr_status fr_model_conv2d(fr_model *m, int oc, int k, int stride, int pad, int bias) {
    char b[64];
    if (oc <= 0 || k <= 0 || stride <= 0 || pad < 0)
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "conv2d: channels, kernel and stride must be positive, padding >= 0");
    if (need_image(m, "conv2d")) return FR_ERR_SHAPE;
    int64_t c = m->cur.d[0], h = m->cur.d[1], w = m->cur.d[2];
    if (h + 2 * pad < k || w + 2 * pad < k)
        return fr_fail(m->ctx, FR_ERR_SHAPE, "conv2d: kernel %d is larger than the input %s", k,
                       shape_str(&m->cur, b));
    fr_layer *l =
        add_layer(m, FR_L_CONV2D,
                  fr_shape3(oc, (h + 2 * pad - k) / stride + 1, (w + 2 * pad - k) / stride + 1));
    if (!l) return m->status;
    l->out = oc;
    l->kernel = k;
    l->stride = stride;
    l->pad = pad;
    l->bias = bias;
    l->wparam = l->first_param;
    l->bparam = bias ? l->first_param + 1 : -1;
    fr_shape ws = fr_shape4(oc, c, k, k);
    int64_t fan_in = checked_numel(&ws) < 0 ? 1 : c * k * k;
    fr_status st;
    if ((st = add_param(m, l, "weight", ws, FR_P_WEIGHT, fan_in))) return st;
    if (bias && (st = add_param(m, l, "bias", fr_shape1(oc), FR_P_BIAS, fan_in))) return st;
    return FR_OK;
}

static fr_status pool(fr_model *m, fr_layer_kind kind, int k, int stride) {
    char b[64];
    if (stride <= 0) stride = k;
    if (k <= 0)
        return fr_fail(m->ctx, FR_ERR_ARG, "%s: kernel must be positive", layer_names[kind]);
    if (need_image(m, layer_names[kind])) return FR_ERR_SHAPE;
    int64_t c = m->cur.d[0], h = m->cur.d[1], w = m->cur.d[2];
    if (h < k || w < k)
        return fr_fail(m->ctx, FR_ERR_SHAPE, "%s: window %d is larger than the input %s",
                       layer_names[kind], k, shape_str(&m->cur, b));
    fr_layer *l = add_layer(m, kind, fr_shape3(c, (h - k) / stride + 1, (w - k) / stride + 1));
    if (!l) return m->status;
    l->kernel = k;
    l->stride = stride;
    return FR_OK;
}

fr_status fr_model_maxpool2d(fr_model *m, int k, int stride) {
    return pool(m, FR_L_MAXPOOL2D, k, stride);
}
fr_status fr_model_avgpool2d(fr_model *m, int k, int stride) {
    return pool(m, FR_L_AVGPOOL2D, k, stride);
}

fr_status fr_model_global_avgpool(fr_model *m) {
    if (need_image(m, "global_avgpool")) return FR_ERR_SHAPE;
    return add_layer(m, FR_L_GLOBAL_AVGPOOL, fr_shape1(m->cur.d[0])) ? FR_OK : m->status;
}

static fr_status same(fr_model *m, fr_layer_kind kind) {
    return add_layer(m, kind, m->cur) ? FR_OK : m->status;
}
fr_status fr_model_relu(fr_model *m) { return same(m, FR_L_RELU); }
fr_status fr_model_gelu(fr_model *m) { return same(m, FR_L_GELU); }
fr_status fr_model_sigmoid(fr_model *m) { return same(m, FR_L_SIGMOID); }
fr_status fr_model_tanh(fr_model *m) { return same(m, FR_L_TANH); }

fr_status fr_model_flatten(fr_model *m) {
    return add_layer(m, FR_L_FLATTEN, fr_shape1(fr_shape_numel(&m->cur))) ? FR_OK : m->status;
}

fr_status fr_model_dropout(fr_model *m, float p) {
    if (!(p >= 0.0f && p < 1.0f))
        return fr_fail(m->ctx, FR_ERR_ARG, "dropout: p must be in [0, 1), got %g", (double)p);
    fr_layer *l = add_layer(m, FR_L_DROPOUT, m->cur);
    if (!l) return m->status;
    l->p = p;
    return FR_OK;
}

fr_status fr_model_batchnorm(fr_model *m) {
    int64_t c = m->cur.d[0];
    fr_layer *l = add_layer(m, FR_L_BATCHNORM, m->cur);
    if (!l) return m->status;
    if (add_param(m, l, "weight", fr_shape1(c), FR_P_WEIGHT, 0) ||
        add_param(m, l, "bias", fr_shape1(c), FR_P_BIAS, 0) ||
        add_param(m, l, "running_mean", fr_shape1(c), FR_P_RUNNING_MEAN, 0) ||
        add_param(m, l, "running_var", fr_shape1(c), FR_P_RUNNING_VAR, 0) ||
        add_param(m, l, "num_batches_tracked", (fr_shape){0, {0}}, FR_P_NUM_BATCHES, 0))
        return FR_ERR_NOMEM;
    return FR_OK;
}

/* LayerNorm over the trailing shape `s` of the current value (its
 * weight's and bias's shape). */
static fr_status layernorm(fr_model *m, fr_shape s) {
    fr_layer *l = add_layer(m, FR_L_LAYERNORM, m->cur);
    if (!l) return m->status;
    if (add_param(m, l, "weight", s, FR_P_WEIGHT, 0) || add_param(m, l, "bias", s, FR_P_BIAS, 0))
        return FR_ERR_NOMEM;
    return FR_OK;
}

fr_status fr_model_layernorm(fr_model *m) { return layernorm(m, m->cur); }

fr_val fr_layernorm(fr_model *m, fr_val x, int dim) {
    char b[64];
    if (!use_value(m, x, "layernorm")) return FR_NO_VAL;
    if (dim <= 0 || m->cur.d[m->cur.ndim - 1] != dim) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "layernorm %d: the last dimension of the input %s is not %d", dim,
                            shape_str(&m->cur, b), dim);
        return FR_NO_VAL;
    }
    return made(m, layernorm(m, fr_shape1(dim)));
}

fr_val fr_linear(fr_model *m, fr_val x, int out, int bias) {
    return use_value(m, x, "linear") ? made(m, fr_model_linear(m, out, bias)) : FR_NO_VAL;
}

fr_val fr_relu(fr_model *m, fr_val x) {
    return use_value(m, x, "relu") ? made(m, fr_model_relu(m)) : FR_NO_VAL;
}

fr_val fr_gelu(fr_model *m, fr_val x, int tanh_approx) {
    if (!use_value(m, x, "gelu")) return FR_NO_VAL;
    fr_layer *l = add_layer(m, FR_L_GELU, m->cur);
    if (!l) return FR_NO_VAL;
    l->approx = tanh_approx != 0;
    return m->cur_val;
}

fr_val fr_add(fr_model *m, fr_val a, fr_val b) {
    char sa[64], sb[64];
    if (!use_value(m, b, "add") || !use_value(m, a, "add")) return FR_NO_VAL;
    fr_shape s = fr_model_value_shape(m, b);
    if (!fr_shape_eq(&m->cur, &s)) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE, "add: the shapes %s and %s differ",
                            shape_str(&m->cur, sa), shape_str(&s, sb));
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_ADD, m->cur);
    if (!l) return FR_NO_VAL;
    l->src[1] = b;
    return m->cur_val;
}

fr_val fr_embedding(fr_model *m, fr_val tokens, int vocab, int dim) {
    char b[64];
    if (!use_value(m, tokens, "embedding")) return FR_NO_VAL;
    if (vocab <= 0 || dim <= 0) {
        m->status = fr_fail(m->ctx, FR_ERR_ARG, "embedding: vocabulary and dim must be positive");
        return FR_NO_VAL;
    }
    if (tokens != FR_MODEL_INPUT || m->in_dtype != FR_I32) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "embedding reads token ids: the model input must be 'input tokens N' "
                            "(it is %s)",
                            shape_str(&m->cur, b));
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_EMBEDDING, fr_shape2(m->cur.d[0], dim));
    if (!l) return FR_NO_VAL;
    l->out = dim;
    l->wparam = l->first_param;
    if ((m->status = add_param(m, l, "weight", fr_shape2(vocab, dim), FR_P_WEIGHT, 0)))
        return FR_NO_VAL;
    return m->cur_val;
}

fr_val fr_pos_embedding(fr_model *m, fr_val x, int positions) {
    char b[64];
    if (!use_value(m, x, "pos_embedding")) return FR_NO_VAL;
    if (m->cur.ndim != 2 || m->in_dtype != FR_I32 || positions < m->cur.d[0]) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "pos_embedding %d: needs a (positions, dim) input of at most %d "
                            "positions, got %s",
                            positions, positions, shape_str(&m->cur, b));
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_POS_EMBEDDING, m->cur);
    if (!l) return FR_NO_VAL;
    l->wparam = l->first_param;
    if ((m->status = add_param(m, l, "weight", fr_shape2(positions, m->cur.d[1]), FR_P_WEIGHT, 0)))
        return FR_NO_VAL;
    return m->cur_val;
}

fr_val fr_attention(fr_model *m, fr_val qkv, int heads) {
    return fr_attention_gqa(m, qkv, heads, 0);
}

fr_val fr_attention_gqa(fr_model *m, fr_val qkv, int heads, int kv_heads) {
    char b[64];
    if (!use_value(m, qkv, "attention")) return FR_NO_VAL;
    const int nkv = kv_heads > 0 ? kv_heads : heads;
    const int64_t w = m->cur.d[m->cur.ndim - 1], parts = (int64_t)heads + 2 * (int64_t)nkv;
    if (m->cur.ndim != 2 || heads <= 0 || kv_heads < 0 || heads % nkv != 0 || w % parts != 0) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "attention heads=%d kv_heads=%d: needs a (T, (heads + 2 kv_heads) "
                            "head_dim) input of q, k, v, kv_heads dividing heads, got %s",
                            heads, nkv, shape_str(&m->cur, b));
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_ATTENTION, fr_shape2(m->cur.d[0], w / parts * heads));
    if (!l) return FR_NO_VAL;
    l->heads = heads;
    l->kv_heads = kv_heads == heads ? 0 : kv_heads;
    return m->cur_val;
}

fr_val fr_rmsnorm(fr_model *m, fr_val x, int dim, float eps) {
    char b[64];
    if (!use_value(m, x, "rmsnorm")) return FR_NO_VAL;
    if (dim <= 0 || m->cur.d[m->cur.ndim - 1] != dim || !(eps > 0.0f && eps < 1.0f)) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "rmsnorm %d eps=%g: the last dimension of the input %s must be %d "
                            "and eps in (0, 1)",
                            dim, (double)eps, shape_str(&m->cur, b), dim);
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_RMSNORM, m->cur);
    if (!l) return FR_NO_VAL;
    l->eps = eps;
    l->wparam = l->first_param;
    if ((m->status = add_param(m, l, "weight", fr_shape1(dim), FR_P_WEIGHT, 0))) return FR_NO_VAL;
    return m->cur_val;
}

fr_val fr_swiglu(fr_model *m, fr_val gate, fr_val up) {
    char sa[64], sb[64];
    if (!use_value(m, up, "swiglu") || !use_value(m, gate, "swiglu")) return FR_NO_VAL;
    fr_shape s = fr_model_value_shape(m, up);
    if (!fr_shape_eq(&m->cur, &s)) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE, "swiglu: gate %s and up %s differ",
                            shape_str(&m->cur, sa), shape_str(&s, sb));
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_SWIGLU, m->cur);
    if (!l) return FR_NO_VAL;
    l->src[1] = up;
    return m->cur_val;
}

fr_val fr_rope_qkv(fr_model *m, fr_val q, fr_val k, fr_val v, int heads, int kv_heads,
                   const fr_rope *rope) {
    char sq[64], sk[64], sv[64];
    if (!use_value(m, v, "rope_qkv") || !use_value(m, k, "rope_qkv") ||
        !use_value(m, q, "rope_qkv"))
        return FR_NO_VAL;
    const fr_shape qs = fr_model_value_shape(m, q), ks = fr_model_value_shape(m, k),
                   vs = fr_model_value_shape(m, v);
    const int nkv = kv_heads > 0 ? kv_heads : heads;
    const int64_t hd = heads > 0 && qs.ndim == 2 ? qs.d[1] / heads : 0;
    if (qs.ndim != 2 || heads <= 0 || kv_heads < 0 || heads % nkv || hd <= 0 || hd % 2 ||
        qs.d[1] != hd * heads || !fr_shape_eq(&ks, &vs) || ks.ndim != 2 || ks.d[0] != qs.d[0] ||
        ks.d[1] != hd * nkv) {
        m->status = fr_fail(m->ctx, FR_ERR_SHAPE,
                            "rope_qkv heads=%d kv_heads=%d: needs q (T, heads x head_dim), k and "
                            "v (T, kv_heads x head_dim), head_dim even, kv_heads dividing heads; "
                            "got q %s, k %s, v %s",
                            heads, nkv, shape_str(&qs, sq), shape_str(&ks, sk), shape_str(&vs, sv));
        return FR_NO_VAL;
    }
    if (!rope || !(rope->theta > 0.0f) || rope->type < FR_ROPE_DEFAULT ||
        rope->type > FR_ROPE_LLAMA3 || (rope->type != FR_ROPE_DEFAULT && !(rope->factor > 0.0f))) {
        m->status = fr_fail(m->ctx, FR_ERR_ARG,
                            "rope_qkv: theta must be positive, the scaling default, linear or "
                            "llama3 with a positive factor");
        return FR_NO_VAL;
    }
    fr_layer *l = add_layer(m, FR_L_ROPE_QKV, fr_shape2(qs.d[0], hd * (heads + 2 * nkv)));
    if (!l) return FR_NO_VAL;
    l->src[1] = k;
    l->src[2] = v;
    l->heads = heads;
    l->kv_heads = nkv == heads ? 0 : nkv;
    l->rope = *rope;
    l->rope.pos_from_step = 0;
    return m->cur_val;
}

fr_status fr_model_init_std_last(fr_model *m, float std) {
    if (m->n_layers == 0) return fr_fail(m->ctx, FR_ERR_ARG, "std= before any layer");
    fr_layer *l = &m->layers[m->n_layers - 1];
    if (!(std > 0.0f && std < 1e3f))
        return fr_fail(m->ctx, FR_ERR_ARG, "std=%g: must be positive", (double)std);
    if (l->wparam < 0 || l->kind == FR_L_LAYERNORM || l->kind == FR_L_RMSNORM)
        return fr_fail(m->ctx, FR_ERR_ARG, "std= applies to layers with a weight matrix (%s)",
                       layer_names[l->kind]);
    l->std = std;
    return FR_OK;
}

fr_status fr_model_tie_last(fr_model *m, const char *to) {
    char a[64], b[64], want[FR_ST_NAME_MAX];
    if (m->n_layers == 0) return fr_fail(m->ctx, FR_ERR_ARG, "tie= before any layer");
    fr_layer *l = &m->layers[m->n_layers - 1];
    if (l->kind != FR_L_LINEAR || l->wparam != l->first_param)
        return fr_fail(m->ctx, FR_ERR_ARG, "tie= applies to a linear layer with its own weight");
    snprintf(want, sizeof want, "%.120s.weight", to);
    int t = -1;
    for (size_t i = 0; i < m->n_params && t < 0; i++)
        if (strcmp(m->params[i].name, to) == 0 || strcmp(m->params[i].name, want) == 0) t = (int)i;
    if (t < 0 || t == l->wparam || !m->params[t].trainable)
        return fr_fail(m->ctx, FR_ERR_ARG, "tie=%s: no earlier parameter of that name", to);
    fr_param *w = &m->params[l->wparam];
    if (!fr_shape_eq(&w->shape, &m->params[t].shape))
        return fr_fail(m->ctx, FR_ERR_SHAPE, "tie=%s: %s is %s but this layer's weight is %s", to,
                       m->params[t].name, shape_str(&m->params[t].shape, a),
                       shape_str(&w->shape, b));
    if (fr_grow(m->ctx, (void **)&m->alias, &m->cap_alias, m->n_alias + 1, sizeof(fr_alias),
                FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    fr_alias *al = &m->alias[m->n_alias++];
    memcpy(al->name, w->name, sizeof al->name);
    al->param = t;
    al->layer = (int)(m->n_layers - 1);
    /* the layer's own weight goes: its parameters are the last ones */
    size_t wi = (size_t)l->wparam;
    memmove(&m->params[wi], &m->params[wi + 1], (m->n_params - wi - 1) * sizeof *m->params);
    m->n_params--;
    l->n_params--;
    l->wparam = t;
    if (l->bias) l->bparam = (int)wi;
    return FR_OK;
}

fr_status fr_model_block_begin(fr_model *m) {
    if (m->block || m->depth)
        return fr_fail(m->ctx, FR_ERR_ARG, "a block cannot open inside a block or residual");
    m->block = 1;
    m->block_unit = m->n_units++;
    m->block_index = m->top_index;
    return FR_OK;
}

fr_status fr_model_block_end(fr_model *m) {
    if (!m->block) return fr_fail(m->ctx, FR_ERR_ARG, "block end without a block");
    if (m->depth) return fr_fail(m->ctx, FR_ERR_ARG, "a residual block is still open in the block");
    m->block = 0;
    return FR_OK;
}

fr_status fr_model_residual_begin(fr_model *m) {
    if (m->depth == FR_RES_MAX_DEPTH)
        return fr_fail(m->ctx, FR_ERR_ARG, "residual blocks nest at most %d deep",
                       FR_RES_MAX_DEPTH);
    fr_shape in = m->cur;
    fr_layer *l = add_layer(m, FR_L_RES_BEGIN, in);
    if (!l) return m->status;
    int d = m->depth++;
    m->res_layer[d] = (int)(l - m->layers);
    m->res_index[d][0] = m->res_index[d][1] = 0;
    m->res_in_shortcut[d] = 0;
    m->res_in[d] = in;
    m->res_in_val[d] = m->cur_val;
    return FR_OK;
}

fr_status fr_model_residual_shortcut(fr_model *m) {
    if (m->depth == 0) return fr_fail(m->ctx, FR_ERR_ARG, "shortcut outside a residual block");
    int d = m->depth - 1;
    if (m->res_in_shortcut[d])
        return fr_fail(m->ctx, FR_ERR_ARG, "a residual block has one shortcut");
    m->res_body_out[d] = m->cur;
    m->res_body_val[d] = m->cur_val;
    m->res_in_shortcut[d] = 1;
    m->cur = m->res_in[d];
    m->cur_val = m->res_in_val[d];
    return add_layer(m, FR_L_RES_SHORTCUT, m->cur) ? FR_OK : m->status;
}

fr_status fr_model_residual_end(fr_model *m) {
    char a[64], b[64];
    if (m->depth == 0) return fr_fail(m->ctx, FR_ERR_ARG, "end without a residual block");
    int d = m->depth - 1;
    fr_shape body = m->res_in_shortcut[d] ? m->res_body_out[d] : m->cur;
    fr_shape sc = m->res_in_shortcut[d] ? m->cur : m->res_in[d];
    if (!fr_shape_eq(&body, &sc))
        return fr_fail(m->ctx, FR_ERR_SHAPE,
                       "residual block: the body gives %s but the shortcut gives %s; add a "
                       "shortcut that matches (e.g. a 1x1 conv2d with the body's stride)",
                       shape_str(&body, a), shape_str(&sc, b));
    int bv = m->res_in_shortcut[d] ? m->res_body_val[d] : m->cur_val;
    int sv = m->res_in_shortcut[d] ? m->cur_val : m->res_in_val[d];
    m->cur = body;
    m->depth--;
    fr_layer *l = add_layer(m, FR_L_RES_END, body);
    if (!l) return m->status;
    l->src[0] = bv;
    l->src[1] = sv;
    return FR_OK;
}

fr_status fr_model_set_loss(fr_model *m, fr_loss loss) {
    if (loss != FR_LOSS_CROSS_ENTROPY && loss != FR_LOSS_MSE)
        return fr_fail(m->ctx, FR_ERR_ARG, "unknown loss %d", (int)loss);
    m->loss = loss;
    return FR_OK;
}

fr_status fr_model_name_last(fr_model *m, const char *name) {
    if (m->n_layers == 0) return fr_fail(m->ctx, FR_ERR_ARG, "name= before any layer");
    if (!name[0] || strlen(name) > 100 || strpbrk(name, "\"\\ \t"))
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "layer name '%s' must be 1-100 characters without quotes or spaces", name);
    fr_layer *l = &m->layers[m->n_layers - 1];
    if (l->kind == FR_L_RES_SHORTCUT || l->kind == FR_L_RES_END)
        return fr_fail(m->ctx, FR_ERR_ARG, "name= applies to layers, not to shortcut or end");
    for (size_t i = 0; i + 1 < m->n_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0)
            return fr_fail(m->ctx, FR_ERR_ARG, "layer name '%s' is already used", name);
    snprintf(l->name, sizeof l->name, "%s", name);
    for (int i = 0; i < l->n_params; i++) {
        fr_param *p = &m->params[l->first_param + i];
        const char *suffix = strrchr(p->name, '.');
        char tmp[FR_ST_NAME_MAX];
        snprintf(tmp, sizeof tmp, "%.100s%s", name, suffix);
        memcpy(p->name, tmp, sizeof tmp);
    }
    for (size_t i = 0; i < m->n_alias; i++)
        if (m->alias[i].layer == (int)(m->n_layers - 1))
            snprintf(m->alias[i].name, sizeof m->alias[i].name, "%.100s.weight", name);
    return FR_OK;
}

fr_status fr_model_checkpoint_last(fr_model *m) {
    if (m->n_layers == 0) return fr_fail(m->ctx, FR_ERR_ARG, "checkpoint before any layer");
    fr_layer *l = &m->layers[m->n_layers - 1];
    if (l->kind == FR_L_RES_SHORTCUT)
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "checkpoint applies to a layer or a whole residual block");
    if (m->depth > 0 && l->kind != FR_L_RES_END)
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "checkpoint inside a residual block: mark the whole block instead "
                       "(checkpoint=true on its residual line)");
    l->checkpoint = 1;
    return FR_OK;
}

/* Whether name is prefix, then a block number in [a, b], then "." or its
 * end: "transformer.h.0-3" names blocks 0 to 3 of the repeat transformer.h
 * (prefix "transformer.h.", the range as written after it). */
static int in_block_range(const char *name, const char *prefix, size_t plen, long a, long b) {
    if (strncmp(name, prefix, plen) != 0) return 0;
    const char *d = name + plen;
    if (*d < '0' || *d > '9' || (d[0] == '0' && d[1] >= '0' && d[1] <= '9')) return 0;
    long v = 0;
    for (; *d >= '0' && *d <= '9'; d++)
        if (v > b / 10 || (v = v * 10 + (*d - '0')) > b) return 0;
    return v >= a && (*d == 0 || *d == '.');
}

/* s is exactly "<digits>-<digits>": the range's ends in *a, *b. */
static int block_range(const char *s, long *a, long *b) {
    char *e;
    if (*s < '0' || *s > '9') return 0;
    *a = strtol(s, &e, 10);
    if (e[0] != '-' || e[1] < '0' || e[1] > '9') return 0;
    *b = strtol(e + 1, &e, 10);
    return *e == 0;
}

/* Does layer l match one item of a freeze list? Numbers and ranges ("3",
 * "0-2") name top-level nn.Sequential positions (a residual block is one);
 * a name ending in a range names those blocks of a repeat ("transformer.h.0-3":
 * transformer.h.0 to transformer.h.3); anything else is a state_dict prefix
 * ("fc1", "3.body.0", "transformer.h.1"). */
static int freeze_match(const fr_layer *l, const char *item, size_t len) {
    char buf[FR_ST_NAME_MAX];
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, item, len);
    buf[len] = 0;
    int a, b, k = 0;
    if (sscanf(buf, "%d-%d%n", &a, &b, &k) == 2 && (size_t)k == len)
        return l->index >= a && l->index <= b;
    if (sscanf(buf, "%d%n", &a, &k) == 1 && (size_t)k == len) return l->index == a;
    const char *dot = strrchr(buf, '.');
    long ra, rb;
    if (dot && block_range(dot + 1, &ra, &rb) &&
        in_block_range(l->name, buf, (size_t)(dot + 1 - buf), ra, rb))
        return 1;
    size_t n = strlen(buf);
    return strncmp(l->name, buf, n) == 0 && (l->name[n] == 0 || l->name[n] == '.');
}

fr_status fr_model_freeze(fr_model *m, const char *layers) {
    const char *p = layers;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int hit = 0;
        for (size_t i = 0; i < m->n_layers; i++)
            if (freeze_match(&m->layers[i], p, len)) {
                fr_layer *l = &m->layers[i];
                l->frozen = 1;
                for (int k = 0; k < l->n_params; k++) m->params[l->first_param + k].frozen = 1;
                hit += l->n_params > 0;
            }
        if (!hit)
            return fr_fail(m->ctx, FR_ERR_ARG,
                           "--freeze: no layer with parameters matches '%.*s' (layers are named "
                           "by index or name=, e.g. 0, 3-5, fc1, transformer.h.0-3)",
                           (int)len, p);
        p = e ? e + 1 : p + len;
    }
    return FR_OK;
}

size_t fr_model_num_params(const fr_model *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].trainable) n += (size_t)fr_param_numel(&m->params[i]);
    return n;
}

int64_t fr_param_numel(const fr_param *p) {
    return fr_shape_numel(p->quant ? &p->qshape : &p->shape);
}

fr_status fr_param_read_f32(fr_ctx *ctx, const fr_param *p, float *dst) {
    const size_t n = (size_t)fr_shape_numel(&p->shape);
    if (!p->data) return fr_fail(ctx, FR_ERR_ARG, "%s: no values on the host", p->name);
    if (p->quant) {
        fr_qweight w;
        fr_status st = fr_quant_view(ctx, (fr_qfmt)(p->quant - 1), p->qshape.d[0], p->qshape.d[1],
                                     p->data, &w);
        return st ? st : fr_dequantize_rows(ctx, &w, 0, w.O, dst);
    }
    if (p->dtype == FR_F32) memcpy(dst, p->data, n * sizeof *dst);
    else if (p->dtype == FR_F16) fr_f16_to_f32_n(p->data, dst, n);
    else if (p->dtype == FR_BF16) fr_bf16_to_f32_n(p->data, dst, n);
    else return fr_fail(ctx, FR_ERR_ARG, "%s is %s, not a float", p->name, fr_dtype_name(p->dtype));
    return FR_OK;
}

int fr_model_num_classes(const fr_model *m) {
    if (m->in_dtype == FR_I32) return (int)m->cur.d[m->cur.ndim - 1]; /* per position */
    return m->cur.ndim == 1 ? (int)m->cur.d[0] : (int)fr_shape_numel(&m->cur);
}

/* Whether param i holds its values in the parameter block (a ZeRO 3 shard's do not). */
static int in_block(const fr_model *m, size_t i) { return !fr_pshard_holds(m->shard, (int)i); }

static fr_dtype dtype_of(const fr_model *m, const fr_dtype *dt, size_t i) {
    return dt ? dt[i] : m->params[i].dtype;
}

/* The bytes param p takes stored as `to`, and their alignment: a quantized
 * weight's block (its scales are floats) at 16 bytes. */
static size_t stored_bytes(const fr_param *p, fr_dtype to, size_t *align) {
    if (p->quant && to == FR_U8) {
        *align = 16;
        return fr_quant_bytes((fr_qfmt)(p->quant - 1), p->qshape.d[0], p->qshape.d[1]);
    }
    *align = fr_dtype_size(to);
    return (size_t)fr_shape_numel(&p->shape) * *align;
}

size_t fr_model_block_bytes(const fr_model *m, const fr_dtype *dt) {
    size_t end = 0, align;
    for (size_t i = m->n_params; i-- > 0;) {
        if (!in_block(m, i)) continue;
        size_t b = stored_bytes(&m->params[i], dtype_of(m, dt, i), &align);
        fr_flat_place(&end, b, align);
    }
    return end;
}

static int in_old(const fr_model *m, const void *p) {
    const char *b = m->pblock;
    return b && p && (const char *)p >= b && (const char *)p < b + m->pblock_bytes;
}

fr_status fr_model_relayout(fr_model *m, const fr_dtype *dt) {
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        fr_dtype to = dtype_of(m, dt, i);
        if (in_block(m, i) && p->data && to != p->dtype &&
            (p->dtype != FR_F32 || fr_dtype_size(to) != 2))
            return fr_fail(m->ctx, FR_ERR_ARG,
                           "%s is %s: convert 16-bit weights back to fp32 first", p->name,
                           fr_dtype_name(p->dtype));
    }
    size_t bytes = fr_model_block_bytes(m, dt), end = 0;
    char *blk = bytes ? fr_calloc(m->ctx, bytes, FR_MEM_PARAMS) : NULL;
    if (bytes && !blk) return FR_ERR_NOMEM;
    for (size_t i = m->n_params; i-- > 0;) {
        fr_param *p = &m->params[i];
        if (!in_block(m, i)) { /* a shard's: the shard holds its values now */
            if (in_old(m, p->data)) p->data = NULL;
            continue;
        }
        fr_dtype to = dtype_of(m, dt, i);
        size_t n = (size_t)fr_shape_numel(&p->shape), align, b = stored_bytes(p, to, &align);
        size_t at = fr_flat_place(&end, b, align);
        if (p->data && to == p->dtype) {
            memcpy(blk + at, p->data, b);
        } else if (p->data && to == FR_F16) {
            fr_f32_to_f16_n(p->data, (uint16_t *)(blk + at), n);
        } else if (p->data) {
            fr_f32_to_bf16_n(p->data, (uint16_t *)(blk + at), n);
        }
        if (p->data && !in_old(m, p->data)) fr_free(m->ctx, p->data); /* made on its own */
        p->data = blk + at, p->off = at, p->dtype = to, p->ddata = NULL;
    }
    const fr_backend *be = fr_backend_of(m->ctx);
    be->release(m->ctx, m->dblock); /* a device's copy has the old layout */
    m->dblock = NULL;
    fr_free(m->ctx, m->pblock);
    m->pblock = blk, m->pblock_bytes = bytes;
    return FR_OK;
}

fr_status fr_model_to_dtype(fr_model *m, fr_dtype dt) {
    int converted = 0;
    fr_dtype *want = fr_alloc(m->ctx, (m->n_params + 1) * sizeof *want, FR_MEM_WORKSPACE);
    if (!want) return FR_ERR_NOMEM;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        want[i] = p->dtype;
        if (!p->trainable || p->dtype == dt || p->quant) continue;
        want[i] = dt, converted = 1;
        if (!m->pblock) p->dtype = dt; /* not allocated yet (planning): fr_model_init stores dt */
    }
    /* the block anew: trainable f32 values narrowed, the rest copied */
    fr_status st = converted && m->pblock ? fr_model_relayout(m, want) : FR_OK;
    fr_free(m->ctx, want);
    /* optimizer state follows the weights: made anew */
    if (!st && converted && m->optim_free) m->optim_free(m);
    return st;
}

/* Whether param w is read by another layer than its own (a tied head). */
static int shared(const fr_model *m, size_t w) {
    for (size_t i = 0; i < m->n_alias; i++)
        if (m->alias[i].param == (int)w) return 1;
    for (size_t i = 0; i < m->n_layers; i++)
        if ((m->layers[i].wparam == (int)w || m->layers[i].bparam == (int)w) &&
            (int)i != m->params[w].layer)
            return 1;
    return 0;
}

/* The weight layer li would store in fewer bits (-1: none): a frozen linear
 * layer's own weight that no other layer reads. */
static int base_weight(const fr_model *m, size_t li) {
    const fr_layer *l = &m->layers[li];
    if (l->kind != FR_L_LINEAR || l->wparam < 0 || !m->params[l->wparam].frozen) return -1;
    if (m->params[l->wparam].layer != (int)li || shared(m, (size_t)l->wparam)) return -1;
    return l->wparam;
}

int fr_model_quantizable(const fr_model *m) {
    int n = 0;
    for (size_t li = 0; li < m->n_layers; li++) n += base_weight(m, li) >= 0;
    return n;
}

fr_status fr_model_quantize_base(fr_model *m, fr_base_precision b) {
    static const fr_qfmt fmts[] = {
        [FR_BASE_BF16] = FR_QFMT_BF16, [FR_BASE_INT8] = FR_QFMT_INT8, [FR_BASE_NF4] = FR_QFMT_NF4};
    if (b == FR_BASE_AUTO) return FR_OK; /* the planner's to choose (planner.c) */
    if (b == FR_BASE_FP32) {
        for (size_t i = 0; i < m->n_params && !m->pblock; i++) { /* planning: widen back */
            fr_param *p = &m->params[i];
            if (!p->quant) continue;
            p->shape = p->qshape, p->dtype = FR_F32, p->quant = 0;
        }
        return FR_OK;
    }
    const char *bn = fr_base_precision_name(b);
    if ((unsigned)b > FR_BASE_NF4)
        return fr_fail(m->ctx, FR_ERR_ARG, "--base-precision %d: not a format", (int)b);
    if (m->shard)
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "--base-precision %s: not with --zero 3 (use --zero 2 or lower: a frozen "
                       "base has no gradient or state to shard)",
                       bn);
    const int q = 1 + (int)fmts[b];
    int n = 0, have = 0;
    for (size_t li = 0; li < m->n_layers; li++) {
        const int w = base_weight(m, li);
        if (w < 0) continue;
        const fr_param *p = &m->params[w];
        if (p->quant == q) {
            have++;
            continue;
        }
        if (p->quant && !m->pblock) { /* planning: another format, re-chosen */
            fr_param *pw = &m->params[w];
            pw->shape = pw->qshape, pw->dtype = FR_F32, pw->quant = 0;
        }
        if (p->quant || p->dtype != FR_F32)
            return fr_fail(m->ctx, FR_ERR_ARG,
                           "--base-precision %s: %s is stored in %s already: load the model "
                           "anew",
                           bn, p->name,
                           p->quant ? fr_qfmt_name((fr_qfmt)(p->quant - 1))
                                    : fr_dtype_name(p->dtype));
        n++;
    }
    if (!n && !have)
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "--base-precision %s: no frozen linear layer owns its weight (freeze "
                       "layers with --freeze, or train adapters with --lora; a tied head stays "
                       "as it is)",
                       bn);
    if (!n) return FR_OK;
    fr_qweight *qw = fr_calloc(m->ctx, (m->n_params + 1) * sizeof *qw, FR_MEM_WORKSPACE);
    if (!qw) return FR_ERR_NOMEM;
    fr_status st = FR_OK;
    for (size_t li = 0; li < m->n_layers && !st; li++) { /* quantized apart: all or nothing */
        const int w = base_weight(m, li);
        fr_param *p = w >= 0 ? &m->params[w] : NULL;
        if (!p || p->quant || !p->data) continue;
        st = fr_quantize(m->ctx, fmts[b], p->data, p->shape.d[0], p->shape.d[1], &qw[w]);
        if (st)
            fr_fail(m->ctx, st, "--base-precision %s: %s: %s", bn, p->name, fr_last_error(m->ctx));
    }
    for (size_t i = 0; i < m->n_params && st; i++) fr_quant_free(m->ctx, &qw[i]);
    for (size_t li = 0; li < m->n_layers && !st; li++) {
        const int w = base_weight(m, li);
        fr_param *p = w >= 0 ? &m->params[w] : NULL;
        if (!p || p->quant) continue;
        p->quant = q;
        p->qshape = p->shape;
        p->shape = fr_shape1((int64_t)fr_quant_bytes(fmts[b], p->shape.d[0], p->shape.d[1]));
        p->dtype = FR_U8;
        if (qw[w].block) p->data = qw[w].block; /* relayout moves it */
    }
    /* the block anew, the quantized weights copied in (and their own blocks freed) */
    if (!st && m->pblock) st = fr_model_relayout(m, NULL);
    fr_free(m->ctx, qw);
    return st;
}

fr_status fr_model_alloc_params(fr_model *m) {
    for (size_t i = 0; i < m->n_params; i++)
        if (in_block(m, i) && !in_old(m, m->params[i].data)) return fr_model_relayout(m, NULL);
    return FR_OK; /* every one is in the block already */
}

/* Store f32 values v[0..n) at element j0 of p's data in p's dtype (a 16-bit
 * weight, after fr_model_to_dtype on an unallocated model, is written
 * directly in 16 bits: the same rounding as converting an f32 copy). */
static void init_store(fr_param *p, int64_t j0, const float *v, size_t n) {
    if (p->dtype == FR_F32) memcpy((float *)p->data + j0, v, n * sizeof *v);
    else if (p->dtype == FR_F16) fr_f32_to_f16_n_seq(v, (uint16_t *)p->data + j0, n);
    else fr_f32_to_bf16_n_seq(v, (uint16_t *)p->data + j0, n);
}

/* A standard normal sample (Box-Muller on two uniforms, in double). */
static float normal_sample(fr_rng *r) {
    double u1 = ((double)(fr_rng_next(r) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(fr_rng_next(r) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* PyTorch: Linear/Conv weight kaiming_uniform_(a=sqrt(5)) gives
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound.
 * BatchNorm/LayerNorm: weight 1, bias 0, running_var 1. Values are made in
 * f32 chunks of 1024 and stored in each parameter's dtype. */
fr_status fr_model_init(fr_model *m, uint64_t seed) {
    if (m->depth)
        return fr_fail(m->ctx, FR_ERR_ARG, "a residual block is still open (missing end)");
    if (fr_model_alloc_params(m)) return FR_ERR_NOMEM;
    fr_status st = fr_model_init_params(m, seed, 0);
    if (!st) m->initialised = 1;
    return st;
}

/* LoRA's A takes the weights' uniform branch (kaiming_uniform_(a=sqrt(5))
 * with its fan_in), B is zeros (PEFT's init_lora_weights=True). */
fr_status fr_model_init_params(fr_model *m, uint64_t seed, size_t first) {
    float v[1024];
    for (size_t i = first; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        int64_t n = fr_shape_numel(&p->shape);
        const fr_layer *l = &m->layers[p->layer];
        int affine_norm =
            l->kind == FR_L_BATCHNORM || l->kind == FR_L_LAYERNORM || l->kind == FR_L_RMSNORM;
        if (p->role == FR_P_NUM_BATCHES) {
            *(int64_t *)p->data = 0;
            continue;
        }
        int constant = affine_norm || p->role == FR_P_RUNNING_MEAN || p->role == FR_P_RUNNING_VAR;
        float c = (p->role == FR_P_WEIGHT || p->role == FR_P_RUNNING_VAR) ? 1.0f : 0.0f;
        /* normal: nn.Embedding's N(0, 1), or N(0, std^2) where std= asks (biases then 0) */
        int embed = l->kind == FR_L_EMBEDDING || l->kind == FR_L_POS_EMBEDDING;
        float sd = l->std > 0.0f ? l->std : 1.0f;
        int normal = (embed || l->std > 0.0f) && p->role == FR_P_WEIGHT;
        if (l->std > 0.0f && p->role == FR_P_BIAS) constant = 1, c = 0.0f;
        if (p->role == FR_P_LORA_B) constant = 1, c = 0.0f;
        /* ZeRO 3: the whole tensor made in a scratch block, this rank's slice kept */
        int sharded = fr_pshard_holds(m->shard, (int)i);
        if (sharded) {
            fr_mem_set_tag(m->ctx, "initialising a weight shard");
            p->data = fr_alloc(m->ctx, (size_t)n * sizeof(float), FR_MEM_WORKSPACE);
            fr_mem_set_tag(m->ctx, NULL);
            if (!p->data) return FR_ERR_NOMEM;
        }
        /* a quantized weight: made whole in f32 scratch, then quantized in place */
        float *wide = NULL;
        if (p->quant) {
            n = fr_param_numel(p);
            fr_mem_set_tag(m->ctx, "initialising a quantized weight");
            wide = fr_alloc(m->ctx, (size_t)n * sizeof(float), FR_MEM_WORKSPACE);
            fr_mem_set_tag(m->ctx, NULL);
            if (!wide) return FR_ERR_NOMEM;
        }
        fr_rng r = fr_rng_make(seed, i);
        float bound = 1.0f / sqrtf((float)p->fan_in);
        for (int64_t j0 = 0; j0 < n; j0 += 1024) {
            size_t k = n - j0 < 1024 ? (size_t)(n - j0) : 1024;
            for (size_t j = 0; j < k; j++)
                v[j] = constant ? c
                       : normal ? sd * normal_sample(&r)
                                : (2.0f * fr_rng_next_uniform(&r) - 1.0f) * bound;
            if (wide) memcpy(wide + j0, v, k * sizeof *v);
            else init_store(p, j0, v, k);
        }
        if (wide) {
            fr_status st = fr_quantize_into(m->ctx, (fr_qfmt)(p->quant - 1), wide, p->qshape.d[0],
                                            p->qshape.d[1], p->data, NULL);
            fr_free(m->ctx, wide);
            if (st) return st;
        }
        if (sharded) {
            fr_pshard_keep(m->shard, (int)i, p->data);
            fr_free(m->ctx, p->data);
            p->data = NULL;
        }
    }
    return FR_OK;
}

void fr_model_describe(const fr_model *m, FILE *out) {
    char a[64], b[64];
    for (size_t i = 0; i < m->n_layers; i++) {
        const fr_layer *l = &m->layers[i];
        fprintf(out, "  %-14s %-12s %-18s -> %s\n", l->name, layer_names[l->kind],
                shape_str(&l->in, a), shape_str(&l->out_shape, b));
    }
}

/* ---- the forward graph ---- */

static fr_shape batched(int n, fr_shape s) {
    fr_shape b = {s.ndim + 1, {n, 0, 0, 0}};
    for (int i = 0; i < s.ndim; i++) b.d[i + 1] = s.d[i];
    return b;
}

/* A chunk's value v as layer li reads it: its last row once li is past the
 * last attention layer (fr_chunk_graph), one LAST_ROW per value, made at its
 * first such reader and listed in cut (pairs: value, its row). */
static int chunk_src(fr_graph *g, int v, int past, int *cut, int *n_cut) {
    if (!past || v < 0 || g->vals[v].shape.ndim < 2 || g->vals[v].shape.d[1] == 1) return v;
    for (int i = 0; i < *n_cut; i++)
        if (cut[2 * i] == v) return cut[2 * i + 1];
    int row;
    if (fr_graph_node(g, FR_OP_LAST_ROW, &v, 1, &(fr_attr){0}, -1, 0, &row) < 0) return -1;
    cut[2 * *n_cut] = v, cut[2 * *n_cut + 1] = row;
    ++*n_cut;
    return row;
}

int fr_model_fusable_head(const fr_model *m, int64_t *V, int64_t *C) {
    if (!m->n_layers || m->loss != FR_LOSS_CROSS_ENTROPY) return 0;
    const fr_layer *l = &m->layers[m->n_layers - 1];
    /* a head with adapters adds their product to its output, a quantized one
     * runs QLINEAR: neither is one GEMM LINEAR_CE can make again */
    if (l->kind != FR_L_LINEAR || l->wparam < 0 || l->lora || m->params[l->wparam].quant) return 0;
    const fr_shape *w = &m->params[l->wparam].shape;
    if (w->ndim != 2) return 0;
    if (V) *V = w->d[0];
    if (C) *C = w->d[1];
    return 1;
}

int fr_model_head_rows_auto(int64_t N, int64_t C, int64_t V) {
    if (N < 1) return 1;
    int64_t inc = C > 0 ? (V + C - 1) / C : 1, want = (N + inc - 1) / (inc > 0 ? inc : 1), r = 1;
    while (r < want) r *= 2;
    return (int)(r < N ? r : N);
}

static fr_status build_graph(fr_model *m, fr_graph *g, int n, int training, int head_rows, int *pv,
                             const fr_chunk_graph *ch) {
    fr_ctx *ctx = m->ctx;
    if (m->depth) return fr_fail(ctx, FR_ERR_ARG, "a residual block is still open (missing end)");
    if (m->block) return fr_fail(ctx, FR_ERR_ARG, "a block is still open (missing end)");
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        pv[i] = fr_graph_value(g, p->trainable ? FR_VAL_PARAM : FR_VAL_BUFFER, p->dtype, p->shape);
        if (pv[i] < 0) return FR_ERR_NOMEM;
        g->vals[pv[i]].param = (int)i;
    }
    int tokens = m->in_dtype == FR_I32;
    fr_shape in_shape = ch       ? fr_shape2(1, ch->P)
                        : tokens ? fr_shape2(n, m->seq)
                                 : batched(n, m->in);
    int x = fr_graph_value(g, FR_VAL_INPUT, m->in_dtype, in_shape);
    if (x < 0) return FR_ERR_NOMEM;
    g->vals[x].batched = 1;
    g->input = x;
    /* val[i]: the graph value of layer i's output (markers pass theirs on);
     * a chunk's cut: the values read past its last attention layer, and their last rows */
    int *val = fr_alloc(ctx, 3 * (m->n_layers + 1) * sizeof *val, FR_MEM_OTHER);
    if (!val) return FR_ERR_NOMEM;
    int *cut = val + m->n_layers + 1, n_cut = 0, last_attn = -1;
    for (size_t li = 0; ch && li < m->n_layers; li++) {
        ch->kv[li] = ch->pos_rows[li] = -1;
        if (m->layers[li].kind == FR_L_ATTENTION) last_attn = (int)li;
    }
#define RAW(l, k) ((l)->src[k] == FR_MODEL_INPUT ? x : val[(l)->src[k]])
#define SRC(l, k) (ch ? chunk_src(g, RAW(l, k), (int)li > last_attn, cut, &n_cut) : RAW(l, k))
    uint32_t salt = 1;
    fr_status st = FR_OK;
    /* the head fused with its loss: its layer emits nothing here, LINEAR_CE
     * takes its input where the loss is made below */
    const int fuse = head_rows != 0 && !ch && fr_model_fusable_head(m, NULL, NULL);
    for (size_t li = 0; li < m->n_layers && !st; li++) {
        const fr_layer *l = &m->layers[li];
        if (fuse && li + 1 == m->n_layers) {
            val[li] = SRC(l, 0);
            break;
        }
        const int *P = &pv[l->first_param];
        fr_attr a = {0};
        a.kernel = l->kernel;
        a.stride = l->stride;
        a.pad = l->pad;
        a.training = training;
        int in[5], out[FR_MAX_OUT], node = -2, src = SRC(l, 0);
        val[li] = src;
        if (src < 0 && l->src[0] != FR_NO_VAL) { /* a chunk's LAST_ROW refused */
            st = g->status;
            break;
        }
        switch (l->kind) {
        case FR_L_LINEAR:
        case FR_L_CONV2D:
            in[0] = src, in[1] = pv[l->wparam], in[2] = l->bparam >= 0 ? pv[l->bparam] : -1;
            if (l->kind == FR_L_LINEAR && m->params[l->wparam].quant) { /* a quantized base */
                a.shape = m->params[l->wparam].qshape;
                a.qfmt = m->params[l->wparam].quant - 1;
                node = fr_graph_node(g, FR_OP_QLINEAR, in, 3, &a, -1, 0, out);
            } else {
                node = fr_graph_node(g, l->kind == FR_L_LINEAR ? FR_OP_LINEAR : FR_OP_CONV2D, in, 3,
                                     &a, -1, 0, out);
            }
            if (node >= 0 && l->lora) /* + the adapters' product (lora.c) */
                node = fr_lora_emit(g, l, (int)li, src, node, pv, training && !ch, out);
            break;
        case FR_L_MAXPOOL2D:
        case FR_L_AVGPOOL2D:
        case FR_L_GLOBAL_AVGPOOL:
        case FR_L_RELU:
        case FR_L_GELU:
        case FR_L_SIGMOID:
        case FR_L_TANH: {
            static const fr_op ops[FR_L_COUNT] = {[FR_L_MAXPOOL2D] = FR_OP_MAXPOOL2D,
                                                  [FR_L_AVGPOOL2D] = FR_OP_AVGPOOL2D,
                                                  [FR_L_GLOBAL_AVGPOOL] = FR_OP_GLOBAL_AVGPOOL,
                                                  [FR_L_RELU] = FR_OP_RELU,
                                                  [FR_L_GELU] = FR_OP_GELU,
                                                  [FR_L_SIGMOID] = FR_OP_SIGMOID,
                                                  [FR_L_TANH] = FR_OP_TANH};
            a.approx = l->approx;
            node = fr_graph_node(g, ops[l->kind], &src, 1, &a, -1, 0, out);
            break;
        }
        case FR_L_BATCHNORM:
            a.eps = 1e-5f;
            a.momentum = 0.1f;
            in[0] = src, in[1] = P[0], in[2] = P[1], in[3] = P[2], in[4] = P[3];
            node = fr_graph_node(g, FR_OP_BATCHNORM, in, 5, &a, -1, training ? 0 : 6u, out);
            break;
        case FR_L_LAYERNORM:
            a.eps = l->eps > 0.0f ? l->eps : 1e-5f;
            in[0] = src, in[1] = P[0], in[2] = P[1];
            node = fr_graph_node(g, FR_OP_LAYERNORM, in, 3, &a, -1, 0, out);
            break;
        case FR_L_DROPOUT:
            if (ch) break; /* generation: eval dropout passes its input on */
            a.p = l->p;
            a.salt = salt++;
            node = fr_graph_node(g, FR_OP_DROPOUT, &src, 1, &a, -1, training ? 0 : 2u, out);
            break;
        case FR_L_FLATTEN:
            a.shape = batched(n, l->out_shape);
            node = fr_graph_node(g, FR_OP_VIEW, &src, 1, &a, -1, 0, out);
            break;
        case FR_L_EMBEDDING:
            in[0] = src, in[1] = pv[l->wparam];
            node = fr_graph_node(g, FR_OP_EMBEDDING, in, 2, &a, -1, 0, out);
            break;
        case FR_L_POS_EMBEDDING:
            in[0] = src, in[1] = pv[l->wparam];
            if (ch) { /* the table's rows at the chunk's positions, bound when it runs */
                const fr_shape *xs = &g->vals[src].shape, *ws = &m->params[l->wparam].shape;
                in[1] = ch->pos_rows[li] = fr_graph_value(
                    g, FR_VAL_PARAM, FR_F32, fr_shape2(xs->ndim == 3 ? xs->d[1] : 0, ws->d[1]));
                if (in[1] < 0) {
                    st = FR_ERR_NOMEM;
                    break;
                }
                g->vals[in[1]].param = l->wparam;
            }
            node = fr_graph_node(g, FR_OP_POS_EMBEDDING, in, 2, &a, -1, 0, out);
            break;
        case FR_L_ATTENTION:
            a.heads = l->heads;
            a.kv_heads = l->kv_heads;
            a.causal = 1;
            if (ch) { /* over the caches: K and V (1, NKV, context, HS), the grouped heads */
                const fr_shape *xs = &g->vals[src].shape;
                const int64_t nh = l->heads > 0 ? l->heads : 1,
                              nkv = l->kv_heads > 0 ? l->kv_heads : nh;
                const int64_t HS = xs->ndim == 3 ? xs->d[2] / (nh + 2 * nkv) : 0;
                fr_shape cs = fr_shape4(1, nkv, ch->Tc > 0 ? ch->Tc : m->in.d[0], HS);
                in[0] = src;
                in[1] = ch->kv[li] = fr_graph_value(g, FR_VAL_BUFFER, FR_F32, cs);
                in[2] = fr_graph_value(g, FR_VAL_BUFFER, FR_F32, cs);
                if (in[1] < 0 || in[2] < 0 || in[2] != in[1] + 1) {
                    st = FR_ERR_NOMEM;
                    break;
                }
                node = fr_graph_node(g, FR_OP_ATTENTION_KV, in, 3, &a, -1, 0, out);
                break;
            }
            node = fr_graph_node(g, FR_OP_ATTENTION, &src, 1, &a, -1, 0, out);
            break;
        case FR_L_RES_END:
        case FR_L_ADD:
            in[0] = src, in[1] = SRC(l, 1);
            node = fr_graph_node(g, FR_OP_ADD, in, 2, &a, -1, 0, out);
            break;
        case FR_L_RMSNORM:
            a.eps = l->eps;
            in[0] = src, in[1] = pv[l->wparam];
            node = fr_graph_node(g, FR_OP_RMSNORM, in, 2, &a, -1, 0, out);
            break;
        case FR_L_SWIGLU:
            in[0] = src, in[1] = SRC(l, 1);
            node = fr_graph_node(g, FR_OP_SWIGLU, in, 2, &a, -1, 0, out);
            break;
        case FR_L_ROPE_QKV:
            a.heads = l->heads;
            a.kv_heads = l->kv_heads;
            a.rope = l->rope;
            a.rope.pos_from_step = ch != NULL; /* generation: a chunk from position `step` */
            in[0] = src, in[1] = SRC(l, 1), in[2] = SRC(l, 2);
            node = fr_graph_node(g, FR_OP_ROPE_QKV, in, 3, &a, -1, 0, out);
            break;
        case FR_L_RES_BEGIN:
        case FR_L_RES_SHORTCUT:
        case FR_L_COUNT: break;
        }
        if (node == -1) st = g->status;
        else if (node >= 0) {
            g->nodes[node].layer = (int)li;
            val[li] = out[0];
        }
    }
    x = m->n_layers ? val[m->n_layers - 1] : x;
#undef SRC
#undef RAW
    fr_free(ctx, val);
    if (st) return st;
    g->logits = fuse ? -1 : x;
    fr_shape head_out = g->vals[x].shape; /* the fused head's logits, never made */
    const fr_layer *hl = &m->layers[m->n_layers ? m->n_layers - 1 : 0];
    if (fuse) head_out.d[head_out.ndim - 1] = m->params[hl->wparam].shape.d[0];
    const fr_shape *z = fuse ? &head_out : &g->vals[x].shape;
    if (tokens ? z->ndim != 3 : z->ndim != 2)
        return fr_fail(ctx, FR_ERR_SHAPE,
                       tokens ? "a token model must end in (batch, positions, vocabulary) outputs"
                              : "the model must end in flat outputs (batch, classes)");
    if (ch) return FR_OK; /* generation: no label, no loss */
    /* cross-entropy: one class id per row of outputs (per sample, or per position) */
    fr_shape rows = *z;
    rows.ndim--;
    int y = m->loss == FR_LOSS_CROSS_ENTROPY ? fr_graph_value(g, FR_VAL_LABEL, FR_I32, rows)
                                             : fr_graph_value(g, FR_VAL_LABEL, FR_F32, *z);
    if (y < 0) return FR_ERR_NOMEM;
    g->vals[y].batched = 1;
    g->label = y;
    fr_attr a = {0};
    a.scale = 1.0f;
    int in[4] = {x, y}, out[FR_MAX_OUT];
    if (fuse) { /* loss and hits from LINEAR_CE; the unit and the estimate row are the head's */
        const int64_t C = m->params[hl->wparam].shape.d[1], V = m->params[hl->wparam].shape.d[0];
        const int64_t N = fr_shape_numel(&g->vals[x].shape) / C;
        a.rows = head_rows > 0 ? head_rows : fr_model_head_rows_auto(N, C, V);
        in[1] = pv[hl->wparam], in[2] = hl->bparam >= 0 ? pv[hl->bparam] : -1, in[3] = y;
        int node = fr_graph_node(g, FR_OP_LINEAR_CE, in, 4, &a, -1, 0, out);
        if (node < 0) return g->status;
        g->nodes[node].layer = (int)m->n_layers - 1;
        g->loss = out[0];
        g->hits = out[1];
        return FR_OK;
    }
    int node = fr_graph_node(g, m->loss == FR_LOSS_CROSS_ENTROPY ? FR_OP_CROSS_ENTROPY : FR_OP_MSE,
                             in, 2, &a, -1, 0, out);
    if (node < 0) return g->status;
    g->nodes[node].layer = -1;
    g->loss = out[0];
    return FR_OK;
}

fr_status fr_model_build_graph(fr_model *m, fr_graph *g, int n, int training, int head_rows,
                               int *pv) {
    return build_graph(m, g, n, training, head_rows, pv, NULL);
}

fr_status fr_model_build_chunk_graph(fr_model *m, fr_graph *g, const fr_chunk_graph *c, int *pv) {
    if (c->P < 1 || m->in_dtype != FR_I32 || c->P > m->in.d[0] || c->Tc < 0 || c->Tc > m->in.d[0] ||
        (c->Tc && c->P > c->Tc))
        return fr_fail(m->ctx, FR_ERR_ARG,
                       "a chunk of %d positions: the model must read tokens, a chunk 1 .. its "
                       "context",
                       c->P);
    return build_graph(m, g, 1, 0, 0, pv, c);
}
