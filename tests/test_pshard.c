/* test_pshard.c — ZeRO stage 3's weight shards and gather schedule
 * (parallel/pshard.h), on one process (comm NULL: fr_comm_* treat it as one
 * rank, so the gathers' MPI calls are no-ops). Checked against values
 * worked out by hand in the comments:
 *  - the layout: gather groups numbered by their ranges, each rank's
 *    elements by parallel/shard.h's rule (ceil(total / ranks) per rank), the
 *    slices of parameters that cross rank boundaries, keep writing exactly
 *    the owned slice; a unit whose weights are not one range is refused;
 *  - the schedule: intervals, prefetch positions, the merge of a backward
 *    interval into its group's still-held forward block, the peak bytes of
 *    the walk (raw and as the allocator rounds the blocks);
 *  - the run: pre binds a block holding the group's weights and starts the
 *    next interval's gather, post frees after the last use, end frees what
 *    is left; the params category's peak is the shard plus the predicted
 *    peak.
 * Every allocation failing in turn is reported and leaks nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "parallel/pshard.h"
#include "core/mem.h"

static size_t params_now(fr_ctx *ctx) {
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    return st.allocated[FR_MEM_PARAMS];
}

static size_t total_now(fr_ctx *ctx) {
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    return st.allocated_total;
}

/* ---- 1. the layout -------------------------------------------------------
 * Five params (i: flat, numel, unit), total 14 elements:
 *   p0: [3, 12)  9 elements, unit 0
 *   p1: [12, 13) 1 element,  unit 0     unit 0 = [3, 13), 10 elements
 *   p2: not sharded (FR_PSHARD_NONE), 7 elements, unit 1 (no group)
 *   p3: [0, 3)   3 elements, unit 3     unit 3 = [0, 3)
 *   p4: [13, 14) 1 element,  unit 2     unit 2 = [13, 14)
 * Groups by range: unit 3 -> 0 (at 0, len 3), unit 0 -> 1 (at 3, len 10),
 * unit 2 -> 2 (at 13, len 1); group[] = {1, 1, -1, 0, 2}.
 * 3 ranks: c = ceil(14/3) = 5: rank 0 [0, 5), rank 1 [5, 10), rank 2
 * [10, 14). Slices (param-relative [a, b), offset in the shard):
 *   rank 0: p3 [0,3) at 0; p0 [0,2) at 3 (elements 3, 4); p1, p4 none
 *   rank 1: p0 [2,7) at 0 (elements 5..9); p1, p3, p4 none
 *   rank 2: p0 [7,9) at 0 (elements 10, 11); p1 [0,1) at 2; p4 [0,1) at 3
 * p0 crosses all three ranks. Whole tensors hold 100 * (i + 1) + e, so
 * after keeping every param the shards are
 *   rank 0: 400 401 402 100 101
 *   rank 1: 102 103 104 105 106
 *   rank 2: 107 108 200 500 */
enum { L_N = 5, L_TOTAL = 14 };
static const size_t L_FLAT[L_N] = {3, 12, FR_PSHARD_NONE, 0, 13};
static const size_t L_NUMEL[L_N] = {9, 1, 7, 3, 1};
static const int L_UNIT[L_N] = {0, 0, 1, 3, 2};

typedef struct slice_case {
    int rank, param;
    size_t a, b;
    long at; /* offset in the shard, -1: NULL */
} slice_case;

