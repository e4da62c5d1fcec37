/* test_half.c — exhaustive checks of src/core/half.c against a reference
 * written independently in double arithmetic:
 *   - every one of the 65536 f16 and bf16 patterns decodes to the value of
 *     the textbook formula (ldexp of mantissa and exponent) and encodes back
 *     to itself (a NaN to the same NaN, quieted);
 *   - f32 -> f16/bf16 over every 97th of the 2^32 float patterns, every 7th
 *     one in the range where f16 is neither 0 nor inf, and, for each pair of
 *     adjacent 16-bit values, the exact midpoint, its float neighbours and the
 *     values themselves, both signs; the reference picks the nearest of the
 *     two bracketing 16-bit values found by bisection of a table, ties to the
 *     even pattern, with 2^16 (f16) or 2^128 (bf16) standing for infinity;
 *   - named edge cases (max normal, the 65520 overflow threshold, the
 *     subnormal tie at 2^-25, signed zero, infinities, NaNs).
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK_MAX_REPORTS 30 /* a broken conversion fails millions of cases */
#include "check.h"
#include "core/half.h"

static uint32_t fbits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float bitsf(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* A 16-bit format: exponent and mantissa widths. Non-negative finite
 * patterns 0 .. inf_bits-1 are increasing in value; val[inf_bits] holds the
 * value the next pattern would have with an unbounded exponent (2^16 for f16,
 * 2^128 for bf16), which is where rounding to infinity begins. */
typedef struct fmt16 {
    const char *name;
    int ebits, mbits;
    uint16_t inf_bits, quiet_bit;
    double val[0x7f81];
} fmt16;

static fmt16 F16 = {"f16", 5, 10, 0x7c00, 0x0200, {0}};
static fmt16 BF16 = {"bf16", 8, 7, 0x7f80, 0x0040, {0}};

/* The textbook value of a non-negative pattern (computed in double). */
static double formula(const fmt16 *F, uint32_t p) {
    int bias = (1 << (F->ebits - 1)) - 1;
    uint32_t e = p >> F->mbits, m = p & ((1u << F->mbits) - 1);
    if (e == 0) return ldexp((double)m, 1 - bias - F->mbits);
    return ldexp((double)((1u << F->mbits) + m), (int)e - bias - F->mbits);
}

static void build_table(fmt16 *F) {
    for (uint32_t p = 0; p <= F->inf_bits; p++) F->val[p] = formula(F, p);
}

/* Reference rounding of a finite non-negative value a (double, exact). */
static uint16_t ref_round(const fmt16 *F, double a) {
    if (a >= F->val[F->inf_bits]) return F->inf_bits;
    uint32_t lo = 0, hi = F->inf_bits; /* val[lo] <= a < val[hi] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (F->val[mid] <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - F->val[lo], dh = F->val[hi] - a; /* exact: few significant bits */
    if (dl < dh) return (uint16_t)lo;
    if (dh < dl) return (uint16_t)hi;
    return (uint16_t)((lo & 1u) ? hi : lo);
}

static int is_nan16(const fmt16 *F, uint16_t h) { return (h & 0x7fffu) > F->inf_bits; }

static uint16_t conv(const fmt16 *F, float x) {
    return F == &F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
}

static float back(const fmt16 *F, uint16_t h) {
    return F == &F16 ? fr_f16_to_f32(h) : fr_bf16_to_f32(h);
}

/* One f32 -> 16-bit check against the reference. */
static void check_from_f32(const fmt16 *F, uint32_t xb) {
    float x = bitsf(xb);
    uint16_t got = conv(F, x);
    uint16_t sign = (uint16_t)((xb >> 16) & 0x8000u);
    if (isnan(x)) {
        CHECK(is_nan16(F, got) && (got & 0x8000u) == sign && (got & F->quiet_bit),
              "%s(NaN 0x%08x) = 0x%04x: want a quiet NaN of the same sign", F->name, xb, got);
        return;
    }
    uint16_t want = sign | ref_round(F, fabs((double)x));
    CHECK(got == want, "%s(0x%08x = %.9g) = 0x%04x, want 0x%04x", F->name, xb, (double)x, got,
          want);
}

/* Every pattern decodes to the formula and encodes back to itself. */
static void check_all_patterns(const fmt16 *F) {
    for (uint32_t p = 0; p < 65536; p++) {
        uint16_t h = (uint16_t)p;
        float f = back(F, h);
        int neg = (h & 0x8000u) != 0;
        if (is_nan16(F, h)) {
            uint32_t fb = fbits(f);
            /* payload kept in the top of the f32 mantissa, quiet bit set */
            uint32_t pay = (uint32_t)(h & (uint16_t)(F->quiet_bit * 2 - 1)) << (23 - F->mbits);
            CHECK(isnan(f) && (int)(fb >> 31) == neg && (fb & 0x400000u) &&
                      (fb & ((1u << 23) - 1)) == (pay | 0x400000u),
                  "%s 0x%04x -> f32 0x%08x: want quiet NaN, same sign and payload", F->name, h, fb);
            uint16_t r = conv(F, f);
            CHECK(r == (h | F->quiet_bit), "%s NaN 0x%04x round trip gives 0x%04x", F->name, h, r);
            continue;
        }
        double want = F->val[h & 0x7fffu]; /* inf_bits maps to 2^16/2^128: */
        if ((h & 0x7fffu) == F->inf_bits) want = INFINITY;
        if (neg) want = -want;
        CHECK((double)f == want && !signbit(f) == !signbit(want), "%s 0x%04x -> %.9g, want %.9g",
              F->name, h, (double)f, want);
        uint16_t r = conv(F, f);
        CHECK(r == h, "%s round trip 0x%04x -> %.9g -> 0x%04x", F->name, h, (double)f, r);
    }
}

/* Around every representable value and every midpoint, both signs. */
static void check_midpoints(const fmt16 *F) {
    for (uint32_t p = 0; p < F->inf_bits; p++) {
        double mid = (F->val[p] + F->val[p + 1]) / 2;
        float midf = (float)mid;
        CHECK((double)midf == mid, "%s midpoint after 0x%04x not a float", F->name, p);
        uint32_t pts[2] = {fbits(midf), fbits((float)F->val[p])};
        for (int k = 0; k < 2; k++) {
            for (int d = -1; d <= 1; d++) {
                uint32_t xb = pts[k] + (uint32_t)d; /* a wrap below +0 lands on a NaN: fine */
                check_from_f32(F, xb);
                check_from_f32(F, xb ^ 0x80000000u);
            }
        }
    }
}

static void check_f16_cases(void) {
    struct {
        float x;
        uint16_t want;
        const char *what;
    } c[] = {
        {1.0f, 0x3c00, "1"},
        {-2.0f, 0xc000, "-2"},
        {65504.0f, 0x7bff, "max normal"},
        {bitsf(0x477fefffu), 0x7bff, "just below 65520"},
        {65520.0f, 0x7c00, "65520 overflows to inf"},
        {1e10f, 0x7c00, "1e10"},
        {FLT_MAX, 0x7c00, "FLT_MAX"},
        {-65520.0f, 0xfc00, "-65520"},
        {0x1p-14f, 0x0400, "smallest normal 2^-14"},
        {0x1p-24f, 0x0001, "smallest subnormal 2^-24"},
        {0x1p-25f, 0x0000, "2^-25 ties to 0"},
        {bitsf(0x33000001u), 0x0001, "just above 2^-25"},
        {0x1.8p-24f, 0x0002, "1.5 * 2^-24 ties to even 2"},
        {0x1.4p-24f, 0x0001, "1.25 * 2^-24"},
        {1023 * 0x1p-24f, 0x03ff, "largest subnormal"},
        {1023.5f * 0x1p-24f, 0x0400, "largest subnormal + half ulp ties up to 2^-14"},
        {1.0f + 0x1p-11f, 0x3c00, "1 + half ulp ties to even"},
        {1.0f + 3 * 0x1p-11f, 0x3c02, "1 + 3 half ulps ties to even"},
        {1e-8f, 0x0000, "1e-8"},
        {bitsf(1u), 0x0000, "smallest float subnormal"},
        {0.0f, 0x0000, "+0"},
        {-0.0f, 0x8000, "-0"},
        {INFINITY, 0x7c00, "inf"},
        {-INFINITY, 0xfc00, "-inf"},
        {0.1f, 0x2e66, "0.1"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint16_t got = fr_f32_to_f16(c[i].x);
        CHECK(got == c[i].want, "f16(%s) = 0x%04x, want 0x%04x", c[i].what, got, c[i].want);
    }
    uint16_t n = fr_f32_to_f16(NAN);
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) && (n & 0x200), "f16(NaN) = 0x%04x", n);
    n = fr_f32_to_f16(-NAN);
    CHECK((n & 0xfc00) == 0xfc00 && (n & 0x3ff), "f16(-NaN) = 0x%04x keeps the sign", n);
    n = fr_f32_to_f16(bitsf(0x7f800001u)); /* signalling, payload only in low bits */
    CHECK(n == 0x7e00, "f16(sNaN 0x7f800001) = 0x%04x, want 0x7e00", n);
    CHECK(fr_f16_to_f32(0x7bff) == 65504.0f, "f16 max");
    CHECK(fr_f16_to_f32(0x0001) == 0x1p-24f, "f16 2^-24");
    CHECK(signbit(fr_f16_to_f32(0x8000)) && fr_f16_to_f32(0x8000) == 0.0f, "f16 -0");
}

