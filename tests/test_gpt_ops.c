/* test_gpt_ops.c — the ops a GPT adds to the table, called as kernels and
 * through the graph's shape rules: GELU's tanh form against its formula in
 * float64 (and its derivative against central differences of that formula),
 * EMBEDDING and POS_EMBEDDING forward and backward against sums in float64
 * (accumulating, rows never read, the same bits at 1 and 3 threads), a bad
 * id refused with its position, a sequence longer than the position table
 * refused, LINEAR / LAYERNORM / CROSS_ENTROPY on (B,T,C) giving the bits of
 * the same rows as (B T, C), and the ATTENTION op against a float64 causal
 * attention written here. Then every op, forward and backward, against
 * PyTorch's nanoGPT formulation (tests/gpt_ops_ref.h, made by
 * tests/ref/gpt_ops_ref.py): |got - want| <= 1e-5 (|want| + max|want|).
 * Last, a one-block GPT through graph -> autodiff -> plan -> exec with the
 * token table tied to the head (its gradient is the sum of EMBEDDING_BWD's
 * and LINEAR_BWD's, the second added into the first), every parameter's
 * gradient against central differences of the loss.
 * Prints "N passed, M failed". */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/attention.h"
#include "autodiff/autodiff.h"
#include "backend/cpu/kernels.h"
#include "check.h"
#include "exec/exec.h"
#include "gpt_ops_ref.h"

static fr_ctx *g_ctx;

static unsigned long long g_rng = 0x243f6a8885a308d3ull;
static double urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}
static float *frand(size_t n, double scale) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)(scale * urand());
    return p;
}

typedef struct call {
    fr_node node;
    fr_kernel_call c;
} call;

static void call_init(call *k, fr_op op, const fr_attr *a) {
    memset(k, 0, sizeof *k);
    k->node.op = op;
    k->node.fwd = -1;
    if (a) k->node.attr = *a;
    k->c.ctx = g_ctx;
    k->c.node = &k->node;
}
static fr_tensor tf(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_F32, .shape = s, .data = data};
}
static fr_tensor ti32(void *data, fr_shape s) {
    return (fr_tensor){.dtype = FR_I32, .shape = s, .data = data};
}

/* max |got - ref| / max(1, max |ref|) */
static double rel_err(const float *got, const double *ref, size_t n) {
    double e = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d;
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return e / m;
}

/* ---- GELU, tanh form ---- */

static double gelu_tanh_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gelu_tanh(void) {
    enum { N = 4001 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    float *ye = malloc(N * sizeof(float)), *dy = frand(N, 1.0), *dx = malloc(N * sizeof(float));
    double *ry = malloc(N * sizeof(double)), *rdx = malloc(N * sizeof(double));
    for (int i = 0; i < N; i++) x[i] = (float)(-6.0 + 12.0 * i / (N - 1));
    fr_attr a = {.approx = 1}, exact = {0};
    call k;
    call_init(&k, FR_OP_GELU, &a);
    k.c.in[0] = tf(x, fr_shape1(N));
    k.c.out[0] = tf(y, fr_shape1(N));
    CHECK(fr_k_gelu(&k.c) == 0, "gelu tanh: %s", fr_last_error(g_ctx));
    call_init(&k, FR_OP_GELU, &exact);
    k.c.in[0] = tf(x, fr_shape1(N));
    k.c.out[0] = tf(ye, fr_shape1(N));
    CHECK(fr_k_gelu(&k.c) == 0, "gelu exact: %s", fr_last_error(g_ctx));
    const double h = 1e-5;
    double gap = 0;
    for (int i = 0; i < N; i++) {
        ry[i] = gelu_tanh_ref(x[i]);
        rdx[i] = dy[i] * (gelu_tanh_ref(x[i] + h) - gelu_tanh_ref(x[i] - h)) / (2 * h);
        gap = fmax(gap, fabs((double)ye[i] - ry[i]));
    }
    double e = rel_err(y, ry, N);
    CHECK(e < 2e-6, "gelu tanh forward off by %.3g", e);
    /* the two forms differ by up to ~5e-4 (near |x| = 2): approx is honoured */
    CHECK(gap > 1e-4, "approx = 0 gives the tanh form too (gap %.3g)", gap);
    call_init(&k, FR_OP_GELU_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape1(N));
    k.c.in[1] = tf(x, fr_shape1(N));
    k.c.out[0] = tf(dx, fr_shape1(N));
    CHECK(fr_k_gelu_bwd(&k.c) == 0, "gelu tanh bwd: %s", fr_last_error(g_ctx));
    e = rel_err(dx, rdx, N);
    CHECK(e < 1e-5, "gelu tanh backward off by %.3g from central differences", e);
    printf("gelu tanh: forward %.2e, backward %.2e, gap to exact %.2e\n", rel_err(y, ry, N), e,
           gap);
    free(x), free(y), free(ye), free(dy), free(dx), free(ry), free(rdx);
}

/* Every value of the tanh GELU over [-10, 10] against y = x sigma(z) in
 * double, z = 2 sqrt(2/pi) (x + 0.044715 x^3) (0.5 (1 + tanh(z/2)) =
 * sigma(z), so this reference has no cancellation where tanh nears -1). The
 * bound, derived by hand: z is formed in float with at most 5 roundings
 * (x^3, the product, the sum of like signs, the scale), which moves y by
 * |x| sigma (1 - sigma) |z| 5 eps; exp's own error (under 1 ulp), 1 + e and
 * the division add up to 4 eps |y|. Allowed: 6 and 4 eps of each. */
static void test_gelu_tanh_sweep(void) {
    enum { N = 20001 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)(-10.0 + 20.0 * i / (N - 1));
    fr_attr a = {.approx = 1};
    call k;
    call_init(&k, FR_OP_GELU, &a);
    k.c.in[0] = tf(x, fr_shape1(N));
    k.c.out[0] = tf(y, fr_shape1(N));
    CHECK(fr_k_gelu(&k.c) == 0, "gelu tanh: %s", fr_last_error(g_ctx));
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double v = x[i], z = 2.0 * sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
        const double sg = 1.0 / (1.0 + exp(-z)), ref = v * sg;
        const double bound =
            (6.0 * fabs(v) * sg * (1.0 - sg) * fabs(z) + 4.0 * fabs(ref)) * FLT_EPSILON + 1e-45;
        const double r = fabs((double)y[i] - ref) / bound;
        CHECK(r <= 1.0, "gelu tanh(%.9g) = %.9g, the reference %.17g (%.2f of the bound)", v,
              (double)y[i], ref, r);
        if (r > worst) worst = r;
    }
    printf("gelu tanh over [-10, 10]: worst %.2f of the rounding bound\n", worst);
    free(x), free(y);
}

