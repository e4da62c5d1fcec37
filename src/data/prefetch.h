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
 * A hand (fr_prefetch_set_hand) passes each filled batch on from the same
 * thread, before the consumer may take it (the device feed enqueues its
 * upload there): batch k is handed only once the consumer has released
 * batch k - lag (asked for batch k - lag + 1), so a consumer that keeps lag
 * buffers of its own, one per batch in turn (the feed's two device slots),
 * finds the one batch k goes into done with. With queue 0 the hand runs in
 * next(), after the fill.
 *
 * Shuffle: epoch e starts from the identity and runs Fisher-Yates with
 * r = fr_rng_make(seed, 1000 + e):
 *     for i = n-1 down to 1: j = fr_rng_below(&r, i + 1); swap(perm[i], perm[j])
 * so the order depends only on (seed, e, n). */
#ifndef FR_PREFETCH_H
#define FR_PREFETCH_H

#include <pthread.h>
#include "core/ctx.h"
#include "frugal.h"

/* Fill batch k into its slot (k % (queue + 1)); a fault's message into err.
 * Called on the prefetch thread: it must not touch the context. */
typedef fr_status (*fr_fill_fn)(void *user, int64_t k, char *err, size_t errlen);
/* Batch k as the consumer sees it (its slot's pointers), for a hand. */
typedef void (*fr_view_fn)(void *user, int64_t k, fr_batch *out);
/* Pass filled batch k on (on the prefetch thread; not the context either). */
typedef fr_status (*fr_hand_fn)(void *hand_user, const fr_batch *b, int64_t k, char *err,
                                size_t errlen);

typedef struct fr_prefetch {
    fr_ctx *ctx;
    const char *who; /* "loader", "token loader": the start of messages */
    fr_fill_fn fill;
    fr_view_fn view;
    void *user;
    fr_hand_fn hand; /* NULL: none */
    void *hand_user;
    int lag;
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
                           fr_view_fn view, void *user);
/* Hand each batch filled from now on to hand (NULL: none) once the consumer
 * has released batch k - lag (lag >= 1); stops the thread first, so call it
 * between epochs (before fr_prefetch_start). */
void fr_prefetch_set_hand(fr_prefetch *p, fr_hand_fn hand, void *hand_user, int lag);
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
