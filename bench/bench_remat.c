/* bench_remat.c — activation checkpointing, measured: memory against step
 * time on a deep chain, and the largest batch that fits a budget with and
 * without the planner. bench/remat.sh runs it with its PyTorch twin
 * (bench/torch_remat.py).
 *
 *   bench_remat [--steps N] [--warmup W] [--threads T] [--auto K] [--seed S]
 *               [--out DIR] [--torch FILE] [--torch-cmd CMD] [--rounds R]
 *               [--no-chain] [--no-batch] [--plan-only] [--quick]
 *
 * Part 1, the chain: 32 blocks of Linear(1024,1024)+ReLU, then Linear(1024,10)
 * and cross-entropy, batch 256, SGD (lr 0.01; gradients stay allocated
 * between steps, zero_grad(set_to_none=False) as in torch 1.13). One step is
 * compiled per configuration: keep everything; checkpoint_sequential with 2,
 * 4, 6, 8 segments; sqrt; revolve with 2, 3, 4, 6, 8 slots; the planner
 * (checkpoint auto) at K budgets evenly spaced from keep-everything's
 * reserved bytes down to the least any whole-batch plan reserves. They share
 * the model's weights; budgets whose plan another configuration already runs
 * are not timed twice. W warm-up steps each, then N rounds of one timed step
 * per plan, the order reversed every other round. With --torch-cmd the rounds
 * are split in R groups and CMD runs before each group, so that the engines
 * alternate.
 *
 * Per configuration: the median ms/step; the time ratio, the median over
 * rounds of its step's time over keep-everything's in the same round (drift
 * on a shared machine cancels), and the ratio of medians; "held", the saved
 * activations live when the backward starts, read off the plan's events (the
 * ones the executor reports to the allocator); the planned and measured peak
 * of saved activations; the in-step peak of all step values (activations +
 * workspace: the plan's peak_total, and the allocator's allocated_total_peak
 * during the step minus what was allocated before it); the extra compute
 * (recomputed FLOPs over the plain step's) and the reserved bytes
 * (parameters + gradients + optimizer state + arena + one batch + plan
 * metadata). A markdown table on stdout, DIR/remat.json, and DIR/remat.svg:
 * time ratio against held memory and against the in-step peak, with
 * PyTorch's points from FILE (default DIR/torch_remat.json) when it exists,
 * and a table comparing the two at each PyTorch point. --plan-only times
 * nothing and lists every whole-batch plan of the chain instead.
 *
 * Part 2: for the built-in "resnet" and "cnn" (Adam), the largest batch
 * whose plan reserves at most 64, 128 and 256 MiB: without the planner (keep
 * everything, whole batch: fr_batch_auto with checkpoint none); with it at
 * the whole batch (fr_batch_auto with checkpoint auto, which may recompute),
 * the plan the planner picks there, and a check by an exhaustive search over
 * whole-batch plans; with micro-batches allowed as well (the planner's full
 * search, over multiples of the whole-batch answer up to 65536), which only
 * the input batch itself bounds.
 *
 * Besides the public API it reads the step's plan (train/step.h): where the
 * backward starts, and the plan's peaks. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "core/rng.h"
#define BENCH_NAME "bench_remat"
#include "bench_util.h"
#include "frugal.h"
#include "model/model.h"
#include "train/step.h"
#include "run/trainer.h"

#define MIB (1024.0 * 1024.0)
#define MAX_CFG 48
#define MAX_TORCH 16

typedef struct bench_opts {
    int steps, warmup, threads, n_auto, rounds, chain, batch_table, plan_only;
    uint64_t seed;
    const char *out, *torch, *torch_cmd;
} bench_opts;

/* One configuration of the chain and what was measured for it. */
typedef struct config {
    char label[32];
    fr_ckpt_mode mode; /* as asked */
    int arg;
    size_t budget; /* auto only */
    fr_step *s;
    int same_as;       /* an earlier configuration with the identical plan, or -1 */
    fr_plan_info info; /* what the plan chose */
    size_t held;       /* activations live when the backward starts */
    size_t plan_act, plan_step;
    size_t meas_act, meas_step;
    double *ms, *cpu; /* per timed step: wall and process CPU milliseconds */
    int n_ms;
    double *rs; /* per timed step: its time over the keep-everything steps around it */
    int n_rs;
    double median, cpu_median, min;
    double ratio; /* median of rs */
} config;

/* PyTorch's points, read back from torch_remat.json. */
typedef struct torch_point {
    char label[32];
    double ms, ratio, ratio_of_medians, held, held_rss, peak;
} torch_point;

/* CPU time of the whole process (all threads): less sensitive than wall
 * time to other work on a shared machine, though it counts OpenMP spinning. */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static double median_of(double *v, int n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *mode_name(fr_ckpt_mode m) {
    static const char *names[] = {"marks", "none",     "all",     "sqrt",
                                  "every", "segments", "revolve", "auto"};
    return (unsigned)m <= FR_CKPT_AUTO ? names[m] : "?";
}

/* "segments 4", "revolve 3", "none": the plan a step runs. */
static void plan_name(const fr_plan_info *in, char *buf, size_t len) {
    if (in->ckpt_arg &&
        (in->mode == FR_CKPT_SEGMENTS || in->mode == FR_CKPT_REVOLVE || in->mode == FR_CKPT_EVERY))
        snprintf(buf, len, "%s %d", mode_name(in->mode), in->ckpt_arg);
    else snprintf(buf, len, "%s", mode_name(in->mode));
    if (in->accumulate > 1) {
        size_t k = strlen(buf);
        snprintf(buf + k, len - k, ", %dx%d", in->accumulate, in->micro_batch);
    }
}

static double extra_frac(const fr_plan_info *in) {
    double plain = in->flops - in->extra_flops;
    return in->extra_flops / (plain > 0 ? plain : 1);
}

/* Activations live when the first backward node runs: replay the plan's
 * events (the same the executor reports to the allocator) up to there.
 * Recompute clones come after the graph's forward nodes but are not backward. */
static size_t held_at_backward(const fr_step *s) {
    const fr_plan *p = &s->plan;
    const fr_graph *g = &s->g;
    size_t cur = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        int id = p->order[i];
        if (id >= g->n_forward && !g->nodes[id].attr.recompute) break;
        for (int k = p->ev_start[i]; k < p->ev_start[i + 1]; k++) {
            int ev = p->ev[k], v = (ev > 0 ? ev : -ev) - 1;
            if (p->cat[v] != FR_MEM_ACTIVATIONS) continue;
            size_t b = fr_value_bytes(&g->vals[v]);
            cur = ev > 0 ? cur + b : cur - b;
        }
    }
    return cur;
}

