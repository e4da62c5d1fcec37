/* test_opencl_gemm.c — LINEAR, LINEAR_BWD, CONV2D and CONV2D_BWD on the
 * OpenCL device (src/backend/opencl/gemm.c) against the CPU kernels on the
 * same inputs (the CPU kernels are checked against float64 and PyTorch in
 * test_kernels.c and test_torch_ref.c).
 *
 * Bounds. The products are sums reassociated by CLBlast (its tiles, its
 * order) where OpenBLAS has its own, so an element may differ by a few
 * roundings of the terms it sums: |dev - cpu| <= 1e-5 M, M being the same
 * output computed on the absolute values of every input and initial value
 * (sum |a||b| + |bias| + |accumulated|; the CPU kernel on |inputs| gives it
 * exactly), i.e. about 170 float epsilons of the terms' magnitude, the
 * worst case for a depth of ~170 and far above the typical sqrt(depth) of
 * a few. The bias gradients are summed on the device in double in the CPU's
 * order, so they are compared bit for bit where the device has cl_khr_fp64
 * (else under the same bound); so is the SGD step on the bias. A 16-bit
 * image (f16, bf16) must give the bits of the device call on its widened
 * f32 copy (the unroll widens exactly); that f32 call is compared with the
 * CPU's.
 *
 * Every device call runs twice from the same initial contents: the bits
 * must be the same. Outputs start as NaN (0xFF bytes) when not accumulated,
 * so an output not overwritten shows; tensors sit 64 bytes into their
 * buffers with 64 bytes after, which must stay untouched. Shapes: small
 * odd sizes (7, 13), (B, T, K) rows, strides, padding, 1x1, a kernel as
 * large as the padded image, chunked workspaces, and one realistic size per
 * op; accumulate bits on and off; absent bias and absent outputs. Refusals:
 * bad shapes, a workspace too small.
 *
 * The step's GEMM scratch (gemm.c): the weight's fused SGD step (update bit
 * 1) must give the bits of the step computed here, on the host, from the
 * device's kept gradient (W + (-lr)(g + wd W), fr_k_sgd's float operations),
 * and be refused without scratch. A GEMM large enough for CLBlast's
 * indirect kernel (CLBlastSGemmTempBufferSize > 0, asked here directly) runs
 * with the planned scratch (fr_cl_ws_gemm, at least what CLBlast asks) and
 * matches the CPU, and is refused, naming the bytes, with a scratch too
 * small or none: CLBlast never allocates its own.
 * Returns 77 (skipped) without a device. */
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
#include "backend/cpu/kernels.h"
#include "backend/opencl/gemm.h"
#include "core/half.h"
#include <clblast_c.h>

static fr_ctx *g_cpu, *g_dev;
static fr_cl *g_cl;
static int g_fp64;

#define TOL 1e-5
#define GUARD 64 /* bytes before and after each device tensor */

static unsigned long long g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}
static float *frand(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = urand();
    return p;
}
static float *fabs_copy(const float *p, int64_t n) {
    if (!p) return NULL;
    float *q = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) q[i] = fabsf(p[i]);
    return q;
}

/* ---- one call of an op, on the CPU and on the device ---- */

typedef struct opcall {
    fr_op op;
    fr_attr attr;
    fr_tensor in[3];  /* host data; NULL: absent */
    fr_tensor out[4]; /* shape and dtype; data: the initial contents (NULL: none given) */
    int want[4];      /* the output is present */
    uint32_t acc, update;
    float lr, wd;
} opcall;

static int64_t numel(const fr_tensor *t) { return fr_shape_numel(&t->shape); }
static size_t nbytes(const fr_tensor *t) { return (size_t)numel(t) * fr_dtype_size(t->dtype); }

/* CPU: out[j] (wanted) into res[j], starting from out[j].data or zeros */
static int run_cpu(const opcall *k, float *res[4]) {
    fr_node node = {.op = k->op, .fwd = -1, .attr = k->attr, .update = k->update};
    node.attr.lr = k->lr, node.attr.wd = k->wd; /* the SGD step of the update bits */
    fr_kernel_call c = {.ctx = g_cpu, .node = &node, .accumulate = k->acc};
    for (int i = 0; i < 3; i++) c.in[i] = k->in[i];
    for (int j = 0; j < 4; j++) {
        c.out[j] = k->out[j];
        c.out[j].data = NULL;
        if (!k->want[j]) continue;
        size_t b = nbytes(&k->out[j]);
        if (k->out[j].data) memcpy(res[j], k->out[j].data, b);
        else memset(res[j], 0, b);
        c.out[j].data = res[j];
    }
    return fr_cpu_backend.kernels[k->op](&c);
}

static cl_mem g_bufs[16];
static int64_t g_scratch; /* floats of GEMM scratch run_dev gives (fr_kernel_call.grad_ws) */
static int g_nbufs;

/* a device tensor GUARD bytes into a buffer of 0xFF bytes (a NaN in every
 * float format), holding host (when given) */
