/* feed.c — batches uploaded into two device slots ahead of their step (see
 * feed.h).
 *
 * Who touches what, and when. Two threads: the step's (fr_feed_start, _next,
 * _acquire, _release, _drain) and the loader's prefetch thread, which runs
 * hand() for batch k of an epoch once it has filled it. Batch k goes into
 * slot k % 2; the loader's ring (prefetch.h, lag 2) runs hand(k) only after
 * the step's thread asked for batch k - 1, which it does only after the step
 * of batch k - 2 returned. So:
 *   - slot j is written only by the upload hand() enqueues for batch k (on
 *     the upload queue), whose wait list holds end[j], the mark the step's
 *     queue put after the last read of j by the step of batch k - 2 (set in
 *     fr_feed_release before that step returned): the upload cannot start
 *     while a step still reads the slot;
 *   - the step reads slot j only after a barrier on up[j] (fr_feed_acquire),
 *     so it never sees the slot half written; it checks that the slot holds
 *     its own batch (k[j]), so it never waits for a later batch's upload;
 *   - hand() writes x/y's upload events, n[j], k[j] and by_loader[j] of
 *     slot j only; the step's thread reads them after the loader's ring has
 *     given it batch k (the ring's lock orders the two: fr_feed_next waits
 *     for up[j] and counts it then), and is done with them before it asks
 *     for batch k + 1, the earliest point hand(k + 2) may run;
 *   - end[j] is written by the step's thread (fr_feed_release of batch
 *     k - 2) and read by hand(k), which the ring's lock orders after it;
 *     begin[], ran[] and the counts are the step's thread's alone;
 *   - the upload reads the loader's host batch asynchronously; that batch
 *     stays the loader's until the step's thread asks for the next one, and
 *     fr_feed_next waits for the upload before handing the batch out;
 *     fr_feed_start and fr_feed_drain stop the loader's thread before
 *     waiting for the upload queue, so nothing is enqueued behind that
 *     wait. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "train/place.h"
#include "train/feed.h"

/* Bytes a sample takes of the graph's input and label values. */
static size_t sample_bytes(const fr_step *s, int v) {
    return fr_value_bytes(&s->g.vals[v]) / (size_t)s->sched.micro;
}

/* The pipeline hides the batch's copy into the backend's memory: where the
 * backend's kernels read the host's batch in place (the CPU), there is no
 * copy (fr_backend.mirror_bytes) to hide. */
int fr_feed_used(const fr_step *s) {
    const fr_backend *be = fr_backend_of(s->ctx);
    return s->o.training && !s->o.sync_upload &&
           be->mirror_bytes(s->ctx, fr_value_bytes(&s->g.vals[s->g.input])) > 0;
}

static size_t whole(const fr_step *s) {
    return (size_t)s->sched.micro * (size_t)s->sched.accumulate;
}

size_t fr_feed_reserved(const fr_step *s) {
    const fr_mem *dm = s->ctx->dmem;
    size_t xb = sample_bytes(s, s->g.input) * whole(s), yb = sample_bytes(s, s->g.label) * whole(s);
    return 2 * (fr_mem_class_bytes(dm, xb) + fr_mem_class_bytes(dm, yb));
}

/* The feed over any backend's members (fr_backend's uploads and events): a
 * device's are asynchronous; the CPU's copy at once with NULL events, on
 * which every wait returns. */
struct fr_feed {
    fr_ctx *ctx;
    const fr_backend *be;
    void *q;           /* the uploads' queue (profiled) */
    void *x[2], *y[2]; /* the slots: buffers from the backend's allocator (data) */
    size_t xs, ys;     /* bytes per sample */
    int ce, tokens;
    fr_batches *l;     /* the epoch's loader (between fr_feed_start and the drain) */
    pthread_t stepper; /* the step's thread (fr_feed_start's caller) */
    /* slot j's upload, written by hand() */
    void *upx[2], *up[2]; /* its inputs' write, its labels' (the last): events */
    int n[2];             /* samples */
    int64_t k[2];         /* the batch's index in the epoch */
    int by_loader[2];     /* enqueued on a thread other than the step's */
    /* the step's thread's */
    void *begin[2], *end[2]; /* the last step on a slot: after its barrier, after its reads */
    int64_t ran[2];          /* that step's batch, or -1 */
    int64_t next_k;          /* the batch fr_feed_next takes next */
    int cur;                 /* the slot of the batch handed out last, or -1 */
    int64_t cur_k;           /* that batch */
    fr_feed_stats stats;
};

