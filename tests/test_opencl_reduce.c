/* test_opencl_reduce.c — the OpenCL kernels of the reduction group (batch
 * and layer normalisation, the losses, pooling, the embeddings) and the
 * step's sum of squares and hit count, run on a real device (PoCL in CI)
 * and compared with the CPU kernels on the same inputs (those are checked
 * against float64 loops, finite differences and PyTorch elsewhere). Each
 * case runs twice on the device: the two must be the same bits. Device
 * tensors sit 64 bytes into their buffers, so every offset is exercised.
 *
 * Bounds, relative to the largest |CPU value| of the output:
 * - 0 (the same bits): ops computed by the same float formula in the same
 *   order (pooling, MSE and its gradient, the embeddings, global average
 *   pooling, whose sum is in double in order on both), and the CPU's 64
 *   fixed blocks for MSE.
 * - 1e-6: layer norm and cross-entropy: the statistics are summed in double
 *   on both sides but in another order (lanes and a tree against eight
 *   chains), and the device's exp and log in double may differ by their
 *   spec'd ulp; rounded to float the results differ by an ulp at most.
 * - 2e-5: batch norm: the CPU sums a plane in float (a vectorised loop of
 *   unspecified order) and the planes in double, the device every value in
 *   double: the mean and variance differ by about sqrt(HW) float ulp.
 * Returns 77 (skipped) when there is no device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "cl_device.h"
#include "backend/cpu/kernels.h"
#include "backend/opencl/backend.h"
#include "backend/opencl/reduce.h"
#include "core/half.h"

#define PAD 64 /* bytes before each device tensor */

static fr_ctx *g_dev, *g_cpu;
static fr_cl *g_cl;

/* deterministic test data */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}
static float *frand(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (urand() * 0.5f + 0.5f);
    return p;
}
static int32_t *irand(int64_t n, int32_t V) {
    int32_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)((urand() * 0.5f + 0.5f) * (float)V) % V;
    return p;
}

/* A tensor of a case: dtype, shape, host contents (an output's starting
 * contents, NULL: a NaN pattern), absent when `absent`. */
typedef struct targ {
    fr_dtype dt;
    fr_shape s;
    const void *data;
    int absent;
} targ;

static targ T32(fr_shape s, const void *d) { return (targ){FR_F32, s, d, 0}; }
static targ TI(fr_shape s, const int32_t *d) { return (targ){FR_I32, s, d, 0}; }
static targ TH(fr_dtype dt, fr_shape s, const void *d) { return (targ){dt, s, d, 0}; }
static const targ NONE = {FR_F32, {0, {0}}, NULL, 1};

static size_t tbytes(const targ *t) { return (size_t)fr_shape_numel(&t->s) * fr_dtype_size(t->dt); }

typedef struct kcase {
    const char *name;
    fr_op op;
    fr_attr a;
    int nin, nout;
    targ in[FR_MAX_IN], out[FR_MAX_OUT];
    uint32_t acc;
    double tol;          /* bound relative to max |cpu| (0: the same bits) */
    uint32_t in_written; /* inputs the op updates in place (running stats) */
} kcase;

/* host copies: [0..nin) inputs, [nin..nin+nout) outputs */
typedef struct side {
    void *h[FR_MAX_IN + FR_MAX_OUT];
    cl_mem m[FR_MAX_IN + FR_MAX_OUT];
} side;

static void *host_init(const targ *t) {
    size_t b = tbytes(t);
    unsigned char *p = malloc(b ? b : 1);
    if (t->data) memcpy(p, t->data, b);
    else memset(p, 0xff, b); /* NaN in every float dtype */
    return p;
}

static void fill_call(fr_kernel_call *c, fr_node *nd, const kcase *k, fr_ctx *ctx) {
    memset(c, 0, sizeof *c);
    memset(nd, 0, sizeof *nd);
    nd->op = k->op;
    nd->fwd = -1;
    nd->attr = k->a;
    c->ctx = ctx;
    c->node = nd;
    c->accumulate = k->acc;
}

static int run_cpu(const kcase *k, side *s) {
    fr_kernel_call c;
    fr_node nd;
    fill_call(&c, &nd, k, g_cpu);
    for (int i = 0; i < k->nin + k->nout; i++) {
        const targ *t = i < k->nin ? &k->in[i] : &k->out[i - k->nin];
        fr_tensor *ft = i < k->nin ? &c.in[i] : &c.out[i - k->nin];
        s->h[i] = t->absent ? NULL : host_init(t);
        *ft = (fr_tensor){.dtype = t->dt, .shape = t->s, .data = s->h[i]};
    }
    return fr_cpu_backend.kernels[k->op](&c);
}

