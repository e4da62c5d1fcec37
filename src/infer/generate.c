/* generate.c — fr_generate: a token model run position by position with a
 * KV cache, and the sampler (generate.h has the contract: the cache, the
 * two rules past the context, the sampling rules). It walks the model's
 * layers by kind and calls the CPU kernels on the rows at hand; the one loop
 * of its own is the attention of one new query over the cached keys. It owns no graph, plan or
 * arena: the buffers are sized once, when generation starts, for the
 * largest chunk (the whole context in a prefill).
 *
 * Rows: a chunk is P positions (a prefill: the window at positions 0..P-1;
 * a step: one new token at position pos). Every kind but attention works
 * row by row, so the layers after the last attention layer compute the last
 * row only: it is the one whose logits are sampled. A value records the
 * first row it holds (row0) and is addressed by absolute row of the chunk. */
#include "infer/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/kernels.h"
#include "core/ctx.h"
#include "core/rng.h"
#include "model/model.h"

#define GEN_RNG_STREAM 0x67656e65726174ull /* "generat": the sampler's stream of the seed */

typedef struct gen {
    fr_model *m;
    fr_ctx *ctx;
    int T;           /* the context: positions the cache holds */
    int vocab_in;    /* rows of the embedding: ids the model reads */
    int vocab_out;   /* the logits' width */
    int last_attn;   /* the last attention layer, -1 if none */
    int n_slots;     /* activation buffers, reused once a value's last reader ran */
    int *res;        /* layer -> the layer whose output it is (markers: their source's), or INPUT */
    int *slot;       /* layer -> its buffer (-1: markers) */
    int *row0;       /* layer -> the first row of the chunk it holds (this chunk) */
    int *kv_index;   /* layer -> its attention cache (-1: not attention) */
    float **slots;   /* FR_MEM_WORKSPACE */
    float *kv;       /* FR_MEM_KV_CACHE: per attention layer K then V, each (NH, T, HS) */
    size_t kv_layer; /* floats of one layer's K (= of its V): T C */
    float *attn_ws;  /* the tiled kernel's workspace (prefill) */
    size_t attn_ws_len;
    float *scores;         /* (NH, T): one query's scores over the cache (a step) */
    int32_t *window;       /* the tokens the cache holds, and one more */
    double *prob, *sorted; /* vocab_out each: the sampler */
} gen;

static int width_of(const fr_layer *l) { return (int)l->out_shape.d[l->out_shape.ndim - 1]; }

static int is_marker(fr_layer_kind k) {
    return k == FR_L_RES_BEGIN || k == FR_L_RES_SHORTCUT || k == FR_L_DROPOUT; /* eval dropout */
}

static fr_tensor f32_rows(float *p, int64_t rows, int64_t cols) {
    return (fr_tensor){.dtype = FR_F32, .shape = fr_shape2(rows, cols), .data = p};
}

static fr_tensor param_t(const fr_model *m, int i) {
    if (i < 0) return (fr_tensor){.dtype = FR_F32, .shape = {0}, .data = NULL};
    const fr_param *p = &m->params[i];
    return (fr_tensor){.dtype = p->dtype, .shape = p->shape, .data = p->data};
}

/* Row r of the chunk in the value layer li made (li resolved through markers). */
static float *row_of(const gen *g, int li, int r) {
    int v = g->res[li];
    return g->slots[g->slot[v]] + (size_t)(r - g->row0[v]) * (size_t)width_of(&g->m->layers[v]);
}

/* The attention of a chunk: qkv (P, 3C) -> y (P, C), its keys and values
 * written into the cache at positions pos .. pos+P-1. A prefill (pos 0)
 * runs the tiled causal kernel; a step (P 1) the loop below. */
