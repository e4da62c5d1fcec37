/* test_generate.c — fr_generate against the full forward pass.
 *
 * The reference for every new token is an eval fr_step on the whole window
 * (batch 1, the tiled causal attention over all positions at once, no
 * cache): the logits at the window's last position, and their argmax. The
 * window follows generate.h's rule by hand: the prompt's last T tokens, one
 * token appended per step, and when T are held the last T/2 (with the new
 * one) start again at position 0. Positions after the window's end are
 * padding, which causal attention keeps out of the rows read.
 *
 * Checks: (a) greedy tokens equal the reference argmax at every step,
 * across several context wraps and for a prompt longer than the context,
 * and the logits agree within 1e-4 (the cache sums in another order than
 * the tiled kernel), for a GPT and for a model of the other kinds walked; (b) a seed gives the same tokens every time, another
 * seed other ones, top-k 1 is greedy, top-k 3 draws among the 3 largest;
 * (c) the kv_cache category holds 2 layers x 2 (K, V) x T x C x 4 bytes
 * while generating and 0 after; (d) bad models and inputs fail with a
 * message, and every allocation failing in turn fails cleanly, leaking
 * nothing; (e) the two rules past the context against a float64 GPT written
 * out in this file: window_slide 1 decodes as nanoGPT (the last T tokens
 * at positions 0.. at every step), the default as generate.h says (the last
 * T/2, positions restarted), both with the same cache bytes, and the two
 * agree exactly until the first window move; (f) fr_generate_predict's
 * kv_cache and workspace bytes are the peaks the run measures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/ctx.h"
#include "infer/generate.h"
#include "model/model.h"
#include "model/modelfile.h"
#include "train/step.h"
#include "gen_model.h" /* last: its T, V, C are macros */

#define MAXGEN 64
#define LOGIT_TOL 1e-4

/* Other kinds on the way: exact GELU, ReLU, dropout (eval: passes its input
 * on), an untied head with a bias, one attention layer with 3 heads. */
static const char *other_text = "input tokens 16\n"
                                "embedding 37 30 std=0.5 name=wte\n"
                                "pos_embedding 16 std=0.5 name=wpe\n"
                                "dropout 0.2\n"
                                "residual\n"
                                "  layernorm 30 name=ln_1\n"
                                "  linear 90 std=0.4 name=qkv\n"
                                "  attention heads=3\n"
                                "  linear 30 std=0.3 name=proj\n"
                                "  dropout 0.2\n"
                                "end\n"
                                "residual\n"
                                "  layernorm 30 name=ln_2\n"
                                "  linear 60 std=0.3 name=fc\n"
                                "  gelu\n"
                                "  linear 30 std=0.3 name=fc2\n"
                                "  relu\n"
                                "end\n"
                                "layernorm 30 name=ln_f\n"
                                "linear 37 std=0.5 name=head\n"
                                "loss cross_entropy\n";

static fr_model *parse_init(fr_ctx *ctx, const char *text, uint64_t seed) {
    fr_model *m = fr_model_parse(ctx, "gpt-test", text, strlen(text));
    CHECK(m != NULL, "parse: %s", fr_last_error(ctx));
    if (m && fr_model_init(m, seed)) {
        CHECK(0, "init: %s", fr_last_error(ctx));
        fr_model_free(m);
        m = NULL;
    }
    return m;
}

/* What the callbacks saw. */
typedef struct seen {
    fr_ctx *ctx;
    int n, n_logits;
    int32_t tok[MAXGEN];
    float logits[MAXGEN][V];
    size_t kv_bytes[MAXGEN];
    int top3_ok; /* every token among the 3 largest logits of its step */
} seen;

static void on_token(void *user, int32_t tok) {
    seen *s = user;
    fr_mem_stats st;
    fr_mem_get_stats(s->ctx, &st);
    if (s->n < MAXGEN) {
        s->kv_bytes[s->n] = st.allocated[FR_MEM_KV_CACHE];
        s->tok[s->n] = tok;
    }
    s->n++;
}

