/* host.h — the CPU backend's members beyond its kernels, named in
 * table.c's fr_cpu_backend (see fr_backend in backend/backend.h for what
 * each promises): memory, copies, synchronisation and uploads over host
 * memory (memory.c), and the step's whole-tensor passes over .data
 * (passes.c). Nothing else calls them but through the table. */
#ifndef FR_CPU_HOST_H
#define FR_CPU_HOST_H

#include "backend/backend.h"

/* memory.c */
void *fr_cpu_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
void fr_cpu_release(fr_ctx *ctx, void *buf);
void *fr_cpu_arena_alloc(fr_ctx *ctx, size_t bytes);
void fr_cpu_arena_free(fr_ctx *ctx, void *buf);
void fr_cpu_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta);
int fr_cpu_write(fr_ctx *ctx, void *buf, size_t off, const void *src, size_t n);
int fr_cpu_read(fr_ctx *ctx, void *buf, size_t off, void *dst, size_t n);
int fr_cpu_zero(fr_ctx *ctx, void *buf, size_t off, size_t n);
int fr_cpu_finish(fr_ctx *ctx);
size_t fr_cpu_max_buffer(fr_ctx *ctx);
size_t fr_cpu_global_mem(fr_ctx *ctx);
double fr_cpu_rate(fr_ctx *ctx); /* copy_rate, flop_rate and copy_overlap: 0 */
int fr_cpu_mirror(fr_ctx *ctx, void **buf, const void *src, size_t n, fr_mem_cat cat);
size_t fr_cpu_mirror_bytes(fr_ctx *ctx, size_t n); /* 0: nothing copied */
int fr_cpu_upload_open(fr_ctx *ctx, void **queue);
void fr_cpu_upload_close(fr_ctx *ctx, void *queue);
int fr_cpu_upload(void *queue, void *buf, size_t off, const void *src, size_t n, void *after,
                  void **done, char *err, size_t errlen);
int fr_cpu_upload_finish(fr_ctx *ctx, void *queue);
int fr_cpu_event_mark(fr_ctx *ctx, void **out);
int fr_cpu_event_order(fr_ctx *ctx, void *event);
int fr_cpu_event_wait(fr_ctx *ctx, void *event);
void fr_cpu_event_release(void *event);
void fr_cpu_event_times(void *event, double *start_us, double *end_us);

/* passes.c */
int fr_cpu_optim_update(fr_ctx *ctx, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                        const fr_tensor *g, fr_tensor *state, int state_kind);
int fr_cpu_grad_unscale(fr_ctx *ctx, fr_tensor *g, float inv, int *found_inf);
int fr_cpu_grad_sumsq(fr_ctx *ctx, const fr_tensor *g, double *out);
int fr_cpu_grad_scale(fr_ctx *ctx, fr_tensor *g, float f);
int fr_cpu_hits(fr_ctx *ctx, const fr_tensor *logits, const fr_tensor *labels, int64_t *out);

#endif
