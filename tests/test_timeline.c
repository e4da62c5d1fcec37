/* test_timeline.c — the memory timeline writers (src/report/timeline.c).
 * A known sequence of allocations and frees under the tags "opA" and "opB",
 * with bytes held before the trace starts, is written as a Chrome trace and
 * as an SVG. The JSON is read back by a small JSON reader written here (and
 * by Python's json module when python3 is on the PATH); its counter values
 * are compared with running sums worked out by hand below, its op slices
 * with the tag sequence. The SVG must be whole, carry no script, name every
 * category in its legend, label the peak with the hand-computed value and
 * op, and draw the budget only when there is one. A long trace with one
 * spike checks the thinning (bounded size, the spike still reaches the peak
 * line). Failure paths: an empty trace, an unwritable path, and every
 * allocation failing in turn, each reported with nothing leaked, the trace
 * left as it was and no file left behind. Kernel time by op
 * (fr_timeline_op_times): spans between hand-placed time marks against the
 * test's own clock, runs not ended by a mark left out; and a traced training
 * step of a small MLP marks every kernel of its plan once a step.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include "check.h"
#include "core/ctx.h"
#include "ops/ops.h"
#include "report/timeline.h"
#include "train/step.h"

#define NCAT FR_MEM_CAT_COUNT

/* ---- a small JSON reader (independent of the writer) ---------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype t;
    double num;
    char *str;           /* J_STR */
    struct jval **items; /* J_ARR, J_OBJ */
    char **keys;         /* J_OBJ */
    int n;
} jval;

typedef struct jin {
    const char *p, *end;
    int bad;
} jin;

static void jfree(jval *v) {
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static void jws(jin *in) {
    while (in->p < in->end && isspace((unsigned char)*in->p)) in->p++;
}

static char *jstring(jin *in) {
    if (in->p >= in->end || *in->p != '"') return in->bad = 1, NULL;
    in->p++;
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    while (in->p < in->end && *in->p != '"') {
        char ch = *in->p++;
        if ((unsigned char)ch < 0x20) in->bad = 1;
        if (ch == '\\') {
            if (in->p >= in->end) break;
            char e = *in->p++;
            if (e == 'u') {
                if (in->end - in->p < 4) break;
                for (int k = 0; k < 4; k++)
                    if (!isxdigit((unsigned char)in->p[k])) in->bad = 1;
                in->p += 4;
                ch = '?';
            } else if (strchr("\"\\/bfnrt", e)) {
                ch = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            } else {
                in->bad = 1;
            }
        }
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = ch;
    }
    s[n] = 0;
    if (in->p >= in->end) in->bad = 1;
    else in->p++;
    return s;
}

static jval *jparse(jin *in, int depth) {
    jws(in);
    if (in->p >= in->end || depth > 64) return in->bad = 1, NULL;
    jval *v = calloc(1, sizeof *v);
    char ch = *in->p;
    if (ch == '{' || ch == '[') {
        v->t = ch == '{' ? J_OBJ : J_ARR;
        char close = ch == '{' ? '}' : ']';
        in->p++;
        jws(in);
        if (in->p < in->end && *in->p == close) {
            in->p++;
            return v;
        }
        for (;;) {
            char *key = NULL;
            if (v->t == J_OBJ) {
                jws(in);
                key = jstring(in);
                jws(in);
                if (in->p < in->end && *in->p == ':') in->p++;
                else in->bad = 1;
            }
            jval *item = jparse(in, depth + 1);
            v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof *v->items);
            if (v->t == J_OBJ) v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
            v->items[v->n] = item;
            if (v->keys) v->keys[v->n] = key;
            v->n++;
            if (in->bad) return v;
            jws(in);
            if (in->p < in->end && *in->p == ',') {
                in->p++;
                continue;
            }
            if (in->p < in->end && *in->p == close) {
                in->p++;
                return v;
            }
            in->bad = 1;
            return v;
        }
    }
    if (ch == '"') {
        v->t = J_STR;
        v->str = jstring(in);
        return v;
    }
    if (!strncmp(in->p, "true", 4) || !strncmp(in->p, "null", 4)) {
        v->t = *in->p == 't' ? J_BOOL : J_NULL;
        v->num = *in->p == 't';
        in->p += 4;
        return v;
    }
    if (!strncmp(in->p, "false", 5)) {
        v->t = J_BOOL;
        in->p += 5;
        return v;
    }
    char *e;
    v->t = J_NUM;
    v->num = strtod(in->p, &e);
    if (e == in->p) in->bad = 1;
    in->p = e;
    return v;
}

