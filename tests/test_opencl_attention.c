/* test_opencl_attention.c — ATTENTION and ATTENTION_BWD on an OpenCL device
 * against the CPU kernels (fr_k_attention, fr_k_attention_bwd, checked
 * against float64 and PyTorch in test_attention.c and test_gpt_ops.c) on
 * the same inputs: odd sizes (T 7, 13, 33 and 70 cross the device's tiles,
 * 32 rows for small heads, 23 and 15 for HS 64, and the CPU's 64 x 32 ones),
 * head sizes 3 to 64, a GPT-sized case
 * (B 2, T 256, C 384, 6 heads), grouped-query attention (kv_heads 2 of 4,
 * 2 of 6, 1 of 4), every tensor at a nonzero offset in its buffer; the
 * backward from the CPU's y and lse.
 *
 * Bound. Both sides compute the same sums in different orders (the CPU's
 * tile GEMMs, the device a row at a time) with exp and log from different
 * libraries (OpenCL C allows exp and log 3 ulp). A sum of n float products
 * reassociated differs by at most about n 2^-24 of the sum of the products'
 * magnitudes; scores are HS-long sums, outputs T-long ones fed by them, so an
 * element of y, dq, dk, dv may differ by (HS + T) 2^-24 of its tensor's
 * magnitude, here taken as the largest |value| of the CPU's result (the
 * products' magnitudes are bounded by it times a few for these inputs). We
 * allow 4 times that: |d| <= 4 (HS + T) 2^-24 max|ref|, and for lse and D
 * (sums of T exps, of HS products) 4 (HS + T) 2^-24 (1 + |ref|).
 * Measured (PoCL) the largest |d| / max|ref| is printed per case.
 * Each device call runs twice: bit-identical. Also generation's ATTENTION_KV
 * with kv_heads (two chunks, caches of NKV heads) and ROPE_QKV (llama3, from a
 * step) and its backward, against the CPU's. Returns 77 without a device. */
#include <stdint.h>
#include <stdio.h>
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
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/attention.h"
#include "backend/cpu/kernels.h"
#include "backend/opencl/attention.h"
#include "core/rng.h"

#define PAD 128 /* bytes before each device tensor in its buffer */

typedef struct dev_t_ {
    cl_mem m;
    fr_tensor t;
} dev_t_;

static dev_t_ dev_new(fr_ctx *ctx, fr_shape sh, const float *src) {
    dev_t_ d = {NULL, {FR_F32, sh, NULL, NULL, PAD}};
    const size_t bytes = (size_t)fr_shape_numel(&sh) * sizeof(float);
    CHECK(fr_cl_alloc(ctx, fr_cl_of(ctx), PAD + bytes, &d.m) == FR_OK, "%s", fr_last_error(ctx));
    d.t.buf = d.m;
    if (d.m && src)
        CHECK(fr_cl_write(ctx, fr_cl_of(ctx), d.m, PAD, src, bytes) == FR_OK, "%s",
              fr_last_error(ctx));
    if (d.m && !src) CHECK(fr_cl_zero(ctx, fr_cl_of(ctx), d.m, 0, PAD + bytes) == FR_OK, "zero");
    return d;
}

static float *dev_get(fr_ctx *ctx, const dev_t_ *d) {
    const size_t n = (size_t)fr_shape_numel(&d->t.shape);
    float *x = calloc(n ? n : 1, sizeof *x);
    CHECK(fr_cl_read(ctx, fr_cl_of(ctx), d->m, PAD, x, n * sizeof *x) == FR_OK, "%s",
          fr_last_error(ctx));
    return x;
}

static float maxabs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* got vs want (n): |d| <= tol max|want| (rel_each 0) or tol (1 + |want|) (1);
 * returns the largest |d| / max|want|. */
static double compare(int line, const char *what, const char *tag, const float *got,
                      const float *want, size_t n, double tol, int rel_each) {
    const double scale = maxabs(want, n) > 0 ? maxabs(want, n) : 1.0;
    double worst = 0.0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        const double lim = rel_each ? tol * (1.0 + fabs(want[i])) : tol * scale;
        if (!(d <= lim) && !bad++) first = i;
        if (d / scale > worst) worst = d / scale;
    }
    CHECK_AT(line, !bad, "%s %s: %zu differ, first %zu: %.9g vs cpu %.9g", tag, what, bad, first,
             n ? got[first] : 0.0f, n ? want[first] : 0.0f);
    return worst;
}

