/* test_half_in.c — kernels that read a 16-bit input themselves (kernels.h,
 * the op table's half_in): given the f16 or bf16 value, each must produce the
 * bits it produces given the same values widened to f32 (widening is exact,
 * so anything else is a bug in the widening path): the activation backwards,
 * max pooling forward and backward, BatchNorm backward, and the shifted-GEMM
 * convolution forward and backward; both accumulate modes, serial and
 * parallel sizes. Inputs they cannot read in 16 bits are refused. Kernels
 * that write a 16-bit output (the activations, max pooling) give the f32
 * call's result rounded, bit for bit. Added for issue 23: the tanh GELU's
 * 16-bit x, LayerNorm's 16-bit y and its backward's 16-bit x, a bf16 linear
 * layer's bias and bf16 y as its GEMM's epilogue; ReLU's 16-bit x (every
 * pattern). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

static fr_ctx *g_ctx;
static uint64_t g_seed = 1;

typedef struct call {
    fr_node node;
    fr_kernel_call c;
} call;

static void call_init(call *k, fr_op op, const fr_attr *a) {
    memset(k, 0, sizeof *k);
    k->node.op = op;
    k->node.fwd = -1;
    if (a) k->node.attr = *a;
    k->c.ctx = g_ctx;
    k->c.node = &k->node;
}

static fr_tensor tf(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_F32, .shape = s, .data = data};
}

static float *frand(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 5);
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * fr_rng_next_uniform(&r);
    return p;
}

static float *fcopy(const float *s, int64_t n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    memcpy(p, s, (size_t)n * sizeof(float));
    return p;
}

/* A 16-bit input: its bits (h) and the same values widened (w). */
typedef struct half_in {
    fr_dtype dt;
    uint16_t *h;
    float *w;
} half_in;

static half_in make_half(fr_dtype dt, const float *src, int64_t n) {
    half_in x = {dt, malloc((size_t)(n ? n : 1) * 2), malloc((size_t)(n ? n : 1) * 4)};
    for (int64_t i = 0; i < n; i++) {
        x.h[i] = dt == FR_F16 ? fr_f32_to_f16(src[i]) : fr_f32_to_bf16(src[i]);
        x.w[i] = dt == FR_F16 ? fr_f16_to_f32(x.h[i]) : fr_bf16_to_f32(x.h[i]);
    }
    return x;
}

static void free_half(half_in *x) {
    free(x->h);
    free(x->w);
}

static fr_tensor th(const half_in *x, fr_shape s) {
    return (fr_tensor){.dtype = x->dt, .shape = s, .data = x->h};
}

static void same_bits(const char *what, const char *dt, const float *a, const float *b, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) bad++, first = first < 0 ? i : first;
    CHECK(bad == 0, "%s (%s): %lld of %lld values differ, first at %lld (%.9g vs %.9g)", what, dt,
          (long long)bad, (long long)n, (long long)first, first >= 0 ? a[first] : 0.0,
          first >= 0 ? b[first] : 0.0);
}

static const char *dt_name(fr_dtype dt) { return dt == FR_F16 ? "f16" : "bf16"; }

/* dx (+)= G(dy, s) with s in 16 bits vs s widened; approx: GELU's attr.approx
 * (1: the tanh formula, whose 16-bit paths run its AVX2 spans) */
static void act_bwd_checks(const half_in *s, fr_op op, const char *name, int64_t n, int approx) {
    float *dy = frand(n, -1, 1);
    fr_shape sh = fr_shape1(n);
    for (int acc = 0; acc < 2; acc++) {
        float *a = frand(n, -1, 1), *b = fcopy(a, n);
        call k;
        fr_attr at = {.approx = approx};
        call_init(&k, op, &at);
        k.c.accumulate = (uint32_t)acc;
        k.c.in[0] = tf(dy, sh);
        k.c.in[1] = tf(s->w, sh);
        k.c.out[0] = tf(a, sh);
        CHECK(fr_cpu_backend.kernels[op](&k.c) == FR_OK, "%s f32", name);
        k.c.in[1] = th(s, sh);
        k.c.out[0] = tf(b, sh);
        CHECK(fr_cpu_backend.kernels[op](&k.c) == FR_OK, "%s 16-bit: %s", name,
              fr_last_error(g_ctx));
        char what[96];
        snprintf(what, sizeof what, "%s n=%lld accumulate=%d", name, (long long)n, acc);
        same_bits(what, dt_name(s->dt), a, b, n);
        free(a);
        free(b);
    }
    free(dy);
}

static void test_act_bwd(fr_dtype dt, fr_op op, const char *name, int64_t n, int approx) {
    float *s0 = frand(n, -3, 3);
    half_in s = make_half(dt, s0, n);
    act_bwd_checks(&s, op, name, n, approx);
    free(s0);
    free_half(&s);
}

