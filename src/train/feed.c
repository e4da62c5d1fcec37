/* feed.c — batches uploaded into two device slots ahead of their step (see
 * feed.h).
 *
 * Who touches what, and when (all calls come from the thread that runs the
 * step; the only concurrency is the device's two queues and the loader's own
 * thread, which never sees a device slot):
 *   - slot j is written only by the upload enqueued in submit(), whose wait
 *     list holds end[j], the mark the step's queue put after its last read
 *     of j: the upload cannot start while a step still reads the slot;
 *   - the step reads slot j only after a barrier on up[j] (acquire), so it
 *     never sees the slot half written;
 *   - the upload reads the loader's host batch asynchronously; that batch
 *     stays the loader's until the next fr_batches_next or fr_batches_start,
 *     and each of those comes only after waiting for up[] (fr_feed_next,
 *     fr_feed_start, fr_feed_drain), so the loader never refills memory an
 *     upload still reads;
 *   - the labels the host needs after the loader has moved on (the step's
 *     hits) are copied at submit() into the slot's host copy, which the next
 *     submit into the same slot overwrites only after that slot's step. */
#include <string.h>
#include "train/device.h"
#include "train/feed.h"

int fr_feed_used(const fr_step *s) {
    return fr_step_on_device(s) && s->o.training && !s->o.sync_upload;
}

/* Bytes a sample takes of the graph's input and label values. */
static size_t sample_bytes(const fr_step *s, int v) {
    return fr_value_bytes(&s->g.vals[v]) / (size_t)s->micro;
}
static size_t whole(const fr_step *s) { return (size_t)s->micro * (size_t)s->accumulate; }

size_t fr_feed_reserved(const fr_step *s) {
    const fr_mem *dm = s->ctx->dmem;
    size_t xb = sample_bytes(s, s->g.input) * whole(s), yb = sample_bytes(s, s->g.label) * whole(s);
    return 2 * (fr_mem_class_bytes(dm, xb) + fr_mem_class_bytes(dm, yb));
}

#if FR_HAVE_OPENCL
#include "backend/opencl/backend.h"

struct fr_feed {
    fr_ctx *ctx;
    fr_cl *cl;
    cl_command_queue q; /* the uploads' queue (profiled) */
    void *x[2], *y[2];  /* the slots: cl_mem from the backend's allocator (data) */
    int32_t *labels[2]; /* host copies of their labels (cross-entropy only) */
    int n[2];           /* samples in each */
    size_t xs, ys;      /* bytes per sample */
    int ce, tokens;
    fr_batches *l;
    cl_event upx[2], up[2];    /* a slot's upload: its inputs' write, its labels' (the last) */
    cl_event begin[2], end[2]; /* the last step on a slot: after its barrier, after its reads */
    int64_t gen[2], gen_up[2]; /* steps run on a slot; that count when the other was uploaded */
    int pending;               /* the slot uploaded ahead and not handed out yet, or -1 */
    int cur;                   /* the slot handed out last, or -1 */
    fr_feed_stats stats;
};

static void drop(cl_event *e) {
    if (*e) clReleaseEvent(*e);
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
    f->cl = fr_cl_of(ctx);
    f->pending = f->cur = -1;
    f->ce = s->m->loss == FR_LOSS_CROSS_ENTROPY;
    f->tokens = s->m->in_dtype == FR_I32;
    f->xs = sample_bytes(s, s->g.input);
    f->ys = sample_bytes(s, s->g.label);
    size_t w = whole(s);
    for (int i = 0; i < 2; i++) {
        if (!(f->x[i] = be->alloc(ctx, f->xs * w, FR_MEM_DATA)) ||
            !(f->y[i] = be->alloc(ctx, f->ys * w, FR_MEM_DATA)) ||
            (f->ce && !(f->labels[i] = fr_alloc(ctx, f->ys * w, FR_MEM_DATA)))) {
            fr_feed_free(f);
            return FR_ERR_NOMEM;
        }
    }
    if ((st = fr_cl_queue_new(ctx, f->cl, &f->q))) {
        fr_feed_free(f);
        return st;
    }
    *out = f;
    return FR_OK;
}

