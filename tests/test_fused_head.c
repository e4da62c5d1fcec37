/* test_fused_head.c — a language model's head fused with its cross-entropy
 * (fr_step_opts.head_rows, --fused-head) against the unfused step, through
 * the C API, on the CPU and on the first OpenCL device when there is one:
 *   - the nanoGPT of tests/ref/gpt_small.model (V 64, lm_head tied to wte)
 *     and a wide one made here (GPT-2's V = 50257 over C = 16, an untied
 *     head with a bias), chunks of rows that do not divide B T:
 *     the first step's loss and hits, every parameter's gradient (the tied
 *     wte's two writers included) and the weights after 3 AdamW steps
 *     within 1e-6 of the unfused run's (relative: the loss by value, each
 *     tensor by 2-norm; test_linear_ce says why not element by element).
 *     Two bounds are wider, by a formula: a gradient reached through the
 *     head's dx = dz W, a sum of V terms that the fused head adds in chunks
 *     of rows (another GEMM shape, another order): sqrt(V) 2^-24 (1.3e-5 at
 *     V = 50257; measured 2.3e-6), 1e-6 at least; and AdamW runs with eps
 *     1e-4 (lr 1e-3): at PyTorch's 1e-8 its update g / (|g| + eps) turns the
 *     roundoff of a gradient that is 0 in exact arithmetic (the attention's
 *     key bias, which the softmax ignores) into a step of about lr, so any
 *     two f32 orders of the same sums part by lr in such elements (measured
 *     2.8e-4 of c_attn.bias's norm after 3 steps at lr 1e-2);
 *   - the planned step peak falls by at least the logits' B T V 4 bytes
 *     (less the fused op's 4-byte hit count, kept to the step's end as the
 *     logits were, where the peak is not the head's: gpt_small);
 *   - predicted = measured: on the CPU the activations' peak is the plan's
 *     and the host's reserved peak fr_step_reserved's, to the byte; on the
 *     device the activations' peak is the plan's and the reserved peak
 *     fr_dev_step_reserved's (test_offload's measures);
 *   - eval (no backward): loss and hits within 1e-6 / equal;
 *   - two micro-batches (the loss scale reaches LINEAR_CE_BWD through the
 *     op table's loss_bwd) against the unfused two micro-batches, and
 *     checkpointing every unit: the fused plain run's bits;
 *   - a model whose head cannot be fused (the CNN's MSE) is left as it is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/rng.h"
#include "frugal.h"
#include "train/step.h"
#ifdef FR_HAVE_OPENCL
#include "backend/opencl/backend.h"
#endif

#define STEPS 3
#define TOL 1e-6

typedef struct model_case {
    const char *name;
    int batch, T, V;
    int rows; /* the fused head's chunk (does not divide batch T) */
} model_case;

typedef struct result {
    float loss[STEPS];
    int hits;
    size_t n_params;
    float **grad, **weight; /* per parameter (trainable: gradients after step 1) */
    size_t *numel;
    char (*name)[256];
    size_t plan_peak, plan_act;
    size_t act_peak, reserved_meas, reserved_pred; /* measured, predicted */
    int logits;                                    /* the graph's logits value (-1 fused) */
    int fused_steps;                               /* parameters stepped inside backward */
} result;

static void result_free(result *r) {
    for (size_t i = 0; i < r->n_params; i++) {
        if (r->grad) free(r->grad[i]);
        if (r->weight) free(r->weight[i]);
    }
    free(r->grad), free(r->weight), free(r->numel), free(r->name);
    memset(r, 0, sizeof *r);
}

static const char *wide_model = "input tokens 8\n"
                                "embedding 50257 16 std=0.02 name=wte\n"
                                "pos_embedding 8 std=0.02 name=wpe\n"
                                "layernorm 16 name=ln_f\n"
                                "linear 50257 std=0.02 name=lm_head\n"
                                "loss cross_entropy\n";

