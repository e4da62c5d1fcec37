/* batches.c — one loader over either kind of data (batches.h): images
 * through fr_loader, or token windows through fr_token_loader. */
#include <string.h>
#include "data/batches.h"

void fr_batches_close(fr_batches *b) {
    fr_loader_free(b->img);
    fr_token_loader_free(b->tok);
    memset(b, 0, sizeof *b);
}

int fr_batches_global_n(const fr_batches *b) {
    return b->img ? fr_loader_global_n(b->img) : b->batch; /* training token batches are whole */
}

int64_t fr_batches_count(const fr_batches *b) {
    return b->img ? fr_loader_num_batches(b->img) : fr_token_loader_num_batches(b->tok);
}

fr_status fr_batches_start(fr_batches *b, int epoch, int64_t skip) {
    return b->img ? fr_loader_start(b->img, epoch, skip)
                  : fr_token_loader_start(b->tok, epoch, skip);
}

void fr_batches_set_hand(fr_batches *b, fr_hand_fn hand, void *user, int lag) {
    if (b->img) fr_loader_set_hand(b->img, hand, user, lag);
    else if (b->tok) fr_token_loader_set_hand(b->tok, hand, user, lag);
}

fr_status fr_batches_next(fr_batches *b, fr_batch *out, int *done) {
    if (b->img) return fr_loader_next(b->img, out, done);
    fr_token_batch tb;
    fr_status st = fr_token_loader_next(b->tok, &tb, done);
    memset(out, 0, sizeof *out);
    if (!st && !*done) {
        out->n = tb.B;
        out->idx = tb.x;
        out->y = tb.y;
    }
    return st;
}
