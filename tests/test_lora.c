/* test_lora.c — LoRA adapters (model/lora.c) against a hand-written LoRA
 * linear in PyTorch, and the engine's promises around them.
 *
 * tests/ref/make_lora_ref.py wraps the four linear layers of each block of
 * tests/ref/gpt_small.model (its weights tests/ref/gpt_small.safetensors) in
 * y = base(x) + (x A^T B^T) alpha / r, r = 4, alpha = 8, PEFT's A init, a
 * non-zero B, the base frozen, and dumps one batch's logits, loss, the
 * adapters' gradients and the adapters after three AdamW(lr 1e-3, wd 0.1)
 * steps (tests/ref/lora_small_io.safetensors). This test checks:
 *   - logits and loss, every adapter gradient, the three losses and the
 *     adapters after the steps: within 1e-5 of each tensor's largest value
 *     (the weights with test_gpt_ref.c's AdamW sensitivity term, see there);
 *   - only the adapters learn: no base parameter has a gradient value, the
 *     predicted gradient and state bytes are the
 *     adapters' (4 and 8 bytes an element, by hand), the base's bytes are
 *     unchanged bit for bit after training, and the activations' measured
 *     peak equals the predicted;
 *   - every block recomputed (checkpoint all) gives the loss and gradients
 *     of none bit for bit, with adapter dropout 0.1 too; AdamW inside
 *     backward gives the weights of AdamW after it bit for bit; two
 *     micro-batches agree with one batch within float rounding;
 *   - the init: A drawn within +-1/sqrt(in) and not all zero, B zeros,
 *     after a base's weights are loaded over the model (the base file holds
 *     no adapter);
 *   - bad input: a target matching no layer, or a non-linear one, a rank
 *     above min(out, in) (the largest is accepted), --lora with --freeze,
 *     malformed texts: refused with the model unchanged;
 *   - the CNN's classifier (fc2) adapted alone: one step trains it, only
 *     its adapters learn.
 * Needs tests/ref/ (through FR_SOURCE_DIR, default "."); no torch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/ctx.h"
#include "model/model.h"
#include "optim/optim.h"
#include "run/adapter.h"
#include "train/step.h"

#define RTOL 1e-5
#define UTOL 1e-4
#define EPS 1e-8
#define LR 1e-3
#define WD 0.1
#define STEPS 3

static const char *src_dir;
static const char *TARGETS = "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj";

typedef struct ref {
    fr_st_file io;
    const int32_t *x, *y;
    int batch, T, vocab;
} ref;

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

static const float *want_f32(const ref *r, const char *name, int64_t n) {
    const fr_st_entry *e = fr_st_find(&r->io, name);
    int ok = e && e->dtype == FR_F32 && fr_shape_numel(&e->shape) == n;
    CHECK(ok, "reference '%s' missing or not F32 with %lld elements", name, (long long)n);
    return ok ? e->data : NULL;
}

static double max_abs(const float *v, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)v[i]));
    return m;
}

/* got against reference `name`: max |got - want| <= RTOL max |want|. */
static void compare(const ref *r, const char *name, const float *got, int64_t n) {
    const float *want = want_f32(r, name, n);
    CHECK(got != NULL, "nothing to compare with '%s'", name);
    if (!want || !got) return;
    double tol = RTOL * max_abs(want, n), worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= worst)) worst = d, at = i;
    }
    CHECK(worst <= tol, "'%s'[%lld] is %.9g, PyTorch %.9g (tolerance %.3g)", name, (long long)at,
          got[at], want[at], tol);
}

/* test_gpt_ref.c's: what gradient errors of at most dg per step can move a
 * weight through the AdamW steps, to first order. */
static double adam_term(double g1, double dg) {
    double du = 2.01 * dg / (fabs(g1) / sqrt(3.0) + EPS);
    return STEPS * LR * fmin(2.0 * 1.01, du);
}

