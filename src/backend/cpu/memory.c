/* memory.c — the CPU backend's memory, copies, synchronisation and uploads
 * (the members of fr_backend; see backend/backend.h). A buffer is a block
 * of the host's fr_mem (ctx->mem) and its handle the host pointer; the
 * step's arena is reserved there and its live values tracked as the
 * executor's plan events say. Every copy is a memcpy, done on return, so
 * there is nothing to wait for: events are NULL, a completed one. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/host.h"
#include "core/ctx.h"

void *fr_cpu_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) { return fr_alloc(ctx, bytes, cat); }
void fr_cpu_release(fr_ctx *ctx, void *buf) { fr_free(ctx, buf); }
void *fr_cpu_arena_alloc(fr_ctx *ctx, size_t bytes) { return fr_arena_alloc(ctx, bytes); }
void fr_cpu_arena_free(fr_ctx *ctx, void *buf) { fr_arena_free(ctx, buf); }
void fr_cpu_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta) { fr_mem_track(ctx, cat, delta); }

int fr_cpu_write(fr_ctx *ctx, void *buf, size_t off, const void *src, size_t n) {
    (void)ctx;
    if (n) memcpy((char *)buf + off, src, n);
    return FR_OK;
}

int fr_cpu_read(fr_ctx *ctx, void *buf, size_t off, void *dst, size_t n) {
    (void)ctx;
    if (n) memcpy(dst, (const char *)buf + off, n);
    return FR_OK;
}

int fr_cpu_zero(fr_ctx *ctx, void *buf, size_t off, size_t n) {
    (void)ctx;
    if (n) memset((char *)buf + off, 0, n);
    return FR_OK;
}

int fr_cpu_finish(fr_ctx *ctx) {
    (void)ctx;
    return FR_OK;
}

/* malloc refuses more than PTRDIFF_MAX; the budget (fr_mem's limit) refuses
 * at alloc, not here. */
size_t fr_cpu_max_buffer(fr_ctx *ctx) {
    (void)ctx;
    return (size_t)PTRDIFF_MAX;
}

/* Physical memory; 0 if the system does not say. */
size_t fr_cpu_global_mem(fr_ctx *ctx) {
    (void)ctx;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

/* Not measured: an offloaded value stays in host memory, and the planner
 * keeps costing --offload on the CPU as unknown (backend.h). */
double fr_cpu_rate(fr_ctx *ctx) {
    (void)ctx;
    return 0.0;
}

/* The host's bytes are the kernels' own: no copy is made, none taken. */
int fr_cpu_mirror(fr_ctx *ctx, void **buf, const void *src, size_t n, fr_mem_cat cat) {
    (void)ctx, (void)buf, (void)src, (void)n, (void)cat;
    return FR_OK;
}

size_t fr_cpu_mirror_bytes(fr_ctx *ctx, size_t n) {
    (void)ctx, (void)n;
    return 0;
}

/* ---- uploads: synchronous, no queue, NULL events ---- */

int fr_cpu_upload_open(fr_ctx *ctx, void **queue) {
    (void)ctx;
    *queue = NULL;
    return FR_OK;
}

void fr_cpu_upload_close(fr_ctx *ctx, void *queue) { (void)ctx, (void)queue; }

int fr_cpu_upload(void *queue, void *buf, size_t off, const void *src, size_t n, void *after,
                  void **done, char *err, size_t errlen) {
    (void)queue, (void)after, (void)err, (void)errlen;
    if (n) memcpy((char *)buf + off, src, n);
    *done = NULL;
    return FR_OK;
}

int fr_cpu_upload_finish(fr_ctx *ctx, void *queue) {
    (void)ctx, (void)queue;
    return FR_OK;
}

int fr_cpu_event_mark(fr_ctx *ctx, void **out) {
    (void)ctx;
    *out = NULL;
    return FR_OK;
}

int fr_cpu_event_order(fr_ctx *ctx, void *event) {
    (void)ctx, (void)event;
    return FR_OK;
}

int fr_cpu_event_wait(fr_ctx *ctx, void *event) {
    (void)ctx, (void)event;
    return FR_OK;
}

void fr_cpu_event_release(void *event) { (void)event; }

void fr_cpu_event_times(void *event, double *start_us, double *end_us) {
    (void)event;
    *start_us = *end_us = 0;
}
