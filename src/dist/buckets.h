/* buckets.h — gradients laid out in buckets that are summed over the ranks
 * while backward still runs (PyTorch DDP's Reducer): parameters in reverse
 * order (backward makes the last layer's gradients first), a bucket closed
 * once it holds at least its cap (the first 1 MiB, the others 25 MiB;
 * a parameter is never split), each bucket one block of category grads in
 * which the gradients are views (DDP's gradient_as_bucket_view): no copy and
 * no byte beyond the gradients themselves. A bucket is ready after the plan
 * position of the last node writing any of its gradients; its MPI_Iallreduce
 * starts there (on the last micro-batch) and all are waited for before the
 * optimizer steps. The layout knows sizes and positions only; the step binds
 * it (train/step.c). */
#ifndef FR_BUCKETS_H
#define FR_BUCKETS_H

#include "dist/comm.h"

#define FR_BUCKET_FIRST_CAP ((size_t)1 << 20) /* DDP's first bucket: 1 MiB */
#define FR_BUCKET_CAP ((size_t)25 << 20)      /* DDP's bucket_cap_mb = 25 */

typedef struct fr_buckets {
    int n;          /* buckets */
    int n_params;   /* of the model */
    int *bucket_of; /* per param: its bucket, -1 without a gradient */
    size_t *off;    /* per param: float offset of its gradient in its bucket */
    size_t *len;    /* per bucket: floats */
    int *ready_pos; /* per bucket: the plan position after which it is complete */
    float **buf;    /* per bucket: the block (category grads), NULL until allocated */
    uint8_t *started;
    int overlap;        /* 1: start each bucket during backward; 0: all after it */
    double wait_s;      /* seconds waiting for the sums, over the run */
    int64_t reductions; /* steps reduced */
} fr_buckets;

/* The layout for n params with grad_floats[i] f32 gradient values (0: no
 * gradient) whose last writer runs at plan position last_pos[i]; caps in
 * bytes (0: DDP's). Nothing allocated but the tables (category other). */
fr_status fr_buckets_plan(fr_ctx *ctx, int n, const size_t *grad_floats, const int *last_pos,
                          size_t first_cap, size_t cap, fr_buckets *b);
/* The blocks, zeroed (category grads, tag "grad buckets"). */
fr_status fr_buckets_alloc(fr_ctx *ctx, fr_buckets *b);
/* What the blocks reserve, as the allocator rounds them. */
size_t fr_buckets_reserved(const fr_buckets *b);
void fr_buckets_release(fr_ctx *ctx, fr_buckets *b);
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