static void on_logits(void *user, const float *z, int vocab) {
    seen *s = user;
    if (vocab == V && s->n_logits < MAXGEN) memcpy(s->logits[s->n_logits], z, sizeof s->logits[0]);
    s->n_logits++;
}

static fr_status gen_window(fr_model *m, const int32_t *prompt, int n_prompt, int tokens,
                            double temp, int top_k, uint64_t seed, int slide, seen *s,
                            int *cropped) {
    memset(s, 0, sizeof *s);
    s->ctx = m->ctx;
    fr_gen_opts o = {.tokens = tokens,
                     .temperature = temp,
                     .top_k = top_k,
                     .seed = seed,
                     .window_slide = slide,
                     .emit = on_token,
                     .logits = on_logits,
                     .user = s};
    return fr_generate(m, prompt, n_prompt, &o, cropped);
}

static fr_status gen(fr_model *m, const int32_t *prompt, int n_prompt, int tokens, double temp,
                     int top_k, uint64_t seed, seen *s, int *cropped) {
    return gen_window(m, prompt, n_prompt, tokens, temp, top_k, seed, 0, s, cropped);
}

/* The full forward on a window of n <= T tokens: the last position's logits. */
static int full_logits(fr_step *e, const int32_t *window, int n, float *z) {
    int32_t idx[T] = {0}, y[T] = {0};
    memcpy(idx, window, (size_t)n * sizeof *idx);
    for (int i = n; i < T; i++) idx[i] = (int32_t)((7 * i + 3) % V); /* padding after the end */
    fr_batch b = {.n = 1, .idx = idx, .y = y};
    float loss;
    if (fr_step_run(e, &b, &loss, NULL)) return -1;
    const float *all = e->ex.ptr[e->g.logits]; /* (1, T, V) */
    memcpy(z, all + (size_t)(n - 1) * V, V * sizeof *z);
    return 0;
}

static int argmax(const float *z) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (z[i] > z[b]) b = i;
    return b;
}

/* (a): greedy generation against the full forward, step by step. */
static void test_greedy(fr_ctx *ctx, fr_model *m, fr_step *e, const int32_t *prompt, int n_prompt,
                        int tokens, const char *what) {
    seen *s = calloc(1, sizeof *s);
    int cropped = -1;
    fr_status st = gen(m, prompt, n_prompt, tokens, 0.0, 0, 1, s, &cropped);
    CHECK(!st, "%s: fr_generate: %s", what, fr_last_error(ctx));
    CHECK(s->n == tokens && s->n_logits == tokens, "%s: %d tokens, %d logits, want %d", what, s->n,
          s->n_logits, tokens);
    int expect_crop = n_prompt > T ? n_prompt - T : 0;
    CHECK(cropped == expect_crop, "%s: cropped %d, want %d", what, cropped, expect_crop);
    int32_t window[T + 1];
    int n = n_prompt > T ? T : n_prompt, wraps = 0, mismatches = 0;
    memcpy(window, prompt + (n_prompt - n), (size_t)n * sizeof *window);
    double worst = 0, min_gap = INFINITY;
    for (int i = 0; i < tokens && i < s->n && !st; i++) {
        float z[V];
        if (full_logits(e, window, n, z)) {
            CHECK(0, "%s: reference forward: %s", what, fr_last_error(ctx));
            break;
        }
        int want = argmax(z);
        for (int v = 0; v < V; v++) {
            double d = fabs((double)z[v] - s->logits[i][v]);
            if (d > worst) worst = d;
            if (v != want && z[want] - z[v] < min_gap) min_gap = z[want] - z[v];
        }
        mismatches += s->tok[i] != want;
        CHECK(s->tok[i] == want, "%s: token %d: generated %d, full forward's argmax %d", what, i,
              s->tok[i], want);
        window[n] = want;
        if (n == T) {
            memmove(window, window + T + 1 - T / 2, (T / 2) * sizeof *window);
            n = T / 2;
            wraps++;
        } else n++;
    }
    CHECK(worst <= LOGIT_TOL, "%s: logits differ from the full forward by %g (tolerance %g)", what,
          worst, LOGIT_TOL);
    printf("%s: %d tokens, %d context wraps, %d argmax mismatches, max |logit diff| %.3g, "
           "smallest top-1 margin %.3g\n",
           what, tokens, wraps, mismatches, worst, min_gap);
    free(s);
}