static void check_bf16_cases(void) {
    struct {
        uint32_t xb;
        uint16_t want;
        const char *what;
    } c[] = {
        {0x3f800000u, 0x3f80, "1"},
        {0x3f808000u, 0x3f80, "1 + half ulp ties to even"},
        {0x3f818000u, 0x3f82, "1 + 3 half ulps ties to even"},
        {0x3f808001u, 0x3f81, "just above the tie"},
        {0x7f7f0000u, 0x7f7f, "max bf16"},
        {0x7f7f7fffu, 0x7f7f, "just below the overflow midpoint"},
        {0x7f7f8000u, 0x7f80, "overflow midpoint ties to inf (odd max)"},
        {0x7f7fffffu, 0x7f80, "FLT_MAX overflows"},
        {0xff7fffffu, 0xff80, "-FLT_MAX"},
        {0x00008000u, 0x0000, "subnormal tie to 0"},
        {0x00008001u, 0x0001, "just above subnormal tie"},
        {0x00018000u, 0x0002, "subnormal tie to even 2"},
        {0x007fffffu, 0x0080, "largest f32 subnormal rounds to smallest normal"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0"},
        {0x7f800000u, 0x7f80, "inf"},
        {0xff800000u, 0xff80, "-inf"},
        {0x7fffffffu, 0x7fff, "NaN with full payload stays NaN (no carry into inf)"},
        {0x7f800001u, 0x7fc0, "sNaN with low payload stays NaN, quieted"},
        {0xff800001u, 0xffc0, "-sNaN keeps the sign"},
        {0x7fc00000u, 0x7fc0, "qNaN"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint16_t got = fr_f32_to_bf16(bitsf(c[i].xb));
        CHECK(got == c[i].want, "bf16(%s) = 0x%04x, want 0x%04x", c[i].what, got, c[i].want);
    }
}

/* The array forms agree with the scalar ones (long enough to go parallel). */
static void check_arrays(void) {
    size_t n = 200003;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint16_t *h = malloc(n * sizeof *h);
    if (!x || !y || !h) {
        CHECK(0, "malloc");
        free(x), free(y), free(h);
        return;
    }
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = bitsf((uint32_t)(s >> 32));
    }
    int bad = 0;
    fr_f32_to_f16_n(x, h, n);
    for (size_t i = 0; i < n; i++) bad += h[i] != fr_f32_to_f16(x[i]);
    fr_f16_to_f32_n(h, y, n);
    for (size_t i = 0; i < n; i++) bad += fbits(y[i]) != fbits(fr_f16_to_f32(h[i]));
    fr_f32_to_bf16_n(x, h, n);
    for (size_t i = 0; i < n; i++) bad += h[i] != fr_f32_to_bf16(x[i]);
    fr_bf16_to_f32_n(h, y, n);
    for (size_t i = 0; i < n; i++) bad += fbits(y[i]) != fbits(fr_bf16_to_f32(h[i]));
    CHECK(bad == 0, "array conversions differ from scalar in %d places", bad);
    free(x), free(y), free(h);
}

/* The bf16 array form on every top half (sign, exponent, the 7 bits kept:
 * each class of value, subnormals and NaNs among them) with low halves at
 * the rounding's edges (0, 1, just below, at and above the tie, all ones)
 * and one drawn, in one array: where the CPU has AVX512_BF16 its groups go
 * through VCVTNEPS2BF16, which reads subnormals as zero, and must give the
 * scalar code's bits all the same. */
static void check_bf16_array_classes(void) {
    const uint32_t lows[6] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff}; /* and a drawn one */
    const size_t n = 65536u * 7u;
    float *x = malloc(n * sizeof *x);
    uint16_t *h = malloc(n * sizeof *h);
    if (!x || !h) {
        CHECK(0, "malloc");
        free(x), free(h);
        return;
    }
    uint64_t s = 0x2545f4914f6cdd1dULL;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const uint32_t hi = (uint32_t)(i / 7),
                       lo = i % 7 == 6 ? (uint32_t)(s & 0xffff) : lows[i % 7];
        x[i] = bitsf(hi << 16 | lo);
    }
    fr_f32_to_bf16_n(x, h, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != fr_f32_to_bf16(x[i]);
    CHECK(bad == 0, "bf16 array conversion differs from scalar in %d of %zu places", bad, n);
    free(x), free(h);
}

