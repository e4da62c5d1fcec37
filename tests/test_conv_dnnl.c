/* test_conv_dnnl.c — CONV2D and CONV2D_BWD on both CPU paths, oneDNN's
 * primitives (backend/cpu/conv_dnnl.c) and im2col / shifted GEMMs (conv.c),
 * against a float64 direct convolution computed here: strides 1 and 2,
 * paddings 0, 1, 2, kernels 1, 3, 5, odd and non-square images, batch 1 and
 * 3, channels 1 to 17, with and without bias, outputs overwritten and added
 * into; an image in bf16; a batch cut in chunks (oneDNN's reordered copies
 * over their budget); the same call twice gives the same bits; a thread
 * count changed after the workspace was sized (1 -> 2 and 2 -> 1); and a
 * CNN step compiled on 1 thread and run on 2 (and the reverse) with
 * predicted = measured step memory.
 *
 * Bound: every output is a sum of n products of f32 values (n = C K K for
 * y, OC K K for dx, N OH OW for dW), each product exact to u = 2^-24 and
 * each sum within n u sum |terms| in any order (recursive summation's
 * gamma_n); an added-into output or the bias is one more term, a sum over
 * chunks of dW as many more. Checked at (n + 4) u sum |terms| (+ 1e-30).
 *
 * The path is chosen once per process by FRUGAL_CONV, so the test runs
 * itself three times: FRUGAL_CONV=gemm, unset (bf16 images on oneDNN where
 * the CPU has native bf16, f32 on the GEMMs) and =dnnl (skipped, with a
 * message, where the build has no oneDNN). The CNN step's predicted =
 * measured memory is checked in fp32 and bf16-mixed on each. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backend/cpu/conv_dnnl.h"
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"
#include "train/step.h"

static fr_ctx *g_ctx;
static uint64_t g_seed = 11;
static const double U = 1.0 / 16777216.0; /* 2^-24 */

typedef struct geo {
    int N, C, H, W, OC, K, S, P;
} geo;

static int out_size(int h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; }

static float *rand_f(int64_t n, int half) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 5);
    for (int64_t i = 0; i < n; i++) {
        v[i] = -1.0f + 2.0f * fr_rng_next_uniform(&r);
        if (half) v[i] = fr_bf16_to_f32(fr_f32_to_bf16(v[i]));
    }
    return v;
}

static fr_tensor tens(fr_dtype dt, fr_shape s, void *data) {
    fr_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt, t.shape = s, t.data = data;
    return t;
}

static fr_shape shape4(const geo *g, int64_t c, int64_t h, int64_t w) {
    return fr_shape4(g->N, c, h, w);
}

/* worst-case rounding bound of a sum of n terms whose magnitudes add to mag,
 * each term off by at most rel of itself before the sum (its operands'
 * rounding to bf16: 0 for f32 operands) */
static double bound(int64_t n, double mag, double rel) {
    return (rel + (double)(n + 4) * U * (1.0 + rel)) * mag + 1e-30;
}

/* counts the outputs outside their bound, reports the first */
static void compare(int line, const char *what, const geo *g, const float *got, const double *ref,
                    const double *mag, int64_t count, int64_t n, double rel) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < count; i++)
        if (!(fabs(got[i] - ref[i]) <= bound(n, mag[i], rel)) && bad++ == 0) first = i;
    CHECK_AT(line, bad == 0,
             "%s of N%d C%d %dx%d OC%d K%d S%d P%d: %lld of %lld outside the bound, first [%lld] "
             "%.9g vs %.9g (bound %.3g)",
             what, g->N, g->C, g->H, g->W, g->OC, g->K, g->S, g->P, (long long)bad,
             (long long)count, (long long)first, first >= 0 ? got[first] : 0.0,
             first >= 0 ? ref[first] : 0.0, first >= 0 ? bound(n, mag[first], rel) : 0.0);
}

/* x (N,C,H,W), w (OC,C,K,K) at (n, oc, c, oh, ow, kh, kw): the input index
 * (or -1 outside the image: padding) */
