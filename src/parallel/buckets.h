/* buckets.h — gradients laid out in buckets that are summed over the ranks
 * while backward still runs (PyTorch DDP's Reducer): parameters in reverse
 * order (backward makes the last layer's gradients first), a bucket closed
 * once it holds at least its cap (the first 1 MiB, the others 25 MiB;
 * a parameter is never split). The buckets end to end are the optimizer's
 * flat gradient layout (optim/optim.h, fr_flat_place: the same reverse
 * order, f32 without padding): at stages 0 and 1 each bucket is a view of
 * the gradient block, in which the gradients are (DDP's
 * gradient_as_bucket_view): no copy and no byte beyond the gradients. A bucket is ready after the plan
 * position of the last node writing any of its gradients; its MPI_Iallreduce
 * starts there (on the last micro-batch) and all are waited for before the
 * optimizer steps. The layout knows sizes and positions only: train/zero.c
 * lays it out, train/step.c binds the gradients into it and starts its sums.
 *
 * ZeRO (zero >= 1): the buckets laid end to end are the flat vector that
 * parallel/shard.h shards; each bucket is reduce-scattered instead of summed
 * (MPI_Ireduce_scatter: each rank receives the sum of its own elements of
 * it only) and, once waited for, that share is moved to its place in the
 * bucket (stage 1: the rest of the bucket is stale) or, at stages 2 and
 * 3, handed to on_share (the rank steps it at once: no gradient shard) or
 * copied into the rank's gradient shard (category grads: then only the
 * shard outlives the step). There each bucket is a block of its own
 * (category grads), the gradients views of it, taken just before
 * the first node writing one of its gradients (fr_buckets_take, at
 * first_pos) and given back once its share has arrived: when a later position
 * starts another bucket, the buckets started at earlier positions are
 * waited for and freed first (so the freeing points are the plan's, not
 * MPI's timing); the rest at finish. With accumulation the blocks stay
 * through the micro-batches before the last (they hold the partial sums).
 * fr_buckets_peak walks the same rule over the plan positions. */
#ifndef FR_BUCKETS_H
#define FR_BUCKETS_H

#include "parallel/comm.h"

#define FR_BUCKET_FIRST_CAP ((size_t)1 << 20) /* DDP's first bucket: 1 MiB */
#define FR_BUCKET_CAP ((size_t)25 << 20)      /* DDP's bucket_cap_mb = 25 */

typedef struct fr_buckets {
    int n;          /* buckets */
    int n_params;   /* of the model */
    int *bucket_of; /* per param: its bucket, -1 without a gradient */
    size_t *off;    /* per param: float offset of its gradient in its bucket */
    size_t *len;    /* per bucket: floats */
    int *ready_pos; /* per bucket: the plan position after which it is complete */
    int *first_pos; /* per bucket: the plan position of the first node writing into it */
    uint8_t *done;  /* per bucket, stages 2 and 3: its share is in the shard, its block freed */
    /* called when bucket k's block is freed (its gradients' views are gone) */
    void (*on_free)(void *arg, int k);
    void *free_arg;
    /* stages 2 and 3, when set: called with bucket k's share of the sums
     * (the flat elements [a, e), at share) once it arrives, instead of
     * copying it into the shard (which then is not kept: shard stays NULL) */
    fr_status (*on_share)(void *arg, int k, const float *share, size_t a, size_t e);
    float **buf; /* per bucket: its elements (a view of the gradient block at stages 0
                    and 1; at 2 and 3 a block of category grads), NULL until there */
    int views;   /* buf[] are views of the optimizer's gradient block (not freed here) */
    uint8_t *started;
    size_t *start;      /* per bucket: its first element in the flat vector */
    size_t total;       /* elements of all buckets */
    int zero;           /* ZeRO stage (0: buckets summed whole) */
    size_t lo, hi;      /* zero >= 1: this rank's elements [lo, hi) of the flat vector */
    float *shard;       /* zero >= 2 without on_share: the gradients of [lo, hi) (grads) */
    int overlap;        /* 1: start each bucket during backward; 0: all after it */
    double wait_s;      /* seconds waiting for the sums, over the run */
    int64_t reductions; /* steps reduced */
} fr_buckets;

/* The layout for n params with grad_floats[i] f32 gradient values (0: no
 * gradient) whose last writer runs at plan position last_pos[i]; caps in
 * bytes (0: DDP's). Nothing allocated but the tables (category other). */
fr_status fr_buckets_plan(fr_ctx *ctx, int n, const size_t *grad_floats, const int *last_pos,
                          const int *first_pos, size_t first_cap, size_t cap, fr_buckets *b);
/* Stages 2 and 3: the bytes of bucket blocks held at the worst plan
 * position of n_pos (allocated; as the allocator rounds them), with
 * `accumulate` micro-batches a step and overlap as set. */
void fr_buckets_peak(const fr_buckets *b, int n_pos, int accumulate, size_t *peak,
                     size_t *reserved);
/* Stages 2 and 3: the plan position after whose node bucket k's block is
 * freed (n_pos: at finish). */
int fr_buckets_free_pos(const fr_buckets *b, int k, int n_pos);
/* Stages 2 and 3: bucket k's block, zeroed, if it has none (tag "grad buckets"). */
fr_status fr_buckets_take(fr_ctx *ctx, fr_buckets *b, int k);
/* ZeRO stage `zero` for rank `rank` of `ranks`: its range of the flat
 * vector (and, at stages 2 and 3, its shard block on fr_buckets_alloc
 * unless on_share is set). */
void fr_buckets_shard(fr_buckets *b, int zero, int rank, int ranks);
/* Stages 0 and 1: the buckets as views of flat, the optimizer's gradient
 * block (optim/optim.h: its layout is this flat vector's, zeros); at stages
 * 2 and 3 the shard's block only (the buckets come with fr_buckets_take;
 * flat NULL). */
fr_status fr_buckets_alloc(fr_ctx *ctx, fr_buckets *b, float *flat);
void fr_buckets_release(fr_ctx *ctx, fr_buckets *b);
/* Param i's first element in the flat vector. */
size_t fr_buckets_flat(const fr_buckets *b, int i);
/* Param i's gradient storage inside its bucket (NULL: none or not allocated). */
float *fr_buckets_grad(const fr_buckets *b, int i);

/* A step's reduction: begin clears the started flags; after_node starts the
 * buckets ready at plan position pos (with overlap) and lets MPI progress
 * the started ones; finish starts what is left, waits for all of them and
 * adds the wait to wait_s. */
void fr_buckets_begin(fr_buckets *b);
fr_status fr_buckets_after_node(fr_ctx *ctx, fr_comm *c, fr_buckets *b, int pos);
fr_status fr_buckets_finish(fr_ctx *ctx, fr_comm *c, fr_buckets *b);

/* "3 buckets (1.0 MiB, 25.0 MiB, 4.2 MiB)" */
int fr_buckets_describe(const fr_buckets *b, char *buf, size_t len);

#endif
