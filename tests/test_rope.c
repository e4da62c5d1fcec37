/* test_rope.c — ROPE_QKV and ROPE_QKV_BWD (src/backend/cpu/rope.c) against a
 * float64 reference written here from Hugging Face's definitions
 * (modeling_rope_utils.py's default, linear and llama3 inverse frequencies,
 * modeling_llama.py's apply_rotary_pos_emb with rotate_half):
 *   inv_freq[i] = theta^(-2i/HS); linear: / factor; llama3 (factor 8,
 *   low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings
 *   8192, Llama 3.1's published rope_scaling): wavelengths above 8192 / 1
 *   divided by 8, below 8192 / 4 kept, between them smoothed;
 *   out[i] = x[i] cos a - x[i+HS/2] sin a, out[i+HS/2] = x[i+HS/2] cos a + x[i] sin a,
 *   a = pos inv_freq[i], everything in double.
 * Checks: inv_freq at hand-known values (theta 10000, HS 8: 1, 0.1, 0.01,
 * 0.001) and against the reference in all three bands of llama3; the
 * forward (q, k rotated, v copied into the packed qkv) and the backward (the
 * transposed rotation, dv a copy) against the reference, the reference's
 * backward against its own central finite differences; pos_from_step (a
 * chunk from step s gives the bits of rows s.. of the whole sequence); theta
 * 0 a copy; 1 and 3 threads the same bits; the shape rule's refusals. And
 * against PyTorch (tests/llama_attn_ref.h, made by tests/ref/llama_attn_ref.py
 * from Hugging Face's Llama attention: its rotary embedding in float32,
 * repeat_kv, the causal softmax): ROPE_QKV then grouped-query ATTENTION, and
 * back through ATTENTION_BWD and ROPE_QKV_BWD, default rope at positions 0..
 * and llama3 at 1000.., within 1e-5 (|want| + max|want|) as test_gpt_ops.c's
 * PyTorch comparisons (float32 sums in another order).
 *
 * Tolerance: the kernel forms the angle as Hugging Face does, the float
 * product of a float inv_freq and a float position: each rounding is
 * relative u = 2^-24, so the angle is off by at most about 2 u a, a <= P
 * (the largest position, inv_freq <= 1), and cos, sin and the two products
 * and the sum add a few u more. With |x| <= 1 an output is within
 * 2 (2 u P + 2 u) + 3 u of the reference: TOL(P) = (4 P + 8) u. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/rope.h"
#include "check.h"
#include "frugal.h"
#include "graph/graph.h"
#include "llama_attn_ref.h"

#define U 5.9604644775390625e-08 /* 2^-24 */
#define FD_H 1e-5
#define FD_TOL 1e-8

static unsigned long long g_rng = 0x2545f4914f6cdd1dull;
static double urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static fr_ctx *g_ctx;

/* ---- the float64 reference ---- */

static double ref_inv_freq(const fr_rope *r, int i, int HS) {
    const double pi = 3.14159265358979323846;
    double f = 1.0 / pow((double)r->theta, 2.0 * i / HS);
    if (r->type == FR_ROPE_LINEAR) return f / r->factor;
    if (r->type != FR_ROPE_LLAMA3) return f;
    const double wavelen = 2 * pi / f, old = r->orig_context;
    const double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
    if (wavelen < high_wl) return f;            /* high frequency: kept */
    if (wavelen > low_wl) return f / r->factor; /* low frequency: scaled */
    const double smooth =
        (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - smooth) * f / r->factor + smooth * f;
}

/* one head x (HS) at position pos into y; dir -1: the transposed rotation */
static void ref_rot(const double *x, double *y, int HS, double pos, const fr_rope *r, int dir) {
    const int h2 = HS / 2;
    for (int i = 0; i < h2; i++) {
        const double a = r->theta == 0.0f ? 0.0 : pos * ref_inv_freq(r, i, HS);
        const double c = cos(a), s = dir * sin(a);
        y[i] = x[i] * c - x[i + h2] * s;
        y[i + h2] = x[i + h2] * c + x[i] * s;
    }
}

