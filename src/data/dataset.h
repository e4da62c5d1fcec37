/* dataset.h — datasets read lazily from disk: IDX (MNIST, Fashion-MNIST;
 * raw or .gz) and NumPy .npy. Samples are read on demand with pread from the
 * file (a .gz is inflated once into an unlinked temporary file), so memory
 * does not grow with the dataset. Images come out as f32 in [0, 1], NCHW. */
#ifndef FR_DATASET_H
#define FR_DATASET_H

#include <stdio.h>
#include "core/ctx.h"

typedef struct fr_dataset fr_dataset;

/* images: IDX3 u8 (n, h, w) or npy u8/f32 (n, h, w) / (n, c, h, w) / (n, d);
 * labels: IDX1 u8 (n) or npy integer (n). Checks magic, sizes against the
 * file length, label range [0, classes) and n(images) == n(labels). */
fr_dataset *fr_dataset_open(fr_ctx *ctx, const char *images, const char *labels);
/* A directory with MNIST-style names: split "train" or "t10k"; finds
 * {split}-images-idx3-ubyte[.gz] and {split}-labels-idx1-ubyte[.gz]. */
fr_dataset *fr_dataset_open_dir(fr_ctx *ctx, const char *dir, const char *split);
/* A split's files: images and labels when given (both), else dir's
 * MNIST-style names for split. */
fr_dataset *fr_dataset_open_split(fr_ctx *ctx, const char *dir, const char *split,
                                  const char *images, const char *labels);
void fr_dataset_close(fr_dataset *ds);

int64_t fr_dataset_len(const fr_dataset *ds);
void fr_dataset_sample_shape(const fr_dataset *ds, int *c, int *h, int *w);
int fr_dataset_classes(const fr_dataset *ds); /* max label + 1 seen while validating */
/* Read samples idx[0..n) into x (n*c*h*w floats) and y (n labels). */
fr_status fr_dataset_read(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y);
/* The same, for a background thread: the message goes to err, not ctx. */
fr_status fr_dataset_read_r(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y,
                            char *err, size_t errlen);

/* Parsers on memory, for the fuzzers and the corruption tests: validate a
 * whole IDX or .npy image (already inflated) and report the first fault. */
fr_status fr_idx_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);
fr_status fr_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);

#endif
