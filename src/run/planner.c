/* planner.c — give it a budget and it chooses: among plans that keep
 * everything, recompute segments (checkpoint_sequential, every:N), or use
 * binomial checkpointing with s slots, each at the full batch or split into
 * micro-batches (and, under --precision auto, with activations stored in
 * fp32 or bf16), the least costly whose exact plan (the same plan the
 * executor runs) fits. Each family is searched, not enumerated, when it is
 * long (plan_search). Cost is the extra FLOPs as a fraction of the step's,
 * plus what splitting the batch costs in time (split_cost: a fixed cost per
 * node run and smaller GEMMs, measured), what bf16 activations and
 * --offload's copies cost (mixed_cost, offload_cost), and a whole step more
 * when the model has BatchNorm (micro-batches change its batch statistics,
 * so it is the last resort). Nothing fits: the error names the smallest
 * budget found that does and the plan that gets there. Also the public
 * fr_step_compile (through fr_step_prepare: under a budget the planner's
 * choice, else the step as given) and what `frugal plan` prints. */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "backend/backend.h"
#include "run/planner.h"
#include "plan/remat.h"
#include "core/names.h"
#include "optim/optim.h"
#include "train/place.h"
#include "train/step.h"

typedef struct candidate {
    fr_ckpt_mode mode;
    int arg, micro;
    fr_precision prec;
    double cost, split; /* split: split_cost, part of cost */
    size_t reserved;
    size_t
        fixed; /* reserved less the arena: the same for every schedule at one micro-batch and precision */
    fr_offload offload; /* what the candidate was planned with */
    int head_rows;      /* its fused head (fr_step_opts.head_rows) */
} candidate;

/* Bytes an offloaded optimizer copies a step: every trainable weight's
 * gradient down and the weight up (f32, whether or not this plan keeps the
 * gradient). */
static size_t offload_copy_bytes(const fr_step *s) {
    size_t bytes = 0;
    for (size_t i = 0; i < s->m->n_params; i++)
        if (s->gv[i] >= 0)
            bytes += 2 * (size_t)fr_shape_numel(&s->m->params[i].shape) * sizeof(float);
    return bytes;
}

/* The device's measured rates (bytes/s of copies, FLOP/s of a GEMM) and the
 * share of compute copies may hide under; 0 when not measured. */
static void rates(const fr_step *s, double *bw, double *fl, double *overlap) {
    const fr_backend *be = fr_backend_of(s->ctx);
    *bw = be->copy_rate ? be->copy_rate(s->ctx) : 0;
    *fl = be->flop_rate ? be->flop_rate(s->ctx) : 0;
    *overlap = be->copy_overlap ? be->copy_overlap(s->ctx) : 0;
}

/* --offload activations, per step at the measured rates: *copy seconds of
 * copies (every offloaded value down after its last forward use and up
 * before its backward, per micro-batch) and *exposed the part no compute
 * hides. The model: the copies run beside the kernels (backend/opencl/
 * offload.c), the down half under the forward's compute (a third of the
 * step's: backward costs about twice forward), the up half under the
 * backward's (two thirds: each fetch is issued a layer ahead), each scaled
 * by the device's overlap share (0 on a CPU device, whose copies take the
 * cores the kernels need):
 *   exposed = max(0, copy/2 - w t/3) + max(0, copy/2 - 2 w t/3),
 * t = step_flops / FLOP rate. 0 when the rates are unknown (*copy < 0). */
static void act_copy_times(const fr_step *s, double step_flops, double *copy, double *exposed) {
    double bw, fl, w;
    rates(s, &bw, &fl, &w);
    *copy = *exposed = 0;
    if (!(s->o.offload & FR_OFFLOAD_ACTIVATIONS)) return;
    if (bw <= 0 || fl <= 0 || step_flops <= 0) {
        *copy = -1;
        return;
    }
    double t = step_flops / fl, k = s->sched.accumulate > 0 ? s->sched.accumulate : 1;
    *copy = 2.0 * (double)s->place.offloaded_bytes * k / bw;
    *exposed = fmax(0.0, *copy / 2 - w * t / 3) + fmax(0.0, *copy / 2 - 2 * w * t / 3);
}

/* The cost of --offload in the planner's unit (a fraction of the step's
 * compute): the optimizer's copies (offload_copy_bytes, none hidden: they
 * run after backward) and the activations' exposed copy time, against the
 * step's FLOPs at the measured GEMM rate; INFINITY when the device could not
 * measure its rates. */
static double offload_cost(const fr_step *s, double step_flops) {
    if (!s->o.offload) return 0.0;
    double bw, fl, w, copy, exposed;
    rates(s, &bw, &fl, &w);
    if (bw <= 0 || fl <= 0 || step_flops <= 0) return INFINITY;
    double t = step_flops / fl, c = 0;
    if (s->o.offload & FR_OFFLOAD_OPTIMIZER) c += (double)offload_copy_bytes(s) / bw / t;
    act_copy_times(s, step_flops, &copy, &exposed);
    return copy < 0 ? INFINITY : c + exposed / t;
}

static const char *offload_name(int offload) {
    static const char *names[] = {"none", "optimizer", "activations", "optimizer,activations"};
    return names[offload & 3];
}

/* What splitting the batch into k micro-batches costs in time, as a share
 * of the whole-batch step: the FLOPs are the same, but every node runs k
 * times and each linear GEMM has k times fewer rows. A node of f FLOPs whose
 * GEMM has M rows (LINEAR and LINEAR_BWD: the samples times the positions;
 * other ops, convolutions included, run per image or per element and do not
 * depend on the split) takes the time of
 *   t(f, M) = f (M + SPLIT_GEMM_HALF_ROWS) / M + SPLIT_NODE_FLOPS
 * FLOPs at the large-GEMM rate: the GEMM reaches half its rate at
 * SPLIT_GEMM_HALF_ROWS rows, and a node run (dispatch, OpenMP fork and join,
 * the kernel's set-up) costs as much as SPLIT_NODE_FLOPS FLOPs. Over the
 * step's nodes (a clone's cost is recomputation, counted apart), each node
 * of a micro-batch plan at f, M:
 *   split = sum k t(f, M) / sum t(k f, k M) - 1.
 * Fitted (least squares on the log ratios) to the time a step of `frugal
 * profile --threads 2` takes on the idle 2-core dev machine (AMD EPYC,
 * OpenMP's short spin), whole and in micro-batches: CNN at batch 128 in 4
 * and 32, 0.92x and 1.23x measured (model 1.02x, 1.23x); MLP 1.02x and
 * 3.20x (1.18x, 2.85x); gpt-tiny at T 64, batch 8 in 8, 1.27x (1.11x).
 * Commands and numbers: bench/out/microbatch.md. */
#define SPLIT_GEMM_HALF_ROWS 8.0
#define SPLIT_NODE_FLOPS 2.0e5

static double gemm_rows(const fr_graph *g, const fr_node *nd) {
    return (double)fr_op_linear_rows(g, nd);
}

static double node_time(double flops, double rows) {
    return (rows > 0 ? flops * (rows + SPLIT_GEMM_HALF_ROWS) / rows : flops) + SPLIT_NODE_FLOPS;
}

static double split_cost(const fr_step *s) {
    double k = s->sched.accumulate, split = 0, whole = 0;
    if (k <= 1) return 0.0;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if (nd->attr.recompute) continue;
        double f = fr_op_get(nd->op)->flops(&s->g, nd), r = gemm_rows(&s->g, nd);
        split += k * node_time(f, r);
        whole += node_time(k * f, k * r);
    }
    return whole > 0 ? split / whole - 1 : 0.0;
}