static fr_model *load(fr_ctx *ctx, const model_case *mc) {
    char path[1100];
    const char *src = getenv("FR_SOURCE_DIR");
    if (!strcmp(mc->name, "gpt_small")) {
        snprintf(path, sizeof path, "%s/tests/ref/gpt_small.model", src ? src : "..");
        return fr_model_load(ctx, path);
    }
    snprintf(path, sizeof path, "%s/test_fused_head_wide.model",
             getenv("FR_BUILD_DIR") ? getenv("FR_BUILD_DIR") : ".");
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(wide_model, f);
    fclose(f);
    fr_model *m = fr_model_load(ctx, path);
    remove(path);
    return m;
}

/* its weights: PyTorch's (tests/ref) or fr_model_init's */
static fr_status fill(fr_model *m, const model_case *mc) {
    char path[1100];
    const char *src = getenv("FR_SOURCE_DIR");
    if (strcmp(mc->name, "gpt_small")) return fr_model_init(m, 3);
    snprintf(path, sizeof path, "%s/tests/ref/gpt_small.safetensors", src ? src : "..");
    return fr_model_load_weights(m, path);
}

typedef struct variant {
    int head_rows, micro, training;
    fr_ckpt_mode ckpt;
    int step_in_backward; /* keep_grads 0: each weight stepped as its gradient is made */
} variant;

/* STEPS AdamW steps (or one eval batch) of model mc on the device or the CPU */
static int run_case(int device, const model_case *mc, variant v, result *r) {
    memset(r, 0, sizeof *r);
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 1;
    fr_set_threads(ctx, 2);
#ifdef FR_HAVE_OPENCL
    if (device && fr_cl_use(ctx, 0)) {
        CHECK(0, "opening device 0: %s", fr_last_error(ctx));
        fr_ctx_free(ctx);
        return 1;
    }
#endif
    fr_model *m = load(ctx, mc);
    CHECK(m != NULL, "%s: model: %s", mc->name, fr_last_error(ctx));
    if (!m) {
        fr_ctx_free(ctx);
        return 1;
    }
    fr_mem_stats before; /* the model's metadata in, its weights not yet */
    fr_mem_get_stats(ctx, &before);
    if (fill(m, mc)) {
        CHECK(0, "%s: weights: %s", mc->name, fr_last_error(ctx));
        fr_model_free(m);
        fr_ctx_free(ctx);
        return 1;
    }
    fr_step_opts o = {.batch = mc->batch,
                      .training = v.training,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAMW),
                      .seed = 1,
                      .checkpoint = v.ckpt,
                      .micro_batch = v.micro,
                      .keep_grads = !v.step_in_backward,
                      .head_rows = v.head_rows};
    o.optim.lr = 1e-3;
    o.optim.eps = 1e-4;            /* see the top of the file */
    o.optim.zero_grad_to_none = 0; /* the gradients stay readable after the step */
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "%s: compile: %s", mc->name, fr_last_error(ctx));
    int32_t *idx = malloc((size_t)mc->batch * mc->T * sizeof *idx),
            *y = malloc((size_t)mc->batch * mc->T * sizeof *y);
    fr_rng g = fr_rng_make(5, (uint64_t)mc->V);
    for (int i = 0; i < mc->batch * mc->T; i++) {
        idx[i] = (int32_t)fr_rng_below(&g, (uint64_t)mc->V);
        y[i] = (int32_t)fr_rng_below(&g, (uint64_t)mc->V);
    }
    int fail = s == NULL;
    if (s) {
        r->logits = s->g.logits;
        r->plan_peak = s->plan.peak_total;
        r->plan_act = s->plan.peak[FR_MEM_ACTIVATIONS];
        r->reserved_pred = device ? fr_dev_step_reserved(s)
                                  : fr_step_reserved(s) - fr_value_bytes(&s->g.vals[s->g.input]) -
                                        fr_value_bytes(&s->g.vals[s->g.label]);
        r->n_params = m->n_params;
        r->fused_steps = s->opt.n_fused;
        r->grad = calloc(m->n_params, sizeof *r->grad);
        r->weight = calloc(m->n_params, sizeof *r->weight);
        r->numel = calloc(m->n_params, sizeof *r->numel);
        r->name = calloc(m->n_params, sizeof *r->name);
        for (size_t i = 0; i < m->n_params; i++)
            snprintf(r->name[i], sizeof r->name[i], "%s", m->params[i].name);
        fr_batch b = {.n = mc->batch, .idx = idx, .y = y};
        for (int k = 0; k < (v.training ? STEPS : 1) && !fail; k++) {
            int hits = 0;
            fail = fr_step_run(s, &b, &r->loss[k], &hits) != FR_OK;
            CHECK(!fail, "%s: step %d: %s", mc->name, k, fr_last_error(ctx));
            if (k == 0) r->hits = hits;
            for (size_t i = 0;
                 k == 0 && v.training && !v.step_in_backward && !fail && i < m->n_params; i++) {
                const fr_param *p = &m->params[i];
                const float *gp = p->trainable ? fr_grad32(m, p) : NULL;
                r->numel[i] = (size_t)fr_shape_numel(&p->shape);
                if (!gp) continue;
                r->grad[i] = malloc(r->numel[i] * sizeof(float));
                memcpy(r->grad[i], gp, r->numel[i] * sizeof(float));
            }
        }
        for (size_t i = 0; v.training && !fail && i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!p->trainable || p->dtype != FR_F32) continue;
            r->weight[i] = malloc(r->numel[i] * sizeof(float));
            memcpy(r->weight[i], p->data, r->numel[i] * sizeof(float));
        }
        fr_mem_stats hs;
        fr_mem_get_stats(ctx, &hs);
        if (device) {
            fr_mem_stats ds;
            fr_mem_stats_of(ctx->dmem, &ds);
            r->act_peak = ds.allocated_peak[FR_MEM_ACTIVATIONS];
            r->reserved_meas = ds.reserved_peak;
        } else {
            r->act_peak = hs.allocated_peak[FR_MEM_ACTIVATIONS];
            r->reserved_meas = hs.reserved_peak - before.reserved;
        }
    }
    fr_step_free(s);
    fr_model_free(m);
