/* test_attention.c — checks the tiled causal attention of
 * src/backend/cpu/attention.c against a naive float64 reference written here
 * (the full T x T scores in double, the backward derived by hand through the
 * softmax's Jacobian), and that reference's gradients against its own
 * central finite differences. Every case runs twice: on packed
 * (B,NH,T,HS) tensors and in the fused layout a GPT holds (q, k, v column
 * blocks of qkv (B,T,3C) read through row strides, out (B,T,C)). Also: the
 * same bits at 1 and 3 threads in both layouts, a workspace that does not
 * grow with T, and a refused short workspace; 16-bit operands (qkv and out
 * in f16 or bf16, mixed precision's): the bits of the f32 call on the
 * widened values, out rounded from them, at 1 and 3 threads.
 * Grouped-query attention (NKV key/value heads, query head h reading kv head
 * h / (NH / NKV)): against the same reference run on k and v with each kv
 * head repeated for its group, dk and dv the sums of the repeated heads'
 * gradients, in both layouts, the same bits at 1 and 3 threads; ATTENTION_KV
 * (generation's op, caches of NKV heads) in two chunks against the
 * reference's full attention, and its caches against the keys and values.
 * Prints "N passed, M failed".
 *
 * Tolerance: max|got - ref| / max(max|ref|, 1) per tensor. The kernel sums in f32
 * (u = 6e-8): a score is a dot of HS <= 64 terms, an output or a gradient a
 * sum of up to T = 130 terms plus the online softmax's rescalings, so
 * sqrt(130) u ~ 1e-6 relative to the largest value; TOL = 1e-5 leaves an
 * order of margin (measured on x86-64 with OpenBLAS: see the "worst" line,
 * or FR_TEST_VERBOSE=1 for every case). The finite differences are central,
 * in float64, h = 1e-5: truncation ~h^2 and rounding ~1e-16/h are below
 * 1e-9, so the reference must match them to FD_TOL = 1e-7. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/attn_tiles16.h"
#include "backend/cpu/exp_poly.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "frugal.h"

#define TOL 1e-5
#define FD_H 1e-5
#define FD_TOL 1e-7

static int g_verbose;
static double g_worst[6]; /* out, lse, dq, dk, dv, the reference against FD */
static const char *g_names[6] = {"out", "lse", "dq", "dk", "dv", "ref-vs-fd"};

static unsigned long long g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* ---- the float64 reference, one (batch, head) at a time ----
 * S[t,u] = s q_t . k_u (u <= t), P = softmax rows, out = P v, lse = log sum e^S;
 * dv[u] = sum_t P[t,u] dout[t];  dP[t,u] = dout[t] . v[u];
 * dS[t,u] = P[t,u] (dP[t,u] - sum_w P[t,w] dP[t,w])  (the softmax's Jacobian);
 * dq[t] = s sum_u dS[t,u] k[u];  dk[u] = s sum_t dS[t,u] q[t]. */
static void ref_head(const double *q, const double *k, const double *v, const double *dout,
                     double *out, double *lse, double *dq, double *dk, double *dv, int T, int HS) {
    double s = 1.0 / sqrt((double)HS);
    double *P = malloc((size_t)T * T * sizeof(double)), *dP = malloc((size_t)T * sizeof(double));
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY;
        for (int u = 0; u <= t; u++) {
            double a = 0;
            for (int d = 0; d < HS; d++) a += q[t * HS + d] * k[u * HS + d];
            P[t * T + u] = a * s;
            if (P[t * T + u] > mx) mx = P[t * T + u];
        }
        double l = 0;
        for (int u = 0; u <= t; u++) l += exp(P[t * T + u] - mx);
        lse[t] = mx + log(l);
        for (int u = 0; u <= t; u++) P[t * T + u] = exp(P[t * T + u] - mx) / l;
        for (int d = 0; d < HS; d++) {
            double a = 0;
            for (int u = 0; u <= t; u++) a += P[t * T + u] * v[u * HS + d];
            out[t * HS + d] = a;
        }
    }
    if (!dq) goto done;
    memset(dq, 0, (size_t)T * HS * sizeof(double));
    memset(dk, 0, (size_t)T * HS * sizeof(double));
    memset(dv, 0, (size_t)T * HS * sizeof(double));
    for (int t = 0; t < T; t++) {
        double D = 0;
        for (int u = 0; u <= t; u++) {
            double a = 0;
            for (int d = 0; d < HS; d++) a += dout[t * HS + d] * v[u * HS + d];
            dP[u] = a;
            D += P[t * T + u] * a;
        }
        for (int u = 0; u <= t; u++) {
            double p = P[t * T + u], ds = p * (dP[u] - D) * s;
            for (int d = 0; d < HS; d++) {
                dv[u * HS + d] += p * dout[t * HS + d];
                dq[t * HS + d] += ds * k[u * HS + d];
                dk[u * HS + d] += ds * q[t * HS + d];
            }
        }
    }
done:
    free(P);
    free(dP);
}

/* The reference over (B, NH): the (batch, head) blocks are contiguous. */
static void ref_all(const double *q, const double *k, const double *v, const double *dout,
                    double *out, double *lse, double *dq, double *dk, double *dv, int BH, int T,
                    int HS) {
    size_t n = (size_t)T * HS;
    for (int i = 0; i < BH; i++)
        ref_head(q + i * n, k + i * n, v + i * n, dout ? dout + i * n : NULL, out + i * n,
                 lse + (size_t)i * T, dq ? dq + i * n : NULL, dk ? dk + i * n : NULL,
                 dv ? dv + i * n : NULL, T, HS);
}

/* max|got - ref| / max|ref|, recorded in g_worst[slot]. max|ref| is floored
 * at 1: the inputs are of order 1, so are the terms every value sums, and a
 * reference that is zero up to rounding (dq and dk at T = 1, where the
 * softmax is constant) is checked in absolute terms. */
static double rel_err(const float *got, const double *ref, size_t n, int slot) {
    double e = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d; /* a NaN wins */
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    double r = e / m;
    if (!(r <= g_worst[slot])) g_worst[slot] = r;
    return r;
}

/* Packed (B,NH,T,HS) x <-> block `which` (width C = NH HS) of the fused
 * (B,T,W) matrix m (W = 3C for qkv, C for out). */
static void pack_fused(float *m, float *x, int which, int W, int B, int NH, int T, int HS,
                       int to_fused) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < HS; j++) {
                    size_t pi = (((size_t)b * NH + h) * T + t) * HS + j;
                    size_t fi = ((size_t)b * T + t) * W + (size_t)which * NH * HS + h * HS + j;
                    if (to_fused) m[fi] = x[pi];
                    else x[pi] = m[fi];
                }
}

/* The same case in the fused layout a GPT uses (q, k, v column blocks of
 * qkv (B,T,3C), out (B,T,C)), read in place through strides, against the
 * same float64 reference (d: reference out, lse, dq, dk, dv at 4..8; f: the
 * inputs q, k, v, dout at 0..3). D must be rowsum(dout o out) per head. */
