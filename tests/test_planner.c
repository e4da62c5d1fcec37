/* test_planner.c — the planner's promises. Binomial checkpointing reaches
 * the optimum of an exhaustive search; every checkpointing plan gives
 * gradients bit-identical to keeping everything (BatchNorm and dropout
 * included); recomputation lowers the planned peak; K micro-batches equal the
 * full batch within float tolerance; frozen layers never change and cost no
 * gradient or optimizer bytes; naming intermediates or reusing one variable
 * makes the same plan; budgets are met or refused with the smallest budget
 * that works; predicted and measured agree across a sweep of budgets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backend/cpu/conv_dnnl.h"
#include "optim/optim.h"
#include "check.h"
#include "core/rng.h"
#include "plan/remat.h"
#include "train/step.h"
#include "run/trainer.h"

/* ---- revolve against an exhaustive search -------------------------------
 * State: which positions are stored (a bit set, position 0 always), where
 * the state in hand is (-1: none), and how many steps remain to reverse.
 * Moves: advance the state in hand one step (cost 1; not into the remaining
 * last step's output), reverse the last remaining step when the state in
 * hand is at its input (cost 0), store the state in hand (at most s stored),
 * drop a stored position, take a stored position into hand (cost 0).
 * Dijkstra over these states gives the least number of advances. */
#define EX_L 7
static int exhaustive(int l, int s) {
    /* states: stored mask (l bits), hand (-1..l-1), remaining r (0..l) */
    int nstate = (1 << l) * (l + 1) * (l + 1);
    int *dist = malloc(nstate * sizeof *dist);
    char *done = calloc(nstate, 1);
    for (int i = 0; i < nstate; i++) dist[i] = 1 << 28;
#define ID(mask, hand, r) (((mask) * (l + 1) + ((hand) + 1)) * (l + 1) + (r))
    dist[ID(1, 0, l)] = 0;
    int best = -1;
    for (;;) {
        int u = -1;
        for (int i = 0; i < nstate; i++)
            if (!done[i] && dist[i] < (1 << 28) && (u < 0 || dist[i] < dist[u])) u = i;
        if (u < 0) break;
        done[u] = 1;
        int r = u % (l + 1), hand = (u / (l + 1)) % (l + 1) - 1, mask = u / ((l + 1) * (l + 1));
        int d = dist[u];
        if (r == 0) {
            best = d;
            break;
        }
        int cnt = __builtin_popcount(mask);
#define RELAX(m2, h2, r2, c)                        \
    do {                                            \
        int v_ = ID((m2), (h2), (r2));              \
        if (d + (c) < dist[v_]) dist[v_] = d + (c); \
    } while (0)
        if (hand >= 0 && hand < r - 1) RELAX(mask, hand + 1, r, 1);
        if (hand == r - 1)
            RELAX(mask & ((1 << (r - 1)) - 1) ? mask & ((1 << r) - 1) : mask, -1, r - 1, 0);
        if (hand >= 0 && !(mask >> hand & 1) && cnt < s) RELAX(mask | 1 << hand, hand, r, 0);
        for (int p = 1; p < l; p++)
            if (mask >> p & 1) RELAX(mask & ~(1 << p), hand, r, 0);
        for (int p = 0; p < r; p++)
            if (mask >> p & 1) RELAX(mask, p, r, 0);
    }
    free(dist);
    free(done);
    return best;
}

/* T(l, s) by its recurrence (remat.h), as a table: the reference for the
 * closed form at small l. */
#define DP_L 300
#define DP_S 12
static int64_t dp_t[DP_L + 1][DP_S + 1];
static void dp_fill(void) {
    for (int l = 1; l <= DP_L; l++)
        for (int s = 1; s <= DP_S; s++) {
            if (l == 1) dp_t[l][s] = 0;
            else if (s == 1) dp_t[l][s] = (int64_t)l * (l - 1) / 2;
            else {
                int64_t best = INT64_MAX;
                for (int j = 1; j < l; j++) {
                    int64_t c = j + dp_t[l - j][s - 1] + dp_t[j][s];
                    if (c < best) best = c;
                }
                dp_t[l][s] = best;
            }
        }
}

/* Griewank and Walther's closed form, computed here on its own: r the least
 * integer with l <= C(s + r, s), T = r l - C(s + r, s + 1). */
static double binom(int n, int k) {
    double b = 1;
    for (int i = 1; i <= k; i++) b = b * (n - k + i) / i;
    return floor(b + 0.5);
}
static int64_t closed_form(int l, int s) {
    if (l == 1) return 0;
    int r = 0;
    while (binom(s + r, s) < l) r++;
    return (int64_t)r * l - (int64_t)binom(s + r, s + 1);
}

/* Check a schedule of units [0, l): every unit goes back once, in reverse
 * order; it recomputes `want` unit forwards; and it never holds more than
 * `slots` states. A FWD(u) that does not continue a FWD(u-1) restarts from
 * the stored input of u, which must have been held since it was last made
 * (unit 0's input: since the start). Returns the most states held at once. */