static void compare_weights(const ref *r, const fr_param *p) {
    char nm[FR_ST_NAME_MAX + 16], gn[FR_ST_NAME_MAX + 16], in[FR_ST_NAME_MAX + 16];
    int64_t n = fr_shape_numel(&p->shape);
    snprintf(nm, sizeof nm, "adamw3.%s", p->name);
    snprintf(gn, sizeof gn, "grad64.%s", p->name);
    snprintf(in, sizeof in, "init.%s", p->name);
    const float *want = want_f32(r, nm, n), *g64 = want_f32(r, gn, n), *w0 = want_f32(r, in, n);
    const float *got = p->data;
    if (!want || !g64 || !w0) return;
    double wscale = max_abs(want, n), dg = RTOL * max_abs(g64, n), uscale = 0.0;
    for (int64_t i = 0; i < n; i++) uscale = fmax(uscale, fabs((double)want[i] - w0[i]));
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        double d = fabs((double)got[i] - want[i]), adam = adam_term(g64[i], dg);
        double ulp = (double)nextafterf(fabsf(want[i]), INFINITY) - fabsf(want[i]);
        if (!(d <= RTOL * wscale + adam) || !(d <= UTOL * uscale + 2.0 * ulp + adam)) bad = i;
    }
    CHECK(bad < 0, "'%s'[%lld] after %d AdamW steps is %.9g, PyTorch %.9g", nm, (long long)bad,
          STEPS, bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
}

static void path_of(char *out, size_t len, const char *file) {
    snprintf(out, len, "%s/tests/ref/%s", src_dir, file);
}

/* gpt_small with PyTorch's base weights and adapters (the reference's
 * initial A and B when `ref_adapters`), dropout p on the adapters' input. */
