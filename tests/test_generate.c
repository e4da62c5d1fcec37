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
 * nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/ctx.h"
#include "infer/generate.h"
#include "model/model.h"
#include "model/modelfile.h"
#include "train/step.h"

#define T 16 /* context */
#define V 37 /* vocabulary */
#define C 24 /* d_model */
#define NLAYER 2
#define MAXGEN 64
#define LOGIT_TOL 1e-4

static const char *gpt_text = "input tokens 16\n"
                              "embedding 37 24 std=0.5 name=wte\n"
                              "pos_embedding 16 std=0.5 name=wpe\n"
                              "repeat 2 name=h\n"
                              "  residual\n"
                              "    layernorm 24 name=ln_1\n"
                              "    linear 72 std=0.4 name=attn.c_attn\n"
                              "    attention heads=4\n"
                              "    linear 24 std=0.3 name=attn.c_proj\n"
                              "  end\n"
                              "  residual\n"
                              "    layernorm 24 name=ln_2\n"
                              "    linear 96 std=0.3 name=mlp.c_fc\n"
                              "    gelu approximate=tanh\n"
                              "    linear 24 std=0.3 name=mlp.c_proj\n"
                              "  end\n"
                              "end\n"
                              "layernorm 24 name=ln_f\n"
                              "linear 37 bias=false tie=wte name=lm_head\n"
                              "loss cross_entropy\n";

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

static fr_status gen(fr_model *m, const int32_t *prompt, int n_prompt, int tokens, double temp,
                     int top_k, uint64_t seed, seen *s, int *cropped) {
    memset(s, 0, sizeof *s);
    s->ctx = m->ctx;
    fr_gen_opts o = {.tokens = tokens,
                     .temperature = temp,
                     .top_k = top_k,
                     .seed = seed,
                     .emit = on_token,
                     .logits = on_logits,
                     .user = s};
    return fr_generate(m, prompt, n_prompt, &o, cropped);
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
    free(a);
    free(b);
    free(g);

    /* (d) */
    test_bad(ctx, m);
    test_alloc_failures(ctx, m);

    fr_step_free(e);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return check_done();
}
