/* test_api.c — the public API's conventions (the top of include/frugal.h),
 * through frugal.h alone:
 *   - the parse helpers and fr_batch_auto return an fr_status and leave
 *     their message on the context (a NULL context is allowed for parsing);
 *   - fr_step_opts' enums: an fr_optim_state or fr_loss_scaling that is not
 *     one of its values is refused with a message; each value reaches the
 *     engine (optimizer-state bytes from the storage formulas, the loss
 *     scaler's initial scale 2^16 from torch.amp.GradScaler's default);
 *   - what fr_step_compile does to the model, as its comment states:
 *     initialises it, stores pure 16-bit weights in 16 bits, leaves the
 *     optimizer state on the model (kept by fr_step_free, reused by the next
 *     step, freed by fr_model_free). */
#include <math.h>
#include <string.h>
#include <frugal.h>
#include "check.h"

enum { D_IN = 1000, D_OUT = 1000 }; /* one Linear of 10^6 weights, no bias */

static fr_model *linear(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, D_IN, 1, 1);
    if (!m || fr_model_linear(m, D_OUT, 0)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

static size_t cat_bytes(fr_ctx *ctx, fr_mem_cat c) {
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    return st.allocated[c];
}

static void test_precision_parse(void) {
    fr_ctx *ctx = fr_ctx_new();
    const char *names[] = {"fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "auto"};
    const fr_precision want[] = {FR_PREC_FP32,       FR_PREC_BF16,       FR_PREC_FP16,
                                 FR_PREC_BF16_MIXED, FR_PREC_FP16_MIXED, FR_PREC_AUTO};
    for (int i = 0; i < 6; i++) {
        fr_precision p = (fr_precision)-1;
        CHECK(fr_precision_parse(ctx, names[i], &p) == FR_OK && p == want[i], "parse '%s'",
              names[i]);
        CHECK(!strcmp(fr_precision_name(want[i]), names[i]), "name of %d", i);
    }
    const char *bad[] = {"fp8", "", "FP32", "bf16 ", "mixed"};
    for (int i = 0; i < 5; i++) {
        fr_precision p = FR_PREC_BF16;
        char want_msg[160];
        snprintf(want_msg, sizeof want_msg,
                 "unknown precision '%s' (choose fp32, bf16, fp16, bf16-mixed, fp16-mixed or auto)",
                 bad[i]);
        fr_status st = fr_precision_parse(ctx, bad[i], &p);
        CHECK(st == FR_ERR_ARG && p == FR_PREC_BF16 && !strcmp(fr_last_error(ctx), want_msg),
              "parse '%s': status %d, message '%s'", bad[i], (int)st, fr_last_error(ctx));
    }
    fr_precision p;
    CHECK(fr_precision_parse(NULL, "fp8", &p) == FR_ERR_ARG, "parse with no context");
    CHECK(fr_precision_parse(ctx, NULL, &p) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "unknown precision ''"),
          "parse NULL: %s", fr_last_error(ctx));
    fr_optim_kind k;
    CHECK(fr_optim_parse(ctx, "rmsprop", &k) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "'rmsprop'"),
          "fr_optim_parse leaves its message on the context: %s", fr_last_error(ctx));
    fr_ctx_free(ctx);
}

static void test_batch_auto(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = linear(ctx);
    CHECK(m != NULL, "model: %s", fr_last_error(ctx));
    if (!m) {
        fr_ctx_free(ctx);
        return;
    }
    fr_step_opts o = {
        .batch = 1, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .budget = 1024};
    int b = -7;
    fr_status st = fr_batch_auto(m, &o, 64, &b);
    CHECK(st == FR_ERR_BUDGET && b == -7 &&
              strstr(fr_last_error(ctx), "not even a batch of 1 fits"),
          "1 KiB: status %d, batch %d, message '%s'", (int)st, b, fr_last_error(ctx));
    /* weights, gradients and two Adam moments alone are 16 MB: 1 GiB takes the whole range */
    o.budget = (size_t)1 << 30;
    st = fr_batch_auto(m, &o, 64, &b);
    CHECK(st == FR_OK && b == 64, "1 GiB: status %d, batch %d: %s", (int)st, b, fr_last_error(ctx));
    b = -7;
    st = fr_batch_auto(m, &o, 0, &b);
    CHECK(st == FR_ERR_ARG && b == -7 && strstr(fr_last_error(ctx), "max_batch 0"),
          "max_batch 0: status %d, message '%s'", (int)st, fr_last_error(ctx));
    fr_model_free(m);
    fr_ctx_free(ctx);
}