static int64_t x_at(const geo *g, int n, int c, int oh, int ow, int kh, int kw) {
    int ih = oh * g->S - g->P + kh, iw = ow * g->S - g->P + kw;
    if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) return -1;
    return (((int64_t)n * g->C + c) * g->H + ih) * g->W + iw;
}

typedef struct bufs {
    float *x, *w, *b, *dy, *y, *dx, *dw, *db, *y0, *dx0, *dw0, *db0;
    uint16_t *xh; /* x in bf16 when the image is half */
    double *ry, *my, *rdx, *mdx, *rdw, *mdw, *rdb, *mdb;
} bufs;

/* float64 references and their magnitudes: y (with bias and the prior value
 * when acc), dx, dW, db (each with the prior value when acc) */
static void reference(const geo *g, bufs *B, int bias, int acc) {
    int OH = out_size(g->H, g->K, g->S, g->P), OW = out_size(g->W, g->K, g->S, g->P);
    int64_t nx = (int64_t)g->N * g->C * g->H * g->W, nw = (int64_t)g->OC * g->C * g->K * g->K;
    for (int64_t i = 0; i < nx; i++) B->rdx[i] = acc ? B->dx0[i] : 0, B->mdx[i] = fabs(B->rdx[i]);
    for (int64_t i = 0; i < nw; i++) B->rdw[i] = acc ? B->dw0[i] : 0, B->mdw[i] = fabs(B->rdw[i]);
    for (int oc = 0; oc < g->OC; oc++)
        B->rdb[oc] = acc ? B->db0[oc] : 0, B->mdb[oc] = fabs(B->rdb[oc]);
    for (int n = 0; n < g->N; n++)
        for (int oc = 0; oc < g->OC; oc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    int64_t yi = (((int64_t)n * g->OC + oc) * OH + oh) * OW + ow;
                    double s = bias ? B->b[oc] : 0, m = fabs(s), dy = B->dy[yi];
                    B->rdb[oc] += dy, B->mdb[oc] += fabs(dy);
                    for (int c = 0; c < g->C; c++)
                        for (int kh = 0; kh < g->K; kh++)
                            for (int kw = 0; kw < g->K; kw++) {
                                int64_t xi = x_at(g, n, c, oh, ow, kh, kw);
                                if (xi < 0) continue;
                                int64_t wi = (((int64_t)oc * g->C + c) * g->K + kh) * g->K + kw;
                                double xv = B->x[xi], wv = B->w[wi];
                                s += wv * xv, m += fabs(wv * xv);
                                B->rdx[xi] += wv * dy, B->mdx[xi] += fabs(wv * dy);
                                B->rdw[wi] += xv * dy, B->mdw[wi] += fabs(xv * dy);
                            }
                    B->ry[yi] = s, B->my[yi] = m;
                }
}

static fr_node conv_node(const geo *g) {
    fr_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = FR_OP_CONV2D;
    nd.attr.kernel = g->K, nd.attr.stride = g->S, nd.attr.pad = g->P;
    nd.fwd = -1;
    return nd;
}

/* runs CONV2D and CONV2D_BWD on B's buffers; ws_threads: the thread count
 * the workspace is sized for (0: the current one); budget > 0: oneDNN's
 * kernels called directly with that budget for their reordered copies (db
 * is then not computed: it is conv.c's), 0: the ops as the step runs them */
