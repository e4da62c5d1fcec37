/* test_mem.c — the accounting allocator (src/core/mem.c) and its reports
 * (src/report/memsummary.c): per-category current and peak bytes after a
 * known sequence of allocations (expected numbers worked out by hand below),
 * the peak of the total versus the sum of the peaks, the cache of large
 * blocks (reuse, reserved unchanged, fr_mem_empty_cache), the limit (refusal,
 * OOM count, message, cache released before refusing), fault injection (the
 * n-th allocation fails; a builder that fails at every point in turn leaks
 * nothing), arena accounting with fr_mem_track, the JSON (checked by a small
 * independent JSON reader) and the human summary.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "report/report.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static fr_mem_stats stats(fr_ctx *ctx) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    return s;
}

/* ---- per-category accounting ------------------------------------------- */

static void test_categories(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem_stats s = stats(ctx);
    size_t zero = 0;
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) zero |= s.allocated[c] | s.allocated_peak[c];
    CHECK(!zero && !s.allocated_total && !s.reserved && !s.num_allocs, "a new context is empty");

    void *a = fr_alloc(ctx, 1000, FR_MEM_PARAMS);
    void *b = fr_alloc(ctx, 3000, FR_MEM_GRADS);
    void *c = fr_alloc(ctx, 500, FR_MEM_PARAMS);
    CHECK(a && b && c, "small allocations");
    CHECK(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % FR_MEM_ALIGN == 0, "64-byte aligned");
    s = stats(ctx);
    /* params 1000 + 500; grads 3000; total 4500 */
    CHECK(s.allocated[FR_MEM_PARAMS] == 1500 && s.allocated_peak[FR_MEM_PARAMS] == 1500,
          "params 1500/1500, got %zu/%zu", s.allocated[FR_MEM_PARAMS],
          s.allocated_peak[FR_MEM_PARAMS]);
    CHECK(s.allocated[FR_MEM_GRADS] == 3000 && s.allocated_total == 4500 &&
              s.allocated_total_peak == 4500,
          "grads 3000, total 4500/4500, got %zu, %zu/%zu", s.allocated[FR_MEM_GRADS],
          s.allocated_total, s.allocated_total_peak);
    /* no header: each block is its bytes rounded up to 64 (small blocks):
     * 1000 -> 16 * 64 = 1024, 3000 -> 47 * 64 = 3008, 500 -> 8 * 64 = 512 */
    CHECK(s.reserved == 1024 + 3008 + 512 && s.reserved_peak == s.reserved && s.cached == 0,
          "reserved is the three blocks rounded to 64 bytes, 4544 (%zu)", s.reserved);

    fr_free(ctx, a);                            /* params 500 (peak 1500), total 3500 (peak 4500) */
    void *d = fr_alloc(ctx, 200, FR_MEM_OPTIM); /* total 3700 */
    fr_free(ctx, b);                            /* grads 0 (peak 3000), total 700 */
    void *e = fr_alloc(ctx, 10000, FR_MEM_ACTIVATIONS); /* total 10700: a new peak */
    s = stats(ctx);
    CHECK(s.allocated[FR_MEM_PARAMS] == 500 && s.allocated_peak[FR_MEM_PARAMS] == 1500,
          "params after free");
    CHECK(s.allocated[FR_MEM_GRADS] == 0 && s.allocated_peak[FR_MEM_GRADS] == 3000,
          "grads after free");
    CHECK(s.allocated[FR_MEM_OPTIM] == 200 && s.allocated[FR_MEM_ACTIVATIONS] == 10000,
          "optim 200, activations 10000");
    CHECK(s.allocated_total == 10700 && s.allocated_total_peak == 10700,
          "total 10700/10700, got %zu/%zu", s.allocated_total, s.allocated_total_peak);
    size_t sum_peaks = 0;
    for (int k = 0; k < FR_MEM_CAT_COUNT; k++) sum_peaks += s.allocated_peak[k];
    CHECK(sum_peaks == 14700 && s.allocated_total_peak != sum_peaks,
          "the total peak is the peak of the sum (10700), not the sum of the peaks (14700)");
    CHECK(s.num_allocs == 5 && s.num_frees == 2, "counts 5 allocs, 2 frees: %llu, %llu",
          (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees);

    /* an out-of-range category is accounted as "other" */
    void *o = fr_alloc(ctx, 64, (fr_mem_cat)99);
    CHECK(o && stats(ctx).allocated[FR_MEM_OTHER] == 64, "bad category counts as other");
    fr_free(ctx, o);
    fr_free(ctx, NULL);
    CHECK(stats(ctx).num_frees == 3, "fr_free(NULL) is a no-op and not counted");

    fr_free(ctx, c);
    fr_free(ctx, d);
    fr_free(ctx, e);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == 0 && s.cached == 0,
          "everything small freed: allocated 0, reserved 0 (small blocks are not cached)");
    /* the 64-byte "other" block came on top of the 10700: peak 10764 */
    CHECK(s.allocated_total_peak == 10764 && s.reserved_peak >= 10764,
          "peaks survive frees (total peak %zu)", s.allocated_total_peak);
    fr_mem_reset_peak(ctx);
    s = stats(ctx);
    CHECK(s.allocated_total_peak == 0 && s.allocated_peak[FR_MEM_ACTIVATIONS] == 0 &&
              s.reserved_peak == 0,
          "fr_mem_reset_peak brings the peaks down to the current values");

    /* calloc, strdup, grow */
    unsigned char *z = fr_calloc(ctx, 4096, FR_MEM_WORKSPACE);
    int nz = 0;
    for (int i = 0; z && i < 4096; i++) nz += z[i] != 0;
    CHECK(z && nz == 0 && stats(ctx).allocated[FR_MEM_WORKSPACE] == 4096, "fr_calloc zeroes");
    fr_free(ctx, z);
    char *str = fr_strdup(ctx, "frugal", FR_MEM_OTHER);
    CHECK(str && !strcmp(str, "frugal") && stats(ctx).allocated[FR_MEM_OTHER] == 7,
          "fr_strdup counts strlen + 1");
    fr_free(ctx, str);
    int *arr = NULL;
    size_t cap = 0;
    int st = fr_grow(ctx, (void **)&arr, &cap, 5, sizeof(int), FR_MEM_DATA);
    CHECK(st == 0 && cap == 8 && stats(ctx).allocated[FR_MEM_DATA] == 32, "fr_grow 0 -> 8");
    for (int i = 0; arr && i < 8; i++) arr[i] = i * i;
    st = fr_grow(ctx, (void **)&arr, &cap, 20, sizeof(int), FR_MEM_DATA);
    CHECK(st == 0 && cap == 32 && arr && arr[7] == 49 && stats(ctx).allocated[FR_MEM_DATA] == 128,
          "fr_grow 8 -> 32 keeps the contents and frees the old array");
    fr_free(ctx, arr);
    CHECK(stats(ctx).allocated_total == 0, "all freed");
    fr_ctx_free(ctx);
}