/* The chain of the issue: 32 x (Linear(1024,1024) + ReLU), Linear(1024,10). */
static fr_model *build_chain(fr_ctx *ctx, uint64_t seed) {
    fr_model *m = fr_model_new(ctx, 1024, 1, 1);
    if (!m) return NULL;
    for (int i = 0; i < 32; i++)
        if (fr_model_linear(m, 1024, 1) || fr_model_relu(m)) goto fail;
    if (fr_model_linear(m, 10, 1) || fr_model_init(m, seed)) goto fail;
    return m;
fail:
    fr_model_free(m);
    return NULL;
}

static void fill_batch(fr_rng *r, float *x, int32_t *y, int n, size_t sample, int classes) {
    for (size_t i = 0; i < (size_t)n * sample; i++) x[i] = fr_rng_next_uniform(r);
    for (int i = 0; i < n; i++) y[i] = (int32_t)fr_rng_below(r, (uint64_t)classes);
}

static fr_step_opts chain_opts(int batch, uint64_t seed) {
    fr_step_opts so = {
        .batch = batch, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = seed};
    so.optim.zero_grad_to_none = 0; /* gradients stay allocated: a step's peak is its own values */
    return so;
}

/* Reserved bytes of the most frugal whole-batch plan among the planner's
 * candidates (keep everything, segments 2..n, revolve 1..n, all). */
static size_t min_reserved(fr_model *m, const fr_step_opts *base, char *which, size_t len) {
    size_t best = SIZE_MAX;
    int n = m->n_units;
    for (int c = 0; c < 2 * n + 1; c++) {
        fr_step_opts o = *base;
        if (c == 0) o.checkpoint = FR_CKPT_ALL;
        else if (c <= n) o.checkpoint = FR_CKPT_REVOLVE, o.ckpt_arg = c;
        else o.checkpoint = FR_CKPT_SEGMENTS, o.ckpt_arg = c - n + 1;
        if (o.checkpoint == FR_CKPT_SEGMENTS && o.ckpt_arg > n) continue;
        fr_step *s = fr_step_build(m, &o);
        if (!s) continue;
        fr_plan_info in;
        fr_step_plan_info(s, &in);
        if (in.reserved < best) {
            best = in.reserved;
            plan_name(&in, which, len);
        }
        fr_step_free(s);
    }
    return best;
}

/* Every whole-batch plan of the chain by family (what --plan-only lists):
 * reserved bytes, held, in-step peak and extra compute, and whether the
 * planner's candidate list (none, segments k, revolve s, all) includes it. */
static void frontier(fr_model *m, const fr_step_opts *base) {
    int n = m->n_units;
    printf(
        "\nEvery whole-batch plan (every:N and sqrt are not among the planner's candidates):\n\n");
    printf("| plan | extra compute | held MiB | in-step peak MiB | arena MiB | reserved MiB | "
           "planner candidate |\n"
           "|---|---:|---:|---:|---:|---:|---|\n");
    for (int c = 0; c < 3 * n + 2; c++) {
        fr_step_opts o = *base;
        if (c == 0) o.checkpoint = FR_CKPT_NONE;
        else if (c == 1) o.checkpoint = FR_CKPT_SQRT;
        else if (c < n + 1) o.checkpoint = FR_CKPT_SEGMENTS, o.ckpt_arg = c;
        else if (c < 2 * n + 1) o.checkpoint = FR_CKPT_EVERY, o.ckpt_arg = c - n;
        else o.checkpoint = FR_CKPT_REVOLVE, o.ckpt_arg = c - 2 * n;
        if (o.ckpt_arg > 16 && o.checkpoint != FR_CKPT_SEGMENTS) continue;
        fr_step *s = fr_step_build(m, &o);
        if (!s) continue;
        fr_plan_info in;
        fr_step_plan_info(s, &in);
        char pn[64];
        plan_name(&in, pn, sizeof pn);
        printf("| %s | +%.1f%% | %.1f | %.1f | %.2f | %.1f | %s |\n", pn, 100 * extra_frac(&in),
               held_at_backward(s) / MIB, s->plan.peak_total / MIB, in.arena / MIB,
               in.reserved / MIB,
               o.checkpoint == FR_CKPT_EVERY || o.checkpoint == FR_CKPT_SQRT ? "no" : "yes");
        fr_step_free(s);
    }
}

static int same_plan(const fr_plan_info *a, const fr_plan_info *b) {
    int arg_a = a->mode == FR_CKPT_SEGMENTS || a->mode == FR_CKPT_REVOLVE ? a->ckpt_arg : 0;
    int arg_b = b->mode == FR_CKPT_SEGMENTS || b->mode == FR_CKPT_REVOLVE ? b->ckpt_arg : 0;
    return a->mode == b->mode && arg_a == arg_b && a->micro_batch == b->micro_batch &&
           a->arena == b->arena && a->recomputed_units == b->recomputed_units;
}

/* ---- PyTorch's points ---------------------------------------------------- */

/* The number after "key": inside [from, to), or NAN. */
static double json_num(const char *from, const char *to, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(from, pat);
    if (!p || p >= to) return NAN;
    p += strlen(pat);
    while (*p == ' ') p++;
    if (!strncmp(p, "null", 4)) return NAN;
    return strtod(p, NULL);
}

/* Reads the "points" array torch_remat.py writes: one object per
 * configuration with label, median_ms, ratio, ratio_of_medians, held_bytes,
 * held_rss_bytes and peak_bytes. Returns how many (0 when the file is absent). */
static int read_torch(const char *path, torch_point *pt, int max, char *blas, size_t blas_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return 0;
    buf[n] = 0;
    blas[0] = 0;
    double g = json_num(buf, buf + n, "matmul_1024_gflops");
    if (!isnan(g)) snprintf(blas, blas_len, "%.0f GFLOP/s matmul", g);
    const char *p = strstr(buf, "\"points\"");
    int k = 0;
    while (p && k < max && (p = strstr(p, "{\"label\": \""))) {
        p += strlen("{\"label\": \"");
        const char *q = strchr(p, '"'), *end = strchr(p, '}');
        if (!q || !end) break;
        snprintf(pt[k].label, sizeof pt[k].label, "%.*s", (int)(q - p), p);
        pt[k].ms = json_num(p, end, "median_ms");
        pt[k].ratio = json_num(p, end, "ratio");
        pt[k].held = json_num(p, end, "held_bytes");
        pt[k].peak = json_num(p, end, "peak_bytes");
        pt[k].held_rss = json_num(p, end, "held_rss_bytes");
        pt[k].ratio_of_medians = json_num(p, end, "ratio_of_medians");
        k++;
        p = end;
    }
    free(buf);
    return k;
}

