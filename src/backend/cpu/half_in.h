/* half_in.h — for kernels that read a 16-bit input themselves (see
 * kernels.h): a slice of a tensor as f32 values, the tensor's own storage
 * when it is f32, else widened exactly into the caller's buffer (the serial
 * converters: callers are already inside their parallel loops); and for
 * kernels that write a 16-bit output, the converse. */
#ifndef FR_HALF_IN_H
#define FR_HALF_IN_H

#include "backend/cpu/kernels.h"
#include "core/half.h"

/* a bf16 value as f32 by its bits (h << 16): exact, for loops that read
 * bf16 directly (a signalling NaN stays one until arithmetic quiets it, as
 * widening first would have done) */
static inline float fr_bf16_bits(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

/* ReLU on a 16-bit value's bits (f16: of f16, else bf16): a negative value
 * (above -0, up to -inf) becomes +0, -0 stays, a NaN is quieted (as
 * rounding quiets it) */
static inline uint16_t fr_relu16(uint16_t h, int f16) {
    const uint16_t ninf = f16 ? 0xfc00u : 0xff80u, quiet = f16 ? 0x0200u : 0x0040u;
    const uint16_t mag = h & 0x7fffu;
    return h > 0x8000u && h <= ninf ? 0 : mag > (ninf & 0x7fffu) ? (uint16_t)(h | quiet) : h;
}

/* values [off, off + n) of t as f32 (buf: n floats, used only for 16 bits) */
static inline const float *in_f32(const fr_tensor *t, int64_t off, int64_t n, float *buf) {
    if (t->dtype == FR_F32) return (const float *)t->data + off;
    fr_half_to_f32_n_seq((const uint16_t *)t->data + off, buf, (size_t)n, t->dtype == FR_F16);
    return buf;
}

/* the f32 values src[0, n) rounded to nearest even into t (f16 or bf16) at
 * [off, off + n), for kernels that write a 16-bit output themselves */
static inline void out_store(const fr_tensor *t, int64_t off, const float *src, int64_t n) {
    fr_f32_to_half_n_seq(src, (uint16_t *)t->data + off, (size_t)n, t->dtype == FR_F16);
}

/* The f32 threshold below which ReLU before rounding to t's 16-bit format
 * (f16: FR_F16, else bf16) sets +0, so that round(v < lo ? 0 : v) is
 * fr_relu16(round(v)) bit for bit: a negative v rounds to -0, which
 * fr_relu16 keeps, exactly when it is at least minus half the format's
 * smallest subnormal (2^-25 for f16, 2^-134 for bf16; the tie rounds to
 * even, 0); below that it rounds to a negative value or -inf, which
 * fr_relu16 sets to +0. 0 for an f32 y (fr_k_relu's v < 0 ? 0 : v). */
static inline float fr_relu_lo(fr_dtype y) {
    return y == FR_F16 ? -0x1p-25f : y == FR_BF16 ? -0x1p-134f : 0.0f;
}

#endif
