/* test_llama_ops.c — the Llama family's RMSNORM, RMSNORM_BWD, SWIGLU and
 * SWIGLU_BWD. The CPU kernels against float64 references written here from
 * the definitions (Hugging Face's LlamaRMSNorm and LlamaMLP: rstd =
 * 1/sqrt(mean x^2 + eps), y = w (x rstd); y = silu(gate) up) and, for the
 * backward, from the derivatives worked by hand:
 *   RMSNORM   xhat = x rstd, g = dy w, d rstd / d x_k = -rstd^3 x_k / C:
 *             dx = rstd (g - xhat mean_c(g xhat)),  dw = sum_rows dy xhat
 *   SWIGLU    s = sigmoid(gate), silu' = s (1 + gate (1 - s)):
 *             dgate = dy up silu'(gate),  dup = dy silu(gate)
 * against central finite differences of the float64 forward, and against
 * PyTorch running Hugging Face's code (tests/llama_ops_ref.h, made by
 * tests/ref/llama_ops_ref.py; forward per element within 1e-6, gradients
 * within 1e-5 of the largest: PyTorch sums in float). Odd sizes
 * (C = 5, 7, 64, 1000; row counts no thread count divides), accumulate bits,
 * absent outputs and weights, in-place calls, 1 and 3 threads giving the
 * same bits, the shape rules' and the kernels' errors, a Llama MLP's
 * gradients through autodiff, plan and executor with and without the cheap
 * recomputation of its RMSNorm and SwiGLU outputs (fr_remat_cheap: the same
 * bits, the clones and their FLOPs as expected); then, where an
 * OpenCL device is found (PoCL here), the device kernels against the CPU's.
 *
 * Bounds. Forward, per element: the kernels round rstd from double and make
 * y in two float products (RMSNORM), or call a 2-ulp exponential and round
 * four times (SWIGLU): within 8 float ulps (|d| <= 1e-6 |ref|). The sums of a
 * backward (C or rows terms, in double, then rounded products) are checked
 * as test_kernels.c does: |d| <= 2e-5 (|ref| + max|ref|); dgate, whose
 * 1 + g (1 - s) cancels near g = -1.28, by 1e-6 of the magnitude of its
 * terms |dy up| s (1 + |g| (1 - s)). Finite differences in float64 with
 * h = 1e-6 are exact to ~1e-9 relative. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/mem.h"
#include "llama_ops_ref.h"
#include "exec/exec.h"
#include "ops/ops.h"
#include "plan/remat.h"

#define TOL_EW 1e-6
#define TOL_SUM 2e-5
#define FD_H 1e-6
#define ABS_FLOOR 1e-36 /* silu(g) for g < -88: the float exponential overflows, y is -0 */

static fr_ctx *g_ctx;

/* ---- allocations of the current case (exact sizes, so ASan sees overruns) ---- */

#define MAX_ALLOCS 256
static void *g_allocs[MAX_ALLOCS];
static int g_nallocs;

static void *talloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || g_nallocs == MAX_ALLOCS) {
        fprintf(stderr, "test_llama_ops: out of memory\n");
        exit(2);
    }
    g_allocs[g_nallocs++] = p;
    return p;
}
static void tfree_all(void) {
    while (g_nallocs) free(g_allocs[--g_nallocs]);
}

/* xorshift64*, independent of core/rng */
static uint64_t g_rs = 0x9e3779b97f4a7c15ULL;
static double urand(void) {
    g_rs ^= g_rs >> 12, g_rs ^= g_rs << 25, g_rs ^= g_rs >> 27;
    return (double)((g_rs * 2685821657736338717ULL) >> 11) * 0x1.0p-53;
}
static float *frand(int64_t n, double lo, double hi) {
    float *p = talloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
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
static double *dsum(const float *base, const double *add, int64_t n) {
    double *p = dzeros(n);
    for (int64_t i = 0; i < n; i++) p[i] = (double)base[i] + add[i];
    return p;
}

/* |got - ref| <= tol (|ref| + max|ref|) */
static void expect_close(const char *name, const float *got, const double *ref, int64_t n,
                         double tol) {
    double scale = 0.0, worst = 0.0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + scale + 1e-300);
        if (!(e <= worst)) worst = e, wi = i; /* a NaN sticks */
    }
    CHECK(n > 0 && worst <= tol, "%s: worst error %.3g at %lld (got %.9g, want %.9g), tol %.0e",
          name, worst, (long long)wi, n ? got[wi] : 0.0, n ? ref[wi] : 0.0, tol);
}

/* per element: |got - ref| <= tol mag[i] + ABS_FLOOR, mag = |ref| when NULL */
static void expect_elem(const char *name, const float *got, const double *ref, const double *mag,
                        int64_t n, double tol) {
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        const double m = mag ? mag[i] : fabs(ref[i]);
        if (!(fabs(got[i] - ref[i]) <= tol * m + ABS_FLOOR)) bad = i;
    }
    CHECK(n > 0 && bad < 0, "%s: element %lld: got %.9g, want %.9g", name, (long long)bad,
          bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : ref[bad]);
}