static fr_tensor dev_put(const fr_tensor *h, const void *host) {
    size_t b = nbytes(h), total = GUARD + b + GUARD;
    cl_mem m = NULL;
    if (fr_cl_alloc(g_dev, g_cl, total, &m) != FR_OK) {
        CHECK(0, "alloc: %s", fr_last_error(g_dev));
        return (fr_tensor){0};
    }
    unsigned char *ff = malloc(total);
    memset(ff, 0xFF, total);
    if (host) memcpy(ff + GUARD, host, b);
    CHECK(fr_cl_write(g_dev, g_cl, m, 0, ff, total) == FR_OK, "%s", fr_last_error(g_dev));
    free(ff);
    g_bufs[g_nbufs++] = m;
    return (fr_tensor){.dtype = h->dtype, .shape = h->shape, .buf = m, .off = GUARD};
}

/* reads t back into host; 0 if a guard byte changed */
static int dev_get(const fr_tensor *t, void *host) {
    size_t b = nbytes(t), total = GUARD + b + GUARD;
    unsigned char *all = malloc(total);
    CHECK(fr_cl_read(g_dev, g_cl, fr_cl_mem(t), 0, all, total) == FR_OK, "%s",
          fr_last_error(g_dev));
    memcpy(host, all + GUARD, b);
    int ok = 1;
    for (size_t i = 0; i < GUARD; i++) ok &= all[i] == 0xFF && all[GUARD + b + i] == 0xFF;
    free(all);
    return ok;
}

static void dev_free_all(void) {
    for (int i = 0; i < g_nbufs; i++) fr_cl_release(g_bufs[i]);
    g_nbufs = 0;
}

/* Device: as run_cpu; the workspace (out[ws_j]) of ws_elems floats. */
static int run_dev(const opcall *k, int ws_j, int64_t ws_elems, float *res[4]) {
    fr_node node = {.op = k->op, .fwd = -1, .attr = k->attr, .update = k->update};
    node.attr.lr = k->lr, node.attr.wd = k->wd; /* the SGD step of the update bits */
    fr_kernel_call c = {.ctx = g_dev, .node = &node, .accumulate = k->acc};
    for (int i = 0; i < 3; i++) {
        c.in[i] = k->in[i];
        c.in[i].data = NULL;
        if (k->in[i].data) c.in[i] = dev_put(&k->in[i], k->in[i].data);
    }
    for (int j = 0; j < 4; j++) {
        c.out[j] = k->out[j];
        c.out[j].data = NULL;
        if (j == ws_j) {
            c.out[j].shape = fr_shape1(ws_elems);
            if (ws_elems > 0) c.out[j] = dev_put(&c.out[j], NULL);
        } else if (k->want[j]) {
            c.out[j] = dev_put(&k->out[j], k->out[j].data);
        }
    }
    if (g_scratch > 0) {
        fr_tensor sc = {.dtype = FR_F32, .shape = fr_shape1(g_scratch)};
        sc = dev_put(&sc, NULL);
        c.grad_ws = (float *)(void *)fr_cl_mem(&sc); /* a whole buffer, from 0 */
        c.grad_ws_len = (size_t)g_scratch;
    }
    int st = fr_cl_backend.kernels[k->op](&c);
    if (st == FR_OK) CHECK(fr_cl_finish(g_dev, g_cl) == FR_OK, "%s", fr_last_error(g_dev));
    for (int j = 0; j < 4 && st == FR_OK; j++)
        if (k->want[j] && j != ws_j)
            CHECK(dev_get(&c.out[j], res[j]), "out[%d]: a byte around the tensor was written", j);
    dev_free_all();
    return st;
}

/* |got - want| <= TOL mag everywhere (exact: got == want bit for bit) */
static void compare(int line, const char *what, const float *got, const float *want,
                    const float *mag, int64_t n, int exact) {
    double worst = 0; /* the largest |d| / mag (exact: count of differing values) */
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (exact) {
            if (memcmp(&got[i], &want[i], sizeof(float))) worst++, at = at < 0 ? i : at;
            continue;
        }
        double d = fabs((double)got[i] - want[i]),
               r = d > 0 ? d / (mag[i] > 0 ? mag[i] : 1e-300) : 0;
        if (!(r <= worst)) worst = r, at = i;
    }
    if (exact)
        CHECK_AT(line, worst == 0,
                 "%s: %.0f values differ from the CPU's bits, first at %lld (%.9g, CPU %.9g)", what,
                 worst, (long long)at, at >= 0 ? got[at] : 0, at >= 0 ? want[at] : 0);
    else
        CHECK_AT(line, worst <= TOL, "%s: |dev - cpu| / M = %.3g at %lld (%.9g, CPU %.9g, M %.3g)",
                 what, worst, (long long)at, at >= 0 ? got[at] : 0, at >= 0 ? want[at] : 0,
                 at >= 0 ? mag[at] : 0);
}

static opcall abs_call(const opcall *k) {
    opcall a = *k;
    for (int i = 0; i < 3; i++) a.in[i].data = fabs_copy(k->in[i].data, numel(&k->in[i]));
    for (int j = 0; j < 4; j++) a.out[j].data = fabs_copy(k->out[j].data, numel(&k->out[j]));
    return a;
}
static void abs_free(opcall *a) {
    for (int i = 0; i < 3; i++) free(a->in[i].data);
    for (int j = 0; j < 4; j++) free(a->out[j].data);
}

static const char *const g_out_names[FR_OP_COUNT][4] = {
    [FR_OP_LINEAR] = {"y"},
    [FR_OP_LINEAR_BWD] = {"dx", "dW", "db"},
    [FR_OP_CONV2D] = {"y", "ws"},
    [FR_OP_CONV2D_BWD] = {"dx", "dW", "db", "ws"},
};