static void check_fused(int B, int NH, int T, int HS, float **f, double **d) {
    const int C = NH * HS;
    size_t n = (size_t)B * NH * T * HS, nl = (size_t)B * NH * T;
    float *qkv = malloc(3 * n * sizeof(float)), *dqkv = malloc(3 * n * sizeof(float));
    float *dout = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    float *lse = malloc(nl * sizeof(float)), *D = malloc(nl * sizeof(float));
    float *back = malloc(n * sizeof(float));
    for (int w = 0; w < 3; w++) pack_fused(qkv, f[w], w, 3 * C, B, NH, T, HS, 1);
    pack_fused(dout, f[3], 0, C, B, NH, T, HS, 1);
    for (size_t i = 0; i < 3 * n; i++) dqkv[i] = NAN; /* every value must be written */
    size_t wsn = fr_attention_ws_floats(T, HS, omp_get_max_threads());
    float *ws = malloc(wsn * sizeof(float));
    fr_attn_layout L = fr_attn_fused(B, NH, T, HS);
    int st = fr_attention_fwd(&L, qkv, qkv + C, qkv + 2 * C, out, lse, ws, wsn);
    st |= fr_attention_bwd(&L, qkv, qkv + C, qkv + 2 * C, out, dout, lse, D, dqkv, dqkv + C,
                           dqkv + 2 * C, ws, wsn);
    CHECK(st == 0, "fused: returned %d", st);
    pack_fused(out, back, 0, C, B, NH, T, HS, 0);
    double e[6];
    e[0] = rel_err(back, d[4], n, 0);
    e[1] = rel_err(lse, d[5], nl, 1);
    for (int w = 0; w < 3; w++) {
        pack_fused(dqkv, back, w, 3 * C, B, NH, T, HS, 0);
        e[2 + w] = rel_err(back, d[6 + w], n, 2 + w);
    }
    /* D against float64 sums of dout and the reference out, relative to HS */
    double dm = 0;
    for (size_t r = 0; r < nl; r++) {
        double a = 0;
        for (int j = 0; j < HS; j++) a += (double)f[3][r * HS + j] * d[4][r * HS + j];
        if (!(fabs(a - D[r]) <= dm)) dm = fabs(a - D[r]);
    }
    e[5] = dm / HS;
    for (int i = 0; i < 6; i++)
        CHECK(e[i] <= TOL, "fused B=%d NH=%d T=%d HS=%d: %s off by %.3g (tol %g)", B, NH, T, HS,
              i < 5 ? g_names[i] : "D", e[i], TOL);
    free(qkv), free(dqkv), free(dout), free(out), free(lse), free(D), free(back), free(ws);
}

/* One case: random q, k, v, dout; the kernel against the reference (packed
 * layout, then the fused one). */
static void check_case(int B, int NH, int T, int HS) {
    int BH = B * NH;
    size_t n = (size_t)BH * T * HS, nl = (size_t)BH * T;
    double *d[10];
    for (int i = 0; i < 10; i++) d[i] = malloc((n ? n : 1) * sizeof(double));
    double *qd = d[0], *kd = d[1], *vd = d[2], *dod = d[3], *od = d[4], *ld = d[5], *dqd = d[6],
           *dkd = d[7], *dvd = d[8];
    float *f[10];
    for (int i = 0; i < 10; i++) f[i] = malloc((n ? n : 1) * sizeof(float));
    float *q = f[0], *k = f[1], *v = f[2], *dout = f[3], *out = f[4], *lse = f[5], *dq = f[6],
          *dk = f[7], *dv = f[8];
    /* q spread wider than k so that rows have peaked softmaxes and a running
     * max that moves from tile to tile */
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)(3.0 * urand()), k[i] = (float)urand(), v[i] = (float)urand();
        dout[i] = (float)urand();
        qd[i] = q[i], kd[i] = k[i], vd[i] = v[i], dod[i] = dout[i];
    }
    size_t wsn = fr_attention_ws_floats(T, HS, omp_get_max_threads());
    float *ws = malloc(wsn * sizeof(float)), *D = malloc((nl ? nl : 1) * sizeof(float));
    fr_attn_layout L = fr_attn_packed(B, NH, T, HS);
    int st = fr_attention_fwd(&L, q, k, v, out, lse, ws, wsn);
    CHECK(st == 0, "fwd returned %d", st);
    st = fr_attention_bwd(&L, q, k, v, out, dout, lse, D, dq, dk, dv, ws, wsn);
    CHECK(st == 0, "bwd returned %d", st);
    ref_all(qd, kd, vd, dod, od, ld, dqd, dkd, dvd, BH, T, HS);
    double e[5] = {rel_err(out, od, n, 0), rel_err(lse, ld, nl, 1), rel_err(dq, dqd, n, 2),
                   rel_err(dk, dkd, n, 3), rel_err(dv, dvd, n, 4)};
    for (int i = 0; i < 5; i++)
        CHECK(e[i] <= TOL, "B=%d NH=%d T=%d HS=%d: %s off by %.3g (tol %g)", B, NH, T, HS,
              g_names[i], e[i], TOL);
    if (g_verbose)
        printf("B=%d NH=%d T=%3d HS=%2d  out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", B, NH, T, HS,
               e[0], e[1], e[2], e[3], e[4]);
    check_fused(B, NH, T, HS, f, d);
    for (int i = 0; i < 10; i++) free(d[i]), free(f[i]);
    free(ws), free(D);
}

/* The reference's gradients against central differences of
 * L = sum(out o W) (so dout = W), for every element of q, k and v. */
static void check_reference_fd(int B, int NH, int T, int HS) {
    int BH = B * NH;
    size_t n = (size_t)BH * T * HS;
    double *x[3], *g[3], *W = malloc(n * sizeof(double)), *o = malloc(n * sizeof(double)),
                         *lse = malloc((size_t)BH * T * sizeof(double));
    for (int i = 0; i < 3; i++) {
        x[i] = malloc(n * sizeof(double)), g[i] = malloc(n * sizeof(double));
        for (size_t j = 0; j < n; j++) x[i][j] = (i == 0 ? 3.0 : 1.0) * urand();
    }
    for (size_t j = 0; j < n; j++) W[j] = urand();
    ref_all(x[0], x[1], x[2], W, o, lse, g[0], g[1], g[2], BH, T, HS);
    double worst = 0, gmax = 1e-30;
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < n; j++) {
            double L[2], keep = x[i][j];
            for (int sgn = 0; sgn < 2; sgn++) {
                x[i][j] = keep + (sgn ? -FD_H : FD_H);
                ref_all(x[0], x[1], x[2], NULL, o, lse, NULL, NULL, NULL, BH, T, HS);
                L[sgn] = 0;
                for (size_t a = 0; a < n; a++) L[sgn] += o[a] * W[a];
            }
            x[i][j] = keep;
            double fd = (L[0] - L[1]) / (2 * FD_H), err = fabs(fd - g[i][j]);
            if (err > worst) worst = err;
            if (fabs(g[i][j]) > gmax) gmax = fabs(g[i][j]);
        }
    double r = worst / gmax;
    if (r > g_worst[5]) g_worst[5] = r;
    CHECK(r <= FD_TOL, "reference vs finite differences B=%d NH=%d T=%d HS=%d: %.3g", B, NH, T, HS,
          r);
    for (int i = 0; i < 3; i++) free(x[i]), free(g[i]);
    free(W), free(o), free(lse);
}

/* The same bits at 1 and 3 threads, in either layout (fused: in[0] read as
 * qkv (B,T,3C), in[3] as dout (B,T,C)). With one head (B = NH = 1) the
 * backward takes its one pass per head at 1 thread and its two finer passes
 * at 3, so this also checks that both ways add in the same order. */