static jval *jread(const char *text, size_t len) {
    jin in = {text, text + len, 0};
    jval *v = jparse(&in, 0);
    jws(&in);
    if (in.bad || in.p != in.end) {
        jfree(v);
        return NULL;
    }
    return v;
}

static const jval *jget(const jval *o, const char *key) {
    if (!o || o->t != J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (o->keys[i] && !strcmp(o->keys[i], key)) return o->items[i];
    return NULL;
}

static const char *jstr(const jval *o, const char *key) {
    const jval *v = jget(o, key);
    return v && v->t == J_STR ? v->str : "";
}

/* ---- helpers -------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    fclose(f);
    s[got] = 0;
    if (len) *len = got;
    return s;
}

static size_t count_str(const char *hay, const char *needle) {
    size_t k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) k++;
    return k;
}

static fr_mem_stats stats(fr_ctx *ctx) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    return s;
}

static char dir[] = "/tmp/frugal-timeline-XXXXXX";

static const char *in_dir(const char *name, char *buf, size_t len) {
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

/* The known sequence. Categories in enum order: parameters, gradients,
 * optimizer, activations, workspace, data, other. */
#define NEV 7
static const int64_t expect[NEV + 1][NCAT] = {
    {1000, 0, 0, 0, 0, 0, 0},      /* held before the trace started */
    {1000, 0, 0, 2000, 0, 0, 0},   /* opA: +2000 activations */
    {1000, 0, 0, 2000, 500, 0, 0}, /* opA: +500 workspace */
    {1000, 0, 0, 5000, 500, 0, 0}, /* opB: +3000 activations: the peak, 6500 */
    {1000, 0, 0, 5000, 0, 0, 0},   /* opB: -500 workspace */
    {1000, 0, 0, 2000, 0, 0, 0},   /* opA: -3000 activations */
    {1000, 700, 0, 2000, 0, 0, 0}, /* opA: +700 gradients */
    {1000, 700, 0, 0, 0, 0, 0},    /* no tag: -2000 activations */
};
/* 6500 B / 1024 = 6.35 KiB, printed with one decimal */
#define PEAK_TEXT "peak 6.3 KiB at "

typedef struct seq {
    void *p, *g;
} seq;

static seq run_sequence(fr_ctx *ctx) {
    seq q;
    q.p = fr_alloc(ctx, 1000, FR_MEM_PARAMS);
    fr_mem_trace(ctx, 1);
    fr_mem_set_tag(ctx, "opA");
    void *a1 = fr_alloc(ctx, 2000, FR_MEM_ACTIVATIONS);
    void *a2 = fr_alloc(ctx, 500, FR_MEM_WORKSPACE);
    fr_mem_set_tag(ctx, "opB");
    void *b1 = fr_alloc(ctx, 3000, FR_MEM_ACTIVATIONS);
    fr_free(ctx, a2);
    fr_mem_set_tag(ctx, "opA");
    fr_free(ctx, b1);
    q.g = fr_alloc(ctx, 700, FR_MEM_GRADS);
    fr_mem_set_tag(ctx, NULL);
    fr_free(ctx, a1);
    return q;
}

/* ---- the Chrome trace ----------------------------------------------------- */

static void check_chrome(const char *path) {
    size_t len;
    char *text = slurp(path, &len);
    CHECK(text != NULL, "%s written", path);
    if (!text) return;
    jval *root = jread(text, len);
    CHECK(root != NULL, "the Chrome trace parses as JSON");
    const jval *evs = jget(root, "traceEvents");
    CHECK(evs && evs->t == J_ARR, "traceEvents is an array");
    CHECK(!strcmp(jstr(root, "displayTimeUnit"), "ms"), "displayTimeUnit is ms");
    if (!evs || evs->t != J_ARR) {
        jfree(root);
        free(text);
        return;
    }
    int nc = 0, counters_ok = 1, ts_ok = 1, pid_ok = 1;
    double last_ts = -1;
    char slices[64] = "";
    int n_instant = 0;
    for (int i = 0; i < evs->n; i++) {
        const jval *e = evs->items[i];
        const char *ph = jstr(e, "ph");
        const jval *ts = jget(e, "ts");
        if (strcmp(ph, "M") && (!ts || ts->t != J_NUM)) ts_ok = 0;
        if (!jget(e, "pid")) pid_ok = 0;
        if (!strcmp(ph, "C")) {
            const jval *args = jget(e, "args");
            if (strcmp(jstr(e, "name"), "memory") || !args || args->n != NCAT) counters_ok = 0;
            for (int c = 0; c < NCAT && nc <= NEV && args; c++) {
                const jval *v = jget(args, fr_mem_cat_name((fr_mem_cat)c));
                if (!v || v->t != J_NUM || v->num != (double)expect[nc][c]) {
                    counters_ok = 0;
                    printf("counter %d, %s: got %g, want %lld\n", nc,
                           fr_mem_cat_name((fr_mem_cat)c), v ? v->num : -1.0,
                           (long long)expect[nc][c]);
                }
            }
            if (ts && ts->num < last_ts) ts_ok = 0;
            if (ts) last_ts = ts->num;
            if (nc == 0 && (!ts || ts->num != 0)) ts_ok = 0;
            nc++;
        } else if (!strcmp(ph, "X")) {
            const jval *dur = jget(e, "dur");
            if (!dur || dur->t != J_NUM || dur->num < 0) ts_ok = 0;
            strncat(slices, jstr(e, "name"), sizeof slices - strlen(slices) - 2);
            strcat(slices, ",");
            if (!strcmp(jstr(e, "name"), "opB")) {
                const jval *args = jget(e, "args");
                const jval *al = jget(args, "allocated"), *fr = jget(args, "freed");
                CHECK(al && fr && al->num == 3000 && fr->num == 500,
                      "opB slice: allocated 3000, freed 500");
            }
        } else if (!strcmp(ph, "i")) {
            n_instant++;
            CHECK(strstr(jstr(e, "name"), "peak 6.3 KiB") && strstr(jstr(e, "name"), "opB"),
                  "the peak instant names 6.3 KiB and opB, got \"%s\"", jstr(e, "name"));
        }
    }
    CHECK(nc == NEV + 1, "one counter for the start and one per event: %d, want %d", nc, NEV + 1);
    CHECK(counters_ok, "every counter equals the hand-computed running sums");
    CHECK(ts_ok, "timestamps are numbers, counters in order from 0, durations >= 0");
    CHECK(pid_ok, "every event has a pid");
    CHECK(!strcmp(slices, "opA,opB,opA,"), "op slices follow the tags: \"%s\"", slices);
    CHECK(n_instant == 1, "one peak instant, got %d", n_instant);
    jfree(root);
    free(text);

    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s",
                 path);
        CHECK(system(cmd) == 0, "python3's json module reads the trace");
    }
}

