/* flat.h — the flat layout every block of per-parameter tensors takes (the
 * model's parameters, the optimizer's gradients and state, the
 * data-parallel flat vector that ZeRO shards): tensors end to end in
 * reverse parameter order (the order backward makes gradients, DDP's
 * bucket order), each at the next multiple of its element's size, so a
 * block of f32 tensors has no padding and its elements are the flat
 * vector's. */
#ifndef FR_FLAT_H
#define FR_FLAT_H

#include <stddef.h>

/* Places `bytes` aligned to `align` at *end (advanced); returns its offset. */
static inline size_t fr_flat_place(size_t *end, size_t bytes, size_t align) {
    size_t at = (*end + align - 1) / align * align;
    *end = at + bytes;
    return at;
}

#endif