void fr_feed_free(fr_feed *f) {
    if (!f) return;
    const fr_backend *be = fr_backend_of(f->ctx);
    fr_cl_queue_free(f->q); /* finishes what is in flight first */
    for (int i = 0; i < 2; i++) {
        drop(&f->upx[i]), drop(&f->up[i]), drop(&f->begin[i]), drop(&f->end[i]);
        be->release(f->ctx, f->x[i]);
        be->release(f->ctx, f->y[i]);
        fr_free(f->ctx, f->labels[i]);
    }
    fr_free(f->ctx, f);
}

/* Upload host batch b into slot j, behind the last step that read j. */
static fr_status submit(fr_feed *f, const fr_batch *b, int j) {
    const char *x = f->tokens ? (const char *)b->idx : (const char *)b->x;
    const char *y = f->ce ? (const char *)b->y : (const char *)b->target;
    cl_uint nw = f->end[j] ? 1 : 0;
    drop(&f->upx[j]), drop(&f->up[j]);
    fr_status st = fr_cl_write_on(f->ctx, f->q, (cl_mem)f->x[j], 0, x, (size_t)b->n * f->xs, nw,
                                  &f->end[j], &f->upx[j]);
    if (!st)
        st = fr_cl_write_on(f->ctx, f->q, (cl_mem)f->y[j], 0, y, (size_t)b->n * f->ys, 0, NULL,
                            &f->up[j]);
    if (st) return st;
    if (f->ce) memcpy(f->labels[j], b->y, (size_t)b->n * f->ys);
    f->n[j] = b->n;
    f->gen_up[j] = f->gen[1 - j];
    f->pending = j;
    return FR_OK;
}

/* Wait for everything the upload queue holds: the loader's host batches are
 * then free to be refilled. */
static fr_status drain(fr_feed *f) {
    return fr_cl_check(f->ctx, clFinish(f->q), "clFinish (the upload queue)");
}

fr_status fr_feed_start(fr_feed *f, fr_batches *l, int epoch, int64_t skip) {
    fr_status st = drain(f);
    if (st || (st = fr_batches_start(l, epoch, skip))) return st;
    f->l = l;
    f->pending = f->cur = -1;
    fr_batch b;
    int done = 0;
    if ((st = fr_batches_next(l, &b, &done)) || done) return st;
    return submit(f, &b, 0);
}

static double at_us(cl_event e, cl_profiling_info what) {
    cl_ulong t = 0;
    clGetEventProfilingInfo(e, what, sizeof t, &t, NULL);
    return (double)t * 1e-3;
}

/* Slot p's upload has completed: count it, and whether it ran beside the
 * step on the other slot, the one enqueued after it (if one ran): it
 * overlapped when it started before that step ended (a synchronous upload
 * starts only after), for the time both intervals share. */
static void account(fr_feed *f, int p) {
    double u0 = at_us(f->upx[p], CL_PROFILING_COMMAND_START);
    double u1 = at_us(f->up[p], CL_PROFILING_COMMAND_END);
    f->stats.uploads++;
    f->stats.upload_us += u1 - u0;
    int o = 1 - p;
    if (f->gen[o] <= f->gen_up[p] || clWaitForEvents(1, &f->end[o]) != CL_SUCCESS) return;
    double s0 = at_us(f->begin[o], CL_PROFILING_COMMAND_END);
    double s1 = at_us(f->end[o], CL_PROFILING_COMMAND_END);
    if (u0 >= s1) return;
    double lo = u0 > s0 ? u0 : s0, hi = u1 < s1 ? u1 : s1;
    f->stats.overlapped++;
    f->stats.overlap_us += hi > lo ? hi - lo : 0;
}

fr_status fr_feed_next(fr_feed *f, fr_batch *out, int *done) {
    memset(out, 0, sizeof *out);
    *done = 0;
    if (!f->l) return fr_fail(f->ctx, FR_ERR_ARG, "fr_feed_next before fr_feed_start");
    int p = f->pending;
    if (p < 0) {
        *done = 1;
        return FR_OK;
    }
    /* the loader's host batch under slot p goes back with the next call */
    fr_status st = fr_cl_check(f->ctx, clWaitForEvents(1, &f->up[p]), "an upload into a slot");
    if (st) return st;
    account(f, p);
    f->pending = -1;
    f->cur = p;
    fr_batch b;
    int end = 0;
    if ((st = fr_batches_next(f->l, &b, &end))) return st;
    if (!end && (st = submit(f, &b, 1 - p))) return st;
    out->n = f->n[p];
    out->y = f->labels[p];
    return FR_OK;
}

