/* test_linear_ce.c — the head fused with its cross-entropy (LINEAR_CE and
 * LINEAR_CE_BWD, backend/cpu/linear_ce.c) against a float64 reference
 * computed here (logits, logsumexp, loss, dz, dx = dz W, dW = dz^T x,
 * db = sum dz) and against the unfused CPU path (LINEAR, CROSS_ENTROPY,
 * their backwards) within 1e-6 of each tensor's largest value, for
 * vocabularies 256 to 50257, chunks of rows that do not divide N, with and
 * without a bias; the hits against fr_k_argmax_hits on the stored logits
 * (ties, a NaN row), the accumulate bits, the loss scale, bad labels, a
 * workspace too small, and the same bits on a second run.
 *
 * With x in bf16 (what the mixed-precision pass gives where the CPU has a
 * native bf16 GEMM; linear_ce.c then rounds W and dz to bf16 a panel at a
 * time for oneDNN's bf16 matmul): against a float64 reference of the same
 * rounded operands, written here (x and W rounded to nearest even by hand,
 * not by the code under test): the loss within 1e-5, and each element of
 * dx, dW within 2^-8 of the sum of its terms' magnitudes (the bf16 rounding
 * of dz, 2^-9 of each term, with room for the f32 sums) plus 1e-6 of the
 * tensor's largest value; the same bits twice; a GEMM scratch one byte short
 * refused. Vocabularies that cross several panels of W. Skipped with a line
 * where the CPU has no native bf16 GEMM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "bf16_ref.h"
#include "check.h"
#include "core/rng.h"
#include "ops/ops.h"

static fr_ctx *g_ctx;

typedef struct call {
    fr_node node;
    fr_kernel_call c;
} call;

static void call_init(call *k, fr_op op, int rows, float scale) {
    memset(k, 0, sizeof *k);
    k->node.op = op;
    k->node.fwd = -1;
    k->node.attr.rows = rows;
    k->node.attr.scale = scale;
    k->c.ctx = g_ctx;
    k->c.node = &k->node;
}

static fr_tensor tf(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_F32, .shape = s, .data = data};
}
static fr_tensor ti(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_I32, .shape = s, .data = data};
}

static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) exit(2);
    return p;
}

/* the largest |a - b| over n values, relative to the largest |b| */
static double rel_err(const float *a, const double *b, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0 ? e / m : e;
}
/* ||a - b|| / ||b|| (2-norms, in double) */
static double norm_err(const float *a, const float *b, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        e += d * d;
        m += (double)b[i] * b[i];
    }
    return m > 0 ? sqrt(e / m) : sqrt(e);
}

typedef struct problem {
    int64_t N, C, V, R;
    int bias;
    float scale;
    float *x, *w, *b;
    int32_t *y;
} problem;

/* float64: loss, dx, dW, db of mean cross-entropy over z = x W^T + b, times scale */
static void reference(const problem *p, double *loss, double *dx, double *dw, double *db) {
    const int64_t N = p->N, C = p->C, V = p->V;
    double *z = malloc((size_t)V * sizeof *z), s = 0;
    memset(dx, 0, (size_t)(N * C) * sizeof *dx);
    memset(dw, 0, (size_t)(V * C) * sizeof *dw);
    memset(db, 0, (size_t)V * sizeof *db);
    for (int64_t n = 0; n < N; n++) {
        double mx = -INFINITY, e = 0;
        for (int64_t v = 0; v < V; v++) {
            double a = p->bias ? p->b[v] : 0;
            for (int64_t c = 0; c < C; c++) a += (double)p->x[n * C + c] * p->w[v * C + c];
            z[v] = a;
            mx = fmax(mx, a);
        }
        for (int64_t v = 0; v < V; v++) e += exp(z[v] - mx);
        const double lse = mx + log(e);
        s += lse - z[p->y[n]];
        for (int64_t v = 0; v < V; v++) {
            const double g = (double)p->scale * (exp(z[v] - lse) - (v == p->y[n])) / (double)N;
            db[v] += g;
            for (int64_t c = 0; c < C; c++) {
                dx[n * C + c] += g * p->w[v * C + c];
                dw[v * C + c] += g * p->x[n * C + c];
            }
        }
    }
    *loss = s / (double)N;
    free(z);
}

