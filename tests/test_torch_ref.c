/* test_torch_ref.c — whole training steps against PyTorch.
 *
 * tests/ref/make_torch_ref.py builds the same models in torch.nn.Sequential
 * (same state_dict names), initialises them with PyTorch's own init and dumps
 * one batch and what PyTorch computes on it (float32, CPU, foreach=False
 * optimizers). The models: "cnn" conv2d(4, k3, p1, no bias) batchnorm relu
 * maxpool2d(2) flatten linear(10), batch 8 (no conv bias: straight before a
 * training-mode BatchNorm its gradient is exactly zero, so both sides would
 * compare rounding noise, which Adam turns into lr-sized steps); "cnn_bias"
 * conv2d(4, k3, p1, bias) relu avgpool2d(2) flatten linear(10), batch 8;
 * "mlp" linear(16) tanh linear(16) gelu linear(5), batch 6, cross-entropy;
 * "mlp_mse" the same with MSE against float targets.
 * This test builds each model with the C API, loads PyTorch's initial
 * weights with fr_model_load_weights and checks, for each model:
 *   - the train-mode logits and the mean loss of the forward;
 *   - every parameter gradient after backward (the grad buffers, kept with
 *     zero_grad_to_none = 0: after the step they still hold the last one);
 *   - the weights after one SGD(lr 0.1, momentum 0.9, wd 1e-4), one
 *     Adam(lr 1e-3) and one AdamW(lr 1e-3, wd 1e-2) step, and SGD's momentum
 *     buffer;
 *   - BatchNorm's running statistics and num_batches_tracked after the step;
 *   - the eval-mode logits and loss (model.eval()) after the SGD step;
 *   - every state_dict entry, the losses and Adam's moments over three Adam
 *     steps on the same batch (bias correction, moment accumulation);
 *   - fr_save's file: the same names, dtypes and shapes as PyTorch's
 *     state_dict (num_batches_tracked an I64 scalar), the optimizer state
 *     under "optimizer.<param>.<state>" equal to torch.optim's, and the step.
 * Tolerances: a value passes when |got - want| <= RTOL |want| + ATOL max|want|
 * (the max over the whole tensor), RTOL = ATOL = 1e-5 for everything (the
 * loss: relative 1e-5); num_batches_tracked exactly. The updates a step made
 * (weight after minus initial weight) are also compared on their own scale:
 * within UTOL = 1e-4 of the largest update plus 2 ulp of the new weight.
 * The largest error seen in each kind of quantity is printed at the end.
 * Needs tests/ref/ (found through FR_SOURCE_DIR, default "."); no torch.
 * FR_TEST_VERBOSE=1 prints the worst element of every compared tensor.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "optim/optim.h"
#include "check.h"
#include "core/ctx.h"
#include "model/model.h"
#include "train/step.h"

#define RTOL 1e-5
#define ATOL 1e-5
#define UTOL 1e-4

static const char *src_dir;
static int verbose; /* FR_TEST_VERBOSE: a line per compared tensor */
static char tmp_path[512];

/* Per kind of quantity: the largest error seen, and the largest fraction of
 * its tolerance used (with the tensor that used it). */
enum { Q_LOGITS, Q_LOSS, Q_GRAD, Q_WEIGHT, Q_UPDATE, Q_STATE, Q_BN, Q_COUNT };
static const char *q_name[Q_COUNT] = {"logits",  "loss",        "grads",   "weights",
                                      "updates", "optim state", "bn stats"};
static double q_worst_abs[Q_COUNT], q_worst_frac[Q_COUNT];
static char q_worst_at[Q_COUNT][FR_ST_NAME_MAX + 48];

static void note(int q, const char *model, const char *name, double d, double tol) {
    q_worst_abs[q] = fmax(q_worst_abs[q], d);
    if (tol > 0 && d / tol > q_worst_frac[q]) {
        q_worst_frac[q] = d / tol;
        snprintf(q_worst_at[q], sizeof q_worst_at[q], "%s %s", model, name);
    }
}

typedef struct ref {
    const char *name;
    fr_loss loss;
    int batch, classes;
    fr_st_file init, io; /* PyTorch's initial state_dict; batch and results */
} ref;

