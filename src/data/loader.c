/* loader.c — batches from a dataset (see loader.h): the per-epoch
 * permutation, batching with drop_last and resume, and the prefetch thread.
 * Owns the batch buffers (category DATA) and the permutation (category
 * OTHER: 8 bytes of index per sample); knows nothing of file formats.
 *
 * Shuffling and prefetching are prefetch.h's (the order depends only on
 * (seed, epoch, n)); batch k holds perm[k*batch ..). A slot of the ring is
 * one batch of x and of y (class labels) or t (regression targets,
 * `outputs` floats a sample). DATA memory is exactly
 * (q + 1) * batch * (c*h*w * sizeof(float) + sizeof(int32_t)) bytes (with
 * targets: + outputs * sizeof(float) instead of the int32), for q = 0 too
 * (one slot, filled in next()); with ranks, `batch` there is the largest
 * slice, ceil(batch / ranks), as a rank reads only its own slice. A read error on the prefetch thread is
 * reported by fr_loader_next when it reaches the batch that failed. */
#include <inttypes.h>
#include <string.h>
#include "data/loader.h"
#include "data/prefetch.h"

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
    int slot;      /* samples a slot holds: the batch, or the largest rank slice of it */
    int last_n;    /* the global batch of the last slice returned */
    fr_prefetch pf;
};

static int batch_count(const fr_loader *l, int64_t k) {
    int64_t left = l->n - k * l->o.batch;
    return (int)(left < l->o.batch ? left : l->o.batch);
}

int fr_loader_slice(int n, int rank, int ranks, int *first) {
    if (ranks <= 1) return *first = 0, n;
    int lo = (int)((int64_t)rank * n / ranks), hi = (int)((int64_t)(rank + 1) * n / ranks);
    *first = lo;
    return hi - lo;
}

int64_t fr_loader_rank_samples(int64_t n_samples, int batch, int rank, int ranks) {
    int first, whole = fr_loader_slice(batch, rank, ranks, &first);
    int64_t full = n_samples / batch, left = n_samples % batch;
    return full * whole + (left ? fr_loader_slice((int)left, rank, ranks, &first) : 0);
}

/* this rank's slice of batch k: its first sample in the batch and its count */
static int slice_of(const fr_loader *l, int64_t k, int *first) {
    return fr_loader_slice(batch_count(l, k), l->o.rank, l->o.ranks, first);
}

static float *slot_x(const fr_loader *l, int64_t k) {
    return l->x + (size_t)(k % l->nslots) * (size_t)l->slot * l->sample;
}

static int32_t *slot_y(const fr_loader *l, int64_t k) {
    return l->y ? l->y + (size_t)(k % l->nslots) * (size_t)l->slot : NULL;
}

static float *slot_t(const fr_loader *l, int64_t k) {
    return l->t ? l->t + (size_t)(k % l->nslots) * (size_t)l->slot * (size_t)l->outputs : NULL;
}

/* batch k (this rank's slice of it) into its slot (on the prefetch thread,
 * or in next() without one) */
static fr_status fill(void *user, int64_t k, char *err, size_t errlen) {
    fr_loader *l = user;
    int first, n = slice_of(l, k, &first);
    return fr_dataset_read_r(l->ds, l->perm + k * l->o.batch + first, n, slot_x(l, k), slot_y(l, k),
                             slot_t(l, k), err, errlen);
}

/* samples a slot holds: the largest slice of a whole batch (ceil(batch / ranks)) */
static int slot_samples(const fr_loader_opts *o) {
    return o->ranks > 1 ? (o->batch + o->ranks - 1) / o->ranks : o->batch;
}

/* batch k (this rank's slice) as next() hands it out */
static void view(void *user, int64_t k, fr_batch *out) {
    const fr_loader *l = user;
    int first;
    memset(out, 0, sizeof *out);
    out->n = slice_of(l, k, &first);
    out->x = slot_x(l, k);
    out->y = slot_y(l, k);
    out->target = slot_t(l, k);
}