static fr_status attention(gen *g, const fr_layer *l, int li, const float *qkv, float *y, int P,
                           int pos) {
    const int C = width_of(l), NH = l->heads, HS = C / NH, T = g->T;
    float *K = g->kv + 2 * (size_t)g->kv_index[li] * g->kv_layer, *V = K + g->kv_layer;
    /* K, V are (NH, T, HS): K[h, t, j] = qkv[t - pos, C + h HS + j], V at 2C + h HS + j */
    for (int t = 0; t < P; t++)
        for (int h = 0; h < NH; h++) {
            const float *src = qkv + (size_t)t * 3 * C + h * HS;
            memcpy(K + ((size_t)h * T + pos + t) * HS, src + C, (size_t)HS * sizeof(float));
            memcpy(V + ((size_t)h * T + pos + t) * HS, src + 2 * C, (size_t)HS * sizeof(float));
        }
    if (pos == 0) {
        fr_attn_layout L = fr_attn_fused(1, NH, P, HS);
        if (fr_attention_fwd(&L, qkv, qkv + C, qkv + 2 * C, y, NULL, g->attn_ws, g->attn_ws_len))
            return fr_fail(g->ctx, FR_ERR_ARG, "generate: attention workspace too small");
        return FR_OK;
    }
    if (P != 1)
        return fr_fail(g->ctx, FR_ERR_ARG, "generate: a chunk after position 0 is one position");
    /* one query at position pos against the cached keys 0..pos, head by head:
     * q (HS) = qkv[h HS ..], s[t] = scale q . K[h, t] (t <= pos),
     * y[h HS + j] = sum_t softmax(s)[t] V[h, t, j]: O(pos HS) per head */
    const float scale = 1.0f / sqrtf((float)HS);
    const int n = pos + 1;
#pragma omp parallel for schedule(static) if ((size_t)NH * n * HS >= 65536)
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * HS, *Kh = K + (size_t)h * T * HS;
        const float *Vh = V + (size_t)h * T * HS;
        float *s = g->scores + (size_t)h * T, *yh = y + (size_t)h * HS;
        float mx = -INFINITY;
        for (int t = 0; t < n; t++) {
            const float *k = Kh + (size_t)t * HS;
            float d = 0.0f;
            for (int j = 0; j < HS; j++) d += q[j] * k[j];
            s[t] = d * scale;
            if (s[t] > mx) mx = s[t];
        }
        double sum = 0.0;
        for (int t = 0; t < n; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < HS; j++) yh[j] = 0.0f;
        for (int t = 0; t < n; t++) {
            const float p = s[t] * inv, *v = Vh + (size_t)t * HS;
            for (int j = 0; j < HS; j++) yh[j] += p * v[j];
        }
    }
    return FR_OK;
}

/* One layer on the rows at hand: rows r0 .. P-1 of the chunk, whose first
 * position is pos. c holds x (rows, width in) as in[0] and y (rows, C) as
 * out[0]; each kind sets what else its kernel reads. */
typedef struct gen_layer {
    gen *g;
    const fr_layer *l;
    int li, r0, rows, P, pos, C;
    const int32_t *tok; /* the chunk's ids */
    fr_node node;       /* the kernel's attributes */
    fr_kernel_call c;
} gen_layer;

// ids (1, rows) -> y (1, rows, C) = W[ids]
static int run_embedding(gen_layer *s) {
    s->c.in[0] = (fr_tensor){
        .dtype = FR_I32, .shape = fr_shape2(1, s->rows), .data = (void *)(s->tok + s->r0)};
    s->c.in[1] = param_t(s->g->m, s->l->wparam);
    s->c.out[0].shape = fr_shape3(1, s->rows, s->C);
    return fr_k_embedding(&s->c);
}

// x (1, rows, C) -> y = x + W[pos + r0 + t]: the table seen from the chunk's first position
static int run_pos_embedding(gen_layer *s) {
    fr_tensor w = param_t(s->g->m, s->l->wparam);
    const int64_t off = s->pos + s->r0;
    s->c.in[0].shape = s->c.out[0].shape = fr_shape3(1, s->rows, s->C);
    s->c.in[1] = (fr_tensor){.dtype = FR_F32,
                             .shape = fr_shape2(w.shape.d[0] - off, s->C),
                             .data = (float *)w.data + off * s->C};
    return fr_k_pos_embedding(&s->c);
}

// x (rows, C), gamma, beta (C); the mean and rstd outputs absent
static int run_layernorm(gen_layer *s) {
    s->node.attr.eps = 1e-5f;
    s->c.in[1] = param_t(s->g->m, s->l->first_param);
    s->c.in[2] = param_t(s->g->m, s->l->first_param + 1);
    return fr_k_layernorm(&s->c);
}

