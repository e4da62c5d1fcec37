/* cl_device.h — the start of the C tests that need an OpenCL device: a
 * context using device 0, or NULL, after printing the skip line, when there
 * is none (or no platform): main then returns 77, which CTest counts as
 * skipped. Include after check.h, in the FR_HAVE_OPENCL part of a test.
 * The small CNN the device tests train is small_cnn.h's. */
#ifndef FR_CL_DEVICE_H
#define FR_CL_DEVICE_H

#include <stdio.h>
#include "backend/opencl/backend.h"
#include "backend/opencl/runtime.h"
#include "frugal.h"
#include "small_cnn.h"

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

#endif
