/* test_precision.c — mixed and pure half precision, the loss scaler inside a
 * step, and gradient clipping.
 *  - bf16-mixed/fp16-mixed store every saved activation in 16 bits (the plan's
 *    activation bytes fall by at least 45% on a conv net) and their gradients
 *    stay within the error a 16-bit format implies: each saved value carries
 *    a relative rounding error of at most u = 2^-9 (bf16) or 2^-12 (fp16);
 *    we allow a relative L2 error of 16 u per gradient tensor.
 *  - with fp32 and a power-of-two loss scale, scaling and unscaling are exact:
 *    the weights after a step equal those without a scaler, bit for bit;
 *  - a forced inf gradient skips exactly that step: weights and optimizer
 *    state untouched, the scale halves, the next step trains;
 *  - a mixed linear net's loss and gradients equal a float64 reference with
 *    16-bit-rounded weights and hidden values (and differ from unrounded);
 *  - clipping brings the global norm to max_norm (computed here in float64);
 *  - pure bf16 stores weights in 16 bits and still trains. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "optim/optim.h"
#include "backend/backend.h"
#include "backend/cpu/gemm16.h"
#include "check.h"
#include "model/modelfile.h"
#include "core/half.h"
#include "core/rng.h"
#include "train/step.h"

static fr_model *convnet(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 2, 12, 12);
    fr_model_conv2d(m, 6, 3, 1, 1, 0); /* no bias before BatchNorm: its gradient is 0 */
    fr_model_batchnorm(m);
    fr_model_relu(m);
    fr_model_maxpool2d(m, 2, 2);
    fr_model_conv2d(m, 8, 3, 1, 1, 1);
    fr_model_gelu(m);
    fr_model_flatten(m);
    fr_model_linear(m, 16, 1);
    fr_model_tanh(m);
    fr_model_linear(m, 10, 1);
    return m;
}

/* A residual net: the first ReLU's output feeds the block's convolution
 * (which reads it rounded) and the identity shortcut's add (which needs the
 * f32 value), so it must stay f32 with a saved 16-bit copy; the block's
 * GELU feeds only a convolution, so it writes its 16-bit value directly.
 * With checkpoint = 1 the block is recomputed in backward. */
static fr_model *resnet_small(fr_ctx *ctx, int checkpoint) {
    fr_model *m = fr_model_new(ctx, 2, 12, 12);
    fr_model_conv2d(m, 8, 3, 1, 1, 1);
    fr_model_relu(m);
    fr_model_residual_begin(m);
    fr_model_conv2d(m, 8, 3, 1, 1, 1);
    fr_model_gelu(m);
    fr_model_conv2d(m, 8, 3, 1, 1, 1);
    fr_model_residual_end(m);
    if (checkpoint) fr_model_checkpoint_last(m);
    fr_model_relu(m);
    fr_model_avgpool2d(m, 2, 2); /* not max pooling: rounding makes ties that reroute gradients */
    fr_model_flatten(m);
    fr_model_linear(m, 10, 1);
    return m;
}

typedef struct run {
    fr_ctx *ctx;
    fr_model *m;
    fr_step *s;
    float *x;
    int32_t *y;
} run;

static int start_micro; /* micro-batch size for the next start(); 0: the whole batch */
static int start_arch;  /* 0: convnet, 1: resnet_small, 2: resnet_small checkpointed */

static run start(fr_precision p, fr_optim_kind k, int scaling, float clip) {
    run r;
    r.ctx = fr_ctx_new();
    fr_set_threads(r.ctx, 2);
    r.m = start_arch ? resnet_small(r.ctx, start_arch == 2) : convnet(r.ctx);
    fr_model_init(r.m, 9);
    fr_step_opts o = {.batch = 8,
                      .training = 1,
                      .optim = fr_optim_defaults(k),
                      .seed = 2,
                      .precision = p,
                      .loss_scaling = scaling,
                      .clip_grad_norm = clip,
                      .micro_batch = start_micro,
                      .keep_grads = 1}; /* gradients are compared */
    o.optim.zero_grad_to_none = 0;
    o.optim.lr = k == FR_OPTIM_SGD ? 0.1f : 1e-3f;
    r.s = fr_step_compile(r.m, &o);
    CHECK(r.s != NULL, "compile %s: %s", fr_precision_name(p), fr_last_error(r.ctx));
    r.x = malloc(sizeof(float) * 8 * 288);
    r.y = malloc(sizeof(int32_t) * 8);
    fr_rng g = fr_rng_make(4, 4);
    for (int i = 0; i < 8 * 288; i++) r.x[i] = 2 * fr_rng_next_uniform(&g) - 1;
    for (int i = 0; i < 8; i++) r.y[i] = i % 10;
    return r;
}