static int check_schedule(const fr_schedule *sc, int l, int slots, int64_t want, const char *what) {
    int backs = 0, ok = 1, next = l - 1;
    int *made = malloc(sizeof(int) * (l + 1)), *from = malloc(sizeof(int) * (l + 1));
    int *delta = calloc((size_t)sc->n + 2, sizeof(int));
    for (int u = 0; u <= l; u++) made[u] = -1, from[u] = -1;
    made[0] = 0;
    for (int i = 0; i < sc->n; i++) {
        fr_action a = sc->a[i];
        if (a.back) {
            backs++;
            ok &= a.unit == next--;
            continue;
        }
        int cont = i > 0 && !sc->a[i - 1].back && sc->a[i - 1].unit == a.unit - 1;
        if (!cont) { /* the input of a.unit held over [made, i] */
            ok &= made[a.unit] >= 0;
            int start = made[a.unit] > from[a.unit] ? made[a.unit] : from[a.unit] + 1;
            if (made[a.unit] >= 0 && start <= i) {
                delta[start]++;
                delta[i + 1]--;
            }
            if (made[a.unit] >= 0) from[a.unit] = i;
        }
        made[a.unit + 1] = i;
    }
    int held = 0, most = 0;
    for (int i = 0; i <= sc->n; i++) {
        held += delta[i];
        if (held > most) most = held;
    }
    CHECK(backs == l && ok, "%s: every unit reversed once, in order, from a state it holds", what);
    CHECK(fr_schedule_recomputed(sc) == want, "%s: %d unit forwards recomputed, want %lld", what,
          fr_schedule_recomputed(sc), (long long)want);
    CHECK(most <= slots, "%s: %d states held at once, %d slots", what, most, slots);
    free(made);
    free(from);
    free(delta);
    return most;
}

static void test_revolve(void) {
    for (int l = 1; l <= EX_L; l++)
        for (int s = 1; s <= 4; s++) {
            int64_t t = fr_revolve_cost(l, s);
            int ex = exhaustive(l, s);
            CHECK(t == ex, "T(%d,%d) = %lld, exhaustive search %d", l, s, (long long)t, ex);
        }
    /* Hand-derived: one slot recomputes from the start each time. */
    CHECK(fr_revolve_cost(32, 1) == 32 * 31 / 2, "T(32,1)");
    dp_fill();
    int bad = 0;
    for (int l = 1; l <= DP_L; l++)
        for (int s = 1; s <= DP_S; s++)
            if (fr_revolve_cost(l, s) != dp_t[l][s] && bad++ < 3)
                CHECK(0, "T(%d,%d) = %lld, recurrence %lld", l, s, (long long)fr_revolve_cost(l, s),
                      (long long)dp_t[l][s]);
    CHECK(bad == 0, "closed form against the recurrence for l <= %d, s <= %d: %d differ", DP_L,
          DP_S, bad);
    fr_ctx *ctx = fr_ctx_new();
    char what[64];
    for (int l = 1; l <= 120; l += 7)
        for (int s = 1; s <= 8; s++) {
            fr_schedule sc;
            CHECK(fr_schedule_revolve(ctx, 0, l, s, &sc) == FR_OK, "schedule");
            snprintf(what, sizeof what, "l=%d s=%d", l, s);
            check_schedule(&sc, l, s, dp_t[l][s], what);
            fr_schedule_release(ctx, &sc);
        }
    /* Thousands of units: the schedule reaches the closed form and holds
     * every slot it is given, no more. */
    int ls[2] = {2000, 5000}, ss[4] = {2, 3, 8, 40};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++) {
            fr_schedule sc;
            CHECK(fr_schedule_revolve(ctx, 0, ls[a], ss[b], &sc) == FR_OK, "schedule: %s",
                  fr_last_error(ctx));
            snprintf(what, sizeof what, "l=%d s=%d", ls[a], ss[b]);
            CHECK(fr_revolve_cost(ls[a], ss[b]) == closed_form(ls[a], ss[b]),
                  "%s: T = %lld, closed form %lld", what, (long long)fr_revolve_cost(ls[a], ss[b]),
                  (long long)closed_form(ls[a], ss[b]));
            int most = check_schedule(&sc, ls[a], ss[b], closed_form(ls[a], ss[b]), what);
            CHECK(most == ss[b], "%s: holds %d states", what, most);
            fr_schedule_release(ctx, &sc);
        }
    fr_ctx_free(ctx);
}

/* ---- models ---- */

static fr_model *chain(fr_ctx *ctx, int blocks, int width) {
    fr_model *m = fr_model_new(ctx, width, 1, 1);
    for (int i = 0; i < blocks; i++) {
        fr_model_linear(m, width, 1);
        fr_model_relu(m);
    }
    fr_model_linear(m, 10, 1);
    return m;
}

static fr_model *convnet(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1, 10, 10);
    fr_model_conv2d(m, 4, 3, 1, 1, 0);
    fr_model_batchnorm(m);
    fr_model_relu(m);
    fr_model_residual_begin(m);
    fr_model_conv2d(m, 4, 3, 1, 1, 0);
    fr_model_batchnorm(m);
    fr_model_relu(m);
    fr_model_conv2d(m, 4, 3, 1, 1, 0);
    fr_model_residual_end(m);
    fr_model_relu(m);
    fr_model_residual_begin(m);
    fr_model_conv2d(m, 8, 3, 2, 1, 0);
    fr_model_residual_shortcut(m);
    fr_model_conv2d(m, 8, 1, 2, 0, 0);
    fr_model_residual_end(m);
    fr_model_maxpool2d(m, 2, 2);
    fr_model_flatten(m);
    fr_model_dropout(m, 0.3f);
    fr_model_linear(m, 10, 1);
    return m;
}

