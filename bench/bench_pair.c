/* bench_pair.c — the step-time ratio of two configurations of one model,
 * measured so that a busy host's drift cancels: both are compiled in one
 * process (each with its own context, so their memory is counted apart) and
 * their steps alternate, A B B A A B ..., each pair on the same synthetic
 * batch (and neither side always first, after the other has had the caches).
 * A step of 40-400 ms sees the same host load as its neighbour, while the
 * load moves by tens of percent over seconds; so the median over pairs of
 * B's time over A's is steadier than the ratio of two separate runs.
 *
 *   bench_pair --model NAME|FILE --batch B --optimizer sgd|adam|adamw
 *              --steps N --threads T --a PRECISION,STATE[,keep] --b PRECISION,STATE[,keep]
 *              [--warmup W] [--seed S] [--json]
 *
 * Prints each side's median ms/step, the median pair ratio B/A with its
 * quartiles, each side's peak allocated bytes per category and the steps its
 * loss scaler skipped. Both sides start from the same weights (same seed).
 * Only the public API, plus model.h for the model's input shape. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/rng.h"
#define BENCH_NAME "bench_pair"
#include "bench_util.h"
#include "frugal.h"
#include "model/model.h"

typedef struct side {
    const char *spec; /* "precision,state" */
    char precision[32], state[16];
    int keep_grads; /* ",keep" after the state: every gradient stored (no step in backward) */
    fr_ctx *ctx;
    fr_model *m;
    fr_step *s;
    double *ms;
} side;

typedef struct pair_opts {
    const char *model, *optimizer;
    int batch, steps, warmup, threads, json;
    uint64_t seed;
} pair_opts;

/* The q-quantile (0..1) of sorted v[0, n), by linear interpolation. */
static double quantile(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)pos;
    return i + 1 < n ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* "bf16-mixed,int8" -> precision and state; the state defaults to fp32. */
static int parse_spec(side *sd, const char *s) {
    const char *comma = strchr(s, ',');
    size_t lp = comma ? (size_t)(comma - s) : strlen(s);
    if (lp == 0 || lp >= sizeof sd->precision || (comma && strlen(comma + 1) >= sizeof sd->state)) {
        fprintf(stderr, "bench_pair: '%s': expected PRECISION[,STATE], e.g. bf16-mixed,fp32\n", s);
        return -1;
    }
    sd->spec = s;
    memcpy(sd->precision, s, lp);
    sd->precision[lp] = 0;
    snprintf(sd->state, sizeof sd->state, "%s", comma ? comma + 1 : "fp32");
    char *keep = strchr(sd->state, ',');
    if (keep) {
        if (strcmp(keep, ",keep")) {
            fprintf(stderr, "bench_pair: '%s': the third field can only be 'keep'\n", s);
            return -1;
        }
        *keep = 0;
        sd->keep_grads = 1;
    }
    return 0;
}

static const char *usage =
    "usage: bench_pair --model NAME|FILE --batch B --optimizer sgd|adam|adamw --steps N\n"
    "                  --threads T --a PRECISION[,STATE[,keep]] --b PRECISION[,STATE[,keep]]\n"
    "                  [--warmup W] [--seed S] [--json]\n";

static int parse_args(int argc, char **argv, pair_opts *o, side *a, side *b) {
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"batch", required_argument, 0, 'B'},
                                          {"optimizer", required_argument, 0, 'o'},
                                          {"steps", required_argument, 0, 'n'},
                                          {"threads", required_argument, 0, 't'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"seed", required_argument, 0, 's'},
                                          {"json", no_argument, 0, 'j'},
                                          {"a", required_argument, 0, 'a'},
                                          {"b", required_argument, 0, 'b'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    *o = (pair_opts){.model = "mlp", .optimizer = "adam", .batch = 32, .steps = 20, .warmup = 3};
    if (parse_spec(a, "fp32,fp32") || parse_spec(b, "fp32,fp32")) return -1;
    int c, seed = 0;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'o': o->optimizer = optarg; break;
        case 'B':
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
        case 'a':
            if (parse_spec(a, optarg)) return -1;
            break;
        case 'b':
            if (parse_spec(b, optarg)) return -1;
            break;
        case 'h': fputs(usage, stdout); exit(0);
        default: fputs(usage, stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_pair: unexpected argument '%s'\n%s", argv[optind], usage);
        return -1;
    }
    o->seed = (uint64_t)seed;
    return 0;
}

static int side_open(side *sd, const pair_opts *o, fr_optim_kind kind) {
    if (!(sd->ctx = fr_ctx_new())) return fprintf(stderr, "bench_pair: out of memory\n"), -1;
    fr_set_threads(sd->ctx, o->threads);
    fr_step_opts so = {.batch = o->batch,
                       .training = 1,
                       .optim = fr_optim_defaults(kind),
                       .seed = o->seed,
                       .keep_grads = sd->keep_grads};
    if (fr_precision_parse(NULL, sd->precision, &so.precision)) {
        fprintf(stderr, "bench_pair: unknown precision '%s'\n", sd->precision);
        return -1;
    }
    static const char *const states[] = {"fp32", "bf16", "int8"}; /* fr_step_opts.optim_state */
    int state = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(sd->state, states[k])) so.optim_state = (fr_optim_state)(state = k);
    if (state < 0) {
        fprintf(stderr, "bench_pair: unknown optimizer state '%s' (fp32, bf16, int8)\n", sd->state);
        return -1;
    }
    if (!(sd->m = fr_model_load(sd->ctx, o->model)) || fr_model_init(sd->m, o->seed) ||
        !(sd->s = fr_step_compile(sd->m, &so))) {
        fprintf(stderr, "bench_pair: %s: %s\n", sd->spec, fr_last_error(sd->ctx));
        return -1;
    }
    if (!(sd->ms = malloc((size_t)o->steps * sizeof *sd->ms)))
        return fprintf(stderr, "bench_pair: out of memory\n"), -1;
    return 0;
}