static void test_layout(fr_ctx *ctx) {
    static const size_t lo[3] = {0, 5, 10}, hi[3] = {5, 10, 14};
    static const float shard[3][5] = {
        {400, 401, 402, 100, 101}, {102, 103, 104, 105, 106}, {107, 108, 200, 500, 0}};
    static const slice_case sl[] = {
        {0, 0, 0, 2, 3}, {0, 1, 0, 0, -1}, {0, 2, 0, 0, -1}, {0, 3, 0, 3, 0},  {0, 4, 0, 0, -1},
        {1, 0, 2, 7, 0}, {1, 1, 0, 0, -1}, {1, 2, 0, 0, -1}, {1, 3, 0, 0, -1}, {1, 4, 0, 0, -1},
        {2, 0, 7, 9, 0}, {2, 1, 0, 1, 2},  {2, 2, 0, 0, -1}, {2, 3, 0, 0, -1}, {2, 4, 0, 1, 3},
    };
    /* each whole tensor in its own exactly sized block: ASan sees a read
     * past the slice */
    float *whole[L_N];
    for (int i = 0; i < L_N; i++) {
        whole[i] = malloc(L_NUMEL[i] * sizeof(float));
        for (size_t e = 0; e < L_NUMEL[i]; e++) whole[i][e] = (float)(100 * (i + 1) + (int)e);
    }
    for (int r = 0; r < 3; r++) {
        fr_pshard s;
        fr_status st =
            fr_pshard_init(ctx, NULL, L_N, L_FLAT, L_NUMEL, L_UNIT, L_TOTAL, r, 3, 0, &s);
        CHECK(st == FR_OK, "rank %d: init: %s", r, fr_last_error(ctx));
        if (st) continue;
        CHECK(s.n_groups == 3, "rank %d: n_groups %d, want 3", r, s.n_groups);
        CHECK(s.g_at[0] == 0 && s.g_len[0] == 3 && s.g_at[1] == 3 && s.g_len[1] == 10 &&
                  s.g_at[2] == 13 && s.g_len[2] == 1,
              "rank %d: groups (%zu,%zu) (%zu,%zu) (%zu,%zu), want (0,3) (3,10) (13,1)", r,
              s.g_at[0], s.g_len[0], s.g_at[1], s.g_len[1], s.g_at[2], s.g_len[2]);
        static const int grp[L_N] = {1, 1, -1, 0, 2};
        for (int i = 0; i < L_N; i++)
            CHECK(s.group[i] == grp[i], "rank %d: group[%d] %d, want %d", r, i, s.group[i], grp[i]);
        CHECK(s.lo == lo[r] && s.hi == hi[r], "rank %d: [%zu, %zu), want [%zu, %zu)", r, s.lo, s.hi,
              lo[r], hi[r]);
        CHECK(s.total == L_TOTAL && s.data, "rank %d: total %zu, data %p", r, s.total,
              (void *)s.data);
        CHECK(params_now(ctx) == (hi[r] - lo[r]) * sizeof(float),
              "rank %d: params category %zu bytes, want the shard's %zu", r, params_now(ctx),
              (hi[r] - lo[r]) * sizeof(float));
        CHECK(!fr_pshard_holds(&s, 2) && fr_pshard_holds(&s, 0) && !fr_pshard_holds(&s, 5) &&
                  !fr_pshard_holds(&s, -1),
              "rank %d: holds", r);
        for (size_t k = 0; k < sizeof sl / sizeof *sl; k++) {
            if (sl[k].rank != r) continue;
            size_t a = 99, b = 99;
            float *d = fr_pshard_slice(&s, sl[k].param, &a, &b);
            long at = d ? (long)(d - s.data) : -1;
            CHECK(a == sl[k].a && b == sl[k].b && at == sl[k].at,
                  "rank %d param %d: slice [%zu, %zu) at %ld, want [%zu, %zu) at %ld", r,
                  sl[k].param, a, b, at, sl[k].a, sl[k].b, sl[k].at);
        }
        /* keep p0 alone: only its owned elements change (the shard starts
         * zeroed) */
        fr_pshard_keep(&s, 0, whole[0]);
        size_t n = hi[r] - lo[r];
        for (size_t e = 0; e < n; e++) {
            size_t x = lo[r] + e; /* flat element */
            float want = x >= 3 && x < 12 ? (float)(100 + (int)(x - 3)) : 0.0f;
            CHECK(s.data[e] == want, "rank %d: after keep p0, data[%zu] %g, want %g", r, e,
                  s.data[e], want);
        }
        for (int i = 1; i < L_N; i++) fr_pshard_keep(&s, i, whole[i]);
        for (size_t e = 0; e < n; e++)
            CHECK(s.data[e] == shard[r][e], "rank %d: data[%zu] %g, want %g", r, e, s.data[e],
                  shard[r][e]);
        fr_pshard_release(ctx, &s);
        CHECK(params_now(ctx) == 0 && !s.data && !s.flat, "rank %d: release", r);
    }
    /* ranks 0: the layout alone; 6 ranks: c = ceil(14/6) = 3, rank 5 starts
     * at 15 > 14: [14, 14), no elements, no block */
    for (int k = 0; k < 2; k++) {
        fr_pshard s;
        int rank = k ? 5 : 0, ranks = k ? 6 : 0;
        size_t want = k ? 14 : 0;
        fr_status st =
            fr_pshard_init(ctx, NULL, L_N, L_FLAT, L_NUMEL, L_UNIT, L_TOTAL, rank, ranks, 0, &s);
        CHECK(st == FR_OK && s.n_groups == 3 && s.g_len[1] == 10 && !s.data && s.lo == want &&
                  s.hi == want && params_now(ctx) == 0,
              "ranks %d: status %d, n_groups %d, data %p, [%zu, %zu)", ranks, (int)st, s.n_groups,
              (void *)s.data, s.lo, s.hi);
        size_t a = 99, b = 99;
        CHECK(!fr_pshard_slice(&s, 0, &a, &b) && a == 0 && b == 0, "ranks %d: slice", ranks);
        fr_pshard_keep(&s, 0, whole[0]); /* nothing owned: writes nothing */
        fr_pshard_release(ctx, &s);
    }
    for (int i = 0; i < L_N; i++) free(whole[i]);

    /* A gap: unit 0 holds [0, 3) and [5, 8), unit 1 [3, 5) between them;
     * unit 0's span is 8 elements but its weights are 6: refused. */
    static const size_t gflat[3] = {0, 5, 3}, gnumel[3] = {3, 3, 2};
    static const int gunit[3] = {0, 0, 1};
    size_t before = total_now(ctx);
    fr_pshard s;
    fr_status st = fr_pshard_init(ctx, NULL, 3, gflat, gnumel, gunit, 8, 0, 2, 0, &s);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx), "unit 0"),
          "gap: status %d, message \"%s\", want FR_ERR_ARG naming unit 0", (int)st,
          fr_last_error(ctx));
    CHECK(total_now(ctx) == before && !s.flat && !s.data, "gap: %zu bytes held, want %zu",
          total_now(ctx), before);

    /* every allocation of init failing in turn: FR_ERR_NOMEM, nothing held */
    int done = 0;
    for (uint64_t f = 1; f < 100 && !done; f++) {
        fr_mem_fail_at(ctx, f);
        st = fr_pshard_init(ctx, NULL, L_N, L_FLAT, L_NUMEL, L_UNIT, L_TOTAL, 1, 3, 0, &s);
        fr_mem_fail_at(ctx, 0);
        if (st == FR_OK) {
            done = 1;
            CHECK(f > 1, "init took no allocation");
            fr_pshard_release(ctx, &s);
        } else {
            CHECK(st == FR_ERR_NOMEM, "init, allocation %d failing: status %d", (int)f, (int)st);
        }
        CHECK(total_now(ctx) == before, "init, allocation %d failing: %zu bytes held, want %zu",
              (int)f, total_now(ctx), before);
    }
    CHECK(done, "init never succeeded");
}

