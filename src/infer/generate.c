/* generate.c — fr_generate: a token model run a chunk of positions at a time
 * through the same graph, plan, executor and backend as a training step,
 * and the sampler (generate.h has the contract: the cache, the two rules
 * past the context, the sampling rules).
 *
 * A chunk is P positions from pos: a prefill (the window at positions
 * 0..P-1) or a step (one new token at pos). Its forward is the model's own
 * graph (fr_model_build_chunk_graph): attention layers run ATTENTION_KV
 * over the layers' caches, the layers after the last attention layer the
 * last row only (the one whose logits are sampled), and the plan gives its
 * step values offsets in one arena as it does a step's. A run makes at most
 * three chunk sizes (the prompt's prefill, a step, the prefill after a
 * window move), each compiled once when generation starts; one executor,
 * of the chunk size running, holds an arena at a time.
 *
 * The persistent values live in the backend's memory: the caches (one
 * block, FR_MEM_KV_CACHE), and on a device the weights' copies
 * (FR_MEM_PARAMS) and the chunk's ids (FR_MEM_DATA); on the CPU the graph
 * reads the model's weights and the window itself. The runtime position
 * reaches ATTENTION_KV as the executor's step argument and the position
 * table through the binding of its rows (pos_rows). */
#include "infer/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/ctx.h"
#include "core/rng.h"
#include "exec/exec.h"
#include "model/model.h"

#define GEN_RNG_STREAM 0x67656e65726174ull /* "generat": the sampler's stream of the seed */
#define MAX_CHUNKS 3                       /* the prompt's prefill, a step, a window's */

/* The compiled forward of a chunk of P positions. */
typedef struct chunk {
    int P;
    fr_graph g;
    fr_plan plan;
    int *pv;       /* per parameter: its value (n_params) */
    int *kv;       /* per layer: its K cache's value, V the next (-1: not attention) */
    int *pos_rows; /* per layer: the position table's rows the chunk reads (-1: none) */
} chunk;

typedef struct gen_pid {
    double p;
    int id;
} gen_pid;

typedef struct gen {
    fr_model *m;
    fr_ctx *ctx;
    const fr_backend *be;
    int T;         /* the context: positions the cache holds */
    int vocab_in;  /* rows of the embedding: ids the model reads */
    int vocab_out; /* the logits' width */
    chunk ch[MAX_CHUNKS];
    int n_ch;
    fr_exec ex;
    int live;              /* the chunk ex runs, -1: none */
    void *kv;              /* the caches: per attention layer K then V (FR_MEM_KV_CACHE) */
    size_t *kv_off;        /* per layer: its K's byte offset in kv (V follows) */
    size_t kv_bytes;       /* all of them */
    void *wbuf;            /* on a device: the parameter block's copy (FR_MEM_PARAMS) */
    void *ids;             /* on a device: the chunk's ids, T i32 (FR_MEM_DATA) */
    float *logits;         /* the last position's, vocab_out */
    int32_t *window;       /* the tokens the cache holds, and one more */
    double *prob, *sorted; /* vocab_out each: the sampler */
    struct gen_pid *order; /* vocab_out: top-p's ids by probability */
    int max_context;       /* the options' cap on T (0: none) */
} gen;

static int is_marker(fr_layer_kind k) {
    return k == FR_L_RES_BEGIN || k == FR_L_RES_SHORTCUT || k == FR_L_DROPOUT; /* eval dropout */
}

/* The kinds generation runs (markers pass their value on); any other is refused. */
static const unsigned char runs_kind[FR_L_COUNT] = {
    [FR_L_EMBEDDING] = 1, [FR_L_POS_EMBEDDING] = 1, [FR_L_LAYERNORM] = 1, [FR_L_LINEAR] = 1,
    [FR_L_GELU] = 1,      [FR_L_RELU] = 1,          [FR_L_ADD] = 1,       [FR_L_RES_END] = 1,
    [FR_L_ATTENTION] = 1, [FR_L_RMSNORM] = 1,       [FR_L_SWIGLU] = 1,    [FR_L_ROPE_QKV] = 1};

/* ---- the backend's memory: a device's buffers, or the host's blocks ---- */

