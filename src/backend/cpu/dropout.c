/* dropout.c — inverted dropout, forward and backward. The keep decision for
 * element i is a pure function of (run seed, step, node salt, i) through the
 * counter-based generator in core/rng.h, so the mask is the same bits at any
 * thread count and can be recomputed rather than stored if a planner wants. */
#include <string.h>
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "core/rng.h"

#define DROP_PAR_MIN 32768

#define DROP_SPAN 8192

/* Elements i0 .. i0 + n of the forward: the keep decisions from the
 * stream's base (fr_rng_uniform_at: fr_rng_uniform's bits), cloned for
 * AVX2 and AVX-512, whose 64-bit lanes take the hash's products (the same
 * integer operations and an exact conversion: the same bits). */
FR_V3_CLONES static void drop_span(const float *x, float *y, uint8_t *mask, int64_t i0, int64_t n,
                                   uint64_t base, float p, float scale) {
    if (mask) {
#pragma omp simd
        for (int64_t i = i0; i < i0 + n; i++) {
            const int keep = fr_rng_uniform_at(base, (uint64_t)i) >= p;
            y[i] = keep ? x[i] * scale : 0.0f;
            mask[i] = (uint8_t)keep;
        }
    } else {
#pragma omp simd
        for (int64_t i = i0; i < i0 + n; i++)
            y[i] = fr_rng_uniform_at(base, (uint64_t)i) >= p ? x[i] * scale : 0.0f;
    }
}

/* The scale applied to kept elements: 1/(1-p); with p >= 1 nothing is kept. */
static float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

// x, y any shape (n elements), mask u8 (n) or absent
// training: keep_i = fr_rng_uniform(seed, (step << 32) | salt, i) >= p;
//           y_i = keep_i ? x_i / (1 - p) : 0; mask_i = keep_i
// eval: y = x (mask absent)
int fr_k_dropout(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->out[0].shape) != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "dropout: output has %lld elements, input %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)n);
    const float *x = fr_f32(&c->in[0]);
    float *y = fr_f32(&c->out[0]);
    uint8_t *mask = (uint8_t *)c->out[1].data;
    if (!a->training) {
        if (y != x) memmove(y, x, (size_t)n * sizeof(float));
        return FR_OK;
    }
    if (a->p < 0.0f || a->p > 1.0f)
        return fr_fail(c->ctx, FR_ERR_ARG, "dropout: p = %g is outside [0, 1]", (double)a->p);
    const float p = a->p, scale = keep_scale(p);
    const uint64_t base = fr_rng_base(c->seed, ((uint64_t)c->step << 32) | a->salt);
    const int64_t spans = (n + DROP_SPAN - 1) / DROP_SPAN;
#pragma omp parallel for schedule(static) if (n >= DROP_PAR_MIN)
    for (int64_t b = 0; b < spans; b++)
        drop_span(x, y, mask, b * DROP_SPAN,
                  n - b * DROP_SPAN < DROP_SPAN ? n - b * DROP_SPAN : DROP_SPAN, base, p, scale);
    return FR_OK;
}

// dy, dx any shape (n elements), mask u8 (n); dx_i = mask_i ? dy_i / (1 - p) : 0 (dx may alias dy)
// attr.p must be the forward's p. In eval mode (attr.training == 0) dx = dy.
int fr_k_dropout_bwd(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->out[0].shape) != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "dropout_bwd: dx has %lld elements, dy %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)n);
    const float *dy = fr_f32(&c->in[0]);
    const uint8_t *mask = (const uint8_t *)c->in[1].data;
    float *dx = fr_f32(&c->out[0]);
    if (!dx) return FR_OK;
    const int acc = acc_bit(c, 0);
    if (!mask) {
        if (a->training)
            return fr_fail(c->ctx, FR_ERR_ARG, "dropout_bwd: the mask is missing in training mode");
        /* eval dropout is the identity */
        if (acc) {
#pragma omp parallel for schedule(static) if (n >= DROP_PAR_MIN)
            for (int64_t i = 0; i < n; i++) dx[i] += dy[i];
        } else if (dx != dy) {
            memmove(dx, dy, (size_t)n * sizeof(float));
        }
        return FR_OK;
    }
    const float scale = keep_scale(a->p);
#pragma omp parallel for schedule(static) if (n >= DROP_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = mask[i] ? dy[i] * scale : 0.0f;
        dx[i] = acc ? dx[i] + g : g;
    }
    return FR_OK;
}