/* ---- 2. the schedule -----------------------------------------------------
 * Four groups (one param each, units 0..3 in flat order):
 *   G0 [0, 40)   40 floats = 160 B (a tied embedding: first and last layer)
 *   G1 [40, 60)  20 floats =  80 B (two params: [40,56) and [56,60))
 *   G2 [60, 67)   7 floats =  28 B
 *   G3 [67, 117) 50 floats = 200 B
 * A step of 11 positions, split 5 (the loss):
 *   pos 0 G0 | 1 G1 | 2 G2 | 3 G3 | 4 G0 (tied head) | 5 loss |
 *   6 G0 | 7 G3 | 8 G2 | 9 G1 | 10 G0
 * (group, phase) first..last: G0f 0..4, G1f 1, G2f 2, G3f 3, G0b 6..10,
 * G3b 7, G2b 8, G1b 9. In order of first use, alloc_at = the previous
 * interval's first (the first interval: its own):
 *   G0f[0,4]@0 G1f[1,1]@0 G2f[2,2]@1 G3f[3,3]@2 G0b[6,10]@3 G3b[7,7]@6
 *   G2b[8,8]@7 G1b[9,9]@8
 * Merge 1: G0b would be gathered at 3 while G0f is held until 4: one
 *   interval G0[0,10]. alloc_at again: ... G3f@2, G3b@3 (its previous is
 *   now G3f), G2b@7, G1b@8.
 * Merge 2: G3b gathered at 3 <= G3f's last 3: G3[3,7]. alloc_at again:
 *   G2b@3 (previous: G3), G1b@8.
 * No more: G2b@3 > G2f's last 2 (G2f's block is freed after 2, G2 is
 *   gathered again); G1b@8 > G1f's last 1. Final:
 *   j  grp phase first last alloc_at
 *   0  0   0     0     10   0
 *   1  1   0     1     1    0
 *   2  2   0     2     2    1
 *   3  3   0     3     7    2
 *   4  2   1     8     8    3
 *   5  1   1     9     9    8
 * The walk, live = {j : alloc_at <= k <= last}, bytes (blocks rounded up to
 * 64 B: 160 -> 192, 80 -> 128, 28 -> 64, 200 -> 256):
 *   k 0: j0 j1       160+80     = 240  (192+128     = 320)
 *   k 1: j0 j1 j2    160+80+28  = 268  (192+128+64  = 384)
 *   k 2: j0 j2 j3    160+28+200 = 388  (192+64+256  = 512)
 *   k 3..7: j0 j3 j4 160+200+28 = 388  (512)
 *   k 8: j0 j4 j5    160+28+80  = 268  (384)
 *   k 9: j0 j5       160+80     = 240  (320)
 *   k 10: j0         160               (192)
 * peak 388, peak_reserved 512. */
