/* pshard.c — ZeRO stage 3's weight shards and per-unit gathers (see pshard.h). */
#include <stdio.h>
#include <string.h>
#include "parallel/pshard.h"
#include "parallel/shard.h"

fr_status fr_pshard_init(fr_ctx *ctx, fr_comm *c, int n, const size_t *flat, const size_t *numel,
                         const int *unit, size_t total, int rank, int ranks, int slot0,
                         fr_pshard *s) {
    memset(s, 0, sizeof *s);
    s->comm = c, s->n_params = n, s->total = total, s->slot0 = slot0;
    size_t np = (size_t)n + 1;
    int max_unit = -1;
    for (int i = 0; i < n; i++)
        if (flat[i] != FR_PSHARD_NONE && unit[i] > max_unit) max_unit = unit[i];
    s->flat = fr_alloc(ctx, np * sizeof *s->flat, FR_MEM_OTHER);
    s->numel = fr_alloc(ctx, np * sizeof *s->numel, FR_MEM_OTHER);
    s->group = fr_alloc(ctx, np * sizeof *s->group, FR_MEM_OTHER);
    size_t nu = (size_t)max_unit + 2;
    s->g_at = fr_alloc(ctx, nu * sizeof *s->g_at, FR_MEM_OTHER);
    s->g_len = fr_calloc(ctx, nu * sizeof *s->g_len, FR_MEM_OTHER);
    int *of_unit = fr_alloc(ctx, nu * sizeof *of_unit, FR_MEM_OTHER);
    size_t *end = fr_calloc(ctx, nu * sizeof *end, FR_MEM_OTHER);
    fr_status st = FR_OK;
    if (!s->flat || !s->numel || !s->group || !s->g_at || !s->g_len || !of_unit || !end) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    memcpy(s->flat, flat, (size_t)n * sizeof *flat);
    memcpy(s->numel, numel, (size_t)n * sizeof *numel);
    for (size_t u = 0; u < nu; u++) of_unit[u] = -1, s->g_at[u] = FR_PSHARD_NONE;
    /* a unit's range: its lowest and highest elements; groups numbered by range */
    for (int i = 0; i < n; i++) {
        if (flat[i] == FR_PSHARD_NONE) continue;
        int u = unit[i] < 0 ? max_unit + 1 : unit[i];
        if (s->g_at[u] == FR_PSHARD_NONE || flat[i] < s->g_at[u]) s->g_at[u] = flat[i];
        if (flat[i] + numel[i] > end[u]) end[u] = flat[i] + numel[i];
        s->g_len[u] += numel[i];
    }
    for (size_t u = 0; u < nu; u++) {
        if (s->g_at[u] == FR_PSHARD_NONE) continue;
        if (end[u] - s->g_at[u] != s->g_len[u]) {
            st = fr_fail(ctx, FR_ERR_ARG,
                         "ZeRO 3 gathers a unit's weights as one range, but unit %zu's trainable "
                         "weights are not consecutive (a frozen or tied tensor between them?)",
                         u);
            goto done;
        }
    }
    /* renumber the units that have weights by their ranges: the groups */
    for (;;) {
        size_t best = FR_PSHARD_NONE, bu = 0;
        for (size_t u = 0; u < nu; u++)
            if (of_unit[u] < 0 && s->g_at[u] != FR_PSHARD_NONE &&
                (best == FR_PSHARD_NONE || s->g_at[u] < best))
                best = s->g_at[u], bu = u;
        if (best == FR_PSHARD_NONE) break;
        of_unit[bu] = s->n_groups++;
    }
    size_t *at = fr_alloc(ctx, ((size_t)s->n_groups + 1) * sizeof *at, FR_MEM_OTHER);
    size_t *len = fr_alloc(ctx, ((size_t)s->n_groups + 1) * sizeof *len, FR_MEM_OTHER);
    if (!at || !len) {
        fr_free(ctx, at), fr_free(ctx, len);
        st = FR_ERR_NOMEM;
        goto done;
    }
    for (size_t u = 0; u < nu; u++)
        if (of_unit[u] >= 0) at[of_unit[u]] = s->g_at[u], len[of_unit[u]] = s->g_len[u];
    for (int i = 0; i < n; i++)
        s->group[i] =
            flat[i] == FR_PSHARD_NONE ? -1 : of_unit[unit[i] < 0 ? max_unit + 1 : unit[i]];
    fr_free(ctx, s->g_at), fr_free(ctx, s->g_len);
    s->g_at = at, s->g_len = len;
    if (ranks > 0) fr_shard_range(total, ranks, rank, &s->lo, &s->hi); /* 0: layout only */
    if (s->hi > s->lo) {
        fr_mem_set_tag(ctx, "weight shard");
        s->data = fr_calloc(ctx, (s->hi - s->lo) * sizeof(float), FR_MEM_PARAMS);
        fr_mem_set_tag(ctx, NULL);
        if (!s->data) st = FR_ERR_NOMEM;
    }
done:
    fr_free(ctx, of_unit);
    fr_free(ctx, end);
    if (st) fr_pshard_release(ctx, s);
    return st;
}