/* The frugal model equal to make_torch_ref.py's nn.Sequential of that name. */
static fr_model *build(fr_ctx *ctx, const char *name) {
    fr_model *m;
    fr_status st = FR_OK;
    if (strcmp(name, "cnn") == 0) { /* no conv bias: see make_torch_ref.py */
        m = fr_model_new(ctx, 1, 12, 12);
        if (!m) return NULL;
        if (!st) st = fr_model_conv2d(m, 4, 3, 1, 1, 0);
        if (!st) st = fr_model_batchnorm(m);
        if (!st) st = fr_model_relu(m);
        if (!st) st = fr_model_maxpool2d(m, 2, 2);
        if (!st) st = fr_model_flatten(m);
        if (!st) st = fr_model_linear(m, 10, 1);
    } else if (strcmp(name, "cnn_bias") == 0) {
        m = fr_model_new(ctx, 1, 12, 12);
        if (!m) return NULL;
        if (!st) st = fr_model_conv2d(m, 4, 3, 1, 1, 1);
        if (!st) st = fr_model_relu(m);
        if (!st) st = fr_model_avgpool2d(m, 2, 2);
        if (!st) st = fr_model_flatten(m);
        if (!st) st = fr_model_linear(m, 10, 1);
    } else {
        m = fr_model_new(ctx, 20, 1, 1);
        if (!m) return NULL;
        if (!st) st = fr_model_linear(m, 16, 1);
        if (!st) st = fr_model_tanh(m);
        if (!st) st = fr_model_linear(m, 16, 1);
        if (!st) st = fr_model_gelu(m);
        if (!st) st = fr_model_linear(m, 5, 1);
        if (!st && strcmp(name, "mlp_mse") == 0) st = fr_model_set_loss(m, FR_LOSS_MSE);
    }
    if (st) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* A reference tensor that must exist, be F32 and hold n elements. */
static const float *want_f32(const ref *r, const char *name, int64_t n) {
    const fr_st_entry *e = fr_st_find(&r->io, name);
    CHECK(e != NULL, "%s: reference '%s' missing", r->name, name);
    if (!e) return NULL;
    CHECK(e->dtype == FR_F32 && fr_shape_numel(&e->shape) == n,
          "%s: reference '%s' is %s with %lld elements, expected F32 with %lld", r->name, name,
          fr_dtype_name(e->dtype), (long long)fr_shape_numel(&e->shape), (long long)n);
    if (e->dtype != FR_F32 || fr_shape_numel(&e->shape) != n) return NULL;
    return e->data;
}

/* got[0..n) against k times reference `name`, tolerance as in the header
 * comment. */
static void compare_scaled(const ref *r, int q, const char *what, const char *name,
                           const float *got, int64_t n, double k) {
    const float *want = want_f32(r, name, n);
    if (!want) return;
    CHECK(got != NULL, "%s: %s: no values to compare with '%s'", r->name, what, name);
    if (!got) return;
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(k * want[i]));
    int64_t bad = -1, worst = 0;
    double worst_frac = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - k * want[i]);
        double tol = RTOL * fabs(k * want[i]) + ATOL * scale;
        if (!(d <= tol) && bad < 0) bad = i;
        if (tol > 0 && d / tol > worst_frac) worst_frac = d / tol, worst = i;
        note(q, r->name, name, d, tol);
    }
    if (verbose)
        printf("%s %-36s %6lld values, worst [%lld] %.9g vs %.9g: %.3g of the tolerance\n", r->name,
               name, (long long)n, (long long)worst, got[worst], k * want[worst], worst_frac);
    CHECK(bad < 0, "%s: %s '%s'[%lld] is %.9g, PyTorch %.9g (tensor max |x| %.3g)", r->name, what,
          name, (long long)bad, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : k * want[bad], scale);
}

static void compare(const ref *r, int q, const char *what, const char *name, const float *got,
                    int64_t n) {
    compare_scaled(r, q, what, name, got, n, 1.0);
}

/* The update a step made, got - w0, against PyTorch's, want - w0 (w0: the
 * initial weight): |got - want| <= UTOL max|want - w0| + 2 ulp(want). The
 * weights themselves are compared relative to the weights, which an update
 * of lr = 1e-3 hardly moves; this compares the updates relative to their own
 * size, up to the float rounding of the new weight (the ulp term). */
