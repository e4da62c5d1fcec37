/* test_kernels.c — checks every CPU kernel of src/backend/cpu (all but the
 * optimizers) against numbers computed here, independently of the code under
 * test: forward kernels against naive float64 loops, backward kernels against
 * central finite differences of those float64 loops. It also covers the edge
 * cases the kernel spec names: conv stride/padding/non-square/no bias,
 * maxpool ties (rows of up to 35 windows), BatchNorm running statistics,
 * dropout's determinism rule, cross-entropy with huge logits and bad
 * labels, accumulate bits, absent
 * outputs, and outputs aliasing inputs. Prints "N passed, M failed". */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "ops/ops.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

/* Tolerances, as |got - ref| <= tol (|ref| + max|ref|) per element.
 * f32 has a relative precision of u = 6e-8. An elementwise op is off by a
 * few ulps (libm's float erff/expf/tanhf add 1-2 ulps): 1e-5 leaves two
 * orders of margin. A reduction of K terms (GEMMs, norms) is off by about
 * sqrt(K) u relative to the sum of its terms' magnitudes, hence the floor at
 * max|ref|; here K <= 8192 (the large BatchNorm), sqrt(K) u = 5e-6, so 2e-5.
 * (Seen on x86-64 with OpenBLAS: at most 1.2e-6; run with FR_TEST_VERBOSE=1.)
 * Finite differences are taken in float64 on the float64 reference with
 * h = 1e-6: truncation ~h^2 f''' and rounding ~1e-16 |f| / h are both below
 * 1e-8, far under these tolerances. */
#define TOL_EW 1e-5
#define TOL_SUM 2e-5
#define FD_H 1e-6

static fr_ctx *g_ctx;
static int g_verbose; /* FR_TEST_VERBOSE=1: print the worst error of every comparison */

/* ---- allocations of the current test (exact sizes, so ASan sees overruns) ---- */

#define MAX_ALLOCS 512
static void *g_allocs[MAX_ALLOCS];
static int g_nallocs;

static void *talloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || g_nallocs == MAX_ALLOCS) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(2);
    }
    g_allocs[g_nallocs++] = p;
    return p;
}
static void tfree_all(void) {
    while (g_nallocs) free(g_allocs[--g_nallocs]);
}

/* ---- random data (xorshift64*, independent of core/rng) ---- */

static uint64_t g_rs = 0x2545f4914f6cdd1dULL;
static double urand(void) {
    g_rs ^= g_rs >> 12, g_rs ^= g_rs << 25, g_rs ^= g_rs >> 27;
    return (double)((g_rs * 2685821657736338717ULL) >> 11) * 0x1.0p-53;
}
static double unif(double lo, double hi) { return lo + (hi - lo) * urand(); }
static float *frand(int64_t n, double lo, double hi) {
    float *p = talloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)unif(lo, hi);
    return p;
}
static float *fzeros(int64_t n) { return talloc((size_t)n * sizeof(float)); }
static float *fcopy(const float *s, int64_t n) {
    float *p = fzeros(n);
    memcpy(p, s, (size_t)n * sizeof(float));
    return p;
}
static double *dzeros(int64_t n) { return talloc((size_t)n * sizeof(double)); }
static double *dof(const float *s, int64_t n) {
    double *p = dzeros(n);
    for (int64_t i = 0; i < n; i++) p[i] = s[i];
    return p;
}

/* ---- comparisons ---- */

static void expect_close(const char *name, const float *got, const double *ref, int64_t n,
                         double tol) {
    double scale = 0.0, worst = 0.0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + scale + 1e-300);
        if (!(e <= worst)) worst = e, wi = i; /* a NaN sticks */
    }
    if (g_verbose) printf("  %-60s worst %.2e (tol %.0e)\n", name, worst, tol);
    CHECK(worst <= tol, "%s: worst error %.3g at %lld (got %.9g, want %.9g), tol %.0e", name, worst,
          (long long)wi, n ? got[wi] : 0.0, n ? ref[wi] : 0.0, tol);
}

/* ref = base + add, for accumulate checks */
static double *dsum(const float *base, const double *add, int64_t n) {
    double *p = dzeros(n);
    for (int64_t i = 0; i < n; i++) p[i] = (double)base[i] + add[i];
    return p;
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- finite differences ---- */

typedef double (*objective)(void *st);

/* g[i] = (f(p + h e_i) - f(p - h e_i)) / 2h, all in float64 */
static void fd_grad(objective f, void *st, double *p, int64_t n, double *g) {
    for (int64_t i = 0; i < n; i++) {
        double save = p[i];
        p[i] = save + FD_H;
        double fp = f(st);
        p[i] = save - FD_H;
        double fm = f(st);
        p[i] = save;
        g[i] = (fp - fm) / (2.0 * FD_H);
    }
}

/* On large inputs only every step-th element is differenced (each difference
 * costs a full forward of the reference): about 200 points. */
static int64_t fd_step(int64_t n) { return n > 4096 ? n / 200 + 1 : 1; }
static int64_t fd_count(int64_t n, int64_t step) { return (n + step - 1) / step; }
static void fd_grad_strided(objective f, void *st, double *p, int64_t n, int64_t step, double *g) {
    for (int64_t j = 0; j * step < n; j++) fd_grad(f, st, p + j * step, 1, g + j);
}
static float *gather(const float *src, int64_t n, int64_t step) {
    float *d = fzeros(fd_count(n, step));
    for (int64_t j = 0; j * step < n; j++) d[j] = src[j * step];
    return d;
}

/* ---- kernel calls ---- */

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
static fr_tensor ti32(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_I32, .shape = s, .data = data};
}
static fr_tensor tu8(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_U8, .shape = s, .data = data};
}

static void expect_ok(const char *name, int st) {
    CHECK(st == FR_OK, "%s: status %d: %s", name, st, fr_last_error(g_ctx));
}

/* ======================================================================= */
/* linear                                                                  */

typedef struct lin_st {
    int64_t N, K, O;
    double *x, *w, *b, *dy, *y;
} lin_st;

static void ref_linear(const lin_st *s) {
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t o = 0; o < s->O; o++) {
            double v = s->b ? s->b[o] : 0.0;
            for (int64_t k = 0; k < s->K; k++) v += s->x[n * s->K + k] * s->w[o * s->K + k];
            s->y[n * s->O + o] = v;
        }
}
static double obj_linear(void *p) {
    lin_st *s = p;
    ref_linear(s);
    return dot(s->dy, s->y, s->N * s->O);
}

static void test_linear(void) {
    const int64_t N = 5, K = 7, O = 4;
    float *x = frand(N * K, -1, 1), *w = frand(O * K, -1, 1), *b = frand(O, -1, 1);
    float *dy = frand(N * O, -1, 1), *y = fzeros(N * O);
    lin_st s = {N, K, O, dof(x, N * K), dof(w, O * K), dof(b, O), dof(dy, N * O), dzeros(N * O)};
    call k;

    for (int bias = 0; bias < 2; bias++) {
        call_init(&k, FR_OP_LINEAR, NULL);
        k.c.in[0] = tf(x, fr_shape2(N, K));
        k.c.in[1] = tf(w, fr_shape2(O, K));
        k.c.in[2] = tf(bias ? b : NULL, fr_shape1(O));
        k.c.out[0] = tf(y, fr_shape2(N, O));
        expect_ok("linear fwd status", fr_k_linear(&k.c));
        lin_st r = s;
        if (!bias) r.b = NULL;
        ref_linear(&r);
        expect_close(bias ? "linear fwd (bias)" : "linear fwd (no bias)", y, r.y, N * O, TOL_EW);
    }

    double *gx = dzeros(N * K), *gw = dzeros(O * K), *gb = dzeros(O);
    fd_grad(obj_linear, &s, s.x, N * K, gx);
    fd_grad(obj_linear, &s, s.w, O * K, gw);
    fd_grad(obj_linear, &s, s.b, O, gb);

    float *dx = fzeros(N * K), *dw = fzeros(O * K), *db = fzeros(O);
    call_init(&k, FR_OP_LINEAR_BWD, NULL);
    k.c.in[0] = tf(dy, fr_shape2(N, O));
    k.c.in[1] = tf(x, fr_shape2(N, K));
    k.c.in[2] = tf(w, fr_shape2(O, K));
    k.c.out[0] = tf(dx, fr_shape2(N, K));
    k.c.out[1] = tf(dw, fr_shape2(O, K));
    k.c.out[2] = tf(db, fr_shape1(O));
    expect_ok("linear bwd status", fr_k_linear_bwd(&k.c));
    expect_close("linear bwd dx vs FD", dx, gx, N * K, TOL_SUM);
    expect_close("linear bwd dW vs FD", dw, gw, O * K, TOL_SUM);
    expect_close("linear bwd db vs FD", db, gb, O, TOL_SUM);

    /* accumulate dW and db into what they hold; dx absent (skipped) */
    float *dw0 = frand(O * K, -1, 1), *db0 = frand(O, -1, 1);
    float *dw1 = fcopy(dw0, O * K), *db1 = fcopy(db0, O);
    k.c.out[0] = tf(NULL, fr_shape2(N, K));
    k.c.out[1] = tf(dw1, fr_shape2(O, K));
    k.c.out[2] = tf(db1, fr_shape1(O));
    k.c.accumulate = (1u << 1) | (1u << 2);
    expect_ok("linear bwd (accumulate, dx absent) status", fr_k_linear_bwd(&k.c));
    expect_close("linear bwd dW accumulated", dw1, dsum(dw0, gw, O * K), O * K, TOL_SUM);
    expect_close("linear bwd db accumulated", db1, dsum(db0, gb, O), O, TOL_SUM);

    /* only dx wanted: bit 0 clear overwrites whatever dx held */
    float *dx2 = frand(N * K, 5, 6);
    k.c.accumulate = 0;
    k.c.out[0] = tf(dx2, fr_shape2(N, K));
    k.c.out[1] = tf(NULL, fr_shape2(O, K));
    k.c.out[2] = tf(NULL, fr_shape1(O));
    expect_ok("linear bwd (dx only) status", fr_k_linear_bwd(&k.c));
    expect_close("linear bwd dx only, overwritten", dx2, gx, N * K, TOL_SUM);

    /* attr.scale 0.5 (LoRA's B product): y = 0.5 x W^T + b; dx and dW halve, db does not */
    fr_attr half = {.scale = 0.5f};
    call_init(&k, FR_OP_LINEAR, &half);
    k.c.in[0] = tf(x, fr_shape2(N, K));
    k.c.in[1] = tf(w, fr_shape2(O, K));
    k.c.in[2] = tf(b, fr_shape1(O));
    k.c.out[0] = tf(y, fr_shape2(N, O));
    expect_ok("linear fwd (scale 0.5) status", fr_k_linear(&k.c));
    double *ys = dzeros(N * O), *hx = dzeros(N * K), *hw = dzeros(O * K);
    ref_linear(&s);
    for (int64_t i = 0; i < N * O; i++) ys[i] = 0.5 * (s.y[i] - s.b[i % O]) + s.b[i % O];
    for (int64_t i = 0; i < N * K; i++) hx[i] = 0.5 * gx[i];
    for (int64_t i = 0; i < O * K; i++) hw[i] = 0.5 * gw[i];
    expect_close("linear fwd (scale 0.5)", y, ys, N * O, TOL_EW);
    call_init(&k, FR_OP_LINEAR_BWD, &half);
    k.c.in[0] = tf(dy, fr_shape2(N, O));
    k.c.in[1] = tf(x, fr_shape2(N, K));
    k.c.in[2] = tf(w, fr_shape2(O, K));
    k.c.out[0] = tf(dx, fr_shape2(N, K));
    k.c.out[1] = tf(dw, fr_shape2(O, K));
    k.c.out[2] = tf(db, fr_shape1(O));
    expect_ok("linear bwd (scale 0.5) status", fr_k_linear_bwd(&k.c));
    expect_close("linear bwd (scale 0.5) dx", dx, hx, N * K, TOL_SUM);
    expect_close("linear bwd (scale 0.5) dW", dw, hw, O * K, TOL_SUM);
    expect_close("linear bwd (scale 0.5) db, unscaled", db, gb, O, TOL_SUM);
    tfree_all();
}

