/* test_gradcheck.c — every differentiable op in the op table against central
 * finite differences, through the real pipeline: graph -> autodiff -> plan
 * -> exec. Each case makes every float input a parameter (i32 inputs,
 * labels or an embedding's ids, are drawn at random and not differentiated),
 * follows the op with a view to (N, D) and an MSE loss against a fixed
 * random target, and compares d loss / d input from backward with (L(x+h) - L(x-h)) / 2h
 * evaluated in float64 from the forward output. An op with a backward rule
 * but no case here fails the test, so a new op cannot skip it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "check.h"
#include "core/rng.h"
#include "exec/exec.h"

typedef struct gcase {
    fr_op op;
    int n_in;
    fr_shape in[5];
    int is_int[5];  /* i32 inputs, not differentiated: 1 labels (cross-entropy, below the
                        logits' last dimension); k > 1 ids below k (embedding), an input */
    int no_grad[5]; /* inputs not differentiated (BatchNorm running stats) */
    fr_attr attr;
    int positive[5]; /* keep away from kinks: |x| >= 0.1 */
    const char *what;
} gcase;

static float frand(fr_rng *r) { return 2.0f * fr_rng_next_uniform(r) - 1.0f; }

/* Everything one case needs, built once and run for each perturbation. */
typedef struct harness {
    fr_ctx *ctx;
    fr_graph g;
    fr_plan plan;
    fr_exec ex;
    int in_val[5], grad_val[5];
    float *data[5], *grad[5];
    int32_t *ints[5]; /* i32 inputs: labels or ids */
    float *target;
    int out, target_val, loss, main_out;
    size_t n[5];
} harness;

static double run_loss(harness *h, int with_backward) {
    for (int i = 0; i < 5; i++) {
        if (h->in_val[i] < 0) continue;
        h->ex.ptr[h->in_val[i]] = h->data[i] ? (void *)h->data[i] : (void *)h->ints[i];
        if (h->grad_val[i] >= 0) {
            h->ex.ptr[h->grad_val[i]] = h->grad[i];
            h->ex.written[h->grad_val[i]] = 0;
        }
    }
    if (h->target_val >= 0) h->ex.ptr[h->target_val] = h->target;
    (void)with_backward; /* always the whole step, so the accounting stays balanced */
    fr_status st =
        fr_exec_run(&h->ex, 0, (int)h->g.n_nodes, (int)h->g.vals[h->in_val[0]].shape.d[0], 7, 0);
    if (st) {
        fprintf(stderr, "exec: %s\n", fr_last_error(h->ctx));
        return NAN;
    }
    if (h->target_val < 0) return *(const float *)h->ex.ptr[h->loss]; /* a loss op */
    /* Loss in float64 from the op's output: sum (out - target)^2 / numel. */
    const float *o = h->ex.ptr[h->main_out];
    size_t n = (size_t)fr_shape_numel(&h->g.vals[h->main_out].shape);
    double L = 0;
    for (size_t i = 0; i < n; i++)
        L += ((double)o[i] - h->target[i]) * ((double)o[i] - h->target[i]);
    fr_mem_reset_peak(h->ctx);
    return L / (double)n;
}