/* ---- the SVG -------------------------------------------------------------- */

static void check_svg(const char *path, int with_budget) {
    char *s = slurp(path, NULL);
    CHECK(s != NULL, "%s written", path);
    if (!s) return;
    CHECK(!strncmp(s, "<svg ", 5) && strstr(s, "</svg>\n") &&
              !strcmp(strstr(s, "</svg>\n"), "</svg>\n"),
          "one whole <svg> element");
    CHECK(!strstr(s, "<script") && !strstr(s, "@font-face") && !strstr(s, "href"),
          "no scripts, fonts or links");
    CHECK(strstr(s, "width=\"1000\" height=\"500\""), "1000x500");
    CHECK(count_str(s, "<") == count_str(s, ">"), "angle brackets balance");
    CHECK(count_str(s, "<g") == count_str(s, "</g>"), "groups close");
    const char *legend = strstr(s, "id=\"legend\"");
    CHECK(legend != NULL, "a legend");
    for (int c = 0; c < NCAT && legend; c++) {
        char want[64];
        snprintf(want, sizeof want, ">%s</text>", fr_mem_cat_name((fr_mem_cat)c));
        CHECK(strstr(legend, want), "the legend names %s", fr_mem_cat_name((fr_mem_cat)c));
    }
    CHECK(count_str(s, "<path fill=") == NCAT, "one area per category");
    const char *label = strstr(s, "id=\"peak-label\"");
    CHECK(label && strstr(label, ">" PEAK_TEXT) && strstr(label, " ms, during opB</text>"),
          "the peak label reads \"%s...ms, during opB\"", PEAK_TEXT);
    CHECK(strstr(s, "id=\"peak\""), "a peak line");
    CHECK(strstr(s, "stroke-dasharray"), "the peak line is dashed");
    /* legend values at the peak: activations 5000 B = 4.9 KiB, params 1000 B */
    CHECK(strstr(legend ? legend : "", ">4.9 KiB</text>") &&
              strstr(legend ? legend : "", ">1000 B</text>"),
          "the legend gives the bytes at the peak");
    CHECK(with_budget == (strstr(s, "id=\"budget\"") != NULL), "a budget line iff a budget");
    if (with_budget)
        CHECK(strstr(s, "#d62728") && strstr(s, ">budget 8.0 KiB</text>"),
              "the budget is red and labelled");
    CHECK(strstr(s, "My &lt;model&gt; &amp; co"), "the title is escaped");
    free(s);
}

