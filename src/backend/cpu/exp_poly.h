/* exp_poly.h — the exponential the CPU kernels vectorize: the softmaxes of
 * attention and cross-entropy call it per element inside loops that the
 * compiler turns into vector code (libm's expf is a call per element). Its
 * bits are the same in every clone (plain IEEE operations, no contraction
 * in C11 mode). */
#ifndef FR_EXP_POLY_H
#define FR_EXP_POLY_H

#include <math.h>
#include <stdint.h>

/* e^x as Cephes' expf computes it: Cody-Waite reduction x = n ln2 + g with
 * |g| <= ln2/2, a degree-5 minimax polynomial for e^g, scaled by 2^n
 * through the exponent bits. Within 2 ulp of exp over [-87.3, 88]
 * (test_attention checks it against double exp); 0 below -87.3, where
 * e^x < 1.2e-38 (and for -inf); inf above 88 (where float's range ends a
 * little later, at 88.72); NaN passes through. */
static inline float fr_exp_poly(float x) {
    /* NaN takes -87.3 here, so n stays an integer (no UB); NaN is returned below */
    float c = x >= -87.3f ? x : -87.3f;
    c = c <= 88.0f ? c : 88.0f;
    const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(c log2 e) */
    const float g = (c - n * 0.693359375f) + n * 2.12194440e-4f;            /* c - n ln2 */
    const float p = ((((((1.9875691500e-4f * g + 1.3981999507e-3f) * g + 8.3334519073e-3f) * g +
                        4.1665795894e-2f) *
                           g +
                       1.6666665459e-1f) *
                          g +
                      5.0000001201e-1f) *
                     (g * g)) +
                    g + 1.0f;
    union {
        int32_t i;
        float f;
    } b = {((int32_t)n + 127) * (1 << 23)};
    return x < -87.3f ? 0.0f : x > 88.0f ? (float)INFINITY : x == x ? p * b.f : x;
}

#endif
