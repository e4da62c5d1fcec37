/* test_adafactor.c — --optimizer adafactor (torch.optim.Adafactor):
 *   - the CPU kernel (backend/cpu/adafactor.c) for 5 steps against
 *     tests/adafactor_ref.h, made by tests/ref/adafactor_ref.py: PyTorch
 *     2.5's _single_tensor_adafactor transcribed in float32 torch ops (the
 *     weights within 1e-5, the state within 1e-5 relative) and the same
 *     equations in float64 (within 1e-6 per step); matrices, a batched
 *     (3, 4, 5) tensor, vectors, the relative step 1/sqrt(t), weight decay,
 *     a zero gradient row, zero weights (alpha = eps2 rho), other options and
 *     Hugging Face's first moment;
 *   - its bits independent of the thread count (1, 2, 3 threads);
 *   - the state's bytes: (R + C) floats a matrix, n a vector, predicted by
 *     the step and measured, against the formula written here;
 *   - the checkpoint: optimizer.<param>.row_var (R, 1), col_var (1, C),
 *     variance (n) as torch's state_dict, and a save / load round trip that
 *     continues bit for bit;
 *   - what it refuses: --optimizer-state bf16, pure bf16 weights.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "adafactor_ref.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "optim/optim.h"
#include "run/checkpoint.h"
#include "train/step.h"

static fr_optim_opts case_opts(const adafactor_ref_case *c) {
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    o.lr = c->lr, o.beta2_decay = c->beta2_decay, o.eps = c->eps1, o.eps2 = c->eps2;
    o.clip_threshold = c->d, o.weight_decay = c->weight_decay, o.beta1 = c->beta1;
    return o;
}

static fr_shape case_shape(const adafactor_ref_case *c) {
    fr_shape s = {.ndim = c->ndim};
    for (int i = 0; i < c->ndim; i++) s.d[i] = c->shape[i];
    return s;
}

static void test_reference(void) {
    const int ncase = (int)(sizeof adafactor_ref_cases / sizeof adafactor_ref_cases[0]);
    for (int ci = 0; ci < ncase; ci++) {
        const adafactor_ref_case *c = &adafactor_ref_cases[ci];
        fr_optim_opts o = case_opts(c);
        fr_shape s = case_shape(c);
        CHECK(fr_optim_state_elems(&o, &s) == (size_t)c->ns, "%s: %zu state floats, reference %d",
              c->name, fr_optim_state_elems(&o, &s), c->ns);
        float *p = malloc(sizeof(float) * (size_t)c->n);
        float *st = calloc((size_t)c->ns, sizeof(float));
        memcpy(p, c->p0, sizeof(float) * (size_t)c->n);
        double wp32 = 0, ws32 = 0, wp64 = 0, ws64 = 0;
        for (int t = 0; t < ADAFACTOR_REF_STEPS; t++) {
            fr_k_adafactor(p, c->grads + (size_t)t * c->n, st, &s, &o, t + 1);
            const float *p32 = c->p32 + (size_t)t * c->n, *s32 = c->s32 + (size_t)t * c->ns;
            const double *p64 = c->p64 + (size_t)t * c->n, *s64 = c->s64 + (size_t)t * c->ns;
            for (int k = 0; k < c->n; k++) {
                wp32 = fmax(wp32, fabs((double)p[k] - p32[k]));
                wp64 = fmax(wp64, fabs((double)p[k] - p64[k]) / (t + 1));
            }
            /* relative, but a first moment crosses 0: below 1% of the state's
             * largest magnitude the bound is relative to that 1% */
            double big = 0;
            for (int k = 0; k < c->ns; k++) big = fmax(big, fabs(s64[k]));
            for (int k = 0; k < c->ns; k++) {
                double floor = fmax(1e-2 * big, 1e-30);
                ws32 = fmax(ws32, fabs((double)st[k] - s32[k]) / fmax(fabs(s32[k]), floor));
                ws64 = fmax(ws64, fabs((double)st[k] - s64[k]) / fmax(fabs(s64[k]), floor));
            }
        }
        CHECK(wp32 <= 1e-5, "%s (%s): weights differ from torch float32 by %.3g", c->name, c->what,
              wp32);
        CHECK(ws32 <= 1e-5, "%s (%s): state differs from torch float32 by %.3g relative", c->name,
              c->what, ws32);
        CHECK(wp64 <= 1e-6, "%s (%s): weights differ from float64 by %.3g a step", c->name, c->what,
              wp64);
        CHECK(ws64 <= 1e-5, "%s (%s): state differs from float64 by %.3g relative", c->name,
              c->what, ws64);
        printf("  %-11s weights vs f32 %.2g, vs f64 %.2g/step; state vs f32 %.2g, f64 %.2g rel\n",
               c->name, wp32, wp64, ws32, ws64);
        free(p);
        free(st);
    }
}