static void *mem_take(gen *g, size_t bytes, fr_mem_cat cat) {
    return g->be->alloc(g->ctx, bytes, cat);
}

static void mem_give(gen *g, void *buf) { g->be->release(g->ctx, buf); }

/* Value v of the running chunk at byte off of buf (a device's buffer, or a host block). */
static void bind_at(gen *g, int v, void *buf, size_t off) { fr_exec_bind_dev(&g->ex, v, buf, off); }

/* ---- the model and the chunks ---- */

/* Checks the model and fills the vocabularies and the context. */
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
    if (g->max_context > 0 && g->max_context < g->T) g->T = g->max_context;
    /* res[li]: the layer whose value li passes on (itself but for markers), or the input */
    int *res = fr_alloc(ctx, m->n_layers * sizeof *res, FR_MEM_OTHER);
    if (!res) return FR_ERR_NOMEM;
    fr_status st = FR_OK;
    for (size_t li = 0; li < m->n_layers && !st; li++) {
        const fr_layer *l = &m->layers[li];
        if (!runs_kind[l->kind] && !is_marker(l->kind))
            st = fr_fail(ctx, FR_ERR_ARG,
                         "generate: layer %zu (%s, '%s') is a kind generation cannot run (it "
                         "runs embedding, pos_embedding, layernorm, rmsnorm, linear, gelu, "
                         "relu, swiglu, add, residual, dropout, rope_qkv and attention)",
                         li, fr_layer_kind_name(l->kind), l->name);
        else if (l->src[0] == FR_NO_VAL)
            st = fr_fail(ctx, FR_ERR_ARG, "generate: layer %zu reads no value", li);
        /* the token ids feed embeddings only; every other layer reads floats */
        for (int k = 0; k < 3 && !st; k++) {
            int s = l->src[k], r = s >= 0 ? res[s] : s;
            if (r == FR_MODEL_INPUT && l->kind != FR_L_EMBEDDING && !is_marker(l->kind))
                st = fr_fail(ctx, FR_ERR_SHAPE,
                             "generate: layer %zu (%s) reads the token ids; only an "
                             "embedding can",
                             li, fr_layer_kind_name(l->kind));
        }
        if (!st && l->kind == FR_L_EMBEDDING && l->src[0] != FR_MODEL_INPUT)
            st = fr_fail(ctx, FR_ERR_SHAPE, "generate: embedding %zu does not read the tokens", li);
        if (!st && l->kind == FR_L_EMBEDDING && !g->vocab_in)
            g->vocab_in = (int)m->params[l->wparam].shape.d[0];
        res[li] = !is_marker(l->kind)           ? (int)li
                  : l->src[0] == FR_MODEL_INPUT ? FR_MODEL_INPUT
                                                : res[l->src[0]];
    }
    fr_free(ctx, res);
    if (st) return st;
    const fr_layer *last = &m->layers[m->n_layers - 1];
    g->vocab_out = (int)last->out_shape.d[last->out_shape.ndim - 1];
    if (!g->vocab_in)
        return fr_fail(ctx, FR_ERR_SHAPE, "generate: the model has no embedding of token ids");
    if (last->out_shape.ndim != 2)
        return fr_fail(ctx, FR_ERR_SHAPE,
                       "generate: the model must end in (positions, vocabulary) logits");
    return FR_OK;
}

/* The chunk sizes a run makes, in the order it first makes them: the
 * prompt's window (n0 positions), then per new token past the first a step
 * of one, or, when the cache is full, the window kept (T or T/2) again. */
static int chunk_sizes(int T, int n0, int tokens, int slide, int *P) {
    int n = 0, have = 0, keep = slide ? T : (T / 2 > 0 ? T / 2 : 1);
    for (int i = -1; i < tokens - 1 && have < MAX_CHUNKS; i++) {
        int p = i < 0 ? n0 : n == T ? keep : 1;
        n = i < 0 ? n0 : n == T ? keep : n + 1;
        int known = 0;
        for (int k = 0; k < have; k++) known |= P[k] == p;
        if (!known) P[have++] = p;
    }
    return tokens > 0 ? have : 0;
}