/* ---- the cache of large blocks ----------------------------------------- */

static void test_cache(void) {
    fr_ctx *ctx = fr_ctx_new();
    void *p = fr_alloc(ctx, MiB, FR_MEM_DATA);
    fr_mem_stats s = stats(ctx);
    size_t R = s.reserved; /* 1 MiB is a multiple of the 4 KiB rounding: itself */
    CHECK(p && R == MiB && s.cached == 0, "1 MiB block reserves %zu", R);

    fr_free(ctx, p);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == R && s.cached == R,
          "a freed 1 MiB block stays reserved, as cache (reserved %zu cached %zu)", s.reserved,
          s.cached);

    void *q = fr_alloc(ctx, MiB, FR_MEM_ACTIVATIONS);
    s = stats(ctx);
    CHECK(q && s.num_cache_hits == 1 && s.reserved == R && s.cached == 0 &&
              s.allocated[FR_MEM_ACTIVATIONS] == MiB && s.allocated[FR_MEM_DATA] == 0,
          "the same size again is a cache hit, reserved unchanged, recategorised");

    void *r = fr_alloc(ctx, 2 * MiB, FR_MEM_ACTIVATIONS);
    s = stats(ctx);
    size_t R2 = s.reserved - R;
    CHECK(r && s.num_cache_hits == 1 && R2 == 2 * MiB, "another size is no hit and reserves anew");
    fr_free(ctx, q);
    fr_free(ctx, r);
    s = stats(ctx);
    CHECK(s.cached == R + R2 && s.reserved == R + R2 && s.reserved_peak == R + R2, "both cached");
    fr_mem_empty_cache(ctx);
    s = stats(ctx);
    CHECK(s.reserved == 0 && s.cached == 0 && s.reserved_peak == R + R2,
          "fr_mem_empty_cache returns the blocks (reserved drops by %zu)", R + R2);

    void *small = fr_alloc(ctx, 1000, FR_MEM_OTHER);
    fr_free(ctx, small);
    s = stats(ctx);
    CHECK(s.cached == 0 && s.reserved == 0, "small blocks go straight back to the system");
    fr_ctx_free(ctx);
}

/* ---- the limit ----------------------------------------------------------- */

static void test_limit(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem_set_limit(ctx, 3 * MiB);
    void *a = fr_alloc(ctx, MiB, FR_MEM_PARAMS);
    void *b = fr_alloc(ctx, MiB, FR_MEM_GRADS);
    fr_mem_stats s0 = stats(ctx);
    CHECK(a && b && s0.limit == 3 * MiB, "two 1 MiB blocks fit a 3 MiB limit");
    void *c = fr_alloc(ctx, 2 * MiB, FR_MEM_ACTIVATIONS);
    fr_mem_stats s = stats(ctx);
    CHECK(!c && s.num_ooms == 1 && s.allocated_total == 2 * MiB && s.reserved == s0.reserved &&
              s.num_allocs == 2,
          "a block past the limit is refused and counted, nothing else changes");
    const char *msg = fr_last_error(ctx);
    CHECK(strstr(msg, "budget") && strstr(msg, "activations") && strstr(msg, "3145728"),
          "the message names the budget, the category and the limit: '%s'", msg);
    CHECK(s.reserved_peak <= 3 * MiB, "reserved never went past the limit");

    /* a cached block is released before the limit refuses: with b cached,
     * 1.5 MiB does not fit beside a and b, but fits beside a alone */
    fr_free(ctx, b);
    void *d = fr_alloc(ctx, MiB + MiB / 2, FR_MEM_WORKSPACE);
    s = stats(ctx);
    CHECK(d && s.cached == 0 && s.num_ooms == 1 && s.reserved <= 3 * MiB,
          "the cache is emptied to make room before refusing");

    fr_mem_set_limit(ctx, 0);
    void *e = fr_alloc(ctx, 4 * MiB, FR_MEM_DATA);
    CHECK(e != NULL && stats(ctx).limit == 0, "limit 0 means none");
    fr_free(ctx, a);
    fr_free(ctx, d);
    fr_free(ctx, e);
    fr_mem_empty_cache(ctx);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == 0, "all returned");
    fr_ctx_free(ctx);
}

/* ---- fault injection ----------------------------------------------------- */

/* Six allocations of mixed sizes (two cacheable); on any failure free what
 * was taken and return the status, as library code must. */
static fr_status build(fr_ctx *ctx, void *out[6]) {
    static const size_t sizes[6] = {100, 256 * 1024, 7, 4096, 200 * 1024, 1};
    for (int i = 0; i < 6; i++) {
        out[i] = fr_alloc(ctx, sizes[i], (fr_mem_cat)(i % FR_MEM_CAT_COUNT));
        if (!out[i]) {
            while (i--) fr_free(ctx, out[i]);
            return FR_ERR_NOMEM;
        }
    }
    return FR_OK;
}