static void check_threads(int B, int NH, int T, int HS, int fused) {
    size_t n = (size_t)B * NH * T * HS, nl = (size_t)B * NH * T;
    float *in[4], *res[2][6];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(3 * n * sizeof(float));
        for (size_t j = 0; j < 3 * n; j++) in[i][j] = (float)((i == 0 ? 3.0 : 1.0) * urand());
    }
    const size_t C = (size_t)NH * HS;
    fr_attn_layout L = fused ? fr_attn_fused(B, NH, T, HS) : fr_attn_packed(B, NH, T, HS);
    const float *q = in[0], *k = fused ? in[0] + C : in[1], *v = fused ? in[0] + 2 * C : in[2];
    size_t wsn = fr_attention_ws_floats(T, HS, 3);
    float *ws = malloc(wsn * sizeof(float));
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 6; i++) res[r][i] = calloc(3 * n, sizeof(float));
        omp_set_num_threads(r ? 3 : 1);
        float *g = res[r][2];
        int st = fr_attention_fwd(&L, q, k, v, res[r][0], res[r][1], ws, wsn);
        st |= fr_attention_bwd(&L, q, k, v, res[r][0], in[3], res[r][1], res[r][5], g,
                               fused ? g + C : res[r][3], fused ? g + 2 * C : res[r][4], ws, wsn);
        CHECK(st == 0, "threads %d: returned %d", r ? 3 : 1, st);
    }
    omp_set_num_threads(saved);
    for (int i = 0; i < 6; i++) {
        size_t len = i == 1 || i == 5 ? nl : i == 2 && fused ? 3 * n : n;
        CHECK(!memcmp(res[0][i], res[1][i], len * sizeof(float)),
              "%s%s differs between 1 and 3 threads (B=%d NH=%d T=%d HS=%d)", fused ? "fused " : "",
              i < 5 ? g_names[i] : "D", B, NH, T, HS);
    }
    for (int i = 0; i < 4; i++) free(in[i]);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 6; i++) free(res[r][i]);
    free(ws);
}

/* The workspace is a tile per thread: the same at T = 128 and T = 4096 (and
 * at every HS), linear in threads; a workspace short of one slot is refused. */
static void check_workspace(void) {
    size_t a = fr_attention_ws_floats(128, 64, 1), b = fr_attention_ws_floats(4096, 64, 1);
    CHECK(a == b, "ws at T=128: %zu floats, at T=4096: %zu", a, b);
    CHECK(fr_attention_ws_floats(4096, 8, 1) == b, "ws depends on HS");
    CHECK(fr_attention_ws_floats(4096, 64, 4) == 4 * b, "ws is not linear in threads");
    CHECK(b <= 2 * FR_ATTN_BQ * FR_ATTN_BK + 2 * FR_ATTN_BQ, "ws %zu above its stated bound", b);
    float x[4 * 8] = {0}, o[4 * 8], lse[4], D[4], g[3][4 * 8], ws[64];
    size_t need = fr_attention_ws_floats(4, 8, 1);
    fr_attn_layout L = fr_attn_packed(1, 1, 4, 8);
    CHECK(need <= 64 && need > 1, "ws at T=4: %zu", need);
    CHECK(fr_attention_fwd(&L, x, x, x, o, lse, ws, need - 1) != 0, "fwd took a short workspace");
    CHECK(fr_attention_bwd(&L, x, x, x, o, x, lse, D, g[0], g[1], g[2], ws, need - 1) != 0,
          "bwd took a short workspace");
    CHECK(fr_attention_fwd(&L, x, x, x, o, lse, ws, need) == 0, "fwd refused its ws");
}

/* The softmaxes' exponential (exp_poly.h) against double exp, in units in the last place
 * of the float nearest e^x: within 2 over [-87.3, 88] (every 1/1024th and
 * 10^5 random points), 0 below and at -inf, inf above, NaN kept. */
static double ulps(float got, double x) {
    float ref = (float)exp(x);
    float ulp = nextafterf(ref, INFINITY) - ref;
    return fabs((double)got - (double)ref) / (double)ulp;
}
static void check_exp(void) {
    double worst = 0, worst_x = 0;
    for (int i = 0;; i++) {
        float x = -87.3f + (float)i / 1024.0f;
        if (x > 88.0f) break;
        double u = ulps(fr_exp_poly(x), x);
        if (u > worst) worst = u, worst_x = x;
    }
    for (int i = 0; i < 100000; i++) {
        float x = (float)(urand() * 87.3);
        double u = ulps(fr_exp_poly(x), x);
        if (u > worst) worst = u, worst_x = x;
    }
    CHECK(worst <= 2.0, "exp off by %.2f ulp at x = %.9g", worst, worst_x);
    CHECK(fr_exp_poly(0.0f) == 1.0f, "exp(0) = %.9g", fr_exp_poly(0.0f));
    CHECK(fr_exp_poly(-88.0f) == 0.0f && fr_exp_poly(-INFINITY) == 0.0f,
          "exp below -87.3 is not 0");
    CHECK(isnan(fr_exp_poly(NAN)), "exp(NaN) is not NaN");
    CHECK(isinf(fr_exp_poly(88.5f)) && isinf(fr_exp_poly(INFINITY)), "exp above 88 is not inf");
    if (g_verbose) printf("exp: worst %.3f ulp at %.9g\n", worst, worst_x);
}

/* 16-bit q, k, v (a fused qkv of dt) and out: the forward's out must be the
 * f32 call's out on the widened qkv, rounded (half.c's rounding), its lse
 * those bits; the backward, given the 16-bit qkv and out, the f32 call's
 * dq, dk, dv and D given their widened values, bit for bit (widening is
 * exact and the same f32 GEMMs run on the same values). Two thread counts,
 * so that both backward ways are taken. */