/* ======================================================================= */
/* conv2d                                                                  */

typedef struct conv_st {
    int64_t N, C, H, W, OC, K, S, P, OH, OW;
    double *x, *w, *b, *dy, *y;
} conv_st;

static void ref_conv(const conv_st *s) {
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t oc = 0; oc < s->OC; oc++)
            for (int64_t oh = 0; oh < s->OH; oh++)
                for (int64_t ow = 0; ow < s->OW; ow++) {
                    double v = s->b ? s->b[oc] : 0.0;
                    for (int64_t c = 0; c < s->C; c++)
                        for (int64_t kh = 0; kh < s->K; kh++)
                            for (int64_t kw = 0; kw < s->K; kw++) {
                                int64_t ih = oh * s->S - s->P + kh, iw = ow * s->S - s->P + kw;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
                                v += s->x[((n * s->C + c) * s->H + ih) * s->W + iw] *
                                     s->w[((oc * s->C + c) * s->K + kh) * s->K + kw];
                            }
                    s->y[((n * s->OC + oc) * s->OH + oh) * s->OW + ow] = v;
                }
}
static double obj_conv(void *p) {
    conv_st *s = p;
    ref_conv(s);
    return dot(s->dy, s->y, s->N * s->OC * s->OH * s->OW);
}

static float *fnan(int64_t n) {
    float *p = fzeros(n);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void conv_case(const char *tag, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC,
                      int K, int S, int P, int bias, int threads) {
    char name[160];
    omp_set_num_threads(threads);
    const int64_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    const int64_t nx = N * C * H * W, nw = OC * C * K * K, ny = N * OC * OH * OW;
    float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *b = bias ? frand(OC, -1, 1) : NULL;
    float *dy = frand(ny, -1, 1), *y = fzeros(ny);
    conv_st s = {N,
                 C,
                 H,
                 W,
                 OC,
                 K,
                 S,
                 P,
                 OH,
                 OW,
                 dof(x, nx),
                 dof(w, nw),
                 bias ? dof(b, OC) : NULL,
                 dof(dy, ny),
                 dzeros(ny)};
    fr_shape xs = fr_shape4(N, C, H, W), ws_ = fr_shape4(OC, C, K, K),
             ys = fr_shape4(N, OC, OH, OW);
    fr_attr a = {.kernel = K, .stride = S, .pad = P};

    int64_t nws = fr_conv2d_ws_elems(&xs, FR_F32, OC, K, S, P, 0, 0);
    float *wsf = nws ? fnan(nws) : NULL; /* the kernel must not count on a clean workspace */
    call k;
    call_init(&k, FR_OP_CONV2D, &a);
    k.c.in[0] = tf(x, xs);
    k.c.in[1] = tf(w, ws_);
    k.c.in[2] = tf(b, fr_shape1(OC));
    k.c.out[0] = tf(y, ys);
    k.c.out[1] = tf(wsf, fr_shape1(nws));
    snprintf(name, sizeof name, "conv fwd %s status", tag);
    expect_ok(name, fr_k_conv2d(&k.c));
    ref_conv(&s);
    snprintf(name, sizeof name, "conv fwd %s", tag);
    expect_close(name, y, s.y, ny, TOL_SUM);

    double *gx = dzeros(nx), *gw = dzeros(nw), *gb = bias ? dzeros(OC) : NULL;
    fd_grad(obj_conv, &s, s.x, nx, gx);
    fd_grad(obj_conv, &s, s.w, nw, gw);
    if (bias) fd_grad(obj_conv, &s, s.b, OC, gb);

    int64_t nwsb = fr_conv2d_ws_elems(&xs, FR_F32, OC, K, S, P, 1, 0);
    float *wsb = nwsb ? fnan(nwsb) : NULL;
    float *dx = frand(nx, 7, 8), *dw = frand(nw, 7, 8), *db = bias ? frand(OC, 7, 8) : NULL;
    call_init(&k, FR_OP_CONV2D_BWD, &a);
    k.c.in[0] = tf(dy, ys);
    k.c.in[1] = tf(x, xs);
    k.c.in[2] = tf(w, ws_);
    k.c.out[0] = tf(dx, xs);
    k.c.out[1] = tf(dw, ws_);
    k.c.out[2] = tf(db, fr_shape1(OC));
    k.c.out[3] = tf(wsb, fr_shape1(nwsb));
    snprintf(name, sizeof name, "conv bwd %s status", tag);
    expect_ok(name, fr_k_conv2d_bwd(&k.c));
    snprintf(name, sizeof name, "conv bwd %s dx vs FD", tag);
    expect_close(name, dx, gx, nx, TOL_SUM);
    snprintf(name, sizeof name, "conv bwd %s dW vs FD", tag);
    expect_close(name, dw, gw, nw, TOL_SUM);
    if (bias) {
        snprintf(name, sizeof name, "conv bwd %s db vs FD", tag);
        expect_close(name, db, gb, OC, TOL_SUM);
    }

    /* same call again: the same bits */
    float *dw_again = fcopy(dw, nw), *dx_again = fcopy(dx, nx);
    k.c.out[0] = tf(dx_again, xs);
    k.c.out[1] = tf(dw_again, ws_);
    fr_k_conv2d_bwd(&k.c);
    snprintf(name, sizeof name, "conv bwd %s deterministic", tag);
    CHECK(!memcmp(dw, dw_again, (size_t)nw * 4) && !memcmp(dx, dx_again, (size_t)nx * 4), "%s",
          name);

    /* accumulate all three into what they hold */
    float *dx0 = frand(nx, -1, 1), *dw0 = frand(nw, -1, 1), *db0 = bias ? frand(OC, -1, 1) : NULL;
    float *dx1 = fcopy(dx0, nx), *dw1 = fcopy(dw0, nw), *db1 = bias ? fcopy(db0, OC) : NULL;
    k.c.out[0] = tf(dx1, xs);
    k.c.out[1] = tf(dw1, ws_);
    k.c.out[2] = tf(db1, fr_shape1(OC));
    k.c.accumulate = 7;
    snprintf(name, sizeof name, "conv bwd %s accumulate status", tag);
    expect_ok(name, fr_k_conv2d_bwd(&k.c));
    snprintf(name, sizeof name, "conv bwd %s dx accumulated", tag);
    expect_close(name, dx1, dsum(dx0, gx, nx), nx, TOL_SUM);
    snprintf(name, sizeof name, "conv bwd %s dW accumulated", tag);
    expect_close(name, dw1, dsum(dw0, gw, nw), nw, TOL_SUM);
    if (bias) {
        snprintf(name, sizeof name, "conv bwd %s db accumulated", tag);
        expect_close(name, db1, dsum(db0, gb, OC), OC, TOL_SUM);
    }

    /* dx absent (first layer): skipped, dW still right */
    float *dw2 = fzeros(nw);
    k.c.accumulate = 0;
    k.c.out[0] = tf(NULL, xs);
    k.c.out[1] = tf(dw2, ws_);
    k.c.out[2] = tf(NULL, fr_shape1(OC));
    snprintf(name, sizeof name, "conv bwd %s dx absent status", tag);
    expect_ok(name, fr_k_conv2d_bwd(&k.c));
    snprintf(name, sizeof name, "conv bwd %s dW with dx absent", tag);
    expect_close(name, dw2, gw, nw, TOL_SUM);

    /* dW absent: dx alone */
    float *dx3 = fzeros(nx);
    k.c.out[0] = tf(dx3, xs);
    k.c.out[1] = tf(NULL, ws_);
    snprintf(name, sizeof name, "conv bwd %s dx alone", tag);
    expect_ok(name, fr_k_conv2d_bwd(&k.c));
    expect_close(name, dx3, gx, nx, TOL_SUM);
    tfree_all();
    omp_set_num_threads(2);
}

static void test_conv(void) {
    conv_case("stride2 pad1 7x5 no-bias", 3, 2, 7, 5, 4, 3, 2, 1, 0, 2);
    conv_case("stride1 pad1 6x8 bias", 4, 3, 6, 8, 5, 3, 1, 1, 1, 2);
    conv_case("1x1 direct", 2, 4, 5, 5, 3, 1, 1, 0, 1, 2);
    conv_case("1x1 stride2", 3, 3, 5, 6, 2, 1, 2, 0, 1, 2);
    conv_case("k2 s2 pad0 1 thread", 3, 2, 6, 7, 2, 2, 2, 0, 1, 1);
    conv_case("stride2 pad1 3 threads", 5, 2, 5, 6, 3, 3, 2, 1, 0, 3);
    conv_case("k5 pad2 stride3 batch1", 1, 2, 9, 7, 3, 5, 3, 2, 1, 2);
    /* "same" convolutions (stride 1, OH = H, OW = W) take a shifted-copy path */
    conv_case("same k5 pad2 6x9", 3, 2, 6, 9, 3, 5, 1, 2, 1, 2);
    conv_case("same k5 pad2 on 2x3 (kernel wider than image)", 2, 2, 2, 3, 2, 5, 1, 2, 0, 2);
    conv_case("same k3 pad1 on 1x4", 2, 3, 1, 4, 2, 3, 1, 1, 1, 2);
    /* with 8 or more input channels they take one GEMM per kernel tap */
    conv_case("shifted k3 pad1 8ch 6x7 bias", 3, 8, 6, 7, 5, 3, 1, 1, 1, 2);
    conv_case("shifted k3 pad1 9ch 5x5 no-bias 3 threads", 5, 9, 5, 5, 8, 3, 1, 1, 0, 3);
    conv_case("shifted k5 pad2 8ch 4x6 1 thread", 2, 8, 4, 6, 3, 5, 1, 2, 1, 1);
    conv_case("shifted k5 pad2 8ch on 2x3 (kernel wider than image)", 2, 8, 2, 3, 2, 5, 1, 2, 0, 2);

    /* a workspace too small is an error, not an overrun */
    fr_attr a = {.kernel = 3, .stride = 1, .pad = 1};
    float *x = frand(2 * 3 * 4 * 4, -1, 1), *w = frand(2 * 3 * 9, -1, 1), *y = fzeros(2 * 2 * 16);
    float *wsf = fzeros(4);
    call k;
    call_init(&k, FR_OP_CONV2D, &a);
    k.c.in[0] = tf(x, fr_shape4(2, 3, 4, 4));
    k.c.in[1] = tf(w, fr_shape4(2, 3, 3, 3));
    k.c.out[0] = tf(y, fr_shape4(2, 2, 4, 4));
    k.c.out[1] = tf(wsf, fr_shape1(4));
    int st = fr_k_conv2d(&k.c);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "workspace"),
          "conv small workspace: status %d, message '%s'", st, fr_last_error(g_ctx));
    /* a weight that does not match the input channels is a shape error */
    k.c.in[1] = tf(w, fr_shape4(3, 2, 3, 3));
    st = fr_k_conv2d(&k.c);
    CHECK(st == FR_ERR_SHAPE, "conv wrong weight shape");
    tfree_all();
}