typedef struct result {
    float loss;
    int32_t hits;
    float *dx, *dw, *db;
} result;

static int fused(const problem *p, result *r, uint32_t accumulate) {
    const int64_t N = p->N, C = p->C, V = p->V;
    fr_shape xs = fr_shape2(N, C), ws = fr_shape2(V, C);
    int64_t R = p->R < 1 || p->R > N ? N : p->R;
    call k;
    call_init(&k, FR_OP_LINEAR_CE, (int)p->R, p->scale);
    float *wsp = falloc((size_t)FR_K_LINEAR_CE_WS(R, N, V, 0));
    k.c.in[0] = tf(p->x, xs), k.c.in[1] = tf(p->w, ws);
    k.c.in[2] = tf(p->bias ? p->b : NULL, fr_shape1(V));
    k.c.in[3] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(&r->loss, fr_shape1(1)), k.c.out[1] = ti(&r->hits, fr_shape1(1));
    k.c.out[2] = tf(wsp, fr_shape1(FR_K_LINEAR_CE_WS(R, N, V, 0)));
    int st = fr_k_linear_ce(&k.c);
    free(wsp);
    if (st) return st;
    call_init(&k, FR_OP_LINEAR_CE_BWD, (int)p->R, p->scale);
    wsp = falloc((size_t)FR_K_LINEAR_CE_WS(R, N, V, 1));
    k.c.in[0] = tf(p->x, xs), k.c.in[1] = tf(p->w, ws);
    k.c.in[2] = tf(p->bias ? p->b : NULL, fr_shape1(V));
    k.c.in[3] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(r->dx, xs), k.c.out[1] = tf(r->dw, ws);
    k.c.out[2] = tf(p->bias ? r->db : NULL, fr_shape1(V));
    k.c.out[4] = tf(wsp, fr_shape1(FR_K_LINEAR_CE_WS(R, N, V, 1)));
    k.c.accumulate = accumulate;
    st = fr_k_linear_ce_bwd(&k.c);
    free(wsp);
    return st;
}

/* the unfused CPU path: z = LINEAR, CROSS_ENTROPY (and its backward), LINEAR_BWD */
static int unfused(const problem *p, result *r, float **logits) {
    const int64_t N = p->N, C = p->C, V = p->V;
    float *z = falloc((size_t)(N * V)), *dz = falloc((size_t)(N * V));
    call k;
    call_init(&k, FR_OP_LINEAR, 0, 1.0f);
    k.c.in[0] = tf(p->x, fr_shape2(N, C)), k.c.in[1] = tf(p->w, fr_shape2(V, C));
    k.c.in[2] = tf(p->bias ? p->b : NULL, fr_shape1(V));
    k.c.out[0] = tf(z, fr_shape2(N, V));
    int st = fr_k_linear(&k.c);
    call_init(&k, FR_OP_CROSS_ENTROPY, 0, 1.0f);
    k.c.in[0] = tf(z, fr_shape2(N, V)), k.c.in[1] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(&r->loss, fr_shape1(1));
    if (!st) st = fr_k_cross_entropy(&k.c);
    call_init(&k, FR_OP_CROSS_ENTROPY_BWD, 0, p->scale);
    k.c.in[0] = tf(z, fr_shape2(N, V)), k.c.in[1] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(dz, fr_shape2(N, V));
    if (!st) st = fr_k_cross_entropy_bwd(&k.c);
    call_init(&k, FR_OP_LINEAR_BWD, 0, 1.0f);
    k.c.in[0] = tf(dz, fr_shape2(N, V)), k.c.in[1] = tf(p->x, fr_shape2(N, C));
    k.c.in[2] = tf(p->w, fr_shape2(V, C));
    k.c.out[0] = tf(r->dx, fr_shape2(N, C)), k.c.out[1] = tf(r->dw, fr_shape2(V, C));
    k.c.out[2] = tf(p->bias ? r->db : NULL, fr_shape1(V));
    if (!st) st = fr_k_linear_bwd(&k.c);
    r->hits = (int32_t)fr_k_argmax_hits(z, p->y, N, V);
    free(dz);
    *logits = z;
    return st;
}