static void test_maxpool(fr_dtype dt, int64_t H, int64_t W, int K, int S) {
    const int64_t N = 2, C = 3, OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    float *x0 = frand(nx, -2, 2), *dy = frand(ny, -1, 1);
    /* ties matter for the argmax: a few repeated values */
    for (int64_t i = 0; i + 1 < nx; i += 7) x0[i + 1] = x0[i];
    x0[nx / 3] = NAN; /* a window with a NaN: a 16-window group falls back to the scalar rule */
    half_in x = make_half(dt, x0, nx);
    fr_shape xs = fr_shape4(N, C, H, W), ys = fr_shape4(N, C, OH, OW);
    fr_attr a = {.kernel = K, .stride = S};
    char what[96];
    float *y1 = frand(ny, 0, 1), *y2 = frand(ny, 0, 1);
    call k;
    call_init(&k, FR_OP_MAXPOOL2D, &a);
    k.c.in[0] = tf(x.w, xs);
    k.c.out[0] = tf(y1, ys);
    CHECK(fr_k_maxpool2d(&k.c) == FR_OK, "maxpool f32");
    k.c.in[0] = th(&x, xs);
    k.c.out[0] = tf(y2, ys);
    CHECK(fr_k_maxpool2d(&k.c) == FR_OK, "maxpool 16-bit: %s", fr_last_error(g_ctx));
    snprintf(what, sizeof what, "maxpool %lldx%lld k%d s%d", (long long)H, (long long)W, K, S);
    same_bits(what, dt_name(dt), y1, y2, ny);
    for (int acc = 0; acc < 4; acc++) { /* accumulate bit 0, attr.masked bit 1 */
        float *d1 = frand(nx, -1, 1), *d2 = fcopy(d1, nx);
        fr_attr am = a;
        am.masked = acc >> 1;
        call_init(&k, FR_OP_MAXPOOL2D_BWD, &am);
        k.c.accumulate = (uint32_t)(acc & 1);
        k.c.in[0] = tf(dy, ys);
        k.c.in[1] = tf(x.w, xs);
        k.c.out[0] = tf(d1, xs);
        CHECK(fr_k_maxpool2d_bwd(&k.c) == FR_OK, "maxpool_bwd f32");
        k.c.in[1] = th(&x, xs);
        k.c.out[0] = tf(d2, xs);
        CHECK(fr_k_maxpool2d_bwd(&k.c) == FR_OK, "maxpool_bwd 16-bit: %s", fr_last_error(g_ctx));
        snprintf(what, sizeof what, "maxpool_bwd %lldx%lld k%d s%d accumulate=%d masked=%d",
                 (long long)H, (long long)W, K, S, acc & 1, acc >> 1);
        same_bits(what, dt_name(dt), d1, d2, nx);
        free(d1);
        free(d2);
    }
    free(x0);
    free(dy);
    free(y1);
    free(y2);
    free_half(&x);
}

static void test_batchnorm_bwd(fr_dtype dt, fr_shape xs) {
    const int64_t n = fr_shape_numel(&xs), C = xs.d[1];
    float *x0 = frand(n, -2, 3), *dy = frand(n, -1, 1), *gamma = frand(C, 0.5f, 1.5f);
    float *mean = frand(C, -0.5f, 0.5f), *inv = frand(C, 0.5f, 2);
    half_in x = make_half(dt, x0, n);
    for (int acc = 0; acc < 2; acc++) {
        float *dx[2], *dg[2], *db[2];
        for (int r = 0; r < 2; r++) {
            dx[r] = r ? fcopy(dx[0], n) : frand(n, -1, 1);
            dg[r] = r ? fcopy(dg[0], C) : frand(C, -1, 1);
            db[r] = r ? fcopy(db[0], C) : frand(C, -1, 1);
        }
        for (int r = 0; r < 2; r++) {
            call k;
            call_init(&k, FR_OP_BATCHNORM_BWD, NULL);
            k.c.accumulate = acc ? 7u : 0u;
            k.c.in[0] = tf(dy, xs);
            k.c.in[1] = r ? th(&x, xs) : tf(x.w, xs);
            k.c.in[2] = tf(gamma, fr_shape1(C));
            k.c.in[3] = tf(mean, fr_shape1(C));
            k.c.in[4] = tf(inv, fr_shape1(C));
            k.c.out[0] = tf(dx[r], xs);
            k.c.out[1] = tf(dg[r], fr_shape1(C));
            k.c.out[2] = tf(db[r], fr_shape1(C));
            CHECK(fr_k_batchnorm_bwd(&k.c) == FR_OK, "batchnorm_bwd %s: %s", r ? "16-bit" : "f32",
                  fr_last_error(g_ctx));
        }
        char what[96];
        snprintf(what, sizeof what, "batchnorm_bwd %dd accumulate=%d dx", xs.ndim, acc);
        same_bits(what, dt_name(dt), dx[0], dx[1], n);
        snprintf(what, sizeof what, "batchnorm_bwd %dd accumulate=%d dgamma, dbeta", xs.ndim, acc);
        same_bits(what, dt_name(dt), dg[0], dg[1], C);
        same_bits(what, dt_name(dt), db[0], db[1], C);
        for (int r = 0; r < 2; r++) free(dx[r]), free(dg[r]), free(db[r]);
    }
    free(x0), free(dy), free(gamma), free(mean), free(inv);
    free_half(&x);
}