/* ---- EMBEDDING ---- */

static int emb_fwd(int32_t *id, int B, int T, float *w, int V, int C, float *y) {
    call k;
    call_init(&k, FR_OP_EMBEDDING, NULL);
    k.c.in[0] = ti32(id, fr_shape2(B, T));
    k.c.in[1] = tf(w, fr_shape2(V, C));
    k.c.out[0] = tf(y, fr_shape3(B, T, C));
    return fr_k_embedding(&k.c);
}

static int emb_bwd(const float *dy, int32_t *id, int B, int T, float *dw, int V, int C, int acc) {
    call k;
    call_init(&k, FR_OP_EMBEDDING_BWD, NULL);
    k.c.in[0] = tf((void *)dy, fr_shape3(B, T, C));
    k.c.in[1] = ti32(id, fr_shape2(B, T));
    k.c.out[1] = tf(dw, fr_shape2(V, C));
    k.c.accumulate = acc ? 2u : 0u;
    return fr_k_embedding_bwd(&k.c);
}

static void test_embedding(int B, int T, int V, int C) {
    const size_t R = (size_t)B * T, nw = (size_t)V * C;
    int32_t *id = malloc(R * sizeof(int32_t));
    /* ids from the lower half of the table: the upper rows are never read */
    for (size_t r = 0; r < R; r++) id[r] = (int32_t)((urand() + 1.0) * 0.5 * (V / 2));
    float *w = frand(nw, 1.0), *y = malloc(R * C * sizeof(float)), *dy = frand(R * C, 1.0);
    CHECK(emb_fwd(id, B, T, w, V, C, y) == 0, "embedding: %s", fr_last_error(g_ctx));
    int same = 1;
    for (size_t r = 0; r < R; r++) same &= !memcmp(y + r * C, w + (size_t)id[r] * C, C * 4);
    CHECK(same, "embedding (B=%d T=%d V=%d C=%d): a row is not its table row", B, T, V, C);
    double *ref = calloc(nw, sizeof(double));
    for (size_t r = 0; r < R; r++)
        for (int c = 0; c < C; c++) ref[(size_t)id[r] * C + c] += dy[r * C + c];
    float *dw = frand(nw, 9.0), *dw3 = malloc(nw * sizeof(float)); /* garbage: overwritten */
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(emb_bwd(dy, id, B, T, dw, V, C, 0) == 0, "embedding_bwd: %s", fr_last_error(g_ctx));
    omp_set_num_threads(3);
    memcpy(dw3, w, nw * sizeof(float));
    CHECK(emb_bwd(dy, id, B, T, dw3, V, C, 0) == 0, "embedding_bwd: %s", fr_last_error(g_ctx));
    omp_set_num_threads(saved);
    double e = rel_err(dw, ref, nw);
    CHECK(e < 1e-5, "embedding_bwd (B=%d T=%d V=%d C=%d) off by %.3g", B, T, V, C, e);
    CHECK(!memcmp(dw, dw3, nw * sizeof(float)), "embedding_bwd differs at 1 and 3 threads");
    /* accumulate: dW0 + the sums */
    float *acc = frand(nw, 1.0);
    for (size_t i = 0; i < nw; i++) ref[i] += acc[i];
    CHECK(emb_bwd(dy, id, B, T, acc, V, C, 1) == 0, "embedding_bwd acc: %s", fr_last_error(g_ctx));
    e = rel_err(acc, ref, nw);
    CHECK(e < 1e-5, "embedding_bwd accumulating off by %.3g", e);
    free(id), free(w), free(y), free(dy), free(ref), free(dw), free(dw3), free(acc);
}

static void test_embedding_bad_id(void) {
    int32_t id[6] = {0, 1, 2, 3, 4, 0};
    float w[4 * 3] = {0}, y[6 * 3], dy[6 * 3] = {0};
    for (int i = 0; i < 18; i++) y[i] = 7.0f;
    id[5] = 4; /* V = 4: sample 1, position 2 */
    id[4] = 1;
    CHECK(emb_fwd(id, 2, 3, w, 4, 3, y) == FR_ERR_ARG, "id 4 of a 4-row table accepted");
    CHECK(strstr(fr_last_error(g_ctx), "id 4 at sample 1, position 2") != NULL, "message: %s",
          fr_last_error(g_ctx));
    int untouched = 1;
    for (int i = 0; i < 18; i++) untouched &= y[i] == 7.0f;
    CHECK(untouched, "embedding wrote y before refusing an id");
    id[5] = 0, id[1] = -1;
    CHECK(emb_bwd(dy, id, 2, 3, w, 4, 3, 0) == FR_ERR_ARG, "id -1 accepted by the backward");
    CHECK(strstr(fr_last_error(g_ctx), "id -1 at sample 0, position 1") != NULL, "message: %s",
          fr_last_error(g_ctx));
}

/* ---- POS_EMBEDDING ---- */