/* ======================================================================= */
/* pooling                                                                 */

typedef struct pool_st {
    int64_t P, H, W, K, S, OH, OW; /* P planes */
    int max;
    double *x, *dy, *y;
} pool_st;

static void ref_pool(const pool_st *s) {
    for (int64_t p = 0; p < s->P; p++)
        for (int64_t oh = 0; oh < s->OH; oh++)
            for (int64_t ow = 0; ow < s->OW; ow++) {
                double v = s->max ? -INFINITY : 0.0;
                for (int64_t kh = 0; kh < s->K; kh++)
                    for (int64_t kw = 0; kw < s->K; kw++) {
                        double e = s->x[(p * s->H + oh * s->S + kh) * s->W + ow * s->S + kw];
                        v = s->max ? fmax(v, e) : v + e;
                    }
                s->y[(p * s->OH + oh) * s->OW + ow] = s->max ? v : v / (double)(s->K * s->K);
            }
}
static double obj_pool(void *p) {
    pool_st *s = p;
    ref_pool(s);
    return dot(s->dy, s->y, s->P * s->OH * s->OW);
}

static void pool_case(const char *tag, int max, int64_t N, int64_t C, int64_t H, int64_t W, int K,
                      int S) {
    char name[160];
    const int64_t OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    float *x = frand(nx, -1, 1), *dy = frand(ny, -1, 1), *y = fzeros(ny), *dx = frand(nx, 3, 4);
    pool_st s = {N * C, H, W, K, S, OH, OW, max, dof(x, nx), dof(dy, ny), dzeros(ny)};
    fr_attr a = {.kernel = K, .stride = S};
    call k;
    call_init(&k, max ? FR_OP_MAXPOOL2D : FR_OP_AVGPOOL2D, &a);
    k.c.in[0] = tf(x, fr_shape4(N, C, H, W));
    k.c.out[0] = tf(y, fr_shape4(N, C, OH, OW));
    snprintf(name, sizeof name, "%s fwd %s", max ? "maxpool" : "avgpool", tag);
    expect_ok(name, max ? fr_k_maxpool2d(&k.c) : fr_k_avgpool2d(&k.c));
    ref_pool(&s);
    expect_close(name, y, s.y, ny, TOL_EW);

    double *gx = dzeros(nx);
    fd_grad(obj_pool, &s, s.x, nx, gx);
    call_init(&k, max ? FR_OP_MAXPOOL2D_BWD : FR_OP_AVGPOOL2D_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape4(N, C, OH, OW));
    if (max) {
        k.c.in[1] = tf(x, fr_shape4(N, C, H, W));
        k.c.in[2] = tf(y, fr_shape4(N, C, OH, OW));
    }
    k.c.out[0] = tf(dx, fr_shape4(N, C, H, W));
    snprintf(name, sizeof name, "%s bwd %s vs FD", max ? "maxpool" : "avgpool", tag);
    expect_ok(name, max ? fr_k_maxpool2d_bwd(&k.c) : fr_k_avgpool2d_bwd(&k.c));
    expect_close(name, dx, gx, nx, TOL_EW);
    tfree_all();
}

/* planes of values in {0, 1, 2} (ties everywhere): every window's gradient
 * goes to its first maximum in row-major order, computed here by a naive scan */
static void maxpool_ties_random(const char *tag, int64_t K, int64_t S, int64_t H, int64_t W,
                                int acc) {
    char name[160];
    const int64_t N = 2, C = 3, OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    float *x = fzeros(nx), *dy = frand(ny, -1, 1), *y = fzeros(ny), *dx = frand(nx, -1, 1);
    for (int64_t i = 0; i < nx; i++) x[i] = (float)(int)(urand() * 3.0);
    double *want = dzeros(nx), *wanty = dzeros(ny);
    for (int64_t i = 0; i < nx; i++) want[i] = acc ? dx[i] : 0.0;
    for (int64_t p = 0; p < N * C; p++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t best = -1;
                for (int64_t kh = 0; kh < K; kh++)
                    for (int64_t kw = 0; kw < K; kw++) {
                        int64_t i = (p * H + oh * S + kh) * W + ow * S + kw;
                        if (best < 0 || x[i] > x[best]) best = i;
                    }
                want[best] += dy[(p * OH + oh) * OW + ow];
                wanty[(p * OH + oh) * OW + ow] = x[best];
            }
    fr_attr a = {.kernel = (int)K, .stride = (int)S};
    call k;
    call_init(&k, FR_OP_MAXPOOL2D, &a);
    k.c.in[0] = tf(x, fr_shape4(N, C, H, W));
    k.c.out[0] = tf(y, fr_shape4(N, C, OH, OW));
    fr_k_maxpool2d(&k.c);
    snprintf(name, sizeof name, "maxpool ties fwd %s", tag);
    expect_close(name, y, wanty, ny, 0.0);
    call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape4(N, C, OH, OW));
    k.c.in[1] = tf(x, fr_shape4(N, C, H, W));
    k.c.in[2] = tf(y, fr_shape4(N, C, OH, OW));
    k.c.out[0] = tf(dx, fr_shape4(N, C, H, W));
    k.c.accumulate = acc ? 1u : 0u;
    snprintf(name, sizeof name, "maxpool ties bwd %s", tag);
    expect_ok(name, fr_k_maxpool2d_bwd(&k.c));
    expect_close(name, dx, want, nx, TOL_EW);
    tfree_all();
}