/* Uploads, runs, reads back into s->h. */
static int run_dev(const kcase *k, side *s) {
    fr_kernel_call c;
    fr_node nd;
    fill_call(&c, &nd, k, g_dev);
    int st = FR_OK;
    for (int i = 0; i < k->nin + k->nout; i++) {
        const targ *t = i < k->nin ? &k->in[i] : &k->out[i - k->nin];
        fr_tensor *ft = i < k->nin ? &c.in[i] : &c.out[i - k->nin];
        s->h[i] = NULL, s->m[i] = NULL;
        *ft = (fr_tensor){.dtype = t->dt, .shape = t->s};
        if (t->absent) continue;
        s->h[i] = host_init(t);
        if (fr_cl_alloc(g_dev, g_cl, PAD + tbytes(t), &s->m[i]) ||
            fr_cl_write(g_dev, g_cl, s->m[i], PAD, s->h[i], tbytes(t)))
            return FR_ERR_NOMEM;
        ft->buf = s->m[i], ft->off = PAD;
    }
    st = fr_cl_backend.kernels[k->op](&c);
    for (int i = 0; i < k->nin + k->nout; i++)
        if (s->m[i]) {
            const targ *t = i < k->nin ? &k->in[i] : &k->out[i - k->nin];
            if (!st && fr_cl_read(g_dev, g_cl, s->m[i], PAD, s->h[i], tbytes(t))) st = FR_ERR_ARG;
            fr_cl_release(s->m[i]);
        }
    return st;
}

static void side_free(const kcase *k, side *s) {
    for (int i = 0; i < k->nin + k->nout; i++) free(s->h[i]);
}

static float val(const void *p, fr_dtype dt, int64_t i) {
    if (dt == FR_F16) return fr_f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == FR_BF16) return fr_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* device against CPU for tensor i of the case; returns the relative error */
static double compare(const kcase *k, int i, const side *dv, const side *cp, const char *what) {
    const targ *t = i < k->nin ? &k->in[i] : &k->out[i - k->nin];
    const int64_t n = fr_shape_numel(&t->s);
    const int at = i < k->nin ? i : i - k->nin; /* its index among the ins or the outs */
    double mx = 0, err = 0;
    int64_t bad = -1, nanbad = -1;
    for (int64_t j = 0; j < n; j++) {
        float c = val(cp->h[i], t->dt, j), d = val(dv->h[i], t->dt, j);
        if (isnan(c) != isnan(d)) {
            if (nanbad < 0) nanbad = j;
            continue;
        }
        if (isnan(c)) continue;
        if (fabs(c) > mx) mx = fabs(c);
        if (k->tol == 0) {
            if (memcmp(&c, &d, sizeof c) && bad < 0) bad = j;
        } else if (fabs((double)c - d) > err) {
            err = fabs((double)c - d);
        }
    }
    double rel = mx > 0 ? err / mx : err;
    CHECK(nanbad < 0, "%s %s[%d]: NaN at %lld (cpu %g, device %g)", k->name, what, at,
          (long long)nanbad, nanbad < 0 ? 0.0 : val(cp->h[i], t->dt, nanbad),
          nanbad < 0 ? 0.0 : val(dv->h[i], t->dt, nanbad));
    if (k->tol == 0)
        CHECK(bad < 0, "%s %s[%d]: not the CPU's bits at %lld: cpu %.9g device %.9g", k->name, what,
              at, (long long)bad, bad < 0 ? 0.0 : val(cp->h[i], t->dt, bad),
              bad < 0 ? 0.0 : val(dv->h[i], t->dt, bad));
    else
        CHECK(rel <= k->tol, "%s %s[%d]: relative error %.3g > %.3g", k->name, what, at, rel,
              k->tol);
    return rel;
}

/* Runs k on the CPU and twice on the device: compares every written tensor. */
static void run_case(const kcase *k) {
    side cp, d1, d2;
    int sc = run_cpu(k, &cp);
    CHECK(sc == FR_OK, "%s cpu: %s", k->name, fr_last_error(g_cpu));
    int s1 = run_dev(k, &d1), s2 = run_dev(k, &d2);
    CHECK(s1 == FR_OK && s2 == FR_OK, "%s device: %s", k->name, fr_last_error(g_dev));
    double worst = 0;
    if (!sc && !s1 && !s2)
        for (int i = 0; i < k->nin + k->nout; i++) {
            const int out = i >= k->nin;
            const targ *t = out ? &k->out[i - k->nin] : &k->in[i];
            if (t->absent || (!out && !((k->in_written >> i) & 1))) continue;
            CHECK(!memcmp(d1.h[i], d2.h[i], tbytes(t)), "%s [%d]: two device runs differ", k->name,
                  i);
            double e = compare(k, i, &d1, &cp, out ? "out" : "in");
            if (e > worst) worst = e;
        }
    printf("%-44s max rel err %.3g (bound %.3g)\n", k->name, worst, k->tol);
    side_free(k, &cp), side_free(k, &d1), side_free(k, &d2);
}

/* ---- the cases ---- */

