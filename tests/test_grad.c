/* test_grad.c — the whole-gradient passes of src/backend/cpu/grad.c
 * (fr_k_grad_unscale, fr_k_grad_sumsq, fr_k_grad_scale) against independent
 * per-element references, for f32, f16 and bf16:
 *   - unscale and scale: every value bit for bit equal to x * f multiplied in
 *     f32 (16-bit values widened and rounded back, to nearest even, by half.h's
 *     scalar conversions), for random values over the whole finite range
 *     (negatives, zeros, subnormals, the format's max) and f = 2^-16, 0.3, 3;
 *     nothing outside [0, n) written;
 *   - unscale's flag: 0 for finite values, also where x * f overflows to inf
 *     (PyTorch checks the values read); 1 for a single +inf, -inf, quiet or
 *     signalling NaN at the first, the last or a middle index, at 1, 2 and 3
 *     threads, with every other value still scaled;
 *   - sumsq within 1e-12 relative of a compensated long double sum (bound and
 *     its reasoning at test_sumsq), 0 for n = 0, inf and NaN propagated, and
 *     the same bits at 1, 2 and 3 threads.
 * Sizes 0, 1, 2047, 2048, 2049 (around grad.c's 2048-value chunk), 300001
 * (above its 65536-value threading threshold) and, for sumsq, 600001 (more
 * than 256 blocks). Prints "N passed, M failed"; exits non-zero on any failure. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "backend/cpu/kernels.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"

#define BIG 300001    /* threaded path: above grad.c's 65536 */
#define HUGE_N 600001 /* sumsq: more than 256 blocks of 2048 */
#define GUARD 3       /* elements either side of each array that must stay as they were */
#define GUARD_BYTE 0xA5

static const size_t sizes[] = {0, 1, 2047, 2048, 2049, BIG};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const fr_dtype dtypes[] = {FR_F32, FR_F16, FR_BF16};
static const float factors[] = {0x1p-16f, 0.3f, 3.0f};

/* ---- helpers ------------------------------------------------------------ */

static fr_rng rng = {0x2545f4914f6cdd1dull, 17, 0};

static uint64_t next_u64(void) { return fr_rng_next(&rng); }

static double uniform(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; } /* [0, 1) */

static size_t esize(fr_dtype dt) { return dt == FR_F32 ? 4 : 2; }

static const char *dname(fr_dtype dt) {
    return dt == FR_F32 ? "f32" : dt == FR_F16 ? "f16" : "bf16";
}