/* the highest point of the topmost area, and the peak line's y */
static void area_top_and_peak(const char *s, double *top, double *peak) {
    *top = 1e9;
    *peak = -1;
    const char *p = strstr(s, "<path fill=");
    const char *end = p ? strstr(p, "/>") : NULL;
    for (const char *q = p; q && q < end; q++)
        if (*q == 'V') {
            double y = strtod(q + 1, NULL);
            if (y < *top) *top = y;
        }
    const char *l = strstr(s, "id=\"peak\"");
    if (l && (l = strstr(l, "y1=\""))) *peak = strtod(l + 4, NULL);
}

static void test_long_trace(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem_trace(ctx, 1);
    fr_mem_set_tag(ctx, "small");
    const int pairs = 60000;
    for (int i = 0; i < pairs; i++) {
        if (i == pairs / 2) {
            fr_mem_set_tag(ctx, "spike");
            void *big = fr_alloc(ctx, 3 << 20, FR_MEM_WORKSPACE);
            fr_free(ctx, big);
            fr_mem_set_tag(ctx, "small");
        }
        void *p = fr_alloc(ctx, 4096 + (size_t)(i % 7) * 512, FR_MEM_ACTIVATIONS);
        fr_free(ctx, p);
    }
    CHECK(ctx->mem.n_events == 2 * (size_t)pairs + 2, "long trace: %zu events", ctx->mem.n_events);
    char path[256];
    in_dir("long.svg", path, sizeof path);
    CHECK(fr_timeline_svg(ctx, path, "long", 0) == FR_OK, "long trace: %s", fr_last_error(ctx));
    char *s = slurp(path, NULL);
    if (s) {
        size_t verticals = count_str(s, "V");
        CHECK(verticals <= 7 * 4000, "thinned: %zu vertical steps in 7 areas", verticals);
        CHECK(strstr(s, ">peak 3.0 MiB at ") && strstr(s, "during spike</text>"),
              "the spike is the labelled peak");
        double top, peak;
        area_top_and_peak(s, &top, &peak);
        CHECK(peak > 0 && top == peak,
              "the spike reaches the peak line after thinning: %.1f vs %.1f", top, peak);
        free(s);
    }
    fr_ctx_free(ctx);
}

/* ---- failures ------------------------------------------------------------- */