/* The shifted-GEMM convolution (8+ channels, stride 1, "same" padding). */
static void test_conv(fr_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC, int K,
                      int threads) {
    omp_set_num_threads(threads);
    const int P = (K - 1) / 2;
    const int64_t nx = N * C * H * W, nw = OC * C * K * K, ny = N * OC * H * W;
    fr_shape xs = fr_shape4(N, C, H, W), wsh = fr_shape4(OC, C, K, K), ys = fr_shape4(N, OC, H, W);
    CHECK(fr_conv2d_reads_half(&xs, dt, OC, K, 1, P), "conv C=%lld K=%d takes the shifted path",
          (long long)C, K);
    float *x0 = frand(nx, -1, 1), *w = frand(nw, -1, 1), *b = frand(OC, -1, 1),
          *dy = frand(ny, -1, 1);
    half_in x = make_half(dt, x0, nx);
    fr_attr a = {.kernel = K, .stride = 1, .pad = P};
    int64_t nws = fr_conv2d_ws_elems(&xs, dt, OC, K, 1, P, 0, 0),
            nwsb = fr_conv2d_ws_elems(&xs, dt, OC, K, 1, P, 1, 0);
    float *ws = frand(nws, 0, 1), *wsb = frand(nwsb, 0, 1);
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int r = 0; r < 2; r++) {
        y[r] = frand(ny, 0, 1);
        call k;
        call_init(&k, FR_OP_CONV2D, &a);
        k.c.in[0] = r ? th(&x, xs) : tf(x.w, xs);
        k.c.in[1] = tf(w, wsh);
        k.c.in[2] = tf(b, fr_shape1(OC));
        k.c.out[0] = tf(y[r], ys);
        k.c.out[1] = tf(ws, fr_shape1(nws));
        CHECK(fr_k_conv2d(&k.c) == FR_OK, "conv2d %d: %s", r, fr_last_error(g_ctx));
        dx[r] = frand(nx, 0, 1), dw[r] = frand(nw, 0, 1), db[r] = frand(OC, 0, 1);
        call_init(&k, FR_OP_CONV2D_BWD, &a);
        k.c.in[0] = tf(dy, ys);
        k.c.in[1] = r ? th(&x, xs) : tf(x.w, xs);
        k.c.in[2] = tf(w, wsh);
        k.c.out[0] = tf(dx[r], xs);
        k.c.out[1] = tf(dw[r], wsh);
        k.c.out[2] = tf(db[r], fr_shape1(OC));
        k.c.out[3] = tf(wsb, fr_shape1(nwsb));
        CHECK(fr_k_conv2d_bwd(&k.c) == FR_OK, "conv2d_bwd %d: %s", r, fr_last_error(g_ctx));
    }
    char what[96];
    snprintf(what, sizeof what, "conv2d C=%lld %lldx%lld K=%d %d threads: y", (long long)C,
             (long long)H, (long long)W, K, threads);
    same_bits(what, dt_name(dt), y[0], y[1], ny);
    snprintf(what, sizeof what, "conv2d_bwd C=%lld K=%d: dx, dW, db", (long long)C, K);
    same_bits(what, dt_name(dt), dx[0], dx[1], nx);
    same_bits(what, dt_name(dt), dw[0], dw[1], nw);
    same_bits(what, dt_name(dt), db[0], db[1], OC);
    for (int r = 0; r < 2; r++) free(y[r]), free(dx[r]), free(dw[r]), free(db[r]);
    free(x0), free(w), free(b), free(dy), free(ws), free(wsb);
    free_half(&x);
    omp_set_num_threads(2);
}

static void same_rounded(const char *what, fr_dtype dt, const float *y32, const uint16_t *yh,
                         int64_t n);

/* The tanh GELU reading a 16-bit x (a bf16 GEMM's output): the bits of the
 * call on the widened x, into an f32 y and into a 16-bit y (rounded). */
static void gelu_x_checks(const half_in *x, int64_t n, const char *what) {
    float *a = frand(n, 0, 1), *b = frand(n, 0, 1);
    uint16_t *bh = malloc((size_t)n * 2);
    fr_shape sh = fr_shape1(n);
    call k;
    fr_attr at = {.approx = 1};
    call_init(&k, FR_OP_GELU, &at);
    k.c.in[0] = tf(x->w, sh);
    k.c.out[0] = tf(a, sh);
    CHECK(fr_k_gelu(&k.c) == FR_OK, "gelu f32");
    k.c.in[0] = th(x, sh);
    k.c.out[0] = tf(b, sh);
    CHECK(fr_k_gelu(&k.c) == FR_OK, "gelu 16-bit x: %s", fr_last_error(g_ctx));
    same_bits(what, dt_name(x->dt), a, b, n);
    k.c.out[0] = (fr_tensor){.dtype = x->dt, .shape = sh, .data = bh};
    CHECK(fr_k_gelu(&k.c) == FR_OK, "gelu 16-bit x, 16-bit y: %s", fr_last_error(g_ctx));
    same_rounded(what, x->dt, a, bh, n);
    free(a), free(b), free(bh);
}

static void test_gelu_in(fr_dtype dt, int64_t n) {
    float *x0 = frand(n, -4, 4);
    half_in x = make_half(dt, x0, n);
    char what[64];
    snprintf(what, sizeof what, "gelu (tanh) 16-bit x n=%lld", (long long)n);
    gelu_x_checks(&x, n, what);
    free(x0);
    free_half(&x);
}

/* The tanh GELU and its backward on every 16-bit pattern of dt (each
 * finite value, the infinities, the NaNs, the subnormals), x in 16 bits
 * against the f32 calls on the widened x: y f32 and 16-bit, dx set and
 * added into; the same bits for each value (the 16-bit path looks x up in
 * tables made by the f32 loops, activation.c) */
