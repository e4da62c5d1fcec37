/* feed.h — batches uploaded to the device ahead of the step that reads them
 * (the side-stream prefetch of PyTorch users: the next batch copied while the
 * current step runs). Two device slots, each one whole batch of inputs and
 * labels (category data): while the step reads slot i on the device's queue,
 * the next batch is written into slot 1-i on an upload queue of its own. The
 * step's queue waits for its slot's upload (a barrier on the upload's event)
 * and marks when it is done with it; the upload into a slot waits for that
 * mark, so neither side sees the other half-way. Micro-batches bind offsets
 * into the slot. Training steps on a device only; on the CPU, in an eval
 * step, or with fr_step_opts.sync_upload, batches are written by the step
 * itself into a micro-batch's buffers (fr_dev_batch). */
#ifndef FR_FEED_H
#define FR_FEED_H

#include "train/source.h"
#include "train/step.h"

typedef struct fr_feed fr_feed;

/* Whether a materialized s uploads through a feed (a device training step
 * without sync_upload). */
int fr_feed_used(const fr_step *s);
/* The feed's slots and queue for s (fr_dev_materialize calls it); the slots
 * in the device's memory, the labels' host copies in the host's. */
fr_status fr_feed_new(fr_step *s, fr_feed **out);
void fr_feed_free(fr_feed *f); /* NULL: nothing */
/* What the two slots reserve in the device's memory (fr_dev_step_reserved). */
size_t fr_feed_reserved(const fr_step *s);

/* Start an epoch of l (fr_batches_start) and upload its first batch. */
fr_status fr_feed_start(fr_feed *f, fr_batches *l, int epoch, int64_t skip);
/* The next batch, whose inputs are (or are being) uploaded into a slot, with
 * the next one's upload enqueued behind it; *done = 1 at the epoch's end.
 * out->y points to a host copy of its labels (the step's hits read them);
 * its inputs are on the device only (out->x, target and idx NULL). */
fr_status fr_feed_next(fr_feed *f, fr_batch *out, int *done);
/* Wait for the upload in flight and forget it: before the loader is
 * restarted or closed other than through fr_feed_start (its host batch is
 * read until the upload completes). */
fr_status fr_feed_drain(fr_feed *f);

/* Whether b is the batch fr_feed_next handed out last (its inputs in a slot). */
int fr_feed_holds(const fr_feed *f, const fr_batch *b);
/* In the step (fr_dev_run): the slot holding b with the queue told to wait
 * for its upload (a batch not from fr_feed_next is written into a free slot
 * first), and samples off..off+n bound as the graph's input and label; then
 * the slot released when the step has enqueued its last read of it. */
fr_status fr_feed_acquire(fr_step *s, const fr_batch *b, int *slot);
void fr_feed_bind(fr_step *s, int slot, int off);
fr_status fr_feed_release(fr_step *s, int slot);

/* Uploads so far; how many of them started before the step enqueued after
 * them ended (so did not wait for it: a synchronous upload of the next batch
 * starts only after), with the microseconds their profiled intervals share
 * with that step's (from its barrier to its release mark, the device's
 * clock) and the microseconds they took. */
typedef struct fr_feed_stats {
    int64_t uploads, overlapped;
    double upload_us, overlap_us;
} fr_feed_stats;
void fr_feed_get_stats(const fr_feed *f, fr_feed_stats *out);

#endif