/* The fused head's price (--fused-head) as a share of the step without it:
 * the chunks' logits made again in backward (one more head GEMM, 2 N C V
 * FLOPs, in LINEAR_CE_BWD's count but not in the unfused step's) and the
 * chunks' GEMMs of R rows, which reach R / (R + SPLIT_GEMM_HALF_ROWS) of
 * the large-GEMM rate (split_cost's model of a GEMM's rows). 0 unfused. */
static double head_cost(const fr_step *s, double plain) {
    double again = 0, slow = 0, k = s->sched.accumulate > 0 ? s->sched.accumulate : 1;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if ((nd->op != FR_OP_LINEAR_CE && nd->op != FR_OP_LINEAR_CE_BWD) || nd->attr.recompute)
            continue;
        const fr_shape *w = &s->g.vals[nd->in[1]].shape;
        double C = (double)w->d[1], V = (double)w->d[0],
               N = C > 0 ? (double)fr_shape_numel(&s->g.vals[nd->in[0]].shape) / C : 0,
               R = (double)fr_op_ce_chunk_rows(&s->g, nd);
        if (nd->op == FR_OP_LINEAR_CE_BWD) again += 2 * N * C * V;
        slow += R > 0 ? fr_op_get(nd->op)->flops(&s->g, nd) * SPLIT_GEMM_HALF_ROWS / R : 0;
    }
    double base = plain - k * again;
    return base > 0 ? k * (again + slow) / base : 0.0;
}

static int has_batchnorm(const fr_model *m) {
    for (size_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == FR_L_BATCHNORM) return 1;
    return 0;
}

/* --precision auto weighs bf16-mixed against fp32 by what each step costs
 * in time, as a share of the fp32 step:
 *   cost = MIXED_CAST_SHARE - g (1 - r32 / r16)
 * g: the share of the step's FLOPs in LINEAR and LINEAR_BWD (clones not
 * counted: the planner's unit is the step without recomputation), the ops
 * whose GEMMs run native bf16 where the backend has them (convolutions stay
 * f32 GEMMs on rounded operands: they gain nothing); r32, r16: the f32 and
 * bf16 GEMM rates (mixed_rates; r16 0 where bf16 is not native: the g term
 * is 0). A negative cost is a faster step: bf16-mixed then beats an fp32
 * plan that fits as it is. The FLOP share counts element-wise ops at a FLOP
 * or a few per value, so it is above the linear layers' share of the time
 * (gpt-tiny at T 128: 96% of the FLOPs, 78% of the fp32 step's kernel time
 * here), and the gain is an upper bound. */

/* The casts to and from 16 bits (and the rounded weight copies) as a share
 * of the fp32 step: `frugal profile --model gpt-tiny --batch 8 --seq 128
 * --threads 2 --steps 5` on the 2-core dev machine (AMD EPYC, AVX512_BF16),
 * cast's time in the bf16-mixed step against the fp32 step: 8-12% with
 * native bf16 GEMMs, 11% with them emulated (FRUGAL_GEMM16=0); 10% on the
 * Intel host of issue 23. */
#define MIXED_CAST_SHARE 0.10

/* The GEMM rates bf16-mixed is weighed with, GFLOP/s: FRUGAL_GEMM_RATES
 * "F32,BF16" when it is set (assumed whatever the host and backend; BF16 0:
 * no native bf16 GEMM), else, where the backend's linear layers take bf16
 * natively (the CPU with oneDNN on AVX512_BF16 or AMX), the host's measured
 * OpenBLAS f32 and oneDNN bf16 rates (fr_gemm_probe: once per process,
 * about 0.2 s), else none (bf16 0, no probe: a device, or bf16 emulated). */
static void mixed_rates(const fr_ctx *ctx, double *r32, double *r16, int *from_env) {
    const char *env = getenv("FRUGAL_GEMM_RATES");
    double a, b;
    char end;
    *r32 = *r16 = 0;
    *from_env = 0;
    if (env && sscanf(env, "%lf,%lf%c", &a, &b, &end) == 2 && a > 0 && b >= 0) {
        *r32 = a, *r16 = b, *from_env = 1;
        return;
    }
    const fr_backend *be = fr_backend_of(ctx);
    if (!be->host_memory || !be->gemm16 || !be->gemm16(FR_BF16)) return;
    fr_gemm_rates r;
    fr_gemm_probe(&r);
    *r32 = r.blas_f32, *r16 = r.blas_f32 > 0 ? r.bf16 : 0;
}

/* The GEMM term's largest gain, for a level's floor before any plan of it
 * is built (g <= 1). */
static double mixed_floor(const fr_ctx *ctx) {
    double r32, r16;
    int env;
    mixed_rates(ctx, &r32, &r16, &env);
    return MIXED_CAST_SHARE - (r16 > 0 ? fmax(0.0, 1 - r32 / r16) : 0.0);
}

/* The FLOPs of node nd (f in all) that bf16-mixed gives native bf16
 * products: the linear layers', the quantized ones' (their kernel
 * dequantizes into bf16 panels) and the fused head's GEMMs, not its row
 * arithmetic (fl_linear_ce's 8 a logit); convolutions and attention where
 * the backend says so (fr_backend.native16) */
static double gemm_flops(const fr_graph *g, const fr_node *nd, double f) {
    const fr_backend *be = fr_backend_of(g->ctx);
    switch (nd->op) {
    case FR_OP_CONV2D:
    case FR_OP_CONV2D_BWD:
    case FR_OP_ATTENTION:
    case FR_OP_ATTENTION_BWD: return be->native16 && be->native16(g, nd) ? f : 0;
    case FR_OP_LINEAR:
    case FR_OP_LINEAR_BWD:
    case FR_OP_QLINEAR:
    case FR_OP_QLINEAR_BWD: return f;
    case FR_OP_LINEAR_CE:
    case FR_OP_LINEAR_CE_BWD: {
        const fr_shape *w = &g->vals[nd->in[1]].shape;
        if (w->ndim != 2 || w->d[1] < 1) return 0;
        const double N = (double)fr_shape_numel(&g->vals[nd->in[0]].shape) / (double)w->d[1];
        return f - 8.0 * N * (double)w->d[0];
    }
    default: return 0;
    }
}

void fr_plan_mixed_estimate(const fr_step *s, fr_mixed_estimate *e) {
    double all = 0, gemm = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if (nd->attr.recompute) continue;
        double f = fr_op_get(nd->op)->flops(&s->g, nd);
        all += f;
        gemm += gemm_flops(&s->g, nd, f);
    }
    mixed_rates(s->ctx, &e->f32, &e->bf16, &e->from_env);
    e->linear_share = all > 0 ? gemm / all : 0;
    e->cast_share = MIXED_CAST_SHARE;
    e->cost = e->cast_share - (e->bf16 > 0 ? e->linear_share * (1 - e->f32 / e->bf16) : 0.0);
}

/* What --precision auto charges a candidate of precision p (0 for fp32 and
 * for any precision given explicitly). */
static double mixed_cost(const fr_step *s, const fr_step_opts *o, fr_precision p) {
    if (p != FR_PREC_BF16_MIXED || o->precision != FR_PREC_AUTO) return 0.0;
    fr_mixed_estimate e;
    fr_plan_mixed_estimate(s, &e);
    return e.cost;
}