/* ---- the chart ----------------------------------------------------------- */

typedef struct chart_pt {
    double x, y;
    char label[64];
    int torch;
} chart_pt;

typedef struct box {
    double x0, y0, x1, y1;
} box;

static const double yticks[] = {0.3,  0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                                1.75, 2,   2.5, 3,   4,   5,   6,   8,   10,  15,  20,  30,  50};
#define N_YTICKS (sizeof yticks / sizeof yticks[0])

static int overlaps(const box *a, const box *b) {
    return a->x0 < b->x1 && b->x0 < a->x1 && a->y0 < b->y1 && b->y0 < a->y1;
}

/* One panel: time ratio (y, y_lo..y_hi, log scale: the region around 1.35x
 * stays readable next to revolve's 2-5x) against MiB (x, 0..x_max). Each
 * label goes to the first of twelve places around its marker that overlaps
 * no marker and no label placed before it. */
static void panel(FILE *f, double ox, double oy, double w, double h, const char *xlabel,
                  const chart_pt *pt, int n, double x_max, double y_lo, double y_hi) {
    fprintf(f, "<g font-family=\"sans-serif\" font-size=\"11\">\n");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#999\"/>\n",
            ox, oy, w, h);
#define PX(v) (ox + (v) / x_max * w)
#define PY(v) (oy + h - log((v) / y_lo) / log(y_hi / y_lo) * h)
    double xstep = x_max > 60 ? 10 : 5;
    for (double v = 0; v <= x_max + 1e-9; v += xstep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
                PX(v), oy, PX(v), oy + h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">%.0f</text>\n",
                PX(v), oy + h + 14, v);
    }
    for (size_t t = 0; t < N_YTICKS; t++) {
        double v = yticks[t];
        if (v < y_lo || v > y_hi) continue;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", ox,
                PY(v), ox + w, PY(v), fabs(v - 1) < 1e-9 ? "#bbb" : "#eee");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#444\">%g</text>\n",
                ox - 4, PY(v) + 4, v);
    }
    /* the goal: at most 1.35x keep-everything at about sqrt(n) memory */
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c33\" "
            "stroke-dasharray=\"5,4\"/>\n",
            ox, PY(1.35), ox + w, PY(1.35));
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#c33\">1.35x</text>\n",
            ox + w - 4, PY(1.35) - 4);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n",
            ox + w / 2, oy + h + 32, xlabel);
    fprintf(f,
            "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"12\">"
            "step time / keep-everything step (log scale)</text>\n",
            ox - 38, oy + h / 2);
    box placed[2 * (MAX_CFG + MAX_TORCH) + 2];
    int np = 0;
    placed[np++] = (box){ox + w - 40, PY(1.35) - 16, ox + w, PY(1.35) - 2}; /* the goal's label */
    for (int i = 0; i < n; i++) /* the markers themselves are obstacles */
        placed[np++] = (box){PX(pt[i].x) - 5, PY(pt[i].y) - 5, PX(pt[i].x) + 5, PY(pt[i].y) + 5};
    for (int i = 0; i < n; i++) {
        const char *col = pt[i].torch ? "#d2691e" : "#1f5fa8";
        double x = PX(pt[i].x), y = PY(pt[i].y);
        if (pt[i].torch)
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"%s\"/>\n",
                    x - 4.5, y - 4.5, col);
        else fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\"/>\n", x, y, col);
        double tw = 6.3 * (double)strlen(pt[i].label), th = 12;
        /* (dx, dy) of the label's left end and baseline; dx < 0: right-aligned */
        static const double off[12][2] = {{7, 4},   {-7, 4},   {7, -7},  {-7, -7},
                                          {7, 15},  {-7, 15},  {0, -10}, {0, 20},
                                          {9, -18}, {-9, -18}, {9, 26},  {-9, 26}};
        box b = {x + 7, y - 8, x + 7 + tw, y + 4};
        for (int k = 0; k < 12; k++) {
            double lx = off[k][0] > 0   ? x + off[k][0]
                        : off[k][0] < 0 ? x + off[k][0] - tw
                                        : x - tw / 2;
            double ly = y + off[k][1];
            box c = {lx, ly - th + 3, lx + tw, ly + 3};
            if (c.x0 < ox + 1 || c.x1 > ox + w - 1 || c.y0 < oy + 1 || c.y1 > oy + h - 1) continue;
            int ok = 1;
            for (int j = 0; j < np && ok; j++) ok = !overlaps(&c, &placed[j]);
            if (ok) {
                b = c;
                break;
            }
        }
        placed[np++] = b;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>\n", b.x0, b.y1 - 3, col,
                pt[i].label);
    }
#undef PX
#undef PY
    fprintf(f, "</g>\n");
}

/* Labels: a configuration and the planner budgets that chose the same plan
 * ("seg2=auto1-4"); a planner point of its own says its plan ("auto5:seg3"). */
static void point_label(const config *c, int nc, int i, char *buf, size_t len) {
    char s[64];
    int k = snprintf(s, sizeof s, "%.20s", c[i].label);
    if (c[i].mode == FR_CKPT_AUTO) {
        const fr_plan_info *in = &c[i].info;
        const char *fam = in->mode == FR_CKPT_SEGMENTS  ? "seg"
                          : in->mode == FR_CKPT_REVOLVE ? "rev"
                                                        : mode_name(in->mode);
        int arg = in->mode == FR_CKPT_SEGMENTS || in->mode == FR_CKPT_REVOLVE ? in->ckpt_arg : 0;
        k += snprintf(s + k, sizeof s - (size_t)k, ":%.8s", fam);
        if (arg) k += snprintf(s + k, sizeof s - (size_t)k, "%d", arg % 1000);
        if (in->accumulate > 1)
            k += snprintf(s + k, sizeof s - (size_t)k, "x%d", in->accumulate % 100000);
    }
    int first = -1, last = -1, any = 0;
    for (int j = 0; j <= nc && k < 40; j++) {
        int same = j < nc && c[j].same_as == i;
        if (same && first < 0) first = j;
        if (same) last = j;
        if ((!same || j == nc) && first >= 0) {
            if (first == last)
                k += snprintf(s + k, sizeof s - (size_t)k, "%c%.8s", any ? ',' : '=',
                              c[first].label);
            else
                k += snprintf(s + k, sizeof s - (size_t)k, "%c%.8s-%.4s", any ? ',' : '=',
                              c[first].label,
                              c[last].label + strspn(c[last].label, "abcdefghijklmnopqrstuvwxyz"));
            any = 1;
            first = -1;
        }
    }
    snprintf(buf, len, "%s", s);
}

