/* report.h — the reporting side of frugal: turning memory statistics (and
 * per-rank peaks and ZeRO's predicted bytes) into text and JSON for people and tools. The
 * public entry points (fr_mem_summary, fr_mem_json) are in frugal.h; the
 * helpers here are shared by the report modules and the command line. */
#ifndef FR_REPORT_H
#define FR_REPORT_H

#include <stddef.h>
#include <stdio.h>
#include "core/names.h"

/* Every rank's peak by category, as the min and max over the ranks of a
 * data-parallel run (lo and hi: FR_MEM_CAT_COUNT categories, then the
 * total allocated and the reserved peak): a table, or a JSON object's
 * members ("ranks": N, "rank_peaks": {...}) without braces. */
void fr_mem_ranks_summary(int ranks, const size_t *lo, const size_t *hi, FILE *out, int json);

/* One rank's bytes at ZeRO stage `zero` (0-3) on `ranks` ranks, from a
 * rank's step s (its batch the rank's slice, every gradient kept): ZeRO's
 * formulas over s's parameter, gradient and optimizer bytes, the bucket
 * buffers, and the rest of s's predicted peak (estimate.c). */
typedef struct fr_rank_bytes {
    size_t params, grads, optim, buckets, rest, total;
    size_t saving; /* what stage `zero` saves against keeping everything (stage 0) */
} fr_rank_bytes;
struct fr_step;
void fr_step_rank_bytes(const struct fr_step *s, int ranks, int zero, fr_rank_bytes *out);
/* `frugal estimate --ranks N [--zero K]`: one rank's bytes by category at
 * ZeRO stage K (-1: every stage) from a rank's step s (estimate.c). */
void fr_step_ranks_table(const struct fr_step *s, int ranks, int zero, FILE *out, int json);

#endif