static fr_status step(run *r, float *loss) {
    fr_batch b = {8, r->x, r->y, NULL, NULL};
    return fr_step_run(r->s, &b, loss, NULL);
}

static void stop(run *r) {
    free(r->x);
    free(r->y);
    fr_step_free(r->s);
    fr_model_free(r->m);
    fr_ctx_free(r->ctx);
}

/* How many inputs of op's nodes in the step are 16-bit values. */
static int half_reads(const fr_step *s, fr_op op) {
    int reads = 0;
    for (int k = 0; k < s->plan.n_nodes; k++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[k]];
        if (nd->op != op) continue;
        for (int j = 0; j < nd->n_in; j++)
            reads += nd->in[j] >= 0 && s->g.vals[nd->in[j]].dtype != FR_F32;
    }
    return reads;
}

/* A convolution with 8+ input channels (the shifted-GEMM path) reads its
 * saved 16-bit input itself, forward and backward, and the step agrees with
 * fp32 (the loss within 16 u; gradients are checked on convnet above: max
 * pooling's ties under rounding make this net's a poor yardstick). */
static void test_direct_conv(fr_precision p, double unit) {
    float loss[2];
    for (int r = 0; r < 2; r++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = fr_model_new(ctx, 2, 10, 10);
        fr_model_conv2d(m, 8, 3, 1, 1, 1);
        fr_model_relu(m);
        fr_model_conv2d(m, 8, 3, 1, 1, 1);
        fr_model_relu(m);
        fr_model_flatten(m);
        fr_model_linear(m, 10, 1);
        fr_model_init(m, 3);
        fr_step_opts o = {.batch = 4,
                          .training = 1,
                          .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                          .seed = 2,
                          .precision = r ? p : FR_PREC_FP32,
                          .loss_scaling = FR_LOSS_SCALE_NONE};
        fr_step *s = fr_step_compile(m, &o);
        CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
        if (!s) return;
        if (r) {
            CHECK(half_reads(s, FR_OP_CONV2D) == 1 && half_reads(s, FR_OP_CONV2D_BWD) == 1,
                  "%s: the second convolution reads its 16-bit input (%d forward, %d backward)",
                  fr_precision_name(p), half_reads(s, FR_OP_CONV2D),
                  half_reads(s, FR_OP_CONV2D_BWD));
        }
        float x[4 * 200];
        int32_t y[4] = {1, 3, 5, 7};
        fr_rng g = fr_rng_make(6, 1);
        for (int i = 0; i < 4 * 200; i++) x[i] = 2 * fr_rng_next_uniform(&g) - 1;
        fr_batch b = {4, x, y, NULL, NULL};
        for (int t = 0; t < 3; t++)
            CHECK(fr_step_run(s, &b, &loss[r], NULL) == FR_OK, "run: %s", fr_last_error(ctx));
        fr_step_free(s);
        fr_model_free(m);
        fr_ctx_free(ctx);
    }
    CHECK(fabs(loss[0] - loss[1]) <= 16 * unit * fabs(loss[0]),
          "%s: loss after 3 steps %g vs fp32 %g", fr_precision_name(p), loss[1], loss[0]);
}