/* qkv (rows, W) from q, k, v (dir 1), or dq, dk, dv from qkv (dir -1); row
 * r at position p0 + r % T */
static void ref_rope(double *q, double *k, double *v, double *qkv, int rows, int T, int NH, int NKV,
                     int HS, double p0, const fr_rope *r, int dir) {
    const int C = NH * HS, CK = NKV * HS, W = C + 2 * CK;
    for (int row = 0; row < rows; row++) {
        const double pos = p0 + row % T;
        double *o = qkv + (size_t)row * W;
        for (int h = 0; h < NH + NKV; h++) {
            double *x =
                h < NH ? q + (size_t)row * C + h * HS : k + (size_t)row * CK + (h - NH) * HS;
            if (dir > 0) ref_rot(x, o + h * HS, HS, pos, r, 1);
            else ref_rot(o + h * HS, x, HS, pos, r, -1);
        }
        for (int j = 0; j < CK; j++) {
            if (dir > 0) o[C + CK + j] = v[(size_t)row * CK + j];
            else v[(size_t)row * CK + j] = o[C + CK + j];
        }
    }
}

/* ---- the kernels ---- */

typedef struct rcase {
    int B, T, NH, NKV, HS;
    fr_rope rope;
    uint64_t step;
} rcase;

static fr_node node_of(const rcase *c, fr_op op) {
    fr_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.attr.heads = c->NH, n.attr.kv_heads = c->NKV, n.attr.rope = c->rope;
    return n;
}

/* qkv = ROPE_QKV(q, k, v) */
static int run_fwd(const rcase *c, const float *q, const float *k, const float *v, float *qkv) {
    fr_node n = node_of(c, FR_OP_ROPE_QKV);
    const int64_t C = (int64_t)c->NH * c->HS, CK = (int64_t)c->NKV * c->HS;
    fr_kernel_call k_ = {.ctx = g_ctx, .node = &n, .step = c->step};
    k_.in[0] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, C), (void *)q, NULL, 0};
    k_.in[1] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, CK), (void *)k, NULL, 0};
    k_.in[2] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, CK), (void *)v, NULL, 0};
    k_.out[0] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, C + 2 * CK), qkv, NULL, 0};
    return fr_k_rope_qkv(&k_);
}

/* dq, dk, dv = ROPE_QKV_BWD(dqkv); any of them NULL: not wanted */
static int run_bwd(const rcase *c, const float *dqkv, float *dq, float *dk, float *dv,
                   uint32_t acc) {
    fr_node n = node_of(c, FR_OP_ROPE_QKV_BWD);
    const int64_t C = (int64_t)c->NH * c->HS, CK = (int64_t)c->NKV * c->HS;
    fr_kernel_call k_ = {.ctx = g_ctx, .node = &n, .step = c->step, .accumulate = acc};
    k_.in[0] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, C + 2 * CK), (void *)dqkv, NULL, 0};
    k_.out[0] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, C), dq, NULL, 0};
    k_.out[1] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, CK), dk, NULL, 0};
    k_.out[2] = (fr_tensor){FR_F32, fr_shape3(c->B, c->T, CK), dv, NULL, 0};
    return fr_k_rope_qkv_bwd(&k_);
}

static double max_err(const float *got, const double *ref, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d; /* a NaN wins */
    }
    return e;
}

