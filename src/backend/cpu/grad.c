/* grad.c — whole-gradient passes for the step's bookkeeping: the loss
 * scaler's unscale with its overflow check, and clipping's sum of squares and
 * rescale. A gradient is f32, or f16/bf16 (pure half precision); 16-bit ones
 * are widened, worked in f32 and rounded back a chunk at a time, as PyTorch's
 * in-place ops on half tensors do. */
#include <float.h>
#include <math.h>
#include "backend/cpu/kernels.h"
#include "core/half.h"

#define GRAD_PAR_MIN 65536 /* below this a thread team costs more than it saves */
#define GRAD_CHUNK 2048    /* 16-bit chunks widened on the stack; also the sum's blocks */

/* g = g * f over cnt f32 values; whether any value read was inf or NaN. */
static int mul_check(float *restrict g, size_t cnt, float f) {
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (size_t i = 0; i < cnt; i++) {
        const float x = g[i];
        bad |= !(fabsf(x) <= FLT_MAX);
        g[i] = x * f;
    }
    return bad;
}

int fr_k_grad_unscale(void *g, fr_dtype dt, size_t n, float f) {
    const int64_t chunks = (int64_t)((n + GRAD_CHUNK - 1) / GRAD_CHUNK);
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n >= GRAD_PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        const size_t lo = (size_t)k * GRAD_CHUNK, cnt = n - lo < GRAD_CHUNK ? n - lo : GRAD_CHUNK;
        if (dt == FR_F32) {
            bad |= mul_check((float *)g + lo, cnt, f);
        } else {
            float t[GRAD_CHUNK];
            fr_half_to_f32_n_seq((uint16_t *)g + lo, t, cnt, dt == FR_F16);
            bad |= mul_check(t, cnt, f);
            fr_f32_to_half_n_seq(t, (uint16_t *)g + lo, cnt, dt == FR_F16);
        }
    }
    return bad;
}

/* Blocks of GRAD_CHUNK summed in double, each by one thread in index order,
 * then the block sums in block order: the bits do not depend on the threads. */
double fr_k_grad_sumsq(const void *g, fr_dtype dt, size_t n) {
    enum { GROUP = 256 }; /* block sums on the stack, a group at a time */
    const size_t blocks = (n + GRAD_CHUNK - 1) / GRAD_CHUNK;
    double total = 0;
    for (size_t b0 = 0; b0 < blocks; b0 += GROUP) {
        const int64_t nb = (int64_t)(blocks - b0 < GROUP ? blocks - b0 : GROUP);
        double part[GROUP];
#pragma omp parallel for schedule(static) if (n >= GRAD_PAR_MIN)
        for (int64_t j = 0; j < nb; j++) {
            const size_t lo = (b0 + (size_t)j) * GRAD_CHUNK;
            const size_t cnt = n - lo < GRAD_CHUNK ? n - lo : GRAD_CHUNK;
            float t[GRAD_CHUNK];
            const float *x = (const float *)g + lo;
            if (dt != FR_F32) {
                fr_half_to_f32_n_seq((const uint16_t *)g + lo, t, cnt, dt == FR_F16);
                x = t;
            }
            double s = 0;
            for (size_t i = 0; i < cnt; i++) s += (double)x[i] * x[i];
            part[j] = s;
        }
        for (int64_t j = 0; j < nb; j++) total += part[j];
    }
    return total;
}

void fr_k_grad_scale(void *g, fr_dtype dt, size_t n, float f) {
    const int64_t chunks = (int64_t)((n + GRAD_CHUNK - 1) / GRAD_CHUNK);
#pragma omp parallel for schedule(static) if (n >= GRAD_PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        const size_t lo = (size_t)k * GRAD_CHUNK, cnt = n - lo < GRAD_CHUNK ? n - lo : GRAD_CHUNK;
        if (dt == FR_F32) {
            float *x = (float *)g + lo;
#pragma omp simd
            for (size_t i = 0; i < cnt; i++) x[i] = x[i] * f;
        } else {
            float t[GRAD_CHUNK];
            fr_half_to_f32_n_seq((uint16_t *)g + lo, t, cnt, dt == FR_F16);
#pragma omp simd
            for (size_t i = 0; i < cnt; i++) t[i] = t[i] * f;
            fr_f32_to_half_n_seq(t, (uint16_t *)g + lo, cnt, dt == FR_F16);
        }
    }
}
