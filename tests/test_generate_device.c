/* test_generate_device.c — fr_generate on an OpenCL device against the CPU.
 *
 * The same GPT (test_generate.c's, context 16, two blocks, tied head; the
 * same seed gives both contexts the same weights) generates greedily on the
 * CPU and on device 0, under both rules past the context and for a prompt
 * longer than it: (a) the tokens are identical and every step's logits
 * agree within LOGIT_TOL. Bound: the device sums the same products in
 * another order (ATTENTION_KV a key at a time, CLBlast's GEMMs) with exp
 * from another library; a float32 sum of n terms reassociated moves by
 * about n 2^-24 of its terms' magnitudes, here n <= C + T = 40 through six
 * layers of O(1) values, about 1e-5 of a logit: LOGIT_TOL 1e-4 allows ten
 * times that (the CPU's cache against its own tiled kernel uses the same
 * bound in test_generate.c). The largest difference and the smallest top-1
 * margin are printed; a margin below the difference would make the tokens
 * differ, and the test says so. (b) On each backend the memory generation
 * holds equals fr_generate_predict's, category by category (kv_cache and
 * workspace; on the device also the weights' copy and the ids), measured
 * as allocated_peak of the backend's memory from zero, and nothing is left
 * allocated after. Returns 77 without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "cl_device.h"
#include "infer/generate.h"
#include "core/mem.h"
#include "model/model.h"
#include "model/modelfile.h"
#include "gen_model.h" /* last: its T, V, C are macros */

#define MAXGEN 64
#define LOGIT_TOL 1e-4

typedef struct seen {
    int n, n_logits;
    int32_t tok[MAXGEN];
    float logits[MAXGEN][V];
} seen;

static void on_token(void *user, int32_t tok) {
    seen *s = user;
    if (s->n < MAXGEN) s->tok[s->n] = tok;
    s->n++;
}

static void on_logits(void *user, const float *z, int vocab) {
    seen *s = user;
    if (vocab == V && s->n_logits < MAXGEN) memcpy(s->logits[s->n_logits], z, sizeof s->logits[0]);
    s->n_logits++;
}

static fr_model *parse_init(fr_ctx *ctx) {
    fr_model *m = fr_model_parse(ctx, "gpt-test", gpt_text, strlen(gpt_text));
    CHECK(m != NULL, "parse: %s", fr_last_error(ctx));
    if (m && fr_model_init(m, 42)) {
        CHECK(0, "init: %s", fr_last_error(ctx));
        fr_model_free(m);
        m = NULL;
    }
    return m;
}

/* The memory fr_generate's context takes from: the device's, or the host's. */
static void stats(fr_ctx *ctx, int dev, fr_mem_stats *st) {
    if (dev) fr_mem_stats_of(fr_cl_memory(ctx), st);
    else fr_mem_get_stats(ctx, st);
}