typedef struct batch_data {
    float *x;
    int32_t *y;
    int n;
} batch_data;

static batch_data make_batch(int n, int d) {
    batch_data b = {malloc(sizeof(float) * n * d), malloc(sizeof(int32_t) * n), n};
    fr_rng r = fr_rng_make(77, 1);
    for (int i = 0; i < n * d; i++) b.x[i] = 2 * fr_rng_next_uniform(&r) - 1;
    for (int i = 0; i < n; i++) b.y[i] = (int32_t)fr_rng_below(&r, 10);
    return b;
}

/* Run `steps` steps and return a copy of every parameter and buffer plus the
 * last gradients (zero_grad keeps them). */
static float *train_copy(fr_model *(*make)(fr_ctx *), fr_ckpt_mode mode, int arg, int micro,
                         int steps, fr_precision prec, float *losses, size_t *len, size_t *arena) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = make(ctx);
    fr_model_init(m, 5);
    fr_step_opts o = {.batch = 16,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 3,
                      .checkpoint = mode,
                      .ckpt_arg = arg,
                      .micro_batch = micro,
                      .precision = prec,
                      .keep_grads = 1}; /* gradients are compared */
    o.optim.zero_grad_to_none = 0;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile mode %d arg %d: %s", mode, arg, fr_last_error(ctx));
    if (!s) return NULL;
    if (arena) *arena = s->plan.peak_total;
    int d = (int)(fr_shape_numel(&m->in));
    batch_data b = make_batch(16, d);
    fr_batch fb = {16, b.x, b.y, NULL, NULL};
    float loss;
    for (int i = 0; i < steps; i++) {
        CHECK(fr_step_run(s, &fb, &loss, NULL) == FR_OK, "%s", fr_last_error(ctx));
        if (losses) losses[i] = loss;
    }
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) n += 2 * fr_shape_numel(&m->params[i].shape);
    float *out = calloc(n, sizeof(float)), *p = out;
    for (size_t i = 0; i < m->n_params; i++) {
        size_t k = fr_shape_numel(&m->params[i].shape);
        if (m->params[i].dtype == FR_F32) memcpy(p, m->params[i].data, k * 4);
        p += k;
        if (fr_grad32(m, &m->params[i])) memcpy(p, fr_grad32(m, &m->params[i]), k * 4);
        p += k;
    }
    *len = n;
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    fr_mem_stats ms;
    fr_ctx_free(ctx);
    (void)ms;
    return out;
}

static fr_model *chain8(fr_ctx *ctx) { return chain(ctx, 8, 24); }

/* Max pooling feeding BatchNorm (pooling reads its input rounded under the
 * mixed modes, BatchNorm reads its input in f32), then a residual block
 * whose input is read by a convolution (rounded) and by the sum (f32). */
static fr_model *pool_bn(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1, 12, 12);
    fr_model_conv2d(m, 4, 3, 1, 1, 1);
    fr_model_relu(m);
    fr_model_maxpool2d(m, 2, 2);
    fr_model_batchnorm(m);
    fr_model_residual_begin(m);
    fr_model_conv2d(m, 4, 3, 1, 1, 0);
    fr_model_batchnorm(m);
    fr_model_relu(m);
    fr_model_conv2d(m, 4, 3, 1, 1, 0);
    fr_model_residual_end(m);
    fr_model_relu(m);
    fr_model_maxpool2d(m, 2, 2);
    fr_model_batchnorm(m);
    fr_model_flatten(m);
    fr_model_linear(m, 10, 1);
    return m;
}

/* Checkpointing never changes results: every schedule gives the losses,
 * weights, gradients and BatchNorm statistics of keeping everything, bit for
 * bit, in fp32 and in both mixed modes (where which values a forward op reads
 * rounded to 16 bits must not depend on what reads them later). */
