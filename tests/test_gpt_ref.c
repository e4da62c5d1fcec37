/* test_gpt_ref.c — frugal's GPT against a nanoGPT-style GPT in PyTorch, and
 * the weight interop around it (tied parameters, Hugging Face GPT-2 files).
 *
 * tests/ref/make_gpt_ref.py builds the GPT of tests/ref/<name>.model
 * (gpt_small: T = 16, batch 3; gpt_t70: T = 70, batch 2, so the attention
 * crosses its 64/32 tiles), dumps its initial state_dict (<name>.safetensors,
 * lm_head.weight beside transformer.wte.weight), one batch and what PyTorch
 * computes on it (<name>_io.safetensors), and the same init as Hugging Face
 * lays GPT-2 out (<name>_hf.safetensors). For each model this test checks:
 *   - the logits and the loss of the forward, every parameter's gradient
 *     (the tied one once: the embedding's part plus the lm_head's), the three
 *     losses and the weights after three AdamW(lr 1e-3, wd 0.1) steps;
 *   - bf16-mixed's gradients against PyTorch's within 2e-2 of each tensor's
 *     largest (8-bit significands: a sanity bound, see below);
 *   - FR_CKPT_ALL (every block recomputed) against FR_CKPT_NONE: the same
 *     loss and gradients bit for bit, in fp32 and in bf16-mixed (the two
 *     bf16-mixed runs against each other);
 *   - the optimizer step inside backward (keep_grads = 0) against keep_grads
 *     = 1: the same weights after three AdamW steps bit for bit, the tied
 *     weight included;
 *   - the Hugging Face file loads to the same bits as the nanoGPT one (its
 *     Conv1D weights transposed on load, its attention buffers ignored), so
 *     does it with GPT2LMHeadModel's "transformer." prefix, and nanoGPT's with
 *     its causal masks as buffers; a Hugging Face file missing a tensor is
 *     refused naming it and the file;
 *   - the tie: fr_save writes lm_head.weight with transformer.wte.weight's
 *     bytes and the names of PyTorch's state_dict; a file without
 *     lm_head.weight loads; one whose lm_head.weight differs is refused.
 *
 * Tolerance (against PyTorch): per tensor, max |frugal - torch| <= 1e-5 max
 * |torch|. The scale is the tensor's largest value, not each element's own:
 * both sides add the same float32 terms in other orders (GEMM blocking, the
 * attention's online softmax), and the rounding of a sum is relative to the
 * terms summed; an element that is a near-cancelling sum is small while its
 * error is not, so a per-element relative bound would fail on exactly right
 * arithmetic. The loss: relative 1e-5. The updates AdamW made (weight after
 * minus initial weight) are also compared on their own scale: within 1e-4
 * of the tensor's largest update plus 2 ulp of the new weight (an update of
 * lr = 1e-3 hardly moves a weight, so the weight comparison alone would let
 * a wrong update through).
 * Adam divides by sqrt(v_hat), so the update carries the gradient's error
 * relative to the element's own gradient, not to the tensor's largest: an
 * element with a small gradient is held to little by the gradient tolerance
 * (1e-5 max |grad|), and where |g| is near eps, or zero in exact arithmetic
 * (the key part of c_attn's bias, which softmax ignores: rounding noise on
 * both sides), the noise decides the step. So each weight element's
 * tolerance also holds what the gradient tolerance can move it through the
 * three steps, to first order (adam_term below). Measured on PyTorch against
 * itself (float32 against float64, make_gpt_ref.py's models): the tightest
 * weight used 0.12 of this tolerance, the tightest update 0.40; with the
 * eps term alone (step 1's sensitivity, an earlier version of this test)
 * frugal went over by 1.5 after a change of its GELU's tanh (2e-7).
 * Needs tests/ref/ (found through FR_SOURCE_DIR, default "."); no torch.
 * FR_TEST_VERBOSE=1 prints the worst element of every compared tensor.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "optim/optim.h"
#include "backend/cpu/gemm16.h"
#include "check.h"
#include "core/ctx.h"
#include "model/model.h"
#include "train/step.h"

#define RTOL 1e-5
#define UTOL 1e-4
#define EPS 1e-8       /* AdamW's */
#define BF16_RTOL 2e-2 /* bf16-mixed against float32: see test_bf16_against_torch */
#define LR 1e-3
#define WD 0.1
#define STEPS 3

static const char *src_dir;
static int verbose;
static char tmp_path[512];

/* The largest fraction of its tolerance each kind of quantity used. */
enum { Q_LOGITS, Q_LOSS, Q_GRAD, Q_WEIGHT, Q_UPDATE, Q_BF16, Q_COUNT };
static const char *q_name[Q_COUNT] = {"logits",  "loss",    "grads",
                                      "weights", "updates", "bf16-mixed grads"};
static double q_worst_abs[Q_COUNT], q_worst_frac[Q_COUNT];
static char q_worst_at[Q_COUNT][FR_ST_NAME_MAX + 48];
static int64_t n_adam; /* weight elements whose tolerance adam_term() dominates */