/* ||g_b - g_a|| / ||g_a|| of one parameter's gradient in two runs. */
static double grad_rel_l2(const fr_model *ma, const fr_param *pa, const fr_model *mb,
                          const fr_param *pb) {
    size_t n = fr_shape_numel(&pa->shape);
    const float *ga = fr_grad32(ma, pa), *gb = fr_grad32(mb, pb);
    double num = 0, den = 0;
    for (size_t k = 0; k < n; k++) {
        num += ((double)ga[k] - gb[k]) * ((double)ga[k] - gb[k]);
        den += (double)ga[k] * ga[k];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Which ops of the step write a 16-bit out[0] themselves (not a CAST). */
static int half_writes(const fr_step *s, fr_op op) {
    int w = 0;
    for (int k = 0; k < s->plan.n_nodes; k++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[k]];
        w += nd->op == op && nd->out[0] >= 0 && s->g.vals[nd->out[0]].dtype != FR_F32;
    }
    return w;
}

/* The residual net (resnet_small) in a mixed mode against fp32: gradients
 * within 64 u (measured 2 u (bf16) to 20 u (fp16) in the block, 23 u and
 * 43 u in the first layer, whose gradients are sums over 8 x 144 positions
 * that cancel to a small fraction of their terms, amplifying the rounding of
 * the saved values, as below a BatchNorm in test_mixed_grads), and the
 * block's GELU writing its saved 16-bit value itself while the ReLUs, read
 * in f32 by the shortcut's add and by average pooling, do not. A pass that
 * let a producer drop an f32 value somebody still reads fails here. */
static void test_mixed_resnet(fr_precision p, double unit, int arch) {
    start_arch = arch;
    run a = start(FR_PREC_FP32, FR_OPTIM_SGD, -1, 0), b = start(p, FR_OPTIM_SGD, -1, 0);
    start_arch = 0;
    float la, lb;
    CHECK(step(&a, &la) == FR_OK && step(&b, &lb) == FR_OK, "steps: %s", fr_last_error(b.ctx));
    double worst = 0;
    for (size_t i = 0; i < a.m->n_params; i++) {
        const fr_param *pa = &a.m->params[i], *pb = &b.m->params[i];
        if (!fr_grad32(a.m, pa)) continue;
        double rel = grad_rel_l2(a.m, pa, b.m, pb);
        if (getenv("FR_TEST_VERBOSE"))
            printf("  %s %s: %.2e\n", fr_precision_name(p), pa->name, rel);
        worst = rel > worst ? rel : worst;
    }
    const char *what = arch == 2 ? "residual net, block checkpointed" : "residual net";
    printf("%s, %s: worst relative L2 gradient error %.2e, bound %.2e\n", fr_precision_name(p),
           what, worst, 64 * unit);
    CHECK(worst <= 64 * unit, "%s, %s gradients: relative L2 error %g > %g", fr_precision_name(p),
          what, worst, 64 * unit);
    CHECK(fabs(la - lb) <= 16 * unit * fabs(la), "%s, %s: losses agree: %g vs %g",
          fr_precision_name(p), what, la, lb);
    CHECK(half_writes(b.s, FR_OP_GELU) >= 1, "%s, %s: the GELU writes its 16-bit value itself",
          fr_precision_name(p), what);
    CHECK(half_writes(b.s, FR_OP_RELU) == 0, "%s, %s: no ReLU writes 16 bits, %d do",
          fr_precision_name(p), what, half_writes(b.s, FR_OP_RELU));
    stop(&a);
    stop(&b);
}

static void test_mixed_grads(fr_precision p, double unit) {
    run a = start(FR_PREC_FP32, FR_OPTIM_SGD, -1, 0), b = start(p, FR_OPTIM_SGD, -1, 0);
    float la, lb;
    CHECK(step(&a, &la) == FR_OK && step(&b, &lb) == FR_OK, "steps: %s", fr_last_error(b.ctx));
    /* Per tensor, the relative L2 error ||g16 - g32|| / ||g32||. Each saved value
     * carries a relative error of at most u: we allow 16 u. Below a BatchNorm
     * (0.weight) the error passes through dx = gamma invstd (dy - mean(dy) -
     * xhat mean(dy xhat)), whose subtractions cancel most of dy and so
     * amplify the rounding of xhat: measured 1 u for fp16 but 30 u for bf16
     * here, so that tensor gets 64 u. */
    double worst = 0;
    const char *worst_name = "";
    for (size_t i = 0; i < a.m->n_params; i++) {
        const fr_param *pa = &a.m->params[i], *pb = &b.m->params[i];
        if (!fr_grad32(a.m, pa)) continue;
        double rel = grad_rel_l2(a.m, pa, b.m, pb);
        if (getenv("FR_TEST_VERBOSE"))
            printf("  %s %s: %.2e\n", fr_precision_name(p), pa->name, rel);
        if (strcmp(pa->name, "0.weight") == 0) rel /= 4; /* its 64 u, in units of 16 u */
        if (rel > worst) worst = rel, worst_name = pa->name;
    }
    printf("%s: worst relative L2 gradient error %.2e (%s; 0.weight counted at 1/4), bound %.2e\n",
           fr_precision_name(p), worst, worst_name, 16 * unit);
    CHECK(worst <= 16 * unit, "%s gradients: relative L2 error %g > %g", fr_precision_name(p),
          worst, 16 * unit);
    CHECK(fabs(la - lb) <= 16 * unit * fabs(la), "losses agree: %g vs %g", la, lb);
    size_t pa[FR_MEM_CAT_COUNT], pb[FR_MEM_CAT_COUNT];
    fr_step_predicted(a.s, pa, NULL);
    fr_step_predicted(b.s, pb, NULL);
    CHECK(pb[FR_MEM_ACTIVATIONS] <= 0.55 * pa[FR_MEM_ACTIVATIONS],
          "%s activations %zu vs fp32 %zu (>= 45%% less)", fr_precision_name(p),
          pb[FR_MEM_ACTIVATIONS], pa[FR_MEM_ACTIVATIONS]);
    int halves = 0;
    for (size_t v = 0; v < b.s->g.n_vals; v++)
        halves += b.s->g.vals[v].saved &&
                  b.s->g.vals[v].dtype == (p == FR_PREC_FP16_MIXED ? FR_F16 : FR_BF16);
    CHECK(halves >= 6, "saved activations in 16 bits: %d", halves);
    /* Kernels that read 16 bits themselves get the saved half, not a widened
     * copy. The ReLU's backward is folded into max pooling's (plan/fold.h),
     * which reads the ReLU's saved 16-bit y for both. */
    int relu_bwd = 0, masked = 0;
    for (int k = 0; k < b.s->plan.n_nodes; k++) {
        const fr_node *nd = &b.s->g.nodes[b.s->plan.order[k]];
        relu_bwd += nd->op == FR_OP_RELU_BWD;
        masked += nd->op == FR_OP_MAXPOOL2D_BWD && nd->attr.masked &&
                  b.s->g.vals[nd->in[1]].dtype != FR_F32;
    }
    CHECK(b.s->place.n_folded == 1 && relu_bwd == 0 && masked == 1,
          "%s: %d folded, %d relu_bwd left, %d masked maxpool2d_bwd on a 16-bit x",
          fr_precision_name(p), b.s->place.n_folded, relu_bwd, masked);
    const fr_op direct[] = {FR_OP_GELU_BWD, FR_OP_MAXPOOL2D, FR_OP_MAXPOOL2D_BWD,
                            FR_OP_BATCHNORM_BWD};
    for (size_t d = 0; d < sizeof direct / sizeof direct[0]; d++)
        CHECK(half_reads(b.s, direct[d]) >= 1, "%s: %s reads a 16-bit input directly",
              fr_precision_name(p), fr_op_get(direct[d])->name);
    stop(&a);
    stop(&b);
}

/* The tanh GELU's backward reads its dy rounded where the CPU has a native
 * bf16 GEMM, as autocast hands it the next linear layer's bf16 dx: on a
 * 48-32-10 net with a tanh GELU, bf16-mixed, that dy is bf16, written by
 * the linear layer's backward itself (its GEMM's epilogue: no CAST and no
 * f32 dy), and the gradients stay within 16 u of fp32's. Elsewhere (f32
 * GEMMs on rounded operands) the GELU's dy stays f32. */
static void test_gelu_dy16(void) {
    static const char text[] = "input 48\nlinear 32\ngelu approximate=tanh\nlinear 10\n"
                               "loss cross_entropy\n";
    const fr_precision prec[2] = {FR_PREC_FP32, FR_PREC_BF16_MIXED};
    fr_ctx *ctx[2];
    fr_model *m[2];
    fr_step *s[2];
    float x[8 * 48], loss[2];
    int32_t y[8];
    fr_rng g = fr_rng_make(6, 1);
    for (int i = 0; i < 8 * 48; i++) x[i] = 2 * fr_rng_next_uniform(&g) - 1;
    for (int i = 0; i < 8; i++) y[i] = (i * 7) % 10;
    for (int k = 0; k < 2; k++) {
        ctx[k] = fr_ctx_new();
        fr_set_threads(ctx[k], 2);
        m[k] = fr_model_parse(ctx[k], "gelu-mlp", text, sizeof text - 1);
        CHECK(m[k] != NULL, "parse: %s", fr_last_error(ctx[k]));
        if (!m[k]) return;
        fr_model_init(m[k], 3);
        fr_step_opts o = {.batch = 8,
                          .training = 1,
                          .optim = fr_optim_defaults(FR_OPTIM_SGD),
                          .seed = 2,
                          .precision = prec[k],
                          .loss_scaling = FR_LOSS_SCALE_NONE,
                          .keep_grads = 1};
        o.optim.lr = 0;
        o.optim.zero_grad_to_none = 0;
        s[k] = fr_step_compile(m[k], &o);
        CHECK(s[k] != NULL, "compile: %s", fr_last_error(ctx[k]));
        if (!s[k]) return;
        fr_batch b = {8, x, y, NULL, NULL};
        CHECK(fr_step_run(s[k], &b, &loss[k], NULL) == FR_OK, "run: %s", fr_last_error(ctx[k]));
    }
    const fr_step *b = s[1];
    const fr_backend *be = fr_backend_of(ctx[1]);
    const int g16 = be->gemm16 && be->gemm16(FR_BF16);
    int seen = 0, dy16 = 0, by_linear = 0;
    for (int k = 0; k < b->plan.n_nodes; k++) {
        const fr_node *nd = &b->g.nodes[b->plan.order[k]];
        if (nd->op != FR_OP_GELU_BWD) continue;
        const fr_value *dy = &b->g.vals[nd->in[0]];
        seen++;
        dy16 += dy->dtype == FR_BF16;
        by_linear += dy->producer >= 0 && b->g.nodes[dy->producer].op == FR_OP_LINEAR_BWD;
    }
    CHECK(seen == 1 && dy16 == g16 && by_linear == 1,
          "gelu_bwd's dy: %d nodes, bf16 %d (want %d: native bf16 GEMM), made by linear_bwd %d",
          seen, dy16, g16, by_linear);
    if (!g16) printf("test_gelu_dy16: no native bf16 GEMM here: the GELU's dy stays f32\n");
    double worst = 0;
    for (size_t i = 0; i < m[0]->n_params; i++) {
        const fr_param *pa = &m[0]->params[i];
        if (!fr_grad32(m[0], pa)) continue;
        double rel = grad_rel_l2(m[0], pa, m[1], &m[1]->params[i]);
        if (rel > worst) worst = rel;
    }
    CHECK(worst <= 16 * ldexp(1, -9) && fabs(loss[0] - loss[1]) <= 16 * ldexp(1, -9) * loss[0],
          "gelu net, bf16-mixed against fp32: gradients %g, losses %g and %g", worst, loss[1],
          loss[0]);
    for (int k = 0; k < 2; k++) fr_step_free(s[k]), fr_model_free(m[k]), fr_ctx_free(ctx[k]);
}

/* Mixed precision's matmuls compute with 16-bit-rounded operands: a 48-32-10
 * linear net's loss and gradients against a float64 reference of the same
 * net whose weights and saved hidden values are rounded to 16 bits (forward
 * and backward read the rounded weights; the data input stays f32), within
 * f32 accumulation error, and measurably away from the unrounded reference
 * (so a pass that forgot the rounding fails). Where the CPU has a native
 * bf16 GEMM (gemm16.h) every operand of the linear layers' GEMMs is bf16:
 * the data input and, in backward, the gradients dz and dh are rounded too. */
static void test_mixed_rounding(fr_precision p, fr_dtype dt) {
    enum { N = 8, K = 48, H = 32, O = 10 };
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = fr_model_new(ctx, K, 1, 1);
    fr_model_linear(m, H, 1);
    fr_model_linear(m, O, 1);
    fr_model_init(m, 5);
    fr_step_opts o = {.batch = N,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 2,
                      .precision = p,
                      .loss_scaling = FR_LOSS_SCALE_NONE,
                      .keep_grads = 1};
    o.optim.lr = 0;
    o.optim.zero_grad_to_none = 0;
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    if (!s) return;
    float x[N * K];
    int32_t y[N];
    fr_rng g = fr_rng_make(8, 2);
    for (int i = 0; i < N * K; i++) x[i] = 2 * fr_rng_next_uniform(&g) - 1;
    for (int i = 0; i < N; i++) y[i] = (i * 3) % O;
    fr_batch b = {N, x, y, NULL, NULL};
    float loss;
    CHECK(fr_step_run(s, &b, &loss, NULL) == FR_OK, "run: %s", fr_last_error(ctx));
    const float *W1 = m->params[0].data, *b1 = m->params[1].data, *W2 = m->params[2].data,
                *b2 = m->params[3].data;
    CHECK(fr_shape_numel(&m->params[0].shape) == H * K &&
              fr_shape_numel(&m->params[2].shape) == O * H,
          "parameter order: 0.weight, 0.bias, 1.weight, 1.bias");
    double l_ref[2], gw1[2][H * K], gw2[2][O * H];
    const int native = fr_gemm16_native(dt);
    for (int r = 0; r < 2; r++) { /* r = 1: operands rounded as the mixed mode must */
#define RND(v)                                                               \
    (r ? (double)(dt == FR_F16 ? fr_f16_to_f32(fr_f32_to_f16((float)(v)))    \
                               : fr_bf16_to_f32(fr_f32_to_bf16((float)(v)))) \
       : (double)(v))
#define RND16(v) (native ? RND(v) : (double)(v)) /* rounded only by a native GEMM */
        double h[N * H], z[N * O], dz[N * O], dh[N * H], l = 0;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < H; j++) {
                double a = b1[j];
                for (int k = 0; k < K; k++) a += RND16(x[n * K + k]) * RND(W1[j * K + k]);
                h[n * H + j] = RND((float)a);
            }
        for (int n = 0; n < N; n++) {
            double mx = -INFINITY, se = 0;
            for (int c = 0; c < O; c++) {
                double a = b2[c];
                for (int j = 0; j < H; j++) a += h[n * H + j] * RND(W2[c * H + j]);
                z[n * O + c] = a;
                mx = a > mx ? a : mx;
            }
            for (int c = 0; c < O; c++) se += exp(z[n * O + c] - mx);
            l += (log(se) + mx - z[n * O + y[n]]) / N;
            for (int c = 0; c < O; c++)
                dz[n * O + c] = RND16((exp(z[n * O + c] - mx) / se - (c == y[n])) / N);
        }
        l_ref[r] = l;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < H; j++) {
                double a = 0;
                for (int c = 0; c < O; c++) a += dz[n * O + c] * RND(W2[c * H + j]);
                dh[n * H + j] = RND16((float)a);
            }
        for (int j = 0; j < H; j++)
            for (int k = 0; k < K; k++) {
                double a = 0;
                for (int n = 0; n < N; n++) a += dh[n * H + j] * RND16(x[n * K + k]);
                gw1[r][j * K + k] = a;
            }
        for (int c = 0; c < O; c++)
            for (int j = 0; j < H; j++) {
                double a = 0;
                for (int n = 0; n < N; n++) a += dz[n * O + c] * h[n * H + j];
                gw2[r][c * H + j] = a;
            }
#undef RND16
#undef RND
    }
    /* relative L2 distance of a gradient from reference r */
    double d1[2], d2[2];
    for (int r = 0; r < 2; r++) {
        double num = 0, den = 0;
        for (int i = 0; i < H * K; i++) {
            num += (fr_grad32(m, &m->params[0])[i] - gw1[r][i]) *
                   (fr_grad32(m, &m->params[0])[i] - gw1[r][i]);
            den += gw1[r][i] * gw1[r][i];
        }
        d1[r] = sqrt(num / den);
        num = den = 0;
        for (int i = 0; i < O * H; i++) {
            num += (fr_grad32(m, &m->params[2])[i] - gw2[r][i]) *
                   (fr_grad32(m, &m->params[2])[i] - gw2[r][i]);
            den += gw2[r][i] * gw2[r][i];
        }
        d2[r] = sqrt(num / den);
    }
    const double tol = 1e-5; /* f32 sums of <= 48 terms: a few 2^-24 relative */
    if (getenv("FR_TEST_VERBOSE"))
        printf("  %s: loss %.9g, rounded ref %.9g, plain %.9g; 0.weight %.2e / %.2e, 1.weight %.2e "
               "/ %.2e\n",
               fr_precision_name(p), loss, l_ref[1], l_ref[0], d1[1], d1[0], d2[1], d2[0]);
    CHECK(fabs(loss - l_ref[1]) <= tol * fabs(l_ref[1]), "%s: loss %.9g, rounded reference %.9g",
          fr_precision_name(p), loss, l_ref[1]);
    CHECK(d1[1] <= tol && d2[1] <= tol, "%s: gradients vs the rounded reference: %.2e, %.2e",
          fr_precision_name(p), d1[1], d2[1]);
    if (native) { /* the loss's backward writes its dlogits in 16 bits for the GEMM itself */
        int made16 = 0, made32 = 0;
        for (int k = 0; k < s->plan.n_nodes; k++) {
            const fr_node *nd = &s->g.nodes[s->plan.order[k]];
            if (nd->op != FR_OP_CROSS_ENTROPY_BWD || nd->out[0] < 0) continue;
            made16 += s->g.vals[nd->out[0]].dtype == dt;
            made32 += s->g.vals[nd->out[0]].dtype == FR_F32;
        }
        CHECK(made16 == 1 && made32 == 0, "%s: dlogits made in 16 bits (%d) not f32 (%d)",
              fr_precision_name(p), made16, made32);
    }
    CHECK(d1[0] >= 10 * tol && d2[0] >= 10 * tol,
          "%s: the rounding must show: gradients vs the unrounded reference %.2e, %.2e",
          fr_precision_name(p), d1[0], d2[0]);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