/* The raw bits of element i of a dt array. */
static uint32_t raw(const void *g, fr_dtype dt, size_t i) {
    if (dt == FR_F32) {
        uint32_t u;
        memcpy(&u, (const char *)g + 4 * i, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, (const char *)g + 2 * i, 2);
    return h;
}

static void set_raw(void *g, fr_dtype dt, size_t i, uint32_t u) {
    if (dt == FR_F32) {
        memcpy((char *)g + 4 * i, &u, 4);
    } else {
        const uint16_t h = (uint16_t)u;
        memcpy((char *)g + 2 * i, &h, 2);
    }
}

/* Element i as f32, widened by half.h's scalar conversions. */
static float value(const void *g, fr_dtype dt, size_t i) {
    const uint32_t u = raw(g, dt, i);
    if (dt == FR_F16) return fr_f16_to_f32((uint16_t)u);
    if (dt == FR_BF16) return fr_bf16_to_f32((uint16_t)u);
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The bits of x in dt: f32 as is, 16-bit rounded to nearest even by half.h. */
static uint32_t encode(float x, fr_dtype dt) {
    if (dt == FR_F16) return fr_f32_to_f16(x);
    if (dt == FR_BF16) return fr_f32_to_bf16(x);
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static int nan_bits(uint32_t u, fr_dtype dt) {
    if (dt == FR_F32) return (u & 0x7fffffffu) > 0x7f800000u;
    return (u & 0x7fffu) > (dt == FR_F16 ? 0x7c00u : 0x7f80u);
}

/* +inf, -inf, a quiet NaN, a signalling NaN; the largest finite value; the
 * smallest subnormal and normal magnitudes; in the bits of each dtype. */
static uint32_t pos_inf(fr_dtype dt) {
    return dt == FR_F32 ? 0x7f800000u : dt == FR_F16 ? 0x7c00u : 0x7f80u;
}
static uint32_t sign_bit(fr_dtype dt) { return dt == FR_F32 ? 0x80000000u : 0x8000u; }
static uint32_t max_bits(fr_dtype dt) {
    return dt == FR_F32 ? 0x7f7fffffu : dt == FR_F16 ? 0x7bffu : 0x7f7fu;
}
static uint32_t qnan(fr_dtype dt) {
    return dt == FR_F32 ? 0x7fc00000u : dt == FR_F16 ? 0x7e00u : 0x7fc0u;
}
static uint32_t snan(fr_dtype dt) {
    return dt == FR_F32 ? 0x7f800001u : dt == FR_F16 ? 0x7d00u : 0x7f81u;
}
static uint32_t min_normal(fr_dtype dt) {
    return dt == FR_F32 ? 0x00800000u : dt == FR_F16 ? 0x0400u : 0x0080u;
}

/* An array of n dt values with GUARD elements of GUARD_BYTE either side (so
 * the values are also off 16-byte alignment). */
typedef struct {
    fr_dtype dt;
    size_t n;
    unsigned char *mem;
    void *g;
} buf;

static buf buf_new(fr_dtype dt, size_t n) {
    buf b = {dt, n, malloc((n + 2 * GUARD) * esize(dt)), NULL};
    if (!b.mem) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(b.mem, GUARD_BYTE, (n + 2 * GUARD) * esize(dt));
    b.g = b.mem + GUARD * esize(dt);
    return b;
}

static buf buf_copy(const buf *a) {
    buf b = buf_new(a->dt, a->n);
    memcpy(b.g, a->g, a->n * esize(a->dt));
    return b;
}

static int guards_intact(const buf *b) {
    const size_t e = esize(b->dt), tail = (GUARD + b->n) * e;
    for (size_t k = 0; k < GUARD * e; k++)
        if (b->mem[k] != GUARD_BYTE || b->mem[tail + k] != GUARD_BYTE) return 0;
    return 1;
}

/* Random finite values over the whole range of dt: random bit patterns, an
 * all-ones exponent moved one binade down (so negatives, zeros, subnormals
 * and values up to the max all occur), and every 997th value one of the edge
 * values +-max, +-smallest subnormal, smallest normal, +-0, 1. */
static void fill_full_range(buf *b) {
    const fr_dtype dt = b->dt;
    const uint32_t one = dt == FR_F32 ? 0x3f800000u : dt == FR_F16 ? 0x3c00u : 0x3f80u;
    const uint32_t edges[8] = {max_bits(dt),
                               max_bits(dt) | sign_bit(dt),
                               1,
                               1 | sign_bit(dt),
                               min_normal(dt),
                               0,
                               sign_bit(dt),
                               one};
    for (size_t i = 0; i < b->n; i++) {
        uint32_t u = (uint32_t)next_u64();
        if (dt != FR_F32) u &= 0xffffu;
        /* An all-ones exponent (inf, NaN): clear its lowest bit. */
        if ((u & pos_inf(dt)) == pos_inf(dt)) u ^= min_normal(dt);
        if (i % 997 == 0) u = edges[(i / 997) % 8];
        set_raw(b->g, dt, i, u);
    }
}

/* Random values of moderate size, +-[0, 1) * 2^k for k in [-14, 15] (finite
 * in f16 too), rounded to dt. */
static void fill_moderate(buf *b) {
    for (size_t i = 0; i < b->n; i++) {
        const int k = (int)(next_u64() % 30) - 14;
        const float x = (float)ldexp(2 * uniform() - 1, k);
        set_raw(b->g, b->dt, i, encode(x, b->dt));
    }
}

/* The reference for one value: x * f multiplied in f32, rounded to dt. */
static uint32_t product(const buf *in, size_t i, float f) {
    const float p = value(in->g, in->dt, i) * f;
    return encode(p, in->dt);
}

/* out holds in * f value for value, bit for bit (a NaN only needs to stay a
 * NaN: its payload is not specified); its guards are untouched. */
static void expect_products(int line, const buf *in, const buf *out, float f, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < in->n; i++) {
        const uint32_t want = product(in, i, f), got = raw(out->g, out->dt, i);
        const int ok = nan_bits(want, in->dt) ? nan_bits(got, in->dt) : got == want;
        if (!ok && bad++ == 0) first = i;
    }
    CHECK_AT(line, bad == 0,
             "%s %s n=%zu f=%a: %zu values differ, first [%zu] in 0x%x got 0x%x want 0x%x", what,
             dname(in->dt), in->n, (double)f, bad, first, raw(in->g, in->dt, first),
             raw(out->g, out->dt, first), product(in, first, f));
    CHECK_AT(line, guards_intact(out), "%s %s n=%zu: wrote outside [0, n)", what, dname(in->dt),
             in->n);
}

static void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/* ---- unscale and scale: values ---------------------------------------- */

static void test_products(int unscale) {
    const char *what = unscale ? "unscale" : "scale";
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < NSIZES; s++) {
            buf in = buf_new(dtypes[d], sizes[s]);
            fill_full_range(&in);
            for (size_t k = 0; k < 3; k++) {
                const float f = factors[k];
                buf out = buf_copy(&in);
                if (unscale) {
                    /* Every value read is finite, even where x * 3 overflows. */
                    const int r = fr_k_grad_unscale(out.g, in.dt, in.n, f);
                    CHECK(r == 0, "unscale %s n=%zu f=%a: finite values reported as %d",
                          dname(in.dt), in.n, (double)f, r);
                } else {
                    fr_k_grad_scale(out.g, in.dt, in.n, f);
                }
                expect_products(__LINE__, &in, &out, f, what);
                free(out.mem);
            }
            free(in.mem);
        }
}

/* ---- unscale: the non-finite check ------------------------------------ */

/* One +inf, -inf, quiet or signalling NaN at the first, the last or a middle
 * index (in the middle of the large array: inside chunk 73 of 147, a chunk
 * no thread starts or ends on at 2 or 3 threads) makes unscale return 1, and
 * every value is still multiplied (inf * f stays inf, a NaN a NaN). */
static void test_detect(void) {
    const int threads[3] = {1, 2, 3};
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
#endif
    const float f = 0.3f;
    for (size_t d = 0; d < 3; d++) {
        const fr_dtype dt = dtypes[d];
        const uint32_t bad_vals[4] = {pos_inf(dt), pos_inf(dt) | sign_bit(dt), qnan(dt), snan(dt)};
        for (size_t s = 1; s < NSIZES; s++) {
            const size_t n = sizes[s];
            const size_t pos[3] = {0, n - 1, n == BIG ? 73 * 2048 + 517 : n / 2};
            buf in = buf_new(dt, n);
            fill_full_range(&in);
            for (int t = 0; t < (n == BIG ? 3 : 1); t++) {
                set_threads(threads[t]);
                for (size_t v = 0; v < 4; v++)
                    for (size_t p = 0; p < 3; p++) {
                        if (p > 0 && pos[p] == pos[p - 1]) continue;
                        if (p == 2 && pos[2] == pos[0]) continue;
                        const uint32_t keep = raw(in.g, dt, pos[p]);
                        set_raw(in.g, dt, pos[p], bad_vals[v]);
                        buf out = buf_copy(&in);
                        const int r = fr_k_grad_unscale(out.g, dt, n, f);
                        CHECK(r == 1,
                              "unscale %s n=%zu threads=%d: 0x%x at [%zu] not reported (%d)",
                              dname(dt), n, threads[t], bad_vals[v], pos[p], r);
                        expect_products(__LINE__, &in, &out, f, "unscale with a non-finite value");
                        set_raw(in.g, dt, pos[p], keep);
                        free(out.mem);
                    }
            }
            free(in.mem);
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
}

/* The largest finite value times 2 overflows to inf, but the values read were
 * finite: unscale reports 0 (PyTorch's _amp_foreach_non_finite_check_and_unscale_
 * checks its input), and each result is inf of the input's sign. */
static void test_overflow_not_reported(void) {
    const size_t ns[3] = {1, 2049, BIG};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < 3; s++) {
            const fr_dtype dt = dtypes[d];
            buf b = buf_new(dt, ns[s]);
            for (size_t i = 0; i < b.n; i++)
                set_raw(b.g, dt, i, max_bits(dt) | (i % 3 == 1 ? sign_bit(dt) : 0));
            const int r = fr_k_grad_unscale(b.g, dt, b.n, 2.0f);
            CHECK(r == 0, "unscale %s n=%zu: max * 2 reported as non-finite (%d)", dname(dt), b.n,
                  r);
            size_t wrong = 0;
            for (size_t i = 0; i < b.n; i++)
                wrong += raw(b.g, dt, i) != (pos_inf(dt) | (i % 3 == 1 ? sign_bit(dt) : 0));
            CHECK(wrong == 0, "unscale %s n=%zu: max * 2 gave %zu values other than +-inf",
                  dname(dt), b.n, wrong);
            free(b.mem);
        }
}

/* ---- sumsq ------------------------------------------------------------- */

/* The reference: the squares summed in long double with Neumaier's
 * compensation. Each square of an f32 value is exact in long double and even
 * in double (24 significand bits squared need at most 48 of 53; the smallest,
 * 2^-298, is far above double's underflow), and the compensated sum errs by
 * at most about 2 ulp of double whatever long double's width. */
static long double sumsq_ref(const buf *b) {
    long double s = 0, c = 0;
    for (size_t i = 0; i < b->n; i++) {
        const long double x = value(b->g, b->dt, i), y = x * x, t = s + y;
        c += fabsl(s) >= fabsl(y) ? (s - t) + y : (y - t) + s;
        s = t;
    }
    return s + c;
}

/* The bound. The squares are exact in double (above), so only the kernel's
 * additions round. It sums each block of 2048 values in order, then the block
 * sums in order (at most 293 of them here); summing m nonnegative terms in
 * order errs by at most (m - 1) u of their total (u = 2^-53), so the result is
 * within (2047 + 292) u < 2.6e-13 of the exact sum, relatively. The reference
 * adds at most 2.3e-16. 1e-12 keeps a margin of over 3; summing in float
 * (relative errors near 1e-7) or squaring in float (max^2 overflows for f32
 * and bf16) fails it. */
#define SUMSQ_REL 1e-12L

static void test_sumsq(void) {
    size_t ns[NSIZES + 1];
    memcpy(ns, sizes, sizeof sizes);
    ns[NSIZES] = HUGE_N;
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < NSIZES + 1; s++)
            for (int full = 0; full < 2; full++) {
                buf b = buf_new(dtypes[d], ns[s]);
                if (full) fill_full_range(&b);
                else fill_moderate(&b);
                const double got = fr_k_grad_sumsq(b.g, b.dt, b.n);
                const long double want = sumsq_ref(&b);
                CHECK(isfinite(got) && fabsl((long double)got - want) <= SUMSQ_REL * want,
                      "sumsq %s n=%zu %s: %.17g, reference %.20Lg, relative error %Lg", dname(b.dt),
                      b.n, full ? "full range" : "moderate", got, want,
                      want > 0 ? fabsl((long double)got - want) / want : fabsl((long double)got));
                if (b.n == 0) CHECK(got == 0, "sumsq of nothing is %g", got);
                free(b.mem);
            }
}

/* +inf or -inf anywhere makes the sum +inf, a NaN makes it NaN. */
static void test_sumsq_nonfinite(void) {
    for (size_t d = 0; d < 3; d++) {
        const fr_dtype dt = dtypes[d];
        const uint32_t bad_vals[3] = {pos_inf(dt), pos_inf(dt) | sign_bit(dt), qnan(dt)};
        buf b = buf_new(dt, BIG);
        fill_moderate(&b);
        for (size_t v = 0; v < 3; v++) {
            const size_t at = 73 * 2048 + 517;
            const uint32_t keep = raw(b.g, dt, at);
            set_raw(b.g, dt, at, bad_vals[v]);
            const double got = fr_k_grad_sumsq(b.g, dt, b.n);
            CHECK(v < 2 ? got == INFINITY : isnan(got), "sumsq %s with 0x%x: %g", dname(dt),
                  bad_vals[v], got);
            set_raw(b.g, dt, at, keep);
        }
        free(b.mem);
    }
}

/* The same bits at 1, 2 and 3 threads (moderate values, where a different
 * order of the additions does change the last bits). */
static void test_sumsq_threads(void) {
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    const size_t ns[2] = {BIG, HUGE_N};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < 2; s++) {
            buf b = buf_new(dtypes[d], ns[s]);
            fill_moderate(&b);
            double got[3];
            for (int t = 0; t < 3; t++) {
                omp_set_num_threads(t + 1);
                got[t] = fr_k_grad_sumsq(b.g, b.dt, b.n);
            }
            CHECK(!memcmp(&got[0], &got[1], sizeof(double)) &&
                      !memcmp(&got[0], &got[2], sizeof(double)),
                  "sumsq %s n=%zu at 1, 2, 3 threads: %a %a %a", dname(b.dt), b.n, got[0], got[1],
                  got[2]);
            free(b.mem);
        }
    omp_set_num_threads(saved);
#endif
}

int main(void) {
    test_products(1);
    test_products(0);
    test_detect();
    test_overflow_not_reported();
    test_sumsq();
    test_sumsq_nonfinite();
    test_sumsq_threads();
    return check_done();
}