static void run_case(const gcase *c) {
    harness h;
    memset(&h, 0, sizeof h);
    h.ctx = fr_ctx_new();
    fr_graph_init(&h.g, h.ctx);
    fr_rng r = fr_rng_make(42, (uint64_t)c->op);
    int grad_of_len = 64;
    int grad_of[64];
    for (int i = 0; i < grad_of_len; i++) grad_of[i] = -1;
    for (int i = 0; i < 5; i++) h.in_val[i] = h.grad_val[i] = -1;
    for (int i = 0; i < c->n_in; i++) {
        if (c->in[i].ndim == 0) continue; /* absent optional input */
        int lab = c->is_int[i] == 1, ids = c->is_int[i] > 1;
        h.in_val[i] = fr_graph_value(&h.g,
                                     lab   ? FR_VAL_LABEL
                                     : ids ? FR_VAL_INPUT
                                           : (c->no_grad[i] ? FR_VAL_BUFFER : FR_VAL_PARAM),
                                     lab || ids ? FR_I32 : FR_F32, c->in[i]);
        h.g.vals[h.in_val[i]].batched = i == 0 || lab;
        h.n[i] = (size_t)fr_shape_numel(&c->in[i]);
        if (lab || ids) {
            uint64_t below = ids ? (uint64_t)c->is_int[i] : (uint64_t)c->in[0].d[c->in[0].ndim - 1];
            h.ints[i] = malloc(h.n[i] * sizeof(int32_t));
            for (size_t k = 0; k < h.n[i]; k++) h.ints[i][k] = (int32_t)fr_rng_below(&r, below);
            continue;
        }
        h.data[i] = malloc(h.n[i] * sizeof(float));
        h.grad[i] = malloc(h.n[i] * sizeof(float));
        for (size_t k = 0; k < h.n[i]; k++) {
            float v = frand(&r);
            if (c->positive[i] == 1) v = 0.1f + fabsf(v);            /* positive: running var */
            if (c->positive[i] == 2) v = (v < 0 ? -0.1f : 0.1f) + v; /* away from 0 (kinks) */
            h.data[i][k] = v;
        }
        if (!c->no_grad[i]) {
            h.grad_val[i] = fr_graph_value(&h.g, FR_VAL_GRAD, FR_F32, c->in[i]);
            grad_of[h.in_val[i]] = h.grad_val[i];
        }
    }
    if (c->op == FR_OP_MAXPOOL2D) /* distinct values so the max is unique and stable */
        for (size_t k = 0; k < h.n[0]; k++)
            h.data[0][k] = (float)((k * 7919) % h.n[0]) / (float)h.n[0] - 0.5f;
    int out[FR_MAX_OUT];
    fr_attr attr = c->attr;
    int node = fr_graph_node(&h.g, c->op, h.in_val, c->n_in, &attr, -1, 0, out);
    CHECK(node >= 0, "%s: building the node: %s", c->what, fr_last_error(h.ctx));
    if (node < 0) goto cleanup;
    h.main_out = out[0];
    h.target_val = -1;
    if (c->op == FR_OP_CROSS_ENTROPY || c->op == FR_OP_MSE) { /* the op is the loss itself */
        h.loss = h.g.loss = out[0];
        goto differentiate;
    }
    fr_shape os = h.g.vals[out[0]].shape;
    int64_t N = os.d[0];
    fr_attr va = {0};
    va.shape = os.ndim == 1 ? fr_shape2(1, os.d[0]) : fr_shape2(N, fr_shape_numel(&os) / N);
    int flat;
    fr_graph_node(&h.g, FR_OP_VIEW, &out[0], 1, &va, -1, 0, &flat);
    h.target_val = fr_graph_value(&h.g, FR_VAL_LABEL, FR_F32, va.shape);
    size_t no = (size_t)fr_shape_numel(&va.shape);
    h.target = malloc(no * sizeof(float));
    for (size_t k = 0; k < no; k++) h.target[k] = frand(&r);
    fr_attr la = {0};
    la.scale = 1.0f;
    int lin[2] = {flat, h.target_val};
    fr_graph_node(&h.g, FR_OP_MSE, lin, 2, &la, -1, 0, &h.loss);
    h.g.loss = h.loss;
differentiate:;
    int gof[256];
    for (size_t i = 0; i < h.g.n_vals; i++) gof[i] = i < 64 ? grad_of[i] : -1;
    CHECK(fr_autodiff(&h.g, gof) == FR_OK, "%s: autodiff: %s", c->what, fr_last_error(h.ctx));
    uint8_t keep[256] = {0};
    keep[h.loss] = keep[h.main_out] = 1;
    CHECK(fr_plan_build(&h.g, keep, NULL, 0, &h.plan) == FR_OK, "%s: plan", c->what);
    CHECK(fr_exec_init(&h.ex, &h.g, &h.plan) == FR_OK, "%s: exec", c->what);
    /* BatchNorm in training mode updates its running stats: keep a copy so
     * every perturbed forward starts from the same buffers. */
    float *saved[5] = {0};
    for (int i = 0; i < 5; i++)
        if (h.data[i] && c->no_grad[i]) {
            saved[i] = malloc(h.n[i] * sizeof(float));
            memcpy(saved[i], h.data[i], h.n[i] * sizeof(float));
        }
    double L0 = run_loss(&h, 1);
    fr_exec_finish(&h.ex);
    CHECK(isfinite(L0), "%s: loss", c->what);
    /* backward's result */
    float *bw[5] = {0};
    for (int i = 0; i < 5; i++)
        if (h.grad_val[i] >= 0) {
            bw[i] = malloc(h.n[i] * sizeof(float));
            memcpy(bw[i], h.grad[i], h.n[i] * sizeof(float));
        }
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        if (!bw[i]) continue;
        for (size_t k = 0; k < h.n[i]; k++) {
            double eps = 1e-2 * fmax(1.0, fabs(h.data[i][k]));
            float x0 = h.data[i][k];
            double Lp, Lm;
            h.data[i][k] = (float)(x0 + eps);
            for (int j = 0; j < 5; j++)
                if (saved[j]) memcpy(h.data[j], saved[j], h.n[j] * 4);
            Lp = run_loss(&h, 0);
            fr_exec_finish(&h.ex);
            h.data[i][k] = (float)(x0 - eps);
            for (int j = 0; j < 5; j++)
                if (saved[j]) memcpy(h.data[j], saved[j], h.n[j] * 4);
            Lm = run_loss(&h, 0);
            fr_exec_finish(&h.ex);
            h.data[i][k] = x0;
            double eff = (double)(float)(x0 + eps) - (double)(float)(x0 - eps);
            double fd = (Lp - Lm) / eff;
            double err = fabs(fd - bw[i][k]) / fmax(1e-2, fabs(fd) + fabs(bw[i][k]));
            if (err > worst) worst = err;
            if (err > 2e-2 && fabs(fd - bw[i][k]) > 2e-4) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s: input %d elem %zu: backward %.6g, finite diff %.6g\n",
                            c->what, i, k, (double)bw[i][k], fd);
            }
        }
    }
    CHECK(bad == 0, "%s: %d gradient elements disagree with finite differences (worst rel %.3g)",
          c->what, bad, worst);
    printf("%-22s worst relative error %.2e\n", c->what, worst);
    for (int i = 0; i < 5; i++) {
        free(bw[i]);
        free(saved[i]);
    }
