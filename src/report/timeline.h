/* timeline.h — the memory timeline: the allocator's trace of events
 * (fr_mem_trace(ctx, 1), then work, see mem.h) turned into files a person
 * reads to see where memory goes and when. It owns the two writers below;
 * recording the trace is the allocator's business, not this module's.
 *
 * Both writers read the trace as it stands (it is not cleared) and add
 * nothing to it: while they run, tracing is paused, so their own buffers
 * (category "other", all freed before they return) are not recorded. The
 * bytes already allocated when the trace started are recovered from the
 * allocator's current counts, so a timeline started after the weights were
 * made still shows them. Each fails with FR_ERR_ARG on an empty trace,
 * FR_ERR_NOMEM or FR_ERR_IO otherwise, with a message in fr_last_error;
 * the file is written atomically (fr_write_atomic) or not at all. */
#ifndef FR_TIMELINE_H
#define FR_TIMELINE_H

#include <stddef.h>
#include "frugal.h"

/* Chrome Trace Event JSON (Perfetto, chrome://tracing):
 * {"traceEvents": [...], "displayTimeUnit": "ms"} with timestamps in
 * microseconds since the trace started. One counter event ("ph": "C",
 * name "memory") holding the allocated bytes of every category as args for
 * the start of the trace and after each memory event (a stacked counter
 * track, one series per category; time marks, fr_mem_mark, add none); one
 * complete event ("ph": "X", tid 1) per run of consecutive events under the
 * same op tag, from its first event to the next run's (for a kernel, the
 * mark that ends it), with the bytes it allocated and freed; and one
 * instant event ("ph": "i") at the peak of the total. */
fr_status fr_timeline_chrome(fr_ctx *ctx, const char *path);

/* A self-contained SVG (1000x500, no scripts, no external fonts): allocated
 * bytes over time as step-shaped areas stacked by category (parameters at
 * the bottom), axes with ticks in ms and in human byte units, a legend
 * naming every category with its bytes at the peak, the peak of the total
 * as a dashed line labelled "peak 12.3 MiB at 45.6 ms, during <op>", and
 * the budget as a red line when budget > 0. Long traces are thinned to one
 * column per pixel, each drawn at the highest total it reaches, so the peak
 * is never lost. title may be NULL. */
fr_status fr_timeline_svg(fr_ctx *ctx, const char *path, const char *title, size_t budget);

/* Kernel time by op, from the trace's time marks (fr_mem_mark: the
 * executor marks each kernel's start and end): for each op name its calls
 * and the sum of its kernels' spans in ms, the largest first, at most max
 * ops. On a device a span is the time to enqueue, not to run. Returns the
 * number of ops (0: none traced), -1 with the error set. */
typedef struct fr_op_time {
    const char *name;
    int calls;
    double ms;
} fr_op_time;
int fr_timeline_op_times(fr_ctx *ctx, fr_op_time *out, int max);

#endif
