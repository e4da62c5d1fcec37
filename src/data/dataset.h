/* dataset.h — datasets read lazily from disk: IDX (MNIST, Fashion-MNIST;
 * raw or .gz) and NumPy .npy. Samples are read on demand with pread from the
 * file (a .gz is inflated once into an unlinked temporary file, stopped at
 * the size its header implies), so memory does not grow with the dataset.
 * Images come out as f32 in [0, 1], NCHW. The second file holds integer
 * class labels (a cross-entropy model) or f32 regression targets (an MSE
 * model); which one is decided by its dtype. f64 (numpy's default float) is
 * rounded to f32 as each sample is read, with a note on stderr at open.
 *
 * A data directory (`frugal train --data DIR`) holds, for each split
 * (`train` and `t10k`), one images file and one labels or targets file:
 *
 *   images   {split}-images-idx3-ubyte[.gz]  IDX u8 (n, h, w)  (Fashion-MNIST's names)
 *            {split}-images.npy              u8, f32 or f64 (n, d), (n, h, w) or (n, c, h, w)
 *   classes  {split}-labels-idx1-ubyte[.gz]  IDX u8 (n)
 *            {split}-labels.npy              u8, i32 or i64 (n), each in [0, classes)
 *   targets  {split}-targets.npy             f32 or f64 (n, outputs), or (n,) for one output
 *
 * Any images file goes with any labels file; two candidates for the same
 * role are refused. A cross-entropy model needs labels, an MSE (`loss mse`)
 * model targets; float labels are targets, refused for cross-entropy as
 * torch's cross_entropy refuses float class indices. u8 pixels are scaled
 * to [0, 1]; f32 pixels and targets are used as they are. Samples must match the model's input exactly ((c, h, w);
 * a flat input of d values takes any sample of d values). */
#ifndef FR_DATASET_H
#define FR_DATASET_H

#include <stdio.h>
#include "core/ctx.h"

typedef struct fr_dataset fr_dataset;

/* images: IDX3 u8 (n, h, w) or npy u8/f32/f64 (n, h, w) / (n, c, h, w) / (n, d);
 * labels: IDX1 u8 (n) or npy integer (n), or npy f32/f64 targets (n) / (n, k).
 * Checks magic (a *.npy that is neither format gets a .npy message, any
 * other an IDX one), sizes against the file length, labels in [0, 256),
 * targets finite (in f32 too) and n(images) == n(labels). Outside files are opened with
 * fr_open_regular: a FIFO or a directory is refused, never waited on. */
fr_dataset *fr_dataset_open(fr_ctx *ctx, const char *images, const char *labels);
/* A directory laid out as above; the error names every file it looked for. */
fr_dataset *fr_dataset_open_dir(fr_ctx *ctx, const char *dir, const char *split);
/* A split's files: images and labels when given (both), else dir's names
 * for split. */
fr_dataset *fr_dataset_open_split(fr_ctx *ctx, const char *dir, const char *split,
                                  const char *images, const char *labels);
void fr_dataset_close(fr_dataset *ds);

int64_t fr_dataset_len(const fr_dataset *ds);
void fr_dataset_sample_shape(const fr_dataset *ds, int *c, int *h, int *w);
int fr_dataset_classes(const fr_dataset *ds); /* max label + 1 seen while validating (0: targets) */
int fr_dataset_outputs(const fr_dataset *ds); /* f32 targets a sample; 0: class labels */
fr_dtype fr_dataset_dtype(const fr_dataset *ds); /* of the images: FR_U8 or FR_F32 */
const char *fr_dataset_images_path(const fr_dataset *ds);
const char *fr_dataset_labels_path(const fr_dataset *ds);

/* What a model asks of its data: the per-sample input (c, h, w) (h = w = 1
 * for a flat input of c values), and classes > 0 (cross-entropy: labels in
 * [0, classes)) or outputs > 0 (MSE: f32 targets of that width). */
typedef struct fr_data_spec {
    int c, h, w;
    int classes, outputs;
} fr_data_spec;

/* The dataset against spec, before any step: sample shape and dtype, labels
 * or targets as the loss needs them, every label in range. The message
 * names the file and, for a label, its index in the file. FR_ERR_SHAPE. */
fr_status fr_dataset_check(fr_ctx *ctx, const fr_dataset *ds, const fr_data_spec *spec);

/* Read samples idx[0..n) into x (n*c*h*w floats, or NULL), and the labels
 * into y (n, class datasets) or the targets into t (n * outputs floats,
 * regression datasets); the other of y and t is ignored and either may be
 * NULL. */
fr_status fr_dataset_read(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y,
                          float *t);
/* The same, for a background thread: the message goes to err, not ctx. */
fr_status fr_dataset_read_r(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y,
                            float *t, char *err, size_t errlen);

/* Parsers on memory, for the fuzzers and the corruption tests: validate a
 * whole IDX or .npy image (already inflated) and report the first fault. */
fr_status fr_idx_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);
fr_status fr_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);
/* The same, then, when spec is not NULL, the checks fr_dataset_check makes
 * on a file in that role (FR_ERR_SHAPE when it does not fit the spec). */
typedef enum fr_data_role { FR_ROLE_IMAGES, FR_ROLE_LABELS } fr_data_role;
fr_status fr_idx_check_for(fr_ctx *ctx, const char *name, const void *buf, size_t len,
                           const fr_data_spec *spec, fr_data_role role);
fr_status fr_npy_check_for(fr_ctx *ctx, const char *name, const void *buf, size_t len,
                           const fr_data_spec *spec, fr_data_role role);

#endif
