/* test_cast.c — the CAST kernel (src/backend/cpu/cast.c) against half.c's
 * scalar conversions (checked exhaustively by test_half), element by
 * element, bit for bit, for f16 and bf16, at a serial and a threaded size:
 *   - f32 -> 16 bits and 16 bits -> f32;
 *   - f32 -> f32 rounded through 16 bits (attr.round: the mixed modes'
 *     weights): y = widen(narrow(x));
 *   - f32 added into 16 bits (the accumulate bit: a 16-bit gradient over
 *     micro-batches): y = narrow(widen(y) + x);
 *   - adding into f32, or from 16 bits, is refused;
 *   - the residual stream's sums (ADD, POS_EMBEDDING) and ReLU writing a
 *     16-bit copy of y as one more output (fr_op_info.half_copy): the copy has the
 *     CAST's bits of y, and y those of the call without a copy (in place
 *     too); a copy of another dtype or size is refused.
 * Inputs span ordinary values, values that round to 16-bit subnormals, past
 * f16's range (to inf), exact ties, signed zeros, inf and NaN.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

static fr_ctx *g_ctx;

static uint16_t narrow1(fr_dtype dt, float x) {
    return dt == FR_F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
}
static float widen1(fr_dtype dt, uint16_t h) {
    return dt == FR_F16 ? fr_f16_to_f32(h) : fr_bf16_to_f32(h);
}
static const char *dt_name(fr_dtype dt) { return dt == FR_F16 ? "f16" : "bf16"; }

/* Values of every kind a cast meets: mostly random over many binades,
 * every 97th a named edge case. */
static float *inputs(int64_t n, uint64_t seed) {
    static const float edge[] = {
        0.0f,     -0.0f,    1.0f,   -1.0f,           65504.0f,       65520.0f, 1e6f,      -3.4e38f,
        5.96e-8f, 2.98e-8f, 1e-10f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f, INFINITY, -INFINITY, NAN};
    const int n_edge = (int)(sizeof edge / sizeof edge[0]);
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    fr_rng r = fr_rng_make(seed, 9);
    for (int64_t i = 0; i < n; i++) {
        if (i % 97 == 0) {
            x[i] = edge[(i / 97) % n_edge];
            continue;
        }
        const float m = 2.0f * fr_rng_next_uniform(&r) - 1.0f;
        const int e = (int)(fr_rng_next_uniform(&r) * 60.0f) - 40; /* 2^-40 .. 2^19 */
        x[i] = ldexpf(m, e);
    }
    return x;
}