/* k on the CPU (its workspace cpu_ws floats) and twice on the device (dev_ws):
 * the same bits both times, each wanted output within the bound of the CPU's
 * (bit for bit for the outputs in exact_mask). The device's results go to
 * dev_res when given (the caller frees them). */
static void check_call(int line, const char *name, const opcall *k, int ws_j, int64_t cpu_ws,
                       int64_t dev_ws, unsigned exact_mask, float *dev_res[4]) {
    float *cpu[4] = {0}, *mag[4] = {0}, *d1[4] = {0}, *d2[4] = {0};
    opcall kc = *k;
    if (ws_j >= 0) kc.out[ws_j].shape = fr_shape1(cpu_ws), kc.want[ws_j] = cpu_ws > 0;
    for (int j = 0; j < 4; j++) {
        size_t b = nbytes(&kc.out[j]) + 4;
        cpu[j] = malloc(b), mag[j] = malloc(b), d1[j] = malloc(b), d2[j] = malloc(b);
    }
    opcall ka = abs_call(&kc);
    int st = run_cpu(&kc, cpu);
    CHECK_AT(line, st == FR_OK, "%s: cpu: %s", name, fr_last_error(g_cpu));
    st = run_cpu(&ka, mag);
    CHECK_AT(line, st == FR_OK, "%s: cpu |.|: %s", name, fr_last_error(g_cpu));
    int s1 = run_dev(k, ws_j, dev_ws, d1), s2 = run_dev(k, ws_j, dev_ws, d2);
    CHECK_AT(line, s1 == FR_OK && s2 == FR_OK, "%s: device: %s", name, fr_last_error(g_dev));
    for (int j = 0; j < 4 && s1 == FR_OK && s2 == FR_OK; j++) {
        if (!k->want[j] || j == ws_j) continue;
        char what[160];
        snprintf(what, sizeof what, "%s: %s", name, g_out_names[k->op][j]);
        int64_t n = numel(&k->out[j]);
        CHECK_AT(line, !memcmp(d1[j], d2[j], (size_t)n * sizeof(float)),
                 "%s: two device runs differ", what);
        compare(line, what, d1[j], cpu[j], mag[j], n, (exact_mask >> j) & 1u);
    }
    for (int j = 0; j < 4; j++) {
        free(cpu[j]), free(mag[j]), free(d2[j]);
        if (dev_res) dev_res[j] = d1[j];
        else free(d1[j]);
    }
    abs_free(&ka);
}

static fr_tensor host(fr_dtype dt, fr_shape s, void *data) {
    return (fr_tensor){.dtype = dt, .shape = s, .data = data};
}

/* ---- LINEAR, LINEAR_BWD ---- */

enum { W_DX = 1, W_DW = 2, W_DB = 4, W_ALL = 7 };

/* x of shape xs (rows of K = its last dimension), W (O, K), bias or none;
 * forward, then backward with the accumulate bits acc and the outputs want
 * (W_ bits); each accumulated output starts from random values. */
static void linear_case(int line, const char *name, fr_shape xs, int64_t O, int has_b, uint32_t acc,
                        unsigned want) {
    const int64_t K = xs.d[xs.ndim - 1], N = K > 0 ? fr_shape_numel(&xs) / K : xs.d[0];
    fr_shape ys = xs;
    ys.d[ys.ndim - 1] = O;
    float *x = frand(N * K), *w = frand(O * K), *b = has_b ? frand(O) : NULL;
    char nm[128];
    opcall f = {.op = FR_OP_LINEAR};
    f.in[0] = host(FR_F32, xs, x), f.in[1] = host(FR_F32, fr_shape2(O, K), w);
    f.in[2] = host(FR_F32, fr_shape1(O), b);
    f.out[0] = host(FR_F32, ys, NULL), f.want[0] = 1;
    snprintf(nm, sizeof nm, "linear %s", name);
    check_call(line, nm, &f, -1, 0, 0, 0, NULL);

    float *dy = frand(N * O), *init[3] = {frand(N * K), frand(O * K), frand(O)};
    opcall bw = {.op = FR_OP_LINEAR_BWD, .acc = acc};
    bw.in[0] = host(FR_F32, ys, dy), bw.in[1] = f.in[0], bw.in[2] = f.in[1];
    const fr_shape os[3] = {xs, fr_shape2(O, K), fr_shape1(O)};
    for (int j = 0; j < 3; j++) {
        bw.want[j] = (want >> j) & 1u;
        bw.out[j] = host(FR_F32, os[j], (acc >> j) & 1u ? init[j] : NULL);
    }
    snprintf(nm, sizeof nm, "linear_bwd %s acc %u want %u", name, acc, want);
    check_call(line, nm, &bw, -1, 0, 0, g_fp64 ? W_DB : 0, NULL);
    free(x), free(w), free(b), free(dy);
    for (int j = 0; j < 3; j++) free(init[j]);
}

/* The SGD step inside LINEAR_BWD: on the bias (update bit 2) the CPU's
 * bits; on the weight (update bit 1, its gradient in the scratch's last
 * O*K floats) the bits of the step taken on the host from the device's kept
 * gradient, and refused without scratch, naming the floats it needs. */