static int write_svg(const char *path, const config *c, int nc, const torch_point *tp, int nt) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    chart_pt a[MAX_CFG + MAX_TORCH], b[MAX_CFG + MAX_TORCH];
    int n = 0;
    double xa = 0, xb = 0, ylo = 0.9, yhi = 1.5;
    for (int i = 0; i < nc; i++) {
        if (c[i].same_as >= 0) continue;
        a[n] = (chart_pt){c[i].held / MIB, c[i].ratio, "", 0};
        point_label(c, nc, i, a[n].label, sizeof a[n].label);
        b[n] = a[n];
        b[n].x = c[i].meas_step / MIB;
        n++;
    }
    for (int i = 0; i < nt; i++) {
        a[n] = (chart_pt){tp[i].held / MIB, tp[i].ratio, "", 1};
        snprintf(a[n].label, sizeof a[n].label, "torch %.24s", tp[i].label);
        b[n] = a[n];
        b[n].x = tp[i].peak / MIB;
        n++;
    }
    for (int i = 0; i < n; i++) {
        if (a[i].x > xa) xa = a[i].x;
        if (b[i].x > xb) xb = b[i].x;
        if (a[i].y * 1.05 > yhi) yhi = a[i].y * 1.05;
        if (a[i].y / 1.05 < ylo) ylo = a[i].y / 1.05;
    }
    for (size_t t = 0; t < N_YTICKS; t++) /* the axis ends on ticks */
        if (yticks[t] >= yhi) {
            yhi = yticks[t];
            break;
        }
    for (size_t t = N_YTICKS; t-- > 0;)
        if (yticks[t] <= ylo) {
            ylo = yticks[t];
            break;
        }
    xa = ceil(xa * 1.1 / 5) * 5;
    xb = ceil(xb * 1.1 / 5) * 5;
    double W = 1200, H = 740, ph = 560;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 "
            "0 %.0f %.0f\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f,
            "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-family=\"sans-serif\" "
            "font-size=\"15\">"
            "Activation checkpointing: 32 x (Linear(1024,1024)+ReLU) + Linear(1024,10), batch 256, "
            "SGD</text>\n",
            W / 2);
    fprintf(f,
            "<text x=\"%.0f\" y=\"44\" text-anchor=\"middle\" font-family=\"sans-serif\" "
            "font-size=\"12\" "
            "fill=\"#444\"><tspan fill=\"#1f5fa8\">circles: frugal</tspan>, each against frugal's "
            "keep-everything step%s</text>\n",
            W / 2,
            nt ? "; <tspan fill=\"#d2691e\">squares: PyTorch 1.13 "
                 "checkpoint_sequential</tspan>, against PyTorch's"
               : "");
    fprintf(f,
            "<text x=\"%.0f\" y=\"62\" text-anchor=\"middle\" font-family=\"sans-serif\" "
            "font-size=\"12\" "
            "fill=\"#444\">segN: N segments (checkpoint_sequential), revS: revolve with S slots, "
            "autoK: the "
            "planner at the K-th budget (=: the same plan)</text>\n",
            W / 2);
    panel(f, 70, 86, 480, ph,
          "held for backward (MiB): saved activations live when the backward starts", a, n, xa, ylo,
          yhi);
    panel(f, 690, 86, 480, ph, "in-step peak (MiB): frugal's step values, PyTorch's RSS rise", b, n,
          xb, ylo, yhi);
    fprintf(f, "</svg>\n");
    return fclose(f);
}

/* ---- part 1: the chain --------------------------------------------------- */

typedef struct chain {
    fr_model *m;
    fr_step_opts base;
    config c[MAX_CFG];
    int nc;
    size_t r_max, r_min; /* reserved: keep everything; the least of any whole-batch plan */
    char min_plan[64];
    float first_loss, last_loss;
} chain;

/* The configurations, compiled; the planner's budgets evenly spaced from
 * keep-everything's reserved bytes down to the minimum (the top one left out:
 * it is keep-everything). */
static fr_status chain_compile(fr_ctx *ctx, chain *ch, const bench_opts *o) {
    static const struct {
        const char *label;
        fr_ckpt_mode mode;
        int arg;
    } fixed[] = {
        {"none", FR_CKPT_NONE, 0},     {"seg2", FR_CKPT_SEGMENTS, 2}, {"seg4", FR_CKPT_SEGMENTS, 4},
        {"seg6", FR_CKPT_SEGMENTS, 6}, {"seg8", FR_CKPT_SEGMENTS, 8}, {"sqrt", FR_CKPT_SQRT, 0},
        {"rev2", FR_CKPT_REVOLVE, 2},  {"rev3", FR_CKPT_REVOLVE, 3},  {"rev4", FR_CKPT_REVOLVE, 4},
        {"rev6", FR_CKPT_REVOLVE, 6},  {"rev8", FR_CKPT_REVOLVE, 8}};
    config *c = ch->c;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++, ch->nc++) {
        snprintf(c[ch->nc].label, sizeof c[ch->nc].label, "%s", fixed[i].label);
        c[ch->nc].mode = fixed[i].mode;
        c[ch->nc].arg = fixed[i].arg;
    }
    ch->r_min = min_reserved(ch->m, &ch->base, ch->min_plan, sizeof ch->min_plan);
    fr_step_opts on = ch->base;
    on.checkpoint = FR_CKPT_NONE;
    fr_step *probe = fr_step_build(ch->m, &on);
    if (!probe || ch->r_min == SIZE_MAX) return FR_ERR_ARG;
    fr_plan_info pin;
    fr_step_plan_info(probe, &pin);
    fr_step_free(probe);
    ch->r_max = pin.reserved;
    for (int k = o->n_auto - 1; k >= 0 && ch->nc < MAX_CFG; k--, ch->nc++) {
        double f = o->n_auto > 1 ? (double)k / o->n_auto : 0;
        c[ch->nc].budget = ch->r_min + (size_t)((double)(ch->r_max - ch->r_min) * f);
        snprintf(c[ch->nc].label, sizeof c[ch->nc].label, "auto%d", o->n_auto - k);
        c[ch->nc].mode = FR_CKPT_AUTO;
    }
    for (int i = 0; i < ch->nc; i++) {
        fr_step_opts so = ch->base;
        so.checkpoint = c[i].mode;
        so.ckpt_arg = c[i].arg;
        so.budget = c[i].budget;
        c[i].same_as = -1;
        if (!(c[i].s = fr_step_compile(ch->m, &so))) {
            fprintf(stderr, "bench_remat: %s: %s\n", c[i].label, fr_last_error(ctx));
            return FR_ERR_ARG;
        }
        fr_step_plan_info(c[i].s, &c[i].info);
        for (int j = 0; j < i && c[i].same_as < 0; j++)
            if (c[j].same_as < 0 && same_plan(&c[i].info, &c[j].info)) c[i].same_as = j;
        c[i].held = held_at_backward(c[i].s);
        c[i].plan_act = c[i].s->plan.peak[FR_MEM_ACTIVATIONS];
        c[i].plan_step = c[i].s->plan.peak_total;
        c[i].ms = calloc((size_t)o->steps, sizeof *c[i].ms);
        c[i].cpu = calloc((size_t)o->steps, sizeof *c[i].cpu);
        if (!c[i].ms || !c[i].cpu) return FR_ERR_NOMEM;
    }
    return FR_OK;
}