static void test_batchnorm(int64_t N, int64_t C, int64_t H, int64_t W, int training, int affine,
                           uint32_t acc) {
    const int four = H > 0;
    const int64_t HW = four ? H * W : 1, n = N * C * HW;
    fr_shape xs = four ? fr_shape4(N, C, H, W) : fr_shape2(N, C), cs = fr_shape1(C);
    float *x = frand(n, -2.0f, 3.0f), *g = frand(C, 0.5f, 1.5f), *b = frand(C, -0.5f, 0.5f);
    float *rm = frand(C, -0.2f, 0.2f), *rv = frand(C, 0.5f, 1.5f);
    for (int64_t i = 0; i < n; i++) x[i] += 10.0f; /* var << mean^2 */
    char name[128];
    snprintf(name, sizeof name, "batchnorm %s %lldx%lldx%lld%s%s", training ? "train" : "eval",
             (long long)N, (long long)C, (long long)HW, affine ? "" : " no affine",
             training && !affine ? " no saved" : "");
    fr_attr a = {.training = training, .eps = 1e-5f, .momentum = 0.1f};
    kcase k = {name,
               FR_OP_BATCHNORM,
               a,
               5,
               3,
               {T32(xs, x), affine ? T32(cs, g) : NONE, affine ? T32(cs, b) : NONE, T32(cs, rm),
                T32(cs, rv)},
               {T32(xs, NULL), T32(cs, NULL), T32(cs, NULL)},
               0,
               2e-5,
               training ? 0x18u : 0};
    if (training && !affine) k.out[1] = k.out[2] = NONE;
    run_case(&k);

    /* the backward from saved statistics: a forward's on the CPU */
    float *sm = malloc((size_t)C * sizeof *sm), *si = malloc((size_t)C * sizeof *si);
    for (int64_t ch = 0; ch < C; ch++) {
        double s = 0, q = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < HW; j++) s += x[(i * C + ch) * HW + j];
        s /= (double)(N * HW);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < HW; j++) {
                double d = x[(i * C + ch) * HW + j] - s;
                q += d * d;
            }
        sm[ch] = (float)s, si[ch] = (float)(1.0 / sqrt(q / (double)(N * HW) + 1e-5));
    }
    float *dy = frand(n, -1, 1), *dx0 = frand(n, -1, 1), *dg0 = frand(C, -1, 1),
          *db0 = frand(C, -1, 1);
    snprintf(name, sizeof name, "batchnorm_bwd %lldx%lldx%lld acc %u%s", (long long)N, (long long)C,
             (long long)HW, acc, affine ? "" : " no gamma, no dgamma");
    kcase kb = {name,
                FR_OP_BATCHNORM_BWD,
                a,
                5,
                3,
                {T32(xs, dy), T32(xs, x), affine ? T32(cs, g) : NONE, T32(cs, sm), T32(cs, si)},
                {T32(xs, dx0), affine ? T32(cs, dg0) : NONE, T32(cs, db0)},
                acc,
                2e-5,
                0};
    run_case(&kb);
    if (four && HW <= 16384) { /* x in 16 bits (the op table's half_in) */
        uint16_t *xh = malloc((size_t)n * sizeof *xh);
        for (int half = 0; half < 2; half++) {
            fr_dtype dt = half ? FR_F16 : FR_BF16;
            for (int64_t i = 0; i < n; i++)
                xh[i] = half ? fr_f32_to_f16(x[i] - 10.0f) : fr_f32_to_bf16(x[i] - 10.0f);
            snprintf(name, sizeof name, "batchnorm_bwd %s x %lldx%lldx%lld", half ? "f16" : "bf16",
                     (long long)N, (long long)C, (long long)HW);
            kb.in[1] = TH(dt, xs, xh);
            run_case(&kb);
        }
        free(xh);
    }
    free(x), free(g), free(b), free(rm), free(rv), free(sm), free(si), free(dy), free(dx0),
        free(dg0), free(db0);
}

static void test_layernorm(int64_t B, int64_t T, int64_t Dn, int affine, uint32_t acc,
                           int with_dx) {
    const int64_t N = B * T, n = N * Dn;
    fr_shape xs = fr_shape3(B, T, Dn), ds = fr_shape1(Dn), ns = fr_shape2(B, T);
    float *x = frand(n, -1, 3), *g = frand(Dn, 0.5f, 1.5f), *b = frand(Dn, -0.5f, 0.5f);
    for (int64_t i = 0; i < n; i++) x[i] += 5.0f;
    char name[128];
    snprintf(name, sizeof name, "layernorm %lldx%lld%s", (long long)N, (long long)Dn,
             affine ? "" : " no affine, no saved");
    fr_attr a = {.eps = 1e-5f};
    kcase k = {name,
               FR_OP_LAYERNORM,
               a,
               3,
               3,
               {T32(xs, x), affine ? T32(ds, g) : NONE, affine ? T32(ds, b) : NONE},
               {T32(xs, NULL), affine ? T32(ns, NULL) : NONE, affine ? T32(ns, NULL) : NONE},
               0,
               1e-6,
               0};
    run_case(&k);
    float *sm = malloc((size_t)N * sizeof *sm), *sr = malloc((size_t)N * sizeof *sr);
    for (int64_t r = 0; r < N; r++) {
        double s = 0, q = 0;
        for (int64_t d = 0; d < Dn; d++) s += x[r * Dn + d];
        s /= (double)Dn;
        for (int64_t d = 0; d < Dn; d++) q += (x[r * Dn + d] - s) * (x[r * Dn + d] - s);
        sm[r] = (float)s, sr[r] = (float)(1.0 / sqrt(q / (double)Dn + 1e-5));
    }
    float *dy = frand(n, -1, 1), *dx0 = frand(n, -1, 1), *dg0 = frand(Dn, -1, 1),
          *db0 = frand(Dn, -1, 1);
    snprintf(name, sizeof name, "layernorm_bwd %lldx%lld acc %u%s%s", (long long)N, (long long)Dn,
             acc, affine ? "" : " no gamma, no dgamma", with_dx ? "" : " no dx");
    kcase kb = {name,
                FR_OP_LAYERNORM_BWD,
                a,
                5,
                3,
                {T32(xs, dy), T32(xs, x), affine ? T32(ds, g) : NONE, T32(ns, sm), T32(ns, sr)},
                {with_dx ? T32(xs, dx0) : NONE, affine ? T32(ds, dg0) : NONE, T32(ds, db0)},
                acc,
                1e-6,
                0};
    run_case(&kb);
    free(x), free(g), free(b), free(sm), free(sr), free(dy), free(dx0), free(dg0), free(db0);
}

