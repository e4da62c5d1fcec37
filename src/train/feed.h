/* feed.h — batches uploaded to the device ahead of the step that reads them
 * (the side-stream prefetch of PyTorch users: the next batch copied while the
 * current step runs). Two device slots, each one whole batch of inputs and
 * labels (category data): while the step reads slot i on the device's queue,
 * the next batch is written into slot 1-i on an upload queue of its own
 * (fr_backend's upload and event members: this file calls no device API),
 * enqueued by the loader's prefetch thread as soon as it has filled the
 * batch and the step before has let go of the slot, so the step's thread
 * only waits for the upload's event. The step's queue waits for its slot's
 * upload (a barrier on the upload's event) and marks when it is done with
 * it; the upload into a slot waits for that mark, so neither side sees the
 * other half-way. Micro-batches bind offsets into the slot. Only the loss
 * and the count of correct answers come back (fr_backend's hits counts them
 * on the device). Training steps on a device only; on the CPU, in an eval
 * step, or with fr_step_opts.sync_upload, the step binds each micro-batch
 * itself (fr_place_batch, train/place.c: the host's batch in place, or
 * written into a micro-batch's device buffers). */
#ifndef FR_FEED_H
#define FR_FEED_H

#include "data/batches.h"
#include "train/step.h"

typedef struct fr_feed fr_feed;

/* Whether a materialized s uploads through a feed: a training step without
 * sync_upload whose batch the backend copies into its memory (a device's). */
int fr_feed_used(const fr_step *s);
/* The feed's slots and queue for s (fr_place_materialize calls it), the slots
 * in the device's memory. */
fr_status fr_feed_new(fr_step *s, fr_feed **out);
void fr_feed_free(fr_feed *f); /* NULL: nothing */
/* What the two slots reserve in the device's memory (fr_dev_step_reserved). */
size_t fr_feed_reserved(const fr_step *s);

/* Start an epoch of l (fr_batches_start) with the feed's hand on its
 * loader: from now on the loader's thread uploads each batch it fills. */
fr_status fr_feed_start(fr_feed *f, fr_batches *l, int epoch, int64_t skip);
/* The next batch, whose upload into a slot the loader has enqueued; *done =
 * 1 at the epoch's end. Only out->n is set: its inputs and labels are on
 * the device only. Call it from the thread that runs the steps. */
fr_status fr_feed_next(fr_feed *f, fr_batch *out, int *done);
/* Stop the loader's uploads, wait for those in flight and take the hand off
 * the loader: before the loader is closed, or used other than through
 * fr_feed_start (its host batches are read until their uploads complete). */
fr_status fr_feed_drain(fr_feed *f);

/* Whether b is the batch fr_feed_next handed out last: n samples and no
 * host data. */
int fr_feed_holds(const fr_feed *f, const fr_batch *b);
/* In the step (fr_step_run): the slot holding b with the queue told to wait
 * for its upload, refused if the slot holds another batch's (a host batch,
 * outside a fed epoch, is written into slot 0 on the step's queue first),
 * and samples off..off+n bound as the graph's input and label; then the
 * slot released when the step has enqueued its last read of it. */
fr_status fr_feed_acquire(fr_step *s, const fr_batch *b, int *slot);
void fr_feed_bind(fr_step *s, int slot, int off);
fr_status fr_feed_release(fr_step *s, int slot);

/* Uploads so far; how many of them started before the step of the batch
 * before ended (so did not wait for it: a synchronous upload of the next
 * batch starts only after), with the microseconds their profiled intervals
 * share with that step's (from its barrier to its release mark, the
 * device's clock) and the microseconds they took; how many were enqueued on
 * a thread other than the step's (the loader's); and how many times a step
 * waited for its slot's upload (each time its own batch's: another's is
 * refused). */
typedef struct fr_feed_stats {
    int64_t uploads, overlapped, from_loader, waits;
    double upload_us, overlap_us;
} fr_feed_stats;
void fr_feed_get_stats(const fr_feed *f, fr_feed_stats *out);

#endif