static const char *mode_name(fr_ckpt_mode m) {
    static const char *names[] = {"marks", "none",     "all",     "sqrt",
                                  "every", "segments", "revolve", "auto"};
    /* (every:1 is printed as "every 1": the same plan as "all") */
    return (unsigned)m <= FR_CKPT_AUTO ? names[m] : "?";
}

/* Build a candidate and read its reserved bytes and cost; 0 if it failed.
 * flops_to (may be NULL) receives the forward FLOPs of units [0, u) for
 * every u, *plain the step's FLOPs without recomputation per micro-batch,
 * and *first the first unit with backward work. */
static int try_candidate(fr_model *m, const fr_step_opts *base, candidate *c, int bn,
                         double *flops_to, double *plain_out, int *first) {
    fr_step_opts o = *base;
    o.checkpoint = c->mode;
    o.ckpt_arg = c->arg;
    o.micro_batch = c->micro;
    o.precision = c->prec;
    o.budget = 0;
    fr_step *s = fr_step_build(m, &o);
    if (!s) return 0;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    c->reserved = info.reserved;
    c->fixed = info.reserved - info.arena;
    int k = info.accumulate;
    double plain = info.flops - info.extra_flops;
    c->offload = o.offload;
    c->split = split_cost(s);
    c->head_rows = o.head_rows;
    c->cost = info.extra_flops / (plain > 0 ? plain : 1) + c->split + (k > 1 && bn ? 1.0 : 0.0) +
              mixed_cost(s, base, c->prec) + offload_cost(s, plain) + head_cost(s, plain);
    if (flops_to) {
        for (int u = 0; u <= m->n_units; u++) flops_to[u] = 0;
        for (int i = 0; i < s->g.n_forward; i++)
            flops_to[s->sched.unit[i] + 1] +=
                fr_op_get(s->g.nodes[i].op)->flops(&s->g, &s->g.nodes[i]);
        for (int u = 0; u < m->n_units; u++) flops_to[u + 1] += flops_to[u];
        *plain_out = plain / (k > 0 ? k : 1);
        *first = s->sched.first_unit;
    }
    fr_step_free(s);
    return 1;
}

/* The search at one micro-batch size and precision (a level). A candidate
 * is a family (segments, every, revolve) and its argument; builds are
 * memoised by both, since the searches below revisit arguments. */
enum { FAM_SEGMENTS, FAM_EVERY, FAM_REVOLVE, FAM_COUNT };
static const fr_ckpt_mode fam_mode[FAM_COUNT] = {FR_CKPT_SEGMENTS, FR_CKPT_EVERY, FR_CKPT_REVOLVE};

/* Below this many arguments a family is enumerated: the searches would
 * build about as many. */
#define ENUMERATE_BELOW 48

typedef struct level {
    fr_model *m;
    const fr_step_opts *opts;
    int micro, bn, n, first, oom;
    fr_precision prec;
    size_t budget;    /* SIZE_MAX: no limit */
    uint64_t ooms0;   /* allocation failures before the search */
    candidate *memo;  /* [family * (n + 1) + arg]; reserved 0: not built */
    double *flops_to; /* forward FLOPs of units [0, u) (from keeping everything) */
    double plain;     /* the step's FLOPs without recomputation, per micro-batch */
    candidate *best, *smallest;
    int found;
} level;

static void consider(level *lv, const candidate *c) {
    if (c->reserved < lv->smallest->reserved) *lv->smallest = *c;
    if (c->reserved <= lv->budget && c->cost < lv->best->cost) {
        *lv->best = *c;
        lv->found = 1;
    }
}

static const candidate *eval(level *lv, int fam, int arg) {
    candidate *c = &lv->memo[(size_t)fam * (lv->n + 1) + arg];
    if (c->reserved) return c;
    *c = (candidate){fam_mode[fam], arg, lv->micro,         lv->prec,           INFINITY, 0,
                     SIZE_MAX,      0,   lv->opts->offload, lv->opts->head_rows};
    if (!try_candidate(lv->m, lv->opts, c, lv->bn, NULL, NULL, NULL)) {
        if (lv->m->ctx->mem.st.num_ooms > lv->ooms0) lv->oom = 1; /* a real allocation failure */
        c->reserved = SIZE_MAX;
        c->cost = INFINITY;
        return c;
    }
    consider(lv, c);
    return c;
}

static int fits(level *lv, int fam, int arg) {
    return !lv->oom && eval(lv, fam, arg)->reserved <= lv->budget;
}

/* Extra compute of a candidate, to rank the arguments of one family without
 * building them: for segment plans the fraction of the step's FLOPs in the
 * units recomputed (step.c's segments_for: all segments but the last), for
 * revolve the number of recomputed unit forwards T(l, s). */
static double est_cost(const level *lv, int fam, int arg) {
    int L = lv->n - lv->first;
    if (fam == FAM_REVOLVE) return (double)fr_revolve_cost(L, arg);
    int size = fam == FAM_EVERY ? arg : L / arg;
    if (size < 1) size = 1;
    int segs = fam == FAM_EVERY ? (L + size - 1) / size : arg;
    int64_t end = lv->first + (int64_t)size * (segs - 1);
    if (end > lv->n) end = lv->n;
    return (lv->flops_to[end] - lv->flops_to[lv->first]) / (lv->plain > 0 ? lv->plain : 1);
}

/* The arguments [lo, hi] of one family. Reserved bytes are roughly U-shaped
 * in the argument (more segments or slots keep more checkpoints; longer
 * segments hold more activations; few revolve slots make many clones whose
 * metadata counts), with bumps from the arena's packing, so the arguments
 * that fit are found on a geometric grid of GRID points, the ends of the run that fits
 * by bisection towards the grid points beside them, and the least estimated
 * extra compute inside is built to confirm (the next one if it does not fit,
 * a few times). Few arguments are all built. */
#define GRID 32

static void search_family(level *lv, int fam, int lo, int hi) {
    if (hi < lo) return;
    if (hi - lo < ENUMERATE_BELOW) {
        if (fam == FAM_REVOLVE)
            for (int k = hi; k >= lo && !lv->oom; k--) eval(lv, fam, k);
        else
            for (int k = lo; k <= hi && !lv->oom; k++) eval(lv, fam, k);
        return;
    }
    int grid[GRID], left = -1, right = -1, gl = -1, gr = -1;
    for (int i = 0; i < GRID; i++) /* geometric: dense where few slots or segments matter most */
        grid[i] = lo - 1 + (int)llround(pow(hi - lo + 1.0, i / (GRID - 1.0)));
    grid[GRID - 1] = hi;
    for (int i = 0; i < GRID && !lv->oom; i++)
        if (fits(lv, fam, grid[i])) {
            if (gl < 0) gl = i;
            gr = i;
        }
    if (gl < 0 || lv->oom) return;
    left = grid[gl], right = grid[gr];
    for (int l = gl > 0 ? grid[gl - 1] + 1 : lo, r = left;
         l < r && !lv->oom;) { /* the first that fits */
        int mid = l + (r - l) / 2;
        if (fits(lv, fam, mid)) r = left = mid;
        else l = mid + 1;
    }
    for (int l = right, r = gr + 1 < GRID ? grid[gr + 1] - 1 : hi;
         l < r && !lv->oom;) { /* the last */
        int mid = l + (r - l + 1) / 2;
        if (fits(lv, fam, mid)) l = right = mid;
        else r = mid - 1;
    }
    for (int tries = 0; tries < 8 && !lv->oom; tries++) {
        int pick = -1;
        double e = INFINITY;
        for (int k = left; k <= right; k++) {
            const candidate *c = &lv->memo[(size_t)fam * (lv->n + 1) + k];
            if (c->reserved && c->reserved > lv->budget) continue; /* built, does not fit */
            double ek = est_cost(lv, fam, k);
            if (ek < e) e = ek, pick = k;
        }
        if (pick < 0 || fits(lv, fam, pick)) break;
    }
}