static void expect_same(const char *name, const float *a, const float *b, int64_t n) {
    CHECK(!memcmp(a, b, (size_t)n * sizeof(float)), "%s: not the same bits", name);
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
static void expect_ok(const char *name, int st) {
    CHECK(st == FR_OK, "%s: status %d: %s", name, st, fr_last_error(g_ctx));
}

/* ---- finite differences: g[j] = (f(p + h e_i) - f(p - h e_i)) / 2h at i = j step ---- */

typedef double (*objective)(void *st);

static void fd_grad(objective f, void *st, double *p, int64_t n, int64_t step, double *g) {
    for (int64_t j = 0; j * step < n; j++) {
        double *q = p + j * step, save = *q;
        *q = save + FD_H;
        double fp = f(st);
        *q = save - FD_H;
        double fm = f(st);
        *q = save;
        g[j] = (fp - fm) / (2.0 * FD_H);
    }
}
/* about 300 differenced points on large tensors (each costs two forwards) */
static int64_t fd_step(int64_t n) { return n > 600 ? n / 300 + 1 : 1; }
static int64_t fd_count(int64_t n, int64_t step) { return (n + step - 1) / step; }
static float *gather(const float *src, int64_t n, int64_t step) {
    float *d = fzeros(fd_count(n, step));
    for (int64_t j = 0; j * step < n; j++) d[j] = src[j * step];
    return d;
}

/* ======================================================================= */
/* RMSNORM                                                                 */

typedef struct rms_ref {
    int64_t N, C;
    double eps;
    double *x, *w, *dy; /* w NULL: 1 */
    double *y, *rstd, *dx, *dw;
} rms_ref;

static void ref_rms_fwd(rms_ref *s) {
    for (int64_t n = 0; n < s->N; n++) {
        const double *xr = s->x + n * s->C;
        double ss = 0.0;
        for (int64_t c = 0; c < s->C; c++) ss += xr[c] * xr[c];
        s->rstd[n] = 1.0 / sqrt(ss / (double)s->C + s->eps);
        for (int64_t c = 0; c < s->C; c++)
            s->y[n * s->C + c] = (s->w ? s->w[c] : 1.0) * (xr[c] * s->rstd[n]);
    }
}

/* the hand-derived backward (see the top of the file), on the float64 forward */
static void ref_rms_bwd(rms_ref *s) {
    ref_rms_fwd(s);
    const int64_t C = s->C;
    for (int64_t c = 0; c < C; c++) s->dw[c] = 0.0;
    for (int64_t n = 0; n < s->N; n++) {
        const double r = s->rstd[n], *xr = s->x + n * C, *dyr = s->dy + n * C;
        double sgx = 0.0;
        for (int64_t c = 0; c < C; c++) sgx += dyr[c] * (s->w ? s->w[c] : 1.0) * xr[c] * r;
        const double m = sgx / (double)C;
        for (int64_t c = 0; c < C; c++) {
            const double g = dyr[c] * (s->w ? s->w[c] : 1.0), xh = xr[c] * r;
            s->dx[n * C + c] = r * (g - xh * m);
            s->dw[c] += dyr[c] * xh;
        }
    }
}

static double obj_rms(void *p) {
    rms_ref *s = p;
    ref_rms_fwd(s);
    double l = 0.0;
    for (int64_t i = 0; i < s->N * s->C; i++) l += s->dy[i] * s->y[i];
    return l;
}

static void rms_fwd_call(call *k, const fr_attr *a, fr_shape xs, int64_t C, float *x, float *w,
                         float *y, float *rstd) {
    call_init(k, FR_OP_RMSNORM, a);
    fr_shape rs = xs;
    rs.ndim--;
    k->c.in[0] = tf(x, xs);
    k->c.in[1] = w ? tf(w, fr_shape1(C)) : (fr_tensor){0};
    k->c.out[0] = tf(y, xs);
    k->c.out[1] = tf(rstd, rs);
}

static void rms_bwd_call(call *k, const fr_attr *a, fr_shape xs, int64_t C, float *dy, float *x,
                         float *w, float *rstd, float *dx, float *dw) {
    call_init(k, FR_OP_RMSNORM_BWD, a);
    fr_shape rs = xs;
    rs.ndim--;
    k->c.in[0] = tf(dy, xs);
    k->c.in[1] = tf(x, xs);
    k->c.in[2] = w ? tf(w, fr_shape1(C)) : (fr_tensor){0};
    k->c.in[3] = tf(rstd, rs);
    k->c.out[0] = tf(dx, xs);
    k->c.out[1] = tf(dw, fr_shape1(C));
}

static void rms_case(const char *tag, fr_shape xs, double lo, double hi, int with_w, float eps) {
    char nm[160];
    const int64_t nx = fr_shape_numel(&xs), C = xs.d[xs.ndim - 1], N = nx / C;
    float *x = frand(nx, lo, hi), *w = with_w ? frand(C, 0.5, 1.5) : NULL;
    float *dy = frand(nx, -1, 1), *y = fzeros(nx), *rstd = fzeros(N);
    rms_ref s = {N,           C,          eps,       dof(x, nx), w ? dof(w, C) : NULL,
                 dof(dy, nx), dzeros(nx), dzeros(N), dzeros(nx), dzeros(C)};
    fr_attr a = {.eps = eps};
    call k;
    rms_fwd_call(&k, &a, xs, C, x, w, y, rstd);
    snprintf(nm, sizeof nm, "rmsnorm fwd %s", tag);
    expect_ok(nm, fr_k_rmsnorm(&k.c));
    ref_rms_bwd(&s);
    expect_elem(nm, y, s.y, NULL, nx, TOL_EW);
    snprintf(nm, sizeof nm, "rmsnorm fwd %s rstd", tag);
    expect_elem(nm, rstd, s.rstd, NULL, N, TOL_EW);

    float *dx = fzeros(nx), *dw = fzeros(C);
    rms_bwd_call(&k, &a, xs, C, dy, x, w, rstd, dx, with_w ? dw : NULL);
    snprintf(nm, sizeof nm, "rmsnorm bwd %s", tag);
    expect_ok(nm, fr_k_rmsnorm_bwd(&k.c));
    snprintf(nm, sizeof nm, "rmsnorm bwd %s dx vs hand", tag);
    expect_close(nm, dx, s.dx, nx, TOL_SUM);
    if (with_w) {
        snprintf(nm, sizeof nm, "rmsnorm bwd %s dw vs hand", tag);
        expect_close(nm, dw, s.dw, C, TOL_SUM);
    }
    /* finite differences of the float64 forward */
    const int64_t stx = fd_step(nx), nsx = fd_count(nx, stx);
    double *gx = dzeros(nsx);
    fd_grad(obj_rms, &s, s.x, nx, stx, gx);
    snprintf(nm, sizeof nm, "rmsnorm bwd %s dx vs FD", tag);
    expect_close(nm, gather(dx, nx, stx), gx, nsx, TOL_SUM);
    if (with_w) {
        double *gw = dzeros(C);
        fd_grad(obj_rms, &s, s.w, C, 1, gw);
        snprintf(nm, sizeof nm, "rmsnorm bwd %s dw vs FD", tag);
        expect_close(nm, dw, gw, C, TOL_SUM);

        /* dw accumulated (a parameter's gradient), dx absent; then dx accumulated, dw absent */
        float *dw0 = frand(C, -1, 1), *dw1 = fcopy(dw0, C);
        rms_bwd_call(&k, &a, xs, C, dy, x, w, rstd, NULL, dw1);
        k.c.accumulate = 2;
        snprintf(nm, sizeof nm, "rmsnorm bwd %s dw accumulated, dx absent", tag);
        expect_ok(nm, fr_k_rmsnorm_bwd(&k.c));
        expect_close(nm, dw1, dsum(dw0, s.dw, C), C, TOL_SUM);
    }
    float *dx0 = frand(nx, -1, 1), *dx1 = fcopy(dx0, nx);
    rms_bwd_call(&k, &a, xs, C, dy, x, w, rstd, dx1, NULL);
    k.c.accumulate = 1;
    snprintf(nm, sizeof nm, "rmsnorm bwd %s dx accumulated, dw absent", tag);
    expect_ok(nm, fr_k_rmsnorm_bwd(&k.c));
    expect_close(nm, dx1, dsum(dx0, s.dx, nx), nx, TOL_SUM);
    /* absent rstd in the forward: y the same bits */
    float *y2 = fzeros(nx);
    rms_fwd_call(&k, &a, xs, C, x, w, y2, NULL);
    k.c.out[1] = (fr_tensor){0};
    snprintf(nm, sizeof nm, "rmsnorm fwd %s without rstd", tag);
    expect_ok(nm, fr_k_rmsnorm(&k.c));
    expect_same(nm, y2, y, nx);
    tfree_all();
}

/* Rows of 1 and of zeros: rstd = 1/sqrt(eps) exactly as HF's (x = 0 gives y = 0) */
static void rms_edges(void) {
    float x[6] = {0, 0, 0, 2, 2, 2}, w[3] = {1, 2, 3}, y[6], r[2];
    fr_attr a = {.eps = 1e-6f};
    call k;
    rms_fwd_call(&k, &a, fr_shape2(2, 3), 3, x, w, y, r);
    expect_ok("rmsnorm zero row", fr_k_rmsnorm(&k.c));
    const double r0 = 1.0 / sqrt((double)1e-6f), r1 = 1.0 / sqrt(4.0 + (double)1e-6f);
    CHECK(fabs(r[0] - r0) <= 1e-6 * r0 && fabs(r[1] - r1) <= 1e-6 * r1, "rstd %g %g, want %g %g",
          r[0], r[1], r0, r1);
    CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0, "a zero row's y is not 0");
    CHECK(fabs(y[5] - 3 * 2 * r1) <= 1e-6 * 6 * r1, "y %g, want %g", y[5], 3 * 2 * r1);
}

