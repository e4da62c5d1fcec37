/* prefetch.c — the batch ring and prefetch thread (see prefetch.h). */
#include <inttypes.h>
#include <string.h>
#include "core/rng.h"
#include "data/prefetch.h"

static void *producer(void *arg) {
    fr_prefetch *p = arg;
    char err[FR_ERR_LEN];
    int nslots = p->queue + 1;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int64_t k = p->produced;
        while (!p->stop && k < p->nb && k >= p->released + nslots)
            pthread_cond_wait(&p->space, &p->mu);
        if (p->stop || k >= p->nb) break;
        pthread_mutex_unlock(&p->mu);
        /* Slot k % nslots is neither held by the consumer nor ready: ours. */
        fr_status st = p->fill(p->user, k, err, sizeof err);
        pthread_mutex_lock(&p->mu);
        if (!st && p->hand) { /* once the consumer has released batch k - lag */
            while (!p->stop && k - p->lag >= p->released) pthread_cond_wait(&p->space, &p->mu);
            if (p->stop) break;
            pthread_mutex_unlock(&p->mu);
            fr_batch b;
            p->view(p->user, k, &b);
            st = p->hand(p->hand_user, &b, k, err, sizeof err);
            pthread_mutex_lock(&p->mu);
        }
        if (st) {
            p->err_st = st;
            memcpy(p->err, err, sizeof err);
            pthread_cond_signal(&p->ready);
            break;
        }
        p->produced = k + 1;
        pthread_cond_signal(&p->ready);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void fr_prefetch_stop(fr_prefetch *p) {
    if (!p->running) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->space);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    p->running = 0;
}

fr_status fr_prefetch_init(fr_prefetch *p, fr_ctx *ctx, const char *who, int queue, fr_fill_fn fill,
                           fr_view_fn view, void *user) {
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->who = who;
    p->queue = queue;
    p->fill = fill;
    p->view = view;
    p->user = user;
    if (pthread_mutex_init(&p->mu, NULL)) goto fail;
    if (pthread_cond_init(&p->ready, NULL)) {
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    if (pthread_cond_init(&p->space, NULL)) {
        pthread_cond_destroy(&p->ready);
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    p->sync_ok = 1;
    return FR_OK;
fail:
    return fr_fail(ctx, FR_ERR_IO, "%s: cannot create its lock or condition variables", who);
}

void fr_prefetch_set_hand(fr_prefetch *p, fr_hand_fn hand, void *hand_user, int lag) {
    fr_prefetch_stop(p);
    p->hand = hand;
    p->hand_user = hand_user;
    p->lag = lag > 0 ? lag : 1;
}

void fr_prefetch_destroy(fr_prefetch *p) {
    fr_prefetch_stop(p);
    if (p->sync_ok) {
        pthread_cond_destroy(&p->space);
        pthread_cond_destroy(&p->ready);
        pthread_mutex_destroy(&p->mu);
        p->sync_ok = 0;
    }
}

fr_status fr_prefetch_start(fr_prefetch *p, int64_t nb, int64_t skip) {
    fr_prefetch_stop(p);
    p->started = 0;
    p->nb = nb;
    p->take = skip;
    p->held = 0;
    p->produced = p->released = skip;
    p->stop = 0;
    p->err_st = FR_OK;
    p->err[0] = 0;
    if (p->queue > 0 && skip < nb) {
        int e = pthread_create(&p->th, NULL, producer, p);
        if (e)
            return fr_fail(p->ctx, FR_ERR_IO, "%s: cannot start the prefetch thread: %s", p->who,
                           strerror(e));
        p->running = 1;
    }
    p->started = 1;
    return FR_OK;
}

fr_status fr_prefetch_next(fr_prefetch *p, int64_t *kp, int *done) {
    *done = 0;
    int64_t k = p->take;
    if (p->queue == 0) {
        if (k >= p->nb) {
            *done = 1;
            return FR_OK;
        }
        char err[FR_ERR_LEN];
        fr_status st = p->fill(p->user, k, err, sizeof err);
        if (!st && p->hand) { /* batch k - 1 was taken: k - lag is released */
            fr_batch b;
            p->view(p->user, k, &b);
            st = p->hand(p->hand_user, &b, k, err, sizeof err);
        }
        if (st) return fr_fail(p->ctx, st, "%s", err);
    } else {
        pthread_mutex_lock(&p->mu);
        if (p->held) { /* the batch given last time is free again */
            p->released = k;
            p->held = 0;
            pthread_cond_signal(&p->space);
        }
        if (k >= p->nb) {
            pthread_mutex_unlock(&p->mu);
            *done = 1;
            return FR_OK;
        }
        while (p->produced <= k && !p->err_st) pthread_cond_wait(&p->ready, &p->mu);
        if (p->produced <= k) {
            fr_status st = p->err_st;
            char err[FR_ERR_LEN];
            memcpy(err, p->err, sizeof err);
            pthread_mutex_unlock(&p->mu);
            return fr_fail(p->ctx, st, "%s", err);
        }
        p->held = 1;
        pthread_mutex_unlock(&p->mu);
    }
    *kp = k;
    p->take = k + 1;
    return FR_OK;
}

void fr_shuffle(int64_t *perm, int64_t n, int shuffle, uint64_t seed, int epoch) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle) return;
    fr_rng r = fr_rng_make(seed, 1000 + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)fr_rng_below(&r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