static void test_gelu_every(fr_dtype dt) {
    const int64_t n = 65536;
    half_in x = {dt, malloc((size_t)n * 2), malloc((size_t)n * 4)};
    for (int64_t i = 0; i < n; i++) {
        x.h[i] = (uint16_t)i;
        x.w[i] = dt == FR_F16 ? fr_f16_to_f32(x.h[i]) : fr_bf16_to_f32(x.h[i]);
    }
    gelu_x_checks(&x, n, "gelu (tanh), every 16-bit x");
    act_bwd_checks(&x, FR_OP_GELU_BWD, "gelu_bwd (tanh), every 16-bit x", n, 1);
    free_half(&x);
}

/* LayerNorm writing a 16-bit y (the f32 call's y rounded), and its backward
 * reading a 16-bit x (the bits of the call on the widened x: dx, dgamma and
 * dbeta, both accumulate modes); rows over FR_HALF_PLANE_MAX refused. */
static void test_layernorm(fr_dtype dt, int64_t N, int64_t D) {
    const int64_t n = N * D;
    float *x0 = frand(n, -2, 3), *gamma = frand(D, 0.5f, 1.5f), *beta = frand(D, -1, 1);
    half_in x = make_half(dt, x0, n);
    float *y = frand(n, 0, 1), *mean = frand(N, 0, 1), *rstd = frand(N, 0, 1);
    uint16_t *yh = malloc((size_t)n * 2);
    fr_shape xs = fr_shape2(N, D), gs = fr_shape1(D), ms = fr_shape1(N);
    call k;
    fr_attr at = {.eps = 1e-5};
    call_init(&k, FR_OP_LAYERNORM, &at);
    k.c.in[0] = tf(x.w, xs);
    k.c.in[1] = tf(gamma, gs);
    k.c.in[2] = tf(beta, gs);
    k.c.out[0] = tf(y, xs);
    k.c.out[1] = tf(mean, ms);
    k.c.out[2] = tf(rstd, ms);
    CHECK(fr_k_layernorm(&k.c) == FR_OK, "layernorm f32: %s", fr_last_error(g_ctx));
    k.c.out[0] = (fr_tensor){.dtype = dt, .shape = xs, .data = yh};
    CHECK(fr_k_layernorm(&k.c) == FR_OK, "layernorm 16-bit y: %s", fr_last_error(g_ctx));
    char what[96];
    snprintf(what, sizeof what, "layernorm y N=%lld D=%lld", (long long)N, (long long)D);
    same_rounded(what, dt, y, yh, n);
    float *dy = frand(n, -1, 1);
    for (int acc = 0; acc < 2; acc++) {
        float *dx[2], *dg[2], *db[2];
        dx[0] = frand(n, -1, 1), dg[0] = frand(D, -1, 1), db[0] = frand(D, -1, 1);
        dx[1] = fcopy(dx[0], n), dg[1] = fcopy(dg[0], D), db[1] = fcopy(db[0], D);
        for (int r = 0; r < 2; r++) {
            call_init(&k, FR_OP_LAYERNORM_BWD, &at);
            k.c.accumulate = acc ? 7u : 0u;
            k.c.in[0] = tf(dy, xs);
            k.c.in[1] = r ? th(&x, xs) : tf(x.w, xs);
            k.c.in[2] = tf(gamma, gs);
            k.c.in[3] = tf(mean, ms);
            k.c.in[4] = tf(rstd, ms);
            k.c.out[0] = tf(dx[r], xs);
            k.c.out[1] = tf(dg[r], gs);
            k.c.out[2] = tf(db[r], gs);
            CHECK(fr_k_layernorm_bwd(&k.c) == FR_OK, "layernorm_bwd %s: %s", r ? "16-bit" : "f32",
                  fr_last_error(g_ctx));
        }
        snprintf(what, sizeof what, "layernorm_bwd N=%lld D=%lld accumulate=%d", (long long)N,
                 (long long)D, acc);
        same_bits(what, dt_name(dt), dx[0], dx[1], n);
        same_bits(what, dt_name(dt), dg[0], dg[1], D);
        same_bits(what, dt_name(dt), db[0], db[1], D);
        for (int r = 0; r < 2; r++) free(dx[r]), free(dg[r]), free(db[r]);
    }
    free(x0), free(gamma), free(beta), free(y), free(mean), free(rstd), free(yh), free(dy);
    free_half(&x);
}

/* A linear layer on bf16 operands with its bias and a bf16 y as the GEMM's
 * epilogue (where the CPU has a native bf16 GEMM): y f32 equals the f32 sums
 * of the exact products plus b within f32 rounding (a float64 reference of
 * the same bf16 values), and is bit for bit what seeding y with b and
 * letting the GEMM add (beta 1) gives; the bf16 y is that y rounded. */