int main(void) {
    build_table(&F16);
    build_table(&BF16);
    /* the table itself: increasing, and the known landmarks */
    int mono = 1;
    for (uint32_t p = 0; p < F16.inf_bits; p++) mono &= F16.val[p] < F16.val[p + 1];
    for (uint32_t p = 0; p < BF16.inf_bits; p++) mono &= BF16.val[p] < BF16.val[p + 1];
    CHECK(mono, "reference tables increase");
    CHECK(F16.val[0x7bff] == 65504.0 && F16.val[0x7c00] == 65536.0 && F16.val[1] == ldexp(1, -24),
          "f16 table landmarks");
    CHECK(BF16.val[0x7f80] == ldexp(1, 128) && BF16.val[1] == ldexp(1, -133), "bf16 landmarks");

    check_f16_cases();
    check_bf16_cases();
    check_all_patterns(&F16);
    check_all_patterns(&BF16);
    check_midpoints(&F16);
    check_midpoints(&BF16);
    check_arrays();
    check_bf16_array_classes();

    for (uint64_t i = 0; i < (1ull << 32); i += 97) {
        check_from_f32(&F16, (uint32_t)i);
        check_from_f32(&BF16, (uint32_t)i);
    }
    /* denser where f16 has values: (2^-25 .. 65520), both signs */
    for (uint32_t xb = 0x33000000u; xb <= 0x477ff000u; xb += 7) {
        check_from_f32(&F16, xb);
        check_from_f32(&F16, xb | 0x80000000u);
    }

    return check_done();
}