/* Max pooling's backward with ReLU's folded in (attr.masked, plan/fold.h):
 * bit for bit relu_bwd(maxpool2d_bwd(dy, x), x), the pair it replaces, each
 * kernel run as it is (both checked against references above). x from
 * {-1, -0, +0, 0.5, 1} (ties, and windows whose maximum is 0) and NaN in
 * some windows, f32 or bf16 (the saved 16-bit y of bf16-mixed); dy has -0
 * values; odd planes (floor mode), rows of over 16 windows (AVX-512 and
 * the rest), overlapping and wider windows. */
static void maxpool_masked(int64_t K, int64_t S, int64_t H, int64_t W, fr_dtype xdt) {
    char name[160];
    const int64_t N = 2, C = 3, OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    const float vals[] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f};
    float *x = fzeros(nx), *dy = frand(ny, -1, 1), *tmp = fzeros(nx);
    float *want = frand(nx, 5, 6), *got = frand(nx, 7, 8);
    uint16_t *xh = talloc((size_t)nx * sizeof *xh);
    for (int64_t i = 0; i < nx; i++) {
        x[i] = urand() < 0.02 ? NAN : vals[(int)(urand() * 5.0)];
        xh[i] = fr_f32_to_bf16(x[i]);
    }
    for (int64_t i = 0; i < ny; i += 7) dy[i] = -0.0f;
    const fr_tensor xt =
        xdt == FR_BF16 ? (fr_tensor){.dtype = FR_BF16, .shape = fr_shape4(N, C, H, W), .data = xh}
                       : tf(x, fr_shape4(N, C, H, W));
    fr_attr a = {.kernel = (int)K, .stride = (int)S};
    call k;
    call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape4(N, C, OH, OW)), k.c.in[1] = xt;
    k.c.out[0] = tf(tmp, fr_shape4(N, C, H, W));
    snprintf(name, sizeof name, "maxpool bwd then relu bwd k%lld s%lld %lldx%lld %s", (long long)K,
             (long long)S, (long long)H, (long long)W, fr_dtype_name(xdt));
    expect_ok(name, fr_k_maxpool2d_bwd(&k.c));
    call_init(&k, FR_OP_RELU_BWD, NULL);
    k.c.in[0] = tf(tmp, fr_shape4(N, C, H, W)), k.c.in[1] = xt;
    k.c.out[0] = tf(want, fr_shape4(N, C, H, W));
    expect_ok(name, fr_k_relu_bwd(&k.c));
    a.masked = 1;
    call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape4(N, C, OH, OW)), k.c.in[1] = xt;
    k.c.out[0] = tf(got, fr_shape4(N, C, H, W));
    expect_ok(name, fr_k_maxpool2d_bwd(&k.c));
    int64_t off = 0, kept = 0;
    for (int64_t i = 0; i < nx; i++) {
        off += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        kept += want[i] != 0.0f;
    }
    CHECK(off == 0 && kept > 0, "%s, masked: %lld of %lld values differ (%lld nonzero)", name,
          (long long)off, (long long)nx, (long long)kept);
    tfree_all();
}

/* maxpool with many ties: the gradient goes to the first maximum of each
 * window in row-major order, and overlapping windows add. */
static void test_maxpool_ties(void) {
    /* hand-derived: a 3x3 plane of equal values, 2x2 windows at stride 1;
     * every window's first maximum is its top-left corner. */
    {
        float x[9] = {5, 5, 5, 5, 5, 5, 5, 5, 5}, dy[4] = {1, 2, 3, 4}, y[4], dx[9];
        double want[9] = {1, 2, 0, 3, 4, 0, 0, 0, 0};
        fr_attr a = {.kernel = 2, .stride = 1};
        call k;
        call_init(&k, FR_OP_MAXPOOL2D, &a);
        k.c.in[0] = tf(x, fr_shape4(1, 1, 3, 3));
        k.c.out[0] = tf(y, fr_shape4(1, 1, 2, 2));
        fr_k_maxpool2d(&k.c);
        call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
        k.c.in[0] = tf(dy, fr_shape4(1, 1, 2, 2));
        k.c.in[1] = tf(x, fr_shape4(1, 1, 3, 3));
        k.c.in[2] = tf(y, fr_shape4(1, 1, 2, 2));
        k.c.out[0] = tf(dx, fr_shape4(1, 1, 3, 3));
        expect_ok("maxpool ties hand status", fr_k_maxpool2d_bwd(&k.c));
        expect_close("maxpool ties hand example", dx, want, 9, 0.0);
    }
    /* hand-derived: window [[1, 3], [3, 2]]: the first 3 (top right) gets it */
    {
        float x[4] = {1, 3, 3, 2}, dy[1] = {7}, y[1], dx[4];
        double want[4] = {0, 7, 0, 0};
        fr_attr a = {.kernel = 2, .stride = 2};
        call k;
        call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
        k.c.in[0] = tf(dy, fr_shape4(1, 1, 1, 1));
        k.c.in[1] = tf(x, fr_shape4(1, 1, 2, 2));
        k.c.in[2] = tf(y, fr_shape4(1, 1, 1, 1));
        y[0] = 3;
        k.c.out[0] = tf(dx, fr_shape4(1, 1, 2, 2));
        fr_k_maxpool2d_bwd(&k.c);
        expect_close("maxpool ties first in row-major order", dx, want, 4, 0.0);
    }
    maxpool_ties_random("k3 s2 overlapping", 3, 2, 9, 8, 0);
    maxpool_ties_random("k2 s2 odd 9x7", 2, 2, 9, 7, 0);
    maxpool_ties_random("k2 s2 odd 9x7 accumulate", 2, 2, 9, 7, 1);
    maxpool_ties_random("k2 s1 overlapping", 2, 1, 6, 5, 0);
    /* rows of 20 and 35 windows: 16 at a time with AVX-512, then the rest */
    maxpool_ties_random("k2 s2 wide 6x40", 2, 2, 6, 40, 0);
    maxpool_ties_random("k2 s2 wide 5x71 accumulate", 2, 2, 5, 71, 1);

    /* NaN: the value is NaN and the gradient goes to the last NaN (PyTorch's
     * `val > max || isnan(val)` scan), on the 2x2 path and the general one */
    for (int K = 2; K <= 3; K++) {
        float x[9] = {1, NAN, 3, NAN, 0, 0, 0, 0, 0}, dy[1] = {5}, y[1] = {0}, dx[9];
        double want[9] = {0};
        want[3] = 5; /* x[3] is the last NaN in both windows (row-major) */
        fr_attr a = {.kernel = K, .stride = K};
        call k;
        call_init(&k, FR_OP_MAXPOOL2D, &a); /* x read as a KxK plane */
        k.c.in[0] = tf(x, fr_shape4(1, 1, K, K));
        k.c.out[0] = tf(y, fr_shape4(1, 1, 1, 1));
        fr_k_maxpool2d(&k.c);
        CHECK(isnan(y[0]), "%s",
              K == 2 ? "maxpool 2x2 NaN propagates" : "maxpool 3x3 NaN propagates");
        call_init(&k, FR_OP_MAXPOOL2D_BWD, &a);
        k.c.in[0] = tf(dy, fr_shape4(1, 1, 1, 1));
        k.c.in[1] = tf(x, fr_shape4(1, 1, K, K));
        k.c.in[2] = tf(y, fr_shape4(1, 1, 1, 1));
        k.c.out[0] = tf(dx, fr_shape4(1, 1, K, K));
        fr_k_maxpool2d_bwd(&k.c);
        /* in a KxK plane x[3] sits at row 3/K, column 3%K: offset 3 either way */
        expect_close(K == 2 ? "maxpool 2x2 NaN gets the gradient"
                            : "maxpool 3x3 NaN gets the gradient",
                     dx, want, K * K, 0.0);
    }
}

typedef struct gap_st {
    int64_t P, HW;
    double *x, *dy, *y;
} gap_st;
static double obj_gap(void *p) {
    gap_st *s = p;
    double t = 0.0;
    for (int64_t q = 0; q < s->P; q++) {
        double m = 0.0;
        for (int64_t i = 0; i < s->HW; i++) m += s->x[q * s->HW + i];
        s->y[q] = m / (double)s->HW;
        t += s->dy[q] * s->y[q];
    }
    return t;
}