static void note(int q, const char *model, const char *name, double d, double tol) {
    q_worst_abs[q] = fmax(q_worst_abs[q], d);
    if (tol > 0 && d / tol > q_worst_frac[q]) {
        q_worst_frac[q] = d / tol;
        snprintf(q_worst_at[q], sizeof q_worst_at[q], "%s %s", model, name);
    }
}

typedef struct ref {
    const char *name;
    int batch, T, vocab;
    fr_st_file init, io; /* PyTorch's initial state_dict; batch and results */
    const int32_t *x, *y;
} ref;

static void ref_path(char *out, size_t len, const char *name, const char *suffix) {
    snprintf(out, len, "%s/tests/ref/%s%s", src_dir, name, suffix);
}

/* The whole file in memory: the comparisons read the tensors in place. */
static fr_status read_whole(fr_ctx *ctx, const char *path, fr_st_file *out) {
    FILE *fp = fopen(path, "rb");
    memset(out, 0, sizeof *out);
    if (!fp) return fr_fail(ctx, FR_ERR_IO, "%s: cannot open", path);
    long len = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    void *buf = len >= 0 ? fr_alloc(ctx, (size_t)len + 1, FR_MEM_DATA) : NULL;
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
    ref_path(path, sizeof path, name, ".safetensors");
    fr_status st = read_whole(ctx, path, &r->init);
    if (st) return st;
    ref_path(path, sizeof path, name, "_io.safetensors");
    if ((st = read_whole(ctx, path, &r->io))) {
        fr_st_close(ctx, &r->init);
        return st;
    }
    const fr_st_entry *x = fr_st_find(&r->io, "x"), *y = fr_st_find(&r->io, "y");
    const fr_st_entry *z = fr_st_find(&r->io, "train.logits");
    if (!x || !y || !z || x->dtype != FR_I32 || y->dtype != FR_I32 || x->shape.ndim != 2 ||
        z->shape.ndim != 3 || fr_shape_numel(&x->shape) != fr_shape_numel(&y->shape))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: x, y or train.logits missing or malformed", path);
    r->batch = (int)x->shape.d[0];
    r->T = (int)x->shape.d[1];
    r->vocab = (int)z->shape.d[2];
    r->x = x->data;
    r->y = y->data;
    return FR_OK;
}

static void close_ref(fr_ctx *ctx, ref *r) {
    fr_st_close(ctx, &r->init);
    fr_st_close(ctx, &r->io);
}

/* A reference tensor that must exist, be F32 and hold n elements. */
static const float *want_f32(const fr_st_file *f, const char *model, const char *name, int64_t n) {
    const fr_st_entry *e = fr_st_find(f, name);
    int ok = e && e->dtype == FR_F32 && fr_shape_numel(&e->shape) == n;
    CHECK(ok, "%s: reference '%s' missing or not F32 with %lld elements", model, name,
          (long long)n);
    return ok ? e->data : NULL;
}

static double max_abs(const float *v, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)v[i]));
    return m;
}

/* got against reference `name`: max |got - want| <= RTOL max |want|. */
static void compare_tol(const ref *r, int q, const char *what, const char *name, const float *got,
                        int64_t n, double rtol) {
    const float *want = want_f32(&r->io, r->name, name, n);
    CHECK(got != NULL, "%s: %s: nothing to compare with '%s'", r->name, what, name);
    if (!want || !got) return;
    double tol = rtol * max_abs(want, n), worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= worst)) worst = d, at = i; /* NaN lands here too */
    }
    note(q, r->name, name, worst, tol);
    if (verbose)
        printf("%s %-44s %6lld values, worst [%lld] %.9g vs %.9g: %.3g of the tolerance\n", r->name,
               name, (long long)n, (long long)at, got[at], want[at], worst / tol);
    CHECK(worst <= tol, "%s: %s '%s'[%lld] is %.9g, PyTorch %.9g (tolerance %.3g)", r->name, what,
          name, (long long)at, got[at], want[at], tol);
}

static void compare(const ref *r, int q, const char *what, const char *name, const float *got,
                    int64_t n) {
    compare_tol(r, q, what, name, got, n, RTOL);
}

static void compare_loss(const ref *r, const char *what, float got, float want) {
    double d = fabs((double)got - want);
    note(Q_LOSS, r->name, what, d, RTOL * fabs(want));
    CHECK(d <= RTOL * fabs(want), "%s: %s loss %.9g, PyTorch %.9g", r->name, what, got, want);
}

/* What gradient errors of at most dg (the gradient tolerance) in each step
 * can move a weight over the AdamW steps, to first order. Step t moves it
 * by lr u, u = m_hat / (s + eps), s = sqrt(v_hat), where m_hat = sum a_i g_i
 * and v_hat = sum b_i g_i^2 over the gradients so far with weights a_i, b_i
 * that each sum to 1 (the bias correction). So |d m_hat| <= dg, |d s| <= dg,
 * and |d u| <= dg / (s + eps) + |u| dg / (s + eps) <= 2.01 dg / (s + eps)
 * (|u| <= 1.01 within three steps of the default betas, by Cauchy-Schwarz);
 * and s >= sqrt(b_1) |g_1| >= |g_1| / sqrt(3) (b_1 >= 1/3 for t <= 3), g_1
 * being the first step's gradient, known from the reference in float64.
 * Two steps differ by at most 2 x 1.01 lr however wrong the gradient. */