static fr_status compile_chunk(gen *g, chunk *c, int P) {
    fr_model *m = g->m;
    c->P = P;
    fr_graph_init(&c->g, g->ctx);
    c->pv = fr_alloc(g->ctx, (m->n_params + 2 * m->n_layers + 1) * sizeof(int), FR_MEM_OTHER);
    if (!c->pv) return FR_ERR_NOMEM;
    c->kv = c->pv + m->n_params;
    c->pos_rows = c->kv + m->n_layers;
    fr_chunk_graph cg = {.P = P, .Tc = g->T, .kv = c->kv, .pos_rows = c->pos_rows};
    fr_status st = fr_model_build_chunk_graph(m, &c->g, &cg, c->pv);
    if (st) return st;
    uint8_t *keep = fr_calloc(g->ctx, c->g.n_vals, FR_MEM_OTHER);
    if (!keep) return FR_ERR_NOMEM;
    keep[c->g.logits] = 1; /* read after the last node */
    st = fr_plan_build(&c->g, keep, NULL, 0, &c->plan);
    fr_free(g->ctx, keep);
    return st;
}

static void release_chunk(gen *g, chunk *c) {
    fr_plan_release(&c->plan);
    if (c->g.ctx) fr_graph_release(&c->g);
    fr_free(g->ctx, c->pv);
    memset(c, 0, sizeof *c);
}

/* Checks the model, compiles the chunks a run of n0 prompt tokens and o
 * makes, and lays out the caches (kv_off, kv_bytes); allocates nothing of
 * the run itself. */
static fr_status prepare(gen *g, int n0, const fr_gen_opts *o) {
    fr_model *m = g->m;
    g->be = fr_backend_of(g->ctx);
    g->live = -1;
    g->max_context = o->max_context;
    fr_status st = check_model(g);
    if (st) return st;
    int P[MAX_CHUNKS];
    g->n_ch = 0;
    int n = chunk_sizes(g->T, n0 < g->T ? n0 : g->T, o->tokens, o->window_slide, P);
    for (int k = 0; k < n; k++) {
        g->n_ch = k + 1;
        if ((st = compile_chunk(g, &g->ch[k], P[k]))) return st;
    }
    g->kv_off = fr_alloc(g->ctx, (m->n_layers + 1) * sizeof *g->kv_off, FR_MEM_OTHER);
    if (!g->kv_off) return FR_ERR_NOMEM;
    g->kv_bytes = 0;
    for (size_t li = 0; li < m->n_layers; li++) {
        g->kv_off[li] = g->kv_bytes;
        if (g->n_ch && g->ch[0].kv[li] >= 0) /* K and V: the same shape in every chunk */
            g->kv_bytes += 2 * fr_value_bytes(&g->ch[0].g.vals[g->ch[0].kv[li]]);
    }
    return FR_OK;
}

/* The run's persistent buffers: the caches, the host's scratch, and on a
 * device the weights' copies and the ids. */
static fr_status setup(gen *g) {
    fr_model *m = g->m;
    fr_ctx *ctx = g->ctx;
    g->window = fr_alloc(ctx, ((size_t)g->T + 1) * sizeof(int32_t), FR_MEM_OTHER);
    g->prob = fr_alloc(ctx, 2 * (size_t)g->vocab_out * sizeof(double), FR_MEM_OTHER);
    g->logits = fr_alloc(ctx, (size_t)g->vocab_out * sizeof(float), FR_MEM_OTHER);
    g->order = fr_alloc(ctx, (size_t)g->vocab_out * sizeof *g->order, FR_MEM_OTHER);
    if (!g->window || !g->prob || !g->logits || !g->order) return FR_ERR_NOMEM;
    g->sorted = g->prob + g->vocab_out;
    fr_mem_set_tag(ctx, "kv cache");
    if (g->kv_bytes && !(g->kv = mem_take(g, g->kv_bytes, FR_MEM_KV_CACHE))) return FR_ERR_NOMEM;
    fr_mem_set_tag(ctx, NULL);
    size_t ids = (size_t)g->T * sizeof(int32_t);
    /* where the backend's kernels read the host's memory, no copy is made:
     * the host's weights and ids serve */
    if (!g->be->mirror_bytes(ctx, ids)) return FR_OK;
    fr_mem_set_tag(ctx, "generation's weights"); /* each parameter at its offset */
    int st = g->be->mirror(ctx, &g->wbuf, m->pblock, m->pblock_bytes, FR_MEM_PARAMS);
    fr_mem_set_tag(ctx, NULL);
    if (st) return (fr_status)st;
    return (fr_status)g->be->mirror(ctx, &g->ids, NULL, ids, FR_MEM_DATA);
}

