/* test_opencl_optim.c — the OpenCL backend's optimizer step (its
 * optim_update member, which the step calls after backward and, for one
 * parameter, inside backward; and fr_cl_optim_update behind it) against the
 * CPU backend's (fr_k_sgd and fr_k_adam_state, themselves checked against
 * PyTorch in test_optim.c and test_optim_state.c): SGD (plain, weight decay, momentum
 * with dampening, Nesterov), Adam (with and without L2) and AdamW, f32 and
 * bf16 moments, five steps each with fresh gradients, sizes 7, 13 and
 * 100003, the parameter at a nonzero offset in its buffer; and 16-bit (f16,
 * bf16) weights with their state in their format, gradients f32 or 16-bit;
 * Adafactor (test_adafactor, its bound there).
 *
 * Bound: bit-identical. The device runs the CPU's float operations in its
 * order (no contraction; fma where the CPU calls fmaf), with / and sqrt in
 * double rounded once to float where the device has cl_khr_fp64, which is
 * the correctly rounded result the CPU's / and sqrtf give. A device without
 * fp64 uses its own / and sqrt (2.5 and 3 ulp allowed by OpenCL C): there the
 * bound is 8 ulp of |p| per step compounded over 5 steps, i.e. 1e-5 relative
 * plus 1e-7 for the moments.
 * Every sequence runs twice on the device: bit-identical. The dynamic maps
 * written into kernels/optim.cl are the CPU's (regenerated here from
 * fr_state_decode and found in the embedded source; `test_opencl_optim
 * --print-map` prints them). The CPU's errors are kept. Returns 77
 * when no device is found. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/optim_state.h"
#include "core/ctx.h"
#include "optim/optim.h"

/* The maps' text as kernels/optim.cl holds it, from the CPU's decoder: val
 * (codes 0..255 with absmax 1 decode to the entries exactly) and thr, the
 * smallest float above each midpoint (computed in double, as the CPU's
 * encoder compares); [0] unsigned (v), [1] signed (m). */
static char *map_text(void) {
    size_t cap = 1 << 16, len = 0;
    char *t = malloc(cap);
    float val[2][256], thr[2][256];
    int zero[2] = {-1, -1};
    for (int sgn = 0; sgn < 2; sgn++) {
        uint8_t buf[256 + 4];
        const float one = 1.0f;
        for (int k = 0; k < 256; k++) buf[k] = (uint8_t)k;
        memcpy(buf + 256, &one, sizeof one);
        fr_state_decode(buf, FR_STATE_INT8, 256, sgn, val[sgn]);
        for (int k = 0; k < 256; k++) {
            if (val[sgn][k] == 0.0f && zero[sgn] < 0) zero[sgn] = k;
            const double mid = k < 255 ? ((double)val[sgn][k] + val[sgn][k + 1]) / 2.0 : INFINITY;
            float x = (float)mid;
            if ((double)x <= mid) x = nextafterf(x, INFINITY);
            thr[sgn][k] = x;
        }
    }
    len += (size_t)snprintf(t + len, cap - len,
                            "#define DYN_ZERO_UNSIGNED %d\n#define DYN_ZERO_SIGNED %d\n", zero[0],
                            zero[1]);
    const char *names[2] = {"dyn_val", "dyn_thr"};
    for (int a = 0; a < 2; a++) {
        len += (size_t)snprintf(t + len, cap - len, "__constant float %s[2][256] = {\n", names[a]);
        for (int sgn = 0; sgn < 2; sgn++) {
            len += (size_t)snprintf(t + len, cap - len, "    {");
            for (int k = 0; k < 256; k++) {
                const float x = a ? thr[sgn][k] : val[sgn][k];
                if (isinf(x)) len += (size_t)snprintf(t + len, cap - len, "INFINITY");
                else len += (size_t)snprintf(t + len, cap - len, "%af", (double)x);
                if (k < 255)
                    len += (size_t)snprintf(t + len, cap - len, k % 6 == 5 ? ",\n     " : ", ");
            }
            len += (size_t)snprintf(t + len, cap - len, sgn ? "}};\n" : "},\n");
        }
    }
    return t;
}