static void check_half_g(fr_dtype dt, int B, int NH, int NKV, int T, int HS, int threads) {
    const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, nq = (size_t)B * T * (C + 2 * CK),
                 no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint16_t *qkvh = malloc(nq * 2), *outh = malloc(no * 2);
    float *qkvw = malloc(nq * 4), *dout = malloc(no * 4);
    for (size_t i = 0; i < nq; i++) {
        float x = (float)(3.0 * urand());
        qkvh[i] = dt == FR_F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
        qkvw[i] = dt == FR_F16 ? fr_f16_to_f32(qkvh[i]) : fr_bf16_to_f32(qkvh[i]);
    }
    for (size_t i = 0; i < no; i++) dout[i] = (float)urand();
    float *out = malloc(no * 4), *outw = malloc(no * 4), *lse[2], *D[2], *g[2];
    for (int r = 0; r < 2; r++)
        lse[r] = malloc(nl * 4), D[r] = malloc(nl * 4), g[r] = malloc(nq * 4);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    fr_attn_layout L = fr_attn_fused_gqa(B, NH, NKV, T, HS);
    size_t wsn = fr_attention_ws_floats_io(T, HS, threads, 1);
    float *ws = malloc(wsn * 4);
    const fr_attn_io io = {dt, dt, FR_F32}, io32 = {FR_F32, FR_F32, FR_F32};
    int st = fr_attention_fwd_io(&L, &io32, qkvw, qkvw + C, qkvw + C + CK, out, lse[0], ws, wsn);
    st |= fr_attention_fwd_io(&L, &io, qkvh, qkvh + C, qkvh + C + CK, outh, lse[1], ws, wsn);
    CHECK(st == 0, "16-bit attention forward: %d", st);
    size_t bad = 0;
    for (size_t i = 0; i < no; i++) {
        uint16_t want = dt == FR_F16 ? fr_f32_to_f16(out[i]) : fr_f32_to_bf16(out[i]);
        bad += want != outh[i];
        outw[i] = dt == FR_F16 ? fr_f16_to_f32(outh[i]) : fr_bf16_to_f32(outh[i]);
    }
    const char *dn = dt == FR_F16 ? "f16" : "bf16";
    CHECK(bad == 0,
          "%s out (B=%d NH=%d NKV=%d T=%d HS=%d, %d threads): %zu of %zu values not the f32 "
          "out rounded",
          dn, B, NH, NKV, T, HS, threads, bad, no);
    CHECK(!memcmp(lse[0], lse[1], nl * 4), "%s lse differs from the f32 call's", dn);
    st = fr_attention_bwd_io(&L, &io32, qkvw, qkvw + C, qkvw + C + CK, outw, dout, lse[0], D[0],
                             g[0], g[0] + C, g[0] + C + CK, ws, wsn);
    st |= fr_attention_bwd_io(&L, &io, qkvh, qkvh + C, qkvh + C + CK, outh, dout, lse[0], D[1],
                              g[1], g[1] + C, g[1] + C + CK, ws, wsn);
    CHECK(st == 0, "16-bit attention backward: %d", st);
    CHECK(!memcmp(g[0], g[1], nq * 4),
          "%s dqkv (B=%d NH=%d NKV=%d T=%d HS=%d, %d threads) differs from the f32 call's", dn, B,
          NH, NKV, T, HS, threads);
    CHECK(!memcmp(D[0], D[1], nl * 4), "%s D differs from the f32 call's", dn);
    /* a 16-bit dqkv: the f32 call's, rounded to nearest even (an independent
     * rounding, core/half.h's scalar one), on the workspace that sums it */
    const fr_attn_io iog = {dt, dt, dt};
    const size_t wsg = fr_attention_bwd_ws_floats(T, HS, threads, 1, 1);
    float *wsb = malloc(wsg * 4);
    uint16_t *gh = malloc(nq * 2);
    st = fr_attention_bwd_io(&L, &iog, qkvh, qkvh + C, qkvh + C + CK, outh, dout, lse[0], D[1], gh,
                             gh + C, gh + C + CK, wsb, wsg);
    CHECK(st == 0, "16-bit attention backward, 16-bit dqkv: %d", st);
    bad = 0;
    for (size_t i = 0; i < nq; i++)
        bad += gh[i] != (dt == FR_F16 ? fr_f32_to_f16(g[0][i]) : fr_f32_to_bf16(g[0][i]));
    CHECK(bad == 0,
          "%s dqkv in %s (B=%d NH=%d NKV=%d T=%d HS=%d, %d threads): %zu of %zu values not the "
          "f32 dqkv rounded",
          dn, dn, B, NH, NKV, T, HS, threads, bad, nq);
    CHECK(fr_attention_bwd_io(&L, &iog, qkvh, qkvh + C, qkvh + C + CK, outh, dout, lse[0], D[1], gh,
                              gh + C, gh + C + CK, wsb,
                              fr_attention_bwd_ws_floats(T, HS, 1, 1, 0)) != 0,
          "a 16-bit dqkv took a thread's workspace without its sums");
    free(wsb), free(gh);
    CHECK(fr_attention_fwd_io(&L, &io, qkvh, qkvh + C, qkvh + C + CK, outh, lse[1], ws,
                              fr_attention_ws_floats(T, HS, 1)) != 0 ||
              T * HS <= 0,
          "a 16-bit forward took the f32 workspace of one thread");
    omp_set_num_threads(saved);
    free(qkvh), free(outh), free(qkvw), free(dout), free(out), free(outw), free(ws);
    for (int r = 0; r < 2; r++) free(lse[r]), free(D[r]), free(g[r]);
}

static void check_half(fr_dtype dt, int B, int NH, int T, int HS, int threads) {
    check_half_g(dt, B, NH, NH, T, HS, threads);
}

/* ---- bf16 tile products (attn_tiles16.h) ---- */

/* One query head against its kv head, in float64, with each value's bound
 * on what the bf16 tile path's roundings can move it. With q, k, v exact in
 * bf16 and u = 2^-8 (bf16's unit roundoff, round to nearest even), the path
 * rounds P (for P v), dout (for dout v^T), P and dout again (for P^T dout)
 * and dS (for dS k, dS^T q); products are exact, sums f32. To first order:
 *   out[t,d]: u sum_u P[t,u] |v[u,d]|                        (= u Mo)
 *   D[t] (from the path's out): eD = u sum_d |dout[t,d]| Mo[t,d]
 *   dP[t,u]: eP = u sum_d |dout[t,d]| |v[u,d]|
 *   dS[t,u]: eS = P[t,u] (eP + eD) + u |dS[t,u]|
 *   dv[u,d]: 2u sum_t P[t,u] |dout[t,d]|
 *   dk[u,d]: s sum_t eS[t,u] |q[t,d]|;   dq[t,d]: s sum_u eS[t,u] |k[u,d]|
 * out, lse, dq and the bounds are written; dk, dv and their bounds are added
 * into (a kv head sums its group's). */
static void ref_head_t16(const double *q, const double *k, const double *v, const double *dout,
                         int T, int HS, double *out, double *lse, double *dq, double *dk,
                         double *dv, double *bo, double *bq, double *bk, double *bv) {
    const double s = 1.0 / sqrt((double)HS), u = 1.0 / 256;
    double *P = calloc((size_t)T * T, sizeof(double)), *dS = calloc((size_t)T * T, sizeof(double));
    double *eS = calloc((size_t)T * T, sizeof(double));
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY, l = 0;
        for (int w = 0; w <= t; w++) {
            double a = 0;
            for (int d = 0; d < HS; d++) a += q[t * HS + d] * k[w * HS + d];
            P[t * T + w] = a * s;
            if (P[t * T + w] > mx) mx = P[t * T + w];
        }
        for (int w = 0; w <= t; w++) l += exp(P[t * T + w] - mx);
        lse[t] = mx + log(l);
        for (int w = 0; w <= t; w++) P[t * T + w] = exp(P[t * T + w] - mx) / l;
        double eD = 0, Dt = 0;
        for (int d = 0; d < HS; d++) {
            double a = 0, m = 0;
            for (int w = 0; w <= t; w++)
                a += P[t * T + w] * v[w * HS + d], m += P[t * T + w] * fabs(v[w * HS + d]);
            out[t * HS + d] = a, bo[t * HS + d] = u * m;
            eD += fabs(dout[t * HS + d]) * u * m;
            Dt += dout[t * HS + d] * a;
        }
        for (int w = 0; w <= t; w++) {
            double dp = 0, ep = 0;
            for (int d = 0; d < HS; d++)
                dp += dout[t * HS + d] * v[w * HS + d],
                    ep += fabs(dout[t * HS + d] * v[w * HS + d]);
            const double p = P[t * T + w];
            dS[t * T + w] = p * (dp - Dt);
            eS[t * T + w] = p * (u * ep + eD) + u * fabs(dS[t * T + w]);
        }
    }
    for (int t = 0; t < T; t++)
        for (int d = 0; d < HS; d++) {
            double a = 0, b = 0;
            for (int w = 0; w <= t; w++)
                a += dS[t * T + w] * k[w * HS + d], b += eS[t * T + w] * fabs(k[w * HS + d]);
            dq[t * HS + d] = s * a, bq[t * HS + d] = s * b;
        }
    for (int w = 0; w < T; w++)
        for (int d = 0; d < HS; d++) {
            double a = 0, b = 0, c = 0, e = 0;
            for (int t = w; t < T; t++) {
                a += dS[t * T + w] * q[t * HS + d], b += eS[t * T + w] * fabs(q[t * HS + d]);
                c += P[t * T + w] * dout[t * HS + d], e += P[t * T + w] * fabs(dout[t * HS + d]);
            }
            dk[w * HS + d] += s * a, bk[w * HS + d] += s * b;
            dv[w * HS + d] += c, bv[w * HS + d] += 2 * u * e;
        }
    free(P), free(dS), free(eS);
}