static int run_conv(const geo *g, bufs *B, int bias, int acc, int half, int ws_threads,
                    int64_t budget) {
    int OH = out_size(g->H, g->K, g->S, g->P), OW = out_size(g->W, g->K, g->S, g->P);
    fr_shape xs = shape4(g, g->C, g->H, g->W), ys = shape4(g, g->OC, OH, OW);
    fr_shape wsh = fr_shape4(g->OC, g->C, g->K, g->K);
    int64_t nx = fr_shape_numel(&xs), nw = fr_shape_numel(&wsh);
    int now = omp_get_max_threads();
    if (ws_threads) omp_set_num_threads(ws_threads);
    fr_conv_dims d;
    fr_conv_dims_make(&d, &xs, g->OC, g->K, g->S, g->P);
    fr_dtype xdt = half ? FR_BF16 : FR_F32;
    int th = omp_get_max_threads();
    int64_t wf = budget ? fr_conv_dnnl_ws(&d, budget, 0, bias, xdt, th, 0)
                        : fr_conv2d_ws_elems(&xs, xdt, g->OC, g->K, g->S, g->P, 0, 0);
    int64_t wb = budget ? fr_conv_dnnl_ws(&d, budget, 1, 0, xdt, th, 0)
                        : fr_conv2d_ws_elems(&xs, xdt, g->OC, g->K, g->S, g->P, 1, 0);
    if (ws_threads) omp_set_num_threads(now);
    float *wsf = malloc((size_t)(wf ? wf : 1) * sizeof(float)),
          *wsb = malloc((size_t)(wb ? wb : 1) * sizeof(float));
    fr_node nd = conv_node(g);
    fr_kernel_call c;
    memset(&c, 0, sizeof c);
    c.ctx = g_ctx, c.node = &nd;
    c.in[0] = half ? tens(FR_BF16, xs, B->xh) : tens(FR_F32, xs, B->x);
    c.in[1] = tens(FR_F32, wsh, B->w);
    c.in[2] = tens(FR_F32, fr_shape1(g->OC), bias ? B->b : NULL);
    c.out[0] = tens(FR_F32, ys, B->y);
    c.out[1] = tens(FR_F32, fr_shape1(wf), wsf);
    int st = budget ? fr_conv_dnnl_fwd(&c, &d, budget) : fr_k_conv2d(&c);
    if (st == FR_OK) {
        if (acc) {
            memcpy(B->dx, B->dx0, (size_t)nx * sizeof(float));
            memcpy(B->dw, B->dw0, (size_t)nw * sizeof(float));
            memcpy(B->db, B->db0, (size_t)g->OC * sizeof(float));
        }
        nd.op = FR_OP_CONV2D_BWD;
        memset(&c, 0, sizeof c);
        c.ctx = g_ctx, c.node = &nd, c.accumulate = acc ? 7u : 0u;
        c.in[0] = tens(FR_F32, ys, B->dy);
        c.in[1] = half ? tens(FR_BF16, xs, B->xh) : tens(FR_F32, xs, B->x);
        c.in[2] = tens(FR_F32, wsh, B->w);
        c.out[0] = tens(FR_F32, xs, B->dx);
        c.out[1] = tens(FR_F32, wsh, B->dw);
        c.out[2] = tens(FR_F32, fr_shape1(g->OC), B->db);
        c.out[3] = tens(FR_F32, fr_shape1(wb), wsb);
        st = budget ? fr_conv_dnnl_bwd(&c, &d, budget, B->dx, B->dw) : fr_k_conv2d_bwd(&c);
    }
    free(wsf), free(wsb);
    return st;
}

static void bufs_make(const geo *g, bufs *B, int half) {
    int OH = out_size(g->H, g->K, g->S, g->P), OW = out_size(g->W, g->K, g->S, g->P);
    int64_t nx = (int64_t)g->N * g->C * g->H * g->W, ny = (int64_t)g->N * g->OC * OH * OW;
    int64_t nw = (int64_t)g->OC * g->C * g->K * g->K;
    memset(B, 0, sizeof *B);
    B->x = rand_f(nx, half), B->w = rand_f(nw, 0), B->b = rand_f(g->OC, 0);
    B->dy = rand_f(ny, 0), B->dx0 = rand_f(nx, 0), B->dw0 = rand_f(nw, 0);
    B->db0 = rand_f(g->OC, 0);
    B->y = calloc((size_t)ny, sizeof(float)), B->dx = calloc((size_t)nx, sizeof(float));
    B->dw = calloc((size_t)nw, sizeof(float)), B->db = calloc((size_t)g->OC, sizeof(float));
    B->xh = malloc((size_t)nx * 2);
    for (int64_t i = 0; i < nx; i++) B->xh[i] = fr_f32_to_bf16(B->x[i]);
    B->ry = malloc((size_t)ny * sizeof(double)), B->my = malloc((size_t)ny * sizeof(double));
    B->rdx = malloc((size_t)nx * sizeof(double)), B->mdx = malloc((size_t)nx * sizeof(double));
    B->rdw = malloc((size_t)nw * sizeof(double)), B->mdw = malloc((size_t)nw * sizeof(double));
    B->rdb = malloc((size_t)g->OC * sizeof(double)),
    B->mdb = malloc((size_t)g->OC * sizeof(double));
}