enum { S_N = 5, S_TOTAL = 117, S_POS = 11, S_SPLIT = 5, S_IV = 6 };
static const size_t S_FLAT[S_N] = {0, 40, 56, 60, 67};
static const size_t S_NUMEL[S_N] = {40, 16, 4, 7, 50};
static const int S_UNIT[S_N] = {0, 1, 1, 2, 3};
static const int S_USE_OFF[S_POS + 1] = {0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10};
static const int S_GRP[10] = {0, 1, 2, 3, 0, /* loss */ 0, 3, 2, 1, 0};
static const int IV_GRP[S_IV] = {0, 1, 2, 3, 2, 1}, IV_PHASE[S_IV] = {0, 0, 0, 0, 1, 1};
static const int IV_FIRST[S_IV] = {0, 1, 2, 3, 8, 9}, IV_LAST[S_IV] = {10, 1, 2, 7, 8, 9};
static const int IV_ALLOC[S_IV] = {0, 0, 1, 2, 3, 8};

static void test_plan(fr_ctx *ctx) {
    fr_pshard s;
    fr_status st = fr_pshard_init(ctx, NULL, S_N, S_FLAT, S_NUMEL, S_UNIT, S_TOTAL, 0, 0, 0, &s);
    CHECK(st == FR_OK && s.n_groups == 4, "init: %d groups", s.n_groups);
    if (st) return;
    fr_gathers g;
    st = fr_gathers_plan(ctx, &s, S_POS, S_USE_OFF, S_GRP, S_SPLIT, &g);
    CHECK(st == FR_OK && g.n == S_IV, "plan: status %d, %d intervals, want %d", (int)st, g.n, S_IV);
    for (int j = 0; !st && j < g.n && j < S_IV; j++)
        CHECK(g.grp[j] == IV_GRP[j] && g.phase[j] == IV_PHASE[j] && g.first[j] == IV_FIRST[j] &&
                  g.last[j] == IV_LAST[j] && g.alloc_at[j] == IV_ALLOC[j],
              "interval %d: grp %d phase %d [%d, %d] @%d, want grp %d phase %d [%d, %d] @%d", j,
              g.grp[j], g.phase[j], g.first[j], g.last[j], g.alloc_at[j], IV_GRP[j], IV_PHASE[j],
              IV_FIRST[j], IV_LAST[j], IV_ALLOC[j]);
    CHECK(g.peak == 388 && g.peak_reserved == 512, "peak %zu / %zu, want 388 / 512", g.peak,
          g.peak_reserved);
    CHECK(g.peak_reserved ==
              fr_mem_block_bytes(160) + fr_mem_block_bytes(200) + fr_mem_block_bytes(28),
          "peak_reserved %zu, want the blocks of j0 j3 j4", g.peak_reserved);

    /* The same walk on other sizes: G0 1000 B, G1 70000 B, G2 10 B, G3
     * 5000 B. Raw: k 0: 71000; k 1 and 8: 1000+70000+10 = 71010; k 2..7:
     * 6010; k 9: 71000; k 10: 1000: peak 71010. Rounded: 1000 -> 1024 (64 B
     * multiples below 64 KiB), 70000 -> 4096 * 18 = 73728 (4 KiB multiples
     * from 64 KiB), 10 -> 64, 5000 -> 64 * 79 = 5056: k 1: 1024+73728+64 =
     * 74816; k 2..7: 1024+5056+64 = 6144: peak 74816. */
    static const size_t bytes[4] = {1000, 70000, 10, 5000};
    size_t peak = 0, res = 0;
    fr_gathers_peak(&g, bytes, &peak, &res);
    CHECK(peak == 71010 && res == 74816, "peak on other sizes %zu / %zu, want 71010 / 74816", peak,
          res);
    fr_gathers_release(ctx, &g);

    /* A plain two-layer step, no tie: pos 0 G0 | 1 G1 | 2 loss | 3 G1 |
     * 4 G0. G0f[0,0]@0 G1f[1,1]@0 G1b[3,3]@1 G0b[4,4]@3. G1b would be
     * gathered at 1 while G1f is held (last 1): G1[1,3]; then G0b's
     * previous is G1 (first 1): G0b@1 > G0f's last 0: no merge (G0 is
     * gathered twice). Final: G0f[0,0]@0, G1f[1,3]@0, G0b[4,4]@1.
     * Walk: k 0: G0 G1 = 160+80 = 240; k 1..3: G1 G0b = 240; k 4: G0b 160.
     * Peak 240, reserved 192+128 = 320. The same uses with split 4 (an
     * evaluation step, no backward) are all forward: G0f[0,4]@0 and
     * G1f[1,3]@0 (each group's uses are one run); peak 240 at k 0..3. */
    static const int off2[6] = {0, 1, 2, 2, 3, 4}, grp2[4] = {0, 1, 1, 0};
    st = fr_gathers_plan(ctx, &s, 5, off2, grp2, 2, &g);
    CHECK(st == FR_OK && g.n == 3 && g.grp[0] == 0 && g.first[0] == 0 && g.last[0] == 0 &&
              g.alloc_at[0] == 0 && g.grp[1] == 1 && g.phase[1] == 0 && g.first[1] == 1 &&
              g.last[1] == 3 && g.alloc_at[1] == 0 && g.grp[2] == 0 && g.phase[2] == 1 &&
              g.first[2] == 4 && g.last[2] == 4 && g.alloc_at[2] == 1,
          "two layers: %d intervals", g.n);
    CHECK(g.peak == 240 && g.peak_reserved == 320, "two layers: peak %zu / %zu, want 240 / 320",
          g.peak, g.peak_reserved);
    fr_gathers_release(ctx, &g);
    st = fr_gathers_plan(ctx, &s, 5, off2, grp2, 4, &g);
    CHECK(st == FR_OK && g.n == 2 && g.grp[0] == 0 && g.phase[0] == 0 && g.first[0] == 0 &&
              g.last[0] == 4 && g.alloc_at[0] == 0 && g.grp[1] == 1 && g.phase[1] == 0 &&
              g.first[1] == 1 && g.last[1] == 3 && g.alloc_at[1] == 0,
          "forward only: %d intervals", g.n);
    CHECK(g.peak == 240, "forward only: peak %zu, want 240", g.peak);
    fr_gathers_release(ctx, &g);

    /* every allocation of the plan failing in turn: FR_ERR_NOMEM, nothing
     * held */
    size_t before = total_now(ctx);
    int done = 0;
    for (uint64_t f = 1; f < 100 && !done; f++) {
        fr_mem_fail_at(ctx, f);
        st = fr_gathers_plan(ctx, &s, S_POS, S_USE_OFF, S_GRP, S_SPLIT, &g);
        fr_mem_fail_at(ctx, 0);
        if (st == FR_OK) {
            done = 1;
            CHECK(g.n == S_IV && g.peak == 388, "plan after failures: %d intervals", g.n);
            fr_gathers_release(ctx, &g);
        } else {
            CHECK(st == FR_ERR_NOMEM && !g.grp, "plan, allocation %d failing: status %d", (int)f,
                  (int)st);
        }
        CHECK(total_now(ctx) == before, "plan, allocation %d failing: %zu bytes held, want %zu",
              (int)f, total_now(ctx), before);
    }
    CHECK(done, "plan never succeeded");
    fr_pshard_release(ctx, &s);
}