static void test_fail_at(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem_fail_at(ctx, 3);
    void *p1 = fr_alloc(ctx, 10, FR_MEM_OTHER);
    void *p2 = fr_alloc(ctx, 10, FR_MEM_OTHER);
    void *p3 = fr_alloc(ctx, 10, FR_MEM_OTHER);
    void *p4 = fr_alloc(ctx, 10, FR_MEM_OTHER);
    fr_mem_stats s = stats(ctx);
    CHECK(p1 && p2 && !p3 && p4, "fail_at(3): exactly the third allocation fails");
    CHECK(s.num_ooms == 1 && s.num_allocs == 3 && s.allocated_total == 30, "counts after it");
    CHECK(strstr(fr_last_error(ctx), "out of memory") != NULL, "message: '%s'", fr_last_error(ctx));
    fr_mem_fail_at(ctx, 1);
    void *p5 = fr_alloc(ctx, MiB, FR_MEM_OTHER);
    void *p6 = fr_arena_alloc(ctx, MiB);
    CHECK(!p5 && p6, "fail_at(1): the next one fails, then none");
    fr_arena_free(ctx, p6);
    fr_mem_fail_at(ctx, 2);
    fr_mem_fail_at(ctx, 0);
    void *p7 = fr_alloc(ctx, 10, FR_MEM_OTHER), *p8 = fr_alloc(ctx, 10, FR_MEM_OTHER);
    CHECK(p7 && p8, "fail_at(0) disarms");
    fr_free(ctx, p1), fr_free(ctx, p2), fr_free(ctx, p4), fr_free(ctx, p7), fr_free(ctx, p8);

    /* every allocation of the builder fails in turn; nothing leaks */
    for (uint64_t n = 1; n <= 7; n++) {
        void *blk[6];
        fr_mem_stats before = stats(ctx);
        fr_mem_fail_at(ctx, n);
        fr_status st = build(ctx, blk);
        fr_mem_stats after = stats(ctx);
        if (n <= 6) {
            CHECK(st == FR_ERR_NOMEM && after.allocated_total == before.allocated_total &&
                      after.num_ooms == before.num_ooms + 1 &&
                      after.num_allocs == before.num_allocs + (n - 1),
                  "builder with allocation %llu failing: status %d, clean", (unsigned long long)n,
                  (int)st);
        } else {
            CHECK(st == FR_OK && after.num_ooms == before.num_ooms, "builder succeeds at n = 7");
            for (int i = 0; i < 6; i++) fr_free(ctx, blk[i]);
        }
        fr_mem_fail_at(ctx, 0);
    }
    fr_mem_empty_cache(ctx);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == 0, "nothing left after the fault runs");
    fr_ctx_free(ctx);
}

/* ---- arena accounting -------------------------------------------------- */

static void test_arena(void) {
    fr_ctx *ctx = fr_ctx_new();
    void *ar = fr_arena_alloc(ctx, MiB);
    fr_mem_stats s = stats(ctx);
    size_t R = s.reserved;
    CHECK(ar && R == MiB && s.allocated_total == 0 && s.num_allocs == 1,
          "an arena is reserved (1 MiB, no header), not allocated");
    fr_mem_track(ctx, FR_MEM_ACTIVATIONS, 1000);
    fr_mem_track(ctx, FR_MEM_WORKSPACE, 5000);
    s = stats(ctx);
    CHECK(s.allocated[FR_MEM_ACTIVATIONS] == 1000 && s.allocated[FR_MEM_WORKSPACE] == 5000 &&
              s.allocated_total == 6000 && s.allocated_total_peak == 6000 && s.reserved == R,
          "tracked values count as allocated, reserved unchanged");
    fr_mem_track(ctx, FR_MEM_WORKSPACE, -5000);
    fr_mem_track(ctx, FR_MEM_ACTIVATIONS, 300);
    fr_mem_track(ctx, FR_MEM_ACTIVATIONS, -1300);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.allocated_peak[FR_MEM_ACTIVATIONS] == 1300 &&
              s.allocated_peak[FR_MEM_WORKSPACE] == 5000 && s.allocated_total_peak == 6000,
          "peaks: activations 1300, workspace 5000, total 6000 (got %zu %zu %zu)",
          s.allocated_peak[FR_MEM_ACTIVATIONS], s.allocated_peak[FR_MEM_WORKSPACE],
          s.allocated_total_peak);
    fr_arena_free(ctx, ar);
    s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.num_frees == 1 && s.reserved == R && s.cached == R,
          "a freed arena is cached like any large block");
    fr_mem_empty_cache(ctx);
    CHECK(stats(ctx).reserved == 0, "and returned by fr_mem_empty_cache");
    fr_ctx_free(ctx);
}

/* ---- host blocks are the bytes alone ------------------------------------- */

/* The host classes by hand: below 64 KiB a request rounds up to a multiple
 * of 64 (at least 64), from 64 KiB up to a multiple of 4096; no header. */
static void test_host_classes(void) {
    static const struct {
        size_t bytes, want;
    } c[] = {
        {0, 64},                  /* never an empty block */
        {1, 64},                  /* 1 -> one 64-byte unit */
        {64, 64},                 /* exact */
        {65, 128},                /* 2 units */
        {100, 128},               /* 100 = 64 + 36 -> 2 units */
        {1000, 1024},             /* 15.6 units -> 16 */
        {65535, 65536},           /* small: 1023.98 units of 64 -> 1024 */
        {65536, 65536},           /* large: 16 pages of 4096, exact */
        {65537, 69632},           /* 16 pages + 1 byte -> 17 pages = 69632 */
        {MiB, MiB},               /* 256 pages */
        {MiB + 4097, MiB + 8192}, /* 256 pages + 4097 bytes -> 258 pages */
    };
    fr_ctx *ctx = fr_ctx_new();
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK(fr_mem_block_bytes(c[i].bytes) == c[i].want,
              "fr_mem_block_bytes(%zu) = %zu, want %zu", c[i].bytes, fr_mem_block_bytes(c[i].bytes),
              c[i].want);
        CHECK(fr_mem_class_bytes(&ctx->mem, c[i].bytes) == c[i].want,
              "the host memory's class of %zu", c[i].bytes);
        size_t r0 = stats(ctx).reserved;
        unsigned char *p = fr_alloc(ctx, c[i].bytes, FR_MEM_DATA);
        size_t got = stats(ctx).reserved - r0;
        CHECK(p && got == c[i].want, "fr_alloc(%zu) reserves %zu, want %zu", c[i].bytes, got,
              c[i].want);
        if (p) memset(p, 0xab, c[i].want); /* the whole block is the caller's (ASan checks) */
        CHECK(((uintptr_t)p % FR_MEM_ALIGN) == 0, "64-byte aligned");
        fr_free(ctx, p);
        fr_mem_empty_cache(ctx); /* so the next (maybe the same class) takes anew */
    }
    CHECK(stats(ctx).reserved == 0, "all given back");
    fr_ctx_free(ctx);
}