static double adam_term(double g1, double dg) {
    double du = 2.01 * dg / (fabs(g1) / sqrt(3.0) + EPS);
    return STEPS * LR * fmin(2.0 * 1.01, du);
}

/* Weights after the AdamW steps against "adamw3.<param>", each element
 * within the weight and update tolerances of the header plus adam_term(). */
static void compare_weights(const ref *r, const fr_param *p) {
    char nm[FR_ST_NAME_MAX + 16], gn[FR_ST_NAME_MAX + 16];
    int64_t n = fr_shape_numel(&p->shape);
    snprintf(nm, sizeof nm, "adamw3.%s", p->name);
    snprintf(gn, sizeof gn, "grad64.%s", p->name);
    const float *want = want_f32(&r->io, r->name, nm, n);
    const float *g64 = want_f32(&r->io, r->name, gn, n);
    const float *w0 = want_f32(&r->init, r->name, p->name, n);
    const float *got = p->data;
    if (!want || !g64 || !w0) return;
    double wscale = max_abs(want, n), dg = RTOL * max_abs(g64, n), uscale = 0.0;
    for (int64_t i = 0; i < n; i++) uscale = fmax(uscale, fabs((double)want[i] - w0[i]));
    int64_t bad_w = -1, bad_u = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), adam = adam_term(g64[i], dg);
        double ulp = (double)nextafterf(fabsf(want[i]), INFINITY) - fabsf(want[i]);
        double wtol = RTOL * wscale + adam, utol = UTOL * uscale + 2.0 * ulp + adam;
        n_adam += adam > RTOL * wscale;
        note(Q_WEIGHT, r->name, nm, d, wtol);
        note(Q_UPDATE, r->name, nm, d, utol);
        if (!(d <= wtol) && bad_w < 0) bad_w = i;
        if (!(d <= utol) && bad_u < 0) bad_u = i;
    }
    CHECK(bad_w < 0, "%s: '%s'[%lld] after %d AdamW steps is %.9g, PyTorch %.9g", r->name, nm,
          (long long)bad_w, STEPS, bad_w < 0 ? 0.0 : got[bad_w], bad_w < 0 ? 0.0 : want[bad_w]);
    CHECK(bad_u < 0, "%s: '%s'[%lld]: update %.9g, PyTorch's %.9g (largest %.3g)", r->name, nm,
          (long long)bad_u, bad_u < 0 ? 0.0 : (double)got[bad_u] - w0[bad_u],
          bad_u < 0 ? 0.0 : (double)want[bad_u] - w0[bad_u], uscale);
}