/* max over values of |got - ref| / (1.05 bound + 1e-5 max(max|ref|, 1)):
 * the rounding bound with room for its second-order terms, plus the f32
 * sums' error as TOL states it. Above 1 fails. */
static double t16_ratio(const float *got, const double *ref, const double *bound, size_t n) {
    double m = 1, r = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)got[i] - ref[i]) / (1.05 * bound[i] + 1e-5 * m);
        if (!(x <= r)) r = x;
    }
    return r;
}

static double g_t16_worst;

/* A bf16 qkv on the tile products (fused layout, NKV kv heads): out (f32
 * and bf16), lse, dq, dk, dv against ref_head_t16 within its bounds; the
 * bf16 out is the f32 out rounded; the path differs from the widening one
 * (FRUGAL_ATTN=f32) somewhere, so it ran. Returns dqkv, for the threads
 * comparison. */
static float *check_t16(int B, int NH, int NKV, int T, int HS, int threads) {
    const int G = NH / NKV;
    const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, W = C + 2 * CK;
    const size_t nq = (size_t)B * T * W, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    const size_t th = (size_t)T * HS;
    uint16_t *qkv = malloc(nq * 2), *out16 = malloc(no * 2);
    float *dout = malloc(no * 4), *out = malloc(no * 4), *lse = malloc(nl * 4), *D = malloc(nl * 4);
    float *g = malloc(nq * 4), *gw = malloc(nq * 4), *lse16 = malloc(nl * 4);
    for (size_t i = 0; i < nq; i++) {
        const size_t col = i % W;
        qkv[i] = fr_f32_to_bf16((float)((col < C ? 3.0 : 1.0) * urand()));
    }
    for (size_t i = 0; i < no; i++) dout[i] = (float)urand();
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const fr_attn_layout L = fr_attn_fused_gqa(B, NH, NKV, T, HS);
    const size_t wsn = fr_attention_ws_floats_io(T, HS, threads, 1);
    float *ws = malloc(wsn * 4);
    const fr_attn_io io = {FR_BF16, FR_F32, FR_F32}, io16 = {FR_BF16, FR_BF16, FR_F32};
    int st = fr_attention_fwd_io(&L, &io, qkv, qkv + C, qkv + C + CK, out, lse, ws, wsn);
    st |= fr_attention_fwd_io(&L, &io16, qkv, qkv + C, qkv + C + CK, out16, lse16, ws, wsn);
    st |= fr_attention_bwd_io(&L, &io, qkv, qkv + C, qkv + C + CK, out, dout, lse, D, g, g + C,
                              g + C + CK, ws, wsn);
    /* the same tiles writing a bf16 dqkv: g rounded (core/half.h's scalar
     * rounding) */
    const fr_attn_io iog = {FR_BF16, FR_F32, FR_BF16};
    const size_t wsg = fr_attention_bwd_ws_floats(T, HS, threads, 1, 1);
    float *wsb = malloc(wsg * 4);
    uint16_t *gh = malloc(nq * 2);
    st |= fr_attention_bwd_io(&L, &iog, qkv, qkv + C, qkv + C + CK, out, dout, lse, D, gh, gh + C,
                              gh + C + CK, wsb, wsg);
    size_t badg = 0;
    for (size_t i = 0; i < nq; i++) badg += gh[i] != fr_f32_to_bf16(g[i]);
    CHECK(badg == 0,
          "bf16 tiles B=%d NH=%d NKV=%d T=%d HS=%d, %d threads: %zu bf16 dqkv values "
          "not the f32 dqkv rounded",
          B, NH, NKV, T, HS, threads, badg);
    free(wsb), free(gh);
    setenv("FRUGAL_ATTN", "f32", 1);
    st |= fr_attention_bwd_io(&L, &io, qkv, qkv + C, qkv + C + CK, out, dout, lse, D, gw, gw + C,
                              gw + C + CK, ws, wsn);
    unsetenv("FRUGAL_ATTN");
    omp_set_num_threads(saved);
    CHECK(st == 0, "bf16 tiles B=%d NH=%d NKV=%d T=%d HS=%d: returned %d", B, NH, NKV, T, HS, st);
    size_t bad = 0;
    for (size_t i = 0; i < no; i++) bad += out16[i] != fr_f32_to_bf16(out[i]);
    CHECK(bad == 0, "bf16 tiles T=%d HS=%d: %zu bf16 outs not the f32 out rounded", T, HS, bad);
    CHECK(!memcmp(lse, lse16, nl * 4), "bf16 tiles T=%d HS=%d: lse depends on out's dtype", T, HS);
    CHECK(T < 2 || memcmp(g, gw, nq * 4) != 0,
          "bf16 tiles T=%d HS=%d: the same dqkv bits as the widening path (did the tiles run?)", T,
          HS);
    /* the reference, a (batch, query head) at a time on its kv head */
    double *in[4];
    for (int i = 0; i < 4; i++) in[i] = malloc(th * sizeof(double));
    double *ro = calloc(no, sizeof(double)), *rl = calloc(nl, sizeof(double));
    double *rg = calloc(nq, sizeof(double)), *rb = calloc(nq, sizeof(double));
    double *bo = calloc(no, sizeof(double));
    double *hq = malloc(th * 8), *hk = calloc(th, 8), *hv = calloc(th, 8), *hbq = malloc(th * 8),
           *hbk = calloc(th, 8), *hbv = calloc(th, 8), *ho = malloc(th * 8), *hbo = malloc(th * 8);
    for (int b = 0; b < B; b++)
        for (int kv = 0; kv < NKV; kv++) {
            memset(hk, 0, th * 8), memset(hv, 0, th * 8), memset(hbk, 0, th * 8),
                memset(hbv, 0, th * 8);
            for (int h = kv * G; h < (kv + 1) * G; h++) {
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < HS; d++) {
                        const size_t row = ((size_t)b * T + t) * W;
                        in[0][t * HS + d] = fr_bf16_to_f32(qkv[row + (size_t)h * HS + d]);
                        in[1][t * HS + d] = fr_bf16_to_f32(qkv[row + C + (size_t)kv * HS + d]);
                        in[2][t * HS + d] = fr_bf16_to_f32(qkv[row + C + CK + (size_t)kv * HS + d]);
                        in[3][t * HS + d] = dout[((size_t)b * T + t) * C + (size_t)h * HS + d];
                    }
                ref_head_t16(in[0], in[1], in[2], in[3], T, HS, ho, rl + ((size_t)b * NH + h) * T,
                             hq, hk, hv, hbo, hbq, hbk, hbv);
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < HS; d++) {
                        const size_t o = ((size_t)b * T + t) * C + (size_t)h * HS + d;
                        const size_t x = ((size_t)b * T + t) * W + (size_t)h * HS + d;
                        ro[o] = ho[t * HS + d], bo[o] = hbo[t * HS + d];
                        rg[x] = hq[t * HS + d], rb[x] = hbq[t * HS + d];
                    }
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HS; d++) {
                    const size_t x = ((size_t)b * T + t) * W + C + (size_t)kv * HS + d;
                    rg[x] = hk[t * HS + d], rb[x] = hbk[t * HS + d];
                    rg[x + CK] = hv[t * HS + d], rb[x + CK] = hbv[t * HS + d];
                }
        }
    /* per block of qkv's columns: q, k, v */
    double worst[4] = {t16_ratio(out, ro, bo, no), 0, 0, 0};
    for (int part = 0; part < 3; part++) {
        const size_t c0 = part == 0 ? 0 : part == 1 ? C : C + CK, w = part == 0 ? C : CK;
        size_t n = (size_t)B * T * w, j = 0;
        float *gp = malloc(n * 4);
        double *rp = malloc(n * 8), *bp = malloc(n * 8);
        for (size_t row = 0; row < (size_t)B * T; row++)
            for (size_t c = 0; c < w; c++, j++)
                gp[j] = g[row * W + c0 + c], rp[j] = rg[row * W + c0 + c],
                bp[j] = rb[row * W + c0 + c];
        worst[1 + part] = t16_ratio(gp, rp, bp, n);
        free(gp), free(rp), free(bp);
    }
    double le = 0;
    for (size_t i = 0; i < nl; i++)
        if (!(fabs(lse[i] - rl[i]) <= le)) le = fabs(lse[i] - rl[i]);
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        CHECK(worst[i] <= 1.0,
              "bf16 tiles B=%d NH=%d NKV=%d T=%d HS=%d: %s at %.3g of its rounding bound", B, NH,
              NKV, T, HS, names[i], worst[i]);
        if (worst[i] > g_t16_worst) g_t16_worst = worst[i];
    }
    /* lse comes from f32 scores of exact products: as the f32 path's */
    CHECK(le <= TOL * 10, "bf16 tiles T=%d HS=%d: lse off by %.3g", T, HS, le);
    if (g_verbose)
        printf("bf16 tiles B=%d NH=%d NKV=%d T=%3d HS=%2d: out %.2f dq %.2f dk %.2f dv %.2f of "
               "the bound\n",
               B, NH, NKV, T, HS, worst[0], worst[1], worst[2], worst[3]);
    for (int i = 0; i < 4; i++) free(in[i]);
    free(ro), free(rl), free(rg), free(rb), free(bo), free(hq), free(hk), free(hv), free(hbq),
        free(hbk), free(hbv), free(ho), free(hbo);
    free(qkv), free(out16), free(dout), free(out), free(lse), free(D), free(gw), free(lse16),
        free(ws);
    return g;
}

