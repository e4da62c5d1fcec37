/* buffers.h — data parallel: rank 0's buffers (BatchNorm's running
 * statistics and batch count) to every rank, as PyTorch's DDP does with
 * broadcast_buffers (its default). Each rank updates them in forward from
 * its own slice, so they drift apart; DDP broadcasts rank 0's before the
 * first forward of an optimizer step (under no_sync the later micro-batches'
 * forwards skip it). The step calls this at its end instead: nothing
 * touches the buffers between two steps, so every forward starts from the
 * buffers DDP's would, and between steps (evaluation, the checkpoint, the
 * next step) every rank holds rank 0's. Buffers are whole on every rank at
 * any ZeRO stage (they have no gradient, so no place in the shards' flat
 * vector). */
#ifndef FR_DIST_BUFFERS_H
#define FR_DIST_BUFFERS_H

#include "parallel/comm.h"
#include "model/model.h"

/* Every non-trainable parameter of m gets rank 0's bytes (one process: nothing). */
fr_status fr_buffers_bcast(fr_ctx *ctx, const fr_comm *c, fr_model *m);

#endif
