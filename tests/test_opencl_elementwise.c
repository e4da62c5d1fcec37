/* test_opencl_elementwise.c — the elementwise group's OpenCL kernels (RELU,
 * GELU erf and tanh, SIGMOID, TANH and their backward, ADD, COPY, CAST,
 * DROPOUT and its backward, POS_EMBEDDING) and the step's fr_cl_scale /
 * fr_cl_unscale_check, run on a real device (PoCL in CI) and compared with
 * the CPU kernels on the same inputs (the CPU kernels are checked against
 * float64 and PyTorch in their own tests). Each case runs twice on the
 * device: the same bits. Tensors sit 64 bytes into their buffers (offsets
 * are honoured), outputs start from random values (accumulate bits on and
 * off), in-place cases put the output on its input.
 *
 * Bounds, per op:
 * - bit-identical: everything whose device code is the CPU's float
 *   operations in the same order with no library call (FP_CONTRACT OFF):
 *   RELU(_BWD), GELU tanh form and its backward (the CPU's own exp
 *   polynomial, ported), SIGMOID_BWD, TANH_BWD, ADD, COPY, CAST (integer
 *   conversions of core/half.c; every f16 and bf16 pattern, and f32 patterns
 *   with ties, subnormals, overflow, infinities and NaN payloads), DROPOUT
 *   (the same mask bits: core/rng.c's generator in ulong) and its backward,
 *   POS_EMBEDDING, the scale and unscale passes;
 * - a few ulp where the device calls a library function that OpenCL lets
 *   differ from glibc: exp (3 ulp) in SIGMOID, tanh (5 ulp) in TANH:
 *   |d| <= 8 eps |y|; erf (16 ulp) in the exact GELU, whose 1 + erf(u)
 *   turns erf's error near -1 into an absolute one: |d| <= 20 eps/2 |x| +
 *   8 eps |y| forward, |d| <= 20 eps |dy| + 8 eps |dx| backward (erf's and
 *   exp's errors times the factors they are multiplied by). A 16-bit output
 *   of these may then round one 16-bit ulp away.
 * Returns 77 (skipped) when no OpenCL device is found. */
#include <float.h>
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
#include "backend/opencl/backend.h"
#include "backend/opencl/elementwise.h"
#include "core/half.h"
#include "core/rng.h"

#define OFF 64 /* every device tensor starts this many bytes into its buffer */

static fr_ctx *g_dev, *g_host;
static fr_cl *g_cl;
static double g_worst[FR_OP_COUNT]; /* the largest |d| / bound seen, per op */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float urand(float scale) { /* uniform in [-scale, scale) */
    return (float)((double)(rnd64() >> 11) / (double)(1ull << 53) * 2.0 - 1.0) * scale;
}

static fr_tensor host(fr_dtype dt, fr_shape s) {
    fr_tensor t = {.dtype = dt, .shape = s};
    t.data = calloc((size_t)fr_shape_numel(&s) * fr_dtype_size(dt) + 1, 1);
    return t;
}
static size_t nbytes(const fr_tensor *t) {
    return (size_t)fr_shape_numel(&t->shape) * fr_dtype_size(t->dtype);
}

/* random values into t: f32 uniform in [-scale, scale), 16-bit those rounded,
 * u8 a 0/1 mask; the first values are specials (a NaN among them) when asked */
static void fill(fr_tensor *t, float scale, int specials) {
    const int64_t n = fr_shape_numel(&t->shape);
    static const float sp[] = {0.0f, -0.0f, NAN,    INFINITY, -INFINITY, 1e-30f, -1e-30f,
                               9.5f, -9.5f, 0.625f, -0.625f,  0.5f,      20.0f};
    for (int64_t i = 0; i < n; i++) {
        float v = urand(scale);
        if (specials && i < (int64_t)(sizeof sp / sizeof sp[0])) v = sp[i];
        if (t->dtype == FR_F32) ((float *)t->data)[i] = v;
        if (t->dtype == FR_F16) ((uint16_t *)t->data)[i] = fr_f32_to_f16(v);
        if (t->dtype == FR_BF16) ((uint16_t *)t->data)[i] = fr_f32_to_bf16(v);
        if (t->dtype == FR_U8) ((uint8_t *)t->data)[i] = (uint8_t)(rnd64() >> 63);
    }
}

