/* mem.c — the accounting allocator (see mem.h). A block is the source's
 * handle alone; its metadata lives in a side table (an open-addressing hash
 * with linear probing, keyed by the handle, malloc'd and not counted).
 * Freed blocks of cls.cache_min bytes and more stay in size bins and are
 * handed out again for the same class, the way PyTorch's caching allocator
 * keeps freed blocks reserved; fr_mem_empty_cache_of gives them back. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/ctx.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define FR_MEM_MAX_REQUEST ((size_t)1 << 46) /* beyond any machine */

struct fr_mem_entry {
    void *handle;    /* NULL: an empty slot */
    void *next;      /* the next handle in the same cache bin, while cached */
    size_t bytes;    /* what the caller asked for */
    size_t reserved; /* what the block holds from the source */
    fr_mem_cat cat;
    unsigned char arena; /* 1: a planned arena, counted as reserved only */
    unsigned char live;  /* 0: in the cache */
};

const fr_mem_classes fr_mem_host_classes = {.round_small = FR_MEM_ALIGN,
                                            .small_max = 64 * KiB - 1,
                                            .round_large = 4 * KiB,
                                            .cache_min = 64 * KiB};
const fr_mem_classes fr_mem_device_classes = {
    .round_small = 512, .small_max = MiB, .round_large = 2 * MiB, .cache_min = 0};

static void *host_take(void *self, size_t bytes) {
    (void)self;
    void *p = NULL;
    return posix_memalign(&p, FR_MEM_ALIGN, bytes) == 0 ? p : NULL;
}

static void host_give(void *self, void *handle) {
    (void)self;
    free(handle);
}

static const fr_mem_source host_source = {host_take, host_give, NULL, "the system"};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int fr_mem_init_source(fr_mem *m, const fr_mem_source *src, const fr_mem_classes *cls) {
    memset(m, 0, sizeof *m);
    if (!src || !src->take || !src->give || !cls || !cls->round_small || !cls->round_large)
        return -1;
    m->src = *src;
    if (!m->src.name) m->src.name = "the source";
    m->cls = *cls;
    return pthread_mutex_init(&m->lock, NULL);
}

int fr_mem_init(fr_mem *m) { return fr_mem_init_source(m, &host_source, &fr_mem_host_classes); }

/* ---- the side table ------------------------------------------------------ */

static size_t home_of(const fr_mem *m, const void *handle) {
    uint64_t x = 0; /* the handle's bits (memcpy: uintptr_t may be narrower than uint64_t) */
    memcpy(&x, &handle, sizeof handle < sizeof x ? sizeof handle : sizeof x);
    /* mixed so that aligned handles spread over all slots (MurmurHash3's finalizer) */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (size_t)x & (m->table_cap - 1);
}

static fr_mem_entry *find(const fr_mem *m, const void *handle) {
    if (!m->table_cap) return NULL;
    for (size_t i = home_of(m, handle);; i = (i + 1) & (m->table_cap - 1)) {
        if (m->table[i].handle == handle) return &m->table[i];
        if (!m->table[i].handle) return NULL;
    }
}

/* Room for one more entry assured by make_room. */
static fr_mem_entry *insert(fr_mem *m, void *handle) {
    size_t i = home_of(m, handle);
    while (m->table[i].handle) i = (i + 1) & (m->table_cap - 1);
    m->table[i] = (fr_mem_entry){.handle = handle};
    m->table_len++;
    return &m->table[i];
}

/* Delete by shifting back the entries after it that probed past its slot,
 * so every entry stays reachable from its home without tombstones. */
static void erase(fr_mem *m, fr_mem_entry *e) {
    size_t mask = m->table_cap - 1, hole = (size_t)(e - m->table);
    for (size_t j = (hole + 1) & mask; m->table[j].handle; j = (j + 1) & mask) {
        size_t home = home_of(m, m->table[j].handle);
        /* the entry at j may move to the hole unless its home lies in (hole, j] */
        int stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            m->table[hole] = m->table[j];
            hole = j;
        }
    }
    m->table[hole].handle = NULL;
    m->table_len--;
}

/* Keep the load at most 3/4 after one more insert; 0, or -1 when the growth
 * fails (the table is then as it was). */
static int make_room(fr_mem *m) {
    if ((m->table_len + 1) * 4 <= m->table_cap * 3) return 0;
    if (m->table_fail_at && --m->table_fail_at == 0) return -1;
    size_t cap = m->table_cap ? 2 * m->table_cap : 64;
    fr_mem_entry *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    fr_mem_entry *old = m->table;
    size_t old_cap = m->table_cap;
    m->table = t;
    m->table_cap = cap;
    m->table_len = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].handle) *insert(m, old[i].handle) = old[i];
    free(old);
    return 0;
}