static fr_model *lora_model(fr_ctx *ctx, const ref *r, double p, int ref_adapters) {
    char path[600];
    path_of(path, sizeof path, "gpt_small.model");
    fr_model *m = fr_model_load(ctx, path);
    CHECK(m != NULL, "load: %s", fr_last_error(ctx));
    if (!m) return NULL;
    fr_lora_cfg c = {.r = 4, .alpha = 8.0, .dropout = p};
    snprintf(c.targets, sizeof c.targets, "%s", TARGETS);
    fr_status st = fr_model_lora(m, &c, 1);
    CHECK(st == FR_OK, "fr_model_lora: %s", fr_last_error(ctx));
    path_of(path, sizeof path, "gpt_small.safetensors");
    if (!st) st = fr_model_load_weights(m, path);
    CHECK(st == FR_OK, "load the base: %s", fr_last_error(ctx));
    for (size_t i = 0; !st && ref_adapters && i < m->n_params; i++) {
        fr_param *q = &m->params[i];
        if (q->role != FR_P_LORA_A && q->role != FR_P_LORA_B) continue;
        char nm[FR_ST_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "init.%s", q->name);
        const float *v = want_f32(r, nm, fr_shape_numel(&q->shape));
        if (v) memcpy(q->data, v, (size_t)fr_shape_numel(&q->shape) * 4);
        else st = FR_ERR_FORMAT;
    }
    if (st) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

typedef struct run_opts {
    fr_ckpt_mode ckpt;
    int keep_grads, micro;
    double dropout;
} run_opts;

static fr_step *setup(fr_ctx *ctx, const ref *r, run_opts ro) {
    fr_model *m = lora_model(ctx, r, ro.dropout, 1);
    if (!m) return NULL;
    fr_step_opts so = {.batch = r->batch,
                       .training = 1,
                       .optim = fr_optim_defaults(FR_OPTIM_ADAMW),
                       .seed = 1,
                       .checkpoint = ro.ckpt,
                       .micro_batch = ro.micro,
                       .keep_grads = ro.keep_grads};
    so.optim.lr = LR;
    so.optim.weight_decay = WD;
    so.optim.zero_grad_to_none = 0;
    fr_step *s = fr_step_compile(m, &so);
    CHECK(s != NULL, "fr_step_compile: %s", fr_last_error(ctx));
    if (!s) fr_model_free(m);
    return s;
}

static void teardown(fr_step *s) {
    if (!s) return;
    fr_model *m = s->m;
    fr_step_free(s);
    fr_model_free(m);
}

static int run(fr_ctx *ctx, const ref *r, fr_step *s, float *loss) {
    fr_batch b = {.n = r->batch, .idx = r->x, .y = r->y};
    fr_status st = fr_step_run(s, &b, loss, NULL);
    CHECK(st == FR_OK, "fr_step_run: %s", fr_last_error(ctx));
    return st == FR_OK;
}

static int is_adapter(const fr_param *p) {
    return p->role == FR_P_LORA_A || p->role == FR_P_LORA_B;
}

static void test_against_torch(fr_ctx *ctx, const ref *r) {
    fr_step *s = setup(ctx, r, (run_opts){FR_CKPT_NONE, 1, 0, 0.0});
    if (!s) return;
    fr_model *m = s->m;
    /* the base's bytes before training */
    void *base = malloc(m->pblock_bytes);
    if (base) memcpy(base, m->pblock, m->pblock_bytes);
    /* only the adapters learn: gradient buffers, optimizer state, predicted bytes */
    size_t n_ad = 0, n_adapters = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        size_t g = fr_step_grad_bytes(s, i), numel = (size_t)fr_shape_numel(&p->shape);
        if (is_adapter(p)) {
            n_ad += numel, n_adapters++;
            CHECK(fr_param_learns(p) && g == numel * 4, "%s: gradient %zu bytes", p->name, g);
        } else {
            CHECK(!fr_param_learns(p) && g == 0 && s->gv[i] < 0,
                  "%s (base): a gradient value (%zu bytes)", p->name, g);
        }
    }
    CHECK(n_adapters == 16, "%zu adapter tensors (2 blocks x 4 layers x A, B)", n_adapters);
    /* by hand: per block c_attn 4x32 + 96x4, c_proj 4x32 + 32x4, c_fc 4x32 + 128x4,
     * mlp.c_proj 4x128 + 32x4 = 512 + 256 + 640 + 640 = 2048 elements; two blocks */
    CHECK(n_ad == 4096, "%zu adapter elements", n_ad);
    size_t pred[FR_MEM_CAT_COUNT], total;
    fr_step_predicted(s, pred, &total);
    CHECK(pred[FR_MEM_GRADS] == 4096 * 4, "predicted gradients %zu bytes", pred[FR_MEM_GRADS]);
    CHECK(pred[FR_MEM_OPTIM] == 2 * 4096 * 4, "predicted AdamW state %zu bytes",
          pred[FR_MEM_OPTIM]);

    const float *losses = want_f32(r, "adamw3.loss", STEPS);
    const float *want_loss = want_f32(r, "train.loss", 1);
    for (int t = 0; t < STEPS; t++) {
        float loss = NAN;
        fr_mem_stats before, after;
        fr_mem_get_stats(ctx, &before);
        fr_mem_reset_peak(ctx);
        if (!run(ctx, r, s, &loss)) break;
        fr_mem_get_stats(ctx, &after);
        CHECK(after.allocated_peak[FR_MEM_ACTIVATIONS] == s->plan.peak[FR_MEM_ACTIVATIONS],
              "step %d: activations measured %zu, predicted %zu", t + 1,
              after.allocated_peak[FR_MEM_ACTIVATIONS], s->plan.peak[FR_MEM_ACTIVATIONS]);
        CHECK(after.allocated[FR_MEM_GRADS] == pred[FR_MEM_GRADS] &&
                  after.allocated[FR_MEM_OPTIM] == pred[FR_MEM_OPTIM],
              "step %d: gradients %zu, state %zu bytes held", t + 1, after.allocated[FR_MEM_GRADS],
              after.allocated[FR_MEM_OPTIM]);
        if (losses)
            CHECK(fabs((double)loss - losses[t]) <= RTOL * fabs(losses[t]),
                  "AdamW step %d loss %.9g, PyTorch %.9g", t + 1, loss, losses[t]);
        if (t > 0) continue;
        if (want_loss)
            CHECK(fabs((double)loss - *want_loss) <= RTOL * fabs(*want_loss),
                  "loss %.9g, PyTorch %.9g", loss, *want_loss);
        compare(r, "train.logits", s->ex.ptr[s->g.logits], (int64_t)r->batch * r->T * r->vocab);
        char nm[FR_ST_NAME_MAX + 16];
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!is_adapter(p)) continue;
            snprintf(nm, sizeof nm, "grad.%s", p->name);
            compare(r, nm, fr_grad32(m, p), fr_shape_numel(&p->shape));
        }
    }
    for (size_t i = 0; i < m->n_params; i++)
        if (is_adapter(&m->params[i])) compare_weights(r, &m->params[i]);
    /* the base: the same bytes (every base parameter lies in the block) */
    int same = 1;
    for (size_t i = 0; base && i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (is_adapter(p)) continue;
        size_t b = (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
        if (memcmp((char *)base + p->off, p->data, b)) {
            same = 0;
            CHECK(0, "base parameter %s changed in training", p->name);
        }
    }
    CHECK(base && same, "the base's bytes unchanged");
    free(base);
    teardown(s);
}