// x (rows, K), W (C, K) (maybe another layer's: tied), b (C) or absent -> y (rows, C)
static int run_linear(gen_layer *s) {
    s->c.in[1] = param_t(s->g->m, s->l->wparam);
    s->c.in[2] = param_t(s->g->m, s->l->bparam);
    return fr_k_linear(&s->c);
}

static int run_gelu(gen_layer *s) {
    s->node.attr.approx = s->l->approx;
    return fr_k_gelu(&s->c);
}

static int run_relu(gen_layer *s) { return fr_k_relu(&s->c); }

// a (rows, C) + b (rows, C): an add, or a residual block's end
static int run_add(gen_layer *s) {
    s->c.in[1] = f32_rows(row_of(s->g, s->l->src[1], s->r0), s->rows, s->C);
    return fr_k_add(&s->c);
}

static int run_attention(gen_layer *s) {
    return attention(s->g, s->l, s->li, fr_f32(&s->c.in[0]), fr_f32(&s->c.out[0]), s->P, s->pos);
}

/* The kinds generation runs; markers pass their value on. Any other kind is refused. */
typedef int (*gen_layer_fn)(gen_layer *s);
static const gen_layer_fn layer_fn[FR_L_COUNT] = {[FR_L_EMBEDDING] = run_embedding,
                                                  [FR_L_POS_EMBEDDING] = run_pos_embedding,
                                                  [FR_L_LAYERNORM] = run_layernorm,
                                                  [FR_L_LINEAR] = run_linear,
                                                  [FR_L_GELU] = run_gelu,
                                                  [FR_L_RELU] = run_relu,
                                                  [FR_L_ADD] = run_add,
                                                  [FR_L_RES_END] = run_add,
                                                  [FR_L_ATTENTION] = run_attention};

/* Runs tokens tok[0..P) at positions pos..pos+P-1 through the model;
 * *logits: the last position's (vocab_out). */
static fr_status run_chunk(gen *g, const int32_t *tok, int P, int pos, const float **logits) {
    fr_model *m = g->m;
    gen_layer s = {.g = g, .P = P, .pos = pos, .tok = tok};
    for (size_t i = 0; i < m->n_layers; i++) {
        const fr_layer *l = &m->layers[i];
        if (is_marker(l->kind)) continue;
        s.l = l;
        s.li = (int)i;
        s.r0 = s.li > g->last_attn ? P - 1 : 0;
        s.rows = P - s.r0;
        s.C = width_of(l);
        g->row0[i] = s.r0;
        s.node.attr = (fr_attr){0};
        s.c = (fr_kernel_call){.ctx = g->ctx, .node = &s.node};
        s.c.out[0] = f32_rows(g->slots[g->slot[i]], s.rows, s.C);
        if (l->src[0] != FR_MODEL_INPUT)
            s.c.in[0] = f32_rows(row_of(g, l->src[0], s.r0), s.rows,
                                 width_of(&m->layers[g->res[l->src[0]]]));
        int st = layer_fn[l->kind](&s);
        if (st) return (fr_status)st;
    }
    *logits = row_of(g, (int)m->n_layers - 1, P - 1);
    return FR_OK;
}