static void linear_update(void) {
    const int64_t N = 13, K = 7, O = 5;
    float *x = frand(N * K), *w = frand(O * K), *dy = frand(N * O), *b = frand(O);
    for (int wdi = 0; wdi < 2; wdi++) {
        const float lr = 0.1f, wd = wdi ? 0.01f : 0.0f;
        opcall k = {.op = FR_OP_LINEAR_BWD, .update = 4, .lr = lr, .wd = wd};
        k.in[0] = host(FR_F32, fr_shape2(N, O), dy), k.in[1] = host(FR_F32, fr_shape2(N, K), x);
        k.in[2] = host(FR_F32, fr_shape2(O, K), w);
        k.out[0] = host(FR_F32, fr_shape2(N, K), NULL), k.want[0] = 1;
        k.out[1] = host(FR_F32, fr_shape2(O, K), NULL);
        k.out[2] = host(FR_F32, fr_shape1(O), b), k.want[2] = 1;
        check_call(__LINE__, wdi ? "linear_bwd bias step wd 0.01" : "linear_bwd bias step", &k, -1,
                   0, 0, g_fp64 ? W_DB : 0, NULL);
        /* the kept gradient on the device, then the step on the host */
        opcall kg = k;
        kg.update = 0, kg.want[1] = 1, kg.want[2] = 0;
        float *kept[4] = {malloc(N * K * 4), malloc(O * K * 4), malloc(O * 4), NULL};
        CHECK(run_dev(&kg, -1, 0, kept) == FR_OK, "kept gradient: %s", fr_last_error(g_dev));
        float *want_w = malloc(O * K * 4);
        for (int64_t i = 0; i < O * K; i++) {
            float d = kept[1][i];
            if (wd != 0.0f) d = d + wd * w[i];
            want_w[i] = w[i] + (-lr) * d;
        }
        k.update = 2 | 4, k.want[1] = 1, k.out[1].data = w;
        float *res[4] = {malloc(N * K * 4), malloc(O * K * 4), malloc(O * 4), NULL};
        for (int extra = 0; extra < 2; extra++) { /* scratch of exactly O*K floats, and more */
            g_scratch = O * K + extra * 1000;
            int st = run_dev(&k, -1, 0, res);
            CHECK(st == FR_OK, "the weight's step: %s", fr_last_error(g_dev));
            CHECK(st || !memcmp(res[1], want_w, O * K * 4),
                  "the weight's step (wd %g, scratch %lld): not the kept gradient's step", wd,
                  (long long)g_scratch);
            CHECK(st || !memcmp(res[0], kept[0], N * K * 4), "dx beside the weight's step");
        }
        g_scratch = O * K - 1;
        int st = run_dev(&k, -1, 0, res);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "linear_bwd") &&
                  strstr(fr_last_error(g_dev),
                         "needs 35 floats of device scratch for its gradient, 34 given"),
              "the weight's step without enough scratch: %d %s", st, fr_last_error(g_dev));
        g_scratch = 0;
        st = run_dev(&k, -1, 0, res);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "35 floats of device scratch"),
              "the weight's step without scratch: %d %s", st, fr_last_error(g_dev));
        for (int j = 0; j < 3; j++) free(res[j]), free(kept[j]);
        free(want_w);
    }
    free(x), free(w), free(dy), free(b);
}

/* The planned GEMM scratch of a LINEAR or LINEAR_BWD node on x (N, K) and
 * W (O, K), asked as the planner asks (the backend's ws_elems, j = -1). */
static int64_t gemm_scratch(fr_op op, int64_t N, int64_t K, int64_t O) {
    fr_value vals[2] = {{.shape = fr_shape2(N, K)}, {.shape = fr_shape2(O, K)}};
    fr_node nodes[2] = {{.op = FR_OP_LINEAR, .in = {0, 1, -1}, .fwd = -1},
                        {.op = FR_OP_LINEAR_BWD, .fwd = 0}};
    fr_graph g = {.ctx = g_dev, .vals = vals, .n_vals = 2, .nodes = nodes, .n_nodes = 2};
    return fr_cl_backend.ws_elems(&g, &nodes[op == FR_OP_LINEAR ? 0 : 1], -1);
}

/* CLBlast's own answer for one GEMM (row-major, offsets 0). */
static size_t blast_temp(int ta, int tb, size_t m, size_t n, size_t k, size_t lda, size_t ldb,
                         size_t ldc) {
    cl_command_queue q = fr_cl_queue(g_cl);
    size_t bytes = 0;
    CHECK(CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor,
                                     ta ? CLBlastTransposeYes : CLBlastTransposeNo,
                                     tb ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, 0, lda,
                                     0, ldb, 0, ldc, &q, &bytes) == CLBlastSuccess,
          "CLBlastSGemmTempBufferSize");
    return bytes;
}

/* A product large enough for CLBlast's indirect kernel on this device: its
 * temporary buffers come from the planned scratch, the results the CPU's
 * within the bound; a scratch too small, or none, is refused. Small shapes
 * plan none. */