/* Search the candidates: best (least cost within opts->budget; 0 = no
 * limit) and smallest (least reserved). whole = 1 keeps the batch whole.
 * Levels are visited from the whole batch down; a level whose cheapest
 * possible cost (its micro-batch and precision terms) cannot beat the best
 * so far is skipped, and so is a family whose least recomputation cannot.
 * Returns 1 if one fits, 0 if none, -1 on an allocation failure. */
static int plan_search(fr_model *m, const fr_step_opts *opts, int whole, candidate *best,
                       candidate *smallest) {
    fr_ctx *ctx = m->ctx;
    memset(best, 0, sizeof *best);
    memset(smallest, 0, sizeof *smallest);
    best->cost = INFINITY;
    smallest->reserved = SIZE_MAX;
    fr_mem_stats ms0;
    fr_mem_get_stats(ctx, &ms0);
    int fixed_micro = opts->micro_batch > 0 || whole, n = m->n_units, found = 0, oom = 0;
    level lv = {.m = m,
                .opts = opts,
                .bn = has_batchnorm(m),
                .n = n,
                .budget = opts->budget ? opts->budget : SIZE_MAX,
                .ooms0 = ms0.num_ooms,
                .best = best,
                .smallest = smallest};
    lv.memo = fr_alloc(ctx, (size_t)FAM_COUNT * (n + 1) * sizeof *lv.memo, FR_MEM_OTHER);
    lv.flops_to = fr_alloc(ctx, ((size_t)n + 1) * sizeof *lv.flops_to, FR_MEM_OTHER);
    if (!lv.memo || !lv.flops_to) {
        fr_free(ctx, lv.memo);
        fr_free(ctx, lv.flops_to);
        return -1;
    }
    for (int micro = opts->micro_batch > 0 ? opts->micro_batch : opts->batch; micro >= 1 && !oom;
         micro--) {
        if (opts->batch % micro) continue;
        /* --precision auto may store activations in bf16 (mixed_cost) when
         * that fits. */
        fr_precision precs[2] = {opts->precision, opts->precision};
        int np = 1;
        if (opts->precision == FR_PREC_AUTO)
            precs[0] = FR_PREC_FP32, precs[1] = FR_PREC_BF16_MIXED, np = 2;
        for (int q = 0; q < np && !oom; q++) {
            lv.micro = micro;
            lv.prec = precs[q];
            lv.found = 0;
            int k = opts->batch / micro;
            /* the level's split cost is added once its first plan is built:
             * it is the same for every schedule (it counts no clone) */
            double floor_cost =
                (k > 1 && lv.bn ? 1.0 : 0.0) +
                (lv.prec == FR_PREC_BF16_MIXED && opts->precision == FR_PREC_AUTO ? mixed_floor(ctx)
                                                                                  : 0.0);
            if (found && floor_cost >= best->cost) continue; /* cannot beat the best so far */
            /* A budget without an explicit mode lets the planner choose. */
            if (opts->checkpoint != FR_CKPT_AUTO && opts->checkpoint != FR_CKPT_MARKS) {
                candidate c = {opts->checkpoint, opts->ckpt_arg, micro, lv.prec, 0, 0, 0, 0,
                               opts->offload,    opts->head_rows};
                if (try_candidate(m, opts, &c, lv.bn, NULL, NULL, NULL)) consider(&lv, &c);
                else if (ctx->mem.st.num_ooms > ms0.num_ooms) oom = 1;
                found |= lv.found;
                continue;
            }
            candidate none = {FR_CKPT_NONE,   0, micro, lv.prec, 0, 0, 0, 0, opts->offload,
                              opts->head_rows};
            if (!try_candidate(m, opts, &none, lv.bn, lv.flops_to, &lv.plain, &lv.first)) {
                if (ctx->mem.st.num_ooms > ms0.num_ooms) oom = 1;
                continue;
            }
            consider(&lv, &none);
            found |= lv.found;
            if (none.reserved <= lv.budget)
                continue; /* keeping everything fits: nothing here costs less */
            floor_cost += none.split;
            if (found && floor_cost >= best->cost) continue;
            /* Nothing at this level fits when what every schedule holds does
             * not; the whole batch (no gradient buffers when the step runs in
             * backward) and the last level are still searched for the
             * smallest plan. */
            int ends = fixed_micro || micro == 1 || micro == opts->batch;
            if (none.fixed > lv.budget && !ends) continue;
            memset(lv.memo, 0, (size_t)FAM_COUNT * (n + 1) * sizeof *lv.memo);
            /* A family is searched only if its least extra compute could beat
             * the best so far (1e-9: the estimate's rounding). */
            double seg_least = INFINITY, every_least = INFINITY, top = 0;
            for (int a = 2; a <= n; a++)
                seg_least = fmin(seg_least, est_cost(&lv, FAM_SEGMENTS, a));
            for (int a = 1; a < n; a++)
                every_least = fmin(every_least, est_cost(&lv, FAM_EVERY, a));
            for (int u = lv.first; u < n; u++) top = fmax(top, lv.flops_to[u + 1] - lv.flops_to[u]);
            /* revolve recomputes all units but one at least once */
            double rev_least =
                (lv.flops_to[n] - lv.flops_to[lv.first] - top) / (lv.plain > 0 ? lv.plain : 1);
            if (floor_cost + seg_least <= best->cost + 1e-9) search_family(&lv, FAM_SEGMENTS, 2, n);
            if (floor_cost + every_least <= best->cost + 1e-9)
                search_family(&lv, FAM_EVERY, 1, n - 1);
            /* Each recomputed unit forward is at least one node of graph
             * metadata, which counts in reserved: with fewer slots than
             * rev_lo a plan holds more than keeping everything, which does
             * not fit, so it is neither the best nor the smallest. */
            int rev_lo = 1, rev_hi = n;
            while (rev_lo < rev_hi) {
                int mid = rev_lo + (rev_hi - rev_lo) / 2;
                if ((double)fr_revolve_cost(n - lv.first, mid) * sizeof(fr_node) >=
                    (double)none.reserved)
                    rev_lo = mid + 1;
                else rev_hi = mid;
            }
            if (floor_cost + rev_least <= best->cost + 1e-9)
                search_family(&lv, FAM_REVOLVE, rev_lo, n);
            oom |= lv.oom;
            found |= lv.found;
        }
        if (found && best->micro == opts->batch) break; /* no need to split the batch */
        if (fixed_micro) break;
        if (found && micro < best->micro / 2) break; /* smaller micro-batches only cost more */
    }
    fr_free(ctx, lv.memo);
    fr_free(ctx, lv.flops_to);
    fr_mem_empty_cache(ctx); /* what comparing candidates freed is not the step's to hold */
    return oom ? -1 : found;
}

int fr_plan_fits(fr_model *m, const fr_step_opts *opts) {
    candidate best, smallest;
    return plan_search(m, opts, 1, &best, &smallest) == 1;
}