#ifdef FR_HAVE_OPENCL
    if (device) fr_cl_unuse(ctx);
#endif
    fr_ctx_free(ctx);
    free(idx), free(y);
    return fail;
}

/* ||a - b|| / ||b|| */
static double norm_err(const float *a, const float *b, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        e += d * d;
        m += (double)b[i] * b[i];
    }
    return m > 0 ? sqrt(e / m) : sqrt(e);
}

/* a against b: losses (the first, or all), hits, gradients, weights */
static void compare(const char *what, const result *a, const result *b, int training, int exact,
                    int V) {
    double worst_g = 0, worst_w = 0, below = fmax(TOL, sqrt((double)V) * 0x1p-24);
    for (int k = 0; k < (training ? STEPS : 1); k++)
        CHECK(exact ? a->loss[k] == b->loss[k]
                    : fabs(a->loss[k] - b->loss[k]) <= TOL * fabs(b->loss[k]),
              "%s: step %d loss %.9g, against %.9g", what, k + 1, (double)a->loss[k],
              (double)b->loss[k]);
    CHECK(a->hits == b->hits, "%s: %d hits, against %d", what, a->hits, b->hits);
    for (size_t i = 0; training && i < a->n_params && i < b->n_params; i++) {
        CHECK(!a->grad[i] == !b->grad[i], "%s: parameter %zu has a gradient in one run only", what,
              i);
        if (a->grad[i] && b->grad[i]) {
            double e = exact ? (double)(memcmp(a->grad[i], b->grad[i], a->numel[i] * 4) != 0)
                             : norm_err(a->grad[i], b->grad[i], a->numel[i]);
            const int head = !strncmp(a->name[i], "lm_head.", 8); /* its own dW, db */
            worst_g = fmax(worst_g, e);
            CHECK(e <= (exact  ? 0
                        : head ? TOL
                               : below),
                  "%s: gradient of %s off by %.3g", what, a->name[i], e);
        }
        if (a->weight[i] && b->weight[i]) {
            double e = exact ? (double)(memcmp(a->weight[i], b->weight[i], a->numel[i] * 4) != 0)
                             : norm_err(a->weight[i], b->weight[i], a->numel[i]);
            worst_w = fmax(worst_w, e);
            CHECK(e <= (exact ? 0 : TOL), "%s: %s after %d steps off by %.3g", what, a->name[i],
                  STEPS, e);
        }
    }
    printf("  %-44s loss %.9g / %.9g, hits %d, worst gradient %.2e, weight %.2e\n", what,
           (double)a->loss[0], (double)b->loss[0], a->hits, worst_g, worst_w);
}

