/* test_generate_opts.c — issue 25's generation options on a Hugging Face
 * Llama (tests/data/hf/llama-tiny: 2 layers, 4 heads over 2 KV heads, head
 * dim 8, context 32), against PyTorch's greedy tokens in
 * llama-tiny.ref.safetensors (gen.prompt, gen.tokens: argmax of a full
 * forward per token, tests/ref/hf_ref.py) and against rules worked out by
 * hand:
 *   - stop: with stop_token the k-th greedy token (its first appearance),
 *     the run emits exactly the first k tokens and ends;
 *   - top_p: nucleus sampling keeps the likeliest tokens while the mass
 *     before each is below top_p, so top_p 1e-9 keeps the argmax alone and
 *     sampling at temperature 1 gives the greedy tokens for every seed; top_p
 *     1 (and 0) keep all: seeds then differ somewhere over 10 tokens of 64;
 *   - max_context: the KV cache holds max_context positions, so its bytes
 *     are 2 layers x (K, V) x 2 kv heads x max_context x 8 x 4 B (a GQA
 *     cache keeps the kv heads only), read from the prediction; the greedy
 *     tokens while the sequence fits are PyTorch's;
 *   - bad values: top_p outside [0, 1], max_context < 0, refused by name.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "model/model.h"

#define NEW 10

typedef struct sink {
    int32_t tok[64];
    int n;
} sink;

static void emit(void *u, int32_t t) {
    sink *s = u;
    if (s->n < 64) s->tok[s->n++] = t;
}

static int run(fr_model *m, const int32_t *p, int np, fr_gen_opts o, sink *s) {
    memset(s, 0, sizeof *s);
    o.emit = emit;
    o.user = s;
    int cropped = 0;
    return fr_generate(m, p, np, &o, &cropped);
}

int main(void) {
    const char *src = getenv("FR_SOURCE_DIR") ? getenv("FR_SOURCE_DIR") : ".";
    char dir[4096], ref[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/hf/llama-tiny", src);
    snprintf(ref, sizeof ref, "%s/tests/data/hf/llama-tiny.ref.safetensors", src);
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = fr_model_load(ctx, dir);
    CHECK(m != NULL, "load %s: %s", dir, fr_last_error(ctx));
    if (!m) return check_done();
    CHECK(fr_model_load_weights(m, dir) == FR_OK, "weights: %s", fr_last_error(ctx));
    fr_st_file f;
    CHECK(fr_st_read(ctx, ref, &f, FR_MEM_OTHER) == FR_OK, "%s: %s", ref, fr_last_error(ctx));
    const fr_st_entry *pe = fr_st_find(&f, "gen.prompt"), *te = fr_st_find(&f, "gen.tokens");
    CHECK(pe && te && pe->dtype == FR_I32 && te->dtype == FR_I32 && pe->shape.d[1] == 5 &&
              te->shape.d[1] == NEW,
          "gen.prompt / gen.tokens");
    int32_t prompt[2][5], want[2][NEW];
    fr_st_load(ctx, &f, pe, prompt);
    fr_st_load(ctx, &f, te, want);
    fr_st_close(ctx, &f);
    sink s;

    /* greedy equals PyTorch's (the base of what follows) */
    fr_gen_opts g = {.tokens = NEW, .temperature = 0.0};
    CHECK(run(m, prompt[0], 5, g, &s) == FR_OK && s.n == NEW &&
              !memcmp(s.tok, want[0], sizeof want[0]),
          "greedy: %s", fr_last_error(ctx));

    /* stop at the k-th greedy token's first appearance */
    for (int k = 1; k <= NEW; k++) {
        int first = 1;
        for (int i = 0; i < k - 1; i++) first &= want[0][i] != want[0][k - 1];
        if (!first) continue;
        fr_gen_opts o = g;
        o.stop = 1;
        o.stop_token = want[0][k - 1];
        CHECK(run(m, prompt[0], 5, o, &s) == FR_OK && s.n == k &&
                  !memcmp(s.tok, want[0], (size_t)k * sizeof(int32_t)),
              "stop at token %d (id %d): emitted %d", k, (int)o.stop_token, s.n);
    }

    /* top_p 1e-9: the argmax alone, whatever the seed */
    for (int p = 0; p < 2; p++)
        for (uint64_t seed = 0; seed < 3; seed++) {
            fr_gen_opts o = {.tokens = NEW, .temperature = 1.0, .top_p = 1e-9, .seed = seed};
            CHECK(run(m, prompt[p], 5, o, &s) == FR_OK && s.n == NEW &&
                      !memcmp(s.tok, want[p], sizeof want[p]),
                  "top_p 1e-9, prompt %d, seed %llu: not the greedy tokens", p,
                  (unsigned long long)seed);
        }
    /* top_p 1 keeps all: as top_p 0, and seeds differ */
    sink a, b;
    fr_gen_opts o1 = {.tokens = NEW, .temperature = 1.0, .top_p = 1.0, .seed = 1};
    fr_gen_opts o0 = o1;
    o0.top_p = 0.0;
    CHECK(run(m, prompt[0], 5, o1, &a) == FR_OK && run(m, prompt[0], 5, o0, &b) == FR_OK &&
              !memcmp(&a, &b, sizeof a),
          "top_p 1 and 0 both keep every token: the same draws");
    int differ = 0;
    for (uint64_t seed = 2; seed < 6 && !differ; seed++) {
        fr_gen_opts o = o1;
        o.seed = seed;
        CHECK(run(m, prompt[0], 5, o, &b) == FR_OK, "sampling: %s", fr_last_error(ctx));
        differ = memcmp(a.tok, b.tok, sizeof a.tok) != 0;
    }
    CHECK(differ, "sampling over the whole vocabulary gave seed 1's tokens for seeds 2..5");

    /* max_context 16: the caches hold 16 positions of the 2 kv heads */
    fr_gen_opts c = g;
    c.max_context = 16;
    size_t peak[FR_MEM_CAT_COUNT];
    CHECK(fr_generate_predict(m, 5, &c, peak) == FR_OK, "predict: %s", fr_last_error(ctx));
    CHECK(peak[FR_MEM_KV_CACHE] == (size_t)2 * 2 * 2 * 16 * 8 * 4,
          "kv cache of max_context 16: %zu bytes, by hand 2 layers x 2 x 2 heads x 16 x 8 x 4 = "
          "4096",
          peak[FR_MEM_KV_CACHE]);
    c.max_context = 0;
    CHECK(fr_generate_predict(m, 5, &c, peak) == FR_OK &&
              peak[FR_MEM_KV_CACHE] == (size_t)2 * 2 * 2 * 32 * 8 * 4,
          "kv cache of the context (32): %zu bytes", peak[FR_MEM_KV_CACHE]);
    c.max_context = 16; /* 5 + 10 = 15 positions fit: PyTorch's tokens */
    CHECK(run(m, prompt[1], 5, c, &s) == FR_OK && s.n == NEW &&
              !memcmp(s.tok, want[1], sizeof want[1]),
          "greedy under max_context 16");

    /* refusals */
    fr_gen_opts bad = g;
    bad.top_p = 1.5;
    CHECK(run(m, prompt[0], 5, bad, &s) == FR_ERR_ARG && strstr(fr_last_error(ctx), "top-p"),
          "top_p 1.5: %s", fr_last_error(ctx));
    bad = g;
    bad.max_context = -1;
    CHECK(run(m, prompt[0], 5, bad, &s) == FR_ERR_ARG && strstr(fr_last_error(ctx), "max context"),
          "max_context -1: %s", fr_last_error(ctx));
    fr_model_free(m);
    fr_ctx_free(ctx);
    return check_done();
}