static void test_bit_identical(void) {
    struct {
        fr_ckpt_mode mode;
        int arg;
        const char *name;
    } modes[] = {{FR_CKPT_ALL, 0, "all"},           {FR_CKPT_SQRT, 0, "sqrt"},
                 {FR_CKPT_EVERY, 2, "every:2"},     {FR_CKPT_SEGMENTS, 3, "segments 3"},
                 {FR_CKPT_REVOLVE, 1, "revolve:1"}, {FR_CKPT_REVOLVE, 2, "revolve:2"},
                 {FR_CKPT_REVOLVE, 3, "revolve:3"}};
    fr_model *(*models[3])(fr_ctx *) = {chain8, convnet, pool_bn};
    const char *names[3] = {"chain", "convnet", "pool->batchnorm net"};
    fr_precision precs[3] = {FR_PREC_FP32, FR_PREC_BF16_MIXED, FR_PREC_FP16_MIXED};
    for (int q = 0; q < 3; q++)
        for (int k = 0; k < 3; k++) {
            size_t n0, n1, peak0, peak1;
            float loss0[3], loss1[3];
            float *ref = train_copy(models[k], FR_CKPT_NONE, 0, 0, 3, precs[q], loss0, &n0, &peak0);
            for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
                float *got = train_copy(models[k], modes[i].mode, modes[i].arg, 0, 3, precs[q],
                                        loss1, &n1, &peak1);
                CHECK(got && memcmp(loss0, loss1, sizeof loss0) == 0,
                      "%s, %s, checkpoint %s: losses %.9g %.9g %.9g, keeping everything %.9g %.9g "
                      "%.9g",
                      names[k], fr_precision_name(precs[q]), modes[i].name, loss1[0], loss1[1],
                      loss1[2], loss0[0], loss0[1], loss0[2]);
                CHECK(got && n0 == n1 && memcmp(ref, got, n0 * 4) == 0,
                      "%s, %s, checkpoint %s: weights, gradients and BatchNorm stats differ from "
                      "keeping everything",
                      names[k], fr_precision_name(precs[q]), modes[i].name);
                /* Recomputation lowers the fp32 peak of the chain and the convnet
                 * (checkpointing every Linear+ReLU block keeps each block's input, which is
                 * what backward keeps anyway: no gain there, and no loss). On oneDNN's
                 * convolutions the convnet's peak is a convolution's reordered copies
                 * (conv_dnnl.h), which recomputation cannot lower: never higher, then. */
                int dnnl_conv = k == 1 && fr_conv_dnnl_on();
                CHECK(q > 0 || k == 2 || peak1 < peak0 || modes[i].mode == FR_CKPT_REVOLVE ||
                          (modes[i].mode == FR_CKPT_ALL && peak1 == peak0) ||
                          (dnnl_conv && peak1 <= peak0),
                      "%s, %s, %s: planned peak %zu < %zu", names[k], fr_precision_name(precs[q]),
                      modes[i].name, peak1, peak0);
                free(got);
            }
            free(ref);
        }
}

/* K micro-batches give the full batch's step (no BatchNorm) within float error. */
static void test_accumulation(void) {
    size_t n0, n1;
    float *ref = train_copy(chain8, FR_CKPT_NONE, 0, 0, 1, FR_PREC_FP32, NULL, &n0, NULL);
    for (int micro = 8; micro >= 2; micro /= 2) {
        float *got = train_copy(chain8, FR_CKPT_NONE, 0, micro, 1, FR_PREC_FP32, NULL, &n1, NULL);
        double worst = 0;
        for (size_t i = 0; got && i < n0; i++)
            worst = fmax(worst, fabs((double)ref[i] - got[i]) / (1e-3 + fabs((double)ref[i])));
        CHECK(got && worst < 1e-4, "micro-batch %d: worst relative difference %g", micro, worst);
        free(got);
    }
    free(ref);
}

/* A frozen linear layer keeps nothing for its own backward (issue 24: the
 * base under adapters): dx = dy W and db need no x. fc0 -> LayerNorm ->
 * fc2 (frozen) -> ReLU -> fc4: LayerNorm's output is read in backward only
 * by fc2's weight gradient. Trainable, fp32 remakes it before backward (the
 * cheap recomputation) and bf16-mixed keeps it in 16 bits (N x 32 x 2
 * bytes, counted by hand); frozen, neither happens. The trainable layers'
 * gradients are bit for bit those of the same step with fc2 trainable. */
static fr_model *ln_sandwich(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 16, 1, 1);
    fr_model_linear(m, 32, 1);
    fr_model_layernorm(m);
    fr_model_linear(m, 32, 1);
    fr_model_relu(m);
    fr_model_linear(m, 10, 1);
    return m;
}