static int same(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

static int run(fr_dtype from, fr_dtype to, fr_dtype round, int acc, void *x, void *y, int64_t n) {
    fr_node node;
    memset(&node, 0, sizeof node);
    node.op = FR_OP_CAST;
    node.fwd = -1;
    node.attr.dtype = to;
    node.attr.round = round;
    fr_kernel_call c;
    memset(&c, 0, sizeof c);
    c.ctx = g_ctx;
    c.node = &node;
    c.in[0] = (fr_tensor){.dtype = from, .shape = fr_shape1(n), .data = x};
    c.out[0] = (fr_tensor){.dtype = to, .shape = fr_shape1(n), .data = y};
    c.accumulate = acc ? 1u : 0u;
    return fr_k_cast(&c);
}

static void test_dtype(fr_dtype dt, int64_t n) {
    float *x = inputs(n, (uint64_t)n * 3 + (uint64_t)dt), *y = malloc((size_t)n * sizeof *y);
    uint16_t *h = malloc((size_t)n * 2), *acc = malloc((size_t)n * 2);
    int64_t bad = 0;

    CHECK(run(FR_F32, dt, FR_F32, 0, x, h, n) == 0, "narrow to %s", dt_name(dt));
    for (int64_t i = 0; i < n; i++) bad += h[i] != narrow1(dt, x[i]);
    CHECK(bad == 0, "f32 -> %s, n %lld: %lld values differ", dt_name(dt), (long long)n,
          (long long)bad);

    bad = 0;
    CHECK(run(dt, FR_F32, FR_F32, 0, h, y, n) == 0, "widen from %s", dt_name(dt));
    for (int64_t i = 0; i < n; i++) bad += !same(y[i], widen1(dt, h[i]));
    CHECK(bad == 0, "%s -> f32, n %lld: %lld values differ", dt_name(dt), (long long)n,
          (long long)bad);

    bad = 0;
    CHECK(run(FR_F32, FR_F32, dt, 0, x, y, n) == 0, "round through %s", dt_name(dt));
    for (int64_t i = 0; i < n; i++) bad += !same(y[i], widen1(dt, narrow1(dt, x[i])));
    CHECK(bad == 0, "f32 rounded through %s, n %lld: %lld values differ", dt_name(dt), (long long)n,
          (long long)bad);
    int64_t moved = 0; /* the rounding did something: not a copy */
    for (int64_t i = 0; i < n; i++) moved += !same(y[i], x[i]);
    CHECK(moved > n / 2, "rounding through %s changed only %lld of %lld values", dt_name(dt),
          (long long)moved, (long long)n);

    float *x2 = inputs(n, (uint64_t)n * 7 + 1);
    for (int64_t i = 0; i < n; i++) acc[i] = narrow1(dt, x2[i]);
    memcpy(h, acc, (size_t)n * 2);
    CHECK(run(FR_F32, dt, FR_F32, 1, x, h, n) == 0, "add into %s", dt_name(dt));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t want = narrow1(dt, widen1(dt, acc[i]) + x[i]);
        bad += !(h[i] == want || (isnan(widen1(dt, h[i])) && isnan(widen1(dt, want))));
    }
    CHECK(bad == 0, "f32 added into %s, n %lld: %lld values differ", dt_name(dt), (long long)n,
          (long long)bad);

    /* refused: adding into f32, adding from 16 bits */
    fr_status st = run(FR_F32, FR_F32, FR_F32, 1, x, y, n);
    CHECK(st == FR_ERR_ARG, "adding into f32 must be refused (%d)", (int)st);
    st = run(dt, dt, FR_F32, 1, h, acc, n);
    CHECK(st == FR_ERR_ARG, "adding %s into %s must be refused (%d)", dt_name(dt), dt_name(dt),
          (int)st);
    free(x);
    free(x2);
    free(y);
    free(h);
    free(acc);
}

static int run_sum(fr_op op, fr_kernel_call *c) {
    return op == FR_OP_ADD ? fr_k_add(c) : op == FR_OP_RELU ? fr_k_relu(c) : fr_k_pos_embedding(c);
}

static fr_kernel_call sum_call(fr_node *node, fr_op op) {
    memset(node, 0, sizeof *node);
    node->op = op, node->fwd = -1, node->n_in = op == FR_OP_RELU ? 1 : 2, node->n_out = 1;
    fr_kernel_call c;
    memset(&c, 0, sizeof c);
    c.ctx = g_ctx, c.node = node;
    return c;
}

/* y = a + b (ADD), y[r] = x[r] + W[r mod T] (POS_EMBEDDING, rows of C) or
 * y = max(a, 0) (RELU), once without a copy and once with a dt copy: y the
 * same bits, the copy y narrowed value by value */