static void result_alloc(result *r, const problem *p) {
    r->dx = falloc((size_t)(p->N * p->C));
    r->dw = falloc((size_t)(p->V * p->C));
    r->db = falloc((size_t)p->V);
}
static void result_free(result *r) { free(r->dx), free(r->dw), free(r->db); }

static void problem_make(problem *p, int64_t N, int64_t C, int64_t V, int64_t R, int bias,
                         uint64_t seed) {
    fr_rng g = fr_rng_make(seed, (uint64_t)(N * 131 + V));
    p->N = N, p->C = C, p->V = V, p->R = R, p->bias = bias, p->scale = 0.75f;
    p->x = falloc((size_t)(N * C)), p->w = falloc((size_t)(V * C)), p->b = falloc((size_t)V);
    p->y = calloc((size_t)N, sizeof *p->y);
    for (int64_t i = 0; i < N * C; i++) p->x[i] = 2.0f * fr_rng_next_uniform(&g) - 1.0f;
    for (int64_t i = 0; i < V * C; i++) p->w[i] = 0.5f * (2.0f * fr_rng_next_uniform(&g) - 1.0f);
    for (int64_t i = 0; i < V; i++) p->b[i] = 0.3f * (2.0f * fr_rng_next_uniform(&g) - 1.0f);
    for (int64_t i = 0; i < N; i++) p->y[i] = (int32_t)fr_rng_below(&g, (uint64_t)V);
}
static void problem_free(problem *p) { free(p->x), free(p->w), free(p->b), free(p->y); }

/* Tolerances. Against float64: an f32 GEMM of K terms is off by about
 * sqrt(K) u of the sum of its terms' magnitudes; dx sums V terms (50257:
 * sqrt(V) u = 1.3e-5 of sum |dz W|, well under max |dx| times 1e-3), so 2e-4
 * of the tensor's largest value, and 1e-5 for the loss (a sum of N rows of
 * logsumexp made with one-ulp exponentials). Against the unfused path (the
 * same row arithmetic, the GEMMs over chunks of rows instead of all rows):
 * 1e-6 relative, the loss by value and the gradients by 2-norm,
 * ||fused - unfused|| / ||unfused||. Not element by element against the
 * largest: dx = dz W sums V terms that cancel (a row of dz sums to 0), and
 * either path's dx is itself 1e-6 to 2.3e-6 of max |dx| away from float64
 * (measured here over these cases, OpenBLAS on an AMD EPYC), so two f32
 * orders of the same sum can be 2e-6 apart in their largest value. */
#define TOL_REF 2e-4
#define TOL_UNFUSED 1e-6