static void side_close(side *sd) {
    free(sd->ms);
    fr_step_free(sd->s);
    fr_model_free(sd->m);
    fr_ctx_free(sd->ctx);
}

static void side_json(const side *sd, const char *key, double median) {
    fr_mem_stats st;
    fr_mem_get_stats(sd->ctx, &st);
    uint64_t skipped = 0;
    fr_step_scaler(sd->s, NULL, &skipped);
    printf("\"%s\": {\"precision\": \"%s\", \"optimizer_state\": \"%s\", \"keep_grads\": %d, "
           "\"median_ms\": %.4f, "
           "\"skipped_steps\": %llu, \"peak_allocated_bytes\": %zu, \"peak_by_category\": {",
           key, sd->precision, sd->state, sd->keep_grads, median, (unsigned long long)skipped,
           st.allocated_total_peak);
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
        printf("%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name((fr_mem_cat)c),
               st.allocated_peak[c]);
    printf("}}");
}

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* OpenBLAS on the core the CPU calls for (frugal.h) */
    pair_opts o;
    side a = {0}, b = {0};
    if (parse_args(argc, argv, &o, &a, &b)) return 2;
    fr_optim_kind kind;
    if (fr_optim_parse(NULL, o.optimizer, &kind)) {
        fprintf(stderr, "bench_pair: unknown optimizer '%s' (sgd, adam, adamw)\n", o.optimizer);
        return 2;
    }
    int rc = 1;
    float *x = NULL;
    int32_t *y = NULL;
    double *ratio = NULL;
    if (side_open(&a, &o, kind) || side_open(&b, &o, kind)) goto out;
    if (a.m->loss != FR_LOSS_CROSS_ENTROPY) {
        fprintf(stderr, "bench_pair: %s: only cross-entropy models are benchmarked\n", o.model);
        goto out;
    }
    size_t sample = (size_t)fr_shape_numel(&a.m->in);
    int classes = fr_model_num_classes(a.m);
    x = malloc((size_t)o.batch * sample * sizeof *x);
    y = malloc((size_t)o.batch * sizeof *y);
    ratio = malloc((size_t)o.steps * sizeof *ratio);
    if (!x || !y || !ratio) {
        fprintf(stderr, "bench_pair: out of memory for the synthetic batch\n");
        goto out;
    }
    fr_rng r = fr_rng_make(o.seed, 0xbe4c);
    for (int i = 0; i < o.warmup + o.steps; i++) {
        for (size_t k = 0; k < (size_t)o.batch * sample; k++) x[k] = fr_rng_next_uniform(&r);
        for (int k = 0; k < o.batch; k++) y[k] = (int32_t)fr_rng_below(&r, (uint64_t)classes);
        fr_batch bt = {o.batch, x, y, NULL, NULL};
        side *sd[2] = {&a, &b};
        if (i % 2) sd[0] = &b, sd[1] = &a; /* A B, B A, ...: neither always runs first */
        for (int k = 0; k < 2; k++) {
            float loss;
            double t0 = now_ms();
            if (fr_step_run(sd[k]->s, &bt, &loss, NULL)) {
                fprintf(stderr, "bench_pair: %s: %s\n", sd[k]->spec, fr_last_error(sd[k]->ctx));
                goto out;
            }
            if (i >= o.warmup) sd[k]->ms[i - o.warmup] = now_ms() - t0;
        }
        if (i >= o.warmup) ratio[i - o.warmup] = b.ms[i - o.warmup] / a.ms[i - o.warmup];
    }
    qsort(a.ms, (size_t)o.steps, sizeof *a.ms, cmp_double);
    qsort(b.ms, (size_t)o.steps, sizeof *b.ms, cmp_double);
    qsort(ratio, (size_t)o.steps, sizeof *ratio, cmp_double);
    const double ma = quantile(a.ms, o.steps, 0.5), mb = quantile(b.ms, o.steps, 0.5);
    const double q1 = quantile(ratio, o.steps, 0.25), q2 = quantile(ratio, o.steps, 0.5),
                 q3 = quantile(ratio, o.steps, 0.75);
    if (o.json) {
        printf("{\"model\": \"%s\", \"batch\": %d, \"optimizer\": \"%s\", \"threads\": %d, "
               "\"steps\": %d, "
               "\"ratio_median\": %.4f, \"ratio_q1\": %.4f, \"ratio_q3\": %.4f, ",
               o.model, o.batch, o.optimizer, fr_get_threads(a.ctx), o.steps, q2, q1, q3);
        side_json(&a, "a", ma);
        printf(", ");
        side_json(&b, "b", mb);
        printf("}\n");
    } else {
        printf("%s, batch %d, %s, %d threads, %d alternating pairs after %d warm-up pairs\n",
               o.model, o.batch, o.optimizer, fr_get_threads(a.ctx), o.steps, o.warmup);
        printf("  A %-18s median %.3f ms/step\n", a.spec, ma);
        printf("  B %-18s median %.3f ms/step\n", b.spec, mb);
        printf("  B/A per pair: median %.3f (quartiles %.3f-%.3f)\n", q2, q1, q3);
    }
    rc = 0;
out:
    free(ratio);
    free(y);
    free(x);
    side_close(&b);
    side_close(&a);
    return rc;
}