static void linear_temp_buffer(void) {
    CHECK(gemm_scratch(FR_OP_LINEAR, 7, 13, 5) == 0 &&
              gemm_scratch(FR_OP_LINEAR_BWD, 7, 13, 5) == 0,
          "small GEMMs plan no scratch");
    const int64_t N = 1000, K = 1024, O = 1000; /* not multiples of CLBlast's tiles */
    const size_t fwd = blast_temp(0, 1, N, O, K, K, K, O), dx = blast_temp(0, 0, N, K, O, O, K, K),
                 dw = blast_temp(1, 0, O, K, N, O, K, K);
    const int64_t pf = gemm_scratch(FR_OP_LINEAR, N, K, O),
                  pb = gemm_scratch(FR_OP_LINEAR_BWD, N, K, O);
    printf("CLBlast temporary bytes for (%lld,%lld)x(%lld,%lld): forward %zu, dx %zu, dW %zu; "
           "planned scratch %lld / %lld floats\n",
           (long long)N, (long long)K, (long long)O, (long long)K, fwd, dx, dw, (long long)pf,
           (long long)pb);
    if (fwd == 0 && dx == 0 && dw == 0) { /* another device's database may go direct */
        puts("note: this device's CLBlast needs no temporary buffer at this size");
        return;
    }
    CHECK(pf * 4 >= (int64_t)fwd && pb * 4 >= (int64_t)(dx > dw ? dx : dw),
          "the plan holds at least what CLBlast asks at offsets 0");
    float *x = frand(N * K), *w = frand(O * K), *b = frand(O), *dy = frand(N * O);
    opcall f = {.op = FR_OP_LINEAR};
    f.in[0] = host(FR_F32, fr_shape2(N, K), x), f.in[1] = host(FR_F32, fr_shape2(O, K), w);
    f.in[2] = host(FR_F32, fr_shape1(O), b);
    f.out[0] = host(FR_F32, fr_shape2(N, O), NULL), f.want[0] = 1;
    opcall bw = {.op = FR_OP_LINEAR_BWD};
    bw.in[0] = host(FR_F32, fr_shape2(N, O), dy), bw.in[1] = f.in[0], bw.in[2] = f.in[1];
    bw.out[0] = host(FR_F32, fr_shape2(N, K), NULL), bw.want[0] = 1;
    bw.out[1] = host(FR_F32, fr_shape2(O, K), NULL), bw.want[1] = 1;
    bw.out[2] = host(FR_F32, fr_shape1(O), NULL);
    g_scratch = pf;
    if (fwd) check_call(__LINE__, "linear with CLBlast's temporary buffer", &f, -1, 0, 0, 0, NULL);
    g_scratch = pb;
    if (dx || dw)
        check_call(__LINE__, "linear_bwd with CLBlast's temporary buffer", &bw, -1, 0, 0, 0, NULL);
    float *res[4] = {malloc((size_t)(N * K) * 4), malloc((size_t)(O * K) * 4), NULL, NULL};
    opcall *k = fwd ? &f : &bw;
    for (int none = 0; none < 2; none++) {
        g_scratch = none ? 0 : 16; /* 64 bytes: less than any indirect GEMM asks */
        int st = run_dev(k, -1, 0, res);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "bytes of CLBlast temporary") &&
                  strstr(fr_last_error(g_dev), none ? "scratch holds 0" : "scratch holds 64"),
              "a scratch too small: %d %s", st, fr_last_error(g_dev));
    }
    g_scratch = 0;
    free(res[0]), free(res[1]);
    free(x), free(w), free(b), free(dy);
}

/* A bad shape: the CPU's error. */
static void linear_errors(void) {
    float *x = frand(7 * 13), *w = frand(5 * 12), *y = malloc(7 * 5 * 4);
    opcall k = {.op = FR_OP_LINEAR};
    k.in[0] = host(FR_F32, fr_shape2(7, 13), x), k.in[1] = host(FR_F32, fr_shape2(5, 12), w);
    k.out[0] = host(FR_F32, fr_shape2(7, 5), NULL), k.want[0] = 1;
    float *res[4] = {y};
    int st = run_dev(&k, -1, 0, res);
    CHECK(st == FR_ERR_SHAPE && strstr(fr_last_error(g_dev), "linear: x has 91 elements"),
          "K mismatch: %d %s", st, fr_last_error(g_dev));
    free(x), free(w), free(y);
}

/* A CLBlast failure (here W's buffer smaller than its shape says): an error
 * naming the op and CLBlast's status. */
static void linear_blast_error(void) {
    float *x = frand(7 * 13), *w = frand(5 * 13);
    fr_tensor hx = host(FR_F32, fr_shape2(7, 13), x), hw = host(FR_F32, fr_shape2(5, 13), w),
              hy = host(FR_F32, fr_shape2(7, 500), NULL);
    fr_node node = {.op = FR_OP_LINEAR, .fwd = -1};
    fr_kernel_call c = {.ctx = g_dev, .node = &node};
    c.in[0] = dev_put(&hx, x), c.in[1] = dev_put(&hw, w), c.out[0] = dev_put(&hy, NULL);
    c.in[1].shape = fr_shape2(500, 13); /* 5 rows in the buffer */
    int st = fr_cl_backend.kernels[FR_OP_LINEAR](&c);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "opencl: linear: CLBlast SGEMM") &&
              strstr(fr_last_error(g_dev), "status -1010 (B's buffer is too small)"),
          "CLBlast's refusal: %d %s", st, fr_last_error(g_dev));
    dev_free_all();
    free(x), free(w);
}