/* The fused head's chunks the planner weighs (--fused-head auto under a
 * budget, a model whose head can be fused, training): unfused, then all
 * the rows in one chunk and Liger's chunk for the whole batch's rows (a
 * workspace about the head input's size) times 16, 4, 1 and 1/4, at least
 * 1 (a larger chunk runs faster GEMMs, head_cost, and holds more); else the
 * option as given (the builder applies it). Returns how many (<= 6). */
static int head_choices(const fr_model *m, const fr_step_opts *opts, int out[6]) {
    int64_t V, C;
    out[0] = opts->head_rows;
    if (opts->head_rows != -1 || !opts->training || !fr_model_fusable_head(m, &V, &C)) return 1;
    int64_t N = (int64_t)opts->batch * (m->in_dtype == FR_I32 ? m->seq : 1);
    int64_t r = fr_model_head_rows_auto(N, C, V);
    static const int64_t num[] = {0, 16, 4, 1, 1}, den[] = {1, 1, 1, 1, 4};
    int n = 1;
    out[0] = 0;
    for (int i = 0; i < 5; i++) {
        int64_t rows = num[i] ? r * num[i] / den[i] : N;
        rows = rows > N ? N : rows < 1 ? 1 : rows;
        if (rows != out[n - 1]) out[n++] = (int)rows;
    }
    return n;
}

/* plan_search over the options given, and, on a device without --offload,
 * with each way of offloading: the cheapest that fits and the smallest. */
static int search_offload(fr_model *m, const fr_step_opts *opts, candidate *best,
                          candidate *smallest) {
    int found = plan_search(m, opts, 0, best, smallest);
    if (found < 0) return -1;
    /* On a device, unless --offload was given, the optimizer, the saved
     * activations or both may go to the host: the same search with each,
     * the cheapest plan kept (offload_cost against recomputation's FLOPs). */
    static const int ways[] = {FR_OFFLOAD_OPTIMIZER, FR_OFFLOAD_ACTIVATIONS,
                               FR_OFFLOAD_OPTIMIZER | FR_OFFLOAD_ACTIVATIONS};
    for (int w = 0; w < 3 && fr_place_second_memory(m->ctx) && opts->training && !opts->offload;
         w++) {
        fr_step_opts o2 = *opts;
        o2.offload = ways[w];
        candidate b2, s2;
        int f2 = plan_search(m, &o2, 0, &b2, &s2);
        if (f2 < 0) return -1;
        if (f2 && (!found || b2.cost < best->cost)) *best = b2, found = 1;
        if (s2.reserved < smallest->reserved) *smallest = s2;
    }
    return found;
}

/* --base-precision auto under a budget: the frozen base's formats from the
 * most precise, fp32, bf16, int8, nf4; the first whose plans fit wins
 * (accuracy first: the tiled GEMMs' time, bench/quant.sh, is not weighed),
 * the cheapest plan of it. A model with no frozen
 * linear weight has fp32 only. Returns how many (<= 4). */
static int base_choices(const fr_model *m, const fr_step_opts *opts, fr_base_precision out[4]) {
    out[0] = opts->base_precision;
    if (opts->base_precision != FR_BASE_AUTO) return 1;
    out[0] = FR_BASE_FP32;
    if (!fr_model_quantizable(m)) return 1;
    out[1] = FR_BASE_BF16, out[2] = FR_BASE_INT8, out[3] = FR_BASE_NF4;
    return 4;
}

fr_step *fr_step_plan_choose(fr_model *m, const fr_step_opts *opts, fr_plan_need *need) {
    candidate best = {.cost = INFINITY}, smallest = {.reserved = SIZE_MAX};
    memset(need, 0, sizeof *need);
    fr_base_precision bases[4], best_base = opts->base_precision, small_base = best_base;
    int nb = base_choices(m, opts, bases), found = 0;
    for (int k = 0; k < nb && !found; k++) {
        fr_step_opts ob = *opts;
        ob.base_precision = bases[k];
        if (fr_model_quantize_base(m, bases[k])) return NULL; /* planning: shapes only */
        int heads[6], nh = head_choices(m, &ob, heads);
        for (int h = 0; h < nh; h++) {
            fr_step_opts oh = ob;
            oh.head_rows = heads[h];
            candidate b, sm;
            int f = search_offload(m, &oh, &b, &sm);
            if (f < 0) return NULL;
            if (f && (!found || b.cost < best.cost)) best = b, found = 1, best_base = bases[k];
            if (sm.reserved < smallest.reserved) smallest = sm, small_base = bases[k];
        }
    }
    if (!found) {
        if (smallest.reserved != SIZE_MAX)
            *need = (fr_plan_need){smallest.reserved,  smallest.mode, smallest.arg,
                                   smallest.micro,     smallest.prec, smallest.offload,
                                   smallest.head_rows, small_base};
        return NULL;
    }
    /* the loop stopped at best_base's format: the model holds it */
    fr_step_opts o = *opts;
    o.base_precision = best_base;
    o.checkpoint = best.mode;
    o.ckpt_arg = best.arg;
    o.micro_batch = best.micro;
    o.precision = best.prec;
    o.offload = best.offload;
    o.head_rows = best.head_rows;
    fr_step *s = fr_step_build(m, &o);
    fr_mem_empty_cache(m->ctx); /* what building freed is not the step's to hold */
    return s;
}

int fr_plan_need_str(const fr_plan_need *n, char *buf, size_t len) {
    char head[96] = "";
    if (n->head_rows > 0) snprintf(head, sizeof head, ", --fused-head %d", n->head_rows);
    else if (n->head_rows < 0) snprintf(head, sizeof head, ", --fused-head auto");
    if (n->base != FR_BASE_FP32 && n->base != FR_BASE_AUTO)
        snprintf(head + strlen(head), sizeof head - strlen(head), ", --base-precision %s",
                 fr_base_precision_name(n->base));
    return snprintf(
        buf, len, "checkpoint %s%s%.0d, micro-batch %d, precision %s%s%s%s", mode_name(n->mode),
        n->arg ? " " : "", n->arg, n->micro, fr_precision_name(n->prec),
        n->offload & FR_OFFLOAD_OPTIMIZER ? ", the optimizer on the host" : "",
        n->offload & FR_OFFLOAD_ACTIVATIONS ? ", saved activations on the host" : "", head);
}

fr_status fr_plan_refuse(fr_ctx *ctx, const fr_step_opts *opts, const fr_plan_need *need) {
    char a[32], b[32], how[192];
    fr_plan_need_str(need, how, sizeof how);
    return fr_fail(
        ctx, FR_ERR_BUDGET,
        "no plan fits the budget of %s: the smallest needs %s (%zu bytes) with %s; raise "
        "--budget to at least that, or shrink --batch or the model%s",
        fr_human_bytes(opts->budget, a, sizeof a), fr_human_bytes(need->reserved, b, sizeof b),
        need->reserved, how,
        opts->precision == FR_PREC_FP32 ? " (--precision auto may store activations in bf16)" : "");
}

fr_step *fr_step_plan_budget(fr_model *m, const fr_step_opts *opts) {
    fr_plan_need need;
    fr_step *s = fr_step_plan_choose(m, opts, &need);
    if (!s && need.reserved) fr_plan_refuse(m->ctx, opts, &need);
    if (s && fr_step_materialize(s)) {
        fr_step_free(s);
        return NULL;
    }
    return s;
}