static void drop(const fr_feed *f, void **e) {
    f->be->event_release(*e);
    *e = NULL;
}

fr_status fr_feed_new(fr_step *s, fr_feed **out) {
    fr_ctx *ctx = s->ctx;
    const fr_backend *be = fr_backend_of(ctx);
    fr_status st;
    *out = NULL;
    fr_feed *f = fr_calloc(ctx, sizeof *f, FR_MEM_DATA);
    if (!f) return FR_ERR_NOMEM;
    f->ctx = ctx;
    f->be = be;
    f->cur = -1;
    f->ran[0] = f->ran[1] = -1;
    f->ce = s->m->loss == FR_LOSS_CROSS_ENTROPY;
    f->tokens = s->m->in_dtype == FR_I32;
    f->xs = sample_bytes(s, s->g.input);
    f->ys = sample_bytes(s, s->g.label);
    size_t w = whole(s);
    for (int i = 0; i < 2; i++) {
        if (!(f->x[i] = be->alloc(ctx, f->xs * w, FR_MEM_DATA)) ||
            !(f->y[i] = be->alloc(ctx, f->ys * w, FR_MEM_DATA))) {
            fr_feed_free(f);
            return FR_ERR_NOMEM;
        }
    }
    if ((st = be->upload_open(ctx, &f->q))) {
        fr_feed_free(f);
        return st;
    }
    *out = f;
    return FR_OK;
}

void fr_feed_free(fr_feed *f) {
    if (!f) return;
    const fr_backend *be = f->be;
    be->upload_close(f->ctx, f->q); /* finishes what is in flight first */
    for (int i = 0; i < 2; i++) {
        drop(f, &f->upx[i]), drop(f, &f->up[i]), drop(f, &f->begin[i]), drop(f, &f->end[i]);
        be->release(f->ctx, f->x[i]);
        be->release(f->ctx, f->y[i]);
    }
    fr_free(f->ctx, f);
}

/* Batch k (host memory b) into slot k % 2, behind the last step that read
 * the slot: on the loader's thread (or the step's, with a loader of queue
 * 0). No context here: a fault's message goes into err. */
static fr_status hand(void *user, const fr_batch *b, int64_t k, char *err, size_t errlen) {
    fr_feed *f = user;
    int j = (int)(k & 1);
    const char *x = f->tokens ? (const char *)b->idx : (const char *)b->x;
    const char *y = f->ce ? (const char *)b->y : (const char *)b->target;
    char why[FR_ERR_LEN / 2] = "";
    drop(f, &f->upx[j]), drop(f, &f->up[j]);
    fr_status st = f->be->upload(f->q, f->x[j], 0, x, (size_t)b->n * f->xs, f->end[j], &f->upx[j],
                                 why, sizeof why);
    if (!st)
        st = f->be->upload(f->q, f->y[j], 0, y, (size_t)b->n * f->ys, NULL, &f->up[j], why,
                           sizeof why);
    if (st) {
        snprintf(err, errlen, "uploading batch %lld (%d samples) into device slot %d: %s",
                 (long long)k, b->n, j, why);
        return st;
    }
    f->n[j] = b->n;
    f->k[j] = k;
    f->by_loader[j] = !pthread_equal(pthread_self(), f->stepper);
    return FR_OK;
}

/* Stop the loader's thread (nothing more is enqueued) and wait for every
 * upload: the loader's host batches are then free to be refilled. */
static fr_status drain(fr_feed *f) {
    if (f->l) fr_batches_set_hand(f->l, NULL, NULL, 0);
    f->l = NULL;
    f->cur = -1;
    return f->be->upload_finish(f->ctx, f->q);
}

fr_status fr_feed_start(fr_feed *f, fr_batches *l, int epoch, int64_t skip) {
    fr_status st = drain(f);
    if (st) return st;
    fr_batches_set_hand(l, hand, f, 2); /* (stops the loader's thread first) */
    f->stepper = pthread_self();
    f->ran[0] = f->ran[1] = -1;
    f->next_k = skip;
    if ((st = fr_batches_start(l, epoch, skip))) {
        fr_batches_set_hand(l, NULL, NULL, 0);
        return st;
    }
    f->l = l;
    return FR_OK;
}

/* Slot p's upload (batch k[p]) has completed: count it, and whether it ran
 * beside the step of batch k[p] - 1 (on the other slot, if that step ran
 * this epoch): it overlapped when it started before that step ended (a
 * synchronous upload starts only after), for the time both intervals share
 * (the device's clock: 0 where the backend cannot tell). */