static int run_torch(const bench_opts *o, int group) {
    if (!o->torch_cmd) return 0;
    fprintf(stderr, "bench_remat: PyTorch, run %d: %s\n", group + 1, o->torch_cmd);
    fflush(NULL);
    int rc = system(o->torch_cmd);
    if (rc)
        fprintf(stderr,
                "bench_remat: the PyTorch command exited with %d (its points are left out)\n", rc);
    return rc;
}

/* One timed step of a configuration: its wall and CPU time go to its lists
 * (wall ms returned), the allocator's peaks during it to its maxima. */
static fr_status timed_step(fr_ctx *ctx, config *ci, fr_rng *r, float *x, int32_t *y, int batch,
                            float *loss, float *first_loss, double *ms) {
    fill_batch(r, x, y, batch, 1024, 10);
    fr_batch b = {batch, x, y, NULL, NULL};
    fr_mem_stats before, after;
    fr_mem_get_stats(ctx, &before);
    fr_mem_reset_peak(ctx);
    double t0 = now_ms(), u0 = cpu_ms();
    fr_status st = fr_step_run(ci->s, &b, loss, NULL);
    double t1 = now_ms(), u1 = cpu_ms();
    if (st) return st;
    if (isnan(*first_loss)) *first_loss = *loss;
    fr_mem_get_stats(ctx, &after);
    ci->cpu[ci->n_ms] = u1 - u0;
    ci->ms[ci->n_ms++] = *ms = t1 - t0;
    size_t act = after.allocated_peak[FR_MEM_ACTIVATIONS] - before.allocated[FR_MEM_ACTIVATIONS];
    size_t step = after.allocated_total_peak - before.allocated_total;
    if (act > ci->meas_act) ci->meas_act = act;
    if (step > ci->meas_step) ci->meas_step = step;
    return FR_OK;
}

/* Warm-up, then the timed rounds (split in groups with PyTorch between them):
 * one step per distinct plan per round, the order reversed every other round,
 * and a keep-everything step before every REF_EVERY-th of them and at the
 * end. A step's ratio is its time over the mean of the two keep-everything
 * steps around it, so drift on a shared machine cancels unless it changes
 * within a few steps; a configuration's time ratio is the median of those. */
#define REF_EVERY 3