fr_status fr_feed_drain(fr_feed *f) {
    fr_status st = drain(f);
    f->pending = -1;
    return st;
}

int fr_feed_holds(const fr_feed *f, const fr_batch *b) {
    int c = f->cur;
    return c >= 0 && !b->x && !b->idx && !b->target && b->y == f->labels[c] && b->n == f->n[c];
}

fr_status fr_feed_acquire(fr_step *s, const fr_batch *b, int *slot) {
    fr_feed *f = s->feed;
    int c = f->cur;
    fr_status st;
    if (fr_feed_holds(f, b)) {
        st = fr_cl_wait_for(s->ctx, f->cl, 1, &f->up[c]);
    } else { /* a host batch: into the slot no upload is writing, on the step's queue */
        const char *x = f->tokens ? (const char *)b->idx : (const char *)b->x;
        const char *y = f->ce ? (const char *)b->y : (const char *)b->target;
        if (!x || !y)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "a batch without its %s: give the step a loader's batch",
                           !x ? "inputs" : "labels");
        c = f->pending >= 0 ? 1 - f->pending : 0;
        f->cur = -1; /* a batch handed out in slot c is gone */
        const fr_backend *be = fr_backend_of(s->ctx);
        st = be->write(s->ctx, f->x[c], 0, x, (size_t)b->n * f->xs);
        if (!st) st = be->write(s->ctx, f->y[c], 0, y, (size_t)b->n * f->ys);
    }
    drop(&f->begin[c]);
    if (!st) st = fr_cl_mark(s->ctx, f->cl, &f->begin[c]);
    *slot = c;
    return st;
}

void fr_feed_bind(fr_step *s, int slot, int off) {
    fr_feed *f = s->feed;
    fr_exec_bind_dev(&s->ex, s->g.input, f->x[slot], (size_t)off * f->xs);
    fr_exec_bind_dev(&s->ex, s->g.label, f->y[slot], (size_t)off * f->ys);
}

fr_status fr_feed_release(fr_step *s, int slot) {
    fr_feed *f = s->feed;
    drop(&f->end[slot]);
    f->gen[slot]++;
    return fr_cl_mark(s->ctx, f->cl, &f->end[slot]);
}

void fr_feed_get_stats(const fr_feed *f, fr_feed_stats *out) { *out = f->stats; }

#else /* built without OpenCL: no step runs on a device, so none is fed
         * (fr_feed_used is 0); fr_feed_new refuses, and no fr_feed exists
         * for the others to be given */

fr_status fr_feed_new(fr_step *s, fr_feed **out) {
    *out = NULL;
    return fr_fail(s->ctx, FR_ERR_ARG, "batch uploads need a device: built without OpenCL");
}
void fr_feed_free(fr_feed *f) { (void)f; }
fr_status fr_feed_start(fr_feed *f, fr_batches *l, int epoch, int64_t skip) {
    (void)f;
    return fr_batches_start(l, epoch, skip);
}
fr_status fr_feed_next(fr_feed *f, fr_batch *out, int *done) {
    (void)f, (void)out;
    *done = 1;
    return FR_OK;
}
fr_status fr_feed_drain(fr_feed *f) {
    (void)f;
    return FR_OK;
}
fr_status fr_feed_acquire(fr_step *s, const fr_batch *b, int *slot) {
    (void)b, (void)slot;
    return fr_fail(s->ctx, FR_ERR_ARG, "batch uploads need a device: built without OpenCL");
}
int fr_feed_holds(const fr_feed *f, const fr_batch *b) {
    (void)f, (void)b;
    return 0;
}
void fr_feed_bind(fr_step *s, int slot, int off) { (void)s, (void)slot, (void)off; }
fr_status fr_feed_release(fr_step *s, int slot) {
    (void)s, (void)slot;
    return FR_OK;
}
void fr_feed_get_stats(const fr_feed *f, fr_feed_stats *out) {
    (void)f;
    memset(out, 0, sizeof *out);
}
#endif