static void test_pos_embedding(int B, int T, int Tmax, int C) {
    const size_t n = (size_t)B * T * C, nw = (size_t)Tmax * C;
    float *x = frand(n, 1.0), *w = frand(nw, 1.0), *y = malloc(n * sizeof(float));
    call k;
    call_init(&k, FR_OP_POS_EMBEDDING, NULL);
    k.c.in[0] = tf(x, fr_shape3(B, T, C));
    k.c.in[1] = tf(w, fr_shape2(Tmax, C));
    k.c.out[0] = tf(y, fr_shape3(B, T, C));
    CHECK(fr_k_pos_embedding(&k.c) == 0, "pos_embedding: %s", fr_last_error(g_ctx));
    int ok = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                size_t i = ((size_t)b * T + t) * C + c;
                ok &= y[i] == x[i] + w[(size_t)t * C + c];
            }
    CHECK(ok, "pos_embedding (B=%d T=%d Tmax=%d C=%d): y != x + W[t]", B, T, Tmax, C);
    double *ref = calloc(nw, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) ref[(size_t)t * C + c] += x[((size_t)b * T + t) * C + c];
    float *dw[2] = {frand(nw, 9.0), frand(nw, 9.0)}, *acc = frand(nw, 1.0);
    float *acc0 = malloc(nw * sizeof(float));
    memcpy(acc0, acc, nw * sizeof(float));
    int saved = omp_get_max_threads();
    for (int r = 0; r < 3; r++) {
        call_init(&k, FR_OP_POS_EMBEDDING_BWD, NULL);
        k.c.in[0] = tf(x, fr_shape3(B, T, C)); /* x as dy */
        k.c.out[1] = tf(r < 2 ? dw[r] : acc, fr_shape2(Tmax, C));
        k.c.accumulate = r == 2 ? 2u : 0u;
        omp_set_num_threads(r == 1 ? 3 : 1);
        CHECK(fr_k_pos_embedding_bwd(&k.c) == 0, "pos_embedding_bwd: %s", fr_last_error(g_ctx));
    }
    omp_set_num_threads(saved);
    double e = rel_err(dw[0], ref, nw);
    CHECK(e < 1e-5, "pos_embedding_bwd (B=%d T=%d Tmax=%d) off by %.3g", B, T, Tmax, e);
    CHECK(!memcmp(dw[0], dw[1], nw * sizeof(float)), "pos_embedding_bwd differs at 1, 3 threads");
    int rest = 1; /* rows >= T: 0 when written, untouched when accumulating */
    for (size_t i = (size_t)T * C; i < nw; i++) rest &= dw[0][i] == 0.0f && acc[i] == acc0[i];
    CHECK(rest, "pos_embedding_bwd: rows past T are not 0 / untouched");
    for (size_t i = 0; i < (size_t)T * C; i++) ref[i] += acc0[i];
    for (size_t i = (size_t)T * C; i < nw; i++) ref[i] = acc0[i];
    e = rel_err(acc, ref, nw);
    CHECK(e < 1e-5, "pos_embedding_bwd accumulating off by %.3g", e);
    free(x), free(w), free(y), free(ref), free(dw[0]), free(dw[1]), free(acc), free(acc0);
}

/* ---- shape rules through the graph ---- */

static void test_shape_rules(void) {
    fr_graph g;
    fr_graph_init(&g, g_ctx);
    int x = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 6, 8));
    int wpe = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape2(5, 8));
    int in[2] = {x, wpe};
    CHECK(fr_graph_node(&g, FR_OP_POS_EMBEDDING, in, 2, NULL, -1, 0, NULL) < 0,
          "T = 6 > Tmax = 5 accepted");
    CHECK(strstr(fr_last_error(g_ctx), "sequence of 6 positions but the position table has 5"),
          "message: %s", fr_last_error(g_ctx));
    int idx = fr_graph_value(&g, FR_VAL_INPUT, FR_I32, fr_shape2(2, 6));
    int wte = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape2(11, 8));
    int out[4];
    int in2[2] = {idx, wte};
    CHECK(fr_graph_node(&g, FR_OP_EMBEDDING, in2, 2, NULL, -1, 0, out) >= 0, "embedding: %s",
          fr_last_error(g_ctx));
    fr_shape e = fr_shape3(2, 6, 8);
    CHECK(fr_shape_eq(&g.vals[out[0]].shape, &e), "embedding's output is not (B,T,C)");
    int in3[2] = {wte, wte};
    CHECK(fr_graph_node(&g, FR_OP_EMBEDDING, in3, 2, NULL, -1, 0, NULL) < 0, "f32 ids accepted");
    /* attention: (B,T,3C) -> (B,T,C), lse (B,NH,T); heads must divide C, causal only */
    int qkv = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 6, 24));
    fr_attr a = {.heads = 2, .causal = 1};
    CHECK(fr_graph_node(&g, FR_OP_ATTENTION, &qkv, 1, &a, -1, 0, out) >= 0, "attention: %s",
          fr_last_error(g_ctx));
    fr_shape ey = fr_shape3(2, 6, 8), el = fr_shape3(2, 2, 6);
    CHECK(fr_shape_eq(&g.vals[out[0]].shape, &ey) && fr_shape_eq(&g.vals[out[1]].shape, &el),
          "attention's outputs are not (B,T,C) and (B,NH,T)");
    a.heads = 3;
    CHECK(fr_graph_node(&g, FR_OP_ATTENTION, &qkv, 1, &a, -1, 0, NULL) < 0, "3 heads of C = 8");
    CHECK(strstr(fr_last_error(g_ctx), "heads must divide"), "%s", fr_last_error(g_ctx));
    a.heads = 2, a.causal = 0;
    CHECK(fr_graph_node(&g, FR_OP_ATTENTION, &qkv, 1, &a, -1, 0, NULL) < 0, "causal 0 accepted");
    CHECK(strstr(fr_last_error(g_ctx), "causal"), "%s", fr_last_error(g_ctx));
    /* layernorm over C of (B,T,C): statistics (B,T) */
    int lw = fr_graph_value(&g, FR_VAL_PARAM, FR_F32, fr_shape1(8));
    int in4[3] = {x, lw, lw};
    fr_attr ln = {.eps = 1e-5f};
    CHECK(fr_graph_node(&g, FR_OP_LAYERNORM, in4, 3, &ln, -1, 0, out) >= 0, "layernorm: %s",
          fr_last_error(g_ctx));
    fr_shape es = fr_shape2(2, 6);
    CHECK(fr_shape_eq(&g.vals[out[1]].shape, &es), "layernorm's mean is not (B,T)");
    /* cross-entropy over (B,T,V) with labels (B,T); (B) labels refused */
    int z = fr_graph_value(&g, FR_VAL_STEP, FR_F32, fr_shape3(2, 6, 11));
    int lab = fr_graph_value(&g, FR_VAL_LABEL, FR_I32, fr_shape2(2, 6));
    int lab1 = fr_graph_value(&g, FR_VAL_LABEL, FR_I32, fr_shape1(2));
    int in5[2] = {z, lab}, in6[2] = {z, lab1};
    CHECK(fr_graph_node(&g, FR_OP_CROSS_ENTROPY, in5, 2, NULL, -1, 0, NULL) >= 0, "ce: %s",
          fr_last_error(g_ctx));
    CHECK(fr_graph_node(&g, FR_OP_CROSS_ENTROPY, in6, 2, NULL, -1, 0, NULL) < 0,
          "(B) labels for (B,T,V) logits accepted");
    fr_graph_release(&g);
}