/* t's bytes into a new device buffer, OFF bytes in */
static fr_tensor upload(const fr_tensor *t, cl_mem *keep) {
    fr_tensor d = {.dtype = t->dtype, .shape = t->shape};
    if (!t->data) return d;
    const size_t b = nbytes(t);
    CHECK(fr_cl_alloc(g_dev, g_cl, b + OFF, keep) == FR_OK, "%s", fr_last_error(g_dev));
    CHECK(fr_cl_write(g_dev, g_cl, *keep, OFF, t->data, b) == FR_OK, "%s", fr_last_error(g_dev));
    d.buf = *keep;
    d.off = OFF;
    return d;
}

static void node_init(fr_node *nd, fr_op op, const fr_attr *a, uint32_t acc) {
    memset(nd, 0, sizeof *nd);
    nd->op = op;
    nd->fwd = -1;
    nd->attr = *a;
    nd->accumulate = acc;
}

typedef struct tcase {
    fr_op op;
    fr_attr attr;
    uint32_t acc;
    int alias;                 /* out[0] is in[0]'s storage (in place) */
    double rel, absx;          /* 0, 0: bit-identical; else |d| <= rel |ref| + absx |in[0]| */
    fr_tensor in[FR_MAX_IN];   /* host inputs (data NULL: absent) */
    fr_tensor out[FR_MAX_OUT]; /* outputs' starting values (data NULL: absent) */
} tcase;

static double widen(const fr_tensor *t, int64_t i) {
    if (t->dtype == FR_F32) return ((const float *)t->data)[i];
    if (t->dtype == FR_F16) return fr_f16_to_f32(((const uint16_t *)t->data)[i]);
    return fr_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/* the same float bits, or both NaN (a NaN's payload may come from either operand) */
static int same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* The device result `got` against the CPU's `want` (output j of case k). */
static void compare(const tcase *k, int j, const fr_tensor *want, const fr_tensor *got,
                    const char *label) {
    const int64_t n = fr_shape_numel(&want->shape);
    const size_t es = fr_dtype_size(want->dtype);
    const int is_float = want->dtype == FR_F32 || want->dtype == FR_F16 || want->dtype == FR_BF16;
    if (!is_float || (k->rel == 0 && k->absx == 0)) {
        /* bit-identical; a NaN computed by arithmetic only has to be a NaN
         * (its payload may come from either operand), CAST's and COPY's
         * NaNs are their bits */
        const int moved = k->op == FR_OP_CAST || k->op == FR_OP_COPY;
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            const int nan = is_float && !moved && isnan(widen(want, i)) && isnan(widen(got, i));
            if (!nan && memcmp((char *)want->data + i * es, (char *)got->data + i * es, es))
                bad = i;
        }
        CHECK(bad < 0, "%s out[%d]: element %lld: device %.9g, cpu %.9g", label, j, (long long)bad,
              bad < 0 || !is_float ? 0 : widen(got, bad),
              bad < 0 || !is_float ? 0 : widen(want, bad));
        return;
    }
    const fr_tensor *x = &k->in[0];
    int64_t bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double w = widen(want, i), g = widen(got, i);
        if (same_value(w, g)) continue;
        double bound = k->rel * fabs(w) + (k->absx > 0 ? k->absx * fabs(widen(x, i)) : 0);
        if (want->dtype == FR_F16) bound += ldexp(fabs(w), -10) + ldexp(1, -24);
        if (want->dtype == FR_BF16) bound += ldexp(fabs(w), -7);
        const double d = fabs(g - w);
        if (!(d <= bound) || isinf(w) || isnan(w) || isnan(g)) {
            if (bad < 0) bad = i;
            continue;
        }
        if (bound > 0 && d / bound > worst) worst = d / bound;
    }
    if (worst > g_worst[k->op]) g_worst[k->op] = worst;
    CHECK(bad < 0, "%s out[%d]: element %lld: device %.9g, cpu %.9g, x %.9g", label, j,
          (long long)bad, bad < 0 ? 0 : widen(got, bad), bad < 0 ? 0 : widen(want, bad),
          bad < 0 ? 0 : widen(x, bad));
}

