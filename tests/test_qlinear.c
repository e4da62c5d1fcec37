/* test_qlinear.c — QLINEAR and QLINEAR_BWD, the linear layer over a frozen
 * quantized weight, called as the executor calls them (a kernel call on the
 * node's tensors): y = x W'^T + b and dx = dy W' against float64 products
 * on W' = fr_dequantize_rows (the format's own round trip, checked against
 * float64 references in test_quant.c), for int8, NF4 and bf16 weights whose
 * GEMMs cross several tiles; 1, 2 and 3 threads give the same bits; the
 * kernel refuses a weight of the wrong size and a workspace too small.
 *
 * With a bf16 input (what the mixed-precision pass gives QLINEAR where the
 * CPU has a native bf16 GEMM) the kernels dequantize W' into bf16 panels
 * and run oneDNN's bf16 matmul: checked against float64 products of the
 * bf16-rounded x (dy) and W' (rounded here by hand from fr_dequantize_rows,
 * round to nearest even, not by the code under test), on weights that cross
 * two panels each way, with the same bound (products of bf16 values are
 * exact in f32, so only the f32 sums err); fr_dequantize_bf16 equals that
 * rounding bit for bit; the same call twice gives the same bits; a GEMM
 * scratch one byte short is refused naming both sizes. Skipped, with a line
 * saying so, on a CPU without a native bf16 GEMM.
 *
 * Bound: each output is a K-term (or O-term) f32 dot product of values
 * below 1 in magnitude; f32 summation in any order is within K eps sum|terms|
 * of the exact sum, so |got - ref| <= 1e-6 * (1 + sum_k |x_k w_k|) * K / 8
 * is met with room (eps = 6e-8) and a wrong tile, row or scale moves values
 * by O(1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "bf16_ref.h"
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

static void run16(fr_qfmt fmt, int64_t N, int64_t O, int64_t K, int bias) {
    fr_rng r = fr_rng_make(13, (uint64_t)(fmt * 1000 + O));
    float *w = malloc((size_t)(O * K) * 4), *wd = malloc((size_t)(O * K) * 4);
    uint16_t *w16 = malloc((size_t)(O * K) * 2), *got16 = malloc((size_t)(O * K) * 2);
    uint16_t *x = malloc((size_t)(N * K) * 2), *dy = malloc((size_t)(N * O) * 2);
    float *b = malloc((size_t)O * 4);
    for (int64_t i = 0; i < O * K; i++) w[i] = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < N * K; i++) x[i] = ref_bf16(2.0f * fr_rng_next_uniform(&r) - 1.0f);
    for (int64_t i = 0; i < N * O; i++) dy[i] = ref_bf16(2.0f * fr_rng_next_uniform(&r) - 1.0f);
    for (int64_t i = 0; i < O; i++) b[i] = fr_rng_next_uniform(&r);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, fmt, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, wd) == FR_OK, "%s", fr_last_error(g_ctx));
    for (int64_t i = 0; i < O * K; i++) w16[i] = ref_bf16(wd[i]);
    /* a block in the middle, row stride wider than the block */
    const int64_t o0 = O / 3, rows = O / 2, k0 = K / 5, kc = K / 2;
    memset(got16, 0, (size_t)(O * K) * 2);
    CHECK(fr_dequantize_bf16(g_ctx, &q, o0, rows, k0, kc, got16, K) == FR_OK, "%s",
          fr_last_error(g_ctx));
    int diff = 0;
    for (int64_t i = 0; i < rows; i++)
        diff += memcmp(got16 + i * K, w16 + (o0 + i) * K + k0, (size_t)kc * 2) != 0;
    CHECK(diff == 0, "%s: fr_dequantize_bf16 differs from the rounded W' in %d rows",
          fr_qfmt_name(fmt), diff);
    CHECK(fr_dequantize_bf16(g_ctx, &q, 0, O, 1, K, got16, K) == FR_ERR_ARG &&
              strstr(fr_last_error(g_ctx), "columns 1 to"),
          "a block past W's columns: %s", fr_last_error(g_ctx));
    const size_t bytes = fr_quant_bytes(fmt, O, K);
    uint8_t *blob = malloc(bytes + 4);
    memcpy(blob, q.block, bytes);
    fr_node node = {.op = FR_OP_QLINEAR};
    node.attr.shape = fr_shape2(O, K);
    node.attr.qfmt = fmt;
    const size_t wsf = fr_k_qlinear16_ws(N, O, K, 0), wsb = fr_k_qlinear16_ws(N, O, K, 1);
    const size_t wsn = wsf > wsb ? wsf : wsb;
    void *ws = malloc(wsn);
    float *y[2], *dx[2];
    fr_set_threads(g_ctx, 2);
    for (int t = 0; t < 2; t++) {
        y[t] = malloc((size_t)(N * O) * 4), dx[t] = malloc((size_t)(N * K) * 4);
        fr_kernel_call c = {.ctx = g_ctx, .node = &node, .gemm_ws = ws, .gemm_ws_len = wsf};
        c.in[0] = (fr_tensor){FR_BF16, fr_shape2(N, K), x, NULL, 0};
        c.in[1] = (fr_tensor){FR_U8, fr_shape1((int64_t)bytes), blob, NULL, 0};
        c.in[2] = t32(bias ? b : NULL, fr_shape1(O));
        c.out[0] = t32(y[t], fr_shape2(N, O));
        CHECK(fr_k_qlinear(&c) == FR_OK, "qlinear bf16: %s", fr_last_error(g_ctx));
        fr_kernel_call d = {.ctx = g_ctx, .node = &node, .gemm_ws = ws, .gemm_ws_len = wsb};
        d.in[0] = (fr_tensor){FR_BF16, fr_shape2(N, O), dy, NULL, 0};
        d.in[1] = c.in[1];
        d.out[0] = t32(dx[t], fr_shape2(N, K));
        CHECK(fr_k_qlinear_bwd(&d) == FR_OK, "qlinear_bwd bf16: %s", fr_last_error(g_ctx));
        if (t == 0) { /* scratch one byte short */
            c.gemm_ws_len = wsf - 1;
            CHECK(fr_k_qlinear(&c) == FR_ERR_ARG &&
                      strstr(fr_last_error(g_ctx), "bytes of GEMM scratch, the plan gave"),
                  "a short scratch: %s", fr_last_error(g_ctx));
        }
    }
    double worst = 0;
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = bias ? b[o] : 0, a = 1;
            for (int64_t k = 0; k < K; k++) {
                double t =
                    (double)ref_bf16_value(x[n * K + k]) * (double)ref_bf16_value(w16[o * K + k]);
                s += t, a += fabs(t);
            }
            double e = fabs(y[0][n * O + o] - s) / a;
            worst = e > worst ? e : worst;
            bad += e > 1e-6 * (double)K / 8;
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0, a = 1;
            for (int64_t o = 0; o < O; o++) {
                double t =
                    (double)ref_bf16_value(dy[n * O + o]) * (double)ref_bf16_value(w16[o * K + k]);
                s += t, a += fabs(t);
            }
            double e = fabs(dx[0][n * K + k] - s) / a;
            worst = e > worst ? e : worst;
            bad += e > 1e-6 * (double)O / 8;
        }
    CHECK(bad == 0, "%s bf16 (%lld,%lld,%lld): %d values off the float64 product (worst %.2e)",
          fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, bad, worst);
    CHECK(!memcmp(y[0], y[1], (size_t)(N * O) * 4) && !memcmp(dx[0], dx[1], (size_t)(N * K) * 4),
          "%s bf16: the same call twice gives other bits", fr_qfmt_name(fmt));
    printf("qlinear %-4s bf16 N %4lld O %4lld K %4lld bias %d: worst %.2e of sum |terms|\n",
           fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, bias, worst);
    for (int t = 0; t < 2; t++) free(y[t]), free(dx[t]);
    fr_quant_free(g_ctx, &q);
    free(w), free(wd), free(w16), free(got16), free(x), free(dy), free(b), free(blob), free(ws);
}

int main(void) {
    g_ctx = fr_ctx_new();
    for (int f = 0; f < FR_QFMT_COUNT; f++) {
        run((fr_qfmt)f, 37, 1500, 100, 1); /* two forward tiles, six dx row tiles */
        run((fr_qfmt)f, 600, 70, 300, 0);  /* two chunks of rows, two dx column panels */
    }
    if (!fr_gemm16_native(FR_BF16)) {
        printf("bf16 input: SKIPPED, this CPU (or build) has no native bf16 GEMM\n");
    } else {
        for (int f = 0; f < FR_QFMT_COUNT; f++) {
            run16((fr_qfmt)f, 9, 1100, 1000, 1); /* two row panels forward, two column ones back */
            run16((fr_qfmt)f, 33, 70, 301, 0);   /* one panel each way, odd sizes */
        }
    }
    fr_ctx_free(g_ctx);
    return check_done();
}
