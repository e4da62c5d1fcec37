/* shard.h — ZeRO's shard rule, the one definition that the run (parallel/'s
 * buckets, weight shards and collectives, through which train/zero.c
 * shards) and the prediction (report/estimate.c) share. The trainable
 * gradients, laid end to end in bucket order (parallel/buckets.h:
 * parameters in reverse order), form one flat vector of `total` f32
 * elements; on n ranks rank r owns the elements [r*c, min((r+1)*c,
 * total)), c = ceil(total / n): every rank but the last holds c elements,
 * the last what is left (possibly none). A parameter may be split between
 * ranks; its optimizer state, its sharded gradient and its share of the
 * update are element ranges of it. */
#ifndef FR_SHARD_H
#define FR_SHARD_H

#include <stddef.h>

/* c = ceil(total / n): the largest shard (rank 0's). */
size_t fr_shard_chunk(size_t total, int n);
/* Rank r's elements [*lo, *hi) of a flat vector of total on n ranks. */
void fr_shard_range(size_t total, int n, int r, size_t *lo, size_t *hi);
/* Bytes of the largest shard of x bytes spread over `total` elements:
 * x / total * c, rounded up (x need not be a multiple of total). */
size_t fr_shard_bytes(size_t x, size_t total, int n);

#endif