/* Run case k on the CPU and twice on the device; compare. */
static void run_case(const tcase *k, const char *label) {
    const fr_op_info *info = fr_op_get(k->op);
    const int nin = info->n_in, nout = info->n_out;
    fr_node nd;
    node_init(&nd, k->op, &k->attr, k->acc);
    const uint64_t seed = 0x5eedull + (uint64_t)k->op, step = 7;

    /* the CPU: outputs start from their given values; in place, out[0] is in[0] */
    fr_kernel_call hc = {
        .ctx = g_host, .node = &nd, .accumulate = k->acc, .seed = seed, .step = step};
    fr_tensor want[FR_MAX_OUT], got[2][FR_MAX_OUT];
    for (int i = 0; i < nin; i++) {
        hc.in[i] = k->in[i];
        if (k->in[i].data) {
            hc.in[i].data = malloc(nbytes(&k->in[i]) + 1);
            memcpy(hc.in[i].data, k->in[i].data, nbytes(&k->in[i]));
        }
    }
    for (int j = 0; j < nout; j++) {
        want[j] = k->out[j];
        if (k->out[j].data) {
            want[j].data = malloc(nbytes(&k->out[j]) + 1);
            memcpy(want[j].data, k->out[j].data, nbytes(&k->out[j]));
        }
        hc.out[j] = want[j];
    }
    if (k->alias) hc.out[0].data = hc.in[0].data;
    int st = fr_cpu_backend.kernels[k->op](&hc);
    CHECK(st == FR_OK, "%s: cpu: %s", label, fr_last_error(g_host));
    if (k->alias) memcpy(want[0].data, hc.in[0].data, nbytes(&want[0]));

    for (int r = 0; r < 2; r++) {
        cl_mem keep[FR_MAX_IN + FR_MAX_OUT] = {0};
        fr_kernel_call dc = {
            .ctx = g_dev, .node = &nd, .accumulate = k->acc, .seed = seed, .step = step};
        for (int i = 0; i < nin; i++) dc.in[i] = upload(&k->in[i], &keep[i]);
        for (int j = 0; j < nout; j++) dc.out[j] = upload(&k->out[j], &keep[FR_MAX_IN + j]);
        if (k->alias) dc.out[0] = dc.in[0];
        st = fr_cl_backend.kernels[k->op](&dc);
        CHECK(st == FR_OK, "%s: device run %d: %s", label, r, fr_last_error(g_dev));
        for (int j = 0; j < nout; j++) {
            got[r][j] = want[j];
            if (!want[j].data) continue;
            got[r][j].data = calloc(nbytes(&want[j]) + 1, 1);
            CHECK(fr_cl_read(g_dev, g_cl, fr_cl_mem(&dc.out[j]), dc.out[j].off, got[r][j].data,
                             nbytes(&want[j])) == FR_OK,
                  "%s", fr_last_error(g_dev));
        }
        for (int i = 0; i < FR_MAX_IN + FR_MAX_OUT; i++)
            if (keep[i]) fr_cl_release(keep[i]);
    }
    for (int j = 0; j < nout; j++) {
        if (!want[j].data) continue;
        CHECK(!memcmp(got[0][j].data, got[1][j].data, nbytes(&want[j])),
              "%s out[%d]: two device runs differ", label, j);
        compare(k, j, &want[j], &got[0][j], label);
        free(got[0][j].data);
        free(got[1][j].data);
        free(want[j].data);
    }
    for (int i = 0; i < nin; i++) free(hc.in[i].data);
}

static void free_case(tcase *k) {
    for (int i = 0; i < FR_MAX_IN; i++) free(k->in[i].data);
    for (int j = 0; j < FR_MAX_OUT; j++) free(k->out[j].data);
}

/* ---- activations ---- */

static const fr_dtype k_dts[3] = {FR_F32, FR_F16, FR_BF16};

/* bounds of the activations (see the top of the file); approx picks GELU's form */
static void act_bound(fr_op op, int approx, tcase *k) {
    const double eps = FLT_EPSILON;
    k->rel = k->absx = 0;
    if (op == FR_OP_SIGMOID || op == FR_OP_TANH) k->rel = 8 * eps;
    if (op == FR_OP_GELU && !approx) k->rel = 8 * eps, k->absx = 10 * eps;
    if (op == FR_OP_GELU_BWD && !approx) k->rel = 8 * eps, k->absx = 20 * eps;
}