/* Whether the tile path's CPU test (fr_t16_cpu: cpuinfo.c's feature bits)
 * agrees with what the kernel lists in /proc/cpuinfo's flags: avx512f,
 * avx512bw, avx512vl and avx512_bf16, all four. */
static void check_t16_cpu(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) {
        printf("no /proc/cpuinfo: the tile path's CPU test not compared\n");
        return;
    }
    static char line[8192];
    int flags = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0) {
            static const char *need[] = {" avx512f ", " avx512bw ", " avx512vl ", " avx512_bf16 "};
            line[strcspn(line, "\n")] = ' ';
            flags = 1;
            for (int i = 0; i < 4; i++) flags &= strstr(line, need[i]) != NULL;
            break;
        }
    fclose(f);
    if (flags < 0) {
        printf("no x86 flags in /proc/cpuinfo: the tile path's CPU test not compared\n");
        return;
    }
    CHECK(fr_t16_cpu() == flags, "fr_t16_cpu %d, /proc/cpuinfo's flags %d", fr_t16_cpu(), flags);
}

/* The tile path at 1 and 3 threads: both backward ways, the same bits. */
static void check_t16_cases(void) {
    if (!fr_t16_on()) {
        printf(
            "bf16 tile products not checked: this CPU has no AVX512_BF16 (or FRUGAL_ATTN=f32)\n");
        return;
    }
    static const int cases[][5] = {{2, 3, 3, 130, 16},
                                   {1, 2, 2, 1, 8},
                                   {1, 1, 1, 65, 64},
                                   {2, 4, 2, 70, 16},
                                   {1, 2, 1, 33, 8},
                                   {1, 2, 2, 3, 2},
                                   {1, 2, 2, 130, 128},
                                   {2, 6, 6, 64, 64},
                                   /* more key tiles (18) than a thread keeps packed (16) */
                                   {1, 2, 1, 1100, 8},
                                   /* an odd query tile of wide rows: dout's rounded
                                    * rows and their zero pad row fill the buffer */
                                   {1, 2, 2, 3, 128},
                                   {1, 1, 1, 5, 256}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        const size_t nq = (size_t)c[0] * c[3] * (c[1] + 2 * c[2]) * c[4];
        const unsigned long long seed = g_rng; /* the same inputs twice */
        float *a = check_t16(c[0], c[1], c[2], c[3], c[4], 1);
        g_rng = seed;
        float *b = check_t16(c[0], c[1], c[2], c[3], c[4], 3);
        CHECK(!memcmp(a, b, nq * 4),
              "bf16 tiles B=%d NH=%d NKV=%d T=%d HS=%d: dqkv bits differ "
              "between 1 and 3 threads",
              c[0], c[1], c[2], c[3], c[4]);
        free(a), free(b);
    }
    printf("bf16 tile products: worst %.2f of the rounding bound\n", g_t16_worst);
}

/* ---- grouped-query attention ---- */

/* Rows of H heads (B,H,T,HS) x <-> the column block from col0 (H HS wide)
 * of the fused (B,T,W) matrix m. */
static void pack_cols(float *m, float *x, size_t col0, size_t W, int B, int H, int T, int HS,
                      int to_fused) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < HS; j++) {
                    size_t pi = (((size_t)b * H + h) * T + t) * HS + j;
                    size_t fi = ((size_t)b * T + t) * W + col0 + (size_t)h * HS + j;
                    if (to_fused) m[fi] = x[pi];
                    else x[pi] = m[fi];
                }
}

/* A GQA case's inputs and float64 reference: q, dout (B,NH,T,HS), k, v
 * (B,NKV,T,HS); out, lse, dq and the group sums dk, dv. */
typedef struct gqa_case {
    int B, NH, NKV, T, HS;
    size_t n, nk, nl;
    float *q, *k, *v, *dout;
    double *out, *lse, *dq, *dk, *dv;
} gqa_case;