/* Many takes and gives in a random order: every block is found again in the
 * side table (whose deletions shift entries back), and allocated and reserved
 * match a count kept here with the rounding by hand (small: to 64). */
static void test_table_churn(void) {
    enum { SLOTS = 300, OPS = 20000 };
    fr_ctx *ctx = fr_ctx_new();
    void *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    size_t want_alloc = 0, want_res = 0;
    uint64_t x = 12345;
    int ok = 1;
    for (int op = 0; op < OPS && ok; op++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int k = (int)((x >> 33) % SLOTS);
        if (p[k]) {
            fr_free(ctx, p[k]);
            want_alloc -= n[k];
            want_res -= (n[k] + 63) / 64 * 64 + (n[k] == 0) * 64;
            p[k] = NULL;
        } else {
            n[k] = (size_t)((x >> 13) % 5000);
            p[k] = fr_alloc(ctx, n[k], FR_MEM_ACTIVATIONS);
            want_alloc += n[k];
            want_res += (n[k] + 63) / 64 * 64 + (n[k] == 0) * 64;
            ok = p[k] != NULL;
        }
        fr_mem_stats s = stats(ctx);
        ok &= s.allocated_total == want_alloc && s.reserved == want_res;
    }
    CHECK(ok, "%d random takes and gives: allocated and reserved as counted here", OPS);
    size_t live = 0;
    for (int k = 0; k < SLOTS; k++) live += p[k] != NULL;
    size_t tb = fr_mem_table_bytes(&ctx->mem);
    /* load <= 3/4 and doubling: fewer than 2 * 4/3 slots per block ever held
     * at once (at most SLOTS), each slot well under 64 bytes */
    CHECK(tb > 0 && tb <= 64 * 64 + (size_t)SLOTS * 3 * 64,
          "the side table stays small: %zu bytes for %zu live blocks", tb, live);
    for (int k = 0; k < SLOTS; k++) fr_free(ctx, p[k]);
    fr_mem_stats s = stats(ctx);
    CHECK(s.allocated_total == 0 && s.reserved == 0, "all given back");
    fr_ctx_free(ctx);
}

/* ---- a second memory over a counting source ------------------------------ */

/* A real source: each handle is a malloc'd buffer of the size asked for, and
 * the source counts what it holds. It refuses past `capacity` live bytes. */
typedef struct csrc {
    size_t capacity; /* 0: none */
    size_t live_bytes, last;
    int live, takes, gives, refusals;
} csrc;

typedef struct cbuf {
    size_t bytes;
    unsigned char data[];
} cbuf;

static void *csrc_take(void *self, size_t bytes) {
    csrc *s = self;
    if (s->capacity && s->live_bytes + bytes > s->capacity) return s->refusals++, NULL;
    cbuf *b = malloc(sizeof *b + bytes);
    if (!b) return s->refusals++, NULL;
    b->bytes = bytes;
    memset(b->data, 0x5a, bytes);
    s->live++, s->takes++, s->live_bytes += bytes, s->last = bytes;
    return b;
}

static void csrc_give(void *self, void *handle) {
    csrc *s = self;
    cbuf *b = handle;
    s->live--, s->gives++, s->live_bytes -= b->bytes;
    free(b);
}

static int dev_init(fr_mem *m, csrc *s) {
    memset(s, 0, sizeof *s);
    fr_mem_source src = {csrc_take, csrc_give, s, "the test device"};
    return fr_mem_init_source(m, &src, &fr_mem_device_classes);
}

static fr_mem_stats mstats(const fr_mem *m) {
    fr_mem_stats s;
    fr_mem_stats_of(m, &s);
    return s;
}

/* The device classes by hand (PyTorch's kMinBlockSize 512, kSmallSize 1 MiB,
 * kRoundLarge 2 MiB; one buffer per block): up to 1 MiB, a multiple of 512
 * (at least 512); above, a multiple of 2 MiB. */
