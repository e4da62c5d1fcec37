/* bench_step.c — time frugal's training step on synthetic data and report
 * the memory it took: median and mean ms/step, the engine's peak allocated
 * and reserved bytes, and the process's peak RSS (getrusage ru_maxrss).
 *
 *   bench_step --model NAME|FILE --batch B --optimizer sgd|adam|adamw
 *              --steps N --threads T [--warmup W] [--seed S] [--json]
 *
 * Inputs are uniform in [0, 1) and labels uniform in [0, classes), from a
 * fixed seed; a fresh batch is drawn before every step, outside the timed
 * region, into one buffer. W warm-up steps (3) run untimed before the N timed
 * ones. Peak RSS is per process, so measure each configuration in its own
 * process (bench/compare.sh does). bench/torch_step.py is its PyTorch twin and
 * prints the same JSON fields. It owns no engine code: only the public API,
 * plus model.h for the model's input shape. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "core/rng.h"
#define BENCH_NAME "bench_step"
#include "bench_util.h"
#include "frugal.h"
#include "model/model.h"

typedef struct bench_opts {
    const char *model, *optimizer, *precision, *state;
    int batch, steps, warmup, threads, json;
    uint64_t seed;
} bench_opts;

static size_t peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

static const char *usage =
    "usage: bench_step --model NAME|FILE --batch B --optimizer sgd|adam|adamw --steps N\n"
    "                  --threads T [--warmup W] [--seed S] [--precision P]\n"
    "                  [--optimizer-state fp32|bf16|int8] [--json]\n";

static int parse_args(int argc, char **argv, bench_opts *o) {
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"optimizer", required_argument, 0, 'o'},
                                          {"steps", required_argument, 0, 'n'},
                                          {"threads", required_argument, 0, 't'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"seed", required_argument, 0, 's'},
                                          {"json", no_argument, 0, 'j'},
                                          {"precision", required_argument, 0, 'p'},
                                          {"optimizer-state", required_argument, 0, 'q'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    *o = (bench_opts){.model = "mlp",
                      .optimizer = "sgd",
                      .precision = "fp32",
                      .state = "fp32",
                      .batch = 32,
                      .steps = 50,
                      .warmup = 3};
    int c, seed = 0;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'o': o->optimizer = optarg; break;
        case 'b':
            if (parse_int("batch", optarg, 1, 1 << 20, &o->batch)) return -1;
            break;
        case 'n':
            if (parse_int("steps", optarg, 1, 1 << 24, &o->steps)) return -1;
            break;
        case 'w':
            if (parse_int("warmup", optarg, 0, 1 << 24, &o->warmup)) return -1;
            break;
        case 't':
            if (parse_int("threads", optarg, 0, 4096, &o->threads)) return -1;
            break;
        case 's':
            if (parse_int("seed", optarg, 0, 1 << 30, &seed)) return -1;
            break;
        case 'j': o->json = 1; break;
        case 'p': o->precision = optarg; break;
        case 'q': o->state = optarg; break;
        case 'h': fputs(usage, stdout); exit(0);
        default: fputs(usage, stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_step: unexpected argument '%s'\n%s", argv[optind], usage);
        return -1;
    }
    o->seed = (uint64_t)seed;
    return 0;
}

/* One synthetic batch: x (n, sample) uniform in [0, 1), y uniform in [0, classes). */
static void fill_batch(fr_rng *r, float *x, int32_t *y, int n, size_t sample, int classes) {
    for (size_t i = 0; i < (size_t)n * sample; i++) x[i] = fr_rng_next_uniform(r);
    for (int i = 0; i < n; i++) y[i] = (int32_t)fr_rng_below(r, (uint64_t)classes);
}