static void check_model(int device, const model_case *mc) {
    const char *where = device ? "device" : "cpu";
    char what[128];
    result u, f;
    variant plain = {0, 0, 1, FR_CKPT_NONE, 0}, fused = {mc->rows, 0, 1, FR_CKPT_NONE, 0};
    if (run_case(device, mc, plain, &u) || run_case(device, mc, fused, &f)) {
        CHECK(0, "%s on the %s: a run failed", mc->name, where);
        result_free(&u), result_free(&f);
        return;
    }
    printf("%s on the %s (B %d, T %d, V %d, chunks of %d rows):\n", mc->name, where, mc->batch,
           mc->T, mc->V, mc->rows);
    snprintf(what, sizeof what, "%s/%s: fused vs unfused", mc->name, where);
    CHECK(u.logits >= 0 && f.logits < 0, "%s: the fused graph still makes logits", what);
    compare(what, &f, &u, 1, 0, mc->V);
    /* the logits (and, in backward, their gradient) are gone from the peak */
    const size_t logits = (size_t)mc->batch * mc->T * mc->V * 4;
    printf("  planned peak %zu -> %zu (falls by %zu; the logits are %zu bytes)\n", u.plan_peak,
           f.plan_peak, u.plan_peak - f.plan_peak, logits);
    CHECK(f.plan_peak + logits - (mc->V < 1000 ? 4 : 0) <= u.plan_peak,
          "%s: the planned peak falls by %zd, less than the logits' %zu bytes", what,
          (ssize_t)u.plan_peak - (ssize_t)f.plan_peak, logits);
    /* predicted = measured */
    for (int k = 0; k < 2; k++) {
        const result *x = k ? &f : &u;
        CHECK(x->act_peak == x->plan_act, "%s/%s%s: activations measured %zu, planned %zu",
              mc->name, where, k ? " fused" : "", x->act_peak, x->plan_act);
        CHECK(x->reserved_meas == x->reserved_pred, "%s/%s%s: reserved measured %zu, predicted %zu",
              mc->name, where, k ? " fused" : "", x->reserved_meas, x->reserved_pred);
    }
    printf("  reserved: measured %zu -> %zu, predicted %zu -> %zu\n", u.reserved_meas,
           f.reserved_meas, u.reserved_pred, f.reserved_pred);
    /* eval */
    result ue, fe;
    variant ev = {0, 0, 0, FR_CKPT_NONE, 0}, fev = {mc->rows, 0, 0, FR_CKPT_NONE, 0};
    if (!run_case(device, mc, ev, &ue) && !run_case(device, mc, fev, &fe)) {
        snprintf(what, sizeof what, "%s/%s: eval fused vs unfused", mc->name, where);
        compare(what, &fe, &ue, 0, 0, mc->V);
        CHECK(fe.reserved_meas == fe.reserved_pred, "%s: reserved measured %zu, predicted %zu",
              what, fe.reserved_meas, fe.reserved_pred);
    }
    result_free(&ue), result_free(&fe);
    /* two micro-batches: the loss scale is LINEAR_CE_BWD's too */
    result um, fm;
    variant uv = {0, mc->batch / 2, 1, FR_CKPT_NONE, 0},
            fv = {mc->rows, mc->batch / 2, 1, FR_CKPT_NONE, 0};
    if (!run_case(device, mc, uv, &um) && !run_case(device, mc, fv, &fm)) {
        snprintf(what, sizeof what, "%s/%s: 2 micro-batches fused vs unfused", mc->name, where);
        compare(what, &fm, &um, 1, 0, mc->V);
    }
    result_free(&um), result_free(&fm);
    /* checkpointing: recomputing the forward changes nothing */
    result fc;
    variant cv = {mc->rows, 0, 1, FR_CKPT_ALL, 0};
    if (!run_case(device, mc, cv, &fc)) {
        snprintf(what, sizeof what, "%s/%s: fused, checkpoint all vs none", mc->name, where);
        compare(what, &fc, &f, 1, 1, mc->V);
        CHECK(fc.act_peak == fc.plan_act && fc.reserved_meas == fc.reserved_pred,
              "%s: measured %zu / %zu, predicted %zu / %zu", what, fc.act_peak, fc.reserved_meas,
              fc.plan_act, fc.reserved_pred);
    }
    result_free(&fc);
    /* the optimizer step inside backward (no kept gradients): an untied
     * head's weight is stepped after LINEAR_CE_BWD, its only writer, as the
     * others are: the weights of keeping every gradient, bit for bit */
    result fb;
    variant bv = {mc->rows, 0, 1, FR_CKPT_NONE, 1};
    if (!run_case(device, mc, bv, &fb)) {
        snprintf(what, sizeof what, "%s/%s: fused, stepped in backward vs after", mc->name, where);
        CHECK(fb.fused_steps > 0, "%s: nothing stepped inside backward", what);
        for (size_t i = 0; i < fb.n_params; i++)
            if (fb.weight[i] && f.weight[i])
                CHECK(!memcmp(fb.weight[i], f.weight[i], fb.numel[i] * 4), "%s: %s differs", what,
                      fb.name[i]);
        CHECK(!memcmp(fb.loss, f.loss, sizeof fb.loss), "%s: the losses differ", what);
        printf("  %-44s %d tensors stepped in backward, the same bits\n", what, fb.fused_steps);
    }
    result_free(&fb);
    result_free(&u), result_free(&f);
}

