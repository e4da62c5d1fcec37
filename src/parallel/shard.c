/* shard.c — ZeRO's shard rule (see shard.h). */
#include "parallel/shard.h"

size_t fr_shard_chunk(size_t total, int n) {
    return n > 0 ? (total + (size_t)n - 1) / (size_t)n : total;
}

void fr_shard_range(size_t total, int n, int r, size_t *lo, size_t *hi) {
    size_t c = fr_shard_chunk(total, n), a = (size_t)r * c, b = a + c;
    *lo = a < total ? a : total;
    *hi = b < total ? b : total;
}

size_t fr_shard_bytes(size_t x, size_t total, int n) {
    if (!total) return 0;
    size_t c = fr_shard_chunk(total, n);
    return (x / total) * c + ((x % total) * c + total - 1) / total;
}
