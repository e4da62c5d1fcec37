/* test_prefetch_hand.c — the prefetch ring's hand (data/prefetch.h), on
 * which the device feed enqueues uploads from the loader's thread: with a
 * thread (queue 3) every batch k is handed on that thread, never the
 * consumer's, only once the consumer has asked for batch k - lag + 1 (so
 * released k - lag), and before the consumer gets k; the consumer gets
 * every batch in order. With queue 0 the hand runs in next(), on the
 * consumer's thread. A hand's failure is reported by next() at its batch
 * with its message; a thread blocked waiting to hand is stopped cleanly
 * when the epoch is restarted or the ring destroyed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "core/ctx.h"
#include "data/prefetch.h"

enum { NB = 24, MAXQ = 4 };

typedef struct ring {
    int queue, lag, fail_at;
    int64_t filled[MAXQ + 1]; /* the batch each slot holds */
    atomic_llong asked;       /* the batch the consumer asks for next */
    atomic_int handed[NB];    /* 1: handed on another thread, 2: on the consumer's */
    atomic_int early;         /* hands before the consumer released batch k - lag */
    pthread_t consumer;
} ring;

static fr_status fill(void *user, int64_t k, char *err, size_t errlen) {
    ring *r = user;
    (void)err, (void)errlen;
    r->filled[k % (r->queue + 1)] = k;
    return FR_OK;
}

static void view(void *user, int64_t k, fr_batch *out) {
    ring *r = user;
    memset(out, 0, sizeof *out);
    out->n = (int)r->filled[k % (r->queue + 1)];
}

static fr_status hand(void *user, const fr_batch *b, int64_t k, char *err, size_t errlen) {
    ring *r = user;
    if (k == r->fail_at) {
        snprintf(err, errlen, "hand: batch %lld refused", (long long)k);
        return FR_ERR_IO;
    }
    if (b->n != (int)k || atomic_load(&r->asked) < k - r->lag + 1) atomic_fetch_add(&r->early, 1);
    atomic_store(&r->handed[k], pthread_equal(pthread_self(), r->consumer) ? 2 : 1);
    return FR_OK;
}

static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* One epoch from skip; the batches' hands as seen by the consumer. */
static void epoch(fr_ctx *ctx, int queue, int lag, int64_t skip) {
    ring r = {.queue = queue, .lag = lag, .fail_at = -1, .consumer = pthread_self()};
    atomic_store(&r.asked, skip);
    fr_prefetch p;
    CHECK(fr_prefetch_init(&p, ctx, "test", queue, fill, view, &r) == FR_OK, "init");
    fr_prefetch_set_hand(&p, hand, &r, lag);
    CHECK(fr_prefetch_start(&p, NB, skip) == FR_OK, "start");
    int64_t want = skip, wrong = 0, unhanded = 0, thread = 0;
    for (;;) {
        int64_t k = -1;
        int done = 0;
        atomic_store(&r.asked, want);
        if (fr_prefetch_next(&p, &k, &done) || done) break;
        wrong += k != want;
        int h = atomic_load(&r.handed[k]);
        unhanded += h == 0;
        thread += h == (queue ? 1 : 2);
        want++;
        pause_us(300); /* the step: the thread runs ahead meanwhile */
    }
    CHECK(want == NB && !wrong, "queue %d lag %d: %lld batches, %lld out of order", queue, lag,
          (long long)want, (long long)wrong);
    CHECK(!unhanded, "queue %d lag %d: %lld batches given before their hand", queue, lag,
          (long long)unhanded);
    CHECK(thread == NB - skip, "queue %d lag %d: %lld of %lld hands on the %s thread", queue, lag,
          (long long)thread, (long long)(NB - skip), queue ? "prefetch" : "consumer's");
    CHECK(atomic_load(&r.early) == 0,
          "queue %d lag %d: %d batches handed before batch k - lag was released", queue, lag,
          atomic_load(&r.early));
    fr_prefetch_destroy(&p);
}

static void test_failure_and_stop(fr_ctx *ctx) {
    ring r = {.queue = 3, .lag = 2, .fail_at = 5, .consumer = pthread_self()};
    fr_prefetch p;
    CHECK(fr_prefetch_init(&p, ctx, "test", 3, fill, view, &r) == FR_OK, "init");
    fr_prefetch_set_hand(&p, hand, &r, 2);
    CHECK(fr_prefetch_start(&p, NB, 0) == FR_OK, "start");
    int64_t k = -1, got = 0;
    int done = 0;
    fr_status st = FR_OK;
    while (!(st = fr_prefetch_next(&p, &k, &done)) && !done) got++;
    CHECK(st == FR_ERR_IO && got == 5 && strstr(fr_last_error(ctx), "batch 5 refused"),
          "a hand's failure at batch 5: status %d after %lld batches, '%s'", st, (long long)got,
          fr_last_error(ctx));
    /* a thread waiting to hand batch 2 (the consumer holds batch 0): a
     * restart and a destroy stop it */
    r.fail_at = -1;
    CHECK(fr_prefetch_start(&p, NB, 0) == FR_OK, "restart");
    CHECK(fr_prefetch_next(&p, &k, &done) == FR_OK && k == 0, "batch 0");
    pause_us(2000);
    CHECK(fr_prefetch_start(&p, NB, 0) == FR_OK, "restart while the thread waits");
    CHECK(fr_prefetch_next(&p, &k, &done) == FR_OK && k == 0, "batch 0 again");
    pause_us(2000);
    fr_prefetch_destroy(&p);
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    for (int q = 0; q <= 3; q += 3)
        for (int lag = 1; lag <= 2; lag++) {
            epoch(ctx, q, lag, 0);
            epoch(ctx, q, lag, 7);
        }
    test_failure_and_stop(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