cleanup:
    fr_exec_release(&h.ex);
    fr_plan_release(&h.plan);
    fr_graph_release(&h.g);
    for (int i = 0; i < 5; i++) {
        free(h.data[i]);
        free(h.grad[i]);
        free(h.ints[i]);
    }
    free(h.target);
    fr_mem_stats st;
    fr_mem_get_stats(h.ctx, &st);
    CHECK(st.allocated_total == 0, "%s: %zu bytes leaked", c->what, st.allocated_total);
    fr_ctx_free(h.ctx);
}

int main(void) {
    fr_attr none = {0};
    fr_attr conv = {.kernel = 3, .stride = 2, .pad = 1};
    fr_attr pool = {.kernel = 2, .stride = 2};
    fr_attr bn = {.eps = 1e-5f, .momentum = 0.1f, .training = 1};
    fr_attr ln = {.eps = 1e-5f};
    fr_attr drop = {.p = 0.3f, .training = 1, .salt = 5};
    fr_attr ce = {.scale = 1.0f};
    fr_attr gelu_tanh = {.approx = 1};
    fr_attr attn2 = {.heads = 2, .causal = 1};
    gcase cases[] = {
        {FR_OP_LINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0},
         {0},
         none,
         {0},
         "linear"},
        {FR_OP_LINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), {0}},
         {0},
         {0},
         none,
         {0},
         "linear (no bias)"},
        {FR_OP_LINEAR,
         3,
         {fr_shape3(2, 3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0},
         {0},
         none,
         {0},
         "linear (B,T,K)"},
        {FR_OP_CONV2D,
         3,
         {fr_shape4(2, 3, 5, 6), fr_shape4(4, 3, 3, 3), fr_shape1(4)},
         {0},
         {0},
         conv,
         {0},
         "conv2d s2 p1"},
        {FR_OP_MAXPOOL2D, 1, {fr_shape4(2, 2, 4, 6)}, {0}, {0}, pool, {0}, "maxpool2d"},
        {FR_OP_AVGPOOL2D, 1, {fr_shape4(2, 2, 4, 6)}, {0}, {0}, pool, {0}, "avgpool2d"},
        {FR_OP_GLOBAL_AVGPOOL, 1, {fr_shape4(2, 3, 3, 4)}, {0}, {0}, none, {0}, "global_avgpool"},
        {FR_OP_RELU, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {2}, "relu"},
        {FR_OP_GELU, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "gelu"},
        {FR_OP_GELU, 1, {fr_shape3(2, 3, 4)}, {0}, {0}, gelu_tanh, {0}, "gelu (tanh)"},
        {FR_OP_SIGMOID, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "sigmoid"},
        {FR_OP_TANH, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "tanh"},
        {FR_OP_BATCHNORM,
         5,
         {fr_shape4(3, 2, 2, 3), fr_shape1(2), fr_shape1(2), fr_shape1(2), fr_shape1(2)},
         {0},
         {0, 0, 0, 1, 1},
         bn,
         {0, 0, 0, 0, 1},
         "batchnorm (train)"},
        {FR_OP_BATCHNORM,
         5,
         {fr_shape2(5, 3), fr_shape1(3), fr_shape1(3), fr_shape1(3), fr_shape1(3)},
         {0},
         {0, 0, 0, 1, 1},
         bn,
         {0, 0, 0, 0, 1},
         "batchnorm1d (train)"},
        {FR_OP_LAYERNORM,
         3,
         {fr_shape2(3, 6), fr_shape1(6), fr_shape1(6)},
         {0},
         {0},
         ln,
         {0},
         "layernorm"},
        {FR_OP_LAYERNORM,
         3,
         {fr_shape3(2, 3, 6), fr_shape1(6), fr_shape1(6)},
         {0},
         {0},
         ln,
         {0},
         "layernorm (B,T,C)"},
        {FR_OP_DROPOUT, 1, {fr_shape2(4, 8)}, {0}, {0}, drop, {0}, "dropout"},
        {FR_OP_ADD, 2, {fr_shape2(3, 4), fr_shape2(3, 4)}, {0}, {0}, none, {0}, "add"},
        {FR_OP_VIEW, 1, {fr_shape3(2, 3, 4)}, {0}, {0}, {.shape = {2, {2, 12}}}, {0}, "view"},
        {FR_OP_CROSS_ENTROPY,
         2,
         {fr_shape2(4, 5), fr_shape1(4)},
         {0, 1},
         {0},
         ce,
         {0},
         "cross_entropy"},
        {FR_OP_CROSS_ENTROPY,
         2,
         {fr_shape3(2, 3, 5), fr_shape2(2, 3)},
         {0, 1},
         {0},
         ce,
         {0},
         "cross_entropy (B,T,V)"},
        {FR_OP_MSE, 2, {fr_shape2(3, 4), fr_shape2(3, 4)}, {0}, {0, 1}, ce, {0}, "mse"},
        /* ids below 5 over 6 positions: some rows of W repeat, some are never
         * read (their gradient must be 0) */
        {FR_OP_EMBEDDING, 2, {fr_shape2(2, 3), fr_shape2(5, 4)}, {5}, {0}, none, {0}, "embedding"},
        /* T = 3 of Tmax = 5: rows 3, 4 get no gradient */
        {FR_OP_POS_EMBEDDING,
         2,
         {fr_shape3(2, 3, 4), fr_shape2(5, 4)},
         {0},
         {0},
         none,
         {0},
         "pos_embedding"},
        {FR_OP_ATTENTION, 1, {fr_shape3(2, 5, 12)}, {0}, {0}, attn2, {0}, "attention NH 2"},
        /* past a key tile (32) and a query tile (64): T = 67, C = 8, HS 4 */
        {FR_OP_ATTENTION, 1, {fr_shape3(1, 67, 24)}, {0}, {0}, attn2, {0}, "attention T 67"},
    };
    int ncase = (int)(sizeof cases / sizeof cases[0]);
    /* Every differentiable op of the table has a case. */
    for (int op = 0; op < FR_OP_COUNT; op++) {
        const fr_op_info *info = fr_op_get((fr_op)op);
        CHECK(info->name && info->shape, "op %d has no table row", op);
        if (!info->backward) continue;
        int found = 0;
        for (int i = 0; i < ncase; i++) found |= cases[i].op == (fr_op)op;
        CHECK(found, "op %s has a backward rule but no gradient-check case", info->name);
    }
    for (int i = 0; i < ncase; i++) run_case(&cases[i]);
    return check_done();
}
