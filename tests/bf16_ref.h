/* bf16_ref.h — the tests' own bf16 rounding, written from the format's
 * definition (the top 16 bits of an f32, rounded to nearest, ties to even)
 * and not from the code under test: a reference for kernels that take or
 * make bf16 values. NaN is not handled (the tests' values are finite). */
#ifndef FR_TEST_BF16_REF_H
#define FR_TEST_BF16_REF_H

#include <stdint.h>
#include <string.h>

/* f rounded to the nearest bf16 (ties to even): its 16 bits */
static inline uint16_t ref_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* the f32 value of bf16 bits h (exact) */
static inline float ref_bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
