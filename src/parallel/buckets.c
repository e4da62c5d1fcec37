/* buckets.c — gradient buckets summed over the ranks (see buckets.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "parallel/buckets.h"
#include "parallel/shard.h"
#include "core/names.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

fr_status fr_buckets_plan(fr_ctx *ctx, int n, const size_t *grad_floats, const int *last_pos,
                          const int *first_pos, size_t first_cap, size_t cap, fr_buckets *b) {
    memset(b, 0, sizeof *b);
    b->n_params = n;
    b->overlap = 1;
    if (!first_cap) first_cap = FR_BUCKET_FIRST_CAP;
    if (!cap) cap = FR_BUCKET_CAP;
    if (first_cap > cap) first_cap = cap;
    size_t np = (size_t)n + 1;
    b->bucket_of = fr_alloc(ctx, np * sizeof *b->bucket_of, FR_MEM_OTHER);
    b->off = fr_alloc(ctx, np * sizeof *b->off, FR_MEM_OTHER);
    /* at most one bucket a parameter */
    b->len = fr_calloc(ctx, np * sizeof *b->len, FR_MEM_OTHER);
    b->ready_pos = fr_alloc(ctx, np * sizeof *b->ready_pos, FR_MEM_OTHER);
    b->first_pos = fr_alloc(ctx, np * sizeof *b->first_pos, FR_MEM_OTHER);
    b->done = fr_calloc(ctx, np, FR_MEM_OTHER);
    b->buf = fr_calloc(ctx, np * sizeof *b->buf, FR_MEM_OTHER);
    b->started = fr_calloc(ctx, np, FR_MEM_OTHER);
    b->start = fr_calloc(ctx, np * sizeof *b->start, FR_MEM_OTHER);
    if (!b->bucket_of || !b->off || !b->len || !b->ready_pos || !b->buf || !b->started ||
        !b->start || !b->first_pos || !b->done) {
        fr_buckets_release(ctx, b);
        return FR_ERR_NOMEM;
    }
    /* reverse parameter order; a bucket closes once it reaches its cap */
    int k = -1;
    size_t limit = first_cap;
    for (int i = n - 1; i >= 0; i--) {
        b->bucket_of[i] = -1;
        if (!grad_floats[i]) continue;
        if (k < 0 || b->len[k] * sizeof(float) >= limit) {
            if (k >= 0) limit = cap;
            k++;
            b->ready_pos[k] = -1;
            b->first_pos[k] = first_pos[i];
        }
        b->bucket_of[i] = k;
        b->off[i] = b->len[k];
        b->len[k] += grad_floats[i];
        if (last_pos[i] > b->ready_pos[k]) b->ready_pos[k] = last_pos[i];
        if (first_pos[i] < b->first_pos[k]) b->first_pos[k] = first_pos[i];
    }
    b->n = k + 1;
    for (int j = 0; j < b->n; j++) b->start[j] = b->total, b->total += b->len[j];
    b->hi = b->total;
    return FR_OK;
}

void fr_buckets_shard(fr_buckets *b, int zero, int rank, int ranks) {
    b->zero = zero;
    if (zero >= 1) fr_shard_range(b->total, ranks, rank, &b->lo, &b->hi);
}

size_t fr_buckets_flat(const fr_buckets *b, int i) {
    return b->bucket_of[i] < 0 ? 0 : b->start[b->bucket_of[i]] + b->off[i];
}

fr_status fr_buckets_take(fr_ctx *ctx, fr_buckets *b, int k) {
    if (b->buf[k]) return FR_OK;
    fr_mem_set_tag(ctx, "grad buckets");
    b->buf[k] = fr_calloc(ctx, b->len[k] * sizeof(float), FR_MEM_GRADS);
    fr_mem_set_tag(ctx, NULL);
    return b->buf[k] ? FR_OK : FR_ERR_NOMEM;
}

/* The first later position where another bucket starts. */
int fr_buckets_free_pos(const fr_buckets *b, int k, int n_pos) {
    if (!b->overlap) return n_pos;
    int at = n_pos;
    for (int j = 0; j < b->n; j++)
        if (b->ready_pos[j] > b->ready_pos[k] && b->ready_pos[j] < at) at = b->ready_pos[j];
    return at;
}

void fr_buckets_peak(const fr_buckets *b, int n_pos, int accumulate, size_t *peak,
                     size_t *reserved) {
    *peak = *reserved = 0;
    for (int q = 0; q <= n_pos; q++) {
        size_t live = 0, res = 0;
        for (int k = 0; k < b->n; k++) {
            /* with accumulation every block is held from the first micro-batch on */
            int held =
                accumulate > 1 || (b->first_pos[k] <= q && q <= fr_buckets_free_pos(b, k, n_pos));
            if (!held) continue;
            live += b->len[k] * sizeof(float);
            res += fr_mem_block_bytes(b->len[k] * sizeof(float));
        }
        if (live > *peak) *peak = live;
        if (res > *reserved) *reserved = res;
    }
}

fr_status fr_buckets_alloc(fr_ctx *ctx, fr_buckets *b, float *flat) {
    if (b->zero >= 2 && !b->shard && b->hi > b->lo && !b->on_share) {
        fr_mem_set_tag(ctx, "grad shard");
        b->shard = fr_calloc(ctx, (b->hi - b->lo) * sizeof(float), FR_MEM_GRADS);
        fr_mem_set_tag(ctx, NULL);
        if (!b->shard) return FR_ERR_NOMEM;
    }
    if (b->zero >= 2) return FR_OK; /* each bucket taken before its first writer */
    if (!flat && b->total)
        return fr_fail(ctx, FR_ERR_ARG, "gradient buckets without a gradient block");
    b->views = 1; /* the flat gradient block's: bucket k is its elements from start[k] */
    for (int k = 0; k < b->n; k++) b->buf[k] = flat + b->start[k];
    return FR_OK;
}