/* ---- (e): a float64 GPT, the reference decode of both window rules ----
 * gpt_text's GPT written out from its parameters, found by their state_dict
 * names (nanoGPT's): x = wte[tok] + wpe[0..n); per block x += proj(attn(
 * ln_1(x))), x += fc2(gelu_tanh(fc(ln_2(x)))); logits = ln_f(x) wte^T. The
 * attention is the textbook one (scores q.k / sqrt(HS), masked to u <= t, a
 * softmax, the weighted values), nothing of the tiled kernel or the cache. */
#define NH 4
#define HS (C / NH)
#define FF (4 * C)
#define REF_TOL 1e-4 /* |logit f32 - logit f64| */

typedef struct ref_block {
    const float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
} ref_block;

typedef struct ref_gpt {
    const float *wte, *wpe, *lnf_w, *lnf_b;
    ref_block h[NLAYER];
} ref_gpt;

/* The parameter named fmt (with the block's number), checked for its size. */
static const float *ref_param(const fr_model *m, const char *fmt, int block, int64_t numel,
                              int *missing) {
    char name[FR_ST_NAME_MAX];
    snprintf(name, sizeof name, fmt, block);
    for (size_t i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) {
            const fr_param *p = &m->params[i];
            int64_t n = 1;
            for (int d = 0; d < p->shape.ndim; d++) n *= p->shape.d[d];
            if (n == numel && p->dtype == FR_F32) return p->data;
            CHECK(0, "reference: %s has %lld elements, want %lld", name, (long long)n,
                  (long long)numel);
            ++*missing;
            return NULL;
        }
    CHECK(0, "reference: the model has no parameter %s", name);
    ++*missing;
    return NULL;
}

static int ref_bind(const fr_model *m, ref_gpt *r) {
    int miss = 0;
    r->wte = ref_param(m, "wte.weight", 0, V * C, &miss);
    r->wpe = ref_param(m, "wpe.weight", 0, T * C, &miss);
    r->lnf_w = ref_param(m, "ln_f.weight", 0, C, &miss);
    r->lnf_b = ref_param(m, "ln_f.bias", 0, C, &miss);
    for (int l = 0; l < NLAYER; l++) {
        ref_block *b = &r->h[l];
        b->ln1_w = ref_param(m, "h.%d.ln_1.weight", l, C, &miss);
        b->ln1_b = ref_param(m, "h.%d.ln_1.bias", l, C, &miss);
        b->attn_w = ref_param(m, "h.%d.attn.c_attn.weight", l, 3 * C * C, &miss);
        b->attn_b = ref_param(m, "h.%d.attn.c_attn.bias", l, 3 * C, &miss);
        b->proj_w = ref_param(m, "h.%d.attn.c_proj.weight", l, C * C, &miss);
        b->proj_b = ref_param(m, "h.%d.attn.c_proj.bias", l, C, &miss);
        b->ln2_w = ref_param(m, "h.%d.ln_2.weight", l, C, &miss);
        b->ln2_b = ref_param(m, "h.%d.ln_2.bias", l, C, &miss);
        b->fc_w = ref_param(m, "h.%d.mlp.c_fc.weight", l, FF * C, &miss);
        b->fc_b = ref_param(m, "h.%d.mlp.c_fc.bias", l, FF, &miss);
        b->fc2_w = ref_param(m, "h.%d.mlp.c_proj.weight", l, C * FF, &miss);
        b->fc2_b = ref_param(m, "h.%d.mlp.c_proj.bias", l, C, &miss);
    }
    return miss == 0;
}

// x (C) -> y (C) = (x - mean) / sqrt(var + 1e-5) w + b, var the biased one
static void ref_layernorm(const double *x, const float *w, const float *b, double *y) {
    double mean = 0, var = 0;
    for (int c = 0; c < C; c++) mean += x[c];
    mean /= C;
    for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    var /= C;
    for (int c = 0; c < C; c++) y[c] = (x[c] - mean) / sqrt(var + 1e-5) * w[c] + b[c];
}