static void test_failures(void) {
    char path[256];
    fr_ctx *ctx = fr_ctx_new();
    CHECK(fr_timeline_chrome(ctx, in_dir("none.json", path, sizeof path)) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "empty"),
          "no trace: FR_ERR_ARG, \"%s\"", fr_last_error(ctx));
    CHECK(fr_timeline_svg(ctx, path, NULL, 0) == FR_ERR_ARG, "no trace: the SVG too");
    CHECK(access(path, F_OK) != 0, "no file for an empty trace");

    seq q = run_sequence(ctx);
    CHECK(fr_timeline_chrome(ctx, "/nonexistent-dir/x.json") == FR_ERR_IO &&
              strstr(fr_last_error(ctx), "/nonexistent-dir/x.json"),
          "unwritable path: FR_ERR_IO naming it, \"%s\"", fr_last_error(ctx));
    CHECK(fr_timeline_svg(ctx, "/nonexistent-dir/x.svg", "t", 0) == FR_ERR_IO,
          "unwritable SVG path: FR_ERR_IO");

    /* every allocation of each writer fails in turn */
    for (int w = 0; w < 2; w++) {
        const char *name = w ? "fail.svg" : "fail.json";
        in_dir(name, path, sizeof path);
        int failures = 0, clean = 1;
        for (uint64_t k = 1; k < 1000; k++) {
            fr_mem_stats before = stats(ctx);
            fr_mem_fail_at(ctx, k);
            fr_status st = w ? fr_timeline_svg(ctx, path, "t", 0) : fr_timeline_chrome(ctx, path);
            fr_mem_fail_at(ctx, 0);
            fr_mem_stats after = stats(ctx);
            if (after.allocated_total != before.allocated_total || ctx->mem.n_events != NEV ||
                !ctx->mem.tracing)
                clean = 0;
            if (st == FR_OK) break;
            failures++;
            if (st != FR_ERR_NOMEM || !strstr(fr_last_error(ctx), "out of memory") ||
                access(path, F_OK) == 0)
                clean = 0;
        }
        CHECK(failures >= 2, "%s: %d allocations failed in turn", name, failures);
        CHECK(clean,
              "%s: each failure is NOMEM with a message, leaks nothing, leaves the trace "
              "running and untouched and writes no file",
              name);
        CHECK(access(path, F_OK) == 0, "%s: written once allocations succeed", name);
    }
    fr_free(ctx, q.p);
    fr_free(ctx, q.g);
    fr_mem_stats s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.num_allocs == s.num_frees, "failures leak nothing");
    fr_ctx_free(ctx);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* a span of about ms under tag: its mark, a busy wait, the NULL mark; the
 * time between the two marks lies within [inner, outer] of the test's clock */
static void span(fr_ctx *ctx, const char *tag, double ms, double *inner, double *outer) {
    double t0 = now_ms();
    fr_mem_mark(ctx, tag);
    double t1 = now_ms();
    while (now_ms() - t1 < ms) {
    }
    double t2 = now_ms();
    fr_mem_mark(ctx, NULL);
    double t3 = now_ms();
    *inner += t2 - t1, *outer += t3 - t0;
}