static void test_scaler_exact(void) {
    run a = start(FR_PREC_FP32, FR_OPTIM_ADAM, -1, 0), b = start(FR_PREC_FP32, FR_OPTIM_ADAM, 1, 0);
    float l;
    for (int i = 0; i < 3; i++) {
        step(&a, &l);
        step(&b, &l);
    }
    int same = 1;
    for (size_t i = 0; i < a.m->n_params; i++)
        same &=
            !memcmp(a.m->params[i].data, b.m->params[i].data,
                    fr_shape_numel(&a.m->params[i].shape) * fr_dtype_size(a.m->params[i].dtype));
    CHECK(same, "power-of-two scaling and unscaling are exact: weights equal");
    float scale;
    uint64_t skipped;
    fr_step_scaler(b.s, &scale, &skipped);
    CHECK(scale == 65536.0f && skipped == 0, "scale %g, skipped %llu", (double)scale,
          (unsigned long long)skipped);
    stop(&a);
    stop(&b);
}

static void test_overflow_skip(void) {
    run r = start(FR_PREC_FP16_MIXED, FR_OPTIM_ADAM, 0, 0);
    float l;
    CHECK(step(&r, &l) == FR_OK, "first step");
    size_t n0 = fr_shape_numel(&r.m->params[0].shape);
    float *w = malloc(n0 * 4), *m0 = malloc(n0 * 4);
    memcpy(w, r.m->params[0].data, n0 * 4);
    memcpy(m0, fr_state_of(r.m, &r.m->params[0], 0), n0 * 4);
    int64_t t = r.s->opt.t;
    r.s->opt.inject_inf = 1;
    CHECK(step(&r, &l) == FR_OK, "a skipped step is not an error: %s", fr_last_error(r.ctx));
    float scale;
    uint64_t skipped;
    fr_step_scaler(r.s, &scale, &skipped);
    CHECK(skipped == 1 && scale == 32768.0f, "skipped %llu, scale %g", (unsigned long long)skipped,
          (double)scale);
    CHECK(!memcmp(w, r.m->params[0].data, n0 * 4) &&
              !memcmp(m0, fr_state_of(r.m, &r.m->params[0], 0), n0 * 4) && r.s->opt.t == t,
          "weights, optimizer state and step count untouched");
    CHECK(step(&r, &l) == FR_OK && memcmp(w, r.m->params[0].data, n0 * 4) && r.s->opt.t == t + 1,
          "the next step trains");
    free(w);
    free(m0);
    stop(&r);
    /* Without a scaler (as in PyTorch) the inf reaches the weights, and the
     * next step's loss reports it as an error that names what to do. */
    run q = start(FR_PREC_FP32, FR_OPTIM_SGD, -1, 0);
    q.s->opt.inject_inf = 1;
    CHECK(step(&q, &l) == FR_OK, "the poisoned step itself is not checked without a scaler");
    CHECK(step(&q, &l) == FR_ERR_NUMERIC && strstr(fr_last_error(q.ctx), "non-finite loss"), "%s",
          fr_last_error(q.ctx));
    stop(&q);
}