/* ---- 3. the run ---------------------------------------------------------- */

enum { MAX_EV = 64 };
typedef struct binds {
    int n;
    int grp[MAX_EV];
    int held[MAX_EV]; /* 1: a block, 0: NULL */
    int content_ok[MAX_EV];
    const float *cur[4]; /* per group: its bound block */
} binds;

/* Group k's weights, from the whole tensors (param i's element e holds
 * 1000 * (i + 1) + e), laid out as the flat vector: G0 = p0, G1 = p1 p2,
 * G2 = p3, G3 = p4. */
static int group_content_ok(int k, const float *blk) {
    static const int first_param[4] = {0, 1, 3, 4}, n_params[4] = {1, 2, 1, 1};
    size_t o = 0;
    for (int i = first_param[k]; i < first_param[k] + n_params[k]; i++)
        for (size_t e = 0; e < S_NUMEL[i]; e++, o++)
            if (blk[o] != (float)(1000 * (i + 1) + (int)e)) return 0;
    return 1;
}

static void record(void *arg, int group, float *block) {
    binds *b = arg;
    if (b->n < MAX_EV) {
        b->grp[b->n] = group;
        b->held[b->n] = block != NULL;
        b->content_ok[b->n] = block ? group_content_ok(group, block) : 1;
        b->n++;
    }
    if (group >= 0 && group < 4) b->cur[group] = block;
}