/* `--print-map`: print map_text (1: done, main returns 0). */
static int print_map(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--print-map")) return 0;
    char *t = map_text();
    fputs(t, stdout);
    free(t);
    return 1;
}

#ifndef FR_HAVE_OPENCL
/* Without OpenCL there is no embedded optim.cl to compare the maps with. */
int main(int argc, char **argv) {
    if (print_map(argc, argv)) return 0;
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "cl_device.h"
#include "backend/cpu/kernels.h"
#include "backend/opencl/optim.h"
#include "backend/opencl/runtime.h"
#include "core/half.h"
#include "core/rng.h"

static int exact; /* 1: the device has fp64, the bound is bit identity */

static float urand(uint64_t seed, uint64_t i) {
    return (float)(2.0 * fr_rng_uniform(seed, 7, i) - 1.0);
}

/* A device buffer holding n elements of esz bytes from byte `pad`, written from src. */
static cl_mem upload(fr_ctx *ctx, const void *src, size_t bytes, size_t pad) {
    cl_mem m = NULL;
    CHECK(fr_cl_alloc(ctx, fr_cl_of(ctx), pad + bytes, &m) == FR_OK, "%s", fr_last_error(ctx));
    if (m)
        CHECK(fr_cl_write(ctx, fr_cl_of(ctx), m, pad, src, bytes) == FR_OK, "%s",
              fr_last_error(ctx));
    return m;
}

static void download(fr_ctx *ctx, cl_mem m, size_t pad, void *dst, size_t bytes) {
    CHECK(fr_cl_read(ctx, fr_cl_of(ctx), m, pad, dst, bytes) == FR_OK, "%s", fr_last_error(ctx));
}

static int close_f(float a, float b, float rel, float abs_) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (exact) return memcmp(&a, &b, sizeof a) == 0;
    return fabsf(a - b) <= rel * fabsf(b) + abs_;
}

typedef struct run_out {
    float *p;
    void *s[2]; /* the state as stored */
} run_out;

/* Five steps of o (state kind k) on n values from the same start, on the
 * CPU (dev 0: its backend's optim_update) or the device (dev 1: through the
 * backend's optim_update when via_backend, else fr_cl_optim_update), into
 * out. */
static void run_steps(fr_ctx *cpu, fr_ctx *ctx, int dev, int via_backend, const fr_optim_opts *o,
                      fr_state_kind k, size_t n, run_out *out) {
    const size_t sb = fr_state_bytes(k, n), pad = 192; /* p, g at byte 192 of their buffers */
    const int nstate = o->kind == FR_OPTIM_SGD ? (o->momentum != 0.0 ? 1 : 0) : 2;
    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    void *s[2] = {calloc(1, sb), calloc(1, sb)};
    for (size_t i = 0; i < n; i++) p[i] = urand(1, i);
    cl_mem pm = NULL, gm = NULL, sm[2] = {NULL, NULL};
    if (dev) {
        pm = upload(ctx, p, n * sizeof *p, pad);
        gm = upload(ctx, g, n * sizeof *g, pad);
        for (int j = 0; j < nstate; j++) sm[j] = upload(ctx, s[j], sb, 0);
    }
    fr_tensor state[2] = {{0}, {0}}; /* each from byte 0 of its buffer */
    for (int j = 0; j < nstate; j++)
        state[j] = (fr_tensor){FR_F32, fr_shape1((int64_t)n), dev ? NULL : s[j], sm[j], 0};
    const fr_shape sh = fr_shape1((int64_t)n);
    fr_tensor gt = {FR_F32, sh, dev ? NULL : g, gm, dev ? pad : 0};
    fr_tensor pt = {FR_F32, sh, dev ? NULL : p, pm, dev ? pad : 0};
    for (int64_t t = 1; t <= 5; t++) {
        for (size_t i = 0; i < n; i++) g[i] = urand(100 + (uint64_t)t, i) * (t == 3 ? 1e-3f : 1.0f);
        if (t == 4 && n > 4100) g[4100] = INFINITY; /* int8: block 2 becomes a NaN block */
        int st;
        if (!dev) st = fr_cpu_backend.optim_update(cpu, o, t, &pt, &gt, state, (int)k);
        else {
            CHECK(fr_cl_write(ctx, fr_cl_of(ctx), gm, pad, g, n * sizeof *g) == FR_OK, "%s",
                  fr_last_error(ctx));
            st = via_backend
                     ? fr_backend_of(ctx)->optim_update(ctx, o, t, &pt, &gt, state, (int)k)
                     : fr_cl_optim_update(ctx, fr_cl_of(ctx), o, t, &pt, &gt, state, (int)k);
        }
        CHECK(st == FR_OK, "step %lld: %s", (long long)t, fr_last_error(dev ? ctx : cpu));
    }
    if (dev) {
        download(ctx, pm, pad, p, n * sizeof *p);
        for (int j = 0; j < nstate; j++) download(ctx, sm[j], 0, s[j], sb);
        fr_cl_release(pm), fr_cl_release(gm), fr_cl_release(sm[0]), fr_cl_release(sm[1]);
    }
    free(g);
    out->p = p, out->s[0] = s[0], out->s[1] = s[1];
}