static void test_linear(void) {
    linear_case(__LINE__, "(7,13)x(5,13)+b", fr_shape2(7, 13), 5, 1, 0, W_ALL);
    linear_case(__LINE__, "(13,7)x(1,7)", fr_shape2(13, 7), 1, 0, 7, W_ALL);
    linear_case(__LINE__, "(1,1)x(1,1)+b", fr_shape2(1, 1), 1, 1, 5, W_ALL);
    linear_case(__LINE__, "(2,7,13) rows", fr_shape3(2, 7, 13), 11, 1, 2, W_DX | W_DW);
    linear_case(__LINE__, "(3,2,7,13) rows", fr_shape4(3, 2, 7, 13), 7, 0, 0, W_DW | W_DB);
    linear_case(__LINE__, "(13,7) only dx", fr_shape2(13, 7), 9, 1, 1, W_DX);
    linear_case(__LINE__, "(13,7) only db", fr_shape2(13, 7), 9, 1, 4, W_DB);
    linear_case(__LINE__, "(13,7) none", fr_shape2(13, 7), 9, 1, 0, 0);
    linear_case(__LINE__, "(3,0)x(4,0)+b", fr_shape2(3, 0), 4, 1, 0, W_ALL);
    linear_case(__LINE__, "(3,0)x(4,0) acc", fr_shape2(3, 0), 4, 0, 7, W_ALL);
    linear_case(__LINE__, "(64,768)x(384,768)+b GPT", fr_shape3(2, 32, 768), 384, 1, 0, W_ALL);
    linear_case(__LINE__, "(256,784)x(128,784)+b acc", fr_shape2(256, 784), 128, 1, 7, W_ALL);
    linear_update();
    linear_temp_buffer();
    linear_errors();
    linear_blast_error();
}

/* ---- CONV2D, CONV2D_BWD ---- */

typedef struct conv_shape {
    int64_t N, C, H, W, OC;
    int K, S, P;
} conv_shape;

/* the device's planned workspace, asked as the planner asks (a graph with
 * the forward node and, for backward, a node pointing at it) */
static int64_t dev_ws(const conv_shape *s, int backward) {
    fr_value vals[2] = {{.shape = fr_shape4(s->N, s->C, s->H, s->W)},
                        {.shape = fr_shape4(s->OC, s->C, s->K, s->K)}};
    fr_node nodes[2] = {{.op = FR_OP_CONV2D,
                         .in = {0, 1, -1},
                         .fwd = -1,
                         .attr = {.kernel = s->K, .stride = s->S, .pad = s->P}},
                        {.op = FR_OP_CONV2D_BWD, .fwd = 0}};
    fr_graph g = {.vals = vals, .n_vals = 2, .nodes = nodes, .n_nodes = 2};
    CHECK(fr_cl_ws_conv2d(&g, &nodes[0], 0) == 0 && fr_cl_ws_conv2d_bwd(&g, &nodes[1], 1) == 0,
          "workspace only at out[1] / out[3]");
    return backward ? fr_cl_ws_conv2d_bwd(&g, &nodes[1], 3) : fr_cl_ws_conv2d(&g, &nodes[0], 1);
}

/* The image x as dt (f16/bf16: x is rounded to it first, so that the f32
 * reference holds exactly the widened values); returns the 16-bit copy. */