static void test_cross_entropy(int64_t B, int64_t T, int64_t C, uint32_t acc) {
    const int64_t N = B * T;
    fr_shape zs = T ? fr_shape3(B, T, C) : fr_shape2(B, C), ls = T ? fr_shape2(B, T) : fr_shape1(B);
    const int64_t rows = T ? N : B;
    float *z = frand(rows * C, -8, 8), *dz0 = frand(rows * C, -1, 1);
    z[0] = 900.0f; /* large logits must not overflow */
    int32_t *y = irand(rows, (int32_t)C);
    char name[128];
    snprintf(name, sizeof name, "cross_entropy %lldx%lld", (long long)rows, (long long)C);
    fr_attr a = {.scale = 0.75f};
    kcase k = {name,
               FR_OP_CROSS_ENTROPY,
               a,
               2,
               1,
               {T32(zs, z), TI(ls, y)},
               {T32(fr_shape1(1), NULL)},
               0,
               1e-6,
               0};
    run_case(&k);
    snprintf(name, sizeof name, "cross_entropy_bwd %lldx%lld acc %u", (long long)rows, (long long)C,
             acc);
    kcase kb = {
        name, FR_OP_CROSS_ENTROPY_BWD, a, 2, 1, {T32(zs, z), TI(ls, y)}, {T32(zs, dz0)}, acc, 1e-6,
        0};
    run_case(&kb);

    /* fr_cl_hits against step.c's count, ties included */
    for (int64_t i = 0; i < rows * C; i++) z[i] = (float)((int)(z[i] * 0.5f)); /* many ties */
    int64_t want = 0;
    for (int64_t i = 0; i < rows; i++) {
        int best = 0;
        for (int64_t j = 1; j < C; j++)
            if (z[i * C + j] > z[i * C + best]) best = (int)j;
        want += best == y[i];
    }
    for (int64_t i = 0; i < rows; i += 3) { /* make some rows hit */
        int best = 0;
        for (int64_t j = 1; j < C; j++)
            if (z[i * C + j] > z[i * C + best]) best = (int)j;
        want += (best != y[i]);
        y[i] = best;
    }
    cl_mem zm = NULL, ym = NULL;
    int64_t got = -1, got2 = -2;
    CHECK(!fr_cl_alloc(g_dev, g_cl, PAD + (size_t)(rows * C) * 4, &zm) &&
              !fr_cl_alloc(g_dev, g_cl, PAD + (size_t)rows * 4, &ym),
          "%s", fr_last_error(g_dev));
    fr_cl_write(g_dev, g_cl, zm, PAD, z, (size_t)(rows * C) * 4);
    fr_cl_write(g_dev, g_cl, ym, PAD, y, (size_t)rows * 4);
    CHECK(fr_cl_hits(g_dev, g_cl, zm, PAD / 4, ym, PAD / 4, (int)rows, (int)C, &got) == FR_OK,
          "hits: %s", fr_last_error(g_dev));
    fr_cl_hits(g_dev, g_cl, zm, PAD / 4, ym, PAD / 4, (int)rows, (int)C, &got2);
    CHECK(got == want && got2 == want, "hits %lldx%lld: %lld, %lld, want %lld", (long long)rows,
          (long long)C, (long long)got, (long long)got2, (long long)want);
    printf("%-44s %lld of %lld\n", "hits", (long long)got, (long long)rows);
    fr_cl_release(zm), fr_cl_release(ym);
    free(z), free(dz0), free(y);
}

static void test_mse(int64_t N, int64_t Dn, uint32_t acc) {
    fr_shape s = fr_shape2(N, Dn);
    float *p = frand(N * Dn, -2, 2), *t = frand(N * Dn, -2, 2), *d0 = frand(N * Dn, -1, 1);
    char name[128];
    snprintf(name, sizeof name, "mse %lldx%lld", (long long)N, (long long)Dn);
    fr_attr a = {.scale = 0.5f};
    kcase k = {name, FR_OP_MSE, a, 2, 1, {T32(s, p), T32(s, t)}, {T32(fr_shape1(1), NULL)},
               0,    0,         0};
    run_case(&k);
    snprintf(name, sizeof name, "mse_bwd %lldx%lld acc %u", (long long)N, (long long)Dn, acc);
    kcase kb = {name, FR_OP_MSE_BWD, a, 2, 1, {T32(s, p), T32(s, t)}, {T32(s, d0)}, acc, 0, 0};
    run_case(&kb);
    free(p), free(t), free(d0);
}

/* values on a coarse grid so windows tie; a NaN or two when `nan` */
static float *pool_data(int64_t n, int nan) {
    float *x = frand(n, -3, 3);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(int)(x[i] * 1.5f) * 0.5f;
    if (nan && n > 20) x[5] = NAN, x[17] = NAN, x[18] = -0.0f;
    return x;
}