/* ======================================================================= */
/* SWIGLU                                                                  */

typedef struct sw_ref {
    int64_t n;
    double *g, *u, *dy;
    double *y, *dg, *du, *dg_mag;
} sw_ref;

static double silu(double g) { return g / (1.0 + exp(-g)); }

static void ref_sw_fwd(sw_ref *s) {
    for (int64_t i = 0; i < s->n; i++) s->y[i] = silu(s->g[i]) * s->u[i];
}
static void ref_sw_bwd(sw_ref *s) {
    ref_sw_fwd(s);
    for (int64_t i = 0; i < s->n; i++) {
        const double g = s->g[i], sg = 1.0 / (1.0 + exp(-g));
        s->dg[i] = s->dy[i] * s->u[i] * sg * (1.0 + g * (1.0 - sg));
        s->dg_mag[i] = fabs(s->dy[i] * s->u[i]) * sg * (1.0 + fabs(g) * (1.0 - sg));
        s->du[i] = s->dy[i] * silu(g);
    }
}
static double obj_sw(void *p) {
    sw_ref *s = p;
    ref_sw_fwd(s);
    double l = 0.0;
    for (int64_t i = 0; i < s->n; i++) l += s->dy[i] * s->y[i];
    return l;
}

static void sw_fwd_call(call *k, fr_shape s, float *g, float *u, float *y) {
    call_init(k, FR_OP_SWIGLU, NULL);
    k->c.in[0] = tf(g, s);
    k->c.in[1] = tf(u, s);
    k->c.out[0] = tf(y, s);
}
static void sw_bwd_call(call *k, fr_shape s, float *dy, float *g, float *u, float *dg, float *du) {
    call_init(k, FR_OP_SWIGLU_BWD, NULL);
    k->c.in[0] = tf(dy, s);
    k->c.in[1] = tf(g, s);
    k->c.in[2] = tf(u, s);
    k->c.out[0] = tf(dg, s);
    k->c.out[1] = tf(du, s);
}