static void test_device_classes(void) {
    static const struct {
        size_t bytes, want;
    } c[] = {
        {0, 512},                 /* never an empty buffer */
        {1, 512},                 /* kMinBlockSize */
        {512, 512},               /* exact */
        {513, 1024},              /* 2 units of 512 */
        {100000, 100352},         /* 195.3 units -> 196 * 512 */
        {MiB, MiB},               /* the largest small request: 2048 units */
        {MiB + 1, 2 * MiB},       /* large: one 2 MiB unit */
        {3 * MiB, 4 * MiB},       /* 1.5 units -> 2 */
        {20 * MiB, 20 * MiB},     /* exact */
        {21 * MiB + 5, 22 * MiB}, /* 10.5 units -> 11 */
    };
    fr_ctx *ctx = fr_ctx_new();
    fr_mem m;
    csrc s;
    CHECK(dev_init(&m, &s) == 0, "a memory over the counting source");
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK(fr_mem_class_bytes(&m, c[i].bytes) == c[i].want, "device class of %zu: %zu, want %zu",
              c[i].bytes, fr_mem_class_bytes(&m, c[i].bytes), c[i].want);
        size_t r0 = mstats(&m).reserved;
        void *h = fr_mem_take(ctx, &m, c[i].bytes, FR_MEM_PARAMS);
        fr_mem_stats st = mstats(&m);
        CHECK(h && s.last == c[i].want && st.reserved - r0 == c[i].want &&
                  st.allocated[FR_MEM_PARAMS] == c[i].bytes,
              "take(%zu): the source gave %zu, reserved grew by %zu, allocated %zu", c[i].bytes,
              s.last, st.reserved - r0, st.allocated[FR_MEM_PARAMS]);
        fr_mem_give(ctx, &m, h);
        fr_mem_empty_cache_of(&m);
    }
    CHECK(s.live == 0 && s.takes == s.gives && mstats(&m).reserved == 0, "all given back");
    fr_mem_destroy(&m);

    fr_mem_source bad = {csrc_take, NULL, &s, "no give"};
    fr_mem_classes zero = {0, MiB, 2 * MiB, 0};
    fr_mem_source good = {csrc_take, csrc_give, &s, NULL};
    CHECK(fr_mem_init_source(&m, &bad, &fr_mem_device_classes) != 0 &&
              fr_mem_init_source(&m, &good, &zero) != 0,
          "a source without give, or classes with a zero rounding, are refused");
    fr_ctx_free(ctx);
}

static void test_device_cache(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem m;
    csrc s;
    dev_init(&m, &s);
    void *a = fr_mem_take(ctx, &m, 1000, FR_MEM_ACTIVATIONS); /* class 1024 */
    void *b = fr_mem_take(ctx, &m, 3 * MiB, FR_MEM_PARAMS);   /* class 4 MiB */
    fr_mem_give(ctx, &m, a);
    fr_mem_give(ctx, &m, a); /* a second give of the same handle is ignored */
    fr_mem_stats st = mstats(&m);
    CHECK(s.live == 2 && st.cached == 1024 && st.reserved == 1024 + 4 * MiB && st.num_frees == 1 &&
              st.allocated[FR_MEM_ACTIVATIONS] == 0,
          "every freed device block is cached, even a small one; a double give is ignored");

    void *c = fr_mem_take(ctx, &m, 600, FR_MEM_WORKSPACE); /* class 1024 again */
    st = mstats(&m);
    CHECK(c == a && s.takes == 2 && st.num_cache_hits == 1 && st.cached == 0 &&
              st.allocated[FR_MEM_WORKSPACE] == 600,
          "a request of the same class (600 -> 1024) reuses the buffer");
    void *d = fr_mem_take(ctx, &m, 1025, FR_MEM_WORKSPACE); /* class 1536 */
    fr_mem_give(ctx, &m, b);
    void *e = fr_mem_take(ctx, &m, 2 * MiB + 1, FR_MEM_PARAMS); /* class 4 MiB: b's */
    st = mstats(&m);
    CHECK(d && d != a && e == b && s.takes == 3 && st.num_cache_hits == 2,
          "another class takes anew (1025 -> 1536); 2 MiB + 1 reuses the 4 MiB buffer");
    void *f = fr_mem_take(ctx, &m, 5 * MiB, FR_MEM_PARAMS); /* class 6 MiB */
    fr_mem_give(ctx, &m, c), fr_mem_give(ctx, &m, d), fr_mem_give(ctx, &m, e),
        fr_mem_give(ctx, &m, f);
    st = mstats(&m);
    size_t all = 1024 + 1536 + 4 * MiB + 6 * MiB;
    CHECK(s.live == 4 && st.cached == all && st.reserved == all && st.allocated_total == 0,
          "four buffers cached, %zu bytes", all);
    fr_mem_empty_cache_of(&m);
    st = mstats(&m);
    CHECK(s.live == 0 && s.live_bytes == 0 && s.gives == s.takes && st.reserved == 0 &&
              st.cached == 0 && st.reserved_peak == 1024 + 4 * MiB + 1536 + 6 * MiB,
          "empty_cache gives every buffer back to the source (peak %zu)", st.reserved_peak);

    /* arena and track on this memory */
    void *ar = fr_mem_take_arena(ctx, &m, 3 * MiB);
    fr_mem_track_of(&m, FR_MEM_ACTIVATIONS, 1000);
    st = mstats(&m);
    CHECK(ar && st.reserved == 4 * MiB && st.allocated_total == 1000 &&
              stats(ctx).allocated_total == 0 && stats(ctx).reserved == 0,
          "an arena on the device memory is reserved there; the host memory is untouched");
    fr_mem_track_of(&m, FR_MEM_ACTIVATIONS, -1000);
    fr_mem_give(ctx, &m, ar);
    fr_mem_reset_peak_of(&m);
    fr_mem_destroy(&m); /* gives the cached arena back */
    CHECK(s.live == 0, "destroy gives the cache back");
    fr_ctx_free(ctx);
}