static void check_problem(int64_t N, int64_t C, int64_t V, int64_t R, int bias) {
    problem p;
    problem_make(&p, N, C, V, R, bias, 7);
    char what[96];
    snprintf(what, sizeof what, "N %lld C %lld V %lld R %lld%s", (long long)N, (long long)C,
             (long long)V, (long long)R, bias ? " bias" : "");
    result f = {0}, u = {0};
    result_alloc(&f, &p), result_alloc(&u, &p);
    float *z = NULL;
    CHECK(fused(&p, &f, 0) == FR_OK, "%s: fused: %s", what, fr_last_error(g_ctx));
    CHECK(unfused(&p, &u, &z) == FR_OK, "%s: unfused: %s", what, fr_last_error(g_ctx));
    double loss, *dx = malloc((size_t)(N * C) * 8), *dw = malloc((size_t)(V * C) * 8),
                 *db = malloc((size_t)V * 8);
    reference(&p, &loss, dx, dw, db);
    CHECK(fabs(f.loss - loss) <= 1e-5 * fabs(loss), "%s: loss %.9g, float64 %.9g", what,
          (double)f.loss, loss);
    CHECK(rel_err(f.dx, dx, (size_t)(N * C)) <= TOL_REF, "%s: dx off the float64 one by %.3g", what,
          rel_err(f.dx, dx, (size_t)(N * C)));
    CHECK(rel_err(f.dw, dw, (size_t)(V * C)) <= TOL_REF, "%s: dW off the float64 one by %.3g", what,
          rel_err(f.dw, dw, (size_t)(V * C)));
    if (bias)
        CHECK(rel_err(f.db, db, (size_t)V) <= TOL_REF, "%s: db off the float64 one by %.3g", what,
              rel_err(f.db, db, (size_t)V));
    /* the unfused path */
    CHECK(fabs(f.loss - u.loss) <= TOL_UNFUSED * fabs(u.loss), "%s: loss %.9g, unfused %.9g", what,
          (double)f.loss, (double)u.loss);
    double ex = norm_err(f.dx, u.dx, (size_t)(N * C)), ew = norm_err(f.dw, u.dw, (size_t)(V * C)),
           eb = bias ? norm_err(f.db, u.db, (size_t)V) : 0;
    CHECK(ex <= TOL_UNFUSED && ew <= TOL_UNFUSED && eb <= TOL_UNFUSED,
          "%s: off the unfused path: dx %.3g, dW %.3g, db %.3g", what, ex, ew, eb);
    CHECK(f.hits == u.hits, "%s: %d hits, the stored logits' argmax %d", what, (int)f.hits,
          (int)u.hits);
    /* the same bits again */
    result f2 = {0};
    result_alloc(&f2, &p);
    CHECK(fused(&p, &f2, 0) == FR_OK, "%s: second run", what);
    CHECK(f2.loss == f.loss && f2.hits == f.hits && !memcmp(f2.dx, f.dx, (size_t)(N * C) * 4) &&
              !memcmp(f2.dw, f.dw, (size_t)(V * C) * 4) && !memcmp(f2.db, f.db, (size_t)V * 4),
          "%s: a second run differs", what);
    if (getenv("FR_TEST_VERBOSE"))
        printf("%-36s vs unfused: loss %.2e dx %.2e dW %.2e db %.2e\n", what,
               fabs(f.loss - u.loss) / fabs(u.loss), ex, ew, eb);
    result_free(&f2);
    free(dx), free(dw), free(db), free(z);
    result_free(&f), result_free(&u);
    problem_free(&p);
}

/* accumulate bits: each gradient added into what its output held */
static void check_accumulate(void) {
    problem p;
    problem_make(&p, 23, 8, 300, 5, 1, 11);
    result a = {0}, b = {0};
    result_alloc(&a, &p), result_alloc(&b, &p);
    CHECK(fused(&p, &a, 0) == FR_OK, "accumulate: plain");
    for (int64_t i = 0; i < p.N * p.C; i++) b.dx[i] = 0.25f * (float)(i % 7);
    for (int64_t i = 0; i < p.V * p.C; i++) b.dw[i] = -0.5f * (float)(i % 5);
    for (int64_t i = 0; i < p.V; i++) b.db[i] = 1.0f + (float)(i % 3);
    CHECK(fused(&p, &b, 7u) == FR_OK, "accumulate: into");
    int bad = 0;
    for (int64_t i = 0; i < p.N * p.C; i++)
        bad += fabsf(b.dx[i] - (0.25f * (float)(i % 7) + a.dx[i])) > 1e-6f;
    for (int64_t i = 0; i < p.V * p.C; i++)
        bad += fabsf(b.dw[i] - (-0.5f * (float)(i % 5) + a.dw[i])) > 1e-6f;
    for (int64_t i = 0; i < p.V; i++)
        bad += fabsf(b.db[i] - (1.0f + (float)(i % 3) + a.db[i])) > 1e-6f;
    CHECK(bad == 0, "accumulate bits: %d values are not the old value plus the gradient", bad);
    result_free(&a), result_free(&b);
    problem_free(&p);
}

/* hits: tied maxima (the first wins) and a NaN row (index 0, as the stored
 * logits' argmax), against fr_k_argmax_hits on the stored logits */
