/* test_qlinear.c — QLINEAR and QLINEAR_BWD, the linear layer over a frozen
 * quantized weight, called as the executor calls them (a kernel call on the
 * node's tensors): y = x W'^T + b and dx = dy W' against float64 products
 * on W' = fr_dequantize_rows (the format's own round trip, checked against
 * float64 references in test_quant.c), for int8, NF4 and bf16 weights whose
 * GEMMs cross several tiles; 1, 2 and 3 threads give the same bits; the
 * kernel refuses a weight of the wrong size and a workspace too small.
 *
 * Bound: each output is a K-term (or O-term) f32 dot product of values
 * below 1 in magnitude; f32 summation in any order is within K eps sum|terms|
 * of the exact sum, so |got - ref| <= 1e-6 * (1 + sum_k |x_k w_k|) * K / 8
 * is met with room (eps = 6e-8) and a wrong tile, row or scale moves values
 * by O(1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "quant/quant.h"

static fr_ctx *g_ctx;

static fr_tensor t32(float *p, fr_shape s) { return (fr_tensor){FR_F32, s, p, NULL, 0}; }

static void run(fr_qfmt fmt, int64_t N, int64_t O, int64_t K, int bias) {
    fr_rng r = fr_rng_make(11, (uint64_t)(fmt * 1000 + O));
    float *w = malloc((size_t)(O * K) * 4), *wd = malloc((size_t)(O * K) * 4);
    float *x = malloc((size_t)(N * K) * 4), *dy = malloc((size_t)(N * O) * 4);
    float *b = malloc((size_t)O * 4);
    for (int64_t i = 0; i < O * K; i++) w[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < N * K; i++) x[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < N * O; i++) dy[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < O; i++) b[i] = fr_rng_next_uniform(&r);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, fmt, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, wd) == FR_OK, "%s", fr_last_error(g_ctx));
    const size_t bytes = fr_quant_bytes(fmt, O, K);
    uint8_t *blob = malloc(bytes + 4);
    memcpy(blob, q.block, bytes);
    fr_node node = {.op = FR_OP_QLINEAR};
    node.attr.shape = fr_shape2(O, K);
    node.attr.qfmt = fmt;
    float *y[3], *dx[3];
    const int threads[3] = {1, 2, 3};
    const size_t wsn = fr_qgemm_ws_floats(O, K, 3);
    float *ws = malloc(wsn * 4);
    for (int t = 0; t < 3; t++) {
        fr_set_threads(g_ctx, threads[t]);
        y[t] = malloc((size_t)(N * O) * 4), dx[t] = malloc((size_t)(N * K) * 4);
        fr_kernel_call c = {.ctx = g_ctx, .node = &node};
        c.in[0] = t32(x, fr_shape3(N, 1, K));
        c.in[1] = (fr_tensor){FR_U8, fr_shape1((int64_t)bytes), blob, NULL, 0};
        c.in[2] = t32(bias ? b : NULL, fr_shape1(O));
        c.out[0] = t32(y[t], fr_shape3(N, 1, O));
        c.out[1] = t32(ws, fr_shape1((int64_t)wsn));
        CHECK(fr_k_qlinear(&c) == FR_OK, "qlinear: %s", fr_last_error(g_ctx));
        fr_kernel_call d = {.ctx = g_ctx, .node = &node};
        d.in[0] = t32(dy, fr_shape2(N, O));
        d.in[1] = c.in[1];
        d.out[0] = t32(dx[t], fr_shape2(N, K));
        d.out[3] = c.out[1];
        CHECK(fr_k_qlinear_bwd(&d) == FR_OK, "qlinear_bwd: %s", fr_last_error(g_ctx));
    }
    double worst = 0;
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = bias ? b[o] : 0, a = 1;
            for (int64_t k = 0; k < K; k++)
                s += (double)x[n * K + k] * wd[o * K + k], a += fabs(x[n * K + k] * wd[o * K + k]);
            double e = fabs(y[0][n * O + o] - s) / a;
            worst = e > worst ? e : worst;
            bad += e > 1e-6 * (double)K / 8;
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0, a = 1;
            for (int64_t o = 0; o < O; o++)
                s += (double)dy[n * O + o] * wd[o * K + k],
                    a += fabs(dy[n * O + o] * wd[o * K + k]);
            double e = fabs(dx[0][n * K + k] - s) / a;
            worst = e > worst ? e : worst;
            bad += e > 1e-6 * (double)O / 8;
        }
    CHECK(bad == 0, "%s (%lld,%lld,%lld): %d values off the float64 product (worst %.2e)",
          fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, bad, worst);
    for (int t = 1; t < 3; t++)
        CHECK(!memcmp(y[0], y[t], (size_t)(N * O) * 4) &&
                  !memcmp(dx[0], dx[t], (size_t)(N * K) * 4),
              "%s: %d threads give other bits than one", fr_qfmt_name(fmt), threads[t]);
    printf("qlinear %-4s N %4lld O %4lld K %4lld bias %d: worst %.2e of sum |terms|\n",
           fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, bias, worst);
    /* refusals: a weight one byte short, a workspace smaller than a tile */
    fr_kernel_call c = {.ctx = g_ctx, .node = &node};
    c.in[0] = t32(x, fr_shape2(N, K));
    c.in[1] = (fr_tensor){FR_U8, fr_shape1((int64_t)bytes - 1), blob, NULL, 0};
    c.out[0] = t32(y[0], fr_shape2(N, O));
    c.out[1] = t32(ws, fr_shape1((int64_t)wsn));
    CHECK(fr_k_qlinear(&c) == FR_ERR_SHAPE && strstr(fr_last_error(g_ctx), "bytes"),
          "a short weight: %s", fr_last_error(g_ctx));
    c.in[1].shape = fr_shape1((int64_t)bytes);
    c.out[1].shape = fr_shape1(1);
    CHECK(fr_k_qlinear(&c) == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "too small"),
          "a small workspace: %s", fr_last_error(g_ctx));
    for (int t = 0; t < 3; t++) free(y[t]), free(dx[t]);
    fr_quant_free(g_ctx, &q);
    free(w), free(wd), free(x), free(dy), free(b), free(blob), free(ws);
}

int main(void) {
    g_ctx = fr_ctx_new();
    for (int f = 0; f < FR_QFMT_COUNT; f++) {
        run((fr_qfmt)f, 37, 1500, 100, 1); /* two forward tiles, six dx row tiles */
        run((fr_qfmt)f, 600, 70, 300, 0);  /* two chunks of rows, two dx column panels */
    }
    fr_ctx_free(g_ctx);
    return check_done();
}