static void free_out(run_out *r) { free(r->p), free(r->s[0]), free(r->s[1]); }

static void check_case(fr_ctx *cpu, fr_ctx *ctx, const char *name, const fr_optim_opts *o,
                       fr_state_kind k, size_t n) {
    run_out want, got, again;
    run_steps(cpu, ctx, 0, 0, o, k, n, &want);
    run_steps(cpu, ctx, 1, 1, o, k, n, &got);
    run_steps(cpu, ctx, 1, 0, o, k, n, &again);
    const int nstate = o->kind == FR_OPTIM_SGD ? (o->momentum != 0.0 ? 1 : 0) : 2;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!close_f(got.p[i], want.p[i], 1e-5f, 1e-7f) && !bad++) first = i;
    CHECK(!bad, "%s n %zu: %zu parameters differ, first %zu: %.9g vs cpu %.9g", name, n, bad, first,
          got.p[first], want.p[first]);
    for (int j = 0; j < nstate; j++) {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        fr_state_decode(got.s[j], k, n, j == 0, a);
        fr_state_decode(want.s[j], k, n, j == 0, b);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!close_f(a[i], b[i], 1e-5f, 1e-7f) && !bad++) first = i;
        CHECK(!bad, "%s n %zu: state %d: %zu values differ, first %zu: %.9g vs cpu %.9g", name, n,
              j, bad, first, a[first], b[first]);
        free(a), free(b);
        if (exact)
            CHECK(!memcmp(got.s[j], want.s[j], fr_state_bytes(k, n)),
                  "%s n %zu: state %d: the stored bytes differ from the cpu's", name, n, j);
        CHECK(!memcmp(got.s[j], again.s[j], fr_state_bytes(k, n)),
              "%s n %zu: state %d differs between two device runs", name, n, j);
    }
    CHECK(!memcmp(got.p, again.p, n * sizeof *got.p), "%s n %zu: two device runs differ", name, n);
    free_out(&want), free_out(&got), free_out(&again);
}