/* ---- (B,T,C) gives the bits of the same rows as (B T, C) ---- */

static void test_rows(void) {
    enum { B = 3, T = 7, K = 10, O = 6, V = 9 };
    const int R = B * T;
    float *x = frand(R * K, 1.0), *w = frand(O * K, 1.0), *b = frand(O, 1.0);
    float *y3 = malloc(R * O * 4), *y2 = malloc(R * O * 4), *dy = frand(R * O, 1.0);
    call k;
    for (int r = 0; r < 2; r++) {
        call_init(&k, FR_OP_LINEAR, NULL);
        k.c.in[0] = tf(x, r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.in[1] = tf(w, fr_shape2(O, K));
        k.c.in[2] = tf(b, fr_shape1(O));
        k.c.out[0] = tf(r ? y3 : y2, r ? fr_shape3(B, T, O) : fr_shape2(R, O));
        CHECK(fr_k_linear(&k.c) == 0, "linear: %s", fr_last_error(g_ctx));
    }
    CHECK(!memcmp(y2, y3, R * O * 4), "linear on (B,T,K) differs from (B T, K)");
    float *g[2][3];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 3; i++) g[r][i] = malloc(R * K * 4);
        call_init(&k, FR_OP_LINEAR_BWD, NULL);
        k.c.in[0] = tf(dy, r ? fr_shape3(B, T, O) : fr_shape2(R, O));
        k.c.in[1] = tf(x, r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.in[2] = tf(w, fr_shape2(O, K));
        k.c.out[0] = tf(g[r][0], r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.out[1] = tf(g[r][1], fr_shape2(O, K));
        k.c.out[2] = tf(g[r][2], fr_shape1(O));
        CHECK(fr_k_linear_bwd(&k.c) == 0, "linear_bwd: %s", fr_last_error(g_ctx));
    }
    CHECK(!memcmp(g[0][0], g[1][0], R * K * 4) && !memcmp(g[0][1], g[1][1], O * K * 4) &&
              !memcmp(g[0][2], g[1][2], O * 4),
          "linear_bwd on (B,T,K) differs from (B T, K)");
    /* layernorm over K */
    float *st[2][2], *ln[2], *dyk = frand(R * K, 1.0), *gk = frand(K, 1.0), *bk = frand(K, 1.0);
    fr_attr la = {.eps = 1e-5f};
    for (int r = 0; r < 2; r++) {
        ln[r] = malloc(R * K * 4), st[r][0] = malloc(R * 4), st[r][1] = malloc(R * 4);
        call_init(&k, FR_OP_LAYERNORM, &la);
        k.c.in[0] = tf(x, r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.in[1] = tf(gk, fr_shape1(K));
        k.c.in[2] = tf(bk, fr_shape1(K));
        k.c.out[0] = tf(ln[r], r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.out[1] = tf(st[r][0], r ? fr_shape2(B, T) : fr_shape1(R));
        k.c.out[2] = tf(st[r][1], r ? fr_shape2(B, T) : fr_shape1(R));
        CHECK(fr_k_layernorm(&k.c) == 0, "layernorm: %s", fr_last_error(g_ctx));
    }
    CHECK(!memcmp(ln[0], ln[1], R * K * 4) && !memcmp(st[0][0], st[1][0], R * 4) &&
              !memcmp(st[0][1], st[1][1], R * 4),
          "layernorm on (B,T,K) differs from (B T, K)");
    float *lg[2][3];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 3; i++) lg[r][i] = malloc(R * K * 4);
        call_init(&k, FR_OP_LAYERNORM_BWD, &la);
        k.c.in[0] = tf(dyk, r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.in[1] = tf(x, r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.in[2] = tf(gk, fr_shape1(K));
        k.c.in[3] = tf(st[r][0], r ? fr_shape2(B, T) : fr_shape1(R));
        k.c.in[4] = tf(st[r][1], r ? fr_shape2(B, T) : fr_shape1(R));
        k.c.out[0] = tf(lg[r][0], r ? fr_shape3(B, T, K) : fr_shape2(R, K));
        k.c.out[1] = tf(lg[r][1], fr_shape1(K));
        k.c.out[2] = tf(lg[r][2], fr_shape1(K));
        CHECK(fr_k_layernorm_bwd(&k.c) == 0, "layernorm_bwd: %s", fr_last_error(g_ctx));
    }
    CHECK(!memcmp(lg[0][0], lg[1][0], R * K * 4) && !memcmp(lg[0][1], lg[1][1], K * 4) &&
              !memcmp(lg[0][2], lg[1][2], K * 4),
          "layernorm_bwd on (B,T,K) differs from (B T, K)");
    /* cross-entropy over V: the loss and dlogits, and a bad label's position */
    float *z = frand(R * V, 3.0), loss[2], *dz[2] = {malloc(R * V * 4), malloc(R * V * 4)};
    int32_t *lab = malloc(R * sizeof(int32_t));
    for (int r = 0; r < R; r++) lab[r] = (int32_t)((urand() + 1.0) * 0.5 * V);
    fr_attr ca = {.scale = 1.0f};
    for (int r = 0; r < 2; r++) {
        call_init(&k, FR_OP_CROSS_ENTROPY, &ca);
        k.c.in[0] = tf(z, r ? fr_shape3(B, T, V) : fr_shape2(R, V));
        k.c.in[1] = ti32(lab, r ? fr_shape2(B, T) : fr_shape1(R));
        k.c.out[0] = tf(&loss[r], fr_shape1(1));
        CHECK(fr_k_cross_entropy(&k.c) == 0, "ce: %s", fr_last_error(g_ctx));
        call_init(&k, FR_OP_CROSS_ENTROPY_BWD, &ca);
        k.c.in[0] = tf(z, r ? fr_shape3(B, T, V) : fr_shape2(R, V));
        k.c.in[1] = ti32(lab, r ? fr_shape2(B, T) : fr_shape1(R));
        k.c.out[0] = tf(dz[r], r ? fr_shape3(B, T, V) : fr_shape2(R, V));
        CHECK(fr_k_cross_entropy_bwd(&k.c) == 0, "ce_bwd: %s", fr_last_error(g_ctx));
    }
    /* the loss against float64: mean over the B T rows */
    double ref = 0;
    for (int r = 0; r < R; r++) {
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) m = fmax(m, z[r * V + j]);
        for (int j = 0; j < V; j++) s += exp(z[r * V + j] - m);
        ref += m + log(s) - z[r * V + lab[r]];
    }
    ref /= R;
    CHECK(fabs(loss[1] - ref) < 1e-6 * fmax(1, fabs(ref)), "ce (B,T,V) %.9g, float64 %.9g", loss[1],
          ref);
    CHECK(loss[0] == loss[1] && !memcmp(dz[0], dz[1], R * V * 4),
          "cross-entropy on (B,T,V) differs from (B T, V)");
    lab[2 * T + 5] = V;
    call_init(&k, FR_OP_CROSS_ENTROPY, &ca);
    k.c.in[0] = tf(z, fr_shape3(B, T, V));
    k.c.in[1] = ti32(lab, fr_shape2(B, T));
    k.c.out[0] = tf(&loss[0], fr_shape1(1));
    CHECK(fr_k_cross_entropy(&k.c) == FR_ERR_ARG, "label V accepted");
    CHECK(strstr(fr_last_error(g_ctx), "sample 2 at position 5"), "%s", fr_last_error(g_ctx));
    free(x), free(w), free(b), free(y3), free(y2), free(dy), free(dyk), free(gk), free(bk), free(z),
        free(lab);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 3; i++) free(g[r][i]), free(lg[r][i]);
        free(st[r][0]), free(st[r][1]), free(ln[r]), free(dz[r]);
    }
}