/* Two runs that must agree bit for bit (steps 1: loss and gradients; more:
 * losses and weights), or within float rounding (tol > 0). */
static void agree(fr_ctx *ctx, const ref *r, const char *what, run_opts a, run_opts b, int steps,
                  double tol) {
    fr_step *sa = setup(ctx, r, a), *sb = setup(ctx, r, b);
    if (!sa || !sb) goto done;
    if (a.ckpt != b.ckpt) {
        fr_plan_info ia, ib;
        fr_step_plan_info(sa, &ia);
        fr_step_plan_info(sb, &ib);
        CHECK(ia.recomputed_units == 0 && ib.recomputed_units > 0, "%s: %d then %d units remade",
              what, ia.recomputed_units, ib.recomputed_units);
    }
    if (a.keep_grads != b.keep_grads)
        CHECK(sa->opt.n_fused == 0 && sb->opt.n_fused > 0, "%s: %d then %d stepped in backward",
              what, sa->opt.n_fused, sb->opt.n_fused);
    for (int t = 0; t < steps; t++) {
        float la = NAN, lb = NAN;
        if (!run(ctx, r, sa, &la) || !run(ctx, r, sb, &lb)) goto done;
        CHECK(tol > 0 ? fabs((double)la - lb) <= tol * fabs(la) : !memcmp(&la, &lb, sizeof la),
              "%s: step %d loss %.9g vs %.9g", what, t + 1, la, lb);
    }
    for (size_t i = 0; i < sa->m->n_params; i++) {
        const fr_param *pa = &sa->m->params[i], *pb = &sb->m->params[i];
        if (!is_adapter(pa)) continue;
        int64_t n = fr_shape_numel(&pa->shape);
        const float *x = steps == 1 ? fr_grad32(sa->m, pa) : pa->data;
        const float *y = steps == 1 ? fr_grad32(sb->m, pb) : pb->data;
        if (!x || !y) {
            CHECK(0, "%s: %s: nothing to compare", what, pa->name);
            continue;
        }
        if (tol > 0) {
            double worst = 0, scale = max_abs(x, n);
            for (int64_t k = 0; k < n; k++) worst = fmax(worst, fabs((double)x[k] - y[k]));
            CHECK(worst <= tol * scale, "%s: %s differs by %.3g (largest %.3g)", what, pa->name,
                  worst, scale);
        } else {
            CHECK(!memcmp(x, y, (size_t)n * 4), "%s: %s differs", what, pa->name);
        }
    }
done:
    teardown(sa);
    teardown(sb);
}

static void test_identities(fr_ctx *ctx, const ref *r) {
    agree(ctx, r, "checkpoint all vs none", (run_opts){FR_CKPT_NONE, 1, 0, 0.0},
          (run_opts){FR_CKPT_ALL, 1, 0, 0.0}, 1, 0);
    agree(ctx, r, "dropout 0.1, checkpoint all vs none", (run_opts){FR_CKPT_NONE, 1, 0, 0.1},
          (run_opts){FR_CKPT_ALL, 1, 0, 0.1}, 1, 0);
    agree(ctx, r, "AdamW inside backward vs after it", (run_opts){FR_CKPT_NONE, 1, 0, 0.0},
          (run_opts){FR_CKPT_NONE, 0, 0, 0.0}, STEPS, 0);
    agree(ctx, r, "micro-batches of 1 vs one batch", (run_opts){FR_CKPT_NONE, 1, 0, 0.0},
          (run_opts){FR_CKPT_NONE, 1, 1, 0.0}, 1, 1e-5);
    agree(ctx, r, "micro-batches of 1, checkpoint all vs none", (run_opts){FR_CKPT_NONE, 1, 1, 0.0},
          (run_opts){FR_CKPT_ALL, 1, 1, 0.0}, 1, 0);
    /* dropout acts: its loss is not the plain one */
    fr_step *a = setup(ctx, r, (run_opts){FR_CKPT_NONE, 1, 0, 0.0});
    fr_step *b = setup(ctx, r, (run_opts){FR_CKPT_NONE, 1, 0, 0.5});
    float la = 0, lb = 0;
    if (a && b && run(ctx, r, a, &la) && run(ctx, r, b, &lb))
        CHECK(la != lb, "adapter dropout 0.5 changes the loss (%.9g, %.9g)", la, lb);
    teardown(a);
    teardown(b);
}