static void check_hits(void) {
    problem p;
    problem_make(&p, 9, 4, 40, 4, 0, 13);
    for (int64_t c = 0; c < p.C; c++) p.w[3 * p.C + c] = p.w[5 * p.C + c] = 5.0f;
    for (int64_t i = 0; i < p.N * p.C; i++) p.x[i] = fabsf(p.x[i]) + 0.1f; /* rows 3, 5 win */
    p.y[0] = 3, p.y[1] = 5, p.y[2] = 3, p.y[3] = 0;
    result f = {0}, u = {0};
    result_alloc(&f, &p), result_alloc(&u, &p);
    float *z = NULL;
    CHECK(fused(&p, &f, 0) == FR_OK && unfused(&p, &u, &z) == FR_OK, "hits: runs");
    int32_t want = 0; /* by hand: every row's first maximum is class 3 */
    for (int64_t n = 0; n < p.N; n++) want += p.y[n] == 3;
    CHECK(f.hits == want && u.hits == want, "hits with ties: %d fused, %d stored, %d by hand",
          (int)f.hits, (int)u.hits, (int)want);
    free(z);
    p.x[3 * p.C] = NAN; /* row 3: every logit NaN, its argmax 0 = its label */
    CHECK(fused(&p, &f, 0) == FR_OK && unfused(&p, &u, &z) == FR_OK, "hits: NaN runs");
    CHECK(f.hits == want + 1 && u.hits == want + 1, "hits with a NaN row: %d fused, %d stored",
          (int)f.hits, (int)u.hits);
    CHECK(isnan(f.loss), "a NaN row makes the loss NaN, not %g", (double)f.loss);
    free(z);
    result_free(&f), result_free(&u);
    problem_free(&p);
}

/* a label outside [0, V) and a workspace too small: errors naming them, nothing written */
static void check_errors(void) {
    problem p;
    problem_make(&p, 6, 4, 10, 4, 1, 17);
    p.y[4] = 10;
    result f = {0};
    result_alloc(&f, &p);
    f.loss = 42.0f;
    CHECK(fused(&p, &f, 0) == FR_ERR_ARG, "label 10 of 10 classes accepted");
    CHECK(strstr(fr_last_error(g_ctx), "label 10 of sample 4 is outside [0, 10)") != NULL,
          "message: %s", fr_last_error(g_ctx));
    CHECK(f.loss == 42.0f, "the loss was written before the labels were checked");
    p.y[4] = 1;
    call k;
    call_init(&k, FR_OP_LINEAR_CE, 4, 1.0f);
    float ws[39], loss;
    int32_t hits;
    k.c.in[0] = tf(p.x, fr_shape2(6, 4)), k.c.in[1] = tf(p.w, fr_shape2(10, 4));
    k.c.in[2] = tf(p.b, fr_shape1(10)), k.c.in[3] = ti(p.y, fr_shape1(6));
    k.c.out[0] = tf(&loss, fr_shape1(1)), k.c.out[1] = ti(&hits, fr_shape1(1));
    k.c.out[2] = tf(ws, fr_shape1(39)); /* needs 4 x 10 + 2 x 6 = 52 */
    CHECK(fr_k_linear_ce(&k.c) == FR_ERR_ARG &&
              strstr(fr_last_error(g_ctx), "workspace of 39 floats, a chunk of 4 rows needs 52"),
          "a small workspace: %s", fr_last_error(g_ctx));
    k.c.in[1] = tf(p.w, fr_shape2(10, 5));
    CHECK(fr_k_linear_ce(&k.c) == FR_ERR_SHAPE, "W (10, 5) against x (6, 4) accepted");
    result_free(&f);
    problem_free(&p);
}

/* the fused kernels on a bf16 x; gws: the GEMM scratch's bytes (0: what
 * fr_k_linear_ce16_ws says) */