static void sw_case(const char *tag, fr_shape sh, double scale, int specials) {
    char nm[160];
    const int64_t n = fr_shape_numel(&sh);
    float *g = frand(n, -scale, scale), *u = frand(n, -2, 2), *dy = frand(n, -1, 1);
    static const float sp[] = {0.0f,   -0.0f,  100.0f,   -100.0f, 20.0f,
                               -20.0f, 1e-30f, -1.2785f, 88.5f};
    for (int64_t i = 0; specials && i < (int64_t)(sizeof sp / sizeof sp[0]) && i < n; i++)
        g[i] = sp[i];
    float *y = fzeros(n), *dgt = fzeros(n), *dup = fzeros(n);
    sw_ref s = {n, dof(g, n), dof(u, n), dof(dy, n), dzeros(n), dzeros(n), dzeros(n), dzeros(n)};
    call k;
    sw_fwd_call(&k, sh, g, u, y);
    snprintf(nm, sizeof nm, "swiglu fwd %s", tag);
    expect_ok(nm, fr_k_swiglu(&k.c));
    ref_sw_bwd(&s);
    expect_elem(nm, y, s.y, NULL, n, TOL_EW);
    sw_bwd_call(&k, sh, dy, g, u, dgt, dup);
    snprintf(nm, sizeof nm, "swiglu bwd %s", tag);
    expect_ok(nm, fr_k_swiglu_bwd(&k.c));
    snprintf(nm, sizeof nm, "swiglu bwd %s dgate vs hand", tag);
    expect_elem(nm, dgt, s.dg, s.dg_mag, n, TOL_EW);
    snprintf(nm, sizeof nm, "swiglu bwd %s dup vs hand", tag);
    expect_elem(nm, dup, s.du, NULL, n, TOL_EW);
    /* finite differences (away from the specials, whose exponentials overflow) */
    const int64_t st = fd_step(n), ns = fd_count(n, st);
    double *fg = dzeros(ns), *fu = dzeros(ns);
    fd_grad(obj_sw, &s, s.g, n, st, fg);
    fd_grad(obj_sw, &s, s.u, n, st, fu);
    snprintf(nm, sizeof nm, "swiglu bwd %s dgate vs FD", tag);
    expect_close(nm, gather(dgt, n, st), fg, ns, TOL_SUM);
    snprintf(nm, sizeof nm, "swiglu bwd %s dup vs FD", tag);
    expect_close(nm, gather(dup, n, st), fu, ns, TOL_SUM);

    /* accumulate bits, one output absent at a time */
    float *a0 = frand(n, -1, 1), *a1 = fcopy(a0, n);
    sw_bwd_call(&k, sh, dy, g, u, a1, NULL);
    k.c.accumulate = 1;
    snprintf(nm, sizeof nm, "swiglu bwd %s dgate accumulated, dup absent", tag);
    expect_ok(nm, fr_k_swiglu_bwd(&k.c));
    expect_close(nm, a1, dsum(a0, s.dg, n), n, TOL_SUM);
    float *b0 = frand(n, -1, 1), *b1 = fcopy(b0, n);
    sw_bwd_call(&k, sh, dy, g, u, NULL, b1);
    k.c.accumulate = 2;
    snprintf(nm, sizeof nm, "swiglu bwd %s dup accumulated, dgate absent", tag);
    expect_ok(nm, fr_k_swiglu_bwd(&k.c));
    expect_close(nm, b1, dsum(b0, s.du, n), n, TOL_SUM);

    /* in place: y on gate, dgate on dy: the same bits */
    float *gi = fcopy(g, n), *dyi = fcopy(dy, n), *dui = fzeros(n);
    sw_fwd_call(&k, sh, gi, u, gi);
    snprintf(nm, sizeof nm, "swiglu fwd %s in place", tag);
    expect_ok(nm, fr_k_swiglu(&k.c));
    expect_same(nm, gi, y, n);
    sw_bwd_call(&k, sh, dyi, g, u, dyi, dui);
    snprintf(nm, sizeof nm, "swiglu bwd %s dgate in place", tag);
    expect_ok(nm, fr_k_swiglu_bwd(&k.c));
    expect_same(nm, dyi, dgt, n);
    expect_same(nm, dui, dup, n);
    tfree_all();
}

/* ======================================================================= */
/* 1 and 3 threads: the same bits (sizes past the kernels' parallel thresholds) */

static void test_threads(void) {
    const int saved = omp_get_max_threads();
    const int64_t rows[3] = {37, 301, 1}, cols[3] = {1000, 64, 20000};
    for (int t = 0; t < 3; t++) {
        const int64_t N = rows[t], C = cols[t], nx = N * C;
        float *x = frand(nx, -2, 2), *w = frand(C, 0.5, 1.5), *dy = frand(nx, -1, 1);
        float *y[2], *r[2], *dx[2], *dw[2];
        fr_attr a = {.eps = 1e-5f};
        for (int v = 0; v < 2; v++) {
            omp_set_num_threads(v ? 3 : 1);
            y[v] = fzeros(nx), r[v] = fzeros(N), dx[v] = fzeros(nx), dw[v] = fzeros(C);
            call k;
            rms_fwd_call(&k, &a, fr_shape2(N, C), C, x, w, y[v], r[v]);
            expect_ok("rmsnorm threads", fr_k_rmsnorm(&k.c));
            rms_bwd_call(&k, &a, fr_shape2(N, C), C, dy, x, w, r[v], dx[v], dw[v]);
            expect_ok("rmsnorm_bwd threads", fr_k_rmsnorm_bwd(&k.c));
        }
        char nm[96];
        snprintf(nm, sizeof nm, "rmsnorm (%lld, %lld) 1 vs 3 threads", (long long)N, (long long)C);
        expect_same(nm, y[0], y[1], nx);
        expect_same(nm, r[0], r[1], N);
        expect_same(nm, dx[0], dx[1], nx);
        expect_same(nm, dw[0], dw[1], C);
        tfree_all();
    }
    const int64_t n = 40001;
    float *g = frand(n, -9, 9), *u = frand(n, -2, 2), *dy = frand(n, -1, 1);
    float *y[2], *dg[2], *du[2];
    for (int v = 0; v < 2; v++) {
        omp_set_num_threads(v ? 3 : 1);
        y[v] = fzeros(n), dg[v] = fzeros(n), du[v] = fzeros(n);
        call k;
        sw_fwd_call(&k, fr_shape1(n), g, u, y[v]);
        expect_ok("swiglu threads", fr_k_swiglu(&k.c));
        sw_bwd_call(&k, fr_shape1(n), dy, g, u, dg[v], du[v]);
        expect_ok("swiglu_bwd threads", fr_k_swiglu_bwd(&k.c));
    }
    expect_same("swiglu 1 vs 3 threads y", y[0], y[1], n);
    expect_same("swiglu 1 vs 3 threads dgate", dg[0], dg[1], n);
    expect_same("swiglu 1 vs 3 threads dup", du[0], du[1], n);
    omp_set_num_threads(saved);
    tfree_all();
}

/* ======================================================================= */
/* errors: the shape rules (graph) and the kernels                         */

static void expect_err(const char *what, int st, int want, const char *needle) {
    CHECK(st == want, "%s: status %d, want %d", what, st, want);
    CHECK(strstr(fr_last_error(g_ctx), needle), "%s: message '%s' lacks '%s'", what,
          fr_last_error(g_ctx), needle);
}