static void test_activations(void) {
    static const fr_op fwd[4] = {FR_OP_RELU, FR_OP_GELU, FR_OP_SIGMOID, FR_OP_TANH};
    static const fr_op bwd[4] = {FR_OP_RELU_BWD, FR_OP_GELU_BWD, FR_OP_SIGMOID_BWD, FR_OP_TANH_BWD};
    static const int64_t sizes[3] = {7, 13, 4 * 64 * 768}; /* the last: a GPT-2 block's (B,T,C) */
    for (int o = 0; o < 4; o++)
        for (int approx = 0; approx <= (fwd[o] == FR_OP_GELU); approx++)
            for (int si = 0; si < 3; si++) {
                const int64_t n = sizes[si];
                const fr_shape s = fr_shape1(n);
                char label[128];
                /* forward: y in f32, f16, bf16; f32 also in place */
                for (int d = 0; d < 3; d++)
                    for (int alias = 0; alias <= (d == 0); alias++) {
                        tcase k = {.op = fwd[o], .alias = alias};
                        k.attr.approx = approx;
                        act_bound(fwd[o], approx, &k);
                        k.in[0] = host(FR_F32, s);
                        fill(&k.in[0], 5.0f, si == 1);
                        k.out[0] = host(k_dts[d], s);
                        fill(&k.out[0], 1.0f, 0);
                        snprintf(label, sizeof label, "%s approx %d n %lld y %s%s",
                                 fr_op_get(fwd[o])->name, approx, (long long)n,
                                 fr_dtype_name(k_dts[d]), alias ? " in place" : "");
                        run_case(&k, label);
                        free_case(&k);
                    }
                /* backward: saved value in f32, f16, bf16; accumulate on and off; dx
                 * on dy; dx absent */
                for (int d = 0; d < 3; d++)
                    for (int acc = 0; acc <= 1; acc++)
                        for (int alias = 0; alias <= 1; alias++) {
                            tcase k = {.op = bwd[o], .acc = (uint32_t)acc, .alias = alias};
                            k.attr.approx = approx;
                            act_bound(bwd[o], approx, &k);
                            k.in[0] = host(FR_F32, s);
                            fill(&k.in[0], 2.0f, 0);
                            k.in[1] = host(k_dts[d], s);
                            /* the saved y of sigmoid lies in (0, 1), of tanh in (-1, 1) */
                            fill(&k.in[1], bwd[o] == FR_OP_GELU_BWD ? 5.0f : 1.0f, si == 1);
                            k.out[0] = host(FR_F32, s);
                            fill(&k.out[0], 1.0f, 0);
                            snprintf(label, sizeof label, "%s approx %d n %lld saved %s acc %d%s",
                                     fr_op_get(bwd[o])->name, approx, (long long)n,
                                     fr_dtype_name(k_dts[d]), acc, alias ? " in place" : "");
                            run_case(&k, label);
                            free_case(&k);
                        }
                /* dx absent: nothing to do, no error */
                tcase k = {.op = bwd[o]};
                k.in[0] = host(FR_F32, s);
                k.in[1] = host(FR_F32, s);
                k.out[0] = (fr_tensor){.dtype = FR_F32, .shape = s};
                snprintf(label, sizeof label, "%s dx absent", fr_op_get(bwd[o])->name);
                run_case(&k, label);
                free_case(&k);
            }
}

/* ---- ADD, COPY, POS_EMBEDDING ---- */