void fr_pshard_release(fr_ctx *ctx, fr_pshard *s) {
    fr_free(ctx, s->flat);
    fr_free(ctx, s->numel);
    fr_free(ctx, s->group);
    fr_free(ctx, s->g_at);
    fr_free(ctx, s->g_len);
    fr_free(ctx, s->data);
    memset(s, 0, sizeof *s);
}

int fr_pshard_holds(const fr_pshard *s, int i) {
    return s && i >= 0 && i < s->n_params && s->flat[i] != FR_PSHARD_NONE;
}

float *fr_pshard_slice(const fr_pshard *s, int i, size_t *a, size_t *b) {
    *a = *b = 0;
    if (!fr_pshard_holds(s, i)) return NULL;
    size_t f = s->flat[i], lo = s->lo > f ? s->lo : f;
    size_t hi = s->hi < f + s->numel[i] ? s->hi : f + s->numel[i];
    if (hi <= lo) return NULL;
    *a = lo - f, *b = hi - f;
    return s->data + (lo - s->lo);
}

void fr_pshard_keep(fr_pshard *s, int i, const float *whole) {
    size_t a, b;
    float *d = fr_pshard_slice(s, i, &a, &b);
    if (d) memcpy(d, whole + a, (b - a) * sizeof *d);
}

fr_status fr_pshard_gather_root(fr_ctx *ctx, fr_pshard *s, int i, float *full) {
    size_t a, b;
    const float *mine = fr_pshard_slice(s, i, &a, &b);
    char what[64];
    snprintf(what, sizeof what, "the weights of parameter %d", i);
    return fr_comm_gather_shards_f32(ctx, s->comm, mine ? mine : s->data, full, s->flat[i],
                                     s->numel[i], s->total, what);
}

/* ---- a step's gathers --------------------------------------------------- */