/* fr_graph_node of op on in[] must fail with a message holding needle */
static void graph_err(fr_graph *g, const char *what, fr_op op, const int *in, const fr_attr *a,
                      const char *needle) {
    int out[FR_MAX_OUT];
    const int node = fr_graph_node(g, op, in, 2, a, -1, 0, out);
    CHECK(node < 0, "%s: accepted", what);
    CHECK(strstr(fr_last_error(g_ctx), needle), "%s: message '%s' lacks '%s'", what,
          fr_last_error(g_ctx), needle);
}

static void test_graph(void) {
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    int x = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 5, 7));
    int w = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape1(7));
    int w6 = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape1(6));
    int u = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 5, 7));
    int u6 = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 5, 6));
    fr_attr a = {.eps = 1e-6f};
    int out[FR_MAX_OUT], in[2] = {x, w};
    CHECK(fr_graph_node(&g, FR_OP_RMSNORM, in, 2, &a, -1, 0, out) >= 0, "rmsnorm: %s",
          fr_last_error(g_ctx));
    fr_shape ey = fr_shape3(2, 5, 7), er = fr_shape2(2, 5);
    CHECK(fr_shape_eq(&g.vals[out[0]].shape, &ey) && fr_shape_eq(&g.vals[out[1]].shape, &er),
          "rmsnorm's outputs are not (B,T,C) and (B,T)");
    CHECK(fr_op_get(FR_OP_RMSNORM)->flops(&g, &g.nodes[g.n_nodes - 1]) == 4.0 * 70,
          "rmsnorm's FLOPs");
    in[1] = w6;
    graph_err(&g, "rmsnorm weight (6) on C = 7", FR_OP_RMSNORM, in, &a,
              "rmsnorm: the weight (C) must match");
    in[1] = -1;
    graph_err(&g, "rmsnorm without a weight", FR_OP_RMSNORM, in, &a, "rmsnorm: the weight gives");
    in[0] = x, in[1] = u;
    CHECK(fr_graph_node(&g, FR_OP_SWIGLU, in, 2, NULL, -1, 0, out) >= 0, "swiglu: %s",
          fr_last_error(g_ctx));
    CHECK(fr_shape_eq(&g.vals[out[0]].shape, &ey), "swiglu's output is not gate's shape");
    in[1] = u6;
    graph_err(&g, "swiglu of (2,5,7) and (2,5,6)", FR_OP_SWIGLU, in, NULL,
              "swiglu: gate and up must have the same shape");
    fr_graph_release(&g);
}

static void test_kernel_errors(void) {
    float x[12] = {0}, w[4] = {0}, y[12], r[3], dx[12];
    uint16_t h[12] = {0};
    fr_attr a = {.eps = 1e-5f};
    call k;
    rms_fwd_call(&k, &a, fr_shape2(3, 4), 4, x, w, y, r);
    k.c.in[1].shape = fr_shape1(3);
    expect_err("rmsnorm kernel, weight of 3 on C = 4", fr_k_rmsnorm(&k.c), FR_ERR_SHAPE,
               "rmsnorm: x (3");
    rms_fwd_call(&k, &a, fr_shape2(3, 4), 4, x, w, y, r);
    k.c.out[1].shape = fr_shape1(2);
    expect_err("rmsnorm kernel, rstd of 2 rows", fr_k_rmsnorm(&k.c), FR_ERR_SHAPE, "rstd 2");
    rms_fwd_call(&k, &a, fr_shape2(3, 4), 4, x, w, y, r);
    k.c.in[0].dtype = FR_BF16;
    k.c.in[0].data = h;
    expect_err("rmsnorm kernel, bf16 x", fr_k_rmsnorm(&k.c), FR_ERR_ARG, "x is bf16, not f32");
    rms_bwd_call(&k, &a, fr_shape2(3, 4), 4, x, x, w, NULL, dx, NULL);
    expect_err("rmsnorm_bwd kernel, no rstd", fr_k_rmsnorm_bwd(&k.c), FR_ERR_ARG,
               "rmsnorm_bwd: the saved rstd is missing");
    rms_bwd_call(&k, &a, fr_shape2(3, 4), 4, x, x, w, r, dx, NULL);
    k.c.in[0].shape = fr_shape2(3, 3);
    expect_err("rmsnorm_bwd kernel, dy of 9", fr_k_rmsnorm_bwd(&k.c), FR_ERR_SHAPE,
               "dy must be f32 of x's 12 values");
    sw_fwd_call(&k, fr_shape2(3, 4), x, x, y);
    k.c.in[1].shape = fr_shape2(3, 3);
    expect_err("swiglu kernel, up of 9", fr_k_swiglu(&k.c), FR_ERR_SHAPE,
               "swiglu: up has 9 elements, gate 12");
    sw_fwd_call(&k, fr_shape2(3, 4), x, x, y);
    k.c.in[0].dtype = FR_F16;
    k.c.in[0].data = h;
    expect_err("swiglu kernel, f16 gate", fr_k_swiglu(&k.c), FR_ERR_ARG, "gate is f16, not f32");
    sw_bwd_call(&k, fr_shape2(3, 4), x, x, x, dx, NULL);
    k.c.in[0].shape = fr_shape1(5);
    expect_err("swiglu_bwd kernel, dy of 5", fr_k_swiglu_bwd(&k.c), FR_ERR_SHAPE,
               "swiglu_bwd: dy has 5 elements, gate 12");
}

/* ======================================================================= */
/* against PyTorch (tests/llama_ops_ref.h)                                 */

#define NREF(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

static void torch_rms(const char *tag, int64_t C, const float *x, const float *w, const float *y,
                      const float *dy, const float *dx, const float *dw) {
    char nm[96];
    const int64_t N = REF_B * REF_T, nx = N * C;
    const fr_shape xs = fr_shape3(REF_B, REF_T, C);
    float *got = fzeros(nx), *r = fzeros(N), *gdx = fzeros(nx), *gdw = fzeros(C);
    fr_attr a = {.eps = REF_EPS};
    call k;
    rms_fwd_call(&k, &a, xs, C, (float *)x, (float *)w, got, r);
    snprintf(nm, sizeof nm, "rmsnorm %s vs PyTorch", tag);
    expect_ok(nm, fr_k_rmsnorm(&k.c));
    expect_elem(nm, got, dof(y, nx), NULL, nx, TOL_EW);
    rms_bwd_call(&k, &a, xs, C, (float *)dy, (float *)x, (float *)w, r, gdx, gdw);
    snprintf(nm, sizeof nm, "rmsnorm_bwd %s vs PyTorch", tag);
    expect_ok(nm, fr_k_rmsnorm_bwd(&k.c));
    expect_close(nm, gdx, dof(dx, nx), nx, 1e-5);
    expect_close(nm, gdw, dof(dw, C), C, 1e-5);
}

