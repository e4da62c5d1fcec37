/* mem.h — the accounting allocator. Every byte the engine takes comes through
 * here and carries a category. It keeps current and peak bytes per category,
 * allocated versus reserved (cached free blocks, planned arenas), counts,
 * a limit (the budget), fault injection for tests, and an optional trace of
 * events for the memory timeline. It knows nothing of tensors or ops.
 *
 * One fr_mem per memory: ctx->mem is the host's (fr_alloc and friends); a
 * device's is a second fr_mem over the device's source (fr_mem_init_source,
 * fr_mem_take, fr_mem_give). A block is a handle from the source and nothing
 * else: its size, category and cache link live in a side table, an
 * open-addressing hash keyed by the handle, so the allocator never writes
 * into the memory it hands out (a device buffer cannot carry a header). */
#ifndef FR_MEM_H
#define FR_MEM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "frugal.h"

#define FR_MEM_ALIGN 64       /* host blocks */
#define FR_MEM_CACHE_BINS 192 /* free blocks binned by size: 4 bins per power of two */

/* Where a memory's bytes come from. take returns a handle for `bytes` bytes,
 * or NULL when the source refuses; give returns a handle taken before. The
 * host source is posix_memalign (FR_MEM_ALIGN) and free. */
typedef struct fr_mem_source {
    void *(*take)(void *self, size_t bytes);
    void (*give)(void *self, void *handle);
    void *self;
    const char *name; /* for messages: "the system", "the OpenCL device" */
} fr_mem_source;

/* How a request of n bytes becomes a block (fr_mem_class_bytes): n of at most
 * small_max bytes rounds up to a multiple of round_small, a larger n to a
 * multiple of round_large; a block is never smaller than round_small. Freed
 * blocks of cache_min bytes and more are kept (reserved, cached) and handed
 * out again for a request of the same class; smaller ones go back to the
 * source at once. */
typedef struct fr_mem_classes {
    size_t round_small, small_max, round_large, cache_min;
} fr_mem_classes;

/* The host's: 64-byte multiples below 64 KiB, 4 KiB multiples from 64 KiB,
 * blocks of 64 KiB and more cached. */
extern const fr_mem_classes fr_mem_host_classes;
/* A device's, after PyTorch's CUDA caching allocator (kMinBlockSize 512,
 * kSmallSize 1 MiB, kRoundLarge 2 MiB). PyTorch packs small requests into
 * 2 MiB buffers and splits 20 MiB ones for large requests, which needs
 * offsets into a buffer; here every block is its own buffer, so: a request
 * of at most 1 MiB reserves itself rounded up to 512 bytes (at least 512),
 * a larger one itself rounded up to 2 MiB; every freed block is cached and
 * reused only for a request of exactly its class; empty_cache gives them all
 * back. */
extern const fr_mem_classes fr_mem_device_classes;

typedef struct fr_mem_event {
    double t_us;   /* since the trace started */
    int64_t delta; /* +bytes allocated, -bytes freed */
    fr_mem_cat cat;
    const char *tag; /* op or owner name (static storage) */
} fr_mem_event;

typedef struct fr_mem_entry fr_mem_entry; /* one block's metadata (mem.c) */

typedef struct fr_mem {
    pthread_mutex_t lock;
    fr_mem_stats st;
    fr_mem_source src;
    fr_mem_classes cls;
    /* The side table: malloc'd, not counted in st (fr_mem_table_bytes). */
    fr_mem_entry *table;
    size_t table_cap, table_len;    /* slots (a power of two), blocks held */
    uint64_t table_fail_at;         /* testing: like fail_at, for the table's growth */
    void *cache[FR_MEM_CACHE_BINS]; /* heads of lists of cached handles */
    uint64_t fail_at;               /* counts down; the allocation that brings it to 0 fails */
    const char *tag;                /* current tag for trace events */
    int tracing;
    fr_mem_event *events;
    size_t n_events, cap_events;
    double t0;
} fr_mem;

typedef struct fr_ctx fr_ctx;

