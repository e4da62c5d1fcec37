/* mem.c — the accounting allocator (see mem.h). Blocks carry a 64-byte
 * header with their size and category; blocks of FR_MEM_CACHE_MIN bytes and
 * more are kept on free in size bins and handed out again for the same
 * rounded size, the way PyTorch's caching allocator keeps freed blocks
 * reserved. fr_mem_empty_cache returns them to the system. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/ctx.h"

#define FR_MEM_MAGIC 0x66727567616c4d4dULL /* "frugalMM" */
#define FR_MEM_CACHE_MIN (64u << 10)
#define FR_MEM_ROUND 4096u

struct fr_mem_block {
    uint64_t magic;
    size_t bytes;    /* what the caller asked for */
    size_t reserved; /* what the block holds from the system, header included */
    fr_mem_cat cat;
    int arena; /* 1: a planned arena, counted as reserved only */
    fr_mem_block *next;
    char pad[FR_MEM_ALIGN - 2 * sizeof(size_t) - sizeof(uint64_t) - 2 * sizeof(int) -
             sizeof(void *)];
};
_Static_assert(sizeof(fr_mem_block) == FR_MEM_ALIGN, "block header must keep alignment");

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int fr_mem_init(fr_mem *m) {
    memset(m, 0, sizeof *m);
    return pthread_mutex_init(&m->lock, NULL);
}

static void release_cache(fr_mem *m) {
    for (int b = 0; b < FR_MEM_CACHE_BINS; b++) {
        while (m->cache[b]) {
            fr_mem_block *blk = m->cache[b];
            m->cache[b] = blk->next;
            m->st.reserved -= blk->reserved;
            m->st.cached -= blk->reserved;
            free(blk);
        }
    }
}

void fr_mem_destroy(fr_mem *m) {
    release_cache(m);
    free(m->events);
    pthread_mutex_destroy(&m->lock);
}

static int bin_of(size_t bytes) {
    int b = 0;
    while (bytes > 1 && b < FR_MEM_CACHE_BINS - 1) {
        bytes >>= 1;
        b++;
    }
    return b;
}

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

/* Take a block of `reserved` bytes from the cache or the system; lock held. */
static fr_mem_block *take_block(fr_ctx *ctx, size_t bytes, size_t reserved, fr_mem_cat cat) {
    fr_mem *m = &ctx->mem;
    if (m->fail_at && --m->fail_at == 0) {
        m->st.num_ooms++;
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory: %zu bytes for %s (injected failure)", bytes,
                fr_mem_cat_name(cat));
        return NULL;
    }
    if (reserved >= FR_MEM_CACHE_MIN) {
        fr_mem_block **pp = &m->cache[bin_of(reserved)];
        for (; *pp; pp = &(*pp)->next) {
            if ((*pp)->reserved == reserved) {
                fr_mem_block *blk = *pp;
                *pp = blk->next;
                m->st.cached -= reserved;
                m->st.num_cache_hits++;
                return blk;
            }
        }
    }
    if (m->st.limit && m->st.reserved + reserved > m->st.limit) {
        release_cache(m); /* like PyTorch: free cached blocks and retry before failing */
        if (m->st.reserved + reserved > m->st.limit) {
            m->st.num_ooms++;
            fr_fail(ctx, FR_ERR_NOMEM,
                    "memory budget exceeded: %zu bytes for %s would bring reserved to %zu of a "
                    "%zu-byte limit",
                    bytes, fr_mem_cat_name(cat), m->st.reserved + reserved, m->st.limit);
            return NULL;
        }
    }
    void *p = NULL;
    if (posix_memalign(&p, FR_MEM_ALIGN, reserved) != 0 || !p) {
        m->st.num_ooms++;
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory: the system refused %zu bytes for %s", bytes,
                fr_mem_cat_name(cat));
        return NULL;
    }
    count_reserve(m, reserved);
    return p;
}

size_t fr_mem_block_bytes(size_t bytes) {
    size_t need = bytes + sizeof(fr_mem_block);
    return need >= FR_MEM_CACHE_MIN ? (need + FR_MEM_ROUND - 1) / FR_MEM_ROUND * FR_MEM_ROUND
                                    : (need + FR_MEM_ALIGN - 1) / FR_MEM_ALIGN * FR_MEM_ALIGN;
}