static void same_bits(int line, const char *tag, const char *what, const float *a, const float *b,
                      size_t n) {
    CHECK_AT(line, !memcmp(a, b, n * sizeof *a), "%s %s: two device runs differ", tag, what);
}

/* C = NH HS; NKV kv heads (grouped-query attention; NH: multi-head), qkv
 * (B, T, (NH + 2 NKV) HS) */
static void attn_case_g(fr_ctx *cpu, fr_ctx *ctx, int B, int T, int C, int NH, int NKV) {
    char tag[64];
    snprintf(tag, sizeof tag, "B %d T %d C %d NH %d NKV %d", B, T, C, NH, NKV);
    const int HS = C / NH, W = (NH + 2 * NKV) * HS;
    const size_t nqkv = (size_t)B * T * W, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(nqkv * sizeof *qkv), *dy = malloc(ny * sizeof *dy);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = (float)(4.0 * fr_rng_uniform(3, 1, i) - 2.0);
    for (size_t i = 0; i < ny; i++) dy[i] = (float)(2.0 * fr_rng_uniform(3, 2, i) - 1.0);
    fr_node node = {.op = FR_OP_ATTENTION};
    node.attr.heads = NH, node.attr.kv_heads = NKV, node.attr.causal = 1;
    fr_node bnode = node;
    bnode.op = FR_OP_ATTENTION_BWD;
    const double tol = 4.0 * (HS + T) * ldexp(1.0, -24);

    /* the CPU */
    const size_t wsn = fr_attention_ws_floats(T, HS, fr_get_threads(cpu));
    float *y = calloc(ny, sizeof *y), *lse = calloc(nl, sizeof *lse), *ws = calloc(wsn, 4);
    float *dqkv = calloc(nqkv, sizeof *dqkv), *D = calloc(nl, sizeof *D);
    fr_kernel_call c = {.ctx = cpu, .node = &node};
    c.in[0] = (fr_tensor){FR_F32, fr_shape3(B, T, W), qkv, NULL, 0};
    c.out[0] = (fr_tensor){FR_F32, fr_shape3(B, T, C), y, NULL, 0};
    c.out[1] = (fr_tensor){FR_F32, fr_shape3(B, NH, T), lse, NULL, 0};
    c.out[2] = (fr_tensor){FR_F32, fr_shape1((int64_t)wsn), ws, NULL, 0};
    CHECK(fr_k_attention(&c) == FR_OK, "%s: cpu: %s", tag, fr_last_error(cpu));
    fr_kernel_call cb = {.ctx = cpu, .node = &bnode};
    cb.in[0] = (fr_tensor){FR_F32, fr_shape3(B, T, C), dy, NULL, 0};
    cb.in[1] = c.in[0], cb.in[2] = c.out[0], cb.in[3] = c.out[1];
    cb.out[0] = (fr_tensor){FR_F32, fr_shape3(B, T, W), dqkv, NULL, 0};
    cb.out[1] = (fr_tensor){FR_F32, fr_shape3(B, NH, T), D, NULL, 0};
    cb.out[2] = c.out[2];
    CHECK(fr_k_attention_bwd(&cb) == FR_OK, "%s: cpu bwd: %s", tag, fr_last_error(cpu));

    /* the device, twice each, from the same inputs (the backward from the CPU's y and lse) */
    dev_t_ dq = dev_new(ctx, c.in[0].shape, qkv), ddy = dev_new(ctx, cb.in[0].shape, dy);
    dev_t_ dyo = dev_new(ctx, c.out[0].shape, NULL), dl = dev_new(ctx, c.out[1].shape, NULL);
    dev_t_ dws = dev_new(ctx, fr_shape1(fr_cl_ws_attention(NULL, &node, 2)), NULL);
    dev_t_ ycpu = dev_new(ctx, c.out[0].shape, y), lcpu = dev_new(ctx, c.out[1].shape, lse);
    dev_t_ ddq = dev_new(ctx, cb.out[0].shape, NULL), dD = dev_new(ctx, cb.out[1].shape, NULL);
    float *got[2][4] = {{NULL}};
    for (int r = 0; r < 2; r++) {
        fr_kernel_call g = {.ctx = ctx, .node = &node};
        g.in[0] = dq.t, g.out[0] = dyo.t, g.out[1] = dl.t, g.out[2] = dws.t;
        CHECK(fr_cl_k_attention(&g) == FR_OK, "%s: device: %s", tag, fr_last_error(ctx));
        fr_kernel_call gb = {.ctx = ctx, .node = &bnode};
        gb.in[0] = ddy.t, gb.in[1] = dq.t, gb.in[2] = ycpu.t, gb.in[3] = lcpu.t;
        gb.out[0] = ddq.t, gb.out[1] = dD.t, gb.out[2] = dws.t;
        CHECK(fr_cl_k_attention_bwd(&gb) == FR_OK, "%s: device bwd: %s", tag, fr_last_error(ctx));
        got[r][0] = dev_get(ctx, &dyo), got[r][1] = dev_get(ctx, &dl);
        got[r][2] = dev_get(ctx, &ddq), got[r][3] = dev_get(ctx, &dD);
    }
    const double ey = compare(__LINE__, "y", tag, got[0][0], y, ny, tol, 0);
    const double el = compare(__LINE__, "lse", tag, got[0][1], lse, nl, tol, 1);
    const double eg = compare(__LINE__, "dqkv", tag, got[0][2], dqkv, nqkv, tol, 0);
    const double ed = compare(__LINE__, "D", tag, got[0][3], D, nl, tol, 1);
    printf("%s: max |d| / max|ref|: y %.2e, lse %.2e, dqkv %.2e, D %.2e (bound %.2e)\n", tag, ey,
           el, eg, ed, tol);
    const char *names[4] = {"y", "lse", "dqkv", "D"};
    const size_t ns[4] = {ny, nl, nqkv, nl};
    for (int j = 0; j < 4; j++) same_bits(__LINE__, tag, names[j], got[0][j], got[1][j], ns[j]);

    /* lse absent: the same y */
    fr_kernel_call g = {.ctx = ctx, .node = &node};
    g.in[0] = dq.t, g.out[0] = dyo.t, g.out[2] = dws.t;
    CHECK(fr_cl_k_attention(&g) == FR_OK, "%s: no lse: %s", tag, fr_last_error(ctx));
    float *y2 = dev_get(ctx, &dyo);
    same_bits(__LINE__, tag, "y without lse", y2, got[0][0], ny);
    free(y2);

    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) free(got[r][j]);
    dev_t_ all[] = {dq, ddy, dyo, dl, dws, ycpu, lcpu, ddq, dD};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fr_cl_release(all[i].m);
    free(qkv), free(dy), free(y), free(lse), free(ws), free(dqkv), free(D);
}

