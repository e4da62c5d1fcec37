/* copy.c — COPY: y = x, or y += x under the accumulate bit. Used where a
 * gradient reaches a parameter through an add or a view. */
#include <string.h>
#include "backend/cpu/kernels.h"

// x and y have the same number of elements, f32
int fr_k_copy(fr_kernel_call *c) {
    const float *x = fr_f32(&c->in[0]);
    float *y = fr_f32(&c->out[0]);
    int64_t n = fr_shape_numel(&c->in[0].shape);
    if (!(c->accumulate & 1u)) {
        memcpy(y, x, (size_t)n * sizeof *y);
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
    return 0;
}
