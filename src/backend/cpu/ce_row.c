/* ce_row.c — the arithmetic of one row of softmax cross-entropy (ce_row.h),
 * in one translation unit: the cloned functions are static here, their
 * resolvers defined once, and plain functions call them (clang gave the
 * resolvers of static clones in a shared header external linkage, so the
 * copies in loss.c and linear_ce.c clashed at link time; and GCC and clang
 * disagree on clones declared extern). One call a row: nothing next to its
 * V exps. */
#include "backend/cpu/ce_row.h"
#include <math.h>
#include "backend/cpu/exp_poly.h"

/* Row statistics of logits z (C of them): *zmax = max_j z[j] and the
 * returned log sum_j e^(z[j] - zmax) (max-shifted, so logits of 1000 do not
 * overflow), the logsumexp being their sum. Each e^ is fr_exp_poly's (one
 * float ulp), summed in double over eight chains in a fixed order: the same
 * bits in every clone. */
FR_V3_CLONES static double row_lse(const float *z, int64_t C, float *zmax) {
    float m = z[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < C; j++) m = z[j] > m ? z[j] : m;
    double a[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
        float e[8];
        for (int k = 0; k < 8; k++) e[k] = fr_exp_poly(z[j + k] - m);
        for (int k = 0; k < 8; k++) a[k] += e[k];
    }
    for (; j < C; j++) a[0] += fr_exp_poly(z[j] - m);
    *zmax = m;
    return log(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
}

/* dz[j] = k (softmax(z)_j - [j == y]) for one row (or added into dz), the
 * softmax as e^((z[j] - zmax) - shift) with shift = log sum e^(z - zmax). */
FR_V3_CLONES static void row_dlogits(const float *z, float *dz, int64_t C, float zmax, float shift,
                                     float k, int64_t y, int acc) {
    if (acc) {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) dz[j] += k * fr_exp_poly((z[j] - zmax) - shift);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < C; j++) dz[j] = k * fr_exp_poly((z[j] - zmax) - shift);
    }
    if (y >= 0 && y < C) dz[y] -= k; /* (a span of a row may not hold the label) */
}

/* The first index of the row's maximum, as a left-to-right strict > scan
 * finds it: the max first (NaNs never win a >), then its first position; 0
 * for a row starting with NaN (nothing is > it) and when none equals the max. */
FR_V3_CLONES static int64_t row_argmax(const float *z, int64_t C) {
    float m = z[0];
    if (m != m) return 0; /* the scan's first element never loses to a > */
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < C; j++) m = z[j] > m ? z[j] : m;
    for (int64_t j = 0; j < C; j++)
        if (z[j] == m) return j;
    return 0;
}

double fr_ce_row_lse(const float *z, int64_t C, float *zmax) { return row_lse(z, C, zmax); }

void fr_ce_row_dlogits(const float *z, float *dz, int64_t C, float zmax, float shift, float k,
                       int64_t y, int acc) {
    row_dlogits(z, dz, C, zmax, shift, k, y, acc);
}

int64_t fr_ce_row_argmax(const float *z, int64_t C) { return row_argmax(z, C); }