static void test_add_copy_pos(void) {
    static const int64_t sizes[3] = {7, 13, 4 * 64 * 768};
    char label[128];
    for (int si = 0; si < 3; si++) {
        const fr_shape s = fr_shape1(sizes[si]);
        for (int alias = 0; alias <= 1; alias++) {
            tcase k = {.op = FR_OP_ADD, .alias = alias};
            k.in[0] = host(FR_F32, s), k.in[1] = host(FR_F32, s), k.out[0] = host(FR_F32, s);
            fill(&k.in[0], 3.0f, si == 1), fill(&k.in[1], 3.0f, 0), fill(&k.out[0], 1.0f, 0);
            snprintf(label, sizeof label, "add n %lld%s", (long long)sizes[si],
                     alias ? " in place" : "");
            run_case(&k, label);
            free_case(&k);
        }
        for (int acc = 0; acc <= 1; acc++) {
            tcase k = {.op = FR_OP_COPY, .acc = (uint32_t)acc};
            k.in[0] = host(FR_F32, s), k.out[0] = host(FR_F32, s);
            fill(&k.in[0], 3.0f, si == 1), fill(&k.out[0], 1.0f, 0);
            snprintf(label, sizeof label, "copy n %lld acc %d", (long long)sizes[si], acc);
            run_case(&k, label);
            free_case(&k);
        }
    }
    /* (B,T,C) with T < Tmax; a GPT-2-like (4, 64, 768) with Tmax 1024 */
    static const int64_t shp[3][4] = {{1, 1, 1, 1}, {3, 5, 7, 13}, {4, 64, 768, 1024}};
    for (int si = 0; si < 3; si++)
        for (int alias = 0; alias <= 1; alias++) {
            const int64_t B = shp[si][0], T = shp[si][1], C = shp[si][2], Tmax = shp[si][3];
            tcase k = {.op = FR_OP_POS_EMBEDDING, .alias = alias};
            k.in[0] = host(FR_F32, fr_shape3(B, T, C));
            k.in[1] = host(FR_F32, fr_shape2(Tmax, C));
            k.out[0] = host(FR_F32, fr_shape3(B, T, C));
            fill(&k.in[0], 1.0f, 0), fill(&k.in[1], 1.0f, 0), fill(&k.out[0], 1.0f, 0);
            snprintf(label, sizeof label, "pos_embedding (%lld,%lld,%lld) Tmax %lld%s",
                     (long long)B, (long long)T, (long long)C, (long long)Tmax,
                     alias ? " in place" : "");
            run_case(&k, label);
            free_case(&k);
        }
}

/* ---- CAST ---- */

/* f32 bit patterns that exercise the rounding: ties to even in both formats,
 * the f16 subnormal range and its halfway points, the overflow edge 65520,
 * infinities, NaNs with payloads (quiet and signalling), then random bits. */
static void fill_cast_f32(fr_tensor *t) {
    static const uint32_t sp[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
        0x7fa5a5a5u, 0xff812345u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0xc77ff000u, 0x38800000u,
        0x387fffffu, 0x33000000u, 0x33000001u, 0x337fffffu, 0x33800000u, 0x33c00000u, 0x34200000u,
        0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f808000u, 0x3f818000u, 0x3f817fffu, 0x7f7fffffu,
        0xff7fffffu, 0x00000001u, 0x807fffffu, 0x3c000000u};
    const int64_t n = fr_shape_numel(&t->shape);
    uint32_t *u = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)(rnd64() >> 32);
        if (i % 3 == 1) v = (v & 0x8fffffffu) | 0x30000000u; /* near 1: f16's normal range */
        u[i] = i < (int64_t)(sizeof sp / sizeof sp[0]) ? sp[i] : v;
    }
}

static void test_cast(void) {
    char label[128];
    /* every 16-bit pattern to f32 */
    for (int d = 1; d < 3; d++) {
        tcase k = {.op = FR_OP_CAST};
        k.attr.dtype = FR_F32;
        k.in[0] = host(k_dts[d], fr_shape1(65536));
        for (int i = 0; i < 65536; i++) ((uint16_t *)k.in[0].data)[i] = (uint16_t)i;
        k.out[0] = host(FR_F32, fr_shape1(65536));
        snprintf(label, sizeof label, "cast every %s pattern to f32", fr_dtype_name(k_dts[d]));
        run_case(&k, label);
        free_case(&k);
    }
    /* f32 to f16 and bf16, and f32 rounded through them, overwriting and adding */
    static const int64_t sizes[3] = {7, 13, 1 << 20};
    for (int si = 0; si < 3; si++)
        for (int d = 1; d < 3; d++)
            for (int mode = 0; mode < 3; mode++) { /* narrow, narrow-add, round f32 -> f32 */
                const fr_shape s = fr_shape1(sizes[si]);
                tcase k = {.op = FR_OP_CAST, .acc = mode == 1};
                k.attr.dtype = mode == 2 ? FR_F32 : k_dts[d];
                k.attr.round = mode == 2 ? k_dts[d] : FR_F32;
                k.in[0] = host(FR_F32, s);
                if (mode == 1) fill(&k.in[0], 4.0f, 0);
                else fill_cast_f32(&k.in[0]);
                k.out[0] = host(mode == 2 ? FR_F32 : k_dts[d], s);
                fill(&k.out[0], 4.0f, 0);
                snprintf(label, sizeof label, "cast n %lld f32 -> %s%s", (long long)sizes[si],
                         fr_dtype_name(k_dts[d]),
                         mode == 1   ? " added"
                         : mode == 2 ? " rounded, stored f32"
                                     : "");
                run_case(&k, label);
                free_case(&k);
            }
    /* the same dtype: a copy of the bytes (i32 as well) */
    static const fr_dtype same[4] = {FR_F32, FR_F16, FR_BF16, FR_I32};
    for (int d = 0; d < 4; d++) {
        tcase k = {.op = FR_OP_CAST};
        k.attr.dtype = same[d];
        k.in[0] = host(same[d], fr_shape1(13));
        k.out[0] = host(same[d], fr_shape1(13));
        for (size_t i = 0; i < nbytes(&k.in[0]); i++)
            ((uint8_t *)k.in[0].data)[i] = (uint8_t)rnd64();
        snprintf(label, sizeof label, "cast %s -> %s", fr_dtype_name(same[d]),
                 fr_dtype_name(same[d]));
        run_case(&k, label);
        free_case(&k);
    }
}