// x (K) -> y (N) = W x + b, W (N, K) as PyTorch's Linear keeps it
static void ref_linear(const double *x, const float *W, const float *b, int N, int K, double *y) {
    for (int o = 0; o < N; o++) {
        double acc = b ? b[o] : 0.0;
        for (int k = 0; k < K; k++) acc += (double)W[(size_t)o * K + k] * x[k];
        y[o] = acc;
    }
}

static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* The logits z (V) at the last of tok[0..n) (n <= T), run at positions 0..n-1. */
static void ref_logits(const ref_gpt *r, const int32_t *tok, int n, double *z) {
    static double x[T][C], h[T][C], qkv[T][3 * C], y[T][C], f[T][FF], o[C];
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++)
            x[t][c] = (double)r->wte[tok[t] * C + c] + (double)r->wpe[t * C + c];
    for (int l = 0; l < NLAYER; l++) {
        const ref_block *b = &r->h[l];
        for (int t = 0; t < n; t++) {
            ref_layernorm(x[t], b->ln1_w, b->ln1_b, h[t]);
            ref_linear(h[t], b->attn_w, b->attn_b, 3 * C, C, qkv[t]);
        }
        for (int t = 0; t < n; t++)
            for (int hd = 0; hd < NH; hd++) { /* q at [hd HS], k at C + hd HS, v at 2C + hd HS */
                double s[T], mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    s[u] = 0;
                    for (int j = 0; j < HS; j++)
                        s[u] += qkv[t][hd * HS + j] * qkv[u][C + hd * HS + j];
                    s[u] /= sqrt((double)HS);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++) sum += (s[u] = exp(s[u] - mx));
                for (int j = 0; j < HS; j++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++) acc += s[u] / sum * qkv[u][2 * C + hd * HS + j];
                    y[t][hd * HS + j] = acc;
                }
            }
        for (int t = 0; t < n; t++) {
            ref_linear(y[t], b->proj_w, b->proj_b, C, C, o);
            for (int c = 0; c < C; c++) x[t][c] += o[c];
            ref_layernorm(x[t], b->ln2_w, b->ln2_b, h[t]);
            ref_linear(h[t], b->fc_w, b->fc_b, FF, C, f[t]);
            for (int k = 0; k < FF; k++) f[t][k] = ref_gelu_tanh(f[t][k]);
            ref_linear(f[t], b->fc2_w, b->fc2_b, C, FF, o);
            for (int c = 0; c < C; c++) x[t][c] += o[c];
        }
    }
    ref_layernorm(x[n - 1], r->lnf_w, r->lnf_b, o);
    ref_linear(o, r->wte, NULL, V, C, z); /* the head tied to wte */
}

/* Greedy decoding under one window rule against the float64 GPT. The
 * reference's window, from the whole sequence so far (prompt, then the
 * tokens made):
 *   slide (nanoGPT): its last min(len, T) tokens, at positions 0..;
 *   half (the default, generate.h): the prompt's last T tokens; a token
 *     made when T are held starts a new window of the last T/2 (itself
 *     included) at position 0, which then grows one token a step again.
 * Each step: the logits within REF_TOL of the reference's, and the token its
 * argmax wherever the top two differ by more than 2 REF_TOL (elsewhere a
 * near tie: the token's reference logit within 2 REF_TOL of the top). The
 * sequence goes on with the token made, which is the reference's own choice
 * at every step with a clear margin. *out gets the tokens. */