static void test_cases(fr_ctx *cpu, fr_ctx *ctx) {
    const size_t sizes[] = {7, 13, 2048, 100003};
    fr_optim_opts sgd = fr_optim_defaults(FR_OPTIM_SGD);
    sgd.lr = 0.1;
    for (int si = 0; si < 4; si++) {
        const size_t n = sizes[si];
        fr_optim_opts o = sgd;
        check_case(cpu, ctx, "sgd", &o, FR_STATE_F32, n);
        o.weight_decay = 0.01;
        check_case(cpu, ctx, "sgd wd", &o, FR_STATE_F32, n);
        o.momentum = 0.9, o.dampening = 0.1;
        check_case(cpu, ctx, "sgd momentum dampening wd", &o, FR_STATE_F32, n);
        o.dampening = 0.0, o.nesterov = 1;
        check_case(cpu, ctx, "sgd nesterov wd", &o, FR_STATE_F32, n);
        for (int kind = FR_OPTIM_ADAM; kind <= FR_OPTIM_ADAMW; kind++)
            for (int ks = 0; ks < FR_STATE_KIND_COUNT; ks++) {
                fr_state_kind k = (fr_state_kind)ks;
                fr_optim_opts a = fr_optim_defaults((fr_optim_kind)kind);
                a.lr = 1e-2;
                char name[64];
                snprintf(name, sizeof name, "%s %s", kind == FR_OPTIM_ADAM ? "adam" : "adamw",
                         fr_state_kind_name(k));
                check_case(cpu, ctx, name, &a, k, n);
                a.weight_decay = 0.05;
                snprintf(name, sizeof name, "%s %s wd", kind == FR_OPTIM_ADAM ? "adam" : "adamw",
                         fr_state_kind_name(k));
                check_case(cpu, ctx, name, &a, k, n);
            }
    }
}

/* 16-bit weights (pure fp16 / bf16): five steps of o on the CPU as its step
 * takes them (fr_k_adam_half; widen, fr_k_sgd, narrow) or on the device
 * (fr_cl_optim_update); p and the state come back as stored. */
static void run_half(fr_ctx *ctx, int dev, const fr_optim_opts *o, int is_f16, int g_half, size_t n,
                     uint16_t *p, uint16_t *s0, uint16_t *s1) {
    const size_t pad = 64, hb = n * sizeof(uint16_t);
    const fr_dtype dt = is_f16 ? FR_F16 : FR_BF16;
    float *g = malloc(n * sizeof *g), *w = malloc(3 * n * sizeof *w);
    uint16_t *g16 = malloc(hb);
    for (size_t i = 0; i < n; i++) w[i] = urand(5, i);
    if (is_f16) fr_f32_to_f16_n(w, p, n);
    else fr_f32_to_bf16_n(w, p, n);
    memset(s0, 0, hb), memset(s1, 0, hb);
    cl_mem pm = NULL, gm = NULL, sm[2] = {NULL, NULL};
    fr_tensor state[2] = {{0}, {0}};
    if (dev) {
        pm = upload(ctx, p, hb, pad);
        gm = upload(ctx, g, n * sizeof *g, pad);
        sm[0] = upload(ctx, s0, hb, 0), sm[1] = upload(ctx, s1, hb, 0);
        for (int j = 0; j < 2; j++)
            state[j] = (fr_tensor){dt, fr_shape1((int64_t)n), NULL, sm[j], 0};
    }
    for (int64_t t = 1; t <= 5; t++) {
        for (size_t i = 0; i < n; i++) g[i] = urand(200 + (uint64_t)t, i);
        if (is_f16) fr_f32_to_f16_n(g, g16, n);
        else fr_f32_to_bf16_n(g, g16, n);
        if (dev) {
            CHECK(fr_cl_write(ctx, fr_cl_of(ctx), gm, pad, g_half ? (void *)g16 : (void *)g,
                              g_half ? hb : n * sizeof *g) == FR_OK,
                  "%s", fr_last_error(ctx));
            fr_tensor pt = {dt, fr_shape1((int64_t)n), NULL, pm, pad};
            fr_tensor gt = {g_half ? dt : FR_F32, fr_shape1((int64_t)n), NULL, gm, pad};
            CHECK(fr_cl_optim_update(ctx, fr_cl_of(ctx), o, t, &pt, &gt, state, FR_STATE_F32) ==
                      FR_OK,
                  "%s", fr_last_error(ctx));
        } else if (o->kind != FR_OPTIM_SGD) {
            fr_k_adam_half(p, g_half ? (const void *)g16 : (const void *)g, g_half, s0, s1, n, o, t,
                           o->kind == FR_OPTIM_ADAMW, is_f16);
        } else {
            float *pw = w, *gw = w + n, *bw = w + 2 * n;
            if (is_f16) {
                fr_f16_to_f32_n(p, pw, n), fr_f16_to_f32_n(g16, gw, n), fr_f16_to_f32_n(s0, bw, n);
            } else {
                fr_bf16_to_f32_n(p, pw, n), fr_bf16_to_f32_n(g16, gw, n);
                fr_bf16_to_f32_n(s0, bw, n);
            }
            fr_k_sgd(pw, g_half ? gw : g, bw, n, o, t == 1);
            if (is_f16) fr_f32_to_f16_n(pw, p, n), fr_f32_to_f16_n(bw, s0, n);
            else fr_f32_to_bf16_n(pw, p, n), fr_f32_to_bf16_n(bw, s0, n);
        }
    }
    if (dev) {
        download(ctx, pm, pad, p, hb);
        download(ctx, sm[0], 0, s0, hb), download(ctx, sm[1], 0, s1, hb);
        fr_cl_release(pm), fr_cl_release(gm), fr_cl_release(sm[0]), fr_cl_release(sm[1]);
    }
    free(g), free(w), free(g16);
}