static void test_linear_out(int64_t N, int64_t O, int64_t K) {
    if (!fr_gemm16_native(FR_BF16)) {
        printf("skipped linear's bf16 epilogue: no native bf16 GEMM on this CPU\n");
        return;
    }
    float *x0 = frand(N * K, -1, 1), *w0 = frand(O * K, -1, 1), *bias = frand(O, -1, 1);
    half_in x = make_half(FR_BF16, x0, N * K), w = make_half(FR_BF16, w0, O * K);
    float *y = frand(N * O, 0, 1), *seeded = malloc((size_t)(N * O) * sizeof(float));
    uint16_t *yh = malloc((size_t)(N * O) * 2);
    size_t wsb = fr_k_linear_gemm16_ws(N, O, K, 0, omp_get_max_threads(), 0);
    void *ws = malloc(wsb ? wsb : 1);
    call k;
    call_init(&k, FR_OP_LINEAR, NULL);
    k.c.in[0] = th(&x, fr_shape2(N, K));
    k.c.in[1] = th(&w, fr_shape2(O, K));
    k.c.in[2] = tf(bias, fr_shape1(O));
    k.c.out[0] = tf(y, fr_shape2(N, O));
    k.c.gemm_ws = ws, k.c.gemm_ws_len = wsb;
    CHECK(fr_k_linear(&k.c) == FR_OK, "linear bf16, bias epilogue: %s", fr_last_error(g_ctx));
    int64_t far = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < O; o++) {
            double ref = bias[o], mag = fabs(bias[o]);
            for (int64_t j = 0; j < K; j++) {
                ref += (double)x.w[i * K + j] * w.w[o * K + j];
                mag += fabs((double)x.w[i * K + j] * w.w[o * K + j]);
            }
            /* K + 1 f32 additions, each off by at most half an ulp of |sum| <= mag */
            if (fabs(y[i * O + o] - ref) > (double)(K + 1) * 0x1p-24 * mag) far++;
        }
    CHECK(far == 0, "linear bf16 %lldx%lldx%lld: %lld values off the float64 sums", (long long)N,
          (long long)O, (long long)K, (long long)far);
    for (int64_t i = 0; i < N; i++) memcpy(seeded + i * O, bias, (size_t)O * sizeof(float));
    size_t wsb1 = fr_gemm16_ws(0, 1, N, O, K, K, K, 1.0f, O);
    void *ws1 = malloc(wsb1 ? wsb1 : 1);
    CHECK(fr_gemm16(g_ctx, 0, 1, N, O, K, x.h, K, w.h, K, 1.0f, seeded, O, ws1, wsb1) == FR_OK,
          "gemm16 beta 1: %s", fr_last_error(g_ctx));
    char what[64];
    snprintf(what, sizeof what, "linear %lldx%lldx%lld", (long long)N, (long long)O, (long long)K);
    same_bits(what, "bias epilogue vs seeded y", seeded, y, N * O);
    k.c.out[0] = (fr_tensor){.dtype = FR_BF16, .shape = fr_shape2(N, O), .data = yh};
    CHECK(fr_k_linear(&k.c) == FR_OK, "linear bf16 y: %s", fr_last_error(g_ctx));
    same_rounded(what, FR_BF16, y, yh, N * O);
    k.c.in[2] = (fr_tensor){0};
    CHECK(fr_k_linear(&k.c) == FR_OK, "linear bf16 y, no bias: %s", fr_last_error(g_ctx));
    CHECK(fr_gemm16(g_ctx, 0, 1, N, O, K, x.h, K, w.h, K, 0.0f, seeded, O, ws1, wsb1) == FR_OK,
          "gemm16 beta 0");
    same_rounded("linear, no bias", FR_BF16, seeded, yh, N * O);
    free(x0), free(w0), free(bias), free(y), free(seeded), free(yh), free(ws), free(ws1);
    free_half(&x);
    free_half(&w);
}

/* What a kernel cannot read in 16 bits it refuses (the pass never asks). */
/* A 16-bit output (the op table's half_out): the kernel's value must be the
 * f32 call's result rounded (half.c's scalar conversion, checked by
 * test_half), bit for bit. Activations from f32 input; max pooling from f32
 * and from 16-bit input (where every output is an input: exact). */
static void same_rounded(const char *what, fr_dtype dt, const float *y32, const uint16_t *yh,
                         int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t want = dt == FR_F16 ? fr_f32_to_f16(y32[i]) : fr_f32_to_bf16(y32[i]);
        if (want != yh[i]) bad++, first = first < 0 ? i : first;
    }
    CHECK(bad == 0,
          "%s (%s out): %lld of %lld values are not the f32 result rounded, first at %lld", what,
          dt_name(dt), (long long)bad, (long long)n, (long long)first);
}

static void test_act_out(fr_dtype dt, fr_op op, const char *name, int64_t n, int approx) {
    float *x = frand(n, -4, 4), *y = frand(n, 0, 1);
    uint16_t *yh = malloc((size_t)n * 2);
    x[n / 2] = NAN; /* passes through, rounded to a NaN */
    fr_shape sh = fr_shape1(n);
    call k;
    fr_attr at = {.approx = approx};
    call_init(&k, op, &at);
    k.c.in[0] = tf(x, sh);
    k.c.out[0] = tf(y, sh);
    CHECK(fr_cpu_backend.kernels[op](&k.c) == FR_OK, "%s f32", name);
    k.c.out[0] = (fr_tensor){.dtype = dt, .shape = sh, .data = yh};
    CHECK(fr_cpu_backend.kernels[op](&k.c) == FR_OK, "%s 16-bit out: %s", name,
          fr_last_error(g_ctx));
    CHECK(fr_op_get(op)->half_out && fr_op_get(op)->half_out(NULL, NULL),
          "%s offers a 16-bit output", name);
    char what[64];
    snprintf(what, sizeof what, "%s n=%lld", name, (long long)n);
    same_rounded(what, dt, y, yh, n);
    free(x);
    free(y);
    free(yh);
}

/* ReLU reading a 16-bit x (precision.c's rounding-through reader): over
 * every 16-bit pattern (NaNs, infinities, subnormals, both zeros), a 16-bit
 * y of the same format is the f32 call's y on the widened x rounded, bit for
 * bit, in a separate buffer and in place; an f32 y is that call's y. */