static int fused16(const problem *p, const uint16_t *x16, result *r, size_t short_by) {
    const int64_t N = p->N, C = p->C, V = p->V;
    const int64_t R = p->R < 1 || p->R > N ? N : p->R;
    fr_shape xs = fr_shape2(N, C), ws = fr_shape2(V, C);
    call k;
    call_init(&k, FR_OP_LINEAR_CE, (int)p->R, p->scale);
    size_t gb = fr_k_linear_ce16_ws(N, R, C, V, 0) - short_by;
    void *g = malloc(gb + 1);
    float *wsp = falloc((size_t)FR_K_LINEAR_CE_WS(R, N, V, 0));
    k.c.gemm_ws = g, k.c.gemm_ws_len = gb;
    k.c.in[0] = (fr_tensor){.dtype = FR_BF16, .shape = xs, .data = (void *)x16};
    k.c.in[1] = tf(p->w, ws);
    k.c.in[2] = tf(p->bias ? p->b : NULL, fr_shape1(V));
    k.c.in[3] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(&r->loss, fr_shape1(1)), k.c.out[1] = ti(&r->hits, fr_shape1(1));
    k.c.out[2] = tf(wsp, fr_shape1(FR_K_LINEAR_CE_WS(R, N, V, 0)));
    int st = fr_k_linear_ce(&k.c);
    free(wsp), free(g);
    if (st) return st;
    call_init(&k, FR_OP_LINEAR_CE_BWD, (int)p->R, p->scale);
    gb = fr_k_linear_ce16_ws(N, R, C, V, 1) - short_by;
    g = malloc(gb + 1);
    wsp = falloc((size_t)FR_K_LINEAR_CE_WS(R, N, V, 1));
    k.c.gemm_ws = g, k.c.gemm_ws_len = gb;
    k.c.in[0] = (fr_tensor){.dtype = FR_BF16, .shape = xs, .data = (void *)x16};
    k.c.in[1] = tf(p->w, ws);
    k.c.in[2] = tf(p->bias ? p->b : NULL, fr_shape1(V));
    k.c.in[3] = ti(p->y, fr_shape1(N));
    k.c.out[0] = tf(r->dx, xs), k.c.out[1] = tf(r->dw, ws);
    k.c.out[2] = tf(p->bias ? r->db : NULL, fr_shape1(V));
    k.c.out[4] = tf(wsp, fr_shape1(FR_K_LINEAR_CE_WS(R, N, V, 1)));
    st = fr_k_linear_ce_bwd(&k.c);
    free(wsp), free(g);
    return st;
}