static void bufs_free(bufs *B) {
    void *p[] = {B->x,  B->w,   B->b,   B->dy,  B->y,   B->dx,  B->dw,
                 B->db, B->y0,  B->dx0, B->dw0, B->db0, B->xh,  B->ry,
                 B->my, B->rdx, B->mdx, B->rdw, B->mdw, B->rdb, B->mdb};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
}

/* one geometry: the kernels against the reference (budget: run_conv's;
 * rel: bound's, the operands' rounding) */
static void check_budget(int line, const geo *g, int bias, int acc, int half, int ws_threads,
                         int64_t budget, double rel) {
    bufs B;
    bufs_make(g, &B, half);
    reference(g, &B, bias, acc);
    int st = run_conv(g, &B, bias, acc, half, ws_threads, budget);
    CHECK_AT(line, st == FR_OK, "N%d C%d %dx%d OC%d K%d S%d P%d: %s", g->N, g->C, g->H, g->W, g->OC,
             g->K, g->S, g->P, fr_last_error(g_ctx));
    if (st == FR_OK) {
        int OH = out_size(g->H, g->K, g->S, g->P), OW = out_size(g->W, g->K, g->S, g->P);
        int64_t nx = (int64_t)g->N * g->C * g->H * g->W, ny = (int64_t)g->N * g->OC * OH * OW;
        int64_t nw = (int64_t)g->OC * g->C * g->K * g->K, ckk = (int64_t)g->C * g->K * g->K;
        /* dW's sums may add the chunks of the batch one by one: up to N more terms */
        compare(line, "y", g, B.y, B.ry, B.my, ny, ckk + 1, rel);
        compare(line, "dx", g, B.dx, B.rdx, B.mdx, nx, (int64_t)g->OC * g->K * g->K + 1, rel);
        compare(line, "dW", g, B.dw, B.rdw, B.mdw, nw, (int64_t)g->N * OH * OW + g->N + 1, rel);
        if (!budget)
            compare(line, "db", g, B.db, B.rdb, B.mdb, g->OC, (int64_t)g->N * OH * OW + 1, 0.0);
    }
    bufs_free(&B);
}

static void check_case(int line, const geo *g, int bias, int acc, int half, int ws_threads) {
    check_budget(line, g, bias, acc, half, ws_threads, 0, 0.0);
}

/* the sweep: strides, paddings, kernels, batch, channel pairs, odd sizes */
static void test_geometries(void) {
    static const int ch[][2] = {{1, 5}, {3, 16}, {8, 1}, {17, 17}, {16, 8}};
    int cases = 0;
    for (int s = 1; s <= 2; s++)
        for (int p = 0; p <= 2; p++)
            for (int k = 1; k <= 5; k += 2)
                for (int n = 1; n <= 3; n += 2)
                    for (int c = 0; c < 5; c++) {
                        geo g = {n, ch[c][0], 7 + 2 * (c % 2), 9 - 2 * (c % 3 == 0), ch[c][1], k,
                                 s, p};
                        if (g.H + 2 * p < k || g.W + 2 * p < k) continue;
                        check_case(__LINE__, &g, cases % 2, cases % 3 == 0, 0, 0);
                        cases++;
                    }
    printf("%d geometries\n", cases);
}

/* Native bf16 convolutions round W and dy to bf16 (the image is bf16
 * already): each product's operands are each within 2^-8 of their value,
 * so the product within 2 2^-8 + 2^-16 of the exact one; then f32 sums. */
static int bf16_native(void) { return fr_conv_dnnl_for(FR_BF16) && fr_gemm16_native(FR_BF16); }
static double bf16_rel(void) { return bf16_native() ? 2.0 / 256 + 1.0 / 65536 : 0.0; }

/* the image in bf16 (the mixed-precision pass binds it so where the kernel
 * reads it: a "same" convolution on the GEMM path, any on oneDNN's): the
 * f32 convolution of its exact widened values on the GEMM path, within
 * bf16's rounding of W and dy on oneDNN's native bf16 kernels */