/* tests/ref/<name>.model with the weights of tests/ref/<name><suffix>. */
static fr_model *load_model(fr_ctx *ctx, const char *name, const char *suffix) {
    char path[600];
    ref_path(path, sizeof path, name, ".model");
    fr_model *m = fr_model_load(ctx, path);
    CHECK(m != NULL, "%s: fr_model_load: %s", name, fr_last_error(ctx));
    if (!m) return NULL;
    ref_path(path, sizeof path, name, suffix);
    fr_status st = fr_model_load_weights(m, path);
    CHECK(st == FR_OK, "%s: fr_model_load_weights(%s): %s", name, suffix, fr_last_error(ctx));
    if (st) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

typedef struct run_opts {
    fr_ckpt_mode ckpt;
    fr_precision precision;
    int keep_grads;
} run_opts;

/* A model with PyTorch's init and a compiled AdamW step for the batch. */
static fr_step *setup(fr_ctx *ctx, const ref *r, run_opts ro) {
    fr_model *m = load_model(ctx, r->name, ".safetensors");
    if (!m) return NULL;
    fr_step_opts so = {.batch = r->batch,
                       .training = 1,
                       .optim = fr_optim_defaults(FR_OPTIM_ADAMW),
                       .seed = 1,
                       .checkpoint = ro.ckpt,
                       .precision = ro.precision,
                       .keep_grads = ro.keep_grads};
    so.optim.lr = LR;
    so.optim.weight_decay = WD;
    so.optim.zero_grad_to_none = 0; /* the gradients stay readable after the step */
    fr_step *s = fr_step_compile(m, &so);
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

static fr_batch ref_batch(const ref *r) {
    fr_batch b = {.n = r->batch, .idx = r->x, .y = r->y};
    return b;
}

static int run(fr_ctx *ctx, const ref *r, fr_step *s, float *loss) {
    fr_batch b = ref_batch(r);
    fr_status st = fr_step_run(s, &b, loss, NULL);
    CHECK(st == FR_OK, "%s: fr_step_run: %s", r->name, fr_last_error(ctx));
    return st == FR_OK;
}

static const void *grad_of(const fr_model *m, const fr_param *p) {
    return fr_grad32(m, p) ? (const void *)fr_grad32(m, p) : (const void *)fr_grad16(m, p);
}

/* Forward, gradients and three AdamW steps against PyTorch. */
static void test_against_torch(fr_ctx *ctx, const ref *r) {
    fr_step *s = setup(ctx, r, (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 1});
    if (!s) return;
    fr_model *m = s->m;
    const float *losses = want_f32(&r->io, r->name, "adamw3.loss", STEPS);
    const float *want_loss = want_f32(&r->io, r->name, "train.loss", 1);
    for (int t = 0; t < STEPS; t++) {
        float loss = NAN;
        if (!run(ctx, r, s, &loss)) break;
        char what[32];
        snprintf(what, sizeof what, "AdamW step %d", t + 1);
        if (losses) compare_loss(r, what, loss, losses[t]);
        if (t > 0) continue;
        if (want_loss) compare_loss(r, "train", loss, *want_loss);
        compare(r, Q_LOGITS, "logits", "train.logits", s->ex.ptr[s->g.logits],
                (int64_t)r->batch * r->T * r->vocab);
        char nm[FR_ST_NAME_MAX + 16];
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!p->trainable) continue;
            snprintf(nm, sizeof nm, "grad.%s", p->name);
            compare(r, Q_GRAD, "gradient", nm, fr_grad32(m, p), fr_shape_numel(&p->shape));
        }
    }
    int n_trainable = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        if (!m->params[i].trainable) continue;
        n_trainable++;
        compare_weights(r, &m->params[i]);
    }
    /* every parameter of PyTorch's model was compared (tied: one) */
    int n_torch = 0;
    for (int i = 0; i < r->io.n; i++) n_torch += strncmp(r->io.entries[i].name, "grad.", 5) == 0;
    CHECK(n_trainable == n_torch, "%s: %d trainable parameters, PyTorch's model has %d", r->name,
          n_trainable, n_torch);
    teardown(s);
}

/* Two steps that must agree bit for bit: the loss of one step and every
 * gradient (checkpointing), or the losses and weights of three steps
 * (the step inside backward). */
static void same_bits(fr_ctx *ctx, const ref *r, const char *what, run_opts a, run_opts b,
                      int steps) {
    fr_step *sa = setup(ctx, r, a), *sb = setup(ctx, r, b);
    if (!sa || !sb) goto done;
    /* the two differ as they should, not the same step twice (FR_CKPT_ALL
     * recomputes every unit but the last, whose backward follows at once) */
    fr_plan_info ia, ib;
    fr_step_plan_info(sa, &ia);
    fr_step_plan_info(sb, &ib);
    if (a.ckpt != b.ckpt)
        CHECK(ia.recomputed_units == 0 && ib.recomputed_units >= ib.units - 1 && ib.units > 1,
              "%s: %s: %d of %d units recomputed, then %d of %d", r->name, what,
              ia.recomputed_units, ia.units, ib.recomputed_units, ib.units);
    if (a.keep_grads != b.keep_grads)
        CHECK(sa->opt.n_fused == 0 && sb->opt.n_fused > 0,
              "%s: %s: %d then %d parameters stepped in backward", r->name, what, sa->opt.n_fused,
              sb->opt.n_fused);
    for (int t = 0; t < steps; t++) {
        float la = NAN, lb = NAN;
        if (!run(ctx, r, sa, &la) || !run(ctx, r, sb, &lb)) goto done;
        CHECK(memcmp(&la, &lb, sizeof la) == 0, "%s: %s: step %d loss %.9g vs %.9g", r->name, what,
              t + 1, la, lb);
    }
    const fr_model *ma = sa->m, *mb = sb->m;
    CHECK(ma->n_params == mb->n_params, "%s: %s: parameter counts differ", r->name, what);
    for (size_t i = 0; i < ma->n_params && ma->n_params == mb->n_params; i++) {
        const fr_param *pa = &ma->params[i], *pb = &mb->params[i];
        if (!pa->trainable) continue;
        size_t n = (size_t)fr_shape_numel(&pa->shape);
        if (steps == 1) { /* the gradients */
            size_t bytes = n * (fr_grad32(ma, pa) ? 4 : 2);
            const void *ga = grad_of(ma, pa), *gb = grad_of(mb, pb);
            CHECK(ga && gb && !fr_grad32(ma, pa) == !fr_grad32(mb, pb) &&
                      memcmp(ga, gb, bytes) == 0,
                  "%s: %s: gradient of %s differs", r->name, what, pa->name);
        } else { /* the weights */
            CHECK(memcmp(pa->data, pb->data, n * fr_dtype_size(pa->dtype)) == 0,
                  "%s: %s: %s differs after %d steps", r->name, what, pa->name, steps);
        }
    }
done:
    teardown(sa);
    teardown(sb);
}

