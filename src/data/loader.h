/* loader.h — batches from a dataset: seeded shuffling (the permutation of
 * epoch e depends only on (seed, e)), drop_last, and a background prefetch
 * thread filling a bounded queue of batch buffers, so memory is bounded by
 * the queue depth, not the dataset. Batch buffers are category DATA. */
#ifndef FR_LOADER_H
#define FR_LOADER_H

#include "data/dataset.h"
#include "data/prefetch.h"

typedef struct fr_loader fr_loader;

typedef struct fr_loader_opts {
    int batch;
    int shuffle;
    int drop_last;
    uint64_t seed;
    int queue;     /* batches prefetched ahead (>= 1); 0: no thread, read in next() */
    int64_t limit; /* use only the first `limit` samples (0: all) */
    /* Data parallel: this process is rank `rank` of `ranks` (0: one) and
     * takes samples [rank*n/ranks, (rank+1)*n/ranks) of each batch of n in
     * the loader's order (DistributedSampler's contiguous split of the
     * global batch): slices differ by at most one sample. */
    int rank, ranks;
} fr_loader_opts;

fr_loader *fr_loader_new(fr_ctx *ctx, fr_dataset *ds, const fr_loader_opts *o);
/* What fr_loader_new reserves for a dataset of n samples of `sample` floats
 * (the permutation and the (queue + 1) batch buffers, as the allocator
 * rounds them): for budgets, before any loader exists. */
size_t fr_loader_reserved(int64_t n, size_t sample, const fr_loader_opts *o);
void fr_loader_free(fr_loader *l);
/* Samples of rank `rank`'s slice of a global batch of n (the rule above). */
int fr_loader_slice(int n, int rank, int ranks, int *first);
/* Samples rank `rank` of `ranks` sees in an epoch of n_samples in batches of batch. */
int64_t fr_loader_rank_samples(int64_t n_samples, int batch, int rank, int ranks);
/* The global batch the last fr_loader_next's slice is of (its n with one rank). */
int fr_loader_global_n(const fr_loader *l);
int64_t fr_loader_num_batches(const fr_loader *l);
/* Start epoch `epoch` (0-based), skipping its first `skip` batches (resume). */
fr_status fr_loader_start(fr_loader *l, int epoch, int64_t skip);
/* Next batch of the epoch; *done = 1 and no batch at its end. The batch stays
 * valid until the next call to next/start/free. */
fr_status fr_loader_next(fr_loader *l, fr_batch *out, int *done);
/* Hand each batch, once filled, to hand on the prefetch thread (prefetch.h:
 * after the consumer released batch k - lag); NULL: none. Between epochs. */
void fr_loader_set_hand(fr_loader *l, fr_hand_fn hand, void *user, int lag);

#endif