/* ---- the ATTENTION op: fused qkv against float64 ---- */

static void test_attention_op(int B, int T, int NH, int HS) {
    const int C = NH * HS;
    const size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = frand(nq, 2.0), *y = malloc(ny * 4), *lse = malloc(nl * 4);
    size_t wsn = fr_attention_ws_floats(T, HS, omp_get_max_threads());
    float *ws = malloc(wsn * 4);
    fr_attr a = {.heads = NH, .causal = 1};
    call k;
    call_init(&k, FR_OP_ATTENTION, &a);
    k.c.in[0] = tf(qkv, fr_shape3(B, T, 3 * C));
    k.c.out[0] = tf(y, fr_shape3(B, T, C));
    k.c.out[1] = tf(lse, fr_shape3(B, NH, T));
    k.c.out[2] = tf(ws, fr_shape1((int64_t)wsn));
    CHECK(fr_k_attention(&k.c) == 0, "attention: %s", fr_last_error(g_ctx));
    /* y[b,t,h HS + j] = sum_u<=t softmax_u(q.k / sqrt HS) v[u] */
    double *ry = malloc(ny * sizeof(double)), *rl = malloc(nl * sizeof(double));
    double *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * HS;
                double m = -INFINITY, s = 0;
                for (int u = 0; u <= t; u++) {
                    const float *kk = qkv + ((size_t)b * T + u) * 3 * C + C + h * HS;
                    double d = 0;
                    for (int j = 0; j < HS; j++) d += (double)q[j] * kk[j];
                    p[u] = d / sqrt((double)HS);
                    m = fmax(m, p[u]);
                }
                for (int u = 0; u <= t; u++) s += exp(p[u] - m);
                rl[((size_t)b * NH + h) * T + t] = m + log(s);
                for (int j = 0; j < HS; j++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += exp(p[u] - m) / s *
                             qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * HS + j];
                    ry[((size_t)b * T + t) * C + h * HS + j] = o;
                }
            }
    double ey = rel_err(y, ry, ny), el = rel_err(lse, rl, nl);
    CHECK(ey < 1e-5 && el < 1e-5, "attention op (B=%d T=%d NH=%d HS=%d): y %.3g, lse %.3g", B, T,
          NH, HS, ey, el);
    /* the backward op gives the core's bits (the core is checked against
     * float64 in test_attention.c), with D = rowsum(dy o y) per head */
    float *dy = frand(ny, 1.0), *dqkv = malloc(nq * 4), *D = malloc(nl * 4);
    float *dqkv2 = malloc(nq * 4), *D2 = malloc(nl * 4);
    call_init(&k, FR_OP_ATTENTION_BWD, &a);
    k.c.in[0] = tf(dy, fr_shape3(B, T, C));
    k.c.in[1] = tf(qkv, fr_shape3(B, T, 3 * C));
    k.c.in[2] = tf(y, fr_shape3(B, T, C));
    k.c.in[3] = tf(lse, fr_shape3(B, NH, T));
    k.c.out[0] = tf(dqkv, fr_shape3(B, T, 3 * C));
    k.c.out[1] = tf(D, fr_shape3(B, NH, T));
    k.c.out[2] = tf(ws, fr_shape1((int64_t)wsn));
    CHECK(fr_k_attention_bwd(&k.c) == 0, "attention_bwd: %s", fr_last_error(g_ctx));
    fr_attn_layout L = fr_attn_fused(B, NH, T, HS);
    CHECK(fr_attention_bwd(&L, qkv, qkv + C, qkv + 2 * C, y, dy, lse, D2, dqkv2, dqkv2 + C,
                           dqkv2 + 2 * C, ws, wsn) == 0,
          "core bwd");
    CHECK(!memcmp(dqkv, dqkv2, nq * 4) && !memcmp(D, D2, nl * 4),
          "attention_bwd op differs from the core");
    k.c.accumulate = 1;
    CHECK(fr_k_attention_bwd(&k.c) == FR_ERR_ARG, "attention_bwd accumulated into dqkv");
    printf("attention op B=%d T=%d NH=%d HS=%d: y %.2e lse %.2e\n", B, T, NH, HS, ey, el);
    free(qkv), free(y), free(lse), free(ws), free(ry), free(rl), free(p), free(dy), free(dqkv);
    free(D), free(dqkv2), free(D2);
}

/* ---- against PyTorch (tests/gpt_ops_ref.h) ---- */

#define NREF(a) (sizeof(a) / sizeof(a[0]))

static void expect_ref(const char *what, const float *got, const float *want, size_t n) {
    double m = 0, worst = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(want[i]));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= 1e-5 * (fabs(want[i]) + m))) bad++;
        if (!(d <= worst)) worst = d;
    }
    CHECK(bad == 0, "%s: %d of %zu values off PyTorch's (worst %.3g of max %.3g)", what, bad, n,
          worst, m);
    if (getenv("FR_TEST_VERBOSE")) printf("  torch %-16s worst %.2e of %.2e\n", what, worst, m);
}