fr_status fr_gathers_plan(fr_ctx *ctx, const fr_pshard *s, int n_pos, const int *use_off,
                          const int *grp, int split, fr_gathers *g) {
    memset(g, 0, sizeof *g);
    size_t ng = (size_t)s->n_groups, cap = 2 * ng + 1;
    int *first = fr_alloc(ctx, cap * sizeof *first, FR_MEM_OTHER);
    int *last = fr_alloc(ctx, cap * sizeof *last, FR_MEM_OTHER);
    g->grp = fr_alloc(ctx, cap * sizeof *g->grp, FR_MEM_OTHER);
    g->phase = fr_alloc(ctx, cap * sizeof *g->phase, FR_MEM_OTHER);
    g->first = fr_alloc(ctx, cap * sizeof *g->first, FR_MEM_OTHER);
    g->last = fr_alloc(ctx, cap * sizeof *g->last, FR_MEM_OTHER);
    g->alloc_at = fr_alloc(ctx, cap * sizeof *g->alloc_at, FR_MEM_OTHER);
    g->buf = fr_calloc(ctx, cap * sizeof *g->buf, FR_MEM_OTHER);
    g->started = fr_calloc(ctx, cap, FR_MEM_OTHER);
    g->ready = fr_calloc(ctx, cap, FR_MEM_OTHER);
    if (!first || !last || !g->grp || !g->phase || !g->first || !g->last || !g->alloc_at ||
        !g->buf || !g->started || !g->ready) {
        fr_free(ctx, first), fr_free(ctx, last);
        fr_gathers_release(ctx, g);
        return FR_ERR_NOMEM;
    }
    /* per group and phase (0: forward, 1: backward), its first and last use */
    for (size_t k = 0; k < 2 * ng; k++) first[k] = -1, last[k] = -1;
    for (int k = 0; k < n_pos; k++)
        for (int j = use_off[k]; j < use_off[k + 1]; j++) {
            int x = 2 * grp[j] + (k > split);
            if (first[x] < 0) first[x] = k;
            last[x] = k;
        }
    /* intervals in order of first use (ties: by group) */
    for (;;) {
        int best = -1;
        for (size_t x = 0; x < 2 * ng; x++)
            if (first[x] >= 0 && (best < 0 || first[x] < first[best])) best = (int)x;
        if (best < 0) break;
        int j = g->n++;
        g->grp[j] = best / 2, g->phase[j] = best % 2;
        g->first[j] = first[best], g->last[j] = last[best];
        first[best] = -1;
    }
    /* a group whose backward gather would start while its forward block is
     * still held keeps that block (the weights change only after the step) */
    for (int merged = 1; merged;) {
        merged = 0;
        for (int j = 0; j < g->n; j++)
            g->alloc_at[j] = j ? g->first[j - 1] : g->first[0]; /* prefetched at the previous */
        for (int j = 1; j < g->n && !merged; j++)
            for (int i = 0; i < j && !merged; i++)
                if (g->grp[i] == g->grp[j] && g->alloc_at[j] <= g->last[i]) {
                    if (g->last[j] > g->last[i]) g->last[i] = g->last[j];
                    for (int q = j; q + 1 < g->n; q++) {
                        g->grp[q] = g->grp[q + 1], g->phase[q] = g->phase[q + 1];
                        g->first[q] = g->first[q + 1], g->last[q] = g->last[q + 1];
                    }
                    g->n--, merged = 1;
                }
    }
    fr_free(ctx, first), fr_free(ctx, last);
    size_t *bytes = fr_alloc(ctx, (ng + 1) * sizeof *bytes, FR_MEM_OTHER);
    if (!bytes) {
        fr_gathers_release(ctx, g);
        return FR_ERR_NOMEM;
    }
    for (size_t k = 0; k < ng; k++) bytes[k] = s->g_len[k] * sizeof(float);
    fr_gathers_peak(g, bytes, &g->peak, &g->peak_reserved);
    fr_free(ctx, bytes);
    return FR_OK;
}

void fr_gathers_peak(const fr_gathers *g, const size_t *group_bytes, size_t *peak,
                     size_t *peak_reserved) {
    *peak = *peak_reserved = 0;
    int end = 0;
    for (int j = 0; j < g->n; j++)
        if (g->last[j] > end) end = g->last[j];
    /* at position k the live blocks are those gathered at or before k (by
     * the pre-node of alloc_at) and not yet freed (after their last use) */
    for (int k = 0; k <= end && g->n; k++) {
        size_t live = 0, res = 0;
        for (int j = 0; j < g->n; j++)
            if (g->alloc_at[j] <= k && k <= g->last[j]) {
                live += group_bytes[g->grp[j]];
                res += fr_mem_block_bytes(group_bytes[g->grp[j]]);
            }
        if (live > *peak) *peak = live;
        if (res > *peak_reserved) *peak_reserved = res;
    }
}