static void test_enum_values(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = linear(ctx);
    CHECK(m != NULL, "model: %s", fr_last_error(ctx));
    if (!m) {
        fr_ctx_free(ctx);
        return;
    }
    fr_step_opts o = {.batch = 4, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM)};
    o.optim_state = (fr_optim_state)3;
    CHECK(!fr_step_compile(m, &o) && strstr(fr_last_error(ctx), "optim_state 3"),
          "optim_state 3 refused: %s", fr_last_error(ctx));
    o.optim_state = FR_OPTIM_STATE_FP32;
    o.loss_scaling = (fr_loss_scaling)2;
    CHECK(!fr_step_compile(m, &o) && strstr(fr_last_error(ctx), "loss_scaling 2"),
          "loss_scaling 2 refused: %s", fr_last_error(ctx));
    o.loss_scaling = (fr_loss_scaling)-2;
    CHECK(!fr_step_compile(m, &o) && strstr(fr_last_error(ctx), "loss_scaling -2"),
          "loss_scaling -2 refused: %s", fr_last_error(ctx));
    CHECK(cat_bytes(ctx, FR_MEM_OPTIM) == 0, "nothing allocated for a refused step");
    fr_model_free(m);

    /* Adam's two moments of n = 10^6 weights: fp32 4n bytes each, bf16 2n,
     * int8 the codes rounded up to 4 bytes plus one float absmax per block
     * of 2048: 10^6 + 4 * ceil(10^6 / 2048) = 10^6 + 4 * 489. */
    const size_t n = (size_t)D_IN * D_OUT;
    const struct {
        fr_optim_state s;
        size_t bytes;
    } states[] = {{FR_OPTIM_STATE_FP32, 2 * 4 * n},
                  {FR_OPTIM_STATE_BF16, 2 * 2 * n},
                  {FR_OPTIM_STATE_INT8, 2 * (n + 4 * 489)}};
    for (int i = 0; i < 3; i++) {
        m = linear(ctx);
        o = (fr_step_opts){.batch = 4,
                           .training = 1,
                           .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                           .optim_state = states[i].s};
        fr_step *s = m ? fr_step_compile(m, &o) : NULL;
        CHECK(s && cat_bytes(ctx, FR_MEM_OPTIM) == states[i].bytes,
              "optim_state %d: %zu optimizer bytes, want %zu: %s", (int)states[i].s,
              cat_bytes(ctx, FR_MEM_OPTIM), states[i].bytes, s ? "" : fr_last_error(ctx));
        fr_step_free(s);
        fr_model_free(m);
    }

    /* torch.amp.GradScaler starts at 2^16; without a scaler the scale is 1 */
    const struct {
        fr_precision p;
        fr_loss_scaling ls;
        float scale;
    } scal[] = {{FR_PREC_FP16_MIXED, FR_LOSS_SCALE_AUTO, 65536.0f},
                {FR_PREC_FP16, FR_LOSS_SCALE_AUTO, 65536.0f},
                {FR_PREC_FP32, FR_LOSS_SCALE_AUTO, 1.0f},
                {FR_PREC_BF16_MIXED, FR_LOSS_SCALE_AUTO, 1.0f},
                {FR_PREC_FP32, FR_LOSS_SCALE_DYNAMIC, 65536.0f},
                {FR_PREC_FP16_MIXED, FR_LOSS_SCALE_NONE, 1.0f}};
    for (int i = 0; i < 6; i++) {
        m = linear(ctx);
        o = (fr_step_opts){.batch = 4,
                           .training = 1,
                           .optim = fr_optim_defaults(FR_OPTIM_SGD),
                           .precision = scal[i].p,
                           .loss_scaling = scal[i].ls};
        fr_step *s = m ? fr_step_compile(m, &o) : NULL;
        float scale = NAN;
        if (s) fr_step_scaler(s, &scale, NULL);
        CHECK(s && scale == scal[i].scale, "%s, loss_scaling %d: scale %g, want %g: %s",
              fr_precision_name(scal[i].p), (int)scal[i].ls, scale, scal[i].scale,
              s ? "" : fr_last_error(ctx));
        fr_step_free(s);
        fr_model_free(m);
    }
    fr_ctx_free(ctx);
}

/* What fr_step_compile's comment in frugal.h says it does to the model. */
static void test_compile_effects(void) {
    fr_ctx *ctx = fr_ctx_new();
    const size_t n = (size_t)D_IN * D_OUT;
    const fr_precision precs[] = {FR_PREC_FP32, FR_PREC_BF16, FR_PREC_FP16};
    for (int i = 0; i < 3; i++) {
        fr_model *m = linear(ctx);
        CHECK(m && cat_bytes(ctx, FR_MEM_PARAMS) == 0, "no weights before compiling: %zu bytes",
              cat_bytes(ctx, FR_MEM_PARAMS));
        fr_step_opts o = {.batch = 4,
                          .training = 1,
                          .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                          .precision = precs[i]};
        fr_step *s = m ? fr_step_compile(m, &o) : NULL;
        const size_t wbytes =
            (i ? 2 : 4) * n;              /* pure fp16/bf16: the weights themselves in 16 bits */
        const size_t obytes = 2 * wbytes; /* Adam's two moments, in the weights' format */
        CHECK(s && cat_bytes(ctx, FR_MEM_PARAMS) == wbytes &&
                  cat_bytes(ctx, FR_MEM_OPTIM) == obytes,
              "%s: weights %zu bytes (want %zu), optimizer %zu (want %zu): %s",
              fr_precision_name(precs[i]), cat_bytes(ctx, FR_MEM_PARAMS), wbytes,
              cat_bytes(ctx, FR_MEM_OPTIM), obytes, s ? "" : fr_last_error(ctx));
        fr_step_free(s);
        CHECK(cat_bytes(ctx, FR_MEM_PARAMS) == wbytes && cat_bytes(ctx, FR_MEM_OPTIM) == obytes,
              "%s: fr_step_free leaves the weights and the optimizer state to the model",
              fr_precision_name(precs[i]));
        s = m ? fr_step_compile(m, &o) : NULL;
        CHECK(s && cat_bytes(ctx, FR_MEM_OPTIM) == obytes,
              "%s: the next step reuses the state: %zu bytes", fr_precision_name(precs[i]),
              cat_bytes(ctx, FR_MEM_OPTIM));
        fr_step_free(s);
        fr_model_free(m);
        CHECK(cat_bytes(ctx, FR_MEM_PARAMS) == 0 && cat_bytes(ctx, FR_MEM_OPTIM) == 0,
              "%s: fr_model_free frees both", fr_precision_name(precs[i]));
    }
    fr_ctx_free(ctx);
}

int main(void) {
    test_precision_parse();
    test_batch_auto();
    test_enum_values();
    test_compile_effects();
    return check_done();
}