/* The gathered bytes (params category less the 468 B shard) after pre(k)
 * are the walk's live set at k (above); after post(k) less those whose
 * last is k:
 *   k:        0   1   2   3   4   5   6   7   8   9   10
 *   pre:    240 268 388 388 388 388 388 388 268 240 160
 *   post:   240 188 360 388 388 388 388 188 240 160   0
 * (post 1: j1 (80) freed; 2: j2 (28); 7: j3 (200); 8: j4 (28); 9: j5 (80);
 * 10: j0 (160).) The binds: pre 0 (0, block), pre 1 (1, block), post 1
 * (1, NULL), pre 2 (2, block), post 2 (2, NULL), pre 3 (3, block), post 7
 * (3, NULL), pre 8 (2, block), post 8 (2, NULL), pre 9 (1, block), post 9
 * (1, NULL), post 10 (0, NULL). */
static const size_t RUN_PRE[S_POS] = {240, 268, 388, 388, 388, 388, 388, 388, 268, 240, 160};
static const size_t RUN_POST[S_POS] = {240, 188, 360, 388, 388, 388, 388, 188, 240, 160, 0};
static const int RUN_EV_GRP[12] = {0, 1, 1, 2, 2, 3, 3, 2, 2, 1, 1, 0};
static const int RUN_EV_HELD[12] = {1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0};

