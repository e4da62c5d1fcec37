/* tensor.c — shape helpers. */
#include <stdio.h>
#include "core/tensor.h"

fr_shape fr_shape1(int64_t a) { return (fr_shape){1, {a, 0, 0, 0}}; }
fr_shape fr_shape2(int64_t a, int64_t b) { return (fr_shape){2, {a, b, 0, 0}}; }
fr_shape fr_shape3(int64_t a, int64_t b, int64_t c) { return (fr_shape){3, {a, b, c, 0}}; }
fr_shape fr_shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return (fr_shape){4, {a, b, c, d}};
}

int64_t fr_shape_numel(const fr_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

int fr_shape_eq(const fr_shape *a, const fr_shape *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->d[i] != b->d[i]) return 0;
    return 1;
}

const char *fr_shape_str(const fr_shape *s, char *buf, int len) {
    int k = snprintf(buf, len, "(");
    for (int i = 0; i < s->ndim && k < len; i++)
        k += snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)s->d[i]);
    if (k < len) snprintf(buf + k, len - k, ")");
    return buf;
}

size_t fr_tensor_bytes(const fr_tensor *t) {
    return (size_t)fr_shape_numel(&t->shape) * fr_dtype_size(t->dtype);
}