static void test_pool(int64_t N, int64_t C, int64_t H, int64_t W, int K, int S, uint32_t acc,
                      int nan) {
    const int64_t OH = (H - K) / S + 1, OW = (W - K) / S + 1, n = N * C * H * W,
                  m = N * C * OH * OW;
    fr_shape xs = fr_shape4(N, C, H, W), ys = fr_shape4(N, C, OH, OW);
    float *x = pool_data(n, nan), *dy = frand(m, -1, 1), *dx0 = frand(n, -1, 1);
    if (m > 3) dy[3] = -0.0f;
    fr_attr a = {.kernel = K, .stride = S};
    char name[128];
    snprintf(name, sizeof name, "maxpool2d %lldx%lldx%lldx%lld k%d s%d%s", (long long)N,
             (long long)C, (long long)H, (long long)W, K, S, nan ? " NaN" : "");
    kcase k = {name, FR_OP_MAXPOOL2D, a, 1, 1, {T32(xs, x)}, {T32(ys, NULL)}, 0, 0, 0};
    run_case(&k);
    snprintf(name, sizeof name, "maxpool2d_bwd %lldx%lldx%lldx%lld k%d s%d acc %u%s", (long long)N,
             (long long)C, (long long)H, (long long)W, K, S, acc, nan ? " NaN" : "");
    kcase kb = {
        name, FR_OP_MAXPOOL2D_BWD, a, 3, 1, {T32(ys, dy), T32(xs, x), NONE}, {T32(xs, dx0)}, acc, 0,
        0};
    run_case(&kb);
    if (!acc) { /* ReLU's backward folded in (plan/fold.h): the CPU's bits */
        kcase km = kb;
        km.a.masked = 1;
        snprintf(name, sizeof name, "maxpool2d_bwd masked %lldx%lld k%d s%d%s", (long long)H,
                 (long long)W, K, S, nan ? " NaN" : "");
        run_case(&km);
    }
    if (H * W <= 16384) { /* 16-bit x (both ops), 16-bit y (the forward) */
        uint16_t *xh = malloc((size_t)n * sizeof *xh);
        for (int half = 0; half < 2; half++) {
            const fr_dtype dt = half ? FR_F16 : FR_BF16;
            for (int64_t i = 0; i < n; i++)
                xh[i] = half ? fr_f32_to_f16(x[i]) : fr_f32_to_bf16(x[i]);
            k.in[0] = TH(dt, xs, xh), kb.in[1] = TH(dt, xs, xh);
            snprintf(name, sizeof name, "maxpool2d(_bwd) %s x k%d s%d", half ? "f16" : "bf16", K,
                     S);
            run_case(&k), run_case(&kb);
            if (OH * OW <= 4096) {
                k.out[0] = TH(dt, ys, NULL);
                snprintf(name, sizeof name, "maxpool2d %s x and y k%d s%d", half ? "f16" : "bf16",
                         K, S);
                run_case(&k);
                k.in[0] = T32(xs, x); /* f32 in, 16-bit out: rounded */
                for (int64_t i = 0; i < n; i++) x[i] += 1.0f / 4096;
                snprintf(name, sizeof name, "maxpool2d f32 x, %s y k%d s%d", half ? "f16" : "bf16",
                         K, S);
                run_case(&k);
                k.out[0] = T32(ys, NULL);
            }
        }
        free(xh);
    }
    snprintf(name, sizeof name, "avgpool2d %lldx%lldx%lldx%lld k%d s%d", (long long)N, (long long)C,
             (long long)H, (long long)W, K, S);
    float *xa = frand(n, -2, 2);
    kcase ka = {name, FR_OP_AVGPOOL2D, a, 1, 1, {T32(xs, xa)}, {T32(ys, NULL)}, 0, 0, 0};
    run_case(&ka);
    snprintf(name, sizeof name, "avgpool2d_bwd %lldx%lldx%lldx%lld k%d s%d acc %u", (long long)N,
             (long long)C, (long long)H, (long long)W, K, S, acc);
    kcase kab = {name, FR_OP_AVGPOOL2D_BWD, a, 1, 1, {T32(ys, dy)}, {T32(xs, dx0)}, acc, 0, 0};
    run_case(&kab);
    free(x), free(xa), free(dy), free(dx0);
}

static void test_gap(int64_t N, int64_t C, int64_t H, int64_t W, uint32_t acc) {
    fr_shape xs = fr_shape4(N, C, H, W), ys = fr_shape2(N, C);
    float *x = frand(N * C * H * W, -2, 2), *dy = frand(N * C, -1, 1),
          *dx0 = frand(N * C * H * W, -1, 1);
    char name[128];
    snprintf(name, sizeof name, "global_avgpool %lldx%lldx%lldx%lld", (long long)N, (long long)C,
             (long long)H, (long long)W);
    kcase k = {name, FR_OP_GLOBAL_AVGPOOL, {0}, 1, 1, {T32(xs, x)}, {T32(ys, NULL)}, 0, 0, 0};
    run_case(&k);
    snprintf(name, sizeof name, "global_avgpool_bwd %lldx%lldx%lldx%lld acc %u", (long long)N,
             (long long)C, (long long)H, (long long)W, acc);
    kcase kb = {name,          FR_OP_GLOBAL_AVGPOOL_BWD, {0}, 1, 1,
                {T32(ys, dy)}, {T32(xs, dx0)},           acc, 0, 0};
    run_case(&kb);
    free(x), free(dy), free(dx0);
}