static void check_bf16(int64_t N, int64_t C, int64_t V, int64_t R, int bias) {
    problem p;
    problem_make(&p, N, C, V, R, bias, 9);
    char what[96];
    snprintf(what, sizeof what, "bf16 N %lld C %lld V %lld R %lld%s", (long long)N, (long long)C,
             (long long)V, (long long)R, bias ? " bias" : "");
    uint16_t *x16 = malloc((size_t)(N * C) * 2);
    for (int64_t i = 0; i < N * C; i++) x16[i] = ref_bf16(p.x[i]);
    /* the reference's operands: x and W rounded to bf16 (the bias stays f32) */
    problem q = p;
    q.x = falloc((size_t)(N * C)), q.w = falloc((size_t)(V * C));
    for (int64_t i = 0; i < N * C; i++) q.x[i] = ref_bf16_value(x16[i]);
    for (int64_t i = 0; i < V * C; i++) q.w[i] = ref_bf16_value(ref_bf16(p.w[i]));
    double loss, *dx = malloc((size_t)(N * C) * 8), *dw = malloc((size_t)(V * C) * 8),
                 *db = malloc((size_t)V * 8), *ax = calloc((size_t)(N * C), 8),
                 *aw = calloc((size_t)(V * C), 8), *z = malloc((size_t)V * 8);
    reference(&q, &loss, dx, dw, db);
    for (int64_t n = 0; n < N; n++) { /* sum |g w| for dx, sum |g x| for dW */
        double mx = -INFINITY, e = 0;
        for (int64_t v = 0; v < V; v++) {
            double a = bias ? q.b[v] : 0;
            for (int64_t c = 0; c < C; c++) a += (double)q.x[n * C + c] * q.w[v * C + c];
            z[v] = a, mx = fmax(mx, a);
        }
        for (int64_t v = 0; v < V; v++) e += exp(z[v] - mx);
        for (int64_t v = 0; v < V; v++) {
            const double g =
                fabs((double)p.scale * (exp(z[v] - mx) / e - (v == p.y[n])) / (double)N);
            for (int64_t c = 0; c < C; c++) {
                ax[n * C + c] += g * fabs(q.w[v * C + c]);
                aw[v * C + c] += g * fabs(q.x[n * C + c]);
            }
        }
    }
    result f = {0}, f2 = {0};
    result_alloc(&f, &p), result_alloc(&f2, &p);
    CHECK(fused16(&p, x16, &f, 0) == FR_OK, "%s: %s", what, fr_last_error(g_ctx));
    CHECK(fabs(f.loss - loss) <= 1e-5 * fabs(loss), "%s: loss %.9g, float64 %.9g", what,
          (double)f.loss, loss);
    double mdx = 0, mdw = 0;
    for (int64_t i = 0; i < N * C; i++) mdx = fmax(mdx, fabs(dx[i]));
    for (int64_t i = 0; i < V * C; i++) mdw = fmax(mdw, fabs(dw[i]));
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < N * C; i++) {
        const double e = fabs(f.dx[i] - dx[i]);
        bad += e > ldexp(ax[i], -8) + 1e-6 * mdx;
        worst = fmax(worst, e / (ax[i] + 1e-30));
    }
    for (int64_t i = 0; i < V * C; i++) {
        const double e = fabs(f.dw[i] - dw[i]);
        bad += e > ldexp(aw[i], -8) + 1e-6 * mdw;
        worst = fmax(worst, e / (aw[i] + 1e-30));
    }
    if (bias)
        for (int64_t v = 0; v < V; v++) bad += fabs(f.db[v] - db[v]) > 1e-4 * fabs(db[v]) + 1e-9;
    CHECK(bad == 0, "%s: %d gradient values off the float64 reference (worst %.2e of sum |terms|)",
          what, bad, worst);
    CHECK(fused16(&p, x16, &f2, 0) == FR_OK && f2.loss == f.loss && f2.hits == f.hits &&
              !memcmp(f2.dx, f.dx, (size_t)(N * C) * 4) &&
              !memcmp(f2.dw, f.dw, (size_t)(V * C) * 4),
          "%s: a second run differs", what);
    CHECK(fused16(&p, x16, &f2, 1) == FR_ERR_ARG &&
              strstr(fr_last_error(g_ctx), "bytes of GEMM scratch, the plan gave"),
          "%s: a short scratch: %s", what, fr_last_error(g_ctx));
    if (getenv("FR_TEST_VERBOSE")) printf("%-40s worst %.2e of sum |terms|\n", what, worst);
    result_free(&f), result_free(&f2);
    free(dx), free(dw), free(db), free(ax), free(aw), free(z), free(x16), free(q.x), free(q.w);
    problem_free(&p);
}

int main(void) {
    g_ctx = fr_ctx_new();
    if (!g_ctx) return 2;
    static const int64_t Vs[] = {256, 1000}, Cs[] = {16, 64}, Ns[] = {1, 37, 130},
                         Rs[] = {1, 7, 64, 0};
    for (int vi = 0; vi < 2; vi++)
        for (int ci = 0; ci < 2; ci++)
            for (int ni = 0; ni < 3; ni++)
                for (int ri = 0; ri < 4; ri++)
                    check_problem(Ns[ni], Cs[ci], Vs[vi], Rs[ri], (ni + ri) % 2);
    /* GPT-2's vocabulary: chunks of 7 and 64 rows over 37 and 130 */
    check_problem(37, 16, 50257, 7, 1);
    check_problem(130, 16, 50257, 64, 0);
    if (!fr_gemm16_native(FR_BF16)) {
        printf("bf16 x: SKIPPED, this CPU (or build) has no native bf16 GEMM\n");
    } else {
        check_bf16(37, 64, 50257, 7, 1); /* 4 panels of W, chunks of 7 rows */
        check_bf16(20, 16, 1000, 0, 0);  /* one panel, one chunk */
        check_bf16(9, 100, 30011, 4, 1); /* 3 panels, a last chunk of 1 */
    }
    check_accumulate();
    check_hits();
    check_errors();
    fr_ctx_free(g_ctx);
    return check_done();
}
