/* buckets.c — gradient buckets summed over the ranks (see buckets.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "dist/buckets.h"
#include "dist/shard.h"
#include "report/report.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

fr_status fr_buckets_plan(fr_ctx *ctx, int n, const size_t *grad_floats, const int *last_pos,
                          size_t first_cap, size_t cap, fr_buckets *b) {
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
    b->buf = fr_calloc(ctx, np * sizeof *b->buf, FR_MEM_OTHER);
    b->started = fr_calloc(ctx, np, FR_MEM_OTHER);
    b->start = fr_calloc(ctx, np * sizeof *b->start, FR_MEM_OTHER);
    if (!b->bucket_of || !b->off || !b->len || !b->ready_pos || !b->buf || !b->started ||
        !b->start) {
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
        }
        b->bucket_of[i] = k;
        b->off[i] = b->len[k];
        b->len[k] += grad_floats[i];
        if (last_pos[i] > b->ready_pos[k]) b->ready_pos[k] = last_pos[i];
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

void fr_buckets_drop(fr_ctx *ctx, fr_buckets *b) {
    for (int k = 0; k < b->n; k++) fr_free(ctx, b->buf[k]), b->buf[k] = NULL;
}

fr_status fr_buckets_alloc(fr_ctx *ctx, fr_buckets *b) {
    if (b->zero >= 2 && !b->shard && b->hi > b->lo) {
        fr_mem_set_tag(ctx, "grad shard");
        b->shard = fr_calloc(ctx, (b->hi - b->lo) * sizeof(float), FR_MEM_GRADS);
        fr_mem_set_tag(ctx, NULL);
        if (!b->shard) return FR_ERR_NOMEM;
    }
    fr_mem_set_tag(ctx, "grad buckets");
    for (int k = 0; k < b->n; k++)
        if (!b->buf[k] && !(b->buf[k] = fr_calloc(ctx, b->len[k] * sizeof(float), FR_MEM_GRADS)))
            return FR_ERR_NOMEM;
    fr_mem_set_tag(ctx, NULL);
    return FR_OK;
}

size_t fr_buckets_reserved(const fr_buckets *b) {
    size_t r = 0;
    for (int k = 0; k < b->n; k++) r += fr_mem_block_bytes(b->len[k] * sizeof(float));
    return r;
}

void fr_buckets_release(fr_ctx *ctx, fr_buckets *b) {
    for (int k = 0; b->buf && k < b->n; k++) fr_free(ctx, b->buf[k]);
    fr_free(ctx, b->shard);
    fr_free(ctx, b->start);
    fr_free(ctx, b->bucket_of);
    fr_free(ctx, b->off);
    fr_free(ctx, b->len);
    fr_free(ctx, b->ready_pos);
    fr_free(ctx, b->buf);
    fr_free(ctx, b->started);
    memset(b, 0, sizeof *b);
}

float *fr_buckets_grad(const fr_buckets *b, int i) {
    if (i < 0 || i >= b->n_params || b->bucket_of[i] < 0 || !b->buf[b->bucket_of[i]]) return NULL;
    return b->buf[b->bucket_of[i]] + b->off[i];
}

void fr_buckets_begin(fr_buckets *b) { memset(b->started, 0, (size_t)b->n); }

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
    int any = 0;
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
    double t0 = now_s();
    if (!st) st = fr_comm_wait_all(ctx, c, "the gradient buckets");
    b->wait_s += now_s() - t0;
    b->reductions++;
    /* ZeRO: this rank's share of each bucket's sum came first (MPI's in-place
     * rule): to its place in the bucket, or into the shard */
    for (int k = 0; k < b->n && !st && b->zero >= 1 && fr_comm_size(c) > 1; k++) {
        size_t s0 = b->start[k], s1 = s0 + b->len[k];
        size_t a = b->lo > s0 ? b->lo : s0, e = b->hi < s1 ? b->hi : s1;
        if (e <= a) continue;
        if (b->zero >= 2) memcpy(b->shard + (a - b->lo), b->buf[k], (e - a) * sizeof(float));
        else memmove(b->buf[k] + (a - s0), b->buf[k], (e - a) * sizeof(float));
    }
    if (!st && b->zero >= 2 && fr_comm_size(c) == 1)
        for (int k = 0; k < b->n; k++)
            memcpy(b->shard + b->start[k], b->buf[k], b->len[k] * sizeof(float));
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