static void attn_case(fr_ctx *cpu, fr_ctx *ctx, int B, int T, int C, int NH) {
    attn_case_g(cpu, ctx, B, T, C, NH, NH);
}

/* ATTENTION_KV with kv_heads NKV on the device against the CPU: T positions
 * in two chunks (P0 from step 0, the rest from step P0) into caches
 * (B, NKV, Tc, HS); y within attn_case's bound, the caches identical. */
static void kv_case(fr_ctx *cpu, fr_ctx *ctx, int B, int T, int NH, int NKV, int HS, int P0) {
    char tag[80];
    snprintf(tag, sizeof tag, "kv B %d T %d NH %d NKV %d HS %d", B, T, NH, NKV, HS);
    const int W = (NH + 2 * NKV) * HS, C = NH * HS, Tc = T + 2;
    const double tol = 4.0 * (HS + T) * ldexp(1.0, -24);
    fr_node node = {.op = FR_OP_ATTENTION_KV};
    node.attr.heads = NH, node.attr.kv_heads = NKV, node.attr.causal = 1;
    const fr_shape cs = fr_shape4(B, NKV, Tc, HS);
    const size_t nc = (size_t)fr_shape_numel(&cs);
    float *K = calloc(nc, 4), *V = calloc(nc, 4);
    dev_t_ dK = dev_new(ctx, cs, NULL), dV = dev_new(ctx, cs, NULL);
    for (int chunk = 0; chunk < 2; chunk++) {
        const int p0 = chunk ? P0 : 0, P = chunk ? T - P0 : P0;
        const size_t nq = (size_t)B * P * W, ny = (size_t)B * P * C;
        float *qkv = malloc(nq * 4), *y = calloc(ny, 4);
        for (size_t i = 0; i < nq; i++)
            qkv[i] = (float)(4.0 * fr_rng_uniform(5, (uint64_t)chunk, i) - 2.0);
        const int64_t wsn = fr_attention_kv_ws(P, NH, Tc, HS, fr_get_threads(cpu));
        float *ws = calloc((size_t)wsn, 4);
        fr_kernel_call c = {.ctx = cpu, .node = &node, .step = (uint64_t)p0};
        c.in[0] = (fr_tensor){FR_F32, fr_shape3(B, P, W), qkv, NULL, 0};
        c.in[1] = (fr_tensor){FR_F32, cs, K, NULL, 0};
        c.in[2] = (fr_tensor){FR_F32, cs, V, NULL, 0};
        c.out[0] = (fr_tensor){FR_F32, fr_shape3(B, P, C), y, NULL, 0};
        c.out[1] = (fr_tensor){FR_F32, fr_shape1(wsn), ws, NULL, 0};
        CHECK(fr_k_attention_kv(&c) == FR_OK, "%s: cpu: %s", tag, fr_last_error(cpu));
        dev_t_ dq = dev_new(ctx, c.in[0].shape, qkv), dy = dev_new(ctx, c.out[0].shape, NULL);
        dev_t_ dws = dev_new(ctx, fr_shape1(1), NULL);
        fr_kernel_call g = {.ctx = ctx, .node = &node, .step = (uint64_t)p0};
        g.in[0] = dq.t, g.in[1] = dK.t, g.in[2] = dV.t, g.out[0] = dy.t, g.out[1] = dws.t;
        CHECK(fr_cl_k_attention_kv(&g) == FR_OK, "%s: device: %s", tag, fr_last_error(ctx));
        float *got = dev_get(ctx, &dy);
        const double e =
            compare(__LINE__, chunk ? "y (cached)" : "y (prefill)", tag, got, y, ny, tol, 0);
        printf("%s chunk %d: max |d| / max|ref| %.2e (bound %.2e)\n", tag, chunk, e, tol);
        free(got), free(qkv), free(y), free(ws);
        fr_cl_release(dq.m), fr_cl_release(dy.m), fr_cl_release(dws.m);
    }
    float *gk = dev_get(ctx, &dK), *gv = dev_get(ctx, &dV);
    CHECK(!memcmp(gk, K, nc * 4) && !memcmp(gv, V, nc * 4), "%s: the caches differ", tag);
    free(gk), free(gv), free(K), free(V);
    fr_cl_release(dK.m), fr_cl_release(dV.m);
}