static void test_bf16_image(void) {
    geo a = {3, 16, 11, 9, 16, 3, 1, 1}, b = {2, 5, 9, 9, 7, 3, 2, 1};
    check_budget(__LINE__, &a, 0, 0, 1, 0, 0, bf16_rel());
    if (fr_conv_dnnl_for(FR_BF16)) check_budget(__LINE__, &b, 1, 1, 1, 0, 0, bf16_rel());
}

/* oneDNN's bf16 primitives (where the CPU has bf16 kernels): chosen for a
 * bf16 image, and the sweep's strides, paddings, kernels, odd sizes and
 * batch 1 within the bf16 bound */
static void test_bf16_native(void) {
    if (!fr_conv_dnnl_for(FR_BF16)) return;
    if (!bf16_native()) {
        printf("skipped native bf16 convolutions: oneDNN has no bf16 kernels on this CPU\n");
        return;
    }
    fr_shape xs = fr_shape4(2, 16, 9, 9);
    fr_conv_dims d;
    fr_conv_dims_make(&d, &xs, 32, 3, 1, 1);
    const char *impl = fr_conv_dnnl_impl(&d, FR_BF16);
    printf("oneDNN bf16 convolution: %s\n", impl);
    CHECK(strstr(impl, "bf16") != NULL, "a bf16 image ran on %s, not a bf16 kernel", impl);
    static const geo gs[] = {{2, 16, 9, 9, 32, 3, 1, 1},  {1, 3, 7, 9, 16, 3, 1, 1},
                             {3, 17, 9, 7, 5, 5, 2, 2},   {1, 32, 8, 8, 17, 1, 2, 0},
                             {2, 8, 11, 11, 16, 3, 2, 0}, {4, 64, 7, 7, 64, 3, 1, 1}};
    for (size_t i = 0; i < sizeof gs / sizeof *gs; i++)
        check_budget(__LINE__, &gs[i], (int)(i % 2), i % 3 == 0, 1, 0, 0, bf16_rel());
    /* a bf16 y in nChw16c (bf16-mixed's blocked CNN) is written by the
     * primitive itself, its f32 sums rounded as they are stored: its
     * workspace holds no f32 copy of y for a reorder to round, as an f32
     * y's holds none */
    fr_shape bs = fr_shape4(16, 32, 14, 14);
    fr_conv_dims e;
    fr_conv_dims_make(&e, &bs, 64, 3, 1, 1);
    const int blk = FR_CONV_BLK_X | FR_CONV_BLK_Y;
    const int64_t ycopy = (int64_t)16 * 64 * 14 * 14;
    const int64_t w32 = fr_conv_dnnl_ws(&e, (int64_t)1 << 26, 0, 0, FR_BF16, 2, blk),
                  w16 = fr_conv_dnnl_ws(&e, (int64_t)1 << 26, 0, 0, FR_BF16, 2, blk | FR_CONV_Y16);
    CHECK(w16 > 0 && w16 < ycopy && w32 < ycopy,
          "a blocked bf16 y: %lld floats of workspace (f32 y: %lld), an f32 copy of y is %lld",
          (long long)w16, (long long)w32, (long long)ycopy);
}

/* a batch whose reordered copies exceed oneDNN's chunk budget (an image's
 * copies in nChw16c: 16 x 81 + 16 x 49 = 2080 floats; a budget of 3
 * images): 5 images go as chunks of 3 and 2, two primitives, dW summed
 * over the chunks; and a budget under one image (chunks of one) */
static void test_chunks(void) {
    if (!fr_conv_dnnl_on()) return;
    geo g = {5, 16, 9, 9, 16, 3, 1, 0};
    check_budget(__LINE__, &g, 1, 0, 0, 0, 3 * 2080, 0.0);
    check_budget(__LINE__, &g, 0, 1, 0, 0, 3 * 2080, 0.0);
    check_budget(__LINE__, &g, 1, 1, 1, 0, 100, bf16_rel());
}

/* the same call twice: the same bits (2 threads, backward-weights summing
 * the threads' partial sums) */