static fr_status chain_time(fr_ctx *ctx, chain *ch, const bench_opts *o) {
    const int batch = ch->base.batch;
    config *c = ch->c;
    float *x = malloc((size_t)batch * 1024 * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    double *tmp = malloc((size_t)o->steps * (ch->nc / REF_EVERY + 2) * sizeof *tmp);
    int *pend = malloc((size_t)ch->nc * sizeof *pend);
    double *pend_ms = malloc((size_t)ch->nc * sizeof *pend_ms);
    fr_status st = FR_ERR_NOMEM;
    if (!x || !y || !tmp || !pend || !pend_ms) goto done;
    /* keep-everything runs up to nc / REF_EVERY + 2 times a round */
    free(c[0].ms);
    free(c[0].cpu);
    c[0].ms = calloc((size_t)o->steps * (ch->nc / REF_EVERY + 2), sizeof *c[0].ms);
    c[0].cpu = calloc((size_t)o->steps * (ch->nc / REF_EVERY + 2), sizeof *c[0].cpu);
    for (int i = 0; i < ch->nc; i++) c[i].rs = calloc((size_t)o->steps, sizeof *c[i].rs);
    for (int i = 0; i < ch->nc; i++)
        if (!c[i].rs || !c[0].ms || !c[0].cpu) goto done;
    fr_rng r = fr_rng_make(o->seed, 0x7e3a);
    fr_batch b = {batch, x, y, NULL, NULL};
    float loss = NAN;
    for (int i = 0; i < ch->nc; i++)
        for (int w = 0; w < o->warmup && c[i].same_as < 0; w++) {
            fill_batch(&r, x, y, batch, 1024, 10);
            if ((st = fr_step_run(c[i].s, &b, &loss, NULL))) goto done;
            if (isnan(ch->first_loss)) ch->first_loss = loss;
        }
    int groups = o->torch_cmd ? o->rounds : 1;
    for (int g = 0; g < groups; g++) {
        run_torch(o, g);
        for (int rd = o->steps * g / groups; rd < o->steps * (g + 1) / groups; rd++) {
            fprintf(stderr, "bench_remat: round %d/%d\n", rd + 1, o->steps);
            double ref0, ref1, t;
            int np = 0, left = 0;
            for (int i = 1; i < ch->nc; i++) left += c[i].same_as < 0;
            if ((st = timed_step(ctx, &c[0], &r, x, y, batch, &loss, &ch->first_loss, &ref0)))
                goto done;
            for (int k = 1; k < ch->nc; k++) {
                config *ci = &c[rd % 2 ? ch->nc - k : k];
                if (ci->same_as >= 0) continue;
                if ((st = timed_step(ctx, ci, &r, x, y, batch, &loss, &ch->first_loss, &t)))
                    goto done;
                pend[np] = (int)(ci - c);
                pend_ms[np++] = t;
                if (np < REF_EVERY && --left > 0) continue;
                if (np == REF_EVERY) left--;
                if ((st = timed_step(ctx, &c[0], &r, x, y, batch, &loss, &ch->first_loss, &ref1)))
                    goto done;
                for (int j = 0; j < np; j++) {
                    config *cj = &c[pend[j]];
                    cj->rs[cj->n_rs++] = pend_ms[j] / (0.5 * (ref0 + ref1));
                }
                ref0 = ref1;
                np = 0;
            }
        }
    }
    ch->last_loss = loss;
    /* summaries; a configuration with another's plan takes its numbers */
    for (int i = 0; i < ch->nc; i++) {
        const config *cj = &c[c[i].same_as >= 0 ? c[i].same_as : i];
        int n = cj->n_ms;
        memcpy(tmp, cj->ms, (size_t)n * sizeof *tmp);
        c[i].median = median_of(tmp, n);
        c[i].min = tmp[0]; /* sorted by median_of */
        memcpy(tmp, cj->cpu, (size_t)n * sizeof *tmp);
        c[i].cpu_median = median_of(tmp, n);
        memcpy(tmp, cj->rs, (size_t)cj->n_rs * sizeof *tmp);
        c[i].ratio = i == 0 ? 1.0 : median_of(tmp, cj->n_rs);
        c[i].meas_act = cj->meas_act;
        c[i].meas_step = cj->meas_step;
    }
    st = FR_OK;
done:
    free(x);
    free(y);
    free(tmp);
    free(pend);
    free(pend_ms);
    return st;
}

static void chain_tables(const chain *ch, const bench_opts *o, const torch_point *tp, int nt,
                         const char *tpath, const char *blas) {
    const config *c = ch->c;
    int timed = !o->plan_only;
    double base_ms = c[0].median, base_held = (double)c[0].held;
    double base_step = (double)(timed ? c[0].meas_step : c[0].plan_step);
    printf("| config | plan | budget MiB | ms/step | time ratio | ratio of medians | extra compute "
           "| held MiB | "
           "held ratio | act peak MiB (plan/meas) | in-step peak MiB (plan/meas) | in-step ratio | "
           "reserved MiB "
           "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < ch->nc; i++) {
        char pn[64], bud[32] = "", note[48] = "";
        plan_name(&c[i].info, pn, sizeof pn);
        if (c[i].budget) snprintf(bud, sizeof bud, "%.1f", c[i].budget / MIB);
        if (c[i].same_as >= 0) snprintf(note, sizeof note, " (= %s)", c[c[i].same_as].label);
        size_t step = timed ? c[i].meas_step : c[i].plan_step;
        printf("| %s | %s%s | %s | %.1f | %.2fx | %.2fx | +%.1f%% | %.1f | %.2f | %.1f / %.1f | "
               "%.1f / %.1f | %.2f "
               "| %.1f |\n",
               c[i].label, pn, note, bud, c[i].median, c[i].ratio, c[i].median / base_ms,
               100 * extra_frac(&c[i].info), c[i].held / MIB, c[i].held / base_held,
               c[i].plan_act / MIB, c[i].meas_act / MIB, c[i].plan_step / MIB, step / MIB,
               step / base_step, c[i].info.reserved / MIB);
    }
    printf("\ntime ratio: the median over %d rounds of the step's time over the mean of the "
           "keep-everything "
           "steps run just before and after it (one every %d steps); ratio of medians: median "
           "ms/step over "
           "keep-everything's. held: saved activations live when the backward starts; in-step "
           "peak: all step "
           "values (activations + workspace) at their peak; meas: the allocator's counters during "
           "the timed "
           "steps.\n",
           o->steps, REF_EVERY);
    if (timed)
        printf("loss %.4f -> %.4f over all steps (the configurations share the weights)\n",
               ch->first_loss, ch->last_loss);
    if (!nt) return;
    printf("\n### PyTorch (%s, %s): checkpoint_sequential, each against its own keep-everything "
           "step\n\n",
           tpath, blas[0] ? blas : "BLAS unknown");
    printf("| config | ms/step | time ratio | ratio of medians | held MiB (saved tensors) | held "
           "ratio | held MiB "
           "(RSS) | in-step peak MiB (RSS) | in-step ratio "
           "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < nt; i++)
        printf("| torch %s | %.1f | %.2fx | %.2fx | %.1f | %.2f | %.1f | %.1f | %.2f |\n",
               tp[i].label, tp[i].ms, tp[i].ratio, tp[i].ratio_of_medians, tp[i].held / MIB,
               tp[i].held / tp[0].held, tp[i].held_rss / MIB, tp[i].peak / MIB,
               tp[i].peak / tp[0].peak);
    if (!timed) return;
    /* the goal: at every memory level, less extra time than PyTorch */
    printf("\n### At each PyTorch point\n\nfrugal with the same schedule, and frugal's fastest "
           "configuration that "
           "holds no more and peaks no higher, each engine against its own keep-everything step "
           "(time ratio, "
           "ratio of medians in brackets):\n\n");
    printf("| torch config | torch | frugal, same schedule | frugal, fastest no larger | its held "
           "/ in-step ratio | "
           "less extra time |\n|---|---:|---:|---:|---:|---|\n");
    for (int t = 1; t < nt; t++) {
        double hr = tp[t].held / tp[0].held, pr = tp[t].peak / tp[0].peak;
        int best = -1, same = -1;
        for (int i = 0; i < ch->nc; i++) {
            if (c[i].same_as >= 0) continue;
            if (!strcmp(c[i].label, tp[t].label)) same = i;
            if (c[i].held / base_held > hr + 1e-9 || c[i].meas_step / base_step > pr + 1e-9)
                continue;
            if (best < 0 || c[i].ratio < c[best].ratio) best = i;
        }
        char sm[64] = "-", bm[64] = "(none that small)", hp[32] = "";
        int ok = 0;
        if (same >= 0) {
            snprintf(sm, sizeof sm, "%s %.2fx (%.2fx)", c[same].label, c[same].ratio,
                     c[same].median / base_ms);
            ok = c[same].ratio < tp[t].ratio;
        }
        if (best >= 0) {
            snprintf(bm, sizeof bm, "%s %.2fx (%.2fx)", c[best].label, c[best].ratio,
                     c[best].median / base_ms);
            snprintf(hp, sizeof hp, "%.2f / %.2f", c[best].held / base_held,
                     c[best].meas_step / base_step);
            ok |= c[best].ratio < tp[t].ratio;
        }
        printf("| %s | %.2fx (%.2fx) | %s | %s | %s | %s |\n", tp[t].label, tp[t].ratio,
               tp[t].ratio_of_medians, sm, bm, hp, ok ? "yes" : "no");
    }
}

static int chain_json(const chain *ch, const bench_opts *o, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const config *c = ch->c;
    fprintf(f,
            "{\"model\": \"32x(Linear(1024,1024)+ReLU)+Linear(1024,10)\", \"batch\": %d, "
            "\"threads\": %d, "
            "\"steps\": %d, \"warmup\": %d, \"reserved_max\": %zu, \"reserved_min\": %zu, "
            "\"configs\": [\n",
            ch->base.batch, fr_get_threads(ch->m->ctx), o->steps, o->warmup, ch->r_max, ch->r_min);
    for (int i = 0; i < ch->nc; i++) {
        char pn[64];
        plan_name(&c[i].info, pn, sizeof pn);
        const config *cj = &c[c[i].same_as >= 0 ? c[i].same_as : i];
        fprintf(f,
                "  {\"label\": \"%s\", \"plan\": \"%s\", \"same_as\": %s%s%s, \"budget\": %zu, "
                "\"micro_batch\": %d, \"recomputed_units\": %d, \"extra_compute\": %.6f, "
                "\"median_ms\": %.4f, "
                "\"ratio\": %.4f, \"ratio_of_medians\": %.4f, \"min_ms\": %.4f, \"cpu_median_ms\": "
                "%.4f, "
                "\"held_bytes\": %zu, \"plan_act_peak\": %zu, \"meas_act_peak\": %zu, "
                "\"plan_step_peak\": %zu, "
                "\"meas_step_peak\": %zu, \"arena\": %zu, \"reserved\": %zu, \"ms\": [",
                c[i].label, pn, c[i].same_as >= 0 ? "\"" : "",
                c[i].same_as >= 0 ? cj->label : "null", c[i].same_as >= 0 ? "\"" : "", c[i].budget,
                c[i].info.micro_batch, c[i].info.recomputed_units, extra_frac(&c[i].info),
                c[i].n_ms || cj->n_ms ? c[i].median : 0, cj->n_ms ? c[i].ratio : 0,
                cj->n_ms ? c[i].median / c[0].median : 0, cj->n_ms ? c[i].min : 0,
                cj->n_ms ? c[i].cpu_median : 0, c[i].held, c[i].plan_act, c[i].meas_act,
                c[i].plan_step, c[i].meas_step, c[i].info.arena, c[i].info.reserved);
        for (int k = 0; k < cj->n_ms; k++) fprintf(f, "%s%.3f", k ? ", " : "", cj->ms[k]);
        fprintf(f, "], \"cpu_ms\": [");
        for (int k = 0; k < cj->n_ms; k++) fprintf(f, "%s%.3f", k ? ", " : "", cj->cpu[k]);
        fprintf(f, "], \"step_ratios\": [");
        for (int k = 0; k < cj->n_rs; k++) fprintf(f, "%s%.4f", k ? ", " : "", cj->rs[k]);
        fprintf(f, "]}%s\n", i + 1 < ch->nc ? "," : "");
    }
    fprintf(f, "]}\n");
    return fclose(f);
}

static int chain_bench(fr_ctx *ctx, const bench_opts *o) {
    chain ch;
    memset(&ch, 0, sizeof ch);
    ch.first_loss = ch.last_loss = NAN;
    ch.base = chain_opts(256, o->seed);
    int rc = 1;
    if (!(ch.m = build_chain(ctx, o->seed)) || chain_compile(ctx, &ch, o)) goto fail;
    printf("## Activation checkpointing: 32 x (Linear(1024,1024)+ReLU) + Linear(1024,10), batch "
           "256, SGD, "
           "%d threads\n\n",
           fr_get_threads(ctx));
    printf("Reserved bytes: keep everything %.1f MiB; the least of any whole-batch plan %.1f MiB "
           "(%s). "
           "Planner budgets (auto1..auto%d) evenly spaced from %.1f down to %.1f MiB.\n\n",
           ch.r_max / MIB, ch.r_min / MIB, ch.min_plan, o->n_auto,
           (ch.r_min + (ch.r_max - ch.r_min) * (o->n_auto - 1.0) / o->n_auto) / MIB,
           ch.r_min / MIB);
    if (o->plan_only) {
        for (int i = 0; i < ch.nc; i++) ch.c[i].median = ch.c[i].ratio = NAN;
        frontier(ch.m, &ch.base);
        printf("\n");
    } else if (chain_time(ctx, &ch, o)) {
        goto fail;
    }
    torch_point tp[MAX_TORCH];
    char blas[64] = "", path[512];
    if (o->torch) snprintf(path, sizeof path, "%s", o->torch);
    else snprintf(path, sizeof path, "%s/torch_remat.json", o->out);
    int nt = read_torch(path, tp, MAX_TORCH, blas, sizeof blas);
    chain_tables(&ch, o, tp, nt, path, blas);
    mkdir(o->out, 0777);
    snprintf(path, sizeof path, "%s/remat.json", o->out);
    if (chain_json(&ch, o, path)) fprintf(stderr, "bench_remat: cannot write %s\n", path);
    if (!o->plan_only) {
        snprintf(path, sizeof path, "%s/remat.svg", o->out);
        if (write_svg(path, ch.c, ch.nc, tp, nt))
            fprintf(stderr, "bench_remat: cannot write %s\n", path);
        else printf("\nwrote %s/remat.json and %s\n", o->out, path);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench_remat: %s\n", fr_last_error(ctx));
out:
    for (int i = 0; i < ch.nc; i++) {
        fr_step_free(ch.c[i].s);
        free(ch.c[i].ms);
        free(ch.c[i].cpu);
        free(ch.c[i].rs);
    }
    fr_model_free(ch.m);
    return rc;
}

/* ---- part 2: the largest batch that fits ---------------------------------- */

/* Whether the planner finds a plan for `batch` within the budget; fills info. */
static int planner_fits(fr_model *m, const fr_step_opts *base, int batch, fr_plan_info *info) {
    fr_step_opts o = *base;
    o.batch = batch;
    o.checkpoint = FR_CKPT_AUTO;
    char saved[FR_ERR_LEN];
    memcpy(saved, m->ctx->err, sizeof saved);
    fr_step *s = fr_step_plan_budget(m, &o);
    memcpy(m->ctx->err, saved, sizeof saved);
    if (!s) return 0;
    fr_step_plan_info(s, info);
    fr_step_free(s);
    return info->reserved <= o.budget;
}

/* The largest batch for which some whole-batch plan (min_reserved's
 * candidates) fits: a check on fr_batch_auto, which tries revolve 1 only. */
static int batch_any(fr_model *m, const fr_step_opts *base, int max_batch) {
    char which[64];
    fr_step_opts o = *base;
    int lo = 0, hi = 1;
    for (;; hi *= 2) {
        o.batch = hi;
        if (hi > max_batch || min_reserved(m, &o, which, sizeof which) > base->budget) break;
        lo = hi;
    }
    if (hi > max_batch) hi = max_batch + 1;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        o.batch = mid;
        if (min_reserved(m, &o, which, sizeof which) <= base->budget) lo = mid;
        else hi = mid;
    }
    return lo;
}

static int batch_table(fr_ctx *ctx) {
    const char *models[] = {"resnet", "cnn"};
    const size_t budgets[] = {64u << 20, 128u << 20, 256u << 20};
    printf("\n## Largest batch whose plan fits the budget (Adam; reserved = params + grads + Adam "
           "state + arena "
           "+ one input batch)\n\n");
    printf("| model | budget | no planner (keep everything) | planner, whole batch | plan there | "
           "check: any candidate, whole batch | planner, micro-batches allowed | plan there |\n"
           "|---|---:|---:|---:|---|---:|---:|---|\n");
    for (size_t mi = 0; mi < 2; mi++) {
        fr_model *m = fr_model_load(ctx, models[mi]);
        if (!m || fr_model_init(m, 1)) {
            fprintf(stderr, "bench_remat: %s: %s\n", models[mi], fr_last_error(ctx));
            fr_model_free(m);
            return 1;
        }
        for (size_t bi = 0; bi < 3; bi++) {
            fr_step_opts so = {
                .batch = 1, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 1};
            so.budget = budgets[bi];
            so.checkpoint = FR_CKPT_NONE;
            int b_none = 0, b_auto = 0;
            if (fr_batch_auto(m, &so, 1 << 16, &b_none)) b_none = 0;
            so.checkpoint = FR_CKPT_AUTO;
            if (fr_batch_auto(m, &so, 1 << 16, &b_auto)) b_auto = 0;
            int b_any = batch_any(m, &so, 1 << 16);
            fr_plan_info ia = {0}, im = {0};
            char pa[64] = "-", pm[64] = "-";
            if (b_auto && planner_fits(m, &so, b_auto, &ia)) {
                plan_name(&ia, pa, sizeof pa);
                size_t k = strlen(pa);
                snprintf(pa + k, sizeof pa - k, ", +%.0f%% compute", 100 * extra_frac(&ia));
            }
            /* micro-batches: multiples of the whole-batch size that fits (its
             * plan then still works per micro-batch), doubling then bisecting */
            int unit = b_auto > 0 ? b_auto : 1, lo = 0, hi = 1;
            fr_plan_info tmp;
            while (hi * unit <= (1 << 16) && planner_fits(m, &so, hi * unit, &tmp))
                lo = hi, hi *= 2;
            if (hi * unit > (1 << 16)) hi = (1 << 16) / unit + 1;
            while (hi - lo > 1) {
                int mid = lo + (hi - lo) / 2;
                if (planner_fits(m, &so, mid * unit, &tmp)) lo = mid;
                else hi = mid;
            }
            int b_micro = lo * unit;
            if (b_micro && planner_fits(m, &so, b_micro, &im)) {
                plan_name(&im, pm, sizeof pm);
                size_t k = strlen(pm);
                snprintf(pm + k, sizeof pm - k, ", +%.0f%% compute", 100 * extra_frac(&im));
            }
            printf("| %s | %zu MiB | %d | %d | %s | %d | %d%s | %s |\n", models[mi],
                   budgets[bi] >> 20, b_none, b_auto, pa, b_any, b_micro,
                   b_micro >= (1 << 16) - unit ? "+" : "", pm);
            fflush(stdout);
        }
        fr_model_free(m);
    }
    printf("\n(\"+\": the search stopped at 65536. With micro-batches only the input batch grows "
           "with the "
           "batch; BatchNorm then sees micro-batch statistics, which the planner treats as a last "
           "resort.)\n");
    return 0;
}

/* ---- main ---------------------------------------------------------------- */

static const char *usage =
    "usage: bench_remat [--steps N] [--warmup W] [--threads T] [--auto K] [--seed S] [--out DIR]\n"
    "                   [--torch FILE] [--torch-cmd CMD] [--rounds R] [--no-chain] [--no-batch]\n"
    "                   [--plan-only] [--quick]\n";

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* OpenBLAS on the core the CPU calls for (frugal.h) */
    static const struct option longs[] = {{"steps", required_argument, 0, 'n'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"threads", required_argument, 0, 't'},
                                          {"auto", required_argument, 0, 'a'},
                                          {"seed", required_argument, 0, 's'},
                                          {"out", required_argument, 0, 'o'},
                                          {"torch", required_argument, 0, 'T'},
                                          {"torch-cmd", required_argument, 0, 'C'},
                                          {"rounds", required_argument, 0, 'r'},
                                          {"no-chain", no_argument, 0, 'c'},
                                          {"no-batch", no_argument, 0, 'b'},
                                          {"plan-only", no_argument, 0, 'p'},
                                          {"quick", no_argument, 0, 'q'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    bench_opts o = {.steps = 5,
                    .warmup = 2,
                    .threads = 2,
                    .n_auto = 8,
                    .rounds = 1,
                    .chain = 1,
                    .batch_table = 1,
                    .out = "bench/out"};
    int c, seed = 1;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_int("steps", optarg, 1, 64, &o.steps)) return 2;
            break;
        case 'w':
            if (parse_int("warmup", optarg, 0, 10000, &o.warmup)) return 2;
            break;
        case 't':
            if (parse_int("threads", optarg, 0, 4096, &o.threads)) return 2;
            break;
        case 'a':
            if (parse_int("auto", optarg, 0, MAX_CFG - 12, &o.n_auto)) return 2;
            break;
        case 's':
            if (parse_int("seed", optarg, 0, 1 << 30, &seed)) return 2;
            break;
        case 'r':
            if (parse_int("rounds", optarg, 1, 100, &o.rounds)) return 2;
            break;
        case 'o': o.out = optarg; break;
        case 'T': o.torch = optarg; break;
        case 'C': o.torch_cmd = optarg; break;
        case 'c': o.chain = 0; break;
        case 'b': o.batch_table = 0; break;
        case 'p': o.plan_only = 1; break;
        case 'q': o.steps = 1, o.warmup = 1, o.n_auto = 3; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_remat: unexpected argument '%s'\n%s", argv[optind], usage);
        return 2;
    }
    if (o.torch_cmd && o.rounds > o.steps) o.rounds = o.steps;
    o.seed = (uint64_t)seed;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "bench_remat: out of memory\n"), 1;
    fr_set_threads(ctx, o.threads);
    int rc = 0;
    if (o.chain) rc = chain_bench(ctx, &o);
    if (!rc && o.batch_table) rc = batch_table(ctx);
    fr_ctx_free(ctx);
    return rc;
}