static void compare_update(const ref *r, const char *what, const char *name, const char *w0_name,
                           const float *got, int64_t n) {
    const float *want = want_f32(r, name, n);
    const fr_st_entry *e = fr_st_find(&r->init, w0_name);
    CHECK(e && e->dtype == FR_F32 && fr_shape_numel(&e->shape) == n,
          "%s: initial '%s' missing or malformed", r->name, w0_name);
    if (!want || !got || !e || e->dtype != FR_F32 || fr_shape_numel(&e->shape) != n) return;
    const float *w0 = e->data;
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i] - w0[i]));
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double ulp = (double)nextafterf(fabsf(want[i]), INFINITY) - fabsf(want[i]);
        double tol = UTOL * scale + 2.0 * ulp;
        if (!(d <= tol) && bad < 0) bad = i;
        note(Q_UPDATE, r->name, name, d, tol);
    }
    CHECK(bad < 0, "%s: %s '%s'[%lld]: update %.9g, PyTorch's %.9g (largest update %.3g)", r->name,
          what, name, (long long)bad, bad < 0 ? 0.0 : (double)got[bad] - w0[bad],
          bad < 0 ? 0.0 : (double)want[bad] - w0[bad], scale);
}

static void compare_loss(const ref *r, const char *what, float got, float want) {
    double d = fabs((double)got - want);
    note(Q_LOSS, r->name, what, d, 1e-5 * fabs(want));
    CHECK(d <= 1e-5 * fabs(want), "%s: %s loss %.9g, PyTorch %.9g", r->name, what, got, want);
}

/* The whole file in memory (fr_st_parse over a buffer the file then owns):
 * the comparisons below read the reference tensors in place. */
static fr_status read_whole(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat) {
    FILE *fp = fopen(path, "rb");
    memset(out, 0, sizeof *out);
    if (!fp) return fr_fail(ctx, FR_ERR_IO, "%s: cannot open", path);
    long len = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    void *buf = len >= 0 ? fr_alloc(ctx, (size_t)len + 1, cat) : NULL;
    int ok = buf && fseek(fp, 0, SEEK_SET) == 0 && fread(buf, 1, (size_t)len, fp) == (size_t)len;
    fclose(fp);
    fr_status st = ok ? fr_st_parse(ctx, path, buf, (size_t)len, out)
                      : fr_fail(ctx, FR_ERR_IO, "%s: cannot read", path);
    if (st) fr_free(ctx, buf);
    else out->blob = buf;
    return st;
}

static fr_status open_ref(fr_ctx *ctx, ref *r, const char *name) {
    char path[600];
    memset(r, 0, sizeof *r);
    r->name = name;
    snprintf(path, sizeof path, "%s/tests/ref/%s.safetensors", src_dir, name);
    fr_status st = read_whole(ctx, path, &r->init, FR_MEM_OTHER);
    if (st) return st;
    snprintf(path, sizeof path, "%s/tests/ref/%s_io.safetensors", src_dir, name);
    if ((st = read_whole(ctx, path, &r->io, FR_MEM_DATA))) {
        fr_st_close(ctx, &r->init);
        return st;
    }
    const char *loss = fr_st_meta_get(&r->io, "loss"), *batch = fr_st_meta_get(&r->io, "batch");
    r->loss = loss && strcmp(loss, "mse") == 0 ? FR_LOSS_MSE : FR_LOSS_CROSS_ENTROPY;
    r->batch = batch ? atoi(batch) : 0;
    const fr_st_entry *z = fr_st_find(&r->io, "train.logits");
    r->classes = z && z->shape.ndim == 2 ? (int)z->shape.d[1] : 0;
    return FR_OK;
}

static void close_ref(fr_ctx *ctx, ref *r) {
    fr_st_close(ctx, &r->init);
    fr_st_close(ctx, &r->io);
}

/* The batch of the reference, or n = 0 when it is malformed. */
static fr_batch ref_batch(const ref *r) {
    fr_batch b = {0};
    const fr_st_entry *x = fr_st_find(&r->io, "x");
    const fr_st_entry *y = fr_st_find(&r->io, r->loss == FR_LOSS_MSE ? "target" : "y");
    int ok =
        x && y && x->dtype == FR_F32 && x->shape.d[0] == r->batch &&
        y->dtype == (r->loss == FR_LOSS_MSE ? FR_F32 : FR_I32) &&
        fr_shape_numel(&y->shape) == (int64_t)r->batch * (r->loss == FR_LOSS_MSE ? r->classes : 1);
    CHECK(ok, "%s: the reference batch (x, %s) is missing or malformed", r->name,
          r->loss == FR_LOSS_MSE ? "target" : "y");
    if (!ok) return b;
    b.n = r->batch;
    b.x = x->data;
    if (r->loss == FR_LOSS_MSE) b.target = y->data;
    else b.y = y->data;
    return b;
}