static void test_clip(void) {
    /* SGD without momentum, lr 0.1: the update is -lr * clipped grad, so the
     * norm of (w_before - w_after) / lr must equal max_norm. */
    run r = start(FR_PREC_FP32, FR_OPTIM_SGD, -1, 0.05f);
    size_t total = 0;
    for (size_t i = 0; i < r.m->n_params; i++) total += fr_shape_numel(&r.m->params[i].shape);
    float *before = malloc(total * 4), *p = before;
    for (size_t i = 0; i < r.m->n_params; i++) {
        size_t n = fr_shape_numel(&r.m->params[i].shape);
        if (r.m->params[i].dtype == FR_F32) memcpy(p, r.m->params[i].data, n * 4);
        p += n;
    }
    float l;
    step(&r, &l);
    double sq = 0;
    p = before;
    for (size_t i = 0; i < r.m->n_params; i++) {
        size_t n = fr_shape_numel(&r.m->params[i].shape);
        if (r.m->params[i].trainable)
            for (size_t k = 0; k < n; k++) {
                double d = ((double)p[k] - ((float *)r.m->params[i].data)[k]) / 0.1;
                sq += d * d;
            }
        p += n;
    }
    CHECK(fabs(sqrt(sq) - 0.05) < 0.05 * 1e-3, "clipped norm %.7f, want 0.05", sqrt(sq));
    free(before);
    stop(&r);
}