/* Bound: bit-identical where the device has fp64 (the same f32 operations
 * and the CPU's roundings to 16 bits), else within one 16-bit ulp. */
static void test_half(fr_ctx *ctx) {
    const size_t sizes[] = {7, 13, 100003};
    for (int kind = 0; kind < 3; kind++)
        for (int is_f16 = 0; is_f16 < 2; is_f16++)
            for (int g_half = 0; g_half < 2; g_half++)
                for (int si = 0; si < 3; si++) {
                    const size_t n = sizes[si], hb = n * sizeof(uint16_t);
                    fr_optim_opts o = fr_optim_defaults((fr_optim_kind)kind);
                    if (kind == FR_OPTIM_SGD) o.lr = 0.1, o.momentum = 0.9, o.nesterov = 1;
                    else o.lr = 1e-2;
                    o.weight_decay = 0.01;
                    uint16_t *b[3][3];
                    for (int r = 0; r < 3; r++)
                        for (int j = 0; j < 3; j++) b[r][j] = malloc(hb);
                    run_half(ctx, 0, &o, is_f16, g_half, n, b[0][0], b[0][1], b[0][2]);
                    run_half(ctx, 1, &o, is_f16, g_half, n, b[1][0], b[1][1], b[1][2]);
                    run_half(ctx, 1, &o, is_f16, g_half, n, b[2][0], b[2][1], b[2][2]);
                    const int nst = kind == FR_OPTIM_SGD ? 1 : 2;
                    for (int j = 0; j <= nst; j++) {
                        size_t bad = 0;
                        for (size_t i = 0; i < n; i++) {
                            const int d = (int)b[1][j][i] - (int)b[0][j][i];
                            bad += exact ? d != 0 : (d > 1 || d < -1);
                        }
                        CHECK(!bad, "%s %s, grad %s, n %zu: %s: %zu values differ from the cpu's",
                              kind == FR_OPTIM_SGD    ? "sgd"
                              : kind == FR_OPTIM_ADAM ? "adam"
                                                      : "adamw",
                              is_f16 ? "f16" : "bf16", g_half ? "16-bit" : "f32", n,
                              j ? "state" : "parameter", bad);
                        CHECK(!memcmp(b[1][j], b[2][j], hb), "16-bit n %zu: two device runs differ",
                              n);
                    }
                    for (int r = 0; r < 3; r++)
                        for (int j = 0; j < 3; j++) free(b[r][j]);
                }
}

/* Adafactor: five steps of the device's (fr_cl_optim_update) against the
 * CPU's fr_k_adafactor from the same start and gradients: matrices (one
 * slice under a sum block, and (300, 200) over 29 blocks), a batched
 * (3, 4, 5) tensor, a conv-like (6, 2, 3, 3), vectors (11 and 70000 over 35
 * blocks); defaults, and with the first moment and weight decay; the
 * weights and the state at nonzero offsets, the scratch
 * (fr_factored_scratch) its own buffer. Bound: bit-identical with fp64
 * (the same sums in double in the same order, the same float operations,
 * / and sqrt correctly rounded); without it each sum is float, whose
 * relative error over at most 2^17 terms is 2^17 x 2^-24 = 2^-7 at worst
 * (the CPU's double is exact to 2^-50): RMS(U) and the factors move by that
 * relatively, and so do alpha / denom and the update, which is at most
 * lr x max(eps2, RMS(p)) per step: the weights within 5 x 2^-7 x 1e-2 x
 * max(1e-3, RMS(p)) + 1 ulp a step, the state within 2^-6 relative. */
