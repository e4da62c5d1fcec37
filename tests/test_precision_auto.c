/* test_precision_auto.c — --precision auto weighs bf16-mixed against fp32
 * at the GEMM rates it is given (FRUGAL_GEMM_RATES, so that nothing here
 * depends on the host or spends the probe's 0.2 s): its estimate for a small
 * MLP equals the FLOPs summed by hand from the layer shapes; a GEMM-heavy
 * MLP gets bf16-mixed, smaller and faster, when bf16 GEMMs run twice the f32
 * rate, and fp32 when bf16 is not native, slower, or too little faster to
 * pay for the casts; a convolutional net gets bf16-mixed where bf16
 * convolutions run native here (oneDNN's primitives) and keeps fp32
 * elsewhere (its linear layer's share is small); its share counts, by hand,
 * the convolutions whose image is an activation (the batch's stays f32); a
 * precision given explicitly is never changed; the plan says why; a frozen
 * int8 layer's GEMMs (QLINEAR) count in the GEMM share, by hand. */
/* open_memstream: POSIX 2008 (the build defines _GNU_SOURCE) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/conv_dnnl.h"
#include "backend/cpu/gemm16.h"
#include "check.h"
#include "run/planner.h"
#include "train/step.h"

#define CAST_SHARE 0.10 /* planner.c's measured share of the casts */
#define BUDGET ((size_t)1 << 30)

static fr_model *mlp(fr_ctx *ctx, int in, int hidden, int layers) {
    fr_model *m = fr_model_new(ctx, in, 1, 1);
    for (int i = 0; i < layers; i++) {
        fr_model_linear(m, hidden, 1);
        fr_model_relu(m);
    }
    fr_model_linear(m, 10, 1);
    return m;
}

static fr_model *convnet(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 3, 16, 16);
    fr_model_conv2d(m, 16, 3, 1, 1, 0);
    fr_model_relu(m);
    fr_model_conv2d(m, 16, 3, 1, 1, 0);
    fr_model_relu(m);
    fr_model_maxpool2d(m, 2, 2);
    fr_model_flatten(m);
    fr_model_linear(m, 10, 1);
    return m;
}

/* (4,8,8) -> conv 8 k3 p1 -> conv 8 k3 p1 -> flatten -> linear 10 */
static fr_model *two_convs(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 4, 8, 8);
    fr_model_conv2d(m, 8, 3, 1, 1, 0);
    fr_model_conv2d(m, 8, 3, 1, 1, 0);
    fr_model_flatten(m);
    fr_model_linear(m, 10, 1);
    return m;
}

static fr_step_opts opts(int batch, fr_precision p, fr_ckpt_mode mode, size_t budget) {
    return (fr_step_opts){.batch = batch,
                          .training = 1,
                          .optim = fr_optim_defaults(FR_OPTIM_SGD),
                          .checkpoint = mode,
                          .precision = p,
                          .budget = budget};
}

/* 64 -> 32 (ReLU) -> 10, batch 8, cross-entropy, by the op table's counts
 * (a multiply-add is 2, a linear layer's backward twice its forward, ReLU
 * and its backward a FLOP a value, the loss and its backward 8 a logit):
 *   linear: 6 B (64 32 + 32 10)   others: 2 B 32 + 16 B 10 */