size_t fr_loader_reserved(int64_t n, size_t sample, const fr_loader_opts *o) {
    if (o->limit > 0 && o->limit < n) n = o->limit;
    size_t slots = (size_t)o->queue + 1, batch = (size_t)slot_samples(o);
    return fr_mem_block_bytes(sizeof(fr_loader)) + fr_mem_block_bytes((size_t)n * sizeof(int64_t)) +
           fr_mem_block_bytes(slots * batch * sample * sizeof(float)) +
           fr_mem_block_bytes(slots * batch * sizeof(int32_t));
}

fr_loader *fr_loader_new(fr_ctx *ctx, fr_dataset *ds, const fr_loader_opts *o) {
    if (!ds || !o || o->batch < 1 || o->queue < 0 || o->limit < 0 || o->ranks < 0 ||
        (o->ranks > 0 && (o->rank < 0 || o->rank >= o->ranks))) {
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
    int slot = slot_samples(o);
    size_t nslots = (size_t)o->queue + 1, per_slot,
           y_per = outputs ? (size_t)outputs * sizeof(float) : sizeof(int32_t);
    size_t xbytes, ybytes;
    if (__builtin_mul_overflow(sample * sizeof(float), (size_t)slot, &per_slot) ||
        __builtin_mul_overflow(per_slot, nslots, &xbytes) ||
        __builtin_mul_overflow(y_per * (size_t)slot, nslots, &ybytes)) {
        fr_fail(ctx, FR_ERR_ARG, "loader: batch %d with queue %d overflows memory sizes", o->batch,
                o->queue);
        return NULL;
    }
    fr_loader *l = fr_calloc(ctx, sizeof *l, FR_MEM_OTHER);
    if (!l) return NULL;
    l->ctx = ctx;
    l->ds = ds;
    l->o = *o;
    l->slot = slot;
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
    if (fr_prefetch_init(&l->pf, ctx, "loader", o->queue, fill, view, l)) goto fail;
    return l;
fail:
    fr_loader_free(l);
    return NULL;
}

void fr_loader_free(fr_loader *l) {
    if (!l) return;
    fr_prefetch_destroy(&l->pf);
    fr_ctx *ctx = l->ctx;
    fr_free(ctx, l->y);
    fr_free(ctx, l->t);
    fr_free(ctx, l->x);
    fr_free(ctx, l->perm);
    fr_free(ctx, l);
}

int64_t fr_loader_num_batches(const fr_loader *l) { return l->nb; }

fr_status fr_loader_start(fr_loader *l, int epoch, int64_t skip) {
    l->pf.started = 0;
    if (epoch < 0 || skip < 0 || skip > l->nb)
        return fr_fail(l->ctx, FR_ERR_ARG,
                       "loader: cannot start epoch %d at batch %" PRId64 " (an epoch has %" PRId64
                       ")",
                       epoch, skip, l->nb);
    fr_prefetch_stop(&l->pf); /* before the order changes under it */
    fr_shuffle(l->perm, l->n, l->o.shuffle, l->o.seed, epoch);
    return fr_prefetch_start(&l->pf, l->nb, skip);
}

fr_status fr_loader_next(fr_loader *l, fr_batch *out, int *done) {
    memset(out, 0, sizeof *out);
    *done = 0;
    if (!l->pf.started)
        return fr_fail(l->ctx, FR_ERR_ARG, "loader: fr_loader_next before fr_loader_start");
    int64_t k = 0;
    int first;
    /* a slice can be empty only in a last batch smaller than the ranks:
     * evaluation passes over it (training refuses such a batch up front) */
    do {
        fr_status st = fr_prefetch_next(&l->pf, &k, done);
        if (st || *done) return st;
    } while (!slice_of(l, k, &first));
    l->last_n = batch_count(l, k);
    view(l, k, out);
    return FR_OK;
}

int fr_loader_global_n(const fr_loader *l) { return l->last_n; }

void fr_loader_set_hand(fr_loader *l, fr_hand_fn hand, void *user, int lag) {
    fr_prefetch_set_hand(&l->pf, hand, user, lag);
}