/* bf16-mixed's gradients against PyTorch's float32 ones, within BF16_RTOL
 * of the tensor's largest: the saved activations are rounded to 8
 * significant bits (relative 2^-9), and their errors reach the gradients
 * through a few products (measured: 6.6e-3 of the largest at most, gpt_small
 * ln_1.weight); a sanity bound, and a check that bf16 is in use (some
 * gradient differs from fp32's). */
static void test_bf16_against_torch(fr_ctx *ctx, const ref *r) {
    fr_step *s = setup(ctx, r, (run_opts){FR_CKPT_NONE, FR_PREC_BF16_MIXED, 1});
    fr_step *f = setup(ctx, r, (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 1});
    float loss;
    int differs = 0;
    if (!s || !f || !run(ctx, r, s, &loss) || !run(ctx, r, f, &loss)) goto done;
    char nm[FR_ST_NAME_MAX + 16];
    for (size_t i = 0; i < s->m->n_params; i++) {
        const fr_param *p = &s->m->params[i];
        if (!p->trainable) continue;
        snprintf(nm, sizeof nm, "grad.%s", p->name);
        compare_tol(r, Q_BF16, "bf16-mixed gradient", nm, fr_grad32(s->m, p),
                    fr_shape_numel(&p->shape), BF16_RTOL);
        const float *gs = fr_grad32(s->m, p), *gf = fr_grad32(f->m, &f->m->params[i]);
        differs |= gs && gf && memcmp(gs, gf, (size_t)fr_shape_numel(&p->shape) * 4);
    }
    CHECK(differs, "%s: bf16-mixed gave fp32's gradients bit for bit: is bf16 in use?", r->name);
    /* With bf16 GEMMs, attention's backward writes the bf16 dqkv the qkv
     * projection's backward reads: no CAST after it */
    const int native = fr_gemm16_native(FR_BF16);
    int bwd = 0;
    for (int t = 0; t < s->plan.n_nodes && native; t++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[t]];
        if (nd->op != FR_OP_ATTENTION_BWD) continue;
        bwd++;
        CHECK(s->g.vals[nd->out[0]].dtype == FR_BF16, "%s: attention_bwd writes a %s dqkv", r->name,
              fr_dtype_name(s->g.vals[nd->out[0]].dtype));
        for (int u = 0; u < s->plan.n_nodes; u++) {
            const fr_node *c = &s->g.nodes[s->plan.order[u]];
            CHECK(c->op != FR_OP_CAST || c->in[0] != nd->out[0], "%s: a CAST reads dqkv", r->name);
        }
    }
    CHECK(bwd > 0 || !native, "%s: no attention_bwd in the order", r->name);
    /* The residual stream's sums (pos_embedding, add) write the 16-bit x
     * LayerNorm's backward reads as a second output (fr_op_info.half_copy),
     * on any CPU: no CAST reads what they make */
    int copies = 0, lns = 0;
    for (int t = 0; t < s->plan.n_nodes; t++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[t]];
        lns += nd->op == FR_OP_LAYERNORM_BWD;
        if (nd->op == FR_OP_CAST && s->g.vals[nd->in[0]].producer >= 0) {
            const fr_op p = s->g.nodes[s->g.vals[nd->in[0]].producer].op;
            CHECK(p != FR_OP_ADD && p != FR_OP_POS_EMBEDDING, "%s: a CAST reads %s's y", r->name,
                  fr_op_get(p)->name);
        }
        if ((nd->op != FR_OP_ADD && nd->op != FR_OP_POS_EMBEDDING) || nd->n_out != 2) continue;
        const fr_value *h = &s->g.vals[nd->out[1]];
        CHECK(h->dtype == FR_BF16 && h->producer == s->plan.order[t] &&
                  fr_shape_numel(&h->shape) == fr_shape_numel(&s->g.vals[nd->out[0]].shape),
              "%s: %s's copy is %s", r->name, fr_op_get(nd->op)->name, fr_dtype_name(h->dtype));
        for (int u = t + 1; u < s->plan.n_nodes; u++) {
            const fr_node *b = &s->g.nodes[s->plan.order[u]];
            if (b->op == FR_OP_LAYERNORM_BWD && b->in[1] == nd->out[1]) {
                copies++;
                break;
            }
        }
    }
    CHECK(copies > 0 && copies == lns, "%s: %d of %d LayerNorm backwards read a sum's 16-bit copy",
          r->name, copies, lns);
done:
    teardown(s);
    teardown(f);
}

static void test_bit_identities(fr_ctx *ctx, const ref *r) {
    same_bits(ctx, r, "fp32, checkpoint all vs none", (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 1},
              (run_opts){FR_CKPT_ALL, FR_PREC_FP32, 1}, 1);
    same_bits(ctx, r, "bf16-mixed, checkpoint all vs none",
              (run_opts){FR_CKPT_NONE, FR_PREC_BF16_MIXED, 1},
              (run_opts){FR_CKPT_ALL, FR_PREC_BF16_MIXED, 1}, 1);
    same_bits(ctx, r, "AdamW inside backward vs after it",
              (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 1}, (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 0},
              STEPS);
}