static void test_determinism(void) {
    geo g = {4, 16, 14, 14, 32, 3, 1, 1};
    bufs A, B;
    g_seed = 99, bufs_make(&g, &A, 0);
    g_seed = 99, bufs_make(&g, &B, 0);
    int sa = run_conv(&g, &A, 1, 0, 0, 0, 0), sb = run_conv(&g, &B, 1, 0, 0, 0, 0);
    CHECK(sa == FR_OK && sb == FR_OK, "determinism runs: %s", fr_last_error(g_ctx));
    int64_t ny = 4 * 32 * 14 * 14, nx = 4 * 16 * 14 * 14, nw = 32 * 16 * 9;
    CHECK(memcmp(A.y, B.y, (size_t)ny * 4) == 0, "y differs between two runs");
    CHECK(memcmp(A.dx, B.dx, (size_t)nx * 4) == 0, "dx differs between two runs");
    CHECK(memcmp(A.dw, B.dw, (size_t)nw * 4) == 0, "dW differs between two runs");
    bufs_free(&A), bufs_free(&B);
}

/* the workspace sized on 1 thread and the kernels run on 2, and the reverse */
static void test_threads_changed(void) {
    geo g = {6, 16, 14, 14, 32, 3, 1, 1}, h = {4, 32, 13, 13, 17, 3, 2, 1};
    omp_set_num_threads(2);
    check_case(__LINE__, &g, 1, 0, 0, 1);
    check_case(__LINE__, &h, 0, 1, 0, 1);
    omp_set_num_threads(1);
    check_case(__LINE__, &g, 1, 1, 0, 2);
    check_case(__LINE__, &h, 0, 0, 0, 2);
    omp_set_num_threads(2);
}

/* A CNN step compiled on one thread count and run on another: it runs, and
 * the step's measured activations and workspace reach exactly the plan's. */
static void test_step_threads(int t_compile, int t_run, fr_precision prec) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_load(ctx, "cnn");
    CHECK(m != NULL, "load cnn: %s", fr_last_error(ctx));
    if (!m) {
        fr_ctx_free(ctx);
        return;
    }
    fr_set_threads(ctx, t_compile);
    int n = 8, d = 28 * 28;
    fr_step_opts o = {.batch = n,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .precision = prec};
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    if (s && prec == FR_PREC_BF16_MIXED && fr_conv_dnnl_for(FR_BF16)) {
        /* every convolution reads its image in bf16, so it runs on oneDNN;
         * but the first, whose image is the batch (f32, not rounded) */
        int convs = 0, bf16 = 0;
        for (size_t i = 0; i < s->g.n_nodes; i++) {
            const fr_node *nd = &s->g.nodes[i];
            const int x = nd->op == FR_OP_CONV2D       ? nd->in[0]
                          : nd->op == FR_OP_CONV2D_BWD ? nd->in[1]
                                                       : -1;
            if (x < 0 || x == s->g.input) continue;
            convs++;
            bf16 += s->g.vals[x].dtype == FR_BF16;
        }
        CHECK(convs > 0 && bf16 == convs,
              "bf16-mixed: %d of %d convolution nodes read a bf16 image", bf16, convs);
    }
    if (s) {
        fr_set_threads(ctx, t_run);
        float *x = rand_f((int64_t)n * d, 0);
        int32_t y[8];
        for (int i = 0; i < n; i++) y[i] = i % 10;
        fr_mem_stats after;
        fr_mem_reset_peak(ctx);
        fr_batch b = {n, x, y, NULL, NULL};
        float loss;
        int st = fr_step_run(s, &b, &loss, NULL);
        CHECK(st == FR_OK, "%s, compiled on %d threads, run on %d: %s", fr_precision_name(prec),
              t_compile, t_run, fr_last_error(ctx));
        fr_mem_get_stats(ctx, &after);
        CHECK(after.allocated_peak[FR_MEM_ACTIVATIONS] == s->plan.peak[FR_MEM_ACTIVATIONS],
              "%s: activations: measured %zu, predicted %zu", fr_precision_name(prec),
              after.allocated_peak[FR_MEM_ACTIVATIONS], s->plan.peak[FR_MEM_ACTIVATIONS]);
        /* the arena's workspace and the step's GEMM scratch (the linear
         * layers' oneDNN matmuls), held beside it */
        size_t held = s->place.scratch ? s->place.gemm_ws * sizeof(float) : 0;
        CHECK(after.allocated_peak[FR_MEM_WORKSPACE] == s->plan.peak[FR_MEM_WORKSPACE] + held,
              "%s: workspace: measured %zu, predicted %zu + the GEMM scratch %zu",
              fr_precision_name(prec), after.allocated_peak[FR_MEM_WORKSPACE],
              s->plan.peak[FR_MEM_WORKSPACE], held);
        free(x);
        fr_step_free(s);
    }
    fr_model_free(m);
    fr_set_threads(ctx, 2);
    fr_ctx_free(ctx);
}