/* Checks the model and fills res, kv_index, last_attn, the vocabularies. */
static fr_status check_model(gen *g) {
    fr_model *m = g->m;
    fr_ctx *ctx = g->ctx;
    if (m->in_dtype != FR_I32)
        return fr_fail(ctx, FR_ERR_ARG,
                       "generate: the model does not read tokens (its input must be 'input "
                       "tokens T')");
    if (!m->initialised)
        return fr_fail(ctx, FR_ERR_ARG,
                       "generate: the model has no weights (load them with --weights, or "
                       "initialise it)");
    if (m->depth || m->block)
        return fr_fail(ctx, FR_ERR_ARG, "generate: a residual block or a block is still open");
    if (m->n_layers == 0 || is_marker(m->layers[m->n_layers - 1].kind))
        return fr_fail(ctx, FR_ERR_SHAPE, "generate: the model must end in a layer of logits");
    for (size_t p = 0; p < m->n_params; p++)
        if (m->params[p].dtype != FR_F32)
            return fr_fail(ctx, FR_ERR_ARG,
                           "generate: parameter %s is %s; generation reads f32 weights (a "
                           "model turned to 16 bits with .half() is refused)",
                           m->params[p].name, fr_dtype_name(m->params[p].dtype));
    g->T = (int)m->in.d[0];
    g->last_attn = -1;
    int n_attn = 0;
    for (size_t li = 0; li < m->n_layers; li++) {
        const fr_layer *l = &m->layers[li];
        if (!layer_fn[l->kind] && !is_marker(l->kind))
            return fr_fail(ctx, FR_ERR_ARG,
                           "generate: layer %zu (%s, '%s') is a kind generation cannot run (it "
                           "runs embedding, pos_embedding, layernorm, linear, gelu, relu, add, "
                           "residual, dropout and attention)",
                           li, fr_layer_kind_name(l->kind), l->name);
        if (l->kind == FR_L_EMBEDDING && !g->vocab_in)
            g->vocab_in = (int)m->params[l->wparam].shape.d[0];
        if (l->kind == FR_L_ATTENTION) {
            g->kv_index[li] = n_attn++;
            g->last_attn = (int)li;
        }
        if (l->src[0] == FR_NO_VAL)
            return fr_fail(ctx, FR_ERR_ARG, "generate: layer %zu reads no value", li);
        /* the token ids feed embeddings only; every other layer reads floats */
        for (int k = 0; k < 2; k++) {
            int s = l->src[k], r = s >= 0 ? g->res[s] : s;
            if (r == FR_MODEL_INPUT && l->kind != FR_L_EMBEDDING && !is_marker(l->kind))
                return fr_fail(ctx, FR_ERR_SHAPE,
                               "generate: layer %zu (%s) reads the token ids; only an "
                               "embedding can",
                               li, fr_layer_kind_name(l->kind));
        }
        if (l->kind == FR_L_EMBEDDING && l->src[0] != FR_MODEL_INPUT)
            return fr_fail(ctx, FR_ERR_SHAPE, "generate: embedding %zu does not read the tokens",
                           li);
        g->res[li] = !is_marker(l->kind)           ? (int)li
                     : l->src[0] == FR_MODEL_INPUT ? FR_MODEL_INPUT
                                                   : g->res[l->src[0]];
    }
    const fr_layer *last = &m->layers[m->n_layers - 1];
    g->vocab_out = width_of(last);
    if (!g->vocab_in)
        return fr_fail(ctx, FR_ERR_SHAPE, "generate: the model has no embedding of token ids");
    if (last->out_shape.ndim != 2)
        return fr_fail(ctx, FR_ERR_SHAPE,
                       "generate: the model must end in (positions, vocabulary) logits");
    return FR_OK;
}

/* Buffers: a slot per value live at once (a value's slot is free again
 * after its last reader), each as large as the largest value it holds
 * (T rows up to the last attention layer, one row after it). */
static fr_status plan_buffers(gen *g) {
    fr_model *m = g->m;
    fr_ctx *ctx = g->ctx;
    const int n = (int)m->n_layers;
    int *last_use = fr_alloc(ctx, 2 * (size_t)n * sizeof(int), FR_MEM_OTHER);
    size_t *slot_floats = fr_calloc(ctx, (size_t)n * sizeof(size_t), FR_MEM_OTHER);
    fr_status st = FR_OK;
    if (!last_use || !slot_floats) {
        st = FR_ERR_NOMEM;
        goto out;
    }
    int *free_list = last_use + n, n_free = 0;
    for (int li = 0; li < n; li++) last_use[li] = -1;
    last_use[n - 1] = n; /* the logits stay */
    for (int li = 0; li < n; li++) {
        const fr_layer *l = &m->layers[li];
        if (is_marker(l->kind)) continue;
        for (int k = 0; k < 2; k++)
            if (l->src[k] >= 0 && last_use[g->res[l->src[k]]] < li)
                last_use[g->res[l->src[k]]] = li;
    }
    g->n_slots = 0;
    for (int li = 0; li < n; li++) {
        const fr_layer *l = &m->layers[li];
        g->slot[li] = -1;
        if (is_marker(l->kind)) continue;
        int s = n_free ? free_list[--n_free] : g->n_slots++;
        size_t rows = li > g->last_attn ? 1 : (size_t)g->T;
        size_t need = rows * (size_t)width_of(l);
        if (slot_floats[s] < need) slot_floats[s] = need;
        g->slot[li] = s;
        /* the values whose last reader this is, and this one if nobody reads it */
        for (int k = 0; k < 2; k++) {
            int r = l->src[k] >= 0 ? g->res[l->src[k]] : -1;
            if (r >= 0 && last_use[r] == li &&
                (k == 0 || l->src[0] < 0 || g->res[l->src[0]] != r)) /* a + a: once */
                free_list[n_free++] = g->slot[r];
        }
        if (last_use[li] < 0) free_list[n_free++] = s;
    }
    g->slots = fr_calloc(ctx, (size_t)g->n_slots * sizeof *g->slots, FR_MEM_OTHER);
    if (!g->slots) {
        st = FR_ERR_NOMEM;
        goto out;
    }
    for (int s = 0; s < g->n_slots && !st; s++)
        if (!(g->slots[s] = fr_alloc(ctx, slot_floats[s] * sizeof(float), FR_MEM_WORKSPACE)))
            st = FR_ERR_NOMEM;
out:
    fr_free(ctx, last_use);
    fr_free(ctx, slot_floats);
    return st;
}