static void test_torch(void) {
    CHECK(NREF(ref_rms_x) == REF_B * REF_T * REF_C && NREF(ref_rms64_dw) == REF_C64 &&
              NREF(ref_sw_dup) == REF_B * REF_T * REF_I,
          "llama_ops_ref.h's sizes");
    torch_rms("C 7", REF_C, ref_rms_x, ref_rms_w, ref_rms_y, ref_rms_dy, ref_rms_dx, ref_rms_dw);
    torch_rms("C 64", REF_C64, ref_rms64_x, ref_rms64_w, ref_rms64_y, ref_rms64_dy, ref_rms64_dx,
              ref_rms64_dw);
    const int64_t n = NREF(ref_sw_y);
    const fr_shape s = fr_shape3(REF_B, REF_T, REF_I);
    float *y = fzeros(n), *dg = fzeros(n), *du = fzeros(n);
    call k;
    sw_fwd_call(&k, s, (float *)ref_sw_gate, (float *)ref_sw_up, y);
    expect_ok("swiglu vs PyTorch", fr_k_swiglu(&k.c));
    expect_elem("swiglu vs PyTorch", y, dof(ref_sw_y, n), NULL, n, TOL_EW);
    sw_bwd_call(&k, s, (float *)ref_sw_dy, (float *)ref_sw_gate, (float *)ref_sw_up, dg, du);
    expect_ok("swiglu_bwd vs PyTorch", fr_k_swiglu_bwd(&k.c));
    expect_close("swiglu_bwd dgate vs PyTorch", dg, dof(ref_sw_dgate, n), n, 1e-5);
    expect_close("swiglu_bwd dup vs PyTorch", du, dof(ref_sw_dup, n), n, 1e-5);
    tfree_all();
}

/* ======================================================================= */
/* a Llama MLP through autodiff, plan and exec, with and without fr_remat_cheap */

enum { MB = 2, MT = 3, MC = 7, MI = 5, MP = 5 }; /* params: x, w, W_gate, W_up, W_down */

/* x -> RMSNORM(w) -> h; SWIGLU(h W_gate^T, h W_up^T) W_down^T -> MSE against a
 * target. cheap: -1 none, else fr_remat_cheap's half. Gradients into grads[]
 * (talloc'd); *clones, *extra: the clones made and their FLOPs. */
static void mlp_grads(int cheap, float *const *data, const float *target, float **grads,
                      int *clones, double *extra) {
    static const fr_shape shp[MP] = {
        {3, {MB, MT, MC}}, {1, {MC}}, {2, {MI, MC}}, {2, {MI, MC}}, {2, {MC, MI}}};
    fr_ctx *ctx = fr_ctx_new();
    fr_graph g;
    fr_graph_init(&g, ctx);
    int pv[MP], gv[MP], gof[64];
    for (int i = 0; i < 64; i++) gof[i] = -1;
    for (int i = 0; i < MP; i++) {
        pv[i] = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, shp[i]);
        g.vals[pv[i]].batched = i == 0;
        gv[i] = fr_graph_value(&g, FR_VAL_GRAD, FR_F32, shp[i]);
        gof[pv[i]] = gv[i];
    }
    fr_attr ra = {.eps = 1e-5f}, none = {0}, va = {.shape = fr_shape2(MB, MT * MC)},
            la = {.scale = 1.0f};
    int o[FR_MAX_OUT], h, gate, up, m, y, flat, loss;
    int in[3] = {pv[0], pv[1], -1};
    fr_graph_node(&g, FR_OP_RMSNORM, in, 2, &ra, -1, 0, o), h = o[0];
    in[0] = h, in[1] = pv[2];
    fr_graph_node(&g, FR_OP_LINEAR, in, 3, &none, -1, 0, o), gate = o[0];
    in[1] = pv[3];
    fr_graph_node(&g, FR_OP_LINEAR, in, 3, &none, -1, 0, o), up = o[0];
    in[0] = gate, in[1] = up;
    fr_graph_node(&g, FR_OP_SWIGLU, in, 2, &none, -1, 0, o), m = o[0];
    in[0] = m, in[1] = pv[4];
    fr_graph_node(&g, FR_OP_LINEAR, in, 3, &none, -1, 0, o), y = o[0];
    fr_graph_node(&g, FR_OP_VIEW, &y, 1, &va, -1, 0, &flat);
    const int tv = fr_graph_value(&g, FR_VAL_LABEL, FR_F32, va.shape);
    in[0] = flat, in[1] = tv;
    fr_graph_node(&g, FR_OP_MSE, in, 2, &la, -1, 0, &loss);
    g.loss = loss;
    CHECK(g.status == FR_OK && fr_autodiff(&g, gof) == FR_OK, "mlp graph: %s", fr_last_error(ctx));
    int n = (int)g.n_nodes, *order = fr_alloc(ctx, (size_t)n * sizeof *order, FR_MEM_OTHER);
    int *origin = fr_alloc(ctx, (g.n_vals + 1) * sizeof *origin, FR_MEM_OTHER);
    CHECK(order && origin, "mlp: out of memory");
    for (int i = 0; i < n; i++) order[i] = i;
    for (size_t v = 0; v <= g.n_vals; v++) origin[v] = (int)v;
    *extra = 0;
    if (cheap >= 0)
        CHECK(fr_remat_cheap(&g, &order, &n, &origin, extra, cheap) == FR_OK, "remat: %s",
              fr_last_error(ctx));
    *clones = 0;
    for (size_t i = 0; i < g.n_nodes; i++) *clones += g.nodes[i].attr.recompute == FR_REMAT_CHEAP;
    uint8_t keep[128] = {0};
    keep[loss] = 1;
    fr_plan plan;
    fr_exec ex;
    CHECK(fr_plan_build(&g, keep, order, n, &plan) == FR_OK, "mlp plan: %s", fr_last_error(ctx));
    CHECK(fr_exec_init(&ex, &g, &plan) == FR_OK, "mlp exec: %s", fr_last_error(ctx));
    for (int i = 0; i < MP; i++) {
        grads[i] = fzeros(fr_shape_numel(&shp[i]));
        ex.ptr[pv[i]] = data[i];
        ex.ptr[gv[i]] = grads[i];
        ex.written[gv[i]] = 0;
    }
    ex.ptr[tv] = (void *)target;
    CHECK(fr_exec_run(&ex, 0, n, MB, 7, 0) == FR_OK, "mlp run: %s", fr_last_error(ctx));
    fr_exec_finish(&ex);
    fr_exec_release(&ex);
    fr_plan_release(&plan);
    fr_free(ctx, order);
    fr_free(ctx, origin);
    fr_graph_release(&g);
    fr_ctx_free(ctx);
}