static void test_torch_ref(void) {
    enum { B = REF_B, T = REF_T, NH = REF_NH, HS = REF_HS, C = REF_NH * REF_HS };
    float buf[4][1024], *ws;
    size_t wsn = fr_attention_ws_floats(T, HS, omp_get_max_threads());
    ws = malloc(wsn * sizeof(float));
    call k;
    /* attention */
    fr_attr a = {.heads = NH, .causal = 1};
    call_init(&k, FR_OP_ATTENTION, &a);
    k.c.in[0] = tf((void *)ref_attn_qkv, fr_shape3(B, T, 3 * C));
    k.c.out[0] = tf(buf[0], fr_shape3(B, T, C));
    k.c.out[1] = tf(buf[1], fr_shape3(B, NH, T));
    k.c.out[2] = tf(ws, fr_shape1((int64_t)wsn));
    CHECK(fr_k_attention(&k.c) == 0, "attention: %s", fr_last_error(g_ctx));
    expect_ref("attention y", buf[0], ref_attn_y, NREF(ref_attn_y));
    expect_ref("attention lse", buf[1], ref_attn_lse, NREF(ref_attn_lse));
    call_init(&k, FR_OP_ATTENTION_BWD, &a);
    k.c.in[0] = tf((void *)ref_attn_dy, fr_shape3(B, T, C));
    k.c.in[1] = tf((void *)ref_attn_qkv, fr_shape3(B, T, 3 * C));
    k.c.in[2] = tf(buf[0], fr_shape3(B, T, C));
    k.c.in[3] = tf(buf[1], fr_shape3(B, NH, T));
    k.c.out[0] = tf(buf[2], fr_shape3(B, T, 3 * C));
    k.c.out[1] = tf(buf[3], fr_shape3(B, NH, T));
    k.c.out[2] = tf(ws, fr_shape1((int64_t)wsn));
    CHECK(fr_k_attention_bwd(&k.c) == 0, "attention_bwd: %s", fr_last_error(g_ctx));
    expect_ref("attention dqkv", buf[2], ref_attn_dqkv, NREF(ref_attn_dqkv));
    /* gelu, tanh form */
    fr_attr ga = {.approx = 1};
    call_init(&k, FR_OP_GELU, &ga);
    k.c.in[0] = tf((void *)ref_gelu_x, fr_shape3(B, T, C));
    k.c.out[0] = tf(buf[0], fr_shape3(B, T, C));
    CHECK(fr_k_gelu(&k.c) == 0, "gelu: %s", fr_last_error(g_ctx));
    expect_ref("gelu tanh y", buf[0], ref_gelu_y, NREF(ref_gelu_y));
    call_init(&k, FR_OP_GELU_BWD, &ga);
    k.c.in[0] = tf((void *)ref_gelu_dy, fr_shape3(B, T, C));
    k.c.in[1] = tf((void *)ref_gelu_x, fr_shape3(B, T, C));
    k.c.out[0] = tf(buf[1], fr_shape3(B, T, C));
    CHECK(fr_k_gelu_bwd(&k.c) == 0, "gelu_bwd: %s", fr_last_error(g_ctx));
    expect_ref("gelu tanh dx", buf[1], ref_gelu_dx, NREF(ref_gelu_dx));
    /* wte(idx) + wpe(t) */
    CHECK(emb_fwd((int32_t *)ref_emb_idx, B, T, (float *)ref_emb_wte, REF_V, C, buf[0]) == 0,
          "embedding: %s", fr_last_error(g_ctx));
    call_init(&k, FR_OP_POS_EMBEDDING, NULL);
    k.c.in[0] = tf(buf[0], fr_shape3(B, T, C));
    k.c.in[1] = tf((void *)ref_emb_wpe, fr_shape2(REF_TMAX, C));
    k.c.out[0] = tf(buf[0], fr_shape3(B, T, C)); /* in place, as the planner may run it */
    CHECK(fr_k_pos_embedding(&k.c) == 0, "pos_embedding: %s", fr_last_error(g_ctx));
    expect_ref("wte + wpe y", buf[0], ref_emb_y, NREF(ref_emb_y));
    CHECK(emb_bwd(ref_emb_dy, (int32_t *)ref_emb_idx, B, T, buf[1], REF_V, C, 0) == 0,
          "embedding_bwd: %s", fr_last_error(g_ctx));
    expect_ref("wte grad", buf[1], ref_emb_dwte, NREF(ref_emb_dwte));
    call_init(&k, FR_OP_POS_EMBEDDING_BWD, NULL);
    k.c.in[0] = tf((void *)ref_emb_dy, fr_shape3(B, T, C));
    k.c.out[1] = tf(buf[2], fr_shape2(REF_TMAX, C));
    CHECK(fr_k_pos_embedding_bwd(&k.c) == 0, "pos_embedding_bwd: %s", fr_last_error(g_ctx));
    expect_ref("wpe grad", buf[2], ref_emb_dwpe, NREF(ref_emb_dwpe));
    /* layernorm over C */
    fr_attr la = {.eps = 1e-5f};
    float mean[B * T], rstd[B * T];
    call_init(&k, FR_OP_LAYERNORM, &la);
    k.c.in[0] = tf((void *)ref_ln_x, fr_shape3(B, T, C));
    k.c.in[1] = tf((void *)ref_ln_w, fr_shape1(C));
    k.c.in[2] = tf((void *)ref_ln_b, fr_shape1(C));
    k.c.out[0] = tf(buf[0], fr_shape3(B, T, C));
    k.c.out[1] = tf(mean, fr_shape2(B, T));
    k.c.out[2] = tf(rstd, fr_shape2(B, T));
    CHECK(fr_k_layernorm(&k.c) == 0, "layernorm: %s", fr_last_error(g_ctx));
    expect_ref("layernorm y", buf[0], ref_ln_y, NREF(ref_ln_y));
    call_init(&k, FR_OP_LAYERNORM_BWD, &la);
    k.c.in[0] = tf((void *)ref_ln_dy, fr_shape3(B, T, C));
    k.c.in[1] = tf((void *)ref_ln_x, fr_shape3(B, T, C));
    k.c.in[2] = tf((void *)ref_ln_w, fr_shape1(C));
    k.c.in[3] = tf(mean, fr_shape2(B, T));
    k.c.in[4] = tf(rstd, fr_shape2(B, T));
    k.c.out[0] = tf(buf[1], fr_shape3(B, T, C));
    k.c.out[1] = tf(buf[2], fr_shape1(C));
    k.c.out[2] = tf(buf[3], fr_shape1(C));
    CHECK(fr_k_layernorm_bwd(&k.c) == 0, "layernorm_bwd: %s", fr_last_error(g_ctx));
    expect_ref("layernorm dx", buf[1], ref_ln_dx, NREF(ref_ln_dx));
    expect_ref("layernorm dw", buf[2], ref_ln_dw, NREF(ref_ln_dw));
    expect_ref("layernorm db", buf[3], ref_ln_db, NREF(ref_ln_db));
    /* linear on (B,T,K) */
    call_init(&k, FR_OP_LINEAR, NULL);
    k.c.in[0] = tf((void *)ref_lin_x, fr_shape3(B, T, REF_K));
    k.c.in[1] = tf((void *)ref_lin_w, fr_shape2(REF_O, REF_K));
    k.c.in[2] = tf((void *)ref_lin_b, fr_shape1(REF_O));
    k.c.out[0] = tf(buf[0], fr_shape3(B, T, REF_O));
    CHECK(fr_k_linear(&k.c) == 0, "linear: %s", fr_last_error(g_ctx));
    expect_ref("linear y", buf[0], ref_lin_y, NREF(ref_lin_y));
    call_init(&k, FR_OP_LINEAR_BWD, NULL);
    k.c.in[0] = tf((void *)ref_lin_dy, fr_shape3(B, T, REF_O));
    k.c.in[1] = tf((void *)ref_lin_x, fr_shape3(B, T, REF_K));
    k.c.in[2] = tf((void *)ref_lin_w, fr_shape2(REF_O, REF_K));
    k.c.out[0] = tf(buf[1], fr_shape3(B, T, REF_K));
    k.c.out[1] = tf(buf[2], fr_shape2(REF_O, REF_K));
    k.c.out[2] = tf(buf[3], fr_shape1(REF_O));
    CHECK(fr_k_linear_bwd(&k.c) == 0, "linear_bwd: %s", fr_last_error(g_ctx));
    expect_ref("linear dx", buf[1], ref_lin_dx, NREF(ref_lin_dx));
    expect_ref("linear dw", buf[2], ref_lin_dw, NREF(ref_lin_dw));
    expect_ref("linear db", buf[3], ref_lin_db, NREF(ref_lin_db));
    /* cross-entropy over (B,T,V) */
    fr_attr ca = {.scale = 1.0f};
    call_init(&k, FR_OP_CROSS_ENTROPY, &ca);
    k.c.in[0] = tf((void *)ref_ce_z, fr_shape3(B, T, REF_V));
    k.c.in[1] = ti32((void *)ref_ce_lab, fr_shape2(B, T));
    k.c.out[0] = tf(buf[0], fr_shape1(1));
    CHECK(fr_k_cross_entropy(&k.c) == 0, "ce: %s", fr_last_error(g_ctx));
    expect_ref("cross-entropy", buf[0], ref_ce_loss, 1);
    call_init(&k, FR_OP_CROSS_ENTROPY_BWD, &ca);
    k.c.in[0] = tf((void *)ref_ce_z, fr_shape3(B, T, REF_V));
    k.c.in[1] = ti32((void *)ref_ce_lab, fr_shape2(B, T));
    k.c.out[0] = tf(buf[1], fr_shape3(B, T, REF_V));
    CHECK(fr_k_cross_entropy_bwd(&k.c) == 0, "ce_bwd: %s", fr_last_error(g_ctx));
    expect_ref("cross-entropy dz", buf[1], ref_ce_dz, NREF(ref_ce_dz));
    free(ws);
}