static void test_relu_in(fr_dtype dt) {
    const int64_t n = 65536; /* above ACT_PAR_MIN: the thread team */
    uint16_t *xh = malloc((size_t)n * 2), *yh = malloc((size_t)n * 2), *ip = malloc((size_t)n * 2);
    float *xw = malloc((size_t)n * 4), *y32 = malloc((size_t)n * 4), *yw = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        xh[i] = ip[i] = (uint16_t)i;
        xw[i] = dt == FR_F16 ? fr_f16_to_f32(xh[i]) : fr_bf16_to_f32(xh[i]);
    }
    fr_shape sh = fr_shape1(n);
    call k;
    call_init(&k, FR_OP_RELU, NULL);
    k.c.in[0] = tf(xw, sh);
    k.c.out[0] = tf(y32, sh);
    CHECK(fr_k_relu(&k.c) == FR_OK, "relu f32");
    const fr_tensor x16 = {.dtype = dt, .shape = sh, .data = xh};
    k.c.in[0] = x16;
    k.c.out[0] = (fr_tensor){.dtype = dt, .shape = sh, .data = yh};
    CHECK(fr_k_relu(&k.c) == FR_OK, "relu 16-bit x: %s", fr_last_error(g_ctx));
    same_rounded(dt == FR_F16 ? "relu f16 x, every pattern" : "relu bf16 x, every pattern", dt, y32,
                 yh, n);
    k.c.in[0] = k.c.out[0] = (fr_tensor){.dtype = dt, .shape = sh, .data = ip};
    CHECK(fr_k_relu(&k.c) == FR_OK, "relu 16-bit in place");
    CHECK(memcmp(ip, yh, (size_t)n * 2) == 0, "relu 16-bit in place: other bits");
    k.c.in[0] = x16;
    k.c.out[0] = tf(yw, sh);
    CHECK(fr_k_relu(&k.c) == FR_OK, "relu 16-bit x, f32 y");
    CHECK(memcmp(yw, y32, (size_t)n * 4) == 0, "relu 16-bit x, f32 y: not the f32 call's bits");
    call_init(&k, FR_OP_RELU, NULL);
    fr_graph g0;
    memset(&g0, 0, sizeof g0);
    CHECK(fr_cpu_backend.half_io(&g0, &k.node, 0) && !fr_cpu_backend.half_io(&g0, &k.node, 1),
          "relu offers its 16-bit x (and nothing else) on the CPU");
    free(xh), free(yh), free(ip), free(xw), free(y32), free(yw);
}

/* The tanh GELU's backward writing a 16-bit dx (the dy of a bf16 GEMM), from
 * an f32 or a 16-bit saved x: the f32 call's dx rounded; adding into a
 * 16-bit dx is refused. */
static void test_gelu_bwd_out(fr_dtype dt, int64_t n) {
    float *dy = frand(n, -1, 1), *x0 = frand(n, -3, 3), *dx = malloc((size_t)n * 4);
    uint16_t *dh = malloc((size_t)n * 2);
    half_in x = make_half(dt, x0, n);
    fr_shape sh = fr_shape1(n);
    for (int xh = 0; xh < 2; xh++) {
        call k;
        fr_attr at = {.approx = 1};
        call_init(&k, FR_OP_GELU_BWD, &at);
        k.c.in[0] = tf(dy, sh);
        k.c.in[1] = xh ? th(&x, sh) : tf(x.w, sh);
        k.c.out[0] = tf(dx, sh);
        CHECK(fr_k_gelu_bwd(&k.c) == FR_OK, "gelu_bwd f32 dx");
        k.c.out[0] = (fr_tensor){.dtype = dt, .shape = sh, .data = dh};
        CHECK(fr_k_gelu_bwd(&k.c) == FR_OK, "gelu_bwd 16-bit dx: %s", fr_last_error(g_ctx));
        char what[64];
        snprintf(what, sizeof what, "gelu_bwd (tanh) dx, x %s, n=%lld", xh ? "16-bit" : "f32",
                 (long long)n);
        same_rounded(what, dt, dx, dh, n);
        k.c.accumulate = 1;
        CHECK(fr_k_gelu_bwd(&k.c) == FR_ERR_ARG, "adding into a 16-bit dx is refused");
    }
    CHECK(fr_op_get(FR_OP_GELU_BWD)->half_out, "gelu_bwd offers a 16-bit dx");
    free(dy), free(x0), free(dx), free(dh);
    free_half(&x);
}

/* The tanh GELU's backward reading a 16-bit dy (a bf16 GEMM's dx: the
 * mixed-precision pass's rounded_bwd): the bits of the f32 call on the
 * widened dy, for an f32 or a 16-bit x, into an f32 dx (set and added into)
 * and a 16-bit dx (rounded). The CPU offers it for the tanh GELU only; the
 * erf GELU's and ReLU's backward refuse a 16-bit dy instead of misreading
 * it. */