/* ROPE_QKV from a step (pos_from_step) on the device: the CPU's bits up to
 * the library's cos and sin (4 ulp of the angle's terms: |d| <= 8 (P + 2) 2^-24,
 * P the largest position, as test_rope.c's bound), and its backward */
static void rope_case(fr_ctx *cpu, fr_ctx *ctx) {
    const int B = 2, T = 9, NH = 4, NKV = 2, HS = 16, C = NH * HS, CK = NKV * HS;
    const int W = C + 2 * CK;
    const uint64_t step = 500;
    fr_node node = {.op = FR_OP_ROPE_QKV}, bnode;
    node.attr.heads = NH, node.attr.kv_heads = NKV;
    node.attr.rope = (fr_rope){500000.0f, FR_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 1};
    bnode = node, bnode.op = FR_OP_ROPE_QKV_BWD;
    const size_t nq = (size_t)B * T * C, nk = (size_t)B * T * CK, nw = (size_t)B * T * W;
    float *x[3] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)};
    for (int j = 0; j < 3; j++)
        for (size_t i = 0; i < (j ? nk : nq); i++)
            x[j][i] = (float)(2.0 * fr_rng_uniform(7, (uint64_t)j, i) - 1.0);
    const fr_shape sh[3] = {fr_shape3(B, T, C), fr_shape3(B, T, CK), fr_shape3(B, T, CK)};
    float *y = calloc(nw, 4), *d[3] = {calloc(nq, 4), calloc(nk, 4), calloc(nk, 4)};
    fr_kernel_call c = {.ctx = cpu, .node = &node, .step = step};
    for (int j = 0; j < 3; j++) c.in[j] = (fr_tensor){FR_F32, sh[j], x[j], NULL, 0};
    c.out[0] = (fr_tensor){FR_F32, fr_shape3(B, T, W), y, NULL, 0};
    CHECK(fr_k_rope_qkv(&c) == FR_OK, "rope cpu: %s", fr_last_error(cpu));
    fr_kernel_call cb = {.ctx = cpu, .node = &bnode, .step = step};
    cb.in[0] = c.out[0];
    for (int j = 0; j < 3; j++) cb.out[j] = (fr_tensor){FR_F32, sh[j], d[j], NULL, 0};
    CHECK(fr_k_rope_qkv_bwd(&cb) == FR_OK, "rope cpu bwd: %s", fr_last_error(cpu));
    dev_t_ dx[3], dd[3], dy = dev_new(ctx, c.out[0].shape, NULL),
                         dyc = dev_new(ctx, c.out[0].shape, y);
    fr_kernel_call g = {.ctx = ctx, .node = &node, .step = step};
    fr_kernel_call gb = {.ctx = ctx, .node = &bnode, .step = step};
    for (int j = 0; j < 3; j++) {
        dx[j] = dev_new(ctx, sh[j], x[j]), dd[j] = dev_new(ctx, sh[j], NULL);
        g.in[j] = dx[j].t, gb.out[j] = dd[j].t;
    }
    g.out[0] = dy.t, gb.in[0] = dyc.t;
    CHECK(fr_cl_k_rope_qkv(&g) == FR_OK, "rope device: %s", fr_last_error(ctx));
    CHECK(fr_cl_k_rope_qkv_bwd(&gb) == FR_OK, "rope device bwd: %s", fr_last_error(ctx));
    const double tol = 8.0 * ((double)step + T + 2) * ldexp(1.0, -24);
    float *got = dev_get(ctx, &dy);
    double e = compare(__LINE__, "qkv", "rope llama3 from step 500", got, y, nw, tol, 0);
    free(got);
    for (int j = 0; j < 3; j++) {
        got = dev_get(ctx, &dd[j]);
        const double ej = compare(__LINE__,
                                  j == 0   ? "dq"
                                  : j == 1 ? "dk"
                                           : "dv",
                                  "rope llama3 from step 500", got, d[j], j ? nk : nq, tol, 0);
        if (ej > e) e = ej;
        free(got);
        fr_cl_release(dx[j].m), fr_cl_release(dd[j].m);
        free(x[j]), free(d[j]);
    }
    printf("rope llama3 from step 500: max |d| / max|ref| %.2e (bound %.2e)\n", e, tol);
    fr_cl_release(dy.m), fr_cl_release(dyc.m);
    free(y);
}