static gqa_case gqa_make(int B, int NH, int NKV, int T, int HS) {
    gqa_case c;
    memset(&c, 0, sizeof c);
    c.B = B, c.NH = NH, c.NKV = NKV, c.T = T, c.HS = HS;
    c.n = (size_t)B * NH * T * HS, c.nk = (size_t)B * NKV * T * HS, c.nl = (size_t)B * NH * T;
    const int G = NH / NKV;
    const size_t hsz = (size_t)T * HS;
    c.q = malloc(c.n * sizeof(float)), c.dout = malloc(c.n * sizeof(float));
    c.k = malloc(c.nk * sizeof(float)), c.v = malloc(c.nk * sizeof(float));
    for (size_t i = 0; i < c.n; i++) c.q[i] = (float)(3.0 * urand()), c.dout[i] = (float)urand();
    for (size_t i = 0; i < c.nk; i++) c.k[i] = (float)urand(), c.v[i] = (float)urand();
    double *qd = malloc(c.n * sizeof(double)), *kd = malloc(c.n * sizeof(double)),
           *vd = malloc(c.n * sizeof(double)), *dod = malloc(c.n * sizeof(double)),
           *dke = malloc(c.n * sizeof(double)), *dve = malloc(c.n * sizeof(double));
    c.out = malloc(c.n * sizeof(double)), c.lse = malloc(c.nl * sizeof(double));
    c.dq = malloc(c.n * sizeof(double));
    c.dk = calloc(c.nk, sizeof(double)), c.dv = calloc(c.nk, sizeof(double));
    /* the kv heads repeated: query head h of batch b gets kv head h / G */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (size_t i = 0; i < hsz; i++) {
                const size_t e = ((size_t)b * NH + h) * hsz + i;
                const size_t g = ((size_t)b * NKV + h / G) * hsz + i;
                qd[e] = c.q[e], dod[e] = c.dout[e], kd[e] = c.k[g], vd[e] = c.v[g];
            }
    ref_all(qd, kd, vd, dod, c.out, c.lse, c.dq, dke, dve, B * NH, T, HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (size_t i = 0; i < hsz; i++) {
                const size_t e = ((size_t)b * NH + h) * hsz + i;
                const size_t g = ((size_t)b * NKV + h / G) * hsz + i;
                c.dk[g] += dke[e], c.dv[g] += dve[e];
            }
    free(qd), free(kd), free(vd), free(dod), free(dke), free(dve);
    return c;
}

static void gqa_free(gqa_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->dout);
    free(c->out), free(c->lse), free(c->dq), free(c->dk), free(c->dv);
}

/* The kernel's results of one GQA case (packed: q, k, v, out, dq, dk, dv
 * as the case's arrays; fused: read back from qkv (B,T,(NH+2NKV)HS) and
 * out (B,T,NH HS)) at `threads` threads. */
typedef struct gqa_res {
    float *out, *lse, *D, *dq, *dk, *dv;
} gqa_res;

static gqa_res gqa_run(const gqa_case *c, int fused, int threads) {
    const int B = c->B, NH = c->NH, NKV = c->NKV, T = c->T, HS = c->HS;
    gqa_res r;
    r.out = malloc(c->n * sizeof(float)), r.lse = malloc(c->nl * sizeof(float));
    r.D = malloc(c->nl * sizeof(float)), r.dq = malloc(c->n * sizeof(float));
    r.dk = malloc(c->nk * sizeof(float)), r.dv = malloc(c->nk * sizeof(float));
    size_t wsn = fr_attention_ws_floats(T, HS, 3);
    float *ws = malloc(wsn * sizeof(float));
    int saved = omp_get_max_threads(), st;
    omp_set_num_threads(threads);
    if (!fused) {
        fr_attn_layout L = fr_attn_packed_gqa(B, NH, NKV, T, HS);
        for (size_t i = 0; i < c->n; i++) r.dq[i] = NAN;
        for (size_t i = 0; i < c->nk; i++) r.dk[i] = r.dv[i] = NAN;
        st = fr_attention_fwd(&L, c->q, c->k, c->v, r.out, r.lse, ws, wsn);
        st |= fr_attention_bwd(&L, c->q, c->k, c->v, r.out, c->dout, r.lse, r.D, r.dq, r.dk, r.dv,
                               ws, wsn);
    } else {
        const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, W = C + 2 * CK;
        const size_t nq = (size_t)B * T * W;
        float *qkv = malloc(nq * sizeof(float)), *dqkv = malloc(nq * sizeof(float));
        float *dout = malloc(c->n * sizeof(float)), *out = malloc(c->n * sizeof(float));
        pack_cols(qkv, c->q, 0, W, B, NH, T, HS, 1);
        pack_cols(qkv, c->k, C, W, B, NKV, T, HS, 1);
        pack_cols(qkv, c->v, C + CK, W, B, NKV, T, HS, 1);
        pack_cols(dout, c->dout, 0, C, B, NH, T, HS, 1);
        for (size_t i = 0; i < nq; i++) dqkv[i] = NAN; /* every value must be written */
        fr_attn_layout L = fr_attn_fused_gqa(B, NH, NKV, T, HS);
        st = fr_attention_fwd(&L, qkv, qkv + C, qkv + C + CK, out, r.lse, ws, wsn);
        st |= fr_attention_bwd(&L, qkv, qkv + C, qkv + C + CK, out, dout, r.lse, r.D, dqkv,
                               dqkv + C, dqkv + C + CK, ws, wsn);
        pack_cols(out, r.out, 0, C, B, NH, T, HS, 0);
        pack_cols(dqkv, r.dq, 0, W, B, NH, T, HS, 0);
        pack_cols(dqkv, r.dk, C, W, B, NKV, T, HS, 0);
        pack_cols(dqkv, r.dv, C + CK, W, B, NKV, T, HS, 0);
        free(qkv), free(dqkv), free(dout), free(out);
    }
    omp_set_num_threads(saved);
    CHECK(st == 0, "gqa %s: returned %d", fused ? "fused" : "packed", st);
    free(ws);
    return r;
}

static void gqa_res_free(gqa_res *r) {
    free(r->out), free(r->lse), free(r->D), free(r->dq), free(r->dk), free(r->dv);
}

/* The GQA kernel against the reference in both layouts, and the same bits
 * at 1 and 3 threads (with B NKV < 3 the backward takes its per-head pass
 * at 1 thread and its two finer passes at 3). */
static void check_gqa(int B, int NH, int NKV, int T, int HS) {
    gqa_case c = gqa_make(B, NH, NKV, T, HS);
    for (int fused = 0; fused < 2; fused++) {
        gqa_res r[2] = {gqa_run(&c, fused, 1), gqa_run(&c, fused, 3)};
        double e[5] = {rel_err(r[0].out, c.out, c.n, 0), rel_err(r[0].lse, c.lse, c.nl, 1),
                       rel_err(r[0].dq, c.dq, c.n, 2), rel_err(r[0].dk, c.dk, c.nk, 3),
                       rel_err(r[0].dv, c.dv, c.nk, 4)};
        for (int i = 0; i < 5; i++)
            CHECK(e[i] <= TOL, "gqa %s B=%d NH=%d NKV=%d T=%d HS=%d: %s off by %.3g (tol %g)",
                  fused ? "fused" : "packed", B, NH, NKV, T, HS, g_names[i], e[i], TOL);
        if (g_verbose)
            printf("gqa %s B=%d NH=%d NKV=%d T=%3d HS=%2d  out %.2e lse %.2e dq %.2e dk %.2e dv "
                   "%.2e\n",
                   fused ? "fused " : "packed", B, NH, NKV, T, HS, e[0], e[1], e[2], e[3], e[4]);
        const float *a[6] = {r[0].out, r[0].lse, r[0].dq, r[0].dk, r[0].dv, r[0].D};
        const float *b[6] = {r[1].out, r[1].lse, r[1].dq, r[1].dk, r[1].dv, r[1].D};
        const size_t len[6] = {c.n, c.nl, c.n, c.nk, c.nk, c.nl};
        for (int i = 0; i < 6; i++)
            CHECK(!memcmp(a[i], b[i], len[i] * sizeof(float)),
                  "gqa %s: %s differs between 1 and 3 threads (B=%d NH=%d NKV=%d T=%d HS=%d)",
                  fused ? "fused" : "packed", i < 5 ? g_names[i] : "D", B, NH, NKV, T, HS);
        gqa_res_free(&r[0]), gqa_res_free(&r[1]);
    }
    gqa_free(&c);
}