static void test_gelu_bwd_dy16(fr_dtype dt, int64_t n) {
    float *dy0 = frand(n, -1, 1), *x0 = frand(n, -3, 3);
    half_in dy = make_half(dt, dy0, n), x = make_half(dt, x0, n);
    uint16_t *dh = malloc((size_t)n * 2);
    fr_shape sh = fr_shape1(n);
    fr_attr at = {.approx = 1};
    for (int xh = 0; xh < 2; xh++)
        for (int acc = 0; acc < 2; acc++) {
            float *a = frand(n, -1, 1), *b = fcopy(a, n);
            call k;
            call_init(&k, FR_OP_GELU_BWD, &at);
            k.c.accumulate = (uint32_t)acc;
            k.c.in[0] = tf(dy.w, sh);
            k.c.in[1] = xh ? th(&x, sh) : tf(x.w, sh);
            k.c.out[0] = tf(a, sh);
            CHECK(fr_k_gelu_bwd(&k.c) == FR_OK, "gelu_bwd on the widened dy");
            k.c.in[0] = th(&dy, sh);
            k.c.out[0] = tf(b, sh);
            CHECK(fr_k_gelu_bwd(&k.c) == FR_OK, "gelu_bwd 16-bit dy: %s", fr_last_error(g_ctx));
            char what[96];
            snprintf(what, sizeof what, "gelu_bwd (tanh) 16-bit dy, x %s, n=%lld, accumulate=%d",
                     xh ? "16-bit" : "f32", (long long)n, acc);
            same_bits(what, dt_name(dt), a, b, n);
            if (!acc) {
                k.c.out[0] = (fr_tensor){.dtype = dt, .shape = sh, .data = dh};
                CHECK(fr_k_gelu_bwd(&k.c) == FR_OK, "gelu_bwd 16-bit dy and dx: %s",
                      fr_last_error(g_ctx));
                same_rounded(what, dt, a, dh, n);
            }
            free(a), free(b);
        }
    call k;
    call_init(&k, FR_OP_GELU_BWD, &at);
    fr_graph g0;
    memset(&g0, 0, sizeof g0);
    CHECK(fr_cpu_backend.half_io(&g0, &k.node, 0), "the tanh GELU's backward takes a 16-bit dy");
    float *dx = malloc((size_t)n * 4);
    const fr_op ops[2] = {FR_OP_GELU_BWD, FR_OP_RELU_BWD};
    for (int o = 0; o < 2; o++) {
        fr_attr erf = {.approx = 0};
        call_init(&k, ops[o], &erf);
        CHECK(!fr_cpu_backend.half_io(&g0, &k.node, 0), "%s (erf) offers no 16-bit dy",
              fr_op_get(ops[o])->name);
        k.c.in[0] = th(&dy, sh);
        k.c.in[1] = tf(x.w, sh);
        k.c.out[0] = tf(dx, sh);
        CHECK(fr_cpu_backend.kernels[ops[o]](&k.c) == FR_ERR_ARG, "%s refuses a 16-bit dy",
              fr_op_get(ops[o])->name);
    }
    free(dy0), free(x0), free(dh), free(dx);
    free_half(&dy);
    free_half(&x);
}

/* Cross-entropy's dlogits written in 16 bits (for a bf16 GEMM) a span of a
 * row at a time: the f32 call's values rounded, with rows wider than a span
 * (labels in every span) and narrower; adding into a 16-bit dlogits is
 * refused. */
static void test_ce_bwd_out(fr_dtype dt, int64_t N, int64_t C) {
    float *z = frand(N * C, -6, 6), *dz = malloc((size_t)(N * C) * 4);
    uint16_t *dh = malloc((size_t)(N * C) * 2);
    int32_t *y = malloc((size_t)N * sizeof *y);
    for (int64_t n = 0; n < N; n++) y[n] = (int32_t)((n * 2039 + 7) % C);
    fr_shape zs = fr_shape2(N, C);
    call k;
    fr_attr at = {.scale = 1.0f};
    call_init(&k, FR_OP_CROSS_ENTROPY_BWD, &at);
    k.c.in[0] = tf(z, zs);
    k.c.in[1] = (fr_tensor){.dtype = FR_I32, .shape = fr_shape1(N), .data = y};
    k.c.out[0] = tf(dz, zs);
    CHECK(fr_k_cross_entropy_bwd(&k.c) == FR_OK, "cross_entropy_bwd f32");
    k.c.out[0] = (fr_tensor){.dtype = dt, .shape = zs, .data = dh};
    CHECK(fr_k_cross_entropy_bwd(&k.c) == FR_OK, "cross_entropy_bwd 16-bit out: %s",
          fr_last_error(g_ctx));
    CHECK(fr_op_get(FR_OP_CROSS_ENTROPY_BWD)->half_out &&
              fr_op_get(FR_OP_CROSS_ENTROPY_BWD)->half_out(NULL, NULL),
          "cross_entropy_bwd offers a 16-bit output");
    char what[64];
    snprintf(what, sizeof what, "cross_entropy_bwd %lld x %lld", (long long)N, (long long)C);
    same_rounded(what, dt, dz, dh, N * C);
    k.c.accumulate = 1;
    CHECK(fr_k_cross_entropy_bwd(&k.c) == FR_ERR_ARG, "adding into 16-bit dlogits is refused");
    free(z), free(dz), free(dh), free(y);
}