static void teardown(gen *g) {
    fr_ctx *ctx = g->ctx;
    fr_exec_release(&g->ex);
    for (int k = 0; k < MAX_CHUNKS; k++) release_chunk(g, &g->ch[k]);
    if (g->kv) g->be->finish(ctx); /* nothing may still use a buffer */
    if (g->kv) mem_give(g, g->kv);
    if (g->wbuf) mem_give(g, g->wbuf);
    if (g->ids) mem_give(g, g->ids);
    fr_free(ctx, g->kv_off);
    fr_free(ctx, g->window);
    fr_free(ctx, g->prob);
    fr_free(ctx, g->logits);
    fr_free(ctx, g->order);
}

/* The executor of chunk k, its arena held and its persistent values bound:
 * the weights, the caches and (on a device) the ids' buffer. */
static fr_status make_live(gen *g, int k) {
    if (g->live == k) return FR_OK;
    fr_exec_release(&g->ex);
    g->live = -1;
    chunk *c = &g->ch[k];
    fr_status st = fr_exec_init(&g->ex, &c->g, &c->plan);
    if (st) return st;
    g->live = k;
    const fr_model *m = g->m;
    for (size_t i = 0; i < m->n_params; i++)
        fr_exec_bind_dev(&g->ex, c->pv[i], g->wbuf ? g->wbuf : m->params[i].data,
                         g->wbuf ? m->params[i].off : 0);
    for (size_t li = 0; li < m->n_layers; li++) {
        if (c->kv[li] < 0) continue;
        size_t half = fr_value_bytes(&c->g.vals[c->kv[li]]);
        bind_at(g, c->kv[li], g->kv, g->kv_off[li]);
        bind_at(g, c->kv[li] + 1, g->kv, g->kv_off[li] + half);
    }
    if (g->ids) fr_exec_bind_dev(&g->ex, c->g.input, g->ids, 0);
    return FR_OK;
}

/* Runs tokens tok[0..P) at positions pos..pos+P-1 through the model;
 * g->logits receives the last position's. */
static fr_status run_chunk(gen *g, const int32_t *tok, int P, int pos) {
    int k = 0;
    while (k < g->n_ch && g->ch[k].P != P) k++;
    if (k == g->n_ch)
        return fr_fail(g->ctx, FR_ERR_ARG, "generate: no chunk of %d positions was compiled", P);
    fr_status st = make_live(g, k);
    if (st) return st;
    const chunk *c = &g->ch[k];
    const fr_model *m = g->m;
    if (!g->ids) fr_exec_bind(&g->ex, c->g.input, (void *)tok);
    else if ((st = (fr_status)g->be->write(g->ctx, g->ids, 0, tok, (size_t)P * sizeof *tok)))
        return st;
    for (size_t li = 0; li < m->n_layers; li++) { /* rows pos + P - rows .. of the table */
        int v = c->pos_rows[li];
        if (v < 0) continue;
        const fr_shape *s = &c->g.vals[v].shape;
        const int w = m->layers[li].wparam;
        size_t off = (size_t)(pos + P - s->d[0]) * (size_t)s->d[1] * sizeof(float);
        bind_at(g, v, g->wbuf ? g->wbuf : m->params[w].data,
                off + (g->wbuf ? m->params[w].off : 0));
    }
    if ((st = fr_exec_run(&g->ex, 0, c->plan.n_nodes, 1, 0, (uint64_t)pos))) return st;
    /* the logits (1, rows, V): the last row */
    const int z = c->g.logits;
    const fr_shape *zs = &c->g.vals[z].shape;
    const size_t V = (size_t)g->vocab_out, row = (size_t)(zs->d[1] - 1) * V * sizeof(float);
    st = fr_exec_read(&g->ex, z, row, g->logits, V * sizeof(float));
    fr_exec_finish(&g->ex);
    return st;
}