static void test_frozen_saves_no_x(void) {
    const int N = 8;
    for (int q = 0; q < 2; q++) {
        fr_precision prec = q ? FR_PREC_BF16_MIXED : FR_PREC_FP32;
        size_t saved[2] = {0, 0};
        int remade[2] = {0, 0};
        float *grads[2] = {NULL, NULL};
        size_t n = 0;
        for (int fz = 0; fz < 2; fz++) {
            fr_ctx *ctx = fr_ctx_new();
            fr_model *m = ln_sandwich(ctx);
            fr_model_init(m, 3);
            if (fz) CHECK(fr_model_freeze(m, "2") == FR_OK, "%s", fr_last_error(ctx));
            fr_step_opts o = {.batch = N,
                              .training = 1,
                              .optim = fr_optim_defaults(FR_OPTIM_SGD),
                              .seed = 1,
                              .precision = prec,
                              .keep_grads = 1};
            o.optim.zero_grad_to_none = 0; /* the gradients are compared after the step */
            fr_step *s = fr_step_compile(m, &o);
            CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
            if (!s) return;
            for (size_t v = 0; v < s->g.n_vals; v++) /* kept for backward */
                if (s->g.vals[v].saved && s->g.vals[v].kind == FR_VAL_STEP)
                    saved[fz] += fr_value_bytes(&s->g.vals[v]);
            int no_x = 0;
            for (size_t i = (size_t)s->g.n_forward; i < s->g.n_nodes; i++) {
                const fr_node *nd = &s->g.nodes[i];
                if (nd->op == FR_OP_LINEAR_BWD && nd->layer == 2) no_x = nd->in[1] < 0;
                remade[fz] += nd->op == FR_OP_LAYERNORM; /* a clone before backward */
            }
            CHECK(no_x == fz, "%s: fc2's backward reads x: %d (frozen %d)", fr_precision_name(prec),
                  !no_x, fz);
            batch_data b = make_batch(N, 16);
            fr_batch fb = {N, b.x, b.y, NULL, NULL};
            float loss;
            CHECK(fr_step_run(s, &fb, &loss, NULL) == FR_OK, "run: %s", fr_last_error(ctx));
            n = 0; /* the trainable layers' gradients: fc0, LayerNorm, fc4 */
            for (size_t i = 0; i < m->n_params; i++)
                if (m->params[i].layer != 2) n += (size_t)fr_shape_numel(&m->params[i].shape);
            grads[fz] = malloc(n * sizeof(float));
            n = 0;
            for (size_t i = 0; i < m->n_params; i++) {
                if (m->params[i].layer == 2) continue;
                size_t k = (size_t)fr_shape_numel(&m->params[i].shape);
                const float *gp = fr_grad32(m, &m->params[i]);
                CHECK(gp != NULL, "param %zu has an f32 gradient", i);
                if (gp) memcpy(grads[fz] + n, gp, k * sizeof(float));
                n += k;
            }
            free(b.x);
            free(b.y);
            fr_step_free(s);
            fr_model_free(m);
            fr_ctx_free(ctx);
        }
        const char *pn = fr_precision_name(prec);
        if (q == 0)
            CHECK(remade[0] == 1 && remade[1] == 0 && saved[0] == saved[1],
                  "fp32: LayerNorm remade before backward %d times trainable, %d frozen (want 1, "
                  "0); saved %zu and %zu bytes (want equal)",
                  remade[0], remade[1], saved[0], saved[1]);
        else
            CHECK(saved[0] - saved[1] == (size_t)N * 32 * 2,
                  "%s: frozen fc2: %zu bytes saved, trainable %zu: want %d fewer", pn, saved[1],
                  saved[0], N * 32 * 2);
        CHECK(memcmp(grads[0], grads[1], n * sizeof(float)) == 0,
              "%s: freezing fc2 changed the other layers' gradients", pn);
        free(grads[0]);
        free(grads[1]);
    }
}

static void test_freeze(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = chain(ctx, 4, 16);
    fr_model_init(m, 1);
    CHECK(fr_model_freeze(m, "0-3") == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_model_freeze(m, "fc9") == FR_ERR_ARG && strstr(fr_last_error(ctx), "fc9"),
          "unknown layer refused");
    float w0 = ((float *)m->params[0].data)[0], w2 = ((float *)m->params[2].data)[3];
    fr_step_opts o = {.batch = 8,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .keep_grads = 1}; /* every gradient stored: their bytes are counted */
    fr_step *s = fr_step_compile(m, &o);
    batch_data b = make_batch(8, 16);
    fr_batch fb = {8, b.x, b.y, NULL, NULL};
    float loss;
    for (int i = 0; i < 3; i++) fr_step_run(s, &fb, &loss, NULL);
    CHECK(((float *)m->params[0].data)[0] == w0 && ((float *)m->params[2].data)[3] == w2,
          "frozen weights changed");
    size_t pred[FR_MEM_CAT_COUNT], tot;
    fr_step_predicted(s, pred, &tot);
    /* layers L0 R1 L2 R3 | L4 R5 L6 R7 L8: trainable Linear(16,16) x2 + Linear(16,10) = 714 floats */
    CHECK(pred[FR_MEM_GRADS] == 714 * 4, "gradients only for trainable layers: %zu",
          pred[FR_MEM_GRADS]);
    CHECK(pred[FR_MEM_OPTIM] == 2 * 714 * 4, "optimizer state only for trainable layers");
    int below = 0, u4 = m->layers[4].unit;
    for (size_t i = (size_t)s->g.n_forward; i < s->g.n_nodes; i++) {
        int l = s->g.nodes[i].layer;
        below |= l >= 0 && m->layers[l].unit < u4;
    }
    CHECK(!below, "no backward below the lowest trainable layer");
    CHECK(s->sched.first_unit == u4, "first unit with backward: %d", s->sched.first_unit);
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* The seed's residual conv net, written with x0..x6 and with one reused x:
 * the graph has no names, so the plans match offset for offset, and in eval
 * the arena holds a few activations, not all seven. */
static fr_model *seed_resnet(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 3, 16, 16);
    fr_model_conv2d(m, 8, 3, 1, 1, 1); /* x0 = conv0(x) */
    for (int i = 0; i < 5; i++) {      /* x_{i+1} = relu_(conv_i(x_i) + x_i) */
        fr_model_residual_begin(m);
        fr_model_conv2d(m, 8, 3, 1, 1, 1);
        fr_model_residual_end(m);
        fr_model_relu(m);
    }
    fr_model_conv2d(m, 2, 3, 1, 1, 1); /* x6 = conv(x5) */
    fr_model_global_avgpool(m);
    return m;
}