/* Gradient bytes the SGD step inside backward saves (step.c). */
static size_t fused_bytes(const fr_step *s) {
    size_t b = 0;
    for (size_t i = 0; i < s->m->n_params && s->opt.fused; i++)
        if (s->opt.fused[i]) b += (size_t)fr_shape_numel(&s->m->params[i].shape) * sizeof(float);
    return b;
}

/* Whether the plan runs a clone of this kind for i: FR_REMAT_UNIT, unit i
 * recomputed by the schedule (the decision recomputed_units counts);
 * FR_REMAT_CHEAP, layer i's output remade by the selective pass (the unit
 * itself is not recomputed). From the table (per unit or per layer), or by a
 * scan of the plan when it could not be allocated. */
static int has_clone(const fr_step *s, const uint8_t *table, int kind, int i) {
    if (table) return table[i];
    for (int j = 0; j < s->plan.n_nodes; j++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[j]];
        if (nd->attr.recompute != kind || nd->layer < 0) continue;
        if (kind == FR_REMAT_CHEAP ? nd->layer == i : s->m->layers[nd->layer].unit == i) return 1;
    }
    return 0;
}

/* The saved values --offload activations moves: per layer whether one of
 * its values goes (layer_off, may be NULL). Returns the forward FLOPs, per
 * micro-batch, of the units that make them: what recomputing them instead
 * would run again (checkpointing recomputes whole unit forwards). */
static double act_offloaded(const fr_step *s, uint8_t *layer_off) {
    const fr_graph *g = &s->g;
    const fr_model *m = s->m;
    uint8_t *unit_off = fr_calloc(s->ctx, (size_t)m->n_units + 1, FR_MEM_OTHER);
    double flops = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &g->nodes[s->plan.order[i]];
        if (nd->op != FR_OP_OFFLOAD) continue;
        int l = g->nodes[g->vals[nd->in[0]].producer].layer;
        if (l < 0 || (size_t)l >= m->n_layers) continue;
        if (layer_off) layer_off[l] = 1;
        if (unit_off && m->layers[l].unit >= 0 && m->layers[l].unit < m->n_units)
            unit_off[m->layers[l].unit] = 1;
    }
    for (int i = 0; i < g->n_forward && unit_off; i++) {
        int l = g->nodes[i].layer;
        if (l >= 0 && (size_t)l < m->n_layers && m->layers[l].unit >= 0 &&
            m->layers[l].unit < m->n_units && unit_off[m->layers[l].unit])
            flops += fr_op_get(g->nodes[i].op)->flops(g, &g->nodes[i]);
    }
    fr_free(s->ctx, unit_off);
    return flops;
}

/* On a device: where the optimizer runs, what offloading it moves and what
 * its transfers cost against recomputation, at the measured rates; where the
 * saved activations live, and why. */
static void describe_offload(const fr_step *s, double step_flops, int recomputed, FILE *out) {
    size_t state = 0, moved = offload_copy_bytes(s);
    int kind;
    for (size_t i = 0; i < s->m->n_params; i++) {
        if (s->gv[i] < 0) continue;
        state += (size_t)fr_optim_states(&s->o.optim) *
                 fr_optim_state_bytes(&s->o.optim, s->o.optim_state, &s->m->params[i], &kind);
    }
    double bw, fl, w;
    rates(s, &bw, &fl, &w);
    char a[32], b[32];
    fprintf(out,
            "optimizer: %s; offloading it %s %s of state off the device for %s of copies a "
            "step (%.2f ms at %.2f GB/s measured: like %.1f%% more compute at %.1f GFLOP/s)%s\n",
            s->o.offload & FR_OFFLOAD_OPTIMIZER ? "on the host" : "on the device",
            s->o.offload & FR_OFFLOAD_OPTIMIZER ? "moves" : "would move",
            fr_human_bytes(state, a, sizeof a), fr_human_bytes(moved, b, sizeof b),
            bw > 0 ? 1e3 * (double)moved / bw : 0.0, bw / 1e9,
            bw > 0 && fl > 0 && step_flops > 0 ? 100.0 * ((double)moved / bw) / (step_flops / fl)
                                               : 0.0,
            fl / 1e9, s->o.budget ? " (chosen under the budget: the cheapest plan that fits)" : "");
    if (!(s->o.offload & FR_OFFLOAD_ACTIVATIONS)) {
        fprintf(out, "activations: on the device%s\n",
                !s->o.budget ? " (--offload activations would move the saved ones to the host)"
                : recomputed
                    ? " (under the budget the planner found recomputing cheaper than copying "
                      "them to the host and back at the measured rates, or offloading did not "
                      "fit)"
                    : " (under the budget the cheapest plan that fits keeps them here)");
        return;
    }
    double copy, exposed, t = fl > 0 ? step_flops / fl : 0;
    act_copy_times(s, step_flops, &copy, &exposed);
    double k = s->sched.accumulate > 0 ? s->sched.accumulate : 1;
    double remake = step_flops > 0 ? act_offloaded(s, NULL) * k / step_flops : 0;
    double cost = t > 0 && copy >= 0 ? exposed / t : 0;
    fprintf(out,
            "activations: %d saved values, %s a micro-batch, to the host after their last "
            "forward use and fetched up to a layer ahead of their backward (layers marked "
            "below): %.2f ms of copies a step at %.2f GB/s, %.2f ms of it not hidden by compute "
            "(overlap share %.0f%%): like %.1f%% more compute; recomputing them instead costs "
            "about %.1f%% (their units' forwards, again)%s\n",
            s->place.n_offloaded, fr_human_bytes(s->place.offloaded_bytes, a, sizeof a),
            1e3 * fmax(copy, 0), bw / 1e9, 1e3 * exposed, 100 * w, 100 * cost, 100 * remake,
            !s->o.budget     ? ""
            : cost <= remake ? " (chosen under the budget: cheaper than recomputing)"
                             : " (chosen under the budget: no plan that recomputes instead fits "
                               "at less cost)");
}

/* The fused head of the plan (--fused-head): its rows a chunk (0: none),
 * the logits it never stores (B T V 4 bytes a micro-batch), the workspace
 * of its chunk instead (the larger of the forward's and backward's). */
static int head_of(const fr_step *s, size_t *logits, size_t *ws) {
    int rows = 0;
    *logits = *ws = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if (nd->op != FR_OP_LINEAR_CE && nd->op != FR_OP_LINEAR_CE_BWD) continue;
        const fr_shape *w = &s->g.vals[nd->in[1]].shape;
        rows = (int)fr_op_ce_chunk_rows(&s->g, nd);
        *logits = (size_t)(fr_shape_numel(&s->g.vals[nd->in[0]].shape) / w->d[1] * w->d[0]) * 4;
        size_t b = fr_value_bytes(&s->g.vals[nd->out[nd->op == FR_OP_LINEAR_CE ? 2 : 4]]);
        if (b > *ws) *ws = b;
    }
    return rows;
}

/* Whether the plan says how bf16-mixed and fp32 compare: under a budget
 * (where --precision auto chooses), for a training step in either. */
static int weighs_precision(const fr_step *s) {
    return s->o.budget && s->o.training &&
           (s->o.precision == FR_PREC_FP32 || s->o.precision == FR_PREC_BF16_MIXED);
}

