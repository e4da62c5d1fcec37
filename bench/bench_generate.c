/* bench_generate.c — what a new token costs with the KV cache as the
 * sequence grows: gpt-tiny (or the model named in argv[1]) with fresh
 * weights, a one-token prompt, greedy, context - 1 new tokens, and the time
 * between consecutive tokens (one cached step at position p) recorded per
 * position. Prints the median step time around context/8 and around
 * context - 1 and their ratio: with the cache the attention part grows
 * linearly in p and everything else is constant, so the ratio stays far
 * below the (T/(T/8))^2 = 64 of recomputing the whole window each token.
 *
 * The model "long" is a narrow GPT with a long context (2048 positions, d_model
 * 64, 2 layers), where attention is most of a token's work, so the linear
 * growth shows: about (T - 1) / (T / 8) = 8 for the attention part.
 *
 *   build/bench_generate [model|long] [threads] [repeats]   (defaults gpt-tiny 1 5) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/generate.h"
#include "model/modelfile.h"

#define MAXT 4096

typedef struct clock_log {
    double last;
    int n;
    double step[MAXT]; /* step[p]: seconds from the token at position p - 1 to the one at p */
} clock_log;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tick(void *user, int32_t tok) {
    (void)tok;
    clock_log *c = user;
    double t = now();
    if (c->n < MAXT) c->step[c->n] = t - c->last;
    c->n++;
    c->last = t;
}

static const char *long_text = "input tokens 2048\n"
                               "embedding 256 64 std=0.1 name=wte\n"
                               "pos_embedding 2048 std=0.1 name=wpe\n"
                               "repeat 2 name=h\n"
                               "  residual\n"
                               "    layernorm 64 name=ln_1\n"
                               "    linear 192 std=0.1 name=attn.c_attn\n"
                               "    attention heads=4\n"
                               "    linear 64 std=0.1 name=attn.c_proj\n"
                               "  end\n"
                               "  residual\n"
                               "    layernorm 64 name=ln_2\n"
                               "    linear 256 std=0.1 name=mlp.c_fc\n"
                               "    gelu approximate=tanh\n"
                               "    linear 64 std=0.1 name=mlp.c_proj\n"
                               "  end\n"
                               "end\n"
                               "layernorm 64 name=ln_f\n"
                               "linear 256 bias=false tie=wte name=lm_head\n";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* OpenBLAS on the core the CPU calls for (frugal.h) */
    const char *name = argc > 1 ? argv[1] : "gpt-tiny";
    int threads = argc > 2 ? atoi(argv[2]) : 1, reps = argc > 3 ? atoi(argv[3]) : 5;
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, threads);
    fr_model *m = strcmp(name, "long") ? fr_model_load(ctx, name)
                                       : fr_model_parse(ctx, "long", long_text, strlen(long_text));
    if (!m || fr_model_init(m, 1)) {
        fprintf(stderr, "bench_generate: %s\n", fr_last_error(ctx));
        return 1;
    }
    const int T = fr_model_context(m);
    if (T < 16 || T > MAXT) {
        fprintf(stderr, "bench_generate: context %d outside [16, %d]\n", T, MAXT);
        return 1;
    }
    static clock_log c;
    static double early[MAXT], late[MAXT];
    int ne = 0, nl = 0;
    const int w = T / 32 > 2 ? T / 32 : 2; /* positions either side of the two points */
    for (int r = 0; r < reps; r++) {
        int32_t prompt = 10;
        fr_gen_opts o = {.tokens = T, .temperature = 0.0, .emit = tick, .user = &c};
        memset(&c, 0, sizeof c);
        c.last = now();
        if (fr_generate(m, &prompt, 1, &o, NULL)) {
            fprintf(stderr, "bench_generate: %s\n", fr_last_error(ctx));
            return 1;
        }
        /* token i (0-based) came from the step that ran position i (token i-1
         * entered at position i); token 0 from the prefill */
        for (int p = T / 8 - w; p <= T / 8 + w; p++) early[ne++] = c.step[p];
        for (int p = T - 1 - 2 * w; p <= T - 1; p++) late[nl++] = c.step[p];
    }
    double e = median(early, ne), l = median(late, nl);
    printf("%s, context %d, %d threads, %d runs: a token at position ~%d: %.3f ms, at ~%d: %.3f "
           "ms, ratio %.2f (O(T^2) per token would be %.0f)\n",
           name, T, fr_get_threads(ctx), reps, T / 8, 1e3 * e, T - 1, 1e3 * l, l / e,
           (double)(T - 1) * (T - 1) / ((double)(T / 8) * (T / 8)));
    fr_model_free(m);
    fr_ctx_free(ctx);
    return 0;
}
