/* cast.c — CAST between f32 and the 16-bit float formats, with the exact
 * round-to-nearest-even conversions of core/half.c. Mixed precision uses it
 * to store saved activations in half and bring them back for backward. */
#include <string.h>
#include "backend/cpu/kernels.h"
#include "core/half.h"

// x and y have the same shape; dtypes f32, f16 or bf16
int fr_k_cast(fr_kernel_call *c) {
    fr_dtype from = c->in[0].dtype, to = c->out[0].dtype;
    size_t n = (size_t)fr_shape_numel(&c->in[0].shape);
    const void *x = c->in[0].data;
    void *y = c->out[0].data;
    if (from == to) {
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
        return fr_fail(c->ctx, FR_ERR_ARG, "cast from %s to %s is not supported", fr_dtype_name(from),
                       fr_dtype_name(to));
    }
    return 0;
}