/* A base's weights loaded over a model with adapters keep their init. */
static void test_init(fr_ctx *ctx, const ref *r) {
    fr_model *m = lora_model(ctx, r, 0.0, 0);
    if (!m) return;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!is_adapter(p)) continue;
        int64_t n = fr_shape_numel(&p->shape);
        const float *v = p->data;
        double bound = 1.0 / sqrt((double)p->shape.d[1]), most = max_abs(v, n);
        if (p->role == FR_P_LORA_B)
            CHECK(most == 0.0, "%s: B is zeros (largest %g)", p->name, most);
        else
            CHECK(most > 0.25 * bound && most <= bound,
                  "%s: A within +-1/sqrt(%lld) = %g, not zero: largest %g", p->name,
                  (long long)p->shape.d[1], bound, most);
    }
    fr_model_free(m);
}

static void expect_refused(fr_ctx *ctx, const char *model, const char *freeze, const char *spec,
                           const char *needle) {
    fr_model *m = fr_model_load(ctx, model);
    CHECK(m != NULL, "load %s: %s", model, fr_last_error(ctx));
    if (!m) return;
    size_t n0 = m->n_params;
    fr_status st = freeze ? fr_model_freeze(m, freeze) : FR_OK;
    if (!st) st = fr_model_lora_spec(m, spec, 1);
    CHECK(st != FR_OK && strstr(fr_last_error(ctx), needle),
          "--lora %s: status %d, message '%s' (wanted '%s')", spec, st, fr_last_error(ctx), needle);
    CHECK(m->n_params == n0 && m->lora.r == 0, "--lora %s: the model changed", spec);
    fr_model_free(m);
}

static void test_bad_input(fr_ctx *ctx) {
    char gpt[600];
    path_of(gpt, sizeof gpt, "gpt_small.model");
    expect_refused(ctx, gpt, NULL, "r=4,target=attn.c_atn",
                   "target 'attn.c_atn' matches no linear layer");
    expect_refused(ctx, gpt, NULL, "r=4,target=attn.c_attn,ln_1", "a layernorm layer");
    /* c_proj is 32 x 32, c_attn 96 x 32: r 33 is past c_proj's smaller side */
    expect_refused(ctx, gpt, NULL, "r=33,target=attn.c_proj",
                   "layer transformer.h.0.attn.c_proj is 32 x 32 (out x in): the rank can be at "
                   "most 32");
    expect_refused(ctx, gpt, "transformer.h.0", "r=4,target=c_fc", "drop --freeze");
    expect_refused(ctx, gpt, NULL, "r=0,target=c_fc", "r=0");
    expect_refused(ctx, gpt, NULL, "r=4,alpha=-1,target=c_fc", "alpha=-1");
    expect_refused(ctx, gpt, NULL, "r=4,dropout=1,target=c_fc", "dropout=1");
    expect_refused(ctx, gpt, NULL, "r=4,rank=2,target=c_fc", "unknown key 'rank'");
    expect_refused(ctx, gpt, NULL, "r=4", "target= (the layers to adapt, last) is missing");
    expect_refused(ctx, gpt, NULL, "alpha=2,target=c_fc", "r= (the rank) is missing");
    expect_refused(ctx, gpt, NULL, "r=x,target=c_fc", "r=x: expected a number");
    /* the largest rank is accepted; a glob adapts the four layers of block 1 */
    fr_model *m = fr_model_load(ctx, gpt);
    if (m) {
        size_t n0 = m->n_params;
        fr_status st = fr_model_lora_spec(m, "r=32,target=transformer.h.1.*", 1);
        CHECK(st == FR_OK && m->n_params == n0 + 8, "r = min(out, in) = 32 on block 1: %s",
              st ? fr_last_error(ctx) : "ok");
        fr_model_free(m);
    }
}

