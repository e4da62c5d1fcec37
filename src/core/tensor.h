/* tensor.h — shapes, dtypes and the plain tensor view kernels work on.
 * A tensor here owns nothing: data points into an arena or a persistent
 * buffer that somebody else allocated through the accounting allocator. */
#ifndef FR_TENSOR_H
#define FR_TENSOR_H

#include <stdint.h>
#include "frugal.h"

#define FR_MAX_DIMS 4

typedef struct fr_shape {
    int ndim;
    int64_t d[FR_MAX_DIMS];
} fr_shape;

typedef struct fr_tensor {
    fr_dtype dtype;
    fr_shape shape;
    void *data; /* host memory; NULL: absent (an optional input, or an output not
                   wanted), or on a device */
    void *buf;  /* on a device: the backend's buffer (an OpenCL cl_mem) holding it */
    size_t off; /* and its byte offset there */
} fr_tensor;

fr_shape fr_shape1(int64_t a);
fr_shape fr_shape2(int64_t a, int64_t b);
fr_shape fr_shape3(int64_t a, int64_t b, int64_t c);
fr_shape fr_shape4(int64_t a, int64_t b, int64_t c, int64_t d);
int64_t fr_shape_numel(const fr_shape *s);
int fr_shape_eq(const fr_shape *a, const fr_shape *b);
/* "(32, 1, 28, 28)" into buf */
const char *fr_shape_str(const fr_shape *s, char *buf, int len);
size_t fr_tensor_bytes(const fr_tensor *t);

static inline float *fr_f32(const fr_tensor *t) { return (float *)t->data; }

#endif