/* ---- DROPOUT ---- */

static void test_dropout(void) {
    static const int64_t sizes[3] = {7, 13, 4 * 64 * 768};
    static const float ps[4] = {0.0f, 0.1f, 0.5f, 1.0f};
    char label[128];
    for (int si = 0; si < 3; si++)
        for (int pi = 0; pi < 4; pi++)
            for (int training = 0; training <= 1; training++) {
                const fr_shape s = fr_shape1(sizes[si]);
                for (int has_mask = 0; has_mask <= training; has_mask++)
                    for (int alias = 0; alias <= 1; alias++) {
                        tcase k = {.op = FR_OP_DROPOUT, .alias = alias};
                        k.attr.p = ps[pi], k.attr.training = training,
                        k.attr.salt = 0x1234u + (uint32_t)si;
                        k.in[0] = host(FR_F32, s);
                        fill(&k.in[0], 2.0f, 0);
                        k.out[0] = host(FR_F32, s);
                        fill(&k.out[0], 1.0f, 0);
                        if (has_mask) k.out[1] = host(FR_U8, s);
                        if (has_mask) memset(k.out[1].data, 7, (size_t)sizes[si]);
                        snprintf(label, sizeof label, "dropout n %lld p %g training %d mask %d%s",
                                 (long long)sizes[si], (double)ps[pi], training, has_mask,
                                 alias ? " in place" : "");
                        run_case(&k, label);
                        free_case(&k);
                    }
                for (int acc = 0; acc <= 1; acc++)
                    for (int alias = 0; alias <= 1; alias++) {
                        tcase k = {.op = FR_OP_DROPOUT_BWD, .acc = (uint32_t)acc, .alias = alias};
                        k.attr.p = ps[pi], k.attr.training = training;
                        k.in[0] = host(FR_F32, s);
                        fill(&k.in[0], 2.0f, 0);
                        if (training) {
                            k.in[1] = host(FR_U8, s);
                            fill(&k.in[1], 0, 0);
                        }
                        k.out[0] = host(FR_F32, s);
                        fill(&k.out[0], 1.0f, 0);
                        snprintf(label, sizeof label,
                                 "dropout_bwd n %lld p %g training %d acc %d%s",
                                 (long long)sizes[si], (double)ps[pi], training, acc,
                                 alias ? " in place" : "");
                        run_case(&k, label);
                        free_case(&k);
                    }
            }

    /* the device's mask is the generator's own decision, element by element:
     * keep_i = fr_rng_uniform(seed, (step << 32) | salt, i) >= p, about 1 - p of them */
    const int64_t n = 100003;
    const uint64_t seed = 0xabcdef12345ull, step = 41;
    const float p = 0.3f;
    fr_node nd;
    fr_attr a = {.p = p, .training = 1, .salt = 99};
    node_init(&nd, FR_OP_DROPOUT, &a, 0);
    fr_tensor x = host(FR_F32, fr_shape1(n)), m = host(FR_U8, fr_shape1(n));
    fill(&x, 1.0f, 0);
    cl_mem kx = NULL, ky = NULL, km = NULL;
    fr_kernel_call dc = {.ctx = g_dev, .node = &nd, .seed = seed, .step = step};
    dc.in[0] = upload(&x, &kx), dc.out[0] = upload(&x, &ky), dc.out[1] = upload(&m, &km);
    CHECK(fr_cl_k_dropout(&dc) == FR_OK, "%s", fr_last_error(g_dev));
    CHECK(fr_cl_read(g_dev, g_cl, km, OFF, m.data, (size_t)n) == FR_OK, "%s", fr_last_error(g_dev));
    int64_t bad = -1, kept = 0;
    const uint8_t *mk = m.data;
    for (int64_t i = 0; i < n; i++) {
        const int keep = fr_rng_uniform(seed, (step << 32) | 99u, (uint64_t)i) >= p;
        kept += mk[i];
        if (mk[i] != keep && bad < 0) bad = i;
    }
    CHECK(bad < 0, "dropout mask element %lld differs from the generator's", (long long)bad);
    /* binomial(n, 0.7): mean 70002, sd 145; 6 sd */
    CHECK(llabs(kept - 70002) < 870, "dropout kept %lld of %lld at p 0.3", (long long)kept,
          (long long)n);
    fr_cl_release(kx), fr_cl_release(ky), fr_cl_release(km);
    free(x.data), free(m.data);
}

