/* fuzz_data.h — what fuzz_idx.c and fuzz_npy.c share: one input through a
 * whole-buffer checker, then through the model checks fr_dataset_check makes
 * (fr_*_check_for), as images and as labels, against an image model and a
 * flat regression model whose class count and width come from the input's
 * last byte. A refusal is FR_ERR_FORMAT, FR_ERR_SHAPE or FR_ERR_NOMEM;
 * anything else, a crash or a leak aborts. */
#ifndef FR_FUZZ_DATA_H
#define FR_FUZZ_DATA_H

#include "data/dataset.h"
#include "fuzz_common.h"

typedef fr_status (*fuzz_checker_for)(fr_ctx *ctx, const char *name, const void *buf, size_t len,
                                      const fr_data_spec *spec, fr_data_role role);

static inline int fuzz_data(fuzz_checker check, fuzz_checker_for check_for, const char *name,
                            const uint8_t *data, size_t size) {
    fuzz_check_buffer(check, name, data, size);
    int k = size ? 1 + data[size - 1] % 16 : 10;
    const fr_data_spec specs[2] = {{1, 28, 28, k, 0}, {784, 1, 1, 0, k}};
    for (int s = 0; s < 2; s++)
        for (int role = FR_ROLE_IMAGES; role <= FR_ROLE_LABELS; role++) {
            fr_ctx *ctx = fr_ctx_new();
            if (!ctx) return 0;
            fr_status st = check_for(ctx, name, data, size, &specs[s], (fr_data_role)role);
            if (st == FR_ERR_SHAPE) st = FR_ERR_FORMAT;
            fuzz_expect_status(st);
            fuzz_end(ctx);
        }
    return 0;
}

#endif