static void test_embedding(int64_t B, int64_t T, int64_t V, int64_t C, int64_t Tmax, uint32_t acc) {
    const int64_t R = B * T;
    fr_shape is = fr_shape2(B, T), ws = fr_shape2(V, C), ys = fr_shape3(B, T, C),
             ps = fr_shape2(Tmax, C);
    int32_t *id = irand(R, (int32_t)(V < 5 ? V : V / 3 + 1)); /* repeats: rows add up */
    float *w = frand(V * C, -1, 1), *dy = frand(R * C, -1, 1), *dw0 = frand(V * C, -1, 1),
          *dp0 = frand(Tmax * C, -1, 1);
    char name[128];
    snprintf(name, sizeof name, "embedding %lldx%lld V %lld C %lld", (long long)B, (long long)T,
             (long long)V, (long long)C);
    kcase k = {name, FR_OP_EMBEDDING, {0}, 2, 1, {TI(is, id), T32(ws, w)}, {T32(ys, NULL)}, 0, 0,
               0};
    run_case(&k);
    snprintf(name, sizeof name, "embedding_bwd %lldx%lld V %lld C %lld acc %u", (long long)B,
             (long long)T, (long long)V, (long long)C, acc);
    kcase kb = {name,
                FR_OP_EMBEDDING_BWD,
                {0},
                2,
                2,
                {T32(ys, dy), TI(is, id)},
                {NONE, T32(ws, dw0)},
                acc,
                0,
                0};
    run_case(&kb);
    snprintf(name, sizeof name, "pos_embedding_bwd %lldx%lldx%lld Tmax %lld acc %u", (long long)B,
             (long long)T, (long long)C, (long long)Tmax, acc);
    kcase kp = {name,          FR_OP_POS_EMBEDDING_BWD, {0}, 1, 2,
                {T32(ys, dy)}, {NONE, T32(ps, dp0)},    acc, 0, 0};
    run_case(&kp);
    free(id), free(w), free(dy), free(dw0), free(dp0);
}

/* A bad label or id: the CPU's error, word for word, and nothing written. */
static void test_bad_ids(void) {
    const int64_t B = 3, T = 5, C = 7;
    int32_t y[15];
    for (int i = 0; i < 15; i++) y[i] = i % 7;
    float *z = frand(B * T * C, -1, 1), *w = frand(C * 4, -1, 1), *dy = frand(B * T * 4, -1, 1);
    const int32_t bads[] = {7, -1, 1000};
    for (int bi = 0; bi < 3; bi++) {
        y[11] = bads[bi];
        y[13] = 9;                    /* a later one: the first is named */
        for (int f = 0; f < 2; f++) { /* (B,T) and (B*T) labels */
            fr_shape zs = f ? fr_shape2(B * T, C) : fr_shape3(B, T, C);
            fr_shape ls = f ? fr_shape1(B * T) : fr_shape2(B, T);
            kcase ks[4] = {
                {"cross_entropy bad label",
                 FR_OP_CROSS_ENTROPY,
                 {.scale = 1},
                 2,
                 1,
                 {T32(zs, z), TI(ls, y)},
                 {T32(fr_shape1(1), NULL)},
                 0,
                 0,
                 0},
                {"cross_entropy_bwd bad label",
                 FR_OP_CROSS_ENTROPY_BWD,
                 {.scale = 1},
                 2,
                 1,
                 {T32(zs, z), TI(ls, y)},
                 {T32(zs, NULL)},
                 0,
                 0,
                 0},
                {"embedding bad id",
                 FR_OP_EMBEDDING,
                 {0},
                 2,
                 1,
                 {TI(ls, y), T32(fr_shape2(C, 4), w)},
                 {T32(fr_shape3(B, T, 4), NULL)},
                 0,
                 0,
                 0},
                {"embedding_bwd bad id",
                 FR_OP_EMBEDDING_BWD,
                 {0},
                 2,
                 2,
                 {T32(fr_shape3(B, T, 4), dy), TI(ls, y)},
                 {NONE, T32(fr_shape2(C, 4), NULL)},
                 0,
                 0,
                 0},
            };
            for (int i = 0; i < 4; i++) {
                side cp, dv;
                int sc = run_cpu(&ks[i], &cp), sd = run_dev(&ks[i], &dv);
                CHECK(sc == FR_ERR_ARG && sd == FR_ERR_ARG, "%s: cpu %d, device %d", ks[i].name, sc,
                      sd);
                CHECK(!strcmp(fr_last_error(g_cpu), fr_last_error(g_dev)),
                      "%s: cpu '%s', device '%s'", ks[i].name, fr_last_error(g_cpu),
                      fr_last_error(g_dev));
                if (bi == 0 && f == 0) printf("%-44s %s\n", ks[i].name, fr_last_error(g_dev));
                const targ *o = &ks[i].out[ks[i].nout - 1];
                unsigned char nanb[64];
                memset(nanb, 0xff, sizeof nanb);
                CHECK(!memcmp(dv.h[ks[i].nin + ks[i].nout - 1], nanb,
                              tbytes(o) < 64 ? tbytes(o) : 64),
                      "%s: the device wrote its output", ks[i].name);
                side_free(&ks[i], &cp), side_free(&ks[i], &dv);
            }
        }
    }
    free(z), free(w), free(dy);
}