static fr_optim_opts ref_optim(fr_optim_kind kind) {
    fr_optim_opts o = fr_optim_defaults(kind);
    if (kind == FR_OPTIM_SGD) {
        o.lr = 0.1, o.momentum = 0.9, o.weight_decay = 1e-4; /* PyTorch's Python floats */
    } else {
        o.lr = 1e-3;
        o.weight_decay = kind == FR_OPTIM_ADAMW ? 1e-2f : 0.0f;
    }
    o.zero_grad_to_none = 0; /* keep the grad buffers to compare them */
    return o;
}

/* A fresh model with PyTorch's initial weights and a compiled step. */
static fr_step *setup(fr_ctx *ctx, const ref *r, fr_optim_kind kind, int training) {
    fr_model *m = build(ctx, r->name);
    CHECK(m != NULL, "%s: build: %s", r->name, fr_last_error(ctx));
    if (!m) return NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/tests/ref/%s.safetensors", src_dir, r->name);
    fr_status st = fr_model_load_weights(m, path);
    CHECK(st == FR_OK, "%s: fr_model_load_weights: %s", r->name, fr_last_error(ctx));
    CHECK(fr_model_num_classes(m) == r->classes, "%s: %d classes, PyTorch %d", r->name,
          fr_model_num_classes(m), r->classes);
    fr_step_opts so = {.batch = r->batch,
                       .training = training,
                       .optim = ref_optim(kind),
                       .seed = 1,
                       .keep_grads = 1}; /* gradients are compared */
    fr_step *s = st ? NULL : fr_step_compile(m, &so);
    CHECK(s != NULL, "%s: fr_step_compile: %s", r->name, fr_last_error(ctx));
    if (!s) fr_model_free(m);
    return s;
}

static void teardown(fr_step *s) {
    if (!s) return;
    fr_model *m = s->m;
    fr_step_free(s);
    fr_model_free(m);
}

static const float *logits_of(const fr_step *s) { return s->ex.ptr[s->g.logits]; }

static int64_t numel(const fr_param *p) { return fr_shape_numel(&p->shape); }

/* BatchNorm buffers against prefix + name: running stats within tolerance,
 * num_batches_tracked exactly `steps`. */
static void compare_buffers(const ref *r, const fr_model *m, const char *prefix, int64_t steps) {
    char nm[FR_ST_NAME_MAX + 32];
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        snprintf(nm, sizeof nm, "%s%s", prefix, p->name);
        if (p->role == FR_P_NUM_BATCHES) {
            const fr_st_entry *e = fr_st_find(&r->io, nm);
            int64_t want = -1;
            if (e && e->dtype == FR_I64 && e->nbytes == 8) memcpy(&want, e->data, 8);
            CHECK(want == steps, "%s: reference '%s' is %lld, expected %lld", r->name, nm,
                  (long long)want, (long long)steps);
            CHECK(*(const int64_t *)p->data == want, "%s: %s is %lld, PyTorch %lld", r->name,
                  p->name, (long long)*(const int64_t *)p->data, (long long)want);
        } else if (!p->trainable) {
            compare(r, Q_BN, "running stat", nm, p->data, numel(p));
        }
    }
}

/* Read back fr_save's file: its non-optimizer entries are PyTorch's
 * state_dict (names, dtypes, shapes), num_batches_tracked an I64 scalar
 * holding `steps`; "optimizer.<param>.<state>" equals the reference
 * "<prefix><state>.<param>"; the metadata's optimizer.step is `steps`. */