static void *alloc_impl(fr_ctx *ctx, size_t bytes, fr_mem_cat cat, int arena) {
    if ((unsigned)cat >= FR_MEM_CAT_COUNT) cat = FR_MEM_OTHER;
    if (bytes > ((size_t)1 << 46)) {
        pthread_mutex_lock(&ctx->mem.lock);
        ctx->mem.st.num_ooms++;
        pthread_mutex_unlock(&ctx->mem.lock);
        fr_fail(ctx, FR_ERR_NOMEM, "out of memory: %zu bytes for %s is beyond any machine", bytes,
                fr_mem_cat_name(cat));
        return NULL;
    }
    size_t reserved = fr_mem_block_bytes(bytes);
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    fr_mem_block *blk = take_block(ctx, bytes, reserved, cat);
    if (blk) {
        blk->magic = FR_MEM_MAGIC;
        blk->bytes = bytes;
        blk->reserved = reserved;
        blk->cat = cat;
        blk->arena = arena;
        blk->next = NULL;
        m->st.num_allocs++;
        if (!arena) count_alloc(m, cat, bytes);
    }
    pthread_mutex_unlock(&m->lock);
    return blk ? (void *)(blk + 1) : NULL;
}

void *fr_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) { return alloc_impl(ctx, bytes, cat, 0); }

void *fr_calloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) {
    void *p = fr_alloc(ctx, bytes, cat);
    if (p) memset(p, 0, bytes);
    return p;
}

void fr_free(fr_ctx *ctx, void *p) {
    if (!p) return;
    fr_mem_block *blk = (fr_mem_block *)p - 1;
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    if (blk->magic == FR_MEM_MAGIC) {
        if (!blk->arena) count_free(m, blk->cat, blk->bytes);
        m->st.num_frees++;
        blk->magic = 0;
        if (blk->reserved >= FR_MEM_CACHE_MIN) {
            int b = bin_of(blk->reserved);
            blk->next = m->cache[b];
            m->cache[b] = blk;
            m->st.cached += blk->reserved;
        } else {
            m->st.reserved -= blk->reserved;
            free(blk);
        }
    }
    pthread_mutex_unlock(&m->lock);
}

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

void *fr_arena_alloc(fr_ctx *ctx, size_t bytes) { return alloc_impl(ctx, bytes, FR_MEM_OTHER, 1); }
void fr_arena_free(fr_ctx *ctx, void *p) { fr_free(ctx, p); }

void fr_mem_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta) {
    fr_mem *m = &ctx->mem;
    if ((unsigned)cat >= FR_MEM_CAT_COUNT) cat = FR_MEM_OTHER;
    pthread_mutex_lock(&m->lock);
    if (delta < 0 && (size_t)-delta > m->st.allocated[cat]) delta = -(int64_t)m->st.allocated[cat];
    if (delta >= 0) count_alloc(m, cat, (size_t)delta);
    else count_free(m, cat, (size_t)-delta);
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_set_tag(fr_ctx *ctx, const char *tag) {
    pthread_mutex_lock(&ctx->mem.lock);
    ctx->mem.tag = tag;
    pthread_mutex_unlock(&ctx->mem.lock);
}

void fr_mem_trace(fr_ctx *ctx, int on) {
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    m->tracing = on;
    m->n_events = 0;
    m->t0 = now_us();
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_get_stats(const fr_ctx *ctx, fr_mem_stats *out) {
    fr_mem *m = (fr_mem *)&ctx->mem;
    pthread_mutex_lock(&m->lock);
    *out = m->st;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_reset_peak(fr_ctx *ctx) {
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) m->st.allocated_peak[c] = m->st.allocated[c];
    m->st.allocated_total_peak = m->st.allocated_total;
    m->st.reserved_peak = m->st.reserved;
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_empty_cache(fr_ctx *ctx) {
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    release_cache(m);
    pthread_mutex_unlock(&m->lock);
}

void fr_mem_set_limit(fr_ctx *ctx, size_t bytes) {
    pthread_mutex_lock(&ctx->mem.lock);
    ctx->mem.st.limit = bytes;
    pthread_mutex_unlock(&ctx->mem.lock);
}

void fr_mem_fail_at(fr_ctx *ctx, uint64_t n) {
    pthread_mutex_lock(&ctx->mem.lock);
    ctx->mem.fail_at = n;
    pthread_mutex_unlock(&ctx->mem.lock);
}