static void test_window(fr_ctx *ctx, fr_model *m, const ref_gpt *r, const int32_t *prompt,
                        int n_prompt, int tokens, int slide, int32_t *out, const char *what) {
    seen *s = calloc(1, sizeof *s);
    int32_t seq[T + 5 + MAXGEN];
    int cropped = -1;
    fr_status st = gen_window(m, prompt, n_prompt, tokens, 0.0, 0, 1, slide, s, &cropped);
    CHECK(!st && s->n == tokens && s->n_logits == tokens,
          "%s: fr_generate: %d tokens, %d logits: %s", what, s->n, s->n_logits,
          st ? fr_last_error(ctx) : "ok");
    CHECK(cropped == (n_prompt > T ? n_prompt - T : 0), "%s: cropped %d", what, cropped);
    const size_t kv = (size_t)2 * NLAYER * T * C * sizeof(float);
    int len = n_prompt, start = n_prompt > T ? n_prompt - T : 0; /* the window: seq[start, len) */
    int crops = 0, ties = 0, kv_ok = 0;
    double worst = 0, min_gap = INFINITY;
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    for (int i = 0; i < tokens && i < s->n && !st; i++) {
        double z[V];
        ref_logits(r, seq + start, len - start, z);
        int want = 0;
        for (int v = 1; v < V; v++)
            if (z[v] > z[want]) want = v;
        double gap = INFINITY, d = 0;
        for (int v = 0; v < V; v++) {
            if (v != want) gap = fmin(gap, z[want] - z[v]);
            d = fmax(d, fabs((double)s->logits[i][v] - z[v]));
        }
        worst = fmax(worst, d);
        min_gap = fmin(min_gap, gap);
        CHECK(d <= REF_TOL,
              "%s: token %d (window [%d, %d) of the sequence): logits differ from "
              "the float64 GPT's by %g (tolerance %g)",
              what, i, start, len, d, REF_TOL);
        const int32_t tok = s->tok[i];
        if (gap > 2 * REF_TOL)
            CHECK(tok == want,
                  "%s: token %d: generated %d, the float64 GPT's argmax %d (margin %g)", what, i,
                  tok, want, gap);
        else {
            ties++;
            CHECK(tok >= 0 && tok < V && z[tok] >= z[want] - 2 * REF_TOL,
                  "%s: token %d: generated %d, not within %g of the float64 GPT's top (%d)", what,
                  i, tok, 2 * REF_TOL, want);
        }
        kv_ok += s->kv_bytes[i] == kv;
        seq[len++] = tok;
        if (slide) {
            if (len - T > start) crops++;
            start = len > T ? len - T : 0;
        } else if (len - start > T) {
            start = len - T / 2;
            crops++;
        }
    }
    CHECK(kv_ok == tokens, "%s: kv_cache held %zu bytes at %d of %d tokens", what, kv, kv_ok,
          tokens);
    memcpy(out, s->tok, (size_t)tokens * sizeof *out);
    printf("%s: %d tokens, %d window moves, max |logit - float64| %.3g, smallest top-1 margin "
           "%.3g, %d near ties\n",
           what, tokens, crops, worst, min_gap, ties);
    free(s);
}