static void account(fr_feed *f, int p) {
    double u0, u1, s0, s1, unused;
    f->be->event_times(f->upx[p], &u0, &unused);
    f->be->event_times(f->up[p], &unused, &u1);
    f->stats.uploads++;
    f->stats.upload_us += u1 - u0;
    f->stats.from_loader += f->by_loader[p];
    int o = 1 - p;
    if (f->ran[o] != f->k[p] - 1 || f->be->event_wait(f->ctx, f->end[o])) return;
    f->be->event_times(f->begin[o], &unused, &s0);
    f->be->event_times(f->end[o], &unused, &s1);
    if (u0 >= s1) return;
    double lo = u0 > s0 ? u0 : s0, hi = u1 < s1 ? u1 : s1;
    f->stats.overlapped++;
    f->stats.overlap_us += hi > lo ? hi - lo : 0;
}

fr_status fr_feed_next(fr_feed *f, fr_batch *out, int *done) {
    memset(out, 0, sizeof *out);
    *done = 0;
    if (!f->l) return fr_fail(f->ctx, FR_ERR_ARG, "fr_feed_next before fr_feed_start");
    f->cur = -1;
    fr_batch b; /* its upload is enqueued (hand() ran before the loader gave it out) */
    int end = 0;
    fr_status st = fr_batches_next(f->l, &b, &end);
    if (st || end) {
        *done = end;
        return st;
    }
    int j = (int)(f->next_k & 1);
    if (f->k[j] != f->next_k || f->n[j] != b.n)
        return fr_fail(f->ctx, FR_ERR_ARG,
                       "device slot %d holds batch %lld (%d samples) where batch %lld (%d) was due",
                       j, (long long)f->k[j], f->n[j], (long long)f->next_k, b.n);
    /* the loader's host batch goes back with the next call: its upload done */
    if ((st = f->be->event_wait(f->ctx, f->up[j]))) return st;
    account(f, j);
    f->cur = j;
    f->cur_k = f->next_k++;
    out->n = f->n[j];
    return FR_OK;
}

fr_status fr_feed_drain(fr_feed *f) { return drain(f); }

int fr_feed_holds(const fr_feed *f, const fr_batch *b) {
    int c = f->cur;
    return c >= 0 && !b->x && !b->y && !b->idx && !b->target && b->n == f->n[c];
}

fr_status fr_feed_acquire(fr_step *s, const fr_batch *b, int *slot) {
    fr_feed *f = s->place.feed;
    int c = f->cur;
    fr_status st;
    if (fr_feed_holds(f, b)) {
        /* the slot's upload is this batch's: never a later batch's */
        f->stats.waits++;
        if (f->k[c] != f->cur_k)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "device slot %d holds the upload of batch %lld, not the step's %lld", c,
                           (long long)f->k[c], (long long)f->cur_k);
        st = f->be->event_order(s->ctx, f->up[c]);
    } else { /* a host batch: into slot 0 on the step's queue, outside an epoch */
        const char *x = f->tokens ? (const char *)b->idx : (const char *)b->x;
        const char *y = f->ce ? (const char *)b->y : (const char *)b->target;
        if (f->l)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "a host batch for a step whose feed runs an epoch: give it the batch "
                           "fr_feed_next handed out");
        if (!x || !y)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "a batch without its %s: give the step a loader's batch",
                           !x ? "inputs" : "labels");
        c = 0;
        f->cur_k = -1;
        st = f->be->write(s->ctx, f->x[c], 0, x, (size_t)b->n * f->xs);
        if (!st) st = f->be->write(s->ctx, f->y[c], 0, y, (size_t)b->n * f->ys);
    }
    drop(f, &f->begin[c]);
    if (!st) st = f->be->event_mark(s->ctx, &f->begin[c]);
    *slot = c;
    return st;
}

void fr_feed_bind(fr_step *s, int slot, int off) {
    fr_feed *f = s->place.feed;
    fr_exec_bind_dev(&s->ex, s->g.input, f->x[slot], (size_t)off * f->xs);
    fr_exec_bind_dev(&s->ex, s->g.label, f->y[slot], (size_t)off * f->ys);
}

fr_status fr_feed_release(fr_step *s, int slot) {
    fr_feed *f = s->place.feed;
    drop(f, &f->end[slot]);
    f->ran[slot] = f->cur_k;
    return f->be->event_mark(s->ctx, &f->end[slot]);
}

void fr_feed_get_stats(const fr_feed *f, fr_feed_stats *out) { *out = f->stats; }