/* Generates on m (its context's backend), checking (b) on the way. */
static int run(fr_model *m, int dev, const int32_t *prompt, int np, int tokens, int slide, seen *s,
               const char *what) {
    fr_ctx *ctx = m->ctx;
    memset(s, 0, sizeof *s);
    fr_gen_opts o = {.tokens = tokens,
                     .temperature = 0.0,
                     .window_slide = slide,
                     .emit = on_token,
                     .logits = on_logits,
                     .user = s};
    size_t want[FR_MEM_CAT_COUNT];
    fr_status st = fr_generate_predict(m, np, &o, want);
    CHECK(!st, "%s: predict: %s", what, fr_last_error(ctx));
    fr_mem_stats before, after;
    if (dev) fr_mem_reset_peak_of(fr_cl_memory(ctx));
    else fr_mem_reset_peak(ctx);
    stats(ctx, dev, &before);
    if (!st) st = fr_generate(m, prompt, np, &o, NULL);
    CHECK(!st && s->n == tokens && s->n_logits == tokens, "%s: generate: %d tokens: %s", what, s->n,
          st ? fr_last_error(ctx) : "ok");
    if (st) return 0;
    stats(ctx, dev, &after);
    const fr_mem_cat cats[] = {FR_MEM_KV_CACHE, FR_MEM_WORKSPACE, FR_MEM_PARAMS, FR_MEM_DATA};
    for (int i = 0; i < (dev ? 4 : 2); i++) {
        fr_mem_cat c = cats[i];
        size_t got = after.allocated_peak[c] - before.allocated[c];
        CHECK(got == want[c], "%s on the %s: %s peak measured %zu, predicted %zu", what,
              dev ? "device" : "cpu", fr_mem_cat_name(c), got, want[c]);
        CHECK(after.allocated[c] == before.allocated[c], "%s: %s left allocated: %zu", what,
              fr_mem_cat_name(c), after.allocated[c] - before.allocated[c]);
    }
    CHECK(want[FR_MEM_KV_CACHE] == (size_t)2 * NLAYER * T * C * sizeof(float),
          "%s: the caches are 2 x layers x T x C floats: %zu", what, want[FR_MEM_KV_CACHE]);
    printf("%s on the %s: kv_cache %zu, workspace %zu, parameters %zu, data %zu bytes, as "
           "predicted\n",
           what, dev ? "device" : "cpu", want[FR_MEM_KV_CACHE], want[FR_MEM_WORKSPACE],
           want[FR_MEM_PARAMS], want[FR_MEM_DATA]);
    return 1;
}

/* (a) */
static void compare(fr_model *cpu, fr_model *dev, const int32_t *prompt, int np, int tokens,
                    int slide, const char *what) {
    seen *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    if (run(cpu, 0, prompt, np, tokens, slide, a, what) &&
        run(dev, 1, prompt, np, tokens, slide, b, what)) {
        double worst = 0, gap = INFINITY;
        int same = 0;
        while (same < tokens && a->tok[same] == b->tok[same]) same++;
        for (int i = 0; i < same; i++) { /* the logits of steps made from the same window */
            int top = a->tok[i];
            for (int v = 0; v < V; v++) {
                worst = fmax(worst, fabs((double)a->logits[i][v] - b->logits[i][v]));
                if (v != top) gap = fmin(gap, (double)a->logits[i][top] - a->logits[i][v]);
            }
        }
        CHECK(same == tokens,
              "%s: token %d: the device made %d, the cpu %d (smallest top-1 margin before "
              "it %.3g, largest logit difference %.3g)",
              what, same, same < tokens ? b->tok[same] : -1, same < tokens ? a->tok[same] : -1, gap,
              worst);
        CHECK(worst <= LOGIT_TOL, "%s: device logits differ from the cpu's by %.3g (bound %g)",
              what, worst, LOGIT_TOL);
        printf("%s: %d tokens identical, max |logit device - cpu| %.3g, smallest top-1 margin "
               "%.3g\n",
               what, same, worst, gap);
    }
    free(a);
    free(b);
}

int main(void) {
    fr_ctx *dctx = cl_device_ctx();
    if (!dctx) return 77;
    fr_ctx *cctx = fr_ctx_new();
    fr_set_threads(cctx, 2);
    fr_model *cpu = parse_init(cctx), *dev = parse_init(dctx);
    if (cpu && dev) {
        int32_t prompt[T + 5];
        for (int i = 0; i < T + 5; i++) prompt[i] = (int32_t)((11 * i + 5) % V);
        compare(cpu, dev, prompt, 5, 40, 0, "half, prompt 5, 40 tokens");
        compare(cpu, dev, prompt, 3, 30, 1, "slide, prompt 3, 30 tokens");
        compare(cpu, dev, prompt, T + 5, 12, 0, "prompt longer than the context");
        compare(cpu, dev, prompt, 1, 1, 0, "prompt 1, 1 token");
    }
    fr_model_free(dev);
    fr_model_free(cpu);
    fr_mem_stats st;
    fr_mem_stats_of(fr_cl_memory(dctx), &st);
    CHECK(st.allocated_total == 0, "%zu device bytes still allocated", st.allocated_total);
    fr_cl_unuse(dctx);
    fr_ctx_free(dctx);
    fr_ctx_free(cctx);
    return check_done();
}
#endif