/* Every parameter of a and b the same bytes. */
static void same_weights(const char *what, const fr_model *a, const fr_model *b) {
    CHECK(a->n_params == b->n_params, "%s: parameter counts differ", what);
    for (size_t i = 0; i < a->n_params && a->n_params == b->n_params; i++) {
        const fr_param *p = &a->params[i];
        size_t bytes = (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
        CHECK(memcmp(p->data, b->params[i].data, bytes) == 0, "%s: %s differs", what, p->name);
    }
}

/* src's entries with `drop` left out and `poke` (when not NULL) changed in
 * its first element, written to tmp_path. */
static fr_status write_variant(fr_ctx *ctx, const fr_st_file *src, const char *drop,
                               const char *poke) {
    fr_st_entry *e = fr_calloc(ctx, ((size_t)src->n + 1) * sizeof *e, FR_MEM_OTHER);
    void *copy = NULL;
    if (!e) return FR_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < src->n; i++) {
        if (drop && strcmp(src->entries[i].name, drop) == 0) continue;
        e[n] = src->entries[i];
        if (poke && strcmp(e[n].name, poke) == 0 && e[n].dtype == FR_F32 && e[n].nbytes >= 4) {
            if (!(copy = fr_alloc(ctx, e[n].nbytes, FR_MEM_OTHER))) break;
            memcpy(copy, e[n].data, e[n].nbytes);
            ((float *)copy)[0] += 1.0f;
            e[n].data = copy;
        }
        n++;
    }
    fr_status st =
        copy || !poke ? fr_st_write(ctx, tmp_path, e, n, src->meta, src->n_meta) : FR_ERR_NOMEM;
    fr_free(ctx, copy);
    fr_free(ctx, e);
    return st;
}

/* Loading `what` (written to tmp_path) into a fresh model fails, with a
 * message naming the tensor, the file and `words`. */
static void refused(fr_ctx *ctx, const ref *r, const char *what, const char *tensor,
                    const char *words) {
    char path[600];
    ref_path(path, sizeof path, r->name, ".model");
    fr_model *m = fr_model_load(ctx, path);
    CHECK(m != NULL, "%s: fr_model_load: %s", r->name, fr_last_error(ctx));
    if (!m) return;
    fr_status st = fr_model_load_weights(m, tmp_path);
    const char *msg = fr_last_error(ctx);
    CHECK(st == FR_ERR_FORMAT, "%s: %s: loaded (status %d)", r->name, what, (int)st);
    CHECK(st && strstr(msg, tensor) && strstr(msg, tmp_path) && strstr(msg, words),
          "%s: %s: the message '%s' should name '%s', the file and say '%s'", r->name, what, msg,
          tensor, words);
    fr_model_free(m);
}

/* Hugging Face's layout loads to the same bits; a missing tensor is named. */
/* src's entries, each name after `prefix`, then `extra`, written to tmp_path. */
static fr_status write_with(fr_ctx *ctx, const fr_st_file *src, const char *prefix,
                            const fr_st_entry *extra, int n_extra) {
    fr_st_entry *e = fr_calloc(ctx, ((size_t)src->n + (size_t)n_extra) * sizeof *e, FR_MEM_OTHER);
    if (!e) return FR_ERR_NOMEM;
    for (int i = 0; i < src->n; i++) {
        e[i] = src->entries[i];
        snprintf(e[i].name, sizeof e[i].name, "%s%s", prefix, src->entries[i].name);
    }
    for (int i = 0; i < n_extra; i++) e[src->n + i] = extra[i];
    fr_status st = fr_st_write(ctx, tmp_path, e, src->n + n_extra, src->meta, src->n_meta);
    fr_free(ctx, e);
    return st;
}

/* tmp_path loads into a fresh model to the same weights as `want`. */
static void loads_as(fr_ctx *ctx, const ref *r, const char *what, const fr_model *want) {
    char path[600];
    ref_path(path, sizeof path, r->name, ".model");
    fr_model *m = fr_model_load(ctx, path);
    fr_status st = m ? fr_model_load_weights(m, tmp_path) : FR_ERR_ARG;
    CHECK(st == FR_OK, "%s: %s: %s", r->name, what, fr_last_error(ctx));
    if (!st) same_weights(what, want, m);
    fr_model_free(m);
}