/* forward and backward of one case against the reference */
static void check_case(const char *what, const rcase *c) {
    const int rows = c->B * c->T, C = c->NH * c->HS, CK = c->NKV * c->HS, W = C + 2 * CK;
    const size_t nq = (size_t)rows * C, nk = (size_t)rows * CK, nw = (size_t)rows * W;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *y = malloc(nw * 4);
    float *g = malloc(nw * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    double *qd = malloc(nq * 8), *kd = malloc(nk * 8), *vd = malloc(nk * 8), *yd = malloc(nw * 8);
    double *gd = malloc(nw * 8);
    for (size_t i = 0; i < nq; i++) qd[i] = q[i] = (float)urand();
    for (size_t i = 0; i < nk; i++) kd[i] = k[i] = (float)urand(), vd[i] = v[i] = (float)urand();
    for (size_t i = 0; i < nw; i++) gd[i] = g[i] = (float)urand(), y[i] = NAN;
    for (size_t i = 0; i < nq; i++) dq[i] = NAN;
    for (size_t i = 0; i < nk; i++) dk[i] = dv[i] = NAN;
    const double p0 = c->rope.pos_from_step ? (double)c->step : 0.0;
    const double tol = (4.0 * (p0 + c->T) + 8.0) * U;

    CHECK(run_fwd(c, q, k, v, y) == FR_OK, "%s: forward: %s", what, fr_last_error(g_ctx));
    ref_rope(qd, kd, vd, yd, rows, c->T, c->NH, c->NKV, c->HS, p0, &c->rope, 1);
    double e = max_err(y, yd, nw);
    CHECK(e <= tol, "%s: forward off by %.3g (tol %.3g)", what, e, tol);
    int vsame = 1;
    for (int r = 0; r < rows; r++)
        vsame &= !memcmp(y + (size_t)r * W + C + CK, v + (size_t)r * CK, (size_t)CK * 4);
    CHECK(vsame, "%s: v is not copied exactly", what);

    CHECK(run_bwd(c, g, dq, dk, dv, 0) == FR_OK, "%s: backward: %s", what, fr_last_error(g_ctx));
    ref_rope(qd, kd, vd, gd, rows, c->T, c->NH, c->NKV, c->HS, p0, &c->rope, -1);
    const double eq = max_err(dq, qd, nq), ek = max_err(dk, kd, nk);
    CHECK(eq <= tol && ek <= tol, "%s: backward dq off by %.3g, dk by %.3g (tol %.3g)", what, eq,
          ek, tol);
    int dsame = 1;
    for (int r = 0; r < rows; r++)
        dsame &= !memcmp(dv + (size_t)r * CK, g + (size_t)r * W + C + CK, (size_t)CK * 4);
    CHECK(dsame, "%s: dv is not dqkv's v block exactly", what);
    printf("%-28s forward %.2e backward %.2e (tol %.2e)\n", what, e, eq > ek ? eq : ek, tol);

    /* only dk wanted: dq and dv untouched */
    for (size_t i = 0; i < nq; i++) dq[i] = 7.0f;
    float *dk2 = malloc(nk * 4);
    CHECK(run_bwd(c, g, NULL, dk2, NULL, 0) == FR_OK, "%s: backward dk alone: %s", what,
          fr_last_error(g_ctx));
    CHECK(!memcmp(dk2, dk, nk * 4), "%s: dk alone differs from dk with dq and dv", what);
    free(dk2);
    free(q), free(k), free(v), free(y), free(g), free(dq), free(dk), free(dv);
    free(qd), free(kd), free(vd), free(yd), free(gd);
}

/* The reference's backward against central differences of
 * L = sum(W o ref_fwd(q, k, v)) for every element of q, k and v. */
static void check_reference_fd(const fr_rope *r) {
    const int T = 5, NH = 2, NKV = 1, HS = 6, C = NH * HS, CK = NKV * HS, W = C + 2 * CK;
    const size_t n[3] = {(size_t)T * C, (size_t)T * CK, (size_t)T * CK};
    double *x[3], *gr[3], *Wt = malloc((size_t)T * W * 8), *y = malloc((size_t)T * W * 8);
    for (int i = 0; i < 3; i++) {
        x[i] = malloc(n[i] * 8), gr[i] = malloc(n[i] * 8);
        for (size_t j = 0; j < n[i]; j++) x[i][j] = urand();
    }
    for (int j = 0; j < T * W; j++) Wt[j] = urand();
    ref_rope(gr[0], gr[1], gr[2], Wt, T, T, NH, NKV, HS, 3.0, r, -1);
    double worst = 0;
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < n[i]; j++) {
            double L[2], keep = x[i][j];
            for (int sg = 0; sg < 2; sg++) {
                x[i][j] = keep + (sg ? -FD_H : FD_H);
                ref_rope(x[0], x[1], x[2], y, T, T, NH, NKV, HS, 3.0, r, 1);
                L[sg] = 0;
                for (int a = 0; a < T * W; a++) L[sg] += y[a] * Wt[a];
            }
            x[i][j] = keep;
            const double fd = (L[0] - L[1]) / (2 * FD_H);
            if (fabs(fd - gr[i][j]) > worst) worst = fabs(fd - gr[i][j]);
        }
    CHECK(worst <= FD_TOL, "reference backward vs finite differences (type %d): %.3g", r->type,
          worst);
    for (int i = 0; i < 3; i++) free(x[i]), free(gr[i]);
    free(Wt), free(y);
}

