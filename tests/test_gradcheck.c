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
#include "op_cases.h"

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
    void *blob[5];    /* quantized weights' bytes */
    float *target;
    int out, target_val, loss, main_out;
    size_t n[5];
} harness;

static double run_loss(harness *h, int with_backward) {
    for (int i = 0; i < 5; i++) {
        if (h->in_val[i] < 0) continue;
        h->ex.ptr[h->in_val[i]] = h->data[i]   ? (void *)h->data[i]
                                  : h->blob[i] ? h->blob[i]
                                               : (void *)h->ints[i];
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
        if (c->is_int[i] < 0) {           /* random (O, K) values, quantized: a frozen buffer */
            const int64_t O = c->in[i].d[0], K = c->in[i].d[1];
            float *w = malloc((size_t)(O * K) * sizeof(float));
            for (int64_t k = 0; k < O * K; k++) w[k] = frand(&r);
            fr_qweight q;
            CHECK(fr_quantize(h.ctx, OP_QFMT(c->is_int[i]), w, O, K, &q) == FR_OK, "%s: %s",
                  c->what, fr_last_error(h.ctx));
            h.n[i] = fr_quant_bytes(q.fmt, O, K);
            h.blob[i] = malloc(h.n[i]);
            memcpy(h.blob[i], q.block, h.n[i]);
            fr_quant_free(h.ctx, &q);
            free(w);
            h.in_val[i] = fr_graph_value(&h.g, FR_VAL_BUFFER, FR_U8, fr_shape1((int64_t)h.n[i]));
            continue;
        }
        int lab = c->is_int[i] == 1, ids = c->is_int[i] > 1;
        h.in_val[i] = fr_graph_value(&h.g,
                                     lab   ? FR_VAL_LABEL
                                     : ids ? FR_VAL_INPUT
                                           : (c->no_grad[i] ? FR_VAL_BUFFER : FR_VAL_PARAM),
                                     lab || ids ? FR_I32 : FR_F32, c->in[i]);
        h.g.vals[h.in_val[i]].batched = i == 0 || lab;
        h.n[i] = (size_t)fr_shape_numel(&c->in[i]);
        if (lab || ids) {
            uint64_t below =
                ids ? (uint64_t)c->is_int[i]
                    : (uint64_t)(c->op == FR_OP_LINEAR_CE ? c->in[1].d[0]
                                                          : c->in[0].d[c->in[0].ndim - 1]);
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
    if (c->op == FR_OP_CROSS_ENTROPY || c->op == FR_OP_MSE ||
        c->op == FR_OP_LINEAR_CE) { /* the op is the loss itself */
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
        free(h.blob[i]);
    }
    free(h.target);
    fr_mem_stats st;
    fr_mem_get_stats(h.ctx, &st);
    CHECK(st.allocated_total == 0, "%s: %zu bytes leaked", c->what, st.allocated_total);
    fr_ctx_free(h.ctx);
}

int main(void) {
    gcase cases[OP_CASES_MAX];
    int ncase = op_cases(cases);
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