/* The host memory: fr_mem_init_source with the host source and classes. */
int fr_mem_init(fr_mem *m);
/* A memory over src with classes cls (both copied). 0 on success; -1 when
 * src lacks take or give or cls has a zero rounding; an errno from
 * pthread_mutex_init otherwise. */
int fr_mem_init_source(fr_mem *m, const fr_mem_source *src, const fr_mem_classes *cls);
/* Gives the cached blocks back and frees the side table. Blocks still held
 * by callers are theirs to give back first (ASan then reports host leaks). */
void fr_mem_destroy(fr_mem *m);

/* ---- any memory ---------------------------------------------------------- */

/* A block of at least `bytes` from m: its handle, or NULL with the error set
 * in ctx (over m's limit: "memory budget exceeded: ..."; fail_at: "(injected
 * failure)"; the source refusing, after the cache was given back: "out of
 * memory: <source> refused ..."; the side table unable to grow); every
 * refusal counts in num_ooms. */
void *fr_mem_take(fr_ctx *ctx, fr_mem *m, size_t bytes, fr_mem_cat cat);
/* A planned arena: reserved, not allocated (its live values are counted
 * with fr_mem_track_of). Given back with fr_mem_give. */
void *fr_mem_take_arena(fr_ctx *ctx, fr_mem *m, size_t bytes);
/* NULL and handles m does not hold (already given back) are ignored. */
void fr_mem_give(fr_ctx *ctx, fr_mem *m, void *handle);
/* What one request of `bytes` reserves from m's source. */
size_t fr_mem_class_bytes(const fr_mem *m, size_t bytes);

void fr_mem_track_of(fr_mem *m, fr_mem_cat cat, int64_t delta);
void fr_mem_stats_of(const fr_mem *m, fr_mem_stats *out);
void fr_mem_reset_peak_of(fr_mem *m);
void fr_mem_empty_cache_of(fr_mem *m); /* cached blocks back to the source */
void fr_mem_set_limit_of(fr_mem *m, size_t bytes);
void fr_mem_fail_at_of(fr_mem *m, uint64_t n);
void fr_mem_set_tag_of(fr_mem *m, const char *tag);
void fr_mem_mark_of(fr_mem *m, const char *tag);
void fr_mem_trace_of(fr_mem *m, int on);
/* Bytes the side table holds (outside the stats), and testing: make the n-th
 * growth of the table from now fail (1 = the next; 0 disables). */
size_t fr_mem_table_bytes(const fr_mem *m);
void fr_mem_table_fail_at(fr_mem *m, uint64_t n);

/* ---- the host memory, ctx->mem --------------------------------------------- */

/* 64-byte aligned; NULL with an error message on failure (never aborts).
 * Blocks of 64 KiB and more are cached on free and reused (reserved). */
void *fr_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
void *fr_calloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
/* What a host allocation of `bytes` reserves: the bytes rounded to their
 * class, no header (a plan's prediction of reserved bytes adds these up). */
size_t fr_mem_block_bytes(size_t bytes);
void fr_free(fr_ctx *ctx, void *p);
char *fr_strdup(fr_ctx *ctx, const char *s, fr_mem_cat cat);
/* Grow an array of n elements of size sz to at least want elements. */
int fr_grow(fr_ctx *ctx, void **arr, size_t *cap, size_t want, size_t sz, fr_mem_cat cat);

/* A planned arena: held from the system (counted as reserved) but only the
 * values the executor marks live count as allocated, via fr_mem_track. */
void *fr_arena_alloc(fr_ctx *ctx, size_t bytes);
void fr_arena_free(fr_ctx *ctx, void *p);
void fr_mem_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta);

void fr_mem_set_tag(fr_ctx *ctx, const char *tag);
/* Set the tag and, when tracing, record a zero-byte event at this moment: a
 * time mark. The executor marks each kernel's start (its op's name) and end
 * (NULL), so the trace's op spans are the kernels' own times. */
void fr_mem_mark(fr_ctx *ctx, const char *tag);
void fr_mem_trace(fr_ctx *ctx, int on); /* on: clears and starts a trace */

#endif