static void test_hf_import(fr_ctx *ctx, const ref *r) {
    fr_model *a = load_model(ctx, r->name, ".safetensors");
    fr_model *b = load_model(ctx, r->name, "_hf.safetensors");
    if (a && b) same_weights("Hugging Face GPT-2 file against nanoGPT's", a, b);
    fr_model_free(b);

    char path[600];
    fr_st_file hf;
    ref_path(path, sizeof path, r->name, "_hf.safetensors");
    fr_status st = read_whole(ctx, path, &hf);
    CHECK(st == FR_OK, "%s: %s", r->name, fr_last_error(ctx));
    if (st) {
        fr_model_free(a);
        return;
    }
    const fr_st_entry *mask = fr_st_find(&hf, "h.0.attn.bias");
    CHECK(mask && fr_st_find(&hf, "h.0.attn.masked_bias") && !fr_st_find(&hf, "lm_head.weight"),
          "%s: the Hugging Face reference lacks its attention buffers or has lm_head.weight",
          r->name);
    if (a && mask) {
        /* GPT2LMHeadModel.save_pretrained's names: Conv1D layout with the prefix */
        if (!write_with(ctx, &hf, "transformer.", NULL, 0))
            loads_as(ctx, r, "Hugging Face GPT-2 with the transformer. prefix", a);
        /* nanoGPT's file with the causal masks as buffers (older nanoGPT):
         * ignored for the blocks the model has, refused for another */
        fr_st_entry extra[2] = {*mask, *mask};
        snprintf(extra[0].name, sizeof extra[0].name, "transformer.h.0.attn.bias");
        snprintf(extra[1].name, sizeof extra[1].name, "transformer.h.1.attn.bias");
        if (!write_with(ctx, &r->init, "", extra, 2))
            loads_as(ctx, r, "nanoGPT's file with attn.bias buffers", a);
        snprintf(extra[0].name, sizeof extra[0].name, "transformer.h.7.attn.bias");
        if (!write_with(ctx, &r->init, "", extra, 1))
            refused(ctx, r, "nanoGPT's file with a mask of a block the model lacks",
                    "'transformer.h.7.attn.bias'", "unexpected");
    }
    fr_model_free(a);
    if (!write_variant(ctx, &hf, "h.1.mlp.c_fc.weight", NULL))
        refused(ctx, r, "HF file without h.1.mlp.c_fc.weight", "'h.1.mlp.c_fc.weight'", "missing");
    /* a Conv1D weight stored as nn.Linear's [out, in] has the wrong shape */
    fr_st_entry *e = (fr_st_entry *)fr_st_find(&hf, "h.0.attn.c_attn.weight");
    if (e && e->shape.ndim == 2) {
        int64_t d = e->shape.d[0];
        e->shape.d[0] = e->shape.d[1], e->shape.d[1] = d;
        if (!write_variant(ctx, &hf, NULL, NULL))
            refused(ctx, r, "HF file with c_attn as [out, in]", "'h.0.attn.c_attn.weight'",
                    "shape");
    }
    fr_st_close(ctx, &hf);
    remove(tmp_path);

    /* every allocation of the Hugging Face load failing in turn: refused
     * cleanly (out of memory), nothing leaked */
    ref_path(path, sizeof path, r->name, ".model");
    fr_mem_stats before, after;
    fr_status last = FR_ERR_NOMEM;
    for (uint64_t k = 1; k < 1000 && last == FR_ERR_NOMEM; k++) {
        fr_mem_get_stats(ctx, &before);
        fr_model *m = fr_model_load(ctx, path);
        CHECK(m != NULL, "%s: fr_model_load: %s", r->name, fr_last_error(ctx));
        if (!m) return;
        char hf_path[600];
        ref_path(hf_path, sizeof hf_path, r->name, "_hf.safetensors");
        fr_mem_fail_at(ctx, k);
        last = fr_model_load_weights(m, hf_path);
        fr_mem_fail_at(ctx, 0);
        CHECK(last == FR_OK || last == FR_ERR_NOMEM, "%s: HF load, allocation %llu failing: %s",
              r->name, (unsigned long long)k, fr_last_error(ctx));
        fr_model_free(m);
        fr_mem_get_stats(ctx, &after);
        CHECK(after.allocated_total == before.allocated_total,
              "%s: HF load, allocation %llu failing: %zu bytes left", r->name,
              (unsigned long long)k, after.allocated_total - before.allocated_total);
    }
    CHECK(last == FR_OK, "%s: HF load never succeeded with failing allocations", r->name);
}