/* ---- the sampler ---- */

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* qsort's order of (probability, id): higher first, the lower id first on a tie */
static int cmp_prob_desc(const void *a, const void *b) {
    const gen_pid *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : (x->id > y->id) - (x->id < y->id);
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
    if (o->top_p > 0.0 && o->top_p < 1.0) { /* keep while the mass before is below top_p */
        gen_pid *o_ = g->order;
        for (int i = 0; i < V; i++) o_[i].p = p[i], o_[i].id = i;
        qsort(o_, (size_t)V, sizeof *o_, cmp_prob_desc);
        double before = 0.0;
        int i = 0;
        for (; i < V && before < o->top_p * sum; i++) before += o_[i].p;
        for (; i < V; i++) p[o_[i].id] = 0.0;
        sum = before;
    }
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

static fr_status check_opts(fr_ctx *ctx, int n_prompt, const fr_gen_opts *o) {
    if (o->tokens < 0 || !(o->temperature >= 0.0 && o->temperature <= 1e6) || o->top_k < 0 ||
        (o->window_slide != 0 && o->window_slide != 1) || !(o->top_p >= 0.0 && o->top_p <= 1.0) ||
        o->max_context < 0)
        return fr_fail(ctx, FR_ERR_ARG,
                       "generate: tokens %d, temperature %g, top-k %d, top-p %g, window_slide "
                       "%d, max context %d: need tokens >= 0, temperature >= 0, top-k >= 0, "
                       "top-p in [0, 1], window_slide 0 or 1, max context >= 0",
                       o->tokens, o->temperature, o->top_k, o->top_p, o->window_slide,
                       o->max_context);
    if (n_prompt < 1)
        return fr_fail(ctx, FR_ERR_ARG, "generate: the prompt is empty (give at least one token)");
    return FR_OK;
}

fr_status fr_generate_predict(fr_model *m, int n_prompt, const fr_gen_opts *o,
                              size_t peak[FR_MEM_CAT_COUNT]) {
    if (!m || !o || !peak) return FR_ERR_ARG;
    memset(peak, 0, FR_MEM_CAT_COUNT * sizeof *peak);
    gen g = {.m = m, .ctx = m->ctx};
    fr_status st = check_opts(m->ctx, n_prompt, o);
    if (!st) st = prepare(&g, n_prompt, o);
    if (!st) {
        peak[FR_MEM_KV_CACHE] = g.n_ch ? g.kv_bytes : 0;
        for (int k = 0; k < g.n_ch; k++)
            for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
                if (g.ch[k].plan.peak[c] > peak[c]) peak[c] = g.ch[k].plan.peak[c];
        size_t ids = g.be->mirror_bytes(m->ctx, (size_t)g.T * sizeof(int32_t));
        if (ids && g.n_ch) { /* the backend's memory holds copies (setup's) */
            peak[FR_MEM_PARAMS] += g.be->mirror_bytes(m->ctx, m->pblock_bytes);
            peak[FR_MEM_DATA] = ids;
        }
    }
    teardown(&g);
    return st;
}

fr_status fr_generate(fr_model *m, const int32_t *prompt, int n_prompt, const fr_gen_opts *o,
                      int *cropped) {
    if (cropped) *cropped = 0;
    if (!m || !o) return FR_ERR_ARG;
    fr_ctx *ctx = m->ctx;
    fr_status st = check_opts(ctx, prompt ? n_prompt : 0, o);
    if (st) return st;
    gen g = {.m = m, .ctx = ctx};
    if ((st = prepare(&g, n_prompt, o)) || (st = setup(&g))) goto out;
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
    if (o->tokens > 0) st = run_chunk(&g, g.window, n, 0);
    for (int i = 0; i < o->tokens && !st; i++) {
        if (o->logits) o->logits(o->user, g.logits, g.vocab_out);
        const int32_t tok = sample(&g, g.logits, o, &rng);
        if (o->emit) o->emit(o->user, tok);
        if (i == o->tokens - 1 || (o->stop && tok == o->stop_token)) break;
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
            st = run_chunk(&g, g.window, n, 0);
        } else {
            st = run_chunk(&g, g.window + n, 1, n);
            n++;
        }
    }
out:
    teardown(&g);
    return st;
}
