/* loader.c — batches from a dataset (see loader.h): the per-epoch
 * permutation, batching with drop_last and resume, and the prefetch thread.
 * Owns the batch buffers (category DATA) and the permutation (category
 * OTHER: 8 bytes of index per sample); knows nothing of file formats.
 *
 * Shuffling: epoch e starts from the identity and runs Fisher-Yates with
 * r = fr_rng_make(seed, 1000 + e):
 *     for i = n-1 down to 1: j = fr_rng_below(&r, i + 1); swap(perm[i], perm[j])
 * so the order depends only on (seed, e, n). Batch k holds perm[k*batch ..).
 *
 * Prefetch (queue q > 0): a ring of q + 1 slots, each one batch of x and of
 * y (class labels) or t (regression targets, `outputs` floats a sample).
 * The consumer holds the slot of the batch it was given last until its next
 * call; the producer may fill batch k only once batch k - (q + 1) has been
 * released, so it runs at most q batches ahead. DATA memory is exactly
 * (q + 1) * batch * (c*h*w * sizeof(float) + sizeof(int32_t)) bytes (with
 * targets: + outputs * sizeof(float) instead of the int32), for q = 0 too
 * (one slot, filled in next()). The producer never touches
 * ctx->err: a read error is kept in the loader, with its message, and
 * fr_loader_next reports it on the caller's thread when it reaches the
 * batch that failed. */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include "core/rng.h"
#include "data/loader.h"

struct fr_loader {
    fr_ctx *ctx;
    fr_dataset *ds;
    fr_loader_opts o;
    int64_t n;     /* samples used per epoch */
    int64_t nb;    /* batches per epoch */
    size_t sample; /* floats per sample */
    int nslots;    /* queue + 1 */
    float *x;      /* nslots * batch * sample (DATA) */
    int32_t *y;    /* nslots * batch class labels (DATA), or NULL */
    float *t;      /* nslots * batch * outputs targets (DATA), or NULL */
    int outputs;   /* targets a sample; 0: class labels */
    int64_t *perm; /* n sample indices (OTHER) */

    int started;
    int64_t take; /* batch the consumer gets next */
    int held;     /* the consumer holds batch take - 1 */

    /* Shared with the producer, under mu. */
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
};

static int batch_count(const fr_loader *l, int64_t k) {
    int64_t left = l->n - k * l->o.batch;
    return (int)(left < l->o.batch ? left : l->o.batch);
}

static float *slot_x(const fr_loader *l, int64_t k) {
    return l->x + (size_t)(k % l->nslots) * (size_t)l->o.batch * l->sample;
}

static int32_t *slot_y(const fr_loader *l, int64_t k) {
    return l->y ? l->y + (size_t)(k % l->nslots) * (size_t)l->o.batch : NULL;
}

static float *slot_t(const fr_loader *l, int64_t k) {
    return l->t ? l->t + (size_t)(k % l->nslots) * (size_t)l->o.batch * (size_t)l->outputs : NULL;
}

static void *producer(void *arg) {
    fr_loader *l = arg;
    char err[FR_ERR_LEN];
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int64_t k = l->produced;
        while (!l->stop && k < l->nb && k >= l->released + l->nslots)
            pthread_cond_wait(&l->space, &l->mu);
        if (l->stop || k >= l->nb) break;
        pthread_mutex_unlock(&l->mu);
        /* Slot k % nslots is neither held by the consumer nor ready: ours. */
        fr_status st = fr_dataset_read_r(l->ds, l->perm + k * l->o.batch, batch_count(l, k),
                                         slot_x(l, k), slot_y(l, k), slot_t(l, k), err, sizeof err);
        pthread_mutex_lock(&l->mu);
        if (st) {
            l->err_st = st;
            memcpy(l->err, err, sizeof err);
            pthread_cond_signal(&l->ready);
            break;
        }
        l->produced = k + 1;
        pthread_cond_signal(&l->ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void stop_thread(fr_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->space);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->th, NULL);
    l->running = 0;
}

size_t fr_loader_reserved(int64_t n, size_t sample, const fr_loader_opts *o) {
    if (o->limit > 0 && o->limit < n) n = o->limit;
    size_t slots = (size_t)o->queue + 1, batch = (size_t)o->batch;
    return fr_mem_block_bytes(sizeof(fr_loader)) + fr_mem_block_bytes((size_t)n * sizeof(int64_t)) +
           fr_mem_block_bytes(slots * batch * sample * sizeof(float)) +
           fr_mem_block_bytes(slots * batch * sizeof(int32_t));
}