static void check_saved(fr_ctx *ctx, const ref *r, fr_step *s, const char *prefix, int64_t steps) {
    static const char *states[3][2] = {
        {"momentum_buffer", NULL}, {"exp_avg", "exp_avg_sq"}, {"exp_avg", "exp_avg_sq"}};
    fr_status st = fr_save(s, tmp_path);
    CHECK(st == FR_OK, "%s: fr_save: %s", r->name, fr_last_error(ctx));
    if (st) return;
    fr_st_file f;
    st = read_whole(ctx, tmp_path, &f, FR_MEM_OTHER);
    CHECK(st == FR_OK, "%s: reading fr_save's file: %s", r->name, fr_last_error(ctx));
    if (st) return;
    int n_weights = 0;
    for (int i = 0; i < f.n; i++) {
        const fr_st_entry *e = &f.entries[i];
        if (strncmp(e->name, "optimizer.", 10) == 0) continue;
        n_weights++;
        const fr_st_entry *w = fr_st_find(&r->init, e->name);
        CHECK(w != NULL, "%s: saved '%s' is not in PyTorch's state_dict", r->name, e->name);
        if (!w) continue;
        int same = e->dtype == w->dtype && e->shape.ndim == w->shape.ndim;
        for (int d = 0; same && d < e->shape.ndim; d++) same = e->shape.d[d] == w->shape.d[d];
        char a[64], b[64];
        CHECK(same, "%s: saved '%s' is %s %s, PyTorch's %s %s", r->name, e->name,
              fr_dtype_name(e->dtype), fr_shape_str(&e->shape, a, sizeof a),
              fr_dtype_name(w->dtype), fr_shape_str(&w->shape, b, sizeof b));
        if (strstr(e->name, "num_batches_tracked")) {
            int64_t v = -1;
            if (e->dtype == FR_I64 && e->shape.ndim == 0 && e->nbytes == 8) memcpy(&v, e->data, 8);
            CHECK(v == steps, "%s: saved %s is %lld, expected an I64 scalar %lld", r->name, e->name,
                  (long long)v, (long long)steps);
        }
    }
    CHECK(n_weights == r->init.n, "%s: saved %d state_dict entries, PyTorch has %d", r->name,
          n_weights, r->init.n);
    const fr_model *m = s->m;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!p->trainable) continue;
        for (int k = 0; k < 2; k++) {
            const char *sn = states[s->o.optim.kind][k];
            if (!sn) continue;
            char nm[FR_ST_NAME_MAX + 32], want[FR_ST_NAME_MAX + 32];
            snprintf(nm, sizeof nm, "optimizer.%s.%s", p->name, sn);
            snprintf(want, sizeof want, "%s%s.%s", prefix, sn, p->name);
            const fr_st_entry *e = fr_st_find(&f, nm);
            CHECK(e && e->dtype == FR_F32 && fr_shape_numel(&e->shape) == numel(p),
                  "%s: saved '%s' missing or malformed", r->name, nm);
            if (e && e->dtype == FR_F32 && fr_shape_numel(&e->shape) == numel(p))
                compare_scaled(r, Q_STATE, "saved optimizer state", want, e->data, numel(p), 1.0);
        }
    }
    const char *t = fr_st_meta_get(&f, "optimizer.step");
    CHECK(t && atoll(t) == steps, "%s: saved optimizer.step is %s, expected %lld", r->name,
          t ? t : "(none)", (long long)steps);
    fr_st_close(ctx, &f);
    remove(tmp_path);
}

/* One step with each optimizer: forward, gradients, update, BN stats; after
 * SGD also fr_save's file and the eval forward. */
static void test_one_step(fr_ctx *ctx, const ref *r, fr_optim_kind kind) {
    static const char *prefix[] = {"sgd.", "adam.", "adamw."};
    static const char *label[] = {"SGD", "Adam", "AdamW"};
    fr_batch b = ref_batch(r);
    if (!b.n) return;
    fr_step *s = setup(ctx, r, kind, 1);
    if (!s) return;
    fr_model *m = s->m;
    float loss = NAN;
    fr_status st = fr_step_run(s, &b, &loss, NULL);
    CHECK(st == FR_OK, "%s: %s step: %s", r->name, label[kind], fr_last_error(ctx));
    if (st) goto done;
    const float *want_loss = want_f32(r, "train.loss", 1);
    if (want_loss) compare_loss(r, "train", loss, *want_loss);
    compare(r, Q_LOGITS, "train logits", "train.logits", logits_of(s),
            (int64_t)r->batch * r->classes);

    char nm[FR_ST_NAME_MAX + 32], what[64];
    snprintf(what, sizeof what, "weight after one %s step", label[kind]);
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!p->trainable) continue;
        snprintf(nm, sizeof nm, "grad.%s", p->name);
        compare(r, Q_GRAD, "gradient", nm, fr_grad32(m, p), numel(p));
        snprintf(nm, sizeof nm, "%s%s", prefix[kind], p->name);
        compare(r, Q_WEIGHT, what, nm, p->data, numel(p));
        compare_update(r, what, nm, p->name, p->data, numel(p));
        if (kind == FR_OPTIM_SGD) {
            snprintf(nm, sizeof nm, "sgd.momentum_buffer.%s", p->name);
            compare(r, Q_STATE, "SGD momentum buffer", nm, fr_state_of(m, p, 0), numel(p));
        }
    }
    compare_buffers(r, m, "step1.", 1);
    if (kind != FR_OPTIM_SGD) goto done;

    check_saved(ctx, r, s, "sgd.", 1);

    /* model.eval() forward with the weights and running stats of the step */
    fr_step_opts eo = {.batch = r->batch, .training = 0, .optim = ref_optim(kind), .seed = 1};
    fr_step *e = fr_step_compile(m, &eo);
    CHECK(e != NULL, "%s: eval compile: %s", r->name, fr_last_error(ctx));
    if (!e) goto done;
    st = fr_step_run(e, &b, &loss, NULL);
    CHECK(st == FR_OK, "%s: eval step: %s", r->name, fr_last_error(ctx));
    if (!st) {
        if ((want_loss = want_f32(r, "eval.loss", 1))) compare_loss(r, "eval", loss, *want_loss);
        compare(r, Q_LOGITS, "eval logits", "eval.logits", logits_of(e),
                (int64_t)r->batch * r->classes);
        compare_buffers(r, m, "step1.", 1); /* eval leaves the running stats alone */
    }
    fr_step_free(e);