static void test_device_refusals(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem m;
    csrc s;
    dev_init(&m, &s);
    /* the budget */
    fr_mem_set_limit_of(&m, 3 * MiB);
    void *a = fr_mem_take(ctx, &m, 2 * MiB, FR_MEM_PARAMS);
    void *b = fr_mem_take(ctx, &m, MiB + MiB / 2, FR_MEM_GRADS); /* class 2 MiB: 4 > 3 */
    fr_mem_stats st = mstats(&m);
    const char *msg = fr_last_error(ctx);
    CHECK(a && !b && s.takes == 1 && st.num_ooms == 1 && st.reserved == 2 * MiB &&
              strstr(msg, "memory budget exceeded") && strstr(msg, "gradients") &&
              strstr(msg, "3145728"),
          "over the limit: refused before the source is asked: '%s'", msg);
    void *c = fr_mem_take(ctx, &m, MiB, FR_MEM_GRADS); /* class 1 MiB: 3 <= 3 */
    CHECK(c && mstats(&m).reserved == 3 * MiB, "up to the limit fits");
    fr_mem_give(ctx, &m, c);
    fr_mem_set_limit_of(&m, 0);

    /* the source refusing: counted as an OOM, after the cache was given back */
    s.capacity = 4 * MiB;
    void *d = fr_mem_take(ctx, &m, 3 * MiB, FR_MEM_DATA); /* 4 MiB: 2 + 4 > 4 */
    st = mstats(&m);
    msg = fr_last_error(ctx);
    CHECK(!d && st.num_ooms == 2 && s.live == 1 && st.cached == 0 && st.reserved == 2 * MiB &&
              strstr(msg, "the test device refused") && strstr(msg, "data"),
          "the source refuses: the cache (1 MiB) went back, then an OOM: '%s'", msg);
    void *e = fr_mem_take(ctx, &m, MiB, FR_MEM_DATA);
    fr_mem_give(ctx, &m, e);                              /* cached: 2 + 1 of the 4 */
    void *f = fr_mem_take(ctx, &m, 2 * MiB, FR_MEM_DATA); /* 2 + 1 + 2 > 4: the cache goes */
    st = mstats(&m);
    CHECK(f && st.num_ooms == 2 && st.cached == 0 && s.live == 2 && st.reserved == 4 * MiB,
          "a refusal with something cached gives the cache back and asks again");
    fr_mem_give(ctx, &m, a);
    fr_mem_give(ctx, &m, f);
    fr_mem_destroy(&m);
    CHECK(s.live == 0, "nothing left at the source");
    fr_ctx_free(ctx);
}

/* Seven device blocks of mixed classes; on failure give back what was taken. */
static fr_status dev_build(fr_ctx *ctx, fr_mem *m, void *out[7]) {
    static const size_t sizes[7] = {100, 3 * MiB, 512, 1000, MiB, 7, 3 * MiB};
    for (int i = 0; i < 7; i++) {
        out[i] = fr_mem_take(ctx, m, sizes[i], (fr_mem_cat)(i % FR_MEM_CAT_COUNT));
        if (!out[i]) {
            while (i--) fr_mem_give(ctx, m, out[i]);
            return FR_ERR_NOMEM;
        }
    }
    return FR_OK;
}

static void test_device_faults(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_mem m;
    csrc s;
    dev_init(&m, &s);
    for (uint64_t n = 1; n <= 8; n++) {
        void *blk[7];
        fr_mem_stats before = mstats(&m);
        fr_mem_fail_at_of(&m, n);
        fr_status st = dev_build(ctx, &m, blk);
        fr_mem_stats after = mstats(&m);
        if (n <= 7) {
            CHECK(st == FR_ERR_NOMEM && after.allocated_total == 0 &&
                      after.num_ooms == before.num_ooms + 1 &&
                      after.num_allocs == before.num_allocs + (n - 1) &&
                      strstr(fr_last_error(ctx), "(injected failure)"),
                  "device builder with take %llu failing: clean", (unsigned long long)n);
        } else {
            CHECK(st == FR_OK && after.num_ooms == before.num_ooms, "builder succeeds at n = 8");
            for (int i = 0; i < 7; i++) fr_mem_give(ctx, &m, blk[i]);
        }
        fr_mem_fail_at_of(&m, 0);
        fr_mem_empty_cache_of(&m);
        CHECK(s.live == 0 && mstats(&m).reserved == 0, "n = %llu: the source holds nothing",
              (unsigned long long)n);
    }

    /* the side table's growth failing: the first take needs a table */
    fr_mem_destroy(&m);
    dev_init(&m, &s);
    fr_mem_table_fail_at(&m, 1);
    void *h = fr_mem_take(ctx, &m, 100, FR_MEM_PARAMS);
    fr_mem_stats st = mstats(&m);
    CHECK(!h && s.takes == 0 && st.num_ooms == 1 && st.reserved == 0 &&
              fr_mem_table_bytes(&m) == 0 && strstr(fr_last_error(ctx), "table"),
          "a table that cannot grow refuses before the source is asked: '%s'", fr_last_error(ctx));
    /* a table of 64 slots holds 48 (load 3/4); the 49th block needs growth */
    void *k[49];
    int ok = 1;
    for (int i = 0; i < 48; i++) ok &= (k[i] = fr_mem_take(ctx, &m, 512, FR_MEM_PARAMS)) != NULL;
    size_t tb = fr_mem_table_bytes(&m);
    fr_mem_table_fail_at(&m, 1);
    k[48] = fr_mem_take(ctx, &m, 512, FR_MEM_PARAMS);
    st = mstats(&m);
    CHECK(ok && tb > 0 && !k[48] && s.live == 48 && st.num_ooms == 2 &&
              st.allocated_total == 48 * 512 && fr_mem_table_bytes(&m) == tb,
          "the 49th block's table growth fails cleanly; the table is as it was");
    k[48] = fr_mem_take(ctx, &m, 512, FR_MEM_PARAMS);
    CHECK(k[48] && fr_mem_table_bytes(&m) == 2 * tb && s.live == 49,
          "then it grows (doubles: %zu -> %zu bytes)", tb, fr_mem_table_bytes(&m));
    for (int i = 0; i < 49; i++) fr_mem_give(ctx, &m, k[i]);
    CHECK(mstats(&m).allocated_total == 0 && s.live == 49, "all 49 given, cached");
    fr_mem_destroy(&m);
    CHECK(s.live == 0 && s.gives == s.takes, "nothing leaked");

    /* host: the table failing in fr_alloc (this context's host memory has
     * taken nothing yet, so its table is empty) is an ordinary failure */
    fr_mem_table_fail_at(&ctx->mem, 1);
    void *p = fr_alloc(ctx, 10, FR_MEM_OTHER);
    CHECK(!p && stats(ctx).num_ooms == 1 && stats(ctx).reserved == 0 &&
              strstr(fr_last_error(ctx), "out of memory"),
          "host: a failed table growth is a clean out-of-memory: '%s'", fr_last_error(ctx));
    p = fr_alloc(ctx, 10, FR_MEM_OTHER);
    CHECK(p && stats(ctx).reserved == 64, "and the next allocation works");
    fr_free(ctx, p);
    fr_ctx_free(ctx);
}