/* (e) */
static void test_windows(fr_ctx *ctx, fr_model *m, const int32_t *prompt) {
    ref_gpt r;
    if (!ref_bind(m, &r)) return;
    int32_t slide[MAXGEN], half[MAXGEN];
    const int np = 5, n = 60; /* the window passes T at token T - np + 1, then 3 contexts more */
    test_window(ctx, m, &r, prompt, np, n, 1, slide, "slide, prompt 5, 60 tokens");
    test_window(ctx, m, &r, prompt, np, n, 0, half, "half, prompt 5, 60 tokens");
    /* the two agree while the sequence fits the context (tokens 0 .. T - np,
     * the last one made from a full window), and no further */
    int same = 0;
    while (same < n && slide[same] == half[same]) same++;
    CHECK(same == T - np + 1,
          "slide and half agree on the first %d tokens, want %d (the first "
          "window move is at token %d)",
          same, T - np + 1, T - np + 1);
    printf("slide and half: the first %d of %d tokens equal\n", same, n);
    int32_t tmp[MAXGEN];
    test_window(ctx, m, &r, prompt, T + 5, 40, 1, tmp, "slide, prompt longer than the context");
    test_window(ctx, m, &r, prompt, T, 40, 1, tmp, "slide, prompt = context");
    test_window(ctx, m, &r, prompt, 1, 40, 1, tmp, "slide, prompt 1");
    fr_set_threads(ctx, 1);
    test_window(ctx, m, &r, prompt, 3, 40, 1, tmp, "slide, 1 thread");
    fr_set_threads(ctx, 2);
    test_window(ctx, m, &r, prompt, T + 5, 40, 0, tmp, "half, prompt longer than the context");
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* (d) */
static void test_bad(fr_ctx *ctx, fr_model *m) {
    seen *s = calloc(1, sizeof *s);
    int32_t p[3] = {1, 2, 3};
    fr_status st;

    p[1] = V;
    st = gen(m, p, 3, 4, 0.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "prompt token 1 is id 37") &&
              contains(fr_last_error(ctx), "[0, 37)"),
          "an id >= the vocabulary: %d '%s'", st, fr_last_error(ctx));
    p[1] = -1;
    st = gen(m, p, 3, 4, 0.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "id -1"), "a negative id: '%s'",
          fr_last_error(ctx));
    p[1] = 2;
    st = gen(m, p, 0, 4, 0.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "prompt is empty"),
          "an empty prompt: '%s'", fr_last_error(ctx));
    st = gen(m, p, 3, 4, -1.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "temperature -1"),
          "a negative temperature: '%s'", fr_last_error(ctx));
    st = gen(m, p, 3, 4, NAN, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG, "a NaN temperature is refused");
    st = gen(m, p, 3, -2, 1.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "tokens -2"), "negative tokens: '%s'",
          fr_last_error(ctx));
    st = gen(m, p, 3, 0, 1.0, 0, 1, s, NULL);
    CHECK(st == FR_OK && s->n == 0, "zero tokens: nothing emitted, no error");
    st = gen_window(m, p, 3, 4, 0.0, 0, 1, 2, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "window_slide 2"),
          "window_slide 2: '%s'", fr_last_error(ctx));

    /* a model without token input */
    fr_model *mlp = fr_model_new(ctx, 8, 1, 1);
    CHECK(mlp && !fr_model_linear(mlp, 4, 1) && !fr_model_init(mlp, 1), "an MLP");
    st = gen(mlp, p, 3, 4, 0.0, 0, 1, s, NULL);
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "does not read tokens"),
          "a model without token input: '%s'", fr_last_error(ctx));
    fr_model_free(mlp);

    /* no weights: parsed, neither initialised nor loaded */
    fr_model *bare = fr_model_parse(ctx, "gpt-test", gpt_text, strlen(gpt_text));
    st = bare ? gen(bare, p, 3, 4, 0.0, 0, 1, s, NULL) : FR_ERR_NOMEM;
    CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "no weights"),
          "a model without weights: '%s'", fr_last_error(ctx));
    /* 16-bit weights */
    if (bare && !fr_model_init(bare, 1) && !fr_model_to_dtype(bare, FR_F16)) {
        st = gen(bare, p, 3, 4, 0.0, 0, 1, s, NULL);
        CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "f16") &&
                  contains(fr_last_error(ctx), "f32"),
              "16-bit weights: '%s'", fr_last_error(ctx));
    } else CHECK(0, "half model: %s", fr_last_error(ctx));
    fr_model_free(bare);

    /* a kind generation does not run: a sigmoid in a token model */
    fr_model *odd = fr_model_new_tokens(ctx, T);
    fr_val x = odd ? fr_embedding(odd, FR_MODEL_INPUT, V, 8) : FR_NO_VAL;
    CHECK(x != FR_NO_VAL && !fr_model_sigmoid(odd), "a token model with a sigmoid: %s",
          fr_last_error(ctx));
    x = odd ? fr_linear(odd, fr_model_last_value(odd), V, 1) : FR_NO_VAL;
    if (odd && x != FR_NO_VAL && !fr_model_init(odd, 1)) {
        st = gen(odd, p, 3, 4, 0.0, 0, 1, s, NULL);
        CHECK(st == FR_ERR_ARG && contains(fr_last_error(ctx), "sigmoid"),
              "an unsupported kind: '%s'", fr_last_error(ctx));
    } else CHECK(0, "the sigmoid model: %s", fr_last_error(ctx));
    fr_model_free(odd);
    free(s);
}