static void test_adafactor(fr_ctx *ctx) {
    const fr_shape shapes[] = {fr_shape2(7, 13),      fr_shape2(300, 200), fr_shape3(3, 4, 5),
                               fr_shape4(6, 2, 3, 3), fr_shape1(11),       fr_shape1(70000)};
    fr_cl *cl = fr_cl_of(ctx);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int variant = 0; variant < 2; variant++) {
            const fr_shape *sh = &shapes[si];
            fr_optim_opts o = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
            if (variant) o.beta1 = 0.9, o.weight_decay = 0.05, o.lr = 0.3;
            const size_t n = (size_t)fr_shape_numel(sh), ns = fr_optim_state_elems(&o, sh);
            fr_factored f = fr_factored_of(sh);
            const size_t scratch = fr_factored_scratch(&f, NULL), pad = 192;
            float *p = malloc(n * 4), *g = malloc(n * 4), *st = calloc(ns, 4);
            float *dp = malloc(n * 4), *dst = malloc(ns * 4);
            for (size_t k = 0; k < n; k++) p[k] = urand(si * 2 + 1, k) * 1.5f;
            if (si == 2) memset(p, 0, n * 4); /* RMS(p) 0: alpha = eps2 rho */
            cl_mem pm = upload(ctx, p, n * 4, pad), sm = upload(ctx, st, ns * 4, pad), gm = NULL,
                   scm = NULL;
            CHECK(fr_cl_alloc(ctx, cl, pad + n * 4, &gm) == FR_OK &&
                      fr_cl_alloc(ctx, cl, scratch, &scm) == FR_OK,
                  "%s", fr_last_error(ctx));
            double rms = 0;
            for (size_t k = 0; k < n; k++) rms += (double)p[k] * p[k];
            rms = sqrt(rms / (double)n);
            for (int t = 1; t <= 5; t++) {
                for (size_t k = 0; k < n; k++)
                    g[k] = (k % 7 == 3 && si == 0) ? 0.0f : urand(100 + si * 10 + (uint64_t)t, k);
                fr_cl_write(ctx, cl, gm, pad, g, n * 4);
                fr_k_adafactor(p, g, st, sh, &o, t);
                fr_tensor tp = {FR_F32, *sh, NULL, pm, pad}, tg = {FR_F32, *sh, NULL, gm, pad};
                fr_tensor ts[2] = {{FR_F32, fr_shape1((int64_t)ns), NULL, sm, pad},
                                   {FR_F32, fr_shape1((int64_t)(scratch / 4)), NULL, scm, 0}};
                CHECK(fr_cl_optim_update(ctx, cl, &o, t, &tp, &tg, ts, FR_STATE_F32) == FR_OK,
                      "adafactor on the device: %s", fr_last_error(ctx));
            }
            download(ctx, pm, pad, dp, n * 4);
            download(ctx, sm, pad, dst, ns * 4);
            const double step = 5 * 0.0078125 * fmax(o.lr, 1e-2) * fmax(1e-3, rms);
            size_t bad_p = 0, bad_s = 0;
            for (size_t k = 0; k < n; k++)
                bad_p += exact ? memcmp(&p[k], &dp[k], 4) != 0
                               : !(fabsf(p[k] - dp[k]) <= step + 5 * 1.2e-7f * fabsf(p[k]));
            for (size_t k = 0; k < ns; k++)
                bad_s += exact ? memcmp(&st[k], &dst[k], 4) != 0
                               : !(fabsf(st[k] - dst[k]) <= 0.015625f * fabsf(st[k]) + 1e-30f);
            char b[64];
            CHECK(bad_p == 0 && bad_s == 0,
                  "adafactor %s%s: %zu of %zu weights and %zu of %zu state floats differ",
                  fr_shape_str(sh, b, sizeof b), variant ? " (beta1, wd)" : "", bad_p, n, bad_s,
                  ns);
            fr_cl_release(pm), fr_cl_release(gm), fr_cl_release(sm), fr_cl_release(scm);
            free(p), free(g), free(st), free(dp), free(dst);
        }
    /* refused without its scratch */
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    cl_mem m = NULL;
    fr_cl_alloc(ctx, cl, 4096, &m);
    fr_tensor tp = {FR_F32, fr_shape2(8, 8), NULL, m, 0},
              ts[2] = {{FR_F32, fr_shape1(16), NULL, m, 0}, {FR_F32, fr_shape1(1), NULL, NULL, 0}};
    CHECK(fr_cl_optim_update(ctx, cl, &o, 1, &tp, &tp, ts, FR_STATE_F32) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "scratch"),
          "adafactor without scratch: %s", fr_last_error(ctx));
    fr_cl_release(m);
}