/* ---- errors: the CPU's status and message ---- */

static void same_error(fr_op op, const fr_attr *a, uint32_t acc, fr_tensor *in, int nin,
                       fr_tensor *out, int nout, const char *label) {
    fr_node nd;
    node_init(&nd, op, a, acc);
    fr_kernel_call hc = {.ctx = g_host, .node = &nd, .accumulate = acc};
    fr_kernel_call dc = {.ctx = g_dev, .node = &nd, .accumulate = acc};
    cl_mem keep[FR_MAX_IN + FR_MAX_OUT] = {0};
    for (int i = 0; i < nin; i++) hc.in[i] = in[i], dc.in[i] = upload(&in[i], &keep[i]);
    for (int j = 0; j < nout; j++)
        hc.out[j] = out[j], dc.out[j] = upload(&out[j], &keep[FR_MAX_IN + j]);
    const int hs = fr_cpu_backend.kernels[op](&hc);
    const int ds = fr_cl_backend.kernels[op](&dc);
    CHECK(hs != FR_OK && ds == hs, "%s: cpu %d, device %d", label, hs, ds);
    CHECK(!strcmp(fr_last_error(g_host), fr_last_error(g_dev)), "%s: cpu '%s', device '%s'", label,
          fr_last_error(g_host), fr_last_error(g_dev));
    for (int i = 0; i < FR_MAX_IN + FR_MAX_OUT; i++)
        if (keep[i]) fr_cl_release(keep[i]);
}

static void test_errors(void) {
    fr_attr a = {0};
    fr_tensor x = host(FR_F32, fr_shape1(13)), y = host(FR_F32, fr_shape1(12));
    fr_tensor x16 = host(FR_F16, fr_shape1(13)), b16 = host(FR_BF16, fr_shape1(13));
    fr_tensor m = host(FR_U8, fr_shape1(13));
    fr_tensor in[2] = {x, x}, out[2] = {y, m};
    same_error(FR_OP_RELU, &a, 0, in, 1, out, 1, "relu: 13 elements into 12");
    same_error(FR_OP_GELU_BWD, &a, 0, in, 2, out, 1, "gelu_bwd: 13 elements into 12");
    in[1] = y, out[0] = x;
    same_error(FR_OP_TANH_BWD, &a, 0, in, 2, out, 1, "tanh_bwd: saved 12 for 13");
    same_error(FR_OP_ADD, &a, 0, in, 2, out, 1, "add: 13 and 12");
    in[0] = x16, out[0] = b16;
    same_error(FR_OP_CAST, &a, 0, in, 1, out, 1, "cast f16 -> bf16");
    in[0] = x16, out[0] = x;
    same_error(FR_OP_CAST, &a, 1, in, 1, out, 1, "cast adding f16 into f32");
    a.training = 1, a.p = 1.5f;
    in[0] = x, out[0] = x, out[1] = m;
    same_error(FR_OP_DROPOUT, &a, 0, in, 1, out, 2, "dropout p 1.5");
    a.p = 0.5f;
    in[1] = (fr_tensor){.dtype = FR_U8, .shape = fr_shape1(13)};
    same_error(FR_OP_DROPOUT_BWD, &a, 0, in, 2, out, 1, "dropout_bwd without its mask");
    fr_tensor px = host(FR_F32, fr_shape3(2, 5, 4)), pw = host(FR_F32, fr_shape2(4, 4));
    in[0] = px, in[1] = pw, out[0] = px;
    same_error(FR_OP_POS_EMBEDDING, &a, 0, in, 2, out, 1, "pos_embedding T 5 > Tmax 4");
    free(x.data), free(y.data), free(x16.data), free(b16.data), free(m.data), free(px.data),
        free(pw.data);
}