size_t fr_mem_table_bytes(const fr_mem *m) {
    fr_mem *mm = (fr_mem *)m;
    pthread_mutex_lock(&mm->lock);
    size_t n = m->table_cap * sizeof(fr_mem_entry);
    pthread_mutex_unlock(&mm->lock);
    return n;
}

void fr_mem_table_fail_at(fr_mem *m, uint64_t n) {
    pthread_mutex_lock(&m->lock);
    m->table_fail_at = n;
    pthread_mutex_unlock(&m->lock);
}

/* ---- the cache -------------------------------------------------------------- */

/* Bins by the power of two and the next two bits, so a bin holds few
 * classes and finding a class walks a short list (each step a table lookup). */
static int bin_of(size_t bytes) {
    int lg = 0;
    while (bytes >> lg > 1) lg++;
    int b = 4 * lg + (lg >= 2 ? (int)(bytes >> (lg - 2)) & 3 : 0);
    return b < FR_MEM_CACHE_BINS ? b : FR_MEM_CACHE_BINS - 1;
}

static void release_cache(fr_mem *m) {
    for (int b = 0; b < FR_MEM_CACHE_BINS; b++) {
        while (m->cache[b]) {
            fr_mem_entry *e = find(m, m->cache[b]);
            void *handle = e->handle;
            m->cache[b] = e->next;
            m->st.reserved -= e->reserved;
            m->st.cached -= e->reserved;
            erase(m, e);
            m->src.give(m->src.self, handle);
        }
    }
}

/* The cached block of exactly `reserved` bytes, unlinked; NULL if none. */
static fr_mem_entry *take_cached(fr_mem *m, size_t reserved) {
    for (void **link = &m->cache[bin_of(reserved)]; *link;) {
        fr_mem_entry *e = find(m, *link);
        if (e->reserved == reserved) {
            *link = e->next;
            e->next = NULL;
            m->st.cached -= reserved;
            m->st.num_cache_hits++;
            return e;
        }
        link = &e->next;
    }
    return NULL;
}

void fr_mem_destroy(fr_mem *m) {
    release_cache(m);
    free(m->table);
    free(m->events);
    pthread_mutex_destroy(&m->lock);
}

/* ---- accounting --------------------------------------------------------- */

static void trace(fr_mem *m, int64_t delta, fr_mem_cat cat) {
    if (!m->tracing) return;
    if (m->n_events == m->cap_events) {
        size_t cap = m->cap_events ? 2 * m->cap_events : 4096;
        fr_mem_event *ev = realloc(m->events, cap * sizeof *ev);
        if (!ev) {
            m->tracing = 0; /* the trace is diagnostics: stop it rather than fail the step */
            return;
        }
        m->events = ev;
        m->cap_events = cap;
    }
    m->events[m->n_events++] = (fr_mem_event){now_us() - m->t0, delta, cat, m->tag};
}

static void count_alloc(fr_mem *m, fr_mem_cat cat, size_t bytes) {
    m->st.allocated[cat] += bytes;
    if (m->st.allocated[cat] > m->st.allocated_peak[cat])
        m->st.allocated_peak[cat] = m->st.allocated[cat];
    m->st.allocated_total += bytes;
    if (m->st.allocated_total > m->st.allocated_total_peak)
        m->st.allocated_total_peak = m->st.allocated_total;
    trace(m, (int64_t)bytes, cat);
}

static void count_free(fr_mem *m, fr_mem_cat cat, size_t bytes) {
    m->st.allocated[cat] -= bytes;
    m->st.allocated_total -= bytes;
    trace(m, -(int64_t)bytes, cat);
}

static void count_reserve(fr_mem *m, size_t bytes) {
    m->st.reserved += bytes;
    if (m->st.reserved > m->st.reserved_peak) m->st.reserved_peak = m->st.reserved;
}

/* ---- taking and giving -------------------------------------------------- */

static size_t class_bytes(const fr_mem_classes *c, size_t bytes) {
    if (bytes > FR_MEM_MAX_REQUEST) return bytes; /* refused anyway; no overflow */
    size_t r = bytes <= c->small_max ? c->round_small : c->round_large;
    size_t n = (bytes + r - 1) / r * r;
    return n ? n : c->round_small;
}

size_t fr_mem_class_bytes(const fr_mem *m, size_t bytes) { return class_bytes(&m->cls, bytes); }
size_t fr_mem_block_bytes(size_t bytes) { return class_bytes(&fr_mem_host_classes, bytes); }

/* Where a refusal happened, for messages: nothing for the host's memory,
 * " on the OpenCL device" (the source's name) for another. */