/* The errors of a bad shape or a missing statistic, as the CPU's. */
static void test_refusals(void) {
    float x[64] = {0}, one[4] = {1, 1, 1, 1};
    fr_shape s3 = fr_shape3(2, 2, 2), s1 = fr_shape1(2);
    kcase ks[] = {
        {"batchnorm rank 3",
         FR_OP_BATCHNORM,
         {.training = 1},
         5,
         3,
         {T32(s3, x), NONE, NONE, NONE, NONE},
         {T32(s3, NULL), NONE, NONE},
         0,
         0,
         0},
        {"batchnorm eval without stats",
         FR_OP_BATCHNORM,
         {.training = 0},
         5,
         3,
         {T32(fr_shape2(2, 2), x), NONE, NONE, NONE, NONE},
         {T32(fr_shape2(2, 2), NULL), NONE, NONE},
         0,
         0,
         0},
        {"batchnorm one value a channel",
         FR_OP_BATCHNORM,
         {.training = 1},
         5,
         3,
         {T32(fr_shape2(1, 2), x), NONE, NONE, NONE, NONE},
         {T32(fr_shape2(1, 2), NULL), NONE, NONE},
         0,
         0,
         0},
        {"batchnorm_bwd without saved",
         FR_OP_BATCHNORM_BWD,
         {0},
         5,
         3,
         {T32(fr_shape2(2, 2), x), T32(fr_shape2(2, 2), x), NONE, NONE, NONE},
         {T32(fr_shape2(2, 2), NULL), NONE, NONE},
         0,
         0,
         0},
        {"layernorm bad gamma",
         FR_OP_LAYERNORM,
         {.eps = 1e-5f},
         3,
         3,
         {T32(s3, x), T32(fr_shape1(3), one), NONE},
         {T32(s3, NULL), NONE, NONE},
         0,
         0,
         0},
        {"layernorm_bwd without saved",
         FR_OP_LAYERNORM_BWD,
         {0},
         5,
         3,
         {T32(s3, x), T32(s3, x), T32(s1, one), NONE, NONE},
         {T32(s3, NULL), NONE, NONE},
         0,
         0,
         0},
        {"mse sizes",
         FR_OP_MSE,
         {0},
         2,
         1,
         {T32(s3, x), T32(s1, x)},
         {T32(fr_shape1(1), NULL)},
         0,
         0,
         0},
        {"maxpool2d too small",
         FR_OP_MAXPOOL2D,
         {.kernel = 3, .stride = 1},
         1,
         1,
         {T32(fr_shape4(1, 1, 2, 2), x)},
         {T32(fr_shape4(1, 1, 1, 1), NULL)},
         0,
         0,
         0},
        {"avgpool2d output",
         FR_OP_AVGPOOL2D,
         {.kernel = 2, .stride = 2},
         1,
         1,
         {T32(fr_shape4(1, 1, 4, 4), x)},
         {T32(fr_shape4(1, 1, 3, 3), NULL)},
         0,
         0,
         0},
        {"global_avgpool rank",
         FR_OP_GLOBAL_AVGPOOL,
         {0},
         1,
         1,
         {T32(s3, x)},
         {T32(fr_shape2(2, 2), NULL)},
         0,
         0,
         0},
        {"pos_embedding_bwd Tmax",
         FR_OP_POS_EMBEDDING_BWD,
         {0},
         1,
         2,
         {T32(s3, x)},
         {NONE, T32(fr_shape2(1, 2), NULL)},
         0,
         0,
         0},
        {"cross_entropy float labels",
         FR_OP_CROSS_ENTROPY,
         {0},
         2,
         1,
         {T32(fr_shape2(2, 2), x), T32(s1, x)},
         {T32(fr_shape1(1), NULL)},
         0,
         0,
         0},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        side cp, dv;
        int sc = run_cpu(&ks[i], &cp), sd = run_dev(&ks[i], &dv);
        CHECK(sc != FR_OK && sc == sd, "%s: cpu %d, device %d (%s)", ks[i].name, sc, sd,
              fr_last_error(g_dev));
        CHECK(!strcmp(fr_last_error(g_cpu), fr_last_error(g_dev)), "%s: cpu '%s', device '%s'",
              ks[i].name, fr_last_error(g_cpu), fr_last_error(g_dev));
        side_free(&ks[i], &cp), side_free(&ks[i], &dv);
    }
    /* a 16-bit input the device does not take */
    uint16_t h[16] = {0};
    kcase k = {"layernorm f16 x",
               FR_OP_LAYERNORM,
               {.eps = 1e-5f},
               3,
               3,
               {TH(FR_F16, fr_shape2(2, 4), h), NONE, NONE},
               {T32(fr_shape2(2, 4), NULL), NONE, NONE},
               0,
               0,
               0};
    side dv;
    CHECK(run_dev(&k, &dv) == FR_ERR_ARG && strstr(fr_last_error(g_dev), "f16"),
          "16-bit refused: %s", fr_last_error(g_dev));
    side_free(&k, &dv);
}