/* ---- the step's scale and unscale ---- */

static void test_scale(void) {
    static const size_t sizes[3] = {7, 13, 1 << 20};
    for (int si = 0; si < 3; si++)
        for (int bad = 0; bad < 3; bad++) { /* finite, an inf, a NaN */
            const size_t n = sizes[si];
            fr_tensor g = host(FR_F32, fr_shape1((int64_t)n));
            fill(&g, 3e4f, 0);
            float *gv = g.data;
            if (bad) gv[n / 2] = bad == 1 ? -INFINITY : NAN;
            const float f = 1.0f / 65536.0f * 3.0f;
            for (int which = 0; which < 2; which++) {
                float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
                memcpy(want, gv, n * sizeof *want);
                int want_inf = 0, got_inf = -1;
                if (which == 0) want_inf = fr_k_grad_unscale(want, FR_F32, n, f);
                else fr_k_grad_scale(want, FR_F32, n, f);
                cl_mem m = NULL;
                fr_tensor d = upload(&g, &m);
                int st = which == 0 ? fr_cl_unscale_check(g_dev, g_cl, m, OFF / 4, n, f, &got_inf)
                                    : fr_cl_scale(g_dev, g_cl, m, OFF / 4, n, f);
                CHECK(st == FR_OK, "%s", fr_last_error(g_dev));
                CHECK(fr_cl_read(g_dev, g_cl, m, d.off, got, n * sizeof *got) == FR_OK, "%s",
                      fr_last_error(g_dev));
                int64_t first = -1;
                for (size_t i = 0; i < n && first < 0; i++)
                    if (memcmp(&got[i], &want[i], 4) && !(isnan(got[i]) && isnan(want[i])))
                        first = (int64_t)i;
                CHECK(first < 0, "%s n %zu bad %d: element %lld: device %g, cpu %g",
                      which ? "scale" : "unscale", n, bad, (long long)first,
                      first < 0 ? 0.0 : got[first], first < 0 ? 0.0 : want[first]);
                if (which == 0)
                    CHECK(got_inf == want_inf && want_inf == (bad != 0),
                          "unscale n %zu bad %d: device found %d, cpu %d", n, bad, got_inf,
                          want_inf);
                fr_cl_release(m);
                free(want), free(got);
            }
            free(g.data);
        }
    int found = -1;
    CHECK(fr_cl_unscale_check(g_dev, g_cl, NULL, 0, 0, 2.0f, &found) == FR_OK && found == 0,
          "unscale of nothing: found %d", found);
}

int main(void) {
    g_host = fr_ctx_new();
    g_dev = fr_ctx_new();
    int n = 0;
    if (fr_cl_count(g_dev, &n) != FR_OK || n == 0) {
        puts("skipped: no OpenCL device");
        fr_ctx_free(g_dev);
        fr_ctx_free(g_host);
        return 77;
    }
    CHECK(fr_cl_use(g_dev, 0) == FR_OK, "%s", fr_last_error(g_dev));
    g_cl = fr_cl_of(g_dev);
    test_activations();
    test_add_copy_pos();
    test_cast();
    test_dropout();
    test_errors();
    test_scale();
    for (int op = 0; op < FR_OP_COUNT; op++)
        if (g_worst[op] > 0)
            printf("%s: largest |device - cpu| / bound %.3g\n", fr_op_get((fr_op)op)->name,
                   g_worst[op]);
    fr_cl_unuse(g_dev);
    fr_ctx_free(g_dev);
    fr_ctx_free(g_host);
    return check_done();
}
#endif
