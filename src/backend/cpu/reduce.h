/* reduce.h — small helpers shared by the CPU kernels: the accumulate bit of a
 * call and deterministic reductions (a fixed summation order, whatever the
 * thread count). Reductions tied to one op (a loss's block sums, a norm's
 * squared deviations) stay in that op's file. */
#ifndef FR_REDUCE_H
#define FR_REDUCE_H

#include <stdint.h>
#include "backend/cpu/kernels.h"

/* 1 if out[i] of the call is added into, 0 if it is overwritten. */
static inline int acc_bit(const fr_kernel_call *c, int i) {
    return (int)((c->accumulate >> i) & 1u);
}

/* Sum of n floats in double, eight chains in a fixed order (not latency bound). */
static inline double sum_f64(const float *p, int64_t n) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += p[i + j];
    for (; i < n; i++) a[0] += p[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Sum of n floats in float, eight chains in a fixed order whatever the
 * vector width (so the same bits in every clone). */
static inline float sum_f32(const float *p, int64_t n) {
    float a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += p[i + j];
    for (; i < n; i++) a[0] += p[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* The largest of init and p[0 .. n): sixteen running maxima, folded in
 * halves (GCC's `omp simd reduction(max)` folds its vector through memory
 * one lane at a time, a chain of 16 dependent steps a call). A maximum does
 * not depend on the order in which it is taken, but for the sign of a zero
 * maximum, which no caller's result sees (x - 0 and x + 0 are x, e^0 is 1);
 * a NaN in p is passed over (p > m is false for it), as the serial loop
 * passes it, and a NaN init stays. */
static inline float max_f32(const float *p, int64_t n, float init) {
    float a[16];
    for (int j = 0; j < 16; j++) a[j] = init;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) a[j] = p[i + j] > a[j] ? p[i + j] : a[j];
    for (; i < n; i++) a[0] = p[i] > a[0] ? p[i] : a[0];
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) a[j] = a[j + w] > a[j] ? a[j + w] : a[j];
    return a[0];
}

/* The width of the spans a sum down the rows of a (rows, cols) matrix cuts
 * its columns into: one span a thread at least, a multiple of 16, at most
 * `most` (the accumulators a thread holds). A span is a contiguous stretch
 * of every row, so the rows stream through the cache (blocks of 64 columns,
 * a few hundred bytes of rows KiB apart, missed the prefetchers). Each
 * column is still summed over the rows in order, so its bits depend on
 * neither the width nor the thread count. */
static inline int64_t fr_col_span(int64_t cols, int threads, int64_t most) {
    const int64_t t = threads > 0 ? threads : 1;
    int64_t w = ((cols + t - 1) / t + 15) / 16 * 16;
    return w < 16 ? 16 : w < most ? w : most;
}

#endif