static void test_mlp_remat(void) {
    static const int64_t sz[MP] = {MB * MT * MC, MC, MI * MC, MI * MC, MC * MI};
    float *data[MP], *g0[MP], *g1[MP], *g2[MP];
    for (int i = 0; i < MP; i++) data[i] = frand(sz[i], i == 1 ? 0.5 : -1, i == 1 ? 1.5 : 1);
    float *target = frand(MB * MT * MC, -1, 1);
    int c0, c1, c2;
    double e0, e1, e2;
    mlp_grads(-1, data, target, g0, &c0, &e0);
    mlp_grads(0, data, target, g1, &c1, &e1);
    mlp_grads(1, data, target, g2, &c2, &e2);
    /* clones of RMSNORM (its h read by the gate and up projections' dW) and
     * SWIGLU (m read by the down projection's dW); none under 16-bit storage */
    const double want = 4.0 * MB * MT * MC + 22.0 * MB * MT * MI;
    CHECK(c0 == 0 && c1 == 2 && c2 == 0, "cheap clones %d %d %d, want 0 2 0", c0, c1, c2);
    CHECK(e1 == want && e2 == 0, "clones' FLOPs %g %g, want %g 0", e1, e2, want);
    for (int i = 0; i < MP; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "mlp gradient %d recomputed vs kept", i);
        expect_same(nm, g1[i], g0[i], sz[i]);
        expect_same(nm, g2[i], g0[i], sz[i]);
        double mx = 0;
        for (int64_t k = 0; k < sz[i]; k++) mx = fmax(mx, fabs(g0[i][k]));
        CHECK(mx > 0, "mlp gradient %d is all zero", i);
    }
    tfree_all();
}

/* ======================================================================= */
/* the OpenCL kernels against the CPU's                                    */

#ifdef FR_HAVE_OPENCL
#include "backend/opencl/backend.h"

static fr_ctx *g_dev;

#define OFF 64 /* every device tensor starts this many bytes into its buffer */

/* a host tensor's values into a new device buffer (data NULL: absent) */
static fr_tensor up(const fr_tensor *t, cl_mem *keep) {
    fr_tensor d = {.dtype = t->dtype, .shape = t->shape};
    if (!t->data) return d;
    const size_t b = (size_t)fr_shape_numel(&t->shape) * sizeof(float);
    fr_cl *cl = fr_cl_of(g_dev);
    CHECK(fr_cl_alloc(g_dev, cl, b + OFF, keep) == FR_OK, "%s", fr_last_error(g_dev));
    CHECK(fr_cl_write(g_dev, cl, *keep, OFF, t->data, b) == FR_OK, "%s", fr_last_error(g_dev));
    d.buf = *keep;
    d.off = OFF;
    return d;
}

/* Run the host call k (outputs holding their starting values) on the device
 * twice; its outputs' values read back into got[run][j] (talloc'd). */
static void on_device(const call *k, float *got[2][FR_MAX_OUT]) {
    const fr_op_info *info = fr_op_get(k->node.op);
    for (int r = 0; r < 2; r++) {
        cl_mem keep[FR_MAX_IN + FR_MAX_OUT] = {0};
        fr_kernel_call dc = k->c;
        dc.ctx = g_dev;
        for (int i = 0; i < info->n_in; i++) dc.in[i] = up(&k->c.in[i], &keep[i]);
        for (int j = 0; j < info->n_out; j++) dc.out[j] = up(&k->c.out[j], &keep[FR_MAX_IN + j]);
        const int st = fr_cl_backend.kernels[k->node.op](&dc);
        CHECK(st == FR_OK, "%s on the device: %s", info->name, fr_last_error(g_dev));
        for (int j = 0; j < info->n_out; j++) {
            got[r][j] = NULL;
            if (!k->c.out[j].data) continue;
            const int64_t n = fr_shape_numel(&k->c.out[j].shape);
            got[r][j] = fzeros(n);
            CHECK(fr_cl_read(g_dev, fr_cl_of(g_dev), keep[FR_MAX_IN + j], OFF, got[r][j],
                             (size_t)n * sizeof(float)) == FR_OK,
                  "%s", fr_last_error(g_dev));
        }
        for (int i = 0; i < FR_MAX_IN + FR_MAX_OUT; i++) fr_cl_release(keep[i]);
    }
}

/* The device's outputs against the CPU's (`want`, run on the same starting
 * values): within tol (|cpu| + max|cpu|) (tol 0: the same bits; tol < 0:
 * within -tol |cpu| per element), two runs alike. */
static void dev_compare(const char *what, const call *k, float *const *want, double tol) {
    float *got[2][FR_MAX_OUT];
    on_device(k, got);
    const fr_op_info *info = fr_op_get(k->node.op);
    for (int j = 0; j < info->n_out; j++) {
        if (!want[j]) continue;
        const int64_t n = fr_shape_numel(&k->c.out[j].shape);
        char nm[160];
        snprintf(nm, sizeof nm, "%s out[%d] two device runs", what, j);
        expect_same(nm, got[0][j], got[1][j], n);
        snprintf(nm, sizeof nm, "%s out[%d] device vs cpu", what, j);
        if (tol == 0) {
            expect_same(nm, got[0][j], want[j], n);
        } else if (tol > 0) {
            expect_close(nm, got[0][j], dof(want[j], n), n, tol);
        } else {
            expect_elem(nm, got[0][j], dof(want[j], n), NULL, n, -tol);
        }
    }
}

