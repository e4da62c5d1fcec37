/* cast.c — CAST between f32 and the 16-bit float formats, with the exact
 * round-to-nearest-even conversions of core/half.c. Mixed precision uses it
 * to store saved activations in half and bring them back for backward. */
#include <string.h>
#include "backend/cpu/kernels.h"
#include "core/half.h"

// y += x narrowed: y = round(widen(y) + x), x f32, y f16 or bf16, a chunk
// at a time on the stack (a 16-bit gradient accumulating micro-batches).
static void narrow_add(const float *x, uint16_t *y, size_t n, int is_f16) {
    enum { CHUNK = 2048 };
    const int64_t chunks = (int64_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t k = 0; k < chunks; k++) {
        float t[CHUNK];
        const size_t lo = (size_t)k * CHUNK, cnt = n - lo < CHUNK ? n - lo : CHUNK;
        fr_half_to_f32_n_seq(y + lo, t, cnt, is_f16);
        for (size_t i = 0; i < cnt; i++) t[i] += x[lo + i];
        fr_f32_to_half_n_seq(t, y + lo, cnt, is_f16);
    }
}

// y = widen(narrow(x)), f32 to f32 rounded through f16 or bf16, a chunk at
// a time on the stack (the mixed modes' weights as a 16-bit GEMM reads them).
static void round_half(const float *x, float *y, size_t n, int is_f16) {
    enum { CHUNK = 2048 };
    const int64_t chunks = (int64_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t k = 0; k < chunks; k++) {
        uint16_t t[CHUNK];
        const size_t lo = (size_t)k * CHUNK, cnt = n - lo < CHUNK ? n - lo : CHUNK;
        fr_f32_to_half_n_seq(x + lo, t, cnt, is_f16);
        fr_half_to_f32_n_seq(t, y + lo, cnt, is_f16);
    }
}

// x and y have the same shape; dtypes f32, f16 or bf16. With the accumulate
// bit, f32 -> f16/bf16 adds into y (round(y + x)).
int fr_k_cast(fr_kernel_call *c) {
    fr_dtype from = c->in[0].dtype, to = c->out[0].dtype;
    size_t n = (size_t)fr_shape_numel(&c->in[0].shape);
    const void *x = c->in[0].data;
    void *y = c->out[0].data;
    if (c->accumulate & 1u) {
        if (from != FR_F32 || (to != FR_F16 && to != FR_BF16))
            return fr_fail(c->ctx, FR_ERR_ARG, "cast: adding %s into %s is not supported",
                           fr_dtype_name(from), fr_dtype_name(to));
        narrow_add(x, y, n, to == FR_F16);
        return 0;
    }
    fr_dtype round = c->node ? c->node->attr.round : FR_F32;
    if (from == FR_F32 && to == FR_F32 && (round == FR_F16 || round == FR_BF16)) {
        round_half(x, y, n, round == FR_F16);
    } else if (from == to) {
        memcpy(y, x, n * fr_dtype_size(from));
    } else if (from == FR_F32 && to == FR_F16) {
        fr_f32_to_f16_n(x, y, n);
    } else if (from == FR_F32 && to == FR_BF16) {
        fr_f32_to_bf16_n(x, y, n);
    } else if (from == FR_F16 && to == FR_F32) {
        fr_f16_to_f32_n(x, y, n);
    } else if (from == FR_BF16 && to == FR_F32) {
        fr_bf16_to_f32_n(x, y, n);
    } else {
        return fr_fail(c->ctx, FR_ERR_ARG, "cast from %s to %s is not supported",
                       fr_dtype_name(from), fr_dtype_name(to));
    }
    return 0;
}