static uint16_t *to_half(fr_dtype dt, float *x, int64_t n) {
    uint16_t *h = malloc((size_t)(n > 0 ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) {
        h[i] = dt == FR_F16 ? fr_f32_to_f16(x[i]) : fr_f32_to_bf16(x[i]);
        x[i] = dt == FR_F16 ? fr_f16_to_f32(h[i]) : fr_bf16_to_f32(h[i]);
    }
    return h;
}

/* forward (bias or none) and backward (accumulate bits acc, outputs want)
 * against the CPU; the device's workspace ws_dev floats (0: as planned); an
 * image in xdt (16 bits: the bits of the device's f32 call on it widened) */
static void conv_case(int line, const char *name, conv_shape s, int has_b, uint32_t acc,
                      unsigned want, int64_t ws_dev, fr_dtype xdt) {
    const fr_attr a = {.kernel = s.K, .stride = s.S, .pad = s.P};
    const int64_t OH = (s.H + 2 * s.P - s.K) / s.S + 1, OW = (s.W + 2 * s.P - s.K) / s.S + 1;
    const fr_shape xs = fr_shape4(s.N, s.C, s.H, s.W), ws_ = fr_shape4(s.OC, s.C, s.K, s.K),
                   ys = fr_shape4(s.N, s.OC, OH, OW);
    const int64_t nx = fr_shape_numel(&xs), nw = fr_shape_numel(&ws_), ny = fr_shape_numel(&ys);
    float *x = frand(nx), *w = frand(nw), *b = has_b ? frand(s.OC) : NULL;
    uint16_t *xh = xdt != FR_F32 ? to_half(xdt, x, nx) : NULL;
    const int64_t cpu_f = fr_conv2d_ws_elems(&xs, FR_F32, s.OC, s.K, s.S, s.P, 0, 0);
    const int64_t cpu_b = fr_conv2d_ws_elems(&xs, FR_F32, s.OC, s.K, s.S, s.P, 1, 0);
    const int64_t dev_f = ws_dev ? ws_dev : dev_ws(&s, 0), dev_b = ws_dev ? ws_dev : dev_ws(&s, 1);
    char nm[160];

    opcall f = {.op = FR_OP_CONV2D, .attr = a};
    f.in[0] = host(FR_F32, xs, x), f.in[1] = host(FR_F32, ws_, w);
    f.in[2] = host(FR_F32, fr_shape1(s.OC), b);
    f.out[0] = host(FR_F32, ys, NULL), f.want[0] = 1;
    f.out[1] = host(FR_F32, fr_shape1(0), NULL);
    snprintf(nm, sizeof nm, "conv2d %s", name);
    float *r32[4] = {0};
    check_call(line, nm, &f, 1, cpu_f, dev_f, 0, r32);

    float *dy = frand(ny), *init[3] = {frand(nx), frand(nw), frand(s.OC)};
    opcall bw = {.op = FR_OP_CONV2D_BWD, .attr = a, .acc = acc};
    bw.in[0] = host(FR_F32, ys, dy), bw.in[1] = f.in[0], bw.in[2] = f.in[1];
    const fr_shape os[3] = {xs, ws_, fr_shape1(s.OC)};
    for (int j = 0; j < 3; j++) {
        bw.want[j] = (want >> j) & 1u;
        bw.out[j] = host(FR_F32, os[j], (acc >> j) & 1u ? init[j] : NULL);
    }
    bw.out[3] = host(FR_F32, fr_shape1(0), NULL);
    snprintf(nm, sizeof nm, "conv2d_bwd %s acc %u want %u", name, acc, want);
    float *b32[4] = {0};
    check_call(line, nm, &bw, 3, cpu_b, dev_b, g_fp64 ? W_DB : 0, b32);

    if (xh) { /* the 16-bit image: the f32 call's bits */
        float *r16[4] = {malloc((size_t)ny * 4), NULL, NULL, NULL};
        f.in[0] = host(xdt, xs, xh);
        CHECK_AT(line, run_dev(&f, 1, dev_f, r16) == FR_OK, "%s: %s", name, fr_last_error(g_dev));
        CHECK_AT(line, !memcmp(r16[0], r32[0], (size_t)ny * 4), "%s: 16-bit x: y differs", name);
        float *b16[4] = {malloc((size_t)nx * 4), malloc((size_t)nw * 4), malloc((size_t)s.OC * 4)};
        bw.in[1] = f.in[0];
        CHECK_AT(line, run_dev(&bw, 3, dev_b, b16) == FR_OK, "%s: %s", name, fr_last_error(g_dev));
        const int64_t n3[3] = {nx, nw, s.OC};
        for (int j = 0; j < 3; j++)
            CHECK_AT(line, !bw.want[j] || !memcmp(b16[j], b32[j], (size_t)n3[j] * 4),
                     "%s: 16-bit x: %s differs", name, g_out_names[FR_OP_CONV2D_BWD][j]);
        for (int j = 0; j < 3; j++) free(b16[j]);
        free(r16[0]);
    }
    if (!ws_dev && dev_f / (s.C * s.K * s.K * OH * OW) > 1) {
        /* a workspace of one image's unroll: the same bits as the planned chunks */
        const int64_t one = s.C * s.K * s.K * OH * OW;
        float *c1[4] = {malloc((size_t)ny * 4)},
              *cb[4] = {malloc((size_t)nx * 4), malloc((size_t)nw * 4), malloc((size_t)s.OC * 4)};
        f.in[0] = host(FR_F32, xs, x), bw.in[1] = f.in[0];
        CHECK_AT(line, run_dev(&f, 1, one, c1) == FR_OK, "%s: %s", name, fr_last_error(g_dev));
        CHECK_AT(line, !memcmp(c1[0], r32[0], (size_t)ny * 4), "%s: y with one image a chunk",
                 name);
        CHECK_AT(line, run_dev(&bw, 3, one, cb) == FR_OK, "%s: %s", name, fr_last_error(g_dev));
        const int64_t n3[3] = {nx, nw, s.OC};
        for (int j = 0; j < 3; j++)
            CHECK_AT(line, !bw.want[j] || !memcmp(cb[j], b32[j], (size_t)n3[j] * 4),
                     "%s: %s with one image a chunk", name, g_out_names[FR_OP_CONV2D_BWD][j]);
        for (int j = 0; j < 3; j++) free(cb[j]);
        free(c1[0]);
    }
    for (int j = 0; j < 4; j++) free(r32[j]), free(b32[j]);
    free(x), free(w), free(b), free(xh), free(dy);
    for (int j = 0; j < 3; j++) free(init[j]);
}

/* Refusals: a workspace smaller than one image's unroll, W not fitting x. */
static void conv_errors(void) {
    conv_shape s = {2, 3, 7, 7, 4, 3, 1, 1};
    float *x = frand(2 * 3 * 49), *w = frand(4 * 3 * 9), *y = malloc(2 * 4 * 49 * 4);
    opcall f = {.op = FR_OP_CONV2D, .attr = {.kernel = 3, .stride = 1, .pad = 1}};
    f.in[0] = host(FR_F32, fr_shape4(2, 3, 7, 7), x);
    f.in[1] = host(FR_F32, fr_shape4(4, 3, 3, 3), w);
    f.out[0] = host(FR_F32, fr_shape4(2, 4, 7, 7), NULL), f.want[0] = 1;
    float *res[4] = {y};
    int st = run_dev(&f, 1, 3 * 9 * 49 - 1, res);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "conv2d: workspace of 1322 floats") &&
              strstr(fr_last_error(g_dev), "1323"),
          "small workspace: %d %s", st, fr_last_error(g_dev));
    f.in[1].shape = fr_shape4(4, 2, 3, 3);
    st = run_dev(&f, 1, dev_ws(&s, 0), res);
    CHECK(st == FR_ERR_SHAPE && strstr(fr_last_error(g_dev), "conv2d: x (2, 3, 7, 7) and W"),
          "channels: %d %s", st, fr_last_error(g_dev));
    /* a 16-bit image of a 1x1 unpadded convolution (its GEMMs would read it as f32) */
    uint16_t *xh = to_half(FR_F16, x, 2 * 3 * 49);
    f.attr = (fr_attr){.kernel = 1, .stride = 1, .pad = 0};
    f.in[0] = host(FR_F16, fr_shape4(2, 3, 7, 7), xh);
    f.in[1] = host(FR_F32, fr_shape4(4, 3, 1, 1), w);
    st = run_dev(&f, 1, 0, res);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_dev), "conv2d: a 16-bit input on a 1x1"),
          "16-bit 1x1: %d %s", st, fr_last_error(g_dev));
    free(x), free(w), free(y), free(xh);
}