/* with_w 0: no weight (w = 1), and no dw */
static void dev_rms(int64_t N, int64_t C, int acc, int with_w) {
    const int64_t nx = N * C;
    char what[96];
    snprintf(what, sizeof what, "rmsnorm (%lld, %lld) acc %d%s", (long long)N, (long long)C, acc,
             with_w ? "" : " no weight");
    float *x = frand(nx, -2, 2), *w = with_w ? frand(C, 0.5, 1.5) : NULL, *dy = frand(nx, -1, 1);
    float *y = fzeros(nx), *r = fzeros(N);
    fr_attr a = {.eps = 1e-5f};
    call k;
    rms_fwd_call(&k, &a, fr_shape2(N, C), C, x, w, y, r);
    expect_ok(what, fr_k_rmsnorm(&k.c));
    float *want[FR_MAX_OUT] = {y, r};
    float *y0 = fzeros(nx), *r0 = fzeros(N);
    rms_fwd_call(&k, &a, fr_shape2(N, C), C, x, w, y0, r0);
    dev_compare(what, &k, want, 1e-5);
    /* backward from starting values (kept for the device's run) */
    float *dx0 = frand(nx, -1, 1), *dw0 = frand(C, -1, 1);
    float *dx = fcopy(dx0, nx), *dw = with_w ? fcopy(dw0, C) : NULL;
    if (!with_w) dw0 = NULL;
    rms_bwd_call(&k, &a, fr_shape2(N, C), C, dy, x, w, r, dx, dw);
    k.c.accumulate = acc ? 3u : 0u;
    expect_ok(what, fr_k_rmsnorm_bwd(&k.c));
    float *wantb[FR_MAX_OUT] = {dx, dw};
    rms_bwd_call(&k, &a, fr_shape2(N, C), C, dy, x, w, r, dx0, dw0);
    k.c.accumulate = acc ? 3u : 0u;
    dev_compare(what, &k, wantb, 1e-5);
    tfree_all();
}

static void dev_swiglu(int64_t n, int acc) {
    char what[96];
    snprintf(what, sizeof what, "swiglu n %lld acc %d", (long long)n, acc);
    float *g = frand(n, -9, 9), *u = frand(n, -2, 2), *dy = frand(n, -1, 1), *y = fzeros(n);
    call k;
    sw_fwd_call(&k, fr_shape1(n), g, u, y);
    expect_ok(what, fr_k_swiglu(&k.c));
    float *want[FR_MAX_OUT] = {y};
    float *y0 = fzeros(n);
    sw_fwd_call(&k, fr_shape1(n), g, u, y0);
    /* the same float operations in the same order (FP_CONTRACT OFF), but
     * OpenCL lets a division be 2.5 ulp off: within 4 ulps per element */
    dev_compare(what, &k, want, -4.8e-7);
    float *dg0 = frand(n, -1, 1), *du0 = frand(n, -1, 1), *dg = fcopy(dg0, n), *du = fcopy(du0, n);
    sw_bwd_call(&k, fr_shape1(n), dy, g, u, dg, du);
    k.c.accumulate = acc ? 3u : 0u;
    expect_ok(what, fr_k_swiglu_bwd(&k.c));
    float *wantb[FR_MAX_OUT] = {dg, du};
    sw_bwd_call(&k, fr_shape1(n), dy, g, u, dg0, du0);
    k.c.accumulate = acc ? 3u : 0u;
    dev_compare(what, &k, wantb, 1e-6);
    tfree_all();
}

static void test_device(void) {
    int n = 0;
    g_dev = fr_ctx_new();
    if (!g_dev || fr_cl_count(g_dev, &n) != FR_OK || n < 1) {
        puts("no OpenCL device: the device part skipped");
        fr_ctx_free(g_dev);
        return;
    }
    CHECK(fr_cl_use(g_dev, 0) == FR_OK, "opening device 0: %s", fr_last_error(g_dev));
    dev_rms(5, 7, 0, 1);
    dev_rms(37, 1000, 1, 1); /* rows past a work-group's 64 lanes; dw's columns in 16 groups */
    dev_rms(3, 64, 1, 1);
    dev_rms(4, 130, 0, 0);
    dev_swiglu(13, 0);
    dev_swiglu(40001, 1);
    fr_cl_unuse(g_dev);
    fr_ctx_free(g_dev);
}
#else
static void test_device(void) { puts("built without OpenCL: the device part skipped"); }
#endif

int main(void) {
    g_ctx = fr_ctx_new();
    if (!g_ctx) return 2;
    rms_case("(N,C) C 5", fr_shape2(3, 5), -2, 2, 1, 1e-5f);
    rms_case("(B,T,C) C 7", fr_shape3(2, 3, 7), -2, 2, 1, 1e-6f);
    rms_case("(B,T,C) C 64", fr_shape3(3, 7, 64), -3, 1, 1, 1e-5f);
    rms_case("(N,C) C 7 no weight", fr_shape2(5, 7), -1, 1, 0, 1e-5f);
    rms_case("(N,C) small values, eps 1% of mean x^2", fr_shape2(4, 16), -0.01, 0.01, 1, 1e-6f);
    rms_case("(N,C) large", fr_shape2(37, 1000), -2, 2, 1, 1e-5f); /* past the threads' threshold */
    rms_edges();
    sw_case("(N,I) 5", fr_shape2(3, 5), 4, 0);
    sw_case("(B,T,I) 7 with specials", fr_shape3(2, 3, 7), 6, 1);
    sw_case("(B,T,I) 64", fr_shape3(3, 5, 64), 8, 1);
    sw_case("large", fr_shape1(40001), 9, 1); /* past the threads' threshold */
    test_threads();
    test_graph();
    test_kernel_errors();
    test_mlp_remat();
    test_torch();
    test_device();
    fr_ctx_free(g_ctx);
    return check_done();
}