/* The CPU's refusals, and an absent dqkv leaves everything alone. */
static void test_errors(fr_ctx *ctx) {
    const int B = 1, T = 5, C = 8, NH = 2;
    fr_node node = {.op = FR_OP_ATTENTION_BWD};
    node.attr.heads = NH, node.attr.causal = 1;
    dev_t_ qkv = dev_new(ctx, fr_shape3(B, T, 3 * C), NULL),
           dy = dev_new(ctx, fr_shape3(B, T, C), NULL);
    dev_t_ lse = dev_new(ctx, fr_shape3(B, NH, T), NULL),
           D = dev_new(ctx, fr_shape3(B, NH, T), NULL);
    dev_t_ dq = dev_new(ctx, fr_shape3(B, T, 3 * C), NULL);
    fr_kernel_call c = {.ctx = ctx, .node = &node};
    c.in[0] = dy.t, c.in[1] = qkv.t, c.in[2] = dy.t, c.in[3] = lse.t;
    c.out[0] = dq.t, c.out[1] = D.t;
    c.accumulate = 1u;
    CHECK(fr_cl_k_attention_bwd(&c) == FR_ERR_ARG && strstr(fr_last_error(ctx), "written whole"),
          "accumulate: %s", fr_last_error(ctx));
    c.accumulate = 0, c.in[3].buf = NULL;
    CHECK(fr_cl_k_attention_bwd(&c) == FR_ERR_ARG && strstr(fr_last_error(ctx), "lse or D"),
          "no lse: %s", fr_last_error(ctx));
    c.in[3] = lse.t, c.out[0].buf = NULL;
    CHECK(fr_cl_k_attention_bwd(&c) == FR_OK, "absent dqkv: %s", fr_last_error(ctx));
    node.attr.heads = 3;
    CHECK(fr_cl_k_attention_bwd(&c) == FR_ERR_SHAPE && strstr(fr_last_error(ctx), "heads 3"),
          "3 heads for C 8: %s", fr_last_error(ctx));
    node.attr.heads = NH, node.attr.causal = 0, node.op = FR_OP_ATTENTION;
    fr_kernel_call f = {.ctx = ctx, .node = &node};
    f.in[0] = qkv.t, f.out[0] = dy.t, f.out[1] = lse.t;
    CHECK(fr_cl_k_attention(&f) == FR_ERR_SHAPE && strstr(fr_last_error(ctx), "causal"),
          "not causal: %s", fr_last_error(ctx));
    /* a head over the backward's local tile (1024 floats) */
    node.attr.causal = 1, node.op = FR_OP_ATTENTION_BWD, node.attr.heads = 1;
    fr_kernel_call big = c;
    big.in[1].shape = fr_shape3(1, 1, 3 * 1100), big.out[0] = dq.t;
    CHECK(fr_cl_k_attention_bwd(&big) == FR_ERR_ARG && strstr(fr_last_error(ctx), "1100"),
          "head size 1100: %s", fr_last_error(ctx));
    CHECK(fr_cl_ws_attention(NULL, &node, 2) == 1 && fr_cl_ws_attention(NULL, &node, 0) == -1,
          "workspace sizes");
    dev_t_ all[] = {qkv, dy, lse, D, dq};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fr_cl_release(all[i].m);
}