static fr_status setup(gen *g) {
    fr_model *m = g->m;
    fr_ctx *ctx = g->ctx;
    const size_t n = m->n_layers;
    fr_status st;
    g->res = fr_alloc(ctx, 4 * n * sizeof(int), FR_MEM_OTHER);
    if (!g->res) return FR_ERR_NOMEM;
    g->slot = g->res + n;
    g->row0 = g->slot + n;
    g->kv_index = g->row0 + n;
    for (size_t i = 0; i < n; i++) g->kv_index[i] = -1;
    if ((st = check_model(g)) || (st = plan_buffers(g))) return st;
    /* the cache, and the widest head's scratch */
    int n_attn = 0, max_nh = 1;
    size_t max_c = 0;
    for (size_t li = 0; li < n; li++) {
        const fr_layer *l = &m->layers[li];
        if (l->kind != FR_L_ATTENTION) continue;
        n_attn++;
        size_t c = (size_t)width_of(l);
        if (c > max_c) max_c = c;
        if (l->heads > max_nh) max_nh = l->heads;
    }
    g->kv_layer = (size_t)g->T * max_c;
    if (n_attn) {
        /* every layer's K and V at the largest C: exact for a GPT, whose layers share C */
        g->kv = fr_alloc(ctx, 2 * (size_t)n_attn * g->kv_layer * sizeof(float), FR_MEM_KV_CACHE);
        g->attn_ws_len = fr_attention_ws_floats(g->T, 1, fr_get_threads(ctx));
        g->attn_ws = fr_alloc(ctx, g->attn_ws_len * sizeof(float), FR_MEM_WORKSPACE);
        g->scores = fr_alloc(ctx, (size_t)max_nh * g->T * sizeof(float), FR_MEM_WORKSPACE);
        if (!g->kv || !g->attn_ws || !g->scores) return FR_ERR_NOMEM;
    }
    g->window = fr_alloc(ctx, ((size_t)g->T + 1) * sizeof(int32_t), FR_MEM_WORKSPACE);
    g->prob = fr_alloc(ctx, 2 * (size_t)g->vocab_out * sizeof(double), FR_MEM_WORKSPACE);
    if (!g->window || !g->prob) return FR_ERR_NOMEM;
    g->sorted = g->prob + g->vocab_out;
    return FR_OK;
}

