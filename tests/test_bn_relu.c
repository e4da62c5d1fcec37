/* test_bn_relu.c — BatchNorm with the ReLU after it folded in (attr.relu,
 * plan/fold.h) writes the bits of BATCHNORM then RELU, the two kernels in
 * a row: training and eval, NCHW and nChw16c, y in f32, bf16 and f16 (the
 * ReLU then reads the rounded y, as the mixed-precision pass has it). Some
 * channels hold one value, so that their y is beta exactly (x - mean = 0):
 * the betas sit at the rounding thresholds of fr_relu_lo (minus half the
 * smallest subnormal of bf16 and f16, one ulp either side), on -0, +0,
 * tiny positives, a large negative that rounds to -inf in f16, and NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/rng.h"

static fr_ctx *g_ctx;

enum { N = 3, C = 32, HW = 25 };

static float next_down(float v) { return nextafterf(v, -INFINITY); }
static float next_up(float v) { return nextafterf(v, INFINITY); }

/* index of (n, c, i) in NCHW or nChw16c */
static int64_t at(int blocked, int64_t n, int64_t c, int64_t i) {
    return blocked ? ((n * (C / 16) + c / 16) * HW + i) * 16 + c % 16 : (n * C + c) * HW + i;
}

static size_t dt_size(fr_dtype d) { return d == FR_F32 ? 4 : 2; }

static void run_bn(int relu, int blocked, int training, fr_dtype ydt, const float *x,
                   const float *gamma, const float *beta, void *y) {
    float rm[C], rv[C], sm[C], si[C];
    for (int c = 0; c < C; c++) rm[c] = 0.25f * (float)(c % 5), rv[c] = 1.0f + 0.1f * (float)c;
    fr_node nd = {.op = FR_OP_BATCHNORM, .fwd = -1};
    nd.attr.training = training, nd.attr.eps = 1e-5f, nd.attr.momentum = 0.1f;
    nd.attr.relu = relu;
    nd.attr.blocked = blocked ? 1u | (1u << FR_BLK_OUT) : 0u;
    fr_kernel_call k = {.ctx = g_ctx, .node = &nd};
    const fr_shape xs = fr_shape4(N, C, 5, 5), cs = fr_shape1(C);
    k.in[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = (void *)x};
    k.in[1] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = (void *)gamma};
    k.in[2] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = (void *)beta};
    k.in[3] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = rm};
    k.in[4] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = rv};
    k.out[0] = (fr_tensor){.dtype = ydt, .shape = xs, .data = y};
    k.out[1] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = sm};
    k.out[2] = (fr_tensor){.dtype = FR_F32, .shape = cs, .data = si};
    CHECK(fr_k_batchnorm(&k) == FR_OK, "batchnorm: %s", fr_last_error(g_ctx));
    if (relu) return;
    fr_node rn = {.op = FR_OP_RELU, .fwd = -1};
    fr_kernel_call r = {.ctx = g_ctx, .node = &rn};
    r.in[0] = k.out[0];
    r.out[0] = k.out[0]; /* in place, as the unfused step may run it */
    CHECK(fr_k_relu(&r) == FR_OK, "relu: %s", fr_last_error(g_ctx));
}

static void test_case(int blocked, int training, fr_dtype ydt) {
    const int64_t n = (int64_t)N * C * HW;
    float *x = malloc((size_t)n * 4), gamma[C], beta[C];
    const float t16 = -0x1p-25f, tbf = -0x1p-134f;
    const float special[] = {
        t16,       next_down(t16), next_up(t16), tbf, next_down(tbf), next_up(tbf), -0.0f, 0.0f,
        0x1p-140f, -0x1p-140f,     -70000.0f,    NAN, -1e-30f,        1e-30f};
    const int n_special = (int)(sizeof special / sizeof *special);
    fr_rng rng = fr_rng_make(11, 2);
    for (int c = 0; c < C; c++) {
        gamma[c] = 0.5f + fr_rng_next_uniform(&rng);
        beta[c] = c < n_special ? special[c] : fr_rng_next_uniform(&rng) - 0.5f;
        for (int64_t b = 0; b < N; b++)
            for (int64_t i = 0; i < HW; i++)
                x[at(blocked, b, c, i)] =
                    c < n_special ? 1.5f : 2.0f * fr_rng_next_uniform(&rng) - 1;
    }
    /* eval: the running mean of a constant channel is not its value, so y
     * is not beta there; the rest of the range still covers both signs */
    void *a = malloc((size_t)n * dt_size(ydt)), *b = malloc((size_t)n * dt_size(ydt));
    run_bn(0, blocked, training, ydt, x, gamma, beta, a);
    run_bn(1, blocked, training, ydt, x, gamma, beta, b);
    const char *dn = ydt == FR_F32 ? "f32" : ydt == FR_BF16 ? "bf16" : "f16";
    CHECK(memcmp(a, b, (size_t)n * dt_size(ydt)) == 0, "%s %s %s y: fused differs from the pair",
          blocked ? "nChw16c" : "NCHW", training ? "training" : "eval", dn);
    /* the thresholds were met: both signs of zero appear in a 16-bit y */
    if (ydt != FR_F32 && training) {
        const uint16_t *h = b;
        int pz = 0, nz = 0;
        for (int64_t i = 0; i < n; i++) pz |= h[i] == 0, nz |= h[i] == 0x8000u;
        CHECK(pz && nz, "%s %s: +0 and -0 both in y (%d, %d)", dn, blocked ? "nChw16c" : "NCHW", pz,
              nz);
    }
    free(x), free(a), free(b);
}

int main(void) {
    g_ctx = fr_ctx_new();
    const fr_dtype dts[3] = {FR_F32, FR_BF16, FR_F16};
    for (int blocked = 0; blocked < 2; blocked++)
        for (int training = 0; training < 2; training++)
            for (int d = 0; d < 3; d++) {
                if (blocked && dts[d] == FR_F16) continue; /* blocked y: f32 or bf16 */
                test_case(blocked, training, dts[d]);
            }
    fr_ctx_free(g_ctx);
    return check_done();
}