static void test_maxpool_out(fr_dtype dt, int64_t H, int64_t W, int K, int S) {
    const int64_t N = 2, C = 3, OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    float *x0 = frand(nx, -2, 2), *y = frand(ny, 0, 1);
    uint16_t *yh = malloc((size_t)ny * 2);
    half_in x = make_half(dt, x0, nx);
    fr_shape xs = fr_shape4(N, C, H, W), ys = fr_shape4(N, C, OH, OW);
    fr_attr a = {.kernel = K, .stride = S};
    char what[96];
    for (int in16 = 0; in16 < 2; in16++) {
        call k;
        call_init(&k, FR_OP_MAXPOOL2D, &a);
        k.c.in[0] = in16 ? th(&x, xs) : tf(x0, xs);
        k.c.out[0] = tf(y, ys);
        CHECK(fr_k_maxpool2d(&k.c) == FR_OK, "maxpool f32 out");
        k.c.out[0] = (fr_tensor){.dtype = dt, .shape = ys, .data = yh};
        CHECK(fr_k_maxpool2d(&k.c) == FR_OK, "maxpool 16-bit out: %s", fr_last_error(g_ctx));
        snprintf(what, sizeof what, "maxpool %lldx%lld k%d s%d, %s in", (long long)H, (long long)W,
                 K, S, in16 ? "16-bit" : "f32");
        same_rounded(what, dt, y, yh, ny);
    }
    free(x0);
    free(y);
    free(yh);
    free_half(&x);
}

static void test_refusals(void) {
    float v[8] = {0};
    half_in x = make_half(FR_BF16, v, 8);
    /* a stride-2 convolution takes im2col, which reads f32 only */
    fr_shape xs = fr_shape4(1, 8, 4, 4);
    CHECK(!fr_conv2d_reads_half(&xs, FR_BF16, 4, 3, 2, 1), "stride 2 is not on the shifted path");
    fr_shape x1 = fr_shape4(1, 1, 4, 4);
    CHECK(!fr_conv2d_reads_half(&x1, FR_BF16, 4, 3, 1, 1),
          "one input channel is not on the shifted path");
    float *big = frand(2 * 130 * 130, -1, 1), *out = frand(65 * 65 * 2, 0, 1);
    half_in hb = make_half(FR_BF16, big, 2 * 130 * 130);
    fr_attr a = {.kernel = 2, .stride = 2};
    call k;
    call_init(&k, FR_OP_MAXPOOL2D, &a);
    k.c.in[0] = th(&hb, fr_shape4(1, 2, 130, 130)); /* planes of 16900 > FR_HALF_PLANE_MAX */
    k.c.out[0] = tf(out, fr_shape4(1, 2, 65, 65));
    CHECK(fr_k_maxpool2d(&k.c) == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "16-bit"),
          "maxpool refuses a 16-bit plane too large: %s", fr_last_error(g_ctx));
    free(big), free(out);
    free_half(&hb);
    free_half(&x);
}

int main(void) {
    /* the shifted-GEMM convolution's 16-bit image (oneDNN's path, the
     * default, is test_conv_dnnl's) */
    setenv("FRUGAL_CONV", "gemm", 1);
    g_ctx = fr_ctx_new();
    omp_set_num_threads(2);
    const fr_dtype dts[2] = {FR_BF16, FR_F16};
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = dts[d];
        for (int64_t n = 5003; n <= 70001; n += 65000) { /* serial, then the thread team */
            test_act_bwd(dt, FR_OP_RELU_BWD, "relu_bwd", n, 0);
            test_act_bwd(dt, FR_OP_GELU_BWD, "gelu_bwd", n, 0);
            test_act_bwd(dt, FR_OP_GELU_BWD, "gelu_bwd (tanh)", n, 1);
            test_act_bwd(dt, FR_OP_SIGMOID_BWD, "sigmoid_bwd", n, 0);
            test_act_bwd(dt, FR_OP_TANH_BWD, "tanh_bwd", n, 0);
            test_act_out(dt, FR_OP_RELU, "relu", n, 0);
            test_act_out(dt, FR_OP_GELU, "gelu", n, 0);
            test_act_out(dt, FR_OP_GELU, "gelu (tanh)", n, 1);
            test_act_out(dt, FR_OP_SIGMOID, "sigmoid", n, 0);
            test_act_out(dt, FR_OP_TANH, "tanh", n, 0);
        }
        test_relu_in(dt);
        test_maxpool(dt, 7, 9, 2, 2);
        test_maxpool(dt, 8, 8, 2, 2);
        test_maxpool(dt, 9, 7, 3, 2);
        test_maxpool(dt, 64, 80, 2, 2); /* the thread team */
        test_gelu_bwd_out(dt, 5003);
        test_gelu_bwd_out(dt, 70001);
        test_gelu_bwd_dy16(dt, 5003);
        test_gelu_bwd_dy16(dt, 70001);
        test_ce_bwd_out(dt, 5, 10);
        test_ce_bwd_out(dt, 64, 5003); /* 3 spans a row, the thread team */
        test_maxpool_out(dt, 7, 9, 2, 2);
        test_maxpool_out(dt, 9, 7, 3, 2);
        test_maxpool_out(dt, 64, 80, 2, 2);
        test_batchnorm_bwd(dt, fr_shape4(4, 5, 6, 6));
        test_batchnorm_bwd(dt, fr_shape4(16, 8, 30, 30)); /* the thread team */
        test_batchnorm_bwd(dt, fr_shape2(7, 5));
        test_conv(dt, 3, 8, 6, 7, 5, 3, 2);
        test_conv(dt, 5, 9, 5, 5, 4, 5, 3);
        test_conv(dt, 2, 16, 9, 9, 8, 3, 1);
        test_gelu_in(dt, 5003);
        test_gelu_in(dt, 70001);
        test_gelu_every(dt);
        test_layernorm(dt, 7, 300);  /* two chunks of y a row */
        test_layernorm(dt, 96, 384); /* the thread team */
    }
    test_linear_out(5, 7, 9);
    test_linear_out(64, 96, 130);
    test_refusals();
    fr_ctx_free(g_ctx);
    return check_done();
}