static void teardown(gen *g) {
    fr_ctx *ctx = g->ctx;
    if (g->slots)
        for (int s = 0; s < g->n_slots; s++) fr_free(ctx, g->slots[s]);
    fr_free(ctx, g->slots);
    fr_free(ctx, g->kv);
    fr_free(ctx, g->attn_ws);
    fr_free(ctx, g->scores);
    fr_free(ctx, g->window);
    fr_free(ctx, g->prob);
    fr_free(ctx, g->res);
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* One token from logits z (V): greedy at temperature 0, else a draw. */
static int32_t sample(gen *g, const float *z, const fr_gen_opts *o, fr_rng *rng) {
    const int V = g->vocab_out;
    if (o->temperature == 0.0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (z[i] > z[best]) best = i; /* strict: the lowest id wins a tie */
        return best;
    }
    double *p = g->prob, mx = -INFINITY;
    for (int i = 0; i < V; i++) p[i] = (double)z[i] / o->temperature;
    if (o->top_k > 0 && o->top_k < V) { /* keep the values >= the k-th largest */
        memcpy(g->sorted, p, (size_t)V * sizeof *p);
        qsort(g->sorted, (size_t)V, sizeof *p, cmp_desc);
        const double kth = g->sorted[o->top_k - 1];
        for (int i = 0; i < V; i++)
            if (p[i] < kth) p[i] = -INFINITY;
    }
    for (int i = 0; i < V; i++)
        if (p[i] > mx) mx = p[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += (p[i] = exp(p[i] - mx));
    /* u uniform in [0, sum): the first id whose running sum passes it */
    const double u = (double)(fr_rng_next(rng) >> 11) * 0x1p-53 * sum;
    double acc = 0.0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0.0) continue;
        acc += p[i];
        last = i;
        if (acc > u) return i;
    }
    return last; /* rounding left u at the very end */
}

int fr_generate_vocab(const fr_model *m) {
    for (size_t li = 0; li < m->n_layers; li++)
        if (m->layers[li].kind == FR_L_EMBEDDING)
            return (int)m->params[m->layers[li].wparam].shape.d[0];
    return 0;
}

fr_status fr_generate(fr_model *m, const int32_t *prompt, int n_prompt, const fr_gen_opts *o,
                      int *cropped) {
    if (cropped) *cropped = 0;
    if (!m || !o) return FR_ERR_ARG;
    fr_ctx *ctx = m->ctx;
    if (o->tokens < 0 || !(o->temperature >= 0.0 && o->temperature <= 1e6) || o->top_k < 0 ||
        (o->window_slide != 0 && o->window_slide != 1))
        return fr_fail(ctx, FR_ERR_ARG,
                       "generate: tokens %d, temperature %g, top-k %d, window_slide %d: need "
                       "tokens >= 0, temperature >= 0, top-k >= 0, window_slide 0 or 1",
                       o->tokens, o->temperature, o->top_k, o->window_slide);
    if (!prompt || n_prompt < 1)
        return fr_fail(ctx, FR_ERR_ARG, "generate: the prompt is empty (give at least one token)");
    gen g = {.m = m, .ctx = ctx};
    fr_status st = setup(&g);
    if (st) goto out;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= g.vocab_in) {
            st = fr_fail(ctx, FR_ERR_ARG,
                         "generate: prompt token %d is id %ld, outside the vocabulary [0, %d)", i,
                         (long)prompt[i], g.vocab_in);
            goto out;
        }
    const int T = g.T, keep_on_wrap = T / 2 > 0 ? T / 2 : 1;
    int n = n_prompt > T ? T : n_prompt; /* tokens in the cache */
    if (cropped) *cropped = n_prompt - n;
    memcpy(g.window, prompt + (n_prompt - n), (size_t)n * sizeof(int32_t));
    fr_rng rng = fr_rng_make(o->seed, GEN_RNG_STREAM);
    const float *z = NULL;
    if (o->tokens > 0) st = run_chunk(&g, g.window, n, 0, &z);
    for (int i = 0; i < o->tokens && !st; i++) {
        if (o->logits) o->logits(o->user, z, g.vocab_out);
        const int32_t tok = sample(&g, z, o, &rng);
        if (o->emit) o->emit(o->user, tok);
        if (i == o->tokens - 1) break;
        if (tok >= g.vocab_in) {
            st = fr_fail(ctx, FR_ERR_ARG,
                         "generate: the model made id %ld, outside its input vocabulary of %d",
                         (long)tok, g.vocab_in);
            break;
        }
        g.window[n] = tok;
        if (n == T) { /* the cache is full: the window's last T (slide) or T/2, prefilled again */
            const int keep = o->window_slide ? T : keep_on_wrap;
            memmove(g.window, g.window + (n + 1 - keep), (size_t)keep * sizeof(int32_t));
            n = keep;
            st = run_chunk(&g, g.window, n, 0, &z);
        } else {
            st = run_chunk(&g, g.window + n, 1, n, &z);
            n++;
        }
    }
out:
    teardown(&g);
    return st;
}