static void test_op_times(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem_trace(ctx, 1);
    double ain = 0, aout = 0, bin = 0, bout = 0;
    span(ctx, "opA", 3, &ain, &aout);
    span(ctx, "opB", 1, &bin, &bout);
    fr_mem_set_tag(ctx, "setup"); /* a run no mark ends: not a kernel */
    void *p = fr_alloc(ctx, 1000, FR_MEM_OTHER);
    span(ctx, "opA", 2, &ain, &aout);
    fr_free(ctx, p);
    fr_op_time t[8];
    int n = fr_timeline_op_times(ctx, t, 8);
    CHECK(n == 2, "two ops timed, got %d", n);
    if (n == 2) {
        /* found by name: which comes first is which took longer, and on a
         * loaded host opB's 1 ms wait can outlast opA's 5 (seen in CI) */
        int a = strcmp(t[0].name, "opA") == 0 ? 0 : 1, b = 1 - a;
        CHECK(!strcmp(t[a].name, "opA") && t[a].calls == 2 && !strcmp(t[b].name, "opB") &&
                  t[b].calls == 1,
              "opA twice and opB once: %s %d, %s %d", t[0].name, t[0].calls, t[1].name, t[1].calls);
        CHECK(t[0].ms >= t[1].ms, "longest first: %s %.3f ms before %s %.3f ms", t[0].name, t[0].ms,
              t[1].name, t[1].ms);
        CHECK(t[a].ms >= ain - 1e-3 && t[a].ms <= aout + 1e-3, "opA %.3f ms within [%.3f, %.3f]",
              t[a].ms, ain, aout);
        CHECK(t[b].ms >= bin - 1e-3 && t[b].ms <= bout + 1e-3, "opB %.3f ms within [%.3f, %.3f]",
              t[b].ms, bin, bout);
    }
    fr_mem_trace(ctx, 0);
    fr_ctx_free(ctx);

    /* the executor: every kernel of a traced step, once a step */
    ctx = fr_ctx_new();
    fr_set_threads(ctx, 1);
    fr_model *m = fr_model_new(ctx, 6, 1, 1);
    fr_model_linear(m, 5, 1);
    fr_model_relu(m);
    fr_model_linear(m, 3, 1);
    fr_model_init(m, 1);
    fr_step_opts o = {
        .batch = 4, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = 1};
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    if (s) {
        float x[24];
        int32_t y[4] = {0, 1, 2, 0};
        for (int i = 0; i < 24; i++) x[i] = (float)(i % 7) / 7.0f;
        fr_batch b = {.n = 4, .x = x, .y = y};
        fr_mem_trace(ctx, 1);
        float loss;
        for (int k = 0; k < 2; k++)
            CHECK(fr_step_run(s, &b, &loss, NULL) == FR_OK, "run: %s", fr_last_error(ctx));
        int want[FR_OP_COUNT] = {0}, nwant = 0;
        for (int k = 0; k < s->plan.n_nodes; k++) {
            fr_op op = s->g.nodes[s->plan.order[k]].op;
            if (fr_op_get(op)->view) continue; /* no kernel */
            nwant += !want[op]++;
        }
        fr_op_time ops[FR_OP_COUNT];
        int got = fr_timeline_op_times(ctx, ops, FR_OP_COUNT), bad = 0;
        for (int i = 0; i < got; i++) {
            int op = 0;
            while (op < FR_OP_COUNT && strcmp(fr_op_get((fr_op)op)->name, ops[i].name)) op++;
            bad += op == FR_OP_COUNT || ops[i].calls != 2 * want[op] || ops[i].ms < 0;
        }
        CHECK(got == nwant && bad == 0, "%d ops timed (%d in the plan), %d with wrong calls", got,
              nwant, bad);
        fr_mem_trace(ctx, 0);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
}

int main(void) {
    test_op_times();
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    fr_ctx *ctx = fr_ctx_new();
    seq q = run_sequence(ctx);
    CHECK(ctx->mem.n_events == NEV, "the sequence leaves %d events, got %zu", NEV,
          ctx->mem.n_events);

    char json[256], json2[256], svg[256], svg0[256];
    in_dir("trace.json", json, sizeof json);
    in_dir("trace2.json", json2, sizeof json2);
    in_dir("memory.svg", svg, sizeof svg);
    in_dir("nobudget.svg", svg0, sizeof svg0);
    fr_mem_stats before = stats(ctx);
    CHECK(fr_timeline_chrome(ctx, json) == FR_OK, "chrome: %s", fr_last_error(ctx));
    CHECK(ctx->mem.n_events == NEV && ctx->mem.tracing,
          "writing adds no events and leaves tracing on (%zu events)", ctx->mem.n_events);
    CHECK(fr_timeline_svg(ctx, svg, "My <model> & co", 8192) == FR_OK, "svg: %s",
          fr_last_error(ctx));
    CHECK(fr_timeline_svg(ctx, svg0, "My <model> & co", 0) == FR_OK, "svg: %s", fr_last_error(ctx));
    CHECK(fr_timeline_chrome(ctx, json2) == FR_OK, "chrome again: %s", fr_last_error(ctx));
    fr_mem_stats after = stats(ctx);
    CHECK(after.allocated_total == before.allocated_total && after.allocated[FR_MEM_OTHER] == 0 &&
              after.num_allocs - before.num_allocs == after.num_frees - before.num_frees,
          "the writers free what they take");
    char *j1 = slurp(json, NULL), *j2 = slurp(json2, NULL);
    CHECK(j1 && j2 && !strcmp(j1, j2), "the trace reads the same after the SVG was written");
    free(j1);
    free(j2);

    check_chrome(json);
    check_svg(svg, 1);
    check_svg(svg0, 0);

    fr_free(ctx, q.p);
    fr_free(ctx, q.g);
    fr_mem_empty_cache(ctx);
    fr_mem_stats s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == 0 && s.num_allocs == s.num_frees,
          "no leak: allocated %zu, reserved %zu", s.allocated_total, s.reserved);
    fr_ctx_free(ctx);

    test_long_trace();
    test_failures();

    if (!getenv("FR_KEEP_TIMELINE")) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) printf("could not remove %s\n", dir);
    } else {
        printf("files kept in %s\n", dir);
    }
    return check_done();
}