/* The tie in saved and loaded files. */
static void test_tie(fr_ctx *ctx, const ref *r) {
    fr_step *s = setup(ctx, r, (run_opts){FR_CKPT_NONE, FR_PREC_FP32, 1});
    if (!s) return;
    float loss;
    if (!run(ctx, r, s, &loss)) goto done; /* wte is trained: the saved values are frugal's */
    fr_status st = fr_save(s, tmp_path);
    CHECK(st == FR_OK, "%s: fr_save: %s", r->name, fr_last_error(ctx));
    if (st) goto done;
    fr_st_file f;
    if ((st = read_whole(ctx, tmp_path, &f))) {
        CHECK(0, "%s: reading fr_save's file: %s", r->name, fr_last_error(ctx));
        goto done;
    }
    /* PyTorch's state_dict, name for name (no attention mask buffers) */
    int n_weights = 0;
    for (int i = 0; i < f.n; i++) n_weights += strncmp(f.entries[i].name, "optimizer.", 10) != 0;
    CHECK(n_weights == r->init.n, "%s: fr_save wrote %d weights, PyTorch's state_dict has %d",
          r->name, n_weights, r->init.n);
    for (int i = 0; i < r->init.n; i++) {
        const fr_st_entry *w = &r->init.entries[i], *e = fr_st_find(&f, w->name);
        int same = e && e->dtype == w->dtype && e->shape.ndim == w->shape.ndim;
        for (int k = 0; same && k < w->shape.ndim; k++) same = e->shape.d[k] == w->shape.d[k];
        CHECK(same, "%s: fr_save's '%s' is missing or not PyTorch's dtype and shape", r->name,
              w->name);
    }
    const fr_st_entry *lm = fr_st_find(&f, "lm_head.weight");
    const fr_st_entry *wte = fr_st_find(&f, "transformer.wte.weight");
    CHECK(lm && wte && lm->nbytes == wte->nbytes && memcmp(lm->data, wte->data, lm->nbytes) == 0,
          "%s: fr_save's lm_head.weight is not transformer.wte.weight's bytes", r->name);
    fr_st_close(ctx, &f);

    /* the saved file loads back to the same bits */
    char path[600];
    ref_path(path, sizeof path, r->name, ".model");
    fr_model *m = fr_model_load(ctx, path);
    CHECK(m != NULL, "%s: fr_model_load: %s", r->name, fr_last_error(ctx));
    if (m) {
        st = fr_model_load_weights(m, tmp_path);
        CHECK(st == FR_OK, "%s: loading fr_save's file: %s", r->name, fr_last_error(ctx));
        if (!st) same_weights("fr_save, then fr_model_load_weights", s->m, m);
        fr_model_free(m);
    }

    /* without lm_head.weight: loads, the same weights as with it */
    if (!write_variant(ctx, &r->init, "lm_head.weight", NULL)) {
        fr_model *a = load_model(ctx, r->name, ".safetensors");
        fr_model *b = fr_model_load(ctx, path);
        st = b ? fr_model_load_weights(b, tmp_path) : FR_ERR_ARG;
        CHECK(st == FR_OK, "%s: a file without lm_head.weight: %s", r->name, fr_last_error(ctx));
        if (a && !st) same_weights("without lm_head.weight", a, b);
        fr_model_free(a);
        fr_model_free(b);
    }
    /* lm_head.weight that differs from transformer.wte.weight: refused */
    if (!write_variant(ctx, &r->init, NULL, "lm_head.weight"))
        refused(ctx, r, "lm_head.weight unlike transformer.wte.weight", "lm_head.weight", "tied");
    remove(tmp_path);
done:
    teardown(s);
}

static void test_model(const char *name, int bf16_only) {
    fr_ctx *ctx = fr_ctx_new();
    ref r;
    fr_status st = open_ref(ctx, &r, name);
    CHECK(st == FR_OK, "%s: %s (set FR_SOURCE_DIR to the source tree)", name, fr_last_error(ctx));
    if (!st && bf16_only) {
        test_bf16_against_torch(ctx, &r);
        close_ref(ctx, &r);
    } else if (!st) {
        test_against_torch(ctx, &r);
        test_bit_identities(ctx, &r);
        test_bf16_against_torch(ctx, &r);
        test_hf_import(ctx, &r);
        test_tie(ctx, &r);
        close_ref(ctx, &r);
    }
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated_total == 0, "%s: %zu bytes still allocated at the end", name,
          ms.allocated_total);
    fr_ctx_free(ctx);
}

/* test_bf16_against_torch again in a child with the linear layers' 16-bit
 * GEMMs the other way (FRUGAL_GEMM16, read once per process): 1 where the
 * CPU has no native bf16 (oneDNN's emulation, the native graph: dy in 16
 * bits), 0 where it has (f32 GEMMs of rounded operands), so both graphs
 * are checked on any host */
static void bf16_other_graph(const char *self) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FRUGAL_GEMM16", fr_gemm16_native(FR_BF16) ? "0" : "1", 1);
        execl(self, self, "bf16", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "bf16-mixed with FRUGAL_GEMM16=%d (child) failed", fr_gemm16_native(FR_BF16) ? 0 : 1);
}

int main(int argc, char **argv) {
    const int bf16_only = argc > 1 && strcmp(argv[1], "bf16") == 0;
    verbose = getenv("FR_TEST_VERBOSE") != NULL;
    src_dir = getenv("FR_SOURCE_DIR");
    if (!src_dir || !*src_dir) src_dir = ".";
    const char *t = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/frugal-gpt-ref-%ld.safetensors", t && *t ? t : "/tmp",
             (long)getpid());
    test_model("gpt_small", bf16_only);
    test_model("gpt_t70", bf16_only);
    if (bf16_only) return check_done();
    bf16_other_graph(argv[0]);
    for (int q = 0; q < Q_COUNT; q++)
        printf("%-18s max |frugal - torch| %.3g; most of the tolerance used: %.3g (%s)\n",
               q_name[q], q_worst_abs[q], q_worst_frac[q], q_worst_at[q]);
    printf("%lld weight elements whose tolerance adam_term() dominates\n", (long long)n_adam);
    return check_done();
}