/* A (300, 200) matrix, a (3, 150, 100) tensor and a 70000 vector (each
 * past the kernel's threading threshold), 3 steps with 1, 2 and 3 threads:
 * the same bits. */
static void test_threads(void) {
    const fr_shape shapes[] = {fr_shape2(300, 200), fr_shape3(3, 150, 100), fr_shape1(70000)};
    const int saved = omp_get_max_threads();
    for (int si = 0; si < 3; si++) {
        const fr_shape *s = &shapes[si];
        fr_optim_opts o = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
        o.beta1 = si == 1 ? 0.9 : 0.0, o.weight_decay = 0.01;
        size_t n = (size_t)fr_shape_numel(s), ns = fr_optim_state_elems(&o, s);
        float *p[3], *st[3], *g = malloc(n * sizeof(float));
        fr_rng r = fr_rng_make(42, (uint64_t)si);
        for (size_t k = 0; k < n; k++) g[k] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
        for (int th = 0; th < 3; th++) {
            omp_set_num_threads(th + 1);
            p[th] = malloc(n * sizeof(float));
            st[th] = calloc(ns, sizeof(float));
            for (size_t k = 0; k < n; k++) p[th][k] = (float)k / (float)n - 0.5f;
            for (int t = 1; t <= 3; t++) fr_k_adafactor(p[th], g, st[th], s, &o, t);
        }
        for (int th = 1; th < 3; th++)
            CHECK(!memcmp(p[0], p[th], n * 4) && !memcmp(st[0], st[th], ns * 4),
                  "shape %d: %d threads differ from 1", si, th + 1);
        for (int th = 0; th < 3; th++) free(p[th]), free(st[th]);
        free(g);
    }
    omp_set_num_threads(saved);
}