fr_loader *fr_loader_new(fr_ctx *ctx, fr_dataset *ds, const fr_loader_opts *o) {
    if (!ds || !o || o->batch < 1 || o->queue < 0 || o->limit < 0) {
        fr_fail(ctx, FR_ERR_ARG, "loader: bad options (batch %d, queue %d, limit %" PRId64 ")",
                o ? o->batch : 0, o ? o->queue : 0, o ? o->limit : 0);
        return NULL;
    }
    int c, h, w;
    fr_dataset_sample_shape(ds, &c, &h, &w);
    int64_t n = fr_dataset_len(ds);
    if (o->limit > 0 && o->limit < n) n = o->limit;
    size_t sample = (size_t)c * (size_t)h * (size_t)w;
    int outputs = fr_dataset_outputs(ds);
    size_t nslots = (size_t)o->queue + 1, per_slot,
           y_per = outputs ? (size_t)outputs * sizeof(float) : sizeof(int32_t);
    size_t xbytes, ybytes;
    if (__builtin_mul_overflow(sample * sizeof(float), (size_t)o->batch, &per_slot) ||
        __builtin_mul_overflow(per_slot, nslots, &xbytes) ||
        __builtin_mul_overflow(y_per * (size_t)o->batch, nslots, &ybytes)) {
        fr_fail(ctx, FR_ERR_ARG, "loader: batch %d with queue %d overflows memory sizes", o->batch,
                o->queue);
        return NULL;
    }
    fr_loader *l = fr_calloc(ctx, sizeof *l, FR_MEM_OTHER);
    if (!l) return NULL;
    l->ctx = ctx;
    l->ds = ds;
    l->o = *o;
    l->n = n;
    l->nb = o->drop_last ? n / o->batch : (n + o->batch - 1) / o->batch;
    l->sample = sample;
    l->outputs = outputs;
    l->nslots = (int)nslots;
    l->perm = fr_alloc(ctx, (size_t)n * sizeof *l->perm, FR_MEM_OTHER);
    l->x = l->perm ? fr_alloc(ctx, xbytes, FR_MEM_DATA) : NULL;
    void *yt = l->x ? fr_alloc(ctx, ybytes, FR_MEM_DATA) : NULL;
    if (!yt) goto fail;
    if (outputs) l->t = yt;
    else l->y = yt;
    if (pthread_mutex_init(&l->mu, NULL)) goto fail_sync;
    if (pthread_cond_init(&l->ready, NULL)) {
        pthread_mutex_destroy(&l->mu);
        goto fail_sync;
    }
    if (pthread_cond_init(&l->space, NULL)) {
        pthread_cond_destroy(&l->ready);
        pthread_mutex_destroy(&l->mu);
        goto fail_sync;
    }
    l->sync_ok = 1;
    return l;
fail_sync:
    fr_fail(ctx, FR_ERR_IO, "loader: cannot create its lock or condition variables");
fail:
    fr_loader_free(l);
    return NULL;
}

void fr_loader_free(fr_loader *l) {
    if (!l) return;
    stop_thread(l);
    if (l->sync_ok) {
        pthread_cond_destroy(&l->space);
        pthread_cond_destroy(&l->ready);
        pthread_mutex_destroy(&l->mu);
    }
    fr_ctx *ctx = l->ctx;
    fr_free(ctx, l->y);
    fr_free(ctx, l->t);
    fr_free(ctx, l->x);
    fr_free(ctx, l->perm);
    fr_free(ctx, l);
}

int64_t fr_loader_num_batches(const fr_loader *l) { return l->nb; }

fr_status fr_loader_start(fr_loader *l, int epoch, int64_t skip) {
    stop_thread(l);
    l->started = 0;
    if (epoch < 0 || skip < 0 || skip > l->nb)
        return fr_fail(l->ctx, FR_ERR_ARG,
                       "loader: cannot start epoch %d at batch %" PRId64 " (an epoch has %" PRId64
                       ")",
                       epoch, skip, l->nb);
    for (int64_t i = 0; i < l->n; i++) l->perm[i] = i;
    if (l->o.shuffle) {
        fr_rng r = fr_rng_make(l->o.seed, 1000 + (uint64_t)epoch);
        for (int64_t i = l->n - 1; i > 0; i--) {
            int64_t j = (int64_t)fr_rng_below(&r, (uint64_t)i + 1);
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->take = skip;
    l->held = 0;
    l->produced = l->released = skip;
    l->stop = 0;
    l->err_st = FR_OK;
    l->err[0] = 0;
    if (l->o.queue > 0 && skip < l->nb) {
        int e = pthread_create(&l->th, NULL, producer, l);
        if (e)
            return fr_fail(l->ctx, FR_ERR_IO, "loader: cannot start the prefetch thread: %s",
                           strerror(e));
        l->running = 1;
    }
    l->started = 1;
    return FR_OK;
}

fr_status fr_loader_next(fr_loader *l, fr_batch *out, int *done) {
    memset(out, 0, sizeof *out);
    *done = 0;
    if (!l->started)
        return fr_fail(l->ctx, FR_ERR_ARG, "loader: fr_loader_next before fr_loader_start");
    int64_t k = l->take;
    if (l->o.queue == 0) {
        if (k >= l->nb) {
            *done = 1;
            return FR_OK;
        }
        fr_status st = fr_dataset_read(l->ds, l->perm + k * l->o.batch, batch_count(l, k),
                                       slot_x(l, k), slot_y(l, k), slot_t(l, k));
        if (st) return st;
    } else {
        pthread_mutex_lock(&l->mu);
        if (l->held) { /* the batch given last time is free again */
            l->released = k;
            l->held = 0;
            pthread_cond_signal(&l->space);
        }
        if (k >= l->nb) {
            pthread_mutex_unlock(&l->mu);
            *done = 1;
            return FR_OK;
        }
        while (l->produced <= k && !l->err_st) pthread_cond_wait(&l->ready, &l->mu);
        if (l->produced <= k) {
            fr_status st = l->err_st;
            char err[FR_ERR_LEN];
            memcpy(err, l->err, sizeof err);
            pthread_mutex_unlock(&l->mu);
            return fr_fail(l->ctx, st, "%s", err);
        }
        l->held = 1;
        pthread_mutex_unlock(&l->mu);
    }
    out->n = batch_count(l, k);
    out->x = slot_x(l, k);
    out->y = slot_y(l, k);
    out->target = slot_t(l, k);
    l->take = k + 1;
    return FR_OK;
}
