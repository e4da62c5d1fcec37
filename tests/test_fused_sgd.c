/* test_fused_sgd.c — the optimizer step inside backward (plain SGD updates a
 * Linear layer's weight and bias in LINEAR_BWD and keeps no gradient):
 *   - one step against the update computed by hand in float64 (softmax
 *     cross-entropy gradient, L2 weight decay, PyTorch's SGD formula);
 *   - several steps against the same model trained with every gradient kept
 *     (keep_grads), weights and losses bit for bit (the update is fr_k_sgd's
 *     formula on the same gradient), also at batch 2048 with a learning rate
 *     and weight decay so small that each update is a few ulps;
 *   - no gradient bytes but one tile of scratch, predicted and measured;
 *   - only where it is safe: momentum, clipping, micro-batches, a loss
 *     scaler or keep_grads turn it off; convolutions keep their gradients;
 *   - a non-finite loss stops the step before any weight moves;
 *   - momentum SGD, Adam/AdamW and Adafactor stepped by an OPTIM_STEP node
 *     right after each gradient: the bits of the step after backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "optim/optim.h"
#include "check.h"
#include "core/rng.h"
#include "backend/cpu/optim_state.h"
#include "train/step.h"

static void fill(float *v, int n, uint64_t seed) {
    fr_rng r = fr_rng_make(seed, 7);
    for (int i = 0; i < n; i++) v[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
}

static void labels(int32_t *y, int n, int classes, uint64_t seed) {
    fr_rng r = fr_rng_make(seed, 9);
    for (int i = 0; i < n; i++) y[i] = (int32_t)fr_rng_below(&r, (uint64_t)classes);
}

/* One step of Linear(D,O) + cross-entropy, checked against float64. */
/* The scratch tile of a weight (O, K) whose unbalanced tile has `rows` rows
 * (the rule in linear.c's upd_tile_rows: at least FR_UPD_TILE floats and
 * half the batch up to 512 rows, at most O), balanced over `threads`: the
 * tile count rounded up to a multiple of the threads, rows shared equally. */
static size_t tile_floats(int O, int K, int rows, int threads) {
    int tiles = (O + rows - 1) / rows;
    if (threads > 1 && O >= threads) tiles = (tiles + threads - 1) / threads * threads;
    return (size_t)((O + tiles - 1) / tiles) * (size_t)K;
}