/* ---- a small JSON reader, independent of the writer ---------------------- */

typedef struct jkv {
    char path[96];
    unsigned long long v;
} jkv;

typedef struct jreader {
    const char *s;
    size_t i;
    jkv kv[64];
    int n;
    int ok;
} jreader;

static void jws(jreader *r) {
    while (r->s[r->i] == ' ' || r->s[r->i] == '\n' || r->s[r->i] == '\t' || r->s[r->i] == '\r')
        r->i++;
}

static int jstring(jreader *r, char *out, size_t cap) {
    if (r->s[r->i] != '"') return 0;
    r->i++;
    size_t n = 0;
    while (r->s[r->i] && r->s[r->i] != '"') {
        char c = r->s[r->i++];
        if ((unsigned char)c < 0x20) return 0;
        if (c == '\\') {
            c = r->s[r->i++];
            if (!c || !strchr("\"\\/bfnrtu", c)) return 0;
            if (c == 'u') {
                for (int k = 0; k < 4; k++)
                    if (!isxdigit((unsigned char)r->s[r->i++])) return 0;
                c = '?';
            }
        }
        if (n + 1 < cap) out[n++] = c;
    }
    if (r->s[r->i] != '"') return 0;
    r->i++;
    out[n] = 0;
    return 1;
}

static int jvalue(jreader *r, const char *path, int depth);

static int jnumber(jreader *r, const char *path) {
    size_t start = r->i;
    if (r->s[r->i] == '-') r->i++;
    if (r->s[r->i] == '0') r->i++;
    else if (isdigit((unsigned char)r->s[r->i]))
        while (isdigit((unsigned char)r->s[r->i])) r->i++;
    else return 0;
    int integer = r->s[start] != '-';
    if (r->s[r->i] == '.') {
        integer = 0, r->i++;
        if (!isdigit((unsigned char)r->s[r->i])) return 0;
        while (isdigit((unsigned char)r->s[r->i])) r->i++;
    }
    if (r->s[r->i] == 'e' || r->s[r->i] == 'E') {
        integer = 0, r->i++;
        if (r->s[r->i] == '+' || r->s[r->i] == '-') r->i++;
        if (!isdigit((unsigned char)r->s[r->i])) return 0;
        while (isdigit((unsigned char)r->s[r->i])) r->i++;
    }
    if (integer && r->n < 64) {
        unsigned long long v = 0;
        for (size_t k = start; k < r->i; k++) v = v * 10 + (unsigned)(r->s[k] - '0');
        snprintf(r->kv[r->n].path, sizeof r->kv[r->n].path, "%s", path);
        r->kv[r->n++].v = v;
    }
    return 1;
}

static int jobject(jreader *r, const char *path, int depth) {
    r->i++; /* '{' */
    jws(r);
    if (r->s[r->i] == '}') return r->i++, 1;
    for (;;) {
        char key[64], sub[96];
        jws(r);
        if (!jstring(r, key, sizeof key)) return 0;
        jws(r);
        if (r->s[r->i++] != ':') return 0;
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", key);
        if (!jvalue(r, sub, depth + 1)) return 0;
        jws(r);
        char c = r->s[r->i++];
        if (c == '}') return 1;
        if (c != ',') return 0;
    }
}

static int jarray(jreader *r, const char *path, int depth) {
    r->i++; /* '[' */
    jws(r);
    if (r->s[r->i] == ']') return r->i++, 1;
    for (;;) {
        if (!jvalue(r, path, depth + 1)) return 0;
        jws(r);
        char c = r->s[r->i++];
        if (c == ']') return 1;
        if (c != ',') return 0;
    }
}

static int jvalue(jreader *r, const char *path, int depth) {
    if (depth > 16) return 0;
    jws(r);
    char c = r->s[r->i];
    char tmp[64];
    if (c == '{') return jobject(r, path, depth);
    if (c == '[') return jarray(r, path, depth);
    if (c == '"') return jstring(r, tmp, sizeof tmp);
    if (!strncmp(r->s + r->i, "true", 4)) return r->i += 4, 1;
    if (!strncmp(r->s + r->i, "false", 5)) return r->i += 5, 1;
    if (!strncmp(r->s + r->i, "null", 4)) return r->i += 4, 1;
    return jnumber(r, path);
}

static int jparse(jreader *r, const char *s) {
    memset(r, 0, sizeof *r);
    r->s = s;
    jws(r);
    if (r->s[r->i] != '{' || !jvalue(r, "", 0)) return 0;
    jws(r);
    return r->s[r->i] == 0;
}

/* The value at path, or -1 if absent or present more than once. */
static long long jget(const jreader *r, const char *path) {
    long long v = -1;
    int seen = 0;
    for (int k = 0; k < r->n; k++)
        if (!strcmp(r->kv[k].path, path)) v = (long long)r->kv[k].v, seen++;
    return seen == 1 ? v : -1;
}

static char *slurp(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) return NULL;
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    return buf;
}

static void test_reader_itself(void) {
    jreader r;
    CHECK(jparse(&r, "{\"a\": {\"b\": 12, \"c\": [1, 2.5e3, \"x\\n\"]}, \"d\": true}") &&
              jget(&r, "a.b") == 12,
          "the test's JSON reader reads valid JSON");
    const char *bad[] = {"{\"a\": 1,}",    "{\"a\" 1}", "{\"a\": 01}", "{\"a\": 1} x",
                         "{\"a\": [1 2]}", "{\"a\": 1", "{a: 1}"};
    int rejected = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) rejected += !jparse(&r, bad[i]);
    CHECK(rejected == (int)(sizeof bad / sizeof bad[0]), "and rejects invalid JSON (%d of %zu)",
          rejected, sizeof bad / sizeof bad[0]);
}

/* ---- reports -------------------------------------------------------------- */

