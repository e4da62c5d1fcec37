/* batches.h — one loader over either kind of data: images with labels or
 * targets (fr_loader), or a token stream's windows (fr_token_loader); the
 * run opens one per split (run/source.h, fr_batches_open), the device feed
 * hands its batches on (train/feed.h). */
#ifndef FR_BATCHES_H
#define FR_BATCHES_H

#include "data/loader.h"
#include "data/tokens.h"

/* A loader of batches over one split. */
typedef struct fr_batches {
    fr_loader *img;
    fr_token_loader *tok;
    int batch; /* samples a batch: the one asked, or a validation split's windows if fewer */
} fr_batches;

void fr_batches_close(fr_batches *b);
int64_t fr_batches_count(const fr_batches *b);
/* The global batch the last fr_batches_next's slice is of (its n with one
 * rank; a token loader's batches are all whole). */
int fr_batches_global_n(const fr_batches *b);
fr_status fr_batches_start(fr_batches *b, int epoch, int64_t skip);
fr_status fr_batches_next(fr_batches *b, fr_batch *out, int *done);
/* Hand each batch on from the loader's thread (loader.h); between epochs. */
void fr_batches_set_hand(fr_batches *b, fr_hand_fn hand, void *user, int lag);

#endif