/* An unknown state kind and missing buffers are refused by name; the CPU's own
 * refusals are kept. */
static void test_errors(fr_ctx *ctx) {
    enum { N = 4096 };
    cl_mem pm = NULL, gm = NULL, sm = NULL;
    fr_cl_alloc(ctx, fr_cl_of(ctx), N * 4, &pm);
    fr_cl_alloc(ctx, fr_cl_of(ctx), N * 4, &gm);
    fr_cl_alloc(ctx, fr_cl_of(ctx), fr_state_bytes(FR_STATE_INT8, N), &sm);
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_ADAM);
    fr_tensor state[2] = {{FR_F32, fr_shape1(N), NULL, sm, 0}, {FR_F32, fr_shape1(N), NULL, sm, 0}};
    fr_tensor g = {FR_F32, fr_shape1(N), NULL, gm, 0}, p = {FR_F32, fr_shape1(N), NULL, pm, 0};
    const fr_backend *be = fr_backend_of(ctx);
    CHECK(be->optim_update(ctx, &o, 1, &p, &g, state, 7) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "kind 7"),
          "unknown kind: %s", fr_last_error(ctx));
    state[1].buf = NULL;
    CHECK(be->optim_update(ctx, &o, 1, &p, &g, state, FR_STATE_F32) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "moments"),
          "missing v: %s", fr_last_error(ctx));
    p.shape = fr_shape1(N - 1);
    CHECK(be->optim_update(ctx, &o, 1, &p, &g, state, FR_STATE_F32) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx), "4096"),
          "numel mismatch: %s", fr_last_error(ctx));
    p.shape = fr_shape1(N);
    o = fr_optim_defaults(FR_OPTIM_SGD);
    o.momentum = 0.9;
    state[0].buf = NULL;
    CHECK(be->optim_update(ctx, &o, 1, &p, &g, state, FR_STATE_F32) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "momentum"),
          "sgd without its buffer: %s", fr_last_error(ctx));
    fr_cl_release(pm), fr_cl_release(gm), fr_cl_release(sm);
}

static void test_map(void) {
    char *t = map_text();
    const char *src = NULL;
    for (int i = 0; i < fr_cl_n_sources; i++)
        if (!strcmp(fr_cl_sources[i].file, "optim")) src = fr_cl_sources[i].text;
    CHECK(
        src && strstr(src, t),
        "kernels/optim.cl's maps are not the CPU's: regenerate with test_opencl_optim --print-map");
    free(t);
}

int main(int argc, char **argv) {
    if (print_map(argc, argv)) return 0;
    test_map();
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_ctx *cpu = fr_ctx_new();
    exact = fr_cl_info_of(fr_cl_of(ctx))->fp64;
    printf("device %s, fp64 %d: %s\n", fr_cl_info_of(fr_cl_of(ctx))->name, exact,
           exact ? "bit-identical expected" : "within 1e-5 relative");
    test_cases(cpu, ctx);
    test_half(ctx);
    test_adafactor(ctx);
    test_errors(ctx);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx), fr_ctx_free(cpu);
    return check_done();
}
#endif