static void test_pool(void) {
    pool_case("k2 s2 7x5 (floor)", 1, 2, 3, 7, 5, 2, 2);
    pool_case("k3 s2 overlapping", 1, 2, 2, 9, 8, 3, 2);
    pool_case("k3 s3", 1, 1, 2, 10, 11, 3, 3);
    pool_case("k2 s2 7x5 (floor)", 0, 2, 3, 7, 5, 2, 2);
    pool_case("k3 s1 overlapping", 0, 2, 2, 6, 7, 3, 1);
    test_maxpool_ties();
    for (int b = 0; b < 2; b++) {
        const fr_dtype xdt = b ? FR_BF16 : FR_F32;
        maxpool_masked(2, 2, 8, 8, xdt);
        maxpool_masked(2, 2, 9, 71, xdt); /* floor mode, 35 windows a row */
        maxpool_masked(3, 2, 9, 8, xdt);  /* overlapping */
        maxpool_masked(3, 3, 10, 11, xdt);
    }

    const int64_t N = 3, C = 4, H = 5, W = 6, nx = N * C * H * W;
    float *x = frand(nx, -1, 1), *y = fzeros(N * C), *dy = frand(N * C, -1, 1), *dx = fzeros(nx);
    gap_st s = {N * C, H * W, dof(x, nx), dof(dy, N * C), dzeros(N * C)};
    call k;
    call_init(&k, FR_OP_GLOBAL_AVGPOOL, NULL);
    k.c.in[0] = tf(x, fr_shape4(N, C, H, W));
    k.c.out[0] = tf(y, fr_shape2(N, C));
    expect_ok("global avgpool fwd status", fr_k_global_avgpool(&k.c));
    obj_gap(&s);
    expect_close("global avgpool fwd", y, s.y, N * C, TOL_EW);
    double *gx = dzeros(nx);
    fd_grad(obj_gap, &s, s.x, nx, gx);
    call_init(&k, FR_OP_GLOBAL_AVGPOOL_BWD, NULL);
    k.c.in[0] = tf(dy, fr_shape2(N, C));
    k.c.out[0] = tf(dx, fr_shape4(N, C, H, W));
    expect_ok("global avgpool bwd status", fr_k_global_avgpool_bwd(&k.c));
    expect_close("global avgpool bwd vs FD", dx, gx, nx, TOL_EW);
    tfree_all();
}

/* ======================================================================= */
/* activations                                                             */

typedef double (*dfun)(double);
static double d_relu(double v) { return v > 0 ? v : 0; }
static double d_gelu(double v) { return 0.5 * v * (1.0 + erf(v / sqrt(2.0))); }
static double d_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }
static double d_tanh(double v) { return tanh(v); }

typedef struct act_case {
    const char *name;
    fr_op op, bwd_op;
    int (*fwd)(fr_kernel_call *);
    int (*bwd)(fr_kernel_call *);
    dfun f;
    int bwd_takes_y; /* 1: the backward reads y, 0: x */
} act_case;

static void test_activations(void) {
    const act_case cases[] = {
        {"relu", FR_OP_RELU, FR_OP_RELU_BWD, fr_k_relu, fr_k_relu_bwd, d_relu, 1},
        {"gelu", FR_OP_GELU, FR_OP_GELU_BWD, fr_k_gelu, fr_k_gelu_bwd, d_gelu, 0},
        {"sigmoid", FR_OP_SIGMOID, FR_OP_SIGMOID_BWD, fr_k_sigmoid, fr_k_sigmoid_bwd, d_sigmoid, 1},
        {"tanh", FR_OP_TANH, FR_OP_TANH_BWD, fr_k_tanh, fr_k_tanh_bwd, d_tanh, 1},
    };
    const int64_t n = 40000; /* above the parallel threshold */
    const fr_shape sh = fr_shape2(200, 200);
    char name[128];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const act_case *ac = &cases[ci];
        float *x = frand(n, -5, 5), *y = fzeros(n), *dy = frand(n, -1, 1), *dx = fzeros(n);
        double *want = dzeros(n), *gx = dzeros(n);
        for (int64_t i = 0; i < n; i++) {
            want[i] = ac->f(x[i]);
            gx[i] = dy[i] * (ac->f(x[i] + FD_H) - ac->f(x[i] - FD_H)) / (2.0 * FD_H);
        }
        call k;
        call_init(&k, ac->op, NULL);
        k.c.in[0] = tf(x, sh);
        k.c.out[0] = tf(y, sh);
        snprintf(name, sizeof name, "%s fwd", ac->name);
        expect_ok(name, ac->fwd(&k.c));
        expect_close(name, y, want, n, TOL_EW);

        /* in place: out aliases in, same bits */
        float *buf = fcopy(x, n);
        k.c.in[0] = tf(buf, sh);
        k.c.out[0] = tf(buf, sh);
        ac->fwd(&k.c);
        snprintf(name, sizeof name, "%s fwd in place", ac->name);
        CHECK(!memcmp(buf, y, (size_t)n * 4), "%s", name);

        call_init(&k, ac->bwd_op, NULL);
        k.c.in[0] = tf(dy, sh);
        k.c.in[1] = tf(ac->bwd_takes_y ? y : x, sh);
        k.c.out[0] = tf(dx, sh);
        snprintf(name, sizeof name, "%s bwd vs FD", ac->name);
        expect_ok(name, ac->bwd(&k.c));
        expect_close(name, dx, gx, n, TOL_EW);

        /* dx aliases dy */
        float *g = fcopy(dy, n);
        k.c.in[0] = tf(g, sh);
        k.c.out[0] = tf(g, sh);
        ac->bwd(&k.c);
        snprintf(name, sizeof name, "%s bwd dx aliases dy", ac->name);
        CHECK(!memcmp(g, dx, (size_t)n * 4), "%s", name);
        tfree_all();
    }

    /* ADD, and ADD in place into a */
    const int64_t m = 1000;
    float *a = frand(m, -1, 1), *b = frand(m, -1, 1), *y = fzeros(m);
    double *want = dzeros(m);
    for (int64_t i = 0; i < m; i++) want[i] = (double)a[i] + b[i];
    call k;
    call_init(&k, FR_OP_ADD, NULL);
    k.c.in[0] = tf(a, fr_shape1(m));
    k.c.in[1] = tf(b, fr_shape1(m));
    k.c.out[0] = tf(y, fr_shape1(m));
    expect_ok("add status", fr_k_add(&k.c));
    expect_close("add", y, want, m, TOL_EW);
    k.c.out[0] = tf(a, fr_shape1(m));
    fr_k_add(&k.c);
    CHECK(!memcmp(a, y, (size_t)m * 4), "add in place (y aliases a)");
    tfree_all();
}

/* ======================================================================= */
/* batchnorm                                                               */

typedef struct bn_st {
    int64_t N, C, HW;
    double eps;
    double *x, *gamma, *beta, *dy, *y, *mean, *var;
} bn_st;

/* training-mode forward with batch statistics (biased variance) */
static void ref_bn(const bn_st *s) {
    const int64_t n = s->N * s->HW;
    for (int64_t c = 0; c < s->C; c++) {
        double m = 0.0, v = 0.0;
        for (int64_t i = 0; i < s->N; i++)
            for (int64_t j = 0; j < s->HW; j++) m += s->x[(i * s->C + c) * s->HW + j];
        m /= (double)n;
        for (int64_t i = 0; i < s->N; i++)
            for (int64_t j = 0; j < s->HW; j++) {
                double d = s->x[(i * s->C + c) * s->HW + j] - m;
                v += d * d;
            }
        v /= (double)n;
        s->mean[c] = m, s->var[c] = v;
        for (int64_t i = 0; i < s->N; i++)
            for (int64_t j = 0; j < s->HW; j++) {
                int64_t k = (i * s->C + c) * s->HW + j;
                s->y[k] = (s->x[k] - m) / sqrt(v + s->eps) * s->gamma[c] + s->beta[c];
            }
    }
}
static double obj_bn(void *p) {
    bn_st *s = p;
    ref_bn(s);
    return dot(s->dy, s->y, s->N * s->C * s->HW);
}

