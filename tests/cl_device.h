/* cl_device.h — the start of the C tests that need an OpenCL device: a
 * context using device 0, or NULL, after printing the skip line, when there
 * is none (or no platform): main then returns 77, which CTest counts as
 * skipped. Include after check.h, in the FR_HAVE_OPENCL part of a test.
 * Also the small CNN the device tests train: 1x12x12 images (D = 144
 * values), conv 4 3x3, BatchNorm, ReLU, max pool 2, 10 classes. */
#ifndef FR_CL_DEVICE_H
#define FR_CL_DEVICE_H

#include <stdio.h>
#include "backend/opencl/backend.h"
#include "backend/opencl/runtime.h"
#include "frugal.h"

static inline fr_ctx *cl_device_ctx(void) {
    fr_ctx *ctx = fr_ctx_new();
    int n = 0;
    if (!ctx || fr_cl_count(ctx, &n) != FR_OK || n < 1) {
        puts("skipped: no OpenCL device");
        fr_ctx_free(ctx);
        return NULL;
    }
    CHECK(fr_cl_use(ctx, 0) == FR_OK, "opening device 0: %s", fr_last_error(ctx));
    return ctx;
}

/* conv2d 4 (3x3, padding 1), BatchNorm, ReLU, max pool 2, linear 10 */
static inline fr_model *cl_small_cnn(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1, 12, 12);
    if (!m) return NULL;
    if (fr_model_conv2d(m, 4, 3, 1, 1, 1) || fr_model_batchnorm(m) || fr_model_relu(m) ||
        fr_model_maxpool2d(m, 2, 2) || fr_model_flatten(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

#endif