static void test_pure_bf16(void) {
    run a = start(FR_PREC_FP32, FR_OPTIM_ADAM, -1, 0),
        r = start(FR_PREC_BF16, FR_OPTIM_ADAM, -1, 0);
    CHECK(r.m->params[0].dtype == FR_BF16, "weights stored as bf16");
    size_t pa[FR_MEM_CAT_COUNT], pr[FR_MEM_CAT_COUNT];
    fr_step_predicted(a.s, pa, NULL);
    fr_step_predicted(r.s, pr, NULL);
    CHECK(pr[FR_MEM_OPTIM] * 2 == pa[FR_MEM_OPTIM], "Adam state in 16 bits: %zu vs %zu",
          pr[FR_MEM_OPTIM], pa[FR_MEM_OPTIM]);
    float l0, l;
    step(&r, &l0);
    for (int i = 0; i < 30; i++) step(&r, &l);
    CHECK(l < 0.8 * l0, "pure bf16 trains on one batch: %g -> %g", l0, l);
    stop(&a);
    stop(&r);
}

/* Pure half precision keeps the weights' gradients in their 16-bit format
 * (model.half()): the bytes halve, predicted and measured; the gradients
 * agree with fp32's at the same (widened) weights within the mixed modes'
 * bound, also when two micro-batches add into the 16-bit gradient; a forced
 * inf in a 16-bit gradient skips the step. */
