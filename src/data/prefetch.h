/* prefetch.h — the ring of batch slots both loaders share (loader.c for
 * images, tokens.c for token windows), and their per-epoch shuffle.
 *
 * A ring of queue + 1 slots; batch k goes to slot k % (queue + 1). The
 * consumer holds the slot of the batch it was given last until its next
 * call; a background thread may fill batch k only once batch k - (queue + 1)
 * has been released, so it runs at most queue batches ahead, and memory is
 * the slots, whatever the data. With queue 0 there is no thread: next()
 * fills the one slot itself. The thread never touches the context: a fill
 * error is kept, with its message, and next() reports it on the caller's
 * thread when it reaches the batch that failed.
 *
 * Shuffle: epoch e starts from the identity and runs Fisher-Yates with
 * r = fr_rng_make(seed, 1000 + e):
 *     for i = n-1 down to 1: j = fr_rng_below(&r, i + 1); swap(perm[i], perm[j])
 * so the order depends only on (seed, e, n). */
#ifndef FR_PREFETCH_H
#define FR_PREFETCH_H

#include <pthread.h>
#include "core/ctx.h"

/* Fill batch k into its slot (k % (queue + 1)); a fault's message into err.
 * Called on the prefetch thread: it must not touch the context. */
typedef fr_status (*fr_fill_fn)(void *user, int64_t k, char *err, size_t errlen);

typedef struct fr_prefetch {
    fr_ctx *ctx;
    const char *who; /* "loader", "token loader": the start of messages */
    fr_fill_fn fill;
    void *user;
    int queue;
    int64_t nb; /* batches this epoch */

    int started;
    int64_t take; /* batch the consumer gets next */
    int held;     /* the consumer holds batch take - 1 */

    /* Shared with the thread, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t ready, space;
    int sync_ok; /* mu, ready and space were initialised */
    pthread_t th;
    int running;
    int stop;
    int64_t produced; /* batches before this one are filled */
    int64_t released; /* slots of batches before this one may be reused */
    fr_status err_st;
    char err[FR_ERR_LEN];
} fr_prefetch;

/* Set up the lock and conditions; FR_ERR_IO with a message if they cannot be. */
fr_status fr_prefetch_init(fr_prefetch *p, fr_ctx *ctx, const char *who, int queue, fr_fill_fn fill,
                           void *user);
/* Stop the thread and release the lock (p as fr_prefetch_init left it, or zeroed). */
void fr_prefetch_destroy(fr_prefetch *p);
/* Stop the thread (before the caller changes what it reads, e.g. the order). */
void fr_prefetch_stop(fr_prefetch *p);
/* Start an epoch of nb batches at batch skip (stopping a running one). */
fr_status fr_prefetch_start(fr_prefetch *p, int64_t nb, int64_t skip);
/* The next batch: its index in *k (its slot k % (queue + 1)), or *done = 1
 * at the end of the epoch. */
fr_status fr_prefetch_next(fr_prefetch *p, int64_t *k, int *done);

/* perm[0..n) = epoch's order: the identity, Fisher-Yates'd when shuffle. */
void fr_shuffle(int64_t *perm, int64_t n, int shuffle, uint64_t seed, int epoch);

#endif