/* ---- a one-block GPT through the pipeline ---- */

enum { P_WTE, P_WPE, P_LNW, P_LNB, P_ATTW, P_ATTB, P_PRJW, P_PRJB, P_FW, P_FB, NP };

typedef struct gpt {
    fr_graph g;
    fr_plan plan;
    fr_exec ex;
    int pv[NP], gv[NP], idx, lab, loss;
    float *p[NP], *grad[NP];
    size_t n[NP];
    int32_t *ids, *labels;
} gpt;

static float gpt_loss(gpt *m) {
    for (int i = 0; i < NP; i++) {
        m->ex.ptr[m->pv[i]] = m->p[i];
        m->ex.ptr[m->gv[i]] = m->grad[i];
        m->ex.written[m->gv[i]] = 0;
    }
    m->ex.ptr[m->idx] = m->ids;
    m->ex.ptr[m->lab] = m->labels;
    fr_status st = fr_exec_run(&m->ex, 0, (int)m->g.n_nodes, 2, 1, 0);
    fr_exec_finish(&m->ex);
    CHECK(st == FR_OK, "gpt step: %s", fr_last_error(g_ctx));
    return *(const float *)m->ex.ptr[m->loss];
}

// x = wte[idx] + wpe[t];  x = x + c_proj(attn(c_attn(ln_1(x))));
// logits = ln_f(x) wte^T (lm_head tied to wte);  loss = CE(logits, labels)
static void test_gpt_block(void) {
    enum { B = 2, T = 5, V = 7, C = 8, NH = 2, TMAX = 6 };
    gpt m;
    memset(&m, 0, sizeof m);
    fr_graph_init(&m.g, g_ctx);
    fr_graph *g = &m.g;
    fr_shape ps[NP] = {fr_shape2(V, C),     fr_shape2(TMAX, C), fr_shape1(C),    fr_shape1(C),
                       fr_shape2(3 * C, C), fr_shape1(3 * C),   fr_shape2(C, C), fr_shape1(C),
                       fr_shape1(C),        fr_shape1(C)};
    for (int i = 0; i < NP; i++) {
        m.pv[i] = fr_graph_value(g, FR_VAL_PARAM, FR_F32, ps[i]);
        m.gv[i] = fr_graph_value(g, FR_VAL_GRAD, FR_F32, ps[i]);
        m.n[i] = (size_t)fr_shape_numel(&ps[i]);
        m.p[i] = frand(m.n[i], i == P_LNW || i == P_FW ? 0.2 : 0.5);
        if (i == P_LNW || i == P_FW)
            for (size_t k = 0; k < m.n[i]; k++) m.p[i][k] += 1.0f;
        m.grad[i] = malloc(m.n[i] * sizeof(float));
    }
    m.idx = fr_graph_value(g, FR_VAL_INPUT, FR_I32, fr_shape2(B, T));
    m.lab = fr_graph_value(g, FR_VAL_LABEL, FR_I32, fr_shape2(B, T));
    g->vals[m.idx].batched = g->vals[m.lab].batched = 1;
    g->input = m.idx, g->label = m.lab;
    m.ids = malloc(B * T * sizeof(int32_t)), m.labels = malloc(B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        m.ids[i] = (int32_t)((urand() + 1.0) * 0.5 * V);
        m.labels[i] = (int32_t)((urand() + 1.0) * 0.5 * V);
    }
    int o[4], x, h, qkv, y, pr, res, hf, logits;
    fr_attr ln = {.eps = 1e-5f}, at = {.heads = NH, .causal = 1}, ce = {.scale = 1.0f};
    int ok = 1;
    int in[3] = {m.idx, m.pv[P_WTE]};
    ok &= fr_graph_node(g, FR_OP_EMBEDDING, in, 2, NULL, -1, 0, o) >= 0, x = o[0];
    in[0] = x, in[1] = m.pv[P_WPE];
    ok &= fr_graph_node(g, FR_OP_POS_EMBEDDING, in, 2, NULL, -1, 0, o) >= 0, x = o[0];
    in[0] = x, in[1] = m.pv[P_LNW], in[2] = m.pv[P_LNB];
    ok &= fr_graph_node(g, FR_OP_LAYERNORM, in, 3, &ln, -1, 0, o) >= 0, h = o[0];
    in[0] = h, in[1] = m.pv[P_ATTW], in[2] = m.pv[P_ATTB];
    ok &= fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) >= 0, qkv = o[0];
    ok &= fr_graph_node(g, FR_OP_ATTENTION, &qkv, 1, &at, -1, 0, o) >= 0, y = o[0];
    in[0] = y, in[1] = m.pv[P_PRJW], in[2] = m.pv[P_PRJB];
    ok &= fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) >= 0, pr = o[0];
    in[0] = x, in[1] = pr;
    ok &= fr_graph_node(g, FR_OP_ADD, in, 2, NULL, -1, 0, o) >= 0, res = o[0];
    in[0] = res, in[1] = m.pv[P_FW], in[2] = m.pv[P_FB];
    ok &= fr_graph_node(g, FR_OP_LAYERNORM, in, 3, &ln, -1, 0, o) >= 0, hf = o[0];
    in[0] = hf, in[1] = m.pv[P_WTE], in[2] = -1;
    ok &= fr_graph_node(g, FR_OP_LINEAR, in, 3, NULL, -1, 0, o) >= 0, logits = o[0];
    in[0] = logits, in[1] = m.lab;
    ok &= fr_graph_node(g, FR_OP_CROSS_ENTROPY, in, 2, &ce, -1, 0, o) >= 0, m.loss = o[0];
    CHECK(ok, "building the block: %s", fr_last_error(g_ctx));
    if (!ok) return;
    g->loss = m.loss, g->logits = logits;
    int *gof = malloc(g->n_vals * sizeof(int));
    for (size_t v = 0; v < g->n_vals; v++) gof[v] = -1;
    for (int i = 0; i < NP; i++) gof[m.pv[i]] = m.gv[i];
    CHECK(fr_autodiff(g, gof) == FR_OK, "autodiff: %s", fr_last_error(g_ctx));
    uint8_t *keep = calloc(g->n_vals, 1);
    keep[m.loss] = 1;
    CHECK(fr_plan_build(g, keep, NULL, 0, &m.plan) == FR_OK, "plan: %s", fr_last_error(g_ctx));
    CHECK(fr_exec_init(&m.ex, g, &m.plan) == FR_OK, "exec: %s", fr_last_error(g_ctx));
    float L0 = gpt_loss(&m);
    CHECK(isfinite(L0), "loss %g", L0);
    float *bw[NP];
    for (int i = 0; i < NP; i++) {
        bw[i] = malloc(m.n[i] * sizeof(float));
        memcpy(bw[i], m.grad[i], m.n[i] * sizeof(float));
    }
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < NP; i++)
        for (size_t k = 0; k < m.n[i]; k++) {
            const float x0 = m.p[i][k];
            const float xp = x0 + 1e-2f, xm = x0 - 1e-2f;
            m.p[i][k] = xp;
            double Lp = gpt_loss(&m);
            m.p[i][k] = xm;
            double Lm = gpt_loss(&m);
            m.p[i][k] = x0;
            double fd = (Lp - Lm) / ((double)xp - xm), d = fabs(fd - bw[i][k]);
            double rel = d / fmax(1e-2, fabs(fd) + fabs(bw[i][k]));
            if (rel > worst) worst = rel;
            if (rel > 2e-2 && d > 2e-4 && bad++ < 5)
                fprintf(stderr, "  param %d elem %zu: backward %.6g, finite diff %.6g\n", i, k,
                        (double)bw[i][k], fd);
        }
    CHECK(bad == 0, "one GPT block: %d gradient values off finite differences (worst %.3g)", bad,
          worst);
    printf("one GPT block (tied wte): worst relative gradient error %.2e\n", worst);
    for (int i = 0; i < NP; i++) free(m.p[i]), free(m.grad[i]), free(bw[i]);
    free(m.ids), free(m.labels), free(gof), free(keep);
    fr_exec_release(&m.ex);
    fr_plan_release(&m.plan);
    fr_graph_release(g);
}

int main(void) {
    g_ctx = fr_ctx_new();
    test_gelu_tanh();
    test_gelu_tanh_sweep();
    test_embedding(2, 5, 7, 3);
    test_embedding(4, 100, 50, 130); /* above the parallel threshold, a partial column block */
    test_embedding_bad_id();
    test_pos_embedding(2, 3, 5, 4);
    test_pos_embedding(8, 64, 100, 48); /* above the parallel threshold */
    test_shape_rules();
    test_rows();
    test_attention_op(2, 5, 2, 4);
    test_attention_op(1, 70, 3, 16);
    test_torch_ref();
    test_gpt_block();
    fr_mem_stats ms;
    fr_mem_get_stats(g_ctx, &ms);
    CHECK(ms.allocated_total == 0, "%zu bytes leaked", ms.allocated_total);
    fr_ctx_free(g_ctx);
    return check_done();
}