done:
    teardown(s);
}

/* Three Adam steps on the same batch: each loss, every state_dict entry and
 * the moments after the third. */
static void test_adam_three_steps(fr_ctx *ctx, const ref *r) {
    fr_batch b = ref_batch(r);
    if (!b.n) return;
    fr_step *s = setup(ctx, r, FR_OPTIM_ADAM, 1);
    if (!s) return;
    fr_model *m = s->m;
    const float *want_loss = want_f32(r, "adam3.loss", 3);
    for (int t = 0; t < 3; t++) {
        float loss = NAN;
        fr_status st = fr_step_run(s, &b, &loss, NULL);
        CHECK(st == FR_OK, "%s: Adam step %d: %s", r->name, t + 1, fr_last_error(ctx));
        if (st) goto done;
        char what[32];
        snprintf(what, sizeof what, "Adam step %d", t + 1);
        if (want_loss) compare_loss(r, what, loss, want_loss[t]);
    }
    char nm[FR_ST_NAME_MAX + 32];
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!p->trainable) continue;
        snprintf(nm, sizeof nm, "adam3.%s", p->name);
        compare(r, Q_WEIGHT, "weight after three Adam steps", nm, p->data, numel(p));
        compare_update(r, "weight after three Adam steps", nm, p->name, p->data, numel(p));
        snprintf(nm, sizeof nm, "adam3.exp_avg.%s", p->name);
        compare(r, Q_STATE, "Adam exp_avg after three steps", nm, fr_state_of(m, p, 0), numel(p));
        snprintf(nm, sizeof nm, "adam3.exp_avg_sq.%s", p->name);
        compare(r, Q_STATE, "Adam exp_avg_sq after three steps", nm, fr_state_of(m, p, 1),
                numel(p));
    }
    compare_buffers(r, m, "adam3.", 3);
    check_saved(ctx, r, s, "adam3.", 3);
done:
    teardown(s);
}

static void test_model(const char *name) {
    fr_ctx *ctx = fr_ctx_new();
    ref r;
    fr_status st = open_ref(ctx, &r, name);
    CHECK(st == FR_OK, "%s: %s (set FR_SOURCE_DIR to the source tree)", name, fr_last_error(ctx));
    if (st) {
        fr_ctx_free(ctx);
        return;
    }
    CHECK(r.batch > 0 && r.classes > 0, "%s: reference without batch or logits", name);
    if (r.batch > 0 && r.classes > 0) {
        test_one_step(ctx, &r, FR_OPTIM_SGD);
        test_one_step(ctx, &r, FR_OPTIM_ADAM);
        test_one_step(ctx, &r, FR_OPTIM_ADAMW);
        test_adam_three_steps(ctx, &r);
    }
    close_ref(ctx, &r);
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated_total == 0, "%s: %zu bytes still allocated at the end", name,
          ms.allocated_total);
    fr_ctx_free(ctx);
}

int main(void) {
    verbose = getenv("FR_TEST_VERBOSE") != NULL;
    src_dir = getenv("FR_SOURCE_DIR");
    if (!src_dir || !*src_dir) src_dir = ".";
    const char *t = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/frugal-torch-ref-%ld.safetensors", t && *t ? t : "/tmp",
             (long)getpid());
    test_model("cnn");
    test_model("cnn_bias");
    test_model("mlp");
    test_model("mlp_mse");
    for (int q = 0; q < Q_COUNT; q++)
        printf("%-12s max |frugal - torch| %.3g; most of the tolerance used: %.3g (%s)\n",
               q_name[q], q_worst_abs[q], q_worst_frac[q], q_worst_at[q]);
    return check_done();
}