/* Every allocation fr_generate makes fails in turn: an error, nothing held. */
static void test_alloc_failures(fr_ctx *ctx, fr_model *m) {
    seen *s = calloc(1, sizeof *s);
    int32_t p[4] = {3, 1, 4, 1};
    fr_mem_stats before, after;
    fr_mem_get_stats(ctx, &before);
    int failed = 0, leaks = 0, n;
    for (n = 1; n < 200; n++) {
        fr_mem_fail_at(ctx, (uint64_t)n);
        fr_status st = gen(m, p, 4, 20, 1.0, 5, 3, s, NULL);
        fr_mem_fail_at(ctx, 0);
        fr_mem_get_stats(ctx, &after);
        leaks += after.allocated_total != before.allocated_total;
        if (st == FR_OK) break;
        failed += st == FR_ERR_NOMEM;
    }
    CHECK(n > 1 && n < 200 && failed == n - 1,
          "each of the first %d allocations failing gives FR_ERR_NOMEM (%d did)", n - 1, failed);
    CHECK(!leaks, "%d failed runs left bytes allocated", leaks);
    free(s);
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = parse_init(ctx, gpt_text, 42);
    if (!m) return check_done();
    fr_step_opts so = {.batch = 1, .training = 0, .seed = 1};
    fr_step *e = fr_step_compile(m, &so);
    CHECK(e != NULL, "eval step: %s", fr_last_error(ctx));
    if (!e) return check_done();

    /* (a) greedy against the full forward */
    int32_t prompt[T + 5];
    for (int i = 0; i < T + 5; i++) prompt[i] = (int32_t)((11 * i + 5) % V);
    test_greedy(ctx, m, e, prompt, 5, 40, "prompt 5, 40 tokens");
    test_greedy(ctx, m, e, prompt, 1, 9, "prompt 1, 9 tokens");
    test_greedy(ctx, m, e, prompt, T, 12, "prompt = context, 12 tokens");
    test_greedy(ctx, m, e, prompt, T + 5, 12, "prompt longer than the context");
    fr_set_threads(ctx, 1);
    test_greedy(ctx, m, e, prompt, 3, 30, "1 thread");
    fr_set_threads(ctx, 2);
    fr_model *m2 = parse_init(ctx, other_text, 5);
    fr_step *e2 = m2 ? fr_step_compile(m2, &so) : NULL;
    CHECK(e2 != NULL, "eval step of the other model: %s", fr_last_error(ctx));
    if (e2) test_greedy(ctx, m2, e2, prompt, 4, 30, "gelu exact, relu, dropout, untied head");
    fr_step_free(e2);
    fr_model_free(m2);

    /* (b) sampling */
    seen *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *g = calloc(1, sizeof *g);
    CHECK(!gen(m, prompt, 3, 40, 1.0, 0, 7, a, NULL) && !gen(m, prompt, 3, 40, 1.0, 0, 7, b, NULL),
          "sampling: %s", fr_last_error(ctx));
    CHECK(!memcmp(a->tok, b->tok, sizeof a->tok), "the same seed gives the same tokens");
    CHECK(!gen(m, prompt, 3, 40, 1.0, 0, 8, b, NULL), "sampling: %s", fr_last_error(ctx));
    int differ = 0, greedy_like = 0;
    for (int i = 0; i < 40; i++) differ += a->tok[i] != b->tok[i];
    CHECK(differ > 0, "another seed gives other tokens");
    CHECK(!gen(m, prompt, 3, 40, 0.0, 0, 7, g, NULL), "greedy: %s", fr_last_error(ctx));
    for (int i = 0; i < 40; i++) greedy_like += a->tok[i] == g->tok[i];
    CHECK(greedy_like < 40, "temperature 1 is not greedy");
    CHECK(!gen(m, prompt, 3, 40, 1.0, 1, 9, b, NULL) && !memcmp(b->tok, g->tok, sizeof g->tok),
          "top-k 1 at temperature 1 is greedy");
    CHECK(!gen(m, prompt, 3, 40, 2.0, 3, 9, b, NULL), "top-k 3: %s", fr_last_error(ctx));
    int outside = 0, spread[3] = {0};
    for (int i = 0; i < 40; i++) { /* the token's rank among its step's logits */
        int rank = 0;
        for (int v = 0; v < V; v++) rank += b->logits[i][v] > b->logits[i][b->tok[i]];
        outside += rank >= 3;
        if (rank < 3) spread[rank]++;
    }
    CHECK(!outside, "top-k 3: %d tokens outside the 3 largest logits", outside);
    CHECK(spread[1] + spread[2] > 0, "top-k 3 at temperature 2 draws below the argmax too");
    printf("sampling: seeds 7 and 8 differ in %d of 40 tokens; top-3 ranks drawn %d/%d/%d\n",
           differ, spread[0], spread[1], spread[2]);

    /* (c) the cache's bytes */
    const size_t kv = (size_t)2 * NLAYER * T * C * sizeof(float);
    CHECK(!gen(m, prompt, 5, 30, 1.0, 0, 1, a, NULL), "kv: %s", fr_last_error(ctx));
    int exact = 0;
    for (int i = 0; i < 30; i++) exact += a->kv_bytes[i] == kv;
    CHECK(exact == 30, "kv_cache holds %zu bytes while generating (%d of 30 tokens; saw %zu)", kv,
          exact, a->kv_bytes[0]);
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated[FR_MEM_KV_CACHE] == 0 && ms.allocated_peak[FR_MEM_KV_CACHE] == kv,
          "kv_cache 0 after (%zu), peak %zu (want %zu)", ms.allocated[FR_MEM_KV_CACHE],
          ms.allocated_peak[FR_MEM_KV_CACHE], kv);
    CHECK(!strcmp(fr_mem_cat_name(FR_MEM_KV_CACHE), "kv_cache"), "the category is named kv_cache");
    /* (f) the plans' prediction is what the run holds: the caches and the
     * largest chunk's step values (three chunk sizes: 5, 1, and T/2 after
     * the window moves), measured from zero */
    for (int slide = 0; slide < 2; slide++) {
        fr_gen_opts po = {.tokens = 30, .temperature = 1.0, .seed = 1, .window_slide = slide};
        size_t want[FR_MEM_CAT_COUNT];
        fr_mem_stats m0, m1;
        CHECK(!fr_generate_predict(m, 5, &po, want), "predict: %s", fr_last_error(ctx));
        fr_mem_reset_peak(ctx);
        fr_mem_get_stats(ctx, &m0);
        CHECK(!fr_generate(m, prompt, 5, &po, NULL), "generate: %s", fr_last_error(ctx));
        fr_mem_get_stats(ctx, &m1);
        CHECK(want[FR_MEM_KV_CACHE] == kv, "predicted kv_cache %zu, want %zu",
              want[FR_MEM_KV_CACHE], kv);
        const fr_mem_cat cats[2] = {FR_MEM_WORKSPACE, FR_MEM_KV_CACHE};
        for (int k = 0; k < 2; k++) {
            const fr_mem_cat c = cats[k];
            CHECK(m1.allocated_peak[c] - m0.allocated[c] == want[c] && want[c] > 0,
                  "%s (window_slide %d): measured peak %zu, predicted %zu", fr_mem_cat_name(c),
                  slide, m1.allocated_peak[c] - m0.allocated[c], want[c]);
        }
        CHECK(want[FR_MEM_PARAMS] == 0 && want[FR_MEM_DATA] == 0,
              "the CPU reads the weights and ids in place: predicted %zu, %zu", want[FR_MEM_PARAMS],
              want[FR_MEM_DATA]);
        printf("window_slide %d: kv_cache %zu and workspace %zu bytes, measured as predicted\n",
               slide, want[FR_MEM_KV_CACHE], want[FR_MEM_WORKSPACE]);
    }
    free(a);
    free(b);
    free(g);

    /* (e) */
    test_windows(ctx, m, prompt);

    /* (d) */
    test_bad(ctx, m);
    test_alloc_failures(ctx, m);

    fr_step_free(e);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return check_done();
}