static void test_names_do_not_matter(void) {
    fr_ctx *ctx = fr_ctx_new();
    size_t arena[2];
    int64_t offs[2][512];
    memset(offs, 0xff, sizeof offs);
    for (int k = 0; k < 2; k++) {
        fr_model *m = seed_resnet(ctx);
        fr_model_init(m, 1);
        fr_step_opts o = {.batch = 4, .training = 0, .optim = fr_optim_defaults(FR_OPTIM_SGD)};
        fr_step *s = fr_step_compile(m, &o);
        arena[k] = s->plan.arena_bytes;
        for (size_t v = 0; v < s->g.n_vals && v < 512; v++) offs[k][v] = s->plan.offset[v];
        size_t all = 0;
        for (size_t v = 0; v < s->g.n_vals; v++)
            if (s->plan.offset[v] >= 0 && s->g.vals[v].alias_of < 0)
                all += fr_value_bytes(&s->g.vals[v]);
        CHECK(s->plan.arena_bytes * 3 <= all, "eval frees by liveness: arena %zu of %zu",
              s->plan.arena_bytes, all);
        fr_step_free(s);
        fr_model_free(m);
    }
    CHECK(arena[0] == arena[1] && memcmp(offs[0], offs[1], sizeof offs[0]) == 0, "same plan");
    fr_ctx_free(ctx);
}

/* Budgets: measured reserved never exceeds the budget; predicted and
 * measured agree; below the minimum the refusal names the smallest budget. */
static void test_budget_sweep(void) {
    fr_model *(*models[2])(fr_ctx *) = {chain8, convnet};
    for (int k = 0; k < 2; k++) {
        size_t full = 0, smallest = 0;
        for (int i = 0; i < 6; i++) {
            fr_ctx *ctx = fr_ctx_new();
            fr_model *m = models[k](ctx);
            fr_model_init(m, 2);
            fr_step_opts o = {.batch = 16,
                              .training = 1,
                              .optim = fr_optim_defaults(FR_OPTIM_SGD),
                              .seed = 1,
                              .checkpoint = FR_CKPT_AUTO};
            if (i == 0) { /* find the plan with no budget: everything kept */
                fr_step_opts n = o;
                n.checkpoint = FR_CKPT_NONE;
                fr_step *s = fr_step_build(m, &n);
                fr_plan_info info;
                fr_step_plan_info(s, &info);
                full = info.reserved;
                fr_step_free(s);
                fr_model_free(m);
                fr_ctx_free(ctx);
                continue;
            }
            size_t budget = full - (full / 8) * (size_t)(i - 1) / 2;
            if (i == 5) budget = 1000; /* far below anything */
            fr_mem_stats before;
            fr_mem_get_stats(ctx, &before);
            o.budget = budget;
            fr_step *s = fr_step_compile(m, &o); /* planning itself is not under the limit */
            fr_mem_set_limit(ctx, before.reserved + budget);
            if (i == 5) {
                CHECK(!s && strstr(fr_last_error(ctx), "smallest needs"), "refusal: %s",
                      fr_last_error(ctx));
                const char *p = strstr(fr_last_error(ctx), "(");
                smallest = p ? strtoull(p + 1, NULL, 10) : 0;
                CHECK(smallest > 0 && smallest < full, "smallest budget %zu < keep-all %zu",
                      smallest, full);
            } else if (s) {
                batch_data b = make_batch(16, (int)fr_shape_numel(&m->in));
                fr_batch fb = {16, b.x, b.y, NULL, NULL};
                float loss;
                fr_mem_reset_peak(ctx);
                CHECK(fr_step_run(s, &fb, &loss, NULL) == FR_OK, "run under budget: %s",
                      fr_last_error(ctx));
                fr_mem_stats ms;
                fr_mem_get_stats(ctx, &ms);
                fr_plan_info info;
                fr_step_plan_info(s, &info);
                size_t measured = ms.reserved_peak - before.reserved;
                CHECK(measured <= budget, "measured %zu > budget %zu", measured, budget);
                /* predicted reserved counts one batch of data the caller owns here, and metadata;
                 * measured counts what the allocator holds: they agree within 1% + 64 KiB */
                double diff = fabs((double)measured -
                                   (double)(info.reserved - 16 * (fr_shape_numel(&m->in) + 1) * 4));
                CHECK(diff <= 0.01 * measured + 65536, "%s budget %zu: measured %zu, predicted %zu",
                      k ? "convnet" : "chain", budget, measured, info.reserved);
                free(b.x);
                free(b.y);
            } else {
                CHECK(strstr(fr_last_error(ctx), "smallest"), "refused with a reason: %s",
                      fr_last_error(ctx));
            }
            fr_step_free(s);
            fr_model_free(m);
            fr_ctx_free(ctx);
        }
    }
}