static void bn_case(const char *tag, fr_shape xs, double lo, double hi) {
    char name[160];
    const int64_t N = xs.d[0], C = xs.d[1], HW = xs.ndim == 4 ? xs.d[2] * xs.d[3] : 1;
    const int64_t nx = N * C * HW, cnt = N * HW;
    float *x = frand(nx, lo, hi), *gamma = frand(C, 0.5, 1.5), *beta = frand(C, -1, 1);
    float *rm0 = frand(C, -1, 1), *rv0 = frand(C, 0.5, 2);
    float *rm = fcopy(rm0, C), *rv = fcopy(rv0, C);
    float *y = fzeros(nx), *mean = fzeros(C), *invstd = fzeros(C), *dy = frand(nx, -1, 1);
    bn_st s = {
        N,           C,          HW,        1e-5,     dof(x, nx), dof(gamma, C), dof(beta, C),
        dof(dy, nx), dzeros(nx), dzeros(C), dzeros(C)};
    fr_attr a = {.training = 1, .eps = 1e-5f, .momentum = 0.1f};
    call k;
    call_init(&k, FR_OP_BATCHNORM, &a);
    k.c.in[0] = tf(x, xs);
    k.c.in[1] = tf(gamma, fr_shape1(C));
    k.c.in[2] = tf(beta, fr_shape1(C));
    k.c.in[3] = tf(rm, fr_shape1(C));
    k.c.in[4] = tf(rv, fr_shape1(C));
    k.c.out[0] = tf(y, xs);
    k.c.out[1] = tf(mean, fr_shape1(C));
    k.c.out[2] = tf(invstd, fr_shape1(C));
    snprintf(name, sizeof name, "batchnorm train %s status", tag);
    expect_ok(name, fr_k_batchnorm(&k.c));
    ref_bn(&s);
    double *winv = dzeros(C), *wrm = dzeros(C), *wrv = dzeros(C);
    for (int64_t c = 0; c < C; c++) {
        winv[c] = 1.0 / sqrt(s.var[c] + 1e-5);
        wrm[c] = 0.9 * rm0[c] + 0.1 * s.mean[c];
        wrv[c] = 0.9 * rv0[c] + 0.1 * s.var[c] * (double)cnt / (double)(cnt - 1);
    }
    snprintf(name, sizeof name, "batchnorm train %s y", tag);
    expect_close(name, y, s.y, nx, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm train %s saved mean", tag);
    expect_close(name, mean, s.mean, C, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm train %s saved invstd", tag);
    expect_close(name, invstd, winv, C, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm train %s running_mean", tag);
    expect_close(name, rm, wrm, C, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm train %s running_var (unbiased)", tag);
    expect_close(name, rv, wrv, C, TOL_SUM);

    /* eval: running statistics, no saved outputs */
    float *ye = fzeros(nx);
    double *want = dzeros(nx);
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t j = 0; j < HW; j++) {
                int64_t q = (i * C + c) * HW + j;
                want[q] =
                    ((double)x[q] - rm0[c]) / sqrt((double)rv0[c] + 1e-5) * gamma[c] + beta[c];
            }
    fr_attr ae = {.training = 0, .eps = 1e-5f, .momentum = 0.1f};
    float *rm_e = fcopy(rm0, C), *rv_e = fcopy(rv0, C);
    call_init(&k, FR_OP_BATCHNORM, &ae);
    k.c.in[0] = tf(x, xs);
    k.c.in[1] = tf(gamma, fr_shape1(C));
    k.c.in[2] = tf(beta, fr_shape1(C));
    k.c.in[3] = tf(rm_e, fr_shape1(C));
    k.c.in[4] = tf(rv_e, fr_shape1(C));
    k.c.out[0] = tf(ye, xs);
    k.c.out[1] = tf(NULL, fr_shape1(C));
    k.c.out[2] = tf(NULL, fr_shape1(C));
    snprintf(name, sizeof name, "batchnorm eval %s", tag);
    expect_ok(name, fr_k_batchnorm(&k.c));
    expect_close(name, ye, want, nx, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm eval %s leaves running stats", tag);
    CHECK(!memcmp(rm_e, rm0, (size_t)C * 4) && !memcmp(rv_e, rv0, (size_t)C * 4), "%s", name);

    /* backward vs FD of the training forward */
    const int64_t step = fd_step(nx), ns = fd_count(nx, step);
    double *gx = dzeros(ns), *gg = dzeros(C), *gb = dzeros(C);
    fd_grad_strided(obj_bn, &s, s.x, nx, step, gx);
    fd_grad(obj_bn, &s, s.gamma, C, gg);
    fd_grad(obj_bn, &s, s.beta, C, gb);
    float *dx = fzeros(nx), *dg = fzeros(C), *dbt = fzeros(C);
    call_init(&k, FR_OP_BATCHNORM_BWD, &a);
    k.c.in[0] = tf(dy, xs);
    k.c.in[1] = tf(x, xs);
    k.c.in[2] = tf(gamma, fr_shape1(C));
    k.c.in[3] = tf(mean, fr_shape1(C));
    k.c.in[4] = tf(invstd, fr_shape1(C));
    k.c.out[0] = tf(dx, xs);
    k.c.out[1] = tf(dg, fr_shape1(C));
    k.c.out[2] = tf(dbt, fr_shape1(C));
    snprintf(name, sizeof name, "batchnorm bwd %s status", tag);
    expect_ok(name, fr_k_batchnorm_bwd(&k.c));
    snprintf(name, sizeof name, "batchnorm bwd %s dx vs FD", tag);
    expect_close(name, gather(dx, nx, step), gx, ns, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm bwd %s dgamma vs FD", tag);
    expect_close(name, dg, gg, C, TOL_SUM);
    snprintf(name, sizeof name, "batchnorm bwd %s dbeta vs FD", tag);
    expect_close(name, dbt, gb, C, TOL_SUM);

    /* accumulate dgamma/dbeta, dx absent */
    float *dg0 = frand(C, -1, 1), *db0 = frand(C, -1, 1), *dg1 = fcopy(dg0, C),
          *db1 = fcopy(db0, C);
    k.c.out[0] = tf(NULL, xs);
    k.c.out[1] = tf(dg1, fr_shape1(C));
    k.c.out[2] = tf(db1, fr_shape1(C));
    k.c.accumulate = 6;
    snprintf(name, sizeof name, "batchnorm bwd %s accumulate, dx absent", tag);
    expect_ok(name, fr_k_batchnorm_bwd(&k.c));
    expect_close(name, dg1, dsum(dg0, gg, C), C, TOL_SUM);
    expect_close(name, db1, dsum(db0, gb, C), C, TOL_SUM);
    tfree_all();
}

static void test_batchnorm(void) {
    bn_case("(N,C)", fr_shape2(6, 3), -2, 4);
    bn_case("(N,C,H,W)", fr_shape4(4, 3, 3, 5), -2, 4);
    /* variance 8e-4 on a mean of 1: eps is 1% of it, so where eps enters shows */
    bn_case("(N,C,H,W) small variance", fr_shape4(3, 2, 4, 3), 0.95, 1.05);
    bn_case("(N,C,H,W) large", fr_shape4(8, 4, 32, 32), -2, 4); /* above the parallel threshold */
    /* one value per channel cannot be normalised in training */
    float x[3] = {1, 2, 3}, y[3];
    fr_attr a = {.training = 1, .eps = 1e-5f, .momentum = 0.1f};
    call k;
    call_init(&k, FR_OP_BATCHNORM, &a);
    k.c.in[0] = tf(x, fr_shape2(1, 3));
    k.c.out[0] = tf(y, fr_shape2(1, 3));
    CHECK(fr_k_batchnorm(&k.c) == FR_ERR_ARG, "batchnorm one value per channel");
}

/* ======================================================================= */
/* layernorm                                                               */

typedef struct ln_st {
    int64_t N, D;
    double eps;
    double *x, *gamma, *beta, *dy, *y, *mean, *rstd;
} ln_st;

static void ref_ln(const ln_st *s) {
    for (int64_t n = 0; n < s->N; n++) {
        const double *xr = s->x + n * s->D;
        double m = 0.0, v = 0.0;
        for (int64_t d = 0; d < s->D; d++) m += xr[d];
        m /= (double)s->D;
        for (int64_t d = 0; d < s->D; d++) v += (xr[d] - m) * (xr[d] - m);
        v /= (double)s->D;
        s->mean[n] = m, s->rstd[n] = 1.0 / sqrt(v + s->eps);
        for (int64_t d = 0; d < s->D; d++)
            s->y[n * s->D + d] = (xr[d] - m) * s->rstd[n] * s->gamma[d] + s->beta[d];
    }
}
static double obj_ln(void *p) {
    ln_st *s = p;
    ref_ln(s);
    return dot(s->dy, s->y, s->N * s->D);
}

static void ln_case(const char *tag, fr_shape xs, double lo, double hi) {
    char name[160];
    const int64_t N = xs.d[0], nx = fr_shape_numel(&xs), D = nx / N;
    fr_shape gs = xs;
    gs.ndim--;
    for (int i = 0; i < gs.ndim; i++) gs.d[i] = xs.d[i + 1];
    float *x = frand(nx, lo, hi), *gamma = frand(D, 0.5, 1.5), *beta = frand(D, -1, 1);
    float *y = fzeros(nx), *mean = fzeros(N), *rstd = fzeros(N), *dy = frand(nx, -1, 1);
    ln_st s = {N,           D,          1e-5,      dof(x, nx), dof(gamma, D), dof(beta, D),
               dof(dy, nx), dzeros(nx), dzeros(N), dzeros(N)};
    fr_attr a = {.eps = 1e-5f};
    call k;
    call_init(&k, FR_OP_LAYERNORM, &a);
    k.c.in[0] = tf(x, xs);
    k.c.in[1] = tf(gamma, gs);
    k.c.in[2] = tf(beta, gs);
    k.c.out[0] = tf(y, xs);
    k.c.out[1] = tf(mean, fr_shape1(N));
    k.c.out[2] = tf(rstd, fr_shape1(N));
    snprintf(name, sizeof name, "layernorm fwd %s", tag);
    expect_ok(name, fr_k_layernorm(&k.c));
    ref_ln(&s);
    expect_close(name, y, s.y, nx, TOL_SUM);
    snprintf(name, sizeof name, "layernorm fwd %s mean", tag);
    expect_close(name, mean, s.mean, N, TOL_SUM);
    snprintf(name, sizeof name, "layernorm fwd %s rstd", tag);
    expect_close(name, rstd, s.rstd, N, TOL_SUM);

    const int64_t step = fd_step(nx), ns = fd_count(nx, step);
    double *gx = dzeros(ns), *gg = dzeros(D), *gb = dzeros(D);
    fd_grad_strided(obj_ln, &s, s.x, nx, step, gx);
    fd_grad(obj_ln, &s, s.gamma, D, gg);
    fd_grad(obj_ln, &s, s.beta, D, gb);
    float *dx = fzeros(nx), *dg = fzeros(D), *dbt = fzeros(D);
    call_init(&k, FR_OP_LAYERNORM_BWD, &a);
    k.c.in[0] = tf(dy, xs);
    k.c.in[1] = tf(x, xs);
    k.c.in[2] = tf(gamma, gs);
    k.c.in[3] = tf(mean, fr_shape1(N));
    k.c.in[4] = tf(rstd, fr_shape1(N));
    k.c.out[0] = tf(dx, xs);
    k.c.out[1] = tf(dg, gs);
    k.c.out[2] = tf(dbt, gs);
    snprintf(name, sizeof name, "layernorm bwd %s status", tag);
    expect_ok(name, fr_k_layernorm_bwd(&k.c));
    snprintf(name, sizeof name, "layernorm bwd %s dx vs FD", tag);
    expect_close(name, gather(dx, nx, step), gx, ns, TOL_SUM);
    snprintf(name, sizeof name, "layernorm bwd %s dgamma vs FD", tag);
    expect_close(name, dg, gg, D, TOL_SUM);
    snprintf(name, sizeof name, "layernorm bwd %s dbeta vs FD", tag);
    expect_close(name, dbt, gb, D, TOL_SUM);

    float *dg0 = frand(D, -1, 1), *db0 = frand(D, -1, 1), *dg1 = fcopy(dg0, D),
          *db1 = fcopy(db0, D);
    k.c.out[0] = tf(NULL, xs);
    k.c.out[1] = tf(dg1, gs);
    k.c.out[2] = tf(db1, gs);
    k.c.accumulate = 6;
    snprintf(name, sizeof name, "layernorm bwd %s accumulate, dx absent", tag);
    expect_ok(name, fr_k_layernorm_bwd(&k.c));
    expect_close(name, dg1, dsum(dg0, gg, D), D, TOL_SUM);
    expect_close(name, db1, dsum(db0, gb, D), D, TOL_SUM);
    tfree_all();
}

static void test_layernorm(void) {
    ln_case("(N,D)", fr_shape2(5, 8), -1, 3);
    ln_case("(N,C,H,W)", fr_shape4(3, 2, 3, 5), -1, 3);
    ln_case("(N,D) small variance", fr_shape2(4, 16), 0.95, 1.05); /* eps is 1% of var */
    ln_case("(N,D) large", fr_shape2(64, 600), -1, 3); /* above the parallel threshold */
    /* rows too wide to widen four side by side (one at a time), and columns in
     * several spans a thread with a short last one */
    ln_case("(N,D) wide rows", fr_shape2(5, 4500), -1, 3);
}

/* ======================================================================= */
/* dropout                                                                 */

static void dropout_run(float *x, float *y, uint8_t *mask, int64_t n, float p, uint64_t seed,
                        uint64_t step, uint32_t salt, int training) {
    fr_attr a = {.p = p, .salt = salt, .training = training};
    call k;
    call_init(&k, FR_OP_DROPOUT, &a);
    k.c.seed = seed;
    k.c.step = step;
    k.c.in[0] = tf(x, fr_shape1(n));
    k.c.out[0] = tf(y, fr_shape1(n));
    k.c.out[1] = tu8(mask, fr_shape1(n));
    expect_ok("dropout status", fr_k_dropout(&k.c));
}

static void test_dropout(void) {
    const int64_t n = 200000;
    const float p = 0.3f;
    const uint64_t seed = 1234, step = 7;
    const uint32_t salt = 5;
    float *x = frand(n, -1, 1), *y = fzeros(n);
    uint8_t *mask = talloc((size_t)n);
    dropout_run(x, y, mask, n, p, seed, step, salt, 1);

    /* the rule of kernels.h, element by element */
    int64_t kept = 0, rule_bad = 0;
    double *want = dzeros(n);
    for (int64_t i = 0; i < n; i++) {
        int keep = fr_rng_uniform(seed, ((uint64_t)step << 32) | salt, (uint64_t)i) >= p;
        if (mask[i] != keep) rule_bad++;
        kept += mask[i];
        want[i] = keep ? x[i] / (1.0 - p) : 0.0;
    }
    CHECK(rule_bad == 0, "dropout mask follows the rule: %lld elements differ",
          (long long)rule_bad);
    expect_close("dropout y = x / (1-p) where kept", y, want, n, TOL_EW);
    /* kept ~ Binomial(n, 1-p): sd = sqrt(n p (1-p)) ~ 205; 6 sd */
    double sd = sqrt((double)n * p * (1 - p));
    CHECK(fabs((double)kept - n * (1.0 - p)) < 6 * sd,
          "dropout keep rate: kept %lld of %lld, expected %.0f +- %.0f", (long long)kept,
          (long long)n, n * (1.0 - p), 6 * sd);
    /* both halves of the stream look alike (no drift with the index) */
    int64_t k1 = 0;
    for (int64_t i = 0; i < n / 2; i++) k1 += mask[i];
    double sd2 = sqrt((double)n / 2 * p * (1 - p));
    CHECK(fabs((double)k1 - n / 2 * (1.0 - p)) < 6 * sd2, "dropout keep rate, first half");

    /* the same at 1 and 3 threads; another step or salt gives another mask */
    float *y1 = fzeros(n);
    uint8_t *m1 = talloc((size_t)n), *m2 = talloc((size_t)n), *m3 = talloc((size_t)n);
    omp_set_num_threads(1);
    dropout_run(x, y1, m1, n, p, seed, step, salt, 1);
    omp_set_num_threads(3);
    dropout_run(x, y1, m2, n, p, seed, step, salt, 1);
    omp_set_num_threads(2);
    CHECK(!memcmp(m1, mask, (size_t)n) && !memcmp(m2, mask, (size_t)n) &&
              !memcmp(y1, y, (size_t)n * 4),
          "dropout same bits at 1, 2, 3 threads");
    dropout_run(x, y1, m1, n, p, seed, step + 1, salt, 1);
    dropout_run(x, y1, m3, n, p, seed, step, salt + 1, 1);
    dropout_run(x, y1, m2, n, p, seed + 1, step, salt, 1);
    CHECK(memcmp(m1, mask, (size_t)n) && memcmp(m3, mask, (size_t)n) && memcmp(m2, mask, (size_t)n),
          "dropout step, salt and seed change the mask");

    /* p = 0 keeps all, y = x */
    dropout_run(x, y1, m1, n, 0.0f, seed, step, salt, 1);
    CHECK(!memcmp(x, y1, (size_t)n * 4), "dropout p = 0 is the identity");

    /* eval: identity, mask absent, in place allowed */
    float *ye = fzeros(n), *xe = fcopy(x, n);
    dropout_run(x, ye, NULL, n, p, seed, step, salt, 0);
    CHECK(!memcmp(x, ye, (size_t)n * 4), "dropout eval is the identity");
    dropout_run(xe, xe, NULL, n, p, seed, step, salt, 0);
    CHECK(!memcmp(x, xe, (size_t)n * 4), "dropout eval in place");

    /* backward: FD of the forward with the mask fixed by the rule */
    float *dy = frand(n, -1, 1), *dx = fzeros(n);
    double *gx = dzeros(n);
    for (int64_t i = 0; i < n; i++) {
        int keep = mask[i];
        double fp = keep ? ((double)x[i] + FD_H) / (1.0 - p) : 0.0;
        double fm = keep ? ((double)x[i] - FD_H) / (1.0 - p) : 0.0;
        gx[i] = dy[i] * (fp - fm) / (2 * FD_H);
    }
    fr_attr a = {.p = p, .salt = salt, .training = 1};
    call k;
    call_init(&k, FR_OP_DROPOUT_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape1(n));
    k.c.in[1] = tu8(mask, fr_shape1(n));
    k.c.out[0] = tf(dx, fr_shape1(n));
    expect_ok("dropout bwd status", fr_k_dropout_bwd(&k.c));
    expect_close("dropout bwd vs FD", dx, gx, n, TOL_EW);
    float *g = fcopy(dy, n);
    k.c.in[0] = tf(g, fr_shape1(n));
    k.c.out[0] = tf(g, fr_shape1(n));
    fr_k_dropout_bwd(&k.c);
    CHECK(!memcmp(g, dx, (size_t)n * 4), "dropout bwd dx aliases dy");
    tfree_all();
}

/* ======================================================================= */
/* losses                                                                  */

typedef struct ce_st {
    int64_t N, C;
    double scale;
    double *z;
    const int32_t *y;
} ce_st;

/* scale * mean_n (log sum_j exp z[n,j] - z[n,y[n]]), directly (small logits only) */
static double obj_ce(void *p) {
    ce_st *s = p;
    double t = 0.0;
    for (int64_t n = 0; n < s->N; n++) {
        double e = 0.0;
        for (int64_t j = 0; j < s->C; j++) e += exp(s->z[n * s->C + j]);
        t += log(e) - s->z[n * s->C + s->y[n]];
    }
    return s->scale * t / (double)s->N;
}

static int ce_run(fr_op op, float *z, int32_t *lab, float *out, int64_t N, int64_t C, float scale) {
    fr_attr a = {.scale = scale};
    call k;
    call_init(&k, op, &a);
    k.c.in[0] = tf(z, fr_shape2(N, C));
    k.c.in[1] = ti32(lab, fr_shape1(N));
    k.c.out[0] = op == FR_OP_CROSS_ENTROPY ? tf(out, fr_shape1(1)) : tf(out, fr_shape2(N, C));
    return op == FR_OP_CROSS_ENTROPY ? fr_k_cross_entropy(&k.c) : fr_k_cross_entropy_bwd(&k.c);
}

static void test_cross_entropy(void) {
    const int64_t N = 6, C = 5;
    float *z = frand(N * C, -3, 3), loss = 0;
    int32_t lab[6];
    for (int i = 0; i < N; i++) lab[i] = (int32_t)(urand() * C);
    ce_st s = {N, C, 1.0, dof(z, N * C), lab};
    expect_ok("cross-entropy fwd status", ce_run(FR_OP_CROSS_ENTROPY, z, lab, &loss, N, C, 1.0f));
    double want = obj_ce(&s);
    expect_close("cross-entropy fwd", &loss, &want, 1, TOL_EW);

    s.scale = 0.5;
    double *gz = dzeros(N * C);
    fd_grad(obj_ce, &s, s.z, N * C, gz);
    float *dz = fzeros(N * C);
    expect_ok("cross-entropy bwd status", ce_run(FR_OP_CROSS_ENTROPY_BWD, z, lab, dz, N, C, 0.5f));
    expect_close("cross-entropy bwd (scale 0.5) vs FD", dz, gz, N * C, TOL_EW);

    /* logits around 1000: the reference shifts by 1000 by hand (exact in
     * double), log sum exp(1000 + r) = 1000 + log sum exp(r) */
    const int64_t L = 4, LC = 10;
    float *zl = fzeros(L * LC), *dzl = fzeros(L * LC), lossl = 0;
    int32_t labl[4] = {0, 3, 9, 5};
    double tot = 0.0, *wantg = dzeros(L * LC);
    for (int64_t n = 0; n < L; n++) {
        for (int64_t j = 0; j < LC; j++) zl[n * LC + j] = (float)(1000.0 + unif(-2, 2));
        if (n == 3) zl[n * LC + 5] = -1000.0f, zl[n * LC + 2] = 1000.0f; /* loss ~ 2000 */
        double e = 0.0;
        for (int64_t j = 0; j < LC; j++) e += exp((double)zl[n * LC + j] - 1000.0);
        double lse = 1000.0 + log(e);
        tot += lse - zl[n * LC + labl[n]];
        for (int64_t j = 0; j < LC; j++)
            wantg[n * LC + j] = (exp((double)zl[n * LC + j] - lse) - (j == labl[n])) / (double)L;
    }
    double wantl = tot / (double)L;
    expect_ok("cross-entropy logits 1000 status",
              ce_run(FR_OP_CROSS_ENTROPY, zl, labl, &lossl, L, LC, 1.0f));
    CHECK(isfinite(lossl), "cross-entropy logits 1000 finite: loss %g", lossl);
    expect_close("cross-entropy logits 1000", &lossl, &wantl, 1, TOL_EW);
    expect_ok("cross-entropy bwd logits 1000 status",
              ce_run(FR_OP_CROSS_ENTROPY_BWD, zl, labl, dzl, L, LC, 1.0f));
    expect_close("cross-entropy bwd logits 1000", dzl, wantg, L * LC, TOL_EW);

    /* accumulate bit on dlogits */
    float *d0 = frand(N * C, -1, 1), *d1 = fcopy(d0, N * C);
    fr_attr a = {.scale = 0.5f};
    call k;
    call_init(&k, FR_OP_CROSS_ENTROPY_BWD, &a);
    k.c.in[0] = tf(z, fr_shape2(N, C));
    k.c.in[1] = ti32(lab, fr_shape1(N));
    k.c.out[0] = tf(d1, fr_shape2(N, C));
    k.c.accumulate = 1;
    fr_k_cross_entropy_bwd(&k.c);
    expect_close("cross-entropy bwd accumulated", d1, dsum(d0, gz, N * C), N * C, TOL_EW);

    /* a label out of range: an error naming the sample, nothing written */
    int32_t bad[10] = {1, 2, 3, 12, 0, 0, 0, 0, 0, 0};
    float *zb = frand(10 * 10, -1, 1), sentinel = -42.0f, *dzb = fzeros(100);
    int st = ce_run(FR_OP_CROSS_ENTROPY, zb, bad, &sentinel, 10, 10, 1.0f);
    CHECK(st == FR_ERR_ARG &&
              strstr(fr_last_error(g_ctx), "label 12 of sample 3 is outside [0, 10)"),
          "cross-entropy label 12 out of range: status %d, message '%s'", st, fr_last_error(g_ctx));
    CHECK(sentinel == -42.0f, "cross-entropy bad label writes nothing");
    bad[3] = 10; /* the first label past the end */
    st = ce_run(FR_OP_CROSS_ENTROPY, zb, bad, &sentinel, 10, 10, 1.0f);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "label 10 of sample 3"),
          "cross-entropy label C out of range: status %d, message '%s'", st, fr_last_error(g_ctx));
    bad[3] = 3, bad[7] = -1;
    st = ce_run(FR_OP_CROSS_ENTROPY_BWD, zb, bad, dzb, 10, 10, 1.0f);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "sample 7"),
          "cross-entropy bwd label -1 out of range: status %d, message '%s'", st,
          fr_last_error(g_ctx));
    tfree_all();
}

typedef struct mse_st {
    int64_t n;
    double scale;
    double *p, *t;
} mse_st;
static double obj_mse(void *q) {
    mse_st *s = q;
    double a = 0.0;
    for (int64_t i = 0; i < s->n; i++) a += (s->p[i] - s->t[i]) * (s->p[i] - s->t[i]);
    return s->scale * a / (double)s->n;
}

static void test_mse(void) {
    const int64_t N = 4, D = 6, n = N * D;
    float *p = frand(n, -2, 2), *t = frand(n, -2, 2), loss = 0, *dp = fzeros(n);
    mse_st s = {n, 1.0, dof(p, n), dof(t, n)};
    fr_attr a = {.scale = 0.25f};
    call k;
    call_init(&k, FR_OP_MSE, &a);
    k.c.in[0] = tf(p, fr_shape2(N, D));
    k.c.in[1] = tf(t, fr_shape2(N, D));
    k.c.out[0] = tf(&loss, fr_shape1(1));
    expect_ok("mse fwd status", fr_k_mse(&k.c));
    double want = obj_mse(&s);
    expect_close("mse fwd", &loss, &want, 1, TOL_EW);

    s.scale = 0.25;
    double *gp = dzeros(n);
    fd_grad(obj_mse, &s, s.p, n, gp);
    call_init(&k, FR_OP_MSE_BWD, &a);
    k.c.in[0] = tf(p, fr_shape2(N, D));
    k.c.in[1] = tf(t, fr_shape2(N, D));
    k.c.out[0] = tf(dp, fr_shape2(N, D));
    expect_ok("mse bwd status", fr_k_mse_bwd(&k.c));
    expect_close("mse bwd (scale 0.25) vs FD", dp, gp, n, TOL_EW);
    float *d0 = frand(n, -1, 1), *d1 = fcopy(d0, n);
    k.c.out[0] = tf(d1, fr_shape2(N, D));
    k.c.accumulate = 1;
    fr_k_mse_bwd(&k.c);
    expect_close("mse bwd accumulated", d1, dsum(d0, gp, n), n, TOL_EW);
    tfree_all();
}

/* Accuracy's count against a left-to-right strict > scan written here:
 * random rows, ties (the first wins), NaNs (passed over; first: class 0),
 * -inf rows, and rows long and many enough for the threads and vector
 * lanes. */
static int64_t naive_argmax(const float *z, int64_t C) {
    int64_t best = 0;
    for (int64_t k = 1; k < C; k++)
        if (z[k] > z[best]) best = k;
    return best;
}
static void test_argmax_hits(void) {
    const int64_t Cs[] = {1, 3, 10, 37, 1000};
    for (int ci = 0; ci < 5; ci++) {
        const int64_t C = Cs[ci], rows = 70;
        float *z = frand(rows * C, -3, 3);
        int32_t *y = malloc((size_t)rows * sizeof *y);
        for (int64_t n = 0; n < rows; n++) {
            float *r = z + n * C;
            switch (n % 7) {
            case 1: r[C / 2] = r[C - 1] = 9.0f; break;       /* a tie */
            case 2: r[0] = NAN; break;                       /* NaN first */
            case 3: r[C / 3] = NAN, r[C - 1] = 10.0f; break; /* NaN inside */
            case 4:
                for (int64_t j = 0; j < C; j++) r[j] = -INFINITY;
                break;
            case 5: r[C - 1] = 0.0f, r[0] = -0.0f; break;
            default: break;
            }
        }
        int64_t want = 0;
        for (int64_t n = 0; n < rows; n++) {
            int64_t b = naive_argmax(z + n * C, C);
            y[n] = (int32_t)(n % 3 == 0 ? b : (b + 1) % C); /* about a third right */
            want += y[n] == b;
        }
        int64_t got = fr_k_argmax_hits(z, y, rows, C);
        CHECK(got == want, "argmax hits at C=%lld: %lld, a strict > scan %lld", (long long)C,
              (long long)got, (long long)want);
        free(y);
    }
    float big[3 * 20000];
    int32_t yb[3] = {19999, 0, 5};
    for (int i = 0; i < 3 * 20000; i++) big[i] = (float)(i % 20000) * (i < 20000 ? 1.0f : -1.0f);
    big[2 * 20000 + 5] = 1.0f;
    CHECK(fr_k_argmax_hits(big, yb, 3, 20000) == 3, "argmax hits over long rows");
    tfree_all();
}

/* The CPU backend's table has a kernel for every op but the views, which
 * share their input's storage and run nothing, and OPTIM_STEP, which the
 * executor hands to the optimizer. */
static void test_table(void) {
    for (int op = 0; op < FR_OP_COUNT; op++)
        CHECK((fr_cpu_backend.kernels[op] == NULL) ==
                  (fr_op_get((fr_op)op)->view || op == FR_OP_OPTIM_STEP),
              "cpu table: %s %s a kernel", fr_op_get((fr_op)op)->name,
              fr_cpu_backend.kernels[op] ? "has" : "lacks");
}

int main(void) {
    g_ctx = fr_ctx_new();
    if (!g_ctx) return 2;
    g_verbose = getenv("FR_TEST_VERBOSE") != NULL;
    omp_set_num_threads(2);
    test_table();
    test_linear();
    test_conv();
    test_pool();
    test_activations();
    test_batchnorm();
    test_layernorm();
    test_dropout();
    test_cross_entropy();
    test_mse();
    test_argmax_hits();
    fr_ctx_free(g_ctx);
    return check_done();
}