static const char *where(const fr_mem *m, char *buf, size_t len) {
    if (m->src.take == host_take) return "";
    snprintf(buf, len, " on %s", m->src.name ? m->src.name : "a device");
    return buf;
}

/* The entry of a block of `reserved` bytes, from the cache or the source;
 * lock held. On failure: NULL, the error set, the refusal counted. */
static fr_mem_entry *take_block(fr_ctx *ctx, fr_mem *m, size_t bytes, size_t reserved,
                                fr_mem_cat cat) {
    char on[96];
    if (m->fail_at && --m->fail_at == 0) {
        m->st.num_ooms++;
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory%s: %zu bytes for %s (injected failure)",
                where(m, on, sizeof on), bytes, fr_mem_cat_name(cat));
        return NULL;
    }
    if (reserved >= m->cls.cache_min) {
        fr_mem_entry *e = take_cached(m, reserved);
        if (e) return e;
    }
    if (m->st.limit && m->st.reserved + reserved > m->st.limit) {
        release_cache(m); /* like PyTorch: free cached blocks and retry before failing */
        if (m->st.reserved + reserved > m->st.limit) {
            m->st.num_ooms++;
            fr_fail(ctx, FR_ERR_NOMEM,
                    "memory budget exceeded%s: %zu bytes for %s would bring reserved to %zu of a "
                    "%zu-byte limit",
                    where(m, on, sizeof on), bytes, fr_mem_cat_name(cat), m->st.reserved + reserved,
                    m->st.limit);
            return NULL;
        }
    }
    if (make_room(m) != 0) {
        m->st.num_ooms++;
        fr_fail(ctx, FR_ERR_NOMEM,
                "out of memory: the allocator's block table could not grow past %zu slots for "
                "%zu bytes for %s",
                m->table_cap, bytes, fr_mem_cat_name(cat));
        return NULL;
    }
    void *handle = m->src.take(m->src.self, reserved);
    if (!handle && m->st.cached) {
        release_cache(m); /* as PyTorch does when cudaMalloc fails */
        handle = m->src.take(m->src.self, reserved);
    }
    if (!handle) {
        m->st.num_ooms++;
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory: %s refused %zu bytes for %s", m->src.name, bytes,
                fr_mem_cat_name(cat));
        return NULL;
    }
    count_reserve(m, reserved);
    return insert(m, handle);
}

static void *take_impl(fr_ctx *ctx, fr_mem *m, size_t bytes, fr_mem_cat cat, int arena) {
    if ((unsigned)cat >= FR_MEM_CAT_COUNT) cat = FR_MEM_OTHER;
    if (bytes > FR_MEM_MAX_REQUEST) {
        pthread_mutex_lock(&m->lock);
        m->st.num_ooms++;
        pthread_mutex_unlock(&m->lock);
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory: %zu bytes for %s is beyond any machine", bytes,
                fr_mem_cat_name(cat));
        return NULL;
    }
    size_t reserved = class_bytes(&m->cls, bytes);
    pthread_mutex_lock(&m->lock);
    fr_mem_entry *e = take_block(ctx, m, bytes, reserved, cat);
    void *handle = NULL;
    if (e) {
        e->bytes = bytes;
        e->reserved = reserved;
        e->cat = cat;
        e->arena = (unsigned char)arena;
        e->live = 1;
        handle = e->handle;
        m->st.num_allocs++;
        if (!arena) count_alloc(m, cat, bytes);
    }
    pthread_mutex_unlock(&m->lock);
    return handle;
}

void *fr_mem_take(fr_ctx *ctx, fr_mem *m, size_t bytes, fr_mem_cat cat) {
    return take_impl(ctx, m, bytes, cat, 0);
}

void *fr_mem_take_arena(fr_ctx *ctx, fr_mem *m, size_t bytes) {
    return take_impl(ctx, m, bytes, FR_MEM_OTHER, 1);
}

void fr_mem_give(fr_ctx *ctx, fr_mem *m, void *handle) {
    (void)ctx;
    if (!handle) return;
    pthread_mutex_lock(&m->lock);
    fr_mem_entry *e = find(m, handle);
    if (e && e->live) {
        if (!e->arena) count_free(m, e->cat, e->bytes);
        m->st.num_frees++;
        e->live = 0;
        if (e->reserved >= m->cls.cache_min) {
            int b = bin_of(e->reserved);
            e->next = m->cache[b];
            m->cache[b] = handle;
            m->st.cached += e->reserved;
        } else {
            m->st.reserved -= e->reserved;
            erase(m, e);
            m->src.give(m->src.self, handle);
        }
    }
    pthread_mutex_unlock(&m->lock);
}

/* ---- per memory: track, stats, peaks, cache, limit, faults, trace ------- */