static void hand_estimate(void) {
    const double B = 8, lin = 6 * B * (64 * 32 + 32 * 10), other = 2 * B * 32 + 16 * B * 10;
    const double share = lin / (lin + other);
    const double want = CAST_SHARE - share * (1 - 100.0 / 200.0);
    setenv("FRUGAL_GEMM_RATES", "100,200", 1);
    fr_precision precs[2] = {FR_PREC_FP32, FR_PREC_BF16_MIXED};
    for (int q = 0; q < 2; q++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = mlp(ctx, 64, 32, 1);
        fr_step_opts o = opts(8, precs[q], FR_CKPT_NONE, 0);
        fr_step *s = fr_step_build(m, &o);
        CHECK(s != NULL, "build: %s", fr_last_error(ctx));
        if (s) {
            fr_mixed_estimate e;
            fr_plan_mixed_estimate(s, &e);
            CHECK(fabs(e.linear_share - share) < 1e-12, "%s: linear share %.15g, by hand %.15g",
                  fr_precision_name(precs[q]), e.linear_share, share);
            CHECK(e.f32 == 100 && e.bf16 == 200 && e.from_env, "rates %g %g from env %d", e.f32,
                  e.bf16, e.from_env);
            CHECK(fabs(e.cost - want) < 1e-12, "%s: cost %.15g, by hand %.15g",
                  fr_precision_name(precs[q]), e.cost, want);
            fr_step_free(s);
        }
        fr_model_free(m);
        fr_ctx_free(ctx);
    }
    /* not native: the casts alone */
    setenv("FRUGAL_GEMM_RATES", "100,0", 1);
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = mlp(ctx, 64, 32, 1);
    fr_step_opts o = opts(8, FR_PREC_FP32, FR_CKPT_NONE, 0);
    fr_step *s = fr_step_build(m, &o);
    if (s) {
        fr_mixed_estimate e;
        fr_plan_mixed_estimate(s, &e);
        CHECK(e.cost == CAST_SHARE, "bf16 0: cost %g, want the casts' %g", e.cost, CAST_SHARE);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* 64 -> 32 (ReLU) -> 32 (ReLU) -> 10, batch 8, the middle linear layer
 * frozen and stored in int8 (QLINEAR): its GEMMs are bf16 GEMMs under
 * bf16-mixed too (its kernel dequantizes into bf16 panels), so they count in
 * the share. By hand: the trainable layers 6 B (64 32 + 32 10); the frozen
 * one its forward 2 B 32 32 and its backward dx alone 2 B 32 32 (layer 0
 * below it trains); ReLUs 2 B 32 each, the loss 16 B 10. */
static void hand_estimate_quantized(void) {
    const double B = 8, lin = 6 * B * (64 * 32 + 32 * 10) + 4 * B * 32 * 32;
    const double other = 2 * 2 * B * 32 + 16 * B * 10, share = lin / (lin + other);
    setenv("FRUGAL_GEMM_RATES", "100,200", 1);
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = mlp(ctx, 64, 32, 2);
    CHECK(fr_model_freeze(m, "2") == FR_OK, "freeze: %s", fr_last_error(ctx));
    fr_step_opts o = opts(8, FR_PREC_FP32, FR_CKPT_NONE, 0);
    o.base_precision = FR_BASE_INT8;
    fr_step *s = fr_step_build(m, &o);
    CHECK(s != NULL, "build: %s", fr_last_error(ctx));
    if (s) {
        int q = 0;
        for (int i = 0; i < s->plan.n_nodes; i++)
            q += s->g.nodes[s->plan.order[i]].op == FR_OP_QLINEAR ||
                 s->g.nodes[s->plan.order[i]].op == FR_OP_QLINEAR_BWD;
        CHECK(q == 2, "the frozen int8 layer runs QLINEAR and QLINEAR_BWD: %d such nodes", q);
        fr_mixed_estimate e;
        fr_plan_mixed_estimate(s, &e);
        CHECK(fabs(e.linear_share - share) < 1e-12,
              "quantized layer: linear share %.15g, by hand %.15g", e.linear_share, share);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* two_convs at batch B, by the op table's counts: a convolution 2 a
 * multiply-add forward (out 8 x 64 values an image, 36 and 72 of them each),
 * its backward 4 (dx counted or not); the linear layer 2 B 512 10 and its
 * backward twice that; the loss 8 B 10 each way. The share that gains is
 * the second convolution's (its image an activation) and the linear
 * layer's where bf16 images run native, the linear layer's alone elsewhere. */
static void hand_estimate_convs(void) {
    const double B = 8, c1 = 6 * B * 512 * 36, c2 = 6 * B * 512 * 72, lin = 6 * B * 512 * 10;
    const double all = c1 + c2 + lin + 16 * B * 10;
    const int native = fr_conv_dnnl_for(FR_BF16);
    const double share = ((native ? c2 : 0) + lin) / all;
    setenv("FRUGAL_GEMM_RATES", "100,200", 1);
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = two_convs(ctx);
    fr_step *s = fr_step_build(m, &(fr_step_opts){.batch = 8,
                                                  .training = 1,
                                                  .optim = fr_optim_defaults(FR_OPTIM_SGD),
                                                  .checkpoint = FR_CKPT_NONE});
    CHECK(s != NULL, "build: %s", fr_last_error(ctx));
    if (s) {
        fr_mixed_estimate e;
        fr_plan_mixed_estimate(s, &e);
        CHECK(fabs(e.linear_share - share) < 1e-12,
              "two convolutions (%s): share %.15g, by hand %.15g",
              native ? "native bf16" : "not native", e.linear_share, share);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* The precision the planner picks at batch 512 under a budget everything
 * fits, with the rates given (at 512 the halved activations outweigh the
 * 16-bit weight copies and the bf16 GEMM scratch: at 64 the wide MLP's
 * bf16-mixed plan reserves 2.75 MB against fp32's 2.21, and wins on time
 * alone, within the budget); *reserved its reserved bytes. With text, the plan's
 * description must contain it. */
static fr_precision pick(fr_model *(*make)(fr_ctx *), const char *rates, fr_precision asked,
                         size_t *reserved, const char *text) {
    setenv("FRUGAL_GEMM_RATES", rates, 1);
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = make(ctx);
    fr_step_opts o = opts(512, asked, FR_CKPT_AUTO, BUDGET);
    fr_plan_need need;
    fr_step *s = fr_step_plan_choose(m, &o, &need);
    CHECK(s != NULL, "rates %s: %s", rates, fr_last_error(ctx));
    fr_precision p = s ? s->o.precision : FR_PREC_AUTO;
    if (s) {
        fr_plan_info info;
        fr_step_plan_info(s, &info);
        if (reserved) *reserved = info.reserved;
        if (text) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            fr_step_describe_plan(s, f, 0);
            fclose(f);
            CHECK(buf && strstr(buf, text), "rates %s: the plan does not say \"%s\":\n%s", rates,
                  text, buf ? buf : "");
            free(buf);
        }
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
    return p;
}

static fr_model *wide_mlp(fr_ctx *ctx) { return mlp(ctx, 256, 512, 2); }
static fr_model *small_mlp(fr_ctx *ctx) { return mlp(ctx, 64, 32, 1); }

static void choices(void) {
    size_t r16 = 0, r32 = 0;
    /* the GEMMs are nearly all of the MLP's FLOPs: bf16 wins once its
     * GEMM gain (share (1 - f32/bf16), share about 0.99) beats the casts'
     * 0.10, at bf16 of about 111 against f32 100 */
    CHECK(pick(wide_mlp, "100,200", FR_PREC_AUTO, &r16, NULL) == FR_PREC_BF16_MIXED,
          "bf16 twice f32: bf16-mixed");
    CHECK(pick(wide_mlp, "100,125", FR_PREC_AUTO, NULL, NULL) == FR_PREC_BF16_MIXED,
          "bf16 1.25x f32: bf16-mixed");
    CHECK(pick(wide_mlp, "100,105", FR_PREC_AUTO, NULL, NULL) == FR_PREC_FP32,
          "bf16 1.05x f32 does not pay for the casts: fp32");
    CHECK(pick(wide_mlp, "100,80", FR_PREC_AUTO, NULL, NULL) == FR_PREC_FP32, "bf16 slower: fp32");
    CHECK(pick(wide_mlp, "100,0", FR_PREC_AUTO, &r32, NULL) == FR_PREC_FP32,
          "bf16 not native: fp32");
    /* smaller where the GEMMs take 16-bit copies of the weights; elsewhere
     * each reader gets a rounded f32 copy, and the wide MLP's weights are
     * most of its plan; and where oneDNN emulates bf16 (FRUGAL_GEMM16=1 on a
     * CPU without it) its matmul asks a scratchpad of 8 bytes an output for
     * the forward (2 MiB for the 512x512 layers at batch 512, queried with
     * fr_k_linear_gemm16_ws; 0 where bf16 is native), which outweighs the
     * halved activations */
    if (fr_gemm16_native(FR_BF16))
        CHECK(r16 < r32, "bf16-mixed's plan is smaller: %zu against fp32's %zu", r16, r32);
    else
        printf("# bf16 GEMMs not native here: bf16-mixed's plan %zu, fp32's %zu (not compared)\n",
               r16, r32);
    /* given explicitly, fp32 stays fp32 */
    CHECK(pick(wide_mlp, "100,200", FR_PREC_FP32, NULL, NULL) == FR_PREC_FP32, "fp32 as asked");
    /* the convolutions gain where bf16 images run native (nearly all the
     * FLOPs), else nothing (the linear layer's share is small) */
    if (fr_conv_dnnl_for(FR_BF16))
        CHECK(pick(convnet, "100,200", FR_PREC_AUTO, NULL, NULL) == FR_PREC_BF16_MIXED,
              "convolutional net, native bf16 convolutions: bf16-mixed");
    else
        CHECK(pick(convnet, "100,200", FR_PREC_AUTO, NULL, NULL) == FR_PREC_FP32,
              "convolutional net, bf16 convolutions emulated: fp32");

    /* the plan says why, with the ratio of hand_estimate's model (batch 512
     * here: the shares do not depend on the batch) */
    const double lin = 6.0 * (64 * 32 + 32 * 10), other = 2.0 * 32 + 16.0 * 10;
    const double share = lin / (lin + other);
    char want[160];
    snprintf(want, sizeof want,
             "%.2fx the step's time: the native bf16 products (%.1f%% of the FLOPs) at 200 "
             "GFLOP/s bf16 against 100 f32 (FRUGAL_GEMM_RATES)",
             1 + CAST_SHARE - share * 0.5, 100 * share);
    CHECK(pick(small_mlp, "100,200", FR_PREC_AUTO, NULL, want) == FR_PREC_BF16_MIXED,
          "small MLP: bf16-mixed");
    snprintf(want, sizeof want, "%.2fx the step's time: FRUGAL_GEMM_RATES gives bf16 0",
             1 + CAST_SHARE);
    CHECK(pick(small_mlp, "100,0", FR_PREC_AUTO, NULL, want) == FR_PREC_FP32, "small MLP: fp32");
}

int main(void) {
    hand_estimate();
    hand_estimate_quantized();
    hand_estimate_convs();
    choices();
    unsetenv("FRUGAL_GEMM_RATES");
    return check_done();
}