static void test_reports(void) {
    fr_ctx *ctx = fr_ctx_new();
    /* a known state: params 1.5 MiB live; grads 2 MiB freed (cached); a
     * refused allocation under a limit; workspace tracked in an arena */
    void *p = fr_alloc(ctx, MiB + MiB / 2, FR_MEM_PARAMS);
    void *g = fr_alloc(ctx, 2 * MiB, FR_MEM_GRADS);
    fr_free(ctx, g);
    void *ar = fr_arena_alloc(ctx, 64 * KiB);
    fr_mem_track(ctx, FR_MEM_WORKSPACE, 12345);
    fr_mem_set_limit(ctx, 64 * MiB);
    void *no = fr_alloc(ctx, 100 * MiB, FR_MEM_DATA);
    CHECK(p && ar && !no, "setup");
    fr_mem_stats s = stats(ctx);

    FILE *f = tmpfile();
    if (!f) {
        CHECK(0, "tmpfile");
        return;
    }
    fr_mem_json(ctx, f);
    char *json = slurp(f);
    fclose(f);
    jreader r;
    CHECK(json && jparse(&r, json), "fr_mem_json writes valid JSON: %s", json ? json : "(null)");
    if (json) {
        int cats_ok = 1;
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++) {
            char k1[64], k2[64];
            snprintf(k1, sizeof k1, "allocated.%s", fr_mem_cat_name((fr_mem_cat)c));
            snprintf(k2, sizeof k2, "allocated_peak.%s", fr_mem_cat_name((fr_mem_cat)c));
            cats_ok &= jget(&r, k1) == (long long)s.allocated[c];
            cats_ok &= jget(&r, k2) == (long long)s.allocated_peak[c];
        }
        CHECK(cats_ok, "every category, current and peak, with its byte count");
        CHECK(jget(&r, "allocated.parameters") == (long long)(MiB + MiB / 2) &&
                  jget(&r, "allocated_peak.gradients") == (long long)(2 * MiB) &&
                  jget(&r, "allocated.workspace") == 12345,
              "the known numbers");
        struct {
            const char *key;
            unsigned long long v;
        } top[] = {{"allocated_total", s.allocated_total},
                   {"allocated_total_peak", s.allocated_total_peak},
                   {"reserved", s.reserved},
                   {"reserved_peak", s.reserved_peak},
                   {"cached", s.cached},
                   {"limit", 64 * MiB},
                   {"num_allocs", 3},
                   {"num_frees", 1},
                   {"num_cache_hits", 0},
                   {"num_ooms", 1}};
        for (size_t k = 0; k < sizeof top / sizeof top[0]; k++)
            CHECK(jget(&r, top[k].key) == (long long)top[k].v, "json %s = %lld, want %llu",
                  top[k].key, jget(&r, top[k].key), top[k].v);
        CHECK(r.n == 2 * FR_MEM_CAT_COUNT + 10, "no other numbers (%d)", r.n);
        free(json);
    }

    f = tmpfile();
    if (!f) {
        CHECK(0, "tmpfile");
        return;
    }
    fr_mem_summary(ctx, f);
    char *text = slurp(f);
    fclose(f);
    CHECK(text != NULL, "summary written");
    if (text) {
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
            CHECK(strstr(text, fr_mem_cat_name((fr_mem_cat)c)) != NULL, "summary names %s",
                  fr_mem_cat_name((fr_mem_cat)c));
        char want[32];
        CHECK(strstr(text, "1.5 MiB") && strstr(text, "2.0 MiB") && strstr(text, "12.1 KiB") &&
                  strstr(text, "64.0 MiB") && strstr(text, "Reserved") &&
                  strstr(text, fr_human_bytes(s.reserved, want, sizeof want)),
              "summary shows the known sizes, the limit and reserved:\n%s", text);
        /* a table: every line as wide as the first */
        size_t w = strcspn(text, "\n");
        int lines = 0, aligned = 1;
        for (char *l = text; *l; lines++) {
            size_t n = strcspn(l, "\n");
            aligned &= n == w && l[0] == '|' && l[n - 1] == '|';
            l += n + (l[n] == '\n');
        }
        CHECK(aligned && lines > 10, "summary is an aligned table of %d lines", lines);
        printf("%s", text);
        free(text);
    }
    fr_mem_summary(ctx, NULL); /* no crash */
    fr_mem_json(ctx, NULL);

    fr_mem_track(ctx, FR_MEM_WORKSPACE, -12345);
    fr_arena_free(ctx, ar);
    fr_free(ctx, p);
    fr_ctx_free(ctx);
}

static void test_human_bytes(void) {
    struct {
        size_t b;
        const char *want;
    } c[] = {{0, "0 B"},
             {1, "1 B"},
             {1023, "1023 B"},
             {1024, "1.0 KiB"},
             {1536, "1.5 KiB"},
             {12345, "12.1 KiB"},
             {1048575, "1.0 MiB"},
             {1048576, "1.0 MiB"},
             {10 * MiB + MiB / 2, "10.5 MiB"},
             {3 * (MiB << 10), "3.0 GiB"},
             {(size_t)1 << 40, "1024.0 GiB"}};
    char buf[32];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const char *got = fr_human_bytes(c[i].b, buf, sizeof buf);
        CHECK(got == buf && !strcmp(buf, c[i].want), "fr_human_bytes(%zu) = '%s', want '%s'",
              c[i].b, buf, c[i].want);
    }
    char tiny[4] = "xyz";
    fr_human_bytes(1536, tiny, sizeof tiny);
    CHECK(!strcmp(tiny, "1.5"), "truncates to the buffer: '%s'", tiny);
    char none[2] = "q";
    fr_human_bytes(1536, none, 0);
    CHECK(none[0] == 'q', "len 0 writes nothing");
}

int main(void) {
    test_categories();
    test_cache();
    test_limit();
    test_fail_at();
    test_arena();
    test_host_classes();
    test_table_churn();
    test_device_classes();
    test_device_cache();
    test_device_refusals();
    test_device_faults();
    test_reader_itself();
    test_reports();
    test_human_bytes();
    return check_done();
}