void fr_step_describe_plan(const fr_step *s, FILE *out, int json) {
    const fr_model *m = s->m;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    size_t pred[FR_MEM_CAT_COUNT], total;
    fr_step_predicted(s, pred, &total);
    /* Which units keep their activations and which are recomputed; what runs in place. */
    int n = m->n_units;
    uint8_t *recomputed = fr_calloc(s->ctx, (size_t)n + 1, FR_MEM_OTHER); /* per unit; NULL: scan */
    uint8_t *remade = fr_calloc(s->ctx, m->n_layers + 1, FR_MEM_OTHER); /* per layer; NULL: scan */
    uint8_t *offloaded = fr_calloc(s->ctx, m->n_layers + 1, FR_MEM_OTHER); /* per layer */
    if (offloaded) act_offloaded(s, offloaded);
    int inplace = 0, n_remade = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) { /* clones carry attr.recompute (remat.h) */
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        n_remade += nd->attr.recompute == FR_REMAT_CHEAP;
        if (nd->layer < 0) continue;
        if (nd->attr.recompute == FR_REMAT_UNIT && recomputed)
            recomputed[m->layers[nd->layer].unit] = 1;
        if (nd->attr.recompute == FR_REMAT_CHEAP && remade) remade[nd->layer] = 1;
    }
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        int j = fr_op_get(nd->op)->inplace_in;
        if (j >= 0 && nd->out[0] >= 0 && nd->in[j] >= 0 && s->plan.offset[nd->out[0]] >= 0 &&
            s->plan.offset[nd->out[0]] == s->plan.offset[nd->in[j]])
            inplace++;
    }
    double base = info.flops - info.extra_flops;
    double frac =
        info.extra_flops / (base > 0 ? base : 1); /* relative to the step without recompute */
    double split = split_cost(s);                 /* relative to the whole-batch step */
    char h[8][32];
    size_t head_logits, head_ws;
    const int head_rows = head_of(s, &head_logits, &head_ws);
    if (json) {
        fprintf(out,
                "{\"batch\": %d, \"precision\": \"%s\", \"micro_batch\": %d, \"accumulate\": %d, "
                "\"checkpoint\": \"%s\", "
                "\"checkpoint_arg\": %d, \"units\": %d, \"recomputed_unit_forwards\": %d, "
                "\"remade_ops\": %d, \"extra_compute\": %.6f, \"split_cost\": %.6f, "
                "\"extra_cost\": %.6f, \"step_flops\": %.6g, \"inplace_ops\": %d, "
                "\"arena_bytes\": %zu, "
                "\"reserved_bytes\": %zu, \"predicted_peak_total\": %zu, \"budget\": %zu, "
                "\"updated_in_backward\": %d, \"gradient_bytes_not_kept\": %zu, "
                "\"update_scratch_bytes\": %zu, \"offload\": \"%s\", \"fused_head_rows\": %d, "
                "\"fused_head_logits_bytes\": %zu, \"fused_head_cost\": %.6f, "
                "\"folded_relu_bwd_into_pool\": %d, \"folded_relu_into_batchnorm\": %d, ",
                s->o.batch, fr_precision_name(s->o.precision), info.micro_batch, info.accumulate,
                mode_name(info.mode), info.ckpt_arg, n, info.recomputed_units, n_remade, frac,
                split, frac + split + head_cost(s, base), base, inplace, info.arena, info.reserved,
                total, s->o.budget, s->opt.n_fused, fused_bytes(s),
                s->opt.upd_ws_len * sizeof(float), offload_name(s->o.offload), head_rows,
                head_logits, head_cost(s, base), s->place.n_folded, s->place.n_folded_bn);
        if (s->o.offload & FR_OFFLOAD_ACTIVATIONS) {
            double bw, fl, w, copy, exposed;
            rates(s, &bw, &fl, &w);
            act_copy_times(s, base, &copy, &exposed);
            double t = fl > 0 ? base / fl : 0, k = info.accumulate > 0 ? info.accumulate : 1;
            fprintf(out,
                    "\"offload_activations\": {\"values\": %d, \"bytes\": %zu, \"copy_ms\": %.4f, "
                    "\"exposed_ms\": %.4f, \"cost\": %.6g, \"recompute_cost\": %.6g, "
                    "\"copy_rate\": %.6g, \"flop_rate\": %.6g, \"overlap\": %.3f}, ",
                    s->place.n_offloaded, s->place.offloaded_bytes, 1e3 * fmax(copy, 0),
                    1e3 * exposed, t > 0 && copy >= 0 ? exposed / t : 0,
                    base > 0 ? act_offloaded(s, NULL) * k / base : 0, bw, fl, w);
        }
        if (weighs_precision(s)) {
            fr_mixed_estimate e;
            fr_plan_mixed_estimate(s, &e);
            fprintf(out,
                    "\"bf16_mixed_vs_fp32\": {\"time_ratio\": %.6g, \"linear_flop_share\": %.6g, "
                    "\"gflops_f32\": %.6g, \"gflops_bf16\": %.6g, \"cast_share\": %.6g, "
                    "\"rates\": \"%s\"}, ",
                    1 + e.cost, e.linear_share, e.f32, e.bf16, e.cast_share,
                    e.from_env   ? "FRUGAL_GEMM_RATES"
                    : e.bf16 > 0 ? "measured"
                                 : "none");
        }
        fprintf(out, "\"layers\": [");
        int first = 1;
        for (size_t i = 0; i < m->n_layers; i++) {
            const fr_layer *l = &m->layers[i];
            if (l->kind == FR_L_RES_SHORTCUT || l->kind == FR_L_RES_END) continue;
            int u = l->unit;
            fprintf(out,
                    "%s{\"name\": \"%s\", \"unit\": %d, \"activations\": \"%s\", "
                    "\"output_remade\": %s, \"frozen\": %s}",
                    first ? "" : ", ", l->name, u,
                    u < s->sched.first_unit                      ? "none"
                    : has_clone(s, recomputed, FR_REMAT_UNIT, u) ? "recomputed"
                    : offloaded && offloaded[i]                  ? "offloaded"
                                                                 : "kept",
                    u >= s->sched.first_unit && !has_clone(s, recomputed, FR_REMAT_UNIT, u) &&
                            has_clone(s, remade, FR_REMAT_CHEAP, (int)i)
                        ? "true"
                        : "false",
                    l->frozen ? "true" : "false");
            first = 0;
        }
        fprintf(out, "], \"predicted_peak\": {");
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
            fprintf(out, "%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name(c), pred[c]);
        fprintf(out, "}}\n");
        fr_free(s->ctx, recomputed);
        fr_free(s->ctx, remade);
        fr_free(s->ctx, offloaded);
        return;
    }
    fprintf(out, "plan for batch %d: ", s->o.batch);
    if (info.accumulate > 1)
        fprintf(out,
                "%d micro-batches of %d (gradients accumulate, loss scaled by each one's share)\n",
                info.accumulate, info.micro_batch);
    else fprintf(out, "the whole batch at once\n");
    fprintf(out, "checkpointing: %s", mode_name(info.mode));
    if (info.ckpt_arg) fprintf(out, " %d", info.ckpt_arg);
    fprintf(out, " -> %d unit forwards recomputed per micro-batch", info.recomputed_units);
    if (n_remade)
        fprintf(out, "; %d cheap ops' outputs remade before their backward (selective)", n_remade);
    const double head = head_cost(s, base);
    fprintf(out,
            "\nextra cost: %.1f%% of the whole-batch step's time: %.1f%% more FLOPs (recomputed)",
            100 * (frac + split + head), 100 * frac);
    if (head_rows) fprintf(out, " + %.1f%% for the fused head", 100 * head);
    if (info.accumulate > 1)
        fprintf(out,
                " + %.1f%% from splitting (every node runs %d times, each linear GEMM with %d "
                "times fewer rows)%s",
                100 * split, info.accumulate, info.accumulate,
                has_batchnorm(m) ? "; BatchNorm normalizes over each micro-batch alone" : "");
    fputc('\n', out);
    fprintf(out, "precision: %s", fr_precision_name(s->o.precision));
    const fr_backend *be = fr_backend_of(s->ctx);
    if (s->o.precision == FR_PREC_BF16_MIXED)
        fprintf(out, be->gemm16 && be->gemm16(FR_BF16)
                         ? " (native bf16 products: linear layers, and convolutions and "
                           "attention where the backend runs them)\n"
                         : " (GEMMs in f32 on bf16-rounded operands: no native bf16 GEMM here)\n");
    else fputc('\n', out);
    if (weighs_precision(s)) {
        fr_mixed_estimate e;
        fr_plan_mixed_estimate(s, &e);
        fprintf(out,
                "  bf16-mixed against fp32 (what --precision auto weighs): %.2fx the step's time: ",
                1 + e.cost);
        if (e.bf16 > 0)
            fprintf(out,
                    "the native bf16 products (%.1f%% of the FLOPs) at %.0f GFLOP/s bf16 against "
                    "%.0f f32 (%s), plus %.0f%% for the casts\n",
                    100 * e.linear_share, e.bf16, e.f32,
                    e.from_env ? "FRUGAL_GEMM_RATES" : "measured", 100 * e.cast_share);
        else
            fprintf(out, "%s (the GEMMs run f32 on rounded operands), the casts %.0f%% more\n",
                    e.from_env ? "FRUGAL_GEMM_RATES gives bf16 0: no native bf16 GEMM"
                               : "no native bf16 GEMM here",
                    100 * e.cast_share);
    }
    {
        size_t qb = 0;
        int nq = 0;
        for (size_t i = 0; i < m->n_params; i++)
            if (m->params[i].quant) nq++, qb += (size_t)fr_shape_numel(&m->params[i].shape);
        if (nq) {
            char h[32];
            fprintf(out, "frozen base: %d linear weights in %s, %s (--base-precision)\n", nq,
                    fr_base_precision_name(s->o.base_precision), fr_human_bytes(qb, h, sizeof h));
        }
    }
    if (fr_place_second_memory(s->ctx)) /* what offload would move to the host */
        describe_offload(s, base, info.recomputed_units > 0, out);
    if (head_rows)
        fprintf(out,
                "fused head: %s and the loss in chunks of %d rows: its %s of logits a "
                "micro-batch and their gradient never stored, a %s chunk instead; the logits "
                "made again in backward and the chunks' GEMMs cost %.1f%% more time\n",
                m->layers[m->n_layers - 1].name, head_rows,
                fr_human_bytes(head_logits, h[6], sizeof h[6]),
                fr_human_bytes(head_ws, h[7], sizeof h[7]), 100 * head_cost(s, base));
    fprintf(out, "in place: %d ops write over an input that dies there\n", inplace);
    if (s->place.n_blocked)
        fprintf(out,
                "layout: %d activations stored nChw16c, oneDNN's blocked format: its "
                "convolutions read and write them without copies (FRUGAL_LAYOUT=plain: NCHW)\n",
                s->place.n_blocked);
    if (s->place.n_folded)
        fprintf(out,
                "folded: %d ReLU backward passes into max pooling's backward (it writes "
                "their dx itself: one pass over memory less)\n",
                s->place.n_folded);
    if (s->place.n_folded_bn)
        fprintf(out,
                "folded: %d ReLUs into the BatchNorm before them (it writes max(y, 0) itself: "
                "one pass over memory less)\n",
                s->place.n_folded_bn);
    if (s->opt.n_fused && !s->opt.upd_ws_len)
        fprintf(out,
                "optimizer step inside backward: %d tensors stepped as their gradient is made, "
                "%s of gradients never all stored (--keep-grads to store them)\n",
                s->opt.n_fused, fr_human_bytes(fused_bytes(s), h[5], sizeof h[5]));
    else if (s->opt.n_fused)
        fprintf(out,
                "SGD step inside backward: %d Linear tensors updated as their gradient is "
                "computed, %s of gradients never stored, a %s tile of scratch instead "
                "(--keep-grads to store them)\n",
                s->opt.n_fused, fr_human_bytes(fused_bytes(s), h[5], sizeof h[5]),
                fr_human_bytes(s->opt.upd_ws_len * sizeof(float), h[6], sizeof h[6]));
    fprintf(out, "\n");
    int nw = fr_model_name_width(m, 16);
    fprintf(out, "%-6s %-*s %-14s %s\n", "unit", nw, "layer", "type", "activations");
    for (size_t i = 0; i < m->n_layers; i++) {
        const fr_layer *l = &m->layers[i];
        if (l->kind == FR_L_RES_SHORTCUT || l->kind == FR_L_RES_END) continue;
        int u = l->unit;
        fprintf(out, "%-6d %-*s %-14s %s%s\n", u, nw, l->name, fr_layer_kind_name(l->kind),
                u < s->sched.first_unit ? "no backward (below the lowest trainable layer)"
                : has_clone(s, recomputed, FR_REMAT_UNIT, u) ? "recomputed before its backward"
                : offloaded && offloaded[i] ? "kept on the host between forward and backward"
                : has_clone(s, remade, FR_REMAT_CHEAP, (int)i)
                    ? "input kept, output remade before its backward (selective)"
                    : "kept",
                l->frozen ? ", frozen" : "");
    }
    fprintf(out, "\npredicted peak by category:\n");
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
        if (pred[c])
            fprintf(out, "  %-12s %12s\n", fr_mem_cat_name(c),
                    fr_human_bytes(pred[c], h[0], sizeof h[0]));
    fprintf(out, "  %-12s %12s  (live bytes at the peak)\n", "total",
            fr_human_bytes(total, h[1], sizeof h[1]));
    fprintf(out, "  %-12s %12s  (persistent + arena %s)\n", "reserved",
            fr_human_bytes(info.reserved, h[2], sizeof h[2]),
            fr_human_bytes(info.arena, h[3], sizeof h[3]));
    if (s->o.budget)
        fprintf(out, "  %-12s %12s  (%s)\n", "budget",
                fr_human_bytes(s->o.budget, h[4], sizeof h[4]),
                info.reserved <= s->o.budget ? "fits" : "does NOT fit");
    fr_free(s->ctx, recomputed);
    fr_free(s->ctx, remade);
    fr_free(s->ctx, offloaded);
}

/* The public fr_step_compile and what it runs, built but not materialized:
 * within opts->budget (or checkpoint auto) the planner's choice, else the
 * step as given. */
fr_step *fr_step_prepare(fr_model *m, const fr_step_opts *opts) {
    if (opts->checkpoint == FR_CKPT_AUTO || opts->budget) {
        fr_plan_need need;
        fr_step *s = fr_step_plan_choose(m, opts, &need);
        if (!s && need.reserved) fr_plan_refuse(m->ctx, opts, &need);
        return s;
    }
    return fr_step_build(m, opts);
}

fr_step *fr_step_compile(fr_model *m, const fr_step_opts *opts) {
    if (opts->checkpoint == FR_CKPT_AUTO || opts->budget) return fr_step_plan_budget(m, opts);
    fr_step *s = fr_step_build(m, opts);
    if (s && fr_step_materialize(s)) {
        fr_step_free(s);
        return NULL;
    }
    return s;
}