/* A model whose last layer is not a Linear under cross-entropy (an MSE
 * regression): head_rows changes nothing, the logits stay. */
static void check_not_fusable(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_new(ctx, 6, 1, 1);
    fr_status st = m ? fr_model_linear(m, 4, 1) : FR_ERR_NOMEM;
    if (!st) st = fr_model_set_loss(m, FR_LOSS_MSE);
    CHECK(!st, "mse model: %s", fr_last_error(ctx));
    fr_step_opts o = {.batch = 3, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD)};
    o.head_rows = 2;
    fr_step *s = st ? NULL : fr_step_compile(m, &o);
    CHECK(s && s->g.logits >= 0 && s->g.hits < 0, "an MSE model's head fused: %s",
          s ? "logits gone" : fr_last_error(ctx));
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

int main(void) {
    static const model_case cases[] = {{"gpt_small", 3, 16, 64, 5}, {"wide", 2, 8, 50257, 5}};
    check_not_fusable();
    for (int i = 0; i < 2; i++) check_model(0, &cases[i]);
#ifdef FR_HAVE_OPENCL
    fr_ctx *probe = fr_ctx_new();
    int n = 0;
    if (probe && !fr_cl_count(probe, &n) && n > 0)
        for (int i = 0; i < 2; i++) check_model(1, &cases[i]);
    else printf("no OpenCL device: the device cases are skipped\n");
    fr_ctx_free(probe);
#endif
    return check_done();
}
