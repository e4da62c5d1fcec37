/* mem.h — the accounting allocator. Every byte the engine takes comes through
 * here and carries a category. It keeps current and peak bytes per category,
 * allocated versus reserved (cached free blocks, planned arenas), counts,
 * a limit (the budget), fault injection for tests, and an optional trace of
 * events for the memory timeline. It knows nothing of tensors or ops. */
#ifndef FR_MEM_H
#define FR_MEM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "frugal.h"

#define FR_MEM_ALIGN 64
#define FR_MEM_CACHE_BINS 48 /* free blocks binned by rounded size */

typedef struct fr_mem_block fr_mem_block;

typedef struct fr_mem_event {
    double t_us;   /* since the trace started */
    int64_t delta; /* +bytes allocated, -bytes freed */
    fr_mem_cat cat;
    const char *tag; /* op or owner name (static storage) */
} fr_mem_event;

typedef struct fr_mem {
    pthread_mutex_t lock;
    fr_mem_stats st;
    fr_mem_block *cache[FR_MEM_CACHE_BINS];
    uint64_t fail_at; /* counts down; the allocation that brings it to 0 fails */
    const char *tag;  /* current tag for trace events */
    int tracing;
    fr_mem_event *events;
    size_t n_events, cap_events;
    double t0;
} fr_mem;

typedef struct fr_ctx fr_ctx;

int fr_mem_init(fr_mem *m);
void fr_mem_destroy(fr_mem *m);

/* 64-byte aligned; NULL with an error message on failure (never aborts).
 * Blocks of 64 KiB and more are cached on free and reused (reserved). */
void *fr_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
void *fr_calloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
/* What an allocation of `bytes` reserves: the block with its header,
 * rounded (a plan's prediction of reserved bytes adds these up). */
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
void fr_mem_trace(fr_ctx *ctx, int on); /* on: clears and starts a trace */

#endif
