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

#endif