/* inv_freq: hand-known values, and the three llama3 bands against the reference */
static void check_inv_freq(void) {
    fr_rope d = {10000.0f, FR_ROPE_DEFAULT, 0, 0, 0, 0, 0};
    const double want[4] = {1.0, 0.1, 0.01, 0.001}; /* 10000^(-2i/8) = 10^-i */
    for (int i = 0; i < 4; i++) {
        const double got = fr_rope_inv_freq(&d, i, 8);
        CHECK(fabs(got - want[i]) <= 2 * U * want[i], "default inv_freq[%d] = %.9g, want %g", i,
              got, want[i]);
    }
    fr_rope lin = {10000.0f, FR_ROPE_LINEAR, 4.0f, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        const double got = fr_rope_inv_freq(&lin, i, 8);
        CHECK(fabs(got - want[i] / 4) <= 2 * U * want[i] / 4, "linear inv_freq[%d] = %.9g, want %g",
              i, got, want[i] / 4);
    }
    /* Llama 3.1: theta 500000, HS 128 */
    fr_rope l3 = {500000.0f, FR_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 0};
    int bands[3] = {0, 0, 0};
    double worst = 0;
    for (int i = 0; i < 64; i++) {
        const double f = 1.0 / pow(500000.0, i / 64.0), wl = 2 * 3.14159265358979323846 / f;
        bands[wl < 2048 ? 0 : wl > 8192 ? 2 : 1]++;
        const double ref = ref_inv_freq(&l3, i, 128), got = fr_rope_inv_freq(&l3, i, 128);
        const double e = fabs(got - ref) / ref;
        if (e > worst) worst = e;
    }
    CHECK(bands[0] && bands[1] && bands[2], "llama3 bands not all covered: %d %d %d", bands[0],
          bands[1], bands[2]);
    CHECK(worst <= 4 * U, "llama3 inv_freq off the reference by %.3g relative", worst);
    /* the first and last: kept (wavelength 2 pi) and scaled by 1/8 */
    CHECK(fr_rope_inv_freq(&l3, 0, 128) == 1.0f, "llama3 inv_freq[0] = %.9g",
          fr_rope_inv_freq(&l3, 0, 128));
    const double last = 1.0 / pow(500000.0, 63 / 64.0) / 8;
    CHECK(fabs(fr_rope_inv_freq(&l3, 63, 128) - last) <= 4 * U * last,
          "llama3 inv_freq[63] = %.9g, want %.9g", fr_rope_inv_freq(&l3, 63, 128), last);
}

/* pos_from_step: rows s.. of a whole sequence, bit for bit; theta 0: a copy */
static void check_positions(void) {
    rcase whole = {1, 20, 4, 2, 8, {10000.0f, FR_ROPE_DEFAULT, 0, 0, 0, 0, 0}, 0};
    const int C = 32, CK = 16, W = 64, s = 12;
    float q[20 * 32], k[20 * 16], v[20 * 16], y[20 * 64], yc[8 * 64];
    for (int i = 0; i < 20 * 32; i++) q[i] = (float)urand();
    for (int i = 0; i < 20 * 16; i++) k[i] = (float)urand(), v[i] = (float)urand();
    CHECK(run_fwd(&whole, q, k, v, y) == FR_OK, "whole: %s", fr_last_error(g_ctx));
    rcase chunk = whole;
    chunk.T = 20 - s, chunk.step = (uint64_t)s, chunk.rope.pos_from_step = 1;
    CHECK(run_fwd(&chunk, q + s * C, k + s * CK, v + s * CK, yc) == FR_OK, "chunk: %s",
          fr_last_error(g_ctx));
    CHECK(!memcmp(yc, y + s * W, sizeof yc),
          "a chunk from step %d differs from rows %d.. of the "
          "whole sequence",
          s, s);
    chunk.rope.pos_from_step = 0; /* positions 0..: rows 0.. of the whole */
    CHECK(run_fwd(&chunk, q, k, v, yc) == FR_OK && !memcmp(yc, y, sizeof yc),
          "without pos_from_step the step moved the positions");
    rcase none = whole;
    none.rope.theta = 0.0f;
    CHECK(run_fwd(&none, q, k, v, y) == FR_OK, "theta 0: %s", fr_last_error(g_ctx));
    int copy = 1;
    for (int r = 0; r < 20; r++)
        copy &= !memcmp(y + r * W, q + r * C, (size_t)C * 4) &&
                !memcmp(y + r * W + C, k + r * CK, (size_t)CK * 4);
    CHECK(copy, "theta 0 did not copy q and k");
}

