/* test_norm_lanes.c — BatchNorm's four-plane sums on 16 AVX-512 lanes
 * (norm_lanes.c) give the bits of the 4-lane omp simd loops they replace
 * (norm.c's planes4, which FRUGAL_BN_SUMS=sse keeps): the forward's y,
 * saved mean and invstd and running statistics, the backward's dx, dgamma
 * and dbeta, for f32 and bf16 x, planes of every length mod 4 (the tail
 * into lane 0), batches of every size mod 4 (the planes past the last four
 * go through the one-plane loops), serial and parallel sizes. The reference
 * is the compiler's code for the loops as written, run on the same data. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "backend/cpu/norm_lanes.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

static fr_ctx *g_ctx;
static uint64_t g_seed = 7;

static float *frand(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 3);
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * fr_rng_next_uniform(&r);
    return p;
}

static int differ(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) != 0;
}

typedef struct run {
    float *y, *mean, *inv, *rm, *rv, *dx, *dg, *db;
} run;

/* forward (training) then backward of x (N,C,H,W), f32 or bf16 */
static void bn_run(fr_dtype dt, const void *x, fr_shape xs, const float *gamma, const float *beta,
                   const float *dy, int64_t C, run *r) {
    const int64_t n = fr_shape_numel(&xs);
    r->y = malloc((size_t)n * 4), r->dx = malloc((size_t)n * 4);
    r->mean = malloc((size_t)C * 4), r->inv = malloc((size_t)C * 4);
    r->rm = calloc((size_t)C, 4), r->rv = malloc((size_t)C * 4);
    r->dg = malloc((size_t)C * 4), r->db = malloc((size_t)C * 4);
    for (int64_t c = 0; c < C; c++) r->rv[c] = 1.0f;
    fr_node nd = {.op = FR_OP_BATCHNORM, .fwd = -1};
    nd.attr.training = 1, nd.attr.eps = 1e-5, nd.attr.momentum = 0.1;
    fr_kernel_call k = {.ctx = g_ctx, .node = &nd};
    fr_shape cs = fr_shape1(C);
    k.in[0] = (fr_tensor){.dtype = dt, .shape = xs, .data = (void *)x};
    k.in[1] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = (void *)gamma};
    k.in[2] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = (void *)beta};
    k.in[3] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->rm};
    k.in[4] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->rv};
    k.out[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = r->y};
    k.out[1] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->mean};
    k.out[2] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->inv};
    CHECK(fr_k_batchnorm(&k) == FR_OK, "batchnorm: %s", fr_last_error(g_ctx));
    fr_node nb = {.op = FR_OP_BATCHNORM_BWD, .fwd = -1};
    fr_kernel_call b = {.ctx = g_ctx, .node = &nb};
    b.in[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = (void *)dy};
    b.in[1] = k.in[0];
    b.in[2] = k.in[1];
    b.in[3] = k.out[1];
    b.in[4] = k.out[2];
    b.out[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = r->dx};
    b.out[1] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->dg};
    b.out[2] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = r->db};
    CHECK(fr_k_batchnorm_bwd(&b) == FR_OK, "batchnorm_bwd: %s", fr_last_error(g_ctx));
}

static void run_free(run *r) {
    free(r->y), free(r->mean), free(r->inv), free(r->rm), free(r->rv);
    free(r->dx), free(r->dg), free(r->db);
}

static void test_shape(fr_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W) {
    const fr_shape xs = fr_shape4(N, C, H, W);
    const int64_t n = fr_shape_numel(&xs);
    /* an offset mean, so that the two-float mean and the deviations matter */
    float *xf = frand(n, 2.0f, 5.0f), *dy = frand(n, -1, 1);
    float *gamma = frand(C, 0.5f, 1.5f), *beta = frand(C, -0.5f, 0.5f);
    uint16_t *xh = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        xh[i] = fr_f32_to_bf16(xf[i]);
        if (dt == FR_BF16) xf[i] = fr_bf16_to_f32(xh[i]);
    }
    const void *x = dt == FR_BF16 ? (const void *)xh : (const void *)xf;
    run ref, got;
    setenv("FRUGAL_BN_SUMS", "sse", 1);
    bn_run(dt, x, xs, gamma, beta, dy, C, &ref);
    unsetenv("FRUGAL_BN_SUMS");
    bn_run(dt, x, xs, gamma, beta, dy, C, &got);
    const char *name = dt == FR_BF16 ? "bf16" : "f32";
    CHECK(!differ(ref.y, got.y, n), "%s %lldx%lldx%lldx%lld: y", name, (long long)N, (long long)C,
          (long long)H, (long long)W);
    CHECK(!differ(ref.mean, got.mean, C) && !differ(ref.inv, got.inv, C),
          "%s %lldx%lldx%lldx%lld: mean, invstd", name, (long long)N, (long long)C, (long long)H,
          (long long)W);
    CHECK(!differ(ref.rm, got.rm, C) && !differ(ref.rv, got.rv, C),
          "%s %lldx%lldx%lldx%lld: running statistics", name, (long long)N, (long long)C,
          (long long)H, (long long)W);
    CHECK(!differ(ref.dx, got.dx, n), "%s %lldx%lldx%lldx%lld: dx", name, (long long)N,
          (long long)C, (long long)H, (long long)W);
    CHECK(!differ(ref.dg, got.dg, C) && !differ(ref.db, got.db, C),
          "%s %lldx%lldx%lldx%lld: dgamma, dbeta", name, (long long)N, (long long)C, (long long)H,
          (long long)W);
    /* the sums are not all the same: a test of the lanes' order needs them to differ */
    double m0 = 0;
    for (int64_t c = 0; c < C; c++) m0 += fabs((double)got.mean[c] - 3.5);
    CHECK(m0 > 0.0, "the means moved");
    run_free(&ref), run_free(&got);
    free(xf), free(dy), free(gamma), free(beta), free(xh);
}

int main(void) {
    g_ctx = fr_ctx_new();
    if (!fr_bn_lanes_on()) {
        printf(
            "skipped: no AVX-512 here, or a build whose own loops are wider or not vectorized: the "
            "reference loops run\n");
        fr_ctx_free(g_ctx);
        return 77;
    }
    const fr_dtype dts[2] = {FR_F32, FR_BF16};
    for (int d = 0; d < 2; d++) {
        for (int w = 1; w <= 9; w++) test_shape(dts[d], 5, 3, 3, w); /* plane lengths 3 .. 27 */
        for (int N = 4; N <= 7; N++) test_shape(dts[d], N, 2, 7, 7); /* 0-3 planes past the fours */
        test_shape(dts[d], 16, 32, 28, 28);                          /* the thread team */
        test_shape(dts[d], 9, 5, 14, 14);
    }
    fr_ctx_free(g_ctx);
    return check_done();
}