static void test_run(fr_ctx *ctx) {
    fr_pshard s;
    /* one rank: the shard is the whole flat vector, 117 floats = 468 B */
    fr_status st = fr_pshard_init(ctx, NULL, S_N, S_FLAT, S_NUMEL, S_UNIT, S_TOTAL, 0, 1, 0, &s);
    CHECK(st == FR_OK && s.lo == 0 && s.hi == S_TOTAL && params_now(ctx) == 468,
          "init one rank: [%zu, %zu), %zu params bytes", s.lo, s.hi, params_now(ctx));
    if (st) return;
    for (int i = 0; i < S_N; i++) {
        float w[64];
        for (size_t e = 0; e < S_NUMEL[i]; e++) w[e] = (float)(1000 * (i + 1) + (int)e);
        fr_pshard_keep(&s, i, w);
    }
    fr_gathers g;
    st = fr_gathers_plan(ctx, &s, S_POS, S_USE_OFF, S_GRP, S_SPLIT, &g);
    CHECK(st == FR_OK && g.peak == 388, "plan: peak %zu", g.peak);
    if (st) {
        fr_pshard_release(ctx, &s);
        return;
    }

    binds b = {0};
    fr_mem_reset_peak(ctx);
    fr_gathers_begin(&g);
    for (int k = 0; k < S_POS; k++) {
        st = fr_gathers_pre(ctx, &s, &g, k, record, &b);
        CHECK(st == FR_OK, "pre %d: %s", k, fr_last_error(ctx));
        CHECK(params_now(ctx) == 468 + RUN_PRE[k], "pre %d: %zu gathered bytes, want %zu", k,
              params_now(ctx) - 468, RUN_PRE[k]);
        /* interval j's block exists from the pre-node of its alloc_at (the
         * previous interval's first: prefetched) through its last use */
        for (int j = 0; j < S_IV; j++) {
            int want = IV_ALLOC[j] <= k && k <= IV_LAST[j];
            CHECK((g.buf[j] != NULL) == want, "pre %d: interval %d %s, want %s", k, j,
                  g.buf[j] ? "gathered" : "not gathered", want ? "gathered" : "not");
        }
        /* every group node k reads is bound */
        for (int u = S_USE_OFF[k]; u < S_USE_OFF[k + 1]; u++)
            CHECK(b.cur[S_GRP[u]] != NULL, "pos %d: group %d not bound", k, S_GRP[u]);
        fr_gathers_post(ctx, &g, k, record, &b);
        CHECK(params_now(ctx) == 468 + RUN_POST[k], "post %d: %zu gathered bytes, want %zu", k,
              params_now(ctx) - 468, RUN_POST[k]);
    }
    st = fr_gathers_end(ctx, &s, &g, 1, record, &b);
    CHECK(st == FR_OK && params_now(ctx) == 468, "end: %zu params bytes, want 468",
          params_now(ctx));
    CHECK(b.n == 12, "%d binds, want 12", b.n);
    for (int e = 0; e < b.n && e < 12; e++)
        CHECK(b.grp[e] == RUN_EV_GRP[e] && b.held[e] == RUN_EV_HELD[e] && b.content_ok[e],
              "bind %d: group %d %s (content %s), want group %d %s", e, b.grp[e],
              b.held[e] ? "block" : "NULL", b.content_ok[e] ? "right" : "wrong", RUN_EV_GRP[e],
              RUN_EV_HELD[e] ? "block" : "NULL");
    CHECK(g.gathers == S_IV, "%lld gathers, want %d", (long long)g.gathers, S_IV);
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated_peak[FR_MEM_PARAMS] == 468 + 388 &&
              ms.allocated_peak[FR_MEM_PARAMS] == 468 + g.peak,
          "params peak %zu, want the shard 468 + the predicted 388",
          ms.allocated_peak[FR_MEM_PARAMS]);

    /* A run cut short after pos 3 (pre 3 and post 3 done): held are j0 (G0,
     * ready), j3 (G3, ready) and j4 (G2 backward, prefetched at 3, started
     * but not waited for): 160 + 200 + 28 = 388 B. end(ok) frees all three
     * (waiting for j4 first), binding NULL for groups 0, 3, 2 in interval
     * order. */
    b = (binds){0};
    fr_gathers_begin(&g);
    for (int k = 0; k <= 3; k++) {
        st = fr_gathers_pre(ctx, &s, &g, k, record, &b);
        fr_gathers_post(ctx, &g, k, record, &b);
    }
    CHECK(st == FR_OK && params_now(ctx) == 468 + 388, "cut at 3: %zu params bytes, want 856",
          params_now(ctx));
    int n0 = b.n;
    st = fr_gathers_end(ctx, &s, &g, 1, record, &b);
    CHECK(st == FR_OK && params_now(ctx) == 468, "end(ok) after 3: %zu params bytes, want 468",
          params_now(ctx));
    CHECK(b.n == n0 + 3 && b.grp[n0] == 0 && b.grp[n0 + 1] == 3 && b.grp[n0 + 2] == 2 &&
              !b.held[n0] && !b.held[n0 + 1] && !b.held[n0 + 2],
          "end(ok) after 3: %d unbinds", b.n - n0);

    /* The same cut, ended after a failure: the ready blocks (j0, j3) are
     * freed; j4's gather may still be in flight, so it keeps its block
     * (28 B) until the schedule is released. */
    b = (binds){0};
    fr_gathers_begin(&g);
    for (int k = 0; k <= 3; k++) {
        st = fr_gathers_pre(ctx, &s, &g, k, record, &b);
        fr_gathers_post(ctx, &g, k, record, &b);
    }
    n0 = b.n;
    fr_gathers_end(ctx, &s, &g, 0, record, &b);
    CHECK(params_now(ctx) == 468 + 28 && b.n == n0 + 2 && b.grp[n0] == 0 && b.grp[n0 + 1] == 3,
          "end(failed) after 3: %zu params bytes, want 496; %d unbinds, want 2", params_now(ctx),
          b.n - n0);
    fr_gathers_release(ctx, &g);
    CHECK(params_now(ctx) == 468, "release: %zu params bytes, want 468", params_now(ctx));

    /* every allocation of a run failing in turn (the blocks are the run's
     * only allocations): the failing pre reports FR_ERR_NOMEM, end(failed)
     * and release leave the shard alone */
    st = fr_gathers_plan(ctx, &s, S_POS, S_USE_OFF, S_GRP, S_SPLIT, &g);
    CHECK(st == FR_OK, "plan: %s", fr_last_error(ctx));
    int done = 0;
    for (uint64_t f = 1; !st && f <= S_IV + 1 && !done; f++) {
        b = (binds){0};
        fr_gathers_begin(&g);
        fr_mem_fail_at(ctx, f);
        fr_status rs = FR_OK;
        for (int k = 0; k < S_POS && !rs; k++) {
            rs = fr_gathers_pre(ctx, &s, &g, k, record, &b);
            if (!rs) fr_gathers_post(ctx, &g, k, record, &b);
        }
        fr_mem_fail_at(ctx, 0);
        fr_gathers_end(ctx, &s, &g, rs == FR_OK, record, &b);
        if (rs == FR_OK) {
            done = 1;
            CHECK(f == S_IV + 1, "a run of %d gathers took %d allocations", S_IV, (int)f - 1);
        } else {
            CHECK(rs == FR_ERR_NOMEM, "run, allocation %d failing: status %d", (int)f, (int)rs);
        }
        fr_gathers_release(ctx, &g);
        CHECK(params_now(ctx) == 468, "run, allocation %d failing: %zu params bytes, want 468",
              (int)f, params_now(ctx));
        if (!done) st = fr_gathers_plan(ctx, &s, S_POS, S_USE_OFF, S_GRP, S_SPLIT, &g);
    }
    CHECK(done, "run never succeeded");
    fr_pshard_release(ctx, &s);
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 1;
    test_layout(ctx);
    test_plan(ctx);
    test_run(ctx);
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    CHECK(st.allocated_total == 0, "%zu bytes still held at the end", st.allocated_total);
    fr_ctx_free(ctx);
    return check_done();
}