static void fill(float *v, int n, uint64_t seed) {
    fr_rng r = fr_rng_make(seed, 7);
    for (int i = 0; i < n; i++) v[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
}

/* Linear(50, 64) + ReLU + Linear(64, 10): weights (64, 50), (10, 64). */
static fr_model *mlp(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 50, 1, 1);
    if (!m || fr_model_linear(m, 64, 1) || fr_model_relu(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

enum { N = 16, D = 50 };
static float X[N * D];
static int32_t Y[N];

static fr_step *compile(fr_ctx *ctx, fr_model *m, double beta1) {
    fr_step_opts o = {
        .batch = N, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAFACTOR), .seed = 5};
    o.optim.beta1 = beta1;
    o.keep_grads = 1;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    return s;
}

static void run(fr_step *s, int steps, float *loss) {
    for (int t = 0; t < steps; t++) {
        fr_batch b = {N, X, Y, NULL, NULL};
        CHECK(fr_step_run(s, &b, &loss[t], NULL) == FR_OK, "run: %s", fr_last_error(s->ctx));
    }
}

/* The state bytes, predicted and measured, against (R + C) a matrix and n a
 * vector: (64 + 50) + 64 + (10 + 64) + 10 = 262 floats; with beta1 the
 * weights' 3914 values more. */
static void test_bytes_and_checkpoint(void) {
    fill(X, N * D, 11);
    for (int i = 0; i < N; i++) Y[i] = (i * 7) % 10;
    for (int with_b1 = 0; with_b1 < 2; with_b1++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = mlp(ctx);
        fr_step *s = compile(ctx, m, with_b1 ? 0.9 : 0.0);
        if (!s) return;
        size_t want = (size_t)((64 + 50) + 64 + (10 + 64) + 10) * 4;
        if (with_b1) want += (size_t)(64 * 50 + 64 + 10 * 64 + 10) * 4;
        size_t pred[FR_MEM_CAT_COUNT], total;
        fr_step_predicted(s, pred, &total);
        CHECK(pred[FR_MEM_OPTIM] == want, "beta1 %d: predicted state %zu bytes, formula %zu",
              with_b1, pred[FR_MEM_OPTIM], want);
        float loss[8];
        run(s, 4, loss);
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        CHECK(ms.allocated_peak[FR_MEM_OPTIM] == want, "beta1 %d: measured state %zu, formula %zu",
              with_b1, ms.allocated_peak[FR_MEM_OPTIM], want);
        CHECK(ms.allocated_peak[FR_MEM_OPTIM] + ms.allocated_peak[FR_MEM_GRADS] +
                      ms.allocated_peak[FR_MEM_PARAMS] <=
                  total,
              "beta1 %d: measured within the predicted peak", with_b1);
        CHECK(loss[3] < loss[0], "beta1 %d: the loss falls %g -> %g", with_b1, loss[0], loss[3]);
        /* the checkpoint's names and shapes, as torch's state_dict */
        char path[] = "/tmp/frugal_adafactor_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0, "temp file");
        close(fd);
        CHECK(fr_ckpt_save(s, path, NULL, 0, 0) == FR_OK, "save: %s", fr_last_error(ctx));
        fr_st_file f;
        CHECK(fr_st_read(ctx, path, &f, FR_MEM_OTHER) == FR_OK, "read: %s", fr_last_error(ctx));
        static const struct {
            const char *name;
            int ndim;
            int64_t d0, d1;
        } want_e[] = {
            {"optimizer.0.weight.row_var", 2, 64, 1}, {"optimizer.0.weight.col_var", 2, 1, 50},
            {"optimizer.0.bias.variance", 1, 64, 0},  {"optimizer.2.weight.row_var", 2, 10, 1},
            {"optimizer.2.weight.col_var", 2, 1, 64}, {"optimizer.2.bias.variance", 1, 10, 0}};
        int n_opt = 0;
        for (int i = 0; i < f.n; i++) n_opt += !strncmp(f.entries[i].name, "optimizer.", 10);
        CHECK(n_opt == 6 + 4 * with_b1, "beta1 %d: %d optimizer entries", with_b1, n_opt);
        for (size_t k = 0; k < sizeof want_e / sizeof want_e[0]; k++) {
            const fr_st_entry *e = fr_st_find(&f, want_e[k].name);
            CHECK(e && e->dtype == FR_F32 && e->shape.ndim == want_e[k].ndim &&
                      e->shape.d[0] == want_e[k].d0 &&
                      (e->shape.ndim < 2 || e->shape.d[1] == want_e[k].d1),
                  "%s: missing or of another shape", want_e[k].name);
        }
        if (with_b1) {
            const fr_st_entry *e = fr_st_find(&f, "optimizer.0.weight.exp_avg");
            CHECK(e && e->shape.ndim == 2 && e->shape.d[0] == 64 && e->shape.d[1] == 50,
                  "exp_avg (64, 50)");
        }
        /* row_var's values are the state's first floats */
        const fr_st_entry *e = fr_st_find(&f, "optimizer.0.weight.row_var");
        float rv[64];
        if (e && fr_st_load(ctx, &f, e, rv) == FR_OK)
            CHECK(!memcmp(rv, fr_state_of(m, &m->params[0], 0), sizeof rv),
                  "row_var saved as held");
        const char *opt = fr_st_meta_get(&f, "optimizer"), *d = fr_st_meta_get(&f, "eps2");
        CHECK(opt && !strcmp(opt, "adafactor") && d, "metadata optimizer %s, eps2 %s",
              opt ? opt : "-", d ? d : "-");
        fr_st_close(ctx, &f);
        /* load into a fresh model and step: the same bits as going on */
        fr_ctx *ctx2 = fr_ctx_new();
        fr_model *m2 = mlp(ctx2);
        fr_step *s2 = compile(ctx2, m2, with_b1 ? 0.9 : 0.0);
        float l1[2], l2[2];
        if (s2) {
            CHECK(fr_load(s2, path) == FR_OK, "load: %s", fr_last_error(ctx2));
            run(s, 2, l1);
            run(s2, 2, l2);
            CHECK(!memcmp(l1, l2, sizeof l1), "loaded: losses %.9g %.9g vs %.9g %.9g", l1[0], l1[1],
                  l2[0], l2[1]);
            for (size_t i = 0; i < m->n_params; i++) {
                size_t nb = (size_t)fr_shape_numel(&m->params[i].shape) * 4;
                CHECK(!memcmp(m->params[i].data, m2->params[i].data, nb) &&
                          fr_optim_held_bytes(m, i) == fr_optim_held_bytes(m2, i) &&
                          !memcmp(fr_state_of(m, &m->params[i], 0),
                                  fr_state_of(m2, &m2->params[i], 0), fr_optim_held_bytes(m, i)),
                      "loaded: %s and its state bit for bit", m->params[i].name);
            }
            fr_step_free(s2);
        }
        fr_model_free(m2);
        fr_ctx_free(ctx2);
        unlink(path);
        fr_step_free(s);
        fr_model_free(m);
        fr_ctx_free(ctx);
    }
}

/* Refused when the step is built, naming the option. */
static void test_refusals(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = mlp(ctx);
    fr_step_opts o = {.batch = 8, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAFACTOR)};
    o.optim_state = FR_OPTIM_STATE_BF16;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(!s && strstr(fr_last_error(ctx), "--optimizer-state bf16"), "bf16 state: %s",
          fr_last_error(ctx));
    fr_step_free(s);
    o.optim_state = FR_OPTIM_STATE_FP32, o.precision = FR_PREC_BF16;
    s = fr_step_compile(m, &o);
    CHECK(!s && strstr(fr_last_error(ctx), "--precision bf16"), "bf16 weights: %s",
          fr_last_error(ctx));
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

int main(void) {
    test_reference();
    test_threads();
    test_bytes_and_checkpoint();
    test_refusals();
    return check_done();
}