static void test_sumsq(size_t n, size_t off) {
    float *x = frand((int64_t)n, -3, 3);
    cl_mem m = NULL;
    CHECK(!fr_cl_alloc(g_dev, g_cl, (off + n) * 4 + 4, &m), "%s", fr_last_error(g_dev));
    if (n) fr_cl_write(g_dev, g_cl, m, off * 4, x, n * 4);
    /* the CPU's blocks, and a plain float64 sum */
    double got = -1, got2 = -2, want = fr_k_grad_sumsq(x, FR_F32, n), plain = 0;
    for (size_t i = 0; i < n; i++) plain += (double)x[i] * x[i];
    CHECK(fr_cl_sumsq(g_dev, g_cl, m, off, n, &got) == FR_OK, "%s", fr_last_error(g_dev));
    fr_cl_sumsq(g_dev, g_cl, m, off, n, &got2);
    const int fp64 = fr_cl_info_of(g_cl)->fp64;
    CHECK(got == got2, "sumsq %zu: two runs %.17g %.17g", n, got, got2);
    CHECK(fp64 ? got == want : fabs(got - want) <= 1e-5 * want, "sumsq %zu: %.17g, cpu %.17g", n,
          got, want);
    CHECK(fabs(got - plain) <= 1e-6 * plain, "sumsq %zu: %.17g, float64 %.17g", n, got, plain);
    printf("%-44s %.17g (cpu %.17g)\n", "sumsq", got, want);
    fr_cl_release(m);
    free(x);
}

/* reduce.cl as a device without cl_khr_fp64 would build it (sums in float):
 * it must compile there too. */
static void test_float_build(void) {
    const char *text = NULL;
    for (int i = 0; i < fr_cl_n_sources; i++)
        if (!strcmp(fr_cl_sources[i].file, "reduce")) text = fr_cl_sources[i].text;
    CHECK(text != NULL, "reduce.cl is embedded");
    if (!text) return;
    const char *at = strstr(text, "#ifdef cl_khr_fp64");
    CHECK(at != NULL, "reduce.cl tests cl_khr_fp64");
    if (!at) return;
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    memcpy(copy, text, n + 1);
    const char *off = "#if 0"; /* the same length, padded with spaces */
    memset(copy + (at - text), ' ', strlen("#ifdef cl_khr_fp64"));
    memcpy(copy + (at - text), off, strlen(off));
    cl_program p = NULL;
    CHECK(fr_cl_build(g_dev, g_cl, "reduce-float", copy, &p) == FR_OK, "%s", fr_last_error(g_dev));
    if (p) clReleaseProgram(p);
    free(copy);
}

int main(void) {
    if (!(g_dev = cl_device_ctx())) return 77;
    g_cpu = fr_ctx_new();
    g_cl = fr_cl_of(g_dev);
    printf("device: %s, fp64 %d\n", fr_cl_info_of(g_cl)->name, fr_cl_info_of(g_cl)->fp64);

    for (uint32_t acc = 0; acc < 2; acc++) {
        test_batchnorm(7, 13, 0, 0, 1, 1, acc ? 7u : 0u); /* (N,C) */
        test_batchnorm(3, 5, 7, 13, 1, acc, acc ? 5u : 0u);
        test_batchnorm(3, 5, 7, 13, 0, 1, acc ? 2u : 0u);
        test_layernorm(1, 7, 13, 1, acc ? 7u : 0u, 1);
        test_layernorm(3, 5, 131, acc, acc ? 5u : 0u, (int)acc);
        test_cross_entropy(13, 0, 7, acc);
        test_cross_entropy(3, 5, 13, acc);
        test_mse(7, 13, acc);
        test_pool(2, 3, 7, 13, 2, 2, acc, 1);
        test_pool(2, 3, 13, 7, 3, 2, acc, 1);
        test_pool(1, 2, 8, 9, 2, 1, acc, 0);
        test_pool(1, 2, 9, 8, 1, 1, acc, 0);
        test_pool(2, 2, 11, 13, 2, 3, acc, 1); /* gaps between windows */
        test_pool(1, 3, 10, 9, 3, 3, acc, 1);
        test_gap(2, 3, 7, 13, acc);
        test_embedding(3, 5, 13, 7, 9, acc ? 2u : 0u);
        test_embedding(1, 7, 3, 130, 7, acc ? 2u : 0u);
    }
    /* realistic sizes */
    test_batchnorm(16, 64, 16, 16, 1, 1, 0);
    test_batchnorm(64, 512, 0, 0, 1, 1, 0);
    test_layernorm(8, 64, 768, 1, 0, 1);
    test_cross_entropy(8, 64, 1000, 0);
    test_mse(256, 100, 0);
    test_pool(16, 32, 32, 32, 2, 2, 0, 0);
    test_pool(8, 16, 31, 31, 3, 2, 1, 0);
    test_gap(32, 256, 8, 8, 0);
    test_embedding(8, 64, 1000, 128, 128, 2u);
    test_bad_ids();
    test_refusals();
    test_sumsq(0, 0);
    test_sumsq(7, 3);
    test_sumsq(2048 * 5 + 13, 16);
    test_sumsq(1000003, 0);
    test_float_build();
    { /* the step's passes need the device's memory: a context without it is refused */
        double q;
        int64_t h;
        cl_mem m = NULL;
        fr_cl_alloc(g_dev, g_cl, 64, &m);
        CHECK(fr_cl_sumsq(g_cpu, g_cl, m, 0, 4, &q) == FR_ERR_ARG &&
                  strstr(fr_last_error(g_cpu), "fr_cl_use"),
              "sumsq without the device: %s", fr_last_error(g_cpu));
        CHECK(fr_cl_hits(g_cpu, g_cl, m, 0, m, 0, 2, 2, &h) == FR_ERR_ARG, "hits without: %s",
              fr_last_error(g_cpu));
        fr_cl_release(m);
    }

    fr_cl_unuse(g_dev);
    fr_ctx_free(g_dev), fr_ctx_free(g_cpu);
    return check_done();
}
#endif