static void test_copy(fr_op op, fr_dtype dt, int64_t n, int in_place) {
    const int64_t C = 48, T = 7, rows = n / C; /* pos_embedding: (rows / T, T, C) */
    if (op == FR_OP_POS_EMBEDDING) n = rows / T * T * C;
    const char *what = fr_op_get(op)->name;
    float *a = inputs(n, (uint64_t)n + 5), *b = inputs(n, (uint64_t)n * 11 + 2);
    float *y0 = malloc((size_t)n * sizeof *y0), *y = malloc((size_t)n * sizeof *y);
    uint16_t *h = malloc((size_t)n * 2);
    fr_node node;
    fr_kernel_call c = sum_call(&node, op);
    const fr_shape xs = op != FR_OP_POS_EMBEDDING ? fr_shape1(n) : fr_shape3(rows / T, T, C);
    c.in[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = a};
    if (op == FR_OP_ADD) c.in[1] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = b};
    if (op == FR_OP_POS_EMBEDDING)
        c.in[1] = (fr_tensor){.dtype = FR_F32, .shape = fr_shape2(T, C), .data = b};
    c.out[0] = (fr_tensor){.dtype = FR_F32, .shape = xs, .data = y0};
    int st = run_sum(op, &c);
    CHECK(st == 0, "%s without a copy: %s", what, fr_last_error(g_ctx));
    float *dst = y;
    if (in_place) memcpy(y, a, (size_t)n * sizeof *y), c.in[0].data = y; /* y aliases x */
    c.out[0].data = dst;
    node.n_out = 2;
    c.out[1] = (fr_tensor){.dtype = dt, .shape = xs, .data = h};
    st = run_sum(op, &c);
    CHECK(st == 0, "%s with a %s copy: %s", what, dt_name(dt), fr_last_error(g_ctx));
    int64_t bad_y = 0, bad_h = 0, moved = 0, nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        nonzero += y0[i] != 0.0f;
        bad_y += !same(y[i], y0[i]);
        const uint16_t want = narrow1(dt, y0[i]);
        bad_h += !(h[i] == want || (isnan(widen1(dt, h[i])) && isnan(widen1(dt, want))));
        moved += !same(widen1(dt, h[i]), y0[i]);
    }
    CHECK(bad_y == 0, "%s%s with a %s copy, n %lld: %lld values of y differ", what,
          in_place ? " in place" : "", dt_name(dt), (long long)n, (long long)bad_y);
    CHECK(bad_h == 0, "%s%s's %s copy, n %lld: %lld values are not y narrowed", what,
          in_place ? " in place" : "", dt_name(dt), (long long)n, (long long)bad_h);
    CHECK(moved > nonzero / 2,
          "%s's %s copy equals y in all but %lld of its %lld nonzero values: not rounded?", what,
          dt_name(dt), (long long)moved, (long long)nonzero);
    /* refused: an f32 copy, a copy of another size */
    c.in[0].data = a, c.out[0].data = y;
    c.out[1].dtype = FR_F32;
    st = run_sum(op, &c);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "16-bit copy of y is f32"),
          "%s with an f32 copy: status %d, %s", what, (int)st, fr_last_error(g_ctx));
    c.out[1].dtype = dt, c.out[1].shape = fr_shape1(n - 1);
    st = run_sum(op, &c);
    CHECK(st == FR_ERR_SHAPE && strstr(fr_last_error(g_ctx), "its 16-bit copy"),
          "%s with a short copy: status %d, %s", what, (int)st, fr_last_error(g_ctx));
    if (op == FR_OP_RELU) { /* a 16-bit x (ReLU reading its input rounded) has no copy */
        c.out[1].shape = xs;
        c.in[0] = (fr_tensor){.dtype = dt, .shape = xs, .data = h};
        c.out[0].data = y;
        st = fr_k_relu(&c);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(g_ctx), "16-bit copy of y from a"),
              "relu with a %s x and a copy: status %d, %s", dt_name(dt), (int)st,
              fr_last_error(g_ctx));
    }
    free(a), free(b), free(y0), free(y), free(h);
}

int main(void) {
    g_ctx = fr_ctx_new();
    omp_set_num_threads(2);
    const fr_dtype dts[2] = {FR_F16, FR_BF16};
    for (int d = 0; d < 2; d++)
        for (int64_t n = 4099; n <= 200003; n += 195904) /* serial, then the thread team */
            test_dtype(dts[d], n);
    for (int d = 0; d < 2; d++)
        for (int64_t n = 4099; n <= 200003; n += 195904)
            for (int in_place = 0; in_place <= 1; in_place++) {
                test_copy(FR_OP_ADD, dts[d], n, in_place);
                test_copy(FR_OP_POS_EMBEDDING, dts[d], n, in_place);
                test_copy(FR_OP_RELU, dts[d], n, in_place);
            }
    fr_ctx_free(g_ctx);
    return check_done();
}
