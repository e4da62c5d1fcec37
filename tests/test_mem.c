/* test_mem.c — the accounting allocator (src/mem/mem.c) and its reports
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
    CHECK(s.reserved >= 4500 + 3 * 64 && s.reserved_peak == s.reserved && s.cached == 0,
          "reserved covers the bytes and a header each (%zu)", s.reserved);

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
    size_t R = s.reserved; /* the block with its header, rounded up a little */
    CHECK(p && R > MiB && R <= MiB + 8 * KiB && s.cached == 0, "1 MiB block reserves %zu", R);

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
    CHECK(r && s.num_cache_hits == 1 && R2 > 2 * MiB && R2 <= 2 * MiB + 8 * KiB,
          "another size is no hit and reserves anew");
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
    CHECK(ar && R > MiB && s.allocated_total == 0 && s.num_allocs == 1,
          "an arena is reserved, not allocated");
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
    test_reader_itself();
    test_reports();
    test_human_bytes();
    return check_done();
}