static void test_pure_grads(fr_precision p, double unit) {
    fr_dtype dt = p == FR_PREC_FP16 ? FR_F16 : FR_BF16;
    for (int micro = 0; micro <= 4; micro += 4) {
        start_micro = micro;
        run r = start(p, FR_OPTIM_ADAM, 1, 0);
        run a = start(FR_PREC_FP32, FR_OPTIM_ADAM, 1, 0); /* the same micro-batches (BatchNorm) */
        start_micro = 0;
        for (size_t i = 0; i < a.m->n_params; i++) { /* fp32 at the 16-bit weights */
            const fr_param *pr = &r.m->params[i];
            if (pr->dtype != dt) continue;
            float *w = a.m->params[i].data;
            const uint16_t *h = pr->data;
            for (int64_t k = 0; k < fr_shape_numel(&pr->shape); k++)
                w[k] = dt == FR_F16 ? fr_f16_to_f32(h[k]) : fr_bf16_to_f32(h[k]);
        }
        size_t pa[FR_MEM_CAT_COUNT], pr[FR_MEM_CAT_COUNT];
        fr_step_predicted(a.s, pa, NULL);
        fr_step_predicted(r.s, pr, NULL);
        CHECK(pr[FR_MEM_GRADS] * 2 == pa[FR_MEM_GRADS], "%s: gradients %zu bytes, fp32 %zu",
              fr_precision_name(p), pr[FR_MEM_GRADS], pa[FR_MEM_GRADS]);
        float la, lr;
        CHECK(step(&a, &la) == FR_OK && step(&r, &lr) == FR_OK, "steps: %s", fr_last_error(r.ctx));
        fr_mem_stats st;
        fr_mem_get_stats(r.ctx, &st);
        CHECK(st.allocated_peak[FR_MEM_GRADS] == pr[FR_MEM_GRADS],
              "%s: gradient bytes measured %zu, predicted %zu", fr_precision_name(p),
              st.allocated_peak[FR_MEM_GRADS], pr[FR_MEM_GRADS]);
        double worst = 0;
        int n16 = 0;
        for (size_t i = 0; i < a.m->n_params; i++) {
            const fr_param *qa = &a.m->params[i], *qr = &r.m->params[i];
            const float *ga = fr_grad32(a.m, qa);
            const uint16_t *g16 = fr_grad16(r.m, qr);
            if (!ga || qr->dtype != dt) continue;
            n16 += g16 != NULL && fr_grad32(r.m, qr) == NULL;
            if (!g16) continue;
            double num = 0, den = 0;
            for (int64_t k = 0; k < fr_shape_numel(&qa->shape); k++) {
                double g = dt == FR_F16 ? fr_f16_to_f32(g16[k]) : fr_bf16_to_f32(g16[k]);
                num += (g - ga[k]) * (g - ga[k]);
                den += (double)ga[k] * ga[k];
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            if (strcmp(qa->name, "0.weight") == 0) rel /= 4; /* 64 u below BatchNorm, as above */
            worst = rel > worst ? rel : worst;
        }
        CHECK(n16 >= 6, "%s: %d weight gradients held in 16 bits", fr_precision_name(p), n16);
        CHECK(worst <= 16 * unit, "%s micro-batch %d: gradients vs fp32 relative L2 %g > %g",
              fr_precision_name(p), micro, worst, 16 * unit);
        /* an inf in a 16-bit gradient: the step is skipped, nothing moves */
        size_t nb = (size_t)fr_shape_numel(&r.m->params[0].shape) * 2;
        uint16_t *before = malloc(nb);
        memcpy(before, r.m->params[0].data, nb);
        r.s->opt.inject_inf = 1;
        uint64_t skipped0, skipped1;
        fr_step_scaler(r.s, NULL, &skipped0);
        CHECK(step(&r, &lr) == FR_OK, "step with inf: %s", fr_last_error(r.ctx));
        fr_step_scaler(r.s, NULL, &skipped1);
        CHECK(skipped1 == skipped0 + 1 && memcmp(before, r.m->params[0].data, nb) == 0,
              "%s: an inf gradient skips the step (skipped %llu -> %llu)", fr_precision_name(p),
              (unsigned long long)skipped0, (unsigned long long)skipped1);
        free(before);
        stop(&a);
        stop(&r);
    }
}

int main(void) {
    test_mixed_grads(FR_PREC_BF16_MIXED, ldexp(1, -9));
    test_mixed_grads(FR_PREC_FP16_MIXED, ldexp(1, -12));
    for (int arch = 1; arch <= 2; arch++) {
        test_mixed_resnet(FR_PREC_BF16_MIXED, ldexp(1, -9), arch);
        test_mixed_resnet(FR_PREC_FP16_MIXED, ldexp(1, -12), arch);
    }
    test_direct_conv(FR_PREC_BF16_MIXED, ldexp(1, -9));
    test_direct_conv(FR_PREC_FP16_MIXED, ldexp(1, -12));
    test_mixed_rounding(FR_PREC_BF16_MIXED, FR_BF16);
    test_gelu_dy16();
    test_mixed_rounding(FR_PREC_FP16_MIXED, FR_F16);
    test_scaler_exact();
    test_overflow_skip();
    test_clip();
    test_pure_bf16();
    test_pure_grads(FR_PREC_BF16, ldexp(1, -9));
    test_pure_grads(FR_PREC_FP16, ldexp(1, -12));
    return check_done();
}