static void test_conv(void) {
    const conv_shape same = {2, 3, 7, 7, 4, 3, 1, 1}, strided = {3, 2, 13, 11, 5, 3, 2, 1};
    conv_case(__LINE__, "same 3x3", same, 1, 0, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "same 3x3 acc", same, 0, 7, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "strided 3x3 s2 p1", strided, 1, 0, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "strided acc dx only", strided, 1, 1, W_DX, 0, FR_F32);
    conv_case(__LINE__, "strided dW db", strided, 0, 6, W_DW | W_DB, 0, FR_F32);
    conv_case(__LINE__, "1x1", (conv_shape){2, 4, 7, 7, 3, 1, 1, 0}, 1, 0, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "1x1 acc", (conv_shape){3, 4, 5, 7, 3, 1, 1, 0}, 0, 7, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "1x1 s2", (conv_shape){2, 3, 7, 7, 2, 1, 2, 0}, 1, 0, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "5x5 p0", (conv_shape){1, 3, 9, 9, 2, 5, 1, 0}, 1, 0, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "2x2 s2", (conv_shape){2, 5, 8, 8, 3, 2, 2, 0}, 1, 3, W_ALL, 0, FR_F32);
    conv_case(__LINE__, "kernel = padded image", (conv_shape){2, 2, 3, 5, 3, 5, 1, 1}, 1, 0, W_ALL,
              0, FR_F32);
    conv_case(__LINE__, "7x7 s2 p3", (conv_shape){2, 3, 13, 13, 4, 7, 2, 3}, 1, 0, W_ALL, 0,
              FR_F32);
    conv_case(__LINE__, "chunks of 2 of 5", (conv_shape){5, 3, 7, 7, 4, 3, 1, 1}, 1, 7, W_ALL,
              2 * 3 * 9 * 49, FR_F32);
    conv_case(__LINE__, "no outputs", same, 1, 0, 0, 0, FR_F32);
    conv_case(__LINE__, "f16 x (C 8, same)", (conv_shape){2, 8, 7, 7, 5, 3, 1, 1}, 1, 0, W_ALL, 0,
              FR_F16);
    conv_case(__LINE__, "bf16 x (C 8, same)", (conv_shape){2, 8, 7, 7, 5, 3, 1, 1}, 1, 7, W_ALL, 0,
              FR_BF16);
    conv_case(__LINE__, "bf16 x strided", strided, 1, 0, W_ALL, 0, FR_BF16);
    /* realistic: a ResNet block's 3x3 (chunked by the planned workspace), a 1x1 */
    conv_case(__LINE__, "(16,32,32,32)->64 3x3", (conv_shape){16, 32, 32, 32, 64, 3, 1, 1}, 1, 0,
              W_ALL, 0, FR_F32);
    conv_case(__LINE__, "(8,64,16,16)->128 1x1 acc", (conv_shape){8, 64, 16, 16, 128, 1, 1, 0}, 0,
              7, W_ALL, 0, FR_F32);
    conv_errors();
}

int main(void) {
    g_cpu = fr_ctx_new();
    g_dev = fr_ctx_new();
    int n = 0;
    if (!g_cpu || !g_dev || fr_cl_count(g_dev, &n) != FR_OK || n == 0) {
        puts("skipped: no OpenCL device");
        fr_ctx_free(g_cpu), fr_ctx_free(g_dev);
        return 77;
    }
    CHECK(fr_cl_use(g_dev, 0) == FR_OK, "%s", fr_last_error(g_dev));
    g_cl = fr_cl_of(g_dev);
    g_fp64 = fr_cl_info_of(g_cl)->fp64;
    printf("device: %s, fp64 %d\n", fr_cl_info_of(g_cl)->name, g_fp64);
    test_linear();
    test_conv();
    fr_cl_unuse(g_dev);
    fr_ctx_free(g_dev);
    fr_ctx_free(g_cpu);
    return check_done();
}
#endif