void fr_buckets_release(fr_ctx *ctx, fr_buckets *b) {
    for (int k = 0; b->buf && k < b->n && !b->views; k++) fr_free(ctx, b->buf[k]);
    fr_free(ctx, b->shard);
    fr_free(ctx, b->start);
    fr_free(ctx, b->bucket_of);
    fr_free(ctx, b->off);
    fr_free(ctx, b->len);
    fr_free(ctx, b->ready_pos);
    fr_free(ctx, b->first_pos);
    fr_free(ctx, b->done);
    fr_free(ctx, b->buf);
    fr_free(ctx, b->started);
    memset(b, 0, sizeof *b);
}

float *fr_buckets_grad(const fr_buckets *b, int i) {
    if (i < 0 || i >= b->n_params || b->bucket_of[i] < 0 || !b->buf[b->bucket_of[i]]) return NULL;
    return b->buf[b->bucket_of[i]] + b->off[i];
}

void fr_buckets_begin(fr_buckets *b) {
    memset(b->started, 0, (size_t)b->n);
    memset(b->done, 0, (size_t)b->n);
}

/* Stages 2 and 3: bucket k waited for, its share copied into the shard,
 * its block freed. */
static fr_status complete(fr_ctx *ctx, fr_comm *c, fr_buckets *b, int k) {
    char what[64];
    snprintf(what, sizeof what, "gradient bucket %d of %d", k + 1, b->n);
    double t0 = now_s();
    fr_status st = fr_comm_wait(ctx, c, k, what);
    b->wait_s += now_s() - t0;
    if (st) return st;
    size_t s0 = b->start[k], s1 = s0 + b->len[k];
    size_t a = b->lo > s0 ? b->lo : s0, e = b->hi < s1 ? b->hi : s1;
    if (b->on_share && e > a) st = b->on_share(b->free_arg, k, b->buf[k], a, e);
    else if (e > a) memcpy(b->shard + (a - b->lo), b->buf[k], (e - a) * sizeof(float));
    if (st) return st;
    if (b->on_free) b->on_free(b->free_arg, k);
    fr_free(ctx, b->buf[k]);
    b->buf[k] = NULL;
    b->done[k] = 1;
    return FR_OK;
}

static fr_status start(fr_ctx *ctx, fr_comm *c, fr_buckets *b, int k) {
    b->started[k] = 1;
    char what[64];
    snprintf(what, sizeof what, "gradient bucket %d of %d", k + 1, b->n);
    if (b->zero >= 1)
        return fr_comm_isum_scatter_f32(ctx, c, k, b->buf[k], b->start[k], b->len[k], b->total,
                                        what);
    return fr_comm_isum_f32(ctx, c, k, b->buf[k], b->len[k], what);
}

fr_status fr_buckets_after_node(fr_ctx *ctx, fr_comm *c, fr_buckets *b, int pos) {
    fr_status st = FR_OK;
    int any = 0, starts = 0;
    for (int k = 0; k < b->n && b->overlap && b->zero >= 2; k++) starts |= b->ready_pos[k] == pos;
    /* stages 2 and 3: before another bucket starts, the earlier ones are freed */
    for (int k = 0; k < b->n && !st && starts; k++)
        if (b->started[k] && !b->done[k] && b->ready_pos[k] < pos) st = complete(ctx, c, b, k);
    for (int k = 0; k < b->n && !st; k++) {
        if (b->started[k]) any = 1;
        else if (b->overlap && b->ready_pos[k] == pos) st = start(ctx, c, b, k), any = 1;
    }
    return st || !any ? st : fr_comm_test_all(ctx, c);
}

fr_status fr_buckets_finish(fr_ctx *ctx, fr_comm *c, fr_buckets *b) {
    fr_status st = FR_OK;
    for (int k = 0; k < b->n && !st; k++)
        if (!b->started[k]) st = start(ctx, c, b, k);
    for (int k = 0; k < b->n && !st && b->zero >= 2; k++)
        if (!b->done[k]) st = complete(ctx, c, b, k);
    double t0 = now_s();
    if (!st) st = fr_comm_wait_all(ctx, c, "the gradient buckets");
    b->wait_s += now_s() - t0;
    b->reductions++;
    if (b->zero >= 2) return st;
    /* ZeRO 1: this rank's share of each bucket's sum came first (MPI's
     * in-place rule): to its place in the bucket */
    for (int k = 0; k < b->n && !st && b->zero >= 1 && fr_comm_size(c) > 1; k++) {
        size_t s0 = b->start[k], s1 = s0 + b->len[k];
        size_t a = b->lo > s0 ? b->lo : s0, e = b->hi < s1 ? b->hi : s1;
        if (e <= a) continue;
        memmove(b->buf[k] + (a - s0), b->buf[k], (e - a) * sizeof(float));
    }
    return st;
}

int fr_buckets_describe(const fr_buckets *b, char *buf, size_t len) {
    int w = snprintf(buf, len, "%d bucket%s (", b->n, b->n == 1 ? "" : "s");
    for (int k = 0; k < b->n && w >= 0 && (size_t)w < len; k++) {
        char h[32];
        w += snprintf(buf + w, len - (size_t)w, "%s%s", k ? ", " : "",
                      fr_human_bytes(b->len[k] * sizeof(float), h, sizeof h));
    }
    if (w >= 0 && (size_t)w < len) w += snprintf(buf + w, len - (size_t)w, ")");
    return w;
}