/* 1 and 3 threads: the same bits (rows * W past the kernels' threshold) */
static void check_threads(void) {
    rcase c = {2, 64, 4, 2, 32, {500000.0f, FR_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 1}, 100};
    const size_t nq = 2 * 64 * 128, nk = 2 * 64 * 64, nw = 2 * 64 * 256;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    float *y[2] = {malloc(nw * 4), malloc(nw * 4)}, *d[2] = {malloc(nq * 4), malloc(nq * 4)};
    for (size_t i = 0; i < nq; i++) q[i] = (float)urand();
    for (size_t i = 0; i < nk; i++) k[i] = (float)urand(), v[i] = (float)urand();
    const int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r ? 3 : 1);
        CHECK(run_fwd(&c, q, k, v, y[r]) == FR_OK, "threads: %s", fr_last_error(g_ctx));
        CHECK(run_bwd(&c, y[0], d[r], NULL, NULL, 0) == FR_OK, "threads: %s", fr_last_error(g_ctx));
    }
    omp_set_num_threads(saved);
    CHECK(!memcmp(y[0], y[1], nw * 4), "rope_qkv differs between 1 and 3 threads");
    CHECK(!memcmp(d[0], d[1], nq * 4), "rope_qkv_bwd differs between 1 and 3 threads");
    free(q), free(k), free(v), free(y[0]), free(y[1]), free(d[0]), free(d[1]);
}

/* The shape rule refuses with the fault named; the backward refuses accumulating. */
static void check_refusals(void) {
    static const struct {
        int64_t q, k, v;
        int nh, nkv, hs_odd;
        fr_rope rope;
        const char *msg;
    } bad[] = {
        {12, 6, 6, 4, 2, 0, {10000.0f, 0, 0, 0, 0, 0, 0}, "even head size"},
        {16, 4, 4, 4, 2, 0, {10000.0f, 0, 0, 0, 0, 0, 0}, "kv heads x head size"},
        {16, 8, 4, 4, 2, 0, {10000.0f, 0, 0, 0, 0, 0, 0}, "kv heads x head size"},
        {16, 8, 8, 4, 3, 0, {10000.0f, 0, 0, 0, 0, 0, 0}, "must divide"},
        {16, 8, 8, 4, 2, 0, {10000.0f, 7, 0, 0, 0, 0, 0}, "unknown rope type"},
        {16, 8, 8, 4, 2, 0, {10000.0f, FR_ROPE_LINEAR, 0, 0, 0, 0, 0}, "factor must be > 0"},
        {16, 8, 8, 4, 2, 0, {10000.0f, FR_ROPE_LLAMA3, 8, 4, 1, 8192, 0}, "low_freq_factor"},
        {16, 8, 8, 4, 2, 0, {-1.0f, 0, 0, 0, 0, 0, 0}, "theta"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fr_graph g;
        fr_graph_init(&g, g_ctx);
        int in[3] = {fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, bad[i].q)),
                     fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, bad[i].k)),
                     fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, bad[i].v))};
        fr_attr a;
        memset(&a, 0, sizeof a);
        a.heads = bad[i].nh, a.kv_heads = bad[i].nkv, a.rope = bad[i].rope;
        const int node = fr_graph_node(&g, FR_OP_ROPE_QKV, in, 3, &a, -1, 0, NULL);
        CHECK(node < 0 && strstr(fr_last_error(g_ctx), bad[i].msg) &&
                  strstr(fr_last_error(g_ctx), "rope_qkv"),
              "case %zu: got node %d, error '%s', want '%s'", i, node, fr_last_error(g_ctx),
              bad[i].msg);
        fr_graph_release(&g);
    }
    /* a good one: (2, 3, (4 + 2 2) 4) */
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    int in[3] = {fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, 16)),
                 fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, 8)),
                 fr_graph_value(&g, FR_VAL_INPUT, FR_F32, fr_shape3(2, 3, 8))};
    fr_attr a;
    memset(&a, 0, sizeof a);
    a.heads = 4, a.kv_heads = 2, a.rope.theta = 10000.0f;
    int out = -1;
    const fr_shape want = fr_shape3(2, 3, 32);
    CHECK(fr_graph_node(&g, FR_OP_ROPE_QKV, in, 3, &a, -1, 0, &out) >= 0 && out >= 0 &&
              fr_shape_eq(&g.vals[out].shape, &want),
          "a good rope_qkv node: %s", fr_last_error(g_ctx));
    fr_graph_release(&g);
    rcase c = {1, 2, 2, 1, 4, {10000.0f, 0, 0, 0, 0, 0, 0}, 0};
    float gq[2 * 16] = {0}, dq[2 * 8], dk[2 * 4], dv[2 * 4];
    CHECK(run_bwd(&c, gq, dq, dk, dv, 2u) == FR_ERR_ARG &&
              strstr(fr_last_error(g_ctx), "cannot be added into"),
          "an accumulating rope_qkv_bwd was taken: %s", fr_last_error(g_ctx));
}