int main(void) {
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_ctx *cpu = fr_ctx_new();
    attn_case(cpu, ctx, 1, 7, 6, 2);
    attn_case(cpu, ctx, 2, 13, 16, 2);
    attn_case(cpu, ctx, 1, 33, 8, 1);
    attn_case(cpu, ctx, 2, 70, 64, 4);
    attn_case(cpu, ctx, 1, 1, 4, 1);
    attn_case(cpu, ctx, 1, 37, 128, 2); /* HS 64: tiles of 23 (forward), 15 (backward) rows */
    attn_case(cpu, ctx, 3, 45, 96, 2);  /* HS 48: 31 and 20 */
    attn_case(cpu, ctx, 2, 256, 384, 6);
    /* grouped-query attention: groups of 2, 3 and 4, tiles crossed */
    attn_case_g(cpu, ctx, 2, 13, 16, 4, 2);
    attn_case_g(cpu, ctx, 1, 70, 24, 6, 2);
    attn_case_g(cpu, ctx, 2, 45, 128, 4, 1); /* HS 32 */
    kv_case(cpu, ctx, 2, 20, 4, 2, 8, 12);
    kv_case(cpu, ctx, 1, 40, 6, 2, 16, 33);
    kv_case(cpu, ctx, 1, 9, 2, 2, 8, 5); /* kv_heads = heads */
    rope_case(cpu, ctx);
    test_errors(ctx);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx), fr_ctx_free(cpu);
    return check_done();
}
#endif