/* The CNN's classifier adapted alone: a step trains only its adapters. */
static void test_cnn_head(fr_ctx *ctx) {
    fr_model *m = fr_model_load(ctx, "cnn");
    CHECK(m != NULL, "cnn: %s", fr_last_error(ctx));
    if (!m) return;
    fr_status st = fr_model_lora_spec(m, "r=2,alpha=4,target=fc2", 7);
    CHECK(st == FR_OK, "cnn --lora target=fc2: %s", fr_last_error(ctx));
    fr_step_opts so = {.batch = 4,
                       .training = 1,
                       .optim = fr_optim_defaults(FR_OPTIM_ADAMW),
                       .seed = 1,
                       .keep_grads = 1};
    so.optim.zero_grad_to_none = 0;
    fr_step *s = st ? NULL : fr_step_compile(m, &so);
    CHECK(s != NULL, "cnn compile: %s", fr_last_error(ctx));
    if (s) {
        float x[4 * 28 * 28];
        int32_t y[4] = {1, 3, 5, 7};
        for (int i = 0; i < 4 * 28 * 28; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
        int a = -1, bi = -1;
        for (size_t i = 0; i < m->n_params; i++) {
            if (m->params[i].role == FR_P_LORA_A) a = (int)i;
            if (m->params[i].role == FR_P_LORA_B) bi = (int)i;
        }
        CHECK(a >= 0 && bi >= 0 && !strcmp(m->params[a].name, "fc2.lora_A.weight") &&
                  m->params[a].shape.d[0] == 2 && m->params[a].shape.d[1] == 128 &&
                  m->params[bi].shape.d[0] == 10 && m->params[bi].shape.d[1] == 2,
              "fc2's adapters: A (2, 128), B (10, 2)");
        fr_batch b = {.n = 4, .x = x, .y = y};
        float loss;
        float b0 = a >= 0 ? ((float *)m->params[bi].data)[0] : 1;
        st = fr_step_run(s, &b, &loss, NULL);
        CHECK(st == FR_OK && isfinite(loss), "cnn step: %s", st ? fr_last_error(ctx) : "ok");
        int learners = 0;
        for (size_t i = 0; i < m->n_params; i++) learners += fr_step_grad_bytes(s, i) > 0;
        CHECK(learners == 2, "%d tensors learn (fc2's A and B)", learners);
        CHECK(bi >= 0 && ((float *)m->params[bi].data)[0] != b0, "B moved from zero");
        fr_step_free(s);
    }
    fr_model_free(m);
}

/* A forward step's logits of model m on the reference batch (an eval step). */
static float *logits_of(fr_ctx *ctx, const ref *r, fr_model *m) {
    fr_step_opts so = {.batch = r->batch, .training = 0, .seed = 1};
    fr_step *s = fr_step_compile(m, &so);
    CHECK(s != NULL, "eval compile: %s", fr_last_error(ctx));
    if (!s) return NULL;
    float loss, *out = NULL;
    size_t n = (size_t)r->batch * r->T * r->vocab;
    if (run(ctx, r, s, &loss) && (out = malloc(n * sizeof *out)))
        memcpy(out, s->ex.ptr[s->g.logits], n * sizeof *out);
    fr_step_free(s);
    return out;
}

static fr_model *base_model(fr_ctx *ctx) {
    char path[600];
    path_of(path, sizeof path, "gpt_small.model");
    fr_model *m = fr_model_load(ctx, path);
    path_of(path, sizeof path, "gpt_small.safetensors");
    if (m && fr_model_load_weights(m, path)) {
        CHECK(0, "base weights: %s", fr_last_error(ctx));
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* PEFT's files (make_lora_ref.py wrote them as PEFT's save_pretrained names
 * them): loaded, the forward is PyTorch's; merged, W + (alpha/r) B A within
 * 1e-6 of a float64 product and the merged model's logits the adapted
 * model's; saved and loaded back bit for bit; bad files refused by name. */
static void test_files(fr_ctx *ctx, const ref *r) {
    char dir[600], tmp[700], path[800];
    path_of(dir, sizeof dir, "lora_small_adapter");
    fr_model *m = base_model(ctx);
    if (!m) return;
    fr_status st = fr_adapter_apply(m, dir, 1);
    CHECK(st == FR_OK && m->lora.r == 4 && m->lora.alpha == 8.0, "--adapter %s: %s", dir,
          st ? fr_last_error(ctx) : "ok");
    float *lz = st ? NULL : logits_of(ctx, r, m);
    if (lz) compare(r, "train.logits", lz, (int64_t)r->batch * r->T * r->vocab);
    /* merged weights against float64 */
    for (size_t li = 0; !st && li < m->n_layers; li++) {
        const fr_layer *l = &m->layers[li];
        if (!l->lora) continue;
        const fr_param *W = &m->params[l->wparam], *A = &m->params[l->lora_a],
                       *B = &m->params[l->lora_b];
        int64_t O = W->shape.d[0], K = W->shape.d[1], R = A->shape.d[0];
        float *w = malloc((size_t)(O * K) * sizeof *w);
        if (!w) continue;
        fr_adapter_merged(m, (int)li, w);
        double worst = 0;
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                double v = ((const float *)W->data)[o * K + k];
                for (int64_t q = 0; q < R; q++)
                    v += 2.0 * ((const float *)B->data)[o * R + q] *
                         ((const float *)A->data)[q * K + k];
                worst = fmax(worst, fabs(v - w[o * K + k]));
            }
        CHECK(worst <= 1e-6, "%s merged: off the float64 W + (alpha/r) B A by %.3g", l->name,
              worst);
        free(w);
    }
    snprintf(tmp, sizeof tmp, "%s/lora_test_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    mkdir(tmp, 0700);
    snprintf(path, sizeof path, "%s/merged.safetensors", tmp);
    if (!st) {
        st = fr_adapter_merge_save(m, path);
        CHECK(st == FR_OK, "merge: %s", fr_last_error(ctx));
        char mp[600];
        path_of(mp, sizeof mp, "gpt_small.model");
        fr_model *mm = fr_model_load(ctx, mp);
        if (mm && !st && !(st = fr_model_load_weights(mm, path))) {
            float *mz = logits_of(ctx, r, mm);
            double worst = 0, most = 0;
            for (int64_t i = 0; lz && mz && i < (int64_t)r->batch * r->T * r->vocab; i++)
                worst = fmax(worst, fabs((double)mz[i] - lz[i])), most = fmax(most, fabs(lz[i]));
            CHECK(mz && lz && worst <= 1e-5 * most,
                  "the merged model's logits off the adapted model's by %.3g (largest %.3g)", worst,
                  most);
            free(mz);
        } else {
            CHECK(0, "the merged file loads into the plain model: %s", fr_last_error(ctx));
        }
        fr_model_free(mm);
    }
    free(lz);
    /* saved and loaded back: the same bits */
    snprintf(path, sizeof path, "%s/saved", tmp);
    if (!st) st = fr_adapter_save(m, path);
    CHECK(st == FR_OK, "save: %s", fr_last_error(ctx));
    fr_model *b = base_model(ctx);
    if (b && !st) {
        st = fr_adapter_apply(b, path, 9);
        CHECK(st == FR_OK && b->n_params == m->n_params, "load the saved: %s",
              st ? fr_last_error(ctx) : "ok");
        for (size_t i = 0; !st && i < m->n_params; i++)
            if (is_adapter(&m->params[i]))
                CHECK(!memcmp(m->params[i].data, b->params[i].data,
                              (size_t)fr_shape_numel(&m->params[i].shape) * 4),
                      "%s saved and loaded differs", m->params[i].name);
    }
    fr_model_free(b);
    /* bad files: a rank, a base dimension, a name, the config's r */
    snprintf(path, sizeof path, "%s/saved/adapter_model.safetensors", tmp);
    fr_st_entry e[16];
    int n = 0;
    for (size_t i = 0; i < m->n_params && n < 16; i++) {
        const fr_param *p = &m->params[i];
        if (!is_adapter(p)) continue;
        if (snprintf(e[n].name, sizeof e[n].name, "base_model.model.%s", p->name) >=
            (int)sizeof e[n].name)
            continue;
        e[n].dtype = FR_F32, e[n].shape = p->shape, e[n].data = p->data;
        e[n++].nbytes = (size_t)fr_shape_numel(&p->shape) * 4;
    }
    static const struct {
        int entry, what; /* what: 0 in dim - 1, 1 drop the entry, 2 rename */
        const char *needle;
    } bad[] = {{0, 0,
                "lora_A of transformer.h.0.attn.c_attn is (4, 31): the model's layer takes "
                "32 inputs"},
               {3, 1,
                "lora_B of transformer.h.0.attn.c_proj ('base_model.model.transformer.h.0."
                "attn.c_proj.lora_B.weight') is missing"},
               {1, 2,
                "unexpected tensor 'base_model.model.transformer.h.0.attn.c_attn.lora_X."
                "weight'"}};
    for (int t = 0; t < 3 && n == 16; t++) {
        fr_st_entry v[16];
        memcpy(v, e, sizeof v);
        int nv = 16;
        if (bad[t].what == 0) v[bad[t].entry].shape.d[1] -= 1, v[bad[t].entry].nbytes -= 16;
        if (bad[t].what == 1) v[bad[t].entry] = v[--nv];
        if (bad[t].what == 2)
            snprintf(v[bad[t].entry].name, sizeof v[0].name,
                     "base_model.model.transformer.h.0.attn.c_attn.lora_X.weight");
        CHECK(fr_st_write(ctx, path, v, nv, NULL, 0) == FR_OK, "write: %s", fr_last_error(ctx));
        fr_model *q = base_model(ctx);
        if (!q) continue;
        char sdir[800];
        snprintf(sdir, sizeof sdir, "%s/saved", tmp);
        fr_status s2 = fr_adapter_apply(q, sdir, 1);
        CHECK(s2 == FR_ERR_FORMAT && strstr(fr_last_error(ctx), bad[t].needle),
              "bad adapter file %d: '%s' (wanted '%s')", t, fr_last_error(ctx), bad[t].needle);
        fr_model_free(q);
    }
    /* the config's r against the tensors' rank */
    snprintf(path, sizeof path, "%s/saved/adapter_config.json", tmp);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": "
              "[\"c_attn\"]}",
              fp);
        fclose(fp);
    }
    snprintf(path, sizeof path, "%s/saved/adapter_model.safetensors", tmp);
    CHECK(fr_st_write(ctx, path, e, 2, NULL, 0) == FR_OK, "write: %s", fr_last_error(ctx));
    fr_model *q = base_model(ctx);
    if (q) {
        snprintf(path, sizeof path, "%s/saved", tmp);
        fr_status s2 = fr_adapter_apply(q, path, 1);
        CHECK(s2 == FR_ERR_FORMAT &&
                  strstr(fr_last_error(ctx), "lora_A of transformer.h.0.attn.c_attn is (4, 32): "
                                             "rank 4, the config's r is 8"),
              "rank mismatch: '%s'", fr_last_error(ctx));
        fr_model_free(q);
    }
    /* --merge without adapters */
    q = base_model(ctx);
    if (q) {
        fr_status s2 = fr_adapter_merge_save(q, "/nonexistent/x.safetensors");
        CHECK(s2 == FR_ERR_ARG && strstr(fr_last_error(ctx), "--merge") &&
                  strstr(fr_last_error(ctx), "no LoRA adapters"),
              "--merge without adapters: '%s'", fr_last_error(ctx));
        fr_model_free(q);
    }
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "remove %s", tmp);
    fr_model_free(m);
}

int main(void) {
    src_dir = getenv("FR_SOURCE_DIR") ? getenv("FR_SOURCE_DIR") : ".";
    fr_ctx *ctx = fr_ctx_new();
    ref r;
    char path[600];
    path_of(path, sizeof path, "lora_small_io.safetensors");
    fr_status st = read_whole(ctx, path, &r.io);
    CHECK(st == FR_OK, "%s: %s", path, fr_last_error(ctx));
    if (!st) {
        const fr_st_entry *x = fr_st_find(&r.io, "x"), *y = fr_st_find(&r.io, "y");
        const fr_st_entry *z = fr_st_find(&r.io, "train.logits");
        if (x && y && z && x->shape.ndim == 2 && z->shape.ndim == 3) {
            r.x = x->data, r.y = y->data;
            r.batch = (int)x->shape.d[0], r.T = (int)x->shape.d[1], r.vocab = (int)z->shape.d[2];
            test_against_torch(ctx, &r);
            test_identities(ctx, &r);
            test_init(ctx, &r);
            test_files(ctx, &r);
        } else {
            CHECK(0, "%s: x, y or train.logits missing", path);
        }
        fr_st_close(ctx, &r.io);
    }
    test_bad_input(ctx);
    test_cnn_head(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