/* Planning scales: a 2000-block chain (2001 units, Linear(16,16)+ReLU each,
 * the last Linear(16,10)) at batch 8192, so that a unit's input (512 KiB)
 * outweighs its metadata, under the budget of revolve with 20 slots and
 * the whole batch (micro_batch fixed): segment plans hold about
 * 2 sqrt(2001) unit inputs and do not fit, binomial checkpointing does. The
 * plan fits, and recomputes T(2001, s) unit forwards by the closed form for
 * its s >= 20 slots, each 2 B 16 16 + B 16 FLOPs (Linear and ReLU). Exhaustive
 * planning took minutes here; a regression shows as a timeout. */
static void test_plan_scales(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = chain(ctx, 2000, 16);
    fr_model_init(m, 1);
    const int B = 8192;
    fr_step_opts o = {.batch = B,
                      .micro_batch = B,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .checkpoint = FR_CKPT_REVOLVE,
                      .ckpt_arg = 20};
    fr_step *r = fr_step_build(m, &o);
    CHECK(r != NULL, "revolve 20: %s", fr_last_error(ctx));
    if (!r) return;
    fr_plan_info ri, info;
    fr_step_plan_info(r, &ri);
    int L = m->n_units - r->sched.first_unit;
    fr_step_free(r);
    CHECK(L == 2001, "%d units", L);
    o.checkpoint = FR_CKPT_AUTO;
    o.ckpt_arg = 0;
    o.budget = ri.reserved;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "plan: %s", fr_last_error(ctx));
    if (s) {
        fr_step_plan_info(s, &info);
        CHECK(info.reserved <= o.budget, "reserved %zu, budget %zu", info.reserved, o.budget);
        CHECK(info.mode == FR_CKPT_REVOLVE && info.ckpt_arg >= 20 && info.accumulate == 1,
              "revolve with at least 20 slots, got mode %d arg %d", info.mode, info.ckpt_arg);
        int64_t t = closed_form(L, info.ckpt_arg);
        CHECK(info.recomputed_units == t && t <= closed_form(L, 20),
              "recomputed %d, closed form %lld", info.recomputed_units, (long long)t);
        double unit = 2.0 * B * 16 * 16 + (double)B * 16;
        CHECK(info.extra_flops == (double)t * unit, "extra FLOPs %.17g, closed form %.17g",
              info.extra_flops, (double)t * unit);
        printf("2001 units, budget %zu: revolve %d, %d recomputed\n", o.budget, info.ckpt_arg,
               info.recomputed_units);
    }
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* `frugal plan` names each layer's fate for every unit, beyond the 4096 a
 * fixed table once held: a 5000-unit chain with every unit checkpointed
 * recomputes all units but the last, two layers each (Linear, ReLU). */
static void test_describe_many_units(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = chain(ctx, 4999, 8);
    fr_step_opts o = {.batch = 4,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_SGD),
                      .seed = 1,
                      .checkpoint = FR_CKPT_ALL};
    fr_step *s = fr_step_build(m, &o);
    CHECK(s != NULL && m->n_units == 5000, "build: %s", fr_last_error(ctx));
    FILE *f = tmpfile();
    if (s && f) {
        fr_step_describe_plan(s, f, 1);
        long len = ftell(f);
        char *txt = calloc((size_t)len + 1, 1);
        rewind(f);
        size_t got = fread(txt, 1, (size_t)len, f);
        int rec = 0, kept = 0;
        for (const char *p = txt; (p = strstr(p, "\"activations\": \"")); p++) {
            rec += strncmp(p + 16, "recomputed", 10) == 0;
            kept += strncmp(p + 16, "kept", 4) == 0;
        }
        CHECK(got == (size_t)len && rec == 2 * 4999 && kept == 1, "%d layers recomputed, %d kept",
              rec, kept);
        free(txt);
    }
    if (f) fclose(f);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