void fr_gathers_release(fr_ctx *ctx, fr_gathers *g) {
    for (int j = 0; g->buf && j < g->n; j++) fr_free(ctx, g->buf[j]);
    fr_free(ctx, g->grp);
    fr_free(ctx, g->phase);
    fr_free(ctx, g->first);
    fr_free(ctx, g->last);
    fr_free(ctx, g->alloc_at);
    fr_free(ctx, g->buf);
    fr_free(ctx, g->started);
    fr_free(ctx, g->ready);
    memset(g, 0, sizeof *g);
}

void fr_gathers_begin(fr_gathers *g) {
    g->next = 0;
    memset(g->started, 0, (size_t)g->n);
    memset(g->ready, 0, (size_t)g->n);
}

static int slot_of(const fr_pshard *s, const fr_gathers *g, int j) {
    return s->slot0 + 2 * g->grp[j] + g->phase[j];
}

/* Interval j's block, this rank's elements copied in, the rest gathered. */
static fr_status start(fr_ctx *ctx, fr_pshard *s, fr_gathers *g, int j) {
    int k = g->grp[j];
    size_t at = s->g_at[k], len = s->g_len[k];
    g->started[j] = 1;
    fr_mem_set_tag(ctx, "gathered weights");
    g->buf[j] = fr_alloc(ctx, len * sizeof(float), FR_MEM_PARAMS);
    fr_mem_set_tag(ctx, NULL);
    if (!g->buf[j]) return FR_ERR_NOMEM;
    size_t a = s->lo > at ? s->lo : at, b = s->hi < at + len ? s->hi : at + len;
    if (b > a) memcpy(g->buf[j] + (a - at), s->data + (a - s->lo), (b - a) * sizeof(float));
    char what[64];
    snprintf(what, sizeof what, "the weights of unit group %d", k);
    g->gathers++;
    return fr_comm_iallgather_shards_f32(ctx, s->comm, slot_of(s, g, j), g->buf[j], at, len,
                                         s->total, what);
}

fr_status fr_gathers_pre(fr_ctx *ctx, fr_pshard *s, fr_gathers *g, int pos, fr_gathers_bind bind,
                         void *arg) {
    fr_status st = FR_OK;
    while (!st && g->next < g->n && g->first[g->next] == pos) {
        int j = g->next++;
        if (!g->started[j] && (st = start(ctx, s, g, j))) break;
        if ((st = fr_comm_wait(ctx, s->comm, slot_of(s, g, j), "a unit's weights"))) break;
        g->ready[j] = 1;
        bind(arg, g->grp[j], g->buf[j]);
        if (j + 1 < g->n && !g->started[j + 1]) st = start(ctx, s, g, j + 1); /* prefetch */
    }
    return st;
}

void fr_gathers_post(fr_ctx *ctx, fr_gathers *g, int pos, fr_gathers_bind bind, void *arg) {
    for (int j = 0; j < g->n; j++)
        if (g->last[j] == pos && g->ready[j] && g->buf[j]) {
            bind(arg, g->grp[j], NULL);
            fr_free(ctx, g->buf[j]);
            g->buf[j] = NULL;
        }
}

fr_status fr_gathers_end(fr_ctx *ctx, fr_pshard *s, fr_gathers *g, int ok, fr_gathers_bind bind,
                         void *arg) {
    fr_status st = FR_OK;
    for (int j = 0; j < g->n; j++) {
        if (!g->buf[j]) continue;
        if (!g->ready[j]) {
            if (!ok) continue; /* MPI may still write it: the job is ending */
            fr_status w = fr_comm_wait(ctx, s->comm, slot_of(s, g, j), "a unit's weights");
            if (w) {
                st = st ? st : w;
                continue;
            }
        }
        bind(arg, g->grp[j], NULL);
        fr_free(ctx, g->buf[j]);
        g->buf[j] = NULL;
    }
    return st;
}