/* ---- against PyTorch (tests/llama_attn_ref.h) ---- */

static void expect_ref(const char *what, const float *got, const float *want, size_t n) {
    double m = 0, worst = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(want[i]));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= 1e-5 * (fabs(want[i]) + m))) bad++;
        if (!(d <= worst)) worst = d;
    }
    CHECK(bad == 0, "%s: %d of %zu values off PyTorch's (worst %.3g of max %.3g)", what, bad, n,
          worst, m);
    printf("torch %-22s worst %.2e of %.2e\n", what, worst, m);
}

typedef struct torch_case {
    const char *name;
    fr_rope rope;
    uint64_t step;
    const float *q, *k, *v, *qkv, *y, *dy, *dq, *dk, *dv;
} torch_case;

static void check_torch(const torch_case *tc) {
    enum { B = REF_B, T = REF_T, NH = REF_NH, NKV = REF_NKV, HS = REF_HS };
    enum { C = NH * HS, CK = NKV * HS, W = C + 2 * CK };
    rcase c = {B, T, NH, NKV, HS, tc->rope, tc->step};
    static float qkv[B * T * W], y[B * T * C], lse[B * NH * T], dqkv[B * T * W], D[B * NH * T];
    static float dq[B * T * C], dk[B * T * CK], dv[B * T * CK];
    char what[64];
    CHECK(run_fwd(&c, tc->q, tc->k, tc->v, qkv) == FR_OK, "%s: %s", tc->name, fr_last_error(g_ctx));
    snprintf(what, sizeof what, "%s qkv", tc->name);
    expect_ref(what, qkv, tc->qkv, (size_t)B * T * W);
    const size_t wsn = fr_attention_ws_floats(T, HS, omp_get_max_threads());
    float *ws = malloc(wsn * sizeof(float));
    fr_node n;
    memset(&n, 0, sizeof n);
    n.op = FR_OP_ATTENTION, n.attr.heads = NH, n.attr.kv_heads = NKV, n.attr.causal = 1;
    fr_kernel_call a = {.ctx = g_ctx, .node = &n};
    a.in[0] = (fr_tensor){FR_F32, fr_shape3(B, T, W), qkv, NULL, 0};
    a.out[0] = (fr_tensor){FR_F32, fr_shape3(B, T, C), y, NULL, 0};
    a.out[1] = (fr_tensor){FR_F32, fr_shape3(B, NH, T), lse, NULL, 0};
    a.out[2] = (fr_tensor){FR_F32, fr_shape1((int64_t)wsn), ws, NULL, 0};
    CHECK(fr_k_attention(&a) == FR_OK, "%s attention: %s", tc->name, fr_last_error(g_ctx));
    snprintf(what, sizeof what, "%s y", tc->name);
    expect_ref(what, y, tc->y, (size_t)B * T * C);
    fr_node nb = n;
    nb.op = FR_OP_ATTENTION_BWD;
    fr_kernel_call ab = {.ctx = g_ctx, .node = &nb};
    ab.in[0] = (fr_tensor){FR_F32, fr_shape3(B, T, C), (void *)tc->dy, NULL, 0};
    ab.in[1] = a.in[0], ab.in[2] = a.out[0], ab.in[3] = a.out[1];
    ab.out[0] = (fr_tensor){FR_F32, fr_shape3(B, T, W), dqkv, NULL, 0};
    ab.out[1] = (fr_tensor){FR_F32, fr_shape3(B, NH, T), D, NULL, 0};
    ab.out[2] = a.out[2];
    CHECK(fr_k_attention_bwd(&ab) == FR_OK, "%s attention_bwd: %s", tc->name, fr_last_error(g_ctx));
    CHECK(run_bwd(&c, dqkv, dq, dk, dv, 0) == FR_OK, "%s rope_qkv_bwd: %s", tc->name,
          fr_last_error(g_ctx));
    snprintf(what, sizeof what, "%s dq", tc->name);
    expect_ref(what, dq, tc->dq, (size_t)B * T * C);
    snprintf(what, sizeof what, "%s dk", tc->name);
    expect_ref(what, dk, tc->dk, (size_t)B * T * CK);
    snprintf(what, sizeof what, "%s dv", tc->name);
    expect_ref(what, dv, tc->dv, (size_t)B * T * CK);
    free(ws);
}