/* ATTENTION_KV with kv_heads NKV: the T positions in two chunks (P0 from
 * step 0, the tiled kernel; the rest from step P0, over the caches) into
 * caches (B,NKV,Tc,HS); y against the reference's full attention, the caches'
 * rows 0..T-1 against k and v. A cache of NH heads is refused. */
static void check_gqa_kv(int B, int NH, int NKV, int T, int HS, int P0) {
    gqa_case c = gqa_make(B, NH, NKV, T, HS);
    const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, W = C + 2 * CK;
    const int Tc = T + 3;
    fr_ctx *ctx = fr_ctx_new();
    fr_node node = {.op = FR_OP_ATTENTION_KV};
    node.attr.heads = NH, node.attr.kv_heads = NKV, node.attr.causal = 1;
    const size_t ncache = (size_t)B * NKV * Tc * HS;
    float *K = malloc(ncache * sizeof(float)), *Vc = malloc(ncache * sizeof(float));
    for (size_t i = 0; i < ncache; i++) K[i] = Vc[i] = NAN;
    float *y = malloc(c.n * sizeof(float)), *got = malloc(c.n * sizeof(float));
    float *full = malloc((size_t)B * T * W * sizeof(float));
    pack_cols(full, c.q, 0, W, B, NH, T, HS, 1);
    pack_cols(full, c.k, C, W, B, NKV, T, HS, 1);
    pack_cols(full, c.v, C + CK, W, B, NKV, T, HS, 1);
    for (int chunk = 0; chunk < 2; chunk++) {
        const int p0 = chunk ? P0 : 0, P = chunk ? T - P0 : P0;
        float *qkv = malloc((size_t)B * P * W * sizeof(float));
        float *yc = malloc((size_t)B * P * C * sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(qkv + (size_t)b * P * W, full + ((size_t)b * T + p0) * W,
                   (size_t)P * W * sizeof(float));
        const int64_t wsn = fr_attention_kv_ws(P, NH, Tc, HS, omp_get_max_threads());
        float *ws = malloc((size_t)wsn * sizeof(float));
        fr_kernel_call k = {.ctx = ctx, .node = &node, .step = (uint64_t)p0};
        k.in[0] = (fr_tensor){FR_F32, fr_shape3(B, P, (int64_t)W), qkv, NULL, 0};
        k.in[1] = (fr_tensor){FR_F32, fr_shape4(B, NKV, Tc, HS), K, NULL, 0};
        k.in[2] = (fr_tensor){FR_F32, fr_shape4(B, NKV, Tc, HS), Vc, NULL, 0};
        k.out[0] = (fr_tensor){FR_F32, fr_shape3(B, P, (int64_t)C), yc, NULL, 0};
        k.out[1] = (fr_tensor){FR_F32, fr_shape1(wsn), ws, NULL, 0};
        CHECK(fr_k_attention_kv(&k) == FR_OK, "gqa kv chunk %d: %s", chunk, fr_last_error(ctx));
        for (int b = 0; b < B; b++)
            memcpy(y + ((size_t)b * T + p0) * C, yc + (size_t)b * P * C,
                   (size_t)P * C * sizeof(float));
        if (chunk == 1) { /* caches of NH heads: refused, naming the shapes */
            fr_shape bad = fr_shape4(B, NH, Tc, HS);
            k.in[1].shape = k.in[2].shape = bad;
            CHECK(fr_k_attention_kv(&k) == FR_ERR_SHAPE && strstr(fr_last_error(ctx), "caches"),
                  "gqa kv: caches of %d heads were taken (%s)", NH, fr_last_error(ctx));
        }
        free(qkv), free(yc), free(ws);
    }
    pack_cols(y, got, 0, C, B, NH, T, HS, 0);
    double e = rel_err(got, c.out, c.n, 0);
    CHECK(e <= TOL, "gqa kv B=%d NH=%d NKV=%d T=%d HS=%d P0=%d: y off by %.3g", B, NH, NKV, T, HS,
          P0, e);
    int same = 1;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < HS; j++) {
                    const size_t ci = (((size_t)b * NKV + g) * Tc + t) * HS + j;
                    const size_t ki = (((size_t)b * NKV + g) * T + t) * HS + j;
                    same &= K[ci] == c.k[ki] && Vc[ci] == c.v[ki];
                }
    CHECK(same, "gqa kv: the caches do not hold the keys and values");
    free(K), free(Vc), free(y), free(got), free(full);
    fr_ctx_free(ctx);
    gqa_free(&c);
}

int main(void) {
    const char *vb = getenv("FR_TEST_VERBOSE");
    g_verbose = vb && vb[0] == '1';
    check_workspace();
    check_t16_cpu();
    check_exp();
    check_reference_fd(1, 2, 5, 3);
    check_reference_fd(2, 1, 4, 2);
    /* Every T, HS and NH, B alternating 1 and 2 over the sweep. */
    static const int Ts[] = {1, 2, 3, 31, 32, 33, 64, 65, 127, 130}, NHs[] = {1, 2, 4},
                     HSs[] = {8, 16, 32, 64};
    int idx = 0;
    for (int ti = 0; ti < 10; ti++)
        for (int hi = 0; hi < 3; hi++)
            for (int si = 0; si < 4; si++, idx++) check_case(1 + idx % 2, NHs[hi], Ts[ti], HSs[si]);
    check_case(1, 2, 130, 128); /* a head size past the range, once */
    for (int fused = 0; fused < 2; fused++) {
        check_threads(2, 3, 130, 16, fused);
        check_threads(1, 1, 65, 64, fused);
        /* one task: a team of one, GEMMs above OpenBLAS's threading threshold */
        check_threads(1, 1, 64, 256, fused);
    }
    /* 16-bit operands widened (the bf16 tile products forced off), then an
     * odd head size, which never takes the tiles */
    setenv("FRUGAL_ATTN", "f32", 1);
    for (int t = 1; t <= 3; t += 2) {
        check_half(FR_BF16, 2, 3, 130, 16, t);
        check_half(FR_F16, 1, 1, 65, 64, t);
        check_half(FR_BF16, 1, 2, 1, 8, t);
        check_half_g(FR_BF16, 2, 4, 2, 70, 16, t); /* grouped-query */
        check_half_g(FR_F16, 1, 4, 1, 33, 8, t);
    }
    unsetenv("FRUGAL_ATTN");
    for (int t = 1; t <= 3; t += 2) check_half(FR_BF16, 1, 2, 33, 7, t);
    check_t16_cases();
    /* grouped-query attention: groups of 2 and of 4, tiles crossed */
    check_gqa(2, 4, 2, 33, 8);
    check_gqa(1, 4, 1, 130, 16);
    check_gqa(2, 4, 1, 65, 32);
    check_gqa(1, 6, 3, 70, 8);
    check_gqa(1, 4, 4, 40, 8); /* kv_heads = heads: multi-head */
    check_gqa_kv(2, 4, 2, 20, 8, 12);
    check_gqa_kv(1, 4, 1, 70, 16, 66);
    printf("worst:");
    for (int i = 0; i < 6; i++) printf(" %s %.2e", g_names[i], g_worst[i]);
    printf("\n");
    return check_done();
}
