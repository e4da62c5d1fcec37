/* report.h — the reporting side of frugal: turning memory statistics (and
 * per-rank peaks and ZeRO's predicted bytes) into text and JSON for people and tools. The
 * public entry points (fr_mem_summary, fr_mem_json) are in frugal.h; the
 * helpers here are shared by the report modules and the command line. */
#ifndef FR_REPORT_H
#define FR_REPORT_H

#include <stddef.h>
#include <stdio.h>
#include "core/names.h"

/* `frugal estimate --ranks N [--zero K]`: one rank's bytes by category at
 * ZeRO stage K (-1: every stage) from a rank's step s (estimate.c). */
void fr_step_ranks_table(const struct fr_step *s, int ranks, int zero, FILE *out, int json);

#endif