int main(void) {
    g_ctx = fr_ctx_new();
    if (!g_ctx) return 2;
    check_inv_freq();
    fr_rope def = {10000.0f, FR_ROPE_DEFAULT, 0, 0, 0, 0, 0};
    fr_rope lin = {10000.0f, FR_ROPE_LINEAR, 4.0f, 0, 0, 0, 0};
    fr_rope l3 = {500000.0f, FR_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 0};
    check_reference_fd(&def);
    check_reference_fd(&lin);
    check_reference_fd(&l3);
    rcase cs[] = {
        {2, 37, 4, 2, 16, def, 0},
        {1, 9, 4, 1, 130, def, 0}, /* 65 frequencies: past a block of 64 */
        {2, 11, 4, 4, 8, lin, 0},  /* kv_heads = heads */
        {1, 33, 2, 1, 128, l3, 0}, /* Llama 3.1's head size and scaling */
        {2, 7, 4, 2, 16, l3, 1000},
    };
    cs[4].rope.pos_from_step = 1; /* positions 1000 .. 1006 */
    static const char *names[] = {"default 4/2 HS 16", "default 4/1 HS 130", "linear 4/4 HS 8",
                                  "llama3 2/1 HS 128", "llama3 from step 1000"};
    for (int i = 0; i < 5; i++) check_case(names[i], &cs[i]);
    check_positions();
    check_threads();
    check_refusals();
    const torch_case tdef = {"default",  def,        0,           ref_def_q,
                             ref_def_k,  ref_def_v,  ref_def_qkv, ref_def_y,
                             ref_def_dy, ref_def_dq, ref_def_dk,  ref_def_dv};
    fr_rope l3_step = l3;
    l3_step.pos_from_step = 1;
    const torch_case tl3 = {"llama3 from 1000", l3_step,   1000,       ref_l3_q,
                            ref_l3_k,           ref_l3_v,  ref_l3_qkv, ref_l3_y,
                            ref_l3_dy,          ref_l3_dq, ref_l3_dk,  ref_l3_dv};
    check_torch(&tdef);
    check_torch(&tl3);
    fr_ctx_free(g_ctx);
    return check_done();
}