static void test_one_step_by_hand(void) {
    enum { N = 4, D = 5, O = 3 };
    const double lr = 0.1, wd = 0.01;
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_new(ctx, D, 1, 1);
    CHECK(m && fr_model_linear(m, O, 1) == FR_OK, "model: %s", fr_last_error(ctx));
    fr_step_opts o = {
        .batch = N, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = 3};
    o.optim.lr = (float)lr;
    o.optim.weight_decay = (float)wd;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    if (!s) return;
    CHECK(s->opt.n_fused == 2, "weight and bias updated in backward: %d", s->opt.n_fused);
    float x[N * D];
    int32_t y[N] = {0, 2, 1, 2};
    fill(x, N * D, 1);
    double W[O][D], b[O];
    const float *wp = m->params[0].data, *bp = m->params[1].data;
    for (int i = 0; i < O; i++) {
        b[i] = bp[i];
        for (int k = 0; k < D; k++) W[i][k] = wp[i * D + k];
    }
    /* dz = (softmax(z) - onehot(y)) / N; gW = dz^T x; gb = sum_n dz */
    double gW[O][D] = {{0}}, gb[O] = {0}, loss = 0;
    for (int n = 0; n < N; n++) {
        double z[O], mx = -INFINITY, sum = 0;
        for (int i = 0; i < O; i++) {
            z[i] = b[i];
            for (int k = 0; k < D; k++) z[i] += W[i][k] * x[n * D + k];
            mx = z[i] > mx ? z[i] : mx;
        }
        for (int i = 0; i < O; i++) sum += exp(z[i] - mx);
        loss += (log(sum) + mx - z[y[n]]) / N;
        for (int i = 0; i < O; i++) {
            double dz = (exp(z[i] - mx) / sum - (i == y[n])) / N;
            gb[i] += dz;
            for (int k = 0; k < D; k++) gW[i][k] += dz * x[n * D + k];
        }
    }
    fr_batch batch = {N, x, y, NULL, NULL};
    float l;
    CHECK(fr_step_run(s, &batch, &l, NULL) == FR_OK, "run: %s", fr_last_error(ctx));
    CHECK(fabs(l - loss) < 1e-6, "loss %.9g, by hand %.9g", l, loss);
    double worst = 0;
    for (int i = 0; i < O; i++) {
        double want_b = b[i] - lr * (gb[i] + wd * b[i]);
        worst = fmax(worst, fabs(bp[i] - want_b));
        for (int k = 0; k < D; k++) {
            double want = W[i][k] - lr * (gW[i][k] + wd * W[i][k]);
            worst = fmax(worst, fabs(wp[i * D + k] - want));
        }
    }
    CHECK(worst < 1e-6, "updated weights vs float64: worst difference %.3g", worst);
    CHECK(fr_optim_host_grad(m, 0) == NULL && fr_optim_host_grad(m, 1) == NULL,
          "no gradient buffers");
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    /* the weight's gradient passes through a tile of rows per thread */
    size_t nt = (size_t)fr_get_threads(ctx);
    CHECK(st.allocated_peak[FR_MEM_GRADS] == tile_floats(O, D, O, (int)nt) * sizeof(float) * nt,
          "gradient bytes ever allocated: %zu, a tile of %zu floats for each of %zu threads",
          st.allocated_peak[FR_MEM_GRADS], tile_floats(O, D, O, (int)nt), nt);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

static fr_model *mlp(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 50, 1, 1);
    if (!m || fr_model_linear(m, 64, 1) || fr_model_relu(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

static fr_model *cnn(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1, 8, 8);
    if (!m || fr_model_conv2d(m, 4, 3, 1, 1, 1) || fr_model_relu(m) ||
        fr_model_maxpool2d(m, 2, 2) || fr_model_flatten(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* 512 x 300 weights: at batch 64 tiles of 54 rows (ten, balanced: 52 rows
 * on 1 thread, 43 on 3), at batch 2048 one of 512 rows (two of 256 on 2) */
static fr_model *wide(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 300, 1, 1);
    if (!m || fr_model_linear(m, 512, 1) || fr_model_relu(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* Options the next compare_opts_with_kept runs both sides with. */
static fr_ckpt_mode cmp_checkpoint;
static int cmp_ckpt_arg;
static fr_precision cmp_precision;

/* The same training with and without the update in backward: the same
 * gradients and fr_k_sgd's formula, so the same bits. */
static void compare_opts_with_kept(fr_model *(*make)(fr_ctx *), int d, int want_fused, int N,
                                   const fr_optim_opts *opt, int state_kind, const int *tile,
                                   int threads, const char *what) {
    enum { STEPS = 6 };
    float *x = malloc(sizeof(float) * (size_t)N * d);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)N);
    fill(x, N * d, 11);
    labels(y, N, 10, 12);
    float loss[2][STEPS];
    fr_ctx *ctx[2];
    fr_model *m[2];
    for (int keep = 0; keep < 2; keep++) {
        ctx[keep] = fr_ctx_new();
        fr_set_threads(ctx[keep], threads ? threads : 2); /* OpenBLAS's bits depend on it */
        m[keep] = make(ctx[keep]);
        fr_step_opts o = {.batch = N,
                          .training = 1,
                          .optim = *opt,
                          .seed = 5,
                          .keep_grads = keep,
                          .optim_state = state_kind,
                          .checkpoint = cmp_checkpoint,
                          .ckpt_arg = cmp_ckpt_arg,
                          .precision = cmp_precision};
        fr_step *s = fr_step_compile(m[keep], &o);
        CHECK(s != NULL, "%s compile: %s", what, fr_last_error(ctx[keep]));
        if (!s) return;
        CHECK(s->opt.n_fused == (keep ? 0 : want_fused), "%s keep_grads %d: %d tensors fused", what,
              keep, s->opt.n_fused);
        size_t pred[FR_MEM_CAT_COUNT], total;
        fr_step_predicted(s, pred, &total);
        int nt = fr_get_threads(ctx[keep]);
        size_t grads = keep || !tile ? 0
                                     : tile_floats(tile[0], tile[1], tile[2], nt) * sizeof(float) *
                                           (size_t)nt,
               arena = 0;
        for (size_t i = 0; i < m[keep]->n_params; i++) {
            size_t bytes = (size_t)fr_shape_numel(&m[keep]->params[i].shape) * 4;
            if (!s->opt.fused || !s->opt.fused[i]) grads += bytes;
            /* stepped by OPTIM_STEP: a layer's weight and bias gradients are
             * made by one node and live together in the arena, briefly */
            if (s->opt.fused && s->opt.fused[i] == 2) {
                size_t layer = 0;
                for (size_t j = 0; j < m[keep]->n_params; j++)
                    if (m[keep]->params[j].layer == m[keep]->params[i].layer)
                        layer += (size_t)fr_shape_numel(&m[keep]->params[j].shape) * 4;
                arena = layer > arena ? layer : arena;
            }
        }
        grads += arena;
        CHECK(pred[FR_MEM_GRADS] == grads, "%s: predicted gradients %zu, by hand %zu", what,
              pred[FR_MEM_GRADS], grads);
        for (int t = 0; t < STEPS; t++) {
            fr_batch b = {N, x, y, NULL, NULL}; /* one batch again and again: the loss must fall */
            CHECK(fr_step_run(s, &b, &loss[keep][t], NULL) == FR_OK, "%s run: %s", what,
                  fr_last_error(ctx[keep]));
        }
        fr_mem_stats st;
        fr_mem_get_stats(ctx[keep], &st);
        CHECK(st.allocated_peak[FR_MEM_GRADS] == pred[FR_MEM_GRADS],
              "%s: gradients measured %zu, predicted %zu", what, st.allocated_peak[FR_MEM_GRADS],
              pred[FR_MEM_GRADS]);
        fr_step_free(s);
    }
    for (size_t i = 0; i < m[0]->n_params; i++) {
        if (m[0]->params[i].dtype != FR_F32) continue;
        const float *a = m[0]->params[i].data, *b = m[1]->params[i].data;
        int64_t n = fr_shape_numel(&m[0]->params[i].shape), diff = 0, first = -1;
        for (int64_t k = 0; k < n; k++)
            if (memcmp(&a[k], &b[k], sizeof(float)) && diff++ == 0) first = k;
        CHECK(diff == 0,
              "%s: %s differs from the kept-gradient run in %lld of %lld values (first [%lld] "
              "%.9g vs %.9g)",
              what, m[0]->params[i].name, (long long)diff, (long long)n, (long long)first,
              first >= 0 ? a[first] : 0.0, first >= 0 ? b[first] : 0.0);
    }
    for (int t = 0; t < STEPS; t++)
        CHECK(memcmp(&loss[0][t], &loss[1][t], sizeof(float)) == 0, "%s step %d: loss %.9g vs %.9g",
              what, t, loss[0][t], loss[1][t]);
    CHECK(loss[0][STEPS - 1] < loss[0][0], "%s learns: %g -> %g", what, loss[0][0],
          loss[0][STEPS - 1]);
    for (size_t i = 0; i < m[0]->n_params; i++) /* and the optimizer state, byte for byte */
        for (int k = 0; k < 2; k++) {
            const fr_param *pa = &m[0]->params[i], *pb = &m[1]->params[i];
            void *sa = fr_state_of(m[0], pa, k), *sb = fr_state_of(m[1], pb, k);
            if (!sa || !sb) continue;
            size_t bytes = fr_optim_held_bytes(m[0], i); /* the rule's parts, in its format */
            CHECK(bytes && bytes == fr_optim_held_bytes(m[1], i) &&
                      fr_state_kind_of(m[0], pa) == fr_state_kind_of(m[1], pb) &&
                      memcmp(sa, sb, bytes) == 0,
                  "%s: %s state %d differs from the kept-gradient run", what, pa->name, k);
        }
    for (int k = 0; k < 2; k++) {
        fr_model_free(m[k]);
        fr_ctx_free(ctx[k]);
    }
    free(x);
    free(y);
}

static void compare_with_kept(fr_model *(*make)(fr_ctx *), int d, int want_fused, int N, float lr,
                              float wd, const int *tile, int threads, const char *what) {
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_SGD);
    o.lr = lr;
    o.weight_decay = wd;
    compare_opts_with_kept(make, d, want_fused, N, &o, 0, tile, threads, what);
}

/* Anything that needs the whole gradient before the update turns it off. */
static void test_only_where_safe(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = mlp(ctx);
    struct {
        const char *what;
        fr_step_opts o;
    } cases[] = {
        {"clip_grad_norm",
         {.batch = 8,
          .training = 1,
          .optim = fr_optim_defaults(FR_OPTIM_SGD),
          .clip_grad_norm = 1}},
        {"micro-batches",
         {.batch = 8, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .micro_batch = 4}},
        {"loss scaler",
         {.batch = 8,
          .training = 1,
          .optim = fr_optim_defaults(FR_OPTIM_SGD),
          .loss_scaling = FR_LOSS_SCALE_DYNAMIC}},
        {"keep_grads",
         {.batch = 8, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .keep_grads = 1}},
        {"adam, clip_grad_norm",
         {.batch = 8,
          .training = 1,
          .optim = fr_optim_defaults(FR_OPTIM_ADAM),
          .clip_grad_norm = 1}},
        {"adam, micro-batches",
         {.batch = 8, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .micro_batch = 4}},
        {"adam, loss scaler",
         {.batch = 8,
          .training = 1,
          .optim = fr_optim_defaults(FR_OPTIM_ADAM),
          .loss_scaling = FR_LOSS_SCALE_DYNAMIC}},
        {"adam, keep_grads",
         {.batch = 8, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .keep_grads = 1}},
        {"eval", {.batch = 8, .training = 0, .optim = fr_optim_defaults(FR_OPTIM_SGD)}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fr_step *s = fr_step_compile(m, &cases[c].o);
        CHECK(s != NULL, "%s: %s", cases[c].what, fr_last_error(ctx));
        if (!s) continue;
        CHECK(s->opt.n_fused == 0, "%s: %d tensors fused", cases[c].what, s->opt.n_fused);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* The loss is checked between forward and backward: nothing moves. */
static void test_nonfinite_loss(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = mlp(ctx);
    fr_step_opts o = {
        .batch = 4, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = 1};
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s && s->opt.n_fused == 4, "all four Linear tensors fused: %d", s ? s->opt.n_fused : -1);
    if (!s) return;
    float x[4 * 50];
    int32_t y[4] = {1, 2, 3, 4};
    fill(x, 4 * 50, 3);
    x[7] = INFINITY;
    size_t n0 = (size_t)fr_shape_numel(&m->params[0].shape);
    float *copy = malloc(n0 * sizeof(float));
    memcpy(copy, m->params[0].data, n0 * sizeof(float));
    fr_batch b = {4, x, y, NULL, NULL};
    float loss = 0.0f;
    int hits = -1;
    fr_status st = fr_step_run(s, &b, &loss, &hits);
    CHECK(st == FR_ERR_NUMERIC && strstr(fr_last_error(ctx), "not updated"), "status %d: %s", st,
          fr_last_error(ctx));
    CHECK(!isfinite(loss) && hits >= 0 && hits <= 4, "the loss reported: %g, hits %d", loss, hits);
    CHECK(memcmp(copy, m->params[0].data, n0 * sizeof(float)) == 0, "first weight untouched");
    free(copy);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

int main(void) {
    test_one_step_by_hand();
    compare_with_kept(mlp, 50, 4, 16, 0.05f, 1e-3f, (int[]){64, 50, 64}, 0, "mlp");
    compare_with_kept(cnn, 64, 2, 16, 0.05f, 1e-3f, (int[]){10, 64, 10}, 0,
                      "cnn (conv keeps its gradient)");
    /* A batch longer than a GEMM's block of the inner dimension, updates of a
     * few ulps and lr * wd = 1e-8 (1 - lr wd rounds to 1 in float): a GEMM
     * epilogue that adds -lr dW into W block by block, or scales W by
     * (1 - lr wd), gives other bits. */
    compare_with_kept(wide, 300, 4, 2048, 1e-5f, 1e-3f, (int[]){512, 300, 512}, 2,
                      "wide, batch 2048, lr 1e-5");
    /* the kept run has 2 threads; each tile's bits do not depend on the thread count */
    compare_with_kept(wide, 300, 4, 64, 0.05f, 0.0f, (int[]){512, 300, 54}, 1, "wide, 1 thread");
    compare_with_kept(wide, 300, 4, 64, 0.05f, 0.0f, (int[]){512, 300, 54}, 3, "wide, 3 threads");
    /* momentum SGD, Adam, AdamW, compressed Adam state: an OPTIM_STEP node per
     * parameter right after its gradient, every parameter (convolutions too) */
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_SGD);
    o.lr = 0.05f, o.momentum = 0.9f, o.weight_decay = 1e-3f;
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "momentum 0.9, weight decay");
    o.nesterov = 1, o.dampening = 0.0f;
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, nesterov");
    o = fr_optim_defaults(FR_OPTIM_ADAM);
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "adam");
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, adam");
    o.weight_decay = 1e-2f;
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "adam, L2 weight decay");
    o = fr_optim_defaults(FR_OPTIM_ADAMW);
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "adamw");
    compare_opts_with_kept(wide, 300, 4, 64, &o, FR_STATE_INT8, NULL, 0, "adamw, int8 state");
    compare_opts_with_kept(wide, 300, 4, 64, &o, FR_STATE_BF16, NULL, 0, "adamw, bf16 state");
    /* recomputed forwards in backward (revolve with one stored state, every
     * layer checkpointed) and bf16-mixed (rounded weight copies read in
     * backward before their step) */
    cmp_checkpoint = FR_CKPT_REVOLVE, cmp_ckpt_arg = 1;
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, adamw, revolve 1");
    cmp_checkpoint = FR_CKPT_ALL, cmp_ckpt_arg = 0;
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "adamw, every layer checkpointed");
    cmp_checkpoint = FR_CKPT_MARKS;
    cmp_precision = FR_PREC_BF16_MIXED;
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, adamw, bf16-mixed");
    cmp_precision = FR_PREC_FP32;
    /* Adafactor: the factored state needs the whole gradient, which an
     * OPTIM_STEP node has; a convolution's (4, 1, 3, 3) weight is factored
     * over its 3 x 3 kernel */
    o = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    compare_opts_with_kept(mlp, 50, 4, 16, &o, 0, NULL, 0, "adafactor");
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, adafactor");
    o.beta1 = 0.9, o.weight_decay = 0.01;
    compare_opts_with_kept(wide, 300, 4, 64, &o, 0, NULL, 0, "wide, adafactor, beta1, wd");
    cmp_precision = FR_PREC_BF16_MIXED;
    compare_opts_with_kept(cnn, 64, 4, 16, &o, 0, NULL, 0, "cnn, adafactor, bf16-mixed");
    cmp_precision = FR_PREC_FP32;
    test_only_where_safe();
    test_nonfinite_loss();
    return check_done();
}
