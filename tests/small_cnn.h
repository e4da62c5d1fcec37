/* small_cnn.h — the small CNN the device and placement tests train:
 * 1x12x12 images (D = 144 values), conv2d 4 (3x3, padding 1), BatchNorm,
 * ReLU, max pool 2, linear 10. Usable with or without OpenCL. */
#ifndef FR_TEST_SMALL_CNN_H
#define FR_TEST_SMALL_CNN_H

#include "frugal.h"

static inline fr_model *small_cnn_new(fr_ctx *ctx) {
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
