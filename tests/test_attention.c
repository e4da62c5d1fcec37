/* test_attention.c — checks the tiled causal attention of
 * src/backend/cpu/attention.c against a naive float64 reference written here
 * (the full T x T scores in double, the backward derived by hand through the
 * softmax's Jacobian), and that reference's gradients against its own
 * central finite differences. Also: the same bits at 1 and 3 threads, a
 * workspace that does not grow with T, and a refused short workspace.
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
#include "backend/cpu/attention.h"
#include "check.h"

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

/* One case: random q, k, v, dout; the kernel against the reference. */
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
    float *ws = malloc(wsn * sizeof(float));
    int st = fr_attention_fwd(q, k, v, out, lse, B, NH, T, HS, ws, wsn);
    CHECK(st == 0, "fwd returned %d", st);
    st = fr_attention_bwd(q, k, v, out, dout, lse, dq, dk, dv, B, NH, T, HS, ws, wsn);
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
    for (int i = 0; i < 10; i++) free(d[i]), free(f[i]);
    free(ws);
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

/* The same bits at 1 and at 3 threads. */
static void check_threads(int B, int NH, int T, int HS) {
    size_t n = (size_t)B * NH * T * HS, nl = (size_t)B * NH * T;
    float *in[4], *res[2][5];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n * sizeof(float));
        for (size_t j = 0; j < n; j++) in[i][j] = (float)((i == 0 ? 3.0 : 1.0) * urand());
    }
    size_t wsn = fr_attention_ws_floats(T, HS, 3);
    float *ws = malloc(wsn * sizeof(float));
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 5; i++) res[r][i] = malloc((i == 1 ? nl : n) * sizeof(float));
        omp_set_num_threads(r ? 3 : 1);
        int st = fr_attention_fwd(in[0], in[1], in[2], res[r][0], res[r][1], B, NH, T, HS, ws, wsn);
        st |= fr_attention_bwd(in[0], in[1], in[2], res[r][0], in[3], res[r][1], res[r][2],
                               res[r][3], res[r][4], B, NH, T, HS, ws, wsn);
        CHECK(st == 0, "threads %d: returned %d", r ? 3 : 1, st);
    }
    omp_set_num_threads(saved);
    for (int i = 0; i < 5; i++)
        CHECK(!memcmp(res[0][i], res[1][i], (i == 1 ? nl : n) * sizeof(float)),
              "%s differs between 1 and 3 threads (B=%d NH=%d T=%d HS=%d)", g_names[i], B, NH, T,
              HS);
    for (int i = 0; i < 4; i++) free(in[i]);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 5; i++) free(res[r][i]);
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
    float x[4 * 8] = {0}, o[4 * 8], lse[4], g[3][4 * 8], ws[64];
    size_t need = fr_attention_ws_floats(4, 8, 1);
    CHECK(need <= 64 && need > 1, "ws at T=4: %zu", need);
    CHECK(fr_attention_fwd(x, x, x, o, lse, 1, 1, 4, 8, ws, need - 1) != 0,
          "fwd took a short workspace");
    CHECK(fr_attention_bwd(x, x, x, o, x, lse, g[0], g[1], g[2], 1, 1, 4, 8, ws, need - 1) != 0,
          "bwd took a short workspace");
    CHECK(fr_attention_fwd(x, x, x, o, lse, 1, 1, 4, 8, ws, need) == 0, "fwd refused its ws");
}

int main(void) {
    const char *vb = getenv("FR_TEST_VERBOSE");
    g_verbose = vb && vb[0] == '1';
    check_workspace();
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
    check_threads(2, 3, 130, 16);
    check_threads(1, 1, 65, 64);
    check_threads(1, 1, 64,
                  256); /* one task: a team of one, GEMMs above OpenBLAS's threading threshold */
    printf("worst:");
    for (int i = 0; i < 6; i++) printf(" %s %.2e", g_names[i], g_worst[i]);
    printf("\n");
    return check_done();
}