/* one path, in this process */
static int run_all(const char *mode) {
    g_ctx = fr_ctx_new();
    int dnnl = fr_conv_dnnl_on();
    CHECK(dnnl == (strcmp(mode, "dnnl") == 0), "FRUGAL_CONV=%s: oneDNN path %s", mode,
          dnnl ? "on" : "off");
    /* unset: bf16 images on oneDNN where the CPU has native bf16, f32 never */
    if (strcmp(mode, "auto") == 0) {
        CHECK(!fr_conv_dnnl_for(FR_F32) && !fr_conv_dnnl_for(FR_F16),
              "FRUGAL_CONV unset: an f32 or f16 image on oneDNN");
        CHECK(fr_conv_dnnl_for(FR_BF16) == (fr_conv_dnnl_built() && fr_gemm16_native(FR_BF16)),
              "FRUGAL_CONV unset: a bf16 image %s oneDNN",
              fr_conv_dnnl_for(FR_BF16) ? "on" : "off");
        if (!fr_conv_dnnl_for(FR_BF16))
            printf("FRUGAL_CONV unset: bf16 images on the GEMMs (no native bf16 here)\n");
    }
    if (dnnl) { /* oneDNN takes every geometry of the sweep (none falls back) */
        fr_shape xs = fr_shape4(3, 17, 7, 9);
        fr_conv_dims g;
        fr_conv_dims_make(&g, &xs, 5, 5, 2, 2);
        printf("oneDNN convolution: %s\n", fr_conv_dnnl_impl(&g, FR_F32));
        CHECK(fr_conv_dnnl_ws(&g, 1 << 20, 1, 0, FR_F32, 1, 0) > 0,
              "oneDNN declined a 5x5 stride 2");
    }
    omp_set_num_threads(2);
    test_geometries();
    test_bf16_image();
    test_bf16_native();
    test_chunks();
    test_determinism();
    test_threads_changed();
    test_step_threads(1, 2, FR_PREC_FP32);
    test_step_threads(2, 1, FR_PREC_FP32);
    test_step_threads(1, 2, FR_PREC_BF16_MIXED);
    test_step_threads(2, 1, FR_PREC_BF16_MIXED);
    fr_ctx_free(g_ctx);
    return check_done();
}

/* this program again with FRUGAL_CONV=mode; its exit status */
static int child(const char *self, const char *mode) {
    pid_t pid = fork();
    if (pid == 0) {
        if (strcmp(mode, "auto") == 0) unsetenv("FRUGAL_CONV");
        else setenv("FRUGAL_CONV", mode, 1);
        execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(int argc, char **argv) {
    if (argc > 1) return run_all(argv[1]);
    int built = fr_conv_dnnl_built();
    int rg = child(argv[0], "gemm");
    CHECK(rg == 0, "FRUGAL_CONV=gemm: exit status %d", rg);
    int ra = child(argv[0], "auto");
    CHECK(ra == 0, "FRUGAL_CONV unset: exit status %d", ra);
    if (built) {
        int rd = child(argv[0], "dnnl");
        CHECK(rd == 0, "FRUGAL_CONV=dnnl: exit status %d", rd);
    } else {
        printf("skipped FRUGAL_CONV=dnnl: built without oneDNN\n");
    }
    return check_done();
}
