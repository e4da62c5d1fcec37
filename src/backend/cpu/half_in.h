/* half_in.h — for kernels that read a 16-bit input themselves (see
 * kernels.h): a slice of a tensor as f32 values, the tensor's own storage
 * when it is f32, else widened exactly into the caller's buffer (the serial
 * converters: callers are already inside their parallel loops); and for
 * kernels that write a 16-bit output, the converse. */
#ifndef FR_HALF_IN_H
#define FR_HALF_IN_H

#include "backend/cpu/kernels.h"
#include "core/half.h"

/* values [off, off + n) of t as f32 (buf: n floats, used only for 16 bits) */
static inline const float *in_f32(const fr_tensor *t, int64_t off, int64_t n, float *buf) {
    if (t->dtype == FR_F32) return (const float *)t->data + off;
    const uint16_t *h = (const uint16_t *)t->data + off;
    if (t->dtype == FR_F16) fr_f16_to_f32_n_seq(h, buf, (size_t)n);
    else fr_bf16_to_f32_n_seq(h, buf, (size_t)n);
    return buf;
}

/* the f32 values src[0, n) written to t at [off, off + n): stored as they are
 * when t is f32, else rounded to nearest even (for kernels that write a
 * 16-bit output themselves) */
static inline void out_store(const fr_tensor *t, int64_t off, const float *src, int64_t n) {
    if (t->dtype == FR_F32) {
        float *y = (float *)t->data + off;
        if (y != src)
            for (int64_t i = 0; i < n; i++) y[i] = src[i];
        return;
    }
    uint16_t *h = (uint16_t *)t->data + off;
    if (t->dtype == FR_F16) fr_f32_to_f16_n_seq(src, h, (size_t)n);
    else fr_f32_to_bf16_n_seq(src, h, (size_t)n);
}

#endif