void fr_mem_track_of(fr_mem *m, fr_mem_cat cat, int64_t delta) {
    if ((unsigned)cat >= FR_MEM_CAT_COUNT) cat = FR_MEM_OTHER;
    pthread_mutex_lock(&m->lock);
    if (delta < 0 && (size_t)-delta > m->st.allocated[cat]) delta = -(int64_t)m->st.allocated[cat];
    if (delta >= 0) count_alloc(m, cat, (size_t)delta);
    else count_free(m, cat, (size_t)-delta);
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_stats_of(const fr_mem *m, fr_mem_stats *out) {
    fr_mem *mm = (fr_mem *)m;
    pthread_mutex_lock(&mm->lock);
    *out = m->st;
    pthread_mutex_unlock(&mm->lock);
}

void fr_mem_reset_peak_of(fr_mem *m) {
    pthread_mutex_lock(&m->lock);
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) m->st.allocated_peak[c] = m->st.allocated[c];
    m->st.allocated_total_peak = m->st.allocated_total;
    m->st.reserved_peak = m->st.reserved;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_empty_cache_of(fr_mem *m) {
    pthread_mutex_lock(&m->lock);
    release_cache(m);
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_set_limit_of(fr_mem *m, size_t bytes) {
    pthread_mutex_lock(&m->lock);
    m->st.limit = bytes;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_fail_at_of(fr_mem *m, uint64_t n) {
    pthread_mutex_lock(&m->lock);
    m->fail_at = n;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_set_tag_of(fr_mem *m, const char *tag) {
    pthread_mutex_lock(&m->lock);
    m->tag = tag;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_mark_of(fr_mem *m, const char *tag) {
    pthread_mutex_lock(&m->lock);
    m->tag = tag;
    trace(m, 0, FR_MEM_OTHER);
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_trace_of(fr_mem *m, int on) {
    pthread_mutex_lock(&m->lock);
    m->tracing = on;
    m->n_events = 0;
    m->t0 = now_us();
    pthread_mutex_unlock(&m->lock);
}

/* ---- the host memory, ctx->mem ---------------------------------------------- */

void *fr_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) {
    return take_impl(ctx, &ctx->mem, bytes, cat, 0);
}

void *fr_calloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) {
    void *p = fr_alloc(ctx, bytes, cat);
    if (p) memset(p, 0, bytes);
    return p;
}

void fr_free(fr_ctx *ctx, void *p) { fr_mem_give(ctx, &ctx->mem, p); }

char *fr_strdup(fr_ctx *ctx, const char *s, fr_mem_cat cat) {
    size_t n = strlen(s) + 1;
    char *d = fr_alloc(ctx, n, cat);
    if (d) memcpy(d, s, n);
    return d;
}

int fr_grow(fr_ctx *ctx, void **arr, size_t *cap, size_t want, size_t sz, fr_mem_cat cat) {
    if (want <= *cap) return 0;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < want) ncap *= 2;
    void *n = fr_alloc(ctx, ncap * sz, cat);
    if (!n) return FR_ERR_NOMEM;
    if (*arr) memcpy(n, *arr, *cap * sz);
    fr_free(ctx, *arr);
    *arr = n;
    *cap = ncap;
    return 0;
}

void *fr_arena_alloc(fr_ctx *ctx, size_t bytes) {
    return take_impl(ctx, &ctx->mem, bytes, FR_MEM_OTHER, 1);
}
void fr_arena_free(fr_ctx *ctx, void *p) { fr_free(ctx, p); }
void fr_mem_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta) {
    fr_mem_track_of(&ctx->mem, cat, delta);
}
void fr_mem_set_tag(fr_ctx *ctx, const char *tag) { fr_mem_set_tag_of(&ctx->mem, tag); }
void fr_mem_mark(fr_ctx *ctx, const char *tag) { fr_mem_mark_of(&ctx->mem, tag); }
void fr_mem_trace(fr_ctx *ctx, int on) { fr_mem_trace_of(&ctx->mem, on); }
void fr_mem_get_stats(const fr_ctx *ctx, fr_mem_stats *out) { fr_mem_stats_of(&ctx->mem, out); }
void fr_mem_reset_peak(fr_ctx *ctx) { fr_mem_reset_peak_of(&ctx->mem); }
void fr_mem_empty_cache(fr_ctx *ctx) {
    fr_mem_empty_cache_of(&ctx->mem);
    if (ctx->dmem) fr_mem_empty_cache_of(ctx->dmem); /* a device's cached buffers too */
}
void fr_mem_set_limit(fr_ctx *ctx, size_t bytes) { fr_mem_set_limit_of(&ctx->mem, bytes); }
void fr_mem_fail_at(fr_ctx *ctx, uint64_t n) { fr_mem_fail_at_of(&ctx->mem, n); }