static void json_num(char *buf, size_t n, float v) {
    if (isfinite(v)) snprintf(buf, n, "%.6g", (double)v);
    else snprintf(buf, n, "null");
}

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* OpenBLAS on the core the CPU calls for (frugal.h) */
    bench_opts o;
    if (parse_args(argc, argv, &o)) return 2;
    fr_optim_kind kind;
    if (fr_optim_parse(NULL, o.optimizer, &kind)) {
        fprintf(stderr, "bench_step: unknown optimizer '%s' (sgd, adam, adamw)\n", o.optimizer);
        return 2;
    }
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "bench_step: out of memory\n"), 1;
    fr_set_threads(ctx, o.threads);

    int rc = 1;
    fr_model *m = NULL;
    fr_step *s = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    double *ms = NULL;
    if (!(m = fr_model_load(ctx, o.model)) || fr_model_init(m, o.seed)) goto fail;
    if (m->loss != FR_LOSS_CROSS_ENTROPY) {
        fprintf(stderr, "bench_step: %s: only cross-entropy models are benchmarked\n", o.model);
        goto out;
    }
    size_t sample = (size_t)fr_shape_numel(&m->in);
    int classes = fr_model_num_classes(m);
    fr_step_opts so = {
        .batch = o.batch, .training = 1, .optim = fr_optim_defaults(kind), .seed = o.seed};
    if (fr_precision_parse(NULL, o.precision, &so.precision)) {
        fprintf(stderr, "bench_step: unknown precision '%s'\n", o.precision);
        goto out;
    }
    so.optim_state = !strcmp(o.state, "int8")   ? FR_OPTIM_STATE_INT8
                     : !strcmp(o.state, "bf16") ? FR_OPTIM_STATE_BF16
                                                : FR_OPTIM_STATE_FP32;
    if (!(s = fr_step_compile(m, &so))) goto fail;

    x = malloc((size_t)o.batch * sample * sizeof *x);
    y = malloc((size_t)o.batch * sizeof *y);
    ms = malloc((size_t)o.steps * sizeof *ms);
    if (!x || !y || !ms) {
        fprintf(stderr, "bench_step: out of memory for the synthetic batch\n");
        goto out;
    }
    fr_rng r = fr_rng_make(o.seed, 0xbe4c);
    float loss = 0, first_loss = NAN;
    for (int i = 0; i < o.warmup + o.steps; i++) {
        fill_batch(&r, x, y, o.batch, sample, classes);
        fr_batch b = {o.batch, x, y, NULL, NULL};
        double t0 = now_ms();
        if (fr_step_run(s, &b, &loss, NULL)) goto fail;
        double t1 = now_ms();
        if (i == 0) first_loss = loss;
        if (i >= o.warmup) ms[i - o.warmup] = t1 - t0;
    }

    double mean = 0;
    for (int i = 0; i < o.steps; i++) mean += ms[i];
    mean /= o.steps;
    qsort(ms, (size_t)o.steps, sizeof *ms, cmp_double);
    double median = o.steps % 2 ? ms[o.steps / 2] : 0.5 * (ms[o.steps / 2 - 1] + ms[o.steps / 2]);
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    size_t rss = peak_rss_bytes();
    uint64_t skipped = 0;
    fr_step_scaler(s, NULL, &skipped);
    if (o.json) {
        char fl[32], ll[32]; /* JSON has no inf or NaN: a diverged loss is null */
        json_num(fl, sizeof fl, first_loss);
        json_num(ll, sizeof ll, loss);
        printf("{\"impl\": \"frugal\", \"model\": \"%s\", \"batch\": %d, \"optimizer\": \"%s\", "
               "\"threads\": %d, \"steps\": %d, \"warmup\": %d, \"params\": %zu, "
               "\"median_ms\": %.4f, \"mean_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
               "\"first_loss\": %s, \"last_loss\": %s, \"skipped_steps\": %llu, "
               "\"peak_allocated_bytes\": %zu, "
               "\"peak_reserved_bytes\": %zu, \"peak_rss_bytes\": %zu, \"precision\": \"%s\", "
               "\"optimizer_state\": \"%s\", \"peak_by_category\": {",
               o.model, o.batch, o.optimizer, fr_get_threads(ctx), o.steps, o.warmup,
               fr_model_num_params(m), median, mean, ms[0], ms[o.steps - 1], fl, ll,
               (unsigned long long)skipped, st.allocated_total_peak, st.reserved_peak, rss,
               o.precision, o.state);
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
            printf("%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name((fr_mem_cat)c),
                   st.allocated_peak[c]);
        printf("}}\n");
    } else {
        printf("frugal %s, batch %d, %s, %d threads: %zu parameters\n", o.model, o.batch,
               o.optimizer, fr_get_threads(ctx), fr_model_num_params(m));
        printf("  %d steps after %d warm-up: median %.3f ms/step, mean %.3f (min %.3f, max %.3f)\n",
               o.steps, o.warmup, median, mean, ms[0], ms[o.steps - 1]);
        printf("  loss %.4f -> %.4f", first_loss, loss);
        if (skipped)
            printf(" (%llu steps skipped by the loss scaler)", (unsigned long long)skipped);
        printf("\n");
        printf(
            "  engine peak allocated %.2f MiB, peak reserved %.2f MiB; process peak RSS %.2f MiB\n",
            st.allocated_total_peak / 1048576.0, st.reserved_peak / 1048576.0, rss / 1048576.0);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench_step: %s\n", fr_last_error(ctx));
out:
    free(ms);
    free(y);
    free(x);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return rc;
}
