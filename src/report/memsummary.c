/* memsummary.c — the allocator's statistics for people and for tools:
 * fr_mem_summary prints a table in the spirit of torch.cuda.memory_summary()
 * (allocated bytes per category, current and peak, then the totals, the
 * reserved, cached and limit figures and the event counts); fr_mem_json
 * writes the same numbers as one JSON object of raw byte counts. It reads a
 * snapshot from fr_mem_get_stats and owns no state; timelines and traces are
 * other report modules. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "core/ctx.h"
#include "report/report.h"

#define LABEL_W 28
#define VALUE_W 14
#define TABLE_W (1 + 1 + LABEL_W + 3 + VALUE_W + 3 + VALUE_W + 1 + 1) /* "| l | c | p |" */

static void rule(FILE *out, char c) {
    fputc('|', out);
    for (int i = 0; i < TABLE_W - 2; i++) fputc(c, out);
    fputs("|\n", out);
}

static void row(FILE *out, const char *label, const char *cur, const char *peak) {
    fprintf(out, "| %-*s | %*s | %*s |\n", LABEL_W, label, VALUE_W, cur, VALUE_W, peak);
}

static void row_bytes(FILE *out, const char *label, size_t cur, size_t peak, int has_peak) {
    char c[32], p[32];
    row(out, label, fr_human_bytes(cur, c, sizeof c),
        has_peak ? fr_human_bytes(peak, p, sizeof p) : "");
}

static void row_count(FILE *out, const char *label, uint64_t n) {
    char c[32];
    snprintf(c, sizeof c, "%" PRIu64, n);
    row(out, label, c, "");
}

/* A table's title centred between rules, and its column names. */
static void head(FILE *out, const char *title, const char *col1, const char *col2) {
    rule(out, '=');
    int tl = (int)strlen(title), pad = (TABLE_W - 2 - tl) / 2;
    fprintf(out, "|%*s%s%*s|\n", pad, "", title, TABLE_W - 2 - tl - pad, "");
    rule(out, '-');
    row(out, "Metric", col1, col2);
    rule(out, '=');
}

static void summary(const fr_mem_stats *sp, const char *title, FILE *out) {
    const fr_mem_stats st = *sp;
    char label[64];

    head(out, title, "Cur Usage", "Peak Usage");
    row(out, "Allocated memory", "", "");
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) {
        snprintf(label, sizeof label, "      %s", fr_mem_cat_name((fr_mem_cat)c));
        row_bytes(out, label, st.allocated[c], st.allocated_peak[c], 1);
    }
    row_bytes(out, "      total", st.allocated_total, st.allocated_total_peak, 1);
    rule(out, '-');
    row_bytes(out, "Reserved memory", st.reserved, st.reserved_peak, 1);
    row_bytes(out, "      cached (free blocks)", st.cached, 0, 0);
    if (st.limit) row_bytes(out, "      limit", st.limit, 0, 0);
    else row(out, "      limit", "none", "");
    rule(out, '-');
    row_count(out, "Allocations", st.num_allocs);
    row_count(out, "Frees", st.num_frees);
    row_count(out, "Cache hits", st.num_cache_hits);
    row_count(out, "OOMs (refused allocations)", st.num_ooms);
    rule(out, '=');
}

/* The host's table; on a device, the device's after it (PyTorch's summary
 * is the device's; the host is what `free` and RSS see). */
void fr_mem_summary(const fr_ctx *ctx, FILE *out) {
    if (!ctx || !out) return;
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    if (!ctx->dmem) {
        summary(&st, "frugal memory summary", out);
        return;
    }
    summary(&st, "frugal memory summary: host", out);
    char title[256];
    snprintf(title, sizeof title, "device %.190s", ctx->dev_name);
    fr_mem_stats_of(ctx->dmem, &st);
    summary(&st, title, out);
}

static void json_cats(FILE *out, const char *key, const size_t *v) {
    fprintf(out, "\"%s\": {", key);
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
        fprintf(out, "%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name((fr_mem_cat)c), v[c]);
    fputs("}", out);
}

static void json_stats(const fr_mem_stats *sp, FILE *out) {
    const fr_mem_stats st = *sp;
    json_cats(out, "allocated", st.allocated);
    fputs(", ", out);
    json_cats(out, "allocated_peak", st.allocated_peak);
    fprintf(out,
            ", \"allocated_total\": %zu, \"allocated_total_peak\": %zu, \"reserved\": %zu, "
            "\"reserved_peak\": %zu, \"cached\": %zu, \"limit\": %zu, \"num_allocs\": %" PRIu64
            ", \"num_frees\": %" PRIu64 ", \"num_cache_hits\": %" PRIu64 ", \"num_ooms\": %" PRIu64,
            st.allocated_total, st.allocated_total_peak, st.reserved, st.reserved_peak, st.cached,
            st.limit, st.num_allocs, st.num_frees, st.num_cache_hits, st.num_ooms);
}

/* The host's figures; on a device, its own under "device" (with its name). */
void fr_mem_json(const fr_ctx *ctx, FILE *out) {
    if (!ctx || !out) return;
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    fputc('{', out);
    json_stats(&st, out);
    if (ctx->dmem) {
        fr_mem_stats_of(ctx->dmem, &st);
        fprintf(out, ", \"device\": {\"name\": \"%s\", ", ctx->dev_name);
        json_stats(&st, out);
        fputc('}', out);
    }
    fputs("}\n", out);
}

void fr_mem_ranks_summary(int ranks, const size_t *lo, const size_t *hi, FILE *out, int json) {
    if (json) {
        fprintf(out, "\"ranks\": %d, \"rank_peaks\": {", ranks);
        for (int c = 0; c <= FR_MEM_CAT_COUNT + 1; c++)
            fprintf(out, "%s\"%s\": {\"min\": %zu, \"max\": %zu}", c ? ", " : "",
                    c < FR_MEM_CAT_COUNT    ? fr_mem_cat_name((fr_mem_cat)c)
                    : c == FR_MEM_CAT_COUNT ? "allocated_total"
                                            : "reserved",
                    lo[c], hi[c]);
        fputs("}", out);
        return;
    }
    char title[64], label[64];
    snprintf(title, sizeof title, "peak per rank over %d ranks", ranks);
    head(out, title, "Min over ranks", "Max over ranks");
    row(out, "Allocated memory (peak)", "", "");
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) {
        snprintf(label, sizeof label, "      %s", fr_mem_cat_name((fr_mem_cat)c));
        row_bytes(out, label, lo[c], hi[c], 1);
    }
    row_bytes(out, "      total", lo[FR_MEM_CAT_COUNT], hi[FR_MEM_CAT_COUNT], 1);
    rule(out, '-');
    row_bytes(out, "Reserved memory (peak)", lo[FR_MEM_CAT_COUNT + 1], hi[FR_MEM_CAT_COUNT + 1], 1);
    rule(out, '=');
}