static void test_refusals(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = chain(ctx, 2, 8);
    fr_step_opts o = {
        .batch = 10, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .micro_batch = 3};
    CHECK(!fr_step_compile(m, &o) && strstr(fr_last_error(ctx), "does not divide"), "%s",
          fr_last_error(ctx));
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* Planning works on shapes: building a step (and the planner's search)
 * allocates no parameter, gradient or state byte; materializing allocates
 * and initialises them, with the values fr_model_init gives. In pure bf16
 * the weights are written in 16 bits directly: the same bits as rounding an
 * f32 initialisation (f32 -> bf16 by hand: round to nearest even on the
 * upper 16 bits), and no f32 copy of the weights is ever held. */
static uint16_t bf16_by_hand(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void test_plans_allocate_nothing(void) {
    fr_ctx *ctx = fr_ctx_new(), *rctx = fr_ctx_new();
    fr_model *m = chain(ctx, 2, 300), *ref = chain(rctx, 2, 300);
    fr_model_init(ref, 7);
    fr_step_opts o = {.batch = 16,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 7,
                      .keep_grads = 1,
                      .checkpoint = FR_CKPT_AUTO,
                      .budget = 64 << 20};
    fr_plan_need need;
    fr_step *s = fr_step_plan_choose(m, &o, &need);
    CHECK(s != NULL, "plan: %s", fr_last_error(ctx));
    if (!s) return;
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    CHECK(st.allocated_peak[FR_MEM_PARAMS] == 0 && st.allocated_peak[FR_MEM_GRADS] == 0 &&
              st.allocated_peak[FR_MEM_OPTIM] == 0 && !m->params[0].data,
          "planning allocated params %zu, grads %zu, state %zu", st.allocated_peak[FR_MEM_PARAMS],
          st.allocated_peak[FR_MEM_GRADS], st.allocated_peak[FR_MEM_OPTIM]);
    CHECK(fr_step_materialize(s) == FR_OK, "materialize: %s", fr_last_error(ctx));
    size_t bytes = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        size_t n = (size_t)fr_shape_numel(&m->params[i].shape) * 4;
        bytes += n;
        CHECK(m->params[i].data && !memcmp(m->params[i].data, ref->params[i].data, n),
              "%s: the values of fr_model_init", m->params[i].name);
    }
    fr_mem_get_stats(ctx, &st);
    CHECK(st.allocated[FR_MEM_PARAMS] == bytes, "params %zu, by hand %zu",
          st.allocated[FR_MEM_PARAMS], bytes);
    fr_step_free(s);
    fr_model_free(m);

    fr_ctx *hctx = fr_ctx_new();
    fr_model *h = chain(hctx, 2, 300);
    fr_step_opts ho = {.batch = 16,
                       .training = 1,
                       .optim = fr_optim_defaults(FR_OPTIM_SGD),
                       .seed = 7,
                       .precision = FR_PREC_BF16};
    s = fr_step_compile(h, &ho);
    CHECK(s != NULL, "bf16 compile: %s", fr_last_error(hctx));
    size_t half = 0;
    for (size_t i = 0; s && i < h->n_params; i++) {
        size_t n = (size_t)fr_shape_numel(&h->params[i].shape);
        half += n * 2;
        const uint16_t *w = h->params[i].data;
        const float *r = ref->params[i].data;
        int64_t bad = 0;
        for (size_t k = 0; k < n; k++) bad += w[k] != bf16_by_hand(r[k]);
        CHECK(h->params[i].dtype == FR_BF16 && bad == 0,
              "%s: %lld values differ from f32 rounded by hand", h->params[i].name, (long long)bad);
    }
    fr_mem_get_stats(hctx, &st);
    CHECK(st.allocated_peak[FR_MEM_PARAMS] == half, "bf16 weights: peak %zu, the 16-bit bytes %zu",
          st.allocated_peak[FR_MEM_PARAMS], half);
    fr_step_free(s);
    fr_model_free(h);
    fr_model_free(ref);
    fr_ctx_free(hctx);
    fr_ctx_free(rctx);
    fr_ctx_free(ctx);
}

/* fr_budget_plan and materializing under allocation failure at every point
 * (SQLite's way): each run either plans and materializes, or returns NULL
 * with a message; nothing leaks (ASan) and nothing is half-made. */
static void test_budget_plan_faults(void) {
    fr_budget_data d = {784, 600, 100, 0, 0, 2, 0, 0, 1, 0, 0, 0};
    int ok_runs = 0, failed_runs = 0;
    for (uint64_t k = 1; k < 100000; k++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = fr_model_new(ctx, 784, 1, 1);
        fr_model_linear(m, 32, 1);
        fr_model_relu(m);
        fr_model_linear(m, 10, 1);
        fr_step_opts o = {.batch = 16,
                          .training = 1,
                          .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                          .seed = 1,
                          .budget = 4 << 20};
        fr_budget b;
        fr_mem_fail_at(ctx, k);
        fr_step *s = fr_budget_plan(m, &o, &d, k % 2, &b);
        fr_status st = s ? fr_step_materialize(s) : FR_ERR_NOMEM;
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        fr_mem_fail_at(ctx, 0);
        int injected = ms.num_ooms > 0;
        if (!st) ok_runs++;
        else failed_runs++;
        CHECK(st == FR_OK || fr_last_error(ctx)[0], "failure %llu without a message",
              (unsigned long long)k);
        fr_step_free(s);
        fr_model_free(m);
        fr_ctx_free(ctx);
        if (!injected) break; /* the k-th allocation never came: every point was tried */
    }
    CHECK(ok_runs >= 1 && failed_runs > 10, "%d runs planned, %d failed cleanly", ok_runs,
          failed_runs);
}

/* test_frozen_saves_no_x again with the linear layers' 16-bit GEMMs off
 * (FRUGAL_GEMM16=0, read once per process: a child), so that the f32 GEMMs
 * of rounded operands are checked on a host with native bf16 too */
static void frozen_without_gemm16(const char *self) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FRUGAL_GEMM16", "0", 1);
        execl(self, self, "frozen", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "freezing with FRUGAL_GEMM16=0 (child) failed");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "frozen") == 0) {
        test_frozen_saves_no_x();
        return check_done();
    }
    test_budget_plan_faults();
    test_plans_allocate_nothing();
    test_revolve();
    test_bit_identical();
    test_accumulation();
    test_freeze();
    test_frozen_saves_no_x();
    frozen_without_gemm16(argv[0]);
    test_names_do_not_matter();
    test_budget_sweep();
    test_refusals();
    test_plan_scales();
    test_describe_many_units();
    return check_done();
}
