/* half.c — f32 <-> f16 (IEEE binary16) and f32 <-> bf16 conversions by bit
 * manipulation alone (no _Float16, no FPU rounding modes): round to nearest,
 * ties to even; subnormals kept; values that round past the largest finite
 * value become infinity; a NaN stays a NaN of the same sign with its quiet
 * bit set and the top of its payload kept. It owns nothing else: where
 * 16-bit storage is used is the planner's and the kernels' business. */
#include "core/half.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* f32 fields: sign 1, exponent 8 (bias 127), mantissa 23.
 * f16 fields: sign 1, exponent 5 (bias 15),  mantissa 10.
 * Rebiasing an exponent from f16 to f32 adds 127 - 15 = 112. */
uint16_t fr_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) { /* inf or NaN */
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu); /* quiet, payload top */
    }
    /* 65520 = 0x477ff000 is the midpoint between the largest f16 (65504) and
     * 2^16, the next value were the exponent unbounded; it ties to the even
     * side, 2^16, which overflows. Everything at or above it is infinity. */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;

    if (ax < 0x38800000u) { /* below 2^-14: an f16 subnormal or zero */
        /* At or below 2^-25 (= 0x33000000, half the smallest subnormal; the
         * tie goes to the even 0) everything rounds to zero. */
        if (ax <= 0x33000000u) return sign;
        /* The value is mant * 2^(e - 150) with the implicit bit restored;
         * in units of the smallest subnormal 2^-24 that is mant >> (126 - e),
         * a shift of 14 (e = 112) to 24 (e = 102). */
        uint32_t e = ax >> 23;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++; /* may carry into 2^-14: right */
        return sign | (uint16_t)q;
    }

    /* Normal: rebias the exponent and drop 13 mantissa bits, rounding; a
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t h = (ax - 0x38000000u) >> 13; /* 0x38000000 = 112 << 23 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float fr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
    } else if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* m * 2^-24: normalise so the leading bit lands on bit 10 */
            uint32_t sh = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                sh++;
            }
            x = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return bits_f32(x);
}

/* bf16 is the top half of an f32: same exponent, 7 mantissa bits, so f32
 * subnormals round like any other value and the overflow to infinity comes
 * from the carry out of the largest exponent. */
uint16_t fr_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: never round it (it could become inf) */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float fr_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u; /* quiet a signalling NaN */
    return bits_f32(x);
}

#define FR_HALF_PAR_MIN 65536 /* below this a thread team costs more than it saves */

void fr_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= FR_HALF_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = fr_f32_to_f16(src[i]);
}

void fr_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= FR_HALF_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = fr_f16_to_f32(src[i]);
}

void fr_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= FR_HALF_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = fr_f32_to_bf16(src[i]);
}

void fr_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= FR_HALF_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = fr_bf16_to_f32(src[i]);
}
